"""The pair explorer (:mod:`tests.explorer.pairs`): each single schedule's interruption, then a second fault at each
boundary of the decision that follows it, deduped by the facts that decision got.

Every CI run explores one slice of the pairs that follow its part of the single product of ``local`` and Docker
(:data:`~tests.explorer.conftest.PARTS` parts, :data:`PAIR_SLICES` slices, 3 x 16: the commit's number picks both,
and as 3 and 16 share no factor any 48 commits in a row cover the pair product); the single schedules' runs of
``test_explorer.py`` (the same session, before this module) give the first level for free. The whole product on
all six platforms is one command (docs/reliability.md)::

    TAO_EXPLORE_PAIRS=all TAO_EXPLORE_PLATFORMS=local,docker,kubernetes,slurm,lepton,brev TAO_EXPLORE_SLICED= \\
        python -m pytest -p no:cacheprovider --timeout=0 tests/explorer -k pairs

``TAO_EXPLORE_PAIR='<job>|<boundary>|<interruption>|<second boundary>|<fault>'`` reruns one pair (a violation
prints it). ``TAO_EXPLORE_PAIR_REPORT=<file>``: one JSON line per pair run; with ``TAO_EXPLORE_PAIR_RESUME=1`` the
pairs whose last line there shows no violation are counted and not run again (on two cores the whole product takes
several sittings).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import resource
import subprocess
import threading
import time
from typing import Any

import pytest

from tests.explorer.backends import JOBS
from tests.explorer.conftest import COMMIT, PART, PARTS, PLATFORMS, in_part
from tests.explorer.invariants import violations
from tests.explorer.pair_report import rows
from tests.explorer.pairs import Pair, PairSim, deduped, in_pair_slice, judged_as, pair_key, pairs_of
from tests.explorer.simulate import INTERRUPTIONS, Schedule
from tests.explorer.test_explorer import (
    LEVELS,
    PARALLEL,
    clean_boundaries,
    forget,
    run_schedule,
    schedule_boundaries,
)

MODE = os.environ.get("TAO_EXPLORE_PAIRS", "slice")
PAIR_SLICES = int(os.environ.get("TAO_EXPLORE_PAIR_SLICES") or 48 // PARTS)
PAIR_SLICE = int(os.environ.get("TAO_EXPLORE_PAIR_SLICE") or COMMIT % PAIR_SLICES)
_LOCK = threading.Lock()


def _passed_before() -> set[str]:
    """The keys of the pairs whose last run in the report found no violation (``TAO_EXPLORE_PAIR_RESUME``)."""
    report = os.environ.get("TAO_EXPLORE_PAIR_REPORT")
    if not (report and os.environ.get("TAO_EXPLORE_PAIR_RESUME") and os.path.exists(report)):
        return set()
    last = {row[1]: not row[4] for row in rows(report) if row[0] not in ("sitting", "product", "whole")}
    return {key for key, passed in last.items() if passed}


def run_pair(backend: Any, pair: Pair) -> tuple[list[str], bool]:
    """The pair's violations, and whether its second boundary was reached (a repeated poll may not be, under load:
    then the run is a single schedule's, still checked)."""
    started = time.monotonic()
    sim = PairSim(backend, pair)
    try:
        outcome = sim.run()
        # a second fault not reached leaves the single schedule's run: judged as that schedule
        judged = judged_as(pair) if sim.rec.second_fired is not None else pair.first
        found = violations(backend, judged, outcome, sim.store)
    except Exception as exc:
        found = [f"the pair raised {type(exc).__name__}: {exc}"[:500]]
    forget(backend, sim)
    reached = sim.rec.second_fired is not None
    _report([pair.first.platform, pair.key, pair.reproducer(), reached, found, round(time.monotonic() - started, 1)])
    return found, reached


def _report(row: list[Any]) -> None:
    if report := os.environ.get("TAO_EXPLORE_PAIR_REPORT"):
        with _LOCK, open(report, "a") as out:
            out.write(json.dumps(row) + "\n")


