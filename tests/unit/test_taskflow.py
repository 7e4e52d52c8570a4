"""``@task.tao`` on the ``local`` platform (real jobs: processes on this host), and its job-side runner.

The Docker, SLURM and Kubernetes twins live in tests/integration/*/test_taskflow.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_tao.decorators import payload
from airflow_provider_tao.decorators.tao import XCOM_JOB, _TAODecoratedOperator, tao_task
from airflow_provider_tao.hooks.base import JobValidationError
from tests import taskflow_cases as cases
from tests.unit import lifecycle_steps
from tests.unit.fakes import Store, make_context
from tests.unit.lifecycle_steps import WorkerDied, die_at, kill_local_job

CONN = "tao_local_taskflow"


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``tao_local`` connection on tmp folders (its results root returned); live jobs are killed at the end."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    extra = {"jobs_dir": str(tmp_path / "jobs"), "results_root": str(tmp_path / "results"), "cancel_grace_seconds": 1}
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN.upper()}", json.dumps({"conn_type": "tao_local", "extra": extra}))
    monkeypatch.setattr(lifecycle_steps, "RESULTS_ROOT", extra["results_root"])
    yield tmp_path / "results"
    for job in (tmp_path / "jobs").glob("*"):
        kill_local_job(job.name)


def _op(function: Any, *args: Any, **kwargs: Any) -> _TAODecoratedOperator:
    return cases.decorated(function, *args, conn_id=CONN, gpu_count=0, deferrable=False, poll_interval=0.2, **kwargs)


def test_arguments_in_return_value_out_and_the_job_summary_in_xcom(local: Path) -> None:
    context = make_context(Store())
    value = _op(cases.add, 2, 40).execute(context)

    assert value["sum"] == 42 and value["rank"] == "0"
    job = next(c.kwargs["value"] for c in context["ti"].xcom_push.call_args_list if c.kwargs["key"] == XCOM_JOB)
    assert job["job_id"] == value["job_id"] and job["state"] == "Complete" and job["gpu_hours"] == 0
    assert (local / value["job_id"] / payload.RETURN_FILE).is_file()  # kept with the job's results


def test_print_output_reaches_the_task_log_while_the_function_runs(local: Path, tmp_path: Path, capfd: Any) -> None:
    go = tmp_path / "go"
    done: dict[str, Any] = {}
    worker = threading.Thread(
        target=lambda: done.update(value=_op(cases.wait_for_go, str(go)).execute(make_context(Store())))
    )
    worker.start()
    seen = ""
    deadline = time.monotonic() + 60
    while "[job] epoch-1 started" not in seen:  # the function still waits for go: the line came live
        assert time.monotonic() < deadline and worker.is_alive(), seen
        captured = capfd.readouterr()
        seen += captured.out + captured.err
        time.sleep(0.05)
    assert "epoch-2 done" not in seen
    go.touch()
    worker.join(60)
    assert done["value"] == "went"


def test_an_exception_fails_the_task_as_err_program_with_the_functions_traceback(local: Path, capfd: Any) -> None:
    with pytest.raises(AirflowFailException, match="ERR_PROGRAM") as failure:
        _op(cases.broken, 0.5).execute(make_context(Store()))

    assert "broken raised ValueError: bad learning rate 0.5" in str(failure.value)
    captured = capfd.readouterr()
    logged = captured.out + captured.err
    assert "[job] Traceback (most recent call last):" in logged, logged
    assert "in check_learning_rate" in logged and "[job] ValueError: bad learning rate 0.5" in logged


def test_a_python_the_serializer_cannot_bridge_is_a_config_error_naming_both(
    local: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(payload, "worker_python", lambda: "3.99.1")
    with pytest.raises(AirflowFailException, match="ERR_CONFIG") as failure:
        _op(cases.add, 1, 2, serializer="dill").execute(make_context(Store()))

    message = str(failure.value)
    assert "the worker runs Python 3.99.1" in message
    assert re.search(r"the job runs Python 3\.\d+\.\d+ at /\S+python3", message), message  # the job's own Python


def test_a_module_missing_in_the_job_is_a_config_error_naming_both_sides(
    local: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker has a module the job's Python does not (on the worker's sys.path only): an argument needs it.
    (tmp_path / "worker_only_types").mkdir()
    (tmp_path / "worker_only_types" / "__init__.py").write_text(
        "__version__ = '7.1'\nclass Box:\n    def __init__(self, v):\n        self.v = v\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import worker_only_types

    with pytest.raises(AirflowFailException, match="ERR_CONFIG") as failure:
        _op(cases.add, worker_only_types.Box(1), 2).execute(make_context(Store()))
    message = str(failure.value)
    assert (
        "module 'worker_only_types'" in message
        and "the worker: Python" in message
        and "worker_only_types 7.1" in message
    )
    assert re.search(r"the job's Python 3\.\d+\.\d+ at /\S+python3 does not have", message), message

    with pytest.raises(AirflowFailException, match="ERR_CONFIG") as failure:
        _op(cases.needs_missing_module).execute(make_context(Store()))
    assert "module 'tao_module_nobody_has'" in str(failure.value)


def test_a_worker_killed_after_submission_reattaches_and_returns_the_first_jobs_value(
    local: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Try 1's worker dies right after the job was created (before its record); try 2 adopts that job and returns
    its value: the function ran once, in one job."""
    from airflow_provider_tao.hooks.local import LocalHook

    counter = tmp_path / "runs"
    store = Store()
    die_at(monkeypatch, "create", hook=LocalHook)
    with pytest.raises(WorkerDied):
        _op(cases.add, 1, 2, str(counter)).execute(make_context(store, 1))
    (first,) = _jobs(tmp_path)

    value = _op(cases.add, 1, 2, str(counter)).execute(make_context(store, 2))

    assert value["job_id"] == first
    assert counter.read_text().split() == [first]  # one run of the function
    assert _jobs(tmp_path) == [first]  # one job


