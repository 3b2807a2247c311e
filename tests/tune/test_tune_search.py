"""Private random search in a real Ray Tune run (one shared local Ray session).

The trainables here report a DP-SGD spend record without training, so each trial
costs Ray's overhead only; tests/training/test_trainable.py covers real DP-SGD.
"""

import json
import os

import numpy as np
import pytest
from ray import tune
from ray.tune.schedulers import ASHAScheduler

from ray_dptune import (
    PointMass,
    Poisson,
    PrivacyAccountantCallback,
    PrivacyError,
    RandomCountSearcher,
    TrialSpend,
    private_tune_config,
    release_best,
    repeat_and_select,
)
from ray_dptune.records.report import REPORT_FILE

RAY = pytest.mark.usefixtures("ray_session")  # the tests that run Tune; the others are fast

PLAN = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=40)
SPACE = {"x": tune.uniform(0.0, 1.0), "width": tune.choice([1, 2, 3])}
DELTA = 1e-5


def fake_dp_trainable(config):
    """Reports a score and its spend after each of 4 'epochs' of 10 steps."""
    for epoch in range(1, 5):
        spent = TrialSpend(sample_rate=PLAN.sample_rate, noise_multiplier=PLAN.noise_multiplier, steps=10 * epoch)
        tune.report({"score": config["x"] + 0.01 * epoch, "dp_plan": PLAN.to_dict(), "dp_spent": spent.to_dict()})


def run(tmp_path, searcher, trainable=fake_dp_trainable, name="search", failure=None, **callback_args):
    callback = PrivacyAccountantCallback(searcher, delta=DELTA, **callback_args)
    tuner = tune.Tuner(
        trainable,
        param_space=SPACE,
        tune_config=private_tune_config(searcher, max_concurrent_trials=2),
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(tmp_path),
            callbacks=[callback],
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=failure or 0),
        ),
    )
    return tuner.fit(), callback


def _keys(record) -> list:
    """Every key of a nested JSON record."""
    if isinstance(record, dict):
        return [*record, *(key for value in record.values() for key in _keys(value))]
    return [key for value in record for key in _keys(value)] if isinstance(record, list) else []


def read_report(results):
    with open(os.path.join(results.experiment_path, REPORT_FILE)) as file:
        return json.load(file)


def seed_with(law, k):
    """A seed whose searcher draws K = k."""
    return next(s for s in range(10_000) if RandomCountSearcher(law, seed=s).num_trials == k)


@RAY
@pytest.mark.parametrize("k", [0, 1, 3])
def test_exactly_k_trials_run(tmp_path, k):
    law = Poisson(1.5)
    searcher = RandomCountSearcher(law, metric="score", mode="max", seed=seed_with(law, k))
    results, _ = run(tmp_path, searcher, name=f"k{k}")
    assert len(results) == k
    report = read_report(results)  # written for K = 0 too, where the experiment's storage is
    assert report["num_trials_planned"] == k == report["num_trials_started"]
    if k == 0:
        assert release_best(results).config == {}  # nothing ran: a data-independent release
    else:
        expected = repeat_and_select(PLAN.curve(), law).epsilon(delta=DELTA)
        assert report["guarantee"]["epsilon"] == pytest.approx(expected, rel=1e-12)
        assert report["guarantee"]["charged_attempts"] == 0
        assert all(len(t["attempts"]) == 1 for t in report["trials"].values())
        assert {t["attempts"][0]["state"] for t in report["trials"].values()} == {"completed"}


