"""Private successive halving against random-count search and DP-HyPO, at equal total ε, on digits.

Every method ends at the same total (ε, δ = 1e-5) for the whole search, ε ∈ {3, 8}: each
gets its own DP-SGD noise multiplier σ from ``calibrate_noise_multiplier(plan_for,
mechanism=searcher.privacy_mechanism())``, where ``plan_for(σ)`` is the 9-epoch trial's
plan (``trial_plan``: q = 64/1437, 22 steps an epoch, 198 steps). Methods:

* ``random_poisson``: ``RandomCountSearcher(Poisson(8))`` (the README's law), uniform configs;
* ``random_tnb``: ``RandomCountSearcher(TruncatedNegativeBinomial.from_mean(0.5, 8))``, the law
  DP-HyPO needs (it refuses Poisson), so that DP-HyPO differs from it only by adapting;
* ``dphypo``: ``DPHyPOSearcher`` with the same law and its defaults (C = 1.5, c = 0.75, β = 3);
* ``asha_8`` / ``asha_4``: ``PrivateASHAScheduler(max_t=9, grace_period=1, reduction_factor=3,
  budget_trials=8 / 4)``, one bracket: milestones 1, 3, 9 epochs; a budget of 72 / 36 epochs,
  i.e. the random counts' expected compute and half of it. Its bound (``SearchMechanism.halving``)
  composes the whole budget: one DP-SGD run of its steps (1 584 / 792);
* ``brackets_4x2`` / ``brackets_2x2``: the same scheduler with ``budget_trials=2`` (18 epochs a
  bracket) and ``repetitions=Poisson(4)`` / ``TruncatedNegativeBinomial.from_mean(0.5, 2)``: K
  independent brackets, the best winner released, accounted by P&S over one bracket; expected
  compute 72 / 36 epochs. (Poisson(2) for the half-compute row would release nothing in
  e^-2 = 13.5 % of searches; the truncated law never does. Poisson(4) does in 1.8 %; such a
  search, and a random count with K = 0, is scored at chance, 0.1.)

Each search is run whole, in-process and sequentially (one trial at a time, no Ray): trials
train with ``ray_dptune.training.train`` (``digits_cnn``, batch 64, SGD, default
``grad_sample_mode``); the scheduler is driven as Tune would drive it (``suggest``, one
``on_trial_result`` per epoch, a STOP ends the trial by raising out of ``report``), with
an in-memory ``SearchAccount`` that every charge is admitted to before the epoch runs
(checked at every report). The random counts' trials run all 9 epochs and report their
final score to the searcher (``on_trial_complete``).

Validation is public (no noisy score), as in ``benchmarks/dphypo_landscapes.py``. The 360
validation images of ``digits_data`` are split once, stratified (seed 0), into 180
*selection* images, the only score any method sees, and 180 *held-out* images, used only to
score the released model afterwards. Selection accuracy is biased upward by the selection
itself (more so with more trials); the held-out accuracy is not, and is the one compared.

Released model: random count and DP-HyPO, the trial with the best final selection score;
the scheduler, ``searcher.privacy_details()["released_trial_id"]`` (in its bracket, the best
score at the highest milestone reached; the best of the bracket winners), at that milestone.
Compute: DP-SGD steps summed over every epoch every trial ran. Intervals: 95 % t-intervals
over searches; differences use Welch's t.

Usage::

    .venv/bin/python benchmarks/private_scheduler.py            # 32 searches per (method, ε): ~28 min on 2 cores
    .venv/bin/python benchmarks/private_scheduler.py --quick    # 2 searches per method, ε = 8 only: ~2 min

Writes ``benchmarks/results/private_scheduler.{md,json}`` (``-quick`` suffix with ``--quick``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import multiprocessing as mp
import os
import platform
import shlex
import subprocess
import sys
import time
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
DELTA = 1e-5
BATCH_SIZE = 64
MAX_T = 9  # epochs of a whole trial
GRACE_PERIOD, REDUCTION_FACTOR = 1, 3  # milestones 1, 3, 9
TNB_ETA = 0.5
LR_RANGE = (0.05, 5.0)
CLIP_RANGE = (0.3, 6.0)
METRIC = "val_acc"
SPLIT_SEED = 0
CHANCE = 0.1  # the accuracy scored for a search that released nothing (K = 0 brackets)
METHODS: dict[str, dict[str, Any]] = {
    # kind, budget (whole trials per bracket), law of K (trials or brackets): (family, mean)
    "random_poisson": {"kind": "random", "law": ("poisson", 8.0), "label": "random count, Poisson(8)"},
    "random_tnb": {"kind": "random", "law": ("tnb", 8.0), "label": "random count, TNB(η=0.5, mean 8)"},
    "dphypo": {"kind": "dphypo", "law": ("tnb", 8.0), "label": "DP-HyPO, TNB(η=0.5, mean 8), C/c = 1.5/0.75"},
    "asha_8": {"kind": "halving", "budget": 8, "label": "private ASHA, one bracket of 8 trials (72 epochs)"},
    "asha_4": {"kind": "halving", "budget": 4, "label": "private ASHA, one bracket of 4 trials (36 epochs)"},
    "brackets_4x2": {
        "kind": "halving",
        "budget": 2,
        "law": ("poisson", 4.0),
        "label": "private ASHA, Poisson(4) brackets of 2 trials (E 72 epochs)",
    },
    "brackets_2x2": {
        "kind": "halving",
        "budget": 2,
        "law": ("tnb", 2.0),
        "label": "private ASHA, TNB(η=0.5, mean 2) brackets of 2 trials (E 36 epochs)",
    },
}
BASELINES = ("random_poisson", "random_tnb")
SCHEDULERS = tuple(name for name, spec in METHODS.items() if spec["kind"] == "halving")
BENCHMARKED_PATHS = ("ray_dptune",)


# ----------------------------------------------------------------------------- the methods


def space() -> dict[str, Any]:
    from ray import tune

    return {"lr": tune.loguniform(*LR_RANGE), "max_grad_norm": tune.uniform(*CLIP_RANGE)}


TRAIN_SIZE = 1437  # digits_data's training split (checked against the data in every worker)


def trial_plan_for(sigma: float) -> Any:
    """The whole trial's plan at σ: MAX_T epochs of Poisson batches of 64 out of 1 437."""
    from ray_dptune.training.plan import PrivacyParams, trial_plan

    return trial_plan(PrivacyParams(noise_multiplier=sigma, batch_size=BATCH_SIZE, epochs=MAX_T), TRAIN_SIZE)


