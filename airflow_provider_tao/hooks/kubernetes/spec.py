"""What is submitted: the Job, its pod template and the objects it owns (Secret, files ConfigMaps, pull Secret,
Service)."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from airflow_provider_tao.hooks.base import MARK_OWNER
from airflow_provider_tao.hooks.kubernetes.api import KubernetesAPIHook
from airflow_provider_tao.hooks.kubernetes.marks import mark_annotation
from airflow_provider_tao.hooks.kubernetes.placement import node_selector, tolerations
from airflow_provider_tao.hooks.kubernetes.status import (
    ANNOTATION_START,
    ANNOTATION_UNSCHEDULABLE,
    CONTAINER,
    DEFAULT_START_TIMEOUT,
    DEFAULT_UNSCHEDULABLE_TIMEOUT,
    INDEX_ANNOTATION,
)
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.hooks.shared.container import label_value
from airflow_provider_tao.hooks.shared.env import multi_node_env
from airflow_provider_tao.jobs import JobHandle, JobSpec

RESULTS_MOUNT = "/results"
DEFAULT_TTL_SECONDS = 24 * 3600
DEFAULT_SHM_SIZE = "16Gi"
DEFAULT_REGISTRY = "nvcr.io"
#: Raw bytes of one files chunk: a ConfigMap holds at most 1 MiB, base64 and metadata come on top.
PART_SIZE = 700 * 1024
ANNOTATION_RUN_ID = f"{ct.LABEL_DOMAIN}/run-id"
ANNOTATION_RESULTS_DIR = f"{ct.LABEL_DOMAIN}/results-dir"

#: A pod's termination grace unless the connection's ``cancel_grace_seconds`` says (Kubernetes' own default).
CANCEL_GRACE_SECONDS = 30


def _secret_name(job_id: str) -> str:
    return f"tao-{job_id}-env"


def _pull_secret_name(job_id: str) -> str:
    return f"tao-{job_id}-pull"


def _part_name(job_id: str, index: int) -> str:
    return f"tao-{job_id}-files-{index}"


class KubernetesSpecHook(KubernetesAPIHook):
    """Builds the objects of one job from its spec and the connection's settings."""

    def _setting_or(self, details: dict[str, Any], key: str, default: Any) -> Any:
        """A job's ``backend_details`` value, else the connection's default for it."""
        self.load_connection()
        value = details.get(key)
        return self.setting(key, default) if value is None else value

    def _placement(self, details: dict[str, Any]) -> tuple[dict[str, str], list[dict[str, Any]]]:
        """The node selector and tolerations of a job (its own, else the connection's), checked."""

        def where(key: str) -> str:
            return f"backend_details[{key!r}]" if details.get(key) is not None else f"the {self.conn_id} extra {key!r}"

        selector = node_selector(self._setting_or(details, "node_selector", {}) or {}, where("node_selector"))
        return selector, tolerations(self._setting_or(details, "tolerations", []) or [], where("tolerations"))

    def _object_labels(self, spec: JobSpec) -> dict[str, str]:
        return {ct.LABEL_MANAGED: "true", ct.LABEL_JOB_ID: spec.job_id, ct.LABEL_NAME: spec.name}

    def _job_body(self, spec: JobSpec, handle: JobHandle, parts: int) -> dict[str, Any]:
        details = self.platform_details(spec)
        labels = self._object_labels(spec) | {ct.LABEL_TRY: str(handle.try_number)}
        labels.update({ct.ORIGIN_LABELS[k]: label_value(v) for k, v in spec.origin.items() if k != "run_id"})
        annotations = {f"{ct.LABEL_DOMAIN}/{k.replace('_', '-')}": v for k, v in spec.origin.items()}
        annotations.update(
            {
                ANNOTATION_RESULTS_DIR: handle.results_dir,
                ANNOTATION_UNSCHEDULABLE: str(
                    details.get("unschedulable_timeout_seconds", DEFAULT_UNSCHEDULABLE_TIMEOUT)
                ),
                ANNOTATION_START: str(details.get("start_timeout_seconds", DEFAULT_START_TIMEOUT)),
                mark_annotation(MARK_OWNER): json.dumps(handle.try_number),
            }
        )
        job_spec: dict[str, Any] = {
            "suspend": True,
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": self._int_setting("ttl_seconds_after_finished", DEFAULT_TTL_SECONDS),
            "template": {
                "metadata": {"labels": dict(labels), "annotations": {ANNOTATION_RUN_ID: spec.origin.get("run_id", "")}},
                "spec": self._pod_spec(spec, details, parts),
            },
        }
        if spec.num_nodes > 1:
            job_spec.update(completionMode="Indexed", completions=spec.num_nodes, parallelism=spec.num_nodes)
        deadline = details.get("active_deadline_seconds")
        if deadline is None and spec.deadline is not None:
            # Kubernetes stops the job itself shortly after the task's own deadline, even if Airflow is gone.
            deadline = max(1, int(spec.deadline - time.time()) + 60)
        if deadline is not None:
            job_spec["activeDeadlineSeconds"] = int(deadline)
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": spec.name, "namespace": self.namespace, "labels": labels, "annotations": annotations},
            "spec": job_spec,
        }

    def _pod_spec(self, spec: JobSpec, details: dict[str, Any], parts: int) -> dict[str, Any]:
        assert spec.image is not None, "image_required() makes the operator demand one"
        results_root = RESULTS_MOUNT if self.setting("results_pvc") else None
        env = self.tao_env(spec, files_dir=ct.FILES_DIR, results_root=results_root)
        if spec.gpu_count == 0:
            env["NVIDIA_VISIBLE_DEVICES"] = "void"  # NGC images say "all": without a GPU request, see none
        env_list: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in env.items()]
        if spec.num_nodes > 1:
            master = f"{spec.name}-0.{spec.name}"  # pod 0's stable host name under the headless Service
            env_list += [
                {"name": k, "value": v}
                for k, v in multi_node_env(spec.num_nodes, max(spec.gpu_count, 0), master_addr=master).items()
            ]
            env_list.append(
                {
                    "name": "NODE_RANK",
                    "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}},
                }
            )
        resources: dict[str, dict[str, str]] = {"requests": {}, "limits": {}}
        if spec.gpu_count > 0:
            resources["limits"]["nvidia.com/gpu"] = str(spec.gpu_count)
        if details.get("cpu") is not None:
            resources["requests"]["cpu"] = str(details["cpu"])
        if details.get("memory") is not None:
            resources["requests"]["memory"] = resources["limits"]["memory"] = str(details["memory"])
        shm = str(details.get("shm_size") or self.setting("shm_size", DEFAULT_SHM_SIZE))
        container: dict[str, Any] = {
            "name": CONTAINER,
            "image": spec.image,
            "command": ct.launcher_argv(spec.command),
            "env": env_list,
            "resources": {k: v for k, v in resources.items() if v},
            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "tao-job", "mountPath": ct.JOB_ROOT}],
        }
        volumes: list[dict[str, Any]] = [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
            {"name": "tao-job", "emptyDir": {}},
        ]
        if spec.secret_env:
            container["envFrom"] = [{"secretRef": {"name": _secret_name(spec.job_id)}}]
        if parts:
            container["volumeMounts"].append({"name": "tao-job-parts", "mountPath": ct.PARTS_DIR, "readOnly": True})
            sources = [
                {"configMap": {"name": _part_name(spec.job_id, i), "items": [{"key": "part", "path": f"part-{i:03d}"}]}}
                for i in range(parts)
            ]
            volumes.append({"name": "tao-job-parts", "projected": {"sources": sources}})
        if claim := self.setting("results_pvc"):
            container["volumeMounts"].append({"name": "results", "mountPath": RESULTS_MOUNT})
            volumes.append({"name": "results", "persistentVolumeClaim": {"claimName": str(claim)}})
        pod: dict[str, Any] = {
            "restartPolicy": "Never",
            "containers": [container],
            "volumes": volumes,
            "terminationGracePeriodSeconds": self._int_setting("cancel_grace_seconds", CANCEL_GRACE_SECONDS),
        }
        pull = [{"name": str(s)} for s in (self.setting("image_pull_secret"),) if s]
        if self.setting("password"):
            pull.append({"name": _pull_secret_name(spec.job_id)})
        if pull:
            pod["imagePullSecrets"] = pull
        selector, toleration_list = self._placement(details)
        if selector:
            pod["nodeSelector"] = selector
        if toleration_list:
            pod["tolerations"] = toleration_list
        if priority := self._setting_or(details, "priority_class", None):
            pod["priorityClassName"] = str(priority)
        if account := self._setting_or(details, "service_account", None):
            pod["serviceAccountName"] = str(account)
        if spec.num_nodes > 1:
            pod["subdomain"] = spec.name
        return pod

    def _owned_objects(self, spec: JobSpec, parts: list[bytes]) -> list[dict[str, Any]]:
        """The Secret, the files' ConfigMaps, the pull Secret and the Service that the Job owns."""
        objects: list[dict[str, Any]] = []
        if spec.secret_env:
            data = {k: base64.b64encode(v.encode()).decode() for k, v in spec.secret_env.items()}
            objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": "Opaque",
                    "immutable": True,
                    "metadata": {"name": _secret_name(spec.job_id)},
                    "data": data,
                }
            )
        for index, part in enumerate(parts):
            objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "immutable": True,
                    "metadata": {"name": _part_name(spec.job_id, index)},
                    "binaryData": {"part": base64.b64encode(part).decode()},
                }
            )
        if key := self.setting("password"):
            registry = str(self.setting("registry", DEFAULT_REGISTRY))
            login = str(self.setting("login", "$oauthtoken"))
            auth = base64.b64encode(f"{login}:{key}".encode()).decode()
            config = {"auths": {registry: {"username": login, "password": key, "auth": auth}}}
            objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": "kubernetes.io/dockerconfigjson",
                    "immutable": True,
                    "metadata": {"name": _pull_secret_name(spec.job_id)},
                    "data": {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()},
                }
            )
        if spec.num_nodes > 1:
            selector = {ct.LABEL_JOB_ID: spec.job_id}
            objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": spec.name},
                    "spec": {"clusterIP": "None", "selector": selector, "publishNotReadyAddresses": True},
                }
            )
        return objects
