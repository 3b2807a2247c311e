"""Wall time of a private sweep vs plain Tune random search with the same trials.

Ours: RandomCountSearcher (K fixed by PointMass so both runs have the same number
of trials) + PrivacyAccountantCallback + PrivacyGuardScheduler. Anchor: Tune's
default BasicVariantGenerator with ``num_samples`` = K and FIFO. Same trainable
(reports a DP-SGD spend record every "epoch" and sleeps), same concurrency, one
Ray session; runs alternate (anchor, ours, anchor, ours, ...) and the ratio of
medians is reported.

Usage::

    .venv/bin/python benchmarks/tune_overhead.py              # 5 rounds of 12 trials
    .venv/bin/python benchmarks/tune_overhead.py --trials 24 --rounds 5
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ray
from ray import tune

from ray_dptune import PointMass, PrivacyAccountantCallback, RandomCountSearcher, TrialSpend, private_tune_config

PLAN = TrialSpend(sample_rate=0.045, noise_multiplier=2.49, steps=336)
SPACE = {"lr": tune.loguniform(1e-2, 2.0), "max_grad_norm": tune.uniform(0.1, 5.0)}
EPOCHS = 4
RESULTS = Path(__file__).resolve().parent / "results" / "tune_overhead.md"


def trainable(config):
    """A trial of EPOCHS reports, each after a short sleep (stands in for an epoch)."""
    for epoch in range(1, EPOCHS + 1):
        time.sleep(0.05)
        spent = TrialSpend(
            sample_rate=PLAN.sample_rate, noise_multiplier=PLAN.noise_multiplier, steps=PLAN.steps * epoch // EPOCHS
        )
        tune.report({"val_acc": config["lr"] / (1 + epoch), "dp_plan": PLAN.to_dict(), "dp_spent": spent.to_dict()})


def run_anchor(trials: int, storage: str) -> float:
    tuner = tune.Tuner(
        trainable,
        param_space=SPACE,
        tune_config=tune.TuneConfig(num_samples=trials, max_concurrent_trials=2, metric="val_acc", mode="max"),
        run_config=tune.RunConfig(storage_path=storage, verbose=0),
    )
    start = time.perf_counter()
    tuner.fit()
    return time.perf_counter() - start


def run_ours(trials: int, storage: str) -> float:
    searcher = RandomCountSearcher(PointMass(trials), metric="val_acc", mode="max")
    tuner = tune.Tuner(
        trainable,
        param_space=SPACE,
        tune_config=private_tune_config(searcher, max_concurrent_trials=2),
        run_config=tune.RunConfig(
            storage_path=storage,
            verbose=0,
            callbacks=[PrivacyAccountantCallback(searcher, delta=1e-5, plan=PLAN, verbose=False)],
        ),
    )
    start = time.perf_counter()
    tuner.fit()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    anchor, ours = [], []
    with tempfile.TemporaryDirectory() as storage:
        run_anchor(2, storage)  # warm-up: worker processes, imports
        run_ours(2, storage)
        for round_ in range(args.rounds):
            anchor.append(run_anchor(args.trials, storage))
            ours.append(run_ours(args.trials, storage))
            print(f"round {round_ + 1}: plain Tune {anchor[-1]:.2f} s, ray_dptune {ours[-1]:.2f} s", flush=True)
    ray.shutdown()

    ratio = statistics.median(o / a for o, a in zip(ours, anchor))  # each round: the same load on both
    lines = [
        "# Private sweep vs plain Tune random search: wall time",
        "",
        f"Command: `.venv/bin/python benchmarks/tune_overhead.py --trials {args.trials} --rounds {args.rounds}`  ",
        f"Date: {datetime.date.today()}; ray {ray.__version__}; Python {sys.version.split()[0]}; 2-core CPU.",
        "",
        (
            f"{args.trials} trials of {EPOCHS} reports each (0.05 s apart), 2 concurrent, one Ray session, "
            "runs alternating."
        ),
        "",
        "| round | plain Tune (s) | ray_dptune (s) | ratio |",
        "|---|--:|--:|--:|",
        *[f"| {i + 1} | {a:.2f} | {o:.2f} | {o / a:.3f} |" for i, (a, o) in enumerate(zip(anchor, ours))],
        "",
        (
            f"**Median over rounds of ray_dptune / plain Tune: {ratio:.3f}** (goal ≤ 1.05); ratio of the "
            f"medians: {statistics.median(ours) / statistics.median(anchor):.3f}."
        ),
    ]
    RESULTS.write_text("\n".join(lines) + "\n")
    print(f"median ratio ours/plain = {ratio:.3f}; wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
