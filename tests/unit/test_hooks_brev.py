"""BrevHook's pure parts without Brev: the session (credentials file, one re-login, stdin, timeouts), the remote
scripts run by a real ``sh`` against a stand-in ``docker``, the status rule, batching and log prefetch, validation,
the container's ``docker create``, the reaper's decisions.

Against the fake ``brev`` CLI and real containers: tests/integration/brev/.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.hooks.brev import hook as bv
from airflow_provider_tao.hooks.brev import launch as brev_launch
from airflow_provider_tao.hooks.brev import lease as brev_lease
from airflow_provider_tao.hooks.brev import remote
from airflow_provider_tao.hooks.brev.auth import credentials_for
from airflow_provider_tao.hooks.brev.cli import BrevError, BrevSession, create_failure, is_logged_out
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.hooks.shared.cli import CliResult, run_cli
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobSpec, JobState

TOKEN = "brev-secret-token-0123456789"


def _result(stdout: bytes | str = b"", stderr: str = "", code: int | None = 0) -> CliResult:
    out = stdout.encode() if isinstance(stdout, str) else stdout
    return CliResult(("brev", "x"), code, out, stderr, 0.1)


def _jwt(**claims: Any) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


# --------------------------------------------------------------------------- the CLI's own rules


def test_credentials_are_what_brev_login_token_writes() -> None:
    now = time.time()
    fresh = _jwt(sub="u", exp=now + 600, iat=now + 30)  # an iat in the future is tolerated, as the CLI does
    assert credentials_for(fresh, now=now) == {"access_token": fresh, "refresh_token": "auto-login"}
    expired = _jwt(sub="u", exp=now - 1)
    assert credentials_for(expired, now=now) == {"access_token": "auto-login", "refresh_token": expired}
    assert credentials_for("opaque-api-token", now=now) == {
        "access_token": "auto-login",
        "refresh_token": "opaque-api-token",
    }
    assert credentials_for(_jwt(nbf=now + 60), now=now)["access_token"] == "auto-login"


@pytest.mark.parametrize(
    ("stdout", "stderr", "refused"),
    [
        ("You are currently logged out, would you like to log in? [Y/n]: ", "EOF", True),
        ("", "EOF\n", True),
        ("", "[error] refresh token: 401 Unauthorized", True),
        ("", "invalid refresh token", True),
        ("", 'instance "x" is in state "STOPPED"', False),
        ("", "ssh: connect to host 10.0.0.1 port 22: Connection refused", False),
        # Go network errors end with EOF too: an outage, never a refused token (issue 21 point 6)
        ("", 'Get "https://brevapi.us-west-2-prod.control-plane.brev.dev/api/me?cli_version=v0.6.327": EOF', False),
        (
            "",
            'Post "https://brevapi.us-west-2-prod.control-plane.brev.dev/api/organizations/o/workspaces": '
            "unexpected EOF",
            False,
        ),
    ],
)
def test_a_refused_session_is_told_from_other_failures(stdout: str, stderr: str, refused: bool) -> None:
    assert is_logged_out(_result(stdout, stderr, 1)) is refused
    assert not is_logged_out(_result(stdout, stderr, 0))


def test_create_failures_become_failure_classes() -> None:
    unknown = 'Trying g5.typo for 1 instance(s)...\nSkipping: instance type "g5.typo" is not a recognized type; run ...'
    full = (
        'Skipping: instance type "g5.xlarge" is currently unavailable (no capacity); try again later\n'
        'Skipping: instance type "g6.xlarge" is currently unavailable (no capacity); try again later\n'
    )
    mixed = unknown + "\n" + full
    assert create_failure(_result(stderr=unknown, code=1), ["g5.typo"]).err_class is ErrClass.ERR_CONFIG
    capacity = create_failure(_result(stderr=full, code=1), ["g5.xlarge", "g6.xlarge"])
    assert capacity.err_class is ErrClass.ERR_CAPACITY and "g5.xlarge, g6.xlarge" in str(capacity)
    assert create_failure(_result(stderr=mixed, code=1), ["g5.typo", "g5.xlarge"]).err_class is ErrClass.ERR_CONFIG
    worker = "[Worker 1] g5.xlarge Failed: 409 Conflict: insufficient capacity in us-west-2"
    assert create_failure(_result(stderr=worker, code=1), ["g5.xlarge"]).err_class is ErrClass.ERR_CAPACITY
    other = create_failure(_result(stderr="could only create 0/1 instances", code=1), [])
    assert other.err_class is ErrClass.ERR_INFRA


# --------------------------------------------------------------------------- the session, with a stand-in brev

STUB_BREV = textwrap.dedent(
    """\
    #!{python}
    import json, os, stat, sys, time
    log = os.environ["STUB_LOG"]
    stdin = os.fstat(0)
    record = {{"argv": sys.argv[1:], "home": os.environ["HOME"], "agent": os.environ.get("SSH_AUTH_SOCK"),
              "stdin_chardev": stat.S_ISCHR(stdin.st_mode), "stdin_rdev": stdin.st_rdev}}
    creds = os.path.join(os.environ["HOME"], ".brev", "credentials.json")
    record["creds"] = json.load(open(creds)) if os.path.exists(creds) else None
    record["creds_mtime"] = os.stat(creds).st_mtime_ns if os.path.exists(creds) else None
    with open(log, "a") as f:
        f.write(json.dumps(record) + "\\n")
    behaviour = os.environ.get("STUB_BEHAVIOUR", "ok")
    if sys.argv[1] == "sleep":
        import subprocess
        child = subprocess.Popen(["sleep", "300"])
        open(os.environ["STUB_CHILD"], "w").write(str(child.pid))
        time.sleep(300)
    refused_file = os.environ.get("STUB_REFUSE_UNTIL")
    if refused_file and record["creds_mtime"] is not None and record["creds_mtime"] <= int(open(refused_file).read()):
        print("You are currently logged out, would you like to log in? [Y/n]: ", end="")
        sys.stderr.write("EOF\\n")
        sys.exit(1)
    if behaviour == "bad-token":
        print("You are currently logged out, would you like to log in? [Y/n]: ", end="")
        sys.stderr.write("EOF\\n")
        sys.exit(1)
    if sys.argv[1:3] == ["ls", "--json"]:
        if os.environ.get("STUB_NOTICE"):
            print("no oauth found for token")  # what the CLI says at start-up about a token it has not exchanged
        print(json.dumps({{"workspaces": None}}, indent=2))
    """
)


@pytest.fixture
def stub_brev(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[dict[str, Any]]]:
    path = tmp_path / "brev"
    path.write_text(STUB_BREV.format(python=sys.executable))
    path.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("STUB_LOG", str(log))
    monkeypatch.setenv("BREV_API_TOKEN", "must-not-reach-the-cli")

    def calls() -> list[dict[str, Any]]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return calls


def _session(tmp_path: Path, org: str | None = None, identity: str = "c") -> BrevSession:
    BrevSession._states.clear()
    return BrevSession(
        executable=str(tmp_path / "brev"), token=TOKEN, org=org, identity=identity, home_root=tmp_path / "homes"
    )


def test_the_session_logs_in_by_writing_the_credentials_file_never_by_argv(
    tmp_path: Path, stub_brev: Callable[[], list[dict[str, Any]]]
) -> None:
    session = _session(tmp_path, org="my-org")
    assert session.instances() == {}  # {"workspaces": null} is no instance
    session.instances()
    calls = stub_brev()
    assert [c["argv"] for c in calls] == [["set", "my-org"], ["ls", "--json"], ["ls", "--json"]]  # set org once
    assert all(TOKEN not in json.dumps(c["argv"]) for c in calls)
    assert calls[1]["creds"] == {"access_token": "auto-login", "refresh_token": TOKEN}
    home = Path(calls[1]["home"])
    assert home == session.home and home.parent == tmp_path / "homes"
    assert stat.S_IMODE(home.stat().st_mode) == 0o700 and stat.S_IMODE(home.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / ".brev").stat().st_mode) == 0o700
    assert stat.S_IMODE((home / ".brev" / "credentials.json").stat().st_mode) == 0o600
    # stdin is /dev/null (a char device: the CLI reads no names from it); no ssh-agent is started per exec
    assert all(c["stdin_chardev"] and c["stdin_rdev"] == os.stat("/dev/null").st_rdev for c in calls)
    assert calls[1]["agent"] == f"{home}/no-agent" and not Path(calls[1]["agent"]).exists()


def test_a_notice_before_the_json_of_ls_is_skipped(
    tmp_path: Path, stub_brev: Callable[[], list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STUB_NOTICE", "1")
    assert _session(tmp_path).instances() == {}


def test_an_auth_eof_is_re_logged_once_then_the_call_is_repeated(
    tmp_path: Path, stub_brev: Callable[[], list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    session = _session(tmp_path)
    session.login()
    refuse = tmp_path / "refuse"
    refuse.write_text(str(time.time_ns()))  # the session written so far desynchronised
    monkeypatch.setenv("STUB_REFUSE_UNTIL", str(refuse))
    assert session.instances() == {}
    calls = stub_brev()
    assert [c["argv"] for c in calls] == [["ls", "--json"], ["ls", "--json"]]
    assert calls[1]["creds_mtime"] > calls[0]["creds_mtime"] and session.relogins == 1


def test_a_token_refused_twice_is_err_auth(
    tmp_path: Path, stub_brev: Callable[[], list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STUB_BEHAVIOUR", "bad-token")
    session = _session(tmp_path)
    with pytest.raises(BrevError) as refused:
        session.instances()
    assert refused.value.err_class is ErrClass.ERR_AUTH and "password of the tao_brev connection" in str(refused.value)
    assert len(stub_brev()) == 2 and session.relogins == 1


def test_a_missing_cli_is_err_config(tmp_path: Path) -> None:
    BrevSession._states.clear()
    session = BrevSession(executable=str(tmp_path / "nope"), token=TOKEN, org=None, identity="c", home_root=tmp_path)
    with pytest.raises(BrevError) as missing:
        session.instances()
    assert missing.value.err_class is ErrClass.ERR_CONFIG and "brev_path" in str(missing.value)


def test_a_timeout_kills_the_cli_and_what_it_started(
    tmp_path: Path, stub_brev: Callable[[], list[dict[str, Any]]]
) -> None:
    child = tmp_path / "child.pid"
    result = run_cli([str(tmp_path / "brev"), "sleep"], env={**os.environ, "STUB_CHILD": str(child)}, timeout=2)
    assert result.timed_out  # returned at all: the stub sleeps for ever
    deadline = time.monotonic() + 180
    while _alive(int(child.read_text())) and time.monotonic() < deadline:
        time.sleep(0.05)  # killed, then reaped by init
    assert not _alive(int(child.read_text())), "the CLI's child survived its timeout"


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


def test_sessions_are_private_per_connection_token_and_process(tmp_path: Path) -> None:
    first, second = _session(tmp_path, identity="a"), _session(tmp_path, identity="b")
    assert first.home != second.home and first.home.name.endswith(f"-{os.getpid()}")
    changed = BrevSession(executable=str(tmp_path / "brev"), token="other", org=None, identity="a", home_root=tmp_path)
    assert changed.home.name.split("-")[0] != first.home.name.split("-")[0]
    assert TOKEN not in str(first.home)


# --------------------------------------------------------------------------- remote scripts, run by a real sh

STUB_DOCKER = textwrap.dedent(
    """\
    #!{python}
    import json, os, sys, time
    root = os.environ["STUB_DOCKER_ROOT"]
    state_file = os.path.join(root, "containers.json")
    state = json.load(open(state_file)) if os.path.exists(state_file) else {{}}
    with open(os.path.join(root, "calls.jsonl"), "a") as f:
        f.write(json.dumps(sys.argv[1:]) + "\\n")
    def save():
        json.dump(state, open(state_file, "w"))
    args = sys.argv[1:]
    cmd = args[0]
    if cmd == "container" and args[1] == "inspect":
        sys.exit(0 if args[2] in state else 1)
    if cmd == "login":
        open(os.path.join(root, "login-stdin"), "w").write(sys.stdin.read())
        sys.exit(0 if "--password-stdin" in args else 1)
    if cmd == "create":
        name = args[args.index("--name") + 1]
        if os.environ.get("STUB_PULL_FAILS"):
            print("Unable to find image 'nvcr.io/x:1' locally", file=sys.stderr)
            print("docker: Error response from daemon: pull access denied for nvcr.io/x", file=sys.stderr)
            sys.exit(125)
        if name in state:
            print("Error response from daemon: Conflict. The container name is already in use", file=sys.stderr)
            sys.exit(125)
        state[name] = {{"Status": "created", "Id": "c0ffee" + name[-6:], "ExitCode": 0}}
        save(); print(state[name]["Id"]); sys.exit(0)
    if cmd == "cp":
        data = sys.stdin.buffer.read()
        open(os.path.join(root, "copied.tar"), "wb").write(data)
        sys.exit(0 if args[2].split(":")[0] in state else 1)
    if cmd == "start":
        state[args[1]]["Status"] = "running"; save(); sys.exit(0)
    if cmd == "wait":
        print(os.environ.get("STUB_EXIT", "0")); sys.exit(0)
    if cmd == "inspect" and args[1] == "-f":
        fmt, names = args[2], args[3:]
        for n in names:
            if n not in state:
                continue
            c = state[n]
            out = fmt.replace("{{{{.State.Status}}}}", c["Status"]).replace("{{{{.Id}}}}", c["Id"])
            out = out.replace("{{{{.Name}}}}", "/" + n).replace("{{{{.Created}}}}", "2026-11-25T07:24:00.5Z")
            out = out.replace("{{{{json .State}}}}", json.dumps(c))
            print(out)
        sys.exit(0)
    sys.exit(0)
    """
)


class Instance:
    """A folder standing in for an instance's home, a stand-in ``docker`` on PATH, and ``sh`` running scripts."""

    def __init__(self, root: Path) -> None:
        self.home = root / "home"
        self.home.mkdir()
        bin_dir = root / "bin"
        bin_dir.mkdir()
        docker = bin_dir / "docker"
        docker.write_text(STUB_DOCKER.format(python=sys.executable))
        docker.chmod(0o755)
        self.docker_root = root / "docker"
        self.docker_root.mkdir()
        self.env = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "HOME": str(self.home),
            "STUB_DOCKER_ROOT": str(self.docker_root),
        }

    def run(self, call: remote.Script, **env: str) -> bytes | None:
        argv = ["sh", "-c", call.command]
        proc = subprocess.run(argv, capture_output=True, env={**self.env, **env}, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr  # whatever happens, the command exits 0: nothing for exec to re-run
        return call.answer(_result(proc.stdout + b"instance-name\n", proc.stderr.decode()))

    def docker_calls(self) -> list[list[str]]:
        path = self.docker_root / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def containers(self) -> dict[str, Any]:
        path = self.docker_root / "containers.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def stage(self, job_id: str, stage: bytes) -> None:
        target = self.home / f".tao-stage-{job_id}.tar"
        target.write_bytes(stage)
        target.chmod(0o600)


@pytest.fixture
def instance(tmp_path: Path) -> Instance:
    return Instance(tmp_path)


def _staged(instance: Instance, job_id: str = "a1b2c3", ngc_key: str | None = "ngc-key-42") -> bytes:
    argv = ["docker", "create", "--name", f"tao-job-{job_id}", "--label", "tao.nvidia.com/managed=true", "img:1"]
    script = remote.launch_script(job_id, argv, "nvcr.io" if ngc_key else None)
    job_tar = ct.job_archive({"runner.json": b"{}"}, {"AWS_SECRET_ACCESS_KEY": "s3cr3t"}, {}, (0, 0))
    stage = remote.stage_archive(job_tar, script, name="dag-train-0123456789", owner_try=2, ngc_key=ngc_key)
    instance.stage(job_id, stage)
    return job_tar


def test_a_launch_run_twice_makes_and_starts_one_container(instance: Instance) -> None:
    job_tar = _staged(instance)
    first = instance.run(remote.launch("a1b2c3"))
    assert first is not None and remote.parse_launch(first)[0] == "c0ffeea1b2c3"
    again = instance.run(remote.launch("a1b2c3"))  # what `brev exec` does after a dropped connection
    assert again is not None and remote.parse_launch(again) == ("c0ffeea1b2c3", "running")
    calls = instance.docker_calls()
    assert [c[0] for c in calls].count("create") == 1 and [c[0] for c in calls].count("start") == 1
    assert [c[0] for c in calls].count("cp") == 1 and (instance.docker_root / "copied.tar").read_bytes() == job_tar
    # the NGC key went to `docker login` on stdin, never on a command line, and is gone from the instance
    assert (instance.docker_root / "login-stdin").read_text() == "ngc-key-42"
    assert all("ngc-key-42" not in " ".join(c) and "s3cr3t" not in " ".join(c) for c in calls)
    job = instance.home / ".tao-brev" / "jobs" / "a1b2c3"
    deadline = time.monotonic() + 120
    while not (job / "exit").exists():  # the waiter writes the container's exit code when `docker wait` returns
        assert time.monotonic() < deadline, "the waiter never wrote the exit code"
        time.sleep(0.05)
    assert sorted(p.name for p in job.iterdir() if not p.name.startswith(".")) == [
        "exit", "launch.sh", "marks", "name", "waiter.pid"
    ]  # fmt: skip
    assert not (instance.home / ".tao-stage-a1b2c3.tar").exists()  # the staged secrets are gone
    assert stat.S_IMODE(job.stat().st_mode) == 0o700 and stat.S_IMODE((job / "launch.sh").stat().st_mode) == 0o600
    assert (job / "marks" / "owner_try").read_text() == "2" and (job / "name").read_text() == "dag-train-0123456789"
    time.sleep(0.5)
    assert (job / "exit").read_text() == "0\n"  # the waiter's docker wait


def test_a_launch_never_restarts_an_ended_container(instance: Instance) -> None:
    _staged(instance, ngc_key=None)
    instance.run(remote.launch("a1b2c3"))
    state = instance.containers()
    state["tao-job-a1b2c3"]["Status"] = "exited"
    (instance.docker_root / "containers.json").write_text(json.dumps(state))
    answer = instance.run(remote.launch("a1b2c3"))
    assert answer is not None and remote.parse_launch(answer) == ("c0ffeea1b2c3", "exited")
    assert [c[0] for c in instance.docker_calls()].count("start") == 1
    assert not (instance.docker_root / "login-stdin").exists()  # no key, no login


def test_a_failed_pull_is_reported_with_its_words_and_classified(instance: Instance) -> None:
    _staged(instance)
    answer = instance.run(remote.launch("a1b2c3"), STUB_PULL_FAILS="1")
    assert answer is not None
    container, said = remote.parse_launch(answer)
    assert container is None and said.startswith("create\n") and "pull access denied" in said
    assert brev_launch._launch_failure_class(said) is ErrClass.ERR_IMAGE_PULL
    assert brev_launch._launch_failure_class("login\nunauthorized: authentication required") is ErrClass.ERR_AUTH
    assert brev_launch._launch_failure_class("start\ncould not select device driver") is ErrClass.ERR_CONFIG
    assert brev_launch._launch_failure_class("copy\nno such container") is ErrClass.ERR_INFRA
    assert not (instance.home / ".tao-brev" / "jobs" / "a1b2c3" / "ngc.key").exists()
    assert not (instance.home / ".tao-brev" / "jobs" / "a1b2c3" / ".lock").exists()  # released


def test_a_launch_with_nothing_staged_says_so(instance: Instance) -> None:
    answer = instance.run(remote.launch("ffffff"))
    assert answer is not None and remote.parse_launch(answer) == (None, "setup\nnothing was staged for job ffffff")


def test_the_probe_reads_states_exits_marks_logs_and_the_lease_in_one_call(instance: Instance) -> None:
    _staged(instance)
    lease = {"created_by": brev_lease.LEASE_CREATOR, "instance": "i-1", "expires_at": 1.0}
    assert instance.run(remote.prepare(lease)) == b"DOCKER \n"  # the stub docker prints no version
    assert json.loads((instance.home / remote.LEASE_FILE).read_text()) == lease
    instance.run(remote.prepare({**lease, "expires_at": 2.0}))  # a retry never moves the lease
    assert json.loads((instance.home / remote.LEASE_FILE).read_text())["expires_at"] == 1.0
    instance.run(remote.launch("a1b2c3"))
    time.sleep(0.5)
    instance.run(remote.write_mark("a1b2c3", "cancel_requested_by", 3))
    answer = instance.run(remote.probe({"a1b2c3": "-", "gone00": "-"}))
    assert answer is not None
    found = remote.parse_probe(answer)
    assert found.lease == lease and found.known == {"a1b2c3"} and found.exits == {"a1b2c3": 0}
    assert found.marks == {"a1b2c3": {"owner_try": 2, "cancel_requested_by": 3}}
    created, state = found.containers["a1b2c3"]
    assert state["Status"] == "running" and abs(created - 1795591440.5) < 1e-3
    assert instance.run(remote.write_mark("gone00", "owner_try", 1)) == b"NOJOB\n"


def test_the_stop_reports_who_canceled_the_job(instance: Instance) -> None:
    """A cancel from outside the task (its ``canceled_by`` mark) keeps the instance for the task: the stop's answer
    says so, without another call."""
    _staged(instance, ngc_key=None)
    instance.run(remote.launch("a1b2c3"))
    instance.run(remote.write_mark("a1b2c3", "canceled_by", 'cli:j"doe\nx'))
    answer = instance.run(remote.stop("a1b2c3", 0))
    assert answer is not None
    found = remote.parse_probe(answer)
    assert found.marks == {"a1b2c3": {"owner_try": 2, "canceled_by": 'cli:j"doe\nx'}}
    assert found.containers["a1b2c3"][1]["Status"] == "running"  # the stand-in docker's stop changes nothing


def test_answers_are_read_from_the_last_complete_frame() -> None:
    call = remote.script("echo hi")
    frame = f"TAO-BEGIN {call.nonce}\nhi\n\nTAO-END {call.nonce} 0\n"
    assert call.answer(_result(frame + "box\n")) == b"hi\n"
    rerun = f"TAO-BEGIN {call.nonce}\npartial" + frame.replace("hi", "again") + "box\n"
    assert call.answer(_result(rerun, code=1)) == b"again\n"
    assert call.answer(_result(f"TAO-BEGIN {call.nonce}\nhi\n", code=1)) is None  # cut: no verdict
    assert call.answer(_result("hi\n")) is None
    assert shlex.split(call.command)[:2] == ["sh", "-c"] and shlex.split(call.command)[3] == call.nonce


def test_parse_probe_reads_byte_counted_logs_with_any_content() -> None:
    log = b"2026-01-01T00:00:00.000000001Z L x 9\n2026-01-01T00:00:01.000000001Z \xff binary\n"
    data = b"K j1\nL j1 " + str(len(log)).encode() + b"\n" + log + b"\nX j1 -1\nM j1 owner_try {bad\nLEASE -\n"
    found = remote.parse_probe(data)
    assert found.logs == {"j1": log} and found.exits == {"j1": -1} and found.marks == {} and found.lease is None


# --------------------------------------------------------------------------- the hook, on a scripted session


def framed(call_command: str, payload: bytes) -> CliResult:
    nonce = shlex.split(call_command)[3]
    return _result(b"TAO-BEGIN " + nonce.encode() + b"\n" + payload + b"\nTAO-END " + nonce.encode() + b" 0\ninst\n")


class ScriptedSession:
    """Stands in for BrevSession: ``instances`` from a dict, ``exec`` answered by a function, every call counted."""

    def __init__(self, instances: dict[str, dict[str, Any]], answer: Callable[[str, str], bytes | None]) -> None:
        self.listing = instances
        self.answer = answer
        self.calls: list[tuple[str, ...]] = []

    def instances(self, timeout: float = 0) -> dict[str, dict[str, Any]]:
        self.calls.append(("ls",))
        return {name: dict(entry, name=name) for name, entry in self.listing.items()}

    def exec(self, instance: str, command: str, timeout: float) -> CliResult:
        self.calls.append(("exec", instance))
        payload = self.answer(instance, command)
        return (
            _result(b"", "Connection failed, checking instance status...", 1)
            if payload is None
            else framed(command, payload)
        )

    def delete(self, name: str) -> bool:
        self.calls.append(("delete", name))
        return self.listing.pop(name, None) is not None


def _hook(monkeypatch: pytest.MonkeyPatch, session: Any = None, **extra: Any) -> bv.BrevHook:
    conn = {"conn_type": "tao_brev", "password": TOKEN, "extra": {"cancel_grace_seconds": 1, **extra}}
    monkeypatch.setenv("AIRFLOW_CONN_BREV_T", json.dumps(conn))
    hook = bv.BrevHook("brev_t")
    hook.load_connection()
    if session is not None:
        hook.__dict__["session"] = session
    return hook


def _handle(job_id: str, instance: str, name: str = "dag-train-0123456789") -> JobHandle:
    return JobHandle("brev", "brev_t", job_id, name, backend_job_id=instance)


def _state(status: str, code: int = 0, oom: bool = False) -> bytes:
    return json.dumps({"Status": status, "ExitCode": code, "OOMKilled": oom}).encode()


def _probe_payload(states: dict[str, bytes], exits: dict[str, int] | None = None, marks: str = "") -> bytes:
    lines = [b"LEASE -"]
    lines += [b"S /tao-job-" + job.encode() + b" 2020-01-01T00:00:00.5Z " + state for job, state in states.items()]
    lines += [f"K {job}".encode() for job in states]
    lines += [f"X {job} {code}".encode() for job, code in (exits or {}).items()]
    return b"\n".join(lines) + b"\n" + marks.encode()


def test_one_listing_and_one_exec_per_instance_whatever_the_number_of_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = {f"box{i}": [f"j{i}{k}" for k in range(10)] for i in range(5)}

    def answer(instance: str, command: str) -> bytes:
        return _probe_payload({job: _state("running") for job in jobs[instance]})

    session = ScriptedSession({name: {"status": "RUNNING"} for name in jobs}, answer)
    hook = _hook(monkeypatch, session)
    handles = [_handle(job, box, name=f"n-{job}") for box, ids in jobs.items() for job in ids]
    statuses = hook.get_job_statuses(handles)
    assert {s.state for s in statuses.values()} == {JobState.RUNNING} and len(statuses) == 50
    assert sorted(session.calls) == sorted([("ls",)] + [("exec", box) for box in jobs])  # 1 + 5, not 50


def test_the_status_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    marks = "M j4 cancel_requested_by 1\n"
    probe = _probe_payload(
        {
            "j1": _state("running"),
            "j2": _state("exited", 0),
            "j3": _state("exited", 3),
            "j4": _state("exited", 143),
            "j5": _state("exited", 137, oom=True),
            "j6": _state("created"),
        },
        exits={"j7": 4},
        marks=marks,
    )
    instances = {
        "box": {"status": "RUNNING"},
        "failed": {"status": "FAILURE"},
        "sick": {"status": "UNHEALTHY"},
        "stopped": {"status": "STOPPED"},
        "booting": {"status": "DEPLOYING"},
        "deleting": {"status": "DELETING"},
        "flaky": {"status": "RUNNING"},
    }
    sick = _probe_payload({"s1": _state("running"), "s2": _state("exited", 0)})
    session = ScriptedSession(instances, lambda i, c: {"box": probe, "sick": sick}.get(i))
    hook = _hook(monkeypatch, session)
    wanted = {f"j{i}": "box" for i in range(1, 9)} | {
        "f1": "failed", "s1": "sick", "s2": "sick", "p1": "stopped", "b1": "booting", "d1": "deleting",
        "u1": "flaky", "l1": "lost",
    }  # fmt: skip
    got = hook.get_job_statuses([_handle(job, box, name=f"n-{job}") for job, box in wanted.items()])
    assert got["j1"].state is JobState.RUNNING
    assert got["j2"].state is JobState.COMPLETE
    assert (got["j3"].state, got["j3"].exit_code) == (JobState.ERROR, 3)
    assert got["j4"].state is JobState.CANCELED  # a stop's code and a cancel mark
    assert got["j5"].raw_state == "OOMKilled"
    assert got["j6"].state is JobState.ERROR and "never started" in got["j6"].message  # created long ago
    assert (got["j7"].state, got["j7"].exit_code) == (JobState.ERROR, 4) and "removed since" in got["j7"].message
    assert got["j8"].state is JobState.UNKNOWN and got["j8"].not_found
    assert (got["f1"].state, got["f1"].raw_state) == (JobState.ERROR, "FAILURE")
    assert (got["s1"].state, got["s1"].raw_state) == (JobState.ERROR, "UNHEALTHY")
    assert got["s2"].state is JobState.COMPLETE  # ended before the instance went bad: its own verdict
    assert got["p1"].state is JobState.PAUSED and got["b1"].state is JobState.PENDING
    assert (got["d1"].state, got["d1"].raw_state) == (JobState.ERROR, "DELETING")
    assert got["u1"].state is JobState.UNKNOWN and not got["u1"].not_found  # a flaky exec is an outage
    # one brev ls without the instance is not yet "lost": the poller's two-answers rule decides
    assert (got["l1"].state, got["l1"].raw_state, got["l1"].not_found) == (JobState.UNKNOWN, "LOST", True)
    assert ("exec", "stopped") not in session.calls and ("exec", "booting") not in session.calls  # never started


def test_instance_failures_are_retriable_infrastructure() -> None:
    from airflow_provider_tao.failures import FailureFacts, classify

    for raw in ("FAILURE", "UNHEALTHY", "DELETING", "LOST"):
        analysis = classify(FailureFacts(raw_state=raw, message=f"instance {raw}"))
        assert analysis.err_class is ErrClass.ERR_INFRA and analysis.retriable, raw


def test_a_watched_jobs_log_comes_with_the_status_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [f"2026-11-25T07:24:0{i}.000000001Z epoch {i}\n".encode() for i in range(4)]
    served = {"log": b"".join(lines[:2])}

    def answer(instance: str, command: str) -> bytes:
        args = shlex.split(command)[4:]
        if "j1=-" in args or "j1=all" in args or any(a.startswith("j1=2026") for a in args):
            log = served["log"]
            payload = _probe_payload({"j1": _state("running")})
            return payload + b"L j1 " + str(len(log)).encode() + b"\n" + log + b"\n"
        return b"L j1 " + str(len(served["log"])).encode() + b"\n" + served["log"] + b"\n"  # a direct read

    session = ScriptedSession({"box": {"status": "RUNNING"}}, answer)
    hook = _hook(monkeypatch, session)
    handle = _handle("j1", "box")
    hook.get_job_statuses([handle])
    assert hook.get_job_logs(handle, "") == ("", "")  # the first read registers the cursor: no call of its own
    hook.get_job_statuses([handle])
    text, cursor = hook.get_job_logs(handle, "")  # the probe read the log from the start
    assert text == "epoch 0\nepoch 1\n" and session.calls.count(("exec", "box")) == 2
    served["log"] = b"".join(lines[1:])  # the next probe reads from the cursor's exact time on
    hook.get_job_statuses([handle])
    text, cursor = hook.get_job_logs(handle, cursor)
    assert text == "epoch 2\nepoch 3\n" and session.calls.count(("exec", "box")) == 3  # still one exec a poll
    assert cursor.startswith("2026-11-25T07:24:03")
    # a job no probe watches (the operator's own hook after the end) is read at once
    fresh = _hook(monkeypatch, session)
    assert fresh.get_job_logs(handle, "")[0] == "epoch 1\nepoch 2\nepoch 3\n"
    assert session.calls.count(("exec", "box")) == 4
    # the probe tells the poller whether the log grew since the last read (issue 24: a quiet job costs no read)
    hook.get_job_statuses([handle])
    assert not hook.log_news("j1")  # what the probe read from the cursor's time is the cursor's own line
    served["log"] += b"2026-11-25T07:24:09.000000001Z epoch 9\n"
    hook.get_job_statuses([handle])
    assert hook.log_news("j1") and hook.get_job_logs(handle, cursor)[0] == "epoch 9\n"


def test_a_cut_log_read_never_shows_half_a_line(monkeypatch: pytest.MonkeyPatch) -> None:
    line = b"2026-11-25T07:24:00.000000001Z " + b"x" * 100 + b"\n"
    log = line * (bv.LOG_READ_LIMIT // len(line) + 2)
    cut = log[: bv.LOG_READ_LIMIT + 1]
    session = ScriptedSession({"box": {"status": "RUNNING"}}, lambda i, c: b"L j1 %d\n" % len(cut) + cut + b"\n")
    text, cursor = _hook(monkeypatch, session).get_job_logs(_handle("j1", "box"))
    assert text.endswith("x" * 100 + "\n") and all(len(t) == 100 for t in text.splitlines())
    assert cursor == f"2026-11-25T07:24:00.000000001Z#{len(text.splitlines())}"


def test_cancel_stops_the_container_and_deletes_only_the_tasks_own_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    def answer(instance: str, command: str) -> bytes:
        return _probe_payload({}) if "docker stop" in command else _probe_payload({"j1": _state("running")})

    session = ScriptedSession({"dag-train-0123456789": {"status": "RUNNING"}, "shared": {"status": "RUNNING"}}, answer)
    hook = _hook(monkeypatch, session)
    assert hook._cancel(_handle("j1", "dag-train-0123456789"))
    assert ("delete", "dag-train-0123456789") in session.calls
    assert hook._cancel(_handle("j2", "shared"))
    assert ("delete", "shared") not in session.calls and ("exec", "shared") in session.calls


@pytest.mark.parametrize(
    ("code", "adoptable", "deleted"),
    [(0, True, False), (0, False, True), (1, True, True)],
    ids=["completed-before-a-kill-whose-task-runs-again", "completed-task-over", "failed"],
)
def test_a_kill_keeps_the_instance_of_a_job_that_completed_for_the_next_try_to_adopt(
    monkeypatch: pytest.MonkeyPatch, code: int, adoptable: bool, deleted: bool
) -> None:
    """Issue 22 (I2): a job that completed while a kill's cancel was on its way (a clear, a timeout with retries
    left) keeps its instance -- its outputs are there, and the next try adopts it instead of running it again; the
    reaper deletes it once the task is over. A failed job's instance goes as before, and so does every instance when
    the task is over (``adoptable`` False)."""
    answer = _probe_payload({"j1": _state("exited", code)}, exits={"j1": code})
    session = ScriptedSession({"dag-train-0123456789": {"status": "RUNNING"}}, lambda i, c: answer)
    _hook(monkeypatch, session).cleanup_job(_handle("j1", "dag-train-0123456789"), adoptable=adoptable)
    assert (("delete", "dag-train-0123456789") in session.calls) is deleted


def test_reaper_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    now = 1_800_000_000.0

    def lease(name: str, expires: float, run: str) -> bytes:
        body = {"created_by": brev_lease.LEASE_CREATOR, "instance": name, "created_at": expires - 8 * 3600,
                "expires_at": expires, "lease_hours": 8, "dag_id": "d", "task_id": "t", "run_id": run,
                "map_index": "-1"}  # fmt: skip
        return b"LEASE " + json.dumps(body).encode() + b"\n"

    leases = {
        "expired": lease("expired", now - 1, "r1"),
        "finished": lease("finished", now + 3600, "r2"),
        "running": lease("running", now + 3600, "r3"),
        # its task failed, but its job runs on (cancel_on_kill=False): the orphan sweep's to judge, not the reaper's
        "kept-job": lease("kept-job", now + 3600, "r5")
        + b"F a1b2c3 running 2026-01-01T00:00:00.5Z 1 d-t-0123456789 /results/a1b2c3\n",
        "foreign": b"LEASE -\n",
        "copied": lease("somewhere-else", now - 1, "r4"),
    }
    instances = {name: {"status": "RUNNING"} for name in leases} | {"stopped": {"status": "STOPPED"}}
    session = ScriptedSession(instances, lambda i, c: leases[i])
    hook = _hook(monkeypatch, session)
    states = {"r2": "failed", "r3": "deferred", "r5": "failed"}
    decisions = {d.instance: d for d in hook.reap(task_state=lambda lease: states.get(lease["run_id"]), now=now)}
    assert {name: d.action for name, d in decisions.items()} == {
        "expired": "deleted", "finished": "deleted", "running": "kept", "foreign": "kept", "copied": "kept",
        "stopped": "skipped", "kept-job": "kept",
    }  # fmt: skip
    assert "is failed but job(s) a1b2c3 still run on it" in decisions["kept-job"].reason
    assert "lease expired" in decisions["expired"].reason and "d.t run r1" in decisions["expired"].reason
    assert "is failed" in decisions["finished"].reason and "is deferred" in decisions["running"].reason
    assert "not created by this provider" in decisions["foreign"].reason
    assert [c for c in session.calls if c[0] == "delete"] == [("delete", "expired"), ("delete", "finished")]


def test_an_instance_that_cannot_be_execd_is_reaped_by_airflows_record_of_its_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A task's own instance that failed under its job shows no lease (exec does not answer there), and the task was
    marked failed before its resume could delete it: the sweeper's records name it, so it goes once its task is
    finished -- never one they do not name, nor a reused instance a record names (the task's own is named after its
    job), nor one whose task may still read it."""
    instances = {name: {"status": "FAILURE"} for name in ("d-t-0123456789", "d-t-1111111111", "shared", "d-t-222")}
    instances |= {"d-t-3333333333": {"status": "STOPPED"}}
    session = ScriptedSession(instances, lambda i, c: pytest.fail(f"exec on {i}, which is not running"))
    hook = _hook(monkeypatch, session)
    origin = {"dag_id": "d", "task_id": "t", "map_index": -1}
    recorded = {
        "d-t-0123456789": origin | {"run_id": "r1", "name": "d-t-0123456789"},
        "d-t-1111111111": origin | {"run_id": "r2", "name": "d-t-1111111111"},  # its task is up for retry
        "shared": origin | {"run_id": "r1", "name": "d-t-0123456789"},  # a reused instance the job ran on
        "d-t-3333333333": origin | {"run_id": "r3", "name": "d-t-3333333333", "map_index": 2},
    }
    states = {"r1": "failed", "r2": "up_for_retry", "r3": "success"}
    decisions = {d.instance: d for d in hook.reap(lambda o: states[o["run_id"]], recorded=recorded)}
    assert {name: d.action for name, d in decisions.items()} == {
        "d-t-0123456789": "deleted", "d-t-1111111111": "skipped", "shared": "skipped", "d-t-222": "skipped",
        "d-t-3333333333": "deleted",
    }  # fmt: skip
    assert (
        decisions["d-t-0123456789"].reason
        == "it is FAILURE and its task d.t run r1 is failed (by this Airflow's record)"
    )
    assert "d.t run r3 map index 2 is success" in decisions["d-t-3333333333"].reason
    assert "its task d.t run r2 is up_for_retry" in decisions["d-t-1111111111"].reason
    assert decisions["d-t-222"].reason == "it is FAILURE: its lease cannot be read without starting it"
    assert sorted(c for c in session.calls if c[0] != "ls") == [
        ("delete", "d-t-0123456789"),
        ("delete", "d-t-3333333333"),
    ]
    # without the records (a reaper run from a task: no metadata database) such an instance is only skipped
    assert {d.action for d in hook.reap(lambda o: "failed")} == {"skipped"}


def test_reaper_dry_run_and_expired_leases_under_tasks_that_still_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    """An expired instance is never pulled from under a task that still watches a job on it: its jobs are canceled
    (here: would be) and the task deletes it; with nothing running on it any more, the next reap deletes it."""
    now = 1_800_000_000.0
    lease = {"created_by": brev_lease.LEASE_CREATOR, "created_at": now - 7200, "expires_at": now - 1, "lease_hours": 2,
             "dag_id": "d", "task_id": "t", "map_index": "-1"}  # fmt: skip
    running = b"F a1b2c3 running 2026-01-01T00:00:00.5Z 1 d-t-0123456789 /results/a1b2c3\n"
    answers = {
        "watched": (lease | {"instance": "watched", "run_id": "r1"}, running),
        "idle": (lease | {"instance": "idle", "run_id": "r2"}, b""),  # its job ended: the task resumes
        "orphan": (lease | {"instance": "orphan", "run_id": "r3"}, running),
        "young": (lease | {"instance": "young", "run_id": "r4", "expires_at": now + 60}, running),
    }
    instances = {name: {"status": "RUNNING", "id": f"i-{name}"} for name in answers} | {"going": {"status": "DELETING"}}
    session = ScriptedSession(
        instances, lambda i, c: b"LEASE " + json.dumps(answers[i][0]).encode() + b"\n" + answers[i][1]
    )
    hook = _hook(monkeypatch, session)
    states = {"r1": "deferred", "r2": "running", "r3": "failed", "r4": "deferred"}
    decisions = {d.instance: d for d in hook.reap(lambda lease: states[lease["run_id"]], now=now, dry_run=True)}
    assert {name: d.action for name, d in decisions.items()} == {
        "watched": "would cancel jobs", "idle": "would delete", "orphan": "would delete", "young": "kept",
        "going": "skipped",
    }  # fmt: skip
    assert "its task is deferred: job(s) a1b2c3 canceled" in decisions["watched"].reason
    assert decisions["going"].reason == "it is being deleted already"
    assert [c for c in session.calls if c[0] not in ("ls", "exec")] == []  # a dry run changes nothing
    assert session.calls.count(("ls",)) == 1 and sorted(c for c in session.calls if c[0] == "exec") == [
        ("exec", name) for name in sorted(answers)
    ]  # one ls, one exec per running instance (never one that is being deleted)
    # what the scan read also serves the reaper's rule for the jobs on these instances, without another call
    (job,) = [h for h in hook.list_active_jobs() if h.backend_job_id == "watched"]
    assert (job.job_id, job.name, job.try_number, job.results_dir) == ("a1b2c3", "d-t-0123456789", 1, "/results/a1b2c3")
    assert job.console_url == "https://brev.nvidia.com/environment/i-watched"
    calls = len(session.calls)
    assert hook.lease_expired(job, now) is True and len(session.calls) == calls
    assert hook.lease_expired(JobHandle("brev", None, "x", "n", backend_job_id="young"), now) is False


@pytest.mark.parametrize(
    ("tao_lease_hours", "connection", "job", "hours"),
    [
        (None, None, None, 8.0),  # a rented machine always has a lease
        ("0", None, None, 8.0),  # [tao] lease_hours = 0 ("no lease") does not apply to machines
        ("24", None, None, 24.0),  # the deployment's default
        ("24", 4, None, 4.0),  # the connection's value wins over it
        ("24", 4, 1.5, 1.5),  # and the job's over both
    ],
)
def test_an_instances_lease_is_the_jobs_then_the_connections_then_tao_lease_hours_then_8(
    monkeypatch: pytest.MonkeyPatch,
    tao_lease_hours: str | None,
    connection: float | None,
    job: float | None,
    hours: float,
) -> None:
    if tao_lease_hours is not None:
        monkeypatch.setenv("AIRFLOW__TAO__LEASE_HOURS", tao_lease_hours)
    hook = _hook(monkeypatch, **({"lease_hours": connection} if connection is not None else {}))
    assert hook._lease_hours({"lease_hours": job} if job is not None else {}) == hours


def test_task_state_lookup_asks_airflow_for_the_leases_task_instance() -> None:
    asked: list[dict[str, Any]] = []

    class TI:
        @staticmethod
        def get_task_states(**kwargs: Any) -> dict[str, Any]:
            asked.append(kwargs)
            return {"r1": {"train": "success", "sweep_3": "running"}}

    lookup = brev_lease.task_state_lookup(TI())
    assert lookup({"dag_id": "d", "task_id": "train", "run_id": "r1", "map_index": "-1"}) == "success"
    assert lookup({"dag_id": "d", "task_id": "sweep", "run_id": "r1", "map_index": "3"}) == "running"
    assert lookup({"dag_id": "d", "task_id": "gone", "run_id": "r9", "map_index": "-1"}) is None
    assert asked[1] == {"dag_id": "d", "task_ids": ["sweep"], "run_ids": ["r1"], "map_index": 3}


# --------------------------------------------------------------------------- validation and the container


def _spec(**kwargs: Any) -> JobSpec:
    base = {"name": "dag-train-0123456789", "job_id": "abc123", "command": "train", "image": "nvcr.io/x/y:1"}
    return JobSpec(**{**base, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_nodes": 2}, "num_nodes: the brev platform runs single-node jobs only"),
        ({"backend_details": {"instance_id": "bad name!"}}, "is not a Brev instance name"),
        ({"backend_details": {"instance_id": "dag-train-0123456789"}}, "named like the instances this provider"),
        ({"backend_details": {"instance_id": "box", "instance_type": "g5.xlarge"}}, "not to a reused one"),
        ({"backend_details": {"instance_type": "g5.xlarge,bad type"}}, "is not a chain of instance types"),
        ({"backend_details": {"lease_hours": 0}}, "lease_hours: 0 is not a positive number"),
        ({"backend_details": {"gpu": "A100"}}, "backend_details['gpu']: is not a brev platform setting"),
        ({"backend_details": {"mounts": "/data"}}, "is not a list"),
        ({"results_uri": "relative/dir"}, "neither an s3:// URI nor a folder on the instance"),
    ],
)
def test_bad_input_is_refused_before_anything_is_created(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(JobValidationError, match=None) as refused:
        _hook(monkeypatch).validate_spec(_spec(**kwargs))
    assert message in str(refused.value)


def test_a_connection_without_a_token_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BREV_API_TOKEN", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_BREV_NT", json.dumps({"conn_type": "tao_brev"}))
    hook = bv.BrevHook("brev_nt")
    with pytest.raises(JobValidationError, match="no Brev API token"):
        hook.validate_spec(_spec())
    monkeypatch.setenv("BREV_API_TOKEN", TOKEN)  # the documented fallback
    bv.BrevHook("brev_nt").validate_spec(_spec())


def test_type_chains_come_from_the_job_then_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook(monkeypatch, instance_type="g5.xlarge, g6.xlarge")
    assert hook._types({}) == ["g5.xlarge", "g6.xlarge"]
    assert hook._types({"instance_type": ["n1-highmem-4:nvidia-tesla-t4:1"]}) == ["n1-highmem-4:nvidia-tesla-t4:1"]
    assert _hook(monkeypatch)._types({}) == []  # the CLI's own choice


def test_the_container_is_created_with_labels_gpus_and_plain_values_only(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook(monkeypatch, network="host", shm_size="8g")
    spec = _spec(
        gpu_count=2,
        env={"EPOCHS": "3"},
        secret_env={"AWS_SECRET_ACCESS_KEY": "s3cr3t"},
        origin={"dag_id": "dag", "task_id": "train", "run_id": "r", "map_index": "-1"},
        backend_details={"mem_limit": "8g", "cpus": 2, "mounts": ["/data:/data:ro"], "user": "1000"},
    )
    handle = hook.new_handle(spec, 3, backend_job_id="box")
    argv = hook._create_argv(spec, handle, hook.platform_details(spec), None)
    joined = " ".join(argv)
    assert argv[:6] == ["docker", "create", "--name", "tao-job-abc123", "--init", "--label"]
    for key, value in ct.job_labels(spec, 3, handle.results_dir).items():
        assert f"{key}={value}" in argv
    assert "--gpus 2" in joined and "-e EPOCHS=3" in joined and "-e TAO_JOB_ID=abc123" in joined
    assert "--memory 8g --memory-swap 8g" in joined and "--cpus 2.0" in joined and "-v /data:/data:ro" in joined
    assert "--network host" in joined and "--shm-size 8g" in joined and "--user 1000" in joined
    assert "s3cr3t" not in joined and argv[argv.index("nvcr.io/x/y:1") + 1 :] == ct.launcher_argv("train")
    none = hook._create_argv(_spec(gpu_count=0), handle, {}, None)
    assert "--gpus" not in none and "NVIDIA_VISIBLE_DEVICES=void" in none
    every = hook._create_argv(_spec(gpu_count=-1), handle, {}, None)
    assert every[every.index("--gpus") + 1] == "all"
    ids = _spec(gpu_count=2, backend_details={"gpu_ids": ["0", "2"]})
    assert '"device=0,2"' in hook._create_argv(ids, handle, hook.platform_details(ids), None)


def test_job_names_fit_brevs_instance_name_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook(monkeypatch)
    name = hook.job_name_for("a-very-long-dag-id-and-task-id-" * 4, "0123456789")
    assert len(name) == 63 and name.endswith("-0123456789") and hook.name_pattern.match(name)
    hook.validate_name("Nightly.Retrain_v2-0123456789")


def test_test_connection_says_what_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    session = ScriptedSession({"a": {"status": "RUNNING"}, "b": {"status": "STOPPED"}}, lambda i, c: None)
    ok, message = _hook(monkeypatch, session, org="lab").test_connection()
    assert ok and message == "brev answers: 2 instance(s) in org lab, 1 running" and session.calls == [("ls",)]


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (BrevError(ErrClass.ERR_AUTH, "Brev refused the token"), "Authentication refused: Brev refused the token"),
        (BrevError(ErrClass.ERR_CONFIG, "cannot run '/x/brev'"), "Incomplete connection: cannot run '/x/brev'"),
        (
            BrevError(ErrClass.ERR_CONFIG, "cannot select org 'lab'", _result(stderr="no orgs exist", code=1)),
            "Not found: cannot select org 'lab'",
        ),
        (
            BrevError(ErrClass.ERR_INFRA, "listing the instances (brev ls --json) failed"),
            "Unreachable: listing the instances (brev ls --json) failed; check the network and that the Brev API "
            "answers",
        ),
    ],
)
def test_test_connection_says_in_words_what_failed(
    monkeypatch: pytest.MonkeyPatch, error: BrevError, words: str
) -> None:
    class Failing(ScriptedSession):
        def instances(self, timeout: float = 0) -> dict[str, dict[str, Any]]:
            raise error

    assert _hook(monkeypatch, Failing({}, lambda i, c: None)).test_connection() == (False, words)


def test_test_connection_without_a_token_calls_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BREV_API_TOKEN", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_TAO_BREV_UNIT", json.dumps({"conn_type": "tao_brev"}))
    ok, message = bv.BrevHook("tao_brev_unit").test_connection()
    assert (ok, message) == (
        False,
        "Incomplete connection: no Brev API token: put it in the connection's password (or set BREV_API_TOKEN)",
    )


def test_the_cli_never_inherits_the_workers_secrets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The brev CLI (and the ssh it spawns) runs with the worker's environment minus everything secret: Airflow's
    connections, variables and settings, and every variable whose name says it is a secret."""
    leaks = {
        "AIRFLOW_CONN_S3": "aws://k:conn-secret@",
        "AIRFLOW_VAR_X": "var-secret",
        "AIRFLOW__CORE__FERNET_KEY": "fernet-secret",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "BREV_API_TOKEN": "brev-secret",
        "NGC_KEY": "ngc-secret",
        "HF_TOKEN": "hf-secret",
        "DB_PASSWORD": "db-secret",
    }
    for key, value in {**leaks, "LANG": "C.UTF-8", "BREV_FAKE_STATE": "/w"}.items():
        monkeypatch.setenv(key, value)
    env = BrevSession(executable="brev", token="t0k3n", org=None, identity="i", home_root=tmp_path).environment()
    assert not set(leaks) & set(env)
    assert env["LANG"] == "C.UTF-8" and env["BREV_FAKE_STATE"] == "/w"
    assert env["HOME"].startswith(str(tmp_path)) and env["SSH_AUTH_SOCK"].endswith("no-agent")
