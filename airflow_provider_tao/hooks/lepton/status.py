"""What a DGX Cloud Lepton job says about itself, read from the API's JSON: the labels it carries, its state in the
shared vocabulary, its replicas' readiness, its log lines and its failure facts. Pure functions, no I/O.

The state map is the seed's: Queueing / Awaiting / PendingRetry / Starting are Pending, Running is Running (however
many of its replicas are ready: a job that has run is never a start failure), Completed is Complete, Stopped Paused,
Deleted Canceled, Failed or Archived without completing Error. A job queueing past its capacity bound or Starting
past its start bound (both carried as labels of the job, so any hook judges it alike) is an Error that the failure
taxonomy turns into ``ERR_CAPACITY``, ``ERR_IMAGE_PULL`` or ``ERR_INFRA``.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from airflow_provider_tao.accounting import JobUsage
from airflow_provider_tao.failures import RAW_STATE_CLASSES, SUGGESTIONS, FailureFacts, runner_verdict, signal_of
from airflow_provider_tao.hooks.base import MARK_CANCEL, MARK_CANCELED_BY, MARK_CONSUMED, MARK_OWNER
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.jobs import ErrClass, FailureAnalysis, JobState, JobStatus

# Label keys: the client refuses '/' in them (``^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$``, <= 63).
LABEL_MANAGED = "tao-managed"
LABEL_JOB_ID = "tao-job-id"
LABEL_NAME = "tao-job-name"
LABEL_TRY = "tao-try"
LABEL_CAPACITY = "tao-capacity-timeout"
LABEL_START = "tao-start-timeout"
LABEL_STAGE_OF = "tao-stage-of"
ORIGIN_LABELS = {"dag_id": "tao-dag-id", "task_id": "tao-task-id", "map_index": "tao-map-index"}
MARK_LABELS = {
    MARK_OWNER: "tao-owner-try",
    MARK_CANCEL: "tao-cancel-by",
    MARK_CONSUMED: "tao-consumed-by",
    MARK_CANCELED_BY: "tao-canceled-by",
}
#: Marks that name a person or a tool (who canceled the job from outside its task); the others are try numbers.
TEXT_MARKS = frozenset({MARK_CANCELED_BY})

#: The bounds of a job without its own (``capacity_timeout_seconds``, ``start_timeout_seconds``).
DEFAULT_CAPACITY_TIMEOUT = 15 * 60
DEFAULT_START_TIMEOUT = 10 * 60
QUEUE_STATES = frozenset({"Queueing", "Awaiting", "PendingRetry"})
START_STATES = frozenset({"Starting", "Restarting"})
#: Lepton states after which the job runs nothing more (Stopped is a pause: it can be started again).
FINISHED_STATES = frozenset({"Completed", "Failed", "Deleted", "Archived"})
#: States of a job whose labels Lepton no longer patches (404): its TTL passed, or it was deleted.
GONE_STATES = frozenset({"Deleted", "Archived"})
#: States of a job on its way out (a delete under way).
ENDING_STATES = frozenset({"Deleting", "Terminating"})
_READINESS_ORDER = ("Failed", "ConfigError", "SystemError", "NoCapacity", "Queueing", "InProgress")
_PULLING = re.compile(r"pull|image", re.IGNORECASE)
_EXIT_CODE = re.compile(r"exit(?:ed)?(?: with)? code[:= ]+(-?\d+)", re.IGNORECASE)
_EVICTED = re.compile(r"evict|preempt", re.IGNORECASE)


# ----------------------------------------------------------------------------- the job's JSON


def labels_of(job: dict[str, Any]) -> dict[str, str]:
    return dict((job.get("metadata") or {}).get("labels") or {})


def mark_text(key: str, value: Any) -> str:
    """A mark's value as a label value and in a mark secret's name: a try number as digits; who canceled the job in
    label characters (``cli:jdoe`` -> ``cli-jdoe``: a label value allows only ``[A-Za-z0-9_.-]``)."""
    if key in TEXT_MARKS:
        return ct.label_value(str(value)) or "unknown"
    return str(int(value))


def mark_value(key: str, text: str) -> Any:
    """The mark kept as ``text`` (a label value or a mark secret's name part); None when it is not one."""
    if key in TEXT_MARKS:
        return text or None
    return int(text) if text.isdigit() else None


def marks_of(job: dict[str, Any]) -> dict[str, Any]:
    """The ownership marks held in the job's labels."""
    labels = labels_of(job)
    found = {key: mark_value(key, str(labels.get(label, ""))) for key, label in MARK_LABELS.items()}
    return {key: value for key, value in found.items() if value is not None}


def id_of(job: dict[str, Any]) -> str:
    """The job's id as the server gave it (what every per-job route takes)."""
    return str((job.get("metadata") or {}).get("id") or "")


def state_of(job: dict[str, Any]) -> str:
    return str((job.get("status") or {}).get("state") or "")


def created_at(job: dict[str, Any]) -> float | None:
    """When the job was created (epoch seconds), if the API says."""
    meta, status = job.get("metadata") or {}, job.get("status") or {}
    return epoch_seconds(meta.get("created_at") or status.get("creation_time"))


def _replicas(job: dict[str, Any]) -> tuple[int, int, int]:
    """``(wanted, ready, active)`` replicas of the job."""
    status, spec = job.get("status") or {}, job.get("spec") or {}
    wanted = int(spec.get("parallelism") or spec.get("completions") or 1)
    return wanted, int(status.get("ready") or 0), int(status.get("active") or 0)


def is_starting(job: dict[str, Any]) -> bool:
    """Scheduled but not all replicas ready: Starting / Restarting, or Running with fewer ready than wanted (whose
    replicas' readiness is then worth reading)."""
    wanted, ready, active = _replicas(job)
    state = state_of(job)
    return state in START_STATES or (state == "Running" and ready < max(active, wanted))


#: Below each bound a stamp is read in that unit (leptonai 0.47.1 ``cli/log.py`` ``_preprocess_time``, which reads
#: a job's ``creation_time`` / ``completion_time`` so): seconds, milliseconds, microseconds; nanoseconds above.
_EPOCH_UNITS = ((1e11, 1.0), (1e14, 1e3), (1e17, 1e6))


def epoch_seconds(stamp: Any) -> float | None:
    """An API time stamp as epoch seconds, whichever unit it is in: ``metadata.created_at`` is milliseconds (the
    CLI's ``format_timestamp_ms``), ``ReplicaTermination`` times are seconds (the CLI's ``datetime.fromtimestamp``),
    and ``status.creation_time`` / ``completion_time`` are read by the CLI as s, ms, µs or ns by magnitude (so
    here); anything that is not a positive number is unknown (None)."""
    try:
        value = float(stamp)
    except (TypeError, ValueError):
        return None
    if value <= 0:
        return None
    return value / next((scale for bound, scale in _EPOCH_UNITS if value < bound), 1e9)


# ----------------------------------------------------------------------------- the status rule


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


def job_status(
    job: dict[str, Any], now: float, readiness: Readiness | None = None, starting_since: float | None = None
) -> JobStatus:
    """A Lepton job's state in the shared vocabulary (the seed's map), from the job's JSON.

    Queueing / Awaiting / PendingRetry / Starting are Pending; Running is Running whatever ``ready`` says (what a
    dip in it means is not documented); Completed is Complete, Stopped Paused, Deleted Canceled, Failed or Archived
    without completing Error. Queueing past the job's capacity bound is an Error ``NoCapacity``; Starting past its
    start bound an Error named after the replicas' readiness (``ImagePullFailed``, ``ConfigError``,
    ``StartTimeout``), as is a replica whose image pull failed (the server's word, not a clock).

    :param readiness: the replicas' readiness issue, when known.
    :param starting_since: when the job was first seen starting (else its creation).
    """
    meta, status, spec = job.get("metadata") or {}, job.get("status") or {}, job.get("spec") or {}
    name = meta.get("name") or meta.get("id") or "?"
    state = state_of(job)
    labels = labels_of(job)
    wanted, ready, _ = _replicas(job)
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
    if state in ENDING_STATES:
        return JobStatus(JobState.CANCELING, f"Lepton job {name} is being deleted", raw_state=state)
    if state in ("Stopped", "Stopping"):
        return JobStatus(JobState.PAUSED, f"Lepton job {name} is {state.lower()}", raw_state=state)
    created = created_at(job) or now
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
            JobState.PENDING,
            f"Lepton job {name} is {state or 'queueing'}: waiting for capacity{why}",
            raw_state=state,
            capacity_wait_since=created,  # the bound above counts from the same moment
        )
    if state in START_STATES:
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
        # Running: a replica has run. Fewer ready than wanted may be a replica still starting, a dip in readiness or
        # a worker that finished before rank 0 -- which one is not knowable here, and a job that has run is never a
        # start failure (the safe reading): it runs until its replicas end it.
        return JobStatus(
            JobState.RUNNING, f"Lepton job {name}: {ready}/{wanted} replica(s) ready{why}", raw_state=state
        )
    return JobStatus(JobState.PENDING, f"Lepton job {name} is in state {state!r}", raw_state=state)


