"""Per-search costs against the number of earlier searches: they must stay flat.

Each section is a function ``name_scaling(args) -> dict`` registered in ``SECTIONS``;
it returns its rows, the columns to print and its goal. A run updates only the
sections it ran in ``results/scaling.json`` (the others are kept) and rewrites
``results/scaling.md`` from that file, so sections may be re-run one at a time.

``ledger``: a :class:`~ray_dptune.records.ledger.PrivacyLedger` holding N earlier searches on
one dataset (random-count searches with a DP-SGD plan, some with charged attempts,
and one DP-BO release in ten), opened by two drivers. Timed, in rounds, median over
``--repeats`` rounds: another driver recording a new search; the dataset's total and
ε with the running search added (``dataset_epsilon(..., extra=...)``) right after it,
so a full scan; the running search's driver updating its own record (what the
callback does on each change); ε again, now from the cache. Goal: record and ε
(scan) ≤ 50 ms at 300 earlier searches.

Usage::

    .venv/bin/python benchmarks/scaling.py                      # every section, N = 10 and 300
    .venv/bin/python benchmarks/scaling.py --only ledger --counts 10 300 3000
    .venv/bin/python benchmarks/scaling.py --only driver --trials 100 2000
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import shlex
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from ray_dptune import Poisson, TrialSpend
from ray_dptune.accounting.bookkeeping.account import SearchAccount
from ray_dptune.accounting.bookkeeping.guarantee import Guarantee
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.records.ledger import PrivacyLedger

RESULTS_DIR = Path(__file__).resolve().parent / "results"
BENCHMARKED_PATHS = (
    "ray_dptune/records/ledger.py",
    "ray_dptune/records/store.py",
    "ray_dptune/accounting",
    "ray_dptune/tune/accountant.py",
    "ray_dptune/records/journal.py",
)
DATASET = "bench"
DELTA = 1e-5
PLAN = TrialSpend(sample_rate=0.045, noise_multiplier=2.49, steps=336)  # as benchmarks/callback_overhead.py
LEDGER_GOAL_MS = 50.0


# ---------------------------------------------------------------------------- timing
def time_rounds(steps: list[tuple[str, Callable[[], Any]]], repeats: int) -> dict[str, dict[str, float]]:
    """Median and max milliseconds per named call; each round runs ``steps`` in order (names may repeat)."""
    seconds: dict[str, list[float]] = {name: [] for name, _ in steps}
    for _ in range(repeats):
        for name, call in steps:
            start = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - start)
    return {
        name: {"median_ms": 1e3 * statistics.median(values), "max_ms": 1e3 * max(values)}
        for name, values in seconds.items()
    }


# ---------------------------------------------------------------------------- ledger
def search_guarantees() -> list[Guarantee]:
    """The mix of earlier searches: random-count with 0, 1, 3 charged attempts; a DP-BO release."""
    guarantees = []
    for failed in (0, 1, 3):
        account = SearchAccount(
            SearchMechanism.random_count(law=Poisson(10.0), num_trials=30), delta=DELTA, plan=PLAN.to_dict()
        )
        for index in range(failed):
            account.apply({"type": "started", "trial_id": f"t{index}", "accounted": True})
            account.apply({"type": "failed", "trial_id": f"t{index}"})
        guarantees.append(account.guarantee(if_stopped_now=True))
    release = SearchAccount(SearchMechanism.release(epsilon=1.0, delta=1e-9), delta=DELTA).guarantee()
    return [*guarantees, release]


def fill_ledger(ledger: PrivacyLedger, count: int, guarantees: list[Guarantee]) -> None:
    """``count`` earlier searches on ``DATASET``: one release in ten, the rest random-count."""
    for index in range(count):
        guarantee = guarantees[-1] if index % 10 == 9 else guarantees[index % (len(guarantees) - 1)]
        ledger.record_search(
            f"earlier-{index}", dataset=DATASET, guarantee=guarantee, summary={"searcher": "bench", "index": index}
        )


def ledger_row(folder: Path, count: int, repeats: int, guarantees: list[Guarantee]) -> dict[str, Any]:
    """Times the ledger's calls with ``count`` earlier searches on the dataset.

    Two connections, as two drivers: ``other`` records new searches, which makes the
    next total of ``ledger`` (the running search's driver) a full scan; ``ledger``'s
    own records of its running search leave its cached total valid.
    """
    path = folder / f"ledger-{count}.db"
    ledger, other = PrivacyLedger(path), PrivacyLedger(path)
    fill_ledger(other, count, guarantees)
    running = guarantees[:2]
    new_ids = iter(range(2 * repeats + 1))
    state = {"update": 0}

    def record_new() -> None:
        other.record_search(f"new-{next(new_ids)}", dataset=DATASET, guarantee=running[0], summary={"new": True})

    def record_update() -> None:
        state["update"] += 1
        ledger.record_search("running", dataset=DATASET, guarantee=running[state["update"] % 2], summary=state)

    def epsilon() -> float:
        return ledger.dataset_epsilon(DATASET, delta=DELTA, exclude="running", extra=running[1])

    record_new()  # warm-up: connections, statement caches
    record_update()
    timings = time_rounds(
        [
            ("record_new", record_new),
            ("dataset_total_scan", lambda: ledger.dataset_total(DATASET, exclude="running")),
            ("record_new", record_new),
            ("dataset_epsilon_scan", epsilon),
            ("record_update", record_update),
            ("dataset_epsilon_cached", epsilon),
        ],
        repeats,
    )
    row = {"earlier_searches": count, "epsilon_total": epsilon()}
    ledger.close()
    other.close()
    for name, timing in timings.items():
        row[f"{name}_ms"] = timing["median_ms"]
        row[f"{name}_max_ms"] = timing["max_ms"]
    return row


def ledger_scaling(args: argparse.Namespace) -> dict[str, Any]:
    """The ledger's record and total against the number of earlier searches."""
    guarantees = search_guarantees()
    folder_name = args.tmp_dir or tempfile.gettempdir()
    with tempfile.TemporaryDirectory(dir=args.tmp_dir) as folder:
        rows = []
        print("  ".join(title.rjust(8) for title, _, _ in LEDGER_COLUMNS), flush=True)
        for count in args.counts:
            rows.append(ledger_row(Path(folder), count, args.repeats, guarantees))
            print(format_row(LEDGER_COLUMNS, rows[-1]), flush=True)
    at_300 = next((row for row in rows if row["earlier_searches"] == 300), None)
    goal_met = None
    if at_300 is not None:
        slowest = max(at_300["record_new_ms"], at_300["record_update_ms"], at_300["dataset_epsilon_scan_ms"])
        goal_met = slowest <= LEDGER_GOAL_MS
    return {
        "title": "Privacy ledger: record a search, read a dataset's total",
        "goal": f"record_search and dataset_epsilon ≤ {LEDGER_GOAL_MS:g} ms at 300 earlier searches",
        "goal_met": goal_met,
        "method": (
            f"Median (and max) over {args.repeats} rounds; a fresh ledger per N in {folder_name}, "
            "opened by two drivers (connections). Each round: the other driver records a new search (record new), "
            "the running driver reads the total (scan); the other records again, the running reads ε at "
            f"δ = {DELTA:g} with its live guarantee added (scan); it updates its own record (record update) and reads "
            "ε again (cached). record_search commits with synchronous=FULL. Earlier searches: random-count "
            "(Poisson(10) law, DP-SGD plan) with 0, 1 or 3 charged attempts, one DP-BO release (ε = 1, δ = 1e-9) "
            "in ten; curves on the default 321 orders. ε total: every search on the dataset, the running one included."
        ),
        "columns": LEDGER_COLUMNS,
        "rows": rows,
        "environment": environment(),
    }


LEDGER_COLUMNS = [
    # (title, row key, format)
    ("earlier searches", "earlier_searches", "d"),
    ("record new ms", "record_new_ms", ".3f"),
    ("record update ms", "record_update_ms", ".3f"),
    ("total, scan ms", "dataset_total_scan_ms", ".3f"),
    ("ε, scan ms", "dataset_epsilon_scan_ms", ".3f"),
    ("ε, scan max ms", "dataset_epsilon_scan_max_ms", ".3f"),
    ("ε, cached ms", "dataset_epsilon_cached_ms", ".3f"),
    ("ε total", "epsilon_total", ".2f"),
]


def driver_hook_seconds(trials: int, folder: Path) -> list[float]:
    """Seconds per trial in the accountant's hooks, as Tune calls them, with its journal and live printing."""
    from ray import tune

    from ray_dptune import PointMass, PrivacyAccountantCallback, RandomCountSearcher

    searcher = RandomCountSearcher(PointMass(trials), space={"lr": tune.loguniform(0.01, 1.0)}, seed=0)
    callback = PrivacyAccountantCallback(
        searcher, delta=DELTA, plan=PLAN, journal_path=str(folder / f"journal-{trials}.db"), verbose=True
    )
    callback.setup(num_samples=-1)
    seconds = []
    with contextlib.redirect_stdout(io.StringIO()):  # the live line is printed, into a buffer
        for index in range(trials):
            trial = SimpleNamespace(trial_id=f"t{index}", config={"lr": 0.1})
            start = time.perf_counter()
            searcher.suggest(trial.trial_id)
            callback.on_trial_start(0, [], trial)
            for epoch in range(1, 5):
                spent = TrialSpend(
                    sample_rate=PLAN.sample_rate, noise_multiplier=PLAN.noise_multiplier, steps=PLAN.steps * epoch // 4
                )
                result = {"val_acc": 0.5, "dp_plan": PLAN.to_dict(), "dp_spent": spent.to_dict()}
                callback.on_trial_result(0, [], trial, result)
            callback.on_trial_complete(0, [], trial)
            seconds.append(time.perf_counter() - start)
    return seconds


def driver_scaling(args: argparse.Namespace) -> dict[str, Any]:
    """The driver's per-trial cost (searcher suggestion + accountant hooks) at 100 and 2 000 trials."""
    rows = []
    print("  ".join(title.rjust(8) for title, _, _ in DRIVER_COLUMNS), flush=True)
    with tempfile.TemporaryDirectory(dir=args.tmp_dir) as folder:
        for trials in args.trials:
            seconds = driver_hook_seconds(trials, Path(folder))
            first, last = seconds[:100], seconds[-100:]
            rows.append(
                {
                    "trials": trials,
                    "first_100_ms": 1e3 * statistics.median(first),
                    "last_100_ms": 1e3 * statistics.median(last),
                    "ratio": statistics.median(last) / statistics.median(first),
                    "total_s": sum(seconds),
                }
            )
            print(format_row(DRIVER_COLUMNS, rows[-1]), flush=True)
    largest = rows[-1]
    return {
        "title": "Driver: per-trial cost of the searcher and the accountant's hooks",
        "goal": "flat per-trial cost: the last 100 trials cost ≤ 1.5 × the first 100 at 2 000 trials",
        "goal_met": largest["ratio"] <= 1.5,
        "method": (
            "RandomCountSearcher.suggest and PrivacyAccountantCallback's hooks called as Tune calls them (start, "
            "4 results, complete) for N trials in one process, with the write-ahead journal on disk "
            "(suggestion and start synced: synchronous=FULL) and verbose=True (live line printed into a buffer); "
            "median ms per trial over the first and the last 100 trials."
        ),
        "columns": DRIVER_COLUMNS,
        "rows": rows,
        "environment": environment(),
    }


DRIVER_COLUMNS = [
    ("trials", "trials", "d"),
    ("first 100 ms/trial", "first_100_ms", ".3f"),
    ("last 100 ms/trial", "last_100_ms", ".3f"),
    ("last / first", "ratio", ".2f"),
    ("total s", "total_s", ".1f"),
]

SECTIONS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "ledger": ledger_scaling,
    "driver": driver_scaling,
}


