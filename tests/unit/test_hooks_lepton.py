"""LeptonHook without a server: the status map, the name rule, shape and volume choice, the files channel and its
size limits, the multi-node setup script, the log cursor, the error mapping. The hook against a Lepton API is tested
through the operator in ``tests/integration/lepton``."""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import re
import secrets
import subprocess
import tarfile
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_tao.failures import FailureFacts, classify
from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.hooks.lepton import api as la
from airflow_provider_tao.hooks.lepton import files as lf
from airflow_provider_tao.hooks.lepton import hook as lp
from airflow_provider_tao.hooks.lepton import placement as lpl
from airflow_provider_tao.hooks.lepton import status as ls
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.jobs import ErrClass, JobSpec, JobState
from airflow_provider_tao.runner.entrypoint import build_entrypoint

NOW = 1_800_000_000.0


def _job(state: str, *, ready: int = 0, active: int = 0, parallelism: int = 1, age: float = 10, **labels: str) -> Any:
    return {
        "metadata": {"id": "train-0123456789", "name": "train-0123456789", "created_at": (NOW - age) * 1000,
                     "labels": labels},
        "spec": {"parallelism": parallelism, "completions": parallelism},
        "status": {"state": state, "ready": ready, "active": active, "succeeded": 0, "failed": 0},
    }  # fmt: skip


# ----------------------------------------------------------------------------- the status map (the seed's)


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("Queueing", JobState.PENDING),
        ("Awaiting", JobState.PENDING),
        ("PendingRetry", JobState.PENDING),
        ("Starting", JobState.PENDING),
        ("Restarting", JobState.PENDING),
        ("Completed", JobState.COMPLETE),
        ("Stopped", JobState.PAUSED),
        ("Stopping", JobState.PAUSED),
        ("Deleting", JobState.CANCELING),
        ("Deleted", JobState.CANCELED),
        ("Failed", JobState.ERROR),
        ("Archived", JobState.ERROR),
    ],
)
def test_lepton_states_map_to_the_shared_vocabulary(state: str, expected: JobState) -> None:
    status = ls.job_status(_job(state), NOW)
    assert status.state is expected and status.raw_state == state
    assert status.exit_code == (0 if expected is JobState.COMPLETE else None)


def test_an_archived_job_that_completed_is_complete() -> None:
    job = _job("Archived")
    job["status"]["succeeded"] = 1
    assert ls.job_status(job, NOW).state is JobState.COMPLETE


def test_replica_readiness_is_the_pending_reason() -> None:
    pulling = ls.Readiness("InProgress", "Pulling image")
    status = ls.job_status(_job("Starting"), NOW, pulling)
    assert status.state is JobState.PENDING and status.message.endswith("InProgress: Pulling image")


def test_queueing_past_the_capacity_bound_is_no_capacity_err_capacity() -> None:
    assert ls.job_status(_job("Queueing", age=899), NOW).state is JobState.PENDING
    status = ls.job_status(_job("Queueing", age=901), NOW)
    assert status.state is JobState.ERROR and status.raw_state == "NoCapacity"
    assert "no capacity for 901 s (more than 900 s)" in status.message
    short = ls.job_status(_job("Queueing", age=31, **{ls.LABEL_CAPACITY: "30"}), NOW)  # the job's own bound
    assert short.state is JobState.ERROR
    assert classify(FailureFacts(raw_state=short.raw_state)).err_class is ErrClass.ERR_CAPACITY


def test_a_failed_image_pull_is_err_image_pull_at_once() -> None:
    failed = ls.Readiness("Failed", 'ImagePullBackOff: Failed to pull image "x": 401 Unauthorized')
    status = ls.job_status(_job("Starting", age=2), NOW, failed)
    assert status.state is JobState.ERROR and status.raw_state == "ImagePullFailed"
    assert classify(FailureFacts(raw_state=status.raw_state)).err_class is ErrClass.ERR_IMAGE_PULL


