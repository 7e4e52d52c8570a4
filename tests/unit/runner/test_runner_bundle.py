"""runner.pyz: the in-job runner package as one deterministic zip archive, run by a plain ``python3``."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_provider_tao.runner.bundle import ARCHIVE_PACKAGE, RUNNER_ARCHIVE, archive_members, runner_archive
from airflow_provider_tao.runner.entrypoint import RUNNER_FILE, build_entrypoint
from tests.unit.runner.runner_harness import JobRun

REPO = Path(__file__).resolve().parents[3]
RUNNER_DIR = REPO / "airflow_provider_tao" / "runner"
PACKAGE_DIR = RUNNER_DIR / "job"
ECHO = Path(__file__).with_name("_echo_argv.py")
BUILD_IN_A_FRESH_PROCESS = (
    "import hashlib, os, sys\n"
    "os.umask(int(sys.argv[1], 8))\n"
    "from airflow_provider_tao.runner.bundle import runner_archive\n"
    "sys.stdout.write(hashlib.sha256(runner_archive()).hexdigest())\n"
)


def test_the_archive_is_what_the_entrypoint_ships() -> None:
    assert RUNNER_FILE == RUNNER_ARCHIVE == "runner.pyz"
    assert build_entrypoint("true").files[RUNNER_FILE] == runner_archive()


def test_two_builds_in_one_process_are_byte_identical() -> None:
    first = runner_archive()
    assert runner_archive() is first  # built once per process
    runner_archive.cache_clear()
    try:
        second = runner_archive()
    finally:
        runner_archive.cache_clear()
    assert second is not first and second == first


def test_two_builds_in_separate_processes_are_byte_identical(tmp_path: Path) -> None:
    # different hash seeds, umasks, time zones and working folders: none of them may reach the bytes
    digests = set()
    for seed, umask, tz in (("1", "022", "UTC"), ("4242", "077", "Asia/Tokyo")):
        env = {**os.environ, "PYTHONHASHSEED": seed, "TZ": tz, "PYTHONPATH": str(REPO)}
        run = subprocess.run(
            [sys.executable, "-c", BUILD_IN_A_FRESH_PROCESS, umask],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        digests.add(run.stdout)
    assert digests == {hashlib.sha256(runner_archive()).hexdigest()}


def test_entries_are_sorted_with_a_fixed_time_mode_and_no_compression() -> None:
    with zipfile.ZipFile(io.BytesIO(runner_archive())) as archive:
        infos = archive.infolist()
        names = [info.filename for info in infos]
        assert names == sorted(names)
        assert names[0] == "__main__.py"
        assert names[1:] == sorted(f"{ARCHIVE_PACKAGE}/{path.name}" for path in PACKAGE_DIR.glob("*.py"))
        for info in infos:
            assert info.date_time == (1980, 1, 1, 0, 0, 0), info.filename
            assert info.compress_type == zipfile.ZIP_STORED, info.filename
            assert info.external_attr >> 16 == 0o100644, info.filename
            assert info.create_system == 3, info.filename
        for name, content in archive_members():
            assert archive.read(name) == content
        for path in PACKAGE_DIR.glob("*.py"):
            assert archive.read(f"{ARCHIVE_PACKAGE}/{path.name}") == path.read_bytes()
        assert archive.read("__main__.py").decode() == (
            f"import sys\n\nfrom {ARCHIVE_PACKAGE}.main import main\n\nsys.exit(main())\n"
        )


@pytest.mark.parametrize("path", sorted(RUNNER_DIR.rglob("*.py")), ids=lambda p: str(p.relative_to(RUNNER_DIR)))
def test_no_runner_module_is_over_500_lines(path: Path) -> None:
    assert len(path.read_text(encoding="utf-8").splitlines()) <= 500


def test_python3_without_site_packages_runs_the_archive_from_any_folder(tmp_path: Path, bare_python: Path) -> None:
    archive = tmp_path / "staged" / RUNNER_ARCHIVE
    archive.parent.mkdir()
    archive.write_bytes(runner_archive())
    archive.chmod(0o400)  # staged read-only: nothing is written beside it (-B, and zipimport never writes)
    run = subprocess.run(
        [str(bare_python / "python3"), "-B", str(archive)], cwd="/", capture_output=True, text=True, check=False
    )
    assert run.returncode == 2, run.stderr
    assert run.stdout.startswith('TAO_FAILURE {"err_class":"ERR_CONFIG","message":"usage: python3 runner.pyz')
    assert sorted(p.name for p in archive.parent.iterdir()) == [RUNNER_ARCHIVE]


def test_a_toml_spec_is_written_with_or_without_tomli_w_in_the_job(
    run_job: Callable[..., JobRun], bare_python: Path
) -> None:
    spec = {"train": {"lr": 0.5, "layers": [1, 2]}, "data": [{"path": "/a"}, {"path": "/b"}], "k e y": "v\n"}
    ep = build_entrypoint(["python3", str(ECHO), "--copy", "{config_path}"], specs=spec, config_format="toml")
    with_tomli_w = run_job(ep)  # the test venv's python3 has tomli_w
    without = run_job(ep, env={"PATH": f"{bare_python}{os.pathsep}/usr/bin:/bin"})
    texts = []
    for run in (with_tomli_w, without):
        assert run.rc == 0, run.stdout + run.proc.stderr
        texts.append((run.root / "echo.json").read_text(encoding="utf-8"))
        assert tomllib.loads(texts[-1]) == spec
    assert texts[0] != texts[1]  # two different writers really ran
