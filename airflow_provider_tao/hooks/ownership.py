"""The ownership marks kept with a job, the one ownership rule, and the one cancel routine.

A job is *owned* by the task try that submitted it or took it over (``claim_job``). Platforms keep small marks with
the job through :meth:`~airflow_provider_tao.hooks.base.TAOPlatformHook.read_marks` /
:meth:`~airflow_provider_tao.hooks.base.TAOPlatformHook.write_mark`: :data:`MARK_OWNER`, :data:`MARK_CANCEL`,
:data:`MARK_CANCELED_BY`, :data:`MARK_CONSUMED`.

The rule, in two parts, and nowhere else (the decision table of ``docs/decisions.md`` applies it):

* the owner is the ``owner_try`` mark, else the try that submitted the job (:func:`owner_of`);
* a cancel mark *binds* (the job counts as canceled) only while it names the owner (:func:`cancel_binds`): a cancel an
  old try wrote before a newer try claimed the job (its stop failed, or it landed late) is stale -- the job's own
  exit decides then.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from airflow_provider_tao.jobs import JobHandle, JobStatus

MARK_OWNER = "owner_try"
MARK_CANCEL = "cancel_requested_by"
#: The try whose success used the job's result: a later try (a clear) must not reuse it.
MARK_CONSUMED = "consumed_by"
#: Who canceled the job from outside its task (``airflow tao cancel``, ``airflow tao reap``): its task then fails
#: with ERR_CANCELED instead of resubmitting.
MARK_CANCELED_BY = "canceled_by"
MARK_KEYS = frozenset({MARK_OWNER, MARK_CANCEL, MARK_CONSUMED, MARK_CANCELED_BY})


def owner_of(marks: Mapping[str, Any], submitted_by: int | None) -> int | None:
    """The try that owns the job: its ``owner_try`` mark, else the try that submitted it."""
    owner = marks.get(MARK_OWNER)
    return int(owner) if owner is not None else submitted_by


def cancel_binds(marks: Mapping[str, Any], submitted_by: int | None = None) -> bool:
    """Whether the job's cancel mark makes it Canceled: there is one and it names the owning try (or a newer one).
    An older try's mark written before a newer try claimed the job is stale."""
    cancel = marks.get(MARK_CANCEL)
    if cancel is None:
        return False
    owner = owner_of(marks, submitted_by)
    return owner is None or int(cancel) >= owner


def stale_cancel(marks: Mapping[str, Any], submitted_by: int | None = None) -> bool:
    """The job carries an older try's cancel mark that no longer binds (see :func:`cancel_binds`)."""
    return marks.get(MARK_CANCEL) is not None and not cancel_binds(marks, submitted_by)


class CancelOutcome(enum.Enum):
    """What the one cancel routine (:meth:`OwnershipMixin.cancel_job`) did with a job."""

    #: It ran: the routine marked it canceled and the platform stopped it.
    STOPPED = "stopped"
    #: It had ended (or there was none): it keeps its own verdict, nothing was marked.
    ENDED = "ended"
    #: Another try owns it now (a clear claimed it): left alone.
    NOT_OURS = "left to the try that owns it"

    def __bool__(self) -> bool:
        # the routine returned a bool once; a truthy test of an outcome would always pass
        raise TypeError("a CancelOutcome is not a bool: test .over, or compare with a member")

    @property
    def over(self) -> bool:
        """The job runs no more for the canceling try (stopped now, or ended before): what it holds may be let go."""
        return self is not CancelOutcome.NOT_OURS


