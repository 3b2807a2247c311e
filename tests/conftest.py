"""Shared fixtures and the test tiers.

- One local Ray session (``ray_session``) for every test that needs Ray; the tests that need a
  cluster of their own or a driver process of their own say why in their module.
- ``pytest -m fast``: every test that needs no Ray session, no heavy fixture and is not marked
  ``slow`` (decided per test, not per file); the modules in ``NO_FAST_TESTS`` are not even
  imported then, so that the tier starts without Ray or torch.
- ``pytest --exhaustive``: also the exhaustive grids (tests marked ``exhaustive``: the whole
  exact-audit grid of tests/accounting/test_exact_audit.py); the default run audits a seeded subset of them.
- ``pytest --part ray`` / ``--part rest``: the tests on the shared Ray session, or all the others;
  scripts/test.sh runs the two parts at once (the first mostly waits on Ray's processes, the
  second is mostly one core of math).
"""

import os

import pytest

HEAVY_FIXTURES = {"ray_session", "drivers"}
"""A test that uses one of these is not in the fast tier (nor is one marked ``slow`` or ``exhaustive``)."""

NO_FAST_TESTS = {
    "test_budget_cap.py",
    "test_multinode.py",
    "test_multiworker.py",
}
"""Modules with no fast test: ``-m fast`` does not import them (a full run checks that they have none)."""


def pytest_addoption(parser):
    parser.addoption(
        "--exhaustive",
        action="store_true",
        default=False,
        help="also run the exhaustive grids (tests marked exhaustive: the whole exact-audit grid, minutes)",
    )
    parser.addoption(
        "--part",
        choices=("all", "ray", "rest"),
        default="all",
        help="ray: only the tests on the shared Ray session; rest: only the others (scripts/test.sh runs both at once)",
    )


def _exhaustive(config) -> bool:
    return config.getoption("exhaustive") or "exhaustive" in (config.getoption("markexpr", "") or "")


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray started once (~5 s here) and shut down after the last test."""
    # Ray workers import trainables defined in test modules by name: every folder of tests/ is on their path.
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    folders = [tests_dir] + sorted(
        entry.path for entry in os.scandir(tests_dir) if entry.is_dir() and entry.name.isidentifier()
    )
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [*folders, os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    import ray

    # a cluster of its own: never one that another process on the machine started
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def drivers(ray_session):
    """Runs the fault tests' drivers (tests/kill_driver.py, tests/budget_driver.py) on the shared session.

    Each run is a process of its own (its own pid, environment and Ray connection), killed for
    real; tests/driver_server.py forks them from one process that imported Ray, Tune and
    ray_dptune once, so a run does not pay those imports (~3 s of CPU here, 40-odd runs).
    """
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from driver_server import DriverServer

    # dp_accounting too: the library imports it lazily, ~1 s at each driver's first curve
    server = DriverServer("kill_driver", "budget_driver", "dp_accounting.rdp.rdp_privacy_accountant")
    yield server
    server.close()


@pytest.fixture
def durable_syncs(monkeypatch):
    """The ``durable`` flag of every journal transaction committed from now on (True: synchronous=FULL)."""
    from ray_dptune.records.store import SQLiteStore

    synced = []
    transaction = SQLiteStore.transaction
    monkeypatch.setattr(
        SQLiteStore,
        "transaction",
        lambda self, *, durable: synced.append(durable) or transaction(self, durable=durable),
    )
    return synced


def pytest_ignore_collect(collection_path, config):
    """``-m fast`` alone does not import the modules without a fast test (most of them need Ray or torch)."""
    if (config.getoption("markexpr", "") or "").strip() == "fast" and collection_path.suffix == ".py":
        return collection_path.name in NO_FAST_TESTS or None
    return None


def on_ray_session(item) -> bool:
    """Whether the test runs on the shared Ray session (``--part ray``)."""
    return "ray_session" in getattr(item, "fixturenames", ())


def is_fast(item) -> bool:
    """Fast: no Ray session or other heavy fixture, and not marked slow or exhaustive."""
    if any(item.get_closest_marker(name) for name in ("slow", "exhaustive")):
        return False
    return not HEAVY_FIXTURES.intersection(getattr(item, "fixturenames", ()))


def pytest_collection_modifyitems(config, items):
    """Marks the fast tests, skips the exhaustive grids unless asked, and orders the run.

    Order: the tests without Ray first, then the multi-node tests (clusters of their own), then
    the shared Ray session's (so that it starts once, after the clusters are gone).
    """
    exhaustive = _exhaustive(config)
    skip = pytest.mark.skip(reason="exhaustive grid: run with --exhaustive (tests/conftest.py)")
    misplaced = []
    for item in items:
        if item.get_closest_marker("exhaustive") is not None and not exhaustive:
            item.add_marker(skip)
        if is_fast(item):
            item.add_marker(pytest.mark.fast)
            if item.path.name in NO_FAST_TESTS:
                misplaced.append(item.nodeid)
    if misplaced:
        raise pytest.UsageError(
            f"{', '.join(misplaced[:5])} would be fast, but `-m fast` skips its module: mark it slow, "
            "or take the module out of NO_FAST_TESTS in tests/conftest.py"
        )

    part = config.getoption("part")
    if part != "all":
        keep = [item for item in items if on_ray_session(item) == (part == "ray")]
        config.hook.pytest_deselected(items=[item for item in items if on_ray_session(item) != (part == "ray")])
        items[:] = keep

    def rank(item):
        if on_ray_session(item):
            return 2
        return 1 if item.path.name == "test_multinode.py" else 0

    items.sort(key=rank)  # stable: keeps file order within each group
