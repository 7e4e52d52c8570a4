"""The ``brev`` platform: each job is a Docker container ``tao-job-<job_id>`` on an NVIDIA Brev GPU instance.

Everything goes through the ``brev`` CLI (:mod:`~airflow_provider_tao.hooks.brev_cli`: a private session per
connection, the token never on a command line). An instance is either *reused* (``backend_details["instance_id"]``;
it is never deleted) or *ephemeral*: one per task instance, named after it (the job's deterministic name, so a retry
finds it again), created with the connection's or the job's ``instance_type`` fallback chain, waited for (``brev ls
--json`` until RUNNING, then a trivial exec until it answers) and deleted with plain ``brev delete <name>`` when the
job ends or is canceled.

A job is launched with one ``brev copy`` and one ``brev exec``: the copy puts a 0600 archive (made in a 0700 temp
folder) into the instance user's home -- the job's files and secrets for the container, its launch script, its
first ownership mark and the NGC key -- and the exec runs the launch script (:mod:`~airflow_provider_tao.hooks.
brev_remote`), which logs in to the registry with the key on stdin, creates the container with this provider's
labels, copies the job's archive into it (``docker cp -``), starts it and leaves a waiter that writes its exit code
to a file (``brev exec`` passes no exit code through). Nothing secret is ever on a command line, here or there.

Status is batched: ONE ``brev ls --json`` per poll for every instance of the connection, plus ONE exec per instance
that has watched jobs, which reads all their containers' states, exit files, marks and new log lines at once (the
log lines then serve the triggers' log reads without another call). A failing instance (FAILURE, UNHEALTHY,
deleted) fails its jobs as retriable infrastructure (``ERR_INFRA``); a stopped one pauses them; an exec that does not
answer (a flaky connection) is Unknown, never a failure.

Cost guard: every instance this provider creates carries a lease (``~/.tao-brev/lease.json`` on the instance itself:
created at, expires at = created + ``lease_hours`` -- the job's, the connection's, ``[tao] lease_hours``, else 8 --,
the owning dag/task/run), written by the instance's startup script and again at launch. :meth:`BrevHook.reap` (also
``airflow tao reap``, through :meth:`BrevHook.reap_resources`) deletes the instances whose lease expired or whose task
is finished, and never one without a lease (one it did not create); an expired instance whose task still watches it
has its jobs canceled instead, and the task deletes it.

A cancel from outside the task (``airflow tao cancel``, the reaper: a ``canceled_by`` mark) stops the container but
keeps the task's instance: the waiting task must read "canceled by ..." there (a deleted instance reads as a lost
one, ``ERR_INFRA``, and a retry); its cleanup deletes the instance.
"""

from __future__ import annotations

import re
import shlex
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any

from airflow_provider_tao import settings
from airflow_provider_tao.accounting import JobUsage
from airflow_provider_tao.failures import FailureFacts
from airflow_provider_tao.hooks import brev_lease as leases
from airflow_provider_tao.hooks import brev_remote as remote
from airflow_provider_tao.hooks import container as ct
from airflow_provider_tao.hooks.base import (
    LOG_READ_LIMIT,
    MARK_CANCEL,
    MARK_CANCELED_BY,
    ConnectionProblem,
    JobSubmitError,
    JobValidationError,
    TAOPlatformHook,
    register_secrets,
)
from airflow_provider_tao.hooks.brev_auth import is_api_key
from airflow_provider_tao.hooks.brev_cli import BrevError, BrevSession, connection_problem
from airflow_provider_tao.hooks.brev_lease import ReapDecision
from airflow_provider_tao.hooks.cli import write_private_file
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobSpec, JobState, JobStatus

#: The lease of an instance when neither the job, the connection nor ``[tao] lease_hours`` gives one.
DEFAULT_LEASE_HOURS = 8.0
#: An instance's page in the Brev console (the connection's ``console_url`` overrides it).
DEFAULT_CONSOLE_URL = "https://brev.nvidia.com/environment/{id}"
DEFAULT_REGISTRY = "nvcr.io"
DEFAULT_SHM_SIZE = "16g"
#: An instance has this long to reach RUNNING after ``brev create`` (GPU instances boot in 2-5 min, some slower).
DEFAULT_BOOT_TIMEOUT = 20 * 60.0
#: Then ``brev exec`` has this long to answer (sshd, name resolution and the user's shell come up after RUNNING).
READY_TIMEOUT = 5 * 60.0
#: The first real exec on an instance: the launch, which pulls the image (a TAO image is many GB).
DEFAULT_LAUNCH_TIMEOUT = 30 * 60.0
COPY_TIMEOUT = 10 * 60.0
#: One status probe (every watched job of one instance) and one small remote call (a mark, a stop, a log read).
PROBE_TIMEOUT = 30.0
CALL_TIMEOUT = 60.0
#: Parallel probes of the instances of one poll.
PROBE_WORKERS = 8
#: ``backend_details`` keys of this platform: the container's (as on the docker platform) and the instance's.
DETAIL_KEYS = ct.CONTAINER_DETAIL_KEYS | {"instance_id", "instance_type", "lease_hours", "network"}
_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
#: How the instance of a task ends: its job name's digest (operators/submit.py); a reused instance may not.
_TASK_INSTANCE = re.compile(r"-[0-9a-f]{10}$")
# Instance states: the instance has failed under its jobs, or is still coming up / paused.
_INSTANCE_FAILED = {"FAILURE": "has FAILED", "UNHEALTHY": "is UNHEALTHY", "DELETING": "is being deleted"}
_INSTANCE_WAITING = {
    "DEPLOYING": JobState.PENDING,
    "STARTING": JobState.PENDING,
    "STOPPING": JobState.PAUSED,
    "STOPPED": JobState.PAUSED,
}
_LIVE_JOB_STATES = (JobState.PENDING, JobState.RUNNING, JobState.PAUSED)
_EXEC_STATES = ("RUNNING", "UNHEALTHY")  # states in which a probe may answer (never exec a stopped instance: it starts)


