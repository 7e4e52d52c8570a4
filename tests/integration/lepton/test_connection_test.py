"""The connection form's Test button (``test_connection``) and what ``airflow tao`` asks the platform, against the
fake workspace API driven by the real ``leptonai`` client: success, a refused token (401), a token without access
(403), a workspace that does not exist (404), a URL nobody listens on, a paused and a terminated workspace -- each in
words, no secret in the answer; ``list_active_jobs`` (one labelled job list); and a person's cancel
(``airflow tao cancel`` runs ``cancel_job(requested_by=...)``) failing the waiting task with ``ERR_CANCELED``, with the
marks kept as labels or, where the workspace keeps labels as created, as secrets."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_tao.hooks.lepton import LeptonHook
from airflow_provider_tao.hooks.lepton import marks as lm
from airflow_provider_tao.hooks.lepton import status as ls
from airflow_provider_tao.hooks.ownership import CancelOutcome
from airflow_provider_tao.jobs import JobHandle, JobSpec, JobState
from tests.e2e.airflow_harness import free_ports
from tests.integration.docker.conftest import DockerEngine
from tests.integration.lepton.conftest import CONN_ID, LeptonFake, lepton_connection
from tests.integration.taskrun import Triggerer, finish, make_operator, start

pytestmark = pytest.mark.integration


def _test(monkeypatch: pytest.MonkeyPatch, fake: LeptonFake, **conn: Any) -> tuple[bool, str]:
    base = json.loads(lepton_connection(fake))
    extra = {**base["extra"], **conn.pop("extra", {})}
    monkeypatch.setenv("AIRFLOW_CONN_TAO_LEPTON_TEST", json.dumps({**base, **conn, "extra": extra}))
    return LeptonHook(conn_id="tao_lepton_test").test_connection()


@contextlib.contextmanager
def _settings(fake: LeptonFake, **settings: Any) -> Iterator[None]:
    before = {key: fake.config()["settings"][key] for key in settings}
    fake.config(**settings)
    try:
        yield
    finally:
        fake.config(**before)


def test_success_names_the_workspace(lepton_fake: LeptonFake, monkeypatch: pytest.MonkeyPatch) -> None:
    lepton_fake.stats(reset=True)
    ok, message = _test(monkeypatch, lepton_fake)
    assert (ok, message) == (True, f"Lepton workspace ws-ci (ws-ci) answers at {lepton_fake.workspace_url}")
    assert lepton_fake.stats()["by"] == {"GET /workspace": 1}  # one cheap read


def test_a_refused_token_is_authentication_refused(lepton_fake: LeptonFake, monkeypatch: pytest.MonkeyPatch) -> None:
    ok, message = _test(monkeypatch, lepton_fake, password="expired-token-xyz")
    assert not ok
    assert message.startswith(f"Authentication refused: the Lepton API at {lepton_fake.workspace_url} refused the "
                              "token (401)"), message  # fmt: skip
    assert "expired-token-xyz" not in message


def test_a_token_without_access_is_permission_denied(lepton_fake: LeptonFake, monkeypatch: pytest.MonkeyPatch) -> None:
    with _settings(lepton_fake, auth="forbid"):
        ok, message = _test(monkeypatch, lepton_fake)
    assert not ok and message.startswith("Permission denied: the token may not use workspace 'ws-ci' (403"), message
    assert lepton_fake.token not in message


def test_a_missing_workspace_is_not_found(lepton_fake: LeptonFake, monkeypatch: pytest.MonkeyPatch) -> None:
    url = lepton_fake.workspace_url.replace("/ws-ci", "/ws-typo")
    ok, message = _test(monkeypatch, lepton_fake, extra={"workspace_id": "ws-typo", "workspace_url": url})
    assert (ok, message) == (
        False,
        f"Not found: workspace 'ws-typo' was not found at {url} (404); check workspace_id and workspace_url",
    )


def test_a_url_nobody_listens_on_is_unreachable(lepton_fake: LeptonFake, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{free_ports(1)[0]}/api/v2/workspaces/ws-ci"
    ok, message = _test(monkeypatch, lepton_fake, extra={"workspace_url": url})
    assert (ok, message) == (
        False,
        f"Unreachable: nothing answers at {url} (Connection refused); check workspace_url and the network",
    )


def test_an_incomplete_connection_names_the_missing_setting(
    lepton_fake: LeptonFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("LEPTON_WORKSPACE_ID", "LEPTON_AUTH_TOKEN", "LEPTON_WORKSPACE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    ok, message = _test(monkeypatch, lepton_fake, extra={"workspace_id": ""})
    assert not ok and message.startswith("Incomplete connection: conn_id: connection 'tao_lepton_test' names no Lepton"
                                         " workspace. Set the extra workspace_id"), message  # fmt: skip
    ok, message = _test(monkeypatch, lepton_fake, password="")
    assert not ok and "has no Lepton API token" in message, message


def test_a_paused_workspace_answers_but_says_so_and_a_terminated_one_is_not_found(
    lepton_fake: LeptonFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _settings(lepton_fake, workspace_state="paused"):
        ok, message = _test(monkeypatch, lepton_fake)
    assert ok and message.endswith("(state paused: jobs wait until it is resumed in the Lepton dashboard)"), message
    with _settings(lepton_fake, workspace_state="terminated"):
        ok, message = _test(monkeypatch, lepton_fake)
    assert (ok, message) == (False, "Not found: workspace ws-ci (ws-ci) has been terminated: it runs no jobs")


# --------------------------------------------------------------------------- what airflow tao asks


def test_active_jobs_are_listed_until_canceled(lepton_fake: LeptonFake, docker_engine: DockerEngine) -> None:
    hook = LeptonHook(conn_id=CONN_ID)
    jobs = []
    for _ in range(2):
        job_id = uuid.uuid4().hex[:12]
        spec = JobSpec(
            name=f"reap-{job_id}", job_id=job_id, command="sleep 300", gpu_count=0, image=docker_engine.busybox
        )
        jobs.append(hook.create_job(spec))
    try:
        lepton_fake.stats(reset=True)
        listed = {h.job_id: h for h in hook.list_active_jobs()}
        assert lepton_fake.stats()["by"] == {"GET /jobs": 2}  # one labelled list: a page and the empty one
        for handle in jobs:
            found = listed[handle.job_id]
            assert (found.backend_job_id, found.name, found.results_dir, found.console_url) == (
                handle.backend_job_id,
                handle.name,
                handle.results_dir,
                handle.console_url,
            )
        location = hook.job_location(jobs[0])
        assert location == {
            "Workspace": "ws-ci",
            "Lepton job": jobs[0].backend_job_id,
            "Log": f"lep job log --id {jobs[0].backend_job_id}",
        }
        assert hook.job_url(jobs[0]) == jobs[0].console_url
        assert jobs[0].console_url.endswith(
            f"/workspace/ws-ci/compute/jobs/detail/{jobs[0].backend_job_id}/replicas/list"
        )
        assert hook.cancel_job(jobs[0], requested_by="reap: test") is CancelOutcome.STOPPED
        assert jobs[0].job_id not in {h.job_id for h in hook.list_active_jobs()}
        assert jobs[1].job_id in {h.job_id for h in hook.list_active_jobs()}
    finally:
        for handle in jobs:
            hook.cancel_job(handle)


@pytest.fixture(params=["accept", "ignore"])
def label_mode(request: pytest.FixtureRequest, lepton_fake: LeptonFake) -> Iterator[str]:
    """A workspace that lets a PATCH change labels (the marks are labels), and one that keeps them as created (the
    marks are secrets)."""
    lepton_fake.config(patch_labels=request.param)
    lm._LABELS_PATCHABLE.clear()
    try:
        yield request.param
    finally:
        lepton_fake.config(patch_labels="accept")
        lm._LABELS_PATCHABLE.clear()


def test_a_persons_cancel_fails_the_waiting_task_with_err_canceled_and_says_who(
    lepton_fake: LeptonFake, docker_engine: DockerEngine, triggerer: Triggerer, label_mode: str
) -> None:
    run = start(triggerer, make_operator(CONN_ID, image=docker_engine.busybox, command="sleep 300", gpu_count=0,
                                         retries=2, poll_interval=1))  # fmt: skip
    handle = JobHandle.from_json(run.handle)
    hook = LeptonHook(conn_id=CONN_ID)
    assert hook.cancel_job(handle, requested_by="cli:jdoe") is CancelOutcome.STOPPED  # what `airflow tao cancel` does
    with pytest.raises(AirflowFailException, match=r"ERR_CANCELED \(not retriable\).*canceled by cli-jdoe"):
        finish(run)
    (job,) = [j for j in lepton_fake.jobs() if j["labels"].get(ls.LABEL_JOB_ID) == handle.job_id]
    assert job["deleted"]
    assert hook.get_job_status(handle).state is JobState.CANCELED
    secrets = json.dumps(lepton_fake.secrets())
    if label_mode == "accept":
        assert job["labels"][ls.MARK_LABELS["canceled_by"]] == "cli-jdoe"
    else:  # who canceled it outlives the job until the next submission sweeps it; nothing else of the job is left
        assert f"tao.{handle.job_id}.mark.canceled_by.cli-jdoe" in secrets
    assert f"tao.{handle.job_id}.env." not in secrets and f"tao.{handle.job_id}.files." not in secrets
