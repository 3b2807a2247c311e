"""Repeat-and-select accounting: ray_dptune against dp_accounting, side by side.

dp_accounting (0.6) is the only other library with a repeat-and-select accountant
(``RepeatAndSelectDpEvent`` in its ``RdpAccountant``). For every setting, law of K
and mean E[K], this script computes in one process:

* ``eps_dp``        dp_accounting on its default orders (``DEFAULT_RDP_ORDERS``);
* ``eps_dp_atom``   the same, with the mass P[K=0] = e^{-μ} added back for Poisson
                    (dp_accounting applies P&S Theorem 6 as stated, whose proof leaves
                    it out; see ``ray_dptune.accounting.bounds.lemma7.generic.add_no_run_atom``);
* ``eps_same``      ours, base curve on THE SAME orders as dp_accounting;
* ``eps_ours``      ours, our default orders, closed forms only (``generic=False``, the cross-check);
* ``eps_exact``     ours, Poisson on a Gaussian base, with the exact Gaussian profile;
* ``eps_generic``   ours, the library default (closed forms ∧ certified P&S Lemma 7; adaptive
                    DP-SGD orders; on DP-SGD, the exact PLD profile: δ̂ for Poisson, the
                    trade-off constraints of Lemma 7 for a truncated negative binomial);

and times "build the base curve, build the law, repeat-and-select, ε(δ)" for
dp_accounting, ours (same orders), ours (closed forms) and ours (default), interleaved.

Acceptance criteria (checked; a failure of 1 or 2 makes the exit status 1):

1. eps_same <= eps_dp_atom * (1 + 1e-9) at every row (same base curve, never looser
   than dp_accounting's method once its Poisson bound is made valid);
2. Poisson, E[K] = 10, 0.1-zCDP base, δ = 1e-6: eps_exact <= 3.80;
3. time(ours default) / time(dp_accounting), per row: <= 1 on 0.1-zCDP (Gaussian)
   rows; <= 3 on DP-SGD rows, whose default builds the base's PLD profile (Poisson:
   δ̂ of Theorem 6; truncated negative binomial: the trade-off constraints of Lemma 7)
   (reported only: timings depend on the machine).

Usage::

    .venv/bin/python benchmarks/accounting.py           # full run, a few minutes
    .venv/bin/python benchmarks/accounting.py --quick   # CI smoke run, < 1 minute
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np
import scipy
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS

from ray_dptune.accounting import DEFAULT_ORDERS, RDPCurve, gaussian_profile, repeat_and_select
from ray_dptune.accounting.bounds.distributions import Poisson, RunCountDistribution, TruncatedNegativeBinomial
from ray_dptune.accounting.bounds.lemma7.generic import add_no_run_atom
from ray_dptune.accounting.curves import profiles

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SAME_BASE_RTOL = 1e-9
EXACT_PROFILE_LIMIT = 3.80  # Poisson, E[K] = 10, 0.1-zCDP, δ = 1e-6 (dp_accounting: ~4.607)
DP_ORDERS = np.asarray(DEFAULT_RDP_ORDERS, dtype=float)
BENCHMARKED_PATHS = ("ray_dptune/accounting", "ray_dptune/accounting/bounds/distributions.py", "ray_dptune/errors.py")

# (name, η): dp_accounting's ``shape``; η = inf is Poisson.
LAWS: tuple[tuple[str, float], ...] = (
    ("Poisson", math.inf),
    ("TNB η=0 (log.)", 0.0),
    ("TNB η=0.5", 0.5),
    ("TNB η=1 (geom.)", 1.0),
)


# ---------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Setting:
    """A base mechanism and a target δ.

    ``sample_rate is None``: the Gaussian mechanism with noise ``sigma``; otherwise
    DP-SGD: ``steps`` Poisson-subsampled Gaussian steps.
    """

    family: str  # "zcdp" (P&S Figure 4) or "dpsgd"
    label: str
    sigma: float
    delta: float
    sample_rate: float | None = None
    steps: int | None = None

    @property
    def is_gaussian(self) -> bool:
        return self.sample_rate is None

    def ours_base(self, orders: np.ndarray | None = None) -> RDPCurve:
        """Our RDP curve of one run (``orders=None``: our default grid)."""
        if self.is_gaussian:
            return RDPCurve.gaussian(noise_multiplier=self.sigma, orders=orders)
        return RDPCurve.subsampled_gaussian(
            sample_rate=self.sample_rate, noise_multiplier=self.sigma, steps=self.steps, orders=orders
        )

    def dp_event(self) -> dp_event.DpEvent:
        """dp_accounting's event for one run."""
        gaussian = dp_event.GaussianDpEvent(self.sigma)
        if self.is_gaussian:
            return gaussian
        return dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(self.sample_rate, gaussian), self.steps)


