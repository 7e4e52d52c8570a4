"""``TAOSubmitOperator``: submit a GPU training job to any TAO platform and wait for it, deferrably or not.

Lifecycle of one task instance (see docs/architecture.md and docs/reliability.md):

1. validate everything before any GPU is asked for (bad input fails the task without retries);
2. look for this task instance's job -- first in ``task_state_store`` (survives retries), then by its deterministic
   name on the platform (covers a worker killed between submission and the store write) -- and reattach to it if
   it is active, return its result if it completed, submit anew otherwise;
3. store the handle and push job id, results folder and console URL to XCom *before* waiting;
4. wait in the triggerer (``TAOJobTrigger``) or on the worker, with an absolute deadline from ``execution_timeout``;
5. on failure classify it and fail fast when a retry cannot help; when it found no capacity, move it to the next
   connection of the task's chain (``fallback_conn_ids``, see :mod:`~airflow_provider_tao.operators.failover`);
6. account for every attempt: GPUs x nodes x the run time the platform reports (``attempts``, ``gpu_hours``).

This module holds the operator, its parameters and the building blocks of a job (its hook, name and spec); the
steps 2-4 live in :mod:`~airflow_provider_tao.operators.lifecycle`, the record and the outcome of 3 and 5 in
:mod:`~airflow_provider_tao.operators.outcome`, failover in :mod:`~airflow_provider_tao.operators.failover` and S3
staging in :mod:`~airflow_provider_tao.operators.staging`.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, conf
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_provider_tao import settings
from airflow_provider_tao.budget import checked_max_gpu_hours
from airflow_provider_tao.connections import get_connection, similar_conn_ids
from airflow_provider_tao.hooks import PLATFORMS, get_platform_hook, platform_for_conn_type
from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.hooks.validation import check_image_given, env_value_fix
from airflow_provider_tao.jobs import JobHandle, JobSpec
from airflow_provider_tao.links import TAOJobLink, TAOResultsLink
from airflow_provider_tao.operators.failover import seconds_of
from airflow_provider_tao.operators.lifecycle import JobLifecycleMixin, Reattaching
from airflow_provider_tao.records import task_instance_digest
from airflow_provider_tao.secret_refs import parse_secret_env, references
from airflow_provider_tao.secret_refs import resolve as resolve_secret_refs
from airflow_provider_tao.waiting import WaitLog

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage
    from airflow.sdk import Context

    from airflow_provider_tao.hooks.base import TAOPlatformHook
    from airflow_provider_tao.records import JobRecord


def _readable(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


class TAOSubmitOperator(JobLifecycleMixin, BaseOperator):
    """Run a (TAO or any) GPU training job on a TAO platform and wait until it ends.

    With ``specs``, ``args``, ``inputs``, ``outputs`` or ``storage_conn_id`` the job runs through the in-job runner,
    which downloads the inputs, writes the spec, runs the command and commits the outputs with a manifest (modes as
    in the TAO SDK: ``specs`` -> config, ``args`` -> args, neither -> passthrough).

    :param command: what the job runs: a string (run by exactly one ``/bin/bash -c``) or an argv list. Only the
        placeholders ``{config_path}``, ``{results_dir}`` and ``{job_id}`` are replaced (runner jobs only).
    :param conn_id: a ``tao_*`` Airflow connection; its type decides the platform. Optional for ``local``.
    :param fallback_conn_ids: more ``tao_*`` connections, tried in order when the job finds no capacity on the one
        before (``ERR_CAPACITY``, or waiting for resources past ``capacity_timeout``): the job is canceled there and
        submitted on the next one, in the same try. Program errors and OOM never move. Every connection of the chain
        is validated before anything runs.
    :param capacity_timeout: seconds (or a ``timedelta``) the job may wait for resources on a connection that has a
        next one in the chain before it moves on; unset = only the platforms' own capacity bounds move it.
    :param max_gpu_hours: GPU-hours the job may use (``gpu_count x num_nodes`` x the hours it ran, from its
        platform's own times; queueing is free): a job that passes it is canceled and the task fails with
        ``ERR_BUDGET``, never retried. None = no budget; a positive number otherwise.
    :param platform: the platform name (``local``, ...); optional when ``conn_id`` is given, checked against it.
    :param image: container image: a ``versions.yaml`` key such as ``tao_toolkit.pyt`` or an image URI.
        Optional on ``local`` (the job runs on the worker host).
    :param gpu_count: GPUs per node: 0 = none, N = N GPUs, -1 = all visible GPUs.
    :param num_nodes: nodes for a multi-node job (platforms that support it).
    :param env: environment variables of the job (values must be strings). Plain: they show in the job's spec.
    :param secret_env: secret environment variables of the job, each a reference to a connection field:
        ``{"HF_TOKEN": "conn:my_hf.password"}`` (``password``, ``login``, ``host``, ``schema``, ``port`` or an extra's
        name). The value travels over the platform's secret channel only and is masked wherever the job's lines
        are shown; a reference that does not resolve fails the task before anything is submitted. Not templated:
        a rendered value could not be masked outside this task (see ``docs/security.md``).
    :param backend_details: platform-specific settings (partition, instance type, ``mem_limit``, ...); with
        ``fallback_conn_ids``, either the same settings for every connection or a mapping keyed by connection id.
    :param specs: config mode: the nested spec written at ``{config_path}`` (dicts, not flat dotted keys).
    :param args: args mode: ``{name: value}`` appended to the command as ``--name value``.
    :param inputs: config/args mode: dotted spec paths / arg names whose URIs are downloaded into the job;
        passthrough: ``{container_path: uri}``. Every input is checked to exist before submission.
    :param outputs: config/args mode: dotted spec paths / arg names to commit; passthrough: container paths.
    :param config_format: ``yaml``, ``toml`` or ``json``.
    :param upload_excludes: fnmatch patterns of output files not to upload.
    :param storage_conn_id: an ``aws`` connection for S3 inputs / outputs; its credentials reach the job as
        secret environment variables only. Default ``[tao] default_storage_conn_id`` for tasks that move data.
    :param results_uri: results root (absolute path or ``s3://``); the job's results land in
        ``<results_uri>/<job_id>``. Wins over the platform's default results location. Default
        ``[tao] default_results_uri``.
    :param job_name: a readable prefix of the job name; the platform name is ``<job_name>-<id>`` where ``<id>``
        is derived from dag, task, run and map index, so every try of one task instance finds the same job.
    :param deferrable: wait in the triggerer instead of on a worker (default ``[operators] default_deferrable``).
    :param poll_interval: seconds between status checks (default ``[tao] default_poll_interval``, 10).
    :param stream_logs: copy the job's log into the task log while waiting (default ``[tao] stream_logs``, on).
    :param cancel_on_kill: cancel the job when the task is killed, marked failed/success, cleared or times out.
    :param metrics_file: a file of the job's results folder (JSON) whose content goes into the task's XCom and
        into the events of its ``outlets`` Assets (default ``metrics.json``; missing is fine).

    Model Assets: every Asset in ``outlets`` gets, when the job completes, an event whose ``extra`` says which model
    it is: ``job_id``, ``platform``, ``results_dir``, ``outputs`` (name -> URI), ``metrics`` (when the metrics
    file exists), ``dag_id``/``run_id``/``task_id``. DAGs scheduled on the Asset read it from
    ``triggering_asset_events``.
    """

    template_fields: Sequence[str] = (
        "command",
        "image",
        "env",
        "job_name",
        "results_uri",
        "backend_details",
        "specs",
        "args",
        "inputs",
        "outputs",
    )
    template_fields_renderers = {
        "command": "bash",
        "env": "json",
        "backend_details": "json",
        "specs": "json",
        "args": "json",
    }
    operator_extra_links = (TAOJobLink(), TAOResultsLink())
    ui_color = "#76b900"

    def __init__(
        self,
        *,
        command: str | list[str],
        conn_id: str | None = None,
        platform: str | None = None,
        image: str | None = None,
        gpu_count: int = 1,
        num_nodes: int = 1,
        env: dict[str, str] | None = None,
        secret_env: dict[str, str] | None = None,
        backend_details: dict[str, Any] | None = None,
        specs: dict[str, Any] | None = None,
        args: dict[str, Any] | None = None,
        inputs: dict[str, Any] | list[str] | None = None,
        outputs: dict[str, Any] | list[str] | None = None,
        config_format: str = "yaml",
        upload_excludes: list[str] | None = None,
        storage_conn_id: str | None = None,
        results_uri: str | None = None,
        job_name: str | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float | None = None,
        stream_logs: bool | None = None,
        cancel_on_kill: bool = True,
        metrics_file: str | None = "metrics.json",
        fallback_conn_ids: Sequence[str] | None = None,
        capacity_timeout: float | timedelta | None = None,
        max_gpu_hours: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.command = command
        self.conn_id = conn_id
        self.platform = platform
        self.image = image
        self.gpu_count = gpu_count
        self.num_nodes = num_nodes
        self.env = env or {}
        self.secret_env = secret_env or {}
        self.backend_details = backend_details or {}
        self.specs = specs
        self.args = args
        self.inputs = inputs
        self.outputs = outputs
        self.config_format = config_format
        self.upload_excludes = upload_excludes
        self.storage_conn_id = storage_conn_id
        self.results_uri = results_uri
        self.job_name = job_name
        self.deferrable = deferrable
        # None = the [tao] setting when the task runs (not when the DAG is parsed)
        self.poll_interval = None if poll_interval is None else float(poll_interval)
        self.stream_logs = stream_logs
        self.cancel_on_kill = cancel_on_kill
        self.metrics_file = metrics_file
        if isinstance(fallback_conn_ids, str):
            raise JobValidationError(
                "fallback_conn_ids", f"{fallback_conn_ids!r} is a string", f"Pass a list: [{fallback_conn_ids!r}]"
            )
        self.fallback_conn_ids = list(fallback_conn_ids or [])
        self.capacity_timeout = seconds_of(capacity_timeout)
        self.max_gpu_hours = max_gpu_hours
        self._handle: JobHandle | None = None
        self._secrets_registered = False  # this process handed the job its secrets (and so masks them)
        self._waiting: WaitLog | None = None  # why the job waits, while the worker waits for it
        self._submitting: tuple[TAOPlatformHook, str, str] | None = None  # (hook, name, job_id) while submitting
        self._reattaching: Reattaching | None = None  # while this try looks for the task's earlier jobs
        self._check_static_arguments()

    def _check_static_arguments(self) -> None:
        """Checks that need no rendering or connection: they fail the DAG at parse time, long before a job."""
        if self.platform is not None and self.platform not in PLATFORMS:
            raise JobValidationError(
                "platform", f"unknown platform {self.platform!r}", f"Use one of: {', '.join(sorted(PLATFORMS))}"
            )
        for name in ("gpu_count", "num_nodes"):
            value = getattr(self, name)
            if isinstance(value, str) and "{{" in value:
                raise JobValidationError(
                    name,
                    f"{value!r} is a template, but {name} is not a templated field",
                    f"Pass a whole number; to vary it, map the task: .partial(...).expand({name}=...) takes XComs",
                )
            if not isinstance(value, int) or isinstance(value, bool):
                raise JobValidationError(name, f"{value!r} is not an integer", "Pass a whole number")
        if self.gpu_count < -1:
            raise JobValidationError(
                "gpu_count", f"{self.gpu_count} is not allowed", "Use 0 for none, N for N GPUs, or -1 for all visible"
            )
        if self.num_nodes < 1:
            raise JobValidationError("num_nodes", f"{self.num_nodes} is not allowed", "Use 1 or more")
        self.max_gpu_hours = checked_max_gpu_hours(self.max_gpu_hours, self.gpu_count)
        if self.poll_interval is not None and self.poll_interval <= 0:
            raise JobValidationError("poll_interval", f"{self.poll_interval} is not allowed", "Use seconds > 0")
        self._check_env_and_image()
        self._secret_refs = parse_secret_env(self.secret_env)
        if self.metrics_file is not None and (self.metrics_file.startswith("/") or ".." in self.metrics_file):
            raise JobValidationError(
                "metrics_file", f"{self.metrics_file!r} is not inside the results folder", "Give a relative path"
            )
        self._check_chain_arguments()

    def _check_env_and_image(self) -> None:
        """``env`` and ``image`` as far as they are known before rendering (a template or an XComArg is checked
        when the task runs): a number where a string belongs, a mistyped versions.yaml key."""
        if isinstance(self.env, dict):
            for key, value in self.env.items():
                if value is None or isinstance(value, (bool, int, float)):
                    raise JobValidationError(f"env[{key!r}]", f"{value!r} is not a string", env_value_fix(value))
        elif isinstance(self.env, (str, list, tuple, int, float)) and "{{" not in str(self.env):
            raise JobValidationError("env", f"{self.env!r} is not a mapping", "Pass a dict of strings")
        if isinstance(self.image, str) and "{{" not in self.image:
            self._resolved_image()
        check_image_given(self.platform, self.image)  # as the platform name: no daemon asked

    def _resolved_image(self) -> str | None:
        """``image`` as an image reference (a versions.yaml key resolved); a key that does not exist is bad input."""
        from airflow_provider_tao.images import resolve_container_image

        try:
            return resolve_container_image(self.image) if self.image else None
        except (KeyError, ValueError) as exc:
            raise JobValidationError("image", str(exc), "") from exc

    @property
    def interval(self) -> float:
        """Seconds between polls: ``poll_interval``, else ``[tao] default_poll_interval``."""
        return self.poll_interval if self.poll_interval is not None else settings.default_poll_interval()

    @property
    def streaming(self) -> bool:
        """Whether job logs go into the task log: ``stream_logs``, else ``[tao] stream_logs``."""
        return self.stream_logs if self.stream_logs is not None else settings.stream_logs()

    def _apply_config_defaults(self) -> None:
        """``[tao] default_results_uri`` and ``default_storage_conn_id`` for tasks that set neither: the storage
        connection only for tasks that move data (a data contract or an s3:// results root), so a plain job is
        never wrapped in the runner because a deployment has a default bucket."""
        if self.results_uri is None:
            self.results_uri = settings.default_results_uri()
        moves_data = self.uses_runner or bool(self.results_uri and self.results_uri.startswith("s3://"))
        if self.storage_conn_id is None and moves_data:
            self.storage_conn_id = settings.default_storage_conn_id()

    # ----------------------------------------------------------------- building blocks

    def _hook(self, position: int = 0) -> TAOPlatformHook:
        """The platform hook of the chain's ``position`` (0 = ``conn_id``), from the connection's type (a missing or
        foreign connection is bad input)."""
        conn_id = self.chain[position]
        parameter = "conn_id" if position == 0 else f"fallback_conn_ids[{position - 1}]"
        platform = self.platform if position == 0 else None
        if conn_id:
            try:
                conn = get_connection(conn_id)
            except AirflowNotFoundException as exc:
                raise JobValidationError(
                    parameter,
                    f"there is no Airflow connection {conn_id!r}"
                    + "".join(f" (did you mean {near!r}?)" for near in similar_conn_ids(conn_id)),
                    "Create it (Admin > Connections, `airflow connections add`, or an AIRFLOW_CONN_* variable) "
                    "or fix the id"
                    + ("; the local platform also runs with conn_id=None" if platform == "local" else ""),
                ) from exc
            conn_platform = platform_for_conn_type(conn.conn_type or "")
            if conn_platform is None:
                types = ", ".join(ctype for ctype, _ in PLATFORMS.values())
                raise JobValidationError(
                    parameter,
                    f"connection {conn_id!r} has type {conn.conn_type!r}, which is not a TAO platform",
                    f"Use a connection of type {types}",
                )
            if platform and platform != conn_platform:
                raise JobValidationError(
                    "platform",
                    f"{platform!r} does not match connection {conn_id!r} of type {conn.conn_type!r}",
                    f"Use platform={conn_platform!r} or leave platform unset",
                )
            platform = conn_platform
        elif not platform:
            raise JobValidationError(
                "platform",
                "neither conn_id nor platform is given",
                "Pass conn_id=<a tao_* connection> or platform='local'",
            )
        check_image_given(platform, self.image)  # before the connection is read: a daemon may not answer
        hook = get_platform_hook(platform, conn_id)
        hook.load_connection()
        return hook

    def _job_name(self, context: Context, hook: TAOPlatformHook) -> str:
        """Deterministic: the same for every try of a task instance, different for every run and map index; the
        platform fits it to its own rule (shortening the prefix, never the digest)."""
        ti = context["ti"]
        digest = task_instance_digest(ti.dag_id, ti.task_id, ti.run_id, ti.map_index)
        prefix = self.job_name if self.job_name is not None else _readable(f"{ti.dag_id}-{ti.task_id}")
        name = hook.job_name_for(prefix, digest)
        hook.validate_name(name)
        return name

    def _job_spec(self, context: Context, hook: TAOPlatformHook, name: str) -> JobSpec:
        if not isinstance(self.env, dict):
            raise JobValidationError("env", f"{self.env!r} is not a mapping", "Pass a dict of strings")
        image = self._resolved_image()
        if clash := sorted(set(self.env) & set(self._secret_refs)):
            raise JobValidationError("secret_env", f"{clash} are in env too", "Name each variable in one of them")
        spec = JobSpec(
            name=name,
            job_id=secrets.token_hex(6),
            command=self.command,
            image=image,
            gpu_count=self.gpu_count,
            num_nodes=self.num_nodes,
            env=dict(self.env),
            secret_env=resolve_secret_refs(self._secret_refs),
            backend_details=self._details_for(hook.conn_id),
            results_uri=self.results_uri,
            deadline=self._deadline(context),
            origin=_origin(context),
        )
        if image is None and (reason := hook.image_required(spec)):
            raise JobValidationError(
                "image", reason, "Give a versions.yaml key such as tao_toolkit.pyt or an image URI"
            )
        return spec

    def _deadline(self, context: Context) -> float | None:
        """Absolute end of the task, anchored on its start so re-deferrals keep it: ``execution_timeout``, else
        ``[tao] lease_hours`` (a job's lease), else none."""
        if self.execution_timeout is not None:
            seconds = self.execution_timeout.total_seconds()
        elif lease := settings.lease_hours():
            seconds = lease * 3600
        else:
            return None
        start = context["ti"].start_date
        base = start.timestamp() if start is not None else time.time()
        return base + seconds

    # ----------------------------------------------------------------- lifecycle

    def execute(self, context: Context) -> dict[str, Any]:
        return self._run(context, reattach=True)

    def _secret_conn_ids(self, handle: JobHandle) -> list[str]:
        """The lifecycle's, and the ``conn:<id>.<field>`` references of ``secret_env``: the triggerer and a
        resumed worker read those values again to mask them (the values never travel)."""
        return [*super()._secret_conn_ids(handle), *references(self._secret_refs)]

    def _keep(self, context: Context, record: JobRecord) -> None:
        self._lineage_record = record  # the job's latest record, for OpenLineage at the end of this process
        super()._keep(context, record)

    # ----------------------------------------------------------------- OpenLineage (called by its provider only)

    def get_openlineage_facets_on_start(self) -> OperatorLineage:
        """Inputs from the data contract, and the run facet as far as it is known before a job exists."""
        from airflow_provider_tao.lineage import operator_lineage

        return operator_lineage(self, None)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage:
        """Inputs, outputs (the results folder and declared outputs of the job that ran) and the run facet."""
        from airflow_provider_tao.lineage import operator_lineage

        return operator_lineage(self, getattr(self, "_lineage_record", None))

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> OperatorLineage:
        """As on completion, with the job's failure class in the run facet."""
        return self.get_openlineage_facets_on_complete(task_instance)


def _origin(context: Context) -> dict[str, str]:
    ti = context["ti"]
    return {"dag_id": ti.dag_id, "task_id": ti.task_id, "run_id": ti.run_id, "map_index": str(ti.map_index)}
