"""Issue 7's lifecycle defects, each shown on the in-memory platform (the e2e twins live in tests/e2e/).

Every test here fails on the code before contract v2: the defect's number is in its name.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from airflow_provider_tao import canceling
from airflow_provider_tao.hooks.base import MARK_CONSUMED, JobValidationError
from airflow_provider_tao.hooks.ownership import CancelOutcome
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobSpec, JobState
from airflow_provider_tao.operators.submit import TAOSubmitOperator
from airflow_provider_tao.records import STATE_KEY
from airflow_provider_tao.triggers.job import TAOJobTrigger
from airflow_provider_tao.triggers.poller import StatusPoller
from tests.unit import lifecycle_steps
from tests.unit.fakes import FakeHook, Store, make_context
from tests.unit.lifecycle_steps import WorkerDied, die_at, kill_local_job, live_local_jobs
from tests.unit.test_operator_submit import _defer, _op


def _event(handle: JobHandle, outcome: str) -> dict[str, Any]:
    status = FakeHook().get_job_status(handle)
    return {"status": outcome, "handle": handle.to_json(), "job_status": status.to_json(), "log_cursor": ""}


def _results_dir_of_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake platform puts results where the spec says (as real platforms do)."""
    real = FakeHook.create_job

    def create_job(self: FakeHook, spec: JobSpec, try_number: int = 1) -> JobHandle:
        handle = real(self, spec, try_number)
        return JobHandle(**{**handle.to_json(), "results_dir": self.results_dir_for(spec)})

    monkeypatch.setattr(FakeHook, "create_job", create_job)


