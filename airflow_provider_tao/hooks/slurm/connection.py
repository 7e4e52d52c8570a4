"""A ``tao_slurm`` connection: its settings, the job layout under its results root, and its SSH sessions (one pooled
session per login host and worker, shared by the triggerer's pollers)."""

from __future__ import annotations

from typing import Any

from airflow_provider_tao.hooks.base import ConnectionProblem, JobValidationError, TAOPlatformHook
from airflow_provider_tao.hooks.slurm import script as ss
from airflow_provider_tao.hooks.slurm.ssh import AsyncPool, Result, SlurmTransportError, SSHSettings, SyncSession
from airflow_provider_tao.jobs import JobSpec


def ssh_problem(exc: SlurmTransportError) -> ConnectionProblem:
    """The words for a failed SSH connection: refused credentials, a host key that does not match, or no answer."""
    import paramiko

    causes = exc.causes or [("", exc)]
    for host, cause in causes:
        if isinstance(cause, paramiko.BadHostKeyException) or "host key" in str(cause).lower():
            return ConnectionProblem(
                "auth",
                f"{host}'s host key does not match the connection's Host key ({cause}); check the key with "
                "ssh-keyscan and update the connection",
            )
    for host, cause in causes:
        if isinstance(cause, paramiko.AuthenticationException):
            return ConnectionProblem(
                "auth", f"{host} refused the credentials ({cause}); check the user, key file / private key or password"
            )
    hosts = "; ".join(f"{host}: {cause}" for host, cause in causes)
    return ConnectionProblem("unreachable", f"no login host answered on SSH ({hosts}); check host, port and network")


def truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


class SlurmConnectionHook(TAOPlatformHook):
    """The settings and SSH sessions of a ``tao_slurm`` connection."""

    def __init__(self, conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(conn_id=conn_id, **kwargs)
        self._session: SyncSession | None = None
        self._held: Any = None  # the AsyncPool entry this hook holds (released by aclose)
        self._preflights: dict[str, dict[str, Any]] = {}

    def setting(self, name: str, default: Any = None) -> Any:
        if self._extras is None:  # worker side: read the connection on first use (the triggerer awaits it first)
            self.load_connection()
        return super().setting(name, default)

    def ssh_settings(self) -> SSHSettings:
        hosts = tuple(h.strip() for h in str(self.setting("host", "")).split(",") if h.strip())
        if not hosts:
            raise JobValidationError("host", "no login host configured", "Set the connection host or SLURM_HOSTNAME")
        user = self.setting("login")
        if not user:
            raise JobValidationError("login", "no login user configured", "Set the connection login or SLURM_USER")
        host_key, no_check = self.setting("host_key"), truthy(self.setting("no_host_key_check", False))
        if host_key and no_check:
            raise JobValidationError(
                "host_key", "is set together with no_host_key_check", "Remove one of them (checking is the default)"
            )
        return SSHSettings(
            hosts=hosts,
            port=int(self.setting("port", 22)),
            username=str(user),
            key_file=self.setting("key_file"),
            private_key=self.setting("private_key"),
            passphrase=self.setting("private_key_passphrase"),
            password=self.setting("password"),
            host_key=host_key,
            no_host_key_check=no_check,
        )

    @property
    def results_root(self) -> str:
        root = str(self.setting("results_root", "")).rstrip("/")
        root = ss.cluster_path(root) or root
        if not root or not ss.SAFE_PATH.match(root):
            raise JobValidationError(
                "results_root",
                f"{root!r} is not an absolute cluster path of plain characters" if root else "is not set",
                "Set the connection extra results_root (or SLURM_BASE_RESULTS_DIR) to a shared-filesystem folder",
            )
        return root

    def layout(self, job_id: str, name: str) -> ss.JobLayout:
        return ss.JobLayout(self.results_root, job_id, name)

    def _detail(self, spec: JobSpec, name: str, default: Any = None) -> Any:
        value = spec.backend_details.get(name)
        return self.setting(name, default) if value in (None, "") else value

    def _pool_key(self) -> str:
        return self.conn_id or f"env:{self.ssh_settings().fingerprint}"

    def session(self) -> SyncSession:
        """The worker-side SSH connection, opened on first use and reused by every later call of this hook."""
        self.load_connection()
        if self._session is None:
            self._session = SyncSession(self.ssh_settings())
        return self._session

    def run(self, command: str, stdin: bytes | None = None, timeout: float = 300.0) -> Result:
        return self.session().run(command, stdin=stdin, timeout=timeout)

    async def _entry(self) -> Any:
        await self.aload_connection()
        entry = AsyncPool.entry(self._pool_key(), self.ssh_settings())
        if self._held is not entry:  # each hook holds this loop's connection once, until its aclose()
            entry.holders += 1
            self._held = entry
        return entry

    def close(self) -> None:
        if self._session is not None:
            self._session.close()

    async def aclose(self) -> None:
        """Let go of this event loop's SSH connection; the last hook holding it closes it."""
        entry, self._held = self._held, None
        if entry is not None:
            AsyncPool.release(entry)
