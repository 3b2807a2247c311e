"""What a trained model says about an audit's canaries: counts only, never a per-canary score."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ray_dptune.audit.bound import DEFAULT_CONFIDENCE, one_run_epsilon_lower

__all__ = ["AUDIT_METHODS", "BLACK_BOX_LOSS", "WHITE_BOX_GRADIENT", "AuditCounts"]

BLACK_BOX_LOSS = "black-box: each canary's loss on the released model; lowest guessed in, highest out"
WHITE_BOX_GRADIENT = (
    "white-box: each canary's loss gradient at the initial weights against the training's whole update "
    "(their inner product); lowest guessed in, highest out"
)
AUDIT_METHODS = {"black-box": BLACK_BOX_LOSS, "white-box": WHITE_BOX_GRADIENT}
"""How the auditor scores the canaries, by the name a :class:`~ray_dptune.training.CanaryAudit` takes."""


@dataclass(frozen=True)
class AuditCounts:
    """What one trained model says about the canaries: counts only, never a per-canary score.

    Attributes:
        canaries: m, the canaries drawn (each inserted with probability ½).
        guesses: r, the canaries guessed on ("in" or "out").
        correct: v, the right guesses.
        commitment: the audit secret's SHA-256, to match the trial with its search.
        method: how the canaries were scored: a key of :data:`AUDIT_METHODS`.
    """

    canaries: int
    guesses: int
    correct: int
    commitment: str
    method: str = "black-box"

    def epsilon_lower(self, *, delta: float, confidence: float = DEFAULT_CONFIDENCE) -> float:
        """ε_lower at ``confidence`` for a search claiming ``delta`` (Theorem 3 of the one-run paper)."""
        return one_run_epsilon_lower(
            canaries=self.canaries, guesses=self.guesses, correct=self.correct, delta=delta, confidence=confidence
        )

    def to_dict(self) -> dict[str, Any]:
        """The counts as a JSON-ready dict: what a trial reports under ``dp_audit``."""
        return {
            "canaries": self.canaries,
            "guesses": self.guesses,
            "correct": self.correct,
            "commitment": self.commitment,
            "method": self.method,
        }

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> AuditCounts:
        """The counts :meth:`to_dict` wrote; other keys are ignored."""
        return cls(**{key: record[key] for key in ("canaries", "guesses", "correct", "commitment", "method")})
