"""The hook methods the UI, the CLI and the view rely on, the [tao] settings the operator honours, the job record and
the links -- on the in-memory platform and on every registered platform's class."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from airflow_provider_tao import settings
from airflow_provider_tao.get_provider_info import CONNECTION_FORMS, get_provider_info
from airflow_provider_tao.hooks.base import ConnectionProblem, TAOPlatformHook
from airflow_provider_tao.hooks.ownership import CancelOutcome
from airflow_provider_tao.jobs import JobHandle, JobState
from airflow_provider_tao.links import TAOJobLink, TAOResultsLink, job_page_path, results_link
from airflow_provider_tao.operators.submit import TAOSubmitOperator
from airflow_provider_tao.records import STATE_KEY, JobRecord
from tests.unit.fakes import FakeHook, Store, make_context
from tests.unit.test_platform_contract import _hook_classes

# ----------------------------------------------------------------------------- what every platform implements


@pytest.mark.parametrize("cls", _hook_classes(), ids=lambda c: c.platform)
def test_every_platform_implements_what_the_ui_and_cli_call(cls: type[TAOPlatformHook]) -> None:
    assert cls.probe_connection is not TAOPlatformHook.probe_connection, "the Test button"
    assert cls.list_active_jobs is not TAOPlatformHook.list_active_jobs, "airflow tao reap"
    assert cls.job_location is not TAOPlatformHook.job_location, "the job page"
    # the Test button runs the shared template, which never raises and redacts secrets
    assert cls.test_connection is TAOPlatformHook.test_connection


@pytest.mark.parametrize("cls", _hook_classes(), ids=lambda c: c.platform)
def test_every_platform_has_a_connection_form_named_like_its_hook(cls: type[TAOPlatformHook]) -> None:
    form = CONNECTION_FORMS[cls.conn_type]()
    assert form["hook-name"] == cls.hook_name
    assert form["conn-fields"], "labelled fields"
    for name, field in form["conn-fields"].items():
        assert field["label"] and field["description"].endswith((".", ")")), name


class _Probed(FakeHook):
    answer: Any = "fine"

    def probe_connection(self) -> str:
        if isinstance(self.answer, BaseException):
            raise self.answer
        return str(self.answer)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("Fake 1.0 answers", (True, "Fake 1.0 answers")),
        (ConnectionProblem("unreachable", "no answer at x:1"), (False, "Unreachable: no answer at x:1")),
        (ConnectionProblem("auth", "key refused"), (False, "Authentication refused: key refused")),
        (ConnectionProblem("not_found", "namespace ml"), (False, "Not found: namespace ml")),
        (ConnectionProblem("permission", "403"), (False, "Permission denied: 403")),
        (RuntimeError("boom"), (False, "Unexpected error from the fake platform: RuntimeError: boom")),
    ],
)
def test_test_connection_says_in_words_what_failed(
    monkeypatch: pytest.MonkeyPatch, answer: Any, expected: tuple[bool, str]
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PROBED", json.dumps({"conn_type": "tao_fake"}))
    monkeypatch.setattr(_Probed, "answer", answer)
    assert _Probed(conn_id="probed").test_connection() == expected


def test_test_connection_never_shows_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    conn = {"conn_type": "tao_fake", "password": "pw-hunter2", "extra": {"private_key": "KEY-abcdef", "token": "t0k3n"}}
    monkeypatch.setenv("AIRFLOW_CONN_PROBED", json.dumps(conn))
    monkeypatch.setattr(
        _Probed, "answer", ConnectionProblem("auth", "refused pw-hunter2 with KEY-abcdef and t0k3n for user x")
    )
    ok, message = _Probed(conn_id="probed").test_connection()
    assert not ok
    assert message == "Authentication refused: refused *** with *** and *** for user x"


def test_a_bad_problem_kind_is_a_bug() -> None:
    with pytest.raises(AssertionError):
        ConnectionProblem("weird", "x")


def test_a_platform_rents_nothing_unless_it_says_so() -> None:
    assert FakeHook().reap_resources(lambda origin: "running", dry_run=True) == []


def test_default_lease_expiry_follows_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    handle = JobHandle("fake", None, "j", "n", submitted_at=1000.0)
    assert FakeHook().lease_expired(handle, now=10**9) is False  # 0 = no lease
    monkeypatch.setenv("AIRFLOW__TAO__LEASE_HOURS", "2")
    assert FakeHook().lease_expired(handle, now=1000.0 + 2 * 3600 - 1) is False
    assert FakeHook().lease_expired(handle, now=1000.0 + 2 * 3600 + 1) is True


@pytest.mark.parametrize(
    ("uri", "link"),
    [
        ("s3://bkt/results/abc", "https://s3.console.aws.amazon.com/s3/buckets/bkt?prefix=results/abc/"),
        ("s3://bkt", "https://s3.console.aws.amazon.com/s3/buckets/bkt?prefix="),
        ("https://minio.example/bkt/x", "https://minio.example/bkt/x"),
        ("/lustre/results/abc", ""),
        ("", ""),
    ],
)
def test_results_links(uri: str, link: str) -> None:
    assert results_link(uri) == link


# ----------------------------------------------------------------------------- one cancel routine, two requesters


def test_a_cancel_from_outside_fails_the_task_with_err_canceled_and_never_resubmits(
    fake_platform: type[FakeHook],
) -> None:
    store = Store()
    op = TAOSubmitOperator(task_id="train", conn_id="fake_conn", image="i:1", command="x", deferrable=True)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(make_context(store, try_number=1))
    handle = JobHandle.from_json(deferred.value.trigger.serialize()[1]["handle"])
    # `airflow tao cancel` holds the handle from the store, owned by try 1; another try may own the job by then
    hook = FakeHook()
    hook.write_mark(handle, "owner_try", 2)
    assert hook.cancel_job(handle) is CancelOutcome.NOT_OURS  # a try that lost the job may not cancel it ...
    assert hook.cancel_job(handle, requested_by="cli:jdoe") is CancelOutcome.STOPPED  # ... a person may
    assert fake_platform.jobs[handle.job_id]["state"] is JobState.CANCELED
    assert hook.canceled_by(handle) == "cli:jdoe"
    assert hook.cancel_requested_by(handle) == 2  # on behalf of the owner: platforms read it as a cancel

    event = {
        "status": "canceled",
        "handle": handle.to_json(),
        "job_status": hook.get_job_status(handle).to_json(),
        "log_cursor": "",
        "message": "",
    }
    with pytest.raises(AirflowFailException, match=r"ERR_CANCELED \(not retriable\).*canceled by cli:jdoe"):
        op.execute_complete(make_context(store, try_number=1), event)
    assert len(fake_platform.jobs) == 1  # not submitted again
    record = JobRecord.from_json(store.data[STATE_KEY])
    assert record is not None and (record.state, record.err_class) == ("Canceled", "ERR_CANCELED")


def test_a_finished_job_is_never_marked_canceled_by_a_person(fake_platform: type[FakeHook]) -> None:
    hook = FakeHook()
    handle = hook.create_job(
        mock.Mock(job_id="j1", name="n", spec=["job_id", "name"]),  # type: ignore[arg-type]
    )
    fake_platform.jobs["j1"]["state"] = JobState.COMPLETE
    assert hook.cancel_job(handle, requested_by="cli:jdoe") is CancelOutcome.ENDED
    assert hook.canceled_by(handle) is None and fake_platform.jobs["j1"]["state"] is JobState.COMPLETE


# ----------------------------------------------------------------------------- [tao] settings are honoured


def _deferred(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], **kwargs: Any) -> tuple[TaskDeferred, Store]:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    store = Store()
    op = TAOSubmitOperator(
        **{"task_id": "train", "conn_id": "fake_conn", "image": "i:1", "command": "x", "deferrable": True, **kwargs}
    )
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(make_context(store))
    return deferred.value, store


def test_settings_default_poll_interval_and_stream_logs_apply_when_the_task_runs(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    op_before = TAOSubmitOperator(task_id="t", conn_id="fake_conn", image="i:1", command="x", deferrable=True)
    deferred, _ = _deferred(
        monkeypatch, {"AIRFLOW__TAO__DEFAULT_POLL_INTERVAL": "42", "AIRFLOW__TAO__STREAM_LOGS": "False"}
    )
    kwargs = deferred.trigger.serialize()[1]
    assert (kwargs["poll_interval"], kwargs["stream_logs"]) == (42.0, False)
    assert op_before.interval == 42.0  # parsed before the setting changed: read when the task runs
    deferred, _ = _deferred(monkeypatch, {}, poll_interval=3, stream_logs=True)
    kwargs = deferred.trigger.serialize()[1]
    assert (kwargs["poll_interval"], kwargs["stream_logs"]) == (3.0, True)  # the task's own values win


def test_settings_default_results_uri_applies_and_an_explicit_one_wins(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"AIRFLOW__TAO__DEFAULT_RESULTS_URI": "/data/shared-results"}
    _deferred(monkeypatch, env)
    (job,) = fake_platform.jobs.values()
    assert job["spec"].results_uri == "/data/shared-results"
    FakeHook.reset()
    _deferred(monkeypatch, env, results_uri="/mine")
    (job,) = fake_platform.jobs.values()
    assert job["spec"].results_uri == "/mine"


def test_settings_default_storage_conn_id_only_for_tasks_that_move_data(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__TAO__DEFAULT_STORAGE_CONN_ID", "aws_shared")
    plain = TAOSubmitOperator(task_id="t", conn_id="fake_conn", image="i:1", command="x")
    plain._apply_config_defaults()
    assert plain.storage_conn_id is None and not plain.uses_runner  # a plain job is never wrapped in the runner
    data = TAOSubmitOperator(task_id="t", conn_id="fake_conn", image="i:1", command="x", outputs=["model"])
    data._apply_config_defaults()
    assert data.storage_conn_id == "aws_shared"
    to_s3 = TAOSubmitOperator(task_id="t", conn_id="fake_conn", image="i:1", command="x", results_uri="s3://b/r")
    to_s3._apply_config_defaults()
    assert to_s3.storage_conn_id == "aws_shared"
    own = TAOSubmitOperator(task_id="t", conn_id="fake_conn", image="i:1", command="x", storage_conn_id="aws_mine")
    own._apply_config_defaults()
    assert own.storage_conn_id == "aws_mine"


def test_settings_lease_hours_is_the_deadline_of_tasks_without_execution_timeout(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    deferred, store = _deferred(monkeypatch, {})
    assert deferred.trigger.serialize()[1]["deadline"] is None  # default: no lease
    deferred, store = _deferred(monkeypatch, {"AIRFLOW__TAO__LEASE_HOURS": "1.5"})
    started = store.data[STATE_KEY]["handle"]["submitted_at"]
    assert deferred.trigger.serialize()[1]["deadline"] == pytest.approx(started + 5400, abs=5)
    deferred, _ = _deferred(monkeypatch, {"AIRFLOW__TAO__LEASE_HOURS": "1.5"}, execution_timeout=timedelta(hours=9))
    assert deferred.trigger.serialize()[1]["deadline"] == pytest.approx(started + 9 * 3600, abs=5)


def test_the_config_section_declares_exactly_what_settings_reads() -> None:
    declared = get_provider_info()["config"]["tao"]["options"]
    assert set(declared) == set(settings.OPTIONS)
    for name, (kind, default, _) in settings.OPTIONS.items():
        assert (declared[name]["type"], declared[name]["default"]) == (kind, default)
        assert declared[name]["example"], name


# ----------------------------------------------------------------------------- the record


def test_a_new_job_of_the_task_instance_keeps_the_earlier_one_in_its_history() -> None:
    first = JobRecord(handle=JobHandle("fake", None, "a", "n", submitted_at=0.0).to_json(), gpu_count=2)
    ended = first.ended("Error", err_class="ERR_INFRA")
    second = ended.successor(JobHandle("fake", None, "b", "n", try_number=2), gpu_count=2)
    assert second.job_id == "b" and [h["handle"]["job_id"] for h in second.history] == ["a"]
    assert second.history[0]["err_class"] == "ERR_INFRA"
    assert ended.successor(JobHandle("fake", None, "a", "n")).history == []  # the same job is not history
    assert JobRecord.from_json({"handle": {"x": 1}}) is None and JobRecord.from_json("junk") is None


def test_gpu_hours_are_gpus_times_nodes_times_hours() -> None:
    record = JobRecord(handle=JobHandle("fake", None, "a", "n", submitted_at=0.0).to_json(), gpu_count=4, num_nodes=2)
    assert record.gpu_hours(now=1800.0) == pytest.approx(4.0)
    assert JobRecord(handle=record.handle, gpu_count=-1).gpu_hours(now=1.0) is None  # "every GPU": unknown


# ----------------------------------------------------------------------------- links


def _ti_key() -> Any:
    return mock.Mock(dag_id="d", run_id="manual__2026-01-01T00:00:00+00:00", task_id="t", map_index=-1)


@pytest.mark.parametrize(
    ("xcoms", "job_link", "results"),
    [
        ({}, "", ""),
        (
            {"tao_job_id": "j", "tao_console_url": "https://console.example/job/j", "tao_results_dir": "s3://b/r/j"},
            "https://console.example/job/j",
            "https://s3.console.aws.amazon.com/s3/buckets/b?prefix=r/j/",
        ),
        (
            {"tao_job_id": "j", "tao_console_url": "", "tao_results_dir": "/data/r/j"},
            "http://airflow.example/tao/jobs/d/manual__2026-01-01T00%3A00%3A00%2B00%3A00/t",
            "http://airflow.example/tao/jobs/d/manual__2026-01-01T00%3A00%3A00%2B00%3A00/t#results",
        ),
    ],
)
def test_links(monkeypatch: pytest.MonkeyPatch, xcoms: dict[str, str], job_link: str, results: str) -> None:
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://airflow.example/")
    with mock.patch("airflow.sdk.execution_time.xcom.XCom.get_value", side_effect=lambda key, ti_key: xcoms.get(key)):
        assert TAOJobLink().get_link(mock.Mock(), ti_key=_ti_key()) == job_link
        assert TAOResultsLink().get_link(mock.Mock(), ti_key=_ti_key()) == results


def test_job_page_path_escapes_every_part() -> None:
    assert job_page_path("d/../x", "r?y", "t#z", 3) == "/tao/jobs/d%2F..%2Fx/r%3Fy/t%23z?map_index=3"


@pytest.mark.parametrize("conn", get_provider_info()["connection-types"], ids=lambda c: c["connection-type"])
def test_every_form_gives_real_examples_and_never_suggests_a_secret(conn: dict[str, Any]) -> None:
    from airflow_provider_tao.get_provider_info import STANDARD_FIELDS

    behaviour = conn["ui-field-behaviour"]
    assert set(behaviour["placeholders"]) <= set(STANDARD_FIELDS)  # extra fields take schema.examples instead
    assert set(behaviour["hidden-fields"]) <= {*STANDARD_FIELDS, "extra"}
    for name, field in conn["conn-fields"].items():
        schema = field["schema"]
        if schema.get("format") == "password":
            assert "examples" not in schema and "default" not in schema, name
        elif schema["type"][0] != "boolean":
            (example,) = schema["examples"]
            assert isinstance(example, {"string": str, "integer": int, "number": float}[schema["type"][0]]), name


def test_the_local_test_button_checks_its_folders(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from airflow_provider_tao.hooks.local import LocalHook

    jobs, results = tmp_path / "jobs", tmp_path / "results"
    conn = {"conn_type": "tao_local", "extra": {"jobs_dir": str(jobs), "results_root": str(results)}}
    monkeypatch.setenv("AIRFLOW_CONN_TAO_LOCAL_TEST", json.dumps(conn))
    ok, message = LocalHook(conn_id="tao_local_test").test_connection()
    assert ok and message.startswith(f"jobs in {jobs}, results in {results}; "), message
    assert jobs.is_dir() and results.is_dir()
    results.rmdir()
    results.write_text("not a folder")
    ok, message = LocalHook(conn_id="tao_local_test").test_connection()
    assert (ok, message) == (False, f"Incomplete connection: the results root {results} is a file, not a folder")


def test_local_active_jobs_are_its_running_process_groups(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import time

    from airflow_provider_tao.hooks.local import LocalHook
    from airflow_provider_tao.jobs import JobSpec

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    hook = LocalHook(conn_id=None)
    long = hook.create_job(JobSpec(name="reap-long", job_id="aaaaaaaaaaaa", command="sleep 60", gpu_count=0))
    short = hook.create_job(JobSpec(name="reap-short", job_id="bbbbbbbbbbbb", command="true", gpu_count=0))
    deadline = time.monotonic() + 180
    while not hook.get_job_status(short).state.is_terminal and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert [h.job_id for h in hook.list_active_jobs()] == [long.job_id]
        assert hook.job_location(long)["Log file"].endswith("/aaaaaaaaaaaa/job.log")
    finally:
        hook.cancel_job(long)
    assert hook.list_active_jobs() == []
