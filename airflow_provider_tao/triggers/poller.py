"""The per-connection batched status poller of :class:`~airflow_provider_tao.triggers.job.TAOJobTrigger`: every trigger
of one connection in one event loop shares one poll per interval, and each watched job's status is published to its
trigger."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from airflow_provider_tao.connections import runs_inline
from airflow_provider_tao.hooks import get_platform_hook
from airflow_provider_tao.hooks.base import TAOPlatformHook
from airflow_provider_tao.jobs import JobHandle, JobState, JobStatus
from airflow_provider_tao.settings import log_reads_per_interval, outage_report_seconds, trigger_event_hold_seconds
from airflow_provider_tao.triggers.heap import freeze_long_lived_heap
from airflow_provider_tao.triggers.log_budget import LogBudget

#: Upper bound of one batched status call; a hung backend must not hang the trigger.
STATUS_CALL_TIMEOUT = 60.0
#: Watches a poll wakes in one turn of the event loop (the triggers woken run before the next chunk is published).
PUBLISH_CHUNK = 250
MAX_BACKOFF_SECONDS = 30.0  # after an outage the first good poll must not come much later
NEW_JOB_POLL_GAP = 1.0  # seconds from one poll to an early one for newly watched jobs


@dataclass
class Watch:
    """One trigger's watch of its job: the statuses the poller publishes to it and its turns at reading the log."""

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
        self.watches: dict[int, Watch] = {}
        self.calls = 0  # backend calls made, for tests and benchmarks
        self.logs = LogBudget(None if hook.log_reads_batched else log_reads_per_interval())
        # [tao] settings its triggers use, read once per poller: a read costs more than a trigger's poll
        # The hold keeps an event clear of the scheduler's deferral race; `airflow dags test` has no scheduler.
        self.event_hold = 0.0 if runs_inline() else trigger_event_hold_seconds()
        self.outage_report = outage_report_seconds()
        self.restarts = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._timer_context = contextvars.Context()  # its watches' timers share it (see Watch.context)

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
        freeze_long_lived_heap()  # the first poller of the process: its imports, this client's too, are in place
        return cls._instances.setdefault(key, cls(hook))

    @classmethod
    def existing(cls, platform: str, conn_id: str | None) -> StatusPoller | None:
        return cls._instances.get(cls._key(platform, conn_id))

    def add(self, watch: Watch) -> None:
        """Poll ``watch``'s job from now on; :meth:`remove` ends it."""
        watch.context = self._timer_context
        self.watches[id(watch)] = watch
        self._wake.set()  # a new job is polled at once, not after the current interval
        self.ensure_running()

    async def remove(self, watch: Watch) -> None:
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
                if w.logs and is_running(statuses.get(w.handle.job_id)) and news(w.handle.job_id)
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


def is_running(status: JobStatus | None) -> bool:
    """A job whose log may grow: known and not ended."""
    return status is not None and status.state is not JobState.UNKNOWN and not status.state.is_terminal


def _ended(status: JobStatus | None) -> bool:
    return status is not None and status.state.is_terminal
