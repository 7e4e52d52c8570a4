"""A real S3 API for the runner: a moto server on loopback (port 0), a bucket per test, and a killable proxy."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from tests.integration.runner.tcp_proxy import TcpProxy
from tests.unit.runner.runner_harness import JobRun, make_runner

CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of a moto S3 server started for this session."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def client_for(endpoint: str) -> Any:
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )


@pytest.fixture(scope="session")
def s3(moto_endpoint: str) -> Any:
    """A boto3 S3 client on the moto server."""
    return client_for(moto_endpoint)


@pytest.fixture
def bucket(s3: Any) -> str:
    """A fresh bucket for one test."""
    name = f"tao-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


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
