"""The ``brev`` platform: each job is a Docker container ``tao-job-<job_id>`` on an NVIDIA Brev GPU instance.

Everything goes through the ``brev`` CLI (:mod:`~airflow_provider_tao.hooks.brev.cli`: a private session per
connection, the token never on a command line). An instance is either *reused* (``backend_details["instance_id"]``;
it is never deleted) or *ephemeral*: one per task instance, named after it (the job's deterministic name, so a retry
finds it again), created with the connection's or the job's ``instance_type`` fallback chain, waited for (``brev ls
--json`` until RUNNING, then a trivial exec until it answers) and deleted with plain ``brev delete <name>`` when the
job ends or is canceled.

A job is launched with one ``brev copy`` and one ``brev exec``: the copy puts a 0600 archive (made in a 0700 temp
folder) into the instance user's home -- the job's files and secrets for the container, its launch script, its
first ownership mark and the NGC key -- and the exec runs the launch script
(:mod:`~airflow_provider_tao.hooks.brev.remote`), which logs in to the registry with the key on stdin, creates the
container with this provider's labels, copies the job's archive into it (``docker cp -``), starts it and leaves a
waiter that writes its exit code to a file (``brev exec`` passes no exit code through). Nothing secret is ever on a
command line, here or there.

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

The hook is made of parts, one module each: the CLI session and the scan of what runs where
(:mod:`~airflow_provider_tao.hooks.brev.session`), the instances (:mod:`~airflow_provider_tao.hooks.brev.instances`),
the launch (:mod:`~airflow_provider_tao.hooks.brev.launch`) and the cost guard
(:mod:`~airflow_provider_tao.hooks.brev.reap`); this module joins them and adds submission, status, logs and marks.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from airflow_provider_tao.accounting import JobUsage
from airflow_provider_tao.failures import FailureFacts
from airflow_provider_tao.hooks.base import (
    LOG_READ_LIMIT,
    MARK_CANCELED_BY,
    ConnectionProblem,
    JobSubmitError,
    JobValidationError,
)
from airflow_provider_tao.hooks.brev import remote
from airflow_provider_tao.hooks.brev.auth import is_api_key
from airflow_provider_tao.hooks.brev.cli import BrevError, connection_problem
from airflow_provider_tao.hooks.brev.instances import BrevInstancesHook
from airflow_provider_tao.hooks.brev.launch import DEFAULT_LAUNCH_TIMEOUT, BrevLaunchHook
from airflow_provider_tao.hooks.brev.reap import BrevReapHook
from airflow_provider_tao.hooks.brev.session import CALL_TIMEOUT, EXEC_STATES, PROBE_TIMEOUT, PROBE_WORKERS
from airflow_provider_tao.hooks.ownership import cancel_binds
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobSpec, JobState, JobStatus

#: ``backend_details`` keys of this platform: the container's (as on the docker platform) and the instance's.
DETAIL_KEYS = ct.CONTAINER_DETAIL_KEYS | {"instance_id", "instance_type", "lease_hours", "network"}
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


class BrevHook(BrevInstancesHook, BrevLaunchHook, BrevReapHook):
    """Runs jobs as containers on NVIDIA Brev GPU instances, through the ``brev`` CLI.

    Connection type ``tao_brev``: ``password`` = the Brev token or API key (``bak-...``; ``BREV_API_TOKEN``). Extras:
    ``brev_path`` (default ``brev`` on ``PATH``), ``cloudflared_path`` (a cloudflared for brev on a worker without
    internet; default: the one brev downloads, once per connection), ``org`` (default: the account's), ``org_id``
    (an API key's org),
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

    # ----------------------------------------------------------------- settings and session

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

    # ----------------------------------------------------------------- validation

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

    # ----------------------------------------------------------------- find and status

    def find_job(self, name: str) -> JobHandle | None:
        """The newest container of this job name: on the task's own instance if it exists, else on the running
        instances that can hold it -- reused ones, never another task's own instance (named like a job). A launch
        still going on (its worker died mid-submission, the CLI call did not) is waited for; a container created
        but never started is removed (it never ran anything). Any failure to ask (auth, network, an instance that
        does not answer) raises: "no job" would let the operator start a second one."""
        instances = self.session.instances()
        if name in instances:
            candidates = [name] if instances[name].get("status") in EXEC_STATES else []
        else:
            candidates = sorted(
                n for n, e in instances.items() if e.get("status") in EXEC_STATES and not _TASK_INSTANCE.search(n)
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
        probed = [name for name in by_instance if (instances.get(name) or {}).get("status") in EXEC_STATES]
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
            return ct.ended_status(name, container_state, lambda: cancel_binds(marks))
        if handle.job_id in probe.exits:
            code = probe.exits[handle.job_id]
            verdict = ct.ended_status(name, {"Status": "exited", "ExitCode": code}, lambda: cancel_binds(marks))
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
        if entry.get("status") in EXEC_STATES:
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
        probe = self._probe(instance, [handle]) if entry.get("status") in EXEC_STATES else None
        found = probe.containers.get(handle.job_id) if isinstance(probe, remote.InstanceProbe) else None
        if found is None:
            usage = super().get_job_usage(handle)
        else:
            created, state = found
            where = f"the container's Created / State.StartedAt / State.FinishedAt on instance {instance}"
            usage = ct.container_usage(created or None, state, None, where)
        return replace(usage, gpu_type=gpu if gpu not in ("", "-") else None)

    def cleanup_job(self, handle: JobHandle, *, adoptable: bool = False) -> None:
        """Once the job has ended: delete the task's own instance (a reused one is kept, and so is the container
        there, for its log); on a reused instance that failed under the job, stop the container. A job that
        completed before a kill whose task runs again (``adoptable``) keeps its instance: it holds the outputs the
        next try adopts (deleting it would run the job again); the reaper deletes it once the task is over."""
        try:
            status = self.get_job_status(handle)
            if not status.state.is_terminal:
                return
            if self._ephemeral(handle):
                if adoptable and status.state is JobState.COMPLETE:
                    self.log.info(
                        "Job %s completed before the kill: instance %s is kept for the task's next try to adopt",
                        handle.job_id, handle.backend_job_id,
                    )  # fmt: skip
                    return
                self._delete_instance(handle.backend_job_id, f"job {handle.job_id} ended {status.state.value}")
            elif status.raw_state == "UNHEALTHY":
                self._call(handle.backend_job_id, remote.stop(handle.job_id, 0))
        except BrevError as exc:
            self.log.warning("Cleaning up after job %s failed: %s", handle.job_id, exc)

    # ----------------------------------------------------------------- marks, paths

    def read_marks(self, handle: JobHandle) -> dict[str, Any]:
        """The job's marks, read on its instance (none while the instance is not running: reading would start a
        stopped one)."""
        entry = self.session.instances().get(handle.backend_job_id)
        if entry is None or entry.get("status") not in EXEC_STATES:
            return {}
        answer = self._call(handle.backend_job_id, remote.probe({handle.job_id: "-"}))
        if answer is None:
            raise BrevError(ErrClass.ERR_INFRA, f"instance {handle.backend_job_id} did not answer (reading marks)")
        return remote.parse_probe(answer).marks.get(handle.job_id, {})

    def write_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        """Keep a mark next to the job on its instance; not on an instance that is not running (``brev exec`` would
        start a stopped one: GPU hours for a mark). Its job is not running either, and the mark is not needed."""
        entry = self.session.instances().get(handle.backend_job_id)
        if entry is None or entry.get("status") not in EXEC_STATES:
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

    # ----------------------------------------------------------------- the cost guard


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
