"""The platform side of a search: a trial's job started, adopted, ended, canceled -- each through the same hooks and
the same deterministic naming as :class:`~airflow_provider_tao.operators.submit.TAOSubmitOperator`'s one job.

A trial's job name is ``<job_name or dag-task>-t<N>-<10 hex of sha256(dag, task, run, map index, N)>``: every try of
the task instance finds trial N's job by it, so a worker killed between a submission and the state store's write
adopts the job instead of running the trial twice (the state store holds the job id it was about to submit: the
write-ahead).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow_provider_tao.automl.index import SEARCH_KEY, trial_digest
from airflow_provider_tao.automl.metrics import RECOGNISED_FORMS, final_values
from airflow_provider_tao.automl.space import with_params_at_paths
from airflow_provider_tao.automl.study import (
    BUDGET,
    CANCELED,
    COMPLETE,
    FAILED,
    RUNNING,
    WAITING,
    SearchConfig,
    SearchState,
    TrialRecord,
)
from airflow_provider_tao.budget import job_gpu_hours
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobState, JobStatus

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_tao.hooks.base import TAOPlatformHook
    from airflow_provider_tao.jobs import JobSpec

#: ``task_state_store`` key of a search's state (beside the single job's record key).
STATE_KEY = SEARCH_KEY
ENV_PARAMS, ENV_NUMBER = "TAO_TRIAL_PARAMS", "TAO_TRIAL_NUMBER"
#: How the orphan sweeper signs its cancels (``canceled_by``: ``reap: <why>``).
REAPER = "reap:"


class TrialJobsMixin:
    """Trial jobs for :class:`~airflow_provider_tao.operators.automl.TAOAutoMLOperator`; uses the submit operator's
    building blocks (``_prepared_spec``, ``_read_metrics``) and its parameters (``specs``, ``args``, ``env``)."""

    specs: dict[str, Any] | None
    args: dict[str, Any] | None
    env: dict[str, str]
    job_name: str | None
    gpu_count: int
    num_nodes: int
    config: SearchConfig
    log: Any

    if TYPE_CHECKING:

        def _prepared_spec(
            self, context: Context, hook: TAOPlatformHook, name: str
        ) -> tuple[JobSpec, dict[str, str]]: ...

        def _read_metrics(self, hook: TAOPlatformHook, handle: JobHandle) -> Any: ...

    def _save(self, context: Context, state: SearchState) -> None:
        context["task_state_store"].set(STATE_KEY, state.to_json())

    def _trial_name(self, context: Context, hook: TAOPlatformHook, number: int) -> str:
        ti = context["ti"]
        digest = trial_digest(ti.dag_id, ti.task_id, ti.run_id, ti.map_index, number)
        prefix = self.job_name if self.job_name is not None else f"{ti.dag_id}-{ti.task_id}"
        return hook.job_name_for(f"{prefix}-t{number}".lower().replace("_", "-"), digest)

    @contextmanager
    def _as_trial(self, trial: TrialRecord) -> Iterator[None]:
        """The operator's spec, args and env as trial ``trial`` sees them, while its job is built."""
        saved = (self.specs, self.args, self.env)
        self.env = {**self.env, ENV_PARAMS: json.dumps(trial.params), ENV_NUMBER: str(trial.number)}
        if self.specs is not None:
            self.specs = with_params_at_paths(self.specs, trial.params)
        elif self.args is not None:
            self.args = {**self.args, **trial.params}
        try:
            yield
        finally:
            self.specs, self.args, self.env = saved

    def _start_trial(self, context: Context, hook: TAOPlatformHook, state: SearchState, trial: TrialRecord) -> None:
        """Submit ``trial``'s job: its job id is stored first (the write-ahead), then the job is created."""
        trial.name = self._trial_name(context, hook, trial.number)
        with self._as_trial(trial):
            spec, outputs = self._prepared_spec(context, hook, trial.name)
        trial.job_id, trial.state, trial.outputs = spec.job_id, WAITING, outputs
        self._save(context, state)
        handle = hook.create_job(spec, try_number=context["ti"].try_number)
        self._running(trial, handle)
        self.log.info(
            "Trial %d started: job %s (%s), params %s", trial.number, handle.job_id, handle.name, trial.params
        )

    @staticmethod
    def _running(trial: TrialRecord, handle: JobHandle) -> None:
        trial.handle, trial.state, trial.results_dir = handle.to_json(), RUNNING, handle.results_dir
        trial.job_id, trial.log_cursor, trial.parser = handle.job_id, "", {}
        trial.started_at = trial.started_at or handle.submitted_at

    def _adopt(self, context: Context, hook: TAOPlatformHook, state: SearchState) -> None:
        """A resumed or retried try takes over the trials in flight: running ones are claimed; a waiting one whose
        job was created before its record is found by name and adopted, else it is submitted now."""
        try_number = context["ti"].try_number
        for trial in state.live:
            trial.undecided = 0  # looks in a row by this try
            if trial.state == RUNNING and trial.handle:
                handle = JobHandle.from_json(trial.handle)
                if handle.try_number != try_number:
                    handle = handle.owned_by(try_number)
                    hook.claim_job(handle)
                    trial.handle = handle.to_json()
                continue
            found = hook.find_job(trial.name) if trial.name and trial.job_id else None
            if found is not None and found.job_id == trial.job_id:
                self.log.info("Trial %d: adopting job %s, created before it was recorded", trial.number, found.job_id)
                handle = found.owned_by(try_number)
                hook.claim_job(handle)
                self._running(trial, handle)
            else:
                self._start_trial(context, hook, state, trial)
        self._save(context, state)

    def _usage_hours(self, hook: TAOPlatformHook, handle: JobHandle, now: float | None = None) -> float:
        """The GPU-hours of ``handle`` so far, from the platform's own times (0 when they cannot be read)."""
        try:
            return job_gpu_hours(hook, handle, gpu_count=self.gpu_count, num_nodes=self.num_nodes, now=now)
        except Exception as exc:  # accounting never decides a trial's fate
            self.log.warning("No usage for job %s: %s", handle.job_id, exc)
            return 0.0

    def _end_trial(
        self, hook: TAOPlatformHook, state: SearchState, trial: TrialRecord, status: JobStatus, try_number: int
    ) -> None:
        """Record how ``trial``'s job ended, as the one decision (operators/decisions.py, RESUME) says: complete
        with its value; canceled by a person (never rerun, never ranked); our own cancel or an infrastructure
        failure run again; failed (program error, OOM, no metric). A fact that could not be read leaves the trial
        running: the next poll decides again (:data:`~airflow_provider_tao.automl.study.UNDECIDED_LOOKS` times in a row,
        then the search's try fails for a retry, which asks again)."""
        from airflow_provider_tao.operators.decisions import Act, Situation, decide

        assert trial.handle is not None
        handle = JobHandle.from_json(trial.handle)
        facts, analysis = self._trial_facts(hook, handle, status, try_number)
        verdict = decide(facts, Situation.RESUME)
        if verdict.act is Act.LATER:
            trial.undecided += 1
            self.log.warning("Trial %d (job %s): %s; deciding again", trial.number, handle.job_id, verdict.why)
            return
        trial.undecided = 0
        trial.gpu_hours = round(trial.gpu_hours + self._usage_hours(hook, handle), 6)
        if verdict.act is Act.SUCCEED:
            self._complete(hook, state, trial, handle)
        elif verdict.err_class is ErrClass.ERR_CANCELED:
            trial.state, trial.reason, trial.err_class = CANCELED, verdict.why, ErrClass.ERR_CANCELED.value
            self.log.warning("Trial %d (job %s) %s: the search goes on", trial.number, handle.job_id, verdict.why)
        else:
            err_class = verdict.err_class or ErrClass.ERR_UNKNOWN
            trial.err_class = err_class.value
            trial.reason = analysis.summary() if analysis else status.message or verdict.why
            rerun = verdict.act is Act.RESUBMIT or verdict.act is Act.RETRY
            if rerun and trial.attempts <= max(1, getattr(self, "retries", 0) or 0):
                self.log.warning("Trial %d: %s (%s); running it again", trial.number, trial.reason, verdict.why)
                trial.attempts += 1
                trial.state, trial.handle, trial.job_id = WAITING, None, ""
            else:
                self._failed(state, trial)
        if verdict.clean_up:
            hook.cleanup_job(handle)

    @staticmethod
    def _trial_facts(hook: TAOPlatformHook, handle: JobHandle, status: JobStatus, try_number: int) -> tuple[Any, Any]:
        """The facts of a trial whose job ended (``status``), read in one step as a resumed task reads its job's
        (:mod:`~airflow_provider_tao.operators.fact_reader`); a person's cancel record of the task is not one of
        them: a person cancels a trial by its job (its ``canceled_by`` mark), never the search through it."""
        from airflow_provider_tao.operators.decisions import UNKNOWN, Facts
        from airflow_provider_tao.operators.fact_reader import job_state, mark_facts

        outcome = {JobState.COMPLETE: "complete", JobState.CANCELED: "canceled"}.get(status.state, "error")
        analysis: Any = None
        if outcome == "error" and not status.not_found:  # a job that vanished has nothing to analyse
            try:
                analysis = hook.get_failure_analysis(handle)
            except Exception:  # unknown: the decision waits for it
                analysis = UNKNOWN
        marks = mark_facts(hook, handle)  # last: a cancel that lands during the analysis counts too
        who = marks["canceled_by"]
        # A person cancels a trial by its job: the job's canceled_by mark is their record of it (a single job's task
        # keeps one in its store), binding whichever try decides -- a retry that claimed the job since too. The
        # sweeper's mark is no person's: a trial it stopped under a task over and then cleared runs again.
        person = who if not isinstance(who, str) or not who.startswith(REAPER) else None
        facts = Facts(
            try_number=try_number, state=job_state(hook, handle), outcome=outcome, person_cancel=person,
            err_class=UNKNOWN if analysis is UNKNOWN else (analysis.err_class if analysis else None), **marks,
        )  # fmt: skip
        return facts, None if analysis is UNKNOWN else analysis

    def _complete(self, hook: TAOPlatformHook, state: SearchState, trial: TrialRecord, handle: JobHandle) -> None:
        final = final_values(self._read_metrics(hook, handle), self.config.metrics)
        values = {**trial.last_values, **final}  # metrics.json wins over the last reported step
        if missing := [m for m in self.config.metrics if m not in values]:
            trial.reason = (
                f"completed without reporting {', '.join(missing)}; recognised forms: {'; '.join(RECOGNISED_FORMS)}"
            )
            self.log.error("Trial %d (job %s) %s", trial.number, handle.job_id, trial.reason)
            self._failed(state, trial)
            return
        trial.state, trial.values, trial.reason = COMPLETE, [values[m] for m in self.config.metrics], ""
        state.failures_in_row = 0
        self.log.info("Trial %d complete: %s", trial.number, dict(zip(self.config.metrics, trial.values, strict=True)))

    def _failed(self, state: SearchState, trial: TrialRecord) -> None:
        trial.state = FAILED
        if not state.in_state(COMPLETE):
            state.failures_in_row += 1
        self.log.error("Trial %d failed: %s", trial.number, trial.reason)

    def _stop_trial(self, hook: TAOPlatformHook, trial: TrialRecord, state: str, reason: str) -> bool:
        """Cancel ``trial``'s job (the one cancel routine) and record it ``state`` (pruned, budget); False when the
        cancel could not be decided or sent (a failed read: the verdict stands, the cancel is asked again or swept)."""
        trial.state, trial.reason = state, reason
        if trial.handle is None:
            return True
        handle = JobHandle.from_json(trial.handle)
        try:
            hook.cancel_job(handle)
        except Exception as exc:  # the sweeper cancels what this could not; the verdict stands
            self.log.error("Canceling trial %d's job %s failed: %s", trial.number, handle.job_id, exc)
            return False
        trial.gpu_hours = round(trial.gpu_hours + self._usage_hours(hook, handle, time.time()), 6)
        hook.cleanup_job(handle)
        self.log.info("Trial %d %s: %s (job %s canceled)", trial.number, state, reason, handle.job_id)
        return True

    def _stop_all(self, hook: TAOPlatformHook, state: SearchState, reason: str) -> None:
        for trial in state.live:
            self._stop_trial(hook, trial, BUDGET, reason)

    def _running_hours(self, hook: TAOPlatformHook, state: SearchState) -> float:
        """GPU-hours of the running trials' current jobs so far (the platforms' start times, now as the end)."""
        now = time.time()
        return sum(
            self._usage_hours(hook, JobHandle.from_json(t.handle), now) for t in state.in_state(RUNNING) if t.handle
        )
