"""Shared fixtures: one local Ray session for every test that needs Ray."""

import os

import pytest


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray started once (~5 s here) and shut down after the last test."""
    # Ray workers import trainables defined in test modules by name.
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [tests_dir, os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    yield ray
    ray.shutdown()


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


FAST_MODULES = {
    "test_rdp.py",
    "test_selection.py",
    "test_pld_reading.py",
    "test_dphypo_bound.py",
    "test_distributions.py",
    "test_projection.py",
    "test_ledger.py",
    "test_callback_unit.py",
    "test_callback_protocol.py",
    "test_imports.py",
    "test_journal.py",
    "test_fuzz.py",
    "test_codebase.py",
    "test_searcher_contract.py",
}
"""Pure-math and bookkeeping modules: ``pytest -m fast`` runs their tests not marked slow, in seconds."""


def pytest_ignore_collect(collection_path, config):
    """``-m fast`` alone does not import the modules that need Ray or torch (collection is most of its time)."""
    if config.getoption("markexpr", "") == "fast" and collection_path.suffix == ".py":
        return collection_path.name.startswith("test_") and collection_path.name not in FAST_MODULES
    return None


def pytest_collection_modifyitems(config, items):
    """Marks the fast tests; orders math first, then the multi-node tests (own clusters), then the shared Ray session's."""
    for item in items:
        if item.path.name in FAST_MODULES and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.fast)

    def rank(item):
        if "ray_session" in getattr(item, "fixturenames", ()):
            return 2
        return 1 if item.path.name == "test_multinode.py" else 0

    items.sort(key=rank)  # stable: keeps file order within each group