class BrevHook(TAOPlatformHook):
    """Runs jobs as containers on NVIDIA Brev GPU instances, through the ``brev`` CLI.

    Connection type ``tao_brev``: ``password`` = the Brev token or API key (``bak-...``; ``BREV_API_TOKEN``). Extras:
    ``brev_path`` (default ``brev`` on ``PATH``), ``org`` (default: the account's), ``org_id`` (an API key's org),
    ``instance_type`` (the default fallback chain of the instances this provider creates, e.g.
    ``g5.xlarge,g6.xlarge``; unset = the CLI's own choice),
    ``lease_hours`` (default 8: an instance this provider created is reaped after that long), ``ngc_api_key``
    (``NGC_KEY``; for pulls from ``registry``, default ``nvcr.io``), ``network`` (the Docker network of the
    containers on the instance), ``shm_size`` (16g), ``cancel_grace_seconds`` (10), ``boot_timeout_seconds`` (1200),
    ``launch_timeout_seconds`` (1800).

    ``backend_details`` of a job: ``instance_id`` (run on this existing instance, by name or id; it is kept),
    ``instance_type`` (the fallback chain of this job's own instance, a comma-separated string or a list),
    ``lease_hours``, ``network``, and the container's ``mem_limit``, ``cpus``, ``shm_size``, ``mounts`` (paths on the
    instance), ``user``, ``entrypoint``, ``gpu_ids``, ``working_dir`` (as on the docker platform).

    :param conn_id: the ``tao_brev`` connection, or None for the environment's defaults (``BREV_API_TOKEN``).
    """

    platform = "brev"
    conn_type = "tao_brev"
    default_conn_name = "tao_brev_default"
    hook_name = "TAO Brev"
    # Brev instance names: ^[a-zA-Z0-9][a-zA-Z0-9._-]*$, at most 63 characters (an ephemeral instance is named so).
    name_pattern = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$")
    name_rule = "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 63 characters"
    marks_storage = "small files next to the job on its instance (~/.tao-brev/jobs/<job_id>/marks), read by brev exec"
    log_reads_batched = True  # the log lines come with the per-instance status probe
    env_fallbacks = {"password": "BREV_API_TOKEN", "ngc_api_key": "NGC_KEY"}

    def __init__(self, conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(conn_id, **kwargs)
        self._lock = threading.Lock()
        self._ended: dict[str, JobStatus] = {}  # job id -> its final status (an ended container is final)
        self._log_cursors: dict[str, str] = {}  # job id -> the cursor its last log read returned
        self._prefetched: dict[str, tuple[str, bytes]] = {}  # job id -> (cursor, log bytes read by a probe)
        self._live: set[str] = set()  # jobs the last probe found not ended
        self._leases: dict[str, dict[str, Any] | None] = {}  # instance -> its lease, as the last scan read it

    # ----------------------------------------------------------------- settings and session

    def _number(self, name: str, default: float) -> float:
        self.load_connection()
        value = self.setting(name, default)
        try:
            return float(value)
        except (TypeError, ValueError) as exc:
            raise JobValidationError(name, f"{value!r} is not a number", f"Set {name} to seconds or hours") from exc

    @property
    def org(self) -> str | None:
        self.load_connection()
        org = self.setting("org")
        return str(org) if org else None

    @property
    def registry(self) -> str:
        self.load_connection()
        return str(self.setting("registry", DEFAULT_REGISTRY)).rstrip("/")

    @cached_property
    def session(self) -> BrevSession:
        """The connection's ``brev`` session (private HOME, credentials written by it, one re-login)."""
        self.load_connection()
        token = self.setting("password")
        if not token:
            raise BrevError(
                ErrClass.ERR_AUTH,
                "no Brev API token: put it in the password of the tao_brev connection (or set BREV_API_TOKEN)",
            )
        register_secrets([str(token)])
        return BrevSession(
            executable=str(self.setting("brev_path", "brev")),
            token=str(token),
            org=self.org,
            org_id=str(self.setting("org_id") or "") or None,
            identity=self.conn_id or "",
            log=self.log,
        )

    def probe_connection(self) -> str:
        """The UI's "Test" button: one ``brev ls --json`` through the connection's private CLI session (its headless
        login first and, with ``org``, ``brev set``); says what failed: no CLI at ``brev_path``, the token refused,
        the org missing, the Brev API not answering."""
        self.load_connection()
        if not self.setting("password"):
            raise ConnectionProblem(
                "config", "no Brev API token: put it in the connection's password (or set BREV_API_TOKEN)"
            )
        try:
            instances = self.session.instances(timeout=PROBE_TIMEOUT)
        except BrevError as exc:
            raise connection_problem(exc) from exc
        running = sum(1 for entry in instances.values() if entry.get("status") == "RUNNING")
        org = f"org {self.org}" if self.org else "the account's default org"
        return f"brev answers: {len(instances)} instance(s) in {org}, {running} running"

    # ----------------------------------------------------------------- where the job is, what runs (UI, CLI)

    def _console_url(self, entry: Mapping[str, Any] | None) -> str:
        """The instance's page in the Brev console: the connection's ``console_url`` with ``{id}`` and ``{name}``
        filled in from ``brev ls`` (kept in the job's handle: the TAO job link needs no call)."""
        from urllib.parse import quote

        self.load_connection()
        template = str(self.setting("console_url", DEFAULT_CONSOLE_URL))
        if not entry or not entry.get("id"):
            return ""
        return template.replace("{id}", quote(str(entry["id"]), safe="")).replace(
            "{name}", quote(str(entry.get("name") or ""), safe="")
        )

    def job_location(self, handle: JobHandle) -> dict[str, str]:
        instance, container = shlex.quote(handle.backend_job_id), ct.container_name(handle.job_id)
        return {
            "Instance": handle.backend_job_id,
            "Container": container,
            "Log": f"brev exec {instance} 'docker logs {container}'",
            "Shell": f"brev shell {instance}",
        }

    def list_active_jobs(self) -> list[JobHandle]:
        """This provider's containers still running on the account's instances: one ``brev ls --json``, then one
        exec per running instance (side by side) reading its lease and its containers -- the scan the reaper makes.
        An instance that does not answer is left out (logged)."""
        instances = self.session.instances()
        handles = []
        for name, scan in sorted(self._scan_all(instances).items()):
            if isinstance(scan, str):
                self.log.warning("Instance %s did not answer: its jobs are not listed (%s)", name, scan)
                continue
            handles += [self._handle_of(name, instances[name], container) for container in scan[1]]
        return handles

    def lease_expired(self, handle: JobHandle, now: float | None = None) -> bool:
        """A job on an instance this provider created expires with the instance's lease (as the last scan of
        :meth:`list_active_jobs` read it); a job on a reused instance after ``[tao] lease_hours``."""
        with self._lock:
            lease = self._leases.get(handle.backend_job_id)
        if leases.own_lease(lease, handle.backend_job_id):
            assert lease is not None
            return (time.time() if now is None else now) >= float(lease.get("expires_at") or 0)
        return super().lease_expired(handle, now)

    def reap_resources(
        self, task_state: Callable[[Mapping[str, Any]], str | None], *, dry_run: bool
    ) -> list[dict[str, str]]:
        """``airflow tao reap``'s cost guard: :meth:`reap` on this connection."""
        return [
            {"resource": d.instance, "action": d.action, "why": d.reason}
            for d in self.reap(task_state=task_state, dry_run=dry_run)
        ]

    def _handle_of(self, instance: str, entry: Mapping[str, Any], found: remote.FoundContainer) -> JobHandle:
        """The handle of a job found on an instance (by its container's labels)."""
        return JobHandle(
            platform=self.platform,
            conn_id=self.conn_id,
            job_id=found.job_id,
            name=found.name,
            backend_job_id=instance,
            results_dir=found.results_dir,
            try_number=found.try_number,
            submitted_at=found.created_at or time.time(),
            console_url=self._console_url(entry),
        )

    def _scan(self, instance: str) -> leases.Scan:
        """One exec: the instance's lease and this provider's containers still running on it; the error text when
        it did not answer."""
        try:
            answer = self._call(instance, remote.active(), PROBE_TIMEOUT)
        except BrevError as exc:
            if exc.err_class is ErrClass.ERR_AUTH:
                raise
            return str(exc)
        return "did not answer brev exec" if answer is None else remote.parse_active(answer)

    def _scan_all(self, instances: Mapping[str, Mapping[str, Any]]) -> dict[str, leases.Scan]:
        """:meth:`_scan` of every instance that may be exec'd (never a stopped one: exec would start it)."""
        readable = sorted(name for name, entry in instances.items() if entry.get("status") in _EXEC_STATES)
        if not readable:
            return {}
        with ThreadPoolExecutor(max_workers=min(PROBE_WORKERS, len(readable))) as pool:
            scans = dict(zip(readable, pool.map(self._scan, readable), strict=True))
        with self._lock:
            self._leases.update({name: scan[0] for name, scan in scans.items() if not isinstance(scan, str)})
        return scans

    # ----------------------------------------------------------------- validation

    def image_required(self, spec: JobSpec) -> str | None:
        return "is required on the brev platform: every job is a container on the instance"

    def validate_spec(self, spec: JobSpec) -> None:
        super().validate_spec(spec)
        details = self.platform_details(spec)
        ct.check_container_details(spec, details, DETAIL_KEYS, self.platform)
        reuse = details.get("instance_id")
        if reuse is not None:
            if not isinstance(reuse, str) or not self.name_pattern.match(reuse):
                raise JobValidationError(
                    "backend_details['instance_id']", f"{reuse!r} is not a Brev instance name or id", "Use `brev ls`"
                )
            if reuse == spec.name or _TASK_INSTANCE.search(reuse):
                raise JobValidationError(
                    "backend_details['instance_id']",
                    f"{reuse!r} is named like the instances this provider creates for tasks (<name>-<10 hex digits>)",
                    "Leave instance_id unset for an instance of the task's own, or name an instance you made otherwise",
                )
            if "instance_type" in details or "lease_hours" in details:
                raise JobValidationError(
                    "backend_details['instance_type']"
                    if "instance_type" in details
                    else "backend_details['lease_hours']",
                    "applies to an instance this provider creates, not to a reused one (instance_id)",
                    "Drop it, or drop instance_id",
                )
        self._types(details)
        self._lease_hours(details)
        if spec.results_uri and not spec.results_uri.startswith(("s3://", "/")):
            raise JobValidationError(
                "results_uri",
                f"{spec.results_uri!r} is neither an s3:// URI nor a folder on the instance",
                "Use s3:// with storage_conn_id (an ephemeral instance's disk is deleted with it)",
            )
        self.load_connection()
        token = str(self.setting("password") or "")
        if not token:
            raise JobValidationError(
                "conn_id",
                "the tao_brev connection has no Brev API token",
                "Put the token in the connection's password (or set BREV_API_TOKEN)",
            )
        if is_api_key(token) and not self.setting("org_id"):
            raise JobValidationError(
                "org_id", "a Brev API key (bak-...) works in one org", "Set org_id on the tao_brev connection"
            )

    def _types(self, details: Mapping[str, Any]) -> list[str]:
        """The instance-type fallback chain: the job's, else the connection's (empty: the CLI's own choice)."""
        self.load_connection()
        where = "backend_details['instance_type']" if "instance_type" in details else "instance_type"
        chain = details.get("instance_type", self.setting("instance_type", ""))
        types = [t.strip() for t in chain.split(",")] if isinstance(chain, str) else chain
        if not isinstance(types, list) or not all(isinstance(t, str) and _TYPE.match(t.strip()) for t in types if t):
            raise JobValidationError(
                where, f"{chain!r} is not a chain of instance types", 'Use e.g. "g5.xlarge,g6.xlarge" (`brev search`)'
            )
        return [t.strip() for t in types if t and t.strip()]

    def _lease_hours(self, details: Mapping[str, Any]) -> float:
        """The job's ``lease_hours``, else the connection's, else ``[tao] lease_hours``, else 8: an instance this
        provider rents always has a lease (``[tao] lease_hours = 0``, "no lease", does not apply to machines)."""
        value = details.get("lease_hours", self._number("lease_hours", settings.lease_hours() or DEFAULT_LEASE_HOURS))
        try:
            hours = float(value)
        except (TypeError, ValueError):
            hours = 0.0
        if hours <= 0:
            raise JobValidationError(
                "lease_hours", f"{value!r} is not a positive number of hours", "Use e.g. 8 (longer than the job)"
            )
        return hours

    # ----------------------------------------------------------------- submit

    def create_job(self, spec: JobSpec, try_number: int = 1) -> JobHandle:
        """Find or create the instance, wait until it answers, stage the job's archive and launch its container.
        A refusal (auth, capacity, an unknown type, an image that cannot be pulled) is a :class:`JobSubmitError`
        and leaves no ephemeral instance behind."""
        self.validate_spec(spec)
        assert spec.image is not None, "image_required() makes the operator demand one"
        details = self.platform_details(spec)
        reuse = details.get("instance_id")
        instance = str(reuse or spec.name)
        exists = False  # the task's own instance exists: a failed submission deletes it
        try:
            instances = self.session.instances()  # a refused token fails here, before anything is created
            if reuse:
                instance, entry = self._reused_instance(str(reuse), instances)
            else:
                lease = self._lease(spec, details, try_number)
                self._own_instance(spec, self._types(details), lease, instances)
                exists = True
                entry = self._wait_ready(instance, lease)
            handle = self.new_handle(spec, try_number, backend_job_id=instance, console_url=self._console_url(entry))
            if not reuse and not handle.results_dir.startswith("s3://"):
                self.log.warning(
                    "Job %s writes its results to %s on instance %s, which is deleted when the job ends: use "
                    "results_uri=s3://... (with storage_conn_id) to keep them",
                    spec.job_id, handle.results_dir, instance,
                )  # fmt: skip
            self._launch(spec, handle, details)
        except BrevError as exc:
            if exists:
                self._delete_instance(instance, f"job {spec.job_id} could not be launched ({exc.err_class.value})")
            raise JobSubmitError(exc.err_class, str(exc)) from exc
        self.log.info(
            "Job %s runs in container %s on instance %s", spec.job_id, ct.container_name(spec.job_id), instance
        )
        return handle

    def _reused_instance(
        self, wanted: str, instances: Mapping[str, Mapping[str, Any]]
    ) -> tuple[str, Mapping[str, Any]]:
        """The existing instance a job asked for (by name or id), running and answering: its name and ``brev ls``
        entry."""
        entry = instances.get(wanted) or next((e for e in instances.values() if e.get("id") == wanted), None)
        if entry is None:
            raise BrevError(
                ErrClass.ERR_CONFIG,
                f"backend_details['instance_id']: there is no instance {wanted!r} "
                f"(brev ls shows: {', '.join(sorted(instances)) or 'none'}); create it or fix the name",
            )
        name = str(entry["name"])
        status = str(entry.get("status"))
        if status == "RUNNING":
            return name, entry
        if status in ("STOPPED", "STOPPING"):
            self.log.info("Instance %s is %s: starting it", name, status)
            self.session.check(["start", name, "--detached"], CALL_TIMEOUT, f"starting instance {name}")
        elif status not in ("STARTING", "DEPLOYING"):
            raise BrevError(ErrClass.ERR_INFRA, f"instance {name} is {status}: it cannot run a job (brev ls)")
        return name, self._wait_ready(name, None)

    def _own_instance(
        self, spec: JobSpec, types: Sequence[str], lease: Mapping[str, Any], instances: Mapping[str, Mapping[str, Any]]
    ) -> None:
        """The task's own instance, named after the task instance: found (an earlier try made it) or created with
        the type chain. Returns once it exists; a refused creation leaves nothing behind and raises."""
        name = spec.name
        entry = instances.get(name)
        if entry is not None and entry.get("status") in ("FAILURE", "DELETING"):
            self.log.info("Instance %s of an earlier try is %s: replacing it", name, entry.get("status"))
            if entry.get("status") == "FAILURE":
                self.session.delete(name)
            self._wait_gone(name)
            entry = None
        if entry is not None:
            self.log.info("Instance %s of an earlier try exists (%s): using it", name, entry.get("status"))
            return
        self.log.info(
            "Creating instance %s (types %s; lease %s h)", name, ",".join(types) or "auto", lease["lease_hours"]
        )
        try:
            skipped = self.session.create(name, types, remote.startup_script(lease))
            for line in skipped:
                self.log.warning("brev create: %s (instance type chain %s)", line, ",".join(types))
        except BrevError as exc:
            # A lost answer (the API made it, the CLI saw an error) or another submission of this task instance
            # that made it just now: the instance is there, and it is this task's.
            if exc.err_class in (ErrClass.ERR_CONFIG, ErrClass.ERR_CAPACITY) or name not in self.session.instances():
                raise
            self.log.warning("brev create failed (%s), yet instance %s exists: using it", exc, name)

    def _lease(self, spec: JobSpec, details: Mapping[str, Any], try_number: int) -> dict[str, Any]:
        return leases.new_lease(spec, self._lease_hours(details), self.conn_id, try_number)

    def _wait_gone(self, name: str) -> None:
        deadline = time.monotonic() + DEFAULT_BOOT_TIMEOUT
        delay = 1.0
        while name in self.session.instances():
            if time.monotonic() > deadline:
                raise BrevError(
                    ErrClass.ERR_INFRA, f"instance {name} is still there {DEFAULT_BOOT_TIMEOUT:.0f} s after its delete"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 10.0)

    def _wait_ready(self, name: str, lease: Mapping[str, Any] | None) -> dict[str, Any]:
        """``brev ls --json`` until the instance is RUNNING (``boot_timeout_seconds``), then a trivial exec until it
        answers (5 minutes): a fresh instance reports RUNNING before sshd and its shell are up. Returns its
        ``brev ls`` entry."""
        boot_timeout = self._number("boot_timeout_seconds", DEFAULT_BOOT_TIMEOUT)
        deadline = time.monotonic() + boot_timeout
        delay, missing = 1.0, 0
        while True:
            entry = self.session.instances().get(name)
            status = str((entry or {}).get("status"))
            missing = missing + 1 if entry is None else 0
            if missing >= 2:  # one answer without it is not yet "gone"
                raise BrevError(ErrClass.ERR_INFRA, f"instance {name} disappeared while it was starting")
            if entry is not None and status == "RUNNING":
                running = dict(entry)
                break
            if status in ("FAILURE", "DELETING", "STOPPED"):
                raise BrevError(ErrClass.ERR_INFRA, f"instance {name} is {status} instead of starting (brev ls)")
            if time.monotonic() > deadline:
                raise BrevError(
                    ErrClass.ERR_CAPACITY,
                    f"instance {name} is still {status} after {boot_timeout:.0f} s (boot_timeout_seconds); the type "
                    "may be short of capacity: retry later or add types to the chain",
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 10.0)
        call = remote.prepare(lease)
        deadline = time.monotonic() + READY_TIMEOUT
        delay = 1.0
        while True:
            result = self.session.exec(name, call.command, PROBE_TIMEOUT)
            answer = call.answer(result)
            if answer is not None:
                break
            if time.monotonic() > deadline:
                raise BrevError(
                    ErrClass.ERR_INFRA,
                    f"instance {name} is RUNNING but brev exec did not answer for {READY_TIMEOUT:.0f} s: "
                    f"{result.describe()}",
                    result,
                )
            self.log.info("Instance %s does not answer brev exec yet (%s); trying again", name, result.describe())
            time.sleep(delay)
            delay = min(delay * 1.5, 10.0)
        said = answer.decode(errors="replace").strip()
        if not said.startswith("DOCKER "):
            raise BrevError(
                ErrClass.ERR_CONFIG,
                f"instance {name} has no usable Docker ({said}): use an instance in VM mode (Docker and the NVIDIA "
                "Container Toolkit are preinstalled there)",
            )
        return running

    def _launch(self, spec: JobSpec, handle: JobHandle, details: Mapping[str, Any]) -> None:
        """One ``brev copy`` of the job's 0600 archive, then one ``brev exec`` of its launch script."""
        assert spec.image is not None
        instance = handle.backend_job_id
        results_root = spec.results_uri if spec.results_uri and spec.results_uri.startswith("/") else None
        folders = [handle.results_dir] if results_root else []
        archive = ct.job_archive(spec.files, spec.secret_env, {}, ct.container_owner(details), folders)
        ngc_key = self.setting("ngc_api_key")
        registry = self.registry if ngc_key and spec.image.startswith(f"{self.registry}/") else None
        if ngc_key:
            register_secrets([str(ngc_key)])
        launch_sh = remote.launch_script(spec.job_id, self._create_argv(spec, handle, details, results_root), registry)
        stage = remote.stage_archive(
            archive, launch_sh, name=spec.name, owner_try=handle.try_number, ngc_key=str(ngc_key) if registry else None
        )
        with tempfile.TemporaryDirectory(prefix="tao-brev-stage-") as folder:  # 0700
            path = Path(folder) / f"stage-{spec.job_id}.tar"
            write_private_file(path, stage)
            self.session.copy(path, instance, f".tao-stage-{spec.job_id}.tar", COPY_TIMEOUT)
        call = remote.launch(spec.job_id)
        timeout = self._number("launch_timeout_seconds", DEFAULT_LAUNCH_TIMEOUT)
        result = self.session.exec(instance, call.command, timeout)
        answer = call.answer(result)
        if answer is None:
            raise BrevError(
                ErrClass.ERR_INFRA,
                f"launching job {spec.job_id} on {instance}: no answer ({result.describe()})",
                result,
            )
        container, said = remote.parse_launch(answer)
        if container is None:
            raise BrevError(_launch_failure_class(said), f"launching job {spec.job_id} on {instance} failed at {said}")

    def _create_argv(
        self, spec: JobSpec, handle: JobHandle, details: Mapping[str, Any], results_root: str | None
    ) -> list[str]:
        """``docker create`` of the job's container, as the launch script runs it on the instance (plain values
        only: the secrets arrive in the archive)."""
        assert spec.image is not None
        argv = ["docker", "create", "--name", ct.container_name(spec.job_id), "--init"]
        for key, value in ct.job_labels(spec, handle.try_number, handle.results_dir).items():
            argv += ["--label", f"{key}={value}"]
        env = self.tao_env(spec, files_dir=ct.FILES_DIR, results_root=results_root)
        if spec.gpu_count == 0:
            env.update(ct.NO_GPU_ENV)
        for key, value in env.items():
            argv += ["-e", f"{key}={value}"]
        argv += ["--shm-size", str(details.get("shm_size") or self.setting("shm_size", DEFAULT_SHM_SIZE))]
        if details.get("mem_limit"):
            # RAM and swap together: past the limit the job is OOM-killed (and says so) instead of swapping.
            argv += ["--memory", str(details["mem_limit"]), "--memory-swap", str(details["mem_limit"])]
        if details.get("cpus") is not None:
            argv += ["--cpus", str(float(details["cpus"]))]
        for mount in ct.container_mounts(details):
            argv += ["-v", mount]
        if results_root:
            argv += ["-v", f"{results_root}:{results_root}:rw"]
        if details.get("user"):
            argv += ["--user", str(details["user"])]
        if "entrypoint" in details:
            argv += ["--entrypoint", str(details["entrypoint"] or "")]
        if details.get("working_dir"):
            argv += ["-w", str(details["working_dir"])]
        if network := details.get("network") or self.setting("network"):
            argv += ["--network", str(network)]
        if (ids := ct.container_gpu_ids(spec)) is not None:
            argv += ["--gpus", f'"device={",".join(ids)}"']
        elif spec.gpu_count:
            argv += ["--gpus", "all" if spec.gpu_count == -1 else str(spec.gpu_count)]
        return [*argv, spec.image, *ct.launcher_argv(spec.command)]

    # ----------------------------------------------------------------- find and status

    def find_job(self, name: str) -> JobHandle | None:
        """The newest container of this job name: on the task's own instance if it exists, else on the running
        instances that can hold it -- reused ones, never another task's own instance (named like a job). A launch
        still going on (its worker died mid-submission, the CLI call did not) is waited for; a container created
        but never started is removed (it never ran anything). Any failure to ask (auth, network, an instance that
        does not answer) raises: "no job" would let the operator start a second one."""
        instances = self.session.instances()
        if name in instances:
            candidates = [name] if instances[name].get("status") in _EXEC_STATES else []
        else:
            candidates = sorted(
                n for n, e in instances.items() if e.get("status") in _EXEC_STATES and not _TASK_INSTANCE.search(n)
            )
        found: list[tuple[str, remote.FoundContainer]] = []
        for instance in candidates:
            found += [(instance, c) for c in self._containers_named(instance, name)]
        if not found:
            return None
        instance, newest = max(found, key=lambda item: item[1].created_at)
        return self._handle_of(instance, instances[instance], newest)

    def _containers_named(self, instance: str, name: str) -> list[remote.FoundContainer]:
        deadline = time.monotonic() + self._number("launch_timeout_seconds", DEFAULT_LAUNCH_TIMEOUT)
        while True:
            call = remote.find(name)
            answer = call.answer(self.session.exec(instance, call.command, CALL_TIMEOUT))
            if answer is None:
                raise BrevError(ErrClass.ERR_INFRA, f"instance {instance} did not answer the search for job {name}")
            containers, launching = remote.parse_find(answer)
            if not launching or time.monotonic() > deadline:
                break
            self.log.info("A launch of job %s is still going on on %s: waiting for it", name, instance)
            time.sleep(5.0)
        kept = []
        for container in containers:
            if container.state == "created":
                self.log.info(
                    "Removing container of job %s on %s: its try died before starting it", container.job_id, instance
                )
                self._call(instance, remote.remove(container.job_id))
            else:
                kept.append(container)
        return kept

    def get_job_status(self, handle: JobHandle) -> JobStatus:
        return self.get_job_statuses([handle])[handle.job_id]

    def get_job_statuses(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        """ONE ``brev ls --json`` for all, plus ONE exec per instance that has jobs still running (side by side).
        A failed listing raises (the poller turns that into Unknown); an instance whose exec does not answer gives
        its jobs Unknown."""
        with self._lock:
            # What this hook keeps of a job lasts while it is watched (the poller's hook lives as long as jobs do).
            watched = {h.job_id for h in handles}
            self._ended = {job: status for job, status in self._ended.items() if job in watched}
            self._log_cursors = {job: cursor for job, cursor in self._log_cursors.items() if job in watched}
            self._prefetched = {job: data for job, data in self._prefetched.items() if job in watched}
            statuses = {h.job_id: final for h in handles if (final := self._ended.get(h.job_id)) is not None}
        pending = [h for h in handles if h.job_id not in statuses]
        if not pending:
            return statuses
        instances = self.session.instances(timeout=PROBE_TIMEOUT)
        by_instance: dict[str, list[JobHandle]] = {}
        for handle in pending:
            by_instance.setdefault(handle.backend_job_id, []).append(handle)
        probed = [name for name in by_instance if (instances.get(name) or {}).get("status") in _EXEC_STATES]
        probes: dict[str, remote.InstanceProbe | str] = {}
        if probed:
            with ThreadPoolExecutor(max_workers=min(PROBE_WORKERS, len(probed))) as pool:
                probes = dict(zip(probed, pool.map(lambda n: self._probe(n, by_instance[n]), probed), strict=True))
        for name, jobs in by_instance.items():
            for handle in jobs:
                status = self._status(handle, instances.get(name), probes.get(name))
                if status.state.is_terminal:
                    with self._lock:
                        self._ended[handle.job_id] = status
                statuses[handle.job_id] = status
        with self._lock:
            self._live -= set(statuses)
            self._live |= {job for job, status in statuses.items() if status.state in _LIVE_JOB_STATES}
            quiet = [job for job, (cursor, data) in self._prefetched.items() if not _after(data, cursor)[0]]
            self._quiet_logs = frozenset(quiet)  # (``--since`` the cursor's time: its own line comes again)
        return statuses

    def _probe(self, instance: str, handles: Sequence[JobHandle]) -> remote.InstanceProbe | str:
        """One exec for every job of one instance (and their new log lines); the error text when it failed."""
        with self._lock:
            since = {
                h.job_id: _since(self._log_cursors[h.job_id]) if h.job_id in self._log_cursors else "-" for h in handles
            }
        call = remote.probe(since)
        try:
            result = self.session.exec(instance, call.command, PROBE_TIMEOUT)
        except BrevError as exc:
            if exc.err_class is ErrClass.ERR_AUTH:
                raise
            return str(exc)
        answer = call.answer(result)
        if answer is None:
            return result.describe()
        found = remote.parse_probe(answer)
        with self._lock:
            for job, data in found.logs.items():
                if job in self._log_cursors:
                    self._prefetched[job] = (self._log_cursors[job], data)
        return found

    def _status(
        self, handle: JobHandle, entry: Mapping[str, Any] | None, probe: remote.InstanceProbe | str | None
    ) -> JobStatus:
        instance = handle.backend_job_id
        name = ct.container_name(handle.job_id)
        if entry is None:  # one answer is not yet "lost": the poller's two-answers rule decides (not_found)
            return JobStatus(
                JobState.UNKNOWN,
                f"instance {instance} is not in brev ls (deleted outside this task, or lost by Brev)",
                raw_state="LOST",
                not_found=True,
            )
        state = str(entry.get("status"))
        if state in _INSTANCE_WAITING:
            why = "the job cannot run until it is started again" if state.startswith("STOP") else "it is starting"
            return JobStatus(_INSTANCE_WAITING[state], f"instance {instance} is {state}: {why}", raw_state=state)
        failed = JobStatus(
            JobState.ERROR,
            f"instance {instance} {_INSTANCE_FAILED.get(state, f'is {state}')} (brev ls)",
            raw_state=state,
        )
        if not isinstance(probe, remote.InstanceProbe):
            if state != "RUNNING":
                return failed
            return JobStatus.unknown(f"instance {instance} did not answer brev exec: {probe or 'not asked'}")
        marks = probe.marks.get(handle.job_id, {})
        container = probe.containers.get(handle.job_id)
        if container is not None:
            created_at, container_state = container
            word = str(container_state.get("Status") or "")
            if word in ct.LIVE_STATES:
                live = ct.live_status(name, word, created_at, f"{word} on instance {instance}")
                return failed if state != "RUNNING" and not live.state.is_terminal else live
            return ct.ended_status(name, container_state, lambda: MARK_CANCEL in marks)
        if handle.job_id in probe.exits:
            code = probe.exits[handle.job_id]
            verdict = ct.ended_status(name, {"Status": "exited", "ExitCode": code}, lambda: MARK_CANCEL in marks)
            return JobStatus(
                verdict.state, f"{verdict.message} (its container was removed since)", code, verdict.raw_state
            )
        if state != "RUNNING":
            return failed
        where = "its job folder is there" if handle.job_id in probe.known else "nothing of the job is there"
        return JobStatus.missing(f"container {name} is not on instance {instance} ({where})")

    # ----------------------------------------------------------------- logs

    def get_job_logs(self, handle: JobHandle, cursor: str = "", tail: int | None = None) -> tuple[str, str]:
        """By timestamp cursor, as on the docker platform (``docker logs --timestamps --since`` on the instance,
        from the cursor's exact time). A job this hook's status probes watch has its new lines read by the probe
        from the cursor of its last read: the read returns them without a call of its own (the very first read of a
        watched job registers its cursor and returns nothing yet; its lines arrive one interval later)."""
        cursor = cursor if tail is None else ""
        with self._lock:
            prefetched = self._prefetched.pop(handle.job_id, None) if tail is None else None
            watched = tail is None and handle.job_id in self._live
            if watched and (prefetched is None or prefetched[0] != cursor):
                # A job the status probes watch: its lines from this cursor on come with the next probe, never
                # with a call of their own (a job that has ended is read at once, below).
                self._log_cursors[handle.job_id] = cursor
                return "", cursor
        if prefetched is not None and prefetched[0] == cursor:
            data = prefetched[1]
        else:
            call = remote.logs(handle.job_id, _since(cursor), tail)
            answer = call.answer(self.session.exec(handle.backend_job_id, call.command, CALL_TIMEOUT))
            if answer is None:
                return "", cursor
            data = remote.parse_probe(answer).logs.get(handle.job_id, b"")
        text, new_cursor = _after(data, cursor)
        if tail is None:
            with self._lock:
                self._log_cursors[handle.job_id] = new_cursor
        return text, new_cursor

    # ----------------------------------------------------------------- cancel, failure analysis, cleanup

    def _cancel(self, handle: JobHandle) -> bool:
        """Stop the container (SIGTERM, SIGKILL after the grace), then delete the instance when it is the task's
        own. An instance that is not running has no running container to stop."""
        instance = handle.backend_job_id
        entry = self.session.instances().get(instance)
        if entry is None:
            return True
        grace = int(self._number("cancel_grace_seconds", 10))
        outside = None  # who canceled the job from outside its task (a person, the reaper), as its marks say
        if entry.get("status") in _EXEC_STATES:
            answer = self._call(instance, remote.stop(handle.job_id, grace), timeout=CALL_TIMEOUT + grace)
            if answer is None and not self._ephemeral(handle):
                raise BrevError(
                    ErrClass.ERR_INFRA, f"instance {instance} did not answer the stop of job {handle.job_id}"
                )
            stopped = remote.parse_probe(answer) if answer is not None else None
            if stopped is not None and handle.job_id in stopped.kept:
                self.log.warning("Job %s is another try's now: not stopped, instance %s kept", handle.job_id, instance)
                return False
            outside = stopped.marks.get(handle.job_id, {}).get(MARK_CANCELED_BY) if stopped else None
        if self._ephemeral(handle) and outside:
            # Its task still watches the job: it must see "canceled by ..." (an instance deleted under it reads as
            # a lost instance, ERR_INFRA, and a retry). Its cleanup deletes the instance -- or `airflow tao reap`.
            self.log.info("Instance %s stays until the task of job %s has seen the cancel", instance, handle.job_id)
        elif self._ephemeral(handle):
            self._delete_instance(instance, f"job {handle.job_id} was canceled")
        return True

    def failure_facts(self, handle: JobHandle) -> FailureFacts:
        status = self.get_job_status(handle)
        tail: list[str] = []
        if status.raw_state not in ("LOST", "FAILURE", "DELETING"):
            try:
                text, _ = self.get_job_logs(handle, tail=200)
                tail = text.splitlines()
            except BrevError as exc:
                self.log.info("Cannot read the log of job %s: %s", handle.job_id, exc)
        return FailureFacts(
            exit_code=status.exit_code,
            raw_state=status.raw_state,
            oom_killed=status.raw_state == "OOMKilled",
            canceled=status.state is JobState.CANCELED,
            log_tail=tail,
            events=[status.message] if status.message else [],
            message=status.message,
            details={"instance": handle.backend_job_id, "container": ct.container_name(handle.job_id)},
        )

    def get_job_usage(self, handle: JobHandle) -> JobUsage:
        """From the job's container on its instance (one probe: ``Created``, ``State.StartedAt`` / ``FinishedAt``)
        and the instance's GPU model (``brev ls``). The GPU count is the task's: the probe reads the container's
        state, not its device requests."""
        instance = handle.backend_job_id
        entry = self.session.instances().get(instance) or {}
        gpu = str(entry.get("gpu") or "")
        probe = self._probe(instance, [handle]) if entry.get("status") in _EXEC_STATES else None
        found = probe.containers.get(handle.job_id) if isinstance(probe, remote.InstanceProbe) else None
        if found is None:
            usage = super().get_job_usage(handle)
        else:
            created, state = found
            where = f"the container's Created / State.StartedAt / State.FinishedAt on instance {instance}"
            usage = ct.container_usage(created or None, state, None, where)
        return replace(usage, gpu_type=gpu if gpu not in ("", "-") else None)

    def cleanup_job(self, handle: JobHandle) -> None:
        """Once the job has ended: delete the task's own instance (a reused one is kept, and so is the container
        there, for its log); on a reused instance that failed under the job, stop the container."""
        try:
            status = self.get_job_status(handle)
            if not status.state.is_terminal:
                return
            if self._ephemeral(handle):
                self._delete_instance(handle.backend_job_id, f"job {handle.job_id} ended {status.state.value}")
            elif status.raw_state == "UNHEALTHY":
                self._call(handle.backend_job_id, remote.stop(handle.job_id, 0))
        except BrevError as exc:
            self.log.warning("Cleaning up after job %s failed: %s", handle.job_id, exc)

    @staticmethod
    def _ephemeral(handle: JobHandle) -> bool:
        """The task's own instance is named after the task instance, as the job is (validation keeps a reused
        instance from having that name)."""
        return handle.backend_job_id == handle.name

    def _delete_instance(self, name: str, why: str) -> None:
        try:
            if self.session.delete(name):
                self.log.info("Deleted instance %s: %s", name, why)
        except BrevError as exc:
            self.log.warning("Could not delete instance %s (%s): %s; the reaper will", name, why, exc)

    # ----------------------------------------------------------------- marks, paths

    def read_marks(self, handle: JobHandle) -> dict[str, Any]:
        """The job's marks, read on its instance (none while the instance is not running: reading would start a
        stopped one)."""
        entry = self.session.instances().get(handle.backend_job_id)
        if entry is None or entry.get("status") not in _EXEC_STATES:
            return {}
        answer = self._call(handle.backend_job_id, remote.probe({handle.job_id: "-"}))
        if answer is None:
            raise BrevError(ErrClass.ERR_INFRA, f"instance {handle.backend_job_id} did not answer (reading marks)")
        return remote.parse_probe(answer).marks.get(handle.job_id, {})

    def write_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        """Keep a mark next to the job on its instance; not on an instance that is not running (``brev exec`` would
        start a stopped one: GPU hours for a mark). Its job is not running either, and the mark is not needed."""
        entry = self.session.instances().get(handle.backend_job_id)
        if entry is None or entry.get("status") not in _EXEC_STATES:
            status = (entry or {}).get("status", "gone")
            self.log.info(
                "Instance %s is %s: mark %s of job %s not kept", handle.backend_job_id, status, key, handle.job_id
            )
            return
        answer = self._call(handle.backend_job_id, remote.write_mark(handle.job_id, key, value))
        if answer is None:
            raise BrevError(ErrClass.ERR_INFRA, f"instance {handle.backend_job_id} did not answer (writing mark {key})")
        if answer.strip() != b"OK":
            self.log.info(
                "Job %s has no folder on %s any more: mark %s not kept", handle.job_id, handle.backend_job_id, key
            )

    def check_path(self, uri: str) -> bool:
        """A path on an instance cannot be looked at before the instance is chosen (or made): the in-job runner
        checks it and fails the job as ``ERR_CONFIG`` when it is missing."""
        self.log.info("%s is a path on the Brev instance: the job checks it", uri)
        return True

    def list_path(self, uri: str) -> list[str]:
        raise JobValidationError(
            "uri", f"{uri} is on a Brev instance, not on the Airflow hosts", "Read results from s3:// instead"
        )

    def _call(self, instance: str, call: remote.Script, timeout: float = CALL_TIMEOUT) -> bytes | None:
        return call.answer(self.session.exec(instance, call.command, timeout))

    # ----------------------------------------------------------------- the cost guard

    def reap(
        self,
        task_state: Callable[[Mapping[str, Any]], str | None] | None = None,
        now: float | None = None,
        *,
        dry_run: bool = False,
    ) -> list[ReapDecision]:
        """Delete every instance this provider created whose lease has expired or whose task is finished and on which
        no job runs any more (a running job of a finished task is the orphan sweep's to judge: it may have been kept
        with ``cancel_on_kill=False``); never one without this provider's lease. An expired instance whose task still
        watches it (running, deferred) is not pulled from under the task: its jobs are canceled through the one cancel
        routine (the task fails with ERR_CANCELED, not retried, and deletes the instance), and a later reap deletes it
        if the task did not.
        Every decision is logged with its reason. One ``brev ls --json`` and one exec per running instance.

        :param task_state: the Airflow state of a lease's task instance (see
            :func:`~airflow_provider_tao.hooks.brev_lease.task_state_lookup`); without it only expired leases are
            reaped, and at once.
        :param now: the time to judge leases by (epoch seconds; default now).
        :param dry_run: decide and report; delete and cancel nothing.
        """
        now = time.time() if now is None else now
        instances = self.session.instances()
        scans = self._scan_all(instances)
        decisions = []
        for name in sorted(instances):
            entry = instances[name]
            decision = self._judge(name, entry, scans.get(name, "unread"), task_state, now=now, dry_run=dry_run)
            self.log.info("Reaper: %s %s: %s", decision.action, decision.instance, decision.reason)
            decisions.append(decision)
        return decisions

    def _judge(
        self,
        name: str,
        entry: Mapping[str, Any],
        scan: leases.Scan,
        task_state: Callable[[Mapping[str, Any]], str | None] | None,
        *,
        now: float,
        dry_run: bool,
    ) -> ReapDecision:
        """:func:`~airflow_provider_tao.hooks.brev_lease.judge`, then the act: delete the instance, or cancel the
        jobs of an expired one whose task still watches it (the task deletes it; or the next reap once nothing runs
        on it)."""
        action, reason = leases.judge(name, entry, scan, task_state, now=now)
        if action in ("kept", "skipped"):
            return ReapDecision(name, action, reason)
        if dry_run:
            return ReapDecision(name, f"would {action}", reason)
        if action == "cancel jobs":
            assert not isinstance(scan, str)
            for found in scan[1]:
                self.cancel_job(self._handle_of(name, entry, found), requested_by="reap: lease expired")
            return ReapDecision(name, "jobs canceled", reason)
        try:
            deleted = self.session.delete(name)
        except BrevError as exc:
            return ReapDecision(name, "failed", f"{reason}, but brev delete failed: {exc}")
        return ReapDecision(name, "deleted" if deleted else "kept", reason if deleted else f"{reason}; already gone")


def _after(data: bytes, cursor: str) -> tuple[str, str]:
    """The text of a ``docker logs --timestamps`` read after ``cursor``, and the cursor after it."""
    if len(data) > LOG_READ_LIMIT:
        data = data[: data.rfind(b"\n") + 1]  # the read was cut: its last line is incomplete
    lines = sorted(ct.timestamped_lines([data]), key=lambda line: line[0])
    return ct.read_after(lines, cursor)


def _since(cursor: str) -> str:
    """What ``docker logs --since`` gets for a cursor: its exact timestamp, or ``all`` from the start."""
    stamp, _ = ct.parse_log_cursor(cursor)
    return stamp or "all"


def _launch_failure_class(said: str) -> ErrClass:
    """A launch that failed at one of its steps: ``create`` that could not pull the image (``ERR_IMAGE_PULL``), a
    registry that refused the NGC key (``ERR_AUTH``), a container the instance's Docker refused (``ERR_CONFIG``:
    a bad mount, GPUs it does not have), anything else is the instance's (``ERR_INFRA``)."""
    step = said.split("\n", 1)[0].strip()
    if step == "login":
        return ErrClass.ERR_AUTH
    if step == "create" and re.search(
        r"Unable to find image|pull access denied|manifest unknown|not found|pull", said, re.I
    ):
        return ErrClass.ERR_IMAGE_PULL
    if step in ("create", "start"):
        return ErrClass.ERR_CONFIG
    return ErrClass.ERR_INFRA
