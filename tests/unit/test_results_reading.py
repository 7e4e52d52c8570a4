"""A job's results files are the job's: read outside it only as regular files of bounded size, never through a link
the job made, never blocking on a FIFO (issue 38.5) -- on this host (local, Docker's bind-mounted root), over SSH
(SLURM, the same checks in ``sh``) and on S3 (the size asked before anything is fetched)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from airflow_provider_tao.hooks.shared.results import (
    RESULT_FILE_LIMIT,
    UnsafeResultFile,
    read_local_result,
    read_s3_result,
    remote_read_command,
    remote_read_result,
)
from airflow_provider_tao.jobs import JobHandle
from airflow_provider_tao.operators.submit import TAOSubmitOperator
from tests.unit.fakes import FakeHook

SECRET = '{"auths": {"registry": {"auth": "c2VjcmV0LWNyZWRlbnRpYWw="}}}'


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    """A results root with one job's folder in it, and a file the worker's user may read outside it."""
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "config.json").write_text(SECRET)
    folder = tmp_path / "results" / "abc123"
    folder.mkdir(parents=True)
    return folder


#: Why each kind of planted file is refused (``assert_refused``).
REFUSALS = {"link": "symbolic link", "linked_folder": "symbolic link", "fifo": "not a regular file", "big": "more than"}


def assert_refused(read: Callable[[str], Any], link: str, linked_folder: str) -> None:
    """``read(name)`` refuses, each for its reason, the link ``link``, the file behind the linked folder
    ``linked_folder``, the FIFO ``fifo.json`` and the huge ``big.json`` (as every test of a reader plants them)."""
    names = {"link": link, "linked_folder": linked_folder, "fifo": "fifo.json", "big": "big.json"}
    for kind, name in names.items():
        with pytest.raises(UnsafeResultFile, match=REFUSALS[kind]):
            read(name)


def _read_in_thread(results_dir: Path, name: str) -> Any:
    """``read_local_result`` in a thread; a FIFO that blocks it is opened for writing by the test to end the read
    (then the test fails on what it got, instead of hanging)."""
    got: list[Any] = []

    def read() -> None:
        try:
            got.append(read_local_result(str(results_dir), name))
        except Exception as exc:
            got.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():
        with open(results_dir / name, "w") as fifo:
            fifo.write("blocked")
        thread.join(60)
        return "blocked on the FIFO"
    return got[0]


def test_a_regular_metrics_file_is_read(job_dir: Path) -> None:
    (job_dir / "metrics.json").write_text('{"map": 0.5}')
    (job_dir / "sub").mkdir()
    (job_dir / "sub" / "m.json").write_text("{}")
    assert read_local_result(str(job_dir), "metrics.json") == b'{"map": 0.5}'
    assert read_local_result(str(job_dir), "sub/m.json") == b"{}"
    assert read_local_result(str(job_dir), "missing.json") is None
    assert read_local_result(str(job_dir.parent / "nojob"), "metrics.json") is None


def test_a_link_to_a_file_of_the_worker_user_is_not_followed(job_dir: Path, tmp_path: Path) -> None:
    (job_dir / "metrics.json").symlink_to(tmp_path / "home" / "config.json")
    with pytest.raises(UnsafeResultFile, match="symbolic link"):
        read_local_result(str(job_dir), "metrics.json")


def test_a_link_on_the_way_is_not_followed_either(job_dir: Path, tmp_path: Path) -> None:
    (job_dir / "sub").symlink_to(tmp_path / "home")  # a folder of the job made a link to the user's home
    with pytest.raises(UnsafeResultFile, match="symbolic link"):
        read_local_result(str(job_dir), "sub/config.json")
    linked = tmp_path / "results" / "linked"
    linked.symlink_to(tmp_path / "home")  # the job's folder itself replaced by a link
    (tmp_path / "home" / "metrics.json").write_text(SECRET)
    with pytest.raises(UnsafeResultFile, match="symbolic link"):
        read_local_result(str(linked), "metrics.json")


@pytest.mark.parametrize("name", ["../../home/config.json", "/etc/passwd", "..", ""])
def test_a_name_that_leaves_the_folder_is_refused(job_dir: Path, name: str) -> None:
    with pytest.raises(UnsafeResultFile, match="relative path inside the results folder"):
        read_local_result(str(job_dir), name)


def test_a_fifo_is_refused_without_blocking(job_dir: Path) -> None:
    os.mkfifo(job_dir / "metrics.json")
    got = _read_in_thread(job_dir, "metrics.json")
    assert isinstance(got, UnsafeResultFile) and "not a regular file" in str(got), got


def test_a_huge_file_is_refused_not_read(job_dir: Path) -> None:
    with open(job_dir / "metrics.json", "wb") as file:
        file.truncate(RESULT_FILE_LIMIT + 1)  # sparse: no disk spent
    with pytest.raises(UnsafeResultFile, match="more than"):
        read_local_result(str(job_dir), "metrics.json")


def test_the_operator_puts_no_linked_file_in_its_result(
    fake_platform: type[FakeHook], job_dir: Path, tmp_path: Path
) -> None:
    """Through the operator's metrics reading and the platform hook's default reader (local, Docker, ...)."""
    (job_dir / "metrics.json").symlink_to(tmp_path / "home" / "config.json")
    op = TAOSubmitOperator(task_id="t", conn_id="fake_conn", image="i:1", command="x")
    handle = JobHandle(platform="fake", conn_id="fake_conn", job_id="abc123", name="n", results_dir=str(job_dir))
    assert op._read_metrics(FakeHook("fake_conn"), handle) is None
    (job_dir / "metrics.json").unlink()
    (job_dir / "metrics.json").write_text('{"map": 0.7}')
    assert op._read_metrics(FakeHook("fake_conn"), handle) == {"map": 0.7}


# --------------------------------------------------------------------------- over SSH (SLURM): the same checks in sh


def _remote(results_dir: Path, name: str, limit: int = RESULT_FILE_LIMIT) -> bytes | None:
    """The SLURM hook's command, run by this host's ``sh`` (the cluster's login node runs the same)."""
    done = subprocess.run(
        ["sh", "-c", remote_read_command(str(results_dir), name, limit)], check=False, capture_output=True, timeout=60
    )
    return remote_read_result(done.returncode, done.stdout, f"{results_dir}/{name}", limit)


def test_the_remote_read_applies_the_same_checks(job_dir: Path, tmp_path: Path) -> None:
    (job_dir / "metrics.json").write_text('{"map": 0.5}')
    assert _remote(job_dir, "metrics.json") == b'{"map": 0.5}'
    assert _remote(job_dir, "missing.json") is None
    (job_dir / "link.json").symlink_to(tmp_path / "home" / "config.json")
    (job_dir / "sub").symlink_to(tmp_path / "home")
    os.mkfifo(job_dir / "fifo.json")
    with open(job_dir / "big.json", "wb") as file:
        file.truncate(2048)
    assert_refused(lambda name: _remote(job_dir, name, limit=1024), link="link.json", linked_folder="sub/config.json")


# --------------------------------------------------------------------------- S3: the size first, then a bounded read


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Any:
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AIRFLOW_CONN_S3_RESULTS", json.dumps({"conn_type": "aws"}))
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="res")
        yield client


def test_an_s3_metrics_object_is_read_only_when_small(fake_platform: type[FakeHook], s3: Any) -> None:
    huge = json.dumps({"padding": "x" * (RESULT_FILE_LIMIT + 10)}).encode()
    s3.put_object(Bucket="res", Key="results/j1/metrics.json", Body=huge)
    s3.put_object(Bucket="res", Key="results/j2/metrics.json", Body=b'{"map": 0.9}')
    with pytest.raises(UnsafeResultFile, match="more than"):
        read_s3_result(s3, "res", "results/j1/metrics.json")
    assert read_s3_result(s3, "res", "results/j2/metrics.json") == b'{"map": 0.9}'
    assert read_s3_result(s3, "res", "results/j3/metrics.json") is None

    op = TAOSubmitOperator(task_id="t", conn_id="fake_conn", image="i:1", command="x", storage_conn_id="s3_results")
    for job_id, metrics in (("j1", None), ("j2", {"map": 0.9})):
        handle = JobHandle(
            platform="fake", conn_id="fake_conn", job_id=job_id, name="n", results_dir=f"s3://res/results/{job_id}"
        )
        assert op._read_metrics(FakeHook("fake_conn"), handle) == metrics
