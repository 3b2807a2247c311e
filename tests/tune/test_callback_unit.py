"""PrivacyAccountantCallback without a Ray run: malformed reports and attempt bookkeeping."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from ray_dptune import PointMass, PrivacyAccountantCallback, PrivacyError, RandomCountSearcher, TrialSpend

PLAN = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=40)
TRIAL = SimpleNamespace(trial_id="t1", config={"x": 0.5})


def callback():
    accountant = PrivacyAccountantCallback(RandomCountSearcher(PointMass(2), seed=0), delta=1e-5, verbose=False)
    accountant.setup(num_samples=-1)
    accountant.on_trial_start(0, [], TRIAL)
    return accountant


GOOD_CURVE = {"orders": [2.0, 4.0], "epsilons": [0.1, 0.2]}


@pytest.mark.parametrize(
    "spent",
    [
        None,
        {"orders": [2.0, 4.0], "epsilons": [0.1, float("nan")]},
        {"orders": [2.0, 4.0], "epsilons": [0.1, -0.2]},
        {"orders": [2.0, 4.0], "epsilons": [0.1]},
        {"orders": [4.0, 2.0], "epsilons": [0.1, 0.2]},
        {"kind": "dpsgd", "sample_rate": 0.05, "noise_multiplier": -1.0, "steps": 10},
        "0.3",
    ],
    ids=["missing", "nan", "negative", "wrong-length", "unsorted", "impossible-sigma", "not-a-dict"],
)
def test_malformed_spend_reports_raise_and_keep_what_was_recorded(spent):
    accountant = callback()
    accountant.on_trial_result(0, [], TRIAL, {"dp_plan": GOOD_CURVE, "dp_spent": GOOD_CURVE})
    before = dataclasses.replace(accountant.report(), ended_at=None)
    with pytest.raises(PrivacyError, match="valid 'dp_spent'"):
        accountant.on_trial_result(0, [], TRIAL, {"dp_plan": GOOD_CURVE, "dp_spent": spent})
    assert dataclasses.replace(accountant.report(), ended_at=None) == before


def test_a_bare_curve_report_is_accepted_and_checked_against_the_plan():
    accountant = callback()
    accountant.on_trial_result(
        0, [], TRIAL, {"dp_plan": GOOD_CURVE, "dp_spent": {"orders": [2.0, 4.0], "epsilons": [0.05, 0.1]}}
    )
    with pytest.raises(PrivacyError, match="past its plan"):
        accountant.on_trial_result(
            0, [], TRIAL, {"dp_plan": GOOD_CURVE, "dp_spent": {"orders": [2.0, 4.0], "epsilons": [0.05, 0.3]}}
        )


def test_a_trial_whose_plan_exceeds_the_search_plan_is_refused():
    accountant = PrivacyAccountantCallback(
        RandomCountSearcher(PointMass(2), seed=0), delta=1e-5, plan=PLAN, verbose=False
    )
    accountant.on_trial_start(0, [], TRIAL)
    bigger = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=41).to_dict()
    with pytest.raises(PrivacyError, match="past the search.s plan: steps 41"):
        accountant.on_trial_result(0, [], TRIAL, {"dp_plan": bigger, "dp_spent": PLAN.to_dict()})
    with pytest.raises(PrivacyError, match="past its plan"):  # and once it spends past the search's plan
        accountant.on_trial_result(0, [], TRIAL, {"dp_plan": bigger, "dp_spent": bigger})


def test_an_interrupted_attempt_counts_as_failed_at_its_plan():
    accountant = PrivacyAccountantCallback(
        RandomCountSearcher(PointMass(1), seed=0), delta=1e-5, plan=PLAN, verbose=False
    )
    accountant.on_trial_start(0, [], TRIAL)
    accountant.on_trial_start(0, [], TRIAL)  # restarted without an error event (driver restore)
    states = [a["state"] for a in accountant.report().trials["t1"]["attempts"]]
    assert states == ["unknown", "started"]
    curve = np.array(accountant.guarantee()["curve"]["epsilons"], dtype=float)
    np.testing.assert_allclose(curve, (2 * PLAN.curve()).epsilons, rtol=1e-12)


def test_a_trial_that_spends_its_own_smaller_plan_is_not_an_early_stop():
    """With tuned epochs the search's plan is the longest trial's; shorter trials still finish."""
    accountant = PrivacyAccountantCallback(
        RandomCountSearcher(PointMass(2), seed=0), delta=1e-5, plan=PLAN, verbose=False
    )
    accountant.on_trial_start(0, [], TRIAL)
    short = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=20).to_dict()
    accountant.on_trial_result(0, [], TRIAL, {"dp_plan": short, "dp_spent": short})
    accountant.on_trial_complete(0, [], TRIAL)
    accountant.on_step_begin(0, [])  # no violation pending
    other = SimpleNamespace(trial_id="t2", config={})
    accountant.on_trial_start(0, [], other)
    accountant.on_trial_result(
        0,
        [],
        other,
        {"dp_plan": short, "dp_spent": TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=10).to_dict()},
    )
    accountant.on_trial_complete(0, [], other)
    with pytest.raises(PrivacyError, match="stopped early"):
        accountant.on_step_begin(0, [])


# ----------------------------------------------------------------------------- spends past the plan


def test_a_trial_that_ran_past_the_plan_is_journaled_durably_and_bounded_as_it_ran(tmp_path, request):
    """The report is committed (FULL) before PrivacyError, and the guarantee then uses what the trial ran."""
    from ray_dptune.records.journal import SearchJournal

    journal_path = str(tmp_path / "journal.db")
    searcher = RandomCountSearcher(PointMass(2), seed=0)
    accountant = PrivacyAccountantCallback(searcher, delta=1e-5, plan=PLAN, journal_path=journal_path, verbose=False)
    accountant.setup(num_samples=-1)
    accountant.on_trial_start(0, [], TRIAL)
    planned = accountant.account.guarantee().epsilon
    synced = request.getfixturevalue("durable_syncs")
    ran = TrialSpend(sample_rate=PLAN.sample_rate, noise_multiplier=PLAN.noise_multiplier, steps=400)
    with pytest.raises(PrivacyError, match="past its plan"):
        accountant.on_trial_result(0, [], TRIAL, {"dp_plan": PLAN.to_dict(), "dp_spent": ran.to_dict()})
    assert synced == [True]
    # The same search had every trial been allowed 400 steps: the trial's run covers the plan, so it is the base.
    as_ran = PrivacyAccountantCallback(RandomCountSearcher(PointMass(2), seed=0), delta=1e-5, plan=ran, verbose=False)
    as_ran.on_trial_start(0, [], TRIAL)
    expected = as_ran.account.guarantee().epsilon
    for account in (accountant.account, SearchJournal(journal_path).account()):
        assert account.guarantee().epsilon == pytest.approx(expected, rel=1e-12)
        assert account.guarantee().epsilon > 2 * planned  # 10× the steps: far above the plan's bound


def test_a_spend_past_the_plan_that_neither_covers_is_bounded_by_the_larger_curve_at_every_order():
    """A bare-curve report above the plan at one order only: the base is the pointwise maximum of the two."""
    accountant = callback()
    accountant.on_trial_result(0, [], TRIAL, {"dp_plan": GOOD_CURVE, "dp_spent": GOOD_CURVE})
    spent = {"orders": [2.0, 4.0], "epsilons": [0.05, 0.3]}
    with pytest.raises(PrivacyError, match="past its plan"):
        accountant.on_trial_result(0, [], TRIAL, {"dp_plan": GOOD_CURVE, "dp_spent": spent})
    reference = callback()  # the same search had the plan been the pointwise maximum
    envelope = {"orders": [2.0, 4.0], "epsilons": [0.1, 0.3]}
    reference.on_trial_result(0, [], TRIAL, {"dp_plan": envelope, "dp_spent": envelope})
    planned = callback()
    planned.on_trial_result(0, [], TRIAL, {"dp_plan": GOOD_CURVE, "dp_spent": GOOD_CURVE})
    assert accountant.account.guarantee().epsilon == pytest.approx(reference.account.guarantee().epsilon, rel=1e-12)
    assert accountant.account.guarantee().epsilon > planned.account.guarantee().epsilon


# ----------------------------------------------------------------------------- the budget as a hard cap


def capped(k=1, room=0, searcher=None):
    """A callback whose target leaves room for exactly ``room`` runs at the plan beside the K-run search."""
    from ray_dptune.accounting.bookkeeping.account import SearchAccount
    from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism

    selection = SearchAccount(
        SearchMechanism.random_count(law=PointMass(k), num_trials=k), delta=1e-5, plan=PLAN.to_dict()
    )
    target = selection.guarantee(extra_charges=room).epsilon * 1.001
    assert selection.guarantee(extra_charges=room + 1).epsilon > target
    searcher = searcher or RandomCountSearcher(PointMass(k), seed=0)
    return PrivacyAccountantCallback(searcher, delta=1e-5, plan=PLAN, target_epsilon=target, verbose=False)


def test_a_failed_run_is_covered_and_its_retry_is_charged_before_it_can_start():
    from ray_dptune import BudgetExceededError

    accountant = capped(k=1, room=0)
    accountant.on_trial_start(0, [], TRIAL)
    accountant.on_trial_error(0, [], TRIAL)  # no retry: the run is the K = 1 run, output "failed"
    assert accountant.account.charged_attempts(if_stopped_now=True) == 0
    with pytest.raises(PrivacyError, match="a failed run is final"):
        accountant.on_trial_start(0, [], TRIAL)  # a re-run of a failed run (resume_errored): refused, not journaled
    assert [a["state"] for a in accountant.account.attempts_of("t1")] == ["failed"]
    roomy = capped(k=1, room=1)  # room for one more run at the plan
    roomy.on_trial_start(0, [], TRIAL)
    roomy.on_trial_recover(0, [], TRIAL)  # Tune re-queues it: charged now, before the retry starts
    assert roomy.account.charged_attempts(if_stopped_now=True) == 1
    roomy.on_trial_start(0, [], TRIAL)
    assert roomy.account.charged_attempts() == 1  # the retry itself is the covered run
    with pytest.raises(BudgetExceededError, match="Retrying this trial"):  # no controller: the refusal is raised
        roomy.on_trial_recover(0, [], TRIAL)  # a second retry: no room left
    assert roomy.account.attempts_of("t1")[-1]["refused"]  # recorded as refused (a final failed run), not charged
    assert roomy.account.charged_attempts(if_stopped_now=True) == 1
    assert not roomy.report().complete and roomy.report().trials["t1"]["state"] == "refused"


def test_a_retry_refused_in_a_run_leaves_the_refusal_as_the_trial_s_error(tmp_path, monkeypatch):
    from ray import cloudpickle

    from ray_dptune import BudgetExceededError
    from ray_dptune.tune import guard

    steps = []
    controller = SimpleNamespace(
        stop_trial=lambda trial: steps.append("stopped"), _set_trial_status=lambda trial, status: steps.append(status)
    )
    monkeypatch.setattr(guard, "running_controller", lambda: controller)
    error_file = tmp_path / "error.pkl"
    error_file.write_bytes(cloudpickle.dumps(RuntimeError("the crash")))  # what Tune pickled from the worker
    trial = SimpleNamespace(
        trial_id="t1", config={}, pickled_error_file=str(error_file), handle_error=lambda e: steps.append("handled")
    )
    accountant = capped(k=1, room=0)
    accountant.on_trial_start(0, [], trial)
    accountant.on_trial_recover(0, [], trial)  # Tune would retry it: no room, so the trial ends in error
    assert steps == ["stopped", "ERROR", "handled"]
    assert isinstance(cloudpickle.loads(error_file.read_bytes()), BudgetExceededError)  # Result.error


def test_targets_are_validated_where_they_are_given():
    searcher = RandomCountSearcher(PointMass(2), seed=0)
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="target_epsilon"):
            PrivacyAccountantCallback(searcher, delta=1e-5, plan=PLAN, target_epsilon=bad)
    with pytest.raises(ValueError, match="target_epsilon needs plan="):
        PrivacyAccountantCallback(searcher, delta=1e-5, target_epsilon=1.5)
    with pytest.raises(PrivacyError, match=r"above target_epsilon = 0.5 before any trial"):
        PrivacyAccountantCallback(searcher, delta=1e-5, plan=PLAN, target_epsilon=0.5)


def test_a_stopped_attempt_is_interrupted_the_search_incomplete_and_a_rerun_charged():
    accountant = capped(k=2, room=1)
    accountant.on_trial_start(0, [], TRIAL)
    accountant.on_experiment_end([])  # Ctrl-C: the live driver records what it stopped
    report = accountant.report()
    assert report.trials["t1"]["state"] == "interrupted" and not report.complete
    assert "1 of its 2 trials" in report.incomplete_reason and "stopped before they ended" in report.incomplete_reason
    assert accountant.account.charged_attempts(if_stopped_now=True) == 0 and report.target["held"]
    accountant.on_trial_start(0, [], TRIAL)  # a restore re-runs it: the interrupted attempt is charged
    assert accountant.account.charged_attempts() == 1


def test_a_refused_suggestion_is_not_counted_by_the_searcher():
    """Else a search cut short by the budget would look complete (truncated K)."""
    from ray_dptune import BudgetExceededError

    searcher = RandomCountSearcher(PointMass(1), seed=0)
    searcher.set_search_properties("score", "max", {"x": 0.5})
    accountant = capped(k=1, room=0, searcher=searcher)
    accountant.on_trial_start(0, [], SimpleNamespace(trial_id="lost", config={}))  # a trial Tune lost track of
    with pytest.raises(BudgetExceededError, match="A new trial"):
        searcher.suggest("new")  # beyond K = 1: charged, past the budget
    assert not searcher.finished and "new" not in accountant.account.trials


@pytest.mark.parametrize("scale, admitted", [(1.0 - 1e-9, False), (1.0, True)], ids=["just-below", "exactly"])
def test_the_cap_is_exact_at_its_edge(scale, admitted):
    """A retry whose charge reaches the target exactly is admitted; one that passes it by 1e-9 is refused."""
    from ray_dptune import BudgetExceededError
    from ray_dptune.accounting.bookkeeping.account import SearchAccount
    from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism

    account = SearchAccount(
        SearchMechanism.random_count(law=PointMass(1), num_trials=1), delta=1e-5, plan=PLAN.to_dict()
    )
    after_retry = account.guarantee(extra_charges=1).epsilon
    accountant = PrivacyAccountantCallback(
        RandomCountSearcher(PointMass(1), seed=0),
        delta=1e-5,
        plan=PLAN,
        target_epsilon=after_retry * scale,
        verbose=False,
    )
    accountant.on_trial_start(0, [], TRIAL)
    if admitted:
        accountant.on_trial_recover(0, [], TRIAL)
        assert accountant.account.guarantee().epsilon == after_retry
    else:
        with pytest.raises(BudgetExceededError):
            accountant.on_trial_recover(0, [], TRIAL)


def test_report_times_are_iso_utc_and_a_previous_schema_s_unix_seconds_read_as_such():
    import datetime

    from ray_dptune.records.report import PrivacyReport

    accountant = capped(k=1, room=0)
    accountant.setup()
    report = accountant.report()
    for moment in (report.started_at, report.ended_at):
        parsed = datetime.datetime.fromisoformat(moment)
        assert parsed.tzinfo == datetime.timezone.utc
        assert abs((datetime.datetime.now(datetime.timezone.utc) - parsed).total_seconds()) < 60
    older = {**report.to_dict(), "schema_version": 3, "started_at": 0.0, "ended_at": 86400.5}
    read = PrivacyReport.from_dict(older)
    assert (read.started_at, read.ended_at) == ("1970-01-01T00:00:00+00:00", "1970-01-02T00:00:00+00:00")


def test_a_refusal_counts_only_when_its_error_file_is_this_attempt_s(tmp_path):
    import os

    from ray import cloudpickle

    from ray_dptune.errors import RefusedBeforeTraining
    from ray_dptune.tune.guard import refusal_before_training

    error_file = tmp_path / "error.pkl"
    error_file.write_bytes(cloudpickle.dumps(RefusedBeforeTraining("sample_rate past the plan")))
    written = os.path.getmtime(error_file)
    trial = SimpleNamespace(pickled_error_file=str(error_file))
    assert refusal_before_training(trial, since=written - 1.0) == "sample_rate past the plan"
    assert refusal_before_training(trial, since=written + 1.0) is None  # an earlier attempt's file
    assert refusal_before_training(trial, since=None) is None  # an attempt this driver did not see start
    error_file.write_bytes(cloudpickle.dumps(RuntimeError("a crash")))
    assert refusal_before_training(trial, since=written - 1.0) is None
