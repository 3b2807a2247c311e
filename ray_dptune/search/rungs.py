"""The rungs of asynchronous successive halving, as plain data: milestones, scores, promotions.

ASHA (Li et al. 2020, "A System for Massively Parallel Hyperparameter Tuning", Alg. 2)
trains every trial to the first milestone (``grace_period`` time units), and promotes a
trial from milestone r to the next (r·η, capped at ``max_t``) when its score is in the
top 1/η of the scores recorded at r so far. The cut-off is Tune's ``ASHAScheduler``'s:
the (1 − 1/η) quantile of the recorded scores (the trial's own included).

Decisions read nothing but the scores given to :meth:`Rungs.promotable`; the private
scheduler gives it only the released (public-validation or noised) score, so every
decision is a post-processing of what the guarantee covers. No Ray, no torch: the
benchmark replays the same rule in-process.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ray_dptune import validate

__all__ = ["Rungs"]


class Rungs:
    """Milestones ``grace_period·η^k < max_t`` then ``max_t``, and the scores recorded at each.

    Args:
        grace_period: time units every trial runs first (>= 1).
        reduction_factor: η > 1: about 1 in η trials goes on at each milestone.
        max_t: time units of a whole trial (the plan's span).
        mode: "max" or "min" (the better score); None until Tune's is known.
    """

    def __init__(self, *, grace_period: int, reduction_factor: float, max_t: int, mode: str | None = None):
        self.grace_period = validate.integer("grace_period", grace_period, minimum=1)
        self.max_t = validate.integer("max_t", max_t, minimum=self.grace_period)
        if not (
            isinstance(reduction_factor, (int, float)) and math.isfinite(reduction_factor) and reduction_factor > 1
        ):
            raise ValueError(f"reduction_factor must be a number > 1, got {reduction_factor!r}.")
        if mode not in ("max", "min", None):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}.")
        self.reduction_factor = float(reduction_factor)
        self.mode = mode
        milestones: list[int] = []
        milestone = float(self.grace_period)
        while round(milestone) < self.max_t:
            if not milestones or round(milestone) > milestones[-1]:
                milestones.append(round(milestone))
            milestone *= self.reduction_factor
        self.milestones: tuple[int, ...] = (*milestones, self.max_t)
        self._scores: dict[int, dict[str, float]] = {m: {} for m in self.milestones}

    def next_milestone(self, time: int) -> int:
        """The first milestone after ``time`` (``max_t`` at the end)."""
        return next((m for m in self.milestones if m > time), self.max_t)

    def promotable(self, trial_id: str, milestone: int, score: float) -> bool:
        """Records ``score`` at ``milestone`` and says whether it is in the top 1/η recorded there."""
        if milestone not in self._scores:
            raise ValueError(f"{milestone} is not a milestone of {self.milestones}.")
        if self.mode is None:
            raise ValueError("Successive halving needs a mode ('max' or 'min') to compare scores.")
        if not math.isfinite(score):
            return False  # a NaN or infinite score never goes on (and is not recorded)
        signed = score if self.mode == "max" else -score
        recorded = self._scores[milestone]
        recorded[trial_id] = signed
        cutoff = np.percentile(list(recorded.values()), (1.0 - 1.0 / self.reduction_factor) * 100.0)
        return bool(signed >= cutoff)

    def best(self) -> str | None:
        """The trial with the best score at the highest milestone any trial reached (the released one)."""
        for milestone in reversed(self.milestones):
            recorded = self._scores[milestone]
            if recorded:
                return max(recorded, key=recorded.__getitem__)
        return None

    def best_score(self) -> float | None:
        """The score of :meth:`best`, signed so that higher is better (None when nothing is recorded)."""
        best = self.best()
        return None if best is None else self._scores[self.reached(best)][best]

    def reached(self, trial_id: str) -> int:
        """The highest milestone at which ``trial_id`` has a recorded score (0 if none)."""
        return max((m for m in self.milestones if trial_id in self._scores[m]), default=0)

    def state(self) -> dict[str, Any]:
        """The recorded scores by milestone, JSON-ready (milestones as strings), for :meth:`restore`."""
        return {str(m): dict(scores) for m, scores in self._scores.items()}

    def restore(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state` (same milestones)."""
        if sorted(int(m) for m in state) != sorted(self.milestones):
            raise ValueError(f"Milestones {sorted(state)} differ from {self.milestones}.")
        self._scores = {int(m): dict(scores) for m, scores in state.items()}
