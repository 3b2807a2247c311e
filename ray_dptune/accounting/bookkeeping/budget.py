"""SearchBudget: the ε a user asks for, kept as a hard cap on the whole search.

Every charged attempt adds the same plan curve to the mechanism's bound, so the
guarantees a search can reach form a chain, selection + n·plan, and the cap admits an
event only while the guarantee after it stays within the target
(:meth:`~ray_dptune.accounting.bookkeeping.account.SearchAccount.guarantee_after`). The cap is thus
a number of charged attempts fixed by (target, plan, selection) before the search
starts; padding the attempts that did not happen with null runs, the search is an
adaptive composition of at most that many runs beside the selection (Mironov 2017,
Prop. 1), so the target bounds it although the number of retries depends on the run.

The budget also says whether a search is complete (every trial ran to its end) and what
resuming an interrupted one would cost; the lines a person reads are :mod:`ray_dptune.tune.console`'s.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from ray_dptune.accounting.bookkeeping.account import CHARGING_EVENTS, SearchAccount
from ray_dptune.accounting.bookkeeping.guarantee import Guarantee
from ray_dptune.errors import BudgetExceededError, PrivacyError

__all__ = ["SearchBudget"]

_UNFINISHED_WORDS = {
    "interrupted": "stopped before they ended (Ctrl-C, a time budget, or the run ended on an error)",
    "unknown": "left running by a driver that died",
    "refused": "failed, and their retry was refused by the budget",
    "live": "still running",
}


class SearchBudget:
    """A search's target ε read against its account (or the dataset's total, with a ledger).

    Args:
        target_epsilon: the cap, or None (then nothing is refused for the budget).
        account: returns the search's current account (a restore replaces it).
        total: the ε the cap applies to, given the search's guarantee (the dataset's total
            with a ledger, else the guarantee's own ε).
        scope: what the cap applies to, in words ("The search's guarantee").
    """

    def __init__(
        self,
        *,
        target_epsilon: float | None,
        account: Callable[[], SearchAccount],
        total: Callable[[Guarantee], float | None],
        scope: str,
    ):
        self.target_epsilon = target_epsilon
        self._account = account
        self._total = total
        self._scope = scope

    @property
    def account(self) -> SearchAccount:
        """The search's account as it stands (a restore replaces it)."""
        return self._account()

    @property
    def scope(self) -> str:
        """What the cap applies to, in words ("The search's guarantee")."""
        return self._scope

    def total(self, guarantee: Guarantee) -> float | None:
        """The ε the cap applies to when the search's guarantee is ``guarantee``."""
        return self._total(guarantee)

    def epsilon(self) -> float | None:
        """The ε the report shows: the worst case if the search stopped now."""
        return self._total(self._account().guarantee(if_stopped_now=True))

    def held(self) -> bool:
        """True when there is no target or the search is within it."""
        epsilon = self.epsilon()
        return self.target_epsilon is None or epsilon is None or epsilon <= self.target_epsilon

    def admit(self, event: dict[str, Any]) -> None:
        """Raises BudgetExceededError when ``event`` would take the guarantee past the target (nothing changes)."""
        account = self._account()
        if self.target_epsilon is None or event["type"] not in CHARGING_EVENTS or account.plan is None:
            return
        epsilon = self._total(account.guarantee_after(event))
        if epsilon is not None and epsilon > self.target_epsilon:
            what = {"suggested": "A new trial", "started": "Starting this attempt", "failed": "Retrying this trial"}
            raise BudgetExceededError(
                f"{what.get(event['type'], 'This step')} ({event.get('trial_id', event['type'])}) would take "
                f"{self._scope.lower()} to ε = {epsilon:.4g} > target_epsilon = {self.target_epsilon:g} "
                f"(δ = {account.delta:g}): refused before it ran. Reserve headroom for re-runs "
                "(private_tuner(..., retries=R)) to let the budget pay for them."
            )

    def check(self) -> None:
        """Raises PrivacyError when the search as it stands is over the target (before any trial, or on a restore)."""
        epsilon = self.epsilon()
        if self.target_epsilon is None or epsilon is None or epsilon <= self.target_epsilon:
            return
        account = self._account()
        why = (
            " before any trial runs. Raise the noise (ray_dptune.calibrate_noise_multiplier finds it) or lower the "
            "expected number of trials."
            if not account.trials
            else f": {account.charged_attempts(if_stopped_now=True)} attempt(s) are charged at their plan (a killed "
            "driver's attempts may have run). The search cannot go on within its budget and nothing may be "
            "released; start a new search with more headroom (private_tuner(..., retries=R))."
        )
        raise PrivacyError(
            f"{self._scope} is ε = {epsilon:.4g} at δ = {account.delta:g}, above target_epsilon = "
            f"{self.target_epsilon:g}{why}"
        )

    def resume_epsilon(self) -> tuple[int, float | None]:
        """(interrupted trials, the ε once a restore has re-run each of them at its plan)."""
        account = self._account()
        interrupted = account.unfinished()["interrupted"]
        if account.plan is None:
            return interrupted, None
        if not account.mechanism.has_final_run:
            return interrupted, self._total(account.guarantee(extra_charges=interrupted))
        rerun = copy.deepcopy(account)  # a re-run final trial is one more run on all the data, not a tuning attempt
        for trial_id, trial in account.trials.items():
            last = trial.attempts[-1] if trial.attempts else {}
            if trial.accounted and last.get("state") == "interrupted" and not last.get("refused"):
                rerun.apply({"type": "started", "trial_id": trial_id, "accounted": True})
        return interrupted, self._total(rerun.guarantee())

    def check_resumable(self) -> None:
        """Raises PrivacyError, up front, when re-running the interrupted trials would cross the target."""
        interrupted, epsilon = self.resume_epsilon()
        if self.target_epsilon is None or not interrupted or epsilon is None or epsilon <= self.target_epsilon:
            return
        raise PrivacyError(
            f"Resuming this search re-runs its {interrupted} interrupted trial(s), each charged its plan: ε would be "
            f"{epsilon:.4g} > target_epsilon = {self.target_epsilon:g}. It cannot be resumed within its budget, and "
            "an incomplete search is not released."
        )

    def completeness(self, *, searcher: Any, violation: Exception | None) -> tuple[bool, str | None]:
        """(complete, why not): every trial suggested, each trial's last attempt ran to its end, no violation."""
        account = self._account()
        reasons = [] if violation is None else [str(violation)]
        if not searcher.finished:
            reasons.append(f"the searcher suggested {account.num_trials_started} of its {searcher.num_trials} trials")
        reasons += [
            f"{count} trial(s) {_UNFINISHED_WORDS[state]}" for state, count in account.unfinished().items() if count
        ]
        return not reasons, "; ".join(reasons) or None
