"""A real ``airflow standalone`` for end-to-end tests, plus a REST client and process helpers.

The harness starts ``airflow standalone`` (on a PostgreSQL database it is given -- see ``postgres.py`` for why not
SQLite --, LocalExecutor, SimpleAuthManager with every request treated as admin) in a throw-away ``AIRFLOW_HOME`` on
free ports, waits until
``/api/v2/monitor/health`` reports the metadatabase, scheduler, triggerer and dag processor healthy, and
on shutdown kills its process groups and checks that nothing of it is left.

Process model (Airflow 3.3.2, measured on this machine)::

    airflow standalone                      <- session + process group leader (setsid; sid == pgid == pid)
    |- airflow scheduler
    |  |- airflow serve-logs                 <- [logging] worker_log_server_port
    |  `- airflow worker -- LocalExecutor: <idle> | <ti uuid>      x [core] parallelism (supervisors)
    |     `- airflow worker -- <ti uuid>      <- the task runner: runs execute(); OWN process group
    |- airflow dag-processor
    |- airflow api_server -- host:... port:...
    `- airflow triggerer
       |- airflow serve-logs                 <- [logging] trigger_log_server_port
       `- airflow triggerer                  <- forked trigger runner (asyncio loop), same title

Facts this module is built on:

* ``standalone`` starts each component once and never restarts it: a killed triggerer stays dead
  (its supervising thread just sees EOF, and never reaps it: it stays a zombie).
  :meth:`AirflowStandalone.start_triggerer` starts a replacement ``airflow triggerer`` with the same
  environment. It cannot join the standalone's process group: ``setpgid`` into a group of another
  session fails with ``EPERM``, and the standalone runs in a session of its own. So each
  replacement gets its own session too, and the instance is the *set of sessions* it started
  (:attr:`AirflowStandalone.sessions`); :meth:`AirflowStandalone.stop` signals every one of their
  process groups.
* The task supervisor forks the task runner into its *own* process group (``setpgid(0, 0)`` in
  ``airflow.sdk.execution_time.supervisor``), so running tasks are outside the standalone's process
  group but still in its session. Airflow never calls ``setsid``; only the standard provider's
  subprocess hook / bash sensor (and a job the provider detaches on purpose) leave the session.
  :meth:`AirflowStandalone.processes` therefore finds the instance by session id, plus any process
  whose environment carries this instance's :data:`MARKER_ENV` (catches detached children that
  inherited the environment).
* ``/proc/<pid>/environ`` is NOT reliable for Airflow's own processes: ``setproctitle`` (used by
  the LocalExecutor workers, the task runner, serve-logs, the api-server) overwrites the original
  argv+environ block, which then reads as NUL bytes. Process titles and session ids are reliable.
* The task runner retitles itself ``airflow worker -- <ti id>`` (padded with spaces) in
  ``task_runner.startup`` where ``<ti id>`` is the task instance UUID returned by the REST API (a new
  UUID per try); its supervisor is ``airflow worker -- LocalExecutor: <ti id>``. The REST task
  instance also carries ``pid`` = the task runner's pid, used as a cross-check.
* SIGKILL of the triggerer main process orphans its ``serve-logs`` child, which keeps the trigger
  log port bound, so a replacement triggerer cannot serve logs ("address already in use"; it runs on
  without a log server). :meth:`AirflowStandalone.kill_triggerer` therefore kills the whole
  triggerer subtree, like a crashed host would. SIGTERM stops the subtree cleanly in about 1 s.
* After a SIGKILL the dead triggerer's job row stays ``running``; its triggers are handed to another
  triggerer only once its heartbeat is older than ``[triggerer] triggerer_health_check_threshold``
  (30 s by default, :data:`DEFAULT_TRIGGERER_HEALTH_CHECK_THRESHOLD` here). After a SIGTERM the
  triggerer releases its triggers on the way out and a new one picks them up within seconds.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil

__all__ = [
    "DEFAULT_TRIGGERER_HEALTH_CHECK_THRESHOLD",
    "HEALTH_COMPONENTS",
    "MARKER_ENV",
    "TERMINAL_DAG_RUN_STATES",
    "TERMINAL_TI_STATES",
    "AirflowClient",
    "AirflowStandalone",
    "HarnessError",
    "HarnessTimeout",
    "StandaloneConfig",
    "StandaloneStats",
    "free_ports",
    "render_log_content",
    "wait_until",
]

MARKER_ENV = "TAO_E2E_HARNESS_ID"
"""Environment variable set to a unique id in every process the harness starts (inherited by children)."""

HEALTH_COMPONENTS: tuple[str, ...] = ("metadatabase", "scheduler", "triggerer", "dag_processor")
"""Components of ``/api/v2/monitor/health`` that must be ``healthy`` before tests start."""

TERMINAL_TI_STATES: frozenset[str] = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})
"""Task instance states after which nothing happens without a user action (clear)."""

TERMINAL_DAG_RUN_STATES: frozenset[str] = frozenset({"success", "failed"})

DEFAULT_TRIGGERER_HEALTH_CHECK_THRESHOLD = 15
"""Seconds without heartbeat after which a triggerer counts as dead (Airflow default 30; heartbeat every 5)."""

READ_ATTEMPTS = 3
"""Times a read (or a named write) of the REST API is sent while the API server does not answer (a timeout, a reset
connection)."""

_SIMPLE_AUTH_MANAGER = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"

T = TypeVar("T")

_WATCHDOG = """
import os, signal, sys, time
owner, sid, marker, grace = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].encode(), float(sys.argv[4])

def members():
    sessions, procs = {sid}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue
            procs[int(pid)] = int(fields[3])
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if marker in fh.read().split(b"\\0"):
                    sessions.add(int(fields[3]))
        except (OSError, IndexError, ValueError):
            pass
    return [pid for pid, s in procs.items() if s in sessions]

def kill_all(sig):
    for pid in members():
        try:
            os.kill(pid, sig)
        except OSError:
            pass

while os.getppid() == owner and members():
    time.sleep(1)
