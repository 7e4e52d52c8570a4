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
import functools
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import structlog
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_tao.hooks import get_platform_hook
from airflow_provider_tao.hooks.base import TAOPlatformHook
from airflow_provider_tao.hooks.ownership import CancelOutcome
from airflow_provider_tao.joblog import JobLogWriter
from airflow_provider_tao.jobs import NOT_FOUND_POLLS, JobHandle, JobState, JobStatus
from airflow_provider_tao.operators.decisions import UNKNOWN, Act, Facts, Situation, Verdict, decide, state_fact
from airflow_provider_tao.outage import OutageLog
from airflow_provider_tao.triggers.log_budget import FINAL_LOG_READS
from airflow_provider_tao.triggers.poller import MAX_BACKOFF_SECONDS, StatusPoller, Watch, is_running
from airflow_provider_tao.waiting import WaitLog

#: XCom key of the log cursor (kept with the task instance: survives triggerer restarts, cleared by a new try).
XCOM_LOG_CURSOR = "tao_log_cursor"
#: XCom key naming the trigger that writes the job's log lines: the one of the task instance that started last.
XCOM_LOG_WRITER = "tao_log_writer"
#: How long a trigger's on_kill keeps asking a failing platform to cancel the job (it runs on past on_kill's own
#: timeout, as a task of the triggerer's loop).
CANCEL_RETRY_SECONDS = 300.0
#: The first pause between two cancels; each next one doubles, up to ``MAX_BACKOFF_SECONDS``.
CANCEL_RETRY_PAUSE = 1.0
#: Times in a row a resubmission may go unanswered (the requeue may have happened: the next poll tells) before the
#: failure is reported as it stands.
RESUBMIT_ASKS = 3
#: Times on_kill asks the task's state while it cannot be read, and the pause between asks.
TASK_STATE_ASKS = 3
TASK_STATE_PAUSE = 0.5
#: Cancels started by on_kill, kept referenced until they finish (the event loop holds tasks only weakly).
_CANCELS: set[asyncio.Future[None]] = set()


