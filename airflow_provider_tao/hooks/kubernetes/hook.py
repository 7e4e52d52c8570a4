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

The hook is made of parts, one module each: the clients and their calls
(:mod:`~airflow_provider_tao.hooks.kubernetes.api`), what is submitted
(:mod:`~airflow_provider_tao.hooks.kubernetes.spec`), marks and the cancel they guard
(:mod:`~airflow_provider_tao.hooks.kubernetes.marks`); this module joins them and adds submission, status and
failure analysis.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from airflow_provider_tao.accounting import JobUsage
from airflow_provider_tao.failures import FailureFacts
from airflow_provider_tao.hooks.base import ConnectionProblem, JobSubmitError, JobValidationError, Recorded
from airflow_provider_tao.hooks.kubernetes.errors import explain, kubernetes_problem, refusal_class
from airflow_provider_tao.hooks.kubernetes.logs import TAIL_READ_BYTES, PodLogRead, log_refusal_expected
from airflow_provider_tao.hooks.kubernetes.marks import KubernetesMarksHook
from airflow_provider_tao.hooks.kubernetes.permissions import MISSING_FIX, access_review, missing_permissions
from airflow_provider_tao.hooks.kubernetes.spec import (
    ANNOTATION_RESULTS_DIR,
    CANCEL_GRACE_SECONDS,
    PART_SIZE,
    RESULTS_MOUNT,
    KubernetesSpecHook,
)
from airflow_provider_tao.hooks.kubernetes.status import (
    ANNOTATION_RESUMED,
    CONTAINER,
    Owned,
    active_pods,
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
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobSpec, JobStatus

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
_ORIGIN_KEYS = ("dag_id", "run_id", "task_id", "map_index")
#: How long past their termination grace an earlier Job's pods may take to go (the kubelet stops, the API drops).
PODS_GONE_MARGIN_SECONDS = 30


class TAOKubernetesHook(KubernetesSpecHook, KubernetesMarksHook):
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

    # ----------------------------------------------------------------- settings and clients

    def default_results_root(self) -> str | None:
        self.load_connection()
        return RESULTS_MOUNT if self.setting("results_pvc") else None

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
        if missing := missing_permissions(access_review(self.api_client), namespace):
            raise ConnectionProblem("permission", f"the credentials may not {', '.join(missing)} {MISSING_FIX}")
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
        self, task_state: Callable[[Mapping[str, Any]], str | None], *, dry_run: bool, recorded: Recorded | None = None
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
            self._wait_for_leaving_pods(name)
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
        """Until the old Job object is gone (Background deletion removes it at once; a finalizer may hold it)."""
        deadline = time.monotonic() + timeout
        while self._read_job(name) is not None and time.monotonic() < deadline:
            time.sleep(0.5)

    def _wait_for_leaving_pods(self, name: str) -> None:
        """Until no pod of an earlier Job of the name still runs. A deleted Job goes at once and its pods only after
        their termination grace (a trainer that checkpoints on SIGTERM) -- whoever deleted it: this try, the cleanup
        after a cancel (an older try's, a person's before a clear), the reaper -- and a new Job's pod beside one
        would be two jobs of one task instance at once. One list call when nothing is left (the usual case)."""
        deadline = (
            time.monotonic()
            + self._int_setting("cancel_grace_seconds", CANCEL_GRACE_SECONDS)
            + PODS_GONE_MARGIN_SECONDS
        )
        while leaving := self._leaving_pods(name):
            if time.monotonic() > deadline:
                raise JobSubmitError(
                    ErrClass.ERR_INFRA,
                    f"Job {name} was not submitted: pod(s) {', '.join(leaving)} of its earlier Job still run past "
                    "their termination grace. A pod stuck Terminating on a node that no longer answers must be "
                    "removed (kubectl delete pod --force --grace-period=0); the retry waits for them again",
                )
            time.sleep(0.5)

    def _leaving_pods(self, name: str) -> list[str]:
        """The name's pods that still run but belong to no current Job: being deleted, or owned by a Job that is
        gone or going. A pod of the current Job is not leaving (that Job runs: the create finds it)."""
        running = active_pods(self._pods_of(name))
        if not running:
            return []
        job = self._read_job(name)
        current = None if job is None or job["metadata"].get("deletionTimestamp") else job["metadata"]["uid"]
        return [
            _name_of(pod)
            for pod in running
            if pod["metadata"].get("deletionTimestamp")
            or current not in [ref.get("uid") for ref in pod["metadata"].get("ownerReferences") or []]
        ]

    # ----------------------------------------------------------------- find, status

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

    def cleanup_job(self, handle: JobHandle, *, adoptable: bool = False) -> None:
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


# ----------------------------------------------------------------------------- small helpers


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("labels") or {})
