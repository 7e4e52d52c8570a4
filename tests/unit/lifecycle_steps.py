"""Scaffolding to interrupt a task's lifecycle at a named step and count its jobs on the backend itself.

A worker SIGKILL runs no ``except``, no ``finally`` that matters and no ``on_kill``: :class:`WorkerDied` is a
``BaseException`` the provider's code never catches, raised right after (or before) the named step, so what the
step did to the world stays and nothing after it happens. The counts read the backend (``/proc`` for the local
platform), never the provider's hooks, so a hook's own bug cannot hide a duplicate.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.fakeserver import alive

#: Steps of the lifecycle by name: (the class that owns the step, its method). Platform steps take the hook class.
STEPS = {
    "write-ahead": ("airflow_provider_tao.operators.failover.CapacityFailoverMixin", "_write_ahead"),
    "create": (None, "create_job"),
    "record": ("airflow_provider_tao.operators.submit.TAOSubmitOperator", "_keep"),
    "cancel": (None, "_cancel"),
    "start": (None, "_resume"),  # kubernetes: the suspended Job, its Secret and ConfigMaps exist; it starts
}


class WorkerDied(BaseException):
    """The worker process died at a step (SIGKILL, OOM, a lost host)."""


def die_at(
    monkeypatch: pytest.MonkeyPatch, step: str, *, hook: type | None = None, after: bool = True, times: int = 1
) -> None:
    """Make the worker die at ``step`` (a key of :data:`STEPS`): right after it returns (``after``) or right before
    it starts, the first ``times`` times it runs; later runs (the next try) go through."""
    owner_path, method = STEPS[step]
    owner: Any = hook
    if owner_path is not None:
        module, _, name = owner_path.rpartition(".")
        owner = getattr(__import__(module, fromlist=[name]), name)
    assert owner is not None, f"step {step!r} is a platform step: pass hook="
    die_in(monkeypatch, owner, method, after=after, times=times)


def die_in(monkeypatch: pytest.MonkeyPatch, owner: Any, method: str, *, after: bool = True, times: int = 1) -> None:
    """:func:`die_at` for any call: ``owner.method`` (a class's method, a client library's call)."""
    real = getattr(owner, method)
    left = {"n": times}

    @functools.wraps(real)
    def interrupted(*args: Any, **kwargs: Any) -> Any:
        if left["n"] <= 0:
            return real(*args, **kwargs)
        left["n"] -= 1
        if not after:
            raise WorkerDied(f"before {method}")
        real(*args, **kwargs)
        raise WorkerDied(f"after {method}")

    monkeypatch.setattr(owner, method, interrupted)


#: The results root of the test's local connection (set by its fixture): a job is this test's only if it writes
#: there -- another pytest on this machine (CI runs the unit tests on Python 3.12 beside the main suite) runs jobs of
#: the same names and ids, which this test must neither count nor kill.
RESULTS_ROOT: str | None = None


def _ours(environ: dict[str, str]) -> bool:
    return RESULTS_ROOT is None or environ.get("TAO_RESULTS_ROOT") == RESULTS_ROOT


def live_local_jobs(name: str) -> set[str]:
    """The job ids of the live processes of local jobs named ``name`` (their ``TAO_JOB_NAME``), from ``/proc``."""
    jobs = set()
    for pid in _pids():
        environ = _environ(pid)
        if environ.get("TAO_JOB_NAME") == name and _ours(environ) and alive(pid):
            jobs.add(environ["TAO_JOB_ID"])
    return jobs


def kill_local_job(job_id: str) -> int:
    """SIGKILL every process of the local job ``job_id`` (a crash the platform did not cause); how many."""
    killed = [pid for pid in _pids() if (env := _environ(pid)).get("TAO_JOB_ID") == job_id and _ours(env)]
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in killed:  # a job started by this process is its child: reap it, as a worker's init would
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return len(killed)


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
