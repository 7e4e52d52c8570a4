"""The lepton platform through the operator and the triggerer loop, against the fake Lepton workspace API.

Our code reaches the server only through the real ``leptonai`` client over HTTP; replicas run as real containers
with Lepton's per-worker variables. Every count (jobs, secrets, requests) is asked of the server itself
(``/fake/*``), never through our hook. Where the real server's behaviour is unknown (the id it gives a job; whether
a PATCH changes labels) the tests run against each variant.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowTaskTimeout

from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.hooks.lepton import LeptonHook
from airflow_provider_tao.hooks.lepton import api as la
from airflow_provider_tao.hooks.lepton import files as lf
from airflow_provider_tao.hooks.lepton import marks as lm
from airflow_provider_tao.hooks.lepton import status as ls
from airflow_provider_tao.jobs import JobHandle, JobState
from airflow_provider_tao.runner.entrypoint import MANIFEST_NAME
from airflow_provider_tao.triggers.poller import StatusPoller
from tests.integration.docker.conftest import DockerEngine
from tests.integration.lepton.conftest import CONN_ID, LeptonFake, lepton_connection
from tests.integration.taskrun import (
    TaskRun,
    Triggerer,
    event_of,
    finish,
    kill,
    make_operator,
    start,
    wait_submitted,
    worker_process,
)
from tests.unit.fakes import Store, make_context

pytestmark = pytest.mark.integration

#: Where the lustre-fs volume's permitted prefix (/lustre/fsw/portfolios/ci) is mounted in every job.
LUSTRE = "/mnt/lustre-fs"


@dataclass(frozen=True)
class Workspace:
    """A fake server and the Airflow connection on it."""

    fake: LeptonFake
    conn_id: str

    def op(self, image: str, command: str | list[str], **kwargs: Any) -> Any:
        return make_operator(self.conn_id, image=image, command=command, gpu_count=kwargs.pop("gpu_count", 0), **kwargs)

    def jobs_named(self, name: str, *, alive: bool = True) -> list[dict[str, Any]]:
        """The server's records of the jobs of one deterministic name (the label, whatever id it got)."""
        found = [j for j in self.fake.jobs() if j["labels"].get(ls.LABEL_NAME) == name]
        return [j for j in found if not j["deleted"]] if alive else found

    def job(self, job_id: str) -> dict[str, Any]:
        (record,) = [j for j in self.fake.jobs() if j["labels"].get(ls.LABEL_JOB_ID) == job_id]
        return record

    def secrets_of(self, job_id: str) -> list[str]:
        stored = self.fake.secrets()
        names = [*stored["user"], *stored["image_pull"]]
        return [n for n in names if n.startswith((la.secret_prefix(job_id), f"tao-{job_id}"))]

    def wait_running(self, job_id: str, timeout: float = 180) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [j for j in self.fake.jobs() if j["labels"].get(ls.LABEL_JOB_ID) == job_id]
            if (
                found
                and found[-1]["state"] == "Running"
                and any(r["phase"] == "Running" for r in found[-1]["replicas"])
            ):
                return found[-1]
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} not running after {timeout} s")

    def wait_gone(self, job_id: str, timeout: float = 180) -> None:
        """The job deleted on the server and none of its secrets left."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.job(job_id)["deleted"] and not self.secrets_of(job_id):
                return
            time.sleep(0.2)
        raise AssertionError(f"job {job_id}: {self.job(job_id)['state']}, secrets {self.secrets_of(job_id)}")

    def on_volume(self, container_path: str) -> Path:
        """The host folder behind a path under the lustre-fs mount."""
        return self.fake.volumes()["lustre-fs"] / "fsw/portfolios/ci" / container_path.removeprefix(LUSTRE).strip("/")


@pytest.fixture(scope="session")
def suffix_fake(lepton_fake_factory: Callable[..., LeptonFake], lepton_fake: LeptonFake) -> LeptonFake:
    """A second server that gives every job an id of its own (``<name>-xxxx``), with the connection
    ``tao_lepton_suffix``."""
    fake = lepton_fake_factory("--id-mode", "suffix")
    os.environ["AIRFLOW_CONN_TAO_LEPTON_SUFFIX"] = lepton_connection(fake)
    return fake


@pytest.fixture(params=["name", "suffix"])
def workspace(request: pytest.FixtureRequest, lepton_fake: LeptonFake, triggerer: Triggerer) -> Workspace:
    """Each id mode: the job id is the name the client sent, or one the server made up."""
    if request.param == "name":
        return Workspace(lepton_fake, CONN_ID)
    return Workspace(request.getfixturevalue("suffix_fake"), "tao_lepton_suffix")


@pytest.fixture
def ws(lepton_fake: LeptonFake, triggerer: Triggerer) -> Workspace:
    return Workspace(lepton_fake, CONN_ID)


@contextlib.contextmanager
def _patch_labels(ws: Workspace, mode: str) -> Iterator[str]:
    ws.fake.config(patch_labels=mode)
    lm._LABELS_PATCHABLE.clear()  # the hook learns the workspace's behaviour afresh
    try:
        yield mode
    finally:
        ws.fake.config(patch_labels="accept")
        lm._LABELS_PATCHABLE.clear()


@pytest.fixture(params=["accept", "ignore", "reject"])
def label_mode(request: pytest.FixtureRequest, ws: Workspace) -> Iterator[str]:
    """Each answer a workspace may give to a PATCH of metadata.labels."""
    with _patch_labels(ws, request.param) as mode:
        yield mode


@pytest.fixture(params=["ignore", "reject"])
def marks_in_secrets(request: pytest.FixtureRequest, ws: Workspace) -> Iterator[str]:
    """The answers that leave a job's labels as created: the marks are kept in secrets."""
    with _patch_labels(ws, request.param) as mode:
        yield mode


