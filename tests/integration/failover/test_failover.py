"""Capacity failover across platforms and GPU-hours accounting, through the operator and the triggerer loop, on the
test backends (the SLURM cluster, the Docker engine, the Kubernetes and Lepton fakes whose pods / replicas run on that
engine, a fake Brev world).

Every count is asked of the backends themselves -- ``sacct`` / ``squeue`` on the cluster, the engine's containers by
label, the fakes' records -- never through our hooks; and every run time the accounting reports is compared with the
one the backend itself reports.
"""

from __future__ import annotations

import json
import shlex
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_tao import accounting
from airflow_provider_tao.hooks.lepton import status as ls
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.operators.failover import CHAIN_KEY, XCOM_ATTEMPTS
from tests.brevfake.control import BrevWorld
from tests.integration.brev.conftest import CONN_ID as BREV
from tests.integration.docker.conftest import DockerEngine
from tests.integration.failover.conftest import DOCKER, KUBERNETES, LEPTON, LEPTON_CAPACITY_SECONDS
from tests.integration.kubernetes.conftest import KubeFake
from tests.integration.lepton.conftest import LeptonFake
from tests.integration.slurm.conftest import SlurmCluster
from tests.integration.taskrun import (
    FileStore,
    Triggerer,
    follow,
    make_operator,
    start,
    wait_submitted,
    worker_process,
)
from tests.statsd_server import StatsdServer

pytestmark = pytest.mark.integration

#: Run times compared with the backend's own are equal within this (the issue's bound).
WITHIN = 0.05


def _prefix(kind: str) -> str:
    """A readable job-name prefix unique to the test (lower-case, letter first: every platform's rule)."""
    return f"fo-{kind}-{uuid.uuid4().hex[:6]}"


def _pushed_attempts(context: dict[str, Any]) -> list[list[dict[str, Any]]]:
    return [c.kwargs["value"] for c in context["ti"].xcom_push.call_args_list if c.kwargs["key"] == XCOM_ATTEMPTS]


def _sacct(cluster: SlurmCluster, name: str) -> list[tuple[str, str, int]]:
    """(job id, state, elapsed seconds) of every Slurm job of this name, from the cluster's accounting."""
    out = cluster.ssh(f"sacct -X -n -P -S now-2hours --name={shlex.quote(name)} -o JobID,State,ElapsedRaw").stdout
    return [(i, s.split()[0], int(e)) for i, s, e in (line.split("|") for line in out.splitlines() if line)]


def _live_in_queue(cluster: SlurmCluster, name: str) -> list[str]:
    out = cluster.ssh(f"squeue -h -n {shlex.quote(name)} -o '%i|%T'", check=False).stdout
    return [line for line in out.splitlines() if line]


def _container_run_seconds(state: dict[str, Any]) -> float:
    started, finished = ct.docker_time(state["StartedAt"]), ct.docker_time(state["FinishedAt"])
    assert started is not None and finished is not None, state
    return finished - started


# --------------------------------------------------------------------------- Lepton -> SLURM


