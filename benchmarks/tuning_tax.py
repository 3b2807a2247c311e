"""The tuning tax: a private search's released model against an oracle's one run, at equal total ε.

Issue 25, item 1. For each data set and total ε ∈ {1, 3, 8} (δ = 1e-5, the whole search),
the held-out accuracy of:

* ``oracle`` (an **unattainable yardstick**, not a private method): the best (lr,
  max_grad_norm) of a *non-private* grid, lr ∈ geomspace(0.05, 5, 7) × max_grad_norm ∈
  geomspace(0.3, 6, 5) (35 points; 5 × 3 with ``--quick``), each point trained 3 times (2
  with ``--quick``) with DP-SGD at the oracle's σ and picked by its mean selection accuracy
  (the grid's privacy cost is not counted: that is what makes it an oracle); then one DP-SGD run with those
  hyperparameters, σ calibrated so that this one run alone costs the total ε (its exact
  privacy-loss distribution: ``SearchMechanism.halving(budget_units=E, max_t=E)``, a budget
  of one whole trial, the accountant ``private_scheduler.one_trial_epsilon`` uses; it agrees
  with Opacus's PRV accountant to 0.3 %; the RDP composition
  ``mechanism=SearchMechanism.composition(), retries=1`` is recorded beside it). The grid is
  run once per (data set, ε); the final run is repeated with ``--searches`` fresh seeds, so
  the oracle's interval covers the final run's randomness, not the grid's pick;
* the released model of each private search, σ calibrated so that the *whole* search costs
  the total ε (``calibrate_noise_multiplier(plan_for, epsilon=ε, delta=δ,
  mechanism=searcher.privacy_mechanism())``, checked with ``search_epsilon``):

  - ``random_poisson``: ``RandomCountSearcher(Poisson(8))`` over lr ∈ loguniform(0.05, 5),
    max_grad_norm ∈ uniform(0.3, 6), fixed (flat) clipping;
  - ``automatic_poisson``: the same law with ``config["clipping"] = "automatic"`` (AUTO-S,
    R = 1: ``ray_dptune/training/automatic.py``), lr ∈ loguniform(0.05, 5) only. A sweep at
    ε = 3's σ put the best lr near 1 on digits (0.3–1 good, 3 worse, 10 fails) and flat over
    0.1–3 on breast cancer, so the fixed-clipping lr range serves unchanged;
  - ``dphypo``: ``DPHyPOSearcher(TruncatedNegativeBinomial.from_mean(0.5, 8))`` with its
    defaults (C = 1.5, c = 0.75), the fixed-clipping space, as ``private_scheduler.py`` runs
    it. Its adaptivity cost alone exceeds ε = 1 (calibration raises PrivacyError): such rows
    are reported infeasible, not run;
  - subsampled tuning (Koskela & Kulkarni 2023) is not run here: ``benchmarks/subsampled_tuning.py``
    measures it (its column below, and in the results recorded before it was built, says so).

The tax of a row is oracle − method in held-out accuracy, with Welch's 95 % interval; every
other ± is a 95 % t-interval over searches (``private_scheduler.mean_ci`` / ``welch``).

Data sets (public validation, no noisy score; the validation set is split once, stratified,
seed 0, into a *selection* half, the only score any search or the oracle's grid sees, and a
*held-out* half that scores the released model afterwards):

* ``digits``: ``ray_dptune.training.digits_data`` (1 437 train / 360 validation → 180 / 180),
  ``digits_cnn``, batch 64, 9 epochs (198 DP-SGD steps a trial);
* ``breast_cancer``: scikit-learn's Wisconsin breast cancer (569 × 30 features, 2 classes),
  split 70 / 30 stratified (seed 0: 398 train / 171 validation → 85 / 86), features
  standardised with the training split's mean and standard deviation only;
  ``breast_cancer_mlp`` (30 → 16 tanh → 2, 530 parameters), batch 32, 15 epochs (180 steps).

Each search runs whole, in-process and sequentially, without Ray, as in
``benchmarks/private_scheduler.py``: ``searcher.suggest`` until FINISHED, each trial trained
by ``ray_dptune.training.train`` (SGD, default ``grad_sample_mode``) to its last epoch, its
final selection score passed to ``on_trial_complete``. Released model: the trial with the best
final selection score (the first of equals); a search that draws K = 0 releases nothing and is
scored at chance (1 / classes). Compute: trials and DP-SGD steps (as the runs' spending guard
counted them) per search; the oracle's is its grid plus its one run. Every search and run is
seeded, so a rerun gives the same numbers. ``--quick`` keeps the full run's epochs, so that its
seconds per trial predict the full run.

Usage::

    .venv/bin/python benchmarks/tuning_tax.py           # 24 searches per (data set, ε, method), ε ∈ {1, 3, 8}:
                                                        # 34 min on 2 cores shared with other jobs (2 028 s,
                                                        # benchmarks/results/tuning_tax.md)
    .venv/bin/python benchmarks/tuning_tax.py --quick   # ε = 3, 2 searches per method, 15-point grid: ~1.5 min

Writes ``benchmarks/results/tuning_tax.{md,json}`` (``-quick`` suffix with ``--quick``).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import sys
import time
import warnings
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import private_scheduler as bench  # shared statistics (mean_ci, welch) and provenance (environment)

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
DELTA = 1e-5
METRIC = "val_acc"
SPLIT_SEED = 0
MEAN_K = 8.0
TNB_ETA = 0.5
LR_RANGE = (0.05, 5.0)
CLIP_RANGE = (0.3, 6.0)
AUTOMATIC_LR_RANGE = (0.05, 5.0)
BREAST_CANCER_VAL_FRACTION = 0.3
GRID_POINTS = {"full": (7, 5), "quick": (5, 3)}  # lr points × max_grad_norm points, geometric over the ranges
GRID_SEEDS = {"full": 3, "quick": 2}  # DP-SGD runs per grid point, averaged
DATASETS: dict[str, dict[str, Any]] = {
    "digits": {"label": "digits, digits_cnn", "batch_size": 64, "epochs": 9, "classes": 10},
    "breast_cancer": {"label": "breast cancer, breast_cancer_mlp", "batch_size": 32, "epochs": 15, "classes": 2},
}
METHODS: dict[str, dict[str, Any]] = {
    "random_poisson": {"law": "poisson", "clipping": "fixed", "label": "random count, Poisson(8), fixed clipping"},
    "automatic_poisson": {
        "law": "poisson",
        "clipping": "automatic",
        "label": "random count, Poisson(8), automatic clipping",
    },
    "dphypo": {"law": "tnb", "clipping": "fixed", "label": "DP-HyPO, TNB(η=0.5, mean 8), C/c = 1.5/0.75"},
}
ORACLE_LABEL = "oracle (unattainable: non-private grid, then one run at the full ε)"
NOT_IMPLEMENTED = {"subsampled": "subsampled tuning (Koskela & Kulkarni 2023): see subsampled_tuning.py"}


# ----------------------------------------------------------------------------- data, models, plans


def breast_cancer_data(config: Any = None) -> tuple[Any, Any]:
    """scikit-learn's breast cancer data as (train, validation) tensor data sets, like ``digits_data``.

    Stratified 70 / 30 split (seed 0): 398 / 171 rows of 30 float32 features, standardised
    with the training split's mean and standard deviation; int64 labels (0 malignant, 1 benign).
    """
    del config  # the data do not depend on hyperparameters
    import torch
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split
    from torch.utils.data import TensorDataset

    data = load_breast_cancer()
    train_x, val_x, train_y, val_y = train_test_split(
        data.data, data.target, test_size=BREAST_CANCER_VAL_FRACTION, random_state=SPLIT_SEED, stratify=data.target
    )
    mean, std = train_x.mean(axis=0), train_x.std(axis=0)

    def tensors(x: np.ndarray, y: np.ndarray) -> Any:
        return TensorDataset(
            torch.as_tensor((x - mean) / std, dtype=torch.float32), torch.as_tensor(y, dtype=torch.int64)
        )

    return tensors(train_x, train_y), tensors(val_x, val_y)


def breast_cancer_mlp(config: Any = None) -> Any:
    """A small tanh MLP for :func:`breast_cancer_data`: 30 → ``hidden`` (16) → 2 logits, like ``digits_cnn``."""
    from torch import nn

    hidden = int((config or {}).get("hidden", 16))
    return nn.Sequential(nn.Linear(30, hidden), nn.Tanh(), nn.Linear(hidden, 2))


def data_fn(dataset: str) -> Any:
    from ray_dptune.training import digits_data

    return digits_data if dataset == "digits" else breast_cancer_data


def model_fn(dataset: str) -> Any:
    from ray_dptune.training import digits_cnn

    return digits_cnn if dataset == "digits" else breast_cancer_mlp


@cache
def train_size(dataset: str) -> int:
    return len(data_fn(dataset)()[0])


def plan_for(dataset: str, sigma: float) -> Any:
    """One whole trial's plan at σ: the data set's epochs of Poisson batches out of its training split."""
    from ray_dptune.training.plan import PrivacyParams, trial_plan

    spec = DATASETS[dataset]
    params = PrivacyParams(noise_multiplier=sigma, batch_size=spec["batch_size"], epochs=spec["epochs"])
    return trial_plan(params, train_size(dataset))


def grid(quick: bool) -> list[tuple[float, float]]:
    lrs, clips = GRID_POINTS["quick" if quick else "full"]
    return [(float(lr), float(c)) for lr in np.geomspace(*LR_RANGE, lrs) for c in np.geomspace(*CLIP_RANGE, clips)]


# ----------------------------------------------------------------------------- methods and calibration


def space(method: str) -> dict[str, Any]:
    from ray import tune

    if METHODS[method]["clipping"] == "automatic":
        return {"lr": tune.loguniform(*AUTOMATIC_LR_RANGE), "clipping": "automatic"}
    return {"lr": tune.loguniform(*LR_RANGE), "max_grad_norm": tune.uniform(*CLIP_RANGE)}


def build(method: str, seed: int | None) -> Any:
    from ray_dptune import DPHyPOSearcher, Poisson, RandomCountSearcher
    from ray_dptune import TruncatedNegativeBinomial as TNB

    common = {"metric": METRIC, "mode": "max", "space": space(method), "seed": seed}
    if METHODS[method]["law"] == "tnb":
        return DPHyPOSearcher(TNB.from_mean(TNB_ETA, MEAN_K), **common)
    return RandomCountSearcher(Poisson(MEAN_K), **common)


def mechanism(dataset: str, method: str) -> Any:
    """The whole search's mechanism; the oracle's is one whole trial (a halving budget of one trial: exact PLD)."""
    from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism

    if method == "oracle":
        epochs = DATASETS[dataset]["epochs"]
        return SearchMechanism.halving(budget_units=epochs, max_t=epochs)
    return build(method, seed=0).privacy_mechanism()


def calibrate(task: tuple[str, float, str]) -> tuple[str, float, str, dict[str, Any]]:
    """σ of ``method`` on ``dataset`` for total ε, and the ε ``search_epsilon`` gives at it; or why none exists."""
    from ray_dptune.accounting.bookkeeping.calibrate import calibrate_noise_multiplier, search_epsilon
    from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
    from ray_dptune.errors import PrivacyError

    dataset, epsilon, method = task
    start = time.perf_counter()
    mech = mechanism(dataset, method)
    try:
        sigma = calibrate_noise_multiplier(lambda s: plan_for(dataset, s), epsilon=epsilon, delta=DELTA, mechanism=mech)
    except PrivacyError as error:
        return dataset, epsilon, method, {"infeasible": str(error), "seconds": time.perf_counter() - start}
    reached = search_epsilon(plan_for(dataset, sigma), delta=DELTA, mechanism=mech)
    if reached > epsilon:
        raise AssertionError(f"{dataset} {method}: σ = {sigma} gives ε = {reached} > {epsilon}")
    out = {"sigma": sigma, "epsilon": reached}
    if method == "oracle":  # the RDP composition of the same one run, for comparison
        composed = SearchMechanism.composition()
        out["sigma_rdp"] = calibrate_noise_multiplier(
            lambda s: plan_for(dataset, s), epsilon=epsilon, delta=DELTA, mechanism=composed, retries=1
        )
    out["one_trial_epsilon"] = search_epsilon(
        plan_for(dataset, sigma), delta=DELTA, mechanism=mechanism(dataset, "oracle")
    )
    out["seconds"] = time.perf_counter() - start
    return dataset, epsilon, method, out


# ----------------------------------------------------------------------------- workers

_DATA: dict[str, tuple[Any, Any, Any]] = {}  # data set -> (train, selection, held-out)


def init_worker() -> None:
    import torch
    from sklearn.model_selection import train_test_split
    from torch.utils.data import TensorDataset

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    for dataset in DATASETS:
        train, validation = data_fn(dataset)()
        inputs, targets = validation.tensors
        selection, held_out = train_test_split(
            np.arange(len(targets)), test_size=0.5, random_state=SPLIT_SEED, stratify=targets.numpy()
        )
        _DATA[dataset] = (
            train,
            TensorDataset(inputs[selection], targets[selection]),
            TensorDataset(inputs[held_out], targets[held_out]),
        )


def _held_out_accuracy(dataset: str, checkpoint_dir: str) -> float:
    return bench.checkpoint_accuracy(model_fn(dataset)(), checkpoint_dir, _DATA[dataset][2])


def train_one(dataset: str, config: dict[str, Any], sigma: float, seed: int) -> dict[str, Any]:
    """One whole DP-SGD trial: its final selection and held-out accuracies and its DP-SGD steps."""
    import torch.nn.functional as F

    from ray_dptune.training import PrivacyParams, TrainSpec, train

    spec_of = DATASETS[dataset]
    spec = TrainSpec(
        model_fn=model_fn(dataset),
        data_fn=lambda config: _DATA[dataset][:2],
        loss_fn=F.cross_entropy,
        privacy=PrivacyParams(
            noise_multiplier=float(sigma), batch_size=spec_of["batch_size"], epochs=spec_of["epochs"]
        ),
        metric=METRIC,
        seed=seed,
    )
    out: dict[str, Any] = {}

    def report(metrics: dict[str, Any], checkpoint_dir: str) -> None:
        if int(metrics["epoch"]) == spec_of["epochs"]:
            out["selection"] = float(metrics[METRIC])
            out["held_out"] = _held_out_accuracy(dataset, checkpoint_dir)

    spent = train(config, spec, report)
    out["steps"] = int(spent.steps)
    return out


def _config(config: dict[str, Any]) -> dict[str, Any]:
    return {key: value if isinstance(value, str) else float(value) for key, value in config.items()}


def run_search(dataset: str, epsilon: float, method: str, rep: int, sigma: float, seed: int) -> dict[str, Any]:
    """One whole search of ``method`` at σ: what it released and what it spent."""
    from ray.tune.search import Searcher

    searcher = build(method, seed=seed)
    trials: dict[str, dict[str, Any]] = {}
    for n in range(10_000):
        trial_id = f"t{n}"
        config = searcher.suggest(trial_id)
        if config == Searcher.FINISHED:
            break
        if not isinstance(config, dict):
            raise TypeError(f"{method} returned {config!r} with no trial running")
        result = train_one(dataset, config, sigma, bench._seed(seed, n))
        trials[trial_id] = {**result, "config": _config(config)}
        searcher.on_trial_complete(trial_id, result={METRIC: result["selection"], "epoch": DATASETS[dataset]["epochs"]})
    else:
        raise RuntimeError(f"{method} never finished")
    released = max(trials, key=lambda t: trials[t]["selection"]) if trials else None  # the first of equals
    chance = 1.0 / DATASETS[dataset]["classes"]
    return {
        "trials": len(trials),
        "steps": sum(t["steps"] for t in trials.values()),
        "released_trial": released,  # None: K = 0, nothing released (scored at chance)
        "released_config": trials[released]["config"] if released else None,
        "selection_accuracy": trials[released]["selection"] if released else chance,
        "held_out_accuracy": trials[released]["held_out"] if released else chance,
        "best_held_out_any_trial": max((t["held_out"] for t in trials.values()), default=chance),
    }


def work(task: dict[str, Any]) -> dict[str, Any]:
    """One task of the pool: a whole search, one point of the oracle's grid, or one oracle run."""
    start = time.perf_counter()
    dataset, epsilon, kind = task["dataset"], task["epsilon"], task["kind"]
    if kind == "search":
        out = run_search(dataset, epsilon, task["method"], task["rep"], task["sigma"], task["seed"])
    else:  # "grid" or "oracle": one run of fixed hyperparameters
        config = {"lr": task["lr"], "max_grad_norm": task["max_grad_norm"]}
        result = train_one(dataset, config, task["sigma"], task["seed"])
        out = {
            "trials": 1,
            "steps": result["steps"],
            "selection_accuracy": result["selection"],
            "held_out_accuracy": result["held_out"],
        }
    return {**task, **out, "seconds": time.perf_counter() - start}


