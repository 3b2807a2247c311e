"""dp_trainable and its DP-SGD loop: plans, spending, the step guard, scores, modes, restore.

Oracles: Opacus's own RDP analysis (``opacus.accountants.analysis.rdp.compute_rdp``)
and sampler length for the accounting; an independent count of optimizer updates
(``torch.optim.optimizer.register_optimizer_step_post_hook``) for the steps; Opacus's
reference per-sample gradients (``grad_sample_mode="hooks"``) for the other modes; exact
accuracy recomputed from the checkpoint for the scores; an uninterrupted run for restore.
No Ray session is started.
"""

from __future__ import annotations

import logging
import pickle
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from opacus.accountants.analysis.rdp import compute_rdp
from opacus.data_loader import DPDataLoader
from ray import tune
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import Subset

from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.errors import PrivacyError
from ray_dptune.training import (
    PrivacyParams,
    SpendGuard,
    TrainState,
    digits_cnn,
    digits_data,
    dp_trainable,
    train,
    trial_plan,
)
from ray_dptune.training import loop as loop_module

MODES = ("hooks", "ew", "functorch", "ghost")
N_TRAIN, N_VAL = 1437, 360
STEPS_PER_EPOCH = 22  # int(1437 / 64), Opacus's UniformWithReplacementSampler length
HYPER = {"lr": 1.0, "max_grad_norm": 1.0}
INTEGER_ORDERS = np.array([2.0, 3.0, 4.0, 8.0, 16.0, 32.0, 64.0])

pytestmark = pytest.mark.filterwarnings("ignore:Secure RNG turned off", "ignore:Full backward hook is firing")


@pytest.fixture(scope="module")
def digits():
    return digits_data()


@pytest.fixture
def data_fn(digits):
    return lambda config: digits


@pytest.fixture
def optimizer_updates():
    """Counts the parameter updates of every SGD optimizer (DPOptimizer's inner one)."""
    counter = Counter()
    handle = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: counter.update([type(optimizer)]))
    yield counter
    handle.remove()