def test_lepton_without_capacity_fails_over_to_slurm_and_succeeds_with_two_attempts(
    chain_connections: dict[str, str],
    lepton_fake: LeptonFake,
    slurm_cluster: SlurmCluster,
    docker_engine: DockerEngine,
    triggerer: Triggerer,
) -> None:
    """Lepton's own capacity bound (the connection's capacity_timeout_seconds) gives up: ERR_CAPACITY; the job is
    submitted on SLURM in the same try and succeeds; both attempts are in its XCom."""
    prefix = _prefix("lep")
    lepton_fake.inject("no_capacity", name_prefix=prefix)
    slurm = chain_connections["slurm"]
    op = make_operator(
        LEPTON,
        job_name=prefix,
        image=docker_engine.busybox,
        command="echo on $TAO_JOB_ID; sleep 5; echo done",
        fallback_conn_ids=[slurm],
        backend_details={slurm: {"oci_bundle": str(slurm_cluster.oci_bundle_py)}},
    )
    run = start(triggerer, op)
    result, runs = follow(run, timeout=180)

    lepton_job, slurm_job = (r.trigger.handle for r in runs)
    assert (lepton_job.platform, slurm_job.platform) == ("lepton", "slurm") and len(runs) == 2
    assert [(a["platform"], a["outcome"]) for a in result["attempts"]] == [
        ("lepton", "capacity"),
        ("slurm", "complete"),
    ]
    assert "ERR_CAPACITY" in result["attempts"][0]["reason"]
    assert result["job_id"] == slurm_job.job_id and result["state"] == "Complete"
    assert [len(a) for a in _pushed_attempts(run.context)] == [1, 2]  # in XCom as each attempt closed
    assert run.store.data[CHAIN_KEY]["conn_id"] == slurm

    # Lepton: the one job of this name never got a node, waited its bound, and was stopped and deleted
    (record,) = [j for j in lepton_fake.jobs() if j["labels"].get(ls.LABEL_NAME) == lepton_job.name]
    assert not any(r["container_id"] for r in record["replicas"]) and record["deleted"]
    assert (
        result["attempts"][0]["queued_seconds"] >= LEPTON_CAPACITY_SECONDS and result["attempts"][0]["gpu_hours"] == 0
    )
    # SLURM: exactly one job of this name, and its accounting is ours: GPUs x nodes x sacct's Elapsed
    ((slurm_id, state, elapsed),) = _sacct(slurm_cluster, slurm_job.name)
    assert (slurm_id, state) == (slurm_job.backend_job_id, "COMPLETED")
    attempt = result["attempts"][1]
    assert attempt["run_seconds"] == pytest.approx(elapsed, rel=WITHIN) and elapsed >= 5
    assert attempt["gpus"] == 0 and attempt["gpu_hours"] == attempt["gpus"] * attempt["nodes"] * elapsed / 3600
    assert "sacct" in attempt["source"]


# --------------------------------------------------------------------------- Kubernetes -> Docker


def test_kubernetes_unschedulable_fails_over_to_docker_on_the_capacity_timeout(
    chain_connections: dict[str, str],
    kubefake: KubeFake,
    docker_engine: DockerEngine,
    triggerer: Triggerer,
    statsd: StatsdServer,
) -> None:
    """Two GPUs fit on no node of the cluster (one each): the pod is Unschedulable -- waiting for resources, the
    shared notion -- and past the task's capacity_timeout the Job is deleted and the job runs on Docker with its two
    GPUs. GPU-hours = 2 x the container's run time; Airflow's StatsD client sends them."""
    op = make_operator(
        KUBERNETES,
        job_name=_prefix("k8s"),
        image=docker_engine.busybox,
        command="echo start; sleep 6; echo done",
        gpu_count=2,
        fallback_conn_ids=[DOCKER],
        capacity_timeout=4,
    )
    run = start(triggerer, op)
    assert run.trigger.capacity_timeout == 4
    result, runs = follow(run, timeout=120)

    k8s_job, docker_job = (r.trigger.handle for r in runs)
    assert [(a["platform"], a["outcome"]) for a in result["attempts"]] == [
        ("kubernetes", "capacity"),
        ("docker", "complete"),
    ]
    reason = result["attempts"][0]["reason"]
    assert "for resources (capacity_timeout 4 s)" in reason and "Insufficient nvidia.com/gpu" in reason
    assert runs[1].trigger.capacity_timeout is None  # the last of the chain: nowhere to go
    kubefake.wait_gone(k8s_job.job_id)  # canceled through the one cancel routine: Job and pods deleted
    (container,) = docker_engine.named(docker_job.name)
    state = docker_engine.state(docker_job.job_id)
    attempt = result["attempts"][1]
    assert container["Labels"][ct.LABEL_JOB_ID] == docker_job.job_id == result["job_id"]
    assert attempt["run_seconds"] == pytest.approx(_container_run_seconds(state), rel=WITHIN)
    assert (attempt["gpus_per_node"], attempt["nodes"]) == (2, 1)
    assert attempt["gpu_hours"] == pytest.approx(2 * _container_run_seconds(state) / 3600, rel=WITHIN)
    assert result["gpu_hours"] == pytest.approx(attempt["gpu_hours"])

    # the metrics went out through Airflow's own StatsD client
    gpu_seconds = statsd.wait_for(accounting.METRIC_GPU_SECONDS, "c")
    assert sorted(gpu_seconds) == [0, round(2 * attempt["run_seconds"])]
    assert statsd.wait_for(f"{accounting.METRIC_GPU_SECONDS}.dag.train", "c")  # for StatsD without tags
    assert statsd.wait_for(accounting.METRIC_FAILOVERS, "c") == [1]
    assert len(statsd.wait_for(accounting.METRIC_RUN_TIME, "ms")) == 2


