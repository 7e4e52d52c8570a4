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
import threading
import time
import zlib
from typing import Any

import pytest

from tests.explorer.backends import JOBS
from tests.explorer.conftest import COMMIT, PART, PARTS, PLATFORMS, SLICE, SLICED, SLICES, in_part
from tests.explorer.invariants import violations
from tests.explorer.pairs import FirstLevel, first_level
from tests.explorer.recorder import read_only
from tests.explorer.simulate import INTERRUPTIONS, Schedule, TaskSim, explored

#: Schedules run side by side, all platforms' at once: they mostly wait on their jobs (sleeps, polls, the fakes'
#: and the daemons' answers), so many fit two cores. A platform may cap its own share (``Backend.parallel``: the
#: cluster's job slots). ``TAO_EXPLORE_REPORT=<file>``: every schedule's result appended there (``python -m
#: tests.explorer.table <file>``). 8 wide: local + Docker took 3 min 36 s with 0 violations, 24 wide 3 min 22 s with
#: 3 schedules whose 1.5 s jobs ended inside a cancel's window under the load (fixed since, see docs/reliability.md).
PARALLEL = int(os.environ.get("TAO_EXPLORE_PARALLEL", "8"))
DURATIONS: dict[Schedule, float] = {}
_CLEAN: dict[tuple[str, str], list[str]] = {}
_REPORT_LOCK = threading.Lock()
#: Each single schedule's first level for the pair explorer (tests/explorer/test_pairs.py): its boundaries, where
#: its interruption fired, its decisions and their facts.
LEVELS: dict[Schedule, FirstLevel] = {}
#: The key of a platform's slice in :func:`explored_runs` (in place of a job and an interruption).
SLICE_JOB = "slice"


def run_schedule(backend: Any, schedule: Schedule) -> list[str]:
    started = time.monotonic()
    sim = TaskSim(backend, schedule)
    try:
        outcome = sim.run()
        LEVELS[schedule] = first_level(outcome, sim.rec.decisions)
        found = violations(backend, schedule, outcome, sim.store)
        # a poll's n-th repetition depends on timing (a loaded machine's job ends in fewer polls): a repeated read
        # not reached is a clean run, still checked; any other boundary must be reached
        repeated_read = read_only(str(schedule.boundary)) and not str(schedule.boundary).endswith("#1")
        if schedule.boundary is not None and outcome.fired is None and not repeated_read:
            found.append(f"the boundary {schedule.boundary} was never reached")
    except Exception as exc:  # one schedule's own failure is its result, not every other schedule's in the pool
        found = [f"the schedule raised {type(exc).__name__}: {exc}"[:500]]
    forget(backend, sim)
    DURATIONS[schedule] = time.monotonic() - started
    if report := os.environ.get("TAO_EXPLORE_REPORT"):  # one JSON line per schedule as it ends, for the docs' table
        with _REPORT_LOCK, open(report, "a") as out:
            out.write(json.dumps([schedule.platform, schedule.job, schedule.boundary, schedule.interruption, found]))
            out.write("\n")
    return found


def forget(backend: Any, sim: Any) -> None:
    """What the judged run's jobs left on the platform goes (:meth:`~tests.explorer.backends.Backend.forget`)."""
    if sim.outcome.job_name:
        try:
            backend.forget(sim.outcome.job_name)
        except Exception as exc:  # the next schedules' lists are slower, nothing is judged wrong
            print(f"forgetting {sim.outcome.job_name} failed: {exc!r}")


def clean_boundaries(backends: Any, platform: str, job: str) -> list[str]:
    """The boundaries of a clean run of the task on ``platform`` (its invariants hold, or the test fails)."""
    if (platform, job) not in _CLEAN:
        schedule = Schedule(platform, job)
        sim = TaskSim(backends[platform], schedule)
        outcome = sim.run()
        found = violations(backends[platform], schedule, outcome, sim.store)
        assert outcome.state == "success" and not found, (outcome, found)
        assert outcome.logs and outcome.trigger_kwargs, "I7 reads the schedule's log lines and trigger kwargs"
        assert backends[platform].records(outcome.job_name), "I7 reads the backend's records of the job"
        forget(backends[platform], sim)
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
        last = boundaries.index("execute:defer#2") + 1 if "execute:defer#2" in boundaries else len(boundaries)
        boundaries = boundaries[first:last]
    return explored(boundaries, interruption)


def _selected(session: pytest.Session) -> list[tuple[str, str, str]]:
    """(platform, job, interruption) of every ``test_explore`` this run selected (``-k`` included), and every
    (platform, job, interruption) of a selected ``test_explore_slice``'s or ``test_explore_part``'s platform (key
    ``(platform, SLICE_JOB, SLICE_JOB)``)."""
    selected = []
    for item in session.items:
        name, params = getattr(item, "originalname", ""), getattr(getattr(item, "callspec", None), "params", {})
        if name == "test_explore":
            selected.append((params["platform"], params["job"], params["interruption"]))
        elif name in ("test_explore_slice", "test_explore_part"):
            selected.extend((params["platform"], job, i) for job in JOBS for i in INTERRUPTIONS)
    return selected


def in_slice(schedule: Schedule) -> bool:
    """Whether ``schedule`` is in this run's slice of its platform's product (:data:`SLICE` of :data:`SLICES`)."""
    return zlib.crc32(f"{schedule.job}|{schedule.boundary}|{schedule.interruption}".encode()) % SLICES == SLICE


