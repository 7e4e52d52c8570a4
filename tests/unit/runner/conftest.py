"""Fixtures for the runner unit tests (the harness itself is runner_harness.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.unit.runner.runner_harness import JobRun, make_runner


@pytest.fixture
def run_job(tmp_path: Path) -> Callable[..., JobRun]:
    """Stage and run a built entrypoint as a subprocess; see ``runner_harness.make_runner``."""
    return make_runner(tmp_path)


@pytest.fixture
def bare_python(tmp_path: Path) -> Path:
    """A PATH dir whose python3 is the system interpreter without site-packages (no boto3, PyYAML, tomli_w)."""
    bindir = tmp_path / "barebin"
    bindir.mkdir()
    wrapper = bindir / "python3"
    base = Path(sys.base_prefix) / "bin" / "python3"
    interpreter = base if base.exists() else Path("/usr/bin/python3")
    wrapper.write_text(f'#!/bin/sh\nexec {interpreter} -S "$@"\n')
    wrapper.chmod(0o755)
    return bindir
