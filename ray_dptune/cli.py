"""The ``ray-dptune`` command line.

Subcommands:

* ``plan``: before any run, the (ε, δ) of a whole private hyperparameter search
  (Papernot & Steinke 2022: draw K from a law, run the base mechanism K times,
  release only the best run) for one or more laws of K, beside plain composition
  of the same number of runs, with the utility side of each law (expected quantile
  of the released run, chance that some run succeeds).
* ``ledger show|export``: per-dataset totals of every search recorded in a privacy
  ledger (:mod:`ray_dptune.ledger`), as a table or JSON.

Only numpy and scipy are imported at module level, so ``plan`` starts fast;
subcommands that need Ray or torch import them inside their function.

Example:
    ray-dptune plan --gaussian 2.236 --delta 1e-6 --mean 10 100 --plot eps.png
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ray_dptune.accounting import RDPCurve, gaussian_profile, repeat_and_select, subsampled_gaussian_profile
from ray_dptune.accounting.mechanisms import DeltaProfile
from ray_dptune.distributions import (
    Geometric,
    Logarithmic,
    PointMass,
    Poisson,
    RunCountDistribution,
    TruncatedNegativeBinomial,
)

if TYPE_CHECKING:
    from ray_dptune.ledger import PrivacyLedger

__all__ = ["build_parser", "main"]

PROG = "ray-dptune"
DEFAULT_DELTA = 1e-6  # P&S Figure 4
DEFAULT_MEAN = 10.0
DEFAULT_SUCCESS_P = 0.01  # P&S Figure 6: a run "succeeds" when it lands in the top 1%
DEFAULT_LAWS = ("poisson", "logarithmic", "tnb:0.5", "geometric")
PLOT_POINTS = 25
PLOT_MAX_MEAN = 1000.0


# ---------------------------------------------------------------------- value types
@dataclasses.dataclass(frozen=True)
class LawSpec:
    """A law of the number of runs K, named on the command line, not yet given a mean.

    Attributes:
        name: canonical name printed in the table (``poisson``, ``tnb:0.5``, ...).
        kind: ``poisson``, ``logarithmic``, ``geometric`` or ``tnb``.
        eta: shape η of a truncated negative binomial law (``kind == "tnb"``), else None.
    """

    name: str
    kind: str
    eta: float | None = None

    def build(self, mean: float) -> RunCountDistribution:
        """The law with this shape and (up to rounding down, for TNB laws) this mean.

        Args:
            mean: requested E[K].

        Returns:
            The law; for TNB laws its exact mean is the largest not above ``mean``.
        """
        if self.kind == "poisson":
            return Poisson(mean)
        if self.kind == "logarithmic":
            return Logarithmic.from_mean(mean)
        if self.kind == "geometric":
            return Geometric.from_mean(mean)
        assert self.eta is not None
        return TruncatedNegativeBinomial.from_mean(self.eta, mean)


@dataclasses.dataclass(frozen=True)
class BaseMechanism:
    """The mechanism every single run satisfies.

    Attributes:
        curve: its RDP curve.
        profile: its exact (ε, δ) profile when known (tightens the Poisson bound), else None.
        description: one human-readable line.
        params: JSON-ready description.
    """

    curve: RDPCurve
    profile: DeltaProfile | None
    description: str
    params: dict[str, Any]


# ---------------------------------------------------------------------- argument types
def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    """Type of an option that takes a finite number > 0."""
    value = _finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _open_unit_float(text: str) -> float:
    """Type of an option that takes a number strictly between 0 and 1 (δ)."""
    value = _finite_float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must lie strictly between 0 and 1, got {text}")
    return value


def _probability(text: str) -> float:
    """Type of an option that takes a probability in [0, 1]."""
    value = _finite_float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a probability in [0, 1], got {text}")
    return value


def parse_law(text: str) -> LawSpec:
    """Type of ``--law``: ``poisson``, ``logarithmic``, ``geometric`` or ``tnb:ETA``.

    Args:
        text: the value given on the command line (case-insensitive).

    Returns:
        The parsed law.

    Raises:
        argparse.ArgumentTypeError: unknown law or invalid η (η must be > -1).
    """
    value = text.strip().lower()
    if value in ("poisson", "logarithmic", "geometric"):
        return LawSpec(name=value, kind=value)
    if value == "tnb" or value.startswith("tnb:"):
        eta_text = value[4:]
        if not eta_text:
            raise argparse.ArgumentTypeError(f"{text!r}: a truncated negative binomial needs its shape, e.g. tnb:0.5")
        try:
            eta = _finite_float(eta_text)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"{text!r}: the shape η after 'tnb:' must be a number") from None
        if eta <= -1.0:
            raise argparse.ArgumentTypeError(f"{text!r}: the shape η must be > -1 (P&S Definition 1)")
        return LawSpec(name=f"tnb:{eta:g}", kind="tnb", eta=eta)
    raise argparse.ArgumentTypeError(
        f"unknown law {text!r}; choose poisson, logarithmic, geometric or tnb:ETA (e.g. tnb:0.5)"
    )


# ---------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    """The top-level parser, one subparser per subcommand."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Differentially private hyperparameter search for Ray Tune: "
        "one honest (ε, δ) for the whole search.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_plan_parser(subparsers)
    _add_ledger_parser(subparsers)
    _add_journal_parser(subparsers)
    return parser


