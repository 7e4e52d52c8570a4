"""A small Docker Engine API client over a unix socket, standard library only.

The fake ``brev`` executable must start fast and run with any ``python3`` (no third-party package), so it cannot
use docker-py. It needs a handful of calls: containers (create, start, stop, kill, remove, inspect, list), exec
with streamed and demultiplexed output, and the archive endpoints ``brev copy`` is built on.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import struct
import urllib.parse
from collections.abc import Callable
from typing import Any

STDOUT, STDERR = 1, 2


class EngineError(Exception):
    """A non-2xx answer of the engine: ``status`` and the engine's ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._socket_path)
        self.sock = sock


def socket_path_of(host: str) -> str:
    """``unix:///path/docker.sock`` (or a bare path) -> the socket's path."""
    if host.startswith("unix://"):
        return host[len("unix://") :]
    if host.startswith("/"):
        return host
    raise ValueError(f"only unix:// engine hosts are supported, not {host!r}")


class Engine:
    """One engine, reached through its unix socket.

    :param host: ``unix:///path/to/docker.sock``.
    :param timeout: socket timeout of every call, seconds (``None`` = wait forever, for streamed execs).
    """

    def __init__(self, host: str, timeout: float | None = 120) -> None:
        self.socket_path = socket_path_of(host)
        self.timeout = timeout

    # ------------------------------------------------------------------------------------------------ plumbing
    def _open(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = -1.0,
    ) -> tuple[http.client.HTTPResponse, _UnixConnection]:
        if query:
            path = f"{path}?{urllib.parse.urlencode(query)}"
        sent_headers = dict(headers or {})
        if isinstance(body, dict | list):
            body = json.dumps(body).encode()
            sent_headers.setdefault("Content-Type", "application/json")
        conn = _UnixConnection(self.socket_path, self.timeout if timeout == -1.0 else timeout)
        conn.request(method, path, body=body, headers=sent_headers)
        return conn.getresponse(), conn

    def call(self, method: str, path: str, body: Any = None, *, ok: tuple[int, ...] = (), **request: Any) -> Any:
        """One request (``query``, ``headers`` as :meth:`_open` takes them); the decoded JSON answer (``None``
        when empty). Raises :class:`EngineError` on >= 400 unless the status is listed in ``ok``."""
        response, conn = self._open(method, path, body, **request)
        try:
            data = response.read()
        finally:
            conn.close()
        if response.status >= 400 and response.status not in ok:
            raise EngineError(response.status, _message_of(data))
        if not data or response.status in ok:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return data

    # ------------------------------------------------------------------------------------------------ containers
    def create(self, name: str, config: dict[str, Any]) -> str:
        return str(self.call("POST", "/containers/create", config, query={"name": name})["Id"])

    def start(self, name: str) -> None:
        self.call("POST", f"/containers/{name}/start", ok=(304,))

    def kill(self, name: str) -> None:
        """SIGKILL; a container that is not running is left as it is."""
        self.call("POST", f"/containers/{name}/kill", ok=(404, 409))

    def remove(self, name: str) -> None:
        """Remove (forced, with anonymous volumes); a missing container is fine."""
        self.call("DELETE", f"/containers/{name}", query={"force": "1", "v": "1"}, ok=(404, 409))

    def inspect(self, name: str) -> dict[str, Any] | None:
        found = self.call("GET", f"/containers/{name}/json", ok=(404,))
        return dict(found) if found else None

    def containers(self, *labels: str, all_states: bool = True) -> list[dict[str, Any]]:
        """Containers carrying every label given (``key`` or ``key=value``)."""
        query = {"all": "1" if all_states else "0", "filters": json.dumps({"label": list(labels)})}
        return list(self.call("GET", "/containers/json", query=query) or [])

    def image_exists(self, image: str) -> bool:
        return self.call("GET", f"/images/{image}/json", ok=(404,)) is not None

    # ------------------------------------------------------------------------------------------------ exec
    def exec_stream(
        self,
        name: str,
        argv: list[str],
        on_output: Callable[[int, bytes], None],
        *,
        user: str = "",
        workdir: str = "",
        env: list[str] | None = None,
    ) -> int:
        """Run ``argv`` in a running container, calling ``on_output(stream, chunk)`` as output arrives
        (stream 1 = stdout, 2 = stderr); the command's exit code."""
        spec: dict[str, Any] = {"AttachStdout": True, "AttachStderr": True, "Cmd": argv, "Env": env or []}
        if user:
            spec["User"] = user
        if workdir:
            spec["WorkingDir"] = workdir
        exec_id = self.call("POST", f"/containers/{name}/exec", spec)["Id"]
        response, conn = self._open("POST", f"/exec/{exec_id}/start", {"Detach": False, "Tty": False}, timeout=None)
        try:
            if response.status >= 400:
                raise EngineError(response.status, _message_of(response.read()))
            while True:
                header = _read_exactly(response, 8)
                if len(header) < 8:
                    break
                stream, size = header[0], struct.unpack(">I", header[4:])[0]
                on_output(stream, _read_exactly(response, size))
        finally:
            conn.close()
        return int(self.call("GET", f"/exec/{exec_id}/json")["ExitCode"])

    # ------------------------------------------------------------------------------------------------ archives
    def stat_path(self, name: str, path: str) -> dict[str, Any] | None:
        """``{name, size, mode, mtime, linkTarget}`` of a path in a container, ``None`` when it does not exist.
        ``mode`` is a Go ``os.FileMode`` (directories have bit 31 set)."""
        response, conn = self._open("HEAD", f"/containers/{name}/archive", query={"path": path})
        try:
            response.read()
        finally:
            conn.close()
        if response.status == 404:
            return None
        if response.status >= 400:
            raise EngineError(response.status, f"stat {path}")
        encoded = response.getheader("X-Docker-Container-Path-Stat") or ""
        return dict(json.loads(base64.b64decode(encoded))) if encoded else None

    def get_archive(self, name: str, path: str) -> bytes:
        """A tar of ``path`` (its top entry is the path's base name)."""
        response, conn = self._open("GET", f"/containers/{name}/archive", query={"path": path})
        try:
            data = response.read()
        finally:
            conn.close()
        if response.status >= 400:
            raise EngineError(response.status, _message_of(data))
        return data

    def put_archive(self, name: str, directory: str, tar: bytes) -> None:
        """Extract a tar into an existing directory of the container."""
        headers = {"Content-Type": "application/x-tar"}
        self.call("PUT", f"/containers/{name}/archive", tar, query={"path": directory}, headers=headers)


def is_directory_mode(mode: int) -> bool:
    """Whether a Go ``os.FileMode`` (as the archive stat reports it) is a directory."""
    return bool(mode & (1 << 31))


def _read_exactly(response: http.client.HTTPResponse, size: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = response.read(size)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _message_of(data: bytes) -> str:
    try:
        return str(json.loads(data).get("message", data.decode(errors="replace")))
    except (ValueError, AttributeError):
        return data.decode(errors="replace").strip()
