"""What a new user meets first (issue 23 points 8 and 9): mistakes found at parse time, the Test button's promised
kinds, messages without noise, the CLI's filters and log rendering, links that look nothing up when nothing was
submitted, and one run time everywhere."""

from __future__ import annotations

import json
from argparse import Namespace
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_tao.cli import commands
from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.hooks.local import LocalHook
from airflow_provider_tao.jobindex import IndexedJob
from airflow_provider_tao.jobs import JobSpec, JobState
from airflow_provider_tao.links import TAOJobLink, TAOResultsLink
from airflow_provider_tao.operators.failover import XCOM_ATTEMPTS
from airflow_provider_tao.operators.submit import TAOSubmitOperator
from airflow_provider_tao.records import STATE_KEY, JobRecord
from tests.unit.fakes import FakeHook, Store, make_context


def _op(**kwargs: Any) -> TAOSubmitOperator:
    defaults: dict[str, Any] = {"task_id": "train", "conn_id": "fake_conn", "image": "img:1", "command": "train.sh"}
    return TAOSubmitOperator(**{**defaults, **kwargs})


# ----------------------------------------------------------------- 9: parse time, not run time


def test_an_env_value_that_is_not_a_string_fails_the_dag_at_parse_time_in_plain_words() -> None:
    with pytest.raises(JobValidationError) as bad:
        _op(env={"EPOCHS": 20})
    assert str(bad.value) == "env['EPOCHS']: 20 is not a string. Quote it: '20'"  # not "value 20 is a int"
    _op(env={"EPOCHS": "{{ params.epochs }}"})  # a template is checked when it is rendered


def test_a_mistyped_image_key_fails_the_dag_at_parse_time_without_noise() -> None:
    with pytest.raises(JobValidationError) as bad:
        _op(image="tao_tolkit.pyt")
    message = str(bad.value)
    assert message.startswith("image: 'tao_tolkit.pyt' is not a key of the 'images:' tree")
    assert "tao_toolkit.pyt" in message  # names the right keys
    assert ".." not in message and "Fix the image" not in message  # one full stop, no generic suffix
    _op(image="nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt")
    _op(image="{{ params.image }}")


