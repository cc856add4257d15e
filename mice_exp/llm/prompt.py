"""Few-shot tool-call prompts in the STE / MICE format.

The prompt shows STE's instructions with the API descriptions of the gold API and of
the demonstrations' APIs, then k retrieved demonstrations (least similar first, so the
most similar sits next to the query), then the query. Models with a chat template get
the demonstrations as earlier user / assistant turns, so the reply imitates their
format; base models get the same content as one text. ``prompt.no_call_note`` (BFCL's
relevance categories) adds the offer to answer without a call to the system text.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any, Mapping, Sequence

from mice_exp.errors import UserError


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


def system_prompt(cfg: Mapping[str, Any]) -> str:
    """The system text of ``cfg`` (a ``conf/prompt`` node): the ``system`` template, then
    ``no_call_note`` when set, in the same paragraph, as BFCL's prompting mode says it
    ("If none of the functions can be used, point it out.", ``bfcl_eval/constants/default_prompts.py``);
    null (the default) leaves the system text as it always was."""
    system = load_template(cfg["system"]).strip()
    note = cfg.get("no_call_note")
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
    return f"User Query: {example.query}" + (f"\n\n{note}" if note else "")


def chat_messages(example: Any, demos: Sequence[Any], template: str, system: str, note: str = "") -> list[dict[str, str]]:
    """Instructions as the system turn, each demonstration as a user / assistant exchange, then the query.

    Demonstrations come least similar first, so the most similar sits next to the query.
    """
    messages = [{"role": "system", "content": f"{system}\n\n{render_head(example, demos, template)}"}]
    for demo in reversed(demos):
        messages += [{"role": "user", "content": f"User Query: {demo.query}"}, {"role": "assistant", "content": demo.demo}]
    return messages + [{"role": "user", "content": query_turn(example, note)}]


def plain_text(example: Any, demos: Sequence[Any], template: str, system: str, note: str = "") -> str:
    """The same prompt for a base model: one text that the model continues with "Action: ..."."""
    shots = "".join(f"User Query: {d.query}\n{d.demo}\n\n" for d in reversed(demos))
    return f"{system}\n\n{render_head(example, demos, template)}\n\n{shots}{query_turn(example, note)}\n"


def encode(tokenizer: Any, example: Any, demos: Sequence[Any], template: str, system: str, chat: bool,
           note: str = "") -> list[int]:
    if chat:
        out = tokenizer.apply_chat_template(chat_messages(example, demos, template, system, note),
                                            add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if isinstance(out, Mapping) else out)
    return tokenizer(plain_text(example, demos, template, system, note), add_special_tokens=True)["input_ids"]


def build_prompt(example: Any, demos: Sequence[Any], tokenizer: Any, cfg: Mapping[str, Any], budget: int) -> Prompt:
    """Encode ``example`` with ``demos`` (most similar first), dropping the least similar until it fits ``budget`` tokens."""
    template = load_template(cfg["template"])
    system = system_prompt(cfg)
    chat = bool(cfg.get("chat_template", True)) and bool(getattr(tokenizer, "chat_template", None))
    kept = list(demos)
    while True:
        ids = encode(tokenizer, example, kept, template, system, chat)
        if len(ids) <= budget or not kept:
            break
        kept.pop()
    if len(ids) > budget:
        raise UserError(f"example {example.id}: the prompt without demonstrations has {len(ids)} tokens, "
                        f"more than the {budget} the context window leaves; expected a larger llm.context_window")
    return Prompt(ids=ids, n_demos=len(kept), dropped=len(demos) - len(kept))
