"""1,000 deferred jobs on ONE triggerer process: the provider's triggers (one batched status call per connection per
interval) vs one trigger per job polling its own job (what the TAO SDK and most providers' triggers do), same run,
same simulated platforms. Not a test: it prints both sides.

The platforms are simulated hooks (a real ``TAOPlatformHook`` subclass each, registered in ``PLATFORMS``) with the
latency and concurrency of the real backends as measured on this machine (``benchmarks/slurm_polling.py``,
``docker_polling.py``, ``k8s_polling.py`` and ``../shared/notes/anchor-bench.md``):

========== ============================================= ==================================================
platform   one status call                               concurrency the backend takes
========== ============================================= ==================================================
slurm      ``squeue`` on a kept SSH connection: 45 ms     10 (sshd's MaxSessions on one connection)
           + 0.02 ms per job asked about
docker     ``GET /containers/json``: 8 ms + 0.03 ms/job   16
kubernetes Job list: 25 ms + 0.05 ms per job              20 (the API server's fair-queuing seats of one user)
local      job folders read: 0.2 ms per job               unlimited
========== ============================================= ==================================================

Every job ends at a random moment within ``--duration`` seconds; both sides run the real ``TAOJobTrigger`` code path
for what they share (the trigger of the naive side replaces only the poller). Measured: backend calls and their
rate, seconds calls waited for a backend slot (queueing = the platform being overloaded), the event loop's worst
lag (a 50 ms ticker), this process's CPU and RSS per watched job, and how late each job's end was noticed.

    python benchmarks/triggerer_load.py --jobs 1000 --interval 5 --duration 60
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import structlog
from measure import cpu, print_side_by_side, rss_mib

from airflow_provider_tao import hooks
from airflow_provider_tao.hooks.base import TAOPlatformHook
from airflow_provider_tao.jobs import JobHandle, JobState, JobStatus
from airflow_provider_tao.triggers.job import StatusPoller, TAOJobTrigger


@dataclass
class Backend:
    """One platform's server: latency per call, a limited number of calls at once, and the jobs' end times."""

    base_ms: float
    per_job_ms: float
    slots: int
    ends: dict[str, float] = field(default_factory=dict)
    calls: int = 0
    queued_seconds: float = 0.0
    semaphore: asyncio.Semaphore | None = None

    async def call(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        if self.semaphore is None:
            self.semaphore = asyncio.Semaphore(self.slots)
        asked = time.monotonic()
        async with self.semaphore:
            self.queued_seconds += time.monotonic() - asked
            self.calls += 1
            await asyncio.sleep((self.base_ms + self.per_job_ms * len(job_ids)) / 1000)
        now = time.time()
        return {
            job_id: JobStatus(JobState.COMPLETE if now >= self.ends[job_id] else JobState.RUNNING) for job_id in job_ids
        }


BACKENDS: dict[str, Backend] = {}
MODELS = {
    "sim_slurm": (45.0, 0.02, 10),
    "sim_docker": (8.0, 0.03, 16),
    "sim_kubernetes": (25.0, 0.05, 20),
    "sim_local": (0.0, 0.2, 1_000_000),
}


class SimHook(TAOPlatformHook):
    """A platform whose status calls cost what its model says; one batched call serves many jobs."""

    platform: ClassVar[str] = "sim"
    conn_type = "tao_sim"
    default_conn_name = "tao_sim_default"
    hook_name = "TAO simulated"
    marks_storage = "memory"

    def _backend(self) -> Backend:
        return BACKENDS[self.platform]

    async def aget_job_statuses(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        return await self._backend().call([h.job_id for h in handles])

    def read_marks(self, handle: JobHandle) -> dict[str, Any]:
        return {}

    def write_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        return None


def _register() -> None:
    for name in MODELS:
        cls = type(f"{name.title().replace('_', '')}Hook", (SimHook,), {"platform": name, "conn_type": f"tao_{name}"})
        globals()[cls.__name__] = cls
        hooks.PLATFORMS[name] = (f"tao_{name}", f"{__name__}.{cls.__name__}")
        os.environ[f"AIRFLOW_CONN_{name.upper()}_CONN"] = json.dumps({"conn_type": f"tao_{name}"})


def _handles(jobs: int, duration: float) -> list[JobHandle]:
    rng = random.Random(7)
    now = time.time()
    handles = []
    for index in range(jobs):
        platform = list(MODELS)[index % len(MODELS)]
        handle = JobHandle(platform, f"{platform}_conn", f"{index:012x}", f"job-{index}", submitted_at=now)
        BACKENDS[platform].ends[handle.job_id] = now + rng.uniform(duration * 0.2, duration)
        handles.append(handle)
    return handles


async def _lag_monitor(stop: asyncio.Event, worst: list[float]) -> None:
    while not stop.is_set():
        before = time.monotonic()
        await asyncio.sleep(0.05)
        worst[0] = max(worst[0], time.monotonic() - before - 0.05)


async def _provider(handle: JobHandle, interval: float) -> float:
    trigger = TAOJobTrigger(handle=handle.to_json(), poll_interval=interval, stream_logs=False)
    events = trigger.run()
    try:
        await events.__anext__()
    finally:
        await events.aclose()
    return time.time()


async def _naive(handle: JobHandle, interval: float) -> float:
    """One trigger per job, polling its own job every interval (no shared poller)."""
    hook = hooks.get_platform_hook(handle.platform, handle.conn_id)
    await hook.aload_connection()
    while True:
        try:
            status = (await hook.aget_job_statuses([handle]))[handle.job_id]
        except Exception:  # an outage: keep waiting, as a trigger does
            status = JobStatus.unknown("status call failed")
        if status.state.is_terminal:
            return time.time()
        await asyncio.sleep(interval)


async def _run(kind: str, jobs: int, interval: float, duration: float) -> dict[str, Any]:
    BACKENDS.clear()
    BACKENDS.update({name: Backend(*model) for name, model in MODELS.items()})
    StatusPoller._instances.clear()
    handles = _handles(jobs, duration)
    gc.collect()
    rss0, cpu0, start = rss_mib(), cpu(), time.monotonic()
    stop, worst = asyncio.Event(), [0.0]
    monitor = asyncio.create_task(_lag_monitor(stop, worst))
    watch = _provider if kind == "provider" else _naive
    tasks = [asyncio.create_task(watch(h, interval)) for h in handles]
    await asyncio.sleep(min(interval * 3, duration / 2))
    rss_peak = rss_mib()
    noticed = await asyncio.gather(*tasks)
    elapsed = time.monotonic() - start
    stop.set()
    await monitor
    late = [seen - BACKENDS[h.platform].ends[h.job_id] for h, seen in zip(handles, noticed, strict=True)]
    calls = sum(b.calls for b in BACKENDS.values())
    return {
        "kind": kind,
        "seconds": elapsed,
        "calls": calls,
        "calls_per_s": calls / elapsed,
        "by_platform": {name: b.calls for name, b in BACKENDS.items()},
        "queued_s": sum(b.queued_seconds for b in BACKENDS.values()),
        "cpu_s": cpu() - cpu0,
        "rss_per_job_kib": (rss_peak - rss0) * 1024 / jobs,
        "loop_lag_ms": worst[0] * 1000,
        "late_p50": statistics.median(late),
        "late_p95": statistics.quantiles(late, n=20)[18],
        "late_max": max(late),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--duration", type=float, default=60.0)
    args = parser.parse_args()
    # 1,000 triggers' "Watching job ..." lines are not the point here
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    _register()
    results = [asyncio.run(_run(kind, args.jobs, args.interval, args.duration)) for kind in ("provider", "naive")]
    print(f"{args.jobs} jobs ({len(MODELS)} platforms, one connection each), poll interval {args.interval} s, "
          f"jobs end within {args.duration} s")  # fmt: skip
    rows = [
        ("backend calls", "calls", "{:.0f}"),
        ("backend calls / s", "calls_per_s", "{:.1f}"),
        ("s waited for a backend slot", "queued_s", "{:.1f}"),
        ("CPU s (this process)", "cpu_s", "{:.2f}"),
        ("RSS per watched job, KiB", "rss_per_job_kib", "{:.1f}"),
        ("worst event-loop lag, ms", "loop_lag_ms", "{:.0f}"),
        ("end noticed late, p50 s", "late_p50", "{:.2f}"),
        ("end noticed late, p95 s", "late_p95", "{:.2f}"),
        ("end noticed late, max s", "late_max", "{:.2f}"),
        ("run, s", "seconds", "{:.1f}"),
    ]
    provider, naive = results
    print_side_by_side(rows, provider, naive, ("provider", "per-job"))
    print("calls by platform:", {"provider": provider["by_platform"], "per-job": naive["by_platform"]})


if __name__ == "__main__":
    main()
