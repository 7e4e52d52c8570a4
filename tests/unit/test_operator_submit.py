"""TAOSubmitOperator's lifecycle on the in-memory platform: validation, identity, reattach, resume outcomes."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowTaskTimeout, TaskDeferred

from airflow_provider_tao.hooks.base import JobSubmitError, JobValidationError
from airflow_provider_tao.hooks.ownership import CancelOutcome
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobState, JobStatus
from airflow_provider_tao.links import XCOM_CONSOLE_URL, XCOM_JOB_ID, XCOM_RESULTS_DIR
from airflow_provider_tao.operators.submit import TAOSubmitOperator
from airflow_provider_tao.records import STATE_KEY, XCOM_RECORD
from airflow_provider_tao.triggers.job import TAOJobTrigger
from tests.unit.fakes import FakeHook, Store, make_context


def _op(**kwargs: Any) -> TAOSubmitOperator:
    defaults: dict[str, Any] = {"task_id": "train", "conn_id": "fake_conn", "image": "img:1", "command": "train.sh"}
    return TAOSubmitOperator(**{**defaults, **kwargs})


def _defer(op: TAOSubmitOperator, context: dict[str, Any]) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as exc:
        op.execute(context)
    return exc.value


def _event(handle: JobHandle, fake: type[FakeHook], outcome: str) -> dict[str, Any]:
    status = FakeHook().get_job_status(handle)
    return {
        "status": outcome,
        "handle": handle.to_json(),
        "job_status": status.to_json(),
        "log_cursor": "",
        "message": "",
    }


def test_submit_stores_handle_pushes_links_then_defers(fake_platform: type[FakeHook]) -> None:
    store = Store()
    context = make_context(store)
    deferred = _defer(_op(deferrable=True, execution_timeout=timedelta(minutes=5)), context)

    assert isinstance(deferred.trigger, TAOJobTrigger)
    assert deferred.method_name == "execute_complete"
    assert deferred.timeout is None  # the trigger owns the deadline, so the job is canceled at timeout
    (job,) = fake_platform.jobs.values()
    handle = job["handle"]
    record = store.data[STATE_KEY]
    assert {k: record[k] for k in ("handle", "consumed", "outputs", "state", "gpu_count", "num_nodes")} == {
        "handle": handle.to_json(),
        "consumed": False,
        "outputs": {},
        "state": "Submitted",
        "gpu_count": 1,
        "num_nodes": 1,
    }
    assert record["deadline"] == pytest.approx(context["ti"].start_date.timestamp() + 300)
    pushed = {c.kwargs["key"]: c.kwargs["value"] for c in context["ti"].xcom_push.call_args_list}
    assert pushed == {
        XCOM_RECORD: record,  # the TAO jobs view reads the try's record from XCom too
        XCOM_JOB_ID: handle.job_id,
        XCOM_RESULTS_DIR: handle.results_dir,
        XCOM_CONSOLE_URL: handle.console_url,  # the fake platform's console page (hook.job_url)
    }
    kwargs = deferred.trigger.serialize()[1]
    assert kwargs["handle"] == handle.to_json()
    assert kwargs["deadline"] == pytest.approx(context["ti"].start_date.timestamp() + 300)


def test_job_name_is_deterministic_per_task_instance_and_differs_per_run(fake_platform: type[FakeHook]) -> None:
    names = []
    for run_id, try_number in (("r1", 1), ("r1", 2), ("r2", 1)):
        op = _op(deferrable=True)
        _defer(op, make_context(Store(), try_number, run_id))
        names.append(op._handle.name if op._handle else "")
    assert names[0] == names[1] != names[2]
    assert names[0].startswith("dag-train-")
    _defer(op := _op(deferrable=True, job_name="nightly"), make_context(Store()))
    assert op._handle is not None and op._handle.name.startswith("nightly-")


def test_retry_reattaches_to_the_running_job_and_takes_it_over(fake_platform: type[FakeHook]) -> None:
    store = Store()
    _defer(_op(deferrable=True), make_context(store, 1))
    deferred = _defer(_op(deferrable=True), make_context(store, 2))

    assert len(fake_platform.jobs) == 1
    handle = JobHandle.from_json(deferred.trigger.serialize()[1]["handle"])
    assert handle.try_number == 2
    assert FakeHook().job_owner(handle) == 2
    # the first try's trigger on_kill must now leave the job alone
    assert FakeHook().cancel_job(handle.owned_by(1)) is CancelOutcome.NOT_OURS
    assert fake_platform.jobs[handle.job_id]["state"] is JobState.RUNNING


def test_worker_died_before_store_write_reattaches_by_name(fake_platform: type[FakeHook]) -> None:
    _defer(_op(deferrable=True), make_context(Store(), 1))  # its store write is "lost": new empty store below
    _defer(_op(deferrable=True), make_context(Store(), 2))
    assert len(fake_platform.jobs) == 1


def test_completed_job_of_an_earlier_try_is_returned_without_resubmitting(fake_platform: type[FakeHook]) -> None:
    store = Store()
    _defer(_op(deferrable=True), make_context(store, 1))
    (job,) = fake_platform.jobs.values()
    job["state"], job["exit"] = JobState.COMPLETE, 0
    result = _op(deferrable=True).execute(make_context(store, 2))
    assert result["job_id"] == job["handle"].job_id and result["state"] == "Complete"
    assert len(fake_platform.jobs) == 1
    assert store.data[STATE_KEY]["consumed"] is True


def test_clearing_a_successful_task_runs_a_new_job(fake_platform: type[FakeHook]) -> None:
    store = Store()
    op = _op(deferrable=True)
    _defer(op, make_context(store, 1))
    (job,) = fake_platform.jobs.values()
    job["state"] = JobState.COMPLETE
    op.execute_complete(make_context(store, 1), _event(job["handle"], fake_platform, "complete"))
    _defer(_op(deferrable=True), make_context(store, 2))
    assert len(fake_platform.jobs) == 2


@pytest.mark.parametrize("state", [JobState.ERROR, JobState.CANCELED])
def test_failed_earlier_job_is_replaced(fake_platform: type[FakeHook], state: JobState) -> None:
    store = Store()
    _defer(_op(deferrable=True), make_context(store, 1))
    next(iter(fake_platform.jobs.values()))["state"] = state
    _defer(_op(deferrable=True), make_context(store, 2))
    assert len(fake_platform.jobs) == 2


def test_unreachable_platform_at_reattach_never_submits_a_duplicate(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store()
    _defer(_op(deferrable=True), make_context(store, 1))
    monkeypatch.setattr(FakeHook, "get_job_status", lambda self, h: JobStatus.unknown("connection refused"))
    with pytest.raises(AirflowException, match="avoid a duplicate"):
        _op(deferrable=True).execute(make_context(store, 2))
    assert len(fake_platform.jobs) == 1


def test_execute_complete_success_returns_the_contract(fake_platform: type[FakeHook]) -> None:
    store = Store()
    op = _op(deferrable=True)
    _defer(op, make_context(store))
    (job,) = fake_platform.jobs.values()
    job["state"], job["exit"] = JobState.COMPLETE, 0
    result = op.execute_complete(make_context(store), _event(job["handle"], fake_platform, "complete"))
    assert {"job_id", "platform", "backend_job_id", "state", "results_dir", "outputs", "console_url"} <= set(result)
    assert result["platform"] == "fake" and result["backend_job_id"] == f"b-{result['job_id']}"


def test_program_error_fails_without_retry_and_logs_the_class(
    fake_platform: type[FakeHook], capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store()
    op = _op(deferrable=True)
    _defer(op, make_context(store))
    (job,) = fake_platform.jobs.values()
    job["state"], job["exit"] = JobState.ERROR, 1
    fake_platform.logs[job["handle"].job_id] = "Traceback (most recent call last):\nValueError: bad\n"
    with pytest.raises(AirflowFailException, match="ERR_PROGRAM"):
        op.execute_complete(make_context(store), _event(job["handle"], fake_platform, "error"))
    logged = capsys.readouterr().out
    assert "ERR_PROGRAM" in logged and "evidence: ValueError: bad" in logged


def test_cuda_oom_is_not_retried_but_infra_is(fake_platform: type[FakeHook]) -> None:
    store = Store()
    op = _op(deferrable=True)
    _defer(op, make_context(store))
    (job,) = fake_platform.jobs.values()
    job["state"], job["exit"] = JobState.ERROR, 1
    fake_platform.logs[job["handle"].job_id] = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate\n"
    with pytest.raises(AirflowFailException, match="ERR_OOM"):
        op.execute_complete(make_context(store), _event(job["handle"], fake_platform, "error"))
    fake_platform.logs[job["handle"].job_id] = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus\n"
    with pytest.raises(AirflowException, match="ERR_INFRA") as exc:
        op.execute_complete(make_context(store), _event(job["handle"], fake_platform, "error"))
    assert not isinstance(exc.value, AirflowFailException)


def test_timeout_cancels_the_job(fake_platform: type[FakeHook]) -> None:
    store = Store()
    op = _op(deferrable=True)
    _defer(op, make_context(store))
    (job,) = fake_platform.jobs.values()
    with pytest.raises(AirflowTaskTimeout, match="ERR_TIMEOUT, it was canceled"):  # the class, literally
        op.execute_complete(make_context(store), _event(job["handle"], fake_platform, "timeout"))
    assert job["state"] is JobState.CANCELED


def test_job_canceled_by_the_previous_tries_cleanup_is_resubmitted(fake_platform: type[FakeHook]) -> None:
    """Clear while deferred: the new try took the job over, then the old trigger's on_kill canceled it anyway."""
    store = Store()
    _defer(_op(deferrable=True), make_context(store, 1))
    (job,) = fake_platform.jobs.values()
    new_try = _defer(op2 := _op(deferrable=True), make_context(store, 2))
    job["marks"]["cancel_requested_by"] = 1  # the race: old on_kill read the owner before the takeover
    job["state"] = JobState.CANCELED
    handle = JobHandle.from_json(new_try.trigger.serialize()[1]["handle"])
    with pytest.raises(TaskDeferred):
        op2.execute_complete(make_context(store, 2), _event(handle, fake_platform, "canceled"))
    assert len(fake_platform.jobs) == 2


