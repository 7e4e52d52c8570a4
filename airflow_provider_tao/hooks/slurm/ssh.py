"""SSH transport of the SLURM platform: one connection per submission (worker), one per connection per event loop
(triggerer).

* Worker side: :class:`SyncSession` opens ONE paramiko connection through the ssh provider's ``SSHHook`` (login
  hosts tried in order, host key checked unless explicitly disabled, ``TCP_NODELAY`` set) and runs every command of
  a submission -- preflight, staging, sbatch -- as channels of that connection.
* Triggerer side: :class:`AsyncPool` keeps ONE asyncssh connection per (event loop, connection) at module level,
  shared by every trigger, poll, log read and resubmission of that connection. A dropped connection is reopened on
  the next call, with a short exponential backoff between failed attempts (no call ever sleeps: a call during
  the backoff window fails at once, and the poller reports Unknown and backs off by itself). Concurrent
  channels are capped (sshd ``MaxSessions``).

Commands never carry environment values; data (staged files, log requests, mark values) travels on stdin.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

#: Process-wide counters (benchmarks and tests read them).
STATS: dict[str, int] = {"sync_connects": 0, "sync_commands": 0, "async_connects": 0, "async_commands": 0}
CONNECT_TIMEOUT = 15.0
MAX_CHANNELS = 8
#: A failed connect makes calls of the next moments fail at once (no herd of connects), but never for long: the
#: status poller backs off by itself, and a long window here would only delay noticing that the login node is back.
MAX_RECONNECT_BACKOFF = 2.0


class SlurmTransportError(ConnectionError):
    """The login node could not be reached or the connection broke (never a job failure by itself).

    :param message: what failed.
    :param causes: ``(host, exception)`` of each login host tried, for callers that explain the failure.
    """

    def __init__(self, message: str, causes: Sequence[tuple[str, BaseException]] = ()) -> None:
        super().__init__(message)
        self.causes = list(causes)


@dataclass(frozen=True)
class SSHSettings:
    """How to reach the login node(s)."""

    hosts: tuple[str, ...]
    port: int
    username: str
    key_file: str | None = None
    private_key: str | None = field(default=None, repr=False)
    passphrase: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    host_key: str | None = None  # "ssh-ed25519 AAAA..." trusted for every listed host
    no_host_key_check: bool = False

    @property
    def fingerprint(self) -> str:
        return f"{self.username}@{','.join(self.hosts)}:{self.port}"


@dataclass(frozen=True)
class Result:
    rc: int
    out: bytes
    err: bytes

    @property
    def text(self) -> str:
        return self.out.decode(errors="replace")

    @property
    def err_text(self) -> str:
        return self.err.decode(errors="replace").strip()


# ----------------------------------------------------------------------------- worker side (paramiko / SSHHook)


class SyncSession:
    """One paramiko connection (through ``SSHHook``) for everything a submission or a worker-side call needs."""

    def __init__(self, settings: SSHSettings) -> None:
        self.settings = settings
        self._client: Any = None
        self.host: str | None = None
        self.connects = 0
        self.commands = 0

    def _connect(self) -> Any:
        from airflow.providers.ssh.hooks.ssh import SSHHook

        errors: list[tuple[str, BaseException]] = []
        for host in self.settings.hosts:
            hook = SSHHook(
                remote_host=host,
                username=self.settings.username,
                password=self.settings.password,
                key_file=self.settings.key_file,
                port=self.settings.port,
                conn_timeout=int(CONNECT_TIMEOUT),
                cmd_timeout=None,
                conn_retry_attempts=1,
                no_host_key_check=self.settings.no_host_key_check,
                keepalive_interval=30,
            )
            hook.compress = False  # loopback / LAN: compression only costs CPU
            if self.settings.private_key:
                hook.pkey = hook._pkey_from_private_key(self.settings.private_key, self.settings.passphrase)
            if self.settings.key_file or self.settings.private_key:
                hook.look_for_keys = False  # use exactly the configured key
            if self.settings.host_key:
                hook.host_key = _paramiko_host_key(self.settings.host_key)
            try:
                client = hook.get_conn()
            except Exception as exc:  # try the next login host
                errors.append((host, exc))
                continue
            transport = client.get_transport()
            transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.host = host
            self.connects += 1
            STATS["sync_connects"] += 1
            return client
        raise SlurmTransportError(
            f"cannot reach any login host: {'; '.join(f'{host}: {exc}' for host, exc in errors)}", errors
        )

    def client(self) -> Any:
        if self._client is not None:
            transport = self._client.get_transport()
            if transport is not None and transport.is_active():
                return self._client
            self.close()
        self._client = self._connect()
        return self._client

    def run(self, command: str, stdin: bytes | None = None, timeout: float = 300.0) -> Result:
        """Run ``command`` in the login shell; ``stdin`` is sent and closed. Transport failures raise
        :class:`SlurmTransportError`; a non-zero exit status is returned, not raised."""
        try:
            channel = self.client().get_transport().open_session(timeout=CONNECT_TIMEOUT)
        except SlurmTransportError:
            raise
        except Exception as exc:
            self.close()
            raise SlurmTransportError(f"cannot open a channel to {self.host}: {exc}") from exc
        self.commands += 1
        STATS["sync_commands"] += 1
        try:
            channel.settimeout(timeout)
            channel.exec_command(command)
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
            out = bytearray()
            while chunk := channel.recv(65536):
                out += chunk
            err = bytearray()
            while chunk := channel.recv_stderr(65536):
                err += chunk
            rc = channel.recv_exit_status()
        except Exception as exc:
            self.close()
            raise SlurmTransportError(f"command on {self.host} failed: {exc}") from exc
        finally:
            channel.close()
        return Result(rc, bytes(out), bytes(err))

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None


def _paramiko_host_key(text: str) -> Any:
    import base64

    import paramiko
    from airflow.providers.ssh.hooks.ssh import SSHHook

    parts = text.strip().split()
    key_type, data = (parts[0], parts[1]) if len(parts) >= 2 else ("ssh-rsa", parts[0])
    key_class = SSHHook._host_key_mappings.get(key_type)
    if key_class is None:
        raise ValueError(f"unsupported host key type {key_type!r}")
    key: paramiko.PKey = key_class(data=base64.b64decode(data))
    return key


# ----------------------------------------------------------------------------- triggerer side (asyncssh)


class _Entry:
    """One cached asyncssh connection and what the SLURM hook keeps per connection in this event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, settings: SSHSettings) -> None:
        self.loop_ref = weakref.ref(loop)
        self.settings = settings
        self.conn: Any = None
        self.lock = asyncio.Lock()
        self.channels = asyncio.Semaphore(MAX_CHANNELS)
        self.failures = 0
        self.retry_at = 0.0
        self.last_error = ""
        self.connects = 0
        self.commands = 0
        # Per-job state of the status poller and log reader (see SlurmHook.aget_job_statuses / aget_job_logs).
        self.states: dict[str, Any] = {}
        self.log_offsets: dict[str, int] = {}
        # job -> (offset read from, text or None once drained, offset after it, final)
        self.log_cache: dict[str, tuple[int, str | None, int, bool]] = {}
        self.terminal_seen: dict[str, float] = {}
        self.seen: dict[str, int] = {}
        self.polls = 0
        self.pending_reads: list[tuple[Any, Any]] = []
        self.read_task: asyncio.Task[None] | None = None
        self.holders = 0  # hooks using this entry (see SlurmHook._entry / aclose)

    async def _connection(self) -> Any:
        if self.conn is not None and not self.conn.is_closed():
            return self.conn
        async with self.lock:
            if self.conn is not None and not self.conn.is_closed():
                return self.conn
            now = time.monotonic()
            if now < self.retry_at:
                raise SlurmTransportError(
                    f"not reconnecting for another {self.retry_at - now:.1f} s (last error: {self.last_error})"
                )
            try:
                self.conn = await self._connect()
            except Exception as exc:
                self.failures += 1
                delay = min(MAX_RECONNECT_BACKOFF, 0.25 * 2**self.failures) * random.uniform(0.8, 1.2)
                self.retry_at = time.monotonic() + delay
                self.last_error = str(exc) or type(exc).__name__
                raise SlurmTransportError(f"cannot reach the login node: {self.last_error}") from exc
            self.failures = 0
            self.connects += 1
            STATS["async_connects"] += 1
            return self.conn

    async def _connect(self) -> Any:
        import logging

        import asyncssh

        logging.getLogger("asyncssh").setLevel(logging.WARNING)  # one INFO line per channel otherwise

        s = self.settings
        options: dict[str, Any] = {
            "port": s.port,
            "username": s.username,
            "connect_timeout": CONNECT_TIMEOUT,
            "keepalive_interval": 30,
            "keepalive_count_max": 3,
        }
        if s.no_host_key_check:
            options["known_hosts"] = None
        elif s.host_key:
            options["known_hosts"] = ([asyncssh.import_public_key(s.host_key)], [], [])
        if s.private_key:
            options["client_keys"] = [asyncssh.import_private_key(s.private_key, s.passphrase)]
        elif s.key_file:
            options["client_keys"] = [s.key_file]
            if s.passphrase:
                options["passphrase"] = s.passphrase
        if s.password:
            options["password"] = s.password
        errors = []
        for host in s.hosts:
            try:
                return await asyncssh.connect(host, **options)
            except (TimeoutError, OSError, asyncssh.Error) as exc:
                errors.append(f"{host}: {exc}")
        raise SlurmTransportError("; ".join(errors))

    async def run(self, command: str, stdin: bytes | None = None, timeout: float = 60.0) -> Result:
        import asyncssh

        conn = await self._connection()
        async with self.channels:
            self.commands += 1
            STATS["async_commands"] += 1
            try:
                result = await asyncio.wait_for(
                    conn.run(command, input=stdin, encoding=None, check=False), timeout=timeout
                )
            except (TimeoutError, OSError, asyncssh.Error) as exc:
                self.drop(conn)
                raise SlurmTransportError(f"command failed on the login node: {exc or type(exc).__name__}") from exc
        rc = result.exit_status if result.exit_status is not None else 255
        return Result(rc, result.stdout or b"", result.stderr or b"")

    def drop(self, conn: Any = None) -> None:
        """Forget the connection (it broke); the next call reconnects."""
        if conn is None or conn is self.conn:
            if self.conn is not None:
                self.conn.close()
            self.conn = None


