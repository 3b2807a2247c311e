"""Quantile-adaptive clipping: Opacus's ``AdaClipDPOptimizer``, made to match the theorem it cites.

Reference: Andrew, Thakkar, McMahan, Ramaswamy, "Differentially Private Learning with
Adaptive Clipping" (NeurIPS 2021, arXiv:1905.03871), Algorithm 1 and Theorem 1.

Each step releases the clipped-gradient sum (noise std σ_g·C_t) and a count of
unclipped examples (noise std σ_b); C_{t+1} = C_t·exp(−η_C(b̃ − γ)) with b̃ the noisy
unclipped fraction and γ the target quantile. Theorem 1: if the count has sensitivity ½,
the pair costs one Gaussian of multiplier ν when σ_g = (ν⁻² − (2σ_b)⁻²)^(-1/2), which is
the split Opacus 1.6's ``add_noise`` applies. But Opacus releases Σ b_i (b_i = 1 if
unclipped), whose sensitivity under add/remove adjacency is 1, so its pair costs
multiplier (ν⁻² + ¾σ_b⁻²)^(-1/2) < ν, not ν; and its fraction divides by the realised
batch size, which Poisson sampling keeps private. :class:`QuantileClipDPOptimizer`
releases Σ (b_i − ½) instead (each example moves it by ½; the proof of Theorem 1) and
divides by the expected batch size, as TF Privacy's ``QuantileEstimatorQuery`` does
(it also clamps the fraction to [0, 1], as here). Then Theorem 1 holds, and each step is accounted as plain DP-SGD at ν.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
from opacus.optimizers import AdaClipDPOptimizer, DPOptimizer

from ray_dptune.training.oso import LOG_LIMIT, per_sample_norms

__all__ = [
    "QUANTILE_DEFAULT_CLIPBOUND_LR",
    "QUANTILE_DEFAULT_TARGET",
    "QuantileClipDPOptimizer",
    "default_unclipped_num_std",
    "quantile_gradient_noise_multiplier",
]

QUANTILE_DEFAULT_TARGET = 0.5
"""γ, the target fraction of unclipped examples (the median; Andrew et al. try 0.1-0.9)."""

QUANTILE_DEFAULT_CLIPBOUND_LR = 0.2
"""η_C, the paper's learning rate of the geometric update (also Galli et al.'s setting)."""

_NORM_EPSILON = 1e-6  # Opacus's margin in C / (norm + 1e-6)


def quantile_gradient_noise_multiplier(*, noise_multiplier: float, unclipped_num_std: float) -> float:
    """σ_g = (ν⁻² − (2σ_b)⁻²)^(-1/2), the gradient's share for a count of sensitivity ½ (Theorem 1).

    Raises:
        ValueError: ν >= 2σ_b (the count would need all the budget, or more).
    """
    if not 0 < noise_multiplier < 2 * unclipped_num_std:
        raise ValueError(
            f"Quantile clipping needs noise_multiplier < 2 * unclipped_num_std (Andrew et al. 2021, "
            f"Theorem 1), got ν = {noise_multiplier} and unclipped_num_std = {unclipped_num_std}: "
            f"set config['unclipped_num_std'] above {noise_multiplier / 2:g}."
        )
    return cast(float, (noise_multiplier**-2 - (2 * unclipped_num_std) ** -2) ** -0.5)  # real: 2σ_b > ν > 0


def default_unclipped_num_std(expected_batch_size: float) -> float:
    """σ_b = m/20 for an expected batch of m examples, Andrew et al.'s recommendation."""
    return expected_batch_size / 20


class QuantileClipDPOptimizer(AdaClipDPOptimizer):  # type: ignore[misc]  # Opacus is untyped
    """Opacus's adaptive clipping with a count of sensitivity ½ and a public divisor (see the module).

    ``noise_multiplier`` is ν, the accounted multiplier (Opacus's noise split applies
    :func:`quantile_gradient_noise_multiplier` to it); ``max_grad_norm`` is C_t.
    Examples whose gradient is exactly 0 (the loop's zero-weighted placeholder for an
    empty Poisson batch) add 0 to the count, so it never moves by more than ½.
    """

    max_grad_norm: float
    unclipped_num: float | torch.Tensor

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        noise_multiplier: float,
        max_grad_norm: float,
        target_unclipped_quantile: float = QUANTILE_DEFAULT_TARGET,
        clipbound_learning_rate: float = QUANTILE_DEFAULT_CLIPBOUND_LR,
        unclipped_num_std: float,
        expected_batch_size: int,
        loss_reduction: str = "mean",
        generator: torch.Generator | None = None,
        secure_mode: bool = False,
    ) -> None:
        """Wraps ``optimizer``; C_t stays in [e^-30, e^30] (:data:`~ray_dptune.training.oso.LOG_LIMIT`).

        Raises:
            ValueError: ν >= 2σ_b.
        """
        quantile_gradient_noise_multiplier(noise_multiplier=noise_multiplier, unclipped_num_std=unclipped_num_std)
        super().__init__(
            optimizer,
            noise_multiplier=noise_multiplier,
            target_unclipped_quantile=target_unclipped_quantile,
            clipbound_learning_rate=clipbound_learning_rate,
            max_clipbound=math.exp(LOG_LIMIT),
            min_clipbound=math.exp(-LOG_LIMIT),
            unclipped_num_std=unclipped_num_std,
            max_grad_norm=min(max(max_grad_norm, math.exp(-LOG_LIMIT)), math.exp(LOG_LIMIT)),
            expected_batch_size=expected_batch_size,
            loss_reduction=loss_reduction,
            generator=generator,
            secure_mode=secure_mode,
        )

    def clip_and_accumulate(self) -> None:
        """Clips as ``DPOptimizer`` does and adds Σ (b_i − ½) to the count (0 for zero gradients)."""
        norms = per_sample_norms(self.grad_samples)
        clip_factor = (self.max_grad_norm / (norms + _NORM_EPSILON)).clamp(max=1.0)
        half = torch.where(clip_factor < 1.0, -0.5, 0.5) * (norms > 0)
        self.sample_size += len(norms)
        self.unclipped_num = self.unclipped_num + half.sum()
        DPOptimizer.clip_and_accumulate(self)  # plain DP-SGD clipping (AdaClip's would count its own bits)

    def update_max_grad_norm(self) -> None:
        """C_{t+1} = C_t·exp(−η_C(b̃ − γ)), b̃ = (noisy Σ (b_i − ½) + m/2) / m in [0, 1], m the expected batch size."""
        expected = self.expected_batch_size * self.accumulated_iterations
        unclipped_fraction = min(max((float(self.unclipped_num) + expected / 2) / expected, 0.0), 1.0)
        log_clip = math.log(self.max_grad_norm) - self.clipbound_learning_rate * (
            unclipped_fraction - self.target_unclipped_quantile
        )
        self.max_grad_norm = math.exp(min(max(log_clip, -LOG_LIMIT), LOG_LIMIT))

    def clipping_state_dict(self) -> dict[str, Any]:
        """C_t, what a resumed run needs to continue the same sequence."""
        return {"max_grad_norm": self.max_grad_norm}

    def load_clipping_state_dict(self, state: dict[str, Any]) -> None:
        """Restores :meth:`clipping_state_dict`'s values."""
        self.max_grad_norm = float(state["max_grad_norm"])
