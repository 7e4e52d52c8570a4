"""The crash-point explorer, in process: every step boundary of a clean run of the task x every interruption x
every platform's test backend, each run to the task's end as Airflow would, checked on the backend.

The boundaries come from a clean run (:mod:`tests.explorer.recorder` numbers every call the lifecycle makes); the
product is pruned only by equivalence (:func:`tests.explorer.simulate.explored`). A violation prints the command
that reruns exactly its schedule: ``TAO_EXPLORE_BOUNDARY='<boundary>' pytest tests/explorer -k '<platform> and
<interruption>'``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import time
from typing import Any

import pytest

from tests.explorer.backends import JOBS
from tests.explorer.conftest import PLATFORMS
from tests.explorer.invariants import violations
from tests.explorer.simulate import INTERRUPTIONS, Schedule, TaskSim, explored

#: Schedules run side by side: they mostly wait on their jobs (sleeps and polls), so 8 fit two cores.
#: ``TAO_EXPLORE_REPORT=<file>``: every schedule's result appended there (``python -m tests.explorer.table <file>``).
PARALLEL = int(os.environ.get("TAO_EXPLORE_PARALLEL", "8"))
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
    (:func:`tests.explorer.simulate.explored`). The flaky job's run equals the ok job's up to its first step the ok
    job does not make (the failed job seen), and again after its retry deferred (the failed job is then only a line
    of the record's history, which no later step reads): only the steps in between are its own."""
    boundaries = clean_boundaries(backends, platform, job)
    if job != "ok":
        ok = set(clean_boundaries(backends, platform, "ok"))
        first = next(i for i, b in enumerate(boundaries) if b not in ok)
        boundaries = boundaries[first : boundaries.index("execute:defer#2") + 1]
    return explored(boundaries, interruption)


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
    if report := os.environ.get("TAO_EXPLORE_REPORT"):  # one JSON line per schedule, for docs/reliability.md
        with open(report, "a") as out:
            for s, found in results:
                out.write(json.dumps([s.platform, s.job, s.boundary, s.interruption, found]) + "\n")
    failed = [f"{s.reproducer()}\n    " + "\n    ".join(found) for s, found in results if found]
    print(f"\n{platform} x {job} x {interruption}: {len(schedules)} schedules, {len(failed)} with violations")
    assert not failed, "\n".join(failed)
