"""ConstantOverheadSearcher: Ding et al.'s constant-overhead DP tuning (Algorithm 1) for Ray Tune.

Ding, Wu, Xu & Pan, "Constant-overhead Differentially Private Hyperparameter Tuning".
Three phases, all driven by this searcher:

1. **Partition trials** (Algorithm 1, lines 1–11): every candidate s of a finite set S
   trains on each of k disjoint parts of the training set (``config["dp_partition"]``,
   honoured by :func:`ray_dptune.training.dp_trainable`, which assigns each example to
   a part by a hash of its own content). u_s is the mean of the k final accuracies.
   These trials may be non-private: their models are never released, and their
   utilities reach the output only through phase 2.
2. **Sparse-vector rounds** (lines 12–34), in the driver once every partition trial is
   done: at most T_max ε-DP AboveThreshold rounds (:mod:`ray_dptune.accounting.bounds.svt`)
   pick s*; each u_s has sensitivity 1/k (Lemma 2).
3. **Final trial** (line 35): s* trained with DP-SGD on the whole training set; its
   plan is the search's plan, and it is the released trial.

The whole search is accounted as T_max · ε_round pure-DP rounds (RDP composition)
plus the final trial's DP-SGD plan (:meth:`ConstantOverheadSearcher.privacy_mechanism`).
"""

from __future__ import annotations

import copy
import logging
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.accounting.bounds.svt import (
    HEADROOM_FACTOR,
    SVTParams,
    SVTResult,
    check_max_rounds,
    default_max_rounds,
    run_svt,
    worst_case_noiseless_rounds,
)
from ray_dptune.errors import UnsupportedBoundError
from ray_dptune.result_keys import PARTITION_KEY
from ray_dptune.search.base import PrivateSearcher
from ray_dptune.search.space import FINITE_ONLY, expand_candidates, is_fixed

__all__ = ["ConstantOverheadSearcher"]

logger = logging.getLogger(__name__)