@RAY
def test_report_and_release_of_the_best_trial_only(tmp_path):
    searcher = RandomCountSearcher(PointMass(4), metric="score", mode="max", seed=7)
    results, _ = run(tmp_path, searcher, plan=PLAN)
    report = read_report(results)
    assert report["law"] == {"law": "point_mass", "k": 4}
    assert report["plan"] == PLAN.to_dict()
    assert report["seed"] == 7 and report["metric"] == "score" and report["mode"] == "max"
    assert "released output only" in report["covers"]
    assert report["score_privacy"].startswith("public validation data")
    assert report["guarantee"]["epsilon"] == pytest.approx((4 * PLAN.curve()).epsilon(delta=DELTA), rel=1e-12)
    for trial in report["trials"].values():
        assert trial["attempts"][0]["spent"] == PLAN.to_dict()

    assert next(iter(report)) == "operator_record" and "Keep it private" in report["operator_record"]
    scores = [r.metrics["score"] for r in results]
    with pytest.raises(PrivacyError, match="selection rule is part of the mechanism"):
        release_best(results, metric="score", mode="min")  # a rule chosen after seeing the results
    released = release_best(results, purge=True)
    assert released.score == max(scores)
    assert released.guarantee["epsilon"] == report["guarantee"]["epsilon"]
    statement = released.statement
    assert statement["guarantee"]["epsilon"] == report["guarantee"]["epsilon"]
    assert statement["released"] == {"config": released.config, "score": max(scores), "metric": "score", "mode": "max"}
    assert statement["procedure"]["mechanism"] == {
        "kind": "random_count",
        "params": {"law": {"law": "point_mass", "k": 4}, "density_ratio": 1.0},
    }
    published = json.dumps(statement)  # nothing about the other trials, their number or Tune's trial counter
    assert all(trial_id not in published for trial_id in report["trials"])
    assert not {"num_trials", "attempts", "charged_attempts", "spent_so_far", "state"} & set(_keys(statement))
    with open(os.path.join(results.experiment_path, "public_statement.json")) as file:
        assert json.load(file) == statement  # written beside the report, kept by the purge
    remaining = [
        d for d in os.listdir(results.experiment_path) if os.path.isdir(os.path.join(results.experiment_path, d))
    ]
    assert len(remaining) == 1  # the other trials' results are gone


@RAY
def test_a_failed_trial_is_one_of_the_runs_and_a_retry_is_refused_before_any_trial(tmp_path):
    started = tmp_path / "started"

    def fails(config):
        started.touch()
        spent = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=10)
        tune.report({"score": 0.0, "dp_plan": PLAN.to_dict(), "dp_spent": spent.to_dict()})
        raise RuntimeError("fails after touching the data")

    searcher = RandomCountSearcher(PointMass(1), metric="score", mode="max", seed=1)
    with pytest.raises(Exception, match=r"FailureConfig\(max_failures=1\) lets Tune re-run a trial"):
        run(tmp_path, searcher, fails, name="retried", failure=1)
    assert not started.exists()  # refused in the accountant's setup, before any trial
    searcher = RandomCountSearcher(PointMass(1), metric="score", mode="max", seed=1)
    results, _ = run(tmp_path, searcher, fails, name="failed", plan=PLAN)
    report = read_report(results)
    assert [a["state"] for a in next(iter(report["trials"].values()))["attempts"]] == ["failed"]
    # one run whose output is "failed": the selection bound over the plan, nothing composed on top
    assert report["guarantee"]["charged_attempts"] == 0
    assert report["guarantee"]["epsilon"] == pytest.approx(PLAN.curve().epsilon(delta=DELTA), rel=1e-9)


@RAY
def test_a_search_without_a_selection_rule_is_refused_before_any_trial(tmp_path):
    started = tmp_path / "started"

    def marked(config):
        started.touch()
        fake_dp_trainable(config)

    with pytest.raises(Exception, match="no selection rule"):  # metric and mode: neither searcher nor TuneConfig
        run(tmp_path, RandomCountSearcher(PointMass(2), seed=0), marked, plan=PLAN)
    assert not started.exists()


