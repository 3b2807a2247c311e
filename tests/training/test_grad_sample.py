"""grad_sample_mode="auto": the rule's choice, its constraints, and that the chosen mode computes
the same DP-SGD step as Opacus's reference per-sample gradients ("hooks").

Oracle for the step: the same model, batch, clipping norm and seeded noise generator stepped
with ``make_private(grad_sample_mode="hooks")``; the updates must agree to float tolerance.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from opacus import PrivacyEngine
from opacus.validators import ModuleValidator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ray_dptune.training import PrivacyParams, TrainSpec, digits_cnn, train
from ray_dptune.training.clipping import PER_SAMPLE_GRADIENT_CLIPPING
from ray_dptune.training.grad_sample import (
    AUTO,
    GRAD_SAMPLE_MODES,
    allowed_modes,
    choose_grad_sample_mode,
    profile_model,
    resolve_grad_sample_mode,
)
from ray_dptune.training.spec import DEFAULT_GRAD_SAMPLE_MODE

pytestmark = pytest.mark.filterwarnings(
    "ignore:Secure RNG turned off", "ignore:Full backward hook is firing", "ignore:Using a non-full backward hook"
)

CLIPPINGS = ("fixed", "quantile", "oso")
BATCH_SIZES = (1, 64, 256, 1024)


def mlp(width: int = 1024) -> nn.Module:
    return nn.Sequential(nn.Linear(784, width), nn.Tanh(), nn.Linear(width, 256), nn.Tanh(), nn.Linear(256, 10))


class TokenModel(nn.Module):
    """Embedding -> LSTM (DPLSTM after ModuleValidator.fix) -> linear: a layer expanded weights cannot run."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(100, 16)
        self.lstm = nn.LSTM(16, 16, batch_first=True)
        self.head = nn.Linear(16, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embedding(tokens))
        return self.head(out[:, -1])


MODELS = {
    "digits_cnn": digits_cnn,
    "mlp_1m": mlp,
    "mlp_small": lambda: mlp(64),
    "lstm": lambda: ModuleValidator.fix(TokenModel()),
}


def test_default_is_auto():
    assert DEFAULT_GRAD_SAMPLE_MODE == AUTO
    assert (
        TrainSpec(
            digits_cnn,
            lambda c: None,
            nn.functional.cross_entropy,
            PrivacyParams(noise_multiplier=1.0, batch_size=64, epochs=1),
        ).grad_sample_mode
        == AUTO
    )


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("clipping", CLIPPINGS)
def test_choice_is_a_valid_mode_and_never_ghost_with_per_sample_clipping(name, clipping):
    model = MODELS[name]()
    for batch_size in BATCH_SIZES:
        choice = choose_grad_sample_mode(model, batch_size=batch_size, clipping=clipping)
        assert choice.mode in GRAD_SAMPLE_MODES and choice.mode in allowed_modes(clipping=clipping)
        assert choice.reason
        if clipping in PER_SAMPLE_GRADIENT_CLIPPING:
            assert choice.mode != "ghost"
        assert resolve_grad_sample_mode(AUTO, model, batch_size=batch_size, clipping=clipping) == choice


def test_choices_on_the_benchmarked_models():
    """What benchmarks/results/dpsgd_step.md measured fastest."""
    assert choose_grad_sample_mode(digits_cnn(), batch_size=64).mode == "ew"
    assert choose_grad_sample_mode(mlp(), batch_size=64).mode == "ghost"
    assert choose_grad_sample_mode(mlp(), batch_size=256).mode == "ghost"
    assert choose_grad_sample_mode(mlp(), batch_size=256, clipping="quantile").mode == "ew"
    # DPLSTM's RNNLinear is no layer expanded weights support: hooks, when ghost is out.
    assert choose_grad_sample_mode(MODELS["lstm"](), batch_size=64, clipping="oso").mode == "hooks"


def test_rule_is_deterministic_and_ignores_the_weights():
    first = [choose_grad_sample_mode(mlp(), batch_size=b, clipping=c) for b in BATCH_SIZES for c in CLIPPINGS]
    torch.manual_seed(123)
    again = [choose_grad_sample_mode(mlp(), batch_size=b, clipping=c) for b in BATCH_SIZES for c in CLIPPINGS]
    assert first == again
    frozen = mlp()
    frozen[0].requires_grad_(False)  # only trainable parameters count
    assert profile_model(frozen).parameters == profile_model(mlp()).parameters - 784 * 1024 - 1024


