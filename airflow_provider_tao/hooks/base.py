"""``TAOPlatformHook``: the one interface every platform implements, sync for the worker and async for the trigger.

Method names follow the TAO SDK (``create_job``, ``get_job_status``, ...). Behaviour every platform shares lives
here, not in the platform hooks: name validation, the GPU-count rules, failure analysis from platform facts, the
ownership marks that make a clear-while-deferred safe, and the one cancel routine used by every path that cancels
(operator ``on_kill``, trigger ``on_kill``, deadline).

Ownership: a job is *owned* by the task try that submitted it or took it over (``claim_job``). A cancel coming
from a try that no longer owns the job -- e.g. the old trigger's ``on_kill`` firing after a cleared task's new
try already reattached -- is skipped. Platforms keep two small marks with the job (``owner_try`` and
``cancel_requested_by``) through :meth:`TAOPlatformHook.read_marks` / :meth:`TAOPlatformHook.write_mark`.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from airflow.sdk import BaseHook

from airflow_provider_tao.failures import FailureFacts, classify
from airflow_provider_tao.jobs import FailureAnalysis, JobHandle, JobSpec, JobState, JobStatus

MARK_OWNER = "owner_try"
MARK_CANCEL = "cancel_requested_by"


class JobValidationError(ValueError):
    """Bad input found before anything was submitted. The message names the parameter and the fix."""

    def __init__(self, parameter: str, problem: str, fix: str) -> None:
        self.parameter = parameter
        super().__init__(f"{parameter}: {problem}. {fix}")


class TAOPlatformHook(BaseHook):
    """Base class of every platform hook.

    Subclasses set ``platform``, ``conn_type``, ``default_conn_name``, ``hook_name`` and implement the abstract
    sync methods; the async twins default to running the sync ones in a thread and are overridden where the
    platform has a real async client. ``aget_job_statuses`` must cost one backend call for all handles.

    :param conn_id: the Airflow connection; ``None`` uses the platform's documented defaults / env vars.
    """

    platform: ClassVar[str]
    conn_type: ClassVar[str]
    conn_name_attr = "conn_id"
    #: Job names the platform accepts (checked before submission).
    name_pattern: ClassVar[re.Pattern[str]] = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    name_rule: ClassVar[str] = "lower-case letters, digits and '-', at most 63 characters, not starting/ending in '-'"
    supports_multi_node: ClassVar[bool] = False
    #: Environment variable fallbacks for connection fields, e.g. {"login": "SLURM_USER"}.
    env_fallbacks: ClassVar[dict[str, str]] = {}

    def __init__(self, conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self._extras: dict[str, Any] | None = None
        self._conn: Any = None

    # ----------------------------------------------------------------- connection

    def load_connection(self) -> None:
        """Read the connection once (worker side). Missing connection -> a clear error naming ``conn_id``."""
        if self._extras is not None:
            return
        if self.conn_id is None:
            self._extras = {}
            return
        self._set_connection(self.get_connection(self.conn_id), None)

    async def aload_connection(self) -> None:
        """Async twin of :meth:`load_connection`, for the triggerer (sync SDK calls would deadlock there)."""
        if self._extras is not None:
            return
        if self.conn_id is None:
            self._extras = {}
            return
        conn = await self.aget_connection(self.conn_id)
        self._set_connection(conn, await conn.aextra_dejson())

    def _set_connection(self, conn: Any, extras: dict[str, Any] | None) -> None:
        if conn.conn_type not in (None, "", self.conn_type):
            raise JobValidationError(
                "conn_id",
                f"connection {self.conn_id!r} has type {conn.conn_type!r}, not {self.conn_type!r}",
                f"Use a {self.conn_type} connection for the {self.platform} platform",
            )
        self._conn = conn
        self._extras = extras if extras is not None else conn.extra_dejson

    def setting(self, name: str, default: Any = None) -> Any:
        """A connection field or extra, then its environment fallback, then ``default``."""
        assert self._extras is not None, "load_connection() first"
        value = getattr(self._conn, name, None) if name in ("host", "login", "port", "password", "schema") else None
        if value in (None, ""):
            value = self._extras.get(name)
        if value in (None, "") and name in self.env_fallbacks:
            value = os.environ.get(self.env_fallbacks[name])
        return default if value in (None, "") else value

    # ----------------------------------------------------------------- validation (before submission)

    def validate_name(self, name: str, parameter: str = "job_name") -> None:
        if not self.name_pattern.match(name):
            raise JobValidationError(
                parameter,
                f"{name!r} is not a valid job name on the {self.platform} platform",
                f"Use {self.name_rule}, or leave job_name unset for a deterministic one",
            )

    def validate_spec(self, spec: JobSpec) -> None:
        """Reject what this platform cannot run, before anything is submitted. Subclasses extend it."""
        self.validate_name(spec.name)
        if spec.gpu_count < -1:
            raise JobValidationError(
                "gpu_count",
                f"{spec.gpu_count} is not allowed",
                "Use 0 for none, N for N GPUs, or -1 for all visible GPUs",
            )
        if spec.num_nodes < 1:
            raise JobValidationError("num_nodes", f"{spec.num_nodes} is not allowed", "Use 1 or more nodes")
        if spec.num_nodes > 1 and not self.supports_multi_node:
            raise JobValidationError(
                "num_nodes",
                f"the {self.platform} platform runs single-node jobs only (asked for {spec.num_nodes})",
                "Use num_nodes=1, or a multi-node platform (slurm, lepton, kubernetes)",
            )
        for key, value in {**spec.env, **spec.secret_env}.items():
            if not isinstance(value, str):
                raise JobValidationError(
                    f"env[{key!r}]",
                    f"value {value!r} is a {type(value).__name__}, not a string",
                    f"Write it as {str(value)!r}",
                )
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise JobValidationError(
                    f"env[{key!r}]", "is not a valid environment variable name", "Use [A-Za-z_][A-Za-z0-9_]*"
                )
        if not spec.command:
            raise JobValidationError("command", "is empty", "Give the command the job runs")

    # ----------------------------------------------------------------- the platform interface (sync)

    def create_job(self, spec: JobSpec, try_number: int = 1) -> JobHandle:
        """Submit the job; returns its handle, owned by ``try_number``."""
        raise NotImplementedError

    def find_job(self, name: str) -> JobHandle | None:
        """The newest job with this deterministic name, or None (used to reattach when nothing was stored)."""
        raise NotImplementedError

    def get_job_status(self, handle: JobHandle) -> JobStatus:
        raise NotImplementedError

    def get_job_logs(self, handle: JobHandle, offset: int = 0, tail: int | None = None) -> tuple[str, int]:
        """Log text from byte ``offset`` (or the last ``tail`` lines) and the offset to continue from."""
        raise NotImplementedError

    def _cancel(self, handle: JobHandle) -> bool:
        """Stop the job on the platform; True when it is gone or already terminal. Idempotent."""
        raise NotImplementedError

    def failure_facts(self, handle: JobHandle) -> FailureFacts:
        """What the platform knows about a failed job (exit code, raw state, OOM flag, log tail, events)."""
        raise NotImplementedError

    def get_job_results_dir(self, handle: JobHandle) -> str:
        return handle.results_dir

    def default_results_root(self) -> str | None:
        """The platform's persistent results root, exported into jobs as ``TAO_RESULTS_ROOT``; None if none."""
        return None

    def results_dir_for(self, spec: JobSpec) -> str:
        """Where a job's results land -- the in-job runner's order: an explicit root (``results_uri``), the
        platform's persistent root, ``s3://$S3_BUCKET_NAME/results``, else the job's own ``/results``."""
        root = spec.results_uri or self.default_results_root()
        if root:
            return f"{root.rstrip('/')}/{spec.job_id}"
        if bucket := spec.env.get("S3_BUCKET_NAME"):
            return f"s3://{bucket.removeprefix('s3://').strip('/')}/results/{spec.job_id}"
        return f"/results/{spec.job_id}"

    def check_path(self, uri: str) -> bool:
        raise NotImplementedError

    def list_path(self, uri: str) -> list[str]:
        raise NotImplementedError

    def read_marks(self, handle: JobHandle) -> dict[str, Any]:
        """The ownership marks kept with the job ({} where the platform cannot keep them)."""
        return {}

    def write_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        """Keep a mark with the job (no-op where the platform cannot)."""

    # ----------------------------------------------------------------- shared behaviour

    def tao_env(self, spec: JobSpec, *, files_dir: str, results_root: str | None) -> dict[str, str]:
        """The plain environment every job gets: the spec's ``env`` plus the TAO variables (``TAO_JOB_ID`` --
        equal to the task's XCom ``job_id`` --, ``TAO_JOB_NAME``, ``TAO_JOB_FILES``, ``TAO_RESULTS_ROOT``).
        Secrets are not in it: each platform hands ``spec.secret_env`` over its own private channel."""
        env = {
            **spec.env,
            "TAO_JOB_ID": spec.job_id,
            "TAO_JOB_NAME": spec.name,
            "TAO_JOB_FILES": files_dir,
            "PYTHONUNBUFFERED": "1",
        }
        if results_root:
            env["TAO_RESULTS_ROOT"] = results_root
        return env

    def new_handle(
        self, spec: JobSpec, try_number: int, *, backend_job_id: str = "", console_url: str = ""
    ) -> JobHandle:
        """The handle of a job being submitted from ``spec`` by try ``try_number``."""
        return JobHandle(
            platform=self.platform,
            conn_id=self.conn_id,
            job_id=spec.job_id,
            name=spec.name,
            backend_job_id=backend_job_id,
            results_dir=self.results_dir_for(spec),
            try_number=try_number,
            console_url=console_url,
        )

    def get_failure_analysis(self, handle: JobHandle) -> FailureAnalysis | None:
        """Classify a failed job; None while it has not failed."""
        status = self.get_job_status(handle)
        if status.state not in (JobState.ERROR, JobState.CANCELED):
            return None
        return classify(self.failure_facts(handle))

    def claim_job(self, handle: JobHandle) -> None:
        """Record that ``handle.try_number`` now owns the job (on reattach)."""
        self.write_mark(handle, MARK_OWNER, handle.try_number)

    def job_owner(self, handle: JobHandle) -> int:
        """The try that owns the job: its mark, else the try that submitted it."""
        owner = self.read_marks(handle).get(MARK_OWNER)
        return int(owner) if owner is not None else handle.try_number

    def cancel_requested_by(self, handle: JobHandle) -> int | None:
        """The try whose cancel stopped the job, if a cancel was requested through this provider."""
        who = self.read_marks(handle).get(MARK_CANCEL)
        return int(who) if who is not None else None

    def cancel_job(self, handle: JobHandle) -> bool:
        """The one cancel routine: cancel the job if ``handle``'s try still owns it.

        Returns True when the job is stopped (or was already), False when it was left alone because
        another try owns it now.
        """
        owner = self.job_owner(handle)
        if owner != handle.try_number:
            self.log.info(
                "Not canceling job %s: try %s owns it now (this is try %s)", handle.job_id, owner, handle.try_number
            )
            return False
        if self.get_job_status(handle).state.is_terminal:
            return True  # nothing to stop, and a finished job keeps its own verdict (not "canceled")
        self.write_mark(handle, MARK_CANCEL, handle.try_number)
        self.log.info("Canceling job %s (%s) on %s", handle.job_id, handle.backend_job_id, self.platform)
        return self._cancel(handle)

    def resubmit_if_retriable(self, handle: JobHandle, status: JobStatus) -> str | None:
        """Called by the trigger when the job ended in Error. A platform that can rerun the job in place (same
        ``job_id``, e.g. SLURM's requeue of the staged batch script) does so when the failure is retriable
        infrastructure and attempts are left, and returns a line for the task log; None means "it stays failed".
        The attempt count must live on the platform, so a restarted triggerer never resubmits twice."""
        return None

    # ----------------------------------------------------------------- async twins (used by the trigger)

    async def aget_job_status(self, handle: JobHandle) -> JobStatus:
        return (await self.aget_job_statuses([handle]))[handle.job_id]

    async def aget_job_statuses(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        """Statuses of many jobs of this connection in ONE backend call. Default: one thread hop for all."""
        return await asyncio.to_thread(self.get_job_statuses, list(handles))

    def get_job_statuses(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        """Sync batch; platforms with a list/batch API override this to make one call."""
        return {h.job_id: self.get_job_status(h) for h in handles}

    async def aget_job_logs(self, handle: JobHandle, offset: int = 0, tail: int | None = None) -> tuple[str, int]:
        return await asyncio.to_thread(self.get_job_logs, handle, offset, tail)

    async def acancel_job(self, handle: JobHandle) -> bool:
        return await asyncio.to_thread(self.cancel_job, handle)

    async def aresubmit_if_retriable(self, handle: JobHandle, status: JobStatus) -> str | None:
        return await asyncio.to_thread(self.resubmit_if_retriable, handle, status)
