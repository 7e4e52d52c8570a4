"""``max_gpu_hours`` on a single job: when its trigger wakes (:func:`~airflow_provider_tao.budget.budget_at`),
what the decision reads (:func:`~airflow_provider_tao.budget.job_gpu_hours`), and the act of its ``ERR_BUDGET``
verdict (``operators/decisions.py``): the job canceled, the task failed for good with the class that says why."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_tao.budget import budget_at, job_gpu_hours
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobState
from airflow_provider_tao.operators.decisions import Verdict

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_tao.hooks.base import TAOPlatformHook


class BudgetGuardMixin:
    """For :class:`~airflow_provider_tao.operators.lifecycle.JobLifecycleMixin`: the job's GPU-hour budget."""

    max_gpu_hours: float | None
    gpu_count: int
    num_nodes: int
    log: Any

    if TYPE_CHECKING:

        def _keep_end(self, context: Context, handle: JobHandle, state: str, err_class: str = "") -> None: ...

        def _clean_up(self, hook: TAOPlatformHook, handle: JobHandle, *, adoptable: bool = False) -> None: ...

    def _stop_for_limit(
        self, context: Context, hook: TAOPlatformHook, handle: JobHandle, err_class: ErrClass, *, cancel: bool,
        ended: bool = False,
    ) -> None:  # fmt: skip
        """A limit passed (the deadline, the budget): cancel the job when ``cancel`` (a failed cancel is left to
        ``airflow tao reap``: the verdict stands), clean up after it once stopped (``ended``: it already was) --
        a job left running keeps what it needs (SLURM's env file, Lepton's secrets) -- and record how it ended."""
        stopped = ended
        if cancel:
            try:
                stopped = hook.cancel_job(handle).over
            except Exception as exc:
                self.log.warning("Canceling job %s failed (%s): airflow tao reap stops it", handle.job_id, exc)
        if stopped:
            self._clean_up(hook, handle)
        self._keep_end(context, handle, JobState.CANCELED.value, err_class.value)

    def _gpu_hours(self, hook: TAOPlatformHook, handle: JobHandle) -> float:
        return job_gpu_hours(hook, handle, gpu_count=self.gpu_count, num_nodes=self.num_nodes, now=time.time())

    def _job_budget_at(self, hook: TAOPlatformHook, handle: JobHandle) -> float | None:
        """When the job may pass its budget if it runs from now on (an unread usage counts as none used: the
        trigger wakes early, and the decision reads the usage again)."""
        if self.max_gpu_hours is None:
            return None
        try:
            used = self._gpu_hours(hook, handle)
        except Exception as exc:
            self.log.warning("No usage for job %s yet (%s): its budget counts from now", handle.job_id, exc)
            used = 0.0
        return budget_at(self.max_gpu_hours, used, max(self.gpu_count, 0) * self.num_nodes)

    def _over_budget(self, hook: TAOPlatformHook, handle: JobHandle) -> Callable[[], bool] | None:
        """The read of the ``over_budget`` fact (None: no budget)."""
        limit = self.max_gpu_hours
        if limit is None:
            return None
        return lambda: self._gpu_hours(hook, handle) >= limit

    def _stop_over_budget(
        self, context: Context, hook: TAOPlatformHook, handle: JobHandle, verdict: Verdict
    ) -> NoReturn:
        """The job passed ``max_gpu_hours``: cancel it, record it, and fail the task for good."""
        self._stop_for_limit(context, hook, handle, ErrClass.ERR_BUDGET, cancel=verdict.stop, ended=verdict.clean_up)
        try:
            used = f"{self._gpu_hours(hook, handle):.4f}"
        except Exception:
            used = "unknown"
        raise AirflowFailException(
            f"Job {handle.job_id} passed max_gpu_hours={self.max_gpu_hours} ({used} GPU-hours used): "
            f"{ErrClass.ERR_BUDGET.value}, it was canceled; not retried"
        )