class TriggerOutcome:
    """Names of the trigger's event statuses (the operator's resume contract)."""

    COMPLETE = "complete"
    ERROR = "error"
    CANCELED = "canceled"
    TIMEOUT = "timeout"
    BUDGET = "budget"  # the job may have passed max_gpu_hours: the task reads its GPU-hours and decides
    CAPACITY = "capacity"
    MISPLACED = "misplaced"

    BY_STATE: ClassVar[dict[JobState, str]] = {
        JobState.COMPLETE: COMPLETE,
        JobState.ERROR: ERROR,
        JobState.CANCELED: CANCELED,
    }


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
    :param budget_at: epoch seconds at which the job may pass its ``max_gpu_hours`` (the earliest: as if it ran
        all along); the trigger ends with ``budget`` then. None = no budget.
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
        budget_at: float | None = None,
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
        self.budget_at = None if budget_at is None else float(budget_at)
        self._writer: JobLogWriter | None = None  # made at the first log text or secret: a quiet job needs none
        # One logger per trigger class, not one per trigger (each costs ~9 objects every full garbage collection
        # walks): the triggerer routes a trigger's lines to its task's log by context variables, not by logger.
        self._log = _class_logger(self._create_logger_name(type(self), self._log_config_logger_name, self._logger_name))
        self._event_hold = 0.0  # [tao] trigger_event_hold_seconds, from the poller before the first event
        self._writer_id = ""  # this trigger's claim to write the job's log lines (see _take_over_log)
        self._superseded = False  # a trigger started later for the task writes the lines now

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
                "budget_at": self.budget_at,
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
            await self._take_over_log()
        self.log.info("Watching %s job %s (%s)", hook.platform, self.handle.job_id, self.handle.name)
        status = JobStatus.unknown("no status yet")
        self._event_hold = poller.event_hold
        outage: OutageLog | None = None  # made at the first Unknown: most jobs never see an outage
        waiting = WaitLog(self.log, self.handle.job_id, poller.outage_report)
        not_found = unanswered = 0
        watch = Watch(self.handle, self.poll_interval, self.stream_logs)
        poller.add(watch)
        try:
            if problem := hook.watch_problem(self.handle):
                event = self._event(TriggerOutcome.MISPLACED, JobStatus.unknown(problem), problem)
            else:
                while True:
                    wait = self._next_wait()
                    watch.begin_wait(wait)
                    while (waiter := watch.waiter_needed()) is not None:
                        await waiter
                    status = _status_after_wait(watch, poller, status, wait)
                    if outage is None and status.state is JobState.UNKNOWN:
                        outage = OutageLog(self.log, hook.platform, poller.outage_report)
                    if outage is not None:
                        outage.update(status)
                    waiting.update(status)
                    not_found = not_found + 1 if status.not_found else 0
                    # An ended job's log is read by the final reads below; a live one when the poller grants it a turn.
                    if self.stream_logs and is_running(status) and watch.take_log_turn():
                        await self._live_log(poller)
                    if (limit := self._limit_event(status, not_found, waiting, hook.platform)) is not None:
                        if limit.payload["status"] == TriggerOutcome.TIMEOUT and self._stops_at_deadline(status):
                            await stop_at_deadline(hook, self.handle, self.log)
                        event = limit
                        break
                    if status.state is not JobState.ERROR and status.state is not JobState.UNKNOWN:
                        unanswered = 0  # "in a row": a read that shows the rerun ended the run of lost answers
                    if status.state is JobState.ERROR:
                        note, answered = await self._resubmitted(hook, status)
                        unanswered = 0 if answered else unanswered + 1
                        if note:
                            self.log.warning("Job %s: %s", self.handle.job_id, note)
                            continue
                        if unanswered and unanswered < RESUBMIT_ASKS:
                            continue  # the rerun may have started: the next poll reads the job again
                    if status.state.is_terminal:
                        complete = await self._final_log(poller) if self.stream_logs else True
                        event = self._event(TriggerOutcome.BY_STATE[status.state], status, status.message, complete)
                        break
            # an event right after the deferral races the scheduler (see [tao] trigger_event_hold_seconds)
            await asyncio.sleep(max(0.0, started + self._event_hold - time.monotonic()))
            yield event
        finally:  # also when run() is closed or cancelled: the poller's watch ends with it
            await poller.remove(watch)

    def _next_wait(self) -> float:
        """How long this poll waits for a status: four intervals, never past the task's deadline or budget."""
        wait = self.poll_interval * 4
        for limit in (self.deadline, self.budget_at):
            if limit is not None:
                wait = min(wait, max(0.0, limit - time.time()))
        return wait

    def _limit_event(self, status: JobStatus, not_found: int, waiting: WaitLog, platform: str) -> TriggerEvent | None:
        """The event of a wait that ends by a limit (the task's deadline, a job gone, capacity waited out), if any."""
        if self.deadline is not None and time.time() >= self.deadline:
            event = self._event(TriggerOutcome.TIMEOUT, status, "the task's execution_timeout passed")
            event.payload["waiting"] = waiting.summary()  # why the job had not run yet, if it had not
            return event
        if not_found >= NOT_FOUND_POLLS:
            message = f"job {self.handle.job_id} no longer exists on the {platform} platform"
            return self._event(TriggerOutcome.ERROR, status, f"{message} ({status.message})")
        if reason := status.capacity_wait_over(self.capacity_timeout, time.time()):
            return self._event(TriggerOutcome.CAPACITY, status, reason)
        if self.budget_at is not None and time.time() >= self.budget_at and not status.state.is_terminal:
            return self._event(TriggerOutcome.BUDGET, status, "the job may have passed its max_gpu_hours")
        return None

    def _stops_at_deadline(self, status: JobStatus) -> bool:
        """Whether the timeout's verdict (operators/decisions.py, RESUME) stops the job: then the trigger stops it as
        the deadline passes, not the resumed task -- a task marked failed before it resumes never does."""
        if status.state.is_terminal:
            return False
        facts = Facts(try_number=self.handle.try_number, state=state_fact(status), outcome=TriggerOutcome.TIMEOUT,
                      cancel_on_kill=self.cancel_on_kill)  # fmt: skip
        return decide(facts, Situation.RESUME).stop

    async def _resubmitted(self, hook: TAOPlatformHook, status: JobStatus) -> tuple[str | None, bool]:
        """The platform's note on a rerun of the failed job in place (None: it stays failed), and whether it
        answered. A lost answer may hide a rerun that started: reporting the failure then would leave it unwatched,
        so the trigger reads the job again and asks again if it is still failed (harmless: the platform keeps the
        attempt count), ``RESUBMIT_ASKS`` times before the failure goes to the operator's analysis."""
        try:
            return await hook.aresubmit_if_retriable(self.handle, status), True
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.warning("Resubmitting job %s got no answer: %s", self.handle.job_id, exc)
            return None, False

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
        if self._superseded:
            return True  # the trigger that took over writes the rest
        try:
            text, cursor = await hook.aget_job_logs(self.handle, self.log_cursor)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # logs are best effort: never fail the watch over them
            self.log.debug("Reading the job log failed: %s", exc)
            return False
        if cursor != self.log_cursor and not await self._still_the_writer():
            return True
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

    async def _take_over_log(self) -> None:
        """Continue the job's log from the cursor stored by the task's last trigger, and claim the writing: a trigger
        moved to another triggerer keeps running in its old one (a triggerer that missed its heartbeats wakes up) until
        that one cancels it, and it must not write the lines this one writes again."""
        self.log_cursor = await self._stored_cursor() or self.log_cursor
        if self._xcom_target() is not None:
            self._writer_id = uuid.uuid4().hex
            await self._xcom_put(XCOM_LOG_WRITER, "writer", self._writer_id)

    async def _still_the_writer(self) -> bool:
        """False once a trigger started later for the task has claimed the job's log (read right before the lines
        would be written; an unreadable claim keeps this one writing)."""
        if not self._writer_id:
            return True
        claim = await self._xcom_job_value(XCOM_LOG_WRITER)
        if claim is not None and claim.get("writer") not in (None, self._writer_id):
            self._superseded = True
            self.log.info(
                "Another trigger of this task writes job %s's log lines now: this one stops", self.handle.job_id
            )
        return not self._superseded

    async def _stored_cursor(self) -> str | None:
        value = await self._xcom_job_value(XCOM_LOG_CURSOR)
        return None if value is None else str(value.get("cursor") or "") or None

    async def _store_cursor(self, cursor: str) -> None:
        await self._xcom_put(XCOM_LOG_CURSOR, "cursor", cursor)

    async def _xcom_job_value(self, key: str) -> dict[str, Any] | None:
        """The task instance's XCom ``key`` when it is this job's (None: another job's, none, or unreadable)."""
        target = self._xcom_target()
        if target is None:
            return None
        from airflow.sdk.bases.xcom import BaseXCom

        try:
            value = await BaseXCom.aget_one(key=key, **target)
        except Exception as exc:
            self.log.debug("Reading the XCom %s failed: %s", key, exc)
            return None
        return value if isinstance(value, dict) and value.get("job_id") == self.handle.job_id else None

    async def _xcom_put(self, key: str, field: str, value: str) -> None:
        """Keep ``{job_id, field: value}`` as the task instance's XCom ``key`` (best effort)."""
        target = self._xcom_target()
        if target is None:
            return
        from airflow.sdk.bases.xcom import BaseXCom

        try:
            await BaseXCom.aset(key=key, value={"job_id": self.handle.job_id, field: value}, **target)
        except Exception as exc:
            self.log.debug("Storing the XCom %s failed: %s", key, exc)

    async def _mask_secrets(self) -> None:
        """Mask every secret the job received -- found again here, never carried in the kwargs (see
        :mod:`~airflow_provider_tao.received_secrets`) -- in the job's lines and this triggerer's own log."""
        no_connection = self.handle.conn_id is None  # the platform's environment fallbacks gave the job its keys
        if not self.secret_conn_ids and not no_connection:
            return
        from airflow.sdk.log import amask_secret

        from airflow_provider_tao.received_secrets import asecrets_received, platform_default_secrets

        values = await asecrets_received(self.secret_conn_ids)
        if no_connection:
            values += await asyncio.to_thread(platform_default_secrets, self.handle.platform)
        self.writer.mask(values)
        for value in values:
            await amask_secret(value)

    async def on_kill(self) -> None:
        """The task was marked failed/success or cleared while deferred: cancel the job this try owns."""
        if not self.cancel_on_kill:
            self.log.info("cancel_on_kill=False: leaving job %s running", self.handle.job_id)
            return
        verdict = await self._kill_verdict()
        if verdict.act is Act.LEAVE:
            self.log.info("%s: leaving job %s running", verdict.why, self.handle.job_id)
            return
        # The triggerer cancels a trigger again at every state sync (about once a second) until it has finished,
        # and those cancels land in on_kill itself (Airflow 3.3 swallows them silently): a cancel that takes a few
        # remote round trips (SLURM: marks, status, scancel over SSH) was abandoned half-way. The cancel runs as a
        # task of its own that they cannot interrupt; on_kill waits for it up to the triggerer's on_kill_timeout.
        cancel = asyncio.ensure_future(self._cancel_job(adoptable=verdict.adoptable))
        _CANCELS.add(cancel)
        cancel.add_done_callback(_CANCELS.discard)
        deadline = time.monotonic() + _on_kill_timeout()
        while True:
            try:
                await asyncio.shield(cancel)
                return
            except asyncio.CancelledError:
                if cancel.cancelled() or time.monotonic() >= deadline:
                    raise
                if task := asyncio.current_task():
                    task.uncancel()  # a repeated cancel of the same kill: keep waiting for the cancel to finish
                if cancel.done():
                    return  # the cancel finished as the repeated cancel came: on_kill has done its work

    async def _kill_verdict(self) -> Verdict:
        """The decision's first half (operators/decisions.py, KILL) on the task's state, asked again while it
        cannot be read; the cancel routine decides on the job's owner and state (the job is taken as running
        here). Airflow 3.3 also calls on_kill when a trigger moves to another triggerer (the task still waits on
        the job there): canceling would cost a resubmission of the same job."""
        asks = TASK_STATE_ASKS if getattr(self, "task_instance", None) is not None else 1  # else: nobody to ask
        for ask in range(1, asks + 1):
            facts = Facts(
                try_number=self.handle.try_number, task_state=await self._task_state(), state=JobState.RUNNING,
                last_chance=ask == asks,
            )  # fmt: skip
            verdict = decide(facts, Situation.KILL)
            if verdict.act is not Act.LATER:
                break
            await asyncio.sleep(TASK_STATE_PAUSE)
        return verdict

    async def _task_state(self) -> Any:
        """The task instance's state now, asked through the triggerer's supervisor (the Task SDK's
        ``get_task_states``); None: cleared (no state); UNKNOWN when it cannot be told."""
        ti = getattr(self, "task_instance", None)
        if ti is None:
            return UNKNOWN
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
            return UNKNOWN
        return None if state is None else str(getattr(state, "value", state))

    async def _cancel_job(self, *, adoptable: bool) -> None:
        # Its own hook, never the poller's: run() is being cancelled at the same moment, and the poller's last
        # watcher leaving closes the poller's client under a cancel still in flight. Platforms that pool their
        # connection (SLURM) share it anyway; holding it here keeps it open until the cancel is done.
        hook = get_platform_hook(self.handle.platform, self.handle.conn_id)
        await hook.aload_connection()
        try:
            # As the operator's on_kill: a job that was stopped (or had just ended) is cleaned up too -- the task
            # will not resume to do it (a Brev instance of the task's own, a container with auto_remove) -- but for
            # what a cleared task's next try needs to adopt a job that completed on its own (``adoptable``)
            if (await self._cancel_until_done(hook)).over:
                await asyncio.to_thread(functools.partial(hook.cleanup_job, self.handle, adoptable=adoptable))
        finally:
            await hook.aclose()

    async def _cancel_until_done(self, hook: TAOPlatformHook) -> CancelOutcome:
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