@pytest.mark.parametrize(
    ("readiness", "raw", "err_class"),
    [
        (ls.Readiness("ConfigError", "Mount point not found"), "ConfigError", ErrClass.ERR_INFRA),
        (ls.Readiness("InProgress", "Pulling image"), "ImagePullFailed", ErrClass.ERR_IMAGE_PULL),
        (None, "StartTimeout", ErrClass.ERR_INFRA),
    ],
)
def test_replicas_not_ready_past_the_start_bound_are_errors_named_by_their_readiness(
    readiness: ls.Readiness | None, raw: str, err_class: ErrClass
) -> None:
    job = _job("Starting", age=5000, **{ls.LABEL_START: "60"})
    assert ls.job_status(job, NOW, readiness, starting_since=NOW - 59).state is JobState.PENDING
    status = ls.job_status(job, NOW, readiness, starting_since=NOW - 61)
    assert status.state is JobState.ERROR and status.raw_state == raw
    assert classify(FailureFacts(raw_state=raw)).err_class is err_class
    assert err_class.retriable is (err_class is ErrClass.ERR_INFRA)


def test_the_most_telling_readiness_issue_wins() -> None:
    replicas = [
        {"status": {"readiness_issue": {"reason": "InProgress", "message": "Pulling image"}}},
        {"status": {"readiness_issue": {"reason": "ConfigError", "message": "Mount point not found"}}},
        {"status": {}},
    ]
    assert ls.readiness_of(replicas) == ls.Readiness("ConfigError", "Mount point not found")
    assert ls.readiness_of([{"status": {"readiness_issue": {"reason": "Ready", "message": ""}}}]) is None


def test_failure_facts_come_from_events_and_the_servers_analysis() -> None:
    failed = ls.job_status(_job("Failed"), NOW)
    analysis = {
        "job_failure_by_node_event": [{"node_event_name": "OOMKilling", "message": "node ran out of memory"}],
        "log_streams": [{"lines": ["CUDA error: out of memory"]}],
        "err_class": "OOM",
    }
    replicas = [{"id": "j-0-abcde", "status": {"last_termination": {"reason": "Error", "exit_code": 137}}}]
    events = [{"type": "Normal", "reason": "Pulled", "message": "ok"}, {"reason": "BackOff", "message": "restarting"}]
    facts = ls.failure_facts_of(
        failed, replicas=replicas, events=events, analysis=analysis, log_tail=["epoch 1"], job="j", workspace="ws1"
    )
    # a replica's termination record is in no client model: not read (the node event says OOM)
    assert (facts.exit_code, facts.oom_killed, facts.raw_state) == (None, True, "Failed")
    assert facts.events == ["node event OOMKilling: node ran out of memory", "event BackOff: restarting"]
    assert facts.log_tail == ["epoch 1", "CUDA error: out of memory"]
    assert facts.details["replicas"] == ["j-0-abcde"] and facts.details["lepton_err_class"] == "OOM"
    assert classify(facts).err_class is ErrClass.ERR_OOM
    preempted = ls.failure_facts_of(
        failed,
        replicas=[],
        events=[{"reason": "Preempted", "message": "container exited with code 143"}],
        analysis={},
        log_tail=[],
        job="j",
        workspace="ws1",
    )
    assert (preempted.raw_state, preempted.exit_code, preempted.oom_killed) == ("Evicted", 143, False)
    assert classify(preempted).err_class is ErrClass.ERR_PREEMPTED


# ----------------------------------------------------------------------------- the 36-character name rule


@given(
    prefix=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", max_size=120),
    digest=st.text(alphabet="0123456789abcdef", min_size=10, max_size=10),
)
@settings(max_examples=300, deadline=None)
def test_every_deterministic_name_passes_leptons_own_validation_and_keeps_the_digest(prefix: str, digest: str) -> None:
    from leptonai.api.v2.job_validation import validate_job_name

    from airflow_provider_tao.operators.submit import _readable

    name = lp.LeptonHook().job_name_for(_readable(prefix), digest)
    validate_job_name(name)  # the client's own check before every POST
    lp.LeptonHook().validate_name(name)
    assert len(name) <= 36 and name.endswith(f"-{digest}")


