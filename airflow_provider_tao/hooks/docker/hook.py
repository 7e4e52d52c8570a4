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
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow_provider_tao.accounting import JobUsage
from airflow_provider_tao.failures import FailureFacts
from airflow_provider_tao.hooks.base import (
    MARK_CANCEL,
    MARK_OWNER,
    ConnectionProblem,
    JobSubmitError,
    JobValidationError,
    TAOPlatformHook,
)
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.hooks.shared.container import container_name
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobSpec, JobState, JobStatus

if TYPE_CHECKING:
    from docker import APIClient

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
DEFAULT_NETWORK = "tao_default"
DEFAULT_SHM_SIZE = "16g"
DEFAULT_REGISTRY_LOGIN = "$oauthtoken"
#: Parallel reads of the verdicts of containers that ended since the last poll.
FINAL_READ_WORKERS = 8


class TAODockerHook(TAOPlatformHook):
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

    def __init__(self, conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(conn_id, **kwargs)
        self._ended: dict[str, JobStatus] = {}  # container name -> its final status (an ended container is final)
        self._lock = threading.Lock()
        self._network_ready = False
        self._tegra: bool | None = None

    # ----------------------------------------------------------------- settings and client

    @property
    def base_url(self) -> str:
        self.load_connection()
        return str(self.setting("host", DEFAULT_SOCKET))

    @property
    def network(self) -> str:
        self.load_connection()
        return str(self.setting("network", DEFAULT_NETWORK))

    @property
    def auto_remove(self) -> bool:
        self.load_connection()
        return str(self.setting("auto_remove", "false")).strip().lower() in ("1", "true", "yes", "on")

    @property
    def cancel_grace_seconds(self) -> int:
        self.load_connection()
        return max(0, int(float(self.setting("cancel_grace_seconds", 10))))

    def default_results_root(self) -> str | None:
        self.load_connection()
        root = self.setting("results_root")
        return str(root).rstrip("/") if root else None

    def _daemon(self) -> tuple[str, Any]:
        """The daemon's URL (``https://`` when the connection has TLS files) and its TLS config."""
        from airflow.providers.docker.hooks.docker import DockerHook

        self.load_connection()
        tls = DockerHook.construct_tls_config(
            ca_cert=self.setting("tls_ca_cert"),
            client_cert=self.setting("tls_client_cert"),
            client_key=self.setting("tls_client_key"),
        )
        url = self.base_url
        if tls and url.startswith("tcp://"):
            url = "https://" + url.removeprefix("tcp://")
        return url, tls

    @cached_property
    def client(self) -> APIClient:
        """The docker provider's client for the connection's daemon (no registry login: pulls carry their auth)."""
        from airflow.providers.docker.hooks.docker import DockerHook

        url, tls = self._daemon()
        return DockerHook(docker_conn_id=None, base_url=url, version="auto", tls=tls).api_client

    def probe_connection(self) -> str:
        """Ping the daemon and read its version (``GET /_ping``, ``GET /version``)."""
        from docker import APIClient

        url, tls = self._daemon()
        try:
            # docker's own client: the provider's hook replaces the reason of a failure with a generic message
            with APIClient(base_url=url, version="auto", tls=tls, timeout=30) as client:
                client.ping()
                version = client.version()
        except Exception as exc:
            raise docker_problem(self.base_url, exc) from exc
        return f"Docker {version.get('Version')} (API {version.get('ApiVersion')}) at {self.base_url}"

    def job_location(self, handle: JobHandle) -> dict[str, str]:
        name = container_name(handle.job_id)
        return {"Container": name, "Daemon": self.base_url, "Log": f"docker logs {name}"}

    def list_active_jobs(self) -> list[JobHandle]:
        """This provider's containers that have not ended (one list call)."""
        return [self._handle_of(c) for c in self._list() if c.get("State") in ("running", "paused", "restarting")]

    def reap_resources(
        self, task_state: Callable[[Mapping[str, Any]], str | None], *, dry_run: bool
    ) -> list[dict[str, str]]:
        """Containers created but never started past :data:`~airflow_provider_tao.hooks.shared.container.
        START_TIMEOUT_SECONDS`: their submitting worker died between creating and starting them. Nothing ran, but
        the job's files and secrets are in them; no list of active jobs shows them and a next try may never come."""
        rows = []
        for container in self._list():
            if container.get("State") != "created" or not ct.never_started("created", container.get("Created")):
                continue
            name = str((container.get("Names") or [container["Id"][:12]])[0]).lstrip("/")
            if not dry_run:
                self._remove(container["Id"])
            rows.append({"resource": name, "kind": "container", "action": "would remove" if dry_run else "removed",
                         "why": "created but never started: its submitting worker died"})  # fmt: skip
        return rows

    async def aclose(self) -> None:
        if "client" in self.__dict__:
            self.__dict__.pop("client").close()

    # ----------------------------------------------------------------- validation

    def image_required(self, spec: JobSpec) -> str | None:
        return "is required on the docker platform: every job is a container"

    def validate_spec(self, spec: JobSpec) -> None:
        super().validate_spec(spec)
        ct.check_container_details(spec, self.platform_details(spec), ct.CONTAINER_DETAIL_KEYS, self.platform)
        if spec.results_uri and not spec.results_uri.startswith(("s3://", "/")):
            raise JobValidationError(
                "results_uri",
                f"{spec.results_uri!r} is neither a folder on the daemon's host nor an s3:// URI",
                "Use s3:// with storage_conn_id, or set results_root on the tao_docker connection",
            )

    # ----------------------------------------------------------------- submit

    def create_job(self, spec: JobSpec, try_number: int = 1) -> JobHandle:
        from docker.errors import APIError, ImageNotFound

        self.validate_spec(spec)
        assert spec.image is not None, "image_required() makes the operator demand one"
        details = self.platform_details(spec)
        self._ensure_network()
        results_root = spec.results_uri if spec.results_uri and spec.results_uri.startswith("/") else None
        results_root = results_root or self.default_results_root()
        handle = self.new_handle(spec, try_number)
        name = container_name(spec.job_id)
        env = self.tao_env(spec, files_dir=ct.FILES_DIR, results_root=results_root)
        env.update(self._gpu_env(spec))
        create: dict[str, Any] = {
            "image": spec.image,
            "command": ct.launcher_argv(spec.command),
            "name": name,
            "environment": env,
            "labels": ct.job_labels(spec, try_number, handle.results_dir),
            "host_config": self._host_config(spec, details, results_root),
            "detach": True,
        }
        if "entrypoint" in details:
            create["entrypoint"] = details["entrypoint"] or ""
        if details.get("user"):
            create["user"] = str(details["user"])
        if details.get("working_dir"):
            create["working_dir"] = str(details["working_dir"])
        try:
            try:
                container = self.client.create_container(**create)
            except ImageNotFound:  # as `docker run` does: pull only when the daemon lacks the image
                self._pull(spec.image)
                container = self.client.create_container(**create)
        except APIError as exc:
            raise JobSubmitError(_refusal_class(exc), f"Docker refused container {name}: {_explain(exc)}") from exc
        handle = replace(handle, backend_job_id=container["Id"])
        try:
            # The results folder is made through the mount too: it works on a remote daemon's host as well.
            folders = [handle.results_dir] if results_root and handle.results_dir.startswith("/") else []
            owner = ct.container_owner(details)
            archive = ct.job_archive(spec.files, spec.secret_env, {MARK_OWNER: try_number}, owner, folders)
            self.client.put_archive(name, "/", archive)
            self.client.start(name)
        except APIError as exc:
            # Not started: nothing runs, so nothing is left behind either.
            self._remove(name)
            raise JobSubmitError(_refusal_class(exc), f"container {name} did not start: {_explain(exc)}") from exc
        return handle

    def _host_config(self, spec: JobSpec, details: dict[str, Any], results_root: str | None) -> dict[str, Any]:
        from docker.types import DeviceRequest

        binds = ct.container_mounts(details)
        if results_root:
            binds.append(f"{results_root}:{results_root}:rw")
        options: dict[str, Any] = {
            "binds": binds,
            "network_mode": self.network,
            "shm_size": str(details.get("shm_size") or self.setting("shm_size", DEFAULT_SHM_SIZE)),
            # A tiny init as PID 1 passes the stop signal on: a cancel takes as long as the job's own shutdown.
            "init": True,
        }
        if details.get("mem_limit"):
            # RAM and swap together: past the limit the job is OOM-killed (and says so) instead of swapping.
            options["mem_limit"] = options["memswap_limit"] = details["mem_limit"]
        if details.get("cpus") is not None:
            options["nano_cpus"] = int(float(details["cpus"]) * 1e9)
        if spec.gpu_count != 0:
            if self.is_tegra:
                options["runtime"] = "nvidia"  # Jetson: GPUs come from the runtime and NVIDIA_VISIBLE_DEVICES
            elif (ids := ct.container_gpu_ids(spec)) is not None:
                options["device_requests"] = [DeviceRequest(device_ids=ids, capabilities=[["gpu"]])]
            else:
                options["device_requests"] = [DeviceRequest(count=spec.gpu_count, capabilities=[["gpu"]])]
        return dict(self.client.create_host_config(**options))

    def _gpu_env(self, spec: JobSpec) -> dict[str, str]:
        if spec.gpu_count == 0:
            return dict(ct.NO_GPU_ENV)
        if not self.is_tegra:
            return {}
        ids = ct.container_gpu_ids(spec)
        visible = ",".join(ids) if ids else "all" if spec.gpu_count == -1 else ",".join(map(str, range(spec.gpu_count)))
        return {"NVIDIA_VISIBLE_DEVICES": visible, "NVIDIA_DRIVER_CAPABILITIES": "all"}

    @property
    def is_tegra(self) -> bool:
        """A Jetson/Tegra daemon (its kernel says so): GPUs through the nvidia runtime, not device requests."""
        if self._tegra is None:
            self._tegra = "tegra" in str(self.client.info().get("KernelVersion", "")).lower()
        return self._tegra

    def _pull(self, image: str) -> None:
        """Pull an image the daemon does not have; a failed pull refuses the job (never retried)."""
        from docker.errors import APIError
        from docker.utils import parse_repository_tag

        repository, tag = parse_repository_tag(image)
        self.log.info("Pulling %s (not on the daemon)", image)
        failure = ""
        try:
            for line in self.client.pull(repository, tag or "latest", stream=True, decode=True, **self._auth(image)):
                failure = str(line.get("error") or failure) if isinstance(line, dict) else failure
        except APIError as exc:
            failure = _explain(exc)
        if not failure:
            return
        raise JobSubmitError(
            ErrClass.ERR_IMAGE_PULL,
            f"cannot pull image {image!r} on {self.base_url}: {failure}. Check the image name and tag, and the "
            "tao_docker connection's registry login/password (the NGC key for nvcr.io)",
        )

    def _auth(self, image: str) -> dict[str, Any]:
        """Registry credentials for this image's pull (an HTTP header of the pull only, stored nowhere)."""
        password = self.setting("password")
        registry = self.setting("registry")
        if not password or (registry and not image.startswith(f"{str(registry).rstrip('/')}/")):
            return {}
        auth = {"username": self.setting("login", DEFAULT_REGISTRY_LOGIN), "password": password}
        if registry:
            auth["serveraddress"] = str(registry)
        return {"auth_config": auth}

    def _ensure_network(self) -> None:
        """The jobs' network, created when missing as the TAO SDK does (else every start fails instantly)."""
        from docker.errors import APIError, NotFound

        if self._network_ready or self.network in ("host", "none", "bridge", "default"):
            return
        try:
            self.client.inspect_network(self.network)
        except NotFound:
            try:
                self.client.create_network(self.network, driver="bridge", labels={ct.LABEL_MANAGED: "true"})
                self.log.info("Created Docker network %s", self.network)
            except APIError as exc:
                if exc.status_code != 409:  # another worker created it just now
                    raise
        self._network_ready = True

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
        return ct.ended_status(name, state, lambda: self.read_marks_of(name).get(MARK_CANCEL) is not None)

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
        return FailureFacts(
            exit_code=status.exit_code,
            raw_state=status.raw_state,
            oom_killed=status.raw_state == "OOMKilled",
            canceled=status.state is JobState.CANCELED,
            log_tail=text.splitlines(),
            events=[status.message] if status.message else [],
            message=status.message,
            details={"container": name, "daemon": self.base_url},
        )

    def cleanup_job(self, handle: JobHandle) -> None:
        """With ``auto_remove``, the ended container goes once its verdict has been read."""
        if self.auto_remove and self.get_job_status(handle).state.is_terminal:
            self._remove(container_name(handle.job_id))

    def _remove(self, name: str) -> None:
        from docker.errors import APIError

        try:
            self.client.remove_container(name, force=True, v=True)
        except APIError as exc:
            if exc.status_code != 404:
                self.log.warning("Could not remove container %s: %s", name, _explain(exc))

    # ----------------------------------------------------------------- paths and marks

    @property
    def daemon_is_local(self) -> bool:
        """A unix socket (or a loopback TCP daemon): the daemon's host paths are this machine's paths."""
        url = self.base_url
        return url.startswith("unix://") or url.split("://")[-1].split(":")[0] in ("localhost", "127.0.0.1")

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
        from docker.errors import NotFound

        try:
            self.client.put_archive(container_name(handle.job_id), ct.MARKS_DIR, ct.mark_archive(key, value))
        except NotFound:
            self.log.info("Job %s has no container any more: mark %s not kept", handle.job_id, key)


def docker_problem(url: str, exc: Exception) -> ConnectionProblem:
    """The words for a daemon that did not answer the ping: no daemon there, a socket the user may not open,
    TLS or credentials refused by the daemon (or the proxy in front of it)."""
    from docker.errors import APIError

    text = str(exc)
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if not isinstance(exc, APIError) and (found := re.search(r"\b(401|403|407) Client Error", text)):
        status = int(found.group(1))  # docker's "Error while fetching server API version: 401 Client Error ..."
    if status in (401, 407):
        return ConnectionProblem("auth", f"the daemon at {url} refused the credentials ({status}): {text}")
    if status == 403:
        return ConnectionProblem("permission", f"the daemon at {url} does not allow this client ({status}): {text}")
    if "Permission denied" in text or isinstance(exc, PermissionError):
        return ConnectionProblem(
            "permission", f"cannot open {url}: permission denied (add the Airflow user to the docker group)"
        )
    if "SSL" in text or "certificate" in text.lower():
        return ConnectionProblem("auth", f"TLS with the daemon at {url} failed: {text}; check the TLS files")
    return ConnectionProblem(
        "unreachable", f"no Docker daemon answers at {url} ({text}); check the daemon URL and that dockerd runs"
    )


def _explain(exc: Exception) -> str:
    return str(getattr(exc, "explanation", None) or exc)


def _refusal_class(exc: Exception) -> ErrClass:
    """A daemon refusing a container: a bad setting (unknown runtime, no GPU driver, a bad mount) is the job's
    configuration; anything else is the platform's."""
    status = getattr(exc, "status_code", None)
    return ErrClass.ERR_CONFIG if status is not None and 400 <= int(status) < 500 else ErrClass.ERR_INFRA


def _log_stream(client: APIClient, name: str, params: dict[str, Any]) -> Any:
    """``GET /containers/{name}/logs`` as a closable stream of frames. docker-py's ``logs()`` first inspects the
    container to learn whether it has a TTY -- a second request per read, per job, per poll; this provider's
    containers never have one, so the response is read as the multiplexed stream it always is."""
    from docker.types.daemon import CancellableStream

    response = client._get(client._url("/containers/{0}/logs", name), params=params, stream=True)
    return CancellableStream(client._get_result_tty(True, response, False), response)
