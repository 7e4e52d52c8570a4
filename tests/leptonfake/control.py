"""Starting the fake Lepton server from tests and benchmarks, and asking it things directly (never through our
hook): :func:`start_server` and :class:`LeptonFake`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fakeserver import stop_process

REPO_ROOT = Path(__file__).resolve().parents[2]


class FakeDidNotStart(RuntimeError):
    """The server process exited or did not answer in time (its log is in the message)."""


@dataclass(frozen=True)
class LeptonFake:
    """A running fake: where it is, and what the tests ask it directly."""

    url: str
    workspace_url: str
    token: str
    workspace_id: str
    workdir: Path
    log: Path

    def _fake(self, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}/fake/{path}",
            data=data,
            method="POST" if data is not None else "GET",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    # ------------------------------------------------------------------ records

    def jobs(self, label: str | None = None) -> list[dict[str, Any]]:
        """Every job ever created (with ``label``, ``key=value``: those labelled so): the exact body received, state
        history, replicas and their container ids."""
        return list(self._fake(f"jobs?{urllib.parse.urlencode({'label': label})}" if label else "jobs"))

    def job_named(self, name: str) -> list[dict[str, Any]]:
        """The records of the jobs whose metadata.name (or id) is ``name``, oldest first."""
        return [j for j in self.jobs() if name in (j["name"], j["id"])]

    def secrets(self, values: bool = True) -> dict[str, Any]:
        """Secret names AND values (user secrets, image pull secrets, and every value ever stored, with the job
        specs it occurs in); ``values=False``: the names ever stored only (``ever``: ``{kind, name}``), cheap."""
        return dict(self._fake("secrets" if values else "secrets?ever=names"))

    def containers(self) -> list[dict[str, Any]]:
        """The replica containers this server started, alive or not."""
        return list(self._fake("containers"))

    def requests(self) -> list[str]:
        """Recent workspace requests, ``METHOD path -> status`` (no bodies)."""
        return list(self._fake("requests"))

    def stats(self, reset: bool = False) -> dict[str, Any]:
        """``{"total": N, "by": {"GET /jobs": n, ...}}``: requests by method and route template."""
        return dict(self._fake("stats", {} if reset else None))

    def volumes(self) -> dict[str, Path]:
        """Node-group volume name -> the host folder behind it (the volume's root, i.e. its from_path)."""
        return {name: Path(path) for name, path in self._fake("volumes").items()}

    def network(self) -> dict[str, Any]:
        """The replicas' Docker network: ``{"name", "internal", "subnet", "gateway"}`` (the host, from a replica)."""
        return dict(self._fake("network"))

    # ------------------------------------------------------------------ steering

    def faults(self, status: int | str = 503, seconds: float = 60, route: str = "", **extra: Any) -> None:
        """Fail matching workspace requests for a while (``status`` 503 / 500 / 429 / "timeout")."""
        self._fake("faults", {"status": status, "seconds": seconds, "route": route, **extra})

    def clear_faults(self) -> None:
        self._fake("faults", {"clear": True})

    def inject(self, kind: str, **match_and_options: Any) -> dict[str, Any]:
        """Plant a failure (oom, image_pull, no_capacity, evict, preempt, unhealthy_node, exit; unready: a running
        replica not ready for ``seconds``) in the jobs that match ``id`` / ``name`` / ``name_prefix`` / ``labels``,
        now and (``times``, default 1) to come."""
        return dict(self._fake("inject", {"kind": kind, **match_and_options}))

    def clear_injections(self) -> None:
        self._fake("inject", {"clear": True})

    def capacity(self, **free_gpus: int | None) -> dict[str, Any]:
        """Set (node group name -> GPUs; ``shared`` for the shared pool) and/or read the GPU capacity."""
        body = {("" if k == "shared" else k.replace("_", "-")): v for k, v in free_gpus.items()}
        return dict(self._fake("capacity", body if body else None))

    def config(self, world: dict[str, Any] | None = None, **settings: Any) -> dict[str, Any]:
        """Merge into the world and the settings (see tests.leptonfake.world); returns both."""
        body: dict[str, Any] = {}
        if world:
            body["world"] = world
        if settings:
            body["settings"] = settings
        return dict(self._fake("config", body if body else None))

    # ------------------------------------------------------------------ the real client

    def client(self, token: str | None = None) -> Any:
        """A real ``leptonai`` APIClient on this workspace (for direct checks)."""
        from leptonai.api.v2.client import APIClient

        return APIClient(self.workspace_id, token or self.token, self.workspace_url)

    def wait_state(self, job_id: str, *states: str, timeout: float = 60) -> dict[str, Any]:
        """Wait until the job (by id, through /fake/jobs) is in one of ``states``; returns its record."""
        deadline = time.monotonic() + timeout
        record: dict[str, Any] = {}
        while time.monotonic() < deadline:
            found = [j for j in self.jobs() if j["id"] == job_id]
            if found and (record := found[-1])["state"] in states:
                return record
            time.sleep(0.1)
        raise AssertionError(f"job {job_id} not in {states} after {timeout} s: {record.get('history')}")


def start_server(
    tmp: Path, *args: str, docker_host: str | None = None, timeout: float = 60
) -> tuple[subprocess.Popen[bytes], LeptonFake]:
    """Start ``python -m tests.leptonfake`` with ``args`` and wait for its ready file."""
    tmp.mkdir(parents=True, exist_ok=True)
    ready = tmp / "leptonfake.ready"
    ready.unlink(missing_ok=True)
    log = tmp / "leptonfake.log"
    argv = [sys.executable, "-m", "tests.leptonfake", "--ready-file", str(ready), *args]
    if docker_host:
        argv += ["--docker-host", docker_host]
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise FakeDidNotStart(f"the fake Lepton server did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
    info = json.loads(ready.read_text())
    fake = LeptonFake(
        url=info["url"],
        workspace_url=info["workspace_url"],
        token=info["token"],
        workspace_id=info["workspace_id"],
        workdir=Path(info["workdir"]),
        log=log,
    )
    return proc, fake


def stop_server(proc: subprocess.Popen[bytes], fake: LeptonFake) -> None:
    """Stop the server ``start_server`` started (its stacks in the error if it does not stop)."""
    stop_process(proc, fake.log, "the fake Lepton server")


@contextmanager
def running_server(tmp: Path, *args: str, docker_host: str | None = None) -> Iterator[LeptonFake]:
    """A fake for the length of a ``with`` block (benchmarks use it with ``--sim``)."""
    proc, fake = start_server(tmp, *args, docker_host=docker_host)
    try:
        yield fake
    finally:
        stop_server(proc, fake)
