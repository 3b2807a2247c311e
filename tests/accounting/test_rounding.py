"""round_up: the margin that keeps a bound computed in floating point on the safe side."""

import math

import pytest

from ray_dptune.accounting.bounds.rounding import ROUND_UP, round_up


@pytest.mark.parametrize("value", [1e-300, 0.25, 1.0, 3.0, 1e200])
def test_a_positive_bound_is_nudged_up_by_the_margin(value):
    assert round_up(value) > value
    assert round_up(value) == pytest.approx(value * (1 + ROUND_UP), rel=1e-15)


@pytest.mark.parametrize("value", [0.0, -2.0, math.inf])
def test_zero_negative_and_infinite_values_are_kept(value):
    assert round_up(value) == value
