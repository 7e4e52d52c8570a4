"""``BrevWorld``: how tests make and steer a fake Brev world (never through the provider's own code).

A world is a state directory (``BREV_FAKE_STATE``) plus the containers its instances run as on the test Docker
engine. ``BrevWorld.create(dir, engine_host)`` makes a fresh one and a launcher ``<dir>/bin/brev`` that runs the
fake CLI with this world wired in and a fast interpreter (no pyenv shim, no site-packages). Faults and states are
set directly in the world; the engine is asked directly what runs.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import instances
from .engine import Engine
from .server import Server, new_instance
from .world import SERVICE_ACCOUNT_TOKEN, World, default_state, login_token, mint_jwt, schedule

TESTS_DIR = Path(__file__).resolve().parents[1]
GENERIC_BINARY = Path(__file__).resolve().parent / "bin" / "brev"


class BrevWorld:
    """A fake Brev world.

    :param state_dir: its state directory (``BREV_FAKE_STATE``).
    """

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(state_dir)
        self.world = World(self.dir)

    # ------------------------------------------------------------------------------------------------ lifecycle
    @classmethod
    def create(
        cls,
        state_dir: str | os.PathLike[str],
        engine_host: str,
        time_scale: float | None = None,
        durations: dict[str, float] | None = None,
    ) -> BrevWorld:
        """A fresh world in ``state_dir`` whose instances run on ``engine_host`` (``unix://...``).

        :param time_scale: real seconds per world second (default 0.02: a 60 s deploy takes 1.2 s).
        :param durations: world seconds of the ``deploy``, ``start``, ``stop`` and ``delete`` transitions.
        """
        directory = Path(state_dir)
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o755)
        state = default_state(engine_host, secrets.token_hex(4))
        if time_scale is not None:
            state["time_scale"] = time_scale
        state["durations"].update(durations or {})
        world = cls(directory)
        world.world.write(state)
        world._write_launcher()
        return world

    def _write_launcher(self) -> None:
        launcher = self.dir / "bin" / "brev"
        launcher.parent.mkdir(exist_ok=True)
        interpreter = os.path.realpath(sys.executable)
        launcher.write_text(
            f"#!{interpreter} -S\n"
            "import os, sys\n"
            f"os.environ['BREV_FAKE_STATE'] = {str(self.dir)!r}\n"
            f"sys.path.insert(0, {str(TESTS_DIR)!r})\n"
            "from brevfake.cli import main\n"
            "sys.exit(main())\n"
        )
        launcher.chmod(0o755)
        userbin = self.dir / "userbin"
        userbin.mkdir(exist_ok=True)
        for program in ("ssh", "scp"):
            real = shutil.which(program)
            assert real is not None, f"{program} (OpenSSH) is missing: the fake reaches instances through it"
            wrapper = userbin / program
            wrapper.write_text(
                '#!/bin/sh\nif [ -f "$HOME/.ssh/config" ]; then '
                f'exec {real} -F "$HOME/.ssh/config" "$@"; else exec {real} "$@"; fi\n'
            )
            wrapper.chmod(0o755)

    @staticmethod
    def sweep_orphans(engine_host: str) -> list[str]:
        """Remove the containers of fake worlds whose state directory no longer exists (a test run that was
        killed before its teardown); worlds still in use keep theirs. The names removed."""
        engine = Engine(engine_host)
        removed = []
        for container in engine.containers("brevfake.state"):
            if not os.path.isdir(container["Labels"]["brevfake.state"]):
                engine.remove(container["Id"])
                removed.append(container["Names"][0].lstrip("/"))
        return removed

    def teardown(self) -> None:
        """Remove every container of this world (instances and what was started on them) and its disks."""
        engine = self.engine()
        for container in engine.containers(f"brevfake.world={self.tag}"):
            engine.remove(container["Id"])
        shutil.rmtree(self.dir / "instances", ignore_errors=True)

    def reset(self) -> None:
        """Back to a fresh world with the same directory and engine (containers removed, new tokens)."""
        engine_host = self.state()["engine"]
        self.teardown()
        for name in ("world.json", "calls.jsonl"):
            (self.dir / name).unlink(missing_ok=True)
        fresh = BrevWorld.create(self.dir, engine_host)
        self.world = fresh.world

    # ------------------------------------------------------------------------------------------------ reading
    def state(self) -> dict[str, Any]:
        return self.world.read()

    @property
    def tag(self) -> str:
        return str(self.state()["tag"])

    @property
    def brev(self) -> str:
        """Path of this world's ``brev`` launcher (what a connection's ``brev_path`` should name)."""
        return str(self.dir / "bin" / "brev")

    @property
    def bin_dir(self) -> str:
        return str(self.dir / "bin")

    @property
    def token(self) -> str:
        """A token ``brev login --token`` accepts (``<session key>:<device id>``, exchanged with KAS)."""
        return login_token(self.state())

    def jwt(self) -> str:
        """An access token (a JWT valid for an hour) ``brev login --token`` saves as it is."""
        return mint_jwt(self.state())

    @property
    def api_key(self) -> str:
        return next(iter(self.state()["auth"]["api_keys"]))

    @property
    def org(self) -> dict[str, Any]:
        """The user's default org (the first)."""
        return dict(self.state()["orgs"][0])

    @property
    def user(self) -> dict[str, Any]:
        return dict(self.state()["user"])

    def env(self, home: str | os.PathLike[str]) -> dict[str, str]:
        """An environment for running the fake CLI by hand with a private ``HOME``, as a user whose ``HOME`` is
        their passwd home: OpenSSH reads the passwd home's ``~/.ssh/config``, so ``ssh`` and ``scp`` on its
        ``PATH`` are given ``$HOME/.ssh/config`` with ``-F`` (once it exists) -- else brev's aliases are unknown."""
        path = f"{self.dir / 'userbin'}{os.pathsep}{os.environ.get('PATH', '')}"
        return {**os.environ, "HOME": str(home), "BREV_FAKE_STATE": str(self.dir), "PATH": path}

    def instances(self) -> list[dict[str, Any]]:
        """The world's instances (settled to now), oldest first."""
        return sorted(self.state()["instances"].values(), key=lambda i: i["created_at"])

    def instance(self, name: str) -> dict[str, Any]:
        found = [i for i in self.instances() if name in (i["name"], i["id"])]
        assert len(found) == 1, f"{len(found)} instances named {name!r}: {[i['name'] for i in self.instances()]}"
        return found[0]

    def deleted(self) -> list[dict[str, Any]]:
        """Instances whose deletion completed: ``{id, name, gone_at}``."""
        return list(self.state()["deleted"])

    def engine(self) -> Engine:
        return Engine(self.state()["engine"])

    def containers(self) -> list[dict[str, Any]]:
        """This world's instance containers as the ENGINE lists them (any state)."""
        return self.engine().containers("brevfake=1", f"brevfake.world={self.tag}")

    def job_containers(self, instance: str | None = None) -> list[dict[str, Any]]:
        """Containers started through an instance's docker (jobs), as the engine lists them."""
        labels = [f"brevfake.world={self.tag}", "brevfake.on-instance"]
        if instance is not None:
            labels[1] = f"brevfake.on-instance={self.instance(instance)['id']}"
        return self.engine().containers(*labels)

    def container_of(self, name: str) -> dict[str, Any] | None:
        """``docker inspect`` of an instance's container."""
        state = self.state()
        return self.engine().inspect(instances.container_name(state, self.instance(name)["id"]))

    def home_of(self, name: str) -> Path:
        """The host folder behind the instance's ``/home/ubuntu``."""
        return self.world.instance_dir(self.instance(name)["id"]) / "home"

    def calls(self, command: str | None = None, instance: str | None = None) -> list[dict[str, Any]]:
        """CLI invocations, oldest first: ``{pid, argv, home, start, end, exit, command, targets, stdout, stderr,
        credentials}`` (``end``/``exit`` are ``None`` while a call runs or when it was SIGKILLed; ``stdout`` and
        ``stderr`` keep their last 32 KiB; ``credentials`` is ``{state, mtime}`` of the HOME's credentials file
        when the call started). ``command`` (``exec``, ``ls``...) and ``instance`` (a target) filter them."""
        merged: dict[tuple[int, float], dict[str, Any]] = {}
        for line in self.world.calls():
            key = (line["pid"], line["start"])
            entry = merged.setdefault(key, {"end": None, "exit": None, "command": None, "targets": []})
            entry.update({k: v for k, v in line.items() if k != "event"})
        found = sorted(merged.values(), key=lambda c: c["start"])
        return [
            c
            for c in found
            if (command is None or c["command"] == command) and (instance is None or instance in c["targets"])
        ]

    def credential_versions(self, home: str | os.PathLike[str]) -> list[dict[str, Any]]:
        """The distinct versions of ``home``'s credentials file the CLI calls started with, in order:
        ``{state, mtime}`` (``state``: missing, auto-login (a fresh token login), jwt, apikey)."""
        versions: list[dict[str, Any]] = []
        for call in self.calls():
            seen = call.get("credentials")
            if call["home"] == str(home) and seen and (not versions or versions[-1] != seen):
                versions.append(seen)
        return versions

    # ------------------------------------------------------------------------------------------------ steering
    def set_capacity(self, instance_type: str, capacity: int | None) -> None:
        """How many instances of a type may exist at once (``None`` = unlimited, 0 = no capacity)."""
        with self.world.mutate() as state:
            state["types"][instance_type]["capacity"] = capacity

    def add_type(self, name: str, **spec: Any) -> None:
        """Add or change an instance type (``gpu``, ``gpu_count``, ``vram_gb``, ``stoppable``, ``price``...)."""
        with self.world.mutate() as state:
            base = dict(state["types"].get(name) or state["types"]["g5.xlarge"])
            base["workspace_group_id"] = base.get("workspace_group_id") or f"wg-{name}"
            base.update(spec)
            state["types"][name] = base

    def set_time_scale(self, scale: float, **durations: float) -> None:
        with self.world.mutate() as state:
            state["time_scale"] = scale
            state["durations"].update(durations)

    def finish_transition(self, name: str) -> None:
        """End the instance's current transition (STOPPING, DEPLOYING...) now: a test holds a transitional status
        with a long duration and ends it when it has seen what it needs, whatever the machine's speed."""
        with self.world.mutate() as state:
            instance = _find(state, name)
            if instance.get("until") is not None:
                instance["until"] = time.time()

    def not_ready(self, name: str, tries: int, kind: str = "refused") -> None:
        """The instance refuses its next ``tries`` ssh connections although RUNNING (sshd still coming up):
        ``kind`` ``refused`` (Connection refused), ``unresolvable`` (hostname not resolvable) or ``silent`` (exit
        255 with no output at all)."""
        with self.world.mutate() as state:
            instance = _find(state, name)
            instance["not_ready"] = {"tries": tries, "kind": kind}

    def flaky_ssh(self, count: int, name: str | None = None, when: str = "before") -> None:
        """The next ``count`` ssh connections (to ``name``, or to any instance) fail with exit 255: ``before``
        the command runs (``kex_exchange_identification: read: Connection reset by peer``), or ``after`` it ran
        and before its output arrived (``Connection to <ip> closed by remote host.``)."""
        with self.world.mutate() as state:
            state["faults"]["flaky_ssh"].append({"count": count, "instance": name, "when": when})

    def go_offline(self, offline: bool = True) -> None:
        """No internet for the CLI: ``brev refresh`` (and ``copy`` / a failed ``exec``, which refresh) cannot
        download cloudflared into a home that has none."""
        with self.world.mutate() as state:
            state["faults"]["offline"] = offline

    def cloudflared_downloads(self) -> list[dict[str, Any]]:
        """Every cloudflared download a ``brev`` of this world made (the home it went to, the CLI's pid)."""
        return list(self.state().get("cloudflared_downloads", []))

    def fail_deploys(self, count: int = 1, message: str = "provider error: instance failed to start") -> None:
        """The next ``count`` instances created go DEPLOYING -> FAILURE (with this status message) instead of
        RUNNING: ``brev create`` still exits 0 and only logs the failure."""
        with self.world.mutate() as state:
            state["faults"]["failing_deploys"] = [message] * count

    def api_errors(self, count: int, status: int = 502, reason: str = "Bad Gateway", body: str = "") -> None:
        """The next ``count`` authenticated API calls fail with this HTTP status; status 0: the connection drops
        before any answer (the CLI fails with Go's ``Get "<url>": EOF``)."""
        body = body or f"<html><head><title>{status} {reason}</title></head></html>"
        with self.world.mutate() as state:
            state["faults"]["api_errors"].append({"count": count, "status": status, "reason": reason, "body": body})

    def lose_create_responses(self, count: int = 1) -> None:
        """The next ``count`` creations succeed on the server but the CLI sees ``unexpected EOF``
        (brevdev/brev-cli#382): the instance exists, create reports a failure."""
        with self.world.mutate() as state:
            state["faults"]["create_lost_response"] = count

    def expire_session(self) -> None:
        """An hour passes and the saved sessions desync: every access token minted so far is expired, and
        credentials saved before now no longer refresh, so logged-in commands hit the logged-out prompt and
        ``EOF`` -- until the credentials are written again (``brev login --token``, or by hand)."""
        with self.world.mutate() as state:
            state["auth"]["clock_offset"] += 3601
            state["auth"]["desync_before"] = time.time()

    def fail_logins(self, count: int) -> None:
        """The next ``count`` token exchanges with KAS are refused (UNAUTHORIZED): the command that needed them
        is logged out (prompt + ``EOF``), whenever its credentials were written."""
        with self.world.mutate() as state:
            state["auth"]["failing_logins"] = count

    def revoke_token(self) -> None:
        """The login token itself stops working (rotated in the console): ``brev login --token`` fails."""
        with self.world.mutate() as state:
            state["auth"]["token_valid"] = False

    def set_startup_user(self, user: str) -> None:
        """Who runs the startup scripts of instances created from now on: ``ubuntu`` (the login user, in its home;
        the default) or ``root`` (in ``/root``) -- Brev's choice is unknown, the tests run against each."""
        assert user in ("ubuntu", "root"), user
        with self.world.mutate() as state:
            state["startup_user"] = user

    def mount_service_account_token(self, token: str) -> Path:
        """Give the world a root of its own (``<world>/root``) holding a Kubernetes service-account token, as an
        automounted pod has: the fake CLI reads it as ``GetAuthTokens`` does. Returns the file's path."""
        root = self.dir / "root"
        path = root / SERVICE_ACCOUNT_TOKEN.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(token)
        with self.world.mutate() as state:
            state["root"] = str(root)
        return path

    def set_ngc_key(self, key: str) -> None:
        """``docker login nvcr.io`` on instances created from now on accepts only this password."""
        with self.world.mutate() as state:
            state["auth"]["ngc_key_sha256"] = hashlib.sha256(key.encode()).hexdigest()

    def set_status(self, name: str, status: str, message: str = "") -> None:
        """Force an instance into RUNNING, FAILURE (with a status message), UNHEALTHY (RUNNING, health
        UNHEALTHY) or STOPPED (its containers killed, as a provider-side stop does)."""
        with self.world.mutate() as state:
            instance = _find(state, name)
            instance.update(until=None, status_message=message)
            instance.pop("after", None)
            if status == "UNHEALTHY":
                instance.update(status="RUNNING", build_status="COMPLETED", health_status="UNHEALTHY")
            elif status == "RUNNING":
                instance.update(status="RUNNING", build_status="COMPLETED", health_status="HEALTHY")
            elif status == "FAILURE":
                instance.update(status="FAILURE", health_status="UNAVAILABLE")
            else:
                instance["status"] = status
            instance_id = instance["id"]
        if status == "STOPPED":
            instances.halt(self.state(), instance_id)
        elif status in ("RUNNING", "UNHEALTHY"):
            instances.resume(self.state(), instance_id)

    def create_instance(
        self, name: str, instance_type: str = "g5.xlarge", owner: str | None = None, ready: bool = True
    ) -> dict[str, Any]:
        """An instance made "by hand" in the console, not by the provider (same user unless ``owner`` names
        another user's id); RUNNING at once unless ``ready`` is False (then DEPLOYING as usual)."""
        with self.world.mutate() as state:
            instance = new_instance(state, name, instance_type, state["orgs"][0]["id"], owner or state["user"]["id"])
            if ready:
                instance.update(status="RUNNING", build_status="COMPLETED", health_status="HEALTHY", until=None)
                instance.pop("after", None)
        Server(self.world)._provision(instance)
        self.wait_container_ready(name)
        return self.instance(name)

    def delete_instance(self, name: str) -> None:
        """Delete an instance from the console side (DELETING, then gone)."""
        with self.world.mutate() as state:
            instance = _find(state, name)
            schedule(state, instance, "DELETING", "delete", "GONE")
            instance_id = instance["id"]
        instances.destroy(self.world, self.state(), instance_id)

    def wait_container_ready(self, name: str, timeout: float = 30) -> None:
        """Until the instance's own docker socket answers (its init has run)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.exec_in(name, "test -S /var/run/docker.sock", user="root")[0] == 0:
                return
            time.sleep(0.05)
        raise AssertionError(f"instance {name} not ready after {timeout} s")

    def exec_in(self, name: str, command: str, user: str = "ubuntu") -> tuple[int, str]:
        """Run ``bash -c command`` in the instance's container directly (not through the CLI): exit code and
        combined output."""
        state = self.state()
        output: list[bytes] = []
        code = Engine(state["engine"], timeout=None).exec_stream(
            instances.container_name(state, self.instance(name)["id"]),
            ["bash", "-c", command],
            lambda _stream, chunk: output.append(chunk),
            user=user,
            workdir=instances.HOME,
            env=instances.SSH_ENV,
        )
        return code, b"".join(output).decode(errors="replace")

    def wait_status(self, name: str, status: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (current := self.instance(name))["status"] != status:
            assert time.monotonic() < deadline, f"{name} is {current['status']}, not {status}, after {timeout} s"
            time.sleep(0.05)
        return current

    def run(
        self,
        *args: str,
        home: str | os.PathLike[str],
        stdin: Any = subprocess.DEVNULL,
        input: str | None = None,
        timeout: float = 60,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run this world's ``brev`` with a private ``HOME``: stdin from /dev/null, or a pipe holding ``input``;
        ``env`` adds variables."""
        return subprocess.run(
            [self.brev, *args],
            env={**self.env(home), **(env or {})},
            stdin=None if input is not None else stdin,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def login(self, home: str | os.PathLike[str]) -> None:
        """``brev login --token`` in ``home`` (for tests of the fake; the provider logs in by itself)."""
        done = self.run("login", "--token", self.token, home=home)
        assert done.returncode == 0, done.stderr


def _find(state: dict[str, Any], name: str) -> dict[str, Any]:
    found = [i for i in state["instances"].values() if name in (i["name"], i["id"])]
    if len(found) != 1:
        raise KeyError(f"{len(found)} instances named {name!r}")
    return found[0]
