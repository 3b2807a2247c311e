"""How a trial clips: ``config["clipping"]`` and its options, validated before training.

* ``"fixed"`` (default): Opacus's flat clipping at C = ``max_grad_norm``; the optimizer steps at ``lr``.
* ``"quantile"``: C_0 = ``max_grad_norm`` tracks the γ-quantile of the per-sample
  gradient norms (Andrew et al. 2021); keys ``target_quantile`` (γ, default 0.5),
  ``clipbound_lr`` (η_C, 0.2), ``unclipped_num_std`` (σ_b, batch_size / 20).
* ``"oso"``: OSO-DPSGD (Galli et al., Algorithm 1) learns C_t from C_0 = ``max_grad_norm``
  and SGD's ρ_t from ρ_0 = ``lr``; keys ``oso_rho_c`` (ρ_c, 2.5e-3), ``oso_rho_r``
  (ρ_r, 2.5e-3), ``oso_noise_multiplier_q`` (ν_q, ≈ 7.124·ν).
* ``"automatic"``: each example's gradient normalised to R·g/(‖g‖ + γ) (Bu et al. 2023,
  AUTO-S: :mod:`~ray_dptune.training.automatic`), R = ``max_grad_norm`` (default 1: R only
  rescales the step, so it is not searched); key ``automatic_stability`` (γ, 0.01).

Every mode costs exactly what plain DP-SGD at the trial's ``noise_multiplier`` ν costs
per step (the adaptive modes split ν between the gradient and their statistic:
:mod:`~ray_dptune.training.quantile`, :mod:`~ray_dptune.training.oso`), so the clipping
keys are not privacy keys and the plan does not depend on them. Keys of other modes
than the trial's are ignored (a search may tune the mode).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Real
from typing import Any, Literal, Protocol, cast, get_args, runtime_checkable

from opacus.optimizers import DPOptimizer

from ray_dptune.training.automatic import AUTOMATIC_DEFAULT_STABILITY, automatic_clipping
from ray_dptune.training.noise import rebuilt, with_in_place_noise
from ray_dptune.training.oso import (
    OSO_DEFAULT_RATE,
    OSODPOptimizer,
    default_noise_multiplier_q,
    gradient_noise_multiplier,
)
from ray_dptune.training.quantile import (
    QUANTILE_DEFAULT_CLIPBOUND_LR,
    QUANTILE_DEFAULT_TARGET,
    QuantileClipDPOptimizer,
    default_unclipped_num_std,
    quantile_gradient_noise_multiplier,
)

__all__ = [
    "PER_SAMPLE_GRADIENT_CLIPPING",
    "AutomaticClipping",
    "Clipping",
    "ClippingMode",
    "FixedClipping",
    "OSOClipping",
    "QuantileClipping",
    "StatefulClipping",
    "clipping_from_config",
    "clipping_state",
    "restore_clipping_state",
]

ClippingMode = Literal["fixed", "quantile", "oso", "automatic"]
"""The values of ``config["clipping"]``."""

PER_SAMPLE_GRADIENT_CLIPPING: frozenset[str] = frozenset({"quantile", "oso", "automatic"})
"""Modes that read per-sample gradients: never trained with ``grad_sample_mode="ghost"``
(``"auto"`` avoids it for them: :mod:`~ray_dptune.training.grad_sample`)."""

_PER_SAMPLE_GRADIENTS_NEEDED = (
    "clipping={mode!r} needs per-sample gradients; grad_sample_mode='ghost' has none: use 'auto' (the default) or 'ew'."
)


@runtime_checkable
class StatefulClipping(Protocol):
    """An optimizer whose clipping state must survive a checkpoint."""

    def clipping_state_dict(self) -> dict[str, Any]:
        """The clipping state a checkpoint must keep to continue the same sequence."""
        ...

    def load_clipping_state_dict(self, state: dict[str, Any]) -> None:
        """Restores the state :meth:`clipping_state_dict` returned."""
        ...


@dataclass(frozen=True)
class FixedClipping:
    """Opacus's flat clipping at ``config["max_grad_norm"]``."""

    mode: ClippingMode = "fixed"

    def wrap(self, dp_optimizer: DPOptimizer) -> DPOptimizer:
        """``make_private``'s optimizer, its noise drawn into ``p.grad`` (:mod:`~ray_dptune.training.noise`)."""
        return with_in_place_noise(dp_optimizer)


@dataclass(frozen=True)
class QuantileClipping:
    """Quantile-adaptive clipping (:class:`~ray_dptune.training.quantile.QuantileClipDPOptimizer`)."""

    target_quantile: float
    clipbound_lr: float
    unclipped_num_std: float
    mode: ClippingMode = "quantile"

    def wrap(self, dp_optimizer: DPOptimizer) -> DPOptimizer:
        """The same SGD, noise, reduction, generator and step hook, clipped adaptively from C_0 = ``max_grad_norm``."""
        return rebuilt(
            dp_optimizer,
            QuantileClipDPOptimizer,
            target_unclipped_quantile=self.target_quantile,
            clipbound_learning_rate=self.clipbound_lr,
            unclipped_num_std=self.unclipped_num_std,
        )


