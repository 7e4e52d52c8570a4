"""Issue 37's nine defects -- each an interruption plus a platform call failing inside a decision, or two people acting
in one window -- shown on the in-memory platform (Docker's own reading on the offline Docker hook).

Every test here failed on the code before ``operators/decisions.py``: the defect's number is in its name.
"""

from __future__ import annotations

import asyncio
from typing import Any
from unittest.mock import AsyncMock

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowTaskTimeout

from airflow_provider_tao.hooks.base import MARK_CANCEL, MARK_OWNER
from airflow_provider_tao.hooks.ownership import CancelOutcome
from airflow_provider_tao.jobs import JobHandle, JobSpec, JobState, JobStatus
from airflow_provider_tao.person_cancel import CANCEL_KEY
from airflow_provider_tao.triggers.job import TAOJobTrigger
from tests.unit.fakes import FakeHook, Store, make_context
from tests.unit.test_operator_submit import _defer, _op


def _context(store: Store, try_number: int, ti_id: str) -> dict[str, Any]:
    context = make_context(store, try_number)
    context["ti"].id = ti_id
    return context


def _event(handle: JobHandle, outcome: str) -> dict[str, Any]:
    status = FakeHook().get_job_status(handle)
    return {"status": outcome, "handle": handle.to_json(), "job_status": status.to_json(), "log_cursor": ""}


def _deferred_job(fake: type[FakeHook], store: Store, try_number: int = 1, **op: Any) -> tuple[Any, JobHandle]:
    operator = _op(deferrable=True, **op)
    deferred = _defer(operator, _context(store, try_number, f"ti-{try_number}"))
    return operator, JobHandle.from_json(deferred.trigger.serialize()[1]["handle"])


def _fails_once(monkeypatch: pytest.MonkeyPatch, method: str, error: Exception) -> None:
    """``FakeHook.<method>`` raises ``error`` the first time it is called (a blip), then works."""
    real = getattr(FakeHook, method)
    left = {"n": 1}

    def blip(self: FakeHook, *args: Any, **kwargs: Any) -> Any:
        if left["n"]:
            left["n"] -= 1
            raise error
        return real(self, *args, **kwargs)

    monkeypatch.setattr(FakeHook, method, blip)


