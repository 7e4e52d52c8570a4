"""Launching a job's container on its instance: one ``brev copy`` of its archive, one ``brev exec`` of its launch
script."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_provider_tao.hooks.brev import remote
from airflow_provider_tao.hooks.brev.cli import BrevError
from airflow_provider_tao.hooks.brev.session import BrevSessionHook
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.hooks.shared.cli import write_private_file
from airflow_provider_tao.hooks.shared.secrets import register_secrets
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobSpec

DEFAULT_SHM_SIZE = "16g"
#: The first real exec on an instance: the launch, which pulls the image (a TAO image is many GB).
DEFAULT_LAUNCH_TIMEOUT = 30 * 60.0
COPY_TIMEOUT = 10 * 60.0


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


class BrevLaunchHook(BrevSessionHook):
    """Stages a job on its instance and starts its container."""

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