@pytest.fixture(params=["with-analysis", "no-analysis"])
def analysis_route(request: pytest.FixtureRequest, ws: Workspace) -> Iterator[str]:
    """The workspace answers ``GET /jobs/{id}/failure-analysis`` (the TAO SDK's route, not in ``leptonai``), or 404:
    the verdict must not depend on it."""
    ws.fake.config(failure_analysis=request.param == "with-analysis")
    try:
        yield request.param
    finally:
        ws.fake.config(failure_analysis=True)


def _run_id() -> str:
    return f"manual__{uuid.uuid4().hex[:10]}"


def _name(run: TaskRun) -> str:
    return run.trigger.handle.name


def _hook(conn_id: str = CONN_ID) -> LeptonHook:
    hook = LeptonHook(conn_id)
    hook.load_connection()
    return hook


def _logged(capfd: pytest.CaptureFixture[str]) -> str:
    out = capfd.readouterr()
    return out.out + out.err


# --------------------------------------------------------------------------- outcomes


def test_success_streams_the_log_and_commits_outputs_on_the_lustre_volume(
    docker_engine: DockerEngine, workspace: Workspace, triggerer: Triggerer, capfd: pytest.CaptureFixture[str]
) -> None:
    op = workspace.op(
        docker_engine.python,
        "mkdir -p /work/out && echo model of $TAO_JOB_ID > /work/out/model.txt && echo epoch-1 && echo epoch-2",
        outputs=["/work/out"],
    )
    run = start(triggerer, op)
    result = finish(run)

    assert result["state"] == "Complete" and result["platform"] == "lepton"
    assert result["results_dir"] == f"{LUSTRE}/results/{run.job_id}"
    written = workspace.on_volume(result["outputs"]["/work/out"])
    assert (written / "model.txt").read_text() == f"model of {run.job_id}\n"
    assert json.loads((written / MANIFEST_NAME).read_text())["files"][0]["path"] == "model.txt"
    logged = _logged(capfd)
    assert "[job] epoch-1" in logged and "[job] epoch-2" in logged
    assert logged.count("[job] epoch-1") == 1  # no line twice
    record = workspace.job(run.job_id)
    assert record["id"] == result["backend_job_id"] and record["state"] == "Completed"
    assert (record["id"] == _name(run)) is (workspace.conn_id == CONN_ID)  # the server's id, in either mode
    spec = record["body"]["spec"]
    assert spec["resource_shape"] == "cpu.small" and spec["max_failure_retry"] == 0
    assert spec["mounts"] == [{"path": "/lustre/fsw/portfolios/ci", "from": "node-nfs:lustre-fs", "mount_path": LUSTRE}]
    assert spec["affinity"]["allowed_dedicated_node_groups"] != ["ng-lustre"]  # the group's id, not its name
    assert record["labels"][ls.LABEL_NAME] == _name(run) and len(_name(run)) <= 36
    assert workspace.secrets_of(run.job_id) == []  # the files' secrets went with the verdict


def test_non_zero_exit_is_err_program_with_the_exit_code_not_retried(
    docker_engine: DockerEngine, ws: Workspace, triggerer: Triggerer, analysis_route: str
) -> None:
    run = start(triggerer, ws.op(docker_engine.busybox, "echo about to fail; exit 3"))
    with pytest.raises(AirflowFailException, match=r"ERR_PROGRAM .*exited with code 3"):
        finish(run)
    record = ws.job(run.job_id)
    assert record["state"] == "Failed" and [r["exit_code"] for r in record["replicas"]] == [3]


