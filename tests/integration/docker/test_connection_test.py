"""The connection form's Test button (``test_connection``) against the real engine: success, no daemon (a closed
port, a missing socket), and a daemon behind an authenticating proxy that refuses the client -- each in words."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tao.hooks.docker import TAODockerHook
from tests.e2e.airflow_harness import free_ports
from tests.integration.docker.conftest import DockerEngine

pytestmark = pytest.mark.integration


def _test(monkeypatch: pytest.MonkeyPatch, host: str, **extra: Any) -> tuple[bool, str]:
    monkeypatch.setenv("AIRFLOW_CONN_TAO_DOCKER_TEST", json.dumps({"conn_type": "tao_docker", "host": host, **extra}))
    return TAODockerHook(conn_id="tao_docker_test").test_connection()


def test_success_names_the_daemon(docker_engine: DockerEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    version = docker_engine.client.version()
    for url in (docker_engine.host, docker_engine.tcp):
        ok, message = _test(monkeypatch, url)
        assert ok, message
        assert message == f"Docker {version['Version']} (API {version['ApiVersion']}) at {url}"


def test_no_daemon_is_unreachable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for url in (f"tcp://127.0.0.1:{free_ports(1)[0]}", f"unix://{tmp_path / 'missing.sock'}"):
        ok, message = _test(monkeypatch, url)
        assert not ok
        assert message.startswith(f"Unreachable: no Docker daemon answers at {url}"), message


class _Refusing(BaseHTTPRequestHandler):
    """An authenticating proxy in front of a daemon, refusing this client (what a docker socket proxy answers)."""

    status = 401

    def do_GET(self) -> None:
        body = json.dumps({"message": "authentication required"}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture(params=[401, 403])
def refusing_proxy(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    handler = type("Handler", (_Refusing,), {"status": request.param})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"tcp://127.0.0.1:{server.server_address[1]}", request.param
    finally:
        server.shutdown()


def test_a_refusing_proxy_is_an_auth_or_permission_problem(
    refusing_proxy: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, status = refusing_proxy
    ok, message = _test(monkeypatch, url, login="$oauthtoken", password="nvapi-secret-key-123")
    assert not ok
    expected = "Authentication refused:" if status == 401 else "Permission denied:"
    assert message.startswith(expected), message
    assert str(status) in message and "nvapi-secret-key-123" not in message