def law(method: str) -> Any:
    """The law of K (trials, or brackets) of ``method``; None for one bracket."""
    from ray_dptune import Poisson
    from ray_dptune import TruncatedNegativeBinomial as TNB

    spec = METHODS[method].get("law")
    if spec is None:
        return None
    family, mean = spec
    return Poisson(mean) if family == "poisson" else TNB.from_mean(TNB_ETA, mean)


def planned_trials(method: str) -> float:
    """Whole trials' worth of epochs the method plans for: E[K] trials, or E[K] × the budget."""
    spec, k = METHODS[method], law(method)
    mean = 1.0 if k is None else k.mean
    return mean * spec["budget"] if spec["kind"] == "halving" else mean


def build(method: str, seed: int | None) -> Any:
    """The searcher (random count, DP-HyPO) or the scheduler (private ASHA) of ``method``."""
    from ray_dptune import DPHyPOSearcher, PrivateASHAScheduler, RandomCountSearcher

    spec = METHODS[method]
    common = {"metric": METRIC, "mode": "max", "space": space(), "seed": seed}
    if spec["kind"] == "random":
        return RandomCountSearcher(law(method), **common)
    if spec["kind"] == "dphypo":
        return DPHyPOSearcher(law(method), **common)
    return PrivateASHAScheduler(
        max_t=MAX_T,
        budget_trials=spec["budget"],
        grace_period=GRACE_PERIOD,
        reduction_factor=REDUCTION_FACTOR,
        repetitions=law(method),
        **common,
    )


def mechanism(method: str) -> Any:
    built = build(method, seed=0)
    return (built.searcher if METHODS[method]["kind"] == "halving" else built).privacy_mechanism()


def search_epsilon(method: str, sigma: float) -> float:
    """The whole search's ε at δ when every trial uses σ (nothing charged yet; the account's bound)."""
    from ray_dptune.accounting.bookkeeping.account import SearchAccount

    return SearchAccount(mechanism(method), delta=DELTA, plan=trial_plan_for(sigma).to_dict()).guarantee().epsilon


def one_trial_epsilon(sigma: float) -> float:
    """ε at δ of one whole trial (the same exact-profile accountant: a halving budget of one trial)."""
    from ray_dptune.accounting.bookkeeping.account import SearchAccount
    from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism

    one = SearchMechanism.halving(budget_units=MAX_T, max_t=MAX_T)
    return SearchAccount(one, delta=DELTA, plan=trial_plan_for(sigma).to_dict()).guarantee().epsilon


# ----------------------------------------------------------------------------- workers

_DATA: Any = None  # (train, selection, held-out)


