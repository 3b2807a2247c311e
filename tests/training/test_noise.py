"""ray_dptune.training.noise: the in-place noise is Opacus's noise, bit for bit and in distribution.

Oracles: Opacus's own optimizer from ``make_private`` (same model, batches and seeded noise
generator), whose parameters after each step must equal ours exactly; and, on a zero
gradient, the Gaussian N(0, (σ·C / expected batch size)²) per coordinate that DP-SGD adds
(chi-square test of the variance, normal-law test of the draws).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from opacus import PrivacyEngine
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping
from scipy import stats
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ray_dptune.training.noise import (
    InPlaceNoiseDPOptimizer,
    InPlaceNoiseDPOptimizerFastGradientClipping,
    with_in_place_noise,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:Secure RNG turned off", "ignore:Full backward hook is firing", "ignore:Using a non-full backward hook"
)

BATCH = 32
C = 0.5


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 5))


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(BATCH, 20, generator=generator), torch.randint(0, 5, (BATCH,), generator=generator))
        for _ in range(steps)
    ]


def trained(mode: str, *, noise_multiplier: float, in_place: bool, steps: int = 3) -> list[torch.Tensor]:
    """Parameters after ``steps`` DP-SGD steps (SGD, lr 1), Opacus's optimizer or ours."""
    module = copy.deepcopy(model())
    optimizer = torch.optim.SGD(module.parameters(), lr=1.0)
    data = batches(steps)
    private = PrivacyEngine().make_private(
        module=module,
        optimizer=optimizer,
        criterion=nn.CrossEntropyLoss(),
        data_loader=DataLoader(TensorDataset(*data[0]), batch_size=BATCH),
        noise_multiplier=noise_multiplier,
        max_grad_norm=C,
        poisson_sampling=False,
        clipping="flat",
        grad_sample_mode=mode,
        noise_generator=torch.Generator().manual_seed(7),
    )
    gsm, dp_optimizer = private[0], private[1]
    criterion = private[2] if mode == "ghost" else nn.CrossEntropyLoss()
    if in_place:
        dp_optimizer = with_in_place_noise(dp_optimizer)
        if mode == "ghost":
            criterion = DPLossFastGradientClipping(gsm, dp_optimizer, criterion.criterion, criterion.loss_reduction)
    for inputs, targets in data:
        dp_optimizer.zero_grad(set_to_none=True)
        criterion(gsm(inputs), targets).backward()
        dp_optimizer.step()
    return [p.detach().clone() for p in gsm._module.parameters()]


@pytest.mark.parametrize("noise_multiplier", [0.0, 1.3])
@pytest.mark.parametrize("mode", ["hooks", "ew", "ghost"])
def test_steps_equal_opacus_bit_for_bit(mode, noise_multiplier):
    ours = trained(mode, noise_multiplier=noise_multiplier, in_place=True)
    theirs = trained(mode, noise_multiplier=noise_multiplier, in_place=False)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)
    # The noise matters: another generator seed moves the parameters.
    if noise_multiplier:
        assert not torch.equal(ours[0], trained(mode, noise_multiplier=0.0, in_place=True)[0])


def test_with_in_place_noise_keeps_every_setting():
    params = [nn.Parameter(torch.zeros(3))]
    generator = torch.Generator()
    hook = lambda optimizer: None
    for opacus_class, ours in (
        (DPOptimizer, InPlaceNoiseDPOptimizer),
        (DPOptimizerFastGradientClipping, InPlaceNoiseDPOptimizerFastGradientClipping),
    ):
        inner = torch.optim.SGD(params, lr=0.1)
        original = opacus_class(
            inner, noise_multiplier=1.7, max_grad_norm=0.3, expected_batch_size=9, generator=generator
        )
        original.attach_step_hook(hook)
        wrapped = with_in_place_noise(original)
        assert type(wrapped) is ours
        assert wrapped.original_optimizer is inner and wrapped.generator is generator and wrapped.step_hook is hook
        settings = ("noise_multiplier", "max_grad_norm", "expected_batch_size", "loss_reduction", "secure_mode")
        assert all(getattr(wrapped, name) == getattr(original, name) for name in settings)

    class Other(DPOptimizer):
        pass

    other = Other(torch.optim.SGD(params, lr=0.1), noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=1)
    assert with_in_place_noise(other) is other


def noise_only_steps(optimizer_class, *, noise_multiplier: float, steps: int, **kwargs) -> torch.Tensor:
    """The gradients the wrapped SGD receives on a zero summed gradient: noise / expected batch size."""
    params = [nn.Parameter(torch.zeros(100, 100)), nn.Parameter(torch.zeros(37))]
    optimizer = optimizer_class(
        torch.optim.SGD(params, lr=0.0),
        noise_multiplier=noise_multiplier,
        max_grad_norm=C,
        expected_batch_size=BATCH,
        generator=torch.Generator().manual_seed(3),
        **kwargs,
    )
    seen = []
    optimizer.attach_step_hook(lambda opt: seen.append(torch.cat([p.grad.flatten().clone() for p in params])))
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        for p in params:
            p.grad = torch.zeros_like(p)  # what the second backward pass of ghost clipping leaves
        optimizer.step()
    return torch.cat(seen).double()


