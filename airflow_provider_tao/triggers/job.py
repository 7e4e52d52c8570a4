"""``TAOJobTrigger``: watches one job on any platform from the triggerer, and the poller that batches them.

Every trigger of one (platform, connection) in a triggerer process shares one :class:`StatusPoller` and its hook
(one async client): the poller asks the platform for the status of *all* watched jobs in one call per interval
(``aget_job_statuses``) and hands each trigger its job's status; the triggers read logs, marks and cancel through
the same hook. While waiting, a trigger copies the job's new log lines into the task log from an opaque cursor
that it keeps as an XCom of its task instance, so a restarted triggerer resumes where the last one stopped.

The event contract (a plain dict, see :class:`TriggerOutcome`): ``status`` is one of ``complete``, ``error``,
``canceled``, ``timeout`` (the task's deadline passed), ``capacity`` (the job waited for resources past the task's
``capacity_timeout``: the operator fails over) or ``misplaced`` (this triggerer cannot see the job), plus
``handle``, ``job_status``, ``log_cursor``, ``log_complete`` (False: the connection's log reads of the interval were
spent before the ended job's log was read to its end; the operator copies the rest from ``log_cursor``) and
``message`` (and for ``timeout``, ``waiting``: the job's last waiting reason when it was still pending). An
unanswerable platform is never an outcome: the trigger keeps waiting (and says so in the task log) until the job ends
or the task's deadline passes. While the job waits, the task log says why in the platform's words
(:mod:`~airflow_provider_tao.waiting`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import structlog
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_tao.connections import runs_inline
from airflow_provider_tao.hooks import get_platform_hook
from airflow_provider_tao.hooks.base import TAOPlatformHook
from airflow_provider_tao.joblog import JobLogWriter
from airflow_provider_tao.jobs import NOT_FOUND_POLLS, JobHandle, JobState, JobStatus
from airflow_provider_tao.outage import OutageLog
from airflow_provider_tao.settings import log_reads_per_interval, outage_report_seconds, trigger_event_hold_seconds
from airflow_provider_tao.triggers.log_budget import FINAL_LOG_READS, LogBudget
from airflow_provider_tao.waiting import WaitLog

#: Upper bound of one batched status call; a hung backend must not hang the trigger.
STATUS_CALL_TIMEOUT = 60.0
MAX_BACKOFF_SECONDS = 30.0  # after an outage the first good poll must not come much later
NEW_JOB_POLL_GAP = 1.0  # seconds from one poll to an early one for newly watched jobs
#: Watches a poll wakes in one turn of the event loop (the triggers woken run before the next chunk is published).
PUBLISH_CHUNK = 250
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
    logs: bool = False  # its trigger streams the job's log
    log_turn: bool = False  # the poller granted it a live log read, not made yet
    # The newest status not read yet, the future its trigger waits on and the timer bounding that wait: a slot
    # and one timer pushed on, not an asyncio.Queue and a timeout made and cancelled per status (a 10,000-job
    # triggerer makes thousands a poll, and every full garbage collection walks through the Queue's six objects).
    status: JobStatus | None = None
    waiter: asyncio.Future[None] | None = None
    timer: asyncio.TimerHandle | None = None
    until: float = 0.0  # the loop time at which the current wait gives up

    #: the context its timer runs in (the poller's one, not a copy per timer: ``_timed_out`` reads no variable)
    context: contextvars.Context | None = None

    def publish(self, status: JobStatus) -> None:
        # Only the newest status matters: it replaces the one the trigger has not read yet.
        self.status = status
        self._wake()

    # The wait for the next status in three plain calls, the waiter awaited by the trigger's run() itself: no
    # coroutine of a wait kept alive per waiting trigger (every full garbage collection walks through it).
    def begin_wait(self, timeout: float) -> None:
        self.until = asyncio.get_running_loop().time() + timeout

    def waiter_needed(self) -> asyncio.Future[None] | None:
        """The future to await for a status; None when one is there or the wait is over."""
        self.waiter = None
        loop = asyncio.get_running_loop()
        if self.status is not None or self.until <= loop.time():
            return None
        if self.timer is None:  # an armed timer firing before ``until`` (an earlier wait's) re-arms it here
            self.timer = loop.call_at(self.until, self._timed_out, context=self.context)
        self.waiter = loop.create_future()
        return self.waiter

    def take_status(self) -> JobStatus | None:
        """The newest status published since :meth:`begin_wait`; None when none came before the wait's end."""
        status, self.status = self.status, None
        return status

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self) -> None:
        self.timer = None
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def take_log_turn(self) -> bool:
        turn, self.log_turn = self.log_turn, False
        return turn


