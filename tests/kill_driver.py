"""A private search driver that SIGKILLs itself at a chosen instant (run by tests/tune/test_driver_kills.py).

    python tests/kill_driver.py STORAGE NAME SIDE_FILE --k K [--restore] [--kill EVENT:N] [--kill-after SECONDS]
                                [--ledger PATH] [--digits] [--dphypo] [--asha]

It connects to the Ray cluster at $RAY_ADDRESS (the tests' shared session). The trainable
appends ``start <trial id>`` to SIDE_FILE (fsync'd) when it begins and ``done <trial id>``
when it ends: what really ran, independently of anything the driver records.

``--kill EVENT:N`` kills the driver with SIGKILL at the N-th EVENT counted once Tune has a
restorable experiment state: ``suggest`` (right after the searcher returned a config),
``start`` (after the accountant recorded the attempt, before the trial trains), ``result``
(mid-report: after the accountant saw a result), ``step`` (the start of a controller step,
right after Tune's throttled experiment checkpoint, counted only once the journal holds an
attempt: on a loaded machine the loop steps many times before the first trial starts).
``--kill-after S`` kills it S seconds after this driver's first trial began training, wherever
the driver is then. Before each kill the driver appends ``kill journal`` or ``kill none`` to
SIDE_FILE: whether the journal held the search then (so whether a restore has an account to
take over). On a normal end it prints the report path.
"""

from __future__ import annotations

import argparse
import glob
import os
import signal
import threading
import time

import ray
from ray import tune

from ray_dptune import (
    DPHyPOSearcher,
    PointMass,
    PrivacyAccountantCallback,
    PrivateASHAScheduler,
    RandomCountSearcher,
    TrialSpend,
    private_tune_config,
)
from ray_dptune.records.journal import JOURNAL_FILE

PLAN = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=40)
SPACE = {"x": tune.uniform(0.0, 1.0)}
DELTA = 1e-5
REPORTS = 3


def side_log(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def fake_trainable(config):
    trial_id = tune.get_context().get_trial_id()
    side_log(config["side_file"], f"start {trial_id}")
    for report in range(1, REPORTS + 1):
        time.sleep(0.25)
        spent = TrialSpend(
            sample_rate=PLAN.sample_rate, noise_multiplier=PLAN.noise_multiplier, steps=PLAN.steps * report // REPORTS
        )
        tune.report({"score": config["x"], "dp_plan": PLAN.to_dict(), "dp_spent": spent.to_dict()})
    side_log(config["side_file"], f"done {trial_id}")


ASHA_PLAN = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=30)  # 3 time units of 10 steps
ASHA_MAX_T = 3


def halving_trainable(config):
    """One report per time unit; logs ``unit <trial>/<t>`` (fsync'd) before each unit runs."""
    trial_id = tune.get_context().get_trial_id()
    side_log(config["side_file"], f"start {trial_id}")
    for time_unit in range(1, ASHA_MAX_T + 1):
        side_log(config["side_file"], f"unit {trial_id}/{time_unit}")
        time.sleep(0.2)
        spent = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=10 * time_unit)
        tune.report({"score": config["x"], "dp_plan": ASHA_PLAN.to_dict(), "dp_spent": spent.to_dict()})
    side_log(config["side_file"], f"done {trial_id}")


def restorable(experiment: str) -> bool:
    return bool(glob.glob(os.path.join(experiment, "experiment_state-*.json")))


def journaled(experiment: str) -> bool:
    """Whether the search's journal exists: the accountant creates it with the first attempt it records."""
    return os.path.exists(os.path.join(experiment, JOURNAL_FILE))


def die(experiment: str) -> None:
    """SIGKILLs this process, after noting in the side file whether the journal held the search."""
    side_log(os.environ["SIDE_FILE"], "kill journal" if journaled(experiment) else "kill none")
    os.kill(os.getpid(), signal.SIGKILL)


def tick(event: str) -> None:
    """Counts ``event`` once the experiment is restorable; SIGKILLs this process at the chosen one.

    The plan lives in this process's environment, not in any object: Tune pickles the
    searcher and callbacks into the experiment, and a restored driver must not inherit them.
    """
    experiment = os.environ["KILL_EXPERIMENT"]
    if event != os.environ.get("KILL_EVENT") or not restorable(experiment):
        return
    if event == "step" and not journaled(experiment):
        return
    seen = int(os.environ.get("KILL_SEEN", "0")) + 1
    os.environ["KILL_SEEN"] = str(seen)
    if seen >= int(os.environ["KILL_AT"]):
        die(experiment)


