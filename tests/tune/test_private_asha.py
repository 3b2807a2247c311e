"""Private successive halving: the rungs, the budgeted account, and the scheduler in Ray Tune."""

from __future__ import annotations

import fcntl
import json
import os
import pickle

import numpy as np
import pytest
from ray import tune
from ray.tune.schedulers import ASHAScheduler

from ray_dptune import (
    PointMass,
    PrivacyAccountantCallback,
    PrivacyError,
    PrivateASHAScheduler,
    RandomCountSearcher,
    TrialSpend,
    private_tune_config,
    release_best,
)
from ray_dptune.accounting.bookkeeping.account import SearchAccount
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.records.journal import SearchJournal
from ray_dptune.search.rungs import Rungs

DELTA = 1e-5
PLAN = TrialSpend(sample_rate=0.05, noise_multiplier=1.2, steps=60)  # 3 units of 20 steps
MAX_T = 3
SPACE = {"x": tune.uniform(0.0, 1.0)}


# ----------------------------------------------------------------------------- rungs


def test_milestones_follow_grace_period_times_eta_capped_at_max_t():
    assert Rungs(grace_period=1, reduction_factor=3, max_t=9).milestones == (1, 3, 9)
    assert Rungs(grace_period=2, reduction_factor=2, max_t=10).milestones == (2, 4, 8, 10)
    assert Rungs(grace_period=3, reduction_factor=4, max_t=3).milestones == (3,)
    rungs = Rungs(grace_period=1, reduction_factor=3, max_t=9)
    assert [rungs.next_milestone(t) for t in (0, 1, 2, 3, 8)] == [1, 3, 3, 9, 9]
    with pytest.raises(ValueError, match="reduction_factor"):
        Rungs(grace_period=1, reduction_factor=1, max_t=9)
    with pytest.raises(ValueError, match="max_t"):
        Rungs(grace_period=4, reduction_factor=2, max_t=3)


@pytest.mark.parametrize("mode", ["max", "min"])
def test_about_one_in_eta_goes_on_and_the_best_at_the_top_rung_is_released(mode):
    rungs = Rungs(grace_period=1, reduction_factor=3, max_t=9, mode=mode)
    sign = 1 if mode == "max" else -1
    scores = np.random.default_rng(0).permutation(300)
    promoted = [rungs.promotable(f"t{i}", 1, sign * float(s)) for i, s in enumerate(scores)]
    assert 0.3 < np.mean(promoted) < 0.4  # asynchronous: early arrivals go on more easily than 1/3
    ranked = sorted(range(300), key=lambda i: -scores[i])
    assert all(promoted[i] for i in ranked[:1])  # the best always goes on
    assert rungs.promotable("late", 1, sign * -1.0) is False
    assert rungs.promotable("nan", 1, float("nan")) is False
    rungs.promotable("t5", 3, sign * 2.0)
    rungs.promotable("t7", 3, sign * 5.0)
    assert rungs.best() == "t7" and rungs.reached("t7") == 3 and rungs.reached("t1") == 1


# ----------------------------------------------------------------------------- the account


def halving_account(budget_units=9, plan=PLAN):
    return SearchAccount(
        SearchMechanism.halving(budget_units=budget_units, max_t=MAX_T), delta=DELTA, plan=plan.to_dict()
    )


def charge(account, event):
    account.admit(event)
    account.apply(event)


@pytest.mark.slow
def test_the_guarantee_is_one_dp_sgd_run_of_the_budgets_steps():
    account = halving_account(budget_units=9)
    one_run = TrialSpend(sample_rate=0.05, noise_multiplier=1.2, steps=9 * 20).curve()
    assert one_run.mechanism is not None  # the exact profile of the composed steps is kept
    exact = one_run.mechanism.epsilon(delta=DELTA)  # dp_accounting's pessimistic PLD of the 180 steps
    assert exact < one_run.epsilon(delta=DELTA)
    assert account.guarantee().epsilon == pytest.approx(exact, rel=1e-12)
    three_trials = 3 * PLAN.curve()  # 9 units = 3 whole trials composed
    assert account.guarantee().epsilon <= three_trials.epsilon(delta=DELTA) + 1e-12