@RAY
def test_spending_above_the_plan_stops_the_search(tmp_path):
    def greedy(config):
        tune.report(
            {
                "score": 1.0,
                "dp_plan": PLAN.to_dict(),
                "dp_spent": TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=41).to_dict(),
            }
        )

    with pytest.raises(Exception, match="past its plan: steps 41"):
        run(tmp_path, RandomCountSearcher(PointMass(1), metric="score", mode="max", seed=1), greedy)
    # It ran 41 steps: the journal, read back after the stop, charges them (not the plan's 40).
    from ray_dptune.accounting.bookkeeping.account import SearchAccount
    from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
    from ray_dptune.records.journal import JOURNAL_FILE, SearchJournal

    def planned(plan):
        return SearchAccount(
            SearchMechanism.random_count(law=PointMass(1), num_trials=1), delta=DELTA, plan=plan.to_dict()
        )

    ran = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=41)
    journaled = SearchJournal(str(tmp_path / "search" / JOURNAL_FILE)).account().guarantee().epsilon
    assert journaled == pytest.approx(planned(ran).guarantee().epsilon, rel=1e-12)
    assert journaled > planned(PLAN).guarantee().epsilon


@RAY
def test_a_result_without_a_privacy_report_stops_the_search(tmp_path):
    def silent(config):
        tune.report({"score": 1.0})

    with pytest.raises(Exception, match="without a valid 'dp_plan'"):
        run(tmp_path, RandomCountSearcher(PointMass(1), metric="score", mode="max", seed=1), silent)


@RAY
def test_a_plan_above_the_target_is_refused_before_training(tmp_path):
    ran = tmp_path / "ran"

    def touch(config):
        ran.touch()
        fake_dp_trainable(config)

    with pytest.raises(Exception, match="above target_epsilon"):
        run(tmp_path, RandomCountSearcher(Poisson(8), seed=1), touch, plan=PLAN, target_epsilon=0.5)
    assert not ran.exists()


@RAY
def test_truncating_k_is_refused(tmp_path):
    searcher = RandomCountSearcher(PointMass(5), metric="score", mode="max", seed=1)
    tuner = tune.Tuner(
        fake_dp_trainable,
        param_space=SPACE,
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=2),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), verbose=0, callbacks=[PrivacyAccountantCallback(searcher, delta=DELTA)]
        ),
    )
    with pytest.raises(Exception, match="num_samples=-1"):
        tuner.fit()
    with pytest.raises(PrivacyError, match="num_samples"):
        private_tune_config(searcher, num_samples=3)


@RAY
def test_adaptive_early_stopping_is_refused(tmp_path):
    searcher = RandomCountSearcher(PointMass(2), metric="score", mode="max", seed=1)
    with pytest.raises(PrivacyError, match="AsyncHyperBandScheduler stops or pauses trials"):
        private_tune_config(searcher, scheduler=ASHAScheduler())

    def stopped_early(config):  # what ASHA does to a trial: it ends before its plan
        tune.report(
            {
                "score": 1.0,
                "dp_plan": PLAN.to_dict(),
                "dp_spent": TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=10).to_dict(),
            }
        )

    with pytest.raises(Exception, match="stopped early"):
        run(tmp_path, searcher, stopped_early)


def test_searcher_restores_k_and_its_random_stream():
    searcher = RandomCountSearcher(Poisson(20), metric="score", mode="max", space=SPACE)
    first = [searcher.suggest(f"t{i}") for i in range(3)]
    state = searcher.get_state()
    again = RandomCountSearcher(Poisson(20), seed=0)
    again.set_state(state)
    assert again.num_trials == searcher.num_trials
    assert [again.suggest(f"t{i}") for i in range(3, 6)] == [searcher.suggest(f"t{i}") for i in range(3, 6)]
    assert first  # configurations come from the space
    assert all(0.0 <= c["x"] <= 1.0 and c["width"] in (1, 2, 3) for c in first)


def test_sampling_is_uniform_over_the_space():
    searcher = RandomCountSearcher(
        PointMass(4000), space={"x": tune.uniform(0, 1), "g": tune.grid_search([1, 2])}, seed=3
    )
    configs = [searcher.suggest(str(i)) for i in range(4000)]
    xs = np.array([c["x"] for c in configs])
    from scipy import stats

    assert stats.kstest(xs, "uniform").pvalue > 1e-3
    assert abs(np.mean([c["g"] == 1 for c in configs]) - 0.5) < 0.04
    assert searcher.suggest("last") == "FINISHED"


