"""The cost guard: instances this provider created are deleted once their lease expired or their task is done."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from airflow_provider_tao.hooks.base import Recorded
from airflow_provider_tao.hooks.brev import lease as leases
from airflow_provider_tao.hooks.brev.cli import BrevError
from airflow_provider_tao.hooks.brev.lease import ReapDecision
from airflow_provider_tao.hooks.brev.session import BrevSessionHook
from airflow_provider_tao.jobs import JobHandle


class BrevReapHook(BrevSessionHook):
    """Judges every instance of the account by its lease and acts on it."""

    def lease_expired(self, handle: JobHandle, now: float | None = None) -> bool:
        """A job on an instance this provider created expires with the instance's lease (as the last scan of
        :meth:`list_active_jobs` read it); a job on a reused instance after ``[tao] lease_hours``."""
        with self._lock:
            lease = self._leases.get(handle.backend_job_id)
        if leases.own_lease(lease, handle.backend_job_id):
            assert lease is not None
            return (time.time() if now is None else now) >= float(lease.get("expires_at") or 0)
        return super().lease_expired(handle, now)

    def reap_resources(
        self, task_state: Callable[[Mapping[str, Any]], str | None], *, dry_run: bool, recorded: Recorded | None = None
    ) -> list[dict[str, str]]:
        """``airflow tao reap``'s cost guard: :meth:`reap` on this connection."""
        return [
            {"resource": d.instance, "action": d.action, "why": d.reason}
            for d in self.reap(task_state=task_state, dry_run=dry_run, recorded=recorded)
        ]

    def reap(
        self,
        task_state: Callable[[Mapping[str, Any]], str | None] | None = None,
        now: float | None = None,
        *,
        dry_run: bool = False,
        recorded: Recorded | None = None,
    ) -> list[ReapDecision]:
        """Delete every instance this provider created whose lease has expired or whose task is finished and on which
        no job runs any more (a running job of a finished task is the orphan sweep's to judge: it may have been kept
        with ``cancel_on_kill=False``); never one without this provider's lease. An expired instance whose task still
        watches it (running, deferred) is not pulled from under the task: its jobs are canceled through the one cancel
        routine (the task fails with ERR_CANCELED, not retried, and deletes the instance), and a later reap deletes it
        if the task did not.
        Every decision is logged with its reason. One ``brev ls --json`` and one exec per running instance.

        :param task_state: the Airflow state of a lease's task instance (see
            :func:`~airflow_provider_tao.hooks.brev.lease.task_state_lookup`); without it only expired leases are
            reaped, and at once.
        :param now: the time to judge leases by (epoch seconds; default now).
        :param dry_run: decide and report; delete and cancel nothing.
        :param recorded: a job's instance -> its task instance and job name, as this Airflow's task records hold them
            (:func:`~airflow_provider_tao.sweeper.recorded_jobs`): an instance that cannot be exec'd (it failed, it
            was stopped) has no readable lease, but the task's own one -- named after its job -- is known from them.
        """
        now = time.time() if now is None else now
        instances = self.session.instances()
        scans = self._scan_all(instances)
        decisions = []
        for name in sorted(instances):
            entry = instances[name]
            scan = scans.get(name, "unread")
            origin = (recorded or {}).get(name)
            decision = self._judge(name, entry, scan, task_state, now=now, dry_run=dry_run, origin=origin)
            self.log.info("Reaper: %s %s: %s", decision.action, decision.instance, decision.reason)
            decisions.append(decision)
        return decisions

    def _judge(
        self,
        name: str,
        entry: Mapping[str, Any],
        scan: leases.Scan,
        task_state: Callable[[Mapping[str, Any]], str | None] | None,
        *,
        now: float,
        dry_run: bool,
        origin: Mapping[str, Any] | None,
    ) -> ReapDecision:
        """:func:`~airflow_provider_tao.hooks.brev.lease.judge`, then the act: delete the instance, or cancel the
        jobs of an expired one whose task still watches it (the task deletes it; or the next reap once nothing runs
        on it)."""
        action, reason = leases.judge(name, entry, scan, task_state, now=now, origin=origin)
        if action in ("kept", "skipped"):
            return ReapDecision(name, action, reason)
        if dry_run:
            return ReapDecision(name, f"would {action}", reason)
        if action == "cancel jobs":
            assert not isinstance(scan, str)
            for found in scan[1]:
                self.cancel_job(self._handle_of(name, entry, found), requested_by="reap: lease expired")
            return ReapDecision(name, "jobs canceled", reason)
        try:
            deleted = self.session.delete(name)
        except BrevError as exc:
            return ReapDecision(name, "failed", f"{reason}, but brev delete failed: {exc}")
        return ReapDecision(name, "deleted" if deleted else "kept", reason if deleted else f"{reason}; already gone")
