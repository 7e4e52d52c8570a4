"""The shared job vocabulary: value objects that cross the operator / hook / trigger boundaries as JSON.

Everything here is plain data with ``to_json()`` / ``from_json()`` so that it survives trigger kwargs
(``airflow.sdk.serde``), ``task_state_store`` and XCom without custom deserialisation allow-lists.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum, StrEnum
from typing import Any


class JobState(StrEnum):
    """The one state vocabulary of every platform (values are the TAO SDK's words)."""

    PENDING = "Pending"
    RUNNING = "Running"
    PAUSED = "Paused"
    CANCELING = "Canceling"
    COMPLETE = "Complete"
    ERROR = "Error"
    CANCELED = "Canceled"
    # The backend could not be asked or did not know the job. Never a failure by itself.
    UNKNOWN = "Unknown"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def is_active(self) -> bool:
        return self in ACTIVE_STATES


#: Consecutive "the platform does not know this job" answers after which a watched job counts as gone (one such
#: answer can be a listing racing the job's creation or an eventually consistent API).
NOT_FOUND_POLLS = 2

TERMINAL_STATES = frozenset({JobState.COMPLETE, JobState.ERROR, JobState.CANCELED})
ACTIVE_STATES = frozenset({JobState.PENDING, JobState.RUNNING, JobState.PAUSED, JobState.CANCELING})


class ErrClass(StrEnum):
    """Failure classes shared by every platform (see ``failures.py`` for how they are decided)."""

    ERR_PROGRAM = "ERR_PROGRAM"
    ERR_OOM = "ERR_OOM"
    ERR_CONFIG = "ERR_CONFIG"
    ERR_INFRA = "ERR_INFRA"
    ERR_PREEMPTED = "ERR_PREEMPTED"
    ERR_CAPACITY = "ERR_CAPACITY"
    ERR_IMAGE_PULL = "ERR_IMAGE_PULL"
    ERR_AUTH = "ERR_AUTH"
    ERR_TIMEOUT = "ERR_TIMEOUT"
    ERR_BUDGET = "ERR_BUDGET"  # the job passed its max_gpu_hours
    ERR_CANCELED = "ERR_CANCELED"
    ERR_UNKNOWN = "ERR_UNKNOWN"

    @property
    def retriable(self) -> bool:
        return self in RETRIABLE_CLASSES


# A retry can help only when the cause is outside the job: the same program on the same input fails again.
RETRIABLE_CLASSES = frozenset({ErrClass.ERR_INFRA, ErrClass.ERR_PREEMPTED, ErrClass.ERR_CAPACITY, ErrClass.ERR_UNKNOWN})


class _JsonValue:
    """Mixin: dataclass <-> JSON-primitive dict, ignoring unknown keys so old stored values still load."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)  # type: ignore[call-overload]
        for key, value in data.items():
            if isinstance(value, Enum):
                data[key] = value.value
        return data

    @classmethod
    def _known(cls, data: dict[str, Any]) -> dict[str, Any]:
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True)
class JobSpec(_JsonValue):
    """What to run, independent of the platform.

    :param name: deterministic job name (the same for every try of one task instance).
    :param job_id: unique id of this submission; exported into the job as ``TAO_JOB_ID``.
    :param command: a string (run by exactly one ``/bin/bash -c``) or an argv list (no shell).
    :param image: container image URI; optional on ``local``.
    :param gpu_count: 0 = none, N = N GPUs, -1 = every visible GPU.
    :param num_nodes: number of nodes (multi-node where the platform supports it).
    :param env: plain environment variables.
    :param secret_env: environment variables holding secrets; never logged, never on a command line.
    :param files: ``relative name -> bytes`` staged by the platform into a folder exported as ``TAO_JOB_FILES``
        (sizes are known up front, so a platform can pick its channel: a Kubernetes ConfigMap holds 1 MiB).
    :param backend_details: platform-specific keyword arguments.
    :param results_uri: explicit results location; wins over every platform default.
    :param deadline: absolute epoch seconds after which the job must not keep running.
    :param origin: the task instance that submits it (``dag_id``, ``task_id``, ``run_id``, ``map_index``), for
        platforms that label their jobs with it.
    """

    name: str
    job_id: str
    command: str | list[str]
    image: str | None = None
    gpu_count: int = 1
    num_nodes: int = 1
    env: dict[str, str] = field(default_factory=dict)
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)
    files: dict[str, bytes] = field(default_factory=dict, repr=False)
    backend_details: dict[str, Any] = field(default_factory=dict)
    results_uri: str | None = None
    deadline: float | None = None
    origin: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON form *without* secret values (only their names survive), safe to store or log."""
        data = super().to_json()
        data["secret_env"] = dict.fromkeys(self.secret_env, "***")
        data["files"] = self.file_sizes()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobSpec:
        known = cls._known(data)
        known.pop("files", None)  # the JSON form keeps sizes only
        return cls(**known)

    def file_sizes(self) -> dict[str, int]:
        """``name -> size in bytes`` of the staged files."""
        return {name: len(content) for name, content in self.files.items()}


@dataclass(frozen=True)
class JobHandle(_JsonValue):
    """Identifies one submitted job; stored in ``task_state_store`` and passed to the trigger.

    :param platform: platform name (``local``, ``slurm``, ...).
    :param conn_id: Airflow connection id, or None for a platform's defaults.
    :param job_id: our id of the submission (``TAO_JOB_ID`` inside the job).
    :param name: the deterministic job name.
    :param backend_job_id: the platform's own id (SLURM job id, container id, pid, ...).
    :param results_dir: where the job's results land.
    :param try_number: the task try that owns the job (submitted it or took it over).
    :param submitted_at: epoch seconds of the submission.
    :param console_url: a link to the job for humans, if the platform has one.
    """

    platform: str
    conn_id: str | None
    job_id: str
    name: str
    backend_job_id: str = ""
    results_dir: str = ""
    try_number: int = 1
    submitted_at: float = field(default_factory=time.time)
    console_url: str = ""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobHandle:
        return cls(**cls._known(data))

    def owned_by(self, try_number: int) -> JobHandle:
        """The same job, taken over by another try."""
        return replace(self, try_number=try_number)


@dataclass(frozen=True)
class JobStatus(_JsonValue):
    """One observation of a job.

    :param state: the shared state.
    :param message: human-readable detail (reason a job is pending, why it failed, ...).
    :param exit_code: the program's exit code once known (negative = killed by that signal).
    :param raw_state: the platform's own word for the state.
    :param updated_at: epoch seconds; the backend's time where it reports one.
    :param not_found: the platform answered and does not know the job (state is ``Unknown``): it never ran,
        was deleted, or aged out of the platform's history.
    :param capacity_wait_since: set while the job is Pending *for lack of resources*, as its backend says so
        (Kubernetes: a pod the scheduler finds Unschedulable; Lepton: Queueing / NoCapacity; SLURM: a pending reason
        such as Resources, Priority or PartitionDown): epoch seconds since when, from the backend's own record
        (the pod condition's transition, the job's creation, the submit time), so any process judges it alike.
        None while the job waits for anything else (an image pull, a dependency) or does not wait.
    """

    state: JobState
    message: str = ""
    exit_code: int | None = None
    raw_state: str = ""
    updated_at: float = field(default_factory=time.time)
    not_found: bool = False
    capacity_wait_since: float | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobStatus:
        known = cls._known(data)
        known["state"] = JobState(known["state"])
        return cls(**known)

    def capacity_waited(self, now: float) -> float | None:
        """Seconds the job has been waiting for resources at ``now``; None when it is not waiting for them."""
        if self.state is not JobState.PENDING or self.capacity_wait_since is None:
            return None
        return max(0.0, now - self.capacity_wait_since)

    def capacity_wait_over(self, timeout: float | None, now: float) -> str | None:
        """Why the job has waited for resources longer than ``timeout`` seconds (a capacity failover's reason), or
        None while it has not (or is not waiting for resources, or there is no bound). The trigger and the worker's
        wait both ask this of each status, so the clock is the backend's and survives a triggerer restart."""
        waited = self.capacity_waited(now)
        if timeout is None or waited is None or waited < timeout:
            return None
        return f"waited {waited:.0f} s for resources (capacity_timeout {timeout:g} s): {self.message}"

    @classmethod
    def unknown(cls, message: str) -> JobStatus:
        """The platform could not be asked (an outage): never a failure by itself."""
        return cls(state=JobState.UNKNOWN, message=message)

    @classmethod
    def missing(cls, message: str) -> JobStatus:
        """The platform answered that it does not know the job."""
        return cls(state=JobState.UNKNOWN, message=message, not_found=True)


@dataclass(frozen=True)
class FailureAnalysis(_JsonValue):
    """Why a job failed and what to do about it.

    :param err_class: the failure class.
    :param retriable: whether another try can help.
    :param suggestion: what the user should do.
    :param evidence: the log lines / events the decision rests on.
    :param details: platform facts (exit code, signal, node, raw state, ...).
    """

    err_class: ErrClass
    retriable: bool
    suggestion: str
    evidence: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FailureAnalysis:
        known = cls._known(data)
        known["err_class"] = ErrClass(known["err_class"])
        return cls(**known)

    def summary(self) -> str:
        """One line for the task log; names the class literally so people can grep for it."""
        return f"{self.err_class.value} ({'retriable' if self.retriable else 'not retriable'}): {self.suggestion}"