@pytest.mark.slow
def test_an_independent_accountant_agrees_on_the_budget():
    dp_accounting = pytest.importorskip("dp_accounting")
    account = halving_account(budget_units=9)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.2)), 9 * 20
    )
    rdp = dp_accounting.rdp.RdpAccountant().compose(event).get_epsilon(DELTA)
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4).compose(event).get_epsilon(DELTA)
    ours = account.guarantee().epsilon
    assert ours <= rdp  # below dp_accounting's RDP bound
    assert pld <= ours <= pld * 1.01  # its finer pessimistic PLD: ours (coarser, also pessimistic) is just above


def test_charges_add_up_and_a_charge_past_the_budget_is_refused_unrecorded():
    account = halving_account(budget_units=5)
    charge(account, {"type": "suggested", "trial_id": "a", "accounted": True, "units": 1})
    charge(account, {"type": "started", "trial_id": "a", "accounted": True})
    charge(account, {"type": "charged", "trial_id": "a", "units": 2})
    charge(account, {"type": "suggested", "trial_id": "b", "accounted": True, "units": 1})
    assert account.units_charged == 4 and account.units_of("a") == 3 and account.units_of("b") == 1
    before = account.guarantee().epsilon
    with pytest.raises(PrivacyError, match="past its budget of 5 units"):
        account.admit({"type": "charged", "trial_id": "b", "units": 2})
    assert account.units_charged == 4 and account.guarantee().epsilon == before
    spent = TrialSpend(sample_rate=0.05, noise_multiplier=1.2, steps=60).to_dict()
    assert account.within_charge("a", spent) is True
    assert account.within_charge("b", spent) is False  # b was paid for one unit (20 steps) only


def test_a_retried_or_restored_attempt_is_charged_again_up_to_its_segments_end():
    account = halving_account(budget_units=9)
    for event in (
        {"type": "suggested", "trial_id": "a", "accounted": True, "units": 1},
        {"type": "started", "trial_id": "a", "accounted": True},
        {"type": "charged", "trial_id": "a", "units": 2},
        {"type": "failed", "trial_id": "a"},
    ):
        charge(account, event)
    charge(account, {"type": "started", "trial_id": "a", "accounted": True})  # Tune retries it from its checkpoint
    assert account.units_charged == 6 and account.units_of("a") == 3
    account.restored()  # a new driver: nothing live is forgotten, nothing is charged twice more
    assert account.units_charged == 6
    charge(account, {"type": "started", "trial_id": "a", "accounted": True})  # a third run: 3 more, 9 in all
    assert account.units_charged == 9
    with pytest.raises(PrivacyError, match="past its budget of 9 units"):
        account.admit({"type": "started", "trial_id": "a", "accounted": True})


def test_the_journal_rebuilds_the_same_charges(tmp_path):
    account = halving_account(budget_units=9)
    journal = SearchJournal(tmp_path / "journal.db")
    journal.begin("s", {"mechanism": account.mechanism.to_dict(), "delta": DELTA, "plan": account.plan})
    events = [
        {"type": "suggested", "trial_id": "a", "accounted": True, "units": 1},
        {"type": "started", "trial_id": "a", "accounted": True},
        {"type": "charged", "trial_id": "a", "units": 2},
        {"type": "suggested", "trial_id": "b", "accounted": True, "units": 1},
    ]
    for event in events:
        charge(account, event)
        journal.append([event])
    rebuilt = journal.account()
    assert rebuilt.units_charged == 4 and rebuilt.units_of("a") == 3
    assert rebuilt.guarantee().epsilon == account.guarantee().epsilon


