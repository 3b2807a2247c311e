"""Private early stopping: ASHA-style successive halving under ONE (ε, δ) for the whole search.

A small CNN learns scikit-learn's digits with DP-SGD (Opacus). ``PrivateASHAScheduler``
trains every trial for ``--grace`` epochs, goes on with about 1 in η at each milestone
(ASHA's rule, on the reported validation accuracy), and charges each segment to the
search's durable account before it runs; it never spends more than ``--budget-trials``
whole trials' epochs. The whole search then costs what ONE DP-SGD run of that many
epochs costs (adaptive composition of every segment, stopped trials included), and the
noise multiplier is calibrated for it before any trial starts.

Run it (a local Ray starts on the spot; ~2–4 minutes on 2 cores):

    .venv/bin/python examples/private_asha.py
    .venv/bin/python examples/private_asha.py --epsilon 8 --budget-trials 8 --epochs 27 --concurrency 4
"""

from __future__ import annotations

import argparse
import tempfile

import ray
from ray import tune

from ray_dptune import Poisson, PrivateASHAScheduler, private_tuner, release_best
from ray_dptune.training import digits_cnn, digits_data, dp_trainable

SPACE = {"lr": tune.loguniform(0.05, 4.0), "max_grad_norm": tune.loguniform(0.1, 10.0)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=3.0, help="ε of the whole search (default 3)")
    parser.add_argument("--delta", type=float, default=1e-5, help="δ of the whole search (default 1e-5)")
    parser.add_argument("--epochs", type=int, default=9, help="epochs of a whole trial, max_t (default 9)")
    parser.add_argument("--grace", type=int, default=1, help="epochs every trial runs first (default 1)")
    parser.add_argument("--reduction-factor", type=float, default=3.0, help="η (default 3)")
    parser.add_argument("--budget-trials", type=float, default=3.0, help="budget in whole trials (default 3)")
    parser.add_argument(
        "--brackets-mean",
        type=float,
        default=None,
        help="run K ~ Poisson(mean) independent brackets of --budget-trials each, release the best winner "
        "(default: one bracket, every score covered)",
    )
    parser.add_argument("--concurrency", type=int, default=2, help="trials at once (default 2)")
    parser.add_argument("--storage", default=None, help="experiment folder (default: a temporary one)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the configurations (default: secure)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    trainable = dp_trainable(digits_cnn, digits_data, batch_size=64, epochs=args.epochs)
    asha = PrivateASHAScheduler(
        max_t=args.epochs,  # time_attr = training_iteration: one report, one epoch
        grace_period=args.grace,
        reduction_factor=args.reduction_factor,
        budget_trials=args.budget_trials,
        repetitions=None if args.brackets_mean is None else Poisson(args.brackets_mean),
        metric="val_acc",
        mode="max",
        seed=args.seed,
    )
    ray.init(log_to_driver=False)
    with tempfile.TemporaryDirectory() as scratch:
        tuner = private_tuner(
            trainable,
            param_space=SPACE,
            epsilon=args.epsilon,
            delta=args.delta,
            searcher=asha.searcher,  # brings its scheduler into the TuneConfig
            tune_config=tune.TuneConfig(max_concurrent_trials=args.concurrency),
            run_config=tune.RunConfig(name="dp_asha", storage_path=args.storage or scratch, verbose=0),
        )
        results = tuner.fit()
        released = release_best(results)
    epochs = [result.metrics.get("training_iteration", 0) for result in results]
    print()
    brackets = asha.searcher.num_brackets
    print(
        f"Trials: {len(epochs)}; epochs each: {sorted(epochs, reverse=True)}; in all {sum(epochs)} "
        f"of a budget of {int(brackets * args.budget_trials * args.epochs)} ({brackets} bracket(s))"
    )
    print(f"Released: {released}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
