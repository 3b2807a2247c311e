"""SearchBudget, the hard cap, without Ray: what it admits, refuses, and says it would cost to resume.

Oracle: a composition search (every attempt charged at its plan) of n attempts is n-fold RDP
composition of the plan, computed here with ``RDPCurve`` arithmetic, not through the account;
the target sits strictly between two such ε, so each check has one right answer. The Ray-level
tests (tests/tune/test_budget_cap.py: Tune retries, Ctrl-C, a killed driver) drive the same class.
"""

from __future__ import annotations

import pytest

from ray_dptune.accounting.bookkeeping.account import SearchAccount
from ray_dptune.accounting.bookkeeping.budget import SearchBudget
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.accounting.bounds.distributions import Poisson
from ray_dptune.accounting.bounds.selection import repeat_and_select
from ray_dptune.errors import BudgetExceededError, PrivacyError
from ray_dptune.tune.console import end_line

DELTA = 1e-5
PLAN = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=20)


def composed(attempts: int) -> float:
    return (attempts * PLAN.curve()).epsilon(delta=DELTA)


TARGET = (composed(3) + composed(4)) / 2  # three charged attempts fit, a fourth does not


def budget(account: SearchAccount, target: float | None = TARGET) -> SearchBudget:
    return SearchBudget(
        target_epsilon=target, account=lambda: account, total=lambda g: g.epsilon, scope="The search's guarantee"
    )


def run(account: SearchAccount, trial: str, end: str | None = "completed") -> None:
    account.apply({"type": "started", "trial_id": trial, "accounted": True})
    if end is not None:
        account.apply({"type": end, "trial_id": trial})


@pytest.fixture
def account():
    return SearchAccount(SearchMechanism.composition(), delta=DELTA, plan=PLAN.to_dict())


def test_the_chain_of_composed_attempts_is_what_the_account_reports(account):
    assert composed(3) < TARGET < composed(4)
    for trial in "abc":
        run(account, trial)
    assert account.guarantee().epsilon == pytest.approx(composed(3), rel=1e-12)


def test_an_attempt_is_admitted_while_the_guarantee_after_it_stays_within_the_target(account):
    cap = budget(account)
    for trial in "abc":
        cap.admit({"type": "started", "trial_id": trial, "accounted": True})
        run(account, trial)
    with pytest.raises(BudgetExceededError, match=r"Starting this attempt \(d\).*> target_epsilon"):
        cap.admit({"type": "started", "trial_id": "d", "accounted": True})
    cap.admit({"type": "completed", "trial_id": "c"})  # not a charge
    budget(account, target=None).admit({"type": "started", "trial_id": "d", "accounted": True})
    assert cap.held() and cap.epsilon() == pytest.approx(composed(3), rel=1e-12)


def test_check_refuses_a_search_over_its_target_and_a_live_attempt_counts(account):
    for trial in "abc":
        run(account, trial)
    budget(account).check()
    run(account, "d", end=None)  # live: charged if the search stopped now
    assert budget(account).epsilon() == pytest.approx(composed(4), rel=1e-12)
    assert not budget(account).held()
    with pytest.raises(PrivacyError, match="4 attempt"):
        budget(account).check()
    budget(account, target=None).check()
    assert "OVER ITS BUDGET" in end_line(budget(account), complete=True, reason=None, path="r.json")


def test_too_little_budget_for_the_first_trial_is_refused_before_it_runs():
    account = SearchAccount(SearchMechanism.composition(), delta=DELTA, plan=PLAN.to_dict())
    account.apply({"type": "selection"})
    cap = budget(account, target=composed(1) / 2)
    with pytest.raises(BudgetExceededError):
        cap.admit({"type": "started", "trial_id": "a", "accounted": True})


def test_resuming_re_runs_each_interrupted_trial_at_its_plan(account):
    run(account, "a")
    run(account, "b", end="interrupted")
    assert budget(account).resume_epsilon() == (1, pytest.approx(composed(3), rel=1e-12))
    budget(account).check_resumable()
    line = end_line(budget(account), complete=False, reason="1 trial(s) stopped", path="r.json")
    assert "INCOMPLETE" in line and "re-runs 1 trial(s)" in line and f"{composed(3):.4g}" in line

    run(account, "c", end="interrupted")  # 3 charged; re-running both reaches 5 > target
    assert budget(account).resume_epsilon() == (2, pytest.approx(composed(5), rel=1e-12))
    with pytest.raises(PrivacyError, match="2 interrupted trial"):
        budget(account).check_resumable()
    line = end_line(budget(account), complete=False, reason="2 trial(s) stopped", path="r.json")
    assert "cannot be resumed" in line and "nothing may be released" in line
    assert f"; ε = {budget(account).epsilon():.4g}" in line  # what the search stands at, said on the driver
    assert "re-runs" not in end_line(
        budget(account), complete=False, reason="a spend past its plan", path="r.json", resumable=False
    )
    budget(account, target=None).check_resumable()


