"""Private sweeps on one simulated 3-node Ray cluster: calm, interrupted and restored, then losing a node.

Run by tests/tune/test_multinode.py in its own process (it needs its own Ray cluster, apart
from the tests' shared local session). The cluster is started once and the scenarios
run on it one after the other, each into its own folder: ``calm`` (no failure),
``interrupt`` (the driver gets SIGINT once two trials have finished: Tune saves its
state and returns, as when a user presses Ctrl-C; the experiment is then restored with
``tune.Tuner.restore`` on the same cluster and finished) and ``kill-node`` (the node of
the first trial to report is removed mid-trial; last, since it takes a node away).
Each scenario waits on events, never on a machine's speed: in ``interrupt`` a trial that
would end after the second one is held before its last report until the driver has been
interrupted (so a trial is running at the SIGINT, however slow the machine); in
``kill-node`` the first trial to report claims ``victim`` and waits there until its node
is removed (so the node goes while that trial runs, after it touched the data; Tune does not
retry it: a random-count search allows no retry, so the trial ends as a failed run).
Prints one JSON line per scenario: its name, K, trials, per-trial attempts, the
guarantee, and the node ids trials ran on.

    python tests/multinode_sweep.py OUT_DIR [SCENARIO ...]   (default: calm interrupt kill-node)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import ray
from ray import tune
from ray.cluster_utils import Cluster

from ray_dptune import PointMass, PrivacyAccountantCallback, RandomCountSearcher, TrialSpend, private_tune_config

PLAN = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=40)
EPOCHS = 4


def trainable(config):
    """Four 'epochs' of 0.5 s; writes which node it runs on, so the driver can kill it."""
    marker_dir = Path(config["markers"])
    scenario = marker_dir.parent
    trial_id = tune.get_context().get_trial_id()
    node = ray.get_runtime_context().get_node_id()
    (marker_dir / f"{trial_id}-{node}-{time.time_ns()}").touch()
    for epoch in range(1, EPOCHS + 1):
        time.sleep(0.5)
        if epoch == EPOCHS and config["scenario"] == "interrupt" and len(list(marker_dir.glob("finished-*"))) >= 2:
            wait_for(scenario / "gate", announce=scenario / f"held-{trial_id}")
        spent = TrialSpend(
            sample_rate=PLAN.sample_rate, noise_multiplier=PLAN.noise_multiplier, steps=PLAN.steps * epoch // EPOCHS
        )
        tune.report({"score": config["x"], "node": node, "dp_plan": PLAN.to_dict(), "dp_spent": spent.to_dict()})
        if epoch == 1 and config["scenario"] == "kill-node" and claim(scenario / "victim", node):
            wait_for(scenario / "killed")  # its node is removed meanwhile
    (marker_dir / f"finished-{trial_id}").touch()


def claim(path: Path, content: str) -> bool:
    """Creates ``path`` holding ``content`` unless it exists (atomic across processes and nodes of one machine)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    os.write(fd, content.encode())
    os.close(fd)
    return True


def wait_for(path: Path, *, announce: Path | None = None, timeout: float = 300.0) -> None:
    """Touches ``announce`` (if given), then waits until ``path`` exists."""
    if path.exists():
        return
    if announce is not None:
        announce.touch()
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def kill_the_victim_s_node(cluster: Cluster, workers: list, scenario: Path, done: threading.Event) -> None:
    """Removes the node of the trial that claimed ``victim`` (after its first report), while it waits there."""
    by_id = {worker.node_id: worker for worker in workers}
    victim = scenario / "victim"
    while not done.is_set():
        node = victim.read_text() if victim.exists() else ""
        if node in by_id:
            cluster.remove_node(by_id[node])
            (scenario / "killed").write_text(node)
            return
        time.sleep(0.05)


def interrupt_after_two_trials(markers: Path, done: threading.Event) -> None:
    """SIGINT to this driver once two trials have reported their last epoch and a third is held before its last."""
    scenario = markers.parent
    while not done.is_set():
        if len(list(markers.glob("finished-*"))) >= 2 and list(scenario.glob("held-*")):
            os.kill(os.getpid(), signal.SIGINT)
            return
        time.sleep(0.05)


SCENARIOS = ("calm", "interrupt", "kill-node")


def sweep(cluster: Cluster, workers: list, out: Path, scenario: str) -> dict:
    """One private sweep of K = 4 on the running cluster, into ``out``; what the test checks."""
    kill_node, interrupt = scenario == "kill-node", scenario == "interrupt"
    markers = out / "markers"
    markers.mkdir(parents=True)
    searcher = RandomCountSearcher(PointMass(4), metric="score", mode="max", seed=0)
    callback = PrivacyAccountantCallback(searcher, delta=1e-5, plan=PLAN, verbose=False)
    tuner = tune.Tuner(
        trainable,
        param_space={"x": tune.uniform(0, 1), "markers": str(markers), "scenario": scenario},
        tune_config=private_tune_config(searcher, max_concurrent_trials=3),
        run_config=tune.RunConfig(
            name="multinode",
            storage_path=str(out / "storage"),
            callbacks=[callback],
            verbose=0,
        ),
    )
    done = threading.Event()
    if kill_node:
        threading.Thread(target=kill_the_victim_s_node, args=(cluster, workers, out, done), daemon=True).start()
    if interrupt:
        threading.Thread(target=interrupt_after_two_trials, args=(markers, done), daemon=True).start()
    results = tuner.fit()
    done.set()
    (out / "gate").touch()  # Tune has stopped: the restored trials run to their end
    interrupted = None
    if interrupt:  # what the first driver's own report says of the search it left
        with open(out / "storage" / "multinode" / "privacy_report.json") as file:
            first = json.load(file)
        unfinished = [tid for tid, trial in first["trials"].items() if trial["state"] != "completed"]
        interrupted = {"complete": first["complete"], "unfinished": unfinished, "results": len(results)}
        restored = tune.Tuner.restore(str(out / "storage" / "multinode"), trainable, resume_unfinished=True)
        results = restored.fit()
        with open(out / "storage" / "multinode" / "privacy_report.json") as file:
            report = json.load(file)
    else:
        report = callback.report().to_dict()
    return {
        "scenario": scenario,
        "num_trials": searcher.num_trials,
        "results": len(results),
        "errors": [str(r.error) for r in results if r.error],
        "attempts": {tid: [a["state"] for a in t["attempts"]] for tid, t in report["trials"].items()},
        "epsilon": report["guarantee"]["epsilon"],
        "nodes": sorted({r.metrics.get("node") for r in results if r.metrics}),
        "killed": (out / "killed").read_text() if (out / "killed").exists() else None,
        "interrupted": interrupted,
        "starts": len([m for m in markers.iterdir() if not m.name.startswith("finished-")]),
    }


def main(out_dir: str, scenarios: list[str]) -> None:
    unknown = sorted(set(scenarios) - set(SCENARIOS))
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}: choose from {list(SCENARIOS)}")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    workers = [cluster.add_node(num_cpus=1) for _ in range(3)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    for scenario in sorted(scenarios, key=SCENARIOS.index):  # the node loss last: it takes a node away
        print(json.dumps(sweep(cluster, workers, Path(out_dir) / scenario, scenario)), flush=True)
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or list(SCENARIOS))
    os._exit(0)  # Ray's background threads can keep a finished driver alive
