"""config["clipping"]: validation, quantile clipping's accounting, and restore of adaptive state.

Oracles: the closed form α/(2ν²) for Andrew et al.'s Theorem 1 split, with the noise stds
Opacus actually draws; the count's change when one example is added (½ for ours, 1 for
Opacus's own ``AdaClipDPOptimizer``); a hand-computed quantile update; plain DP-SGD's plan;
an uninterrupted run for restore. No Ray session is started.
"""

from __future__ import annotations

import math
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from opacus.optimizers import AdaClipDPOptimizer
from opacus.optimizers import adaclipoptimizer as opacus_adaclip
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import Subset

from ray_dptune.accounting import RDPCurve
from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.training import TrainState, digits_cnn, digits_data, dp_trainable, train
from ray_dptune.training.quantile import QuantileClipDPOptimizer, quantile_gradient_noise_multiplier

pytestmark = pytest.mark.filterwarnings("ignore:Secure RNG turned off", "ignore:Full backward hook is firing")

ORDERS = np.array([1.5, 2.0, 4.0, 8.0, 32.0, 256.0])
HYPER = {"lr": 0.5, "max_grad_norm": 1.0}


@pytest.fixture(scope="module")
def digits():
    return digits_data()


@pytest.fixture
def optimizer_updates():
    counter = Counter()
    handle = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: counter.update([type(optimizer)]))
    yield counter
    handle.remove()


class Reports:
    def __init__(self, root: Path) -> None:
        self.root, self.metrics, self.checkpoints = root, [], []

    def __call__(self, metrics: dict, checkpoint_dir: str) -> None:
        copy = self.root / f"checkpoint_{len(self.metrics)}"
        shutil.copytree(checkpoint_dir, copy)
        self.metrics.append(metrics)
        self.checkpoints.append(copy)


def run(root, digits, config, resume=None, **settings):
    settings = {"noise_multiplier": 1.0, "batch_size": 64, "epochs": 1, "seed": 0, **settings}
    trainable = dp_trainable(digits_cnn, lambda config: digits, **settings)
    reports = Reports(root)
    return train(config, trainable.spec, reports, resume=resume), reports


# ---------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "extra, settings, message",
    [
        ({"clipping": "flat"}, {}, r"config\['clipping'\] must be one of"),
        ({"clipping": "oso", "oso_noise_multiplier_q": 1.0}, {}, "Proposition 1"),
        ({"clipping": "oso", "oso_rho_c": -1e-3}, {}, r"config\['oso_rho_c'\]"),
        ({"clipping": "oso", "oso_rho_r": math.nan}, {}, r"config\['oso_rho_r'\]"),
        ({"clipping": "oso"}, {"optimizer": "adam"}, "SGD"),
        ({"clipping": "oso"}, {"grad_sample_mode": "ghost"}, "per-sample gradients"),
        ({"clipping": "quantile"}, {"grad_sample_mode": "ghost"}, "per-sample gradients"),
        ({"clipping": "quantile", "target_quantile": 1.5}, {}, r"config\['target_quantile'\]"),
        ({"clipping": "quantile", "clipbound_lr": -0.2}, {}, r"config\['clipbound_lr'\]"),
        ({"clipping": "quantile", "unclipped_num_std": 0.5}, {}, "Theorem 1"),
    ],
    ids=[
        "unknown-mode",
        "nu-q-not-above-nu",
        "negative-rho-c",
        "nan-rho-r",
        "oso-with-adam",
        "oso-with-ghost",
        "quantile-with-ghost",
        "quantile-above-one",
        "negative-clipbound-lr",
        "count-noise-too-small",
    ],
)
def test_bad_clipping_raises_before_training(tmp_path, digits, optimizer_updates, extra, settings, message):
    with pytest.raises(ValueError, match=message):
        run(tmp_path, digits, {**HYPER, **extra}, **settings)
    assert not optimizer_updates


# ---------------------------------------------------------------------------- quantile accounting
def quantile_optimizer(nu=1.0, sigma_b=2.0, clip=1.0, batch=4, eta=0.2, gamma=0.5):
    weight = nn.Parameter(torch.zeros(2))
    optimizer = QuantileClipDPOptimizer(
        torch.optim.SGD([weight], lr=0.1),
        noise_multiplier=nu,
        max_grad_norm=clip,
        target_unclipped_quantile=gamma,
        clipbound_learning_rate=eta,
        unclipped_num_std=sigma_b,
        expected_batch_size=batch,
    )
    return weight, optimizer


