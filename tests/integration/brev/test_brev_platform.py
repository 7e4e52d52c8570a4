"""The brev platform through the operator and the triggerer loop, against the fake ``brev`` CLI.

Our code reaches Brev only by running the ``brev`` executable (the fake, first on PATH and named by the connection);
every instance is a real container on the test Docker engine, and every job a real container started by the docker
CLI inside it. What ran is asked of the world and the engine themselves (its instance list, its log of every CLI
invocation, the job containers), never of our hook.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_provider_tao.hooks.brev import BrevHook, remote
from airflow_provider_tao.hooks.brev.cli import BrevError
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobState
from airflow_provider_tao.triggers.poller import StatusPoller
from tests.brevfake.control import BrevWorld
from tests.integration.brev.conftest import CONN_ID, brev_connection
from tests.integration.docker.conftest import DockerEngine
from tests.integration.taskrun import (
    TaskRun,
    Triggerer,
    finish,
    kill,
    make_operator,
    start,
    wait_submitted,
    worker_process,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_trigger_outlives_its_test")]

REPO_ROOT = Path(__file__).resolve().parents[3]


def _op(image: str, command: str | list[str], **kwargs: Any) -> Any:
    return make_operator(CONN_ID, image=image, command=command, gpu_count=kwargs.pop("gpu_count", 0), **kwargs)


def _run_id() -> str:
    return f"manual__{uuid.uuid4().hex[:10]}"


def _name(run: TaskRun) -> str:
    return run.trigger.handle.name


def _calls(world: BrevWorld, since: float = 0.0) -> list[dict[str, Any]]:
    return [c for c in world.calls() if c["start"] >= since]


def _sub(call: dict[str, Any]) -> str:
    return str(call.get("command") or call["argv"][1])


def _names(world: BrevWorld) -> set[str]:
    return {i["name"] for i in world.instances()}


def _wait_gone(world: BrevWorld, name: str, timeout: float = 180) -> None:
    """Until the world has no instance ``name`` any more (deleted: DELETING, then gone)."""
    deadline = time.monotonic() + timeout
    while name in _names(world) and world.instance(name)["status"] != "DELETING":
        assert time.monotonic() < deadline, f"instance {name} still {world.instance(name)['status']}"
        time.sleep(0.1)


def _job_containers(world: BrevWorld, job_name: str) -> list[dict[str, Any]]:
    """The job containers of one job name on any instance of the world, as the ENGINE lists them."""
    return [c for c in world.job_containers() if (c.get("Labels") or {}).get("tao.nvidia.com/job-name") == job_name]


def _wait_job_running(world: BrevWorld, job_name: str, timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not (running := [c for c in _job_containers(world, job_name) if c.get("State") == "running"]):
        assert time.monotonic() < deadline, f"no running container of {job_name} after {timeout} s"
        time.sleep(0.1)
    return running[0]


@dataclass(frozen=True)
class Results:
    """A fresh bucket on the moto server and an ``aws`` connection for it, whose secret key the job receives."""

    conn_id: str
    bucket: str
    secret: str
    s3: Any


@pytest.fixture
def results(monkeypatch: pytest.MonkeyPatch, moto_endpoint: str, s3: Any, bucket: str) -> Results:
    """Jobs reach the moto server on this machine's loopback (host network)."""
    secret = f"moto-secret-{uuid.uuid4().hex[:8]}"
    conn = {
        "conn_type": "aws",
        "login": "testing",
        "password": secret,
        "extra": {"endpoint_url": moto_endpoint, "region_name": "us-east-1"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_S3_BREV", json.dumps(conn))
    return Results("s3_brev", bucket, secret, s3)


# --------------------------------------------------------------------------- outcomes


def test_an_ephemeral_instance_runs_the_job_writes_its_outputs_and_is_deleted(
    brev_world: BrevWorld, docker_engine: DockerEngine, triggerer: Triggerer, results: Results, capfd: Any
) -> None:
    op = _op(
        docker_engine.python,
        "mkdir -p /workspace/out && echo model of $TAO_JOB_ID > /workspace/out/model.txt && echo epoch-1 && "
        "echo epoch-2 && nproc >/dev/null",
        outputs=["/workspace/out"],
        storage_conn_id=results.conn_id,
        results_uri=f"s3://{results.bucket}/results",
        backend_details={"network": "host"},
    )
    run = start(triggerer, op)
    name = _name(run)
    instance = brev_world.instance(name)
    assert instance["instance_type"] == "g5.xlarge"  # the first type of the connection's chain
    lease = json.loads((brev_world.home_of(name) / remote.LEASE_FILE).read_text())
    assert lease["instance"] == name and lease["run_id"] == run.context["ti"].run_id
    assert lease["expires_at"] - lease["created_at"] == pytest.approx(8 * 3600)
    result = finish(run)

    assert result["state"] == "Complete" and result["platform"] == "brev" and result["backend_job_id"] == name
    out = result["outputs"]["/workspace/out"]
    key = out.removeprefix(f"s3://{results.bucket}/") + "/model.txt"
    body = results.s3.get_object(Bucket=results.bucket, Key=key)["Body"].read()
    assert body == f"model of {run.job_id}\n".encode()
    logged = capfd.readouterr()
    said = "\n".join(line for line in (logged.out + logged.err).splitlines() if "werkzeug" not in line)
    assert "[job] epoch-1" in said and "[job] epoch-2" in said, said
    _wait_gone(brev_world, name)  # the task's own instance is deleted once the job has ended
    creates = [c for c in brev_world.calls() if _sub(c) == "create"]
    assert len(creates) == 1 and "--type" in creates[0]["argv"] and "g5.xlarge,g5.2xlarge" in creates[0]["argv"]


def test_a_reused_instance_runs_two_jobs_in_a_row_and_is_kept(
    brev_world: BrevWorld, docker_engine: DockerEngine, triggerer: Triggerer
) -> None:
    brev_world.create_instance("shared-box")
    first = start(triggerer, _op(docker_engine.busybox, "echo first", backend_details={"instance_id": "shared-box"}))
    assert finish(first)["backend_job_id"] == "shared-box"
    second = start(
        triggerer,
        _op(docker_engine.busybox, "echo second", task_id="evaluate", backend_details={"instance_id": "shared-box"}),
    )
    assert finish(second)["state"] == "Complete"

    assert brev_world.instance("shared-box")["status"] == "RUNNING"  # never deleted: it is not the task's own
    jobs = {c["Labels"]["tao.nvidia.com/job-id"] for c in brev_world.job_containers("shared-box")}
    assert jobs == {first.job_id, second.job_id}  # kept (their logs stay readable), one each
    assert not any(_sub(c) in ("create", "delete") for c in brev_world.calls())


def test_a_failing_command_is_err_program_with_its_exit_code_and_one_container(
    brev_world: BrevWorld, docker_engine: DockerEngine, triggerer: Triggerer
) -> None:
    brev_world.create_instance("box")
    run = start(
        triggerer, _op(docker_engine.busybox, "echo about to fail; exit 3", backend_details={"instance_id": "box"})
    )
    with pytest.raises(AirflowFailException, match=r"ERR_PROGRAM .*exited with code 3"):
        finish(run)
    (container,) = _job_containers(brev_world, _name(run))
    started = brev_world.engine().inspect(container["Id"])["State"]

    # What `brev exec` does when a connection drops: run the launch again. It starts nothing new.
    hook = BrevHook(CONN_ID)
    call = remote.launch(run.job_id)
    answer = call.answer(hook.session.exec("box", call.command, 120))
    assert answer is not None and remote.parse_launch(answer) == (container["Id"], "exited")
    (again,) = _job_containers(brev_world, _name(run))
    state = brev_world.engine().inspect(again["Id"])["State"]
    assert state["ExitCode"] == 3 and state["StartedAt"] == started["StartedAt"]  # not restarted either


def test_an_image_that_cannot_be_pulled_is_err_image_pull_and_the_instance_is_deleted(
    brev_world: BrevWorld, triggerer: Triggerer
) -> None:
    op = _op("local/does-not-exist:1", "echo never")
    with pytest.raises(AirflowFailException, match="ERR_IMAGE_PULL") as refused:
        start(triggerer, op)
    assert "does-not-exist" in str(refused.value)
    (created,) = [c for c in brev_world.calls() if _sub(c) == "create"]
    name = created["argv"][2]
    _wait_gone(brev_world, name)  # nothing is left behind


# --------------------------------------------------------------------------- races, outages, auth, capacity


def _when_created(world: BrevWorld, act: Any) -> threading.Thread:
    """A thread that calls ``act(name)`` as soon as the world has its first instance."""

    def watch() -> None:
        deadline = time.monotonic() + 60
        while not world.instances() and time.monotonic() < deadline:
            time.sleep(0.02)
        act(world.instances()[0]["name"])

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


def test_an_instance_that_fails_after_create_said_yes_is_err_infra_and_deleted(
    brev_world: BrevWorld, docker_engine: DockerEngine, triggerer: Triggerer
) -> None:
    brev_world.set_time_scale(0.02, deploy=150)
    failing = _when_created(brev_world, lambda name: brev_world.set_status(name, "FAILURE", "out of host capacity"))
    with pytest.raises(AirflowException, match="ERR_INFRA") as failed:
        start(triggerer, _op(docker_engine.busybox, "echo never"))
    failing.join()
    assert not isinstance(failed.value, AirflowFailException)  # retriable: the next try gets a new instance
    (created,) = [c for c in brev_world.calls() if _sub(c) == "create"]
    assert created["exit"] == 0  # create exits 0 whatever becomes of the instance
    _wait_gone(brev_world, created["argv"][2])


def test_an_instance_failing_under_a_running_job_is_retriable_infrastructure_and_a_stopped_one_pauses(
    brev_world: BrevWorld, docker_engine: DockerEngine, triggerer: Triggerer
) -> None:
    brev_world.create_instance("box")
    hook = BrevHook(CONN_ID)
    paused = start(triggerer, _op(docker_engine.busybox, "sleep 300", backend_details={"instance_id": "box"}))
    _wait_job_running(brev_world, _name(paused))
    brev_world.set_status("box", "STOPPED")
    assert hook.get_job_status(JobHandle.from_json(paused.handle)).state is JobState.PAUSED
    assert not paused.future.done()
    kill(paused)  # the cancel execs nothing on a stopped instance: that would start it
    assert brev_world.instance("box")["status"] == "STOPPED"

    run = start(triggerer, _op(docker_engine.busybox, "sleep 300"))
    _wait_job_running(brev_world, _name(run))
    brev_world.set_status(_name(run), "FAILURE", "host lost")
    with pytest.raises(AirflowException, match="ERR_INFRA") as failed:
        finish(run, timeout=60)
    assert not isinstance(failed.value, AirflowFailException)
    _wait_gone(brev_world, _name(run))  # the failed instance is the task's own: deleted by the cleanup


def test_an_instance_that_answers_exec_only_after_some_tries_is_waited_for(
    brev_world: BrevWorld, docker_engine: DockerEngine, triggerer: Triggerer
) -> None:
    brev_world.set_time_scale(0.02, deploy=150)  # 3 s of DEPLOYING: time to make its sshd slow
    planted: list[str] = []

    def slow_sshd(name: str) -> None:
        brev_world.not_ready(name, 4)
        planted.append(name)

    planter = _when_created(brev_world, slow_sshd)
    run = start(triggerer, _op(docker_engine.busybox, "echo ready"))
    planter.join()
    assert finish(run)["state"] == "Complete" and planted == [_name(run)]
    execs = [c for c in brev_world.calls() if _sub(c) == "exec" and _name(run) in c["argv"]]
    first_ok = next(i for i, c in enumerate(execs) if c["exit"] == 0)
    assert first_ok >= 1 and all(c["exit"] == 1 for c in execs[:first_ok])  # refused, then answered


def test_a_flaky_connection_during_status_probes_fails_no_task(
    brev_world: BrevWorld, docker_engine: DockerEngine, triggerer: Triggerer
) -> None:
    brev_world.create_instance("box")
    run = start(triggerer, _op(docker_engine.busybox, "sleep 6; echo survived", backend_details={"instance_id": "box"}))
    _wait_job_running(brev_world, _name(run))
    since = time.time()
    brev_world.flaky_ssh(6, "box")
    result = finish(run, timeout=120)
    assert result["state"] == "Complete"
    failed = [c for c in _calls(brev_world, since) if _sub(c) == "exec" and c["exit"] == 1]
    assert failed, "no status probe met the flaky connection"
    assert len(_job_containers(brev_world, _name(run))) == 1


def test_an_auth_eof_on_the_first_call_recovers_with_one_re_login(
    brev_world: BrevWorld, docker_engine: DockerEngine, triggerer: Triggerer
) -> None:
    brev_world.create_instance("box")
    assert BrevHook(CONN_ID).test_connection()[0]  # this process has a saved session...
    brev_world.expire_session()  # ...which desynchronises: the next call is logged out
    since = time.time()
    run = start(triggerer, _op(docker_engine.busybox, "echo fine", backend_details={"instance_id": "box"}))
    assert finish(run)["state"] == "Complete"
    calls = _calls(brev_world, since)
    assert calls[0]["exit"] == 1 and calls[1]["argv"] == calls[0]["argv"] and calls[1]["exit"] == 0
    assert [c for c in calls if c["exit"] == 1] == [calls[0]]  # one refusal, one re-login, then all is well
    assert not any(_sub(c) == "login" for c in brev_world.calls())  # the token never went on a command line


def test_a_wrong_token_is_err_auth_before_anything_is_created(
    brev_world: BrevWorld, docker_engine: DockerEngine, triggerer: Triggerer, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = json.loads(brev_connection(brev_world))
    conn["password"] = "0123456789abcdef:not-a-device"
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(conn))
    # the search for an earlier try's job is refused first: never "no job" (issue 21 point 6); the task fails for
    # good (a refused token is not mended by a retry)
    with pytest.raises(AirflowFailException, match="ERR_AUTH") as refused:
        start(triggerer, _op(docker_engine.busybox, "echo never"))
    assert isinstance(refused.value.__cause__, BrevError) and refused.value.__cause__.err_class is ErrClass.ERR_AUTH
    assert "password of the tao_brev connection" in str(refused.value)
    assert brev_world.instances() == [] and not any(_sub(c) == "create" for c in brev_world.calls())


def test_no_capacity_on_any_type_of_the_chain_is_err_capacity_and_leaves_nothing(
    brev_world: BrevWorld, docker_engine: DockerEngine, triggerer: Triggerer
) -> None:
    brev_world.set_capacity("g5.xlarge", 0)
    brev_world.set_capacity("g5.2xlarge", 0)
    with pytest.raises(AirflowException, match="ERR_CAPACITY") as refused:
        start(triggerer, _op(docker_engine.busybox, "echo never"))
    assert not isinstance(refused.value, AirflowFailException)  # capacity is retriable
    assert "g5.xlarge, g5.2xlarge" in str(refused.value)
    assert brev_world.instances() == [] and brev_world.job_containers() == []


def test_unknown_instance_types_are_err_config_unless_another_type_of_the_chain_works(
    brev_world: BrevWorld, docker_engine: DockerEngine, triggerer: Triggerer, capfd: Any
) -> None:
    op = _op(docker_engine.busybox, "echo never", backend_details={"instance_type": "g5.typo,g6.typo"})
    with pytest.raises(AirflowFailException, match=r"ERR_CONFIG.*g5\.typo, g6\.typo"):
        start(triggerer, op)
    assert brev_world.instances() == []
    # the CLI falls back to the next type of the chain: the typo is only worth a warning then
    run = start(
        triggerer, _op(docker_engine.busybox, "echo fine", backend_details={"instance_type": "g5.typo,g6.xlarge"})
    )
    assert brev_world.instance(_name(run))["instance_type"] == "g6.xlarge"
    assert finish(run)["state"] == "Complete"
    logged = capfd.readouterr()
    assert 'instance type "g5.typo" is not a recognized type' in logged.out + logged.err


# --------------------------------------------------------------------------- cancel, durable identity


def test_mark_failed_while_deferred_stops_the_container_and_deletes_the_instance(
    brev_world: BrevWorld, docker_engine: DockerEngine, triggerer: Triggerer
) -> None:
    run = start(triggerer, _op(docker_engine.busybox, "sleep 300"))
    _wait_job_running(brev_world, _name(run))
    since = time.time()
    kill(run)
    _wait_gone(brev_world, _name(run))
    calls = [c for c in _calls(brev_world, since) if _sub(c) in ("exec", "delete")]
    stops = [i for i, c in enumerate(calls) if _sub(c) == "exec" and "docker stop" in c["argv"][-1]]
    deletes = [i for i, c in enumerate(calls) if _sub(c) == "delete" and c["argv"][2:] == [_name(run)]]
    assert stops and deletes and stops[0] < deletes[0]  # the job got its SIGTERM before its instance went
    assert not [c for c in _job_containers(brev_world, _name(run)) if c.get("State") == "running"]


def test_mark_failed_just_after_the_job_ended_still_deletes_the_instance(
    brev_world: BrevWorld, docker_engine: DockerEngine, triggerer: Triggerer
) -> None:
    run = start(triggerer, _op(docker_engine.busybox, "echo quick", poll_interval=30))
    deadline = time.monotonic() + 60
    while not [c for c in _job_containers(brev_world, _name(run)) if c.get("State") == "exited"]:
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.1)
    kill(run)  # nothing left to stop, and the task will not resume to clean up: the kill deletes the instance
    _wait_gone(brev_world, _name(run))


def test_worker_sigkill_right_after_submission_then_the_retry_runs_one_job_on_one_instance(
    brev_world: BrevWorld, docker_engine: DockerEngine, triggerer: Triggerer
) -> None:
    run_id = _run_id()
    worker, name = worker_process(CONN_ID, docker_engine.busybox, run_id, "sleep 5; echo done")
    wait_submitted(worker, "brev")
    worker.send_signal(signal.SIGKILL)  # the store write may not have happened
    worker.wait()

    retry = start(triggerer, _op(docker_engine.busybox, "sleep 5; echo done"), try_number=2, run_id=run_id)
    assert _name(retry) == name
    assert len(_job_containers(brev_world, name)) == 1  # reattached: the first try's container
    result = finish(retry)
    assert result["state"] == "Complete"
    assert [c["argv"][2] for c in brev_world.calls() if _sub(c) == "create"] == [name]  # one instance
    assert len([c for c in brev_world.calls() if _sub(c) == "copy"]) == 1  # one launch


def test_the_reaper_deletes_an_expired_lease_and_keeps_a_running_task_and_a_foreign_instance(
    brev_world: BrevWorld, docker_engine: DockerEngine, triggerer: Triggerer
) -> None:
    brev_world.create_instance("made-by-hand")
    orphan = start(triggerer, _op(docker_engine.busybox, "sleep 300", backend_details={"lease_hours": 0.0005}))
    _wait_job_running(brev_world, _name(orphan))
    orphan.future.cancel()  # Airflow dies mid-run: its trigger stops watching, nobody cancels anything
    alive = start(triggerer, _op(docker_engine.busybox, "sleep 300", task_id="evaluate"))
    time.sleep(2)  # the orphan's lease (1.8 s) runs out

    def state_of(lease: dict[str, Any]) -> str:
        return "failed" if lease["run_id"] == orphan.context["ti"].run_id else "running"  # the orphan's task failed

    dry = {d.instance: d for d in BrevHook(CONN_ID).reap(task_state=state_of, dry_run=True)}
    assert dry[_name(orphan)].action == "would delete" and "lease expired" in dry[_name(orphan)].reason
    assert brev_world.instance(_name(orphan))["status"] == "RUNNING"  # a dry run deletes nothing
    decisions = {d.instance: d for d in BrevHook(CONN_ID).reap(task_state=state_of)}
    assert decisions[_name(orphan)].action == "deleted" and "lease expired" in decisions[_name(orphan)].reason
    assert decisions[_name(alive)].action == "kept" and "is running" in decisions[_name(alive)].reason
    assert (
        decisions["made-by-hand"].action == "kept"
        and "not created by this provider" in decisions["made-by-hand"].reason
    )
    _wait_gone(brev_world, _name(orphan))
    assert brev_world.instance(_name(alive))["status"] == "RUNNING"
    assert brev_world.instance("made-by-hand")["status"] == "RUNNING"
    kill(alive)
    _wait_gone(brev_world, _name(alive))


def test_an_expired_lease_under_a_watching_task_cancels_its_job_and_the_task_deletes_the_instance(
    brev_world: BrevWorld, docker_engine: DockerEngine, triggerer: Triggerer
) -> None:
    """The lease ran out while the task still waits: deleting the instance under it would read as a lost instance
    (ERR_INFRA, retried on a new instance). The reaper cancels the job instead; the task fails with ERR_CANCELED, is
    not retried, and deletes its instance. A zombie task that never resumes loses it at the next reap."""
    run = start(triggerer, _op(docker_engine.busybox, "sleep 300", backend_details={"lease_hours": 0.0005}, retries=2))
    zombie = start(triggerer, _op(docker_engine.busybox, "sleep 300", task_id="zombie",
                                  backend_details={"lease_hours": 0.0005}))  # fmt: skip
    for task in (run, zombie):
        _wait_job_running(brev_world, _name(task))
    zombie.future.cancel()  # its worker and trigger are gone, yet Airflow still says "running"
    time.sleep(2)  # both leases (1.8 s) run out

    def state_of(lease: dict[str, Any]) -> str:
        return "deferred" if lease["run_id"] == run.context["ti"].run_id else "running"

    dry = {d.instance: d.action for d in BrevHook(CONN_ID).reap(task_state=state_of, dry_run=True)}
    assert dry == {_name(run): "would cancel jobs", _name(zombie): "would cancel jobs"}
    assert len([c for c in brev_world.job_containers() if c.get("State") == "running"]) == 2
    decisions = {d.instance: d for d in BrevHook(CONN_ID).reap(task_state=state_of)}
    assert decisions[_name(run)].action == "jobs canceled" and run.job_id in decisions[_name(run)].reason
    with pytest.raises(AirflowFailException, match=r"ERR_CANCELED \(not retriable\).*canceled by reap: lease expired"):
        finish(run)
    _wait_gone(brev_world, _name(run))  # deleted by the task that saw the cancel
    assert brev_world.instance(_name(zombie))["status"] == "RUNNING"
    assert not [c for c in _job_containers(brev_world, _name(zombie)) if c.get("State") == "running"]
    again = {d.instance: d for d in BrevHook(CONN_ID).reap(task_state=state_of)}
    assert again[_name(zombie)].action == "deleted" and "lease expired" in again[_name(zombie)].reason
    _wait_gone(brev_world, _name(zombie))


# --------------------------------------------------------------------------- batching, secrets


def test_one_ls_and_one_exec_per_instance_per_interval_whatever_the_number_of_jobs(
    brev_world: BrevWorld, docker_engine: DockerEngine, triggerer: Triggerer
) -> None:
    for box in ("box-a", "box-b"):
        brev_world.create_instance(box)
    command = "i=0; while [ $i -lt 30 ] && [ ! -f /tmp/stop ]; do i=$((i+1)); echo tick $i; sleep 1; done"
    runs = [
        start(
            triggerer, _op(docker_engine.busybox, command, task_id=f"sweep_{i}", backend_details={"instance_id": box})
        )
        for i, box in enumerate(["box-a", "box-b"] * 3)
    ]
    poller = StatusPoller._instances[next(k for k in StatusPoller._instances if k[1:] == ("brev", CONN_ID))]
    time.sleep(1.5)  # every trigger has read its log once: from now on its lines come with the status probe
    polls, since = poller.calls, time.time()
    time.sleep(4)
    polls = poller.calls - polls
    calls = _calls(brev_world, since)
    execs = {box: len([c for c in calls if _sub(c) == "exec" and box in c["argv"]]) for box in ("box-a", "box-b")}
    assert polls >= 2
    assert len([c for c in calls if _sub(c) == "ls"]) <= polls + 1
    assert all(count <= polls + 1 for count in execs.values()), (polls, execs)  # 3 jobs, 1 exec per interval
    for run in runs:
        container = _job_containers(brev_world, _name(run))[0]["Id"]
        brev_world.engine().exec_stream(container, ["touch", "/tmp/stop"], lambda _stream, _chunk: None)
        assert finish(run)["state"] == "Complete"


class CommandLines:
    """Every process command line on this machine, sampled every 5 ms until stopped."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            for entry in os.scandir("/proc"):
                if entry.name.isdigit():
                    try:
                        self.seen.add(Path(entry.path, "cmdline").read_bytes())
                    except OSError:
                        continue
            time.sleep(0.005)

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join()
        return [line.replace(b"\0", b" ").decode(errors="replace") for line in self.seen]


CHECK = r"""
import hashlib, os
print("key", hashlib.sha256(os.environ["AWS_SECRET_ACCESS_KEY"].encode()).hexdigest() == os.environ["WANT_KEY"])
"""


def test_no_secret_is_on_any_command_line_in_the_task_log_or_in_the_container(  # noqa: PLR0917
    brev_world: BrevWorld,
    docker_engine: DockerEngine,
    triggerer: Triggerer,
    results: Results,
    monkeypatch: pytest.MonkeyPatch,
    capfd: Any,
) -> None:
    """The Brev token, the NGC key (the image comes from the connection's registry: the instance logs in first)
    and the job's S3 secret, while a job is submitted, watched and cleaned up: /proc/*/cmdline of every process
    here sampled every 5 ms, every CLI invocation, the task log, the container's inspect."""
    ngc_key = f"ngc-{uuid.uuid4().hex}"
    brev_world.set_ngc_key(ngc_key)
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN_ID.upper()}", brev_connection(brev_world, ngc_api_key=ngc_key, registry="local")
    )
    secret = results.secret
    brev_world.create_instance("box")
    op = _op(
        docker_engine.python,
        ["python3", "-c", CHECK],
        storage_conn_id=results.conn_id,
        results_uri=f"s3://{results.bucket}/results",
        env={"WANT_KEY": hashlib.sha256(secret.encode()).hexdigest()},
        backend_details={"network": "host", "instance_id": "box"},
    )
    sampled = CommandLines()
    try:
        run = start(triggerer, op)
        result = finish(run)
    finally:
        lines = sampled.stop()
    logged = capfd.readouterr()
    assert result["state"] == "Complete" and "[job] key True" in logged.out + logged.err
    assert any(re.search(r"brev (exec|copy|ls)", line) for line in lines), "the sampler saw no brev call"
    (container,) = _job_containers(brev_world, _name(run))
    inspected = json.dumps(brev_world.engine().inspect(container["Id"]))
    for value in (brev_world.token, ngc_key, secret):
        assert not [line for line in lines if value in line]
        assert value not in logged.out + logged.err
        assert not any(value in " ".join(c["argv"]) for c in brev_world.calls())
        assert value not in inspected
    home = brev_world.home_of("box")
    assert not list(home.glob(".tao-stage-*")) and not list(home.glob(".tao-brev/jobs/*/ngc.key"))


def test_bad_input_is_refused_before_any_cli_call(brev_world: BrevWorld, docker_engine: DockerEngine) -> None:
    from tests.unit.fakes import Store, make_context

    op = _op(docker_engine.busybox, "echo never", num_nodes=2)
    with pytest.raises(AirflowFailException, match="Bad input, nothing was submitted: num_nodes"):
        op.execute(make_context(Store(), 1, _run_id()))
    assert not any(_sub(c) in ("create", "copy", "exec") for c in brev_world.calls())
