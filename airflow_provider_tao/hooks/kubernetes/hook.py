"""The ``kubernetes`` platform: each job is one ``batch/v1`` Job named after the task instance.

Clients come from the cncf-kubernetes provider: ``KubernetesHook`` on the worker, ``AsyncKubernetesHook`` in the
triggerer (one async client per poller, reopened periodically when the kubeconfig uses exec auth, whose tokens
expire). Responses are read as JSON (``_preload_content=False``): the status of 300 jobs is two list calls, not
600 model deserialisations.

A job is created suspended, so everything it needs can be owned by it before a pod exists: a Secret with the
job's secret environment (``envFrom``; no value in the Job or pod spec), the job's files as gzip'd tar chunks in
immutable ConfigMaps (each well under the 1 MiB object limit; a 4 MiB spec is a handful of them), an image pull
Secret made from the connection's NGC key, and for multi-node jobs a headless Service. Then it is resumed. All of
them carry an owner reference to the Job, so deleting the Job -- with ``propagationPolicy: Background``, as every
deletion here does; the API's default for Jobs orphans the pods -- removes everything, and ``ttlSecondsAfterFinished``
does the same for finished jobs. A cancel suspends the Job (Kubernetes stops its pods) and keeps it: its marks --
who canceled it -- are what the waiting task reads to fail for good instead of seeing "no such job" and resubmitting;
the task's cleanup deletes it once it has read the verdict. A Job left suspended belongs to a worker that died
mid-submission (no TTL applies while a Job is suspended): the next try deletes it, and so does ``airflow tao reap``
(:meth:`TAOKubernetesHook.reap_resources`), with a canceled Job no task waits on.

Status: a Job is Running only while one of its pods runs a container; no wait is without a bound (unschedulable or
scheduling-gated past ``unschedulable_timeout_seconds``, default 15 min; pods never created, a container that cannot
start, ``ContainerCreating`` with a Warning event past ``start_timeout_seconds``, default 10 min), and a Job a queue
such as Kueue suspended again after our resume is queued capacity. A job given up on is an Error, which the task's
failure analysis classifies and whose cleanup deletes the Job (the rule:
:mod:`~airflow_provider_tao.hooks.kubernetes.status`). Logs are bounded reads by timestamp cursor
(:mod:`~airflow_provider_tao.hooks.kubernetes.logs`). The ownership marks are annotations of the Job (merge patches).
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import cached_property
from typing import Any

from airflow_provider_tao.accounting import JobUsage
from airflow_provider_tao.failures import FailureFacts
from airflow_provider_tao.hooks.base import (
    MARK_CANCEL,
    MARK_CANCELED_BY,
    MARK_CONSUMED,
    MARK_OWNER,
    ConnectionProblem,
    JobSubmitError,
    JobValidationError,
    TAOPlatformHook,
    multi_node_env,
)
from airflow_provider_tao.hooks.kubernetes.errors import explain, kubernetes_problem, refusal_class
from airflow_provider_tao.hooks.kubernetes.logs import TAIL_READ_BYTES, PodLogRead, log_refusal_expected
from airflow_provider_tao.hooks.kubernetes.placement import node_selector, tolerations
from airflow_provider_tao.hooks.kubernetes.status import (
    ANNOTATION_RESUMED,
    ANNOTATION_START,
    ANNOTATION_UNSCHEDULABLE,
    CONTAINER,
    DEFAULT_START_TIMEOUT,
    DEFAULT_UNSCHEDULABLE_TIMEOUT,
    INDEX_ANNOTATION,
    Owned,
    all_events_needed,
    events_needed,
    is_canceled,
    job_status,
    never_started,
    oldest_first,
    owned_by,
    pods_needed,
    usage_of,
    warning_selector,
    was_resumed,
)
from airflow_provider_tao.hooks.kubernetes.status import culprit_of as _culprit
from airflow_provider_tao.hooks.kubernetes.status import epoch as _epoch
from airflow_provider_tao.hooks.kubernetes.status import is_finished as _finished
from airflow_provider_tao.hooks.kubernetes.status import pod_name as _name_of
from airflow_provider_tao.hooks.kubernetes.status import rank0_pod as _rank0
from airflow_provider_tao.hooks.kubernetes.status import termination_of as _terminated
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.hooks.shared.container import label_value
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobSpec, JobStatus

RESULTS_MOUNT = "/results"
DEFAULT_NAMESPACE = "default"
DEFAULT_TTL_SECONDS = 24 * 3600
DEFAULT_SHM_SIZE = "16Gi"
DEFAULT_REGISTRY = "nvcr.io"
#: Raw bytes of one files chunk: a ConfigMap holds at most 1 MiB, base64 and metadata come on top.
PART_SIZE = 700 * 1024
#: How long an exec-auth client (EKS, GKE tokens) is used before it is rebuilt with a fresh token.
EXEC_AUTH_REFRESH_SECONDS = 600.0
ANNOTATION_RUN_ID = f"{ct.LABEL_DOMAIN}/run-id"
ANNOTATION_RESULTS_DIR = f"{ct.LABEL_DOMAIN}/results-dir"
#: ``backend_details`` keys this platform understands.
DETAIL_KEYS = frozenset(
    {
        "cpu",
        "memory",
        "shm_size",
        "node_selector",
        "tolerations",
        "priority_class",
        "service_account",
        "unschedulable_timeout_seconds",
        "start_timeout_seconds",
        "active_deadline_seconds",
    }
)
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_MARK_KEYS = frozenset({MARK_OWNER, MARK_CANCEL, MARK_CONSUMED, MARK_CANCELED_BY})
_ORIGIN_KEYS = ("dag_id", "run_id", "task_id", "map_index")
JSON_PATCH = "application/json-patch+json"
#: Times a cancel re-reads a Job whose marks changed between its read and its suspension.
CANCEL_CONFLICT_RETRIES = 5


def mark_annotation(key: str) -> str:
    """The Job annotation that keeps ownership mark ``key``."""
    return f"{ct.LABEL_DOMAIN}/{key}"


class TAOKubernetesHook(TAOPlatformHook):
    """Runs jobs as Kubernetes Jobs, through the cncf-kubernetes provider's hooks.

    Connection type ``tao_kubernetes``. Extras: ``namespace`` (default ``default``), ``kube_config_path`` or an
    inline ``kube_config``, ``in_cluster``, ``cluster_context`` (read by the provider's hook, as on a
    ``kubernetes`` connection), ``results_pvc`` (a PersistentVolumeClaim mounted at ``/results`` in every job and
    exported as ``TAO_RESULTS_ROOT``; without one outputs go to S3 through the runner), ``service_account``,
    ``image_pull_secret`` (an existing Secret), ``registry`` (default ``nvcr.io``: the registry the password --
    the NGC key -- is for; a pull Secret owned by each Job is made from it), ``node_selector`` (dict),
    ``tolerations`` (list), ``priority_class``, ``ttl_seconds_after_finished`` (default one day),
    ``cancel_grace_seconds`` (default 30), ``shm_size`` (default 16Gi).

    ``backend_details`` of a job: ``cpu`` (request, "4"), ``memory`` (request and limit, "32Gi": past it the job
    is OOM-killed), ``shm_size``, ``node_selector``, ``tolerations``, ``priority_class``, ``service_account``,
    ``unschedulable_timeout_seconds`` (default 900), ``start_timeout_seconds`` (default 600),
    ``active_deadline_seconds`` (Kubernetes stops the job itself after this long).

    :param conn_id: the ``tao_kubernetes`` connection, or None for the default kubeconfig.
    """

    platform = "kubernetes"
    conn_type = "tao_kubernetes"
    extra_modules = ("kubernetes", ("airflow.providers.cncf.kubernetes", "kubernetes", "kubernetes_asyncio"))
    default_conn_name = "tao_kubernetes_default"
    hook_name = "TAO Kubernetes"
    # A DNS-1035 label (it also names the multi-node headless Service), short enough for "<name>-<index>" host names.
    name_pattern = re.compile(r"^[a-z]([a-z0-9-]{0,56}[a-z0-9])?$")
    name_rule = "lower-case letters, digits and '-', starting with a letter, at most 58 characters"
    name_max_length = 58
    name_letter_first = True
    supports_multi_node = True
    marks_storage = "annotations of the Job (merge patches)"
    env_fallbacks = {"namespace": "TAO_K8S_NAMESPACE"}

    def __init__(self, conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(conn_id, **kwargs)
        self._log_pods: dict[str, str] = {}  # job id -> the pod whose log is the job's (rank 0), from the last poll
        self._log_warned: set[str] = set()  # log read failures already warned about (once each)
        self._aclient: Any = None
        self._aclient_stack: contextlib.AsyncExitStack | None = None
        self._aclient_born = 0.0
        self._aclient_refresh = False

    # ----------------------------------------------------------------- settings and clients

    @property
    def namespace(self) -> str:
        self.load_connection()
        return str(self.setting("namespace", DEFAULT_NAMESPACE))

    def _int_setting(self, name: str, default: int) -> int:
        self.load_connection()
        return int(float(self.setting(name, default)))

    def default_results_root(self) -> str | None:
        self.load_connection()
        return RESULTS_MOUNT if self.setting("results_pvc") else None

    @cached_property
    def api_client(self) -> Any:
        """The provider's ``KubernetesHook`` client (kubeconfig file, inline kubeconfig or in-cluster)."""
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        self.load_connection()
        return KubernetesHook(conn_id=self.conn_id, kubernetes_conn_id=None).api_client

    def _api(self, group: str) -> Any:
        from kubernetes import client

        return client.BatchV1Api(self.api_client) if group == "batch" else client.CoreV1Api(self.api_client)

    def _call(self, group: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """One API call; the answer as parsed JSON (or bytes for logs). Errors raise ``ApiException``."""
        response = getattr(self._api(group), method)(*args, _preload_content=False, **kwargs)
        return response.data if method.endswith("_log") else _decode(response.data)

    async def _aapi(self, group: str) -> Any:
        from kubernetes_asyncio import client

        if (
            self._aclient is not None
            and self._aclient_refresh
            and time.monotonic() - self._aclient_born > (EXEC_AUTH_REFRESH_SECONDS)
        ):
            await self.aclose()  # an exec-auth token (EKS, GKE) expires: a new client asks for a new one
        if self._aclient is None:
            from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook

            await self.aload_connection()
            hook = AsyncKubernetesHook(conn_id=self.conn_id, kubernetes_conn_id=None, connection_extras=self._extras)
            stack = contextlib.AsyncExitStack()
            self._aclient = await stack.enter_async_context(hook.get_conn())
            self._aclient_stack, self._aclient_born = stack, time.monotonic()
            self._aclient_refresh = bool(hook._is_exec_auth)
        return client.BatchV1Api(self._aclient) if group == "batch" else client.CoreV1Api(self._aclient)

    async def _acall(self, group: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Async twin of :meth:`_call` (the async client does not raise on errors without preloading: we do)."""
        from kubernetes_asyncio.client.exceptions import ApiException
        from kubernetes_asyncio.client.rest import RESTResponse

        response = await getattr(await self._aapi(group), method)(*args, _preload_content=False, **kwargs)
        try:
            data = await response.read()
            if not 200 <= response.status <= 299:
                raise ApiException(http_resp=RESTResponse(response, data))  # type: ignore[arg-type]  # what rest.py passes
        finally:
            response.release()
        return data if method.endswith("_log") else _decode(data)

    async def aclose(self) -> None:
        stack, self._aclient, self._aclient_stack = self._aclient_stack, None, None
        if stack is not None:
            await stack.aclose()

    def probe_connection(self) -> str:
        """The API server's version, the namespace (when the credentials may read it) and a Job list in it."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        namespace = self.namespace
        try:
            version = client.VersionApi(self.api_client).get_code().git_version
        except ApiException as exc:
            raise kubernetes_problem(exc, namespace) from exc
        except Exception as exc:
            raise ConnectionProblem(
                "unreachable", f"the Kubernetes API server does not answer ({exc}); check the kubeconfig's server"
            ) from exc
        try:
            self._call("core", "read_namespace", namespace)
        except ApiException as exc:
            if exc.status != 403:  # many job-submitting roles may not read Namespaces: the Job list still tells
                raise kubernetes_problem(exc, namespace) from exc
        try:
            self._call("batch", "list_namespaced_job", namespace, limit=1)
        except ApiException as exc:
            raise kubernetes_problem(exc, namespace) from exc
        return f"Kubernetes {version}: Jobs in namespace {namespace} can be listed"

    def job_url(self, handle: JobHandle) -> str:
        """The connection's ``dashboard_url`` with ``{namespace}`` and ``{name}`` filled in, else none."""
        self.load_connection()
        template = str(self.setting("dashboard_url", "") or "")
        if not template:
            return ""
        from urllib.parse import quote

        return template.replace("{namespace}", quote(self.namespace)).replace("{name}", quote(handle.name))

    def job_location(self, handle: JobHandle) -> dict[str, str]:
        return {
            "Namespace": self.namespace,
            "Job": handle.name,
            "Log": f"kubectl -n {self.namespace} logs job/{handle.name}",
        }

    def list_active_jobs(self) -> list[JobHandle]:
        """This provider's Jobs in the namespace that have not finished (one list call)."""
        jobs = self._call("batch", "list_namespaced_job", self.namespace, label_selector=f"{ct.LABEL_MANAGED}=true")
        return [self._handle_of(job) for job in jobs["items"] if not _finished(job) and not is_canceled(job)]

    def reap_resources(
        self, task_state: Callable[[Mapping[str, Any]], str | None], *, dry_run: bool
    ) -> list[dict[str, str]]:
        """Suspended Jobs nothing will resume or read, deleted with what they own (Secret, ConfigMaps, Service): one
        whose submitting worker died before starting it, and a canceled one whose task does not wait on it. No TTL
        applies to a suspended Job, so nothing else would ever remove them."""
        from airflow_provider_tao.jobindex import WAITING_TI_STATES

        jobs = self._call("batch", "list_namespaced_job", self.namespace, label_selector=f"{ct.LABEL_MANAGED}=true")
        rows, now = [], time.time()
        for job in jobs["items"]:
            meta = job["metadata"]
            annotations = meta.get("annotations") or {}
            if never_started(job, now):
                why = "left suspended by a submission whose worker died: it never ran"
            elif is_canceled(job):
                origin = {k: annotations.get(f"{ct.LABEL_DOMAIN}/{k.replace('_', '-')}") for k in _ORIGIN_KEYS}
                if task_state(origin) in WAITING_TI_STATES:
                    continue  # its task reads the verdict, then deletes it
                why = "canceled, and no task waits to read its verdict"
            else:
                continue
            if not dry_run:
                self._delete(meta["name"], meta["uid"])
            rows.append({"resource": meta["name"], "kind": "Job", "action": "would delete" if dry_run else "deleted",
                         "why": why})  # fmt: skip
        return rows

    # ----------------------------------------------------------------- validation

    def image_required(self, spec: JobSpec) -> str | None:
        return "is required on the kubernetes platform: every job is a pod"

    def validate_spec(self, spec: JobSpec) -> None:
        super().validate_spec(spec)
        if spec.gpu_count == -1:
            raise JobValidationError(
                "gpu_count",
                "-1 ('all GPUs') cannot be expressed on Kubernetes: a pod asks for a number of nvidia.com/gpu",
                "Give the number of GPUs per pod, e.g. gpu_count=8",
            )
        details = self.platform_details(spec)
        if unknown := sorted(set(details) - DETAIL_KEYS):
            raise JobValidationError(
                f"backend_details[{unknown[0]!r}]",
                "is not a kubernetes platform setting",
                f"Use one of: {', '.join(sorted(DETAIL_KEYS))}",
            )
        for key in ("cpu", "memory", "shm_size"):
            if key in details and not _QUANTITY.match(str(details[key])):
                raise JobValidationError(
                    f"backend_details[{key!r}]",
                    f"{details[key]!r} is not a Kubernetes quantity",
                    'Use e.g. "4" or "32Gi"',
                )
        for key in ("unschedulable_timeout_seconds", "start_timeout_seconds", "active_deadline_seconds"):
            if key in details and not (isinstance(details[key], int | float) and details[key] > 0):
                raise JobValidationError(
                    f"backend_details[{key!r}]", f"{details[key]!r} is not a positive number", "Give seconds, e.g. 900"
                )
        self._placement(details)
        if spec.results_uri and not spec.results_uri.startswith("s3://"):
            raise JobValidationError(
                "results_uri",
                f"{spec.results_uri!r} is not an s3:// URI; pods cannot write to a path on the Airflow hosts",
                "Use s3:// with storage_conn_id, or set results_pvc on the tao_kubernetes connection",
            )

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

    def check_path(self, uri: str) -> bool:
        """A local input lives on the cluster's volumes, not on the Airflow hosts: the in-job runner checks it
        (and fails the job as ``ERR_CONFIG`` if it is missing)."""
        self.log.info("%s is inside the cluster: the job checks it", uri)
        return True

    def list_path(self, uri: str) -> list[str]:
        raise JobValidationError("uri", f"{uri} is inside the Kubernetes cluster", "Read results from s3:// instead")

    # ----------------------------------------------------------------- submit

    def create_job(self, spec: JobSpec, try_number: int = 1) -> JobHandle:
        from kubernetes.client.exceptions import ApiException

        self.validate_spec(spec)
        handle = self.new_handle(spec, try_number)
        parts = ct.files_in_parts(spec.files, PART_SIZE) if spec.files else []
        try:
            job = self._create_suspended(self._job_body(spec, handle, len(parts)), spec.name)
        except ApiException as exc:
            raise JobSubmitError(refusal_class(exc), f"Kubernetes refused Job {spec.name}: {explain(exc)}") from exc
        if job["metadata"]["labels"].get(ct.LABEL_JOB_ID) != spec.job_id:
            return self._handle_of(job)  # this task instance's job, submitted just now by another worker
        try:
            owner = [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": spec.name,
                    "uid": job["metadata"]["uid"],
                }  # no blockOwnerDeletion: Background deletion needs none, and setting it needs update on
                # jobs/finalizers where OwnerReferencesPermissionEnforcement is on (OpenShift)
            ]
            for body in self._owned_objects(spec, parts):
                body["metadata"].update(ownerReferences=owner, labels=self._object_labels(spec))
                kind = (
                    "secret" if body["kind"] == "Secret" else "service" if body["kind"] == "Service" else "config_map"
                )
                self._call("core", f"create_namespaced_{kind}", self.namespace, body)
            self._resume(spec.name)
        except ApiException as exc:
            # Still suspended: nothing ran. Deleting it takes whatever it already owns along.
            self._delete(spec.name, job["metadata"]["uid"])
            raise JobSubmitError(refusal_class(exc), f"Job {spec.name} could not be set up: {explain(exc)}") from exc
        return replace(handle, backend_job_id=job["metadata"]["uid"])

    def _resume(self, name: str) -> None:
        """Start the suspended Job: everything it owns exists."""
        # The annotation tells a queue's later suspension (Kueue: not admitted, preempted) from a dead submission.
        patch = {"spec": {"suspend": False}, "metadata": {"annotations": {ANNOTATION_RESUMED: str(int(time.time()))}}}
        self._call(
            "batch", "patch_namespaced_job", name, self.namespace, patch, _content_type="application/merge-patch+json"
        )

    def _create_suspended(self, body: dict[str, Any], name: str) -> dict[str, Any]:
        """Create the Job; a Job of the same name that has ended (an earlier try's) is deleted first, one that is
        still active is returned as it is (the API server's name uniqueness is what makes a double submission
        impossible)."""
        from kubernetes.client.exceptions import ApiException

        for _ in range(3):
            try:
                return dict(self._call("batch", "create_namespaced_job", self.namespace, body))
            except ApiException as exc:
                if exc.status != 409:
                    raise
            existing = self._read_job(name)
            if existing is None:
                continue
            if not self._status_now(existing, self._pods_of(name)).state.is_terminal and was_resumed(existing):
                self.log.info("Job %s already runs for this task instance: watching it", name)
                return existing
            self.log.info("Deleting the ended Job %s of an earlier try before submitting a new one", name)
            self._delete(name, existing["metadata"]["uid"])
            self._wait_gone(name)
        raise JobSubmitError(ErrClass.ERR_INFRA, f"Job {name} could not be created: its old Job did not go away")

    def _wait_gone(self, name: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self._read_job(name) is not None and time.monotonic() < deadline:
            time.sleep(0.5)

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
            "terminationGracePeriodSeconds": self._int_setting("cancel_grace_seconds", 30),
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

    # ----------------------------------------------------------------- find, status

    def _read_job(self, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return dict(self._call("batch", "read_namespaced_job", name, self.namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _pods_of(self, name: str) -> list[dict[str, Any]]:
        return list(
            self._call("core", "list_namespaced_pod", self.namespace, label_selector=f"{ct.LABEL_NAME}={name}")["items"]
        )

    def _handle_of(self, job: dict[str, Any]) -> JobHandle:
        meta = job["metadata"]
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        return JobHandle(
            platform=self.platform,
            conn_id=self.conn_id,
            job_id=labels[ct.LABEL_JOB_ID],
            name=meta["name"],
            backend_job_id=meta["uid"],
            results_dir=annotations.get(ANNOTATION_RESULTS_DIR, ""),
            try_number=int(labels.get(ct.LABEL_TRY) or 1),
            submitted_at=_epoch(meta.get("creationTimestamp")) or time.time(),
        )

    def find_job(self, name: str) -> JobHandle | None:
        """This task instance's Job. One never resumed was left by a worker that died mid-submission (only one try
        runs at a time, and this is a later one): it never ran, so it is deleted, not reattached to. One resumed
        and suspended again is held by a queue (Kueue): reattached to."""
        job = self._read_job(name)
        if job is None or ct.LABEL_JOB_ID not in (job["metadata"].get("labels") or {}):
            return None
        if not was_resumed(job) and not is_canceled(job):  # a canceled one is an ended job like any other
            self.log.info("Deleting Job %s: its try died before starting it", name)
            self._delete(name, job["metadata"]["uid"])
            return None
        return self._handle_of(job)

    def _list_selector(self, handles: Sequence[JobHandle]) -> str:
        narrow = f",{ct.LABEL_JOB_ID}={handles[0].job_id}" if len(handles) == 1 else ""
        return f"{ct.LABEL_MANAGED}=true{narrow}"

    def get_job_status(self, handle: JobHandle) -> JobStatus:
        return self.get_job_statuses([handle])[handle.job_id]

    def get_job_statuses(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        """ONE Job list of this namespace (narrowed to the job when there is one), ONE Pod list only when a watched
        Job's own status cannot say how it is (see :func:`pods_needed`), and the Warning events of an object only
        once it has waited a while for what only events explain (see :func:`events_needed`)."""
        selector = self._list_selector(handles)
        jobs = self._call("batch", "list_namespaced_job", self.namespace, label_selector=selector)["items"]
        pods = []
        if pods_needed(jobs, {h.job_id for h in handles}):
            pods = self._call("core", "list_namespaced_pod", self.namespace, label_selector=selector)["items"]
        owned = owned_by([h.job_id for h in handles], jobs, pods)
        warnings = {uid: self._warnings_of(uid) for uid in all_events_needed(owned, time.time())}
        return self._statuses_from(handles, owned, warnings)

    async def aget_job_statuses(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        selector = self._list_selector(handles)
        jobs = (await self._acall("batch", "list_namespaced_job", self.namespace, label_selector=selector))["items"]
        pods = []
        if pods_needed(jobs, {h.job_id for h in handles}):
            pods = (await self._acall("core", "list_namespaced_pod", self.namespace, label_selector=selector))["items"]
        owned = owned_by([h.job_id for h in handles], jobs, pods)
        warnings = {}
        for uid in all_events_needed(owned, time.time()):
            field = warning_selector(uid)
            events = await self._acall("core", "list_namespaced_event", self.namespace, field_selector=field)
            warnings[uid] = oldest_first(events["items"])
        return self._statuses_from(handles, owned, warnings)

    def _warnings_of(self, uid: str) -> list[dict[str, Any]]:
        """The Warning events about one object, oldest first."""
        field = warning_selector(uid)
        return oldest_first(self._call("core", "list_namespaced_event", self.namespace, field_selector=field)["items"])

    def _status_now(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> JobStatus:
        """One Job's status, with the events it needs (see :func:`events_needed`)."""
        now = time.time()
        return job_status(job, pods, now, {uid: self._warnings_of(uid) for uid in events_needed(job, pods, now)})

    def _statuses_from(
        self,
        handles: Sequence[JobHandle],
        owned: Owned,
        warnings: dict[str, list[dict[str, Any]]],
    ) -> dict[str, JobStatus]:
        statuses = {}
        for handle in handles:
            job, own = owned[handle.job_id]
            if rank0 := _rank0(own):
                self._log_pods[handle.job_id] = rank0["metadata"]["name"]
            statuses[handle.job_id] = (
                job_status(job, own, time.time(), warnings)
                if job is not None
                else JobStatus.missing(
                    f"Job {handle.name} no longer exists in namespace {self.namespace}: it was deleted outside Airflow "
                    "or by its ttlSecondsAfterFinished"
                )
            )
        return statuses

    # ----------------------------------------------------------------- logs

    def get_job_logs(self, handle: JobHandle, cursor: str = "", tail: int | None = None) -> tuple[str, str]:
        """The log of the job's pod (rank 0 of a multi-node job): bounded reads by timestamp cursor (see
        :mod:`~airflow_provider_tao.hooks.kubernetes.logs`)."""
        pod = self._log_pods.get(handle.job_id) or _name_of(_rank0(self._pods_of(handle.name)))
        read = PodLogRead(cursor, tail, time.time())
        params = read.request() if pod else None
        while params is not None:
            try:
                data = self._call("core", "read_namespaced_pod_log", pod, self.namespace, **params)
            except Exception as exc:
                if log_refusal_expected(exc, handle.job_id, self.log, self._log_warned):
                    break
                raise
            params = read.feed(data)
        return read.result

    async def aget_job_logs(self, handle: JobHandle, cursor: str = "", tail: int | None = None) -> tuple[str, str]:
        pod = self._log_pods.get(handle.job_id)
        if pod is None:
            selector = f"{ct.LABEL_NAME}={handle.name}"
            pods = await self._acall("core", "list_namespaced_pod", self.namespace, label_selector=selector)
            pod = _name_of(_rank0(pods["items"]))
            if pod:
                self._log_pods[handle.job_id] = pod  # a running job's pods are not listed by the poll: ask once
        read = PodLogRead(cursor, tail, time.time())
        params = read.request() if pod else None
        while params is not None:
            try:
                data = await self._acall("core", "read_namespaced_pod_log", pod, self.namespace, **params)
            except Exception as exc:
                if log_refusal_expected(exc, handle.job_id, self.log, self._log_warned):
                    break
                raise
            params = read.feed(data)
        return read.result

    # ----------------------------------------------------------------- cancel, failure analysis, cleanup

    def _delete_options(self, uid: str | None) -> dict[str, Any]:
        # Background: the Job goes now and the garbage collector removes its pods, Secret, ConfigMaps and Service.
        options: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            options["preconditions"] = {"uid": uid}  # never a newer Job of the same name
        return options

    def _delete(self, name: str, uid: str | None) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._call("batch", "delete_namespaced_job", name, self.namespace, body=self._delete_options(uid))
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def _suspension(self, job: dict[str, Any] | None, handle: JobHandle) -> bool | list[dict[str, Any]]:
        """How to stop ``handle``'s Job as read in ``job``: True when nothing is left to stop (gone, a newer job of
        the name, suspended already), False when another try owns it now, else a JSON patch that suspends it only
        as read -- ``test`` operations on its job id and on the owner and cancel marks, so check and act are one
        step: a newer try that claims the Job in between (a clear) fails the test and keeps its Job."""
        if job is None or (job["metadata"].get("labels") or {}).get(ct.LABEL_JOB_ID) != handle.job_id:
            return True
        marks = _marks(job, handle)
        if marks.get(MARK_CANCEL) != marks.get(MARK_OWNER, handle.try_number):
            self.log.info("Not canceling Job %s: try %s owns it now", handle.name, marks.get(MARK_OWNER))
            return False
        if job["spec"].get("suspend"):
            return True
        annotations = job["metadata"].get("annotations") or {}
        held = [("labels", ct.LABEL_JOB_ID, handle.job_id)]
        held += [("annotations", a, annotations[a]) for a in map(mark_annotation, (MARK_OWNER, MARK_CANCEL))
                 if a in annotations]  # fmt: skip
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": f"/metadata/{where}/{_pointer(key)}", "value": value} for where, key, value in held
        ]
        return [*ops, {"op": "add", "path": "/spec/suspend", "value": True}]

    def _cancel(self, handle: JobHandle) -> bool:
        """Suspend the Job (see :meth:`_suspension`): Kubernetes stops its pods and the Job stays, with its marks,
        for the task to read. A Job whose marks changed since it was read (a failed test: 422) is read again."""
        from kubernetes.client.exceptions import ApiException

        for _ in range(CANCEL_CONFLICT_RETRIES):
            if isinstance(ops := self._suspension(self._read_job(handle.name), handle), bool):
                return ops
            try:
                self._call("batch", "patch_namespaced_job", handle.name, self.namespace, ops, _content_type=JSON_PATCH)
                return True
            except ApiException as exc:
                if exc.status != 422:
                    return _gone(exc)
        return False

    async def _acancel(self, handle: JobHandle) -> bool:
        from kubernetes_asyncio.client.exceptions import ApiException

        for _ in range(CANCEL_CONFLICT_RETRIES):
            try:
                job = await self._acall("batch", "read_namespaced_job", handle.name, self.namespace)
                if isinstance(ops := self._suspension(job, handle), bool):
                    return ops
                await self._acall("batch", "patch_namespaced_job", handle.name, self.namespace, ops,
                                  _content_type=JSON_PATCH)  # fmt: skip
                return True
            except ApiException as exc:
                if exc.status != 422:
                    return _gone(exc)
        return False

    def failure_facts(self, handle: JobHandle) -> FailureFacts:
        job = self._read_job(handle.name)
        pods = [p for p in self._pods_of(handle.name) if _labels(p).get(ct.LABEL_JOB_ID) == handle.job_id]
        warnings = {obj["metadata"]["uid"]: self._warnings_of(obj["metadata"]["uid"]) for obj in [job, *pods] if obj}
        status = job_status(job, pods, time.time(), warnings) if job else JobStatus.missing("the Job is gone")
        culprit = _culprit(pods)
        events = [
            f"{e['involvedObject']['name']}: {e.get('reason')}: {e.get('message')}"
            for w in warnings.values()
            for e in w
        ]
        tail: list[str] = []
        if culprit is not None and _terminated(culprit):
            try:
                data = self._call(
                    "core",
                    "read_namespaced_pod_log",
                    culprit["metadata"]["name"],
                    self.namespace,
                    container=CONTAINER,
                    tail_lines=200,
                    limit_bytes=TAIL_READ_BYTES,
                )
                tail = data.decode(errors="replace").splitlines()
            except Exception as exc:  # the log is evidence, not a requirement
                self.log.info("Could not read the log of %s: %s", culprit["metadata"]["name"], exc)
        return FailureFacts(
            exit_code=status.exit_code,
            raw_state=status.raw_state,
            oom_killed=status.raw_state == "OOMKilled",
            timed_out=status.raw_state == "DeadlineExceeded",
            log_tail=tail,
            events=events,
            message=status.message,
            details={"job": handle.name, "namespace": self.namespace, "pods": [_name_of(p) for p in pods]},
        )

    def get_job_usage(self, handle: JobHandle) -> JobUsage:
        """From the Job and its pods (see :func:`~airflow_provider_tao.hooks.kubernetes.status.usage_of`); the GPU
        model from the pod template's node selector, else from the labels of rank 0's node (when this connection
        may read nodes)."""
        job = self._read_job(handle.name)
        if job is None or (job["metadata"].get("labels") or {}).get(ct.LABEL_JOB_ID) != handle.job_id:
            return super().get_job_usage(handle)
        pods = [p for p in self._pods_of(handle.name) if _labels(p).get(ct.LABEL_JOB_ID) == handle.job_id]
        node = ((_rank0(pods) or {}).get("spec") or {}).get("nodeName")
        labels: dict[str, str] = {}
        if node:
            try:
                labels = dict(self._call("core", "read_node", node)["metadata"].get("labels") or {})
            except Exception as exc:  # RBAC may not allow nodes: the GPU model is a detail
                self.log.debug("Cannot read node %s: %s", node, exc)
        return usage_of(job, pods, labels)

    def cleanup_job(self, handle: JobHandle) -> None:
        """A job given up on while Kubernetes still holds it (unschedulable, an image it cannot pull) or canceled
        (suspended) is deleted once its verdict has been read: nothing keeps waiting for a node, and no TTL applies
        to a suspended Job. Finished Jobs stay until their TTL."""
        try:
            job = self._read_job(handle.name)
            if job is None or (job["metadata"].get("labels") or {}).get(ct.LABEL_JOB_ID) != handle.job_id:
                return
            if not _finished(job) and self._status_now(job, self._pods_of(handle.name)).state.is_terminal:
                self.log.info("Deleting Job %s: it was given up on (%s)", handle.name, handle.job_id)
                self._delete(handle.name, job["metadata"]["uid"])
        except Exception as exc:  # best effort
            self.log.warning("Cleaning up Job %s failed: %s", handle.name, exc)

    # ----------------------------------------------------------------- marks

    def read_marks(self, handle: JobHandle) -> dict[str, Any]:
        job = self._read_job(handle.name)
        return _marks(job, handle)

    async def aread_marks(self, handle: JobHandle) -> dict[str, Any]:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            job = await self._acall("batch", "read_namespaced_job", handle.name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        return _marks(job, handle)

    def _mark_patch(self, handle: JobHandle, key: str, value: Any) -> dict[str, Any]:
        return {"metadata": {"annotations": {mark_annotation(key): json.dumps(value)}}}

    def write_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._call(
                "batch",
                "patch_namespaced_job",
                handle.name,
                self.namespace,
                self._mark_patch(handle, key, value),
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.log.info("Job %s no longer exists: mark %s not kept", handle.name, key)

    async def awrite_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            await self._acall(
                "batch",
                "patch_namespaced_job",
                handle.name,
                self.namespace,
                self._mark_patch(handle, key, value),
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status != 404:
                raise


# ----------------------------------------------------------------------------- small helpers


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("labels") or {})


def _marks(job: dict[str, Any] | None, handle: JobHandle) -> dict[str, Any]:
    if job is None or (job["metadata"].get("labels") or {}).get(ct.LABEL_JOB_ID) != handle.job_id:
        return {}  # gone, or a newer job of the same name: nothing of this one was claimed
    marks: dict[str, Any] = {}
    prefix = f"{ct.LABEL_DOMAIN}/"
    for key, value in (job["metadata"].get("annotations") or {}).items():
        if key.startswith(prefix) and key.removeprefix(prefix) in _MARK_KEYS:
            with contextlib.suppress(ValueError):
                marks[key.removeprefix(prefix)] = json.loads(value)
    return marks


def _gone(exc: Exception) -> bool:
    """True for the API's 404 (the Job is gone: nothing to stop); any other error is raised again."""
    if getattr(exc, "status", None) == 404:
        return True
    raise exc


def _pointer(key: str) -> str:
    """``key`` as one JSON Pointer token (RFC 6901: ``~`` and ``/`` escaped)."""
    return key.replace("~", "~0").replace("/", "~1")


def _secret_name(job_id: str) -> str:
    return f"tao-{job_id}-env"


def _pull_secret_name(job_id: str) -> str:
    return f"tao-{job_id}-pull"


def _part_name(job_id: str, index: int) -> str:
    return f"tao-{job_id}-files-{index}"


def _decode(data: bytes | None) -> Any:
    """An API answer as plain Python. msgspec (an Airflow dependency) parses a namespace's Job list about five times
    faster than ``json``; that parse is most of a poll's CPU."""
    import msgspec

    return msgspec.json.decode(data or b"null")
