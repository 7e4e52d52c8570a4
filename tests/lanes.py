"""How the suite runs side by side (``pytest -n N``, as ``scripts/test.sh`` runs it): the lane rule and the lock
around the shared backends.

Lanes. Under pytest-xdist every test runs in the lane of its path (:class:`LaneScheduling`, the scheduler of every
distributed run), so a new test inherits its lane from where it lives (not ``xdist_group`` marks: pytest 9.2 names
its items in a way xdist 3.8's ``loadgroup`` no longer changes, and the groups were silently ignored):

* ``tests/e2e/<dir>/...`` -> ``e2e-<dir>``; ``tests/e2e/test_*.py`` -> ``e2e``: one group per folder of end-to-end
  tests, so each folder's tests run one after another in one process and share that process's ``airflow
  standalone`` (``tests/e2e/conftest.py``), while the folders run beside each other, each with its own standalone on
  its own PostgreSQL server and free ports;
* ``tests/integration/<backend>/...`` -> ``integration-<backend>``: one backend's tests one after another (its
  module fixtures -- a fake server, a world of instances -- are made once), the backends beside each other;
* ``tests/explorer/...`` -> ``explorer`` (CPU-bound: one slice per run, one lane);
* anything else (``tests/unit``, ``tests/contract``) -> its module.

Under xdist the items are ordered so that the longest lanes start first (the end-to-end folders, the explorer,
then the backends, the module-sized unit lanes last fill the gaps); a plain ``pytest`` run keeps the collection order.

The shared backends. The private Docker engine and the SLURM cluster serve every lane at once (and other sessions on
the machine). A test that stops one of them for a while (``@pytest.mark.stops_shared_backend``: the dockerd
restart, the slurmctld/sshd outage) would fail a test of another lane that asks it meanwhile, so every test that may
reach a backend (everything under e2e, integration and explorer) holds :data:`BACKENDS_LOCK` shared for its setup,
call and teardown, and a test that stops a backend holds it alone. The lock prefers the one who stops (a turnstile):
it waits for the tests running now to end, not for every lane to be idle at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
#: The lock every backend-reaching test holds shared and a backend-stopping test holds alone (one machine-wide file:
#: concurrent sessions on one machine share the backends too).
BACKENDS_LOCK = Path(os.environ.get("TAO_TEST_BACKENDS_LOCK", "/tmp/tao-tests-shared-backends.lock"))
STOPS_SHARED_BACKEND = "stops_shared_backend"
#: Lanes by first folder, in the order they start under xdist (the longest first); the rest start after them.
_LANE_ORDER = ("e2e", "explorer", "integration")


def lane(path: Path) -> str:
    """The lane of a test module at ``path``."""
    parts = path.resolve().relative_to(TESTS).parts
    top = parts[0]
    if top == "e2e":
        return "e2e" if len(parts) == 2 else f"e2e-{parts[1]}"
    if top == "integration" and len(parts) > 2:
        return f"integration-{parts[1]}"
    if top == "explorer":
        return "explorer"
    return "/".join(parts)


def reaches_backends(path: Path) -> bool:
    return path.resolve().relative_to(TESTS).parts[0] in _LANE_ORDER


def order_for_lanes(items: list[pytest.Item]) -> None:
    """In a worker of a distributed run: the long lanes first (every worker sorts alike, as xdist requires)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # a plain run keeps the collection order

    def start_order(item: pytest.Item) -> tuple[int, int]:
        parts = item.path.resolve().relative_to(TESTS).parts
        top = parts[0]
        rank = _LANE_ORDER.index(top) if top in _LANE_ORDER else len(_LANE_ORDER)
        # the root e2e folder's own modules after its subfolders: the fault matrix is the longest lane
        return rank, 1 if top == "e2e" and len(parts) == 2 else 0

    items.sort(key=start_order)  # stable: the order within a lane is the collection order


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The scheduler of a distributed run: xdist's scope scheduling with the lane as the scope, in the order the
    workers collected (the long lanes first)."""
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane(config.rootpath / nodeid.split("::", 1)[0])

    config.option.loadscopereorder = False  # not by test count: the order above
    return LaneScheduling(config, log)


def _flock(path: Path, mode: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, mode)
    return fd


def _release(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


@contextlib.contextmanager
def backends_held(item: pytest.Item) -> Iterator[None]:
    """Hold :data:`BACKENDS_LOCK` for ``item``'s whole run: alone for a test that stops a backend, shared by every
    other backend-reaching test, not at all by the rest."""
    if not reaches_backends(item.path):
        yield
        return
    with holding(alone=item.get_closest_marker(STOPS_SHARED_BACKEND) is not None):
        yield


@contextlib.contextmanager
def holding(*, alone: bool, lock: Path | None = None) -> Iterator[None]:
    """Hold ``lock`` (:data:`BACKENDS_LOCK`) shared, or ``alone``."""
    lock = lock or BACKENDS_LOCK
    # The turnstile: taken briefly by everyone, held by the one who stops a backend until it holds the lock alone, so
    # new tests queue behind it instead of keeping the shared lock busy forever.
    turnstile = _flock(lock.with_suffix(".turnstile"), fcntl.LOCK_EX)
    try:
        held = _flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    finally:
        _release(turnstile)
    try:
        yield
    finally:
        _release(held)