@dataclass(frozen=True)
class Case:
    """One row: a setting, a law of K (by η) and a requested E[K]."""

    setting: Setting
    law_name: str
    eta: float
    mean: float

    @property
    def is_poisson(self) -> bool:
        return math.isinf(self.eta)

    def ours_law(self) -> RunCountDistribution:
        """Our law; a TNB gets the largest mean not above the request."""
        if self.is_poisson:
            return Poisson(self.mean)
        return TruncatedNegativeBinomial.from_mean(self.eta, self.mean)


def build_cases(quick: bool) -> list[Case]:
    """The grid of the issue: P&S Figure 4 (0.1-zCDP) and three DP-SGD bases."""
    zcdp = Setting("zcdp", "0.1-zCDP (σ=√5)", sigma=5**0.5, delta=1e-6)
    zcdp_means = [1.0, 1.5, 10.0, 100.0] if quick else [1.0, 1.5, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000]
    sigmas = [1.1] if quick else [0.8, 1.1, 2.0]
    dpsgd = [Setting("dpsgd", f"DP-SGD q=0.01 σ={s:g} T=1000", s, 1e-5, 0.01, 1000) for s in sigmas]
    dpsgd_means = [10.0] if quick else [2.0, 10.0, 100.0]

    cases = []
    for setting, means in [(zcdp, zcdp_means)] + [(s, dpsgd_means) for s in dpsgd]:
        for law_name, eta in LAWS:
            for mean in means:
                if mean > 1.0 or math.isinf(eta):  # a TNB has E[K] > 1
                    cases.append(Case(setting, law_name, eta, float(mean)))
    return cases


# ---------------------------------------------------------------------------- the computations
def epsilon_dp_accounting(case: Case) -> float:
    """dp_accounting: build the accountant, compose the event, get ε."""
    accountant = rdp_privacy_accountant.RdpAccountant(orders=DEFAULT_RDP_ORDERS)
    accountant.compose(dp_event.RepeatAndSelectDpEvent(case.setting.dp_event(), case.mean, case.eta))
    return float(accountant.get_epsilon(case.setting.delta))


def epsilon_dp_accounting_with_atom(case: Case) -> float:
    """dp_accounting's curve with the K = 0 atom added back for Poisson (not timed)."""
    accountant = rdp_privacy_accountant.RdpAccountant(orders=DEFAULT_RDP_ORDERS)
    accountant.compose(dp_event.RepeatAndSelectDpEvent(case.setting.dp_event(), case.mean, case.eta))
    rdp = accountant.rdp
    if case.is_poisson:
        rdp = add_no_run_atom((DP_ORDERS - 1.0) * rdp, math.exp(-case.mean), DP_ORDERS)
    return float(rdp_privacy_accountant.compute_epsilon(DP_ORDERS, rdp, case.setting.delta)[0])


def epsilon_ours(case: Case, orders: np.ndarray | None = None, generic: bool = False) -> float:
    """Ours: build the base curve and the law, repeat-and-select, ε."""
    curve = repeat_and_select(case.setting.ours_base(orders), case.ours_law(), generic=generic)
    return curve.epsilon(delta=case.setting.delta)


def epsilon_ours_cold(case: Case) -> float:
    """The library default, every cache (PLDs, profiles) emptied first: the cost of a first accounting."""
    profiles.clear_profile_caches()
    return epsilon_ours(case, generic=True)