class ConstantOverheadSearcher(PrivateSearcher):
    """Constant-overhead DP hyperparameter tuning (Ding et al., Algorithm 1) as a Tune searcher.

    Runs |S|·k partition trials, then (in the driver) at most T_max sparse-vector
    rounds that pick s*, then one DP-SGD trial of s* on the whole training set, and
    returns ``FINISHED``. The privacy guarantee of the released final trial is
    ``T_max`` ε-DP rounds composed with the final trial's plan: with the default
    T_max (:func:`~ray_dptune.accounting.bounds.svt.default_max_rounds`, 46 for g = 0.01,
    u0 = 0), ε_round = 0.05 adds 2.3 to ε at most, however large S is.

    Failures. Give ``tune.RunConfig(failure_config=tune.FailureConfig(max_failures=...))``
    so Tune retries a failed trial itself. A partition trial that still ends in error
    counts as accuracy 0: a substitute in [0, 1] that depends only on its own part's
    trial, so Lemma 2 (sensitivity 1/k) still holds. The final trial is not
    re-suggested; its failed attempts are composed by the accountant. A partition
    trial that finishes without reporting ``metric``, or with a value outside [0, 1],
    stops the search with :class:`~ray_dptune.errors.UnsupportedBoundError`: 1/k holds
    for accuracies only.

    If no candidate ever passes (s* = ∅), candidate ``fallback`` is trained: a choice
    made before the data are seen.

    Example:
        .. code-block:: python

            from ray import tune
            from ray_dptune import PrivacyAccountantCallback, private_tune_config
            from ray_dptune.search.constant_overhead import ConstantOverheadSearcher

            space = {"lr": tune.grid_search([0.1, 0.5, 2.0]), "max_grad_norm": tune.choice([0.5, 2.0])}
            searcher = ConstantOverheadSearcher(space, partitions=5, epsilon_round=0.05,
                                                granularity=0.01, metric="val_acc")
            plan = trainable.privacy_plan(space)  # the final trial's DP-SGD plan
            tuner = tune.Tuner(trainable, tune_config=private_tune_config(searcher),
                               run_config=tune.RunConfig(callbacks=[
                                   PrivacyAccountantCallback(searcher, delta=1e-5, plan=plan)]))

    Args:
        candidates: S: a list of config dicts, or a Tune space whose tuned entries are all
            ``tune.grid_search`` or ``tune.choice`` (expanded by :func:`expand_candidates`).
        partitions: k >= 1, the number of disjoint training parts (the paper suggests k ≥ 5/ε_round).
        epsilon_round: ε of each sparse-vector round (> 0).
        granularity: g ∈ (0, 1), the utility grid.
        initial_utility: u0 ∈ [0, 1), where the climb starts.
        max_rounds: T_max; None for the data-independent default. Accounting always
            uses T_max, however many rounds run.
        private_partitions: train the partition trials with DP-SGD too. The guarantee
            does not use it (their models are not released); it protects what Ray keeps
            on disk for them.
        metric: the partition trials' accuracy, in [0, 1].
        mode: must be "max" (utilities are accuracies).
        seed: seeds the rounds' noise (tests, reproducibility); None draws 128 bits
            from the OS's secure source.
        fallback: index of the candidate trained when s* = ∅.

    Raises:
        ValueError: an invalid setting (checked here, before any trial runs).
        TypeError: candidates, ``private_partitions`` or ``fallback`` of the wrong type.
    """

    modes = ("max",)
    needs_space = False
    accepts_plan_for = False
    threat_model = (
        "training set (add/remove one example): partition trials may train without DP; their models "
        "are never released and their accuracies (public validation set, each in [0, 1]) reach the "
        "output only through T_max sparse-vector rounds, each ε_round-DP with sensitivity 1/k "
        "(Ding et al. Lemma 2: each example lies in one of k parts, assigned by a hash of its own "
        "content); the final model is trained with DP-SGD within the search's plan"
    )
    coverage = (
        "The guarantee covers the released output only: the final trial (the selected candidate s*, "
        "trained with DP-SGD on the whole training set): its configuration, score and checkpoint, as "
        "returned by ray_dptune.release_best, and this searcher's privacy details. The partition "
        "trials' models, scores and statuses, which Ray keeps on disk and this report lists, are not "
        "covered (release_best(..., purge=True) deletes the trials' folders)."
    )

    def __init__(
        self,
        candidates: Sequence[Mapping[str, Any]] | Mapping[str, Any],
        *,
        partitions: int,
        epsilon_round: float,
        granularity: float,
        initial_utility: float = 0.0,
        max_rounds: int | None = None,
        private_partitions: bool = False,
        metric: str | None = None,
        mode: str | None = "max",
        seed: int | None = None,
        fallback: int = 0,
    ):
        super().__init__(metric=metric, mode="max" if mode is None else mode, seed=seed)
        self._candidates = _candidate_list(candidates)
        self._params = SVTParams(
            partitions=partitions, epsilon=epsilon_round, granularity=granularity, initial_utility=initial_utility
        )
        if max_rounds is None:
            self._max_rounds, self._max_rounds_source = default_max_rounds(self._params), "default"
        else:
            self._max_rounds, self._max_rounds_source = check_max_rounds(max_rounds), "user"
        if not isinstance(private_partitions, bool):
            raise TypeError(f"private_partitions must be True or False, got {private_partitions!r}.")
        self._private_partitions = private_partitions
        if isinstance(fallback, bool) or not isinstance(fallback, numbers.Integral):
            raise TypeError(f"fallback must be a candidate index, got {fallback!r}.")
        if not 0 <= fallback < len(self._candidates):
            raise ValueError(f"fallback must index a candidate, in [0, {len(self._candidates)}), got {fallback}.")
        self._fallback: int = int(fallback)
        k = self._params.partitions
        self._num_trials = len(self._candidates) * k + 1
        self._queue: list[tuple[int, int]] = [(s, i) for s in range(len(self._candidates)) for i in range(k)]
        self._accuracies: dict[tuple[int, int], float] = {}  # NOT private: never reported
        self._finished: set[str] = set()
        self._outcome: SVTResult | None = None
        self._final_trial_id: str | None = None
        self._violation: str | None = None

    # ------------------------------------------------------------------ what the accountant reads
    @property
    def candidates(self) -> list[dict[str, Any]]:
        """S, in suggestion order (a copy)."""
        return copy.deepcopy(self._candidates)

    def planned_spaces(self, param_space: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Each candidate over Tune's constants: the final training runs one of them."""
        return [{**param_space, **candidate} for candidate in self._candidates]

    @property
    def max_rounds(self) -> int:
        """T_max: the number of ε_round-DP rounds the search is accounted for."""
        return self._max_rounds

    @property
    def params(self) -> SVTParams:
        """k, ε_round, g and u0."""
        return self._params

    @property
    def selected_index(self) -> int | None:
        """The index of the candidate the final trial trains (None before the rounds ran)."""
        if self._outcome is None:
            return None
        return self._fallback if self._outcome.chosen is None else self._outcome.chosen

    def accounts_trial(self, config: Mapping[str, Any]) -> bool:
        """Only the final trial (no ``dp_partition`` key) must report and satisfy the plan."""
        return PARTITION_KEY not in config

    def privacy_mechanism(self) -> SearchMechanism:
        """T_max ε_round-DP rounds per selection composed with the final trial's plan.

        Each round is ε_round-DP (Dwork & Roth Thm 3.23 with Δ = 1/k by Ding et al.
        Lemma 2; Ding et al. Thm 3, part I), so T_max rounds have RDP
        T_max · min(ε, αε²/2) (:func:`~ray_dptune.accounting.bounds.svt.svt_curve`); the final
        DP-SGD training composes by addition (Mironov 2017, Prop. 1).
        """
        return SearchMechanism.constant_overhead(epsilon_round=self._params.epsilon, max_rounds=self._max_rounds)

    def privacy_details(self) -> dict[str, Any]:
        """The search's data-independent settings and the sparse-vector outcome (no utilities)."""
        params = self._params
        worst = worst_case_noiseless_rounds(params)
        outcome = self._outcome
        selected = self.selected_index
        details: dict[str, Any] = {
            "algorithm": "Ding et al., constant-overhead DP tuning, Algorithm 1, rounds capped at T_max",
            "num_candidates": len(self._candidates),
            "partitions": params.partitions,
            "sensitivity": params.sensitivity,
            "epsilon_round": params.epsilon,
            "granularity": params.granularity,
            "initial_utility": params.initial_utility,
            "threshold_noise_scale": params.threshold_scale,
            "query_noise_scale": params.query_scale,
            "max_rounds": self._max_rounds,
            "max_rounds_source": (
                f"default: {HEADROOM_FACTOR} × {worst} rounds, the most the noiseless loop (Lemma 1) takes for any utility "
                f"u* ≤ 1, n = ⌈(1 − u0)/g⌉ = {params.grid_size}"
                if self._max_rounds_source == "default"
                else f"set by the user (noiseless worst case: {worst} rounds, n = {params.grid_size})"
            ),
            "epsilon_rounds_basic_composition": self._max_rounds * params.epsilon,
            "partition_trials": len(self._candidates) * params.partitions,
            "partition_trials_private": self._private_partitions,
            "failed_partition_trial_policy": (
                "accuracy 0: a value in [0, 1] that depends on that part only (Lemma 2 holds)"
            ),
            "fallback_index": self._fallback,
            "rounds_used": None if outcome is None else outcome.rounds,
            "cap_hit": None if outcome is None else outcome.cap_hit,
            "final_utility_u": None if outcome is None else params.utility(outcome.level),
            "chosen_index": None if outcome is None else outcome.chosen,
            "fallback_used": None if outcome is None else outcome.chosen is None,
            "selected_index": selected,
            "selected_config": None if selected is None else copy.deepcopy(self._candidates[selected]),
            "seed": self._seed if self._seed is not None else "secure (operating system)",
        }
        if self._final_trial_id is not None:
            details["released_trial_id"] = self._final_trial_id
        return details

    # ------------------------------------------------------------------ Searcher API
    def set_search_properties(self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any) -> bool:
        """Takes Tune's metric; the param_space may only add constants (S was given to the searcher)."""
        if config and PARTITION_KEY in config:
            raise ValueError(f"param_space must not set {PARTITION_KEY!r}: the searcher assigns the partitions.")
        super().set_search_properties(metric, mode, config, **spec)
        return False  # Tune then refuses a param_space with tuned entries

    def _done(self) -> bool:
        if self._violation is not None:
            raise UnsupportedBoundError(self._violation)
        return self._final_trial_id is not None

    def _propose(self, trial_id: str) -> tuple[dict[str, Any], tuple[int, int] | str] | None:
        """A partition trial (s, i) while any is left, then, once all are done, the final trial."""
        if self._queue:
            s, i = self._queue.pop(0)
            config = copy.deepcopy(self._candidates[s])
            config[PARTITION_KEY] = {"index": i, "count": self._params.partitions, "private": self._private_partitions}
            return config, (s, i)
        if self._outcome is None:
            if len(self._accuracies) < len(self._candidates) * self._params.partitions:
                return None  # partition trials still running
            self._select()
        selected = self.selected_index
        assert selected is not None  # the rounds have run
        self._final_trial_id = trial_id
        logger.info(
            "Constant-overhead search: final trial %s trains candidate %d on the whole training set.",
            trial_id,
            selected,
        )
        return copy.deepcopy(self._candidates[selected]), "final"

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        """Records a partition trial's final accuracy (0 if it failed); runs the rounds after the last."""
        if self._violation is not None or trial_id in self._finished or trial_id not in self._suggested:
            return  # a repeated event, a trial of another search, or a search already refused
        if result is None and not error:
            # Tune removed the trial before it ran (the experiment is stopping); a resumed
            # experiment runs it under the same id, and its completion is recorded then.
            return
        task = self._suggested[trial_id]
        if task == "final":
            self._finished.add(trial_id)
            if error:
                logger.error("The final trial %s failed; the accountant composes its failed attempts.", trial_id)
            return
        if error:
            logger.warning("Partition trial %s failed: its accuracy counts as 0.", trial_id)
        accuracy = 0.0 if error or result is None else self._accuracy(trial_id, result)
        self._finished.add(trial_id)
        self._accuracies[task] = accuracy
        if self._outcome is None and not self._queue and len(self._accuracies) == self._num_trials - 1:
            self._select()

    def _extra_state(self) -> dict[str, Any]:
        return {
            "candidates": self._candidates,
            "params": self._params.to_dict(),
            "max_rounds": self._max_rounds,
            "max_rounds_source": self._max_rounds_source,
            "private_partitions": self._private_partitions,
            "fallback": self._fallback,
            "queue": self._queue,
            "accuracies": self._accuracies,
            "finished": sorted(self._finished),
            "outcome": None if self._outcome is None else self._outcome.to_dict(),
            "final_trial_id": self._final_trial_id,
            "violation": self._violation,
        }

    def _restore_extra(self, state: dict[str, Any]) -> None:
        self._candidates, self._params = state["candidates"], SVTParams(**state["params"])
        self._max_rounds, self._max_rounds_source = int(state["max_rounds"]), state["max_rounds_source"]
        self._private_partitions, self._fallback = bool(state["private_partitions"]), int(state["fallback"])
        self._queue, self._accuracies, self._finished = state["queue"], state["accuracies"], set(state["finished"])
        self._outcome = None if state["outcome"] is None else SVTResult(**state["outcome"])
        self._final_trial_id, self._violation = state["final_trial_id"], state["violation"]

    # ------------------------------------------------------------------ helpers
    def _accuracy(self, trial_id: str, result: Mapping[str, Any]) -> float:
        """The trial's final ``metric``, which must be an accuracy in [0, 1] (Lemma 2)."""
        if self._metric is None:
            self._refuse(
                "ConstantOverheadSearcher has no metric: pass metric= to it or to tune.TuneConfig "
                "(the partition trials' accuracy, in [0, 1])."
            )
        value = result.get(self._metric)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
            self._refuse(
                f"Partition trial {trial_id} ended with {self._metric} = {value!r}; the constant-overhead "
                "search needs an accuracy in [0, 1] from every partition trial: the sensitivity 1/k of the "
                "utilities (Ding et al. Lemma 2) holds only then. Report an accuracy as the searcher's metric "
                "(a noisy score can leave [0, 1]: score partition trials on a public validation set)."
            )
        return float(value)

    def _refuse(self, message: str) -> NoReturn:
        self._violation = message  # Tune logs errors raised while it stops a trial: suggest raises it again
        raise UnsupportedBoundError(message)

    def _select(self) -> None:
        """Phase 2: u_s = mean over parts (lines 9), then the capped rounds (lines 12–34)."""
        k = self._params.partitions
        utilities = [math.fsum(self._accuracies[(s, i)] for i in range(k)) / k for s in range(len(self._candidates))]
        utilities = [min(1.0, max(0.0, u)) for u in utilities]  # a mean of values in [0, 1]; rounding only
        self.record_event({"type": "selection"})  # T_max rounds charged before they run
        self._outcome = run_svt(utilities, self._params, max_rounds=self._max_rounds, rng=self._rng)
        logger.info(
            "Constant-overhead search: %d of at most %d rounds%s; s* = %s.",
            self._outcome.rounds,
            self._max_rounds,
            " (cap reached)" if self._outcome.cap_hit else "",
            self._outcome.chosen if self._outcome.chosen is not None else f"none, fallback {self._fallback}",
        )


def _candidate_list(candidates: Any) -> list[dict[str, Any]]:
    if isinstance(candidates, Mapping):
        result = expand_candidates(candidates)
    elif isinstance(candidates, Sequence) and not isinstance(candidates, (str, bytes)):
        result = []
        for index, candidate in enumerate(candidates):
            if not isinstance(candidate, Mapping):
                raise TypeError(f"candidates[{index}] must be a config dict, got {type(candidate).__name__}.")
            if not is_fixed(dict(candidate)):
                raise ValueError(FINITE_ONLY.format(path=f"candidates[{index}]", kind="not a fixed config"))
            result.append(copy.deepcopy(dict(candidate)))
    else:
        raise TypeError(
            f"candidates must be a list of config dicts or a Tune space of grid/choice values, got "
            f"{type(candidates).__name__}."
        )
    if not result:
        raise ValueError("candidates is empty: the constant-overhead search needs at least one candidate.")
    if any(PARTITION_KEY in candidate for candidate in result):
        raise ValueError(f"A candidate must not set {PARTITION_KEY!r}: the searcher assigns the partitions.")
    return result