def test_explicit_mode_is_kept_and_checked():
    for mode in GRAD_SAMPLE_MODES:
        assert resolve_grad_sample_mode(mode, digits_cnn(), batch_size=64).mode == mode
    assert resolve_grad_sample_mode("hooks", mlp(), batch_size=1024).mode == "hooks"
    with pytest.raises(ValueError, match="per-sample gradients"):
        resolve_grad_sample_mode("ghost", mlp(), batch_size=64, clipping="quantile")
    with pytest.raises(ValueError, match="grad_sample_mode"):
        resolve_grad_sample_mode("fast", mlp(), batch_size=64)
    with pytest.raises(ValueError, match="batch_size"):
        choose_grad_sample_mode(mlp(), batch_size=0)
    with pytest.raises(ValueError, match="trainable"):
        choose_grad_sample_mode(nn.Tanh(), batch_size=64)


def dp_update(model: nn.Module, mode: str, inputs, targets, *, noise_multiplier: float) -> list[torch.Tensor]:
    """Parameters minus their values after one DP-SGD step (SGD, lr 1) in ``mode``."""
    model = copy.deepcopy(model)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=len(targets))
    private = PrivacyEngine().make_private(
        module=model,
        optimizer=optimizer,
        criterion=nn.CrossEntropyLoss(),
        data_loader=loader,
        noise_multiplier=noise_multiplier,
        max_grad_norm=0.05,  # small enough to clip every example
        poisson_sampling=False,
        clipping="flat",
        grad_sample_mode=mode,
        noise_generator=torch.Generator().manual_seed(7),
    )
    gsm, dp_optimizer, criterion = private[0], private[1], private[2] if mode == "ghost" else nn.CrossEntropyLoss()
    dp_optimizer.expected_batch_size = len(targets)
    dp_optimizer.zero_grad(set_to_none=True)
    criterion(gsm(inputs), targets).backward()
    dp_optimizer.step()
    return [b - p.detach() for b, p in zip(before, gsm._module.parameters())]


@pytest.mark.slow
@pytest.mark.parametrize("noise_multiplier", [0.0, 1.0])
@pytest.mark.parametrize("clipping", ["fixed", "quantile"])  # ghost, and ew (oso's choice too)
def test_chosen_mode_takes_the_same_dp_step_as_hooks(noise_multiplier, clipping):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 1024), nn.Tanh(), nn.Linear(1024, 256), nn.Tanh(), nn.Linear(256, 10))
    inputs, targets = torch.randn(64, 64), torch.randint(0, 10, (64,))
    choice = choose_grad_sample_mode(model, batch_size=64, clipping=clipping)
    assert choice.mode == ("ghost" if clipping == "fixed" else "ew")
    reference = dp_update(model, "hooks", inputs, targets, noise_multiplier=noise_multiplier)
    chosen = dp_update(model, choice.mode, inputs, targets, noise_multiplier=noise_multiplier)
    for ours, theirs in zip(chosen, reference):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6)
    # Every example clipped: the noiseless update's norm is at most C (mean of clipped gradients).
    if noise_multiplier == 0.0:
        assert torch.sqrt(sum((u**2).sum() for u in chosen)) <= 0.05 + 1e-6


def test_train_logs_the_resolved_mode(caplog):
    """A trial with the default mode trains with the rule's choice (digits-shaped synthetic data)."""
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(128, 1, 8, 8, generator=generator), torch.randint(0, 10, (128,), generator=generator)
    )
    spec = TrainSpec(
        digits_cnn,
        lambda c: (data, data),
        nn.functional.cross_entropy,
        PrivacyParams(noise_multiplier=1.0, batch_size=32, epochs=1),
        seed=0,
    )
    reports = []
    with caplog.at_level(logging.INFO, logger="ray_dptune.training.loop"):
        train({"lr": 0.1, "max_grad_norm": 1.0}, spec, lambda metrics, directory: reports.append(metrics))
    assert "grad_sample_mode='ew'" in caplog.text
    assert len(reports) == 1 and reports[0]["dp_spent"] == reports[0]["dp_plan"]
