"""The connection's ``brev`` session and what every part of the hook asks through it: settings, one exec on an instance,
the scan of what runs where."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import Any

from airflow_provider_tao.hooks.base import JobValidationError, TAOPlatformHook
from airflow_provider_tao.hooks.brev import lease as leases
from airflow_provider_tao.hooks.brev import remote
from airflow_provider_tao.hooks.brev.cli import BrevError, BrevSession
from airflow_provider_tao.hooks.shared.secrets import register_secrets
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobStatus

#: An instance's page in the Brev console (the connection's ``console_url`` overrides it).
DEFAULT_CONSOLE_URL = "https://brev.nvidia.com/environment/{id}"
DEFAULT_REGISTRY = "nvcr.io"
#: One status probe (every watched job of one instance) and one small remote call (a mark, a stop, a log read).
PROBE_TIMEOUT = 30.0
CALL_TIMEOUT = 60.0
#: Parallel probes of the instances of one poll.
PROBE_WORKERS = 8
EXEC_STATES = ("RUNNING", "UNHEALTHY")  # states in which a probe may answer (never exec a stopped instance: it starts)


class BrevSessionHook(TAOPlatformHook):
    """The settings and the ``brev`` CLI session of a ``tao_brev`` connection."""

    def __init__(self, conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(conn_id, **kwargs)
        self._lock = threading.Lock()
        self._ended: dict[str, JobStatus] = {}  # job id -> its final status (an ended container is final)
        self._log_cursors: dict[str, str] = {}  # job id -> the cursor its last log read returned
        self._prefetched: dict[str, tuple[str, bytes]] = {}  # job id -> (cursor, log bytes read by a probe)
        self._live: set[str] = set()  # jobs the last probe found not ended
        self._leases: dict[str, dict[str, Any] | None] = {}  # instance -> its lease, as the last scan read it

    def _number(self, name: str, default: float) -> float:
        self.load_connection()
        value = self.setting(name, default)
        try:
            return float(value)
        except (TypeError, ValueError) as exc:
            raise JobValidationError(name, f"{value!r} is not a number", f"Set {name} to seconds or hours") from exc

    @property
    def org(self) -> str | None:
        self.load_connection()
        org = self.setting("org")
        return str(org) if org else None

    @property
    def registry(self) -> str:
        self.load_connection()
        return str(self.setting("registry", DEFAULT_REGISTRY)).rstrip("/")

    @cached_property
    def session(self) -> BrevSession:
        """The connection's ``brev`` session (private HOME, credentials written by it, one re-login)."""
        self.load_connection()
        token = self.setting("password")
        if not token:
            raise BrevError(
                ErrClass.ERR_AUTH,
                "no Brev API token: put it in the password of the tao_brev connection (or set BREV_API_TOKEN)",
            )
        register_secrets([str(token)])
        return BrevSession(
            executable=str(self.setting("brev_path", "brev")),
            token=str(token),
            org=self.org,
            org_id=str(self.setting("org_id") or "") or None,
            identity=self.conn_id or "",
            cloudflared=str(self.setting("cloudflared_path") or "") or None,
            log=self.log,
        )

    def _console_url(self, entry: Mapping[str, Any] | None) -> str:
        """The instance's page in the Brev console: the connection's ``console_url`` with ``{id}`` and ``{name}``
        filled in from ``brev ls`` (kept in the job's handle: the TAO job link needs no call)."""
        from urllib.parse import quote

        self.load_connection()
        template = str(self.setting("console_url", DEFAULT_CONSOLE_URL))
        if not entry or not entry.get("id"):
            return ""
        return template.replace("{id}", quote(str(entry["id"]), safe="")).replace(
            "{name}", quote(str(entry.get("name") or ""), safe="")
        )

    def _handle_of(self, instance: str, entry: Mapping[str, Any], found: remote.FoundContainer) -> JobHandle:
        """The handle of a job found on an instance (by its container's labels)."""
        return JobHandle(
            platform=self.platform,
            conn_id=self.conn_id,
            job_id=found.job_id,
            name=found.name,
            backend_job_id=instance,
            results_dir=found.results_dir,
            try_number=found.try_number,
            submitted_at=found.created_at or time.time(),
            console_url=self._console_url(entry),
        )

    def _scan(self, instance: str) -> leases.Scan:
        """One exec: the instance's lease and this provider's containers still running on it; the error text when
        it did not answer."""
        try:
            answer = self._call(instance, remote.active(), PROBE_TIMEOUT)
        except BrevError as exc:
            if exc.err_class is ErrClass.ERR_AUTH:
                raise
            return str(exc)
        return "did not answer brev exec" if answer is None else remote.parse_active(answer)

    def _scan_all(self, instances: Mapping[str, Mapping[str, Any]]) -> dict[str, leases.Scan]:
        """:meth:`_scan` of every instance that may be exec'd (never a stopped one: exec would start it)."""
        readable = sorted(name for name, entry in instances.items() if entry.get("status") in EXEC_STATES)
        if not readable:
            return {}
        with ThreadPoolExecutor(max_workers=min(PROBE_WORKERS, len(readable))) as pool:
            scans = dict(zip(readable, pool.map(self._scan, readable), strict=True))
        with self._lock:
            self._leases.update({name: scan[0] for name, scan in scans.items() if not isinstance(scan, str)})
        return scans

    def _call(self, instance: str, call: remote.Script, timeout: float = CALL_TIMEOUT) -> bytes | None:
        return call.answer(self.session.exec(instance, call.command, timeout))
