"""Landscapes for the DP-HyPO utility benchmark (``benchmarks/dphypo.py``), cached once.

The DP-HyPO paper (Wang et al. 2023, §4.2.1 and App. E.1) compares its adaptive
searcher with uniform random-count search on a *semi-real* simulation: DP-SGD is
trained on a 16×20 grid of (learning rate, clipping norm), the mean accuracy of 5
models per grid point is cached, and each visit of a point during a simulated search
returns the cached mean plus Gaussian noise. This script builds the same kind of
landscape on data we have, scikit-learn's digits, with this package's own DP-SGD loop
(``ray_dptune.training.train``, called directly, no Ray):

* grid: learning rate log-spaced over [1e-4, 10] with factor 10^(1/3) (16 values) ×
  clipping norm 0.3, 0.6, …, 6.0 (20 values), the paper's Setting E.1;
* model and data: ``digits_cnn`` on ``digits_data`` (1 437 train / 360 validation
  images), SGD, batch size 64 (q = 64/1437), 5 epochs (110 noisy steps), Opacus
  ``grad_sample_mode="ew"``; the score is the final validation accuracy (public
  validation data: no noisy score release);
* ``--seeds`` independently trained models per grid point (seed = initialisation,
  Poisson sampling and DP noise), mean and standard error (ddof = 1) stored;
* two noise multipliers, the "white-box" equal-total-ε setting: both searches end at
  the same total (ε, δ); DP-HyPO's bound (Theorem 1, ``density_ratio`` = C/c =
  2/0.75) charges for adaptivity, so the uniform search's trials may use a *smaller*
  σ. Both are calibrated with ``calibrate_noise_multiplier`` for a geometric number
  of trials with mean 1/γ = ``--mean-trials`` (100: γ = 0.01, the middle of the
  paper's range 0.001…0.03), total ε = ``--target-epsilon`` (8), δ = 1e-5.

Also a synthetic multi-modal landscape on the same grid (three Gaussian bumps in
(log10 lr, clip) space: one narrow high peak, one broad lower one, one small), no
training involved.

Writes ``benchmarks/data/dphypo_landscapes.npz`` (grid axes, σ's, per-seed
accuracies, means, standard errors, the synthetic landscape) and
``benchmarks/data/dphypo_landscapes.json`` (settings, runtime, summary).

Usage::

    .venv/bin/python benchmarks/dphypo_landscapes.py                # ~6-8 minutes on 2 cores
    .venv/bin/python benchmarks/dphypo_landscapes.py --synthetic-only   # seconds
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import shlex
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

DATA_DIR = Path(__file__).resolve().parent / "data"
NPZ_NAME = "dphypo_landscapes.npz"
JSON_NAME = "dphypo_landscapes.json"

LEARNING_RATES = 10.0 ** (-4.0 + np.arange(16) / 3.0)  # 1e-4 … 10, factor 10^(1/3)
CLIPPING_NORMS = np.round(0.3 * np.arange(1, 21), 10)  # 0.3 … 6.0
UPPER, LOWER = 2.0, 0.75  # DP-HyPO's C and c in the paper's experiments
DELTA = 1e-5
TRAIN_SIZE = 1437  # digits_data's training split


# ----------------------------------------------------------------------------- σ's


def noise_multipliers(target_epsilon: float, mean_trials: float, batch_size: int, epochs: int) -> dict[str, Any]:
    """σ_HyPO and σ_uniform giving both searches the same total ε, with the ε's they reach."""
    from ray_dptune.accounting.bookkeeping.calibrate import calibrate_noise_multiplier, search_epsilon
    from ray_dptune.accounting.bookkeeping.spend import TrialSpend
    from ray_dptune.accounting.bounds.distributions import Geometric
    from ray_dptune.training import sampling_schedule

    law = Geometric.from_mean(mean_trials)
    sample_rate, steps_per_epoch = sampling_schedule(TRAIN_SIZE, batch_size)
    steps = epochs * steps_per_epoch
    ratio = UPPER / LOWER

    def plan_for(sigma: float) -> TrialSpend:
        return TrialSpend(sample_rate=sample_rate, noise_multiplier=sigma, steps=steps)

    budget = {"epsilon": target_epsilon, "delta": DELTA, "law": law}
    sigma_hypo = calibrate_noise_multiplier(plan_for, **budget, density_ratio=ratio, rtol=1e-4)
    sigma_uniform = calibrate_noise_multiplier(plan_for, **budget, rtol=1e-4)
    eps_hypo = search_epsilon(plan_for(sigma_hypo), law=law, delta=DELTA, density_ratio=ratio)
    eps_uniform = search_epsilon(plan_for(sigma_uniform), law=law, delta=DELTA)
    return {
        "law": law.to_dict(),
        "mean_trials": law.mean,
        "sample_rate": sample_rate,
        "steps": steps,
        "delta": DELTA,
        "target_epsilon": target_epsilon,
        "density_ratio": ratio,
        "sigma_hypo": sigma_hypo,
        "sigma_uniform": sigma_uniform,
        "epsilon_hypo": eps_hypo,
        "epsilon_uniform": eps_uniform,
    }