def test_a_charge_is_synced_to_disk_before_the_segment_may_run(tmp_path, request):
    journal = SearchJournal(tmp_path / "journal.db")
    journal.begin("s", {"mechanism": SearchMechanism.halving(budget_units=9, max_t=MAX_T).to_dict(), "delta": DELTA})
    synced = request.getfixturevalue("durable_syncs")
    journal.append([{"type": "charged", "trial_id": "a", "units": 2}])
    journal.append([{"type": "reported", "trial_id": "a", "spent": PLAN.to_dict()}])
    assert synced == [True, False]  # synchronous=FULL for the charge; a report may wait


def test_a_trial_that_ran_past_its_charge_is_charged_what_it_ran_even_past_the_budget():
    account = halving_account(budget_units=3)
    charge(account, {"type": "suggested", "trial_id": "a", "accounted": True, "units": 3})
    before = account.guarantee().epsilon
    over = TrialSpend(sample_rate=0.05, noise_multiplier=1.2, steps=5 * 20 - 7)  # 4.65 units: 5 charged
    assert account.within_charge("a", over.to_dict()) is False
    account.apply({"type": "reported", "trial_id": "a", "spent": over.to_dict()})
    assert account.units_of("a") == 5 and account.units_charged == 5
    ran = TrialSpend(sample_rate=0.05, noise_multiplier=1.2, steps=5 * 20).curve()
    assert account.guarantee().epsilon == pytest.approx(ran.mechanism.epsilon(delta=DELTA))
    assert account.guarantee().epsilon > before
    less_noise = TrialSpend(sample_rate=0.05, noise_multiplier=1.0, steps=20)  # not a number of units: whole plan
    account.apply({"type": "suggested", "trial_id": "b", "accounted": True, "units": 1})
    account.apply({"type": "reported", "trial_id": "b", "spent": less_noise.to_dict()})
    assert account.units_of("b") == MAX_T


@pytest.mark.slow
def test_the_callback_charges_a_trial_that_ran_past_its_charge_durably_before_it_stops_the_run(
    tmp_path, monkeypatch, request
):
    """A trial reporting units nobody paid for ran them: the journal (synced) charges them, then PrivacyError."""
    from types import SimpleNamespace

    asha = PrivateASHAScheduler(max_t=MAX_T, grace_period=1, budget_trials=1, space=SPACE, seed=0)
    asha.searcher.set_search_properties("score", "max", SPACE)
    journal_path = str(tmp_path / "journal.db")
    accountant = PrivacyAccountantCallback(
        asha.searcher, delta=DELTA, plan=PLAN, journal_path=journal_path, verbose=False
    )
    controller = SimpleNamespace(scheduler_alg=asha, search_alg=SimpleNamespace(searcher=asha.searcher))
    monkeypatch.setattr(
        "ray_dptune.tune.accountant.running_controller", lambda: controller
    )  # as TuneController runs it
    accountant.setup(num_samples=-1)
    trial = SimpleNamespace(trial_id="a", config=asha.searcher.suggest("a"))
    assert isinstance(asha.searcher.suggest("b"), dict)  # 2 of the budget's 3 units charged at suggestion
    accountant.on_trial_start(0, [], trial)
    paid = accountant.account.guarantee().epsilon  # the budget: one DP-SGD run of 3 units (60 steps)
    synced = request.getfixturevalue("durable_syncs")
    ran = TrialSpend(sample_rate=PLAN.sample_rate, noise_multiplier=PLAN.noise_multiplier, steps=60)  # 3 units
    with pytest.raises(PrivacyError, match="past the 1 time units charged"):
        accountant.on_trial_result(0, [], trial, {"dp_plan": PLAN.to_dict(), "dp_spent": ran.to_dict()})
    assert synced == [True]  # the overrun report was committed with synchronous=FULL
    replayed = SearchJournal(journal_path).account()
    assert replayed.units_of("a") == 3 and replayed.units_charged == 4  # past the budget: what ran
    four_units = TrialSpend(sample_rate=PLAN.sample_rate, noise_multiplier=PLAN.noise_multiplier, steps=80).curve()
    assert replayed.guarantee().epsilon == pytest.approx(four_units.mechanism.epsilon(delta=DELTA))
    assert replayed.guarantee().epsilon > paid


