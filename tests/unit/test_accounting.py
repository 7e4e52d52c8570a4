"""GPU-hours accounting and the shared "waiting for resources" notion: the pure rules, per platform.

What each platform reports as "Pending for lack of resources" (``JobStatus.capacity_wait_since``) and what it
reports a job used (``JobUsage``), read from the backends' own answers (API JSON, sacct / squeue lines, docker
``State``); the arithmetic of an attempt; the metrics sent through Airflow's ``Stats``; the trigger's capacity clock.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from airflow.sdk.observability import stats

from airflow_provider_tao import accounting
from airflow_provider_tao.accounting import JobUsage, attempt_of, total_gpu_hours
from airflow_provider_tao.hooks.kubernetes import status as ks
from airflow_provider_tao.hooks.lepton import status as ls
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.hooks.slurm import status as sst
from airflow_provider_tao.jobs import JobHandle, JobSpec, JobState, JobStatus
from airflow_provider_tao.triggers.job import TAOJobTrigger
from tests.unit.fakes import FakeHook

NOW = 1_800_000_000.0
HANDLE = JobHandle("slurm", "slurm_a", "j1", "n", backend_job_id="42", submitted_at=NOW - 100)


def _stamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


# --------------------------------------------------------------------------- an attempt's arithmetic


def test_gpu_hours_are_gpus_times_nodes_times_the_backends_run_time() -> None:
    usage = JobUsage(queued_at=NOW - 100, started_at=NOW - 90, ended_at=NOW - 18, gpus_per_node=4, nodes=2)
    attempt = attempt_of(HANDLE, usage, outcome="complete", reason="", try_number=1, requested_gpus=1,
                         requested_nodes=1, now=NOW)  # fmt: skip
    assert (attempt.queued_seconds, attempt.run_seconds, attempt.gpus) == (10.0, 72.0, 8)
    assert attempt.gpu_hours == pytest.approx(8 * 72 / 3600)
    # the backend's own elapsed time wins over the difference of its timestamps (sacct ElapsedRaw)
    exact = attempt_of(HANDLE, JobUsage(started_at=NOW - 90, ended_at=NOW - 18, run_seconds=71.0, gpus_per_node=1,
                                        nodes=1), outcome="complete", reason="", try_number=1, requested_gpus=1,
                       requested_nodes=1, now=NOW)  # fmt: skip
    assert exact.run_seconds == 71.0 and exact.queued_seconds == 10.0  # queued from the handle's submission


def test_what_the_backend_does_not_say_comes_from_the_request_and_all_gpus_stays_unknown() -> None:
    usage = JobUsage(queued_at=NOW - 50, started_at=NOW - 30)  # still running: ends now
    asked = attempt_of(HANDLE, usage, outcome="timeout", reason="", try_number=2, requested_gpus=2,
                       requested_nodes=3, now=NOW)  # fmt: skip
    assert (asked.gpus_per_node, asked.nodes, asked.gpus, asked.run_seconds) == (2, 3, 6, 30.0)
    everything = attempt_of(HANDLE, usage, outcome="timeout", reason="", try_number=2, requested_gpus=-1,
                            requested_nodes=1, now=NOW)  # fmt: skip
    assert everything.gpus is None and everything.gpu_hours is None
    assert total_gpu_hours([asked, everything]) is None and total_gpu_hours([asked]) == asked.gpu_hours
    assert "? GPUs" in accounting.describe(1, everything)


def test_a_job_that_never_started_ran_nothing_and_queued_until_it_ended() -> None:
    usage = JobUsage(queued_at=NOW - 40, ended_at=NOW - 5, gpus_per_node=8, nodes=1)
    attempt = attempt_of(HANDLE, usage, outcome="capacity", reason="no capacity", try_number=1, requested_gpus=8,
                         requested_nodes=1, now=NOW)  # fmt: skip
    assert (attempt.queued_seconds, attempt.run_seconds, attempt.gpu_hours) == (35.0, 0.0, 0.0)
    line = accounting.describe(1, attempt)
    assert "capacity -- no capacity" in line and "0.0000 GPU-hours" in line and "connection slurm_a" in line


# --------------------------------------------------------------------------- metrics through Airflow's Stats


class _Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, Any, dict[str, str]]] = []

    def incr(self, stat: str, count: int = 1, rate: float = 1, *, tags: dict[str, str] | None = None) -> None:
        self.sent.append(("incr", stat, count, dict(tags or {})))

    def timing(self, stat: str, dt: Any, *, tags: dict[str, str] | None = None) -> None:
        self.sent.append(("timing", stat, dt, dict(tags or {})))


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Recorder]:
    backend = _Recorder()
    stats.initialize(factory=lambda: backend, export_legacy_names=True)  # type: ignore[arg-type,return-value]
    yield backend
    from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger

    stats.initialize(factory=NoStatsLogger, export_legacy_names=True)


def test_metrics_carry_gpu_seconds_times_and_tags_and_legacy_names_by_dag(recorder: _Recorder) -> None:
    usage = JobUsage(queued_at=NOW - 100, started_at=NOW - 90, ended_at=NOW - 18, gpus_per_node=4, nodes=2,
                     gpu_type="A100")  # fmt: skip
    attempt = attempt_of(HANDLE, usage, outcome="complete", reason="", try_number=1, requested_gpus=4,
                         requested_nodes=2, now=NOW)  # fmt: skip
    accounting.emit_metrics(attempt, {"dag_id": "nightly.train", "task_id": "fit"})
    by_name = {(kind, name): (value, tags) for kind, name, value, tags in recorder.sent}
    value, tags = by_name[("incr", accounting.METRIC_GPU_SECONDS)]
    assert value == 8 * 72
    assert tags == {"dag_id": "nightly.train", "task_id": "fit", "platform": "slurm", "conn_id": "slurm_a",
                    "gpu_type": "A100", "outcome": "complete"}  # fmt: skip
    legacy_value, legacy_tags = by_name[("incr", f"{accounting.METRIC_GPU_SECONDS}.nightly__train.fit")]
    assert legacy_value == 8 * 72 and "dag_id" not in legacy_tags  # the name carries them (plain StatsD drops tags)
    assert by_name[("timing", accounting.METRIC_RUN_TIME)][0] == timedelta(seconds=72)
    assert by_name[("timing", accounting.METRIC_QUEUED_TIME)][0] == timedelta(seconds=10)
    assert ("incr", f"{accounting.METRIC_ATTEMPTS}.nightly__train.fit.complete") in by_name

    recorder.sent.clear()
    accounting.emit_failover({"dag_id": "d", "task_id": "t"}, HANDLE, "docker", "docker_b")
    (kind, name, _, tags), _legacy = recorder.sent
    assert (kind, name, tags["from_platform"], tags["to_conn_id"]) == ("incr", accounting.METRIC_FAILOVERS, "slurm",
                                                                        "docker_b")  # fmt: skip


# --------------------------------------------------------------------------- waiting for resources, per platform


@pytest.mark.parametrize(
    ("reason", "capacity"),
    [
        ("Resources", True),
        ("Priority", True),
        ("PartitionDown", True),
        ("ReqNodeNotAvail,_UnavailableNodes:c1", True),
        ("QOSGrpGRES", True),
        ("AssocMaxJobsLimit", True),
        ("QOSMaxWallDurationPerJobLimit", False),  # no capacity lifts a wall-time limit
        ("PartitionTimeLimit", False),
        ("Dependency", False),
        ("BeginTime", False),
        ("JobHeldUser", False),
        ("None", False),
    ],
)
def test_slurm_pending_reasons_that_mean_waiting_for_resources(reason: str, capacity: bool) -> None:
    queue = sst.parse_squeue(f"12|PENDING|{reason}||{NOW - 30:.0f}\n")
    status = sst.status_of(queue["12"], None)
    assert status.state is JobState.PENDING
    assert status.capacity_wait_since == (NOW - 30 if capacity else None)


def test_slurm_asks_squeue_for_the_submit_time_in_epoch_seconds() -> None:
    assert sst.squeue_command(["1", "2"]).startswith("SLURM_TIME_FORMAT=%s squeue ")
    assert sst.squeue_command(["1"]).endswith("-o '%i|%T|%r|%N|%V'")
    assert sst.parse_squeue("7|RUNNING|None|c1|Unknown\n")["7"].submitted is None


def test_kubernetes_unschedulable_pods_wait_for_resources_since_the_scheduler_said_so() -> None:
    job = {"metadata": {"name": "j", "creationTimestamp": _stamp(NOW - 60)}, "spec": {}, "status": {"active": 1}}
    unschedulable = {
        "metadata": {"name": "j-1", "creationTimestamp": _stamp(NOW - 59)},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "message": "0/2 nodes: 2 Insufficient nvidia.com/gpu",
                            "lastTransitionTime": _stamp(NOW - 58)}],
        },
    }  # fmt: skip
    assert ks.job_status(job, [unschedulable], NOW).capacity_wait_since == NOW - 58
    pulling = {
        "metadata": {"name": "j-1", "creationTimestamp": _stamp(NOW - 59)},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}],
                   "containerStatuses": [{"name": "tao", "state": {"waiting": {"reason": "ContainerCreating"}}}]},
    }  # fmt: skip
    assert ks.job_status(job, [pulling], NOW).capacity_wait_since is None  # waiting, but not for resources


def test_lepton_queueing_waits_for_resources_since_the_jobs_creation() -> None:
    job = {"metadata": {"name": "x", "created_at": (NOW - 20) * 1000}, "spec": {}, "status": {"state": "Queueing"}}
    assert ls.job_status(job, NOW).capacity_wait_since == NOW - 20
    job["status"]["state"] = "Starting"
    assert ls.job_status(job, NOW).capacity_wait_since is None


def test_the_capacity_clock_needs_a_pending_job_a_bound_and_the_time() -> None:
    status = JobStatus(JobState.PENDING, "queued", capacity_wait_since=NOW - 30)
    assert status.capacity_wait_over(None, NOW) is None
    assert status.capacity_wait_over(31, NOW) is None
    assert status.capacity_wait_over(30, NOW) == "waited 30 s for resources (capacity_timeout 30 s): queued"
    assert JobStatus.from_json(status.to_json()) == status  # crosses the trigger boundary
    assert JobStatus(JobState.RUNNING, capacity_wait_since=NOW - 30).capacity_waited(NOW) is None


# --------------------------------------------------------------------------- usage, per platform


def test_slurm_usage_from_sacct_with_gpus_and_their_type() -> None:
    text = f"42|{NOW - 100:.0f}|{NOW - 90:.0f}|{NOW - 18:.0f}|72|2|billing=8,cpu=8,gres/gpu:a100=8,gres/gpu=8,node=2\n"
    usage = sst.parse_usage(text, "42")
    assert usage == JobUsage(queued_at=NOW - 100, started_at=NOW - 90, ended_at=NOW - 18, run_seconds=72.0,
                             gpus_per_node=4, nodes=2, gpu_type="a100", source=usage.source)  # fmt: skip
    never = sst.parse_usage(f"43|{NOW - 10:.0f}|None|{NOW:.0f}|0|1|billing=1,cpu=1,mem=2G,node=1\n", "43")
    assert never is not None and never.started_at is None and never.run_seconds is None and never.gpus_per_node == 0
    assert sst.parse_usage("", "44") is None


def test_kubernetes_usage_from_the_job_and_its_pods() -> None:
    job = {
        "metadata": {"name": "j", "creationTimestamp": _stamp(NOW - 100)},
        "spec": {"completions": 2, "template": {"spec": {
            "nodeSelector": {ks.GPU_PRODUCT_LABEL: "NVIDIA-H100"},
            "containers": [{"name": "tao", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}},
    }  # fmt: skip

    def pod(start: float, end: float | None) -> dict[str, Any]:
        state = {"terminated": {"startedAt": _stamp(start), "finishedAt": _stamp(end)}} if end else {
            "running": {"startedAt": _stamp(start)}}  # fmt: skip
        return {"metadata": {"name": "p"}, "status": {"containerStatuses": [{"name": "tao", "state": state}]}}

    done = ks.usage_of(job, [pod(NOW - 90, NOW - 20), pod(NOW - 88, NOW - 18)])
    assert (done.queued_at, done.started_at, done.ended_at) == (NOW - 100, NOW - 90, NOW - 18)
    assert (done.gpus_per_node, done.nodes, done.gpu_type) == (4, 2, "NVIDIA-H100")
    assert ks.usage_of(job, [pod(NOW - 90, NOW - 20), pod(NOW - 88, None)]).ended_at is None  # one still runs
    assert ks.usage_of(job, []).started_at is None


def test_container_usage_from_docker_state() -> None:
    state = {"Status": "exited", "StartedAt": "2027-01-15T08:00:00.123456789Z", "FinishedAt": "2027-01-15T08:01:00.5Z"}
    usage = ct.container_usage(NOW, state, 2, "docker inspect")
    assert usage.ended_at is not None and usage.started_at is not None
    assert usage.ended_at - usage.started_at == pytest.approx(60.376544, abs=1e-6)
    assert (usage.gpus_per_node, usage.nodes) == (2, 1)
    assert ct.docker_time("0001-01-01T00:00:00Z") is None and ct.docker_time("garbage") is None
    assert ct.docker_time("2027-01-15T09:00:00+01:00") == ct.docker_time("2027-01-15T08:00:00Z")
    restarted = {**state, "Status": "running", "StartedAt": "2027-01-15T08:02:00Z"}
    assert ct.container_usage(NOW, restarted, 0, "x").ended_at is None


@pytest.mark.parametrize(
    ("host_config", "gpus"),
    [
        ({}, 0),
        ({"DeviceRequests": [{"Count": 2, "Capabilities": [["gpu"]]}]}, 2),
        ({"DeviceRequests": [{"DeviceIDs": ["1", "3"], "Capabilities": [["gpu"]]}]}, 2),
        ({"DeviceRequests": [{"Count": -1, "Capabilities": [["gpu"]]}]}, None),
        ({"Runtime": "nvidia"}, None),
    ],
)
def test_container_gpus_from_its_device_requests(host_config: dict[str, Any], gpus: int | None) -> None:
    assert ct.requested_gpus(host_config) == gpus


# --------------------------------------------------------------------------- the trigger's capacity clock


async def test_a_fresh_trigger_judges_the_wait_by_the_backends_clock(fake_platform: type[FakeHook]) -> None:
    """A restarted triggerer rebuilds the trigger from its kwargs; the wait counts from the backend's time, so the
    new trigger moves on as soon as the bound is passed -- not a full capacity_timeout after its restart."""
    fake_platform.queueing = {"fake_conn"}
    job_id = uuid.uuid4().hex[:12]
    handle = FakeHook(conn_id="fake_conn").create_job(JobSpec(name="n", job_id=job_id, command="x"))
    fake_platform.jobs[job_id]["capacity_wait_since"] = time.time() - 50
    kwargs = TAOJobTrigger(handle=handle.to_json(), poll_interval=0.02, capacity_timeout=45).serialize()[1]
    payload = (await asyncio.wait_for(TAOJobTrigger(**kwargs).run().__anext__(), 60)).payload
    waited = re.search(r"waited (\d+) s for resources", payload["message"])
    # 50 s before the trigger started, and whatever a busy machine took since
    assert payload["status"] == "capacity" and waited is not None and int(waited.group(1)) >= 50, payload

    fake_platform.jobs[job_id]["capacity_wait_since"] = time.time()
    calm = TAOJobTrigger(handle=handle.to_json(), poll_interval=0.02, capacity_timeout=45)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(calm.run().__anext__(), 0.3)
