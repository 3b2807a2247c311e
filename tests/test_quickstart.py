"""examples/quickstart.py (the main job, `bash scripts/run.sh`): its experiment folder outlives the run."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"


@pytest.mark.usefixtures("ray_session")
def test_the_report_stays_at_the_printed_path(tmp_path):
    import ray

    storage = tmp_path / "results"
    args = ["--epochs", "1", "--mean", "2", "--seed", "1", "--storage-path", str(storage), "--name", "run"]
    environment = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    process = subprocess.run(
        [sys.executable, str(QUICKSTART), *args],
        check=False,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    (printed,) = re.findall(r"^Privacy report: (\S+)$", process.stdout, re.MULTILINE)
    assert Path(printed) == storage / "run" / "privacy_report.json"
    assert Path(printed).is_file()  # after the process exited: nothing deleted it
    assert f"journal {storage / 'run'}" in process.stdout
    assert "purge=True" in process.stdout
    (published,) = re.findall(r"^May be published: the released model and (\S+)$", process.stdout, re.MULTILINE)
    statement = json.loads(Path(published).read_text())
    assert statement["guarantee"]["epsilon"] == pytest.approx(
        json.loads(Path(printed).read_text())["guarantee"]["epsilon"]
    )
    assert "num_trials" not in json.dumps(statement) and "Stays with you" in process.stdout
    (cli,) = re.findall(r"^  (\S+) journal ", process.stdout, re.MULTILINE)
    assert cli == "ray-dptune" or os.path.isabs(cli)  # pastes from any folder
    released = re.findall(r"^Released trial: (.+)$", process.stdout, re.MULTILINE)

    resumed = subprocess.run(  # a finished search restored: nothing runs again, the same trial is released
        [sys.executable, str(QUICKSTART), "--resume", str(storage / "run"), "--epochs", "1"],
        check=False,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert re.findall(r"^Released trial: (.+)$", resumed.stdout, re.MULTILINE) == released
    (purge,) = re.findall(r"^  (\S+ -c .+)   # deletes the unreleased", process.stdout, re.MULTILINE)
    for _ in range(2):  # the printed line pastes from any folder, and a second run finds the same release
        subprocess.run(purge, shell=True, check=True, cwd=tmp_path, capture_output=True, env=environment)
    left = set(os.listdir(storage / "run"))
    assert {"privacy_report.json", "public_statement.json"} <= left and not any(
        name.startswith("experiment_state") for name in left
    )


def test_an_experiment_folder_in_use_is_refused_before_ray_starts(tmp_path):
    spec = importlib.util.spec_from_file_location("_quickstart_under_test", QUICKSTART)
    quickstart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quickstart)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "privacy_journal.db").write_bytes(b"")
    with pytest.raises(SystemExit, match="already holds a search"):
        quickstart.main(["--storage-path", str(tmp_path), "--name", "run"])
    assert quickstart.parse_args([]).name is None  # the default name is a new timestamped folder each run
    command = quickstart.resume_command("/data/run", quickstart.parse_args(["--epochs", "3", "--audit", "50"]))
    assert command.split()[:2] == [sys.executable, str(QUICKSTART)]
    assert command.endswith("--resume /data/run --epochs 3 --batch-size 64 --audit 50")
