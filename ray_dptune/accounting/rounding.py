"""Rounding that keeps a bound computed in floating point on the safe side (the GP bounds of DP-BO).

A bound is nudged up (:func:`round_up`) so that rounding can never make it optimistic.
"""

from __future__ import annotations

__all__ = ["ROUND_UP", "round_up"]

ROUND_UP = 1e-12  # relative margin: a bound computed in floating point is never below the exact one


def round_up(value: float) -> float:
    """``value`` nudged up by ``ROUND_UP`` (relative), so rounding cannot make a bound optimistic."""
    return float(value) * (1.0 + ROUND_UP) if value > 0 else float(value)