def _add_plan_parser(subparsers: Any) -> argparse.ArgumentParser:
    plan = subparsers.add_parser(
        "plan",
        help="ε of a whole search for each law of the number of runs K, before running anything.",
        description=textwrap.fill(
            "Print, for each law of the number of runs K and each mean E[K], the (ε, δ) of the whole "
            "hyperparameter search (run the base mechanism K times, release only the best run; "
            "Papernot & Steinke 2022) beside composing ceil(mean) runs, with the expected quantile of "
            "the released run and the chance that at least one run succeeds.",
            width=78,
        ),
        epilog=(
            "examples:\n"
            f"  {PROG} plan --gaussian 2.236 --mean 10 100\n"
            f"  {PROG} plan --dpsgd 0.01 1.0 1000 --law poisson --law tnb:0.5 --exact-profile\n"
            f"  {PROG} plan --zcdp 0.1 --mean 10 --plot eps.png\n"
            f"  {PROG} plan --zcdp 0.1 --json"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    base = plan.add_argument_group("base mechanism (one run; exactly one is required)")
    choice = base.add_mutually_exclusive_group(required=True)
    choice.add_argument(
        "--gaussian",
        type=_positive_float,
        metavar="SIGMA",
        help="Gaussian mechanism with sensitivity 1 and noise standard deviation SIGMA "
        "(its exact privacy profile tightens the Poisson bound).",
    )
    choice.add_argument(
        "--dpsgd",
        nargs=3,
        metavar=("SAMPLE_RATE", "SIGMA", "STEPS"),
        help="DP-SGD: STEPS Poisson-subsampled Gaussian steps with sampling rate SAMPLE_RATE in (0, 1] "
        "and noise multiplier SIGMA.",
    )
    choice.add_argument("--zcdp", type=_positive_float, metavar="RHO", help="any RHO-zCDP mechanism.")
    base.add_argument(
        "--exact-profile",
        action="store_true",
        help="with --dpsgd: also use its exact privacy profile (PLD accountant) in the Poisson bound; tighter, slower.",
    )

    search = plan.add_argument_group("search")
    search.add_argument(
        "--delta",
        type=_open_unit_float,
        default=DEFAULT_DELTA,
        help=f"δ of the whole search's (ε, δ) guarantee (default: {DEFAULT_DELTA:g}).",
    )
    search.add_argument(
        "--law",
        action="append",
        type=parse_law,
        metavar="LAW",
        help="law of the number of runs K; repeat for several: poisson, logarithmic, geometric, or tnb:ETA "
        "(truncated negative binomial with shape ETA > -1, e.g. tnb:0.5). "
        f"Default: {', '.join(DEFAULT_LAWS)}.",
    )
    search.add_argument(
        "--mean",
        nargs="+",
        type=_positive_float,
        default=[DEFAULT_MEAN],
        metavar="MEAN",
        help=f"one or more expected numbers of runs E[K] (default: {DEFAULT_MEAN:g}); "
        "must be > 1 for the laws other than poisson, which always run at least once.",
    )
    search.add_argument(
        "--success-p",
        type=_probability,
        default=DEFAULT_SUCCESS_P,
        metavar="P",
        help="chance that one run is a success (e.g. lands in the top 1%% of the search space), "
        f"for the P[success] column (default: {DEFAULT_SUCCESS_P:g}).",
    )
    search.add_argument(
        "--generic",
        action="store_true",
        help="also evaluate the generic bound (P&S Lemma 7) numerically and keep the smaller ε; tighter, slower.",
    )

    output = plan.add_argument_group("output")
    output.add_argument("--json", action="store_true", help="print machine-readable JSON instead of the table.")
    output.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help=f"also draw ε against E[K] (1 to {PLOT_MAX_MEAN:g}, log scale), one line per law plus "
        "composition, into FILE (format from its extension).",
    )
    plan.set_defaults(handler=_run_plan, subparser=plan)
    return plan


# ---------------------------------------------------------------------- base mechanism
def _parse_dpsgd(values: Sequence[str]) -> tuple[float, float, int]:
    """Validates ``--dpsgd SAMPLE_RATE SIGMA STEPS``.

    Raises:
        ValueError: with a message naming the bad value.
    """
    rate_text, sigma_text, steps_text = values
    try:
        rate = _finite_float(rate_text)
        sigma = _finite_float(sigma_text)
    except argparse.ArgumentTypeError as error:
        raise ValueError(f"--dpsgd: {error}") from None
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"--dpsgd: SAMPLE_RATE must lie in (0, 1], got {rate_text}")
    if sigma <= 0:
        raise ValueError(f"--dpsgd: SIGMA must be > 0, got {sigma_text}")
    try:
        steps = int(steps_text)
    except ValueError:
        raise ValueError(f"--dpsgd: STEPS must be a whole number, got {steps_text!r}") from None
    if steps < 1:
        raise ValueError(f"--dpsgd: STEPS must be >= 1, got {steps_text}")
    return rate, sigma, steps


