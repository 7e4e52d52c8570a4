"""How replicas run: :class:`DockerRuntime` makes each replica a REAL container on the test Docker engine;
:class:`SimRuntime` (benchmarks) lets each one "run" for a set time and print a line a second.

Docker containers join one user network, ``leptonfake``, whose embedded DNS answers the network aliases the
controller gives each replica (``<worker prefix>-<i>.<subdomain>`` ...), as the platform's cluster DNS answers a
job's headless service. Nothing is ever pulled: an image missing from the engine is an image pull failure. Every
container and the network carry the label ``leptonfake=1``; containers also carry the server's instance id, and a
server removes only its own.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol


@dataclass
class Launch:
    """Everything one replica's container gets."""

    rid: str
    job_id: str
    image: str
    command: list[str] | None
    env: dict[str, str]
    binds: list[tuple[str, str, bool]] = field(default_factory=list)  # host path, container path, read-only
    shm_bytes: int | None = None
    mem_bytes: int | None = None
    gpus: int = 0
    hostname: str = ""
    aliases: list[str] = field(default_factory=list)


class StartFailure(Exception):
    """The runtime refused to start the container (the message is the runtime's own)."""


class Runtime(Protocol):
    def has_image(self, image: str) -> bool: ...
    def start(self, launch: Launch) -> str: ...
    def poll(self) -> dict[str, dict[str, Any]]: ...
    def stop(self, rid: str, grace: float) -> None: ...
    def logs(self, rid: str) -> list[tuple[int, str]]: ...
    def follow(self, rid: str) -> Iterator[bytes]: ...
    def remove(self, rid: str) -> None: ...
    def containers(self) -> list[dict[str, Any]]: ...
    def network(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


def rfc3339_ns(text: str) -> int:
    """``2026-01-02T03:04:05.123456789Z`` -> nanoseconds since the epoch."""
    whole, _, frac = text.rstrip("Z").partition(".")
    seconds = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()
    return int(seconds) * 1_000_000_000 + int((frac + "000000000")[:9])


def split_stamped(raw: bytes) -> list[tuple[int, str]]:
    """Docker's ``timestamps=True`` log text -> ``[(ns, line)]``."""
    lines = []
    for row in raw.decode(errors="replace").splitlines():
        stamp, _, text = row.partition(" ")
        try:
            lines.append((rfc3339_ns(stamp), text))
        except ValueError:
            continue
    return lines


class DockerRuntime:
    """Replicas as containers on one Docker engine."""

    NETWORK = "leptonfake"

    def __init__(self, base_url: str, server_id: str) -> None:
        import docker

        self.client = docker.APIClient(base_url=base_url, version="auto", timeout=120)
        self.server_id = server_id
        self._lock = threading.Lock()
        self._ids: dict[str, str] = {}  # rid -> container id
        self._ended: dict[str, dict[str, Any]] = {}
        self._remove_orphans()
        self._ensure_network()

    def _remove_orphans(self) -> None:
        """Containers of a fake on this machine that died without cleaning up (SIGKILL): its pid is gone."""
        for listed in self.client.containers(all=True, filters={"label": "leptonfake=1"}):
            labels = listed.get("Labels") or {}
            pid, host = labels.get("leptonfake.pid", ""), labels.get("leptonfake.host", "")
            if host == socket.gethostname() and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                with contextlib.suppress(Exception):
                    self.client.remove_container(listed["Id"], force=True, v=True)

    def _ensure_network(self) -> None:
        # Docker allows several networks of one name (then none can be used by name): create it only when missing.
        if not [n for n in self.client.networks(names=[self.NETWORK]) if n["Name"] == self.NETWORK]:
            with contextlib.suppress(Exception):  # another fake created it meanwhile
                # internal: no route out, so a job provably fetches nothing from the network; the host stays
                # reachable on the bridge's gateway address (services that listen there)
                self.client.create_network(self.NETWORK, driver="bridge", internal=True, labels={"leptonfake": "1"})

    def network(self) -> dict[str, Any]:
        found = [n for n in self.client.networks(names=[self.NETWORK]) if n["Name"] == self.NETWORK]
        if not found:
            return {}
        config = (found[0].get("IPAM") or {}).get("Config") or [{}]
        return {
            "name": self.NETWORK,
            "internal": bool(found[0].get("Internal")),
            "subnet": config[0].get("Subnet"),
            "gateway": config[0].get("Gateway"),
        }

    def has_image(self, image: str) -> bool:
        import docker

        try:
            self.client.inspect_image(image)
            return True
        except docker.errors.ImageNotFound:
            return False

    def start(self, launch: Launch) -> str:
        import docker
        from docker.types import DeviceRequest

        host: dict[str, Any] = {
            "binds": [f"{src}:{dst}:{'ro' if ro else 'rw'}" for src, dst, ro in launch.binds],
            "network_mode": self.NETWORK,
            # no init process: the command is PID 1, as in a pod (signals, zombies and exec errors as there)
        }
        if launch.shm_bytes:
            host["shm_size"] = launch.shm_bytes
        if launch.mem_bytes:
            host["mem_limit"] = host["memswap_limit"] = launch.mem_bytes
        if launch.gpus:
            # the engine's (stub) NVIDIA hook serves device requests as on a GPU node
            host["device_requests"] = [DeviceRequest(count=launch.gpus, capabilities=[["gpu"]])]
        networking = self.client.create_networking_config(
            {self.NETWORK: self.client.create_endpoint_config(aliases=launch.aliases)}
        )
        created = self.client.create_container(
            image=launch.image,
            entrypoint=launch.command,
            environment=launch.env,
            hostname=launch.hostname[:63] or None,
            name=f"leptonfake-{launch.rid}",
            labels={
                "leptonfake": "1",
                "leptonfake.server": self.server_id,
                "leptonfake.pid": str(os.getpid()),
                "leptonfake.host": socket.gethostname(),
                "leptonfake.job": launch.job_id,
                "leptonfake.replica": launch.rid,
            },
            host_config=self.client.create_host_config(**host),
            networking_config=networking,
        )
        with self._lock:
            self._ids[launch.rid] = created["Id"]
        try:
            self.client.start(created["Id"])
        except docker.errors.APIError as exc:
            raise StartFailure(str(exc.explanation or exc)) from exc
        return str(created["Id"])

    def poll(self) -> dict[str, dict[str, Any]]:
        """One list call while a container may still run; an inspect only for one that has just ended."""
        if not set(self._ids) - set(self._ended):
            return dict(self._ended)
        found: dict[str, dict[str, Any]] = {}
        for listed in self.client.containers(all=True, filters={"label": f"leptonfake.server={self.server_id}"}):
            rid = listed["Labels"].get("leptonfake.replica", "")
            if listed["State"] in ("running", "created", "restarting"):
                found[rid] = {"running": True}
                continue
            if rid not in self._ended:
                state = self.client.inspect_container(listed["Id"])["State"]
                self._ended[rid] = {
                    "running": False,
                    "exit_code": int(state.get("ExitCode") or 0),
                    "oom": bool(state.get("OOMKilled")),
                    "error": state.get("Error") or "",
                }
            found[rid] = self._ended[rid]
        return found

    def stop(self, rid: str, grace: float) -> None:
        if (cid := self._ids.get(rid)) is not None:
            with contextlib.suppress(Exception):
                self.client.stop(cid, timeout=max(int(grace), 0))

    def logs(self, rid: str) -> list[tuple[int, str]]:
        if (cid := self._ids.get(rid)) is None:
            return []
        try:
            return split_stamped(bytes(self.client.logs(cid, stdout=True, stderr=True, timestamps=True)))
        except Exception:
            return []

    def follow(self, rid: str) -> Iterator[bytes]:
        if (cid := self._ids.get(rid)) is None:
            return iter(())
        return iter(self.client.logs(cid, stdout=True, stderr=True, stream=True, follow=True))

    def remove(self, rid: str) -> None:
        with self._lock:
            cid = self._ids.pop(rid, None)
        if cid is not None:
            with contextlib.suppress(Exception):
                self.client.remove_container(cid, force=True, v=True)
        self._ended.pop(rid, None)

    def containers(self) -> list[dict[str, Any]]:
        listed = self.client.containers(all=True, filters={"label": f"leptonfake.server={self.server_id}"})
        return [
            {
                "id": c["Id"],
                "name": c["Names"][0].lstrip("/") if c.get("Names") else "",
                "job": c["Labels"].get("leptonfake.job"),
                "replica": c["Labels"].get("leptonfake.replica"),
                "state": c["State"],
                "status": c.get("Status", ""),
            }
            for c in listed
        ]

    def close(self) -> None:
        for listed in self.client.containers(all=True, filters={"label": f"leptonfake.server={self.server_id}"}):
            with contextlib.suppress(Exception):
                self.client.remove_container(listed["Id"], force=True, v=True)
        # The network stays: every fake on the engine shares it, and a fake of another lane (tests/lanes.py) may be
        # between its check that the network exists and its next container's create (removing it when unused
        # here raced that create). One idle bridge network is all that is left behind.


class SimRuntime:
    """Replicas that "run" for ``seconds`` and print ``step N`` once a second; no containers. The clock is the
    Kubernetes fake's simulated runtime, keyed here by replica id."""

    def __init__(self, seconds: float) -> None:
        from tests.kubefake.cluster import SimRuntime as SimulatedPods

        self.pods = SimulatedPods(seconds)

    def has_image(self, image: str) -> bool:
        return True

    def start(self, launch: Launch) -> str:
        self.pods.start({"metadata": {"uid": launch.rid}}, launch.env, {})
        return f"sim-{launch.rid}"

    def poll(self) -> dict[str, dict[str, Any]]:
        return {
            rid: {"running": state["running"], "exit_code": state.get("exitCode", 0), "oom": False, "error": ""}
            for rid, state in self.pods.states().items()
        }

    def stop(self, rid: str, grace: float) -> None:
        if rid in self.pods.started:
            self.pods.stop(rid, int(grace))

    def logs(self, rid: str) -> list[tuple[int, str]]:
        return split_stamped(self.pods.logs(rid, {"timestamps": "true"}))  # the kubelet's options: stamped lines

    def follow(self, rid: str) -> Iterator[bytes]:
        sent = 0
        while rid in self.pods.started:
            lines = self.logs(rid)
            for _, text in lines[sent:]:
                yield (text + "\n").encode()
            sent = len(lines)
            if not self.poll().get(rid, {}).get("running"):
                return
            time.sleep(0.5)

    def remove(self, rid: str) -> None:
        self.pods.remove(rid)

    def containers(self) -> list[dict[str, Any]]:
        states = self.poll()
        return [
            {"id": f"sim-{rid}", "name": rid, "replica": rid, "state": "running" if s["running"] else "exited"}
            for rid, s in states.items()
        ]

    def network(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        self.pods.remove_all()


def workdir_for(pid: int | None = None) -> str:
    return os.path.join(os.environ.get("TMPDIR", "/tmp"), f"leptonfake-{pid or os.getpid()}")
