"""Tuning on a sample, then training once, against a random-count search and an oracle's one run.

For each data set and total ε (δ = 1e-5, the whole procedure), the held-out accuracy of the
released model of:

* ``oracle`` (an **unattainable yardstick**): the best (lr, max_grad_norm) of a grid of 5 × 3
  points (lr ∈ geomspace(0.05, 5), max_grad_norm ∈ geomspace(0.3, 6)), each trained twice with
  DP-SGD at the oracle's σ and picked by its mean selection accuracy, its privacy cost not counted;
  then one DP-SGD run with those hyperparameters, σ calibrated so that this run alone costs the
  total ε (its exact privacy loss distribution: ``calibrate.one_run_noise_multiplier``);
* ``random_poisson``: ``RandomCountSearcher(Poisson(8))`` on all the data, σ calibrated for the
  whole search (``calibrate_noise_multiplier``), the best trial released;
* ``subsampled``: ``SubsampledTuningSearcher(Poisson(8), tuning_fraction=p)``: K trials on a
  secret Poisson sample of rate p at σ_T, then the best configuration trained once on all the data
  at σ_B (``calibrate_subsampled_tuning``, ``final_noise_overhead`` 0.1; the extrapolation keeps
  every hyperparameter), the final run released.

Every search draws lr ∈ loguniform(0.05, 5) and max_grad_norm ∈ uniform(0.3, 6), trains each
trial whole (``ray_dptune.training.train``, in process, no Ray) and selects on a selection half
of the validation set; the other half scores the released model. Each searcher's stated ε is
checked against the target with the account (``search_epsilon``). The tax of a row is oracle −
method in held-out accuracy, with Welch's 95 % interval; ± is a 95 % t-interval over searches.
Compute: DP-SGD steps per search (the runs' spending guards' counts).

Data sets:

* ``digits``: ``ray_dptune.training.digits_data`` (1 437 train; validation 360 → 180 / 180),
  ``digits_cnn``, batch 64, 9 epochs;
* ``synthetic``: scikit-learn's ``make_classification(n_samples=44_000, n_features=30,
  n_informative=12, n_redundant=6, n_classes=2, class_sep=0.8, flip_y=0.02, random_state=0)``,
  40 000 train / 4 000 validation (→ 2 000 / 2 000), standardised on the training split; an MLP
  30 → 16 tanh → 2; batch 256, 3 epochs. A 10 % sample (4 000 records) is itself a training set.

Usage::

    .venv/bin/python benchmarks/subsampled_tuning.py                 # 8 searches a row, ε ∈ {1, 3, 8}
    .venv/bin/python benchmarks/subsampled_tuning.py --quick         # ε = 3, 2 searches a row

Writes ``benchmarks/results/subsampled_tuning.{md,json}`` (``-quick`` with ``--quick``, ``-pP`` with
``--fraction P`` other than 0.1).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import private_scheduler as bench  # shared statistics (mean_ci, welch) and provenance (environment)

RESULTS = Path(__file__).resolve().parent / "results"
DELTA = 1e-5
METRIC = "val_acc"
MEAN_K = 8.0
LR_RANGE = (0.05, 5.0)
CLIP_RANGE = (0.3, 6.0)
DATASETS: dict[str, dict[str, Any]] = {
    "digits": {"batch_size": 64, "epochs": 9, "classes": 10},
    "synthetic": {"batch_size": 256, "epochs": 3, "classes": 2},
}
METHODS = ("oracle", "random_poisson", "subsampled")
_DATA: dict[str, tuple[Any, Any, Any]] = {}  # data set -> (train, selection, held-out)


# ----------------------------------------------------------------------------- data and models


def synthetic_data() -> tuple[Any, Any]:
    """The generated task: 40 000 / 4 000 rows of 30 standardised features, 2 classes."""
    import torch
    from sklearn.datasets import make_classification
    from torch.utils.data import TensorDataset

    x, y = make_classification(
        n_samples=44_000,
        n_features=30,
        n_informative=12,
        n_redundant=6,
        n_classes=2,
        class_sep=0.8,
        flip_y=0.02,
        random_state=0,
    )
    x_train, x_val, y_train, y_val = x[:40_000], x[40_000:], y[:40_000], y[40_000:]
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)

    def tensors(inputs: Any, labels: Any) -> Any:
        return TensorDataset(torch.tensor((inputs - mean) / std, dtype=torch.float32), torch.tensor(labels))

    return tensors(x_train, y_train), tensors(x_val, y_val)


def mlp(config: Any = None) -> Any:
    from torch import nn

    return nn.Sequential(nn.Linear(30, 16), nn.Tanh(), nn.Linear(16, 2))


def model_fn(dataset: str) -> Any:
    from ray_dptune.training import digits_cnn

    return digits_cnn if dataset == "digits" else mlp


def load(dataset: str) -> tuple[Any, Any, Any]:
    """(train, selection half, held-out half) of the validation set, split once, stratified, seed 0."""
    from sklearn.model_selection import train_test_split
    from torch.utils.data import TensorDataset

    from ray_dptune.training import digits_data

    train, validation = digits_data() if dataset == "digits" else synthetic_data()
    inputs, targets = validation.tensors
    selection, held_out = train_test_split(
        np.arange(len(targets)), test_size=0.5, random_state=0, stratify=targets.numpy()
    )
    return (
        train,
        TensorDataset(inputs[selection], targets[selection]),
        TensorDataset(inputs[held_out], targets[held_out]),
    )


def init_worker() -> None:
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    for dataset in DATASETS:
        _DATA[dataset] = load(dataset)


# ----------------------------------------------------------------------------- plans and calibration


def plan(dataset: str, sigma: float, *, size: int | None = None) -> Any:
    from ray_dptune.training.plan import PrivacyParams, trial_plan

    spec = DATASETS[dataset]
    params = PrivacyParams(noise_multiplier=sigma, batch_size=spec["batch_size"], epochs=spec["epochs"])
    return trial_plan(params, size or len(_DATA[dataset][0]))


def calibrate(dataset: str, epsilon: float, fraction: float) -> dict[str, Any]:
    """σ of each method for total ε, and the account's ε at it."""
    from ray_dptune import Poisson
    from ray_dptune.accounting.bookkeeping.calibrate import (
        calibrate_noise_multiplier,
        calibrate_subsampled_tuning,
        one_run_noise_multiplier,
        search_epsilon,
    )
    from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
    from ray_dptune.tuning_sample import planned_sample_size

    law = Poisson(MEAN_K)
    sample = planned_sample_size(fraction, len(_DATA[dataset][0]))
    oracle = one_run_noise_multiplier(lambda s: plan(dataset, s), epsilon=epsilon, delta=DELTA)
    poisson = calibrate_noise_multiplier(lambda s: plan(dataset, s), epsilon=epsilon, delta=DELTA, law=law)
    sigma_tuning, sigma_final = calibrate_subsampled_tuning(
        lambda s: plan(dataset, s, size=sample),
        lambda s: plan(dataset, s),
        epsilon=epsilon,
        delta=DELTA,
        law=law,
        sample_rate=fraction,
    )
    whole = SearchMechanism.subsampled_tuning(
        law=law, num_trials=1, sample_rate=fraction, final_plan=plan(dataset, sigma_final)
    )
    stated = {
        "random_poisson": search_epsilon(plan(dataset, poisson), delta=DELTA, law=law),
        "subsampled": search_epsilon(plan(dataset, sigma_tuning, size=sample), delta=DELTA, mechanism=whole),
    }
    assert all(value <= epsilon for value in stated.values()), stated
    return {
        "oracle": oracle,
        "random_poisson": poisson,
        "subsampled_tuning": sigma_tuning,
        "subsampled_final": sigma_final,
        "stated_epsilon": stated,
    }


