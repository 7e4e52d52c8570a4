"""The crash-point explorer, in process: every step boundary of a clean run of the task x every interruption x
every platform's test backend, each run to the task's end as Airflow would, checked on the backend.

The boundaries come from a clean run (:mod:`tests.explorer.recorder` numbers every call the lifecycle makes); the
product is pruned only by equivalence (:func:`tests.explorer.simulate.applies`). A violation prints the command
that reruns exactly its schedule: ``TAO_EXPLORE_BOUNDARY='<boundary>' pytest tests/explorer -k '<platform> and
<interruption>'``.
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import Any

import pytest

from tests.explorer.conftest import PLATFORMS
from tests.explorer.invariants import violations
from tests.explorer.simulate import INTERRUPTIONS, Schedule, TaskSim, applies

PARALLEL = int(os.environ.get("TAO_EXPLORE_PARALLEL", "4"))
_CLEAN: dict[str, list[str]] = {}


def run_schedule(backend: Any, schedule: Schedule) -> list[str]:
    sim = TaskSim(backend, schedule)
    outcome = sim.run()
    found = violations(backend, schedule, outcome, sim.store)
    if schedule.boundary is not None and outcome.fired is None:
        found.append(f"the boundary {schedule.boundary} was never reached")
    return found


def clean_boundaries(backends: Any, platform: str) -> list[str]:
    """The boundaries of a clean run of the task on ``platform`` (its invariants hold, or the test fails)."""
    if platform not in _CLEAN:
        sim = TaskSim(backends[platform], Schedule(platform))
        outcome = sim.run()
        found = violations(backends[platform], Schedule(platform), outcome, sim.store)
        assert outcome.state == "success" and not found, (outcome, found)
        _CLEAN[platform] = outcome.boundaries
    return _CLEAN[platform]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_clean_run_boundaries(backends: Any, platform: str) -> None:
    """A clean run passes every invariant and shows the boundaries of every phase (validation to resume)."""
    boundaries = clean_boundaries(backends, platform)
    phases = {b.split(":", 1)[0] for b in boundaries}
    assert {"execute", "trigger", "resume"} <= phases, boundaries
    assert any(":create_job#" in b for b in boundaries), boundaries
    print(f"\n{platform}: {len(boundaries)} boundaries: {boundaries}")


@pytest.mark.parametrize("interruption", INTERRUPTIONS)
@pytest.mark.parametrize("platform", PLATFORMS)
def test_explore(backends: Any, platform: str, interruption: str) -> None:
    """Every boundary of the clean run interrupted by ``interruption`` on ``platform``: no invariant breaks."""
    only = os.environ.get("TAO_EXPLORE_BOUNDARY")
    boundaries = list(dict.fromkeys(clean_boundaries(backends, platform)))
    chosen = [b for b in boundaries if (b == only if only else applies(b, interruption))]
    assert chosen, f"no boundary {only!r} in {boundaries}"
    schedules = [Schedule(platform, b, interruption) for b in chosen]
    with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(lambda s: (s, run_schedule(backends[platform], s)), schedules))
    failed = [f"{s.reproducer()}\n    " + "\n    ".join(found) for s, found in results if found]
    print(f"\n{platform} x {interruption}: {len(schedules)} schedules, {len(failed)} with violations")
    assert not failed, "\n".join(failed)
