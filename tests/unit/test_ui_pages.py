"""The TAO jobs view, the job page and the reaper's rule, on hand-made records: hostile names and log lines stay
text, GPU-hours and the chart add up, and the reaper cancels exactly the jobs nobody wants."""

from __future__ import annotations

import re
from typing import Any

import pytest

from airflow_provider_tao.cli.commands import reap_verdict
from airflow_provider_tao.jobindex import IndexedJob, gpu_hours_by_dag_and_day
from airflow_provider_tao.jobs import JobHandle
from airflow_provider_tao.plugins import pages
from airflow_provider_tao.records import JobRecord
from tests.unit.fakes import FakeHook

DAY = 86400.0
EVIL = '<script>alert("x")</script>'


def _job(
    job_id: str = "a1b2c3d4e5f6",
    *,
    dag_id: str = "train_dag",
    gpus: int = 2,
    nodes: int = 1,
    started: float = 10 * DAY,
    ended: float | None = 10 * DAY + 1800,
    state: str = "Complete",
    ti_state: str | None = "success",
    current: bool = True,
    **record: Any,
) -> IndexedJob:
    handle = JobHandle("local", None, job_id, f"{dag_id}-x", submitted_at=started, results_dir=f"/r/{job_id}")
    rec = JobRecord(handle=handle.to_json(), gpu_count=gpus, num_nodes=nodes, state=state, ended_at=ended, **record)
    return IndexedJob(rec, dag_id, "manual__1", "train", -1, ti_state, 1, None, current)


def test_gpu_hours_per_dag_per_day() -> None:
    jobs = [
        _job("a" * 12, gpus=2, nodes=2),  # 2 x 2 x 0.5 h = 2
        _job("b" * 12, dag_id="eval_dag", gpus=1),  # 0.5
        _job("c" * 12, gpus=4, started=11 * DAY, ended=11 * DAY + 3600),  # next day: 4
        _job("d" * 12, gpus=-1),  # every GPU: unknown, not counted
    ]
    assert gpu_hours_by_dag_and_day(jobs) == {
        "1970-01-11": {"train_dag": 2.0, "eval_dag": 0.5},
        "1970-01-12": {"train_dag": 4.0},
    }
    svg = pages.chart(gpu_hours_by_dag_and_day(jobs))
    assert svg.count("<rect") == 3 and "train_dag: 4.000 GPU-hours" in svg


def test_a_running_job_counts_until_now_and_an_abandoned_one_until_its_task_ended() -> None:
    running = _job(state="Submitted", ended=None, ti_state="deferred")
    assert running.state == "Running" and running.gpu_hours(now=10 * DAY + 3600) == pytest.approx(2.0)
    abandoned = IndexedJob(running.record, "d", "r", "t", -1, "failed", 1, 10 * DAY + 900, True)
    assert abandoned.state == "Unknown" and abandoned.gpu_hours(now=20 * DAY) == pytest.approx(0.5)


def test_no_gpus_no_bars() -> None:
    assert "asked for no GPUs" in pages.chart(gpu_hours_by_dag_and_day([_job(gpus=0)]))


def test_hostile_names_and_log_lines_are_text() -> None:
    job = _job(dag_id=EVIL, err_class=EVIL, outputs={EVIL: f"s3://b/{EVIL}"})
    view = pages.jobs_view(
        [job], base="", filters={"q": EVIL}, dag_ids=[EVIL], platforms=["local"], job_urls={job.job_id: EVIL}
    )
    page = pages.job_page(
        job,
        base="",
        location={"Log file": EVIL},
        job_url=EVIL,
        results_url="",
        log=f"step 1\n{EVIL}\n",
        log_note=EVIL,
        results=[EVIL],
        history=[],
    )
    for html in (view, page):
        assert EVIL not in html
        assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
        # the only script is the provider's own
        assert len(re.findall(r"<script>", html)) == 1


def test_only_web_links_become_links() -> None:
    job = _job()
    for url in ("javascript:alert(1)", "data:text/html,x", "//evil.example/x", "file:///etc/passwd"):
        view = pages.jobs_view([job], base="", filters={}, dag_ids=[], platforms=[], job_urls={job.job_id: url})
        page = pages.job_page(
            job, base="", location={}, job_url=url, results_url=url, log="", log_note="", results=[], history=[]
        )
        assert url not in view and url not in page
    assert pages.safe_url("https://console.example/job/1") == "https://console.example/job/1"


def test_links_to_the_airflow_ui_escape_run_ids() -> None:
    job = IndexedJob(_job().record, "d", "manual__2026-01-01T00:00:00+00:00", "t", 3, "success", 1, None, True)
    assert pages.task_url("", job) == "/dags/d/runs/manual__2026-01-01T00%3A00%3A00%2B00%3A00/tasks/t/mapped/3"