@pytest.mark.slow
def test_a_spend_no_number_of_units_covers_is_composed_whole_into_the_brackets_run():
    """A trial that ran at a smaller σ than the plan's: its whole run is added to the budget's."""
    account = SearchAccount(SearchMechanism.halving(budget_units=6, max_t=MAX_T), delta=DELTA, plan=PLAN.to_dict())
    account.apply({"type": "suggested", "trial_id": "a", "accounted": True, "units": 1})
    budget = account.guarantee().epsilon
    louder = TrialSpend(sample_rate=PLAN.sample_rate, noise_multiplier=0.8, steps=20)
    account.apply({"type": "reported", "trial_id": "a", "spent": louder.to_dict(), "overrun": True})
    six_units = TrialSpend(**{**vars(PLAN), "steps": 120}).curve()
    expected = (six_units + louder.curve()).epsilon(delta=DELTA)
    assert account.guarantee().epsilon == pytest.approx(expected, rel=1e-9)
    assert account.guarantee().epsilon > budget


def test_a_spend_outside_every_bracket_is_composed_on_top_of_the_brackets_selection():
    """A Tune-started trial (no bracket) ran once, outside the K brackets: never folded into P&S's base."""
    from ray_dptune import Poisson

    plan = TrialSpend(sample_rate=1.0, noise_multiplier=20.0, steps=MAX_T)
    louder = TrialSpend(sample_rate=1.0, noise_multiplier=2.0, steps=1)  # another σ: no number of units covers it
    mechanism = SearchMechanism.halving(budget_units=MAX_T, max_t=MAX_T, law=Poisson(0.01), num_brackets=0)
    account = SearchAccount(mechanism, delta=DELTA, plan=plan.to_dict())
    account.apply({"type": "started", "trial_id": "x", "accounted": True})
    account.apply({"type": "reported", "trial_id": "x", "spent": louder.to_dict(), "overrun": True})
    assert account.guarantee().epsilon >= louder.curve().mechanism.epsilon(delta=DELTA)  # at least what x ran alone
    assert account.guarantee().epsilon >= (louder.curve() + plan.curve()).epsilon(delta=DELTA) * (1 - 1e-12)


def test_a_plan_that_does_not_split_into_max_t_units_is_refused():
    account = SearchAccount(
        SearchMechanism.halving(budget_units=6, max_t=4),
        delta=DELTA,
        plan=TrialSpend(**{**vars(PLAN), "steps": 30}).to_dict(),
    )
    with pytest.raises(ValueError, match="do not split into max_t = 4"):
        account.guarantee()


# ----------------------------------------------------------------------------- the scheduler, without Ray


class FakeTrial:
    def __init__(self, trial_id):
        self.trial_id = trial_id


def attached(scheduler):
    account = SearchAccount(scheduler.searcher.privacy_mechanism(), delta=DELTA, plan=PLAN.to_dict())
    scheduler.searcher.attach_recorder(lambda event: charge(account, event))
    scheduler.searcher.attach_account(lambda: account)
    scheduler.searcher.set_search_properties("score", "max", SPACE)
    scheduler.set_search_properties("score", "max")
    return account


def test_the_scheduler_spends_its_budget_exactly_and_never_more():
    scheduler = PrivateASHAScheduler(max_t=MAX_T, grace_period=1, reduction_factor=3, budget_trials=3, seed=0)
    account = attached(scheduler)
    ran, rng = {}, np.random.default_rng(1)
    for n in range(100):
        config = scheduler.searcher.suggest(f"t{n}")
        if config == "FINISHED":
            break
        trial, score = FakeTrial(f"t{n}"), float(rng.random())
        for time in range(1, MAX_T + 1):
            ran[trial.trial_id] = time  # the unit runs: it was paid for
            assert time <= account.units_of(trial.trial_id)
            if scheduler.on_trial_result(None, trial, {"training_iteration": time, "score": score}) == "STOP":
                break
    assert sum(ran.values()) == account.units_charged == 9  # the budget, spent to the last unit
    assert max(ran.values()) == MAX_T and min(ran.values()) == 1  # some went on, some stopped
    assert scheduler.searcher.privacy_details()["released_trial_id"] in {t for t, u in ran.items() if u == MAX_T}


