"""Backends as objects (:mod:`mice_exp.llm.backends`) and confidence sources as calculators
(:data:`mice_exp.llm.sources.SOURCES`): a new backend is its module and the entry naming it, what a backend cannot
give is refused before any model loads, and ``sources.use`` follows from what the view and the estimators read."""

from __future__ import annotations

import re

import pytest

from mice_exp.errors import UserError
from mice_exp.llm.backends import backend_class
from mice_exp.paths import PACKAGE_ROOT
from mice_exp.pipeline import Pipeline
from tests.conftest import cache_sharing_models
from tests.recipes import follow_recipe
from tests.test_llm_stage import paths_in, tiny_cfg


@pytest.fixture
def replies(tmp_path, monkeypatch) -> str:
    """``llm.backend`` naming the backend of docs/extending.md's recipe: a whole backend in one module, a black box
    that answers greedily and gives nothing else (no layers, no probabilities over the vocabulary)."""
    follow_recipe("A new LLM backend", tmp_path, monkeypatch)
    return "replies"


def no_model_loads(monkeypatch) -> None:
    from mice_exp.llm import model

    for loader in ("load_hf", "load_tokenizer"):
        monkeypatch.setattr(model, loader, lambda *a, **k: pytest.fail("a model was loaded"))


def test_a_new_backend_is_its_module_and_the_entry_naming_it(replies, tmp_path):
    assert backend_class(replies) is backend_class(f"mice_exp.llm.backends.{replies}")  # by name or import path
    cfg = tiny_cfg(**{"llm.backend": replies, "features": "conf_only", "sources.use": "[verbalized]"})
    pipeline = Pipeline.from_config(cfg, paths_in(cache_sharing_models(tmp_path / "cache")))
    assert pipeline.stage.key("cpu")["llm"]["backend"] == "replies"  # its calls are cached apart from hf's
    output = pipeline.stage_output()
    assert len(output.records) == 6 and all(r["layer_strings"] == [] for r in output.records)
    verbalized = pipeline.confidence_sources(output)["verbalized"]
    assert verbalized.shape == (6,)
    assert len(list(pipeline.stage.derived_folder(output).glob("source-verbalized-*"))) == 1


@pytest.mark.parametrize("asked,says", [
    ({"sources.use": "[p_true]"}, r"sources.use=\[p_true\]: p_true needs the next token's probabilities over the "
                                  r"vocabulary .*, which llm.backend=replies does not give; expected sources it can "
                                  r"compute \(verbalized, acts\)"),
    ({"estimator": "consistency"}, r"sources.use=\[consistency\]: consistency needs k sampled replies"),
    ({"estimator": "probe_last"}, r"estimator probe_last reads hidden states, which llm.backend=replies does not"),
    ({"features": "bertscore"}, r"features=bertscore .* reads the LLM's layers, which llm.backend=replies"),
])
def test_what_a_backend_cannot_give_is_refused_before_any_model_loads(replies, tmp_path, monkeypatch, asked, says):
    no_model_loads(monkeypatch)
    with pytest.raises(UserError, match=says):
        Pipeline.from_config(tiny_cfg(**{"llm.backend": replies, "features": "conf_only", **asked}), paths_in(tmp_path))


def test_an_unknown_backend_module_is_one_line(tmp_path):
    for name, says in [("tgi", r"llm.backend='tgi'; expected one of hf, openai, vllm or an importable module path"),
                       ("no_such.module", r"llm.backend='no_such.module' could not be imported"),
                       ("mice_exp.errors", r"llm.backend='mice_exp.errors'; expected .* whose BACKEND is")]:
        with pytest.raises(UserError, match=says):
            Pipeline.from_config(tiny_cfg(**{"llm.backend": name}), paths_in(tmp_path))


#: A backend's name compared or defaulted: ``== "vllm"``, ``in ("hf", "vllm")``, ``.get("backend", ...)``.
NAME_USE = re.compile(r"""(==|!=|\bin)\s*[(\[{]?\s*["'](hf|vllm|openai)["']"""
                      r"""|["'](hf|vllm|openai)["']\s*(==|!=|,\s*["'])"""
                      r"""|get\(\s*["']backend["']|\[\s*["']backend["']\s*\]""")


def test_no_backend_name_is_compared_outside_the_backends():
    found = [f"{path.relative_to(PACKAGE_ROOT)}:{n}: {line.strip()}"
             for path in sorted((PACKAGE_ROOT / "mice_exp").rglob("*.py"))
             if "backends" not in path.relative_to(PACKAGE_ROOT / "mice_exp").parts
             for n, line in enumerate(path.read_text().splitlines(), 1) if NAME_USE.search(line)]
    assert found == []
    assert NAME_USE.search('if llm.get("backend") == "openai":') and NAME_USE.search('held.backend in ("hf", "vllm")')


# -- sources.use follows from what is read ---------------------------------------------------------------------


def use_of(tmp_path, **extra: str) -> list[str]:
    pipeline = Pipeline.from_config(tiny_cfg(**extra), paths_in(tmp_path))
    assert pipeline.config["sources"]["use"] == list(pipeline.sources["use"])  # logged and hashed as computed
    return list(pipeline.sources["use"])


def test_sources_use_is_what_the_estimator_and_the_view_read(tmp_path):
    assert use_of(tmp_path) == []
    assert use_of(tmp_path, estimator="p_true") == ["p_true"]
    assert use_of(tmp_path, estimator="semantic_entropy", **{"features": "conf_only",
                                                             "features.sources": "[verbalized]"}) == [
        "verbalized", "semantic_entropy"]
    # an explicit list may add sources (a records file's, the report's action-belief acts) and is kept as given
    assert use_of(tmp_path, estimator="p_true", **{"sources.use": "[acts,p_true]"}) == ["acts", "p_true"]


def test_an_explicit_sources_use_that_lacks_a_read_source_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"estimator p_true reads the p_true confidence source, which sources.use=\[\] "
                                        r"does not compute; expected sources.use=\[p_true\] \(or null"):
        use_of(tmp_path, estimator="p_true", **{"sources.use": "[]"})
    with pytest.raises(UserError, match=r"sources.use=\['p_ture'\]; expected null .* or a list of p_true"):
        use_of(tmp_path, **{"sources.use": "[p_ture]"})
