"""PrivacyLedger: stored guarantees sum per dataset; concurrency; refused files stay byte-identical."""

import dataclasses
import functools
import hashlib
import json
import multiprocessing
import operator
import pickle
import sqlite3
import threading

import numpy as np
import pytest

from ray_dptune import PointMass, Poisson, PrivacyError, RDPCurve, TrialSpend
from ray_dptune.accounting.bookkeeping.account import SearchAccount
from ray_dptune.accounting.bookkeeping.guarantee import compose_with_releases
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.cli.main import main
from ray_dptune.records.ledger import PrivacyLedger
from ray_dptune.records.store import StoreError

DPSGD_PLAN = TrialSpend(
    sample_rate=0.05, noise_multiplier=1.5, steps=40
)  # a DP-SGD plan (its curve takes ~1 s: used once)
PLAN = RDPCurve.zcdp(rho=0.02)  # a fast plan on the default orders
DELTA = 1e-5
OTHER_ORDERS = 1.0 + np.logspace(-1.0, 2.5, 60)  # a grid that is not DEFAULT_ORDERS


TWO = PointMass(2)


def random_count(law=TWO, plan=PLAN, failed=0):
    """A random-count search's guarantee, with ``failed`` retried attempts charged at the plan."""
    return _random_count(law, json.dumps(plan.to_dict()), failed)


@functools.cache
def _random_count(law, plan, failed):
    account = SearchAccount(SearchMechanism.random_count(law=law, num_trials=2), delta=DELTA, plan=json.loads(plan))
    for index in range(failed):
        account.apply({"type": "started", "trial_id": f"t{index}", "accounted": True})
        account.apply({"type": "failed", "trial_id": f"t{index}", "retry": True})  # Tune retries it: charged
    return account.guarantee(if_stopped_now=True)


def release(epsilon=1.0, delta=1e-6):
    """A DP-BO-like searcher's own (ε, δ) release."""
    return SearchAccount(SearchMechanism.release(epsilon=epsilon, delta=delta), delta=DELTA).guarantee()


