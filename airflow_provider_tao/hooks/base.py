"""``TAOPlatformHook``: the one interface every platform implements, sync for the worker and async for the trigger.

Method names follow the TAO SDK (``create_job``, ``get_job_status``, ...). Behaviour every platform shares lives
here: name validation, the GPU-count rules, failure analysis from platform facts, the ownership marks that make a
clear-while-deferred safe, and the one cancel routine used by every path that cancels (operator and trigger
``on_kill``, deadline). A job is *owned* by the task try that submitted it or took it over (``claim_job``); a cancel
from a try that no longer owns it (an old trigger's ``on_kill`` after a cleared task's new try reattached) is
skipped. Platforms keep small marks with the job (``owner_try``, ``cancel_requested_by``, ``canceled_by``,
``consumed_by``) through :meth:`TAOPlatformHook.read_marks` / :meth:`TAOPlatformHook.write_mark`; the ownership
rule and the cancel routine live in :mod:`~airflow_provider_tao.hooks.ownership` (the decision it takes:
``operators/decisions.py``, ``docs/decisions.md``).

What a platform implements to appear everywhere (operator, trigger, UI links, the TAO jobs view, ``airflow tao``,
the docs): the abstract job methods below, :meth:`TAOPlatformHook.probe_connection` (the "Test" button),
:meth:`TAOPlatformHook.list_active_jobs` (``airflow tao reap``) and, where it has them, :meth:`TAOPlatformHook.job_url`
(a console page of the job), :meth:`TAOPlatformHook.job_location` (where the job is, in words) and
:meth:`TAOPlatformHook.lease_expired` (a lease of its own). See ``docs/architecture.md``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from airflow.sdk import BaseHook

from airflow_provider_tao import connections
from airflow_provider_tao.accounting import JobUsage
from airflow_provider_tao.failures import FailureFacts, classify

# JobSubmitError is not used here: the contract's errors keep their documented path, hooks.base.<Error>
from airflow_provider_tao.hooks.errors import ConnectionProblem, JobSubmitError, JobValidationError  # noqa: F401

# The marks keep their documented path, hooks.base.MARK_*; the rule and the cancel routine live in hooks/ownership.py
from airflow_provider_tao.hooks.ownership import (  # noqa: F401
    MARK_CANCEL,
    MARK_CANCELED_BY,
    MARK_CONSUMED,
    MARK_OWNER,
    OwnershipMixin,
)
from airflow_provider_tao.hooks.shared.results import RESULT_FILE_LIMIT, read_local_result
from airflow_provider_tao.hooks.shared.secrets import connection_secrets, redact
from airflow_provider_tao.hooks.validation import check_spec_text, image_required_words
from airflow_provider_tao.jobs import FailureAnalysis, JobHandle, JobSpec, JobState, JobStatus
from airflow_provider_tao.links import results_link

#: ``backend_details`` keys the operator consumes itself (the in-job runner's ``mount_path``); hooks never see them.
OPERATOR_DETAIL_KEYS = frozenset({"mount_path"})
#: The most log bytes one ``get_job_logs`` call returns; the next call continues from its cursor.
LOG_READ_LIMIT = 1 << 20
Recorded = Mapping[str, Mapping[str, Any]]


def _absent(module: str) -> bool:
    """No such module can be imported (its parent package may be missing too)."""
    try:
        return importlib.util.find_spec(module) is None
    except ImportError:
        return True


_KIND_WORDS = {
    "unreachable": "Unreachable",
    "auth": "Authentication refused",
    "not_found": "Not found",
    "permission": "Permission denied",
    "config": "Incomplete connection",
}


class TAOPlatformHook(OwnershipMixin, BaseHook):
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
    #: The longest name the platform accepts, and whether it must start with a letter (see :meth:`job_name_for`).
    name_max_length: ClassVar[int] = 63
    name_letter_first: ClassVar[bool] = False
    #: Where the ownership marks live, for the docs and the logs (e.g. "files in the job folder").
    marks_storage: ClassVar[str]
    supports_multi_node: ClassVar[bool] = False
    #: True when one poll's status call also reads the new log bytes of every watched job (or they are local files):
    #: the trigger then reads every watched log at every poll; otherwise ``[tao] log_reads_per_interval`` bounds the
    #: log reads of a connection per interval (see :mod:`airflow_provider_tao.triggers.log_budget`).
    log_reads_batched: ClassVar[bool] = False
    #: Watched jobs whose log the last status poll found unchanged since their trigger's last read (a hook whose
    #: status call sees the logs' new bytes or sizes keeps it): their triggers skip that poll's read.
    _quiet_logs: frozenset[str] = frozenset()
    #: Environment variable fallbacks for connection fields, e.g. {"login": "SLURM_USER"}.
    env_fallbacks: ClassVar[dict[str, str]] = {}
    #: Connection extras that are seconds (read only when a job is canceled: checked before it is submitted).
    seconds_settings: ClassVar[tuple[str, ...]] = ("cancel_grace_seconds",)
    #: The package extra the platform needs and the modules it brings: ``("slurm", ("airflow.providers.ssh", ...))``.
    extra_modules: ClassVar[tuple[str, tuple[str, ...]] | None] = None

    def __init__(self, conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self._extras: dict[str, Any] | None = None
        self._conn: Any = None

    @classmethod
    def get_connection(cls, conn_id: str) -> Any:
        """The connection wherever Airflow keeps it, from any process (:mod:`~airflow_provider_tao.connections`)."""
        return connections.get_connection(conn_id)

    @classmethod
    async def aget_connection(cls, conn_id: str) -> Any:
        """Async twin of :meth:`get_connection`, also in the trigger ``airflow dags test`` runs inline."""
        return await connections.aget_connection(conn_id)

    # ----------------------------------------------------------------- connection

    def load_connection(self) -> None:
        """Read the connection once (worker side). Missing connection -> a clear error naming ``conn_id``."""
        if self._extras is not None:
            return
        self.check_installed()
        if self.conn_id is None:
            self._extras = {}
            return
        self._set_connection(self.get_connection(self.conn_id), None)

    async def aload_connection(self) -> None:
        """Async twin of :meth:`load_connection`, for the triggerer (sync SDK calls would deadlock there)."""
        if self._extras is not None:
            return
        self.check_installed()
        if self.conn_id is None:
            self._extras = {}
            return
        conn = await self.aget_connection(self.conn_id)
        self._set_connection(conn, await conn.aextra_dejson())

    @classmethod
    def check_installed(cls) -> None:
        """The platform's Python packages are installed (found, not imported: the SDKs stay lazily imported), or
        bad input naming the extra to install -- not a ModuleNotFoundError in the middle of a task or a Test."""
        if cls.extra_modules is None:
            return
        extra, modules = cls.extra_modules
        missing = [module for module in modules if _absent(module)]
        if missing:
            raise JobValidationError(
                "platform",
                f"the {cls.platform} platform needs {', '.join(missing)}, which this Airflow host does not have",
                f"Install the extra with pip install 'airflow-provider-tao[{extra}]' on every Airflow host "
                "(workers, triggerer, API server) and restart them",
            )

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

    # ----------------------------------------------------------------- the connection form's "Test" button

    def test_connection(self) -> tuple[bool, str]:
        """The UI's "Test" button and ``airflow connections test``: ONE cheap real round trip to the platform.

        Returns ``(True, what answered)`` or ``(False, "<Kind>: <what failed and what to check>")`` where Kind is
        one of "Unreachable", "Authentication refused", "Not found", "Permission denied", "Incomplete connection".
        Never raises; the connection's password and secret extras never appear in the message. Platforms implement
        :meth:`probe_connection`, not this.
        """
        try:
            self.load_connection()
            self.check_settings()
            return True, self.probe_connection()
        except ConnectionProblem as problem:
            message = f"{_KIND_WORDS[problem.kind]}: {problem}"
        except JobValidationError as exc:
            message = f"{_KIND_WORDS['config']}: {exc}"
        except Exception as exc:  # the contract: a message, never an exception in the UI
            message = f"Unexpected error from the {self.platform} platform: {type(exc).__name__}: {exc}"
        return False, connections.console_safe(self._redact(message))

    def probe_connection(self) -> str:
        """One cheap, real, read-only round trip with the connection's credentials (SSH + ``sinfo``, a Docker
        ping, the Kubernetes version + a list in the namespace, a workspace call, ``brev ls``).

        :returns: what answered, for the UI ("Docker 20.10 on gpu-box", "namespace ml is usable").
        :raises ConnectionProblem: with the kind and words of what failed.
        """
        raise NotImplementedError

    def _redact(self, text: str) -> str:
        """``text`` without the connection's password or any value of a secret extra."""
        return redact(text, connection_secrets(self._conn, self._extras))

    # ----------------------------------------------------------------- where the job is, for people

    def job_url(self, handle: JobHandle) -> str:
        """The job's page on its platform's web console (Lepton's job page, Brev's instance page, a Kubernetes
        dashboard), or "" when the platform has none -- the task's "TAO job" link then opens the provider's own
        job page in Airflow. Default: the handle's ``console_url`` when it is an http(s) URL."""
        return handle.console_url if handle.console_url.startswith(("http://", "https://")) else ""

    def job_location(self, handle: JobHandle) -> dict[str, str]:
        """Where the job is on its platform, as label -> value lines (the container, the Slurm job id and log file,
        the namespace and Job, the log file), shown on the job page and by ``airflow tao jobs``."""
        return {"Platform job id": handle.backend_job_id} if handle.backend_job_id else {}

    def results_url(self, handle: JobHandle) -> str:
        """A web link of the job's results: the S3 console for ``s3://``, the URI itself for http(s), else ""
        (a folder on a platform's filesystem: the job page shows its path)."""
        return results_link(handle.results_dir)

    # ----------------------------------------------------------------- what `airflow tao reap` asks

    def list_active_jobs(self) -> list[JobHandle]:
        """Every job this provider started on this connection that the platform still runs or queues, from the
        platform's own records (job folders, labels, job comments) -- not from Airflow. ``airflow tao reap``
        compares it with what Airflow's tasks still watch."""
        raise NotImplementedError

    def lease_expired(self, handle: JobHandle, now: float | None = None) -> bool:
        """Whether the job outlived its lease. Default: ``[tao] lease_hours`` after its submission (0 = never).
        A platform that stamps a lease on what it rents (Brev) overrides this with its own record."""
        from airflow_provider_tao import settings

        hours = settings.lease_hours()
        return bool(hours) and (now or time.time()) > handle.submitted_at + hours * 3600

    def reap_resources(
        self, task_state: Callable[[Mapping[str, Any]], str | None], *, dry_run: bool, recorded: Recorded | None = None
    ) -> list[dict[str, str]]:
        """What ``airflow tao reap`` also stops on this connection besides jobs: machines the platform rents for
        jobs (Brev's instances whose lease expired or whose task finished), objects no TTL would ever remove
        (Kubernetes' Jobs left suspended, Docker's containers never started). Default: none.

        :param task_state: the Airflow state of a task instance given as ``{dag_id, run_id, task_id, map_index}``
            (None when Airflow does not know it), from the metadata database.
        :param dry_run: decide and report, stop nothing.
        :param recorded: a job's platform id -> its task instance and job name, from the task records: who owns a
            resource whose own label cannot be read (a failed Brev instance cannot be exec'd for its lease).
        :returns: one row per resource: ``{"resource", "action", "why"}`` and its ``kind`` (default ``machine``).
        """
        return []

    # ----------------------------------------------------------------- names, image, details

    def job_name_for(self, prefix: str, digest: str) -> str:
        """The platform name of a task instance's job: ``<prefix>-<digest>`` within the platform's rule.

        The digest (the task instance's identity) is never shortened; the prefix is cut to fit and, where the
        platform wants a letter first, a prefix that does not start with one gets ``tao-`` in front.
        """
        prefix = prefix.strip("-")
        if self.name_letter_first and not prefix[:1].isalpha():
            prefix = f"tao-{prefix}".rstrip("-")
        room = self.name_max_length - len(digest) - 1
        prefix = prefix[: max(room, 0)].rstrip("-")
        return f"{prefix}-{digest}" if prefix else f"tao-{digest}"[: self.name_max_length]

    def image_required(self, spec: JobSpec) -> str | None:
        """Why ``spec`` needs a container image here (the error's words), or None when it runs without one."""
        return image_required_words(self.platform)

    @staticmethod
    def platform_details(spec: JobSpec) -> dict[str, Any]:
        """``spec.backend_details`` without the keys the operator consumes itself (``OPERATOR_DETAIL_KEYS``)."""
        return {k: v for k, v in spec.backend_details.items() if k not in OPERATOR_DETAIL_KEYS}

    # ----------------------------------------------------------------- validation (before submission)

    def validate_name(self, name: str, parameter: str = "job_name") -> None:
        if not self.name_pattern.match(name):
            raise JobValidationError(
                parameter,
                f"{name!r} is not a valid job name on the {self.platform} platform",
                f"Use {self.name_rule}, or leave job_name unset for a deterministic one",
            )

    def check_settings(self) -> None:
        """The connection's settings that are read late (at cancel) have the right type, checked early."""
        self.load_connection()
        for name in self.seconds_settings:
            value = self.setting(name)
            try:
                ok = value is None or (not isinstance(value, bool) and float(value) >= 0)
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise JobValidationError(
                    name, f"{value!r} is not a number of seconds", f"Set the connection's {name} extra to one, e.g. 10"
                )

    def validate_spec(self, spec: JobSpec) -> None:
        """Reject what this platform cannot run, before anything is submitted. Subclasses extend it."""
        self.check_settings()
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
        check_spec_text(spec)

    # ----------------------------------------------------------------- the platform interface (sync)

    def create_job(self, spec: JobSpec, try_number: int = 1) -> JobHandle:
        """Submit the job; returns its handle, owned by ``try_number``."""
        raise NotImplementedError

    def find_job(self, name: str) -> JobHandle | None:
        """The newest job with this deterministic name, or None (used to reattach when nothing was stored)."""
        raise NotImplementedError

    def get_job_status(self, handle: JobHandle) -> JobStatus:
        raise NotImplementedError

    def get_job_logs(self, handle: JobHandle, cursor: str = "", tail: int | None = None) -> tuple[str, str]:
        """New log text after ``cursor`` ("" = from the start; at most ``LOG_READ_LIMIT`` bytes) and the cursor to
        continue from. The cursor is opaque outside the hook (byte offsets, timestamps, ...) and is stored by the
        trigger, so a restarted triggerer resumes where the last one stopped. With ``tail`` the last ``tail``
        lines instead, and a cursor at the end of the log."""
        raise NotImplementedError

    def log_news(self, job_id: str) -> bool:
        """Whether a read of the job's log now may bring new text: False only when the last status poll saw that
        its log has not grown since its trigger's last read (so a quiet job costs its trigger no read at all)."""
        return job_id not in self._quiet_logs

    def log_read_reached_end(self, text: str) -> bool:
        """Whether a read of an ended job's log that returned ``text`` reached the log's end, so the trigger makes
        no read just to find nothing more: a read of less than half ``LOG_READ_LIMIT`` was not cut by the bound.
        Platforms whose reads are bounded otherwise override it."""
        return len(text.encode()) < LOG_READ_LIMIT // 2

    def _cancel(self, handle: JobHandle) -> bool:
        """Stop the job on the platform; True when it is gone or already terminal. Idempotent."""
        raise NotImplementedError

    def failure_facts(self, handle: JobHandle) -> FailureFacts:
        """What the platform knows about a failed job (exit code, raw state, OOM flag, log tail, events)."""
        raise NotImplementedError

    def get_job_results_dir(self, handle: JobHandle) -> str:
        return handle.results_dir

    def get_job_usage(self, handle: JobHandle) -> JobUsage:
        """What the job used, from the backend's own records: when it was queued, started and ended, on how many
        GPUs per node (of which type) and nodes -- for the task's GPU-hours (``accounting.py``). Called once per
        attempt, when it ends (never on the polling path); platforms fill it from what they read anyway where they
        can. Default: only the submission time is known (the job counts as never started)."""
        return JobUsage(queued_at=handle.submitted_at, source="the submission time only")

    def default_results_root(self) -> str | None:
        """The platform's persistent results root, exported into jobs as ``TAO_RESULTS_ROOT``; None if none."""
        return None

    def runner_mount_path(self, spec: JobSpec) -> str | None:
        """The shared cache the in-job runner keeps S3 inputs on (``<mount>/<bucket>/<key>``, reused while size and
        ETag match), when the platform mounts one into ``spec``'s job by itself (Lepton: a Lustre volume of the node
        group). ``backend_details["mount_path"]`` wins over it."""
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

    def read_result_file(self, handle: JobHandle, name: str, limit: int = RESULT_FILE_LIMIT) -> bytes | None:
        """``<results_dir>/<name>`` or None; a link, FIFO or file over ``limit`` raises ``UnsafeResultFile`` (default:
        a results folder on this host, see :mod:`~airflow_provider_tao.hooks.shared.results`)."""
        if not handle.results_dir.startswith("/"):
            return None
        try:
            return read_local_result(handle.results_dir, name, limit)
        except OSError:
            return None

    def list_path(self, uri: str) -> list[str]:
        raise NotImplementedError

    def read_marks(self, handle: JobHandle) -> dict[str, Any]:
        """The marks kept with the job on the platform (``MARK_OWNER``, ``MARK_CANCEL``, ``MARK_CONSUMED``).

        Required: a platform that cannot keep them with the job keeps them in a documented fallback store and
        says so in ``marks_storage``."""
        raise NotImplementedError

    def write_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        """Keep one mark with the job (atomically; the last writer wins)."""
        raise NotImplementedError

    async def aread_marks(self, handle: JobHandle) -> dict[str, Any]:
        """Async twin of :meth:`read_marks` (override with the platform's async client)."""
        return await asyncio.to_thread(self.read_marks, handle)

    async def awrite_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        """Async twin of :meth:`write_mark` (override with the platform's async client)."""
        await asyncio.to_thread(self.write_mark, handle, key, value)

    async def _acancel(self, handle: JobHandle) -> bool:
        """Async twin of :meth:`_cancel` (override with the platform's async client)."""
        return await asyncio.to_thread(self._cancel, handle)

    async def aclose(self) -> None:
        """Release the async client; called when the last watcher of this (event loop, connection) leaves."""

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

    def watch_problem(self, handle: JobHandle) -> str | None:
        """Why this process cannot watch ``handle`` (then the trigger stops with ``misplaced``), or None."""
        return None

    def get_failure_analysis(self, handle: JobHandle) -> FailureAnalysis | None:
        """Classify a failed job; None while it has not failed."""
        status = self.get_job_status(handle)
        if status.state not in (JobState.ERROR, JobState.CANCELED):
            return None
        return classify(self.failure_facts(handle))

    def cleanup_job(self, handle: JobHandle, *, adoptable: bool = False) -> None:
        """Remove what only a running job needs (a secret file on a shared filesystem) once it has ended for good.
        Best effort: a failure is logged, never raised.

        :param adoptable: a kill's, whose task may run again (a clear, a timeout's retry): a job that completed on
            its own keeps what its next try needs to adopt it (a Brev instance); the sweeper removes it later.
        """

    def resubmit_if_retriable(self, handle: JobHandle, status: JobStatus) -> str | None:
        """Called by the trigger when the job ended in Error. A platform that can rerun the job in place (same
        ``job_id``, e.g. SLURM's requeue of the staged batch script) does so when the failure is retriable
        infrastructure and attempts are left, and returns a line for the task log; None: "it stays failed". The
        attempt count lives on the platform: asking twice (a restarted triggerer; a raise, its answer lost) is safe."""
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

    async def aget_job_logs(self, handle: JobHandle, cursor: str = "", tail: int | None = None) -> tuple[str, str]:
        return await asyncio.to_thread(self.get_job_logs, handle, cursor, tail)

    async def aresubmit_if_retriable(self, handle: JobHandle, status: JobStatus) -> str | None:
        return await asyncio.to_thread(self.resubmit_if_retriable, handle, status)
