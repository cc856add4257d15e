"""Which layers a feature view uses: shared by every view so ablations mean the same thing."""

from __future__ import annotations

from typing import Sequence

from mice_exp.errors import UserError

NAMED = ("all", "none", "first_half", "second_half", "early", "mid", "late")


def select_layers(spec: str | Sequence[int], layers: Sequence[int], n_layers: int) -> list[int]:
    """Layer numbers (1-based, out of ``n_layers``) kept from ``layers`` by ``spec``.

    Halves and thirds are by depth: first_half keeps layers i <= L/2, early i <= L/3,
    mid L/3 < i <= 2L/3, late i > 2L/3; a list keeps exactly those layers.
    """
    if isinstance(spec, str):
        bounds = {"all": (0, n_layers), "none": (0, 0), "first_half": (0, n_layers / 2),
                  "second_half": (n_layers / 2, n_layers), "early": (0, n_layers / 3),
                  "mid": (n_layers / 3, 2 * n_layers / 3), "late": (2 * n_layers / 3, n_layers)}
        lo, hi = bounds[spec]
        return [i for i in layers if lo < i <= hi]
    unknown = [i for i in spec if i not in layers]
    if unknown:
        raise UserError(f"features.layers lists {unknown}; this view has layers {layers[0]}..{layers[-1]}")
    return list(spec)
