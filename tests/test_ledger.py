"""PrivacyLedger: composition across searches, concurrency, corruption, restore checks."""

import json
import sqlite3
import threading

import numpy as np
import pytest

from ray_dptune import PointMass, Poisson, PrivacyError, TrialSpend, repeat_and_select
from ray_dptune.cli import main
from ray_dptune.ledger import PrivacyLedger

PLAN = TrialSpend(0.05, 1.5, 40)
LAW = Poisson(4.0)


def register(ledger, dataset="digits", plan=PLAN, law=LAW):
    return ledger.register_experiment(
        dataset, law=law.to_dict(), num_trials=3, density_ratio=1.0, plan=None if plan is None else plan.to_dict()
    )


def test_searches_on_one_dataset_compose(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.db")
    first, second = register(ledger), register(ledger)
    register(ledger, dataset="other")
    ledger.record_attempts(
        second, {"t1": [{"status": "failed", "spent": None}, {"status": "completed", "spent": PLAN.to_dict()}]}
    )
    selection = repeat_and_select(PLAN.curve(), LAW)
    expected = selection + selection + PLAN.curve()  # two searches + one failed attempt
    np.testing.assert_allclose(ledger.dataset_curve("digits").epsilons, expected.epsilons, rtol=1e-12)
    np.testing.assert_allclose(
        ledger.dataset_curve("digits", exclude=first).epsilons, (selection + PLAN.curve()).epsilons, rtol=1e-12
    )
    assert ledger.datasets() == ["digits", "other"]
    assert [e["experiment_id"] for e in ledger.experiments("digits")] == [first, second]


def test_a_search_without_plan_counts_once_it_has_started(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.db")
    experiment = register(ledger, plan=None)
    assert ledger.dataset_curve("digits") is None  # registered, nothing touched yet
    ledger.record_attempts(experiment, {"t1": [{"status": "running", "spent": None}]})
    with pytest.raises(PrivacyError, match="without a recorded plan"):
        ledger.dataset_curve("digits")
    ledger.record_plan(experiment, PLAN.to_dict())
    assert ledger.dataset_curve("digits") == repeat_and_select(PLAN.curve(), LAW)


def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "ledger.db"
    PrivacyLedger(path)
    errors = []

    def writer(index):
        try:
            ledger = PrivacyLedger(path)
            for j in range(10):
                experiment = register(ledger, law=PointMass(1))
                ledger.record_attempts(
                    experiment, {f"t{index}-{j}": [{"status": "completed", "spent": PLAN.to_dict()}]}
                )
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    experiments = PrivacyLedger(path).experiments("digits")
    assert len(experiments) == 40 and all(len(e["attempts"]) == 1 for e in experiments)


def test_a_locked_ledger_raises_and_keeps_every_record(tmp_path):
    path = tmp_path / "ledger.db"
    ledger = PrivacyLedger(path, timeout=0.2)
    experiment = register(ledger)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    with pytest.raises(PrivacyError, match="locked"):
        register(ledger)
    blocker.execute("ROLLBACK")
    blocker.close()
    assert [e["experiment_id"] for e in ledger.experiments()] == [experiment]


def test_a_corrupt_ledger_raises_and_is_left_untouched(tmp_path):
    path = tmp_path / "ledger.db"
    path.write_bytes(b"this is not a database" * 100)
    before = path.read_bytes()
    with pytest.raises(PrivacyError, match="corrupt"):
        PrivacyLedger(path)
    assert path.read_bytes() == before


def test_bad_input(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.db")
    with pytest.raises(ValueError, match="dataset"):
        register(ledger, dataset=" ")
    with pytest.raises(ValueError, match="not in this ledger"):
        ledger.record_plan("nope", PLAN.to_dict())


def test_cli_shows_and_exports_totals(tmp_path, capsys):
    path = tmp_path / "ledger.db"
    ledger = PrivacyLedger(path)
    register(ledger)
    register(ledger)
    assert main(["ledger", "show", str(path), "--delta", "1e-5"]) == 0
    out = capsys.readouterr().out
    total = (repeat_and_select(PLAN.curve(), LAW) * 2).epsilon(1e-5)
    assert "digits" in out and f"{total:.4f}" in out
    assert main(["ledger", "export", str(path), "--delta", "1e-5"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported["datasets"]["digits"]["epsilon"] == pytest.approx(total, rel=1e-12)
    assert len(exported["datasets"]["digits"]["experiments"]) == 2


def test_a_superseded_running_attempt_counts_as_failed(tmp_path):
    """A driver that died mid-attempt leaves it 'running'; a later attempt proves it ended."""
    ledger = PrivacyLedger(tmp_path / "ledger.db")
    experiment = register(ledger, law=PointMass(1))
    ledger.record_attempts(experiment, {"t1": [{"status": "running", "spent": None}]}, durable=False)
    np.testing.assert_allclose(ledger.dataset_curve("digits").epsilons, PLAN.curve().epsilons, rtol=1e-12)
    ledger.record_attempts(
        experiment, {"t1": [{"status": "running", "spent": None}, {"status": "running", "spent": None}]}, durable=False
    )
    np.testing.assert_allclose(ledger.dataset_curve("digits").epsilons, (2 * PLAN.curve()).epsilons, rtol=1e-12)
