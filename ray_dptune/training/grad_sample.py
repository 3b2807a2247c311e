"""Which Opacus ``grad_sample_mode`` a trial trains with: ``"auto"`` resolved per model.

Every mode computes the same DP-SGD step: each example's gradient clipped to the same
norm C, summed, plus Gaussian noise of std σ·C (Opacus's ``DPOptimizer``, or the
clipping of :mod:`~ray_dptune.training.clipping`). The modes differ only in how they
get the per-sample gradient norms, so the choice is a matter of speed and never of
privacy: the plan and the account do not depend on it.

* ``"hooks"``: Opacus's per-layer per-sample gradients (any layer: layers without a
  sampler of their own go through functorch).
* ``"ew"``: torch's expanded weights; only layers whose functional op torch supports.
* ``"functorch"``: ``vmap(grad)`` over the whole model; slowest on every model measured.
* ``"ghost"``: ghost / fast gradient clipping (Li et al. 2022; Bu et al. 2023): the
  norms of Linear and Embedding layers come without materialising per-sample gradients,
  the clipped gradient from a second backward pass. It has no per-sample gradients, so
  clipping that needs them (:data:`~ray_dptune.training.clipping.PER_SAMPLE_GRADIENT_CLIPPING`)
  never gets it.

:func:`choose_grad_sample_mode` is the rule ``"auto"`` follows, calibrated by
``benchmarks/dpsgd_step.py`` (``benchmarks/results/dpsgd_step.md``): the cost of the
materialising modes grows with batch × parameters, ghost's extra cost is one more
backward pass, so ghost wins once the per-sample gradients it avoids are large. The
rule looks at the model's layers and the batch size only: no data, no timing, and the
same answer for the same model, batch size and clipping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from opacus.grad_sample import GradSampleModuleFastGradientClipping
from torch import nn

from ray_dptune.training.clipping import PER_SAMPLE_GRADIENT_CLIPPING

__all__ = [
    "AUTO",
    "GHOST_MIN_AVOIDED_FLOATS",
    "GHOST_MIN_COVERAGE",
    "GRAD_SAMPLE_MODES",
    "ConcreteMode",
    "ModeChoice",
    "ModelProfile",
    "allowed_modes",
    "choose_grad_sample_mode",
    "profile_model",
    "resolve_grad_sample_mode",
]

ConcreteMode = Literal["hooks", "ew", "functorch", "ghost"]
"""Opacus's own modes (``make_private(grad_sample_mode=...)``)."""

GRAD_SAMPLE_MODES: tuple[ConcreteMode, ...] = get_args(ConcreteMode)
AUTO = "auto"
"""Resolved per trial by :func:`choose_grad_sample_mode`."""

GHOST_MIN_AVOIDED_FLOATS = 15_000_000
"""Ghost is chosen once batch size × (parameters of ghost-normed layers) reaches this.

Below it, ghost's second backward pass (and, on sequences, its length² norms) costs more
than materialising the per-sample gradients; above it, the avoided per-sample gradients
dominate. Measured (``benchmarks/results/dpsgd_step.md``): ew fastest on the digits CNN
(64 or 256 × 8 554 ≤ 2.2 M floats) and on the one-block transformer at batch 64
(64 × 116 k ≈ 7.4 M); ghost fastest on that transformer at batch 256 (≈ 30 M) and, by
20-40×, on the 1 M-parameter MLP at batch 64 (68 M) and 256.
"""

GHOST_MIN_COVERAGE = 0.5
"""Ghost also needs most trainable parameters in layers it norms without per-sample gradients.

Other layers (convolutions, normalisation) fall back to per-sample gradients inside
ghost, so a model mostly made of them pays both costs.
"""

# Layers whose functional op torch's expanded weights support (torch.nn.utils._expanded_weights).
_EXPANDED_WEIGHT_LAYERS: tuple[type[nn.Module], ...] = (
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.Embedding,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
)


@dataclass(frozen=True)
class ModelProfile:
    """What the rule reads of a model: trainable parameters, and where they sit.

    Attributes:
        parameters: trainable parameters.
        ghost_normed: those in layers Opacus norms without per-sample gradients
            (``GradSampleModuleFastGradientClipping.NORM_SAMPLERS``: Linear, Embedding).
        expanded_weights: every trainable layer is one expanded weights supports.
    """

    parameters: int
    ghost_normed: int
    expanded_weights: bool

    @property
    def ghost_coverage(self) -> float:
        """The share of trainable parameters that ghost clipping norms (0 for a model without any)."""
        return self.ghost_normed / self.parameters if self.parameters else 0.0


