from __future__ import annotations

import pytest

from airflow_provider_tao import hooks
from tests.unit.fakes import FakeHook


@pytest.fixture
def fake_platform(monkeypatch: pytest.MonkeyPatch) -> type[FakeHook]:
    """Registers the in-memory ``fake`` platform (connection type ``tao_fake``) for one test."""
    FakeHook.reset()
    monkeypatch.setitem(hooks.PLATFORMS, "fake", ("tao_fake", "tests.unit.fakes.FakeHook"))
    monkeypatch.setenv("AIRFLOW_CONN_FAKE_CONN", '{"conn_type": "tao_fake"}')
    return FakeHook
