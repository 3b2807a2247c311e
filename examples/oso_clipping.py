"""OSO-DPSGD in a private Tune search: tune only the initial learning rate, under ONE (ε, δ).

OSO-DPSGD (Galli et al., "Online Sensitivity Optimization in Differentially Private
Learning", Algorithm 1) learns the clipping threshold C_t and the learning rate ρ_t
during training, so the search needs one hyperparameter (ρ_0) instead of two (ρ, C)
and fewer trials; at the same budget for the whole search each trial gets less noise.
The split of each step's noise between the gradient and OSO's clipping directions
(Proposition 1) costs exactly one DP-SGD step at σ, so the plan is plain DP-SGD's.

Run it (a local Ray starts on the spot; ~1-2 minutes on 2 cores):

    .venv/bin/python examples/oso_clipping.py
    .venv/bin/python examples/oso_clipping.py --mean 8 --epochs 20 --concurrency 4   # bigger

See ``benchmarks/results/oso.md`` for how it compares with fixed and quantile clipping.
"""

from __future__ import annotations

import argparse
import math
import tempfile

import ray
from ray import tune

from ray_dptune import Poisson, RandomCountSearcher, private_tuner, release_best
from ray_dptune.training import TrainState, digits_cnn, digits_data, dp_trainable

SPACE = {
    "clipping": "oso",
    "lr": tune.loguniform(10**-2.5, 10**1.5),  # ρ_0, the paper's range
    "max_grad_norm": 0.1,  # C_0, the paper's
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=3.0, help="ε of the whole search (default 3)")
    parser.add_argument("--delta", type=float, default=1e-5, help="δ of the whole search (default 1e-5)")
    parser.add_argument("--mean", type=float, default=4.0, help="E[K], the expected number of trials (default 4)")
    parser.add_argument("--epochs", type=int, default=10, help="epochs per trial (default 10)")
    parser.add_argument("--batch-size", type=int, default=64, help="expected Poisson batch size (default 64)")
    parser.add_argument("--rate", type=float, default=2.5e-3, help="OSO's ρ_c = ρ_r (default: the paper's 2.5e-3)")
    parser.add_argument("--concurrency", type=int, default=2, help="trials at once (default 2)")
    parser.add_argument("--seed", type=int, default=None, help="seed K and the configs (default: secure)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    law = Poisson(args.mean)
    space = {**SPACE, "oso_rho_c": args.rate, "oso_rho_r": args.rate}

    trainable = dp_trainable(digits_cnn, digits_data, batch_size=args.batch_size, epochs=args.epochs)

    ray.init(log_to_driver=False)
    searcher = RandomCountSearcher(law, metric="val_acc", mode="max", seed=args.seed)
    with tempfile.TemporaryDirectory() as scratch:
        # σ is calibrated for the whole search; OSO's noise split costs one DP-SGD step at σ, so the plan is DP-SGD's.
        tuner = private_tuner(
            trainable,
            param_space=space,
            epsilon=args.epsilon,
            delta=args.delta,
            searcher=searcher,
            tune_config=tune.TuneConfig(max_concurrent_trials=args.concurrency),
            run_config=tune.RunConfig(name="dp_oso", storage_path=scratch, verbose=0),
        )
        released = release_best(tuner.fit())
        print()
        print(f"Trials run: K = {searcher.num_trials} (drawn from Poisson({args.mean:g}))")
        if released.score is None:
            print("No trial ran: the release is independent of the data.")
            return 0
        learned = TrainState.load(released.checkpoint_path).clipping_state
        print(
            f"Released trial: ρ_0 = {released.config['lr']:.4g}, C_0 = {released.config['max_grad_norm']:g}; "
            f"after training ρ_T = {math.exp(learned['log_lr']):.4g}, C_T = {math.exp(learned['log_clip']):.4g}; "
            f"val_acc = {released.score:.3f}; σ = {released.config['noise_multiplier']:.3f} (calibrated)"
        )
    print(f"Guarantee for the whole search: (ε = {released.guarantee['epsilon']:.3f}, δ = {args.delta:g})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
