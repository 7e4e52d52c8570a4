"""Fixtures for the runner unit tests (the harness itself is runner_harness.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.unit.runner.runner_harness import JobRun, make_runner


@pytest.fixture
def run_job(tmp_path: Path) -> Callable[..., JobRun]:
    """Stage and run a built entrypoint as a subprocess; see ``runner_harness.make_runner``."""
    return make_runner(tmp_path)
