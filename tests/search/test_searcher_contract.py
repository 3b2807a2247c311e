"""The contract every DP searcher keeps, checked on each through Tune's Searcher API (no Ray cluster).

A new searcher joins by adding one :class:`Case`: how to build it on a space, and two
spaces that differ.
"""

from __future__ import annotations

import inspect
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from ray import tune
from ray.tune.search import Searcher

from ray_dptune import PointMass
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.errors import PrivacyError
from ray_dptune.search.base import PrivateSearcher, private_searcher_of
from ray_dptune.search.constant_overhead import ConstantOverheadSearcher
from ray_dptune.search.dpbo import DPBOSearcher
from ray_dptune.search.dphypo import DPHyPOSearcher
from ray_dptune.search.random_count import RandomCountSearcher
from ray_dptune.search.registry import SEARCHERS
from ray_dptune.search.subsampled import SubsampledTuningSearcher

PRIVACY_ARGUMENTS = {"epsilon", "delta", "epsilon_round", "density_ratio", "upper", "lower", "noise_multiplier"}
SPACE = {"x": tune.uniform(0.0, 1.0), "c": tune.choice(["a", "b"]), "epochs": 1}
OTHER = {"x": tune.uniform(0.0, 2.0), "c": tune.choice(["a", "b"]), "epochs": 1}


@dataclass(frozen=True)
class Case:
    """A searcher under test: ``build(seed, **kwargs)`` before Tune hands it ``space``."""

    build: Callable[..., PrivateSearcher]
    space: dict[str, Any]
    other_space: dict[str, Any]
    mode: str = "max"

    def make(self, seed: int = 0, space: dict[str, Any] | None = None) -> PrivateSearcher:
        searcher = self.build(seed)
        searcher.set_search_properties("score", self.mode, self.space if space is None else space)
        return searcher


CASES = {
    "random_count": Case(lambda seed, **kw: RandomCountSearcher(PointMass(4), seed=seed, **kw), SPACE, OTHER),
    "dphypo": Case(
        lambda seed, **kw: DPHyPOSearcher(PointMass(4), upper=2.0, lower=0.75, candidates=16, seed=seed, **kw),
        SPACE,
        OTHER,
    ),
    "dpbo": Case(
        lambda seed, **kw: DPBOSearcher(3, epsilon=1.0, delta=1e-3, num_candidates=4, seed=seed, **kw), SPACE, OTHER
    ),
    "constant_overhead": Case(
        lambda seed, **kw: ConstantOverheadSearcher(
            [{"lr": 0.1}, {"lr": 1.0}], partitions=2, epsilon_round=0.5, granularity=0.1, seed=seed, **kw
        ),
        {"epochs": 1},
        {"epochs": 2},
    ),
    "subsampled": Case(
        lambda seed, **kw: SubsampledTuningSearcher(
            PointMass(4),
            tuning_fraction=0.2,
            final_plan=TrialSpend(sample_rate=0.01, noise_multiplier=1.0, steps=100),
            final_noise_multiplier=1.0,
            seed=seed,
            **kw,
        ),
        SPACE,
        OTHER,
    ),
}


GP_CASES = {"dphypo", "dpbo"}
"""Their surrogates load torch and BoTorch: the full suite runs them, ``-m fast`` the others."""


@pytest.fixture(
    params=[pytest.param(name, marks=pytest.mark.slow) if name in GP_CASES else name for name in sorted(CASES)]
)
def case(request) -> Case:
    return CASES[request.param]


def step(searcher: PrivateSearcher, n: int) -> dict[str, Any] | str | None:
    """Suggests trial ``t{n}`` and completes it at once with a score in [0, 1]."""
    config = searcher.suggest(f"t{n}")
    if isinstance(config, dict):
        searcher.on_trial_complete(f"t{n}", result={"score": 0.2 + 0.15 * (n % 5)})
    return config


