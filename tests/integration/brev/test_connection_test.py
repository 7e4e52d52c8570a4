"""The connection form's Test button (``test_connection``) and what ``airflow tao`` asks the platform, against the
fake ``brev`` CLI: success, a refused token, no CLI at ``brev_path``, an org that does not exist, a Brev API that
answers 502 -- each in words, no secret in the answer; ``list_active_jobs`` (one ``brev ls`` and one exec per
running instance) with each job's console page and location; and a person's cancel (``airflow tao cancel`` runs
``cancel_job(requested_by=...)``) failing the waiting task with ``ERR_CANCELED``, its instance deleted by the task."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_tao.hooks.brev import BrevHook
from airflow_provider_tao.hooks.ownership import CancelOutcome
from airflow_provider_tao.jobs import JobHandle, JobSpec
from tests.brevfake.control import BrevWorld
from tests.integration.brev.conftest import CONN_ID, brev_connection
from tests.integration.docker.conftest import DockerEngine
from tests.integration.taskrun import Triggerer, finish, make_operator, start

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_trigger_outlives_its_test")]


def _test(monkeypatch: pytest.MonkeyPatch, world: BrevWorld, **conn: Any) -> tuple[bool, str]:
    base = json.loads(brev_connection(world))
    extra = {**base["extra"], **conn.pop("extra", {})}
    monkeypatch.setenv("AIRFLOW_CONN_TAO_BREV_TEST", json.dumps({**base, **conn, "extra": extra}))
    return BrevHook(conn_id="tao_brev_test").test_connection()


def test_success_counts_the_instances_with_one_ls(brev_world: BrevWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    brev_world.create_instance("box")
    since = time.time()
    ok, message = _test(monkeypatch, brev_world)
    assert (ok, message) == (True, f"brev answers: 1 instance(s) in org {brev_world.org['name']}, 1 running")
    calls = [c["command"] for c in brev_world.calls() if c["start"] >= since]
    assert calls == ["set", "ls"], calls  # the session selects the org once, then one ls


def test_a_refused_token_is_authentication_refused(brev_world: BrevWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    ok, message = _test(monkeypatch, brev_world, password="0123456789abcdef:not-a-device")
    assert not ok
    assert message.startswith("Authentication refused: Brev refused the token"), message
    assert "0123456789abcdef" not in message and "password of the tao_brev connection" in message


def test_no_cli_at_brev_path_is_an_incomplete_connection(
    brev_world: BrevWorld, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere" / "brev"
    ok, message = _test(monkeypatch, brev_world, extra={"brev_path": str(missing)})
    assert (ok, message) == (
        False,
        f"Incomplete connection: cannot run '{missing}': No such file or directory. Install the brev CLI on the "
        "Airflow hosts or set brev_path on the tao_brev connection",
    )


def test_an_org_that_does_not_exist_is_not_found(brev_world: BrevWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    ok, message = _test(monkeypatch, brev_world, extra={"org": "no-such-org"})
    assert not ok
    assert message.startswith("Not found: cannot select org 'no-such-org'"), message
    assert "no orgs exist with name no-such-org" in message and message.endswith("Fix 'org' on the tao_brev connection")


def test_a_brev_api_that_is_down_is_unreachable(brev_world: BrevWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    brev_world.api_errors(50, 502, "Bad Gateway")  # every API call the CLI makes: the gateway has no backend
    ok, message = _test(monkeypatch, brev_world)  # the session's first call selects the org
    assert not ok
    assert message.startswith(f"Unreachable: selecting org '{brev_world.org['name']}' failed: "), message
    assert "502 Bad Gateway" in message and message.endswith("check the network and that the Brev API answers")
    ok, message = _test(monkeypatch, brev_world, extra={"org": ""})  # the account's default org: ls itself
    assert not ok
    assert message.startswith("Unreachable: listing the instances (brev ls --json) failed: "), message
    assert "`" + brev_world.brev + " ls` exited 1" in message and "502 Bad Gateway" in message
    assert brev_world.token not in message


def test_without_a_token_nothing_runs(brev_world: BrevWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BREV_API_TOKEN", raising=False)
    since = time.time()
    ok, message = _test(monkeypatch, brev_world, password="")
    assert (ok, message) == (
        False,
        "Incomplete connection: no Brev API token: put it in the connection's password (or set BREV_API_TOKEN)",
    )
    assert [c for c in brev_world.calls() if c["start"] >= since] == []


# --------------------------------------------------------------------------- what airflow tao asks


def test_active_jobs_are_listed_with_their_console_page_until_canceled(
    brev_world: BrevWorld, docker_engine: DockerEngine
) -> None:
    brev_world.create_instance("box")
    brev_world.create_instance("idle")
    hook = BrevHook(CONN_ID)
    jobs = []
    for _ in range(2):
        job_id = uuid.uuid4().hex[:12]
        spec = JobSpec(name=f"reap-{job_id}", job_id=job_id, command="sleep 300", gpu_count=0,
                       image=docker_engine.busybox, backend_details={"instance_id": "box"})  # fmt: skip
        jobs.append(hook.create_job(spec))
    box = brev_world.instance("box")
    assert jobs[0].console_url == f"https://brev.nvidia.com/environment/{box['id']}"
    assert hook.job_url(jobs[0]) == jobs[0].console_url
    assert hook.job_location(jobs[0]) == {
        "Instance": "box",
        "Container": f"tao-job-{jobs[0].job_id}",
        "Log": f"brev exec box 'docker logs tao-job-{jobs[0].job_id}'",
        "Shell": "brev shell box",
    }

    since = time.time()
    listed = {h.job_id: h for h in BrevHook(CONN_ID).list_active_jobs()}
    calls = [(c["command"], c["targets"]) for c in brev_world.calls() if c["start"] >= since]
    assert sorted(calls) == [("exec", ["box"]), ("exec", ["idle"]), ("ls", [])], calls  # one ls, one exec each
    assert set(listed) == {h.job_id for h in jobs}
    for handle in jobs:
        found = listed[handle.job_id]
        assert (found.name, found.backend_job_id, found.results_dir, found.try_number, found.console_url) == (
            handle.name, "box", handle.results_dir, 1, handle.console_url
        )  # fmt: skip
        assert abs(found.submitted_at - handle.submitted_at) < 60
        assert hook.lease_expired(found) is False  # a reused instance has no lease of ours: [tao] lease_hours (0)

    assert hook.cancel_job(jobs[0], requested_by="reap: test") is CancelOutcome.STOPPED
    assert hook.canceled_by(jobs[0]) == "reap: test"
    assert {h.job_id for h in hook.list_active_jobs()} == {jobs[1].job_id}
    hook.cancel_job(jobs[1])
    assert brev_world.instance("box")["status"] == "RUNNING"  # a reused instance is never deleted


def test_a_persons_cancel_fails_the_waiting_task_with_err_canceled_then_the_task_deletes_its_instance(
    brev_world: BrevWorld, docker_engine: DockerEngine, triggerer: Triggerer
) -> None:
    run = start(triggerer, make_operator(CONN_ID, image=docker_engine.busybox, command="sleep 300", retries=2))
    handle = JobHandle.from_json(run.handle)
    outcome = BrevHook(CONN_ID).cancel_job(handle, requested_by="cli:jdoe")  # what `airflow tao cancel` does
    assert outcome is CancelOutcome.STOPPED
    assert brev_world.instance(handle.name)["status"] == "RUNNING"  # kept until its task has seen the cancel
    with pytest.raises(AirflowFailException, match=r"ERR_CANCELED \(not retriable\).*canceled by cli:jdoe"):
        finish(run)
    deadline = time.monotonic() + 180
    while (
        handle.name in {i["name"] for i in brev_world.instances()}
        and brev_world.instance(handle.name)["status"] != "DELETING"
    ):
        assert time.monotonic() < deadline, "the task's cleanup did not delete its instance"
        time.sleep(0.1)
    assert [c["argv"][2:] for c in brev_world.calls() if c["command"] == "delete"] == [[handle.name]]
