"""A kill that lands while a retry looks at the earlier try's job (a person marks the task failed then, found by the
pair explorer: ``worker_kill`` at the deferral, then ``mark_failed`` inside the retry's reattach): ``on_kill`` stops
that job -- from the try's first step to its claim -- as it would once adopted; before, it belonged to no one and ran
on with its task gone (the sweeper's next pass its only stop)."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_tao.hooks.base import MARK_OWNER
from airflow_provider_tao.jobs import JobSpec, JobState
from tests.unit.fakes import FakeHook, Store, make_context
from tests.unit.test_operator_submit import _defer, _op


class Killed(BaseException):
    """The worker's kill, landing inside a step (Airflow's SIGTERM handler raises in the task's thread)."""


@pytest.mark.parametrize(
    ("step", "nth"),
    [("get_job_status", 1), ("get_job_status", 2), ("read_marks", 1), ("write_mark", 1)],  # every call it makes
    ids=["left-behind-status-read", "reattach-status-read", "reattach-marks-read", "claim"],
)
def test_a_kill_while_the_retry_looks_at_the_earlier_job_cancels_it(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, step: str, nth: int
) -> None:
    store = Store()
    _defer(_op(deferrable=True), make_context(store, 1))  # try 1's job runs; its worker is gone
    (job,) = fake_platform.jobs.values()
    job["state"] = JobState.RUNNING
    real, calls = getattr(FakeHook, step), []

    def killed_at(self: FakeHook, *args: Any) -> Any:
        calls.append(step)
        if len(calls) == nth:
            raise Killed(step)
        return real(self, *args)

    monkeypatch.setattr(FakeHook, step, killed_at)
    op = _op(deferrable=True)
    with pytest.raises(Killed):
        op.execute(make_context(store, 2))
    monkeypatch.setattr(FakeHook, step, real)
    op.on_kill()

    assert job["state"] is JobState.CANCELED, f"the earlier try's job runs on after a kill at {step} #{nth}"


def test_a_job_claimed_by_another_try_is_left_to_it(fake_platform: type[FakeHook]) -> None:
    store = Store()
    _defer(_op(deferrable=True), make_context(store, 1))
    (job,) = fake_platform.jobs.values()
    job["state"] = JobState.RUNNING
    op = _op(deferrable=True)
    with pytest.raises(TaskDeferred):
        op.execute(make_context(store, 2))  # try 2 adopts it ...
    job["marks"][MARK_OWNER] = 3  # ... and try 3 has claimed it since

    op.on_kill()

    assert job["state"] is JobState.RUNNING


def test_a_kill_before_the_retry_finds_a_job_an_earlier_try_never_recorded_cancels_it(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Try 2's worker died between its submission and its record: the record names try 1's ended job; a kill in
    try 3 before its look by name (Docker's pair explorer: ``read_marks_of`` inside ``find_job``) stops try 2's."""
    store = Store()
    _defer(_op(deferrable=True), make_context(store, 1))
    (first,) = fake_platform.jobs.values()
    first["state"] = JobState.ERROR
    unrecorded = FakeHook(conn_id="fake_conn").create_job(
        JobSpec(name=first["handle"].name, job_id="b0b0b0b0b0b0", command="train.sh", image="img:1"), try_number=2
    )
    fake_platform.jobs[unrecorded.job_id]["state"] = JobState.RUNNING
    real = FakeHook.find_job

    def killed(self: FakeHook, name: str) -> Any:
        monkeypatch.setattr(FakeHook, "find_job", real)
        raise Killed("find_job")

    monkeypatch.setattr(FakeHook, "find_job", killed)
    op = _op(deferrable=True)
    with pytest.raises(Killed):
        op.execute(make_context(store, 3))
    op.on_kill()

    assert fake_platform.jobs[unrecorded.job_id]["state"] is JobState.CANCELED
