"""A job's fate, decided in one place: facts read in one step (:class:`Facts`), one pure function
(:func:`decide`) mapping them to a :class:`Verdict`; the acts follow the verdict.

Every path that decides calls :func:`decide`: the resumed task (``execute_complete``), the reattach of ``execute``, a
kill (the operator's and the trigger's ``on_kill``), and ``airflow tao cancel``. Each fact may be :data:`UNKNOWN` (its
read failed); an unknown fact never flips a verdict: it defers the decision (:attr:`Act.LATER`: the task is retried
with the facts still binding it, or the same decision is asked again). The table of every verdict is generated from
this module into ``docs/decisions.md`` (:mod:`~airflow_provider_tao.operators.decision_table`; a unit test keeps it
current).

The ownership rule it applies lives in :mod:`airflow_provider_tao.hooks.ownership`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Final

from airflow_provider_tao.hooks.shared.reaping import FINISHED_TASK_STATES
from airflow_provider_tao.jobindex import WANTED_TI_STATES
from airflow_provider_tao.jobs import ErrClass, JobState


class _Unknown:
    """A fact whose read failed."""

    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"


#: A fact that could not be read (the platform, the store or Airflow did not answer).
UNKNOWN: Final = _Unknown()


class DecideLater(Exception):
    """A verdict of :attr:`Act.LATER` where the caller asks again (the cancel routine): a fact could not be read."""


class Situation(enum.Enum):
    """Where the decision is asked."""

    RESUME = "resume"  # the task resumes after its trigger's event (or the worker's own wait)
    REATTACH = "reattach"  # a try starts and found an earlier job of its task instance
    KILL = "kill"  # the operator's or the trigger's on_kill
    PERSON = "person"  # `airflow tao cancel`
    SWEEP = "sweep"  # `airflow tao reap`: an active job and the task records that name it


class Act(enum.Enum):
    """What follows a decision."""

    ADOPT = "adopt"  # watch the earlier job as this try's
    RESUBMIT = "resubmit"  # submit a new job
    SUCCEED = "succeed"  # return the job's result
    FAIL = "fail"  # fail the task for good (no retry) with the verdict's class
    RETRY = "retry"  # fail the task for a retry with the verdict's class
    CANCEL = "cancel"  # stop our job (then clean up after it)
    LEAVE = "leave"  # leave the job as it is
    LATER = "later"  # a fact is unknown: decide again later (the task retried, the facts still binding)


#: Airflow task instance states after which no try runs again without a person (failed, success, ...).
TASK_OVER_STATES = FINISHED_TASK_STATES


@dataclass(frozen=True)
class Facts:
    """Everything a decision needs, read in one step (:mod:`airflow_provider_tao.operators.fact_reader`).

    :param try_number: the deciding task try.
    :param state: the job's platform state now; None: no such job.
    :param owner_try: the ``owner_try`` mark, else the try that submitted the job.
    :param cancel_try: the cancel mark: the try on whose behalf the job was canceled through this provider.
    :param canceled_by: who canceled the job from outside its task (a person, the reaper).
    :param consumed_by: the try whose success used the job's result.
    :param person_cancel: who canceled the task (``airflow tao cancel``) in a record not yet honoured by a try:
        it binds the task (dag, run, task, map index), whichever try runs next.
    :param outcome: what the trigger (or the worker's wait) saw the job end as (``complete``, ``error``,
        ``canceled``, ``timeout``); RESUME only.
    :param err_class: the failure analysis' class of a failed job (None: no analysis); it says if it is retriable.
    :param cancel_on_kill: the operator's ``cancel_on_kill``.
    :param task_state: the task instance's Airflow state (KILL); None: cleared, not yet scheduled.
    :param last_chance: no "later" is left (a trigger's ``on_kill`` asked the task's state again until its
        ``on_kill_timeout``): the kill cancels as it always did rather than leave a job no try may watch.
    :param young: (SWEEP) the job is younger than the sweep's minimum age.
    :param recorded: (SWEEP) this Airflow's task records name the job.
    :param same_connection: (SWEEP) the job is judged through the connection that started it.
    :param current: (SWEEP) the job is its task instance's newest.
    :param task_exists: (SWEEP) the task instance's row exists (``task_state`` None then means cleared).
    :param past_deadline: (SWEEP) the task's deadline (plus the minimum age) has passed.
    :param lease_expired: (SWEEP) the job outlived its lease.
    :param over_budget: (RESUME, outcome ``budget``) the job's GPU-hours so far reach its ``max_gpu_hours``.
    """

    try_number: int
    state: JobState | _Unknown | None = None
    owner_try: int | _Unknown | None = None
    cancel_try: int | _Unknown | None = None
    canceled_by: str | _Unknown | None = None
    consumed_by: int | _Unknown | None = None
    person_cancel: str | _Unknown | None = None
    outcome: str | None = None
    err_class: ErrClass | _Unknown | None = None
    cancel_on_kill: bool = True
    task_state: str | _Unknown | None = None
    last_chance: bool = False
    young: bool = False
    recorded: bool = True
    same_connection: bool = True
    current: bool = True
    task_exists: bool = True
    past_deadline: bool = False
    lease_expired: bool = False
    over_budget: bool | _Unknown | None = None


@dataclass(frozen=True)
class Verdict:
    """A decision: its act, the failure class it ends with, why, and the best-effort cleanup that follows it.

    :param clean_up: remove what only a running job needs (secrets) -- only ever for a job whose state is terminal.
    :param adoptable: the cleanup keeps what a next try needs to adopt a job that completed.
    :param stop: stop the job (a person's cancel the task honours) before failing.
    """

    act: Act
    why: str
    err_class: ErrClass | None = None
    clean_up: bool = False
    adoptable: bool = False
    stop: bool = False


def state_fact(status: Any) -> JobState | _Unknown | None:
    """A :class:`~airflow_provider_tao.jobs.JobStatus` as the state fact: None when the platform no longer knows the
    job, UNKNOWN when it could not tell."""
    if status.not_found:
        return None
    return UNKNOWN if status.state is JobState.UNKNOWN else status.state


def _known(*values: Any) -> bool:
    return all(value is not UNKNOWN for value in values)


def _ended(facts: Facts) -> bool:
    return isinstance(facts.state, JobState) and facts.state.is_terminal


def _person_binds(facts: Facts) -> str | None:
    """Who canceled this task or this try's job from outside it, when that cancel binds the deciding try.

    A ``canceled_by`` mark binds the try it was written for (the cancel mark names it) and newer ones only through
    the person's record: a reap or a cancel of try 1 whose stop failed does not fail try 2 of a clear."""
    if isinstance(facts.person_cancel, str):
        return facts.person_cancel
    if isinstance(facts.canceled_by, str) and (facts.cancel_try is None or _at_least(facts.cancel_try, facts)):
        return facts.canceled_by
    return None


def _at_least(cancel_try: int | _Unknown | None, facts: Facts) -> bool:
    return isinstance(cancel_try, int) and cancel_try >= facts.try_number


def decide(facts: Facts, situation: Situation) -> Verdict:
    """The one decision of a job's fate (the table: ``docs/decisions.md``)."""
    if situation is Situation.RESUME:
        return _resume(facts)
    if situation is Situation.REATTACH:
        return _reattach(facts)
    if situation is Situation.KILL:
        return _kill(facts)
    if situation is Situation.SWEEP:
        return _sweep(facts)
    return _person(facts)


def _person_cancel_verdict(facts: Facts, who: str) -> Verdict:
    return Verdict(
        Act.FAIL, f"canceled by {who}", ErrClass.ERR_CANCELED, clean_up=_ended(facts), stop=not _ended(facts)
    )


def _resume(facts: Facts) -> Verdict:
    """The task resumes with the trigger's ``outcome``; ``state`` is the job now (a requeue may have revived it)."""
    clean = _ended(facts)
    if isinstance(facts.person_cancel, str):  # the person's record binds whatever the marks say
        return _person_cancel_verdict(facts, facts.person_cancel)
    if not _known(facts.person_cancel, facts.canceled_by, facts.cancel_try):
        return Verdict(Act.LATER, "a cancel mark or a person's cancel could not be read")
    if who := _person_binds(facts):
        return _person_cancel_verdict(facts, who)
    if facts.outcome == "budget":
        return _budget(facts)
    if facts.outcome == "timeout":
        return Verdict(
            Act.RETRY, "the task's execution_timeout passed", ErrClass.ERR_TIMEOUT,
            clean_up=facts.cancel_on_kill or clean, stop=facts.cancel_on_kill,
        )  # fmt: skip
    if facts.outcome == "complete":
        return Verdict(Act.SUCCEED, "the job completed", clean_up=clean)
    if facts.outcome == "canceled":
        if facts.cancel_try is not None and facts.state is UNKNOWN:
            return Verdict(Act.LATER, "whether the canceled job has stopped could not be read")
        if facts.cancel_try is not None and not clean and facts.state is not None:
            return Verdict(Act.LATER, "the canceled job has not stopped yet: the next try reattaches or resubmits")
        if facts.cancel_try is not None:  # our own provider's cancel, yet this try resumes: not the user's kill
            return Verdict(Act.RESUBMIT, f"canceled by try {facts.cancel_try}'s cleanup", clean_up=clean)
        return Verdict(Act.FAIL, "canceled outside Airflow", ErrClass.ERR_CANCELED, clean_up=clean)
    if facts.err_class is UNKNOWN:
        return Verdict(Act.LATER, "the failure analysis could not be read")
    if not isinstance(facts.err_class, ErrClass):
        return Verdict(Act.RETRY, "the job failed (no analysis)", ErrClass.ERR_UNKNOWN, clean_up=clean)
    act = Act.RETRY if facts.err_class.retriable else Act.FAIL
    return Verdict(act, f"the job failed with {facts.err_class.value}", facts.err_class, clean_up=clean)


def _budget(facts: Facts) -> Verdict:
    """The trigger woke at the earliest moment the job could pass ``max_gpu_hours``; its GPU-hours say."""
    if facts.over_budget is UNKNOWN:
        return Verdict(Act.LATER, "the job's GPU-hours could not be read")
    if facts.over_budget:
        return Verdict(
            Act.FAIL,
            "the job passed its max_gpu_hours",
            ErrClass.ERR_BUDGET,
            clean_up=_ended(facts),
            stop=not _ended(facts),
        )
    return Verdict(Act.ADOPT, "the job has GPU-hours left (it waited before it ran): watch it again")


def _reattach(facts: Facts) -> Verdict:
    """A starting try and an earlier job of its task instance (the stored one, or the newest of the name)."""
    if facts.person_cancel is UNKNOWN:
        return Verdict(Act.LATER, "a person's cancel record could not be read")
    if isinstance(facts.person_cancel, str):
        return _person_cancel_verdict(facts, facts.person_cancel)
    if facts.state is UNKNOWN:
        return Verdict(Act.LATER, "cannot tell whether it still runs; not submitting another one, to avoid a duplicate")
    if facts.state is None or facts.state in (JobState.ERROR, JobState.CANCELED, JobState.UNKNOWN):
        return Verdict(Act.RESUBMIT, "the earlier job ended without a result to use")
    if facts.consumed_by is UNKNOWN:
        return Verdict(Act.LATER, "whether the earlier job's result was used could not be read")
    if facts.consumed_by is not None and facts.state is not JobState.COMPLETE:  # never two live jobs
        return Verdict(Act.LATER, f"a job whose result try {facts.consumed_by} used runs again")
    if facts.consumed_by is not None:
        return Verdict(Act.RESUBMIT, f"the job's result was used by try {facts.consumed_by} (a clear)")
    if facts.state is JobState.COMPLETE:
        return Verdict(Act.SUCCEED, "the earlier job completed unused", clean_up=True)
    return Verdict(Act.ADOPT, "the earlier job still runs: this try claims it")


def _kill(facts: Facts) -> Verdict:
    """A kill of the task (marked failed/success, cleared, timed out) or a trigger that moved between triggerers."""
    if not facts.cancel_on_kill:
        return Verdict(Act.LEAVE, "cancel_on_kill=False")
    if facts.task_state == "deferred":
        return Verdict(Act.LEAVE, "the task still waits (its trigger moved to another triggerer)")
    if facts.task_state is UNKNOWN and not facts.last_chance:
        return Verdict(Act.LATER, "the task's state could not be read: ask again")
    # cleared (None), a retry coming, or never told (the last chance): a next try may adopt a completed job
    adoptable = facts.task_state not in TASK_OVER_STATES
    if not _known(facts.owner_try, facts.state):
        return Verdict(Act.LATER, "the job's owner or state could not be read: ask again")
    if facts.owner_try is not None and facts.owner_try != facts.try_number:
        return Verdict(Act.LEAVE, f"try {facts.owner_try} owns the job now")
    if facts.state is None:
        return Verdict(Act.LEAVE, "no such job")
    if _ended(facts):
        return Verdict(Act.LEAVE, "the job has ended: it keeps its verdict", clean_up=True, adoptable=adoptable)
    return Verdict(Act.CANCEL, "the job this try owns still runs", clean_up=True, adoptable=adoptable)


def _person(facts: Facts) -> Verdict:
    """``airflow tao cancel``: a person cancels the job whichever try owns it -- while it runs."""
    if facts.state is UNKNOWN:
        return Verdict(Act.LATER, "the job's state could not be read")
    if facts.state is None or _ended(facts):
        return Verdict(Act.LEAVE, "already ended: left as it was")
    return Verdict(Act.CANCEL, "a person's cancel of a running job", ErrClass.ERR_CANCELED)


def _sweep(facts: Facts) -> Verdict:
    """``airflow tao reap`` on an active job: cancel it (for the reaper, :attr:`Act.CANCEL`) or keep it."""
    if facts.young:
        return Verdict(Act.LEAVE, "younger than --min-age-minutes")
    if not facts.recorded:
        # another deployment's job, one whose try died before recording it (its retry adopts it by name), or one
        # whose records were cleaned up: not ours to judge
        return Verdict(Act.LEAVE, "not in this Airflow's task records")
    if not facts.same_connection:
        return Verdict(Act.LEAVE, "judged only through the connection that started it")
    if facts.task_state is UNKNOWN:
        return Verdict(Act.LATER, "its task's state could not be read: the next sweep")
    if facts.current and facts.task_state in WANTED_TI_STATES:
        if facts.past_deadline:
            return Verdict(Act.CANCEL, "past its task's deadline")
        return Verdict(Act.LEAVE, f"its task is {facts.task_state}")
    if facts.current and facts.task_exists and facts.task_state is None:
        return Verdict(Act.LEAVE, "its task was cleared and waits to be scheduled")
    if not facts.cancel_on_kill:
        return Verdict(Act.LEAVE, "its task set cancel_on_kill=False")
    # a lease only names why an orphan goes: it never overrides the rules above (a live task's lease is its deadline)
    reasons = (
        (facts.lease_expired, "lease expired"),
        (not facts.current, "orphan: a newer job of its task replaced it"),
        (not facts.task_exists, "orphan: its task is gone"),
    )
    return Verdict(Act.CANCEL, next((why for met, why in reasons if met), f"orphan: its task is {facts.task_state}"))