def init_worker() -> None:
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    global _DATA
    from sklearn.model_selection import train_test_split
    from torch.utils.data import TensorDataset

    from ray_dptune.training import digits_data

    train, validation = digits_data()
    if len(train) != TRAIN_SIZE:
        raise RuntimeError(f"digits_data has {len(train)} training images, expected {TRAIN_SIZE}.")
    inputs, targets = validation.tensors
    selection, held_out = train_test_split(
        np.arange(len(targets)), test_size=0.5, random_state=SPLIT_SEED, stratify=targets.numpy()
    )
    _DATA = (
        train,
        TensorDataset(inputs[selection], targets[selection]),
        TensorDataset(inputs[held_out], targets[held_out]),
    )


def calibrate(task: tuple[float, str]) -> tuple[float, str, dict[str, float]]:
    """σ of ``method`` for total ε, with the ε it reaches and the reference ε's of the cost table."""
    from ray_dptune import calibrate_noise_multiplier

    epsilon, method = task
    start = time.perf_counter()
    sigma = calibrate_noise_multiplier(trial_plan_for, epsilon=epsilon, delta=DELTA, mechanism=mechanism(method))
    return (
        epsilon,
        method,
        {
            "sigma": sigma,
            "epsilon": search_epsilon(method, sigma),
            "one_trial_epsilon": one_trial_epsilon(sigma),
            "seconds": time.perf_counter() - start,
        },
    )


def _epsilon_at(task: tuple[float, str, float]) -> tuple[float, str, float]:
    epsilon, method, sigma = task
    return epsilon, method, search_epsilon(method, sigma)


class _Stop(Exception):
    """Raised from ``report`` when the scheduler says STOP: the trial runs no further epoch."""


def checkpoint_accuracy(model: Any, checkpoint_dir: str, dataset: Any) -> float:
    """Accuracy on ``dataset`` (a TensorDataset) of ``model`` with a trial checkpoint's weights (``model.pt``)."""
    import torch

    model.load_state_dict(torch.load(Path(checkpoint_dir) / "model.pt", weights_only=True))
    model.eval()
    inputs, targets = dataset.tensors
    with torch.no_grad():
        return float((model(inputs).argmax(dim=1) == targets).float().mean())


def _held_out_accuracy(checkpoint_dir: str) -> float:
    from ray_dptune.training import digits_cnn

    return checkpoint_accuracy(digits_cnn(), checkpoint_dir, _DATA[2])


def _run_trial(config: dict[str, Any], sigma: float, seed: int, on_epoch: Any) -> None:
    """Trains one trial (MAX_T epochs unless ``on_epoch`` raises _Stop)."""
    import torch.nn.functional as F

    from ray_dptune.training import PrivacyParams, TrainSpec, digits_cnn, train

    spec = TrainSpec(
        model_fn=digits_cnn,
        data_fn=lambda config: _DATA[:2],
        loss_fn=F.cross_entropy,
        privacy=PrivacyParams(noise_multiplier=float(sigma), batch_size=BATCH_SIZE, epochs=MAX_T),
        metric=METRIC,
        seed=seed,
    )
    try:
        train(config, spec, on_epoch)
    except _Stop:
        pass


def _seed(*entropy: int) -> int:
    return int(np.random.SeedSequence(list(entropy)).generate_state(1)[0])


