"""The budget is a promise: nothing runs or is released above the ε the user asked for.

Each scenario runs through the public API in a real Tune run (one shared Ray session);
the trainables append every attempt they start to a side file, so the tests compare the
report with what really ran. Interrupts send a real SIGINT to a driver process
(tests/budget_driver.py, forked by tests/driver_server.py).
"""

from __future__ import annotations

import json
import math
import os

import pytest
from kill_driver import side_log
from ray import tune
from ray.tune.search import ConcurrencyLimiter, Repeater

import ray_dptune
from ray_dptune import (
    PointMass,
    PrivacyAccountantCallback,
    PrivacyError,
    RandomCountSearcher,
    TrialSpend,
    private_tune_config,
    release_best,
)
from ray_dptune.accounting.bookkeeping.account import SearchAccount
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism

pytestmark = pytest.mark.usefixtures("ray_session")

DELTA = 1e-5
SAMPLE_RATE, STEPS = 0.05, 40
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the drivers are


def plan_for(sigma: float) -> TrialSpend:
    return TrialSpend(sample_rate=SAMPLE_RATE, noise_multiplier=sigma, steps=STEPS)


def _spends(config, epoch):
    plan = plan_for(config["noise_multiplier"])
    spent = TrialSpend(sample_rate=SAMPLE_RATE, noise_multiplier=plan.noise_multiplier, steps=10 * epoch)
    return {"dp_plan": plan.to_dict(), "dp_spent": spent.to_dict()}


def crash_once(config):
    """Each trial's first attempt crashes after its second report; its retry runs the whole plan."""
    trial_id = tune.get_context().get_trial_id()
    marker = os.path.join(config["folder"], f"crashed-{trial_id}")
    side_log(config["side_file"], f"start {trial_id}")
    for epoch in range(1, 5):
        tune.report({"score": config["x"], **_spends(config, epoch)})
        if epoch == 2 and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("crash mid-way")


def always_fails(config):
    side_log(config["side_file"], f"start {tune.get_context().get_trial_id()}")
    tune.report({"score": config["x"], **_spends(config, 1)})
    raise RuntimeError("fails after its first report")


def non_finite_scores(config):
    """Whichever trial starts first scores +inf, the second NaN, the rest a finite score."""
    claimed = next((name for name in ("inf", "nan") if _claim(config["folder"], name)), None)
    score = config["x"] if claimed is None else float(claimed)
    for epoch in range(1, 5):
        tune.report({"score": score, **_spends(config, epoch)})


