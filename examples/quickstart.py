"""Quickstart: tune a DP-SGD model's learning rate and clipping norm under ONE (ε, δ).

A small CNN learns scikit-learn's digits (8×8 images) with DP-SGD (Opacus). The
whole search, not only the final model, is (ε, δ)-DP: the noise multiplier is
calibrated so that a random number K ~ Poisson(mean) of trials, of which only the
best is released, meets the budget (Papernot & Steinke 2022).

Run it (a local Ray starts on the spot; ~1–3 minutes on 2 cores):

    .venv/bin/python examples/quickstart.py
    .venv/bin/python examples/quickstart.py --epsilon 8 --mean 16 --concurrency 4   # bigger
    .venv/bin/python examples/quickstart.py --storage-path ./ray_results --name my_search
    .venv/bin/python examples/quickstart.py --audit 500   # + a one-run audit: ε_lower beside ε

Like any Tune run, the experiment stays in ``~/ray_results/<name>`` (or ``--storage-path``),
under a new timestamped name each run: the trials, their checkpoints and
``privacy_report.json``, the receipt of what the search spent.

Swap in your own ``model_fn`` / ``data_fn`` (config -> (train, validation) datasets).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import ray
from ray import tune

from ray_dptune import (
    PointMass,
    Poisson,
    PrivacyError,
    RandomCountSearcher,
    private_tuner,
    release_best,
    repeat_and_select,
)
from ray_dptune.records.report import REPORT_FILE
from ray_dptune.records.statement import STATEMENT_FILE
from ray_dptune.training import CanaryAudit, digits_cnn, digits_data, dp_trainable

SPACE = {"lr": tune.loguniform(0.05, 4.0), "max_grad_norm": tune.loguniform(0.1, 10.0)}
NAME_FORMAT = "dp_quickstart_%Y-%m-%d_%H-%M-%S"  # the experiment folder's default name: Tune's timestamp style


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=3.0, help="ε of the whole search (default 3)")
    parser.add_argument("--delta", type=float, default=1e-5, help="δ of the whole search (default 1e-5)")
    parser.add_argument("--mean", type=float, default=8.0, help="E[K], the expected number of trials (default 8)")
    parser.add_argument("--epochs", type=int, default=15, help="epochs per trial (default 15)")
    parser.add_argument("--batch-size", type=int, default=64, help="expected Poisson batch size (default 64)")
    parser.add_argument("--concurrency", type=int, default=2, help="trials at once (default 2)")
    parser.add_argument(
        "--gpus-per-trial", type=float, default=0.0, help="GPUs each trial reserves, e.g. 1 or 0.25 (default 0: CPU)"
    )
    parser.add_argument(
        "--storage-path",
        "--storage",
        dest="storage",
        metavar="PATH",
        default=None,
        help="folder the experiment folder goes in, Tune's RunConfig(storage_path=) (default: Tune's, ~/ray_results)",
    )
    parser.add_argument(
        "--name",
        default=None,
        help="experiment folder's name (default: dp_quickstart_<date>_<time>, new each run; a name already used is "
        "refused, never overwritten)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=0,
        help="re-runs the budget reserves (a resumed search's interrupted trials), each at the plan: σ grows with it, "
        "and the stated ε includes them from the start (default 0; a failed trial is never retried)",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed K and the configs (default: secure)")
    parser.add_argument(
        "--resume",
        metavar="FOLDER",
        default=None,
        help="finish an interrupted search: tune.Tuner.restore(FOLDER, ...) with the trainable these flags build "
        "(give the same --epochs, --batch-size and --audit as its first run)",
    )
    parser.add_argument(
        "--audit",
        type=int,
        default=0,
        metavar="M",
        help="audit the search in this one run with M canaries (e.g. 500): ε_lower beside the proven ε (default 0: off)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # 1. The model, the data and DP-SGD's settings; no noise multiplier: it is calibrated for the budget.
    trainable = dp_trainable(digits_cnn, digits_data, batch_size=args.batch_size, epochs=args.epochs)
    if args.gpus_per_trial:
        trainable = tune.with_resources(trainable, {"cpu": 1, "gpu": args.gpus_per_trial})

    if args.resume:
        return resume(args, trainable)

    # 2. The budget of the WHOLE search in, a calibrated tune.Tuner out. The experiment folder is Tune's:
    #    <storage path>/<name>, kept after the run (results, checkpoints, privacy_report.json).
    name = args.name or time.strftime(NAME_FORMAT)  # a new folder each run, as Tune names its own
    storage = os.path.abspath(os.path.expanduser(args.storage)) if args.storage else None  # None: ~/ray_results
    run_config = tune.RunConfig(name=name, storage_path=storage, verbose=0)
    experiment = os.path.join(run_config.storage_path, name)
    if os.path.isdir(experiment) and os.listdir(experiment):  # before Tune writes a second run's state into it
        raise SystemExit(
            f"{experiment} already holds a search: give this one another --name, or finish that one with "
            f"{resume_command(experiment, args)}"
        )
    print(f"Experiment folder (kept): {experiment}", flush=True)
    ray.init(log_to_driver=False)  # keep the trials' own logs in the experiment folder
    searcher = RandomCountSearcher(Poisson(args.mean), metric="val_acc", mode="max", seed=args.seed)
    audit = CanaryAudit(canaries=args.audit, num_classes=10) if args.audit else None
    tuner = private_tuner(
        trainable,
        param_space=SPACE,
        epsilon=args.epsilon,
        delta=args.delta,
        searcher=searcher,  # or law=Poisson(mean=8), metric="val_acc", mode="max"
        tune_config=tune.TuneConfig(max_concurrent_trials=args.concurrency),
        run_config=run_config,
        retries=args.retries,  # headroom for re-runs of interrupted trials; one beyond it is refused
        audit=audit,  # None, or canaries in every trial's training set: ε_lower beside ε in the report
    )
    results = tuner.fit()
    planned = trainable if audit is None else trainable.with_audit(audit)  # the canaries enlarge the data
    return release_and_summarise(results, planned, args)


def release_and_summarise(results, trainable, args: argparse.Namespace) -> int:
    """3. Release only the best trial, with the guarantee of the whole search; then the next steps."""
    try:
        released = release_best(results)
    except PrivacyError as refusal:  # e.g. an interrupted search is incomplete: nothing may be released yet
        print(f"\nNothing released: {refusal}")
        print_next_steps(results.experiment_path, args, released=False)
        return 1
    with open(os.path.join(results.experiment_path, REPORT_FILE)) as file:
        num_trials = json.load(file)["num_trials_planned"]
    print_summary(released, results, trainable, num_trials, args)
    print_next_steps(results.experiment_path, args, released=True)
    return 0


def resume(args: argparse.Namespace, trainable) -> int:
    """Finishes the interrupted search in ``args.resume``: Tune's restore, the account rebuilt from its journal."""
    experiment = os.path.abspath(os.path.expanduser(args.resume))
    if args.audit:  # the same canaries as the first run, from the journal's commitment
        trainable = trainable.with_audit(CanaryAudit.from_journal(experiment))
    ray.init(log_to_driver=False)
    results = tune.Tuner.restore(experiment, trainable, resume_unfinished=True).fit()
    return release_and_summarise(results, trainable, args)