def epsilon_exact_profile(case: Case) -> float | None:
    """Ours, Poisson on a Gaussian base, with the exact Gaussian (ε, δ) profile."""
    if not (case.is_poisson and case.setting.is_gaussian):
        return None
    base = case.setting.ours_base()
    curve = repeat_and_select(base, case.ours_law(), base_delta=gaussian_profile(noise_multiplier=case.setting.sigma))
    return curve.epsilon(delta=case.setting.delta)


# ---------------------------------------------------------------------------- timing
@dataclass(frozen=True)
class RepeatPolicy:
    """How often to call a method: ``most`` times, fewer if one call is slow.

    After the first (timed) call, the count is ``budget_s / first_call``, clipped to
    [``least``, ``most``]; this keeps the full run within a few minutes.
    """

    most: int
    least: int
    budget_s: float

    def count(self, first_call_s: float) -> int:
        return max(self.least, min(self.most, int(self.budget_s / max(first_call_s, 1e-9))))


@dataclass
class Timed:
    """The value and the wall times (seconds) of the calls of one method."""

    value: float
    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def _call(method: Callable[[], float]) -> tuple[float, float]:
    start = time.perf_counter()
    value = method()
    return value, time.perf_counter() - start


def time_interleaved(methods: dict[str, Callable[[], float]], policies: dict[str, RepeatPolicy]) -> dict[str, Timed]:
    """Calls the methods round-robin (the order rotating each round) and records times.

    Every method is deterministic: a call that returns another value than the
    first raises, since the timings would then not be of one computation.
    """
    names = list(methods)
    results: dict[str, Timed] = {}
    wanted: dict[str, int] = {}
    for round_index in range(max(p.most for p in policies.values())):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            if name in wanted and len(results[name].seconds) >= wanted[name]:
                continue
            value, seconds = _call(methods[name])
            if name not in results:
                results[name] = Timed(value, [seconds])
                wanted[name] = policies[name].count(seconds)
            else:
                if value != results[name].value:
                    raise RuntimeError(f"{name} is not deterministic: {value} != {results[name].value}")
                results[name].seconds.append(seconds)
    return results


# ---------------------------------------------------------------------------- rows
@dataclass
class Row:
    """Every number of one (setting, law, E[K]); times in seconds (medians)."""

    family: str
    setting: str
    law: str
    eta: float | None  # None for Poisson (dp_accounting's shape = inf)
    mean_requested: float
    mean_ours: float  # exact E[K] of our law (a TNB's is the largest not above the request)
    delta: float
    eps_dp: float
    eps_dp_atom: float
    eps_same: float
    eps_ours: float
    eps_exact: float | None
    eps_generic: float
    time_dp: float
    time_same: float
    time_ours: float
    time_generic: float
    repeats: dict[str, int]

    @property
    def same_ok(self) -> bool:
        return self.eps_same <= self.eps_dp_atom * (1.0 + SAME_BASE_RTOL)

    @property
    def ratio_ours(self) -> float:
        return self.time_ours / self.time_dp

    @property
    def ratio_generic(self) -> float:
        return self.time_generic / self.time_dp

    @property
    def generic_gain(self) -> float:
        """Relative ε saved by generic=True over the default method."""
        return 1.0 - self.eps_generic / self.eps_ours

    def to_dict(self) -> dict:
        record = dataclasses.asdict(self)
        record.update(
            same_ok=self.same_ok,
            ratio_ours=self.ratio_ours,
            ratio_generic=self.ratio_generic,
            generic_gain=self.generic_gain,
            same_vs_dp=self.eps_same / self.eps_dp - 1.0,
        )
        return record