def test_an_oom_node_event_is_err_oom(
    docker_engine: DockerEngine, ws: Workspace, triggerer: Triggerer, analysis_route: str
) -> None:
    run = start(triggerer, ws.op(docker_engine.busybox, "sleep 60"))
    backend = ws.wait_running(run.job_id)["id"]
    ws.fake.inject("oom", id=backend)
    with pytest.raises(AirflowFailException, match="ERR_OOM"):
        finish(run, timeout=60)
    assert ws.job(run.job_id)["replicas"][0]["reason"] == "OOMKilled"


def test_an_image_that_cannot_be_pulled_is_err_image_pull_and_the_job_is_deleted(
    ws: Workspace, triggerer: Triggerer, hook_factory: Callable[[], LeptonHook]
) -> None:
    run = start(triggerer, ws.op("local/no-such-image:1", "echo never"))
    # Queueing until the controller places it, then "Pulling image" for the fake's pull_fail_seconds (1 s)
    hook, handle, seen = hook_factory(), JobHandle.from_json(run.handle), []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (seen and "Queueing" not in seen[-1].message):
        seen.append(hook.get_job_status(handle))
        time.sleep(0.05)
    assert any(s.state is JobState.PENDING and "Pulling image" in s.message for s in seen), seen[-1]
    with pytest.raises(AirflowFailException, match="ERR_IMAGE_PULL"):
        finish(run, timeout=60)
    ws.wait_gone(run.job_id)  # given up: stopped and deleted, its secrets with it


def test_no_capacity_is_pending_then_err_capacity_after_the_bound_and_the_job_is_deleted(
    docker_engine: DockerEngine, ws: Workspace, triggerer: Triggerer, hook_factory: Callable[[], LeptonHook]
) -> None:
    ws.fake.capacity(ng_lustre=0)
    try:
        op = ws.op(docker_engine.busybox, "echo never", gpu_count=1, backend_details={"capacity_timeout_seconds": 6})
        run = start(triggerer, op)
        time.sleep(2)
        status = hook_factory().get_job_status(JobHandle.from_json(run.handle))
        assert status.state is JobState.PENDING and "waiting for capacity" in status.message, status
        with pytest.raises(AirflowException, match="ERR_CAPACITY") as failed:
            finish(run, timeout=60)
        assert not isinstance(failed.value, AirflowFailException)  # capacity is retriable
        assert ws.job(run.job_id)["labels"][ls.LABEL_CAPACITY] == "6"
        ws.wait_gone(run.job_id)  # nothing keeps waiting for a node
    finally:
        ws.fake.capacity(ng_lustre=None)


def test_an_unhealthy_node_is_err_infra(docker_engine: DockerEngine, ws: Workspace, triggerer: Triggerer) -> None:
    name_prefix = f"sick-{uuid.uuid4().hex[:6]}"
    ws.fake.inject("unhealthy_node", name_prefix=name_prefix)
    op = ws.op(docker_engine.busybox, "echo never", job_name=name_prefix, backend_details={"start_timeout_seconds": 4})
    run = start(triggerer, op)
    with pytest.raises(AirflowException, match="ERR_INFRA") as failed:
        finish(run, timeout=60)
    assert not isinstance(failed.value, AirflowFailException)
    ws.wait_gone(run.job_id)


def test_an_eviction_is_retried_by_airflow_with_one_new_job(
    docker_engine: DockerEngine, workspace: Workspace, triggerer: Triggerer
) -> None:
    run_id = _run_id()
    first = start(triggerer, workspace.op(docker_engine.busybox, "sleep 60"), run_id=run_id)
    backend = workspace.wait_running(first.job_id)["id"]
    workspace.fake.inject("evict", id=backend)
    with pytest.raises(AirflowException, match="ERR_PREEMPTED") as failed:
        finish(first, timeout=60)
    assert not isinstance(failed.value, AirflowFailException)

    retry_op = workspace.op(docker_engine.busybox, "echo second")
    retry = start(triggerer, retry_op, store=first.store, try_number=2, run_id=run_id)
    assert retry.job_id != first.job_id and _name(retry) == _name(first)
    result = finish(retry)
    (alive,) = workspace.jobs_named(_name(first))  # the evicted one was deleted before the new one was created
    assert result["state"] == "Complete" and alive["labels"][ls.LABEL_JOB_ID] == retry.job_id


