"""The job page's Cancel button (issue 36 point 4): shown to a user who may edit the DAG and runs ``airflow tao
cancel``'s routine as theirs; a read-only user sees no button and is refused (403) when posting; a POST without the
token of the user's own job page (another site's form) is refused; nothing is canceled on a refusal."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from airflow_provider_tao import canceling
from airflow_provider_tao.jobindex import IndexedJob
from airflow_provider_tao.jobs import JobSpec, JobState
from airflow_provider_tao.plugins import app as plugin_app
from airflow_provider_tao.plugins.permissions import Viewer, viewer
from airflow_provider_tao.records import JobRecord
from tests.unit.fakes import FakeHook

PAGE = "/jobs/train_dag/manual__1/train"


class User:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_id(self) -> str:
        return self.name

    def get_name(self) -> str:
        return self.name


class AuthManager:
    """``editor`` may edit train_dag, ``viewer`` may only read it (what the auth manager's PUT check answers)."""

    def get_authorized_dag_ids(self, *, user: User, method: str) -> set[str]:
        return {"train_dag"} if method == "GET" or user.name == "editor" else set()


@pytest.fixture
def world(fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    hook = FakeHook(conn_id="fake_conn")
    handle = hook.create_job(JobSpec(name="train-x", job_id="abcdefabcdef", command="train"))
    job = IndexedJob(
        JobRecord(handle=handle.to_json()), "train_dag", "manual__1", "train", -1, "deferred", 1, None, True
    )
    kept: list[str] = []
    monkeypatch.setattr(plugin_app, "_load", lambda dags, *args, **kwargs: [job])
    monkeypatch.setattr(canceling, "record_cancel", lambda indexed, by, **_: kept.append(by) or "deferred")
    monkeypatch.setattr("airflow.api_fastapi.app.get_auth_manager", AuthManager)
    monkeypatch.setenv("AIRFLOW__API__SECRET_KEY", "unit-test-secret")
    monkeypatch.setattr(plugin_app.LIVE, "ask", lambda conn, handles: {})  # the records' word is enough here
    app = plugin_app.create_app()
    app.dependency_overrides[viewer] = lambda: Viewer(
        {"train_dag"}, lambda entity, dag_id: True, user=User(as_user["name"])
    )
    as_user = {"name": "viewer"}
    client = TestClient(app)

    def login(name: str) -> TestClient:
        as_user["name"] = name
        return client

    yield login, fake_platform.jobs[handle.job_id], kept


def _token(html: str) -> str:
    found = re.search(r'name="token" value="([0-9a-f]+)"', html)
    assert found, "no Cancel button"
    return found.group(1)


def test_an_editor_cancels_from_the_job_page_as_themselves(world: Any) -> None:
    login, job, kept = world
    page = login("editor").get(PAGE)
    assert page.status_code == 200 and "Cancel this job" in page.text
    done = login("editor").post(f"{PAGE}/cancel", data={"token": _token(page.text)})
    assert done.status_code == 200, done.text
    assert "Canceled by ui:editor" in done.text
    assert job["state"] is JobState.CANCELED and job["marks"]["canceled_by"] == "ui:editor"
    assert kept == ["ui:editor"]  # kept for the task instance first, as `airflow tao cancel` does


def test_a_read_only_user_sees_no_button_and_is_refused(world: Any) -> None:
    login, job, kept = world
    editor_page = login("editor").get(PAGE).text
    page = login("viewer").get(PAGE)
    assert page.status_code == 200 and "Cancel this job" not in page.text
    refused = login("viewer").post(f"{PAGE}/cancel", data={"token": _token(editor_page)})
    assert refused.status_code == 403 and "may not edit DAG train_dag" in refused.text
    assert job["state"] is JobState.RUNNING and kept == []


def test_a_post_without_the_pages_token_is_refused(world: Any) -> None:
    login, job, kept = world
    for data in ({}, {"token": "0" * 64}):
        refused = login("editor").post(f"{PAGE}/cancel", data=data)
        assert refused.status_code == 403 and "did not come from this job" in refused.text
    assert job["state"] is JobState.RUNNING and kept == []
