"""A search's guarantee as a value, and its composition with approximate-DP releases."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ray_dptune.accounting.curves.rdp import RDPCurve
from ray_dptune.errors import PrivacyError

__all__ = ["Guarantee", "compose_with_releases"]


@dataclass(frozen=True)
class Guarantee:
    """A search's (ε, δ), its RDP curve (None for an approximate-DP release), and how it is made up."""

    epsilon: float | None
    delta: float
    curve: RDPCurve | None
    charged_attempts: int
    epsilon_selection: float | None = None
    epsilon_one_trial: float | None = None
    epsilon_adaptivity: float | None = None
    release_epsilon: float = 0.0
    release_delta: float = 0.0
    reason: str | None = None

    def to_dict(self, *, with_curve: bool = True) -> dict[str, Any]:
        """A JSON-ready record of the guarantee; ``with_curve=False`` leaves out the RDP curve."""
        record: dict[str, Any] = {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "epsilon_selection": self.epsilon_selection,
            "epsilon_one_trial": self.epsilon_one_trial,
            "epsilon_adaptivity": self.epsilon_adaptivity,
            "charged_attempts": self.charged_attempts,
            "release_epsilon": self.release_epsilon,
            "release_delta": self.release_delta,
        }
        if self.reason:
            record["reason"] = self.reason
        if with_curve:
            record["curve"] = None if self.curve is None else self.curve.to_dict()
        return record


def compose_with_releases(
    curve: RDPCurve | None, *, release_epsilon: float = 0.0, release_delta: float = 0.0, delta: float
) -> float:
    """ε at ``delta`` of an RDP mechanism run beside approximate-DP releases.

    Basic composition (Dwork & Roth 2014, Thm 3.16): the RDP part is converted at
    δ − Σδ_release (Canonne, Kamath & Steinke 2020, Prop. 12) and Σε_release is added.

    Raises:
        PrivacyError: the releases alone need δ >= ``delta``.
    """
    rdp_delta = delta - release_delta
    if rdp_delta <= 0:
        raise PrivacyError(
            f"The approximate-DP releases need δ = {release_delta:g} in all, at least the requested δ = {delta:g}: "
            "no (ε, δ) at that δ covers them. Ask for a larger δ."
        )
    rdp = 0.0 if curve is None else curve.epsilon(delta=rdp_delta * (1.0 - 1e-12))  # conservative rounding of δ
    return rdp + release_epsilon
