"""How a stretch of Unknown is reported, shared by the trigger and the operator's worker-side wait.

An outage (the platform does not answer, a status call fails) is never a verdict on the job: the wait goes on until
the job ends or the task's ``execution_timeout`` stops it. The task log says when the outage starts, every
``[tao] outage_report_seconds`` while it lasts, and when it ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from airflow_provider_tao.jobs import JobState, JobStatus

T = TypeVar("T")


class OutageLog:
    """Reports stretches of Unknown to ``log``.

    :param log: the logger of the task (or trigger) that waits.
    :param platform: the platform's name, for the messages.
    :param every: seconds between reports of a continuing outage.
    """

    def __init__(self, log: Any, platform: str, every: float) -> None:
        self.log, self.platform, self.every = log, platform, every
        self.since: float | None = None
        self.reported = 0.0

    def update(self, status: JobStatus) -> None:
        """Take the latest status; a known state (or a not-found answer, which is an answer) ends an outage."""
        now = time.monotonic()
        if status.state is not JobState.UNKNOWN or status.not_found:
            self._answered(now)
            return
        if self.since is None:
            self.since = self.reported = now
            self.log.warning(
                "The %s platform does not answer (%s); still waiting: an outage never fails the task, only its "
                "execution_timeout ends the wait",
                self.platform,
                status.message,
            )
        elif now - self.reported >= self.every:
            self.reported = now
            self.log.warning(
                "The %s platform has not answered for %.0f s (%s)", self.platform, now - self.since, status.message
            )

    def _answered(self, now: float) -> None:
        if self.since is not None:
            self.log.warning("The %s platform answers again after %.0f s", self.platform, now - self.since)
        self.since = None

    def through(self, call: Callable[[], T], what: str, interval: float) -> T:
        """``call`` -- a platform call the task cannot do without (marking a finished job's result used) -- tried
        every ``interval`` seconds while it fails, reported as an outage: an outage after the job ended fails the
        task no more than one during the wait (only ``execution_timeout`` ends it).

        :param call: the platform call.
        :param what: what it does, for the messages.
        :param interval: seconds between tries.
        """
        while True:
            try:
                result = call()
            except Exception as exc:
                self.update(JobStatus.unknown(f"{what} failed: {exc}"))
                time.sleep(interval)
                continue
            self._answered(time.monotonic())
            return result
