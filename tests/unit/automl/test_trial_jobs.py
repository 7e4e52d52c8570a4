"""A search's trials as jobs of Airflow's job index: ``airflow tao cancel <trial's job id>`` stops that trial alone
(recorded ``canceled``, the search goes on), the sweeper keeps the trials of a live search and reaps those of a search
whose task is gone or over, and a trial stopped by an earlier try's own cancel is run again, never lost."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from airflow_provider_tao import canceling, sweeper
from airflow_provider_tao.automl.trials import STATE_KEY
from airflow_provider_tao.jobindex import search_jobs
from airflow_provider_tao.jobs import JobHandle, JobState
from tests.unit.automl.test_operator_automl import deferral, event_of, make, trial_jobs
from tests.unit.fakes import FakeHook, Store, make_context

KEY = ("dag", "manual__1", "train", -1)  # make_context's task instance
DEFERRED = {"ti_state": "deferred", "ti_try": 1, "ti_end": None}


def started_search(store: Store, **kwargs: Any) -> tuple[dict[str, Any], Any]:
    context = make_context(store)
    return context, deferral(lambda: make(max_trials=4, max_concurrent_trials=2, **kwargs).execute(context))


def test_every_trial_with_a_job_is_a_job_of_the_search_task(fake_platform: type[FakeHook]) -> None:
    store = Store()
    started_search(store, gpu_count=2)
    jobs = search_jobs({KEY: store.data[STATE_KEY]}, {KEY: DEFERRED})
    expected = sorted((n, j["handle"].job_id) for n, j in trial_jobs(fake_platform).items())
    assert sorted((j.trial, j.job_id) for j in jobs) == expected
    assert all(j.current and j.verified and j.state == "Running" and j.record.gpu_count == 2 for j in jobs)
    assert {(j.dag_id, j.run_id, j.task_id, j.map_index) for j in jobs} == {KEY}
    # a trial's job named as another task instance's (a copied or forged state) is refused
    assert search_jobs({("dag", "manual__2", "train", -1): store.data[STATE_KEY]}, {}) == []
    store.data[STATE_KEY]["trials"][0]["state"] = "pruned"
    assert {j.trial: j.record.state for j in search_jobs({KEY: store.data[STATE_KEY]}, {})} == {
        0: "Canceled", 1: "Submitted"
    }  # fmt: skip


def test_a_persons_cancel_of_a_trial_by_its_job_stops_it_alone_and_the_search_goes_on(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store()
    context, deferred = started_search(store)

    def no_task_record(*args: Any) -> None:
        raise AssertionError("a trial's cancel binds no task: the search goes on")

    monkeypatch.setattr(canceling, "record_cancel", no_task_record)
    victim = next(j for j in search_jobs({KEY: store.data[STATE_KEY]}, {KEY: DEFERRED}) if j.trial == 0)
    row = canceling.cancel_as_person(victim, FakeHook(), "cli:jdoe")
    assert row["canceled"] and row["state"] == "Canceled" and "the search goes on" in row["note"]
    search = make(max_trials=4, max_concurrent_trials=2)
    deferred = deferral(lambda: search.execute_complete(context, event_of(deferred)))
    trials = store.data[STATE_KEY]["trials"]
    assert trials[0]["state"] == "canceled" and trials[0]["reason"] == "canceled by cli:jdoe"
    assert trials[0]["attempts"] == 1  # never run again
    assert [t["number"] for t in deferred.trigger.serialize()[1]["trials"]] == [1, 2]  # a new trial took its place
    assert fake_platform.jobs[victim.job_id]["state"] is JobState.CANCELED


@pytest.mark.parametrize(
    ("ti", "reaped", "why"),
    [
        (DEFERRED, False, "its task is deferred"),
        ({"ti_state": "running", "ti_try": 1, "ti_end": None}, False, "its task is running"),
        ({"ti_state": "failed", "ti_try": 1, "ti_end": None}, True, "orphan: its task is failed"),
        (None, True, "orphan: its task is gone"),
    ],
)
def test_the_sweeper_keeps_a_live_searchs_trials_and_reaps_those_of_a_search_gone_or_over(
    fake_platform: type[FakeHook], ti: dict[str, Any] | None, reaped: bool, why: str
) -> None:
    class Listing(FakeHook):
        def list_active_jobs(self) -> list[JobHandle]:
            return [j["handle"] for j in self.jobs.values() if j["state"].is_active]

    store = Store()
    started_search(store)
    known = sweeper.known_jobs(search_jobs({KEY: store.data[STATE_KEY]}, {KEY: ti} if ti else {}))
    rows = sweeper.sweep_connection(
        Listing(conn_id="fake_conn"), known, now=2e9, min_age=0.0, dry_run=False, recheck=lambda job: None
    )
    assert [(r["action"], r["why"]) for r in rows] == [("canceled" if reaped else "kept", why)] * 2
    states = {j["state"] for j in fake_platform.jobs.values()}
    assert states == ({JobState.CANCELED} if reaped else {JobState.RUNNING})


def test_a_trial_stopped_by_an_earlier_trys_own_cancel_runs_again_in_the_next_try(
    fake_platform: type[FakeHook],
) -> None:
    """A cleared task's trigger cancels its trials (its on_kill, for try 1); try 2 adopts them, sees trial 0's job
    canceled by try 1's cleanup -- not by a person -- and runs trial 0 again with its parameters (was: recorded
    ``canceled``, lost)."""
    store = Store()
    started_search(store)
    first = trial_jobs(fake_platform)[0]
    FakeHook().cancel_job(first["handle"])  # try 1's own cancel (its cancel mark), no person
    context = make_context(store, try_number=2)
    deferred = deferral(lambda: make(max_trials=4, max_concurrent_trials=2).execute(context))
    deferral(lambda: make(max_trials=4, max_concurrent_trials=2).execute_complete(context, event_of(deferred)))
    trial = store.data[STATE_KEY]["trials"][0]
    assert trial["state"] == "running" and trial["attempts"] == 2
    rerun = trial_jobs(fake_platform)[0]
    assert rerun is not first and rerun["spec"].env["TAO_TRIAL_PARAMS"] == first["spec"].env["TAO_TRIAL_PARAMS"]


def test_the_triggerer_canceling_the_kill_again_and_again_still_stops_every_trial(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airflow cancels a trigger again at every state sync while its on_kill runs: each trial's cancel runs on as
    a single job's does (TAOJobTrigger.on_kill's shielded cancel) -- was: the first cancel in flight was abandoned
    and no trial was stopped."""
    import asyncio
    import contextlib

    from airflow_provider_tao.triggers.automl import TAOAutoMLTrigger

    async def slow_cancel(self: FakeHook, handle: JobHandle) -> bool:
        await asyncio.sleep(0.3)  # a remote round trip (SLURM: scancel over SSH)
        return self._cancel(handle)

    monkeypatch.setattr(FakeHook, "_acancel", slow_cancel)
    deferred = deferral(lambda: make(max_concurrent_trials=3).execute(make_context(Store())))

    async def kill() -> None:
        killing = asyncio.ensure_future(TAOAutoMLTrigger(**deferred.trigger.serialize()[1]).on_kill())
        for _ in range(3):  # the triggerer's state syncs
            await asyncio.sleep(0.05)
            killing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await killing

    asyncio.run(kill())
    assert [j["state"] for j in fake_platform.jobs.values()] == [JobState.CANCELED] * 3