def _seed_of(base: int, dataset: str, epsilon: float, what: str, rep: int) -> int:
    whats = [*METHODS, "oracle", "grid"]
    return bench._seed(base, list(DATASETS).index(dataset), int(epsilon * 1000), whats.index(what), rep)


# ----------------------------------------------------------------------------- statistics


def summarise(record: dict[str, Any]) -> dict[str, Any]:
    """Per (data set, ε): the oracle and every method, with the tax (oracle − method) and its Welch interval."""
    runs, calibration, oracle = record["runs"], record["calibration"], record["oracle"]
    out: dict[str, Any] = {}
    for dataset in record["settings"]["datasets"]:
        out[dataset] = {}
        for epsilon in record["settings"]["epsilons"]:
            key = str(epsilon)
            mine = [r for r in runs if r["dataset"] == dataset and r["epsilon"] == epsilon]
            finals = [r for r in mine if r["kind"] == "oracle"]
            grid_runs = [r for r in mine if r["kind"] == "grid"]
            rows: dict[str, Any] = {}
            for name in ("oracle", *METHODS):
                cal = calibration[dataset][key][name]
                if "infeasible" in cal:
                    rows[name] = {"infeasible": cal["infeasible"]}
                    continue
                chosen = finals if name == "oracle" else [r for r in mine if r.get("method") == name]
                if not chosen:
                    continue
                row: dict[str, Any] = {"searches": len(chosen), "sigma": cal["sigma"], "epsilon": cal["epsilon"]}
                row["one_trial_epsilon"] = cal["one_trial_epsilon"]
                if name == "oracle":
                    row["sigma_rdp"] = cal["sigma_rdp"]
                    row["trials"], row["trials_ci"] = len(grid_runs) + 1.0, 0.0
                    steps = [sum(r["steps"] for r in grid_runs) + r["steps"] for r in finals]
                    row["steps"], row["steps_ci"] = bench.mean_ci(steps)
                    row["chosen"] = oracle[dataset][key]
                    held = [r["held_out_accuracy"] for r in finals]
                    row["held_out_std"] = float(np.std(held, ddof=1)) if len(held) > 1 else math.nan
                else:
                    row["nothing_released"] = sum(r["released_trial"] is None for r in chosen)
                    for what in ("trials", "steps", "best_held_out_any_trial"):
                        row[what], row[what + "_ci"] = bench.mean_ci([r[what] for r in chosen])
                for what in ("selection_accuracy", "held_out_accuracy"):
                    row[what], row[what + "_ci"] = bench.mean_ci([r[what] for r in chosen])
                row["held_out_worst"] = min(r["held_out_accuracy"] for r in chosen)
                if name != "oracle" and finals:
                    row["tax"] = bench.welch(
                        [r["held_out_accuracy"] for r in finals], [r["held_out_accuracy"] for r in chosen]
                    )
                rows[name] = row
            out[dataset][key] = rows
    return out