def test_a_wrong_token_is_err_auth_before_anything_is_created(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TAO_LEPTON_BADTOKEN", json.dumps(
        {**json.loads(lepton_connection(ws.fake)), "password": "not-the-token"}
    ))  # fmt: skip
    ws.fake.stats(reset=True)
    op = make_operator("tao_lepton_badtoken", image="local/busybox:ci", command="echo never", gpu_count=0)
    started = time.monotonic()
    with pytest.raises(AirflowFailException, match=r"ERR_AUTH.*refused the token.*Put a valid API token") as failed:
        op.execute(make_context(Store(), 1, _run_id()))
    assert "connection 'tao_lepton_badtoken' password" in str(failed.value)
    assert time.monotonic() - started < 10  # at once: no retry loop
    calls = ws.fake.stats()["by"]
    assert not any(key.startswith(("POST", "PATCH", "DELETE")) for key in calls), calls  # nothing created
    ok, message = _hook("tao_lepton_badtoken").test_connection()
    assert not ok and message.startswith("Authentication refused:") and "password" in message, message
    assert _hook().test_connection() == (True, f"Lepton workspace ws-ci (ws-ci) answers at {ws.fake.workspace_url}")


def test_a_token_without_permission_is_err_auth_before_anything_is_created(ws: Workspace) -> None:
    ws.fake.config(auth="forbid")
    try:
        ws.fake.stats(reset=True)
        op = make_operator(CONN_ID, image="local/busybox:ci", command="echo never", gpu_count=0)
        with pytest.raises(AirflowFailException, match=r"ERR_AUTH: .*HTTP 403 Forbidden"):
            op.execute(make_context(Store(), 1, _run_id()))
        calls = ws.fake.stats()["by"]
        assert not any(key.startswith(("POST", "PATCH", "DELETE")) for key in calls), calls
    finally:
        ws.fake.config(auth="ok")


# --------------------------------------------------------------------------- placement


def test_two_node_job_gets_ranks_and_one_master_address_with_nothing_fetched(
    docker_engine: DockerEngine, ws: Workspace, triggerer: Triggerer
) -> None:
    command = (
        'out="$TAO_RESULTS_ROOT/$TAO_JOB_ID"; mkdir -p "$out"; '
        "resolved=no; for i in $(seq 40); do "
        'getent hosts "$MASTER_ADDR" > /dev/null && { resolved=yes; break; }; sleep 0.25; done; '
        'echo "$NODE_RANK $MASTER_ADDR $MASTER_PORT $WORLD_SIZE $NNODES $NUM_GPU_PER_NODE $resolved" '
        '> "$out/rank-$NODE_RANK"; sleep 3'
    )
    run = start(triggerer, ws.op(docker_engine.python, command, num_nodes=2, gpu_count=2))
    result = finish(run)
    folder = ws.on_volume(f"{LUSTRE}/results/{run.job_id}")
    ranks = {int(p.name.split("-")[1]): p.read_text().split() for p in folder.glob("rank-*")}
    record = ws.job(run.job_id)
    master = f"{record['id']}-0.{record['id']}-job-svc"  # Lepton's worker 0 under the job's subdomain
    assert result["state"] == "Complete" and sorted(ranks) == [0, 1]
    assert ranks[0][1:] == ranks[1][1:] == [master, "29500", "2", "2", "2", "yes"]
    spec = record["body"]["spec"]
    assert (spec["completions"], spec["parallelism"], spec["intra_job_communication"]) == (2, 2, True)
    assert spec["resource_shape"] == "gpu.2xh100-80gb" and len(record["replicas"]) == 2
    # the translation came with the job's files: no URL, no download tool anywhere in what was submitted
    assert not re.search(r"https?://|wget|curl", record["body_json"])
    assert ws.fake.network()["internal"] is True  # and the replicas could not have fetched anything


def test_shapes_are_resolved_from_gpu_count_and_a_misfit_lists_the_shapes(
    docker_engine: DockerEngine, ws: Workspace, triggerer: Triggerer
) -> None:
    run = start(triggerer, ws.op(docker_engine.busybox, "echo ok", gpu_count=4))
    assert finish(run)["state"] == "Complete"
    assert ws.job(run.job_id)["body"]["spec"]["resource_shape"] == "gpu.4xh100-80gb"
    before = len(ws.fake.jobs())
    op = ws.op(docker_engine.busybox, "echo never", gpu_count=16, deferrable=False)
    with pytest.raises(AirflowFailException, match=r"gpu_count: no resource shape of node group ng-lustre has 16 GPU"):
        op.execute(make_context(Store(), 1, _run_id()))
    with pytest.raises(AirflowFailException, match=r"gpu\.8xh100-80gb \(8 GPU\)"):
        op.execute(make_context(Store(), 1, _run_id()))
    assert len(ws.fake.jobs()) == before


def test_the_lustre_mount_is_the_runners_input_cache(
    docker_engine: DockerEngine, ws: Workspace, triggerer: Triggerer, capfd: pytest.CaptureFixture[str]
) -> None:
    show = (
        'import json, os; m = json.load(open(os.environ["TAO_JOB_FILES"] + "/runner.json")); '
        'print("CACHE", m["mount_path"])'
    )
    run = start(
        triggerer,
        ws.op(docker_engine.python, ["python3", "-c", show, "{config_path}"], specs={"a": 1}, config_format="json"),
    )
    assert finish(run)["state"] == "Complete"
    assert f"[job] CACHE {LUSTRE}" in _logged(capfd)


