"""Why a job waits, said in the task log: each change of the job's state with the platform's own reason, a one-line
reminder every ``[tao] outage_report_seconds`` while the job stays pending, and the last waiting reason for the
error that ends the wait (a timeout, no capacity). Shared by the trigger and the operator's worker-side wait.

The reason is the platform's ``JobStatus.message``: the pod's scheduling condition on Kubernetes ("Unschedulable:
0/3 nodes are available: ..."), squeue's reason on SLURM ("PENDING (Resources)"), the Lepton job's queue state, the
Brev instance's build state.
"""

from __future__ import annotations

import time
from typing import Any

from airflow_provider_tao.jobs import JobState, JobStatus


class WaitLog:
    """Reports a job's state changes and its waits to ``log``.

    :param log: the logger of the task (or trigger) that waits.
    :param job_id: the job's id, for the messages.
    :param every: seconds between reminders of a continuing wait.
    """

    def __init__(self, log: Any, job_id: str, every: float) -> None:
        self.log, self.job_id, self.every = log, job_id, every
        self.state: JobState | None = None
        self.reason = ""
        self.pending_since: float | None = None
        self.reminded = 0.0

    def update(self, status: JobStatus) -> None:
        """Take the latest status (Unknown is an outage, reported elsewhere: it changes nothing here)."""
        if status.state is JobState.UNKNOWN:
            return
        now = time.monotonic()
        changed = status.state is not self.state or (status.state is JobState.PENDING and status.message != self.reason)
        if status.state is JobState.PENDING:
            if self.pending_since is None:
                self.pending_since = now
            if changed:
                self.log.info("Job %s is pending: %s", self.job_id, status.message or "no reason given")
                self.reminded = now
            elif now - self.reminded >= self.every:
                self.reminded = now
                self.log.info(
                    "Job %s is still pending after %.0f s: %s", self.job_id, now - self.pending_since, status.message
                )
            self.reason = status.message
        elif changed:
            waited = "" if self.pending_since is None else f" after {now - self.pending_since:.0f} s pending"
            self.log.info("Job %s is %s%s: %s", self.job_id, status.state.value, waited, status.message)
            self.pending_since = None
            self.reason = ""
        self.state = status.state

    def summary(self) -> str:
        """The wait so far, for an error that ends it (``""`` when the job is not pending)."""
        if self.pending_since is None:
            return ""
        waited = time.monotonic() - self.pending_since
        return f"the job was still pending after {waited:.0f} s: {self.reason or 'no reason given'}"
