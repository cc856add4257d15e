"""The recipes of docs/extending.md that no seam's own test does: a new feature view and a new confidence source,
each written from the page into a scratch checkout (:mod:`tests.recipes`) and run through the pipeline on
``tiny_random``. The others: ``test_estimator_seam``, ``test_metric_registry``, ``test_backend_objects``,
``test_data_seam``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mice_exp.features import view_classes
from mice_exp.llm import sources
from mice_exp.pipeline import Pipeline
from tests.conftest import cache_sharing_models
from tests.recipes import EXTENDING, follow_recipe, recipe
from tests.test_llm_stage import paths_in, tiny_cfg


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One cache for the module's runs, so that they share one LLM stage."""
    return cache_sharing_models(tmp_path_factory.mktemp("cache"))


def tiny_pipeline(cache: Path, **overrides: str) -> Pipeline:
    """The pipeline of ``tiny_random`` on the six STE fixture calls."""
    return Pipeline.from_config(tiny_cfg(**overrides), paths_in(cache))


def test_every_recipe_names_its_test_and_its_files():
    """Each recipe's section holds code blocks naming their files, and the page names a test that exists."""
    tests = Path(__file__).parent
    for section in ("A new estimator", "A new Table-1 metric", "A new feature view", "A new LLM backend",
                    "A new data set", "A new confidence source"):
        assert recipe(section), section
    text = EXTENDING.read_text(encoding="utf-8")
    for name in ("test_a_new_estimator_is_a_module_and_a_yaml", "test_a_new_feature_view_is_a_module_and_a_yaml",
                 "test_a_new_table_metric_is_its_function_and_one_registry_entry",
                 "test_a_new_backend_is_its_module_and_the_entry_naming_it", "test_a_new_data_set_is_a_module_and_a_yaml",
                 "test_a_new_confidence_source_is_an_entry_and_a_block"):
        assert f"`{name}`" in text and any(f"def {name}(" in p.read_text() for p in tests.glob("test_*.py")), name


def test_a_new_feature_view_is_a_module_and_a_yaml(cache, tmp_path, monkeypatch):
    """``features=norm`` builds the recipe's view (a gate would trust its class), and the feature set's columns are
    its norms of the stage's pooled states, then the raw confidence."""
    follow_recipe("A new feature view", tmp_path, monkeypatch)
    assert "NormView" in [cls.__name__ for cls in view_classes()]
    pipeline = tiny_pipeline(cache, features="norm")
    output = pipeline.stage_output()
    fs = pipeline.features(output)
    layers = output.n_layers
    assert fs.columns == [*(f"norm_L{i}" for i in range(1, layers + 1)), "confidence"]
    np.testing.assert_allclose(fs.X[:, :layers], np.linalg.norm(output.arrays("mean_pool"), axis=2), rtol=1e-6)
    np.testing.assert_array_equal(fs.X[:, -1], [r["raw_confidence"] for r in output.records])


def test_a_new_confidence_source_is_an_entry_and_a_block(cache, tmp_path, monkeypatch):
    """``features.sources=[says_yes]`` makes the run compute the recipe's source (``sources.use`` follows), cached
    beside the LLM stage, and the view appends its values as a column."""
    follow_recipe("A new confidence source", tmp_path, monkeypatch)
    assert sources.SOURCES["says_yes"].block == "says_yes"
    pipeline = tiny_pipeline(cache, features="conf_only", **{"features.sources": "[says_yes]"})
    assert list(pipeline.sources["use"]) == ["says_yes"]
    output = pipeline.stage_output()
    fs = pipeline.features(output, pipeline.confidence_sources(output))
    assert fs.columns == ["confidence", "says_yes"]
    assert set(fs.X[:, 1]) <= {0.0, 1.0} and len(fs.X) == len(output.records)
    (folder,) = pipeline.stage.derived_folder(output).glob("source-says_yes-*")
    np.testing.assert_array_equal(fs.X[:, 1], sources.load_source(folder, output.ids))
