"""TAOJobTrigger and its per-connection StatusPoller, driven on the in-memory platform."""

from __future__ import annotations

import asyncio
import collections
import gc
import re
import time
import uuid
from typing import Any
from unittest.mock import AsyncMock

import pytest

from airflow_provider_tao.jobs import JobHandle, JobSpec, JobState, JobStatus
from airflow_provider_tao.operators.submit import TAOSubmitOperator
from airflow_provider_tao.triggers.job import TAOJobTrigger
from airflow_provider_tao.triggers.poller import StatusPoller
from tests.unit.fakes import FakeHook


def _submit(fake: type[FakeHook], try_number: int = 1, conn_id: str | None = "fake_conn") -> JobHandle:
    job_id = uuid.uuid4().hex[:12]
    spec = JobSpec(name=f"job-{job_id}", job_id=job_id, command="x", image="i")
    return FakeHook(conn_id=conn_id).create_job(spec, try_number=try_number)


def _trigger(handle: JobHandle, **kwargs: Any) -> TAOJobTrigger:
    return TAOJobTrigger(handle=handle.to_json(), poll_interval=kwargs.pop("poll_interval", 0.02), **kwargs)


async def _first_event(trigger: TAOJobTrigger, timeout: float = 10) -> dict[str, Any]:
    event = await asyncio.wait_for(trigger.run().__anext__(), timeout)
    return event.payload


async def test_emits_complete_and_streams_log_lines(
    fake_platform: type[FakeHook], capsys: pytest.CaptureFixture[str]
) -> None:
    handle = _submit(fake_platform)
    fake_platform.logs[handle.job_id] = "Epoch 1/2\nEpoch 2/2\npartial"

    async def finish() -> None:
        await asyncio.sleep(0.1)
        fake_platform.jobs[handle.job_id]["state"] = JobState.COMPLETE

    asyncio.get_running_loop().create_task(finish())
    payload = await _first_event(_trigger(handle))

    assert payload["status"] == "complete"
    assert payload["handle"] == handle.to_json()
    assert payload["job_status"]["state"] == "Complete"
    assert payload["log_cursor"] == str(len("Epoch 1/2\nEpoch 2/2\npartial"))
    out = capsys.readouterr().out
    assert "[job] Epoch 1/2" in out and "[job] Epoch 2/2" in out and "[job] partial" in out
    assert out.count("[job] Epoch 1/2") == 1


@pytest.mark.parametrize(("state", "outcome"), [(JobState.ERROR, "error"), (JobState.CANCELED, "canceled")])
async def test_terminal_states_map_to_outcomes(fake_platform: type[FakeHook], state: JobState, outcome: str) -> None:
    handle = _submit(fake_platform)
    fake_platform.jobs[handle.job_id]["state"] = state
    assert (await _first_event(_trigger(handle)))["status"] == outcome


async def test_retriable_failure_is_resubmitted_by_the_trigger_and_watched_on(
    fake_platform: type[FakeHook], capsys: pytest.CaptureFixture[str]
) -> None:
    handle = _submit(fake_platform)
    fake_platform.jobs[handle.job_id]["state"] = JobState.ERROR
    fake_platform.resubmit_budget = 1

    async def finish() -> None:
        # The rerun ends once it is running (the resubmit happened), whatever the machine's speed: ending it on a
        # clock let a slow resubmit land after the end and leave the job running for good.
        while fake_platform.resubmit_budget or fake_platform.jobs[handle.job_id]["state"] is not JobState.RUNNING:
            await asyncio.sleep(0.01)
        fake_platform.jobs[handle.job_id]["state"] = JobState.COMPLETE

    asyncio.get_running_loop().create_task(finish())
    assert (await _first_event(_trigger(handle)))["status"] == "complete"
    assert "infrastructure failure: resubmitted" in capsys.readouterr().out


