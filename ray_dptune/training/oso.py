"""OSO-DPSGD: DP-SGD that learns its clipping threshold and learning rate online.

Reference: Galli, Palamidessi, Cucinotta, "Online Sensitivity Optimization in
Differentially Private Learning" (AAAI 2024), Algorithm 1, Proposition 1, Eqs. (10)-(21).

Each step releases two noisy sums over the same Poisson batch B_t: the clipped
gradients ḡ_t(z) (norm <= C_t, Gaussian noise of std ν_g·C_t) and the clipping
directions q_t(z) = g_t(z)/||g_t(z)|| if clipped, else 0 (Eq. 11; norm 0 or 1, noise
std ν_q). Adding or removing one example moves the pair by at most (C_t, 1), so in
noise-multiplier units by sqrt(ν_g⁻² + ν_q⁻²) = 1/ν with ν_g = (ν⁻² − ν_q⁻²)^(-1/2)
(Proposition 1): the step costs exactly one subsampled Gaussian of multiplier ν, and
is accounted as plain DP-SGD at ν. C_{t+1} and ρ_{t+1} (Eqs. 20-21) only post-process
the released pairs, so they cost nothing more.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import torch
from opacus.optimizers import DPOptimizer

__all__ = [
    "LOG_LIMIT",
    "OSO_DEFAULT_RATE",
    "OSODPOptimizer",
    "default_noise_multiplier_q",
    "gaussian_noise",
    "gradient_noise_multiplier",
    "per_sample_norms",
]

OSO_DEFAULT_RATE = 2.5e-3
"""ρ_c = ρ_r of all the paper's experiments (Galli et al., section "The OSO-DPSGD Algorithm")."""

LOG_LIMIT = 30.0
"""log C_t and log ρ_t are clamped to [-30, 30] (C_t, ρ_t in [9.4e-14, 1.1e13]).

Eqs. (20)-(21) keep both positive; the clamp keeps them (and the noise std ν_g·C_t)
finite in float32 however long the run and however large ρ_c, ρ_r. Privacy does not
depend on it: the noise is always ν_g times the threshold actually used for clipping.
"""

_NORM_EPSILON = 1e-6  # Opacus's margin in C / (norm + 1e-6): clipped norms stay <= C, directions <= 1


def gradient_noise_multiplier(*, noise_multiplier: float, noise_multiplier_q: float) -> float:
    """ν_g = (ν⁻² − ν_q⁻²)^(-1/2), the gradient's share of a step of multiplier ν (Proposition 1).

    Raises:
        ValueError: ν_q <= ν (the directions would need all the budget, or more).
    """
    if not 0 < noise_multiplier < noise_multiplier_q:
        raise ValueError(
            f"OSO-DPSGD needs 0 < noise_multiplier < oso_noise_multiplier_q (Galli et al., Proposition 1), "
            f"got ν = {noise_multiplier} and ν_q = {noise_multiplier_q}; the paper's rule of thumb is "
            f"ν_q ≈ 7.124·ν = {default_noise_multiplier_q(noise_multiplier=noise_multiplier):.4g}."
        )
    return cast(float, (noise_multiplier**-2 - noise_multiplier_q**-2) ** -0.5)  # real: ν_q > ν > 0


def default_noise_multiplier_q(*, noise_multiplier: float) -> float:
    """ν_q ≈ 7.124·ν: the paper's rule of thumb, which makes ν_g 1% larger than ν (after Proposition 1)."""
    return noise_multiplier / math.sqrt(1.0 - 1.01**-2)


