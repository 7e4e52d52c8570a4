"""A ``tao_docker`` connection: its settings, the docker provider's client for its daemon, and a daemon's refusals in
words and failure classes."""

from __future__ import annotations

import re
import threading
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow_provider_tao.hooks.base import (
    ConnectionProblem,
    TAOPlatformHook,
)
from airflow_provider_tao.jobs import ErrClass, JobStatus

if TYPE_CHECKING:
    from docker import APIClient


DEFAULT_SOCKET = "unix:///var/run/docker.sock"
DEFAULT_NETWORK = "tao_default"


def docker_problem(url: str, exc: Exception) -> ConnectionProblem:
    """The words for a daemon that did not answer the ping: no daemon there, a socket the user may not open,
    TLS or credentials refused by the daemon (or the proxy in front of it)."""
    from docker.errors import APIError

    text = str(exc)
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if not isinstance(exc, APIError) and (found := re.search(r"\b(401|403|407) Client Error", text)):
        status = int(found.group(1))  # docker's "Error while fetching server API version: 401 Client Error ..."
    if status in (401, 407):
        return ConnectionProblem("auth", f"the daemon at {url} refused the credentials ({status}): {text}")
    if status == 403:
        return ConnectionProblem("permission", f"the daemon at {url} does not allow this client ({status}): {text}")
    if "Permission denied" in text or isinstance(exc, PermissionError):
        return ConnectionProblem(
            "permission", f"cannot open {url}: permission denied (add the Airflow user to the docker group)"
        )
    if "SSL" in text or "certificate" in text.lower():
        return ConnectionProblem("auth", f"TLS with the daemon at {url} failed: {text}; check the TLS files")
    return ConnectionProblem(
        "unreachable", f"no Docker daemon answers at {url} ({text}); check the daemon URL and that dockerd runs"
    )


def explain(exc: Exception) -> str:
    return str(getattr(exc, "explanation", None) or exc)


def refusal_class(exc: Exception) -> ErrClass:
    """A daemon refusing a container: a bad setting (unknown runtime, no GPU driver, a bad mount) is the job's
    configuration; anything else is the platform's."""
    status = getattr(exc, "status_code", None)
    return ErrClass.ERR_CONFIG if status is not None and 400 <= int(status) < 500 else ErrClass.ERR_INFRA


class DockerClientHook(TAOPlatformHook):
    """The settings and the daemon client of a ``tao_docker`` connection."""

    def __init__(self, conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(conn_id, **kwargs)
        self._ended: dict[str, JobStatus] = {}  # container name -> its final status (an ended container is final)
        self._lock = threading.Lock()
        self._network_ready = False
        self._tegra: bool | None = None

    @property
    def base_url(self) -> str:
        self.load_connection()
        return str(self.setting("host", DEFAULT_SOCKET))

    @property
    def network(self) -> str:
        self.load_connection()
        return str(self.setting("network", DEFAULT_NETWORK))

    @property
    def auto_remove(self) -> bool:
        self.load_connection()
        return str(self.setting("auto_remove", "false")).strip().lower() in ("1", "true", "yes", "on")

    @property
    def cancel_grace_seconds(self) -> int:
        self.load_connection()
        return max(0, int(float(self.setting("cancel_grace_seconds", 10))))

    def default_results_root(self) -> str | None:
        self.load_connection()
        root = self.setting("results_root")
        return str(root).rstrip("/") if root else None

    def _daemon(self) -> tuple[str, Any]:
        """The daemon's URL (``https://`` when the connection has TLS files) and its TLS config."""
        from airflow.providers.docker.hooks.docker import DockerHook

        self.load_connection()
        tls = DockerHook.construct_tls_config(
            ca_cert=self.setting("tls_ca_cert"),
            client_cert=self.setting("tls_client_cert"),
            client_key=self.setting("tls_client_key"),
        )
        url = self.base_url
        if tls and url.startswith("tcp://"):
            url = "https://" + url.removeprefix("tcp://")
        return url, tls

    @cached_property
    def client(self) -> APIClient:
        """The docker provider's client for the connection's daemon (no registry login: pulls carry their auth)."""
        from airflow.providers.docker.hooks.docker import DockerHook

        url, tls = self._daemon()
        return DockerHook(docker_conn_id=None, base_url=url, version="auto", tls=tls).api_client

    def probe_connection(self) -> str:
        """Ping the daemon and read its version (``GET /_ping``, ``GET /version``)."""
        from docker import APIClient

        url, tls = self._daemon()
        try:
            # docker's own client: the provider's hook replaces the reason of a failure with a generic message
            with APIClient(base_url=url, version="auto", tls=tls, timeout=30) as client:
                client.ping()
                version = client.version()
        except Exception as exc:
            raise docker_problem(self.base_url, exc) from exc
        return f"Docker {version.get('Version')} (API {version.get('ApiVersion')}) at {self.base_url}"

    async def aclose(self) -> None:
        if "client" in self.__dict__:
            self.__dict__.pop("client").close()

    def _remove(self, name: str) -> None:
        from docker.errors import APIError

        try:
            self.client.remove_container(name, force=True, v=True)
        except APIError as exc:
            if exc.status_code != 404:
                self.log.warning("Could not remove container %s: %s", name, explain(exc))

    @property
    def daemon_is_local(self) -> bool:
        """A unix socket (or a loopback TCP daemon): the daemon's host paths are this machine's paths."""
        url = self.base_url
        return url.startswith("unix://") or url.split("://")[-1].split(":")[0] in ("localhost", "127.0.0.1")
