"""release_best(purge=True): released means released, and nothing else (real Tune runs).

After a purge, no file in the experiment folder may hold an unreleased trial's score,
metric or (adaptive searchers) configuration: not the other trials' folders, and not
Ray's experiment-level state (experiment_state-*.json, searcher-state-*.pkl,
callback-states-*.pkl, search_gen_state-*.json, tuner.pkl, ...). Every file left is
read whole, as text and as bytes (float64 either way round, float32), and pickles are
unpickled and walked.
"""

import contextlib
import dataclasses
import json
import math
import os
import struct
import tempfile

import numpy as np
import pyarrow.fs
import pytest
from ray import cloudpickle, tune

from ray_dptune import (
    PointMass,
    PrivacyAccountantCallback,
    PrivacyError,
    RandomCountSearcher,
    TrialSpend,
    TruncatedNegativeBinomial,
    private_tune_config,
    release_best,
)
from ray_dptune.records.journal import JOURNAL_FILE
from ray_dptune.records.report import REPORT_FILE, PrivacyReport
from ray_dptune.records.statement import STATEMENT_FILE
from ray_dptune.search.dphypo import DPHyPOSearcher

RAY = pytest.mark.usefixtures("ray_session")  # the tests that run Tune; the others are fast

PLAN = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=40)
SPACE = {"x": tune.uniform(0.0, 1.0), "lr": tune.loguniform(1e-4, 1.0)}
DELTA = 1e-5
EPOCHS = 2
JOURNAL_FILES = {JOURNAL_FILE + suffix for suffix in ("", "-wal", "-shm", "-journal")}  # the privacy record


def score(config, epoch):
    """Distinctive in every digit (x and lr are continuous draws)."""
    return 0.123456789012 + 0.5 * config["x"] - 0.01 * math.log10(config["lr"]) + 1e-4 * epoch


def val_loss(config, epoch):
    """A second reported metric, just as distinctive."""
    return 7.25 + 3.3 * config["x"] * config["lr"] + 1e-4 * epoch


def scored_trainable(config):
    """Reports the score, a second metric and a checkpoint holding both after each epoch."""
    for epoch in range(1, EPOCHS + 1):
        spent = TrialSpend(
            sample_rate=PLAN.sample_rate, noise_multiplier=PLAN.noise_multiplier, steps=PLAN.steps * epoch // EPOCHS
        )
        metrics = {"score": score(config, epoch), "val_loss": val_loss(config, epoch)}
        with tempfile.TemporaryDirectory() as folder:
            np.save(os.path.join(folder, "weights.npy"), np.array([metrics["score"], metrics["val_loss"]]))
            with open(os.path.join(folder, "model.txt"), "w") as file:
                file.write(repr(metrics["score"]))
            tune.report(
                {**metrics, "dp_plan": PLAN.to_dict(), "dp_spent": spent.to_dict()},
                checkpoint=tune.Checkpoint.from_directory(folder),
            )


