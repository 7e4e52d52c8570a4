"""Capacity failover across a chain of connections and the attempts ledger, on the in-memory platform.

Three ``tao_fake`` connections make the chain: ``fake_conn`` -> ``fake_b`` -> ``fake_c``. A job belongs to the
connection it was submitted on (``find_job`` looks there only). What the tests check on the platform they read from
``FakeHook.jobs`` -- never through the operator.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.jobs import JobHandle, JobSpec, JobState
from airflow_provider_tao.operators.failover import CHAIN_KEY, XCOM_ATTEMPTS
from airflow_provider_tao.operators.submit import TAOSubmitOperator
from airflow_provider_tao.records import STATE_KEY
from airflow_provider_tao.triggers.job import TAOJobTrigger
from tests.unit.fakes import FakeHook, Store, make_context


@pytest.fixture
def chain(fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch) -> type[FakeHook]:
    for conn in ("FAKE_B", "FAKE_C"):
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn}", '{"conn_type": "tao_fake"}')
    return fake_platform


def _op(**kwargs: Any) -> TAOSubmitOperator:
    defaults: dict[str, Any] = {
        "task_id": "train",
        "conn_id": "fake_conn",
        "fallback_conn_ids": ["fake_b", "fake_c"],
        "image": "img:1",
        "command": "train.sh",
        "deferrable": True,
    }
    return TAOSubmitOperator(**{**defaults, **kwargs})


def _defer(call: Any, *args: Any, **kwargs: Any) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as exc:
        call(*args, **kwargs)
    return exc.value


def _handle(deferred: TaskDeferred) -> JobHandle:
    assert isinstance(deferred.trigger, TAOJobTrigger)
    return deferred.trigger.handle


def _event(fake: type[FakeHook], handle: JobHandle, outcome: str, message: str = "") -> dict[str, Any]:
    status = FakeHook(conn_id=handle.conn_id).get_job_status(handle)
    return {
        "status": outcome,
        "handle": handle.to_json(),
        "job_status": status.to_json(),
        "log_cursor": "",
        "message": message,
    }


def _jobs_on(fake: type[FakeHook], conn_id: str) -> list[dict[str, Any]]:
    return [j for j in fake.jobs.values() if j["handle"].conn_id == conn_id]


def _fail(fake: type[FakeHook], handle: JobHandle, raw: str = "", exit_code: int | None = None) -> None:
    job = fake.jobs[handle.job_id]
    # It ends the moment it started: no wall-clock milliseconds leak into the GPU-hours the tests compare.
    job.update(state=JobState.ERROR, raw=raw, exit=exit_code, ended=job.get("started"))


def _complete(fake: type[FakeHook], handle: JobHandle, run_seconds: float = 36.0) -> None:
    job = fake.jobs[handle.job_id]
    job.update(state=JobState.COMPLETE, exit=0, started=1000.0, ended=1000.0 + run_seconds, gpus=2)


# --------------------------------------------------------------------------- parse-time checks


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"fallback_conn_ids": "fake_b"}, "fallback_conn_ids"),
        ({"fallback_conn_ids": ["fake_b", ""]}, "fallback_conn_ids"),
        ({"fallback_conn_ids": ["fake_b", "fake_conn"]}, "fallback_conn_ids"),
        ({"fallback_conn_ids": [], "capacity_timeout": 60}, "capacity_timeout"),
        ({"capacity_timeout": 0}, "capacity_timeout"),
    ],
)
def test_bad_chain_arguments_fail_at_parse_time(kwargs: dict[str, Any], parameter: str) -> None:
    with pytest.raises(JobValidationError) as exc:
        _op(**kwargs)
    assert exc.value.parameter == parameter


def test_capacity_timeout_takes_seconds_or_a_timedelta() -> None:
    assert _op(capacity_timeout=timedelta(minutes=2)).capacity_timeout == 120.0
    assert _op(capacity_timeout=90).capacity_timeout == 90.0


# --------------------------------------------------------------------------- validation of the whole chain


def test_a_missing_fallback_connection_fails_before_anything_is_submitted(chain: type[FakeHook]) -> None:
    with pytest.raises(AirflowFailException, match=r"fallback_conn_ids\[1\].*no Airflow connection 'nowhere'"):
        _op(fallback_conn_ids=["fake_b", "nowhere"]).execute(make_context(Store()))
    assert chain.jobs == {}


def test_a_fallback_platform_that_cannot_run_the_job_fails_it_at_once_naming_the_connection(
    chain: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_DOCKER_X", '{"conn_type": "tao_docker", "host": "tcp://127.0.0.1:9"}')
    with pytest.raises(AirflowFailException) as exc:
        _op(fallback_conn_ids=["docker_x"], num_nodes=2).execute(make_context(Store()))
    assert "num_nodes" in str(exc.value) and "'docker_x' (fallback_conn_ids[0], docker)" in str(exc.value)
    assert chain.jobs == {}


def test_an_input_one_platform_of_the_chain_cannot_see_fails_the_task_at_once(chain: type[FakeHook]) -> None:
    chain.visible = {"fake_conn": {"/datasets/coco"}, "fake_b": set()}
    op = _op(inputs={"/data": "/datasets/coco"})
    with pytest.raises(AirflowFailException) as exc:
        op.execute(make_context(Store()))
    assert "connection 'fake_b' (fallback_conn_ids[0], fake)" in str(exc.value)
    assert "/datasets/coco does not exist" in str(exc.value)
    assert chain.jobs == {}


def test_backend_details_are_shared_or_keyed_by_connection(chain: type[FakeHook]) -> None:
    chain.no_capacity = {"fake_conn"}
    op = _op(backend_details={"fake_conn": {"size": "big"}, "fake_b": {"size": "small"}})
    _defer(op.execute, make_context(Store()))
    (job,) = chain.jobs.values()
    assert job["handle"].conn_id == "fake_b" and job["spec"].backend_details == {"size": "small"}

    chain.reset()
    _defer(_op(backend_details={"size": "any"}).execute, make_context(Store()))
    (job,) = chain.jobs.values()
    assert job["spec"].backend_details == {"size": "any"}

    chain.reset()
    with pytest.raises(AirflowFailException, match="mixes entries keyed by connection"):
        _op(backend_details={"fake_b": {"size": "small"}, "size": "any"}).execute(make_context(Store()))


# --------------------------------------------------------------------------- failing over


def test_err_capacity_moves_the_job_to_the_next_connection_in_the_same_try(chain: type[FakeHook]) -> None:
    store = Store()
    context = make_context(store)
    first = _handle(_defer(_op().execute, context))
    _fail(chain, first, raw="NoCapacity")  # the platform gave up for lack of capacity

    second = _handle(_defer(_op().execute_complete, context, event=_event(chain, first, "error")))

    assert (first.conn_id, second.conn_id) == ("fake_conn", "fake_b")
    assert second.try_number == 1  # same try: no Airflow retry used
    assert store.data[CHAIN_KEY]["conn_id"] == "fake_b" and store.data[STATE_KEY]["handle"]["job_id"] == second.job_id
    (attempt,) = store.data[CHAIN_KEY]["attempts"]
    assert (attempt["conn_id"], attempt["outcome"]) == ("fake_conn", "capacity") and "ERR_CAPACITY" in attempt["reason"]

    _complete(chain, second)
    result = _op().execute_complete(context, event=_event(chain, second, "complete"))
    assert result["job_id"] == second.job_id
    assert [(a["platform"], a["conn_id"], a["outcome"]) for a in result["attempts"]] == [
        ("fake", "fake_conn", "capacity"),
        ("fake", "fake_b", "complete"),
    ]
    assert result["attempts"][1]["gpu_hours"] == pytest.approx(2 * 36 / 3600)
    assert result["gpu_hours"] == pytest.approx(2 * 36 / 3600)
    pushed = [c.kwargs["value"] for c in context["ti"].xcom_push.call_args_list if c.kwargs["key"] == XCOM_ATTEMPTS]
    assert [len(v) for v in pushed] == [1, 2]  # visible in XCom as each attempt closes


def test_waiting_for_resources_past_capacity_timeout_cancels_and_moves_on(chain: type[FakeHook]) -> None:
    chain.queueing = {"fake_conn"}
    context = make_context(Store())
    deferred = _defer(_op(capacity_timeout=30).execute, context)
    first = _handle(deferred)
    assert deferred.trigger.serialize()[1]["capacity_timeout"] == 30.0

    event = _event(chain, first, "capacity", "waited 31 s for resources (capacity_timeout 30 s)")
    second = _handle(_defer(_op(capacity_timeout=30).execute_complete, context, event=event))

    assert chain.jobs[first.job_id]["state"] is JobState.CANCELED  # through the one cancel routine
    assert chain.jobs[first.job_id]["marks"]["cancel_requested_by"] == 1
    assert second.conn_id == "fake_b"


def test_a_job_that_got_its_resources_after_the_verdict_is_kept(chain: type[FakeHook]) -> None:
    chain.queueing = {"fake_conn"}
    context = make_context(Store())
    first = _handle(_defer(_op(capacity_timeout=30).execute, context))
    event = _event(chain, first, "capacity", "waited 31 s for resources")
    chain.jobs[first.job_id].update(state=JobState.RUNNING)  # scheduled just after the trigger's verdict
    again = _handle(_defer(_op(capacity_timeout=30).execute_complete, context, event=event))
    assert again.job_id == first.job_id and len(chain.jobs) == 1


def test_the_last_connection_gets_no_capacity_timeout_and_a_capacity_failure_there_is_retriable(
    chain: type[FakeHook],
) -> None:
    chain.no_capacity = {"fake_conn", "fake_b"}
    context = make_context(Store())
    deferred = _defer(_op(capacity_timeout=30).execute, context)
    last = _handle(deferred)
    assert last.conn_id == "fake_c" and deferred.trigger.serialize()[1]["capacity_timeout"] is None

    _fail(chain, last, raw="NoCapacity")
    with pytest.raises(AirflowException, match="ERR_CAPACITY") as exc:
        _op(capacity_timeout=30).execute_complete(context, event=_event(chain, last, "error"))
    assert not isinstance(exc.value, AirflowFailException)
    assert len(chain.jobs) == 1


@pytest.mark.parametrize(("raw", "exit_code", "err_class"), [("", 3, "ERR_PROGRAM"), ("OOMKilled", 137, "ERR_OOM")])
def test_program_errors_and_oom_never_fail_over(
    chain: type[FakeHook], raw: str, exit_code: int, err_class: str
) -> None:
    context = make_context(Store())
    first = _handle(_defer(_op().execute, context))
    _fail(chain, first, raw=raw, exit_code=exit_code)
    with pytest.raises(AirflowFailException, match=err_class):
        _op().execute_complete(context, event=_event(chain, first, "error"))
    assert _jobs_on(chain, "fake_b") == [] and _jobs_on(chain, "fake_c") == []


def test_a_refusal_for_capacity_at_submission_goes_straight_to_the_next_connection(chain: type[FakeHook]) -> None:
    chain.no_capacity = {"fake_conn"}
    store = Store()
    handle = _handle(_defer(_op().execute, make_context(store)))
    assert handle.conn_id == "fake_b" and _jobs_on(chain, "fake_conn") == []
    (refused,) = store.data[CHAIN_KEY]["attempts"]
    assert (refused["conn_id"], refused["outcome"], refused["backend_job_id"]) == ("fake_conn", "capacity", "")
    assert refused["run_seconds"] == 0 and refused["gpu_hours"] == 0


def test_a_job_another_try_owns_is_not_failed_over_from_this_try(chain: type[FakeHook]) -> None:
    chain.queueing = {"fake_conn"}
    context = make_context(Store())
    first = _handle(_defer(_op().execute, context))
    chain.jobs[first.job_id]["marks"]["owner_try"] = 2  # a newer try took it over (a clear)
    with pytest.raises(AirflowException, match="another try owns it"):
        _op().execute_complete(context, event=_event(chain, first, "capacity", "waited"))
    assert _jobs_on(chain, "fake_b") == [] and chain.jobs[first.job_id]["state"] is JobState.PENDING


def test_failing_over_adopts_a_live_job_already_on_the_next_connection(chain: type[FakeHook]) -> None:
    chain.queueing = {"fake_conn"}
    context = make_context(Store())
    first = _handle(_defer(_op().execute, context))
    late = FakeHook(conn_id="fake_b").create_job(JobSpec(name=first.name, job_id="late0000", command="x"))
    second = _handle(_defer(_op().execute_complete, context, event=_event(chain, first, "capacity", "waited")))
    assert second.job_id == late.job_id and len(_jobs_on(chain, "fake_b")) == 1


def test_the_connection_is_written_ahead_before_the_submission(
    chain: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store()
    seen = []
    original = FakeHook.create_job

    def create(self: FakeHook, spec: JobSpec, try_number: int = 1) -> JobHandle:
        seen.append(dict(store.data[CHAIN_KEY]))
        return original(self, spec, try_number)

    monkeypatch.setattr(FakeHook, "create_job", create)
    chain.no_capacity = {"fake_conn"}
    handle = _handle(_defer(_op().execute, make_context(store)))
    assert [(s["conn_id"], s["position"]) for s in seen] == [("fake_conn", 0), ("fake_b", 1)]
    assert seen[1]["job_id"] == handle.job_id


def test_the_worker_wait_fails_over_on_the_same_capacity_clock(chain: type[FakeHook]) -> None:
    chain.queueing = {"fake_conn"}
    op = _op(deferrable=False, capacity_timeout=5, poll_interval=0.01)
    original = FakeHook.create_job

    def create(self: FakeHook, spec: JobSpec, try_number: int = 1) -> JobHandle:
        handle = original(self, spec, try_number)
        if self.conn_id == "fake_conn":  # waiting for resources since long before the bound
            self.jobs[handle.job_id]["capacity_wait_since"] = handle.submitted_at - 60
        else:
            _complete(chain, handle)
        return handle

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FakeHook, "create_job", create)
        result = op.execute(make_context(Store()))
    assert [a["outcome"] for a in result["attempts"]] == ["capacity", "complete"]
    assert "waited 60 s for resources" in result["attempts"][0]["reason"]
    (first,) = _jobs_on(chain, "fake_conn")
    assert first["state"] is JobState.CANCELED


# --------------------------------------------------------------------------- reattach across the chain


def test_a_retry_reattaches_where_the_record_points_and_cancels_strays_elsewhere(chain: type[FakeHook]) -> None:
    store = Store()
    chain.no_capacity = {"fake_conn"}
    moved = _handle(_defer(_op().execute, make_context(store, 1)))
    chain.no_capacity = set()
    stray = FakeHook(conn_id="fake_conn").create_job(JobSpec(name=moved.name, job_id="stray000", command="x"))

    again = _handle(_defer(_op().execute, make_context(store, 2)))

    assert again.job_id == moved.job_id and again.try_number == 2
    assert chain.jobs[stray.job_id]["state"] is JobState.CANCELED
    assert len(chain.jobs) == 2  # nothing new submitted


def test_a_retry_after_a_crash_between_write_ahead_and_store_finds_the_job_by_name(chain: type[FakeHook]) -> None:
    store = Store()
    first = _handle(_defer(_op().execute, make_context(store, 1)))
    # try 1 failed over: wrote fake_b ahead, submitted there, and died before storing the new handle
    store.data[CHAIN_KEY] = {**store.data[CHAIN_KEY], "conn_id": "fake_b", "position": 1}
    chain.jobs[first.job_id]["state"] = JobState.CANCELED
    moved = FakeHook(conn_id="fake_b").create_job(JobSpec(name=first.name, job_id="moved000", command="x"))

    again = _handle(_defer(_op().execute, make_context(store, 2)))
    assert again.job_id == moved.job_id and len(chain.jobs) == 2


def test_with_nothing_recorded_the_first_live_job_of_the_chain_is_taken(chain: type[FakeHook]) -> None:
    op = _op()
    name = op._job_name(make_context(Store()), op._hook())
    live = FakeHook(conn_id="fake_c").create_job(JobSpec(name=name, job_id="live0000", command="x"))
    again = _handle(_defer(op.execute, make_context(Store(), 2)))
    assert again.job_id == live.job_id and len(chain.jobs) == 1


def test_a_new_submission_starts_again_at_the_head_of_the_chain(chain: type[FakeHook]) -> None:
    store = Store()
    chain.no_capacity = {"fake_conn"}
    first = _handle(_defer(_op().execute, make_context(store, 1)))
    _fail(chain, first, exit_code=-9, raw="NODE_FAIL")  # infrastructure: retriable, not a capacity move
    with pytest.raises(AirflowException, match="ERR_INFRA"):
        _op().execute_complete(make_context(store, 1), event=_event(chain, first, "error"))
    chain.no_capacity = set()
    again = _handle(_defer(_op().execute, make_context(store, 2)))
    assert again.conn_id == "fake_conn"
    assert [a["outcome"] for a in store.data[CHAIN_KEY]["attempts"]] == ["capacity", "error"]  # kept across tries


def test_a_clear_after_success_starts_a_new_list_of_attempts(chain: type[FakeHook]) -> None:
    store = Store()
    context = make_context(store, 1)
    first = _handle(_defer(_op().execute, context))
    _complete(chain, first)
    assert len(_op().execute_complete(context, event=_event(chain, first, "complete"))["attempts"]) == 1
    second = _handle(_defer(_op().execute, make_context(store, 2)))
    assert second.job_id != first.job_id and store.data[CHAIN_KEY]["attempts"] == []


def test_a_job_that_ended_while_no_try_watched_it_is_accounted_by_the_next_try(chain: type[FakeHook]) -> None:
    store = Store()
    first = _handle(_defer(_op().execute, make_context(store, 1)))
    chain.jobs[first.job_id].update(state=JobState.CANCELED, started=1000.0, ended=1030.0, gpus=1)  # killed
    second = _handle(_defer(_op().execute, make_context(store, 2)))
    (closed,) = store.data[CHAIN_KEY]["attempts"]
    assert (closed["job_id"], closed["outcome"], closed["try_number"]) == (first.job_id, "canceled", 2)
    assert "ended while no try watched it" in closed["reason"] and closed["run_seconds"] == 30.0
    assert second.job_id != first.job_id


def test_a_job_canceled_between_the_first_look_and_the_reattach_is_accounted_too(
    chain: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clear while the job waits: the new try's first look sees it pending, the old try's kill cancels it before
    the reattach reads it again, the new try submits another job -- and the first one is still an attempt."""
    store = Store()
    first = _handle(_defer(_op().execute, make_context(store, 1)))
    real = FakeHook.get_job_status

    def canceled_after_the_first_look(self: FakeHook, handle: JobHandle) -> Any:
        status = real(self, handle)
        chain.jobs[first.job_id].update(state=JobState.CANCELED)  # the old try's on_kill, right after it
        return status

    monkeypatch.setattr(FakeHook, "get_job_status", canceled_after_the_first_look)
    second = _handle(_defer(_op().execute, make_context(store, 2)))
    assert second.job_id != first.job_id
    assert [(a["job_id"], a["outcome"]) for a in store.data[CHAIN_KEY]["attempts"]] == [(first.job_id, "canceled")]
