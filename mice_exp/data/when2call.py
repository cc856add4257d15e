"""When2Call (Ross et al., NAACL 2025): should the model call a tool, ask for what is missing, or decline?

The test set in ``../shared/data/when2call/when2call_test_llm_judge.jsonl`` (NVIDIA/When2Call, Apache-2.0 code,
CC-BY-4.0 data): 300 items, 100 each whose right behaviour is ``tool_call``, ``request_for_info`` or
``cannot_answer``. Each item holds its question, the offered tools (BFCL-style function objects as JSON strings,
zero to 26), the four candidate answers (``direct``, ``tool_call``, ``request_for_info``, ``cannot_answer``; the
``tool_call`` one is ``{"name", "arguments"}`` as JSON), ``target_tool`` and the BFCL v2 live item it was made
from (``source_id``: items of one source share a split).

Labels (:class:`When2CallLabels`), the behaviour When2Call scores: on a ``tool_call`` item a reply is right iff it
calls the target tool (its arguments are not checked, as When2Call's classes do not check them; each argument is
labelled against the candidate answer's); on the others iff it makes no call (asking and declining both count;
telling them apart is the generation protocol's classifier). The truth of "a call is the right move" is the item's
class (``api`` here), what the action-belief gap is measured against.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from mice_exp.data.dataset import Dataset
from mice_exp.data.labels import json_equal, made_call
from mice_exp.data.records import Example, Labels, format_demo
from mice_exp.errors import UserError
from mice_exp.paths import Paths

SHARED_RELATIVE_PATH = Path("..") / "shared" / "data" / "when2call" / "when2call_test_llm_judge.jsonl"
#: When2Call's answer classes; the first is the one where a call is right.
CLASSES = ("tool_call", "request_for_info", "cannot_answer")
#: The four candidate answers of every item, in the file's order: the choices' order in When2Call's MCQ task.
ANSWERS = ("direct", "tool_call", "request_for_info", "cannot_answer")
#: The prompt of When2Call's default lm-eval-harness task (``evaluation/mcq/lm_eval_harness/when2call/utils.py``,
#: ``process_docs_default``, NVIDIA/When2Call at ecc8d42, Apache-2.0), kept verbatim (trailing space included).
MCQ_SYSTEM = ("You are a helpful AI assistant. \nYou have access to the following tools described in <tool></tool> "
              "which you can use to answer the user's questions.\nOnly use a tool if it directly answers the user's "
              "question.\n")
MCQ_TOOL_USE = ('To use a tool, return JSON in the following format:\n{"name": "tool_name", "arguments": '
                '{"argument1": "value1", "argument2": "value2", ...}}\n')
#: Reply classes of the generation protocol (:func:`classify_reply`), in When2Call's order.
REPLY_CLASSES = ("answer", "call", "ask", "decline")
#: A reply holding one of these declines (checked before asking: "I can't ... anything else?" is a refusal).
DECLINES = ("unable to", "cannot", "can't", "can not", "not able to", "don't have access", "do not have access",
            "no function", "no tool", "none of the", "not possible", "i'm sorry", "i am sorry", "apologi")
#: A reply holding one of these (or a question mark) asks the user for something.
ASKS = ("?", "please provide", "please specify", "please tell", "could you", "can you provide", "can you tell",
        "let me know", "i need")


class When2CallLabels(Labels):
    """When2Call's behaviour labels (module docstring); ``gold``: ``{"class", "call", "answers", "source_id"}``."""

    def is_correct(self, example: Example, api: str | None, args: dict[str, Any] | None) -> bool:
        call = example.gold["call"]
        if call is None:
            return not made_call(api, args)
        return made_call(api, args) and api == call["name"]

    def argument_labels(self, example: Example, args: dict[str, Any]) -> dict[str, bool]:
        call = example.gold["call"]
        if call is None:
            return {}
        gold = call["arguments"]
        return {name: name in gold and json_equal(value, gold[name]) for name, value in args.items()}

    def gold_api(self, example: Example) -> str | None:
        call = example.gold["call"]
        return None if call is None else call["name"]

    def call_expected(self, example: Example) -> bool | None:
        return None if example.gold["call"] is not None else False