def test_a_long_dag_and_task_keep_a_readable_prefix() -> None:
    name = lp.LeptonHook().job_name_for("nightly-retraining-pipeline-train-detector", "0123456789")
    assert name == "nightly-retraining-pipeli-0123456789" and len(name) <= 36


def test_names_the_client_would_refuse_are_refused_before_submission() -> None:
    hook = lp.LeptonHook()
    for bad in ("Train-0123456789", "1train", "x" * 37, "train-"):
        with pytest.raises(JobValidationError, match="job_name"):
            hook.validate_name(bad)


# ----------------------------------------------------------------------------- shapes and volumes

SHAPES = [
    {"id": "cpu.small", "gpus": 0, "cpu": 2.0, "memory_mb": 8192},
    {"id": "cpu.large", "gpus": 0, "cpu": 16.0, "memory_mb": 65536},
    {"id": "gpu.1xh100-80gb", "gpus": 1, "cpu": 16.0, "memory_mb": 204800},
    {"id": "gpu.2xh100-80gb", "gpus": 2, "cpu": 32.0, "memory_mb": 409600},
    {"id": "gpu.8xh100-80gb", "gpus": 8, "cpu": 128.0, "memory_mb": 1638400},
]


@pytest.mark.parametrize(
    ("gpus", "shape"),
    [(0, "cpu.small"), (1, "gpu.1xh100-80gb"), (2, "gpu.2xh100-80gb"), (4, "gpu.8xh100-80gb"), (-1, "gpu.8xh100-80gb")],
)
def test_shapes_are_resolved_from_gpu_count(gpus: int, shape: str) -> None:
    picked = lpl.pick_shape(SHAPES, gpus)
    assert picked is not None and picked["id"] == shape


def test_no_shape_fits_is_none() -> None:
    assert lpl.pick_shape(SHAPES, 16) is None and lpl.pick_shape(SHAPES[2:], 0) is None


@pytest.mark.parametrize(
    ("names", "chosen"),
    [
        (["scratch", "filestore-fs", "lustre-fs"], "lustre-fs"),
        (["scratch", "home-filestore"], "home-filestore"),
        (["scratch", "data"], "scratch"),
        ([], None),
    ],
)
def test_the_volume_preference_is_lustre_then_filestore_then_the_first(names: list[str], chosen: str | None) -> None:
    picked = lpl.pick_volume([{"name": n} for n in names])
    assert (picked or {}).get("name") == chosen


def test_only_a_lustre_mount_is_the_runners_input_cache() -> None:
    lustre = lpl.Placement("s", 0, volume_mount="/mnt/lustre-fs", volume_kind="lustre")
    filestore = lpl.Placement("s", 0, volume_mount="/mnt/fs", volume_kind="filestore")
    assert (lustre.cache_path, lustre.results_root) == ("/mnt/lustre-fs", "/mnt/lustre-fs/results")
    assert (filestore.cache_path, filestore.results_root) == (None, "/mnt/fs/results")
    assert lpl._mount_source({"name": "lustre-fs", "from": "nfs"}) == "node-nfs:lustre-fs"


# ----------------------------------------------------------------------------- the files channel


def _unpack(text: str) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(base64.b64decode(text)))) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_files_in_env_are_chunks_under_linuxs_limit_that_join_to_the_archive() -> None:
    files = {"script_runner.py": secrets.token_bytes(300 * 1024), "runner.json": b"{}"}
    env = ct.files_in_env(files, lf.ENV_PART_SIZE, setup=b"export X=1\n")
    count = int(env[ct.PARTS_ENV_COUNT])
    chunks = [env[f"{ct.PARTS_ENV_PREFIX}{i}"] for i in range(count)]
    assert count == 4 and all(len(f"{ct.PARTS_ENV_PREFIX}{i}={c}") < 128 * 1024 for i, c in enumerate(chunks))
    assert _unpack("".join(chunks)) == {
        "files/script_runner.py": files["script_runner.py"],
        "files/runner.json": b"{}",
        "setup.sh": b"export X=1\n",
    }


