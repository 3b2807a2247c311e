"""DP-SGD's Gaussian noise without Opacus's per-step copies: the same mechanism, bit for bit.

Opacus's ``add_noise`` (non-secure mode) sets, per parameter,
``p.grad = p.summed_grad + torch.normal(0, σ·C, size=p.summed_grad.shape, generator=g)``:
a zero tensor it discards, the noise and the sum, three fresh tensors of the parameter's
size per step, on top of ghost clipping's copy of ``p.grad`` into ``p.summed_grad``. On a
model of 1 M parameters these allocations (page faults included) cost about as much as
drawing the noise itself (``benchmarks/results/dpsgd_step.md``).

The optimizers here draw the same noise into memory that already exists:
``target.normal_(0, σ·C, generator=g)`` then ``target += p.summed_grad`` and
``p.grad = target``. ``torch.normal(size=...)`` is ``normal_`` on a fresh contiguous
tensor, so from the same generator state the draws are the same numbers in the same
order, and ``noise + sum`` equals ``sum + noise`` in floating point: the noised gradient
is Opacus's, bit for bit (``tests/training/test_noise.py``). Clipping, ``scale_grad`` (÷ expected
batch size), the step hook and the wrapped optimizer's step are Opacus's own.

* :class:`InPlaceNoiseDPOptimizer` (hooks / ew / functorch): the noise goes into ``p.grad``,
  the raw gradient Opacus would discard.
* :class:`InPlaceNoiseDPOptimizerFastGradientClipping` (ghost): ``accumulate`` takes the
  second backward pass's ``p.grad`` as the sum instead of copying it, the noise goes into a
  buffer per parameter kept across steps (which is ``p.grad`` after a step), and
  ``zero_grad`` always sets ``p.grad`` to None (torch's default): Opacus's ghost loss calls
  ``zero_grad()`` between its two passes, and zeros there would make the second pass add
  into them instead of handing its gradient over.

Opacus's own ``add_noise`` runs in ``secure_mode`` (Holohan & Braghin's sampler, four
draws summed) and on an optimizer where Opacus's adaptive-clipping utilities set an
adjusted noise multiplier. A target is used only when it is a contiguous tensor of the
sum's shape, dtype and device owning its whole storage and sharing none of the sum's;
otherwise the noise goes into a fresh tensor. As in Opacus, a sum is never noised twice:
``add_noise`` on a sum already noised raises.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeGuard

import torch
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping

__all__ = ["InPlaceNoiseDPOptimizer", "InPlaceNoiseDPOptimizerFastGradientClipping", "rebuilt", "with_in_place_noise"]

_NOISED = "_ray_dptune_noised"  # set on a summed gradient once its noise is added
# Opacus's adaptive clipping (opacus.utils.adaptive_clipping) noises with this instead of noise_multiplier.
_ADJUSTED_NOISE_MULTIPLIER = "_adjusted_noise_multiplier"

if TYPE_CHECKING:

    class _DPOptimizerBase:
        """What the mixin below uses of Opacus's ``DPOptimizer``, which ships no type hints."""

        secure_mode: bool
        noise_multiplier: float
        max_grad_norm: float
        generator: torch.Generator | None
        params: list[Any]  # parameters carrying Opacus's summed_grad and grad_sample

        def add_noise(self) -> None: ...

else:
    _DPOptimizerBase = object


class _InPlaceNoise(_DPOptimizerBase):
    """``add_noise`` drawing into existing memory; mixed into Opacus's optimizers below."""

    def add_noise(self) -> None:
        if self.secure_mode or hasattr(self, _ADJUSTED_NOISE_MULTIPLIER):
            super().add_noise()
            return
        std = self.noise_multiplier * self.max_grad_norm
        for p in self.params:
            summed = p.summed_grad
            if getattr(summed, _NOISED, False):
                raise ValueError("This summed gradient was already noised: call zero_grad() before the next step.")
            target = self._noise_target(p, summed)
            if std == 0:
                target.zero_()  # as Opacus: zeros, and no draw from the generator
            else:
                target.normal_(0.0, std, generator=self.generator)
            p.grad = target.add_(summed).view_as(p)
            setattr(summed, _NOISED, True)

    def _noise_target(self, p: torch.Tensor, summed: torch.Tensor) -> torch.Tensor:
        return p.grad if _reusable(p.grad, summed) else _fresh(summed)


