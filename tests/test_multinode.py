"""A private sweep across 3 simulated worker nodes, with and without losing one mid-trial.

Each run starts its own ray.cluster_utils.Cluster in a subprocess (tests/multinode_sweep.py),
apart from the shared local Ray session of the other tests; ~35 s each here.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ray_dptune import TrialSpend

SCRIPT = Path(__file__).with_name("multinode_sweep.py")
PLAN = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=40)


def sweep(tmp_path: Path, *flags: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), *flags], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def without_failure(tmp_path_factory):
    return sweep(tmp_path_factory.mktemp("calm"))


@pytest.fixture(scope="module")
def with_node_loss(tmp_path_factory):
    return sweep(tmp_path_factory.mktemp("storm"), "--kill-node")


def test_sweep_across_nodes_runs_k_trials_with_the_selection_guarantee(without_failure):
    run = without_failure
    assert run["num_trials"] == 4 and run["results"] == 4 and not run["errors"]
    assert all(statuses == ["completed"] for statuses in run["attempts"].values())
    assert len(run["nodes"]) >= 2  # the trials were spread over the worker nodes
    assert run["epsilon"] == pytest.approx((4 * PLAN.curve()).epsilon(delta=1e-5), rel=1e-12)


def test_a_lost_node_retries_its_trial_elsewhere_and_costs_privacy(with_node_loss, without_failure):
    run = with_node_loss
    assert run["killed"] is not None
    assert run["num_trials"] == 4 and run["results"] == 4 and not run["errors"]
    retried = [statuses for statuses in run["attempts"].values() if statuses != ["completed"]]
    assert retried == [["failed", "completed"]]
    assert run["killed"] not in run["nodes"]  # every final result came from a surviving node
    assert run["epsilon"] > without_failure["epsilon"]
    assert run["epsilon"] == pytest.approx((5 * PLAN.curve()).epsilon(delta=1e-5), rel=1e-12)


def test_an_interrupted_driver_restores_with_the_same_k_and_no_rerun(tmp_path):
    run = sweep(tmp_path, "--interrupt")
    assert run["interrupted_with"] is not None
    assert run["num_trials"] == 4 and run["results"] == 4 and not run["errors"]
    restarted = [statuses for statuses in run["attempts"].values() if statuses != ["completed"]]
    # finished trials were not re-run: one start each, plus restarts, each charged (an attempt only
    # suggested when the driver stopped is charged too: its fate is not in the journal)
    assert 4 <= run["starts"] <= 4 + len(restarted)
    assert all(statuses[-1] == "completed" and set(statuses[:-1]) <= {"failed", "unknown", "interrupted"} for statuses in restarted)
    composed = (4 * PLAN.curve() + len(restarted) * PLAN.curve()).epsilon(delta=1e-5)
    assert run["epsilon"] == pytest.approx(composed, rel=1e-12)
