"""A trial's checkpoint (:class:`TrainState`) and its running privacy account (:class:`SpendGuard`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from opacus.optimizers import DPOptimizer

from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.errors import PrivacyError

__all__ = ["SpendGuard", "TrainState"]


@dataclass(frozen=True)
class TrainState:
    """A checkpoint: epochs done, the score released, the plan, what was spent, and the weights.

    Attributes:
        epoch: epochs completed.
        score: the score reported with this checkpoint (already released, noisy or not).
        plan: the trial's plan; None for a non-private trial (``"private": False`` partition).
        spent: what the trial had spent when the checkpoint was taken; None when ``plan`` is.
        model_state: ``state_dict`` of the unwrapped model (a ``GradSampleModule`` may not pickle).
        optimizer_state: ``state_dict`` of the (non-private) optimizer.
        clipping_state: an adaptive clipping mode's state (its ``clipping_state_dict()``
            with its ``"mode"``), None for fixed clipping.
        initial_model_state: the weights the trial started from, kept for a white-box canary
            audit (:class:`~ray_dptune.training.CanaryAudit`); None otherwise.
    """

    epoch: int
    score: float
    plan: TrialSpend | None
    spent: TrialSpend | None
    model_state: dict[str, Any]
    optimizer_state: dict[str, Any]
    clipping_state: dict[str, Any] | None = None
    initial_model_state: dict[str, Any] | None = None

    def save(self, directory: str | Path) -> None:
        """Writes ``model.pt``, ``optimizer.pt``, ``progress.json`` and, if any, ``clipping.pt`` and ``initial_model.pt``."""
        directory = Path(directory)
        torch.save(self.model_state, directory / "model.pt")
        torch.save(self.optimizer_state, directory / "optimizer.pt")
        if self.clipping_state is not None:
            torch.save(self.clipping_state, directory / "clipping.pt")
        if self.initial_model_state is not None:
            torch.save(self.initial_model_state, directory / "initial_model.pt")
        progress = {
            "epoch": self.epoch,
            "score": self.score,
            "dp_plan": None if self.plan is None else self.plan.to_dict(),
            "dp_spent": None if self.spent is None else self.spent.to_dict(),
        }
        (directory / "progress.json").write_text(json.dumps(progress))

    @classmethod
    def load(cls, directory: str | Path, device: torch.device | str = "cpu") -> TrainState:
        """Reads :meth:`save`'s files; tensors are mapped to ``device``."""
        directory = Path(directory)
        progress = json.loads((directory / "progress.json").read_text())
        clipping, initial = directory / "clipping.pt", directory / "initial_model.pt"
        return cls(
            epoch=int(progress["epoch"]),
            score=float(progress["score"]),
            plan=None if progress["dp_plan"] is None else TrialSpend.from_dict(progress["dp_plan"]),
            spent=None if progress["dp_spent"] is None else TrialSpend.from_dict(progress["dp_spent"]),
            model_state=torch.load(directory / "model.pt", map_location=device, weights_only=True),
            optimizer_state=torch.load(directory / "optimizer.pt", map_location=device, weights_only=True),
            clipping_state=torch.load(clipping, map_location=device, weights_only=True) if clipping.exists() else None,
            initial_model_state=(
                torch.load(initial, map_location=device, weights_only=True) if initial.exists() else None
            ),
        )


class SpendGuard:
    """What a trial has spent, kept within its plan.

    :meth:`step_hook` goes to ``DPOptimizer.attach_step_hook`` (as Opacus's accountants'
    hooks do): ``DPOptimizer.pre_step`` calls it after clipping and noising and before
    the parameter update, so raising there keeps the step from happening.
    """

    def __init__(self, plan: TrialSpend, spent: TrialSpend | None = None) -> None:
        """Starts from ``spent`` (a checkpoint's record), or from nothing spent.

        Raises:
            PrivacyError: ``spent`` is another mechanism than ``plan``'s, or exceeds it.
        """
        spent = spent or TrialSpend(
            sample_rate=plan.sample_rate,
            noise_multiplier=plan.noise_multiplier,
            steps=0,
            score_noise_multiplier=plan.score_noise_multiplier,
        )
        same_mechanism = (spent.sample_rate, spent.noise_multiplier) == (plan.sample_rate, plan.noise_multiplier)
        if not (same_mechanism and plan.covers(spent)):
            raise PrivacyError(f"The recorded spending {spent} does not fit the trial's plan {plan}.")
        self.plan = plan
        self.steps = spent.steps
        self.score_releases = spent.score_releases

    @property
    def spent(self) -> TrialSpend:
        """The steps taken and scores released so far, as a record."""
        return TrialSpend(
            sample_rate=self.plan.sample_rate,
            noise_multiplier=self.plan.noise_multiplier,
            steps=self.steps,
            score_noise_multiplier=self.plan.score_noise_multiplier,
            score_releases=self.score_releases,
        )

    def step_hook(self, optimizer: DPOptimizer) -> None:
        """Counts one noisy step; raises instead if it would exceed the plan.

        Raises:
            PrivacyError: the plan's steps are all spent.
        """
        if self.steps >= self.plan.steps:
            raise PrivacyError(f"Step {self.steps + 1} would exceed the trial's plan of {self.plan.steps} steps.")
        self.steps += 1

    def release_score(self) -> None:
        """Counts one noisy score release; raises instead if it would exceed the plan.

        Raises:
            PrivacyError: the plan's score releases are all spent.
        """
        if self.score_releases >= self.plan.score_releases:
            raise PrivacyError(
                f"Score release {self.score_releases + 1} would exceed the trial's plan of "
                f"{self.plan.score_releases} releases."
            )
        self.score_releases += 1