def test_bad_placement_is_refused_before_anything_is_created(docker_engine: DockerEngine, ws: Workspace) -> None:
    before = len(ws.fake.jobs())
    for details, parameter in (
        ({"dedicated_node_group": "ng-missing"}, r"backend_details\['dedicated_node_group'\]: .*ng-lustre"),
        ({"resource_shape": "gpu.3xh100"}, r"backend_details\['resource_shape'\]: .*cpu\.small"),
        (
            {"mounts": [{"volume": "lustre-fs", "path": "/lustre/other", "mount_path": "/data"}]},
            r"backend_details\['mounts'\]\[0\]: path '/lustre/other' .*/lustre/fsw/portfolios/ci",
        ),
        (
            {"mounts": [{"volume": "nope", "path": "/", "mount_path": "/data"}]},
            r"backend_details\['mounts'\]\[0\]: volume 'nope' is not a volume of node group ng-lustre",
        ),
        ({"gpus": 2}, r"backend_details\['gpus'\]"),
        ({"priority_class": "urgent"}, r"backend_details\['priority_class'\]: 'urgent' is not a Lepton queue priority"),
        ({"priority_class": "high"}, r"backend_details\['priority_class'\]: node group ng-lustre does not have quota"),
    ):
        op = ws.op(docker_engine.busybox, "true", deferrable=False, backend_details=details)
        with pytest.raises(AirflowFailException, match=f"nothing was submitted: {parameter}"):
            op.execute(make_context(Store(), 1, _run_id()))
    assert len(ws.fake.jobs()) == before


def test_a_local_input_must_be_on_a_mounted_volume(docker_engine: DockerEngine, ws: Workspace) -> None:
    op = ws.op(docker_engine.python, "true", deferrable=False, inputs={"/data/train": "/home/me/train"})
    with pytest.raises(AirflowFailException, match=r"nothing was submitted: inputs: /home/me/train is not on a volume"):
        op.execute(make_context(Store(), 1, _run_id()))
    on_volume = ws.op(docker_engine.python, "test -d /data/train", deferrable=False,
                      inputs={"/data/train": f"{LUSTRE}/datasets/train"})  # fmt: skip
    ws.on_volume(f"{LUSTRE}/datasets/train").mkdir(parents=True, exist_ok=True)
    assert on_volume.execute(make_context(Store(), 1, _run_id()))["state"] == "Complete"


def test_the_seeds_discovery_calls(ws: Workspace) -> None:
    hook = _hook()
    shapes = hook.list_resource_shapes("ng-lustre")
    assert shapes["gpu.8xh100-80gb"]["gpus"] == 8 and shapes["cpu.small"]["gpus"] == 0
    volumes = hook.get_volumes()  # the connection's node group
    assert [(v["name"], v["type"], v["from_path"]) for v in volumes] == [
        ("lustre-fs", "lustre", "/lustre"),
        ("filestore-fs", "filestore", "/filestore"),
    ]
    assert hook.get_storage_permissions("lustre-fs", "ng-lustre") == ["/lustre/fsw/portfolios/ci"]
    with pytest.raises(JobValidationError, match="node groups: ng-filestore, ng-lustre, ng-plain"):
        hook.get_volumes("ng-nowhere")


# --------------------------------------------------------------------------- cancel: nothing orphaned


def test_mark_failed_while_deferred_stops_and_deletes_the_job_and_its_secrets(
    docker_engine: DockerEngine, ws: Workspace, triggerer: Triggerer, storage: str, label_mode: str
) -> None:
    run = start(triggerer, ws.op(docker_engine.python, "sleep 60", storage_conn_id=storage))
    backend = ws.wait_running(run.job_id)["id"]
    assert any(".env.AWS_SECRET_ACCESS_KEY" in n for n in ws.secrets_of(run.job_id))
    kill(run)
    ws.wait_gone(run.job_id)
    assert ws.fake.client().job.get(backend).spec.stopped is True  # stopped (SIGTERM to the replicas) ...
    calls = [r.split()[0] for r in ws.fake.requests() if r.split()[1].split("?")[0].endswith(f"/jobs/{backend}")]
    assert calls.index("DELETE") > calls.index("PATCH"), calls  # ... then deleted


