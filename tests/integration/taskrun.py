"""Run ``TAOSubmitOperator`` tasks against a real backend the way Airflow does, without an Airflow server.

* :class:`Triggerer` is one event loop in a background thread, like the triggerer process: every trigger of the
  test session runs there, so they share the per-connection status poller and the cached SSH connection.
* :func:`start` runs ``execute`` (worker side) until the task defers, round-trips the trigger through
  ``serialize()`` as the triggerer does, and starts its ``run()`` on the triggerer loop.
* :func:`finish` waits for the trigger's event and resumes the task with ``execute_complete`` (worker side);
  :func:`follow` does so through every re-deferral of the same try (a capacity failover defers again).
* :func:`kill` is "mark the task failed while deferred": the triggerer cancels ``run()`` and calls ``on_kill()``.
* :func:`worker_process` runs a task synchronously in a worker process of its own (to SIGKILL or SIGTERM it) and
  :func:`wait_submitted` waits until its log says the job was submitted; with a :class:`FileStore` its
  ``task_state_store`` outlives it, as Airflow's (in the metadata database) does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import importlib
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_tao.operators.submit import TAOSubmitOperator
from airflow_provider_tao.triggers.job import TAOJobTrigger
from tests.unit.fakes import Store, make_context


class FileStore(Store):
    """``task_state_store`` in a JSON file shared by the processes of a test (a worker, then its retry)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property  # type: ignore[override]
    def data(self) -> dict[str, Any]:
        return dict(json.loads(self.path.read_text())) if self.path.exists() else {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        assert value is not None
        data = self.data
        data[key] = value
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)  # a reader never sees half a store


class Triggerer:
    """A background event loop standing in for the triggerer process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="triggerer", daemon=True)
        self.thread.start()

    def submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Any, timeout: float = 60) -> Any:
        return self.submit(coro).result(timeout)

    def close(self) -> None:
        async def _shutdown() -> None:
            if (ssh := sys.modules.get("airflow_provider_tao.hooks.slurm.ssh")) is not None:
                ssh.AsyncPool.drop_connections()

        self.call(_shutdown(), timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


async def first_event(trigger: TAOJobTrigger) -> dict[str, Any]:
    events = cast("AsyncGenerator[Any, None]", trigger.run())
    try:
        event = await events.__anext__()
    finally:
        await events.aclose()
    return event.payload


@dataclass
class TaskRun:
    op: TAOSubmitOperator
    context: dict[str, Any]
    store: Store
    deferred: TaskDeferred
    trigger: TAOJobTrigger
    future: concurrent.futures.Future[dict[str, Any]]
    triggerer: Triggerer
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def handle(self) -> dict[str, Any]:
        return self.trigger.handle.to_json()

    @property
    def job_id(self) -> str:
        return self.trigger.handle.job_id

    @property
    def backend_job_id(self) -> str:
        return self.trigger.handle.backend_job_id


def make_operator(conn_id: str = "tao_slurm_ci", **kwargs: Any) -> TAOSubmitOperator:
    """A deferrable operator polling every second, on the SLURM CI connection unless told otherwise."""
    defaults: dict[str, Any] = {
        "task_id": "train",
        "conn_id": conn_id,
        "gpu_count": 0,
        "deferrable": True,
        "poll_interval": 1.0,
    }
    return TAOSubmitOperator(**{**defaults, **kwargs})


def start(
    triggerer: Triggerer,
    op: TAOSubmitOperator,
    *,
    store: Store | None = None,
    try_number: int = 1,
    run_id: str | None = None,
) -> TaskRun:
    store = store or Store()
    context = make_context(store, try_number, run_id or f"manual__{uuid.uuid4().hex[:10]}")
    try:
        op.execute(context)  # type: ignore[arg-type]
    except TaskDeferred as deferred:
        return _deferred(triggerer, op, context, store, deferred)
    raise AssertionError("the operator did not defer")


def _deferred(
    triggerer: Triggerer, op: TAOSubmitOperator, context: dict[str, Any], store: Store, deferred: TaskDeferred
) -> TaskRun:
    classpath, kwargs = deferred.trigger.serialize()
    module, _, name = classpath.rpartition(".")
    trigger = getattr(importlib.import_module(module), name)(**kwargs)  # what the triggerer rebuilds
    future = triggerer.submit(first_event(trigger))
    return TaskRun(op, context, store, deferred, trigger, future, triggerer)


def event_of(run: TaskRun, timeout: float = 120) -> dict[str, Any]:
    if not run.events:
        run.events.append(run.future.result(timeout))
    return run.events[0]


def finish(run: TaskRun, timeout: float = 120) -> Any:
    """The trigger's event, then ``execute_complete`` on a fresh operator (as a worker resumes the task)."""
    event = event_of(run, timeout)
    resumed = copy.copy(run.op)  # a worker resumes with a fresh operator: nothing from execute() survives
    resumed._handle = None
    return getattr(resumed, run.deferred.method_name)(run.context, event=event)


