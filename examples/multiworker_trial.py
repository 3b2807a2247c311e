"""Trials that span several workers: each trial is a Ray Train ``TorchTrainer`` running distributed DP-SGD.

Every worker runs the same Opacus loop on a ``DPDDP``-wrapped model: Opacus samples each worker's share of one *global* Poisson
batch (rate q = 1/⌈n/B⌉ over the whole training set) and adds the noise once per global
step. The trial is therefore accounted exactly as a single process with the global batch:
``OpacusSpend`` on rank 0 reads q, σ and the steps from Opacus's accountant, and Ray Train
forwards rank 0's report to Tune (``TuneReportCallback``), once per epoch.

Run it (a local Ray starts on the spot; gloo on CPU, ~2 minutes on 2 cores):

    .venv/bin/python examples/multiworker_trial.py
    .venv/bin/python examples/multiworker_trial.py --workers 4 --use-gpu   # NCCL, one GPU a worker
"""

from __future__ import annotations

import argparse
import tempfile

import ray
import torch
from opacus import PrivacyEngine
from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP
from ray import train, tune
from ray.train.torch import TorchTrainer
from ray.tune.integration.ray_train import TuneReportCallback
from torch import nn
from torch.utils.data import DataLoader

from ray_dptune import Poisson, RandomCountSearcher, private_tuner, release_best
from ray_dptune.training import OpacusSpend, digits_data, opacus_plan

BATCH_SIZE, EPOCHS, TRAIN_SIZE = 64, 3, 1437  # B is the GLOBAL expected batch; 1 437 digits to train on
SPACE = {"lr": tune.loguniform(0.05, 2.0), "max_grad_norm": tune.loguniform(0.3, 3.0)}


def train_worker(config: dict) -> None:
    """One worker's share of distributed DP-SGD; every worker reports, Tune keeps rank 0's."""
    torch.manual_seed(0)  # the same initial model on every worker
    train_set, val_set = digits_data()
    device = train.torch.get_device()
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)).to(device)
    model = DPDDP(model)  # Opacus's DDP: per-sample clipping on each worker, one noise draw per global step
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=config["lr"]),
        data_loader=DataLoader(train_set, batch_size=BATCH_SIZE),  # the whole set: Opacus shards each batch
        noise_multiplier=config["noise_multiplier"],
        max_grad_norm=config["max_grad_norm"],
    )
    spend = OpacusSpend(engine, optimizer, loader, steps=EPOCHS * len(loader), config=config)
    for _ in range(EPOCHS):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            inputs, labels = val_set.tensors
            accuracy = (model(inputs.to(device)).argmax(dim=1).cpu() == labels).float().mean().item()
        train.report({"val_acc": accuracy, **spend.report()})


def multiworker_trial(workers: int, *, cpus_per_worker: float = 1.0, use_gpu: bool = False):
    """A Tune function trainable whose trial is a ``TorchTrainer`` of ``workers`` workers."""

    def run_trial(config: dict) -> None:
        trainer = TorchTrainer(
            train_worker,
            train_loop_config=config,
            scaling_config=train.ScalingConfig(
                num_workers=workers, use_gpu=use_gpu, resources_per_worker={"CPU": cpus_per_worker}
            ),
            run_config=train.RunConfig(
                name=f"trial_{tune.get_context().get_trial_id()}",
                storage_path=tune.get_context().get_trial_dir(),
                callbacks=[TuneReportCallback()],
            ),
        )
        trainer.fit()

    return run_trial


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=3.0, help="ε of the whole search (default 3)")
    parser.add_argument("--delta", type=float, default=1e-5, help="δ of the whole search (default 1e-5)")
    parser.add_argument("--mean", type=float, default=2.0, help="E[K], the expected number of trials (default 2)")
    parser.add_argument("--workers", type=int, default=2, help="workers per trial (default 2)")
    parser.add_argument("--cpus-per-worker", type=float, default=0.5, help="CPUs each worker reserves (default 0.5)")
    parser.add_argument("--use-gpu", action="store_true", help="one GPU per worker (NCCL)")
    parser.add_argument("--seed", type=int, default=None, help="seed K and the configs (default: secure)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ray.init(log_to_driver=False)
    searcher = RandomCountSearcher(Poisson(args.mean), metric="val_acc", mode="max", seed=args.seed)
    with tempfile.TemporaryDirectory() as scratch:
        tuner = private_tuner(
            # the trial's own process only waits for its workers: a sliver of a CPU
            tune.with_resources(
                multiworker_trial(args.workers, cpus_per_worker=args.cpus_per_worker, use_gpu=args.use_gpu),
                {"cpu": 0.01},
            ),
            param_space=SPACE,
            epsilon=args.epsilon,
            delta=args.delta,
            searcher=searcher,
            plan_for=opacus_plan(dataset_size=TRAIN_SIZE, batch_size=BATCH_SIZE, epochs=EPOCHS),
            tune_config=tune.TuneConfig(max_concurrent_trials=1),
            run_config=tune.RunConfig(name="multiworker", storage_path=scratch, verbose=0),
        )
        released = release_best(tuner.fit())
        print(f"\n{searcher.num_trials} trials of {args.workers} workers each; released: {released}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