def measure(case: Case, policies: dict[str, RepeatPolicy]) -> Row:
    """Computes and times every method on one case."""
    methods = {
        "dp": lambda: epsilon_dp_accounting(case),
        "same": lambda: epsilon_ours(case, orders=DP_ORDERS),
        "ours": lambda: epsilon_ours(case),
        "generic": lambda: epsilon_ours_cold(case),
    }
    timed = time_interleaved(methods, policies)
    return Row(
        family=case.setting.family,
        setting=case.setting.label,
        law=case.law_name,
        eta=None if case.is_poisson else case.eta,
        mean_requested=case.mean,
        mean_ours=case.ours_law().mean,
        delta=case.setting.delta,
        eps_dp=timed["dp"].value,
        eps_dp_atom=epsilon_dp_accounting_with_atom(case),
        eps_same=timed["same"].value,
        eps_ours=timed["ours"].value,
        eps_exact=epsilon_exact_profile(case),
        eps_generic=timed["generic"].value,
        time_dp=timed["dp"].median,
        time_same=timed["same"].median,
        time_ours=timed["ours"].median,
        time_generic=timed["generic"].median,
        repeats={name: len(t.seconds) for name, t in timed.items()},
    )


# ---------------------------------------------------------------------------- summary
class CountingFilter(logging.Filter):
    """Silences and counts dp_accounting's 'failed to converge' warnings."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if "failed to converge" in record.getMessage():
            self.count += 1
            return False
        return True


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(rows: list[Row]) -> dict:
    """Criteria, ratios and gains, overall and per family."""
    violations = [r for r in rows if not r.same_ok]
    exact_rows = [r for r in rows if r.family == "zcdp" and r.eta is None and r.mean_requested == 10.0]
    exact = exact_rows[0] if exact_rows else None
    summary = {
        "rows": len(rows),
        "same_base_violations": [
            {
                "setting": r.setting,
                "law": r.law,
                "mean": r.mean_requested,
                "eps_same": r.eps_same,
                "eps_dp": r.eps_dp,
                "eps_dp_atom": r.eps_dp_atom,
                "excess": r.eps_same / r.eps_dp_atom - 1.0,
            }
            for r in violations
        ],
        "max_same_vs_dp": max(r.eps_same / r.eps_dp - 1.0 for r in rows),
        "max_same_vs_dp_atom": max(r.eps_same / r.eps_dp_atom - 1.0 for r in rows),
        "max_atom_correction": max(r.eps_dp_atom / r.eps_dp - 1.0 for r in rows),
        "exact_poisson_mu10": None if exact is None else exact.eps_exact,
        "exact_poisson_mu10_dp": None if exact is None else exact.eps_dp,
        "exact_ok": None if exact is None else exact.eps_exact <= EXACT_PROFILE_LIMIT,
    }
    for scope, subset in [
        ("all", rows),
        ("zcdp", [r for r in rows if r.family == "zcdp"]),
        ("dpsgd", [r for r in rows if r.family == "dpsgd"]),
    ]:
        summary[scope] = {
            "median_ratio_ours": _median([r.ratio_ours for r in subset]),
            "median_ratio_same": _median([r.time_same / r.time_dp for r in subset]),
            "median_ratio_generic": _median([r.ratio_generic for r in subset]),
            "median_generic_gain": _median([r.generic_gain for r in subset]),
            "max_generic_gain": max((r.generic_gain for r in subset), default=None),
            "median_ours_vs_dp": _median([r.eps_ours / r.eps_dp - 1.0 for r in subset]),
            "median_same_vs_dp": _median([r.eps_same / r.eps_dp - 1.0 for r in subset]),
        }
    summary["timing_ok"] = summary["all"]["median_ratio_ours"] <= 1.0
    summary["default_timing"] = default_timing(rows)
    return summary


def default_timing(rows: list[Row]) -> dict:
    """Criterion 3: the default method's time / dp_accounting's, worst row per group, against its limit."""
    groups = {
        "Gaussian-base (0.1-zCDP) rows": ([r for r in rows if r.family == "zcdp"], 1.0),
        "DP-SGD rows, truncated negative binomial (PLD trade-off in Lemma 7)": (
            [r for r in rows if r.family == "dpsgd" and r.eta is not None],
            3.0,
        ),
        "DP-SGD rows, Poisson (PLD profile in Theorem 6)": (
            [r for r in rows if r.family == "dpsgd" and r.eta is None],
            3.0,
        ),
    }
    verdicts = {}
    for name, (subset, limit) in groups.items():
        if subset:
            worst = max(subset, key=lambda r: r.ratio_generic)
            verdicts[name] = {
                "limit": limit,
                "max_ratio": worst.ratio_generic,
                "worst_row": f"{worst.law}, E[K]={worst.mean_requested:g}",
                "median_ratio": _median([r.ratio_generic for r in subset]),
                "rows_over": sum(r.ratio_generic > limit for r in subset),
                "rows": len(subset),
            }
    return verdicts


def default_timing_lines(verdicts: dict) -> list[str]:
    """One bullet per group of criterion 3."""
    return [
        f"- Criterion 3, default time / dp_accounting's on {name} ≤ {v['limit']:g}: worst {v['max_ratio']:.3g} "
        f"({v['worst_row']}), median {v['median_ratio']:.3g}, {v['rows_over']} of {v['rows']} rows over "
        f"**{'PASS' if v['rows_over'] == 0 else 'FAIL'}**."
        for name, v in verdicts.items()
    ]


# ---------------------------------------------------------------------------- report
def git_commit() -> str:
    """HEAD of the repository, with "+ local changes" when the benchmarked modules differ from it."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *BENCHMARKED_PATHS],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head} + local changes" if dirty else head