# ----------------------------------------------------------------------------- runs


def train_one(dataset: str, config: dict[str, Any], seed: int) -> dict[str, Any]:
    """One whole DP-SGD trial at ``config["noise_multiplier"]``: its selection and held-out accuracies, its steps."""
    import torch.nn.functional as F

    from ray_dptune.training import PrivacyParams, TrainSpec, train

    spec_of = DATASETS[dataset]
    spec = TrainSpec(
        model_fn=model_fn(dataset),
        data_fn=lambda _: _DATA[dataset][:2],
        loss_fn=F.cross_entropy,
        privacy=PrivacyParams(noise_multiplier=None, batch_size=spec_of["batch_size"], epochs=spec_of["epochs"]),
        metric=METRIC,
        seed=seed,
    )
    out: dict[str, Any] = {}

    def report(metrics: dict[str, Any], checkpoint_dir: str) -> None:
        if int(metrics["epoch"]) == spec_of["epochs"]:
            out["selection"] = float(metrics[METRIC])
            out["held_out"] = bench.checkpoint_accuracy(model_fn(dataset)(), checkpoint_dir, _DATA[dataset][2])

    spent = train(config, spec, report)
    out["steps"] = int(spent.steps)
    return out


def run_search(task: dict[str, Any]) -> dict[str, Any]:
    """One whole search (random count or subsampled), in this process: what it released and spent."""
    from ray import tune
    from ray.tune.search import Searcher

    from ray_dptune import Poisson, RandomCountSearcher
    from ray_dptune.search.subsampled import SubsampledTuningSearcher

    dataset, sigmas, seed = task["dataset"], task["sigmas"], task["seed"]
    space = {"lr": tune.loguniform(*LR_RANGE), "max_grad_norm": tune.uniform(*CLIP_RANGE)}
    common = {"metric": METRIC, "mode": "max", "space": space, "seed": seed}
    if task["method"] == "subsampled":
        final = plan(dataset, sigmas["subsampled_final"])
        searcher: Any = SubsampledTuningSearcher(
            Poisson(MEAN_K),
            tuning_fraction=task["fraction"],
            final_plan=final,
            final_noise_multiplier=final.noise_multiplier,
            **common,
        )
        sigma = sigmas["subsampled_tuning"]
    else:
        searcher, sigma = RandomCountSearcher(Poisson(MEAN_K), **common), sigmas["random_poisson"]
    trials: dict[str, dict[str, Any]] = {}
    for n in range(1000):
        config = searcher.suggest(f"t{n}")
        if config == Searcher.FINISHED:
            break
        config = {"noise_multiplier": sigma, **config}  # the param_space's constant; the final run's σ_B wins
        result = train_one(dataset, config, bench._seed(seed, n))
        trials[f"t{n}"] = {**result, "final": searcher.final_trial(config)}
        searcher.on_trial_complete(f"t{n}", result={METRIC: result["selection"]})
    finals = [t for t in trials.values() if t["final"]]
    if finals:
        released = finals[0]
    else:
        released = max(trials.values(), key=lambda t: t["selection"]) if trials else None
    chance = 1.0 / DATASETS[dataset]["classes"]
    return {
        **task,
        "trials": len(trials),
        "steps": sum(t["steps"] for t in trials.values()),
        "held_out_accuracy": released["held_out"] if released else chance,
    }


