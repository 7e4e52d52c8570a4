"""Watching many Kubernetes Jobs at once: the provider's batched triggers vs a naive per-Job watcher, same run,
same API server (``tests/kubefake``, its kubelet simulating the pods: what is measured is the watching).
Not a test: it prints the measured numbers side by side.

Phases:

1. setup: ``--jobs`` Jobs submitted through ``TAOKubernetesHook.create_job`` (their pods "run" for an hour);
2. provider: as many ``TAOJobTrigger`` instances in one event loop (one triggerer), status only and then with log
   streaming; measured over ``--rounds`` poll intervals of steady state, after the triggers have started (their
   start -- connection, hook, first log read -- is reported apart);
3. naive: the same Jobs watched the way the TAO SDK and ``KubernetesJobOperator``'s trigger do -- for each Job
   every interval, ``read_namespaced_job_status`` and ``list_namespaced_pod(label_selector=job-name=...)`` on the
   async client, deserialised into models, all Jobs concurrently -- for the same number of rounds.

Counted: API requests as the server counts them, this process's CPU seconds per watched job per poll, RSS growth
per watched job, and the API server's own CPU per interval (the load the watcher puts on the cluster).

    python benchmarks/k8s_polling.py --jobs 300
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from measure import cpu, first_event, print_watch_table, process_cpu, rss_mib

from airflow_provider_tao.hooks.kubernetes import TAOKubernetesHook
from airflow_provider_tao.jobs import JobHandle, JobSpec
from airflow_provider_tao.triggers.job import TAOJobTrigger
from airflow_provider_tao.triggers.poller import StatusPoller

REPO = Path(__file__).resolve().parents[1]
CONN_ID = "tao_k8s_bench"
#: Intervals the triggers run before measuring (their start is reported apart from the steady state).
WARMUP_ROUNDS = 2
NAMESPACE = "default"


class Server:
    """The fake API server in its own process (so its CPU is not ours), pods simulated."""

    def __init__(self, workdir: Path) -> None:
        ready = workdir / "ready"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.kubefake",
                "--ready-file",
                str(ready),
                "--runtime",
                "sim",
                "--sim-seconds",
                "3600",
                "--tick",
                "1.0",
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        while not ready.exists():
            assert self.proc.poll() is None, "kubefake did not start"
            time.sleep(0.1)
        self.url = f"http://127.0.0.1:{json.loads(ready.read_text())['port']}"
        self.kubeconfig = workdir / "kubeconfig"
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "fake",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u", "namespace": NAMESPACE}}],
                    "users": [{"name": "u", "user": {"token": "bench"}}],
                }
            )
        )

    def stats(self, reset: bool = False) -> dict[str, int]:
        request = urllib.request.Request(f"{self.url}/fake/stats", data=b"{}" if reset else None)
        with urllib.request.urlopen(request, timeout=60) as response:
            return dict(json.loads(response.read())["by"])

    def cpu(self) -> float:
        return process_cpu(self.proc.pid)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def _parallel(func: Callable[[Any], Any], items: list[Any], workers: int = 8) -> list[Any]:
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(func, items))


def spec() -> JobSpec:
    job_id = uuid.uuid4().hex[:12]
    return JobSpec(name=f"bench-{job_id}", job_id=job_id, command="sleep 3600", image="local/busybox:ci", gpu_count=0)


async def provider_phase(server: Server, handles: list[JobHandle], interval: float, rounds: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for stream_logs in (False, True):
        StatusPoller._instances.clear()
        rss0, cpu0 = rss_mib(), cpu()
        triggers = [TAOJobTrigger(handle=h.to_json(), poll_interval=interval, stream_logs=stream_logs) for h in handles]
        tasks = [asyncio.create_task(first_event(t)) for t in triggers]
        # Steady state only: the triggers' start (connection, hook, first log read) is measured on its own.
        await asyncio.sleep(interval * WARMUP_ROUNDS)
        poller = next(iter(StatusPoller._instances.values()))
        startup_cpu = cpu() - cpu0
        server.stats(reset=True)
        polls0, cpu1, server0 = poller.calls, cpu(), server.cpu()
        await asyncio.sleep(interval * rounds)
        polls, watching_cpu, rss = poller.calls - polls0, cpu() - cpu1, rss_mib() - rss0
        requests = server.stats()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        result["logs" if stream_logs else "status"] = {
            "polls": polls,
            "requests_per_interval": sum(requests.values()) / max(1, polls),
            "requests_by_kind": requests,
            "cpu_ms_per_job_per_poll": 1000 * watching_cpu / max(1, polls * len(handles)),
            "rss_kib_per_job": 1024 * rss / len(handles),
            "server_cpu_s_per_interval": (server.cpu() - server0) / rounds,
            "startup_cpu_ms_per_trigger": 1000 * startup_cpu / len(handles),
        }
    return result


async def naive_phase(server: Server, handles: list[JobHandle], interval: float, rounds: int) -> dict[str, Any]:
    from kubernetes_asyncio import client, config

    api_client = await config.new_client_from_config(str(server.kubeconfig))
    batch, core = client.BatchV1Api(api_client), client.CoreV1Api(api_client)

    async def status(handle: JobHandle) -> Any:
        job = await batch.read_namespaced_job_status(handle.name, NAMESPACE)
        pods = await core.list_namespaced_pod(NAMESPACE, label_selector=f"job-name={handle.name}")
        return job.status.active, [p.status.phase for p in pods.items]

    server.stats(reset=True)
    rss0, cpu0, server0 = rss_mib(), cpu(), server.cpu()
    walls = []
    for _ in range(rounds):
        began = time.monotonic()
        await asyncio.gather(*(status(h) for h in handles))
        walls.append(time.monotonic() - began)
        await asyncio.sleep(max(0.0, interval - walls[-1]))
    watching_cpu, rss, requests = cpu() - cpu0, rss_mib() - rss0, server.stats()
    await api_client.close()
    return {
        "requests_per_interval": sum(requests.values()) / rounds,
        "requests_by_kind": requests,
        "round_wall_s": max(walls),
        "cpu_ms_per_job_per_poll": 1000 * watching_cpu / (rounds * len(handles)),
        "rss_kib_per_job": 1024 * rss / len(handles),
        "server_cpu_s_per_interval": (server.cpu() - server0) / rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--interval", type=float, default=2.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp))
        os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = json.dumps(
            {
                "conn_type": "tao_kubernetes",
                "extra": {"kube_config_path": str(server.kubeconfig), "namespace": NAMESPACE},
            }
        )
        try:
            print(f"submitting {args.jobs} Jobs (setup) ...", flush=True)
            hook = TAOKubernetesHook(CONN_ID)
            started = time.monotonic()
            handles = _parallel(hook.create_job, [spec() for _ in range(args.jobs)])
            print(f"  {args.jobs} submissions in {time.monotonic() - started:.1f} s; waiting for the pods ...")
            time.sleep(5)
            print("provider triggers ...", flush=True)
            provider = asyncio.run(provider_phase(server, handles, args.interval, args.rounds))
            print("naive watcher ...", flush=True)
            naive = asyncio.run(naive_phase(server, handles, args.interval, args.rounds))
        finally:
            server.stop()

    status, logs = provider["status"], provider["logs"]
    title = f"{args.jobs} running Jobs, one namespace, {args.rounds} poll intervals of {args.interval:g} s"
    print_watch_table(title, status, logs, naive, "naive (SDK/KJO)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
