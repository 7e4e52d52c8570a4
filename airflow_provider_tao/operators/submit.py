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
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, conf
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowNotFoundException,
    AirflowTaskTimeout,
)

from airflow_provider_tao import settings
from airflow_provider_tao.connections import get_connection
from airflow_provider_tao.failures import FailureFacts, classify
from airflow_provider_tao.hooks import PLATFORMS, get_platform_hook, platform_for_conn_type
from airflow_provider_tao.hooks.base import JobSubmitError, JobValidationError, register_secrets
from airflow_provider_tao.joblog import JobLogWriter
from airflow_provider_tao.jobs import (
    NOT_FOUND_POLLS,
    ErrClass,
    FailureAnalysis,
    JobHandle,
    JobSpec,
    JobState,
    JobStatus,
)
from airflow_provider_tao.links import XCOM_CONSOLE_URL, XCOM_JOB_ID, XCOM_RESULTS_DIR, TAOJobLink, TAOResultsLink
from airflow_provider_tao.operators.failover import CapacityFailoverMixin, seconds_of
from airflow_provider_tao.operators.staging import S3StagingMixin
from airflow_provider_tao.outage import OutageLog
from airflow_provider_tao.person_cancel import cancel_request, stop_canceled_job
from airflow_provider_tao.records import STATE_KEY, XCOM_RECORD, JobRecord
from airflow_provider_tao.triggers.log_budget import FINAL_LOG_READS
from airflow_provider_tao.waiting import WaitLog

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_tao.hooks.base import TAOPlatformHook


