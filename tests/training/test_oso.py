"""OSO-DPSGD (Galli et al., Algorithm 1): the update rule, the noise split, the plan, the bounds.

Oracles: hand-computed C_t, ρ_t and weights on a two-example toy with the noise switched
off (Eqs. 20-21); the closed form α/(2ν²) of the Gaussian's RDP for Proposition 1's split;
the noise stds the optimizer actually draws; the joint sensitivity of the pair measured
by adding one example; plain DP-SGD's plan for the trainable. No Ray session is started.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from ray_dptune.accounting import RDPCurve
from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.training import digits_cnn, digits_data, dp_trainable, train
from ray_dptune.training import oso as oso_module
from ray_dptune.training.oso import LOG_LIMIT, OSODPOptimizer, default_noise_multiplier_q, gradient_noise_multiplier

pytestmark = pytest.mark.filterwarnings("ignore:Secure RNG turned off")

ORDERS = np.array([1.5, 2.0, 4.0, 8.0, 32.0, 256.0])


def make_optimizer(rho_0=0.5, clip_0=1.0, rho_c=0.1, rho_r=0.2, nu=1.0, nu_q=8.0, batch=2, generator=None):
    weight = nn.Parameter(torch.zeros(2))
    sgd = torch.optim.SGD([weight], lr=rho_0)
    optimizer = OSODPOptimizer(
        sgd,
        noise_multiplier=nu,
        noise_multiplier_q=nu_q,
        max_grad_norm=clip_0,
        clip_rate=rho_c,
        lr_rate=rho_r,
        expected_batch_size=batch,
        generator=generator,
    )
    return weight, optimizer


def step(weight, optimizer, *per_sample_grads):
    """One step on given per-sample gradients (what a GradSampleModule would store)."""
    optimizer.zero_grad()
    weight.grad_sample = torch.tensor(per_sample_grads, dtype=torch.float32).reshape(-1, 2)
    optimizer.step()
    return weight.grad.clone()


@pytest.fixture
def no_noise(monkeypatch):
    monkeypatch.setattr(oso_module, "gaussian_noise", lambda std, reference, **kwargs: torch.zeros_like(reference))


# ---------------------------------------------------------------------------- update rule
def test_update_rule_by_hand(no_noise):
    """Eqs. (20)-(21) on two examples per step, C_0 = 1, ρ_0 = 0.5, ρ_c = 0.1, ρ_r = 0.2, no noise."""
    weight, optimizer = make_optimizer()
    # Step 1 at C_0 = 1: (3, 4) is clipped to (0.6, 0.8), direction q = (0.6, 0.8); (0, 0.5) is not (q = 0).
    g1 = step(weight, optimizer, (3.0, 4.0), (0.0, 0.5))
    torch.testing.assert_close(g1, torch.tensor([0.3, 0.65]))  # g̃_1 = mean of the clipped gradients
    torch.testing.assert_close(optimizer._previous_q[0], torch.tensor([0.3, 0.4]))  # q̃_1
    # q̃_0 = g̃_0 = 0: sign 0, so C_1 = C_0 and ρ_1 = ρ_0.
    assert (optimizer.max_grad_norm, optimizer.lr) == (1.0, 0.5)
    torch.testing.assert_close(weight.detach(), -0.5 * g1)

    # Step 2 at C_1 = 1: (-2, 0) clipped to (-1, 0), q = (-1, 0); (0.1, 0.2) kept.
    g2 = step(weight, optimizer, (-2.0, 0.0), (0.1, 0.2))
    torch.testing.assert_close(g2, torch.tensor([-0.45, 0.1]))
    # g̃_2·q̃_1 = -0.135 + 0.04 < 0 and g̃_2·g̃_1 = -0.135 + 0.065 < 0: both shrink.
    assert optimizer.max_grad_norm == pytest.approx(math.exp(-0.1))  # C_2
    assert optimizer.lr == pytest.approx(0.5 * math.exp(-0.2))  # ρ_2
    torch.testing.assert_close(weight.detach(), -0.5 * g1 - 0.5 * g2)  # step 2 used ρ_1, not ρ_2

    # Step 3 at C_2 = e^-0.1: (-3, 0) clipped to (-C_2, 0); g̃_3 = (-C_2/2, 0) agrees with q̃_2 and g̃_2.
    weight_before = weight.detach().clone()
    g3 = step(weight, optimizer, (-3.0, 0.0), (0.0, 0.0))
    torch.testing.assert_close(g3, torch.tensor([-math.exp(-0.1) / 2, 0.0]))
    assert optimizer.max_grad_norm == pytest.approx(1.0)  # C_3 = C_2·e^0.1
    assert optimizer.lr == pytest.approx(0.5)  # ρ_3 = ρ_2·e^0.2
    torch.testing.assert_close(weight.detach(), weight_before - 0.5 * math.exp(-0.2) * g3)  # at ρ_2


def test_zero_rates_give_plain_dpsgd(no_noise):
    weight, optimizer = make_optimizer(rho_c=0.0, rho_r=0.0)
    for grads in [((3.0, 4.0), (0.0, 0.5)), ((-2.0, 0.0), (0.1, 0.2)), ((1.0, 1.0), (2.0, 2.0))]:
        step(weight, optimizer, *grads)
        assert (optimizer.max_grad_norm, optimizer.lr) == (1.0, 0.5)


@pytest.mark.parametrize("rate", [50.0, 1e6], ids=["rate-50", "rate-1e6"])
def test_threshold_and_learning_rate_stay_finite_and_positive(rate):
    """Extreme ρ_c = ρ_r, real noise, 300 steps: C_t, ρ_t stay in [e^-30, e^30] and the weights finite."""
    generator = torch.Generator().manual_seed(0)
    weight, optimizer = make_optimizer(rho_c=rate, rho_r=rate, batch=4, generator=generator)
    seen = []
    grads = torch.randn((300, 4, 2), generator=torch.Generator().manual_seed(1)) * 10.0
    for per_sample in grads:
        optimizer.zero_grad()
        weight.grad_sample = per_sample
        optimizer.step()
        seen.append((optimizer.max_grad_norm, optimizer.lr))
    values = np.array(seen)
    assert np.all(np.isfinite(values)) and np.all(values > 0)
    assert np.all(np.abs(np.log(values)) <= LOG_LIMIT + 1e-9)
    assert np.abs(np.log(values)).max() == pytest.approx(LOG_LIMIT)  # the clamp was reached and held


# ---------------------------------------------------------------------------- Proposition 1
@pytest.mark.parametrize(
    "nu, nu_q",
    [(0.5, 0.6), (1.0, 2.0), (2.5, default_noise_multiplier_q(noise_multiplier=2.5)), (10.0, 1e3)],
    ids=["tight", "twice", "rule-of-thumb", "large"],
)
def test_split_composes_to_one_gaussian_at_nu(nu, nu_q):
    """Gaussian(ν_g) on the gradient (sensitivity C) ∘ Gaussian(ν_q) on Σq (sensitivity 1) = Gaussian(ν)."""
    nu_g = gradient_noise_multiplier(noise_multiplier=nu, noise_multiplier_q=nu_q)
    assert nu_g > nu
    composed = RDPCurve.gaussian(noise_multiplier=nu_g, orders=ORDERS) + RDPCurve.gaussian(
        noise_multiplier=nu_q, orders=ORDERS
    )
    np.testing.assert_allclose(composed.epsilons, ORDERS / (2 * nu**2), rtol=1e-12)
    np.testing.assert_allclose(
        composed.epsilons, RDPCurve.gaussian(noise_multiplier=nu, orders=ORDERS).epsilons, rtol=1e-12
    )


def test_rule_of_thumb_is_one_percent_more_gradient_noise():
    assert default_noise_multiplier_q(noise_multiplier=1.0) == pytest.approx(
        7.124, abs=1e-3
    )  # Galli et al., after Prop. 1
    assert gradient_noise_multiplier(
        noise_multiplier=3.0, noise_multiplier_q=default_noise_multiplier_q(noise_multiplier=3.0)
    ) == pytest.approx(3.03)


def test_drawn_noise_has_the_split_stds(monkeypatch):
    drawn = []

    def record(std, reference, **kwargs):
        drawn.append(std)
        return torch.zeros_like(reference)

    monkeypatch.setattr(oso_module, "gaussian_noise", record)
    nu, nu_q, clip = 1.5, 4.0, 0.7
    weight, optimizer = make_optimizer(clip_0=clip, nu=nu, nu_q=nu_q, rho_c=0.0)
    step(weight, optimizer, (3.0, 4.0), (0.0, 0.5))
    gradient_std, direction_std = drawn
    # In noise-multiplier units (std / sensitivity): gradient std/C, direction std/1.
    assert (gradient_std / clip) ** -2 + direction_std**-2 == pytest.approx(nu**-2)
    assert direction_std == nu_q and gradient_std == pytest.approx(
        gradient_noise_multiplier(noise_multiplier=nu, noise_multiplier_q=nu_q) * clip
    )


def test_one_example_moves_the_pair_by_at_most_one_multiplier_unit():
    """Joint sensitivity: adding an example moves (Σḡ/(ν_g C), Σq/ν_q) by at most 1/ν (Proposition 1)."""
    nu, nu_q, clip = 1.0, 3.0, 0.5
    weight, optimizer = make_optimizer(clip_0=clip, nu=nu, nu_q=nu_q)
    nu_g = optimizer.gradient_noise_multiplier
    rng = torch.Generator().manual_seed(0)
    batch = torch.randn((6, 2), generator=rng)

    def sums(per_sample):
        optimizer.zero_grad()
        weight.grad_sample = per_sample
        optimizer.clip_and_accumulate()
        return weight.summed_grad.clone(), optimizer._summed_q[0].clone()

    base_grad, base_q = sums(batch)
    shifts = []
    for extra in torch.cat([torch.randn((200, 2), generator=rng) * 3, torch.tensor([[0.0, 0.0], [0.5, 0.0]])]):
        grad, q = sums(torch.cat([batch, extra[None]]))
        shifts.append(((grad - base_grad).norm() / (nu_g * clip)) ** 2 + ((q - base_q).norm() / nu_q) ** 2)
    assert max(shifts) <= nu**-2 * (1 + 1e-6)
    assert max(shifts) == pytest.approx(nu**-2, rel=1e-4)  # a clipped example attains it


@pytest.mark.parametrize("nu_q", [1.0, 0.5], ids=["equal", "smaller"])
def test_nu_q_must_exceed_nu(nu_q):
    with pytest.raises(ValueError, match="Proposition 1"):
        make_optimizer(nu=1.0, nu_q=nu_q)


def test_negative_rate_is_refused():
    with pytest.raises(ValueError, match="clip_rate must be a finite number >= 0"):
        make_optimizer(rho_c=-0.1)


# ---------------------------------------------------------------------------- the trainable
@pytest.mark.slow
def test_oso_trial_reports_plain_dpsgd_plan(tmp_path):
    digits = digits_data()
    trainable = dp_trainable(digits_cnn, lambda config: digits, noise_multiplier=1.2, batch_size=64, epochs=1, seed=0)
    reports = {}
    for mode in ("fixed", "oso"):
        config = {"lr": 0.5, "max_grad_norm": 0.5, "clipping": mode}
        spent = train(config, trainable.spec, lambda metrics, directory, mode=mode: reports.update({mode: metrics}))
        assert spent == TrialSpend(sample_rate=64 / 1437, noise_multiplier=1.2, steps=22)
    assert reports["oso"]["dp_plan"] == reports["fixed"]["dp_plan"]
    assert reports["oso"]["dp_spent"] == reports["fixed"]["dp_spent"]
    space = {"lr": 0.5, "max_grad_norm": 0.5, "clipping": "oso", "oso_noise_multiplier_q": 2.0}
    assert trainable.privacy_plan(space) == TrialSpend.from_dict(reports["fixed"]["dp_plan"])
