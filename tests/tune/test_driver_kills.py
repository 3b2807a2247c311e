"""SIGKILL the driver of a private search at many instants, restore it, and audit the report.

Each variant runs ``tests/kill_driver.py`` as a separate driver process on the shared
Ray session (forked by tests/driver_server.py, which pays Python's imports once: each
driver is still a process of its own, with its own Ray connection), kills it with SIGKILL at the given instants (a suggestion, an attempt
start, mid-report, right after Tune's experiment checkpoint, or a timer), restores it
with ``tune.Tuner.restore`` after each kill, and lets the last driver finish. The
trainable logs every start to a side file, independently of the driver. With K fixed
(PointMass), at most K attempts can be covered by the selection bound, so the attempts
the side file saw imply ε ≥ ε(max(A, K) · plan); the report must never say less.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from ray_dptune.accounting.bookkeeping.account import SearchAccount
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the drivers
from kill_driver import DELTA, PLAN


def drive(
    drivers, tmp_path, name: str, kills: list[list[str]], *, k: int = 3, extra: list[str] = (), env: dict | None = None
):
    """Runs the driver once per kill (each must die by SIGKILL), then once to the end (``drivers``: conftest)."""
    import ray

    side = tmp_path / f"{name}.side"
    side.touch()
    environment = {
        **os.environ,
        "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
        "SIDE_FILE": str(side),
        # Tune saves its experiment state (what Tuner.restore needs) every step, not every ~10 s,
        # so that short runs can be restored; the journal does not depend on it.
        "TUNE_GLOBAL_CHECKPOINT_S": "0",
    }
    environment.update(env or {})
    killed = 0
    for run, kill in enumerate([*kills, []]):
        args = [str(tmp_path), name, str(side), "--k", str(k), *extra, *kill]
        if run:
            args.append("--restore")
        process = drivers.run("kill_driver", args, env=environment, timeout=300)
        if kill and process.returncode == -9:
            killed += 1
            continue
        if _ray_could_not_restore(process):
            return None, _starts(side), killed
        assert process.returncode == 0, process.stderr[-3000:]
        break
    with open(tmp_path / name / "privacy_report.json") as file:
        report = json.load(file)
    return report, _starts(side), killed


def _ray_could_not_restore(process) -> bool:
    """Ray's own state was cut mid-write by a kill, so Tune cannot go on: ``tuner.pkl`` or the callbacks'
    state is truncated (``Tuner.restore`` fails), or the searcher state is, and Tune restarts the run with
    num_samples=1, which the accountant refuses before any trial (a silent truncation of K)."""
    restarted = (
        "Failed to restore the run state" in process.stderr and "num_samples=1 would silently stop" in process.stderr
    )
    truncated_tuner = "_restore_from_path_or_uri" in process.stderr and "EOFError" in process.stderr
    truncated_callbacks = "restore_from_dir" in process.stderr and "EOFError" in process.stderr  # callback-states-*.pkl
    return process.returncode != 0 and (restarted or truncated_tuner or truncated_callbacks)


def _starts(side) -> list[str]:
    lines = side.read_text().split()
    return [lines[i + 1] for i in range(0, len(lines), 2) if lines[i] == "start" and lines[i + 1] != "None"]


def implied_epsilon(attempts: int, k: int) -> float:
    """The least ε any honest account can give A attempts under a K-run bound: max(A, K) plans composed."""
    return (max(attempts, k) * PLAN.curve()).epsilon(delta=DELTA)


def audit_journal(folder, starts: list[str], k: int) -> None:
    """Audits what the journal alone proves (no report was written: Ray could not restore)."""
    from ray_dptune.records.journal import SearchJournal

    path = folder / "privacy_journal.db"
    if not path.exists() or SearchJournal(path).search() is None:
        # killed before the journal's first record: no attempt was recorded, so none trained (write-ahead)
        assert starts == []
        return
    audit(journal_report(folder), starts, k)


def journal_report(folder) -> dict:
    """What the journal alone says, charging what a dead driver left live (no report was written)."""
    from ray_dptune.records.journal import SearchJournal

    account = SearchJournal(folder / "privacy_journal.db").account()
    account.restored()
    trials = {trial: {"attempts": account.attempts_of(trial)} for trial in account.trials}
    guarantee = account.guarantee(if_stopped_now=True).to_dict()
    return {"guarantee": guarantee, "trials": trials, "journal": str(folder / "privacy_journal.db"), "restores": 0}


def audit(report: dict, starts: list[str], k: int) -> None:
    recorded = {trial: len(record["attempts"]) for trial, record in report["trials"].items()}
    # every attempt the side file saw run, and every one the journal recorded (a killed one may have trained
    # without reaching the side file): each beyond K is charged
    attempts = max(len(starts), sum(recorded.values()))
    guarantee = report["guarantee"]
    assert guarantee["epsilon"] >= implied_epsilon(attempts, k) * (1 - 1e-12), (attempts, guarantee)
    assert guarantee["charged_attempts"] >= attempts - k
    for trial in set(starts):  # the journal saw every attempt the side file saw
        assert recorded.get(trial, 0) >= starts.count(trial), (trial, recorded)
    # the report is exactly the account of its own journal, and the journal can be replayed
    from ray_dptune.records.journal import SearchJournal

    replayed = SearchJournal(report["journal"]).account()
    if report["restores"] == 0 and report.get("searcher") is None:  # from the journal alone
        replayed.restored()
    assert replayed.guarantee(if_stopped_now=True).epsilon == pytest.approx(guarantee["epsilon"], rel=1e-12)


ASHA_KILLS = {
    "mid-report": [["--kill", "result:3"], ["--kill", "result:2"]],
    "after-a-start": [["--kill", "start:2"], ["--kill", "start:1"]],
    "timed": [["--kill-after", "0.5"], ["--kill-after", "1.1"]],
}


@pytest.mark.parametrize("kills", list(ASHA_KILLS.values()), ids=list(ASHA_KILLS))
def test_a_killed_private_asha_search_never_under_counts_a_unit(drivers, tmp_path, kills):
    """Every time unit the side file saw run was charged to its trial before it ran, across kills."""
    from kill_driver import ASHA_PLAN

    from ray_dptune.records.journal import SearchJournal

    report, _, killed = drive(drivers, tmp_path, "asha", kills, k=2, extra=["--asha"])
    assert killed >= 1
    units = [line.split()[1] for line in (tmp_path / "asha.side").read_text().splitlines() if line.startswith("unit")]
    account = SearchJournal(tmp_path / "asha" / "privacy_journal.db").account()
    for trial in {unit.split("/")[0] for unit in units}:
        ran = sum(unit.split("/")[0] == trial for unit in units)  # re-runs after a kill included
        charged = sum(attempt["units"] for attempt in account.attempts_of(trial))
        assert ran <= charged, (trial, ran, charged)
    assert len(units) <= account.units_charged <= 2 * 3  # never past the budget of 2 whole trials
    budget = ASHA_PLAN.repeated(2).curve().mechanism.epsilon(delta=DELTA)
    if report is not None:
        assert report["guarantee"]["epsilon"] == pytest.approx(budget, rel=1e-12)


KILL_PLANS = {
    "after-a-suggestion": [["--kill", "suggest:1"], ["--kill", "suggest:1"]],
    "after-a-start": [["--kill", "start:1"], ["--kill", "start:2"]],
    "mid-report": [["--kill", "result:2"], ["--kill", "result:4"], ["--kill", "result:1"]],
    "after-a-checkpoint": [["--kill", "step:30"], ["--kill", "step:60"], ["--kill", "step:20"]],
    "timed": [["--kill-after", "0.1"], ["--kill-after", "0.45"], ["--kill-after", "0.8"]],
    "repeated": [["--kill", "start:1"], ["--kill", "result:1"], ["--kill", "suggest:1"], ["--kill", "start:1"]],
}


RERUN_KILLS = {"after-a-start", "repeated"}
"""Variants that kill the driver just after the accountant recorded an attempt (it cannot have ended): the
restored driver runs that trial again, so the journal holds more than K attempts, and the audit's ε check bites
whether or not the killed attempt got as far as the side file (on a slow machine it may not). A kill mid-report
or after a checkpoint may land on a trial's last step, so those variants need not re-run anything."""


