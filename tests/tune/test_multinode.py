"""Private sweeps across 3 simulated worker nodes: calm, interrupted and restored, and losing a node mid-trial.

The three scenarios run one after the other on one ray.cluster_utils.Cluster, started once in
a subprocess (tests/multinode_sweep.py), apart from the shared local Ray session of the other
tests; the node loss runs last, as it takes a node away (~50 s for the three here).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ray_dptune import TrialSpend

pytestmark = pytest.mark.slow  # a cluster of its own (not the shared session): not in -m fast

SCRIPT = Path(__file__).parents[1] / "multinode_sweep.py"
PLAN = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=40)


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> dict:
    """The three scenarios' results by name, from one cluster."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = tmp_path_factory.mktemp("multinode")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(out)], capture_output=True, text=True, timeout=600, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {run["scenario"]: run for run in runs}


@pytest.fixture(scope="module")
def without_failure(sweeps):
    return sweeps["calm"]


@pytest.fixture(scope="module")
def with_node_loss(sweeps):
    return sweeps["kill-node"]


def test_sweep_across_nodes_runs_k_trials_with_the_selection_guarantee(without_failure):
    run = without_failure
    assert run["num_trials"] == 4 and run["results"] == 4 and not run["errors"]
    assert all(statuses == ["completed"] for statuses in run["attempts"].values())
    assert len(run["nodes"]) >= 2  # the trials were spread over the worker nodes
    assert run["epsilon"] == pytest.approx((4 * PLAN.curve()).epsilon(delta=1e-5), rel=1e-12)


def test_a_lost_node_ends_its_trial_as_a_failed_run_at_no_extra_cost(with_node_loss, without_failure):
    run = with_node_loss
    assert run["killed"] is not None
    assert run["num_trials"] == 4 and run["results"] == 4 and len(run["errors"]) == 1
    failed = [statuses for statuses in run["attempts"].values() if statuses != ["completed"]]
    assert failed == [["failed"]]  # not retried: one of the K runs, with output "failed"
    assert run["epsilon"] == pytest.approx(without_failure["epsilon"], rel=1e-12)


def test_an_interrupted_driver_restores_with_the_same_k_and_no_rerun(sweeps):
    run = sweeps["interrupt"]
    interrupted = run["interrupted"]  # the SIGINT fired while trials ran: the first report says so
    assert interrupted["complete"] is False and len(interrupted["unfinished"]) >= 1, interrupted
    assert run["num_trials"] == 4 and run["results"] == 4 and not run["errors"]
    restarted = [statuses for statuses in run["attempts"].values() if statuses != ["completed"]]
    # finished trials were not re-run: one start each, plus restarts, each charged (an attempt only
    # suggested when the driver stopped is charged too: its fate is not in the journal)
    assert 4 <= run["starts"] <= 4 + len(restarted)
    assert all(
        statuses[-1] == "completed" and set(statuses[:-1]) <= {"failed", "unknown", "interrupted"}
        for statuses in restarted
    )
    composed = (4 * PLAN.curve() + len(restarted) * PLAN.curve()).epsilon(delta=1e-5)
    assert run["epsilon"] == pytest.approx(composed, rel=1e-12)