@pytest.mark.parametrize("requeued", [True, False], ids=["the-rerun-started", "it-stays-failed"])
async def test_a_resubmission_whose_answer_is_lost_is_read_again_not_reported_as_the_failure(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, requeued: bool
) -> None:
    """The requeue ran but its answer was lost (an SSH session dropped under load, issue 22's explorer): reporting
    the failure would leave the rerun unwatched -- a task marked failed, or out of retries, with its job running. The
    trigger reads the job again and asks again while it is still failed, ``RESUBMIT_ASKS`` times."""
    from airflow_provider_tao.triggers.job import RESUBMIT_ASKS

    handle = _submit(fake_platform)
    job = fake_platform.jobs[handle.job_id]
    job["state"] = JobState.ERROR
    asked = []

    def lost(self: FakeHook, handle: JobHandle, status: JobStatus) -> str | None:
        asked.append(status.state)
        if requeued:
            job["state"] = JobState.RUNNING  # it happened; only its answer is gone
            asyncio.run_coroutine_threadsafe(_finish(), loop)
        raise ConnectionError("command failed on the login node: Session request failed")

    async def _finish() -> None:
        await asyncio.sleep(0.1)
        job["state"] = JobState.COMPLETE

    loop = asyncio.get_running_loop()
    monkeypatch.setattr(FakeHook, "resubmit_if_retriable", lost)
    payload = await _first_event(_trigger(handle))
    assert payload["status"] == ("complete" if requeued else "error")
    assert len(asked) == (1 if requeued else RESUBMIT_ASKS)


async def test_many_triggers_share_one_status_call_per_interval(fake_platform: type[FakeHook]) -> None:
    handles = [_submit(fake_platform) for _ in range(50)]
    tasks = [asyncio.ensure_future(_first_event(_trigger(h, poll_interval=0.05, stream_logs=False))) for h in handles]
    await asyncio.sleep(0.5)
    for h in handles:
        fake_platform.jobs[h.job_id]["state"] = JobState.COMPLETE
    payloads = await asyncio.gather(*tasks)

    assert {p["status"] for p in payloads} == {"complete"}
    calls = fake_platform.status_calls
    # ~10 intervals passed: a per-job poller would have made ~500 calls.
    assert len(calls) <= 20
    assert max(len(c) for c in calls) == 50
    assert StatusPoller._instances == {}  # the poller stops with its last watcher


