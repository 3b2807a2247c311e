"""Argument checks shared by the math: each returns the cleaned value or raises ValueError.

Every message names the argument and its valid range, e.g.
``delta must be > 0 and < 1 (a probability), got 1.5.`` or
``steps must be a non-negative integer with steps >= 0, got -1.`` Bounds print with ``:g`` (1e6 reads ``1e+06``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "MAX_EXACT_COUNT",
    "count",
    "finite",
    "finite_array",
    "finite_positive",
    "fixed_positive",
    "in_range",
    "integer",
    "non_negative",
    "not_nan",
    "number",
    "positive_int",
    "probability",
    "unit_interval",
]


def number(name: str, value: Any) -> float:
    """``value`` as a float (NaN and ±inf included); anything float() refuses raises ValueError."""
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError) as error:
        raise ValueError(f"{name} must be a real number, got {value!r}.") from error


def finite(name: str, value: Any) -> float:
    """``value`` as a finite float."""
    result = number(name, value)
    if not math.isfinite(result):
        raise ValueError(f"{name} must be a finite number, got {result}.")
    return result


def in_range(
    name: str,
    value: Any,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    open_left: bool = False,
    open_right: bool = False,
    note: str = "",
) -> float:
    """``value`` as a finite float with low <(=) value <(=) high; ``note`` (e.g. a citation) ends the message."""
    result = number(name, value)
    bounds = _bounds(low, high, open_left, open_right)
    if not math.isfinite(result):
        raise ValueError(f"{name} must be a finite number{' ' if bounds else ''}{bounds}{note}, got {result}.")
    too_low = result <= low if open_left else result < low
    too_high = result >= high if open_right else result > high
    if too_low or too_high:
        raise ValueError(f"{name} must be {bounds}{note}, got {result}.")
    return result


def _bounds(low: float, high: float, open_left: bool, open_right: bool) -> str:
    parts = []
    if low > -math.inf:
        parts.append(f"{'>' if open_left else '>='} {low:g}")
    if high < math.inf:
        parts.append(f"{'<' if open_right else '<='} {high:g}")
    return " and ".join(parts)


def finite_positive(name: str, value: Any, *, maximum: float = math.inf) -> float:
    """A finite float > 0 (and <= ``maximum``)."""
    result = number(name, value)
    if not (math.isfinite(result) and 0.0 < result <= maximum):
        raise ValueError(f"{name} must be a finite number > 0{_upper(maximum)}, got {result}.")
    return result


def fixed_positive(name: str, value: Any) -> float:
    """A finite number > 0 given as a number: a bool, a string or a Tune domain is refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"{name} must be a fixed positive number, got {value!r}.")  # noqa: TRY004
    return finite_positive(name, value)


MAX_EXACT_COUNT = 2**53
"""The largest count (|Λ|, T, m) a double holds exactly."""


def count(name: str, value: Any) -> int:
    """An int in [1, ``MAX_EXACT_COUNT``]."""
    return positive_int(name, value, maximum=MAX_EXACT_COUNT)


def non_negative(name: str, value: Any) -> float:
    """A finite float >= 0."""
    result = number(name, value)
    if not (math.isfinite(result) and result >= 0.0):
        raise ValueError(f"{name} must be a finite number >= 0, got {result}.")
    return result


def _upper(maximum: float) -> str:
    return "" if maximum == math.inf else f" and <= {maximum:g}"


def probability(name: str, value: Any, *, open_left: bool = False, open_right: bool = False) -> float:
    """A probability: in [0, 1], with either end excluded on request."""
    return in_range(name, value, 0.0, 1.0, open_left=open_left, open_right=open_right, note=" (a probability)")


def integer(name: str, value: Any, *, minimum: int = 0, maximum: int | None = None, whole_floats: bool = False) -> int:
    """An int in [minimum, maximum]; a float that is a whole number is accepted only with ``whole_floats``."""
    exact_int = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    whole_float = (
        whole_floats and isinstance(value, (float, np.floating)) and math.isfinite(value) and value == int(value)
    )
    if exact_int or whole_float:
        result = int(value)
    else:
        result = None
    if result is None or result < minimum or (maximum is not None and result > maximum):
        kind = "a non-negative integer" if minimum == 0 else "an integer"
        top = "" if maximum is None else f" and {name} <= {maximum}"
        raise ValueError(f"{name} must be {kind} with {name} >= {minimum}{top}, got {value!r}.")
    return result


def positive_int(name: str, value: Any, *, maximum: int | None = None) -> int:
    """An int >= 1 (and <= ``maximum``)."""
    return integer(name, value, minimum=1, maximum=maximum)


def not_nan(name: str, values: Any) -> np.ndarray:
    """``values`` as a float array with no NaN (±inf allowed)."""
    array = _float_array(name, values)
    if np.any(np.isnan(array)):
        raise ValueError(f"{name} must not be NaN, got {values!r}.")
    return array


def _float_array(name: str, values: Any) -> np.ndarray:
    try:
        return np.asarray(values, dtype=float)
    except (TypeError, ValueError, OverflowError) as error:
        raise ValueError(f"{name} must be real numbers, got {values!r}.") from error


def finite_array(name: str, values: Any) -> np.ndarray:
    """``values`` as a float array of finite numbers."""
    array = not_nan(name, values)
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must hold finite numbers only, got {values!r}.")
    return array


def unit_interval(name: str, values: Any) -> np.ndarray:
    """``values`` as a float array with every entry in [0, 1] (NaN refused)."""
    array = _float_array(name, values)
    if not np.all((array >= 0.0) & (array <= 1.0)):
        raise ValueError(f"{name} must lie in [0, 1], got {values!r}.")
    return array