# ----------------------------------------------------------------------------- training


_DATA: Any = None


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    global _DATA
    from ray_dptune.training import digits_data

    _DATA = digits_data()


def _train_row(task: tuple[int, int, float, int, int, int]) -> tuple[int, int, np.ndarray, float]:
    """All clipping norms × seeds of one (σ, learning rate) row: final validation accuracies."""
    import torch.nn.functional as F

    from ray_dptune.training import PrivacyParams, TrainSpec, digits_cnn, train

    sigma_index, lr_index, sigma, seeds, batch_size, epochs = task
    start = time.perf_counter()
    accuracies = np.full((len(CLIPPING_NORMS), seeds), np.nan)
    for clip_index, clip in enumerate(CLIPPING_NORMS):
        for seed in range(seeds):
            spec = TrainSpec(
                model_fn=digits_cnn,
                data_fn=lambda config: _DATA,
                loss_fn=F.cross_entropy,
                privacy=PrivacyParams(noise_multiplier=float(sigma), batch_size=batch_size, epochs=epochs),
                seed=int(np.random.SeedSequence([sigma_index, lr_index, clip_index, seed]).generate_state(1)[0]),
            )
            scores: list[float] = []
            train(
                {"lr": float(LEARNING_RATES[lr_index]), "max_grad_norm": float(clip)},
                spec,
                lambda metrics, directory, scores=scores: scores.append(float(metrics["val_acc"])),
            )
            accuracies[clip_index, seed] = scores[-1]
    return sigma_index, lr_index, accuracies, time.perf_counter() - start


def train_landscapes(sigmas: list[float], seeds: int, batch_size: int, epochs: int, workers: int) -> np.ndarray:
    """Accuracies of shape (len(sigmas), 16, 20, seeds)."""
    tasks = [
        (s, i, sigma, seeds, batch_size, epochs) for s, sigma in enumerate(sigmas) for i in range(len(LEARNING_RATES))
    ]
    # Expensive rows first would not help much: every row has the same number of steps.
    out = np.full((len(sigmas), len(LEARNING_RATES), len(CLIPPING_NORMS), seeds), np.nan)
    start = time.perf_counter()
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers, initializer=_init_worker) as pool:
        for done, (s, i, acc, seconds) in enumerate(pool.imap_unordered(_train_row, tasks), start=1):
            out[s, i] = acc
            print(
                f"[{done:2d}/{len(tasks)}] σ={sigmas[s]:.4f} lr={LEARNING_RATES[i]:.3g}: "
                f"mean acc {acc.mean():.3f} (max {acc.mean(axis=1).max():.3f}), {seconds:.1f} s, "
                f"elapsed {time.perf_counter() - start:.0f} s",
                flush=True,
            )
    return out


# ----------------------------------------------------------------------------- synthetic


SYNTHETIC_BUMPS = (
    # (height, centre log10 lr, centre clip, sd in log10 lr, sd in clip)
    (0.80, -0.5, 1.2, 0.35, 0.6),  # narrow, high: the best region
    (0.65, -2.3, 4.2, 0.9, 1.8),  # broad, lower: most of the mass
    (0.45, 0.7, 5.1, 0.3, 0.5),  # small side bump
)
SYNTHETIC_FLOOR = 0.1  # chance accuracy on 10 classes


