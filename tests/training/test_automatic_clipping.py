"""Automatic clipping (Bu et al. 2023, AUTO-S): each example contributes at most R, as the plan assumes.

Oracles: each example's gradient computed alone by autograd (no Opacus), normalised by hand to
R·g/(‖g‖ + γ); the bound R on every contribution, tiny and huge gradients included; plain
DP-SGD's plan for the same trial. No Ray session is started.
"""

from __future__ import annotations

import pytest
import torch
from opacus import PrivacyEngine
from torch import nn

from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.training import Hyperparameters, digits_cnn, digits_data, dp_trainable, train
from ray_dptune.training.automatic import AutomaticClipDPOptimizer, automatic_clipping
from ray_dptune.training.clipping import AutomaticClipping, clipping_from_config

pytestmark = pytest.mark.filterwarnings("ignore:Secure RNG turned off", "ignore:Full backward hook is firing")

R, GAMMA = 2.0, 0.01
# Per-example input scales: gradient norms from ~1e-4 (below γ) to ~1e5 (above Rγ/1e-6 = 2e4, where
# Opacus's own clamp at R bites after the normalisation).
SCALES = torch.tensor([1e-4, 1e-2, 0.1, 30.0, 1e5], dtype=torch.float64)


def model_and_batch():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    inputs = torch.randn(len(SCALES), 3, dtype=torch.float64)
    targets = torch.cat([torch.randn(len(SCALES), 2, dtype=torch.float64), SCALES[:, None]], dim=1)
    return model, inputs, targets


def loss_fn(outputs, targets):
    """Σ_i w_i‖f(x_i) − y_i‖², w_i in the target's last column: example i's gradient scales with w_i."""
    return (targets[:, -1] * ((outputs - targets[:, :-1]) ** 2).sum(dim=1)).sum()


def per_example_gradients(model, inputs, targets):
    rows = []
    for x, y in zip(inputs, targets):
        model.zero_grad()
        loss_fn(model(x[None]), y[None]).backward()
        rows.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return torch.stack(rows)


def automatic_sum(grad_sample_mode, inputs, targets, *, stability=GAMMA):
    """The summed clipped gradient of ``automatic_clipping`` over the batch, flattened."""
    model, _, _ = model_and_batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, targets), batch_size=len(inputs))
    private_model, dp_optimizer, _ = PrivacyEngine(accountant="rdp").make_private(
        module=model,
        optimizer=optimizer,
        data_loader=loader,
        noise_multiplier=0.0,
        max_grad_norm=R,
        poisson_sampling=False,
        loss_reduction="sum",
        grad_sample_mode=grad_sample_mode,
    )
    automatic = automatic_clipping(dp_optimizer, stability=stability)
    automatic.zero_grad()
    loss_fn(private_model(inputs), targets).backward()
    automatic.clip_and_accumulate()
    return torch.cat([p.summed_grad.flatten() for p in automatic.params])


@pytest.mark.parametrize("grad_sample_mode", ["hooks", "functorch", "ew"])
def test_the_sum_is_each_example_normalised_and_none_passes_r(grad_sample_mode):
    model, inputs, targets = model_and_batch()
    grads = per_example_gradients(model, inputs, targets)
    norms = grads.norm(dim=1)
    assert norms.min() < GAMMA and norms.max() > R * GAMMA / 1e-6  # both ends of the normalisation are reached

    normalised = R * norms / (norms + GAMMA)
    opacus_clamp = (R / (normalised + 1e-6)).clamp(max=1.0)  # below 1 only for the example of norm > Rγ/1e-6
    assert (opacus_clamp < 1).sum() == 1
    expected = (R * grads / (norms + GAMMA)[:, None] * opacus_clamp[:, None]).sum(dim=0)
    got = automatic_sum(grad_sample_mode, inputs, targets)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-9)
    for i in range(len(SCALES)):  # alone, each example's contribution is at most R
        alone = automatic_sum(grad_sample_mode, inputs[i : i + 1], targets[i : i + 1])
        assert alone.norm() <= R
        assert float(alone.norm()) == pytest.approx(float(normalised[i] * opacus_clamp[i]), rel=1e-9)


