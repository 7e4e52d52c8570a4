"""Every combination of facts, not samples: each situation's whole fact space (each fact's values, UNKNOWN included)
through :func:`~airflow_provider_tao.operators.decisions.decide`, each verdict checked against the invariants.

The invariants at the decision (``tests/explorer/invariants.py`` checks them on the backends):

* I1 never two live jobs: a resubmission only for a job that is not live and whose state is known;
* I2/I6 nothing left behind, nothing taken from a live job: cleanup only for an ended job (or one the verdict stops);
* I3 a person's cancel is final: a binding record fails the task ERR_CANCELED whatever else is read, and so does a
  ``canceled_by`` mark written for this try;
* I4 an old try never cancels a newer try's job, nor does an old try's cancel (stale mark, old ``canceled_by``) fail
  a newer try: a kill cancels only the job its try owns;
* I5 the result is the job's that ran: succeed only on a completed, unused job;
* I7 (secrets) is no decision's: it is checked on the backends;
* U an unknown fact never flips a verdict: the verdict with an unknown fact is "decide again later", or the one
  every known value of that fact would give -- while a "later" exists (a trigger's ``on_kill`` that asked the
  task's state until its timeout cancels, as a kill always did: ``Facts.last_chance``).

``test_todays_rules_break_the_invariants`` runs the same checks on the rules as they were before (issue 37), written
as a table: it shows defects 1, 2 and 9 -- the checks can fail.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from airflow_provider_tao.hooks.ownership import MARK_CANCEL, MARK_OWNER, cancel_binds
from airflow_provider_tao.jobs import ErrClass, JobState
from airflow_provider_tao.operators.decision_table import SPACE, TRY, fact_space, markdown
from airflow_provider_tao.operators.decisions import UNKNOWN, Act, Facts, Situation, Verdict, decide

LIVE = (JobState.PENDING, JobState.RUNNING, JobState.PAUSED)
Decide = Callable[[Facts, Situation], Verdict]


def _ended(facts: Facts) -> bool:
    return isinstance(facts.state, JobState) and facts.state.is_terminal


def _binding_mark(facts: Facts) -> bool:
    """A ``canceled_by`` mark written for this try (or one that names no try)."""
    return isinstance(facts.canceled_by, str) and (facts.cancel_try is None or facts.cancel_try == TRY)


def _stale(facts: Facts) -> bool:
    """Only an older try's cancel marks: no binding record, a ``canceled_by`` (if any) for an older try."""
    return facts.person_cancel is None and isinstance(facts.cancel_try, int) and facts.cancel_try < TRY


def invariant_breaks(facts: Facts, situation: Situation, verdict: Verdict) -> list[str]:
    found = []
    act = verdict.act
    canceled = act is Act.FAIL and verdict.err_class is ErrClass.ERR_CANCELED
    if act is Act.RESUBMIT and (facts.state is UNKNOWN or facts.state in LIVE):
        found.append("I1: resubmits while the job may be live")
    if verdict.clean_up and not _ended(facts) and act is not Act.CANCEL and not verdict.stop:
        found.append("I2: cleans up a job that has not ended")
    if situation in (Situation.RESUME, Situation.REATTACH) and isinstance(facts.person_cancel, str) and not canceled:
        found.append("I3: a person's cancel record binds the task, yet the verdict is " + act.value)
    if situation is Situation.RESUME and facts.person_cancel is None and _binding_mark(facts) and not canceled:
        found.append("I3: the job's canceled_by mark for this try, yet the verdict is " + act.value)
    if act is Act.CANCEL and situation is Situation.KILL and facts.owner_try != TRY:
        found.append("I4: cancels a job another try owns")
    if act is Act.CANCEL and situation is Situation.SWEEP and _task_may_want_it(facts):
        found.append("I4: the sweeper cancels a job its task may still want")
    if situation is Situation.RESUME and _stale(facts) and canceled:
        found.append("I4: an older try's cancel (a reap, a stop that failed) fails this try")
    if act is Act.SUCCEED and situation is Situation.RESUME and facts.outcome != "complete":
        found.append("I5: succeeds without a completed job")
    if (
        act is Act.SUCCEED
        and situation is Situation.REATTACH
        and (facts.state is not JobState.COMPLETE or facts.consumed_by is not None)
    ):
        found.append("I5: takes a result that is not an unused completed job's")
    return found