def synthetic_landscape() -> np.ndarray:
    """Accuracy-like landscape in [0.1, 0.9] of shape (16, 20): floor + max of three bumps."""
    log_lr = np.log10(LEARNING_RATES)[:, None]
    clip = CLIPPING_NORMS[None, :]
    bumps = [
        height * np.exp(-0.5 * (((log_lr - m_lr) / s_lr) ** 2 + ((clip - m_c) / s_c) ** 2))
        for height, m_lr, m_c, s_lr, s_c in SYNTHETIC_BUMPS
    ]
    return SYNTHETIC_FLOOR + np.max(bumps, axis=0)


# ----------------------------------------------------------------------------- main


def _summary(mean: np.ndarray) -> dict[str, Any]:
    best = np.unravel_index(int(np.argmax(mean)), mean.shape)
    return {
        "best_accuracy": float(mean[best]),
        "best_lr": float(LEARNING_RATES[best[0]]),
        "best_clip": float(CLIPPING_NORMS[best[1]]),
        "grid_mean_accuracy": float(mean.mean()),
        "share_within_0.02_of_best": float((mean >= mean[best] - 0.02).mean()),
        "share_within_0.05_of_best": float((mean >= mean[best] - 0.05).mean()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="trained models per grid point and σ (default 3)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--target-epsilon", type=float, default=8.0, help="total ε of both searches")
    parser.add_argument("--mean-trials", type=float, default=100.0, help="E[T] = 1/γ of the calibration law")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--synthetic-only", action="store_true", help="only rewrite the synthetic landscape")
    parser.add_argument("--output-dir", type=Path, default=DATA_DIR)
    args = parser.parse_args(argv)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    npz_path, json_path = args.output_dir / NPZ_NAME, args.output_dir / JSON_NAME

    synthetic = synthetic_landscape()
    if args.synthetic_only:
        if not npz_path.exists():
            parser.error(f"{npz_path} does not exist: run without --synthetic-only first.")
        arrays = dict(np.load(npz_path))
        arrays["synthetic_mean"] = synthetic
        np.savez_compressed(npz_path, **arrays)
        meta = json.loads(json_path.read_text())
        meta["synthetic"] = {"bumps": SYNTHETIC_BUMPS, "floor": SYNTHETIC_FLOOR, **_summary(synthetic)}
        json_path.write_text(json.dumps(meta, indent=2) + "\n")
        print(json.dumps(meta["synthetic"], indent=2))
        return 0

    calibration = noise_multipliers(args.target_epsilon, args.mean_trials, args.batch_size, args.epochs)
    print(json.dumps(calibration, indent=2), flush=True)
    sigmas = [calibration["sigma_hypo"], calibration["sigma_uniform"]]
    start = time.perf_counter()
    accuracies = train_landscapes(sigmas, args.seeds, args.batch_size, args.epochs, args.workers)
    runtime = time.perf_counter() - start
    if np.isnan(accuracies).any():
        raise RuntimeError("some trainings did not report")
    means = accuracies.mean(axis=-1)
    ses = accuracies.std(axis=-1, ddof=1) / np.sqrt(args.seeds) if args.seeds > 1 else np.zeros_like(means)
    np.savez_compressed(
        npz_path,
        learning_rates=LEARNING_RATES,
        clipping_norms=CLIPPING_NORMS,
        sigmas=np.array(sigmas),
        accuracies_hypo=accuracies[0],
        accuracies_uniform=accuracies[1],
        mean_hypo=means[0],
        se_hypo=ses[0],
        mean_uniform=means[1],
        se_uniform=ses[1],
        synthetic_mean=synthetic,
    )
    meta = {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}",
        "runtime_s": round(runtime, 1),
        "workers": args.workers,
        "training": {
            "model": "digits_cnn (8 714 parameters)",
            "data": "digits_data: 1 437 train / 360 validation",
            "optimizer": "sgd",
            "batch_size": args.batch_size,
            "epochs": args.epochs,
            "grad_sample_mode": "ew",
            "seeds_per_point": args.seeds,
            "score": "final validation accuracy (public validation data)",
        },
        "grid": {"learning_rates": LEARNING_RATES.tolist(), "clipping_norms": CLIPPING_NORMS.tolist()},
        "calibration": calibration,
        "hypo": _summary(means[0]),
        "uniform": _summary(means[1]),
        "synthetic": {"bumps": SYNTHETIC_BUMPS, "floor": SYNTHETIC_FLOOR, **_summary(synthetic)},
    }
    json_path.write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps({k: meta[k] for k in ("runtime_s", "hypo", "uniform", "synthetic")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
