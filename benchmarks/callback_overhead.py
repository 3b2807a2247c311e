"""Overhead of PrivacyAccountantCallback (with and without a ledger) per trial, at scale.

Part 1 (hooks only, no Ray): 200 trials × 4 results driven through the callback's
hooks as Tune calls them; time per trial and tracemalloc growth per trial.
Part 2 (a real sweep): 200 tiny trials in Tune with the callback + ledger, the
time spent inside the callback's hooks measured from within the run.

Usage::

    .venv/bin/python benchmarks/callback_overhead.py             # both parts (~5 min here)
    .venv/bin/python benchmarks/callback_overhead.py --hooks-only
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

from ray_dptune import PointMass, PrivacyAccountantCallback, RandomCountSearcher, TrialSpend
from ray_dptune.records.ledger import PrivacyLedger

PLAN = TrialSpend(sample_rate=0.045, noise_multiplier=2.49, steps=336)
RESULTS = Path(__file__).resolve().parent / "results" / "callback_overhead.md"
HOOKS = ("on_trial_start", "on_trial_result", "on_trial_complete")


def drive_hooks(trials: int, ledger: PrivacyLedger | None) -> tuple[list[float], list[int]]:
    """Per-trial seconds in the hooks and tracemalloc's traced size after each trial."""
    searcher = RandomCountSearcher(PointMass(trials), seed=0)
    callback = PrivacyAccountantCallback(
        searcher, delta=1e-5, plan=PLAN, verbose=False, ledger=ledger, dataset="bench" if ledger else None
    )
    callback.setup(num_samples=-1)
    callback.guarantee()  # the plan's curve is computed once, before the search
    seconds, memory = [], []
    for index in range(trials):
        trial = SimpleNamespace(trial_id=f"t{index}", config={"lr": 0.1, "max_grad_norm": 1.0})
        start = time.perf_counter()
        callback.on_trial_start(0, [], trial)
        for epoch in range(1, 5):
            spent = TrialSpend(
                sample_rate=PLAN.sample_rate, noise_multiplier=PLAN.noise_multiplier, steps=PLAN.steps * epoch // 4
            )
            callback.on_trial_result(
                0, [], trial, {"val_acc": 0.5, "dp_plan": PLAN.to_dict(), "dp_spent": spent.to_dict()}
            )
        callback.on_trial_complete(0, [], trial)
        seconds.append(time.perf_counter() - start)
        memory.append(tracemalloc.get_traced_memory()[0])
    return seconds, memory


def hooks_part(trials: int) -> list[str]:
    lines = [
        "## Part 1: the callback's hooks, no Ray",
        "",
        "| set-up | median ms / trial | p90 ms / trial | memory growth / trial |",
        "|---|--:|--:|--:|",
    ]
    with tempfile.TemporaryDirectory() as folder:
        for name, ledger in (("callback", None), ("callback + SQLite ledger", PrivacyLedger(Path(folder) / "l.db"))):
            tracemalloc.start()
            seconds, memory = drive_hooks(trials, ledger)
            tracemalloc.stop()
            ms = sorted(1e3 * s for s in seconds)
            half = trials // 2
            growth = (memory[-1] - memory[half]) / (trials - half)
            lines.append(
                f"| {name} | {statistics.median(ms):.3f} | {ms[int(0.9 * len(ms))]:.3f} | {growth / 1024:.1f} KiB |"
            )
            print(lines[-1], flush=True)
    return lines


def sweep_part(trials: int) -> list[str]:
    import ray
    from ray import tune

    from ray_dptune import private_tune_config

    def trainable(config):
        tune.report({"val_acc": config["x"], "dp_plan": PLAN.to_dict(), "dp_spent": PLAN.to_dict()})

    spent_in_hooks = []

    class TimedCallback(PrivacyAccountantCallback):
        """Measures the time Tune spends inside this callback's hooks."""

    for hook in HOOKS:
        original = getattr(PrivacyAccountantCallback, hook)

        def timed(self, *args, _original=original, **kwargs):
            start = time.perf_counter()
            try:
                return _original(self, *args, **kwargs)
            finally:
                spent_in_hooks.append(time.perf_counter() - start)

        setattr(TimedCallback, hook, timed)

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as folder:
        searcher = RandomCountSearcher(PointMass(trials), metric="val_acc", mode="max", seed=0)
        callback = TimedCallback(
            searcher, delta=1e-5, plan=PLAN, verbose=False, ledger=PrivacyLedger(Path(folder) / "l.db"), dataset="bench"
        )
        start = time.perf_counter()
        tune.Tuner(
            trainable,
            param_space={"x": tune.uniform(0, 1)},
            tune_config=private_tune_config(searcher, max_concurrent_trials=2),
            run_config=tune.RunConfig(storage_path=folder, callbacks=[callback], verbose=0),
        ).fit()
        wall = time.perf_counter() - start
    ray.shutdown()
    per_trial_ms = 1e3 * sum(spent_in_hooks) / trials
    return [
        "## Part 2: a real sweep",
        "",
        (
            f"{trials} trials in Tune (2 at a time, one report each), callback + SQLite ledger: "
            f"{per_trial_ms:.3f} ms per trial inside the callback's hooks, out of {1e3 * wall / trials:.0f} ms "
            "of wall time per trial (Tune's own scheduling dominates)."
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--hooks-only", action="store_true")
    args = parser.parse_args(argv)
    lines = [
        "# PrivacyAccountantCallback and ledger overhead per trial",
        "",
        (
            f"Command: `.venv/bin/python benchmarks/callback_overhead.py --trials {args.trials}"
            f"{' --hooks-only' if args.hooks_only else ''}`  "
        ),
        (
            f"Date: {datetime.date.today()}; Python {sys.version.split()[0]}; 2-core CPU. Goal: ≤ 1 ms per trial, "
            "memory flat (constant growth per trial: each trial's attempts are kept for the report)."
        ),
        "",
        *hooks_part(args.trials),
        "",
    ]
    if not args.hooks_only:
        lines += sweep_part(args.trials)
    RESULTS.write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
