"""The lanes the suite runs in side by side (``tests/lanes.py``): a new test's lane follows from its path, and a test
that stops a shared backend runs while no other backend test does, without waiting for every lane to be idle."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests import lanes

TESTS = lanes.TESTS


@pytest.mark.parametrize(
    ("path", "lane"),
    [
        ("e2e/test_tao_lifecycle.py", "e2e"),
        ("e2e/matrix/test_matrix.py", "e2e-matrix"),
        ("e2e/ui/test_new_page.py", "e2e-ui"),
        ("integration/docker/test_docker_platform.py", "integration-docker"),
        ("integration/automl/test_new_backend.py", "integration-automl"),
        ("explorer/test_explore.py", "explorer"),
        ("unit/test_jobs.py", "unit/test_jobs.py"),
        ("contract/test_serde.py", "contract/test_serde.py"),
    ],
)
def test_a_tests_lane_follows_from_where_it_lives(path: str, lane: str) -> None:
    assert lanes.lane(TESTS / path) == lane
    assert lanes.reaches_backends(TESTS / path) == (
        path.split("/", maxsplit=1)[0] in ("e2e", "integration", "explorer")
    )


def test_a_backend_stopper_waits_for_the_running_tests_and_goes_before_the_next(tmp_path: Path) -> None:
    lock = tmp_path / "backends.lock"
    events = {name: threading.Event() for name in ("stopper_in", "stopper_out", "next_in")}
    order: list[str] = []

    def stopper() -> None:
        with lanes.holding(alone=True, lock=lock):
            order.append("stopper")
            events["stopper_in"].set()
            events["stopper_out"].wait(30)

    def next_test() -> None:
        with lanes.holding(alone=False, lock=lock):
            order.append("next")
            events["next_in"].set()

    with lanes.holding(alone=False, lock=lock):  # a test of another lane runs
        threads = [threading.Thread(target=stopper)]
        threads[0].start()
        # the stopper waits for the running test (a bounded look: it may only pass wrongly, never fail wrongly)
        assert not events["stopper_in"].wait(0.5)
    assert events["stopper_in"].wait(30)  # the running tests ended: it goes
    threads.append(threading.Thread(target=next_test))
    threads[1].start()
    assert not events["next_in"].wait(0.5)  # a test starting now waits for the stopper
    events["stopper_out"].set()
    assert events["next_in"].wait(30)
    for thread in threads:
        thread.join(30)
    assert order == ["stopper", "next"]