def run_search(task: tuple[float, str, int, float, int]) -> dict[str, Any]:
    """One whole search of ``method`` at σ; what it released and what it spent."""
    epsilon, method, rep, sigma, base_seed = task
    from ray.tune.search import Searcher

    start = time.perf_counter()
    method_index = list(METHODS).index(method)
    built = build(method, seed=_seed(base_seed, int(epsilon * 1000), method_index, rep))
    scheduler = built if METHODS[method]["kind"] == "halving" else None
    searcher = scheduler.searcher if scheduler else built
    account = _attach_account(scheduler, sigma) if scheduler else None
    milestones = scheduler.rungs.milestones if scheduler else (MAX_T,)
    scores: dict[str, dict[int, float]] = {}
    held_out: dict[str, dict[int, float]] = {}
    configs: dict[str, dict[str, float]] = {}
    epochs = 0
    for n in range(10_000):
        trial_id = f"t{n}"
        config = searcher.suggest(trial_id)
        if config == Searcher.FINISHED:
            break
        if not isinstance(config, dict):
            raise TypeError(f"{method} returned {config!r} with no trial running")
        configs[trial_id] = {key: float(value) for key, value in config.items()}
        scores[trial_id], held_out[trial_id] = {}, {}

        def on_epoch(metrics: dict[str, Any], checkpoint_dir: str, trial_id: str = trial_id) -> None:
            nonlocal epochs
            epoch, score = int(metrics["epoch"]), float(metrics[METRIC])
            epochs += 1
            scores[trial_id][epoch] = score
            if epoch in milestones:
                held_out[trial_id][epoch] = _held_out_accuracy(checkpoint_dir)
            if scheduler is None:
                return
            if epoch > account.units_of(trial_id):
                raise AssertionError(f"{trial_id} ran epoch {epoch} with {account.units_of(trial_id)} charged")
            decision = scheduler.on_trial_result(None, _Trial(trial_id), {"training_iteration": epoch, METRIC: score})
            if decision == "STOP":
                raise _Stop

        _run_trial(config, sigma, _seed(base_seed, int(epsilon * 1000), method_index, rep, n), on_epoch)
        last = max(scores[trial_id])
        searcher.on_trial_complete(trial_id, result={METRIC: scores[trial_id][last], "epoch": last})
    else:
        raise RuntimeError(f"{method} never finished")

    brackets = None
    if scheduler:
        released = searcher.privacy_details().get("released_trial_id")  # the best bracket winner
        at = searcher.rungs_of(released).reached(released) if released is not None else None
        brackets = searcher.num_brackets
        budget = account.mechanism.params["budget_units"]
        if account.units_charged != epochs or any(account.bracket_units(b) > budget for b in range(brackets)):
            raise AssertionError(f"{epochs} epochs ran, {account.units_charged} charged, budget {budget} a bracket")
    else:  # the best final score (the first of equals)
        released = max(scores, key=lambda trial_id: scores[trial_id][MAX_T]) if scores else None
        at = MAX_T
    steps_per_epoch = trial_plan_for(sigma).steps // MAX_T
    return {
        "epsilon": epsilon,
        "method": method,
        "rep": rep,
        "sigma": sigma,
        "trials": len(scores),
        "epochs": epochs,
        "steps": epochs * steps_per_epoch,
        "brackets": brackets,
        "whole_trials": sum(max(s) == MAX_T for s in scores.values()),
        "released_trial": released,  # None: K = 0, nothing released (scored as chance)
        "released_epoch": at,
        "released_config": configs.get(released),
        "selection_accuracy": CHANCE if released is None else scores[released][at],
        "held_out_accuracy": CHANCE if released is None else held_out[released][at],
        "best_held_out_any_trial": max((max(h.values()) for h in held_out.values() if h), default=CHANCE),
        "seconds": time.perf_counter() - start,
    }


class _Trial:
    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id


def _attach_account(scheduler: Any, sigma: float) -> Any:
    """An in-memory account for the scheduler's searcher, as PrivacyAccountantCallback attaches its own."""
    from ray_dptune.accounting.bookkeeping.account import SearchAccount

    searcher = scheduler.searcher
    account = SearchAccount(searcher.privacy_mechanism(), delta=DELTA, plan=trial_plan_for(sigma).to_dict())

    def record(event: dict[str, Any]) -> None:
        account.admit(event)  # PrivacyError past the budget: nothing recorded
        account.apply(event)

    searcher.attach_recorder(record)
    searcher.attach_account(lambda: account)
    searcher.set_search_properties(METRIC, "max", space())
    scheduler.set_search_properties(METRIC, "max")
    return account


# ----------------------------------------------------------------------------- statistics


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t-interval."""
    from scipy import stats

    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return float(values.mean()), math.nan
    return float(values.mean()), float(
        stats.t.ppf(0.975, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size)
    )


def welch(a: list[float], b: list[float]) -> tuple[float, float]:
    """mean(a) − mean(b) and the half-width of Welch's 95 % interval."""
    from scipy import stats

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 2 or b.size < 2:
        return float(a.mean() - b.mean()), math.nan
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    if se == 0:
        return float(a.mean() - b.mean()), 0.0
    dof = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    return float(a.mean() - b.mean()), float(stats.t.ppf(0.975, dof) * se)


