"""1,000 deferred jobs on ONE triggerer process: the provider's triggers (one batched status call per connection per
interval) vs one trigger per job polling its own job (what the TAO SDK and most providers' triggers do), same run,
same simulated platforms. Not a test: it prints both sides, at each job count, and whether the goals are met.

The platforms are simulated hooks (a real ``TAOPlatformHook`` subclass each, registered in ``PLATFORMS``) whose status
call costs what the real hook's costs: its backend calls (with the real hook's batching), their latency and the
concurrency the backend takes, and -- where the real hook runs a sync client in ``asyncio.to_thread`` -- a worker
thread of the event loop's default executor for the call's whole duration. Latencies as measured on this machine
(``benchmarks/slurm_polling.py``, ``docker_polling.py``, ``k8s_polling.py``, ``../shared/notes/anchor-bench.md``) or,
for the cloud platforms, measured against the fakes (``tests/leptonfake``: 2 ms a list; ``tests/brevfake``: 56 ms a
``brev ls``, 111 ms a ``brev exec``) plus the network's round trips:

========== ================================================== ========== ========================================
platform   one status poll                                    at once    thread
========== ================================================== ========== ========================================
slurm      ``squeue`` on a kept SSH connection: 45 ms          10 (sshd   no (asyncssh)
           + 0.02 ms per job asked about                       sessions)
docker     ``GET /containers/json``: 8 ms + 0.03 ms/job        16         yes (docker-py)
kubernetes Job list: 25 ms + 0.05 ms per job                   20 (API    no (kubernetes_asyncio)
                                                               seats)
local      job folders read: 0.2 ms per job                    unlimited  yes
lepton     job list over HTTPS: 40 ms + 0.05 ms per job, one   10 (HTTP   yes (requests)
           request per page of 500                             pool)
brev       ``brev ls --json``: 100 ms, then one ``brev exec``  64         yes, plus the hook's pool of 8 for
           per instance with watched jobs (ssh): 150 ms +                 the execs
           0.1 ms per job; the jobs share ``--instances``
========== ================================================== ========== ========================================

Every job ends at a random moment between 20 % and 100 % of ``--duration``; both sides run the real
``TAOJobTrigger`` code path for what they share (the trigger of the naive side replaces only the poller). Each side
at each job count runs in a fresh interpreter (memory freed by one side would otherwise hide the other's growth).
Measured: backend calls per interval per connection while every job runs (from the first interval to the first
job's end), seconds calls waited for a backend slot (queueing = the platform being overloaded), the event loop's
worst lag (a 50 ms ticker, wall clock: on a shared machine it counts other processes' time too) and its longest turn
in CPU time (the stall the triggerer's work causes; the lag goal is judged on it), the longest full garbage
collection, this process's CPU per job per poll (start-up included) and RSS growth per watched job, and how late each
job's end was noticed (the trigger's event; the task's success follows on a worker). "unfrozen+logs" is the provider
with ``[tao] freeze_triggerer_heap`` off.

    python benchmarks/triggerer_load.py --jobs 250 1000 --interval 5 --duration 120
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
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar

import structlog
from measure import cpu, first_event, rss_mib

from airflow_provider_tao import hooks
from airflow_provider_tao.hooks.base import TAOPlatformHook
from airflow_provider_tao.hooks.brev.session import PROBE_WORKERS
from airflow_provider_tao.jobs import JobHandle, JobState, JobStatus
from airflow_provider_tao.triggers.job import TAOJobTrigger
from airflow_provider_tao.triggers.poller import StatusPoller

KIB_PER_JOB_GOAL = 16.0
CPU_MS_PER_JOB_POLL_GOAL = 0.05
LOOP_LAG_MS_GOAL = 250.0
DETECTION_SLACK_S = 2.0  # p95 goal: one poll interval + this
#: Share of the jobs that print a line every second; the others print one line a minute (a quiet training job).
CHATTY_SHARE = 0.1
#: The most lines one simulated log read returns (the hooks bound every read in bytes).
LINES_PER_READ = 200


@dataclass
class Backend:
    """One platform's server as one status poll of the real hook meets it: a list call (pages of ``page_size``
    jobs), then, with ``group_ms``, one more call per group of jobs (Brev: an exec per instance), each costing its
    latency, at most ``slots`` polls at once; ``threaded`` polls hold an event-loop worker thread meanwhile."""

    base_ms: float
    per_job_ms: float
    slots: int
    threaded: bool = False
    page_size: int = 0  # 0: one list call whatever the number of jobs
    group_ms: float = 0.0
    log_ms: float = 0.0  # one log read, a call of its own; 0: the status call reads the logs (or local files)
    ends: dict[str, float] = field(default_factory=dict)
    starts: dict[str, float] = field(default_factory=dict)
    periods: dict[str, float] = field(default_factory=dict)  # seconds between two lines of a job's log
    call_times: list[float] = field(default_factory=list)
    log_call_times: list[float] = field(default_factory=list)
    answered: int = 0  # job statuses returned: the jobs' polls
    queued_seconds: float = 0.0
    semaphore: asyncio.Semaphore | None = None

    def costs(self, handles: Sequence[JobHandle]) -> tuple[list[float], list[float]]:
        """Seconds of each backend call one poll of ``handles`` makes: the list's pages (one after the other), and
        the groups' calls (side by side)."""
        pages = len(handles) // self.page_size + 1 if self.page_size else 1
        listing = [(self.base_ms + self.per_job_ms * len(handles) / pages) / 1000] * pages
        groups: dict[str, int] = {}
        if self.group_ms:
            for handle in handles:
                groups[handle.backend_job_id] = groups.get(handle.backend_job_id, 0) + 1
        return listing, [(self.group_ms + self.per_job_ms * jobs) / 1000 for jobs in groups.values()]

    async def poll(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        if self.semaphore is None:
            self.semaphore = asyncio.Semaphore(self.slots)
        listing, groups = self.costs(handles)
        asked = time.monotonic()
        async with self.semaphore:
            self.queued_seconds += time.monotonic() - asked
            self.call_times += [time.time()] * (len(listing) + len(groups))
            if self.threaded:
                await asyncio.to_thread(_blocking_poll, listing, groups)
            else:
                await asyncio.sleep(sum(listing))
                await asyncio.gather(*(asyncio.sleep(seconds) for seconds in groups))
        self.answered += len(handles)
        now = time.time()
        return {
            h.job_id: JobStatus(JobState.COMPLETE if now >= self.ends[h.job_id] else JobState.RUNNING) for h in handles
        }

    def lines(self, job_id: str, now: float) -> int:
        """Lines the job's log holds at ``now`` (one at its start, then one every period, one more at its end)."""
        end = self.ends[job_id]
        return 1 + int((min(now, end) - self.starts[job_id]) / self.periods[job_id]) + (now >= end)

    async def read_log(self, handle: JobHandle, cursor: str) -> tuple[str, str]:
        """One read of the job's log from ``cursor`` (lines shown): a backend call of its own where the platform has
        no batched log read, else only the hook's thread hop where its real hook makes one (Brev, local)."""
        if self.log_ms:
            if self.semaphore is None:
                self.semaphore = asyncio.Semaphore(self.slots)
            asked = time.monotonic()
            async with self.semaphore:
                self.queued_seconds += time.monotonic() - asked
                self.log_call_times.append(time.time())
                if self.threaded:
                    await asyncio.to_thread(time.sleep, self.log_ms / 1000)
                else:
                    await asyncio.sleep(self.log_ms / 1000)
        elif self.threaded:
            await asyncio.to_thread(int)
        shown = int(cursor or 0)
        new = min(self.lines(handle.job_id, time.time()), shown + LINES_PER_READ)
        return "".join(f"line {n}\n" for n in range(shown, new)), str(new)


def _blocking_poll(listing: list[float], groups: list[float]) -> None:
    """A sync client's poll in its worker thread: the list's pages, then the group calls side by side (Brev's hook
    runs its execs in a pool of ``PROBE_WORKERS``)."""
    time.sleep(sum(listing))
    if groups:
        with ThreadPoolExecutor(min(PROBE_WORKERS, len(groups))) as pool:
            list(pool.map(time.sleep, groups))


BACKENDS: dict[str, Backend] = {}
MODELS: dict[str, dict[str, Any]] = {
    "sim_slurm": {"base_ms": 45.0, "per_job_ms": 0.02, "slots": 10},
    "sim_docker": {"base_ms": 8.0, "per_job_ms": 0.03, "slots": 16, "threaded": True, "log_ms": 5.0},
    "sim_kubernetes": {"base_ms": 25.0, "per_job_ms": 0.05, "slots": 20, "log_ms": 10.0},
    "sim_local": {"base_ms": 0.0, "per_job_ms": 0.2, "slots": 1_000_000, "threaded": True},
    "sim_lepton": {
        "base_ms": 40.0,
        "per_job_ms": 0.05,
        "slots": 10,
        "threaded": True,
        "page_size": 500,
        "log_ms": 40.0,
    },
    "sim_brev": {"base_ms": 100.0, "per_job_ms": 0.1, "slots": 64, "threaded": True, "group_ms": 150.0},
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shown: dict[str, int] = {}  # job id -> lines its last log read returned up to

    async def aget_job_statuses(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        backend = self._backend()
        statuses = await backend.poll(handles)
        if self.log_reads_batched:  # as the real hook's status call, it sees which logs grew since their last read
            now = time.time()
            self._quiet_logs = frozenset(
                h.job_id for h in handles if self._shown.get(h.job_id, -1) >= backend.lines(h.job_id, now)
            )
        return statuses

    async def aget_job_logs(self, handle: JobHandle, cursor: str = "", tail: int | None = None) -> tuple[str, str]:
        text, new = await self._backend().read_log(handle, cursor)
        self._shown[handle.job_id] = int(new)
        return text, new

    def read_marks(self, handle: JobHandle) -> dict[str, Any]:
        return {}

    def write_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        return None


def _register() -> None:
    for name, model in MODELS.items():
        batched = not model.get("log_ms")  # the real hook reads logs in its status call, or local files
        cls = type(
            f"{name.title().replace('_', '')}Hook",
            (SimHook,),
            {"platform": name, "conn_type": f"tao_{name}", "log_reads_batched": batched},
        )
        globals()[cls.__name__] = cls
        hooks.PLATFORMS[name] = (f"tao_{name}", f"{__name__}.{cls.__name__}")
        os.environ[f"AIRFLOW_CONN_{name.upper()}_CONN"] = json.dumps({"conn_type": f"tao_{name}"})


def _handles(jobs: int, duration: float, instances: int) -> list[JobHandle]:
    """The jobs, spread over the platforms in turn, each ending between 20 % and 100 % of ``duration`` from now; a
    Brev job runs on one of ``instances`` instances (its ``backend_job_id``, by which its hook groups the execs)."""
    rng = random.Random(7)
    now = time.time()
    handles = []
    for index in range(jobs):
        platform = list(MODELS)[index % len(MODELS)]
        ordinal = index // len(MODELS)  # the job's number on its platform
        backend_id = f"box-{ordinal % instances}" if BACKENDS[platform].group_ms else f"{index}"
        handle = JobHandle(platform, f"{platform}_conn", f"{index:012x}", f"job-{index}", backend_id, submitted_at=now)
        backend = BACKENDS[platform]
        backend.ends[handle.job_id] = now + rng.uniform(duration * 0.2, duration)
        backend.starts[handle.job_id] = now
        backend.periods[handle.job_id] = 1.0 if rng.random() < CHATTY_SHARE else 60.0
        handles.append(handle)
    return handles


def _watch_full_collections(longest: list[float]) -> None:
    """Record the longest full garbage collection (CPU seconds of this thread: the machine's load does not enter):
    at 10,000 triggers it is what stalls the loop longest."""
    started = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            started[0] = time.thread_time()
        else:
            longest[0] = max(longest[0], time.thread_time() - started[0])

    gc.callbacks.append(callback)


class _TurnTimedLoop(asyncio.SelectorEventLoop):
    """The event loop, timing each of its turns (the callbacks one ``_run_once`` runs) in CPU time of its thread: the
    stall the triggerer's own work causes, which the machine's load does not lengthen (the 50 ms ticker's wall-clock
    lag counts the time other processes held the two cores too). Waiting in ``select`` costs no CPU."""

    longest_turn = 0.0

    def _run_once(self) -> None:
        started = time.thread_time()
        super()._run_once()  # type: ignore[misc]
        _TurnTimedLoop.longest_turn = max(_TurnTimedLoop.longest_turn, time.thread_time() - started)


async def _lag_monitor(stop: asyncio.Event, worst: list[float]) -> None:
    while not stop.is_set():
        before = time.monotonic()
        await asyncio.sleep(0.05)
        worst[0] = max(worst[0], time.monotonic() - before - 0.05)


async def _provider(handle: JobHandle, interval: float, logs: bool) -> float:
    await first_event(TAOJobTrigger(handle=handle.to_json(), poll_interval=interval, stream_logs=logs))
    return time.time()


async def _naive(handle: JobHandle, interval: float, logs: bool) -> float:
    """One trigger per job, polling its own job (and reading its log) every interval (no shared poller)."""
    hook = hooks.get_platform_hook(handle.platform, handle.conn_id)
    await hook.aload_connection()
    cursor = ""
    while True:
        try:
            status = (await hook.aget_job_statuses([handle]))[handle.job_id]
            if logs:
                _, cursor = await hook.aget_job_logs(handle, cursor)
        except Exception:  # an outage: keep waiting, as a trigger does
            status = JobStatus.unknown("status call failed")
        if status.state.is_terminal:
            return time.time()
        await asyncio.sleep(interval)


#: "unfrozen+logs" is the provider with logs and ``[tao] freeze_triggerer_heap`` off: what freezing the heap buys
SIDES = {"provider": _provider, "provider+logs": _provider, "unfrozen+logs": _provider, "naive+logs": _naive}


async def _run(kind: str, jobs: int, interval: float, duration: float, instances: int) -> dict[str, Any]:
    BACKENDS.clear()
    BACKENDS.update({name: Backend(**model) for name, model in MODELS.items()})
    StatusPoller._instances.clear()
    handles = _handles(jobs, duration, instances)
    created = min(h.submitted_at for h in handles)
    gc.collect()
    await asyncio.sleep(0)  # the collection's turn ends before the loop's turns are timed
    _TurnTimedLoop.longest_turn = 0.0
    rss0, cpu0, start = rss_mib(), cpu(), time.monotonic()
    stop, worst, full_gc = asyncio.Event(), [0.0], [0.0]
    _watch_full_collections(full_gc)
    monitor = asyncio.create_task(_lag_monitor(stop, worst))
    watch, logs = SIDES[kind], kind.endswith("+logs")
    tasks = []
    for handle in handles:  # as the triggerer starts them: one per turn of the loop (TriggerRunner.create_triggers)
        tasks.append(asyncio.create_task(watch(handle, interval, logs)))
        await asyncio.sleep(0)
    await asyncio.sleep(min(interval * 3, duration / 2))
    rss_peak = rss_mib()
    noticed = await asyncio.gather(*tasks)
    elapsed = time.monotonic() - start
    stop.set()
    await monitor
    late = [seen - BACKENDS[h.platform].ends[h.job_id] for h, seen in zip(handles, noticed, strict=True)]
    # Steady state: whole intervals from the first one (the triggers have started) to the first job's end.
    rounds = int((duration * 0.2 - interval) // interval)
    window = (created + interval, created + interval * (1 + rounds))
    calls = sum(len(b.call_times) + len(b.log_call_times) for b in BACKENDS.values())
    polls = sum(b.answered for b in BACKENDS.values())
    return {
        "kind": kind,
        "seconds": elapsed,
        "calls": calls,
        "calls_per_s": calls / elapsed,
        "per_interval": {
            name: sum(window[0] <= t < window[1] for t in b.call_times + b.log_call_times) / max(1, rounds)
            for name, b in BACKENDS.items()
        },
        "logs_per_interval": {
            name: sum(window[0] <= t < window[1] for t in b.log_call_times) / max(1, rounds)
            for name, b in BACKENDS.items()
        },
        "queued_s": sum(b.queued_seconds for b in BACKENDS.values()),
        "cpu_s": cpu() - cpu0,
        "cpu_ms_per_job_poll": 1000 * (cpu() - cpu0) / polls,
        "rss_per_job_kib": (rss_peak - rss0) * 1024 / jobs,
        "loop_lag_ms": worst[0] * 1000,
        "full_gc_ms": full_gc[0] * 1000,
        "longest_turn_ms": _TurnTimedLoop.longest_turn * 1000,
        "late_p50": statistics.median(late),
        "late_p95": statistics.quantiles(late, n=20)[18],
        "late_max": max(late),
    }


def _measure(kind: str, jobs: int, args: argparse.Namespace) -> dict[str, Any]:
    """One side at one job count, in a fresh interpreter (``--side``): its memory starts clean."""
    command = [sys.executable, __file__, "--side", kind, "--jobs", str(jobs)]
    for option in ("interval", "duration", "instances"):
        command += [f"--{option}", str(getattr(args, option))]
    env = dict(os.environ, AIRFLOW__TAO__FREEZE_TRIGGERER_HEAP=str(kind != "unfrozen+logs"))
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def _batched(name: str) -> bool:
    return not MODELS[name].get("log_ms")


def _goals(by_jobs: dict[int, dict[str, dict[str, Any]]], interval: float, budget: int) -> list[str]:
    """One line per goal of the provider with logs (the default) at the largest job count: goal, measured, met."""

    def line(goal: str, measured: str, met: bool | None) -> str:
        verdict = "UNKNOWN" if met is None else "MET    " if met else "NOT MET"
        return f"  {verdict}  {goal:58} measured: {measured}"

    counts = sorted(by_jobs)
    largest = by_jobs[counts[-1]]["provider+logs"]
    per_interval = [by_jobs[n]["provider+logs"]["per_interval"] for n in counts]
    batched = [name for name in MODELS if _batched(name)]
    # Independent of the number of jobs: the same calls at every job count (+-1 for a poll on a window's edge).
    independent = all(abs(p[name] - per_interval[0][name]) <= 1 for p in per_interval for name in batched)
    log_reads = max(by_jobs[n]["provider+logs"]["logs_per_interval"][name] for n in counts for name in MODELS)
    return [
        line(
            f"RSS per watched job <= {KIB_PER_JOB_GOAL:g} KiB",
            f"{largest['rss_per_job_kib']:.1f} KiB",
            largest["rss_per_job_kib"] <= KIB_PER_JOB_GOAL,
        ),
        line(
            f"CPU per job per poll <= {CPU_MS_PER_JOB_POLL_GOAL:g} ms",
            f"{largest['cpu_ms_per_job_poll']:.3f} ms",
            largest["cpu_ms_per_job_poll"] <= CPU_MS_PER_JOB_POLL_GOAL,
        ),
        line(
            f"worst event-loop lag <= {LOOP_LAG_MS_GOAL:g} ms (the loop's longest turn)",
            f"{largest['longest_turn_ms']:.0f} ms of CPU (wall, on this machine: {largest['loop_lag_ms']:.0f} ms)",
            largest["longest_turn_ms"] <= LOOP_LAG_MS_GOAL,
        ),
        line(
            "calls per interval independent of the jobs (" + ", ".join(n.removeprefix("sim_") for n in batched) + ")",
            " vs ".join(
                f"{sum(p[n] for n in batched):.1f} ({c} jobs)" for c, p in zip(counts, per_interval, strict=True)
            ),
            independent if len(counts) > 1 else None,  # one job count proves nothing about independence
        ),
        line(
            f"log reads per interval per connection <= the budget ({budget})",
            f"at most {log_reads:.1f}",
            log_reads <= budget,
        ),
        line(
            f"p95 detection <= one interval + {DETECTION_SLACK_S:g} s = {interval + DETECTION_SLACK_S:g} s",
            f"{largest['late_p95']:.2f} s",
            largest["late_p95"] <= interval + DETECTION_SLACK_S,
        ),
    ]


def _print_columns(rows: list[tuple[str, str, str]], sides: dict[str, dict[str, Any]]) -> None:
    """A table of ``(label, key, format)`` rows, one column per side, then each other side's ratio to the provider
    with logs (the default): per-job polling's, and the unfrozen heap's."""
    others = [kind for kind in ("naive+logs", "unfrozen+logs") if kind in sides]
    print(
        f"{'':34}"
        + "".join(f"{name:>15}" for name in sides)
        + "".join(f"{kind.split('+')[0] + '/':>10}" for kind in others)
    )
    for label, key, fmt in rows:
        values = [side[key] for side in sides.values()]
        base = sides["provider+logs"][key]
        ratios = [sides[kind][key] / base if base else float("nan") for kind in others]
        print(f"{label:34}" + "".join(f"{fmt.format(v):>15}" for v in values) + "".join(f"{r:>10.1f}" for r in ratios))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 10000], help="job counts (the last is the main)")
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--instances", type=int, default=10, help="Brev instances the Brev jobs share")
    parser.add_argument("--naive-up-to", type=int, default=1000, help="largest job count the per-job side runs at")
    parser.add_argument("--side", choices=tuple(SIDES), help=argparse.SUPPRESS)  # one measurement
    args = parser.parse_args()
    if args.duration * 0.2 < 2 * args.interval:
        parser.error("--duration must be at least 10 intervals (the steady state is its first 20 %)")
    if args.side:
        # 1,000 triggers' "Watching job ..." lines (and their jobs' log lines) are not the point here
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
        _register()
        with asyncio.Runner(loop_factory=_TurnTimedLoop) as runner:
            result = runner.run(_run(args.side, args.jobs[-1], args.interval, args.duration, args.instances))
        print(json.dumps(result))
        return
    from airflow_provider_tao.settings import log_reads_per_interval

    budget = log_reads_per_interval()
    by_jobs = {
        n: {kind: _measure(kind, n, args) for kind in SIDES if kind != "naive+logs" or n <= args.naive_up_to}
        for n in args.jobs
    }
    rows = [
        ("backend calls", "calls", "{:.0f}"),
        ("backend calls / s", "calls_per_s", "{:.1f}"),
        ("s waited for a backend slot", "queued_s", "{:.1f}"),
        ("CPU s (this process)", "cpu_s", "{:.2f}"),
        ("CPU ms per job per poll", "cpu_ms_per_job_poll", "{:.3f}"),
        ("RSS per watched job, KiB", "rss_per_job_kib", "{:.1f}"),
        ("worst event-loop lag, ms", "loop_lag_ms", "{:.0f}"),
        ("longest turn of the loop, CPU ms", "longest_turn_ms", "{:.0f}"),
        ("longest full GC, CPU ms", "full_gc_ms", "{:.0f}"),
        ("end noticed late, p50 s", "late_p50", "{:.2f}"),
        ("end noticed late, p95 s", "late_p95", "{:.2f}"),
        ("end noticed late, max s", "late_max", "{:.2f}"),
        ("run, s", "seconds", "{:.1f}"),
    ]
    for jobs, sides in by_jobs.items():
        print(f"\n== {jobs} jobs ({len(MODELS)} platforms, one connection each; Brev jobs on {args.instances} "
              f"instances; {CHATTY_SHARE:.0%} print every second, the others every minute), poll interval "
              f"{args.interval:g} s, jobs end within {args.duration:g} s")  # fmt: skip
        _print_columns(rows, sides)
    print(f"\n== backend calls per interval per connection while every job runs (of them log reads; the log budget "
          f"[tao] log_reads_per_interval = {budget} applies to docker, kubernetes and lepton)")  # fmt: skip
    print(f"  {'':12}" + "".join(f"{f'{kind} {n}':>22}" for n, sides in by_jobs.items() for kind in sides))
    for name in MODELS:
        cells = [
            f"{side['per_interval'][name]:.1f} ({side['logs_per_interval'][name]:.1f})"
            for sides in by_jobs.values()
            for side in sides.values()
        ]
        print(f"  {name.removeprefix('sim_'):12}" + "".join(f"{cell:>22}" for cell in cells))
    print("\n== goals (the provider with logs, the default, at the largest job count)")
    print("\n".join(_goals(by_jobs, args.interval, budget)))


if __name__ == "__main__":
    main()
