"""``TAOAutoMLTrigger``: watches every running trial of one search from the triggerer.

The trials' statuses come from the per-connection :class:`~airflow_provider_tao.triggers.poller.StatusPoller` (one
backend call per interval for all of them, and for every other task's jobs on the connection); their logs are read
on the poller's log budget and parsed for metrics here (stdlib only: :mod:`~airflow_provider_tao.automl.metrics`).
Optuna never runs in the triggerer: the trigger hands the worker a decision to make -- a trial ended, or a trial
reported a new step that the pruner must judge (only when the search has a pruner) -- and the resumed worker judges,
cancels, starts new trials and defers again. One resume per interval at most (everything a poll brought goes in one
event), so a condemned trial stops within two intervals plus one resume.

The event: ``{"status": "decide" | "timeout" | "budget", "trials": {number: {"job_status", "reports", "log_cursor",
"parser"}}}``; ``reports`` are ``[step, {metric: value}]`` pairs. The trigger's own cursors are not stored: a
restarted triggerer reads again from the cursors of the last decision, and a report is idempotent (keyed by step).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_tao.automl.metrics import MetricParser
from airflow_provider_tao.jobs import NOT_FOUND_POLLS, JobHandle, JobStatus
from airflow_provider_tao.triggers.job import TAOJobTrigger, stop_at_deadline
from airflow_provider_tao.triggers.log_budget import FINAL_LOG_READS
from airflow_provider_tao.triggers.poller import StatusPoller, Watch, is_running


class TAOAutoMLTrigger(BaseTrigger):
    """Waits until a search's next decision: a trial ended, reported a step to judge, or a bound passed.

    :param trials: ``[{"number", "handle", "log_cursor", "parser"}]`` of the running trials.
    :param metrics: the metrics the search wants (the first one is judged by the pruner).
    :param judge_reports: hand new steps to the worker (the search has a pruner); else only ends wake it.
    :param poll_interval: seconds between polls. :param deadline: the task's end (``execution_timeout``), epoch s.
    :param budget_at: epoch seconds at which the running trials pass ``max_gpu_hours`` if they all keep running.
    :param cancel_on_kill: cancel every trial when the task is marked failed/success or cleared while deferred.
    """

    def __init__(
        self,
        *,
        trials: list[dict[str, Any]],
        metrics: list[str],
        judge_reports: bool = True,
        poll_interval: float = 10.0,
        deadline: float | None = None,
        budget_at: float | None = None,
        cancel_on_kill: bool = True,
    ) -> None:
        super().__init__()
        self.trials = [dict(t) for t in trials]
        self.metrics = list(metrics)
        self.judge_reports = bool(judge_reports)
        self.poll_interval = float(poll_interval)
        self.deadline = None if deadline is None else float(deadline)
        self.budget_at = None if budget_at is None else float(budget_at)
        self.cancel_on_kill = bool(cancel_on_kill)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_provider_tao.triggers.automl.TAOAutoMLTrigger",
            {
                "trials": self.trials,
                "metrics": self.metrics,
                "judge_reports": self.judge_reports,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
                "budget_at": self.budget_at,
                "cancel_on_kill": self.cancel_on_kill,
            },
        )

    def _bound(self) -> str | None:
        now = time.time()
        if self.deadline is not None and now >= self.deadline:
            return "timeout"
        if self.budget_at is not None and now >= self.budget_at:
            return "budget"
        return None

    async def run(self) -> AsyncIterator[TriggerEvent]:
        handles = {int(t["number"]): JobHandle.from_json(t["handle"]) for t in self.trials}
        parsers = {int(t["number"]): MetricParser.from_json(self.metrics, t.get("parser")) for t in self.trials}
        cursors = {int(t["number"]): str(t.get("log_cursor") or "") for t in self.trials}
        found: dict[int, dict[str, Any]] = {n: {"reports": [], "job_id": h.job_id} for n, h in handles.items()}
        watched: list[tuple[StatusPoller, dict[int, Watch]]] = []
        for conn in {(h.platform, h.conn_id) for h in handles.values()}:
            poller = await StatusPoller.for_connection(*conn)
            watches = {
                n: Watch(h, self.poll_interval, True) for n, h in handles.items() if (h.platform, h.conn_id) == conn
            }
            for watch in watches.values():
                poller.add(watch)
            watched.append((poller, watches))
        self.log.info(
            "Watching %d trial(s): %s", len(handles), ", ".join(f"{n}: {h.job_id}" for n, h in handles.items())
        )
        missing = dict.fromkeys(handles, 0)
        try:
            while True:
                statuses = await self._next_statuses(watched)
                decide = False
                for poller, watches in watched:
                    for number, watch in watches.items():
                        status = statuses.get(number) or JobStatus.unknown("no status this interval")
                        missing[number] = missing[number] + 1 if status.not_found else 0
                        ended = status.state.is_terminal or missing[number] >= NOT_FOUND_POLLS
                        if ended or (is_running(status) and watch.take_log_turn()):
                            cursors[number], new = await self._read(
                                poller, handles[number], cursors[number], parsers[number], ended
                            )
                            found[number]["reports"] += new
                            decide |= bool(new) and self.judge_reports
                        found[number]["job_status"] = status.to_json()
                        decide |= ended
                if (bound := self._bound()) is not None or decide:
                    if bound == "timeout":  # every trial stops at the deadline, as the resumed task stops them
                        await self._stop_at_deadline(watched, statuses)
                    yield TriggerEvent(self._event(bound or "decide", found, cursors, parsers))
                    return
        finally:
            for poller, watches in watched:
                for watch in watches.values():
                    await poller.remove(watch)

    async def _next_statuses(self, watched: list[tuple[StatusPoller, dict[int, Watch]]]) -> dict[int, JobStatus]:
        """The statuses of the next poll (each poller publishes all its watches at once), or none by the bound."""
        wait = self.poll_interval * 4
        for bound in (self.deadline, self.budget_at):
            if bound is not None:
                wait = min(wait, max(0.0, bound - time.time()))
        statuses: dict[int, JobStatus] = {}
        for poller, watches in watched:
            for number, watch in watches.items():
                watch.begin_wait(wait)
                while (waiter := watch.waiter_needed()) is not None:
                    await waiter
                if (status := watch.take_status()) is not None:
                    statuses[number] = status
                else:
                    poller.ensure_running()
        return statuses

    async def _read(
        self, poller: StatusPoller, handle: JobHandle, cursor: str, parser: MetricParser, ended: bool
    ) -> tuple[str, list[list[Any]]]:
        """New log text of a trial parsed for metrics; an ended trial's log to its end."""
        reports: list[list[Any]] = []
        for _ in range(FINAL_LOG_READS if ended else 1):
            try:
                text, new_cursor = await poller.hook.aget_job_logs(handle, cursor)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # logs are best effort; the job's status decides its end
                self.log.debug("Reading trial job %s's log failed: %s", handle.job_id, exc)
                break
            at_end = ended and (new_cursor == cursor or poller.hook.log_read_reached_end(text))
            for report in parser.feed(text, final=at_end):
                reports.append([report.step, report.values])
                self.log.info("[trial job %s] step %d %s", handle.job_id, report.step, report.values)
            poller.logs.record(handle.job_id, new_cursor != cursor, self.poll_interval)
            cursor = new_cursor
            if not ended or at_end:
                break
        return cursor, reports

    def _event(
        self, status: str, found: dict[int, dict[str, Any]], cursors: dict[int, str], parsers: dict[int, MetricParser]
    ) -> dict[str, Any]:
        trials = {
            str(n): {**entry, "log_cursor": cursors[n], "parser": parsers[n].to_json()} for n, entry in found.items()
        }
        return {"status": status, "trials": trials}

    async def _stop_at_deadline(
        self, watched: list[tuple[StatusPoller, dict[int, Watch]]], statuses: dict[int, JobStatus]
    ) -> None:
        live = [
            stop_at_deadline(poller.hook, watch.handle, self.log)
            for poller, watches in watched
            for number, watch in watches.items()
            if (status := statuses.get(number)) is None or not status.state.is_terminal
        ]
        await asyncio.gather(*live)

    async def on_kill(self) -> None:
        """The task was marked failed/success or cleared while deferred: every trial's job goes as a single job
        does (:meth:`TAOJobTrigger.on_kill`: one decision on the task's state, KILL, the cancel routine retried and
        shielded from the triggerer's repeated cancels), all trials at once. A trigger that only moved to another
        triggerer leaves them; a cleared task keeps what its next try adopts."""
        watchers = []
        for trial in self.trials:
            watcher = TAOJobTrigger(
                handle=trial["handle"], poll_interval=self.poll_interval, cancel_on_kill=self.cancel_on_kill
            )
            watcher.task_instance = self.task_instance  # whose state the decision asks
            watchers.append(watcher)
        await asyncio.gather(*(watcher.on_kill() for watcher in watchers))