def _code() -> str:
    """The commit explored, ``+changes`` when the work tree differs from it."""
    here = os.path.dirname(os.path.abspath(__file__))
    git = ["git", "-C", here]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True)
    changed = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], check=False, capture_output=True)
    return (commit.stdout.strip() or "unknown") + ("+changes" if changed.stdout.strip() else "")


def _one(spec: str, platform: str) -> list[Pair]:
    job, boundary, interruption, second, fault = spec.split("|")
    return [Pair(Schedule(platform, job, boundary, interruption), second, fault, pair_key(platform, "", "", "", ""))]


def _stream(pool: Any, capped: Any, backends: Any, out: dict[str, Any], pairs: dict[Pair, Any]) -> None:
    """Each single schedule's pairs submitted as soon as its first level is known (the single schedules not run
    yet by ``test_explorer`` run here, in the same pool), one per dedupe key; a platform's product size is known
    once its first level is."""
    clean = [(p, job) for p in PLATFORMS for job in JOBS]  # the clean runs at once (each platform's boundaries)
    list(pool.map(lambda pj: capped(lambda _, *a: clean_boundaries(backends, *a), pj[0], *pj), clean))
    firsts = sorted(
        (
            Schedule(p, job, b, i)
            for p in PLATFORMS
            for job in JOBS
            for i in INTERRUPTIONS
            for b in schedule_boundaries(backends, p, job, i)
            if in_part(job, b, i)
        ),
        key=str,
    )
    waiting = {p: sum(s.platform == p for s in firsts) for p in PLATFORMS}
    keys: set[str] = set()
    passed = _passed_before()

    def known(first: Schedule) -> None:
        for pair in deduped(pairs_of(first, LEVELS[first])):
            if pair.key in keys:
                continue
            keys.add(pair.key)
            out[first.platform]["product"] += 1
            if MODE == "all" or in_pair_slice(pair, PAIR_SLICE, PAIR_SLICES):
                out[first.platform]["explored"] += 1
                if pair.key in passed:
                    out[first.platform]["resumed"] += 1
                else:
                    pairs[pair] = pool.submit(capped, run_pair, first.platform, pair)
        waiting[first.platform] -= 1
        if not waiting[first.platform]:
            _report(["product", first.platform, out[first.platform]["product"], out[first.platform]["explored"]])

    for first in [s for s in firsts if s in LEVELS]:
        known(first)
    # the rest's first levels a few at a time, so that their pairs queue before the later first levels; a platform
    # after the other (PLATFORMS' order): each platform's product is whole as early as it can be
    rest = iter(sorted((s for s in firsts if s not in LEVELS), key=lambda s: PLATFORMS.index(s.platform)))
    running = {pool.submit(capped, run_schedule, s.platform, s): s for s in itertools.islice(rest, PARALLEL)}
    while running:
        done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
        for future in done:
            known(running.pop(future))
            for first in itertools.islice(rest, 1):
                running[pool.submit(capped, run_schedule, first.platform, first)] = first


