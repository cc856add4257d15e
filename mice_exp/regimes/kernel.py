"""Gaussian-kernel Nadaraya-Watson smoothing of residuals in representation space (Eq. 2).

Everything is computed from log-kernel values ``-||a - b||^2 / sigma^2``: the estimate is a
softmax-weighted average and the mass a ``logsumexp``. This is Eq. 2 exactly, but it stays
finite when every kernel value underflows (small sigma, isolated query), where the naive ratio
would be 0/0; in that limit it degrades gracefully to the nearest neighbour's residual.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Smoothed(NamedTuple):
    """Field estimate delta_hat and neighbourhood mass m = sum of kernel weights, per query."""

    delta: torch.Tensor
    mass: torch.Tensor


def log_kernel(queries: torch.Tensor, bank: torch.Tensor, sigma: float) -> torch.Tensor:
    """log K_sigma between every query and bank row (Q x N), via the squared-distance expansion.

    The expansion avoids the sqrt inside ``cdist`` whose gradient is undefined at distance zero.
    """
    sq = (queries.pow(2).sum(1, keepdim=True) + bank.pow(2).sum(1) - 2.0 * queries @ bank.T)
    return -sq.clamp_min(0.0) / sigma**2


def smooth_logits(logits: torch.Tensor, residual: torch.Tensor) -> Smoothed:
    """Nadaraya-Watson average of ``residual`` with weights ``exp(logits)`` row-wise."""
    weights = torch.softmax(logits, dim=1)
    return Smoothed(weights @ residual, torch.logsumexp(logits, dim=1).exp())


def leave_one_out(z: torch.Tensor, residual: torch.Tensor, sigma: float) -> Smoothed:
    """In-batch estimate where each point is smoothed over the *other* batch points only.

    Excluding self is what makes the training objective meaningful: with self included,
    shrinking sigma-neighbourhoods drives delta_hat(x_i) -> r_i and the objective is maximised
    by memorising Bernoulli noise. The mass therefore also excludes the self weight of 1.
    """
    logits = log_kernel(z, z, sigma)
    self_mask = torch.eye(len(z), dtype=torch.bool, device=z.device)
    return smooth_logits(logits.masked_fill(self_mask, float("-inf")), residual)


@torch.no_grad()
def smooth_against_bank(
    queries: torch.Tensor,
    bank: torch.Tensor,
    bank_residual: torch.Tensor,
    sigma: float,
    chunk_size: int = 1024,
) -> Smoothed:
    """Exact smoothing of queries against a neighbour bank, ``chunk_size`` queries at a time.

    Peak memory is O(chunk_size x bank) instead of O(queries x bank) (paper, appendix D.4).
    """
    parts = [
        smooth_logits(log_kernel(chunk, bank, sigma), bank_residual)
        for chunk in torch.split(queries, chunk_size)
    ]
    return Smoothed(torch.cat([p.delta for p in parts]), torch.cat([p.mass for p in parts]))
