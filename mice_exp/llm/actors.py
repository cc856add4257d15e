"""Other agents' calls on a data set's queries (the actors), read into the project's records shape.

An actor is a model whose calls a judge scores without having made them: one of STE's published runs of
7B-13B models (``../shared/data/ste_actors/<name>.json``: API -> records in ``tool_test.json``'s order, each with
the model's raw ``model_output``), or any LLM's records file of this project. Each reply is parsed by the
project's parser (STE's toolken form ``Action: <tool_NAME>`` read as ``Action: NAME``) and labelled by the data
set's own rule, so an actor's labels mean what the judges' own labels mean; STE's judgement (``api_match`` and
``args_correct`` / ``chatgpt_args_jud``) is kept beside it to report how the two agree. A host never hands a guard
a reply that does not parse, so such replies are counted, not judged. Torch-free.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from mice_exp.cache import stable_hash
from mice_exp.data.labels import is_correct
from mice_exp.data.records import Example
from mice_exp.errors import UserError
from mice_exp.llm.toolcall import REACT, CallFormat

#: STE's fine-tuned models name a tool as a token of its own, ``Action: <tool_NAME> Action Input: {...}``.
TOOLKEN = re.compile(r"Action\s*:\s*<tool_(?P<name>[^>\n]*)>[ \t]*\n?[ \t]*")
#: Why an actor's record is not judged, in the order a report lists them.
PROBLEMS = ("unparseable", "unknown_api", "beyond_the_api", "query_differs", "malformed")


def normalise(text: str) -> str:
    """STE's toolken form as its ReAct form (``Action: NAME`` on a line of its own); other text as it is."""
    return TOOLKEN.sub(lambda m: f"Action: {m['name'].strip()}\n", text, count=1)


@dataclass(frozen=True)
class ActorCall:
    """One of an actor's replies: the query it answers, the parsed call (``args`` None: no call, ``parse_error``
    says why) and its label by the data set's rule; ``ste_label``: STE's own judgement where the file has one."""

    id: str
    api: str | None
    args: dict[str, Any] | None
    parse_error: str | None
    label: int
    ste_label: int | None = None

    @property
    def judged(self) -> bool:
        """Whether a judge scores it: a parsed call (a host hands a guard nothing else)."""
        return self.args is not None


@dataclass
class Actor:
    """An actor's calls in its file's order, and its records that were not judged, by why (:data:`PROBLEMS`)."""

    name: str
    source: Path
    calls: list[ActorCall]
    problems: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)  # a problem -> the first record that had it

    @property
    def key(self) -> str:
        """What identifies the calls a judge scores (their ids and parsed calls): the judged records' cache key."""
        return stable_hash([(c.id, c.api, c.args) for c in self.calls if c.judged])

    def judged(self) -> list[ActorCall]:
        return [c for c in self.calls if c.judged]

    def add(self, call: ActorCall) -> None:
        """One more reply, counted as unparseable where it holds no call."""
        if not call.judged:
            self.problems["unparseable"] += 1
            self.examples.setdefault("unparseable", call.id)
        self.calls.append(call)

    def report(self) -> dict[str, Any]:
        """Counts a table states beside the actor: records, judged calls, accuracy of the judged ones, every
        problem, and the agreement of the project's labels with STE's (over records STE judged)."""
        judged = self.judged()
        rated = [c for c in self.calls if c.ste_label is not None]
        both = Counter((c.label, c.ste_label) for c in rated)
        return {"actor": self.name, "records": len(self.calls) + sum(self.problems[p] for p in PROBLEMS[1:]),
                "judged": len(judged), "accuracy": sum(c.label for c in judged) / len(judged) if judged else None,
                **{p: int(self.problems[p]) for p in PROBLEMS},
                "ste_rated": len(rated), "ste_agreement": sum(both[(a, a)] for a in (0, 1)) / len(rated) if rated else None,
                "ours_1_ste_0": both[(1, 0)], "ours_0_ste_1": both[(0, 1)]}


def actor_path(actor: str, folder: Path, root: Path) -> Path:
    """``actor=NAME`` (a file ``<folder>/NAME.json``) or a path (relative to ``root``): the actor's file."""
    named = folder / f"{actor}.json"
    if named.is_file():
        return named
    given = root / actor
    if given.is_file():
        return given
    names = ", ".join(actor_names(folder)) or f"none: {folder} holds no actor files"
    raise UserError(f"actor={actor!r}: no actor of that name in {folder} and no such file; expected one of {names}, "
                    "or the path of an actor file or of a records file")


def actor_names(folder: Path) -> list[str]:
    """Every actor file's name in ``folder``."""
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def read_actor(path: Path, examples: Mapping[str, Example], fmt: CallFormat = REACT) -> Actor:
    """An actor's file of STE's published-predictions shape, its replies parsed and labelled against
    ``examples`` (the data set's, by id ``<dataset>/<api>/<index>``). A record whose API or position is not in
    the data set, whose query differs from the data set's, or that is not a record is counted per actor, as is a
    reply that does not parse; a file that is not such JSON at all is one line."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(f"actor file {path}: not readable as JSON ({str(error)[:80]}); expected STE's published "
                        "predictions, an object API -> list of records with a 'model_output'") from None
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise UserError(f"actor file {path}: expected an object API -> list of records (STE's published "
                        f"predictions), got {type(data).__name__}")
    dataset = next(iter(examples.values())).dataset if examples else "ste"
    apis = {e.api for e in examples.values()}
    actor = Actor(path.stem, path, [])
    for api, items in data.items():
        for index, item in enumerate(items):
            qid = f"{dataset}/{api}/{index}"
            problem = _problem(qid, api in apis, item, examples)
            if problem is not None:
                actor.problems[problem] += 1
                actor.examples.setdefault(problem, qid)
                continue
            call = fmt.parse(normalise(item["model_output"]))
            args = call.args if isinstance(call.args, dict) else None
            label = int(args is not None and is_correct(examples[qid], call.api, args))
            actor.add(ActorCall(qid, call.api, args, call.parse_error if args is None else None, label,
                                _ste_label(item)))
    return actor


def _problem(qid: str, known_api: bool, item: Any, examples: Mapping[str, Example]) -> str | None:
    if not isinstance(item, dict) or not isinstance(item.get("model_output"), str):
        return "malformed"
    if qid not in examples:
        return "beyond_the_api" if known_api else "unknown_api"
    if "query" in item and str(item["query"]) != examples[qid].query:
        return "query_differs"
    return None


def _ste_label(item: Mapping[str, Any]) -> int | None:
    """STE's judgement of a record: the right API and right arguments (by string match or by its gpt-3.5 judge);
    a record STE flagged as no call or a parse error is wrong; None where it holds no judgement at all."""
    if item.get("no_call") or item.get("err"):
        return 0
    if "api_match" not in item:
        return None
    args = item.get("args_correct", item.get("chatgpt_args_jud", 0))
    return int(bool(item["api_match"]) and bool(args))


def actor_from_records(path: Path, records: list[Mapping[str, Any]], name: str) -> Actor:
    """An LLM's own records (a records file of this project) as an actor: its parsed calls and labels."""
    actor = Actor(name, path, [])
    for r in records:
        args = r["pred_args"] if isinstance(r["pred_args"], dict) else None
        actor.add(ActorCall(r["id"], r["pred_api"], args, r["parse_error"] if args is None else None, int(r["label"])))
    return actor
