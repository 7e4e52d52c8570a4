"""The ``lepton`` platform: each job is one DGX Cloud Lepton batch job in a workspace, through ``leptonai``'s
``APIClient`` (imported on first use, never at DAG parse; in the triggerer only inside threads: its calls are blocking
``requests``).

Where things live:

* Placement: the resource shape is the explicit ``resource_shape`` or the shape of the workspace whose GPU count fits
  ``gpu_count``; the node group is found by name or id; a shared volume of the node group (Lustre before filestore
  before the first) is mounted at the prefix its storage permissions grant, with ``TAO_RESULTS_ROOT`` on it and, on
  Lustre, the runner's S3 input cache (``<mount>/<bucket>/<key>``, reused while size and ETag match).
* Files (the in-job runner, the rendered spec, this platform's ``setup.sh``): one gzip'd tar, base64 in environment
  variables of at most 120 KiB each (Linux refuses one string of 128 KiB; all of argv + env must stay under 2 MiB,
  measured on the test engine) held in per-job user secrets, so job listings stay small. What does not fit in 1 MiB
  is staged onto the node group's shared volume by short staging jobs (each carrying <= 1 MiB the same way) and
  unpacked from there; without a volume it is refused before anything is created. Nothing is downloaded at job
  start and nothing rides on a command line.
* Secrets (``secret_env``, the connection's NGC key and HF token): user secrets ``tao.<job_id>.env.<VAR>`` referenced
  with ``value_from.secret_name_ref``; the NGC key also becomes an image pull secret ``tao-<job_id>-pull``. Deleted
  with the job (cancel) or once its verdict is read (cleanup).
* Ownership marks: labels of the job, patched. Whether a workspace lets a PATCH change labels is not documented, so
  every write is read back; where labels do not change, the marks are user secrets named
  ``tao.<job_id>.mark.<key>.<try>`` (marks only ever grow, so the highest try wins). Reads merge both.
* Multi-node: ``completions = parallelism = num_nodes`` with ``intra_job_communication``; ``setup.sh`` (shipped with
  the files) turns Lepton's worker variables into the multi-node contract in every replica.

Status: ONE job list per poll for every watched job of the workspace (label query, pages of 500). Jobs still starting
have their replicas' readiness read (the Pending reason: "Pulling image", ``ConfigError``), every 2 s at first and
backing off to every 30 s; a job queueing past ``capacity_timeout_seconds`` (900) or starting past
``start_timeout_seconds`` (600) is an Error (``ERR_CAPACITY``, ``ERR_IMAGE_PULL``, ``ERR_INFRA``) and is stopped and
deleted by its cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from airflow_provider_tao.failures import FailureFacts
from airflow_provider_tao.hooks import container as ct
from airflow_provider_tao.hooks.base import (
    MARK_CANCEL,
    MARK_CONSUMED,
    MARK_OWNER,
    JobSubmitError,
    JobValidationError,
    TAOPlatformHook,
    multi_node_env,
    register_secrets,
)
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobSpec, JobState, JobStatus

T = TypeVar("T")

# Label keys: the client refuses '/' in them (``^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$``, <= 63).
LABEL_MANAGED = "tao-managed"
LABEL_JOB_ID = "tao-job-id"
LABEL_NAME = "tao-job-name"
LABEL_TRY = "tao-try"
LABEL_CAPACITY = "tao-capacity-timeout"
LABEL_START = "tao-start-timeout"
LABEL_STAGE_OF = "tao-stage-of"
ORIGIN_LABELS = {"dag_id": "tao-dag-id", "task_id": "tao-task-id", "map_index": "tao-map-index"}
MARK_LABELS = {MARK_OWNER: "tao-owner-try", MARK_CANCEL: "tao-cancel-by", MARK_CONSUMED: "tao-consumed-by"}
#: Plain variable holding the job's results folder (how :meth:`LeptonHook.find_job` restores a handle).
RESULTS_DIR_ENV = "TAO_RESULTS_DIR"

DEFAULT_TTL_SECONDS = 24 * 3600
DEFAULT_CAPACITY_TIMEOUT = 15 * 60
DEFAULT_START_TIMEOUT = 10 * 60
DEFAULT_STAGING_TIMEOUT = 10 * 60
DEFAULT_REGISTRY = "nvcr.io"
#: Seconds one API request may take (the client's own default is 120 s).
REQUEST_TIMEOUT = 30
PAGE_SIZE = 500
#: Characters of one files variable: Linux refuses one environment string of 128 KiB (MAX_ARG_STRLEN).
ENV_PART_SIZE = 120 * 1024
#: Base64 characters of files one job carries in its environment. All of argv + environment must stay under 2 MiB
#: (ARG_MAX with an 8 MiB stack: 2040 KiB ran, 2110 KiB failed with E2BIG on the test engine); the rest is left to
#: the job's own variables and Lepton's. Also what one staging job carries.
ENV_FILES_BUDGET = 1 << 20
#: Everything a job's environment may hold (values + names), checked before submission.
ENV_TOTAL_BUDGET = 1900 * 1024
#: Staging jobs one submission may start (each stages ~750 KiB of packed files): ~12 MiB of packed files at most.
MAX_STAGING_JOBS = 16
STAGING_DIR = ".tao-staging"
STAGING_TTL_SECONDS = 600
#: A starting job's replicas are asked why they are not ready at most this often: every 2 s at first, backing off
#: with the time it has been starting, to 30 s (a failed image pull shows within seconds, a long pull costs little).
READINESS_FIRST = 2.0
READINESS_EVERY = 30.0
#: Jobs missing from the list that are looked up one by one in one poll (deleted / archived ones).
MISSING_LOOKUPS_PER_POLL = 20
#: Log lines younger than this are shown at the next read (Lepton collects logs asynchronously; a line stamped
#: earlier than one already shown would otherwise be skipped). An ended job's log is read to its end.
LOG_SETTLE_NS = 2 * 10**9
LOG_LIMIT = 5000
#: ``backend_details`` keys this platform understands.
DETAIL_KEYS = frozenset(
    {
        "resource_shape",
        "dedicated_node_group",
        "mounts",
        "auto_mount",
        "shared_memory_size",
        "capacity_timeout_seconds",
        "start_timeout_seconds",
        "ttl_seconds_after_finished",
        "priority_class",
        "can_be_preempted",
    }
)
QUEUE_STATES = frozenset({"Queueing", "Awaiting", "PendingRetry"})
START_STATES = frozenset({"Starting", "Restarting"})
#: Lepton states after which the job runs nothing more (Stopped is a pause: it can be started again).
FINISHED_STATES = frozenset({"Completed", "Failed", "Deleted", "Archived"})
_READINESS_ORDER = ("Failed", "ConfigError", "SystemError", "NoCapacity", "Queueing", "InProgress")
_PULLING = re.compile(r"pull|image", re.IGNORECASE)
_EXIT_CODE = re.compile(r"exit(?:ed)?(?: with)? code[:= ]+(-?\d+)", re.IGNORECASE)
_STAGE_COMMAND = (
    'umask 077 && mkdir -p "$TAO_STAGE_DIR" && cp "$TAO_JOB_FILES/$TAO_STAGE_PART" "$TAO_STAGE_DIR/.$TAO_STAGE_PART" '
    '&& mv -f "$TAO_STAGE_DIR/.$TAO_STAGE_PART" "$TAO_STAGE_DIR/$TAO_STAGE_PART"'
)
_STAGE_ARGV = ["/bin/sh", "-c", _STAGE_COMMAND]
#: Per workspace URL: whether a PATCH changes a job's labels (None: not yet seen in this process).
_LABELS_PATCHABLE: dict[str, bool] = {}


def secret_prefix(job_id: str) -> str:
    """Every user secret of one job starts with this (``tao.<job_id>.``)."""
    return f"tao.{job_id}."


def pull_secret_name(job_id: str) -> str:
    return f"tao-{job_id}-pull"


def stage_job_name(job_id: str, index: int) -> str:
    return f"tao-stage-{job_id}-{index}"


# ----------------------------------------------------------------------------- pure parts (unit tested)


@dataclass(frozen=True)
class Readiness:
    """Why a job's replicas are not ready (the most telling of them), from ``readiness_issue``."""

    reason: str
    message: str


def readiness_of(replicas: Iterable[dict[str, Any]]) -> Readiness | None:
    """The most severe readiness issue of the replicas (Failed > ConfigError > ... > InProgress), or None."""
    issues = []
    for replica in replicas:
        issue = (replica.get("status") or {}).get("readiness_issue") or {}
        if issue.get("reason") and issue.get("reason") != "Ready":
            issues.append(Readiness(str(issue["reason"]), str(issue.get("message") or "")))
    rank = {reason: i for i, reason in enumerate(_READINESS_ORDER)}
    return min(issues, key=lambda r: rank.get(r.reason, len(rank)), default=None)


def _created(job: dict[str, Any]) -> float | None:
    meta, status = job.get("metadata") or {}, job.get("status") or {}
    stamp = meta.get("created_at") or status.get("creation_time")
    return float(stamp) / 1000 if stamp else None


