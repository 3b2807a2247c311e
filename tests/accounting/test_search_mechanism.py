"""SearchMechanism's own checks: a release's (ε, δ) and the curve a halving search has no selection bound for."""

import math

import pytest

from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.accounting.curves.rdp import RDPCurve


@pytest.mark.parametrize(
    "epsilon, delta", [(-0.5, 1e-6), (math.inf, 1e-6), (math.nan, 1e-6), (1.0, -1e-9), (1.0, 1.0), (1.0, 1.5)]
)
def test_a_release_outside_epsilon_ge_0_and_delta_in_0_1_is_refused(epsilon, delta):
    with pytest.raises(ValueError, match="A release needs"):
        SearchMechanism.release(epsilon=epsilon, delta=delta)


def test_the_edges_of_a_release_are_accepted():
    assert SearchMechanism.release(epsilon=0.0, delta=0.0).params["epsilon"] == 0.0


def test_a_halving_search_has_no_selection_curve_to_read():
    """Its bound is the budget of plan units in SearchAccount; a curve here would be a zero curve, an ε of 0."""
    halving = SearchMechanism.halving(budget_units=12, max_t=4)
    with pytest.raises(ValueError, match="budget of plan units"):
        halving.selection_curve(RDPCurve.gaussian(noise_multiplier=2.0))


def test_the_public_definition_keeps_the_law_and_drops_what_was_drawn_from_it():
    """K and the number of halving brackets stay with the operator (P&S App. D.1); the laws are public."""
    from ray_dptune.accounting.bounds.distributions import PointMass, Poisson

    drawn = SearchMechanism.random_count(law=Poisson(mean=4.0), num_trials=7, density_ratio=2.0).public_definition()
    assert drawn == {"kind": "random_count", "params": {"law": Poisson(mean=4.0).to_dict(), "density_ratio": 2.0}}
    brackets = SearchMechanism.halving(budget_units=6, max_t=3, law=PointMass(2), num_brackets=2).public_definition()
    assert "num_brackets" not in brackets["params"] and brackets["params"]["budget_units"] == 6


def every_kind() -> list[SearchMechanism]:
    from ray_dptune import Poisson

    return [
        SearchMechanism.random_count(law=Poisson(3.0), num_trials=4, density_ratio=2.0, upper=1.5),
        SearchMechanism.random_count(law=Poisson(3.0), num_trials=0),
        SearchMechanism.constant_overhead(epsilon_round=0.1, max_rounds=3),
        SearchMechanism.release(epsilon=1.0, delta=1e-6, description={"note": "DP-BO"}),
        SearchMechanism.composition(),
        SearchMechanism.halving(budget_units=5, max_t=3, law=Poisson(2.0), num_brackets=2),
    ]


@pytest.mark.parametrize("mechanism", every_kind(), ids=lambda m: m.kind)
def test_each_kind_is_its_own_record_and_reads_back_as_itself(mechanism):
    import json

    record = json.loads(json.dumps(mechanism.to_dict()))  # as the journal stores it
    assert SearchMechanism.from_dict(record) == mechanism and type(SearchMechanism.from_dict(record)) is type(mechanism)
    assert record == {"kind": mechanism.kind, "params": mechanism.params}
    with pytest.raises(ValueError, match="Unknown search mechanism 'bogus'"):
        SearchMechanism.from_dict({**record, "kind": "bogus"})


def test_retries_each_kind_states_before_the_search():
    reserves = {
        m.kind + str(m.cover_cap): (m.allows_retries, m.retry_reserve(2), m.retry_reserve(-1)) for m in every_kind()
    }
    assert reserves == {
        "random_count4": (False, 8, None),
        "random_count0": (False, 0, None),
        "constant_overhead1": (True, 2, None),
        "release0": (True, 0, 0),
        "composition0": (True, None, None),
        "halving0": (True, 0, 0),
    }
    assert all(m.retry_reserve(0) == 0 for m in every_kind())


def test_only_a_halving_search_refuses_reserved_re_runs():
    for mechanism in every_kind():
        mechanism.check_reserved_reruns(0)
        if mechanism.pays_by_units:
            with pytest.raises(ValueError, match="raise budget_trials instead"):
                mechanism.check_reserved_reruns(1)
        else:
            mechanism.check_reserved_reruns(2)