def test_job_canceled_outside_airflow_fails_the_task(fake_platform: type[FakeHook]) -> None:
    store = Store()
    op = _op(deferrable=True)
    _defer(op, make_context(store))
    (job,) = fake_platform.jobs.values()
    job["state"] = JobState.CANCELED
    with pytest.raises(AirflowFailException, match="outside Airflow"):
        op.execute_complete(make_context(store), _event(job["handle"], fake_platform, "canceled"))


def test_synchronous_mode_waits_on_the_worker(fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch) -> None:
    polls = {"n": 0}
    real = FakeHook.get_job_status

    def finishing(self: FakeHook, handle: JobHandle) -> Any:
        polls["n"] += 1
        if polls["n"] >= 3:
            self.jobs[handle.job_id]["state"] = JobState.COMPLETE
        return real(self, handle)

    monkeypatch.setattr(FakeHook, "get_job_status", finishing)
    result = _op(deferrable=False, poll_interval=0.01).execute(make_context(Store()))
    assert result["state"] == "Complete" and polls["n"] >= 3


def test_synchronous_mode_copies_an_ended_jobs_whole_log(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job that printed more than one bounded read before its end: every line reaches the task log, in order."""
    fake_platform.log_read_limit = 100
    real = FakeHook.create_job

    def printing(self: FakeHook, spec: Any, try_number: int = 1) -> JobHandle:
        handle = real(self, spec, try_number)
        self.logs[handle.job_id] = "".join(f"line {n:03}\n" for n in range(50))  # 450 bytes: 5 reads
        self.jobs[handle.job_id]["state"] = JobState.COMPLETE
        return handle

    monkeypatch.setattr(FakeHook, "create_job", printing)
    _op(deferrable=False, poll_interval=0.01).execute(make_context(Store()))
    assert re.findall(r"\[job\] (line \d+)", capsys.readouterr().out) == [f"line {n:03}" for n in range(50)]


def test_on_kill_cancels_the_owned_job(fake_platform: type[FakeHook]) -> None:
    op = _op(deferrable=True)
    _defer(op, make_context(Store()))
    op.on_kill()
    assert next(iter(fake_platform.jobs.values()))["state"] is JobState.CANCELED


def test_on_kill_during_submission_cancels_the_job_being_submitted(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker is told to stop (mark failed/success, timeout) as create_job returns, before the operator holds
    the handle: on_kill finds the job it was submitting by name and cancels it (issue 22, found by the explorer:
    ``tests/explorer -k 'local and mark_failed'`` at ``execute:create_job#1``)."""

    class Sigterm(BaseException):
        pass

    create = FakeHook.create_job

    def create_then_stop(self: FakeHook, spec: Any, try_number: int = 1) -> JobHandle:
        create(self, spec, try_number)
        raise Sigterm()

    monkeypatch.setattr(FakeHook, "create_job", create_then_stop)
    op = _op(deferrable=True)
    with pytest.raises(Sigterm):
        op.execute(make_context(Store()))
    op.on_kill()
    [job] = fake_platform.jobs.values()
    assert job["state"] is JobState.CANCELED


def test_on_kill_with_cancel_on_kill_false_leaves_the_job(fake_platform: type[FakeHook]) -> None:
    op = _op(deferrable=True, cancel_on_kill=False)
    _defer(op, make_context(Store()))
    op.on_kill()
    assert next(iter(fake_platform.jobs.values()))["state"] is JobState.RUNNING


# ----------------------------------------------------------------------------- bad input, before any job


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"platform": "nope"}, "platform"),
        ({"gpu_count": -2}, "gpu_count"),
        ({"num_nodes": 0}, "num_nodes"),
        ({"gpu_count": "2"}, "gpu_count"),
        ({"poll_interval": 0}, "poll_interval"),
        ({"env": {"EPOCHS": 5}}, "env['EPOCHS']"),  # the words: tests/unit/test_first_hour.py
        ({"image": "tao_toolkit.nope"}, "image"),
    ],
)
def test_static_bad_input_fails_at_parse_time(kwargs: dict[str, Any], parameter: str) -> None:
    with pytest.raises(JobValidationError) as exc:
        _op(**kwargs)
    assert exc.value.parameter == parameter and str(exc.value).startswith(f"{parameter}:")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"conn_id": "missing_conn"}, "conn_id: there is no Airflow connection 'missing_conn'"),
        ({"conn_id": "http_conn"}, "conn_id: connection 'http_conn' has type 'http', which is not a TAO platform"),
        ({"conn_id": "fake_conn", "platform": "local"}, "platform: 'local' does not match connection 'fake_conn'"),
        ({"conn_id": None, "platform": None}, "platform: neither conn_id nor platform is given"),
        ({"env": {"BAD-NAME": "1"}}, "env['BAD-NAME']: is not a valid environment variable name"),
        ({"job_name": "My Job!"}, "job_name: 'My Job!-"),
        ({"image": None}, "image: is required on the fake platform"),
        ({"command": ""}, "command: is empty"),
    ],
)
def test_bad_input_fails_fast_before_anything_is_submitted(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], message: str
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_HTTP_CONN", '{"conn_type": "http", "host": "example.com"}')
    with pytest.raises(AirflowFailException) as exc:
        _op(deferrable=True, **kwargs).execute(make_context(Store()))
    assert message in str(exc.value)
    assert "nothing was submitted" in str(exc.value)
    assert fake_platform.jobs == {}