@dataclass(frozen=True)
class ModeChoice:
    """The mode a trial trains with, and why."""

    mode: ConcreteMode
    reason: str


def profile_model(model: nn.Module) -> ModelProfile:
    """The :class:`ModelProfile` of ``model`` (its modules' own trainable parameters)."""
    parameters = ghost_normed = 0
    expanded_weights = True
    for module in model.modules():
        own = sum(p.numel() for p in module.parameters(recurse=False) if p.requires_grad)
        if not own:
            continue
        parameters += own
        if type(module) in GradSampleModuleFastGradientClipping.NORM_SAMPLERS:
            ghost_normed += own
        # Subclasses may override forward with other ops: only the exact types are trusted.
        if type(module) not in _EXPANDED_WEIGHT_LAYERS:
            expanded_weights = False
    return ModelProfile(parameters, ghost_normed, expanded_weights)


def allowed_modes(*, clipping: str = "fixed") -> tuple[ConcreteMode, ...]:
    """The modes a trial with ``config["clipping"] = clipping`` may use: no ghost when it needs per-sample gradients."""
    if clipping in PER_SAMPLE_GRADIENT_CLIPPING:
        return tuple(mode for mode in GRAD_SAMPLE_MODES if mode != "ghost")
    return GRAD_SAMPLE_MODES


def choose_grad_sample_mode(model: nn.Module, *, batch_size: int, clipping: str = "fixed") -> ModeChoice:
    """The rule of ``grad_sample_mode="auto"``.

    1. ``"ghost"`` when allowed (``clipping`` needs no per-sample gradients), at least
       :data:`GHOST_MIN_COVERAGE` of the trainable parameters are in ghost-normed layers,
       and batch size × those parameters ≥ :data:`GHOST_MIN_AVOIDED_FLOATS`;
    2. else ``"ew"`` when every trainable layer is one expanded weights supports;
    3. else ``"hooks"`` (works for any layer).

    ``"functorch"`` is never chosen: it was the slowest on every model measured.

    Args:
        model: the model as it will be trained (after ``ModuleValidator.fix``).
        batch_size: the expected (Poisson) batch size.
        clipping: the trial's clipping mode (:mod:`~ray_dptune.training.clipping`).

    Raises:
        ValueError: ``batch_size`` < 1, or the model has no trainable parameter.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}.")
    profile = profile_model(model)
    if not profile.parameters:
        raise ValueError("The model has no trainable parameter: DP-SGD has nothing to train.")
    avoided = batch_size * profile.ghost_normed
    if "ghost" not in allowed_modes(clipping=clipping):
        why = f"clipping={clipping!r} needs per-sample gradients (no ghost)"
    elif profile.ghost_coverage < GHOST_MIN_COVERAGE:
        why = f"only {profile.ghost_coverage:.0%} of the parameters are ghost-normed (< {GHOST_MIN_COVERAGE:.0%})"
    elif avoided < GHOST_MIN_AVOIDED_FLOATS:
        why = f"batch × ghost-normed parameters = {avoided:,} < {GHOST_MIN_AVOIDED_FLOATS:,}"
    else:
        return ModeChoice("ghost", f"batch × ghost-normed parameters = {avoided:,} ≥ {GHOST_MIN_AVOIDED_FLOATS:,}")
    if profile.expanded_weights:
        return ModeChoice("ew", f"{why}; every layer supports expanded weights")
    return ModeChoice("hooks", f"{why}; some layer is not supported by expanded weights")


def resolve_grad_sample_mode(
    requested: str, model: nn.Module, *, batch_size: int, clipping: str = "fixed"
) -> ModeChoice:
    """``requested`` itself when it is one of Opacus's modes (explicit override), else the rule's choice.

    Raises:
        ValueError: an unknown mode, or ghost with clipping that needs per-sample gradients.
    """
    if requested == AUTO:
        return choose_grad_sample_mode(model, batch_size=batch_size, clipping=clipping)
    if requested not in GRAD_SAMPLE_MODES:
        raise ValueError(f"grad_sample_mode must be one of {(*GRAD_SAMPLE_MODES, AUTO)}, got {requested!r}.")
    if requested not in allowed_modes(clipping=clipping):
        raise ValueError(f"clipping={clipping!r} needs per-sample gradients; grad_sample_mode='ghost' has none.")
    return ModeChoice(requested, "explicit")
