"""How the ``lepton`` platform watches its jobs: the status of every watched job of a workspace from ONE job list per
poll (label query, pages of 500), the readiness of the replicas of jobs still starting (the Pending reason: "Pulling
image", ``ConfigError``; every 2 s at first, backing off to every 30 s) and the log of a job's rank-0 replica by
timestamp cursor. The rule that turns a job's JSON into a status is
:func:`~airflow_provider_tao.hooks.lepton.status.job_status`; this module adds what a hook remembers between polls
(since when a job starts, its replicas' last readiness, which jobs have ended).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from typing import Any

from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.hooks.lepton.api import LeptonAPIHook
from airflow_provider_tao.hooks.lepton.status import (
    LABEL_JOB_ID,
    LABEL_MANAGED,
    QUEUE_STATES,
    Readiness,
    created_at,
    id_of,
    is_starting,
    job_status,
    labels_of,
    log_lines,
    readiness_of,
    state_of,
)
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.jobs import JobHandle, JobState, JobStatus

#: A starting job's replicas are asked why they are not ready at most this often: every 2 s at first, backing off
#: with the time it has been starting, to 30 s (a failed image pull shows within seconds, a long pull costs little).
READINESS_FIRST = 2.0
READINESS_EVERY = 30.0
#: Jobs missing from the list that are looked up one by one in one poll (deleted / archived ones).
MISSING_LOOKUPS_PER_POLL = 20
#: Log lines younger than this are shown at the next read (Lepton collects logs asynchronously; a line stamped
#: earlier than one already shown would otherwise be skipped). An ended job's log is read to its end.
LOG_SETTLE_NS = 2 * 10**9
LOG_LIMIT = 5000
#: A log read ends this far past the later of the Airflow host's clock and the cursor: the lines are stamped by the
#: nodes' clocks, which may run ahead of this host's (the client refuses ``end <= start`` outright).
LOG_END_SLACK_NS = 3600 * 10**9


class LeptonWatchHook(LeptonAPIHook):
    """Statuses and logs of :class:`~airflow_provider_tao.hooks.lepton.LeptonHook` (its base; not a platform by
    itself).

    :param conn_id: the ``tao_lepton`` connection, or None for the environment's ``LEPTON_*`` variables.
    """

    def __init__(self, conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(conn_id, **kwargs)
        self._readiness: dict[str, tuple[float, Readiness | None]] = {}
        self._starting_since: dict[str, float] = {}
        self._queued: set[str] = set()
        self._ended: set[str] = set()
        self._log_replica: dict[str, str] = {}

    # ----------------------------------------------------------------- status

    def get_job_status(self, handle: JobHandle) -> JobStatus:
        """One job's status; a platform that does not answer is Unknown (an outage), never an error."""
        self._ready()
        try:
            return self.get_job_statuses([handle])[handle.job_id]
        except JobValidationError:
            raise
        except Exception as exc:
            return JobStatus.unknown(f"the Lepton API did not answer: {exc}")

    def get_job_statuses(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        """ONE job list (pages of 500) for every handle; jobs missing from it (deleted, archived) are looked up one
        by one, and starting jobs' replicas are asked for their readiness (every 2 s at first, backing off to 30 s)."""
        narrow = f",{LABEL_JOB_ID}={handles[0].job_id}" if len(handles) == 1 else ""
        listed = self._list_jobs(f"{LABEL_MANAGED}=true{narrow}", wanted=[h.job_id for h in handles])
        jobs = {labels_of(j).get(LABEL_JOB_ID): j for j in listed}
        statuses: dict[str, JobStatus] = {}
        now = time.time()
        lookups = 0
        for handle in handles:
            job = jobs.get(handle.job_id)
            looked_up = False
            if job is None and lookups < MISSING_LOOKUPS_PER_POLL and handle.backend_job_id:
                lookups, looked_up = lookups + 1, True
                job = self._get_job(handle.backend_job_id)
                if job is not None and labels_of(job).get(LABEL_JOB_ID) not in (None, handle.job_id):
                    job = None  # the id now belongs to a newer job of the same name
            if job is None and handle.backend_job_id and not looked_up:
                # not looked up in this poll: absent from one list is not gone (a page may have been missed)
                statuses[handle.job_id] = JobStatus.unknown(
                    f"Lepton job {handle.backend_job_id} was not in this poll's job list; it is looked up next time"
                )
                continue
            if job is None:
                statuses[handle.job_id] = JobStatus.missing(
                    f"Lepton job {handle.backend_job_id or handle.name} no longer exists: it was deleted outside "
                    "Airflow or expired after ttl_seconds_after_finished"
                )
                continue
            statuses[handle.job_id] = self._status_of(handle.job_id, job, now)
        return statuses

    def _status_of(self, job_id: str, job: dict[str, Any], now: float) -> JobStatus:
        """:func:`job_status` with what this hook remembers: since when the job starts (the moment this hook saw it
        leave the queue; its creation when it never saw it queueing -- a new hook judges no later than the one that
        watched it), and, for a job starting now, its replicas' readiness, read afresh before a verdict rests on it."""
        if state_of(job) in QUEUE_STATES:
            self._queued.add(job_id)
        readiness = None
        if is_starting(job):
            self._starting_since.setdefault(job_id, now if job_id in self._queued else (created_at(job) or now))
            readiness = self._readiness_of(job_id, id_of(job), now)
        else:
            self._starting_since.pop(job_id, None)
        status = job_status(job, now, readiness, self._starting_since.get(job_id))
        if status.state is JobState.ERROR and is_starting(job):
            status = job_status(
                job, now, self._readiness_of(job_id, id_of(job), now, fresh=True), self._starting_since.get(job_id)
            )
        if status.state.is_terminal:
            self._ended.add(job_id)
        return status

    def _readiness_of(self, job_id: str, backend_id: str, now: float, fresh: bool = False) -> Readiness | None:
        fetched, readiness = self._readiness.get(job_id, (0.0, None))
        starting = now - self._starting_since.get(job_id, now)
        if fresh or now - fetched >= min(READINESS_EVERY, max(READINESS_FIRST, starting / 2)):
            try:
                readiness = readiness_of(self.get_job_replicas(backend_id))
            except JobValidationError:
                raise
            except Exception as exc:  # the reason is a detail; the status stands without it
                self.log.debug("Reading the replicas of %s failed: %s", backend_id, exc)
            self._readiness[job_id] = (now, readiness)
        return readiness

    async def aget_job_statuses(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        await self._aready()
        return await asyncio.to_thread(self.get_job_statuses, list(handles))

    # ----------------------------------------------------------------- logs

    def _rank0_replica(self, handle: JobHandle) -> str | None:
        """The replica whose log is the job's: index 0 (``<job id>-0-xxxxx``, the Kubernetes Indexed Job pod name;
        that Lepton names replicas so is not documented), else the first the server lists, as ``lep job log``
        picks it (leptonai 0.47.1 ``cli/job.py`` ``log``: ``replicas[0]``)."""
        if replica := self._log_replica.get(handle.job_id):
            return replica
        ids = [str(r.get("id") or (r.get("metadata") or {}).get("id")) for r in self.get_job_replicas(handle)]
        rank0 = re.compile(rf"^{re.escape(handle.backend_job_id)}-0-[a-z0-9]+$")
        replica = next((i for i in ids if rank0.match(i)), ids[0] if ids else None)
        if replica:
            self._log_replica[handle.job_id] = replica
        return replica

    def get_job_logs(self, handle: JobHandle, cursor: str = "", tail: int | None = None) -> tuple[str, str]:
        """The log of the job's rank-0 replica through the log API, by ``<timestamp ns>#<lines at it>`` cursor: each
        read asks from the last timestamp shown and drops what was shown (no repeats, no gaps)."""
        from leptonai.api.v2.log import LogAPIError

        self._ready()
        replica = self._rank0_replica(handle)
        if replica is None:
            return "", cursor
        now = time.time_ns()
        last, _ = ct.parse_log_cursor("" if tail is not None else cursor)
        start = last or str(int((handle.submitted_at - 60) * 1e9))
        end = str(max(now, int(start)) + LOG_END_SLACK_NS)
        backward = tail is not None

        def call(client: Any) -> dict[str, Any]:
            return dict(
                client.log.get_log(
                    name_or_job=handle.backend_job_id,
                    replica=replica,
                    start=start,
                    end=end,
                    limit=tail if backward else LOG_LIMIT,
                    direction="backward" if backward else "forward",
                )
            )

        try:
            data = self._api("reading the job log", call)
        except LogAPIError as exc:
            if exc.status_code in (400, 404):
                return "", cursor
            raise
        lines = sorted(log_lines(data))
        if tail is None and handle.job_id not in self._ended:
            settled = str(now - LOG_SETTLE_NS).zfill(19)
            lines = [line for line in lines if line[0] <= settled]
        return ct.read_after(lines, "" if tail is not None else cursor)

    def log_read_reached_end(self, text: str) -> bool:
        return text.count("\n") < LOG_LIMIT and super().log_read_reached_end(text)  # reads are bounded in lines too

    async def aget_job_logs(self, handle: JobHandle, cursor: str = "", tail: int | None = None) -> tuple[str, str]:
        await self._aready()
        return await asyncio.to_thread(self.get_job_logs, handle, cursor, tail)
