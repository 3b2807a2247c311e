"""The skeleton every DP searcher shares, and what it declares to the accountant.

:class:`PrivateSearcher` keeps the bookkeeping common to all: the seed and the one
generator every draw comes from, the space, metric and mode, the suggested trials
and their number K, save/restore of those, and the write-ahead record of each
suggestion. A searcher adds only its own decisions (:meth:`PrivateSearcher._propose`)
and state (``_extra_state``/``_restore_extra``).
"""

from __future__ import annotations

import copy
import logging
import pickle
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
from ray.tune.search import Searcher

from ray_dptune.accounting.bookkeeping.account import SearchAccount
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.accounting.bounds.distributions import RunCountDistribution, distribution_from_dict, secure_rng
from ray_dptune.errors import PrivacyError
from ray_dptune.search.registry import searcher_names
from ray_dptune.search.space import check_space, space_fingerprint

__all__ = ["PrivateSearcher", "RunCountSearcher", "private_searcher_of", "refuse_truncation"]

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


def private_searcher_of(search_alg: Any) -> PrivateSearcher:
    """The DP searcher inside ``search_alg``: itself, or the one a ``ConcurrencyLimiter`` wraps.

    A ``ConcurrencyLimiter`` only holds back suggestions, which changes no trial's
    mechanism. Any other wrapper is refused: ``Repeater`` runs each configuration
    several times and reports their mean (a different base mechanism than the plan's),
    and an unknown one may change which trials run.

    Raises:
        PrivacyError: another wrapper, or no DP searcher inside.
        TypeError: not a Tune searcher at all.
    """
    from ray.tune.search import ConcurrencyLimiter

    inner = search_alg
    while isinstance(inner, ConcurrencyLimiter):
        inner = inner.searcher
    if isinstance(inner, PrivateSearcher):
        return inner
    if isinstance(inner, Searcher) and isinstance(getattr(inner, "searcher", None), Searcher):
        raise PrivacyError(
            f"{type(inner).__name__} wraps the DP searcher and changes the mechanism its bound is proven for "
            "(Repeater runs every configuration several times and reports the mean). Only ConcurrencyLimiter "
            "may wrap a ray_dptune searcher; for repeated runs, make each trial's plan cover them."
        )
    raise TypeError(
        f"searcher must be a ray_dptune DP searcher ({searcher_names()}; a HalvingSearcher is a PrivateASHAScheduler's), "
        f"possibly in a ConcurrencyLimiter; got {type(inner).__name__}."
    )