# ----------------------------------------------------------------------------- usage (GPU-hours)


def usage_of(job: dict[str, Any], replicas: list[dict[str, Any]], shape: dict[str, Any] | None) -> JobUsage:
    """A job's usage from what the client models: the job's creation (queued from then on), its replicas'
    ``metadata.created_at`` (milliseconds; a replica with a node was placed then: its start), the job's
    ``completion_time`` and its resource shape's accelerators per replica.

    The client models no termination record for a job's replicas (``Replica`` is metadata, id, public IP, node and
    domains; ``ReplicaTermination`` belongs to deployments, in seconds): whatever such fields a server adds is not
    read. A time the API does not give is unknown (None), never guessed.

    :param shape: the job's shape as :meth:`list_resource_shapes` gives it (``gpus``, ``gpu_type``), if known.
    """
    status, spec = job.get("status") or {}, job.get("spec") or {}
    starts = [
        started
        for replica in replicas
        if (replica.get("status") or {}).get("node")
        and (started := epoch_seconds((replica.get("metadata") or {}).get("created_at"))) is not None
    ]
    ended = epoch_seconds(status.get("completion_time")) if state_of(job) in FINISHED_STATES else None
    nodes = int(spec.get("completions") or spec.get("parallelism") or 1)
    return JobUsage(
        queued_at=created_at(job),
        started_at=min(starts) if starts else None,
        ended_at=ended,
        gpus_per_node=int(shape["gpus"]) if shape else None,
        nodes=nodes,
        gpu_type=(str(shape.get("gpu_type") or "") or None) if shape and shape.get("gpus") else None,
        source="the Lepton job's creation and completion times and its replicas' placement times",
    )