@RAY
def test_restore_keeps_k_and_does_not_rerun_finished_trials(tmp_path):
    """A fit that ends with an errored trial; Tuner.restore re-runs nothing, and refuses to retry the failed one."""
    marker = tmp_path / "second-trial-failed"
    starts = tmp_path / "starts"
    starts.mkdir()

    def breaks_once(config):
        (starts / f"{config['x']:.12f}-{len(list(starts.iterdir()))}").touch()
        if len(list(starts.iterdir())) == 2 and not marker.exists():
            marker.touch()
            raise RuntimeError("driver-side interruption of this trial")
        fake_dp_trainable(config)

    searcher = RandomCountSearcher(PointMass(3), metric="score", mode="max", seed=5)
    callback = PrivacyAccountantCallback(searcher, delta=DELTA, plan=PLAN)
    tuner = tune.Tuner(
        breaks_once,
        param_space=SPACE,
        tune_config=private_tune_config(searcher, max_concurrent_trials=1),
        run_config=tune.RunConfig(name="restore", storage_path=str(tmp_path), callbacks=[callback], verbose=0),
    )
    first = tuner.fit()
    assert sorted(r.error is not None for r in first) == [False, False, True]
    journal = tmp_path / "restore" / "privacy_journal.db"
    journal.rename(tmp_path / "elsewhere.db")
    with pytest.raises(Exception, match="journal .* is missing"):  # an empty account would under-count
        tune.Tuner.restore(str(tmp_path / "restore"), breaks_once).fit()
    (tmp_path / "elsewhere.db").rename(journal)

    with pytest.raises(Exception, match="a failed run is final"):  # a retry of the failed trial, by restore
        tune.Tuner.restore(str(tmp_path / "restore"), breaks_once, resume_errored=True).fit()
    with pytest.raises(Exception, match="never suggested"):  # the same, as a new trial from its configuration
        tune.Tuner.restore(str(tmp_path / "restore"), breaks_once, restart_errored=True).fit()
    assert len(list(starts.iterdir())) == 3  # both refused before anything started
    second = tune.Tuner.restore(str(tmp_path / "restore"), breaks_once).fit()
    assert len(second) == 3  # same K = 3, no new trial
    assert len(list(starts.iterdir())) == 3  # finished and failed trials are not re-run
    report = read_report(second)
    assert report["num_trials_planned"] == 3 == report["num_trials_started"] and report["complete"]
    states = sorted(tuple(a["state"] for a in t["attempts"]) for t in report["trials"].values())
    assert states == [("completed",), ("completed",), ("failed",)]
    # the failed run is one of the K = 3: the selection bound alone (a point mass: 3 runs composed)
    assert report["guarantee"]["epsilon"] == pytest.approx((3 * PLAN.curve()).epsilon(delta=DELTA), rel=1e-12)


@RAY
def test_restore_with_the_same_param_space_works_and_another_is_refused(tmp_path):
    searcher = RandomCountSearcher(PointMass(2), metric="score", mode="max", seed=3)
    first, _ = run(tmp_path, searcher, name="respace", plan=PLAN)
    path = str(tmp_path / "respace")
    again = tune.Tuner.restore(path, fake_dp_trainable, param_space=SPACE).fit()
    assert sorted(r.config["x"] for r in again) == sorted(r.config["x"] for r in first)  # nothing re-run
    other = {**SPACE, "x": tune.uniform(0.0, 2.0)}
    with pytest.raises(Exception, match="param_space that differs"):
        tune.Tuner.restore(path, fake_dp_trainable, param_space=other).fit()