@pytest.mark.parametrize(
    ("err_class", "raised"),
    [(ErrClass.ERR_IMAGE_PULL, AirflowFailException), (ErrClass.ERR_INFRA, AirflowException)],
)
def test_a_refused_submission_fails_now_or_retries_by_its_class(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, err_class: ErrClass, raised: type[Exception]
) -> None:
    def refuse(self: FakeHook, spec: Any, try_number: int = 1) -> JobHandle:
        raise JobSubmitError(err_class, "cannot pull img:1: no such host")

    monkeypatch.setattr(FakeHook, "create_job", refuse)
    with pytest.raises(raised, match=rf"refused job \w+: {err_class.value}: cannot pull img:1") as exc:
        _op().execute(make_context(Store()))
    assert isinstance(exc.value, AirflowFailException) == (not err_class.retriable)


def test_the_spec_names_the_task_instance_it_comes_from(fake_platform: type[FakeHook]) -> None:
    _defer(_op(deferrable=True), make_context(Store()))
    (job,) = fake_platform.jobs.values()
    assert job["spec"].origin == {"dag_id": "dag", "task_id": "train", "run_id": "manual__1", "map_index": "-1"}


def test_config_mode_with_a_command_that_never_names_the_spec_is_bad_input(fake_platform: type[FakeHook]) -> None:
    """The spec file would be written and never read: the job would fail with the program's own argument error."""
    spec = {"train": {"epochs": 3}}
    with pytest.raises(AirflowFailException) as exc:
        _op(command=["train.py", "--epochs", "3"], specs=spec, deferrable=True).execute(make_context(Store()))
    assert "Bad input, nothing was submitted: command: config mode (specs=...) writes the spec" in str(exc.value)
    assert "'train.py --config {config_path}'" in str(exc.value)
    assert fake_platform.jobs == {}
    # the placeholder, or the variable the runner also exports (for a shell, or a program told to read it)
    for command in (["train.py", "-e", "{config_path}"], 'train.py -e "$TAO_CONFIG_PATH"'):
        fake_platform.jobs.clear()
        _defer(_op(command=command, specs=spec, deferrable=True), make_context(Store()))
        assert len(fake_platform.jobs) == 1