@pytest.mark.parametrize("variant", list(KILL_PLANS))
def test_a_killed_driver_never_under_counts(drivers, tmp_path, variant):
    kills = KILL_PLANS[variant]
    report, starts, killed = drive(drivers, tmp_path, "search", kills)
    assert killed >= 1  # the test killed for real
    if report is None:  # a kill cut Ray's own state files: Tune could not restore; the journal still can
        print(f"killed {killed} of {len(kills)}; {len(starts)} attempts ran; Ray could not restore")
        audit_journal(tmp_path / "search", starts, k=3)
        return
    print(f"killed {killed} of {len(kills)}; {len(starts)} attempts ran; restores {report['restores']}")
    if variant in RERUN_KILLS:  # a killed attempt ran again once Tune restored: the charge audited is not vacuous
        assert sum(len(record["attempts"]) for record in report["trials"].values()) > 3, report["trials"]
    audit(report, starts, k=3)
    # each restore that found the journal is on record; a kill before the journal's first attempt leaves
    # nothing to restore (the next driver starts the search), so only a kill after it must show one
    kills = (tmp_path / "search.side").read_text().splitlines()
    assert kills.count("kill journal") + kills.count("kill none") == killed
    assert report["restores"] <= killed
    if "kill journal" in kills:
        assert report["restores"] >= 1