if members():
    print("owner", owner, "is gone: stopping sessions of", sid, flush=True)
    kill_all(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while members() and time.monotonic() < deadline:
        time.sleep(0.5)
    kill_all(signal.SIGKILL)
"""
"""Run by a watchdog process (own session) that stops the instance if the test process dies without stopping it."""


class HarnessError(RuntimeError):
    """The harness itself failed (Airflow did not start, a process could not be found or stopped...)."""


class HarnessTimeout(AssertionError):
    """A condition was not reached in time. An ``AssertionError`` so pytest reports it as a test failure."""


# ----------------------------------------------------------------------------------------------------------
# small utilities
# ----------------------------------------------------------------------------------------------------------


def wait_until(
    predicate: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.5,
    message: str | Callable[[], str] = "condition not met",
) -> T:
    """Call ``predicate`` until it returns a truthy value and return that value.

    :param predicate: called repeatedly; a truthy return value ends the wait.
    :param timeout: seconds before giving up.
    :param interval: seconds between calls.
    :param message: text (or a callable producing it, evaluated only on timeout) for the error.
    :raises HarnessTimeout: if ``timeout`` passes first.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise HarnessTimeout(f"timed out after {timeout:.0f}s: {text}")
        time.sleep(interval)


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct TCP ports that are free on all interfaces right now.

    The sockets are bound at the same time (so the ports differ) and closed before returning; the
    kernel does not hand out a recently used ephemeral port again soon, which keeps the race with
    other programs negligible.
    """
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("0.0.0.0", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def render_log_content(content: Sequence[Any]) -> str:
    """Turn the ``content`` list of the task log endpoint (``Accept: application/json``) into text.

    Items are either plain strings (unparsable log lines) or structured messages
    ``{"timestamp": ..., "event": ..., "level": ..., "logger": ..., <extra keys>}``. A structured
    message becomes ``<timestamp> [<level>] <logger>: <event> key=value ...``; the group markers
    Airflow inserts (``::group::...``) and the ``sources`` list are kept as lines too.
    """
    lines: list[str] = []
    for item in content:
        if isinstance(item, str):
            lines.append(item)
            continue
        if not isinstance(item, Mapping):
            lines.append(str(item))
            continue
        extra = {k: v for k, v in item.items() if k not in {"timestamp", "event", "level", "logger"}}
        parts: list[str] = []
        if item.get("timestamp"):
            parts.append(str(item["timestamp"]))
        if item.get("level"):
            parts.append(f"[{item['level']}]")
        if item.get("logger"):
            parts.append(f"{item['logger']}:")
        parts.append(str(item.get("event", "")))
        sources = extra.pop("sources", None)
        parts.extend(f"{k}={v}" for k, v in extra.items())
        lines.append(" ".join(parts))
        if isinstance(sources, list):
            lines.extend(f"  {s}" for s in sources)
    return "\n".join(lines)


def _describe(proc: psutil.Process) -> str:
    try:
        return f"pid={proc.pid} pgid={os.getpgid(proc.pid)} {' '.join(proc.cmdline())[:160]!r}"
    except (psutil.Error, OSError):
        return f"pid={proc.pid} (gone)"


def _is_running(proc: psutil.Process) -> bool:
    """True if ``proc`` exists and is not a zombie (zombies run nothing; init may reap them late)."""
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _wait_gone(procs: Sequence[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until none of ``procs`` runs (zombies count as gone); return those still running."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if _is_running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if _is_running(p)]
    return alive


def _title(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline()).strip()
    except psutil.Error:
        return ""


# ----------------------------------------------------------------------------------------------------------
# REST client
# ----------------------------------------------------------------------------------------------------------


class AirflowClient:
    """Typed helpers over the Airflow 3 public REST API (``/api/v2``) of one API server.

    Authentication is not needed: the harness runs the SimpleAuthManager with
    ``simple_auth_manager_all_admins``. Every method raises ``httpx.HTTPStatusError`` on an
    unexpected HTTP status. Task instance methods take ``map_index=-1`` for unmapped tasks.
    """

    def __init__(self, base_url: str, *, timeout: float = 30.0, server_logs: Callable[[], list[Path]] = list) -> None:
        """:param base_url: the API server root, e.g. ``http://127.0.0.1:41234``.
        :param server_logs: the instance's own logs (its executor's and supervisors' lines are there, not in a task
            log): a failure's description quotes their lines about the try.
        """
        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(base_url=f"{self.base_url}/api/v2", timeout=timeout)
        self.server_logs = server_logs

    def _server_lines(self, ti_id: str, limit: int = 40) -> str:
        """The instance's log lines naming the try (a supervisor's failed heartbeats, the executor's verdict): why a
        try ended that its task log cannot say, as when its process was killed."""
        found: list[str] = []
        for path in self.server_logs() if ti_id else []:
            with contextlib.suppress(OSError):
                found += [line for line in path.read_text(errors="replace").splitlines() if ti_id in line]
        return f"\n--- instance log lines naming try {ti_id} ---\n" + "\n".join(found[-limit:]) if found else ""

    def close(self) -> None:
        """Close the underlying HTTP connection pool."""
        self.http.close()

    # -- plumbing ------------------------------------------------------------------------------------------

    def _request(self, method: str, url: str, *, resend: bool | None = None, **kwargs: Any) -> httpx.Response:
        """One call of the REST API; an error status raises.

        :param resend: ask again after a transport error (the API server did not answer in time: a loaded machine
            starves the standalone's API server past its 30 s), as a deployment's client would. By default only a
            read is: a write may have been done. A write that names what it makes (a run's id) may be resent: its
            409 on a resend says the first was done, and is returned, not raised.
        """
        resend = method.upper() == "GET" if resend is None else resend
        for attempt in range(1, READ_ATTEMPTS + 1):
            try:
                response = self.http.request(method, url, **kwargs)
                break
            except httpx.TransportError:
                if not resend or attempt == READ_ATTEMPTS:
                    raise
        if attempt > 1 and method.upper() != "GET" and response.status_code == 409:
            return response
        if response.is_error:
            raise httpx.HTTPStatusError(
                f"{method} {url} -> {response.status_code}: {response.text[:2000]}",
                request=response.request,
                response=response,
            )
        return response

    def _json(self, method: str, url: str, **kwargs: Any) -> Any:
        return self._request(method, url, **kwargs).json()

    @staticmethod
    def _ti_path(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
        return path if map_index < 0 else f"{path}/{map_index}"

    # -- health and jobs -----------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``GET /monitor/health``: ``{component: {"status": "healthy"|"unhealthy", ...}}``."""
        result: dict[str, Any] = self._json("GET", "/monitor/health")
        return result

    def unhealthy_components(self, components: Collection[str] = HEALTH_COMPONENTS) -> list[str]:
        """Names of ``components`` that are not reported healthy (all of them if the API is down)."""
        try:
            health = self.health()
        except (httpx.HTTPError, ValueError):
            return list(components)
        return [c for c in components if (health.get(c) or {}).get("status") != "healthy"]

    def list_jobs(self, job_type: str | None = None, *, alive_only: bool = False) -> list[dict[str, Any]]:
        """``GET /jobs``, newest id first. ``job_type``: ``TriggererJob``, ``SchedulerJob``, ``DagProcessorJob``."""
        params: dict[str, Any] = {"order_by": "-id", "limit": 100}
        if job_type:
            params["job_type"] = job_type
        if alive_only:
            params["is_alive"] = True
        jobs: list[dict[str, Any]] = self._json("GET", "/jobs", params=params)["jobs"]
        return jobs

    def import_errors(self) -> list[dict[str, Any]]:
        """``GET /importErrors``: DAG files that failed to parse, with their stack traces."""
        errors: list[dict[str, Any]] = self._json("GET", "/importErrors", params={"limit": 100})["import_errors"]
        return errors

    # -- DAGs ----------------------------------------------------------------------------------------------

    def get_dag(self, dag_id: str) -> dict[str, Any] | None:
        """``GET /dags/<dag_id>``, or ``None`` while the DAG has not been parsed yet."""
        response = self.http.get(f"/dags/{dag_id}")
        if response.status_code == 404:
            return None
        if response.is_error:
            raise httpx.HTTPStatusError(
                f"GET /dags/{dag_id} -> {response.status_code}: {response.text[:2000]}",
                request=response.request,
                response=response,
            )
        dag: dict[str, Any] = response.json()
        return dag

    def wait_for_dag(self, dag_id: str, *, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until the DAG processor has parsed ``dag_id`` (not stale); show import errors on timeout."""

        def visible() -> dict[str, Any] | None:
            dag = self.get_dag(dag_id)
            return dag if dag and not dag.get("is_stale") else None

        def why() -> str:
            errors = self.import_errors()
            detail = "\n".join(f"--- {e.get('filename')}\n{e.get('stack_trace')}" for e in errors) or "none"
            return f"DAG {dag_id!r} not visible over the REST API. Import errors: {detail}"

        return wait_until(visible, timeout=timeout, interval=1.0, message=why)

    def set_dag_paused(self, dag_id: str, paused: bool) -> dict[str, Any]:
        """``PATCH /dags/<dag_id>`` with ``is_paused``."""
        dag: dict[str, Any] = self._json("PATCH", f"/dags/{dag_id}", json={"is_paused": paused})
        return dag

    def unpause_dag(self, dag_id: str) -> dict[str, Any]:
        """Unpause ``dag_id`` (new DAGs are paused at creation)."""
        return self.set_dag_paused(dag_id, False)

    # -- DAG runs ------------------------------------------------------------------------------------------

    def trigger_dag_run(
        self,
        dag_id: str,
        conf: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
        note: str | None = None,
    ) -> str:
        """``POST /dags/<dag_id>/dagRuns`` (``logical_date`` null, like a manual run) and return the run id. The run
        is named here (``manual__<now>_<random>`` unless ``run_id`` is given), so that a POST the API server did not
        answer in time can be sent again without making a second run."""
        now = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        body: dict[str, Any] = {
            "logical_date": None,
            "conf": dict(conf or {}),
            "dag_run_id": run_id or f"manual__{now}_{uuid.uuid4().hex[:8]}",
        }
        if note:
            body["note"] = note
        self._request("POST", f"/dags/{dag_id}/dagRuns", json=body, resend=True)
        return str(body["dag_run_id"])

    def get_dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        """``GET /dags/<dag_id>/dagRuns/<run_id>``."""
        run: dict[str, Any] = self._json("GET", f"/dags/{dag_id}/dagRuns/{run_id}")
        return run

    def get_dag_run_state(self, dag_id: str, run_id: str) -> str:
        """State of a DAG run: ``queued``, ``running``, ``success`` or ``failed``."""
        return str(self.get_dag_run(dag_id, run_id)["state"])

    def wait_for_dag_run(
        self,
        dag_id: str,
        run_id: str,
        states: Collection[str] = ("success",),
        *,
        timeout: float = 120.0,
        interval: float = 1.0,
    ) -> dict[str, Any]:
        """Wait until the run is in one of ``states``; fail at once on another terminal state."""
        wanted = set(states)
        last: dict[str, Any] = {}

        def check() -> dict[str, Any] | None:
            nonlocal last
            last = self.get_dag_run(dag_id, run_id)
            state = last["state"]
            if state in wanted:
                return last
            if state in TERMINAL_DAG_RUN_STATES:
                raise HarnessTimeout(
                    f"DAG run {dag_id}/{run_id} ended {state!r}, expected {sorted(wanted)}\n"
                    f"{self._task_states_text(dag_id, run_id)}"
                )
            return None

        return wait_until(
            check,
            timeout=timeout,
            interval=interval,
            message=lambda: (
                f"DAG run {dag_id}/{run_id} is {last.get('state')!r}, expected {sorted(wanted)}\n"
                f"{self._task_states_text(dag_id, run_id)}"
            ),
        )

    # -- task instances ------------------------------------------------------------------------------------

    def list_task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """``GET /dags/<dag_id>/dagRuns/<run_id>/taskInstances``."""
        tis: list[dict[str, Any]] = self._json("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")[
            "task_instances"
        ]
        return tis

    def _task_states_text(self, dag_id: str, run_id: str) -> str:
        try:
            tis = self.list_task_instances(dag_id, run_id)
        except httpx.HTTPError as exc:
            return f"(task instances unavailable: {exc})"
        return "task states: " + ", ".join(f"{ti['task_id']}={ti['state']}" for ti in tis)

    def get_task_instance(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, Any]:
        """``GET .../taskInstances/<task_id>``: includes ``id`` (per-try UUID), ``state``, ``try_number``,
        ``pid`` (task runner pid of the last worker execution), ``trigger`` (with ``triggerer_id``)
        and ``triggerer_job`` while deferred."""
        ti: dict[str, Any] = self._json("GET", self._ti_path(dag_id, run_id, task_id, map_index))
        return ti

    def get_task_instance_state(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str | None:
        """State of a task instance (``None`` = no status yet)."""
        state: str | None = self.get_task_instance(dag_id, run_id, task_id, map_index)["state"]
        return state

    def wait_for_task_instance(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        states: Collection[str],
        *,
        map_index: int = -1,
        timeout: float = 120.0,
        interval: float = 0.5,
        fail_states: Collection[str] | None = None,
    ) -> dict[str, Any]:
        """Poll until the task instance is in one of ``states`` and return it.

        :param fail_states: states that end the wait with a failure at once; by default every
            terminal state not in ``states``.
        :raises HarnessTimeout: on timeout or a fail state, with the task log of the current try.
        """
        wanted = set(states)
        bad = set(fail_states) if fail_states is not None else set(TERMINAL_TI_STATES) - wanted
        last: dict[str, Any] = {}

        def describe(prefix: str) -> str:
            try_number = int(last.get("try_number") or 0)
            log = self.get_task_log_safe(dag_id, run_id, task_id, try_number, map_index=map_index)
            return (
                f"{prefix}: task {dag_id}/{run_id}/{task_id}[{map_index}] is {last.get('state')!r} "
                f"(try {try_number}), expected {sorted(wanted)}\n"
                f"{self._task_states_text(dag_id, run_id)}\n--- task log (try {try_number}) ---\n{log}"
                f"{self._server_lines(str(last.get('id') or ''))}"
            )

        def check() -> dict[str, Any] | None:
            nonlocal last
            last = self.get_task_instance(dag_id, run_id, task_id, map_index)
            if last["state"] in wanted:
                return last
            if last["state"] in bad:
                raise HarnessTimeout(describe("reached a fail state"))
            return None

        return wait_until(check, timeout=timeout, interval=interval, message=lambda: describe("timeout"))

    def list_task_instance_tries(
        self, dag_id: str, run_id: str, task_id: str, map_index: int = -1
    ) -> list[dict[str, Any]]:
        """``GET .../taskInstances/<task_id>/tries``: one entry per try (history plus the current one)."""
        tries: list[dict[str, Any]] = self._json("GET", f"{self._ti_path(dag_id, run_id, task_id, map_index)}/tries")[
            "task_instances"
        ]
        return tries

    def set_task_instance_state(
        self, dag_id: str, run_id: str, task_id: str, new_state: str, *, map_index: int = -1
    ) -> list[dict[str, Any]]:
        """``PATCH .../taskInstances/<task_id>`` with ``new_state`` (``success``, ``failed``, ``skipped``)."""
        tis: list[dict[str, Any]] = self._json(
            "PATCH", self._ti_path(dag_id, run_id, task_id, map_index), json={"new_state": new_state}
        )["task_instances"]
        return tis

    def mark_task_instance_failed(
        self, dag_id: str, run_id: str, task_id: str, *, map_index: int = -1
    ) -> list[dict[str, Any]]:
        """Mark a task instance failed (as the UI does). On a deferred task this fires the trigger's ``on_kill``."""
        return self.set_task_instance_state(dag_id, run_id, task_id, "failed", map_index=map_index)

    def mark_task_instance_success(
        self, dag_id: str, run_id: str, task_id: str, *, map_index: int = -1
    ) -> list[dict[str, Any]]:
        """Mark a task instance successful (as the UI does). On a deferred task this also fires ``on_kill``."""
        return self.set_task_instance_state(dag_id, run_id, task_id, "success", map_index=map_index)

    def clear_task_instances(
        self,
        dag_id: str,
        run_id: str,
        task_ids: Sequence[str],
        *,
        only_failed: bool = False,
        include_downstream: bool = False,
        reset_dag_runs: bool = True,
    ) -> list[dict[str, Any]]:
        """``POST /dags/<dag_id>/clearTaskInstances`` (not a dry run); returns the cleared task instances."""
        body = {
            "dry_run": False,
            "dag_run_id": run_id,
            "task_ids": list(task_ids),
            "only_failed": only_failed,
            "include_downstream": include_downstream,
            "reset_dag_runs": reset_dag_runs,
        }
        tis: list[dict[str, Any]] = self._json("POST", f"/dags/{dag_id}/clearTaskInstances", json=body)[
            "task_instances"
        ]
        return tis

    def get_task_instance_links(
        self, dag_id: str, run_id: str, task_id: str, map_index: int = -1
    ) -> dict[str, str | None]:
        """``GET .../taskInstances/<task_id>/links``: ``{link name: url or None}`` (from the ``_link_*`` XComs)."""
        params = {"map_index": map_index} if map_index >= 0 else None
        links: dict[str, str | None] = self._json(
            "GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/links", params=params
        )["extra_links"]
        return links

    def get_xcom(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        key: str = "return_value",
        *,
        map_index: int = -1,
        decode: bool = True,
    ) -> Any:
        """Value of one XCom, decoded from JSON (``decode=False``: as the endpoint returned it -- a string XCom
        may come back bare, and a job id like ``812345e67890`` then decodes as a number); raises ``KeyError`` if it
        does not exist."""
        response = self.http.get(
            f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}",
            params={"map_index": map_index},
        )
        if response.status_code == 404:
            raise KeyError(f"no XCom {key!r} for {dag_id}/{run_id}/{task_id}[{map_index}]")
        if response.is_error:
            raise httpx.HTTPStatusError(
                f"GET xcom {key} -> {response.status_code}: {response.text[:2000]}",
                request=response.request,
                response=response,
            )
        value = response.json()["value"]
        # The native endpoint returns what the database holds: JSON text for values pushed by tasks.
        if isinstance(value, str) and decode:
            with contextlib.suppress(ValueError):
                return json.loads(value)
        return value

    def get_job_id(self, dag_id: str, run_id: str, task_id: str) -> str:
        """The job id a task pushed (XCom ``tao_job_id``), kept a string: a bare id like ``812345e67890`` would
        decode as a number."""
        value = str(self.get_xcom(dag_id, run_id, task_id, "tao_job_id", decode=False))
        return str(json.loads(value)) if value.startswith('"') else value  # JSON text of the string, or bare

    def get_task_log(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        try_number: int,
        *,
        map_index: int = -1,
        max_pages: int = 20,
    ) -> str:
        """Text of the task log for one try (worker log plus the merged triggerer log while/after deferral).

        Uses ``Accept: application/json`` and ``full_content=true``; follows ``continuation_token``
        while new lines keep coming (``max_pages`` at most). Structured lines are rendered by
        :func:`render_log_content`.
        """
        url = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}"
        params: dict[str, Any] = {"full_content": True}
        if map_index >= 0:
            params["map_index"] = map_index
        chunks: list[str] = []
        for _ in range(max_pages):
            data = self._json("GET", url, params=params, headers={"Accept": "application/json"})
            content = data.get("content") or []
            if content:
                chunks.append(render_log_content(content))
            token = data.get("continuation_token")
            if not token or not content:
                break
            params = {"token": token, **({"map_index": map_index} if map_index >= 0 else {})}
        return "\n".join(chunks)

    def get_task_log_safe(self, dag_id: str, run_id: str, task_id: str, try_number: int, *, map_index: int = -1) -> str:
        """Like :meth:`get_task_log` but returns an explanation instead of raising (for error messages)."""
        if try_number < 1:
            return "(no try has started)"
        try:
            return self.get_task_log(dag_id, run_id, task_id, try_number, map_index=map_index)
        except (httpx.HTTPError, ValueError) as exc:
            return f"(log unavailable: {exc})"

    def wait_for_trigger_owner(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        triggerer_job_id: int,
        *,
        map_index: int = -1,
        timeout: float = 90.0,
    ) -> dict[str, Any]:
        """Wait until the deferred task's trigger is assigned to triggerer job ``triggerer_job_id``."""
        last: dict[str, Any] = {}

        def check() -> dict[str, Any] | None:
            nonlocal last
            last = self.get_task_instance(dag_id, run_id, task_id, map_index)
            trigger = last.get("trigger") or {}
            if trigger.get("triggerer_id") == triggerer_job_id:
                return last
            if last["state"] != "deferred":
                raise HarnessTimeout(
                    f"{task_id} left 'deferred' (now {last['state']!r}) before its trigger was seen on "
                    f"triggerer job {triggerer_job_id}"
                )
            return None

        return wait_until(
            check,
            timeout=timeout,
            interval=1.0,
            message=lambda: (
                f"trigger of {task_id} not picked up by triggerer job {triggerer_job_id}: "
                f"state={last.get('state')!r} trigger={last.get('trigger')}"
            ),
        )


# ----------------------------------------------------------------------------------------------------------
# configuration and stats
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StandaloneConfig:
    """What a standalone instance is started with. Two equal configs can share one running instance.

    :param dags_folder: folder whose files are copied into the instance's DAGs folder.
    :param extra_dag_files: single files copied next to them (e.g. ``example_dags/x.py``).
    :param extra_env: extra environment for every Airflow process, e.g. ``AIRFLOW_CONN_<ID>``
        connections or ``AIRFLOW__<SECTION>__<KEY>`` settings; applied last, so it may override
        the harness defaults (not the ports, home, or marker).
    :param parallelism: ``[core] parallelism``: LocalExecutor worker processes.
    :param triggerer_health_check_threshold: ``[triggerer] triggerer_health_check_threshold``:
        how long after a triggerer crash its triggers are reassigned.
    :param pythonpath: directories prepended to ``PYTHONPATH`` of every Airflow process.
    :param startup_timeout: seconds to wait for a healthy instance.
    :param stop_grace: seconds between SIGTERM and SIGKILL of the process group at shutdown.
    """

    dags_folder: Path
    extra_dag_files: tuple[Path, ...] = ()
    extra_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    parallelism: int = 4
    triggerer_health_check_threshold: int = DEFAULT_TRIGGERER_HEALTH_CHECK_THRESHOLD
    pythonpath: tuple[Path, ...] = ()
    startup_timeout: float = 120.0
    stop_grace: float = 20.0


@dataclasses.dataclass
class StandaloneStats:
    """Measurements of one standalone instance (filled in while it runs)."""

    time_to_healthy: float | None = None
    """Seconds from launch to all :data:`HEALTH_COMPONENTS` healthy."""
    peak_pss_bytes: int = 0
    """Highest sampled sum of PSS (proportional set size) over all harness processes."""
    peak_rss_bytes: int = 0
    """Highest sampled sum of RSS (shared pages counted once per process) over all harness processes."""
    peak_processes: int = 0
    samples: int = 0
    stop_seconds: float | None = None
    """Seconds the shutdown took."""
    killed_at_stop: list[str] = dataclasses.field(default_factory=list)
    """Processes that needed SIGKILL, or lived outside the group, at shutdown."""
    triggerer_restarts: list[str] = dataclasses.field(default_factory=list)
    """Triggerers that died without a test stopping them, each restarted (its log's last line kept)."""

    def summary(self) -> str:
        """One line for reports."""
        healthy = f"{self.time_to_healthy:.1f}s" if self.time_to_healthy is not None else "n/a"
        stop = f"{self.stop_seconds:.1f}s" if self.stop_seconds is not None else "n/a"
        return (
            f"time to healthy {healthy}; peak PSS {self.peak_pss_bytes / 2**20:.0f} MiB, "
            f"peak RSS sum {self.peak_rss_bytes / 2**20:.0f} MiB, peak {self.peak_processes} processes "
            f"({self.samples} samples); stop {stop}; killed at stop: {len(self.killed_at_stop)}"
        )


# ----------------------------------------------------------------------------------------------------------
# the standalone instance
# ----------------------------------------------------------------------------------------------------------


class AirflowStandalone:
    """One ``airflow standalone`` in its own ``AIRFLOW_HOME`` and process group.

    Use as a context manager or call :meth:`start` / :meth:`stop`. After :meth:`start`,
    :attr:`client` talks to its API server, :attr:`env` is the environment of its processes and
    :attr:`stats` collects time to healthy and peak memory.
    """

    def __init__(self, config: StandaloneConfig, *, database_url: str, base_dir: Path | None = None) -> None:
        """:param database_url: the metadata database's SQLAlchemy URL (a new, empty database: ``standalone``
            migrates it).
        :param base_dir: where to create the instance directory (a new temp dir by default).
        """
        self.config = config
        self.database_url = database_url
        self.root = Path(tempfile.mkdtemp(prefix="airflow-e2e-", dir=base_dir))
        self.home = self.root / "home"
        self.dags_folder = self.home / "dags"
        self.log_path = self.home / "standalone.log"
        self.harness_id = uuid.uuid4().hex
        self.api_port, self.worker_log_port, self.trigger_log_port, self.health_port = free_ports(4)
        self.api_url = f"http://127.0.0.1:{self.api_port}"
        self.airflow_bin = str(Path(sys.executable).with_name("airflow"))
        self.env = self._build_env()
        self.stats = StandaloneStats()
        self.client = AirflowClient(self.api_url, server_logs=lambda: [self.log_path, *self._extra_logs])
        self._proc: subprocess.Popen[bytes] | None = None
        self._extra_procs: list[subprocess.Popen[bytes]] = []
        self.sessions: list[int] = []
        """Session ids of this instance: the standalone's, then one per replacement triggerer."""
        self._extra_logs: list[Path] = []
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._sampler: threading.Thread | None = None
        self._sampler_stop = threading.Event()
        # A triggerer runs unless a test stopped it: one that dies by itself is restarted (_supervise_triggerer)
        self._triggerer_wanted = True
        self._triggerer_lock = threading.RLock()

    # -- environment ---------------------------------------------------------------------------------------

    def _build_env(self) -> dict[str, str]:
        # Start from this process's environment without any Airflow settings, so a developer's or CI's
        # AIRFLOW_HOME / AIRFLOW__* / AIRFLOW_CONN_* cannot leak into the instance.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        bin_dir = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
        if self.config.pythonpath:
            paths = [str(p) for p in self.config.pythonpath]
            if env.get("PYTHONPATH"):
                paths.append(env["PYTHONPATH"])
            env["PYTHONPATH"] = os.pathsep.join(paths)
        fernet_key = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()
        env.update(
            {
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.database_url,
                # standalone forces these two; setting them up front keeps replacement processes identical.
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__AUTH_MANAGER": _SIMPLE_AUTH_MANAGER,
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
                "AIRFLOW__CORE__PARALLELISM": str(self.config.parallelism),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__FERNET_KEY": fernet_key,
                "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
                "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.api_port),
                "AIRFLOW__API__BASE_URL": self.api_url,
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.api_url}/execution/",
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.worker_log_port),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self.trigger_log_port),
                "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(self.health_port),
                "AIRFLOW__LOGGING__COLORED_CONSOLE_LOG": "False",
                # New files in the DAGs folder are noticed within REFRESH_INTERVAL seconds, changed
                # files are re-parsed after MIN_FILE_PROCESS_INTERVAL seconds.
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "10",
                "AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "2",
                # Airflow's own remedy for a busy API server ([workers] execution_api_timeout, 5 s by default): a
                # worker's "start" answered later than that is retried and refused, and the try dies after "Pre
                # Execute" (docs/troubleshooting.md). A test instance on a 2-core machine beside a CPU hog is one.
                "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
                "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": str(
                    self.config.triggerer_health_check_threshold
                ),
                "NO_COLOR": "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.config.extra_env)
        # Never overridable: the instance must stay isolated and findable.
        env.update(
            {
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__API__PORT": str(self.api_port),
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.worker_log_port),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self.trigger_log_port),
                MARKER_ENV: self.harness_id,
            }
        )
        return env

    # -- lifecycle -----------------------------------------------------------------------------------------

    @property
    def pgid(self) -> int:
        """Process group (and session) id of the ``airflow standalone`` process: its pid."""
        if self._proc is None:
            raise HarnessError("standalone not started")
        return self._proc.pid

    def is_running(self) -> bool:
        """True while the ``airflow standalone`` process lives (its components may still have died)."""
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> AirflowStandalone:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Copy the DAGs, launch ``airflow standalone`` in a new session (``setsid``) and wait until healthy.

        :raises HarnessError: if it exits or is not healthy within ``config.startup_timeout``
            (the message ends with the tail of ``standalone.log``); the instance is stopped first.
        """
        self.home.mkdir(parents=True)
        self._copy_dags()
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [self.airflow_bin, "standalone"],
                env=self.env,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.sessions.append(self._proc.pid)
        self._triggerer_wanted = True
        self._start_watchdog()
        self._start_sampler()
        try:
            self._wait_healthy(started)
        except BaseException:
            with contextlib.suppress(Exception):
                self.stop()
            raise
        self.stats.time_to_healthy = time.monotonic() - started  # from now on a dead triggerer is restarted

    def _start_watchdog(self) -> None:
        # A pytest killed by a CI timeout or ^C^C must not leave a 1 GiB Airflow behind on a machine that is
        # kept between sessions: this process (in a session of its own, without the marker) stops every
        # process of the instance's sessions as soon as its parent, the test process, is gone.
        with open(self.home / "watchdog.log", "ab") as log:
            self._watchdog = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _WATCHDOG,
                    str(os.getpid()),
                    str(self.pgid),
                    f"{MARKER_ENV}={self.harness_id}",
                    str(self.config.stop_grace),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _copy_dags(self) -> None:
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        if self.config.dags_folder.is_dir():
            shutil.copytree(self.config.dags_folder, self.dags_folder, ignore=ignore)
        else:
            raise HarnessError(f"DAGs folder {self.config.dags_folder} does not exist")
        for file in self.config.extra_dag_files:
            shutil.copy2(file, self.dags_folder / file.name)

    def _wait_healthy(self, started: float) -> None:
        deadline = started + self.config.startup_timeout
        missing: list[str] = list(HEALTH_COMPONENTS)
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise HarnessError(
                    f"airflow standalone exited with {self._proc.returncode} before it was healthy\n{self.log_tail()}"
                )
            missing = self.client.unhealthy_components()
            if not missing:
                return
            time.sleep(0.5)
        raise HarnessError(
            f"airflow standalone not healthy after {self.config.startup_timeout:.0f}s "
            f"(not healthy: {', '.join(missing)})\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 80) -> str:
        """Last ``lines`` lines of ``standalone.log`` and of every replacement triggerer's log."""
        parts: list[str] = []
        for path in [self.log_path, *self._extra_logs]:
            try:
                text = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError as exc:
                text = [f"(unreadable: {exc})"]
            parts.append(f"--- tail of {path} ---\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self) -> None:
        """Stop everything: SIGTERM the process group of every session of the instance (the standalone's
        and each replacement triggerer's), SIGKILL after ``config.stop_grace`` seconds.

        Processes of the instance outside those groups (task runners, jobs they detached) are
        SIGKILLed afterwards and listed in ``stats.killed_at_stop``.

        :raises HarnessError: if any process of the instance survives SIGKILL.
        """
        if self._proc is None:
            return
        began = time.monotonic()
        with self._triggerer_lock:  # no restart from here on
            self._triggerer_wanted = False
        self._sampler_stop.set()
        if self._watchdog is not None:
            self._watchdog.kill()
            self._watchdog.wait()
            self._watchdog = None
        groups = list(self.sessions)  # a session leader also leads a process group with the same id
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
        if not self._wait_groups_empty(groups, self.config.stop_grace):
            for pgid in groups:
                leftovers = self._group_members(pgid)
                self.stats.killed_at_stop.extend(f"SIGKILL after grace: {_describe(p)}" for p in leftovers)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            self._wait_groups_empty(groups, 10)
        for proc in [self._proc, *self._extra_procs]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        # Processes in other groups (task runners, detached jobs) that belong to this instance.
        strays = self.processes()
        for proc in strays:
            self.stats.killed_at_stop.append(f"outside the groups: {_describe(proc)}")
            with contextlib.suppress(psutil.Error):
                proc.kill()
        _wait_gone(strays, 10)
        if self._sampler is not None:
            self._sampler.join(timeout=5)
        self.client.close()
        self.stats.stop_seconds = time.monotonic() - began
        survivors = self.processes()
        self._proc = None
        if survivors:
            raise HarnessError(
                "processes of the standalone survived SIGKILL: " + "; ".join(_describe(p) for p in survivors)
            )

    @staticmethod
    def _group_members(pgid: int) -> list[psutil.Process]:
        members = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if os.getpgid(proc.pid) == pgid and _is_running(proc):
                    members.append(proc)
        return members

    def _wait_groups_empty(self, groups: Sequence[int], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # Reap our own children (standalone, replacement triggerers) so they do not linger as zombies.
            for proc in [self._proc, *self._extra_procs]:
                if proc is not None:
                    proc.poll()
            if not any(self._group_members(pgid) for pgid in groups):
                return True
            time.sleep(0.2)
        return False

    # -- memory sampling -----------------------------------------------------------------------------------

    def _start_sampler(self) -> None:
        self._sampler_stop.clear()
        self._sampler = threading.Thread(target=self._sample_loop, name="airflow-e2e-memory", daemon=True)
        self._sampler.start()

    def _sample_loop(self) -> None:
        while not self._sampler_stop.wait(1.0):
            self.sample_memory()
            self._supervise_triggerer()

    def _supervise_triggerer(self) -> None:
        """Restart a triggerer that died while no test stopped it, as a deployment's process supervisor does:
        ``airflow standalone`` never restarts its own, and Airflow 3.3's triggerer exits on a
        ``StaleDataError`` when a trigger's event races a clear of its task instance (seen in a CI rehearsal:
        every later test of the shared matrix standalone then found no triggerer)."""
        with self._triggerer_lock:
            try:
                healthy = self.stats.time_to_healthy is not None
                if not self._triggerer_wanted or not healthy or self.find_triggerer() is not None:
                    return
            except HarnessError:  # two at once (a suspended one beside its replacement): a test's doing
                return
            last = self.log_tail(3).splitlines()[-1:]
            self.stats.triggerer_restarts.append(f"{time.strftime('%H:%M:%S')}: {' '.join(last)[:300]}")
            print(f"\nairflow-e2e: the triggerer died by itself, restarting it ({last})", file=sys.stderr)
            self.start_triggerer()

    def sample_memory(self) -> tuple[int, int, int]:
        """Sum PSS and RSS over all processes of the instance; update the peaks; return (pss, rss, count)."""
        pss = rss = count = 0
        for proc in self.processes():
            with contextlib.suppress(psutil.Error):
                info = proc.memory_full_info()
                pss += getattr(info, "pss", 0)
                rss += info.rss
                count += 1
        self.stats.samples += 1
        self.stats.peak_pss_bytes = max(self.stats.peak_pss_bytes, pss)
        self.stats.peak_rss_bytes = max(self.stats.peak_rss_bytes, rss)
        self.stats.peak_processes = max(self.stats.peak_processes, count)
        return pss, rss, count

    # -- processes -----------------------------------------------------------------------------------------

    def processes(self) -> list[psutil.Process]:
        """Every live (non-zombie) process of this instance: all processes of its :attr:`sessions`
        (whatever their process group, e.g. task runners), plus any process whose environment
        carries this instance's :data:`MARKER_ENV` (children that left the session but kept the
        environment, as long as they did not retitle themselves)."""
        sessions = set(self.sessions)
        marker = f"{MARKER_ENV}={self.harness_id}".encode()
        found: list[psutil.Process] = []
        for proc in psutil.process_iter():
            try:
                if os.getsid(proc.pid) in sessions:
                    found.append(proc)
                    continue
                with open(f"/proc/{proc.pid}/environ", "rb") as fh:
                    if marker in fh.read().split(b"\0"):
                        found.append(proc)
            except (OSError, psutil.Error):
                continue
        return [p for p in found if _is_running(p)]

    def process_tree_text(self) -> str:
        """``pid ppid pgid sid title`` of every process of the instance, for diagnostics."""
        rows = []
        for proc in sorted(self.processes(), key=lambda p: p.pid):
            with contextlib.suppress(psutil.Error, OSError):
                rows.append(
                    f"{proc.pid:>7} {proc.ppid():>7} {os.getpgid(proc.pid):>7} {os.getsid(proc.pid):>7} "
                    f"{_title(proc)[:120]}"
                )
        return "    pid    ppid    pgid     sid title\n" + "\n".join(rows)

    # triggerer ----------------------------------------------------------------------------------------------

    @staticmethod
    def _is_triggerer_cmd(proc: psutil.Process) -> bool:
        try:
            cmd = proc.cmdline()
        except psutil.Error:
            return False
        return len(cmd) >= 2 and cmd[-1] == "triggerer" and Path(cmd[-2]).name == "airflow"

    def find_triggerer(self) -> psutil.Process | None:
        """The live ``airflow triggerer`` main process (not its forked trigger runner), or ``None``."""
        mains = []
        for proc in self.processes():
            if not self._is_triggerer_cmd(proc):
                continue
            try:
                parent = proc.parent()
            except psutil.Error:
                continue
            if parent is None or not self._is_triggerer_cmd(parent):
                mains.append(proc)
        if len(mains) > 1:
            raise HarnessError("more than one triggerer running:\n" + self.process_tree_text())
        return mains[0] if mains else None

    def kill_triggerer(self, sig: signal.Signals = signal.SIGKILL, *, timeout: float = 45.0) -> list[int]:
        """Stop the running triggerer and return the pids of its process tree.

        ``SIGKILL`` simulates a crash: the whole subtree (trigger runner, ``serve-logs``) is killed
        at once, so no trigger gets a chance to clean up and the log server port is freed.
        ``SIGTERM`` is a graceful stop: the triggerer releases its triggers (``cleanup()`` runs,
        ``on_kill()`` does not); anything of the subtree still alive after ``timeout`` is SIGKILLed
        and reported as an error.

        :raises HarnessError: if no triggerer runs, or the tree does not go away.
        """
        with self._triggerer_lock:
            main = self.find_triggerer()
            if main is None:
                raise HarnessError("no triggerer is running:\n" + self.process_tree_text())
            self._triggerer_wanted = False  # stopped on purpose: not restarted until a test starts one
        tree = [main, *main.children(recursive=True)]
        self.stop_process_tree(tree, sig, timeout=timeout)
        return [p.pid for p in tree]

    @staticmethod
    def stop_process_tree(tree: Sequence[psutil.Process], sig: signal.Signals, *, timeout: float = 45.0) -> None:
        """Stop a process tree (``tree[0]`` its root): SIGKILL kills all at once, other signals go to the root.

        :raises HarnessError: if part of the tree is still alive after ``timeout`` (it is SIGKILLed then).
        """
        main = tree[0]
        if sig == signal.SIGKILL:
            for proc in tree:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        else:
            main.send_signal(sig)
        # Not psutil.wait_procs: the killed main is a child of ``standalone``, which never reaps it, so it
        # stays a zombie; _is_running() counts zombies as gone.
        alive = _wait_gone(tree, timeout)
        if alive:
            for proc in alive:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            raise HarnessError(
                f"process tree still alive {timeout:.0f}s after {sig.name}; SIGKILLed: "
                + "; ".join(_describe(p) for p in alive)
            )

    def suspend_triggerer(self) -> list[psutil.Process]:
        """SIGSTOP the running triggerer's whole tree (a triggerer that misses its heartbeats but lives on).

        :returns: the stopped processes; SIGCONT them to let the triggerer find out it lost its triggers.
        :raises HarnessError: if no triggerer runs.
        """
        with self._triggerer_lock:
            main = self.find_triggerer()
            if main is None:
                raise HarnessError("no triggerer is running:\n" + self.process_tree_text())
            self._triggerer_wanted = False
        tree = [main, *main.children(recursive=True)]
        for proc in tree:
            proc.send_signal(signal.SIGSTOP)
        return tree

    def start_triggerer(self, extra_env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start a replacement ``airflow triggerer`` with the instance's environment, in a new session.

        Its session joins :attr:`sessions`, so :meth:`processes`, :meth:`stop` and the watchdog cover
        it. Its output goes to ``triggerer-<n>.log`` in the home (included in :meth:`log_tail`).

        :param extra_env: overrides, e.g. another log server port while a suspended triggerer holds the first.
        """
        with self._triggerer_lock:
            self._triggerer_wanted = True
            return self._start_triggerer_process(extra_env)

    def _start_triggerer_process(self, extra_env: Mapping[str, str] | None) -> subprocess.Popen[bytes]:
        log_path = self.home / f"triggerer-{len(self._extra_procs) + 1}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [self.airflow_bin, "triggerer"],
                env={**self.env, **(extra_env or {})},
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._extra_procs.append(proc)
        self.sessions.append(proc.pid)
        self._extra_logs.append(log_path)
        return proc

    def ensure_triggerer(self, *, timeout: float = 60.0) -> psutil.Process:
        """Return the running triggerer; if there is none, start one and wait until its job heartbeats."""
        with self._triggerer_lock:
            main = self.find_triggerer()
            if main is not None:
                return main
            before = {int(j["id"]) for j in self.client.list_jobs("TriggererJob")}
            proc = self.start_triggerer()

        def ready() -> bool:
            if proc.poll() is not None:
                raise HarnessError(f"triggerer exited with {proc.returncode}\n{self.log_tail()}")
            jobs = self.client.list_jobs("TriggererJob", alive_only=True)
            return any(int(j["id"]) not in before for j in jobs)

        wait_until(ready, timeout=timeout, interval=0.5, message="new triggerer not heartbeating")
        found = self.find_triggerer()
        if found is None:
            raise HarnessError("triggerer started but not found:\n" + self.process_tree_text())
        return found

    def restart_triggerer(self, sig: signal.Signals = signal.SIGKILL, *, timeout: float = 60.0) -> tuple[int, int]:
        """Kill the triggerer with ``sig``, start a replacement, wait until its job heartbeats.

        :returns: ``(old_job_id, new_job_id)`` of the ``TriggererJob`` rows. Use
            :meth:`AirflowClient.wait_for_trigger_owner` with ``new_job_id`` to wait until a deferred
            task's trigger has moved over (after a SIGKILL that takes up to
            ``config.triggerer_health_check_threshold`` seconds).
        """
        # a busy machine delays heartbeats (and a triggerer that died by itself is being restarted): wait for one
        alive = wait_until(
            lambda: self.client.list_jobs("TriggererJob", alive_only=True) or None,
            timeout=timeout, interval=0.5, message="no alive TriggererJob before restart",
        )  # fmt: skip
        old_id = int(alive[0]["id"])
        self.kill_triggerer(sig)
        proc = self.start_triggerer()

        def new_job() -> int | None:
            if proc.poll() is not None:
                raise HarnessError(f"replacement triggerer exited with {proc.returncode}\n{self.log_tail()}")
            jobs = self.client.list_jobs("TriggererJob", alive_only=True)
            return next((int(j["id"]) for j in jobs if int(j["id"]) > old_id), None)

        new_id = wait_until(new_job, timeout=timeout, interval=0.5, message="replacement triggerer not heartbeating")
        return old_id, new_id

    # task runner -----------------------------------------------------------------------------------------

    def find_task_runner(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        *,
        map_index: int = -1,
        timeout: float = 60.0,
    ) -> psutil.Process:
        """Wait for and return the process executing the task's current try (the one running ``execute``).

        Identification: the REST task instance's ``id`` (a UUID per try) appears in the process title
        the runner sets for itself, ``airflow worker -- <id>``; in the first milliseconds after the
        fork it still carries its supervisor's title ``airflow worker -- LocalExecutor: <id>``, so a
        child of the supervisor that leads its own process group also counts. When the REST ``pid`` is
        set it must agree. Only processes of this instance (:meth:`processes`) are considered.
        """
        last_ti: dict[str, Any] = {}

        def lookup() -> psutil.Process | None:
            nonlocal last_ti
            last_ti = self.client.get_task_instance(dag_id, run_id, task_id, map_index)
            if last_ti["state"] not in ("queued", "running", "scheduled"):
                return None
            ti_id = str(last_ti["id"])
            candidates: list[psutil.Process] = []
            for proc in self.processes():
                title = _title(proc)
                if title == f"airflow worker -- {ti_id}":
                    candidates.append(proc)
                elif title.endswith(f"LocalExecutor: {ti_id}"):
                    with contextlib.suppress(psutil.Error, OSError):
                        candidates.extend(c for c in proc.children() if os.getpgid(c.pid) == c.pid and _is_running(c))
            unique = {p.pid: p for p in candidates}
            if last_ti.get("pid"):
                unique = {pid: p for pid, p in unique.items() if pid == last_ti["pid"]} or unique
            if len(unique) > 1:
                raise HarnessError(f"several task runners for {ti_id}:\n{self.process_tree_text()}")
            return next(iter(unique.values()), None)

        return wait_until(
            lookup,
            timeout=timeout,
            interval=0.2,
            message=lambda: (
                f"no task runner for {dag_id}/{run_id}/{task_id}: state={last_ti.get('state')!r} "
                f"id={last_ti.get('id')}\n{self.process_tree_text()}"
            ),
        )

    def kill_task_runner(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        *,
        map_index: int = -1,
        sig: signal.Signals = signal.SIGKILL,
        whole_group: bool = False,
        timeout: float = 60.0,
    ) -> int:
        """Find the task runner of the task's current try, send it ``sig`` and wait until it is gone.

        The supervisor notices the death and reports the try failed, so Airflow's retry logic
        applies. ``whole_group=True`` signals the runner's process group instead (it leads its own),
        which also hits subprocesses it started without a new session.

        :returns: the pid that was signalled.
        """
        proc = self.find_task_runner(dag_id, run_id, task_id, map_index=map_index, timeout=timeout)
        if whole_group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        wait_until(
            lambda: not _is_running(proc), timeout=30, interval=0.1, message=f"{_describe(proc)} survived {sig.name}"
        )
        return int(proc.pid)

    # DAG files -------------------------------------------------------------------------------------------

    def write_dag_file(self, name: str, source: str) -> Path:
        """Write a DAG file into the instance's DAGs folder (noticed within ``REFRESH_INTERVAL`` = 5 s)."""
        path = self.dags_folder / name
        tmp = path.with_suffix(".tmp")
        tmp.write_text(source)
        tmp.replace(path)
        return path
