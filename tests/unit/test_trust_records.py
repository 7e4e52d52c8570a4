"""Issue 38 points 1, 2 and 9: what an XCom writer or a damaged record can do to the plugin's pages, the index and
the sweeper -- nothing. Records are checked field by field, a task's own record wins over its XCom, a record naming
another task instance's job is refused, markup stays text in every cell, links are web links only."""

from __future__ import annotations

import logging
import time
from typing import Any
from unittest import mock

import pytest

from airflow_provider_tao import sweeper
from airflow_provider_tao.jobindex import IndexedJob, join_records
from airflow_provider_tao.jobs import JobHandle, JobSpec
from airflow_provider_tao.links import TAOJobLink, safe_url
from airflow_provider_tao.plugins import pages
from airflow_provider_tao.record_checks import record_problem
from airflow_provider_tao.records import STATES, JobRecord, task_instance_digest
from tests.unit.fakes import FakeHook

DAY = 86400.0
NOW = 100 * DAY
XSS = "<img src=x onerror=alert(document.domain)>"
A = ("dag_a", "manual__1", "train", -1)  # (dag_id, run_id, task_id, map_index)
B = ("dag_b", "manual__1", "train", -1)


def name_of(key: tuple[str, str, str, int]) -> str:
    """The job name the operator gives the task instance ``key``'s jobs."""
    return f"{key[0]}-{key[2]}-{task_instance_digest(key[0], key[2], key[1], key[3])}"


def raw_record(key: tuple[str, str, str, int], job_id: str, *, submitted: float = NOW - 3600, **fields: Any) -> dict:
    handle = JobHandle("fake", "fake_conn", job_id, name_of(key), backend_job_id=f"b-{job_id}",
                       results_dir=f"/results/{job_id}", submitted_at=submitted)  # fmt: skip
    return {**JobRecord(handle=handle.to_json(), gpu_count=1).to_json(), **fields}


# ----------------------------------------------------------------------------- point 1: stored XSS


def test_markup_in_num_nodes_stays_text_in_the_jobs_view() -> None:
    """The reproduction of issue 38 point 1: the one unescaped cell (GPUs x nodes) of ``/tao/jobs``."""
    record = JobRecord(handle=raw_record(A, "a1b2c3d4e5f6")["handle"], gpu_count=-1, num_nodes=XSS)  # type: ignore[arg-type]
    job = IndexedJob(record, *A, "success", 1, None, True)
    view = pages.jobs_view([job], base="", filters={}, dag_ids=[], platforms=[], job_urls={})
    assert XSS not in view and "&lt;img src=x onerror=alert(document.domain)&gt;" in view


# ----------------------------------------------------------------------------- point 2: records checked


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"num_nodes": XSS}, "num_nodes"),
        ({"num_nodes": 0}, "num_nodes"),
        ({"gpu_count": -2}, "gpu_count"),
        ({"gpu_count": True}, "gpu_count"),
        ({"gpu_count": 1.5}, "gpu_count"),
        ({"state": "<b>Running</b>"}, "state"),
        ({"state": ["Running"]}, "state"),  # unhashable: once a TypeError that failed the jobs view
        ({"ended_at": float("nan")}, "ended_at"),
        ({"deadline": float("inf")}, "deadline"),
        ({"run_seconds": -1}, "run_seconds"),
        ({"outputs": {"model": 3}}, "outputs"),
        ({"secret_conn_ids": "aws"}, "secret_conn_ids"),
        ({"cancel_on_kill": "false"}, "cancel_on_kill"),
        ({"history": {"a": 1}}, "history"),
        ({"handle": {"job_id": "x"}}, "handle.platform"),
        ({"handle": "x"}, "handle"),
    ],
)
def test_a_record_with_a_wrong_field_is_refused_naming_the_field(change: dict[str, Any], named: str) -> None:
    data = {**raw_record(A, "a1b2c3d4e5f6"), **change}
    assert (record_problem(data, STATES) or "").startswith(named)
    assert JobRecord.from_json(data) is None


@pytest.mark.parametrize(
    "handle_change",
    [{"submitted_at": 1e20}, {"submitted_at": float("nan")}, {"submitted_at": "yesterday"}, {"job_id": XSS},
     {"platform": "<x>"}, {"try_number": "1"}, {"conn_id": 5}, {"name": ""}],
)  # fmt: skip
def test_a_handle_with_a_wrong_field_is_refused(handle_change: dict[str, Any]) -> None:
    data = raw_record(A, "a1b2c3d4e5f6")
    data["handle"] = {**data["handle"], **handle_change}
    assert (record_problem(data, STATES) or "").startswith(f"handle.{next(iter(handle_change))}")
    assert JobRecord.from_json(data) is None


