"""What a job becomes on the cluster: its checked settings, its sbatch plan (time, container runtime, inputs,
directives), its results folder, and the preflight that checks them on the cluster before anything is submitted."""

from __future__ import annotations

import math
from typing import Any

from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.hooks.shared.env import MULTI_NODE_VARS
from airflow_provider_tao.hooks.slurm import commands as scmd
from airflow_provider_tao.hooks.slurm import script as ss
from airflow_provider_tao.hooks.slurm.connection import SlurmConnectionHook, truthy
from airflow_provider_tao.jobs import JobSpec

BACKEND_KEYS = frozenset(
    {
        "partition", "account", "time_hours", "time_minutes", "timeout_hours", "cpus_per_task", "gpus_per_node",
        "container_runtime", "oci_bundle", "container_mounts", "nodelist", "exclude", "qos", "constraint",
        "reservation", "mem", "master_port", "max_resubmits", "use_sqsh", "force_reconvert_latest", "inputs",
        "backend_type", "cluster_name",
    }
)  # fmt: skip


_DIRECTIVES = {"nodelist": "--nodelist", "exclude": "--exclude", "qos": "--qos", "constraint": "--constraint",
               "reservation": "--reservation", "mem": "--mem"}  # fmt: skip


class SlurmPlanHook(SlurmConnectionHook):
    """Validates a job and plans its sbatch script."""

    def image_required(self, spec: JobSpec) -> str | None:
        """Only pyxis needs an image: ``none`` runs on the nodes' OS, ``oci`` runs a bundle folder."""
        runtime = str(self._detail(spec, "container_runtime", "pyxis")).lower()
        return "is required with container_runtime=pyxis" if runtime == "pyxis" else None

    def plan(self, spec: JobSpec) -> ss.SbatchPlan:
        """Every scheduling decision for ``spec``; bad input raises :class:`JobValidationError`."""
        unknown = set(self.platform_details(spec)) - BACKEND_KEYS
        if unknown:
            raise JobValidationError(
                "backend_details", f"unknown key(s) {sorted(unknown)}", f"Use: {', '.join(sorted(BACKEND_KEYS))}"
            )
        runtime = str(self._detail(spec, "container_runtime", "pyxis")).lower()
        if runtime not in ss.RUNTIMES:
            raise JobValidationError("container_runtime", f"{runtime!r} is not supported", f"Use {ss.RUNTIMES}")
        words = {key: self._detail(spec, key) for key in ("partition", "account", *_DIRECTIVES)}
        for key, value in words.items():
            if value is not None and not ss.SAFE_WORD.match(str(value)):
                raise JobValidationError(key, f"{value!r} has characters Slurm names never have", "Fix the value")
        gpus_per_node = int(self._detail(spec, "gpus_per_node", 8))
        nodes, per_node, exclusive = spec.num_nodes, spec.gpu_count, False
        if spec.gpu_count == -1:
            per_node, exclusive = gpus_per_node, gpus_per_node > 0
        elif spec.gpu_count > 0 and gpus_per_node <= 0:
            raise JobValidationError(
                "gpu_count", f"asked for {spec.gpu_count} GPU(s) but gpus_per_node is {gpus_per_node}",
                "Use gpu_count=0 on a CPU-only cluster, or set the connection's gpus_per_node",
            )  # fmt: skip
        elif gpus_per_node > 0 and spec.gpu_count >= gpus_per_node:
            # The seeds' rule: a request of at least a full node is exclusive, in whole nodes of GPUs.
            nodes = max(spec.num_nodes, math.ceil(spec.gpu_count / gpus_per_node))
            per_node, exclusive = gpus_per_node, True
        cpus = int(self._detail(spec, "cpus_per_task", 16))
        if cpus < 1:
            raise JobValidationError("cpus_per_task", f"{cpus} is not allowed", "Use 1 or more")
        minutes = self._time_minutes(spec)
        timeout = self._detail(spec, "timeout_hours")
        inner = float(timeout) * 60 if timeout not in (None, "") else minutes - 12
        inner = min(inner, minutes - 12)  # the inner guard must fire before Slurm's own kill
        directives = tuple((flag, str(words[key])) for key, flag in _DIRECTIVES.items() if words[key] is not None)
        container, mounts, env_names, sqsh, enroot = self._container(spec, runtime)
        return ss.SbatchPlan(
            nodes=nodes,
            gpus_per_node=max(per_node, 0),
            cpus_per_task=cpus,
            time_minutes=minutes,
            timeout_minutes=inner if inner >= 1 else None,
            runtime=runtime,
            partition=words["partition"],
            account=words["account"],
            exclusive=exclusive,
            container=container,
            container_mounts=mounts,
            container_env=env_names,
            sqsh_cache=sqsh,
            enroot_uri=enroot,
            force_reconvert=bool(
                sqsh and spec.image and spec.image.endswith(":latest")
                and truthy(self._detail(spec, "force_reconvert_latest", False))
            ),
            master_port=int(self._detail(spec, "master_port", 29500)),
            directives=directives,
        )  # fmt: skip

    def _time_minutes(self, spec: JobSpec) -> float:
        if spec.backend_details.get("time_minutes") not in (None, ""):
            minutes = float(spec.backend_details["time_minutes"])
        else:
            minutes = float(self._detail(spec, "time_hours", 4)) * 60
        max_hours = float(self.setting("max_time_hours", 4))
        if minutes <= 0:
            raise JobValidationError("time_hours", f"{minutes / 60:g} h is not allowed", "Use a positive wall time")
        if minutes > max_hours * 60:
            raise JobValidationError(
                "time_hours",
                f"{minutes / 60:g} h is above this connection's max_time_hours ({max_hours:g} h)",
                "Ask for less time, or use a connection / partition that allows longer jobs",
            )
        return minutes

    def _container(self, spec: JobSpec, runtime: str) -> tuple[Any, ...]:
        """(container, mounts, env names for pyxis, sqsh cache file, enroot URI) of the runtime."""
        if runtime == "none":
            if spec.image:
                self.log.info("container_runtime=none: image %r is not used; the job runs on the nodes' OS", spec.image)
            return None, (), (), None, None
        if runtime == "oci":
            bundle = self._detail(spec, "oci_bundle") or (
                spec.image if spec.image and spec.image.startswith("/") else None
            )
            if not bundle or not ss.SAFE_PATH.match(str(bundle)):
                raise JobValidationError(
                    "oci_bundle",
                    f"container_runtime=oci needs an OCI bundle folder on the cluster (got {bundle!r})",
                    "Pass image='/path/to/bundle' or backend_details={'oci_bundle': '/path/to/bundle'}",
                )
            return str(bundle), (), (), None, None
        if not spec.image:
            raise JobValidationError("image", "container_runtime=pyxis needs an image", "Give the image")
        image = ss.pyxis_image(spec.image)
        if any(c in image for c in "\n'\"`$\\ ;"):
            raise JobValidationError("image", f"{spec.image!r} is not an image reference", "Fix the image")
        mounts = [m.strip() for m in str(self._detail(spec, "container_mounts", "/lustre")).split(",") if m.strip()]
        root = self.results_root
        if not any(root == m.split(":")[0] or root.startswith(m.split(":")[0].rstrip("/") + "/") for m in mounts):
            mounts.append(f"{root}:{root}")
        for mount in mounts:
            if not all(ss.SAFE_PATH.match(p) or p in ("ro", "rw") for p in mount.split(":")):
                raise JobValidationError("container_mounts", f"{mount!r} is not SRC[:DST[:ro]]", "Fix the mount")
        names = tuple(sorted(self._job_env_names(spec)))
        if image.startswith("/") or not truthy(self._detail(spec, "use_sqsh", True)):
            return image, tuple(mounts), names, None, None
        cache_dir = str(self.setting("sqsh_cache_dir") or f"{root}/.sqsh")
        return image, tuple(mounts), names, f"{cache_dir}/{ss.sqsh_cache_name(image)}", f"docker://{image}"

    def _job_env_names(self, spec: JobSpec) -> set[str]:
        names = {*spec.env, *spec.secret_env, "TAO_JOB_ID", "TAO_JOB_NAME", "TAO_JOB_FILES", "PYTHONUNBUFFERED"}
        names |= {"TAO_RESULTS_URI"} if spec.results_uri else set()
        names |= set() if (spec.results_uri or "").startswith("s3://") else {"TAO_RESULTS_ROOT"}
        if spec.num_nodes > 1:
            names |= set(MULTI_NODE_VARS)
        return names

    def default_results_root(self) -> str:
        """``<results_root>/results`` on the shared filesystem (``TAO_RESULTS_ROOT`` of every job)."""
        return f"{self.results_root}/results"

    def results_root_for(self, spec: JobSpec) -> str:
        """The results root of ``spec``: its ``results_uri`` (a cluster path or ``s3://``), else the default.
        Worker-local places (``file://``, relative paths) are rejected: the job cannot see them."""
        uri = spec.results_uri
        if not uri:
            return self.default_results_root()
        if uri.startswith("s3://"):
            return uri.rstrip("/")
        path = ss.cluster_path(uri)
        if path is None or not ss.SAFE_PATH.match(path):
            raise JobValidationError(
                "results_uri",
                f"{uri!r} is not a folder on the cluster",
                "SLURM jobs cannot write to the Airflow worker: use lustre:///abs/path, an absolute cluster path, "
                "or s3://bucket/prefix",
            )
        return path.rstrip("/")

    def results_dir_for(self, spec: JobSpec) -> str:
        return f"{self.results_root_for(spec)}/{spec.job_id}"

    def _inputs(self, spec: JobSpec) -> list[str]:
        """Cluster paths of the declared inputs (``backend_details['inputs']``); local paths are rejected."""
        inputs = spec.backend_details.get("inputs") or []
        if isinstance(inputs, str) or not isinstance(inputs, list | tuple):
            raise JobValidationError("backend_details['inputs']", f"{inputs!r} is not a list", "Pass a list of URIs")
        paths = []
        for uri in inputs:
            paths += [p for p in [self._cluster_input(str(uri))] if p]
        return paths

    def _cluster_input(self, uri: str) -> str | None:
        path = ss.cluster_path(uri)
        if path is not None:
            if not ss.SAFE_PATH.match(path):
                raise JobValidationError("inputs", f"{uri!r} has characters this platform does not stage", "Rename it")
            return path
        if uri.startswith(("s3://", "hf_model://", "hf_dataset://", "ngc://")):
            return None  # fetched by the in-job runner, not a cluster path
        raise JobValidationError(
            "inputs",
            f"{uri!r} is a path on the Airflow worker, which SLURM jobs cannot see"
            if uri.startswith("file://") or (not uri.startswith(("/",)) and "://" not in uri)
            else f"{uri!r} has an unsupported scheme",
            "Stage the data on the cluster's shared filesystem and use lustre:///abs/path or an absolute cluster path",
        )

    def validate_spec(self, spec: JobSpec) -> None:
        super().validate_spec(spec)
        plan = self.plan(spec)
        self.results_root_for(spec)
        inputs = self._inputs(spec)
        if spec.job_id in self._preflights:
            return
        uses_runner = "runner.json" in spec.files
        needs_s3 = b"s3://" in spec.files.get("runner.json", b"") or (spec.results_uri or "").startswith("s3://")
        checked = [*inputs, *([f"{plan.container}/config.json"] if plan.runtime == "oci" else [])]
        partitions = [p for p in (plan.partition or "").split(",") if p] or None
        command = scmd.preflight_command(partitions, checked, plan.runtime == "none" and uses_runner, needs_s3)
        result = scmd.parse_preflight(self.run(command, timeout=60).text)
        self._check_preflight(result, plan, checked, inputs, needs_s3)
        self._preflights[spec.job_id] = result

    def _check_preflight(
        self, result: dict[str, Any], plan: ss.SbatchPlan, checked: list[str], inputs: list[str], needs_s3: bool
    ) -> None:
        parts: dict[str, tuple[float | None, bool]] = result["partitions"]
        wanted = [p for p in (plan.partition or "").split(",") if p] or [n for n, (_, d) in parts.items() if d]
        missing = [p for p in wanted if p not in parts]
        if missing or not wanted:
            raise JobValidationError(
                "partition",
                f"partition(s) {missing or '(cluster default)'} not found on the cluster "
                f"(sinfo: {sorted(parts) or result['sinfo_errors']})",
                "Use an existing partition",
            )
        limits = [parts[p][0] for p in wanted]
        if all(limit is not None and plan.time_minutes > limit for limit in limits):
            shown = ", ".join(f"{p} {ss.format_slurm_time(parts[p][0] or 0)}" for p in wanted)
            raise JobValidationError(
                "time_hours",
                f"{plan.time_minutes / 60:g} h is above the partition maximum ({shown}); Slurm would keep the job "
                "PENDING (PartitionTimeLimit) forever",
                "Ask for less time or use a partition that allows it",
            )
        absent = [path for index, path in enumerate(checked) if not result["inputs"].get(index)]
        if absent:
            what = "input(s)" if set(absent) <= set(inputs) else "path(s)"
            raise JobValidationError(
                "inputs", f"{what} not found on the cluster: {absent}", "Stage them on the shared filesystem first"
            )
        python = result["python"]
        if python is not None:
            version = tuple(int(x) for x in python.split(".")[:2]) if python[:1].isdigit() else None
            if version is None or version < (3, 8):
                raise JobValidationError(
                    "container_runtime",
                    f"the nodes have no python3 >= 3.8 (login node: {python}); the TAO runner needs it on bare metal",
                    "Install python3 >= 3.8 on the cluster, or run in a container (pyxis / oci)",
                )
            if needs_s3 and result["boto3"] is False:
                raise JobValidationError(
                    "container_runtime",
                    "the nodes' python3 has no boto3, which S3 inputs/outputs need on bare metal",
                    "pip install --user boto3 on the cluster, or run in a container that has it",
                )
