"""The README's one-command quickstart runs end to end and its evaluation task sees the trained model."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_readme_quickstart_command() -> None:
    """The README's one-command quickstart, exactly as a new user runs it (own venv, own AIRFLOW_HOME): the DAG
    trains, the job's log reaches the task log while it is deferred, and evaluate loads the model the job wrote."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "VIRTUAL_ENV")) and k != "VENV"}
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

    output = (REPO / ".quickstart" / "quickstart.log").read_text()  # what `airflow dags test` printed
    assert "state=success" in output
    # evaluate read train's XCom (the job id and results folder) and loaded the model the job wrote there
    match = re.search(r"job (\w+): (\d+) checkpoints, model \{'w': ([-\d.e]+), 'b': ([-\d.e]+)\}, held-out MSE", output)
    assert match, output[-4000:]
    job_id, checkpoints = match.group(1), int(match.group(2))
    assert results.name == job_id
    model = json.loads((results / "model.json").read_text())
    assert checkpoints == 8 == len(list((results / "checkpoints").glob("epoch_*.json")))
    assert abs(model["w"] - 3.0) < 0.1 and abs(model["b"] - 2.0) < 0.1
    assert json.loads((results / "metrics.json").read_text())["epochs"] == 8
    # the job's log lines reached the task log while it was deferred
    assert "[job] Epoch 8/8" in output
