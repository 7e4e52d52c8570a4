"""What a job's end leaves: the task's record of the job (task state store and XCom), and its result -- metrics, Asset
events -- or its failure."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_tao import secret_refs, settings
from airflow_provider_tao.failures import FailureFacts, classify
from airflow_provider_tao.hooks import get_platform_hook
from airflow_provider_tao.hooks.shared.results import read_s3_result
from airflow_provider_tao.jobs import ErrClass, FailureAnalysis, JobHandle, JobState, JobStatus
from airflow_provider_tao.links import XCOM_CONSOLE_URL, XCOM_JOB_ID, XCOM_RESULTS_DIR
from airflow_provider_tao.operators.decisions import UNKNOWN, Act, Facts, Situation, decide
from airflow_provider_tao.operators.failover import CapacityFailoverMixin
from airflow_provider_tao.operators.staging import S3StagingMixin
from airflow_provider_tao.outage import OutageLog
from airflow_provider_tao.person_cancel import binding_cancel, honour_cancel, stop_canceled_job
from airflow_provider_tao.records import STATE_KEY, XCOM_RECORD, JobRecord

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_tao.hooks.base import TAOPlatformHook


class JobOutcomeMixin(CapacityFailoverMixin, S3StagingMixin):
    """Records a job and ends the task with its outcome.

    Reads the operator's ``cancel_on_kill``, ``metrics_file``, ``outlets`` and ``_secret_refs``, its ``interval`` and
    ``_deadline``.
    """

    cancel_on_kill: bool
    metrics_file: str | None
    outlets: list[Any]
    _secret_refs: dict[str, tuple[str, str]]  # the task's secret_env references (secret_refs.parse_secret_env)

    if TYPE_CHECKING:

        @property
        def interval(self) -> float: ...

        def _deadline(self, context: Context) -> float | None: ...

    def _stored(self, context: Context) -> JobRecord | None:
        return JobRecord.from_json(context["task_state_store"].get(STATE_KEY))

    def _record_for(self, context: Context, handle: JobHandle, outputs: dict[str, str]) -> JobRecord:
        """The record of ``handle`` as this task's job; an earlier job of the task instance goes into its history."""
        fields: dict[str, Any] = {
            "outputs": outputs,
            "gpu_count": self.gpu_count,
            "num_nodes": self.num_nodes,
            "cancel_on_kill": self.cancel_on_kill,
            "deadline": self._deadline(context),
            "secret_conn_ids": [c for c in (self.storage_conn_id, *secret_refs.references(self._secret_refs)) if c],
        }
        previous = self._stored(context)
        return previous.successor(handle, **fields) if previous else JobRecord(handle=handle.to_json(), **fields)

    def _keep(self, context: Context, record: JobRecord) -> None:
        """Store the record where it survives retries, and in the try's XCom (the TAO jobs view reads both)."""
        context["task_state_store"].set(STATE_KEY, record.to_json())
        context["ti"].xcom_push(key=XCOM_RECORD, value=record.to_json())

    def _keep_end(self, context: Context, handle: JobHandle, state: str, err_class: str = "") -> None:
        """Record how the job ended (best effort: the task's own outcome never depends on it)."""
        record = self._stored(context)
        if record is None or record.job_id != handle.job_id:
            record = self._record_for(context, handle, {})
        try:
            self._keep(
                context, record.ended(state, err_class=err_class, run_seconds=self._run_seconds(context, handle))
            )
        except Exception as exc:
            self.log.warning("Could not record the end of job %s: %s", handle.job_id, exc)

    def _publish(self, context: Context, hook: TAOPlatformHook, handle: JobHandle) -> None:
        """What the task's links need, before it waits (so they work while it is deferred)."""
        ti = context["ti"]
        ti.xcom_push(key=XCOM_JOB_ID, value=handle.job_id)
        ti.xcom_push(key=XCOM_RESULTS_DIR, value=handle.results_dir)
        try:
            url = hook.job_url(handle)
        except Exception as exc:  # a link is never worth failing the task
            self.log.warning("No platform link for job %s: %s", handle.job_id, exc)
            url = ""
        ti.xcom_push(key=XCOM_CONSOLE_URL, value=url)

    @staticmethod
    def _payload(outcome: str, handle: JobHandle, status: JobStatus, cursor: str) -> dict[str, Any]:
        return {
            "status": outcome,
            "handle": handle.to_json(),
            "job_status": status.to_json(),
            "log_cursor": cursor,
            "message": status.message,
        }

    def _honour_person_cancel(self, context: Context, handle: JobHandle | None) -> None:
        """A person canceled this task instance (``airflow tao cancel``; :mod:`~airflow_provider_tao.person_cancel`):
        the try fails with ERR_CANCELED, and ``handle`` (else the canceled job) is stopped if it still runs. The
        record could not be read: the try is retried (the record still binds the next one)."""
        unreadable: Exception | None = None
        try:
            request = binding_cancel(context)
        except Exception as exc:
            request, unreadable = None, exc
        who = "a person" if request is not None and not request.get("by") else (request or {}).get("by")
        facts = Facts(try_number=context["ti"].try_number, person_cancel=UNKNOWN if unreadable else who)
        verdict = decide(facts, Situation.REATTACH)
        if verdict.act is Act.LATER:
            raise AirflowException(f"Nothing was submitted: {verdict.why} ({unreadable}); the next try asks again")
        if verdict.err_class is not ErrClass.ERR_CANCELED or request is None:
            return
        handle = handle or JobHandle.from_json(request["job"])
        stop_canceled_job(handle, str(who), self.log)
        self._fail_canceled(context, handle, verdict.why)

    def _fail_canceled(self, context: Context, handle: JobHandle, why: str) -> None:
        """A job canceled from outside its task: the task fails without retries (a retry would undo the cancel).
        A person's cancel record is honoured by it (a later clear runs the task again)."""
        honour_cancel(context, self.log)
        analysis = classify(FailureFacts(canceled=True, message=f"job {handle.job_id} was {why}"))
        self._keep_end(context, handle, JobState.CANCELED.value, analysis.err_class.value)
        raise AirflowFailException(f"Job {handle.job_id} failed with {analysis.summary()} It was {why}.")

    def _succeed(
        self, context: Context, handle: JobHandle, status: JobStatus, outputs: dict[str, str]
    ) -> dict[str, Any]:
        # Mark the job's result as used, with the job and in the store, so clearing a successful task runs the job
        # again instead of reusing it -- even once the store is emptied.
        hook = get_platform_hook(handle.platform, handle.conn_id)
        hook.load_connection()
        owned = handle.owned_by(context["ti"].try_number)
        outage = OutageLog(self.log, hook.platform, settings.outage_report_seconds())
        outage.through(lambda: hook.mark_consumed(owned), "marking the job's result used", self.interval)
        record = self._stored(context)
        if record is None or record.job_id != handle.job_id:
            record = self._record_for(context, handle, outputs)
        record = replace(record, outputs=outputs).ended(
            JobState.COMPLETE.value, consumed=True, run_seconds=self._run_seconds(context, handle)
        )
        self._keep(context, record)
        self.log.info("Job %s completed; results in %s", handle.job_id, handle.results_dir)
        result = {
            "job_id": handle.job_id,
            "platform": handle.platform,
            "backend_job_id": handle.backend_job_id,
            "name": handle.name,
            "state": status.state.value,
            "exit_code": status.exit_code,
            "results_dir": handle.results_dir,
            "outputs": outputs,
            "console_url": hook.job_url(handle),
            "gpu_count": self.gpu_count,
            "num_nodes": self.num_nodes,
            "submitted_at": handle.submitted_at,
            "ended_at": record.ended_at,
            "gpu_hours": record.gpu_hours(),
            "metrics": self._read_metrics(hook, handle),
            # attempts and GPU-hours from the times the platforms report (wins over the record's Airflow times)
            **self._attempts_report(context),
        }
        self._publish_assets(context, result)
        return result

    def _read_metrics(self, hook: TAOPlatformHook, handle: JobHandle) -> Any:
        """The job's metrics file (JSON), or None when it has none (or it cannot be read: never a failure). The job
        wrote it: read only as a regular file of bounded size (:mod:`~airflow_provider_tao.hooks.shared.results`)."""
        if not self.metrics_file or not handle.results_dir:
            return None
        import json

        try:
            if handle.results_dir.startswith("s3://") and self.storage_conn_id:
                bucket, _, key = handle.results_dir.removeprefix("s3://").partition("/")
                client = self._s3_hook().get_conn()  # a size check first: the job wrote it, any size is possible
                data = read_s3_result(client, bucket, f"{key.rstrip('/')}/{self.metrics_file}")
            else:
                data = hook.read_result_file(handle, self.metrics_file)
            return None if data is None else json.loads(data)
        except Exception as exc:
            self.log.info("No metrics from %s/%s: %s", handle.results_dir, self.metrics_file, exc)
            return None

    def _publish_assets(self, context: Context, result: dict[str, Any]) -> None:
        """Put which model this is into the events of the task's outlet Assets (one per Asset, at success)."""
        events = context.get("outlet_events")
        if not self.outlets or events is None:
            return
        ti = context["ti"]
        extra = {
            key: result[key]
            for key in ("job_id", "platform", "backend_job_id", "results_dir", "outputs", "metrics", "gpu_hours")
            if result.get(key) is not None
        }
        extra.update(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id)
        for outlet in self.outlets:
            try:
                events[outlet].extra.update(extra)
            except (KeyError, TypeError, AttributeError) as exc:  # an alias or a foreign outlet: Airflow's own event
                self.log.warning("Cannot add the job's metadata to outlet %r: %s", outlet, exc)

    def _fail(
        self,
        context: Context,
        handle: JobHandle,
        status: JobStatus,
        analysis: FailureAnalysis | None,
        message: str,
    ) -> dict[str, Any]:
        self._keep_end(
            context, handle, status.state.value, analysis.err_class.value if analysis else ErrClass.ERR_UNKNOWN.value
        )
        if analysis is None:
            raise AirflowException(f"Job {handle.job_id} failed: {message}")
        self.log.error("Job %s failed: %s", handle.job_id, analysis.summary())
        for line in analysis.evidence:
            self.log.error("  evidence: %s", line)
        message = f"Job {handle.job_id} failed with {analysis.summary()}"
        if analysis.retriable:
            raise AirflowException(message)
        raise AirflowFailException(message)