def test_a_mark_written_after_its_job_was_deleted_keeps_no_secret(
    docker_engine: DockerEngine, ws: Workspace, triggerer: Triggerer, label_mode: str
) -> None:
    """A try claims the job a person's cancel has just deleted (the pair explorer on Lepton: a person's cancel, then
    a clear while the trigger read the replicas). Lepton still shows the job, Deleted, for a while; a mark written
    then was kept as a secret (a PATCH names alive jobs only) that nothing deleted -- the job's secrets went with its
    deletion, and a workspace whose labels change never sweeps marks. A deleted job's mark is not kept."""
    run = start(triggerer, ws.op(docker_engine.busybox, "sleep 60"))
    ws.wait_running(run.job_id)
    kill(run)
    ws.wait_gone(run.job_id)
    handle = JobHandle.from_json(run.handle)
    hook = _hook()
    assert ls.state_of(hook._get_job(str(handle.backend_job_id)) or {}) == "Deleted"  # still shown
    hook.write_mark(handle, "owner_try", 3)
    assert ws.secrets_of(run.job_id) == []


def test_execution_timeout_stops_and_deletes_everything(
    docker_engine: DockerEngine, ws: Workspace, triggerer: Triggerer, storage: str
) -> None:
    op = ws.op(docker_engine.python, "sleep 60", storage_conn_id=storage, execution_timeout=timedelta(seconds=8))
    run = start(triggerer, op)
    ws.wait_running(run.job_id)
    with pytest.raises(AirflowTaskTimeout):
        finish(run, timeout=60)
    ws.wait_gone(run.job_id)


def test_cancel_on_kill_false_leaves_the_job(
    docker_engine: DockerEngine, ws: Workspace, triggerer: Triggerer, hook_factory: Callable[[], LeptonHook]
) -> None:
    run = start(triggerer, ws.op(docker_engine.busybox, "sleep 3", cancel_on_kill=False))
    ws.wait_running(run.job_id)
    kill(run)
    state = hook_factory().get_job_status(JobHandle.from_json(run.handle)).state
    assert state in (JobState.PENDING, JobState.RUNNING, JobState.COMPLETE) and not ws.job(run.job_id)["deleted"]
    assert ws.fake.wait_state(ws.job(run.job_id)["id"], "Completed")


# --------------------------------------------------------------------------- durable identity


def test_worker_sigkill_right_after_submission_then_the_retry_runs_one_job(
    docker_engine: DockerEngine, workspace: Workspace, triggerer: Triggerer
) -> None:
    run_id = _run_id()
    worker, name = worker_process(workspace.conn_id, docker_engine.busybox, run_id, "sleep 4; echo done")
    wait_submitted(worker, "lepton")
    worker.send_signal(signal.SIGKILL)  # before the handle is stored
    worker.wait()

    op = workspace.op(docker_engine.busybox, "sleep 4; echo done")
    retry = start(triggerer, op, try_number=2, run_id=run_id)
    assert _name(retry) == name
    result = finish(retry)
    (job,) = workspace.jobs_named(name, alive=False)  # one job on the server, ever
    assert result["state"] == "Complete" and job["id"] == result["backend_job_id"]
    assert _hook(workspace.conn_id).read_marks(JobHandle.from_json(retry.handle))["owner_try"] == 2


def test_clear_while_deferred_runs_exactly_one_job_to_completion(
    docker_engine: DockerEngine, ws: Workspace, triggerer: Triggerer, label_mode: str
) -> None:
    run_id = _run_id()
    first = start(triggerer, ws.op(docker_engine.busybox, "sleep 4; echo finished"), run_id=run_id)
    second = start(
        triggerer,
        ws.op(docker_engine.busybox, "sleep 4; echo finished"),
        store=first.store,
        try_number=2,
        run_id=run_id,
    )
    assert second.job_id == first.job_id
    kill(first)  # try 1's on_kill: try 2 owns the job now, so nothing is stopped
    result = finish(second)
    (job,) = ws.jobs_named(_name(first), alive=False)
    assert result["state"] == "Complete" and job["state"] == "Completed"
    marks = _hook().read_marks(JobHandle.from_json(second.handle))
    assert marks.get("owner_try") == 2 and "cancel_requested_by" not in marks and marks.get("consumed_by") == 2
    mark_secrets = [n for n in ws.secrets_of(first.job_id) if ".mark." in n]
    if label_mode == "accept":
        assert job["labels"][ls.MARK_LABELS["owner_try"]] == "2" and not mark_secrets
    else:  # the workspace kept the labels as created: the marks live in secrets named after the job
        assert job["labels"][ls.MARK_LABELS["owner_try"]] == "1"
        assert sorted(mark_secrets) == [
            f"tao.{first.job_id}.mark.consumed_by.2",
            f"tao.{first.job_id}.mark.owner_try.2",
        ]
    # a clear after success runs the job again (its result was used), even with the store emptied
    third = start(triggerer, ws.op(docker_engine.busybox, "echo again"), try_number=3, run_id=run_id)
    assert third.job_id != first.job_id and finish(third)["state"] == "Complete"


