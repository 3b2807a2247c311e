"""The ``ray-dptune`` command line: argument parsing and dispatch over the library.

Subcommands:

* ``plan``: before any run, the (ε, δ) of a whole private hyperparameter search for
  one or more laws of K, beside plain composition (:mod:`ray_dptune.cli.planning`).
* ``calibrate``: the other way round, the DP-SGD noise multiplier σ that meets a target
  (ε, δ) for the whole search, and what the search costs at it (the whole-search
  analogue of TF-Privacy's ``compute_dp_sgd_privacy``).
* ``ledger show|export``: per-dataset totals of every search recorded in a privacy
  ledger (:meth:`ray_dptune.records.ledger.PrivacyLedger.dataset_summary`).
* ``journal PATH``: what a search's write-ahead journal proves it spent
  (:func:`ray_dptune.records.journal.journal_summary`).
* ``audit FOLDER``: a released search's one-run audit, ε_lower beside the proven ε
  (:mod:`ray_dptune.audit`), and its plot.

Printing lives in :mod:`ray_dptune.cli.format`. Ray and torch are never imported, so the
core install runs every command; matplotlib only by ``plan --plot`` (``ray_dptune[plot]``).
Examples: ``ray-dptune plan --gaussian 2.236 --delta 1e-6 --mean 10 100 --plot eps.png``;
``ray-dptune calibrate --epsilon 3 --delta 1e-5 --mean 8 --dataset-size 1437 --batch-size 64 --epochs 9``.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ray_dptune.cli import calibrate as cli_calibrate
from ray_dptune.cli import format as cli_format
from ray_dptune.cli.args import (
    DEFAULT_MEAN,
    LAW_CHOICES,
    PROG,
    count,
    law_spec,
    open_unit_float,
    positive_float,
    probability,
    sample_rate,
)
from ray_dptune.cli.planning import DEFAULT_LAWS, RunMechanism, plan_rows, unique_laws
from ray_dptune.errors import PrivacyError
from ray_dptune.extras import MissingExtraError
from ray_dptune.records.journal import journal_summary
from ray_dptune.records.ledger import PrivacyLedger
from ray_dptune.records.report import REPORT_FILE, PrivacyReport

__all__ = ["build_parser", "main"]

DEFAULT_DELTA = 1e-6  # P&S Figure 4
DEFAULT_SUCCESS_P = 0.01  # P&S Figure 6: a run "succeeds" when it lands in the top 1%


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
    cli_calibrate.add_parser(subparsers)
    _add_ledger_parser(subparsers)
    _add_journal_parser(subparsers)
    _add_audit_parser(subparsers)
    return parser


def _add_plan_parser(subparsers: Any) -> None:
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
        type=positive_float,
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
    choice.add_argument("--zcdp", type=positive_float, metavar="RHO", help="any RHO-zCDP mechanism.")
    base.add_argument(
        "--exact-profile",
        action="store_true",
        help="with --dpsgd: also use its exact privacy profile (PLD accountant) in the Poisson bound; tighter, slower.",
    )

    search = plan.add_argument_group("search")
    search.add_argument(
        "--delta",
        type=open_unit_float,
        default=DEFAULT_DELTA,
        help=f"δ of the whole search's (ε, δ) guarantee (default: {DEFAULT_DELTA:g}).",
    )
    search.add_argument(
        "--law",
        action="append",
        type=law_spec,
        metavar="LAW",
        help=f"law of the number of runs K; repeat for several: {LAW_CHOICES}. Default: {', '.join(DEFAULT_LAWS)}.",
    )
    search.add_argument(
        "--mean",
        nargs="+",
        type=positive_float,
        default=[DEFAULT_MEAN],
        metavar="MEAN",
        help=f"one or more expected numbers of runs E[K] (default: {DEFAULT_MEAN:g}); "
        "must be > 1 for the laws other than poisson, which always run at least once.",
    )
    search.add_argument(
        "--success-p",
        type=probability,
        default=DEFAULT_SUCCESS_P,
        metavar="P",
        help="chance that one run is a success (e.g. lands in the top 1%% of the search space), "
        f"for the P[success] column (default: {DEFAULT_SUCCESS_P:g}).",
    )
    search.add_argument(
        "--closed-form",
        action="store_true",
        help="closed forms only (P&S Thms 2/6, DP-HyPO Thm 1), without the numeric Lemma 7 bound the default "
        "also evaluates (keeping the smaller ε): the cross-check, never tighter.",
    )

    output = plan.add_argument_group("output")
    output.add_argument("--json", action="store_true", help="print machine-readable JSON instead of the table.")
    output.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help=f"also draw ε against E[K] (1 to {cli_format.PLOT_MAX_MEAN:g}, log scale), one line per law plus "
        "composition, into FILE (format from its extension).",
    )
    plan.set_defaults(handler=_run_plan, subparser=plan)


def _add_ledger_parser(subparsers: Any) -> None:
    ledger = subparsers.add_parser(
        "ledger",
        help="per-dataset privacy totals of every search recorded in a privacy ledger.",
        description="Compose every search recorded in a ray_dptune privacy ledger (SQLite) per dataset: "
        "RDP curves add (Mironov 2017, Prop. 1), approximate-DP releases add in ε and δ.",
    )
    ledger.add_argument("action", choices=("show", "export"), help="show: a table; export: JSON with every search.")
    ledger.add_argument("path", type=Path, help="the ledger file.")
    ledger.add_argument("--delta", type=open_unit_float, default=1e-5, help="δ of the totals (default: 1e-05).")
    ledger.add_argument("--dataset", help="only this dataset.")
    ledger.add_argument("--curves", action="store_true", help="export: also each search's RDP curve.")
    ledger.set_defaults(handler=_run_ledger, subparser=ledger)


def _add_journal_parser(subparsers: Any) -> None:
    journal = subparsers.add_parser(
        "journal",
        help="what a search's write-ahead journal proves it spent (also for a killed, unfinished search).",
        description="Rebuild a search's privacy account from its journal (privacy_journal.db), charging every "
        "attempt a driver left running or only suggested, and print its (ε, δ). Reads, never writes.",
    )
    journal.add_argument("path", type=Path, help="the experiment folder or its privacy_journal.db.")
    journal.add_argument("--json", action="store_true", help="print JSON.")
    journal.set_defaults(handler=_run_journal, subparser=journal)


def _add_audit_parser(subparsers: Any) -> None:
    audit = subparsers.add_parser(
        "audit",
        help="a released search's empirical lower bound on ε (one-run canary audit) beside its proven ε.",
        description="Print the audit section of a search's privacy report, written by release_best: the canaries, "
        "the guesses made on the released model, how many were right, and the ε_lower they prove at the stated "
        "confidence (Steinke, Nasr & Jagielski 2023, Theorem 3) beside the proven ε_upper. Reads, never writes.",
    )
    audit.add_argument("path", type=Path, help="the experiment folder or its privacy_report.json.")
    audit.add_argument("--json", action="store_true", help="print the audit section as JSON.")
    audit.add_argument(
        "--plot", type=Path, metavar="FILE", help="draw ε_lower against the correct guesses, beside ε_upper."
    )
    audit.set_defaults(handler=_run_audit, subparser=audit)


def _run_audit(args: argparse.Namespace) -> int:
    """``ray-dptune audit FOLDER``: ε_lower beside ε_upper, from the report."""
    parser: argparse.ArgumentParser = args.subparser
    path = args.path / REPORT_FILE if args.path.is_dir() else args.path
    try:
        if args.plot is not None:
            cli_format.check_plot_path(args.plot)
        report = PrivacyReport.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        parser.exit(1, f"{parser.prog}: error: no {REPORT_FILE} at {path}: the search has not ended.\n")
    except (PrivacyError, ValueError, MissingExtraError) as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    section = report.audit
    if section is None:
        parser.exit(1, f"{parser.prog}: error: the search in {path} ran without an audit (private_tuner(audit=...)).\n")
    if "epsilon_lower" not in section:
        parser.exit(1, f"{parser.prog}: error: no trial is released yet: run release_best on {path.parent} first.\n")
    print(json.dumps(section, indent=2) if args.json else cli_format.format_audit(section))
    if args.plot is not None and section["epsilon_lower"] is not None:
        cli_format.plot_audit(args.plot, section)
    return 0


# ---------------------------------------------------------------------- plan
def _parse_dpsgd(values: Sequence[str]) -> tuple[float, float, int]:
    """Validates ``--dpsgd SAMPLE_RATE SIGMA STEPS``; a ValueError names the bad value."""

    def parse(name: str, check: Callable[[str], Any], text: str) -> Any:
        try:
            return check(text)
        except argparse.ArgumentTypeError as error:
            raise ValueError(f"--dpsgd: {name} {error}") from None

    rate_text, sigma_text, steps_text = values
    return (
        parse("SAMPLE_RATE", sample_rate, rate_text),
        parse("SIGMA", positive_float, sigma_text),
        parse("STEPS", count, steps_text),
    )


def _build_base(args: argparse.Namespace) -> RunMechanism:
    """The base mechanism named by ``--gaussian``, ``--dpsgd`` or ``--zcdp``; ValueError if invalid."""
    if args.exact_profile and args.dpsgd is None:
        raise ValueError(
            "--exact-profile only applies to --dpsgd (--gaussian always uses its exact profile; --zcdp has none)"
        )
    if args.gaussian is not None:
        return RunMechanism.gaussian(noise_multiplier=args.gaussian)
    if args.dpsgd is not None:
        rate, sigma, steps = _parse_dpsgd(args.dpsgd)
        return RunMechanism.dpsgd(
            sample_rate=rate, noise_multiplier=sigma, steps=steps, exact_profile=args.exact_profile
        )
    return RunMechanism.zcdp(rho=args.zcdp)


def _run_plan(args: argparse.Namespace) -> int:
    """``ray-dptune plan``: prints the table (or JSON) and optionally draws the plot."""
    parser: argparse.ArgumentParser = args.subparser
    laws = unique_laws(args.law)
    try:
        if args.plot is not None:
            cli_format.check_plot_path(args.plot)
        base = _build_base(args)
        rows = plan_rows(
            base, laws, args.mean, delta=args.delta, success_p=args.success_p, generic=not args.closed_form
        )
        if args.plot is not None:
            cli_format.plot_epsilon_vs_mean(
                args.plot, base, laws, delta=args.delta, generic=not args.closed_form, means=args.mean
            )
    except (ValueError, MissingExtraError) as error:  # validation messages; --plot without ray_dptune[plot]
        parser.error(str(error))
    except OSError as error:
        parser.exit(1, f"{parser.prog}: error: cannot write {args.plot}: {error}\n")
    settings = {"delta": args.delta, "success_p": args.success_p, "generic": not args.closed_form, "plot": args.plot}
    if args.json:
        print(json.dumps(cli_format.plan_json(base, rows, **settings), indent=2, allow_nan=False))
    else:
        print(cli_format.format_plan(base, rows, **settings))
    return 0


# ---------------------------------------------------------------------- ledger, journal
def _run_ledger(args: argparse.Namespace) -> int:
    """``ray-dptune ledger show|export``: reads the ledger, never writes it."""
    parser: argparse.ArgumentParser = args.subparser
    if not args.path.exists():
        parser.error(f"no ledger at {args.path}")
    try:
        ledger = PrivacyLedger(args.path)
        datasets = [args.dataset] if args.dataset else ledger.datasets()
        totals = {name: ledger.dataset_summary(name, delta=args.delta, curves=args.curves) for name in datasets}
        ledger.close()
    except PrivacyError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    if args.action == "export":
        print(json.dumps({"ledger": str(args.path), "delta": args.delta, "datasets": totals}, indent=2))
    else:
        print(cli_format.format_ledger_table(args.path, totals, delta=args.delta))
    return 0


def _run_journal(args: argparse.Namespace) -> int:
    """``ray-dptune journal PATH``: the account a new driver would rebuild."""
    parser: argparse.ArgumentParser = args.subparser
    try:
        summary = journal_summary(args.path)
    except PrivacyError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    print(json.dumps(summary, indent=2) if args.json else cli_format.format_journal(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    """The ``ray-dptune`` console script on ``argv`` (None: ``sys.argv[1:]``); usage errors exit with 2."""
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
