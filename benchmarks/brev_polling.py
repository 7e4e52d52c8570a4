"""Watching many jobs on a few Brev instances: the provider's batched triggers vs a naive per-job watcher, same run,
same fake ``brev`` CLI (``tests/brevfake``: every call is a real process, every instance a real container on the
test Docker engine of ``scripts/docker-up.sh``, every job a real container started on it). Not a test: it prints
the measured numbers side by side.

Phases:

1. setup: ``--instances`` instances made by hand, ``--jobs`` jobs spread over them through
   ``BrevHook.create_job`` with ``instance_id`` (each prints a line a second);
2. provider: as many ``TAOJobTrigger`` instances in one event loop (one triggerer) for ``--rounds`` poll
   intervals, status only and then with log streaming;
3. naive: the same jobs watched the TAO SDK's way -- for each job every interval one ``brev exec <instance>`` that
   probes its container (and, to follow its log, one more that reads it), eight at a time -- for the same number
   of rounds.

Counted: ``brev`` invocations as the fake CLI logs them (every process started), CPU seconds of this process and of
the CLI processes it waited for, per watched job per poll.

    PYTHONPATH=. python benchmarks/brev_polling.py --jobs 50 --instances 5   (from the repository's root)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from measure import first_event

from airflow_provider_tao.hooks.brev import BrevHook
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.jobs import JobHandle, JobSpec
from airflow_provider_tao.triggers.job import TAOJobTrigger
from airflow_provider_tao.triggers.poller import StatusPoller
from tests.brevfake.control import BrevWorld

REPO = Path(__file__).resolve().parents[1]
CONN_ID = "tao_brev_bench"
ROOT = Path(os.environ.get("DOCKER_CI_ROOT", "/var/tmp/docker-ci"))
JOB = "i=0; while true; do i=$((i+1)); echo tick $i; sleep 1; done"


def _engine() -> dict[str, str]:
    subprocess.run(["bash", str(REPO / "scripts" / "docker-up.sh")], check=True, capture_output=True)
    return dict(line.split("=", 1) for line in (ROOT / "env.sh").read_text().splitlines() if "=" in line)


def cpu_with_children() -> float:
    """CPU seconds of this process and of every child process it waited for (the CLI calls)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def calls_between(world: BrevWorld, start: float, end: float) -> list[str]:
    """``<subcommand>`` of every CLI invocation that started in the window."""
    return [str(c.get("command") or c["argv"][1]) for c in world.calls() if start <= c["start"] < end]


def setup(world: BrevWorld, image: str, instances: int, jobs: int) -> list[JobHandle]:
    boxes = [f"bench-box-{i}" for i in range(instances)]
    with ThreadPoolExecutor(instances) as pool:
        list(pool.map(world.create_instance, boxes))
    hook = BrevHook(CONN_ID)

    def submit(index: int) -> JobHandle:
        job_id = uuid.uuid4().hex[:12]
        spec = JobSpec(
            name=f"bench-{job_id}",
            job_id=job_id,
            command=JOB,
            image=image,
            gpu_count=0,
            backend_details={"instance_id": boxes[index % instances]},
        )
        return hook.create_job(spec)

    with ThreadPoolExecutor(instances) as pool:
        return list(pool.map(submit, range(jobs)))


