"""Watching many SLURM jobs at once: the provider's batched triggers vs a naive per-job watcher, same run, same
real cluster (``scripts/slurm-up.sh``). Not a test: it prints the measured numbers.

Phases (jobs are held in the DOWN ``held`` partition, so they stay PENDING until this script cancels them):

1. submission: ``--submissions`` submissions the way the operator makes them (preflight, find-by-name, stage +
   sbatch), each by a fresh hook as each task is a fresh worker process: SSH connections (counted by the real
   sshd) and wall time;
2. provider: ``--jobs`` ``TAOJobTrigger`` instances in one event loop (as in one triggerer) watch the jobs for
   ``--rounds`` poll intervals; then one ``scancel`` for all and the time until every trigger has its event;
3. naive: the same number of other jobs, watched one SSH connection per job per poll (``squeue -j <id>``, then
   ``sacct`` once it left the queue: what the TAO SDK does, in-process with asyncssh) for the same number of
   rounds, then the same cancel;
4. running jobs: ``--running`` short jobs that print lines, watched by triggers with log streaming: the commands
   of every poll interval (status + logs + accounting).

Counted: SSH connections (sshd's "Accepted publickey" lines and the client's own connect counter), backend
commands per poll interval, wall time to see every terminal state, process CPU seconds, and RSS growth per
watched job.

    source /var/tmp/slurm-ci/env.sh && python benchmarks/slurm_polling.py --jobs 300
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ENV_FILE = Path(os.environ.get("SLURM_CI_ROOT", "/var/tmp/slurm-ci")) / "env.sh"


def _load_env() -> None:
    if "AIRFLOW_CONN_TAO_SLURM_CI" in os.environ:
        return
    out = subprocess.run(["bash", "-c", f". {ENV_FILE} && env -0"], capture_output=True, check=True).stdout
    for item in out.split(b"\0"):
        key, _, value = item.decode().partition("=")
        if key.startswith(("SLURM_CI_", "AIRFLOW_CONN_")):
            os.environ[key] = value


_load_env()

from measure import cpu, first_event, rss_mib  # noqa: E402

from airflow_provider_tao.hooks.slurm import SlurmHook  # noqa: E402
from airflow_provider_tao.hooks.slurm import ssh as slurm_ssh  # noqa: E402
from airflow_provider_tao.jobs import JobHandle, JobSpec  # noqa: E402
from airflow_provider_tao.triggers.job import StatusPoller, TAOJobTrigger  # noqa: E402

CONN_ID = "tao_slurm_ci"
SSHD_LOG = Path(os.environ.get("SLURM_CI_SSHD_LOG", "/var/log/slurm-ci/sshd.log"))
USER = os.environ.get("SLURM_CI_USER", "slurmci")
BUNDLE = os.environ.get("SLURM_CI_OCI_BUNDLE_PY", "/var/tmp/slurm-ci/oci/python")


def logins() -> int:
    try:
        return SSHD_LOG.read_text(errors="replace").count(f"Accepted publickey for {USER} ")
    except OSError:
        return -1


def spec(tag: str, partition: str = "held", command: str = "true") -> JobSpec:
    job_id = uuid.uuid4().hex[:12]
    return JobSpec(
        name=f"bench-{tag}-{job_id}",
        job_id=job_id,
        command=command,
        image=BUNDLE,
        gpu_count=0,
        backend_details={"partition": partition},
    )


# ----------------------------------------------------------------------------- command accounting


class CommandLog:
    """Wraps the cached connection's ``run`` to record every backend command with its poll interval."""

    def __init__(self) -> None:
        self.records: list[tuple[float, str]] = []
        self._original = slurm_ssh._Entry.run

        async def run(entry: Any, command: str, stdin: bytes | None = None, timeout: float = 60.0) -> Any:
            program = command.removeprefix("SLURM_TIME_FORMAT=%s ")  # past the status command's environment
            kind = (
                "squeue+logs" if program.startswith("squeue") and "@@F" in program
                else "squeue" if program.startswith("squeue")
                else "sacct" if program.startswith("sacct -X")
                else "logs" if "@@F" in program
                else program.split(maxsplit=1)[0]
            )  # fmt: skip
            self.records.append((time.monotonic(), kind))
            return await self._original(entry, command, stdin, timeout)

        slurm_ssh._Entry.run = run  # type: ignore[method-assign,assignment]

    def since(self, start: float) -> list[tuple[float, str]]:
        return [r for r in self.records if r[0] >= start]


def per_poll(records: list[tuple[float, str]]) -> list[int]:
    """Backend commands of each poll cycle: a status poll (it starts with squeue) and everything until the next."""
    cycles: list[int] = []
    for _, kind in records:
        if kind.startswith("squeue") or not cycles:
            cycles.append(0)
        cycles[-1] += 1
    return cycles


# ----------------------------------------------------------------------------- phases