def test_a_complete_search_within_its_target_says_done(account):
    run(account, "a")
    line = end_line(budget(account), complete=True, reason=None, path="r.json")
    assert line.startswith("search done: (ε = ") and f"{composed(1):.4g}" in line and "r.json" in line


def test_a_complete_search_whose_every_trial_failed_says_nothing_may_be_released(account):
    run(account, "a", "failed")
    line = end_line(budget(account), complete=True, reason=None, path="r.json")
    assert line.startswith("search done, but no trial ran its plan to the end") and "nothing may be released" in line


def test_the_budget_reads_the_durable_worst_case_a_live_attempt_charged_whole():
    """A live trial is covered by the selection bound only once it ends; if the driver died now, it is charged."""
    account = SearchAccount(
        SearchMechanism.random_count(law=Poisson(mean=3), num_trials=3), delta=DELTA, plan=PLAN.to_dict()
    )
    run(account, "a")
    run(account, "b")
    run(account, "c", end=None)
    selection = repeat_and_select(PLAN.curve(), Poisson(mean=3))
    assert account.guarantee().epsilon == pytest.approx(selection.epsilon(delta=DELTA), rel=1e-9)
    worst = (selection + PLAN.curve()).epsilon(delta=DELTA)
    assert budget(account).epsilon() == pytest.approx(worst, rel=1e-9)
    assert not budget(account, target=(selection.epsilon(delta=DELTA) + worst) / 2).held()


def test_unfinished_trials_are_counted_by_why_and_make_the_search_incomplete(account):
    """What ``completeness`` (and so ``release_best``) reads: a refused retry, a live or orphaned attempt."""
    account.apply({"type": "started", "trial_id": "public", "accounted": False})  # not private: never counted
    run(account, "a")
    for refused in ("b", "e"):
        run(account, refused, end=None)
        account.apply({"type": "failed", "trial_id": refused, "refused": "over budget"})
    run(account, "c", end="interrupted")
    run(account, "d", end=None)
    assert account.unfinished() == {"live": 1, "interrupted": 1, "unknown": 0, "refused": 2}
    account.apply({"type": "restored"})  # a new driver: the live attempt's fate is unknown
    assert account.unfinished() == {"live": 0, "interrupted": 1, "unknown": 1, "refused": 2}

    class Finished:
        finished, num_trials = True, 4

    complete, why = budget(account).completeness(searcher=Finished(), violation=None)
    assert not complete
    assert "2 trial(s) failed, and their retry was refused by the budget" in why
    assert "1 trial(s) left running by a driver that died" in why
    fresh = SearchAccount(SearchMechanism.composition(), delta=DELTA, plan=PLAN.to_dict())
    run(fresh, "a")
    assert budget(fresh).completeness(searcher=Finished(), violation=None) == (True, None)
    violation = PrivacyError("trial a spent past its plan")
    assert budget(fresh).completeness(searcher=Finished(), violation=violation) == (False, str(violation))


def test_the_stated_guarantee_is_the_procedure_s_whatever_failed_or_was_re_run_within_the_reservation():
    """Selection + reserved·plan before the search, after a failure and after a reserved re-run; past the
    reservation the chain goes on (never below what was charged); the odometer is ``spent``."""
    law = Poisson(mean=2.0)
    account = SearchAccount(
        SearchMechanism.random_count(law=law, num_trials=2), delta=DELTA, plan=PLAN.to_dict(), reserved_reruns=2
    )
    selection = repeat_and_select(PLAN.curve(), law)
    procedure = (selection + 2 * PLAN.curve()).epsilon(delta=DELTA)
    stated = [account.guarantee().epsilon]
    run(account, "a", "failed")  # a failed trial: one of the K runs, output "failed"
    stated.append(account.guarantee().epsilon)
    account.apply({"type": "started", "trial_id": "b", "accounted": True})
    account.restored()  # the driver died while b ran: its attempt is charged
    run(account, "b")  # the restored driver re-runs it
    stated.append(account.guarantee(if_stopped_now=True).epsilon)
    assert stated == pytest.approx([procedure] * 3, rel=1e-12)
    assert account.spent().epsilon == pytest.approx((selection + PLAN.curve()).epsilon(delta=DELTA), rel=1e-12)
    assert account.spent().epsilon < procedure
    for extra in ("c", "d"):  # two more re-runs: three charged, past the two reserved
        account.apply({"type": "started", "trial_id": extra, "accounted": True})
        account.restored()
    three = (selection + 3 * PLAN.curve()).epsilon(delta=DELTA)
    assert account.guarantee(if_stopped_now=True).epsilon == pytest.approx(three, rel=1e-12)
    assert account.spent(if_stopped_now=True).epsilon == pytest.approx(three, rel=1e-12)


def test_a_halving_search_reserves_nothing_by_attempts():
    mechanism = SearchMechanism.halving(budget_units=3, max_t=3)
    with pytest.raises(ValueError, match="budget of time units"):
        SearchAccount(mechanism, delta=DELTA, plan=PLAN.to_dict(), reserved_reruns=1)
