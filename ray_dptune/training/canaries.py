"""Canaries for a one-run audit of a whole private search (Steinke, Nasr & Jagielski 2023).

A :class:`CanaryAudit` holds m canaries and a secret from the operating system's secure
source. From the secret come the canaries (random inputs in the data's range, random
labels) and which of them are inserted into the private training set, each independently
with probability ½; every trial of the search inserts the same ones. The secret reaches no
config, result or report (they hold its SHA-256 commitment); the search's journal keeps it,
so that a restore after a killed driver inserts the same canaries.

After training, the auditor scores each canary and guesses "in" for the lowest scores and
"out" for the highest, abstaining on the rest (:meth:`CanaryAudit.count`);
:mod:`ray_dptune.audit` turns the counts into ε_lower. Black box (the default): the score is
the canary's loss on the released model, whose outputs are all the auditor sees. White box
(the paper's stronger setting, where the auditor also knows the initial weights θ₀): the
inner product of the canary's loss gradient at θ₀ with the training's whole update θ_T − θ₀,
negative when the training descended the canary's loss. θ₀ is drawn independently of the
data, so both are functions of the released model and public randomness, as Theorem 3 needs.
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset, TensorDataset

from ray_dptune.audit.bound import DEFAULT_CONFIDENCE
from ray_dptune.audit.counts import AUDIT_METHODS, AuditCounts
from ray_dptune.errors import PrivacyError
from ray_dptune.records.journal import existing_journal

__all__ = ["CanaryAudit", "CanaryScorer"]

_INCLUSION_STREAM, _EXAMPLE_STREAM = 0, 1
_SCORING_BATCH_SIZE = 1024


@dataclass(frozen=True, repr=False, kw_only=True)
class CanaryAudit:
    """m canaries, inserted at random into the private training set of every trial of a search.

    Args:
        canaries: m ≥ 2; more canaries give a tighter lower bound and change the data more.
        num_classes: labels are drawn uniformly from ``range(num_classes)``.
        guess_fraction: share of the canaries guessed on, half "in" and half "out" (fixed in
            advance, as Theorem 3 requires); at least one guess each way.
        input_range: (low, high): canary inputs are uniform in it, shaped like the training inputs.
        confidence: of ε_lower (fixed in advance, like the guesses).
        method: "black-box" (each canary's loss on the released model) or "white-box" (its
            loss gradient at the initial weights against the whole update; ``dp_trainable``
            then keeps the initial weights in the trial's checkpoints).
        secret: 128 bits from ``secrets`` (give one only in tests: whoever knows it knows the canaries).
    """

    canaries: int
    num_classes: int
    guess_fraction: float = 0.2
    input_range: tuple[float, float] = (0.0, 1.0)
    confidence: float = DEFAULT_CONFIDENCE
    method: str = "black-box"
    secret: int = field(default_factory=lambda: secrets.randbits(128))

    def __post_init__(self) -> None:
        for name, value, least in (("canaries", self.canaries, 2), ("num_classes", self.num_classes, 2)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}.")
        if not (isinstance(self.guess_fraction, (int, float)) and 0 < self.guess_fraction <= 1):
            raise ValueError(f"guess_fraction must lie in (0, 1], got {self.guess_fraction!r}.")
        if self.guesses_per_side < 1:
            raise ValueError(
                f"guess_fraction={self.guess_fraction} of {self.canaries} canaries makes no guess each way: "
                "raise canaries or guess_fraction."
            )
        if not (isinstance(self.confidence, float) and 0 < self.confidence < 1):
            raise ValueError(f"confidence must be a float strictly between 0 and 1, got {self.confidence!r}.")
        if self.method not in AUDIT_METHODS:
            raise ValueError(f"method must be one of {sorted(AUDIT_METHODS)}, got {self.method!r}.")
        low, high = self.input_range
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"input_range must be (low, high) with finite low < high, got {self.input_range!r}.")
        if isinstance(self.secret, bool) or not isinstance(self.secret, int) or self.secret < 0:
            raise ValueError("secret must be an int >= 0 (leave it out: it is drawn from the secure source).")

    def __repr__(self) -> str:  # never the secret
        return f"CanaryAudit(canaries={self.canaries}, num_classes={self.num_classes}, commitment={self.commitment})"

    @property
    def guesses_per_side(self) -> int:
        """How many canaries are guessed "in" (the lowest scores), and as many "out" (the highest)."""
        return int(self.guess_fraction * self.canaries) // 2

    @property
    def commitment(self) -> str:
        """SHA-256 of the secret: what reports and trial results hold instead of it."""
        return hashlib.sha256(f"ray_dptune canary audit {self.secret}".encode()).hexdigest()

    def record(self) -> dict[str, Any]:
        """The audit's public record (the report's ``audit`` section): its settings and commitment, not the secret."""
        return {
            "canaries": self.canaries,
            "num_classes": self.num_classes,
            "guess_fraction": self.guess_fraction,
            "input_range": list(self.input_range),
            "confidence": self.confidence,
            "guesses": 2 * self.guesses_per_side,
            "method": self.method,
            "commitment": self.commitment,
        }

    def journal_record(self) -> dict[str, Any]:
        """:meth:`record` with the secret: what the search's journal keeps (synced before any trial starts).

        With it, :meth:`from_journal` rebuilds the same canaries after a killed driver.
        """
        return {**self.record(), "secret": str(self.secret)}

    @classmethod
    def from_journal(cls, path: str | os.PathLike[str]) -> CanaryAudit:
        """The audit of the search journaled at ``path`` (the experiment folder or its journal file).

        Restore an audited search with
        ``tune.Tuner.restore(path, trainable.with_audit(CanaryAudit.from_journal(path)))``.

        Raises:
            PrivacyError: no journal there, or its search ran without an audit.
        """
        journal = existing_journal(path)
        path = journal.path
        try:
            search = journal.search()
        finally:
            journal.close()
        record = None if search is None else search["record"].get("audit")
        if record is None:
            raise PrivacyError(f"The search journaled at {path} ran without a canary audit.")
        audit = cls(
            canaries=record["canaries"],
            num_classes=record["num_classes"],
            guess_fraction=record["guess_fraction"],
            input_range=tuple(record["input_range"]),
            confidence=record["confidence"],
            method=record["method"],
            secret=int(record["secret"]),
        )
        if audit.commitment != record["commitment"]:
            raise PrivacyError(
                f"The audit journaled at {path} does not match its own commitment: the file was altered."
            )
        return audit

    def inclusion(self) -> np.ndarray:
        """Which canaries are inserted: independent fair coins from the secret (the auditor's secret)."""
        return self._rng(_INCLUSION_STREAM).integers(0, 2, size=self.canaries).astype(bool)

    def examples(self, like: torch.Tensor) -> TensorDataset:
        """All m canaries as (input, label) pairs, inputs of ``like``'s shape and dtype."""
        rng = self._rng(_EXAMPLE_STREAM)
        low, high = self.input_range
        inputs = rng.uniform(low, high, size=(self.canaries, *like.shape))
        labels = rng.integers(0, self.num_classes, size=self.canaries)
        return TensorDataset(torch.as_tensor(inputs, dtype=like.dtype), torch.as_tensor(labels, dtype=torch.int64))

    def training_set(self, train_set: Dataset[Any]) -> Dataset[Any]:
        """``train_set`` with the inserted canaries appended (the set DP-SGD trains on)."""
        canaries = self.examples(train_set[0][0])
        inserted = Subset(canaries, np.flatnonzero(self.inclusion()).tolist())
        return ConcatDataset([train_set, inserted])

    def planned_size(self, dataset_size: int) -> int:
        """The size DP-SGD's plan samples from: ``dataset_size`` records plus all m canaries.

        Counting every canary, inserted or not, keeps q = batch_size / size and the steps per
        epoch independent of the secret coins: each coin then only adds or removes one record
        of a Poisson-sampled run at a fixed q, the neighbouring pair DP-SGD's guarantee covers
        (a q that moved with the number inserted would reveal it in the plan and the model).
        """
        return dataset_size + self.canaries

    def count(self, scores: Sequence[float] | np.ndarray) -> AuditCounts:
        """The counts from each canary's score, lower meaning "more likely inserted".

        One score per canary, in the index order of :meth:`examples`: its loss on the trained model
        (black box) or its gradient against the update (white box).

        Guesses "in" for the ``guesses_per_side`` lowest scores and "out" for as many of the
        highest; ties go by index (a fixed rule that ignores the inclusion).
        """
        scores = np.asarray(scores, dtype=float)
        if scores.shape != (self.canaries,):
            raise ValueError(f"Expected one score per canary ({self.canaries}), got shape {scores.shape}.")
        scores = np.where(np.isnan(scores), np.inf, scores)  # a NaN score reads as "not fitted"
        order = np.argsort(scores, kind="stable")
        side = self.guesses_per_side
        inclusion = self.inclusion()
        correct = int(inclusion[order[:side]].sum() + (~inclusion[order[-side:]]).sum())
        return AuditCounts(self.canaries, 2 * side, correct, self.commitment, self.method)

    def _rng(self, stream: int) -> np.random.Generator:
        return np.random.default_rng(np.random.SeedSequence(self.secret, spawn_key=(stream,)))


class CanaryScorer:
    """Scores an audit's canaries on a trained model, by the audit's method, into counts.

    Args:
        audit: the audit.
        like: one training input (the canaries take its shape and dtype).
        loss_fn: ``(logits, targets, reduction="none") -> per-example loss``.
        start: the model with the weights the training started from (white box); None for black box.
    """

    def __init__(self, audit: CanaryAudit, *, like: torch.Tensor, loss_fn: Any, start: nn.Module | None) -> None:
        if audit.method == "white-box" and start is None:
            raise ValueError("A white-box audit scores against the initial weights: pass start= (the model at θ₀).")
        if audit.method == "black-box" and start is not None:
            raise ValueError("A black-box audit sees only the trained model: leave start= None.")
        self.audit, self.loss_fn, self.start = audit, loss_fn, start
        self.canaries = audit.examples(like)

    def counts(self, module: nn.Module) -> AuditCounts:
        """The counts on ``module`` (the trained model, unwrapped)."""
        device = next(module.parameters()).device
        scores = self._losses(module, device) if self.start is None else self._update_alignments(module, device)
        return self.audit.count(scores)

    @torch.no_grad()
    def _losses(self, module: nn.Module, device: torch.device) -> np.ndarray:
        module.eval()
        losses = []
        for inputs, targets in DataLoader(self.canaries, batch_size=_SCORING_BATCH_SIZE):
            logits = module(inputs.to(device))
            losses.append(self.loss_fn(logits, targets.to(device), reduction="none").float().cpu())
        module.train()
        return torch.cat(losses).numpy()

    def _update_alignments(self, module: nn.Module, device: torch.device) -> np.ndarray:
        """⟨∇ loss(θ₀; canary), θ_T − θ₀⟩ per canary: negative when training descended its loss."""
        assert self.start is not None
        self.start.eval()
        final = dict(module.named_parameters())
        update = {name: final[name].detach() - weight.detach() for name, weight in self.start.named_parameters()}
        scores = []
        for inputs, targets in DataLoader(self.canaries, batch_size=1):
            self.start.zero_grad(set_to_none=True)
            self.loss_fn(self.start(inputs.to(device)), targets.to(device)).backward()
            scores.append(
                sum(
                    float((weight.grad * update[name]).sum())
                    for name, weight in self.start.named_parameters()
                    if weight.grad is not None
                )
            )
        return np.asarray(scores)
