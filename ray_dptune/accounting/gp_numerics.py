"""Floating-point safety shared by the GP bounds (:mod:`.information_gain`, :mod:`.validation_release`).

A bound computed in floating point is nudged up (:func:`round_up`) so rounding can
never make it optimistic; arguments are checked before any bound is computed.
"""

from __future__ import annotations

import numpy as np

from ray_dptune import validate

__all__ = ["MAX_COUNT", "ROUND_UP", "check_count", "check_positive", "round_up"]

ROUND_UP = 1e-12  # relative margin: a bound computed in floating point is never below the exact one
MAX_COUNT = 2**53  # counts (|Λ|, T, m) stay exact doubles


def round_up(value: float) -> float:
    """``value`` nudged up by ``ROUND_UP`` (relative), so rounding cannot make a bound optimistic."""
    return float(value) * (1.0 + ROUND_UP) if value > 0 else float(value)


def check_positive(name: str, value: float) -> float:
    """A finite number > 0 given as a number (a bool or a string is refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"{name} must be a fixed positive number, got {value!r}.")  # noqa: TRY004
    return validate.finite_positive(name, value)


def check_count(name: str, value: int) -> int:
    """An int in [1, ``MAX_COUNT``]."""
    return validate.positive_int(name, value, maximum=MAX_COUNT)