class KillingSearcher(RandomCountSearcher):
    def suggest(self, trial_id):
        config = super().suggest(trial_id)
        if isinstance(config, dict):
            tick("suggest")
        return config


class KillingDPHyPOSearcher(DPHyPOSearcher):
    def suggest(self, trial_id):
        config = super().suggest(trial_id)
        if isinstance(config, dict):
            tick("suggest")
        return config


class KillingCallback(tune.Callback):
    def on_trial_start(self, iteration, trials, trial, **info):
        tick("start")

    def on_trial_result(self, iteration, trials, trial, result, **info):
        tick("result")

    def on_step_begin(self, iteration, trials, **info):
        tick("step")


def kill_after(experiment: str, side_file: str, seconds: float) -> None:
    """SIGKILL ``seconds`` after this driver's first trial began training (read from the side file)."""
    begun = _starts(side_file)
    while not restorable(experiment) or _starts(side_file) <= begun:
        time.sleep(0.01)
    time.sleep(seconds)
    die(experiment)


def _starts(side_file: str) -> int:
    with open(side_file) as file:
        return file.read().count("start ")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("storage")
    parser.add_argument("name")
    parser.add_argument("side_file")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--restore", action="store_true")
    parser.add_argument("--kill")
    parser.add_argument("--kill-after", type=float)
    parser.add_argument("--ledger")
    parser.add_argument("--digits", action="store_true")
    parser.add_argument("--dphypo", action="store_true", help="DP-HyPO (adaptive) instead of uniform random count")
    parser.add_argument("--asha", action="store_true", help="PrivateASHAScheduler with a budget of K whole trials")
    args = parser.parse_args()

    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False, configure_logging=False)
    experiment = os.path.join(args.storage, args.name)
    os.environ["KILL_EXPERIMENT"] = experiment
    if args.kill:
        os.environ["KILL_EVENT"], os.environ["KILL_AT"] = args.kill.split(":")
    if args.kill_after is not None:
        threading.Thread(target=kill_after, args=(experiment, args.side_file, args.kill_after), daemon=True).start()
    trainable = digits_trainable() if args.digits else halving_trainable if args.asha else fake_trainable
    if args.restore:
        tuner = tune.Tuner.restore(experiment, trainable, resume_errored=True, resume_unfinished=True)
    else:
        metric = "score" if not args.digits else "val_acc"
        scheduler = None
        if args.asha:
            scheduler = PrivateASHAScheduler(max_t=ASHA_MAX_T, budget_trials=args.k, metric=metric, mode="max", seed=7)
            searcher = scheduler.searcher
        elif args.dphypo:
            searcher = KillingDPHyPOSearcher(PointMass(args.k), upper=2.0, lower=0.5, metric=metric, mode="max", seed=7)
        else:
            searcher = KillingSearcher(PointMass(args.k), metric=metric, mode="max", seed=7)
        ledger_args = {}
        if args.ledger:
            from ray_dptune.records.ledger import PrivacyLedger

            ledger_args = {"ledger": PrivacyLedger(args.ledger), "dataset": "kills"}
        plan = trainable.privacy_plan(digits_space()) if args.digits else ASHA_PLAN if args.asha else PLAN
        accountant = PrivacyAccountantCallback(searcher, delta=DELTA, plan=plan, verbose=False, **ledger_args)
        space = digits_space() if args.digits else {**SPACE, "side_file": args.side_file}
        tuner = tune.Tuner(
            trainable,
            param_space=space,
            tune_config=private_tune_config(searcher, scheduler, max_concurrent_trials=2),
            run_config=tune.RunConfig(
                name=args.name,
                storage_path=args.storage,
                callbacks=[accountant, KillingCallback()],
                verbose=0,
            ),
        )
    results = tuner.fit()
    print("REPORT", os.path.join(results.experiment_path, "privacy_report.json"), flush=True)


def digits_space():
    return {"lr": tune.loguniform(0.3, 1.0), "max_grad_norm": tune.uniform(0.5, 2.0)}


def digits_trainable():
    """The real Opacus trainable, logging each start to the side file given in $SIDE_FILE."""
    from ray_dptune.training import digits_cnn, digits_data, dp_trainable

    side_file = os.environ["SIDE_FILE"]

    def logged_data(*args, **kwargs):
        side_log(side_file, f"start {tune.get_context().get_trial_id()}")
        return digits_data(*args, **kwargs)

    return dp_trainable(digits_cnn, logged_data, noise_multiplier=1.5, batch_size=128, epochs=1, seed=0)


if __name__ == "__main__":
    main()