def _task_may_want_it(facts: Facts) -> bool:
    """The sweeper must keep the job: not this Airflow's, too young, its task still waits (within its deadline) or
    was cleared, or it asked to keep its job (cancel_on_kill=False: a sweep stops only what a deadline ended)."""
    if facts.young or not facts.recorded or not facts.same_connection:
        return True
    wanted = facts.current and facts.task_state in ("running", "deferred", "up_for_retry")
    if wanted:
        return not facts.past_deadline
    cleared = facts.current and facts.task_exists and facts.task_state is None
    return cleared or not facts.cancel_on_kill


def _knowns(facts: Facts, situation: Situation) -> Iterator[Facts]:
    """``facts`` with each UNKNOWN replaced by every known value of its fact."""
    unknown = [name for name in SPACE[situation] if getattr(facts, name) is UNKNOWN]
    choices = [[v for v in SPACE[situation][name] if v is not UNKNOWN] for name in unknown]
    for values in itertools.product(*choices):
        yield replace(facts, **dict(zip(unknown, values, strict=True)))


def flips(facts: Facts, situation: Situation, verdict: Verdict, rule: Decide) -> str | None:
    """U: an unknown fact decided the verdict (it is neither "later" nor what every known value gives)."""
    if verdict.act is Act.LATER or all(getattr(facts, n) is not UNKNOWN for n in SPACE[situation]):
        return None
    if facts.last_chance and facts.task_state is UNKNOWN:  # U holds while a "later" exists (Facts.last_chance)
        return None
    known = {(rule(f, situation).act, rule(f, situation).err_class) for f in _knowns(facts, situation)}
    if known == {(verdict.act, verdict.err_class)}:
        return None
    return f"U: with unknown facts the verdict is {verdict.act.value}, the known values give {sorted(map(str, known))}"


def violations(rule: Decide) -> dict[str, list[tuple[Situation, Facts]]]:
    found: dict[str, list[tuple[Situation, Facts]]] = {}
    for situation in SPACE:
        for facts in fact_space(situation):
            verdict = rule(facts, situation)
            for text in [*invariant_breaks(facts, situation, verdict), flips(facts, situation, verdict, rule)]:
                if text:
                    found.setdefault(text.split(",")[0], []).append((situation, facts))
    return found


def ownership_breaks(binds: Callable[[dict[str, Any]], bool]) -> list[str]:
    """I4 of the ownership rule: a cancel mark binds only while it names the owner (or a newer try)."""
    return [
        f"I4: owner {owner}, cancel mark of try {cancel}: binds={binds({MARK_OWNER: owner, MARK_CANCEL: cancel})}"
        for owner, cancel in itertools.product([1, 2, 3], [None, 1, 2, 3])
        if binds({MARK_OWNER: owner, MARK_CANCEL: cancel}) != (cancel is not None and cancel >= owner)
    ]


def test_every_verdict_of_the_whole_fact_space_keeps_the_invariants() -> None:
    sizes = {situation: sum(1 for _ in fact_space(situation)) for situation in SPACE}
    assert sizes == {
        Situation.RESUME: 20160,  # + outcome budget x over_budget (max_gpu_hours, issue 33)
        Situation.REATTACH: 3024,
        Situation.KILL: 784,
        Situation.PERSON: 28,
        Situation.SWEEP: 1792,
    }
    assert violations(decide) == {}
    assert ownership_breaks(cancel_binds) == []


