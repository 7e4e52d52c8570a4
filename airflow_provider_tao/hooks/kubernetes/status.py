"""The ``kubernetes`` platform's status rule: a ``batch/v1`` Job's state in the shared vocabulary from the Job and its
pods (API JSON), and what a poll needs to know about the pods. Pure functions, no I/O.

A Job is Running only while one of its pods runs its container. No wait is without a bound: a pod that stays
unschedulable or scheduling-gated past ``unschedulable_timeout_seconds``, a Job whose pods are never created
(``FailedCreate``: quota, PodSecurity, LimitRange, a webhook's denial) or a pod that cannot start (a waiting reason
such as ``ErrImagePull``, ``ErrImageNeverPull`` or a config error, or ``ContainerCreating`` with a Warning event such
as ``FailedMount`` / a ``Multi-Attach`` of a ReadWriteOnce claim) past ``start_timeout_seconds`` (both bounds carried
as annotations of the Job, so any hook judges it alike) makes the job an Error, and so does a Job left suspended by a
worker that died mid-submission. What only events say (why pods are not created, why a pod stays in
``ContainerCreating``) is read for the objects :func:`events_needed` names. A Job suspended again after we resumed it
(Kueue, which suspends Jobs it has not admitted or has preempted) is queued for capacity, not dead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from airflow_provider_tao.accounting import JobUsage
from airflow_provider_tao.hooks.base import MARK_CANCEL
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.jobs import JobState, JobStatus

#: The container of the job's pods (its log is the job's).
CONTAINER = "tao"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
ANNOTATION_UNSCHEDULABLE = f"{ct.LABEL_DOMAIN}/unschedulable-timeout"
ANNOTATION_START = f"{ct.LABEL_DOMAIN}/start-timeout"
#: Set with the resume: a Job suspended and carrying it was suspended by someone else (a queue such as Kueue).
ANNOTATION_RESUMED = f"{ct.LABEL_DOMAIN}/resumed"
DEFAULT_UNSCHEDULABLE_TIMEOUT = 15 * 60
DEFAULT_START_TIMEOUT = 10 * 60
#: A Job still suspended after this long was left behind by a worker that died mid-submission.
SETUP_TIMEOUT_SECONDS = 60.0
#: Waiting reasons of a container that can last while all is well (an image pull shows as ContainerCreating);
#: every other one is bounded by the start timeout, and so is ContainerCreating once a Warning event explains it.
_WAITING_BENIGN = {"ContainerCreating", "PodInitializing"}
#: How long a wait goes before the events that explain it are read.
EVENTS_AFTER_SECONDS = 10.0
_QUOTA = "exceeded quota"
_MULTI_ATTACH_HINT = (
    " (a ReadWriteOnce volume, such as the connection's results_pvc, is in use on another node: use a "
    "ReadWriteMany claim)"
)
#: The annotation of the Job's cancel mark: a cancel suspends the Job (its pods stop) and keeps it, marks and all,
#: until the task has read its verdict.
ANNOTATION_CANCELED = f"{ct.LABEL_DOMAIN}/{MARK_CANCEL}"


# ----------------------------------------------------------------------------- the status rule


@dataclass(frozen=True)
class _Waiting:
    """Why a pod does not run yet, since when (epoch seconds), the annotation that bounds it (None: no bound of
    ours) and whether it waits for capacity."""

    reason: str
    message: str
    since: float
    bound: str | None = None
    capacity: bool = False


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


def events_needed(job: dict[str, Any], pods: list[dict[str, Any]], now: float) -> list[str]:
    """The uids of the objects whose Warning events alone say why the job waits, once it has waited a while: the
    Job when it has no pod (``FailedCreate``), a pod in ``ContainerCreating`` (``FailedMount``, ``Multi-Attach``)."""
    if is_finished(job) or job["spec"].get("suspend") or job["metadata"].get("deletionTimestamp"):
        return []
    if not pods and ((job.get("status") or {}).get("ready") or 0):  # running: the poll did not list its pods
        return []
    if not pods:
        return [job["metadata"]["uid"]] if now - _started(job, now) > EVENTS_AFTER_SECONDS else []
    needed = []
    for pod in pods:
        item = _waiting(pod, [])
        if item is not None and item.reason in _WAITING_BENIGN and now - item.since > EVENTS_AFTER_SECONDS:
            needed.append(pod["metadata"]["uid"])
    return needed


def job_status(
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    now: float,
    warnings: dict[str, list[dict[str, Any]]] | None = None,
) -> JobStatus:
    """A Job's state from the Job and its pods (API JSON). Running only while a pod runs its container; a wait
    past its bound makes the job an Error.

    :param warnings: Warning events by the uid of the object they are about, oldest first, for the objects
        :func:`events_needed` named.
    """
    warnings = warnings or {}
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
    annotations = meta.get("annotations") or {}
    if is_canceled(job):
        return JobStatus(
            JobState.CANCELED, f"Job {name} was canceled (suspended: its pods are stopped)", None, "Canceled"
        )
    if job["spec"].get("suspend"):
        return _suspended_status(job, conditions.get("Suspended"), now)
    if not pods and (ready := (job.get("status") or {}).get("ready") or 0):  # the poll did not list the pods
        active_count = (job.get("status") or {}).get("active") or ready
        return JobStatus(JobState.RUNNING, f"{ready}/{active_count} pod(s) of Job {name} running", raw_state="Running")
    if not pods:
        return _podless_status(job, warnings.get(meta.get("uid", ""), []), now)
    active = active_pods(pods)
    running = [p for p in active if _running(p)]
    if running:
        return JobStatus(
            JobState.RUNNING, f"{len(running)}/{len(active)} pod(s) of Job {name} running", raw_state="Running"
        )
    waiting = [
        w for w in (_waiting(p, warnings.get(p["metadata"].get("uid", ""), [])) for p in active) if w is not None
    ]
    if not waiting:
        return JobStatus(JobState.PENDING, f"Job {name} is waiting for its pods", raw_state="Pending")
    for item in waiting:
        if item.bound is not None and now - item.since > (bound := _bound(annotations, item.bound)):
            return JobStatus(
                JobState.ERROR,
                f"Job {name}: {item.reason} for {now - item.since:.0f} s (more than {bound:.0f} s): {item.message}",
                raw_state=item.reason,
            )
    first = waiting[0]
    return JobStatus(
        JobState.PENDING,
        f"Job {name}: {first.reason}: {first.message}".rstrip(": "),
        raw_state=first.reason,
        # a pod the scheduler cannot place (or a gate holds) waits for resources, since it was said so
        capacity_wait_since=min((item.since for item in waiting if item.capacity), default=None),
    )


def _bound(annotations: dict[str, str], key: str) -> float:
    default = DEFAULT_UNSCHEDULABLE_TIMEOUT if key == ANNOTATION_UNSCHEDULABLE else DEFAULT_START_TIMEOUT
    return float(annotations.get(key) or default)


def _started(job: dict[str, Any], now: float) -> float:
    """When the Job controller started the Job (``status.startTime``, set at the resume), else its creation."""
    return epoch((job.get("status") or {}).get("startTime")) or epoch(job["metadata"].get("creationTimestamp")) or now


def _suspended_status(job: dict[str, Any], condition: dict[str, Any] | None, now: float) -> JobStatus:
    """A suspended Job: ours while being set up (past a minute: its worker died), or -- resumed by us, suspended
    again -- held by a queue such as Kueue (not admitted yet, or preempted): queued for capacity."""
    meta = job["metadata"]
    name = meta["name"]
    resumed = (meta.get("annotations") or {}).get(ANNOTATION_RESUMED)
    if resumed:
        since = epoch((condition or {}).get("lastTransitionTime")) or float(resumed)
        return JobStatus(
            JobState.PENDING,
            f"Job {name} was suspended after its submission by a queue controller such as Kueue: it waits to be "
            f"admitted ({(condition or {}).get('message') or 'suspended'})",
            raw_state="Queued",
            capacity_wait_since=since,
        )
    if never_started(job, now):
        return JobStatus(
            JobState.ERROR,
            f"Job {name} was created but never started (the submitting worker died?)",
            raw_state="Suspended",
        )
    return JobStatus(JobState.PENDING, f"Job {name} is being set up", raw_state="Suspended")


def _podless_status(job: dict[str, Any], warnings: list[dict[str, Any]], now: float) -> JobStatus:
    """A started Job without a pod: the Job controller's ``FailedCreate`` events say why (a quota is a wait for
    capacity; PodSecurity, a LimitRange or a webhook's denial are not), bounded either way."""
    name = job["metadata"]["name"]
    annotations = job["metadata"].get("annotations") or {}
    since = _started(job, now)
    refused = [e for e in warnings if e.get("reason") == "FailedCreate"]
    why = str(refused[-1].get("message") or "") if refused else ""
    quota = _QUOTA in why
    raw = "ExceededQuota" if quota else "FailedCreate" if refused else "PodsNotCreated"
    text = f"its pods cannot be created: {why}" if refused else "no pod has been created yet"
    bound = _bound(annotations, ANNOTATION_UNSCHEDULABLE if quota else ANNOTATION_START)
    if now - since > bound:
        text = f"{text} ({now - since:.0f} s, more than {bound:.0f} s)"
        return JobStatus(JobState.ERROR, f"Job {name}: {text}", raw_state=raw)
    return JobStatus(
        JobState.PENDING, f"Job {name}: {text}", raw_state=raw, capacity_wait_since=since if quota else None
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


# ----------------------------------------------------------------------------- what a poll reads


def was_resumed(job: dict[str, Any]) -> bool:
    """Whether its submission finished: resumed by us (it may be suspended again since, by a queue)."""
    return not job["spec"].get("suspend") or ANNOTATION_RESUMED in (job["metadata"].get("annotations") or {})


Owned = dict[str, tuple[dict[str, Any] | None, list[dict[str, Any]]]]


def owned_by(job_ids: list[str], jobs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> Owned:
    """Each watched job's Job (None when gone) and its own pods, by job id."""
    by_id = {(j["metadata"].get("labels") or {}).get(ct.LABEL_JOB_ID): j for j in jobs}
    pods_by_id: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        pods_by_id.setdefault((pod["metadata"].get("labels") or {}).get(ct.LABEL_JOB_ID, ""), []).append(pod)
    return {job_id: (by_id.get(job_id), pods_by_id.get(job_id, [])) for job_id in job_ids}


def all_events_needed(owned: Owned, now: float) -> list[str]:
    """:func:`events_needed` over every watched job."""
    return [uid for job, pods in owned.values() if job is not None for uid in events_needed(job, pods, now)]


def warning_selector(uid: str) -> str:
    """The field selector of the Warning events about one object."""
    return f"involvedObject.uid={uid},type=Warning"


def oldest_first(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")


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


def active_pods(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods that run or will (``Pending`` or ``Running``; a pod being deleted stays ``Running`` through its
    termination grace)."""
    return [p for p in pods if (p.get("status") or {}).get("phase") in ("Pending", "Running")]


def _running(pod: dict[str, Any]) -> bool:
    return pod["status"].get("phase") == "Running" and "running" in ((_container(pod).get("state")) or {})


def termination_of(pod: dict[str, Any]) -> dict[str, Any] | None:
    """How the job's container in the pod ended (``state.terminated``), None while it has not."""
    return ((_container(pod).get("state")) or {}).get("terminated")


def culprit_of(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The pod that failed the job: the first failed one (evicted before the rest), else rank 0."""
    failed = [p for p in pods if p["status"].get("phase") == "Failed"]
    return min(failed, key=lambda p: (termination_of(p) or {}).get("finishedAt") or "", default=None) or rank0_pod(pods)


def _waiting(pod: dict[str, Any], warnings: list[dict[str, Any]]) -> _Waiting | None:
    """Why a pending pod does not run: the scheduler's verdict first (unschedulable, gated: a wait for capacity),
    then its container's waiting reason; ``ContainerCreating`` says more through the pod's newest Warning event."""
    conditions = {c["type"]: c for c in pod["status"].get("conditions") or []}
    scheduled = conditions.get("PodScheduled")
    created = epoch(pod["metadata"].get("creationTimestamp")) or time.time()
    if scheduled is not None and scheduled.get("status") == "False":
        since = epoch(scheduled.get("lastTransitionTime")) or created
        reason = str(scheduled.get("reason") or "Unschedulable")
        return _Waiting(reason, str(scheduled.get("message") or ""), since, ANNOTATION_UNSCHEDULABLE, capacity=True)
    waiting = ((_container(pod).get("state")) or {}).get("waiting")
    if waiting is None:
        return None
    since = epoch((scheduled or {}).get("lastTransitionTime")) or created
    reason = str(waiting.get("reason") or "Waiting")
    if reason not in _WAITING_BENIGN:
        return _Waiting(reason, str(waiting.get("message") or ""), since, ANNOTATION_START)
    if warnings:
        event = warnings[-1]
        message = str(event.get("message") or "")
        hint = _MULTI_ATTACH_HINT if "Multi-Attach" in message else ""
        return _Waiting(str(event.get("reason") or reason), f"{reason}: {message}{hint}", since, ANNOTATION_START)
    return _Waiting(reason, str(waiting.get("message") or ""), since)  # an image pull: the kubelet bounds it


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
    """A Job still suspended past :data:`SETUP_TIMEOUT_SECONDS` that we never resumed and nobody canceled: its
    submitting worker died. (One we resumed and a queue such as Kueue suspended again waits for capacity.)"""
    meta = job["metadata"]
    created = epoch(meta.get("creationTimestamp")) or now
    resumed = ANNOTATION_RESUMED in (meta.get("annotations") or {})
    return (
        bool(job["spec"].get("suspend"))
        and not resumed
        and not is_canceled(job)
        and now - created > SETUP_TIMEOUT_SECONDS
    )


def epoch(stamp: str | None) -> float | None:
    """An API timestamp (RFC 3339, whole seconds) as epoch seconds."""
    return float(ct.cursor_second(stamp)) if stamp else None
