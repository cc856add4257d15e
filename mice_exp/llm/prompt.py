"""Few-shot tool-call prompts: STE / MICE's ReAct text (``prompt=ste``) or JSON tool schemas (``prompt=json_tools``).

The prompt shows the instructions with the tools of the gold API and of the demonstrations' APIs, then k
retrieved demonstrations (least similar first, so the most similar sits next to the query), then the
query. Models with a chat template get the demonstrations as earlier user / assistant turns, so the reply
imitates their format; base models get the same content as one text. ``prompt.no_call_note`` (BFCL's
relevance categories) adds the offer to answer without a call to the system text.

``prompt.tools`` says how the tools are shown: ``text``, the data set's own descriptions in the template's
``{api_descriptions}`` (STE's); ``schemas``, OpenAI-style function schemas
(:attr:`mice_exp.data.records.Example.schemas`), passed to the chat template as ``tools=`` where it renders
them (:func:`renders_tools`), else written into the system turn by the template's ``{tools}`` (one JSON
schema per line) and ``{call_example}`` (how a call is written in the reply format). ``prompt.format`` is
the reply format (:mod:`mice_exp.llm.toolcall`); demonstrations are written in it.

``prompt.demo_tools`` says where the demonstrations' tools are shown: ``pooled`` (STE's prompt), with the
query's in the instructions; ``per_demo``, each in its own demonstration's turn (and the query's in its
turn too, as well as in the instructions), so the instructions offer the query's tools alone. Where "no tool fits" is a right answer (BFCL's irrelevance categories) a pooled
list can offer a demonstration's tool that fits the query.

A query may carry a whole conversation (an example with a :class:`~mice_exp.data.records.Conversation`, as the gate's chat requests
do): the caller's system text follows the gate's instructions in the system turn, and the conversation's
turns follow the demonstrations, each in the reply format's documented text form (:data:`RESULT_FORMS`):
user turns as queries, the assistant's tool calls written as the format writes a call, its text as a final
answer, and tool results as the format shows a call's result (STE's ``Observation:``, Hermes'
``<tool_response>``), in a user turn of their own, so turns alternate under any chat template.
"""

from __future__ import annotations

import string

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any, Mapping, Sequence

from mice_exp.data.schemas import Schema
from mice_exp.errors import UserError
from mice_exp.llm.settings import PromptSettings
from mice_exp.llm.toolcall import CallFormat
#: The tool a template is rendered with to see whether it shows tools (:func:`renders_tools`).
PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool_7f3a", "description": "A probe.",
                                               "parameters": {"type": "object", "properties": {}}}}


class PromptTooLong(UserError):
    """A prompt that does not fit the context window even without demonstrations (the gate's server answers
    it as OpenAI's ``context_length_exceeded``)."""

    def __init__(self, message: str, tokens: int, budget: int) -> None:
        super().__init__(message)
        self.tokens, self.budget = tokens, budget


#: Per reply format: how a tool's result and an assistant's reply without a call are written in a prompt, as the
#: format's own instructions document them (STE's template: "Observation:", "Final Answer:"; Hermes / Qwen:
#: a ``<tool_response>`` block in the user's turn).
RESULT_FORMS = {"react": ("Observation: {result}", "Final Answer: {text}"),
                "json": ("<tool_response>\n{result}\n</tool_response>", "{text}"),
                "tool_call": ("<tool_response>\n{result}\n</tool_response>", "{text}")}


@dataclass(frozen=True)
class Prompt:
    """Token ids of one prompt and how many demonstrations had to be dropped to fit."""

    ids: list[int]
    n_demos: int
    dropped: int


