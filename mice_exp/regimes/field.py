"""The miscalibration field estimator: grid-searched phi, training-bank smoothing, local correction."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from mice_exp.errors import expect
from mice_exp.regimes.config import FieldConfig, preset_config
from mice_exp.regimes.correction import range_aware_correction, select_alpha
from mice_exp.regimes.data import Triples
from mice_exp.regimes.kernel import Smoothed, smooth_against_bank
from mice_exp.regimes.representation import Standardiser
from mice_exp.regimes.training import Split, build_phi, torch_threads, train_phi


class MiscalibrationField:
    """Estimates delta(x) = E[y - f | x] by kernel smoothing training residuals in a learned space.

    ``fit`` trains one phi per (sigma, lambda) in the grid with the leave-one-out loss of Eq. 4
    (a point's own residual never enters its own training-time estimate, see ``kernel``), keeps
    the pair with the lowest corrected validation Brier score, then picks the correction scale
    alpha on the same validation split. Queries are always smoothed against a uniformly sampled
    bank of training points, so validation and test labels never shape a neighbourhood.

    Construct with a :class:`FieldConfig` and/or keyword overrides of its fields, e.g.
    ``MiscalibrationField(sigmas=(0.1, 0.2), max_epochs=30, progress=False)``.
    """

    def __init__(self, config: FieldConfig | None = None, **overrides: Any):
        self.config = replace(config or FieldConfig(), **overrides)
        self.history_: list[dict[str, float]] = []

    def clone(self, **overrides: Any) -> MiscalibrationField:
        """An unfitted estimator with the same settings, e.g. another seed for a stability audit."""
        return MiscalibrationField(self.config, **overrides)

    def fit(
        self, x: np.ndarray, f: np.ndarray, y: np.ndarray,
        x_val: np.ndarray, f_val: np.ndarray, y_val: np.ndarray,
    ) -> MiscalibrationField:
        """Learn phi on (x, f, y) and select sigma, lambda and alpha on (x_val, f_val, y_val)."""
        with torch_threads(self.config.num_threads):
            return self._fit(Triples(x, f, y), Triples(x_val, f_val, y_val))

    def _fit(self, train: Triples, val: Triples) -> MiscalibrationField:
        expect(train.x.shape[1] == val.x.shape[1],
               f"train and validation x have different widths: {train.x.shape[1]} vs {val.x.shape[1]}")
        self.standardiser_ = Standardiser.fit(train.x)
        train_split = Split(self.standardiser_(train.x), train.f, train.y)
        val_split = Split(self.standardiser_(val.x), val.f, val.y)
        bank_index = self._bank_index(len(train))
        bank_split = Split(train_split.x[bank_index], train.f[bank_index], train.y[bank_index])

        grid = list(itertools.product(self.config.sigmas, self.config.lambdas))
        candidates = []
        for sigma, lam in tqdm(grid, desc="sigma x lambda grid", disable=not self.config.progress):
            candidates.append(train_phi(self.config, sigma, lam, train_split, bank_split, val_split))
        self.history_ = [
            {"sigma": c.sigma, "lambda": c.lam, "val_proxy": c.proxy, "best_epoch": c.best_epoch,
             "epochs": c.epochs, "seconds": c.seconds}
            for c in candidates
        ]
        best = min(candidates, key=lambda c: c.proxy)
        self.sigma_, self.lambda_, self.val_proxy_ = best.sigma, best.lam, best.proxy

        self.phi_ = build_phi(train.x.shape[1], self.config)
        self.phi_.load_state_dict(best.state)
        self.phi_.eval()
        self.bank_z_ = self.phi_.embed(bank_split.x)
        self.bank_r_ = bank_split.residual
        self.alpha_ = select_alpha(val.f, val.y, self.field(val.x), self.config.alphas)
        return self

    def field(self, x: np.ndarray) -> np.ndarray:
        """delta_hat(x): < 0 where the model is locally overconfident, > 0 where underconfident.

        Meant for held-out points: a training point that sits in the bank counts its own residual.
        """
        return self._smooth(x).delta.double().numpy()

    def mass(self, x: np.ndarray) -> np.ndarray:
        """Neighbourhood mass against the bank; small values flag estimates resting on few points."""
        return self._smooth(x).mass.double().numpy()

    def correct(self, x: np.ndarray, f: np.ndarray) -> np.ndarray:
        """Locally corrected confidence (Eq. 5) with the validation-selected alpha; always in [0, 1]."""
        queries = Triples(x, f, np.zeros(len(f)))
        return range_aware_correction(queries.f, self.field(queries.x), self.alpha_)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors only (phi weights, bank, standardisation): storable with safetensors, no pickle."""
        self._check_fitted()
        return {
            **{f"phi.{k}": v for k, v in self.phi_.state_dict().items()},
            "bank_z": self.bank_z_,
            "bank_r": self.bank_r_,
            "x_mean": torch.from_numpy(self.standardiser_.mean),
            "x_scale": torch.from_numpy(self.standardiser_.scale),
        }

    def metadata(self) -> dict[str, Any]:
        """JSON-able settings, selected hyperparameters and grid history that complete ``state_dict``."""
        self._check_fitted()
        selected = {"sigma": self.sigma_, "lambda": self.lambda_, "alpha": self.alpha_, "val_proxy": self.val_proxy_}
        return {"config": self.config.to_dict(), "selected": selected, "history": self.history_}

    @classmethod
    def from_state(cls, tensors: dict[str, torch.Tensor], metadata: dict[str, Any]) -> MiscalibrationField:
        model = cls(FieldConfig(**metadata["config"]))
        selected = metadata["selected"]
        model.sigma_, model.lambda_ = selected["sigma"], selected["lambda"]
        model.alpha_, model.val_proxy_ = selected["alpha"], selected["val_proxy"]
        model.history_ = list(metadata["history"])
        model.standardiser_ = Standardiser(tensors["x_mean"].numpy(), tensors["x_scale"].numpy())
        model.phi_ = build_phi(len(model.standardiser_.mean), model.config)
        model.phi_.load_state_dict({k[len("phi."):]: v for k, v in tensors.items() if k.startswith("phi.")})
        model.phi_.eval()
        model.bank_z_, model.bank_r_ = tensors["bank_z"], tensors["bank_r"]
        return model

    def _bank_index(self, n: int) -> np.ndarray:
        """Uniform sample without replacement, capped at bank_size: keeps the training distribution."""
        if n <= self.config.bank_size:
            return np.arange(n)
        rng = np.random.default_rng(self.config.seed)
        return np.sort(rng.choice(n, self.config.bank_size, replace=False))

    def _smooth(self, x: np.ndarray) -> Smoothed:
        self._check_fitted()
        x = np.asarray(x, dtype=np.float32)
        expect(x.ndim == 2 and x.shape[1] == len(self.standardiser_.mean),
               f"x must have shape (n, {len(self.standardiser_.mean)}), got {x.shape}")
        queries = self.phi_.embed(self.standardiser_(x))
        return smooth_against_bank(queries, self.bank_z_, self.bank_r_, self.sigma_, self.config.chunk_size)

    def _check_fitted(self) -> None:
        expect(hasattr(self, "phi_"), "MiscalibrationField is not fitted yet; call fit(...) first")


def preset(name: str, **overrides: Any) -> MiscalibrationField:
    """An unfitted estimator with the paper's "synthetic" or "llm" network sizes."""
    return MiscalibrationField(preset_config(name, **overrides))
