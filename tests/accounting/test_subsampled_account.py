"""The account of a subsampled tuning: the tuning on the sample, amplified, composed with every final run."""

from __future__ import annotations

import pytest

from ray_dptune import BudgetExceededError, PointMass, Poisson, PrivacyError
from ray_dptune.accounting.bookkeeping.account import SearchAccount
from ray_dptune.accounting.bookkeeping.budget import SearchBudget
from ray_dptune.accounting.bookkeeping.calibrate import search_epsilon
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism, SubsampledTuningMechanism
from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.accounting.bounds.selection import repeat_and_select
from ray_dptune.accounting.bounds.subsampled_tuning import (
    dpsgd_run_pld,
    profile_points,
    subsampled_search_epsilon,
    subsampled_tuning_epsilon,
)

pytestmark = pytest.mark.slow  # each builds privacy loss distributions (seconds)

DELTA = 1e-5
TUNING = TrialSpend(sample_rate=0.4, noise_multiplier=6.0, steps=20)
FINAL = TrialSpend(sample_rate=0.04, noise_multiplier=1.3, steps=200)
RATE = 0.1
LAW = PointMass(3)


def mechanism(law=LAW, final=FINAL):
    return SearchMechanism.subsampled_tuning(law=law, num_trials=3, sample_rate=RATE, final_plan=final)


def account(**kwargs):
    return SearchAccount(mechanism(**kwargs), delta=DELTA, plan=TUNING.to_dict())


def run_tuning(account, count=3):
    for index in range(count):
        trial = f"t{index}"
        account.apply({"type": "suggested", "trial_id": trial, "accounted": True})
        account.apply({"type": "started", "trial_id": trial, "accounted": True})
        account.apply({"type": "reported", "trial_id": trial, "spent": TUNING.to_dict()})
        account.apply({"type": "completed", "trial_id": trial})


def final_runs_epsilon(*runs, law=LAW, extra_tuning=0):
    tuning = repeat_and_select(TUNING.curve(), law)
    if extra_tuning:
        tuning = tuning + extra_tuning * TUNING.curve()
    pld = dpsgd_run_pld(runs[0])
    for run in runs[1:]:
        pld = pld.compose(dpsgd_run_pld(run))
    return subsampled_tuning_epsilon(profile_points(tuning), sample_rate=RATE, final_run=pld, delta=DELTA)


def test_the_stated_guarantee_is_the_whole_procedures_before_and_after_the_search():
    fresh = account()
    stated = fresh.guarantee()
    assert stated.epsilon == subsampled_search_epsilon(
        tuning_curve=repeat_and_select(TUNING.curve(), PointMass(3)), sample_rate=RATE, final_plan=FINAL, delta=DELTA
    )
    run_tuning(fresh)
    fresh.apply({"type": "suggested", "trial_id": "final", "accounted": True, "final": True})
    fresh.apply({"type": "reported", "trial_id": "final", "spent": FINAL.to_dict()})
    fresh.apply({"type": "completed", "trial_id": "final"})
    assert fresh.guarantee().epsilon == stated.epsilon  # the final run was charged from the start
    # its parts: more than the final run alone, and the curve the ledger composes is a release
    alone = float(dpsgd_run_pld(FINAL).get_epsilon_for_delta(DELTA))
    assert alone < stated.epsilon and stated.curve is None
    assert (stated.release_epsilon, stated.release_delta) == (stated.epsilon, DELTA)


def test_the_bound_needs_the_final_run_and_the_amplification():
    """The account states more than the final run alone, and less than the tuning on all the data would cost."""
    stated = account().guarantee().epsilon
    assert stated == final_runs_epsilon(FINAL)
    assert stated > float(dpsgd_run_pld(FINAL).get_epsilon_for_delta(DELTA))
    points = profile_points(repeat_and_select(TUNING.curve(), PointMass(3)))
    unsampled = subsampled_tuning_epsilon(points, sample_rate=1.0, final_run=dpsgd_run_pld(FINAL), delta=DELTA)
    assert stated < unsampled - 1.0


def test_a_final_run_rerun_after_a_lost_driver_is_composed_again():
    whole = account()
    run_tuning(whole)
    whole.apply({"type": "started", "trial_id": "final", "accounted": True, "final": True})
    whole.restored()  # the driver died: the final run's fate is unknown
    whole.apply({"type": "started", "trial_id": "final", "accounted": True})
    assert whole.is_final("final") and whole.charged_attempts() == 0
    assert whole.guarantee().epsilon == final_runs_epsilon(FINAL, FINAL)
    assert whole.unfinished()["live"] == 1


def test_a_tuning_attempt_left_live_by_a_dead_driver_is_composed_on_the_sample():
    whole = account()
    run_tuning(whole, count=2)
    whole.apply({"type": "started", "trial_id": "t2", "accounted": True})
    whole.restored()
    whole.apply({"type": "started", "trial_id": "t2", "accounted": True})
    assert whole.charged_attempts() == 1
    assert whole.guarantee().epsilon == final_runs_epsilon(FINAL, extra_tuning=1)


