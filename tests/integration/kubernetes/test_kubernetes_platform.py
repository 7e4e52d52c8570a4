"""The kubernetes platform through the operator and the triggerer loop, against the fake API server.

Our code reaches the server only through the cncf-kubernetes provider's hooks and the real ``kubernetes`` /
``kubernetes_asyncio`` clients over HTTP; pods run as real containers. Every count (Jobs, pods, Secrets,
ConfigMaps, Services) is asked of the server itself.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import signal
import time
import uuid
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowTaskTimeout
from kubernetes.client.exceptions import ApiException

from airflow_provider_tao.hooks.base import LOG_READ_LIMIT
from airflow_provider_tao.hooks.kubernetes import TAOKubernetesHook
from airflow_provider_tao.hooks.kubernetes.marks import mark_annotation
from airflow_provider_tao.hooks.ownership import CancelOutcome
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobSpec, JobState
from airflow_provider_tao.runner.entrypoint import MANIFEST_NAME
from airflow_provider_tao.triggers.poller import StatusPoller
from tests.integration.docker.conftest import DockerEngine
from tests.integration.kubernetes.conftest import CONN_ID, NAMESPACE, KubeFake
from tests.integration.taskrun import (
    TaskRun,
    Triggerer,
    finish,
    kill,
    make_operator,
    start,
    wait_submitted,
    worker_process,
)
from tests.unit.fakes import Store, make_context
from tests.unit.lifecycle_steps import WorkerDied, die_at

pytestmark = pytest.mark.integration


@pytest.fixture
def hook(kubefake: KubeFake) -> TAOKubernetesHook:
    hook = TAOKubernetesHook(CONN_ID)
    hook.load_connection()
    return hook


def _op(image: str, command: str | list[str], **kwargs: Any) -> Any:
    return make_operator(CONN_ID, image=image, command=command, gpu_count=kwargs.pop("gpu_count", 0), **kwargs)


def _run_id() -> str:
    return f"manual__{uuid.uuid4().hex[:10]}"


def _name(run: TaskRun) -> str:
    return run.trigger.handle.name


# --------------------------------------------------------------------------- outcomes


def test_success_streams_the_log_and_writes_outputs_to_the_results_pvc(
    docker_engine: DockerEngine, kubefake: KubeFake, triggerer: Triggerer, capfd: Any
) -> None:
    """The log is followed over several reads (bounded, by ``since_seconds``: the clients have no ``since_time``),
    each line once; the Job's Secret and ConfigMaps are owned without ``blockOwnerDeletion`` (the fake enforces
    OwnerReferencesPermissionEnforcement, as OpenShift does)."""
    op = _op(
        docker_engine.python,
        "mkdir -p /work/out && echo model of $TAO_JOB_ID > /work/out/model.txt && "
        "for i in 1 2 3 4 5 6; do echo epoch-$i; sleep 0.6; done",
        outputs=["/work/out"],
    )
    kubefake.stats(reset=True)
    run = start(triggerer, op)
    result = finish(run)

    assert result["state"] == "Complete" and result["platform"] == "kubernetes"
    assert result["results_dir"] == f"/results/{run.job_id}"
    out = result["outputs"]["/work/out"]
    assert out.startswith(f"/results/{run.job_id}/")
    written = kubefake.results_dir / out.removeprefix("/results/")  # the PVC's folder on this machine
    assert (written / "model.txt").read_text() == f"model of {run.job_id}\n"
    assert json.loads((written / MANIFEST_NAME).read_text())["files"][0]["path"] == "model.txt"
    logged = capfd.readouterr()
    shown = [
        line.split("[job] ")[1].split()[0] for line in (logged.out + logged.err).splitlines() if "[job] epoch-" in line
    ]
    assert shown == [f"epoch-{i}" for i in range(1, 7)], shown
    reads = kubefake.stats()["log_reads"]
    assert len(reads) >= 3 and any("sinceSeconds" in r for r in reads), reads
    assert all(0 < r["limitBytes"] <= LOG_READ_LIMIT for r in reads), reads
    (job,) = kubefake.jobs_named(_name(run))
    assert job.metadata.uid == result["backend_job_id"] and job.spec.backoff_limit == 0
    assert job.metadata.annotations["tao.nvidia.com/run-id"] == run.context["ti"].run_id  # not a valid label value
    assert job.spec.template.spec.restart_policy == "Never" and job.spec.ttl_seconds_after_finished == 86400
    owned = kubefake.api().list_namespaced_config_map(NAMESPACE, label_selector=f"tao.nvidia.com/job-id={run.job_id}")
    refs = [ref for item in owned.items for ref in item.metadata.owner_references]
    assert refs and all(ref.uid == job.metadata.uid and not ref.block_owner_deletion for ref in refs)
    blocking = {"apiVersion": "batch/v1", "kind": "Job", "name": job.metadata.name, "uid": job.metadata.uid}
    body = {
        "metadata": {"name": f"blocking-{run.job_id}", "ownerReferences": [{**blocking, "blockOwnerDeletion": True}]}
    }
    with pytest.raises(ApiException) as refused:  # the admission plugin is on: the old owner references fail here
        kubefake.api().create_namespaced_config_map(NAMESPACE, body)
    assert refused.value.status == 403 and "blockOwnerDeletion" in str(refused.value.body)


def test_non_zero_exit_is_a_program_error_not_retried(
    docker_engine: DockerEngine, kubefake: KubeFake, triggerer: Triggerer
) -> None:
    run = start(triggerer, _op(docker_engine.busybox, "echo about to fail; exit 3"))
    with pytest.raises(AirflowFailException, match="ERR_PROGRAM"):
        finish(run)
    (job,) = kubefake.jobs_named(_name(run))
    assert job.status.failed == 1 and len(kubefake.pods_of(_name(run))) == 1


def test_out_of_memory_kill_is_err_oom(docker_engine: DockerEngine, kubefake: KubeFake, triggerer: Triggerer) -> None:
    hog = "python3 -c 'b = bytearray(512 * 1024 * 1024); print(len(b))'"
    run = start(triggerer, _op(docker_engine.python, hog, backend_details={"memory": "64Mi"}))
    with pytest.raises(AirflowFailException, match="ERR_OOM"):
        finish(run)
    (pod,) = kubefake.pods_of(_name(run))
    assert pod.status.container_statuses[0].state.terminated.reason == "OOMKilled"


def test_unschedulable_is_pending_with_the_reason_then_err_capacity_and_deleted(
    docker_engine: DockerEngine, kubefake: KubeFake, triggerer: Triggerer, hook: TAOKubernetesHook
) -> None:
    op = _op(docker_engine.busybox, "echo never", gpu_count=4, backend_details={"unschedulable_timeout_seconds": 5})
    run = start(triggerer, op)
    time.sleep(2)
    status = hook.get_job_status(JobHandle.from_json(run.handle))
    assert status.state is JobState.PENDING and "Insufficient nvidia.com/gpu" in status.message, status
    with pytest.raises(AirflowException, match="ERR_CAPACITY") as failed:
        finish(run, timeout=60)
    assert not isinstance(failed.value, AirflowFailException)  # capacity is retriable
    kubefake.wait_gone(run.job_id)  # given up: the Job and its pending pod are deleted, nothing waits for a node


def test_pods_a_quota_refuses_wait_with_the_reason_then_err_capacity_and_the_job_is_deleted(
    docker_engine: DockerEngine,
    kubefake: KubeFake,
    triggerer: Triggerer,
    hook: TAOKubernetesHook,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ResourceQuota refuses the Job's pod: the Job controller records FailedCreate events, the status reads them
    (``involvedObject.uid`` and ``type`` field selectors, both accepted by the strict fake) once the job has waited a
    while -- here the hook's clock runs ahead instead of the test waiting -- and the bound makes it ERR_CAPACITY."""
    from airflow_provider_tao.hooks.kubernetes import hook as module

    ahead = {"seconds": 0.0}
    clock = SimpleNamespace(time=lambda: time.time() + ahead["seconds"], monotonic=time.monotonic, sleep=time.sleep)
    monkeypatch.setattr(module, "time", clock)
    quota = {"metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "0"}}}
    kubefake.api().create_namespaced_resource_quota(NAMESPACE, quota)
    try:
        job_id = uuid.uuid4().hex[:12]
        spec = JobSpec(
            name=f"quota-{job_id[:8]}",
            job_id=job_id,
            command="true",
            image=docker_engine.busybox,
            gpu_count=1,
            backend_details={"unschedulable_timeout_seconds": 60},
        )
        handle = hook.create_job(spec)
        deadline = time.monotonic() + 180
        while (
            not kubefake.api()
            .list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={handle.name},reason=FailedCreate")
            .items
        ):
            assert time.monotonic() < deadline, "no FailedCreate event"
            time.sleep(0.2)
        ahead["seconds"] = 30
        waiting = hook.get_job_status(handle)
        assert (waiting.state, waiting.raw_state) == (JobState.PENDING, "ExceededQuota"), waiting
        assert "exceeded quota: gpus" in waiting.message and waiting.capacity_wait_since is not None
        ahead["seconds"] = 100
        late = triggerer.call(hook.aget_job_statuses([handle]))[handle.job_id]
        assert (late.state, late.raw_state) == (JobState.ERROR, "ExceededQuota"), late
        analysis = hook.get_failure_analysis(handle)
        assert analysis is not None and analysis.err_class is ErrClass.ERR_CAPACITY
        hook.cleanup_job(handle)
        kubefake.wait_gone(job_id)
    finally:
        kubefake.api().delete_namespaced_resource_quota("gpus", NAMESPACE)


def test_image_pull_backoff_is_err_image_pull_not_retried(kubefake: KubeFake, triggerer: Triggerer) -> None:
    run = start(triggerer, _op("local/no-such-image:1", "echo never", backend_details={"start_timeout_seconds": 5}))
    with pytest.raises(AirflowFailException, match="ERR_IMAGE_PULL"):
        finish(run, timeout=60)
    kubefake.wait_gone(run.job_id)


def test_an_eviction_is_retried_by_airflow_with_one_new_job(
    docker_engine: DockerEngine, kubefake: KubeFake, triggerer: Triggerer
) -> None:
    run_id = _run_id()
    first = start(triggerer, _op(docker_engine.busybox, "sleep 30"), run_id=run_id)
    pod = kubefake.wait_running(_name(first))
    kubefake.evict(pod.metadata.name)
    with pytest.raises(AirflowException, match="ERR_PREEMPTED") as failed:
        finish(first, timeout=60)
    assert not isinstance(failed.value, AirflowFailException)

    retry = start(triggerer, _op(docker_engine.busybox, "echo second"), store=first.store, try_number=2, run_id=run_id)
    assert retry.job_id != first.job_id and _name(retry) == _name(first)
    result = finish(retry)
    (job,) = kubefake.jobs_named(_name(first))  # one Job of this name: the new one
    assert result["state"] == "Complete" and job.metadata.labels["tao.nvidia.com/job-id"] == retry.job_id


def test_two_node_indexed_job_gets_ranks_and_one_master_address(
    docker_engine: DockerEngine, kubefake: KubeFake, triggerer: Triggerer
) -> None:
    command = (
        'out="$TAO_RESULTS_ROOT/$TAO_JOB_ID"; mkdir -p "$out"; '
        "resolved=no; for i in $(seq 40); do "
        'getent hosts "$MASTER_ADDR" > /dev/null && { resolved=yes; break; }; sleep 0.25; done; '
        'echo "$NODE_RANK $MASTER_ADDR $MASTER_PORT $WORLD_SIZE $NNODES $resolved" > "$out/rank-$NODE_RANK"; '
        "sleep 3"  # rank 0 stays up (and resolvable) while rank 1 looks it up, as a rendezvous would
    )
    run = start(triggerer, _op(docker_engine.python, command, num_nodes=2))
    result = finish(run)
    ranks = {
        int(path.name.split("-")[1]): path.read_text().split()
        for path in (kubefake.results_dir / run.job_id).glob("rank-*")
    }
    name = _name(run)
    assert result["state"] == "Complete" and sorted(ranks) == [0, 1]
    assert ranks[0][1:] == ranks[1][1:] == [f"{name}-0.{name}", "29500", "2", "2", "yes"]
    (service,) = (
        kubefake.api().list_namespaced_service(NAMESPACE, label_selector=f"tao.nvidia.com/job-id={run.job_id}").items
    )
    assert service.spec.cluster_ip == "None" and service.metadata.name == name
    assert len(kubefake.pods_of(name)) == 2


# --------------------------------------------------------------------------- cancel: nothing orphaned


def test_mark_failed_while_deferred_deletes_the_job_its_pods_and_its_secret(
    docker_engine: DockerEngine, kubefake: KubeFake, triggerer: Triggerer, storage: str
) -> None:
    # the in-job runner (storage) needs python3: on busybox the job itself failed ERR_CONFIG at once, and on a
    # loaded machine before the mark -- a finished Job stays until its TTL, so the test raced the job's own end
    run = start(triggerer, _op(docker_engine.python, "sleep 60", storage_conn_id=storage))
    kubefake.wait_running(_name(run))
    owned = kubefake.objects_of(run.job_id)
    assert set(owned) == {"jobs", "pods", "secrets", "configmaps"}, owned
    kill(run)
    kubefake.wait_gone(run.job_id)


def test_execution_timeout_deletes_everything(
    docker_engine: DockerEngine, kubefake: KubeFake, triggerer: Triggerer
) -> None:
    run = start(triggerer, _op(docker_engine.busybox, "sleep 60", execution_timeout=timedelta(seconds=6)))
    kubefake.wait_running(_name(run))
    with pytest.raises(AirflowTaskTimeout):
        finish(run, timeout=60)
    kubefake.wait_gone(run.job_id)


def test_cancel_on_kill_false_leaves_the_job(
    docker_engine: DockerEngine, kubefake: KubeFake, triggerer: Triggerer, hook: TAOKubernetesHook
) -> None:
    run = start(triggerer, _op(docker_engine.busybox, "sleep 3", cancel_on_kill=False))
    kubefake.wait_running(_name(run))
    kill(run)
    assert hook.get_job_status(JobHandle.from_json(run.handle)).state in (JobState.RUNNING, JobState.COMPLETE)


def test_issue_22_hole_2_a_persons_cancel_stays_final_though_the_job_is_stopped(
    docker_engine: DockerEngine, kubefake: KubeFake, triggerer: Triggerer, hook: TAOKubernetesHook
) -> None:
    """``airflow tao cancel`` of a deferred task's Job: the task must read who canceled it and fail for good
    (ERR_CANCELED, nothing resubmitted), so the cancel may not delete the Job that carries the mark."""
    run = start(triggerer, _op(docker_engine.busybox, "sleep 300"))
    kubefake.wait_running(_name(run))
    assert hook.cancel_job(JobHandle.from_json(run.handle), requested_by="cli:jdoe") is CancelOutcome.STOPPED
    with pytest.raises(AirflowFailException, match=r"ERR_CANCELED.*canceled by cli:jdoe"):
        finish(run, timeout=60)
    kubefake.wait_gone(run.job_id)  # deleted, with its pods, once the task read the verdict
    assert [c["name"] for c in kubefake.created() if c["name"] == _name(run)] == [_name(run)]  # one Job ever


def test_issue_22_hole_3_an_old_trys_cancel_leaves_the_job_a_newer_try_claimed_meanwhile(
    docker_engine: DockerEngine, kubefake: KubeFake, triggerer: Triggerer, hook: TAOKubernetesHook,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Try 1's cancel read the Job as its own; right before it suspends it, a clear's try 2 claims it: the
    suspension holds only for the marks read (a JSON patch's test operations), so try 2's Job runs on."""
    run = start(triggerer, _op(docker_engine.busybox, "sleep 300"))
    kubefake.wait_running(_name(run))
    handle = JobHandle.from_json(run.handle)
    real_call = TAOKubernetesHook._call

    def claimed_meanwhile(self: TAOKubernetesHook, group: str, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "patch_namespaced_job" and "/spec/suspend" in json.dumps(args[2]):
            hook.claim_job(handle.owned_by(2))  # the new try reattaches between the check and the act
        return real_call(self, group, method, *args, **kwargs)

    monkeypatch.setattr(TAOKubernetesHook, "_call", claimed_meanwhile)
    assert hook.cancel_job(handle) is CancelOutcome.NOT_OURS
    assert hook.get_job_status(handle).state is JobState.RUNNING
    run.future.cancel()
    monkeypatch.undo()
    assert hook.cancel_job(handle.owned_by(2)) is CancelOutcome.STOPPED and hook.cleanup_job(handle) is None
    kubefake.wait_gone(run.job_id)


@pytest.mark.parametrize("old_job", ["suspended", "deleted"])
def test_a_new_trys_job_waits_for_the_canceled_jobs_pods_to_be_gone(
    docker_engine: DockerEngine, kubefake: KubeFake, hook: TAOKubernetesHook, old_job: str
) -> None:
    """Found by the explorer (clear at ``trigger:aget_job_statuses#1``): an older try's cancel suspends Job A, the new
    try creates B -- while A's pod, in its termination grace (a trainer that takes its time over SIGTERM), still
    runs. B's pod must not start beside it: two jobs of one task instance at once. ``suspended``: the create finds A
    and deletes it; ``deleted``: A is gone already (the resumed try's cleanup after "canceled by an older try", with
    Background deletion the Job object goes at once and its pods after their grace), so the create meets no
    conflict -- the case the explorer's slice found again under load."""
    spec = JobSpec(name=f"regrace-{uuid.uuid4().hex[:8]}", job_id=uuid.uuid4().hex[:12], gpu_count=0,
                   command="trap 'sleep 3; exit 143' TERM; sleep 300 & wait", image=docker_engine.busybox)  # fmt: skip
    first = hook.create_job(spec)
    kubefake.wait_running(spec.name)
    # suspended: its pod has 2 s of grace, wants 3
    assert hook.cancel_job(first, requested_by="an older try") is CancelOutcome.STOPPED
    if old_job == "deleted":
        kubefake.api("batch").delete_namespaced_job(spec.name, NAMESPACE, propagation_policy="Background")
    second = hook.create_job(spec, try_number=2)
    assert second.backend_job_id != first.backend_job_id
    left = [p.metadata.name for p in kubefake.pods_of(spec.name)
            if (p.metadata.labels or {}).get("controller-uid") == first.backend_job_id]  # fmt: skip
    assert not left, f"Job {spec.name}'s new Job was created beside its old pods {left}"
    hook.cancel_job(second)
    hook.cleanup_job(second)


def test_issue_22_hole_6_a_job_left_suspended_by_a_dead_worker_is_reaped_with_what_it_owns(
    docker_engine: DockerEngine, kubefake: KubeFake, hook: TAOKubernetesHook, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker dies after the suspended Job and its Secret and ConfigMaps exist, before it starts the Job: no
    TTL, no deadline and no record cover it; ``airflow tao reap`` deletes it (and what it owns) past the setup
    window, and keeps a Job still being set up."""
    from airflow_provider_tao import sweeper
    from airflow_provider_tao.hooks.kubernetes import status as kubernetes_status
    from airflow_provider_tao.jobs import JobSpec

    spec = JobSpec(name=f"lost-{uuid.uuid4().hex[:8]}", job_id=uuid.uuid4().hex[:12], command="sleep 300",
                   gpu_count=0, image=docker_engine.busybox, secret_env={"TOKEN": "s3cret-value"},
                   files={"spec.yaml": b"a: 1"})  # fmt: skip
    die_at(monkeypatch, "start", hook=TAOKubernetesHook, after=False)
    with pytest.raises(WorkerDied):
        hook.create_job(spec)
    assert set(kubefake.objects_of(spec.job_id)) == {"jobs", "secrets", "configmaps"}
    mine = (spec.name, "deleted")
    rows = sweeper.sweep_machines(hook, lambda origin: None, dry_run=False)
    assert mine not in [(r["name"], r["action"]) for r in rows]  # still in its setup window
    monkeypatch.setattr(kubernetes_status, "SETUP_TIMEOUT_SECONDS", 0.0)
    time.sleep(1)  # creation times have whole seconds
    rows = sweeper.sweep_machines(hook, lambda origin: None, dry_run=False)
    assert mine in [(r["name"], r["action"]) for r in rows], rows
    kubefake.wait_gone(spec.job_id)


# --------------------------------------------------------------------------- durable identity


def test_worker_sigkill_right_after_submission_then_the_retry_runs_one_job(
    docker_engine: DockerEngine, kubefake: KubeFake, triggerer: Triggerer
) -> None:
    run_id = _run_id()
    worker, name = worker_process(CONN_ID, docker_engine.busybox, run_id, "sleep 4; echo done")
    wait_submitted(worker, "kubernetes")
    worker.send_signal(signal.SIGKILL)  # the store write may not have happened
    worker.wait()

    retry = start(triggerer, _op(docker_engine.busybox, "sleep 4; echo done"), try_number=2, run_id=run_id)
    assert _name(retry) == name
    result = finish(retry)
    (job,) = kubefake.jobs_named(name)
    assert result["state"] == "Complete" and job.metadata.uid == result["backend_job_id"]
    assert json.loads(job.metadata.annotations[mark_annotation("owner_try")]) == 2


def test_clear_while_deferred_runs_exactly_one_job_to_completion(
    docker_engine: DockerEngine, kubefake: KubeFake, triggerer: Triggerer, hook: TAOKubernetesHook
) -> None:
    run_id = _run_id()
    first = start(triggerer, _op(docker_engine.busybox, "sleep 4; echo finished"), run_id=run_id)
    second = start(
        triggerer, _op(docker_engine.busybox, "sleep 4; echo finished"), store=first.store, try_number=2, run_id=run_id
    )
    assert second.job_id == first.job_id
    kill(first)  # try 1's on_kill: try 2 owns the job now, so nothing is deleted
    result = finish(second)
    (job,) = kubefake.jobs_named(_name(first))
    assert result["state"] == "Complete" and job.status.succeeded == 1
    marks = hook.read_marks(JobHandle.from_json(second.handle))
    assert marks.get("owner_try") == 2 and "cancel_requested_by" not in marks and marks.get("consumed_by") == 2


# --------------------------------------------------------------------------- polling


def test_one_job_list_per_interval_whatever_the_number_of_jobs_and_pods_only_when_needed(
    docker_engine: DockerEngine, kubefake: KubeFake, triggerer: Triggerer
) -> None:
    runs = [start(triggerer, _op(docker_engine.busybox, "sleep 8", stream_logs=False)) for _ in range(4)]
    for run in runs:
        kubefake.wait_running(_name(run))
    poller = StatusPoller._instances[next(k for k in StatusPoller._instances if k[1:] == ("kubernetes", CONN_ID))]
    kubefake.stats(reset=True)
    calls = poller.calls
    time.sleep(4)
    counts = kubefake.stats()["by"]
    polls = poller.calls - calls
    assert polls >= 3
    assert counts.get("GET jobs (list)", 0) <= polls + 1, counts
    # Running Jobs say so themselves (status.ready): their pods are listed at most once (the controller's lag).
    assert counts.get("GET pods (list)", 0) <= 1, counts
    assert not any(key.startswith("GET jobs") and "list" not in key for key in counts), counts  # no per-job read
    for run in runs:
        assert finish(run)["state"] == "Complete"


# --------------------------------------------------------------------------- large specs, secrets

SECRET = f"k8s-secret-{uuid.uuid4().hex[:8]}"
AUTHOR_SECRET = f"k8s-author-secret-{uuid.uuid4().hex[:8]}"  # a DAG author's own (secret_env, issue 38.6)


@pytest.fixture
def storage(monkeypatch: pytest.MonkeyPatch) -> str:
    """An ``aws`` connection whose secret key is :data:`SECRET`: the job receives it as secret environment."""
    conn = {"conn_type": "aws", "login": "AKIDKUBEFAKE", "password": SECRET, "extra": {"region_name": "us-east-1"}}
    monkeypatch.setenv("AIRFLOW_CONN_S3_K8S", json.dumps(conn))
    monkeypatch.setenv("AIRFLOW_CONN_K8S_AUTHOR", json.dumps({"conn_type": "generic", "password": AUTHOR_SECRET}))
    return "s3_k8s"


CHECK = r"""
import hashlib, json, os, sys
spec = json.load(open(sys.argv[1]))
blob = spec["train"]["blob"]
key = os.environ["AWS_SECRET_ACCESS_KEY"]
print("spec", len(blob), hashlib.sha256(blob.encode()).hexdigest() == os.environ["WANT_SPEC"])
print("secret", hashlib.sha256(key.encode()).hexdigest() == os.environ["WANT_KEY"])
print("author", hashlib.sha256(os.environ["AUTHOR"].encode()).hexdigest() == os.environ["WANT_AUTHOR"])
os.makedirs(spec["train"]["results_dir"], exist_ok=True)
open(os.path.join(spec["train"]["results_dir"], "ok"), "w").write("ok")
"""


def test_a_4_mib_spec_reaches_the_job_and_no_secret_value_is_in_any_object_or_log(
    docker_engine: DockerEngine, kubefake: KubeFake, triggerer: Triggerer, storage: str, capfd: Any
) -> None:
    blob = secrets.token_hex(2 * 1024 * 1024)  # 4 MiB of text
    op = _op(
        docker_engine.python,
        ["python3", "-c", CHECK, "{config_path}"],
        storage_conn_id=storage,
        specs={"train": {"blob": blob, "results_dir": "output"}},
        outputs=["train.results_dir"],
        config_format="json",
        env={
            "WANT_SPEC": hashlib.sha256(blob.encode()).hexdigest(),
            "WANT_KEY": hashlib.sha256(SECRET.encode()).hexdigest(),
            "WANT_AUTHOR": hashlib.sha256(AUTHOR_SECRET.encode()).hexdigest(),
        },
        secret_env={"AUTHOR": "conn:k8s_author.password"},
    )
    run = start(triggerer, op)
    kubefake.wait_running(_name(run), timeout=120)
    dumped = _every_object(kubefake, run.job_id)
    result = finish(run, timeout=180)

    logged = capfd.readouterr()
    assert f"[job] spec {len(blob)} True" in logged.out + logged.err
    assert "[job] secret True" in logged.out + logged.err
    assert "[job] author True" in logged.out + logged.err
    assert result["state"] == "Complete"
    assert len(json.loads(dumped["configmaps"])["items"]) >= 3  # the files, in chunks under the 1 MiB object limit
    for resource, text in dumped.items():
        if resource != "secrets":
            assert SECRET not in text, f"the secret is in a {resource} object"
            assert AUTHOR_SECRET not in text, f"the secret_env value is in a {resource} object"
    job_and_pods = dumped["jobs"] + dumped["pods"]
    assert "secretRef" in job_and_pods and "AWS_SECRET_ACCESS_KEY" not in job_and_pods
    assert SECRET not in logged.out + logged.err and SECRET not in json.dumps(result)
    assert AUTHOR_SECRET not in logged.out + logged.err
    assert AUTHOR_SECRET not in json.dumps(run.deferred.trigger.serialize())


def _every_object(fake: KubeFake, job_id: str) -> dict[str, str]:
    """Each resource's objects of one job as the API serves them (JSON text)."""
    import urllib.request

    texts: dict[str, str] = {}
    for resource, prefix in (
        ("jobs", "/apis/batch/v1"),
        ("pods", "/api/v1"),
        ("configmaps", "/api/v1"),
        ("secrets", "/api/v1"),
        ("services", "/api/v1"),
    ):
        url = f"{fake.url}{prefix}/namespaces/{NAMESPACE}/{resource}?labelSelector=tao.nvidia.com/job-id%3D{job_id}"
        with urllib.request.urlopen(url, timeout=30) as response:
            texts[resource] = response.read().decode()
    return texts


def test_bad_input_is_refused_before_anything_is_created(kubefake: KubeFake, hook: TAOKubernetesHook) -> None:
    before = kubefake.objects().get("jobs", [])
    for kwargs, parameter in (
        ({"gpu_count": -1}, "gpu_count"),
        ({"backend_details": {"memory": "lots"}}, "backend_details['memory']"),
        ({"results_uri": "/mnt/results"}, "results_uri"),
        ({"backend_details": {"gpus": 2}}, "backend_details['gpus']"),
        (
            {"backend_details": {"tolerations": '[{"key": "gpu", "operator": "Sometimes"}]'}},
            "backend_details['tolerations'][0]",
        ),
    ):
        op = _op("local/busybox:ci", "true", deferrable=False, **kwargs)
        with pytest.raises(AirflowFailException, match=f"nothing was submitted: {re.escape(parameter)}"):
            op.execute(make_context(Store(), 1, _run_id()))
    assert kubefake.objects().get("jobs", []) == before


def test_a_starting_fake_removes_the_pod_containers_of_fakes_that_died_and_keeps_a_live_ones(
    docker_engine: DockerEngine,
) -> None:
    """Test hygiene: a fake killed without its cleanup (SIGKILL, a killed session) leaves its pods' containers on
    the shared engine, where later tests would count them; the next fake to start removes them."""
    import contextlib
    import subprocess
    import sys

    from tests.kubefake.cluster import DockerRuntime

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    live = subprocess.Popen(["sleep", "60"])
    client = docker_engine.client
    made = {
        who: client.create_container(docker_engine.busybox, "true", labels={"kubefake.server-pid": str(pid)})["Id"]
        for who, pid in (("dead", int(dead.stdout)), ("live", live.pid))
    }
    try:
        DockerRuntime(docker_engine.host)
        left = {c["Id"] for c in client.containers(all=True, filters={"label": "kubefake.server-pid"})}
        assert made["dead"] not in left and made["live"] in left
    finally:
        live.kill()
        live.wait()
        for cid in made.values():
            with contextlib.suppress(Exception):
                client.remove_container(cid, force=True)