async def stop_at_deadline(hook: TAOPlatformHook, handle: JobHandle, log: Any) -> None:
    """The task's deadline passed: cancel the job now (the cancel routine: this try's job only, a job that ended
    keeps its verdict), not when a worker resumes the task -- a task marked failed or success before it resumes
    never does, and its job would run on until the next sweep. A cancel that fails is the resumed task's to do."""
    try:
        outcome = await hook.acancel_job(handle)
        log.info("The task's execution_timeout passed: job %s %s", handle.job_id, outcome.value)
    except Exception as exc:
        log.warning("Canceling job %s at the task's deadline failed (%s): the resumed task does", handle.job_id, exc)


@functools.cache
def _class_logger(name: str) -> Any:
    return structlog.get_logger(name)


def _on_kill_timeout() -> float:
    """Seconds the triggerer grants ``on_kill`` (``[triggerer] on_kill_timeout``, 30 by default)."""
    from airflow.configuration import conf

    return float(conf.getint("triggerer", "on_kill_timeout", fallback=30))


def _status_after_wait(watch: Watch, poller: StatusPoller, last: JobStatus, wait: float) -> JobStatus:
    """The status the poller brought for ``watch``; with none (the poller is backing off), the last failure's
    reason, or that the platform gave no status for ``wait`` seconds."""
    if (fresh := watch.take_status()) is not None:
        return fresh
    poller.ensure_running()
    if last.state is not JobState.UNKNOWN:
        return JobStatus.unknown(f"no status from the {poller.hook.platform} platform for {wait:.1f} s")
    return last