# --------------------------------------------------------------------------- no failover for the job's own faults


@pytest.mark.parametrize(
    "case",
    [
        ("echo about to fail; exit 3", {}, "ERR_PROGRAM"),
        ("python3 -c 'b = bytearray(512 * 1024 * 1024); print(len(b))'", {"mem_limit": "64m"}, "ERR_OOM"),
    ],
    ids=["program-error", "oom"],
)
@pytest.mark.usefixtures("chain_connections")
def test_a_program_error_or_oom_on_the_first_platform_does_not_fail_over(
    kubefake: KubeFake, docker_engine: DockerEngine, triggerer: Triggerer, case: tuple[str, dict[str, Any], str]
) -> None:
    command, details, err_class = case
    op = make_operator(
        DOCKER,
        job_name=_prefix("prg"),
        image=docker_engine.python,
        command=command,
        fallback_conn_ids=[KUBERNETES],
        capacity_timeout=30,
        backend_details={DOCKER: details},  # per connection: mem_limit is a Docker setting only
    )
    run = start(triggerer, op)
    with pytest.raises(AirflowFailException, match=err_class):
        follow(run, timeout=60)
    assert kubefake.jobs_named(run.trigger.handle.name) == []  # nothing ever went to the next connection
    (attempt,) = run.store.data[CHAIN_KEY]["attempts"]
    assert (attempt["platform"], attempt["outcome"]) == ("docker", "error") and err_class in attempt["reason"]


# --------------------------------------------------------------------------- validation of the whole chain


def test_an_input_a_fallback_platform_cannot_reach_fails_the_task_before_anything_runs(
    chain_connections: dict[str, str],
    slurm_cluster: SlurmCluster,
    docker_engine: DockerEngine,
    triggerer: Triggerer,
    tmp_path: Path,
) -> None:
    """The data is on the worker: the local Docker daemon can mount it, the SLURM cluster cannot see it. The chain
    could never run everywhere, so nothing runs anywhere, and the error names the connection."""
    data = tmp_path / "train.csv"
    data.write_text("1,2\n")
    slurm, prefix = chain_connections["slurm"], _prefix("val")
    op = make_operator(
        DOCKER,
        job_name=prefix,
        image=docker_engine.python,
        command="cat /data/train.csv",
        inputs={"/data/train.csv": f"file://{data}"},
        fallback_conn_ids=[slurm],
        backend_details={slurm: {"oci_bundle": str(slurm_cluster.oci_bundle_py)}},
    )
    with pytest.raises(AirflowFailException, match="Bad input, nothing was submitted") as refused:
        start(triggerer, op)
    assert f"connection {slurm!r} (fallback_conn_ids[0], slurm)" in str(refused.value)
    assert "which SLURM jobs cannot see" in str(refused.value)
    assert not [c for c in docker_engine.containers() if c["Labels"][ct.LABEL_NAME].startswith(prefix)]


# --------------------------------------------------------------------------- durable identity across the chain


