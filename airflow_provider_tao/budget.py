"""A GPU-hour budget (``max_gpu_hours``): the parameter checked, and the one routine of a job's GPU-hours so far.

GPU-hours are GPUs x the hours the job ran, from its platform's own times (:func:`~airflow_provider_tao.accounting.
attempt_of`, as the task's accounting): a job that waits in a queue uses none. An AutoML search counts its trials by
:func:`job_gpu_hours`; a single job's trigger wakes at :func:`budget_at` (the earliest the job can pass its budget),
and its task reads the job's GPU-hours then and decides (``operators/decisions.py``: ``ERR_BUDGET``, never retried).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from airflow_provider_tao.accounting import attempt_of
from airflow_provider_tao.hooks.errors import JobValidationError

if TYPE_CHECKING:
    from airflow_provider_tao.hooks.base import TAOPlatformHook
    from airflow_provider_tao.jobs import JobHandle


def checked_max_gpu_hours(value: Any, gpu_count: int = 0) -> float | None:
    """``max_gpu_hours`` as a number of hours (None: no budget); bad input names the parameter and the fix."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise JobValidationError(
            "max_gpu_hours",
            f"{value!r} is not a positive number of GPU-hours",
            "Give a number > 0 (e.g. 2.5), or None for no budget",
        )
    if gpu_count < 0:
        raise JobValidationError(
            "max_gpu_hours", "gpu_count=-1 (every visible GPU) has no known GPU count to count hours by",
            "Give gpu_count as a number",
        )  # fmt: skip
    return float(value)


def job_gpu_hours(
    hook: TAOPlatformHook, handle: JobHandle, *, gpu_count: int, num_nodes: int, now: float | None = None
) -> float:
    """GPU-hours ``handle``'s job used so far (its platform's start, and its end or ``now``); raises when the
    platform cannot say -- the caller decides what an unread fact means."""
    usage = hook.get_job_usage(handle)
    attempt = attempt_of(
        handle, usage, outcome="", reason="", try_number=handle.try_number,
        requested_gpus=gpu_count, requested_nodes=num_nodes, now=now,
    )  # fmt: skip
    return attempt.gpu_hours or 0.0


def budget_at(max_gpu_hours: float | None, used: float, gpus: int, now: float | None = None) -> float | None:
    """Epoch seconds at which a job of ``gpus`` GPUs that used ``used`` GPU-hours passes ``max_gpu_hours`` if it
    runs from ``now`` on (None: no budget, or a job without GPUs that never passes one)."""
    if max_gpu_hours is None or gpus <= 0:
        return None
    now = time.time() if now is None else now
    return now + max(0.0, max_gpu_hours - used) * 3600.0 / gpus
