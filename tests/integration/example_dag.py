"""Run an example DAG the way ``airflow dags test`` does -- real task runner, triggers run inline, a metadata DB in a
temporary AIRFLOW_HOME -- and return what it printed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_example_dag(
    dag_id: str, tmp_path: Path, env: dict[str, str], *, dag_file: Path | None = None, state: str = "success"
) -> str:
    """``example_dags/<dag_id>.py`` run by ``dag.test()`` with these extra environment variables; the run must
    end in ``state``. Returns its stdout + stderr.

    :param dag_id: the DAG's id, which is also its file name.
    :param tmp_path: a fresh folder for AIRFLOW_HOME and the DAGs folder.
    :param env: connections and the DAG's own overrides.
    :param dag_file: another DAG file than the example's.
    :param state: the DAG run's expected end state.
    """
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(dag_file or REPO / "example_dags" / f"{dag_id}.py", dags)
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        **env,
    }
    airflow = Path(sys.executable).with_name("airflow")
    migrate = subprocess.run(
        [str(airflow), "db", "migrate"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert migrate.returncode == 0, migrate.stderr[-3000:]
    script = (
        "import sys\n"
        "from airflow.models.dagbag import DagBag\n"
        "run = DagBag(sys.argv[1]).get_dag(sys.argv[2]).test()\n"
        "print('DAG_RUN_STATE', run.state)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(dags), dag_id], env=env, capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and f"DAG_RUN_STATE {state}" in output, output[-5000:]
    return output