# ----------------------------------------------------------------------------- the rules before issue 37, as a table


def todays_decide(facts: Facts, situation: Situation) -> Verdict:
    """The verdicts ``execute_complete`` / ``_reusable`` / the cancel routine gave before issue 37."""
    if situation is Situation.RESUME:
        return _todays_resume(facts)
    if situation is Situation.REATTACH:
        if facts.state is UNKNOWN:
            return Verdict(Act.LATER, "cannot tell")
        if facts.state is None or facts.state in (JobState.ERROR, JobState.CANCELED):
            return Verdict(Act.RESUBMIT, "ended")
        if facts.consumed_by is UNKNOWN:
            return Verdict(Act.RETRY, "the read raised")
        if facts.consumed_by is not None:
            return Verdict(Act.RESUBMIT, "consumed")
        return Verdict(Act.SUCCEED if facts.state is JobState.COMPLETE else Act.ADOPT, "reusable")
    return decide(facts, situation)  # kill and a person's cancel: unchanged in substance


def _todays_resume(facts: Facts) -> Verdict:
    # the person's record bound only the recorded task-instance id: a resumed try never read it
    if facts.outcome == "timeout":
        return Verdict(Act.RETRY, "timeout", ErrClass.ERR_TIMEOUT, clean_up=True)
    if facts.canceled_by is UNKNOWN:
        return Verdict(Act.RETRY, "the read raised: a retry with a new task-instance id")
    if isinstance(facts.canceled_by, str):  # any canceled_by, whoever's try it was written for
        return Verdict(Act.FAIL, "canceled by", ErrClass.ERR_CANCELED, clean_up=True)
    if facts.outcome == "canceled":
        if facts.cancel_try is UNKNOWN:
            return Verdict(Act.RETRY, "the read raised")
        if facts.cancel_try is not None:
            return Verdict(Act.RESUBMIT, "an older try's cleanup", clean_up=True)
        return Verdict(Act.FAIL, "canceled outside Airflow", ErrClass.ERR_CANCELED, clean_up=True)
    if facts.outcome == "complete":
        return Verdict(Act.SUCCEED, "complete", clean_up=True)
    if facts.err_class is UNKNOWN:
        return Verdict(Act.RETRY, "the analysis raised")
    if not isinstance(facts.err_class, ErrClass):
        return Verdict(Act.RETRY, "no analysis", ErrClass.ERR_UNKNOWN, clean_up=True)
    return Verdict(Act.RETRY if facts.err_class.retriable else Act.FAIL, "failed", facts.err_class, clean_up=True)


def test_todays_rules_break_the_invariants() -> None:
    found = violations(todays_decide)
    # defect 1: a person's cancel and a read that raised -> a retry the record no longer binds
    assert any(
        s is Situation.RESUME and f.person_cancel == "cli:jdoe" and f.canceled_by is UNKNOWN
        for s, f in found["I3: a person's cancel record binds the task"]
    )
    # defect 2: the reaper's canceled_by for try 1 fails try 2 of a clear that adopted the job
    assert any(f.outcome == "complete" and f.cancel_try == 1 for _, f in found["I4: an older try's cancel (a reap"])
    # defect 9: an old try's cancel mark still binds after a newer try claimed the job
    assert ownership_breaks(lambda marks: marks.get(MARK_CANCEL) is not None)
    # defect 5: cleanup of a job still running (a timeout with cancel_on_kill=False, a requeued failure)
    assert found["I2: cleans up a job that has not ended"]


def test_the_decision_table_in_the_docs_is_the_codes() -> None:
    """docs/decisions.md is generated from decide(): regenerate it with
    ``python -m airflow_provider_tao.operators.decision_table > docs/decisions.md``."""
    committed = (Path(__file__).parents[2] / "docs" / "decisions.md").read_text()
    assert committed == markdown(), "docs/decisions.md is stale: regenerate it (see this test's docstring)"