@pytest.mark.slow
def test_quantile_split_composes_to_one_gaussian_at_nu(monkeypatch):
    """Theorem 1 (Andrew et al.): Gaussian(σ_g) on the gradient ∘ count of sensitivity ½ with std σ_b = Gaussian(ν)."""
    drawn = []

    def record(std, reference, **kwargs):
        drawn.append(std)
        return torch.zeros_like(reference)

    monkeypatch.setattr(opacus_adaclip, "_generate_noise", record)
    nu, sigma_b, clip = 1.3, 1.1, 0.8
    weight, optimizer = quantile_optimizer(nu=nu, sigma_b=sigma_b, clip=clip)
    optimizer.zero_grad()
    weight.grad_sample = torch.tensor([[3.0, 4.0], [0.1, 0.0]])
    optimizer.step()
    gradient_std, count_std = drawn  # what Opacus's add_noise drew
    gradient_multiplier, count_multiplier = gradient_std / clip, count_std / 0.5
    assert gradient_multiplier == pytest.approx(
        quantile_gradient_noise_multiplier(noise_multiplier=nu, unclipped_num_std=sigma_b)
    )
    composed = RDPCurve.gaussian(noise_multiplier=gradient_multiplier, orders=ORDERS) + RDPCurve.gaussian(
        noise_multiplier=count_multiplier, orders=ORDERS
    )
    np.testing.assert_allclose(composed.epsilons, ORDERS / (2 * nu**2), rtol=1e-9)


def count_change(optimizer, weight, batch, extra):
    """The change of the pre-noise count when ``extra`` joins ``batch``."""
    counts = []
    for per_sample in (batch, torch.cat([batch, extra[None]])):
        optimizer.zero_grad()
        weight.grad_sample = per_sample
        optimizer.clip_and_accumulate()
        counts.append(float(optimizer.unclipped_num))
    return counts[1] - counts[0]


@pytest.mark.parametrize(
    "extra, change",
    [((3.0, 4.0), -0.5), ((0.3, 0.4), 0.5), ((0.0, 0.0), 0.0)],
    ids=["clipped", "unclipped", "zero-gradient-placeholder"],
)
def test_quantile_count_moves_by_at_most_one_half(extra, change):
    weight, optimizer = quantile_optimizer()
    batch = torch.tensor([[3.0, 0.0], [0.1, 0.1], [0.0, 0.2]])
    assert count_change(optimizer, weight, batch, torch.tensor(extra)) == change


def test_opacus_own_count_moves_by_one_so_its_nu_would_under_report():
    """Why we patch AdaClipDPOptimizer: its count Σb_i moves by 1, not ½, under add/remove adjacency.

    With Opacus's split, its pair then costs multiplier (ν⁻² + ¾σ_b⁻²)^(-1/2) < ν, yet Opacus accounts ν.
    """
    weight = nn.Parameter(torch.zeros(2))
    nu, sigma_b = 1.0, 2.0
    opacus = AdaClipDPOptimizer(
        torch.optim.SGD([weight], lr=0.1),
        noise_multiplier=nu,
        target_unclipped_quantile=0.5,
        clipbound_learning_rate=0.2,
        max_clipbound=10.0,
        min_clipbound=0.01,
        unclipped_num_std=sigma_b,
        max_grad_norm=1.0,
        expected_batch_size=4,
    )
    batch = torch.tensor([[3.0, 0.0], [0.1, 0.1]])
    assert count_change(opacus, weight, batch, torch.tensor([0.3, 0.4])) == 1.0
    effective = (
        quantile_gradient_noise_multiplier(noise_multiplier=nu, unclipped_num_std=sigma_b) ** -2 + sigma_b**-2
    ) ** -0.5
    assert effective == pytest.approx((nu**-2 + 0.75 * sigma_b**-2) ** -0.5) and effective < nu


