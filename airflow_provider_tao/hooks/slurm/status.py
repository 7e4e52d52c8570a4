"""How Slurm's answers read: its job states in the shared vocabulary, ``squeue`` / ``sacct`` and what they say, a job's
usage. Pure functions, no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass

from airflow_provider_tao.accounting import JobUsage
from airflow_provider_tao.jobs import JobState, JobStatus

#: Slurm's job states (squeue %T / sacct State, first word) -> the shared vocabulary. The seeds' map with two
#: corrections: PREEMPTED is a (retriable) failure, not Canceled; REQUEUED & co. are Pending (the job runs again).
STATE_MAP: dict[str, JobState] = {
    "PENDING": JobState.PENDING,
    "CONFIGURING": JobState.PENDING,
    "RESIZING": JobState.PENDING,
    "REQUEUED": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "SPECIAL_EXIT": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "SUSPENDED": JobState.PAUSED,
    "STOPPED": JobState.PAUSED,
    "COMPLETED": JobState.COMPLETE,
    "CANCELLED": JobState.CANCELED,
    "REVOKED": JobState.CANCELED,
    "FAILED": JobState.ERROR,
    "BOOT_FAIL": JobState.ERROR,
    "DEADLINE": JobState.ERROR,
    "OUT_OF_MEMORY": JobState.ERROR,
    "NODE_FAIL": JobState.ERROR,
    "TIMEOUT": JobState.ERROR,
    "PREEMPTED": JobState.ERROR,
}


#: Terminal states whose exit code / accounting record is worth one ``sacct``.
NEEDS_ACCOUNTING = frozenset(s for s, js in STATE_MAP.items() if js is JobState.ERROR)
_WHY = {
    "TIMEOUT": "the wall time ran out",
    "NODE_FAIL": "a node of the allocation failed",
    "BOOT_FAIL": "a node failed to boot",
    "PREEMPTED": "preempted by a higher-priority job",
    "OUT_OF_MEMORY": "the job ran out of memory",
    "DEADLINE": "the job's deadline passed",
}


SQUEUE_MARK = b"@@SQ "


def squeue_command(ids: list[str]) -> str:
    """All given jobs, finished ones too (``-t all``; plain ``squeue -j`` prints nothing for finished jobs), with
    their submit time in epoch seconds (``SLURM_TIME_FORMAT=%s``: the cluster's local time needs no time zone)."""
    return f"SLURM_TIME_FORMAT=%s squeue -h -t all -j {','.join(ids)} -o '%i|%T|%r|%N|%V'"


def sacct_command(ids: list[str]) -> str:
    return f"sacct -X -n -P -j {','.join(ids)} -o JobID,State,ExitCode,Reason,NodeList"


@dataclass(frozen=True)
class SlurmRecord:
    job_id: str
    state: str  # first word, upper case: "CANCELLED"
    raw: str  # as printed: "CANCELLED by 1001"
    reason: str = ""
    nodes: str = ""
    exit_code: str = ""  # sacct "N:S"
    submitted: float | None = None  # squeue %V, epoch seconds


def parse_squeue(text: str) -> dict[str, SlurmRecord]:
    records = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 3 and parts[0]:
            state = parts[1].split()[0].rstrip("+").upper() if parts[1].strip() else ""
            nodes = parts[3] if len(parts) > 3 else ""
            submitted = _epoch(parts[4]) if len(parts) > 4 else None
            records[parts[0]] = SlurmRecord(parts[0], state, parts[1], parts[2], nodes, submitted=submitted)
    return records


def _epoch(text: str) -> float | None:
    """A time field printed with ``SLURM_TIME_FORMAT=%s``; None for ``Unknown`` / ``None`` / empty."""
    try:
        return float(text)
    except ValueError:
        return None


#: Pending reasons that mean "no resources for the job now" (the shared capacity-wait notion): the cluster is
#: full or the job waits behind others, the nodes it needs are down or reserved, its partition is down, or an
#: association / QOS limit on resources (GPUs, CPUs, nodes, memory, jobs) holds it. Not capacity: dependencies,
#: begin times, holds, and limits no capacity would lift (wall time above a partition's or QOS's maximum).
CAPACITY_REASONS = frozenset({"Resources", "Priority", "PartitionDown", "PartitionInactive", "ReqNodeNotAvail"})
_CAPACITY_REASON = re.compile(
    r"^(?:ReqNodeNotAvail|Nodes_required_for_job_are_DOWN|(?:QOS|Assoc)(?:Grp|Max)(?!\w*(?:Wall|Time))\w+)"
)


def waits_for_resources(reason: str) -> bool:
    """Whether a pending job's reason (squeue ``%r``) says it waits for resources rather than for anything else."""
    return reason in CAPACITY_REASONS or bool(_CAPACITY_REASON.match(reason))


def parse_sacct(text: str) -> dict[str, SlurmRecord]:
    records = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) >= 3 and parts[0] and "." not in parts[0]:
            raw = parts[1].strip()
            state = raw.split()[0].rstrip("+").upper() if raw else ""
            records[parts[0]] = SlurmRecord(
                parts[0],
                state,
                raw,
                parts[3] if len(parts) > 3 else "",
                parts[4] if len(parts) > 4 else "",
                parts[2],
            )
    return records


