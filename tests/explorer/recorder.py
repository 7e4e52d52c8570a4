"""Step boundaries found by instrumentation: every public method of a platform hook class and every write of the
``task_state_store`` is wrapped, so each call the lifecycle makes is numbered (``<phase>:<method>#<n>``) and an
interruption can be applied right after it. A platform call added to a hook later is a boundary without editing the
explorer; only the *read-only* names below are told apart (a kill right after a read equals a kill right before it).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from airflow_provider_tao.hooks.base import TAOPlatformHook
from tests.unit.fakes import Store

#: Method names that only read the world: a boundary after one is equivalent, for a kill, to the one before it.
READ_ONLY_PREFIXES = (
    "get_", "aget_", "read_", "aread_", "find_", "job_", "validate_", "check_", "list_", "watch_", "results_",
    "image_", "platform_", "consumed_by", "canceled_by", "cancel_requested_by", "probe_", "test_connection",
    "load_connection", "aload_connection", "setting", "default_", "runner_mount", "tao_env", "new_handle",
    "lease_expired", "aclose", "failure_", "store.get",
)  # fmt: skip


#: Helpers that compute from the connection and the spec without asking the platform: not steps of the lifecycle.
PURE = frozenset({
    "load_connection", "aload_connection", "setting", "job_name_for", "validate_name", "image_required", "tao_env",
    "new_handle", "results_dir_for", "default_results_root", "job_url", "job_location", "results_url",
    "watch_problem", "platform_details", "runner_mount_path", "aclose",
    # what the last poll or read already told (which logs grew, whether a read reached the log's end)
    "log_news", "log_read_reached_end",
    # SLURM: the job's paths, the scheduling plan and the SSH session are computed or opened, nothing is asked
    "layout", "plan", "results_root_for", "ssh_settings", "session", "close",
})  # fmt: skip


def read_only(label: str) -> bool:
    method = label.split(":", 1)[-1].split("#", 1)[0]
    return method.startswith(READ_ONLY_PREFIXES)


class Killed(BaseException):
    """The worker or triggerer process died right here: nothing after this line runs (no cleanup, no on_kill)."""


class Outage(ConnectionError):
    """The platform cannot be reached (the explorer's injected outage)."""


#: The recorder of the schedule running in this context (threads and tasks started from it inherit it).
CURRENT: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("explorer_recorder", default=None)
#: Calls the harness makes itself (the backend checks) are neither boundaries nor interrupted.
MUTED: contextvars.ContextVar[bool] = contextvars.ContextVar("explorer_muted", default=False)
#: The phase of the calls made in this context when it is not the task's (``cli``: ``airflow tao cancel``, which
#: runs beside the task's steps, its boundaries numbered apart so that theirs keep their numbers).
PHASE: contextvars.ContextVar[str | None] = contextvars.ContextVar("explorer_phase", default=None)


@contextmanager
def muted() -> Iterator[None]:
    token = MUTED.set(True)
    try:
        yield
    finally:
        MUTED.reset(token)


class Recorder:
    """Numbers the boundaries of one run and fires the schedule's interruption at its boundary.

    :param target: the boundary label to interrupt at (None: a clean run that only records).
    :param on_hit: called in the thread of the step that just passed ``target`` (raise to stop that step there).
    :param on_boundary: called at every boundary (the backend's invariants sampled as the run goes).
    """

    def __init__(
        self,
        target: str | None = None,
        on_hit: Callable[[str], None] | None = None,
        on_boundary: Callable[[str], None] | None = None,
    ) -> None:
        self.target = target
        self.on_hit = on_hit
        self.on_boundary = on_boundary
        self.phase = "execute"
        self.boundaries: list[str] = []
        self.counts: Counter[str] = Counter()
        self.fired: str | None = None
        self.outage_until = 0.0
        self.lock = threading.Lock()
        self.logs: list[str] = []  # the schedule's log lines, masked as Airflow masks them (I7)
        # what the schedule's worker processes would let go of by exiting (SLURM's SSH connections), at its end
        self.closers: list[Callable[[], None]] = []
        # the pair explorer (tests/explorer/pairs.py): a second fault once the first fired, and every decision
        self.second: str | None = None  # the boundary of the second fault
        self.on_second: Callable[[str], None] | None = None
        self.second_fired: str | None = None
        self.blips = 0  # the next platform calls that fail once each (a blip)
        self.decisions: list[tuple[int, str, str]] = []  # (boundaries passed, situation, the Facts' repr)
        self.task: Any = None  # the schedule's TaskSim: a person's cancel record is kept there

    def passed(self, name: str) -> None:
        with self.lock:
            key = f"{PHASE.get() or self.phase}:{name}"
            self.counts[key] += 1
            label = f"{key}#{self.counts[key]}"
            self.boundaries.append(label)
            hit = self.fired is None and label == self.target
            if hit:
                self.fired = label
            second = self.fired is not None and self.second_fired is None and label == self.second
            if second:
                self.second_fired = label
        if self.on_boundary is not None:
            with muted():
                self.on_boundary(label)
        if second and self.on_second is not None:  # first: the interruption's own may stop the step here
            self.on_second(label)
        if hit and self.on_hit is not None:
            self.on_hit(label)

    def decided(self, facts: Any, situation: Any) -> None:
        """A call of ``operators.decisions.decide``: the schedules reaching it with the same facts are one."""
        named = str(getattr(situation, "value", situation))
        with self.lock:
            self.decisions.append(
                (len(self.boundaries), f"{PHASE.get()}:{named}" if PHASE.get() else named, repr(facts))
            )

    def check_outage(self) -> None:
        with self.lock:
            blip, self.blips = self.blips > 0, max(0, self.blips - 1)
        if blip:
            raise Outage("explorer: the platform call failed once (a blip)")
        if time.time() < self.outage_until:
            raise Outage("explorer: the platform cannot be reached")


def _active() -> Recorder | None:
    return None if MUTED.get() else CURRENT.get()


def _wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            if (rec := _active()) is None:
                return await fn(*args, **kwargs)
            rec.check_outage()
            result = await fn(*args, **kwargs)
            await asyncio.to_thread(rec.passed, name)  # on_hit may block (a frozen triggerer step)
            return result

        return awrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if (rec := _active()) is None:
            return fn(*args, **kwargs)
        rec.check_outage()
        result = fn(*args, **kwargs)
        rec.passed(name)
        return result

    return wrapper


def instrument_hook(cls: type[TAOPlatformHook], patch: Callable[[Any, str, Any], None]) -> list[str]:
    """Wrap every public method the platform hook ``cls`` has from ``TAOPlatformHook`` down (not Airflow's
    ``BaseHook``); ``patch`` is ``monkeypatch.setattr``. Returns the wrapped names."""
    names: list[str] = []
    for klass in cls.__mro__:
        if not (isinstance(klass, type) and issubclass(klass, TAOPlatformHook)):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or name in names or name in PURE or not inspect.isfunction(value):
                continue
            patch(cls, name, _wrap(name, getattr(cls, name)))
            names.append(name)
    return names


class RecordingStore(Store):
    """``task_state_store`` whose writes are boundaries (the write-ahead, the record keeping)."""

    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        rec = _active()  # the metadata database is not the platform: an outage does not reach it
        super().set(key, value, retention=retention)
        if rec is not None:
            rec.passed(f"store.set[{key}]")
