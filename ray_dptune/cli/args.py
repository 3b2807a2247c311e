"""Argument types and shared option defaults of the ``ray-dptune`` command line.

Each type parses one option's text or raises ``argparse.ArgumentTypeError`` naming the
problem, which argparse prints as ``ray-dptune COMMAND: error: argument --OPTION: ...``
with exit status 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from ray_dptune.cli.planning import LawSpec

__all__ = [
    "DEFAULT_MEAN",
    "LAW_CHOICES",
    "PROG",
    "bounded_float",
    "count",
    "finite_float",
    "law_spec",
    "non_negative_count",
    "open_unit_float",
    "positive_float",
    "probability",
    "sample_rate",
    "whole_number",
]

PROG = "ray-dptune"
DEFAULT_MEAN = 10.0
LAW_CHOICES = (
    "poisson, logarithmic, geometric, tnb:ETA (truncated negative binomial with shape ETA > -1, e.g. tnb:0.5), "
    "or point (K = MEAN runs always, a whole number)"
)
"""The laws ``--law`` takes (:meth:`LawSpec.parse`), for help texts."""


def finite_float(text: str) -> float:
    """Type of an option that takes a finite number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def bounded_float(check: Callable[[float], bool], message: str) -> Callable[[str], float]:
    """Type of an option that takes a finite number with ``check(value)``, else ``message``."""

    def parse(text: str) -> float:
        value = finite_float(text)
        if not check(value):
            raise argparse.ArgumentTypeError(f"{message}, got {text}")
        return value

    return parse


positive_float = bounded_float(lambda v: v > 0, "must be > 0")
open_unit_float = bounded_float(lambda v: 0.0 < v < 1.0, "must lie strictly between 0 and 1")  # δ
probability = bounded_float(lambda v: 0.0 <= v <= 1.0, "must be a probability in [0, 1]")
sample_rate = bounded_float(lambda v: 0.0 < v <= 1.0, "must lie in (0, 1]")


def whole_number(minimum: int) -> Callable[[str], int]:
    """Type of an option that takes a whole number >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {text}")
        return value

    return parse


count = whole_number(1)
non_negative_count = whole_number(0)


def law_spec(text: str) -> LawSpec:
    """Type of ``--law`` (:meth:`LawSpec.parse`)."""
    try:
        return LawSpec.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