def test_the_searcher_state_keeps_the_rungs_and_the_draws():
    scheduler = PrivateASHAScheduler(max_t=MAX_T, budget_trials=3, seed=0)
    attached(scheduler)
    first = scheduler.searcher.suggest("t0")
    scheduler.on_trial_result(None, FakeTrial("t0"), {"training_iteration": 1, "score": 0.5})
    state = pickle.loads(pickle.dumps(scheduler.searcher.get_state()))
    again = PrivateASHAScheduler(max_t=MAX_T, budget_trials=3, seed=1)
    attached(again)
    again.searcher.set_state(state)
    assert again.rungs.state() == scheduler.rungs.state() == {"1": {"t0": 0.5}, "3": {}}
    assert again.searcher.suggest("t1") == scheduler.searcher.suggest("t1") != first
    assert again.searcher.suggested_by_this_driver == {"t1"}  # a restored driver resumes none of the old trials


def test_random_count_over_brackets_is_p_and_s_over_one_bracket_with_its_own_budget():
    from ray_dptune import Poisson, repeat_and_select

    law = Poisson(2)
    mechanism = SearchMechanism.halving(budget_units=3, max_t=MAX_T, law=law, num_brackets=4)
    account = SearchAccount(mechanism, delta=DELTA, plan=PLAN.to_dict())
    bracket = TrialSpend(sample_rate=0.05, noise_multiplier=1.2, steps=3 * 20).curve()  # 3 units of 20 steps
    assert account.guarantee().epsilon == pytest.approx(repeat_and_select(bracket, law).epsilon(delta=DELTA))
    charge(account, {"type": "suggested", "trial_id": "a", "accounted": True, "units": 1, "bracket": 0})
    charge(account, {"type": "charged", "trial_id": "a", "units": 2})
    charge(account, {"type": "suggested", "trial_id": "b", "accounted": True, "units": 1, "bracket": 1})
    with pytest.raises(PrivacyError, match="bracket 0 past its budget of 3"):
        account.admit({"type": "suggested", "trial_id": "c", "accounted": True, "units": 1, "bracket": 0})
    charge(account, {"type": "charged", "trial_id": "b", "units": 2})  # bracket 1 has its own budget
    assert (account.bracket_units(0), account.bracket_units(1), account.units_charged) == (3, 3, 6)
    with pytest.raises(ValueError, match="needs the law"):
        SearchMechanism.halving(budget_units=3, max_t=MAX_T, num_brackets=2)


def test_brackets_decide_from_their_own_scores_and_the_best_winner_is_released():
    from ray_dptune import PointMass

    scheduler = PrivateASHAScheduler(max_t=MAX_T, budget_trials=2, repetitions=PointMass(3), seed=0)
    account = attached(scheduler)
    reached, bracket_of = {}, {}
    scores = [0.9, 0.8, 0.7, 0.1, 0.2, 0.3, 0.5, 0.4, 0.45] + [0.0] * 20
    for n, score in enumerate(scores):
        if scheduler.searcher.suggest(f"t{n}") == "FINISHED":
            break
        bracket_of[f"t{n}"] = len(scheduler.searcher.rungs) - 1
        for time in range(1, MAX_T + 1):
            reached[f"t{n}"] = time
            if (
                scheduler.on_trial_result(None, FakeTrial(f"t{n}"), {"training_iteration": time, "score": score})
                == "STOP"
            ):
                break
    assert scheduler.searcher.num_brackets == 3 and len(scheduler.searcher.rungs) == 3
    assert [account.bracket_units(b) for b in range(3)] == [6, 6, 6]  # each bracket spends its own budget
    firsts = [min((t for t in bracket_of if bracket_of[t] == b), key=lambda t: int(t[1:])) for b in range(3)]
    assert all(reached[t] == MAX_T for t in firsts)  # the first in each bracket runs on: no other bracket's scores
    assert scheduler.searcher.privacy_details()["released_trial_id"] == "t0"  # 0.9, bracket 0's winner
    assert "released output only" in scheduler.searcher.coverage