def _build_base(args: argparse.Namespace) -> BaseMechanism:
    """The base mechanism named by ``--gaussian``, ``--dpsgd`` or ``--zcdp``.

    Raises:
        ValueError: invalid parameters.
    """
    if args.exact_profile and args.dpsgd is None:
        raise ValueError(
            "--exact-profile only applies to --dpsgd (--gaussian always uses its exact profile; --zcdp has none)"
        )
    if args.gaussian is not None:
        sigma = args.gaussian
        return BaseMechanism(
            curve=RDPCurve.gaussian(sigma),
            profile=gaussian_profile(sigma),
            description=f"Gaussian mechanism, σ = {sigma:g} (sensitivity 1), exact profile for poisson",
            params={"mechanism": "gaussian", "sigma": sigma},
        )
    if args.dpsgd is not None:
        rate, sigma, steps = _parse_dpsgd(args.dpsgd)
        curve = RDPCurve.subsampled_gaussian(rate, sigma, steps)
        profile = subsampled_gaussian_profile(rate, sigma, steps) if args.exact_profile else None
        profile_note = ", exact PLD profile for poisson" if args.exact_profile else ""
        return BaseMechanism(
            curve=curve,
            profile=profile,
            description=f"DP-SGD, sample rate {rate:g}, σ = {sigma:g}, {steps} steps{profile_note}",
            params={
                "mechanism": "dpsgd",
                "sample_rate": rate,
                "sigma": sigma,
                "steps": steps,
                "exact_profile": bool(args.exact_profile),
            },
        )
    rho = args.zcdp
    return BaseMechanism(
        curve=RDPCurve.zcdp(rho),
        profile=None,
        description=f"{rho:g}-zCDP mechanism",
        params={"mechanism": "zcdp", "rho": rho},
    )