# ----------------------------------------------------------------------------- the reaper's one rule

NOW = 100 * DAY
OLD = NOW - 3600  # an hour old
MIN_AGE = 600.0


def _handle(job_id: str = "a1b2c3d4e5f6", submitted: float = OLD) -> JobHandle:
    return JobHandle("fake", None, job_id, "n", submitted_at=submitted)


@pytest.mark.parametrize(
    ("job", "verdict"),
    [
        (_job(ti_state="deferred", state="Submitted", ended=None), (False, "its task is deferred")),
        (_job(ti_state="up_for_retry", state="Submitted", ended=None), (False, "its task is up_for_retry")),
        (_job(ti_state="failed", state="Submitted", ended=None), (True, "orphan: its task is failed")),
        (_job(ti_state=None, state="Submitted", ended=None), (True, "orphan: its task is gone")),
        (_job(ti_state="success", cancel_on_kill=False), (False, "its task set cancel_on_kill=False")),
        (_job(ti_state="running", current=False), (True, "orphan: a newer job of its task replaced it")),
        (
            _job(ti_state="deferred", state="Submitted", ended=None, deadline=NOW - 2 * MIN_AGE),
            (True, "past its task's deadline"),
        ),
        (None, (False, "not in this Airflow's task records")),
    ],
)
def test_reap_verdicts(job: IndexedJob | None, verdict: tuple[bool, str]) -> None:
    assert reap_verdict(FakeHook(), _handle(), job, NOW, MIN_AGE) == verdict


def test_reap_leaves_young_jobs_and_reaps_any_job_past_its_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    orphan = _job(ti_state="failed", state="Submitted", ended=None)
    assert reap_verdict(FakeHook(), _handle(submitted=NOW - 60), orphan, NOW, MIN_AGE) == (
        False,
        "younger than --min-age-minutes",
    )
    monkeypatch.setenv("AIRFLOW__TAO__LEASE_HOURS", "0.5")
    assert reap_verdict(FakeHook(), _handle(), None, NOW, MIN_AGE) == (True, "lease expired")
    watched = _job(ti_state="deferred", state="Submitted", ended=None)
    assert reap_verdict(FakeHook(), _handle(), watched, NOW, MIN_AGE) == (True, "lease expired")


# ----------------------------------------------------------------------------- secrets


SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def test_the_job_page_hides_the_storage_secrets_a_job_prints(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from airflow_provider_tao.plugins.app import _platform_view

    aws = {
        "conn_type": "aws",
        "login": "AKIAEXAMPLE",
        "password": SECRET_KEY,
        "extra": {"aws_session_token": "tok-123456"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_AWS_TRAIN", json.dumps(aws))
    hook = FakeHook(conn_id="fake_conn")
    handle = hook.create_job(type("S", (), {"job_id": "abcdefabcdef", "name": "n"})())  # type: ignore[arg-type]
    FakeHook.logs[handle.job_id] = f"using {SECRET_KEY}\nsession tok-123456\ndone\n"
    record = JobRecord(handle=handle.to_json(), secret_conn_ids=["aws_train"])
    job = IndexedJob(record, "d", "r", "t", -1, "deferred", 1, None, True)
    _, log, _, _, _, _ = _platform_view(job)
    assert SECRET_KEY not in log and "tok-123456" not in log
    assert log == "using ***\nsession ***\ndone\n"


def test_records_and_xcoms_carry_no_secret_value(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from airflow.sdk.exceptions import TaskDeferred

    from airflow_provider_tao.operators.submit import TAOSubmitOperator
    from tests.unit.fakes import Store, make_context

    class _WithSecrets(TAOSubmitOperator):
        def stage(self, spec: Any, hook: Any) -> Any:  # what storage_conn_id adds: secret environment variables
            from dataclasses import replace

            return replace(spec, secret_env={"AWS_SECRET_ACCESS_KEY": SECRET_KEY}), {"model": "s3://b/m"}

    store = Store()
    context = make_context(store)
    op = _WithSecrets(task_id="t", conn_id="fake_conn", image="i:1", command="x", deferrable=True)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    pushed = [c.kwargs["value"] for c in context["ti"].xcom_push.call_args_list]
    for blob in (store.data, pushed, deferred.value.trigger.serialize()):
        assert SECRET_KEY not in json.dumps(blob, default=str)
    (job,) = fake_platform.jobs.values()
    assert job["spec"].secret_env == {"AWS_SECRET_ACCESS_KEY": SECRET_KEY}  # the job itself got it