class When2Call(When2CallLabels, Dataset):
    """When2Call's 300-item test set (``conf/dataset/when2call.yaml``); each answer class is one "API" (the
    stratum), and items made from one BFCL source never cross splits."""

    name = "when2call"

    def __init__(self, path: str | None = None, **common: Any) -> None:
        super().__init__(**common)
        self.path = path

    def load(self, paths: Paths) -> list[Example]:
        file = paths.root / (Path(self.path) if self.path is not None else SHARED_RELATIVE_PATH)
        examples, self.skipped = load_when2call(file, self)
        return examples

    def source(self) -> str:
        return f"dataset.path={self.path!r}"

    def conversation(self, example: Example) -> str:
        return example.gold["source_id"]

    def multiple_choice(self, example: Example) -> tuple[str, dict[str, str]]:
        """The item as When2Call's default MCQ task poses it (``when2call.yaml``: ``doc_to_text: prompt``,
        ``target_delimiter: ""``): its system text, tool-use instructions, each offered tool verbatim in
        ``<tool></tool>`` (blank lines between), the question; and the four answers, as they are, to continue it."""
        tools = "\n\n".join(f"<tool>{tool}</tool>" for tool in example.gold["tool_strings"])
        prompt = f"{MCQ_SYSTEM}\n{MCQ_TOOL_USE}\n\n{tools}\n\n{example.query}"
        return prompt, {name: str(example.gold["answers"][name]) for name in ANSWERS}


def load_when2call(path: Path, labels: When2CallLabels) -> tuple[list[Example], Counter[str]]:
    """The items of ``path`` in file order, and how many were skipped for each reason (an item whose tools or
    ``tool_call`` answer does not parse, whose target tool is not offered, or that repeats an earlier one). A file
    that is not JSON lines is
    one line naming it."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"dataset=when2call: cannot read {path} ({error}); expected When2Call's "
                        "when2call_test_llm_judge.jsonl (dataset.path=FILE)") from None
    examples: list[Example] = []
    skipped: Counter[str] = Counter()
    seen: set[str] = set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            raise UserError(f"{path}:{number}: not valid JSON ({error.msg}); expected one When2Call item per line") from None
        same = json.dumps(item, sort_keys=True)
        if same in seen:  # one item twice would count twice in every table, under two ids
            skipped["a repeat of an earlier item"] += 1
            continue
        seen.add(same)
        try:
            example = _example(item, len(examples) + sum(skipped.values()), labels)
        except (KeyError, TypeError, ValueError) as error:  # json.JSONDecodeError is a ValueError
            skipped[f"malformed ({type(error).__name__})"] += 1
            continue
        if example is None:
            skipped["target tool not offered"] += 1
            continue
        examples.append(example)
    return examples, skipped


def _example(item: dict[str, Any], index: int, labels: When2CallLabels) -> Example | None:
    """One item; None where its tool_call answer names a tool it does not offer."""
    behaviour = item["correct_answer"]
    if behaviour not in CLASSES:
        raise ValueError(f"correct_answer {behaviour!r}")
    functions = [json.loads(tool) for tool in item["tools"]]
    names = tuple(str(f["name"]) for f in functions)
    call = None
    if behaviour == "tool_call":
        call = json.loads(item["answers"]["tool_call"])
        if not isinstance(call.get("arguments"), dict):
            raise TypeError("tool_call answer without an arguments object")
        if call["name"] not in names:
            return None
    demo = format_demo(call["name"], call["arguments"]) if call else str(item["answers"][behaviour])
    return Example(id=f"when2call/{behaviour}/{index}", dataset="when2call", api=behaviour,
                   query=str(item["question"]), tools=json.dumps(functions, indent=4, ensure_ascii=False),
                   tool_names=names, gold={"class": behaviour, "call": call, "answers": item["answers"],
                                           "source_id": str(item["source_id"]), "tool_strings": list(item["tools"])},
                   demo=demo, labels=labels)


def classify_reply(text: str, called: bool) -> str:
    """A generated reply's class, by rules a reader can check: ``call`` where it holds a parsed tool call
    (the records' ``pred_api``), else ``decline`` where it holds a refusal phrase (:data:`DECLINES`), else ``ask``
    where it holds a question mark or a request phrase (:data:`ASKS`), else ``answer`` (a direct answer: When2Call
    counts one as a hallucination on every item of this set). Case-insensitive substring matches."""
    if called:
        return "call"
    lowered = text.lower().replace("\u2019", "'")
    if any(phrase in lowered for phrase in DECLINES):
        return "decline"
    if any(phrase in lowered for phrase in ASKS):
        return "ask"
    return "answer"
