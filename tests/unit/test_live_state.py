"""The jobs view tells the truth about running jobs (issue 36 point 4): each job whose record has not seen it end
shows what its platform says now -- one batched status call per connection, kept for an interval, never one per
row --; the job page opens its log at the newest lines and shows a failed job's exit code and failure words."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from airflow_provider_tao.jobindex import IndexedJob
from airflow_provider_tao.jobs import JobHandle, JobState, JobStatus
from airflow_provider_tao.livestate import LiveStates
from airflow_provider_tao.plugins import pages
from airflow_provider_tao.records import SUBMITTED, JobRecord

NOW = 1_800_000_000.0


def _job(job_id: str, conn_id: str | None, *, state: str = SUBMITTED, ti_state: str | None = "failed") -> IndexedJob:
    handle = JobHandle("local", conn_id, job_id, f"n-{job_id}", submitted_at=NOW - 600)
    record = JobRecord(handle=handle.to_json(), gpu_count=1, state=state)
    return IndexedJob(record, "train_dag", "manual__1", "train", -1, ti_state, 1, NOW - 500, True)


class Platforms:
    """The batched reads the view made, and what the platforms answer."""

    def __init__(self, answers: dict[str, JobStatus]) -> None:
        self.answers = answers
        self.calls: list[tuple[tuple[str, str | None], list[str]]] = []
        self.down: set[str | None] = set()

    def ask(self, connection: tuple[str, str | None], handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        self.calls.append((connection, sorted(h.job_id for h in handles)))
        if connection[1] in self.down:
            raise ConnectionError("no route to host")
        return {h.job_id: self.answers[h.job_id] for h in handles if h.job_id in self.answers}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def platforms() -> Platforms:
    running = JobStatus(JobState.RUNNING, "step 87")
    answers = {f"a{i:011d}": running for i in range(5)} | {f"b{i:011d}": running for i in range(3)}
    answers["b00000000002"] = JobStatus(JobState.CANCELED, "canceled by cli:reap")
    return Platforms(answers)


def test_an_orphan_still_running_shows_running_with_a_growing_runtime_and_no_end(platforms: Platforms) -> None:
    orphan = _job("a00000000000", "conn_a")  # its task failed; the job still prints
    assert orphan.state == "Unknown" and orphan.ended_at == NOW - 500  # what the records alone said (the defect)
    (seen,) = LiveStates(ask=platforms.ask).apply([orphan])
    row = seen.row(NOW)
    assert (row["state"], row["ended"], row["state_from"]) == ("Running", None, "platform")
    assert row["runtime_seconds"] == 600.0 and seen.runtime_seconds(NOW + 60) == 660.0  # not frozen
    assert row["message"] == "step 87"


def test_one_batched_call_per_connection_never_one_per_row(platforms: Platforms) -> None:
    jobs = [_job(f"a{i:011d}", "conn_a") for i in range(5)] + [_job(f"b{i:011d}", "conn_b") for i in range(3)]
    jobs.append(_job("c00000000000", "conn_a", state="Complete"))  # its record saw it end: not asked
    seen = LiveStates(ask=platforms.ask).apply(jobs)
    assert sorted(platforms.calls) == [
        (("local", "conn_a"), [f"a{i:011d}" for i in range(5)]),
        (("local", "conn_b"), [f"b{i:011d}" for i in range(3)]),
    ]
    states = {job.job_id: job.state for job in seen}
    assert states["b00000000002"] == "Canceled"  # reaped since: the platform says so, not "Unknown"
    assert states["c00000000000"] == "Complete" and states["a00000000003"] == "Running"


def test_answers_are_kept_for_an_interval(platforms: Platforms) -> None:
    clock = Clock()
    live = LiveStates(ttl=15, ask=platforms.ask, clock=clock)
    jobs = [_job("a00000000000", "conn_a"), _job("b00000000000", "conn_b")]
    for _ in range(10):  # ten people open the view
        live.apply(jobs)
    assert len(platforms.calls) == 2
    clock.now = 16.0
    live.apply(jobs)
    assert len(platforms.calls) == 4  # asked again once per connection
    live.apply([*jobs, _job("a00000000001", "conn_a")])  # a new job on conn_a: that connection is asked again
    assert len(platforms.calls) == 5 and platforms.calls[-1][1] == ["a00000000000", "a00000000001"]


def test_a_platform_that_does_not_answer_leaves_its_jobs_as_the_records_say(platforms: Platforms) -> None:
    platforms.down.add("conn_b")
    seen = LiveStates(ask=platforms.ask).apply([_job("a00000000000", "conn_a"), _job("b00000000000", "conn_b")])
    assert [job.state for job in seen] == ["Running", "Unknown"]
    assert seen[1].live is None


def test_the_job_page_opens_its_log_at_the_end_and_shows_a_failures_exit_code_and_words() -> None:
    failed = _job("a00000000000", "conn_a", state="Error", ti_state="failed")
    html = pages.job_page(
        failed, base="", location={}, job_url="", results_url="", log="step 1\nstep 87\n", log_note="", results=[],
        history=[], now=NOW, failure={"Exit code": "3", "Failure": "CUDA error: an illegal memory access"},
    )  # fmt: skip
    assert "<div class=logbox><pre class=log>step 1\nstep 87\n</pre></div>" in html
    assert "flex-direction: column-reverse" in html  # the box is scrolled to its newest lines, no script needed
    assert "<dt>Exit code</dt><dd>3</dd>" in html and "CUDA error: an illegal memory access" in html
    assert 'http-equiv="refresh"' not in html  # an ended job's page does not reload


def test_failure_facts_come_from_the_platform(fake_platform: Any) -> None:
    from airflow_provider_tao.livestate import failure_facts
    from tests.unit.fakes import FakeHook

    hook = FakeHook(conn_id="fake_conn")
    handle = hook.create_job(type("S", (), {"job_id": "abcdefabcdef", "name": "n"})())  # type: ignore[arg-type]
    FakeHook.jobs[handle.job_id].update(state=JobState.ERROR, exit=3, message="exited with 3")
    job = IndexedJob(JobRecord(handle=handle.to_json(), state="Error"), "d", "r", "t", -1, "failed", 1, None, True)
    facts = failure_facts(job)
    assert facts["Exit code"] == "3" and "exited with 3" in facts["Failure"]


@pytest.mark.parametrize(
    ("ti_state", "ti_exists", "words"),
    [
        ("running", True, "train_dag / train (running)"),
        (None, True, "train_dag / train (no state: cleared, waiting to be scheduled)"),
        (None, False, "train_dag / train (gone: its DAG run was deleted)"),
    ],
)
def test_the_job_page_says_a_cleared_task_waits_and_only_a_deleted_runs_task_is_gone(
    ti_state: str | None, ti_exists: bool, words: str
) -> None:
    job = dataclasses.replace(_job("a00000000000", "conn_a", ti_state=ti_state), ti_exists=ti_exists)
    html = pages.job_page(
        job, base="", location={}, job_url="", results_url="", log="", log_note="", results=[], history=[], now=NOW
    )
    assert words in html