def test_each_trial_is_held_to_its_own_plan():
    whole = account()
    run_tuning(whole)
    whole.apply({"type": "started", "trial_id": "final", "accounted": True, "final": True})
    assert whole.plan_of("t0") == TUNING.to_dict() and whole.plan_of("final") == FINAL.to_dict()
    longer = TrialSpend(sample_rate=0.04, noise_multiplier=1.3, steps=260)
    whole.apply({"type": "reported", "trial_id": "final", "spent": longer.to_dict()})
    assert whole.guarantee().epsilon == final_runs_epsilon(longer)  # bounded as it ran
    assert not whole.beyond_plan  # the tuning's plan is untouched by the final run's overrun


def test_a_final_run_refused_before_training_adds_no_run_and_a_spend_no_run_bounds_is_refused():
    whole = account()
    run_tuning(whole)
    whole.apply({"type": "started", "trial_id": "final", "accounted": True, "final": True})
    whole.apply({"type": "failed", "trial_id": "final", "untrained": "loader mismatch"})
    whole.apply({"type": "started", "trial_id": "final", "accounted": True})
    assert whole.guarantee().epsilon == final_runs_epsilon(FINAL)
    noisy_scores = TrialSpend(
        sample_rate=0.04, noise_multiplier=1.3, steps=200, score_noise_multiplier=5.0, score_releases=1
    )
    whole.apply({"type": "reported", "trial_id": "final", "spent": noisy_scores.to_dict()})
    with pytest.raises(Exception, match="no DP-SGD run bounds"):
        whole.guarantee()


def test_the_budget_pays_the_first_final_run_and_refuses_a_second():
    stated = search_epsilon(TUNING, delta=DELTA, mechanism=mechanism())
    whole = account()
    budget = SearchBudget(
        target_epsilon=stated, account=lambda: whole, total=lambda guarantee: guarantee.epsilon, scope="The search"
    )
    run_tuning(whole)
    first = {"type": "suggested", "trial_id": "final", "accounted": True, "final": True}
    budget.admit(first)
    whole.apply(first)
    whole.apply({"type": "started", "trial_id": "final", "accounted": True})
    whole.restored()
    with pytest.raises(BudgetExceededError):
        budget.admit({"type": "started", "trial_id": "final", "accounted": True})


def test_the_record_reads_back_and_its_public_definition_hides_k():
    record = mechanism(law=Poisson(8)).to_dict()
    again = SearchMechanism.from_dict(record)
    assert isinstance(again, SubsampledTuningMechanism) and again == mechanism(law=Poisson(8))
    assert again.final_plan == FINAL and not again.allows_retries
    assert "num_trials" not in again.public_definition()["params"]
    assert again.public_definition()["params"]["sample_rate"] == RATE


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sample_rate": 1.0}, "strictly between 0 and 1"),
        ({"sample_rate": 0.0}, "strictly between 0 and 1"),
        (
            {
                "final_plan": TrialSpend(
                    sample_rate=0.04, noise_multiplier=1.3, steps=10, score_noise_multiplier=2.0, score_releases=1
                )
            },
            "score releases",
        ),
    ],
)
def test_a_procedure_the_bound_does_not_cover_is_refused(kwargs, message):
    arguments = {"law": PointMass(2), "num_trials": 2, "sample_rate": 0.1, "final_plan": FINAL, **kwargs}
    with pytest.raises(ValueError, match=message):
        SearchMechanism.subsampled_tuning(**arguments)


def test_a_tuning_plan_with_noisy_scores_is_refused_it_is_not_on_the_sample():
    scored = TrialSpend(sample_rate=0.4, noise_multiplier=6.0, steps=20, score_noise_multiplier=2.0, score_releases=1)
    with pytest.raises(ValueError, match="not amplified"):
        SearchAccount(mechanism(), delta=DELTA, plan=scored.to_dict())


def test_a_report_of_a_trial_the_account_never_saw_is_bounded_as_a_final_run():
    whole = account()
    run_tuning(whole)
    whole.apply({"type": "reported", "trial_id": "stray", "spent": TUNING.to_dict()})
    assert whole.is_final("stray")
    widest = TrialSpend(sample_rate=TUNING.sample_rate, noise_multiplier=FINAL.noise_multiplier, steps=FINAL.steps)
    assert whole.guarantee().epsilon == final_runs_epsilon(widest)


def test_resuming_an_interrupted_final_run_is_priced_as_a_second_final_run():
    whole = account()
    run_tuning(whole)
    whole.apply({"type": "started", "trial_id": "final", "accounted": True, "final": True})
    whole.apply({"type": "interrupted", "trial_id": "final"})
    budget = SearchBudget(
        target_epsilon=whole.guarantee().epsilon, account=lambda: whole, total=lambda g: g.epsilon, scope="The search"
    )
    interrupted, resumed = budget.resume_epsilon()
    assert interrupted == 1 and resumed == final_runs_epsilon(FINAL, FINAL)
    with pytest.raises(PrivacyError, match="cannot be resumed"):
        budget.check_resumable()


def test_a_tuning_attempt_that_released_noisy_scores_past_its_plan_has_no_amplified_bound():
    whole = account()
    run_tuning(whole, count=2)
    scored = TrialSpend(sample_rate=0.4, noise_multiplier=6.0, steps=20, score_noise_multiplier=3.0, score_releases=2)
    whole.apply({"type": "started", "trial_id": "t2", "accounted": True})
    whole.apply({"type": "reported", "trial_id": "t2", "spent": scored.to_dict()})
    assert whole.guarantee().epsilon == float("inf")  # its scores were not on the sample: no discount by p
