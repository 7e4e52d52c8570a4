"""GPU-hours accounting: what each attempt of a task used, from the times its backend reports.

A platform hook reports what a job used (:class:`JobUsage`, from ``TAOPlatformHook.get_job_usage``) out of its
backend's own records, never out of Airflow's clock: sacct's ``Submit`` / ``Start`` / ``End`` / ``ElapsedRaw`` and
``AllocTRES`` on SLURM, a container's ``Created`` / ``State.StartedAt`` / ``State.FinishedAt`` on Docker and Brev, the
Job's creation and its pods' container ``startedAt`` / ``finishedAt`` on Kubernetes, the job's ``creation_time`` and
its replicas' termination times on Lepton, the supervisor's timestamps on ``local``. :func:`attempt_of` turns that
into an :class:`Attempt` -- queued time, run time, GPUs x nodes, GPU-hours --, which the operator keeps with the
task (``task_state_store``), writes to the task log (:func:`describe`), returns in its XCom and sends to Airflow's
metrics (:func:`emit_metrics`), so spend can be charted by DAG with whatever StatsD / OpenTelemetry backend Airflow
is configured for.

GPU-hours = GPUs per node x nodes x run time / 3600. GPUs and nodes are what the backend allocated where it says
(sacct's ``AllocTRES``, the pods' ``nvidia.com/gpu`` limits, the Lepton shape, the container's device requests),
else what the task asked for; "all GPUs" (``gpu_count=-1``) on a backend that does not say how many is unknown
(``None``), never a guess.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from airflow_provider_tao.jobs import JobHandle, _JsonValue

#: Metric names (tags: dag_id, task_id, platform, conn_id, gpu_type, outcome). With ``[metrics] legacy_names_on``
#: each is also sent as ``<name>.<dag_id>.<task_id>`` for plain StatsD, which drops tags.
METRIC_ATTEMPTS = "tao.job.attempts"
METRIC_GPU_SECONDS = "tao.job.gpu_seconds"
METRIC_RUN_TIME = "tao.job.run_time"
METRIC_QUEUED_TIME = "tao.job.queued_time"
METRIC_FAILOVERS = "tao.job.failovers"


@dataclass(frozen=True)
class JobUsage(_JsonValue):
    """What one job used, as its backend reports it (``None`` = the backend does not say).

    :param queued_at: epoch seconds the backend accepted the job (queued from then on).
    :param started_at: epoch seconds the job's program started (the first node's, for a multi-node job).
    :param ended_at: epoch seconds it ended (the last node's).
    :param run_seconds: the backend's own elapsed run time where it keeps one (sacct ``ElapsedRaw``); else the
        run time is ``ended_at - started_at``.
    :param gpus_per_node: GPUs the backend allocated per node.
    :param nodes: nodes the job ran on.
    :param gpu_type: the GPU model (``A100``, ``H100``, ...), where the backend says.
    :param source: which backend records these come from, for the task log.
    """

    queued_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    run_seconds: float | None = None
    gpus_per_node: int | None = None
    nodes: int | None = None
    gpu_type: str | None = None
    source: str = ""


@dataclass(frozen=True)
class Attempt(_JsonValue):
    """One job a task ran (or tried to run) on one connection of its chain, and what it cost.

    :param try_number: the task try that ended the attempt.
    :param platform: the platform name. :param conn_id: the connection.
    :param job_id: ``TAO_JOB_ID`` of the job. :param backend_job_id: the platform's own id ("" if never created).
    :param outcome: ``complete``, ``error``, ``capacity`` (no capacity: failed over, or failed when last in the
        chain), ``canceled`` or ``timeout``.
    :param reason: why, in words (the failure class and its evidence, the capacity wait).
    :param gpu_type: the GPU model, if known. :param gpus_per_node: GPUs per node. :param nodes: nodes.
    :param gpus: GPUs x nodes (None when the count is unknown).
    :param queued_seconds: from acceptance by the backend until the program started (or the job ended unstarted).
    :param run_seconds: from the program's start to its end, as the backend reports it.
    :param gpu_hours: ``gpus x run_seconds / 3600`` (None when the GPU count is unknown).
    :param submitted_at: :param started_at: :param ended_at: the backend's times (epoch seconds).
    :param source: which backend records the times come from.
    """

    try_number: int
    platform: str
    conn_id: str | None
    job_id: str
    backend_job_id: str
    outcome: str
    reason: str
    gpu_type: str | None
    gpus_per_node: int | None
    nodes: int | None
    gpus: int | None
    queued_seconds: float
    run_seconds: float
    gpu_hours: float | None
    submitted_at: float | None
    started_at: float | None
    ended_at: float | None
    source: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Attempt:
        return cls(**cls._known(dict(data)))


def attempt_of(
    handle: JobHandle,
    usage: JobUsage,
    *,
    outcome: str,
    reason: str,
    try_number: int,
    requested_gpus: int,
    requested_nodes: int,
    now: float | None = None,
) -> Attempt:
    """The attempt of ``handle`` from what its backend reported (``usage``) and what the task asked for.

    :param requested_gpus: the task's ``gpu_count`` (used when the backend does not say; -1 = unknown).
    :param requested_nodes: the task's ``num_nodes`` (used when the backend does not say).
    :param now: when the attempt is being closed (the end of a job the backend has no end time for yet).
    """
    now = time.time() if now is None else now
    queued_at = usage.queued_at if usage.queued_at is not None else handle.submitted_at
    ended = usage.ended_at
    if usage.started_at is None:
        run = 0.0
    elif usage.run_seconds is not None:
        run = usage.run_seconds
    else:
        run = (ended if ended is not None else now) - usage.started_at
    queue_end = usage.started_at if usage.started_at is not None else ended if ended is not None else now
    per_node = usage.gpus_per_node if usage.gpus_per_node is not None else requested_gpus
    per_node_known = per_node if per_node is not None and per_node >= 0 else None
    nodes = usage.nodes if usage.nodes is not None else requested_nodes
    gpus = per_node_known * nodes if per_node_known is not None else None
    run = max(run, 0.0)
    return Attempt(
        try_number=try_number,
        platform=handle.platform,
        conn_id=handle.conn_id,
        job_id=handle.job_id,
        backend_job_id=handle.backend_job_id,
        outcome=outcome,
        reason=reason,
        gpu_type=usage.gpu_type,
        gpus_per_node=per_node_known,
        nodes=nodes,
        gpus=gpus,
        queued_seconds=round(max(queue_end - queued_at, 0.0), 3),
        run_seconds=round(run, 3),
        gpu_hours=round(gpus * run / 3600, 6) if gpus is not None else None,
        submitted_at=queued_at,
        started_at=usage.started_at,
        ended_at=ended,
        source=usage.source,
    )


def total_gpu_hours(attempts: list[Attempt]) -> float | None:
    """The GPU-hours of all attempts; None when one of them has an unknown GPU count."""
    hours = [a.gpu_hours for a in attempts]
    return None if any(h is None for h in hours) else round(sum(h for h in hours if h is not None), 6)


#: What a platform's own job id is, in :func:`describe`'s words.
_BACKEND_ID_WORDS = {"local": "pid", "slurm": "Slurm job", "docker": "container", "kubernetes": "Job"}


def describe(number: int, attempt: Attempt) -> str:
    """One line of the task log per attempt; grep-able for ``GPU-hours``."""
    gpus = (
        "? GPUs (gpu_count=-1: the platform does not say how many)"
        if attempt.gpus is None
        else (f"{attempt.gpus_per_node} GPU(s) x {attempt.nodes} node(s)")
    )
    kind = f" {attempt.gpu_type}" if attempt.gpu_type else ""
    hours = "unknown" if attempt.gpu_hours is None else f"{attempt.gpu_hours:.4f}"
    where = attempt.platform + (f" (connection {attempt.conn_id})" if attempt.conn_id else "")
    backend = f" ({_BACKEND_ID_WORDS.get(attempt.platform, attempt.platform + ' id')} {attempt.backend_job_id})"
    backend = backend if attempt.backend_job_id else ""
    why = f" -- {attempt.reason.rstrip('. ')}" if attempt.reason else ""
    return (
        f"Attempt {number} (try {attempt.try_number}) on {where}: job {attempt.job_id}{backend} {attempt.outcome}"
        f"{why}; queued {attempt.queued_seconds:.1f} s, ran {attempt.run_seconds:.1f} s on {gpus}{kind}: "
        f"{hours} GPU-hours (times from {attempt.source or 'the submission only'})"
    )


def emit_metrics(attempt: Attempt, task_tags: Mapping[str, str]) -> None:
    """Send one attempt to Airflow's metrics (whatever ``[metrics]`` configures: StatsD, Datadog, OpenTelemetry).

    :param task_tags: the task instance's tags (``ti.stats_tags``: ``dag_id``, ``task_id``, ...).
    """
    from airflow.sdk.observability.stats import Stats

    tags = {
        **task_tags,
        "platform": attempt.platform,
        "conn_id": attempt.conn_id or "",
        "gpu_type": attempt.gpu_type or "unknown",
        "outcome": attempt.outcome,
    }
    legacy, rest = _legacy_suffix(task_tags), _unnamed(tags)
    Stats.incr(METRIC_ATTEMPTS, tags=tags)
    if legacy:
        Stats.incr(f"{METRIC_ATTEMPTS}{legacy}.{attempt.outcome}", tags=rest)
    timings = {
        METRIC_QUEUED_TIME: timedelta(seconds=attempt.queued_seconds),
        METRIC_RUN_TIME: timedelta(seconds=attempt.run_seconds),
    }
    for name, value in timings.items():
        Stats.timing(name, value, tags=tags)
        if legacy:
            Stats.timing(f"{name}{legacy}", value, tags=rest)
    if attempt.gpus is not None:
        seconds = round(attempt.gpus * attempt.run_seconds)  # counters count whole units
        Stats.incr(METRIC_GPU_SECONDS, seconds, tags=tags)
        if legacy:
            Stats.incr(f"{METRIC_GPU_SECONDS}{legacy}", seconds, tags=rest)


def emit_failover(task_tags: Mapping[str, str], source: JobHandle, target_platform: str, target_conn: str) -> None:
    """Count one move from ``source``'s connection to ``target_conn``."""
    from airflow.sdk.observability.stats import Stats

    tags = {
        **task_tags,
        "from_platform": source.platform,
        "from_conn_id": source.conn_id or "",
        "to_platform": target_platform,
        "to_conn_id": target_conn,
    }
    Stats.incr(METRIC_FAILOVERS, tags=tags)
    if legacy := _legacy_suffix(task_tags):
        Stats.incr(f"{METRIC_FAILOVERS}{legacy}", tags=_unnamed(tags))


def _unnamed(tags: Mapping[str, str]) -> dict[str, str]:
    """The tags a legacy name does not already carry in the name itself (as Airflow's legacy names do)."""
    return {key: value for key, value in tags.items() if key not in ("dag_id", "task_id")}


def _legacy_suffix(task_tags: Mapping[str, str]) -> str:
    """``.<dag_id>.<task_id>`` (dots inside them become ``__``, as Airflow's legacy names do) when Airflow sends
    legacy names; "" otherwise."""
    from airflow.sdk import conf
    from airflow.sdk.observability.stats import normalize_name_for_stats

    if not conf.getboolean("metrics", "legacy_names_on", fallback=True):
        return ""
    parts = [str(task_tags.get(key, "")).replace(".", "__") for key in ("dag_id", "task_id")]
    return "." + ".".join(normalize_name_for_stats(part, log_warning=False) for part in parts)