def test_a_trial_the_searcher_never_suggested_is_stopped_not_ranked():
    scheduler = PrivateASHAScheduler(max_t=MAX_T, budget_trials=3, seed=0)
    account = attached(scheduler)
    account.apply({"type": "started", "trial_id": "stranger", "accounted": True})  # charged its whole plan
    result = {"training_iteration": MAX_T, "score": 1.0}
    assert scheduler.on_trial_result(None, FakeTrial("stranger"), result) == "STOP"
    assert scheduler.rungs.best() is None


def test_budget_and_knobs_are_checked_by_name():
    with pytest.raises(ValueError, match="budget_trials"):
        PrivateASHAScheduler(max_t=3, budget_trials=0.5)  # 1.5 units
    with pytest.raises(ValueError, match="grace_period"):
        PrivateASHAScheduler(max_t=3, budget_trials=1, grace_period=0)
    with pytest.raises(RuntimeError, match="PrivacyAccountantCallback"):
        PrivateASHAScheduler(max_t=3, budget_trials=1, space=SPACE).searcher.suggest("t")


def test_the_guard_pairs_the_scheduler_with_its_own_searcher_only():
    asha = PrivateASHAScheduler(max_t=3, budget_trials=2, metric="score", mode="max")
    assert private_tune_config(asha.searcher).scheduler is asha
    with pytest.raises(PrivacyError, match="Pass that PrivateASHAScheduler"):
        private_tune_config(asha.searcher, scheduler=ASHAScheduler())
    other = RandomCountSearcher(PointMass(2), metric="score", mode="max")
    with pytest.raises(PrivacyError, match="search_alg=scheduler.searcher"):
        private_tune_config(other, scheduler=asha)
    with pytest.raises(PrivacyError, match="PrivateASHAScheduler"):
        private_tune_config(other, scheduler=ASHAScheduler())


# ----------------------------------------------------------------------------- in Ray Tune


def halving_trainable(config):
    """Reports once per time unit; logs (fsync'd) each unit before it runs: what really ran.

    The n-th trial to start scores 1 - n/100 (later trials rank lower, so most stop at the
    first milestone); the second one fails during its first unit.
    """
    from kill_driver import side_log

    trial_id = tune.get_context().get_trial_id()
    side = config["side_file"]
    order = start_order(side, trial_id)
    for time in range(1, MAX_T + 1):
        if time > 1:
            side_log(side, f"unit {trial_id} {time}")
        if order == 1:
            raise RuntimeError("a trial that fails mid-segment")
        spent = TrialSpend(sample_rate=PLAN.sample_rate, noise_multiplier=PLAN.noise_multiplier, steps=20 * time)
        tune.report({"score": 1.0 - order / 100, "dp_plan": PLAN.to_dict(), "dp_spent": spent.to_dict()})


def start_order(side: str, trial_id: str) -> int:
    """How many trials started before this one; logs its first unit. Under a lock: two trials start at once."""
    from kill_driver import side_log

    with open(side, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the handle closes
        handle.seek(0)
        order = len({line.split()[1] for line in handle.read().splitlines()})
        side_log(side, f"unit {trial_id} 1")
    return order


def tune_halving(tmp_path, name, asha):
    """Runs ``halving_trainable`` under ``asha`` in Tune (2 at a time); returns the results and the side file."""
    side = tmp_path / f"{name}.side"
    accountant = PrivacyAccountantCallback(asha.searcher, delta=DELTA, plan=PLAN, verbose=False)
    results = tune.Tuner(
        halving_trainable,
        param_space={**SPACE, "side_file": str(side)},
        tune_config=private_tune_config(asha.searcher, metric="score", mode="max", max_concurrent_trials=2),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name=name, callbacks=[accountant], verbose=0),
    ).fit()
    return results, side


