"""config["dp_partition"]: disjoint, covering, deterministic, stable parts; their plans; non-private parts.

Oracles: set algebra on the parts; the parts of a data set with one example removed or
the examples shuffled (each example's part depends on it alone, as Ding et al.'s Lemma 2
needs); ``trial_plan`` at the part's size; an uninterrupted run for restore. No Ray
session is started.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from opacus import GradSampleModule
from ray import tune
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import Subset, TensorDataset

from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.errors import PrivacyError
from ray_dptune.training import PrivacyParams, TrainState, digits_cnn, digits_data, dp_trainable, train, trial_plan
from ray_dptune.training.partition import Partition, part_sizes, partition_indices

pytestmark = pytest.mark.filterwarnings("ignore:Secure RNG turned off")

N_TRAIN = 1437
HYPER = {"lr": 0.5, "max_grad_norm": 1.0}


@pytest.fixture(scope="module")
def digits():
    return digits_data()


class Reports:
    def __init__(self, root: Path) -> None:
        self.root, self.metrics, self.checkpoints = root, [], []

    def __call__(self, metrics: dict, checkpoint_dir: str) -> None:
        copy = self.root / f"checkpoint_{len(self.metrics)}"
        shutil.copytree(checkpoint_dir, copy)
        self.metrics.append(metrics)
        self.checkpoints.append(copy)


def run(root, digits, partition, resume=None, **settings):
    settings = {"noise_multiplier": 1.0, "batch_size": 64, "epochs": 1, "seed": 0, **settings}
    trainable = dp_trainable(digits_cnn, lambda config: digits, **settings)
    reports = Reports(root)
    return train({**HYPER, "dp_partition": partition}, trainable.spec, reports, resume=resume), reports


# ---------------------------------------------------------------------------- the split
@pytest.mark.parametrize("count", [1, 3, 7])
def test_parts_are_disjoint_covering_and_deterministic(digits, count):
    train_set, _ = digits
    parts = [Partition(index, count).subset(train_set).indices for index in range(count)]
    assert sorted(i for part in parts for i in part) == list(range(N_TRAIN))  # disjoint and covering
    copy = TensorDataset(*(tensor.clone() for tensor in train_set.tensors))  # another object, same content
    assert [Partition(index, count).subset(copy).indices for index in range(count)] == parts
    sizes = part_sizes(train_set, count)
    assert sizes.tolist() == [len(part) for part in parts]
    assert np.all(np.abs(sizes - N_TRAIN / count) < 4 * np.sqrt(N_TRAIN / count))  # multinomial, near n/k


def test_each_example_keeps_its_part_when_others_come_or_go(digits):
    """Add/remove adjacency: a neighbouring data set differs in one part only (Ding et al., Lemma 2)."""
    train_set, _ = digits
    parts = partition_indices(train_set, 5)
    kept = [i for i in range(N_TRAIN) if i != 100]
    np.testing.assert_array_equal(partition_indices(Subset(train_set, kept), 5), parts[kept])
    order = np.random.default_rng(0).permutation(N_TRAIN).tolist()
    np.testing.assert_array_equal(partition_indices(Subset(train_set, order), 5), parts[order])


def test_items_must_be_tensors_to_be_assigned():
    class Named(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, index):
            return {"image": torch.zeros(2), "label": index}

    with pytest.raises(TypeError, match="tensors, arrays or numbers"):
        partition_indices(Named(), 2)


@pytest.mark.parametrize(
    "value",
    [
        {"index": 3, "count": 3},
        {"index": -1, "count": 3},
        {"index": 0, "count": 0},
        {"index": 1.0, "count": 3},
        {"index": 0, "count": 2, "private": "no"},
        {"index": 0},
        {"index": 0, "count": 2, "seed": 1},
        [0, 2],
    ],
    ids=["index-too-large", "negative", "zero-count", "float", "private-not-bool", "no-count", "unknown-key", "list"],
)
def test_invalid_partitions_raise(tmp_path, digits, value):
    with pytest.raises(ValueError, match="dp_partition"):
        run(tmp_path, digits, value)


# ---------------------------------------------------------------------------- plans
@pytest.mark.slow
def test_private_part_plans_at_its_own_size(tmp_path, digits):
    size = int(part_sizes(digits[0], 3)[1])
    spent, reports = run(tmp_path, digits, {"index": 1, "count": 3})
    expected = trial_plan(PrivacyParams(noise_multiplier=1.0, batch_size=64, epochs=1), size)
    assert expected.sample_rate == 64 / size and expected.steps == size // 64
    assert TrialSpend.from_dict(reports.metrics[0]["dp_plan"]) == expected and spent == expected
    trainable = dp_trainable(digits_cnn, digits_data, noise_multiplier=1.0, batch_size=64, epochs=1)
    assert trainable.privacy_plan({**HYPER, "dp_partition": {"index": 1, "count": 3}}) == expected


@pytest.mark.slow
def test_space_plan_covers_every_part(digits):
    count = 2
    trainable = dp_trainable(digits_cnn, digits_data, noise_multiplier=1.0, batch_size=64, epochs=2)
    choices = [{"index": index, "count": count} for index in range(count)]
    plan = trainable.privacy_plan({**HYPER, "dp_partition": tune.choice(choices)})
    part_plans = {
        trial_plan(PrivacyParams(noise_multiplier=1.0, batch_size=64, epochs=2), int(size))
        for size in part_sizes(digits[0], count)
    }
    assert plan in part_plans and len(part_plans) == count  # the parts differ in size, so in q
    plan_curve = plan.curve()
    assert all(plan_curve.dominates(other.curve()) for other in part_plans - {plan})
    full = trainable.privacy_plan(HYPER)
    assert full.sample_rate < plan.sample_rate and not full.curve().dominates(
        plan_curve
    )  # the whole set's is not enough


def test_space_plan_refuses_non_private_parts_and_a_given_size():
    trainable = dp_trainable(digits_cnn, digits_data, noise_multiplier=1.0, batch_size=64, epochs=2)
    with pytest.raises(ValueError, match="without DP"):
        trainable.privacy_plan({**HYPER, "dp_partition": {"index": 0, "count": 2, "private": False}})
    with pytest.raises(ValueError, match="dataset_size"):
        trainable.privacy_plan({**HYPER, "dp_partition": {"index": 0, "count": 2}}, dataset_size=N_TRAIN)


# ---------------------------------------------------------------------------- non-private parts
@pytest.mark.slow
def test_non_private_part_trains_plain_sgd_and_reports_no_plan(tmp_path, digits, monkeypatch):
    wrapped = []
    monkeypatch.setattr(GradSampleModule, "__init__", lambda *args, **kwargs: wrapped.append(1))
    updates = Counter()
    handle = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: updates.update([type(optimizer)]))
    try:
        spent, reports = run(tmp_path, digits, {"index": 0, "count": 2, "private": False}, epochs=2)
    finally:
        handle.remove()
    size = int(part_sizes(digits[0], 2)[0])
    assert spent is None and not wrapped  # no Opacus
    assert updates[torch.optim.SGD] == 2 * -(-size // 64)  # shuffled batches of 64, the last one partial
    assert [set(m) for m in reports.metrics] == [{"epoch", "val_acc", "dp_private"}] * 2
    assert all(m["dp_private"] is False for m in reports.metrics)
    assert reports.metrics[-1]["val_acc"] > 0.5
    assert TrainState.load(reports.checkpoints[0]).plan is None


@pytest.mark.slow
def test_non_private_part_restores(tmp_path, digits):
    partition = {"index": 0, "count": 2, "private": False}
    _, full = run(tmp_path / "full", digits, partition, epochs=2)
    _, resumed = run(tmp_path / "resumed", digits, partition, epochs=2, resume=TrainState.load(full.checkpoints[0]))
    assert resumed.metrics == full.metrics[1:]
    with pytest.raises(PrivacyError, match="differs"):  # a private trial cannot resume a non-private checkpoint
        run(
            tmp_path / "private",
            digits,
            {"index": 0, "count": 2},
            epochs=2,
            resume=TrainState.load(full.checkpoints[0]),
        )


def test_non_private_part_refuses_private_scores(tmp_path, digits):
    with pytest.raises(ValueError, match="public validation set"):
        run(tmp_path, digits, {"index": 0, "count": 2, "private": False}, score_noise_multiplier=5.0)