# ---------------------------------------------------------------------- accounting
def _unique_laws(laws: Sequence[LawSpec] | None) -> list[LawSpec]:
    """The requested laws in order, without repeats; the defaults when none were given."""
    specs = list(laws) if laws else [parse_law(name) for name in DEFAULT_LAWS]
    return list(dict.fromkeys(specs))


def search_epsilon(base: BaseMechanism, law: RunCountDistribution, delta: float, *, generic: bool = False) -> float:
    """ε at ``delta`` of running ``base`` K ~ ``law`` times and releasing the best run."""
    profile = base.profile if isinstance(law, Poisson) else None
    return repeat_and_select(base.curve, law, base_delta=profile, generic=generic).epsilon(delta)


def composition_epsilon(base: BaseMechanism, runs: int, delta: float) -> float:
    """ε at ``delta`` of ``runs`` runs of ``base``, all released (plain composition)."""
    return repeat_and_select(base.curve, PointMass(runs)).epsilon(delta)


def _composition_runs(mean: float) -> int:
    return max(1, math.ceil(mean))


def _ratio(numerator: float, denominator: float) -> float:
    if denominator > 0 and math.isfinite(denominator):
        return numerator / denominator
    return math.nan


def plan_rows(
    base: BaseMechanism,
    laws: Sequence[LawSpec],
    means: Sequence[float],
    *,
    delta: float,
    success_p: float,
    generic: bool = False,
) -> list[dict[str, Any]]:
    """One row per (mean, law): the numbers ``ray-dptune plan`` prints.

    Args:
        base: the mechanism every run satisfies.
        laws: laws of K.
        means: requested E[K] values.
        delta: δ of the whole search.
        success_p: chance that one run succeeds.
        generic: also use the numeric P&S Lemma 7 bound.

    Returns:
        Dicts with keys law, law_spec, requested_mean, mean, epsilon, composition_runs,
        epsilon_composition, ratio, expected_quantile, success_probability, epsilon_one_run.
    """
    one_run = base.curve.epsilon(delta)
    rows = []
    for mean in means:
        runs = _composition_runs(mean)
        composed = composition_epsilon(base, runs, delta)
        for spec in laws:
            law = spec.build(mean)
            epsilon = search_epsilon(base, law, delta, generic=generic)
            rows.append(
                {
                    "law": spec.name,
                    "law_spec": law.to_dict(),
                    "requested_mean": mean,
                    "mean": law.mean,
                    "epsilon": epsilon,
                    "composition_runs": runs,
                    "epsilon_composition": composed,
                    "ratio": _ratio(epsilon, composed),
                    "expected_quantile": law.expected_quantile(),
                    "success_probability": law.success_probability(success_p),
                    "epsilon_one_run": one_run,
                }
            )
    return rows


# ---------------------------------------------------------------------- output
def _header(base: BaseMechanism, delta: float, success_p: float, generic: bool) -> list[str]:
    bounds = "closed-form bounds and numeric P&S Lemma 7" if generic else "closed-form bounds"
    return [
        f"Base (one run): {base.description}; ε = {base.curve.epsilon(delta):.4g} at δ = {delta:g}",
        f"Whole search at δ = {delta:g} ({bounds}); P[success] with p = {success_p:g} per run",
    ]


