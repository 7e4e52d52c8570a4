"""The TAO jobs view and the job page on hand-made records: hostile names and log lines stay text, GPU-hours and the
chart add up (the reaper's rule: ``test_sweeper.py``)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from airflow_provider_tao.hooks import PLATFORMS
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


#: A connection of each platform (with a password: it must show nowhere) on which ``job_location`` and ``job_url``
#: need no backend -- they never call one (the job page and the view build them for every row).
PLATFORM_CONNECTIONS: dict[str, dict[str, Any]] = {
    "local": {"conn_type": "tao_local"},
    "slurm": {"conn_type": "tao_slurm", "host": "login1.example.com", "extra": {"results_root": "/lustre/tao"}},
    "docker": {"conn_type": "tao_docker", "host": "tcp://gpu-box.example.com:2376"},
    "kubernetes": {
        "conn_type": "tao_kubernetes",
        "extra": {"dashboard_url": "https://dash.example/#/{namespace}/{name}"},
    },
    "lepton": {"conn_type": "tao_lepton", "extra": {"workspace_id": "ws1"}},
    "brev": {"conn_type": "tao_brev", "extra": {"console_url": "https://brev.example/environment/{id}"}},
}
PASSWORD = "pw-Sup3rSecret-9876"


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_every_platforms_job_location_and_link_stay_text_and_hide_the_password(
    platform: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What each platform says about a job (its location lines, its console link) reaches the job page as text and as
    web links only, whatever the names hold, and carries no secret of the connection."""
    import json

    from airflow_provider_tao.hooks import get_platform_hook

    assert set(PLATFORM_CONNECTIONS) == set(PLATFORMS), "a new platform adds its connection here"
    conn_id = f"ui_{platform}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({**PLATFORM_CONNECTIONS[platform],
                                                                      "password": PASSWORD}))  # fmt: skip
    hook = get_platform_hook(platform, conn_id)
    hook.load_connection()
    for console in ("javascript:alert(1)", ""):
        handle = JobHandle(platform, conn_id, "a1b2c3d4e5f6", EVIL, backend_job_id=EVIL, results_dir=f"/r/{EVIL}",
                           submitted_at=10 * DAY, console_url=console)  # fmt: skip
        location, url = hook.job_location(handle), hook.job_url(handle)
        assert location and all(isinstance(v, str) for v in location.values())
        assert url == "" or url.startswith(("http://", "https://")), url
        job = IndexedJob(JobRecord(handle=handle.to_json(), gpu_count=1), EVIL, "r", "t", -1, "deferred", 1, None, True)
        page = pages.job_page(job, base="", location=location, job_url=url, results_url=hook.results_url(handle),
                              log="", log_note="", results=[], history=[])  # fmt: skip
        assert EVIL not in page
        links = re.findall(r'href="([^"]*)"', page)
        assert links and all(link.startswith(("https://", "http://", "/", "#")) for link in links), links
        assert PASSWORD not in json.dumps(location) + url + page


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


# ----------------------------------------------------------------------------- secrets


SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def test_the_job_page_hides_the_storage_and_platform_secrets_a_job_prints(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from airflow_provider_tao.plugins.app import _platform_view
    from airflow_provider_tao.plugins.permissions import Viewer

    aws = {
        "conn_type": "aws",
        "login": "AKIAEXAMPLE",
        "password": SECRET_KEY,
        "extra": {"aws_session_token": "tok-123456"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_AWS_TRAIN", json.dumps(aws))
    # the platform connection's own secret (an NGC key the job got) is the job's too
    monkeypatch.setenv("AIRFLOW_CONN_FAKE_CONN", json.dumps({"conn_type": "tao_fake", "password": "ngc-key-0123456"}))
    hook = FakeHook(conn_id="fake_conn")
    handle = hook.create_job(type("S", (), {"job_id": "abcdefabcdef", "name": "n"})())  # type: ignore[arg-type]
    FakeHook.logs[handle.job_id] = f"using {SECRET_KEY}\nsession tok-123456\nngc ngc-key-0123456\ndone\n"
    record = JobRecord(handle=handle.to_json(), secret_conn_ids=["aws_train"])
    job = IndexedJob(record, "d", "r", "t", -1, "deferred", 1, None, True)
    view = _platform_view(job, Viewer(dags={"d"}, is_authorized=lambda entity, dag_id: True))
    log = view[1]
    assert SECRET_KEY not in log and "tok-123456" not in log and "ngc-key-0123456" not in log, view
    assert log == "using ***\nsession ***\nngc ***\ndone\n"


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
