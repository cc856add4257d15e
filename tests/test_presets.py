"""Every experiment preset, as a sweep would run it: every combination of its ``hydra.sweeper.params``
composes and passes ``check_config`` (fast), and every preset runs end to end on ``tiny_random`` (slow).

The combinations come from Hydra's own override parser, so a preset whose sweep names a missing
option, a broken interpolation or a value ``check_config`` rejects fails here, not hours into a sweep.
"""

from __future__ import annotations

import itertools

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from conftest import cache_sharing_models
from mice_exp.compose import compose_config
from mice_exp.pipeline import Pipeline
from mice_exp.paths import PACKAGE_ROOT

CONF = PACKAGE_ROOT / "conf"
PRESETS = sorted(p.stem for p in CONF.glob("experiment/*.yaml"))
FIXTURE = PACKAGE_ROOT / "tests" / "fixtures" / "ste_tiny.json"


def sweep_of(preset: str, *extra: str) -> dict[str, list[str]]:
    """The preset's ``hydra.sweeper.params`` as key -> the override strings a sweep runs, in order."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"+experiment={preset}", *extra], return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    params = OmegaConf.to_container(params, resolve=False) if params else {}
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    return {o.key_or_group: list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
            for o in parsed}


def combinations(sweep: dict[str, list[str]]) -> list[list[str]]:
    """Every job of the sweep as its list of overrides (one job when the preset sweeps nothing)."""
    return [[f"{k}={v}" for k, v in zip(sweep, values)] for values in itertools.product(*sweep.values())]


def test_sweeps_are_read_with_hydras_parser():
    sweep = sweep_of("table1")
    assert sweep["llm"] == ["smollm2_135m", "gemma3_270m"] and sweep["protocol"] == ["holdout", "loao"]
    assert len(combinations(sweep)) == 2 * 5 * 2
    assert combinations({}) == [[]]


@pytest.mark.parametrize("scale", [[], ["+scale=small"]], ids=["full", "small"])
@pytest.mark.parametrize("preset", PRESETS)
def test_every_job_of_every_preset_composes_and_builds_a_checked_pipeline(preset, scale):
    """Every job at full size; scaled down (which changes sizes only), the sweep's first and last jobs."""
    jobs = combinations(sweep_of(preset, *scale))
    jobs = jobs if not scale else [jobs[0], jobs[-1]]
    for job in jobs:
        cfg = compose_config([f"+experiment={preset}", *scale, *job])
        plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        Pipeline.from_config(plain)  # the values, then the built objects against each other
        for override in job:  # the job really is what the sweep asked for
            key, value = override.split("=", 1)
            node = OmegaConf.select(cfg, key)
            if isinstance(node, (str, int, float)):
                assert str(node) == value or float(node) == float(value), (preset, override, node)
            else:  # a group: its entry is the option's (every group entry carries its name or key)
                assert value in (node.get("name"), node.get("key")), (preset, override)


#: Small sizes for the keys a preset's config has (a holdout run has no protocol.sizes).
WHERE_PRESENT = {"protocol.sizes": "[1,2]", "protocol.trials": "2", "protocol.n_jobs": "1",
                 "estimator.model.n_estimators": "10", "estimator.model.n_jobs": "1",
                 "estimator.diagnostics.min_region": "1"}
#: A field correction's network: two epochs, one bandwidth, one regularisation.
FIELD = ["+estimator.model.field.max_epochs=2", "+estimator.model.field.sigmas=[0.5]",
         "+estimator.model.field.lambdas=[0.01]"]


def tiny(tmp_path, preset: str) -> list[str]:
    """Sizes that run a preset in seconds: tiny_random on the 6-call fixture, each swept key at its first
    value but the LLM, small grids, a temporary cache (sharing the converted tokenizer) and MLflow store."""
    first = [f"{key}={values[0]}" for key, values in sweep_of(preset).items() if key != "llm"]
    args = [f"+experiment={preset}", *first, "llm=tiny_random", f"dataset.path={FIXTURE}", "llm.batch_size=3",
            "llm.max_new_tokens=6", "prompt.k_demos=2", f"paths.cache={cache_sharing_models(tmp_path / 'cache')}",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", "permutations=20", "n_jobs=1",
            "baselines.mice_rf.model.n_estimators=10", "baselines.mice_rf.model.n_jobs=1",
            "sources.consistency.samples=2", "sources.verbalized.max_new_tokens=2"]
    cfg = compose_config(args)
    args += [f"{key}={value}" for key, value in WHERE_PRESENT.items() if OmegaConf.select(cfg, key) is not None]
    return args + (FIELD if cfg.estimator.get("base") else [])


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_runs_end_to_end_on_tiny_random(preset, tmp_path, monkeypatch, capsys):
    """One job of each preset (its sweep's first values) through run(): LLM stage, sources, view,
    protocol, metrics and a FINISHED MLflow run. tiny_random never writes a correct call, so labels
    alternate by example to give the estimators both classes."""
    from mlflow import MlflowClient

    from mice_exp.llm import runner
    from mice_exp.run import run

    monkeypatch.setattr(runner, "is_correct", lambda example, api, args: int(example.id.rsplit("/", 1)[-1]) % 2 == 0)
    result = run(compose_config(tiny(tmp_path, preset)))
    info = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(result["run_id"])
    assert info.info.status == "FINISHED", preset
    printed = capsys.readouterr().out
    if preset == "sample_efficiency":
        assert "sample_efficiency.csv" in {a.path for a in MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
                                            .list_artifacts(result["run_id"])}
    else:
        assert "Confidence estimator" in printed and "auc_etcu" in info.data.metrics