def _readable(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


class TAOSubmitOperator(CapacityFailoverMixin, S3StagingMixin, BaseOperator):
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
    :param platform: the platform name (``local``, ...); optional when ``conn_id`` is given, checked against it.
    :param image: container image: a ``versions.yaml`` key such as ``tao_toolkit.pyt`` or an image URI.
        Optional on ``local`` (the job runs on the worker host).
    :param gpu_count: GPUs per node: 0 = none, N = N GPUs, -1 = all visible GPUs.
    :param num_nodes: nodes for a multi-node job (platforms that support it).
    :param env: environment variables of the job (values must be strings).
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
        self._handle: JobHandle | None = None
        self._secrets_registered = False  # this process handed the job its secrets (and so masks them)
        self._waiting: WaitLog | None = None  # why the job waits, while the worker waits for it
        self._submitting: tuple[TAOPlatformHook, str, str] | None = None  # (hook, name, job_id) while submitting
        self._check_static_arguments()

    def _check_static_arguments(self) -> None:
        """Checks that need no rendering or connection: they fail the DAG at parse time, long before a job."""
        if self.platform is not None and self.platform not in PLATFORMS:
            raise JobValidationError(
                "platform", f"unknown platform {self.platform!r}", f"Use one of: {', '.join(sorted(PLATFORMS))}"
            )
        for name in ("gpu_count", "num_nodes"):
            if not isinstance(getattr(self, name), int) or isinstance(getattr(self, name), bool):
                raise JobValidationError(name, f"{getattr(self, name)!r} is not an integer", "Pass a whole number")
        if self.gpu_count < -1:
            raise JobValidationError(
                "gpu_count", f"{self.gpu_count} is not allowed", "Use 0 for none, N for N GPUs, or -1 for all visible"
            )
        if self.num_nodes < 1:
            raise JobValidationError("num_nodes", f"{self.num_nodes} is not allowed", "Use 1 or more")
        if self.poll_interval is not None and self.poll_interval <= 0:
            raise JobValidationError("poll_interval", f"{self.poll_interval} is not allowed", "Use seconds > 0")
        self._check_env_and_image()
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
                    raise JobValidationError(f"env[{key!r}]", f"{value!r} is not a string", f"Quote it: {str(value)!r}")
        elif isinstance(self.env, (str, list, tuple, int, float)) and "{{" not in str(self.env):
            raise JobValidationError("env", f"{self.env!r} is not a mapping", "Pass a dict of strings")
        if isinstance(self.image, str) and "{{" not in self.image:
            self._resolved_image()

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
                    f"there is no Airflow connection {conn_id!r}",
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
        hook = get_platform_hook(platform, conn_id)
        hook.load_connection()
        return hook

    def _job_name(self, context: Context, hook: TAOPlatformHook) -> str:
        """Deterministic: the same for every try of a task instance, different for every run and map index; the
        platform fits it to its own rule (shortening the prefix, never the digest)."""
        ti = context["ti"]
        identity = f"{ti.dag_id}\n{ti.task_id}\n{ti.run_id}\n{ti.map_index}"
        digest = hashlib.sha256(identity.encode()).hexdigest()[:10]
        prefix = self.job_name if self.job_name is not None else _readable(f"{ti.dag_id}-{ti.task_id}")
        name = hook.job_name_for(prefix, digest)
        hook.validate_name(name)
        return name

    def _job_spec(self, context: Context, hook: TAOPlatformHook, name: str) -> JobSpec:
        if not isinstance(self.env, dict):
            raise JobValidationError("env", f"{self.env!r} is not a mapping", "Pass a dict of strings")
        image = self._resolved_image()
        spec = JobSpec(
            name=name,
            job_id=secrets.token_hex(6),
            command=self.command,
            image=image,
            gpu_count=self.gpu_count,
            num_nodes=self.num_nodes,
            env=dict(self.env),
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

    def _run(self, context: Context, *, reattach: bool) -> dict[str, Any]:
        self._apply_config_defaults()
        try:
            hook = self._hook()
            name = self._job_name(context, hook)
        except JobValidationError as exc:
            raise AirflowFailException(f"Bad input, nothing was submitted: {exc}") from exc
        try_number = context["ti"].try_number
        stored: Any = context["task_state_store"].get(STATE_KEY)
        if reattach:
            self._close_left_behind(context, stored)  # a job that ended unwatched still counts in GPU-hours
        self._honour_person_cancel(context, None)  # `airflow tao cancel` while no try waited: nothing is submitted
        # Reattach first: an earlier try's job that still runs is this task's job, whatever a new validation of
        # today's inputs would say (the job itself may have moved them), and its outputs are the ones that count.
        # With a chain of connections it may be on any of them (see operators/failover.py).
        try:
            found = self._find_in_chain(context, hook, name) if reattach else None
        except JobValidationError as exc:  # e.g. the platform refused the connection's credentials
            raise AirflowFailException(f"Bad input, nothing was submitted: {exc}") from exc
        except Exception as exc:
            # A platform error that a retry cannot mend (refused credentials, a configuration error) fails the task
            # now; anything else -- an outage above all -- is retried, never taken as "no earlier job".
            err_class = getattr(exc, "err_class", None)
            if isinstance(err_class, ErrClass) and not err_class.retriable:
                raise AirflowFailException(
                    f"Nothing was submitted: looking for this task's earlier job on {hook.platform} failed with "
                    f"{err_class.value}: {exc}"
                ) from exc
            raise
        if found is not None and found[2].state is JobState.COMPLETE:
            hook, handle, status = found
            self._handle = handle
            self._keep(context, self._record_for(context, handle, self._outputs_of(context, handle)))
            self._publish(context, hook, handle)
            self._close_attempt(context, hook, handle, outcome="complete", reason=status.message)
            try:
                return self._succeed(context, handle, status, self._outputs_of(context, handle))
            finally:
                hook.cleanup_job(handle)  # as a resumed try does once it has read the result (SLURM: the env file)
        if found is not None:
            hook, previous, _ = found
            handle = previous.owned_by(try_number)
            hook.claim_job(handle)
            outputs = self._outputs_of(context, previous)
            self.log.info(
                "Reattached to job %s (%s), submitted by try %s", handle.job_id, handle.name, previous.try_number
            )
        else:
            self._start_attempts(context, previous_run_used=isinstance(stored, dict) and bool(stored.get("consumed")))
            try:
                prepared = self._validated_chain(context, hook, name)  # every connection of the chain, up front
            except JobValidationError as exc:
                raise AirflowFailException(f"Bad input, nothing was submitted: {exc}") from exc
            hook, handle, outputs = self._submit(context, hook, name, prepared)
        return self._watch(context, hook, handle, outputs)

    def _prepared_spec(self, context: Context, hook: TAOPlatformHook, name: str) -> tuple[JobSpec, dict[str, str]]:
        """The job this task submits on ``hook``'s connection, staged and validated; and its output URIs."""
        spec, outputs = self.stage(self._job_spec(context, hook, name), hook)
        hook.validate_spec(spec)
        return spec, outputs

    def _submit(
        self,
        context: Context,
        hook: TAOPlatformHook,
        name: str,
        prepared: tuple[JobSpec, dict[str, str]] | None = None,
    ) -> tuple[TAOPlatformHook, JobHandle, dict[str, str]]:
        """Submit the job on ``hook``'s connection -- or, refused there for capacity, on the next one of the chain.
        Its connection is recorded before the submission (the write-ahead of operators/failover.py)."""
        try:
            spec, outputs = prepared or self._prepared_spec(context, hook, name)
        except JobValidationError as exc:
            raise AirflowFailException(f"Bad input, nothing was submitted: {exc}") from exc
        register_secrets(list(spec.secret_env.values()))
        self._secrets_registered = True
        self._warn_expiring_credentials(spec)
        self._write_ahead(context, hook, spec.name, spec.job_id)
        # on_kill landing while create_job runs (or as it returns) has no handle yet: it looks the job up by this
        self._submitting = (hook, spec.name, spec.job_id)
        try:
            handle = hook.create_job(spec, try_number=context["ti"].try_number)
        except JobSubmitError as exc:
            self._submitting = None
            message = f"The {hook.platform} platform refused job {spec.job_id}: {exc.err_class.value}: {exc}"
            target = (
                self._refused_for_capacity(context, hook, spec, message)
                if exc.err_class is ErrClass.ERR_CAPACITY
                else None
            )
            if target is None:
                if exc.err_class.retriable:
                    raise AirflowException(message) from exc
                raise AirflowFailException(message) from exc
        else:
            self._handle, self._submitting = handle, None
            self.log.info("Submitted %s job %s (%s)", hook.platform, handle.job_id, handle.name)
            return hook, handle, outputs
        try:  # refused there for capacity: the next connection of the chain
            name = self._job_name(context, target)
        except JobValidationError as bad:
            raise AirflowFailException(f"Bad input, nothing more was submitted: {bad}") from bad
        return self._submit(context, target, name)

    def _watch(
        self, context: Context, hook: TAOPlatformHook, handle: JobHandle, outputs: dict[str, str]
    ) -> dict[str, Any]:
        """Keep the job's handle where every try finds it, publish its links, then wait for it: deferred in the
        triggerer, or on the worker."""
        self._handle = handle
        self._keep(context, self._record_for(context, handle, outputs))
        self._publish(context, hook, handle)
        self._honour_person_cancel(context, handle)  # a cancel that came while this try submitted
        deadline = self._deadline(context)
        if self.deferrable:
            from airflow_provider_tao.triggers.job import TAOJobTrigger

            self.defer(
                trigger=TAOJobTrigger(
                    handle=handle.to_json(),
                    poll_interval=self.interval,
                    deadline=deadline,
                    stream_logs=self.streaming,
                    cancel_on_kill=self.cancel_on_kill,
                    secret_conn_ids=self._secret_conn_ids(handle),
                    capacity_timeout=self._capacity_timeout_for(handle),
                ),
                method_name="execute_complete",
                # The trigger enforces the deadline itself and the operator cancels the job; a framework timeout
                # would fail the task without either (and orphan the job).
                timeout=None,
            )
        return self.execute_complete(context, self._wait_on_worker(hook, handle))

    def _secret_conn_ids(self, handle: JobHandle) -> list[str]:
        """The connections whose secrets the job receives: the storage connection's keys, and the platform
        connection's (its extras or environment fallbacks may hold keys the job gets: NGC, HF tokens)."""
        return [c for c in dict.fromkeys((self.storage_conn_id, handle.conn_id)) if c]

    def _mask_received_secrets(self, handle: JobHandle) -> None:
        """Register the job's secrets with this worker's masker when this process did not submit the job (a resumed
        or reattached try): the job's log lines and failure evidence it writes must not show them."""
        if not self._secrets_registered:
            from airflow_provider_tao.received_secrets import secrets_received

            register_secrets(secrets_received(self._secret_conn_ids(handle)))
            self._secrets_registered = True

    def _stored(self, context: Context) -> JobRecord | None:
        return JobRecord.from_json(context["task_state_store"].get(STATE_KEY))

    def _record_for(self, context: Context, handle: JobHandle, outputs: dict[str, str]) -> JobRecord:
        """The record of ``handle`` as this task's job; an earlier job of the task instance goes into its history."""
        fields: dict[str, Any] = {
            "outputs": outputs,
            "gpu_count": self.gpu_count,
            "num_nodes": self.num_nodes,
            "cancel_on_kill": self.cancel_on_kill,
            "deadline": self._deadline(context),
            "secret_conn_ids": [self.storage_conn_id] if self.storage_conn_id else [],
        }
        previous = self._stored(context)
        return previous.successor(handle, **fields) if previous else JobRecord(handle=handle.to_json(), **fields)

    def _keep(self, context: Context, record: JobRecord) -> None:
        """Store the record where it survives retries, and in the try's XCom (the TAO jobs view reads both)."""
        context["task_state_store"].set(STATE_KEY, record.to_json())
        context["ti"].xcom_push(key=XCOM_RECORD, value=record.to_json())

    def _keep_end(self, context: Context, handle: JobHandle, state: str, err_class: str = "") -> None:
        """Record how the job ended (best effort: the task's own outcome never depends on it)."""
        record = self._stored(context)
        if record is None or record.job_id != handle.job_id:
            record = self._record_for(context, handle, {})
        try:
            self._keep(
                context, record.ended(state, err_class=err_class, run_seconds=self._run_seconds(context, handle))
            )
        except Exception as exc:
            self.log.warning("Could not record the end of job %s: %s", handle.job_id, exc)

    def _outputs_of(self, context: Context, handle: JobHandle) -> dict[str, str]:
        """The output URIs of the job that ran: stored with its handle, else derived from its results folder."""
        record = self._stored(context)
        if record is not None and record.job_id == handle.job_id:
            return dict(record.outputs)
        if not self.uses_runner:
            return {}
        try:
            return self.build_job_entrypoint().output_uris(handle.results_dir)
        except JobValidationError as exc:
            self.log.warning("Cannot derive the outputs of job %s: %s", handle.job_id, exc)
            return {}

    def _warn_expiring_credentials(self, spec: JobSpec) -> None:
        """Temporary storage credentials that expire before the task's deadline break the job's late uploads."""
        if "AWS_SESSION_TOKEN" not in spec.secret_env:
            return
        expiry = self.storage_credentials_expiry()
        if expiry is None:
            self.log.warning(
                "storage_conn_id %r gives temporary AWS credentials (a session token) of unknown lifetime: uploads "
                "fail once they expire. Use long-lived keys or a role the connection can refresh",
                self.storage_conn_id,
            )
        elif spec.deadline is None or expiry < spec.deadline:
            self.log.warning(
                "The temporary AWS credentials of storage_conn_id %r expire at %s, %s: the job's uploads after "
                "that fail. Use long-lived keys or a role the connection can refresh, or shorten execution_timeout",
                self.storage_conn_id,
                time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(expiry)),
                "before the task's execution_timeout" if spec.deadline else "and the task has no execution_timeout",
            )

    def _find_previous(self, context: Context, hook: TAOPlatformHook, name: str) -> tuple[JobHandle, JobStatus] | None:
        """This task instance's earlier job if it can be reused (active or completed and not yet used), else None.

        The stored job first; when it cannot be reused (it ended, its result was used, it is on another connection
        of the chain, nothing is stored), the newest job of the deterministic name: a worker may have died between
        a submission and its record (the write-ahead then names a newer job than the record), and that job runs.
        Whether a job's result was used is kept with the job on the platform (``consumed_by``), so a clear after
        success reruns the job even when ``task_state_store`` was emptied (``clear_on_success``, retention)."""
        record = self._stored(context)
        stored = record.job if record is not None and not record.consumed else None
        if stored is not None and (stored.platform, stored.conn_id) != (hook.platform, hook.conn_id):
            stored = None  # the stored job is on another connection of the chain: look on this one by name
        if stored is not None and (found := self._reusable(hook, stored)) is not None:
            return found
        named = hook.find_job(name)
        if named is None or (stored is not None and named.job_id == stored.job_id):
            return None
        if stored is not None:
            self.log.warning(
                "Job %s (%s) is newer than the stored job %s: an earlier try died before recording it",
                named.job_id, name, stored.job_id,
            )  # fmt: skip
        return self._reusable(hook, named)

    def _reusable(self, hook: TAOPlatformHook, candidate: JobHandle) -> tuple[JobHandle, JobStatus] | None:
        """``candidate`` and its status when it is live, or complete and unused; None when it ended otherwise."""
        status = hook.get_job_status(candidate)
        if status.state is JobState.UNKNOWN and not status.not_found:
            raise AirflowException(
                f"Cannot tell whether job {candidate.job_id} of an earlier try still runs ({status.message}); "
                "not submitting another one, to avoid a duplicate. The next try asks again."
            )
        if status.state not in (JobState.PENDING, JobState.RUNNING, JobState.PAUSED, JobState.COMPLETE):
            self.log.info("Earlier job %s ended %s (%s)", candidate.job_id, status.state, status.message)
            return None
        if (used_by := hook.consumed_by(candidate)) is not None:
            self.log.info(
                "Job %s's result was already used by try %s (the task was cleared)", candidate.job_id, used_by
            )
            return None
        return candidate, status

    def _publish(self, context: Context, hook: TAOPlatformHook, handle: JobHandle) -> None:
        """What the task's links need, before it waits (so they work while it is deferred)."""
        ti = context["ti"]
        ti.xcom_push(key=XCOM_JOB_ID, value=handle.job_id)
        ti.xcom_push(key=XCOM_RESULTS_DIR, value=handle.results_dir)
        try:
            url = hook.job_url(handle)
        except Exception as exc:  # a link is never worth failing the task
            self.log.warning("No platform link for job %s: %s", handle.job_id, exc)
            url = ""
        ti.xcom_push(key=XCOM_CONSOLE_URL, value=url)

    def _wait_on_worker(self, hook: TAOPlatformHook, handle: JobHandle) -> dict[str, Any]:
        """The synchronous twin of the trigger; returns the same event payload. A failed status call (one SSH blip,
        an API outage) is Unknown, never a failure: the wait goes on until the job ends or Airflow's own
        ``execution_timeout`` stops it (and calls ``on_kill``, which cancels the job)."""
        if problem := hook.watch_problem(handle):
            return self._payload("misplaced", handle, JobStatus.unknown(problem), "")
        self._mask_received_secrets(handle)
        cursor = ""
        outage = OutageLog(self.log, hook.platform, settings.outage_report_seconds())
        waiting = self._waiting = WaitLog(self.log, handle.job_id, settings.outage_report_seconds())
        writer = JobLogWriter()  # the worker's masker already knows the job's secrets
        not_found = 0
        capacity_timeout = self._capacity_timeout_for(handle)
        while True:
            try:
                status = hook.get_job_status(handle)
            except Exception as exc:  # the platform could not be asked: an outage, not a verdict on the job
                status = JobStatus.unknown(f"status call failed: {exc}")
            outage.update(status)
            waiting.update(status)
            not_found = not_found + 1 if status.not_found else 0
            if not_found >= NOT_FOUND_POLLS:
                message = f"job {handle.job_id} no longer exists on the {hook.platform} platform ({status.message})"
                return self._payload("error", handle, status, cursor) | {"message": message}
            if reason := status.capacity_wait_over(capacity_timeout, time.time()):
                return self._payload("capacity", handle, status, cursor) | {"message": reason}
            if status.state is not JobState.UNKNOWN and self.streaming:
                cursor = self._copy_logs(hook, handle, cursor, writer)
            if status.state.is_terminal:
                if self.streaming:  # one bounded read per poll: the rest of an ended job's log, to its end
                    cursor = self._copy_rest_of_log(hook, handle, cursor, writer)
                outcome = {JobState.COMPLETE: "complete", JobState.ERROR: "error", JobState.CANCELED: "canceled"}
                return self._payload(outcome[status.state], handle, status, cursor)
            time.sleep(self.interval)

    def _copy_logs(self, hook: TAOPlatformHook, handle: JobHandle, cursor: str, writer: JobLogWriter) -> str:
        try:
            text, cursor = hook.get_job_logs(handle, cursor)
        except Exception as exc:  # logs are best effort
            self.log.debug("Reading the job log failed: %s", exc)
            return cursor
        for line in writer.feed(text):
            self.log.info("[job] %s", line)
        return cursor

    def _copy_rest_of_log(
        self, hook: TAOPlatformHook, handle: JobHandle, cursor: str, writer: JobLogWriter | None = None
    ) -> str:
        """An ended job's log from ``cursor`` to its end (bounded reads until one brings nothing new), its last
        unfinished line included; returns the cursor at its end."""
        writer = writer or JobLogWriter()  # the worker's masker knows the job's secrets (_mask_received_secrets)
        for _ in range(FINAL_LOG_READS):
            cursor, before = self._copy_logs(hook, handle, cursor, writer), cursor
            if cursor == before:
                break
        for line in writer.feed("", final=True):
            self.log.info("[job] %s", line)
        return cursor

    @staticmethod
    def _payload(outcome: str, handle: JobHandle, status: JobStatus, cursor: str) -> dict[str, Any]:
        return {
            "status": outcome,
            "handle": handle.to_json(),
            "job_status": status.to_json(),
            "log_cursor": cursor,
            "message": status.message,
        }

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resume after the trigger (or the worker wait): succeed, fail fast, fail for a retry, or resubmit."""
        outcome = event["status"]
        handle = JobHandle.from_json(event["handle"])
        status = JobStatus.from_json(event["job_status"])
        self._handle = handle
        hook = get_platform_hook(handle.platform, handle.conn_id)
        hook.load_connection()
        if not event.get("log_complete", True):  # the trigger's log reads ran out at the job's end
            self._mask_received_secrets(handle)  # before the job's lines reach this worker's log
            self._copy_rest_of_log(hook, handle, str(event.get("log_cursor") or ""))
        if outcome == "misplaced":
            raise AirflowFailException(event.get("message") or status.message)
        message = event.get("message") or status.message
        analysis = hook.get_failure_analysis(handle) if outcome == "error" else None
        if self._fails_over(handle, outcome, analysis):  # no capacity here: the next connection of the chain
            return self._fail_over(context, hook, handle, analysis.summary() if analysis else message)
        self._close_attempt(context, hook, handle, outcome=outcome, reason=analysis.summary() if analysis else message)
        self._mask_received_secrets(handle)  # before the job's own words (failure evidence) reach the log
        if outcome == "timeout":
            if self.cancel_on_kill:
                hook.cancel_job(handle)
            hook.cleanup_job(handle)
            self._keep_end(context, handle, JobState.CANCELED.value, ErrClass.ERR_TIMEOUT.value)
            fate = "it was canceled" if self.cancel_on_kill else "it runs on (cancel_on_kill=False)"
            waited = f"; {event['waiting']}" if event.get("waiting") else ""
            raise AirflowTaskTimeout(
                f"Job {handle.job_id} passed the task's execution_timeout (or [tao] lease_hours): "
                f"{ErrClass.ERR_TIMEOUT.value}, {fate}{waited}"
            )
        if outcome == "canceled":
            if who := hook.canceled_by(handle):
                # A person (`airflow tao cancel`) or the reaper stopped it on purpose: never run it again.
                hook.cleanup_job(handle)
                self._fail_canceled(context, handle, f"canceled by {who}")
            requested_by = hook.cancel_requested_by(handle)
            if requested_by is not None:
                # A cancel through this provider, yet this try is resuming: the kill was not the user's (a user's
                # mark-failed or clear never resumes the try that was killed). Either an older try's cleanup after
                # this try took the job over (clear while deferred), or a spurious trigger on_kill (a trigger moved
                # between triggerers): run the job again rather than fail the task.
                self.log.warning(
                    "Job %s was canceled by try %s's cleanup while try %s still wants it; submitting a new one",
                    handle.job_id, requested_by, context["ti"].try_number,
                )  # fmt: skip
                hook.cleanup_job(handle)
                return self._run(context, reattach=False)
            hook.cleanup_job(handle)
            self._fail_canceled(context, handle, "canceled outside Airflow")
        # Cleanup (removing an ended container, say) comes after the verdict and the failure analysis are read.
        try:
            if outcome == "complete":
                return self._succeed(context, handle, status, self._outputs_of(context, handle))
            return self._fail(context, handle, status, analysis, message)
        finally:
            hook.cleanup_job(handle)

    def _honour_person_cancel(self, context: Context, handle: JobHandle | None) -> None:
        """A person canceled this task instance (``airflow tao cancel``; :mod:`~airflow_provider_tao.person_cancel`):
        the try fails with ERR_CANCELED, and ``handle`` (else the canceled job) is stopped if it still runs."""
        if (request := cancel_request(context)) is None:
            return
        by = str(request.get("by") or "a person")
        handle = handle or JobHandle.from_json(request["job"])
        stop_canceled_job(handle, by, self.log)
        self._fail_canceled(context, handle, f"canceled by {by}")

    def _fail_canceled(self, context: Context, handle: JobHandle, why: str) -> None:
        """A job canceled from outside its task: the task fails without retries (a retry would undo the cancel)."""
        analysis = classify(FailureFacts(canceled=True, message=f"job {handle.job_id} was {why}"))
        self._keep_end(context, handle, JobState.CANCELED.value, analysis.err_class.value)
        raise AirflowFailException(f"Job {handle.job_id} failed with {analysis.summary()} It was {why}.")

    def _succeed(
        self, context: Context, handle: JobHandle, status: JobStatus, outputs: dict[str, str]
    ) -> dict[str, Any]:
        # Mark the job's result as used, with the job and in the store, so clearing a successful task runs the job
        # again instead of reusing it -- even once the store is emptied.
        hook = get_platform_hook(handle.platform, handle.conn_id)
        hook.load_connection()
        owned = handle.owned_by(context["ti"].try_number)
        outage = OutageLog(self.log, hook.platform, settings.outage_report_seconds())
        outage.through(lambda: hook.mark_consumed(owned), "marking the job's result used", self.interval)
        record = self._stored(context)
        if record is None or record.job_id != handle.job_id:
            record = self._record_for(context, handle, outputs)
        record = replace(record, outputs=outputs).ended(
            JobState.COMPLETE.value, consumed=True, run_seconds=self._run_seconds(context, handle)
        )
        self._keep(context, record)
        self.log.info("Job %s completed; results in %s", handle.job_id, handle.results_dir)
        result = {
            "job_id": handle.job_id,
            "platform": handle.platform,
            "backend_job_id": handle.backend_job_id,
            "name": handle.name,
            "state": status.state.value,
            "exit_code": status.exit_code,
            "results_dir": handle.results_dir,
            "outputs": outputs,
            "console_url": hook.job_url(handle),
            "gpu_count": self.gpu_count,
            "num_nodes": self.num_nodes,
            "submitted_at": handle.submitted_at,
            "ended_at": record.ended_at,
            "gpu_hours": record.gpu_hours(),
            "metrics": self._read_metrics(hook, handle),
            # attempts and GPU-hours from the times the platforms report (wins over the record's Airflow times)
            **self._attempts_report(context),
        }
        self._publish_assets(context, result)
        return result

    def _read_metrics(self, hook: TAOPlatformHook, handle: JobHandle) -> Any:
        """The job's metrics file (JSON), or None when it has none (or it cannot be read: never a failure)."""
        if not self.metrics_file or not handle.results_dir:
            return None
        import json

        try:
            if handle.results_dir.startswith("s3://") and self.storage_conn_id:
                bucket, _, key = handle.results_dir.removeprefix("s3://").partition("/")
                data = self._s3_hook().read_key(f"{key.rstrip('/')}/{self.metrics_file}", bucket)
            else:
                data = hook.read_result_file(handle, self.metrics_file)
            return None if data is None else json.loads(data)
        except Exception as exc:
            self.log.info("No metrics from %s/%s: %s", handle.results_dir, self.metrics_file, exc)
            return None

    def _publish_assets(self, context: Context, result: dict[str, Any]) -> None:
        """Put which model this is into the events of the task's outlet Assets (one per Asset, at success)."""
        events = context.get("outlet_events")
        if not self.outlets or events is None:
            return
        ti = context["ti"]
        extra = {
            key: result[key]
            for key in ("job_id", "platform", "backend_job_id", "results_dir", "outputs", "metrics", "gpu_hours")
            if result.get(key) is not None
        }
        extra.update(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id)
        for outlet in self.outlets:
            try:
                events[outlet].extra.update(extra)
            except (KeyError, TypeError, AttributeError) as exc:  # an alias or a foreign outlet: Airflow's own event
                self.log.warning("Cannot add the job's metadata to outlet %r: %s", outlet, exc)

    def _fail(
        self,
        context: Context,
        handle: JobHandle,
        status: JobStatus,
        analysis: FailureAnalysis | None,
        message: str,
    ) -> dict[str, Any]:
        self._keep_end(
            context, handle, status.state.value, analysis.err_class.value if analysis else ErrClass.ERR_UNKNOWN.value
        )
        if analysis is None:
            raise AirflowException(f"Job {handle.job_id} failed: {message}")
        self.log.error("Job %s failed: %s", handle.job_id, analysis.summary())
        for line in analysis.evidence:
            self.log.error("  evidence: %s", line)
        message = f"Job {handle.job_id} failed with {analysis.summary()}"
        if analysis.retriable:
            raise AirflowException(message)
        raise AirflowFailException(message)

    def on_kill(self) -> None:
        """Worker-side kill (and Airflow's timeout on the worker): cancel the job this try owns."""
        if self._waiting is not None and (why := self._waiting.summary()):
            self.log.error("Job %s was killed while waiting: %s", self._waiting.job_id, why)
        if not self.cancel_on_kill:
            return
        handle = self._handle or self._submitted()
        if handle is None:
            return
        hook = get_platform_hook(handle.platform, handle.conn_id)
        hook.load_connection()
        if hook.cancel_job(handle):
            hook.cleanup_job(handle)

    def _submitted(self) -> JobHandle | None:
        """The job a kill interrupted the submission of, if it exists: found by its name, and only if it is the job
        this try was submitting (never an earlier try's)."""
        if self._submitting is None:
            return None
        hook, name, job_id = self._submitting
        found = hook.find_job(name)
        return found if found is not None and found.job_id == job_id else None


def _origin(context: Context) -> dict[str, str]:
    ti = context["ti"]
    return {"dag_id": ti.dag_id, "task_id": ti.task_id, "run_id": ti.run_id, "map_index": str(ti.map_index)}
