"""Fit phi for one (sigma, lambda): minibatch Eq. 4, early stopping on the validation proxy."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from mice_exp.regimes.config import FieldConfig
from mice_exp.regimes.kernel import leave_one_out, smooth_against_bank
from mice_exp.regimes.objective import corrected_brier, discovery_loss
from mice_exp.regimes.representation import Phi


@dataclass(frozen=True)
class Split:
    """Standardised inputs as a tensor next to f and y, ready for repeated evaluation."""

    x: torch.Tensor
    f: np.ndarray
    y: np.ndarray

    @property
    def residual(self) -> torch.Tensor:
        return torch.from_numpy((self.y - self.f).astype(np.float32))


@dataclass(frozen=True)
class Candidate:
    """One trained phi: its best validation proxy, the weights that achieved it, and its cost."""

    sigma: float
    lam: float
    proxy: float
    best_epoch: int
    epochs: int
    seconds: float
    state: dict[str, torch.Tensor]


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Temporarily cap torch's intra-op threads; ``None`` changes nothing."""
    if n is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def build_phi(d_in: int, config: FieldConfig) -> Phi:
    """An untrained phi shaped by the config (also used to rebuild one from a state dict)."""
    return Phi(d_in, config.hidden, config.n_layers, config.d_out, config.dropout)


def validation_proxy(phi: Phi, bank: Split, val: Split, sigma: float, chunk_size: int) -> float:
    """Corrected Brier on validation, always smoothing against the training bank (never val labels)."""
    smoothed = smooth_against_bank(phi.embed(val.x), phi.embed(bank.x), bank.residual, sigma, chunk_size)
    return corrected_brier(val.f, val.y, smoothed.delta.double().numpy())


def train_phi(config: FieldConfig, sigma: float, lam: float, train: Split, bank: Split, val: Split) -> Candidate:
    """Train from the config seed; the RNG is forked so callers' global torch state is untouched.

    Epoch 0 is the untrained network, so a run that never beats its initial geometry keeps it.
    Batches are near-equal splits of a fresh permutation, so no batch is too small for Eq. 4.
    """
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        phi = build_phi(train.x.shape[1], config)
        optimiser = torch.optim.Adam(phi.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        residual = train.residual
        n_batches = max(1, math.ceil(len(residual) / config.batch_size))
        best = validation_proxy(phi, bank, val, sigma, config.chunk_size)
        best_state, best_epoch, epoch = copy.deepcopy(phi.state_dict()), 0, 0
        epochs = tqdm(range(1, config.max_epochs + 1), desc=f"sigma={sigma:g} lambda={lam:g}",
                      leave=False, disable=not config.progress)
        for epoch in epochs:
            phi.train()
            for index in torch.tensor_split(torch.randperm(len(residual)), n_batches):
                loss = discovery_loss(leave_one_out(phi(train.x[index]), residual[index], sigma), lam, config.m_min)
                optimiser.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(phi.parameters(), config.grad_clip)
                optimiser.step()
            proxy = validation_proxy(phi, bank, val, sigma, config.chunk_size)
            epochs.set_postfix(proxy=f"{proxy:.5f}", best=f"{best:.5f}")
            if proxy < best:
                best, best_state, best_epoch = proxy, copy.deepcopy(phi.state_dict()), epoch
            elif epoch - best_epoch >= config.patience:
                break
        return Candidate(sigma, lam, best, best_epoch, epoch, time.perf_counter() - start, best_state)
