"""A person's cancel of a job whose task instance was just cleared (Airflow's state None): the cancel is kept for the
task's next try, which fails ERR_CANCELED submitting nothing -- and the person is told exactly that. The pair
explorer found the note saying "already ended: left as it was" for an ended job while the next try failed
ERR_CANCELED (pairs ``clear`` then ``cli_cancel`` inside the clear's ``on_kill``): None meant both "nothing kept" and
"kept, the task instance cleared"."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_tao import person_cancel
from airflow_provider_tao.canceling import cancel_as_person
from airflow_provider_tao.jobindex import IndexedJob
from airflow_provider_tao.jobs import JobSpec, JobState
from airflow_provider_tao.records import JobRecord
from tests.unit.fakes import FakeHook


@pytest.mark.parametrize("job_state", [JobState.ERROR, JobState.RUNNING], ids=["ended", "running"])
def test_a_cleared_task_keeps_the_cancel_and_the_person_is_told_its_next_try_fails(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, job_state: JobState
) -> None:
    hook = FakeHook(conn_id="fake_conn")
    handle = hook.create_job(JobSpec(name="train-x", job_id="abcdefabcdef", command="train"))
    fake_platform.jobs[handle.job_id]["state"] = job_state
    kept: list[dict[str, Any]] = []
    monkeypatch.setattr(person_cancel, "_task_instance_now", lambda job: ("ti-1", None))  # cleared
    monkeypatch.setattr(person_cancel, "_keep", lambda job, value: kept.append(value))
    job = IndexedJob(JobRecord(handle=handle.to_json()), "dag", "manual__1", "train", -1, None, 1, None, True)

    row = cancel_as_person(job, hook, "cli:someone")

    assert [k["by"] for k in kept] == ["cli:someone"]  # kept: the next try reads it before submitting
    assert row["note"] == "its task (cleared) fails with ERR_CANCELED when it next runs, submitting nothing"


def _canceled_by_a_person(
    platform: type[FakeHook],
    monkeypatch: pytest.MonkeyPatch,
    state: JobState,
    ti_reads: list[tuple[str, str | None]],
    becomes: JobState | None = None,
) -> tuple[FakeHook, Any, dict[str, Any], list[dict[str, Any]]]:
    """``airflow tao cancel`` of the current try's job, in ``state`` at the CLI's first read: the task instance as
    ``ti_reads`` gives it, read after read (the last one from then on); the job ``becomes`` another state as the
    cancel routine starts (a requeue, its end). The hook, the handle, the row the person is shown, the records kept."""
    hook = FakeHook(conn_id="fake_conn")
    handle = hook.create_job(JobSpec(name="train-w", job_id="cdefabcdefab", command="train"))
    platform.jobs[handle.job_id]["state"] = state
    reads, kept = list(ti_reads), []
    monkeypatch.setattr(person_cancel, "_task_instance_now", lambda job: reads.pop(0) if len(reads) > 1 else reads[0])
    monkeypatch.setattr(person_cancel, "_keep", lambda job, value: kept.append(value))
    if becomes is not None:
        real = FakeHook.cancel_job

        def meanwhile(self: FakeHook, handle: Any, requested_by: str | None = None) -> bool:
            platform.jobs[handle.job_id]["state"] = becomes
            return real(self, handle, requested_by=requested_by)

        monkeypatch.setattr(FakeHook, "cancel_job", meanwhile)
    job = IndexedJob(JobRecord(handle=handle.to_json()), "dag", "manual__1", "train", -1, None, 1, None, True)
    return hook, handle, cancel_as_person(job, hook, "cli:someone"), kept


@pytest.mark.parametrize("ti_state", ["deferred", "running"])
def test_a_cancel_of_an_ended_job_keeps_nothing_a_waiting_try_could_read_before_it_is_voided(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, ti_state: str
) -> None:
    """The task's deadline stopped its job, then a person canceled it (the pair explorer on Kubernetes): the job has
    ended, so its waiting try takes the job's own verdict and the person is told "already ended". The cancel was
    kept, then voided -- and the try resuming in between read it and failed ERR_CANCELED. Nothing is kept now."""
    _, _, row, kept = _canceled_by_a_person(fake_platform, monkeypatch, JobState.ERROR, [("ti-1", ti_state)])

    assert (row["canceled"], row["note"]) == (False, "already ended: left as it was")
    assert not [k for k in kept if not k.get("void")], kept  # never a binding record, not even for a moment


@pytest.mark.parametrize("ti_state", ["deferred", "running"])
def test_a_job_requeued_after_the_clis_first_read_is_canceled_and_the_person_is_told_its_task_fails(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, ti_state: str
) -> None:
    """Read while triaging the pair explorer's next finding (SLURM's requeue path): a person cancels a job just
    after its failure, as the trigger requeues it. The CLI's first read sees it ended, the cancel routine finds it
    running again, marks it canceled by the person and stops it -- and the CLI told the person "already ended: left
    as it was" and voided the record, while the mark failed the task ERR_CANCELED. What the routine did is what the
    person is told, and the cancel is kept for the task as any cancel of a running job."""
    hook, handle, row, kept = _canceled_by_a_person(
        fake_platform, monkeypatch, JobState.ERROR, [("ti-1", ti_state)], becomes=JobState.RUNNING
    )

    assert hook.canceled_by(handle) == "cli:someone"  # the routine canceled it for the person
    assert (row["canceled"], row["note"]) == (True, "its task fails with ERR_CANCELED")
    assert kept and not kept[-1].get("void") and kept[-1]["by"] == "cli:someone"


def test_canceling_a_canceled_job_again_says_it_had_ended_and_keeps_nothing(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second ``airflow tao cancel`` of a job a person canceled already: its mark is the first cancel's, not
    this one's -- "already ended", nothing kept (the loaded rehearsal's e2e test of the CLI)."""
    hook, handle, row, _ = _canceled_by_a_person(fake_platform, monkeypatch, JobState.RUNNING, [("ti-1", "deferred")])
    assert row["canceled"] and hook.canceled_by(handle) == "cli:someone"
    job = IndexedJob(JobRecord(handle=handle.to_json()), "dag", "manual__1", "train", -1, None, 1, None, True)
    monkeypatch.setattr(person_cancel, "_task_instance_now", lambda job: ("ti-1", "failed"))

    again = cancel_as_person(job, hook, "cli:someone")

    assert (again["was"], again["canceled"], again["note"]) == ("Canceled", False, "already ended: left as it was")


