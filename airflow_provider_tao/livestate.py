"""What the platforms say NOW of the jobs whose records have not seen them end, for the TAO jobs view and
``airflow tao jobs``: "what is using GPUs right now?" answered by the platforms, not guessed from task states.

Airflow's records say a job ended only once its task saw it end; a job whose task died, was marked failed without a
kill, or set ``cancel_on_kill=False`` may still run (an orphan still printing ``step 87``), or may have been canceled
by ``airflow tao reap`` since. Those jobs are asked of their platform with the hooks' batched status read
(``get_job_statuses``: ONE call per connection, whatever the number of jobs -- the call the trigger's poller makes),
never one call per row, and the answers are kept for :data:`TTL_SECONDS` so a view refreshed by many people costs
the platforms one call per connection per interval. A platform that does not answer within
:data:`TIMEOUT_SECONDS` leaves its jobs as the records say (``Unknown``), never an error page.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait

from airflow_provider_tao.hooks import PLATFORMS, get_platform_hook
from airflow_provider_tao.jobindex import IndexedJob
from airflow_provider_tao.jobs import JobHandle, JobStatus
from airflow_provider_tao.records import SUBMITTED

log = logging.getLogger(__name__)

#: Seconds the platforms' answers are reused for.
TTL_SECONDS = 15.0
#: Seconds the view waits for the platforms before it shows what the records say.
TIMEOUT_SECONDS = 10.0

Connection = tuple[str, str | None]


def _ask(connection: Connection, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
    """ONE batched status read of ``handles`` on their connection."""
    hook = get_platform_hook(*connection)
    hook.load_connection()
    return hook.get_job_statuses(list(handles))


class LiveStates:
    """The platforms' answers per connection, each kept for ``ttl`` seconds.

    :param ttl: seconds an answer is reused for.
    :param timeout: seconds to wait for the platforms in one :meth:`apply`.
    :param ask: the batched read of one connection (the hooks' ``get_job_statuses``; tests give their own).
    :param clock: monotonic seconds.
    """

    def __init__(
        self,
        ttl: float = TTL_SECONDS,
        timeout: float = TIMEOUT_SECONDS,
        ask: Callable[[Connection, Sequence[JobHandle]], dict[str, JobStatus]] = _ask,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl, self.timeout, self.ask, self.clock = ttl, timeout, ask, clock
        self._answers: dict[Connection, tuple[float, dict[str, JobStatus]]] = {}
        self._lock = threading.Lock()

    def apply(self, jobs: Sequence[IndexedJob]) -> list[IndexedJob]:
        """``jobs``, each whose record has not seen it end carrying its platform's status (``IndexedJob.live``)."""
        wanted: dict[Connection, dict[str, JobHandle]] = {}
        for job in jobs:
            # only a task's own record leads to its platform (an XCom-only record may name another task's job)
            if job.verified and job.record.state == SUBMITTED and job.platform in PLATFORMS:
                wanted.setdefault((job.platform, job.conn_id), {})[job.job_id] = job.record.job
        known = self._statuses(wanted)
        return [dataclasses.replace(job, live=known[job.job_id]) if job.job_id in known else job for job in jobs]

    def _statuses(self, wanted: dict[Connection, dict[str, JobHandle]]) -> dict[str, JobStatus]:
        now = self.clock()
        known: dict[str, JobStatus] = {}
        stale: dict[Connection, dict[str, JobHandle]] = {}
        with self._lock:
            for connection, handles in wanted.items():
                asked_at, answers = self._answers.get(connection, (float("-inf"), {}))
                if now - asked_at < self.ttl and handles.keys() <= answers.keys():
                    known.update({job_id: answers[job_id] for job_id in handles})
                else:
                    stale[connection] = handles
        if not stale:
            return known
        pool = ThreadPoolExecutor(max_workers=min(8, len(stale)), thread_name_prefix="tao-livestate")
        futures = {
            pool.submit(self.ask, connection, list(handles.values())): connection
            for connection, handles in stale.items()
        }
        done, _ = wait(futures, timeout=self.timeout)
        pool.shutdown(wait=False, cancel_futures=True)  # a platform that hangs keeps its thread, not the view
        for future in done:
            connection = futures[future]
            try:
                answers = future.result()
            except Exception as exc:  # the records' word stays: a failed read never changes what is shown
                log.warning("The %s connection %r did not say how its jobs are: %s", *connection, exc)
                continue
            with self._lock:
                self._answers[connection] = (now, answers)
            known.update({job_id: answers[job_id] for job_id in stale[connection] if job_id in answers})
        return known


def failure_facts(job: IndexedJob) -> dict[str, str]:
    """What a failed job's platform says of its end, for its job page: the exit code and the failure's words
    (the status message and the failure analysis). Empty for a job that did not fail or a platform that is gone."""
    if job.state != "Error" or job.platform not in PLATFORMS:
        return {}
    handle = job.record.job
    hook = get_platform_hook(job.platform, job.conn_id)
    hook.load_connection()
    status = job.live or hook.get_job_status(handle)
    analysis = hook.get_failure_analysis(handle)
    words = [w for w in (status.message, analysis.summary() if analysis else "") if w]
    facts = {"Exit code": "" if status.exit_code is None else str(status.exit_code), "Failure": " -- ".join(words)}
    return {key: value for key, value in facts.items() if value}