# ---------------------------------------------------------------------------- report
def git_commit() -> str:
    """HEAD of the repository, with "+ local changes" when the benchmarked modules differ from it."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *BENCHMARKED_PATHS],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head} + local changes" if dirty else head


def environment() -> dict[str, Any]:
    """Command, date, commit, versions and machine."""
    python = sys.executable
    if python.startswith(os.getcwd() + os.sep):
        python = os.path.relpath(python)
    return {
        "command": shlex.join([python, *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "sqlite": sqlite3.sqlite_version,
        "machine": f"{os.cpu_count()}-core CPU, {platform.system()} {platform.machine()}",
    }


def format_row(columns: list, row: dict[str, Any]) -> str:
    return "  ".join(format(row[key], spec).rjust(max(len(title), 8)) for title, key, spec in columns)


def markdown(sections: dict[str, dict[str, Any]]) -> str:
    lines = ["# Per-search costs against the number of earlier searches", ""]
    for name, section in sections.items():
        env = section["environment"]
        columns = section["columns"]
        verdict = {True: "**met**", False: "**not met**", None: "not measured"}[section["goal_met"]]
        lines += [
            f"## {section['title']} (`{name}`)",
            "",
            f"- Command: `{env['command']}`",
            f"- Date (UTC): {env['date']}; ray_dptune commit {env['git_commit']}",
            f"- Python {env['python']}, numpy {env['numpy']}, SQLite {env['sqlite']}; {env['machine']}",
            f"- Goal: {section['goal']}: {verdict}.",
            f"- Method: {section['method']}",
            "",
            "| " + " | ".join(title for title, _, _ in columns) + " |",
            "|" + "--:|" * len(columns),
            *("| " + " | ".join(format(row[key], spec) for _, key, spec in columns) + " |" for row in section["rows"]),
            "",
        ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append", help="run only these sections")
    parser.add_argument("--counts", type=int, nargs="+", default=[10, 300], help="numbers of earlier searches")
    parser.add_argument("--trials", type=int, nargs="+", default=[100, 2000], help="trials per driver run")
    parser.add_argument("--repeats", type=int, default=15, help="timed calls per measurement (median)")
    parser.add_argument("--tmp-dir", help="folder for the ledgers (default: the system's temporary folder)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR, help="where scaling.{json,md} go")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    json_path, md_path = args.output_dir / "scaling.json", args.output_dir / "scaling.md"
    sections = json.loads(json_path.read_text(encoding="utf-8")) if json_path.exists() else {}
    for name in args.only or SECTIONS:
        print(f"== {name}", flush=True)
        sections[name] = SECTIONS[name](args)
        print()
        print(f"Goal: {sections[name]['goal']}: {sections[name]['goal_met']}\n")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(sections, indent=2) + "\n", encoding="utf-8")
    md_path.write_text(markdown(sections), encoding="utf-8")
    print(f"wrote {json_path} and {md_path}")
    return 0 if all(section["goal_met"] is not False for section in sections.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
