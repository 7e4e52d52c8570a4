"""The pair explorer: after each interruption the single explorer applies (:mod:`tests.explorer.simulate`), a
second fault lands at each boundary of the decision that follows it.

A single schedule's run (its *first level*) records every boundary and every call of
``operators.decisions.decide`` with the :class:`~airflow_provider_tao.operators.decisions.Facts` it got
(:meth:`~tests.explorer.recorder.Recorder.decided`). The decision that follows the interruption is the first
``decide`` call after it; its boundaries are those from the interruption to that call (its fact read) and the
``ACTS`` after it (its acts: the cancel, the cleanup, the resubmission, the result's read). At each one a second fault
(:data:`SECOND_FAULTS`) lands:

* ``blip``: the next platform call fails once (a reset connection, a 5xx);
* ``outage``: every platform call fails for ``OUTAGE_POLLS`` poll intervals;
* ``cli_cancel``: a person runs ``airflow tao cancel`` on the recorded job;
* ``clear`` / ``mark_failed``: the task instance is cleared / marked failed there (a worker or a trigger step only:
  during an ``on_kill`` the try is being stopped already);
* ``reap``: ``airflow tao reap`` passes (one real :func:`~airflow_provider_tao.sweeper.sweep_connection` with the
  task's records, the task instance running or deferred).

**Dedupe by the facts.** Two pairs whose decision got the same facts in the same situation, with the second fault
of the same kind at the same place of that decision (its fact read or its acts, the call's name and occurrence),
are one schedule (:func:`pair_key`): the decision function makes them equal from there on. So the pair product is
finite: at most (decisions' distinct facts) x (boundaries of one decision) x 6.
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from dataclasses import dataclass
from typing import Any

from airflow_provider_tao.records import STATE_KEY, JobRecord
from tests.explorer.recorder import muted, read_only
from tests.explorer.simulate import MAX_TRIES, OUTAGE_POLLS, WORKER_PHASES, Outcome, Schedule, TaskSim

SECOND_FAULTS = ("blip", "outage", "cli_cancel", "clear", "mark_failed", "reap")
#: Faults that stop the try: only where a worker or a trigger step runs.
STOPPING = frozenset({"clear", "mark_failed"})
#: Boundaries of a decision's acts explored after its ``decide`` call.
ACTS = 6
#: Interruptions after which the task must still end successfully (a blip and a sweep of a live task are harmless).
#: The phase of ``airflow tao cancel``'s boundaries and decisions (:data:`tests.explorer.recorder.PHASE`).
CLI = "cli:"
HARMLESS = frozenset({"blip", "reap", "outage", "clear", "worker_kill", "triggerer_kill", "execution_timeout"})


@dataclass(frozen=True)
class FirstLevel:
    """What a single schedule's run recorded: its boundaries, where the interruption fired, its decisions."""

    boundaries: tuple[str, ...]
    fired: str | None
    decisions: tuple[tuple[int, str, str], ...]


@dataclass(frozen=True)
class Pair:
    """A single schedule (``first``) with a second fault ``fault`` at its run's boundary ``second``.

    :param key: the dedupe key (:func:`pair_key`).
    """

    first: Schedule
    second: str
    fault: str
    key: str

    def reproducer(self) -> str:
        return (
            f"TAO_EXPLORE_PAIRS=all TAO_EXPLORE_PLATFORMS={self.first.platform} "
            f"TAO_EXPLORE_PAIR='{self.first.job}|{self.first.boundary}|{self.first.interruption}|{self.second}|"
            f"{self.fault}' python -m pytest -p no:cacheprovider tests/explorer -k pairs"
        )


def first_level(outcome: Outcome, decisions: list[tuple[int, str, str]]) -> FirstLevel:
    return FirstLevel(tuple(outcome.boundaries), outcome.fired, tuple(decisions))


def pair_key(platform: str, situation: str, facts: str, place: str, fault: str) -> str:
    return f"{platform}|{situation}|{facts}|{place}|{fault}"


def pairs_of(first: Schedule, level: FirstLevel) -> list[Pair]:
    """Every pair of ``first``: each boundary of the decision following its interruption x each second fault. A
    person's cancel (``cli:`` boundaries, beside the task's) has two: the CLI's own and the task's next."""
    if level.fired is None or level.fired not in level.boundaries:
        return []
    fired = level.boundaries.index(level.fired) + 1
    out = []
    for cli in (True, False):
        following = next(((at, s, f) for at, s, f in level.decisions if at >= fired and s.startswith(CLI) == cli), None)
        if following is not None:
            out += _pairs_at(first, level, fired, following, cli=cli)
    return out