def submit_phase(count: int) -> tuple[list[JobHandle], dict[str, Any]]:
    walls, conns = [], []
    handles = []
    for _ in range(count):
        before = logins()
        started = time.monotonic()
        hook = SlurmHook(conn_id=CONN_ID)  # a fresh hook: every task is a fresh worker process
        job = spec("submit")
        hook.validate_spec(job)
        hook.find_job(job.name)
        handles.append(hook.create_job(job))
        walls.append(time.monotonic() - started)
        hook.close()
        time.sleep(0.2)  # let sshd write its log line
        conns.append(logins() - before)
    return handles, {
        "wall_s": (min(walls), statistics.median(walls), max(walls)),
        "connections": (min(conns), statistics.median(conns), max(conns)),
        "commands_per_submission": 3,
    }


def bulk_submit(count: int, tag: str, **kwargs: Any) -> list[JobHandle]:
    hook = SlurmHook(conn_id=CONN_ID)  # one connection for the whole bulk (setup, not measured)
    handles = [hook.create_job(spec(tag, **kwargs)) for _ in range(count)]
    hook.close()
    return handles


def scancel(handles: list[JobHandle]) -> None:
    hook = SlurmHook(conn_id=CONN_ID)
    ids = [h.backend_job_id for h in handles]
    for i in range(0, len(ids), 500):
        hook.run("scancel " + " ".join(ids[i : i + 500]), timeout=120)
    hook.close()


async def provider_phase(handles: list[JobHandle], interval: float, rounds: int, log: CommandLog) -> dict[str, Any]:
    rss0, cpu0, logins0 = rss_mib(), cpu(), logins()
    connects0 = slurm_ssh.STATS["async_connects"]
    start = time.monotonic()
    triggers = [TAOJobTrigger(handle=h.to_json(), poll_interval=interval) for h in handles]
    tasks = [asyncio.create_task(first_event(t)) for t in triggers]
    await asyncio.sleep(interval * rounds)
    poller = next(iter(StatusPoller._instances.values()))
    polls = poller.calls
    steady_cpu, steady_rss = cpu() - cpu0, rss_mib() - rss0
    watch_records = log.since(start)
    cancel_at = time.monotonic()
    await asyncio.to_thread(scancel, handles)
    ends = await asyncio.gather(*tasks)
    total_cpu = cpu() - cpu0
    await asyncio.sleep(0.3)
    records = log.since(start)
    cycles = per_poll(records)
    return {
        "watched": len(handles),
        "poll_interval_s": interval,
        "polls": polls,
        "ssh_connections_client": slurm_ssh.STATS["async_connects"] - connects0,
        "ssh_connections_sshd": logins() - logins0 - 1,  # minus the scancel connection
        "commands_while_pending": len(watch_records),
        "commands_by_kind": dict(Counter(kind for _, kind in records)),
        "max_commands_in_one_interval": max(cycles),
        "cpu_s_watching": steady_cpu,
        "cpu_s_total": total_cpu,
        "cpu_ms_per_job_per_poll": 1000 * steady_cpu / max(1, polls * len(handles)),
        "rss_mib_growth": steady_rss,
        "rss_kib_per_job": 1024 * steady_rss / len(handles),
        "all_terminal_after_cancel_s": max(ends) - cancel_at,
    }


async def naive_phase(handles: list[JobHandle], interval: float, rounds: int, parallel: int) -> dict[str, Any]:
    import asyncssh

    settings = SlurmHook(conn_id=CONN_ID).ssh_settings()
    known: Any = ([asyncssh.import_public_key(settings.host_key)], [], []) if settings.host_key else None
    connects = commands = 0
    gate = asyncio.Semaphore(parallel)

    async def status(handle: JobHandle) -> str:
        nonlocal connects, commands
        async with gate:
            connects += 1
            async with asyncssh.connect(
                settings.hosts[0], port=settings.port, username=settings.username,
                client_keys=[settings.key_file], known_hosts=known,
            ) as conn:  # fmt: skip
                commands += 1
                out = str((await conn.run(f"squeue -h -j {handle.backend_job_id} -o %T", check=False)).stdout or "")
                if out.strip():
                    return out.strip()
                commands += 1
                acct = f"sacct -X -n -P -j {handle.backend_job_id} -o State"
                return str((await conn.run(acct, check=False)).stdout or "").strip() or "UNKNOWN"

    rss0, cpu0, logins0 = rss_mib(), cpu(), logins()
    round_walls = []
    for _ in range(rounds):
        started = time.monotonic()
        await asyncio.gather(*(status(h) for h in handles))
        round_walls.append(time.monotonic() - started)
        await asyncio.sleep(max(0.0, interval - round_walls[-1]))
    steady_cpu, steady_rss, steady_connects = cpu() - cpu0, rss_mib() - rss0, connects
    cancel_at = time.monotonic()
    await asyncio.to_thread(scancel, handles)
    pending = list(handles)
    while pending:
        states = await asyncio.gather(*(status(h) for h in pending))
        pending = [h for h, s in zip(pending, states, strict=True) if not s.startswith(("CANCELLED", "COMPLETED"))]
        if pending:
            await asyncio.sleep(interval)
    done = time.monotonic() - cancel_at
    await asyncio.sleep(0.3)
    return {
        "watched": len(handles),
        "rounds": rounds,
        "ssh_connections_client": connects,
        "ssh_connections_sshd": logins() - logins0 - 1,
        "connections_while_pending": steady_connects,
        "commands_total": commands,
        "round_wall_s": (min(round_walls), statistics.median(round_walls), max(round_walls)),
        "cpu_s_watching": steady_cpu,
        "cpu_ms_per_job_per_poll": 1000 * steady_cpu / (rounds * len(handles)),
        "rss_mib_growth": steady_rss,
        "all_terminal_after_cancel_s": done,
    }


