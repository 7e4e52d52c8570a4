"""The fake ``brev`` against the real CLI's documented behaviour (brevdev/brev-cli v0.6.327, read from its source).

Every test runs the fake as the provider will -- an executable with a private HOME, stdin from /dev/null unless
the test is about stdin -- and checks what the real CLI does: exit codes, the stdout/stderr split, texts, JSON
shapes, the state left on the world and on the Docker engine (asked directly, never through the fake).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.brevfake.control import BrevWorld

pytestmark = pytest.mark.integration

PROMPT = "You are currently logged out, would you like to log in? [Y/n]: "


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A private HOME, as the provider gives the CLI."""
    path = tmp_path / "home"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def world(brev_world: BrevWorld, home: Path) -> BrevWorld:
    """The test's world, logged in from ``home``."""
    brev_world.login(home)
    return brev_world


def brev(world: BrevWorld, home: Path, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return world.run(*args, home=home, **kwargs)


def ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    return done


def failed(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 1, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    return done


def workspaces(world: BrevWorld, home: Path) -> list[dict[str, Any]]:
    return json.loads(ok(brev(world, home, "ls", "--json")).stdout)["workspaces"] or []


# ---------------------------------------------------------------------------------------------------- global
def test_errors_exit_1_on_stderr_without_colour(world: BrevWorld, home: Path) -> None:
    done = failed(brev(world, home, "delete", "--yes", "box"))
    assert (done.stdout, done.stderr) == ("", "unknown flag: --yes\n")
    assert failed(brev(world, home, "ls", "-y")).stderr == "unknown shorthand flag: 'y' in -y\n"
    assert 'unknown command "lst" for "brev"' in failed(brev(world, home, "lst")).stderr
    bad = failed(brev(world, home, "create", "x", "--count", "two")).stderr
    assert bad == 'invalid argument "two" for "-c, --count" flag: strconv.ParseInt: parsing "two": invalid syntax\n'
    assert "\x1b[" not in bad
    assert failed(brev(world, home, "exec")).stderr == "requires at least 1 arg(s), only received 0\n"


def test_logged_out_commands_prompt_on_stdout_and_fail_with_eof(brev_world: BrevWorld, home: Path) -> None:
    for args in (("ls", "--json"), ("create", "box", "-t", "g5.xlarge"), ("delete", "box"), ("copy", "a:/x", "/y")):
        done = failed(brev(brev_world, home, *args))
        assert done.stdout.endswith(PROMPT), args
        assert done.stderr.endswith((": EOF\n\n\n" if args[0] == "delete" else "\nEOF\n", "EOF\n")), args
    declined = failed(brev(brev_world, home, "ls", input="n\n"))
    assert (declined.stdout, declined.stderr) == (PROMPT, "declined to login\n")
    assert brev_world.instances() == []


def test_token_login_writes_the_real_credentials_file(brev_world: BrevWorld, home: Path) -> None:
    done = ok(brev(brev_world, home, "login", "--token", brev_world.token))
    assert done.stdout.startswith("\n   ▸     Starting Login\n\n")
    assert "current organization: ci-org\n" in done.stdout
    credentials = home / ".brev" / "credentials.json"
    text = credentials.read_text()
    tokens = json.loads(text)
    assert text.startswith('{\n "access_token": "ey') and list(tokens) == ["access_token", "refresh_token"]
    assert tokens["refresh_token"] == brev_world.token  # a non-JWT token is the refresh token ...
    assert tokens["access_token"].count(".") == 2  # ... exchanged for a JWT by the first call
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o666 & ~_umask()
    assert not (home / ".brev" / "active_org.json").exists()  # only `brev set` / API-key logins write it

    jwt = brev_world.jwt()
    ok(brev(brev_world, home, "login", "--token", jwt))
    assert json.loads(credentials.read_text()) == {"access_token": jwt, "refresh_token": "auto-login"}
    assert workspaces(brev_world, home) == []

    key, org = brev_world.api_key, brev_world.org["id"]
    assert failed(brev(brev_world, home, "login", "--org-id", org)).stderr == "org-id can only be used with api-key\n"
    assert "api key auth requires an org id" in failed(brev(brev_world, home, "login", "--api-key", key)).stderr
    assert (
        ok(brev(brev_world, home, "login", "--api-key", key, "--org-id", org)).stdout
        == f"API key saved for org {org}\n"
    )
    assert json.loads(credentials.read_text())["api_key"] == key
    assert json.loads((home / ".brev" / "active_org.json").read_text()) == {"id": org, "name": org, "userNetworkId": ""}


def test_a_wrong_token_fails_the_login_as_a_failed_refresh_does(brev_world: BrevWorld, home: Path) -> None:
    done = failed(brev(brev_world, home, "login", "--token", "not-a-token"))
    assert done.stdout == "\n   ▸     Starting Login\n\nWARN: malformed refresh token, logging out\n"
    assert "/api/me?" in done.stderr and " 401 Unauthorized " in done.stderr
    assert (home / ".brev" / ".invalid-refresh-token").read_text() == "not-a-token"
    unknown = failed(brev(brev_world, home, "login", "--token", "session:device"))
    assert "WARN" not in unknown.stdout and " 401 Unauthorized " in unknown.stderr  # KAS says UNAUTHORIZED
    brev_world.revoke_token()
    assert " 401 Unauthorized " in failed(brev(brev_world, home, "login", "--token", brev_world.token)).stderr
    assert failed(brev(brev_world, home, "ls")).stdout.endswith(PROMPT)


def test_credentials_written_by_hand_work_and_announce_themselves_once(brev_world: BrevWorld, home: Path) -> None:
    (home / ".brev").mkdir()
    tokens = {"access_token": "auto-login", "refresh_token": brev_world.token}
    (home / ".brev" / "credentials.json").write_text(json.dumps(tokens))
    first = ok(brev(brev_world, home, "ls", "--json"))
    assert first.stdout == 'no oauth found for token\n{\n  "workspaces": null\n}\n'  # auth.StandardLogin's print
    assert ok(brev(brev_world, home, "ls", "--json")).stdout == '{\n  "workspaces": null\n}\n'


def test_an_expired_session_is_logged_out_until_the_credentials_are_written_again(world: BrevWorld, home: Path) -> None:
    ok(brev(world, home, "ls"))
    world.expire_session()
    for _ in range(2):  # retrying alone does not help
        done = failed(brev(world, home, "ls", "--json"))
        assert (done.stdout, done.stderr) == (PROMPT, "EOF\n")
    world.login(home)
    ok(brev(world, home, "ls", "--json"))
    world.fail_logins(1)
    (home / ".brev" / "credentials.json").write_text(
        json.dumps({"access_token": "auto-login", "refresh_token": world.token})
    )
    assert failed(brev(world, home, "ls")).stderr == "EOF\n"
    ok(brev(world, home, "ls"))
    ok(brev(world, home, "ls"))
    states = [v["state"] for v in world.credential_versions(home)]
    assert states[0] == "missing" and states[-2:] == ["auto-login", "jwt"]


# ---------------------------------------------------------------------------------------------------- ls
def test_ls_json_shapes_and_statuses(world: BrevWorld, home: Path) -> None:
    assert ok(brev(world, home, "ls", "--json")).stdout == '{\n  "workspaces": null\n}\n'
    for name, instance_type in (("a", "g5.xlarge"), ("b", "c5.2xlarge"), ("c", "g6.xlarge"), ("d", "g5.xlarge")):
        world.create_instance(name, instance_type)
    world.create_instance("mate", owner=world.state()["other_users"][0]["id"])
    world.set_status("b", "UNHEALTHY")
    world.set_status("c", "FAILURE", "out of capacity in us-west-2")
    world.set_status("d", "STOPPED")
    listed = {w["name"]: w for w in workspaces(world, home)}
    assert set(listed) == {"a", "b", "c", "d"}  # a teammate's instance only with --all
    assert listed["a"] == {
        "name": "a",
        "id": world.instance("a")["id"],
        "status": "RUNNING",
        "build_status": "COMPLETED",
        "shell_status": "READY",
        "health_status": "HEALTHY",
        "instance_type": "g5.xlarge",
        "instance_kind": "gpu",
        "gpu": "A10G",
    }
    assert (listed["b"]["status"], listed["b"]["instance_kind"], listed["b"]["gpu"]) == ("UNHEALTHY", "cpu", "-")
    assert (listed["c"]["status"], listed["c"]["shell_status"]) == ("FAILURE", "NOT READY")
    assert listed["d"]["status"] == "STOPPED"
    everyone = json.loads(ok(brev(world, home, "ls", "--all", "--json")).stdout)["workspaces"]
    assert {w["name"] for w in everyone} == {"a", "b", "c", "d", "mate"}
    table = ok(brev(world, home, "ls")).stdout
    assert table.startswith("You have 4 instances in Org ci-org\n NAME ")
    assert " STATUS " in table and " UNHEALTHY " in table
    orgs = json.loads(ok(brev(world, home, "ls", "orgs", "--json")).stdout)
    assert [(o["name"], o["is_active"]) for o in orgs] == [("ci-org", True), ("ci-other-org", False)]
    assert failed(brev(world, home, "ls", "--org", "nope")).stderr == "no org found with name nope\n"
    assert failed(brev(world, home, "ls", "a", "b")).stderr == "too many args provided\n"
    other = json.loads(ok(brev(world, home, "ls", "--org", "ci-other-org", "--json")).stdout)
    assert other == {"workspaces": None}
    ok(brev(world, home, "set", "ci-other-org"))
    assert json.loads((home / ".brev" / "active_org.json").read_text())["name"] == "ci-other-org"
    assert workspaces(world, home) == []
    assert failed(brev(world, home, "set", "nope")).stderr == "no orgs exist with name nope\n"


def test_search_json_lists_the_types(world: BrevWorld, home: Path) -> None:
    types = json.loads(ok(brev(world, home, "search", "--json")).stdout)
    assert {t["type"] for t in types} >= {"g5.xlarge", "g6.xlarge", "p4d.24xlarge"}
    assert "c5.2xlarge" not in {t["type"] for t in types}  # GPU types by default
    first = types[0]
    assert set(first) >= {"type", "gpu_name", "gpu_count", "vram_per_gpu_gb", "stoppable", "price_per_hour"}
    assert [t["price_per_hour"] for t in types] == sorted(t["price_per_hour"] for t in types)
    assert {t["gpu_name"] for t in json.loads(ok(brev(world, home, "search", "-g", "a100", "--json")).stdout)} == {
        "A100"
    }
    assert ok(brev(world, home, "search", "--gpu-name", "nothing", "--json")).stdout == "[]\n"
    assert "invalid sort option" in failed(brev(world, home, "search", "--sort", "x")).stderr


# ---------------------------------------------------------------------------------------------------- create
def test_create_falls_back_over_the_type_chain_and_prints_names_when_piped(world: BrevWorld, home: Path) -> None:
    world.set_capacity("g6.xlarge", 0)
    done = ok(brev(world, home, "create", "box", "-t", "nope.large,g6.xlarge,g5.xlarge"))
    assert done.stdout == "box\n"
    assert "Instance types to try: nope.large, g6.xlarge, g5.xlarge\n" in done.stderr
    assert 'Skipping: instance type "nope.large" is not a recognized type' in done.stderr
    assert 'instance type "g6.xlarge" is currently unavailable (no capacity)' in done.stderr
    assert "[Worker 1] g5.xlarge Success! Created instance 'box'\n" in done.stderr
    assert "  box: Ready\n" in done.stderr
    assert world.instance("box")["instance_type"] == "g5.xlarge"
    assert world.instance("box")["status"] == "RUNNING"
    [container] = world.containers()
    assert container["State"] == "running" and container["Labels"]["brevfake.instance"] == "box"

    duplicate = failed(brev(world, home, "create", "box", "-t", "g5.xlarge,g5.2xlarge"))
    assert "duplicate workspace" in duplicate.stderr
    assert "Error: workspace 'box' already exists. Use a different name or delete the existing workspace" in (
        duplicate.stderr
    )
    assert "Trying g5.2xlarge" not in duplicate.stderr  # fatal: the chain stops
    assert duplicate.stderr.endswith("Warning: Only created 0/1 instances\ncould only create 0/1 instances\n")

    many = ok(brev(world, home, "create", "grp", "-t", "g5.2xlarge", "-c", "2", "-d"))
    assert many.stdout == "grp-1\ngrp-2\n"
    assert "Waiting for instance" not in many.stderr
    assert {world.instance(n)["status"] for n in ("grp-1", "grp-2")} == {"DEPLOYING"}


def test_create_with_no_capacity_anywhere_fails_and_leaves_nothing(world: BrevWorld, home: Path) -> None:
    for instance_type in ("g5.xlarge", "g5.2xlarge"):
        world.set_capacity(instance_type, 0)
    done = failed(brev(world, home, "create", "box", "-t", "g5.xlarge,g5.2xlarge"))
    assert done.stdout == ""
    assert done.stderr.count("is currently unavailable (no capacity)") == 2
    assert done.stderr.endswith("could only create 0/1 instances\n")
    assert world.instances() == [] and world.containers() == []


def test_create_exits_0_when_the_instance_fails_or_times_out(world: BrevWorld, home: Path) -> None:
    world.fail_deploys(1, "insufficient capacity in zone")
    done = ok(brev(world, home, "create", "bad", "-t", "g5.xlarge"))
    assert done.stdout == "bad\n"
    assert "  bad: instance bad failed: insufficient capacity in zone\n" in done.stderr
    assert workspaces(world, home)[0]["status"] == "FAILURE"
    world.set_time_scale(0.02, deploy=10_000)
    slow = ok(brev(world, home, "create", "slow", "-t", "g5.xlarge", "--timeout", "20"))
    assert slow.stdout == "slow\n" and "  slow: Timeout waiting for ready state\n" in slow.stderr


def test_create_validates_before_anything_else(brev_world: BrevWorld, home: Path) -> None:
    for args, message in (
        (("create",), "name is required"),
        (("create", "-bad"), "unknown shorthand flag: 'b' in -bad"),
        (("create", "a b"), "name must start with a letter or digit and contain only letters, digits, hyphens"),
        (("create", "x" * 64), "name must be 63 characters or fewer (got 64)"),
        (("create", "box", "-c", "0"), "--count must be at least 1"),
        (("create", "box", "-m", "vmx"), 'invalid mode "vmx": must be one of vm, k8s, container, compose'),
    ):
        done = failed(brev(brev_world, home, *args))
        assert message in done.stderr and PROMPT not in done.stdout, args  # before the login is needed


def test_create_lost_response_still_creates_the_instance(world: BrevWorld, home: Path) -> None:
    world.lose_create_responses(1)
    done = failed(brev(world, home, "create", "box", "-t", "g5.xlarge,g5.2xlarge"))
    assert 'WARN  RESTY Post "https://brevapi.' in done.stderr and ": unexpected EOF\n" in done.stderr
    assert "already exists" in done.stderr  # the fallback type then hits the name the lost create took
    assert [w["name"] for w in workspaces(world, home)] == ["box"]


def test_startup_script_runs_once_as_the_login_user_before_exec_answers(world: BrevWorld, home: Path) -> None:
    script = home / "boot.sh"
    script.write_text("sleep 0.5; id -un > ~/booted; pwd >> ~/booted\n")
    ok(brev(world, home, "create", "box", "-t", "g5.xlarge", "-s", f"@{script}"))
    done = ok(brev(world, home, "exec", "box", "cat ~/booted"))
    assert done.stdout == "ubuntu\n/home/ubuntu\nbox\n"


# ---------------------------------------------------------------------------------------------------- stdin
def test_commands_read_extra_names_from_a_piped_stdin_until_eof(world: BrevWorld, home: Path) -> None:
    for name in ("a", "b"):
        world.create_instance(name)
    ok(brev(world, home, "refresh"))
    proc = subprocess.Popen(
        [world.brev, "exec", "a", "hostname >/dev/null; echo hi"],
        env=world.env(home),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    proc.stdin.write("b\n")
    proc.stdin.flush()
    time.sleep(1.0)
    assert proc.poll() is None  # still reading names: a caller that forgets stdin=DEVNULL hangs here
    out, err = proc.communicate("\n", timeout=30)
    assert proc.returncode == 0
    assert out == "hi\na\nhi\nb\n"
    assert "\n=== a ===\n" in err and "\n=== b ===\n" in err
    piped_types = ok(brev(world, home, "create", "c", "-d", input="TYPE  GPU\ng5.xlarge  A10G\n"))
    assert "Instance types to try: g5.xlarge\n" in piped_types.stderr
    done = ok(brev(world, home, "delete", "a", input="b\nc\n"))
    assert done.stdout == "a\nb\nc\n"
    # all three are being deleted (or, on a slow machine, already gone): none is left running
    assert {w["status"] for w in workspaces(world, home)} <= {"DELETING"}


# ---------------------------------------------------------------------------------------------------- exec
def test_exec_takes_the_last_argument_as_the_command_and_the_rest_as_instances(world: BrevWorld, home: Path) -> None:
    world.create_instance("box")
    done = failed(brev(world, home, "exec", "box", "--", "echo", "hi"))
    assert done.stdout == ""
    assert "\n=== box ===\n" in done.stderr and "\n=== echo ===\n" in done.stderr
    assert 'could not look up instance "echo"' in done.stderr
    assert "bash: line 1: hi: command not found" in done.stderr
    assert done.stderr.endswith("\n\n\n") and "2 errors occurred:\n\t* " in done.stderr
    assert [c["targets"] for c in world.calls("exec")] == [["box", "echo"]]


def test_exec_runs_in_the_instance_and_appends_its_name_when_piped(world: BrevWorld, home: Path) -> None:
    world.create_instance("box")
    first = ok(brev(world, home, "exec", "box", 'echo "$USER:$HOME:$PWD"; echo err >&2'))
    assert first.stdout == "ubuntu:/home/ubuntu:/home/ubuntu\nbox\n"
    assert first.stderr.startswith("ssh: Could not resolve hostname box: Name or service not known\n")
    assert "Connection failed, checking instance status...\n" in first.stderr  # no ssh config yet: the slow path
    again = ok(brev(world, home, "exec", "box", "echo again"))
    assert (again.stdout, again.stderr) == ("again\nbox\n", "")
    quiet = ok(brev(world, home, "exec", "box", "echo to-dev-null", stdin=subprocess.DEVNULL))
    assert quiet.stdout.endswith("box\n")
    script = home / "job.sh"
    script.write_text("echo from-a-file\n")
    assert ok(brev(world, home, "exec", "box", f"@{script}")).stdout == "from-a-file\nbox\n"
    assert "command is required" in failed(brev(world, home, "exec", "box", "")).stderr


def test_a_failing_command_runs_twice_and_exec_exits_1_whatever_its_code(world: BrevWorld, home: Path) -> None:
    world.create_instance("box")
    ok(brev(world, home, "refresh"))
    done = failed(brev(world, home, "exec", "box", "echo ran >> ~/runs; exit 3"))
    assert done.stdout == ""
    assert done.stderr.endswith("Connection failed, checking instance status...\nexit status 3\n")
    assert world.exec_in("box", "cat ~/runs")[1] == "ran\nran\n"
    assert failed(brev(world, home, "exec", "box", "exit 255")).stderr.endswith("exit status 255\n")


def test_exec_starts_a_stopped_instance_and_refuses_other_states(world: BrevWorld, home: Path) -> None:
    for name in ("box", "bad", "new"):
        world.create_instance(name)
    ok(brev(world, home, "refresh"))
    world.set_status("box", "STOPPED")
    done = ok(brev(world, home, "exec", "box", "echo up"))
    assert done.stdout == "Instance box is starting. \n\nup\nbox\n"
    assert world.instance("box")["status"] == "RUNNING"
    world.set_status("bad", "FAILURE", "host lost")
    failure = failed(brev(world, home, "exec", "bad", "true"))
    assert failure.stderr.endswith('instance "bad" is in state "FAILURE" — please check with: brev ls\n')
    unknown = failed(brev(world, home, "exec", "nobox", "true"))
    assert unknown.stderr.endswith(
        'ssh connection failed and could not look up instance "nobox": [error] \n'
        "github.com/brevdev/brev-cli/pkg/cmd/exec.runSSHWithTimeout\n"
        "/go/src/github.com/brevdev/brev-cli/pkg/cmd/exec/exec.go:311\n"
        ": exit status 255\nPlease check your instances with: brev ls\n"
    )
    world.set_status("new", "UNHEALTHY")  # RUNNING to exec: the VM answers
    assert ok(brev(world, home, "exec", "new", "echo ok")).stdout == "ok\nnew\n"


def test_exec_readiness_race_and_flaky_connections(world: BrevWorld, home: Path) -> None:
    world.create_instance("box")
    ok(brev(world, home, "refresh"))
    world.not_ready("box", 3)
    first = failed(brev(world, home, "exec", "box", "echo ready >> ~/log"))
    assert "ssh: connect to host " in first.stderr and "port 22: Connection refused" in first.stderr
    assert 'could not connect to instance "box"' in first.stderr  # WaitForSSH gives up on one-line errors
    second = ok(brev(world, home, "exec", "box", "echo ready >> ~/log"))  # one refusal left, then the re-run
    assert "Connection failed, checking instance status..." in second.stderr
    assert world.exec_in("box", "cat ~/log")[1] == "ready\n"

    world.flaky_ssh(1, "box")  # reset before the command runs: the re-run is its only run
    done = ok(brev(world, home, "exec", "box", "echo once >> ~/flaky"))
    assert "kex_exchange_identification: read: Connection reset by peer" in done.stderr
    world.flaky_ssh(1, "box", when="after")  # dropped after it ran: it runs twice, exec still exits 0
    dropped = ok(brev(world, home, "exec", "box", "echo twice >> ~/flaky"))
    assert "closed by remote host." in dropped.stderr
    world.flaky_ssh(2)
    gone = failed(brev(world, home, "exec", "box", "echo never >> ~/flaky"))
    ip = world.instance("box")["ip"]
    assert gone.stderr.endswith(f"\n: \nConnection reset by {ip} port 22\nPlease check with: brev ls\n")
    assert world.exec_in("box", "cat ~/flaky")[1] == "once\ntwice\ntwice\n"


def test_docker_inside_an_instance_runs_sibling_jobs_on_its_own_files(world: BrevWorld, home: Path) -> None:
    world.create_instance("gpu", "g5.xlarge")
    world.create_instance("cpu", "c5.2xlarge")
    ok(brev(world, home, "refresh"))
    run = (
        "mkdir -p ~/job && echo payload > ~/job/in && "
        "docker run --rm --network none --gpus all -v $HOME/job:/job local/debian-py:ci "
        "sh -c 'cat /job/in; echo $NVIDIA_VISIBLE_DEVICES; echo result > /job/out' && cat ~/job/out && nvidia-smi -L"
    )
    done = ok(brev(world, home, "exec", "gpu", run))
    assert done.stdout.startswith("payload\nall\nresult\nGPU 0: NVIDIA A10G (UUID: ")
    assert (world.home_of("gpu") / "job" / "out").read_text() == "result\n"
    refused = failed(brev(world, home, "exec", "cpu", "docker run --rm --gpus all local/debian-py:ci true"))
    assert 'could not select device driver "" with capabilities: [[gpu]]' in refused.stderr
    too_many = failed(brev(world, home, "exec", "gpu", "docker run --rm --gpus 2 local/debian-py:ci true"))
    assert "nvidia-container-cli: device error: 2: unknown device" in too_many.stderr
    outside = failed(brev(world, home, "exec", "gpu", "docker run --rm -v /etc:/x local/debian-py:ci true"))
    assert "bind mount source '/etc' is not a folder of this instance" in outside.stderr

    detach = "docker run -d --name brevfake-t-$RANDOM --network none local/debian-py:ci sleep 300 >/dev/null"
    ok(
        brev(
            world,
            home,
            "exec",
            "gpu",
            f"{detach}; nohup sh -c 'sleep 1; echo alive > ~/bg' </dev/null >/dev/null 2>&1 &",
        )
    )
    assert ok(brev(world, home, "exec", "cpu", "docker ps -aq | wc -l")).stdout == "0\ncpu\n"  # its own jobs only
    [job] = world.job_containers("gpu")
    assert job["State"] == "running"
    _wait(lambda: world.exec_in("gpu", "cat ~/bg 2>/dev/null")[1] == "alive\n", "a background process outlives exec")
    ok(brev(world, home, "stop", "gpu"))
    assert [c["State"] for c in world.job_containers("gpu")] == ["exited"]  # a VM stop takes its containers down
    ok(brev(world, home, "delete", "gpu"))
    assert world.job_containers() == [] and len(world.containers()) == 1


def test_docker_login_is_answered_by_the_instance(world: BrevWorld, home: Path) -> None:
    world.set_ngc_key("ngc-secret")
    world.create_instance("box")
    ok(brev(world, home, "refresh"))
    login = "docker login nvcr.io -u '$oauthtoken' --password-stdin <<< {} >/dev/null 2>&1 && echo in"
    assert ok(brev(world, home, "exec", "box", login.format("ngc-secret"))).stdout == "in\nbox\n"
    assert failed(brev(world, home, "exec", "box", login.format("wrong"))).stdout == ""


# ---------------------------------------------------------------------------------------------------- copy
def test_copy_has_scp_semantics_through_the_engine(world: BrevWorld, home: Path, tmp_path: Path) -> None:
    world.create_instance("box")
    local = tmp_path / "local"
    (local / "tree" / "sub").mkdir(parents=True)
    (local / "tree" / "sub" / "a.txt").write_text("A")
    secret = local / "secret.txt"
    secret.write_text("S")
    secret.chmod(0o600)
    done = ok(brev(world, home, "copy", str(secret), "box:secret.txt"))
    assert done.stdout.startswith(f"\n✓ Successfully copied {secret} → box:secret.txt (")
    assert done.stdout.endswith(")\n\n")
    ok(brev(world, home, "cp", str(local / "tree"), "box:/home/ubuntu"))
    ok(brev(world, home, "scp", str(local / "tree"), "box:copied"))
    listing = world.exec_in("box", "stat -c '%U %a %n' secret.txt tree/sub/a.txt copied/sub/a.txt")[1]
    assert listing.splitlines() == ["ubuntu 600 secret.txt", "ubuntu 644 tree/sub/a.txt", "ubuntu 644 copied/sub/a.txt"]
    ok(brev(world, home, "copy", "box:tree", str(local / "back")))
    assert (local / "back" / "sub" / "a.txt").read_text() == "A"
    ok(brev(world, home, "copy", "box:/home/ubuntu/secret.txt", str(local / "back")))
    assert (local / "back" / "secret.txt").read_text() == "S"

    assert failed(brev(world, home, "copy", "a", "b")).stderr == (
        "exactly one of source or destination must be an instance path (format: instance_name:/path)\n"
    )
    assert (
        failed(brev(world, home, "copy", "/nope", "box:/x")).stderr == "local file or directory does not exist: /nope\n"
    )
    assert (
        failed(brev(world, home, "copy", str(secret), "nobox:/x")).stderr == "instance with id/name nobox not found\n"
    )
    assert (
        failed(brev(world, home, "copy", "a:b:c", "/x")).stderr
        == "invalid instance path format, use instance_name:/path\n"
    )
    missing = failed(brev(world, home, "copy", str(secret), "box:/no/such/dir/x"))
    assert missing.stderr.startswith("scp failed: exit status 1\nOutput: scp: ")
    assert "Permission denied" in failed(brev(world, home, "copy", str(secret), "box:/etc/x")).stderr
    world.set_status("box", "STOPPED")
    started = ok(brev(world, home, "copy", str(secret), "box:again.txt"))
    assert started.stdout.startswith("Instance box is starting. \n\n")
    assert world.exec_in("box", "cat again.txt")[1] == "S"


# ---------------------------------------------------------------------------------------------------- lifecycle
def test_delete_stop_start(world: BrevWorld, home: Path) -> None:
    world.create_instance("box")
    world.create_instance("h100", "hyperstack_H100")
    missing = failed(brev(world, home, "delete", "nobox"))
    assert missing.stderr.startswith("1 error occurred:\n\t* [error] \n")
    assert missing.stderr.endswith(": instance with id/name nobox not found\n\n\n")
    assert failed(brev(world, home, "delete")).stderr == (
        "instance name required: provide as argument or pipe from another command\n"
    )
    assert 'instance "h100" does not support stop.' in failed(brev(world, home, "stop", "h100")).stderr

    assert ok(brev(world, home, "stop", "box")).stdout == "box\n"
    assert world.instance("box")["status"] == "STOPPING"
    world.wait_status("box", "STOPPED")
    assert _running(world, "box") is False
    not_stopped = failed(brev(world, home, "start", "h100"))
    assert not_stopped.stderr == "Instance is not stopped status=RUNNING\n"
    started = ok(brev(world, home, "start", "box"))
    assert started.stdout.startswith("Instance box is starting. \nNote: this can take about a minute.")
    assert "Your instance is ready!" in started.stdout and started.stdout.endswith("box\n")
    assert world.instance("box")["status"] == "RUNNING" and _running(world, "box")
    unknown = ok(brev(world, home, "start", "no-such-box"))
    assert unknown.stdout == "tried to start with local path but path not found\nno-such-box\n"

    h100_id = world.instance("h100")["id"]  # read before the delete: the instance may be gone right after it
    assert ok(brev(world, home, "delete", h100_id)).stdout == h100_id + "\n"
    assert ok(brev(world, home, "delete", "box")).stdout == "box\n"
    assert world.instance("box")["status"] == "DELETING"
    assert world.containers() == []  # the VMs are torn down at once
    _wait(lambda: world.instances() == [], "both gone after DELETING")
    assert sorted(d["name"] for d in world.deleted()) == ["box", "h100"]


# ---------------------------------------------------------------------------------------------------- the world
def test_invocation_log_and_concurrent_calls(world: BrevWorld, home: Path) -> None:
    world.create_instance("box")
    results: list[int] = []

    def call() -> None:
        results.append(brev(world, home, "ls", "--json").returncode)

    threads = [threading.Thread(target=call) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [0] * 12
    calls = world.calls()
    assert [c["command"] for c in calls] == ["login", *["ls"] * 12]
    assert all(c["exit"] == 0 and c["end"] >= c["start"] and c["home"] == str(home) for c in calls)
    assert world.token in calls[0]["argv"]  # the log shows what a process list shows
    assert all(world.token not in " ".join(c["argv"]) for c in calls[1:])
    creates: list[subprocess.CompletedProcess[str]] = []

    def create(name: str) -> None:
        creates.append(brev(world, home, "create", name, "-t", "g5.xlarge", "-d"))

    racers = [threading.Thread(target=create, args=(name,)) for name in ("same", "same", "same", "other")]
    for thread in racers:
        thread.start()
    for thread in racers:
        thread.join()
    assert sorted(c.returncode for c in creates) == [0, 0, 1, 1]  # one "same" wins the name, "other" is made
    assert sorted(i["name"] for i in world.instances()) == ["box", "other", "same"]
    assert len(world.containers()) == 3

    world.api_errors(1, 502)
    failure = failed(brev(world, home, "ls", "--json"))
    assert " 502 Bad Gateway " in failure.stderr
    assert world.calls("ls")[-1]["stderr"] == failure.stderr


def test_the_time_scale_stretches_the_clis_own_waits(world: BrevWorld, home: Path) -> None:
    world.create_instance("box")
    ok(brev(world, home, "exec", "box", "true", env={"SSH_AUTH_SOCK": ""}))
    assert world.calls("exec")[-1]["ssh_agents_started"] == 2  # the real exec leaks one per ssh attempt
    ok(brev(world, home, "exec", "box", "true", env={"SSH_AUTH_SOCK": "/nonexistent"}))
    assert world.calls("exec")[-1]["ssh_agents_started"] == 0
    started = time.monotonic()
    ok(brev(world, home, "copy", "box:.profile", str(home / "p"), env={"BREV_FAKE_TIME_SCALE": "0.2"}))
    assert time.monotonic() - started >= 1.0  # copy always sleeps its 5 s before looking at the instance


def test_teardown_removes_only_the_worlds_containers(brev_world: BrevWorld, home: Path, tmp_path: Path) -> None:
    other = BrevWorld.create(tmp_path / "other", brev_world.state()["engine"])
    try:
        brev_world.create_instance("mine")
        other.create_instance("theirs")
        other.exec_in("theirs", "docker run -d --network none local/debian-py:ci sleep 300")
        other.teardown()
        assert other.containers() == [] and other.job_containers() == []
        assert [c["Labels"]["brevfake.instance"] for c in brev_world.containers()] == ["mine"]
        brev_world.reset()
        assert brev_world.instances() == [] and brev_world.containers() == []
    finally:
        other.teardown()


def _running(world: BrevWorld, name: str) -> bool:
    """Whether the engine says the instance's container runs."""
    container = world.container_of(name)
    assert container is not None, f"no container for {name}"
    return bool(container["State"]["Running"])


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _wait(condition: Any, what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not true after {timeout} s: {what}"
        time.sleep(0.1)
