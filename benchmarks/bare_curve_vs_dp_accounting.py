"""Repeat-and-select on a bare RDP curve: ray_dptune's default against dp_accounting, side by side.

A *bare* curve is an ``RDPCurve(orders, epsilons)`` with no known mechanism behind it (a
user's own curve, or one read back from a ledger): our default bound is then the minimum of
the closed forms and P&S Lemma 7 maximised, certified, over every two-point pair the curve
allows (:mod:`ray_dptune.accounting.bounds.lemma7.worst_pair`). dp_accounting's equivalent on a bare curve
is the function its ``RdpAccountant`` applies to a ``RepeatAndSelectDpEvent``:
``rdp_privacy_accountant._compute_rdp_repeat_and_select(orders, rdp, mean, shape)`` (the
accountant itself only takes events, whose curve it computes first).

For every (order grid, curve, law) this script, in one process:

* times ``repeat_and_select(RDPCurve(orders, eps), law)`` (ours) and dp_accounting's
  function on the same orders and ε, interleaved, ``--repeats`` times each, and reports the
  fastest of each and their ratio (ours / dp_accounting; as ``timeit`` does: the minimum is
  the least disturbed by other work on the machine), and the medians' ratio too. The law's grid of [0, 1] is cached
  by the law's description, so "ours" is the cost for a new curve under a known law; the
  first call under a law (grid built) is reported as ``ours_first_ms``;
* reports ε(δ) of both; ours must not exceed dp_accounting's (same curve, never looser), whose
  Poisson bound is compared with the mass P[K = 0] added back (P&S Theorem 6 as stated omits it).

Orders: dp_accounting's ``DEFAULT_RDP_ORDERS`` (156) and ours (``DEFAULT_ORDERS``, 321).
Curves: Gaussian σ ∈ {0.7, 2, 8}; DP-SGD (q = 0.01, σ = 1.1, T = 1000); ε-DP with ε = 1.
Laws (dp_accounting's ``shape`` η): Poisson (∞), geometric (1), logarithmic (0), TNB η = 0.5.

Usage::

    .venv/bin/python benchmarks/bare_curve_vs_dp_accounting.py             # ~1 minute
    .venv/bin/python benchmarks/bare_curve_vs_dp_accounting.py --repeats 5  # quicker

Writes ``benchmarks/results/bare_curve_vs_dp_accounting.{json,md}`` (``--output-dir``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS

from ray_dptune.accounting import DEFAULT_ORDERS, RDPCurve, repeat_and_select
from ray_dptune.accounting.bounds.distributions import (
    Geometric,
    Logarithmic,
    Poisson,
    RunCountDistribution,
    TruncatedNegativeBinomial,
)
from ray_dptune.accounting.bounds.lemma7 import worst_pair
from ray_dptune.accounting.bounds.lemma7.generic import add_no_run_atom

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DELTA = 1e-6
MEAN = 10.0
GRIDS = {"dp_accounting (156)": np.asarray(DEFAULT_RDP_ORDERS, dtype=float), "ray_dptune (321)": DEFAULT_ORDERS}


def curves(orders: np.ndarray) -> dict[str, np.ndarray]:
    """ε on ``orders`` of each base (only the numbers are kept: bare curves)."""
    out = {f"Gaussian σ={s}": RDPCurve.gaussian(noise_multiplier=s, orders=orders).epsilons for s in (0.7, 2.0, 8.0)}
    sgd = RDPCurve.subsampled_gaussian(sample_rate=0.01, noise_multiplier=1.1, steps=1000, orders=orders)
    out["DP-SGD q=0.01 σ=1.1 T=1000"] = sgd.epsilons
    out["1-DP"] = RDPCurve.pure(epsilon=1.0, orders=orders).epsilons
    return {name: np.array(eps) for name, eps in out.items()}


def laws() -> dict[str, tuple[RunCountDistribution, float]]:
    """Our law and dp_accounting's shape η, each of mean MEAN (a TNB: the largest mean not above it)."""
    tnb = TruncatedNegativeBinomial.from_mean(0.5, MEAN)
    return {
        "Poisson": (Poisson(MEAN), float("inf")),
        "Geometric (η=1)": (Geometric.from_mean(MEAN), 1.0),
        "Logarithmic (η=0)": (Logarithmic.from_mean(MEAN), 0.0),
        "TNB η=0.5": (tnb, 0.5),
    }