@dataclass(frozen=True)
class OSOClipping:
    """OSO-DPSGD (:class:`~ray_dptune.training.oso.OSODPOptimizer`)."""

    rho_c: float
    rho_r: float
    noise_multiplier_q: float
    mode: ClippingMode = "oso"

    def wrap(self, dp_optimizer: DPOptimizer) -> DPOptimizer:
        """The same SGD (ρ_0 = ``lr``), noise, reduction, generator and step hook, from C_0 = ``max_grad_norm``."""
        return rebuilt(
            dp_optimizer,
            OSODPOptimizer,
            noise_multiplier_q=self.noise_multiplier_q,
            clip_rate=self.rho_c,
            lr_rate=self.rho_r,
        )


@dataclass(frozen=True)
class AutomaticClipping:
    """Per-sample normalisation (:class:`~ray_dptune.training.automatic.AutomaticClipDPOptimizer`)."""

    stability: float
    mode: ClippingMode = "automatic"

    def wrap(self, dp_optimizer: DPOptimizer) -> DPOptimizer:
        """The same SGD or Adam, noise and generator, each example normalised at R = ``max_grad_norm``."""
        return automatic_clipping(dp_optimizer, stability=self.stability)


Clipping = FixedClipping | QuantileClipping | OSOClipping | AutomaticClipping


def clipping_from_config(
    config: Mapping[str, Any],
    *,
    noise_multiplier: float,
    batch_size: int,
    grad_sample_mode: str,
    optimizer: str,
) -> Clipping:
    """The trial's clipping, from ``config["clipping"]`` (default "fixed") and its keys.

    Args:
        config: the trial's config.
        noise_multiplier: the trial's ν.
        batch_size: the trial's expected batch size (for σ_b's default).
        grad_sample_mode: Opacus's per-sample gradient mode, or "auto" (never ghost here).
        optimizer: "sgd" or "adam".

    Raises:
        ValueError: an unknown mode, a value out of range, ν_q <= ν (OSO) or
            ν >= 2σ_b (quantile), ghost clipping with an adaptive mode, or Adam with OSO.
    """
    mode = config.get("clipping", "fixed")
    if mode not in get_args(ClippingMode):
        raise ValueError(f"config['clipping'] must be one of {get_args(ClippingMode)}, got {mode!r}.")
    if mode == "fixed":
        return FixedClipping()
    if grad_sample_mode == "ghost" and mode in PER_SAMPLE_GRADIENT_CLIPPING:
        raise ValueError(_PER_SAMPLE_GRADIENTS_NEEDED.format(mode=mode))
    if mode == "automatic":
        stability = _number(config, "automatic_stability", AUTOMATIC_DEFAULT_STABILITY, low=0.0)
        if stability == 0:
            raise ValueError("config['automatic_stability'] (γ) must be > 0: γ = 0 divides by a zero gradient.")
        return AutomaticClipping(stability=stability)
    if mode == "quantile":
        settings = QuantileClipping(
            target_quantile=_number(config, "target_quantile", QUANTILE_DEFAULT_TARGET, low=0.0, high=1.0),
            clipbound_lr=_number(config, "clipbound_lr", QUANTILE_DEFAULT_CLIPBOUND_LR, low=0.0),
            unclipped_num_std=_number(config, "unclipped_num_std", default_unclipped_num_std(batch_size), low=0.0),
        )
        quantile_gradient_noise_multiplier(
            noise_multiplier=noise_multiplier, unclipped_num_std=settings.unclipped_num_std
        )
        return settings
    if optimizer != "sgd":
        raise ValueError(
            f"clipping='oso' learns SGD's learning rate (Galli et al. derive it for SGD only); got optimizer={optimizer!r}."
        )
    oso = OSOClipping(
        rho_c=_number(config, "oso_rho_c", OSO_DEFAULT_RATE, low=0.0),
        rho_r=_number(config, "oso_rho_r", OSO_DEFAULT_RATE, low=0.0),
        noise_multiplier_q=_number(
            config, "oso_noise_multiplier_q", default_noise_multiplier_q(noise_multiplier=noise_multiplier), low=0.0
        ),
    )
    gradient_noise_multiplier(noise_multiplier=noise_multiplier, noise_multiplier_q=oso.noise_multiplier_q)
    return oso


def _number(config: Mapping[str, Any], key: str, default: float, *, low: float, high: float = math.inf) -> float:
    """``config[key]`` (or ``default``), a finite real in [low, high]."""
    value = config.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, Real)
        or not low <= cast(float, value) <= high
        or math.isinf(value)
    ):
        raise ValueError(f"config[{key!r}] must be a finite number in [{low:g}, {high:g}], got {value!r}.")
    return float(value)


def clipping_state(clipping: Clipping, optimizer: DPOptimizer) -> dict[str, Any] | None:
    """What a checkpoint keeps of the clipping: the mode and the optimizer's state; None for fixed."""
    if not isinstance(optimizer, StatefulClipping):
        return None
    return {"mode": clipping.mode, **optimizer.clipping_state_dict()}


def restore_clipping_state(clipping: Clipping, optimizer: DPOptimizer, state: dict[str, Any] | None) -> None:
    """Puts a checkpoint's :func:`clipping_state` back into the trial's optimizer.

    Raises:
        ValueError: the checkpoint was taken in another clipping mode.
    """
    saved_mode = "fixed" if state is None else state.get("mode")
    if saved_mode != clipping.mode:
        raise ValueError(f"The checkpoint was trained with clipping={saved_mode!r}, this trial uses {clipping.mode!r}.")
    if isinstance(optimizer, StatefulClipping):
        optimizer.load_clipping_state_dict(cast(dict[str, Any], state))  # None only for fixed clipping