def resume_command(experiment: str, args: argparse.Namespace) -> str:
    """The command that finishes the search in ``experiment``: this script, the flags that build its trainable."""
    flags = f"--resume {experiment} --epochs {args.epochs} --batch-size {args.batch_size}"
    if args.audit:
        flags += f" --audit {args.audit}"
    if args.gpus_per_trial:
        flags += f" --gpus-per-trial {args.gpus_per_trial:g}"
    return f"{sys.executable} {os.path.abspath(__file__)} {flags}"


def print_summary(released, results, trainable, num_trials: int, args: argparse.Namespace) -> None:
    """The released trial and its guarantee, beside what non-private tuning would claim."""
    print()
    print(f"Trials run: K = {num_trials} (drawn from Poisson({args.mean:g}), never redrawn; yours, not to publish)")
    if released.score is None:
        print("No trial ran: the release is independent of the data.")
        return
    sigma = results[0].config["noise_multiplier"]
    plan = trainable.privacy_plan({**SPACE, "noise_multiplier": sigma})
    one_trial = plan.curve().epsilon(delta=args.delta)
    composed = repeat_and_select(plan.curve(), PointMass(num_trials)).epsilon(delta=args.delta)
    print(f"DP-SGD: q = {plan.sample_rate:.4f}, {plan.steps} steps, σ = {sigma:.3f} (calibrated by private_tuner)")
    print(
        f"Released trial: lr = {released.config['lr']:.4g}, max_grad_norm = {released.config['max_grad_norm']:.4g}, "
        f"val_acc = {released.score:.3f}"
    )
    print(f"Guarantee for the whole search: (ε = {released.statement['guarantee']['epsilon']:.3f}, δ = {args.delta:g})")
    print()
    print("What non-private tuning of the same trials would claim or spend:")
    print(
        f"  reporting the final model's ε only:       ε = {one_trial:.3f}   (ignores the tuning: under-states the leak)"
    )
    print(f"  composing all K = {num_trials} trials (releasing all): ε = {composed:.3f}")
    print(f"  random-count selection (this search):     ε = {released.guarantee['epsilon']:.3f}")
    if args.audit:
        with open(os.path.join(results.experiment_path, REPORT_FILE)) as file:
            audit = json.load(file)["audit"]
        if audit["epsilon_lower"] is not None:
            print(
                f"One-run audit ({audit['canaries']} canaries, {audit['correct']} of {audit['guesses']} guesses right): "
                f"ε_lower = {audit['epsilon_lower']:.3f} at {audit['confidence']:.0%} confidence, "
                f"beside the proven ε = {audit['epsilon_upper']:.3f}"
            )


