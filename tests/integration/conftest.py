"""Fixtures shared by the integration tests of every backend: the triggerer loop and a real S3 API (moto)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from tests.integration.taskrun import Triggerer


@pytest.fixture(scope="session")
def triggerer() -> Iterator[Triggerer]:
    """One background event loop for every trigger of the session, like a triggerer process."""
    loop = Triggerer()
    yield loop
    loop.close()


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
