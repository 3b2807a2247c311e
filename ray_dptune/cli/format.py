"""What ``ray-dptune`` prints and draws: tables, JSON documents and the plan's plot.

Pure formatting of numbers computed by :mod:`ray_dptune.cli.planning` (``plan`` and ``calibrate``),
:meth:`ray_dptune.records.ledger.PrivacyLedger.dataset_summary` and
:func:`ray_dptune.records.journal.journal_summary`; matplotlib is imported only to draw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ray_dptune.audit.bound import one_run_epsilon_lower
from ray_dptune.audit.counts import AUDIT_METHODS
from ray_dptune.cli.planning import LawSpec, RunMechanism, TrialSchedule, epsilon_curves
from ray_dptune.extras import extra_imports

__all__ = [
    "PLOT_MAX_MEAN",
    "check_plot_path",
    "format_audit",
    "format_calibration",
    "format_journal",
    "format_ledger_table",
    "format_plan",
    "plan_json",
    "plot_audit",
    "plot_epsilon_vs_mean",
]

PLOT_POINTS = 25
PLOT_MAX_MEAN = 1000.0

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


def _cell(value: Any, spec: str) -> str:
    """One table cell; non-finite numbers print as ``inf`` or ``-`` (undefined)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else "-"
    return format(value, spec)


def _align(cells: Sequence[Sequence[str]]) -> tuple[list[str], list[int]]:
    """Rows of cells, the first column left-aligned and the others right-aligned; and the column widths."""
    widths = [max(len(line[i]) for line in cells) for i in range(len(cells[0]))]
    lines = [
        "  ".join([line[0].ljust(widths[0]), *(cell.rjust(w) for cell, w in zip(line[1:], widths[1:], strict=True))])
        for line in cells
    ]
    return lines, widths


def format_plan(
    base: RunMechanism,
    rows: Sequence[dict[str, Any]],
    *,
    delta: float,
    success_p: float,
    generic: bool,
    plot: Path | None,
) -> str:
    """The ``plan`` table of :func:`~ray_dptune.cli.planning.plan_rows`, with its header and notes."""
    bounds = "closed-form bounds and numeric P&S Lemma 7" if generic else "closed-form bounds"
    cells = [[title for title, _, _ in _COLUMNS]]
    cells += [[_cell(row[key], spec) for _, key, spec in _COLUMNS] for row in rows]
    lines, widths = _align(cells)
    table = [line.rstrip() for line in lines]
    table.insert(1, "  ".join("-" * width for width in widths))
    out = [
        f"Base (one run): {base.description}; ε = {base.epsilon(delta=delta):.4g} at δ = {delta:g}",
        f"Whole search at δ = {delta:g} ({bounds}); P[success] with p = {success_p:g} per run",
        "",
        *table,
        "",
        "E[K]: exact mean of the law (a truncated negative binomial's is the largest not above --mean).",
        "k = ceil(mean) runs all released, by composition; ratio = ε search / ε compose k.",
    ]
    if plot is not None:
        out.append(f"Plot written to {plot}")
    return "\n".join(out)


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def plan_json(
    base: RunMechanism,
    rows: Sequence[dict[str, Any]],
    *,
    delta: float,
    success_p: float,
    generic: bool,
    plot: Path | None,
) -> dict[str, Any]:
    """The ``plan --json`` document: the base, the settings and the rows (non-finite numbers as null)."""
    clean_rows = [
        {key: _json_number(value) if isinstance(value, float) else value for key, value in row.items()} for row in rows
    ]
    return {
        "base": {**base.params, "description": base.description},
        "delta": delta,
        "success_p": success_p,
        "generic": bool(generic),
        "epsilon_one_run": _json_number(base.epsilon(delta=delta)),
        "rows": clean_rows,
        "plot": str(plot) if plot is not None else None,
    }