def test_a_worker_killed_right_after_the_failover_submission_leaves_one_job_and_the_retry_reattaches(
    chain_connections: dict[str, str],
    slurm_cluster: SlurmCluster,
    docker_engine: DockerEngine,
    triggerer: Triggerer,
    tmp_path: Path,
) -> None:
    """The worker's job waits on a SLURM partition that is down (PartitionDown: waiting for resources) past
    capacity_timeout; it cancels the Slurm job, writes Docker ahead, submits there -- and is SIGKILLed at once. The
    retry finds the Docker job where the chain record points and reattaches: one job on Docker, none left on SLURM."""
    slurm = chain_connections["slurm"]
    store = FileStore(tmp_path / "task_state_store.json")
    run_id = f"manual__{uuid.uuid4().hex[:10]}"
    kwargs: dict[str, Any] = {
        "job_name": _prefix("kill"),
        "fallback_conn_ids": [DOCKER],
        "capacity_timeout": 3,
        "backend_details": {
            slurm: {"partition": slurm_cluster.partition_held, "oci_bundle": str(slurm_cluster.oci_bundle_py)}
        },
    }
    command = "echo start; sleep 8; echo done"
    worker, name = worker_process(slurm, docker_engine.busybox, run_id, command, store=store, **kwargs)
    try:
        wait_submitted(worker, "slurm")
        wait_submitted(worker, "docker")
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    assert store.data[CHAIN_KEY]["conn_id"] == DOCKER  # written before the submission

    retry = start(
        triggerer,
        make_operator(slurm, image=docker_engine.busybox, command=command, **kwargs),
        store=store,
        try_number=2,
        run_id=run_id,
    )
    result, _ = follow(retry, timeout=120)

    containers = docker_engine.named(name)
    assert len(containers) == 1 and containers[0]["Labels"][ct.LABEL_JOB_ID] == result["job_id"]
    assert retry.trigger.handle.try_number == 2 and retry.trigger.handle.platform == "docker"
    assert _live_in_queue(slurm_cluster, name) == []
    assert {state for _, state, _ in _sacct(slurm_cluster, name)} == {"CANCELLED"}
    # the killed try closed the Slurm attempt before it moved; the retry closed the Docker one
    assert [(a["platform"], a["outcome"], a["try_number"]) for a in result["attempts"]] == [
        ("slurm", "capacity", 1),
        ("docker", "complete", 2),
    ]
    assert "PartitionDown" in result["attempts"][0]["reason"]


# --------------------------------------------------------------------------- Brev -> Lepton


def test_brev_refusing_for_capacity_at_creation_fails_over_to_lepton_and_gpu_hours_match_the_replica(
    chain_connections: dict[str, str],
    brev_world: BrevWorld,
    lepton_fake: LeptonFake,
    docker_engine: DockerEngine,
    triggerer: Triggerer,
) -> None:
    """Every type of the Brev chain is sold out: ``brev create`` refuses (ERR_CAPACITY) before any instance exists,
    and the job goes to Lepton within the same submission. GPU-hours = the shape's GPU x the replica's time on its
    node, as the API reports it (placed at its ``metadata.created_at``, until the job's ``completion_time``: no
    client model has a replica's own run time), which holds the container's run."""
    for instance_type in ("g5.xlarge", "g5.2xlarge"):
        brev_world.set_capacity(instance_type, 0)
    op = make_operator(
        BREV,
        job_name=_prefix("brv"),
        image=docker_engine.busybox,
        command="echo start; sleep 8; echo done",
        gpu_count=1,
        fallback_conn_ids=[LEPTON],
    )
    run = start(triggerer, op)
    assert run.trigger.handle.platform == "lepton"  # refused at submission: straight to the next connection
    result, _ = follow(run, timeout=120)

    assert brev_world.instances() == [] and brev_world.job_containers() == []
    refused, ran = result["attempts"]
    assert (refused["platform"], refused["outcome"], refused["backend_job_id"]) == ("brev", "capacity", "")
    assert "ERR_CAPACITY" in refused["reason"] and refused["gpu_hours"] == 0
    (record,) = [j for j in lepton_fake.jobs() if j["labels"].get(ls.LABEL_JOB_ID) == result["job_id"]]
    (replica,) = record["replicas"]
    state = dict(docker_engine.client.inspect_container(replica["container_id"])["State"])
    on_node = record["completion_time"] - replica["placed_at"]
    assert ran["run_seconds"] == pytest.approx(on_node, rel=WITHIN)
    assert ran["run_seconds"] >= _container_run_seconds(state)
    assert (ran["gpus_per_node"], ran["nodes"], ran["gpu_type"]) == (1, 1, "NVIDIA-H100-80GB-HBM3")
    assert ran["gpu_hours"] == pytest.approx(on_node / 3600, rel=WITHIN)