@pytest.mark.parametrize("ended", [True, False], ids=["job-ended", "job-ends-meanwhile"])
def test_a_cancel_kept_for_a_try_to_come_is_never_voided_when_that_try_starts_meanwhile(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, ended: bool
) -> None:
    """The pair explorer on ``local``, loaded: a person canceled the ended job of a task instance being cleared. The
    CLI kept the cancel for the try to come; that try started (a new id) as the CLI wrote, and read the cancel; the
    CLI, reading the task running, voided it and told the person "already ended: left as it was" -- the try had
    failed ERR_CANCELED already. A cancel kept for a try to come binds that try: told so, never voided."""
    _, _, row, kept = _canceled_by_a_person(
        fake_platform,
        monkeypatch,
        JobState.ERROR if ended else JobState.RUNNING,
        [("ti-1", None), ("ti-2", "running")],  # cleared, then its try started
        becomes=None if ended else JobState.ERROR,  # or the job ends between the CLI's first read and its routine
    )

    assert not any(k.get("void") for k in kept), kept
    assert row["note"] == "its task (cleared) fails with ERR_CANCELED when it next runs, submitting nothing"


def test_an_earlier_tries_job_keeps_nothing_and_says_it_ended(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = FakeHook(conn_id="fake_conn")
    handle = hook.create_job(JobSpec(name="train-y", job_id="bcdefabcdefa", command="train"))
    fake_platform.jobs[handle.job_id]["state"] = JobState.ERROR
    monkeypatch.setattr(person_cancel, "_keep", lambda job, value: pytest.fail("kept a cancel for an old job"))
    job = IndexedJob(JobRecord(handle=handle.to_json()), "dag", "manual__1", "train", -1, None, 1, None, False)

    assert cancel_as_person(job, hook, "cli:someone")["note"] == "already ended: left as it was"


@pytest.mark.parametrize("reads_fail", [1, 3], ids=["once", "every-ask"])
def test_a_cancel_whose_status_read_fails_asks_again_and_never_voids_the_persons_cancel(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, reads_fail: int
) -> None:
    """The Brev explorer slice of CI (load): the cancel routine could not tell the job's state (DecideLater), the
    CLI raised with the person's cancel kept, and the task failed ERR_CANCELED while the person saw a traceback.
    Now the routine is asked again; when it never can be, the person is told the cancel is kept and what follows."""
    from airflow_provider_tao import canceling

    hook = FakeHook(conn_id="fake_conn")
    handle = hook.create_job(JobSpec(name="train-z", job_id="cdefabcdefab", command="train"))
    kept: list[dict[str, Any]] = []
    monkeypatch.setattr(person_cancel, "_task_instance_now", lambda job: ("ti-1", "deferred"))
    monkeypatch.setattr(person_cancel, "_keep", lambda job, value: kept.append(value))
    monkeypatch.setattr(canceling, "CANCEL_PAUSE", 0.0)
    real, calls = FakeHook.cancel_job, []

    def flaky_cancel(self: FakeHook, handle: Any, requested_by: str | None = None) -> bool:
        calls.append(requested_by)
        if len(calls) <= reads_fail:
            raise RuntimeError("the job's state could not be read")
        return real(self, handle, requested_by=requested_by)

    monkeypatch.setattr(FakeHook, "cancel_job", flaky_cancel)
    job = IndexedJob(JobRecord(handle=handle.to_json()), "dag", "manual__1", "train", -1, None, 1, None, True)

    row = cancel_as_person(job, hook, "cli:someone")

    assert not any(k.get("void") for k in kept)  # the person's cancel is never voided by a read that failed
    if reads_fail < canceling.CANCEL_ASKS:
        assert row["canceled"] and row["note"] == "its task fails with ERR_CANCELED"
    else:
        assert not row["canceled"] and len(calls) == canceling.CANCEL_ASKS
        assert "the cancel is kept: its task fails with ERR_CANCELED when it resumes" in row["note"]


@pytest.mark.parametrize("call", ["get_job_status", "canceled_by", "cleanup_job"])
@pytest.mark.parametrize("fails", ["once", "always"])
def test_a_blip_at_any_platform_call_of_a_persons_cancel_is_told_never_a_traceback(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, call: str, fails: str
) -> None:
    """A platform call of ``airflow tao cancel`` that fails (the pair explorer's second fault inside the CLI's
    cancel): the state read before anything is asked again, and if it never answers nothing is kept or canceled
    and the person is told to run it again; the mark read back after the routine stopped the job leaves it
    canceled; the cleanup after it is best effort. Each ended in a traceback before."""
    from airflow_provider_tao import canceling

    hook = FakeHook(conn_id="fake_conn")
    handle = hook.create_job(JobSpec(name="train-w", job_id="defabcdefabc", command="train"))
    kept: list[dict[str, Any]] = []
    monkeypatch.setattr(person_cancel, "_task_instance_now", lambda job: ("ti-1", "failed"))  # no try resumes
    monkeypatch.setattr(person_cancel, "_keep", lambda job, value: kept.append(value))
    monkeypatch.setattr(canceling, "CANCEL_PAUSE", 0.0)
    real, failed = getattr(FakeHook, call), []

    def blip(self: FakeHook, *args: Any, **kwargs: Any) -> Any:
        if fails == "always" or not failed:
            failed.append(call)
            raise ConnectionResetError(f"{call}: the connection was reset")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(FakeHook, call, blip)
    job = IndexedJob(JobRecord(handle=handle.to_json()), "dag", "manual__1", "train", -1, None, 1, None, True)

    row = cancel_as_person(job, hook, "cli:someone")

    if call == "get_job_status" and fails == "always":
        assert (row["canceled"], kept) == (False, [])
        assert "run the cancel again" in row["note"]
        assert fake_platform.jobs[handle.job_id]["state"] is JobState.RUNNING
    else:
        assert row["canceled"], row
        assert fake_platform.jobs[handle.job_id]["state"] is JobState.CANCELED