def job_status(
    job: dict[str, Any], now: float, readiness: Readiness | None = None, starting_since: float | None = None
) -> JobStatus:
    """A Lepton job's state in the shared vocabulary (the seed's map), from the job's JSON.

    Queueing / Awaiting / PendingRetry / Starting are Pending, and so is Running while fewer replicas are ready than
    active ("starting replicas"); Completed is Complete, Stopped Paused, Deleted Canceled, Failed or Archived without
    completing Error. Queueing past the job's capacity bound is an Error ``NoCapacity``; starting past its start
    bound an Error named after the replicas' readiness (``ImagePullFailed``, ``ConfigError``, ``StartTimeout``), as
    is a replica whose image pull failed.

    :param readiness: the replicas' readiness issue, when known.
    :param starting_since: when the job was first seen starting (else its creation).
    """
    meta, status, spec = job.get("metadata") or {}, job.get("status") or {}, job.get("spec") or {}
    name = meta.get("name") or meta.get("id") or "?"
    state = str(status.get("state") or "")
    labels = meta.get("labels") or {}
    wanted = int(spec.get("parallelism") or spec.get("completions") or 1)
    ready, active = int(status.get("ready") or 0), int(status.get("active") or 0)
    why = f": {readiness.reason}: {readiness.message}".rstrip(": ") if readiness else ""
    if state == "Completed":
        return JobStatus(JobState.COMPLETE, f"Lepton job {name} completed", 0, state)
    if state == "Archived":
        if int(status.get("succeeded") or 0) >= int(spec.get("completions") or 1):
            return JobStatus(JobState.COMPLETE, f"Lepton job {name} completed (archived)", 0, state)
        return JobStatus(JobState.ERROR, f"Lepton job {name} was archived without completing", raw_state=state)
    if state == "Failed":
        failed = int(status.get("failed") or 0)
        return JobStatus(JobState.ERROR, f"Lepton job {name} failed ({failed} replica(s) failed)", raw_state=state)
    if state == "Deleted":
        return JobStatus(JobState.CANCELED, f"Lepton job {name} was deleted", raw_state=state)
    if state in ("Deleting", "Terminating"):
        return JobStatus(JobState.CANCELING, f"Lepton job {name} is being deleted", raw_state=state)
    if state in ("Stopped", "Stopping"):
        return JobStatus(JobState.PAUSED, f"Lepton job {name} is {state.lower()}", raw_state=state)
    created = _created(job) or now
    if readiness is not None and readiness.reason == "Failed":
        raw = "ImagePullFailed" if _PULLING.search(readiness.message) else "ReplicaFailed"
        return JobStatus(JobState.ERROR, f"Lepton job {name}: a replica cannot start{why}", raw_state=raw)
    if state in QUEUE_STATES or (readiness is not None and readiness.reason in ("NoCapacity", "Queueing")):
        bound = float(labels.get(LABEL_CAPACITY) or DEFAULT_CAPACITY_TIMEOUT)
        if now - created > bound:
            return JobStatus(
                JobState.ERROR,
                f"Lepton job {name} found no capacity for {now - created:.0f} s (more than {bound:.0f} s){why}",
                raw_state="NoCapacity",
            )
        return JobStatus(
            JobState.PENDING, f"Lepton job {name} is {state or 'queueing'}: waiting for capacity{why}", raw_state=state
        )
    if state in START_STATES or (state == "Running" and ready < max(active, wanted)):
        since = starting_since if starting_since is not None else created
        bound = float(labels.get(LABEL_START) or DEFAULT_START_TIMEOUT)
        if now - since > bound:
            raw = (
                "ConfigError"
                if readiness is not None and readiness.reason in ("ConfigError", "SystemError")
                else "ImagePullFailed"
                if readiness is not None and _PULLING.search(readiness.message)
                else "StartTimeout"
            )
            return JobStatus(
                JobState.ERROR,
                f"Lepton job {name}: replicas not ready after {now - since:.0f} s (more than {bound:.0f} s){why}",
                raw_state=raw,
            )
        return JobStatus(
            JobState.PENDING, f"Lepton job {name}: starting replicas ({ready}/{wanted} ready){why}", raw_state=state
        )
    if state == "Running":
        return JobStatus(JobState.RUNNING, f"Lepton job {name}: {ready}/{wanted} replica(s) running", raw_state=state)
    return JobStatus(JobState.PENDING, f"Lepton job {name} is in state {state!r}", raw_state=state)


def pick_shape(shapes: Sequence[dict[str, Any]], gpu_count: int) -> dict[str, Any] | None:
    """The shape for ``gpu_count`` GPUs per node: CPU-only for 0, the largest for -1 (all), else exactly that many
    accelerators, else the fewest above it. Shapes are ``{"id", "gpus", "cpu", "memory_mb"}``."""
    if gpu_count == 0:
        cpus = [s for s in shapes if not s["gpus"]]
        return min(cpus, key=lambda s: (s["cpu"], s["memory_mb"], s["id"]), default=None)
    gpus = [s for s in shapes if s["gpus"]]
    if gpu_count == -1:
        return max(gpus, key=lambda s: (s["gpus"], -s["cpu"], s["id"]), default=None)
    exact = [s for s in gpus if s["gpus"] == gpu_count]
    above = [s for s in gpus if s["gpus"] > gpu_count]
    return min(exact or above, key=lambda s: (s["gpus"], s["cpu"], s["memory_mb"], s["id"]), default=None)


