"""The fake Lepton workspace API, checked through the REAL ``leptonai`` 0.47.1 client over HTTP (and raw requests
where the TAO SDK makes them): every answer parses into the client's types, pagination ends, errors have the
right status codes and bodies, and replicas really run on the test Docker engine with Lepton's per-worker env.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import requests
from leptonai.api.v2.api_resource import ClientError, ServerError
from leptonai.api.v2.log import LogAPIError
from leptonai.api.v2.types.job import LeptonJob, LeptonJobState
from leptonai.api.v2.types.secret import SecretItem
from leptonai.api.v2.types.storage_permission import StoragePermission
from leptonai.api.v2.utils import WorkspaceUnauthorizedError

from tests.integration.lepton.conftest import LeptonFake

pytestmark = pytest.mark.integration

BUSYBOX = "local/busybox:ci"
PYTHON = "local/debian-py:ci"
FINAL = ("Completed", "Failed")


class _Any:
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


ANY = _Any()


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def group_ids(client: Any) -> dict[str, str]:
    """Node group name -> id, as a caller resolves them (by listing)."""
    return {ng.metadata.name: ng.metadata.id_ for ng in client.nodegroup.list_all()}


def job(name: str, command: list[str], *, client: Any, group: str = "ng-plain", **spec: Any) -> LeptonJob:
    """A LeptonJob as a caller builds it (metadata.id = the name, as the CLI does)."""
    labels = spec.pop("labels", {"suite": "leptonfake"})
    body = {
        "resource_shape": "cpu.small",
        "affinity": {"allowed_dedicated_node_groups": [group_ids(client)[group]]},
        "container": {"image": spec.pop("image", BUSYBOX), "command": command},
        **spec,
    }
    return LeptonJob(metadata={"id": name, "labels": labels}, spec=body)


def wait_job(client: Any, job_id: str, states: tuple[str, ...], timeout: float = 60) -> LeptonJob:
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        seen = client.job.get(job_id)
        if seen.status.state.value in states:
            return seen
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} not in {states} after {timeout} s: {seen and seen.status}")


def wait_for(check: Callable[[], Any], what: str, timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.1)
    raise AssertionError(f"{what} after {timeout} s")


def raw(fake: LeptonFake, method: str, path: str, token: str | None = None, **kwargs: Any) -> requests.Response:
    """A request as the TAO SDK makes them (plain requests with the bearer token)."""
    headers = {"Authorization": f"Bearer {token or fake.token}"}
    kwargs.setdefault("timeout", 30)
    return requests.request(method, fake.workspace_url + path, headers=headers, **kwargs)


def log_lines(client: Any, job_id: str, **kwargs: Any) -> list[str]:
    now = time.time_ns()
    result = client.log.get_log(name_or_job=job_id, start=str(now - 600 * 10**9), end=str(now + 10**9), **kwargs)
    return [line for stream in result["data"]["result"] for _, line in stream["values"]]


@contextmanager
def configured(fake: LeptonFake, world: dict[str, Any] | None = None, **settings: Any) -> Iterator[None]:
    """Settings / world changes for one test, put back afterwards."""
    before = fake.config()
    fake.config(world=world, **settings)
    try:
        yield
    finally:
        undo_world = {key: None for key in (world or {})}
        fake.config(world=undo_world, **{k: before["settings"][k] for k in settings})
        fake.config(world={k: before["world"][k] for k in (world or {}) if k in before["world"]})


@pytest.fixture
def client(lepton_fake: LeptonFake, capsys: pytest.CaptureFixture[str]) -> Iterator[Any]:
    """The real client on the fake; afterwards, no answer may have been dropped by its parser."""
    yield lepton_fake.client()
    assert "[lepton-error]" not in capsys.readouterr().err, "the client could not parse an answer"


# ---------------------------------------------------------------------------------------------- the workspace


def test_workspace_node_groups_shapes_and_storage_parse_into_the_client_types(client: Any) -> None:
    info = client.info()
    assert info.workspace_name == "ws-ci" and info.workloads.num_jobs >= 0
    groups = client.nodegroup.list_all()
    by_name = {g.metadata.name: g for g in groups}
    assert set(by_name) == {"ng-lustre", "ng-filestore", "ng-plain"}
    lustre = by_name["ng-lustre"]
    assert lustre.metadata.id_ != "ng-lustre", "ids are not names: a caller must resolve them"
    assert [v.name for v in lustre.spec.volumes] == ["lustre-fs", "filestore-fs"]
    assert by_name["ng-plain"].spec.volumes == []
    assert client.nodegroup.get(lustre.metadata.id_).metadata.name == "ng-lustre"
    nodes = client.nodegroup.list_nodes(lustre)
    assert len(nodes) == 2 and nodes[0].spec.resource.gpu.total == 8
    assert len(client.nodegroup.list_idle_nodes(lustre)) <= 2
    assert client.nodegroup.list_storage_data_sources(lustre) == []
    shapes = client.shapes.list_shapes(lustre.metadata.id_, "job")
    assert {s.metadata.id_: s.spec.accelerator_num for s in shapes} == {
        "cpu.small": 0,
        "gpu.1xh100-80gb": 1,
        "gpu.2xh100-80gb": 2,
        "gpu.4xh100-80gb": 4,
        "gpu.8xh100-80gb": 8,
    }
    assert all(s.spec.node_group_id == lustre.metadata.id_ and "job" in s.spec.listable_in for s in shapes)
    permissions = client.nodegroup.list_storage_permissions(lustre, "lustre-fs")
    assert [p.path_prefix for p in permissions] == ["/lustre/fsw/portfolios/ci"]
    extra = StoragePermission(path_prefix="/lustre/fsw/scratch")
    assert client.nodegroup.set_storage_permission(lustre, "filestore-fs", extra)
    assert "/lustre/fsw/scratch" in [
        p.path_prefix for p in client.nodegroup.list_storage_permissions(lustre, "filestore-fs")
    ]
    assert client.nodegroup.delete_storage_permission(lustre, "filestore-fs", "/lustre/fsw/scratch")
    assert [p.path_prefix for p in client.nodegroup.list_storage_permissions(lustre, "filestore-fs")] == [
        "/filestore/home"
    ]
    with pytest.raises(ClientError) as missing:
        client.nodegroup.get("ng-lustre")  # a name is not an id
    assert missing.value.response.status_code == 404


def test_user_secrets_keep_their_values_to_themselves(client: Any, lepton_fake: LeptonFake) -> None:
    name, value = f"tao.{uuid.uuid4().hex[:12]}.AWS_SECRET_ACCESS_KEY", f"v-{uuid.uuid4().hex}"
    assert client.secret.create([SecretItem(name=name, value=value)])
    listed = {s.name: s for s in client.secret.list_all()}
    assert name in listed and listed[name].value is None
    assert value not in raw(lepton_fake, "GET", "/usersecrets").text
    with pytest.raises(ClientError) as again:
        client.secret.create([SecretItem(name=name, value="other")])
    assert again.value.response.status_code == 409 and again.value.response.json()["code"] == "AlreadyExists"
    assert lepton_fake.secrets()["user"][name] == value
    assert client.secret.delete(name)
    with pytest.raises(ClientError) as gone:
        client.secret.delete(name)
    assert gone.value.response.status_code == 404
    assert any(s["value"] == value for s in lepton_fake.secrets()["ever"]), "the record keeps values for leak checks"


def test_the_controls_filter_jobs_by_label_and_name_the_secrets_ever_stored_without_values(
    client: Any, lepton_fake: LeptonFake
) -> None:
    """The explorer's judge reads one task's jobs and the mark names after thousands of runs: ``jobs(label=...)``
    gives only the jobs labelled so, ``secrets(values=False)`` every name ever stored, deleted ones too, no value."""
    tag = uuid.uuid4().hex[:12]
    name, other = _name("mine"), _name("other")
    client.job.create(job(name, ["true"], client=client, stopped=True, labels={"tao-job-name": tag}))
    client.job.create(job(other, ["true"], client=client, stopped=True, labels={"tao-job-name": "x" + tag}))
    assert [j["name"] for j in lepton_fake.jobs(label=f"tao-job-name={tag}")] == [name]
    assert {name, other} <= {j["name"] for j in lepton_fake.jobs()}
    secret, value = f"tao.{tag}.mark.cancel_requested_by.1", f"v-{uuid.uuid4().hex}"
    assert client.secret.create([SecretItem(name=secret, value=value)])
    assert client.secret.delete(secret)
    ever = lepton_fake.secrets(values=False)["ever"]
    assert {"kind": "user", "name": secret} in ever
    assert value not in json.dumps(ever)


def test_image_pull_secrets_answer_the_sdk_raw_requests(lepton_fake: LeptonFake) -> None:
    name, key = _name("pull"), f"ngc-{uuid.uuid4().hex}"
    spec = {"registry_server": "https://nvcr.io", "username": "$oauthtoken", "password": key}
    body = {"metadata": {"name": name, "id": name}, "spec": spec}
    created = raw(lepton_fake, "POST", "/imagepullsecrets", json=body)
    assert created.status_code == 201, created.text
    listed = raw(lepton_fake, "GET", "/imagepullsecrets")
    assert any(s["metadata"]["id"] == name for s in listed.json()) and key not in listed.text
    assert raw(lepton_fake, "POST", "/imagepullsecrets", json=body).status_code == 409
    assert raw(lepton_fake, "DELETE", f"/imagepullsecrets/{name}").status_code == 200


# ---------------------------------------------------------------------------------------------- jobs: the API


def test_list_pagination_and_every_filter_the_client_sends(client: Any, lepton_fake: LeptonFake) -> None:
    suite = uuid.uuid4().hex[:8]
    ids = []
    for i in range(5):
        labels = {"suite": suite, "idx": str(i)}
        spec = job(_name(f"pg{i}"), ["true"], client=client, labels=labels, stopped=True)
        ids.append(client.job.create(spec).metadata.id_)
    wait_for(lambda: all(client.job.get(i).status.state == LeptonJobState.Stopped for i in ids), "all Stopped")
    every = client.job.list_all(query=f"suite={suite}")
    assert sorted(j.metadata.id_ for j in every) == sorted(ids)
    sent = [line for line in lepton_fake.requests() if f"suite%3D{suite}" in line]
    assert [line.split("page=")[1].split("&")[0] for line in sent] == ["1", "2"], "pages until an empty page"
    assert all("page_size=500" in line and "job_query_mode=alive_only" in line for line in sent)
    pages = [client.job.list_all(query=f"suite={suite}", page=n, page_size=2) for n in (1, 2, 3, 4)]
    assert [len(p) for p in pages] == [2, 2, 1, 0]
    assert sorted(j.metadata.id_ for p in pages for j in p) == sorted(ids)
    assert len(client.job.list_all(query=f"suite={suite},idx in (1,2)")) == 2
    assert len(client.job.list_all(query=f"suite={suite},idx!=1")) == 4
    assert len(client.job.list_all(query=f"suite={suite},!idx")) == 0
    assert [j.metadata.id_ for j in client.job.list_all(q=ids[3])] == [ids[3]]
    assert len(client.job.list_all(query=f"suite={suite}", status=["Stopped", "Running"])) == 5
    assert client.job.list_all(query=f"suite={suite}", status=["Running"]) == []
    plain = group_ids(client)["ng-plain"]
    assert len(client.job.list_all(query=f"suite={suite}", node_groups=[plain])) == 5
    assert client.job.list_all(query=f"suite={suite}", node_groups=[group_ids(client)["ng-lustre"]]) == []
    assert len(client.job.list_all(query=f"suite={suite}", created_by="ci-user@example.com")) == 5
    assert client.job.list_all(query=f"suite={suite}", created_by="someone@else") == []
    for job_id in ids:
        client.job.delete(job_id)


def test_wrong_token_is_401_and_forbid_mode_is_403(lepton_fake: LeptonFake) -> None:
    bad = lepton_fake.client(token="not-the-token")
    with pytest.raises(ClientError) as denied:
        bad.job.list_all()
    assert denied.value.response.status_code == 401
    assert denied.value.response.json() == {"code": "Unauthorized", "message": "invalid or expired token"}
    with pytest.raises(WorkspaceUnauthorizedError):
        bad.info()
    with configured(lepton_fake, auth="forbid"), pytest.raises(ClientError) as forbidden:
        lepton_fake.client().job.list_all()
    assert forbidden.value.response.status_code == 403
    assert lepton_fake.client().job.list_all(query="nothing=here") == []


def test_duplicate_id_is_409_and_bad_specs_are_400(client: Any) -> None:
    name = _name("dup")
    client.job.create(job(name, ["true"], client=client, stopped=True))
    with pytest.raises(ClientError) as dup:
        client.job.create(job(name, ["true"], client=client, stopped=True))
    assert dup.value.response.status_code == 409
    assert dup.value.response.json() == {"code": "AlreadyExists", "message": f"job {name} already exists"}
    with pytest.raises(ClientError) as shape:
        client.job.create(job(_name("bad"), ["true"], client=client, resource_shape="gpu.3xh100"))
    assert shape.value.response.status_code == 400 and "gpu.8xh100-80gb" in shape.value.response.json()["message"]
    with pytest.raises(ClientError) as label:
        client.job.create(job(_name("bad"), ["true"], client=client, labels={"k": "x" * 64}))
    assert label.value.response.status_code == 400
    client.job.delete(name)


def test_a_spec_over_the_body_limit_is_413(client: Any) -> None:
    envs = [{"name": f"BIG_{i}", "value": "x" * 100_000} for i in range(17)]
    with pytest.raises(ClientError) as big:
        client.job.create(job(_name("big"), ["true"], client=client, envs=envs))
    assert big.value.response.status_code == 413


# ---------------------------------------------------------------------------------------------- replicas run


def test_a_replica_runs_with_lepton_worker_env_shm_gpus_and_its_logs(client: Any, lepton_fake: LeptonFake) -> None:
    name = _name("env")
    script = "env | grep -E '^(LEPTON_|NVIDIA_VISIBLE)' | sort; df -k /dev/shm | tail -1; echo last-line"
    spec = job(name, ["sh", "-c", script], client=client, resource_shape="gpu.1xh100-80gb", shared_memory_size=256)
    created = client.job.create(spec)
    assert created.metadata.id_ == name and created.status.job_name == name
    done = wait_job(client, name, FINAL)
    assert done.status.state == LeptonJobState.Completed and done.status.succeeded == 1
    states = [h["state"] for h in lepton_fake.job_named(name)[0]["history"]]
    assert states == ["Queueing", "Starting", "Running", "Completed"]
    lines = log_lines(client, name, direction="forward")
    env = dict(line.split("=", 1) for line in lines if "=" in line)
    assert env["LEPTON_JOB_WORKER_INDEX"] == "0" and env["LEPTON_JOB_TOTAL_WORKERS"] == "1"
    assert env["LEPTON_JOB_WORKER_PREFIX"] == name and env["LEPTON_SUBDOMAIN"] == f"{name}-job-svc"
    assert env["LEPTON_JOB_NAME"] == name and env["LEPTON_WORKSPACE_ID"] == "ws-ci"
    assert env["LEPTON_RESOURCE_ACCELERATOR_NUM"] == "1" and env["NVIDIA_VISIBLE_DEVICES"]
    assert any(line.split()[1] == "262144" for line in lines if "/dev/shm" in line), lines
    assert lines[-1] == "last-line"
    assert log_lines(client, name, direction="backward", limit=1) == ["last-line"]
    replicas = client.job.get_replicas(name)
    assert [r.id_ for r in replicas] == [r.metadata.id_ for r in replicas]
    assert replicas[0].metadata.id_.startswith(f"{name}-0-") and replicas[0].status.node.name
    assert "last-line" in "".join(client.job.get_log(name, replicas[0], timeout=10))
    assert [e.reason for e in client.job.get_events(name)][-1] == "Completed"
    containers = [c for c in lepton_fake.containers() if c["job"] == name]
    assert len(containers) == 1 and containers[0]["state"] == "exited"


def test_two_replicas_resolve_each_other_by_the_master_name(client: Any) -> None:
    name = _name("mn")
    program = (
        "import os, socket, time\n"
        "index = int(os.environ['LEPTON_JOB_WORKER_INDEX'])\n"
        "master = f\"{os.environ['LEPTON_JOB_WORKER_PREFIX']}-0.{os.environ['LEPTON_SUBDOMAIN']}\"\n"
        "if index == 0:\n"
        "    server = socket.create_server(('', 29400)); conn, _ = server.accept()\n"
        "    print('rank0 got', conn.recv(64).decode(), flush=True)\n"
        "else:\n"
        "    for _ in range(100):\n"
        "        try:\n"
        "            socket.create_connection((master, 29400), timeout=2).sendall(b'hello-from-1'); break\n"
        "        except OSError:\n"
        "            time.sleep(0.1)\n"
        "    else:\n"
        "        raise SystemExit('master never answered')\n"
        "    print('rank1 reached', master, flush=True)\n"
    )
    spec = job(
        name,
        ["python3", "-c", program],
        client=client,
        image=PYTHON,
        completions=2,
        parallelism=2,
        intra_job_communication=True,
    )
    client.job.create(spec)
    done = wait_job(client, name, FINAL)
    assert done.status.state == LeptonJobState.Completed and done.status.succeeded == 2
    replicas = sorted(client.job.get_replicas(name), key=lambda r: r.metadata.id_)
    assert [r.metadata.id_[: len(name) + 2] for r in replicas] == [f"{name}-0", f"{name}-1"]
    lines = log_lines(client, name)
    assert "rank0 got hello-from-1" in lines and f"rank1 reached {name}-0.{name}-job-svc" in lines


def test_replicas_reach_nothing_but_the_host_gateway(client: Any, lepton_fake: LeptonFake) -> None:
    network = lepton_fake.network()
    assert network["internal"] is True and network["gateway"]
    listener = socket.create_server(("0.0.0.0", 0))  # a service of this machine, e.g. an S3 endpoint
    listener.settimeout(30)
    port = listener.getsockname()[1]
    name = _name("net")
    probe = (
        "import socket\n"
        f"socket.create_connection(('{network['gateway']}', {port}), timeout=5).sendall(b'hi')\n"
        "try:\n"
        "    socket.create_connection(('192.0.2.1', 80), timeout=1); print('outbound open')\n"
        "except OSError as exc:\n"
        "    print('outbound closed', type(exc).__name__)\n"
    )
    try:
        client.job.create(job(name, ["python3", "-c", probe], client=client, image=PYTHON))
        connection, _ = listener.accept()
        assert connection.recv(2) == b"hi"
        connection.close()
    finally:
        listener.close()
    assert wait_job(client, name, FINAL).status.state == LeptonJobState.Completed
    assert [line.split()[0:2] for line in log_lines(client, name)] == [["outbound", "closed"]]


def test_a_secret_reference_resolves_at_start_and_a_missing_one_holds_the_replica(
    client: Any, lepton_fake: LeptonFake
) -> None:
    secret, value = f"tao.{uuid.uuid4().hex[:8]}.TOKEN", uuid.uuid4().hex
    name = _name("sec")
    envs = [{"name": "MY_TOKEN", "value_from": {"secret_name_ref": secret}}]
    digest = hashlib.md5(value.encode()).hexdigest()  # the check names a digest, never the value
    check = f'[ "$(printf %s "$MY_TOKEN" | md5sum | cut -c1-32)" = "{digest}" ] && echo secret-ok'
    client.job.create(job(name, ["sh", "-c", check], client=client, envs=envs))
    issue = wait_for(
        lambda: (
            [r["status"].get("readiness_issue") for r in raw(lepton_fake, "GET", f"/jobs/{name}/replicas").json()]
            == [{"reason": "ConfigError", "message": f'secret "{secret}" not found', "creationTimestamp": ANY}]
        ),
        "a ConfigError for the missing secret",
    )
    assert issue and client.job.get(name).status.state == LeptonJobState.Starting
    client.secret.create([SecretItem(name=secret, value=value)])
    done = wait_job(client, name, FINAL)
    assert done.status.state == LeptonJobState.Completed and "secret-ok" in log_lines(client, name)
    leaks = [s for s in lepton_fake.secrets()["ever"] if s["name"] == secret]
    assert leaks and leaks[0]["in_job_specs"] == [], "the value is not in any job spec"
    client.secret.delete(secret)


def test_a_mount_binds_the_volume_folder_within_the_storage_permissions(client: Any, lepton_fake: LeptonFake) -> None:
    name, sub = _name("mnt"), uuid.uuid4().hex[:6]
    mounts = [{"path": f"/lustre/fsw/portfolios/ci/{sub}", "from": "node-nfs:lustre-fs", "mount_path": "/mnt/lustre"}]
    write = ["sh", "-c", "echo written > /mnt/lustre/out.txt"]
    spec = job(name, write, client=client, group="ng-lustre", mounts=mounts)
    client.job.create(spec)
    assert wait_job(client, name, FINAL).status.state == LeptonJobState.Completed
    host = lepton_fake.volumes()["lustre-fs"] / "fsw" / "portfolios" / "ci" / sub / "out.txt"
    assert host.read_text() == "written\n"
    outside = [{"path": "/lustre/elsewhere", "from": "node-nfs:lustre-fs", "mount_path": "/mnt/lustre"}]
    denied = _name("mnt")
    client.job.create(job(denied, ["true"], client=client, group="ng-lustre", mounts=outside))
    wait_for(
        lambda: "permission denied" in str(raw(lepton_fake, "GET", f"/jobs/{denied}/replicas").json()),
        "a ConfigError for the path outside the permissions",
    )
    not_attached = [{"path": "/", "from": "node-nfs:lustre-fs", "mount_path": "/mnt/lustre"}]
    with configured(lepton_fake, mount_check="create"), pytest.raises(ClientError) as at_create:
        client.job.create(job(_name("mnt"), ["true"], client=client, group="ng-plain", mounts=not_attached))
    assert at_create.value.response.status_code == 400
    client.job.delete(denied)


# ---------------------------------------------------------------------------------------------- failures


def test_an_image_that_cannot_be_pulled_shows_in_replicas_events_and_analysis(
    client: Any, lepton_fake: LeptonFake
) -> None:
    name = _name("pull")
    client.job.create(job(name, ["true"], client=client, image="nvcr.io/nvidia/tao/tao-toolkit:0.0.0-nope"))

    def issue() -> dict[str, Any] | None:
        replicas = raw(lepton_fake, "GET", f"/jobs/{name}/replicas").json()
        return replicas[0]["status"].get("readiness_issue") if replicas else None

    wait_for(lambda: (issue() or {}).get("message") == "Pulling image", "InProgress / Pulling image first")
    failed = wait_for(lambda: (i := issue()) and i["reason"] == "Failed" and i, "readiness Failed")
    assert "Failed to pull image" in failed["message"]
    seen = client.job.get(name)
    assert seen.status.state == LeptonJobState.Starting and (seen.status.ready, seen.status.active) == (0, 1)
    events = raw(lepton_fake, "GET", f"/jobs/{name}/events").json()
    assert any(e["reason"] == "Failed" and "Failed to pull image" in e["message"] for e in events)
    assert raw(lepton_fake, "GET", f"/jobs/{name}/failure-analysis").json()["err_class"] == "ERR_INFRA"
    client.job.delete(name)


def test_an_oom_is_a_real_kill_reported_as_the_oom_node_event(client: Any, lepton_fake: LeptonFake) -> None:
    name = _name("oom")
    hog = "import time; blocks = [bytearray(16 << 20) for _ in range(32)]; time.sleep(5)"
    with configured(lepton_fake, world={"shape_overrides": {"ng-plain": {"cpu.small": {"memory_in_mb": 64}}}}):
        client.job.create(job(name, ["python3", "-c", hog], client=client, image=PYTHON))
        done = wait_job(client, name, FINAL)
    assert done.status.state == LeptonJobState.Failed and done.status.failed == 1
    analysis = raw(lepton_fake, "GET", f"/jobs/{name}/failure-analysis").json()
    assert [e["node_event_name"] for e in analysis["job_failure_by_node_event"]] == ["OOM"]
    assert "OOM encountered, victim process: python3" in analysis["job_failure_by_node_event"][0]["message"]
    assert [(r["reason"], r["exit_code"]) for r in lepton_fake.job_named(name)[-1]["replicas"]] == [("OOMKilled", 137)]
    assert any(e.reason == "OOMKilling" for e in client.job.get_events(name))


def test_a_non_zero_exit_fails_the_job_with_its_exit_code(client: Any, lepton_fake: LeptonFake) -> None:
    name = _name("exit")
    client.job.create(job(name, ["sh", "-c", "echo about to fail; exit 3"], client=client))
    done = wait_job(client, name, FINAL)
    assert done.status.state == LeptonJobState.Failed and done.status.failed == 1
    analysis = raw(lepton_fake, "GET", f"/jobs/{name}/failure-analysis").json()
    assert analysis["err_class"] == "ERR_PROGRAM"
    assert analysis["log_streams"][0]["lines"] == ["about to fail"]
    assert [r["exit_code"] for r in lepton_fake.job_named(name)[-1]["replicas"]] == [3]
    replica = raw(lepton_fake, "GET", f"/jobs/{name}/replicas").json()[0]
    assert "last_termination" not in replica["status"], "no client model has a job replica's termination"
    assert any(e.reason == "BackoffLimitExceeded" for e in client.job.get_events(name))
    with configured(lepton_fake, failure_analysis=False):
        assert raw(lepton_fake, "GET", f"/jobs/{name}/failure-analysis").status_code == 404


def test_an_env_over_the_exec_limit_is_a_start_failure_with_the_runtime_message(
    client: Any, lepton_fake: LeptonFake
) -> None:
    name = _name("e2big")
    envs = [{"name": "HUGE", "value": "y" * 200_000}]  # one string over Linux's MAX_ARG_STRLEN (128 KiB)
    client.job.create(job(name, ["true"], client=client, envs=envs))
    done = wait_job(client, name, FINAL)
    assert done.status.state == LeptonJobState.Failed
    assert [(r["reason"], r["exit_code"]) for r in lepton_fake.job_named(name)[-1]["replicas"]] == [("StartError", 128)]
    analysis = client.job._get(f"/jobs/{name}/failure-analysis").json()
    assert "argument list too long" in analysis["suggestion"]


def test_retries_follow_max_failure_retry_then_max_job_failure_retry(client: Any, lepton_fake: LeptonFake) -> None:
    name = _name("retry")
    client.job.create(job(name, ["sh", "-c", "exit 2"], client=client, max_failure_retry=1, max_job_failure_retry=1))
    done = wait_job(client, name, FINAL)
    assert done.status.state == LeptonJobState.Failed
    assert done.status.failed == 4, "2 replica runs per attempt, 2 attempts"
    assert len(done.status.job_history) == 1 and done.status.job_history[0].state == LeptonJobState.Failed
    states = [h["state"] for h in lepton_fake.job_named(name)[0]["history"]]
    assert states.count("Running") == 2 and states.index("PendingRetry") < states.index("Restarting")
    assert states[-1] == "Failed"


def test_eviction_and_an_unhealthy_node_as_injected(client: Any, lepton_fake: LeptonFake) -> None:
    evicted = _name("evict")
    client.job.create(job(evicted, ["sleep", "30"], client=client))
    wait_job(client, evicted, ("Running",))
    assert lepton_fake.inject("evict", id=evicted)["applied_to"] == [evicted]
    assert wait_job(client, evicted, FINAL).status.state == LeptonJobState.Failed
    analysis = raw(lepton_fake, "GET", f"/jobs/{evicted}/failure-analysis").json()
    assert analysis["job_failure_by_node_event"][0]["node_event_name"] == "Evicted"
    assert any(e.reason == "Evicted" for e in client.job.get_events(evicted))
    exited = _name("exit")
    client.job.create(job(exited, ["sleep", "30"], client=client))
    wait_job(client, exited, ("Running",))
    lepton_fake.inject("exit", id=exited, code=7)
    assert wait_job(client, exited, FINAL).status.state == LeptonJobState.Failed
    assert [r["exit_code"] for r in lepton_fake.job_named(exited)[-1]["replicas"]] == [7]
    sick = _name("sick")
    assert lepton_fake.inject("unhealthy_node", name=sick)["pending"]
    client.job.create(job(sick, ["true"], client=client))
    wait_for(
        lambda: "ConfigError" in str(raw(lepton_fake, "GET", f"/jobs/{sick}/replicas").json()),
        "the unhealthy node's ConfigError",
    )
    assert client.job.get(sick).status.state == LeptonJobState.Starting
    client.job.delete(sick)


def test_no_capacity_keeps_a_job_queueing_without_a_node(client: Any, lepton_fake: LeptonFake) -> None:
    name = _name("queue")
    lepton_fake.capacity(ng_plain=0)
    try:
        client.job.create(job(name, ["true"], client=client, resource_shape="gpu.1xh100-80gb"))
        time.sleep(0.5)
        assert client.job.get(name).status.state == LeptonJobState.Queueing
        replica = raw(lepton_fake, "GET", f"/jobs/{name}/replicas").json()[0]
        assert "node" not in replica["status"] and replica["status"]["readiness_issue"]["reason"] == "NoCapacity"
    finally:
        lepton_fake.capacity(ng_plain=None)
    assert wait_job(client, name, FINAL).status.state == LeptonJobState.Completed


# ---------------------------------------------------------------------------------------------- lifecycle


def test_stop_start_and_delete(client: Any, lepton_fake: LeptonFake) -> None:
    name = _name("life")
    with configured(lepton_fake, stop_grace_seconds=0, ready_seconds=2):
        client.job.create(job(name, ["sleep", "60"], client=client))
        first = wait_job(client, name, ("Running",))
        assert (first.status.ready, first.status.active) == (0, 1), "Running with ready < active first"
        wait_for(lambda: client.job.get(name).status.ready == 1, "the replica to turn ready")
        assert client.job.update(name, spec={"spec": {"stopped": True}})
        assert wait_job(client, name, ("Stopped",)).status.active == 0
        client.job.update(name, spec={"spec": {"stopped": False}})
        wait_job(client, name, ("Running",))
        assert client.job.delete(name)
        wait_for(lambda: name not in [j.metadata.id_ for j in client.job.list_all(q=name)], "gone from alive_only")
    assert client.job.get(name).status.state == LeptonJobState.Deleted
    with pytest.raises(ClientError) as gone:
        client.job.get(name, job_query_mode="alive_only")
    assert gone.value.response.status_code == 404
    states = [h["state"] for h in lepton_fake.job_named(name)[0]["history"]]
    stopping = states.index("Stopping")
    assert states[stopping : stopping + 3] == ["Stopping", "Stopped", "Queueing"]
    assert states[-2:] == ["Deleting", "Deleted"]
    assert not [c for c in lepton_fake.containers() if c["job"] == name], "the containers are removed"


@pytest.mark.parametrize("mode", ["accept", "ignore", "reject"])
def test_patching_labels_follows_the_configured_server_behaviour(
    client: Any, lepton_fake: LeptonFake, mode: str
) -> None:
    name = _name("lbl")
    client.job.create(job(name, ["true"], client=client, labels={"keep": "1"}, stopped=True))
    with configured(lepton_fake, patch_labels=mode):
        if mode == "reject":
            with pytest.raises(ClientError) as rejected:
                client.job.update(name, spec={"metadata": {"labels": {"added": "2"}}})
            assert rejected.value.response.json() == {"code": "InvalidRequest", "message": "no valid field to update"}
        else:
            assert client.job.update(name, spec={"metadata": {"labels": {"added": "2"}}})
        assert client.job.update(name, spec={"spec": {"stopped": True}}), "stop / start works in every mode"
    expected = {"keep": "1", "added": "2"} if mode == "accept" else {"keep": "1"}
    assert client.job.get(name).metadata.labels == expected
    client.job.delete(name)


def test_a_finished_job_is_archived_after_its_ttl(client: Any) -> None:
    name = _name("ttl")
    client.job.create(job(name, ["true"], client=client, ttl_seconds_after_finished=1))
    wait_job(client, name, ("Archived",), timeout=30)
    assert name not in [j.metadata.id_ for j in client.job.list_all(q=name)]
    assert [j.metadata.id_ for j in client.job.list_all(q=name, job_query_mode="archive_only")] == [name]
    archived = client.job.get(name)
    assert archived.status.state == LeptonJobState.Archived and archived.status.succeeded == 1


# ---------------------------------------------------------------------------------------------- faults, logs, stats


def test_503_bursts_and_429_on_logs(client: Any, lepton_fake: LeptonFake) -> None:
    lepton_fake.faults(503, seconds=1.0, route="GET /jobs")
    with pytest.raises(ServerError) as unavailable:
        client.job.list_all(query="x=y")
    assert unavailable.value.response.status_code == 503
    assert client.shapes.list_shapes(), "other routes still answer"
    wait_for(lambda: _lists(client), "the burst to end")
    lepton_fake.faults(429, seconds=30, route="GET /logs", retry_after=2)
    try:
        with pytest.raises(LogAPIError) as limited:
            log_lines(client, "any-job")
        assert limited.value.status_code == 429 and limited.value.retry_after == 2
    finally:
        lepton_fake.clear_faults()
    assert any(line.startswith("GET /api/v2/workspaces/ws-ci/logs") for line in lepton_fake.requests())


def _lists(client: Any) -> bool:
    try:
        client.job.list_all(query="x=y")
        return True
    except ServerError:
        return False


def test_a_hang_fault_times_the_client_out(lepton_fake: LeptonFake) -> None:
    lepton_fake.faults("timeout", seconds=2, route="GET /workspace", hold_seconds=2)
    try:
        with pytest.raises(requests.exceptions.ReadTimeout):
            raw(lepton_fake, "GET", "/workspace", timeout=0.5)
    finally:
        lepton_fake.clear_faults()


# ---------------------------------------------------------------------------------------------- other servers


def test_suffix_id_mode_returns_an_id_that_is_not_the_name(lepton_fake_factory: Callable[..., LeptonFake]) -> None:
    fake = lepton_fake_factory("--id-mode", "suffix", "--config", json.dumps({"settings": {"start_seconds": 0}}))
    client = fake.client()
    created = client.job.create(job("same-name", ["true"], client=client))
    job_id = created.metadata.id_
    assert job_id.startswith("same-name-") and len(job_id) == len("same-name-") + 4
    assert created.metadata.name == "same-name" and created.status.job_name == job_id
    with pytest.raises(ClientError) as by_name:
        client.job.get("same-name")
    assert by_name.value.response.status_code == 404
    second = client.job.create(job("same-name", ["true"], client=client)).metadata.id_
    assert second != job_id, "two jobs may share a name; their ids differ"
    assert {j.metadata.id_ for j in client.job.list_all(q="same-name")} == {job_id, second}
    assert wait_job(client, job_id, FINAL).status.state == LeptonJobState.Completed
    fake.config(unique_names=True)
    with pytest.raises(ClientError) as unique:
        client.job.create(job("same-name", ["true"], client=client))
    assert unique.value.response.status_code == 409


def test_the_sim_server_runs_jobs_without_containers(lepton_fake_factory: Callable[..., LeptonFake]) -> None:
    fake = lepton_fake_factory("--sim", "--config", json.dumps({"settings": {"sim_seconds": 1.5, "start_seconds": 0}}))
    client = fake.client()
    name = _name("sim")
    client.job.create(job(name, ["python3", "train.py"], client=client, image="nvcr.io/nvidia/tao/tao-toolkit:6"))
    assert wait_job(client, name, FINAL).status.state == LeptonJobState.Completed
    assert log_lines(client, name, direction="forward")[:2] == ["step 0", "step 1"]
    assert fake.containers() and all(c["id"].startswith("sim-") for c in fake.containers())