def load_template(name: str) -> str:
    """A template shipped in ``mice_exp/llm/templates`` (by file name) or a path to one."""
    shipped = resources.files("mice_exp.llm").joinpath("templates", name)
    if shipped.is_file():
        return shipped.read_text(encoding="utf-8")
    try:
        with open(name, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        raise UserError(f"prompt template {name!r} not found; expected a file in mice_exp/llm/templates or a path") from None


#: The fields an instruction template may name: STE's text form of the tools, or their JSON schemas.
TEMPLATE_FIELDS = {"text": {"api_descriptions", "api_names"}, "schemas": {"tools", "call_example"}}


def template_problem(text: str, tools: str) -> str | None:
    """Why an instruction template cannot be filled under ``prompt.tools=tools`` (a field it does not know, a
    brace that does not close), or None: checked when a gate loads, not at its first request."""
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
    except ValueError as error:
        return f"it does not parse as a format string ({error})"
    unknown = sorted(fields - TEMPLATE_FIELDS[tools])
    return (f"it names {{{unknown[0]}}}, which prompt.tools={tools} does not fill (it fills "
            f"{', '.join('{' + f + '}' for f in sorted(TEMPLATE_FIELDS[tools]))})") if unknown else None


def system_prompt(prompt: PromptSettings) -> str:
    """The system text of ``prompt``: the ``system`` template, then ``no_call_note`` when set, in the same
    paragraph, as BFCL's prompting mode says it ("If none of the functions can be used, point it out.",
    ``bfcl_eval/constants/default_prompts.py``); null (the default) leaves the system text as it always was."""
    system = load_template(prompt.system).strip()
    note = prompt.no_call_note
    return f"{system} {note.strip()}" if note else system


def _unique(items: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(items))


def render_head(example: Any, demos: Sequence[Any], template: str) -> str:
    """STE's instructions with the tool descriptions of the example's and the demonstrations' APIs."""
    tools = _unique([example.tools] + [d.tools for d in demos])
    names = _unique(list(example.tool_names) + [n for d in demos for n in d.tool_names])
    return template.format(api_descriptions="\n\n".join(tools), api_names="\n".join(names))


def query_turn(example: Any, note: str = "") -> str:
    """The query as the user writes it; ``note`` (e.g. the way-out offer of Pal et al.) follows it in the
    same turn, as in their Appendix D, so every prompt variant shares all tokens up to the query."""
    return query_text(example.query, note)


def query_text(query: str, note: str = "") -> str:
    """A user's text as the prompt writes a query (also an earlier turn of a conversation)."""
    return f"User Query: {query}" + (f"\n\n{note}" if note else "")


def _caller_system(example: Any) -> str:
    """The caller's own system text, a paragraph after the gate's instructions ("" without one)."""
    conversation = getattr(example, "conversation", None)
    return f"\n\n{conversation.system}" if conversation is not None and conversation.system else ""


def renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template shows the tools given as ``tools=``: a probe tool's name appears
    in the rendered text. SmolLM2's template ignores them; Gemma-3-270M has no template at all."""
    probe = [{"role": "user", "content": "hello"}]
    text = tokenizer.apply_chat_template(probe, tools=[PROBE_TOOL], tokenize=False, add_generation_prompt=True)
    return PROBE_TOOL["function"]["name"] in text


@dataclass(frozen=True)
class PromptBuilder:
    """How a ``conf/prompt`` node writes prompts with one tokenizer: its templates read, its reply format and
    whether the chat template renders tools decided once (the LLM stage, the gate and the sources each build
    one and hand it down)."""

    tokenizer: Any
    template: str
    system: str
    chat: bool  # the tokenizer's chat template is used
    fmt: CallFormat  # the reply format: parser, stopping rule, how demonstrations are written
    schemas: bool  # tools as JSON schemas (prompt.tools=schemas), else the data set's own text
    native: bool  # the chat template renders the schemas itself (tools=)
    per_demo: bool = False  # each demonstration's tools in its own turn (prompt.demo_tools=per_demo)

    @classmethod
    def from_config(cls, prompt: PromptSettings, tokenizer: Any) -> PromptBuilder:
        chat = bool(prompt.chat_template) and bool(getattr(tokenizer, "chat_template", None))
        return cls(tokenizer=tokenizer, template=load_template(prompt.template), system=system_prompt(prompt),
                   chat=chat, fmt=prompt.fmt, schemas=prompt.schemas,
                   native=prompt.schemas and chat and renders_tools(tokenizer), per_demo=prompt.per_demo)

    def tools(self, example: Any, demos: Sequence[Any]) -> list[Schema]:
        """The schemas the instructions offer: the example's, then (pooled) the demonstrations' not yet named."""
        first: dict[str, Schema] = {}
        for e in [example] if self.per_demo else [example, *demos]:
            for schema in e.schemas:
                first.setdefault(schema["function"]["name"], schema)
        return list(first.values())

    def head(self, example: Any, demos: Sequence[Any]) -> str:
        """The instructions with the tools, as the system turn shows them after the system text."""
        if not self.schemas:
            return render_head(example, [] if self.per_demo else demos, self.template)
        schemas = "\n".join(json.dumps(s, ensure_ascii=False) for s in self.tools(example, demos))
        return self.template.format(tools=schemas,
                                    call_example=self.fmt.write("<function name>", {"<argument name>": "<value>"}))

    def user_turn(self, example: Any, note: str = "") -> str:
        """A user turn: the query (:func:`query_turn`), after its own tools under ``per_demo``, where every
        turn, the demonstrations' and the query's, shows the tools it may call."""
        if not self.per_demo:
            return query_turn(example, note)
        tools = "\n".join(json.dumps(s, ensure_ascii=False) for s in example.schemas) if self.schemas else example.tools
        return f"Tools for this query:\n{tools}\n\n{query_turn(example, note)}"

    def messages(self, example: Any, demos: Sequence[Any], note: str = "") -> list[dict[str, str]]:
        """Instructions as the system turn (the system text alone where the chat template renders the tools),
        each demonstration as a user / assistant exchange, then the query.

        Demonstrations come least similar first, so the most similar sits next to the query.
        """
        system = self.system if self.native else f"{self.system}\n\n{self.head(example, demos)}"
        messages = [{"role": "system", "content": system + _caller_system(example)}]
        for demo in reversed(demos):
            messages += [{"role": "user", "content": self.user_turn(demo)},
                         {"role": "assistant", "content": self.fmt.demonstration(demo.demo)}]
        return messages + self.query_turns(example, note)

    def text(self, example: Any, demos: Sequence[Any], note: str = "") -> str:
        """The same prompt for a base model: one text that the model continues with its call."""
        shots = "".join(f"{self.user_turn(d)}\n{self.fmt.demonstration(d.demo)}\n\n" for d in reversed(demos))
        turns = "\n".join(t["content"] for t in self.query_turns(example, note))
        return f"{self.system}\n\n{self.head(example, demos)}{_caller_system(example)}\n\n{shots}{turns}\n"

    def query_turns(self, example: Any, note: str = "") -> list[dict[str, str]]:
        """The turns after the demonstrations: the query alone, or the example's whole conversation, each turn
        in the reply format's text form (:data:`RESULT_FORMS`), tool results in user turns, consecutive turns
        of one role joined, so that user and assistant alternate."""
        conversation = getattr(example, "conversation", None)
        if conversation is None:
            return [{"role": "user", "content": self.user_turn(example, note)}]
        result, final = RESULT_FORMS[self.fmt.name]
        last_user = max(i for i, t in enumerate(conversation.turns) if t.role == "user")
        out: list[dict[str, str]] = []
        for i, turn in enumerate(conversation.turns):
            if turn.role == "user":
                role, content = "user", self.user_turn(example, note) if i == last_user else query_text(turn.text)
            elif turn.role == "tool":
                role, content = "user", result.format(result=turn.text)
            else:
                calls = [self.fmt.write(name, args) for name, args in turn.calls]
                said = turn.text if calls or not turn.text else final.format(text=turn.text)
                role, content = "assistant", "\n".join(([said] if said else []) + calls)
            if out and out[-1]["role"] == role:
                out[-1]["content"] += f"\n{content}"
            else:
                out.append({"role": role, "content": content})
        return out

    def render(self, messages: list[dict[str, str]], example: Any, demos: Sequence[Any]) -> list[int]:
        """Chat ``messages`` about ``example`` as token ids, ending with the assistant's turn opened."""
        tools = {"tools": self.tools(example, demos)} if self.native else {}
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **tools)
        return list(out["input_ids"] if isinstance(out, Mapping) else out)  # a list, or a mapping holding it

    def encode(self, example: Any, demos: Sequence[Any], note: str = "") -> list[int]:
        if self.chat:
            return self.render(self.messages(example, demos, note), example, demos)
        return self.tokenizer(self.text(example, demos, note), add_special_tokens=True)["input_ids"]

    def build(self, example: Any, demos: Sequence[Any], budget: int) -> Prompt:
        """Encode ``example`` with ``demos`` (most similar first), dropping the least similar until it fits
        ``budget`` tokens."""
        kept = list(demos)
        while True:
            ids = self.encode(example, kept)
            if len(ids) <= budget or not kept:
                break
            kept.pop()
        if len(ids) > budget:
            raise PromptTooLong(f"example {example.id}: the prompt without demonstrations has {len(ids)} tokens, "
                                f"more than the {budget} the context window leaves; expected a larger "
                                "llm.context_window", len(ids), budget)
        return Prompt(ids=ids, n_demos=len(kept), dropped=len(demos) - len(kept))


def option_token_ids(tokenizer: Any, option: str) -> list[int]:
    """First token of the option letter as the model may write it ("A", " A")."""
    return sorted({tokenizer.encode(v, add_special_tokens=False)[0] for v in (option, f" {option}")})
