"""A private_tuner search driven in its own process, for the budget tests (tests/tune/test_budget_cap.py).

    python tests/budget_driver.py STORAGE NAME SIDE_FILE --k K --epsilon E [--retries R]
                                  [--interrupt-after N] [--restore]

It connects to the Ray cluster at $RAY_ADDRESS (the tests' shared session). Each attempt of
the trainable appends ``start <trial id>`` to SIDE_FILE (fsync'd) before it trains and
``done <trial id>`` when it ends. ``--interrupt-after N`` sends this driver a real SIGINT
(Ctrl-C) once N trials are done and another is held before its last report: a trial that
would end after the N-th logs ``held <trial id>`` and waits for a gate file, which this driver
opens once Tune has stopped (so every trial running at the interrupt is interrupted, however
slow the machine). ``--restore`` continues the search with ``tune.Tuner.restore``. It prints
the accountant's lines and ``RESULT <json>`` at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from pathlib import Path

import ray
from kill_driver import side_log  # the same fsync'd side file as the kill tests' (tests/ is on PYTHONPATH)
from ray import tune

import ray_dptune
from ray_dptune import PointMass, TrialSpend

SAMPLE_RATE, STEPS, DELTA = 0.05, 40, 1e-5


def plan_for(sigma: float) -> TrialSpend:
    return TrialSpend(sample_rate=SAMPLE_RATE, noise_multiplier=sigma, steps=STEPS)


def slow_trainable(config):
    """Four reports of 10 steps each, 0.5 s apart; held before the last while the gate is closed."""
    trial_id = tune.get_context().get_trial_id()
    side_log(config["side_file"], f"start {trial_id}")
    plan = plan_for(config["noise_multiplier"])
    for epoch in range(1, 5):
        time.sleep(0.5)
        if epoch == 4:
            hold(config, trial_id)
        spent = TrialSpend(sample_rate=SAMPLE_RATE, noise_multiplier=plan.noise_multiplier, steps=10 * epoch)
        tune.report({"score": config["x"] + 0.01 * epoch, "dp_plan": plan.to_dict(), "dp_spent": spent.to_dict()})
    side_log(config["side_file"], f"done {trial_id}")


def gate_of(side_file: str) -> Path:
    return Path(side_file + ".gate")


def hold(config: dict, trial_id: str) -> None:
    """Waits for the gate while ``interrupt_after`` trials are done: this trial is then running at the interrupt."""
    if config.get("interrupt_after") is None:
        return
    gate = gate_of(config["side_file"])
    if gate.exists() or Path(config["side_file"]).read_text().split().count("done") < config["interrupt_after"]:
        return
    side_log(config["side_file"], f"held {trial_id}")
    while not gate.exists():
        time.sleep(0.05)


def interrupt_after(side_file: str, done: int) -> None:
    """Sends this process SIGINT (what Ctrl-C does) once ``done`` trials have ended and another is held."""

    def watch():
        while True:
            lines = Path(side_file).read_text().split() if os.path.exists(side_file) else []
            if lines.count("done") >= done and "held" in lines:
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("storage")
    parser.add_argument("name")
    parser.add_argument("side_file")
    parser.add_argument("--k", type=int, default=6)
    parser.add_argument("--epsilon", type=float, default=4.0)
    parser.add_argument("--retries", type=int, default=0)
    parser.add_argument("--interrupt-after", type=int, default=None)
    parser.add_argument("--restore", action="store_true")
    args = parser.parse_args()
    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    path = os.path.join(args.storage, args.name)
    if args.restore:
        tuner = tune.Tuner.restore(path, slow_trainable)
    else:
        tuner = ray_dptune.private_tuner(
            slow_trainable,
            param_space={
                "x": tune.uniform(0.0, 1.0),
                "side_file": args.side_file,
                "interrupt_after": args.interrupt_after,
            },
            epsilon=args.epsilon,
            delta=DELTA,
            law=PointMass(args.k),
            plan_for=plan_for,
            metric="score",
            mode="max",
            retries=args.retries,
            tune_config=tune.TuneConfig(max_concurrent_trials=2),
            run_config=tune.RunConfig(name=args.name, storage_path=args.storage, verbose=0),
        )
    if args.interrupt_after is not None:
        interrupt_after(args.side_file, args.interrupt_after)
    try:
        tuner.fit()
        outcome = {"error": None}
    except Exception as error:  # noqa: BLE001 - the test reads what the driver saw
        outcome = {"error": f"{type(error).__name__}: {error}"}
    gate_of(args.side_file).touch()  # Tune has stopped: a restored search's trials run to their end
    print("RESULT " + json.dumps({**outcome, "path": path}), flush=True)


if __name__ == "__main__":
    main()