class Reports:
    """A ``report`` that keeps the metrics and a copy of each checkpoint."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.metrics: list[dict] = []
        self.checkpoints: list[Path] = []

    def __call__(self, metrics: dict, checkpoint_dir: str) -> None:
        copy = self.root / f"checkpoint_{len(self.metrics)}"
        shutil.copytree(checkpoint_dir, copy)
        self.metrics.append(metrics)
        self.checkpoints.append(copy)

    def model(self, index: int = -1) -> nn.Module:
        model = digits_cnn()
        model.load_state_dict(torch.load(self.checkpoints[index] / "model.pt", weights_only=True))
        return model


def run(tmp_path, data_fn, config=HYPER, resume=None, **settings):
    settings = {"noise_multiplier": 1.0, "batch_size": 64, "epochs": 2, "seed": 0, **settings}
    trainable = dp_trainable(digits_cnn, data_fn, **settings)
    reports = Reports(tmp_path)
    spent = train(config, trainable.spec, reports, resume=resume)
    return spent, reports


def exact_accuracy(model: nn.Module, dataset) -> float:
    inputs, targets = dataset.tensors
    with torch.no_grad():
        return int((model(inputs).argmax(dim=1) == targets).sum()) / len(targets)


# ---------------------------------------------------------------------------- plans
def test_plan_is_epochs_times_opacus_loader_length(digits):
    train_set, _ = digits
    trainable = dp_trainable(digits_cnn, digits_data, noise_multiplier=2.5, batch_size=64, epochs=15)
    plan = trainable.privacy_plan({"lr": 0.5, "max_grad_norm": 1.0})
    assert len(DPDataLoader(train_set, sample_rate=64 / N_TRAIN)) == STEPS_PER_EPOCH
    expected = TrialSpend(sample_rate=64 / N_TRAIN, noise_multiplier=2.5, steps=15 * STEPS_PER_EPOCH)
    assert plan == expected
    np.testing.assert_array_equal(plan.curve().epsilons, expected.curve().epsilons)
    opacus_rdp = compute_rdp(q=64 / N_TRAIN, noise_multiplier=2.5, steps=330, orders=INTEGER_ORDERS)
    np.testing.assert_allclose(plan.curve(INTEGER_ORDERS).epsilons, opacus_rdp, rtol=1e-6)


def test_plan_counts_one_score_release_per_epoch():
    trainable = dp_trainable(
        digits_cnn, digits_data, noise_multiplier=2.0, batch_size=64, epochs=3, score_noise_multiplier=4.0
    )
    plan = trainable.privacy_plan({}, dataset_size=N_TRAIN)
    assert plan == TrialSpend(
        sample_rate=64 / N_TRAIN,
        noise_multiplier=2.0,
        steps=3 * STEPS_PER_EPOCH,
        score_noise_multiplier=4.0,
        score_releases=3,
    )


@pytest.mark.parametrize(
    "space, expected",
    [
        (  # smallest σ of a range; batch 65 has batch 64's 22 steps at a larger q; most epochs of a grid
            {
                "noise_multiplier": tune.loguniform(1.5, 4.0),
                "batch_size": tune.choice([64, 65]),
                "epochs": tune.grid_search([2, 3]),
            },
            TrialSpend(sample_rate=65 / N_TRAIN, noise_multiplier=1.5, steps=3 * STEPS_PER_EPOCH),
        ),
        (  # a σ choice; the upper end of an integer range of epochs (conservative: randint excludes it)
            {"noise_multiplier": tune.choice([3.0, 2.0]), "epochs": tune.randint(2, 5)},
            TrialSpend(sample_rate=64 / N_TRAIN, noise_multiplier=2.0, steps=5 * STEPS_PER_EPOCH),
        ),
        (  # noisy scores cost more than public ones
            {"score_noise_multiplier": tune.choice([None, 8.0]), "epochs": 4},
            TrialSpend(
                sample_rate=64 / N_TRAIN,
                noise_multiplier=2.5,
                steps=4 * STEPS_PER_EPOCH,
                score_noise_multiplier=8.0,
                score_releases=4,
            ),
        ),
    ],
    ids=["sigma-range-batch-choice-epoch-grid", "sigma-choice-epoch-range", "score-noise-choice"],
)
def test_space_plan_takes_the_worst_case(space, expected):
    trainable = dp_trainable(digits_cnn, digits_data, noise_multiplier=2.5, batch_size=64, epochs=2)
    plan = trainable.privacy_plan({"lr": tune.loguniform(1e-2, 2), **space}, dataset_size=N_TRAIN)
    assert plan == expected


@pytest.mark.parametrize(
    "space, message",
    [
        # At high orders the smaller batch (more steps) costs more, at low orders the larger one.
        ({"batch_size": tune.choice([32, 64])}, "No configuration"),
        ({"batch_size": tune.randint(32, 128)}, "not monotone in the batch size"),
        ({"noise_multiplier": tune.sample_from(lambda spec: 2.0)}, "range is unknown"),
        ({"epochs": tune.uniform(2, 5)}, "epochs must be an integer"),
    ],
    ids=["incomparable-batches", "batch-range", "sample-from", "float-epochs"],
)
def test_space_plan_refuses_spaces_it_cannot_bound(space, message):
    trainable = dp_trainable(digits_cnn, digits_data, noise_multiplier=2.5, batch_size=64, epochs=2)
    with pytest.raises(ValueError, match=message):
        trainable.privacy_plan(space, dataset_size=N_TRAIN)


# ---------------------------------------------------------------------------- spending
@pytest.mark.slow
def test_spent_matches_opacus_rdp_and_the_steps_taken(tmp_path, data_fn, optimizer_updates):
    spent, reports = run(tmp_path, data_fn, epochs=3)
    plan = TrialSpend.from_dict(reports.metrics[0]["dp_plan"])
    assert plan == TrialSpend(sample_rate=64 / N_TRAIN, noise_multiplier=1.0, steps=3 * STEPS_PER_EPOCH)
    for epoch, metrics in enumerate(reports.metrics, start=1):
        assert metrics["epoch"] == epoch
        assert TrialSpend.from_dict(metrics["dp_plan"]) == plan
        step_spent = TrialSpend.from_dict(metrics["dp_spent"])
        assert step_spent.steps == epoch * STEPS_PER_EPOCH
        assert plan.covers(step_spent)
    assert optimizer_updates[torch.optim.SGD] == spent.steps == 3 * STEPS_PER_EPOCH
    opacus_rdp = compute_rdp(q=64 / N_TRAIN, noise_multiplier=1.0, steps=spent.steps, orders=INTEGER_ORDERS)
    np.testing.assert_allclose(spent.curve(INTEGER_ORDERS).epsilons, opacus_rdp, rtol=1e-6)


@pytest.mark.slow
def test_step_guard_stops_at_the_plan(tmp_path, data_fn, optimizer_updates, monkeypatch):
    def short_plan(params, dataset_size):
        return TrialSpend(
            sample_rate=params.batch_size / dataset_size, noise_multiplier=float(params.noise_multiplier), steps=10
        )

    monkeypatch.setattr(loop_module, "trial_plan", short_plan)
    with pytest.raises(PrivacyError, match="exceed the trial's plan of 10 steps"):
        run(tmp_path, data_fn)
    assert optimizer_updates[torch.optim.SGD] == 10


def test_ledger_counts_and_refuses():
    plan = TrialSpend(sample_rate=0.1, noise_multiplier=1.0, steps=2, score_noise_multiplier=3.0, score_releases=1)
    ledger = SpendGuard(plan)
    ledger.step_hook(None)
    ledger.step_hook(None)
    ledger.release_score()
    assert ledger.spent == plan
    with pytest.raises(PrivacyError, match="Step 3"):
        ledger.step_hook(None)
    with pytest.raises(PrivacyError, match="Score release 2"):
        ledger.release_score()
    with pytest.raises(PrivacyError, match="does not fit"):
        SpendGuard(plan, TrialSpend(sample_rate=0.2, noise_multiplier=1.0, steps=1))


# ---------------------------------------------------------------------------- scores
@pytest.mark.slow
def test_public_score_is_the_exact_accuracy(tmp_path, data_fn, digits):
    _, reports = run(tmp_path, data_fn)
    for index, metrics in enumerate(reports.metrics):
        assert metrics["val_acc"] == exact_accuracy(reports.model(index), digits[1])
        assert TrialSpend.from_dict(metrics["dp_spent"]).score_releases == 0


@pytest.mark.slow
def test_noisy_score_is_released_and_accounted(tmp_path, data_fn, digits):
    sigma = 3.0
    _, reports = run(tmp_path, data_fn, epochs=3, score_noise_multiplier=sigma)
    plan = TrialSpend.from_dict(reports.metrics[0]["dp_plan"])
    assert (plan.score_noise_multiplier, plan.score_releases) == (sigma, 3)
    for index, metrics in enumerate(reports.metrics):
        spent = TrialSpend.from_dict(metrics["dp_spent"])
        assert spent.score_releases == index + 1 and plan.covers(spent)
        exact = exact_accuracy(reports.model(index), digits[1])
        assert metrics["val_acc"] != exact
        assert abs(metrics["val_acc"] - exact) < 6 * sigma / N_VAL


# ---------------------------------------------------------------------------- modes
@pytest.mark.parametrize("mode", MODES)
def test_each_mode_learns(tmp_path, data_fn, mode):
    _, reports = run(tmp_path, data_fn, grad_sample_mode=mode)
    # Measured 0.75-0.81 over 5 seeds for every mode; chance is 0.1.
    assert reports.metrics[-1]["val_acc"] > 0.5


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [64, 1], ids=["batch-64", "batch-1-with-empty-batches"])
def test_modes_agree_with_opacus_hooks(tmp_path, digits, batch_size):
    """Same seed, same noise: every mode must give hooks' weights, empty Poisson batches included.

    With 40 examples and batch size 1 (q = 1/40), about 15 of each epoch's 40 batches are
    empty. A small learning rate keeps float rounding (~1e-7) from being amplified.
    """
    train_set, val_set = digits
    small = (Subset(train_set, range(40)), val_set)
    data = (lambda config: digits) if batch_size == 64 else (lambda config: small)
    weights = {}
    for mode in MODES:
        config = {"lr": 0.1, "max_grad_norm": 1.0}
        spent, reports = run(tmp_path / mode, data, config, epochs=1, batch_size=batch_size, grad_sample_mode=mode)
        assert spent.steps == (STEPS_PER_EPOCH if batch_size == 64 else 40)
        weights[mode] = reports.model().state_dict()
    for mode in MODES[1:]:
        for name, reference in weights["hooks"].items():
            torch.testing.assert_close(weights[mode][name], reference, msg=f"{mode} {name}")


# ---------------------------------------------------------------------------- config and model
@pytest.mark.parametrize(
    "config, message",
    [
        ({"max_grad_norm": 1.0}, r"config\['lr'\] is required"),
        ({"lr": 0.1}, r"config\['max_grad_norm'\] is required"),
        ({"lr": -0.1, "max_grad_norm": 1.0}, "must be a finite number > 0"),
    ],
    ids=["no-lr", "no-clipping", "negative-lr"],
)
def test_missing_or_invalid_hyperparameters_raise(tmp_path, data_fn, config, message):
    with pytest.raises(ValueError, match=message):
        run(tmp_path, data_fn, config=config)


def test_config_overrides_the_privacy_parameters(tmp_path, data_fn):
    config = {**HYPER, "noise_multiplier": 3.0, "batch_size": 128, "epochs": 1}
    _, reports = run(tmp_path, data_fn, config=config)
    assert len(reports.metrics) == 1
    expected = trial_plan(PrivacyParams(noise_multiplier=3.0, batch_size=128, epochs=1), N_TRAIN)
    assert TrialSpend.from_dict(reports.metrics[0]["dp_plan"]) == expected


def test_invalid_settings_raise_before_training():
    with pytest.raises(ValueError, match="grad_sample_mode"):
        dp_trainable(digits_cnn, digits_data, noise_multiplier=1.0, batch_size=64, epochs=1, grad_sample_mode="fast")
    with pytest.raises(ValueError, match="noise_multiplier"):
        dp_trainable(digits_cnn, digits_data, noise_multiplier=0.0, batch_size=64, epochs=1)
    with pytest.raises(ValueError, match="metric"):
        dp_trainable(digits_cnn, digits_data, noise_multiplier=1.0, batch_size=64, epochs=1, metric="dp_plan")


def test_batchnorm_is_replaced_and_logged(tmp_path, data_fn, caplog):
    def batchnorm_cnn(config):
        return nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Tanh(), nn.Flatten(), nn.Linear(256, 10)
        )

    trainable = dp_trainable(batchnorm_cnn, data_fn, noise_multiplier=1.0, batch_size=64, epochs=1, seed=0)
    with caplog.at_level(logging.WARNING, logger=loop_module.__name__):
        spent = train(HYPER, trainable.spec, Reports(tmp_path))
    assert "ModuleValidator.fix" in caplog.text and "BatchNorm" in caplog.text
    assert spent.steps == STEPS_PER_EPOCH


# ---------------------------------------------------------------------------- restore
@pytest.mark.slow
def test_restore_continues_with_the_spending(tmp_path, data_fn):
    _, full = run(tmp_path / "full", data_fn, epochs=3)
    resume = TrainState.load(full.checkpoints[0])
    assert resume.epoch == 1 and resume.spent.steps == STEPS_PER_EPOCH
    spent, resumed = run(tmp_path / "resumed", data_fn, epochs=3, resume=resume)
    assert [m["epoch"] for m in resumed.metrics] == [2, 3]
    assert [m["dp_spent"] for m in resumed.metrics] == [m["dp_spent"] for m in full.metrics[1:]]
    assert spent.steps == 3 * STEPS_PER_EPOCH
    for name, reference in full.model().state_dict().items():  # per-epoch seeds: same run
        torch.testing.assert_close(resumed.model().state_dict()[name], reference)


def test_restore_after_the_last_report_reports_it_again(tmp_path, data_fn, optimizer_updates):
    _, full = run(tmp_path / "full", data_fn, epochs=2)
    steps_before = optimizer_updates[torch.optim.SGD]
    spent, again = run(tmp_path / "again", data_fn, epochs=2, resume=TrainState.load(full.checkpoints[-1]))
    assert again.metrics == full.metrics[-1:]
    assert optimizer_updates[torch.optim.SGD] == steps_before and spent.steps == 2 * STEPS_PER_EPOCH


def test_restore_refuses_another_plan(tmp_path, data_fn):
    _, reports = run(tmp_path / "first", data_fn, epochs=2)
    with pytest.raises(PrivacyError, match="differs"):
        run(tmp_path / "second", data_fn, epochs=3, resume=TrainState.load(reports.checkpoints[0]))


# ---------------------------------------------------------------------------- Tune wrapper
def test_tune_wrapper_reports_and_resumes_without_a_session(tmp_path, data_fn, monkeypatch):
    trainable = dp_trainable(digits_cnn, data_fn, noise_multiplier=1.0, batch_size=64, epochs=2, seed=0)
    _, first = run(tmp_path / "first", data_fn)
    reported = []
    monkeypatch.setattr(tune, "get_checkpoint", lambda: tune.Checkpoint.from_directory(first.checkpoints[0]))
    monkeypatch.setattr(tune, "report", lambda metrics, checkpoint: reported.append((metrics, checkpoint)))
    trainable(dict(HYPER))
    assert [metrics["epoch"] for metrics, _ in reported] == [2]
    assert isinstance(reported[0][1], tune.Checkpoint)
    assert reported[0][0]["dp_spent"] == first.metrics[1]["dp_spent"]


def test_trainable_pickles_for_ray_workers():
    trainable = dp_trainable(digits_cnn, digits_data, noise_multiplier=1.0, batch_size=64, epochs=1)
    clone = pickle.loads(pickle.dumps(trainable))
    assert clone.spec == trainable.spec and clone.__name__ == "digits_cnn"