class AsyncPool:
    """Module-level cache: one :class:`_Entry` per (event loop, connection)."""

    _entries: ClassVar[dict[tuple[int, str], _Entry]] = {}

    @classmethod
    def entry(cls, key: str, settings: SSHSettings) -> _Entry:
        loop = asyncio.get_running_loop()
        entry = cls._entries.get((id(loop), key))
        if entry is None or entry.loop_ref() is not loop:
            for stale_key, stale in list(cls._entries.items()):
                if stale.loop_ref() is None or stale.loop_ref().is_closed():  # type: ignore[union-attr]
                    del cls._entries[stale_key]
            entry = cls._entries[(id(loop), key)] = _Entry(loop, settings)
        elif entry.settings != settings and entry.conn is None:
            entry.settings = settings
        return entry

    @classmethod
    def release(cls, entry: _Entry) -> None:
        """One holder of ``entry`` is done; the last one closes the connection and forgets the per-job state."""
        entry.holders -= 1
        if entry.holders > 0:
            return
        for key, cached in list(cls._entries.items()):
            if cached is entry:
                del cls._entries[key]
        entry.drop()

    @classmethod
    def drop_connections(cls) -> None:
        """Close every cached connection (as a network outage would); the next call reconnects."""
        for entry in cls._entries.values():
            entry.drop()

    @classmethod
    def clear(cls) -> None:
        cls.drop_connections()
        cls._entries.clear()