def run_fixed(task: dict[str, Any]) -> dict[str, Any]:
    """One run of fixed hyperparameters: a point of the oracle's grid, or the oracle's released run."""
    config = {"lr": task["lr"], "max_grad_norm": task["max_grad_norm"], "noise_multiplier": task["sigma"]}
    result = train_one(task["dataset"], config, task["seed"])
    return {**task, **result}


def work(task: dict[str, Any]) -> dict[str, Any]:
    start = time.perf_counter()
    out = run_search(task) if task["kind"] == "search" else run_fixed(task)
    return {**out, "seconds": time.perf_counter() - start}


# ----------------------------------------------------------------------------- the run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="ε = 3, 2 searches a row")
    parser.add_argument("--searches", type=int, default=None, help="searches (and oracle runs) a row (default 8)")
    parser.add_argument("--fraction", type=float, default=0.1, help="the tuning sample's rate p (default 0.1)")
    parser.add_argument("--epsilons", type=float, nargs="+", default=None, help="total ε (default 1 3 8)")
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    args = parser.parse_args(argv)
    searches = args.searches or (2 if args.quick else 8)
    epsilons = args.epsilons or ([3.0] if args.quick else [1.0, 3.0, 8.0])
    start = time.perf_counter()
    init_worker()
    sigmas = {(d, e): calibrate(d, e, args.fraction) for d in args.datasets for e in epsilons}
    grid = [(float(lr), float(c)) for lr in np.geomspace(*LR_RANGE, 5) for c in np.geomspace(*CLIP_RANGE, 3)]
    tasks = []
    for (dataset, epsilon), sigma in sigmas.items():
        for index, (lr, clip) in enumerate(grid):
            for rep in range(2):
                tasks.append(
                    {
                        "kind": "grid",
                        "dataset": dataset,
                        "epsilon": epsilon,
                        "sigma": sigma["oracle"],
                        "lr": lr,
                        "max_grad_norm": clip,
                        "seed": bench._seed(7, index, rep, int(epsilon * 1000)),
                    }
                )
        for method in ("random_poisson", "subsampled"):
            for rep in range(searches):
                tasks.append(
                    {
                        "kind": "search",
                        "dataset": dataset,
                        "epsilon": epsilon,
                        "method": method,
                        "rep": rep,
                        "sigmas": sigma,
                        "fraction": args.fraction,
                        "seed": bench._seed(11, rep, int(epsilon * 1000)),
                    }
                )
    with mp.get_context("spawn").Pool(2, initializer=init_worker) as pool:
        done = pool.map(work, tasks, chunksize=1)
        oracle_tasks = []
        for (dataset, epsilon), sigma in sigmas.items():
            points = [t for t in done if t["kind"] == "grid" and (t["dataset"], t["epsilon"]) == (dataset, epsilon)]
            best = max(
                grid,
                key=lambda point: np.mean([t["selection"] for t in points if (t["lr"], t["max_grad_norm"]) == point]),
            )
            for rep in range(searches):
                oracle_tasks.append(
                    {
                        "kind": "oracle",
                        "dataset": dataset,
                        "epsilon": epsilon,
                        "sigma": sigma["oracle"],
                        "lr": best[0],
                        "max_grad_norm": best[1],
                        "seed": bench._seed(13, rep, int(epsilon * 1000)),
                    }
                )
        done += pool.map(work, oracle_tasks, chunksize=1)
    record = {
        "command": "benchmarks/subsampled_tuning.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "environment": bench.environment(2),
        "fraction": args.fraction,
        "searches": searches,
        "sigmas": {f"{d} ε={e:g}": s for (d, e), s in sigmas.items()},
        "rows": summarise(done, sigmas),
        "runs": [{k: v for k, v in t.items() if k != "sigmas"} for t in done],
        "seconds": time.perf_counter() - start,
    }
    suffix = ("-quick" if args.quick else "") + ("" if args.fraction == 0.1 else f"-p{args.fraction:g}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"subsampled_tuning{suffix}.json").write_text(json.dumps(record, indent=1))
    (RESULTS / f"subsampled_tuning{suffix}.md").write_text(render(record))
    print(render(record))
    return 0


def summarise(done: list[dict[str, Any]], sigmas: dict[tuple[str, float], dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for (dataset, epsilon), sigma in sigmas.items():
        oracle = [
            t["held_out"] for t in done if t["kind"] == "oracle" and (t["dataset"], t["epsilon"]) == (dataset, epsilon)
        ]
        oracle_steps = [
            t["steps"] for t in done if t["kind"] == "oracle" and (t["dataset"], t["epsilon"]) == (dataset, epsilon)
        ]
        rows.append(_row(dataset, epsilon, "oracle", oracle, oracle_steps, oracle, f"σ = {sigma['oracle']:.3f}"))
        for method in ("random_poisson", "subsampled"):
            runs = [
                t
                for t in done
                if t["kind"] == "search"
                and t["method"] == method
                and (t["dataset"], t["epsilon"]) == (dataset, epsilon)
            ]
            noise = (
                f"σ = {sigma['random_poisson']:.3f}"
                if method == "random_poisson"
                else f"σ_T = {sigma['subsampled_tuning']:.3f}, σ_B = {sigma['subsampled_final']:.3f}"
            )
            rows.append(
                _row(
                    dataset,
                    epsilon,
                    method,
                    [t["held_out_accuracy"] for t in runs],
                    [t["steps"] for t in runs],
                    oracle,
                    noise,
                )
            )
    return rows


def _row(
    dataset: str, epsilon: float, method: str, held_out: list[float], steps: list[int], oracle: list[float], noise: str
) -> dict[str, Any]:
    mean, half = bench.mean_ci(held_out)
    tax = bench.welch(oracle, held_out) if method != "oracle" else None
    return {
        "dataset": dataset,
        "epsilon": epsilon,
        "method": method,
        "noise": noise,
        "held_out": [mean, half],
        "worst": min(held_out),
        "tax": tax,
        "steps": float(np.mean(steps)),
    }


def render(record: dict[str, Any]) -> str:
    lines = [
        "# Tuning on a sample, then training once: the tuning tax and the compute",
        "",
        (
            f"Command: `.venv/bin/python {record['command'].strip()}` ({record['seconds']:.0f} s). "
            f"{record['searches']} searches (or oracle runs) a row; tuning sample p = {record['fraction']:g}; "
            "δ = 1e-5 for the whole procedure; held-out accuracy of the released model, 95 % intervals."
        ),
        "",
        "| data set | ε | method | noise | held-out accuracy | worst | tax vs oracle | DP-SGD steps / search |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in record["rows"]:
        mean, half = row["held_out"]
        tax = "–" if row["tax"] is None else _tax(row["tax"])
        lines.append(
            f"| {row['dataset']} | {row['epsilon']:g} | {row['method']} | {row['noise']} | "
            f"{100 * mean:.1f} ± {100 * half:.1f} | {100 * row['worst']:.1f} | {tax} | {row['steps']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def _tax(welch: Any) -> str:
    difference, half = welch
    return f"{100 * difference:.1f} ± {100 * half:.1f}"


if __name__ == "__main__":
    raise SystemExit(main())