@pytest.mark.usefixtures("ray_session")
def test_in_tune_the_reported_epsilon_is_the_composition_of_every_unit_that_ran(tmp_path):
    asha = PrivateASHAScheduler(max_t=MAX_T, grace_period=1, reduction_factor=3, budget_trials=4, seed=3)
    results, side = tune_halving(tmp_path, "asha", asha)
    lines = [line.split() for line in side.read_text().splitlines()]
    ran = len(lines)
    assert ran == 4 * MAX_T  # the budget was spent to the last unit, failed trials' units included
    reached = {trial: max(int(t) for _, other, t in lines if other == trial) for _, trial, _ in lines}
    assert max(reached.values()) == MAX_T and sorted(reached.values()).count(1) >= 5  # most stopped at 1
    assert sum(result.error is not None for result in results) == 1
    report = json.loads((tmp_path / "asha" / "privacy_report.json").read_text())
    composed = TrialSpend(sample_rate=0.05, noise_multiplier=1.2, steps=20 * ran).curve().mechanism.epsilon(delta=DELTA)
    assert report["guarantee"]["epsilon"] == pytest.approx(composed, rel=1e-12)
    released = release_best(results)
    finished = [r for r in results if r.metrics.get("training_iteration") == MAX_T]
    assert released.score == max(r.metrics["score"] for r in finished)
    assert report["details"]["units_charged"] == ran and report["details"]["budget_units"] == ran


@pytest.mark.usefixtures("ray_session")
def test_in_tune_brackets_are_accounted_by_random_count_over_one_bracket(tmp_path):
    from ray_dptune import PointMass, repeat_and_select

    asha = PrivateASHAScheduler(max_t=MAX_T, budget_trials=1, repetitions=PointMass(2), seed=3)
    results, side = tune_halving(tmp_path, "brackets", asha)
    report = json.loads((tmp_path / "brackets" / "privacy_report.json").read_text())
    bracket = TrialSpend(sample_rate=0.05, noise_multiplier=1.2, steps=MAX_T * 20).curve()
    assert report["guarantee"]["epsilon"] == pytest.approx(
        repeat_and_select(bracket, PointMass(2)).epsilon(delta=DELTA)
    )
    assert len(side.read_text().splitlines()) <= report["details"]["units_charged"] == 2 * MAX_T
    assert report["details"]["brackets"] == 2
    assert release_best(results).config["x"] in {r.config["x"] for r in results}


@pytest.mark.usefixtures("ray_session")
def test_plain_asha_under_a_dp_searcher_is_refused_before_any_trial_on_legacy_tune_run(tmp_path):
    side = tmp_path / "side.log"
    searcher = RandomCountSearcher(PointMass(2), metric="score", mode="max", seed=0)
    with pytest.raises(Exception, match="PrivateASHAScheduler") as error:
        tune.run(
            halving_trainable,
            config={**SPACE, "side_file": str(side)},
            search_alg=searcher,
            scheduler=ASHAScheduler(),
            num_samples=-1,
            storage_path=str(tmp_path),
            callbacks=[PrivacyAccountantCallback(searcher, delta=DELTA, plan=PLAN, verbose=False)],
            verbose=0,
        )
    assert "AsyncHyperBandScheduler stops or pauses trials" in str(error.value)
    assert not os.path.exists(side)  # no trial ever started


@pytest.mark.usefixtures("ray_session")
def test_the_example_runs_from_the_readme_within_its_budget(tmp_path):
    import subprocess
    import sys

    import ray

    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "private_asha.py")
    args = ["--epochs", "3", "--budget-trials", "2", "--seed", "0", "--storage", str(tmp_path)]
    environment = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    process = subprocess.run(
        [sys.executable, example, *args], check=False, env=environment, capture_output=True, text=True, timeout=600
    )
    assert process.returncode == 0, process.stderr[-3000:]
    assert "in all 6 of a budget of 6" in process.stdout
    report = json.loads((tmp_path / "dp_asha" / "privacy_report.json").read_text())
    assert 2.99 < report["guarantee"]["epsilon"] <= 3.0  # calibrated to the budget, never above it
    assert report["details"]["units_charged"] == 6
