"""RandomCountSearcher: Papernot & Steinke's private random search for Ray Tune."""

from __future__ import annotations

from typing import Any

import numpy as np
from ray.tune.search import Searcher

from ray_dptune.distributions import RunCountDistribution, distribution_from_dict, secure_rng
from ray_dptune.search.base import RunCountSearcher
from ray_dptune.search.space import check_space, sample_config

__all__ = ["RandomCountSearcher"]


_NO_SPACE = "RandomCountSearcher has no search space: pass `space=` to it or `param_space=` to tune.Tuner."


class RandomCountSearcher(RunCountSearcher):
    """Runs a random number K of uniformly sampled trials (Papernot & Steinke 2022).

    K is drawn once, when the searcher is built, from ``distribution`` with a
    generator seeded by the OS's secure source (or ``seed``, for tests), and is
    never drawn again: ``save``/``restore`` carry it with the generator's state,
    the space, metric and mode. Each configuration is drawn uniformly from the
    Tune space, independently of every result; after K suggestions the searcher
    returns ``FINISHED``. K = 0 (possible for Poisson) ends the search at once;
    the release is then data-independent.

    Pair it with :class:`ray_dptune.PrivacyAccountantCallback` and
    ``TuneConfig(num_samples=-1)``.

    Example:
        >>> from ray import tune
        >>> from ray_dptune import Poisson, RandomCountSearcher
        >>> searcher = RandomCountSearcher(Poisson(mean=8), metric="val_acc", mode="max")
        >>> config = tune.TuneConfig(search_alg=searcher, num_samples=-1, max_concurrent_trials=2)
    """

    density_ratio = 1.0  # non-adaptive: every draw has the prior's density

    def __init__(
        self,
        distribution: RunCountDistribution,
        metric: str | None = None,
        mode: str | None = None,
        space: dict[str, Any] | None = None,
        seed: int | None = None,
    ):
        if not isinstance(distribution, RunCountDistribution):
            raise TypeError(
                f"distribution must be a law of K such as Poisson(mean=8), got {type(distribution).__name__}."
            )
        super().__init__(metric=metric, mode=mode)
        if space is not None:
            check_space(space)
        self._space = space
        self._distribution = distribution
        self._seed = seed
        self._rng = secure_rng(seed)
        self._num_trials = distribution.sample(self._rng)
        self._suggested: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ Searcher API
    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        self.offer_space(config)
        if self._space is not None:
            return False
        check_space(config)
        self._space = config
        self._metric = self._metric or metric
        self._mode = self._mode or mode
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if len(self._suggested) >= self._num_trials:
            return Searcher.FINISHED
        if self._space is None:
            raise RuntimeError(_NO_SPACE)
        config = sample_config(self._space, self._rng)
        self._suggested[trial_id] = config
        self.record_suggestion(trial_id, config)
        return config

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """Results never change what comes next: the search is not adaptive."""

    def get_state(self) -> dict[str, Any]:
        return {
            "distribution": self._distribution.to_dict(),
            "num_trials": self._num_trials,
            "seed": self._seed,
            "rng_state": self._rng.bit_generator.state,
            "suggested": self._suggested,
            "space": self._space,
            "metric": self._metric,
            "mode": self._mode,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self._distribution = distribution_from_dict(state["distribution"])
        self._num_trials = int(state["num_trials"])
        self._seed = state["seed"]
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = state["rng_state"]
        self._suggested = dict(state["suggested"])
        self.check_restored_space(state["space"])
        self._space = state["space"]
        self._metric = state["metric"]
        self._mode = state["mode"]
