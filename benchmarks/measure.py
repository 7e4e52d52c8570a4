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
