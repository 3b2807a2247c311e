"""DP-HyPO − uniform at equal total ε over (C, c, β, τ): where adaptivity pays, with the Lemma A.5 bound.

For each (C, c), both searches are calibrated to the same total ε (default 8, δ =
1e-5, T ~ Geometric(γ)) on digits' DP-SGD trial (q = 64/1437, 110 steps):

* uniform: min(P&S Theorem 2, P&S Lemma 7 numerically (``generic_repeat_and_select``)) → σ_u;
* DP-HyPO: min(closed form of Theorem 1, Lemma A.5 numerically
  (:func:`ray_dptune.accounting.bounds.dphypo_bound.dphypo_lemma_bound`)) at C/c → σ_h.

Landscapes are the cached ones of ``benchmarks/dphypo_landscapes.py`` (no training
here): digits at σ = 1.0428 and σ = 1.3894; a cell's accuracy at another σ is
interpolated linearly in σ, and extrapolated down to σ = 0.89 (an approximation,
stated in the results); further out is refused. Both bounds use the RDP curve
only (DP-HyPO's proof has no PLD form), so the comparison is like for like. The synthetic landscape (three bumps, narrow
optimum) is the same for both methods: it measures adaptivity alone. Searches are
those of ``benchmarks/dphypo.py`` (GP UCB → softmax(β) → projection onto S_{C,c},
law refreshed after trials 1…8 then every ×1.5, visit noise sd 0.1).

Usage::

    .venv/bin/python benchmarks/dphypo_frontier.py            # ~5 min on 2 cores
    .venv/bin/python benchmarks/dphypo_frontier.py --reps 8   # smoke run
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("dphypo_bench", ROOT / "dphypo.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["dphypo_bench"] = bench
_spec.loader.exec_module(bench)

DELTA = 1e-5
SIGMA_LOW, SIGMA_HIGH = 1.0428, 1.3894  # the cached digits landscapes


def search_epsilon(sigma: float, gamma: float, ratio: float, upper: float) -> float:
    from ray_dptune.accounting import RDPCurve, generic_repeat_and_select
    from ray_dptune.accounting.bookkeeping.spend import TrialSpend
    from ray_dptune.accounting.bounds.distributions import Geometric
    from ray_dptune.accounting.bounds.dphypo_bound import dphypo_lemma_bound
    from ray_dptune.accounting.bounds.selection import truncated_negative_binomial_bound

    base = TrialSpend(sample_rate=64 / 1437, noise_multiplier=sigma, steps=110).curve()
    base = RDPCurve(base.orders, base.epsilons)  # RDP only for both: DP-HyPO's proof has no PLD version
    law = Geometric(gamma)
    bound = truncated_negative_binomial_bound(base, law, density_ratio=ratio)
    if ratio > 1.0:
        bound = bound.minimum(dphypo_lemma_bound(base, law, density_ratio=ratio, upper=upper))
    else:  # uniform gets its tightest bound too: P&S Lemma 7, certified numeric maximum
        bound = bound.minimum(generic_repeat_and_select(base, law))
    return bound.smoothed().epsilon(delta=DELTA)


def calibrate(target: float, gamma: float, ratio: float, upper: float) -> float:
    """Smallest σ (to 1e-4, rounded up) with total ε <= target."""
    lo, hi = 0.5, 3.0
    while hi - lo > 1e-4:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if search_epsilon(mid, gamma, ratio, upper) <= target else (mid, hi)
    return hi


def hypo_search(task: tuple) -> tuple:
    key, mean, features, trials, seed, upper, lower, beta, tau = task
    from ray_dptune.search.density import BoundedDensitySampler

    n = mean.size
    sampler = BoundedDensitySampler(np.full(n, 1.0 / n), upper=upper, lower=lower, beta=beta, tau=tau, rng=seed)
    noise = np.random.default_rng([seed, 1])
    sums, counts = np.zeros(n), np.zeros(n)
    q = sampler.prior.copy()
    best_score, best_cell = -math.inf, -1
    schedule = bench.refit_points(1.5)
    next_refit = next(schedule)
    for done in range(trials):
        if done == next_refit:
            visited = counts > 0
            q = sampler.probabilities(features, features[visited], sums[visited] / counts[visited])
            next_refit = next(schedule)
        cell = sampler.draw(q)
        score = mean[cell] + 0.1 * noise.standard_normal()
        sums[cell] += score
        counts[cell] += 1
        if score > best_score:
            best_score, best_cell = score, cell
    return key, float(mean[best_cell])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gamma", type=float, default=0.01)
    parser.add_argument("--target-epsilon", type=float, default=8.0)
    parser.add_argument("--bounds", default="1.25:0.8,1.5:0.75,2:0.75,2:0.5,3:0.75", help="C:c pairs")
    parser.add_argument("--betas", type=float, nargs="+", default=[1.0, 3.0])
    parser.add_argument("--taus", type=float, nargs="+", default=[0.1])
    parser.add_argument("--reps", type=int, default=24)
    parser.add_argument("--uniform-reps", type=int, default=20000)
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--output", type=Path, default=ROOT / "results" / "dphypo_frontier.json")
    args = parser.parse_args(argv)
    bench._init_worker()
    arrays = dict(np.load(bench.DATA))
    features = bench.grid_features(arrays["learning_rates"], arrays["clipping_norms"])
    low, high = arrays["mean_uniform"].reshape(-1), arrays["mean_hypo"].reshape(-1)
    synthetic = arrays["synthetic_mean"].reshape(-1)
    pairs = [tuple(float(v) for v in pair.split(":")) for pair in args.bounds.split(",")]

    start = time.perf_counter()
    sigma_u = calibrate(args.target_epsilon, args.gamma, 1.0, 1.0)
    sigmas = {pair: calibrate(args.target_epsilon, args.gamma, pair[0] / pair[1], pair[0]) for pair in pairs}
    print(f"σ_uniform {sigma_u:.4f}; σ_HyPO {sigmas} ({time.perf_counter() - start:.0f} s)", flush=True)

    def digits_at(sigma: float) -> np.ndarray:
        if not SIGMA_LOW - 0.15 <= sigma <= SIGMA_HIGH + 1e-9:  # below SIGMA_LOW: linear extrapolation, flagged
            raise SystemExit(f"σ = {sigma:.4f} is too far outside the cached landscapes [{SIGMA_LOW}, {SIGMA_HIGH}].")
        w = (sigma - SIGMA_LOW) / (SIGMA_HIGH - SIGMA_LOW)
        return (1 - w) * low + w * high

    rng = np.random.default_rng(args.seed)
    law_trials = lambda n: rng.geometric(args.gamma, size=n)
    uniform = {}
    for name, mean in (("digits", digits_at(sigma_u)), ("synthetic", synthetic)):
        values = bench.uniform_searches(
            mean, np.full(320, 0.1), law_trials(args.uniform_reps), int(rng.integers(2**63))
        )
        uniform[name] = bench.mean_ci(values)
    tasks = []
    t = law_trials(args.reps)  # common random numbers: the same T draws and seeds for every configuration
    seeds = rng.integers(2**63, size=args.reps)
    for (upper, lower), beta, tau in [(p, b, s) for p in pairs for b in args.betas for s in args.taus]:
        for name, mean in (("digits", digits_at(sigmas[upper, lower])), ("synthetic", synthetic)):
            for rep in range(args.reps):
                key = (name, upper, lower, beta, tau)
                tasks.append((key, mean, features, int(t[rep]), int(seeds[rep]), upper, lower, beta, tau))
    tasks.sort(key=lambda task: -task[3])
    results: dict[tuple, list[float]] = {}
    with mp.get_context("spawn").Pool(args.workers, initializer=bench._init_worker) as pool:
        for i, (key, acc) in enumerate(pool.imap_unordered(hypo_search, tasks), 1):
            results.setdefault(key, []).append(acc)
            if i % max(1, len(tasks) // 10) == 0:
                print(f"[{i}/{len(tasks)}] {time.perf_counter() - start:.0f} s", flush=True)
    rows = []
    for key, values in sorted(results.items()):
        name, upper, lower, beta, tau = key
        h_mean, h_ci = bench.mean_ci(values)
        u_mean, u_ci = uniform[name]
        rows.append(
            {
                "landscape": name, "C": upper, "c": lower, "beta": beta, "tau": tau,
                "sigma_hypo": sigmas[upper, lower], "sigma_uniform": sigma_u,
                "hypo": h_mean, "hypo_ci": h_ci, "uniform": u_mean, "uniform_ci": u_ci,
                "gap": h_mean - u_mean, "gap_ci": math.hypot(h_ci, u_ci), "reps": len(values),
            }
        )  # fmt: skip
    record = {
        "command": " ".join([".venv/bin/python", "benchmarks/dphypo_frontier.py", *(sys.argv[1:] if argv is None else argv)]),
        "gamma": args.gamma, "target_epsilon": args.target_epsilon, "delta": DELTA, "reps": args.reps,
        "uniform_reps": args.uniform_reps, "runtime_s": round(time.perf_counter() - start, 1), "rows": rows,
    }  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1))
    print(f"| landscape | C | c | β | τ | σ_HyPO | DP-HyPO | uniform (σ_u = {sigma_u:.4f}) | gap ± 95% CI |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['landscape']} | {r['C']:g} | {r['c']:g} | {r['beta']:g} | {r['tau']:g} | {r['sigma_hypo']:.4f} | "
            f"{r['hypo']:.4f} ± {r['hypo_ci']:.4f} | {r['uniform']:.4f} ± {r['uniform_ci']:.4f} | "
            f"{r['gap']:+.4f} ± {r['gap_ci']:.4f} |"
        )
    print(f"wrote {args.output} in {record['runtime_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