def environment(quick: bool, warnings: int) -> dict:
    """Command, date, versions and machine."""
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
        "quick": quick,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "dp_accounting": metadata.version("dp_accounting"),
        "machine": f"{os.cpu_count()}-core CPU ({cpu}), {platform.system()} {platform.machine()}",
        "dp_orders": f"{DP_ORDERS.size} orders in [{DP_ORDERS[0]:g}, {DP_ORDERS[-1]:g}]",
        "our_orders": f"{DEFAULT_ORDERS.size} orders in [{DEFAULT_ORDERS[0]:g}, {DEFAULT_ORDERS[-1]:g}]",
        "dp_accounting_convergence_warnings": warnings,
    }


def _f(value: float | None, digits: int = 4) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _rel(value: float) -> str:
    return "0" if value == 0 else f"{value:+.1e}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.3g}"


def epsilon_table(rows: list[Row]) -> list[str]:
    """Markdown table of the ε columns of one family."""
    lines = [
        (
            "| setting | law | E[K] | E[K] ours | ε_dp | ε_dp + K=0 atom | ε_ours_same | same/(dp+atom) − 1 "
            "| ε_closed | ε_ours_exact | ε_default | default gain |"
        ),
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        flag = "" if r.same_ok else " **VIOLATION**"
        lines.append(
            f"| {r.setting} | {r.law} | {r.mean_requested:g} | {r.mean_ours:.6g} | {_f(r.eps_dp)} | "
            f"{_f(r.eps_dp_atom)} | {_f(r.eps_same)} | {_rel(r.eps_same / r.eps_dp_atom - 1.0)}{flag} | {_f(r.eps_ours)} | "
            f"{_f(r.eps_exact)} | {_f(r.eps_generic)} | {_pct(r.generic_gain)} |"
        )
    return lines


def timing_table(rows: list[Row]) -> list[str]:
    """Markdown table of median times (ms) and ratios."""
    lines = [
        (
            "| setting | law | E[K] | dp (ms) | ours same orders (ms) | ours closed forms (ms) | ours default (ms) "
            "| closed/dp | default/dp | repeats dp/same/closed/default |"
        ),
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        reps = "/".join(str(r.repeats[k]) for k in ("dp", "same", "ours", "generic"))
        lines.append(
            f"| {r.setting} | {r.law} | {r.mean_requested:g} | {_ms(r.time_dp)} | {_ms(r.time_same)} | "
            f"{_ms(r.time_ours)} | {_ms(r.time_generic)} | {r.ratio_ours:.3g} | {r.ratio_generic:.3g} | {reps} |"
        )
    return lines


def summary_lines(summary: dict) -> list[str]:
    """Criteria and headline numbers, as markdown bullets (also printed)."""
    violations = summary["same_base_violations"]
    lines = [
        f"- Criterion 1, same base curve, ε_ours_same ≤ ε_dp·(1 + {SAME_BASE_RTOL:g}) at every row, "
        "where for Poisson ε_dp includes the K = 0 atom that P&S Theorem 6 as stated leaves out: "
        + ("**PASS**" if not violations else f"**FAIL** ({len(violations)} of {summary['rows']} rows)")
        + f"; largest ε_ours_same/(ε_dp + atom) − 1 = {_rel(summary['max_same_vs_dp_atom'])}. "
        f"Against dp_accounting as published: largest ε_ours_same/ε_dp − 1 = {_rel(summary['max_same_vs_dp'])} "
        f"(the atom, at most {_rel(summary['max_atom_correction'])}), median {_rel(summary['all']['median_same_vs_dp'])}.",
    ]
    for v in violations:
        lines.append(
            f"  - VIOLATION {v['setting']}, {v['law']}, E[K]={v['mean']:g}: "
            f"ε_ours_same = {v['eps_same']:.10g} > ε_dp + atom = {v['eps_dp_atom']:.10g} ({_rel(v['excess'])})"
        )
    if summary["exact_poisson_mu10"] is not None:
        lines.append(
            f"- Criterion 2, Poisson E[K]=10 on 0.1-zCDP with the exact Gaussian profile, ε(1e-6) ≤ "
            f"{EXACT_PROFILE_LIMIT}: {summary['exact_poisson_mu10']:.4f} (dp_accounting "
            f"{summary['exact_poisson_mu10_dp']:.4f}) **{'PASS' if summary['exact_ok'] else 'FAIL'}**."
        )
    overall = summary["all"]
    lines.append(
        f"- Median time ratio ours closed forms / dp_accounting: {overall['median_ratio_ours']:.3g} "
        f"(0.1-zCDP rows {summary['zcdp']['median_ratio_ours']:.3g}"
        + (
            f", DP-SGD rows {summary['dpsgd']['median_ratio_ours']:.3g}"
            if summary["dpsgd"]["median_ratio_ours"]
            else ""
        )
        + f"; ours on dp_accounting's orders {overall['median_ratio_same']:.3g})."
    )
    lines += default_timing_lines(summary["default_timing"])
    lines.append(f"- Median time ratio ours default / dp_accounting: {overall['median_ratio_generic']:.3g}.")
    lines.append(
        f"- ε gain of the default over the closed forms (1 − ε_default/ε_closed): median "
        f"{_pct(overall['median_generic_gain'])}, "
        f"max {_pct(overall['max_generic_gain'])} (0.1-zCDP median {_pct(summary['zcdp']['median_generic_gain'])}"
        + (
            f", DP-SGD median {_pct(summary['dpsgd']['median_generic_gain'])}"
            if summary["dpsgd"]["median_generic_gain"] is not None
            else ""
        )
        + ")."
    )
    lines.append(f"- Median ε_closed/ε_dp − 1 (our default orders vs theirs): {_rel(overall['median_ours_vs_dp'])}.")
    return lines


def markdown(rows: list[Row], summary: dict, env: dict) -> str:
    """The whole results file."""
    out = [
        "# Repeat-and-select accounting: ray_dptune vs dp_accounting",
        "",
        f"- Command: `{env['command']}`",
        f"- Date (UTC): {env['date']}",
        f"- ray_dptune: commit {env['git_commit']}",
        (
            f"- Versions: Python {env['python']}, numpy {env['numpy']}, scipy {env['scipy']}, "
            f"dp_accounting {env['dp_accounting']}"
        ),
        f"- Machine: {env['machine']}",
        f"- Orders: dp_accounting default {env['dp_orders']}; ours default {env['our_orders']}.",
        "",
        "## Summary",
        "",
        *summary_lines(summary),
        "",
        "## Columns",
        "",
        "- ε_dp: dp_accounting `RdpAccountant` on its default orders, `RepeatAndSelectDpEvent(event, E[K], η)`.",
        "- ε_ours_same: ours with the base curve on dp_accounting's orders (same base curve).",
        "- ε_closed: ours on our default orders, closed forms only (P&S Thm 2 / Thm 6; `generic=False`).",
        "- ε_ours_exact: Poisson on a Gaussian base only, `base_delta=gaussian_profile(σ)`.",
        (
            "- ε_default: the library default: closed forms ∧ certified P&S Lemma 7, DP-SGD orders chosen adaptively "
            "(`ray_dptune.accounting.curves.adaptive_orders`); on DP-SGD the exact PLD profile (Poisson: δ̂ of Thm 6; TNB: "
            "Lemma 7's trade-off constraints)."
        ),
        (
            "- E[K] ours: the exact mean of our law. `TruncatedNegativeBinomial.from_mean` returns the largest "
            "mean not above the request; dp_accounting rounds γ down (mean at or above the request, 1e-9 relative)."
        ),
        (
            "- Times: median wall time (`time.perf_counter`) of building the base curve and the law, "
            "repeat-and-select and ε(δ), the four methods called round-robin with the order rotating. "
            "Up to 7 calls (3 with --quick), fewer (at least 3) when a row would take more than ~1 s per method "
            "(default 1.5 s). The library caches a DP-SGD base's PLD profile per (q, σ, T), "
            "but the default is timed cold: every cache is emptied before each call (`clear_profile_caches`)."
        ),
        (
            f"- dp_accounting 'failed to converge' warnings (fractional-order series of the subsampled Gaussian; "
            f"the order then gets no bound) during the run: {env['dp_accounting_convergence_warnings']} "
            "(silenced and counted)."
        ),
    ]
    for family, title in [
        ("zcdp", "0.1-zCDP base (P&S Figure 4), δ = 1e-6"),
        ("dpsgd", "DP-SGD bases (q = 0.01, T = 1000 steps), δ = 1e-5"),
    ]:
        subset = [r for r in rows if r.family == family]
        if subset:
            out += ["", f"## ε: {title}", "", *epsilon_table(subset)]
    out += ["", "## Timings", "", *timing_table(rows), ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer means and repeats (CI smoke run)")
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=RESULTS_DIR,
        help="where accounting.{md,json} go (accounting-quick.* with --quick)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings = CountingFilter()
    logging.getLogger("absl").addFilter(warnings)
    policies = {
        "dp": RepeatPolicy(most=3 if args.quick else 7, least=3, budget_s=1.0),
        "same": RepeatPolicy(most=3 if args.quick else 7, least=3, budget_s=1.0),
        "ours": RepeatPolicy(most=3 if args.quick else 7, least=3, budget_s=1.0),
        "generic": RepeatPolicy(most=3 if args.quick else 7, least=3, budget_s=1.5),
    }
    cases = build_cases(args.quick)
    # Warm-up (imports, first-call caches), not timed.
    epsilon_dp_accounting(cases[0])
    epsilon_ours(cases[0], generic=True)

    rows = []
    start = time.perf_counter()
    for index, case in enumerate(cases, 1):
        rows.append(measure(case, policies))
        r = rows[-1]
        print(
            f"[{index:2d}/{len(cases)}] {r.setting:28s} {r.law:16s} E[K]={r.mean_requested:<6g} "
            f"dp={r.eps_dp:.4f} same={r.eps_same:.4f} ours={r.eps_ours:.4f} generic={r.eps_generic:.4f} "
            f"t_ours/t_dp={r.ratio_ours:.3g}",
            flush=True,
        )
    elapsed = time.perf_counter() - start

    summary = summarize(rows)
    env = environment(args.quick, warnings.count)
    env["elapsed_s"] = round(elapsed, 1)
    stem = "accounting-quick" if args.quick else "accounting"
    args.output_dir.mkdir(parents=True, exist_ok=True)
    md_path, json_path = args.output_dir / f"{stem}.md", args.output_dir / f"{stem}.json"
    md_path.write_text(markdown(rows, summary, env), encoding="utf-8")
    json_path.write_text(
        json.dumps({"environment": env, "summary": summary, "rows": [r.to_dict() for r in rows]}, indent=2) + "\n",
        encoding="utf-8",
    )

    print(f"\n{len(rows)} rows in {elapsed:.0f} s; wrote {md_path} and {json_path}")
    print("\n".join(summary_lines(summary)))
    failed = bool(summary["same_base_violations"]) or summary["exact_ok"] is False
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
