"""Issue 38 points 1-3 through the plugin's own routes (its FastAPI app, the index and the page functions; the login
and the auth manager's answers given as a :class:`~airflow_provider_tao.plugins.permissions.Viewer`): records whose
every field is hostile never put markup on a page nor make a route fail, and a viewer without ``TASK_LOGS`` /
``XCOM`` on a DAG sees neither the job's log nor what its XCom says. The browser test with such a role:
``tests/e2e/ui/test_permissions_browser.py``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_tao.jobindex import IndexedJob, join_records
from airflow_provider_tao.jobs import JobSpec
from airflow_provider_tao.links import safe_url
from airflow_provider_tao.plugins import app as plugin_app
from airflow_provider_tao.plugins.permissions import HIDDEN, Viewer, viewer
from tests.unit.fakes import FakeHook
from tests.unit.test_trust_records import XSS, A, name_of, raw_record

#: Every tag and attribute the plugin's pages write themselves.
TAGS = {"html", "head", "meta", "title", "style", "body", "script", "h1", "h2", "p", "a", "form", "label", "select",
        "option", "input", "button", "table", "thead", "tbody", "tr", "th", "td", "span", "div", "dl", "dt", "dd",
        "pre", "ul", "li", "svg", "line", "text", "rect", "i", "h3", "polyline", "circle", "code"}  # fmt: skip
LOG_LINE = "step 1 loss 0.5 -- the log of the job"
TI_ROW = {"ti_state": "deferred", "ti_try": 1, "ti_end": None}


class _Markup(HTMLParser):
    """Every tag and attribute of a page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))


def assert_no_markup_passes(page: str) -> None:
    parser = _Markup()
    parser.feed(page)
    assert page.count("<script>") == 1, "the only script is the provider's own"
    for tag, attrs in parser.tags:
        assert tag in TAGS, tag
        for name, value in attrs:
            assert not name.startswith("on"), (tag, name, value)
            if name == "href":
                assert safe_url(value or "") or (value or "").startswith(("#", "?")), value


@pytest.fixture
def serve(fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., TestClient]]:
    """The plugin's app over ``records`` (per task instance: its task_state_store and XCom values), seen by a user
    who may read ``dags`` and is granted ``entities`` (``TASK_LOGS``, ``XCOM``) on them."""
    clients: list[TestClient] = []

    def make(
        records: dict[Any, tuple[Any, Any]], *, entities: set[str], dags: frozenset[str] = frozenset({"dag_a"})
    ) -> TestClient:
        def load(wanted: set[str], rejected: list[dict[str, Any]] | None = None, **_: Any) -> list[IndexedJob]:
            mine = {key: values for key, values in records.items() if key[0] in wanted}
            return join_records(mine, {key: TI_ROW for key in mine}, rejected=rejected)

        monkeypatch.setattr(plugin_app, "_load", load)
        monkeypatch.setattr(plugin_app, "_searches", lambda *_, **__: [])  # AutoML: tests/unit/test_ui_searches.py
        app = plugin_app.create_app()
        app.dependency_overrides[viewer] = lambda: Viewer(set(dags), lambda entity, dag_id: entity in entities)
        client = TestClient(app)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def _running_job_of_a() -> str:
    hook = FakeHook(conn_id="fake_conn")
    handle = hook.create_job(JobSpec(name=name_of(A), job_id="a1b2c3d4e5f6", command="x", image=None))
    FakeHook.logs[handle.job_id] = LOG_LINE + "\n"
    return handle.job_id


# ----------------------------------------------------------------------------- point 3: permissions


def test_dag_read_without_task_logs_or_xcoms_shows_neither_the_log_nor_what_the_xcom_says(
    serve: Callable[..., TestClient],
) -> None:
    job_id = _running_job_of_a()
    record = raw_record(A, job_id, outputs={"model": "s3://bucket/models/a"})
    client = serve({A: (record, record)}, entities=set())
    page = client.get("/jobs/dag_a/manual__1/train")
    assert page.status_code == 200 and job_id in page.text
    assert "needs permission to read the task logs of DAG dag_a" in page.text and LOG_LINE not in page.text
    assert FakeHook.log_reads == []  # the platform was not even asked
    for secret in ("fake_conn", f"b-{job_id}", f"/results/{job_id}", "s3://bucket/models/a"):
        assert secret not in page.text, secret
    (row,) = client.get("/api/jobs").json()["jobs"]
    assert (row["conn_id"], row["backend_job_id"], row["results_dir"]) == (HIDDEN, HIDDEN, HIDDEN)
    assert f"b-{job_id}" not in client.get("/jobs").text and "https://fake/" not in client.get("/jobs").text

    logs_only = serve({A: (record, record)}, entities={"TASK_LOGS"}).get("/jobs/dag_a/manual__1/train").text
    assert LOG_LINE in logs_only and "fake_conn" not in logs_only
    everything = serve({A: (record, record)}, entities={"TASK_LOGS", "XCOM"})
    page_text = everything.get("/jobs/dag_a/manual__1/train").text
    assert LOG_LINE in page_text and "fake_conn" in page_text and "s3://bucket/models/a" in page_text
    assert everything.get("/api/jobs").json()["jobs"][0]["backend_job_id"] == f"b-{job_id}"


