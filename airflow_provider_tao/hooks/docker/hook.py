"""The ``docker`` platform: each job is one detached container ``tao-job-<job_id>`` on a Docker daemon.

The daemon may be local (a unix socket) or remote (``tcp://``, optionally TLS): nothing of the worker's
filesystem is assumed on the daemon's host. The job's files and secrets are copied into the created container
with the archive API before it starts (see :mod:`~airflow_provider_tao.hooks.shared.container`), so neither appears in
``docker inspect``; the only host path a job sees is a ``results_root`` the connection declares (a folder on
the daemon's host, bind-mounted at the same path).

One poll of any number of jobs is ONE ``GET /containers/json`` filtered by this provider's label; a container is
inspected once, when it has just ended (exit code, OOM flag), and that verdict is kept. The ownership marks are
small files in the container (``/tao-job/marks``), read and written through the archive API, which works on
running and exited containers alike. Containers are kept after they end (``docker logs`` and the exit code stay
readable) unless the connection sets ``auto_remove``: then they are removed once the task has read the verdict.

The hook is made of parts, one module each: the connection's settings and daemon client
(:mod:`~airflow_provider_tao.hooks.docker.client`) and the creation of a job's container
(:mod:`~airflow_provider_tao.hooks.docker.submit`); this module joins them and adds find, status, logs, cancel and
marks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from airflow_provider_tao.accounting import JobUsage
from airflow_provider_tao.failures import FailureFacts
from airflow_provider_tao.hooks.base import JobValidationError, Recorded
from airflow_provider_tao.hooks.docker.submit import DockerSubmitHook
from airflow_provider_tao.hooks.ownership import cancel_binds
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.hooks.shared.container import container_name
from airflow_provider_tao.hooks.shared.reaping import FINISHED_TASK_STATES
from airflow_provider_tao.jobs import JobHandle, JobState, JobStatus

if TYPE_CHECKING:
    from docker import APIClient

#: Parallel reads of the verdicts of containers that ended since the last poll.
FINAL_READ_WORKERS = 8
#: The mark an ended container gets when the daemon logged an ``oom`` event for it that ``State.OOMKilled`` missed.
MARK_LATE_OOM = "late_oom"


class TAODockerHook(DockerSubmitHook):
    """Runs jobs as containers on a Docker daemon, through the docker provider's ``DockerHook`` client.

    Connection type ``tao_docker`` (optional: without a connection the environment decides). Fields:
    ``host`` = daemon URL (``DOCKER_HOST``, default the local socket); ``login`` / ``password`` = registry user
    (default ``$oauthtoken``) and key (the NGC key) used to pull missing images. Extras: ``registry`` (the
    registry those credentials are for, e.g. ``nvcr.io``; unset = any), ``network`` (``DOCKER_NETWORK``, default
    ``tao_default``, created when missing), ``auto_remove`` (``DOCKER_AUTO_REMOVE``, default false),
    ``results_root`` (a folder on the daemon's host mounted into every job and exported as ``TAO_RESULTS_ROOT``),
    ``shm_size`` (default 16g), ``cancel_grace_seconds`` (default 10), ``tls_ca_cert`` / ``tls_client_cert`` /
    ``tls_client_key`` (paths on the Airflow hosts, for a ``tcp://`` daemon with TLS).

    ``backend_details`` of a job: ``mem_limit`` ("8g"), ``cpus`` (2.5), ``shm_size``, ``mounts`` (list of
    ``"host:container[:ro]"``), ``user`` (numeric ``uid[:gid]``), ``entrypoint`` (replaces the image's; "" clears
    it), ``gpu_ids`` (explicit device ids, e.g. ``["0", "2"]``), ``working_dir``.

    :param conn_id: the ``tao_docker`` connection, or None for the environment's defaults.
    """

    platform = "docker"
    conn_type = "tao_docker"
    extra_modules = ("docker", ("airflow.providers.docker", "docker"))
    default_conn_name = "tao_docker_default"
    hook_name = "TAO Docker"
    # Container names: [a-zA-Z0-9][a-zA-Z0-9_.-]*; "tao-job-" + job_id, and the deterministic name is a label.
    name_max_length = 128
    marks_storage = "small files inside the job's container (/tao-job/marks), through the archive API"
    env_fallbacks = {"host": "DOCKER_HOST", "network": "DOCKER_NETWORK", "auto_remove": "DOCKER_AUTO_REMOVE"}

    # ----------------------------------------------------------------- settings and client

    def job_location(self, handle: JobHandle) -> dict[str, str]:
        name = container_name(handle.job_id)
        return {"Container": name, "Daemon": self.base_url, "Log": f"docker logs {name}"}

    def list_active_jobs(self) -> list[JobHandle]:
        """This provider's containers that have not ended (one list call)."""
        return [self._handle_of(c) for c in self._list() if c.get("State") in ("running", "paused", "restarting")]

    def reap_resources(
        self, task_state: Callable[[Mapping[str, Any]], str | None], *, dry_run: bool, recorded: Recorded | None = None
    ) -> list[dict[str, str]]:
        """Containers created but never started past :data:`~airflow_provider_tao.hooks.shared.container.
        START_TIMEOUT_SECONDS`: their submitting worker died between creating and starting them. Nothing ran, but
        the job's files and secrets are in them; no list of active jobs shows them and a next try may never come.
        With ``auto_remove``, also ended containers whose task is over (by their own labels): the task that would
        have removed them after reading their verdict never resumed (issue 37, defect 7)."""
        rows = []
        for container in self._list():
            why = self._reapable(container, task_state)
            if why is None:
                continue
            name = str((container.get("Names") or [container["Id"][:12]])[0]).lstrip("/")
            if not dry_run:
                self._remove(container["Id"])
            rows.append({"resource": name, "kind": "container", "action": "would remove" if dry_run else "removed",
                         "why": why})  # fmt: skip
        return rows

    def _reapable(
        self, container: Mapping[str, Any], task_state: Callable[[Mapping[str, Any]], str | None]
    ) -> str | None:
        """Why the sweeper removes ``container``, or None to keep it."""
        state = container.get("State")
        if state == "created" and ct.never_started("created", container.get("Created")):
            return "created but never started: its submitting worker died"
        if not self.auto_remove or state not in ("exited", "dead"):
            return None
        labels = container.get("Labels") or {}
        origin = {key: labels.get(label) for key, label in ct.ORIGIN_LABELS.items()}
        task = task_state(origin) if origin.get("dag_id") else None
        if task not in FINISHED_TASK_STATES:  # unknown, or a try may still read its verdict (or adopt it)
            return None
        return f"ended, and its task is {task}: no try will read its verdict (auto_remove)"

    # ----------------------------------------------------------------- validation

    # ----------------------------------------------------------------- submit

    # ----------------------------------------------------------------- find, status

    def _list(self, *labels: str) -> list[dict[str, Any]]:
        """ONE ``GET /containers/json`` of this provider's containers, narrowed by more labels."""
        filters = {"label": [f"{ct.LABEL_MANAGED}=true", *labels]}
        return list(self.client.containers(all=True, filters=filters))

    def find_job(self, name: str) -> JobHandle | None:
        """The newest container of this name. One that was created but never started belongs to a worker that died
        mid-submission (only one try of a task instance runs at a time, and this is a later one): it never ran
        anything, so it is removed, not reattached to."""
        found = []
        for container in self._list(f"{ct.LABEL_NAME}={name}"):
            if container.get("State") == "created":
                self.log.info("Removing container %s: its try died before starting it", container["Id"][:12])
                self._remove(container["Id"])
            else:
                found.append(container)
        if not found:
            return None
        # Created is whole seconds: a retry's container made in the same second as the last try's is told by its try
        return self._handle_of(
            max(found, key=lambda c: (int(c.get("Created") or 0), int((c.get("Labels") or {}).get(ct.LABEL_TRY) or 0)))
        )

    def _handle_of(self, container: dict[str, Any]) -> JobHandle:
        """The handle of a listed container, from its labels."""
        labels = container.get("Labels") or {}
        return JobHandle(
            platform=self.platform,
            conn_id=self.conn_id,
            job_id=labels[ct.LABEL_JOB_ID],
            name=labels.get(ct.LABEL_NAME, ""),
            backend_job_id=container["Id"],
            results_dir=labels.get(ct.LABEL_RESULTS_DIR, ""),
            try_number=int(labels.get(ct.LABEL_TRY) or 1),
            submitted_at=float(container.get("Created") or time.time()),
        )

    def get_job_status(self, handle: JobHandle) -> JobStatus:
        return self.get_job_statuses([handle])[handle.job_id]

    def get_job_statuses(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        """One list call for the batch (narrowed to the job when there is one); an inspect per container that has
        just ended. A daemon that does not answer raises: the caller turns that into Unknown."""
        wanted = {container_name(h.job_id): h for h in handles}
        with self._lock:
            statuses = {name: final for name in wanted if (final := self._ended.get(name)) is not None}
        pending = [name for name in wanted if name not in statuses]
        listed: dict[str, dict[str, Any]] = {}
        if pending:
            narrow = [f"{ct.LABEL_JOB_ID}={wanted[pending[0]].job_id}"] if len(pending) == 1 else []
            listed = {c["Names"][0].lstrip("/"): c for c in self._list(*narrow) if c.get("Names")}
        ended = [name for name in pending if name in listed and listed[name].get("State") not in ct.LIVE_STATES]
        statuses.update((name, self._status(name, listed.get(name))) for name in pending if name not in ended)
        if ended:
            # Containers that just ended are inspected side by side: many jobs ending at once (a cancel of a sweep)
            # must not make the last trigger wait for hundreds of sequential reads.
            with ThreadPoolExecutor(max_workers=min(FINAL_READ_WORKERS, len(ended))) as pool:
                verdicts = pool.map(lambda name: self._status(name, listed[name]), ended)
                statuses.update(zip(ended, verdicts, strict=True))
        return {handle.job_id: statuses[name] for name, handle in wanted.items()}

    def _status(self, name: str, listed: dict[str, Any] | None) -> JobStatus:
        if listed is None:
            return JobStatus.missing(
                f"container {name} no longer exists on {self.base_url}: it was removed outside Airflow "
                "(docker rm, a prune) or the daemon's data was lost"
            )
        state = str(listed.get("State") or "")
        if state in ct.LIVE_STATES:
            return ct.live_status(name, state, float(listed.get("Created") or 0), str(listed.get("Status") or ""))
        # exited, dead or removing: the container has ended; read its verdict once and keep it.
        status = self._final_status(name)
        if status.state.is_terminal:
            with self._lock:
                self._ended[name] = status
        return status

    def _final_status(self, name: str) -> JobStatus:
        from docker.errors import NotFound

        try:
            state = self.client.inspect_container(name)["State"]
        except NotFound:
            return JobStatus.missing(f"container {name} was removed as it ended")
        if _maybe_late_oom(state) and self._oom_logged(name, state):
            # read at the first look at the ended container and kept with it: the daemon keeps its last 256 events
            # only (on a busy engine a minute's worth, our own mark reads among them), the analysis comes later
            self.write_mark_of(name, MARK_LATE_OOM, True)
        return ct.ended_status(name, state, lambda: cancel_binds(self.read_marks_of(name)))

    def get_job_usage(self, handle: JobHandle) -> JobUsage:
        """From ``docker inspect``: the container's Created, State.StartedAt / FinishedAt and its GPU requests."""
        from docker.errors import NotFound

        try:
            info = self.client.inspect_container(container_name(handle.job_id))
        except NotFound:
            return super().get_job_usage(handle)
        return ct.container_usage(
            ct.docker_time(str(info.get("Created") or "")),
            info.get("State") or {},
            ct.requested_gpus(info.get("HostConfig") or {}),
            "the container's Created / State.StartedAt / State.FinishedAt (docker inspect)",
        )

    # ----------------------------------------------------------------- logs

    def get_job_logs(self, handle: JobHandle, cursor: str = "", tail: int | None = None) -> tuple[str, str]:
        """By timestamp cursor (see :func:`~airflow_provider_tao.hooks.shared.container.read_after`)."""
        from docker.errors import NotFound

        cursor = cursor if tail is None else ""
        last, _ = ct.parse_log_cursor(cursor)
        params: dict[str, Any] = {"stdout": 1, "stderr": 1, "timestamps": 1, "follow": 0, "tail": tail or "all"}
        if last:
            params["since"] = ct.cursor_second(last)
        try:
            stream = _log_stream(self.client, container_name(handle.job_id), params)
        except NotFound:
            return "", cursor
        try:
            return ct.read_after(ct.timestamped_lines(stream), cursor)
        finally:
            stream.close()

    # ----------------------------------------------------------------- cancel, failure analysis, cleanup

    def _cancel(self, handle: JobHandle) -> bool:
        from docker.errors import NotFound

        name = container_name(handle.job_id)
        try:
            self.client.stop(name, timeout=self.cancel_grace_seconds)
        except NotFound:
            return True
        # Even with auto_remove the stopped container stays: its cancel marks are what a waiting task reads to
        # fail for good (ERR_CANCELED) rather than see "no such job" and resubmit. cleanup_job removes it.
        return True

    def failure_facts(self, handle: JobHandle) -> FailureFacts:
        name = container_name(handle.job_id)
        status = self.get_job_status(handle)  # the ended container's verdict, inspected once and kept
        text, _ = self.get_job_logs(handle, tail=200)
        events = [status.message] if status.message else []
        late_oom = (
            status.raw_state != "OOMKilled"
            and status.exit_code == 137
            and bool(self.read_marks_of(name).get(MARK_LATE_OOM) or self._oom_logged(name))
        )
        if late_oom:
            events.append(f"the daemon logged an oom event for {name} (its OOM came after its exit)")
        return FailureFacts(
            exit_code=status.exit_code,
            raw_state=status.raw_state,
            oom_killed=status.raw_state == "OOMKilled" or late_oom,
            canceled=status.state is JobState.CANCELED,
            log_tail=text.splitlines(),
            events=events,
            message=status.message,
            details={"container": name, "daemon": self.base_url},
        )

    def _oom_logged(self, name: str, state: Mapping[str, Any] | None = None) -> bool:
        """Whether the daemon logged an ``oom`` event for the container while it ran. A container the kernel kills
        right after its start can exit 137 with ``State.OOMKilled`` false: containerd may deliver the task's OOM
        after its exit (containerd#8180, fixed in 2.2), and Docker 20.10 (Debian 12's ``docker.io``) takes the flag
        from the exit alone -- but logs the late ``oom`` event all the same. The daemon keeps its last 256 events:
        read when the status first shows the exit (the ``late_oom`` mark keeps the answer), and at the analysis."""
        from docker.errors import NotFound

        if state is None:
            try:
                state = self.client.inspect_container(name)["State"]
            except NotFound:
                return False
        started = ct.docker_time(str(state.get("StartedAt") or ""))
        finished = ct.docker_time(str(state.get("FinishedAt") or ""))
        if started is None or finished is None:
            return False
        # `until` a little past the exit (the daemon's clock): the late event lands milliseconds after it
        events = self.client.events(
            since=int(started),
            until=int(finished) + 3,
            filters={"type": "container", "container": name, "event": "oom"},
            decode=True,
        )
        try:
            return any(True for _ in events)
        finally:
            events.close()

    def cleanup_job(self, handle: JobHandle, *, adoptable: bool = False) -> None:
        """With ``auto_remove``, the ended container goes once its verdict has been read."""
        if self.auto_remove and self.get_job_status(handle).state.is_terminal:
            self._remove(container_name(handle.job_id))

    # ----------------------------------------------------------------- paths and marks

    def check_path(self, uri: str) -> bool:
        """A local input must exist on the daemon's host; a remote daemon's host cannot be looked at from here,
        so the in-job runner checks it (and fails the job as ``ERR_CONFIG`` if it is missing)."""
        path = uri.removeprefix("file://")
        if self.daemon_is_local:
            return os.path.exists(path)
        self.log.info("%s is on the remote daemon host %s: the job checks it", path, self.base_url)
        return True

    def list_path(self, uri: str) -> list[str]:
        path = uri.removeprefix("file://")
        if not self.daemon_is_local:
            raise JobValidationError(
                "uri", f"{path} is on the remote daemon host {self.base_url}", "Read results from s3:// instead"
            )
        return sorted(os.listdir(path)) if os.path.isdir(path) else []

    def read_marks(self, handle: JobHandle) -> dict[str, Any]:
        return self.read_marks_of(container_name(handle.job_id))

    def read_marks_of(self, name: str) -> dict[str, Any]:
        from docker.errors import NotFound

        try:
            stream, _ = self.client.get_archive(name, ct.MARKS_DIR)
            return ct.read_mark_archive(b"".join(stream))
        except NotFound:
            return {}  # no container (or no marks): nothing was claimed

    def write_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        self.write_mark_of(container_name(handle.job_id), key, value)

    def write_mark_of(self, name: str, key: str, value: Any) -> None:
        from docker.errors import NotFound

        try:
            self.client.put_archive(name, ct.MARKS_DIR, ct.mark_archive(key, value))
        except NotFound:
            self.log.info("Container %s is gone: mark %s not kept", name, key)


def _maybe_late_oom(state: Mapping[str, Any]) -> bool:
    """An ended container whose exit could be an OOM kill the daemon did not flag (see ``_oom_logged``)."""
    return int(state.get("ExitCode") or 0) == 137 and not state.get("OOMKilled")


def _log_stream(client: APIClient, name: str, params: dict[str, Any]) -> Any:
    """``GET /containers/{name}/logs`` as a closable stream of frames. docker-py's ``logs()`` first inspects the
    container to learn whether it has a TTY -- a second request per read, per job, per poll; this provider's
    containers never have one, so the response is read as the multiplexed stream it always is."""
    from docker.types.daemon import CancellableStream

    response = client._get(client._url("/containers/{0}/logs", name), params=params, stream=True)
    return CancellableStream(client._get_result_tty(True, response, False), response)