def test_quantile_update_divides_by_the_expected_batch_size(monkeypatch):
    """3 unclipped examples, expected batch 4, no noise: b̃ = (1.5 + 4/2) / 4 = 0.875, C_1 = e^(-0.2·0.375)."""
    monkeypatch.setattr(opacus_adaclip, "_generate_noise", lambda std, reference, **kwargs: torch.zeros_like(reference))
    weight, optimizer = quantile_optimizer(batch=4, eta=0.2, gamma=0.5)
    optimizer.zero_grad()
    weight.grad_sample = torch.tensor([[0.1, 0.0], [0.0, 0.2], [0.3, 0.0]])
    optimizer.step()
    assert optimizer.max_grad_norm == pytest.approx(math.exp(-0.2 * (0.875 - 0.5)))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["quantile", "oso"])
def test_adaptive_modes_report_plain_dpsgd_plan(tmp_path, digits, mode):
    _, fixed = run(tmp_path / "fixed", digits, HYPER)
    spent, adaptive = run(tmp_path / mode, digits, {**HYPER, "clipping": mode})
    assert spent == TrialSpend(sample_rate=64 / 1437, noise_multiplier=1.0, steps=22)
    assert [m["dp_plan"] for m in adaptive.metrics] == [m["dp_plan"] for m in fixed.metrics]
    assert [m["dp_spent"] for m in adaptive.metrics] == [m["dp_spent"] for m in fixed.metrics]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["quantile", "oso"])
def test_adaptive_modes_agree_across_per_sample_gradient_modes(tmp_path, digits, mode):
    """Empty Poisson batches (20 examples, q = 1/20: ~7 of 20): hooks sees none, ew a zero placeholder.

    The placeholder must not move C_t (its count contribution is 0, its direction 0): same
    clipping state exactly, same weights up to float rounding of the per-sample norms.
    """
    small = (Subset(digits[0], range(20)), digits[1])
    config = {**HYPER, "lr": 0.1, "clipping": mode, "unclipped_num_std": 1.0, "oso_rho_c": 0.05, "oso_rho_r": 0.05}
    states = {}
    for sample_mode in ("hooks", "ew"):
        _, reports = run(tmp_path / sample_mode, small, config, batch_size=1, grad_sample_mode=sample_mode)
        states[sample_mode] = TrainState.load(reports.checkpoints[-1])
    saved, reference = states["ew"].clipping_state, states["hooks"].clipping_state
    assert {k: v for k, v in saved.items() if not k.startswith("previous")} == {
        k: v for k, v in reference.items() if not k.startswith("previous")
    }
    torch.testing.assert_close(states["ew"].model_state, states["hooks"].model_state, atol=1e-4, rtol=1e-3)


# ---------------------------------------------------------------------------- restore
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["quantile", "oso"])
def test_restore_continues_the_adaptive_sequence(tmp_path, digits, mode):
    config = {**HYPER, "clipping": mode, "oso_rho_c": 0.05, "oso_rho_r": 0.05}
    _, full = run(tmp_path / "full", digits, config, epochs=3)
    first, last = TrainState.load(full.checkpoints[0]), TrainState.load(full.checkpoints[-1])
    assert first.clipping_state["mode"] == mode
    assert first.clipping_state != {"mode": mode, "max_grad_norm": 1.0}  # C_t moved
    _, resumed = run(tmp_path / "resumed", digits, config, epochs=3, resume=first)
    again = TrainState.load(resumed.checkpoints[-1])
    assert [m["epoch"] for m in resumed.metrics] == [2, 3]
    assert again.clipping_state.pop("mode") == last.clipping_state.pop("mode") == mode
    torch.testing.assert_close(again.clipping_state, last.clipping_state, rtol=0, atol=0)
    torch.testing.assert_close(again.model_state, last.model_state, rtol=0, atol=0)
    torch.testing.assert_close(again.optimizer_state, last.optimizer_state, rtol=0, atol=0)


@pytest.mark.slow
def test_restore_refuses_another_clipping_mode(tmp_path, digits):
    _, oso = run(tmp_path / "oso", digits, {**HYPER, "clipping": "oso"}, epochs=2)
    with pytest.raises(ValueError, match="clipping='oso'"):
        run(tmp_path / "fixed", digits, HYPER, epochs=2, resume=TrainState.load(oso.checkpoints[0]))