def test_a_dag_the_user_may_not_read_is_no_job_at_all(serve: Callable[..., TestClient]) -> None:
    record = raw_record(A, _running_job_of_a())
    client = serve({A: (record, None)}, entities={"TASK_LOGS", "XCOM"}, dags={"dag_b"})
    assert client.get("/jobs/dag_a/manual__1/train").status_code == 404
    assert client.get("/api/jobs").json()["jobs"] == []


def test_the_job_page_asks_the_platform_nothing_about_a_record_only_an_xcom_holds(
    serve: Callable[..., TestClient],
) -> None:
    """Issue 38 point 2b: a forged XCom naming another job (on Kubernetes the log follows the name label)."""
    job_id = _running_job_of_a()
    page = serve({A: (None, raw_record(A, job_id))}, entities={"TASK_LOGS", "XCOM"}).get("/jobs/dag_a/manual__1/train")
    assert page.status_code == 200 and "its platform is not asked about it" in page.text
    assert LOG_LINE not in page.text and FakeHook.log_reads == []


# ----------------------------------------------------------------------------- the property test

MARKUP = st.sampled_from(
    [
        XSS,
        '"><script>alert(1)</script>',
        "javascript:alert(1)",
        "'onmouseover='x",
        "/\\evil.example",
        "java\tscript:alert(1)",
    ]
)
HOSTILE = st.one_of(
    MARKUP,
    st.sampled_from(["1e999", 1e20, -1e20, 2**70, -(2**70), float("nan"), float("inf"), -1, 0, True, None, "", [],
                     {}, {"k": XSS}, [XSS], "Running", "Complete"]),
    st.text(max_size=12),
    st.integers(),
    st.floats(),
)  # fmt: skip
FIELDS = ["num_nodes", "gpu_count", "state", "err_class", "ended_at", "run_seconds", "deadline", "outputs",
          "history", "secret_conn_ids", "consumed", "cancel_on_kill"]  # fmt: skip
HANDLE_FIELDS = ["platform", "conn_id", "job_id", "name", "backend_job_id", "results_dir", "try_number",
                 "submitted_at", "console_url"]  # fmt: skip


@st.composite
def hostile_records(draw: st.DrawFn) -> dict[str, Any]:
    """A record of task instance ``A`` with one to three fields (of the record or of its handle) hostile."""
    record = raw_record(A, "a1b2c3d4e5f6")
    for name in draw(st.lists(st.sampled_from(FIELDS), unique=True, min_size=1, max_size=3)):
        record[name] = draw(HOSTILE)
    for name in draw(st.lists(st.sampled_from(HANDLE_FIELDS), unique=True, max_size=1)):
        record["handle"][name] = draw(HOSTILE)
    if draw(st.booleans()):
        record["history"] = [draw(hostile_records()) if draw(st.booleans()) else draw(HOSTILE)]
    return record


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    record=st.one_of(hostile_records(), hostile_records(), hostile_records(), HOSTILE),
    where=st.sampled_from([0, 1, 2]),
    logs=st.booleans(),
)
def test_hostile_records_never_put_markup_on_a_page_nor_fail_a_route(
    serve: Callable[..., TestClient], record: Any, where: int, logs: bool
) -> None:
    """Every field of a record drawn from hostile values (markup, quotes, ``javascript:``, huge numbers, NaN, wrong
    types), stored in the task_state_store, the XCom or both: the jobs view, the job page and the JSON API answer
    200 (or 404 for a job page whose record was refused), with no markup of the record's on the page."""
    stored, pushed = [(record, None), (None, record), (record, record)][where]
    client = serve({A: (stored, pushed)}, entities={"TASK_LOGS", "XCOM"} if logs else set())
    view = client.get("/jobs", params={"q": XSS, "dag_id": XSS})
    assert view.status_code == 200
    assert_no_markup_passes(view.text)
    api = client.get("/api/jobs")
    assert api.status_code == 200
    json.loads(api.text)  # strict JSON: no NaN, no Infinity
    page = client.get("/jobs/dag_a/manual__1/train")
    assert page.status_code in (200, 404)
    assert_no_markup_passes(page.text)
