"""``ray-dptune calibrate``: the DP-SGD noise multiplier σ that meets a target (ε, δ) for a whole search.

The whole-search analogue of TF-Privacy's ``compute_dp_sgd_privacy``: from the target,
the law of the number of trials K and one trial's DP-SGD plan, print σ
(:func:`~ray_dptune.accounting.bookkeeping.calibrate.calibrate_noise_multiplier`) and what the search
costs at it (:func:`ray_dptune.cli.planning.calibration`; printing in :mod:`ray_dptune.cli.format`).

Example: ``ray-dptune calibrate --epsilon 3 --delta 1e-5 --mean 8 --sample-rate 0.0445 --steps 198 --retries 1``.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Sequence
from typing import Any

from ray_dptune.cli import format as cli_format
from ray_dptune.cli.args import (
    DEFAULT_MEAN,
    LAW_CHOICES,
    PROG,
    count,
    law_spec,
    non_negative_count,
    open_unit_float,
    positive_float,
    sample_rate,
)
from ray_dptune.cli.planning import LawSpec, TrialSchedule, calibration, subsampled_calibration
from ray_dptune.errors import PrivacyError

__all__ = ["add_parser", "run"]

_RATE_FORM = ("sample_rate", "steps")
_TRAINING_FORM = ("dataset_size", "batch_size", "epochs")


def add_parser(subparsers: Any) -> None:
    """Adds ``calibrate`` to the ``ray-dptune`` subparsers."""
    calibrate = subparsers.add_parser(
        "calibrate",
        help="DP-SGD noise multiplier σ that meets a target (ε, δ) for the whole search, and what the search costs.",
        description=textwrap.fill(
            "Print the smallest noise multiplier σ (to 0.1%) at which a whole hyperparameter search (K ~ LAW "
            "DP-SGD trials, the best released; Papernot & Steinke 2022) meets (ε, δ), with R re-run attempts "
            "(--retries) reserved; the search's ε at σ with no retry used and with all used; one trial's ε alone; "
            "and the σ one run alone would need for the same (ε, δ): the cost of tuning. The whole-search "
            "analogue of TF-Privacy's compute_dp_sgd_privacy.",
            width=78,
        ),
        epilog=(
            "examples:\n"
            f"  {PROG} calibrate --epsilon 3 --delta 1e-5 --mean 8 --dataset-size 1437 --batch-size 64 --epochs 9\n"
            f"  {PROG} calibrate --epsilon 1 --delta 1e-6 --law tnb:0.5 --mean 20 --sample-rate 0.01 --steps 5000\n"
            f"  {PROG} calibrate --epsilon 8 --delta 1e-5 --sample-rate 0.004 --steps 2500 --retries 2 --json\n"
            f"  {PROG} calibrate --epsilon 3 --delta 1e-5 --dataset-size 1437 --batch-size 64 --epochs 9 "
            "--tuning-fraction 0.1"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    target = calibrate.add_argument_group("target: the whole search's (ε, δ)")
    target.add_argument("--epsilon", type=positive_float, required=True, help="ε of the whole search.")
    target.add_argument("--delta", type=open_unit_float, required=True, help="δ of the whole search, in (0, 1).")

    search = calibrate.add_argument_group("search")
    search.add_argument(
        "--law",
        type=law_spec,
        default=LawSpec.parse("poisson"),
        metavar="LAW",
        help=f"law of the number of runs K: {LAW_CHOICES}. Default: poisson.",
    )
    search.add_argument(
        "--mean",
        type=positive_float,
        default=DEFAULT_MEAN,
        metavar="MEAN",
        help=f"expected number of trials E[K] (default: {DEFAULT_MEAN:g}); must be > 1 for logarithmic, geometric "
        "and tnb, whose exact mean is the largest not above MEAN.",
    )
    search.add_argument(
        "--tuning-fraction",
        type=open_unit_float,
        metavar="P",
        help="tune on a secret Poisson sample of this share of the data, then train the best configuration once on "
        "all of it (private_tuner(tuning_fraction=P)): print the tuning's σ_T and the final run's σ_B. Needs "
        "--dataset-size, --batch-size and --epochs.",
    )
    search.add_argument(
        "--final-noise-overhead",
        type=positive_float,
        default=0.1,
        metavar="F",
        help="with --tuning-fraction: σ_B is (1 + F) times one untuned run's σ (default: 0.1).",
    )
    search.add_argument(
        "--retries",
        type=non_negative_count,
        default=0,
        metavar="R",
        help="re-runs to reserve headroom for (of trials interrupted by Ctrl-C, a dead driver or a preempted "
        "node, on Tuner.restore), each composed at the trial's plan (default: 0). A random-count search allows "
        "no retry of a failed trial: a failed trial is one of its runs.",
    )

    trial = calibrate.add_argument_group(
        "one trial's DP-SGD plan: --sample-rate and --steps, or --dataset-size, --batch-size and --epochs"
    )
    trial.add_argument("--sample-rate", type=sample_rate, metavar="Q", help="Poisson sampling rate q in (0, 1].")
    trial.add_argument("--steps", type=count, metavar="T", help="DP-SGD steps of one trial.")
    trial.add_argument("--dataset-size", type=count, metavar="N", help="training examples.")
    trial.add_argument(
        "--batch-size",
        type=count,
        metavar="B",
        help="expected batch size: q = B/N and int(N/B) steps an epoch, as dp_trainable runs Opacus.",
    )
    trial.add_argument("--epochs", type=count, metavar="E", help="passes over the training set.")

    output = calibrate.add_argument_group("output")
    output.add_argument("--json", action="store_true", help="print machine-readable JSON instead of the table.")
    calibrate.set_defaults(handler=run, subparser=calibrate)


def _options(names: Sequence[str]) -> str:
    """``--a``, ``--a and --b``, ``--a, --b and --c``."""
    options = ["--" + name.replace("_", "-") for name in names]
    return " and ".join([", ".join(options[:-1]), options[-1]] if len(options) > 1 else options)


def _build_schedule(args: argparse.Namespace) -> TrialSchedule:
    """The trial's schedule from exactly one complete form of the plan options; ValueError otherwise."""
    forms = [form for form in (_RATE_FORM, _TRAINING_FORM) if any(getattr(args, name) is not None for name in form)]
    if not forms:
        raise ValueError(f"give one trial's DP-SGD plan: {_options(_RATE_FORM)}, or {_options(_TRAINING_FORM)}")
    if len(forms) > 1:
        raise ValueError(
            f"give the trial's plan either as {_options(_RATE_FORM)} or as {_options(_TRAINING_FORM)}, not both"
        )
    form = forms[0]
    missing = [name for name in form if getattr(args, name) is None]
    if missing:
        raise ValueError(f"{_options(form)} go together: missing {_options(missing)}")
    if form == _RATE_FORM:
        return TrialSchedule(sample_rate=args.sample_rate, steps=args.steps)
    return TrialSchedule.from_training(dataset_size=args.dataset_size, batch_size=args.batch_size, epochs=args.epochs)


def run(args: argparse.Namespace) -> int:
    """``ray-dptune calibrate``: σ for the whole search's (ε, δ), and what the search costs at it."""
    parser: argparse.ArgumentParser = args.subparser
    try:
        schedule = _build_schedule(args)
        law = args.law.build(args.mean)
        if args.tuning_fraction is not None:
            result = subsampled_calibration(
                schedule,
                law,
                epsilon=args.epsilon,
                delta=args.delta,
                tuning_fraction=args.tuning_fraction,
                final_noise_overhead=args.final_noise_overhead,
                retries=args.retries,
            )
        else:
            result = calibration(schedule, law, epsilon=args.epsilon, delta=args.delta, retries=args.retries)
    except ValueError as error:
        parser.error(str(error))
    except PrivacyError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    result = {**result, "law": {"name": args.law.name, **result["law"]}}
    if args.json:
        print(json.dumps(result, indent=2, allow_nan=False))
    elif args.tuning_fraction is not None:
        print(cli_format.format_subsampled_calibration(result))
    else:
        print(cli_format.format_calibration(result, schedule=schedule))
    return 0