class InPlaceNoiseDPOptimizer(_InPlaceNoise, DPOptimizer):  # type: ignore[misc]  # Opacus is untyped
    """Opacus's :class:`~opacus.optimizers.DPOptimizer` (flat clipping), its noise drawn into ``p.grad``."""


class InPlaceNoiseDPOptimizerFastGradientClipping(
    _InPlaceNoise,
    DPOptimizerFastGradientClipping,  # type: ignore[misc]  # Opacus is untyped
):
    """Opacus's ghost-clipping optimizer without its copies: the sum taken over, the noise in a kept buffer.

    The buffer (one tensor per parameter) is ``p.grad`` after a step and is overwritten by
    the next step's noise: copy ``p.grad`` to keep a step's gradient.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._buffers: dict[int, torch.Tensor] = {}

    def accumulate(self) -> None:
        """Opacus's, without the copy: the first backward's ``p.grad`` becomes ``p.summed_grad``."""
        for p in self.params:
            if p.summed_grad is not None:
                p.summed_grad.add_(p.grad.data)
            else:
                p.summed_grad, p.grad = p.grad.detach(), None

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Opacus's, with ``set_to_none=True`` whatever is asked (see the module's notes)."""
        super().zero_grad(set_to_none=True)

    def _noise_target(self, p: torch.Tensor, summed: torch.Tensor) -> torch.Tensor:
        buffer = self._buffers.get(id(p))
        if buffer is None or not _reusable(buffer, summed):
            buffer = self._buffers[id(p)] = _fresh(summed)
        return buffer


_IN_PLACE = {
    DPOptimizer: InPlaceNoiseDPOptimizer,
    DPOptimizerFastGradientClipping: InPlaceNoiseDPOptimizerFastGradientClipping,
}


def with_in_place_noise(dp_optimizer: DPOptimizer) -> DPOptimizer:
    """The same optimizer (:func:`rebuilt`) as its class here; any other class (a subclass, distributed) unchanged.

    Ghost clipping's loss (``DPLossFastGradientClipping``) holds its optimizer: build it with the result.
    """
    in_place = _IN_PLACE.get(type(dp_optimizer))
    return dp_optimizer if in_place is None else rebuilt(dp_optimizer, in_place)


def rebuilt(dp_optimizer: DPOptimizer, optimizer_class: type[DPOptimizer], **settings: Any) -> DPOptimizer:
    """``dp_optimizer`` rebuilt as ``optimizer_class``, with ``settings`` added.

    The same wrapped optimizer, σ, C, expected batch size, reduction, generator, secure mode and step
    hook (the accountant's).
    """
    optimizer = optimizer_class(
        dp_optimizer.original_optimizer,
        noise_multiplier=dp_optimizer.noise_multiplier,
        max_grad_norm=dp_optimizer.max_grad_norm,
        expected_batch_size=dp_optimizer.expected_batch_size,
        loss_reduction=dp_optimizer.loss_reduction,
        generator=dp_optimizer.generator,
        secure_mode=dp_optimizer.secure_mode,
        **settings,
    )
    optimizer.attach_step_hook(dp_optimizer.step_hook)
    return optimizer


def _reusable(target: torch.Tensor | None, summed: torch.Tensor) -> TypeGuard[torch.Tensor]:
    """``target`` can take the noise: the sum's layout, its own whole storage, none of the sum's."""
    return (
        target is not None
        and not target.requires_grad
        and target.shape == summed.shape
        and target.dtype == summed.dtype
        and target.device == summed.device
        and target.is_contiguous()
        and target.untyped_storage().nbytes() == target.numel() * target.element_size()
        and target.untyped_storage().data_ptr() != summed.untyped_storage().data_ptr()
    )


def _fresh(summed: torch.Tensor) -> torch.Tensor:
    return torch.empty(summed.shape, dtype=summed.dtype, device=summed.device)
