"""Bring your own Opacus loop: a plain PrivacyEngine training function in a private Tune search.

The training function below is what an Opacus user already has (model, data, loss,
optimizer, ``PrivacyEngine.make_private``) on scikit-learn's breast-cancer data. Four
lines make it accountable (marked ``# ray_dptune``): the import, the loader from
``tuning_loader`` (your ``DataLoader``, or a subsampled search's tuning sample),
``OpacusSpend`` built from the engine, and its ``report()`` merged into every
``tune.report``. The steps, noise and sample rate it reports are read from Opacus's own
accountant history.

Run it (a local Ray starts on the spot; ~1 minute on 2 cores):

    .venv/bin/python examples/byo_opacus_loop.py                    # tune.Tuner via private_tuner
    .venv/bin/python examples/byo_opacus_loop.py --legacy-tune-run  # tune.run + ConcurrencyLimiter
    .venv/bin/python examples/byo_opacus_loop.py --tuning-fraction 0.3  # tune on a sample, train once
"""

from __future__ import annotations

import argparse
import tempfile

import ray
import torch
from opacus import PrivacyEngine
from ray import tune
from ray.tune.search import ConcurrencyLimiter
from torch import nn
from torch.utils.data import TensorDataset

from ray_dptune import (
    Poisson,
    PrivacyAccountantCallback,
    RandomCountSearcher,
    calibrate_noise_multiplier,
    private_tuner,
    release_best,
)
from ray_dptune.training import OpacusSpend, opacus_plan, tuning_loader  # ray_dptune

BATCH_SIZE, EPOCHS = 32, 5
SPACE = {"lr": tune.loguniform(0.01, 1.0), "max_grad_norm": tune.loguniform(0.1, 10.0)}


def breast_cancer() -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's breast-cancer data (569 × 30), standardised on the training split."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    x, y = load_breast_cancer(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)

    def tensors(inputs, labels):
        return TensorDataset(torch.tensor((inputs - mean) / std, dtype=torch.float32), torch.tensor(labels))

    return tensors(x_train, y_train), tensors(x_val, y_val)


TRAIN_SIZE = 455  # len(breast_cancer()[0]): the driver plans without loading the data


# --8<-- [start:loop]
def train_breast_cancer(config: dict) -> None:
    """A plain Opacus loop; σ comes from the config (calibrated by the driver)."""
    torch.manual_seed(0)
    train, val = breast_cancer()
    model = nn.Sequential(nn.Linear(30, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=optimizer,
        data_loader=tuning_loader(train, config, batch_size=BATCH_SIZE),  # ray_dptune
        noise_multiplier=config["noise_multiplier"],
        max_grad_norm=config["max_grad_norm"],
    )
    spend = OpacusSpend(engine, optimizer, loader, steps=EPOCHS * len(loader), config=config)  # ray_dptune
    for _ in range(EPOCHS):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            accuracy = (model(val.tensors[0]).argmax(dim=1) == val.tensors[1]).float().mean().item()
        tune.report({"val_acc": accuracy, **spend.report()})  # ray_dptune


# --8<-- [end:loop]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=2.0, help="ε of the whole search (default 2)")
    parser.add_argument("--delta", type=float, default=1e-5, help="δ of the whole search (default 1e-5)")
    parser.add_argument("--mean", type=float, default=4.0, help="E[K], the expected number of trials (default 4)")
    parser.add_argument("--seed", type=int, default=None, help="seed K and the configs (default: secure)")
    parser.add_argument("--legacy-tune-run", action="store_true", help="use tune.run + ConcurrencyLimiter")
    parser.add_argument(
        "--tuning-fraction", type=float, default=None, help="tune on a Poisson sample of this share, then train once"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan_for = opacus_plan(dataset_size=TRAIN_SIZE, batch_size=BATCH_SIZE, epochs=EPOCHS)
    searcher = RandomCountSearcher(Poisson(args.mean), metric="val_acc", mode="max", seed=args.seed)
    ray.init(log_to_driver=False)
    with tempfile.TemporaryDirectory() as scratch:
        if args.legacy_tune_run:  # the low-level path: calibrate, then the accountant and a FIFO tune.run
            sigma = calibrate_noise_multiplier(
                plan_for, epsilon=args.epsilon, delta=args.delta, law=searcher.distribution
            )
            accountant = PrivacyAccountantCallback(
                searcher, delta=args.delta, plan=plan_for(sigma), target_epsilon=args.epsilon
            )
            results = tune.run(
                train_breast_cancer,
                config={**SPACE, "noise_multiplier": sigma},
                search_alg=ConcurrencyLimiter(searcher, max_concurrent=2),
                num_samples=-1,
                callbacks=[accountant],
                storage_path=scratch,
                name="byo_opacus",
                verbose=0,
            )
        elif args.tuning_fraction is not None:  # the tuning trials train on a sample; the final one is released
            tuner = private_tuner(
                train_breast_cancer,
                param_space=SPACE,
                epsilon=args.epsilon,
                delta=args.delta,
                law=searcher.distribution,
                metric="val_acc",
                mode="max",
                plan_for=plan_for,
                tuning_fraction=args.tuning_fraction,
                tune_config=tune.TuneConfig(max_concurrent_trials=2),
                run_config=tune.RunConfig(name="byo_opacus", storage_path=scratch, verbose=0),
            )
            results = tuner.fit()
        else:
            tuner = private_tuner(
                train_breast_cancer,
                param_space=SPACE,
                epsilon=args.epsilon,
                delta=args.delta,
                searcher=searcher,
                plan_for=plan_for,
                tune_config=tune.TuneConfig(max_concurrent_trials=2),
                run_config=tune.RunConfig(name="byo_opacus", storage_path=scratch, verbose=0),
            )
            results = tuner.fit()
        released = release_best(results)
        print(f"\nTrials run: {len(results)}; released val_acc = {released.score}")
        print(f"Guarantee for the whole search: (ε = {released.guarantee['epsilon']:.3f}, δ = {args.delta:g})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
