"""Watching many Lepton jobs at once: the provider's batched triggers vs a naive per-job watcher, same run, same
workspace (``tests/leptonfake --sim``: replicas are simulated, what is measured is the watching). Not a test: it
prints the measured numbers side by side.

Phases:

1. setup: ``--jobs`` jobs submitted through ``LeptonHook.create_job`` (their replicas "run" for an hour);
2. provider: as many ``TAOJobTrigger`` instances in one event loop (one triggerer) for ``--rounds`` poll intervals,
   status only and then with log streaming;
3. naive: the same jobs watched the way the TAO SDK's Lepton handler does -- for each job every interval,
   ``APIClient.job.get`` (sync, in threads, all jobs concurrently) -- for the same number of rounds;
4. import cost: a fresh interpreter importing Airflow's SDK, then also the operator and the Lepton example DAG, then
   instead the ``leptonai`` client: the operator must not pay for ``leptonai`` at DAG parse.

Counted, after one warm-up interval (the watchers' start-up is not watching): API requests as the server counts them,
this process's CPU seconds per watched job per poll, RSS growth per watched job (start-up included), and the API
server's own CPU per interval (the load the watcher puts on the workspace). The triggers' log lines go to a file.

    python benchmarks/lepton_polling.py --jobs 300
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from import_and_parse import _env, _round_robin, _run
from measure import cpu, first_event, print_watch_table, process_cpu, rss_mib

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from airflow_provider_tao.hooks.lepton import LeptonHook  # noqa: E402
from airflow_provider_tao.jobs import JobHandle, JobSpec  # noqa: E402
from airflow_provider_tao.triggers.job import StatusPoller, TAOJobTrigger  # noqa: E402
from tests.leptonfake.control import LeptonFake, start_server, stop_server  # noqa: E402

CONN_ID = "tao_lepton_bench"

IMPORT_PROGRAM = """\
import json, runpy, sys, time
t0 = time.perf_counter()
{statement}
t1 = time.perf_counter()
print(json.dumps({{"in_process_ms": (t1 - t0) * 1000, "leptonai": "leptonai" in sys.modules}}))
"""
IMPORT_VARIANTS = {
    "airflow.sdk": "import airflow.sdk",
    "+ the operator": "import airflow.sdk; import airflow_provider_tao.operators.submit",
    "+ the operator, Lepton DAG parsed": "import airflow.sdk; import airflow_provider_tao.operators.submit; "
    f"runpy.run_path({str(REPO / 'example_dags' / 'tao_lepton_multinode.py')!r})",
    "(+ the leptonai client, avoided)": "import airflow.sdk; from leptonai.api.v2.client import APIClient",
}


@contextlib.contextmanager
def output_to(path: Path) -> Iterator[None]:
    """This process's stdout and stderr (the triggers' log lines: 300 jobs print a lot) go to ``path`` meanwhile."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with path.open("ab") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def spec() -> JobSpec:
    job_id = uuid.uuid4().hex[:12]
    return JobSpec(
        name=f"bench-{job_id[:10]}", job_id=job_id, command="sleep 3600", image="local/busybox:ci", gpu_count=0
    )


async def provider_phase(fake: LeptonFake, pid: int, handles: list[JobHandle], interval: float, rounds: int) -> Any:
    result: dict[str, Any] = {}
    for stream_logs in (False, True):
        StatusPoller._instances.clear()
        rss0 = rss_mib()
        triggers = [TAOJobTrigger(handle=h.to_json(), poll_interval=interval, stream_logs=stream_logs) for h in handles]
        tasks = [asyncio.create_task(first_event(t)) for t in triggers]
        # warm-up, not counted: the triggers start, the first poll answers, the first log reads find the replicas
        while not StatusPoller._instances or next(iter(StatusPoller._instances.values())).calls < 2:
            await asyncio.sleep(0.1)
        await asyncio.sleep(interval)
        poller = next(iter(StatusPoller._instances.values()))
        fake.stats(reset=True)
        polls0, cpu0, server0 = poller.calls, cpu(), process_cpu(pid)
        await asyncio.sleep(interval * rounds)
        polls, watching_cpu, rss = poller.calls - polls0, cpu() - cpu0, rss_mib() - rss0
        requests = fake.stats()["by"]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        result["logs" if stream_logs else "status"] = {
            "polls": polls,
            "requests_per_interval": sum(requests.values()) / rounds,
            "requests_by_kind": requests,
            "cpu_ms_per_job_per_poll": 1000 * watching_cpu / max(1, polls * len(handles)),
            "rss_kib_per_job": 1024 * rss / len(handles),
            "server_cpu_s_per_interval": (process_cpu(pid) - server0) / rounds,
        }
    return result