class OwnershipMixin:
    """The mark readers and the one cancel routine of :class:`~airflow_provider_tao.hooks.base.TAOPlatformHook`."""

    if TYPE_CHECKING:
        platform: ClassVar[str]
        log: Any

        def read_marks(self, handle: JobHandle) -> dict[str, Any]: ...
        def write_mark(self, handle: JobHandle, key: str, value: Any) -> None: ...
        async def aread_marks(self, handle: JobHandle) -> dict[str, Any]: ...
        async def awrite_mark(self, handle: JobHandle, key: str, value: Any) -> None: ...
        def get_job_status(self, handle: JobHandle) -> JobStatus: ...
        async def aget_job_status(self, handle: JobHandle) -> JobStatus: ...
        def _cancel(self, handle: JobHandle) -> bool: ...
        async def _acancel(self, handle: JobHandle) -> bool: ...

    def claim_job(self, handle: JobHandle) -> None:
        """Record that ``handle.try_number`` now owns the job (on reattach)."""
        self.write_mark(handle, MARK_OWNER, handle.try_number)

    def canceled_by(self, handle: JobHandle) -> str | None:
        """Who canceled the job from outside its task (``airflow tao cancel``, the reaper), if anyone."""
        who = self.read_marks(handle).get(MARK_CANCELED_BY)
        return str(who) if who else None

    def cancel_requested_by(self, handle: JobHandle) -> int | None:
        """The try whose cancel stopped the job, if a cancel was requested through this provider."""
        who = self.read_marks(handle).get(MARK_CANCEL)
        return int(who) if who is not None else None

    def consumed_by(self, handle: JobHandle) -> int | None:
        """The try whose success used this job's result, if any (then a clear must not reuse it)."""
        who = self.read_marks(handle).get(MARK_CONSUMED)
        return int(who) if who is not None else None

    def mark_consumed(self, handle: JobHandle) -> None:
        """Record with the job that ``handle.try_number`` succeeded with its result."""
        self.write_mark(handle, MARK_CONSUMED, handle.try_number)

    def job_owner(self, handle: JobHandle) -> int:
        """The try that owns the job: its mark, else the try that submitted it."""
        return owner_of(self.read_marks(handle), handle.try_number) or handle.try_number

    def _owned(self, handle: JobHandle, marks: Mapping[str, Any]) -> bool:
        owner = owner_of(marks, handle.try_number)
        if owner != handle.try_number:
            self.log.info(
                "Not canceling job %s: try %s owns it now (this is try %s)", handle.job_id, owner, handle.try_number
            )
        return owner == handle.try_number

    def cancel_job(self, handle: JobHandle, requested_by: str | None = None) -> CancelOutcome:
        """The one cancel routine: cancel the job if ``handle``'s try still owns it, and say what it did.

        A finished job keeps its own verdict (it is never marked canceled): :attr:`CancelOutcome.ENDED`. A job
        another try owns now is left alone (:attr:`CancelOutcome.NOT_OURS`) unless ``requested_by`` is given.

        :param handle: the job, as the canceling try knows it.
        :param requested_by: a person or tool canceling from outside the task (``"cli:jdoe"``, ``"reap: ..."``):
            the job is canceled whichever try owns it (as that try's cancel, plus the ``canceled_by`` mark), and
            the task waiting on it fails with ERR_CANCELED instead of submitting the job again.
        """
        marks = self.read_marks(handle)
        if requested_by is None and not self._owned(handle, marks):
            return CancelOutcome.NOT_OURS
        if not self._cancel_decided(handle, marks, self.get_job_status(handle), requested_by):
            return CancelOutcome.ENDED
        if requested_by is not None:
            # who asked first, then the cancel itself -- on behalf of the owning try, so every platform's own
            # reading of "canceled" (the cancel mark) holds for a person's cancel too
            self.write_mark(handle, MARK_CANCELED_BY, requested_by)
        owner = owner_of(marks, handle.try_number) if requested_by else handle.try_number
        self.write_mark(handle, MARK_CANCEL, owner)
        self.log.info(
            "Canceling job %s (%s) on %s%s", handle.job_id, handle.backend_job_id, self.platform,
            f" for {requested_by}" if requested_by else "",
        )  # fmt: skip
        return _outcome(self._cancel(handle))

    def _cancel_decided(
        self, handle: JobHandle, marks: Mapping[str, Any], status: JobStatus, requested_by: str | None
    ) -> bool:
        """Whether the decision (operators/decisions.py: KILL, or PERSON for ``requested_by``) cancels the job;
        a state the platform could not tell defers it (:class:`~airflow_provider_tao.operators.decisions.DecideLater`:
        the caller asks again -- a cancel mark on a job that has completed would turn it Canceled)."""
        from airflow_provider_tao.operators.decisions import Act, DecideLater, Facts, Situation, decide, state_fact

        facts = Facts(try_number=handle.try_number, owner_try=owner_of(marks, handle.try_number),
                      state=state_fact(status))  # fmt: skip
        verdict = decide(facts, Situation.PERSON if requested_by else Situation.KILL)
        if verdict.act is Act.LATER:
            raise DecideLater(f"job {handle.job_id}: {verdict.why} ({status.message})")
        return verdict.act is Act.CANCEL

    async def acancel_job(self, handle: JobHandle) -> CancelOutcome:
        """Async twin of :meth:`cancel_job` (the trigger's ``on_kill``): the same routine on the async client."""
        marks = await self.aread_marks(handle)
        if not self._owned(handle, marks):
            return CancelOutcome.NOT_OURS
        if not self._cancel_decided(handle, marks, await self.aget_job_status(handle), None):
            return CancelOutcome.ENDED
        await self.awrite_mark(handle, MARK_CANCEL, handle.try_number)
        self.log.info("Canceling job %s (%s) on %s", handle.job_id, handle.backend_job_id, self.platform)
        return _outcome(await self._acancel(handle))


def _outcome(stopped: bool) -> CancelOutcome:
    """A platform's stop as an outcome: it stopped the job, or found that another try claimed it between the
    routine's read and its stop (Kubernetes' patch tests the marks it read)."""
    return CancelOutcome.STOPPED if stopped else CancelOutcome.NOT_OURS
