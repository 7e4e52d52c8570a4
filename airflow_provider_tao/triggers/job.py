"""``TAOJobTrigger``: watches one job on any platform from the triggerer, and the poller that batches them.

Every trigger of one (platform, connection) in a triggerer process shares one :class:`StatusPoller` and its hook
(one async client): the poller asks the platform for the status of *all* watched jobs in one call per interval
(``aget_job_statuses``) and hands each trigger its job's status; the triggers read logs, marks and cancel through
the same hook. While waiting, a trigger copies the job's new log lines into the task log from an opaque cursor
that it keeps as an XCom of its task instance, so a restarted triggerer resumes where the last one stopped.

The event contract (a plain dict, see :class:`TriggerOutcome`): ``status`` is one of ``complete``, ``error``,
``canceled``, ``timeout`` (the task's deadline passed), ``capacity`` (the job waited for resources past the task's
``capacity_timeout``: the operator fails over) or ``misplaced`` (this triggerer cannot see the job), plus
``handle``, ``job_status``, ``log_cursor`` and ``message``. An unanswerable platform is never an outcome: the
trigger keeps waiting (and says so in the task log) until the job ends or the task's deadline passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_tao.hooks import get_platform_hook
from airflow_provider_tao.hooks.base import TAOPlatformHook
from airflow_provider_tao.jobs import NOT_FOUND_POLLS, JobHandle, JobState, JobStatus
from airflow_provider_tao.outage import OutageLog
from airflow_provider_tao.settings import outage_report_seconds, trigger_event_hold_seconds

#: Upper bound of one batched status call; a hung backend must not hang the trigger.
STATUS_CALL_TIMEOUT = 60.0
MAX_BACKOFF_SECONDS = 30.0  # after an outage the first good poll must not come much later
#: XCom key of the log cursor (kept with the task instance: survives triggerer restarts, cleared by a new try).
XCOM_LOG_CURSOR = "tao_log_cursor"
#: How long a trigger's on_kill keeps asking a failing platform to cancel the job (it runs on past on_kill's own
#: timeout, as a task of the triggerer's loop).
CANCEL_RETRY_SECONDS = 300.0
#: The first pause between two cancels; each next one doubles, up to ``MAX_BACKOFF_SECONDS``.
CANCEL_RETRY_PAUSE = 1.0
#: Cancels started by on_kill, kept referenced until they finish (the event loop holds tasks only weakly).
_CANCELS: set[asyncio.Future[None]] = set()


class TriggerOutcome:
    """Names of the trigger's event statuses (the operator's resume contract)."""

    COMPLETE = "complete"
    ERROR = "error"
    CANCELED = "canceled"
    TIMEOUT = "timeout"
    CAPACITY = "capacity"
    MISPLACED = "misplaced"

    BY_STATE: ClassVar[dict[JobState, str]] = {
        JobState.COMPLETE: COMPLETE,
        JobState.ERROR: ERROR,
        JobState.CANCELED: CANCELED,
    }


@dataclass
class _Watch:
    handle: JobHandle
    interval: float
    updates: asyncio.Queue[JobStatus] = field(default_factory=lambda: asyncio.Queue(maxsize=1))

    def publish(self, status: JobStatus) -> None:
        # Only the newest status matters: drop the one the trigger has not read yet.
        if self.updates.full():
            self.updates.get_nowait()
        self.updates.put_nowait(status)


class StatusPoller:
    """Polls every watched job of one (platform, connection) with one backend call per interval.

    One instance per event loop and connection (the triggerer runs all triggers on one loop), holding the one
    hook -- and so the one async client -- that status, logs, marks and cancel share. It starts with its first
    watcher, restarts its task if that task ever dies, and closes the hook when the last watcher leaves. Failed
    calls publish ``Unknown`` and back off.

    :param hook: the platform hook (connection already loaded).
    """

    _instances: ClassVar[dict[tuple[int, str, str | None], StatusPoller]] = {}

    def __init__(self, hook: TAOPlatformHook) -> None:
        self.hook = hook
        self.watches: dict[int, _Watch] = {}
        self.calls = 0  # backend calls made, for tests and benchmarks
        self.restarts = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @staticmethod
    def _key(platform: str, conn_id: str | None) -> tuple[int, str, str | None]:
        return (id(asyncio.get_running_loop()), platform, conn_id)

    @classmethod
    async def for_connection(cls, platform: str, conn_id: str | None) -> StatusPoller:
        """This event loop's poller of the connection, created (and its connection loaded) on first use."""
        key = cls._key(platform, conn_id)
        poller = cls._instances.get(key)
        if poller is None:
            hook = get_platform_hook(platform, conn_id)
            await hook.aload_connection()
            poller = cls._instances.setdefault(key, cls(hook))
        return poller

    @classmethod
    def existing(cls, platform: str, conn_id: str | None) -> StatusPoller | None:
        return cls._instances.get(cls._key(platform, conn_id))

    @contextlib.asynccontextmanager
    async def watch(self, handle: JobHandle, interval: float) -> AsyncIterator[_Watch]:
        watch = _Watch(handle, interval)
        self.watches[id(watch)] = watch
        self._wake.set()  # a new job is polled at once, not after the current interval
        self.ensure_running()
        try:
            yield watch
        finally:
            del self.watches[id(watch)]
            if not self.watches:
                await self._stop()

    def ensure_running(self) -> None:
        """Start the polling task, or restart it if it died (a bug or an unexpected error must not leave every
        trigger of the connection waiting forever)."""
        task = self._task
        if task is not None and not task.done():
            return
        if task is not None and not task.cancelled() and task.exception() is not None:
            self.restarts += 1
            self.hook.log.error("The %s status poller died (%r); restarting it", self.hook.platform, task.exception())
        self._task = asyncio.create_task(self._run(), name=f"tao-poller-{self.hook.platform}-{self.hook.conn_id}")

    async def _stop(self) -> None:
        for key, poller in list(self._instances.items()):
            if poller is self:
                del self._instances[key]
        if self._task is not None:
            self._task.cancel()
        try:
            await self.hook.aclose()
        except Exception as exc:  # closing is best effort
            self.hook.log.debug("Closing the %s client failed: %s", self.hook.platform, exc)

    async def _run(self) -> None:
        backoff = 0.0
        while self.watches:
            self._wake.clear()
            watches = list(self.watches.values())
            handles = list({w.handle.job_id: w.handle for w in watches}.values())
            statuses = await self._poll(handles)
            failed = all(s.state is JobState.UNKNOWN and not s.not_found for s in statuses.values())
            for watch in watches:
                watch.publish(statuses.get(watch.handle.job_id) or JobStatus.unknown("not in the platform's answer"))
            interval = min(w.interval for w in watches)
            backoff = min(max(interval, backoff * 2), MAX_BACKOFF_SECONDS) if failed else 0.0
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=backoff or interval)

    async def _poll(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        self.calls += 1
        try:
            return await asyncio.wait_for(self.hook.aget_job_statuses(handles), timeout=STATUS_CALL_TIMEOUT)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.hook.log.warning("Status poll of %d job(s) on %s failed: %s", len(handles), self.hook.platform, exc)
            return {h.job_id: JobStatus.unknown(f"status call failed: {exc}") for h in handles}


class TAOJobTrigger(BaseTrigger):
    """Waits for a TAO job to end, streaming its log lines into the task log meanwhile.

    :param handle: the job handle as a dict (``JobHandle.to_json()``).
    :param poll_interval: seconds between status polls.
    :param deadline: absolute epoch seconds at which the task times out (``execution_timeout``), or None.
    :param log_cursor: the job log's cursor already shown (the hook's opaque string; "" = from the start). A
        cursor stored later by a trigger of the same task instance wins.
    :param stream_logs: copy new log lines into the task log while deferred (False reads no log at all).
    :param cancel_on_kill: cancel the job when the task is marked failed/success or cleared while deferred.
    :param secret_conn_ids: connections whose secrets the job receives; registered with the triggerer's secrets
        masker so a job that prints them never puts them into the task log.
    :param capacity_timeout: seconds the job may wait for resources (``JobStatus.capacity_wait_since``, the
        backend's clock) before the trigger ends with ``capacity``; None = no bound (the last of a chain).
    """

    def __init__(
        self,
        *,
        handle: dict[str, Any],
        poll_interval: float = 10.0,
        deadline: float | None = None,
        log_cursor: str = "",
        stream_logs: bool = True,
        cancel_on_kill: bool = True,
        secret_conn_ids: list[str] | None = None,
        capacity_timeout: float | None = None,
    ) -> None:
        super().__init__()
        self.handle = JobHandle.from_json(handle)
        self.poll_interval = float(poll_interval)
        self.deadline = None if deadline is None else float(deadline)
        self.log_cursor = str(log_cursor)
        self.stream_logs = bool(stream_logs)
        self.cancel_on_kill = bool(cancel_on_kill)
        self.secret_conn_ids = list(secret_conn_ids or [])
        self.capacity_timeout = None if capacity_timeout is None else float(capacity_timeout)
        self._partial_line = ""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_provider_tao.triggers.job.TAOJobTrigger",
            {
                "handle": self.handle.to_json(),
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
                "log_cursor": self.log_cursor,
                "stream_logs": self.stream_logs,
                "cancel_on_kill": self.cancel_on_kill,
                "secret_conn_ids": self.secret_conn_ids,
                "capacity_timeout": self.capacity_timeout,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        started = time.monotonic()
        hold = trigger_event_hold_seconds()
        async with contextlib.aclosing(self._watch()) as events:  # closed with run(): the poller's watch ends
            async for event in events:
                # an event right after the deferral races the scheduler (see [tao] trigger_event_hold_seconds)
                await asyncio.sleep(max(0.0, started + hold - time.monotonic()))
                yield event

    async def _watch(self) -> AsyncGenerator[TriggerEvent, None]:
        await self._mask_secrets()
        poller = await StatusPoller.for_connection(self.handle.platform, self.handle.conn_id)
        hook = poller.hook
        if self.stream_logs:
            self.log_cursor = await self._stored_cursor() or self.log_cursor
        self.log.info("Watching %s job %s (%s)", hook.platform, self.handle.job_id, self.handle.name)
        status = JobStatus.unknown("no status yet")
        outage = OutageLog(self.log, hook.platform, outage_report_seconds())
        not_found = 0
        async with poller.watch(self.handle, self.poll_interval) as watch:
            if problem := hook.watch_problem(self.handle):
                yield self._event(TriggerOutcome.MISPLACED, JobStatus.unknown(problem), problem)
                return
            while True:
                wait = self.poll_interval * 4
                if self.deadline is not None:
                    wait = min(wait, max(0.0, self.deadline - time.time()))
                try:
                    status = await asyncio.wait_for(watch.updates.get(), timeout=wait)
                except TimeoutError:
                    poller.ensure_running()
                    # No fresh answer (the poller is backing off): keep the last failure's reason.
                    if status.state is not JobState.UNKNOWN:
                        status = JobStatus.unknown(f"no status from the {hook.platform} platform for {wait:.1f} s")
                outage.update(status)
                not_found = not_found + 1 if status.not_found else 0
                # An ended job's log is read once, by the final read below.
                if self.stream_logs and status.state is not JobState.UNKNOWN and not status.state.is_terminal:
                    await self._stream_logs(hook)
                if self.deadline is not None and time.time() >= self.deadline:
                    yield self._event(TriggerOutcome.TIMEOUT, status, "the task's execution_timeout passed")
                    return
                if not_found >= NOT_FOUND_POLLS:
                    message = f"job {self.handle.job_id} no longer exists on the {hook.platform} platform"
                    yield self._event(TriggerOutcome.ERROR, status, f"{message} ({status.message})")
                    return
                if reason := status.capacity_wait_over(self.capacity_timeout, time.time()):
                    yield self._event(TriggerOutcome.CAPACITY, status, reason)
                    return
                if status.state is JobState.ERROR and (note := await self._resubmitted(hook, status)):
                    self.log.warning("Job %s: %s", self.handle.job_id, note)
                    continue
                if status.state.is_terminal:
                    if self.stream_logs:
                        await self._stream_logs(hook, final=True)
                    yield self._event(TriggerOutcome.BY_STATE[status.state], status, status.message)
                    return

    async def _resubmitted(self, hook: TAOPlatformHook, status: JobStatus) -> str | None:
        try:
            return await hook.aresubmit_if_retriable(self.handle, status)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed resubmission leaves the failure to the operator's analysis
            self.log.warning("Resubmitting job %s failed: %s", self.handle.job_id, exc)
            return None

    def _event(self, outcome: str, status: JobStatus, message: str) -> TriggerEvent:
        return TriggerEvent(
            {
                "status": outcome,
                "handle": self.handle.to_json(),
                "job_status": status.to_json(),
                "log_cursor": self.log_cursor,
                "message": message,
            }
        )

    async def _stream_logs(self, hook: TAOPlatformHook, final: bool = False) -> None:
        """Copy complete new log lines into the task log; a trailing partial line waits for its newline. The new
        cursor is stored before the lines are written: a triggerer dying in between loses lines rather than
        writing them twice."""
        try:
            text, cursor = await hook.aget_job_logs(self.handle, self.log_cursor)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # logs are best effort: never fail the watch over them
            self.log.debug("Reading the job log failed: %s", exc)
            return
        lines = (self._partial_line + text).split("\n")
        self._partial_line = lines.pop()  # the text after the last newline: an unfinished line, or ""
        if final and self._partial_line:
            lines.append(self._partial_line)
        try:
            if cursor != self.log_cursor:
                self.log_cursor = cursor
                # shielded: a kill or a move to another triggerer landing here must not leave the cursor stored
                # and the lines unwritten (the next trigger would start after lines nobody wrote)
                await asyncio.shield(self._store_cursor(cursor))
        finally:
            for line in lines:
                self.log.info("[job] %s", line)

    # ----------------------------------------------------------------- what the triggerer keeps for us

    def _xcom_target(self) -> dict[str, Any] | None:
        ti = self.task_instance
        if ti is None:
            return None  # run outside a triggerer (tests, the worker): the cursor lives in memory only
        return {"dag_id": ti.dag_id, "task_id": ti.task_id, "run_id": ti.run_id, "map_index": ti.map_index}

    async def _stored_cursor(self) -> str | None:
        target = self._xcom_target()
        if target is None:
            return None
        from airflow.sdk.bases.xcom import BaseXCom

        try:
            value = await BaseXCom.aget_one(key=XCOM_LOG_CURSOR, **target)
        except Exception as exc:
            self.log.debug("Reading the stored log cursor failed: %s", exc)
            return None
        if isinstance(value, dict) and value.get("job_id") == self.handle.job_id:
            return str(value.get("cursor") or "") or None
        return None

    async def _store_cursor(self, cursor: str) -> None:
        target = self._xcom_target()
        if target is None:
            return
        from airflow.sdk.bases.xcom import BaseXCom

        try:
            await BaseXCom.aset(key=XCOM_LOG_CURSOR, value={"job_id": self.handle.job_id, "cursor": cursor}, **target)
        except Exception as exc:
            self.log.debug("Storing the log cursor failed: %s", exc)

    async def _mask_secrets(self) -> None:
        """Register the secrets of ``secret_conn_ids`` with this triggerer's secrets masker: the password and
        every extra whose name Airflow treats as sensitive (``aws_session_token``, ``*secret*``, ...)."""
        if not self.secret_conn_ids:
            return
        from airflow.sdk import BaseHook
        from airflow.sdk._shared.secrets_masker import should_hide_value_for_key
        from airflow.sdk.log import amask_secret

        for conn_id in self.secret_conn_ids:
            try:
                conn = await BaseHook.aget_connection(conn_id)  # masks the password itself
                extras = conn.extra_dejson
            except Exception as exc:
                self.log.warning("Could not load connection %r to mask its secrets: %s", conn_id, exc)
                continue
            for key, value in (extras if isinstance(extras, dict) else {}).items():
                if isinstance(value, str) and should_hide_value_for_key(key):
                    await amask_secret(value, key)

    async def on_kill(self) -> None:
        """The task was marked failed/success or cleared while deferred: cancel the job this try owns."""
        if not self.cancel_on_kill:
            self.log.info("cancel_on_kill=False: leaving job %s running", self.handle.job_id)
            return
        if await self._task_state() == "deferred":
            # Airflow 3.3 also calls on_kill when a trigger moves to another triggerer (the task still waits on the
            # job there): canceling would cost a resubmission of the same job
            self.log.info("The task is still deferred (its trigger moved): leaving job %s running", self.handle.job_id)
            return
        # The triggerer cancels a trigger again at every state sync (about once a second) until it has finished,
        # and those cancels land in on_kill itself (Airflow 3.3 swallows them silently): a cancel that takes a few
        # remote round trips (SLURM: marks, status, scancel over SSH) was abandoned half-way. The cancel runs as a
        # task of its own that they cannot interrupt; on_kill waits for it up to the triggerer's on_kill_timeout.
        cancel = asyncio.ensure_future(self._cancel_job())
        _CANCELS.add(cancel)
        cancel.add_done_callback(_CANCELS.discard)
        deadline = time.monotonic() + _on_kill_timeout()
        while True:
            try:
                await asyncio.shield(cancel)
                return
            except asyncio.CancelledError:
                if cancel.done() or time.monotonic() >= deadline:
                    raise
                if task := asyncio.current_task():
                    task.uncancel()  # a repeated cancel of the same kill: keep waiting for the cancel to finish

    async def _task_state(self) -> str | None:
        """The task instance's state now, asked through the triggerer's supervisor (the Task SDK's
        ``get_task_states``); None when it cannot be told."""
        ti = getattr(self, "task_instance", None)
        if ti is None:
            return None
        try:
            from airflow.sdk.execution_time import task_runner
            from airflow.sdk.execution_time.comms import GetTaskStates

            answer = await task_runner.SUPERVISOR_COMMS.asend(
                GetTaskStates(dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id], map_index=ti.map_index)
            )
            key = ti.task_id if ti.map_index < 0 else f"{ti.task_id}_{ti.map_index}"
            state = (getattr(answer, "task_states", {}).get(ti.run_id) or {}).get(key)
        except Exception as exc:  # an older Airflow, no supervisor: cancel, as on_kill always did
            self.log.debug("Could not read the state of the task: %s", exc)
            return None
        return None if state is None else str(getattr(state, "value", state))

    async def _cancel_job(self) -> None:
        # Its own hook, never the poller's: run() is being cancelled at the same moment, and the poller's last
        # watcher leaving closes the poller's client under a cancel still in flight. Platforms that pool their
        # connection (SLURM) share it anyway; holding it here keeps it open until the cancel is done.
        hook = get_platform_hook(self.handle.platform, self.handle.conn_id)
        await hook.aload_connection()
        try:
            # As the operator's on_kill: a job that was stopped (or had just ended) is cleaned up too -- the task
            # will not resume to do it (a Brev instance of the task's own, a container with auto_remove).
            if await self._cancel_until_done(hook):
                await asyncio.to_thread(hook.cleanup_job, self.handle)
        finally:
            await hook.aclose()

    async def _cancel_until_done(self, hook: TAOPlatformHook) -> bool:
        """The cancel, asked again with a growing pause while the platform fails it (an outage, a blip) until
        :data:`CANCEL_RETRY_SECONDS` have passed: nothing else would cancel the job before the next sweep."""
        give_up = time.monotonic() + CANCEL_RETRY_SECONDS
        pause = CANCEL_RETRY_PAUSE
        while True:
            try:
                return await hook.acancel_job(self.handle)
            except Exception as exc:
                if time.monotonic() + pause > give_up:
                    self.log.error(
                        "Canceling job %s failed for good (%s): the orphan sweeper cancels it later",
                        self.handle.job_id, exc,
                    )  # fmt: skip
                    raise
                self.log.warning("Canceling job %s failed (%s); asking again in %.0f s", self.handle.job_id, exc, pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, MAX_BACKOFF_SECONDS)


def _on_kill_timeout() -> float:
    """Seconds the triggerer grants ``on_kill`` (``[triggerer] on_kill_timeout``, 30 by default)."""
    from airflow.configuration import conf

    return float(conf.getint("triggerer", "on_kill_timeout", fallback=30))
