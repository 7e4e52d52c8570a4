"""SlurmHook without a cluster: state map, parsing of Slurm's answers, sbatch rendering, quoting, plans, preflight.

The remote shell scripts (staging + sbatch, launcher, env file, resubmission guard, log reader) are executed here
with the local ``sh``/``bash`` against fake ``sbatch``/``scontrol`` executables, so their quoting is checked for
real; the real cluster is in tests/integration/slurm/.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tao.failures import classify
from airflow_provider_tao.hooks import get_platform_hook, hook_class, platform_for_conn_type
from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.hooks.shared.env import render_env_file
from airflow_provider_tao.hooks.slurm import SlurmHook
from airflow_provider_tao.hooks.slurm import commands as scmd
from airflow_provider_tao.hooks.slurm import logs as slog
from airflow_provider_tao.hooks.slurm import script as ss
from airflow_provider_tao.hooks.slurm import status as sst
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobSpec, JobState

HOSTILE = [
    'it\'s "quoted"',
    "a; touch /tmp/SENTINEL",
    "$(touch /tmp/SENTINEL)",
    "`touch /tmp/SENTINEL`",
    "line1\nline2\n",
    "back\\slash $HOME ${PATH} *",
    "",
]


@pytest.fixture
def conn(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    extra = {
        "key_file": "/k",
        "host_key": "ssh-ed25519 AAAA",
        "partition": "gpu",
        "account": "acct",
        "results_root": "/lustre/u",
        "container_runtime": "pyxis",
    }
    monkeypatch.setenv(
        "AIRFLOW_CONN_SLURM_T",
        json.dumps({"conn_type": "tao_slurm", "host": "l1,l2", "port": 2222, "login": "u", "extra": extra}),
    )
    return extra


def _hook(monkeypatch: pytest.MonkeyPatch, **extra: Any) -> SlurmHook:
    base = {"results_root": "/lustre/u", "partition": "gpu", "container_runtime": "none", "gpus_per_node": 8}
    monkeypatch.setenv(
        "AIRFLOW_CONN_SLURM_X",
        json.dumps({"conn_type": "tao_slurm", "host": "h", "login": "u", "extra": {**base, **extra}}),
    )
    return SlurmHook(conn_id="slurm_x")


def _spec(**kwargs: Any) -> JobSpec:
    defaults: dict[str, Any] = {"name": "job-1", "job_id": "abc123", "command": "train.sh", "gpu_count": 0}
    return JobSpec(**{**defaults, **kwargs})


# ----------------------------------------------------------------------------- registration and settings


def test_registered_as_the_slurm_platform() -> None:
    assert platform_for_conn_type("tao_slurm") == "slurm"
    assert hook_class("slurm") is SlurmHook
    assert isinstance(get_platform_hook("slurm", None), SlurmHook)


def test_connection_fields_and_host_failover_list(conn: dict[str, Any]) -> None:
    hook = SlurmHook(conn_id="slurm_t")
    settings = hook.ssh_settings()
    assert settings.hosts == ("l1", "l2")
    assert (settings.port, settings.username, settings.key_file) == (2222, "u", "/k")
    assert settings.host_key == "ssh-ed25519 AAAA" and settings.no_host_key_check is False
    assert hook.results_root == "/lustre/u"


def test_env_fallbacks_without_a_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "SLURM_USER": "alice",
        "SLURM_HOSTNAME": "a.example, b.example",
        "SLURM_PARTITION": "p1,p2",
        "SLURM_ACCOUNT": "acc",
        "SLURM_BASE_RESULTS_DIR": "lustre:///lustre/alice",
        "SSH_KEY_PATH": "/home/alice/.ssh/id",
    }.items():
        monkeypatch.setenv(key, value)
    hook = SlurmHook(conn_id=None)
    settings = hook.ssh_settings()
    assert settings.hosts == ("a.example", "b.example") and settings.username == "alice"
    assert settings.key_file == "/home/alice/.ssh/id" and settings.port == 22
    assert hook.results_root == "/lustre/alice"
    plan = hook.plan(_spec(image="nvcr.io/x/y:1"))
    assert (plan.partition, plan.account) == ("p1,p2", "acc")


def test_host_key_check_cannot_be_silently_off(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook(monkeypatch, host_key="ssh-ed25519 AAAA", no_host_key_check=True)
    with pytest.raises(JobValidationError, match="host_key"):
        hook.ssh_settings()
    assert _hook(monkeypatch, no_host_key_check="true").ssh_settings().no_host_key_check is True
    assert _hook(monkeypatch).ssh_settings().no_host_key_check is False


def test_results_root_must_be_a_plain_absolute_cluster_path(monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ("relative/x", "/with space", "/x;rm", "file:///x"):
        with pytest.raises(JobValidationError, match="results_root"):
            _ = _hook(monkeypatch, results_root=bad).results_root
    assert _hook(monkeypatch, results_root="lustre:///lustre/fs/").results_root == "/lustre/fs"


# ----------------------------------------------------------------------------- state map and parsing


@pytest.mark.parametrize(
    ("raw", "state"),
    [
        ("PENDING", JobState.PENDING),
        ("CONFIGURING", JobState.PENDING),
        ("REQUEUED", JobState.PENDING),
        ("REQUEUE_HOLD", JobState.PENDING),
        ("RUNNING", JobState.RUNNING),
        ("COMPLETING", JobState.RUNNING),
        ("SUSPENDED", JobState.PAUSED),
        ("STOPPED", JobState.PAUSED),
        ("COMPLETED", JobState.COMPLETE),
        ("CANCELLED", JobState.CANCELED),
        ("CANCELLED by 1001", JobState.CANCELED),
        ("REVOKED", JobState.CANCELED),
        ("FAILED", JobState.ERROR),
        ("TIMEOUT", JobState.ERROR),
        ("NODE_FAIL", JobState.ERROR),
        ("BOOT_FAIL", JobState.ERROR),
        ("OUT_OF_MEMORY", JobState.ERROR),
        ("DEADLINE", JobState.ERROR),
        ("PREEMPTED", JobState.ERROR),  # correction of the seeds: retriable failure, not Canceled
    ],
)
def test_state_map(raw: str, state: JobState) -> None:
    record = sst.parse_sacct(f"7|{raw}|0:0|None|c1\n")["7"]
    assert sst.status_of(None, record).state is state


def test_unknown_state_and_unknown_job_are_unknown_not_failures() -> None:
    assert sst.status_of(sst.SlurmRecord("1", "WEIRD", "WEIRD"), None).state is JobState.UNKNOWN
    status = sst.status_of(None, None)
    assert (status.state, status.not_found) == (JobState.UNKNOWN, True)


def test_parse_squeue_and_pending_reason_in_the_message() -> None:
    text = "12|PENDING|PartitionDown|\n13|RUNNING|None|c1\n14|FAILED|NonZeroExitCode|c2\n"
    queue = sst.parse_squeue(text)
    assert set(queue) == {"12", "13", "14"}
    pending = sst.status_of(queue["12"], None)
    assert (pending.state, pending.message) == (JobState.PENDING, "PENDING (PartitionDown)")
    assert sst.status_of(queue["13"], None).message == "RUNNING on c1"
    # squeue alone knows no exit code; sacct's record completes it when it agrees on the state
    assert sst.status_of(queue["14"], None).exit_code is None
    acct = sst.parse_sacct("14|FAILED|3:0|NonZeroExitCode|c2\n")
    failed = sst.status_of(queue["14"], acct["14"])
    assert (failed.state, failed.exit_code, failed.message) == (JobState.ERROR, 3, "FAILED (exit code 3)")
    # sacct still lagging behind (says RUNNING): the exit code stays unknown rather than wrong
    lagging = sst.parse_sacct("14|RUNNING|0:0|None|c2\n")
    assert sst.status_of(queue["14"], lagging["14"]).exit_code is None


def test_sacct_cancelled_by_uid_is_canceled_and_kept_verbatim() -> None:
    acct = sst.parse_sacct("21|CANCELLED by 1001|0:0|PartitionDown|None assigned\n21.batch|CANCELLED|0:15||c1\n")
    assert set(acct) == {"21"}  # steps are ignored
    status = sst.status_of(None, acct["21"])
    assert (status.state, status.raw_state, status.message) == (
        JobState.CANCELED,
        "CANCELLED by 1001",
        "CANCELLED by 1001",
    )


@pytest.mark.parametrize(("field", "code"), [("3:0", 3), ("0:0", 0), ("0:9", -9), ("0:53", -53), ("", None)])
def test_exit_code_of_sacct_field(field: str, code: int | None) -> None:
    assert sst.exit_code_of(field) == code


def test_squeue_invalid_id_means_gone_not_broken() -> None:
    assert sst.squeue_says_gone(1, "slurm_load_jobs error: Invalid job id specified")
    assert not sst.squeue_says_gone(1, "slurm_load_jobs error: Unable to contact slurm controller")
    assert not sst.squeue_says_gone(0, "")


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("1:00", 1), ("30:00", 30), ("4:00:00", 240), ("1-00:00:00", 1440), ("2-3", 2 * 1440 + 180), ("90", 90)],
)
def test_parse_slurm_time(text: str, minutes: float) -> None:
    assert ss.parse_slurm_minutes(text) == minutes


def test_unlimited_time_and_formatting() -> None:
    assert ss.parse_slurm_minutes("UNLIMITED") is None and ss.parse_slurm_minutes("infinite") is None
    assert ss.format_slurm_time(240) == "04:00:00"
    assert ss.format_slurm_time(1 / 60) == "00:00:01"
    assert ss.format_slurm_time(1500) == "1-01:00:00"


# ----------------------------------------------------------------------------- failure classification


def test_failure_facts_feed_the_shared_classifier(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook(monkeypatch)
    handle = JobHandle("slurm", "slurm_x", "abc123", "job-1", backend_job_id="9")

    def facts(state: str, code: str, out: str = "", err: str = "") -> ErrClass:
        text = f"9|{state}|{code}|r|c1\n@@SQ 0\n@@OUT\n{out}\n@@ERR\n{err}"
        return classify(hook._facts(handle, text)).err_class

    assert facts("FAILED", "3:0", "Traceback (most recent call last):\nValueError: x") is ErrClass.ERR_PROGRAM
    assert facts("PREEMPTED", "0:0") is ErrClass.ERR_PREEMPTED
    assert facts("NODE_FAIL", "0:0") is ErrClass.ERR_INFRA
    assert facts("BOOT_FAIL", "0:0") is ErrClass.ERR_INFRA
    assert facts("TIMEOUT", "0:0") is ErrClass.ERR_TIMEOUT
    assert facts("CANCELLED by 1001", "0:0") is ErrClass.ERR_CANCELED
    assert facts("OUT_OF_MEMORY", "0:125") is ErrClass.ERR_OOM
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert facts("FAILED", "1:0", err=oom) is ErrClass.ERR_OOM  # never retried
    assert facts("FAILED", "1:0", err="RuntimeError: Failed to initialize NVML: Unknown Error") is ErrClass.ERR_INFRA
    lost = "Unable to determine the device handle for GPU0000:07:00.0: Unknown Error"
    assert facts("FAILED", "255:0", out=lost) is ErrClass.ERR_INFRA
    old_driver = "RuntimeError: The NVIDIA driver on your system is too old (found version 11040)."
    assert facts("FAILED", "1:0", err=old_driver) is ErrClass.ERR_INFRA
    # the SDK's loose patterns caught program bugs; these stay program errors
    assert facts("FAILED", "1:0", err="RuntimeError: CUDA error: device-side assert triggered") is ErrClass.ERR_PROGRAM
    assert (
        facts("FAILED", f"{ss.INNER_TIMEOUT_EXIT}:0", err=f"{ss.INNER_TIMEOUT_MARK}: stopped") is ErrClass.ERR_TIMEOUT
    )
    assert classify(hook._facts(handle, "9|FAILED|3:0|r|c1\n@@SQ 0\n@@OUT\nx\n@@ERR\n")).details["slurm_job_id"] == "9"
    # a requeued job's logs hold every run: only the last run counts
    earlier = f"{ss.RUN_MARK} 0 of job j\nFailed to initialize NVML\n{ss.RUN_MARK} 1 of job j\nValueError: x"
    assert facts("FAILED", "1:0", err=earlier) is ErrClass.ERR_PROGRAM


# ----------------------------------------------------------------------------- plan: resources, time, containers


def test_gpu_arithmetic_and_exclusive_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook(monkeypatch)
    small = hook.plan(_spec(gpu_count=4, num_nodes=2))
    assert (small.nodes, small.gpus_per_node, small.exclusive) == (2, 4, False)
    full = hook.plan(_spec(gpu_count=16))
    assert (full.nodes, full.gpus_per_node, full.exclusive) == (2, 8, True)
    every = hook.plan(_spec(gpu_count=-1))
    assert (every.nodes, every.gpus_per_node, every.exclusive) == (1, 8, True)
    none = hook.plan(_spec(gpu_count=0))
    assert (none.gpus_per_node, none.exclusive) == (0, False)
    cpu_cluster = _hook(monkeypatch, gpus_per_node=0)
    assert cpu_cluster.plan(_spec(gpu_count=-1)).gpus_per_node == 0
    with pytest.raises(JobValidationError, match="gpus_per_node"):
        cpu_cluster.plan(_spec(gpu_count=1))


def test_wall_time_defaults_and_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook(monkeypatch)
    plan = hook.plan(_spec())
    assert plan.time_minutes == 240 and plan.timeout_minutes == pytest.approx(228)  # 4 h and 3.8 h
    short = hook.plan(_spec(backend_details={"time_minutes": 1}))
    assert short.time_minutes == 1 and short.timeout_minutes is None  # no room for an inner guard
    with pytest.raises(JobValidationError, match="max_time_hours"):
        hook.plan(_spec(backend_details={"time_hours": 12}))  # the seeds: do not default to 12 h
    assert _hook(monkeypatch, max_time_hours=24).plan(_spec(backend_details={"time_hours": 12})).time_minutes == 720


def test_bad_backend_details_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook(monkeypatch)
    with pytest.raises(JobValidationError, match="unknown key"):
        hook.plan(_spec(backend_details={"partiton": "gpu"}))
    with pytest.raises(JobValidationError, match="partition"):
        hook.plan(_spec(backend_details={"partition": "gpu\n#SBATCH --uid=0"}))
    with pytest.raises(JobValidationError, match="container_runtime"):
        hook.plan(_spec(backend_details={"container_runtime": "docker"}))


def test_local_paths_and_file_uris_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook(monkeypatch)
    for uri in ("file:///data/x", "data/x", "./x"):
        with pytest.raises(JobValidationError, match="Airflow worker"):
            hook._inputs(_spec(backend_details={"inputs": [uri]}))
    assert hook._inputs(_spec(backend_details={"inputs": ["lustre:///a/b", "/c", "s3://b/k"]})) == ["/a/b", "/c"]
    with pytest.raises(JobValidationError, match="results_uri"):
        hook.results_dir_for(_spec(results_uri="file:///tmp/r"))
    assert hook.results_dir_for(_spec(results_uri="lustre:///lustre/r/")) == "/lustre/r/abc123"
    assert hook.results_dir_for(_spec(results_uri="s3://b/p/")) == "s3://b/p/abc123"
    assert hook.results_dir_for(_spec()) == "/lustre/u/results/abc123"
    assert hook.default_results_root() == "/lustre/u/results"
    with pytest.raises(JobValidationError, match="cluster path"):
        hook.check_path("file:///x")


def test_hostile_job_names_are_rejected_before_anything_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook(monkeypatch)
    for name in ("a;touch x", "$(id)", "a b", "x\ny", "-rf", "a'b", "é"):
        with pytest.raises(JobValidationError, match="job_name"):
            hook.validate_name(name)
    hook.validate_name("dag-train_1.x-0123456789")


def test_oci_bundle_from_image_or_backend_details(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook(monkeypatch, container_runtime="oci")
    assert hook.plan(_spec(image="/oci/python")).container == "/oci/python"
    assert hook.plan(_spec(image="x:1", backend_details={"oci_bundle": "/b"})).container == "/b"
    with pytest.raises(JobValidationError, match="oci_bundle"):
        hook.plan(_spec(image="nvcr.io/x:1"))


@pytest.mark.parametrize(
    ("image", "pyxis"),
    [
        ("nvcr.io/nvidia/tao/tao-toolkit:6.26.3-pyt", "nvcr.io#nvidia/tao/tao-toolkit:6.26.3-pyt"),
        ("docker://nvcr.io#nvidia/pytorch:25.09-py3", "nvcr.io#nvidia/pytorch:25.09-py3"),
        ("nvcr.io#nvidia/pytorch:25.09-py3", "nvcr.io#nvidia/pytorch:25.09-py3"),
        ("/lustre/img/tao.sqsh", "/lustre/img/tao.sqsh"),
        ("localhost:5000/x:1", "localhost:5000#x:1"),
        ("ubuntu:22.04", "ubuntu:22.04"),
        ("library/python:3.11", "library/python:3.11"),
    ],
)
def test_pyxis_image_formats(image: str, pyxis: str) -> None:
    assert ss.pyxis_image(image) == pyxis


def test_pyxis_plan_mounts_results_root_and_caches_sqsh(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook(monkeypatch, container_runtime="pyxis", results_root="/scratch/u")
    plan = hook.plan(_spec(image="nvcr.io/nvidia/tao/tao-toolkit:6.26.3-pyt", env={"A": "1"}))
    assert plan.container_mounts == ("/lustre", "/scratch/u:/scratch/u")
    assert plan.sqsh_cache == "/scratch/u/.sqsh/nvcr.io_nvidia_tao_tao-toolkit_6.26.3-pyt.sqsh"
    assert plan.enroot_uri == "docker://nvcr.io#nvidia/tao/tao-toolkit:6.26.3-pyt"
    assert "A" in plan.container_env and "TAO_JOB_ID" in plan.container_env
    assert plan.force_reconvert is False
    latest = {"image": "nvcr.io/x/y:latest"}
    assert hook.plan(_spec(**latest)).force_reconvert is False  # cached :latest is used unless asked
    assert hook.plan(_spec(**latest, backend_details={"force_reconvert_latest": True})).force_reconvert is True
    assert hook.plan(_spec(image="/img.sqsh")).sqsh_cache is None
    assert hook.plan(_spec(image="x:1", backend_details={"use_sqsh": False})).sqsh_cache is None


# ----------------------------------------------------------------------------- rendering


def _layout() -> ss.JobLayout:
    return ss.JobLayout("/lustre/u", "abc123", "job-1")


def test_sbatch_script_directives(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook(monkeypatch, account="acct")
    script = ss.render_sbatch(_layout(), hook.plan(_spec(gpu_count=16)), "job-1")
    directives = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert directives == [
        "#SBATCH --job-name=job-1",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=acct",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=16",
        "#SBATCH --gres=gpu:8",
        "#SBATCH --exclusive",
        "#SBATCH --time=04:00:00",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        "#SBATCH --output=/lustre/u/jobs/abc123/slurm-logs/job-1-abc123/main.out",
        "#SBATCH --error=/lustre/u/jobs/abc123/slurm-logs/job-1-abc123/main.err",
        "#SBATCH --comment=tao:abc123",
        "#SBATCH --wait-all-nodes=1",
    ]
    assert 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)' in script
    assert "timeout --signal=TERM --kill-after=120 228m srun --nodes=2 --ntasks=2" in script
    assert script.rstrip().endswith('exit "$rc"')  # the command's status, never masked
    assert "scontrol requeue" not in script


def test_no_gres_line_without_gpus_and_extra_directives(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook(monkeypatch)
    spec = _spec(backend_details={"nodelist": "c2", "qos": "high", "mem": "4G", "time_minutes": 1})
    script = ss.render_sbatch(_layout(), hook.plan(spec), "job-1")
    assert "--gres" not in script and "--exclusive" not in script and "MASTER_ADDR" not in script
    assert "#SBATCH --nodelist=c2" in script and "#SBATCH --qos=high" in script and "#SBATCH --mem=4G" in script
    assert "#SBATCH --time=00:01:00" in script and "timeout " not in script


def test_container_launch_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    oci = ss.render_sbatch(_layout(), _hook(monkeypatch, container_runtime="oci").plan(_spec(image="/b")), "j")
    assert (
        "srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --cpus-per-task=16 --kill-on-bad-exit=1 --container=/b " in oci
    )
    plan = _hook(monkeypatch, container_runtime="pyxis").plan(_spec(image="nvcr.io/n/t:1", env={"K": "v"}))
    pyxis = ss.render_sbatch(_layout(), plan, "j")
    assert '--container-image="$TAO_IMAGE"' in pyxis and "--container-mounts=/lustre" in pyxis
    assert "--container-env=K,PYTHONUNBUFFERED,TAO_JOB_FILES,TAO_JOB_ID,TAO_JOB_NAME,TAO_RESULTS_ROOT" in pyxis
    assert "enroot import -o" in pyxis and "'docker://nvcr.io#n/t:1'" in pyxis and "flock 9" in pyxis


def test_sbatch_script_never_holds_an_env_value(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook(monkeypatch, container_runtime="pyxis")
    spec = _spec(image="nvcr.io/n/t:1", env={"PLAIN": "plain-value-1"}, secret_env={"TOKEN": "secret-value-2"})
    script = ss.render_sbatch(_layout(), hook.plan(spec), "job-1")
    assert "plain-value-1" not in script and "secret-value-2" not in script
    assert ". /lustre/u/jobs/abc123/env/abc123.env" in script


def test_unsafe_directive_values_never_reach_the_script(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _hook(monkeypatch).plan(_spec())
    with pytest.raises(ValueError, match="unsafe"):
        ss.render_sbatch(_layout(), plan, "x\n#SBATCH --uid=0")


def _sh(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env={**os.environ, **env}, check=False
    )


@pytest.mark.parametrize("value", HOSTILE)
def test_env_file_round_trips_hostile_values(tmp_path: Path, value: str) -> None:
    env_file = tmp_path / "x.env"
    env_file.write_text(render_env_file({"V": value}))
    for shell in ("bash", "sh"):
        out = subprocess.run(
            [shell, "-c", '. "$1"; printf %s "$V"', "_", str(env_file)], capture_output=True, text=True, check=True
        ).stdout
        assert out == value
    assert not Path("/tmp/SENTINEL").exists()


def _run_launcher(tmp_path: Path, command: str | list[str]) -> str:
    layout = ss.JobLayout(str(tmp_path), "j1", "n")
    job = Path(layout.job_dir)
    (job / "work").mkdir(parents=True)
    for rel, text in ss.render_command(command).items():
        (job / rel).parent.mkdir(parents=True, exist_ok=True)
        (job / rel).write_text(text)
    (job / "launch.sh").write_text(ss.render_launcher(layout, multi_node=True))
    proc = subprocess.run(
        ["/bin/sh", str(job / "launch.sh")],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "SLURM_NODEID": "1"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_string_command_runs_under_exactly_one_bash_and_arrives_verbatim(tmp_path: Path) -> None:
    hostile = "".join(HOSTILE)
    # $0 is bash, and bash's parent is the caller itself: the launcher's sh was replaced (exec), not kept around
    command = f'printf \'%s|%s|%s|%s\' "$0" "$(cat /proc/$PPID/comm)" "$NODE_RANK" {shlex.quote(hostile)}'
    out = _run_launcher(tmp_path, command + "\n\n")
    assert out == f"/bin/bash|{Path('/proc/self/comm').read_text().strip()}|1|{hostile}"
    assert not Path("/tmp/SENTINEL").exists()


def test_argv_command_arrives_verbatim_without_a_shell(tmp_path: Path) -> None:
    argv = ["python3", "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", *HOSTILE]
    assert json.loads(_run_launcher(tmp_path, argv)) == HOSTILE
    assert not Path("/tmp/SENTINEL").exists()


def _launcher_in_own_pid_namespace(tmp_path: Path, command: str) -> subprocess.Popen[str]:
    layout = ss.JobLayout(str(tmp_path), "j1", "n")
    job = Path(layout.job_dir)
    (job / "work").mkdir(parents=True)
    (job / "command").mkdir()
    (job / "command" / "command.txt").write_text(command)
    (job / "launch.sh").write_text(ss.render_launcher(layout, multi_node=False))
    # as in a Slurm OCI container: the launcher is PID 1 of a new PID namespace
    return subprocess.Popen(["unshare", "-rpf", "/bin/sh", str(job / "launch.sh")], stdout=subprocess.PIPE, text=True)


def test_as_pid_1_the_launcher_forwards_signals_and_keeps_the_exit_status(tmp_path: Path) -> None:
    proc = _launcher_in_own_pid_namespace(tmp_path / "a", "echo $$; exit 7")
    assert proc.wait(30) == 7 and proc.stdout is not None and proc.stdout.read().strip() != "1"
    # PID 1 ignores SIGTERM without a handler: a bare `sleep` as PID 1 would survive scancel
    proc = _launcher_in_own_pid_namespace(tmp_path / "b", "sleep 60")
    deadline = time.monotonic() + 180
    children: list[str] = []
    while not children and time.monotonic() < deadline:
        time.sleep(0.1)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    launcher = children[0]
    # its trap is set before it starts the command: once the command runs, the launcher takes the signal
    while not Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split():
        assert time.monotonic() < deadline, "the launcher never started its command"
        time.sleep(0.1)
    os.kill(int(launcher), signal.SIGTERM)  # what Slurm's RunTimeKill (runc kill) sends
    assert proc.wait(60) == 128 + signal.SIGTERM


def test_stage_archive_modes_and_path_escapes() -> None:
    data = ss.stage_archive({"env/j.env": "export A=1\n", "files/sub/x.py": b"print(1)"})
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        modes = {m.name: (m.isdir(), stat.S_IMODE(m.mode)) for m in tar.getmembers()}
    assert modes == {
        "env": (True, 0o700),
        "env/j.env": (False, 0o600),
        "files": (True, 0o700),
        "files/sub": (True, 0o700),
        "files/sub/x.py": (False, 0o600),
    }
    for bad in ("../x", "/etc/x", "a//b", "a/./b"):
        with pytest.raises(ValueError):
            ss.stage_archive({bad: "x"})


def _fake_bin(tmp_path: Path, name: str, body: str) -> None:
    path = tmp_path / "bin" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def test_submit_script_stages_then_submits_with_private_modes(tmp_path: Path) -> None:
    _fake_bin(tmp_path, "sbatch", 'echo "$@" > "$SBATCH_ARGS"; echo "4242;ci"\n')
    layout = ss.JobLayout(str(tmp_path / "root"), "jid1", "job-1")
    archive = ss.stage_archive({"env/jid1.env": "export S='x'\n", "sbatch/job_jid1.sbatch": "#!/bin/bash\n"})
    script = ss.submit_script(layout, f"{layout.default_results_parent}/jid1", try_number=2)
    proc = subprocess.run(
        ["sh", "-c", script],
        input=archive,
        capture_output=True,
        env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SBATCH_ARGS": str(tmp_path / "args")},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert b"@@SUBMITTED 4242\n" in proc.stdout
    job = Path(layout.job_dir)
    assert Path(layout.log_dir).is_dir()  # the log folder exists BEFORE sbatch (Slurm never creates it)
    assert (tmp_path / "args").read_text().split() == ["--parsable", "--export=ALL", layout.sbatch_file]
    assert (job / "meta" / "slurm_job_id").read_text() == "4242\n"
    assert (job / "marks" / "owner_try").read_text() == "2"
    assert Path(layout.names_index).read_text() == "jid1"
    assert stat.S_IMODE((job / "env" / "jid1.env").stat().st_mode) == 0o600
    for folder in (job, job / "env", Path(layout.log_dir), Path(layout.jobs_root)):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert Path(f"{layout.default_results_parent}/jid1").is_dir()
    # the same job id twice never submits twice
    again = subprocess.run(
        ["sh", "-c", script],
        input=archive,
        capture_output=True,
        check=False,
        env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SBATCH_ARGS": "/dev/null"},
    )
    assert again.returncode != 0 and b"@@SUBMITTED" not in again.stdout


def _resubmit(tmp_path: Path, state: str, restarts: int = 0, max_resubmits: int = 3) -> str:
    _fake_bin(
        tmp_path,
        "scontrol",
        f'if [ "$1" = -o ]; then echo "JobId=9 JobName=x JobState={state} Reason=x Restarts={restarts} x=y"; '
        'else echo "$@" >> "$REQUEUES"; fi\n',
    )
    layout = ss.JobLayout(str(tmp_path / "root"), "jid1", "job-1")
    Path(layout.marks_dir).mkdir(parents=True, exist_ok=True)
    Path(layout.job_dir, "meta").mkdir(exist_ok=True)
    Path(layout.job_dir, "meta", "max_resubmits").write_text(str(max_resubmits))
    proc = subprocess.run(
        ["sh", "-c", scmd.resubmit_command(layout, "9", 99)],
        capture_output=True,
        text=True,
        env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "REQUEUES": str(tmp_path / "requeues")},
        check=True,
    )
    return proc.stdout.strip()


def test_resubmission_guard_requeues_once_per_failed_run_up_to_the_bound(tmp_path: Path) -> None:
    assert _resubmit(tmp_path, "NODE_FAIL", 0, max_resubmits=2) == "@@RS REQUEUED 1 2 NODE_FAIL"
    # the same failed run seen again (a second poll, a restarted triggerer): never a second requeue
    assert _resubmit(tmp_path, "NODE_FAIL", 0, max_resubmits=2) == "@@RS DONE_BEFORE 1"
    assert _resubmit(tmp_path, "FAILED", 1, max_resubmits=2) == "@@RS REQUEUED 2 2 FAILED"
    assert _resubmit(tmp_path, "FAILED", 2, max_resubmits=2) == "@@RS EXHAUSTED 2 2"
    assert (tmp_path / "requeues").read_text().splitlines() == ["requeue 9", "requeue 9"]
    assert _resubmit(tmp_path, "PENDING", 2) == "@@RS NOT_FAILED PENDING"
    Path(tmp_path / "root/jobs/jid1/marks/cancel_requested_by").write_text("1")
    assert _resubmit(tmp_path, "FAILED", 3) == "@@RS CANCELED"


def test_resubmit_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook(monkeypatch)
    handle = JobHandle("slurm", "slurm_x", "abc123", "job-1", backend_job_id="9")
    analysis = classify(hook._facts(handle, "9|NODE_FAIL|0:0|r|c1\n@@SQ 0\n@@OUT\n\n@@ERR\n"))
    note = hook._resubmit_verdict(handle, analysis, "@@RS REQUEUED 1 3 NODE_FAIL\n")
    assert note is not None and "resubmission 1 of 3" in note and "ERR_INFRA" in note
    assert "no longer failed" in (hook._resubmit_verdict(handle, analysis, "@@RS NOT_FAILED PENDING") or "")
    for verdict in ("@@RS EXHAUSTED 3 3", "@@RS DONE_BEFORE 1", "@@RS CANCELED", "@@RS GONE x"):
        assert hook._resubmit_verdict(handle, analysis, verdict) is None
    # no verdict: the requeue may have happened with its answer lost -- not "it stays failed" (the trigger asks again)
    from airflow_provider_tao.hooks.slurm.ssh import SlurmTransportError

    for lost in ("", "garbage"):
        with pytest.raises(SlurmTransportError, match="no answer from the requeue of Slurm job 9"):
            hook._resubmit_verdict(handle, analysis, lost)


# ----------------------------------------------------------------------------- logs


def test_log_offsets_pack_two_files() -> None:
    assert slog.unpack_offset(slog.pack_offset(123, 456)) == (123, 456)
    assert slog.unpack_offset(0) == (0, 0)


def test_log_reader_output_round_trip(tmp_path: Path) -> None:
    layout = ss.JobLayout(str(tmp_path), "j", "n")
    Path(layout.log_dir).mkdir(parents=True)
    Path(layout.out_file).write_bytes(b"one\ntwo\npart")
    Path(layout.err_file).write_bytes("é\n".encode())
    requests = "\n".join(slog.log_requests(layout, slog.pack_offset(4, 0), "t")) + "\n"
    for force_sh in (False, True):
        command = slog.log_reader_command()
        if force_sh:
            command = command.replace("command -v python3", "false")
        out = subprocess.run(["sh", "-c", command], input=requests.encode(), capture_output=True, check=True).stdout
        chunks = slog.parse_log_chunks(out)
        assert chunks == {"t.o": (4, b"two\npart", 12), "t.e": (0, "é\n".encode(), 3)}
        text, offset = slog.merge_log_chunks(chunks, "t", slog.pack_offset(4, 0), final=False)
        assert text == "two\né\n"  # the unterminated "part" waits for its newline
        assert slog.unpack_offset(offset) == (8, len("é\n".encode()))
        text, offset = slog.merge_log_chunks(chunks, "t", slog.pack_offset(4, 0), final=True)
        assert text == "two\npart\né\n" and slog.unpack_offset(offset) == (12, 3)
        # a read bound cut main.out: even an ended job's unfinished line waits for the next read
        cut = subprocess.run(
            ["sh", "-c", command.replace(f"M={slog.LOG_CHUNK_BYTES}", "M=5")], input=requests.encode(),
            capture_output=True, check=True,
        ).stdout  # fmt: skip
        chunks = slog.parse_log_chunks(cut)
        assert chunks["t.o"] == (4, b"two\np", 12) and not slog.chunks_at_end(chunks, "t")
        text, offset = slog.merge_log_chunks(chunks, "t", slog.pack_offset(4, 0), final=True)
        assert text == "two\né\n" and slog.unpack_offset(offset) == (8, 3)


def test_missing_log_files_keep_the_offset() -> None:
    chunks = slog.parse_log_chunks(b"@@F t.o -1 0 0\n@@F t.e -1 0 0\n")
    assert chunks == {}
    assert slog.merge_log_chunks(chunks, "t", slog.pack_offset(5, 7), final=False) == ("", slog.pack_offset(5, 7))


def test_huge_unterminated_line_is_flushed() -> None:
    blob = b"x" * slog.PARTIAL_LINE_FLUSH_BYTES
    assert slog.complete_lines(blob, final=False) == blob
    assert slog.complete_lines(b"abc", final=False) == b""


def test_tail_parsing() -> None:
    text, offset = SlurmHook._parse_tail(b"@@T 10\na\nb\n@@T 3\nerr")
    assert text == "a\nb\nerr\n" and slog.unpack_offset(int(offset)) == (10, 3)


# ----------------------------------------------------------------------------- preflight, find_job


def test_preflight_parsing_and_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook(monkeypatch, container_runtime="none")
    text = "@@PART debug*|4:00:00\n@@PART short|1:00\n@@PART gpu|UNLIMITED\n@@IN 0 1\n@@IN 1 0\n@@PY 3.6\n"
    result = scmd.parse_preflight(text)
    assert result["partitions"] == {"debug": (240, True), "short": (1, False), "gpu": (None, False)}
    assert result["inputs"] == {0: True, 1: False} and result["python"] == "3.6"

    def check(spec: JobSpec, res: dict[str, Any], checked: list[str] | None = None) -> None:
        hook._check_preflight(res, hook.plan(spec), checked or [], checked or [], False)

    ok = {**result, "inputs": {}, "python": None}
    check(_spec(backend_details={"partition": "short", "time_minutes": 1}), ok)
    with pytest.raises(JobValidationError, match="partition maximum"):
        check(_spec(backend_details={"partition": "short", "time_minutes": 2}), ok)
    check(_spec(backend_details={"partition": "gpu"}), ok)  # unlimited
    with pytest.raises(JobValidationError, match="not found on the cluster"):
        check(_spec(backend_details={"partition": "nope"}), ok)
    with pytest.raises(JobValidationError, match=r"not found on the cluster: \['/b'\]"):
        check(_spec(backend_details={"partition": "debug"}), {**ok, "inputs": {0: True, 1: False}}, ["/a", "/b"])
    with pytest.raises(JobValidationError, match=r"python3 >= 3\.8"):
        check(_spec(backend_details={"partition": "debug"}), {**ok, "python": "3.6"})
    with pytest.raises(JobValidationError, match=r"python3 >= 3\.8"):
        check(_spec(backend_details={"partition": "debug"}), {**ok, "python": "missing"})
    check(_spec(backend_details={"partition": "debug"}), {**ok, "python": "3.11"})


def test_preflight_command_quotes_paths() -> None:
    command = scmd.preflight_command(["debug"], ["/a b", "/c'd"], True, True)
    assert "test -e '/a b'" in command and "test -e '/c'\"'\"'d'" in command and "import boto3" in command


def test_parse_find_job() -> None:
    text = '@@JOB jid1\n{"job_id": "jid1", "name": "n"}\n@@ID \n55|tao:jid1\n54|tao:old\n'
    job_id, meta, slurm_id, same = scmd.parse_find_job(text)  # type: ignore[misc]
    assert (job_id, meta["name"], slurm_id, same) == ("jid1", "n", "", {"55": "tao:jid1", "54": "tao:old"})
    assert scmd.parse_find_job("") is None


def _found(meta: dict[str, Any], sid: str = "55", queue: str = "55|tao:abc123", acct: str = "") -> str:
    return f"@@JOB abc123\n{json.dumps(meta)}\n@@ID {sid}\n{queue}\n" + (f"@@ACCT\n{acct}\n" if acct else "")


_META = {"job_id": "abc123", "name": "n-1", "platform": "slurm", "conn_id": "c", "results_dir": "/r/abc123"}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (_found({**_META, "name": "other"}), "does not match the submitted job (name)"),
        (_found({**_META, "conn_id": "d", "job_id": "x"}), "(conn_id, job_id)"),
        (_found({**_META, "results_dir": "/home/u/.ssh"}), "results folder of job abc123 is not the job's own"),
        (_found(_META, queue="55|tao:fffff"), "Slurm job 55 recorded for job abc123 carries another job's comment"),
        (_found(_META, sid="77", acct="77|victim"), "Slurm job 77 recorded for job abc123 is not a job named n-1"),
        (_found(_META, sid="77"), "is not a job named n-1"),
        ("@@JOB -\n", "does not hold a job id"),
    ],
)
def test_reattach_refuses_what_the_clusters_files_were_rewritten_to(text: str, why: str) -> None:
    """Issue 38.8: the index and the handle are files any job of the account may rewrite."""
    found = scmd.parse_found_job(text)
    assert found is not None
    verdict = scmd.adoptable("n-1", "c", found)
    assert isinstance(verdict, str) and why in verdict


def test_reattach_adopts_the_job_as_submitted_and_a_failed_accounting_read_decides_nothing() -> None:
    for text, sid in [
        (_found(_META), "55"),
        (_found(_META, sid="", queue="54|tao:old\n55|tao:abc123"), "55"),  # the id not recorded yet
        (_found(_META, sid="77", queue="", acct="77|n-1"), "77"),  # gone from the queue: accounting says it
    ]:
        found = scmd.parse_found_job(text)
        assert found is not None and scmd.adoptable("n-1", "c", found) == (_META, sid)
    from airflow_provider_tao.hooks.slurm.ssh import SlurmTransportError

    found = scmd.parse_found_job(_found(_META, sid="77", queue="", acct="@@FAILED|"))
    with pytest.raises(SlurmTransportError, match="sacct could not say"):
        scmd.adoptable("n-1", "c", found)  # type: ignore[arg-type]


def test_parsing_the_slurm_example_dag_opens_no_ssh_library(tmp_path: Path) -> None:
    dag_file = Path(__file__).resolve().parents[2] / "example_dags" / "tao_slurm_train.py"
    code = (
        "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__dag__'); "
        "print(sorted(m for m in ('paramiko', 'asyncssh', 'airflow_provider_tao.hooks.slurm') if m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(dag_file)],
        capture_output=True,
        text=True,
        env={**os.environ, "AIRFLOW_HOME": str(tmp_path)},
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


# ----------------------------------------------------------------------------- the sweep of env files, run locally


def _local_run(hook: SlurmHook, monkeypatch: pytest.MonkeyPatch, bin_dir: Path) -> list[str]:
    """``hook.run`` in the local shell against the fake executables of ``bin_dir``; returns the commands run."""
    from airflow_provider_tao.hooks.slurm.ssh import Result

    commands: list[str] = []

    def run(command: str, stdin: bytes | None = None, timeout: float = 300.0) -> Result:
        commands.append(command)
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        proc = subprocess.run(["sh", "-c", command], input=stdin or b"", capture_output=True, env=env, check=False)
        return Result(proc.returncode, proc.stdout, proc.stderr)

    monkeypatch.setattr(hook, "run", run)
    return commands


def _staged(hook: SlurmHook, job_id: str, name: str, slurm_id: str) -> Path:
    """A job folder as a submission leaves it (env file, meta, the Slurm id unless ``slurm_id`` is "")."""
    layout = hook.layout(job_id, name)
    env = Path(layout.env_file)
    env.parent.mkdir(parents=True)
    env.write_text("export SECRET='s'\n")
    meta = Path(layout.job_dir) / "meta"
    meta.mkdir()
    (meta / f"{job_id}.json").write_text(json.dumps(JobHandle("slurm", "slurm_x", job_id, name).to_json()))
    if slurm_id:
        (meta / "slurm_job_id").write_text(f"{slurm_id}\n")
    return env


def test_reap_deletes_env_files_of_ended_jobs_whose_task_is_over_in_two_commands(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hook = _hook(monkeypatch, results_root=str(tmp_path / "root"))
    # squeue: 11 ended, 12 runs, 14 is the job of a submitter that died before recording its id (by its comment)
    _fake_bin(tmp_path, "squeue", "printf '11|COMPLETED|tao:j1\\n12|RUNNING|tao:j2\\n14|PENDING|tao:j5\\n'\n")
    commands = _local_run(hook, monkeypatch, tmp_path / "bin")
    files = {
        "over": _staged(hook, "j1", "n1", "11"),  # ended; its task failed (marked failed after the trigger's event)
        "running": _staged(hook, "j2", "n2", "12"),  # its task is over, but the job still runs (cancel_on_kill=False)
        "resumes": _staged(hook, "j3", "n3", "13"),  # gone from squeue; its task is deferred: it may requeue the job
        "unknown": _staged(hook, "j4", "n4", "15"),  # ended; no record names it (another deployment's)
        "queued": _staged(hook, "j5", "n5", ""),  # id never recorded, pending by its comment; task over by write-ahead
        "unrecorded": _staged(hook, "j6", "n6", ""),  # id never recorded, no job queued: known by its write-ahead
        "other_name": _staged(hook, "j7", "n7", "17"),  # the record under its Slurm id is another job's (id reused)
    }
    origin = {"dag_id": "d", "task_id": "t", "map_index": -1}
    recorded = {
        "11": {**origin, "run_id": "r1", "name": "n1"},
        "12": {**origin, "run_id": "r2", "name": "n2"},
        "13": {**origin, "run_id": "r3", "name": "n3"},
        "n5": {**origin, "run_id": "r5", "name": "n5"},
        "n6": {**origin, "run_id": "r6", "name": "n6"},
        "17": {**origin, "run_id": "r7", "name": "someone-else"},
    }
    states = {"r1": "failed", "r2": "failed", "r3": "deferred", "r5": "success", "r6": "success", "r7": "failed"}
    asked: list[str] = []

    def task_state(ti: Any) -> str | None:
        asked.append(ti["run_id"])
        return states.get(ti["run_id"])

    planned = hook.reap_resources(task_state, dry_run=True, recorded=recorded)
    assert [(r["resource"], r["action"]) for r in planned] == [
        (str(files["over"]), "would delete"),
        (str(files["unrecorded"]), "would delete"),
    ]
    assert all(path.exists() for path in files.values()) and len(commands) == 1

    rows = hook.reap_resources(task_state, dry_run=False, recorded=recorded)
    assert [(r["resource"], r["kind"], r["action"]) for r in rows] == [
        (str(files["over"]), "env file", "deleted"),
        (str(files["unrecorded"]), "env file", "deleted"),
    ]
    assert (
        rows[0]["why"]
        == "its Slurm job has ended (11 COMPLETED) and its task d.t run r1 is failed (by this Airflow's record)"
    )
    assert rows[1]["why"].startswith("its Slurm job has ended (none was submitted) and its task d.t run r6 is success")
    assert [name for name, path in files.items() if path.exists()] == [
        "running", "resumes", "unknown", "queued", "other_name"
    ]  # fmt: skip
    assert len(commands) == 3  # the listing, then ONE delete for every file
    assert "r2" not in asked and "r5" not in asked  # a job that still runs or queues is not judged by its task

    # an unread queue says nothing about which jobs ended: nothing is deleted
    _fake_bin(tmp_path, "squeue", "echo 'slurm_load_jobs error: Socket timed out' >&2; exit 1\n")
    files["again"] = _staged(hook, "j8", "n8", "18")
    recorded["18"] = {**origin, "run_id": "r1", "name": "n8"}
    rows = hook.reap_resources(task_state, dry_run=False, recorded=recorded)
    assert [(r["kind"], r["action"]) for r in rows] == [("env files", "skipped")]
    assert "Socket timed out" in rows[0]["why"] and files["again"].exists()

    # the connection breaks before the delete: the file waits for the next sweep, the sweep goes on
    from airflow_provider_tao.hooks.slurm.ssh import SlurmTransportError

    _fake_bin(tmp_path, "squeue", "exit 0\n")
    listing = hook.run

    def broken(command: str, stdin: bytes | None = None, timeout: float = 300.0) -> Any:
        if "rm -f" in command:  # the delete, not the listing
            raise SlurmTransportError("cannot reach the login node: timed out")
        return listing(command, stdin, timeout)

    monkeypatch.setattr(hook, "run", broken)
    rows = hook.reap_resources(task_state, dry_run=False, recorded=recorded)
    # the queue is empty now: the jobs that ran or queued have ended, and their tasks are over
    assert [(r["resource"], r["action"]) for r in rows] == [
        (str(files[name]), "failed") for name in ("running", "queued", "again")
    ]
    assert all(r["why"].endswith("rm failed: cannot reach the login node: timed out") for r in rows)
    assert all(files[name].exists() for name in ("running", "queued", "again"))


# ----------------------------------------------------------------------------- the triggerer side, run locally


class _LocalEntry:
    """Runs the hook's real remote commands with the local shell against fake squeue/sacct (PATH)."""

    def __init__(self, path: str) -> None:
        from airflow_provider_tao.hooks.slurm.ssh import SSHSettings, _Entry

        self.entry = _Entry(asyncio.get_running_loop(), SSHSettings(("h",), 22, "u"))
        self.path = path
        self.commands: list[str] = []

        async def run(command: str, stdin: bytes | None = None, timeout: float = 60.0) -> Any:
            from airflow_provider_tao.hooks.slurm.ssh import Result

            # the program each command starts with (past environment assignments such as SLURM_TIME_FORMAT=%s)
            self.commands.append(next(word for word in command.split() if "=" not in word))
            proc = await asyncio.create_subprocess_exec(
                "sh", "-c", command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env={**os.environ, "PATH": f"{self.path}:{os.environ['PATH']}"},
            )  # fmt: skip
            out, err = await proc.communicate(stdin or b"")
            return Result(proc.returncode or 0, out, err)

        self.entry.run = run  # type: ignore[method-assign]