def estimate_full(record: dict[str, Any]) -> dict[str, Any]:
    """The full run's wall time from this run's seconds per trial (per data set) and per calibration row."""
    settings = record["settings"]
    per_trial = {}
    for dataset in settings["datasets"]:
        mine = [r for r in record["runs"] if r["dataset"] == dataset]
        per_trial[dataset] = sum(r["seconds"] for r in mine) / max(1, sum(r["trials"] for r in mine))
    rows = len(settings["datasets"]) * len(settings["epsilons"])
    calibration_row = record["calibration_s"] * settings["workers"] / max(1, rows)  # CPU seconds per row
    full_grid = len(grid(quick=False)) * GRID_SEEDS["full"]
    searches, epsilons = 24, (1.0, 3.0, 8.0)
    cpu = 0.0
    for dataset in settings["datasets"]:
        trials = searches * MEAN_K * len(METHODS) + full_grid + searches  # every method feasible (an upper end)
        cpu += len(epsilons) * (trials * per_trial[dataset] + calibration_row)
    return {
        "seconds_per_trial": per_trial,
        "full_run_wall_s": cpu / settings["workers"],
        "assumes": (
            f"{searches} searches, ε ∈ {{1, 3, 8}}, {full_grid} grid runs, E[K] = {MEAN_K:g} trials a search, "
            f"{settings['workers']} workers kept busy, this run's seconds per trial and machine load"
        ),
    }