def format_calibration(result: dict[str, Any], *, schedule: TrialSchedule) -> str:
    """The ``calibrate`` lines of :func:`~ray_dptune.cli.planning.calibration` (its law given a ``name``)."""
    retries = result["retries"]
    plural = "y" if retries == 1 else "ies"
    rows = [
        ("noise multiplier σ", f"{float(result['noise_multiplier'])!r}"),
        ("ε whole search, no retry used", f"{result['epsilon_search']:.4f}"),
    ]
    if retries:
        rows.append((f"ε whole search, {retries} retr{plural} used", f"{result['epsilon_search_all_retries']:.4f}"))
    rows += [
        ("ε one trial alone", f"{result['epsilon_trial']:.4f}"),
        ("σ for one run, no tuning", f"{float(result['noise_multiplier_one_run'])!r}"),
        ("cost of tuning: σ / σ one run", f"{result['noise_ratio']:.3f}"),
    ]
    law = result["law"]
    width = max(len(label) for label, _ in rows)
    return "\n".join(
        [
            f"Target for the whole search: ε = {result['epsilon_target']:g}, δ = {result['delta']:g}",
            (
                f"Search: K ~ {law['name']} with E[K] = {law['mean']:.6g}, the best trial released; "
                f"{retries} retr{plural} reserved"
            ),
            f"Trial: {schedule.description}",
            "",
            *(f"{label.ljust(width)}  {value}" for label, value in rows),
            "",
            "σ is the smallest (to 0.1%) whose search meets the target with every reserved retry run.",
        ]
    )


