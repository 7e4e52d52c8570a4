"""The ``kubernetes`` platform's status rule: a ``batch/v1`` Job's state in the shared vocabulary from the Job and its
pods (API JSON), and what a poll needs to know about the pods. Pure functions, no I/O.

A Job is Running only while one of its pods runs its container. Pending pods say why (unschedulable, pulling,
ContainerCreating, a config error); a pod that stays unschedulable past ``unschedulable_timeout_seconds`` or cannot
start past ``start_timeout_seconds`` (both carried as annotations of the Job, so any hook judges it alike) makes the
job an Error, and so does a Job left suspended by a worker that died mid-submission.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from airflow_provider_tao.accounting import JobUsage
from airflow_provider_tao.hooks import container as ct
from airflow_provider_tao.hooks.base import MARK_CANCEL
from airflow_provider_tao.jobs import JobState, JobStatus

#: The container of the job's pods (its log is the job's).
CONTAINER = "tao"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
ANNOTATION_UNSCHEDULABLE = f"{ct.LABEL_DOMAIN}/unschedulable-timeout"
ANNOTATION_START = f"{ct.LABEL_DOMAIN}/start-timeout"
DEFAULT_UNSCHEDULABLE_TIMEOUT = 15 * 60
DEFAULT_START_TIMEOUT = 10 * 60
#: A Job still suspended after this long was left behind by a worker that died mid-submission.
SETUP_TIMEOUT_SECONDS = 60.0
#: The annotation of the Job's cancel mark: a cancel suspends the Job (its pods stop) and keeps it, marks and all,
#: until the task has read its verdict.
ANNOTATION_CANCELED = f"{ct.LABEL_DOMAIN}/{MARK_CANCEL}"
_WAITING_FATAL = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
}


# ----------------------------------------------------------------------------- the status rule


@dataclass(frozen=True)
class _Waiting:
    """Why a pod does not run yet, and since when (epoch seconds)."""

    reason: str
    message: str
    since: float


def pods_needed(jobs: list[dict[str, Any]], watched: set[str]) -> bool:
    """Whether a poll must list the pods: a watched Job whose own status settles its state -- completed, or with a
    ready pod (``status.ready``: a pod is Ready only while its containers run) -- needs none. Pending, failing and
    deleted Jobs do (the reason, the culprit's exit code); so does a cluster that does not report ``ready``."""
    for job in jobs:
        if (job["metadata"].get("labels") or {}).get(ct.LABEL_JOB_ID) not in watched:
            continue
        conditions = {c["type"] for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}
        if "Complete" in conditions:
            continue
        ready = ((job.get("status") or {}).get("ready") or 0) > 0
        if not ready or conditions & {"Failed", "FailureTarget"} or job["metadata"].get("deletionTimestamp"):
            return True
    return False


def job_status(job: dict[str, Any], pods: list[dict[str, Any]], now: float) -> JobStatus:
    """A Job's state from the Job and its pods (API JSON). Running only while a pod runs its container; a pod
    that cannot be scheduled or started past its bound makes the job an Error."""
    meta = job["metadata"]
    name = meta["name"]
    if meta.get("deletionTimestamp"):
        return JobStatus(JobState.CANCELING, f"Job {name} is being deleted", raw_state="Deleting")
    conditions = {c["type"]: c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}
    if "Complete" in conditions:
        return JobStatus(JobState.COMPLETE, f"Job {name} completed", 0, "Complete")
    failed = conditions.get("Failed") or conditions.get("FailureTarget")
    if failed is not None:
        return _failed_status(name, failed, pods)
    if is_canceled(job):
        return JobStatus(
            JobState.CANCELED, f"Job {name} was canceled (suspended: its pods are stopped)", None, "Canceled"
        )
    if job["spec"].get("suspend"):
        if never_started(job, now):
            return JobStatus(
                JobState.ERROR,
                f"Job {name} was created but never started (the submitting worker died?)",
                raw_state="Suspended",
            )
        return JobStatus(JobState.PENDING, f"Job {name} is being set up", raw_state="Suspended")
    if not pods and (ready := (job.get("status") or {}).get("ready") or 0):  # the poll did not list the pods
        active_count = (job.get("status") or {}).get("active") or ready
        return JobStatus(JobState.RUNNING, f"{ready}/{active_count} pod(s) of Job {name} running", raw_state="Running")
    active = [p for p in pods if p["status"].get("phase") in ("Pending", "Running")]
    running = [p for p in active if _running(p)]
    if running:
        return JobStatus(
            JobState.RUNNING, f"{len(running)}/{len(active)} pod(s) of Job {name} running", raw_state="Running"
        )
    waiting = [w for w in (_waiting(p) for p in active) if w is not None]
    if not waiting:
        return JobStatus(JobState.PENDING, f"Job {name} is waiting for its pods", raw_state="Pending")
    annotations = meta.get("annotations") or {}
    for item in waiting:
        fatal = item.reason == "Unschedulable" or item.reason in _WAITING_FATAL
        key = ANNOTATION_UNSCHEDULABLE if item.reason == "Unschedulable" else ANNOTATION_START
        default = DEFAULT_UNSCHEDULABLE_TIMEOUT if item.reason == "Unschedulable" else DEFAULT_START_TIMEOUT
        bound = float(annotations.get(key) or default)
        if fatal and now - item.since > bound:
            return JobStatus(
                JobState.ERROR,
                f"Job {name}: {item.reason} for {now - item.since:.0f} s (more than {bound:.0f} s): {item.message}",
                raw_state=item.reason,
            )
    first = waiting[0]
    unschedulable = [item.since for item in waiting if item.reason == "Unschedulable"]
    return JobStatus(
        JobState.PENDING,
        f"Job {name}: {first.reason}: {first.message}".rstrip(": "),
        raw_state=first.reason,
        # a pod the scheduler cannot place waits for resources, since the scheduler said so
        capacity_wait_since=min(unschedulable, default=None),
    )


def _failed_status(name: str, condition: dict[str, Any], pods: list[dict[str, Any]]) -> JobStatus:
    reason = str(condition.get("reason") or "Failed")
    culprit = culprit_of(pods)
    if reason == "DeadlineExceeded" or culprit is None:
        return JobStatus(
            JobState.ERROR, f"Job {name} failed: {reason}: {condition.get('message', '')}", raw_state=reason
        )
    pod = culprit["metadata"]["name"]
    status = culprit["status"]
    terminated = termination_of(culprit) or {}
    code = terminated.get("exitCode")
    disruption = next(
        (c for c in status.get("conditions") or [] if c["type"] == "DisruptionTarget" and c.get("status") == "True"),
        None,
    )
    if status.get("reason") == "Evicted" or disruption is not None:
        why = status.get("message") or (disruption or {}).get("message") or "evicted"
        return JobStatus(JobState.ERROR, f"Job {name}: pod {pod} was evicted: {why}", code, "Evicted")
    raw = str(terminated.get("reason") or reason)
    what = "was killed by the out-of-memory killer" if raw == "OOMKilled" else f"exited with code {code}"
    return JobStatus(JobState.ERROR, f"Job {name}: pod {pod} container {CONTAINER} {what}", code, raw)


# ----------------------------------------------------------------------------- pods


def _index(pod: dict[str, Any]) -> int:
    return int((pod["metadata"].get("annotations") or {}).get(INDEX_ANNOTATION) or 0)


def rank0_pod(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The pod whose log is the job's: completion index 0 (or the only pod), newest first."""
    candidates = [p for p in pods if _index(p) == 0]
    return max(candidates, key=lambda p: p["metadata"].get("creationTimestamp") or "", default=None)


def pod_name(pod: dict[str, Any] | None) -> str:
    """The pod's name ("" for none)."""
    return str(pod["metadata"]["name"]) if pod else ""


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod["status"].get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == CONTAINER), statuses[0] if statuses else {})


