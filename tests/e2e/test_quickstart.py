"""The quickstart DAG runs end to end and its evaluation task sees the trained model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _airflow_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "example_dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
    )
    return env


def _newest(folder: Path) -> Path:
    return max(folder.iterdir(), key=lambda p: p.stat().st_mtime)


def test_airflow_dags_test_runs_the_quickstart(tmp_path: Path) -> None:
    env = _airflow_env(tmp_path / "home")
    airflow = [sys.executable, "-m", "airflow"]
    subprocess.run([*airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    run = subprocess.run(
        [*airflow, "dags", "test", "tao_quickstart"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "state=success" in output

    # evaluate read train's XCom (the job id and results folder) and loaded the model the job wrote there
    match = re.search(r"job (\w+): (\d+) checkpoints, model \{'w': ([-\d.e]+), 'b': ([-\d.e]+)\}, held-out MSE", output)
    assert match, output[-4000:]
    job_id, checkpoints = match.group(1), int(match.group(2))
    results = tmp_path / "home" / "tao" / "results" / job_id
    model = json.loads((results / "model.json").read_text())
    assert checkpoints == 8 == len(list((results / "checkpoints").glob("epoch_*.json")))
    assert abs(model["w"] - 3.0) < 0.1 and abs(model["b"] - 2.0) < 0.1
    assert json.loads((results / "metrics.json").read_text())["epochs"] == 8
    # the job's log lines reached the task log while it was deferred
    assert "[job] Epoch 8/8" in output


def test_readme_quickstart_command(tmp_path: Path) -> None:
    """The README's one-command quickstart, exactly as a new user runs it (own venv, own AIRFLOW_HOME)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "VIRTUAL_ENV"))}
    run = subprocess.run(
        ["bash", str(REPO / "scripts" / "quickstart.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert "Done. Results of the training job:" in run.stdout
    assert "model.json" in run.stdout and "metrics.json" in run.stdout
    results = Path(re.search(r"Results of the training job: (\S+)", run.stdout).group(1))  # type: ignore[union-attr]
    assert (results / "model.json").is_file()
