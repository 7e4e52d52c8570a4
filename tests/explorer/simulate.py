"""One task instance run to its end as Airflow would, with one interruption at one step boundary.

The worker is this thread (``execute``, then ``execute_complete`` on a fresh operator after each deferral); the
triggerer is an event loop of its own per trigger run (:class:`~tests.integration.taskrun.Triggerer`), so a
triggerer's death is its loop's end and its restart a new loop with a trigger rebuilt from the serialized kwargs.
Tries share one ``task_state_store``; a retriable failure gives a new try up to ``MAX_TRIES``.

Interruptions (``INTERRUPTIONS``), applied right after the boundary's step returned:

* ``worker_kill``: the worker dies there (:class:`~tests.explorer.recorder.Killed`): no cleanup, no ``on_kill``;
  Airflow then retries the task.
* ``triggerer_kill``: the triggerer dies there (its loop ends, no ``on_kill``); a restarted one runs the trigger again.
* ``clear``: the try is stopped as Airflow stops it (worker: ``on_kill``; deferred: the trigger is cancelled and its
  ``on_kill`` runs with the task no longer deferred), then a new try starts.
* ``mark_failed`` / ``mark_success``: as ``clear``, and the task ends there.
* ``cli_cancel``: a person runs ``airflow tao cancel`` on the task's recorded job (the CLI's cancel routine); the
  task goes on.
* ``execution_timeout``: the deadline passes there: on the worker ``AirflowTaskTimeout`` is raised in the step and
  ``on_kill`` runs (Airflow's timeout); while deferred the trigger's deadline is now.
* ``outage``: from there on every platform call fails for ``OUTAGE_POLLS`` poll intervals.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from airflow.sdk.exceptions import AirflowFailException, AirflowTaskTimeout, TaskDeferred

from airflow_provider_tao.hooks import get_platform_hook
from airflow_provider_tao.person_cancel import CANCEL_KEY
from airflow_provider_tao.records import STATE_KEY, JobRecord
from airflow_provider_tao.triggers.job import TAOJobTrigger
from airflow_provider_tao.triggers.poller import StatusPoller
from tests.explorer.backends import JOBS
from tests.explorer.recorder import CURRENT, PHASE, Killed, Recorder, RecordingStore, muted, read_only
from tests.integration.taskrun import Triggerer, first_event, make_operator
from tests.unit.fakes import make_context

INTERRUPTIONS = (
    "worker_kill",
    "triggerer_kill",
    "clear",
    "mark_failed",
    "mark_success",
    "cli_cancel",
    "execution_timeout",
    "outage",
)
#: Interruptions that stop a process; after a read-only step they equal the same one before it (pruned).
STOPS = frozenset({"worker_kill", "triggerer_kill", "clear", "mark_failed", "mark_success", "execution_timeout"})
WORKER_PHASES = frozenset({"execute", "resume"})
MAX_TRIES = 4
OUTAGE_POLLS = 2.5
#: Interruptions the provider receives through the same code path as another (pruned, see :func:`explored`).
EQUIVALENT = {"mark_success": "mark_failed"}
#: The task instance's state once stopped by an interruption (a clear's: none, until scheduled).
STOPPED_STATES: dict[str, str | None] = {"clear": None, "mark_failed": "failed", "mark_success": "success"}
#: Repeated polls of one phase past this occurrence re-read the same state: equivalent boundaries (pruned).
POLL_OCCURRENCES = 2


@dataclass(frozen=True)
class Schedule:
    """(platform, job, boundary, interruption); ``boundary`` None is the clean run that finds the boundaries.
    ``job`` is a key of :data:`tests.explorer.backends.JOBS`."""

    platform: str
    job: str = "ok"
    boundary: str | None = None
    interruption: str | None = None

    def reproducer(self) -> str:
        return (
            f"TAO_EXPLORE_PLATFORMS={self.platform} TAO_EXPLORE_BOUNDARY='{self.boundary}' "
            "python -m pytest -p no:cacheprovider tests/explorer "
            f"-k '{self.platform} and {self.job} and {self.interruption}'"
        )


def explored(boundaries: list[str], interruption: str) -> list[str]:
    """The boundaries of a clean run ``interruption`` is applied at; the rest are equivalent to one of them:

    * a worker exists only in the worker phases (``execute``, ``resume``), a trigger only in ``trigger``;
    * stopping a process right after a read equals stopping it right before, i.e. after the step before the read --
      but for the first poll of a deferred job (the only boundary where the task waits in the triggerer);
    * a read repeated with no step changing the world in between reads the same state: only its first
      ``POLL_OCCURRENCES`` repetitions are kept (for a stop, its first);
    * ``mark_success`` equals ``mark_failed`` (:data:`EQUIVALENT`): Airflow delivers both alike -- the worker gets
      SIGTERM and ``on_kill`` (the task runner sees its state changed by someone else), a deferred task's trigger
      is cancelled and its ``on_kill`` runs -- and no provider code reads which of the two the state became (the
      trigger's ``on_kill`` asks only whether the task is still ``deferred``; the sweeper counts neither as
      waiting).
    """
    if interruption in EQUIVALENT:
        return []
    chosen = []
    since_step: dict[str, int] = {}
    for boundary in boundaries:
        phase, call = boundary.split(":", 1)
        method = call.rsplit("#", 1)[0]
        if not read_only(boundary):
            since_step = {}
        else:
            since_step[phase + method] = since_step.get(phase + method, 0) + 1
        if interruption == "worker_kill" and phase not in WORKER_PHASES:
            continue  # no worker runs while the task is deferred
        if interruption == "triggerer_kill" and phase != "trigger":
            continue  # no trigger runs while the worker does
        if read_only(boundary):
            repeat = since_step[phase + method]
            if interruption in STOPS and not (phase == "trigger" and repeat == 1):
                continue
            if repeat > POLL_OCCURRENCES:
                continue
        chosen.append(boundary)
    return chosen


class Stopped(BaseException):
    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


@dataclass
class Outcome:
    """How the task instance ended and what happened on the way."""

    state: str = ""  # success | failed
    result: Any = None
    error: str = ""
    tries: int = 0
    fired: str | None = None
    boundaries: list[str] = field(default_factory=list)
    person_cancel: dict[str, Any] | None = None
    live_seen: int = 0  # most live jobs of the task instance seen at once (I1)
    job_name: str = ""
    run_id: str = ""
    ended_at: float = 0.0
    live_at_end: set[str] = field(default_factory=set)  # jobs still live the moment the task ended
    trigger_kwargs: list[str] = field(default_factory=list)  # every deferral's serialized kwargs (I7)
    logs: list[str] = field(default_factory=list)


class TaskSim:
    """Runs one schedule.

    :param backend: the platform's backend observer (see :mod:`tests.explorer.backends`).
    :param schedule: what to interrupt where.
    """

    def __init__(self, backend: Any, schedule: Schedule) -> None:
        self.backend = backend
        self.schedule = schedule
        self.store = RecordingStore()
        self.run_id = f"explore__{uuid.uuid4().hex[:10]}"
        self.rec = Recorder(schedule.boundary, on_hit=self._hit, on_boundary=self._sample)
        self.outcome = Outcome(run_id=self.run_id)
        self.frozen = threading.Event()  # a triggerer step waits there for the simulator to act
        self.release = threading.Event()
        self.event_hit = False
        self.trigger: TAOJobTrigger | None = None
        self.ti_state: str | None = "running"  # the task instance's Airflow state (a person's cancel reads it)
        self.max_tries = MAX_TRIES
        self.rec.task = self
        # persons' cancels under way: one runs in the thread of the step it landed in (a triggerer's poll, while the
        # task goes on), and the outcome waits for what the CLI told the person
        self.cli_calls = 0
        self.cli_done = threading.Condition()

    # ----------------------------------------------------------------- the interruption

    def _hit(self, label: str) -> None:
        kind = self.schedule.interruption
        phase = label.split(":", 1)[0]
        if kind == "cli_cancel":
            self._person_cancel()
        elif kind == "outage":
            self.rec.outage_until = time.time() + OUTAGE_POLLS * self.backend.poll_interval
        elif phase in WORKER_PHASES or phase == "on_kill":
            if kind == "worker_kill":
                raise Killed("worker")
            if kind == "execution_timeout":
                raise AirflowTaskTimeout("explorer: the task's execution_timeout passed")
            raise Stopped(str(kind))
        elif kind == "execution_timeout":
            assert self.trigger is not None
            self.trigger.deadline = time.time()
        elif label.startswith("trigger:event#"):
            self.event_hit = True  # the trigger has ended: the simulator acts on the event it made
        else:  # triggerer_kill, clear, mark_*: the step stops here until the simulator has acted
            self.frozen.set()
            self.release.wait(120)
            raise Killed("triggerer")

    def _person_cancel(self) -> None:
        """A person's cancel (:meth:`_cancel_as_person`), counted so that the outcome waits for its end."""
        with self.cli_done:
            self.cli_calls += 1
        try:
            self._cancel_as_person()
        finally:
            with self.cli_done:
                self.cli_calls -= 1
                self.cli_done.notify_all()

    def _cancel_as_person(self) -> None:
        """``airflow tao cancel <job>``: the CLI's routine (:func:`~airflow_provider_tao.canceling.cancel_as_person`)
        on the job Airflow has recorded, its cancel record kept in the task's store (:meth:`person_record`). Its
        platform calls are boundaries of their own (``cli:<method>#<n>``): the pair explorer's second fault lands
        inside it too."""
        from airflow_provider_tao.canceling import cancel_as_person
        from airflow_provider_tao.jobindex import record_jobs

        with muted():
            record = JobRecord.from_json(self.store.get(STATE_KEY))
            if record is None:
                self.outcome.person_cancel = {"job_id": None, "note": "no recorded job yet: nothing to cancel"}
                return
            handle = record.job
            hook = get_platform_hook(handle.platform, handle.conn_id)
            hook.load_connection()
            live = handle.job_id in self.backend.live_ids(handle.name)  # the backend's look, for the report
        ti = {"dag_id": "dag", "run_id": self.run_id, "task_id": "train", "map_index": -1}
        job = record_jobs(record, ti_state=self.ti_state, ti_try=None, ti_end=None, **ti)[0]
        token = PHASE.set("cli")
        try:
            row = cancel_as_person(job, hook, "cli:explorer")
        except Exception as exc:  # the CLI ends in an error: the person knows nothing was canceled
            row = {"was": None, "canceled": False, "state": None, "note": f"the CLI failed: {exc!r}"[:300]}
        finally:
            PHASE.reset(token)
            getattr(hook, "close", lambda: None)()
        # what the CLI told the person: the task fails ERR_CANCELED (its routine found the job running and
        # marked it, or kept the cancel for the task's next try), or the job had ended and is left as it was
        promised = "ERR_CANCELED" in row["note"] and self.ti_state not in ("failed", "success")
        if not (self.outcome.person_cancel or {}).get("stopped"):  # a second person's cancel changes nothing
            self.outcome.person_cancel = {"job_id": handle.job_id, "was_live": live, "stopped": promised,
                                          "at": time.time(), "told": {k: row[k] for k in ("was", "canceled",
                                          "state", "note")}}  # fmt: skip

    def person_record(self, value: dict[str, Any] | None = None) -> tuple[str, str | None]:
        """The CLI's view of the task instance (its id and state) and, with ``value``, its cancel record kept
        (:mod:`airflow_provider_tao.person_cancel`'s metadata database reads and writes, here the schedule's)."""
        if value is not None:
            self.store.set(CANCEL_KEY, value)
        return f"ti-{self.outcome.tries}", self.ti_state

    def _sample(self, label: str) -> None:
        # a job only starts at a step (create, a resubmission): after a read the count cannot have grown
        if self.outcome.job_name and not read_only(label):
            live = len(self.backend.live_ids(self.outcome.job_name))
            self.outcome.live_seen = max(self.outcome.live_seen, live)

    # ----------------------------------------------------------------- Airflow

    def run(self) -> Outcome:
        token = CURRENT.set(self.rec)
        try:
            self._run()
        finally:
            CURRENT.reset(token)
            self.release.set()
            with self.cli_done:  # a safety net only: a CLI routine ends in a few platform calls
                self.cli_done.wait_for(lambda: not self.cli_calls, timeout=300)
            for close in self.rec.closers:
                with contextlib.suppress(Exception):
                    close()
        if self.outcome.job_name:
            self.outcome.live_at_end = self.backend.live_ids(self.outcome.job_name)
        self.outcome.fired = self.rec.fired
        self.outcome.boundaries = list(self.rec.boundaries)
        self.outcome.logs = list(self.rec.logs)
        self.outcome.ended_at = time.time()
        return self.outcome

    def _run(self) -> None:
        try_number = 1
        while True:
            self.outcome.tries = try_number
            end = self._try(try_number)
            if end == "retry" and try_number < self.max_tries:
                try_number += 1
                # Airflow's retry_delay (minutes) outlasts the explorer's outage (a few polls)
                time.sleep(max(0.0, self.rec.outage_until - time.time()))
                continue
            if end == "retry":
                self.outcome.state = "failed"
                self.outcome.error = self.outcome.error or "out of tries"
            return

    def _operator(self) -> Any:
        return make_operator(**self.backend.operator_kwargs(JOBS[self.schedule.job]))

    def _try(self, try_number: int) -> str:
        op = self._operator()
        context = make_context(self.store, try_number, self.run_id)
        self.ti_state = "running"
        if not self.outcome.job_name:
            with muted():
                self.outcome.job_name = op._job_name(context, op._hook())
        self.rec.phase = "execute"
        step: Any = lambda: op.execute(context)  # noqa: E731
        while True:
            try:
                self.outcome.result = step()
                self.outcome.state = "success"
                return "end"
            except TaskDeferred as deferred:
                pending = deferred
            except BaseException as exc:
                return self._worker_ended(op, exc)
            try:
                self.rec.passed("defer")  # the deferral is reported; the worker exits
            except BaseException as exc:
                return self._worker_ended(op, exc)
            event = self._deferred(pending)
            if isinstance(event, str):
                return event
            self.rec.phase = "resume"
            self.ti_state = "running"
            resumed = copy.copy(op)  # a worker resumes with a fresh operator
            resumed._handle = None
            op = resumed
            step = lambda op=resumed, event=event, method=pending.method_name: getattr(op, method)(  # noqa: E731
                context, event=event
            )

    def _worker_ended(self, op: Any, exc: BaseException) -> str:
        if isinstance(exc, Killed):
            self.outcome.error = "worker killed"
            return "retry"
        if isinstance(exc, Stopped | AirflowTaskTimeout):
            self.ti_state = STOPPED_STATES.get(getattr(exc, "kind", ""), "running")
            self._run_on_kill(op.on_kill)
            if isinstance(exc, AirflowTaskTimeout) or exc.kind == "clear":
                self.outcome.error = str(exc)
                return "retry"
            self.outcome.state = "failed" if exc.kind == "mark_failed" else "success"
            self.outcome.error = exc.kind
            return "end"
        self.outcome.error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, AirflowFailException):
            self.outcome.state = "failed"
            return "end"
        if not isinstance(exc, Exception):
            raise exc
        return "retry"

    def _run_on_kill(self, call: Any) -> None:
        self.rec.phase = "on_kill"
        try:
            call()
        except Exception as exc:  # Airflow logs an on_kill that fails and goes on
            self.outcome.error = f"on_kill failed: {exc}"

    def _deferred(self, deferred: TaskDeferred) -> dict[str, Any] | str:
        """The trigger runs (and is restarted after a triggerer's death) until it makes its event; or the task was
        stopped while deferred ("retry" for a clear, "end" for a mark)."""
        classpath, kwargs = deferred.trigger.serialize()
        self.outcome.trigger_kwargs.append(json.dumps(kwargs, default=str))
        assert classpath.endswith("TAOJobTrigger")
        self.ti_state = "deferred"
        while True:
            self.rec.phase = "trigger"
            triggerer = Triggerer()
            self.trigger = trigger = TAOJobTrigger(**kwargs)  # what a triggerer rebuilds from the database
            future = triggerer.submit(first_event(trigger))
            while not future.done() and not self.frozen.wait(0.02):
                pass
            if not self.frozen.is_set():
                try:
                    event = future.result()
                except BaseException as exc:
                    _close(triggerer)
                    self.outcome.error = f"trigger failed: {exc!r}"
                    return "retry"
                self.rec.passed("event")
                if not self.event_hit:
                    _close(triggerer)
                    return event
                self.event_hit = False
                _close(triggerer)
                if self.schedule.interruption == "triggerer_kill":
                    continue  # the event was not saved: the restarted triggerer runs the trigger again
                return self._stopped_after_event()
            # a step of the trigger is frozen at the boundary
            self.frozen.clear()
            future.cancel()
            kind = str(self.schedule.interruption)
            if kind == "triggerer_kill":
                self.release.set()
                _close(triggerer)
                continue
            state = {"clear": "scheduled", "mark_failed": "failed", "mark_success": "success"}[kind]

            async def task_state(state: str = state) -> str:
                return state

            trigger._task_state = task_state  # type: ignore[method-assign]
            self.ti_state = STOPPED_STATES[kind]
            time.sleep(0.05)  # the cancel reaches run() first, as the triggerer's does
            self.release.set()
            self.rec.phase = "on_kill"
            self._run_on_kill(functools.partial(_on_kill, triggerer, trigger))
            _close(triggerer)
            if kind == "clear":
                self.outcome.error = "cleared"
                return "retry"
            self.outcome.state = "failed" if kind == "mark_failed" else "success"
            self.outcome.error = kind
            return "end"

    def _stopped_after_event(self) -> str:
        """Cleared or marked once the trigger's event is made: no trigger left to kill, the task does not resume."""
        kind = str(self.schedule.interruption)
        if kind == "clear":
            return "retry"
        self.outcome.state = "failed" if kind == "mark_failed" else "success"
        self.outcome.error = kind
        return "end"


def _on_kill(triggerer: Triggerer, trigger: TAOJobTrigger) -> None:
    triggerer.call(trigger.on_kill(), timeout=120)


def _close(triggerer: Triggerer) -> None:
    """The triggerer process ends: its loop stops and what it held in memory (its pollers) is gone."""
    loop_id = id(triggerer.loop)

    async def _cancel_rest() -> None:
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()

    try:
        triggerer.call(_cancel_rest(), timeout=10)
        triggerer.close()
    except Exception:  # a loop that will not stop is left to the daemon thread's end
        pass
    for key in [k for k in StatusPoller._instances if k[0] == loop_id]:
        del StatusPoller._instances[key]
