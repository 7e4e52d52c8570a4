"""The crash-point explorer, in process: every step boundary of a clean run of the task x every interruption x
every platform's test backend, each run to the task's end as Airflow would, checked on the backend.

The boundaries come from a clean run (:mod:`tests.explorer.recorder` numbers every call the lifecycle makes); the
product is pruned only by equivalence (:func:`tests.explorer.simulate.explored`). A violation prints the command
that reruns exactly its schedule: ``TAO_EXPLORE_BOUNDARY='<boundary>' pytest tests/explorer -k '<platform> and
<interruption>'``.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from typing import Any

import pytest

from tests.explorer.backends import JOBS
from tests.explorer.conftest import PLATFORMS
from tests.explorer.invariants import violations
from tests.explorer.simulate import INTERRUPTIONS, Schedule, TaskSim, explored

PARALLEL = int(os.environ.get("TAO_EXPLORE_PARALLEL", "4"))
DURATIONS: dict[Schedule, float] = {}
_CLEAN: dict[tuple[str, str], list[str]] = {}


def run_schedule(backend: Any, schedule: Schedule) -> list[str]:
    started = time.monotonic()
    sim = TaskSim(backend, schedule)
    outcome = sim.run()
    found = violations(backend, schedule, outcome, sim.store)
    if schedule.boundary is not None and outcome.fired is None:
        found.append(f"the boundary {schedule.boundary} was never reached")
    DURATIONS[schedule] = time.monotonic() - started
    return found


def clean_boundaries(backends: Any, platform: str, job: str) -> list[str]:
    """The boundaries of a clean run of the task on ``platform`` (its invariants hold, or the test fails)."""
    if (platform, job) not in _CLEAN:
        schedule = Schedule(platform, job)
        sim = TaskSim(backends[platform], schedule)
        outcome = sim.run()
        found = violations(backends[platform], schedule, outcome, sim.store)
        assert outcome.state == "success" and not found, (outcome, found)
        _CLEAN[platform, job] = list(dict.fromkeys(outcome.boundaries))
    return _CLEAN[platform, job]


def schedule_boundaries(backends: Any, platform: str, job: str, interruption: str) -> list[str]:
    """The boundaries ``interruption`` is applied at: those of the clean run, but the equivalent ones
    (:func:`tests.explorer.simulate.explored`); for the flaky job only those its retry adds (the first try's equal the ok job's)."""
    boundaries = explored(clean_boundaries(backends, platform, job), interruption)
    if job != "ok":
        seen = set(clean_boundaries(backends, platform, "ok"))
        boundaries = [b for b in boundaries if b not in seen]
    return boundaries


@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize("platform", PLATFORMS)
def test_clean_run_boundaries(backends: Any, platform: str, job: str) -> None:
    """A clean run passes every invariant and shows the boundaries of every phase (validation to resume)."""
    boundaries = clean_boundaries(backends, platform, job)
    phases = {b.split(":", 1)[0] for b in boundaries}
    assert {"execute", "trigger", "resume"} <= phases, boundaries
    assert sum(":create_job#" in b for b in boundaries) == (2 if job == "flaky" else 1), boundaries
    print(f"\n{platform} {job}: {len(boundaries)} boundaries: {boundaries}")


@pytest.mark.parametrize("interruption", INTERRUPTIONS)
@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize("platform", PLATFORMS)
def test_explore(backends: Any, platform: str, job: str, interruption: str) -> None:
    """Every boundary of the clean run interrupted by ``interruption`` on ``platform``: no invariant breaks."""
    only = os.environ.get("TAO_EXPLORE_BOUNDARY")
    chosen = [only] if only else schedule_boundaries(backends, platform, job, interruption)
    assert not only or only in clean_boundaries(backends, platform, job), f"no boundary {only!r}"
    schedules = [Schedule(platform, job, b, interruption) for b in chosen]
    with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(lambda s: (s, run_schedule(backends[platform], s)), schedules))
    slowest = sorted(schedules, key=lambda s: -DURATIONS.get(s, 0))[:3]
    print("slowest:", [(s.boundary, round(DURATIONS.get(s, 0), 1)) for s in slowest])
    failed = [f"{s.reproducer()}\n    " + "\n    ".join(found) for s, found in results if found]
    print(f"\n{platform} x {job} x {interruption}: {len(schedules)} schedules, {len(failed)} with violations")
    assert not failed, "\n".join(failed)