def print_next_steps(experiment: str, args: argparse.Namespace, *, released: bool) -> None:
    """Where the receipt is, and what to do with the experiment folder next (a few lines)."""
    report = os.path.join(experiment, REPORT_FILE)
    print()
    if not os.path.exists(report):
        print(f"No privacy report: no trial ran, so nothing touched the data. Experiment folder: {experiment}")
        return
    cli, beside_python = "ray-dptune", os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "ray-dptune")
    if not shutil.which(cli) and os.path.exists(beside_python):  # e.g. .venv/bin, not on PATH: pastes from any folder
        cli = beside_python
    if released:
        print(f"May be published: the released model and {os.path.join(experiment, STATEMENT_FILE)}")
        print("  (its configuration and score, (ε, δ) and the search's definition: no K, no other trial).")
    print("Stays with you: the privacy report, the journal and Tune's files (K, every trial and score).")
    print(f"Privacy report: {report}")
    print(f"  {cli} journal {experiment}   # what the journal proves the search spent")
    if released and args.audit:
        print(f"  {cli} audit {experiment}     # ε_lower beside the proven ε")
    if not released:
        with open(report) as file:
            reserved = json.load(file)["guarantee"].get("reserved_reruns", 0)
        print(f"  interrupted? {resume_command(experiment, args)}")
        print(f"    (tune.Tuner.restore: re-runs unfinished trials, each charged its plan; {reserved} reserved)")
    if released:
        purge = f"from ray_dptune import release_best; release_best({experiment!r}, purge=True)"
        print(f'  {sys.executable} -c "{purge}"   # deletes the unreleased trials\' results')


if __name__ == "__main__":
    raise SystemExit(main())
