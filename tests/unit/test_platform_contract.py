"""The platform contract of ``hooks/base.py`` (v2): what every platform hook must provide, checked on each of them."""

from __future__ import annotations

import asyncio
import importlib
import json
from typing import Any

import pytest

from airflow_provider_tao.hooks import PLATFORMS
from airflow_provider_tao.hooks.base import OPERATOR_DETAIL_KEYS, TAOPlatformHook
from airflow_provider_tao.hooks.shared.env import MULTI_NODE_VARS, multi_node_env
from airflow_provider_tao.hooks.slurm import SlurmHook
from airflow_provider_tao.jobs import JobHandle, JobSpec, JobStatus
from airflow_provider_tao.triggers.poller import StatusPoller, Watch
from tests.unit.fakes import FakeHook


def _hook_classes() -> list[type[TAOPlatformHook]]:
    classes = []
    for _, path in PLATFORMS.values():
        module, _, name = path.rpartition(".")
        classes.append(getattr(importlib.import_module(module), name))
    return classes


@pytest.mark.parametrize("cls", _hook_classes(), ids=lambda c: c.platform)
def test_every_platform_keeps_marks_and_says_where(cls: type[TAOPlatformHook]) -> None:
    """No silent no-op: a platform without marks would turn the ownership check off."""
    assert cls.read_marks is not TAOPlatformHook.read_marks
    assert cls.write_mark is not TAOPlatformHook.write_mark
    assert isinstance(getattr(cls, "marks_storage", None), str) and cls.marks_storage


@pytest.mark.parametrize("cls", _hook_classes(), ids=lambda c: c.platform)
def test_every_platform_reports_usage_from_its_backend(cls: type[TAOPlatformHook]) -> None:
    """GPU-hours come from the backend's own times: no platform lives on the default (the submission time only)."""
    assert cls.get_job_usage is not TAOPlatformHook.get_job_usage


@pytest.mark.parametrize("cls", _hook_classes(), ids=lambda c: c.platform)
def test_every_platform_reads_logs_by_an_opaque_cursor(cls: type[TAOPlatformHook]) -> None:
    import inspect

    params = inspect.signature(cls.get_job_logs).parameters
    assert "cursor" in params and params["cursor"].default == ""


def test_the_base_class_has_no_silent_marks() -> None:
    hook = FakeHook()
    handle = JobHandle("fake", None, "j", "n")
    with pytest.raises(NotImplementedError):
        TAOPlatformHook.read_marks(hook, handle)
    with pytest.raises(NotImplementedError):
        TAOPlatformHook.write_mark(hook, handle, "owner_try", 1)


class _Named(FakeHook):
    name_max_length = 36
    name_letter_first = True


@pytest.mark.parametrize(
    ("cls", "prefix", "expected"),
    [
        (FakeHook, "dag-train", "dag-train-0123456789"),
        (FakeHook, "x" * 80, "x" * 52 + "-0123456789"),
        (_Named, "a-very-long-dag-id-and-task-id-that-goes-on", "a-very-long-dag-id-and-ta-0123456789"),
        (_Named, "42-nightly", "tao-42-nightly-0123456789"),
        (_Named, "", "tao-0123456789"),
        (_Named, "---", "tao-0123456789"),
    ],
)
def test_job_names_shorten_the_prefix_never_the_digest(cls: type[FakeHook], prefix: str, expected: str) -> None:
    name = cls().job_name_for(prefix, "0123456789")
    assert name == expected
    assert len(name) <= cls.name_max_length and name.endswith("-0123456789")


def test_operator_consumed_details_are_not_platform_details(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "mount_path" in OPERATOR_DETAIL_KEYS
    spec = JobSpec(name="n", job_id="j", command="x", backend_details={"mount_path": "/workspace", "partition": "p"})
    assert TAOPlatformHook.platform_details(spec) == {"partition": "p"}
    hook = _slurm(monkeypatch, container_runtime="none")
    hook.plan(JobSpec(name="job-1", job_id="abc", command="x", gpu_count=0, backend_details={"mount_path": "/w"}))


def _slurm(monkeypatch: pytest.MonkeyPatch, **extra: Any) -> SlurmHook:
    base = {"results_root": "/lustre/u", "partition": "gpu", "gpus_per_node": 8, **extra}
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_X", json.dumps({"conn_type": "tao_slurm", "host": "h", "extra": base}))
    hook = SlurmHook(conn_id="slurm_x")
    hook.load_connection()
    return hook


def test_the_hook_decides_whether_an_image_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = JobSpec(name="n", job_id="j", command="x")
    assert _slurm(monkeypatch, container_runtime="none").image_required(spec) is None
    assert "pyxis" in (_slurm(monkeypatch).image_required(spec) or "")
    assert "fake" in (FakeHook().image_required(spec) or "")


def test_multi_node_contract() -> None:
    env = multi_node_env(4, 8, master_addr="10.0.0.1", node_rank=2)
    assert set(env) == set(MULTI_NODE_VARS)
    assert (env["WORLD_SIZE"], env["NNODES"], env["NUM_GPU_PER_NODE"], env["NODE_RANK"]) == ("4", "4", "8", "2")
    assert set(multi_node_env(2, 1)) == set(MULTI_NODE_VARS) - {"MASTER_ADDR", "NODE_RANK"}


def test_files_are_bytes_with_known_sizes() -> None:
    spec = JobSpec(name="n", job_id="j", command="x", files={"runner.pyz": b"\x00" * 2048, "a.json": b"{}"})
    assert spec.file_sizes() == {"runner.pyz": 2048, "a.json": 2}
    assert spec.to_json()["files"] == {"runner.pyz": 2048, "a.json": 2}


def test_not_found_is_an_explicit_status() -> None:
    missing = JobStatus.missing("gone")
    assert missing.not_found and not JobStatus.unknown("outage").not_found
    assert JobStatus.from_json(json.loads(json.dumps(missing.to_json()))).not_found


async def test_the_poller_restarts_itself_when_its_task_dies(fake_platform: type[FakeHook]) -> None:
    poller = await StatusPoller.for_connection("fake", None)
    handle = JobHandle("fake", None, "j", "n")

    async def boom() -> None:
        raise RuntimeError("poller bug")

    watch = Watch(handle, 0.01)
    poller.add(watch)
    try:
        poller._task = asyncio.create_task(boom())
        await asyncio.sleep(0.01)
        poller.ensure_running()
        assert poller.restarts == 1 and poller._task is not None and not poller._task.done()
    finally:
        await poller.remove(watch)
    assert StatusPoller._instances == {}


async def test_one_hook_per_loop_and_connection_is_shared_and_closed_when_the_last_watcher_leaves(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[int] = []

    async def aclose(self: FakeHook) -> None:
        closed.append(id(self))

    monkeypatch.setattr(FakeHook, "aclose", aclose)
    first = await StatusPoller.for_connection("fake", None)
    second = await StatusPoller.for_connection("fake", None)
    assert first is second
    watches = [Watch(JobHandle("fake", None, job, "n"), 0.01) for job in "ab"]
    for watch in watches:
        first.add(watch)
    assert StatusPoller.existing("fake", None) is first
    for watch in watches:
        await first.remove(watch)
    assert closed == [id(first.hook)]
