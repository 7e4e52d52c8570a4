"""What every benchmark here measures the same way: this process's CPU time and RSS, and a trigger's first event."""

from __future__ import annotations

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


def print_side_by_side(
    rows: list[tuple[str, str, str]], left: dict[str, Any], right: dict[str, Any], names: tuple[str, str]
) -> None:
    """A table of ``(label, key, format)`` rows: the two measurements and right / left."""
    print(f"{'':34} {names[0]:>12} {names[1]:>12} {'ratio':>8}")
    for label, key, fmt in rows:
        ratio = right[key] / left[key] if left[key] else float("nan")
        print(f"{label:34} {fmt.format(left[key]):>12} {fmt.format(right[key]):>12} {ratio:>8.1f}")