def test_the_search_trigger_stops_every_trial_as_the_deadline_passes(fake_platform: type[FakeHook]) -> None:
    """As a single job's trigger does: a search task marked failed between the timeout event and its resume has no
    worker to stop its trials."""
    import asyncio
    import time

    from airflow_provider_tao.triggers.automl import TAOAutoMLTrigger

    deferred = deferral(lambda: make(max_concurrent_trials=3).execute(make_context(Store())))
    kwargs = {**deferred.trigger.serialize()[1], "deadline": time.time() + 0.3, "poll_interval": 3600}

    async def first_event() -> dict:
        event = await asyncio.wait_for(TAOAutoMLTrigger(**kwargs).run().__anext__(), 120)
        return event.payload

    assert asyncio.run(first_event())["status"] == "timeout"
    assert [j["state"] for j in fake_platform.jobs.values()] == [JobState.CANCELED] * 3


def test_a_persons_cancel_of_a_trial_while_no_try_waits_binds_the_retry_that_adopts_it(
    fake_platform: type[FakeHook],
) -> None:
    """The search task is up for retry (its worker died) when a person cancels trial 0 by its job: try 2 adopts the
    trials, claims trial 0's job, and records it ``canceled`` by that person -- not run again as if its own cleanup
    had stopped it (the cancel mark names try 1)."""
    store = Store()
    started_search(store)
    victim = next(j for j in search_jobs({KEY: store.data[STATE_KEY]}, {}) if j.trial == 0)
    canceling.cancel_as_person(dataclasses.replace(victim, ti_state="up_for_retry"), FakeHook(), "ui:jdoe")
    context = make_context(store, try_number=2)
    deferred = deferral(lambda: make(max_trials=4, max_concurrent_trials=2).execute(context))
    deferral(lambda: make(max_trials=4, max_concurrent_trials=2).execute_complete(context, event_of(deferred)))
    trial = store.data[STATE_KEY]["trials"][0]
    assert (trial["state"], trial["reason"], trial["attempts"]) == ("canceled", "canceled by ui:jdoe", 1)
    assert len(fake_platform.jobs) == 3  # trial 2 took its place; trial 0 never ran again


