"""``prompt.demo_pool``: demonstrations from the training split only, so no evaluation answer is in a prompt.

STE repeats gold calls a lot (167 of its 350 validation and test calls have a gold call that some training
call also has, e.g. ``get_today_date {}``), so "no evaluation answer in a prompt" is checked on what
identifies a call: its query, shown with its answer as a demonstration turn.
"""

from __future__ import annotations

import pytest

from mice_exp.cache import stable_hash
from mice_exp.compose import as_plain, compose_config
from mice_exp.data import demo_pool
from mice_exp.errors import UserError
from mice_exp.llm.prompt import PromptBuilder
from mice_exp.llm.settings import PromptSettings
from mice_exp.llm.records import read_records_file, read_records_header
from mice_exp.llm.sources import near_orders
from mice_exp.paths import PACKAGE_ROOT, Paths
from tests.conftest import stage_of

POOL_ALL = PACKAGE_ROOT / "experiments" / "records" / "ste-smollm2_135m-pool-all.jsonl.gz"


def ste(*overrides: str) -> tuple[dict, object]:
    """The config and the LLM stage of SmolLM2 on STE."""
    cfg = as_plain(compose_config(["llm=smollm2_135m", *overrides]))
    return cfg, stage_of(cfg, Paths(root=PACKAGE_ROOT, cache=PACKAGE_ROOT / ".cache"))


def shown_evaluation_calls(cfg: dict, selection, demos: dict[str, list[str]], tokenizer) -> set[str]:
    """Validation and test calls whose query appears in a demonstration turn of some prompt."""
    by_id = {e.id: e for e in selection.examples}
    evaluation = {e.query: e.id for e in selection.examples if selection.splits[e.id] != "train"}
    builder = PromptBuilder.from_config(PromptSettings.from_config(cfg["prompt"]), tokenizer)
    shown = set()
    for example in selection.examples:
        messages = builder.messages(example, [by_id[d] for d in demos[example.id]])
        for turn in messages[1:-1]:  # the demonstrations: the system turn and the query itself are not
            shown |= {i for query, i in evaluation.items() if turn["content"] == f"User Query: {query}"}
    return shown


@pytest.fixture(scope="module")
def demos_by_pool(tmp_path_factory) -> dict[str, tuple[dict, object, dict]]:
    out = {}
    for pool in ("train", "all"):
        cfg, stage = ste(f"prompt.demo_pool={pool}")
        out[pool] = cfg, stage, stage.demos(tmp_path_factory.mktemp(pool))
    return out


def test_the_train_pool_shows_no_evaluation_call_in_any_prompt(demos_by_pool, tokenizer):
    cfg, stage, demos = demos_by_pool["train"]
    selection = stage.selection
    assert len(demos) == 750 and all(len(d) == 8 for d in demos.values())
    assert {selection.splits[d] for ids in demos.values() for d in ids} == {"train"}
    assert shown_evaluation_calls(cfg, selection, demos, tokenizer) == set()


def test_the_all_pool_shows_evaluation_calls_as_the_published_records_did(demos_by_pool, tokenizer):
    cfg, stage, demos = demos_by_pool["all"]
    shown = shown_evaluation_calls(cfg, stage.selection, demos, tokenizer)
    assert len(shown) > 300  # nearly every one of the 350: what the train pool exists to prevent
    assert all(i not in ids for i, ids in demos.items())  # never the call itself


def test_the_all_pool_rebuilds_the_published_pool_all_prompts(demos_by_pool, tokenizer):
    """``all`` keeps the old stage key (so old caches still match) and rebuilds every prompt of the
    published pool-all records token for token: the same prompts give the same greedy records. Retrieval on
    another CPU may order one near-tie (similarities 1e-7 apart) the other way, as ``mice-exp records``
    allows: every prompt rebuilds in the retrieved order or with two neighbours swapped, at most one swapped."""
    cfg, stage, demos = demos_by_pool["all"]
    selection = stage.selection
    header = read_records_header(POOL_ALL)
    assert stage.key("cpu") == header["stage_key"]
    assert f"smollm2_135m-{stable_hash(header['stage_key'])}" == header["stage_cache"]
    by_id = {e.id: e for e in selection.examples}
    budget = cfg["llm"]["context_window"] - cfg["llm"]["max_new_tokens"]
    records = read_records_file(POOL_ALL).records
    builder = PromptBuilder.from_config(PromptSettings.from_config(cfg["prompt"]), tokenizer)

    def first_matching_order(record: dict) -> int | None:
        orders = near_orders([by_id[d] for d in demos[record["id"]]])
        hashes = (stable_hash(builder.build(by_id[record["id"]], order, budget).ids) for order in orders)
        return next((i for i, h in enumerate(hashes) if h == record["prompt_hash"]), None)

    matched = [first_matching_order(r) for r in records]
    assert None not in matched and sum(m > 0 for m in matched) <= 1


def test_the_pool_is_part_of_the_stage_key_and_train_is_the_default(demos_by_pool):
    (_, train, _), (_, every, _) = demos_by_pool["train"], demos_by_pool["all"]
    assert as_plain(compose_config([]))["prompt"]["demo_pool"] == "train"
    assert train.key("cpu")["prompt"]["demo_pool"] == "train"
    assert train.key("cpu") != every.key("cpu")


def test_a_records_file_of_another_pool_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"written with demo_pool='all'; this run has prompt.demo_pool='train'") as error:
        read_records_file(POOL_ALL, "ste", expect={"llm": "smollm2_135m", "demo_pool": "train"})
    assert "\n" not in str(error.value)
    with pytest.raises(UserError, match=r"written with llm='smollm2_135m'; this run has llm.name='gemma3_270m'"):
        read_records_file(POOL_ALL, "ste", expect={"llm": "gemma3_270m", "demo_pool": "all"})
    assert len(read_records_file(POOL_ALL, "ste", expect={"llm": "smollm2_135m", "demo_pool": "all"}).records) == 750


def test_an_unknown_pool_is_one_line_listing_the_choices():
    _, stage = ste()
    with pytest.raises(UserError, match=r"prompt.demo_pool='test'; expected one of train, all"):
        demo_pool(stage.selection, "test")
    from mice_exp.config import check_values

    with pytest.raises(UserError, match=r"prompt.demo_pool='everything'; expected one of train, all"):
        check_values(as_plain(compose_config(["prompt.demo_pool=everything"])))


def test_a_pool_too_small_for_k_is_one_line(tmp_path):
    _, stage = ste("dataset.max_apis=1", "prompt.k_demos=8")  # 8 training calls: a training call has 7 others
    with pytest.raises(UserError, match="k=8 demonstrations requested but only 7 other examples are in the pool"):
        stage.demos(tmp_path)