def run(tmp_path, searcher, name, monkeypatch):
    # Ray's default per-trial loggers (result.json, progress.csv, params.*, TensorBoard) as users have them.
    monkeypatch.setenv("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "0")
    callback = PrivacyAccountantCallback(searcher, delta=DELTA, plan=PLAN, verbose=False)
    tuner = tune.Tuner(
        scored_trainable,
        param_space=SPACE,
        tune_config=private_tune_config(searcher, max_concurrent_trials=2),
        run_config=tune.RunConfig(name=name, storage_path=str(tmp_path), callbacks=[callback], verbose=0),
    )
    results = tuner.fit()
    assert len(results) == 3 and all(r.error is None for r in results)
    return results


# ---------------------------------------------------------------------------- the scan
def encodings(value):
    """How a float may sit in a file: repr (JSON, CSV, text), rounded text, float64/float32 bytes."""
    texts = {repr(value), f"{value:.12g}", f"{value:.10g}"}
    packed = {struct.pack("<d", value), struct.pack(">d", value), struct.pack("<f", value)}  # pickle: ">d"
    return {text.encode() for text in texts} | packed


def floats_in(obj, seen=None, depth=0):
    """Every float reachable in an unpickled object (containers, arrays, attributes)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 50:
        return
    seen.add(id(obj))
    if isinstance(obj, (float, np.floating)):
        yield float(obj)
    elif isinstance(obj, np.ndarray) and obj.dtype.kind == "f":
        yield from (float(v) for v in obj.ravel())
    elif isinstance(obj, str):
        try:
            yield float(obj)
        except ValueError:
            pass
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from floats_in(key, seen, depth + 1)
            yield from floats_in(value, seen, depth + 1)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for value in obj:
            yield from floats_in(value, seen, depth + 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        yield from floats_in(vars(obj), seen, depth + 1)


def leaks(folder, secrets, exempt=()):
    """(file, value) for every secret value found in a file under ``folder``."""
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            if os.path.relpath(path, folder) in exempt:
                continue
            with open(path, "rb") as file:
                data = file.read()
            text = data.decode("utf-8", errors="ignore").encode()
            unpickled = []
            with contextlib.suppress(Exception):  # not a pickle, or one that needs what is not importable here
                unpickled = list(floats_in(cloudpickle.loads(data)))
            for value in secrets:
                if any(needle in data or needle in text for needle in encodings(value)) or any(
                    math.isclose(value, other, rel_tol=1e-12) for other in unpickled
                ):
                    found.append((os.path.relpath(path, folder), value))
    return found


def unreleased_values(results, best):
    """Every score and metric value of the trials other than ``best``, and their configurations."""
    others = [r for r in results if r is not best]
    assert len(others) == len(results) - 1
    values = set()
    for result in others:
        for epoch in range(1, EPOCHS + 1):
            values |= {score(result.config, epoch), val_loss(result.config, epoch)}
        assert result.metrics["score"] == score(result.config, EPOCHS)  # the values the trials reported
        values |= {result.config["x"], result.config["lr"]}
    return values


def secrets_before_purge(results):
    """The unreleased values, and the trial to be released (the best by its last score)."""
    best = max(results, key=lambda r: r.metrics["score"])
    secrets = unreleased_values(results, best)
    outside_trials = [leak for leak in leaks(results.experiment_path, secrets) if os.sep not in leak[0]]
    assert outside_trials  # Ray's experiment-level files hold them: the scan sees them (the test can fail)
    return best, secrets


def assert_only_the_release_remains(folder, released, secrets, exempt=()):
    """No secret in any file; only the released trial's folder and the privacy record remain."""
    assert leaks(folder, secrets, exempt) == []
    # the released trial's own folder and checkpoint stay, with its score
    assert released.checkpoint_path and os.path.isdir(released.checkpoint_path)
    with open(os.path.join(released.checkpoint_path, "model.txt")) as file:
        assert float(file.read()) == released.score
    trial_folder = os.path.dirname(released.checkpoint_path)
    remaining = set(os.listdir(folder))
    kept = {REPORT_FILE, STATEMENT_FILE, os.path.basename(trial_folder)}
    assert kept <= remaining  # and the journal, if the callback kept one
    assert remaining - kept <= JOURNAL_FILES
    with open(os.path.join(trial_folder, "result.json")) as file:
        assert repr(released.score) in file.read()
    assert not tune.Tuner.can_restore(folder)  # as the docstring says: no Tuner.restore after a purge


# ---------------------------------------------------------------------------- the tests
@RAY
def test_purge_leaves_no_unreleased_score_metric_or_config(tmp_path, monkeypatch):
    searcher = RandomCountSearcher(PointMass(3), metric="score", mode="max", seed=3)
    results = run(tmp_path, searcher, "random", monkeypatch)
    folder = results.experiment_path
    best, secrets = secrets_before_purge(results)
    state = next(name for name in os.listdir(folder) if name.startswith("experiment_state-"))
    with (
        open(os.path.join(folder, state), "rb") as source,  # an earlier session's state file
        open(os.path.join(folder, "experiment_state-2020-01-01_00-00-00.json"), "wb") as copy,
    ):
        copy.write(source.read())

    released = release_best(results, purge=True)
    assert released.config == best.config and released.score == best.metrics["score"]
    # Random configurations are data-independent: the privacy report lists them for the
    # operator (the accountant's record); every other copy must be gone.
    assert_only_the_release_remains(folder, released, secrets, exempt={REPORT_FILE})
    assert leaks(folder, secrets - {r.config[k] for r in results for k in r.config}) == []
    again = release_best(folder, purge=True)  # the quickstart's printed line, run a second time
    assert os.path.normpath(again.checkpoint_path) == os.path.normpath(released.checkpoint_path)
    assert dataclasses.replace(again, checkpoint_path=None) == dataclasses.replace(released, checkpoint_path=None)
    assert_only_the_release_remains(folder, again, secrets, exempt={REPORT_FILE})


@RAY
def test_purge_after_dp_hypo_leaves_no_unreleased_configuration(tmp_path, monkeypatch):
    """DP-HyPO's configurations come from unreleased scores: none may stay, the report included."""
    law = TruncatedNegativeBinomial.from_mean(eta=0.5, mean=3)
    seed = next(s for s in range(1000) if DPHyPOSearcher(law, seed=s).num_trials == 3)
    searcher = DPHyPOSearcher(law, metric="score", mode="max", upper=2.0, lower=0.75, candidates=100, seed=seed)
    results = run(tmp_path, searcher, "dphypo", monkeypatch)
    folder = results.experiment_path
    best, secrets = secrets_before_purge(results)

    released = release_best(folder, purge=True)  # from the experiment folder this time
    assert released.config == best.config and released.score == best.metrics["score"]
    assert_only_the_release_remains(folder, released, secrets)


class FakeTrial:
    def __init__(self, path, value):
        self.path, self.metrics, self.config, self.checkpoint = str(path), {"score": value}, {"v": value}, None
        self.trial_id = os.path.basename(str(path))


def fake_grid(experiment, trials, **report):
    """A ResultGrid stand-in over a hand-made experiment folder (no Ray run); ``states`` overrides "completed"."""
    states = report.pop("states", {})
    report = PrivacyReport(
        search_id="s",
        searcher="RandomCountSearcher",
        target=None,
        complete=True,
        incomplete_reason=None,
        released_trial_id=None,
        mechanism={"kind": "composition", "params": {}},
        guarantee={"epsilon": 1.0, "delta": DELTA},
        threat_model="t",
        covers="c",
        details=report.pop("details", {}),
        plan=None,
        score_privacy="public",
        trials={t.trial_id: {"state": states.get(t.trial_id, "completed"), "attempts": []} for t in trials},
        num_trials_planned=len(trials),
        num_trials_started=len(trials),
        unaccounted_trials=[],
        metric="score",
        mode="max",
        law=None,
        density_ratio=None,
        seed=0,
        dataset=None,
        ledger=report.pop("ledger", None),
        journal=None,
        restores=0,
        started_at=None,
        ended_at=None,
        versions={},
        curve=None,
    )
    (experiment / REPORT_FILE).write_text(json.dumps(report.to_dict()))

    class Grid(list):
        filesystem = pyarrow.fs.LocalFileSystem()
        experiment_path = str(experiment)

    return Grid(trials)


def test_purge_refuses_when_the_released_folder_is_not_in_the_experiment(tmp_path):
    """A path mismatch must not delete the release: nothing is deleted at all."""
    experiment = tmp_path / "experiment"
    (experiment / "trial_a").mkdir(parents=True)
    (experiment / "experiment_state-x.json").write_text("{}")
    grid = fake_grid(experiment, [FakeTrial(tmp_path / "elsewhere", 2.0), FakeTrial(experiment / "trial_a", 1.0)])
    with pytest.raises(PrivacyError, match="not in the experiment folder"):
        release_best(grid, purge=True)
    assert sorted(os.listdir(experiment)) == sorted(["trial_a", "experiment_state-x.json", REPORT_FILE])


def test_purge_keeps_the_privacy_record_and_deletes_every_trial_when_the_searcher_released(tmp_path):
    """DP-BO-style release (no trial kept); the journal, its WAL and a ledger placed there stay."""
    experiment = tmp_path / "experiment"
    names = ["trial_a", "trial_b", "stale_trial_of_an_earlier_session"]
    for name in names:
        (experiment / name / "checkpoint_000000").mkdir(parents=True)
    record = [JOURNAL_FILE, JOURNAL_FILE + "-wal", JOURNAL_FILE + "-shm", "ledger.db", "ledger.db-wal"]
    ray_files = ["tuner.pkl", "basic-variant-state-2020-01-01_00-00-00.json", ".validate_storage_marker"]
    for name in record + ray_files:
        (experiment / name).write_bytes(b"x")
    grid = fake_grid(
        experiment,
        [FakeTrial(experiment / "trial_a", 1.0), FakeTrial(experiment / "trial_b", 2.0)],
        details={"release": {"config": {"v": 0.5}, "score": 0.25}},
        ledger={"path": str(experiment / "ledger.db"), "experiment": "e"},
    )
    released = release_best(grid, purge=True)
    assert released.config == {"v": 0.5} and released.checkpoint_path is None
    assert sorted(os.listdir(experiment)) == sorted([REPORT_FILE, STATEMENT_FILE, *record])


def test_a_trial_the_searcher_names_is_released_only_if_it_ended_its_run(tmp_path):
    """Constant-overhead tuning names its final trial: a failed final trial is never released."""
    experiment = tmp_path / "experiment"
    (experiment / "trial_a").mkdir(parents=True)
    trials = [FakeTrial(experiment / "trial_a", 1.0)]
    grid = fake_grid(experiment, trials, details={"released_trial_id": "trial_a"}, states={"trial_a": "failed"})
    with pytest.raises(PrivacyError, match="ended 'failed', not 'completed'"):
        release_best(grid)
    grid = fake_grid(experiment, trials, details={"released_trial_id": "trial_a"})
    assert release_best(grid).score == 1.0