def test_defect_1_reattach_after_a_lost_store_write_returns_the_outputs_of_the_job_that_ran(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    _results_dir_of_spec(monkeypatch)
    _defer(_op(deferrable=True, outputs=["/workspace/model"]), make_context(Store(), 1))  # its store write is lost
    (job,) = fake_platform.jobs.values()
    job["state"], job["exit"] = JobState.COMPLETE, 0

    result = _op(deferrable=True, outputs=["/workspace/model"]).execute(make_context(Store(), 2))

    ran = job["handle"]
    assert result["job_id"] == ran.job_id
    assert result["outputs"] and all(ran.job_id in uri for uri in result["outputs"].values()), result["outputs"]


def test_defect_1_reattach_to_a_running_job_stores_its_outputs_not_a_new_specs(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    _results_dir_of_spec(monkeypatch)
    store = Store()
    _defer(_op(deferrable=True, outputs=["/workspace/model"]), make_context(store, 1))
    first = dict(store.data[STATE_KEY]["outputs"])
    store.data.clear()  # e.g. a worker SIGKILL before the store write, or the store's retention
    op = _op(deferrable=True, outputs=["/workspace/model"])
    _defer(op, make_context(store, 2))
    (job,) = fake_platform.jobs.values()
    assert store.data[STATE_KEY]["outputs"] == first
    job["state"], job["exit"] = JobState.COMPLETE, 0
    result = op.execute_complete(make_context(store, 2), _event(job["handle"].owned_by(2), "complete"))
    assert result["outputs"] == first


def test_defect_2_a_running_job_is_reattached_even_when_todays_validation_fails(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store()
    _defer(_op(deferrable=True), make_context(store, 1))

    def moved_input(self: FakeHook, spec: JobSpec) -> None:
        raise JobValidationError("inputs", "s3://b/data does not exist", "Upload it")

    monkeypatch.setattr(FakeHook, "validate_spec", moved_input)
    deferred = _defer(_op(deferrable=True), make_context(store, 2))
    assert len(fake_platform.jobs) == 1
    assert JobHandle.from_json(deferred.trigger.serialize()[1]["handle"]).try_number == 2


def test_defect_2_a_new_submission_is_still_validated(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    def bad(self: FakeHook, spec: JobSpec) -> None:
        raise JobValidationError("inputs", "s3://b/data does not exist", "Upload it")

    monkeypatch.setattr(FakeHook, "validate_spec", bad)
    with pytest.raises(AirflowFailException, match="nothing was submitted: inputs"):
        _op(deferrable=True).execute(make_context(Store(), 1))
    assert fake_platform.jobs == {}


def test_defect_3_a_transport_error_on_the_worker_path_is_an_outage_not_a_failure(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = FakeHook.get_job_status
    calls = {"n": 0}

    def blips(self: FakeHook, handle: JobHandle) -> Any:
        calls["n"] += 1
        if calls["n"] in (2, 3):
            raise ConnectionError("SSH blip")
        if calls["n"] >= 4:
            fake_platform.jobs[handle.job_id]["state"] = JobState.COMPLETE
        return real(self, handle)

    monkeypatch.setattr(FakeHook, "get_job_status", blips)
    result = _op(deferrable=False, poll_interval=0.01).execute(make_context(Store(), 1))
    assert result["state"] == "Complete"
    text = capsys.readouterr().out
    assert "does not answer (status call failed: SSH blip)" in text and "answers again" in text


def test_an_outage_after_the_job_ended_does_not_fail_the_task_that_marks_its_result_used(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The trigger saw the job end, then the platform went away before the worker resumed the task: marking the
    result used waits the outage out (found by the fault matrix: the task failed on its last platform call)."""
    real = FakeHook.write_mark
    calls = {"n": 0}

    def blips(self: FakeHook, handle: JobHandle, key: str, value: Any) -> None:
        if key == MARK_CONSUMED:
            calls["n"] += 1
            if calls["n"] < 3:
                raise ConnectionError("daemon unreachable")
        real(self, handle, key, value)

    monkeypatch.setattr(FakeHook, "write_mark", blips)
    store = Store()
    op = _op(deferrable=True, poll_interval=0.01)
    _defer(op, make_context(store, 1))
    (job,) = fake_platform.jobs.values()
    job["state"], job["exit"] = JobState.COMPLETE, 0
    assert op.execute_complete(make_context(store, 1), _event(job["handle"], "complete"))["state"] == "Complete"
    assert job["marks"][MARK_CONSUMED] == 1 and calls["n"] == 3
    text = capsys.readouterr().out
    assert "does not answer (marking the job's result used failed: daemon unreachable)" in text
    assert "answers again" in text


def test_defect_3_the_trigger_has_no_unreachable_outcome() -> None:
    kwargs = TAOJobTrigger(handle=JobHandle("fake", None, "j", "n").to_json()).serialize()[1]
    assert "max_unknown_seconds" not in kwargs


def test_defect_4_the_consumed_mark_lives_with_the_job_so_an_emptied_store_still_reruns(
    fake_platform: type[FakeHook],
) -> None:
    store = Store()
    op = _op(deferrable=True)
    _defer(op, make_context(store, 1))
    (job,) = fake_platform.jobs.values()
    job["state"], job["exit"] = JobState.COMPLETE, 0
    op.execute_complete(make_context(store, 1), _event(job["handle"], "complete"))
    assert job["marks"][MARK_CONSUMED] == 1

    store.data.clear()  # [state_store] clear_on_success=True, or the store's retention passed
    _defer(_op(deferrable=True), make_context(store, 2))
    assert len(fake_platform.jobs) == 2


def test_defect_5_a_cancel_by_the_resuming_try_itself_resubmits(fake_platform: type[FakeHook]) -> None:
    """A spurious trigger on_kill (the trigger moved between triggerers) canceled the job of the try that now
    resumes: that was not the user's kill, so the job runs again instead of the task failing for good."""
    store = Store()
    op = _op(deferrable=True)
    deferred = _defer(op, make_context(store, 1))
    handle = JobHandle.from_json(deferred.trigger.serialize()[1]["handle"])
    assert FakeHook().cancel_job(handle) is CancelOutcome.STOPPED  # what the trigger's on_kill does
    with pytest.raises(TaskDeferred):
        op.execute_complete(make_context(store, 1), _event(handle, "canceled"))
    assert len(fake_platform.jobs) == 2


async def test_defect_6_a_local_job_watched_from_another_host_ends_misplaced(tmp_path: Any) -> None:
    from airflow_provider_tao.hooks.local import LocalHook

    handle = JobHandle(
        "local", None, "abc", "n", backend_job_id="4242", console_url=f"file://another-host{tmp_path}/job.log"
    )
    assert LocalHook().watch_problem(handle.owned_by(1)) is not None
    events = [event async for event in TAOJobTrigger(handle=handle.to_json()).run()]
    (event,) = events
    assert event.payload["status"] == "misplaced"
    message = event.payload["message"]
    assert "another-host" in message and os.uname().nodename in message and "deferrable=False" in message
    assert StatusPoller._instances == {}


def test_defect_6_the_operator_fails_a_misplaced_watch_without_retry(fake_platform: type[FakeHook]) -> None:
    store = Store()
    op = _op(deferrable=True)
    _defer(op, make_context(store, 1))
    (job,) = fake_platform.jobs.values()
    event = {**_event(job["handle"], "misplaced"), "message": "runs on worker host 'a'"}
    with pytest.raises(AirflowFailException, match="worker host"):
        op.execute_complete(make_context(store, 1), event)


def test_defect_8_the_worker_registers_every_secret_of_the_job(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    masked: list[str] = []
    monkeypatch.setattr("airflow.sdk.log.mask_secret", lambda value, name=None: masked.append(value))
    real = TAOSubmitOperator.stage

    def with_secret(self: TAOSubmitOperator, spec: JobSpec, hook: Any) -> Any:
        staged, outputs = real(self, spec, hook)
        return JobSpec(**{**staged.__dict__, "secret_env": {"AWS_SECRET_ACCESS_KEY": "s3cr3t-key-value"}}), outputs

    monkeypatch.setattr(TAOSubmitOperator, "stage", with_secret)
    _defer(_op(deferrable=True), make_context(Store(), 1))
    assert "s3cr3t-key-value" in masked


async def test_defect_8_the_trigger_masks_the_storage_connections_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_S3_STAGING",
        '{"conn_type": "aws", "login": "AKIAEXAMPLE", "password": "secret-key-value-123",'
        ' "extra": {"aws_session_token": "session-token-value-456", "region_name": "us-east-1"}}',
    )
    masked: list[str] = []

    async def amask(value: Any, name: Any = None) -> None:
        masked.append(value)

    monkeypatch.setattr("airflow.sdk.log.amask_secret", amask)
    trigger = TAOJobTrigger(handle=JobHandle("fake", None, "j", "n").to_json(), secret_conn_ids=["s3_staging"])
    await trigger._mask_secrets()
    assert "session-token-value-456" in masked
    assert "us-east-1" not in masked  # only values Airflow calls sensitive


@pytest.mark.parametrize(("expiry_in", "expected"), [(600, "expire at"), (7200, None), (None, "unknown lifetime")])
def test_defect_8_temporary_credentials_expiring_before_the_deadline_are_warned_about(
    fake_platform: type[FakeHook],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    expiry_in: float | None,
    expected: str | None,
) -> None:
    op = _op(deferrable=True, storage_conn_id="s3_staging")
    now = time.time()
    monkeypatch.setattr(op, "storage_credentials_expiry", lambda: None if expiry_in is None else now + expiry_in)
    spec = JobSpec(name="n", job_id="j", command="x", secret_env={"AWS_SESSION_TOKEN": "t"}, deadline=now + 3600)
    op._warn_expiring_credentials(spec)
    out = capsys.readouterr().out
    if expected is None:
        assert "AWS" not in out
    else:
        assert expected in out and "storage_conn_id" in out


# ----------------------------------------------------------------------------- issue 22: holes found by reading


@pytest.fixture
def local_conn(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A ``tao_local`` connection on tmp folders; every job still alive at the end is killed (from ``/proc``)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    extra = {"jobs_dir": str(tmp_path / "jobs"), "results_root": str(tmp_path / "results"), "cancel_grace_seconds": 1}
    monkeypatch.setenv("AIRFLOW_CONN_TAO_LOCAL_LIFECYCLE", json.dumps({"conn_type": "tao_local", "extra": extra}))
    monkeypatch.setattr(lifecycle_steps, "RESULTS_ROOT", extra["results_root"])  # this test's jobs only
    names: list[str] = []
    yield names
    for name in names:
        for job_id in live_local_jobs(name):
            kill_local_job(job_id)


def _wait_for(check: Any, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_issue_22_hole_1_a_retry_after_a_worker_died_between_submission_and_record_adopts_that_job(
    local_conn: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Try 2 finds try 1's job A ended and submits B; the worker dies before B's record is kept. Try 3 must adopt B
    (the newest job of the task instance's name), not submit C next to it: counted on the backend's processes."""
    from airflow_provider_tao.hooks.local import LocalHook

    def op() -> TAOSubmitOperator:
        return TAOSubmitOperator(
            task_id="train", conn_id="tao_local_lifecycle", command="sleep 60", gpu_count=0, deferrable=True
        )

    store = Store()
    first = _defer(op(), make_context(store, 1))
    a = JobHandle.from_json(first.trigger.serialize()[1]["handle"])
    local_conn.append(a.name)
    pid_file = Path(a.console_url.removeprefix(f"file://{os.uname().nodename}")).parent / "pid"
    _wait_for(pid_file.exists, "job A's supervisor to start")
    assert kill_local_job(a.job_id)  # the job crashed while no try watched it
    _wait_for(lambda: not live_local_jobs(a.name), "job A to end")

    die_at(monkeypatch, "create", hook=LocalHook)  # try 2 submits B, then its worker dies before the record
    with pytest.raises(WorkerDied):
        op().execute(make_context(store, 2))
    assert store.data[STATE_KEY]["handle"]["job_id"] == a.job_id  # the record still names A
    (b,) = live_local_jobs(a.name)

    third = _defer(op(), make_context(store, 3))
    assert live_local_jobs(a.name) == {b}  # one live job of the task instance: B, not B and C
    assert JobHandle.from_json(third.trigger.serialize()[1]["handle"]).job_id == b


@pytest.mark.parametrize(("err_class", "fails_for_good"), [(ErrClass.ERR_AUTH, True), (ErrClass.ERR_INFRA, False)])
def test_a_lookup_of_the_earlier_job_refused_for_good_fails_the_task_and_an_outage_is_retried(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, err_class: ErrClass, fails_for_good: bool
) -> None:
    """A platform error raised while the try looks for its earlier job is never "no job" (that would submit a
    second one); a class a retry cannot mend (refused credentials) fails the task, any other is retried."""

    class PlatformError(RuntimeError):
        def __init__(self) -> None:
            super().__init__("the platform said no")
            self.err_class = err_class

    def refused(self: FakeHook, name: str) -> JobHandle | None:
        raise PlatformError()

    monkeypatch.setattr(FakeHook, "find_job", refused)
    with pytest.raises(PlatformError if not fails_for_good else AirflowFailException) as raised:
        _op(deferrable=True).execute(make_context(Store(), 1))
    assert isinstance(raised.value, AirflowFailException) is fails_for_good
    assert fake_platform.jobs == {}


def test_issue_22_a_persons_cancel_while_the_task_waits_for_its_next_try_is_final_and_a_clear_runs_it_again(
    local_conn: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Try 1's worker dies while its job A runs: the task is up_for_retry (Airflow gave it a new task instance id).
    A person runs ``airflow tao cancel A``: the next try fails with ERR_CANCELED and submits nothing (it used to find
    A canceled and submit B). A clear afterwards (a new id again) runs the task anew. Counted on the backend: the
    jobs' folders and live processes. The metadata database (the task instance's row, the store the CLI writes to)
    is this test's ``Store`` and ids."""
    from argparse import Namespace

    from airflow_provider_tao import person_cancel
    from airflow_provider_tao.cli import commands
    from airflow_provider_tao.jobindex import IndexedJob
    from airflow_provider_tao.records import JobRecord

    def op() -> TAOSubmitOperator:
        return TAOSubmitOperator(
            task_id="train", conn_id="tao_local_lifecycle", command="sleep 60", gpu_count=0, deferrable=True
        )

    def context(try_number: int, ti_id: str) -> dict[str, Any]:
        ctx = make_context(store, try_number)
        ctx["ti"].id = ti_id
        return ctx

    store = Store()
    ti_now = {"id": "ti-try-1", "state": "running"}
    die_at(monkeypatch, "record")  # try 1 submits A and keeps its record; then its worker dies
    with pytest.raises(WorkerDied):
        op().execute(context(1, ti_now["id"]))
    a = JobRecord.from_json(store.data[STATE_KEY]).job  # type: ignore[union-attr]
    local_conn.append(a.name)
    assert live_local_jobs(a.name) == {a.job_id}
    ti_now.update(id="ti-try-2", state="up_for_retry")  # Airflow's prepare_db_for_next_try

    # `airflow tao cancel A`, its metadata database being this test's
    indexed = IndexedJob(
        record=JobRecord.from_json(store.data[STATE_KEY]),  # type: ignore[arg-type]
        dag_id="dag", run_id="manual__1", task_id="train", map_index=-1,
        ti_state=ti_now["state"], ti_try=1, ti_end=None, current=True,
    )  # fmt: skip
    monkeypatch.setattr(commands, "_job", lambda job_id: indexed)
    monkeypatch.setattr(person_cancel, "_task_instance_now", lambda job: (ti_now["id"], ti_now["state"]))
    monkeypatch.setattr(person_cancel, "_keep", lambda job, value: store.set(person_cancel.CANCEL_KEY, value))
    capsys.readouterr()
    commands.cancel_job.__wrapped__.__wrapped__(Namespace(job_id=a.job_id, output="json"))  # type: ignore[attr-defined]
    (row,) = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (row["canceled"], row["state"]) == (True, "Canceled"), row
    assert "when it next runs" in row["note"], row
    _wait_for(lambda: not live_local_jobs(a.name), "job A to stop")

    with pytest.raises(AirflowFailException, match=r"ERR_CANCELED.*canceled by cli:"):
        op().execute(context(2, "ti-try-2"))
    jobs_dir = tmp_path / "jobs"
    assert [p.name for p in jobs_dir.iterdir() if not p.name.startswith("_")] == [a.job_id]  # no job B
    assert live_local_jobs(a.name) == set()

    # a clear (a new task instance id): the person asks for the task again, and it runs
    third = _defer(op(), context(3, "ti-cleared"))
    b = JobHandle.from_json(third.trigger.serialize()[1]["handle"])
    assert b.job_id != a.job_id and live_local_jobs(a.name) == {b.job_id}


@pytest.mark.parametrize("ends", ["after_the_routine_looked", "before_the_routine_looked"])
def test_issue_22_a_persons_cancel_is_final_when_the_job_ends_by_itself_inside_its_window(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], ends: str
) -> None:
    """``airflow tao cancel`` on a deferred task's running job, the job exiting 0 on its own while the cancel is on
    its way (the explorer's 1.5 s jobs under load: docker ok ``execute:defer#1``, slurm ok
    ``trigger:aget_job_statuses#2``, cli_cancel). After the routine found it running (it marks ``canceled_by``,
    then stops an ended job): the person is told "canceled", so the task fails ERR_CANCELED -- it took the job's
    result. Before the routine looked (after the CLI's own first look): the job keeps its verdict, the task takes
    its result, and the person is told so -- the CLI said "canceled"."""
    from argparse import Namespace

    from airflow_provider_tao.cli import commands
    from airflow_provider_tao.hooks.base import MARK_CANCELED_BY
    from airflow_provider_tao.jobindex import IndexedJob
    from airflow_provider_tao.records import JobRecord

    store, context = Store(), make_context(Store(), 1)
    context["task_state_store"] = store
    op = _op(deferrable=True)
    handle = JobHandle.from_json(_defer(op, context).trigger.serialize()[1]["handle"])
    job = fake_platform.jobs[handle.job_id]

    def job_exits_0() -> None:
        if not job["state"].is_terminal:
            job.update(state=JobState.COMPLETE, exit=0)

    real_write_mark = FakeHook.write_mark

    def write_mark(self: FakeHook, h: JobHandle, key: str, value: Any) -> None:
        if key == MARK_CANCELED_BY and ends == "after_the_routine_looked":
            job_exits_0()
        real_write_mark(self, h, key, value)

    def record_cancel(
        indexed: IndexedJob, by: str, **_: Any
    ) -> str:  # kept between the CLI's first look and the routine
        if ends == "before_the_routine_looked":
            job_exits_0()
        return "deferred"

    monkeypatch.setattr(FakeHook, "write_mark", write_mark)
    monkeypatch.setattr(canceling, "record_cancel", record_cancel)  # the routine `airflow tao cancel` runs
    indexed = IndexedJob(
        record=JobRecord.from_json(store.data[STATE_KEY]),  # type: ignore[arg-type]
        dag_id="dag", run_id="manual__1", task_id="train", map_index=-1,
        ti_state="deferred", ti_try=1, ti_end=None, current=True,
    )  # fmt: skip
    monkeypatch.setattr(commands, "_job", lambda job_id: indexed)
    capsys.readouterr()
    commands.cancel_job.__wrapped__.__wrapped__(Namespace(job_id=handle.job_id, output="json"))  # type: ignore[attr-defined]
    (row,) = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (row["was"], job["state"]) == ("Running", JobState.COMPLETE), row  # it ended by itself
    event = _event(handle, "complete")  # what the trigger read: exit 0
    if ends == "after_the_routine_looked":
        assert row["canceled"] is True and row["note"] == "its task fails with ERR_CANCELED", row
        with pytest.raises(AirflowFailException, match=r"ERR_CANCELED.*canceled by cli:"):
            op.execute_complete(context, event)
    else:
        assert row["canceled"] is False and row["note"] == "already ended: left as it was", row
        assert op.execute_complete(context, event)["job_id"] == handle.job_id


def test_issue_22_a_persons_cancel_during_the_failure_analysis_is_final(fake_platform: type[FakeHook]) -> None:
    """The trigger read the job failed, but the platform had requeued it (SLURM: the requeue took effect and its
    answer was lost to an SSH drop -- the explorer's slurm flaky ``resume:run#3`` cli_cancel under load); a person
    cancels it while the resuming try analyses the failure. The try fails ERR_CANCELED: it raised the failure for a
    retry, whose new task instance id the CLI's record does not bind, and the retry submitted a new job."""
    store = Store()
    context = make_context(store, 1)
    op = _op(deferrable=True)
    handle = JobHandle.from_json(_defer(op, context).trigger.serialize()[1]["handle"])
    job = fake_platform.jobs[handle.job_id]
    job.update(state=JobState.ERROR, exit=1)
    fake_platform.logs[handle.job_id] = "NCCL WARN net: remote process exited\n"  # a node fault: retriable
    event = _event(handle, "error")  # what the trigger read
    job.update(state=JobState.PENDING)  # requeued behind its back
    real = FakeHook.get_failure_analysis

    def analysis(self: FakeHook, h: JobHandle) -> Any:
        # `airflow tao cancel` lands meanwhile
        assert FakeHook().cancel_job(h, requested_by="cli:jdoe") is CancelOutcome.STOPPED
        return real(self, h)

    FakeHook.get_failure_analysis = analysis  # type: ignore[method-assign]
    try:
        with pytest.raises(AirflowFailException, match=r"ERR_CANCELED.*canceled by cli:jdoe"):
            op.execute_complete(context, event)
    finally:
        FakeHook.get_failure_analysis = real  # type: ignore[method-assign]
    assert len(fake_platform.jobs) == 1 and job["state"] is JobState.CANCELED
