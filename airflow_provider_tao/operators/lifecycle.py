"""The lifecycle steps :class:`~airflow_provider_tao.operators.submit.TAOSubmitOperator` runs: reattach or submit,
record, wait (on the worker or through the trigger), and complete or fail."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowTaskTimeout

from airflow_provider_tao import settings
from airflow_provider_tao.asking import asked_again
from airflow_provider_tao.hooks import get_platform_hook
from airflow_provider_tao.hooks.base import JobSubmitError, JobValidationError
from airflow_provider_tao.hooks.shared.secrets import register_secrets
from airflow_provider_tao.joblog import JobLogWriter
from airflow_provider_tao.jobs import NOT_FOUND_POLLS, ErrClass, JobHandle, JobSpec, JobState, JobStatus
from airflow_provider_tao.operators.budget_guard import BudgetGuardMixin
from airflow_provider_tao.operators.decisions import Act, Situation, Verdict, decide
from airflow_provider_tao.operators.fact_reader import reattach_facts, resume_facts
from airflow_provider_tao.operators.outcome import JobOutcomeMixin
from airflow_provider_tao.outage import OutageLog
from airflow_provider_tao.person_cancel import stop_canceled_job
from airflow_provider_tao.records import STATE_KEY, JobRecord
from airflow_provider_tao.triggers.log_budget import FINAL_LOG_READS
from airflow_provider_tao.waiting import WaitLog

if TYPE_CHECKING:
    from datetime import timedelta
    from typing import NoReturn

    from airflow.sdk import Context
    from airflow.triggers.base import BaseTrigger

    from airflow_provider_tao.hooks.base import TAOPlatformHook
    from airflow_provider_tao.jobs import FailureAnalysis

#: Times a worker's ``on_kill`` asks its cancel again when a fact read failed, pausing ``KILL_PAUSE_SECONDS``,
#: doubled each time (1 + 2 + 4 s: well inside Airflow's ``killed_task_cleanup_time``, 60 s).
KILL_ATTEMPTS = 4
KILL_PAUSE_SECONDS = 1.0


class Reattaching(NamedTuple):
    """A retry's look for the task's earlier jobs, while it lasts: what a kill then stops (``_reattached``)."""

    hook: TAOPlatformHook
    name: str
    try_number: int
    candidates: list[JobHandle]


def _loaded_hook(handle: JobHandle) -> TAOPlatformHook:
    hook = get_platform_hook(handle.platform, handle.conn_id)
    hook.load_connection()
    return hook


class JobLifecycleMixin(BudgetGuardMixin, JobOutcomeMixin):
    """The steps of one task instance's job, from :meth:`execute` to :meth:`execute_complete` (and
    :meth:`on_kill`).

    Reads the operator's ``deferrable`` and uses its building blocks (``_job_spec``, ``streaming``,
    ``_apply_config_defaults``); ends through :class:`~airflow_provider_tao.operators.outcome.JobOutcomeMixin`.
    """

    deferrable: bool
    _secrets_registered: bool
    _waiting: WaitLog | None
    _submitting: tuple[TAOPlatformHook, str, str] | None
    _reattaching: Reattaching | None

    if TYPE_CHECKING:

        @property
        def streaming(self) -> bool: ...

        def _apply_config_defaults(self) -> None: ...

        def _job_spec(self, context: Context, hook: TAOPlatformHook, name: str) -> JobSpec: ...

        def defer(
            self,
            *,
            trigger: BaseTrigger,
            method_name: str,
            kwargs: dict[str, Any] | None = None,
            timeout: timedelta | int | float | None = None,
        ) -> NoReturn: ...

    def _run(self, context: Context, *, reattach: bool) -> dict[str, Any]:
        self._apply_config_defaults()
        try:
            hook = self._hook()
            name = self._job_name(context, hook)
        except JobValidationError as exc:
            raise AirflowFailException(f"Bad input, nothing was submitted: {exc}") from exc
        try_number = context["ti"].try_number
        stored: Any = context["task_state_store"].get(STATE_KEY)
        if reattach:  # a kill from here to the adoption or a new submission stops the earlier tries' jobs
            record = JobRecord.from_json(stored)
            self._reattaching = Reattaching(hook, name, try_number, [record.job] if record else [])
            self._close_left_behind(context, stored)  # a job that ended unwatched still counts in GPU-hours
        self._honour_person_cancel(context, None)  # `airflow tao cancel` while no try waited: nothing is submitted
        # Reattach first: an earlier try's job that still runs is this task's job, whatever a new validation of
        # today's inputs would say (the job itself may have moved them), and its outputs are the ones that count.
        # With a chain of connections it may be on any of them (see operators/failover.py).
        try:
            found = self._find_in_chain(context, hook, name) if reattach else None
        except JobValidationError as exc:  # e.g. the platform refused the connection's credentials
            raise AirflowFailException(f"Bad input, nothing was submitted: {exc}") from exc
        except Exception as exc:
            # A platform error that a retry cannot mend (refused credentials, a configuration error) fails the task
            # now; anything else -- an outage above all -- is retried, never taken as "no earlier job".
            err_class = getattr(exc, "err_class", None)
            if isinstance(err_class, ErrClass) and not err_class.retriable:
                raise AirflowFailException(
                    f"Nothing was submitted: looking for this task's earlier job on {hook.platform} failed with "
                    f"{err_class.value}: {exc}"
                ) from exc
            raise
        if found is not None and found[2].state is JobState.COMPLETE:
            return self._take_completed(context, *found)
        if found is not None:
            hook, previous, _ = found
            handle = previous.owned_by(try_number)
            hook.claim_job(handle)
            outputs = self._outputs_of(context, previous)
            self.log.info(
                "Reattached to job %s (%s), submitted by try %s", handle.job_id, handle.name, previous.try_number
            )
        else:
            self._reattaching = None  # none to adopt: from here a kill stops what this try submits
            if reattach:  # the earlier job may have ended since the first look (its old try's kill canceled it)
                self._close_left_behind(context, stored)
            self._start_attempts(context, previous_run_used=isinstance(stored, dict) and bool(stored.get("consumed")))
            try:
                prepared = self._validated_chain(context, hook, name)  # every connection of the chain, up front
            except JobValidationError as exc:
                raise AirflowFailException(f"Bad input, nothing was submitted: {exc}") from exc
            hook, handle, outputs = self._submit(context, hook, name, prepared)
        return self._watch(context, hook, handle, outputs)

    def _take_completed(
        self, context: Context, hook: TAOPlatformHook, handle: JobHandle, status: JobStatus
    ) -> dict[str, Any]:
        """The verdict "succeed" of a reattach: the earlier job completed unused. Cleanup comes after the result,
        best effort (as a resumed try's; SLURM: the env file) -- it never replaces it."""
        self._handle = handle
        self.log.info("Job %s (%s) of an earlier try completed while no try watched it: taking its result",
                      handle.job_id, handle.name)  # fmt: skip
        self._keep(context, self._record_for(context, handle, self._outputs_of(context, handle)))
        self._publish(context, hook, handle)
        self._close_attempt(context, hook, handle, outcome="complete", reason=status.message)
        result = self._succeed(context, handle, status, self._outputs_of(context, handle))
        self._clean_up(hook, handle)
        return result

    def _clean_up(self, hook: TAOPlatformHook, handle: JobHandle, *, adoptable: bool = False) -> None:
        """Remove what only a running job needs, after a verdict on an ended job. Best effort: never raises."""
        try:
            hook.cleanup_job(handle, adoptable=adoptable)
        except Exception as exc:
            self.log.warning("Cleaning up after job %s failed (%s): airflow tao reap sweeps it", handle.job_id, exc)

    def _prepared_spec(self, context: Context, hook: TAOPlatformHook, name: str) -> tuple[JobSpec, dict[str, str]]:
        """The job this task submits on ``hook``'s connection, staged and validated; and its output URIs."""
        spec, outputs = self.stage(self._job_spec(context, hook, name), hook)
        hook.validate_spec(spec)
        return spec, outputs

    def _submit(
        self,
        context: Context,
        hook: TAOPlatformHook,
        name: str,
        prepared: tuple[JobSpec, dict[str, str]] | None = None,
    ) -> tuple[TAOPlatformHook, JobHandle, dict[str, str]]:
        """Submit the job on ``hook``'s connection -- or, refused there for capacity, on the next one of the chain.
        Its connection is recorded before the submission (the write-ahead of operators/failover.py)."""
        try:
            spec, outputs = prepared or self._prepared_spec(context, hook, name)
        except JobValidationError as exc:
            raise AirflowFailException(f"Bad input, nothing was submitted: {exc}") from exc
        register_secrets(list(spec.secret_env.values()))
        self._secrets_registered = True
        self._warn_expiring_credentials(spec)
        self._write_ahead(context, hook, spec.name, spec.job_id)
        # on_kill landing while create_job runs (or as it returns) has no handle yet: it looks the job up by this
        self._submitting = (hook, spec.name, spec.job_id)
        try:
            handle = hook.create_job(spec, try_number=context["ti"].try_number)
        except JobSubmitError as exc:
            self._submitting = None
            message = f"The {hook.platform} platform refused job {spec.job_id}: {exc.err_class.value}: {exc}"
            target = (
                self._refused_for_capacity(context, hook, spec, message)
                if exc.err_class is ErrClass.ERR_CAPACITY
                else None
            )
            if target is None:
                if exc.err_class.retriable:
                    raise AirflowException(message) from exc
                raise AirflowFailException(message) from exc
        else:
            self._handle, self._submitting = handle, None
            self.log.info("Submitted %s job %s (%s)", hook.platform, handle.job_id, handle.name)
            return hook, handle, outputs
        try:  # refused there for capacity: the next connection of the chain
            name = self._job_name(context, target)
        except JobValidationError as bad:
            raise AirflowFailException(f"Bad input, nothing more was submitted: {bad}") from bad
        return self._submit(context, target, name)

    def _watch(
        self, context: Context, hook: TAOPlatformHook, handle: JobHandle, outputs: dict[str, str]
    ) -> dict[str, Any]:
        """Keep the job's handle where every try finds it, publish its links, then wait for it: deferred in the
        triggerer, or on the worker."""
        self._handle, self._reattaching = handle, None
        self._keep(context, self._record_for(context, handle, outputs))
        self._publish(context, hook, handle)
        self._honour_person_cancel(context, handle)  # a cancel that came while this try submitted
        deadline = self._deadline(context)
        if self.deferrable:
            from airflow_provider_tao.triggers.job import TAOJobTrigger

            self.defer(
                trigger=TAOJobTrigger(
                    handle=handle.to_json(),
                    poll_interval=self.interval,
                    deadline=deadline,
                    stream_logs=self.streaming,
                    cancel_on_kill=self.cancel_on_kill,
                    secret_conn_ids=self._secret_conn_ids(handle),
                    capacity_timeout=self._capacity_timeout_for(handle),
                    budget_at=self._job_budget_at(hook, handle),
                ),
                method_name="execute_complete",
                # The trigger enforces the deadline itself and the operator cancels the job; a framework timeout
                # would fail the task without either (and orphan the job).
                timeout=None,
            )
        return self.execute_complete(context, self._wait_on_worker(hook, handle))

    def _secret_conn_ids(self, handle: JobHandle) -> list[str]:
        """The connections whose secrets the job receives: the storage connection's keys, and the platform
        connection's (its extras or environment fallbacks may hold keys the job gets: NGC, HF tokens)."""
        return [c for c in dict.fromkeys((self.storage_conn_id, handle.conn_id)) if c]

    def _mask_received_secrets(self, handle: JobHandle) -> None:
        """Register the job's secrets with this worker's masker when this process did not submit the job (a resumed
        or reattached try): the job's log lines and failure evidence it writes must not show them."""
        if not self._secrets_registered:
            from airflow_provider_tao.received_secrets import job_secrets

            register_secrets(job_secrets(self._secret_conn_ids(handle), handle.conn_id, handle.platform))
            self._secrets_registered = True

    def _outputs_of(self, context: Context, handle: JobHandle) -> dict[str, str]:
        """The output URIs of the job that ran: stored with its handle, else derived from its results folder."""
        record = self._stored(context)
        if record is not None and record.job_id == handle.job_id:
            return dict(record.outputs)
        if not self.uses_runner:
            return {}
        try:
            return self.build_job_entrypoint().output_uris(handle.results_dir)
        except JobValidationError as exc:
            self.log.warning("Cannot derive the outputs of job %s: %s", handle.job_id, exc)
            return {}

    def _warn_expiring_credentials(self, spec: JobSpec) -> None:
        """Temporary storage credentials that expire before the task's deadline break the job's late uploads."""
        if "AWS_SESSION_TOKEN" not in spec.secret_env:
            return
        expiry = self.storage_credentials_expiry()
        if expiry is None:
            self.log.warning(
                "storage_conn_id %r gives temporary AWS credentials (a session token) of unknown lifetime: uploads "
                "fail once they expire. Use long-lived keys or a role the connection can refresh",
                self.storage_conn_id,
            )
        elif spec.deadline is None or expiry < spec.deadline:
            self.log.warning(
                "The temporary AWS credentials of storage_conn_id %r expire at %s, %s: the job's uploads after "
                "that fail. Use long-lived keys or a role the connection can refresh, or shorten execution_timeout",
                self.storage_conn_id,
                time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(expiry)),
                "before the task's execution_timeout" if spec.deadline else "and the task has no execution_timeout",
            )

    def _find_previous(self, context: Context, hook: TAOPlatformHook, name: str) -> tuple[JobHandle, JobStatus] | None:
        """This task instance's earlier job if it can be reused (active or completed and not yet used), else None.

        The stored job first; when it cannot be reused (it ended, its result was used, it is on another connection
        of the chain, nothing is stored), the newest job of the deterministic name: a worker may have died between
        a submission and its record (the write-ahead then names a newer job than the record), and that job runs.
        Whether a job's result was used is kept with the job on the platform (``consumed_by``), so a clear after
        success reruns the job even when ``task_state_store`` was emptied (``clear_on_success``, retention)."""
        record = self._stored(context)
        stored = record.job if record is not None and not record.consumed else None
        if stored is not None and (stored.platform, stored.conn_id) != (hook.platform, hook.conn_id):
            stored = None  # the stored job is on another connection of the chain: look on this one by name
        try_number = context["ti"].try_number
        if stored is not None and (found := self._reusable(hook, stored, try_number)) is not None:
            return found
        named = hook.find_job(name)
        if named is None or (stored is not None and named.job_id == stored.job_id):
            return None
        if stored is not None:
            self.log.warning(
                "Job %s (%s) is newer than the stored job %s: an earlier try died before recording it",
                named.job_id, name, stored.job_id,
            )  # fmt: skip
        return self._reusable(hook, named, try_number)

    def _reusable(
        self, hook: TAOPlatformHook, candidate: JobHandle, try_number: int
    ) -> tuple[JobHandle, JobStatus] | None:
        """``candidate`` and its status when the decision adopts it (live) or takes its result (complete, unused);
        None when it resubmits. Its facts unknown: the task is retried, never a duplicate submitted.

        The candidate is this try's job from the first look on (the recorded one from the try's start): a kill
        while it is looked at or claimed (a person marking the task failed) cancels it, as it would once adopted --
        else it runs on with its task gone (pair explorer: worker_kill, then mark_failed inside the retry's
        reattach)."""
        if self._reattaching is not None:
            self._reattaching.candidates.append(candidate)
        facts, status = reattach_facts(hook, candidate, try_number)
        verdict = decide(facts, Situation.REATTACH)
        if verdict.act is Act.LATER:
            raise AirflowException(f"Job {candidate.job_id} of an earlier try: {verdict.why}. The next try asks again.")
        if verdict.act is Act.RESUBMIT:
            self.log.info("Earlier job %s: %s", candidate.job_id, verdict.why)
            return None
        assert status is not None
        return candidate, status

    def _wait_on_worker(self, hook: TAOPlatformHook, handle: JobHandle) -> dict[str, Any]:
        """The synchronous twin of the trigger; returns the same event payload. A failed status call (one SSH blip,
        an API outage) is Unknown, never a failure: the wait goes on until the job ends or Airflow's own
        ``execution_timeout`` stops it (and calls ``on_kill``, which cancels the job)."""
        if problem := hook.watch_problem(handle):
            return self._payload("misplaced", handle, JobStatus.unknown(problem), "")
        self._mask_received_secrets(handle)
        cursor = ""
        outage = OutageLog(self.log, hook.platform, settings.outage_report_seconds())
        waiting = self._waiting = WaitLog(self.log, handle.job_id, settings.outage_report_seconds())
        writer = JobLogWriter()  # the worker's masker already knows the job's secrets
        not_found = 0
        capacity_timeout = self._capacity_timeout_for(handle)
        budget = self._job_budget_at(hook, handle)
        while True:
            try:
                status = hook.get_job_status(handle)
            except Exception as exc:  # the platform could not be asked: an outage, not a verdict on the job
                status = JobStatus.unknown(f"status call failed: {exc}")
            outage.update(status)
            waiting.update(status)
            not_found = not_found + 1 if status.not_found else 0
            if not_found >= NOT_FOUND_POLLS:
                message = f"job {handle.job_id} no longer exists on the {hook.platform} platform ({status.message})"
                return self._payload("error", handle, status, cursor) | {"message": message}
            if reason := status.capacity_wait_over(capacity_timeout, time.time()):
                return self._payload("capacity", handle, status, cursor) | {"message": reason}
            if budget is not None and time.time() >= budget and not status.state.is_terminal:
                return self._payload("budget", handle, status, cursor)
            if status.state is not JobState.UNKNOWN and self.streaming:
                cursor = self._copy_logs(hook, handle, cursor, writer)
            if status.state.is_terminal:
                if self.streaming:  # one bounded read per poll: the rest of an ended job's log, to its end
                    cursor = self._copy_rest_of_log(hook, handle, cursor, writer)
                outcome = {JobState.COMPLETE: "complete", JobState.ERROR: "error", JobState.CANCELED: "canceled"}
                return self._payload(outcome[status.state], handle, status, cursor)
            time.sleep(self.interval)

    def _copy_logs(self, hook: TAOPlatformHook, handle: JobHandle, cursor: str, writer: JobLogWriter) -> str:
        try:
            text, cursor = hook.get_job_logs(handle, cursor)
        except Exception as exc:  # logs are best effort
            self.log.debug("Reading the job log failed: %s", exc)
            return cursor
        for line in writer.feed(text):
            self.log.info("[job] %s", line)
        return cursor

    def _copy_rest_of_log(
        self, hook: TAOPlatformHook, handle: JobHandle, cursor: str, writer: JobLogWriter | None = None
    ) -> str:
        """An ended job's log from ``cursor`` to its end (bounded reads until one brings nothing new), its last
        unfinished line included; returns the cursor at its end."""
        writer = writer or JobLogWriter()  # the worker's masker knows the job's secrets (_mask_received_secrets)
        for _ in range(FINAL_LOG_READS):
            cursor, before = self._copy_logs(hook, handle, cursor, writer), cursor
            if cursor == before:
                break
        for line in writer.feed("", final=True):
            self.log.info("[job] %s", line)
        return cursor

    def _reattached(self) -> list[JobHandle]:
        """The earlier tries' jobs this try was looking at to adopt when it was killed: the recorded one, each it
        looked at, and the newest of its name (an earlier try may have died before recording it), each as the try
        that owns it now -- this one once its claim landed, else its own (Airflow runs one try at a time: that one
        is over). A job another try owns is not this try's to stop."""
        if self._reattaching is None:
            return []
        hook, name, try_number, candidates = self._reattaching
        named = hook.find_job(name)
        jobs = {h.job_id: h for h in [*candidates, *([named] if named else [])]}
        owners = {job_id: _loaded_hook(h).job_owner(h) for job_id, h in jobs.items()}
        return [h.owned_by(owners[i]) for i, h in jobs.items() if owners[i] in (h.try_number, try_number)]

    def _submitted(self) -> JobHandle | None:
        """The job a kill interrupted the submission of, if it exists: found by its name, and only if it is the job
        this try was submitting (never an earlier try's)."""
        if self._submitting is None:
            return None
        hook, name, job_id = self._submitting
        found = hook.find_job(name)
        return found if found is not None and found.job_id == job_id else None

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resume after the trigger (or the worker wait): read the facts in one step, decide (succeed, fail fast,
        fail for a retry, resubmit: ``operators/decisions.py``, its table in ``docs/decisions.md``), then act."""
        outcome = event["status"]
        handle = JobHandle.from_json(event["handle"])
        status = JobStatus.from_json(event["job_status"])
        self._handle = handle
        hook = get_platform_hook(handle.platform, handle.conn_id)
        hook.load_connection()
        if not event.get("log_complete", True):  # the trigger's log reads ran out at the job's end
            self._mask_received_secrets(handle)  # before the job's lines reach this worker's log
            self._copy_rest_of_log(hook, handle, str(event.get("log_cursor") or ""))
        if outcome == "misplaced":
            raise AirflowFailException(event.get("message") or status.message)
        message = event.get("message") or status.message
        budget = self._over_budget(hook, handle)
        facts, analysis = resume_facts(hook, handle, context, outcome, self.cancel_on_kill, over_budget=budget)
        verdict = decide(facts, Situation.RESUME)
        if verdict.act is Act.ADOPT:  # within its budget still: the same try watches it again
            return self._watch(context, hook, handle, self._outputs_of(context, handle))
        failing = verdict.act in (Act.RETRY, Act.FAIL) and verdict.err_class is not ErrClass.ERR_CANCELED
        if failing and self._fails_over(handle, outcome, analysis):  # the next connection of the chain
            return self._fail_over(context, hook, handle, analysis.summary() if analysis else message)
        reason = analysis.summary() if analysis else message
        self._close_attempt(context, hook, handle, outcome=outcome, reason=reason)
        self._mask_received_secrets(handle)  # before the job's own words (failure evidence) reach the log
        return self._act(context, hook, handle, verdict, (status, analysis, message, event.get("waiting")))

    def _act(
        self,
        context: Context,
        hook: TAOPlatformHook,
        handle: JobHandle,
        verdict: Verdict,
        ending: tuple[JobStatus, FailureAnalysis | None, str, str | None],
    ) -> dict[str, Any]:
        """The acts of a resumed try's verdict. Cleanup is best effort and only after the verdict's own acts."""
        status, analysis, message, waiting = ending
        if verdict.act is Act.LATER:
            raise AirflowException(f"Job {handle.job_id}: {verdict.why}; the next try decides again")
        if verdict.err_class is ErrClass.ERR_CANCELED and verdict.act is Act.FAIL:
            if verdict.stop:  # a person's cancel this try honours; the stop also cleans up
                stop_canceled_job(handle, verdict.why.removeprefix("canceled by "), self.log)
            elif verdict.clean_up:
                self._clean_up(hook, handle)
            self._fail_canceled(context, handle, verdict.why)
        if verdict.err_class is ErrClass.ERR_TIMEOUT and verdict.act is Act.RETRY:
            # the task's deadline; a job that hit its own time limit fails for good below, as its class says
            return self._time_out(context, hook, handle, waiting)
        if verdict.err_class is ErrClass.ERR_BUDGET:
            self._stop_over_budget(context, hook, handle, verdict)
        if verdict.act is Act.RESUBMIT:
            self.log.warning("Job %s: %s, while try %s still wants it; submitting a new one",
                             handle.job_id, verdict.why, context["ti"].try_number)  # fmt: skip
            self._clean_up(hook, handle)
            return self._run(context, reattach=False)
        if verdict.act is Act.SUCCEED:
            result = self._succeed(context, handle, status, self._outputs_of(context, handle))
            if verdict.clean_up:
                self._clean_up(hook, handle)
            return result
        if verdict.clean_up:
            self._clean_up(hook, handle)
        return self._fail(context, handle, status, analysis, message)

    def _time_out(self, context: Context, hook: TAOPlatformHook, handle: JobHandle, waiting: str | None) -> NoReturn:
        """The task's deadline passed: cancel the job (``cancel_on_kill``) and clean up after it once stopped."""
        self._stop_for_limit(context, hook, handle, ErrClass.ERR_TIMEOUT, cancel=self.cancel_on_kill)
        fate = "it was canceled" if self.cancel_on_kill else "it runs on (cancel_on_kill=False)"
        raise AirflowTaskTimeout(
            f"Job {handle.job_id} passed the task's execution_timeout (or [tao] lease_hours): "
            f"{ErrClass.ERR_TIMEOUT.value}, {fate}{f'; {waiting}' if waiting else ''}"
        )

    def on_kill(self) -> None:
        """Worker-side kill (and Airflow's timeout on the worker): cancel the job this try owns."""
        if self._waiting is not None and (why := self._waiting.summary()):
            self.log.error("Job %s was killed while waiting: %s", self._waiting.job_id, why)
        if not self.cancel_on_kill:
            return
        # a read that failed decides nothing (DecideLater, a blip): ask again -- a task marked failed has no later
        # try to stop the job, only the sweeper's next pass (pair explorer: mark_failed x blip)
        asked_again(
            self._cancel_own_job, asks=KILL_ATTEMPTS, pause=KILL_PAUSE_SECONDS, log=self.log,
            what="Deciding the kill of this try's job",
        )  # fmt: skip

    def _cancel_own_job(self) -> None:
        own = [self._handle] if self._handle else [h for h in [self._submitted()] if h] or self._reattached()
        for handle in own:
            hook = _loaded_hook(handle)
            if hook.cancel_job(handle).over:
                # a kill does not say whether the task runs again (a clear, a timeout with retries left): a job
                # that completed on its own meanwhile is kept for that try to adopt, and swept once the task is over
                hook.cleanup_job(handle, adoptable=True)