def _cell(value: Any, spec: str) -> str:
    """One table cell; non-finite numbers print as ``inf`` or ``-`` (undefined)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else "-"
    return format(value, spec)


_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (title, row key, format)
    ("law", "law", "s"),
    ("E[K]", "mean", ".6g"),
    ("ε search", "epsilon", ".4f"),
    ("k", "composition_runs", "d"),
    ("ε compose k", "epsilon_composition", ".4f"),
    ("ratio", "ratio", ".3f"),
    ("E[quantile]", "expected_quantile", ".4f"),
    ("P[success]", "success_probability", ".4f"),
    ("ε one run", "epsilon_one_run", ".4f"),
)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows from :func:`plan_rows` as an aligned text table."""
    cells = [[title for title, _, _ in _COLUMNS]]
    for row in rows:
        cells.append([_cell(row[key], spec) for _, key, spec in _COLUMNS])
    widths = [max(len(line[i]) for line in cells) for i in range(len(_COLUMNS))]
    out = []
    for line in cells:
        parts = [line[0].ljust(widths[0])] + [
            cell.rjust(width) for cell, width in zip(line[1:], widths[1:], strict=True)
        ]
        out.append("  ".join(parts).rstrip())
    out.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(out)


def _footer() -> list[str]:
    return [
        "E[K]: exact mean of the law (a truncated negative binomial's is the largest not above --mean).",
        "k = ceil(mean) runs all released, by composition; ratio = ε search / ε compose k.",
    ]


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _to_json(base: BaseMechanism, rows: Sequence[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    clean_rows = [
        {key: _json_number(value) if isinstance(value, float) else value for key, value in row.items()} for row in rows
    ]
    return {
        "base": {**base.params, "description": base.description},
        "delta": args.delta,
        "success_p": args.success_p,
        "generic": bool(args.generic),
        "epsilon_one_run": _json_number(base.curve.epsilon(args.delta)),
        "rows": clean_rows,
        "plot": str(args.plot) if args.plot is not None else None,
    }


# ---------------------------------------------------------------------- plot
def _check_plot_path(path: Path) -> None:
    """Fails early (before any computation) on a missing folder or an unknown format."""
    from matplotlib.figure import Figure

    if not path.parent.is_dir():
        raise ValueError(f"--plot {path}: folder {path.parent} does not exist")
    suffix = path.suffix.lstrip(".").lower()
    supported = Figure().canvas.get_supported_filetypes()
    if suffix not in supported:
        raise ValueError(f"--plot {path}: unknown image format {suffix!r}; use one of {', '.join(sorted(supported))}")


def _plot_means(spec: LawSpec, top: float) -> np.ndarray:
    low = 1.0 if spec.kind == "poisson" else 1.5
    return np.geomspace(low, top, PLOT_POINTS)


def plot_epsilon_vs_mean(
    path: Path,
    base: BaseMechanism,
    laws: Sequence[LawSpec],
    *,
    delta: float,
    generic: bool = False,
    means: Sequence[float] = (),
) -> None:
    """Draws ε of the whole search against E[K] (P&S Figure 4 style) into ``path``.

    Args:
        path: image file; its extension picks the format.
        base: the mechanism every run satisfies.
        laws: one line per law, plus a "composition" line.
        delta: δ of the whole search.
        generic: also use the numeric P&S Lemma 7 bound.
        means: the requested means, marked by dotted vertical lines.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    top = max([PLOT_MAX_MEAN, *means])
    figure = Figure(figsize=(7.0, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    highest = 0.0
    for spec in laws:
        laws_on_grid = [spec.build(float(mean)) for mean in _plot_means(spec, top)]
        xs = [law.mean for law in laws_on_grid]
        ys = [search_epsilon(base, law, delta, generic=generic) for law in laws_on_grid]
        highest = max([highest, *(y for y in ys if math.isfinite(y))])
        axes.plot(xs, ys, label=spec.name)
    runs = np.unique(np.round(np.geomspace(1.0, top, 4 * PLOT_POINTS)).astype(int))
    composed = [composition_epsilon(base, int(k), delta) for k in runs]
    axes.plot(runs, composed, color="black", linestyle="--", label="composition")
    for mean in means:
        axes.axvline(mean, color="grey", linestyle=":", linewidth=0.8)
    axes.set_xscale("log")
    axes.set_xlim(1.0, top)
    if highest > 0:
        axes.set_ylim(0.0, 1.3 * highest)  # composition leaves the frame, as in P&S Figure 4
    axes.set_xlabel("expected number of runs E[K]")
    axes.set_ylabel(f"ε of the whole search (δ = {delta:g})")
    axes.set_title(base.description, fontsize=9)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.savefig(path, dpi=120)


# ---------------------------------------------------------------------- ledger
def _add_ledger_parser(subparsers: Any) -> argparse.ArgumentParser:
    ledger = subparsers.add_parser(
        "ledger",
        help="per-dataset privacy totals of every search recorded in a privacy ledger.",
        description="Compose every search recorded in a ray_dptune privacy ledger (SQLite) per dataset: "
        "RDP curves add (Mironov 2017, Prop. 1), approximate-DP releases add in ε and δ.",
    )
    ledger.add_argument("action", choices=("show", "export"), help="show: a table; export: JSON with every search.")
    ledger.add_argument("path", type=Path, help="the ledger file.")
    ledger.add_argument("--delta", type=_open_unit_float, default=1e-5, help="δ of the totals (default: 1e-05).")
    ledger.add_argument("--dataset", help="only this dataset.")
    ledger.add_argument("--curves", action="store_true", help="export: also each search's RDP curve.")
    ledger.set_defaults(handler=_run_ledger, subparser=ledger)
    return ledger


def _run_ledger(args: argparse.Namespace) -> int:
    """``ray-dptune ledger show|export``: reads the ledger, never writes it."""
    from ray_dptune.errors import PrivacyError
    from ray_dptune.ledger import PrivacyLedger

    parser: argparse.ArgumentParser = args.subparser
    if not args.path.exists():
        parser.error(f"no ledger at {args.path}")
    try:
        ledger = PrivacyLedger(args.path)
        datasets = [args.dataset] if args.dataset else ledger.datasets()
        totals = {name: ledger_dataset_total(ledger, name, args.delta, curves=args.curves) for name in datasets}
        ledger.close()
    except PrivacyError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    if args.action == "export":
        print(json.dumps({"ledger": str(args.path), "delta": args.delta, "datasets": totals}, indent=2))
    else:
        print(format_ledger_table(args.path, args.delta, totals))
    return 0


def ledger_dataset_total(ledger: PrivacyLedger, dataset: str, delta: float, *, curves: bool = False) -> dict[str, Any]:
    """One dataset's total at ``delta`` and its searches, JSON-ready.

    ``epsilon`` is None, with the reason in ``note``, where the total has no bound at
    ``delta`` (a search charged attempts before its plan was known, or the releases
    need δ >= ``delta``).
    """
    from ray_dptune.errors import PrivacyError
    from ray_dptune.store import StoreError

    searches = ledger.searches(dataset, delta=delta, curves=curves)
    for search in searches:
        search["epsilon"] = _finite_or_none(search["epsilon"])
    epsilon, note = None, None
    try:
        epsilon = _finite_or_none(ledger.dataset_epsilon(dataset, delta=delta))
    except StoreError:
        raise
    except PrivacyError as error:
        note = str(error)
    if epsilon is None and note is None:
        note = f"the searches' curves give no finite ε at δ = {delta:g}."
    return {
        "epsilon": epsilon,
        "note": note,
        "num_searches": len(searches),
        "charged_attempts": sum(search["charged_attempts"] for search in searches),
        "release_epsilon": math.fsum(search["release_epsilon"] for search in searches),
        "release_delta": math.fsum(search["release_delta"] for search in searches),
        "searches": searches,
    }


def _finite_or_none(value: float | None) -> float | None:
    return None if value is None else _json_number(value)


def format_ledger_table(path: Path, delta: float, totals: dict[str, dict[str, Any]]) -> str:
    """The ``ledger show`` table: one row per dataset, then the notes."""
    titles = ("dataset", "searches", "charged attempts", "release ε", "release δ", "ε total")
    cells = [titles]
    for name, total in totals.items():
        epsilon = "-" if total["epsilon"] is None else f"{total['epsilon']:.4f}"
        cells.append((
            name,
            str(total["num_searches"]),
            str(total["charged_attempts"]),
            f"{total['release_epsilon']:.4g}",
            f"{total['release_delta']:.3g}",
            epsilon,
        ))
    widths = [max(len(line[i]) for line in cells) for i in range(len(titles))]
    rows = [
        "  ".join([line[0].ljust(widths[0]), *(cell.rjust(w) for cell, w in zip(line[1:], widths[1:], strict=True))])
        for line in cells
    ]
    notes = [f"{name}: {total['note']}" for name, total in totals.items() if total["note"]]
    return "\n".join([
        f"Privacy ledger {path}: every search composed per dataset, at δ = {delta:g}",
        "(RDP curves added, Mironov 2017 Prop. 1; releases by basic composition, Dwork & Roth Thm 3.16)",
        "",
        *rows,
        *([""] + notes if notes else []),
    ])


# ---------------------------------------------------------------------- commands
def _run_plan(args: argparse.Namespace) -> int:
    """``ray-dptune plan``: prints the table (or JSON) and optionally draws the plot."""
    parser: argparse.ArgumentParser = args.subparser
    laws = _unique_laws(args.law)
    try:
        if args.plot is not None:
            _check_plot_path(args.plot)
        base = _build_base(args)
        rows = plan_rows(base, laws, args.mean, delta=args.delta, success_p=args.success_p, generic=args.generic)
        if args.plot is not None:
            plot_epsilon_vs_mean(args.plot, base, laws, delta=args.delta, generic=args.generic, means=args.mean)
    except ValueError as error:  # the library's and our own validation messages
        parser.error(str(error))
    except OSError as error:
        parser.exit(1, f"{parser.prog}: error: cannot write {args.plot}: {error}\n")

    if args.json:
        print(json.dumps(_to_json(base, rows, args), indent=2, allow_nan=False))
        return 0
    lines = [*_header(base, args.delta, args.success_p, args.generic), ""]
    lines += [format_table(rows), "", *_footer()]
    if args.plot is not None:
        lines.append(f"Plot written to {args.plot}")
    print("\n".join(lines))
    return 0


def _add_journal_parser(subparsers: Any) -> argparse.ArgumentParser:
    journal = subparsers.add_parser(
        "journal",
        help="what a search's write-ahead journal proves it spent (also for a killed, unfinished search).",
        description="Rebuild a search's privacy account from its journal (privacy_journal.db), charging every "
        "attempt a driver left running or only suggested, and print its (ε, δ). Reads, never writes.",
    )
    journal.add_argument("path", type=Path, help="the experiment folder or its privacy_journal.db.")
    journal.add_argument("--json", action="store_true", help="print JSON.")
    journal.set_defaults(handler=_run_journal, subparser=journal)
    return journal


def _run_journal(args: argparse.Namespace) -> int:
    """``ray-dptune journal PATH``: the account a new driver would rebuild."""
    from ray_dptune.errors import PrivacyError
    from ray_dptune.journal import journal_summary

    parser: argparse.ArgumentParser = args.subparser
    try:
        summary = journal_summary(args.path)
    except PrivacyError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    guarantee = summary["guarantee"]
    epsilon = "n/a (no plan recorded)" if guarantee["epsilon"] is None else f"{guarantee['epsilon']:.6g}"
    attempts = ", ".join(f"{count} {state}" for state, count in sorted(summary["attempts"].items())) or "none"
    print(
        f"search {summary['search_id']} ({summary['searcher']}, {summary['mechanism']['kind']}): "
        f"{summary['trials']} trial(s); attempts: {attempts}; restores: {summary['restores']}\n"
        f"(ε = {epsilon}, δ = {guarantee['delta']:g}) with {guarantee['charged_attempts']} attempt(s) charged "
        "beyond the selection bound (every attempt left live counts as run)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ray-dptune`` console script.

    Args:
        argv: arguments without the program name; None reads ``sys.argv[1:]``.

    Returns:
        The exit status (usage errors raise SystemExit(2) through argparse).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
