"""The lines a person reads on the driver's console: the search's ε while it runs, and how it ended."""

from __future__ import annotations

from ray_dptune.accounting.bookkeeping.budget import SearchBudget
from ray_dptune.accounting.bookkeeping.search_mechanism import HalvingMechanism

__all__ = ["end_line", "progress_line"]


def progress_line(budget: SearchBudget, *, num_trials: int) -> str:
    """The live line: the search's ε while it runs (the dataset's total with a ledger) and its progress."""
    account = budget.account
    guarantee = account.guarantee()
    total = budget.total(guarantee)
    shown = f"(ε = {guarantee.epsilon:.4g}, δ = {account.delta:g})"
    if account.reserved_reruns:
        shown += f", spent so far ε = {account.spent().epsilon:.4g}"
    if total is not None and total != guarantee.epsilon:
        shown += f"; {budget.scope.lower()} ε = {total:.4g}"
    if budget.target_epsilon is not None:
        shown += f" of a budget of {budget.target_epsilon:g}"
    if isinstance(account.mechanism, HalvingMechanism):  # the number of trials is not fixed: the budget is
        done = (
            f"trials {account.trials_completed} done; {account.units_charged}/"
            f"{account.mechanism.budget_units} time units charged"
        )
    else:
        done = (
            f"trials {account.trials_completed}/{num_trials} done; {guarantee.charged_attempts} attempt(s) "
            "charged beyond the selection bound"
        )
    return f"whole search: {shown}; {done}"


def end_line(
    budget: SearchBudget, *, complete: bool, reason: str | None, path: str | None, resumable: bool = True
) -> str:
    """What the search says when it ends: done, or incomplete / over budget.

    An incomplete search also says whether it can be resumed (never after a violation such as a spend
    past the plan: ``resumable=False``).
    """
    account = budget.account
    epsilon = budget.epsilon()
    shown = "n/a (no trial reported a plan)" if epsilon is None else f"{epsilon:.4g}"
    where = f"report: {path or 'not written (no trial ran; pass report_path=)'}"
    over = not budget.held()
    if account.refused_before_training():
        return (
            f"search REFUSED before any training step: {reason}. No attempt touched the data: the search spent "
            f"nothing (ε = 0). Fix the trainable and run the search again; {where}"
        )
    if complete and not over and (account.trials_completed or not account.trials):
        return f"search done: (ε = {shown}, δ = {account.delta:g}) for the whole search; {where}"
    if complete and not over:
        return (
            f"search done, but no trial ran its plan to the end (ε = {shown}, δ = {account.delta:g}): nothing "
            f"may be released, as a failed run never is; {where}"
        )
    state = f"search INCOMPLETE: {reason}" if not complete else "search ended OVER ITS BUDGET"
    state += f"; ε = {shown}" + (f" > target {budget.target_epsilon:g}" if over else "")
    advice = "nothing may be released"
    interrupted, resumed = budget.resume_epsilon()
    if interrupted and resumable and not over and resumed is not None:
        if budget.target_epsilon is None or resumed <= budget.target_epsilon:
            advice += (
                f"; resume it with tune.Tuner.restore(path, trainable), which re-runs {interrupted} trial(s): "
                f"ε = {resumed:.4g}"
            )
        else:
            advice += f"; re-running its {interrupted} trial(s) would reach ε = {resumed:.4g}: it cannot be resumed"
    return f"{state} (δ = {account.delta:g}); {advice}; {where}"