def _pairs_at(
    first: Schedule, level: FirstLevel, fired: int, decision: tuple[int, str, str], *, cli: bool
) -> list[Pair]:
    """The pairs of one decision: its boundaries (the CLI's, or the task's) from the interruption's through its
    fact read to ``ACTS`` of its acts, each with each second fault."""
    at, situation, facts = decision
    # the interruption's own boundary opens the task's window; the CLI's starts at its first call
    window = [(i, b) for i, b in enumerate(level.boundaries[fired - 1 :], fired - 1)
              if b.startswith(CLI) == cli or (i == fired - 1 and not cli)]  # fmt: skip
    acts = [i for i, _ in window if i >= at][ACTS : ACTS + 1]
    window = [(i, b) for i, b in window if not acts or i < acts[0]]
    seen: dict[str, int] = {}
    since_step: set[str] = set()
    out = []
    for i, boundary in window:
        phase, call = boundary.split(":", 1)
        method = f"{phase}:{call.rsplit('#', 1)[0]}"
        seen[method] = seen.get(method, 0) + 1
        if not read_only(boundary):
            since_step.clear()
        elif method in since_step:
            continue  # a read repeated with no step between reads the same state: its first is the one explored
        else:
            since_step.add(method)
        place = f"{'read' if i < at else 'act'}:{method}#{seen[method]}"
        for fault in SECOND_FAULTS:
            if fault in STOPPING and (i == fired - 1 or phase not in (*WORKER_PHASES, "trigger")):
                continue  # a stop lands where a worker or a trigger step runs, not with the interruption's own
            key = pair_key(first.platform, situation, facts, place, fault)
            out.append(Pair(first, boundary, fault, key))
    return out


def deduped(pairs: list[Pair]) -> list[Pair]:
    """One pair per dedupe key (the first in a stable order): the rest reach the same decision with the same
    facts and the same second fault at the same place."""
    chosen: dict[str, Pair] = {}
    for pair in sorted(pairs, key=lambda p: (str(p.first), p.second, p.fault)):
        chosen.setdefault(pair.key, pair)
    return list(chosen.values())


def in_pair_slice(pair: Pair, slice_: int, slices: int) -> bool:
    return zlib.crc32(pair.key.encode()) % slices == slice_


def judged_as(pair: Pair) -> Schedule:
    """The schedule whose expectations (:func:`tests.explorer.invariants.violations`) the pair's outcome meets: a
    mark ends the task; a person's cancel fails it (when it stopped the job); else it ends successfully."""
    kinds = (pair.first.interruption, pair.fault)
    if kinds == ("cli_cancel", "clear"):  # a clear after a person's cancel: run again, or ERR_CANCELED (invariants)
        return dataclasses.replace(pair.first, interruption="clear")
    for final in ("mark_success", "mark_failed", "cli_cancel"):
        if final in kinds:
            return dataclasses.replace(pair.first, interruption=final)
    return dataclasses.replace(pair.first, interruption=None)


class PairSim(TaskSim):
    """A single schedule's run with the pair's second fault at its boundary.

    :param backend: the platform's backend observer.
    :param pair: the pair.
    """

    def __init__(self, backend: Any, pair: Pair) -> None:
        super().__init__(backend, pair.first)
        # a second fault may cost a try of its own (a blip failing a write, a kill's lost submission): one more than
        # a single schedule gets, which its one interruption and the flaky job's failure fill
        self.max_tries = MAX_TRIES + 1
        self.pair = pair
        self.rec.second = pair.second
        self.rec.on_second = self._second

    def _second(self, label: str) -> None:
        fault = self.pair.fault
        if fault == "blip":
            self.rec.blips = 1
        elif fault == "outage":
            self.rec.outage_until = time.time() + OUTAGE_POLLS * self.backend.poll_interval
        elif fault == "cli_cancel":
            self._person_cancel()
        elif fault == "reap":
            self._reap(label.split(":", 1)[0])
        else:  # clear, mark_failed: the single explorer's own, from here on the schedule's interruption
            if fault == "clear" and self.outcome.person_cancel:
                self.outcome.person_cancel["cleared_after"] = True  # a clear after a cancel runs the task again
            self.schedule = dataclasses.replace(self.schedule, interruption=fault)
            self._hit(label)

    def _reap(self, phase: str) -> None:
        """``airflow tao reap``: one pass of the sweeper over the connection, the task instance live."""
        from airflow_provider_tao.hooks import get_platform_hook
        from airflow_provider_tao.jobindex import record_jobs
        from airflow_provider_tao.sweeper import known_jobs, sweep_connection

        with muted():
            record = JobRecord.from_json(self.store.get(STATE_KEY))
            state = "deferred" if phase == "trigger" else "running"
            ti = {"dag_id": "dag", "run_id": self.run_id, "task_id": "train", "map_index": -1}
            jobs = record_jobs(record, ti_state=state, ti_try=None, ti_end=None, **ti) if record else []
            hook = get_platform_hook(self.backend.platform, self.backend.conn_id)
            hook.load_connection()
            try:
                sweep_connection(
                    hook, known_jobs(jobs), now=time.time(), min_age=0, dry_run=False, recheck=lambda job: None
                )
            finally:
                getattr(hook, "close", lambda: None)()