async def test_connections_are_polled_separately(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_OTHER_CONN", '{"conn_type": "tao_fake"}')
    a, b = _submit(fake_platform, conn_id="fake_conn"), _submit(fake_platform, conn_id="other_conn")
    for h in (a, b):
        fake_platform.jobs[h.job_id]["state"] = JobState.COMPLETE
    # a long interval: only each new job's immediate poll happens, however slow the machine is
    await asyncio.gather(_first_event(_trigger(a, poll_interval=60)), _first_event(_trigger(b, poll_interval=60)))
    assert sorted(fake_platform.status_calls) == sorted([[a.job_id], [b.job_id]])


@pytest.mark.parametrize("cancel_on_kill", [True, False])
async def test_deadline_emits_timeout_and_stops_the_job_at_once(
    fake_platform: type[FakeHook], cancel_on_kill: bool
) -> None:
    """The job is canceled as the deadline passes (pair explorer: a task marked failed between the timeout event and
    its resume has no worker to cancel it), unless ``cancel_on_kill=False`` leaves it running."""
    handle = _submit(fake_platform)
    # an interval of an hour: the event within the wait's bound means the deadline did not wait for the next poll
    trigger = _trigger(handle, deadline=time.time() + 0.3, poll_interval=3600, cancel_on_kill=cancel_on_kill)
    payload = await _first_event(trigger, timeout=120)
    assert payload["status"] == "timeout"
    # the new job's immediate poll only, and the cancel routine's own read of the job
    assert len(fake_platform.status_calls) == 1 + cancel_on_kill
    expected = JobState.CANCELED if cancel_on_kill else JobState.RUNNING
    assert fake_platform.jobs[handle.job_id]["state"] is expected


async def test_a_long_outage_never_ends_the_wait(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Defect 3: Unknown is never an outcome; the trigger reports the outage and waits for the job's verdict."""
    real = FakeHook.get_job_statuses
    down = {"until": time.monotonic() + 1.5}

    def outage(self: FakeHook, handles: Any) -> Any:
        if time.monotonic() < down["until"]:
            raise ConnectionError("sshd is down")
        return real(self, handles)

    monkeypatch.setattr(FakeHook, "get_job_statuses", outage)
    monkeypatch.setattr("airflow_provider_tao.triggers.poller.MAX_BACKOFF_SECONDS", 0.1)
    monkeypatch.setenv("AIRFLOW__TAO__OUTAGE_REPORT_SECONDS", "0.5")
    handle = _submit(fake_platform)
    fake_platform.jobs[handle.job_id]["state"] = JobState.COMPLETE
    payload = await _first_event(_trigger(handle, poll_interval=0.05))
    assert payload["status"] == "complete"
    text = capsys.readouterr().out
    assert "does not answer (status call failed: sshd is down)" in text
    assert "has not answered for" in text and "answers again after" in text


async def test_a_job_the_platform_no_longer_knows_ends_as_error(fake_platform: type[FakeHook]) -> None:
    handle = _submit(fake_platform)
    del fake_platform.jobs[handle.job_id]
    payload = await _first_event(_trigger(handle, poll_interval=0.05))
    assert payload["status"] == "error"
    assert "no longer exists" in payload["message"]


async def test_short_unknown_stretch_is_ridden_out(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FakeHook, "get_job_statuses", _failing_first(FakeHook.get_job_statuses, 2, "blip"))
    monkeypatch.setattr("airflow_provider_tao.triggers.poller.MAX_BACKOFF_SECONDS", 0.05)
    handle = _submit(fake_platform)
    fake_platform.jobs[handle.job_id]["state"] = JobState.COMPLETE
    assert (await _first_event(_trigger(handle)))["status"] == "complete"


async def test_an_ended_job_is_reported_no_sooner_than_the_hold_after_the_trigger_started(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airflow 3.2-3.3's scheduler fails a task whose trigger fires while the executor's report of the deferral is on
    its way (apache/airflow#67287): a job that has ended already is reported only after the hold."""
    handle = _submit(fake_platform)
    fake_platform.jobs[handle.job_id]["state"] = JobState.COMPLETE
    monkeypatch.setenv("AIRFLOW__TAO__TRIGGER_EVENT_HOLD_SECONDS", "0.6")
    started = time.monotonic()
    assert (await _first_event(_trigger(handle, poll_interval=0.01)))["status"] == "complete"
    assert time.monotonic() - started >= 0.6  # a lower bound: load only lengthens it


async def test_airflow_dags_test_reports_an_ended_job_without_the_hold(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`airflow dags test` runs the trigger inline, with an in-process stand-in for the supervisor: no scheduler races
    its event, so the hold is not waited (a new user's first deferrable run is not 10 s slower for nothing)."""
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.supervisor import InProcessSupervisorComms

    handle = _submit(fake_platform)
    fake_platform.jobs[handle.job_id]["state"] = JobState.COMPLETE
    # a hold of an hour: the event within the wait's bound means the hold was not waited
    monkeypatch.setenv("AIRFLOW__TAO__TRIGGER_EVENT_HOLD_SECONDS", "3600")
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", object.__new__(InProcessSupervisorComms), raising=False)
    assert (await _first_event(_trigger(handle, poll_interval=0.01), timeout=120))["status"] == "complete"


async def test_log_lines_whose_cursor_is_stored_are_written_even_when_a_kill_lands_in_between(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trigger canceled (killed, or moved to another triggerer) while it stores its log cursor: the lines up to
    that cursor are in the task log, else the next trigger starts after lines nobody wrote (found by the e2e test of
    a trigger moving from a frozen triggerer)."""
    handle = _submit(fake_platform)
    FakeHook.logs[handle.job_id] = "tick 1\ntick 2\n"
    stored: list[str] = []

    async def slow_store(self: TAOJobTrigger, cursor: str) -> None:
        await asyncio.sleep(0.3)  # the XCom write through the triggerer's supervisor
        stored.append(cursor)

    monkeypatch.setattr(TAOJobTrigger, "_store_cursor", slow_store)
    trigger = _trigger(handle)
    streaming = asyncio.ensure_future(trigger._stream_logs(FakeHook()))
    await asyncio.sleep(0.05)
    streaming.cancel()
    with pytest.raises(asyncio.CancelledError):
        await streaming
    await asyncio.sleep(0.4)
    assert stored == ["14"]  # the store went through
    out = capsys.readouterr().out
    assert "[job] tick 1" in out and "[job] tick 2" in out


async def test_on_kill_cancels_the_owned_job_and_cleans_up_after_it(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    cleaned: list[tuple[str, bool]] = []

    def cleanup_job(self: FakeHook, handle: JobHandle, *, adoptable: bool = False) -> None:
        cleaned.append((handle.job_id, adoptable))

    monkeypatch.setattr(FakeHook, "cleanup_job", cleanup_job)
    handle = _submit(fake_platform)
    await _trigger(handle).on_kill()
    assert fake_platform.jobs[handle.job_id]["state"] is JobState.CANCELED
    assert FakeHook().cancel_requested_by(handle) == 1
    # the task will not resume to clean up: the kill does, as on the worker -- the task's state unknown, a next try
    # may still come: what it needs to adopt a completed job is kept (the sweeper removes it; issue 37)
    assert cleaned == [(handle.job_id, True)]
    ended = _submit(fake_platform)
    fake_platform.jobs[ended.job_id]["state"] = JobState.COMPLETE  # it ended just before the kill
    await _trigger(ended).on_kill()
    assert fake_platform.jobs[ended.job_id]["state"] is JobState.COMPLETE and cleaned[-1] == (ended.job_id, True)
    # marked failed: the task is over, all goes; cleared: its next try may adopt a job that completed meanwhile
    for state, adoptable in (("failed", False), ("success", False), ("scheduled", True), ("up_for_retry", True)):
        trigger = _trigger(_submit(fake_platform))
        monkeypatch.setattr(trigger, "_task_state", AsyncMock(return_value=state))
        await trigger.on_kill()
        assert cleaned[-1] == (trigger.handle.job_id, adoptable), state


async def test_on_kill_finishes_its_cancel_through_the_triggerers_repeated_cancels(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airflow's triggerer cancels a trigger again at every state sync until it has finished, and those cancels
    land in on_kill: a cancel of several remote round trips (SLURM over SSH) must still finish."""
    real_cancel = FakeHook._acancel

    async def slow_cancel(self: FakeHook, handle: JobHandle) -> bool:
        await asyncio.sleep(0.5)  # a few round trips to the login node
        return await real_cancel(self, handle)

    monkeypatch.setattr(FakeHook, "_acancel", slow_cancel)
    handle = _submit(fake_platform)
    kill = asyncio.ensure_future(_trigger(handle).on_kill())
    for _ in range(8):  # what the triggerer does while on_kill runs, once a sync
        await asyncio.sleep(0.05)
        kill.cancel("__airflow_user_action__")
    await kill
    assert fake_platform.jobs[handle.job_id]["state"] is JobState.CANCELED


async def test_on_kill_whose_cancel_finishes_as_a_repeated_cancel_comes_returns(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repeated cancel that lands as the job's cancel finishes (a slow triggerer: the CI's Python 3.12 run) is
    the same kill: on_kill has done its work and returns, it does not raise the triggerer's cancel."""
    from airflow_provider_tao.triggers import job as job_trigger

    gate = asyncio.Event()
    real_cancel = FakeHook._acancel

    async def gated_cancel(self: FakeHook, handle: JobHandle) -> bool:
        await gate.wait()
        return await real_cancel(self, handle)

    monkeypatch.setattr(FakeHook, "_acancel", gated_cancel)
    handle = _submit(fake_platform)
    kill = asyncio.ensure_future(_trigger(handle).on_kill())
    while not job_trigger._CANCELS:  # on_kill has started the cancel and waits on it
        await asyncio.sleep(0)
    (cancel,) = job_trigger._CANCELS
    cancel.add_done_callback(lambda _: kill.cancel("__airflow_user_action__"))  # lands as the cancel finishes
    gate.set()
    await kill
    assert fake_platform.jobs[handle.job_id]["state"] is JobState.CANCELED


@pytest.mark.parametrize(("state", "canceled"), [("deferred", False), ("failed", True), ("success", True),
                                                  (None, True), ("unreadable", True)])  # fmt: skip
async def test_on_kill_of_a_trigger_that_moved_to_another_triggerer_leaves_the_job_running(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, state: str | None, canceled: bool
) -> None:
    """Airflow 3.3 calls on_kill when a trigger moves between triggerers too: the task, still deferred, waits on the
    job there -- canceling it cost a resubmission (found by the fault matrix with two triggerers)."""
    from types import SimpleNamespace

    from airflow.sdk.execution_time import task_runner

    asked: list[Any] = []

    class Supervisor:
        async def asend(self, msg: Any) -> Any:
            asked.append(msg)
            if state == "unreadable":
                raise RuntimeError("no supervisor")
            return SimpleNamespace(task_states={"r1": {"train": state}})

    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", Supervisor(), raising=False)
    handle = _submit(fake_platform)
    trigger = _trigger(handle)
    trigger.task_instance = SimpleNamespace(dag_id="d", task_id="train", run_id="r1", map_index=-1)
    await trigger.on_kill()
    assert (fake_platform.jobs[handle.job_id]["state"] is JobState.CANCELED) is canceled
    assert (asked[0].dag_id, asked[0].task_ids, asked[0].run_ids) == ("d", ["train"], ["r1"])


async def test_on_kill_of_an_older_try_leaves_a_taken_over_job(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    cleaned: list[str] = []
    monkeypatch.setattr(FakeHook, "cleanup_job", lambda self, handle: cleaned.append(handle.job_id))
    handle = _submit(fake_platform, try_number=1)
    FakeHook().claim_job(handle.owned_by(2))
    await _trigger(handle).on_kill()
    assert fake_platform.jobs[handle.job_id]["state"] is JobState.RUNNING and cleaned == []


async def test_on_kill_respects_cancel_on_kill_false(fake_platform: type[FakeHook]) -> None:
    handle = _submit(fake_platform)
    await _trigger(handle, cancel_on_kill=False).on_kill()
    assert fake_platform.jobs[handle.job_id]["state"] is JobState.RUNNING


async def test_cancelling_the_trigger_task_propagates_and_releases_the_poller(fake_platform: type[FakeHook]) -> None:
    handle = _submit(fake_platform)
    task = asyncio.ensure_future(_first_event(_trigger(handle)))
    while not any(poller.watches for poller in StatusPoller._instances.values()):  # the trigger watches its job
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert StatusPoller._instances == {}


def test_serialize_round_trip(fake_platform: type[FakeHook]) -> None:
    handle = _submit(fake_platform)
    trigger = _trigger(handle, deadline=123.5, log_cursor="7", stream_logs=False, cancel_on_kill=False)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_tao.triggers.job.TAOJobTrigger"
    assert TAOJobTrigger(**kwargs).serialize() == (classpath, kwargs)


async def test_issue_22_hole_7_a_failing_cancel_in_on_kill_is_asked_again_until_it_takes(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The platform fails the first cancels of a killed task's job (an outage): on_kill asks again instead of
    abandoning the job to the next sweep."""
    flaky = _failing_first(FakeHook._cancel, 2, "platform unreachable")
    monkeypatch.setattr(FakeHook, "_cancel", flaky)
    monkeypatch.setattr("airflow_provider_tao.triggers.job.CANCEL_RETRY_PAUSE", 0.01)
    handle = _submit(fake_platform)
    await _trigger(handle).on_kill()
    assert flaky.failures == 2
    assert fake_platform.jobs[handle.job_id]["state"] is JobState.CANCELED


def _failing_first(real: Any, times: int, error: str) -> Any:
    """``real`` (a hook method) raising ``ConnectionError(error)`` the first ``times`` calls (an outage)."""

    def flaky(self: FakeHook, *args: Any) -> Any:
        if flaky.failures < times:
            flaky.failures += 1
            raise ConnectionError(error)
        return real(self, *args)

    flaky.failures = 0  # type: ignore[attr-defined]
    return flaky


async def test_a_log_budget_bounds_each_poll_and_every_line_arrives_once_in_order(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """50 watched jobs on a connection without a batched log read, [tao] log_reads_per_interval = 5: no poll interval
    makes more than 5 log reads; quiet jobs are read less often than printing ones; all jobs end at once: the ends
    are reported at once, each job's log -- a quiet job's burst at its end many reads long included -- reaches the
    task log in full, in order, each line once (what the budget left is copied by the resuming operator)."""
    monkeypatch.setenv("AIRFLOW__TAO__LOG_READS_PER_INTERVAL", "5")
    fake_platform.log_read_limit = 100  # bytes: a burst of 10 lines takes 3 reads
    handles = [_submit(fake_platform) for _ in range(50)]
    chatty, quiet, bursting = handles[:5], handles[5:45], handles[45:]
    logs = fake_platform.logs

    def emit(handle: JobHandle, lines: int) -> None:
        for _ in range(lines):
            text = logs.get(handle.job_id, "")
            logs[handle.job_id] = text + f"{handle.job_id} line {text.count(chr(10)):03}\n"

    tasks = [asyncio.ensure_future(_first_event(_trigger(h, poll_interval=0.05), timeout=600)) for h in handles]

    async def chatter_for_30_polls() -> None:
        # counted in polls, not seconds: a loaded machine makes fewer polls per second
        seen = 0
        while seen < 30:
            await asyncio.sleep(0.01)
            if len(fake_platform.status_calls) > seen:
                seen = len(fake_platform.status_calls)
                for h in chatty:
                    emit(h, 1)

    await asyncio.wait_for(chatter_for_30_polls(), 300)
    for h in quiet:
        emit(h, 1)
    for h in bursting:
        emit(h, 10)
    ended_at = len(fake_platform.status_calls)
    for h in handles:
        fake_platform.jobs[h.job_id]["state"] = JobState.COMPLETE
    payloads = await asyncio.wait_for(asyncio.gather(*tasks), 120)
    assert {p["status"] for p in payloads} == {"complete"}
    assert len(fake_platform.status_calls) - ended_at <= 2  # no end waited for its log

    reads_per_poll = collections.Counter(poll for poll, _ in fake_platform.log_reads)
    assert max(reads_per_poll.values()) <= 5
    live = collections.Counter(job for poll, job in fake_platform.log_reads if poll < ended_at)
    assert min(live[h.job_id] for h in chatty) > max(live[h.job_id] for h in quiet + bursting)
    handed_over = [p for p in payloads if not p["log_complete"]]
    assert handed_over  # 50 ends in one interval of 5 reads
    for payload in handed_over:
        handle = JobHandle.from_json(payload["handle"])
        TAOSubmitOperator(task_id="t", conn_id="fake_conn", image="i", command="x")._copy_rest_of_log(
            FakeHook(conn_id="fake_conn"), handle, payload["log_cursor"]
        )
    out = capsys.readouterr().out
    for h in handles:
        shown = re.findall(rf"\[job\] ({h.job_id} line \d+)", out)
        assert shown == logs[h.job_id].splitlines(), h.job_id


async def test_triggers_started_one_per_loop_turn_share_one_connection_load_and_one_early_poll(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted triggerer starts its triggers one per turn of its loop (TriggerRunner.create_triggers): they
    share one connection load and, before the interval's next poll, one early poll -- not one each."""
    from airflow_provider_tao.triggers import poller

    loads = []
    real = poller.get_platform_hook
    monkeypatch.setattr(poller, "get_platform_hook", lambda *args: loads.append(args) or real(*args))
    handles = [_submit(fake_platform) for _ in range(50)]
    tasks = []
    for h in handles:
        tasks.append(asyncio.ensure_future(_first_event(_trigger(h, poll_interval=30))))
        await asyncio.sleep(0)
    await asyncio.sleep(1.5)  # past NEW_JOB_POLL_GAP
    assert len(loads) == 1
    assert len(fake_platform.status_calls) <= 2 and len(fake_platform.status_calls[-1]) == 50
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_quiet_job_costs_no_log_read_where_the_status_call_sees_which_logs_grew(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a platform whose status call sees which watched logs grew since their last read (SLURM, Brev, local:
    ``log_news``), a job whose log did not grow costs its trigger no read at that poll; a printing job is read at
    every poll, and every line still reaches the task log once and in order."""
    read_to: dict[str, int] = {}
    real_statuses, real_logs = FakeHook.get_job_statuses, FakeHook.get_job_logs

    def statuses(self: FakeHook, handles: list[JobHandle]) -> dict[str, Any]:
        answer = real_statuses(self, handles)
        sizes = {h.job_id: len(self.logs.get(h.job_id, "").encode()) for h in handles}
        self._quiet_logs = frozenset(job for job, size in sizes.items() if read_to.get(job) == size)
        return answer

    def logs(self: FakeHook, handle: JobHandle, cursor: str = "", tail: int | None = None) -> tuple[str, str]:
        text, new = real_logs(self, handle, cursor, tail)
        read_to[handle.job_id] = int(new)
        return text, new

    monkeypatch.setattr(FakeHook, "log_reads_batched", True)
    monkeypatch.setattr(FakeHook, "get_job_statuses", statuses)
    monkeypatch.setattr(FakeHook, "get_job_logs", logs)
    handles = [_submit(fake_platform) for _ in range(20)]
    chatty, quiet = handles[:2], handles[2:]

    def emit(handle: JobHandle) -> None:
        text = fake_platform.logs.get(handle.job_id, "")
        fake_platform.logs[handle.job_id] = text + f"{handle.job_id} line {text.count(chr(10)):03}\n"

    tasks = [asyncio.ensure_future(_first_event(_trigger(h, poll_interval=0.05), timeout=60)) for h in handles]
    for step in range(30):
        await asyncio.sleep(0.05)
        for h in chatty + (quiet if step == 15 else []):
            emit(h)
    polls = len(fake_platform.status_calls)
    for h in handles:
        fake_platform.jobs[h.job_id]["state"] = JobState.COMPLETE
    payloads = await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert all(p["log_complete"] for p in payloads)

    live = collections.Counter(job for poll, job in fake_platform.log_reads if poll < polls)
    assert polls >= 15
    assert min(live[h.job_id] for h in chatty) >= polls // 2
    assert max(live[h.job_id] for h in quiet) <= 3  # its first read, the read after its one line, one in between
    out = capsys.readouterr().out
    for h in handles:
        assert re.findall(rf"\[job\] ({h.job_id} line \d+)", out) == fake_platform.logs[h.job_id].splitlines()


async def test_a_watch_waits_for_its_next_status_with_one_timer_pushed_on(fake_platform: type[FakeHook]) -> None:
    """A trigger's wait for its job's next status (no timeout made and cancelled per status, issue 24): a status
    published wakes it; none within the wait gives None, after the whole wait even when an earlier wait's timer
    fires first; the watch's end cancels its timer."""
    from airflow_provider_tao.triggers.poller import Watch

    async def next_status(timeout: float) -> JobStatus | None:  # as the trigger's run() waits
        watch.begin_wait(timeout)
        while (waiter := watch.waiter_needed()) is not None:
            await waiter
        return watch.take_status()

    watch = Watch(_submit(fake_platform), interval=0.1)
    loop = asyncio.get_running_loop()
    # waits long against a busy machine's stalls: the first wait's timer must outlive its status, then fire
    # inside the second wait
    loop.call_soon(watch.publish, JobStatus(JobState.RUNNING))
    status = await next_status(1.0)
    assert status is not None and status.state is JobState.RUNNING
    assert watch.timer is not None  # still armed for the first wait's end: pushed on, not cancelled
    started = loop.time()
    assert await next_status(1.5) is None  # the first timer fired after about 1 s: the wait went on
    assert loop.time() - started >= 1.49
    watch.publish(JobStatus(JobState.COMPLETE))
    ended = await next_status(0)  # a status already there is taken, however short the wait
    assert ended is not None and ended.state is JobState.COMPLETE
    watch.close()
    assert watch.timer is None


#: GC-tracked objects one waiting trigger keeps alive, counted as below: 18.5 after issue 24's rework (33 before).
WAITING_TRIGGER_OBJECTS = 20


async def test_a_waiting_trigger_keeps_few_objects_for_the_garbage_collector(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every object a waiting trigger keeps alive is walked by each full garbage collection, which at 10,000 watched
    jobs is the triggerer's worst event-loop lag (issue 24; measured by benchmarks/triggerer_load.py). Counted as
    the triggerer runs triggers: a task per trigger iterating its run(), on running jobs whose log was read."""
    monkeypatch.setattr(FakeHook, "log_reads_batched", True)  # every log read at the first poll
    handles = [_submit(fake_platform) for _ in range(200)]
    for handle in handles:
        fake_platform.jobs[handle.job_id]["state"] = JobState.RUNNING
        fake_platform.logs[handle.job_id] = "a line\n"

    async def run_trigger(trigger: TAOJobTrigger) -> None:
        async for _ in trigger.run():
            return

    warm_up = _submit(fake_platform)  # the first trigger's one-time imports and caches are not the triggers' cost
    fake_platform.jobs[warm_up.job_id]["state"] = JobState.COMPLETE
    await _first_event(_trigger(warm_up))
    gc.collect()
    before = len(gc.get_objects())
    triggers = [_trigger(handle, poll_interval=60) for handle in handles]
    tasks = [asyncio.create_task(run_trigger(trigger)) for trigger in triggers]
    poller = None
    for _ in range(200):  # until every trigger has read its log and waits for its next status
        await asyncio.sleep(0.05)
        poller = StatusPoller.existing("fake", "fake_conn")
        waiting = poller is not None and [w for w in poller.watches.values() if w.waiter and not w.waiter.done()]
        if waiting and len(waiting) == len(handles) and all(t.log_cursor for t in triggers):
            break
    else:
        pytest.fail("the triggers never all waited")
    gc.collect()
    per_trigger = (len(gc.get_objects()) - before) / len(handles)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert per_trigger <= WAITING_TRIGGER_OBJECTS


async def test_a_trigger_moved_to_another_triggerer_writes_no_line_the_new_one_writes(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 35: a trigger moved off a triggerer that missed its heartbeats keeps running there when that triggerer
    wakes up, until its supervisor cancels it; reading on from its own cursor, it wrote again the lines the new
    trigger had written (the e2e test of defect 5 saw ticks twice under load). Both triggers of the one task run in
    one event loop here, on the task's XCom held in a dict: the old one stops at the new one's claim."""
    from types import SimpleNamespace

    from airflow.sdk.bases.xcom import BaseXCom

    xcom: dict[tuple[str, str], Any] = {}

    async def aset(key: str, value: Any, *, run_id: str, **target: Any) -> None:
        xcom[(run_id, key)] = value

    async def aget_one(*, key: str, run_id: str, **target: Any) -> Any:
        return xcom.get((run_id, key))

    monkeypatch.setattr(BaseXCom, "aset", aset)
    monkeypatch.setattr(BaseXCom, "aget_one", aget_one)
    ti = SimpleNamespace(dag_id="d", task_id="train", run_id="r", map_index=-1)
    handle = _submit(fake_platform)
    hook = FakeHook(conn_id="fake_conn")

    def tick(n: int) -> None:
        FakeHook.logs[handle.job_id] = FakeHook.logs.get(handle.job_id, "") + f"tick {n}\n"

    def moved_trigger() -> TAOJobTrigger:
        trigger = _trigger(handle)
        trigger.task_instance = ti
        return trigger

    old = moved_trigger()
    await old._take_over_log()  # as run() starts
    for n in (1, 2, 3):
        tick(n)
    await old._stream_logs(hook)
    # the old triggerer freezes; the task's trigger starts on another one from the stored cursor
    for n in (4, 5):
        tick(n)
    new = moved_trigger()
    await new._take_over_log()
    await new._stream_logs(hook)
    tick(6)
    await old._stream_logs(hook)  # the old triggerer wakes up before its supervisor cancels the trigger
    await new._stream_logs(hook)
    await old._stream_logs(hook, final=True)

    ticks = re.findall(r"\[job\] (tick \d+)", capsys.readouterr().out)
    assert ticks == [f"tick {n}" for n in range(1, 7)]  # each line once, in order
    assert xcom[("r", "tao_log_cursor")]["cursor"] == str(len(FakeHook.logs[handle.job_id]))


async def test_a_trigger_started_again_keeps_the_platforms_capacity_clock(fake_platform: type[FakeHook]) -> None:
    """A trigger that starts over (a triggerer restart) does not start the wait for capacity over: the job has waited
    30 s by the platform's clock, the bound is 20 s, so its first status ends the wait (counted in status calls, the
    e2e failover test no longer times it, issue 35)."""
    handle = _submit(fake_platform)
    fake_platform.jobs[handle.job_id].update(state=JobState.PENDING, capacity_wait_since=time.time() - 30)
    payload = await _first_event(_trigger(handle, capacity_timeout=20.0, poll_interval=5.0))
    assert payload["status"] == "capacity"
    assert int(re.search(r"waited (\d+) s for resources", payload["message"]).group(1)) >= 30  # type: ignore[union-attr]
    assert len(fake_platform.status_calls) == 1