def _claim(folder: str, name: str) -> bool:
    try:
        os.close(os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


def tuner(tmp_path, trainable, *, k=3, epsilon=4.0, run_config=None, **kwargs):
    side = tmp_path / "side.log"
    space = {"x": tune.uniform(0.0, 1.0), "side_file": str(side), "folder": str(tmp_path)}
    run_config = run_config or {}
    return ray_dptune.private_tuner(
        trainable,
        param_space=space,
        epsilon=epsilon,
        delta=DELTA,
        law=PointMass(k),
        plan_for=plan_for,
        metric="score",
        mode="max",
        tune_config=tune.TuneConfig(max_concurrent_trials=1),
        run_config=tune.RunConfig(name="search", storage_path=str(tmp_path), verbose=0, **run_config),
        verbose=False,
        **kwargs,
    ), side


def read_report(results) -> dict:
    with open(os.path.join(results.experiment_path, "privacy_report.json")) as file:
        return json.load(file)


def starts(side) -> list[str]:
    return [line.split()[1] for line in side.read_text().splitlines() if line.startswith("start")]


def epsilon_with(charged: int, *, k: int, sigma: float) -> float:
    """The account's ε of a PointMass(k) search with ``charged`` attempts composed on top (the truth to compare)."""
    account = SearchAccount(
        SearchMechanism.random_count(law=PointMass(k), num_trials=k), delta=DELTA, plan=plan_for(sigma).to_dict()
    )
    return account.guarantee(extra_charges=charged).epsilon


# ----------------------------------------------------------------------------- retries


@pytest.mark.parametrize("max_failures", [1, -1])
def test_tune_s_retries_are_refused_before_any_trial(tmp_path, max_failures):
    """A retry reveals that the attempt before it failed, which the selection bound does not cover."""
    with pytest.raises(PrivacyError, match="Leave max_failures at 0") as refusal:
        tuner(tmp_path, crash_once, run_config={"failure_config": tune.FailureConfig(max_failures=max_failures)})
    assert f"max_failures={max_failures}" in str(refusal.value)
    assert not (tmp_path / "side.log").exists() and not (tmp_path / "search").exists()  # nothing ran or was written


def test_failed_trials_are_never_released(tmp_path):
    built, side = tuner(tmp_path, always_fails)
    results = built.fit()
    report = read_report(results)
    assert len(starts(side)) == 3 and report["complete"]  # no retries: each failed run is one of the K
    assert report["guarantee"]["charged_attempts"] == 0 and report["guarantee"]["epsilon"] <= 4.0
    assert {trial["state"] for trial in report["trials"].values()} == {"failed"}
    with pytest.raises(PrivacyError, match="No trial ran its plan to the end"):
        release_best(results)


def test_nan_and_infinite_scores_are_never_the_best(tmp_path):
    results = tuner(tmp_path, non_finite_scores)[0].fit()
    scores = [r.metrics["score"] for r in results]
    assert sum(math.isinf(s) for s in scores) == 1 and sum(math.isnan(s) for s in scores) == 1
    released = release_best(results)
    assert math.isfinite(released.score) and released.score == max(s for s in scores if math.isfinite(s))


# ----------------------------------------------------------------------------- refused before any trial


def test_a_metric_stop_is_refused_before_any_trial_and_a_data_independent_one_runs(tmp_path):
    with pytest.raises(PrivacyError, match=r"stops trials on \['score'\]"):
        tuner(tmp_path, crash_once, run_config={"stop": {"score": 0.5}})
    searcher = RandomCountSearcher(PointMass(2), metric="score", mode="max", seed=0)
    callback = PrivacyAccountantCallback(searcher, delta=DELTA, plan=plan_for(1.0))
    run = tune.Tuner(
        crash_once,
        param_space={"x": 0.5, "noise_multiplier": 1.0, "side_file": str(tmp_path / "s"), "folder": str(tmp_path)},
        tune_config=private_tune_config(searcher),
        run_config=tune.RunConfig(
            name="metric-stop",
            storage_path=str(tmp_path),
            callbacks=[callback],
            stop=lambda trial_id, result: result["score"] > 0.3,
            verbose=0,
        ),
    )
    with pytest.raises(Exception, match="FunctionStopper may stop trials by reading their results"):
        run.fit()
    assert not os.path.exists(tmp_path / "s")  # no trial started
    built, _ = tuner(tmp_path / "iterations", non_finite_scores, run_config={"stop": {"training_iteration": 2}})
    report = read_report(built.fit())
    assert report["complete"] and all(t["attempts"][-1]["spent"]["steps"] == 20 for t in report["trials"].values())


def test_concurrency_limiter_is_accepted_and_repeater_refused_before_any_trial(tmp_path):
    searcher = RandomCountSearcher(PointMass(3), metric="score", mode="max", seed=1)
    limited = ConcurrencyLimiter(searcher, max_concurrent=2)
    callback = PrivacyAccountantCallback(limited, delta=DELTA, plan=plan_for(1.0), target_epsilon=20.0)
    space = {
        "x": tune.uniform(0, 1),
        "noise_multiplier": 1.0,
        "side_file": str(tmp_path / "s"),
        "folder": str(tmp_path),
    }
    results = tune.Tuner(
        non_finite_scores,
        param_space=space,
        tune_config=private_tune_config(limited),
        run_config=tune.RunConfig(name="limited", storage_path=str(tmp_path), callbacks=[callback], verbose=0),
    ).fit()
    report = read_report(results)
    assert len(results) == 3 and report["complete"] and report["guarantee"]["charged_attempts"] == 0
    assert report["guarantee"]["epsilon"] == pytest.approx(epsilon_with(0, k=3, sigma=1.0), rel=1e-9)
    repeated = Repeater(RandomCountSearcher(PointMass(3), seed=1), repeat=2)
    for build in (lambda: private_tune_config(repeated), lambda: PrivacyAccountantCallback(repeated, delta=DELTA)):
        with pytest.raises(PrivacyError, match="Repeater wraps the DP searcher"):
            build()


# ----------------------------------------------------------------------------- Ctrl-C


def _drive(drivers, tmp_path, *args):
    """tests/budget_driver.py as a driver process of its own (forked by tests/driver_server.py: conftest's ``drivers``)."""
    env = {**os.environ, "RAY_ADDRESS": _ray_address(), "PYTHONPATH": HERE}
    argv = [str(tmp_path), "search", str(tmp_path / "side.log"), *args]
    process = drivers.run("budget_driver", argv, env=env, timeout=300)
    lines = [line for line in process.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, process.stdout[-3000:] + process.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :]), process.stdout


def _ray_address() -> str:
    import ray

    return ray.get_runtime_context().gcs_address


@pytest.mark.parametrize("retries", [0, 2], ids=["no-headroom", "headroom"])
def test_ctrl_c_leaves_an_incomplete_search_that_resumes_only_within_its_budget(drivers, tmp_path, retries):
    _, printed = _drive(drivers, tmp_path, "--k", "6", "--retries", str(retries), "--interrupt-after", "2")
    report = json.loads((tmp_path / "search" / "privacy_report.json").read_text())
    assert not report["complete"] and "stopped before they ended" in report["incomplete_reason"]
    assert report["guarantee"]["epsilon"] <= 4.0 and report["target"]["held"]
    assert "search INCOMPLETE" in printed and "search done" not in printed
    with pytest.raises(PrivacyError, match="incomplete"):
        release_best(str(tmp_path / "search"))
    interrupted = sum(t["state"] == "interrupted" for t in report["trials"].values())
    assert interrupted >= 1
    resumed, printed = _drive(drivers, tmp_path, "--restore")
    report = json.loads((tmp_path / "search" / "privacy_report.json").read_text())
    if retries < interrupted:
        assert "cannot be resumed within its budget" in resumed["error"]
        assert not report["complete"]
    else:
        assert resumed["error"] is None and report["complete"] and report["target"]["held"]
        assert report["guarantee"]["charged_attempts"] == interrupted  # each re-run trial's first attempt
        assert release_best(str(tmp_path / "search")).state == "completed"