@pytest.fixture(scope="package")
def pair_runs(backends: Any) -> dict[str, Any]:
    """platform -> {product, explored, results: [(pair, violations, reached)], cpu, seconds}: the first level (single
    schedules not run yet by ``test_explorer``), the product deduped, then this run's pairs, in one pool."""
    cpu = time.process_time() + sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2])
    caps = {p: threading.Semaphore(backends[p].parallel or PARALLEL) for p in PLATFORMS}

    def capped(fn: Any, platform: str, *args: Any) -> Any:
        with caps[platform]:
            return fn(backends[platform], *args)

    out: dict[str, Any] = {p: {"product": 0, "explored": 0, "resumed": 0, "results": []} for p in PLATFORMS}
    started = time.monotonic()  # the pairs' own wall time (the first level is test_explorer's in CI)
    with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        pairs: dict[Pair, concurrent.futures.Future[Any]] = {}
        if spec := os.environ.get("TAO_EXPLORE_PAIR"):
            pairs = {pair: pool.submit(capped, run_pair, p, pair) for p in PLATFORMS for pair in _one(spec, p)}
            for p in PLATFORMS:
                out[p]["product"] = out[p]["explored"] = 1
        else:
            for p in PLATFORMS:  # which code this sitting explored (a product may take sittings over several commits)
                _report(["sitting", p, _code(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())])
            _stream(pool, capped, backends, out, pairs)
        for pair, future in pairs.items():
            out[pair.first.platform]["results"].append((pair, *future.result()))
    if MODE == "all" and not os.environ.get("TAO_EXPLORE_PAIR"):
        for p in PLATFORMS:  # the product explored to its end (tests.explorer.pair_report)
            _report(["whole", p, out[p]["product"], out[p]["explored"], out[p]["resumed"]])
    seconds = time.monotonic() - started
    used = time.process_time() + sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2]) - cpu
    for runs in out.values():
        runs["cpu"], runs["seconds"] = used, seconds
    return out


@pytest.mark.parametrize("platform", PLATFORMS)
def test_pairs(pair_runs: Any, platform: str) -> None:
    """Each pair of this run (the slice, or the whole product with ``TAO_EXPLORE_PAIRS=all``): no invariant
    breaks; the product is finite and its size printed."""
    runs = pair_runs[platform]
    results = runs["results"]
    failed = [f"{pair.reproducer()}\n    " + "\n    ".join(found) for pair, found, _ in results if found]
    unreached = sum(not reached for _, _, reached in results)
    print(
        f"\n{platform} pairs: product {runs['product']} (part {PART} of {PARTS} of the singles, deduped by the "
        f"decision's facts), explored "
        f"{runs['explored']} ({MODE}, slice {PAIR_SLICE} of {PAIR_SLICES}; {runs['resumed']} passed before), "
        f"second fault not reached "
        f"{unreached}, violations {len(failed)}; all platforms: pairs {runs['seconds']:.0f} s, CPU {runs['cpu']:.0f} s"
    )
    assert runs["product"] > 0, "no pair: no decision followed any interruption"
    assert not failed, "\n".join(failed)


def test_a_clear_while_a_persons_cancel_asks_again_is_judged_by_what_the_person_was_told(
    backends: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI's cancel asks the job's state again while the trigger polls on (a loaded machine: the CI's Docker pair
    slice), and the pair's clear lands meanwhile: the CLI then reads the task cleared, keeps the cancel and tells the
    person the task fails ERR_CANCELED when it next runs. It does; that honours the person (I3), it is no I4."""
    from tests.explorer.backends import COMMAND, JOB_SECONDS
    from tests.explorer.simulate import TaskSim

    person_cancel = TaskSim._person_cancel

    def cancel_asked_again(sim: TaskSim) -> None:
        deadline = time.monotonic() + 300  # a safety net: the assertions below tell what did not happen
        while (sim.rec.second_fired is None or sim.ti_state is not None) and time.monotonic() < deadline:
            time.sleep(0.05)  # until the clear has landed
        person_cancel(sim)

    monkeypatch.setattr(TaskSim, "_person_cancel", cancel_asked_again)
    # a job that outlives the trigger's third poll however slow the machine (the cancel stops it)
    monkeypatch.setitem(JOBS, "ok", COMMAND.replace(f"sleep {JOB_SECONDS}", "sleep 300"))
    (pair,) = _one("ok|trigger:aget_job_logs#1|cli_cancel|trigger:aget_job_statuses#3|clear", "local")
    sim = PairSim(backends["local"], pair)
    outcome = sim.run()
    assert sim.rec.second_fired is not None and outcome.person_cancel is not None
    assert "cleared" in str(outcome.person_cancel["told"]), outcome.person_cancel
    assert (outcome.state, "ERR_CANCELED" in outcome.error) == ("failed", True), outcome.error
    assert violations(backends["local"], judged_as(pair), outcome, sim.store) == []