def format_subsampled_calibration(result: dict[str, Any]) -> str:
    """The ``calibrate --tuning-fraction`` lines of :func:`~ray_dptune.cli.planning.subsampled_calibration`."""
    law, tuning, final = result["law"], result["tuning_schedule"], result["schedule"]
    rows = [
        ("σ_T, the tuning trials' noise", f"{float(result['noise_multiplier_tuning'])!r}"),
        ("σ_B, the final run's noise", f"{float(result['noise_multiplier_final'])!r}"),
        ("ε whole procedure", f"{result['epsilon_search']:.4f}"),
        ("σ of an ordinary search, all data", f"{float(result['noise_multiplier_ordinary_search'])!r}"),
        ("σ for one run, no tuning (exact)", f"{float(result['noise_multiplier_one_run'])!r}"),
        ("DP-SGD steps per search, E[·]", f"{result['steps_per_search']:.0f}"),
        ("the ordinary search's, E[·]", f"{result['steps_per_ordinary_search']:.0f}"),
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(
        [
            f"Target for the whole procedure: ε = {result['epsilon_target']:g}, δ = {result['delta']:g}",
            (
                f"Tuning: K ~ {law['name']} with E[K] = {law['mean']:.6g} trials on a Poisson sample of "
                f"{result['tuning_fraction']:g} of the data ({tuning['dataset_size']} planned records, q = "
                f"{tuning['sample_rate']:.4g}, {tuning['steps']} steps); {result['retries']} re-run(s) reserved"
            ),
            (
                f"Final run: the best configuration on all {final['dataset_size']} records, "
                f"q = {final['sample_rate']:.4g}, {final['steps']} steps: the released model"
            ),
            "",
            *(f"{label.ljust(width)}  {value}" for label, value in rows),
            "",
            f"σ_B is {1 + result['final_noise_overhead']:g} × one untuned run's σ at most; σ_T is the least that leaves it.",
        ]
    )


def format_ledger_table(path: Path, totals: dict[str, dict[str, Any]], *, delta: float) -> str:
    """The ``ledger show`` table of :meth:`~ray_dptune.records.ledger.PrivacyLedger.dataset_summary`: a row per dataset."""
    cells = [("dataset", "searches", "charged attempts", "release ε", "release δ", "ε total")]
    for name, total in totals.items():
        cells.append(
            (
                name,
                str(total["num_searches"]),
                str(total["charged_attempts"]),
                f"{total['release_epsilon']:.4g}",
                f"{total['release_delta']:.3g}",
                "-" if total["epsilon"] is None else f"{total['epsilon']:.4f}",
            )
        )
    notes = [f"{name}: {total['note']}" for name, total in totals.items() if total["note"]]
    return "\n".join(
        [
            f"Privacy ledger {path}: every search composed per dataset, at δ = {delta:g}",
            "(RDP curves added, Mironov 2017 Prop. 1; releases by basic composition, Dwork & Roth Thm 3.16)",
            "",
            *_align(cells)[0],
            *([""] + notes if notes else []),
        ]
    )


def format_journal(summary: dict[str, Any]) -> str:
    """The ``journal`` lines of :func:`~ray_dptune.records.journal.journal_summary`."""
    guarantee = summary["guarantee"]
    epsilon = "n/a (no plan recorded)" if guarantee["epsilon"] is None else f"{guarantee['epsilon']:.6g}"
    attempts = ", ".join(f"{count} {state}" for state, count in sorted(summary["attempts"].items())) or "none"
    return (
        f"search {summary['search_id']} ({summary['searcher']}, {summary['mechanism']['kind']}): "
        f"{summary['trials']} trial(s); attempts: {attempts}; restores: {summary['restores']}\n"
        f"(ε = {epsilon}, δ = {guarantee['delta']:g}) with {guarantee['charged_attempts']} attempt(s) charged "
        "beyond the selection bound (every attempt left live counts as run)"
    )


def format_audit(section: dict[str, Any]) -> str:
    """The ``audit`` lines: the proven ε, the audit's ε_lower, and how to read the pair."""
    proven = f"proven:  ε_upper = {section['epsilon_upper']:.4g} (δ = {section['delta']:g}) for the whole search"
    if section["epsilon_lower"] is None:
        return f"{proven}\naudit:   none ({section['missing']})"
    lower = section["epsilon_lower"]
    reading = (
        "consistent: the audit found no more leakage than the proof allows (a black-box audit is expected to "
        "fall far below it)"
        if section["consistent"]
        else "INCONSISTENT: the audit proves more leakage than the guarantee allows: a bug in the bound or the code"
    )
    return (
        f"{proven}\n"
        f"audit:   ε_lower = {lower:.4g} at {section['confidence']:.0%} confidence: {section['correct']} of "
        f"{section['guesses']} guesses right on {section['canaries']} canaries\n"
        f"method:  {AUDIT_METHODS.get(section['method'], section['method'])}\n"
        f"reading: {reading}"
    )


def plot_audit(path: Path, section: dict[str, Any]) -> None:
    """Draws ε_lower against the number of correct guesses (the observed one marked), beside ε_upper."""
    with extra_imports("plot", "ray-dptune audit --plot"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

    guesses, canaries, delta = section["guesses"], section["canaries"], section["delta"]
    corrects = list(range(guesses // 2, guesses + 1))
    lowers = [
        one_run_epsilon_lower(
            canaries=canaries, guesses=guesses, correct=v, delta=delta, confidence=section["confidence"]
        )
        for v in corrects
    ]
    figure = Figure(figsize=(7.0, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.plot([v / guesses for v in corrects], lowers, label=f"ε_lower ({section['confidence']:.0%} confidence)")
    axes.axhline(section["epsilon_upper"], color="black", linestyle="--", label="ε_upper (proven)")
    observed = section["correct"] / guesses
    axes.plot([observed], [section["epsilon_lower"]], "o", color="red", label="this search")
    axes.set_xlabel(f"share of the {guesses} guesses that are right ({canaries} canaries)")
    axes.set_ylabel(f"ε (δ = {delta:g})")
    axes.legend()
    figure.savefig(path)


def check_plot_path(path: Path) -> None:
    """Fails early (before any computation) on a missing folder or an unknown image format.

    Raises:
        ValueError: naming ``--plot``.
    """
    with extra_imports("plot", "ray-dptune plan --plot"):
        from matplotlib.figure import Figure

    if not path.parent.is_dir():
        raise ValueError(f"--plot {path}: folder {path.parent} does not exist")
    suffix = path.suffix.lstrip(".").lower()
    supported = Figure().canvas.get_supported_filetypes()
    if suffix not in supported:
        raise ValueError(f"--plot {path}: unknown image format {suffix!r}; use one of {', '.join(sorted(supported))}")


def plot_epsilon_vs_mean(
    path: Path,
    base: RunMechanism,
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
    with extra_imports("plot", "ray-dptune plan --plot"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

    top = max([PLOT_MAX_MEAN, *means])
    by_law, (runs, composed) = epsilon_curves(base, laws, delta=delta, top=top, points=PLOT_POINTS, generic=generic)
    figure = Figure(figsize=(7.0, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    highest = 0.0
    for name, (xs, ys) in by_law.items():
        highest = max([highest, *(y for y in ys if math.isfinite(y))])
        axes.plot(xs, ys, label=name)
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
