"""RandomCountSearcher: Papernot & Steinke's private random search for Ray Tune."""

from __future__ import annotations

from typing import Any

from ray_dptune.accounting.bounds.distributions import RunCountDistribution
from ray_dptune.search.base import RunCountSearcher
from ray_dptune.search.space import sample_config

__all__ = ["RandomCountSearcher"]


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
        super().__init__(metric=metric, mode=mode, seed=seed)
        self._draw_count(distribution)
        if space is not None:
            self._set_space(space)

    def _propose(self, trial_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
        assert self._space is not None  # suggest() refuses to propose without a space
        config = sample_config(self._space, self._rng)
        return config, config

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        """Results never change what comes next: the search is not adaptive."""
