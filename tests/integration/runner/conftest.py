"""The runner against S3: jobs staged with the moto endpoint in their environment, and a killable proxy."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.runner.tcp_proxy import TcpProxy
from tests.unit.runner.runner_harness import JobRun, make_runner

CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def run_job(tmp_path: Path, moto_endpoint: str) -> Callable[..., JobRun]:
    """Stage and run an entrypoint with S3 credentials and the moto endpoint in the job's env."""
    runner = make_runner(tmp_path)

    def run(ep: Any, env: dict[str, str] | None = None, **kwargs: Any) -> JobRun:
        return runner(ep, env={**CREDS, "AWS_ENDPOINT_URL": moto_endpoint, **(env or {})}, **kwargs)

    return run


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[TcpProxy]:
    """A TCP proxy in front of the moto server that a test can kill mid-transfer."""
    host, port = moto_endpoint.removeprefix("http://").split(":")
    p = TcpProxy((host, int(port)))
    yield p
    p.kill()
