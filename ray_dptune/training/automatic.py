"""Automatic clipping: per-sample gradient normalisation, so the clipping norm is not tuned.

Reference: Bu, Wang, Zha & Karypis, "Automatic Clipping: Differentially Private Deep Learning
Made Easier and Stronger" (NeurIPS 2023, arXiv:2206.07136), AUTO-S. Each example's gradient
g_i is scaled to R·g_i / (‖g_i‖ + γ) (γ > 0 the stability constant, 0.01 in the paper): its norm
is below R whatever ‖g_i‖ is, so the clipped sum has sensitivity R under add/remove-one, as with
flat clipping at R, and one step is the same subsampled Gaussian mechanism at the same noise
multiplier σ (noise std σR): the plan and the accounting do not change (the paper's privacy
claim is this sensitivity bound). R only rescales the update and its noise together, which SGD's
learning rate absorbs and Adam cancels, so R = 1 by default and ``max_grad_norm`` leaves the
search space.

:class:`AutomaticClipDPOptimizer` normalises the per-sample gradients in place, then lets
Opacus's own flat clipping at R run on them: a no-op up to Opacus's 1e-6 margin (a further
shrink only when ‖g_i‖ > Rγ/1e-6), and the bound the accounting relies on whatever the
normalisation computed. It needs per-sample gradients (hooks, ew or functorch): Opacus's ghost
clipping computes its clipping factor inside its module and has none to normalise.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from opacus.optimizers import DPOptimizer

from ray_dptune.training.noise import InPlaceNoiseDPOptimizer, rebuilt
from ray_dptune.training.oso import per_sample_norms

__all__ = ["AUTOMATIC_CLIPPING_NORM", "AUTOMATIC_DEFAULT_STABILITY", "AutomaticClipDPOptimizer", "automatic_clipping"]

AUTOMATIC_CLIPPING_NORM = 1.0
"""R when the config sets no ``max_grad_norm``: it only rescales the step (Bu et al. set R = 1)."""

AUTOMATIC_DEFAULT_STABILITY = 0.01
"""γ, the stability constant of AUTO-S (Bu et al. use 0.01 throughout)."""


class AutomaticClipDPOptimizer(InPlaceNoiseDPOptimizer):
    """DP-SGD with each example's gradient normalised to R·g/(‖g‖ + γ) (AUTO-S), R = ``max_grad_norm``.

    Noise, ``scale_grad`` (÷ expected batch size), the step hook and the wrapped optimizer's
    step are as in :class:`~ray_dptune.training.noise.InPlaceNoiseDPOptimizer`.
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, *, stability: float = AUTOMATIC_DEFAULT_STABILITY, **kwargs: Any
    ) -> None:
        """Wraps ``optimizer``; ``kwargs`` are ``DPOptimizer``'s (noise_multiplier, max_grad_norm, ...).

        Raises:
            ValueError: ``stability`` is not a finite number > 0 (γ = 0 would divide by a zero gradient).
        """
        if isinstance(stability, bool) or not (isinstance(stability, (int, float)) and 0 < stability < math.inf):
            raise ValueError(f"The stability constant γ must be a finite number > 0, got {stability!r}.")
        super().__init__(optimizer, **kwargs)
        self.stability = float(stability)

    def clip_and_accumulate(self) -> None:
        """g_i ← R·g_i/(‖g_i‖ + γ) in place, then Opacus's flat clipping at R and sum into ``p.summed_grad``."""
        scale = self.max_grad_norm / (per_sample_norms(self.grad_samples) + self.stability)
        for p in self.params:
            chunks = p.grad_sample if isinstance(p.grad_sample, list) else [p.grad_sample]
            start = 0
            for chunk in chunks:  # micro-batches of one step, in the order Opacus concatenates them
                factor = scale[start : start + len(chunk)].to(chunk.device, chunk.dtype)
                chunk.mul_(factor.view(-1, *([1] * (chunk.dim() - 1))))
                start += len(chunk)
        super().clip_and_accumulate()


def automatic_clipping(dp_optimizer: DPOptimizer, *, stability: float = AUTOMATIC_DEFAULT_STABILITY) -> DPOptimizer:
    """``make_private``'s optimizer (flat clipping, hooks / ew / functorch) with automatic clipping instead.

    The same wrapped optimizer, σ, R, expected batch size, reduction, generator, secure mode
    and step hook (the accountant's): use it in your own Opacus loop in place of the optimizer
    ``PrivacyEngine.make_private`` returned, at ``max_grad_norm=1.0``.

    Raises:
        TypeError: ``dp_optimizer`` is not Opacus's plain ``DPOptimizer`` (ghost, per-layer,
            adaptive or distributed clipping).
    """
    if type(dp_optimizer) is not DPOptimizer and not isinstance(dp_optimizer, InPlaceNoiseDPOptimizer):
        raise TypeError(
            f"Automatic clipping replaces Opacus's flat per-sample clipping (DPOptimizer, with "
            f"grad_sample_mode 'hooks', 'ew' or 'functorch'); got {type(dp_optimizer).__name__}."
        )
    return rebuilt(dp_optimizer, AutomaticClipDPOptimizer, stability=stability)