# --------------------------------------------------------------------------- accounting where the chain does not go


def test_brev_gpu_hours_match_the_job_containers_own_times(
    brev_world: BrevWorld, docker_engine: DockerEngine, triggerer: Triggerer
) -> None:
    brev_world.create_instance("box")  # a reused instance keeps the ended container (an ephemeral one is deleted)
    op = make_operator(
        BREV, image=docker_engine.busybox, command="sleep 6; echo done", gpu_count=1,
        backend_details={"instance_id": "box"},
    )  # fmt: skip
    result, _ = follow(start(triggerer, op), timeout=120)
    (attempt,) = result["attempts"]
    (container,) = [c for c in brev_world.job_containers("box") if c["Labels"][ct.LABEL_JOB_ID] == result["job_id"]]
    state = (brev_world.engine().inspect(container["Id"]) or {})["State"]
    gpu = brev_world.state()["types"][brev_world.instance("box")["instance_type"]]["gpu"]
    assert attempt["run_seconds"] == pytest.approx(_container_run_seconds(state), rel=WITHIN)
    assert (attempt["gpus"], attempt["gpu_type"]) == (1, gpu)
    assert attempt["gpu_hours"] == pytest.approx(_container_run_seconds(state) / 3600, rel=WITHIN)


def test_kubernetes_gpu_hours_match_the_pods_own_times(
    chain_connections: dict[str, str], kubefake: KubeFake, docker_engine: DockerEngine, triggerer: Triggerer
) -> None:
    run = start(triggerer, make_operator(KUBERNETES, image=docker_engine.busybox, command="sleep 5", gpu_count=1))
    result, _ = follow(run, timeout=120)
    (attempt,) = result["attempts"]
    (pod,) = kubefake.pods_of(run.trigger.handle.name)
    terminated = pod.status.container_statuses[0].state.terminated
    run_seconds = (terminated.finished_at - terminated.started_at).total_seconds()
    assert attempt["run_seconds"] == pytest.approx(run_seconds, rel=WITHIN) and run_seconds >= 5
    assert attempt["gpu_hours"] == pytest.approx(run_seconds / 3600, rel=WITHIN)


def test_local_gpu_hours_come_from_the_supervisors_own_timestamps(
    tmp_path: Path, triggerer: Triggerer, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = tmp_path / "jobs"
    monkeypatch.setenv("AIRFLOW_CONN_TAO_FO_LOCAL", f'{{"conn_type": "tao_local", "extra": {{"jobs_dir": "{jobs}"}}}}')
    run = start(triggerer, make_operator("tao_fo_local", command="sleep 3"))
    result, _ = follow(run, timeout=60)
    (attempt,) = result["attempts"]
    job = jobs / result["job_id"]
    started = json.loads((job / "pid").read_text())["started_at"]
    finished = json.loads((job / "exit_code").read_text())["finished_at"]
    assert attempt["run_seconds"] == pytest.approx(finished - started, rel=WITHIN) and finished - started >= 3
    assert (attempt["gpus"], attempt["gpu_hours"]) == (0, 0.0)
