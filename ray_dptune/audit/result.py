"""The report's ``audit`` section: the released model's canary counts beside the proven ε."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray_dptune.audit.counts import AuditCounts

__all__ = ["released_audit"]


def released_audit(
    record: Mapping[str, Any], reported: Mapping[str, Any] | None, *, epsilon_upper: float, delta: float
) -> dict[str, Any]:
    """The audit section for the released trial: ``record`` (the search's) completed with its counts.

    Args:
        record: the audit's public record from the report (:meth:`~ray_dptune.training.canaries.CanaryAudit.record`).
        reported: the released trial's last ``dp_audit`` result, or None when it reported none.
        epsilon_upper: the proven ε of the whole search.
        delta: its δ (the null hypothesis is (ε, δ)-DP).

    Returns:
        ``record`` with ``correct``, ``epsilon_lower``, ``epsilon_upper``, ``delta`` and ``consistent``
        (ε_lower ≤ ε_upper; False is a bug in the guarantee or the code), or with ``epsilon_lower``
        None and ``missing`` saying why (a trial restored without the audited trainable, say).
    """
    section = {**record, "epsilon_upper": epsilon_upper, "delta": delta}
    if reported is None:
        return {**section, "correct": None, "epsilon_lower": None, "missing": "the released trial reported no counts"}
    counts = AuditCounts.from_dict(dict(reported))
    if (counts.commitment, counts.canaries, counts.method) != (
        record["commitment"],
        record["canaries"],
        record["method"],
    ):
        return {
            **section,
            "correct": None,
            "epsilon_lower": None,
            "missing": "the released trial trained with other canaries than the search's (restored without "
            "trainable.with_audit(CanaryAudit.from_journal(path))?)",
        }
    epsilon_lower = counts.epsilon_lower(delta=delta, confidence=record["confidence"])
    return {
        **section,
        "guesses": counts.guesses,
        "correct": counts.correct,
        "epsilon_lower": epsilon_lower,
        "consistent": epsilon_lower <= epsilon_upper,
    }
