"""What every DP searcher declares to the accountant, and the random-count family's shared base."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from ray.tune.search import Searcher

from ray_dptune.accounting.account import Mechanism
from ray_dptune.distributions import RunCountDistribution
from ray_dptune.errors import PrivacyError
from ray_dptune.search.space import space_fingerprint

__all__ = ["PrivateSearcher", "RunCountSearcher", "refuse_truncation"]

logger = logging.getLogger(__name__)


def refuse_truncation(num_samples: Any, planned_trials: int) -> None:
    """Raises PrivacyError when Tune would stop before all planned trials (Ray caps at num_samples)."""
    if num_samples is not None and 0 <= int(num_samples) < planned_trials:
        raise PrivacyError(
            f"num_samples={num_samples} would silently stop the search before its {planned_trials} planned "
            "trials, which changes the algorithm the privacy guarantee is proven for. Use "
            "tune.TuneConfig(num_samples=-1): the searcher ends the search by itself. (Right after "
            "tune.Tuner.restore, this means Tune could not restore the run and restarted it: see its "
            "'Failed to restore the run state' log line.)"
        )


class PrivateSearcher(Searcher):
    """A Tune searcher that declares to :class:`~ray_dptune.PrivacyAccountantCallback` how it is accounted.

    The accountant asks each searcher:

    * :meth:`privacy_mechanism`: how the whole search is bounded (a
      :class:`~ray_dptune.accounting.account.Mechanism`); the account turns it, the plan
      and every attempt into the guarantee — no searcher computes one itself.
    * :meth:`accounts_trial`: must this trial report ``dp_plan``/``dp_spent``? Such trials
      all satisfy one plan (an RDP curve) that the callback learns and enforces.

    Write-ahead: the callback attaches a recorder (:meth:`attach_recorder`); a searcher
    calls :meth:`record_suggestion` before it returns a configuration, and
    :meth:`record_event` before any data-dependent step of its own (a selection, a
    release) can leave the driver.

    :attr:`threat_model` says, in the report, what is protected and under which assumption,
    :attr:`coverage` which outputs the guarantee covers; :meth:`privacy_details` adds the
    searcher's own facts (rounds used, ...) and names the output: ``"released_trial_id"``
    (the trial whose config, score and checkpoint are released) or ``"release"`` (a
    ``{"config", "score"}`` the searcher released itself); without either, the output
    is the best trial.
    Subclasses set ``_num_trials`` (the most trials the search will start) and ``_seed``,
    and implement ``get_state``/``set_state``.
    """

    threat_model: ClassVar[str]
    coverage: ClassVar[str]
    configs_public: ClassVar[bool] = True
    """False when trial configurations depend on non-released results (adaptive searchers):
    the privacy report then withholds them."""
    _num_trials: int
    _seed: int | None

    @property
    def num_trials(self) -> int:
        """How many trials this search starts (Tune's ``num_samples`` must not cut it)."""
        return self._num_trials

    @property
    def seed(self) -> int | None:
        """The explicit seed, or None when the draws came from the secure source."""
        return self._seed

    def accounts_trial(self, config: dict[str, Any]) -> bool:
        """True when the trial with ``config`` must report and satisfy the search's plan."""
        return True

    def privacy_mechanism(self) -> Mechanism:
        """How the whole search is bounded (read by the account)."""
        raise NotImplementedError(f"{type(self).__name__} does not declare its privacy mechanism.")

    def offer_space(self, config: Mapping[str, Any] | None) -> None:
        """Remembers the space Tune passes (also on ``Tuner.restore(..., param_space=...)``)."""
        self._offered_space = config

    def check_restored_space(self, restored: Mapping[str, Any] | None) -> None:
        """Raises PrivacyError when ``Tuner.restore`` was given another space than the search's own."""
        offered = getattr(self, "_offered_space", None)
        if offered and restored is not None and space_fingerprint(offered) != space_fingerprint(restored):
            # Tune logs a failed restore and restarts the experiment: the accountant raises this again.
            self._restore_refusal = PrivacyError(
                "tune.Tuner.restore was given a param_space that differs from the one this search started "
                "with; a restored search must draw from the same space (its trials so far were drawn from the "
                "original). Restore with the original param_space, or start a new search."
            )
            raise self._restore_refusal

    @property
    def restore_refusal(self) -> PrivacyError | None:
        """Why the last restore was refused (Tune swallows the error and restarts the experiment)."""
        return getattr(self, "_restore_refusal", None)

    def attach_recorder(self, recorder: Callable[[Mapping[str, Any]], None] | None) -> None:
        """Sets where this searcher's write-ahead events go (the accountant callback's journal)."""
        self._recorder = recorder

    def record_event(self, event: Mapping[str, Any]) -> None:
        """Records an event durably before its effect can leave the driver (no-op without a recorder)."""
        recorder = getattr(self, "_recorder", None)
        if recorder is not None:
            recorder(event)

    def record_suggestion(self, trial_id: str, config: Mapping[str, Any]) -> None:
        """Records that ``trial_id`` was suggested (charged until its fate is known)."""
        self.record_event({"type": "suggested", "trial_id": trial_id, "accounted": bool(self.accounts_trial(config))})

    def privacy_details(self) -> dict[str, Any]:
        """Searcher-specific facts for the privacy report (JSON-serialisable)."""
        return {}

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as file:
            pickle.dump(self.get_state(), file)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as file:
            self.set_state(pickle.load(file))
        logger.info("Restored %s: %d planned trials.", type(self).__name__, self._num_trials)


class RunCountSearcher(PrivateSearcher):
    """A searcher that runs a random number K of DP trials, K drawn once from a law.

    Accounted by ``repeat_and_select(plan, law, density_ratio)`` (Papernot & Steinke
    2022, Thms 2/6; DP-HyPO Thm 1 when ``density_ratio`` = C/c > 1). Subclasses set
    ``_distribution`` and a ``density_ratio`` (1 when not adaptive).
    """

    threat_model = (
        "training set: every trial runs DP-SGD within one plan and only the best trial is released "
        "(validation scores are public unless the plan includes their noise)"
    )
    coverage = (
        "The guarantee covers the released output only: the selected (best) trial's configuration, "
        "score and checkpoint, as returned by ray_dptune.release_best. Ray keeps every trial's results "
        "and checkpoints on disk, and this report lists every trial's configuration for the operator; "
        "those are not covered (release_best(..., purge=True) deletes the trials' folders)."
    )
    _distribution: RunCountDistribution
    density_ratio: float

    @property
    def distribution(self) -> RunCountDistribution:
        """The law K was drawn from."""
        return self._distribution

    def privacy_mechanism(self) -> Mechanism:
        """K ~ law runs, best released: P&S Thm 2/6, DP-HyPO Thm 1 when ``density_ratio`` > 1."""
        return Mechanism.random_count(law=self._distribution, num_trials=self._num_trials, density_ratio=self.density_ratio)
