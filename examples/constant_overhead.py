"""Constant-overhead DP tuning (Ding et al.): a grid of DP-SGD settings, one (ε, δ) for the whole search.

A small CNN learns scikit-learn's digits. Every candidate of a finite grid (learning
rate × clipping norm) first trains on each of k disjoint parts of the training set;
by default these partition trials train without DP: their models are never released,
and their validation accuracies reach the output only through sparse-vector rounds
(Ding et al., Algorithm 1), each ε_round-DP with sensitivity 1/k. Those rounds pick
one candidate, which is then trained with DP-SGD on the whole training set and
released. The privacy cost of the selection, T_max · ε_round composed in RDP, does
not grow with the number of candidates; the DP-SGD noise is calibrated so that the
whole search meets ``--epsilon``.

Run it (a local Ray starts on the spot; ~2–3 minutes on 2 cores):

    .venv/bin/python examples/constant_overhead.py
    .venv/bin/python examples/constant_overhead.py --partitions 8 --epsilon-round 0.5 --concurrency 4

Caveats. The rounds are noisy unless k·ε_round is large (the paper suggests
k ≥ 5/ε_round); digits (1 437 training images) cannot support many parts, so here the
selection is close to a noisy guess: the example shows the mechanism and its
accounting, not a tuned model. Non-private parts train with plain SGD, which ignores
the clipping norm: pass ``--private-partitions`` to rank clipping norms too.
"""

from __future__ import annotations

import argparse
import tempfile

import ray
from ray import tune

from ray_dptune import private_tuner, release_best
from ray_dptune.accounting.bounds.svt import svt_curve
from ray_dptune.search.constant_overhead import ConstantOverheadSearcher
from ray_dptune.training import digits_cnn, digits_data, dp_trainable

CANDIDATES = {"lr": tune.grid_search([0.25, 1.0, 4.0]), "max_grad_norm": tune.grid_search([0.5, 2.0])}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=8.0, help="ε of the whole search (default 8)")
    parser.add_argument("--delta", type=float, default=1e-5, help="δ of the whole search (default 1e-5)")
    parser.add_argument("--partitions", type=int, default=4, help="k, disjoint training parts (default 4)")
    parser.add_argument("--epsilon-round", type=float, default=0.25, help="ε of each SVT round (default 0.25)")
    parser.add_argument("--granularity", type=float, default=0.1, help="g, the utility grid (default 0.1)")
    parser.add_argument("--epochs", type=int, default=15, help="epochs per trial (default 15)")
    parser.add_argument("--batch-size", type=int, default=64, help="expected Poisson batch size (default 64)")
    parser.add_argument("--private-partitions", action="store_true", help="train the parts with DP-SGD too")
    parser.add_argument("--concurrency", type=int, default=2, help="trials at once (default 2)")
    parser.add_argument("--storage", default=None, help="experiment folder (default: a temporary one)")
    parser.add_argument("--seed", type=int, default=None, help="seed the SVT noise (default: secure)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    searcher = ConstantOverheadSearcher(
        CANDIDATES,
        partitions=args.partitions,
        epsilon_round=args.epsilon_round,
        granularity=args.granularity,
        private_partitions=args.private_partitions,
        metric="val_acc",
        seed=args.seed,
    )
    rounds = svt_curve(epsilon=args.epsilon_round, rounds=searcher.max_rounds)
    k_eps = args.partitions * args.epsilon_round
    print(
        f"{len(searcher.candidates)} candidates × {args.partitions} parts = {searcher.num_trials - 1} partition "
        f"trials ({'DP-SGD' if args.private_partitions else 'non-private'}), then 1 DP-SGD trial.\n"
        f"SVT: at most T_max = {searcher.max_rounds} rounds of ε = {args.epsilon_round} (k·ε = {k_eps:g}; "
        f"threshold noise Lap({searcher.params.threshold_scale:.3g}), query noise "
        f"Lap({searcher.params.query_scale:.3g}) on accuracies in [0, 1])."
    )
    # 1. The final trial's DP-SGD noise is whatever the SVT rounds leave of the budget: private_tuner
    #    calibrates it on the searcher's own mechanism.
    trainable = dp_trainable(digits_cnn, digits_data, batch_size=args.batch_size, epochs=args.epochs)
    # 2. The search: partition trials, the rounds in the driver, the final trial.
    ray.init(log_to_driver=False)
    with tempfile.TemporaryDirectory() as scratch:
        tuner = private_tuner(
            trainable,
            param_space={},  # the candidates belong to the searcher
            epsilon=args.epsilon,
            delta=args.delta,
            searcher=searcher,
            tune_config=tune.TuneConfig(max_concurrent_trials=args.concurrency, reuse_actors=True),
            run_config=tune.RunConfig(
                name="dp_constant_overhead",
                storage_path=args.storage or scratch,
                failure_config=tune.FailureConfig(max_failures=2),  # Tune retries; the accountant composes
                verbose=0,
            ),
        )
        results = tuner.fit()
        released = release_best(results)  # the final trial, named by the searcher

    # 3. What was released and what it cost.
    details = searcher.privacy_details()
    sigma = released.config["noise_multiplier"]
    plan = trainable.privacy_plan({**released.config, "noise_multiplier": sigma})
    print(f"Final DP-SGD: q = {plan.sample_rate:.4f}, {plan.steps} steps, σ = {sigma:.3f} (calibrated).")
    print()
    print(
        f"SVT rounds used: {details['rounds_used']} of {details['max_rounds']}"
        f"{' (cap reached)' if details['cap_hit'] else ''}; "
        + (
            f"selected candidate {details['selected_index']}"
            if not details["fallback_used"]
            else f"no candidate passed: fallback candidate {details['selected_index']}"
        )
    )
    print(
        f"Released trial: lr = {released.config['lr']:g}, max_grad_norm = {released.config['max_grad_norm']:g}, "
        f"val_acc = {released.score:.3f}"
    )
    print(f"Guarantee for the whole search: (ε = {released.guarantee['epsilon']:.3f}, δ = {args.delta:g})")
    print(
        f"  of which SVT rounds alone: ε = {rounds.epsilon(delta=args.delta):.3f}; "
        f"final DP-SGD alone: ε = {plan.curve().epsilon(delta=args.delta):.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
