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


def pytest_collection_modifyitems(config, items):
    """Math first, then the multi-node tests (own clusters), then the shared Ray session's tests."""

    def rank(item):
        if "ray_session" in getattr(item, "fixturenames", ()):
            return 2
        return 1 if item.path.name == "test_multinode.py" else 0

    items.sort(key=rank)  # stable: keeps file order within each group