# ----------------------------------------------------------------------------- logs and failure facts


def log_lines(data: dict[str, Any]) -> list[tuple[str, str]]:
    """``(timestamp ns, text)`` of every entry of a Loki ``query_range`` answer (all streams). An entry is
    ``[ts_ns, line]`` or ``[ts_ns, line, metadata]`` (leptonai 0.47.1 ``cli/log.py`` ``_parse_log_entries`` reads
    both); the metadata is not part of the log."""
    result = (data.get("data") or {}).get("result") or []
    return [
        (str(value[0]).zfill(19), str(value[1]).rstrip("\n"))
        for stream in result
        for value in stream.get("values") or []
        if isinstance(value, list | tuple) and len(value) >= 2
    ]


def _event_evidence(event: dict[str, Any]) -> str:
    """One event as evidence: ``LeptonEvent`` models type, reason, count and what it is about (``regarding``), no
    message -- a message a server adds is kept, its absence loses nothing else."""
    reason, message = str(event.get("reason") or ""), str(event.get("message") or "")
    count = event.get("count")
    regarding = event.get("regarding")
    about = (
        " ".join(str(regarding[k]) for k in ("kind", "name") if regarding.get(k)) if isinstance(regarding, dict) else ""
    )
    line = f"event {reason}" + (f" (x{count})" if isinstance(count, int) and count > 1 else "")
    line += f" on {about}" if about else ""
    return f"{line}: {message}" if message else line


def _stream_lines(stream: Any) -> list[str]:
    """The lines of one of the analysis' ``log_streams`` (its shape is not modelled by the client: lines, Loki
    values, or plain text)."""
    if isinstance(stream, dict):
        if stream.get("lines"):
            return [str(line) for line in stream["lines"]]
        if stream.get("values"):
            return [str(v[-1] if isinstance(v, list | tuple) and v else v) for v in stream["values"]]
        return (
            [str(stream.get("message") or stream.get("text") or "")]
            if stream.get("message") or stream.get("text")
            else []
        )
    return str(stream).splitlines()