def pick_volume(volumes: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The volume to mount: one named like Lustre, else filestore, else the first (the TAO SDK's order)."""
    for kind in ("lustre", "filestore"):
        found = [v for v in volumes if kind in str(v.get("name", "")).lower()]
        if found:
            return found[0]
    return volumes[0] if volumes else None


def volume_kind(volume: dict[str, Any]) -> str:
    name = str(volume.get("name", "")).lower()
    return "lustre" if "lustre" in name else "filestore" if "filestore" in name else str(volume.get("from") or "")


def setup_script(num_nodes: int, staged: bool) -> bytes:
    """``setup.sh`` shipped with the job's files (sourced by the launcher after unpacking, in every replica).

    Multi-node: the contract's ``NODE_RANK`` / ``MASTER_ADDR`` (and ``WORKER_ADDRS``) from Lepton's worker variables,
    the translation the TAO SDK downloads at job start (never done here). Staged files: the last replica to unpack
    them removes them from the shared volume.
    """
    lines = ["# generated by airflow-provider-tao: sourced by the launcher before the job's command"]
    if staged:
        lines += [
            f'mkdir -p "${ct.PARTS_DIR_ENV}/unpacked-${{LEPTON_JOB_WORKER_INDEX:-0}}" 2>/dev/null',
            f'if [ "$(ls -d "${ct.PARTS_DIR_ENV}"/unpacked-* 2>/dev/null | wc -l)" -ge '
            f'"${{LEPTON_JOB_TOTAL_WORKERS:-1}}" ]; then rm -rf "${ct.PARTS_DIR_ENV}"; fi',
            f"unset {ct.PARTS_DIR_ENV}",
        ]
    if num_nodes > 1:
        lines += [
            'export NODE_RANK="${LEPTON_JOB_WORKER_INDEX:?Lepton did not set LEPTON_JOB_WORKER_INDEX}"',
            'export MASTER_ADDR="${LEPTON_JOB_WORKER_PREFIX:?Lepton did not set LEPTON_JOB_WORKER_PREFIX}-0.'
            '${LEPTON_SUBDOMAIN:?Lepton did not set LEPTON_SUBDOMAIN}"',
            'tao_i=1; WORKER_ADDRS=""',
            'while [ "$tao_i" -lt "${LEPTON_JOB_TOTAL_WORKERS:-1}" ]; do',
            '  WORKER_ADDRS="${WORKER_ADDRS:+$WORKER_ADDRS,}${LEPTON_JOB_WORKER_PREFIX}-$tao_i.${LEPTON_SUBDOMAIN}"',
            "  tao_i=$((tao_i + 1))",
            "done",
            "export WORKER_ADDRS; unset tao_i",
        ]
    return ("\n".join(lines) + "\n").encode()


def b64_size(raw: int) -> int:
    """Characters of ``raw`` bytes in base64."""
    return 4 * math.ceil(raw / 3)


def env_bytes(env: dict[str, str]) -> int:
    """What an environment costs at ``execve`` (``NAME=value`` and the terminating NUL of each)."""
    return sum(len(k.encode()) + len(v.encode()) + 2 for k, v in env.items())


# ----------------------------------------------------------------------------- what a submission resolved to


@dataclass(frozen=True)
class Placement:
    """Where a job runs: the shape, the node group, the mounts; resolved once per submission from the API.

    :param shape: the resource shape id.
    :param gpus_per_node: accelerators of the shape.
    :param node_group_id: the dedicated node group's id, or None for shared resources.
    :param mounts: Lepton mount objects (``{"path", "from", "mount_path"}``).
    :param volume_mount: the container path of the shared volume (auto-detected or the first explicit one).
    :param volume_kind: ``lustre``, ``filestore``, ...
    :param stage_shape: the shape staging jobs use (the node group's smallest CPU shape, else the job's).
    :param memory_mb: the shape's memory, when listed.
    """

    shape: str
    gpus_per_node: int
    node_group_id: str | None = None
    node_group_name: str | None = None
    mounts: tuple[dict[str, Any], ...] = ()
    volume_mount: str | None = None
    volume_kind: str | None = None
    stage_shape: str | None = None
    memory_mb: int | None = None

    @property
    def results_root(self) -> str | None:
        return f"{self.volume_mount}/results" if self.volume_mount else None

    @property
    def cache_path(self) -> str | None:
        return self.volume_mount if self.volume_kind == "lustre" else None


@dataclass(frozen=True)
class FilesChannel:
    """How the job's files reach it: ``env`` (secret-held variables) or ``volume`` (staged parts), or nothing."""

    route: str
    env: dict[str, str] = field(default_factory=dict, repr=False)
    stage_parts: tuple[bytes, ...] = field(default=(), repr=False)
    parts_dir: str | None = None
    packed_size: int = 0


class LeptonHook(TAOPlatformHook):
    """Runs jobs on DGX Cloud Lepton through the ``leptonai`` client.

    Connection type ``tao_lepton``: password = the Lepton API token (``LEPTON_AUTH_TOKEN``, else the client's own
    ``LEPTON_WORKSPACE_TOKEN``). Extras: ``workspace_id`` (``LEPTON_WORKSPACE_ID``), ``workspace_url``
    (``LEPTON_WORKSPACE_URL``; default the DGX Cloud gateway of the workspace), ``node_group`` (default dedicated node
    group, name or id), ``resource_shape`` (default shape), ``image_pull_secret`` (an existing Lepton image pull
    secret), ``ngc_api_key`` (``NGC_KEY``: becomes a per-job image pull secret for ``registry``, default nvcr.io, and
    the job's ``NGC_KEY``), ``hf_token`` (``HF_TOKEN``), ``ttl_seconds_after_finished`` (default one day),
    ``capacity_timeout_seconds`` (900), ``start_timeout_seconds`` (600), ``staging_timeout_seconds`` (600).

    ``backend_details`` of a job: ``resource_shape``, ``dedicated_node_group``, ``mounts`` (a list of
    ``{"volume", "path", "mount_path"}``, checked against the volume's storage permissions; they replace the
    auto-detected mount), ``auto_mount`` (default true), ``shared_memory_size`` (MiB), ``capacity_timeout_seconds``,
    ``start_timeout_seconds``, ``ttl_seconds_after_finished``, ``priority_class``, ``can_be_preempted``.

    :param conn_id: the ``tao_lepton`` connection, or None for the environment's ``LEPTON_*`` variables.
    """

    platform = "lepton"
    conn_type = "tao_lepton"
    default_conn_name = "tao_lepton_default"
    hook_name = "TAO DGX Cloud Lepton"
    name_pattern = re.compile(r"^[a-z]([a-z0-9-]{0,34}[a-z0-9])?$")
    name_rule = "lower-case letters, digits and '-', starting with a letter, at most 36 characters (Lepton's rule)"
    name_max_length = 36
    name_letter_first = True
    supports_multi_node = True
    marks_storage = (
        "labels of the Lepton job (PATCH, read back); where the workspace does not let labels change, user secrets "
        "named tao.<job_id>.mark.<key>.<try>"
    )
    env_fallbacks = {
        "workspace_id": "LEPTON_WORKSPACE_ID",
        "password": "LEPTON_AUTH_TOKEN",
        "workspace_url": "LEPTON_WORKSPACE_URL",
        "ngc_api_key": "NGC_KEY",
        "hf_token": "HF_TOKEN",
    }

    def __init__(self, conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(conn_id, **kwargs)
        self._local = threading.local()
        self._clients: list[Any] = []
        self._generation = 0
        self._stale = False
        self._placements: dict[str, Placement] = {}
        self._channels: dict[str, FilesChannel] = {}
        self._last_placement: Placement | None = None
        self._readiness: dict[str, tuple[float, Readiness | None]] = {}
        self._starting_since: dict[str, float] = {}
        self._queued: set[str] = set()
        self._ended: set[str] = set()
        self._log_replica: dict[str, str] = {}

    # ----------------------------------------------------------------- settings and the client

    @property
    def workspace_id(self) -> str:
        self.load_connection()
        workspace = self.setting("workspace_id")
        if not workspace:
            raise JobValidationError(
                "conn_id",
                f"connection {self.conn_id!r} names no Lepton workspace",
                "Set the extra workspace_id (or LEPTON_WORKSPACE_ID)",
            )
        return str(workspace)

    def _token(self) -> str:
        token = self.setting("password") or os.environ.get("LEPTON_WORKSPACE_TOKEN")
        if not token:
            raise JobValidationError(
                "conn_id",
                f"connection {self.conn_id!r} has no Lepton API token",
                "Put the token into the connection's password (or LEPTON_AUTH_TOKEN)",
            )
        return str(token)

    def _number(self, details: dict[str, Any], key: str, default: float) -> float:
        self.load_connection()
        value = details.get(key)
        return float(value if value is not None else self.setting(key, default))

    def _client(self) -> Any:
        """This thread's ``APIClient`` (``requests`` sessions are not shared between threads)."""
        client = getattr(self._local, "client", None)
        if client is None or self._local.generation != self._generation:
            from leptonai.api.v2.client import APIClient

            self.load_connection()
            client = APIClient(
                workspace_id=self.workspace_id, auth_token=self._token(), url=self.setting("workspace_url")
            )
            client._timeout = REQUEST_TIMEOUT  # the client's own default is 120 s
            self._local.client, self._local.generation = client, self._generation
            self._clients.append(client)
        return client

    def _api(self, what: str, call: Callable[[Any], T]) -> T:
        """One API call; a refused token (401/403) is ``ERR_AUTH`` in words naming the setting to fix."""
        try:
            return call(self._client())
        except Exception as exc:
            status = status_of(exc)
            if status in (401, 403):
                self._stale = True  # the connection may be fixed meanwhile: read it again next time
                raise self._auth_error(what, status) from exc
            raise

    def _auth_error(self, what: str, status: int) -> JobValidationError:
        where = f"workspace {self.setting('workspace_id')!r}"
        if status == 401:
            return JobValidationError(
                f"connection {self.conn_id!r} password",
                f"ERR_AUTH: the Lepton API refused the token while {what} (HTTP 401 Unauthorized, {where})",
                "Put a valid API token of this workspace into the connection's password (or LEPTON_AUTH_TOKEN); "
                "tokens are issued in the Lepton dashboard",
            )
        return JobValidationError(
            f"connection {self.conn_id!r} password",
            f"ERR_AUTH: the token may not do this while {what} (HTTP 403 Forbidden, {where})",
            "Use a token of a workspace member allowed to run jobs, or fix workspace_id / workspace_url",
        )

    def _ready(self) -> None:
        self.load_connection()

    async def _aready(self) -> None:
        """Triggerer side: the connection is read asynchronously (never from a thread), and read again after its
        token was refused -- it may have been fixed meanwhile -- without stopping the watch."""
        await self.aload_connection()
        if self._stale and self.conn_id is not None:
            conn = await self.aget_connection(self.conn_id)
            self._set_connection(conn, await conn.aextra_dejson())  # swapped whole: threads never see it half-read
            self._stale, self._generation = False, self._generation + 1

    async def aclose(self) -> None:
        clients, self._clients = self._clients, []
        for client in clients:
            with contextlib.suppress(Exception):
                client._session.close()
        self._generation += 1

    def _raw(self, what: str, method: str, path: str, **kwargs: Any) -> Any:
        """A request through the client's own transport (session, auth and origin headers, error classes) for
        routes its typed API lacks or whose models drop fields; the answer as JSON (None when empty)."""

        def call(client: Any) -> Any:
            response = getattr(client.job, f"_{method}")(path, **kwargs)
            client.job._raise_if_not_ok(response)
            return response.json() if response.content else None

        return self._api(what, call)

    def test_connection(self) -> tuple[bool, str]:
        """The UI's "Test" button: one job list of one item in the workspace."""
        try:
            url = self._url()
            self._raw(
                "listing jobs", "get", "/jobs", params={"job_query_mode": "alive_only", "page": 1, "page_size": 1}
            )
        except JobValidationError as exc:
            return False, str(exc)
        except Exception as exc:
            if status_of(exc) == 404:
                return False, f"workspace {self.setting('workspace_id')!r} was not found at {url}"
            return False, f"cannot use the Lepton API at {url}: {exc}"
        return True, f"Lepton workspace {self.workspace_id} answers and its jobs can be listed"

    # ----------------------------------------------------------------- the seed's discovery calls

    def list_resource_shapes(self, node_group: str | None = None) -> dict[str, dict[str, Any]]:
        """``{shape id: {"gpu_count", "gpu_type", "cpu", "memory_mb", "node_group_id", "name"}}`` of the workspace
        (of one node group, by name or id), as the TAO SDK's ``list_resource_shapes``."""
        group = self._node_group(node_group)
        return {s["id"]: s for s in self._shapes(group[0] if group else None)}

    def get_volumes(self, node_group_id: str | None = None) -> list[dict[str, Any]]:
        """``[{"name", "from_path", "type", "from", "default_mount_path"}]`` of a node group (the connection's by
        default), as the TAO SDK's ``get_volumes``."""
        group = self._node_group(node_group_id or self.setting("node_group"))
        if group is None:
            raise JobValidationError(
                "node_group_id", "no node group given", "Name one, or set node_group on the connection"
            )
        return group[1]

    def get_storage_permissions(self, volume_name: str, node_group_id: str) -> list[str]:
        """The path prefixes of ``volume_name`` this workspace may mount on a node group (name or id)."""
        group = self._node_group(node_group_id)
        ng_id = group[0] if group else node_group_id

        def call(client: Any) -> list[str]:
            return [p.path_prefix for p in client.nodegroup.list_storage_permissions(ng_id, volume_name)]

        try:
            return self._api("reading storage permissions", call)
        except JobValidationError:
            raise
        except Exception as exc:
            if status_of(exc) == 404:
                return []
            raise

    def get_job_replicas(self, handle_or_id: JobHandle | str) -> list[dict[str, Any]]:
        """The job's replicas as the API returns them (``status.node``, ``status.readiness_issue``, ...)."""
        job_id = handle_or_id.backend_job_id if isinstance(handle_or_id, JobHandle) else handle_or_id
        replicas = self._raw(
            "reading replicas", "get", f"/jobs/{job_id}/replicas", params={"job_query_mode": "alive_and_archive"}
        )
        return list(replicas or [])

    def _node_group(self, name_or_id: str | None) -> tuple[str, list[dict[str, Any]], str] | None:
        """``(id, volumes, name)`` of a node group given by name or id; an unknown one lists those that exist."""
        if not name_or_id:
            return None
        groups = self._api("listing node groups", lambda c: c.nodegroup.list_all())
        for group in groups:
            if name_or_id in (group.metadata.id_, group.metadata.name):
                volumes = [
                    {
                        "name": v.name,
                        "from": v.from_.value,
                        "from_path": v.from_path,
                        "type": volume_kind({"name": v.name, "from": v.from_.value}),
                        "default_mount_path": v.default_mount_path,
                    }
                    for v in group.spec.volumes or []
                ]
                return str(group.metadata.id_), volumes, str(group.metadata.name or group.metadata.id_)
        known = ", ".join(sorted(str(g.metadata.name or g.metadata.id_) for g in groups)) or "none"
        raise JobValidationError(
            "backend_details['dedicated_node_group']",
            f"node group {name_or_id!r} is not in workspace {self.workspace_id} (node groups: {known})",
            "Use one of them, here or as the connection's node_group",
        )

    def _shapes(self, node_group_id: str | None) -> list[dict[str, Any]]:
        shapes = self._api("listing resource shapes", lambda c: c.shapes.list_shapes(node_group_id, "job"))
        return [
            {
                "id": str(s.metadata.id_ or s.spec.name),
                "name": s.spec.name,
                "gpus": int(s.spec.accelerator_num or 0),
                "gpu_type": s.spec.accelerator_type,
                "cpu": float(s.spec.cpu or 0),
                "memory_mb": int(s.spec.memory_in_mb or 0),
                "node_group_id": s.spec.node_group_id,
            }
            for s in shapes
            if s.spec.listable_in is None or "job" in s.spec.listable_in
        ]

    # ----------------------------------------------------------------- validation and placement (before submission)

    def image_required(self, spec: JobSpec) -> str | None:
        return "is required on the lepton platform: every job is a container"

    def validate_spec(self, spec: JobSpec) -> None:
        """Everything is checked before anything is created: the details, the placement (shape, node group, mounts,
        storage permissions: API reads), and that the job's files and environment fit."""
        super().validate_spec(spec)
        details = self.platform_details(spec)
        if unknown := sorted(set(details) - DETAIL_KEYS):
            raise JobValidationError(
                f"backend_details[{unknown[0]!r}]",
                "is not a lepton platform setting",
                f"Use one of: {', '.join(sorted(DETAIL_KEYS))}",
            )
        for key in ("capacity_timeout_seconds", "start_timeout_seconds", "ttl_seconds_after_finished"):
            if key in details and not (isinstance(details[key], int | float) and details[key] > 0):
                raise JobValidationError(
                    f"backend_details[{key!r}]", f"{details[key]!r} is not a positive number", "Give seconds, e.g. 900"
                )
        if "shared_memory_size" in details and not (
            isinstance(details["shared_memory_size"], int) and details["shared_memory_size"] > 0
        ):
            raise JobValidationError(
                "backend_details['shared_memory_size']", "is not a positive integer", "Give MiB, e.g. 16384"
            )
        if spec.results_uri and not spec.results_uri.startswith("s3://"):
            placement = self.placement(spec)
            if not any(spec.results_uri.startswith(m["mount_path"]) for m in placement.mounts):
                raise JobValidationError(
                    "results_uri",
                    f"{spec.results_uri!r} is neither s3:// nor on a volume mounted into the job",
                    "Use s3:// with storage_conn_id, or a path under one of the job's mounts",
                )
        self._channel(spec)

    def placement(self, spec: JobSpec) -> Placement:
        """Shape, node group and mounts of ``spec``'s job (API reads, once per submission)."""
        cached = self._placements.get(spec.job_id)
        if cached is None:
            cached = self._placements[spec.job_id] = self._resolve_placement(spec)
        self._last_placement = cached
        return cached

    def _resolve_placement(self, spec: JobSpec) -> Placement:
        self._ready()
        details = self.platform_details(spec)
        group = self._node_group(details.get("dedicated_node_group") or self.setting("node_group"))
        ng_id, volumes, ng_name = group if group else (None, [], None)
        shapes = self._shapes(ng_id)
        wanted = details.get("resource_shape") or self.setting("resource_shape")
        listed = ", ".join(f"{s['id']} ({s['gpus']} GPU)" for s in shapes) or "none"
        where = f"node group {ng_name}" if ng_name else f"workspace {self.workspace_id}"
        if wanted:
            shape = next((s for s in shapes if wanted in (s["id"], s["name"])), None)
            if shape is None:
                raise JobValidationError(
                    "backend_details['resource_shape']",
                    f"{wanted!r} is not a resource shape of {where} (shapes: {listed})",
                    "Use one of them, or leave resource_shape unset to choose one from gpu_count",
                )
        else:
            shape = pick_shape(shapes, spec.gpu_count)
            if shape is None:
                asked = "no GPU" if spec.gpu_count == 0 else f"{spec.gpu_count} GPU(s) per node"
                raise JobValidationError(
                    "gpu_count",
                    f"no resource shape of {where} has {asked} (shapes: {listed})",
                    "Ask for a GPU count one of them has, or name a resource_shape",
                )
            if spec.gpu_count > 0 and shape["gpus"] != spec.gpu_count:
                self.log.warning(
                    "No shape of %s has exactly %d GPUs: using %s (%d GPUs)", where, spec.gpu_count, shape["id"],
                    shape["gpus"],
                )  # fmt: skip
        cpu = pick_shape([s for s in shapes if not s["gpus"]], 0)
        mounts, volume_mount, kind = self._mounts(details, ng_id, ng_name, volumes)
        return Placement(
            shape=shape["id"],
            gpus_per_node=shape["gpus"],
            node_group_id=ng_id,
            node_group_name=ng_name,
            mounts=tuple(mounts),
            volume_mount=volume_mount,
            volume_kind=kind,
            stage_shape=cpu["id"] if cpu else shape["id"],
            memory_mb=shape["memory_mb"] or None,
        )

    def _mounts(
        self, details: dict[str, Any], ng_id: str | None, ng_name: str | None, volumes: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], str | None, str | None]:
        """The job's mounts, the shared volume's container path and kind: explicit mounts (each checked against
        the volume's storage permissions) or the auto-detected volume at the prefix the permissions grant."""
        from leptonai.api.v2.job_validation import validate_mount_path

        explicit = details.get("mounts")
        by_name = {v["name"]: v for v in volumes}
        if explicit:
            if not isinstance(explicit, list) or not all(isinstance(m, dict) for m in explicit):
                raise JobValidationError(
                    "backend_details['mounts']",
                    "is not a list of mappings",
                    'Use [{"volume": "lustre-fs", "path": "/lustre/ws1/data", "mount_path": "/data"}]',
                )
            mounts = []
            for index, mount in enumerate(explicit):
                where = f"backend_details['mounts'][{index}]"
                name = str(mount.get("volume") or str(mount.get("from", "")).partition(":")[2])
                if name not in by_name:
                    raise JobValidationError(
                        where,
                        f"volume {name!r} is not a volume of node group {ng_name} (volumes: "
                        f"{', '.join(sorted(by_name)) or 'none'})",
                        "Name one of them, or set dedicated_node_group to the node group that has it",
                    )
                path, target = str(mount.get("path") or ""), str(mount.get("mount_path") or "")
                try:
                    validate_mount_path(target)
                except ValueError as exc:
                    raise JobValidationError(where, str(exc), "Mount it somewhere else, e.g. /data") from exc
                if not target.startswith("/"):
                    raise JobValidationError(where, f"mount_path {target!r} is not absolute", "Use e.g. /data")
                allowed = self.get_storage_permissions(name, str(ng_id))
                if not any(path == p or path.startswith(p.rstrip("/") + "/") for p in allowed):
                    raise JobValidationError(
                        where,
                        f"path {path!r} of volume {name} is not under a prefix this workspace may mount "
                        f"({', '.join(allowed) or 'none'})",
                        "Use a path under one of them, or ask the workspace admin for a storage permission",
                    )
                mounts.append({"path": path, "from": _mount_source(by_name[name]), "mount_path": target})
            first = by_name[str(explicit[0].get("volume") or str(explicit[0].get("from", "")).partition(":")[2])]
            return mounts, mounts[0]["mount_path"], volume_kind(first)
        if not volumes or details.get("auto_mount", True) is False:
            return [], None, None
        volume = pick_volume(volumes)
        assert volume is not None
        allowed = self.get_storage_permissions(volume["name"], str(ng_id))
        if not allowed:
            self.log.info("Volume %s of node group %s: no storage permission, not mounted", volume["name"], ng_name)
            return [], None, None
        target = str(volume.get("default_mount_path") or f"/mnt/{volume['name']}")
        return [{"path": allowed[0], "from": _mount_source(volume), "mount_path": target}], target, volume["type"]

    def runner_mount_path(self, spec: JobSpec) -> str | None:
        return self.placement(spec).cache_path

    def results_dir_for(self, spec: JobSpec) -> str:
        """An explicit ``results_uri``, else ``results/`` on the job's shared volume, else the base rule."""
        if not spec.results_uri and (root := self.placement(spec).results_root):
            return f"{root}/{spec.job_id}"
        return super().results_dir_for(spec)

    def check_path(self, uri: str) -> bool:
        """A local input must be on a volume mounted into the job (the job itself checks that the file exists); the
        Airflow hosts cannot see it."""
        mounts = self._last_placement.mounts if self._last_placement else ()
        path = uri.removeprefix("file://")
        if any(path == m["mount_path"] or path.startswith(m["mount_path"].rstrip("/") + "/") for m in mounts):
            self.log.info("%s is on a volume mounted into the job: the job checks it", uri)
            return True
        raise JobValidationError(
            "inputs",
            f"{uri} is not on a volume mounted into the Lepton job "
            f"(mounts: {', '.join(m['mount_path'] for m in mounts) or 'none'})",
            "Use s3:// with storage_conn_id, or a path under one of the mounts",
        )

    def list_path(self, uri: str) -> list[str]:
        raise JobValidationError("uri", f"{uri} is inside the Lepton workspace", "Read results from s3:// instead")

    def _hook_secrets(self) -> dict[str, str]:
        """The connection's keys the job receives as secrets (``NGC_KEY``, ``HF_TOKEN``)."""
        self.load_connection()
        found = {"NGC_KEY": self.setting("ngc_api_key"), "HF_TOKEN": self.setting("hf_token")}
        return {k: str(v) for k, v in found.items() if v}

    def _channel(self, spec: JobSpec) -> FilesChannel:
        """How the job's files reach it, and that everything fits into the environment Linux gives a process."""
        cached = self._channels.get(spec.job_id)
        if cached is not None:
            return cached
        placement = self.placement(spec)
        secrets = {**spec.secret_env, **self._hook_secrets()}
        for key, value in {**spec.env, **secrets}.items():
            if len(key) + len(value.encode()) + 2 > ENV_PART_SIZE + 4096:
                raise JobValidationError(
                    f"env[{key!r}]",
                    f"is {len(value.encode())} bytes; Linux refuses one environment string of 128 KiB",
                    "Pass large values as a file (specs= or inputs=) instead",
                )
        channel = FilesChannel("none")
        if spec.files or spec.num_nodes > 1:
            setup = setup_script(spec.num_nodes, staged=False)
            packed = ct.pack_files(spec.files, setup)
            if b64_size(len(packed)) <= ENV_FILES_BUDGET:
                channel = FilesChannel(
                    "env", env=ct.files_in_env(spec.files, ENV_PART_SIZE, setup), packed_size=len(packed)
                )
            else:
                channel = self._staged(spec, placement, len(packed))
        total = env_bytes({**spec.env, **secrets, **channel.env}) + 16 * 1024  # ours + Lepton's own variables
        if total > ENV_TOTAL_BUDGET:
            raise JobValidationError(
                "env",
                f"the job's environment would be {total // 1024} KiB; Linux starts no process with more than 2 MiB "
                "of arguments and environment",
                "Pass large values as files (specs= or inputs=) instead of env",
            )
        self._channels[spec.job_id] = channel
        return channel

    def _staged(self, spec: JobSpec, placement: Placement, packed: int) -> FilesChannel:
        """The volume route for files too large for the environment: parts staged by short jobs onto the node
        group's shared volume, unpacked by the launcher from there."""
        setup = setup_script(spec.num_nodes, staged=True)
        part_size = ENV_FILES_BUDGET * 3 // 4 - 4096  # a part, gzip'd once more and in base64, within one budget
        parts = tuple(ct.files_in_parts(spec.files, part_size, setup))
        size = f"{packed / 2**20:.1f} MiB packed"
        if placement.volume_mount is None:
            raise JobValidationError(
                "specs",
                f"the job's files (the runner and the rendered spec) are {size}: more than the "
                f"{ENV_FILES_BUDGET // 2**20} MiB a Lepton job's environment carries, and "
                f"{'node group ' + placement.node_group_name if placement.node_group_name else 'the job'} mounts no "
                "shared volume to stage them through",
                "Keep large data out of the spec (give it as an input file, inputs=...), or run on a node group with "
                "a Lustre or filestore volume (dedicated_node_group)",
            )
        if len(parts) > MAX_STAGING_JOBS:
            raise JobValidationError(
                "specs",
                f"the job's files are {size}; at most {MAX_STAGING_JOBS * part_size / 2**20:.0f} MiB are staged",
                "Keep large data out of the spec: give it as an input file (inputs=...)",
            )
        parts_dir = f"{placement.volume_mount}/{STAGING_DIR}/{spec.job_id}"
        return FilesChannel(
            "volume", env={ct.PARTS_DIR_ENV: parts_dir}, stage_parts=parts, parts_dir=parts_dir, packed_size=packed
        )

    # ----------------------------------------------------------------- submit

    def create_job(self, spec: JobSpec, try_number: int = 1) -> JobHandle:
        """Create the job's secrets (and stage large files), then the job. An ended job of the same name (an
        earlier try's) is deleted first; one still active is returned as it is (never a second job)."""
        self.validate_spec(spec)
        placement, channel = self.placement(spec), self._channel(spec)
        handle = self.new_handle(spec, try_number)
        for job in self._jobs_named(spec.name):
            if str(job.get("status", {}).get("state")) not in FINISHED_STATES:
                self.log.info("Lepton job %s already runs for this task instance: watching it", spec.name)
                return self._handle_of(job)
            self.log.info("Deleting the ended Lepton job %s of an earlier try before submitting", _id(job))
            self._delete_job(_id(job), _labels(job).get(LABEL_JOB_ID))
        if _LABELS_PATCHABLE.get(self._url()) is False:
            self._sweep_orphan_marks()
        secrets = {**spec.secret_env, **self._hook_secrets()}
        register_secrets(list(secrets.values()))
        created: list[str] = []
        pull = pull_secret_name(spec.job_id) if self.setting("ngc_api_key") else None
        try:
            if channel.route == "volume":
                self._stage(spec, placement, channel)
            env_secrets = {f"{secret_prefix(spec.job_id)}env.{k}": v for k, v in secrets.items()}
            files_secrets = {
                f"{secret_prefix(spec.job_id)}files.{k}": v
                for k, v in channel.env.items()
                if k.startswith(ct.PARTS_ENV_PREFIX)
            }
            if env_secrets or files_secrets:
                self._create_secrets({**env_secrets, **files_secrets})
                created += list(env_secrets) + list(files_secrets)
            if pull:
                self._create_pull_secret(pull)
            body = self._job_body(spec, handle, placement=placement, channel=channel, secrets=secrets, pull=pull)
            backend_id = self._post_job(body, spec)
        except BaseException:
            self._delete_secrets(spec.job_id, created, pull_secret=pull is not None)
            raise
        return replace(handle, backend_job_id=backend_id, console_url=self._console_url(backend_id))

    def _post_job(self, body: Any, spec: JobSpec) -> str:
        """POST the job; its id as the server gave it. An answer lost to a 5xx or a timeout may hide a job that was
        created: it is looked for by name before the submission is reported as failed."""
        name = spec.name
        for _ in range(30):
            try:
                return str(self._api("creating the job", lambda c: c.job.create(body)).metadata.id_)
            except JobValidationError:
                raise
            except ValueError as exc:  # the client's own validation
                raise JobValidationError("job_name", str(exc), "Fix the name or the environment") from exc
            except Exception as exc:
                status = status_of(exc)
                if status == 409:  # the old job of this name is still being deleted
                    time.sleep(2)
                    continue
                if status is not None and status < 500:
                    kind = ErrClass.ERR_CONFIG if status in (400, 404, 422) else ErrClass.ERR_INFRA
                    raise JobSubmitError(kind, f"Lepton refused job {name}: {exc}") from exc
                found = [j for j in self._jobs_named(name) if _labels(j).get(LABEL_JOB_ID) == spec.job_id]
                if found:
                    return _id(found[0])
                raise JobSubmitError(ErrClass.ERR_INFRA, f"Lepton did not create job {name}: {exc}") from exc
        raise JobSubmitError(ErrClass.ERR_INFRA, f"Lepton job {name} could not be created: its old job did not go away")

    def _create_secrets(self, values: dict[str, str]) -> None:
        from leptonai.api.v2.types.secret import SecretItem

        items = [SecretItem(name=k, value=v) for k, v in values.items()]
        self._api("creating the job's secrets", lambda c: c.secret.create(items))

    def _create_pull_secret(self, name: str) -> None:
        """A per-job image pull secret for ``registry`` from the connection's NGC key (the API the TAO SDK uses)."""
        registry = str(self.setting("registry", DEFAULT_REGISTRY))
        body = {
            "metadata": {"name": name},
            "spec": {
                "registry_server": registry,
                "username": "$oauthtoken",
                "password": str(self.setting("ngc_api_key")),
                "email": "",
            },
        }
        self._raw("creating the image pull secret", "post", "/imagepullsecrets", json=body)

    def _job_body(
        self,
        spec: JobSpec,
        handle: JobHandle,
        *,
        placement: Placement,
        channel: FilesChannel,
        secrets: dict[str, str],
        pull: str | None,
    ) -> Any:
        from leptonai.api.v2.types.affinity import LeptonResourceAffinity
        from leptonai.api.v2.types.common import LeptonVisibility, Metadata
        from leptonai.api.v2.types.deployment import EnvValue, EnvVar, LeptonContainer, LeptonLog, Mount, QueueConfig
        from leptonai.api.v2.types.job import LeptonJob, LeptonJobUserSpec

        assert spec.image is not None, "image_required() makes the operator demand one"
        details = self.platform_details(spec)
        env = self.tao_env(spec, files_dir=ct.FILES_DIR, results_root=placement.results_root)
        env[RESULTS_DIR_ENV] = handle.results_dir
        if spec.num_nodes > 1:
            gpus = spec.gpu_count if spec.gpu_count > 0 else placement.gpus_per_node
            env.update(multi_node_env(spec.num_nodes, gpus))
        envs = [EnvVar(name=k, value=v) for k, v in env.items()]
        envs += [EnvVar(name=k, value=v) for k, v in channel.env.items() if not k.startswith(ct.PARTS_ENV_PREFIX)]
        refs = {k: f"{secret_prefix(spec.job_id)}env.{k}" for k in secrets}
        refs |= {k: f"{secret_prefix(spec.job_id)}files.{k}" for k in channel.env if k.startswith(ct.PARTS_ENV_PREFIX)}
        envs += [EnvVar(name=k, value_from=EnvValue(secret_name_ref=ref)) for k, ref in refs.items()]
        labels = {
            LABEL_MANAGED: "true",
            LABEL_JOB_ID: spec.job_id,
            LABEL_NAME: spec.name,
            LABEL_TRY: str(handle.try_number),
            MARK_LABELS[MARK_OWNER]: str(handle.try_number),
            LABEL_CAPACITY: str(int(self._number(details, "capacity_timeout_seconds", DEFAULT_CAPACITY_TIMEOUT))),
            LABEL_START: str(int(self._number(details, "start_timeout_seconds", DEFAULT_START_TIMEOUT))),
        }
        labels |= {ORIGIN_LABELS[k]: ct.label_value(v) for k, v in spec.origin.items() if k in ORIGIN_LABELS}
        shm = details.get("shared_memory_size") or self.setting("shared_memory_size")
        if shm is None and placement.memory_mb:
            shm = min(16 * 1024, placement.memory_mb // 2)  # PyTorch data loaders die on Docker's 64 MiB default
        pulls = [str(s) for s in (self.setting("image_pull_secret"), pull) if s]
        queue = None
        if details.get("priority_class") or "can_be_preempted" in details:
            queue = QueueConfig(
                priority_class=details.get("priority_class"), can_be_preempted=details.get("can_be_preempted")
            )
        return LeptonJob(
            metadata=Metadata(id=spec.name, name=spec.name, labels=labels, visibility=LeptonVisibility.PRIVATE),
            spec=LeptonJobUserSpec(
                resource_shape=placement.shape,
                affinity=LeptonResourceAffinity(allowed_dedicated_node_groups=[placement.node_group_id])
                if placement.node_group_id
                else None,
                container=LeptonContainer(image=spec.image, command=ct.launcher_argv(spec.command)),
                shared_memory_size=int(shm) if shm else None,
                completions=spec.num_nodes,
                parallelism=spec.num_nodes,
                # Airflow owns retries: a replica restarted by Lepton would leave its peers' rendezvous behind.
                max_failure_retry=0,
                max_job_failure_retry=0,
                envs=envs,
                mounts=[Mount(**m) for m in placement.mounts],
                image_pull_secrets=pulls,
                ttl_seconds_after_finished=int(
                    self._number(details, "ttl_seconds_after_finished", DEFAULT_TTL_SECONDS)
                ),
                intra_job_communication=True if spec.num_nodes > 1 else None,
                log=LeptonLog(enable_collection=True),
                queue_config=queue,
            ),
        )

    def _stage(self, spec: JobSpec, placement: Placement, channel: FilesChannel) -> None:
        """Write the parts onto the shared volume with one short job each (their environment carries them, through
        the same launcher), wait until all have completed, then delete them."""
        from leptonai.api.v2.types.affinity import LeptonResourceAffinity
        from leptonai.api.v2.types.common import Metadata
        from leptonai.api.v2.types.deployment import EnvVar, LeptonContainer, Mount
        from leptonai.api.v2.types.job import LeptonJob, LeptonJobUserSpec

        assert spec.image is not None and channel.parts_dir is not None
        names = []
        self.log.info(
            "Staging %.1f MiB of job files onto %s with %d staging job(s)",
            channel.packed_size / 2**20,
            channel.parts_dir,
            len(channel.stage_parts),
        )
        try:
            for index, part in enumerate(channel.stage_parts):
                part_name = f"part-{index:03d}"
                env = {
                    "TAO_JOB_FILES": ct.FILES_DIR,
                    "TAO_STAGE_DIR": channel.parts_dir,
                    "TAO_STAGE_PART": part_name,
                    **ct.files_in_env({part_name: part}, ENV_PART_SIZE),
                }
                name = stage_job_name(spec.job_id, index)
                body = LeptonJob(
                    metadata=Metadata(id=name, name=name, labels={LABEL_STAGE_OF: spec.job_id}),
                    spec=LeptonJobUserSpec(
                        resource_shape=placement.stage_shape,
                        affinity=LeptonResourceAffinity(allowed_dedicated_node_groups=[placement.node_group_id])
                        if placement.node_group_id
                        else None,
                        container=LeptonContainer(image=spec.image, command=ct.launcher_argv(_STAGE_ARGV)),
                        envs=[EnvVar(name=k, value=v) for k, v in env.items()],
                        mounts=[Mount(**m) for m in placement.mounts],
                        max_failure_retry=0,
                        ttl_seconds_after_finished=STAGING_TTL_SECONDS,
                    ),
                )
                names.append(self._create_stage_job(body))
            self._wait_staged(spec, names)
        finally:
            for name in names:
                self._delete_job(name, None)

    def _create_stage_job(self, body: Any) -> str:
        return str(self._api("creating a staging job", lambda c: c.job.create(body)).metadata.id_)

    def _wait_staged(self, spec: JobSpec, names: list[str]) -> None:
        timeout = float(self.setting("staging_timeout_seconds", DEFAULT_STAGING_TIMEOUT))
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            jobs = self._list_jobs(f"{LABEL_STAGE_OF}={spec.job_id}")
            states = {_id(j): str((j.get("status") or {}).get("state")) for j in jobs}
            if failed := [n for n in names if states.get(n) in ("Failed", "Archived", "Deleted", "Stopped")]:
                raise JobSubmitError(
                    ErrClass.ERR_INFRA,
                    f"staging job {failed[0]} could not write the job's files onto the shared volume "
                    f"({states[failed[0]]}); its log is in the Lepton console",
                )
            if all(states.get(n) == "Completed" for n in names):
                return
            time.sleep(1.0)
        raise JobSubmitError(
            ErrClass.ERR_CAPACITY,
            f"staging the job's files took more than {timeout:.0f} s (staging jobs: {states}); the node group may "
            "have no capacity",
        )

    # ----------------------------------------------------------------- find, status

    def _url(self) -> str:
        return str(self._client().url)

    def _console_url(self, backend_id: str) -> str:
        base = self._client().get_dashboard_base_url()
        return f"{base}/compute/jobs/detail/{backend_id}/replicas/list" if base else ""

    def _list_jobs(self, selector: str, mode: str = "alive_only") -> list[dict[str, Any]]:
        """Every job matching a label selector, as JSON: one request per page of 500 (a short page is the last;
        the client's ``list_all`` would always ask for one more, empty, page)."""
        jobs: list[dict[str, Any]] = []
        page = 1
        while True:
            params = {"job_query_mode": mode, "query": selector, "page": page, "page_size": PAGE_SIZE}
            data = self._raw("listing jobs", "get", "/jobs", params=params)
            items = list((data.get("jobs") if isinstance(data, dict) else data) or [])
            jobs.extend(items)
            if len(items) < PAGE_SIZE:
                return jobs
            page += 1

    def _get_job(self, backend_id: str) -> dict[str, Any] | None:
        try:
            job = self._raw(
                "reading a job", "get", f"/jobs/{backend_id}", params={"job_query_mode": "alive_and_archive"}
            )
        except JobValidationError:
            raise
        except Exception as exc:
            if status_of(exc) == 404:
                return None
            raise
        return dict(job) if isinstance(job, dict) else None

    def _jobs_named(self, name: str) -> list[dict[str, Any]]:
        """This task instance's jobs (alive), newest first."""
        jobs = [
            j
            for j in self._list_jobs(f"{LABEL_MANAGED}=true,{LABEL_NAME}={name}")
            if _labels(j).get(LABEL_NAME) == name and _labels(j).get(LABEL_JOB_ID)
        ]
        return sorted(jobs, key=lambda j: _created(j) or 0, reverse=True)

    def _handle_of(self, job: dict[str, Any]) -> JobHandle:
        labels = _labels(job)
        env = {e.get("name"): e.get("value") for e in (job.get("spec") or {}).get("envs") or []}
        return JobHandle(
            platform=self.platform,
            conn_id=self.conn_id,
            job_id=labels[LABEL_JOB_ID],
            name=labels[LABEL_NAME],
            backend_job_id=_id(job),
            results_dir=str(env.get(RESULTS_DIR_ENV) or ""),
            try_number=int(labels.get(LABEL_TRY) or 1),
            submitted_at=_created(job) or time.time(),
            console_url=self._console_url(_id(job)),
        )

    def find_job(self, name: str) -> JobHandle | None:
        """This task instance's newest job (found by its name label, whatever id the server gave it). The secrets
        of its jobs that have ended are removed on the way (a try that died before its cleanup left them)."""
        self._ready()
        jobs = self._jobs_named(name)
        ended = [_labels(j)[LABEL_JOB_ID] for j in jobs if str((j.get("status") or {}).get("state")) in FINISHED_STATES]
        if ended:
            existing = self._secret_names()
            for job_id in ended:
                self._delete_secrets(job_id, [n for n in existing if n.startswith(secret_prefix(job_id))])
        return self._handle_of(jobs[0]) if jobs else None

    def get_job_status(self, handle: JobHandle) -> JobStatus:
        """One job's status; a platform that does not answer is Unknown (an outage), never an error."""
        self._ready()
        try:
            return self.get_job_statuses([handle])[handle.job_id]
        except JobValidationError:
            raise
        except Exception as exc:
            return JobStatus.unknown(f"the Lepton API did not answer: {exc}")

    def get_job_statuses(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        """ONE job list (pages of 500) for every handle; jobs missing from it (deleted, archived) are looked up one
        by one, and starting jobs' replicas are asked for their readiness (every 2 s at first, backing off to 30 s)."""
        narrow = f",{LABEL_JOB_ID}={handles[0].job_id}" if len(handles) == 1 else ""
        jobs = {_labels(j).get(LABEL_JOB_ID): j for j in self._list_jobs(f"{LABEL_MANAGED}=true{narrow}")}
        statuses: dict[str, JobStatus] = {}
        now = time.time()
        lookups = 0
        for handle in handles:
            job = jobs.get(handle.job_id)
            if job is None and lookups < MISSING_LOOKUPS_PER_POLL and handle.backend_job_id:
                lookups += 1
                job = self._get_job(handle.backend_job_id)
                if job is not None and _labels(job).get(LABEL_JOB_ID) not in (None, handle.job_id):
                    job = None  # the id now belongs to a newer job of the same name
            if job is None:
                statuses[handle.job_id] = JobStatus.missing(
                    f"Lepton job {handle.backend_job_id or handle.name} no longer exists: it was deleted outside "
                    "Airflow or expired after ttl_seconds_after_finished"
                )
                continue
            statuses[handle.job_id] = self._status_of(handle.job_id, job, now)
        return statuses

    def _status_of(self, job_id: str, job: dict[str, Any], now: float) -> JobStatus:
        """:func:`job_status` with what this hook remembers: since when the job starts (the moment this hook saw it
        leave the queue; its creation when it never saw it queueing -- a new hook judges no later than the one that
        watched it), and, for a job starting now, its replicas' readiness, read afresh before a verdict rests on it."""
        state = str((job.get("status") or {}).get("state") or "")
        if state in QUEUE_STATES:
            self._queued.add(job_id)
        readiness = None
        if _starting(job):
            self._starting_since.setdefault(job_id, now if job_id in self._queued else (_created(job) or now))
            readiness = self._readiness_of(job_id, _id(job), now)
        else:
            self._starting_since.pop(job_id, None)
        status = job_status(job, now, readiness, self._starting_since.get(job_id))
        if status.state is JobState.ERROR and _starting(job):
            status = job_status(
                job, now, self._readiness_of(job_id, _id(job), now, fresh=True), self._starting_since.get(job_id)
            )
        if status.state.is_terminal:
            self._ended.add(job_id)
        return status

    def _readiness_of(self, job_id: str, backend_id: str, now: float, fresh: bool = False) -> Readiness | None:
        fetched, readiness = self._readiness.get(job_id, (0.0, None))
        starting = now - self._starting_since.get(job_id, now)
        if fresh or now - fetched >= min(READINESS_EVERY, max(READINESS_FIRST, starting / 2)):
            try:
                readiness = readiness_of(self.get_job_replicas(backend_id))
            except JobValidationError:
                raise
            except Exception as exc:  # the reason is a detail; the status stands without it
                self.log.debug("Reading the replicas of %s failed: %s", backend_id, exc)
            self._readiness[job_id] = (now, readiness)
        return readiness

    async def aget_job_statuses(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        await self._aready()
        return await asyncio.to_thread(self.get_job_statuses, list(handles))

    # ----------------------------------------------------------------- logs

    def _rank0_replica(self, handle: JobHandle) -> str | None:
        """The replica whose log is the job's: index 0 (``<job id>-0-xxxxx``), else the first."""
        if replica := self._log_replica.get(handle.job_id):
            return replica
        ids = sorted(str(r.get("id") or (r.get("metadata") or {}).get("id")) for r in self.get_job_replicas(handle))
        rank0 = re.compile(rf"^{re.escape(handle.backend_job_id)}-0-[a-z0-9]+$")
        replica = next((i for i in ids if rank0.match(i)), ids[0] if ids else None)
        if replica:
            self._log_replica[handle.job_id] = replica
        return replica

    def get_job_logs(self, handle: JobHandle, cursor: str = "", tail: int | None = None) -> tuple[str, str]:
        """The log of the job's rank-0 replica through the log API, by ``<timestamp ns>#<lines at it>`` cursor: each
        read asks from the last timestamp shown and drops what was shown (no repeats, no gaps)."""
        from leptonai.api.v2.log import LogAPIError

        self._ready()
        replica = self._rank0_replica(handle)
        if replica is None:
            return "", cursor
        now = time.time_ns()
        last, _ = ct.parse_log_cursor("" if tail is not None else cursor)
        start = last or str(int((handle.submitted_at - 60) * 1e9))
        backward = tail is not None

        def call(client: Any) -> dict[str, Any]:
            return dict(
                client.log.get_log(
                    name_or_job=handle.backend_job_id,
                    replica=replica,
                    start=start,
                    end=str(now),
                    limit=tail if backward else LOG_LIMIT,
                    direction="backward" if backward else "forward",
                )
            )

        try:
            data = self._api("reading the job log", call)
        except LogAPIError as exc:
            if exc.status_code in (400, 404):
                return "", cursor
            raise
        lines = sorted(_log_lines(data))
        if tail is None and handle.job_id not in self._ended:
            settled = str(now - LOG_SETTLE_NS).zfill(19)
            lines = [line for line in lines if line[0] <= settled]
        return ct.read_after(lines, "" if tail is not None else cursor)

    async def aget_job_logs(self, handle: JobHandle, cursor: str = "", tail: int | None = None) -> tuple[str, str]:
        await self._aready()
        return await asyncio.to_thread(self.get_job_logs, handle, cursor, tail)

    # ----------------------------------------------------------------- cancel, failure analysis, cleanup

    def _delete_job(self, backend_id: str, job_id: str | None) -> None:
        """Stop (SIGTERM to the replicas), then delete; the job's secrets go with it. Idempotent."""
        for what, call in (
            ("stopping the job", lambda c: c.job.update(backend_id, spec={"spec": {"stopped": True}})),
            ("deleting the job", lambda c: c.job.delete(backend_id)),
        ):
            try:
                self._api(what, call)
            except JobValidationError:
                raise
            except Exception as exc:
                code = status_of(exc)
                # 404: gone already; a 4xx on stop: it has ended (nothing to stop), the delete still follows
                if code is None or code >= 500 or (code != 404 and what == "deleting the job" and code != 409):
                    raise
        if job_id:
            self._delete_secrets(job_id, None, pull_secret=True, marks=True)

    def _cancel(self, handle: JobHandle) -> bool:
        self._ready()
        self._delete_job(handle.backend_job_id or handle.name, handle.job_id)
        return True

    async def _acancel(self, handle: JobHandle) -> bool:
        await self._aready()
        return await asyncio.to_thread(self._cancel, handle)

    def _secret_names(self) -> list[str]:
        return [s.name for s in self._api("listing secrets", lambda c: c.secret.list_all())]

    def _delete_secrets(
        self, job_id: str, names: list[str] | None, *, pull_secret: bool = False, marks: bool = False
    ) -> None:
        """Delete a job's user secrets (``names``, else every one it has; marks only with ``marks``) and its image
        pull secret. Best effort: a failure is logged, never raised."""
        try:
            if names is None:
                names = [n for n in self._secret_names() if n.startswith(secret_prefix(job_id))]
            for name in names:
                if marks or not name.startswith(f"{secret_prefix(job_id)}mark."):
                    self._delete_secret(name)
            if pull_secret and self.setting("ngc_api_key"):
                path = f"/imagepullsecrets/{pull_secret_name(job_id)}"
                self._delete_quietly(
                    "deleting the image pull secret", lambda c: c.job._raise_if_not_ok(c.job._delete(path))
                )
        except Exception as exc:
            self.log.warning("Deleting the secrets of job %s failed: %s", job_id, exc)

    def _delete_secret(self, name: str) -> None:
        self._delete_quietly(f"deleting secret {name}", lambda c: c.secret.delete(name))

    def _delete_quietly(self, what: str, call: Callable[[Any], Any]) -> None:
        try:
            self._api(what, call)
        except JobValidationError:
            raise
        except Exception as exc:
            if status_of(exc) != 404:
                raise

    def failure_facts(self, handle: JobHandle) -> FailureFacts:
        """The job's status, its replicas (readiness, terminations), its events and the server's failure analysis
        (where the workspace has that route), and the log tail of the replica that failed."""
        job = self._get_job(handle.backend_job_id) if handle.backend_job_id else None
        status = self._status_of(handle.job_id, job, time.time()) if job else JobStatus.missing("the job is gone")
        replicas: list[dict[str, Any]] = self._optional(lambda: self.get_job_replicas(handle), [])
        events: list[dict[str, Any]] = self._optional(
            lambda: self._raw("reading events", "get", f"/jobs/{handle.backend_job_id}/events"), []
        )
        analysis: dict[str, Any] = self._optional(
            lambda: self._raw("reading the failure analysis", "get", f"/jobs/{handle.backend_job_id}/failure-analysis"),
            {},
        )
        evidence: list[str] = []
        raw = status.raw_state
        oom = False
        exit_code = status.exit_code
        for event in (analysis or {}).get("job_failure_by_node_event") or []:
            name = str(event.get("node_event_name") or "")
            evidence.append(f"node event {name}: {event.get('message', '')}")
            oom = oom or name.upper() in ("OOM", "OOMKILLED", "OOMKILLING")
            if re.search(r"evict|preempt", name, re.IGNORECASE):
                raw = "Evicted"
        for event in events or []:
            reason, message = str(event.get("reason") or ""), str(event.get("message") or "")
            if event.get("type", "Warning") != "Normal":
                evidence.append(f"event {reason}: {message}".rstrip(": "))
            oom = oom or "oom" in reason.lower()
            if re.search(r"evict|preempt", reason, re.IGNORECASE):
                raw = "Evicted"
        terminations = list((analysis or {}).get("replica_terminations") or [])
        for replica in replicas:  # Lepton's ReplicaTermination shape, under either name
            status_of_replica = replica.get("status") or {}
            if term := status_of_replica.get("last_termination") or status_of_replica.get("termination"):
                terminations.append(term)
        for term in terminations:
            reason = str(term.get("reason") or "")
            oom = oom or reason == "OOMKilled"
            if reason == "Evicted":
                raw = "Evicted"
            if exit_code is None and term.get("exit_code") not in (None, 0):
                exit_code = int(term["exit_code"])
        if exit_code is None:
            for line in evidence:
                if match := _EXIT_CODE.search(line):
                    exit_code = int(match.group(1))
                    break
        tail: list[str] = self._optional(lambda: _lines(self.get_job_logs(handle, tail=200)), [])
        for stream in (analysis or {}).get("log_streams") or []:
            tail += [str(line) for line in stream.get("lines") or []] if isinstance(stream, dict) else [str(stream)]
        return FailureFacts(
            exit_code=exit_code,
            raw_state=raw,
            oom_killed=oom,
            log_tail=tail,
            events=evidence,
            message=status.message,
            details={
                "job": handle.backend_job_id,
                "workspace": self.setting("workspace_id"),
                "replicas": [r.get("id") for r in replicas],
                "lepton_err_class": (analysis or {}).get("err_class"),
                "lepton_suggestion": (analysis or {}).get("suggestion"),
            },
        )

    def _optional(self, read: Callable[[], T], default: T) -> T:
        """A fact that may be missing (a route this workspace lacks, a job already gone): the default then."""
        try:
            return read()
        except JobValidationError:
            raise
        except Exception as exc:
            self.log.info("A failure fact was not available: %s", exc)
            return default

    def cleanup_job(self, handle: JobHandle) -> None:
        """Once the verdict is read: a job given up on while Lepton still holds it (no capacity, replicas that never
        became ready) is stopped and deleted with all its secrets; an ended job keeps its marks (and stays until its
        TTL), its other secrets are deleted."""
        try:
            self._ready()
            job = self._get_job(handle.backend_job_id) if handle.backend_job_id else None
            if job is not None and _labels(job).get(LABEL_JOB_ID) == handle.job_id:
                state = str((job.get("status") or {}).get("state"))
                if state not in FINISHED_STATES and self._status_of(handle.job_id, job, time.time()).state.is_terminal:
                    self.log.info("Deleting Lepton job %s: it was given up on (%s)", _id(job), handle.job_id)
                    self._delete_job(_id(job), handle.job_id)
                    return
            self._delete_secrets(handle.job_id, None, pull_secret=True)
        except Exception as exc:  # best effort
            self.log.warning("Cleaning up Lepton job %s failed: %s", handle.backend_job_id, exc)

    # ----------------------------------------------------------------- marks

    def read_marks(self, handle: JobHandle) -> dict[str, Any]:
        self._ready()
        job = self._get_job(handle.backend_job_id) if handle.backend_job_id else None
        if job is None or _labels(job).get(LABEL_JOB_ID) != handle.job_id:
            return {}  # gone, or a newer job: nothing of this one was claimed
        marks: dict[str, Any] = {}
        for key, label in MARK_LABELS.items():
            if str(_labels(job).get(label, "")).isdigit():
                marks[key] = int(_labels(job)[label])
        if _LABELS_PATCHABLE.get(self._url()) is not True:
            prefix = f"{secret_prefix(handle.job_id)}mark."
            for name in self._secret_names():
                key, _, value = name.removeprefix(prefix).rpartition(".")
                if name.startswith(prefix) and key in MARK_LABELS and value.isdigit():
                    marks[key] = max(int(value), marks.get(key, 0))
        return marks

    def write_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        """Patch the job's label and read it back; where the workspace keeps labels as created, a mark secret."""
        self._ready()
        job = self._get_job(handle.backend_job_id) if handle.backend_job_id else None
        if job is None or _labels(job).get(LABEL_JOB_ID) != handle.job_id:
            self.log.info("Lepton job %s no longer exists: mark %s not kept", handle.backend_job_id, key)
            return
        url, label = self._url(), MARK_LABELS[key]
        if _LABELS_PATCHABLE.get(url) is not False:
            labels = {**_labels(job), label: str(value)}
            try:
                self._api("marking the job", lambda c: c.job.update(_id(job), spec={"metadata": {"labels": labels}}))
                after = self._get_job(_id(job))
                _LABELS_PATCHABLE[url] = after is not None and _labels(after).get(label) == str(value)
            except JobValidationError:
                raise
            except Exception as exc:
                code = status_of(exc)
                if code is None or code >= 500 or code == 404:
                    raise
                _LABELS_PATCHABLE[url] = False
            if _LABELS_PATCHABLE[url]:
                return
            self.log.info("This Lepton workspace keeps job labels as created: ownership marks are kept in secrets")
        name = f"{secret_prefix(handle.job_id)}mark.{key}.{int(value)}"
        try:
            self._create_secrets({name: str(value)})
        except JobValidationError:
            raise
        except Exception as exc:
            if status_of(exc) != 409:  # the same mark, written before
                raise

    def _sweep_orphan_marks(self) -> None:
        """Where marks are secrets, those of jobs that no longer exist (expired after their TTL, deleted outside
        Airflow) are deleted: marks live as long as their job, as labels would."""
        try:
            marks = [n for n in self._secret_names() if n.startswith("tao.") and ".mark." in n]
            if not marks:
                return
            alive = {_labels(j).get(LABEL_JOB_ID) for j in self._list_jobs(f"{LABEL_MANAGED}=true")}
            for name in marks:
                if name.split(".")[1] not in alive:
                    self._delete_secret(name)
        except JobValidationError:
            raise
        except Exception as exc:
            self.log.warning("Sweeping the marks of ended jobs failed: %s", exc)

    async def aread_marks(self, handle: JobHandle) -> dict[str, Any]:
        await self._aready()
        return await asyncio.to_thread(self.read_marks, handle)

    async def awrite_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        await self._aready()
        await asyncio.to_thread(self.write_mark, handle, key, value)


# ----------------------------------------------------------------------------- small helpers


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of a ``leptonai`` error (``ClientError`` / ``ServerError`` carry the response,
    ``LogAPIError`` its code), None for transport failures (timeouts, refused connections)."""
    code = getattr(exc, "status_code", None)
    if not isinstance(code, int):
        code = getattr(getattr(exc, "response", None), "status_code", None)
    return code if isinstance(code, int) else None


def _starting(job: dict[str, Any]) -> bool:
    """Scheduled but not all replicas ready: Starting / Restarting, or Running with fewer ready than wanted."""
    status, spec = job.get("status") or {}, job.get("spec") or {}
    state = str(status.get("state") or "")
    wanted = int(spec.get("parallelism") or spec.get("completions") or 1)
    ready, active = int(status.get("ready") or 0), int(status.get("active") or 0)
    return state in START_STATES or (state == "Running" and ready < max(active, wanted))


def _labels(job: dict[str, Any]) -> dict[str, str]:
    return dict((job.get("metadata") or {}).get("labels") or {})


def _id(job: dict[str, Any]) -> str:
    return str((job.get("metadata") or {}).get("id") or "")


def _mount_source(volume: dict[str, Any]) -> str:
    kind = str(volume.get("from") or "nfs")
    return f"node-{'nfs' if kind in ('', 'UNK') else kind}:{volume['name']}"


def _lines(log: tuple[str, str]) -> list[str]:
    return log[0].splitlines()


def _log_lines(data: dict[str, Any]) -> list[tuple[str, str]]:
    """``(timestamp ns, text)`` of every entry of a Loki ``query_range`` answer (all streams)."""
    result = (data.get("data") or {}).get("result") or []
    return [(str(ts).zfill(19), str(text).rstrip("\n")) for stream in result for ts, text in stream.get("values") or []]
