"""What every DP searcher shares: K drawn once, declared to the accountant, pickled state."""

from __future__ import annotations

import logging
import pickle
from typing import Any

from ray.tune.search import Searcher

from ray_dptune.distributions import RunCountDistribution
from ray_dptune.errors import PrivacyError

__all__ = ["PrivateSearcher", "refuse_truncation"]

logger = logging.getLogger(__name__)


def refuse_truncation(num_samples: Any, planned_trials: int) -> None:
    """Raises PrivacyError when Tune would stop before all K trials (Ray caps at num_samples)."""
    if num_samples is not None and 0 <= int(num_samples) < planned_trials:
        raise PrivacyError(
            f"num_samples={num_samples} would silently stop the search before its random number of "
            "trials K, which changes the law the privacy guarantee assumes. Use "
            "tune.TuneConfig(num_samples=-1): the searcher ends the search by itself."
        )


class PrivateSearcher(Searcher):
    """A Tune searcher whose number of trials K was drawn once from a law.

    Subclasses set ``_distribution``, ``_num_trials`` and ``_seed`` in ``__init__``,
    a ``density_ratio`` (C/c; 1 when not adaptive), and ``get_state``/``set_state``;
    :class:`~ray_dptune.PrivacyAccountantCallback` reads the rest from here.
    """

    _distribution: RunCountDistribution
    _num_trials: int
    _seed: int | None

    @property
    def distribution(self) -> RunCountDistribution:
        """The law K was drawn from."""
        return self._distribution

    @property
    def num_trials(self) -> int:
        """K: how many trials this search runs."""
        return self._num_trials

    @property
    def seed(self) -> int | None:
        """The explicit seed, or None when K and the draws came from the secure source."""
        return self._seed

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as file:
            pickle.dump(self.get_state(), file)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as file:
            self.set_state(pickle.load(file))
        logger.info("Restored %s: K = %d.", type(self).__name__, self._num_trials)
