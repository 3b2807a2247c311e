"""The two records of a search: the operator's (report and journal) and the public statement.

The guarantee covers the released output with the number of runs hidden (Papernot &
Steinke 2022, App. D.1: with K known, the best of k runs costs up to k-fold). So only
the released model and :func:`public_statement` may be published: the released
configuration and score, (ε, δ) and the procedure's definition, all fixed before the
search touched the data. The privacy report and the journal hold K, every attempt and
every trial's state and last score: they stay with the operator (:data:`OPERATOR_RECORD`).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism

__all__ = ["OPERATOR_RECORD", "STATEMENT_FILE", "public_statement", "write_statement"]

STATEMENT_FILE = "public_statement.json"
OPERATOR_RECORD = (
    "The operator's record: it holds the number of trials K, every attempt and every trial's state and "
    "configuration, which the guarantee does not cover (it covers the released output with K hidden). Keep it "
    f"private. What may be published is the released model and {STATEMENT_FILE} (release_best(...).statement)."
)


def public_statement(report: dict[str, Any], *, config: dict[str, Any], score: float | None) -> dict[str, Any]:
    """What may be published beside the released model: nothing about the other trials, nor their number."""
    mechanism = SearchMechanism.from_dict(report["mechanism"])
    guarantee = report["guarantee"]
    return {
        "statement": f"The public privacy statement of one private hyperparameter search ({STATEMENT_FILE}).",
        "released": {"config": config, "score": score, "metric": report.get("metric"), "mode": report.get("mode")},
        "guarantee": {
            "epsilon": guarantee["epsilon"],
            "delta": guarantee["delta"],
            "covers": report["covers"],
            "threat_model": report["threat_model"],
        },
        "procedure": {
            "searcher": report["searcher"],
            "mechanism": mechanism.public_definition(),
            "plan": report["plan"],
            "score_privacy": report["score_privacy"],
            "failed_trials": (
                "composed at the plan when retried"
                if mechanism.allows_retries
                else "never retried: a failed trial is one run, with output 'failed', never released"
            ),
            "reserved_reruns": guarantee.get("reserved_reruns", 0),
        },
        "versions": report.get("versions", {}),
    }


def write_statement(filesystem: Any, path: str, statement: dict[str, Any]) -> None:
    """Writes ``statement`` to ``path`` on a pyarrow filesystem: a temporary file, then a rename."""
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"
    with filesystem.open_output_stream(temporary) as stream:
        stream.write(json.dumps(statement, indent=2).encode())
    filesystem.move(temporary, path)