def per_sample_norms(grad_samples: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of each example's whole gradient, as ``DPOptimizer.clip_and_accumulate`` computes it."""
    if len(grad_samples[0]) == 0:
        return torch.zeros((0,), device=grad_samples[0].device)
    norms = [g.reshape(len(g), -1).norm(2, dim=-1) for g in grad_samples]
    return cast(torch.Tensor, torch.stack([n.to(norms[0].device) for n in norms], dim=1).norm(2, dim=1))


class OSODPOptimizer(DPOptimizer):  # type: ignore[misc]  # Opacus is untyped
    """Algorithm 1 of Galli et al. as an Opacus optimizer around plain SGD.

    ``noise_multiplier`` is ν, the multiplier the step is accounted at (Opacus's
    accountant hooks read it); the gradient gets ν_g = :func:`gradient_noise_multiplier`
    (ν, ν_q) times C_t (lines 10-11), the direction sum ν_q (line 13 with Proposition 1's
    ν_q; the printed line 13 says ν_g). Both noises go on the sums, which are then
    divided by the expected batch size |B|, as in lines 11 and 13 and Opacus (Eqs.
    (17)-(18) write the same stds on the means, |B| times more noise than Proposition 1
    needs). After the SGD update at ρ_t (line 12),

    * C_{t+1} = C_t·exp(ρ_c·sign(g̃_tᵀ q̃_{t-1})) (Eq. 20, line 14),
    * ρ_{t+1} = ρ_t·exp(ρ_r·sign(g̃_tᵀ g̃_{t-1})) (Eq. 21, line 15),

    with q̃_0 = g̃_0 = 0 (sign 0: the first step changes neither), log-values clamped to
    ±:data:`LOG_LIMIT`. ρ_t is the wrapped optimizer's learning rate (all its parameter
    groups share it); ``max_grad_norm`` is C_t.

    Example:
        >>> import torch
        >>> sgd = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.5)
        >>> oso = OSODPOptimizer(sgd, noise_multiplier=1.0, noise_multiplier_q=8.0, max_grad_norm=0.1,
        ...                      clip_rate=2.5e-3, lr_rate=2.5e-3, expected_batch_size=64)
        >>> round(oso.gradient_noise_multiplier, 3)  # ν_g = (1 - 1/64)^(-1/2)
        1.008
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        noise_multiplier: float,
        noise_multiplier_q: float,
        max_grad_norm: float,
        clip_rate: float = OSO_DEFAULT_RATE,
        lr_rate: float = OSO_DEFAULT_RATE,
        expected_batch_size: int | None,
        loss_reduction: str = "mean",
        generator: torch.Generator | None = None,
        secure_mode: bool = False,
    ) -> None:
        """Wraps ``optimizer`` (SGD; its learning rate is ρ_0).

        Args:
            optimizer: the non-private optimizer; its ``lr`` is ρ_0.
            noise_multiplier: ν, the accounted multiplier of each step.
            noise_multiplier_q: ν_q > ν, the multiplier of the direction sum.
            max_grad_norm: C_0.
            clip_rate: ρ_c >= 0.
            lr_rate: ρ_r >= 0.
            expected_batch_size: |B| (q·n), the divisor of both sums.
            loss_reduction: "mean" or "sum", as for ``DPOptimizer``.
            generator: the noise's generator.
            secure_mode: Opacus's floating-point-safe noise.

        Raises:
            ValueError: ν_q <= ν, a negative rate, or parameter groups with different rates.
        """
        self.gradient_noise_multiplier = gradient_noise_multiplier(
            noise_multiplier=noise_multiplier, noise_multiplier_q=noise_multiplier_q
        )
        for name, rate in (("clip_rate", clip_rate), ("lr_rate", lr_rate)):
            if not 0 <= rate < math.inf:
                raise ValueError(f"OSO-DPSGD's {name} must be a finite number >= 0, got {rate!r}.")
        rates = {group["lr"] for group in optimizer.param_groups}
        if len(rates) != 1:
            raise ValueError(f"OSO-DPSGD learns one learning rate; the parameter groups have {sorted(rates)}.")
        super().__init__(
            optimizer,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            expected_batch_size=expected_batch_size,
            loss_reduction=loss_reduction,
            generator=generator,
            secure_mode=secure_mode,
        )
        self.noise_multiplier_q = float(noise_multiplier_q)
        self.clip_rate = float(clip_rate)
        self.lr_rate = float(lr_rate)
        self._log_clip = _clamp(math.log(max_grad_norm))
        self._log_lr = _clamp(math.log(rates.pop()))
        self._apply()
        self._summed_q: list[torch.Tensor | None] = [None] * len(self.params)
        self._noisy_q: list[torch.Tensor] | None = None
        self._previous_gradient: list[torch.Tensor] | None = None  # g̃_{t-1}
        self._previous_q: list[torch.Tensor] | None = None  # q̃_{t-1}

    @property
    def lr(self) -> float:
        """ρ_t, the learning rate of the next step."""
        return math.exp(self._log_lr)

    def clip_and_accumulate(self) -> None:
        """Sums ḡ_t(z) (line 7) into ``p.summed_grad`` (Opacus's own clipping) and q_t(z) (line 8, Eq. 11)."""
        norms = per_sample_norms(self.grad_samples)
        clip_factor = (self.max_grad_norm / (norms + _NORM_EPSILON)).clamp(max=1.0)
        # Clipped examples (factor < 1) have q = g/||g||, i.e. ḡ/C: norm <= 1 with Opacus's margin.
        direction_factor = torch.where(clip_factor < 1.0, 1.0 / (norms + _NORM_EPSILON), torch.zeros_like(norms))
        for index, p in enumerate(self.params):
            grad_sample = self._get_flat_grad_sample(p).to(p.dtype)
            q = torch.einsum("i,i...", direction_factor.to(grad_sample.device, p.dtype), grad_sample)
            summed_q = self._summed_q[index]
            self._summed_q[index] = q if summed_q is None else summed_q + q
        super().clip_and_accumulate()  # checks and marks each grad_sample as used, as every DP-SGD step

    def add_noise(self) -> None:
        """g̃ ← Σḡ + N(0, (ν_g·C_t)²) (lines 10-11) and q̃ ← Σq + N(0, ν_q²) (line 13, Proposition 1).

        A sum is never noised twice: Opacus's clipping (above) refuses per-sample gradients
        already used, so each step's sums are fresh.
        """
        noise = {"generator": self.generator, "secure": self.secure_mode}
        std = self.gradient_noise_multiplier * self.max_grad_norm
        for p in self.params:
            p.grad = (p.summed_grad + gaussian_noise(std, p.summed_grad, **noise)).view_as(p)
        summed_q = cast(list[torch.Tensor], self._summed_q)  # all set by clip_and_accumulate
        self._noisy_q = [summed + gaussian_noise(self.noise_multiplier_q, summed, **noise) for summed in summed_q]

    def scale_grad(self) -> None:
        """Divides g̃ and q̃ by the expected batch size (the 1/|B| of lines 11 and 13)."""
        super().scale_grad()
        if self.loss_reduction == "mean":
            divisor = self.expected_batch_size * self.accumulated_iterations
            self._noisy_q = [q / divisor for q in cast(list[torch.Tensor], self._noisy_q)]  # set by add_noise

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Clears the per-step sums with Opacus's (kept when a step was skipped for accumulation)."""
        if not self._is_last_step_skipped:
            self._summed_q = [None] * len(self.params)
        super().zero_grad(set_to_none)

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Clips, noises and steps at (C_t, ρ_t) (lines 5-13), then learns C_{t+1}, ρ_{t+1} (lines 14-15)."""
        if closure is not None:
            with torch.enable_grad():
                closure()
        if not self.pre_step():
            return None
        gradient = [p.grad.detach().clone() for p in self.params]  # g̃_t, before the wrapped step can touch it
        loss: float | None = self.original_optimizer.step()
        self._learn(gradient)
        return loss

    def clipping_state_dict(self) -> dict[str, Any]:
        """Returns log C_t, log ρ_t, g̃_{t-1} and q̃_{t-1}: what a resumed run needs to continue the same sequence."""
        return {
            "log_clip": self._log_clip,
            "log_lr": self._log_lr,
            "previous_gradient": self._previous_gradient,
            "previous_q": self._previous_q,
        }

    def load_clipping_state_dict(self, state: dict[str, Any]) -> None:
        """Restores :meth:`clipping_state_dict`'s values."""
        self._log_clip = float(state["log_clip"])
        self._log_lr = float(state["log_lr"])
        self._previous_gradient = state["previous_gradient"]
        self._previous_q = state["previous_q"]
        self._apply()

    def _learn(self, gradient: list[torch.Tensor]) -> None:
        self._log_clip = _clamp(self._log_clip + self.clip_rate * _sign_of_dot(gradient, self._previous_q))
        self._log_lr = _clamp(self._log_lr + self.lr_rate * _sign_of_dot(gradient, self._previous_gradient))
        self._previous_gradient, self._previous_q = gradient, self._noisy_q
        self._apply()

    def _apply(self) -> None:
        self.max_grad_norm = math.exp(self._log_clip)
        for group in self.original_optimizer.param_groups:
            group["lr"] = math.exp(self._log_lr)


def gaussian_noise(
    std: float, reference: torch.Tensor, *, generator: torch.Generator | None = None, secure: bool = False
) -> torch.Tensor:
    """N(0, std²) noise shaped like ``reference``.

    ``secure``: the floating-point-safe sampler of Holohan & Braghin (2021, arXiv:2107.10138,
    §5.1, n = 2), as Opacus's ``secure_mode``: the sum of 4 draws halved, after one
    discarded draw, so the low bits of a sample do not reveal the unnoised value.
    """
    shape: dict[str, Any] = {"size": reference.shape, "device": reference.device, "generator": generator}
    if std == 0:
        return torch.zeros_like(reference)
    if not secure:
        return torch.normal(mean=0.0, std=std, dtype=reference.dtype, **shape)
    torch.normal(mean=0.0, std=std, size=(1, 1), device=reference.device, generator=generator)
    total = torch.zeros_like(reference)
    for _ in range(4):
        total += torch.normal(mean=0.0, std=std, **shape)
    return total / 2


def _sign_of_dot(current: list[torch.Tensor], previous: list[torch.Tensor] | None) -> float:
    """sign(Σ_p ⟨current_p, previous_p⟩) in float64; 0 when there is no previous step (q̃_0 = g̃_0 = 0)."""
    if previous is None:
        return 0.0
    dot = sum(torch.sum(a.double() * b.to(a.device).double()) for a, b in zip(current, previous))
    return float(torch.sign(cast(torch.Tensor, dot)))  # a tensor: there is at least one parameter


def _clamp(log_value: float) -> float:
    return min(max(log_value, -LOG_LIMIT), LOG_LIMIT)
