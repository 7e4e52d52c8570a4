"""Settings every test process shares, and the lanes the suite runs in side by side (``tests/lanes.py``)."""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest
from hypothesis import HealthCheck, settings

from tests import lanes

# No Airflow scheduler runs in the unit and integration tests: the hold that keeps a trigger's first event clear of
# the scheduler's deferral race (``[tao] trigger_event_hold_seconds``) would only slow them down. The e2e tests'
# ``airflow standalone`` gets a clean environment and the real default.
os.environ.setdefault("AIRFLOW__TAO__TRIGGER_EVENT_HOLD_SECONDS", "0")

# Hypothesis's per-example deadline and its too_slow health check are timed assertions: on a loaded machine (CI's two
# cores, the Python 3.12 run at the lowest priority beside the main suite) an example that once took 270 ms failed a
# test that proves nothing about time. Every property test runs without them.
settings.register_profile("tao", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("tao")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    lanes.order_for_lanes(items)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    return lanes.make_scheduler(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    with lanes.backends_held(item):
        return (yield)
