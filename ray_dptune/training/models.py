"""Ready-made model for examples and tests: a small Tanh CNN for 8×8 digits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

__all__ = ["digits_cnn"]


def digits_cnn(config: Mapping[str, Any] | None = None) -> nn.Sequential:
    """A small CNN for :func:`~ray_dptune.training.data.digits_data`, built for DP-SGD.

    conv 3×3 (``channels``) → tanh → average-pool 2 → linear (``hidden``) → tanh →
    linear (10 logits); 8 714 parameters with the defaults. Bounded activations suit
    DP-SGD better than ReLU (Papernot et al. 2021, "Tempered Sigmoid Activations for
    Deep Learning with Differential Privacy", arXiv:2007.14191), and there is no
    BatchNorm, which Opacus refuses.

    Measured with DP-SGD (σ = 2.5, clipping 1.0, batch 64, 15 epochs, 3 seeds):
    validation accuracy ≈ 0.89 at lr 0.5, 0.82 at lr 1 and 0.58 at lr 2.

    Args:
        config: the trial's config; optional keys ``channels`` (default 16) and
            ``hidden`` (default 32).

    Returns:
        The model, mapping ``batch x 1 x 8 x 8`` inputs to ``batch x 10`` logits.
    """
    config = config or {}
    channels = int(config.get("channels", 16))
    hidden = int(config.get("hidden", 32))
    return nn.Sequential(
        nn.Conv2d(1, channels, kernel_size=3, padding=1),
        nn.Tanh(),
        nn.AvgPool2d(2),
        nn.Flatten(),
        nn.Linear(channels * 4 * 4, hidden),
        nn.Tanh(),
        nn.Linear(hidden, 10),
    )
