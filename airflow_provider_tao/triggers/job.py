"""``TAOJobTrigger``: watches one job on any platform from the triggerer, and the poller that batches them.

Every trigger of one (platform, connection) in a triggerer process shares one :class:`StatusPoller`: it asks the
platform for the status of *all* watched jobs in one call per interval (``aget_job_statuses``) and hands each
trigger its job's status. While waiting, a trigger copies the job's new log lines into the task log by byte offset.

The event contract (a plain dict, see :class:`TriggerOutcome`): ``status`` is one of ``complete``, ``error``,
``canceled``, ``timeout`` (the task's deadline passed), ``unreachable`` (the platform could not be asked for too
long -- not a job failure), plus ``handle``, ``job_status``, ``log_offset`` and ``message``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_tao.hooks import get_platform_hook
from airflow_provider_tao.hooks.base import TAOPlatformHook
from airflow_provider_tao.jobs import JobHandle, JobState, JobStatus

#: How long the platform may stay unanswerable before the trigger gives up with ``unreachable``.
DEFAULT_MAX_UNKNOWN_SECONDS = 600.0
#: Upper bound of one batched status call; a hung backend must not hang the trigger.
STATUS_CALL_TIMEOUT = 60.0
MAX_BACKOFF_SECONDS = 30.0  # after an outage the first good poll must not come much later


class TriggerOutcome:
    """Names of the trigger's event statuses (the operator's resume contract)."""

    COMPLETE = "complete"
    ERROR = "error"
    CANCELED = "canceled"
    TIMEOUT = "timeout"
    UNREACHABLE = "unreachable"

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

    One instance per event loop and connection (the triggerer runs all triggers on one loop). It starts with its
    first watcher and stops when the last one leaves. Failed calls publish ``Unknown`` and back off.

    :param hook: the platform hook (connection already loaded).
    """

    _instances: ClassVar[dict[tuple[int, str, str | None], StatusPoller]] = {}

    def __init__(self, hook: TAOPlatformHook) -> None:
        self.hook = hook
        self.watches: dict[int, _Watch] = {}
        self.calls = 0  # backend calls made, for tests and benchmarks
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def for_hook(cls, hook: TAOPlatformHook) -> StatusPoller:
        key = (id(asyncio.get_running_loop()), hook.platform, hook.conn_id)
        poller = cls._instances.get(key)
        if poller is None:
            poller = cls._instances[key] = cls(hook)
        return poller

    @contextlib.asynccontextmanager
    async def watch(self, handle: JobHandle, interval: float) -> AsyncIterator[_Watch]:
        watch = _Watch(handle, interval)
        self.watches[id(watch)] = watch
        self._wake.set()  # a new job is polled at once, not after the current interval
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"tao-poller-{self.hook.platform}-{self.hook.conn_id}")
        try:
            yield watch
        finally:
            del self.watches[id(watch)]
            if not self.watches:
                self._stop()

    def _stop(self) -> None:
        for key, poller in list(self._instances.items()):
            if poller is self:
                del self._instances[key]
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        backoff = 0.0
        while self.watches:
            self._wake.clear()
            watches = list(self.watches.values())
            handles = list({w.handle.job_id: w.handle for w in watches}.values())
            statuses = await self._poll(handles)
            failed = all(s.state is JobState.UNKNOWN for s in statuses.values())
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
    :param log_offset: byte offset of the job log already shown.
    :param stream_logs: copy new log lines into the task log while deferred.
    :param cancel_on_kill: cancel the job when the task is marked failed/success or cleared while deferred.
    :param max_unknown_seconds: how long the platform may be unanswerable before giving up (``unreachable``).
    """

    def __init__(
        self,
        *,
        handle: dict[str, Any],
        poll_interval: float = 10.0,
        deadline: float | None = None,
        log_offset: int = 0,
        stream_logs: bool = True,
        cancel_on_kill: bool = True,
        max_unknown_seconds: float = DEFAULT_MAX_UNKNOWN_SECONDS,
    ) -> None:
        super().__init__()
        self.handle = JobHandle.from_json(handle)
        self.poll_interval = float(poll_interval)
        self.deadline = None if deadline is None else float(deadline)
        self.log_offset = int(log_offset)
        self.stream_logs = bool(stream_logs)
        self.cancel_on_kill = bool(cancel_on_kill)
        self.max_unknown_seconds = float(max_unknown_seconds)
        self._partial_line = ""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_provider_tao.triggers.job.TAOJobTrigger",
            {
                "handle": self.handle.to_json(),
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
                "log_offset": self.log_offset,
                "stream_logs": self.stream_logs,
                "cancel_on_kill": self.cancel_on_kill,
                "max_unknown_seconds": self.max_unknown_seconds,
            },
        )

    async def _hook(self) -> TAOPlatformHook:
        hook = get_platform_hook(self.handle.platform, self.handle.conn_id)
        await hook.aload_connection()
        return hook

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = await self._hook()
        unknown_since: float | None = None
        self.log.info("Watching %s job %s (%s)", hook.platform, self.handle.job_id, self.handle.name)
        status = JobStatus.unknown("no status yet")
        async with StatusPoller.for_hook(hook).watch(self.handle, self.poll_interval) as watch:
            while True:
                wait = self.poll_interval * 4
                if self.deadline is not None:
                    wait = min(wait, max(0.0, self.deadline - time.time()))
                try:
                    status = await asyncio.wait_for(watch.updates.get(), timeout=wait)
                except TimeoutError:
                    # No fresh answer (the poller is backing off): keep the last failure's reason.
                    if status.state is not JobState.UNKNOWN:
                        status = JobStatus.unknown(f"no status from the {hook.platform} platform for {wait:.1f} s")
                if self.stream_logs:
                    await self._stream_logs(hook)
                if self.deadline is not None and time.time() >= self.deadline:
                    yield self._event(TriggerOutcome.TIMEOUT, status, "the task's execution_timeout passed")
                    return
                if status.state is JobState.ERROR and (note := await self._resubmitted(hook, status)):
                    self.log.warning("Job %s: %s", self.handle.job_id, note)
                    continue
                if status.state.is_terminal:
                    if self.stream_logs:
                        await self._stream_logs(hook, final=True)
                    yield self._event(TriggerOutcome.BY_STATE[status.state], status, status.message)
                    return
                if status.state is JobState.UNKNOWN:
                    unknown_since = unknown_since or time.time()
                    if time.time() - unknown_since >= self.max_unknown_seconds:
                        yield self._event(TriggerOutcome.UNREACHABLE, status, status.message)
                        return
                else:
                    unknown_since = None

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
                "log_offset": self.log_offset,
                "message": message,
            }
        )

    async def _stream_logs(self, hook: TAOPlatformHook, final: bool = False) -> None:
        """Copy complete new log lines into the task log; a trailing partial line waits for its newline."""
        try:
            text, self.log_offset = await hook.aget_job_logs(self.handle, self.log_offset)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # logs are best effort: never fail the watch over them
            self.log.debug("Reading the job log failed: %s", exc)
            return
        lines = (self._partial_line + text).split("\n")
        self._partial_line = lines.pop()  # the text after the last newline: an unfinished line, or ""
        if final and self._partial_line:
            lines.append(self._partial_line)
        for line in lines:
            self.log.info("[job] %s", line)

    async def on_kill(self) -> None:
        """The task was marked failed/success or cleared while deferred: cancel the job this try owns."""
        if not self.cancel_on_kill:
            self.log.info("cancel_on_kill=False: leaving job %s running", self.handle.job_id)
            return
        hook = await self._hook()
        await hook.acancel_job(self.handle)