def test_defect_1_a_platform_blip_at_resume_does_not_undo_a_persons_cancel(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`airflow tao cancel` records the waiting try's task-instance id and marks the job; at resume the mark read
    fails (an SSH reset): the task goes up for retry with a new task-instance id -- and the cancel still binds it."""
    store = Store()
    op, handle = _deferred_job(fake_platform, store)
    store.set(CANCEL_KEY, {"ti_id": "ti-1", "by": "cli:jdoe", "at": 0, "job": handle.to_json()})
    assert FakeHook().cancel_job(handle, requested_by="cli:jdoe") is CancelOutcome.STOPPED
    _fails_once(monkeypatch, "read_marks", ConnectionError("SSH session reset"))

    with pytest.raises(Exception) as first:
        op.execute_complete(_context(store, 1, "ti-1"), _event(handle, "canceled"))
    if not isinstance(first.value, AirflowFailException):  # retried: the retry is a new task instance id
        with pytest.raises(AirflowFailException, match=r"ERR_CANCELED.*cli:jdoe"):
            _op(deferrable=True).execute(_context(store, 2, "ti-2"))
    assert len(fake_platform.jobs) == 1, "the person's cancel was undone: a new job was submitted"


def test_defect_2_an_old_canceled_by_mark_does_not_fail_a_cleared_try_that_adopted_the_job(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reaper marks try 1's job (its stop fails: the job runs on); a person clears the task; try 2 adopts the
    job, which completes: try 2 succeeds with it."""
    store = Store()
    _, handle = _deferred_job(fake_platform, store)
    real_cancel = FakeHook._cancel
    monkeypatch.setattr(FakeHook, "_cancel", lambda self, h: (_ for _ in ()).throw(ConnectionError("stop failed")))
    with pytest.raises(ConnectionError):
        FakeHook().cancel_job(handle, requested_by="reap: orphan")
    monkeypatch.setattr(FakeHook, "_cancel", real_cancel)
    assert fake_platform.jobs[handle.job_id]["state"] is JobState.RUNNING  # Docker's stop grace, SLURM COMPLETING

    op = _op(deferrable=True)
    deferred = _defer(op, _context(store, 2, "ti-cleared"))
    adopted = JobHandle.from_json(deferred.trigger.serialize()[1]["handle"])
    assert adopted.job_id == handle.job_id and adopted.try_number == 2
    fake_platform.jobs[handle.job_id].update(state=JobState.COMPLETE, exit=0)

    result = op.execute_complete(_context(store, 2, "ti-cleared"), _event(adopted, "complete"))
    assert result["job_id"] == handle.job_id and result["state"] == "Complete"


def test_defect_3_a_failing_cleanup_never_replaces_a_success(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Docker's cleanup with auto_remove asks the daemon for the status: a blip there replaced the successful
    return, and the retry found the result consumed and ran the job again."""
    store = Store()
    op, handle = _deferred_job(fake_platform, store)
    fake_platform.jobs[handle.job_id].update(state=JobState.COMPLETE, exit=0)

    def cleanup_job(self: FakeHook, h: JobHandle, *, adoptable: bool = False) -> None:
        raise ConnectionError("daemon blip")

    monkeypatch.setattr(FakeHook, "cleanup_job", cleanup_job)
    result = op.execute_complete(_context(store, 1, "ti-1"), _event(handle, "complete"))
    assert result["job_id"] == handle.job_id


def test_defect_3_a_failing_cleanup_never_replaces_the_result_of_a_reattach(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store()
    _, handle = _deferred_job(fake_platform, store)
    fake_platform.jobs[handle.job_id].update(state=JobState.COMPLETE, exit=0)
    monkeypatch.setattr(FakeHook, "cleanup_job", lambda self, h, adoptable=False: 1 / 0)
    assert _op(deferrable=True).execute(_context(store, 2, "ti-2"))["job_id"] == handle.job_id


def _cleanups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    cleaned: list[str] = []
    monkeypatch.setattr(FakeHook, "cleanup_job", lambda self, h, adoptable=False: cleaned.append(h.job_id))
    return cleaned


def test_defect_5_a_timeout_with_cancel_on_kill_false_leaves_the_running_job_its_secrets(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store()
    op, handle = _deferred_job(fake_platform, store, cancel_on_kill=False)
    cleaned = _cleanups(monkeypatch)
    with pytest.raises(AirflowTaskTimeout, match="ERR_TIMEOUT"):
        op.execute_complete(_context(store, 1, "ti-1"), _event(handle, "timeout"))
    assert fake_platform.jobs[handle.job_id]["state"] is JobState.RUNNING
    assert cleaned == [], "cleanup stripped a running job (SLURM's env file, Lepton's secrets)"


def test_defect_5_a_failure_whose_job_was_requeued_meanwhile_keeps_its_secrets(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trigger read Error; the platform requeued the job (its answer lost): the job runs again, the retry adopts
    it -- cleanup must not strip it."""
    store = Store()
    op, handle = _deferred_job(fake_platform, store)
    fake_platform.jobs[handle.job_id].update(state=JobState.ERROR, exit=1)
    fake_platform.logs[handle.job_id] = "NCCL WARN net: remote process exited\n"
    event = _event(handle, "error")
    fake_platform.jobs[handle.job_id].update(state=JobState.RUNNING, exit=None)
    cleaned = _cleanups(monkeypatch)
    with pytest.raises(AirflowException):
        op.execute_complete(_context(store, 1, "ti-1"), event)
    assert cleaned == []


async def test_defect_6_a_trigger_on_kill_after_a_clear_keeps_a_completed_job_adoptable(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cleared task instance's state is None (not in WANTED_TI_STATES): the job that completed just before the
    clear was cleaned up as if the task were over, and the new try ran the training again."""
    cleaned: list[bool] = []
    monkeypatch.setattr(FakeHook, "cleanup_job", lambda self, h, adoptable=False: cleaned.append(adoptable))
    spec = JobSpec(name="job-d6", job_id="d6d6d6d6d6d6", command="x", image="i")
    handle = FakeHook(conn_id="fake_conn").create_job(spec, try_number=1)
    fake_platform.jobs[handle.job_id].update(state=JobState.COMPLETE, exit=0)
    trigger = TAOJobTrigger(handle=handle.to_json(), poll_interval=0.02)
    monkeypatch.setattr(trigger, "_task_state", AsyncMock(return_value=None))  # cleared
    await trigger.on_kill()
    assert cleaned == [True]


async def test_defect_8_lost_resubmit_answers_count_in_a_row_not_over_the_jobs_life(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each of three separate failures is requeued, each requeue's answer lost: every one of them happened, so the
    trigger watches on (the job then completes) instead of reporting the third as the job's failure."""
    from airflow_provider_tao.triggers.job import RESUBMIT_ASKS

    spec = JobSpec(name="job-d8", job_id="d8d8d8d8d8d8", command="x", image="i")
    handle = FakeHook(conn_id="fake_conn").create_job(spec, try_number=1)
    job = fake_platform.jobs[handle.job_id]
    job["state"] = JobState.ERROR
    failures = {"left": RESUBMIT_ASKS + 1}
    loop = asyncio.get_running_loop()

    async def fail_again_later() -> None:
        await asyncio.sleep(0.1)
        if failures["left"] > 0:
            job["state"] = JobState.ERROR
        else:
            job["state"] = JobState.COMPLETE

    def requeued_answer_lost(self: FakeHook, h: JobHandle, status: JobStatus) -> str | None:
        failures["left"] -= 1
        job["state"] = JobState.RUNNING  # the requeue happened
        asyncio.run_coroutine_threadsafe(fail_again_later(), loop)
        raise ConnectionError("Session request failed")

    monkeypatch.setattr(FakeHook, "resubmit_if_retriable", requeued_answer_lost)
    trigger = TAOJobTrigger(handle=handle.to_json(), poll_interval=0.02, stream_logs=False)
    event = await asyncio.wait_for(trigger.run().__anext__(), 20)
    assert event.payload["status"] == "complete"


def test_defect_9_an_old_trys_cancel_mark_does_not_turn_a_later_exit_0_into_canceled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Try 1's on_kill wrote its cancel mark and its `docker stop` failed; try 2 claimed the job; the job exits 0."""
    from tests.unit.test_hooks_docker import _hook

    hook = _hook(monkeypatch)
    client = type(
        "Client", (), {"inspect_container": lambda self, name: {"State": {"Status": "exited", "ExitCode": 0}}}
    )
    hook.__dict__["client"] = client()
    monkeypatch.setattr(hook, "read_marks_of", lambda name: {MARK_OWNER: 2, MARK_CANCEL: 1})
    status = hook._final_status("tao-job-abc")
    assert status.state is JobState.COMPLETE, status


def test_defect_7_an_exited_auto_remove_container_of_a_task_that_is_over_is_swept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Marked in the resume window, the worker killed in execute_complete with no retries: nobody removes the
    exited container (and its /tao-job/secret.env) -- the sweeper does, once its task is over; never while a try
    may still read its verdict."""
    from airflow_provider_tao.hooks.shared import container as ct
    from tests.unit.test_hooks_docker import _hook

    hook = _hook(monkeypatch, auto_remove=True)

    def container(state: str, task: str) -> dict[str, Any]:  # the task's state rides in its run id, for the lookup
        origin = {"dag_id": "dag", "task_id": "train", "run_id": task, "map_index": "-1"}
        labels = {ct.ORIGIN_LABELS[key]: value for key, value in origin.items()}
        return {"Id": f"{state}-{task}", "Names": [f"/tao-job-{state}-{task}"], "State": state, "Labels": labels}

    containers = [container(s, t) for s in ("exited", "running") for t in ("failed", "up_for_retry", "")]
    removed: list[str] = []
    monkeypatch.setattr(hook, "_list", lambda *labels: containers)
    monkeypatch.setattr(hook, "_remove", removed.append)
    rows = hook.reap_resources(lambda origin: origin["run_id"] or None, dry_run=False)
    assert removed == ["exited-failed"], rows


@pytest.mark.parametrize(("platform", "variable"), [("lepton", "NGC_KEY"), ("lepton", "HF_TOKEN"), ("brev", "NGC_KEY")])
async def test_defect_4_secrets_from_the_environment_are_masked_when_conn_id_is_none(
    monkeypatch: pytest.MonkeyPatch, platform: str, variable: str
) -> None:
    """A job submitted with ``conn_id=None`` gets its keys from the environment fallbacks: the trigger, a resumed
    worker and ``airflow tao logs`` mask them too (there is no connection to find them through)."""
    from airflow_provider_tao.received_secrets import job_secrets

    monkeypatch.setenv(variable, "env-secret-value-789")
    masked: list[str] = []

    async def amask(value: Any, name: Any = None) -> None:
        masked.append(value)

    monkeypatch.setattr("airflow.sdk.log.amask_secret", amask)
    trigger = TAOJobTrigger(handle=JobHandle(platform, None, "j", "n").to_json(), secret_conn_ids=[])
    await trigger._mask_secrets()
    assert "env-secret-value-789" in masked
    assert "env-secret-value-789" in job_secrets([], None, platform)


async def test_a_trigger_on_kill_asks_the_task_state_again_before_it_decides(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task state that could not be read never decides a kill: asked again, the task is still deferred (its trigger
    moved), so the job runs on."""
    from unittest.mock import MagicMock

    from airflow_provider_tao.operators.decisions import UNKNOWN
    from airflow_provider_tao.triggers import job as trigger_job

    monkeypatch.setattr(trigger_job, "TASK_STATE_PAUSE", 0.0)
    spec = JobSpec(name="job-ks", job_id="ksksksksksks", command="x", image="i")
    handle = FakeHook(conn_id="fake_conn").create_job(spec, try_number=1)
    trigger = TAOJobTrigger(handle=handle.to_json(), poll_interval=0.02)
    trigger.task_instance = MagicMock()
    asked = AsyncMock(side_effect=[UNKNOWN, "deferred"])
    monkeypatch.setattr(trigger, "_task_state", asked)
    await trigger.on_kill()
    assert asked.await_count == 2 and fake_platform.jobs[handle.job_id]["state"] is JobState.RUNNING
