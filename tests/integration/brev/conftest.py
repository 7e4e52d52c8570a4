"""Fixtures for tests against the fake ``brev`` CLI (``tests/brevfake``), whose instances are REAL containers on
the test Docker engine (``scripts/docker-up.sh``).

``brev_world`` (per test) makes a fresh world in the test's temporary directory: the fake's launcher
``<world>/bin/brev`` first on ``PATH`` and named by the connection ``tao_brev_ci`` (type ``tao_brev``, defined
through ``AIRFLOW_CONN_TAO_BREV_CI``: the password is a token the world accepts, extras ``brev_path``, ``org`` and
the ``instance_type`` fallback chain). At the end it removes every container of the world -- its instances and
the jobs started on them -- and nothing else. A missing engine is a test FAILURE, never a skip.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.brevfake.control import BrevWorld
from tests.integration.docker.conftest import DockerEngine, docker_engine  # noqa: F401  (the shared engine)
from tests.integration.taskrun import Triggerer

CONN_ID = "tao_brev_ci"
INSTANCE_TYPES = "g5.xlarge,g5.2xlarge"


def brev_connection(world: BrevWorld, **extra: object) -> str:
    """The ``tao_brev`` connection of a world, as an ``AIRFLOW_CONN_*`` JSON value."""
    base = {"brev_path": world.brev, "org": world.org["name"], "instance_type": INSTANCE_TYPES}
    return json.dumps({"conn_type": "tao_brev", "password": world.token, "extra": {**base, **extra}})


@pytest.fixture
def brev_world(
    docker_engine: DockerEngine,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[BrevWorld]:
    """A fresh fake Brev world for one test, its ``brev`` first on PATH and the connection ``tao_brev_ci``."""
    with world_on_path(docker_engine, tmp_path / "brevworld", monkeypatch) as world:
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", brev_connection(world))
        yield world


@contextmanager
def world_on_path(engine: DockerEngine, directory: Path, patch: pytest.MonkeyPatch) -> Iterator[BrevWorld]:
    """A fresh world in ``directory``, its ``brev`` first on ``PATH`` (set through ``patch``); its containers are
    removed at the end (the worlds of killed runs first, at the start)."""
    BrevWorld.sweep_orphans(engine.host)
    world = BrevWorld.create(directory, engine.host)
    assert world.engine().image_exists(world.state()["image"]), "the instance image is missing on the engine"
    patch.setenv("PATH", f"{world.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    patch.setenv("BREV_FAKE_STATE", str(world.dir))
    try:
        yield world
    finally:
        world.teardown()


@pytest.fixture
def no_trigger_outlives_its_test(triggerer: Triggerer) -> Iterator[None]:
    """A test that fails half-way leaves triggers watching the world it made; the next test's triggers would share
    their poller, and its connection to a world that is gone. Cancel them all, as a triggerer restart would."""
    yield

    async def cancel_watchers() -> None:
        left = []
        for task in asyncio.all_tasks():
            frame = getattr(task.get_coro(), "cr_frame", None)
            trigger = frame.f_locals.get("trigger") if frame is not None else None
            if getattr(getattr(trigger, "handle", None), "platform", None) == "brev":
                task.cancel()
                left.append(task)
        await asyncio.gather(*left, return_exceptions=True)

    triggerer.call(cancel_watchers(), timeout=30)