def _jobs(tmp_path: Path) -> list[str]:
    """The local platform's job folders (one per submitted job)."""
    return [job.name for job in (tmp_path / "jobs").iterdir() if not job.name.startswith("_")]


def test_every_node_runs_the_function_and_rank_0_keeps_the_value(tmp_path: Path) -> None:
    """The job side on a two-node job: both ranks run the function (with their NODE_RANK), only rank 0 writes."""
    files = payload.function_files("add", _source(cases.add), "pickle", [3, 4], {"counter": str(tmp_path / "runs")})
    (tmp_path / "files").mkdir()
    for name, content in files.items():
        (tmp_path / "files" / name).write_bytes(content)
    for rank in ("1", "0"):
        results = tmp_path / f"results-{rank}"
        env = {**os.environ, "TAO_JOB_FILES": str(tmp_path / "files"), "TAO_RESULTS_DIR": str(results)}
        env.update(TAO_JOB_ID=f"job-rank-{rank}", NODE_RANK=rank)
        subprocess.run([sys.executable, str(tmp_path / "files" / "tao_function.py")], env=env, check=True)
        assert (results / payload.RETURN_FILE).exists() == (rank == "0")
    value = payload.read_return_value((tmp_path / "results-0" / payload.RETURN_FILE).read_bytes(), "pickle", "x")
    assert value == {"sum": 7, "job_id": "job-rank-0", "rank": "0"}
    assert (tmp_path / "runs").read_text().split() == ["job-rank-1", "job-rank-0"]


def _source(function: Any) -> str:
    import inspect

    return inspect.getsource(function)


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [({"serializer": "json"}, "serializer"), ({"python_command": "python3; rm -rf /"}, "python_command"),
     ({"command": "echo"}, "command")],
)  # fmt: skip
def test_bad_decorator_arguments_fail_the_dag_at_parse_time(kwargs: dict[str, Any], parameter: str) -> None:
    with pytest.raises(JobValidationError, match=parameter):
        cases.decorated(cases.add, 1, 2, platform="local", **kwargs)


def test_arguments_too_large_or_unserialisable_fail_before_submission(
    local: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(payload, "MAX_ARGUMENTS_BYTES", 100)
    with pytest.raises(AirflowFailException, match=r"Bad input, nothing was submitted: op_args/op_kwargs.*inputs="):
        _op(cases.add, "x" * 200, "y").execute(make_context(Store()))
    with pytest.raises(AirflowFailException, match="pickle cannot serialise"):
        _op(cases.add, threading.Lock(), 1).execute(make_context(Store()))


def test_airflow_finds_the_decorator_as_task_tao() -> None:
    """Declared in provider info ``task-decorators``: Airflow's providers manager and CLI list it."""
    from airflow.sdk import task
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    assert ProvidersManagerTaskRuntime().taskflow_decorators["tao"] is tao_task
    assert task.tao is tao_task
    listed = subprocess.run(
        [sys.executable, "-m", "airflow", "providers", "get", "airflow-provider-tao", "--full", "-o", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    (info,) = json.loads(listed.stdout)
    assert {"class-name": "airflow_provider_tao.decorators.tao.tao_task", "name": "tao"} in info["task-decorators"]


def test_the_example_dag_trains_on_local_and_hands_its_metrics_to_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """``example_dags/tao_taskflow_local.py``: ``train`` (a real local job reading the staged data set) returns
    the metrics ``report`` prints."""
    import runpy

    (tmp_path / "iris.csv").write_text("a\nb\nc\nd\n")
    monkeypatch.setenv("TAO_TASKFLOW_DATA", str(tmp_path / "iris.csv"))
    monkeypatch.setenv("TAO_TASKFLOW_STAGED", str(tmp_path / "staged" / "train.csv"))
    monkeypatch.setenv("TAO_TASKFLOW_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("TAO_TASKFLOW_POLL", "0.2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    example = Path(__file__).parents[2] / "example_dags" / "tao_taskflow_local.py"
    dag = runpy.run_path(str(example))["tao_taskflow_local"]()
    train = dag.get_task("train")
    assert isinstance(train, _TAODecoratedOperator) and train.downstream_task_ids == {"report"}

    train.deferrable = False
    metrics = train.execute(make_context(Store()))

    assert metrics["samples"] == 4
    assert json.loads(Path(metrics["model"]).read_text()) == {"epochs": 3, "samples": 4}
    dag.get_task("report").python_callable(metrics)
    assert f"trained on 4 samples; model at {metrics['model']}" in capsys.readouterr().out