def test_noise_is_gaussian_with_std_sigma_c_over_batch():
    noise_multiplier = 1.3
    std = noise_multiplier * C / BATCH
    draws = noise_only_steps(InPlaceNoiseDPOptimizerFastGradientClipping, noise_multiplier=noise_multiplier, steps=20)
    n = draws.numel()  # 20 steps × 10 037 coordinates
    # Σ x² / std² ~ χ²(n): two-sided p-value, and the ratio within 6 of its standard deviations √(2/n).
    chi2 = float((draws**2).sum()) / std**2
    assert 2 * min(stats.chi2.cdf(chi2, n), stats.chi2.sf(chi2, n)) > 1e-3
    assert abs(chi2 / n - 1) < 6 * math.sqrt(2 / n)
    assert abs(float(draws.mean())) < 6 * std / math.sqrt(n)
    assert stats.kstest(draws.numpy() / std, "norm").pvalue > 1e-3
    # Opacus's optimizer on the same zero gradient draws the same numbers.
    opacus = noise_only_steps(DPOptimizerFastGradientClipping, noise_multiplier=noise_multiplier, steps=20)
    assert torch.equal(draws, opacus)
    assert torch.equal(
        noise_only_steps(InPlaceNoiseDPOptimizerFastGradientClipping, noise_multiplier=0.0, steps=2),
        torch.zeros(2 * 10_037, dtype=torch.float64),
    )


def test_secure_mode_and_adjusted_multiplier_run_opacus_own_noise():
    secure = {"noise_multiplier": 1.0, "steps": 2, "secure_mode": True}
    ours = noise_only_steps(InPlaceNoiseDPOptimizerFastGradientClipping, **secure)
    assert torch.equal(ours, noise_only_steps(DPOptimizerFastGradientClipping, **secure))
    # Secure draws are the sum of four draws halved: not the non-secure numbers.
    assert not torch.equal(ours, noise_only_steps(DPOptimizerFastGradientClipping, noise_multiplier=1.0, steps=2))

    def adjusted(optimizer_class):
        params = [nn.Parameter(torch.zeros(50))]
        optimizer = optimizer_class(
            torch.optim.SGD(params, lr=0.0),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            expected_batch_size=1,
            generator=torch.Generator().manual_seed(5),
        )
        optimizer._adjusted_noise_multiplier = 4.0  # as opacus.utils.adaptive_clipping does
        params[0].grad = torch.zeros(50)
        optimizer.step()
        return params[0].grad

    ours = adjusted(InPlaceNoiseDPOptimizerFastGradientClipping)
    assert torch.equal(ours, adjusted(DPOptimizerFastGradientClipping))
    assert float(ours.std()) > 2.0  # σ = 4, not 1


def test_opacus_still_names_its_adjusted_multiplier_as_the_fallback_expects():
    """noise.py falls back to Opacus's noise when this attribute is set: if Opacus renamed it,
    the in-place noise would use the smaller, unadjusted σ. Fails on such an Opacus release."""
    import inspect

    from opacus.utils.adaptive_clipping import adaptive_clipping_utils

    attribute = "_adjusted_noise_multiplier"
    assert attribute in inspect.getsource(DPOptimizerFastGradientClipping.add_noise)
    assert f"optimizer.{attribute} =" in inspect.getsource(adaptive_clipping_utils)


def test_a_sum_is_never_noised_twice():
    params = [nn.Parameter(torch.zeros(4))]
    optimizer = InPlaceNoiseDPOptimizerFastGradientClipping(
        torch.optim.SGD(params, lr=0.1), noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=1
    )
    params[0].grad = torch.ones(4)
    optimizer.step()
    with pytest.raises(ValueError, match="already noised"):
        optimizer.add_noise()
    params[0].grad = torch.ones(4)
    with pytest.raises(ValueError, match="already noised"):
        optimizer.step()  # no zero_grad: the noised sum would be accumulated and noised again


def test_ghost_trial_loss_zeroes_through_the_stepping_optimizer():
    from ray_dptune.training import Hyperparameters, PrivacyParams, TrainSpec
    from ray_dptune.training.loop import _prepare_run, _Randomness

    data = TensorDataset(*batches(1)[0])
    spec = TrainSpec(
        model_fn=lambda config: model(),
        data_fn=lambda config: (data, data),
        loss_fn=nn.functional.cross_entropy,
        privacy=PrivacyParams(noise_multiplier=1.0, batch_size=8, epochs=1),
        grad_sample_mode="ghost",
        seed=0,
    )
    device = torch.device("cpu")
    run = _prepare_run(
        {}, spec, spec.privacy, Hyperparameters(lr=0.1, max_grad_norm=1.0), data, None, _Randomness(0, device), device
    )
    assert type(run.optimizer) is InPlaceNoiseDPOptimizerFastGradientClipping
    assert run.criterion.optimizer is run.optimizer
