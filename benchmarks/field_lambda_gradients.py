"""Why lambda barely changes the miscalibration field: the two terms of Eq. 4 and their gradients.

The hidden-miscalibration paper's loss is -mean(delta_hat^2) + lambda * mean(max(0, m_min - m)^2), with
m the in-batch leave-one-out neighbourhood mass. For one training batch (1,024 points of the sinusoid
A = 0.6, k = 3, seed 0) and phi at its initialisation (seed 0; appendix D's synthetic network), this
prints, at every sigma of the grid, the mass distribution, each term's value and the norm of its
gradient with respect to phi's parameters, and lambda * |grad penalty| / |grad fit| for each lambda of
the grid: where that ratio is ~0 (empty or full neighbourhoods) lambda cannot act; where it is >> 1 at
every lambda, the penalty dominates the direction and Adam's per-parameter scaling makes lambda's size
matter little; only where it crosses 1 inside the grid can lambda decide. Both with dropout active (the
mode phi is trained in, appendix D's dropout 0.1) and without.

    .venv/bin/python benchmarks/field_lambda_gradients.py > experiments/field/lambda_gradients.txt
"""

from __future__ import annotations

import numpy as np
import torch

from mice_exp.regimes.config import preset_config
from mice_exp.regimes.kernel import leave_one_out
from mice_exp.regimes.representation import Standardiser
from mice_exp.regimes.synthetic import sinusoidal
from mice_exp.regimes.training import build_phi


def terms(x: torch.Tensor, residual: torch.Tensor, sigma: float, train: bool, m_min: float):
    """Mass, the two loss terms and their gradient norms for a fresh phi (seed 0) on one batch."""
    out = []
    for which in ("fit", "penalty"):
        torch.manual_seed(0)
        phi = build_phi(x.shape[1], preset_config("synthetic")).train(train)
        torch.manual_seed(1)  # the same dropout masks for both terms
        smoothed = leave_one_out(phi(x), residual, sigma)
        loss = (-smoothed.delta.pow(2).mean() if which == "fit"
                else torch.relu(m_min - smoothed.mass).pow(2).mean())
        grads = torch.autograd.grad(loss, list(phi.parameters()), allow_unused=True)
        norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads if g is not None)))
        out.append((float(loss.detach()), norm, smoothed.mass.detach()))
    return out


def main() -> None:
    config = preset_config("synthetic")
    data = sinusoidal(seed=0)
    x, f, y = data.train.x, data.train.f, data.train.y
    batch = np.random.default_rng(0).permutation(len(x))[: config.batch_size]
    xb = Standardiser.fit(x)(x[batch])
    residual = torch.tensor(y[batch] - f[batch], dtype=torch.float32)
    print(f"sinusoid A = 0.6, k = 3, seed 0; one batch of {config.batch_size}; phi at initialisation; "
          f"m_min {config.m_min:g}; kernel exp(-d^2 / sigma^2) on the unit sphere")
    print("mode (dropout)   sigma  mass median  share m < m_min   fit term  |grad fit|   penalty/lambda  |grad pen|   "
          + "  ".join(f"ratio@{lam:g}" for lam in config.lambdas))
    for train in (True, False):
        for sigma in config.sigmas:
            (fit, g_fit, mass), (pen, g_pen, _) = terms(xb, residual, sigma, train, config.m_min)
            ratios = "  ".join(f"{lam * g_pen / max(g_fit, 1e-30):>10.2g}" for lam in config.lambdas)
            print(f"{'train (0.1)' if train else 'eval (none)':<16} {sigma:>5g}  {float(mass.median()):>11.1f}  "
                  f"{float((mass < config.m_min).float().mean()):>15.2f}  {fit:>9.4f}  {g_fit:>10.2e}   "
                  f"{pen:>14.1f}  {g_pen:>10.2e}   {ratios}")


if __name__ == "__main__":
    main()
