"""How often each watched job's log is read: the log budget of one connection's :class:`StatusPoller`.

Platforms whose one status call also reads every watched job's new log bytes (SLURM, Brev) or whose logs are files
on this host (local) read every watched log at every poll: a read costs no backend call there. The others (Docker,
Kubernetes, Lepton) have no batched log API, so each read is a call of its own; there a connection spends at most
``[tao] log_reads_per_interval`` reads per poll interval:

* an ended job's reads come first: each job that ended at this poll has one read set aside for it, and reads on
  (bounded reads) while the interval has reads left; when they are spent, its trigger reports the end at once and
  the task's worker, resuming, reads the rest of the log from the event's cursor -- no line is lost, and the end
  is noticed no later;
* then the live reads, to the jobs that printed at their last read first; a job whose read brought nothing is read
  less and less often (its gap doubles, up to :data:`QUIET_CEILING_SECONDS`) and every job waiting longer than the
  ceiling goes before them all, so no live job is starved while the budget can serve it.

What a trigger writes to its task log stays in order and complete: a skipped read only moves lines to a later read
from the same cursor.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

#: The longest gap between two live reads of a quiet job (seconds), when the budget allows it.
QUIET_CEILING_SECONDS = 60.0
#: The most bounded reads of an ended job's log (about a GiB at the hooks' bounds): a guard against a log that
#: never stops growing, not a limit any training log meets.
FINAL_LOG_READS = 1024


@dataclass
class _Pace:
    due: float = -math.inf  # monotonic time from which the job's next live read is due (a new job: at once)
    gap: float = 0.0  # seconds between its reads now (doubles while its reads bring nothing)
    printed: bool = True  # its last read brought lines (a new job counts as printing: its backlog is read first)


class LogBudget:
    """The log reads of one connection: which jobs read their log at a poll, and turns for ended jobs' reads.

    :param reads_per_interval: reads a poll interval may spend; None = every watched log at every poll (the
        platform reads logs in its status call or from local files).
    :param ceiling: the longest gap between two live reads of a quiet job, in seconds.
    """

    def __init__(self, reads_per_interval: int | None, ceiling: float = QUIET_CEILING_SECONDS) -> None:
        self.reads_per_interval = reads_per_interval
        self.ceiling = ceiling
        self.tokens = math.inf if reads_per_interval is None else float(reads_per_interval)
        self.granted = 0  # live reads granted and final turns given, for tests and benchmarks
        self._paces: dict[str, _Pace] = {}
        self._reserved: set[str] = set()
        self._refilled = -math.inf

    def plan(
        self, readers: Iterable[str], ending: Iterable[str] = (), interval: float = 0.0, now: float | None = None
    ) -> set[str]:
        """A poll: refill the reads when an ``interval`` has passed since the last refill (an early poll for new jobs
        spends what is left), set one aside for each job that ended at this poll (``ending``), then pick the live
        jobs (``readers``: watched, streaming, not ended) whose log is read at this poll."""
        readers = list(dict.fromkeys(readers))
        if self.reads_per_interval is None:
            self.granted += len(readers)
            return set(readers)
        now = time.monotonic() if now is None else now
        if now - self._refilled >= interval * 0.9:  # a poll a little early still starts a new interval
            self.tokens = float(self.reads_per_interval)
            self._refilled = now
        self._reserved = set()
        for job in dict.fromkeys(ending):
            if self.tokens < 1:
                break
            self._reserved.add(job)
            self.tokens -= 1
        due = [job for job in readers if self._pace(job).due <= now]
        # Waiting past the ceiling first, then the jobs that printed lately, then the longest waiting.
        due.sort(key=lambda job: (now - self._paces[job].due < self.ceiling, not self._paces[job].printed,
                                  self._paces[job].due))  # fmt: skip
        chosen = due[: int(self.tokens)]
        for _ in chosen:
            self._spend()
        return set(chosen)

    def final_turn(self, job_id: str) -> bool:
        """One read of an ended job's log: the one set aside for it, or one this interval has left; False when
        they are spent (never waits: the job's end is not reported later for its log)."""
        if job_id in self._reserved:
            self._reserved.discard(job_id)
            self.granted += 1
            return True
        if self.tokens >= 1:
            self._spend()
            return True
        return False

    def record(self, job_id: str, printed: bool, interval: float, now: float | None = None) -> None:
        """A live read of ``job_id`` brought lines (``printed``) or nothing: when its next read is due."""
        if self.reads_per_interval is None:
            return  # every log at every poll: nothing to pace
        now = time.monotonic() if now is None else now
        pace = self._pace(job_id)
        pace.printed = printed
        pace.gap = interval if printed else min(self.ceiling, max(interval, pace.gap * 2))
        # half an interval early: a read due just after a poll is made at that poll, not one interval later
        pace.due = now + pace.gap - interval / 2

    def forget(self, job_id: str) -> None:
        """The job's watch ended."""
        self._paces.pop(job_id, None)
        self._reserved.discard(job_id)

    def _pace(self, job_id: str) -> _Pace:
        return self._paces.setdefault(job_id, _Pace())

    def _spend(self) -> None:
        self.tokens -= 1
        self.granted += 1