def test_a_trial_whose_end_stays_unreadable_fails_the_searchs_try_for_a_retry_that_decides_it(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed read never decides (the trial stays running, the next look decides again) -- but not forever: after
    ``UNDECIDED_LOOKS`` looks in a row the search's try fails for a retry, as a single job's resume does at its
    first, and the retry that can read decides the trial; nothing before is lost."""
    from airflow.sdk.exceptions import AirflowException

    from airflow_provider_tao.automl.study import UNDECIDED_LOOKS

    store = Store()
    context, deferred = started_search(store)
    job = trial_jobs(fake_platform)[0]
    job["state"] = JobState.ERROR
    readable = FakeHook.read_marks

    def unreadable(self: FakeHook, handle: JobHandle) -> dict[str, Any]:
        raise ConnectionError("the platform cannot be reached")

    monkeypatch.setattr(FakeHook, "read_marks", unreadable)
    for _ in range(UNDECIDED_LOOKS - 1):
        deferred = deferral(lambda d=deferred: make(max_trials=4, max_concurrent_trials=2).execute_complete(
            context, event_of(d)))  # fmt: skip
        assert store.data[STATE_KEY]["trials"][0]["state"] == "running"
    with pytest.raises(AirflowException, match=r"Trial 0 .* could not read how"):
        make(max_trials=4, max_concurrent_trials=2).execute_complete(context, event_of(deferred))

    monkeypatch.setattr(FakeHook, "read_marks", readable)
    retry = make_context(store, 2)
    deferred = deferral(lambda: make(max_trials=4, max_concurrent_trials=2).execute(retry))
    deferral(lambda: make(max_trials=4, max_concurrent_trials=2).execute_complete(retry, event_of(deferred)))
    trial = store.data[STATE_KEY]["trials"][0]
    assert trial["state"] != "running" or trial["job_id"] != job["handle"].job_id  # decided: failed or rerun
    assert trial["undecided"] == 0


def test_the_workers_kill_asks_again_for_trials_whose_cancel_could_not_be_decided(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blip in the kill's fact read (the cancel routine reads the job's marks and state) leaves no trial running
    after the task is marked failed: the kill asks again, as a single job's does."""
    from airflow_provider_tao.operators import automl

    monkeypatch.setattr(automl, "KILL_PAUSE_SECONDS", 0.0)
    store = Store()
    search = make(max_trials=4, max_concurrent_trials=2)
    deferral(lambda: search.execute(make_context(store)))
    readable, blips = FakeHook.read_marks, [2]

    def blipping(self: FakeHook, handle: JobHandle) -> dict[str, Any]:
        if blips[0]:
            blips[0] -= 1
            raise ConnectionError("a blip")
        return readable(self, handle)

    monkeypatch.setattr(FakeHook, "read_marks", blipping)
    search.on_kill()

    assert {n: j["state"] for n, j in trial_jobs(fake_platform).items()} == {
        0: JobState.CANCELED, 1: JobState.CANCELED
    }  # fmt: skip