def _interleaved(groups: list[list[Schedule]]) -> list[Schedule]:
    """One of each group in turn: the platforms share the pool from its start."""
    out: list[Schedule] = []
    for i in range(max((len(g) for g in groups), default=0)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


@pytest.fixture(scope="package")
def explored_runs(request: pytest.FixtureRequest, backends: Any) -> dict[tuple[str, str, str], list[Any]]:
    """Every selected schedule, run at once in one pool (the clean runs first, also at once): (platform, job,
    interruption) -> [(schedule, violations)]."""
    selected = _selected(request.session)
    for platform in dict.fromkeys(p for p, _, _ in selected):
        backends[platform]  # set up here, in pytest's thread
    caps = {p: threading.Semaphore(backends[p].parallel or PARALLEL) for p in backends}

    def capped(fn: Any, platform: str, *args: Any) -> Any:
        with caps[platform]:
            return fn(*args)

    only = os.environ.get("TAO_EXPLORE_BOUNDARY")
    with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        pairs = list(dict.fromkeys((p, j) for p, j, _ in selected))
        pairs += [(p, "ok") for p, j in pairs if j != "ok" and (p, "ok") not in pairs]
        list(pool.map(lambda pj: capped(clean_boundaries, pj[0], backends, *pj), pairs))
        by_key: dict[tuple[str, str, str], list[Schedule]] = {}
        for platform, job, interruption in selected:
            assert not only or only in _CLEAN[platform, job], f"no boundary {only!r}"
            chosen = [only] if only else schedule_boundaries(backends, platform, job, interruption)
            schedules = [Schedule(platform, job, b, interruption) for b in chosen]
            if platform in SLICED:
                by_key.setdefault((platform, SLICE_JOB, SLICE_JOB), []).extend(filter(in_slice, schedules))
            elif PARTS > 1:
                parted = [s for s in schedules if in_part(s.job, s.boundary, s.interruption)]
                by_key.setdefault((platform, SLICE_JOB, SLICE_JOB), []).extend(parted)
            else:
                by_key[platform, job, interruption] = schedules
        per_platform: dict[str, list[Schedule]] = {}
        for key, schedules in by_key.items():
            per_platform.setdefault(key[0], []).extend(schedules)
        order = _interleaved(list(per_platform.values()))
        futures = {s: pool.submit(capped, run_schedule, s.platform, backends[s.platform], s) for s in order}
        return {key: [(s, futures[s].result()) for s in schedules] for key, schedules in by_key.items()}


@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize("platform", PLATFORMS)
def test_clean_run_boundaries(backends: Any, platform: str, job: str) -> None:
    """A clean run passes every invariant and shows the boundaries of every phase (validation to resume)."""
    boundaries = clean_boundaries(backends, platform, job)
    phases = {b.split(":", 1)[0] for b in boundaries}
    assert {"execute", "trigger", "resume"} <= phases, boundaries
    # the flaky job's retry is a second job, or (Slurm requeues a node fault itself) the same job run again
    creates = 1 if job == "ok" or backends[platform].requeues else 2
    assert sum(":create_job#" in b for b in boundaries) == creates, boundaries
    print(f"\n{platform} {job}: {len(boundaries)} boundaries: {boundaries}")


if PARTS == 1:  # the platforms' whole products (an empty parametrization would be a skip)

    @pytest.mark.parametrize("interruption", INTERRUPTIONS)
    @pytest.mark.parametrize("job", JOBS)
    @pytest.mark.parametrize("platform", PLATFORMS)
    def test_explore(explored_runs: Any, platform: str, job: str, interruption: str) -> None:
        """Every boundary of the clean run interrupted by ``interruption`` on ``platform``: no invariant breaks."""
        _check(explored_runs[platform, job, interruption], f"{platform} x {job} x {interruption}")

else:

    @pytest.mark.parametrize("platform", PLATFORMS)
    def test_explore_part(explored_runs: Any, platform: str) -> None:
        """This run's part of ``platform``'s whole product (every job x boundary x interruption): no invariant breaks
        (:data:`~tests.explorer.conftest.PARTS`)."""
        results = explored_runs.get((platform, SLICE_JOB, SLICE_JOB), [])
        print(f"\n{platform}: part {PART} of {PARTS} (commit {COMMIT}; rerun: TAO_EXPLORE_PART={PART})")
        assert results, f"part {PART} of {PARTS} holds none of {platform}'s schedules"
        _check(results, f"{platform} part {PART}")


if SLICED:  # defined only when there are platforms to slice (an empty parametrization would be a skip)

    @pytest.mark.parametrize("platform", SLICED)
    def test_explore_slice(explored_runs: Any, platform: str) -> None:
        """This run's slice of the whole product (every job x boundary x interruption) on ``platform``: no invariant
        breaks (:data:`~tests.explorer.conftest.SLICED`)."""
        results = explored_runs.get((platform, SLICE_JOB, SLICE_JOB), [])
        rerun = f"TAO_EXPLORE_SLICED={platform} TAO_EXPLORE_SLICE={SLICE}"
        print(f"\n{platform}: slice {SLICE} of {SLICES} (commit {COMMIT}; rerun: {rerun})")
        assert results, f"slice {SLICE} of {SLICES} holds none of {platform}'s schedules: fewer slices"
        _check(results, f"{platform} slice {SLICE}")


def _check(results: list[Any], what: str) -> None:
    schedules = [s for s, _ in results]
    slowest = sorted(schedules, key=lambda s: -DURATIONS.get(s, 0))[:3]
    print("slowest:", [(s.boundary, round(DURATIONS.get(s, 0), 1)) for s in slowest])
    failed = [f"{s.reproducer()}\n    " + "\n    ".join(found) for s, found in results if found]
    print(f"\n{what}: {len(schedules)} schedules, {len(failed)} with violations")
    assert not failed, "\n".join(failed)
