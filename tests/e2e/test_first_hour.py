"""What a new user does first, as separate ``airflow`` processes on one SQLite ``AIRFLOW_HOME`` (no standalone):
the README's first example runs as written, and a connection made by ``airflow connections add`` is found by the
trigger ``airflow dags test`` runs inline and by ``airflow tao logs | reap | cancel``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]

#: A deferrable task on the connection ``airflow connections add`` saves in the metadata database.
DB_CONNECTION_DAG = """
from airflow.sdk import dag
from airflow_provider_tao.operators.submit import TAOSubmitOperator


@dag(dag_id="tao_db_connection", schedule=None)
def tao_db_connection():
    TAOSubmitOperator(
        task_id="train",
        conn_id="tao_local_default",
        command="echo started; sleep 4; echo finished",
        gpu_count=0,
        deferrable=True,
        poll_interval=1,
    )


tao_db_connection()
"""


@dataclass
class AirflowHome:
    """An ``AIRFLOW_HOME`` with a migrated SQLite database and a DAGs folder of its own."""

    home: Path
    dags: Path
    env: dict[str, str]

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``airflow <args>`` in this home."""
        return subprocess.run(
            [sys.executable, "-m", "airflow", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def ok(self, *args: str) -> str:
        """``airflow <args>``, which must succeed: its stdout and stderr."""
        proc = self.run(*args)
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"airflow {' '.join(args)} failed:\n{output[-4000:]}"
        return output

    def json(self, *args: str) -> list[dict]:
        """The rows ``airflow <args> -o json`` prints on its last line."""
        proc = self.run(*args, "-o", "json")
        assert proc.returncode == 0, f"airflow {' '.join(args)} failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
        rows: list[dict] = json.loads(proc.stdout.strip().splitlines()[-1])
        return rows


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowHome]:
    root = tmp_path_factory.mktemp("first-hour")
    dags = root / "dags"
    dags.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(root / "home"),
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        # no scheduler races a trigger `dags test` runs inline: its 10 s hold would only slow these tests down
        AIRFLOW__TAO__TRIGGER_EVENT_HOLD_SECONDS="0",
    )
    home = AirflowHome(root / "home", dags, env)
    home.ok("db", "migrate")
    yield home


def readme_first_python_example() -> tuple[str, str]:
    """The README's first Python code block and the dag_id it defines."""
    readme = (REPO / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S)
    assert code, "the README has no Python example"
    dag_id = re.search(r'dag_id="([^"]+)"', code.group(1))
    assert dag_id, "the README's first Python example must be a whole DAG file (with a dag_id)"
    return code.group(1), dag_id.group(1)


def test_readme_first_example_runs_as_written(airflow_home: AirflowHome) -> None:
    """Copied as it stands into a DAGs folder, with no connection made and no GPU, it runs to success."""
    code, dag_id = readme_first_python_example()
    (airflow_home.dags / "readme_example.py").write_text(code)
    output = airflow_home.ok("dags", "test", dag_id)
    assert "state=success" in output and "state=failed" not in output, output[-4000:]


def test_connection_added_to_the_database_reaches_every_process(airflow_home: AirflowHome) -> None:
    """``airflow connections add`` saves the connection in the metadata database, where a CLI process's Task SDK
    does not look: the inline trigger of ``airflow dags test`` must still watch the job to its end (it used to fail
    at once and leave the job running), and ``airflow tao logs | reap | cancel`` must find the connection."""
    root = airflow_home.home.parent / "tao-db-conn"
    airflow_home.ok(
        "connections", "add", "tao_local_default", "--conn-type", "tao_local",
        "--conn-extra", json.dumps({"jobs_dir": str(root / "jobs"), "results_root": str(root / "results")}),
    )  # fmt: skip
    (airflow_home.dags / "tao_db_connection.py").write_text(DB_CONNECTION_DAG)

    output = airflow_home.ok("dags", "test", "tao_db_connection")
    assert "isn't defined" not in output, output[-4000:]
    assert "state=success" in output and "state=failed" not in output, output[-4000:]

    (job,) = airflow_home.json("tao", "jobs", "--dag-id", "tao_db_connection")
    assert (job["conn_id"], job["state"]) == ("tao_local_default", "Complete")
    supervisor = int(job["backend_job_id"])  # the job's process group leader
    assert not psutil.pid_exists(supervisor) or psutil.Process(supervisor).status() == psutil.STATUS_ZOMBIE

    (log,) = airflow_home.json("tao", "logs", job["job_id"])
    assert log["log"].split() == ["started", "finished"]
    swept = airflow_home.json("tao", "reap", "--dry-run")
    assert [row for row in swept if row["action"] == "error"] == [], swept
    (canceled,) = airflow_home.json("tao", "cancel", job["job_id"])
    assert (canceled["was"], canceled["canceled"]) == ("Complete", False), canceled
