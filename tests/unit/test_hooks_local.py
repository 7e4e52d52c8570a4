"""The ``local`` platform for real: real detached process groups in a temporary jobs folder.

The connection is a real Airflow connection given as an ``AIRFLOW_CONN_<ID>`` JSON environment variable (the way
``BaseHook.get_connection`` resolves it outside a task), or ``conn_id=None`` with ``AIRFLOW_HOME`` in a tmp folder.
Every job started here is killed at teardown if it is still alive (identified by its ``TAO_JOB_ID``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.hooks.local import LocalHook
from airflow_provider_tao.hooks.local import supervisor as local_supervisor
from airflow_provider_tao.hooks.ownership import CancelOutcome
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobSpec, JobState, JobStatus
from tests.unit.lifecycle_steps import alive as _alive

CONN_ID = "tao_local_unit"
GRACE = 0.5  # cancel_grace_seconds of the test connection
PATIENT_CONN_ID = "tao_local_patient"  # same folders, a long grace: for tests where SIGTERM must be enough
PATIENT_GRACE = 10.0
PY = sys.executable


# ----------------------------------------------------------------------------- fixtures and helpers


def _kill_leftovers(jobs_dir: Path) -> list[int]:
    """SIGKILL what is left of jobs started by a test (only processes carrying that job's TAO_JOB_ID)."""
    killed = []
    if not jobs_dir.is_dir():
        return killed
    for job_dir in jobs_dir.iterdir():
        if not (job_dir / "launch.json").exists():
            continue  # never launched (or not a job folder)
        deadline = time.monotonic() + 5  # a job submitted at the very end of a test may still be starting
        while not (job_dir / "pid").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            pgid = int(json.loads((job_dir / "pid").read_text())["pgid"])
        except (OSError, ValueError, KeyError):
            continue
        marker = f"TAO_JOB_ID={job_dir.name}".encode()
        for pid in local_supervisor.group_members(pgid):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker in environ:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
    return killed


@pytest.fixture
def local_env(tmp_path, monkeypatch):
    """A ``tao_local`` connection (``AIRFLOW_CONN_TAO_LOCAL_UNIT``) with tmp jobs/results folders."""
    home = tmp_path / "airflow_home"
    home.mkdir()
    monkeypatch.setenv("AIRFLOW_HOME", str(home))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPUs, whatever the host has
    jobs_dir = tmp_path / "jobs"
    results_root = tmp_path / "results"
    for conn_id, grace in ((CONN_ID, GRACE), (PATIENT_CONN_ID, PATIENT_GRACE)):
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{conn_id.upper()}",
            json.dumps(
                {
                    "conn_type": "tao_local",
                    "extra": {
                        "jobs_dir": str(jobs_dir),
                        "results_root": str(results_root),
                        "cancel_grace_seconds": grace,
                    },
                }
            ),
        )
    yield {"jobs_dir": jobs_dir, "results_root": results_root, "home": home}
    _kill_leftovers(jobs_dir)
    _kill_leftovers(home / "tao" / "jobs")


@pytest.fixture
def hook(local_env) -> LocalHook:
    return LocalHook(conn_id=CONN_ID)


def make_spec(command, **overrides) -> JobSpec:
    values = {"name": "unit-job", "job_id": uuid.uuid4().hex[:12], "command": command, "gpu_count": 0}
    values.update(overrides)
    return JobSpec(**values)


def wait_for(predicate, timeout: float = 120.0, interval: float = 0.02):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {predicate}")
        time.sleep(interval)


def wait_terminal(hook: LocalHook, handle: JobHandle, timeout: float = 120.0) -> JobStatus:
    statuses: list[JobStatus] = []

    def done():
        statuses.append(hook.get_job_status(handle))
        return statuses[-1].state.is_terminal

    try:
        wait_for(done, timeout)
    except AssertionError:
        raise AssertionError(f"job {handle.job_id} not terminal after {timeout} s: {statuses[-1]}") from None
    return statuses[-1]


def wait_log(hook: LocalHook, handle: JobHandle, text: str, count: int = 1, timeout: float = 120.0) -> str:
    """The job's log once ``text`` appears in it ``count`` times."""

    def seen():
        log = hook.get_job_logs(handle)[0]
        return log if log.count(text) >= count else None

    return wait_for(seen, timeout)


def whole_log(hook: LocalHook, handle: JobHandle) -> str:
    return (hook.jobs_dir / handle.job_id / "job.log").read_bytes().decode()


def pid_record(hook: LocalHook, handle: JobHandle) -> dict:
    path = hook.jobs_dir / handle.job_id / "pid"
    wait_for(path.exists)
    return json.loads(path.read_text())


def group_gone(pgid: int, timeout: float = 120.0) -> None:
    try:
        wait_for(lambda: not local_supervisor.group_members(pgid), timeout)
    except AssertionError:
        raise AssertionError(f"process group {pgid} still has {local_supervisor.group_members(pgid)}") from None


def job_dirs(jobs_dir: Path) -> list[str]:
    return sorted(p.name for p in jobs_dir.iterdir() if not p.name.startswith("_")) if jobs_dir.is_dir() else []


# ----------------------------------------------------------------------------- connection and settings


def test_connection_extras_are_used(hook, local_env):
    assert hook.jobs_dir == local_env["jobs_dir"]
    assert hook.results_root == local_env["results_root"]
    assert hook.cancel_grace_seconds == GRACE


def test_no_connection_uses_airflow_home(local_env):
    hook = LocalHook(conn_id=None)
    home = local_env["home"]
    assert hook.jobs_dir == home / "tao" / "jobs"
    assert hook.results_root == home / "tao" / "results"
    assert hook.cancel_grace_seconds == 10
    handle = hook.create_job(make_spec("echo no-conn"))
    assert wait_terminal(hook, handle).state is JobState.COMPLETE
    assert (home / "tao" / "jobs" / handle.job_id / "job.log").read_text() == "no-conn\n"
    assert handle.results_dir == str(home / "tao" / "results" / handle.job_id)
    assert Path(handle.results_dir).is_dir()
    assert handle.conn_id is None