def test_one_staged_part_fits_one_staging_jobs_environment() -> None:
    part = secrets.token_bytes(lf.ENV_FILES_BUDGET * 3 // 4 - 4096)  # incompressible, the largest part
    env = ct.files_in_env({"part-000": part}, lf.ENV_PART_SIZE)
    carried = sum(len(v) for k, v in env.items() if k.startswith(ct.PARTS_ENV_PREFIX))
    assert carried <= lf.ENV_FILES_BUDGET
    assert lf.env_bytes(env) < lf.ENV_TOTAL_BUDGET


def _hook_with(placement: lpl.Placement) -> lp.LeptonHook:
    hook = lp.LeptonHook()
    hook._extras = {}
    hook.placement = lambda spec: placement  # type: ignore[method-assign]
    return hook


def _runner_spec(blob: str, **kwargs: Any) -> JobSpec:
    entry = build_entrypoint("python3 train.py", specs={"train": {"blob": blob}})
    files = {k: v.encode() if isinstance(v, str) else v for k, v in entry.files.items()}
    return JobSpec(name="train-0123456789", job_id="abc123def456", command=entry.command, image="i", files=files,
                   **kwargs)  # fmt: skip


def test_a_typical_spec_rides_in_the_environment() -> None:
    channel = _hook_with(lpl.Placement("cpu.small", 0))._channel(_runner_spec("x" * 1000))
    assert channel.route == "env" and int(channel.env[ct.PARTS_ENV_COUNT]) == 1
    assert 20_000 < channel.packed_size < 40_000  # the runner itself, gzip'd


def test_a_4_mib_spec_is_staged_through_the_shared_volume_in_parts() -> None:
    placement = lpl.Placement("cpu.small", 0, node_group_name="ng-lustre", volume_mount="/mnt/lustre-fs")
    channel = _hook_with(placement)._channel(_runner_spec(secrets.token_hex(2 * 1024 * 1024)))
    assert channel.route == "volume" and channel.parts_dir == "/mnt/lustre-fs/.tao-staging/abc123def456"
    assert channel.env == {ct.PARTS_DIR_ENV: channel.parts_dir}
    assert len(channel.stage_parts) == 4 and 2 * 2**20 < channel.packed_size < 3 * 2**20
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(b"".join(channel.stage_parts)))) as tar:
        assert "setup.sh" in tar.getnames() and "files/runner.json" in tar.getnames()


def test_a_4_mib_spec_without_a_shared_volume_is_refused_naming_the_parameter() -> None:
    hook = _hook_with(lpl.Placement("cpu.small", 0, node_group_name="ng-plain"))
    with pytest.raises(JobValidationError, match=r"^specs: .* are 2\.\d MiB packed.*node group ng-plain mounts no"):
        hook._channel(_runner_spec(secrets.token_hex(2 * 1024 * 1024)))


def test_an_environment_over_linuxs_limits_is_refused_before_submission() -> None:
    hook = _hook_with(lpl.Placement("cpu.small", 0))
    one = JobSpec(name="n-0123456789", job_id="j", command="x", image="i", env={"BIG": "x" * 130_000})
    with pytest.raises(JobValidationError, match=r"^env\['BIG'\]: .*128 KiB"):
        hook._channel(one)
    many = JobSpec(
        name="n-0123456789", job_id="k", command="x", image="i", env={f"V{i}": "x" * 100_000 for i in range(20)}
    )
    with pytest.raises(JobValidationError, match=r"^env: .*2 MiB"):
        hook._channel(many)


def test_a_plain_single_node_command_ships_nothing() -> None:
    spec = JobSpec(name="n-0123456789", job_id="j", command="echo hi", image="i")
    assert _hook_with(lpl.Placement("cpu.small", 0))._channel(spec).route == "none"


# ----------------------------------------------------------------------------- the setup shipped with the job


