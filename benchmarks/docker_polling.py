"""Watching many containers at once: the provider's batched triggers vs a naive per-container watcher, same run,
same real Docker engine (``scripts/docker-up.sh``). Not a test: it prints the measured numbers side by side.

Phases:

1. submission: ``--submissions`` submissions the way the operator makes them (``TAODockerHook.create_job``: image
   and network check, create, copy the job's files in, start), each by a fresh hook as each task is a fresh worker
   process, against ``docker run -d`` of the same container from the CLI; wall time and Docker API requests;
2. provider: ``--jobs`` containers (``sleep``) watched by as many ``TAOJobTrigger`` instances in one event loop
   (one triggerer) for ``--rounds`` poll intervals, status only and then with log streaming; then every container
   is killed at once and the time until every trigger has its event is measured;
3. naive: the same containers, restarted, watched the TAO SDK's way -- for each container every interval
   ``GET /info``, ``containers.get`` and ``reload`` (3 requests) -- for the same number of rounds, then the same kill.

Counted: Docker API requests (every request the docker client sends), process CPU seconds per watched job per
poll, RSS growth per watched job, time from the kill to every terminal state.

    python benchmarks/docker_polling.py --jobs 300
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker
from docker.api.client import APIClient
from measure import cpu, first_event, rss_mib

from airflow_provider_tao.hooks.docker import TAODockerHook
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.jobs import JobHandle, JobSpec
from airflow_provider_tao.triggers.job import TAOJobTrigger
from airflow_provider_tao.triggers.poller import StatusPoller

ROOT = Path(os.environ.get("DOCKER_CI_ROOT", "/var/tmp/docker-ci"))
CONN_ID = "tao_docker_bench"
IMAGE = "local/busybox:ci"


def _engine() -> str:
    subprocess.run(["bash", str(Path(__file__).resolve().parents[1] / "scripts" / "docker-up.sh")], check=True,
                   capture_output=True)  # fmt: skip
    env = dict(line.split("=", 1) for line in (ROOT / "env.sh").read_text().splitlines() if "=" in line)
    return env["DOCKER_CI_HOST"]


HOST = _engine()
os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = json.dumps(
    {"conn_type": "tao_docker", "host": HOST, "extra": {"network": "none", "cancel_grace_seconds": 1}}
)


class Requests:
    """Counts every HTTP request any docker client of this process sends, by method and path."""

    def __init__(self) -> None:
        self.records: list[tuple[float, str]] = []
        original = APIClient.send

        def send(client: Any, request: Any, **kwargs: Any) -> Any:
            path = request.path_url.split("?")[0]
            kind = "list" if path.endswith("/containers/json") else path.rsplit("/", 1)[-1]
            self.records.append((time.monotonic(), f"{request.method} {kind}"))
            return original(client, request, **kwargs)

        APIClient.send = send  # type: ignore[method-assign]

    def since(self, start: float, end: float | None = None) -> list[str]:
        return [k for t, k in self.records if t >= start and (end is None or t < end)]


def spec(command: str = "sleep 3600") -> JobSpec:
    job_id = uuid.uuid4().hex[:12]
    return JobSpec(name=f"bench-{job_id}", job_id=job_id, command=command, image=IMAGE, gpu_count=0)


def _parallel(func: Callable[[Any], Any], items: list[Any], workers: int = 8) -> list[Any]:
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(func, items))


def kill_all(client: Any, handles: list[JobHandle]) -> None:
    _parallel(lambda h: client.kill(f"tao-job-{h.job_id}"), handles, workers=16)


# ----------------------------------------------------------------------------- phases


def submit_phase(count: int, log: Requests) -> dict[str, Any]:
    ours, theirs, same_work, requests = [], [], [], []
    for _ in range(count):
        started = time.monotonic()
        hook = TAODockerHook(CONN_ID)  # a fresh hook: every task is a fresh worker process
        job = spec("true")
        hook.validate_spec(job)
        hook.create_job(job)
        ours.append(time.monotonic() - started)
        requests.append(len(log.since(started)))
        hook.client.close()
        name = f"bench-cli-{uuid.uuid4().hex[:12]}"
        started = time.monotonic()
        subprocess.run(
            ["docker", "-H", HOST, "run", "-d", "--name", name, "--network", "none", "--init", "--label",
             f"{ct.LABEL_MANAGED}=true", "--shm-size", "16g", IMAGE, "/bin/sh", "-c", "true"],
            check=True, capture_output=True,
        )  # fmt: skip
        theirs.append(time.monotonic() - started)
        # the same work from the CLI: create, copy the job's files in, start
        name = f"bench-cli-{uuid.uuid4().hex[:12]}"
        archive = ct.job_archive({"runner.json": b"{}"}, {"TOKEN": "x"}, {"owner_try": 1}, (0, 0))
        started = time.monotonic()
        cli = ["docker", "-H", HOST]
        create = [*cli, "create", "--name", name, "--network", "none", "--init", "--label", f"{ct.LABEL_MANAGED}=true"]
        subprocess.run([*create, IMAGE, "/bin/sh", "-c", "true"], check=True, capture_output=True)
        subprocess.run([*cli, "cp", "-", f"{name}:/"], input=archive, check=True, capture_output=True)
        subprocess.run([*cli, "start", name], check=True, capture_output=True)
        same_work.append(time.monotonic() - started)
    return {
        "provider_s": (min(ours), statistics.median(ours), max(ours)),
        "cli_run_s": (min(theirs), statistics.median(theirs), max(theirs)),
        "cli_create_cp_start_s": (min(same_work), statistics.median(same_work), max(same_work)),
        "provider_requests": statistics.median(requests),
        "ratio_to_docker_run": statistics.median(ours) / statistics.median(theirs),
        "ratio_to_create_cp_start": statistics.median(ours) / statistics.median(same_work),
    }


async def provider_phase(
    handles: list[JobHandle], interval: float, rounds: int, log: Requests, client: Any
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for stream_logs in (False, True):
        StatusPoller._instances.clear()
        rss0, cpu0, start = rss_mib(), cpu(), time.monotonic()
        triggers = [TAOJobTrigger(handle=h.to_json(), poll_interval=interval, stream_logs=stream_logs) for h in handles]
        tasks = [asyncio.create_task(first_event(t)) for t in triggers]
        await asyncio.sleep(interval * rounds)
        poller = next(iter(StatusPoller._instances.values()))
        polls, watching_cpu, rss = poller.calls, cpu() - cpu0, rss_mib() - rss0
        requests = log.since(start)
        key = "logs" if stream_logs else "status"
        result[key] = {
            "polls": polls,
            "requests_per_interval": len(requests) / max(1, polls),
            "requests_by_kind": dict(Counter(requests)),
            "cpu_s": watching_cpu,
            "cpu_ms_per_job_per_poll": 1000 * watching_cpu / max(1, polls * len(handles)),
            "rss_kib_per_job": 1024 * rss / len(handles),
        }
        if not stream_logs:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            continue
        killed_at = time.monotonic()
        await asyncio.to_thread(kill_all, client, handles)
        last_exit = time.monotonic()
        ends = await asyncio.gather(*tasks)
        ended = log.since(last_exit)
        result["after_kill"] = {
            "kill_s": last_exit - killed_at,
            "all_events_after_last_exit_s": max(ends) - last_exit,
            "requests_after_last_exit": dict(Counter(ended)),
        }
    return result


def naive_phase(handles: list[JobHandle], interval: float, rounds: int, log: Requests) -> dict[str, Any]:
    sdk = docker.DockerClient(base_url=HOST, version="auto")

    def status(handle: JobHandle) -> str:
        sdk.info()  # the SDK's backend identity check, every call
        container = sdk.containers.get(f"tao-job-{handle.job_id}")
        container.reload()
        return str(container.status)

    rss0, cpu0, start = rss_mib(), cpu(), time.monotonic()
    walls = []
    for _ in range(rounds):
        began = time.monotonic()
        for handle in handles:
            status(handle)
        walls.append(time.monotonic() - began)
        time.sleep(max(0.0, interval - walls[-1]))
    watching_cpu, rss, requests = cpu() - cpu0, rss_mib() - rss0, log.since(start)
    kill_all(sdk.api, handles)
    last_exit = time.monotonic()
    pending = list(handles)
    while pending:
        pending = [h for h in pending if status(h) != "exited"]
        if pending:
            time.sleep(interval)
    return {
        "rounds": rounds,
        "requests_per_interval": len(requests) / rounds,
        "requests_by_kind": dict(Counter(requests)),
        "round_wall_s": (min(walls), statistics.median(walls), max(walls)),
        "cpu_s": watching_cpu,
        "cpu_ms_per_job_per_poll": 1000 * watching_cpu / (rounds * len(handles)),
        "rss_kib_per_job": 1024 * rss / len(handles),
        "all_seen_after_last_exit_s": time.monotonic() - last_exit,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--submissions", type=int, default=10)
    args = parser.parse_args()
    log = Requests()
    client = docker.APIClient(base_url=HOST, version="auto")
    try:
        print(f"submission x{args.submissions}: create_job (fresh hook) vs docker run -d ...", flush=True)
        submission = submit_phase(args.submissions, log)
        print(f"starting {args.jobs} containers (setup) ...", flush=True)
        hook = TAODockerHook(CONN_ID)
        handles = _parallel(hook.create_job, [spec() for _ in range(args.jobs)])
        print("provider triggers ...", flush=True)
        provider = asyncio.run(provider_phase(handles, args.interval, args.rounds, log, client))
        print("restarting the containers for the naive watcher (setup) ...", flush=True)
        _parallel(lambda h: client.start(f"tao-job-{h.job_id}"), handles)
        print("naive watcher ...", flush=True)
        naive = naive_phase(handles, args.interval, args.rounds, log)
    finally:
        for container in client.containers(all=True, filters={"label": f"{ct.LABEL_MANAGED}=true"}):
            client.remove_container(container["Id"], force=True)

    print(f"\n== one submission, median of {args.submissions} (TAO SDK: 237-277 ms, 7 requests)")
    for key, value in submission.items():
        print(f"  {key:28} {value}")
    status, logs, naive_row = provider["status"], provider["logs"], naive
    print(f"\n== {args.jobs} running containers, {args.rounds} poll intervals of {args.interval:g} s")
    print(f"  {'':34} {'provider':>14} {'provider+logs':>14} {'naive (SDK)':>14}")
    rows = [
        ("API requests per interval", *(f"{r['requests_per_interval']:.1f}" for r in (status, logs, naive_row))),
        ("CPU ms per job per poll", *(f"{r['cpu_ms_per_job_per_poll']:.3f}" for r in (status, logs, naive_row))),
        ("RSS KiB per watched job", *(f"{r['rss_kib_per_job']:.1f}" for r in (status, logs, naive_row))),
    ]
    for name, *values in rows:
        print(f"  {name:34} {values[0]:>14} {values[1]:>14} {values[2]:>14}")
    print(f"  provider requests (status only): {status['requests_by_kind']}")
    print(f"  provider requests (with logs):   {logs['requests_by_kind']}")
    print(f"  naive requests: {naive['requests_by_kind']}; one round of {args.jobs} took {naive['round_wall_s']} s")
    after = provider["after_kill"]
    print(
        "  after the last container exited: every trigger had its event in "
        f"{after['all_events_after_last_exit_s']:.2f} s ({after['requests_after_last_exit']}); "
        f"the naive watcher saw all in {naive['all_seen_after_last_exit_s']:.2f} s"
    )
    print(
        "  ratios naive / provider (status only): requests "
        f"{naive['requests_per_interval'] / max(1e-9, status['requests_per_interval']):.0f}x, CPU "
        f"{naive['cpu_ms_per_job_per_poll'] / max(1e-9, status['cpu_ms_per_job_per_poll']):.1f}x; with logs: requests "
        f"{naive['requests_per_interval'] / max(1e-9, logs['requests_per_interval']):.1f}x, CPU "
        f"{naive['cpu_ms_per_job_per_poll'] / max(1e-9, logs['cpu_ms_per_job_per_poll']):.1f}x"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
