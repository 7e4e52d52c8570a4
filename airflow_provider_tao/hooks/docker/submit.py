"""What a ``docker`` job is created as: its checked spec, the image pulled with the connection's registry key, the
network, the container's host config and GPUs."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_provider_tao.hooks.base import (
    MARK_OWNER,
    JobSubmitError,
    JobValidationError,
)
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.hooks.shared.container import container_name
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobSpec

if TYPE_CHECKING:
    pass
from airflow_provider_tao.hooks.docker.client import DockerClientHook, explain, refusal_class

DEFAULT_SHM_SIZE = "16g"
DEFAULT_REGISTRY_LOGIN = "$oauthtoken"


class DockerSubmitHook(DockerClientHook):
    """Validates a job and creates and starts its container."""

    def validate_spec(self, spec: JobSpec) -> None:
        super().validate_spec(spec)
        ct.check_container_details(spec, self.platform_details(spec), ct.CONTAINER_DETAIL_KEYS, self.platform)
        if spec.results_uri and not spec.results_uri.startswith(("s3://", "/")):
            raise JobValidationError(
                "results_uri",
                f"{spec.results_uri!r} is neither a folder on the daemon's host nor an s3:// URI",
                "Use s3:// with storage_conn_id, or set results_root on the tao_docker connection",
            )

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
            raise JobSubmitError(refusal_class(exc), f"Docker refused container {name}: {explain(exc)}") from exc
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
            raise JobSubmitError(refusal_class(exc), f"container {name} did not start: {explain(exc)}") from exc
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
            failure = explain(exc)
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