def test_where_labels_do_not_change_the_marks_of_a_job_that_expired_are_swept(
    docker_engine: DockerEngine, ws: Workspace, triggerer: Triggerer, marks_in_secrets: str
) -> None:
    short = ws.op(docker_engine.busybox, "echo done", backend_details={"ttl_seconds_after_finished": 1})
    first = start(triggerer, short)
    assert finish(first)["state"] == "Complete"
    assert [n for n in ws.secrets_of(first.job_id) if ".mark." in n] == [f"tao.{first.job_id}.mark.consumed_by.1"]
    ws.fake.wait_state(ws.job(first.job_id)["id"], "Archived")  # expired: no longer a job of the workspace
    second = start(triggerer, ws.op(docker_engine.busybox, "echo next"))
    assert ws.secrets_of(first.job_id) == []  # swept when the next job was created
    assert finish(second)["state"] == "Complete"


def test_a_job_archived_before_its_task_resumes_succeeds_and_a_clear_runs_it_again(
    docker_engine: DockerEngine, ws: Workspace, triggerer: Triggerer, label_mode: str
) -> None:
    """The job's TTL passes before its task resumes (a worker slot that takes a while; a loaded machine with a TTL
    of 1 s): Lepton refuses a PATCH of an archived job (404), so the result-used mark is a secret -- the task
    succeeded no longer waits forever on that 404 as if the platform were down -- and a clear with the store
    emptied runs the job again rather than reuse its result."""
    run_id = _run_id()
    short = ws.op(docker_engine.busybox, "echo done", backend_details={"ttl_seconds_after_finished": 1})
    first = start(triggerer, short, run_id=run_id)
    assert event_of(first)["status"] == "complete"
    ws.fake.wait_state(ws.job(first.job_id)["id"], "Archived")
    assert finish(first)["state"] == "Complete"
    assert _hook().read_marks(JobHandle.from_json(first.handle)).get("consumed_by") == 1
    again = start(triggerer, ws.op(docker_engine.busybox, "echo again"), try_number=2, run_id=run_id)
    assert again.job_id != first.job_id and finish(again)["state"] == "Complete"


# --------------------------------------------------------------------------- polling


def test_one_job_list_per_interval_whatever_the_number_of_jobs(
    docker_engine: DockerEngine, ws: Workspace, triggerer: Triggerer
) -> None:
    runs = [start(triggerer, ws.op(docker_engine.busybox, "sleep 10", stream_logs=False)) for _ in range(4)]
    for run in runs:
        ws.wait_running(run.job_id)
    time.sleep(1.5)  # every replica ready: no job is starting
    poller = StatusPoller._instances[next(k for k in StatusPoller._instances if k[1:] == ("lepton", CONN_ID))]
    ws.fake.stats(reset=True)
    calls = poller.calls
    time.sleep(4)
    counts = ws.fake.stats()["by"]
    polls = poller.calls - calls
    assert polls >= 3
    # one list per poll: a page holding every watched job ends it (no empty page asked for)
    assert counts.get("GET /jobs", 0) <= polls + 1, counts
    assert set(counts) == {"GET /jobs"}, counts  # no per-job read, no replicas
    for run in runs:
        assert finish(run)["state"] == "Complete"


# --------------------------------------------------------------------------- large specs, secrets

SECRET = f"lepton-secret-{uuid.uuid4().hex[:8]}"
NGC_KEY = f"ngc-{uuid.uuid4().hex}"
HF_TOKEN = f"hf_{uuid.uuid4().hex}"


@pytest.fixture
def storage(monkeypatch: pytest.MonkeyPatch) -> str:
    """An ``aws`` connection whose secret key is :data:`SECRET`: the job receives it as a secret."""
    conn = {"conn_type": "aws", "login": "AKIDLEPTONFAKE", "password": SECRET, "extra": {"region_name": "us-east-1"}}
    monkeypatch.setenv("AIRFLOW_CONN_S3_LEPTON", json.dumps(conn))
    return "s3_lepton"


@pytest.fixture
def keyed(ws: Workspace, storage: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A Lepton connection with an NGC key (-> an image pull secret) and a Hugging Face token (and the storage
    connection of :func:`storage`)."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_TAO_LEPTON_KEYED", lepton_connection(ws.fake, ngc_api_key=NGC_KEY, hf_token=HF_TOKEN)
    )
    return "tao_lepton_keyed"


