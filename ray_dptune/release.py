"""release_best: what a private search may release, and nothing more."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from ray_dptune.callbacks import REPORT_FILE
from ray_dptune.errors import PrivacyError

__all__ = ["ReleasedTrial", "release_best"]


@dataclass(frozen=True)
class ReleasedTrial:
    """The selected trial, the only output the privacy guarantee covers.

    Attributes:
        config: its hyperparameters.
        score: its final reported score (the selection metric).
        checkpoint_path: its last checkpoint, or None.
        guarantee: the whole search's (ε, δ) and what it covers, from the privacy report.
    """

    config: dict[str, Any]
    score: float | None
    checkpoint_path: str | None
    guarantee: dict[str, Any]


def release_best(
    results_or_path: Any, *, metric: str | None = None, mode: str | None = None, purge: bool = False
) -> ReleasedTrial:
    """Returns only the output a private search may release; ``purge=True`` deletes the rest.

    The output is what the searcher names in the privacy report: the final training
    trial of constant-overhead tuning, or the (λ̃, ṽ) that DP Bayesian optimisation
    released itself (no checkpoint: retrain with λ̃). Otherwise it is the best trial by
    its *last* reported score (the run's output, as in Papernot & Steinke's "return the
    best of the K runs").

    Args:
        results_or_path: a ``ResultGrid`` from ``Tuner.fit()`` or an experiment folder.
        metric: selection metric (default: the one the search was tuned on).
        mode: "max" or "min" (default: the search's).
        purge: delete every other trial's folder (results, checkpoints), so that only
            what the guarantee covers remains on disk.

    Raises:
        PrivacyError: no privacy report in the experiment folder (the search ran
            without PrivacyAccountantCallback), so no guarantee can be stated.
    """
    import pyarrow.fs
    from ray import tune

    if isinstance(results_or_path, (str, os.PathLike)):
        filesystem, experiment_path = pyarrow.fs.FileSystem.from_uri(os.fspath(results_or_path))
        trials = tune.ExperimentAnalysis(os.fspath(results_or_path)).trials
    else:
        filesystem, experiment_path = results_or_path.filesystem, results_or_path.experiment_path
        trials = list(results_or_path)
    if not trials:
        return ReleasedTrial(
            config={},
            score=None,
            checkpoint_path=None,
            guarantee={"note": "No trial ran (K = 0): the release is independent of the data."},
        )
    report = _read_report(filesystem, experiment_path)
    guarantee = {**report["guarantee"], "covers": report["covers"]}
    details = report.get("details") or {}
    if "release" in details:  # the searcher released its own output (DP-BO's λ̃ and ṽ)
        if details["release"] is None:
            raise PrivacyError(
                f"{report.get('searcher')} releases its own output when the search ends, and this search did not "
                "finish: nothing may be released (its trials' raw scores are not private)."
            )
        released, keep = ReleasedTrial(details["release"]["config"], details["release"]["score"], None, guarantee), None
    else:
        best, score = _released_trial(trials, report, details, metric, mode)
        released = ReleasedTrial(dict(best.config), score, _checkpoint_path(best), guarantee)
        keep = _trial_path(best)
    if purge:
        for trial in trials:
            path = _trial_path(trial)
            if path and path != keep:
                filesystem.delete_dir(path)
    return released


def _released_trial(
    trials: list, report: dict[str, Any], details: dict[str, Any], metric: str | None, mode: str | None
) -> tuple[Any, float | None]:
    """The trial the searcher names as its output, or else the best by ``metric``."""
    metric, mode = metric or report.get("metric"), mode or report.get("mode")
    if "released_trial_id" in details:
        named = [trial for trial in trials if _trial_id(trial) == details["released_trial_id"]]
        if not named:
            raise PrivacyError(f"The released trial {details['released_trial_id']} is not in this experiment.")
        score = _last_metrics(named[0]).get(metric) if metric else None
        return named[0], None if score is None else float(score)
    if metric is None or mode not in ("max", "min"):
        raise ValueError("Give metric= and mode='max'|'min': the search did not record them.")
    candidates = [(_last_metrics(trial).get(metric), trial) for trial in trials]
    candidates = [(score, trial) for score, trial in candidates if isinstance(score, (int, float))]
    if not candidates:
        raise ValueError(f"No trial reported the metric {metric!r}; nothing to select.")
    sign = 1.0 if mode == "max" else -1.0
    score, best = max(candidates, key=lambda pair: sign * pair[0])
    return best, float(score)


def _read_report(filesystem: Any, experiment_path: str) -> dict[str, Any]:
    """The privacy report, read through the experiment's storage (local, NFS, S3, GCS)."""
    path = f"{experiment_path}/{REPORT_FILE}"
    try:
        with filesystem.open_input_stream(path) as stream:
            return json.loads(stream.read())
    except FileNotFoundError as error:
        raise PrivacyError(
            f"No {REPORT_FILE} in {experiment_path}: the search ran without PrivacyAccountantCallback, "
            "so it has no privacy guarantee to release with."
        ) from error


def _last_metrics(trial: Any) -> dict[str, Any]:
    return getattr(trial, "metrics", None) or getattr(trial, "last_result", None) or {}


def _trial_id(trial: Any) -> str | None:
    return getattr(trial, "trial_id", None) or _last_metrics(trial).get("trial_id")


def _trial_path(trial: Any) -> str | None:
    """The trial's folder on the experiment's storage filesystem."""
    return getattr(trial, "path", None)


def _checkpoint_path(trial: Any) -> str | None:
    checkpoint = getattr(trial, "checkpoint", None)
    if checkpoint is None and hasattr(trial, "latest_checkpoint_result"):
        result = trial.latest_checkpoint_result
        checkpoint = result.checkpoint if result else None
    return getattr(checkpoint, "path", None)