class StatusPoller:
    """Polls every watched job of one (platform, connection) with one backend call per interval.

    One instance per event loop and connection (the triggerer runs all triggers on one loop), holding the one
    hook -- and so the one async client -- that status, logs, marks and cancel share. It starts with its first
    watcher, restarts its task if that task ever dies, and closes the hook when the last watcher leaves. Failed
    calls publish ``Unknown`` and back off. Its :class:`LogBudget` says which jobs read their log at each poll.

    :param hook: the platform hook (connection already loaded).
    """

    _instances: ClassVar[dict[tuple[int, str, str | None], StatusPoller]] = {}
    #: pollers being created: the triggers that start meanwhile wait for the same one (one connection load, not one
    #: per trigger when a restarted triggerer starts thousands at once)
    _creating: ClassVar[dict[tuple[int, str, str | None], asyncio.Future[StatusPoller]]] = {}

    def __init__(self, hook: TAOPlatformHook) -> None:
        self.hook = hook
        self.watches: dict[int, _Watch] = {}
        self.calls = 0  # backend calls made, for tests and benchmarks
        self.logs = LogBudget(None if hook.log_reads_batched else log_reads_per_interval())
        # [tao] settings its triggers use, read once per poller: a read costs more than a trigger's poll
        # The hold keeps an event clear of the scheduler's deferral race; `airflow dags test` has no scheduler.
        self.event_hold = 0.0 if runs_inline() else trigger_event_hold_seconds()
        self.outage_report = outage_report_seconds()
        self.restarts = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._timer_context = contextvars.Context()  # its watches' timers share it (see _Watch.context)

    @staticmethod
    def _key(platform: str, conn_id: str | None) -> tuple[int, str, str | None]:
        return (id(asyncio.get_running_loop()), platform, conn_id)

    @classmethod
    async def for_connection(cls, platform: str, conn_id: str | None) -> StatusPoller:
        """This event loop's poller of the connection, created (and its connection loaded) on first use."""
        key = cls._key(platform, conn_id)
        if (poller := cls._instances.get(key)) is not None:
            return poller
        creating = cls._creating.get(key)
        if creating is None:
            creating = cls._creating[key] = asyncio.ensure_future(cls._create(key, platform, conn_id))
            creating.add_done_callback(lambda _: cls._creating.pop(key, None))
        return await asyncio.shield(creating)  # a waiter cancelled does not cancel the others' poller

    @classmethod
    async def _create(cls, key: tuple[int, str, str | None], platform: str, conn_id: str | None) -> StatusPoller:
        hook = get_platform_hook(platform, conn_id)
        await hook.aload_connection()
        return cls._instances.setdefault(key, cls(hook))

    @classmethod
    def existing(cls, platform: str, conn_id: str | None) -> StatusPoller | None:
        return cls._instances.get(cls._key(platform, conn_id))

    def add(self, watch: _Watch) -> None:
        """Poll ``watch``'s job from now on; :meth:`remove` ends it."""
        watch.context = self._timer_context
        self.watches[id(watch)] = watch
        self._wake.set()  # a new job is polled at once, not after the current interval
        self.ensure_running()

    async def remove(self, watch: _Watch) -> None:
        watch.close()
        del self.watches[id(watch)]
        self.logs.forget(watch.handle.job_id)
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
            started = time.monotonic()
            watches = list(self.watches.values())
            handles = list({w.handle.job_id: w.handle for w in watches}.values())
            statuses = await self._poll(handles)
            failed = all(s.state is JobState.UNKNOWN and not s.not_found for s in statuses.values())
            # a job whose log the poll saw unchanged (log_news) costs its trigger no read
            news = self.hook.log_news
            live = [
                w.handle.job_id for w in watches
                if w.logs and _running(statuses.get(w.handle.job_id)) and news(w.handle.job_id)
            ]  # fmt: skip
            ending = [w.handle.job_id for w in watches if w.logs and _ended(statuses.get(w.handle.job_id))]
            interval = min(w.interval for w in watches)
            readers = self.logs.plan(live, ending, interval)
            for n, watch in enumerate(watches, 1):
                watch.log_turn |= watch.handle.job_id in readers
                watch.publish(statuses.get(watch.handle.job_id) or JobStatus.unknown("not in the platform's answer"))
                if n % PUBLISH_CHUNK == 0:
                    # every watch published wakes its trigger: a turn of the loop per chunk, not 10,000 in one turn
                    await asyncio.sleep(0)
            backoff = min(max(interval, backoff * 2), MAX_BACKOFF_SECONDS) if failed else 0.0
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=backoff or interval)
            # A new job is polled at once, but a burst of them (a restarted triggerer starts thousands, one per turn
            # of its loop) shares one early poll: at most one a NEW_JOB_POLL_GAP.
            await asyncio.sleep(max(0.0, started + min(interval, NEW_JOB_POLL_GAP) - time.monotonic()))

    async def _poll(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        self.calls += 1
        try:
            return await asyncio.wait_for(self.hook.aget_job_statuses(handles), timeout=STATUS_CALL_TIMEOUT)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.hook.log.warning("Status poll of %d job(s) on %s failed: %s", len(handles), self.hook.platform, exc)
            return {h.job_id: JobStatus.unknown(f"status call failed: {exc}") for h in handles}


def _running(status: JobStatus | None) -> bool:
    """A job whose log may grow: known and not ended."""
    return status is not None and status.state is not JobState.UNKNOWN and not status.state.is_terminal


def _ended(status: JobStatus | None) -> bool:
    return status is not None and status.state.is_terminal


class TAOJobTrigger(BaseTrigger):
    """Waits for a TAO job to end, streaming its log lines into the task log meanwhile.

    :param handle: the job handle as a dict (``JobHandle.to_json()``).
    :param poll_interval: seconds between status polls.
    :param deadline: absolute epoch seconds at which the task times out (``execution_timeout``), or None.
    :param log_cursor: the job log's cursor already shown (the hook's opaque string; "" = from the start). A
        cursor stored later by a trigger of the same task instance wins.
    :param stream_logs: copy new log lines into the task log while deferred (False reads no log at all).
    :param cancel_on_kill: cancel the job when the task is marked failed/success or cleared while deferred.
    :param secret_conn_ids: connections whose secrets the job receives: the trigger finds those secrets again (the
        kwargs never hold them) and masks them, so a job that prints them never puts them into the task log.
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
        self.secret_conn_ids = tuple(secret_conn_ids or ())  # () is no object of its own for the GC to walk
        self.capacity_timeout = None if capacity_timeout is None else float(capacity_timeout)
        self._writer: JobLogWriter | None = None  # made at the first log text or secret: a quiet job needs none
        # One logger per trigger class, not one per trigger (each costs ~9 objects every full garbage collection
        # walks): the triggerer routes a trigger's lines to its task's log by context variables, not by logger.
        self._log = _class_logger(self._create_logger_name(type(self), self._log_config_logger_name, self._logger_name))
        self._event_hold = 0.0  # [tao] trigger_event_hold_seconds, from the poller before the first event

    @property
    def writer(self) -> JobLogWriter:
        """What shapes the job's log into task log lines (made on first use)."""
        if self._writer is None:
            self._writer = JobLogWriter()
        return self._writer

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
                "secret_conn_ids": list(self.secret_conn_ids),
                "capacity_timeout": self.capacity_timeout,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # One async generator, its watch entered and left by hand and its waits awaited in place: every object a
        # waiting trigger keeps alive is walked by each full garbage collection (a 10,000-job triggerer's worst lag).
        started = time.monotonic()
        await self._mask_secrets()
        poller = await StatusPoller.for_connection(self.handle.platform, self.handle.conn_id)
        hook = poller.hook
        if self.stream_logs:
            self.log_cursor = await self._stored_cursor() or self.log_cursor
        self.log.info("Watching %s job %s (%s)", hook.platform, self.handle.job_id, self.handle.name)
        status = JobStatus.unknown("no status yet")
        self._event_hold = poller.event_hold
        outage: OutageLog | None = None  # made at the first Unknown: most jobs never see an outage
        waiting = WaitLog(self.log, self.handle.job_id, poller.outage_report)
        not_found = 0
        watch = _Watch(self.handle, self.poll_interval, self.stream_logs)
        poller.add(watch)
        try:
            if problem := hook.watch_problem(self.handle):
                event = self._event(TriggerOutcome.MISPLACED, JobStatus.unknown(problem), problem)
            else:
                while True:
                    wait = self.poll_interval * 4
                    if self.deadline is not None:
                        wait = min(wait, max(0.0, self.deadline - time.time()))
                    watch.begin_wait(wait)
                    while (waiter := watch.waiter_needed()) is not None:
                        await waiter
                    if (fresh := watch.take_status()) is not None:
                        status = fresh
                    else:
                        poller.ensure_running()
                        # No fresh answer (the poller is backing off): keep the last failure's reason.
                        if status.state is not JobState.UNKNOWN:
                            status = JobStatus.unknown(f"no status from the {hook.platform} platform for {wait:.1f} s")
                    if outage is None and status.state is JobState.UNKNOWN:
                        outage = OutageLog(self.log, hook.platform, poller.outage_report)
                    if outage is not None:
                        outage.update(status)
                    waiting.update(status)
                    not_found = not_found + 1 if status.not_found else 0
                    # An ended job's log is read by the final reads below; a live one when the poller grants it a turn.
                    if self.stream_logs and _running(status) and watch.take_log_turn():
                        await self._live_log(poller)
                    if self.deadline is not None and time.time() >= self.deadline:
                        event = self._event(TriggerOutcome.TIMEOUT, status, "the task's execution_timeout passed")
                        event.payload["waiting"] = waiting.summary()  # why the job had not run yet, if it had not
                        break
                    if not_found >= NOT_FOUND_POLLS:
                        message = f"job {self.handle.job_id} no longer exists on the {hook.platform} platform"
                        event = self._event(TriggerOutcome.ERROR, status, f"{message} ({status.message})")
                        break
                    if reason := status.capacity_wait_over(self.capacity_timeout, time.time()):
                        event = self._event(TriggerOutcome.CAPACITY, status, reason)
                        break
                    if status.state is JobState.ERROR and (note := await self._resubmitted(hook, status)):
                        self.log.warning("Job %s: %s", self.handle.job_id, note)
                        continue
                    if status.state.is_terminal:
                        complete = await self._final_log(poller) if self.stream_logs else True
                        event = self._event(TriggerOutcome.BY_STATE[status.state], status, status.message, complete)
                        break
            # an event right after the deferral races the scheduler (see [tao] trigger_event_hold_seconds)
            await asyncio.sleep(max(0.0, started + self._event_hold - time.monotonic()))
            yield event
        finally:  # also when run() is closed or cancelled: the poller's watch ends with it
            await poller.remove(watch)

    async def _resubmitted(self, hook: TAOPlatformHook, status: JobStatus) -> str | None:
        try:
            return await hook.aresubmit_if_retriable(self.handle, status)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed resubmission leaves the failure to the operator's analysis
            self.log.warning("Resubmitting job %s failed: %s", self.handle.job_id, exc)
            return None

    def _event(self, outcome: str, status: JobStatus, message: str, log_complete: bool = True) -> TriggerEvent:
        return TriggerEvent(
            {
                "status": outcome,
                "handle": self.handle.to_json(),
                "job_status": status.to_json(),
                "log_cursor": self.log_cursor,
                "log_complete": log_complete,
                "message": message,
            }
        )

    async def _live_log(self, poller: StatusPoller) -> None:
        before = self.log_cursor
        await self._stream_logs(poller.hook)
        poller.logs.record(self.handle.job_id, self.log_cursor != before, self.poll_interval)

    async def _final_log(self, poller: StatusPoller) -> bool:
        """An ended job's log to its end, in bounded reads on the connection's log budget; False when the budget
        (or a failed read) left some of it: the worker resuming the task copies the rest from the event's cursor."""
        for _ in range(FINAL_LOG_READS):
            if not poller.logs.final_turn(self.handle.job_id):
                break
            if await self._stream_logs(poller.hook, final=True):
                return True
        if self._writer is not None:
            for line in self._writer.feed("", final=True):  # the operator continues after it: a line may be split
                self.log.info("[job] %s", line)
        self.log.info("Job %s ended; the rest of its log is copied when the task resumes", self.handle.job_id)
        return False

    async def _stream_logs(self, hook: TAOPlatformHook, final: bool = False) -> bool:
        """Copy new log lines into the task log (as :class:`~airflow_provider_tao.joblog.JobLogWriter` shapes them:
        whole lines, a progress bar's latest state, secrets masked); a trailing partial line waits for its newline,
        or for the end of an ended job's log (``final``: returns True when this read reached it). The new cursor is
        stored before the lines are written: a triggerer dying in between loses lines rather than writing them
        twice."""
        try:
            text, cursor = await hook.aget_job_logs(self.handle, self.log_cursor)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # logs are best effort: never fail the watch over them
            self.log.debug("Reading the job log failed: %s", exc)
            return False
        at_end = final and (cursor == self.log_cursor or hook.log_read_reached_end(text))
        lines = self.writer.feed(text, at_end) if text or self._writer is not None else []
        try:
            if cursor != self.log_cursor:
                self.log_cursor = cursor
                # shielded: a kill or a move to another triggerer landing here must not leave the cursor stored
                # and the lines unwritten (the next trigger would start after lines nobody wrote)
                await asyncio.shield(self._store_cursor(cursor))
        finally:
            for line in lines:
                self.log.info("[job] %s", line)
        return at_end

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
        """Mask every secret the job received -- found again here, never carried in the kwargs (see
        :mod:`~airflow_provider_tao.received_secrets`) -- in the job's lines and this triggerer's own log."""
        if not self.secret_conn_ids:
            return
        from airflow.sdk.log import amask_secret

        from airflow_provider_tao.received_secrets import asecrets_received

        values = await asecrets_received(self.secret_conn_ids)
        self.writer.mask(values)
        for value in values:
            await amask_secret(value)

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


@functools.cache
def _class_logger(name: str) -> Any:
    return structlog.get_logger(name)


def _on_kill_timeout() -> float:
    """Seconds the triggerer grants ``on_kill`` (``[triggerer] on_kill_timeout``, 30 by default)."""
    from airflow.configuration import conf

    return float(conf.getint("triggerer", "on_kill_timeout", fallback=30))