def follow(run: TaskRun, timeout: float = 120) -> tuple[Any, list[TaskRun]]:
    """:func:`finish`, through every re-deferral of the same try; the result and every deferral it went through."""
    runs = [run]
    while True:
        try:
            return finish(runs[-1], timeout), runs
        except TaskDeferred as deferred:
            runs.append(_deferred(run.triggerer, run.op, run.context, run.store, deferred))


def kill(run: TaskRun) -> None:
    """The task is marked failed while deferred: the triggerer cancels ``run()`` and calls ``on_kill()``, which
    reads the task's state as a triggerer's supervisor answers it then (``failed``)."""

    async def marked_failed() -> str:
        return "failed"

    run.future.cancel()
    run.trigger._task_state = marked_failed  # type: ignore[method-assign]
    run.triggerer.call(run.trigger.on_kill(), timeout=60)


_WORKER = """
import json, signal, sys
from pathlib import Path
from airflow_provider_tao.operators.submit import TAOSubmitOperator
from tests.integration.taskrun import FileStore
from tests.unit.fakes import Store, make_context
kwargs = {"task_id": "train", "conn_id": sys.argv[1], "image": sys.argv[2], "command": sys.argv[4], "gpu_count": 0,
          "deferrable": False, "poll_interval": 1, **json.loads(sys.argv[5])}
op = TAOSubmitOperator(**kwargs)
context = make_context(FileStore(Path(sys.argv[6])) if sys.argv[6] else Store(), 1, sys.argv[3])
def stop(signum, frame):  # what the task runner does when the task is told to stop
    op.on_kill()
    sys.exit(1)
signal.signal(signal.SIGTERM, stop)
print("TAO_TEST_JOB_NAME", op._job_name(context, op._hook()), flush=True)
op.execute(context)
"""


def worker_process(
    conn_id: str, image: str, run_id: str, command: str, *, store: FileStore | None = None, **operator_kwargs: Any
) -> tuple[subprocess.Popen[str], str]:
    """A worker process running try 1 of the task synchronously; returns it and the job name it prints first.
    Without a ``store`` nothing it stores survives it (its ``task_state_store`` dies with it); with one, what it
    stored is there for the retry. SIGTERM makes it call ``on_kill`` as the task runner does.

    :param operator_kwargs: more ``TAOSubmitOperator`` arguments (JSON values).
    """
    argv = [conn_id, image, run_id, command, json.dumps(operator_kwargs), str(store.path) if store else ""]
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert worker.stdout is not None
    while not (line := worker.stdout.readline()).startswith("TAO_TEST_JOB_NAME "):  # past any log line before it
        assert line, "the worker ended before it named its job"
    return worker, line.split()[1]


def wait_submitted(worker: subprocess.Popen[str], platform: str) -> str:
    """Until the worker's log says a job was submitted on ``platform`` (``create_job`` returned); that log line."""
    assert worker.stdout is not None
    while f"Submitted {platform} job" not in (line := worker.stdout.readline()):
        assert line, "the worker ended before it submitted"
    return line