CHECK = r"""
import hashlib, json, os, sys
spec = json.load(open(sys.argv[1]))
blob = spec["train"]["blob"]
print("spec", len(blob), hashlib.sha256(blob.encode()).hexdigest() == os.environ["WANT_SPEC"])
for var in ("AWS_SECRET_ACCESS_KEY", "NGC_KEY", "HF_TOKEN"):
    print("secret", var, hashlib.sha256(os.environ[var].encode()).hexdigest() == os.environ["WANT_" + var])
print("env parts left", sorted(k for k in os.environ if k.startswith("TAO_JOB_PART")))
os.makedirs(spec["train"]["results_dir"], exist_ok=True)
open(os.path.join(spec["train"]["results_dir"], "ok"), "w").write("ok")
"""


def test_a_4_mib_spec_reaches_the_job_and_no_secret_value_is_in_any_job_spec_or_log(
    docker_engine: DockerEngine,
    ws: Workspace,
    triggerer: Triggerer,
    keyed: str,
    capfd: pytest.CaptureFixture[str],
) -> None:
    blob = secrets.token_hex(2 * 1024 * 1024)  # 4 MiB of text, ~2.4 MiB gzip'd: more than an environment carries
    want = {"WANT_" + k: hashlib.sha256(v.encode()).hexdigest() for k, v in (
        ("AWS_SECRET_ACCESS_KEY", SECRET), ("NGC_KEY", NGC_KEY), ("HF_TOKEN", HF_TOKEN)
    )}  # fmt: skip
    op = make_operator(
        keyed,
        image=docker_engine.python,
        command=["python3", "-c", CHECK, "{config_path}"],
        gpu_count=0,
        storage_conn_id="s3_lepton",
        specs={"train": {"blob": blob, "results_dir": "output"}},
        outputs=["train.results_dir"],
        config_format="json",
        env={"WANT_SPEC": hashlib.sha256(blob.encode()).hexdigest(), **want},
    )
    run = start(triggerer, op)
    ws.wait_running(run.job_id, timeout=120)
    pulls = ws.fake.secrets()["image_pull"]
    result = finish(run, timeout=180)

    logged = _logged(capfd)
    assert f"[job] spec {len(blob)} True" in logged
    for var in ("AWS_SECRET_ACCESS_KEY", "NGC_KEY", "HF_TOKEN"):
        assert f"[job] secret {var} True" in logged
    assert "[job] env parts left []" in logged  # unpacked, then out of the command's environment
    assert result["state"] == "Complete"
    stagers = [j for j in ws.fake.jobs() if j["labels"].get(ls.LABEL_STAGE_OF) == run.job_id]
    assert len(stagers) == 4 and all(j["deleted"] for j in stagers)
    assert all("Completed" in [h["state"] for h in j["history"]] for j in stagers)
    assert not ws.on_volume(f"{LUSTRE}/{lf.STAGING_DIR}/{run.job_id}").exists()  # removed once unpacked
    assert pulls == {la.pull_secret_name(run.job_id): NGC_KEY}  # the NGC key became an image pull secret
    record = ws.job(run.job_id)
    assert record["body"]["spec"]["image_pull_secrets"] == [la.pull_secret_name(run.job_id)]
    stored = ws.fake.secrets()
    for value in (SECRET, NGC_KEY, HF_TOKEN):
        assert value not in logged and value not in json.dumps(result)
        ever = [item for item in stored["ever"] if item["value"] == value]
        assert ever and all(item["in_job_specs"] == [] for item in ever), ever  # in no job spec, ever
    for job in ws.fake.jobs():
        assert not any(v in job["body_json"] for v in (SECRET, NGC_KEY, HF_TOKEN))
    refs = {e["name"]: e for e in record["body"]["spec"]["envs"] if "value_from" in e}
    assert {"AWS_SECRET_ACCESS_KEY", "NGC_KEY", "HF_TOKEN"} <= set(refs)
    assert ws.secrets_of(run.job_id) == []  # every secret of the job deleted with its verdict


def test_the_typical_spec_rides_in_secret_held_environment(
    docker_engine: DockerEngine, ws: Workspace, triggerer: Triggerer
) -> None:
    run = start(triggerer, ws.op(docker_engine.python, "echo ok {config_path}", specs={"a": {"b": 1}}))
    assert finish(run)["state"] == "Complete"
    envs = ws.job(run.job_id)["body"]["spec"]["envs"]
    parts = [e for e in envs if e["name"].startswith("TAO_JOB_PART_")]
    assert parts and all(e["value_from"]["secret_name_ref"].startswith(f"tao.{run.job_id}.files.") for e in parts)
    assert len(ws.job(run.job_id)["body_json"]) < 8 * 1024  # the runner is not in the job spec: listings stay small


@pytest.fixture
def hook_factory(ws: Workspace) -> Callable[[], LeptonHook]:
    return _hook