def test_small_gradients_are_scaled_up_not_kept_as_flat_clipping_would():
    """The teeth: flat clipping at R keeps an example of norm ‖g‖ < R as it is; AUTO-S brings it near R."""
    model, inputs, targets = model_and_batch()
    norms = per_example_gradients(model, inputs, targets).norm(dim=1)
    i = int(torch.nonzero((norms > 10 * GAMMA) & (norms < R / 2))[0])
    small, norm = (inputs[i : i + 1], targets[i : i + 1]), norms[i]
    assert float(automatic_sum("hooks", *small).norm()) == pytest.approx(float(R * norm / (norm + GAMMA)), rel=1e-9)
    assert automatic_sum("hooks", *small).norm() > 1.5 * norm


def test_the_optimizer_keeps_the_accountant_hook_noise_and_settings():
    model, inputs, targets = model_and_batch()
    engine = PrivacyEngine(accountant="rdp")
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, targets), batch_size=5)
    model, dp_optimizer, _ = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader,
        noise_multiplier=1.3,
        max_grad_norm=R,
        poisson_sampling=True,
    )
    automatic = automatic_clipping(dp_optimizer)
    assert isinstance(automatic, AutomaticClipDPOptimizer)
    assert (automatic.noise_multiplier, automatic.max_grad_norm, automatic.stability) == (1.3, R, GAMMA)
    assert automatic.expected_batch_size == dp_optimizer.expected_batch_size
    assert automatic.step_hook is dp_optimizer.step_hook
    automatic.zero_grad()
    loss_fn(model(inputs), targets).backward()
    automatic.step()
    assert engine.accountant.history == [(1.3, 1.0, 1)]  # Opacus's accountant counted the step (OpacusSpend reads it)


def test_bad_stability_and_ghost_clipping_are_refused():
    model, inputs, targets = model_and_batch()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, targets), batch_size=5)
    _, dp_optimizer, _ = PrivacyEngine(accountant="rdp").make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    for stability in (0.0, -1.0, float("inf"), True):
        with pytest.raises(ValueError, match="stability"):
            automatic_clipping(dp_optimizer, stability=stability)
    with pytest.raises(ValueError, match="per-sample gradients"):
        clipping_from_config(
            {"clipping": "automatic"}, noise_multiplier=1.0, batch_size=64, grad_sample_mode="ghost", optimizer="sgd"
        )
    with pytest.raises(ValueError, match="automatic_stability"):
        clipping_from_config(
            {"clipping": "automatic", "automatic_stability": 0.0},
            noise_multiplier=1.0,
            batch_size=64,
            grad_sample_mode="auto",
            optimizer="adam",
        )
    settings = {"noise_multiplier": 1.0, "batch_size": 64, "grad_sample_mode": "auto", "optimizer": "adam"}
    assert clipping_from_config({"clipping": "automatic"}, **settings) == AutomaticClipping(stability=GAMMA)


def test_the_clipping_norm_leaves_the_search_space():
    assert Hyperparameters.from_config({"lr": 0.5, "clipping": "automatic"}).max_grad_norm == 1.0
    with pytest.raises(ValueError, match="max_grad_norm"):
        Hyperparameters.from_config({"lr": 0.5})


@pytest.mark.slow
def test_a_trial_trains_with_automatic_clipping_at_plain_dpsgd_plan(monkeypatch):
    steps = []
    normalise = AutomaticClipDPOptimizer.clip_and_accumulate
    monkeypatch.setattr(
        AutomaticClipDPOptimizer, "clip_and_accumulate", lambda self: (steps.append(1), normalise(self))
    )
    digits = digits_data()
    trainable = dp_trainable(digits_cnn, lambda config: digits, noise_multiplier=1.0, batch_size=64, epochs=2, seed=0)
    reports = []
    spent = train(
        {"lr": 0.5, "clipping": "automatic"}, trainable.spec, lambda metrics, checkpoint: reports.append(metrics)
    )
    assert spent == TrialSpend(sample_rate=64 / 1437, noise_multiplier=1.0, steps=44)
    assert spent == trainable.privacy_plan({"lr": 0.5, "max_grad_norm": 1.0})
    assert len(steps) == 44  # every step normalised
    assert reports[-1]["val_acc"] > 0.5  # it learns (chance is 0.1)
