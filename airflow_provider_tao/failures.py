"""The failure taxonomy: one classifier for every platform.

Hooks collect *facts* (exit code, signal, OOM flag, the platform's raw state, a log tail, node events) into
:class:`FailureFacts`; :func:`classify` turns them into a :class:`~airflow_provider_tao.jobs.FailureAnalysis`.
The order of the rules matters: explicit evidence (the runner's own verdict, the platform's state, the kernel's
OOM flag) beats log signatures, and log signatures beat the bare exit code. A CUDA out-of-memory error is a
program error (the same program fails again), never infrastructure.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_tao.jobs import ErrClass, FailureAnalysis
from airflow_provider_tao.runner.job.progress import FAILURE_PREFIX

#: Prefix of the line the in-job runner prints when it fails by itself.
RUNNER_FAILURE_PREFIX = FAILURE_PREFIX

SUGGESTIONS: dict[ErrClass, str] = {
    ErrClass.ERR_PROGRAM: "The training program failed. Read the evidence and the job log; "
    "a retry runs the same code on the same input and fails again.",
    ErrClass.ERR_OOM: "The job ran out of memory. Lower the batch size or model size, enable gradient "
    "checkpointing / mixed precision, or ask for GPUs/nodes with more memory.",
    ErrClass.ERR_CONFIG: "The job is misconfigured (missing or denied input, bad spec, unknown command). "
    "Fix the task's parameters or the connection; a retry will not help.",
    ErrClass.ERR_INFRA: "The platform failed under the job (node, network or GPU fault). "
    "It is safe to retry; if it repeats, exclude the node or contact the cluster admins.",
    ErrClass.ERR_PREEMPTED: "The job was preempted by the scheduler. It is safe to retry; consider a "
    "non-preemptible partition/queue or checkpointing more often.",
    ErrClass.ERR_CAPACITY: "The platform had no capacity for the request. Retry later, ask for fewer GPUs, "
    "or choose another partition/instance type.",
    ErrClass.ERR_IMAGE_PULL: "The container image could not be pulled. Check the image name/tag and the "
    "registry credentials of the connection.",
    ErrClass.ERR_AUTH: "The platform rejected the credentials. Update the Airflow connection's token or key.",
    ErrClass.ERR_TIMEOUT: "The job hit its time limit. Raise execution_timeout / the wall-time limit, or "
    "resume from the last checkpoint.",
    ErrClass.ERR_BUDGET: "The job passed its max_gpu_hours (GPUs x hours run, from the platform's times) and was "
    "canceled. Raise max_gpu_hours, ask for fewer GPUs, or resume from the last checkpoint.",
    ErrClass.ERR_CANCELED: "The job was canceled.",
    ErrClass.ERR_UNKNOWN: "The cause could not be determined from the platform's facts. Read the job log.",
}


@dataclass(frozen=True)
class _Signature:
    pattern: re.Pattern[str]
    err_class: ErrClass


def _sig(regex: str, err_class: ErrClass) -> _Signature:
    return _Signature(re.compile(regex, re.IGNORECASE), err_class)


# Ordered: the first class with a match wins. Program-side GPU errors come before infra so that e.g.
# "RuntimeError: CUDA error: out of memory" is OOM and "device-side assert" is a program bug.
LOG_SIGNATURES: tuple[_Signature, ...] = (
    _sig(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED", ErrClass.ERR_OOM),
    _sig(r"^\s*MemoryError\b|std::bad_alloc|Cannot allocate memory", ErrClass.ERR_OOM),
    _sig(r"device-side assert triggered|CUDA error: an illegal memory access", ErrClass.ERR_PROGRAM),
    # srun saw a task killed from outside (SIGKILL/SIGTERM, no OOM verdict): Slurm's accounting may still say
    # "FAILED 9:0", which reads as the program's own exit code 9 -- who sent the signal cannot be told
    _sig(r"srun: error: .*task \d+: (?:Killed|Terminated|Exited with exit code 1(?:37|43))\b", ErrClass.ERR_UNKNOWN),
    _sig(r"Xid\b.*\d|uncorrectable ECC error|GPU has fallen off the bus|NVLink error", ErrClass.ERR_INFRA),
    _sig(
        r"NCCL (?:WARN|error).*(?:unhandled system error|remote process exited|Connection reset|timeout)",
        ErrClass.ERR_INFRA,
    ),
    _sig(
        r"no CUDA-capable device is detected|CUDA driver version is insufficient|Failed to initialize NVML",
        ErrClass.ERR_INFRA,
    ),
    # two more of the TAO SDK's SLURM node-fault patterns that never come from the program itself
    _sig(r"Unable to determine the device handle for GPU|NVIDIA driver on your system is too old", ErrClass.ERR_INFRA),
    _sig(
        r"ImagePullBackOff|ErrImagePull|manifest unknown|pull access denied|failed to pull image",
        ErrClass.ERR_IMAGE_PULL,
    ),
    _sig(r"\b401 Unauthorized\b|invalid (?:api )?token|authentication failed", ErrClass.ERR_AUTH),
    _sig(
        r"Insufficient (?:nvidia\.com/gpu|gpu|capacity)|no capacity|out of capacity|QOSMaxGRESPerUser",
        ErrClass.ERR_CAPACITY,
    ),
    _sig(r"DUE TO PREEMPTION", ErrClass.ERR_PREEMPTED),
    _sig(r"DUE TO TIME LIMIT", ErrClass.ERR_TIMEOUT),
)

# The platform's own words for a state, upper-cased (SLURM, Kubernetes, Docker, Lepton, Brev).
RAW_STATE_CLASSES: dict[str, ErrClass] = {
    "PREEMPTED": ErrClass.ERR_PREEMPTED,
    "NODE_FAIL": ErrClass.ERR_INFRA,
    "BOOT_FAIL": ErrClass.ERR_INFRA,
    "LOST": ErrClass.ERR_INFRA,
    "TIMEOUT": ErrClass.ERR_TIMEOUT,
    "DEADLINE": ErrClass.ERR_TIMEOUT,
    "DEADLINEEXCEEDED": ErrClass.ERR_TIMEOUT,
    "OUT_OF_MEMORY": ErrClass.ERR_OOM,
    "OOMKILLED": ErrClass.ERR_OOM,
    "IMAGEPULLBACKOFF": ErrClass.ERR_IMAGE_PULL,
    "ERRIMAGEPULL": ErrClass.ERR_IMAGE_PULL,
    "INVALIDIMAGENAME": ErrClass.ERR_IMAGE_PULL,
    # Kubernetes: a pod evicted by its node or disrupted (preemption, drain), never scheduled, or never configured
    "EVICTED": ErrClass.ERR_PREEMPTED,
    "DISRUPTIONTARGET": ErrClass.ERR_PREEMPTED,
    "UNSCHEDULABLE": ErrClass.ERR_CAPACITY,
    "CREATECONTAINERCONFIGERROR": ErrClass.ERR_CONFIG,
    "CREATECONTAINERERROR": ErrClass.ERR_CONFIG,
    # Kubernetes waits with a bound (hooks/kubernetes/status.py): a scheduling gate or a quota never lifted is
    # capacity; pods the cluster's policy refuses (PodSecurity, LimitRange, a webhook) or a volume that cannot be
    # mounted (a ReadWriteOnce claim in use elsewhere) are the job's configuration; an image never to be pulled
    "SCHEDULINGGATED": ErrClass.ERR_CAPACITY,
    "EXCEEDEDQUOTA": ErrClass.ERR_CAPACITY,
    "FAILEDCREATE": ErrClass.ERR_CONFIG,
    "FAILEDMOUNT": ErrClass.ERR_CONFIG,
    "FAILEDATTACHVOLUME": ErrClass.ERR_CONFIG,
    "ERRIMAGENEVERPULL": ErrClass.ERR_IMAGE_PULL,
    # Lepton: queued past the capacity bound; a replica's image pull failed; a replica stuck on its node's fault
    # (readiness ConfigError such as "Mount point not found") or never ready past the start bound
    "NOCAPACITY": ErrClass.ERR_CAPACITY,
    "IMAGEPULLFAILED": ErrClass.ERR_IMAGE_PULL,
    "CONFIGERROR": ErrClass.ERR_INFRA,
    "STARTTIMEOUT": ErrClass.ERR_INFRA,
    # Brev: the instance under the job failed, went unhealthy or is being deleted
    "FAILURE": ErrClass.ERR_INFRA,
    "UNHEALTHY": ErrClass.ERR_INFRA,
    "DELETING": ErrClass.ERR_INFRA,
    "CANCELLED": ErrClass.ERR_CANCELED,
    "CANCELED": ErrClass.ERR_CANCELED,
}

_EXIT_CONFIG = {126: "the command is not executable", 127: "the command was not found"}
_PROGRAM_SIGNALS = {signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL}
_EVIDENCE_LINES = 12


@dataclass(frozen=True)
class FailureFacts:
    """What a platform knows about a failed job.

    :param exit_code: the program's exit code (128+N or -N for signal N).
    :param raw_state: the platform's own state word (``NODE_FAIL``, ``OOMKilled``, ...).
    :param oom_killed: the kernel / container runtime reported an OOM kill.
    :param canceled: the job was canceled.
    :param timed_out: the job ran past its deadline or wall time.
    :param log_tail: the last lines of the job log.
    :param events: platform events (node conditions, scheduler reasons), newest last.
    :param message: the platform's status message.
    :param details: extra facts copied into the analysis.
    """

    exit_code: int | None = None
    raw_state: str = ""
    oom_killed: bool = False
    canceled: bool = False
    timed_out: bool = False
    log_tail: Sequence[str] = ()
    events: Sequence[str] = ()
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)


def signal_of(exit_code: int | None) -> signal.Signals | None:
    """The signal that ended a process, from a shell-style (128+N) or Python-style (-N) exit code."""
    if exit_code is None:
        return None
    number = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 160 else 0
    try:
        return signal.Signals(number) if number else None
    except ValueError:
        return None


def runner_verdict(lines: Sequence[str]) -> tuple[ErrClass, str] | None:
    """The in-job runner's own classification, if it printed one (the last one wins)."""
    for line in reversed(lines):
        start = line.find(RUNNER_FAILURE_PREFIX)
        if start < 0:
            continue
        try:
            payload = json.loads(line[start + len(RUNNER_FAILURE_PREFIX) :])
            return ErrClass(payload["err_class"]), str(payload.get("message", ""))
        except (ValueError, KeyError, TypeError, RecursionError):  # the job's own text: anything can be there
            continue
    return None