def summarise(runs: list[dict[str, Any]], calibration: dict[str, Any], epsilons: list[float]) -> dict[str, Any]:
    steps = trial_plan_for(1.0).steps
    reference = planned_trials("random_poisson")
    out: dict[str, Any] = {}
    for epsilon in epsilons:
        rows = {}
        for method in METHODS:
            mine = [r for r in runs if r["epsilon"] == epsilon and r["method"] == method]
            if not mine:
                continue
            row = {
                "searches": len(mine),
                "nothing_released": sum(r["released_trial"] is None for r in mine),
                **calibration[str(epsilon)][method],
            }
            for key in ("trials", "steps", "selection_accuracy", "held_out_accuracy", "best_held_out_any_trial"):
                row[key], row[key + "_ci"] = mean_ci([r[key] for r in mine])
            row["held_out_worst"] = min(r["held_out_accuracy"] for r in mine)
            released = [r["held_out_accuracy"] for r in mine if r["released_trial"] is not None]
            row["held_out_accuracy_released_only"] = float(np.mean(released)) if released else math.nan
            row["planned_steps"] = planned_trials(method) * steps
            row["planned_vs_random"] = planned_trials(method) / reference
            for baseline in BASELINES:
                theirs = [r for r in runs if r["epsilon"] == epsilon and r["method"] == baseline]
                if theirs and method != baseline:
                    for key in ("held_out_accuracy", "selection_accuracy"):
                        diff = welch([r[key] for r in mine], [r[key] for r in theirs])
                        row[f"{key}_minus_{baseline}"] = diff
            rows[method] = row
        out[str(epsilon)] = rows
    return out


def reading(diff: float, half: float, *, half_compute: bool) -> tuple[str, bool]:
    """How a held-out difference reads against the criterion, and whether the criterion holds.

    At ≤ ½ the planned compute the scheduler *reaches* the random count when its mean is at
    least the random count's; at equal compute it is *better* when Welch's interval of the
    difference lies above 0.
    """
    if diff - half > 0:
        return "holds: significantly better", True
    if diff + half < 0:
        return "does not hold: significantly worse", False
    if half_compute and diff >= 0:
        return "holds on the mean (the difference is within its interval)", True
    side = "better" if diff >= 0 else "worse"
    return f"not shown: {side} on the mean, within the interval", False