async def test_poller_reads_logs_in_its_status_command_and_waits_for_accounting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from airflow_provider_tao.hooks.slurm.ssh import AsyncPool

    root = tmp_path / "root"
    hook = _hook(monkeypatch, results_root=str(root))
    await hook.aload_connection()
    state = tmp_path / "state"
    state.mkdir()
    _fake_bin(tmp_path, "squeue", f"cat {state}/squeue\n")
    _fake_bin(tmp_path, "sacct", f"cat {state}/sacct\n")
    local = _LocalEntry(str(tmp_path / "bin"))
    monkeypatch.setattr(AsyncPool, "entry", classmethod(lambda cls, key, settings: local.entry))

    run, wait = (JobHandle("slurm", "slurm_x", f"j{i}", "n", backend_job_id=str(10 + i)) for i in (1, 2))
    out = Path(hook.layout("j1", "n").out_file)
    out.parent.mkdir(parents=True)
    out.write_bytes(b"a\nb\npar")
    Path(hook.layout("j1", "n").err_file).write_bytes(b"e1\n")
    (state / "squeue").write_text("11|RUNNING|None|c1\n12|PENDING|Priority|\n")
    (state / "sacct").write_text("")

    statuses = await hook.aget_job_statuses([run, wait])
    assert statuses["j1"].state is JobState.RUNNING and statuses["j2"].message == "PENDING (Priority)"
    assert local.commands == ["squeue"]  # no log read for a job whose trigger has not asked (stream_logs=False)
    # the first read, from the trigger's stored cursor, only registers it: the next poll's command reads the bytes
    assert await hook.aget_job_logs(run, "") == ("", "0")
    assert await hook.aget_job_logs(wait, "") == ("", "0")  # pending: no log yet
    assert len(local.commands) == 1
    await hook.aget_job_statuses([run, wait])
    assert len(local.commands) == 2  # squeue + the new log bytes in ONE command
    text, offset = await hook.aget_job_logs(run, "0")
    assert text == "a\nb\ne1\n" and len(local.commands) == 2  # served from the poll; "par" waits for its newline

    with out.open("ab") as f:
        f.write(b"tial\nc\n")
    await hook.aget_job_statuses([run, wait])
    text, offset = await hook.aget_job_logs(run, offset)
    assert text == "partial\nc\n" and len(local.commands) == 3
    # a reader the poll did not expect (e.g. a restarted triggerer's cursor): read by the next poll's command
    assert await hook.aget_job_logs(run, "2") == ("", "2")
    await hook.aget_job_statuses([run, wait])
    assert (await hook.aget_job_logs(run, "2"))[0] == "b\npartial\nc\ne1\n" and len(local.commands) == 4
    offset = str(slog.pack_offset(len(b"a\nb\npartial\nc\n"), len(b"e1\n")))

    # squeue says FAILED before sacct knows: Running for a moment rather than a failure without its exit code
    (state / "squeue").write_text("11|FAILED|NonZeroExitCode|c1\n12|PENDING|Priority|\n")
    (state / "sacct").write_text("11|RUNNING|0:0|None|c1\n")
    assert (await hook.aget_job_statuses([run, wait]))["j1"].state is JobState.RUNNING
    assert local.commands[-2:] == ["squeue", "sacct"]
    with out.open("ab") as f:
        f.write(b"last words")
    (state / "sacct").write_text("11|FAILED|3:0|NonZeroExitCode|c1\n")
    failed = (await hook.aget_job_statuses([run, wait]))["j1"]
    assert (failed.state, failed.exit_code) == (JobState.ERROR, 3)
    count = len(local.commands)
    text, offset = await hook.aget_job_logs(run, offset)
    assert text == "last words\n"  # final: the partial line too
    assert await hook.aget_job_logs(run, offset) == ("", offset)  # the trigger's final read: free
    assert len(local.commands) == count