def _source(script: bytes, env: dict[str, str], tmp_path: Any) -> dict[str, str]:
    path = tmp_path / "setup.sh"
    path.write_bytes(script)
    out = subprocess.run(
        ["/bin/sh", "-c", f". {path} && env"], env={"PATH": os.environ["PATH"], **env}, capture_output=True,
        text=True, check=True,
    ).stdout  # fmt: skip
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_the_multi_node_contract_comes_from_leptons_worker_variables(tmp_path: Any) -> None:
    lepton = {
        "LEPTON_JOB_WORKER_INDEX": "1",
        "LEPTON_JOB_TOTAL_WORKERS": "3",
        "LEPTON_JOB_WORKER_PREFIX": "train-0123456789",
        "LEPTON_SUBDOMAIN": "train-0123456789-job-svc",
    }
    env = _source(lf.setup_script(3, staged=False), lepton, tmp_path)
    assert env["NODE_RANK"] == "1" and env["MASTER_ADDR"] == "train-0123456789-0.train-0123456789-job-svc"
    assert (
        env["WORKER_ADDRS"] == "train-0123456789-1.train-0123456789-job-svc,train-0123456789-2.train-0123456789-job-svc"
    )
    assert b"wget" not in lf.setup_script(3, staged=True) and b"curl" not in lf.setup_script(3, staged=True)


def test_a_missing_worker_variable_stops_the_replica_loudly(tmp_path: Any) -> None:
    path = tmp_path / "setup.sh"
    path.write_bytes(lf.setup_script(2, staged=False))
    proc = subprocess.run(["/bin/sh", "-c", f". {path}; echo ran"], env={}, capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "ran" not in proc.stdout and "LEPTON_JOB_WORKER_INDEX" in proc.stderr


def test_the_last_replica_to_unpack_removes_the_staged_parts(tmp_path: Any) -> None:
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "part-000").write_bytes(b"x")
    script = lf.setup_script(1, staged=True)
    base = {ct.PARTS_DIR_ENV: str(parts), "LEPTON_JOB_TOTAL_WORKERS": "2"}
    env = _source(script, {**base, "LEPTON_JOB_WORKER_INDEX": "0"}, tmp_path)
    assert parts.exists() and ct.PARTS_DIR_ENV not in env
    _source(script, {**base, "LEPTON_JOB_WORKER_INDEX": "1"}, tmp_path)
    assert not parts.exists()


# ----------------------------------------------------------------------------- logs, errors


def _loki(*entries: tuple[int, str]) -> dict[str, Any]:
    return {"data": {"result": [{"stream": {"replica": "r0"}, "values": [[str(ts), text] for ts, text in entries]}]}}