def test_with_a_ledger_the_dataset_total_covers_every_attempt(drivers, tmp_path):
    from ray_dptune.records.ledger import PrivacyLedger

    ledger_path = tmp_path / "ledger.db"
    kills = [["--kill", "result:3"], ["--kill", "start:1"], ["--kill-after", "0.3"]]
    report, starts, killed = drive(drivers, tmp_path, "ledgered", kills, extra=["--ledger", str(ledger_path)])
    assert killed >= 2 or (killed >= 1 and report is None)  # (None: a kill cut Ray's own state: no restore)
    total = PrivacyLedger(ledger_path).dataset_epsilon("kills", delta=DELTA)
    assert total >= implied_epsilon(len(starts), 3) * (1 - 1e-12)  # the ledger alone never under-counts
    if report is None:
        audit_journal(tmp_path / "ledgered", starts, k=3)
    else:
        audit(report, starts, k=3)
        assert total == pytest.approx(report["guarantee"]["epsilon"], rel=1e-9)


def test_an_adaptive_dp_hypo_search_killed_mid_report_never_under_counts(drivers, tmp_path):
    kills = [["--kill", "result:2"], ["--kill", "start:1"]]
    report, starts, killed = drive(drivers, tmp_path, "adaptive", kills, extra=["--dphypo"])
    assert killed >= 1
    if report is None:
        audit_journal(tmp_path / "adaptive", starts, k=3)
        return
    assert report["searcher"] == "KillingDPHyPOSearcher" and report["density_ratio"] == 4.0
    audit(report, starts, k=3)


def test_with_the_real_dp_trainable(drivers, tmp_path):
    """Opacus DP-SGD on digits, killed mid-report: the restored report charges the lost attempt."""
    report, starts, killed = drive(drivers, tmp_path, "digits", [["--kill", "result:1"]], k=2, extra=["--digits"])
    assert killed == 1
    report = report or journal_report(tmp_path / "digits")  # None: Ray could not restore its own state
    from ray_dptune.accounting.bookkeeping.spend import curve_from_report
    from ray_dptune.records.journal import SearchJournal

    plan = SearchJournal(tmp_path / "digits" / "privacy_journal.db").account().plan
    least = (max(len(starts), 2) * curve_from_report(plan)).epsilon(delta=DELTA)
    assert report["guarantee"]["epsilon"] >= least * (1 - 1e-12)
    assert len(starts) > 2 or report["guarantee"]["charged_attempts"] >= 1


def test_a_new_search_into_a_used_folder_is_refused_and_the_first_report_kept(drivers, tmp_path):
    drive(drivers, tmp_path, "once", [])
    before = (tmp_path / "once" / "privacy_report.json").read_bytes()
    import ray

    environment = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    side = tmp_path / "again.side"
    process = drivers.run("kill_driver", [str(tmp_path), "once", str(side), "--k", "1"], env=environment)
    assert process.returncode != 0
    assert "already holds the privacy record of search" in process.stderr
    assert (tmp_path / "once" / "privacy_report.json").read_bytes() == before
    assert not side.exists() or "start" not in side.read_text()  # refused before any trial trained


def test_replaying_a_journal_after_a_restore_charges_every_live_attempt():
    account = SearchAccount(
        SearchMechanism.random_count(law=_point_mass(2), num_trials=2), delta=DELTA, plan=PLAN.to_dict()
    )
    for event in (
        {"type": "suggested", "trial_id": "a", "accounted": True},
        {"type": "started", "trial_id": "a", "accounted": True},
        {"type": "reported", "trial_id": "a", "spent": PLAN.to_dict()},
        {"type": "completed", "trial_id": "a"},
        {"type": "suggested", "trial_id": "b", "accounted": True},
        {"type": "started", "trial_id": "b", "accounted": True},
        {"type": "suggested", "trial_id": "c", "accounted": True},  # fate unknown
    ):
        account.apply(event)
    assert account.charged_attempts() == 1  # live: b covered, c beyond K = 2
    assert account.charged_attempts(if_stopped_now=True) == 2  # only a is known to have completed
    account.restored()
    assert account.charged_attempts() == 2
    account.apply({"type": "started", "trial_id": "b", "accounted": True})  # Tune restarts b
    account.apply({"type": "completed", "trial_id": "b"})
    assert account.charged_attempts() == 2  # b's first attempt and c stay charged
    assert account.guarantee().epsilon == pytest.approx((4 * PLAN.curve()).epsilon(delta=DELTA), rel=1e-12)


def _point_mass(k):
    from ray_dptune.accounting.bounds.distributions import PointMass

    return PointMass(k)