def run(searcher: PrivateSearcher, start: int = 0, limit: int = 50) -> list[dict[str, Any]]:
    configs = []
    for n in range(start, limit):
        config = step(searcher, n)
        if config == Searcher.FINISHED:
            return configs
        assert isinstance(config, dict), f"suggest returned {config!r} with no trial running"
        configs.append(config)
    raise AssertionError(f"no FINISHED after {limit} suggestions")


def test_finishes_after_exactly_num_trials(case):
    searcher = case.make()
    assert len(run(searcher)) == searcher.num_trials
    assert searcher.suggest("again") == Searcher.FINISHED


def test_every_suggestion_is_recorded_before_it_is_returned(case):
    searcher, returned, recorded = case.make(), set(), []

    def recorder(event):
        if event["type"] == "suggested":
            assert event["trial_id"] not in returned
            recorded.append(event["trial_id"])

    searcher.attach_recorder(recorder)
    for n in range(searcher.num_trials):
        assert isinstance(step(searcher, n), dict)
        returned.add(f"t{n}")
        assert recorded[-1] == f"t{n}"
    assert recorded == [f"t{n}" for n in range(searcher.num_trials)]


def test_a_restored_state_continues_identically(case):
    original = case.make(seed=0)
    half = original.num_trials // 2
    before = [step(original, n) for n in range(half)]
    restored = case.make(seed=1)
    restored.set_state(pickle.loads(pickle.dumps(original.get_state())))
    assert restored.num_trials == original.num_trials
    assert run(restored, start=half) == run(original, start=half)
    assert all(isinstance(config, dict) for config in before)


def test_a_restore_with_another_space_is_refused(case):
    state = case.make().get_state()
    with pytest.raises(PrivacyError, match="param_space that differs"):
        case.make(space=case.other_space).set_state(state)


def test_a_state_of_another_searcher_is_refused(case):
    other = CASES["random_count" if case is not CASES["random_count"] else "dpbo"]
    with pytest.raises(ValueError, match="Cannot restore"):
        case.make().set_state(other.make().get_state())


def test_the_privacy_mechanism_is_a_mechanism(case):
    assert isinstance(case.make().privacy_mechanism(), SearchMechanism)


@pytest.mark.parametrize("mode", ["maxx", "MAX", ""])
def test_a_bad_mode_is_refused_by_name(case, mode):
    with pytest.raises(ValueError, match="mode must be"):
        case.build(0, mode=mode)
    with pytest.raises(ValueError, match="mode must be"):
        case.build(0).set_search_properties("score", mode, case.space)


@pytest.mark.parametrize("metric", [3, "", ["score"]])
def test_a_bad_metric_is_refused_by_name(case, metric):
    with pytest.raises(ValueError, match="metric must be"):
        case.build(0, metric=metric)


DRIVEN_BY_A_SCHEDULER = {"HalvingSearcher"}
"""Built and driven by PrivateASHAScheduler, whose tests (tests/tune/test_private_asha.py) check its contract."""


def test_the_registry_is_every_searcher_and_what_the_package_exports():
    import ray_dptune
    import ray_dptune.search

    tested = {type(case.build(0)).__name__ for case in CASES.values()}
    assert tested | DRIVEN_BY_A_SCHEDULER == set(SEARCHERS)
    for name in SEARCHERS:
        assert name in ray_dptune.__all__ and name in ray_dptune.search.__all__
        assert (
            issubclass(getattr(ray_dptune, name), PrivateSearcher) and getattr(ray_dptune.search, name).__name__ == name
        )
    with pytest.raises(TypeError, match=", ".join(SEARCHERS)):
        private_searcher_of(object())


@pytest.mark.parametrize("name", sorted(SEARCHERS))
def test_privacy_arguments_are_keyword_only(name):
    import ray_dptune

    parameters = inspect.signature(getattr(ray_dptune, name).__init__).parameters.values()
    positional = [p.name for p in parameters if p.name in PRIVACY_ARGUMENTS and p.kind != p.KEYWORD_ONLY]
    assert positional == []