def _running(pod: dict[str, Any]) -> bool:
    return pod["status"].get("phase") == "Running" and "running" in ((_container(pod).get("state")) or {})


def termination_of(pod: dict[str, Any]) -> dict[str, Any] | None:
    """How the job's container in the pod ended (``state.terminated``), None while it has not."""
    return ((_container(pod).get("state")) or {}).get("terminated")


def culprit_of(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The pod that failed the job: the first failed one (evicted before the rest), else rank 0."""
    failed = [p for p in pods if p["status"].get("phase") == "Failed"]
    return min(failed, key=lambda p: (termination_of(p) or {}).get("finishedAt") or "", default=None) or rank0_pod(pods)


def _waiting(pod: dict[str, Any]) -> _Waiting | None:
    """Why a pending pod does not run: the scheduler's verdict first, then its container's waiting reason."""
    conditions = {c["type"]: c for c in pod["status"].get("conditions") or []}
    scheduled = conditions.get("PodScheduled")
    created = epoch(pod["metadata"].get("creationTimestamp")) or time.time()
    if scheduled is not None and scheduled.get("status") == "False":
        since = epoch(scheduled.get("lastTransitionTime")) or created
        return _Waiting(str(scheduled.get("reason") or "Unschedulable"), str(scheduled.get("message") or ""), since)
    waiting = ((_container(pod).get("state")) or {}).get("waiting")
    if waiting is None:
        return None
    since = epoch((scheduled or {}).get("lastTransitionTime")) or created
    return _Waiting(str(waiting.get("reason") or "Waiting"), str(waiting.get("message") or ""), since)


# ----------------------------------------------------------------------------- usage (GPU-hours)

#: The node label NVIDIA's GPU feature discovery sets to the GPU model (also what a node selector picks GPUs by).
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


def usage_of(job: dict[str, Any], pods: list[dict[str, Any]], node_labels: dict[str, str] | None = None) -> JobUsage:
    """A Job's usage from the API's own records: its creation (queued from then on), its pods' container
    ``startedAt`` / ``finishedAt`` (the first start, the last end once every started pod has ended), the GPUs its pod
    template asks for per pod (``nvidia.com/gpu`` limits) and one node per pod that ran.

    :param node_labels: the labels of the node rank 0 ran on (its GPU model), when they could be read.
    """
    template = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = template.get("containers") or [{}]
    limits = next((c for c in containers if c.get("name") == CONTAINER), containers[0]).get("resources") or {}
    gpus = int((limits.get("limits") or {}).get("nvidia.com/gpu") or 0)
    starts, ends, running = [], [], False
    for pod in pods:
        state = (_container(pod).get("state")) or {}
        if "running" in state:
            running = True
            starts.append(epoch(state["running"].get("startedAt")))
        elif "terminated" in state:
            starts.append(epoch(state["terminated"].get("startedAt")))
            ends.append(epoch(state["terminated"].get("finishedAt")))
    started = min((s for s in starts if s is not None), default=None)
    ended = max((e for e in ends if e is not None), default=None)
    selector = (template.get("nodeSelector") or {}).get(GPU_PRODUCT_LABEL)
    completions = int((job.get("spec") or {}).get("completions") or 1)
    return JobUsage(
        queued_at=epoch(job["metadata"].get("creationTimestamp")),
        started_at=started,
        ended_at=None if running else ended,
        gpus_per_node=gpus,
        nodes=len(starts) or completions,
        gpu_type=(selector or (node_labels or {}).get(GPU_PRODUCT_LABEL)) if gpus else None,
        source="the Job's creationTimestamp and its pods' container startedAt / finishedAt",
    )


def is_finished(job: dict[str, Any]) -> bool:
    """Whether the Job has completed or failed (its own conditions; the pods do not matter)."""
    return any(
        c["type"] in ("Complete", "Failed") and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


def is_canceled(job: dict[str, Any]) -> bool:
    """A Job a cancel stopped: suspended, with the cancel mark."""
    return bool(job["spec"].get("suspend")) and ANNOTATION_CANCELED in (job["metadata"].get("annotations") or {})


def never_started(job: dict[str, Any], now: float) -> bool:
    """A Job still suspended past :data:`SETUP_TIMEOUT_SECONDS` with no cancel: its submitting worker died."""
    created = epoch(job["metadata"].get("creationTimestamp")) or now
    return bool(job["spec"].get("suspend")) and not is_canceled(job) and now - created > SETUP_TIMEOUT_SECONDS


def epoch(stamp: str | None) -> float | None:
    """An API timestamp (RFC 3339, whole seconds) as epoch seconds."""
    return float(ct.cursor_second(stamp)) if stamp else None
