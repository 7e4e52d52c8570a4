"""TAODockerHook without a daemon: settings, validation before submission, GPU requests, the log cursor, the launcher.

The real engine is in tests/integration/docker/.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from typing import Any

import pytest

from airflow_provider_tao.hooks.base import LOG_READ_LIMIT, JobValidationError
from airflow_provider_tao.hooks.docker import client as docker_client
from airflow_provider_tao.hooks.docker import hook as dk
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.jobs import JobHandle, JobSpec, JobState, JobStatus
from tests.unit.fakes import FakeHook, Store, make_context


def _hook(monkeypatch: pytest.MonkeyPatch, host: str | None = "unix:///d.sock", **extra: Any) -> dk.TAODockerHook:
    conn: dict[str, Any] = {"conn_type": "tao_docker", "extra": extra}
    if host:
        conn["host"] = host
    monkeypatch.setenv("AIRFLOW_CONN_DOCKER_T", json.dumps(conn))
    hook = dk.TAODockerHook("docker_t")
    hook.load_connection()
    return hook


def _spec(**kwargs: Any) -> JobSpec:
    return JobSpec(
        **{"name": "dag-train-0123456789", "job_id": "abc123", "command": "train", "image": "img:1", **kwargs}
    )


# --------------------------------------------------------------------------- settings


def test_settings_come_from_the_connection_then_the_docker_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://gpu-box:2376")
    monkeypatch.setenv("DOCKER_NETWORK", "tao_net")
    monkeypatch.setenv("DOCKER_AUTO_REMOVE", "true")
    hook = _hook(monkeypatch, host=None)
    assert (hook.base_url, hook.network, hook.auto_remove) == ("tcp://gpu-box:2376", "tao_net", True)
    assert hook.cancel_grace_seconds == 10 and hook.default_results_root() is None
    assert not hook.daemon_is_local

    hook = _hook(monkeypatch, network="jobs", auto_remove=False, results_root="/data/res/", cancel_grace_seconds=3)
    assert (hook.base_url, hook.network, hook.auto_remove) == ("unix:///d.sock", "jobs", False)
    assert hook.default_results_root() == "/data/res" and hook.cancel_grace_seconds == 3
    assert hook.daemon_is_local and hook.results_dir_for(_spec()) == "/data/res/abc123"


def test_defaults_without_any_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DOCKER_HOST", "DOCKER_NETWORK", "DOCKER_AUTO_REMOVE"):
        monkeypatch.delenv(name, raising=False)
    hook = dk.TAODockerHook(None)
    hook.load_connection()
    assert (hook.base_url, hook.network, hook.auto_remove) == (docker_client.DEFAULT_SOCKET, "tao_default", False)


def test_registry_credentials_go_to_the_pull_of_matching_images_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_DOCKER_T",
        json.dumps({"conn_type": "tao_docker", "password": "ngc-key", "extra": {"registry": "nvcr.io"}}),
    )
    hook = dk.TAODockerHook("docker_t")
    hook.load_connection()
    auth = hook._auth("nvcr.io/nvidia/tao/tao-toolkit:6.0-pyt")
    assert auth == {"auth_config": {"username": "$oauthtoken", "password": "ngc-key", "serveraddress": "nvcr.io"}}
    assert hook._auth("docker.io/library/python:3") == {}
    assert _hook(monkeypatch)._auth("nvcr.io/x:1") == {}  # no key, no auth


# --------------------------------------------------------------------------- validation before submission


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_nodes": 2}, "num_nodes: the docker platform runs single-node jobs only"),
        ({"backend_details": {"partition": "gpu"}}, "backend_details['partition']: is not a docker platform setting"),
        ({"backend_details": {"gpu_ids": ["0", "1"]}}, "names 2 GPU(s) but gpu_count=1. Set gpu_count=2"),
        ({"backend_details": {"gpu_ids": ""}}, "backend_details['gpu_ids']: [''] names no GPU"),
        ({"backend_details": {"user": "trainer"}}, "backend_details['user']: 'trainer' is not numeric"),
        ({"backend_details": {"mounts": "/data:/data"}}, "backend_details['mounts']: '/data:/data' is not a list"),
        ({"backend_details": {"mounts": ["/data"]}}, "'/data' is not host:container[:ro]"),
        ({"backend_details": {"mounts": ["/a:/b:rx"]}}, "'/a:/b:rx' is not host:container[:ro]"),
        ({"backend_details": {"cpus": "many"}}, "backend_details['cpus']: 'many' is not a positive number"),
        ({"results_uri": "results/here"}, "results_uri: 'results/here' is neither a folder"),
        ({"gpu_count": -2}, "gpu_count: -2 is not allowed"),
    ],
)
def test_bad_input_is_refused_before_submission(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(JobValidationError) as exc:
        _hook(monkeypatch).validate_spec(_spec(**kwargs))
    assert message in str(exc.value)


def test_good_details_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    details = {
        "mem_limit": "8g",
        "cpus": 2.5,
        "shm_size": "4g",
        "mounts": ["/data:/data:ro", "/scratch:/scratch"],
        "user": "1000:100",
        "entrypoint": "",
        "gpu_ids": "0,2",
        "working_dir": "/work",
        "mount_path": "/workspace",  # the operator's own key is not the platform's business
    }
    _hook(monkeypatch).validate_spec(_spec(gpu_count=2, backend_details=details))
    assert ct.container_owner({"user": "1000:100"}) == (1000, 100)
    assert ct.container_owner({"user": "1000"}) == (1000, 1000) and ct.container_owner({}) == (0, 0)


def test_the_operator_refuses_bad_docker_input_before_submitting(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_tao.operators.submit import TAOSubmitOperator

    _hook(monkeypatch)
    monkeypatch.setattr(dk.TAODockerHook, "find_job", lambda self, name: None)  # no earlier try's job to reattach
    op = TAOSubmitOperator(task_id="train", conn_id="docker_t", image="img:1", command="x", num_nodes=2)
    with pytest.raises(AirflowFailException, match="Bad input, nothing was submitted: num_nodes"):
        op.execute(make_context(Store()))  # the daemon at unix:///d.sock does not exist: nothing is asked of it
    no_image = TAOSubmitOperator(task_id="train", conn_id="docker_t", command="x")
    with pytest.raises(AirflowFailException, match="image: is required on the docker platform"):
        no_image.execute(make_context(Store()))


# --------------------------------------------------------------------------- GPUs and the container's settings


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> dk.TAODockerHook:
    """A hook whose client builds request bodies without a daemon (create_host_config is pure)."""
    import docker

    hook = _hook(monkeypatch, results_root="/res", shm_size="2g")
    hook.__dict__["client"] = docker.APIClient(base_url="unix:///d.sock", version="1.41")
    hook._tegra = False
    return hook


@pytest.mark.parametrize(
    ("gpu_count", "details", "request_", "env"),
    [
        (0, {}, None, {"NVIDIA_VISIBLE_DEVICES": "void"}),
        (2, {}, {"Count": 2, "DeviceIDs": []}, {}),
        (-1, {}, {"Count": -1, "DeviceIDs": []}, {}),
        (2, {"gpu_ids": ["1", "3"]}, {"Count": 0, "DeviceIDs": ["1", "3"]}, {}),
    ],
)
def test_gpu_counts_become_device_requests(
    offline: dk.TAODockerHook, gpu_count: int, details: dict[str, Any], request_: dict[str, Any] | None, env: Any
) -> None:
    spec = _spec(gpu_count=gpu_count, backend_details=details)
    config = offline._host_config(spec, details, "/res")
    if request_ is None:
        assert "DeviceRequests" not in config
    else:
        (request,) = config["DeviceRequests"]
        assert {k: request[k] for k in ("Count", "DeviceIDs")} == request_ and request["Capabilities"] == [["gpu"]]
    assert offline._gpu_env(spec) == env
    assert config["Binds"] == ["/res:/res:rw"] and config["Init"] is True and config["ShmSize"] == 2 << 30
    assert config["NetworkMode"] == "tao_default" and "Runtime" not in config


@pytest.mark.parametrize(
    ("gpu_count", "details", "visible"),
    [(1, {}, "0"), (3, {}, "0,1,2"), (-1, {}, "all"), (2, {"gpu_ids": ["0", "2"]}, "0,2")],
)
def test_tegra_gets_the_nvidia_runtime_and_visible_devices(
    offline: dk.TAODockerHook, gpu_count: int, details: dict[str, Any], visible: str
) -> None:
    offline._tegra = True
    spec = _spec(gpu_count=gpu_count, backend_details=details)
    config = offline._host_config(spec, details, None)
    assert config["Runtime"] == "nvidia" and "DeviceRequests" not in config
    assert offline._gpu_env(spec) == {"NVIDIA_VISIBLE_DEVICES": visible, "NVIDIA_DRIVER_CAPABILITIES": "all"}


def test_limits_mounts_and_shm_from_backend_details(offline: dk.TAODockerHook) -> None:
    details = {"mem_limit": "8g", "cpus": 1.5, "shm_size": "1g", "mounts": ["/data:/data:ro"]}
    config = offline._host_config(_spec(gpu_count=0, backend_details=details), details, None)
    assert config["Memory"] == config["MemorySwap"] == 8 << 30  # no swap: past the limit is an OOM kill
    assert config["NanoCpus"] == 1_500_000_000 and config["ShmSize"] == 1 << 30
    assert config["Binds"] == ["/data:/data:ro"]


# --------------------------------------------------------------------------- status and logs


def test_listed_states_map_to_the_shared_vocabulary(offline: dk.TAODockerHook, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    def listed(state: str, age: float = 1.0) -> dict[str, Any]:
        return {"State": state, "Status": f"{state} for a while", "Created": time.time() - age}

    assert offline._status("c", listed("created")).state is JobState.PENDING
    assert offline._status("c", listed("running")).state is JobState.RUNNING
    assert offline._status("c", listed("restarting")).state is JobState.RUNNING
    assert offline._status("c", listed("paused")).state is JobState.PAUSED
    never = offline._status("c", listed("created", age=ct.START_TIMEOUT_SECONDS + 5))
    assert never.state is JobState.ERROR and "never started" in never.message
    gone = offline._status("tao-job-x", None)
    assert gone.not_found and "removed outside Airflow" in gone.message

    verdicts = iter([JobStatus(JobState.ERROR, "exited with code 3", 3, "exited")])
    monkeypatch.setattr(offline, "_final_status", lambda name: next(verdicts))
    first = offline._status("c", listed("exited"))
    assert first.state is JobState.ERROR and offline._ended["c"] is first  # read once, kept


class _Frames:
    """What ``_log_stream`` returns: frames of ``<timestamp> <text>\\n`` and a close()."""

    def __init__(self, lines: list[tuple[str, str]], chunk: int = 7) -> None:
        data = "".join(f"{stamp} {text}\n" for stamp, text in lines).encode()
        self.frames = [data[i : i + chunk] for i in range(0, len(data), chunk)]
        self.closed = False

    def __iter__(self) -> Any:
        return iter(self.frames)

    def close(self) -> None:
        self.closed = True


T1, T2, T3 = "2026-11-25T10:00:01.000000001Z", "2026-11-25T10:00:01.500000000Z", "2026-11-25T10:00:02.000000000Z"


def test_logs_continue_from_the_cursor_without_repeats_or_gaps(
    offline: dk.TAODockerHook, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = [(T1, "a"), (T2, "b"), (T2, "c")]
    asked: list[dict[str, Any]] = []

    def stream(client: Any, name: str, params: dict[str, Any]) -> _Frames:
        asked.append(params)
        since = params.get("since", 0)
        lines = [(s, t) for s, t in log if ct.cursor_second(s) >= since]
        return _Frames(lines if params["tail"] == "all" else lines[-params["tail"] :])

    monkeypatch.setattr(dk, "_log_stream", stream)
    handle = JobHandle("docker", "docker_t", "abc123", "n")
    text, cursor = offline.get_job_logs(handle)
    assert (text, cursor) == ("a\nb\nc\n", f"{T2}#2") and "since" not in asked[-1]
    assert offline.get_job_logs(handle, cursor) == ("", cursor)  # nothing new: nothing repeated
    assert asked[-1]["since"] == ct.cursor_second(T2)
    log += [(T2, "d"), (T3, "e")]  # a line with the same timestamp as the last one shown, then a later one
    assert offline.get_job_logs(handle, cursor) == ("d\ne\n", f"{T3}#1")
    assert offline.get_job_logs(handle, tail=2) == ("d\ne\n", f"{T3}#1")
    assert asked[-1]["tail"] == 2


def test_one_log_read_stops_at_the_limit(offline: dk.TAODockerHook, monkeypatch: pytest.MonkeyPatch) -> None:
    line = "x" * 1000
    frames = _Frames([(T1, line)] * (LOG_READ_LIMIT // 1000 + 50), chunk=65536)
    monkeypatch.setattr(dk, "_log_stream", lambda client, name, params: frames)
    text, cursor = offline.get_job_logs(JobHandle("docker", "docker_t", "abc123", "n"))
    assert LOG_READ_LIMIT <= len(text) < LOG_READ_LIMIT + 1002 and frames.closed
    assert cursor == f"{T1}#{len(text) // 1001}"


# --------------------------------------------------------------------------- what goes into the container


def test_labels_name_the_task_instance_and_hold_no_secret() -> None:
    spec = _spec(
        secret_env={"TOKEN": "s3cr3t"}, origin={"dag_id": "d", "task_id": "t", "run_id": "r", "map_index": "-1"}
    )
    labels = ct.job_labels(spec, 2, "/res/abc123")
    assert labels == {
        "tao.nvidia.com/managed": "true",
        "tao.nvidia.com/job-id": "abc123",
        "tao.nvidia.com/job-name": "dag-train-0123456789",
        "tao.nvidia.com/try": "2",
        "tao.nvidia.com/results-dir": "/res/abc123",
        "tao.nvidia.com/dag-id": "d",
        "tao.nvidia.com/task-id": "t",
        "tao.nvidia.com/run-id": "r",
        "tao.nvidia.com/map-index": "-1",
    }
    assert "s3cr3t" not in json.dumps(ct.launcher_argv(spec.command)) and dk.container_name("abc") == "tao-job-abc"


def test_the_archive_carries_files_secrets_marks_and_the_results_folder() -> None:
    data = ct.job_archive(
        {"runner.pyz": b"PK", "sub/a.json": b"{}"}, {"TOKEN": "it's $x"}, {"owner_try": 1}, (1000, 100), ["/res/j1"]
    )
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        secret = tar.extractfile("tao-job/secret.env")
        assert secret is not None and "export TOKEN='it'\"'\"'s $x'" in secret.read().decode()
    assert set(members) == {
        "res/j1",
        "tao-job",
        "tao-job/files",
        "tao-job/marks",
        "tao-job/files/runner.pyz",
        "tao-job/files/sub",
        "tao-job/files/sub/a.json",
        "tao-job/secret.env",
        "tao-job/marks/owner_try",
    }
    assert all((m.uid, m.gid) == (1000, 100) for m in members.values())
    assert members["tao-job/secret.env"].mode == 0o600 and members["tao-job"].mode == 0o700
    marks = io.BytesIO()
    with tarfile.open(fileobj=marks, mode="w") as tar:
        for key, value in (("owner_try", b"2"), ("cancel_requested_by", b"1"), ("junk", b"not json")):
            info = tarfile.TarInfo(f"marks/{key}")
            info.size = len(value)
            tar.addfile(info, io.BytesIO(value))
    assert ct.read_mark_archive(marks.getvalue()) == {"owner_try": 2, "cancel_requested_by": 1}


def test_the_launcher_runs_a_string_under_one_shell_and_an_argv_verbatim() -> None:
    hostile = 'it\'s "q" $(echo no) `echo no` $HOME\nline2'
    argv = ct.launcher_argv(f"printf '%s' {json.dumps('x')} && printf '|%s' \"$0\"")
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert out in ("x|/bin/bash", "x|/bin/sh")
    out = subprocess.run(ct.launcher_argv(["printf", "%s", hostile]), capture_output=True, text=True, check=True).stdout
    assert out == hostile


def test_sync_wait_ends_when_the_platform_no_longer_knows_the_job(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.sdk.exceptions import AirflowException

    from airflow_provider_tao.operators.submit import TAOSubmitOperator

    op = TAOSubmitOperator(task_id="train", conn_id="fake_conn", image="i", command="x", poll_interval=0.01)
    original = FakeHook.create_job

    def vanishing(self: FakeHook, spec: JobSpec, try_number: int = 1) -> JobHandle:
        handle = original(self, spec, try_number)
        self.jobs.pop(spec.job_id)  # removed by hand right after it started
        return handle

    monkeypatch.setattr(fake_platform, "create_job", vanishing)
    with pytest.raises(AirflowException, match="no longer exists on the fake platform"):
        op.execute(make_context(Store()))


def test_find_job_tells_a_retrys_container_from_the_last_trys_made_in_the_same_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine's container list gives ``Created`` in whole seconds: a retry's container created in the same second
    as the ended one of the try before is the newest by its try (found by the crash-point explorer)."""
    hook = _hook(monkeypatch)

    def container(job_id: str, try_number: int) -> dict[str, Any]:
        labels = {ct.LABEL_JOB_ID: job_id, ct.LABEL_NAME: "n-0123456789", ct.LABEL_TRY: str(try_number)}
        return {"Id": job_id * 4, "State": "exited" if try_number == 1 else "running", "Created": 1700000000,
                "Labels": labels}  # fmt: skip

    listed = [container("bbbbbbbbbbbb", 2), container("aaaaaaaaaaaa", 1)]
    for order in (listed, listed[::-1]):
        monkeypatch.setattr(hook, "_list", lambda selector, order=order: order)
        found = hook.find_job("n-0123456789")
        assert found is not None and found.job_id == "bbbbbbbbbbbb"
