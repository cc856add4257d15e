"""Every knob of the field estimator in one frozen, JSON-able record, plus the paper's presets."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from mice_exp.errors import UserError, expect


@dataclass(frozen=True)
class FieldConfig:
    """Defaults follow appendix D (Adam 3e-5, weight decay 7e-6, batch 1024, clip 1.0, 100 epochs,
    patience 20, m_min 20, bank 20,000) with the synthetic-preset network (h 256, L 2, d_out 64).

    ``num_threads`` caps torch's intra-op threads during fit (None leaves torch's setting alone);
    on a small, shared CPU one thread avoids oversubscription and can be many times faster.

    ``sigmas`` are bandwidths on the unit sphere phi maps to (squared distances lie in [0, 4]);
    the default grid spans the range the paper explores (Fig. 10). ``alphas`` starts at 0, i.e.
    "leave f alone", so the correction can decline when the field carries no signal.
    """

    hidden: int = 256
    n_layers: int = 2
    d_out: int = 64
    dropout: float = 0.1
    sigmas: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.5)
    lambdas: tuple[float, ...] = (1e-4, 1e-3, 1e-2)
    alphas: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
    m_min: float = 20.0
    bank_size: int = 20_000
    max_epochs: int = 100
    patience: int = 20
    batch_size: int = 1024
    lr: float = 3e-5
    weight_decay: float = 7e-6
    grad_clip: float = 1.0
    chunk_size: int = 1024
    seed: int = 0
    num_threads: int | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("sigmas", "lambdas", "alphas"):
            object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
        expect(len(self.sigmas) > 0 and min(self.sigmas) > 0, "sigmas must be a non-empty list of positive bandwidths")
        expect(len(self.lambdas) > 0 and min(self.lambdas) >= 0, "lambdas must be a non-empty list of values >= 0")
        expect(len(self.alphas) > 0 and min(self.alphas) >= 0, "alphas must be a non-empty list of values >= 0")
        for name in ("hidden", "n_layers", "d_out", "bank_size", "max_epochs", "batch_size", "chunk_size"):
            expect(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        expect(self.batch_size >= 2, "batch_size must be >= 2: leave-one-out needs a neighbour")
        expect(self.num_threads is None or self.num_threads >= 1, "num_threads must be None or >= 1")
        expect(self.patience >= 0, f"patience must be >= 0, got {self.patience}")
        expect(0 <= self.dropout < 1, f"dropout must be in [0, 1), got {self.dropout}")

    def to_dict(self) -> dict[str, Any]:
        return {name: (list(v) if isinstance(v, tuple) else v) for name, v in self.__dict__.items()}


PRESETS: dict[str, dict[str, Any]] = {
    "synthetic": {"hidden": 256, "n_layers": 2, "d_out": 64},
    "llm": {"hidden": 512, "n_layers": 2, "d_out": 128},
}


def preset_config(name: str, **overrides: Any) -> FieldConfig:
    """Appendix D.1 network sizes: "synthetic" for 2-d inputs, "llm" for last-token hidden states."""
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
    return replace(FieldConfig(**PRESETS[name]), **overrides)