@RAY
def test_end_to_end_with_dp_sgd_on_digits(tmp_path):
    """The user's workflow: dp_trainable + searcher + accountant + release, real Opacus training."""
    import torch

    from ray_dptune.training import digits_cnn, digits_data, dp_trainable

    trainable = dp_trainable(digits_cnn, digits_data, noise_multiplier=1.5, batch_size=128, epochs=2, seed=0)
    space = {"lr": tune.loguniform(0.3, 1.0), "max_grad_norm": tune.uniform(0.5, 2.0)}
    plan = trainable.privacy_plan(space)
    searcher = RandomCountSearcher(PointMass(2), metric="val_acc", mode="max", seed=11)
    callback = PrivacyAccountantCallback(searcher, delta=DELTA, plan=plan)
    tuner = tune.Tuner(
        trainable,
        param_space=space,
        tune_config=private_tune_config(searcher, max_concurrent_trials=2),
        run_config=tune.RunConfig(name="digits", storage_path=str(tmp_path), callbacks=[callback], verbose=0),
    )
    results = tuner.fit()
    assert len(results) == 2 and all(r.error is None for r in results)
    report = read_report(results)
    assert report["guarantee"]["epsilon"] == pytest.approx((2 * plan.curve()).epsilon(delta=DELTA), rel=1e-12)
    for trial in report["trials"].values():
        assert trial["attempts"][-1]["spent"] == plan.to_dict()  # every trial spent exactly its plan

    released = release_best(results)
    assert released.score == max(r.metrics["val_acc"] for r in results) > 0.3  # above chance (0.1)
    state = torch.load(os.path.join(released.checkpoint_path, "model.pt"), weights_only=True)
    digits_cnn().load_state_dict(state)  # the released checkpoint holds the trained model


@RAY
def test_the_ledger_composes_searches_on_one_dataset(tmp_path):
    from ray_dptune.records.ledger import PrivacyLedger

    ledger = PrivacyLedger(tmp_path / "ledger.db")
    law = PointMass(2)
    first, _ = run(
        tmp_path,
        RandomCountSearcher(law, metric="score", mode="max", seed=1),
        name="first",
        plan=PLAN,
        ledger=ledger,
        dataset="digits",
    )
    second, _ = run(
        tmp_path,
        RandomCountSearcher(law, metric="score", mode="max", seed=2),
        name="second",
        plan=PLAN,
        ledger=ledger,
        dataset="digits",
    )
    one_search = (2 * PLAN.curve()).epsilon(delta=DELTA)
    assert read_report(first)["guarantee"]["epsilon_dataset"] == pytest.approx(one_search, rel=1e-12)
    report = read_report(second)
    assert report["guarantee"]["epsilon"] == pytest.approx(one_search, rel=1e-12)
    assert report["guarantee"]["epsilon_dataset"] == pytest.approx((4 * PLAN.curve()).epsilon(delta=DELTA), rel=1e-12)
    assert len(ledger.searches("digits")) == 2
    # re-running until the results look good is accounted: a target on the dataset total refuses a third as
    # its accountant is built, before any Tune run (test_a_plan_above_the_target_is_refused_before_training
    # takes that refusal through Tuner.fit)
    with pytest.raises(PrivacyError, match="dataset 'digits'"):
        PrivacyAccountantCallback(
            RandomCountSearcher(law, seed=3),
            delta=DELTA,
            plan=PLAN,
            ledger=ledger,
            dataset="digits",
            target_epsilon=1.05 * report["guarantee"]["epsilon_dataset"],
        )
    assert len(ledger.searches("digits")) == 2  # the refused search left no record


def test_restoring_on_another_dataset_is_refused(tmp_path):
    from ray_dptune.records.ledger import PrivacyLedger

    ledger = PrivacyLedger(tmp_path / "ledger.db")
    searcher = RandomCountSearcher(PointMass(1), metric="score", mode="max", seed=1)
    callback = PrivacyAccountantCallback(searcher, delta=DELTA, plan=PLAN, ledger=ledger, dataset="digits")
    callback.setup(num_samples=-1)
    moved = PrivacyAccountantCallback(searcher, delta=DELTA, plan=PLAN, ledger=ledger, dataset="mnist")
    moved.set_state(callback.get_state())
    with pytest.raises(PrivacyError, match="recorded in the ledger on dataset 'digits'"):
        moved.setup(num_samples=-1)