@pytest.fixture
def local_conn(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Any:
    def make(**extras: Any) -> LocalHook:
        extras = {"jobs_dir": str(tmp_path / "jobs"), "results_root": str(tmp_path / "results"), **extras}
        monkeypatch.setenv("AIRFLOW_CONN_TAO_LOCAL_FIRST", json.dumps({"conn_type": "tao_local", "extra": extras}))
        return LocalHook("tao_local_first")

    return make


def test_a_cancel_grace_that_is_not_seconds_is_refused_before_submission_and_by_the_test_button(
    local_conn: Any,
) -> None:
    hook = local_conn(cancel_grace_seconds="ten")
    with pytest.raises(JobValidationError, match=r"cancel_grace_seconds: 'ten' is not a number of seconds"):
        hook.validate_spec(JobSpec(name="job-1", job_id="abc123abc123", command="true"))
    ok, message = local_conn(cancel_grace_seconds="ten").test_connection()
    assert not ok and message.startswith("Incomplete connection: cancel_grace_seconds: 'ten'"), message
    assert local_conn(cancel_grace_seconds="7.5").test_connection()[0]


def test_a_local_folder_that_cannot_exist_is_a_promised_kind_in_the_test_button(local_conn: Any) -> None:
    ok, message = local_conn(jobs_dir="/proc/no-such-process/jobs").test_connection()
    assert not ok
    assert message.startswith("Not found: cannot create the jobs folder /proc/no-such-process/jobs"), message


def test_the_jobs_state_filter_ignores_case(monkeypatch: pytest.MonkeyPatch) -> None:
    def job(state: str, job_id: str) -> IndexedJob:
        handle = {"platform": "local", "job_id": job_id, "name": "n", "submitted_at": 1.0}
        record = JobRecord(handle=handle, state=state, ended_at=2.0)
        return IndexedJob(record, "dag", "run", "train", -1, "failed", 1, 2.0, True)

    jobs = [job("Error", "aaaaaa000001"), job("Complete", "aaaaaa000002")]
    monkeypatch.setattr(commands, "load_jobs", lambda *a, **k: jobs)
    monkeypatch.setattr(commands, "create_session", mock.MagicMock())
    printed: list[Any] = []
    monkeypatch.setattr(commands, "_print", lambda rows, output: printed.append(rows))
    list_jobs = commands.list_jobs.__wrapped__.__wrapped__  # type: ignore[attr-defined]
    for state in ("error", "ERROR", "Error"):
        list_jobs(Namespace(dag_id=None, run_id=None, platform=None, state=state, limit=10, output="json"))
        assert [row["job_id"] for row in printed.pop()] == ["aaaaaa000001"]


# ----------------------------------------------------------------- 8: noise


def test_tao_logs_shows_heartbeats_in_words_not_json(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    beats = [f'TAO_PROGRESS {{"phase":"run","files":0,"bytes":0,"step":{i}}}' for i in range(1, 50)]
    text = "\n".join(["epoch 1", *beats, "done"]) + "\n"
    hook = mock.MagicMock()
    hook.get_job_logs.return_value = (text, "1")
    job = mock.MagicMock(record=mock.MagicMock(secret_conn_ids=[]))
    monkeypatch.setattr(commands, "_job_on_platform", lambda job_id: (job, None, hook))
    job_logs = commands.job_logs.__wrapped__.__wrapped__  # type: ignore[attr-defined]
    job_logs(Namespace(job_id="abcdef123456", tail=5, output="plain"))
    assert capsys.readouterr().out.splitlines() == ["epoch 1", "progress: run, step 49", "done"]


def test_links_look_nothing_up_when_nothing_was_submitted(fake_platform: type[FakeHook]) -> None:
    """Three ``[error] XCom not found`` lines after every pre-submit failure came from these lookups."""
    op = _op()
    ti_key = mock.MagicMock(dag_id="dag", run_id="run", task_id="train", map_index=-1)
    with mock.patch("airflow.sdk.execution_time.xcom.XCom.get_value") as get_value:
        assert TAOJobLink().get_link(op, ti_key=ti_key) == ""
        assert TAOResultsLink().get_link(op, ti_key=ti_key) == ""
    get_value.assert_not_called()
    op._handle = mock.MagicMock()  # submitted: the links read what the operator published
    with mock.patch("airflow.sdk.execution_time.xcom.XCom.get_value", return_value="https://console/job"):
        assert TAOJobLink().get_link(op, ti_key=ti_key) == "https://console/job"


def test_the_jobs_view_run_time_is_the_one_of_the_task_log_and_xcom(fake_platform: type[FakeHook]) -> None:
    """One run time: the platform's (program start to end), never the time until the task saw the end."""
    store = Store()
    context = make_context(store)
    op = _op(deferrable=True, execution_timeout=timedelta(minutes=5))
    with pytest.raises(TaskDeferred):
        op.execute(context)
    (job,) = fake_platform.jobs.values()
    handle = job["handle"]
    job.update(state=JobState.COMPLETE, exit=0, started=handle.submitted_at + 0.5, ended=handle.submitted_at + 0.75)
    event = {"status": "complete", "handle": handle.to_json(), "log_cursor": "", "message": ""}
    event["job_status"] = FakeHook().get_job_status(handle).to_json()
    result = op.execute_complete(context, event)

    (attempt,) = result["attempts"]
    assert attempt["run_seconds"] == pytest.approx(0.25)
    pushed = {c.kwargs["key"]: c.kwargs["value"] for c in context["ti"].xcom_push.call_args_list}
    assert pushed[XCOM_ATTEMPTS][0]["run_seconds"] == pytest.approx(0.25)
    record = JobRecord.from_json(store.data[STATE_KEY])
    assert record is not None
    indexed = IndexedJob(record, "dag", "manual__1", "train", -1, "success", 1, record.ended_at, True)
    assert indexed.runtime_seconds() == pytest.approx(0.25)
    assert indexed.row()["runtime_seconds"] == pytest.approx(0.2, abs=0.06)
    assert indexed.row()["gpu_hours"] == pytest.approx(round(0.25 / 3600, 4))