def record(ledger, search_id, guarantee, dataset="digits", **summary):
    ledger.record_search(search_id, dataset=dataset, guarantee=guarantee, summary=summary)


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------- totals
def test_a_dataset_total_is_the_sum_of_its_searches(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.db")
    a, b, bo = random_count(), random_count(law=Poisson(3.0), failed=1), release()
    record(ledger, "a", a, searcher="RandomCountSearcher")
    record(ledger, "b", b)
    record(ledger, "bo", bo, searcher="DPBOSearcher")
    record(ledger, "elsewhere", random_count(), dataset="other")

    curve, release_epsilon, release_delta = ledger.dataset_total("digits")
    assert curve == a.curve + b.curve  # bit for bit (Mironov 2017, Prop. 1)
    assert (release_epsilon, release_delta) == (1.0, 1e-6)
    expected = compose_with_releases(a.curve + b.curve, release_epsilon=1.0, release_delta=1e-6, delta=DELTA)
    assert ledger.dataset_epsilon("digits", delta=DELTA) == expected
    assert ledger.dataset_total("digits", exclude="b") == (a.curve, 1.0, 1e-6)
    assert ledger.dataset_total("digits", exclude="bo") == (a.curve + b.curve, 0.0, 0.0)
    assert ledger.datasets() == ["digits", "other"]
    assert ledger.dataset_of("bo") == "digits" and ledger.dataset_of("nope") is None


def test_the_running_search_is_added_as_extra(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.db")
    earlier, running = random_count(), random_count(failed=2)
    record(ledger, "earlier", earlier)
    record(ledger, "running", random_count())  # its stale record is excluded, its live guarantee added
    epsilon = ledger.dataset_epsilon("digits", delta=DELTA, exclude="running", extra=running)
    assert epsilon == compose_with_releases(earlier.curve + running.curve, delta=DELTA)
    with_release = ledger.dataset_epsilon("digits", delta=DELTA, exclude="running", extra=release(0.5, 1e-7))
    assert with_release == compose_with_releases(earlier.curve, release_epsilon=0.5, release_delta=1e-7, delta=DELTA)
    alone = compose_with_releases(running.curve, delta=DELTA)
    assert ledger.dataset_epsilon("empty", delta=DELTA, extra=running) == min(alone, running.epsilon)
    tighter = dataclasses.replace(running, epsilon=0.8 * running.epsilon)  # e.g. private halving's tightening
    assert ledger.dataset_epsilon("empty", delta=DELTA, extra=tighter) == tighter.epsilon  # alone: its own ε
    assert ledger.dataset_epsilon("empty", delta=2 * DELTA, extra=tighter) == compose_with_releases(
        running.curve, delta=2 * DELTA
    )  # another δ: read from its curve
    assert ledger.dataset_epsilon("digits", delta=DELTA, exclude="running", extra=tighter) == epsilon  # composed


def test_the_ledger_shows_each_search_s_epsilon_as_its_account_computed_it(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.db")
    account = SearchAccount(
        SearchMechanism.random_count(law=Poisson(3.0), num_trials=9), delta=DELTA, plan=PLAN.to_dict()
    )
    ledger.record_account("real", dataset="real", account=account, searcher="RandomCountSearcher", journal=None)
    own = account.guarantee(if_stopped_now=True)
    [row] = ledger.searches("real", delta=DELTA)
    assert (row["summary"]["epsilon"], row["summary"]["delta"]) == (own.epsilon, DELTA)
    assert row["epsilon"] == min(own.epsilon, compose_with_releases(own.curve, delta=DELTA))
    curve_epsilon = compose_with_releases(random_count().curve, delta=DELTA)
    record(ledger, "halving", random_count(), epsilon=0.5, delta=DELTA)
    [row] = ledger.searches("digits", delta=DELTA)
    assert row["epsilon"] == 0.5 < curve_epsilon  # not re-derived from its curve, which loses the tightening
    assert ledger.dataset_summary("digits", delta=DELTA)["epsilon"] == 0.5  # one search: the total is its ε
    record(ledger, "second", random_count())
    summary = ledger.dataset_summary("digits", delta=DELTA)
    assert summary["epsilon"] == ledger.dataset_epsilon("digits", delta=DELTA) > 0.5  # two: their curves compose
    [first, _] = summary["searches"]
    assert first["epsilon"] == 0.5 and ledger.searches("digits", delta=2 * DELTA)[0]["epsilon"] > 0.5


def test_a_new_record_of_a_search_replaces_the_old_one(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.db")
    record(ledger, "s", random_count(), step=1)
    first = ledger.searches()[0]
    later = random_count(failed=3)
    record(ledger, "s", later, step=2)
    assert ledger.dataset_total("digits") == (later.curve, 0.0, 0.0)  # replaced, not added
    [search] = ledger.searches()
    assert search["summary"] == {"step": 2} and search["charged_attempts"] == 3
    assert search["created"] == first["created"] and search["updated"] >= first["updated"]


def test_a_search_stays_on_its_dataset(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.db")
    record(ledger, "s", random_count())
    with pytest.raises(PrivacyError, match="recorded in the ledger on dataset 'digits', not 'other'"):
        record(ledger, "s", random_count(failed=1), dataset="other")
    assert ledger.dataset_of("s") == "digits" and ledger.datasets() == ["digits"]
    assert ledger.dataset_total("digits")[0] == random_count().curve


def test_curves_on_other_grids_sum_conservatively(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.db")
    a, b = random_count(), random_count(law=Poisson(2.0))
    other = random_count(plan=RDPCurve.zcdp(rho=0.05, orders=OTHER_ORDERS))
    assert not np.array_equal(other.curve.orders, a.curve.orders)
    for name, guarantee in (("a", a), ("other", other), ("b", b)):
        record(ledger, name, guarantee)
    total = ledger.dataset_total("digits")[0]
    assert total == (a.curve + b.curve) + other.curve  # one sum per grid, grids joined by RDPCurve.__add__
    for part in (a.curve, b.curve, other.curve):
        assert np.all(total.epsilons >= part.at(total.orders))  # each part read at the next order up


@pytest.mark.slow
def test_many_searches_sum_like_sequential_composition(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.db")
    guarantees = [random_count(plan=RDPCurve.zcdp(rho=0.01 * (1 + index)), failed=index % 3) for index in range(40)]
    for index, guarantee in enumerate(guarantees):
        record(ledger, f"s{index}", guarantee)
    total = ledger.dataset_total("digits")[0]
    expected = functools.reduce(operator.add, (g.curve for g in guarantees))
    np.testing.assert_array_equal(total.orders, expected.orders)
    np.testing.assert_allclose(total.epsilons, expected.epsilons, rtol=1e-13)


def test_a_search_without_a_plan_counts_once_it_has_one(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.db")
    account = SearchAccount(SearchMechanism.composition(), delta=DELTA)
    ledger.record_search("s", dataset="digits", guarantee=account.guarantee(), summary={})
    assert ledger.dataset_total("digits") == (None, 0.0, 0.0)  # nothing touched yet
    assert ledger.dataset_epsilon("digits", delta=DELTA) == 0.0

    account.apply({"type": "started", "trial_id": "t1", "accounted": True})  # touched, spend unknown
    ledger.record_search("s", dataset="digits", guarantee=account.guarantee(), summary={})
    with pytest.raises(PrivacyError, match="before their plan was known"):
        ledger.dataset_total("digits")
    assert ledger.dataset_total("digits", exclude="s") == (None, 0.0, 0.0)
    assert ledger.searches(delta=DELTA)[0]["epsilon"] is None

    account.apply({"type": "plan", "plan": PLAN.to_dict()})
    ledger.record_search("s", dataset="digits", guarantee=account.guarantee(), summary={})
    assert ledger.dataset_total("digits")[0] == PLAN


def test_searches_lists_each_contribution(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.db")
    a, bo = random_count(plan=DPSGD_PLAN), release()
    record(ledger, "a", a, searcher="RandomCountSearcher", plan=DPSGD_PLAN.to_dict())
    record(ledger, "bo", bo)
    record(ledger, "x", random_count(), dataset="other")
    listed = ledger.searches("digits", delta=DELTA, curves=True)
    assert [s["search_id"] for s in listed] == ["a", "bo"]  # oldest first
    assert listed[0]["summary"] == {"searcher": "RandomCountSearcher", "plan": DPSGD_PLAN.to_dict()}
    assert listed[0]["epsilon"] == pytest.approx(a.epsilon, rel=1e-9) and listed[0]["epsilon"] >= a.epsilon
    assert RDPCurve.from_dict(listed[0]["curve"]) == a.curve and listed[0]["rdp"]
    assert listed[1]["epsilon"] == 1.0 and listed[1]["curve"] is None and not listed[1]["rdp"]
    assert (listed[1]["release_epsilon"], listed[1]["release_delta"]) == (1.0, 1e-6)
    assert len(ledger.searches()) == 3 and "epsilon" not in ledger.searches()[0]
    json.dumps(listed)


def test_bad_input(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.db")
    with pytest.raises(ValueError, match="dataset"):
        record(ledger, "s", random_count(), dataset=" ")
    with pytest.raises(ValueError, match="search_id"):
        record(ledger, "", random_count())
    with pytest.raises(TypeError, match="Guarantee"):
        record(ledger, "s", random_count().curve)
    assert ledger.searches() == []


def test_a_ledger_pickles_and_reopens(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger.db")
    record(ledger, "a", random_count())
    copy = pickle.loads(pickle.dumps(ledger))
    record(copy, "b", random_count())
    assert ledger.dataset_total("digits")[0] == random_count().curve * 2


# ---------------------------------------------------------------------- sharing
def _write_searches(path, index, guarantee, count=10):
    ledger = PrivacyLedger(path)
    for j in range(count):
        ledger.record_search(f"w{index}-{j}", dataset="digits", guarantee=guarantee, summary={"writer": index})


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_concurrent_writers_lose_nothing(tmp_path, kind):
    path = tmp_path / "ledger.db"
    PrivacyLedger(path).close()  # created first: SQLiteStore's creation is not safe under concurrent opens
    guarantee = random_count()
    if kind == "threads":
        errors = []

        def writer(index):
            try:
                _write_searches(path, index, guarantee)
            except Exception as error:  # noqa: BLE001 - any error of a writer thread is reported below
                errors.append(error)

        workers = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    else:
        context = multiprocessing.get_context("fork")
        workers = [context.Process(target=_write_searches, args=(path, i, guarantee)) for i in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if kind == "threads":
        assert not errors
    else:
        assert [worker.exitcode for worker in workers] == [0] * 4
    ledger = PrivacyLedger(path)
    assert len(ledger.searches("digits")) == 40
    total = ledger.dataset_total("digits")[0]
    np.testing.assert_allclose(total.epsilons, (random_count().curve * 40).epsilons, rtol=1e-13)


def test_a_locked_ledger_raises_and_keeps_every_record(tmp_path):
    path = tmp_path / "ledger.db"
    ledger = PrivacyLedger(path, timeout=0.2)
    record(ledger, "a", random_count())
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    with pytest.raises(StoreError, match="locked") as raised:
        record(ledger, "b", random_count())
    assert isinstance(raised.value, PrivacyError)
    assert ledger.dataset_total("digits")[0] == random_count().curve  # WAL: readers go on
    blocker.execute("ROLLBACK")
    blocker.close()
    record(ledger, "b", random_count())
    assert [s["search_id"] for s in ledger.searches()] == ["a", "b"]


# ---------------------------------------------------------------------- refused files
def _zero_bytes(path):
    path.write_bytes(b"")


def _not_a_database(path):
    path.write_bytes(b"this is not a database" * 100)


def _foreign_database(path):
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (body TEXT)")
        db.execute("INSERT INTO notes VALUES ('mine')")
    db.close()


def _newer_version(path):
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE searches (search_id TEXT PRIMARY KEY)")
        db.execute("PRAGMA user_version = 3")
    db.close()


def _old_ledger(path):
    """The schema-v0 layout of the first ledger (no user_version), in WAL mode as it ran."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(
        """
        CREATE TABLE experiments (experiment_id TEXT PRIMARY KEY, dataset TEXT NOT NULL, created REAL NOT NULL,
            law TEXT NOT NULL, num_trials INTEGER NOT NULL, density_ratio REAL NOT NULL, plan TEXT);
        CREATE TABLE attempts (experiment_id TEXT NOT NULL REFERENCES experiments(experiment_id),
            trial_id TEXT NOT NULL, attempt INTEGER NOT NULL, status TEXT NOT NULL, spent TEXT,
            updated REAL NOT NULL, PRIMARY KEY (experiment_id, trial_id, attempt));
        CREATE INDEX experiments_by_dataset ON experiments(dataset);
        INSERT INTO experiments VALUES ('e1', 'digits', 0.0, '{"kind": "point_mass", "k": 1}', 1, 1.0, NULL);
        """
    )
    db.close()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_zero_bytes, "empty \\(0-byte\\) file"),
        (_not_a_database, "not a database"),
        (_foreign_database, "no ray_dptune schema version"),
        (_newer_version, "schema version 3"),
        (_old_ledger, "no ray_dptune schema version .* expected version 2"),
    ],
)
def test_unreadable_files_are_refused_and_left_byte_identical(tmp_path, make, message):
    path = tmp_path / "ledger.db"
    make(path)
    before = digest(path)
    with pytest.raises(StoreError, match=message):
        PrivacyLedger(path)
    assert digest(path) == before


def test_a_corrupt_page_raises_and_the_file_is_left_untouched(tmp_path):
    path = tmp_path / "ledger.db"
    ledger = PrivacyLedger(path)
    for index in range(20):
        record(ledger, f"s{index}", random_count(), note="x" * 500)
    ledger.close()  # checkpoints the WAL into the file
    data = bytearray(path.read_bytes())
    page = 4096
    data[page : 2 * page] = b"\xff" * page  # the table's root page
    path.write_bytes(bytes(data))
    before = digest(path)
    with pytest.raises(PrivacyError, match="corrupt"):
        PrivacyLedger(path).dataset_total("digits")
    assert digest(path) == before


# ---------------------------------------------------------------------- CLI
def test_cli_shows_and_exports_totals(tmp_path, capsys):
    path = tmp_path / "ledger.db"
    ledger = PrivacyLedger(path)
    a, b = random_count(), random_count(failed=1)
    record(ledger, "a", a)
    record(ledger, "b", b)
    record(ledger, "bo", release())
    total = compose_with_releases(a.curve + b.curve, release_epsilon=1.0, release_delta=1e-6, delta=DELTA)
    assert main(["ledger", "show", str(path), "--delta", "1e-5"]) == 0
    out = capsys.readouterr().out
    assert "digits" in out and f"{total:.4f}" in out
    assert main(["ledger", "export", str(path), "--delta", "1e-5", "--curves"]) == 0
    exported = json.loads(capsys.readouterr().out)["datasets"]["digits"]
    assert exported["epsilon"] == total and exported["note"] is None
    assert exported["num_searches"] == 3 and exported["charged_attempts"] == 1
    assert [s["search_id"] for s in exported["searches"]] == ["a", "b", "bo"]
    assert RDPCurve.from_dict(exported["searches"][1]["curve"]) == b.curve


def test_cli_explains_a_total_without_a_bound(tmp_path, capsys):
    path = tmp_path / "ledger.db"
    ledger = PrivacyLedger(path)
    for index in range(20):
        record(ledger, f"bo{index}", release(delta=1e-6))  # 2e-5 of δ in all
    assert main(["ledger", "show", str(path), "--delta", "1e-5"]) == 0
    out = capsys.readouterr().out
    assert "Ask for a larger δ" in out
    assert main(["ledger", "export", str(path), "--delta", "1e-4"]) == 0
    assert json.loads(capsys.readouterr().out)["datasets"]["digits"]["epsilon"] == pytest.approx(20.0)


def test_cli_refuses_an_old_ledger_and_leaves_it(tmp_path, capsys):
    path = tmp_path / "ledger.db"
    _old_ledger(path)
    before = digest(path)
    with pytest.raises(SystemExit) as raised:
        main(["ledger", "show", str(path)])
    assert raised.value.code == 1
    assert "schema version" in capsys.readouterr().err
    assert digest(path) == before


def test_a_cached_total_sees_every_other_drivers_record(tmp_path):
    path = tmp_path / "ledger.db"
    mine, theirs = PrivacyLedger(path), PrivacyLedger(path)
    a, b = random_count(), random_count(failed=1)
    record(mine, "running", a)
    record(mine, "earlier", a)
    cached = mine.dataset_total("digits", exclude="running")
    record(mine, "running", b)  # the running search's own record: the cached total stays valid
    assert mine.dataset_total("digits", exclude="running") is cached
    record(theirs, "theirs", b)  # another connection's commit
    assert mine.dataset_total("digits", exclude="running")[0] == a.curve + b.curve
    record(mine, "mine", b)  # this connection's own commit of a search the total includes
    assert mine.dataset_total("digits", exclude="running")[0] == a.curve + b.curve + b.curve
    assert mine.dataset_total("digits")[0] == b.curve + a.curve + b.curve + b.curve
    mine.close()
    record(theirs, "late", a)
    assert mine.dataset_total("digits", exclude="running")[0] == a.curve + b.curve + b.curve + a.curve


def test_a_damaged_curve_record_raises(tmp_path):
    path = tmp_path / "ledger.db"
    ledger = PrivacyLedger(path)
    record(ledger, "a", random_count())
    record(ledger, "b", random_count())
    with sqlite3.connect(path) as db:  # another program truncates one curve by a value
        db.execute("UPDATE searches SET epsilons = substr(epsilons, 1, length(epsilons) - 8) WHERE search_id = 'a'")
    db.close()
    with pytest.raises(PrivacyError, match="corrupt curve"):
        ledger.dataset_total("digits")
    with pytest.raises(PrivacyError, match="record of search 'a' is corrupt"):
        ledger.searches(delta=DELTA)


def test_with_a_ledger_a_search_keeps_its_own_cap(tmp_path):
    """private_tuner(ledger=...) caps the dataset's total where asked and, always, the search's own guarantee."""
    from ray_dptune import BudgetExceededError, PrivacyAccountantCallback, RandomCountSearcher

    plan = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=40)
    account = SearchAccount(
        SearchMechanism.random_count(law=PointMass(2), num_trials=2), delta=DELTA, plan=plan.to_dict()
    )
    one_more = account.guarantee(extra_charges=1).epsilon
    cap = (account.guarantee().epsilon + one_more) / 2  # the search fits, one charged attempt more does not

    def accountant(search_epsilon):
        return PrivacyAccountantCallback(
            RandomCountSearcher(PointMass(2), seed=0),
            delta=DELTA,
            plan=plan,
            ledger=PrivacyLedger(str(tmp_path / "ledger.db")),
            dataset="digits",
            search_epsilon=search_epsilon,
            verbose=False,
        )

    with pytest.raises(PrivacyError, match="above target_epsilon"):
        accountant(account.guarantee().epsilon * 0.99)  # refused before any trial
    capped = accountant(cap)
    for trial in ("a", "b"):
        capped.account.apply({"type": "suggested", "trial_id": trial, "accounted": True})
    with pytest.raises(BudgetExceededError, match="the search's guarantee to"):
        capped._record({"type": "suggested", "trial_id": "c", "accounted": True})  # a third: beyond K, charged
    assert "c" not in capped.account.trials