def test_log_reads_by_cursor_repeat_nothing_and_skip_nothing() -> None:
    base = time.time_ns()
    log = [(base + i // 2, f"line {i}") for i in range(10)]  # two lines share each timestamp
    shown: list[str] = []
    cursor = ""
    for upto in (3, 3, 7, 10):  # what the server holds at each read; a read asks from the cursor's timestamp on
        last, _ = ct.parse_log_cursor(cursor)
        window = [e for e in log[:upto] if not last or str(e[0]) >= last]
        text, cursor = ct.read_after(sorted(ls.log_lines(_loki(*window))), cursor)
        shown += text.splitlines()
    assert shown == [f"line {i}" for i in range(10)]


def test_http_statuses_of_every_client_error_class() -> None:
    from leptonai.api.v2.api_resource import ClientError, ServerError
    from leptonai.api.v2.log import LogAPIError

    class _Response:
        def __init__(self, code: int) -> None:
            self.status_code, self.text = code, "{}"

    assert la.status_of(ClientError(_Response(401))) == 401  # type: ignore[arg-type]
    assert la.status_of(ServerError(_Response(503))) == 503  # type: ignore[arg-type]
    assert la.status_of(LogAPIError("x", status_code=429)) == 429
    assert la.status_of(TimeoutError("slow")) is None


def test_a_refused_token_is_err_auth_naming_the_setting() -> None:
    hook = lp.LeptonHook(conn_id="tao_lepton_x")
    hook._extras = {"workspace_id": "ws1"}
    unauthorized = str(hook._auth_error("listing jobs", 401))
    assert unauthorized.startswith("connection 'tao_lepton_x' password: ERR_AUTH: the Lepton API refused the token")
    assert "Put a valid API token" in unauthorized
    assert "ERR_AUTH" in str(hook._auth_error("creating the job", 403)) and "workspace_id" in str(
        hook._auth_error("creating the job", 403)
    )


def test_unknown_backend_details_are_refused() -> None:
    hook = _hook_with(lpl.Placement("cpu.small", 0))
    spec = JobSpec(name="n-0123456789", job_id="j", command="x", image="i", backend_details={"gpus": 2})
    with pytest.raises(JobValidationError, match=r"backend_details\['gpus'\]: is not a lepton platform setting"):
        hook.validate_spec(spec)
    spec = JobSpec(
        name="n-0123456789", job_id="j", command="x", image="i", backend_details={"capacity_timeout_seconds": -1}
    )
    with pytest.raises(JobValidationError, match="capacity_timeout_seconds"):
        hook.validate_spec(spec)


def test_marks_and_secrets_of_a_job_share_one_prefix() -> None:
    assert la.secret_prefix("abc") == "tao.abc."
    assert json.dumps(sorted(ls.MARK_LABELS.values())) == json.dumps(
        ["tao-cancel-by", "tao-canceled-by", "tao-consumed-by", "tao-owner-try"]
    )


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("owner_try", 3, "3"),
        ("canceled_by", "cli:jdoe", "cli-jdoe"),
        ("canceled_by", "reap: orphan: its task is failed", "reap-orphan-its-task-is-failed"),
        ("canceled_by", "cli:" + "x" * 80, "cli-" + "x" * 59),
        ("canceled_by", "::", "unknown"),
    ],
)
def test_marks_are_kept_in_label_characters(key: str, value: Any, text: str) -> None:
    """Who canceled a job is a label value (and a part of a mark secret's name): Kubernetes' label rule."""
    assert ls.mark_text(key, value) == text
    assert re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?", text)
    assert ls.mark_value(key, text) == (int(text) if key == "owner_try" else text)
    job = {"metadata": {"labels": {ls.MARK_LABELS[key]: text, ls.MARK_LABELS["consumed_by"]: "x"}}}
    assert ls.marks_of(job) == {key: ls.mark_value(key, text)}  # a label that is not a try number is no mark


# ----------------------------------------------------------------------------- what the operator takes from the hook


def test_the_platforms_shared_cache_reaches_the_runner_unless_backend_details_names_one(
    fake_platform: type[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_tao.operators.submit import TAOSubmitOperator

    monkeypatch.setattr(fake_platform, "runner_mount_path", lambda self, spec: "/mnt/lustre-fs", raising=False)
    hook = fake_platform(conn_id="fake_conn")
    spec = JobSpec(name="n-0123456789", job_id="j", command="x", image="i")
    for details, expected in (({}, "/mnt/lustre-fs"), ({"mount_path": "/scratch/cache"}, "/scratch/cache")):
        op = TAOSubmitOperator(
            task_id="t", conn_id="fake_conn", command="echo {config_path}", specs={"a": 1}, backend_details=details
        )
        staged, _ = op.stage(spec, hook)
        assert json.loads(staged.files["runner.json"])["mount_path"] == expected


def test_a_refused_token_while_looking_for_an_earlier_job_fails_the_task_at_once(
    fake_platform: type[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_tao.operators.submit import TAOSubmitOperator
    from tests.unit.fakes import Store, make_context

    def refused(self: Any, name: str) -> None:
        raise JobValidationError("connection 'fake_conn' password", "ERR_AUTH: refused (HTTP 401)", "Fix it")

    monkeypatch.setattr(fake_platform, "find_job", refused)
    op = TAOSubmitOperator(task_id="t", conn_id="fake_conn", command="echo", image="i", gpu_count=0)
    with pytest.raises(AirflowFailException, match=r"nothing was submitted: connection 'fake_conn' password: ERR_AUTH"):
        op.execute(make_context(Store()))  # type: ignore[arg-type]
    assert fake_platform.jobs == {}
