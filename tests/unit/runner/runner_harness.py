"""Shared by the unit and integration runner tests: stage a built entrypoint and run it for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from airflow_provider_tao.runner.entrypoint import Entrypoint, parse_progress

VENV_BIN = str(Path(sys.executable).parent)
# Storage / results env of the developer's shell must not leak into a test job.
_SCRUB = ("TAO_", "AWS_", "S3_BUCKET_NAME", "HF_TOKEN", "NGC_KEY")


class JobRun:
    """The outcome of one staged run."""

    def __init__(self, proc: subprocess.CompletedProcess[str], root: Path, job_id: str) -> None:
        self.proc = proc
        self.root = root
        self.job_id = job_id

    @property
    def rc(self) -> int:
        return self.proc.returncode

    @property
    def stdout(self) -> str:
        return self.proc.stdout

    @property
    def progress(self) -> list[dict[str, Any]]:
        return [p for p in (parse_progress(line) for line in self.stdout.splitlines()) if p]

    @property
    def failures(self) -> list[dict[str, Any]]:
        return [
            json.loads(line[len("TAO_FAILURE ") :])
            for line in self.stdout.splitlines()
            if line.startswith("TAO_FAILURE ")
        ]

    def done(self) -> dict[str, Any]:
        events = [p for p in self.progress if p["phase"] == "done"]
        assert events, self.stdout + self.proc.stderr
        return events[-1]


def stage(ep: Entrypoint, folder: Path) -> Path:
    """Write ``ep.files`` the way a platform does."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in ep.files.items():
        (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return folder


def job_env(root: Path, job_id: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB)}
    env.update(
        PATH=VENV_BIN + os.pathsep + env.get("PATH", ""),
        TAO_JOB_FILES=str(root / "files"),
        TAO_JOB_ID=job_id,
        TAO_LOCAL_RESULTS_BASE=str(root / "ephemeral"),
        TAO_WORK_DIR=str(root / "work"),
        TAO_PROGRESS_INTERVAL="0.2",
        ECHO_OUT=str(root / "echo.json"),
    )
    env.update(extra or {})
    return env


def make_runner(tmp_path: Path) -> Callable[..., JobRun]:
    """A ``run_job(ep, env={...}, job_id=..., timeout=...)`` that stages and runs an entrypoint as a subprocess.

    Each run gets its own folder under ``tmp_path`` (files, work dir, ephemeral results, ``echo.json``).
    """
    counter = iter(range(1000))

    def run(
        ep: Entrypoint, env: Mapping[str, str] | None = None, job_id: str | None = None, timeout: float = 120
    ) -> JobRun:
        root = tmp_path / f"run{next(counter)}"
        job_id = job_id or f"job-{root.name}"
        stage(ep, root / "files")
        full_env = job_env(root, job_id, {**ep.env, **(env or {})})
        proc = subprocess.run(ep.command, env=full_env, capture_output=True, text=True, timeout=timeout, check=False)
        return JobRun(proc, root, job_id)

    return run
