"""What every benchmark here measures the same way: this process's CPU time and RSS, another process's CPU time, a
trigger's first event, and the side-by-side table of the polling benchmarks of API platforms."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, cast


def rss_mib() -> float:
    """Resident memory of this process, MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu() -> float:
    """CPU seconds (user + system) this process used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def first_event(trigger: Any) -> float:
    """Run a trigger until its first event; the monotonic time it arrived."""
    events = cast("AsyncGenerator[Any, None]", trigger.run())
    try:
        await events.__anext__()
    finally:
        await events.aclose()
    return time.monotonic()


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) another process (an API server) used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def print_watch_table(
    title: str, status: dict[str, Any], logs: dict[str, Any], naive: dict[str, Any], who: str
) -> None:
    """The provider's triggers (status only, and with log streaming) next to a naive per-job watcher (``who``):
    requests, CPU and RSS per watched job, the API server's CPU; then the ratios naive / provider."""
    print(f"\n== {title}")
    print(f"  {'':34} {'provider':>14} {'provider+logs':>14} {who:>16}")
    rows = [
        ("API requests per interval", "{:.1f}", "requests_per_interval"),
        ("CPU ms per job per poll", "{:.3f}", "cpu_ms_per_job_per_poll"),
        ("RSS KiB per watched job", "{:.1f}", "rss_kib_per_job"),
        ("API server CPU s per interval", "{:.2f}", "server_cpu_s_per_interval"),
    ]
    for name, fmt, key in rows:
        values = [fmt.format(r[key]) for r in (status, logs, naive)]
        print(f"  {name:34} {values[0]:>14} {values[1]:>14} {values[2]:>16}")
    if "startup_cpu_ms_per_trigger" in status:
        print(
            f"  trigger start (outside the steady state): {status['startup_cpu_ms_per_trigger']:.2f} ms CPU per "
            f"trigger (status only), {logs['startup_cpu_ms_per_trigger']:.2f} ms (with logs)"
        )
    print(f"  provider requests (status only): {status['requests_by_kind']}")
    print(f"  provider requests (with logs):   {logs['requests_by_kind']}")
    print(f"  naive requests: {naive['requests_by_kind']}; its slowest round took {naive['round_wall_s']:.2f} s")
    print(
        "  ratios naive / provider (status only): requests "
        f"{naive['requests_per_interval'] / max(1e-9, status['requests_per_interval']):.0f}x, CPU "
        f"{naive['cpu_ms_per_job_per_poll'] / max(1e-9, status['cpu_ms_per_job_per_poll']):.1f}x, API server CPU "
        f"{naive['server_cpu_s_per_interval'] / max(1e-9, status['server_cpu_s_per_interval']):.1f}x"
    )


def print_side_by_side(
    rows: list[tuple[str, str, str]], left: dict[str, Any], right: dict[str, Any], names: tuple[str, str]
) -> None:
    """A table of ``(label, key, format)`` rows: the two measurements and right / left."""
    print(f"{'':34} {names[0]:>12} {names[1]:>12} {'ratio':>8}")
    for label, key, fmt in rows:
        ratio = right[key] / left[key] if left[key] else float("nan")
        print(f"{label:34} {fmt.format(left[key]):>12} {fmt.format(right[key]):>12} {ratio:>8.1f}")