def failure_facts_of(
    status: JobStatus,
    *,
    replicas: list[dict[str, Any]],
    events: list[dict[str, Any]],
    analysis: dict[str, Any],
    log_tail: list[str],
    job: str | None,
    workspace: Any,
) -> FailureFacts:
    """The facts of a failed job from what the API holds about it: its status, its events, the server's failure
    analysis (its verdict ``err_class`` / ``suggestion``, node events, log streams) and the failed replica's log
    tail. Replicas give their ids only: no client model has a job replica's termination record.

    :param job: the job's id on the server; :param workspace: the workspace id (both only reported).
    """
    evidence: list[str] = []
    raw = status.raw_state
    oom = False
    exit_code = status.exit_code
    for event in analysis.get("job_failure_by_node_event") or []:
        name = str(event.get("node_event_name") or "")
        evidence.append(f"node event {name}: {event.get('message', '')}".rstrip(": "))
        oom = oom or name.upper() in ("OOM", "OOMKILLED", "OOMKILLING")
        if _EVICTED.search(name):
            raw = "Evicted"
    for event in events:
        reason = str(event.get("reason") or "")
        if event.get("type", "Warning") != "Normal":
            evidence.append(_event_evidence(event))
        oom = oom or "oom" in reason.lower()
        if _EVICTED.search(reason):
            raw = "Evicted"
    if exit_code is None:
        for line in evidence:
            if match := _EXIT_CODE.search(line):
                exit_code = int(match.group(1))
                break
    tail = list(log_tail)
    for stream in analysis.get("log_streams") or []:
        tail += _stream_lines(stream)
    return FailureFacts(
        exit_code=exit_code,
        raw_state=raw,
        oom_killed=oom,
        log_tail=tail,
        events=evidence,
        message=status.message,
        details={
            "job": job,
            "workspace": workspace,
            "replicas": [r.get("id") or (r.get("metadata") or {}).get("id") for r in replicas],
            "lepton_err_class": analysis.get("err_class") or None,
            "lepton_suggestion": analysis.get("suggestion") or None,
        },
    )


def follow_server_verdict(result: FailureAnalysis, facts: FailureFacts) -> FailureAnalysis:
    """The class of a failed job when Lepton's failure analysis gives one: the platform's own verdict, which beats
    what the taxonomy reads from log lines and exit codes (a program error is not retried because a log line looks
    like a network fault). Stronger facts keep their class: a cancel, the in-job runner's own verdict, the kernel's
    OOM kill, a deadline, and the platform states our status rule names (no capacity, image pull, eviction)."""
    try:
        server = ErrClass(str(facts.details.get("lepton_err_class") or "").strip().upper())
    except ValueError:
        return result  # none given, or a word of no class ("OOM"): the facts decide
    raw = facts.raw_state.replace(" ", "_").upper()
    stronger = (
        facts.canceled
        or facts.oom_killed
        or facts.timed_out
        or runner_verdict(facts.log_tail) is not None
        or raw in RAW_STATE_CLASSES
    )
    # A SIGKILL / SIGTERM from outside (no OOM flag): the program did not end itself, whoever sent it (a node dying,
    # a person). Whether the server's ERR_PROGRAM for a non-zero exit knows that is unknown: the safe reading, a
    # retry, wins over a verdict that would fail the task for good (the same rule as on every other platform).
    killed = signal_of(facts.exit_code) in (signal.SIGKILL, signal.SIGTERM) and not server.retriable
    if stronger or killed or server is result.err_class:
        return result
    said = str(facts.details.get("lepton_suggestion") or "").strip().rstrip(".")
    return replace(
        result,
        err_class=server,
        retriable=server.retriable,
        suggestion=f"{said}. {SUGGESTIONS[server]}" if said else SUGGESTIONS[server],
        evidence=[f"Lepton's failure analysis: {server.value}" + (f": {said}" if said else ""), *result.evidence],
        details={**result.details, "classified_by": "lepton_failure_analysis", "facts_class": result.err_class.value},
    )