def test_tao_config_section_is_the_fallback_without_connection(local_env, tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__TAO__LOCAL_JOBS_DIR", str(tmp_path / "cfg-jobs"))
    monkeypatch.setenv("AIRFLOW__TAO__LOCAL_RESULTS_ROOT", str(tmp_path / "cfg-results"))
    hook = LocalHook(conn_id=None)
    assert hook.jobs_dir == tmp_path / "cfg-jobs"
    assert hook.results_root == tmp_path / "cfg-results"


def test_connection_of_another_type_is_rejected_naming_conn_id(local_env, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_NOT_LOCAL", json.dumps({"conn_type": "tao_slurm", "host": "h"}))
    with pytest.raises(JobValidationError) as exc:
        LocalHook(conn_id="not_local").jobs_dir  # noqa: B018
    assert exc.value.parameter == "conn_id"
    assert str(exc.value).startswith("conn_id: ")
    assert "tao_slurm" in str(exc.value)


# ----------------------------------------------------------------------------- submit / complete / fail


def test_submit_and_complete_with_exit_0(hook, local_env):
    spec = make_spec("echo hello; echo to-stderr >&2", name="train-ok")
    handle = hook.create_job(spec, try_number=3)
    assert handle.platform == "local"
    assert handle.conn_id == CONN_ID
    assert handle.job_id == spec.job_id
    assert handle.name == "train-ok"
    assert handle.try_number == 3
    assert handle.results_dir == str(local_env["results_root"] / spec.job_id)
    assert Path(handle.results_dir).is_dir()
    assert handle.console_url == f"file://{os.uname().nodename}{local_env['jobs_dir'] / spec.job_id / 'job.log'}"
    assert int(handle.backend_job_id) == pid_record(hook, handle)["pid"]
    assert abs(handle.submitted_at - time.time()) < 30

    status = wait_terminal(hook, handle)
    assert status.state is JobState.COMPLETE
    assert status.exit_code == 0
    assert status.raw_state == "EXITED"
    assert whole_log(hook, handle) == "hello\nto-stderr\n"
    assert hook.get_failure_analysis(handle) is None
    assert hook.get_job_results_dir(handle) == handle.results_dir
    assert hook.job_owner(handle) == 3


def test_a_job_that_ends_while_the_jobs_folder_is_away_keeps_its_verdict(hook, local_env):
    """The jobs folder on a network filesystem goes away for a while (the matrix's outage of the local platform):
    the job runs on, ends meanwhile, and its verdict is written once the folder is back -- not lost (which would
    read as a killed job and fail the task)."""
    handle = hook.create_job(make_spec("echo started; sleep 2; echo done"))
    pid_record(hook, handle)
    deadline = time.monotonic() + 60
    while whole_log(hook, handle) != "started\n":  # the command runs (its folder is not needed any more)
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    away = local_env["jobs_dir"].with_name("jobs-away")
    local_env["jobs_dir"].rename(away)
    try:
        time.sleep(3)  # the job ends while its folder is gone
        with pytest.raises(ConnectionError, match="is not there"):  # the poller's Unknown
            hook.get_job_status(handle)
    finally:
        away.rename(local_env["jobs_dir"])
    status = wait_terminal(hook, handle)
    assert (status.state, status.exit_code) == (JobState.COMPLETE, 0)
    assert whole_log(hook, handle) == "started\ndone\n"


def test_nonzero_exit_is_error_with_program_analysis(hook):
    script = "import sys\nprint('epoch 1', flush=True)\nraise ValueError('boom at epoch 2')\n"
    handle = hook.create_job(make_spec([PY, "-c", script]))
    status = wait_terminal(hook, handle)
    assert status.state is JobState.ERROR
    assert status.exit_code == 1
    assert "exit code 1" in status.message
    analysis = hook.get_failure_analysis(handle)
    assert analysis is not None
    assert analysis.err_class is ErrClass.ERR_PROGRAM
    assert analysis.retriable is False
    assert analysis.evidence[0] == "Traceback (most recent call last):"
    assert analysis.evidence[-1] == "ValueError: boom at epoch 2"
    assert analysis.details["exit_code"] == 1
    assert analysis.details["log"] == str(hook.jobs_dir / handle.job_id / "job.log")


def test_command_not_found_is_a_config_error(hook):
    handle = hook.create_job(make_spec("no-such-command-tao-unit --help"))
    status = wait_terminal(hook, handle)
    assert (status.state, status.exit_code) == (JobState.ERROR, 127)
    assert hook.get_failure_analysis(handle).err_class is ErrClass.ERR_CONFIG


def test_argv_with_a_missing_executable_is_a_config_error(hook, tmp_path):
    handle = hook.create_job(make_spec([str(tmp_path / "missing-binary"), "x"]))
    status = wait_terminal(hook, handle)
    assert (status.state, status.exit_code) == (JobState.ERROR, 127)
    assert "cannot start" in whole_log(hook, handle)
    assert hook.get_failure_analysis(handle).err_class is ErrClass.ERR_CONFIG


def test_death_by_sigsegv_is_a_program_error(hook):
    handle = hook.create_job(make_spec([PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]))
    status = wait_terminal(hook, handle)
    assert (status.state, status.exit_code) == (JobState.ERROR, -signal.SIGSEGV)
    assert "SIGSEGV" in status.message
    analysis = hook.get_failure_analysis(handle)
    assert analysis.err_class is ErrClass.ERR_PROGRAM
    assert analysis.details["signal"] == "SIGSEGV"


def test_running_job_has_no_failure_analysis(hook):
    handle = hook.create_job(make_spec("sleep 30"))
    wait_for(lambda: hook.get_job_status(handle).state is JobState.RUNNING)
    assert hook.get_failure_analysis(handle) is None
    assert hook.cancel_job(handle) is CancelOutcome.STOPPED


# ----------------------------------------------------------------------------- the job's environment


def test_job_env_is_clean_and_carries_the_spec(hook, local_env, monkeypatch):
    worker_secrets = {
        "AIRFLOW_CONN_SECRET": "postgres://user:worker-conn-secret@db/x",
        "AIRFLOW__CORE__FERNET_KEY": "worker-fernet-key-secret",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://u:worker-db-secret@db/airflow",
        "AWS_SECRET_ACCESS_KEY": "worker-aws-secret",
    }
    for key, value in worker_secrets.items():
        monkeypatch.setenv(key, value)
    dump = "import json, os\nprint(json.dumps(dict(os.environ)))\n"
    script = (
        dump
        + "files = os.environ['TAO_JOB_FILES']\n"
        + "print(json.dumps({n: open(os.path.join(files, n)).read() for n in ('spec.yaml', 'sub/args.txt')}))\n"
    )
    spec = make_spec(
        [PY, "-c", script],
        env={"EPOCHS": "3", "QUOTED": "a 'b' \"c\" $HOME {x}", "EMPTY": ""},
        secret_env={"HF_TOKEN": "job-secret-token"},
        files={"spec.yaml": b"train:\n  epochs: 3\n", "sub/args.txt": b"--lr 0.1"},
    )
    handle = hook.create_job(spec)
    assert wait_terminal(hook, handle).state is JobState.COMPLETE
    env_line, files_line = whole_log(hook, handle).splitlines()
    env = json.loads(env_line)

    for key, value in worker_secrets.items():
        assert key not in env
        assert value not in env_line
    assert not [key for key in env if key.startswith("AIRFLOW")]
    assert env["EPOCHS"] == "3"
    assert env["QUOTED"] == "a 'b' \"c\" $HOME {x}"
    assert env["EMPTY"] == ""
    assert env["HF_TOKEN"] == "job-secret-token"
    assert env["TAO_JOB_ID"] == handle.job_id == spec.job_id
    assert env["TAO_RESULTS_ROOT"] == str(local_env["results_root"])
    assert Path(env["TAO_RESULTS_ROOT"], env["TAO_JOB_ID"]) == Path(handle.results_dir)
    assert env["TAO_JOB_FILES"] == str(hook.jobs_dir / handle.job_id / "files")
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["PATH"] == os.environ["PATH"]
    assert json.loads(files_line) == {"spec.yaml": "train:\n  epochs: 3\n", "sub/args.txt": "--lr 0.1"}


def test_secret_values_are_not_written_to_the_job_folder(hook):
    secret = "job-secret-" + uuid.uuid4().hex
    handle = hook.create_job(make_spec("echo done", secret_env={"API_KEY": secret}))
    assert wait_terminal(hook, handle).state is JobState.COMPLETE
    job_dir = hook.jobs_dir / handle.job_id
    for path in job_dir.rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path
    assert secret not in json.dumps(handle.to_json())
    assert oct(job_dir.stat().st_mode & 0o777) == oct(0o700)


def test_a_dag_authors_secret_env_reaches_the_local_job_only(local_env, monkeypatch):
    """Issue 38.6 on ``local``: ``secret_env`` (a connection field reference) reaches the job's environment through
    its secret channel, is in no file of the job folder, and ``airflow tao logs`` masks it."""
    from airflow_provider_tao.joblog import readable_log
    from airflow_provider_tao.operators.submit import TAOSubmitOperator
    from airflow_provider_tao.received_secrets import job_secrets
    from airflow_provider_tao.records import STATE_KEY, JobRecord
    from tests.unit.fakes import Store, make_context

    secret = "author-secret-" + uuid.uuid4().hex
    monkeypatch.setenv("AIRFLOW_CONN_MY_HF", json.dumps({"conn_type": "generic", "password": secret}))
    op = TAOSubmitOperator(
        task_id="train", conn_id=CONN_ID, gpu_count=0, deferrable=False, poll_interval=0.05,
        command='echo "token=$HF_TOKEN" && printf %s "$HF_TOKEN" > "$TAO_RESULTS_ROOT/$TAO_JOB_ID/got"',
        secret_env={"HF_TOKEN": "conn:my_hf.password"},
    )  # fmt: skip
    store = Store()
    result = op.execute(make_context(store))
    assert result["state"] == "Complete"
    assert (Path(result["results_dir"]) / "got").read_text() == secret  # the job got it
    for path in (local_env["jobs_dir"] / result["job_id"]).rglob("*"):
        if path.is_file() and path.name != "job.log":  # (the job printed it itself: its own log)
            assert secret not in path.read_text(errors="replace"), path
    record = JobRecord.from_json(store.get(STATE_KEY))
    assert record is not None and secret not in json.dumps(store.get(STATE_KEY))
    hook = LocalHook(conn_id=CONN_ID)
    text, _ = hook.get_job_logs(record.job)
    assert f"token={secret}" in text
    assert "token=***" in readable_log(text, job_secrets(record.secret_conn_ids, CONN_ID))


def test_staged_files_are_private_and_cannot_escape(hook):
    handle = hook.create_job(make_spec("true", files={"a/b.txt": b"x"}))
    staged = hook.jobs_dir / handle.job_id / "files" / "a" / "b.txt"
    assert staged.read_text() == "x"
    assert staged.stat().st_mode & 0o077 == 0
    with pytest.raises(JobValidationError) as exc:
        hook.create_job(make_spec("true", files={"../../escape.txt": b"x"}))
    assert exc.value.parameter == "files"
    assert not (hook.jobs_dir / "escape.txt").exists()
    assert not (hook.jobs_dir.parent / "escape.txt").exists()


def test_string_command_runs_under_exactly_one_bash_verbatim(hook):
    command = textwrap.dedent(
        """\
        echo "home=${HOME}"
        echo 'braces={x} {0} {}'
        echo "quote=it's \\"quoted\\""
        echo 'subst=$(echo nope) `echo nope` $HOME'
        echo "real=$(echo yes)"
        echo "shlvl=$SHLVL"
        echo "parent=$(cat /proc/$PPID/comm)"
        cat /proc/$$/cmdline > cmdline.bin
        printf 'multi\\nline\\n'
        echo end"""
    )
    handle = hook.create_job(make_spec(command))
    assert wait_terminal(hook, handle).state is JobState.COMPLETE
    lines = whole_log(hook, handle).splitlines()
    parent = lines.pop(6)
    assert lines == [
        f"home={os.environ['HOME']}",
        "braces={x} {0} {}",
        'quote=it\'s "quoted"',
        "subst=$(echo nope) `echo nope` $HOME",
        "real=yes",
        "shlvl=1",  # one bash, not a shell started by another shell
        "multi",
        "line",
        "end",
    ]
    assert parent.startswith("parent=python"), parent  # bash's parent is the supervisor, not another shell
    # bash got the command as its one -c argument, byte for byte (newlines included)
    argv = (hook.jobs_dir / handle.job_id / "work" / "cmdline.bin").read_bytes().split(b"\0")
    assert argv == [b"/bin/bash", b"-c", command.encode(), b""]


def test_argv_list_runs_without_a_shell(hook):
    argv = ["/bin/echo", "$HOME", "{x}", "a b", "'q'", '"dq"', "$(echo no)", "`echo no`", "l1\nl2", "*"]
    handle = hook.create_job(make_spec(argv))
    assert wait_terminal(hook, handle).state is JobState.COMPLETE
    assert whole_log(hook, handle) == " ".join(argv[1:]) + "\n"


def test_stdin_is_dev_null(hook):
    command = "readlink /proc/self/fd/0; cat; echo cat-rc=$?; readlink /proc/$PPID/fd/0"
    handle = hook.create_job(make_spec(command))
    status = wait_terminal(hook, handle)  # a `cat` reading a terminal or pipe would hang
    assert status.state is JobState.COMPLETE
    assert whole_log(hook, handle).splitlines() == ["/dev/null", "cat-rc=0", "/dev/null"]


def test_job_runs_in_its_work_folder(hook):
    handle = hook.create_job(make_spec("pwd"))
    wait_terminal(hook, handle)
    assert whole_log(hook, handle).strip() == str(hook.jobs_dir / handle.job_id / "work")


# ----------------------------------------------------------------------------- GPUs


@pytest.mark.parametrize(("gpu_count", "exported"), [(2, "0,1"), (-1, "0,1"), (1, "0"), (0, "")])
def test_gpu_count_is_exported_as_cuda_visible_devices(hook, monkeypatch, gpu_count, exported):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    handle = hook.create_job(make_spec('printf "%s" "${CUDA_VISIBLE_DEVICES-unset}"', gpu_count=gpu_count))
    assert wait_terminal(hook, handle).state is JobState.COMPLETE
    assert whole_log(hook, handle) == exported


def test_more_gpus_than_visible_is_rejected_naming_gpu_count(hook, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(JobValidationError) as exc:
        hook.create_job(make_spec("true", gpu_count=3))
    assert exc.value.parameter == "gpu_count"
    assert str(exc.value).startswith("gpu_count: ")
    assert "2 visible" in str(exc.value)
    assert job_dirs(hook.jobs_dir) == []


def test_gpu_count_on_a_host_without_gpus(hook, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(JobValidationError) as exc:
        hook.validate_spec(make_spec("true", gpu_count=1))
    assert exc.value.parameter == "gpu_count"
    hook.validate_spec(make_spec("true", gpu_count=-1))  # "all" of none is fine
    hook.validate_spec(make_spec("true", gpu_count=0))


def test_gpu_count_below_minus_one_is_rejected(hook, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(JobValidationError) as exc:
        hook.create_job(make_spec("true", gpu_count=-2))
    assert exc.value.parameter == "gpu_count"
    assert job_dirs(hook.jobs_dir) == []


# ----------------------------------------------------------------------------- validation before anything runs


@pytest.mark.parametrize(
    ("overrides", "parameter"),
    [
        ({"num_nodes": 2}, "num_nodes"),
        ({"num_nodes": 0}, "num_nodes"),
        ({"env": {"EPOCHS": 3}}, "env['EPOCHS']"),
        ({"env": {"FLAG": True}}, "env['FLAG']"),
        ({"env": {"NONE": None}}, "env['NONE']"),
        ({"secret_env": {"TOKEN": 123}}, "env['TOKEN']"),
        ({"env": {"BAD-NAME": "x"}}, "env['BAD-NAME']"),
        ({"name": "bad name"}, "job_name"),
        ({"name": "../escape"}, "job_name"),
        ({"name": "a/b"}, "job_name"),
        ({"name": "-leading-dash"}, "job_name"),
        ({"name": ""}, "job_name"),
        ({"name": "x" * 129}, "job_name"),
        ({"results_uri": "gs://bucket/results"}, "results_uri"),
        ({"results_uri": "https://example.com/results"}, "results_uri"),
        ({"results_uri": "relative/results"}, "results_uri"),
        ({"command": ""}, "command"),
        ({"command": []}, "command"),
    ],
)
def test_bad_input_is_rejected_before_anything_runs(hook, overrides, parameter):
    with pytest.raises(JobValidationError) as exc:
        hook.create_job(make_spec(overrides.pop("command", "touch ran"), **overrides))
    assert exc.value.parameter == parameter
    assert str(exc.value).startswith(f"{parameter}: ")
    assert job_dirs(hook.jobs_dir) == []
    assert not (hook.jobs_dir / "_names").exists()


def test_num_nodes_message_says_single_node(hook):
    with pytest.raises(JobValidationError, match="single-node"):
        hook.validate_spec(make_spec("true", num_nodes=4))


def test_env_value_error_suggests_the_string(hook):
    with pytest.raises(JobValidationError, match=r"env\['EPOCHS'\]: 3 is not a string. Quote it: '3'"):
        hook.validate_spec(make_spec("true", env={"EPOCHS": 3}))


@pytest.mark.parametrize("name", ["a", "Train_v2.1-final", "x" * 128, "0abc"])
def test_valid_job_names_are_accepted(hook, name):
    hook.validate_spec(make_spec("true", name=name))


def test_file_results_uri_wins_over_the_results_root(hook, tmp_path):
    target = tmp_path / "explicit-results"
    handle = hook.create_job(make_spec('echo "$TAO_RESULTS_ROOT"', results_uri=target.as_uri()))
    assert wait_terminal(hook, handle).state is JobState.COMPLETE
    assert handle.results_dir == str(target / handle.job_id)
    assert whole_log(hook, handle).strip() == str(target)


def test_image_is_optional_and_ignored_on_local(hook):
    handle = hook.create_job(make_spec("echo ran", image="ubuntu:22.04"))
    assert wait_terminal(hook, handle).state is JobState.COMPLETE


# ----------------------------------------------------------------------------- durability


SUBMITTER = """
import json, os, signal, sys
from airflow_provider_tao.hooks.local import LocalHook
from airflow_provider_tao.jobs import JobSpec

hook = LocalHook(conn_id=sys.argv[1])
# The job waits for the test's go-ahead (a file in its work folder), so it is surely running when checked.
command = "for i in $(seq 600); do [ -e go ] && break; sleep 0.05; done; echo survived"
spec = JobSpec(name="survivor", job_id=sys.argv[2], command=command, gpu_count=0)
handle = hook.create_job(spec)
print(json.dumps(handle.to_json()), flush=True)
if sys.argv[3] == "killpg":
    os.killpg(0, signal.SIGKILL)  # the worker and its whole process group die at once
"""


@pytest.mark.parametrize("how", ["exit", "killpg"])
def test_job_survives_its_submitter(hook, how):
    job_id = uuid.uuid4().hex[:12]
    proc = subprocess.run(  # noqa: PLW1510 -- the return code is asserted with the output
        [PY, "-c", SUBMITTER, CONN_ID, job_id, how],
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,  # its own group, so killpg(0) hits the submitter only
        env=os.environ.copy(),
    )
    assert proc.returncode == (0 if how == "exit" else -signal.SIGKILL), proc.stderr
    handle = JobHandle.from_json(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert handle.job_id == job_id
    # The submitter is gone; the job is not.
    record = pid_record(hook, handle)
    assert hook.get_job_status(handle).state is JobState.RUNNING
    assert _alive(record["pid"])
    assert os.getsid(record["pid"]) == record["pid"] == record["pgid"]  # its own session
    (hook.jobs_dir / handle.job_id / "work" / "go").touch()
    status = wait_terminal(hook, handle)
    assert status.state is JobState.COMPLETE, status
    assert whole_log(hook, handle) == "survived\n"
    assert hook.find_job("survivor").job_id == job_id


def test_find_job_by_name_returns_the_newest(hook):
    first = hook.create_job(make_spec("echo first", name="same-name"))
    second = hook.create_job(make_spec("echo second", name="same-name"))
    other = hook.create_job(make_spec("echo other", name="other-name"))
    pid_record(hook, second)  # the platform id is known once the supervisor is up
    found = hook.find_job("same-name")
    assert found is not None
    assert found.job_id == second.job_id != first.job_id
    assert found.backend_job_id == second.backend_job_id
    assert found.results_dir == second.results_dir
    assert found.console_url == second.console_url
    assert found.try_number == second.try_number
    assert hook.find_job("other-name").job_id == other.job_id
    assert hook.find_job("no-such-name") is None
    for handle in (first, second, other):
        assert wait_terminal(hook, handle).state is JobState.COMPLETE
    assert whole_log(hook, found) == "second\n"


def test_find_job_works_before_the_supervisor_records_its_pid(hook):
    handle = hook.create_job(make_spec("sleep 0.2", name="early"))
    found = hook.find_job("early")  # right after submission
    assert found is not None and found.job_id == handle.job_id
    assert wait_terminal(hook, found).state is JobState.COMPLETE


def test_get_job_status_of_an_unknown_job_is_unknown_not_failed(hook):
    hook.jobs_dir.mkdir(parents=True)
    ghost = JobHandle(platform="local", conn_id=CONN_ID, job_id="doesnotexist", name="ghost")
    status = hook.get_job_status(ghost)
    assert status.state is JobState.UNKNOWN
    assert status.not_found
    assert hook.get_job_logs(ghost, "7") == ("", "7")


def _fake_job_without_pid(hook: LocalHook, submitted_ago: float) -> JobHandle:
    handle = JobHandle(
        platform="local",
        conn_id=CONN_ID,
        job_id=uuid.uuid4().hex[:12],
        name="never-started",
        submitted_at=time.time() - submitted_ago,
    )
    job_dir = hook.jobs_dir / handle.job_id
    (job_dir / "marks").mkdir(parents=True)
    (job_dir / "meta.json").write_text(json.dumps(handle.to_json()))
    return handle


def test_a_job_whose_supervisor_never_came_up_is_an_error_after_the_launch_timeout(hook):
    fresh = _fake_job_without_pid(hook, submitted_ago=1)
    assert hook.get_job_status(fresh).state is JobState.PENDING
    stale = _fake_job_without_pid(hook, submitted_ago=3600)
    status = hook.get_job_status(stale)
    assert status.state is JobState.ERROR
    assert "never started" in status.message
    canceled = _fake_job_without_pid(hook, submitted_ago=3600)
    hook.write_mark(canceled, "cancel_requested_by", 1)
    assert hook.get_job_status(canceled).state is JobState.CANCELED


WAIT_FOR_GO = "for i in $(seq 600); do [ -e go ] && break; sleep 0.05; done"  # the test says when to go on


def test_vanished_supervisor_is_an_error_with_a_clear_message(hook):
    handle = hook.create_job(make_spec(f"echo started; {WAIT_FOR_GO}; echo orphan-finished"))
    wait_log(hook, handle, "started")
    record = pid_record(hook, handle)
    os.kill(record["pid"], signal.SIGKILL)  # nobody asked for a cancel
    (hook.jobs_dir / handle.job_id / "work" / "go").touch()  # the orphaned command ends by itself
    status = wait_terminal(hook, handle)  # not Running forever
    assert status.state is JobState.ERROR
    assert "vanished" in status.message
    assert str(record["pid"]) in status.message
    assert status.exit_code is None
    assert hook.cancel_requested_by(handle) is None
    analysis = hook.get_failure_analysis(handle)
    assert analysis is not None
    assert analysis.err_class is ErrClass.ERR_INFRA
    assert analysis.retriable


def test_vanished_process_group_is_an_error_at_once(hook):
    handle = hook.create_job(make_spec("echo started; sleep 30"))
    wait_log(hook, handle, "started")
    pgid = pid_record(hook, handle)["pgid"]
    os.killpg(pgid, signal.SIGKILL)
    group_gone(pgid)
    status = hook.get_job_status(handle)
    assert status.state is JobState.ERROR
    assert "vanished" in status.message


def test_a_recorded_process_group_now_owned_by_another_program_is_not_the_job(hook):
    # After a host reboot (the jobs folder is on disk, pids start again from low numbers) or pid wrap-around, the
    # process group number in a vanished job's pid file can belong to an unrelated program. That program is not the
    # job: the job must read as vanished (Error), and a cancel must not signal the stranger.
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        handle = _fake_job_without_pid(hook, submitted_ago=3600)
        job_dir = hook.jobs_dir / handle.job_id
        (job_dir / "launch.json").write_text(json.dumps({"argv": ["sleep", "30"], "cwd": str(job_dir)}))
        (job_dir / "pid").write_text(json.dumps({"pid": stranger.pid, "pgid": stranger.pid}))
        status = hook.get_job_status(handle)
        assert status.state is JobState.ERROR, status
        hook.cancel_job(handle)
        time.sleep(0.2)
        assert stranger.poll() is None, "cancel_job signalled a process that is not the job"
    finally:
        stranger.kill()
        stranger.wait()


# ----------------------------------------------------------------------------- logs


def test_logs_by_byte_offset_concatenate_to_the_whole_log(hook, tmp_path):
    # The job writes half its lines, then waits for the test to have read some: "read in pieces" must not
    # depend on how fast the machine runs the job (a loaded CI ran all 300 lines between two reads).
    gate = tmp_path / "go-on"
    script = (
        "import os, sys, time\n"
        "for i in range(300):\n"
        "    sys.stdout.write(f'line {i:04d} ' + 'x' * (i % 37) + '\\n')\n"
        "    sys.stdout.flush()\n"
        f"    while i == 150 and not os.path.exists({str(gate)!r}): time.sleep(0.01)\n"
        "    if i % 10 == 0: time.sleep(0.01)\n"
    )
    handle = hook.create_job(make_spec([PY, "-c", script]))
    chunks: list[str] = []
    offset = 0
    while True:  # read while the job writes, as the trigger does
        terminal = hook.get_job_status(handle).state.is_terminal
        text, cursor = hook.get_job_logs(handle, str(offset))
        new_offset = int(cursor)
        assert new_offset - offset == len(text.encode())
        chunks.append(text)
        offset = new_offset
        if text:
            gate.touch()
        if terminal:
            break
        time.sleep(0.01)
    text, final = hook.get_job_logs(handle, str(offset))
    assert (text, final) == ("", str(offset))
    whole = whole_log(hook, handle)
    assert "".join(chunks) == whole
    assert offset == len(whole.encode())
    assert whole.count("\n") == 300
    assert len([c for c in chunks if c]) > 1  # really read in pieces


def test_logs_by_offset_keep_multibyte_characters_intact(hook):
    # A progress bar (tqdm) writes multi-byte characters; a chunk boundary must not cut one in half.
    payload = "ab" + "█é" * 350_000 + "\n"  # > 1 MiB; byte 1 MiB falls inside a character
    script = "import sys; sys.stdout.write('ab' + '█é' * 350_000 + '\\n')"
    handle = hook.create_job(make_spec([PY, "-c", script]))
    assert wait_terminal(hook, handle).state is JobState.COMPLETE
    chunks, offset = [], 0
    while True:
        text, cursor = hook.get_job_logs(handle, str(offset))
        new_offset = int(cursor)
        if new_offset == offset:
            break
        chunks.append(text)
        offset = new_offset
    assert offset == len(payload.encode())
    joined = "".join(chunks)
    assert "\ufffd" not in joined, f"replacement character at {joined.index(chr(0xFFFD))} of {len(joined)}"
    assert joined == payload


def test_log_tail(hook):
    handle = hook.create_job(make_spec("for i in $(seq 1 50); do echo line-$i; done"))
    wait_terminal(hook, handle)
    size = len(whole_log(hook, handle).encode())
    assert hook.get_job_logs(handle, tail=3) == ("line-48\nline-49\nline-50\n", str(size))
    assert hook.get_job_logs(handle, tail=1) == ("line-50\n", str(size))
    text, offset = hook.get_job_logs(handle, tail=500)
    assert text == whole_log(hook, handle)
    assert offset == str(size)


def test_log_tail_of_an_empty_log(hook):
    handle = hook.create_job(make_spec("true"))
    wait_terminal(hook, handle)
    assert hook.get_job_logs(handle, tail=5) == ("", "0")


# ----------------------------------------------------------------------------- cancel


def test_cancel_terminates_a_running_job(local_env):
    hook = LocalHook(conn_id=PATIENT_CONN_ID)
    handle = hook.create_job(make_spec("echo started; sleep 30"), try_number=2)
    wait_log(hook, handle, "started")
    pgid = pid_record(hook, handle)["pgid"]
    assert hook.cancel_job(handle) is CancelOutcome.STOPPED
    group_gone(pgid)
    status = wait_terminal(hook, handle)
    assert status.state is JobState.CANCELED
    assert status.exit_code == -signal.SIGTERM  # SIGTERM was enough, no SIGKILL needed
    assert hook.cancel_requested_by(handle) == 2
    analysis = hook.get_failure_analysis(handle)
    assert analysis.err_class is ErrClass.ERR_CANCELED


def test_a_job_submitted_from_a_thread_that_blocks_sigterm_still_stops_on_term(local_env):
    # A signal mask survives fork and exec: a worker thread that blocked SIGTERM must not leave its job deaf.
    hook = LocalHook(conn_id=PATIENT_CONN_ID)
    handles = []

    def submit() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        handles.append(hook.create_job(make_spec("echo started; sleep 30")))

    thread = threading.Thread(target=submit)
    thread.start()
    thread.join()
    (handle,) = handles
    wait_log(hook, handle, "started")
    assert hook.cancel_job(handle) is CancelOutcome.STOPPED
    status = wait_terminal(hook, handle)
    assert (status.state, status.exit_code) == (JobState.CANCELED, -signal.SIGTERM)  # not the grace's SIGKILL


def test_issue_22_hole_5_a_job_that_exits_0_on_sigterm_reads_as_canceled(local_env):
    hook = LocalHook(conn_id=PATIENT_CONN_ID)
    handle = hook.create_job(
        make_spec("trap 'echo checkpoint; exit 0' TERM; echo started; while :; do sleep 0.1; done")
    )
    wait_log(hook, handle, "started")
    assert hook.cancel_job(handle) is CancelOutcome.STOPPED
    status = wait_terminal(hook, handle)
    assert "checkpoint" in whole_log(hook, handle)
    assert (status.state, status.exit_code) == (JobState.CANCELED, 0)


def test_cancel_kills_a_term_ignoring_job_after_the_grace_period(hook):
    handle = hook.create_job(make_spec("trap '' TERM; echo ready; sleep 30 & sleep 30; wait"))
    wait_log(hook, handle, "ready")
    pgid = pid_record(hook, handle)["pgid"]
    start = time.monotonic()
    assert hook.cancel_job(handle) is CancelOutcome.STOPPED
    assert time.monotonic() - start >= GRACE  # the grace was given (a lower bound: load only lengthens it)
    assert local_supervisor.group_members(pgid) == []
    status = hook.get_job_status(handle)
    assert status.state is JobState.CANCELED, status
    assert status.raw_state == "KILLED", status  # killed after the grace, TERM being ignored


def test_cancel_is_idempotent(hook):
    handle = hook.create_job(make_spec("echo started; sleep 30"))
    wait_log(hook, handle, "started")
    assert hook.cancel_job(handle) is CancelOutcome.STOPPED
    assert hook.cancel_job(handle).over  # stopped again, or ended meanwhile
    assert wait_terminal(hook, handle).state is JobState.CANCELED
    assert hook.cancel_job(handle) is CancelOutcome.ENDED
    assert hook.get_job_status(handle).state is JobState.CANCELED


def test_cancel_of_a_completed_job_says_ended_and_keeps_it_complete(hook):
    handle = hook.create_job(make_spec("echo done"))
    assert wait_terminal(hook, handle).state is JobState.COMPLETE
    assert hook.cancel_job(handle) is CancelOutcome.ENDED
    assert hook.cancel_job(handle) is CancelOutcome.ENDED
    status = hook.get_job_status(handle)
    assert (status.state, status.exit_code) == (JobState.COMPLETE, 0)


def test_cancel_of_a_failed_job_says_ended_and_keeps_it_failed(hook):
    # A late cancel (deadline event, a stale on_kill) must not rewrite how the job ended.
    handle = hook.create_job(make_spec("echo failing; exit 3"))
    assert wait_terminal(hook, handle).state is JobState.ERROR
    assert hook.cancel_job(handle) is CancelOutcome.ENDED
    status = hook.get_job_status(handle)
    assert (status.state, status.exit_code) == (JobState.ERROR, 3), status
    assert hook.get_failure_analysis(handle).err_class is ErrClass.ERR_PROGRAM


def test_cancel_right_after_submission_stops_the_job(hook):
    # The supervisor may not have written its pid yet: the cancel must still win.
    handle = hook.create_job(make_spec("sleep 1; echo SHOULD-NOT-RUN"))
    assert hook.cancel_job(handle) is CancelOutcome.STOPPED
    status = wait_terminal(hook, handle)
    assert status.state is JobState.CANCELED, status
    assert "SHOULD-NOT-RUN" not in whole_log(hook, handle)


def test_a_missing_jobs_folder_is_an_outage_not_a_lost_job(hook):
    """Defect 3 on ``local``: an unmounted jobs volume must not read as "every job is gone"."""
    handle = hook.create_job(make_spec("sleep 30"))
    moved = hook.jobs_dir.with_name("jobs-unmounted")
    hook.jobs_dir.rename(moved)
    try:
        with pytest.raises(ConnectionError, match=r"jobs folder .* is not there"):
            hook.get_job_statuses([handle])
    finally:
        moved.rename(hook.jobs_dir)
        hook.cancel_job(handle)


def test_cancel_of_an_unknown_job_says_ended(hook):
    hook.jobs_dir.mkdir(parents=True)
    ghost = JobHandle(platform="local", conn_id=CONN_ID, job_id="doesnotexist", name="ghost")
    assert hook.cancel_job(ghost) is CancelOutcome.ENDED


def test_background_children_are_gone_after_cancel(hook):
    handle = hook.create_job(make_spec('sleep 300 & echo "bg=$!"; (trap "" TERM; sleep 300) & echo "bg=$!"; wait'))
    log = wait_log(hook, handle, "bg=", count=2)
    children = [int(line.removeprefix("bg=")) for line in log.splitlines()]
    pgid = pid_record(hook, handle)["pgid"]
    assert all(_alive(pid) for pid in children)
    assert hook.cancel_job(handle) is CancelOutcome.STOPPED
    assert not [pid for pid in children if _alive(pid)]
    assert local_supervisor.group_members(pgid) == []
    assert hook.get_job_status(handle).state is JobState.CANCELED


def test_background_children_are_gone_after_normal_completion(hook):
    command = 'sleep 300 & echo "bg=$!"; (trap "" TERM; sleep 300) & echo "bg=$!"; echo main-done'
    handle = hook.create_job(make_spec(command))
    status = wait_terminal(hook, handle)
    assert status.state is JobState.COMPLETE
    log = whole_log(hook, handle)
    children = [int(line.removeprefix("bg=")) for line in log.splitlines() if line.startswith("bg=")]
    assert len(children) == 2
    # Complete means nothing of the job is left: not the children, not the supervisor.
    assert not [pid for pid in children if _alive(pid)]
    group_gone(pid_record(hook, handle)["pgid"])


# ----------------------------------------------------------------------------- ownership marks


def test_marks_claim_and_owner(hook):
    handle = hook.create_job(make_spec("echo started; sleep 30"), try_number=1)
    assert hook.read_marks(handle) == {"owner_try": "1"}
    assert hook.job_owner(handle) == 1
    assert hook.cancel_requested_by(handle) is None
    taken = handle.owned_by(2)
    hook.claim_job(taken)
    assert hook.job_owner(handle) == 2
    assert hook.job_owner(taken) == 2
    assert hook.read_marks(handle) == {"owner_try": "2"}
    assert hook.cancel_job(taken) is CancelOutcome.STOPPED
    assert hook.read_marks(handle) == {"owner_try": "2", "cancel_requested_by": "2"}


def test_cancel_from_a_try_that_no_longer_owns_the_job_is_skipped(hook):
    old = hook.create_job(make_spec("echo started; sleep 30"), try_number=1)
    wait_log(hook, old, "started")
    new = old.owned_by(2)
    hook.claim_job(new)
    assert hook.cancel_job(old) is CancelOutcome.NOT_OURS  # the old trigger's on_kill after a clear
    assert hook.cancel_requested_by(old) is None
    time.sleep(0.2)
    assert hook.get_job_status(old).state is JobState.RUNNING
    assert hook.cancel_job(new) is CancelOutcome.STOPPED
    assert hook.cancel_requested_by(old) == 2
    assert wait_terminal(hook, new).state is JobState.CANCELED


def test_marks_of_an_unknown_job(hook):
    ghost = JobHandle(platform="local", conn_id=CONN_ID, job_id="doesnotexist", name="ghost", try_number=4)
    hook.write_mark(ghost, "owner_try", 9)  # no job folder: nothing to write, no error
    assert hook.read_marks(ghost) == {}
    assert hook.job_owner(ghost) == 4
    assert not (hook.jobs_dir / "doesnotexist").exists()


# ----------------------------------------------------------------------------- batched status


def _comparable(status: JobStatus) -> tuple:
    return status.state, status.message, status.exit_code, status.raw_state


async def test_batched_statuses_equal_per_job_statuses(hook, monkeypatch):
    complete = hook.create_job(make_spec("echo ok"))
    error = hook.create_job(make_spec("exit 4"))
    canceled = hook.create_job(make_spec("echo started; sleep 30"))
    running = hook.create_job(make_spec("echo started; sleep 30"))
    ghost = JobHandle(platform="local", conn_id=CONN_ID, job_id="doesnotexist", name="ghost")
    wait_terminal(hook, complete)
    wait_terminal(hook, error)
    wait_log(hook, canceled, "started")
    wait_log(hook, running, "started")
    hook.cancel_job(canceled)
    handles = [complete, error, canceled, running, ghost]

    scans = []
    real_live_groups = local_supervisor.live_groups
    monkeypatch.setattr(local_supervisor, "live_groups", lambda: scans.append(1) or real_live_groups())
    batch = hook.get_job_statuses(handles)
    assert len(scans) == 1  # one /proc scan for the whole batch
    single = {h.job_id: hook.get_job_status(h) for h in handles}
    assert list(batch) == [h.job_id for h in handles]
    assert {k: _comparable(v) for k, v in batch.items()} == {k: _comparable(v) for k, v in single.items()}
    assert [batch[h.job_id].state for h in handles] == [
        JobState.COMPLETE,
        JobState.ERROR,
        JobState.CANCELED,
        JobState.RUNNING,
        JobState.UNKNOWN,
    ]
    async_batch = await hook.aget_job_statuses(handles)
    assert {k: _comparable(v) for k, v in async_batch.items()} == {k: _comparable(v) for k, v in single.items()}
    assert _comparable(await hook.aget_job_status(error)) == _comparable(single[error.job_id])
    assert hook.cancel_job(running) is CancelOutcome.STOPPED


async def test_async_twins_match_sync(hook):
    handle = hook.create_job(make_spec("echo a; echo b"))
    wait_terminal(hook, handle)
    assert await hook.aget_job_logs(handle, "0") == hook.get_job_logs(handle, "0")
    assert await hook.aget_job_logs(handle, "2") == ("b\n", "4")
    assert await hook.acancel_job(handle) is CancelOutcome.ENDED


# ----------------------------------------------------------------------------- paths


def test_check_and_list_path(hook, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "b.csv").write_text("x")
    (tmp_path / "data" / "a.csv").write_text("x")
    assert hook.check_path(str(tmp_path / "data"))
    assert hook.check_path((tmp_path / "data").as_uri())
    assert not hook.check_path(str(tmp_path / "missing"))
    assert hook.list_path(str(tmp_path / "data")) == ["a.csv", "b.csv"]
    assert hook.list_path((tmp_path / "data").as_uri()) == ["a.csv", "b.csv"]
    assert hook.list_path(str(tmp_path / "data" / "a.csv")) == []


def test_shell_quoting_helper_is_not_needed_for_argv(hook, tmp_path):
    # An argv holding a path with spaces reaches the program as one argument.
    target = tmp_path / "dir with spaces" / "out file.txt"
    target.parent.mkdir()
    handle = hook.create_job(make_spec([PY, "-c", "import sys; open(sys.argv[1], 'w').write('ok')", str(target)]))
    assert wait_terminal(hook, handle).state is JobState.COMPLETE
    assert target.read_text() == "ok"
    # ... and the same through one bash needs the caller's quoting, nothing more.
    target2 = target.with_name("second file.txt")
    handle = hook.create_job(make_spec(f"echo -n ok > {shlex.quote(str(target2))}"))
    assert wait_terminal(hook, handle).state is JobState.COMPLETE
    assert target2.read_text() == "ok"


def test_a_status_poll_says_which_watched_logs_grew_since_their_last_read(hook, tmp_path):
    """``log_news`` (issue 24): the status poll tells the trigger's poller that a job's log has not grown since its
    last read, so a quiet job costs no read; one line more and it has news again."""
    go, stop = tmp_path / "go", tmp_path / "stop"
    script = (
        "import os, time\n"
        "print('first', flush=True)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
        "print('second', flush=True)\n"
        f"while not os.path.exists({str(stop)!r}): time.sleep(0.01)\n"
    )
    handle = hook.create_job(make_spec([PY, "-c", script]))
    wait_for(lambda: "first" in whole_log(hook, handle))
    hook.get_job_statuses([handle])
    assert hook.log_news(handle.job_id)  # never read: the first read is not skipped
    text, cursor = hook.get_job_logs(handle, "")
    assert text == "first\n"
    hook.get_job_statuses([handle])
    assert not hook.log_news(handle.job_id)
    go.touch()
    wait_for(lambda: "second" in whole_log(hook, handle))
    hook.get_job_statuses([handle])
    assert hook.log_news(handle.job_id)
    assert hook.get_job_logs(handle, cursor)[0] == "second\n"
    hook.get_job_statuses([handle])
    assert not hook.log_news(handle.job_id)
    stop.touch()
    assert wait_terminal(hook, handle).state is JobState.COMPLETE


def test_issue_37_defect_9_an_older_trys_cancel_mark_does_not_turn_a_later_exit_0_into_canceled(hook):
    """Try 1's cancel mark, its kill failed; try 2 claimed the job; the job exits 0: Complete (the mark is stale).
    The owner's own cancel still decides Canceled whatever the code."""
    handle = _fake_job_without_pid(hook, submitted_ago=1)
    job_dir = hook.jobs_dir / handle.job_id
    (job_dir / "exit_code").write_text(json.dumps({"exit_code": 0, "finished_at": time.time()}))
    hook.write_mark(handle, "owner_try", 1)
    hook.write_mark(handle, "cancel_requested_by", 1)
    assert hook.get_job_status(handle).state is JobState.CANCELED
    hook.write_mark(handle, "owner_try", 2)
    assert hook.get_job_status(handle.owned_by(2)).state is JobState.COMPLETE