def squeue_says_gone(rc: int, stderr: str) -> bool:
    """``squeue -j`` exits 1 with "Invalid job id" when NONE of the ids is known any more: not an error."""
    return rc != 0 and "invalid job id" in stderr.lower()


def exit_code_of(exit_field: str) -> int | None:
    """sacct ``N:S`` -> N, or -S when a signal ended the job; None when unknown."""
    code, _, sig = exit_field.partition(":")
    try:
        number, signal_number = int(code), int(sig or 0)
    except ValueError:
        return None
    return -signal_number if signal_number and not number else number


def status_of(queue: SlurmRecord | None, acct: SlurmRecord | None) -> JobStatus:
    """One job's status from its squeue line (authoritative while present) and its sacct line."""
    record = queue or acct
    if record is None:
        return JobStatus.missing("Slurm knows no such job")
    state = STATE_MAP.get(record.state)
    exit_code = exit_code_of(acct.exit_code) if acct is not None and acct.state == record.state else None
    raw = acct.raw if acct is not None and acct.state == record.state else record.raw
    if state is None:
        return JobStatus(JobState.UNKNOWN, f"unexpected Slurm state {record.raw!r}", raw_state=record.raw)
    capacity_wait_since = None
    if state is JobState.PENDING:
        message = f"{record.state} ({record.reason})" if record.reason and record.reason != "None" else record.state
        if waits_for_resources(record.reason):
            capacity_wait_since = record.submitted
    elif state in (JobState.RUNNING, JobState.PAUSED):
        message = f"{record.state} on {record.nodes}" if record.nodes else record.state
    elif state is JobState.COMPLETE:
        message, exit_code = "COMPLETED, exit code 0", 0
    elif state is JobState.CANCELED:
        message = raw
    else:
        why = _WHY.get(record.state) or (
            f"exit code {exit_code}"
            if exit_code is not None and exit_code >= 0
            else f"killed by signal {-exit_code}"
            if exit_code is not None
            else record.reason or ""
        )
        message = f"{record.state} ({why})" if why else record.state
    return JobStatus(state, message, exit_code=exit_code, raw_state=raw, capacity_wait_since=capacity_wait_since)


def usage_command(slurm_id: str) -> str:
    """The accounting record of one job's allocation: its times in epoch seconds, its elapsed seconds and nodes,
    and the resources it was given (``AllocTRES``: ``gres/gpu=N`` and, where the cluster tracks types,
    ``gres/gpu:<type>=N``)."""
    return f"SLURM_TIME_FORMAT=%s sacct -X -n -P -j {slurm_id} -o JobID,Submit,Start,End,ElapsedRaw,NNodes,AllocTRES"


def parse_usage(text: str, slurm_id: str) -> JobUsage | None:
    """:func:`usage_command`'s answer as a :class:`JobUsage`; None when sacct has no record of the job (yet)."""
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 7 or parts[0] != slurm_id:
            continue
        submitted, started, ended = (_epoch(parts[i]) for i in (1, 2, 3))
        nodes = int(parts[5]) if parts[5].isdigit() else None
        tres = dict(item.split("=", 1) for item in parts[6].split(",") if "=" in item)
        gpus = int(tres.get("gres/gpu", "0") or 0)
        typed = sorted(key.partition(":")[2] for key in tres if key.startswith("gres/gpu:"))
        return JobUsage(
            queued_at=submitted,
            started_at=started,
            ended_at=ended,
            run_seconds=float(parts[4]) if started is not None and parts[4].isdigit() else None,
            gpus_per_node=gpus // nodes if nodes else None,
            nodes=nodes,
            gpu_type=",".join(typed) or None,
            source="sacct Submit/Start/End/ElapsedRaw/AllocTRES",
        )
    return None