class PrivateSearcher(Searcher):
    """A Tune searcher that declares to :class:`~ray_dptune.PrivacyAccountantCallback` how it is accounted.

    The accountant asks each searcher:

    * :meth:`privacy_mechanism`: how the whole search is bounded (a
      :class:`~ray_dptune.accounting.bookkeeping.search_mechanism.SearchMechanism`); the account turns it, the plan
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

    A subclass sets ``_num_trials`` (the most trials the search will start), implements
    :meth:`_propose` and, when it has more state, ``_extra_state``/``_restore_extra``;
    ``_set_space`` when adopting a space needs more than remembering it.

    Args:
        metric: the score Tune reports (or None, to take ``tune.TuneConfig``'s).
        mode: one of :attr:`modes` (or None, to take ``tune.TuneConfig``'s).
        seed: for tests and reproducibility; None draws 128 bits from the OS's secure source.
    """

    threat_model: ClassVar[str]
    coverage: str
    configs_public: ClassVar[bool] = True
    """False when trial configurations depend on non-released results (adaptive searchers):
    the privacy report then withholds them."""
    modes: ClassVar[tuple[str, ...]] = ("max", "min")
    """The modes this search accepts."""
    needs_space: ClassVar[bool] = True
    """False when the searcher brings its own candidates and Tune's param_space only adds constants."""
    needs_metric: ClassVar[bool] = False
    """True for adaptive searchers: they cannot suggest without a metric and a mode."""
    accepts_plan_for: ClassVar[bool] = True
    """False when only a ``dp_trainable`` can plan its trials (:meth:`planned_spaces` set their privacy parameters)."""

    def __init__(self, *, metric: str | None = None, mode: str | None = None, seed: int | None = None):
        if metric is not None and (not isinstance(metric, str) or not metric):
            raise ValueError(f"metric must be a non-empty str (the reported score's key) or None, got {metric!r}.")
        self._check_mode(mode)
        super().__init__(metric=metric, mode=mode)
        self._seed = seed
        self._rng = secure_rng(seed)
        self._space: dict[str, Any] | None = None
        self._suggested: dict[str, Any] = {}
        self._num_trials = 0
        self._held = False

    @property
    def num_trials(self) -> int:
        """How many trials this search starts (Tune's ``num_samples`` must not cut it)."""
        return self._num_trials

    @property
    def finished(self) -> bool:
        """True once the search has suggested every trial it will run (K for a random count)."""
        return self._done()

    @property
    def seed(self) -> int | None:
        """The explicit seed, or None when the draws came from the secure source."""
        return self._seed

    @property
    def reported_seed(self) -> int | str:
        """What the privacy report says of the seed: it, or where the draws came from."""
        return self._seed if self._seed is not None else "secure (operating system)"

    def accounts_trial(self, config: Mapping[str, Any]) -> bool:
        """True when the trial with ``config`` must report and satisfy the search's plan."""
        return True

    def final_trial(self, config: Mapping[str, Any]) -> bool:
        """True when the trial with ``config`` is a subsampled tuning's final run on all the data (its own plan)."""
        return False

    def privacy_mechanism(self) -> SearchMechanism:
        """How the whole search is bounded (read by the account)."""
        raise NotImplementedError(f"{type(self).__name__} does not declare its privacy mechanism.")

    def planned_spaces(self, param_space: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The spaces whose every trial one plan must cover: Tune's space, for a searcher that draws from it."""
        return [dict(param_space)]

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

    def hold(self) -> None:
        """Suggests nothing more in this run (the search is stopping; the trials already started may end)."""
        self._held = True

    def attach_recorder(self, recorder: Callable[[Mapping[str, Any]], None] | None) -> None:
        """Sets where this searcher's write-ahead events go (the accountant callback's journal)."""
        self._recorder = recorder

    def attach_account(self, account: Callable[[], SearchAccount] | None) -> None:
        """Lets the searcher read the account it records into (the callback's, also after a restore)."""
        self._account = account

    @property
    def has_account(self) -> bool:
        """True once a callback has attached its account (:meth:`attach_account`)."""
        return getattr(self, "_account", None) is not None

    def account(self) -> SearchAccount:
        """The search's account (a searcher that spends a budget reads what is left there)."""
        if not self.has_account:
            raise RuntimeError(
                f"{type(self).__name__} reads the search's privacy account: pass it to "
                "ray_dptune.PrivacyAccountantCallback (or use ray_dptune.private_tuner)."
            )
        assert self._account is not None  # has_account
        return self._account()

    def record_event(self, event: Mapping[str, Any]) -> None:
        """Records an event durably before its effect can leave the driver (no-op without a recorder)."""
        recorder = getattr(self, "_recorder", None)
        if recorder is not None:
            recorder(event)

    def record_suggestion(self, trial_id: str, config: Mapping[str, Any]) -> None:
        """Records that ``trial_id`` was suggested (charged until its fate is known)."""
        event = {"type": "suggested", "trial_id": trial_id, "accounted": bool(self.accounts_trial(config))}
        self.record_event({**event, "final": True} if self.final_trial(config) else event)

    def privacy_details(self) -> dict[str, Any]:
        """Searcher-specific facts for the privacy report (JSON-serialisable)."""
        return {}

    # ------------------------------------------------------------------ Searcher API
    def set_search_properties(self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any) -> bool:
        """Takes Tune's metric and mode where none was given, and its space where the searcher has none."""
        self.offer_space(config)
        self._check_mode(mode)
        self._metric = self._metric or metric
        self._mode = self._mode or mode
        if self._space is not None:
            return False
        self._set_space(config)
        return True

    def suggest(  # type: ignore[override]  # Ray's annotation omits FINISHED, which its docs return
        self, trial_id: str
    ) -> dict[str, Any] | str | None:
        """The next configuration (recorded before it is returned), None to wait, or FINISHED after K."""
        if self._done():
            return Searcher.FINISHED
        if self._held:
            return None
        name = type(self).__name__
        if self.needs_space and self._space is None:
            raise RuntimeError(f"{name} has no search space: pass `space=` to it or `param_space=` to tune.Tuner.")
        if self.needs_metric and (self._metric is None or self._mode not in self.modes):
            raise ValueError(
                f"{name} needs a metric and a mode ('max' or 'min') to adapt: pass them to it or to tune.TuneConfig."
            )
        proposal = self._propose(trial_id)
        if proposal is None:
            return None
        config, record = proposal
        self.record_suggestion(trial_id, config)  # refused (budget) before the searcher counts it as suggested
        self._suggested[trial_id] = record
        return config

    def get_state(self) -> dict[str, Any]:
        """The common fields and the searcher's own (``_extra_state``): enough to continue identically."""
        return {
            "searcher": type(self).__name__,
            "seed": self._seed,
            "rng_state": self._rng.bit_generator.state,
            "space": self._space,
            "metric": self._metric,
            "mode": self._mode,
            "num_trials": self._num_trials,
            "suggested": self._suggested,
            **self._extra_state(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`get_state`; refuses another searcher's state or another space (PrivacyError)."""
        if state.get("searcher") != type(self).__name__:
            raise ValueError(f"Cannot restore a {type(self).__name__} from a state of {state.get('searcher')!r}.")
        self.check_restored_space(state["space"])
        state = copy.deepcopy(state)
        self._seed = state["seed"]
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = state["rng_state"]
        self._space, self._metric, self._mode = state["space"], state["metric"], state["mode"]
        self._num_trials, self._suggested = int(state["num_trials"]), state["suggested"]
        self._restore_extra(state)

    def save(self, checkpoint_path: str) -> None:
        """Pickles :meth:`get_state` to ``checkpoint_path``, so a restored search keeps its K and its draws."""
        with open(checkpoint_path, "wb") as file:
            pickle.dump(self.get_state(), file)

    def restore(self, checkpoint_path: str) -> None:
        """Loads the state :meth:`save` wrote, through :meth:`set_state` (which refuses another searcher's)."""
        with open(checkpoint_path, "rb") as file:
            self.set_state(pickle.load(file))
        logger.info("Restored %s: %d planned trials.", type(self).__name__, self._num_trials)

    # ------------------------------------------------------------------ what a searcher adds
    def _propose(self, trial_id: str) -> tuple[dict[str, Any], Any] | None:
        """(config, what to remember of it) for ``trial_id``, or None to wait for running trials."""
        raise NotImplementedError

    def _done(self) -> bool:
        """True once the search has nothing more to suggest: by default after K suggestions."""
        return len(self._suggested) >= self._num_trials

    def _set_space(self, space: dict[str, Any]) -> None:
        """Adopts ``space`` (given to the searcher or by Tune)."""
        check_space(space)
        self._space = space

    def _extra_state(self) -> dict[str, Any]:
        """The searcher's own state, beyond the common fields."""
        return {}

    def _restore_extra(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`_extra_state` (``state`` is the restorer's own copy)."""

    def _check_mode(self, mode: str | None) -> None:
        if mode is not None and mode not in self.modes:
            accepted = " or ".join(map(repr, self.modes))
            raise ValueError(f"mode must be {accepted} (or None, to take tune.TuneConfig's), got {mode!r}.")


class RunCountSearcher(PrivateSearcher):
    """A searcher that runs a random number K of DP trials, K drawn once from a law.

    Accounted by ``repeat_and_select(plan, law, density_ratio, upper)`` (Papernot & Steinke
    2022, Thms 2/6; DP-HyPO Thm 1 when ``density_ratio`` = C/c > 1). Subclasses set
    ``_distribution``, a ``density_ratio`` (1 when not adaptive) and, when their sampler
    guarantees it, ``density_upper`` = C (None: the bound takes the worst case C = C/c).
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

    @property
    def density_ratio(self) -> float:
        """C/c, the bound on every draw's density ratio to the prior (1 when not adaptive)."""
        raise NotImplementedError

    @property
    def density_upper(self) -> float | None:
        """C when the sampler guarantees it; None: the bound takes the worst case C = C/c."""
        return None

    @property
    def distribution(self) -> RunCountDistribution:
        """The law K was drawn from."""
        return self._distribution

    def privacy_mechanism(self) -> SearchMechanism:
        """K ~ law runs, best released: P&S Thm 2/6, DP-HyPO Thm 1 when ``density_ratio`` > 1."""
        return SearchMechanism.random_count(
            law=self._distribution,
            num_trials=self._num_trials,
            density_ratio=self.density_ratio,
            upper=self.density_upper,
        )

    def _draw_count(self, distribution: RunCountDistribution) -> None:
        """Draws K once from ``distribution`` with the searcher's generator (never again)."""
        self._distribution = distribution
        self._num_trials = distribution.sample(self._rng)

    def _extra_state(self) -> dict[str, Any]:
        return {"distribution": self._distribution.to_dict()}

    def _restore_extra(self, state: dict[str, Any]) -> None:
        self._distribution = distribution_from_dict(state["distribution"])