def _matching(lines: Sequence[str]) -> tuple[ErrClass, list[str]] | None:
    for sig in LOG_SIGNATURES:
        hits = [line for line in lines if sig.pattern.search(line)]
        if hits:
            return sig.err_class, hits[-_EVIDENCE_LINES:]
    return None


def _analysis(err_class: ErrClass, facts: FailureFacts, evidence: list[str], why: str = "") -> FailureAnalysis:
    details: dict[str, Any] = {"exit_code": facts.exit_code, "raw_state": facts.raw_state, **facts.details}
    if (sig := signal_of(facts.exit_code)) is not None:
        details["signal"] = sig.name
    suggestion = SUGGESTIONS[err_class] if not why else f"{why}. {SUGGESTIONS[err_class]}"
    return FailureAnalysis(
        err_class=err_class,
        retriable=err_class.retriable,
        suggestion=suggestion,
        evidence=evidence,
        details=details,
    )


def classify(facts: FailureFacts) -> FailureAnalysis:
    """Decide the failure class of a job from what its platform knows.

    :param facts: the platform's facts about the failed job.
    """
    lines = [*facts.events, *facts.log_tail]
    if facts.canceled:
        return _analysis(ErrClass.ERR_CANCELED, facts, [facts.message] if facts.message else [])
    if (verdict := runner_verdict(facts.log_tail)) is not None:
        err_class, message = verdict
        return _analysis(err_class, facts, [message], why=message)
    raw = facts.raw_state.replace(" ", "_").upper()
    raw_class = RAW_STATE_CLASSES.get(raw) or RAW_STATE_CLASSES.get(raw.split("_BY_")[0])
    if facts.oom_killed:
        return _analysis(ErrClass.ERR_OOM, facts, [facts.message or "killed by the out-of-memory killer"])
    if facts.timed_out:
        return _analysis(ErrClass.ERR_TIMEOUT, facts, [facts.message] if facts.message else [])
    if raw_class is not None and raw_class is not ErrClass.ERR_CANCELED:
        return _analysis(raw_class, facts, [f"platform state {facts.raw_state}", *_tail(facts.events)])
    if (match := _matching(lines)) is not None:
        return _analysis(match[0], facts, match[1])
    if raw_class is ErrClass.ERR_CANCELED:
        return _analysis(ErrClass.ERR_CANCELED, facts, [f"platform state {facts.raw_state}"])
    if facts.exit_code in _EXIT_CONFIG:
        return _analysis(ErrClass.ERR_CONFIG, facts, _tail(lines), why=_EXIT_CONFIG[facts.exit_code])
    sig = signal_of(facts.exit_code)
    if sig in _PROGRAM_SIGNALS:
        return _analysis(ErrClass.ERR_PROGRAM, facts, _tail(lines), why=f"the program died of {sig.name}")
    if sig is not None:
        # KILL/TERM from outside with no OOM flag or platform verdict: we cannot tell who sent it.
        return _analysis(ErrClass.ERR_UNKNOWN, facts, _tail(lines), why=f"the program was killed by {sig.name}")
    if facts.exit_code:
        return _analysis(
            ErrClass.ERR_PROGRAM,
            facts,
            _traceback_or_tail(lines),
            why=f"the program exited with code {facts.exit_code}",
        )
    return _analysis(ErrClass.ERR_UNKNOWN, facts, _tail(lines))


def _tail(lines: Sequence[str]) -> list[str]:
    return [line for line in lines if line.strip()][-_EVIDENCE_LINES:]


def _traceback_or_tail(lines: Sequence[str]) -> list[str]:
    """The last Python traceback if there is one (its last lines say what went wrong), else the log tail."""
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].startswith("Traceback (most recent call last)"):
            return _tail(lines[index:])
    return _tail(lines)
