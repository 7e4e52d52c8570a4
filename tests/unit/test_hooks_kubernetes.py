"""The kubernetes hook without a server: the status rule, the Job it builds, validation, the files' chunks."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import secrets
import tarfile
import time
from typing import Any

import pytest

from airflow_provider_tao.failures import FailureFacts, classify
from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.hooks.kubernetes.hook import TAOKubernetesHook
from airflow_provider_tao.hooks.kubernetes.spec import PART_SIZE
from airflow_provider_tao.hooks.kubernetes.status import ANNOTATION_RESUMED, events_needed, job_status, pods_needed
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.hooks.shared.container import label_value
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobSpec, JobState

NOW = time.time()


def _stamp(seconds_ago: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - seconds_ago))


def _job(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "j",
            "uid": "u",
            "creationTimestamp": _stamp(100),
            "annotations": {"tao.nvidia.com/unschedulable-timeout": "60", "tao.nvidia.com/start-timeout": "120"},
        },
        "spec": {"suspend": status.pop("suspend", False)},
        "status": status,
    }


def _pod(phase: str, state: dict[str, Any], **extra: Any) -> dict[str, Any]:
    conditions = extra.pop("conditions", [{"type": "PodScheduled", "status": "True", "lastTransitionTime": _stamp(50)}])
    return {
        "metadata": {"name": "j-abcde", "uid": "p", "creationTimestamp": _stamp(60), "annotations": {}},
        "status": {
            "phase": phase,
            "conditions": conditions,
            "containerStatuses": [{"name": "tao", "state": state}],
            **extra,
        },
    }


def _failed() -> list[dict[str, Any]]:
    return [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "backoff"}]


# --------------------------------------------------------------------------- the status rule


def test_running_only_while_a_container_runs() -> None:
    creating = _pod("Pending", {"waiting": {"reason": "ContainerCreating"}})
    assert job_status(_job(active=1), [creating], NOW).state is JobState.PENDING  # active counts pending pods too
    running = _pod("Running", {"running": {"startedAt": _stamp(5)}})
    assert job_status(_job(active=1), [running], NOW).state is JobState.RUNNING


def test_unschedulable_is_pending_with_the_reason_then_an_error_past_its_bound() -> None:
    message = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    pod = _pod(
        "Pending",
        {},
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": _stamp(20),
            }
        ],
    )
    pending = job_status(_job(active=1), [pod], NOW)
    assert pending.state is JobState.PENDING and message in pending.message and pending.raw_state == "Unschedulable"
    late = job_status(_job(active=1), [pod], NOW + 60)
    assert late.state is JobState.ERROR and late.raw_state == "Unschedulable" and message in late.message
    assert classify(FailureFacts(raw_state=late.raw_state)).err_class is ErrClass.ERR_CAPACITY


@pytest.mark.parametrize(
    ("reason", "err_class"),
    [
        ("ImagePullBackOff", ErrClass.ERR_IMAGE_PULL),
        ("ErrImagePull", ErrClass.ERR_IMAGE_PULL),
        ("CreateContainerConfigError", ErrClass.ERR_CONFIG),
    ],
)
def test_a_pod_that_cannot_start_is_an_error_past_the_start_bound(reason: str, err_class: ErrClass) -> None:
    pod = _pod("Pending", {"waiting": {"reason": reason, "message": "why"}})
    assert job_status(_job(active=1), [pod], NOW).state is JobState.PENDING
    late = job_status(_job(active=1), [pod], NOW + 100)
    assert late.state is JobState.ERROR and late.raw_state == reason
    assert classify(FailureFacts(raw_state=late.raw_state)).err_class is err_class


def test_failed_jobs_say_why_from_their_pods() -> None:
    oom = _pod("Failed", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}})
    status = job_status(_job(conditions=_failed()), [oom], NOW)
    assert (status.state, status.raw_state, status.exit_code) == (JobState.ERROR, "OOMKilled", 137)
    evicted = _pod("Failed", {"terminated": {"exitCode": 137, "reason": "Error"}}, reason="Evicted", message="low mem")
    status = job_status(_job(conditions=_failed()), [evicted], NOW)
    assert status.raw_state == "Evicted" and "low mem" in status.message
    assert classify(FailureFacts(exit_code=137, raw_state="Evicted")).err_class is ErrClass.ERR_PREEMPTED
    program = _pod("Failed", {"terminated": {"exitCode": 3, "reason": "Error"}})
    assert job_status(_job(conditions=_failed()), [program], NOW).exit_code == 3
    deadline = [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "too long"}]
    assert job_status(_job(conditions=deadline), [], NOW).raw_state == "DeadlineExceeded"


def test_complete_suspended_and_deleting_jobs() -> None:
    done = [{"type": "Complete", "status": "True"}]
    assert job_status(_job(conditions=done), [], NOW).state is JobState.COMPLETE
    assert job_status(_job(suspend=True), [], NOW - 90).state is JobState.PENDING  # being set up
    assert job_status(_job(suspend=True), [], NOW).state is JobState.ERROR  # its worker died mid-submission
    deleting = _job()
    deleting["metadata"]["deletionTimestamp"] = _stamp(1)
    assert job_status(deleting, [], NOW).state is JobState.CANCELING


def test_a_poll_lists_pods_only_when_a_jobs_own_status_cannot_settle_its_state() -> None:
    def labelled(job: dict[str, Any], job_id: str) -> dict[str, Any]:
        job["metadata"]["labels"] = {ct.LABEL_JOB_ID: job_id}
        return job

    running = labelled(_job(active=1, ready=1), "a")
    done = labelled(_job(conditions=[{"type": "Complete", "status": "True"}]), "b")
    assert not pods_needed([running, done], {"a", "b"})
    assert not pods_needed([running], {"a", "gone"})  # a vanished Job is "not found", its pods do not matter
    assert not pods_needed([running, labelled(_job(active=1), "other")], {"a"})  # not watched here
    # Pending (or a cluster that does not report status.ready): the reason is in the pods.
    assert pods_needed([labelled(_job(active=1), "c")], {"c"})
    assert pods_needed([labelled(_job(active=1, ready=1, conditions=_failed()), "d")], {"d"})  # the culprit
    deleting = labelled(_job(active=1, ready=1), "e")
    deleting["metadata"]["deletionTimestamp"] = _stamp(1)
    assert pods_needed([deleting], {"e"})
    # Without its pods, a Job with a ready pod is Running (a pod is Ready only while its containers run).
    status = job_status(_job(active=2, ready=1), [], NOW)
    assert (status.state, status.message) == (JobState.RUNNING, "1/2 pod(s) of Job j running")


def _warning(reason: str, message: str) -> dict[str, Any]:
    return {"type": "Warning", "reason": reason, "message": message, "involvedObject": {"name": "j"}}


def _verdict(status: Any) -> ErrClass:
    return classify(FailureFacts(raw_state=status.raw_state, message=status.message)).err_class


@pytest.mark.parametrize(
    ("message", "raw_state", "err_class", "bound"),
    [
        (
            'Error creating: pods "j-x" is forbidden: violates PodSecurity "restricted:latest": privileged',
            "FailedCreate",
            ErrClass.ERR_CONFIG,
            120,
        ),
        (
            'Error creating: admission webhook "policy.example.com" denied the request',
            "FailedCreate",
            ErrClass.ERR_CONFIG,
            120,
        ),
        (
            'Error creating: pods "j-x" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=2, '
            "used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8",
            "ExceededQuota",
            ErrClass.ERR_CAPACITY,
            60,
        ),
    ],
)
def test_pods_never_created_say_why_from_the_jobs_events_and_are_bounded(
    message: str, raw_state: str, err_class: ErrClass, bound: int
) -> None:
    job = _job(active=0, startTime=_stamp(20))
    assert events_needed(job, [], NOW) == ["u"] and events_needed(job, [], NOW - 15) == []  # only after a while
    warnings = {"u": [_warning("FailedCreate", message)]}
    pending = job_status(job, [], NOW, warnings)
    assert pending.state is JobState.PENDING and message in pending.message and pending.raw_state == raw_state
    assert (pending.capacity_wait_since is not None) is (err_class is ErrClass.ERR_CAPACITY)  # a quota frees up
    assert job_status(job, [], NOW + bound - 30, warnings).state is JobState.PENDING
    late = job_status(job, [], NOW + bound, warnings)
    assert late.state is JobState.ERROR and message in late.message and _verdict(late) is err_class
    assert job_status(job, [], NOW + 120).state is JobState.ERROR  # no event at all: still bounded


def test_a_pod_stuck_in_container_creating_says_why_and_is_bounded_but_an_image_pull_is_not() -> None:
    multi_attach = 'Multi-Attach error for volume "pvc-0d1e" Volume is already used by pod(s) other-job-abcde on node-2'
    pod = _pod("Pending", {"waiting": {"reason": "ContainerCreating"}})
    assert events_needed(_job(active=1), [pod], NOW) == ["p"]
    warnings = {
        "p": [
            _warning("FailedMount", "timed out waiting for the condition"),
            _warning("FailedAttachVolume", multi_attach),
        ]
    }
    pending = job_status(_job(active=1), [pod], NOW, warnings)
    assert pending.state is JobState.PENDING and multi_attach in pending.message and "ReadWriteMany" in pending.message
    late = job_status(_job(active=1), [pod], NOW + 100, warnings)
    assert (late.state, late.raw_state) == (JobState.ERROR, "FailedAttachVolume") and _verdict(
        late
    ) is ErrClass.ERR_CONFIG
    # no Warning: a (large) image being pulled; the kubelet turns a stalled pull into ErrImagePull itself
    assert job_status(_job(active=1), [pod], NOW + 3600).state is JobState.PENDING


def test_a_scheduling_gate_is_a_bounded_wait_for_capacity() -> None:
    gated = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated", "lastTransitionTime": _stamp(20)}
    pod = _pod(
        "Pending", {}, conditions=[{**gated, "message": "Scheduling is blocked due to non-empty scheduling gates"}]
    )
    pending = job_status(_job(active=1), [pod], NOW)
    assert pending.state is JobState.PENDING and pending.capacity_wait_since == pytest.approx(NOW - 20, abs=1)
    late = job_status(_job(active=1), [pod], NOW + 60)
    assert (late.state, late.raw_state) == (JobState.ERROR, "SchedulingGated") and _verdict(
        late
    ) is ErrClass.ERR_CAPACITY


def test_an_image_that_may_never_be_pulled_is_an_image_pull_error_past_the_start_bound() -> None:
    pod = _pod("Pending", {"waiting": {"reason": "ErrImageNeverPull", "message": 'Container image "x" is not present'}})
    assert job_status(_job(active=1), [pod], NOW).state is JobState.PENDING
    late = job_status(_job(active=1), [pod], NOW + 100)
    assert late.state is JobState.ERROR and _verdict(late) is ErrClass.ERR_IMAGE_PULL


def _kueue_held() -> dict[str, Any]:
    job = _job(suspend=True, conditions=[{"type": "Suspended", "status": "True", "lastTransitionTime": _stamp(30)}])
    job["metadata"]["annotations"][ANNOTATION_RESUMED] = str(int(NOW - 90))
    job["metadata"]["labels"] = {ct.LABEL_JOB_ID: "abc"}
    return job


def test_a_job_a_queue_suspended_after_our_resume_is_queued_capacity_not_a_dead_submission() -> None:
    status = job_status(_kueue_held(), [], NOW + 86400)
    assert status.state is JobState.PENDING and status.raw_state == "Queued"
    assert status.capacity_wait_since == pytest.approx(NOW - 30, abs=1)  # the operator's capacity_timeout bounds it
    assert events_needed(_kueue_held(), [], NOW) == []


def test_a_retry_reattaches_to_a_job_a_queue_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = TAOKubernetesHook("k8s_unit")
    monkeypatch.setenv("AIRFLOW_CONN_K8S_UNIT", '{"conn_type": "tao_kubernetes"}')
    deleted: list[str] = []
    monkeypatch.setattr(hook, "_read_job", lambda name: _kueue_held())
    monkeypatch.setattr(hook, "_delete", lambda name, uid: deleted.append(name))
    handle = hook.find_job("j")
    assert handle is not None and handle.job_id == "abc" and not deleted


# --------------------------------------------------------------------------- the Job it builds


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> TAOKubernetesHook:
    extra = {
        "namespace": "train",
        "results_pvc": "results",
        "node_selector": '{"gpu": "a100"}',
        "image_pull_secret": "regcred",
    }
    conn = {"conn_type": "tao_kubernetes", "password": "ngc-key-123", "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_K8S_UNIT", json.dumps(conn))
    hook = TAOKubernetesHook("k8s_unit")
    hook.load_connection()
    return hook


def _spec(**kwargs: Any) -> JobSpec:
    base: dict[str, Any] = {
        "name": "dag-train-0123456789",
        "job_id": "abcdef012345",
        "command": "python train.py",
        "image": "nvcr.io/nvidia/tao/tao-toolkit:6.0-pyt",
        "gpu_count": 2,
        "secret_env": {"AWS_SECRET_ACCESS_KEY": "s3cr3t-value"},
        "files": {"runner.py": b"print(1)"},
        "origin": {
            "dag_id": "my.dag",
            "task_id": "train",
            "run_id": "manual__2026-11-25T10:00:00+00:00",
            "map_index": "-1",
        },
    }
    return JobSpec(**{**base, **kwargs})


def _handle(hook: TAOKubernetesHook, spec: JobSpec) -> JobHandle:
    return hook.new_handle(spec, 1)


def test_the_job_carries_no_secret_and_has_what_a_gpu_job_needs(hook: TAOKubernetesHook) -> None:
    spec = _spec(backend_details={"memory": "32Gi", "cpu": "8"})
    body = hook._job_body(spec, _handle(hook, spec), parts=1)
    text = json.dumps(body)
    assert "s3cr3t-value" not in text and "ngc-key-123" not in text and "AWS_SECRET_ACCESS_KEY" not in text
    pod = body["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert body["spec"]["suspend"] is True and body["spec"]["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
    assert container["envFrom"] == [{"secretRef": {"name": "tao-abcdef012345-env"}}]
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": "2", "memory": "32Gi"},
        "requests": {"cpu": "8", "memory": "32Gi"},
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert volumes["results"]["persistentVolumeClaim"]["claimName"] == "results"
    assert volumes["tao-job-parts"]["projected"]["sources"][0]["configMap"]["name"] == "tao-abcdef012345-files-0"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TAO_RESULTS_ROOT"] == "/results" and env["TAO_JOB_ID"] == "abcdef012345"
    assert pod["nodeSelector"] == {"gpu": "a100"}
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "tao-abcdef012345-pull"}]
    labels = body["metadata"]["labels"]
    assert all(len(v) <= 63 and re.match(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]?$", v) for v in labels.values())
    assert "tao.nvidia.com/run-id" not in labels
    assert body["metadata"]["annotations"]["tao.nvidia.com/run-id"] == spec.origin["run_id"]


def test_owned_objects_hold_the_secrets_and_the_pull_credentials(hook: TAOKubernetesHook) -> None:
    kinds = {o["kind"] + ":" + o.get("type", ""): o for o in hook._owned_objects(_spec(), [b"x"])}
    assert set(kinds) == {"Secret:Opaque", "ConfigMap:", "Secret:kubernetes.io/dockerconfigjson"}
    assert kinds["ConfigMap:"]["immutable"] is True


def test_a_multi_node_job_is_indexed_with_the_rendezvous_contract(hook: TAOKubernetesHook) -> None:
    spec = _spec(num_nodes=2)
    body = hook._job_body(spec, _handle(hook, spec), parts=0)
    assert (body["spec"]["completionMode"], body["spec"]["completions"], body["spec"]["parallelism"]) == (
        "Indexed",
        2,
        2,
    )
    pod = body["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["MASTER_ADDR"]["value"] == f"{spec.name}-0.{spec.name}" and pod["subdomain"] == spec.name
    assert env["WORLD_SIZE"]["value"] == env["NNODES"]["value"] == "2" and env["NUM_GPU_PER_NODE"]["value"] == "2"
    assert "job-completion-index" in env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    (service,) = [o for o in hook._owned_objects(spec, []) if o["kind"] == "Service"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True


@pytest.mark.parametrize(
    ("changes", "parameter"),
    [
        ({"gpu_count": -1}, "gpu_count"),
        ({"backend_details": {"memory": "lots"}}, "backend_details['memory']"),
        ({"backend_details": {"node_selector": ["a"]}}, "backend_details['node_selector']"),
        ({"backend_details": {"node_selector": "gpu=a100"}}, "backend_details['node_selector']"),
        ({"backend_details": {"node_selector": {"gpu": 8}}}, "backend_details['node_selector']"),
        ({"backend_details": {"node_selector": {"bad key!": "x"}}}, "backend_details['node_selector']"),
        (
            {"backend_details": {"tolerations": '[{"key": "gpu", "operator": "Sometimes"}]'}},
            "backend_details['tolerations'][0]",
        ),
        (
            {"backend_details": {"tolerations": [{"key": "gpu", "effect": "NoSchedul"}]}},
            "backend_details['tolerations'][0]",
        ),
        (
            {"backend_details": {"tolerations": [{"operator": "Exists", "tolerationSeconds": 30}]}},
            "backend_details['tolerations'][0]",
        ),
        ({"backend_details": {"unschedulable_timeout_seconds": 0}}, "backend_details['unschedulable_timeout_seconds']"),
        ({"backend_details": {"gpus": 1}}, "backend_details['gpus']"),
        ({"results_uri": "/mnt/out"}, "results_uri"),
        ({"name": "9-starts-with-a-digit"}, "job_name"),
    ],
)
def test_bad_input_names_the_parameter(hook: TAOKubernetesHook, changes: dict[str, Any], parameter: str) -> None:
    with pytest.raises(JobValidationError) as error:
        hook.validate_spec(_spec(**changes))
    assert error.value.parameter == parameter


def test_node_selector_text_in_the_connection_is_checked_before_submission(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = {"node_selector": "gpu=a100", "tolerations": '[{"key": "nvidia.com/gpu", "operator": "Exists"}]'}
    monkeypatch.setenv("AIRFLOW_CONN_K8S_TEXT", json.dumps({"conn_type": "tao_kubernetes", "extra": extra}))
    with pytest.raises(JobValidationError) as error:
        TAOKubernetesHook("k8s_text").validate_spec(_spec())
    assert error.value.parameter == "the k8s_text extra 'node_selector'" and "JSON" in error.value.fix


def test_names_fit_the_kubernetes_rules(hook: TAOKubernetesHook) -> None:
    name = hook.job_name_for("9" + "x" * 80, "0123456789")
    assert len(name) <= 58 and name[0].isalpha() and name.endswith("-0123456789")
    hook.validate_name(name)
    assert label_value("manual__2026-11-25T10:00:00+00:00") == "manual__2026-11-25T10-00-00-00-00"


def test_a_4_mib_spec_travels_in_chunks_under_the_object_limit() -> None:
    files = {"spec.json": secrets.token_hex(2 * 1024 * 1024).encode(), "runner/main.py": b"print(1)"}
    parts = ct.files_in_parts(files, PART_SIZE)
    assert len(parts) >= 3 and all(len(p) <= PART_SIZE for p in parts)
    assert all(len(p) * 4 / 3 < 1 << 20 for p in parts)  # base64 in the ConfigMap still fits
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(b"".join(parts)))) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert got == {f"files/{k}": v for k, v in files.items()}


def test_the_launcher_unpacks_nothing_where_no_parts_exist() -> None:
    argv = ct.launcher_argv("echo ran")
    assert ct.PARTS_DIR in argv[2] and not os.path.exists(ct.PARTS_DIR)
