"""``CapacityFailoverMixin``: one task, a chain of connections, and what every attempt on them cost.

A task names a chain: ``conn_id`` first, then ``fallback_conn_ids`` in order (any platforms, in any mix). Its job
runs on the first connection; when it finds no capacity there, the provider cancels it through the one cancel
routine (``hooks/base.cancel_job``), submits the same job on the next connection and keeps watching -- in the same
task try, without using an Airflow retry. "No capacity" is one of two things, decided by the platform, never by a
per-platform rule here:

* the platform gave up for lack of capacity: the job failed with ``ERR_CAPACITY`` (Kubernetes'
  ``unschedulable_timeout_seconds``, Lepton's ``capacity_timeout_seconds``), or the platform refused it at
  submission with ``JobSubmitError(ERR_CAPACITY)`` (a Brev type chain with no capacity on any type);
* the job stayed Pending *for lack of resources* longer than the task's ``capacity_timeout``: the shared notion
  ``JobStatus.capacity_wait_since``, set by each hook where its backend says so (Kubernetes ``Unschedulable``, Lepton
  ``Queueing`` / ``NoCapacity``, SLURM pending reasons such as ``Resources``, ``Priority``, ``PartitionDown``). The
  clock is the backend's own (the pod condition's transition, the job's creation, the submit time), read by the
  trigger and by the worker's wait alike, so a restarted triggerer or worker judges it the same.

Program errors, OOM and every other failure never move: the same job would fail the same way elsewhere. On the last
connection of the chain there is nowhere to go: ``capacity_timeout`` does not apply there, and a capacity failure is
retriable as on any single platform (an Airflow retry starts again at the head of the chain). Every move is in the
task log (a warning naming both connections and the reason) and in XCom (``tao_attempts`` at once, ``attempts`` in
the return value).

Durable identity across the chain -- the invariant: **at most one job of a task instance is live (Pending,
Running, Paused) on all the platforms of its chain, and the task's ``task_state_store`` names the connection of the
newest one.** Four rules keep it:

1. Write-ahead. Before a job is submitted on a connection, the chain record (``task_state_store`` key
   :data:`CHAIN_KEY`: connection, position, job name, job id) names that connection; ``create_job`` starts only once
   the store has it. After a crash at any point the record names the connection of the newest job, or of a
   submission that never happened.
2. Cancel before moving on. The job on the current connection is canceled through ``cancel_job`` and must be
   stopped (or have ended) before the next connection is written ahead and submitted to. If it cannot be -- another
   try owns it now, the platform does not answer -- the try ends without submitting anything.
3. Adopt before submitting. A failover first looks for a live job of the task instance on the next connection (by
   the platform's deterministic name, ``find_job``) and takes it over rather than submitting another: a submission of
   a dying worker that landed late is adopted, not duplicated.
4. Look everywhere on reattach. A new try (a retry, a clear) looks first where the record points -- the stored
   handle when it is of that connection, else ``find_job`` -- then on every other connection of the chain. The job
   where the record points is the task's job; a live job elsewhere is a stray (a cancel that did not take) and is
   canceled. When the record's connection has nothing usable (or nothing is recorded: an emptied store), the first
   live or completed-but-unused job in chain order is taken over and the other live ones are canceled. With nothing
   found, the try submits anew at the head of the chain: a new submission always starts at the connection the DAG
   prefers.

Per-connection settings: ``backend_details`` is either flat -- the same settings for every connection of the chain
(each platform validates them: a key one platform does not know fails the task before anything runs, naming that
connection) -- or keyed by connection id (``{"lepton_prod": {...}, "slurm_a": {...}}``; a connection without an
entry gets none). Validation before anything runs covers every connection of the chain: its type, the image rule,
``num_nodes`` support, its backend details and that every input is reachable from it.

GPU-hours: every attempt -- a job that ended, failed over, was canceled or timed out, or a submission refused for
capacity -- is closed once (by job id) with the platform's own account of it (``get_job_usage``, read before any
cancel or cleanup): see :mod:`~airflow_provider_tao.accounting`. The attempts of a task instance accumulate across
its tries until a try uses a job's result; the next run (a clear after success) starts a new list.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_tao.accounting import (
    Attempt,
    JobUsage,
    attempt_of,
    describe,
    emit_failover,
    emit_metrics,
    total_gpu_hours,
)
from airflow_provider_tao.hooks import get_platform_hook
from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.jobs import ErrClass, FailureAnalysis, JobHandle, JobSpec, JobState, JobStatus
from airflow_provider_tao.records import CHAIN_KEY

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_tao.hooks.base import TAOPlatformHook

#: XCom key of the attempts so far, pushed as each one closes (the return value carries them too).
XCOM_ATTEMPTS = "tao_attempts"


class CapacityFailoverMixin:
    """Capacity failover and GPU-hours accounting for
    :class:`~airflow_provider_tao.operators.submit.TAOSubmitOperator`.

    Reads the operator's ``conn_id``, ``fallback_conn_ids``, ``capacity_timeout``, ``backend_details``,
    ``gpu_count`` and ``num_nodes``, and drives its submission steps (``_hook``, ``_job_name``,
    ``_prepared_spec``, ``_submit``, ``_watch``, ``_find_previous``, ``_outputs_of``).
    """

    conn_id: str | None
    fallback_conn_ids: list[str]
    capacity_timeout: float | None
    backend_details: dict[str, Any]
    gpu_count: int
    num_nodes: int
    log: Any
    _handle: JobHandle | None

    if TYPE_CHECKING:

        def _hook(self, position: int = 0) -> TAOPlatformHook: ...

        def _job_name(self, context: Context, hook: TAOPlatformHook) -> str: ...

        def _prepared_spec(
            self, context: Context, hook: TAOPlatformHook, name: str
        ) -> tuple[JobSpec, dict[str, str]]: ...

        def _submit(
            self,
            context: Context,
            hook: TAOPlatformHook,
            name: str,
            prepared: tuple[JobSpec, dict[str, str]] | None = None,
        ) -> tuple[TAOPlatformHook, JobHandle, dict[str, str]]: ...

        def _watch(
            self, context: Context, hook: TAOPlatformHook, handle: JobHandle, outputs: dict[str, str]
        ) -> dict[str, Any]: ...

        def _find_previous(
            self, context: Context, hook: TAOPlatformHook, name: str
        ) -> tuple[JobHandle, JobStatus] | None: ...

        def _outputs_of(self, context: Context, handle: JobHandle) -> dict[str, str]: ...

        def _reusable(
            self, hook: TAOPlatformHook, candidate: JobHandle, try_number: int
        ) -> tuple[JobHandle, JobStatus] | None: ...

    # ----------------------------------------------------------------- the chain

    @property
    def chain(self) -> list[str | None]:
        """The connections in the order they are tried: ``conn_id``, then ``fallback_conn_ids``."""
        return [self.conn_id, *self.fallback_conn_ids]

    def _check_chain_arguments(self) -> None:
        """Parse-time checks of ``fallback_conn_ids`` and ``capacity_timeout``."""
        if not all(isinstance(c, str) and c for c in self.fallback_conn_ids):
            raise JobValidationError(
                "fallback_conn_ids",
                f"{self.fallback_conn_ids!r} is not a list of connection ids",
                'Pass e.g. ["slurm_a"]',
            )
        seen = [c for c in self.chain if c is not None]
        if duplicates := sorted({c for c in seen if seen.count(c) > 1}):
            raise JobValidationError(
                "fallback_conn_ids",
                f"connection(s) {', '.join(map(repr, duplicates))} appear more than once in the chain",
                "Name each connection once (conn_id first, then the fallbacks in order)",
            )
        if self.capacity_timeout is None:
            return
        if self.capacity_timeout <= 0:
            raise JobValidationError(
                "capacity_timeout", f"{self.capacity_timeout} is not allowed", "Use seconds > 0 (or a timedelta)"
            )
        if not self.fallback_conn_ids:
            raise JobValidationError(
                "capacity_timeout",
                "has no effect without fallback_conn_ids (it bounds the wait before moving to the next connection)",
                "Add fallback_conn_ids, or bound the wait on the platform itself "
                "(e.g. backend_details unschedulable_timeout_seconds / capacity_timeout_seconds)",
            )

    def _position(self, conn_id: str | None) -> int | None:
        """Where ``conn_id`` is in the chain (None when it is not: the DAG changed since the job was submitted)."""
        return self.chain.index(conn_id) if conn_id in self.chain else None

    def _next_position(self, conn_id: str | None) -> int | None:
        position = self._position(conn_id)
        return position + 1 if position is not None and position + 1 < len(self.chain) else None

    def _capacity_timeout_for(self, handle: JobHandle) -> float | None:
        """The wait for resources allowed to ``handle``'s job: ``capacity_timeout`` unless its connection is the
        last of the chain (nowhere to go: the platform's own bound and the task's execution_timeout apply)."""
        return self.capacity_timeout if self._next_position(handle.conn_id) is not None else None

    def _details_for(self, conn_id: str | None) -> dict[str, Any]:
        """``backend_details`` of the job on ``conn_id``: the connection's entry when they are keyed by connection
        id, else all of them (the same settings on every connection)."""
        details = self.backend_details
        if len(self.chain) == 1 or not isinstance(details, dict):
            return dict(details)
        keyed = [key for key in details if key in self.chain]
        if not keyed:
            return dict(details)
        if plain := sorted(str(key) for key in details if key not in self.chain):
            raise JobValidationError(
                "backend_details",
                f"mixes entries keyed by connection ({', '.join(map(repr, keyed))}) with plain settings "
                f"({', '.join(map(repr, plain))})",
                "Key every entry by a connection id of the chain, or give plain settings for every connection",
            )
        entry = (details.get(conn_id) if conn_id is not None else None) or {}
        if not isinstance(entry, dict):
            raise JobValidationError(f"backend_details[{conn_id!r}]", f"{entry!r} is not a mapping", "Pass a dict")
        return dict(entry)

    def _where(self, position: int, hook: TAOPlatformHook) -> str:
        """How the task log names a connection of the chain."""
        role = "conn_id" if position == 0 else f"fallback_conn_ids[{position - 1}]"
        return f"connection {self.chain[position]!r} ({role}, {hook.platform})"

    def _validated_chain(self, context: Context, hook: TAOPlatformHook, name: str) -> tuple[JobSpec, dict[str, str]]:
        """Build and validate the job for EVERY connection of the chain before anything is submitted (image rules,
        ``num_nodes``, backend details, inputs reachable from each platform); the spec and outputs of ``hook``'s
        (the head's) job. An error names the connection that could never run the job."""
        if len(self.chain) == 1:
            return self._prepared_spec(context, hook, name)
        head: tuple[JobSpec, dict[str, str]] | None = None
        for position in range(len(self.chain)):
            current = hook if position == 0 else None
            try:
                current = current or self._hook(position)
                prepared = self._prepared_spec(
                    context, current, name if position == 0 else self._job_name(context, current)
                )
            except JobValidationError as exc:
                where = self._where(position, current) if current else f"connection {self.chain[position]!r}"
                raise JobValidationError(
                    f"{exc.parameter} on {where}", exc.problem, f"{exc.fix}, or leave this connection out of the chain"
                ) from exc
            head = head or prepared
        assert head is not None
        return head

    # ----------------------------------------------------------------- the chain record (write-ahead)

    def _chain_record(self, context: Context) -> dict[str, Any]:
        record = context["task_state_store"].get(CHAIN_KEY)
        return dict(record) if isinstance(record, dict) else {}

    def _write_ahead(self, context: Context, hook: TAOPlatformHook, name: str, job_id: str) -> None:
        """Record where this task instance's job is (being) submitted -- BEFORE the submission (rule 1)."""
        record = self._chain_record(context)
        record.update(
            conn_id=hook.conn_id,
            position=self._position(hook.conn_id),
            platform=hook.platform,
            job_name=name,
            job_id=job_id,
        )
        context["task_state_store"].set(CHAIN_KEY, record)

    def _start_attempts(self, context: Context, previous_run_used: bool) -> None:
        """A new run of the task instance (its last job's result was used: a clear after success) starts a new
        list of attempts; retries keep adding to it."""
        record = self._chain_record(context)
        if previous_run_used and record.get("attempts"):
            record["attempts"] = []
            context["task_state_store"].set(CHAIN_KEY, record)

    # ----------------------------------------------------------------- reattach across the chain (rule 4)

    def _find_in_chain(
        self, context: Context, hook: TAOPlatformHook, name: str
    ) -> tuple[TAOPlatformHook, JobHandle, JobStatus] | None:
        """This task instance's job on the chain: where the record points, else the first usable one in chain
        order; every other live job of the task instance on the chain is canceled as a stray."""
        if len(self.chain) == 1:
            found = self._find_previous(context, hook, name)
            return (hook, *found) if found else None
        recorded = self._position(self._chain_record(context).get("conn_id"))
        order = [recorded or 0, *(p for p in range(len(self.chain)) if p != (recorded or 0))]
        chosen: tuple[TAOPlatformHook, JobHandle, JobStatus] | None = None
        others: list[tuple[int, TAOPlatformHook, JobHandle, JobStatus]] = []
        for position in order:
            if position == order[0]:
                current = hook if position == 0 else self._hook(position)
                found = self._find_previous(context, current, self._job_name(context, current))
                if found is not None:
                    chosen = (current, *found)
                continue
            try:
                current = self._hook(position)
                other = self._reusable_at(current, self._job_name(context, current), context["ti"].try_number)
            except Exception as exc:  # a fallback that cannot be asked now: looked at again on the next reattach
                self.log.warning("Cannot look for a job of this task on connection %r: %s", self.chain[position], exc)
                continue
            if other is not None:
                others.append((position, current, *other))
        if chosen is None and others:
            position, current, handle, status = others.pop(0)
            chosen = (current, handle, status)
            self.log.warning(
                "No usable job where the chain record points (%r); job %s on %s is this task's job",
                self._chain_record(context).get("conn_id"), handle.job_id, self._where(position, current),
            )  # fmt: skip
        for position, current, stray, status in others:
            if status.state is not JobState.COMPLETE:
                self._cancel_stray(context, position, current, stray, chosen)
        if chosen is not None and chosen[0].conn_id != self._chain_record(context).get("conn_id"):
            self._write_ahead(context, chosen[0], chosen[1].name, chosen[1].job_id)
        return chosen

    def _reusable_at(self, hook: TAOPlatformHook, name: str, try_number: int) -> tuple[JobHandle, JobStatus] | None:
        """The task instance's newest job on ``hook``'s connection when the decision adopts it or takes its result
        (live, or complete and unused); its facts unknown: raises for a retry (operators/decisions.py)."""
        handle = hook.find_job(name)
        return None if handle is None else self._reusable(hook, handle, try_number)

    def _cancel_stray(
        self,
        context: Context,
        position: int,
        hook: TAOPlatformHook,
        stray: JobHandle,
        kept: tuple[TAOPlatformHook, JobHandle, JobStatus] | None,
    ) -> None:
        owned = stray.owned_by(context["ti"].try_number)
        hook.claim_job(owned)
        outcome = hook.cancel_job(owned)
        if outcome.over:
            hook.cleanup_job(owned)
        kept_text = f"job {kept[1].job_id} on connection {kept[0].conn_id!r}" if kept else "a new submission"
        self.log.warning(
            "Job %s on %s, a stray of this task instance (its job is %s): %s",
            stray.job_id, self._where(position, hook), kept_text, outcome.value,
        )  # fmt: skip

    # ----------------------------------------------------------------- failing over

    def _fails_over(self, handle: JobHandle, outcome: str, analysis: FailureAnalysis | None) -> bool:
        """Whether a resumed job moves on: it waited for resources past ``capacity_timeout``, or the platform gave
        up on it for capacity and the chain goes on. Never for a program error, OOM or anything else."""
        if outcome == "capacity":
            return True
        capacity = analysis is not None and analysis.err_class is ErrClass.ERR_CAPACITY
        return capacity and self._next_position(handle.conn_id) is not None

    def _fail_over(self, context: Context, hook: TAOPlatformHook, handle: JobHandle, reason: str) -> dict[str, Any]:
        """Close the attempt, cancel the job (rule 2), then adopt or submit the job on the next connection (rules 3
        and 1) and watch it -- in this try. A job that got its resources after all (between the trigger's verdict
        and now) is kept and watched again."""
        if hook.get_job_status(handle).state in (JobState.RUNNING, JobState.COMPLETE):
            self.log.info("Job %s got its resources after all: keeping it", handle.job_id)
            return self._watch(context, hook, handle, self._outputs_of(context, handle))
        self._close_attempt(context, hook, handle, outcome="capacity", reason=reason)
        if not hook.cancel_job(handle).over:
            raise AirflowException(
                f"Job {handle.job_id} found no capacity, but another try owns it now: not failing over from this try"
            )
        hook.cleanup_job(handle)
        self._handle = None
        position = self._next_position(handle.conn_id)
        if position is None:
            raise AirflowException(
                f"Job {handle.job_id} on the {hook.platform} platform (connection {handle.conn_id!r}) failed with "
                f"{ErrClass.ERR_CAPACITY.value} (retriable): {reason}. It was canceled; the chain has no next "
                "connection"
            )
        target = self._move_to(context, position, handle, f"{hook.platform} job {handle.job_id}", reason)
        try:
            name = self._job_name(context, target)
        except JobValidationError as exc:
            raise AirflowFailException(f"Bad input, nothing more was submitted: {exc}") from exc
        adopted = self._reusable_at(target, name, context["ti"].try_number)
        if adopted is not None:
            found = adopted[0]
            taken = found.owned_by(context["ti"].try_number)
            target.claim_job(taken)
            self._write_ahead(context, target, taken.name, taken.job_id)
            self.log.warning(
                "Adopted job %s already on %s (a late submission)", taken.job_id, self._where(position, target)
            )
            return self._watch(context, target, taken, self._outputs_of(context, found))
        return self._watch(context, *self._submit(context, target, name))

    def _refused_for_capacity(
        self, context: Context, hook: TAOPlatformHook, spec: JobSpec, reason: str
    ) -> TAOPlatformHook | None:
        """A submission the platform refused for capacity: closed as an attempt; the hook of the next connection of
        the chain to submit to, or None when there is none (the refusal then fails the try as on one platform)."""
        position = self._next_position(hook.conn_id)
        if position is None:
            return None
        refused = hook.new_handle(spec, context["ti"].try_number)
        usage = JobUsage(queued_at=refused.submitted_at, ended_at=time.time(), source="refused at submission")
        self._close_attempt(context, hook, refused, outcome="capacity", reason=reason, usage=usage)
        return self._move_to(context, position, refused, f"{hook.platform} (refused at submission)", reason)

    def _move_to(self, context: Context, position: int, source: JobHandle, what: str, reason: str) -> TAOPlatformHook:
        """The hook of the chain's ``position``, with the move in the task log and in the metrics."""
        try:
            target = self._hook(position)
        except JobValidationError as exc:
            raise AirflowFailException(f"Bad input, nothing more was submitted: {exc}") from exc
        self.log.warning(
            "Failing over from %s (connection %r) to %s: %s",
            what,
            source.conn_id,
            self._where(position, target),
            reason,
        )
        self._emit(lambda tags: emit_failover(tags, source, target.platform, target.conn_id or ""), context)
        return target

    # ----------------------------------------------------------------- GPU-hours

    def _close_attempt(
        self,
        context: Context,
        hook: TAOPlatformHook,
        handle: JobHandle,
        *,
        outcome: str,
        reason: str,
        usage: JobUsage | None = None,
    ) -> None:
        """Record one attempt (once per job): in the task state, the task log, XCom and Airflow's metrics. What the
        platform reports of the job is read here, before any cancel or cleanup; reading it never fails the task."""
        record = self._chain_record(context)
        attempts = list(record.get("attempts") or [])
        if any(a.get("job_id") == handle.job_id for a in attempts):
            return
        if usage is None:
            try:
                usage = hook.get_job_usage(handle)
            except Exception as exc:
                self.log.warning("The %s platform did not say what job %s used: %s", hook.platform, handle.job_id, exc)
                usage = JobUsage(queued_at=handle.submitted_at, source="the submission time only")
        attempt = attempt_of(
            handle,
            usage,
            outcome=outcome,
            reason=reason,
            try_number=context["ti"].try_number,
            requested_gpus=self.gpu_count,
            requested_nodes=self.num_nodes,
        )
        attempts.append(attempt.to_json())
        record["attempts"] = attempts
        context["task_state_store"].set(CHAIN_KEY, record)
        context["ti"].xcom_push(key=XCOM_ATTEMPTS, value=attempts)
        self.log.info(describe(len(attempts), attempt))
        self._emit(lambda tags: emit_metrics(attempt, tags), context)

    def _run_seconds(self, context: Context, handle: JobHandle) -> float | None:
        """The run time the platform reported for ``handle`` (its closed attempt's), or None."""
        for attempt in self._chain_record(context).get("attempts") or []:
            if attempt.get("job_id") == handle.job_id and attempt.get("run_seconds") is not None:
                return float(attempt["run_seconds"])
        return None

    def _close_left_behind(self, context: Context, stored: Any) -> None:
        """The attempt of the task instance's last job when it ended while no try watched it (its try was killed,
        cleared or marked failed while the job ran): the next try closes it, so its GPU time counts too. Best
        effort: a platform that cannot be asked now leaves it open."""
        if not isinstance(stored, dict) or stored.get("consumed") or not isinstance(stored.get("handle"), dict):
            return
        handle = JobHandle.from_json(stored["handle"])
        if any(a.get("job_id") == handle.job_id for a in self._chain_record(context).get("attempts") or []):
            return
        try:
            hook = get_platform_hook(handle.platform, handle.conn_id)
            hook.load_connection()
            status = hook.get_job_status(handle)
        except Exception as exc:
            self.log.info("Cannot tell how job %s ended (%s); its attempt stays open", handle.job_id, exc)
            return
        if status.state.is_terminal:
            outcome = {JobState.COMPLETE: "complete", JobState.ERROR: "error"}.get(status.state, "canceled")
            reason = f"{status.message} (it ended while no try watched it)".lstrip()
            self._close_attempt(context, hook, handle, outcome=outcome, reason=reason)

    def _emit(self, send: Any, context: Context) -> None:
        """Metrics are never worth failing the task."""
        ti = context["ti"]
        tags = getattr(ti, "stats_tags", None)
        if not isinstance(tags, dict):
            tags = {"dag_id": ti.dag_id, "task_id": ti.task_id}
        try:
            send(tags)
        except Exception as exc:
            self.log.warning("Could not send the job's metrics: %s", exc)

    def _attempts_report(self, context: Context) -> dict[str, Any]:
        """``attempts`` and their total ``gpu_hours`` for the task's XCom (and one summary line of the log)."""
        attempts = [Attempt.from_json(a) for a in self._chain_record(context).get("attempts") or []]
        total = total_gpu_hours(attempts)
        self.log.info(
            "GPU-hours of this task instance: %s over %d attempt(s)%s",
            "unknown" if total is None else f"{total:.4f}",
            len(attempts),
            "" if len(attempts) < 2 else " on " + " -> ".join(f"{a.platform} ({a.outcome})" for a in attempts),
        )
        return {"attempts": [a.to_json() for a in attempts], "gpu_hours": total}


def seconds_of(value: float | timedelta | None) -> float | None:
    """``capacity_timeout`` as seconds (a number or a ``timedelta``)."""
    if value is None:
        return None
    return value.total_seconds() if isinstance(value, timedelta) else float(value)
