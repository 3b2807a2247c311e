"""The one-run audit's teeth: ε_lower for a non-private, a broken and an honest DP-SGD run.

Issue 26, item 4. Every run trains one model with ``ray_dptune.training.train`` (no Ray) on
generated data with a :class:`~ray_dptune.training.CanaryAudit` and reads its released
model's ε_lower (Steinke, Nasr & Jagielski 2023, Theorem 3; 95 %, δ = 1e-5): the model a
search releases is one such run, and the audit sees nothing else of the search.

Both of the audit's methods run on the same settings: ``black-box`` (each canary's loss on the
released model) and ``white-box`` (its loss gradient at the initial weights against the whole
update).

Data: 10 Gaussian classes in 300 dimensions (class means N(0, I), unit noise), 2 000
training points (+ the inserted canaries), a linear model, SGD at lr 0.5, Poisson batches of
100, 10 epochs. Canaries: uniform in [-1, 1]^300 with uniform random labels; the audit
guesses on ``guess_fraction`` of them (half "in": lowest loss, half "out": highest).

* ``non-private``: σ = 1e-6 (as good as 0: a plan refuses σ = 0), clipping norm 100, for
  m ∈ {50 … 1000}, guessing on half the canaries: the smallest m whose ε_lower exceeds the
  ε = 3 a search at the quickstart's budget would claim, in every seed;
* ``broken``: the plan's σ is calibrated so that the run costs ε (3 or 8), but the trainable
  secretly adds σ/10, σ/30 or σ/100 (clipping norm 10); flagged = ε_lower > the claimed ε;
* ``honest``: σ as planned, clipping norm 10; ε_lower must stay ≤ ε_upper in every run.

The broken and honest rows use m = 1 000 canaries and guess on 20 % (r = 200: ε_lower ≤ 4.17
whatever the model, so a claim of ε = 8 can never be flagged by this audit).

Usage::

    .venv/bin/python benchmarks/audit.py            # 10 runs a row, ~6 min on 2 cores (371 s, results/audit.md)
    .venv/bin/python benchmarks/audit.py --quick    # 3 runs a row, -quick files
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import private_scheduler as bench  # provenance (environment, header_lines) and write_results

from ray_dptune import PointMass, calibrate_noise_multiplier
from ray_dptune.accounting.bookkeeping.spend import TrialSpend, sampling_schedule
from ray_dptune.audit import AuditCounts
from ray_dptune.training import CanaryAudit
from ray_dptune.training.loop import train
from ray_dptune.training.plan import PrivacyParams
from ray_dptune.training.spec import TrainSpec

DELTA = 1e-5
FEATURES, CLASSES, TRAIN, VALIDATION = 300, 10, 2000, 200
BATCH, EPOCHS, LR = 100, 10, 0.5
NON_PRIVATE_CANARIES = (50, 100, 150, 200, 300, 500, 1000)
CLAIMED = (3.0, 8.0)
SECRET_FRACTIONS = (10, 30, 100)  # the broken trainable adds σ / this
AUDIT_CANARIES, AUDIT_FRACTION = 1000, 0.2
BUDGET = 3.0  # the quickstart's ε
METHODS = ("black-box", "white-box")


def gaussian_classes(config: Any) -> tuple[TensorDataset, TensorDataset]:
    rng = np.random.default_rng(0)
    means = rng.normal(size=(CLASSES, FEATURES))
    labels = rng.integers(0, CLASSES, TRAIN + VALIDATION)
    inputs = torch.as_tensor(means[labels] + rng.normal(size=(len(labels), FEATURES)), dtype=torch.float32)
    labels_tensor = torch.as_tensor(labels)
    return (
        TensorDataset(inputs[:TRAIN], labels_tensor[:TRAIN]),
        TensorDataset(inputs[TRAIN:], labels_tensor[TRAIN:]),
    )


def linear_model(config: Any) -> nn.Module:
    return nn.Linear(FEATURES, CLASSES)


def plan_for(audit: CanaryAudit):
    size = audit.planned_size(TRAIN)
    sample_rate, steps = sampling_schedule(size, BATCH)
    return lambda sigma: TrialSpend(sample_rate=sample_rate, noise_multiplier=sigma, steps=EPOCHS * steps)


def audited_run(audit: CanaryAudit, *, sigma: float, max_grad_norm: float, seed: int) -> dict[str, Any]:
    spec = TrainSpec(
        model_fn=linear_model,
        data_fn=gaussian_classes,
        loss_fn=torch.nn.functional.cross_entropy,
        privacy=PrivacyParams(noise_multiplier=sigma, batch_size=BATCH, epochs=EPOCHS),
        audit=audit,
        seed=seed,
    )
    reports: list[dict[str, Any]] = []
    train({"lr": LR, "max_grad_norm": max_grad_norm}, spec, lambda metrics, _: reports.append(metrics))
    counts = AuditCounts.from_dict(reports[-1]["dp_audit"])
    return {
        "guesses": counts.guesses,
        "correct": counts.correct,
        "epsilon_lower": counts.epsilon_lower(delta=DELTA),
        "val_acc": reports[-1]["val_acc"],
    }


def non_private_rows(runs: int) -> list[dict[str, Any]]:
    rows = []
    for method in METHODS:
        for canaries in NON_PRIVATE_CANARIES:
            results = [
                audited_run(
                    CanaryAudit(
                        canaries=canaries,
                        num_classes=CLASSES,
                        guess_fraction=0.5,
                        input_range=(-1.0, 1.0),
                        method=method,
                    ),
                    sigma=1e-6,
                    max_grad_norm=100.0,
                    seed=seed,
                )
                for seed in range(runs)
            ]
            lowers = [r["epsilon_lower"] for r in results]
            rows.append(
                {
                    "method": method,
                    "canaries": canaries,
                    "runs": results,
                    "min": min(lowers),
                    "mean": float(np.mean(lowers)),
                }
            )
            print(f"non-private {method} m={canaries}: ε_lower min {min(lowers):.3f}", flush=True)
    return rows


def private_rows(runs: int) -> list[dict[str, Any]]:
    rows = []
    for method, claimed, divisor in [(m, c, d) for m in METHODS for c in CLAIMED for d in (1, *SECRET_FRACTIONS)]:
        results = []
        for seed in range(runs):
            audit = CanaryAudit(
                canaries=AUDIT_CANARIES,
                num_classes=CLASSES,
                guess_fraction=AUDIT_FRACTION,
                input_range=(-1.0, 1.0),
                method=method,
            )
            sigma = calibrate_noise_multiplier(plan_for(audit), epsilon=claimed, delta=DELTA, law=PointMass(1))
            upper = plan_for(audit)(sigma).curve().epsilon(delta=DELTA)
            run = audited_run(audit, sigma=sigma / divisor, max_grad_norm=10.0, seed=seed)
            results.append({**run, "sigma_planned": sigma, "epsilon_upper": upper})
        lowers = [r["epsilon_lower"] for r in results]
        kind = "honest" if divisor == 1 else f"broken (σ/{divisor})"
        rows.append(
            {
                "method": method,
                "claimed": claimed,
                "kind": kind,
                "runs": results,
                "flagged": sum(r["epsilon_lower"] > r["epsilon_upper"] for r in results),
                "mean": float(np.mean(lowers)),
                "max": max(lowers),
                "epsilon_upper": max(r["epsilon_upper"] for r in results),
            }
        )
        print(f"{method} ε={claimed} {kind}: flagged {rows[-1]['flagged']}/{runs}, max {max(lowers):.3f}", flush=True)
    return rows


def render(record: dict[str, Any]) -> str:
    runs = record["runs_per_row"]
    lines = [
        "# The one-run audit: ε_lower of non-private, broken and honest DP-SGD runs",
        "",
        *bench.header_lines(record["environment"], record["wall_time"]),
        f"- {runs} runs a row; data, model and settings: `benchmarks/audit.py`'s docstring; δ = {DELTA:g}, 95 %.",
        "",
        "## Non-private control (σ = 1e-6, clipping 100, guesses on half the canaries)",
        "",
        f"| method | canaries m | guesses r | ε_lower min | ε_lower mean | all above ε = {BUDGET:g}? |",
        "|---|--:|--:|--:|--:|---|",
    ]
    for row in record["non_private"]:
        above = "yes" if row["min"] > BUDGET else "no"
        lines.append(
            f"| {row['method']} | {row['canaries']} | {row['runs'][0]['guesses']} | {row['min']:.3f} | "
            f"{row['mean']:.3f} | {above} |"
        )
    lines.append("")
    for method in METHODS:
        rows = [row for row in record["non_private"] if row["method"] == method]
        smallest = next((row["canaries"] for row in rows if row["min"] > BUDGET), None)
        lines.append(f"Smallest m whose {method} ε_lower exceeds ε = {BUDGET:g} in every run: **{smallest}**.")
    lines += [
        "",
        f"## Broken and honest runs (m = {AUDIT_CANARIES}, r = {int(AUDIT_CANARIES * AUDIT_FRACTION)}, clipping 10)",
        "",
        (
            "| method | claimed ε (= ε_upper) | trainable | flagged (ε_lower > ε_upper) | ε_lower mean | ε_lower max "
            "| gap ε_upper − max |"
        ),
        "|---|--:|---|--:|--:|--:|--:|",
    ]
    for row in record["private"]:
        lines.append(
            f"| {row['method']} | {row['claimed']:g} | {row['kind']} | {row['flagged']}/{runs} | {row['mean']:.3f} | {row['max']:.3f} | "
            f"{row['epsilon_upper'] - row['max']:.3f} |"
        )
    honest_ok = all(row["flagged"] == 0 for row in record["private"] if row["kind"] == "honest")
    lines += [
        "",
        f"Honest runs: ε_lower ≤ ε_upper in every run: **{'yes' if honest_ok else 'NO: a bug'}**.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 runs a row; -quick files")
    parser.add_argument("--runs", type=int, default=None, help="runs a row (default 10)")
    args = parser.parse_args(argv)
    runs = args.runs or (3 if args.quick else 10)
    torch.set_num_threads(1)
    started = time.time()
    environment = bench.environment(1)
    record: dict[str, Any] = {
        "environment": environment,
        "runs_per_row": runs,
        "non_private": non_private_rows(runs),
        "private": private_rows(runs),
    }
    record["wall_time"] = f"{math.ceil(time.time() - started)} s"
    stem = "audit-quick" if args.quick else "audit"
    bench.write_results(Path(__file__).resolve().parent / "results", stem, record, render(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