async def provider_phase(world: BrevWorld, handles: list[JobHandle], interval: float, rounds: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for stream_logs in (False, True):
        StatusPoller._instances.clear()
        triggers = [TAOJobTrigger(handle=h.to_json(), poll_interval=interval, stream_logs=stream_logs) for h in handles]
        tasks = [asyncio.create_task(first_event(t)) for t in triggers]
        while not StatusPoller._instances or next(iter(StatusPoller._instances.values())).calls < 3:
            await asyncio.sleep(0.1)  # every job polled, every log cursor registered: the steady state follows
        poller = next(iter(StatusPoller._instances.values()))
        # The window opens as a poll begins and closes as the poll `rounds` later begins: whole polls only.
        await _next_poll(poller)
        polls0, cpu0, start = poller.calls - 1, cpu_with_children(), time.time()
        while poller.calls - 1 < polls0 + rounds:
            await _next_poll(poller)
        polls, used, end = poller.calls - 1 - polls0, cpu_with_children() - cpu0, time.time()
        calls = calls_between(world, start, end)
        result["logs" if stream_logs else "status"] = {
            "polls": polls,
            "calls_per_interval": len(calls) / max(1, polls),
            "calls_by_kind": dict(Counter(calls)),
            "cpu_ms_per_job_per_poll": 1000 * used / max(1, polls * len(handles)),
        }
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return result


async def _next_poll(poller: StatusPoller) -> None:
    seen = poller.calls
    while poller.calls == seen:
        await asyncio.sleep(0.005)


def naive_phase(world: BrevWorld, handles: list[JobHandle], interval: float, rounds: int) -> dict[str, Any]:
    """The TAO SDK's handler: one exec per job per poll for its status (and one per job to follow its log)."""
    session = BrevHook(CONN_ID).session
    cursors = {h.job_id: "" for h in handles}

    def watch(handle: JobHandle, follow_logs: bool) -> None:
        name = ct.container_name(handle.job_id)
        probe = f"docker inspect -f '{{{{.State.Status}}}} {{{{.State.ExitCode}}}}' {name}"
        session.exec(handle.backend_job_id, probe, 30)
        if follow_logs:
            since = f"--since {shlex.quote(cursors[handle.job_id])} " if cursors[handle.job_id] else ""
            session.exec(handle.backend_job_id, f"docker logs --timestamps {since}{name}", 30)
            cursors[handle.job_id] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    result: dict[str, Any] = {}
    for follow_logs in (False, True):
        cpu0, start, walls = cpu_with_children(), time.time(), []
        with ThreadPoolExecutor(8) as pool:
            for _ in range(rounds):
                began = time.monotonic()
                list(pool.map(watch, handles, [follow_logs] * len(handles)))
                walls.append(time.monotonic() - began)
                time.sleep(max(0.0, interval - walls[-1]))
        used, calls = cpu_with_children() - cpu0, calls_between(world, start, time.time())
        result["logs" if follow_logs else "status"] = {
            "polls": rounds,
            "calls_per_interval": len(calls) / rounds,
            "calls_by_kind": dict(Counter(calls)),
            "cpu_ms_per_job_per_poll": 1000 * used / (rounds * len(handles)),
            "round_wall_s": max(walls),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--instances", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--interval", type=float, default=3.0)
    args = parser.parse_args()
    env = _engine()
    world = BrevWorld.create(Path(tempfile.mkdtemp(prefix="brev-bench-")), env["DOCKER_CI_HOST"])
    conn = {"conn_type": "tao_brev", "password": world.token, "extra": {"brev_path": world.brev}}
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = json.dumps(conn)
    try:
        print(f"setup: {args.instances} instances, {args.jobs} jobs ...", flush=True)
        started = time.monotonic()
        handles = setup(world, env["DOCKER_CI_BUSYBOX"], args.instances, args.jobs)
        submit_s = (time.monotonic() - started) / args.jobs
        print("provider triggers ...", flush=True)
        provider = asyncio.run(provider_phase(world, handles, args.interval, args.rounds))
        print("naive watcher ...", flush=True)
        naive = naive_phase(world, handles, args.interval, args.rounds)
    finally:
        world.teardown()

    goal = 1 + args.instances
    setting = (
        f"{args.jobs} running jobs on {args.instances} instances, {args.rounds} poll intervals of {args.interval:g} s"
    )
    print(f"\n== {setting}")
    print(f"   (submission: {submit_s:.2f} s per job through create_job, 5 at a time: one copy + one exec each)")
    print(f"  {'':30} {'provider':>10} {'provider+logs':>14} {'naive':>10} {'naive+logs':>11}")
    columns = (provider["status"], provider["logs"], naive["status"], naive["logs"])
    calls = [f"{c['calls_per_interval']:.1f}" for c in columns]
    cpu = [f"{c['cpu_ms_per_job_per_poll']:.2f}" for c in columns]
    print(f"  {'brev calls per interval':30} {calls[0]:>10} {calls[1]:>14} {calls[2]:>10} {calls[3]:>11}")
    print(f"  {'CPU ms per job per poll':30} {cpu[0]:>10} {cpu[1]:>14} {cpu[2]:>10} {cpu[3]:>11}")
    print(f"  goal: 1 + instances with watched jobs = {goal} calls per interval")
    for label, column in zip(("provider", "provider+logs", "naive", "naive+logs"), columns, strict=True):
        print(f"  {label:14} calls by kind: {column['calls_by_kind']} over {column['polls']} polls")
    print(f"  naive: one round took up to {naive['status']['round_wall_s']:.1f} s (status), "
          f"{naive['logs']['round_wall_s']:.1f} s (status + logs)")  # fmt: skip
    print(
        "  ratios naive / provider: calls "
        f"{naive['status']['calls_per_interval'] / provider['status']['calls_per_interval']:.1f}x (status), "
        f"{naive['logs']['calls_per_interval'] / provider['logs']['calls_per_interval']:.1f}x (with logs); CPU "
        f"{naive['status']['cpu_ms_per_job_per_poll'] / provider['status']['cpu_ms_per_job_per_poll']:.1f}x, "
        f"{naive['logs']['cpu_ms_per_job_per_poll'] / provider['logs']['cpu_ms_per_job_per_poll']:.1f}x"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