def measure(orders: np.ndarray, eps: np.ndarray, law: RunCountDistribution, shape: float, repeats: int) -> dict:
    """Interleaved timings (ms) and ε(δ) of ours and dp_accounting's on one bare curve."""
    worst_pair._GRID_CACHE.clear()  # the first call builds the law's grid
    start = time.perf_counter()
    ours = repeat_and_select(RDPCurve(orders, eps), law)
    first = time.perf_counter() - start
    theirs = np.asarray(rdp_privacy_accountant._compute_rdp_repeat_and_select(orders, eps, law.mean, shape))
    ours_t, theirs_t = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        repeat_and_select(RDPCurve(orders, eps), law)
        ours_t.append(time.perf_counter() - start)
        start = time.perf_counter()
        rdp_privacy_accountant._compute_rdp_repeat_and_select(orders, eps, law.mean, shape)
        theirs_t.append(time.perf_counter() - start)
    ours_ms, theirs_ms = 1e3 * min(ours_t), 1e3 * min(theirs_t)
    median_ratio = statistics.median(ours_t) / statistics.median(theirs_t)
    eps_ours = ours.epsilon(delta=DELTA)
    theirs = np.maximum(np.nan_to_num(theirs, nan=np.inf), 0.0)
    eps_theirs = RDPCurve(orders, theirs).epsilon(delta=DELTA)
    # dp_accounting's Poisson bound is P&S Theorem 6 as stated, whose proof leaves out the mass
    # P[K=0]; compare against it with that mass added back (add_no_run_atom), as benchmarks/accounting.py does
    with_atom = add_no_run_atom((orders - 1.0) * theirs, law.prob_zero, orders)
    eps_theirs_atom = RDPCurve(orders, with_atom).epsilon(delta=DELTA)
    return {
        "ours_ms": round(ours_ms, 3),
        "dp_accounting_ms": round(theirs_ms, 3),
        "ratio": round(ours_ms / theirs_ms, 3),
        "median_ratio": round(median_ratio, 3),
        "ours_first_ms": round(1e3 * first, 3),
        "eps_ours": eps_ours,
        "eps_dp_accounting": eps_theirs,
        "eps_dp_accounting_with_k0": eps_theirs_atom,
        "never_looser": bool(eps_ours <= eps_theirs_atom * (1 + 1e-9)),
    }


def environment(argv: list[str]) -> dict:
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "command": shlex.join([".venv/bin/python", "benchmarks/bare_curve_vs_dp_accounting.py", *argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit_before_run": commit,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "dp_accounting": metadata.version("dp-accounting"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start",
    }


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        "# Repeat-and-select on a bare RDP curve: ray_dptune vs dp_accounting",
        "",
        (
            f"`{env['command']}` — {env['date']}, commit {env['git_commit_before_run']}, "
            f"Python {env['python']}, numpy {env['numpy']}, dp-accounting {env['dp_accounting']}, {env['machine']}."
        ),
        "",
        (
            "Ours: `repeat_and_select(RDPCurve(orders, eps), law)` (closed forms ∧ certified P&S Lemma 7); "
            "dp_accounting: `_compute_rdp_repeat_and_select(orders, eps, mean, shape)`. Fastest of "
            f"{report['repeats']} interleaved calls each, in one process (and the ratio of the medians); "
            f"E[K] = {MEAN}, ε at δ = {DELTA}."
        ),
        "",
        (
            f"**Largest ratio: {report['max_ratio']:.2f}× (of medians: {report['max_median_ratio']:.2f}×); "
            f"ours never looser: {report['all_never_looser']}.**"
        ),
        "",
        (
            "| orders | curve | law | ours ms | dp_accounting ms | ratio | ratio of medians | ours 1st call ms "
            "| ε ours | ε dp_accounting |"
        ),
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['orders']} | {row['curve']} | {row['law']} | {row['ours_ms']:.2f} | "
            f"{row['dp_accounting_ms']:.2f} | {row['ratio']:.2f} | {row['median_ratio']:.2f} | {row['ours_first_ms']:.1f} | "
            f"{row['eps_ours']:.4f} | {row['eps_dp_accounting']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    report: dict = {"environment": environment(argv), "repeats": args.repeats, "rows": []}
    for grid_name, orders in GRIDS.items():
        for curve_name, eps in curves(orders).items():
            for law_name, (law, shape) in laws().items():
                row = {"orders": grid_name, "curve": curve_name, "law": law_name}
                row.update(measure(orders, eps, law, shape, args.repeats))
                report["rows"].append(row)
                print(
                    f"{grid_name:>20} | {curve_name:>26} | {law_name:>18} | ours {row['ours_ms']:7.2f} ms | "
                    f"dp {row['dp_accounting_ms']:7.2f} ms | ratio {row['ratio']:.2f} (medians {row['median_ratio']:.2f})",
                    flush=True,
                )
    report["max_ratio"] = max(row["ratio"] for row in report["rows"])
    report["max_median_ratio"] = max(row["median_ratio"] for row in report["rows"])
    report["all_never_looser"] = all(row["never_looser"] for row in report["rows"])
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "bare_curve_vs_dp_accounting.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.output_dir / "bare_curve_vs_dp_accounting.md").write_text(markdown(report))
    print(f"largest ratio {report['max_ratio']:.2f}; never looser: {report['all_never_looser']}")
    return 0 if report["all_never_looser"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
