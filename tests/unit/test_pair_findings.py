"""What the pair explorer (tests/explorer/pairs.py) found, each shown on the in-memory platform; every test here
failed on the code before its fix."""

from __future__ import annotations

import pytest

from airflow_provider_tao.hooks import get_platform_hook
from airflow_provider_tao.jobs import JobState
from tests.unit.fakes import FakeHook, Store
from tests.unit.test_decision_defects import _deferred_job, _fails_once


@pytest.mark.parametrize("method", ["read_marks", "get_job_status"])
def test_a_platform_blip_in_the_workers_on_kill_does_not_leave_the_job_running(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """Marked failed while the worker ran; the kill's fact read meets a blip (an SSH reset, a 5xx): the task is over,
    no try will come back, so on_kill asks again rather than leave the job running (pair: mark_failed x blip)."""
    monkeypatch.setattr("airflow_provider_tao.operators.lifecycle.KILL_PAUSE_SECONDS", 0.0)
    op, handle = _deferred_job(fake_platform, Store())
    op._handle = handle
    _fails_once(monkeypatch, method, ConnectionError("connection reset by peer"))
    op.on_kill()
    assert fake_platform.jobs[handle.job_id]["state"] is JobState.CANCELED


def test_a_platform_blip_finding_an_interrupted_submission_does_not_leave_its_job_running(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Marked failed right after ``create_job`` returned, before the job was recorded: on_kill finds the job by its
    name, and that read meets a blip (pair: mark_failed x blip at ``create_job``)."""
    monkeypatch.setattr("airflow_provider_tao.operators.lifecycle.KILL_PAUSE_SECONDS", 0.0)
    op, handle = _deferred_job(fake_platform, Store())
    op._handle = None
    op._submitting = (get_platform_hook(handle.platform, handle.conn_id), handle.name, handle.job_id)
    _fails_once(monkeypatch, "find_job", ConnectionError("connection reset by peer"))
    op.on_kill()
    assert fake_platform.jobs[handle.job_id]["state"] is JobState.CANCELED