def test_the_records_the_operator_writes_pass() -> None:
    assert record_problem(raw_record(A, "a1b2c3d4e5f6"), STATES) is None
    assert JobRecord.from_json(raw_record(A, "a1b2c3d4e5f6", state="Complete", ended_at=NOW, run_seconds=60.0))


def test_a_record_dated_1e20_is_ignored_in_words_and_the_view_still_renders(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 38 point 2c: ``submitted_at: 1e20`` made ``/tao/jobs`` answer 500 for every viewer of the DAG."""
    bad = raw_record(A, "a1b2c3d4e5f6")
    bad["handle"]["submitted_at"] = 1e20
    rejected: list[dict[str, Any]] = []
    with caplog.at_level(logging.WARNING, logger="airflow_provider_tao.jobindex"):
        jobs = join_records({A: (None, bad), B: (raw_record(B, "b" * 12), None)}, {}, rejected=rejected)
    assert [job.dag_id for job in jobs] == ["dag_b"]
    problem = "handle.submitted_at is 1e+20, not within 0..2.53402e+11"
    assert rejected == [{"dag_id": "dag_a", "run_id": "manual__1", "task_id": "train", "map_index": -1,
                         "where": "XCom", "problem": problem}]  # fmt: skip
    assert "Ignored the TAO job record in the XCom of dag_a.train" in caplog.text
    view = pages.jobs_view(jobs, base="", filters={}, dag_ids=[], platforms=[], job_urls={}, ignored=len(rejected))
    assert "1 invalid task record(s) ignored" in view


def test_the_tasks_own_record_wins_over_a_forged_xcom(caplog: pytest.LogCaptureFixture) -> None:
    own = raw_record(A, "a" * 12)
    forged = raw_record(A, "b" * 12, submitted=NOW)  # newer: it won before
    with caplog.at_level(logging.WARNING, logger="airflow_provider_tao.jobindex"):
        (job,) = join_records({A: (own, forged)}, {A: {"ti_state": "success", "ti_try": 1, "ti_end": NOW}})
    assert job.job_id == "a" * 12 and job.verified
    assert f"it names job {'b' * 12}, the task's own record {'a' * 12}" in caplog.text


def test_a_record_naming_another_task_instances_job_is_refused() -> None:
    copied = raw_record(B, "b" * 12)  # B's record, stored under A
    rejected: list[dict[str, Any]] = []
    assert join_records({A: (None, copied)}, {}, rejected=rejected) == []
    assert "is not one of this task instance's" in rejected[0]["problem"]
    # an earlier job of another task instance smuggled into the history is dropped too
    own = raw_record(A, "a" * 12, history=[{**copied, "history": []}])
    assert [job.job_id for job in join_records({A: (own, None)}, {})] == ["a" * 12]


def test_a_record_only_an_xcom_holds_is_shown_unverified() -> None:
    (job,) = join_records({A: (None, raw_record(A, "a" * 12))}, {})
    assert not job.verified and job.row(NOW)["verified"] is False


def _running_job_of_b(hook: FakeHook) -> JobHandle:
    spec = JobSpec(name=name_of(B), job_id="b" * 12, command="train", image=None)
    return hook.create_job(spec)


def test_a_forged_xcom_record_never_makes_the_sweeper_cancel_another_dags_job(fake_platform: type[FakeHook]) -> None:
    """Issue 38 point 2a: DAG A's XCom names DAG B's running job (same connection, newer ``submitted_at``); A's task
    succeeded, B's still waits on its job. The sweeper used to cancel B's job as A's orphan."""
    hook = FakeHook(conn_id="fake_conn")
    handle = _running_job_of_b(hook)
    b_own = raw_record(B, handle.job_id, submitted=handle.submitted_at)
    forged = raw_record(A, handle.job_id, submitted=handle.submitted_at + 60)
    for a_store in (None, raw_record(A, "a" * 12)):  # A's store cleared on success, or holding A's own job
        jobs = join_records({A: (a_store, forged), B: (b_own, None)},
                            {A: {"ti_state": "success", "ti_try": 1, "ti_end": NOW},
                             B: {"ti_state": "deferred", "ti_try": 1, "ti_end": None}})  # fmt: skip
        rows = sweeper.sweep_connection(hook, sweeper.known_jobs(jobs), now=time.time(), min_age=0.0, dry_run=False,
                                        recheck=lambda job: None, active=[handle])  # fmt: skip
        assert [(row["dag_id"], row["action"], row["why"]) for row in rows] == [
            ("dag_b", "kept", "its task is deferred")
        ]
    assert hook.get_job_status(handle).state == "Running"


def test_a_record_that_does_not_name_the_listed_job_never_steers_a_cancel(fake_platform: type[FakeHook]) -> None:
    hook = FakeHook(conn_id="fake_conn")
    handle = _running_job_of_b(hook)
    # a record of A (its task failed) that carries B's job id under A's name: not the job the platform lists
    job = IndexedJob(JobRecord.from_json(raw_record(A, handle.job_id)), *A, "failed", 1, None, True)  # type: ignore[arg-type]
    rows = sweeper.sweep_connection(hook, {handle.job_id: job}, now=time.time(), min_age=0.0, dry_run=False,
                                    recheck=lambda job: None, active=[handle])  # fmt: skip
    assert (rows[0]["action"], rows[0]["why"]) == ("kept", "not in this Airflow's task records")
    # nor does a record only an XCom holds tell the machine reaping what ran through the connection
    unverified = IndexedJob(JobRecord.from_json(raw_record(B, handle.job_id)), *B, "success", 1, None, True,  # type: ignore[arg-type]
                            verified=False)  # fmt: skip
    assert sweeper.recorded_jobs([unverified], "fake", "fake_conn") == {}


# ----------------------------------------------------------------------------- point 9: links


@pytest.mark.parametrize(
    "url",
    ["/\\evil.example/x", "\\\\evil.example", "/\t/evil.example", "java\tscript:alert(1)", " javascript:alert(1)",
     "javascript:alert(1)", "JaVaScRiPt:alert(1)", "//evil.example", "data:text/html,x", "https:evil.example",
     "/x\x00y", "/x\ny", "http://a b"],
)  # fmt: skip
def test_safe_url_refuses_what_a_browser_reads_as_another_host_or_a_script(url: str) -> None:
    assert safe_url(url) == ""


@pytest.mark.parametrize("url", ["https://console.example/job/1?a=b#c", "HTTP://x.example/", "/tao/jobs/d/r/t"])
def test_safe_url_keeps_web_links(url: str) -> None:
    assert safe_url(url) == url


def test_the_job_link_never_returns_a_javascript_console_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.types import TaskInstanceKey  # noqa: F401  (the key's type, as Airflow passes it)

    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://airflow.example/")
    xcoms = {"tao_job_id": "j", "tao_console_url": "javascript:alert(document.cookie)"}
    key = mock.Mock(dag_id="d", run_id="r", task_id="t", map_index=-1)
    with mock.patch("airflow.sdk.execution_time.xcom.XCom.get_value", side_effect=lambda key, ti_key: xcoms.get(key)):
        assert TAOJobLink().get_link(mock.Mock(), ti_key=key) == "http://airflow.example/tao/jobs/d/r/t"


# ----------------------------------------------------------------------------- point 2b: results folders


def test_the_job_page_lists_results_only_inside_the_connections_results_root(tmp_path: Any) -> None:
    from types import SimpleNamespace

    from airflow_provider_tao.plugins.results import results_files

    root, outside = tmp_path / "results", tmp_path / "elsewhere"
    (root / "a1b2c3d4e5f6" / "logs").mkdir(parents=True)
    (root / "a1b2c3d4e5f6" / "logs" / "train.log").write_text("x")
    (root / "a1b2c3d4e5f6" / "metrics.json").write_text("{}")
    outside.mkdir()
    (outside / "id_rsa").write_text("x")
    (root / "escape").symlink_to(outside)
    hook = SimpleNamespace(platform="local", results_root=root)
    assert results_files(hook, str(root / "a1b2c3d4e5f6")) == ["logs/train.log", "metrics.json"]
    for forged in ("/", str(root), str(outside), str(root / "escape"), str(root / ".." / "elsewhere"), "relative", ""):
        assert results_files(hook, forged) == [], forged
    # a platform whose results are not on this host lists nothing
    assert results_files(SimpleNamespace(platform="slurm"), str(root / "a1b2c3d4e5f6")) == []