# ----------------------------------------------------------------------------- report


def render(record: dict[str, Any]) -> str:
    env, summary, settings = record["environment"], record["summary"], record["settings"]
    estimate = record["estimate"]
    n_grid, grid_seeds = len(record["grid"]), record["grid_seeds"]
    lines = [
        "# The tuning tax: private searches against an oracle's one run, at equal total ε",
        "",
        *bench.header_lines(env, f"{record['runtime_s']:.0f} s (calibration {record['calibration_s']:.0f} s)"),
        "",
        "Setting (`benchmarks/tuning_tax.py`'s docstring has the details): δ = 1e-5 for the whole search. Digits:",
        "`digits_cnn`, batch 64, 9 epochs (198 DP-SGD steps a trial). Breast cancer: 30 standardised features,",
        "`breast_cancer_mlp` (30 → 16 → 2), batch 32, 15 epochs (180 steps). Each validation set is split once into",
        "a selection half (the only score any search, and the oracle's grid, sees) and a held-out half (the",
        "released model's accuracy, measured afterwards).",
        "",
        "- **oracle** (an unattainable yardstick, not a private method): the best (lr, max_grad_norm) of a",
        f"  non-private {n_grid}-point grid (each point {grid_seeds} DP-SGD runs at the oracle's σ, picked by mean",
        "  selection accuracy; the grid's privacy cost is not counted), then one DP-SGD run with σ calibrated so",
        "  that the run alone costs the total ε (exact PLD of one run; σ_RDP: the RDP composition's, for",
        "  comparison). The grid runs once per row; the final run is repeated with fresh seeds.",
        "- Methods: σ calibrated so that the whole search costs the total ε",
        "  (`calibrate_noise_multiplier(..., mechanism=searcher.privacy_mechanism())`). Fixed clipping: lr ∈",
        f"  loguniform{LR_RANGE}, max_grad_norm ∈ uniform{CLIP_RANGE}; automatic clipping (AUTO-S, R = 1): lr ∈",
        f"  loguniform{AUTOMATIC_LR_RANGE} only.",
        "- **Tax** = oracle − method, held-out accuracy, with Welch's 95 % interval (negative: the released model",
        "  scored above the oracle's one run); other ± are 95 % t-intervals over searches. *trials* and *DP-SGD steps* are per search (the oracle's: its grid plus its one run);",
        "  *worst* is the lowest held-out accuracy of a search. The intervals cover the searches' randomness, not",
        "  the held-out sample's (one fixed half: 180 digits images, 86 breast cancer rows, i.e. steps of 0.012).",
        "",
        "## Tax summary (held-out accuracy; tax = oracle − method)",
        "",
        "| data set | total ε | oracle | " + " | ".join(f"`{m}`" for m in METHODS) + " | subsampled |",
        "|---|--:|--:|" + "--:|" * len(METHODS) + "---|",
    ]
    for dataset, by_epsilon in summary.items():
        for epsilon, rows in by_epsilon.items():
            oracle = rows.get("oracle", {})
            cells = []
            for method in METHODS:
                row = rows.get(method)
                if row is None:
                    cells.append("–")
                elif "infeasible" in row:
                    cells.append("infeasible")
                else:
                    cells.append(f"{row['held_out_accuracy']:.3f}, tax {bench.plus_minus(*row['tax'], 3)}")
            lines.append(
                f"| {dataset} | {float(epsilon):g} | {oracle.get('held_out_accuracy', math.nan):.3f} | "
                + " | ".join(cells)
                + " | not yet implemented |"
            )
    for dataset, by_epsilon in summary.items():
        for epsilon, rows in by_epsilon.items():
            n = max((row.get("searches", 0) for row in rows.values()), default=0)
            lines += [
                "",
                f"## {DATASETS[dataset]['label']}, total ε = {float(epsilon):g} ({n} searches / oracle runs each)",
                "",
                "| method | σ | ε | trials | DP-SGD steps | selection acc | held-out acc | worst | tax (oracle − method) |",
                "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
            ]
            for name, row in rows.items():
                label = ORACLE_LABEL if name == "oracle" else METHODS[name]["label"]
                if "infeasible" in row:
                    lines.append(f"| {label} | – | – | – | – | – | – | – | infeasible: no σ meets ε |")
                    continue
                sigma = f"{row['sigma']:.3f}" + (f" (σ_RDP {row['sigma_rdp']:.3f})" if name == "oracle" else "")
                trials = (
                    f"{n_grid} × {grid_seeds} + 1"
                    if name == "oracle"
                    else bench.plus_minus(row["trials"], row["trials_ci"], 1)
                )
                tax = bench.plus_minus(*row["tax"], 4) if "tax" in row else "0 (the yardstick)"
                lines.append(
                    f"| {label} | {sigma} | {row['epsilon']:.3f} | {trials} | "
                    f"{bench.plus_minus(row['steps'], row['steps_ci'], 0)} | "
                    f"{bench.plus_minus(row['selection_accuracy'], row['selection_accuracy_ci'])} | "
                    f"{bench.plus_minus(row['held_out_accuracy'], row['held_out_accuracy_ci'])} | "
                    f"{row['held_out_worst']:.3f} | {tax} |"
                )
            lines.append(f"| {NOT_IMPLEMENTED['subsampled']} | – | – | – | – | – | – | – | not yet implemented |")
            chosen = rows.get("oracle", {}).get("chosen")
            if chosen:
                lines += [
                    "",
                    f"Oracle's pick: lr = {chosen['lr']:.4g}, max_grad_norm = {chosen['max_grad_norm']:.4g} (grid "
                    f"mean selection accuracy {chosen['mean_selection_accuracy']:.3f}); its final runs' held-out "
                    f"accuracy has standard deviation {rows['oracle']['held_out_std']:.3f} over seeds (a search "
                    "releases the best of its K seeded runs; the oracle's one run is not selected over seeds). "
                    "One trial's ε at each method's σ: "
                    + ", ".join(
                        f"`{m}` {rows[m]['one_trial_epsilon']:.2f}"
                        for m in METHODS
                        if m in rows and "infeasible" not in rows[m]
                    )
                    + ".",
                ]
            lines += [
                f"\n`{m}`: {row['nothing_released']} search(es) drew K = 0 and released nothing (scored at chance)."
                for m, row in rows.items()
                if row.get("nothing_released")
            ]
    lines += [
        "",
        "## Compute and wall time",
        "",
        "Seconds per trial (all runs of this invocation, per data set): "
        + ", ".join(f"{d} {s:.2f} s" for d, s in estimate["seconds_per_trial"].items())
        + ".",
    ]
    if settings["quick"]:
        lines.append(
            f"Estimated wall time of the full run: **~{estimate['full_run_wall_s'] / 60:.0f} min** (an estimate: "
            f"{estimate['assumes']})."
        )
    lines.append("")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="ε = 3, 2 searches per method, 15-point grid; -quick files"
    )
    parser.add_argument("--searches", type=int, default=None, help="searches (and oracle runs) per row (default 24)")
    parser.add_argument("--epsilons", type=float, nargs="+", default=None, help="total ε's (default 1 3 8)")
    parser.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="processes (default 2)")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    searches = args.searches or (2 if args.quick else 24)
    epsilons = args.epsilons or ([3.0] if args.quick else [1.0, 3.0, 8.0])
    stem = "tuning_tax-quick" if args.quick else "tuning_tax"
    points = grid(args.quick)
    grid_seeds = GRID_SEEDS["quick" if args.quick else "full"]
    args.output_dir.mkdir(parents=True, exist_ok=True)
    env = bench.environment(args.workers)
    start = time.perf_counter()
    with mp.get_context("spawn").Pool(args.workers, initializer=init_worker) as pool:
        calibration: dict[str, Any] = {d: {str(e): {} for e in epsilons} for d in args.datasets}
        tasks = [(d, e, m) for d in args.datasets for e in epsilons for m in ("oracle", *METHODS)]
        for dataset, epsilon, method, values in pool.imap_unordered(calibrate, tasks):
            calibration[dataset][str(epsilon)][method] = values
            said = values.get(
                "infeasible", f"σ = {values.get('sigma', math.nan):.4f}, ε {values.get('epsilon', 0):.4f}"
            )
            print(f"{dataset} ε = {epsilon:g} {method}: {said[:90]} ({values['seconds']:.0f} s)", flush=True)
        calibration_s = time.perf_counter() - start

        def sigma(dataset: str, epsilon: float, name: str) -> float | None:
            return calibration[dataset][str(epsilon)][name].get("sigma")

        # The searches, longest first (digits), and the oracle's grid; then the oracle's final runs.
        tasks = [
            {"kind": "grid", "dataset": d, "epsilon": e, "rep": i, "grid_seed": j, "lr": lr, "max_grad_norm": c,
             "sigma": sigma(d, e, "oracle"), "seed": _seed_of(args.seed, d, e, "grid", 1000 * i + j)}
            for d in args.datasets for e in epsilons for i, (lr, c) in enumerate(points) for j in range(grid_seeds)
        ] + [
            {"kind": "search", "dataset": d, "epsilon": e, "method": m, "rep": rep, "sigma": sigma(d, e, m),
             "seed": _seed_of(args.seed, d, e, m, rep)}
            for rep in range(searches) for d in args.datasets for e in epsilons for m in METHODS
            if sigma(d, e, m) is not None
        ]  # fmt: skip
        runs = []

        def progress(run: dict[str, Any], done: int, total: int) -> None:
            what = run.get("method", run["kind"])
            print(
                f"[{done:3d}/{total}] {run['dataset']} ε = {run['epsilon']:g} {what:<17} #{run['rep']:<2}: "
                f"{run['trials']:2d} trials, selection {run['selection_accuracy']:.3f}, held-out "
                f"{run['held_out_accuracy']:.3f} ({run['seconds']:.0f} s; elapsed {time.perf_counter() - start:.0f} s)",
                flush=True,
            )

        for done, run in enumerate(pool.imap_unordered(work, tasks), start=1):
            runs.append(run)
            progress(run, done, len(tasks))
        oracle: dict[str, Any] = {d: {} for d in args.datasets}
        for d in args.datasets:
            for e in epsilons:
                scores = [
                    float(np.mean([r["selection_accuracy"] for r in runs if r["kind"] == "grid" and
                                   r["dataset"] == d and r["epsilon"] == e and r["rep"] == i]))
                    for i in range(len(points))
                ]  # fmt: skip
                best = int(np.argmax(scores))  # the first of equals
                oracle[d][str(e)] = {"lr": points[best][0], "max_grad_norm": points[best][1]}
                oracle[d][str(e)]["mean_selection_accuracy"] = scores[best]
                oracle[d][str(e)]["grid_mean_selection_accuracy"] = scores
        tasks = [
            {"kind": "oracle", "dataset": d, "epsilon": e, "rep": rep, "sigma": sigma(d, e, "oracle"),
             "lr": oracle[d][str(e)]["lr"], "max_grad_norm": oracle[d][str(e)]["max_grad_norm"],
             "seed": _seed_of(args.seed, d, e, "oracle", rep)}
            for rep in range(searches) for d in args.datasets for e in epsilons
        ]  # fmt: skip
        for done, run in enumerate(pool.imap_unordered(work, tasks), start=1):
            runs.append(run)
            progress(run, done, len(tasks))
    order = ["grid", "oracle", "search"]
    runs.sort(key=lambda r: (r["dataset"], r["epsilon"], order.index(r["kind"]), r.get("method", ""), r["rep"]))
    record: dict[str, Any] = {
        "environment": env,
        "settings": {
            "quick": args.quick,
            "delta": DELTA,
            "datasets": args.datasets,
            "dataset_settings": {d: DATASETS[d] for d in args.datasets},
            "breast_cancer_val_fraction": BREAST_CANCER_VAL_FRACTION,
            "epsilons": epsilons,
            "searches": searches,
            "workers": args.workers,
            "seed": args.seed,
            "mean_k": MEAN_K,
            "tnb_eta": TNB_ETA,
            "lr_range": LR_RANGE,
            "clip_range": CLIP_RANGE,
            "automatic_lr_range": AUTOMATIC_LR_RANGE,
            "methods": METHODS,
            "not_yet_implemented": NOT_IMPLEMENTED,
            "split": "validation -> selection / held-out halves, stratified, sklearn seed 0",
        },
        "grid": points,
        "grid_seeds": grid_seeds,
        "runtime_s": round(time.perf_counter() - start, 1),
        "calibration_s": round(calibration_s, 1),
        "calibration": calibration,
        "oracle": oracle,
        "runs": runs,
    }
    record["summary"] = summarise(record)
    record["estimate"] = estimate_full(record)
    bench.write_results(args.output_dir, stem, record, render(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
