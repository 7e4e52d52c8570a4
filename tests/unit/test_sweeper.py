"""The orphan sweeper's rule and its sweep of one connection, on a fake platform and hand-made task records: it
cancels exactly the jobs nobody wants -- through the one cancel routine, once per orphan, each decision logged with
its reason -- and never a job of a live task, of a task that set ``cancel_on_kill=False``, or one no task recorded."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import time
from typing import Any

import pytest

from airflow_provider_tao import sweeper
from airflow_provider_tao.hooks.base import MARK_CANCELED_BY
from airflow_provider_tao.jobindex import IndexedJob
from airflow_provider_tao.jobs import JobHandle, JobSpec, JobState
from airflow_provider_tao.records import JobRecord
from tests.unit.fakes import FakeHook

DAY = 86400.0
NOW = 100 * DAY
OLD = NOW - 3600  # an hour old
MIN_AGE = 600.0


def _handle(job_id: str = "a1b2c3d4e5f6", submitted: float = OLD) -> JobHandle:
    return JobHandle("fake", None, job_id, "n", submitted_at=submitted)


def _job(
    handle: JobHandle | None = None,
    *,
    ti_state: str | None = "failed",
    current: bool = True,
    ti_exists: bool = True,
    **record: Any,
) -> IndexedJob:
    rec = JobRecord(handle=(handle or _handle()).to_json(), **record)
    return IndexedJob(rec, "train_dag", "manual__1", "train", -1, ti_state, 1, None, current, ti_exists)


RULE_CASES = [
    (_job(ti_state="deferred"), (False, "its task is deferred")),
    (_job(ti_state="running"), (False, "its task is running")),
    (_job(ti_state="up_for_retry"), (False, "its task is up_for_retry")),
    (_job(ti_state="queued"), (False, "its task is queued")),
    (_job(ti_state=None), (False, "its task was cleared and waits to be scheduled")),
    (_job(ti_state="failed"), (True, "orphan: its task is failed")),
    (_job(ti_state="success"), (True, "orphan: its task is success")),
    (_job(ti_state=None, ti_exists=False), (True, "orphan: its task is gone")),
    (_job(ti_state="success", cancel_on_kill=False), (False, "its task set cancel_on_kill=False")),
    (_job(ti_state="running", current=False), (True, "orphan: a newer job of its task replaced it")),
    (_job(ti_state="running", current=False, cancel_on_kill=False), (False, "its task set cancel_on_kill=False")),
    (_job(ti_state="deferred", deadline=NOW - 2 * MIN_AGE), (True, "past its task's deadline")),
    (_job(ti_state="deferred", deadline=NOW - MIN_AGE / 2), (False, "its task is deferred")),
    (None, (False, "not in this Airflow's task records")),
    (  # a Brev instance's job container, seen on a Docker daemon that runs the instance too
        _job(JobHandle("brev", "tao_brev", "a1b2c3d4e5f6", "n", submitted_at=OLD), ti_state="failed"),
        (False, "started through the brev connection tao_brev"),
    ),
]


@pytest.mark.parametrize(("job", "verdict"), RULE_CASES)
def test_the_rule(job: IndexedJob | None, verdict: tuple[bool, str]) -> None:
    assert sweeper.verdict(FakeHook(), _handle(), job, NOW, MIN_AGE) == verdict


def test_young_jobs_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    young = _handle(submitted=NOW - 60)
    assert sweeper.verdict(FakeHook(), young, _job(young), NOW, MIN_AGE) == (False, "younger than --min-age-minutes")
    # with no minimum age (the default) a young orphan goes at once: a task marked failed seconds after it deferred
    assert sweeper.verdict(FakeHook(), young, _job(young), NOW, 0.0) == (True, "orphan: its task is failed")


@pytest.mark.parametrize(("job", "verdict"), RULE_CASES)
def test_issue_22_hole_4_a_lease_never_overrides_the_ownership_rules(
    monkeypatch: pytest.MonkeyPatch, job: IndexedJob | None, verdict: tuple[bool, str]
) -> None:
    """With ``[tao] lease_hours`` passed, every job the rule keeps is still kept (another deployment's, one seen
    through another connection, ``cancel_on_kill=False``, a live task's); only an orphan goes, for its lease."""
    monkeypatch.setenv("AIRFLOW__TAO__LEASE_HOURS", "0.5")
    orphan = verdict[0] and verdict[1] != "past its task's deadline"
    assert sweeper.verdict(FakeHook(), _handle(), job, NOW, MIN_AGE) == ((True, "lease expired") if orphan else verdict)


class ListingHook(FakeHook):
    """The fake platform with the one list call the sweeper makes (its running jobs), counted."""

    list_calls = 0
    fail_cancel_of: str | None = None
    cleaned: list[str] = []

    def list_active_jobs(self) -> list[JobHandle]:
        type(self).list_calls += 1
        return [j["handle"] for j in self.jobs.values() if j["state"].is_active]

    def _cancel(self, handle: JobHandle) -> bool:
        if handle.job_id == self.fail_cancel_of:
            raise RuntimeError("the platform said 500")
        return super()._cancel(handle)

    def cleanup_job(self, handle: JobHandle, *, adoptable: bool = False) -> None:
        self.cleaned.append(handle.job_id)


@pytest.fixture
def hook() -> ListingHook:
    FakeHook.reset()
    ListingHook.list_calls, ListingHook.fail_cancel_of, ListingHook.cleaned = 0, None, []
    return ListingHook(conn_id="fake_conn")


def _submit(hook: ListingHook, job_id: str) -> JobHandle:
    spec = JobSpec(name=f"job-{job_id}", job_id=job_id, command="sleep 1", image="x")
    return hook.create_job(spec)  # submitted just now


def test_a_sweep_cancels_the_orphans_once_and_keeps_everything_else(
    hook: ListingHook, caplog: pytest.LogCaptureFixture
) -> None:
    handles = {name: _submit(hook, f"{i:012x}") for i, name in enumerate(("orphan", "live", "keep", "unrecorded"))}
    known = {
        handles["orphan"].job_id: _job(handles["orphan"], ti_state="failed"),  # marked failed before a triggerer ran
        handles["live"].job_id: _job(handles["live"], ti_state="deferred"),
        handles["keep"].job_id: _job(handles["keep"], ti_state="success", cancel_on_kill=False),
    }
    rechecked: list[str] = []

    def recheck(job: IndexedJob) -> str | None:
        rechecked.append(job.job_id)
        return None

    with caplog.at_level(logging.INFO, logger="airflow_provider_tao.sweeper"):
        rows = sweeper.sweep_connection(hook, known, now=time.time(), min_age=0.0, dry_run=False, recheck=recheck)

    assert ListingHook.list_calls == 1  # ONE list call for the connection
    actions = {row["job_id"]: (row["action"], row["why"]) for row in rows}
    assert actions == {
        handles["orphan"].job_id: ("canceled", "orphan: its task is failed"),
        handles["live"].job_id: ("kept", "its task is deferred"),
        handles["keep"].job_id: ("kept", "its task set cancel_on_kill=False"),
        handles["unrecorded"].job_id: ("kept", "not in this Airflow's task records"),
    }
    states = {name: hook.get_job_status(h).state for name, h in handles.items()}
    assert states == {"orphan": JobState.CANCELED, "live": JobState.RUNNING, "keep": JobState.RUNNING,
                      "unrecorded": JobState.RUNNING}  # fmt: skip
    # through the one cancel routine, as the sweeper: the task (if it ever resumed) fails with ERR_CANCELED
    assert hook.read_marks(handles["orphan"])[MARK_CANCELED_BY] == "reap: orphan: its task is failed"
    assert rechecked == [handles["orphan"].job_id] and ListingHook.cleaned == [handles["orphan"].job_id]
    logged = [r.getMessage() for r in caplog.records if r.name == "airflow_provider_tao.sweeper"]
    assert len(logged) == 4
    assert f"canceled: fake job {handles['orphan'].job_id} on fake_conn of train_dag.train -- orphan" in logged[0]
    # a second sweep finds nothing more to do
    again = sweeper.sweep_connection(hook, known, now=time.time(), min_age=0.0, dry_run=False, recheck=recheck)
    assert handles["orphan"].job_id not in {row["job_id"] for row in again}


def test_a_dry_run_cancels_nothing_and_a_task_cleared_meanwhile_keeps_its_job(hook: ListingHook) -> None:
    orphan = _submit(hook, "0000000000aa")
    known = {orphan.job_id: _job(orphan, ti_state="failed")}
    (row,) = sweeper.sweep_connection(hook, known, now=time.time(), min_age=0.0, dry_run=True, recheck=lambda job: None)
    assert (row["action"], row["why"]) == ("would cancel", "orphan: its task is failed")
    assert hook.get_job_status(orphan).state is JobState.RUNNING

    (row,) = sweeper.sweep_connection(
        hook, known, now=time.time(), min_age=0.0, dry_run=False, recheck=lambda job: "its task is queued again"
    )
    assert (row["action"], row["why"]) == ("kept", "its task is queued again")
    assert hook.get_job_status(orphan).state is JobState.RUNNING


def test_a_cancel_the_platform_refuses_does_not_stop_the_sweep(hook: ListingHook) -> None:
    first, second = _submit(hook, "0000000000a1"), _submit(hook, "0000000000a2")
    known = {h.job_id: _job(h, ti_state="failed") for h in (first, second)}
    ListingHook.fail_cancel_of = first.job_id
    rows = sweeper.sweep_connection(hook, known, now=time.time(), min_age=0.0, dry_run=False, recheck=lambda job: None)
    assert {row["job_id"]: row["action"] for row in rows} == {first.job_id: "cancel failed", second.job_id: "canceled"}


def test_a_job_that_ended_between_the_listing_and_the_cancel_is_reported_ended_with_its_verdict(
    hook: ListingHook,
) -> None:
    """The cancel routine tells "stopped" from "had ended": an orphan that completed after the sweep listed it keeps
    its verdict, and its row says so instead of "canceled" (it was never marked, so nothing reads it as canceled)."""
    orphan = _submit(hook, "0000000000b1")
    listed = hook.list_active_jobs()
    FakeHook.jobs[orphan.job_id]["state"] = JobState.COMPLETE  # it ends while the sweep decides
    known = {orphan.job_id: _job(orphan, ti_state="failed")}
    (row,) = sweeper.sweep_connection(
        hook, known, now=time.time(), min_age=0.0, dry_run=False, recheck=lambda job: None, active=listed
    )
    assert (row["action"], row["why"]) == ("ended", "orphan: its task is failed")
    assert hook.get_job_status(orphan).state is JobState.COMPLETE and hook.canceled_by(orphan) is None
    assert ListingHook.cleaned == [orphan.job_id]  # no task resumes to clean up after it


def test_a_job_a_newer_try_claimed_as_the_reaper_canceled_it_is_kept_and_says_why(hook: ListingHook) -> None:
    """The platform found, as it stopped the job, that a clear's new try had claimed it (Kubernetes' patch tests the
    marks it read): the row says the job was kept, and why -- not "canceled", and not the orphan reason."""
    orphan = _submit(hook, "0000000000c1")
    known = {orphan.job_id: _job(orphan, ti_state="failed")}

    def claimed_meanwhile(handle: JobHandle) -> bool:
        return False  # what a platform's stop returns when the job's marks changed under it

    hook._cancel = claimed_meanwhile  # type: ignore[method-assign]
    (row,) = sweeper.sweep_connection(hook, known, now=time.time(), min_age=0.0, dry_run=False, recheck=lambda j: None)
    assert (row["action"], row["why"]) == ("kept", "a newer try of its task claimed it as it was canceled")
    assert ListingHook.cleaned == []  # what the job holds is the new try's


def test_the_maintenance_task_logs_every_decision_and_fails_on_a_connection_it_could_not_sweep(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url = "postgresql://airflow:db-pass-123@db/airflow"
    monkeypatch.setenv("AIRFLOW_CONN_TAO_METADATA_DB", json.dumps({"conn_type": "generic",
                       "extra": {"sql_alchemy_conn": url}}))  # fmt: skip
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "airflow-db-not-allowed:///")  # as in a task
    rows = [
        {"platform": "docker", "conn_id": "d", "job_id": "a" * 12, "name": "n", "dag_id": "x", "task_id": "t",
         "task_state": "failed", "action": "canceled", "why": "orphan: its task is failed"},
        {"platform": "brev", "conn_id": "b", "job_id": None, "name": "i-1", "action": "deleted",
         "why": "lease expired"},
    ]  # fmt: skip
    ran: list[list[str]] = []
    envs: list[dict[str, str]] = []

    def fake_cli(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        ran.append(argv)
        envs.append(kwargs["env"])
        return subprocess.CompletedProcess(argv, 0, "a log line\n" + json.dumps(rows) + "\n", "")

    monkeypatch.setattr(subprocess, "run", fake_cli)
    with caplog.at_level(logging.INFO, logger="airflow_provider_tao.sweeper"):
        assert sweeper.sweep_from_a_task(dry_run=True, min_age_minutes=2) == rows
    assert ran[0][-6:] == ["reap", "-o", "json", "--min-age-minutes", "2", "--dry-run"]
    assert envs[0]["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == url  # the database, never on the command line
    assert not any(url in arg for arg in ran[0])
    logged = [r.getMessage() for r in caplog.records]
    assert logged == [
        "canceled: docker job aaaaaaaaaaaa on d of x.t -- orphan: its task is failed",
        "deleted: brev machine i-1 on b -- lease expired",
    ]

    rows.append({"platform": "slurm", "conn_id": "s", "job_id": None, "action": "error", "why": "ssh: refused"})
    with pytest.raises(RuntimeError, match="slurm connection s: ssh: refused"):
        sweeper.sweep_from_a_task()
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 1, "", "no database"))
    with pytest.raises(RuntimeError, match=r"exit 1.*no database"):
        sweeper.sweep_from_a_task()


def test_the_maintenance_task_says_how_to_give_it_the_database(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_TAO_METADATA_DB", raising=False)
    with pytest.raises(RuntimeError, match=r"connection 'tao_metadata_db', which does not exist.*sql_alchemy_conn"):
        sweeper.sweep_from_a_task()
    monkeypatch.setenv("AIRFLOW_CONN_PG", json.dumps({"conn_type": "postgres", "host": "db", "login": "a",
                       "password": "b", "schema": "airflow"}))  # fmt: skip
    assert sweeper.metadata_db_url("pg").startswith("postgresql://a:b@db")


def test_a_job_on_a_machine_its_lease_reaped_reads_as_that_reaping_not_as_kept(hook: ListingHook) -> None:
    """``airflow tao reap`` reaps machines first (Brev's cost guard): a job the job sweep would keep (its task still
    waits) but whose instance's lease expired was canceled by that reaping, and its row says so -- not "kept" next
    to a machine row that says its jobs were canceled."""
    on_expired, on_kept = (
        dataclasses.replace(_submit(hook, job_id), backend_job_id=machine)
        for job_id, machine in (("0000000000b1", "inst-expired"), ("0000000000b2", "inst-kept"))
    )
    known = {h.job_id: _job(h, ti_state="deferred") for h in (on_expired, on_kept)}
    for dry_run, reaped, acted in ((True, "would cancel jobs", "would cancel"), (False, "jobs canceled", "canceled")):
        machines = [
            {"name": "inst-expired", "kind": "machine", "action": reaped, "why": "lease expired 3 min ago"},
            {"name": "inst-kept", "kind": "machine", "action": "kept", "why": "its task is deferred"},
        ]
        rows = sweeper.sweep_connection(
            hook, known, now=time.time(), min_age=0.0, dry_run=dry_run, recheck=lambda job: None,
            active=[on_expired, on_kept], machines=machines,
        )  # fmt: skip
        assert {row["job_id"]: (row["action"], row["why"]) for row in rows} == {
            on_expired.job_id: (acted, "its machine inst-expired: lease expired 3 min ago"),
            on_kept.job_id: ("kept", "its task is deferred"),
        }
    assert ListingHook.cleaned == []  # the machine's reaping did the cancel; the job sweep cancels nothing more


def test_the_records_tell_the_machine_reaping_what_ran_through_the_connection() -> None:
    """``airflow tao reap`` gives each connection's reaping what the task records say ran through it (the owner of
    a Brev instance that failed, whose lease cannot be read): the newest record naming a platform id wins."""
    brev = JobHandle("brev", "tao_brev", "0000000000c1", "d-t-0123456789", backend_job_id="d-t-0123456789")
    retry = dataclasses.replace(brev, job_id="0000000000c2", try_number=2)
    elsewhere = dataclasses.replace(brev, conn_id="tao_brev_other", backend_job_id="box")
    jobs = [_job(retry, ti_state="failed"), _job(brev, ti_state="failed", current=False), _job(elsewhere)]
    assert sweeper.recorded_jobs(jobs, "brev", "tao_brev") == {
        "d-t-0123456789": {"dag_id": "train_dag", "run_id": "manual__1", "task_id": "train", "map_index": -1,
                           "name": "d-t-0123456789"},
    }  # fmt: skip
    assert sweeper.recorded_jobs(jobs, "docker", "tao_brev") == {}
    # a submission whose worker died before its record was kept is known by its write-ahead, under its job's name
    ti = {"dag_id": "train_dag", "run_id": "manual__2", "task_id": "train", "map_index": -1}
    chain = {"platform": "brev", "conn_id": "tao_brev", "job_name": "d-t-9999999999", "job_id": "0000000000c3"}
    recorded = sweeper.recorded_jobs(jobs, "brev", "tao_brev", [(ti, chain), (ti, {**chain, "conn_id": "other"})])
    assert recorded["d-t-9999999999"] == {**ti, "name": "d-t-9999999999"} and len(recorded) == 2


def test_the_write_aheads_are_read_from_the_task_state_store() -> None:
    """``airflow tao reap`` reads every task instance's chain record (its write-ahead) from the metadata database."""
    from types import SimpleNamespace

    from airflow_provider_tao.jobindex import load_write_aheads

    chain = {"platform": "brev", "conn_id": "tao_brev", "job_name": "d-t-9999999999", "job_id": "0000000000c3"}
    rows = [
        SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=3, value=json.dumps(chain)),
        SimpleNamespace(dag_id="d", run_id="r2", task_id="t", map_index=-1, value=json.dumps({"attempts": []})),
        SimpleNamespace(dag_id="d", run_id="r3", task_id="t", map_index=-1, value="not json"),
    ]
    asked: list[Any] = []

    class Session:
        def scalars(self, statement: Any) -> list[Any]:
            asked.append(statement.compile(compile_kwargs={"literal_binds": True}))
            return rows

    assert load_write_aheads(Session()) == [({"dag_id": "d", "run_id": "r", "task_id": "t", "map_index": 3}, chain)]
    assert "task_state_store.key = 'tao_chain'" in str(asked[0])


def test_the_sweep_runs_outside_task_code_as_a_service_and_a_failed_round_does_not_stop_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 38.7: ``airflow tao reap --every MINUTES`` beside the scheduler: no ``tao_metadata_db`` connection that
    every task could read."""
    from argparse import Namespace

    from airflow_provider_tao.cli import commands
    from airflow_provider_tao.cli.definition import TAO_COMMANDS

    reap = next(c for c in TAO_COMMANDS if c.name == "reap")
    assert "--every" in [flag for arg in reap.args for flag in arg.flags]
    rounds: list[int] = []
    naps: list[float] = []

    def sweep() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 2:
            raise ConnectionError("the database restarts")

    def nap(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:
            raise KeyboardInterrupt  # the service is stopped

    with pytest.raises(KeyboardInterrupt):
        commands.run_every(300, sweep, sleep=nap)
    assert rounds == [0, 1, 2] and naps == [300, 300, 300]  # the failed second round did not end the service

    seen: list[float] = []
    monkeypatch.setattr(commands, "run_every", lambda seconds, sweep: seen.append(seconds))
    commands.reap.__wrapped__.__wrapped__(Namespace(every=5.0, output="json", dry_run=True, min_age_minutes=0.0))
    assert seen == [300.0]