async def running_phase(count: int, interval: float, log: CommandLog) -> dict[str, Any]:
    command = "for i in 1 2 3 4 5; do echo step $i; sleep 1; done"
    handles = await asyncio.to_thread(bulk_submit, count, "run", partition="debug", command=command)
    start = time.monotonic()
    triggers = [TAOJobTrigger(handle=h.to_json(), poll_interval=interval) for h in handles]
    await asyncio.gather(*(first_event(t) for t in triggers))
    wall = time.monotonic() - start
    records = log.since(start)
    cycles = per_poll(records)
    return {
        "jobs": count,
        "wall_s": wall,
        "polls": len(cycles),
        "commands_by_kind": dict(Counter(kind for _, kind in records)),
        "polls_by_command_count": dict(sorted(Counter(cycles).items())),
        "max_commands_in_one_interval": max(cycles),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--submissions", type=int, default=10)
    parser.add_argument("--running", type=int, default=12)
    parser.add_argument("--naive-parallel", type=int, default=16)
    args = parser.parse_args()
    log = CommandLog()

    print(f"submission x{args.submissions} (validate + find_job + create_job, fresh hook each) ...", flush=True)
    submitted, submission = submit_phase(args.submissions)
    scancel(submitted)
    print(f"submitting 2 x {args.jobs} held jobs (setup) ...", flush=True)
    ours, theirs = bulk_submit(args.jobs, "prov"), bulk_submit(args.jobs, "naive")

    async def run_all() -> tuple[dict[str, Any], ...]:
        print("provider triggers ...", flush=True)
        provider = await provider_phase(ours, args.interval, args.rounds, log)
        print("naive watcher ...", flush=True)
        naive = await naive_phase(theirs, args.interval, args.rounds, args.naive_parallel)
        print("running jobs with log streaming ...", flush=True)
        running = await running_phase(args.running, args.interval, log)
        slurm_ssh.AsyncPool.clear()
        return provider, naive, running

    provider, naive, running = asyncio.run(run_all())
    print("\n== one submission (old SDK: 13 connections, 2.9 s)")
    for key, value in submission.items():
        print(f"  {key:28} {value}")
    print(f"\n== {args.jobs} held jobs, {args.rounds} poll intervals of {args.interval:g} s, then one scancel")
    print(f"  {'':34} {'provider':>18} {'naive':>18}")
    rows = [
        ("SSH connections (sshd)", provider["ssh_connections_sshd"], naive["ssh_connections_sshd"]),
        ("SSH connections (client)", provider["ssh_connections_client"], naive["ssh_connections_client"]),
        ("CPU s while watching", f"{provider['cpu_s_watching']:.2f}", f"{naive['cpu_s_watching']:.2f}"),
        ("CPU ms per job per poll", f"{provider['cpu_ms_per_job_per_poll']:.3f}",
         f"{naive['cpu_ms_per_job_per_poll']:.3f}"),
        ("RSS growth MiB", f"{provider['rss_mib_growth']:.1f}", f"{naive['rss_mib_growth']:.1f}"),
        ("all terminal after cancel, s", f"{provider['all_terminal_after_cancel_s']:.2f}",
         f"{naive['all_terminal_after_cancel_s']:.2f}"),
    ]  # fmt: skip
    for name, ours_value, naive_value in rows:
        print(f"  {name:34} {ours_value!s:>18} {naive_value!s:>18}")
    print(
        f"  provider: {provider['polls']} polls, commands {provider['commands_by_kind']}, "
        f"max {provider['max_commands_in_one_interval']} command(s) in one interval, "
        f"{provider['rss_kib_per_job']:.1f} KiB RSS per watched job"
    )
    print(f"  naive: {naive['commands_total']} commands, one round of {args.jobs} jobs took {naive['round_wall_s']} s")
    conn_ratio = naive["ssh_connections_sshd"] / max(1, provider["ssh_connections_sshd"])
    cpu_ratio = naive["cpu_s_watching"] / max(1e-9, provider["cpu_s_watching"])
    print(f"  ratios (naive / provider): connections {conn_ratio:.0f}x, CPU while watching {cpu_ratio:.1f}x")
    print(f"\n== {running['jobs']} running jobs printing lines, log streaming on, {args.interval:g} s interval")
    for key, value in running.items():
        print(f"  {key:28} {value}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
