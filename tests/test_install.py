"""The install is the one CI tested: every package the lock pins is installed at that version."""

from __future__ import annotations

from importlib import metadata

from mice_exp.paths import PACKAGE_ROOT


def pins() -> dict[str, str]:
    lines = (PACKAGE_ROOT / "requirements.lock").read_text().splitlines()
    return dict(line.split("==", 1) for line in lines if line and not line.startswith("#"))


def test_every_locked_package_is_installed_at_its_locked_version():
    assert {"torch", "transformers", "mlflow", "hydra-core", "scikit-learn"} <= set(pins())
    drifted = {name: (want, metadata.version(name)) for name, want in pins().items()
               if metadata.version(name).split("+")[0] != want}
    assert drifted == {}, f"installed versions differ from requirements.lock (re-run make): {drifted}"
