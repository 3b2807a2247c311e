"""The write-ahead journal: its records, its refusals, and the account rebuilt from it (no Ray)."""

from __future__ import annotations

import hashlib
import json
import sqlite3

import pytest

from ray_dptune import PointMass, TrialSpend
from ray_dptune.accounting.bookkeeping.account import SearchAccount
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.cli.main import main as cli
from ray_dptune.errors import PrivacyError
from ray_dptune.records.journal import JOURNAL_FILE, SearchJournal, journal_summary

PLAN = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=40)
DELTA = 1e-5
MECHANISM = SearchMechanism.random_count(law=PointMass(2), num_trials=2)
RECORD = {"mechanism": MECHANISM.to_dict(), "delta": DELTA, "plan": PLAN.to_dict(), "searcher": "RandomCountSearcher"}
EVENTS = [
    {"type": "suggested", "trial_id": "a", "accounted": True},
    {"type": "started", "trial_id": "a", "accounted": True},
    {"type": "reported", "trial_id": "a", "spent": PLAN.to_dict()},
    {"type": "completed", "trial_id": "a"},
    {"type": "suggested", "trial_id": "b", "accounted": True},
    {"type": "started", "trial_id": "b", "accounted": True},  # the driver dies here
]


def journal(tmp_path) -> SearchJournal:
    written = SearchJournal(tmp_path / JOURNAL_FILE)
    written.begin("s1", RECORD, EVENTS[:2])
    written.append(EVENTS[2:])
    return written


def test_replay_gives_the_account_the_events_built(tmp_path):
    live = SearchAccount(MECHANISM, delta=DELTA, plan=PLAN.to_dict())
    for event in EVENTS:
        live.apply(event)
    replayed = journal(tmp_path).account()
    assert replayed.charged_attempts() == live.charged_attempts() == 0
    assert replayed.guarantee().epsilon == live.guarantee().epsilon
    replayed.restored()  # b's attempt was left live by a dead driver: charged
    assert replayed.charged_attempts() == 1
    assert replayed.guarantee().epsilon == pytest.approx((3 * PLAN.curve()).epsilon(delta=DELTA), rel=1e-12)


def test_a_second_search_is_refused_and_the_first_kept(tmp_path):
    journal(tmp_path)
    before = SearchJournal(tmp_path / JOURNAL_FILE).events()
    with pytest.raises(PrivacyError, match="already holds the privacy record of search s1"):
        SearchJournal(tmp_path / JOURNAL_FILE).begin("s2", RECORD, [{"type": "restored"}])
    assert SearchJournal(tmp_path / JOURNAL_FILE).events() == before


def test_events_that_add_cost_are_synced_and_the_rest_are_not(tmp_path):
    written = journal(tmp_path)
    modes = []
    with written._store.reading() as db:
        db.set_trace_callback(
            lambda sql: modes.append(sql.split("=")[1]) if sql.startswith("PRAGMA synchronous=") else None
        )
    written.append([{"type": "completed", "trial_id": "b"}])
    written.append([{"type": "suggested", "trial_id": "c", "accounted": True}])
    written.append([{"type": "restored"}])
    assert modes == ["NORMAL", "FULL", "FULL"]


def test_a_foreign_or_empty_file_is_refused_untouched(tmp_path):
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(PrivacyError, match="0-byte"):
        SearchJournal(empty).search()
    foreign = tmp_path / "foreign.db"
    db = sqlite3.connect(foreign)
    db.execute("CREATE TABLE things (x)")
    db.commit()
    db.close()
    digest = hashlib.sha256(foreign.read_bytes()).hexdigest()
    with pytest.raises(PrivacyError, match="not a privacy journal this version of ray_dptune reads"):
        SearchJournal(foreign).events()
    assert hashlib.sha256(foreign.read_bytes()).hexdigest() == digest


def test_the_cli_shows_what_a_killed_search_spent(tmp_path, capsys):
    journal(tmp_path).close()
    assert cli(["journal", str(tmp_path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary == journal_summary(tmp_path)
    assert summary["attempts"] == {"completed": 1, "unknown": 1} and summary["restores"] == 0
    assert summary["guarantee"]["epsilon"] == pytest.approx((3 * PLAN.curve()).epsilon(delta=DELTA), rel=1e-12)
    assert SearchJournal(tmp_path / JOURNAL_FILE).account().restores == 0  # the CLI wrote nothing
    assert cli(["journal", str(tmp_path)]) == 0
    assert "1 attempt(s) charged" in capsys.readouterr().out


def test_each_event_type_is_folded_and_any_other_is_refused():
    from ray_dptune.accounting.bookkeeping.account import EVENT_TYPES

    events = {
        "plan": {"plan": PLAN.to_dict()},
        "restored": {},
        "selection": {},
        "release": {"release": {}},
        "ended": {"complete": True},
        "suggested": {"trial_id": "a", "accounted": True},
        "started": {"trial_id": "a", "accounted": True},
        "charged": None,  # a halving search's scheduler only
        "reported": {"trial_id": "a", "spent": PLAN.to_dict()},
        "completed": {"trial_id": "a"},
        "failed": {"trial_id": "a"},
        "interrupted": {"trial_id": "a"},
    }
    assert set(events) == set(EVENT_TYPES)
    account = SearchAccount(MECHANISM, delta=DELTA)
    for kind, fields in events.items():
        if fields is not None:
            account.apply({"type": kind, **fields})
    assert account.attempts_of("a")[-1]["state"] == "completed" and account.restores == 1
    with pytest.raises(ValueError, match="Unknown account event 'bogus'"):
        account.apply({"type": "bogus"})