async def test_fifty_watched_jobs_cost_one_command_per_poll_with_their_logs_and_every_line_arrives(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """50 streaming triggers on one connection: every poll is ONE command (squeue + every job's new log bytes), their
    first reads included; a quiet job's burst at its end, longer than a poll's share of bytes, still reaches
    the task log in full; every job's lines arrive in order, each once."""
    from airflow_provider_tao.hooks.slurm.ssh import AsyncPool
    from airflow_provider_tao.triggers.job import TAOJobTrigger
    from airflow_provider_tao.triggers.poller import StatusPoller

    hook = _hook(monkeypatch, results_root=str(tmp_path / "root"))
    state = tmp_path / "state"
    state.mkdir()
    _fake_bin(tmp_path, "squeue", f"cat {state}/squeue\n")
    _fake_bin(tmp_path, "sacct", f"cat {state}/sacct\n")
    local = _LocalEntry(str(tmp_path / "bin"))
    monkeypatch.setattr(AsyncPool, "entry", classmethod(lambda cls, key, settings: local.entry))
    handles = [JobHandle("slurm", "slurm_x", f"j{i:02}", "n", backend_job_id=str(100 + i)) for i in range(50)]
    files = {h.job_id: Path(hook.layout(h.job_id, "n").out_file) for h in handles}
    for path in files.values():
        path.parent.mkdir(parents=True)
        path.write_bytes(b"")
    (state / "squeue").write_text("".join(f"{h.backend_job_id}|RUNNING|None|c1\n" for h in handles))
    (state / "sacct").write_text("")

    def emit(handle: JobHandle, lines: int, width: int = 0) -> None:
        with files[handle.job_id].open("ab") as f:
            for _ in range(lines):
                f.write(f"{handle.job_id} line {f.tell():08} {'x' * width}\n".encode())

    triggers = [TAOJobTrigger(handle=h.to_json(), poll_interval=0.1) for h in handles]
    tasks = [asyncio.ensure_future(anext(t.run())) for t in triggers]
    # ten rounds of lines, and on until a poll has seen the other jobs' logs quiet (a busy machine polls late)
    deadline, rounds, quiet = time.monotonic() + 300, 0, False
    while rounds < 10 or not quiet:
        assert time.monotonic() < deadline, "the quiet jobs' logs were never seen quiet"
        for h in handles[:10]:
            emit(h, 2)
        await asyncio.sleep(0.1)
        rounds += 1
        poller = StatusPoller.existing("slurm", "slurm_x")
        quiet = poller is not None and not any(poller.hook.log_news(h.job_id) for h in handles[10:])  # no reads
    assert set(local.commands) == {"squeue"}  # the logs came with the status: one command per poll

    emit(handles[0], 1100, width=1000)  # 1.1 MB: more than one read of a job (a poll reads less)
    for h in handles[1:]:
        emit(h, 1)
    (state / "squeue").write_text("")
    (state / "sacct").write_text("".join(f"{h.backend_job_id}|COMPLETED|0:0|None|c1\n" for h in handles))
    events = await asyncio.wait_for(asyncio.gather(*tasks), 300)
    assert {e.payload["status"] for e in events} == {"complete"}
    out = capsys.readouterr().out
    for h in handles:
        shown = re.findall(rf"\[job\] ({h.job_id} line \d+) ", out)
        written = re.findall(rf"^({h.job_id} line \d+) ", files[h.job_id].read_text(), re.M)
        assert shown == written, h.job_id