def verdict(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's criteria for every scheduler row against every random count, on the held-out accuracy."""
    checks = []
    for epsilon, rows in summary.items():
        for baseline in BASELINES:
            for method in SCHEDULERS:
                key = f"held_out_accuracy_minus_{baseline}"
                if baseline not in rows or key not in rows.get(method, {}):
                    continue
                row, ratio = rows[method], rows[method]["planned_vs_random"]
                if ratio > 1 + 1e-9:
                    continue
                half_compute = ratio <= 0.5 + 1e-9
                diff, half = row[key]
                text, holds = reading(diff, half, half_compute=half_compute)
                checks.append(
                    {
                        "epsilon": float(epsilon),
                        "method": method,
                        "baseline": baseline,
                        "planned_vs_random": ratio,
                        "criterion": "reaches it with ≤ ½ its compute" if half_compute else "better at equal compute",
                        "held_out": row["held_out_accuracy"],
                        "baseline_held_out": rows[baseline]["held_out_accuracy"],
                        "difference": diff,
                        "interval": half,
                        "reading": text,
                        "holds": holds,
                        "significant": holds and diff - half > 0,
                    }
                )
    return checks


# ----------------------------------------------------------------------------- report


def git_commit() -> str:
    """HEAD, with "+ local changes" when the package differs from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT.parent, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *BENCHMARKED_PATHS],
            cwd=ROOT.parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head} + local changes" if dirty else head


def environment(workers: int) -> dict[str, Any]:
    import torch

    python = sys.executable
    if python.startswith(os.getcwd() + os.sep):
        python = os.path.relpath(python)
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "command": shlex.join([python, *sys.argv]),
        "git_commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": (
            f"Python {platform.python_version()}, torch {torch.__version__}, opacus {metadata.version('opacus')}, "
            f"numpy {np.__version__}, scipy {metadata.version('scipy')}"
        ),
        "machine": f"{os.cpu_count()}-core CPU ({cpu}), {platform.system()} {platform.machine()}, shared",
        "workers": workers,
    }


def header_lines(env: dict[str, Any], wall_time: str) -> list[str]:
    """The run's provenance, as the first bullets of a results file."""
    return [
        f"- Command: `{env['command']}`",
        f"- Date (UTC): {env['date']}",
        f"- ray_dptune: commit {env['git_commit']}",
        f"- Versions: {env['versions']}",
        f"- Machine: {env['machine']}; {env['workers']} worker processes, torch threads 1 each",
        f"- Wall time: {wall_time}",
    ]


def plus_minus(value: float, half: float, digits: int = 4) -> str:
    return f"{value:.{digits}f}" if math.isnan(half) else f"{value:.{digits}f} ± {half:.{digits}f}"


def render(record: dict[str, Any]) -> str:
    env, summary, calibration = record["environment"], record["summary"], record["calibration"]
    steps = trial_plan_for(1.0).steps
    lines = [
        "# Private successive halving vs random-count search and DP-HyPO, at equal total ε, on digits",
        "",
        *header_lines(env, f"{record['runtime_s']:.0f} s (calibration {record['calibration_s']:.0f} s)"),
        "",
        "Setting (`benchmarks/private_scheduler.py`'s docstring has the details): digits, `digits_cnn`, DP-SGD",
        (
            f"with batch {BATCH_SIZE} (q = 64/1437, {steps // MAX_T} steps an epoch), a whole trial = {MAX_T} epochs = "
            f"{steps} steps, δ = {DELTA:g};"
        ),
        f"space lr ∈ loguniform{LR_RANGE}, max_grad_norm ∈ uniform{CLIP_RANGE}. Private ASHA: milestones 1, 3, 9",
        "epochs (grace 1, η = 3); one bracket is accounted by composing its budget, K ~ law brackets",
        "(`repetitions=`) by P&S over one bracket. The public validation set is split once into 180 selection",
        "images (every score the methods see) and 180 held-out images (the released model's accuracy, measured",
        "afterwards). Each method's σ is calibrated so that its *whole* search costs the row's total ε",
        "(`calibrate_noise_multiplier(..., mechanism=searcher.privacy_mechanism())`). Searches run sequentially",
        "(one trial at a time); the scheduler is driven through `on_trial_result` with an in-memory",
        "`SearchAccount` that admitted every epoch's charge before the epoch ran.",
        "",
        "Columns: *trials* and *DP-SGD steps* are per search (steps summed over every epoch every trial ran);",
        "*planned* is the expected compute (E[K] × 198 steps for the random counts, E[K] × budget for the",
        "scheduler) over the Poisson(8) random count's; *none* counts searches that released nothing",
        f"(K = 0, scored {CHANCE:g}, chance); accuracies are the released model's; ± is the 95 % t-interval",
        "over searches; *worst* is the lowest held-out accuracy of a search; Δ is the held-out difference to",
        "a random count with Welch's 95 % interval. The two validation halves differ in difficulty (the",
        "held-out half scores higher for every method): compare methods within a column, not across them.",
        "",
    ]
    for epsilon, rows in summary.items():
        n = max(row["searches"] for row in rows.values())
        lines += [
            f"## Total ε = {float(epsilon):g} ({n} searches per method)",
            "",
            (
                "| method | σ | search ε | trials | DP-SGD steps | planned | none | selection acc | held-out acc | "
                "worst | Δ vs Poisson(8) | Δ vs TNB(8) |"
            ),
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for method, row in rows.items():
            deltas = [
                plus_minus(*row[f"held_out_accuracy_minus_{b}"]) if f"held_out_accuracy_minus_{b}" in row else "–"
                for b in BASELINES
            ]
            lines.append(
                f"| {METHODS[method]['label']} | {row['sigma']:.4f} | {row['epsilon']:.3f} | "
                f"{plus_minus(row['trials'], row['trials_ci'], 1)} | {plus_minus(row['steps'], row['steps_ci'], 0)} | "
                f"{row['planned_vs_random']:.2f} | {row['nothing_released']} | "
                f"{plus_minus(row['selection_accuracy'], row['selection_accuracy_ci'])} | "
                f"{plus_minus(row['held_out_accuracy'], row['held_out_accuracy_ci'])} | {row['held_out_worst']:.3f} | "
                f"{deltas[0]} | {deltas[1]} |"
            )
        lines += [
            f"\n`{method}`: {row['nothing_released']} search(es) drew K = 0 and released nothing (scored {CHANCE:g}); "
            f"over the others the held-out mean is {row['held_out_accuracy_released_only']:.4f}."
            for method, row in rows.items()
            if row["nothing_released"]
        ]
        lines.append("")
    lines += [
        "## Where the composition cost comes from",
        "",
        "ε of one whole trial at each method's σ, and what each method's search would cost if its trials used",
        "the Poisson(8) random count's σ (same accountant, δ = 1e-5).",
        "",
        "| total ε | method | σ | one trial's ε at σ | search ε at σ_Poisson(8) | ÷ one trial's ε at σ_Poisson(8) |",
        "|--:|---|--:|--:|--:|--:|",
    ]
    for epsilon, rows in record["cost"].items():
        one = rows["one_trial_at_reference"]
        for method, cost in rows["methods"].items():
            lines.append(
                f"| {float(epsilon):g} | {METHODS[method]['label']} | {calibration[epsilon][method]['sigma']:.4f} | "
                f"{calibration[epsilon][method]['one_trial_epsilon']:.3f} | {cost['at_reference']:.3f} | "
                f"{cost['at_reference'] / one:.2f} |"
            )
    lines += ["", "## Verdict", ""]
    lines += [
        f"- ε = {c['epsilon']:g}, `{c['method']}` vs `{c['baseline']}` ({c['planned_vs_random']:.2f}× the planned "
        f"compute), {c['criterion']}: **{c['reading']}** (held-out {c['held_out']:.4f} vs "
        f"{c['baseline_held_out']:.4f}, Δ = {c['difference']:+.4f} ± {c['interval']:.4f})"
        for c in record["verdict"]
    ]
    lines += ["", record["verdict_text"], ""]
    return "\n".join(lines)


def verdict_text(record: dict[str, Any]) -> str:
    """The verdict in words, from the numbers: against the stronger random count first."""
    summary, checks, parts = record["summary"], record["verdict"], []
    answer = []

    def names(methods: list[str]) -> str:
        return ", ".join(f"`{m}`" for m in methods)

    for epsilon, rows in summary.items():
        if not all(b in rows for b in BASELINES):
            continue
        strong = max(BASELINES, key=lambda b: rows[b]["held_out_accuracy"])
        for baseline in sorted(BASELINES, key=lambda b: b != strong):
            relevant = [c for c in checks if c["epsilon"] == float(epsilon) and c["baseline"] == baseline]
            groups = {
                "the criterion holds significantly for": [c["method"] for c in relevant if c["significant"]],
                "it holds on the mean only (the interval includes 0) for": [
                    c["method"] for c in relevant if c["holds"] and not c["significant"]
                ],
                "not distinguishable from it (the interval includes 0, the mean is short of the criterion):": [
                    c["method"] for c in relevant if c["reading"].startswith("not shown")
                ],
                "significantly worse:": [c["method"] for c in relevant if c["reading"].startswith("does not hold")],
            }
            said = "; ".join(f"{what} {names(methods)}" for what, methods in groups.items() if methods)
            which = "stronger" if baseline == strong else "weaker"
            parts.append(
                f"At total ε = {float(epsilon):g}, against the {which} random count here (`{baseline}`, held-out "
                f"{rows[baseline]['held_out_accuracy']:.4f}): {said}."
            )
            if baseline == strong:
                answer.append((float(epsilon), baseline, relevant))
    if answer:
        significant = [(e, c["method"]) for e, _, relevant in answer for c in relevant if c["significant"]]
        on_mean = [(e, c["method"]) for e, _, relevant in answer for c in relevant if c["holds"]]
        if significant:
            head = "**Answer: yes**, against the stronger random count, for " + ", ".join(
                f"`{m}` at ε = {e:g}" for e, m in significant
            )
        elif on_mean:
            head = "**Answer: only on the mean**, within the intervals, against the stronger random count, for " + (
                ", ".join(f"`{m}` at ε = {e:g}" for e, m in on_mean)
            )
        else:
            head = (
                "**Answer: no.** Against the stronger random count at each ε, no private-scheduler row reaches its "
                "held-out accuracy with ≤ ½ its compute, and none is better at equal compute"
            )
        parts.insert(0, head + ". The numbers per ε and random count:")
    for epsilon, cost in record["cost"].items():
        cal = record["calibration"][epsilon]
        if "random_poisson" not in cal:
            continue
        sigmas = ", ".join(f"`{m}` {cal[m]['sigma']:.2f}" for m in METHODS if m in cal)
        at_reference = "; ".join(f"`{m}` {cost['methods'][m]['at_reference']:.2f}" for m in SCHEDULERS)
        parts.append(
            f"Composition cost at total ε = {float(epsilon):g}: σ {sigmas}. One bracket of private ASHA is "
            "accounted as one DP-SGD run of its whole budget (budget × 22 steps, every unit composed, whatever was "
            "stopped), while a random count pays for one trial plus repeat-and-select's overhead, whatever K is; "
            "K ~ law brackets pay for one bracket plus that overhead. At the Poisson(8) random count's σ = "
            f"{cal['random_poisson']['sigma']:.2f} (one trial: ε = {cost['one_trial_at_reference']:.2f}) the "
            f"scheduler rows would spend ε = {at_reference} instead of {float(epsilon):g}."
        )
    return "\n\n".join(parts)


# ----------------------------------------------------------------------------- main


def write_results(output_dir: Path, stem: str, record: dict[str, Any], markdown: str) -> None:
    """Writes ``stem``.json (the record) and ``stem``.md (its table) under ``output_dir`` and prints the table."""
    (output_dir / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n")
    (output_dir / f"{stem}.md").write_text(markdown)
    print(markdown)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 searches per method, ε = 8 only; -quick files")
    parser.add_argument("--searches", type=int, default=None, help="whole searches per (method, ε) (default 32)")
    parser.add_argument("--epsilons", type=float, nargs="+", default=None, help="total ε's (default 3 8)")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--output-dir", type=Path, default=RESULTS)
    parser.add_argument(
        "--render", type=Path, metavar="JSON", help="recompute the summary of a saved run and rewrite its .json/.md"
    )
    args = parser.parse_args(argv)
    if args.render:
        record = json.loads(args.render.read_text())
        runs, calibration = record["runs"], record["calibration"]
        record["summary"] = summarise(runs, calibration, record["settings"]["epsilons"])
        record["verdict"] = verdict(record["summary"])
        record["verdict_text"] = verdict_text(record)
        args.render.write_text(json.dumps(record, indent=1) + "\n")
        markdown = render(record)
        args.render.with_suffix(".md").write_text(markdown)
        print(markdown)
        return 0
    searches = args.searches or (2 if args.quick else 32)
    epsilons = args.epsilons or ([8.0] if args.quick else [3.0, 8.0])
    stem = "private_scheduler-quick" if args.quick else "private_scheduler"
    args.output_dir.mkdir(parents=True, exist_ok=True)
    env = environment(args.workers)

    start = time.perf_counter()
    with mp.get_context("spawn").Pool(args.workers, initializer=init_worker) as pool:
        calibration: dict[str, dict[str, Any]] = {str(e): {} for e in epsilons}
        # The halving calibrations (PLD of up to 1 584 steps) are the slow ones: they go first.
        tasks = sorted(((e, m) for e in epsilons for m in METHODS), key=lambda t: METHODS[t[1]]["kind"] != "halving")
        for epsilon, method, values in pool.imap_unordered(calibrate, tasks):
            calibration[str(epsilon)][method] = values
            print(f"ε = {epsilon:g} {method}: σ = {values['sigma']:.4f} (search ε {values['epsilon']:.4f}, "
                  f"{values['seconds']:.0f} s)", flush=True)  # fmt: skip
        calibration = {e: {m: calibration[e][m] for m in METHODS} for e in calibration}
        reference = {str(e): calibration[str(e)]["random_poisson"]["sigma"] for e in epsilons}
        cost: dict[str, Any] = {
            str(e): {"one_trial_at_reference": one_trial_epsilon(reference[str(e)]), "methods": {}} for e in epsilons
        }
        for epsilon, method, value in pool.imap_unordered(
            _epsilon_at, [(e, m, reference[str(e)]) for e in epsilons for m in METHODS]
        ):
            cost[str(epsilon)]["methods"][method] = {"at_reference": value}
        cost = {e: {**c, "methods": {m: c["methods"][m] for m in METHODS}} for e, c in cost.items()}
        calibration_s = time.perf_counter() - start
        print(f"calibration done in {calibration_s:.0f} s", flush=True)

        tasks = [
            (e, m, rep, calibration[str(e)][m]["sigma"], args.seed)
            for rep in range(searches)
            for e in epsilons
            for m in METHODS
        ]
        runs = []
        for done, run in enumerate(pool.imap_unordered(run_search, tasks), start=1):
            runs.append(run)
            print(
                f"[{done:3d}/{len(tasks)}] ε = {run['epsilon']:g} {run['method']:<14} #{run['rep']:<2}: "
                f"{run['trials']:2d} trials, {run['steps']:5d} steps, selection {run['selection_accuracy']:.3f}, "
                f"held-out {run['held_out_accuracy']:.3f} ({run['seconds']:.0f} s; elapsed "
                f"{time.perf_counter() - start:.0f} s)",
                flush=True,
            )
    runs.sort(key=lambda r: (r["epsilon"], list(METHODS).index(r["method"]), r["rep"]))
    summary = summarise(runs, calibration, epsilons)
    record = {
        "environment": env,
        "settings": {
            "delta": DELTA,
            "batch_size": BATCH_SIZE,
            "max_t": MAX_T,
            "grace_period": GRACE_PERIOD,
            "reduction_factor": REDUCTION_FACTOR,
            "tnb_eta": TNB_ETA,
            "lr_range": LR_RANGE,
            "clip_range": CLIP_RANGE,
            "methods": METHODS,
            "searches": searches,
            "epsilons": epsilons,
            "seed": args.seed,
            "split": "validation 360 -> 180 selection / 180 held-out, stratified, sklearn seed 0",
            "nothing_released_scores": CHANCE,
        },
        "runtime_s": round(time.perf_counter() - start, 1),
        "calibration_s": round(calibration_s, 1),
        "calibration": calibration,
        "cost": cost,
        "summary": summary,
        "verdict": verdict(summary),
        "runs": runs,
    }
    record["verdict_text"] = verdict_text(record)
    write_results(args.output_dir, stem, record, render(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
