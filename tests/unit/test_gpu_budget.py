"""``max_gpu_hours`` on a single job (issue 33 point 6): bad input refused at parse time, the trigger wakes when the
job may pass it, and the resumed task reads the job's GPU-hours from its platform's times and decides (one place:
``decide``): past it -> canceled, ``ERR_BUDGET``, never retried; within it -> watched again; unread -> decided later."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.jobs import ErrClass, JobState
from airflow_provider_tao.operators.decisions import UNKNOWN, Act, Facts, Situation, decide
from airflow_provider_tao.records import STATE_KEY
from airflow_provider_tao.triggers.job import TAOJobTrigger
from tests.unit.fakes import FakeHook, Store, make_context
from tests.unit.test_operator_submit import _event, _op
from tests.unit.test_trigger_job import _first_event, _submit, _trigger


@pytest.mark.parametrize("bad", [0, -1, "2", True, math.nan, math.inf, [1]])
def test_a_bad_budget_is_refused_at_parse_time_naming_the_parameter(bad: Any) -> None:
    with pytest.raises(JobValidationError) as exc:
        _op(max_gpu_hours=bad)
    assert exc.value.parameter == "max_gpu_hours" and "None for no budget" in str(exc.value)


def test_a_budget_needs_a_known_gpu_count() -> None:
    with pytest.raises(JobValidationError, match="max_gpu_hours: gpu_count=-1"):
        _op(max_gpu_hours=1, gpu_count=-1)


def _deferred(fake: type[FakeHook], store: Store, **kwargs: Any) -> tuple[TAOJobTrigger, dict[str, Any]]:
    op = _op(deferrable=True, gpu_count=2, max_gpu_hours=1, **kwargs)
    with pytest.raises(TaskDeferred) as exc:
        op.execute(make_context(store))
    (job,) = fake.jobs.values()
    assert isinstance(exc.value.trigger, TAOJobTrigger)
    return exc.value.trigger, job


def test_the_trigger_wakes_when_the_job_may_pass_its_budget(fake_platform: type[FakeHook]) -> None:
    before = time.time()
    trigger, _ = _deferred(fake_platform, Store())
    assert trigger.budget_at is not None  # 1 GPU-hour on 2 GPUs: half an hour of running at the earliest
    assert before + 1800 <= trigger.budget_at <= time.time() + 1800
    assert trigger.serialize()[1]["budget_at"] == trigger.budget_at
    assert _deferred_without_budget(fake_platform).budget_at is None


def _deferred_without_budget(fake: type[FakeHook]) -> TAOJobTrigger:
    fake.jobs.clear()
    with pytest.raises(TaskDeferred) as exc:
        _op(deferrable=True, gpu_count=2).execute(make_context(Store()))
    assert isinstance(exc.value.trigger, TAOJobTrigger)
    return exc.value.trigger


async def test_the_trigger_ends_with_budget_for_a_running_job_past_its_time(fake_platform: type[FakeHook]) -> None:
    handle = _submit(fake_platform)
    fake_platform.jobs[handle.job_id].update(state=JobState.RUNNING)
    payload = await _first_event(_trigger(handle, budget_at=time.time() - 1))
    assert payload["status"] == "budget"


def test_a_job_past_its_budget_is_canceled_and_fails_for_good(fake_platform: type[FakeHook]) -> None:
    store = Store()
    _, job = _deferred(fake_platform, store)
    job.update(state=JobState.RUNNING, started=time.time() - 3600)  # 2 GPUs x 1 h = 2 GPU-hours > 1
    op = _op(deferrable=True, gpu_count=2, max_gpu_hours=1)
    with pytest.raises(AirflowFailException, match=r"passed max_gpu_hours=1.0 \(2\.0\d* GPU-hours used\): ERR_BUDGET"):
        op.execute_complete(make_context(store), _event(job["handle"], fake_platform, "budget"))
    assert job["state"] is JobState.CANCELED
    assert store.get(STATE_KEY)["err_class"] == "ERR_BUDGET"
    assert not ErrClass.ERR_BUDGET.retriable


def test_a_job_that_waited_before_it_ran_is_watched_again(fake_platform: type[FakeHook]) -> None:
    store = Store()
    _, job = _deferred(fake_platform, store)
    job.update(state=JobState.RUNNING, started=time.time() - 600)  # 1/3 GPU-hour used: 2/3 left, 20 min on 2 GPUs
    op = _op(deferrable=True, gpu_count=2, max_gpu_hours=1)
    before = time.time()
    with pytest.raises(TaskDeferred) as exc:
        op.execute_complete(make_context(store), _event(job["handle"], fake_platform, "budget"))
    assert before + 1190 <= exc.value.trigger.budget_at <= time.time() + 1201
    assert job["state"] is JobState.RUNNING and len(fake_platform.jobs) == 1  # the same job, not a new one


def test_an_unread_usage_decides_later_and_stops_nothing(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store()
    _, job = _deferred(fake_platform, store)
    job.update(state=JobState.RUNNING, started=time.time() - 3600)

    def unreadable(self: FakeHook, handle: Any) -> Any:
        raise ConnectionError("the platform did not answer")

    monkeypatch.setattr(FakeHook, "get_job_usage", unreadable)
    op = _op(deferrable=True, gpu_count=2, max_gpu_hours=1)
    with pytest.raises(AirflowException, match="GPU-hours could not be read") as exc:
        op.execute_complete(make_context(store), _event(job["handle"], fake_platform, "budget"))
    assert not isinstance(exc.value, AirflowFailException) and job["state"] is JobState.RUNNING


def test_the_workers_own_wait_keeps_the_budget_too(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    op = _op(deferrable=False, gpu_count=2, max_gpu_hours=1, poll_interval=0.01)
    original = FakeHook.create_job

    def started_an_hour_ago(self: FakeHook, spec: Any, try_number: int = 1) -> Any:
        handle = original(self, spec, try_number=try_number)
        self.jobs[handle.job_id].update(state=JobState.RUNNING, started=time.time() - 3600)
        return handle

    monkeypatch.setattr(FakeHook, "create_job", started_an_hour_ago)
    with pytest.raises(AirflowFailException, match="ERR_BUDGET"):
        op.execute(make_context(Store()))
    (job,) = fake_platform.jobs.values()
    assert job["state"] is JobState.CANCELED


def test_the_verdicts_of_a_budget() -> None:
    running = {"try_number": 2, "state": JobState.RUNNING, "outcome": "budget"}
    passed = decide(Facts(**running, over_budget=True), Situation.RESUME)
    assert (passed.act, passed.err_class, passed.stop) == (Act.FAIL, ErrClass.ERR_BUDGET, True)
    assert decide(Facts(**running, over_budget=False), Situation.RESUME).act is Act.ADOPT
    assert decide(Facts(**running, over_budget=UNKNOWN), Situation.RESUME).act is Act.LATER
    canceled = decide(Facts(**running, over_budget=True, person_cancel="cli:jdoe"), Situation.RESUME)
    assert canceled.err_class is ErrClass.ERR_CANCELED  # a person's cancel still binds first