async def naive_phase(fake: LeptonFake, pid: int, handles: list[JobHandle], interval: float, rounds: int) -> Any:
    from leptonai.api.v2.client import APIClient

    local = threading.local()

    def status(handle: JobHandle) -> Any:
        if not hasattr(local, "client"):
            local.client = APIClient(fake.workspace_id, fake.token, fake.workspace_url)
        job = local.client.job.get(handle.backend_job_id)  # what the TAO SDK's get_job_status does per job
        return job.status.state, job.status.ready

    rss0 = rss_mib()
    await asyncio.gather(*(asyncio.to_thread(status, h) for h in handles))  # warm-up (clients): not counted
    fake.stats(reset=True)
    cpu0, server0 = cpu(), process_cpu(pid)
    walls = []
    for _ in range(rounds):
        began = time.monotonic()
        await asyncio.gather(*(asyncio.to_thread(status, h) for h in handles))
        walls.append(time.monotonic() - began)
        await asyncio.sleep(max(0.0, interval - walls[-1]))
    watching_cpu, rss, requests = cpu() - cpu0, rss_mib() - rss0, fake.stats()["by"]
    return {
        "requests_per_interval": sum(requests.values()) / rounds,
        "requests_by_kind": requests,
        "round_wall_s": max(walls),
        "cpu_ms_per_job_per_poll": 1000 * watching_cpu / (rounds * len(handles)),
        "rss_kib_per_job": 1024 * rss / len(handles),
        "server_cpu_s_per_interval": (process_cpu(pid) - server0) / rounds,
    }


def import_phase(samples: int) -> dict[str, dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        (home / "dags").mkdir(parents=True)
        env = {**_env(home), "PYTHONPATH": str(REPO)}
        results: dict[str, dict[str, Any]] = {name: {"ms": [], "leptonai": set()} for name in IMPORT_VARIANTS}
        programs = {name: IMPORT_PROGRAM.format(statement=stmt) for name, stmt in IMPORT_VARIANTS.items()}
        for name in IMPORT_VARIANTS:  # warm the bytecode caches; not counted
            _run([sys.executable, "-c", programs[name]], env, home)
        for name in _round_robin(list(IMPORT_VARIANTS), samples):
            _, _, out = _run([sys.executable, "-c", programs[name]], env, home)
            results[name]["ms"].append(out["in_process_ms"])
            results[name]["leptonai"].add(out["leptonai"])
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--import-samples", type=int, default=5)
    parser.add_argument("--log", default=str(Path(tempfile.gettempdir()) / "lepton_polling.log"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, fake = start_server(Path(tmp), "--sim", "--config", json.dumps({"settings": {"sim_seconds": 3600}}))
        os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = json.dumps(
            {
                "conn_type": "tao_lepton",
                "password": fake.token,
                "extra": {"workspace_id": fake.workspace_id, "workspace_url": fake.workspace_url},
            }
        )
        try:
            print(f"submitting {args.jobs} jobs (setup) ...", flush=True)
            hook = LeptonHook(CONN_ID)
            started = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                handles = list(pool.map(hook.create_job, [spec() for _ in range(args.jobs)]))
            print(f"  {args.jobs} submissions in {time.monotonic() - started:.1f} s; waiting for the replicas ...")
            time.sleep(5)
            print(f"provider triggers, then the naive watcher (their log lines: {args.log}) ...", flush=True)
            with output_to(Path(args.log)):
                provider = asyncio.run(provider_phase(fake, proc.pid, handles, args.interval, args.rounds))
                naive = asyncio.run(naive_phase(fake, proc.pid, handles, args.interval, args.rounds))
        finally:
            stop_server(proc, fake)
    print("import cost ...", flush=True)
    imports = import_phase(args.import_samples)

    title = f"{args.jobs} running jobs, one workspace, {args.rounds} poll intervals of {args.interval:g} s"
    print_watch_table(title, provider["status"], provider["logs"], naive, "naive (TAO SDK)")
    print(f"\n== import cost in a fresh interpreter, in-process ms (median of {args.import_samples}, loaded machine)")
    for name, found in imports.items():
        print(f"  {name:34} {statistics.median(found['ms']):8.1f} ms   leptonai imported: {sorted(found['leptonai'])}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
