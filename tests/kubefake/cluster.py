"""The controllers of the fake cluster, in one loop: Job controller, scheduler, kubelet, garbage collector, TTL.

The kubelet runs pods through a runtime: :class:`DockerRuntime` makes every pod a real container on the test Docker
engine (the image must be on the engine: nothing is ever pulled, so an unknown image is ``ErrImagePull`` then
``ImagePullBackOff``, as on a cluster that cannot reach the registry); :class:`SimRuntime` (benchmarks) lets each
pod "run" for a fixed time and print one line per second.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from tests.fakeserver import alive
from tests.kubefake.store import Store, age_of, iter_owned, now_rfc3339, parse_time, quota_refusal

INDEX_KEY = "batch.kubernetes.io/job-completion-index"
BACKOFF_SECONDS = 2.0  # between ErrImagePull and ImagePullBackOff reports


class RuntimeProblem(Exception):
    """The kubelet cannot start the container yet: a waiting reason and message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


class Runtime(Protocol):
    def has_image(self, image: str) -> bool: ...
    def start(self, pod: dict[str, Any], env: dict[str, str], volumes: dict[str, Path]) -> str: ...
    def states(self) -> dict[str, dict[str, Any]]: ...
    def stop(self, pod_uid: str, grace: int) -> None: ...
    def logs(self, pod_uid: str, params: dict[str, str]) -> bytes: ...
    def remove(self, pod_uid: str) -> None: ...


def quantity_bytes(text: str) -> int:
    """``512Mi`` / ``2G`` / ``1e9`` -> bytes."""
    units = {
        "Ki": 1 << 10,
        "Mi": 1 << 20,
        "Gi": 1 << 30,
        "Ti": 1 << 40,
        "k": 10**3,
        "M": 10**6,
        "G": 10**9,
        "T": 10**12,
    }
    match = re.match(r"^([0-9.e+]+)([A-Za-z]*)$", str(text))
    if not match:
        return 0
    return int(float(match.group(1)) * units.get(match.group(2), 1))


class DockerRuntime:
    """Pods as real containers: one container per pod, labelled with the pod's uid, on one user network whose DNS
    answers ``<hostname>.<subdomain>`` as a cluster's DNS answers a headless Service's pods."""

    NETWORK = "kubefake"

    def __init__(self, base_url: str) -> None:
        import docker

        self.client = docker.APIClient(base_url=base_url, version="auto", timeout=120)
        #: This server's containers only: other fakes (other test sessions) share the engine.
        self.server_label = f"kubefake.server={uuid.uuid4().hex}"
        # Docker allows several networks of one name (then none can be used by name): create it only when missing.
        if not [n for n in self.client.networks(names=[self.NETWORK]) if n["Name"] == self.NETWORK]:
            self.client.create_network(self.NETWORK, driver="bridge", labels={"kubefake": "1"})
        self._finished: dict[str, dict[str, Any]] = {}
        self._remove_dead_servers()

    def _remove_dead_servers(self) -> None:
        """The pod containers of fakes that died without their cleanup (SIGKILL, a killed test session): a test
        counts pods on the engine, so nothing of a dead server may stay to be counted or to hold memory."""
        for listed in self.client.containers(all=True, filters={"label": "kubefake.server-pid"}):
            pid = int(listed["Labels"]["kubefake.server-pid"])
            if pid != os.getpid() and not alive(pid):
                with contextlib.suppress(Exception):
                    self.client.remove_container(listed["Id"], force=True, v=True)

    def has_image(self, image: str) -> bool:
        import docker

        try:
            self.client.inspect_image(image)
            return True
        except docker.errors.ImageNotFound:
            return False

    def start(self, pod: dict[str, Any], env: dict[str, str], volumes: dict[str, Path]) -> str:
        container = pod["spec"]["containers"][0]
        binds: list[str] = []
        tmpfs: dict[str, str] = {}
        for mount in container.get("volumeMounts") or []:
            source = volumes[mount["name"]]
            if str(source).startswith("tmpfs:"):
                tmpfs[mount["mountPath"]] = str(source).removeprefix("tmpfs:")
            else:
                binds.append(f"{source}:{mount['mountPath']}:{'ro' if mount.get('readOnly') else 'rw'}")
        limits = (container.get("resources") or {}).get("limits") or {}
        host: dict[str, Any] = {"binds": binds, "tmpfs": tmpfs, "network_mode": self.NETWORK, "init": True}
        if limits.get("memory"):
            host["mem_limit"] = host["memswap_limit"] = quantity_bytes(limits["memory"])
        hostname = pod["spec"].get("hostname") or pod["metadata"]["name"][:63]
        aliases = [hostname]
        if sub := pod["spec"].get("subdomain"):
            ns = pod["metadata"]["namespace"]
            aliases += [f"{hostname}.{sub}", f"{hostname}.{sub}.{ns}.svc", f"{hostname}.{sub}.{ns}.svc.cluster.local"]
        networking = self.client.create_networking_config(
            {self.NETWORK: self.client.create_endpoint_config(aliases=aliases)}
        )
        user = (pod["spec"].get("securityContext") or {}).get("runAsUser")
        created = self.client.create_container(
            image=container["image"],
            entrypoint=container.get("command"),
            command=container.get("args"),
            environment=env,
            hostname=hostname,
            working_dir=container.get("workingDir"),
            user=str(user) if user is not None else None,
            labels={
                "kubefake": "1",
                "kubefake.pod-uid": pod["metadata"]["uid"],
                "kubefake.pod": pod["metadata"]["name"],
                "kubefake.server": self.server_label.split("=", 1)[1],
                "kubefake.server-pid": str(os.getpid()),
                # the Job (or other owner) the pod belongs to: tests count running pods per Job on the engine
                "kubefake.owner-uid": next((r["uid"] for r in pod["metadata"].get("ownerReferences") or []), ""),
            },
            host_config=self.client.create_host_config(**host),
            networking_config=networking,
        )
        try:
            self.client.start(created["Id"])
        except Exception as exc:  # the kubelet's RunContainerError: the pod waits, nothing ran
            self.client.remove_container(created["Id"], force=True)
            raise RuntimeProblem("RunContainerError", str(exc)) from exc
        return f"docker://{created['Id']}"

    def states(self) -> dict[str, dict[str, Any]]:
        """One list of every pod container; an inspect only for one that has just ended."""
        found: dict[str, dict[str, Any]] = {}
        for listed in self.client.containers(all=True, filters={"label": self.server_label}):
            uid = listed["Labels"].get("kubefake.pod-uid", "")
            if listed["State"] == "running":
                found[uid] = {"running": True}
                continue
            if uid not in self._finished:
                state = self.client.inspect_container(listed["Id"])["State"]
                self._finished[uid] = {
                    "running": False,
                    "exitCode": int(state.get("ExitCode") or 0),
                    "oom": bool(state.get("OOMKilled")),
                    "startedAt": state.get("StartedAt", "")[:19] + "Z",
                    "finishedAt": state.get("FinishedAt", "")[:19] + "Z",
                }
            found[uid] = self._finished[uid]
        return found

    def _id(self, pod_uid: str) -> str | None:
        listed = self.client.containers(all=True, filters={"label": f"kubefake.pod-uid={pod_uid}"})
        return listed[0]["Id"] if listed else None

    def stop(self, pod_uid: str, grace: int) -> None:
        if (cid := self._id(pod_uid)) is not None:
            self.client.stop(cid, timeout=grace)

    def logs(self, pod_uid: str, params: dict[str, str]) -> bytes:
        cid = self._id(pod_uid)
        if cid is None:
            return b""
        kwargs: dict[str, Any] = {"timestamps": True}
        if since := log_since(params):
            kwargs["since"] = since  # docker: lines stamped at or after it, as the kubelet's since
        if params.get("tailLines"):
            kwargs["tail"] = int(params["tailLines"])
        text = bytes(self.client.logs(cid, stdout=True, stderr=True, **kwargs))
        if params.get("timestamps", "false").lower() not in ("true", "1"):
            text = b"".join(line.split(b" ", 1)[-1] for line in text.splitlines(keepends=True))
        return text

    def remove(self, pod_uid: str) -> None:
        if (cid := self._id(pod_uid)) is not None:
            with contextlib.suppress(Exception):
                self.client.remove_container(cid, force=True, v=True)
        self._finished.pop(pod_uid, None)

    def remove_all(self) -> None:
        for listed in self.client.containers(all=True, filters={"label": self.server_label}):
            with contextlib.suppress(Exception):
                self.client.remove_container(listed["Id"], force=True, v=True)


class SimRuntime:
    """Pods that "run" for ``seconds`` and print ``step N`` once a second (benchmarks: no containers)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started: dict[str, float] = {}
        self.stopped: dict[str, float] = {}

    def has_image(self, image: str) -> bool:
        return True

    def start(self, pod: dict[str, Any], env: dict[str, str], volumes: dict[str, Path]) -> str:
        self.started[pod["metadata"]["uid"]] = time.time()
        return f"sim://{pod['metadata']['uid']}"

    def _end(self, uid: str) -> float:
        return min(self.started[uid] + self.seconds, self.stopped.get(uid, float("inf")))

    def states(self) -> dict[str, dict[str, Any]]:
        now = time.time()
        found: dict[str, dict[str, Any]] = {}
        for uid, start in self.started.items():
            end = self._end(uid)
            if now < end:
                found[uid] = {"running": True}
            else:
                code = 0 if uid not in self.stopped or self.stopped[uid] >= start + self.seconds else 143
                found[uid] = {
                    "running": False,
                    "exitCode": code,
                    "oom": False,
                    "startedAt": _stamp(start),
                    "finishedAt": _stamp(end),
                }
        return found

    def stop(self, pod_uid: str, grace: int) -> None:
        self.stopped.setdefault(pod_uid, time.time())

    def logs(self, pod_uid: str, params: dict[str, str]) -> bytes:
        start = self.started.get(pod_uid)
        if start is None:
            return b""
        since = log_since(params)
        lines = [
            f"{_stamp(start + n, nanos=True)} step {n}\n"
            for n in range(int(min(time.time(), self._end(pod_uid)) - start) + 1)
            if start + n >= since
        ]
        if params.get("tailLines"):
            lines = lines[-int(params["tailLines"]) :] if int(params["tailLines"]) else []
        if params.get("timestamps", "false").lower() not in ("true", "1"):
            lines = [line.split(" ", 1)[1] for line in lines]
        return "".join(lines).encode()

    def remove(self, pod_uid: str) -> None:
        self.started.pop(pod_uid, None)
        self.stopped.pop(pod_uid, None)

    def remove_all(self) -> None:
        self.started.clear()


def log_since(params: dict[str, str]) -> float:
    """The time a log read starts at (0: the beginning), as the kubelet's ``NewLogOptions`` computes it: ``sinceTime``
    as given, ``sinceSeconds`` back from now on the node's clock."""
    if params.get("sinceTime"):
        return parse_time(params["sinceTime"])
    if params.get("sinceSeconds"):
        return time.time() - int(params["sinceSeconds"])
    return 0.0


def _stamp(epoch: float, nanos: bool = False) -> str:
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch))
    return f"{text}.{int((epoch % 1) * 1e9):09d}Z" if nanos else f"{text}Z"


class Cluster:
    """Nodes and the control loop. ``gpus_per_node`` GPUs on each of ``nodes`` nodes (``nvidia.com/gpu``)."""

    def __init__(self, store: Store, runtime: Any, workdir: Path, nodes: int = 2, gpus_per_node: int = 1) -> None:
        self.store = store
        self.runtime = runtime
        self.workdir = workdir
        self.tick_seconds = 0.2
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._evictions: dict[str, str] = {}  # pod uid -> message
        self._stopping: set[str] = set()
        self._waiting_since: dict[str, float] = {}
        store.on_change = self._wake.set
        for index in range(1, nodes + 1):
            name = f"kubefake-node-{index}"
            allocatable = {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": str(gpus_per_node)}
            node = {
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubefake/node": str(index)}},
                "spec": {},
                "status": {
                    "allocatable": allocatable,
                    "capacity": allocatable,
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
            store.create("nodes", "", node)
        store.create("namespaces", "", {"metadata": {"name": "default"}, "status": {"phase": "Active"}})
        self.thread = threading.Thread(target=self._loop, name="kubefake-controllers", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.thread.join(timeout=10)
        self.runtime.remove_all()

    def evict(self, namespace: str, pod_name: str, message: str) -> None:
        pod = self.store.get("pods", namespace, pod_name)
        self._evictions[pod["metadata"]["uid"]] = message
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.tick_seconds)
            self._wake.clear()
            try:
                self.tick()
            except Exception as exc:  # a controller bug must be visible, not stop the cluster
                print(f"kubefake controller error: {exc!r}", flush=True)
                import traceback

                traceback.print_exc()

    def tick(self) -> None:
        states = self.runtime.states()
        with self.store.lock:
            jobs = [(j["metadata"]["namespace"], j["metadata"]["name"]) for j in self.store.all("jobs")]
        for ns, name in jobs:
            self._sync_job(ns, name)
        self._schedule()
        self._kubelet(states)
        self.store.collect_garbage()
        self._expire_finished_jobs()

    # ------------------------------------------------------------------ Job controller

    def _sync_job(self, ns: str, name: str) -> None:
        with self.store.lock:
            job = self.store.find("jobs", ns, name)
            if job is None or "deletionTimestamp" in job["metadata"]:
                return
            spec, status = job["spec"], dict(job.get("status") or {})
            pods = list(iter_owned(self.store, job["metadata"]["uid"], "pods"))
            conditions = list(status.get("conditions") or [])
            finished = any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conditions)
            active = [
                p
                for p in pods
                if p["status"]["phase"] in ("Pending", "Running") and "deletionTimestamp" not in p["metadata"]
            ]
            failed = [p for p in pods if p["status"]["phase"] == "Failed"]
            succeeded = [p for p in pods if p["status"]["phase"] == "Succeeded"]
            indexed = spec.get("completionMode") == "Indexed"
            completions = int(spec.get("completions") or 1)
            if finished:
                self._end_pods(active)
                active = []
            elif spec.get("suspend"):
                self._end_pods(active)
                active = []
                if not _condition(conditions, "Suspended"):
                    conditions.append(_cond("Suspended", "True", "JobSuspended", "Job suspended"))
                    self.store.record_event(job, "Normal", "Suspended", "Job suspended", "job-controller")
            else:
                if (c := _condition(conditions, "Suspended")) and c["status"] == "True":
                    c.update(
                        status="False", reason="JobResumed", message="Job resumed", lastTransitionTime=now_rfc3339()
                    )
                    self.store.record_event(job, "Normal", "Resumed", "Job resumed", "job-controller")
                status.setdefault("startTime", now_rfc3339())
                done_indexes = {int(p["metadata"]["annotations"][INDEX_KEY]) for p in succeeded} if indexed else set()
                deadline = spec.get("activeDeadlineSeconds")
                if len(failed) > int(spec.get("backoffLimit", 6)):
                    self._fail_job(
                        job, conditions, active, "BackoffLimitExceeded", "Job has reached the specified backoff limit"
                    )
                    active = []
                elif deadline is not None and age_of(status["startTime"]) > float(deadline):
                    self._fail_job(
                        job, conditions, active, "DeadlineExceeded", "Job was active longer than specified deadline"
                    )
                    active = []
                elif (len(done_indexes) if indexed else len(succeeded)) >= completions:
                    conditions += [
                        _cond(
                            "SuccessCriteriaMet",
                            "True",
                            "CompletionsReached",
                            "Reached expected number of succeeded pods",
                        ),
                        _cond("Complete", "True", "CompletionsReached", "Reached expected number of succeeded pods"),
                    ]
                    status["completionTime"] = now_rfc3339()
                    self.store.record_event(job, "Normal", "Completed", "Job completed", "job-controller")
                elif indexed:
                    busy = {int(p["metadata"]["annotations"][INDEX_KEY]) for p in active} | done_indexes
                    for index in range(completions):
                        if index not in busy and (pod := self._create_pod(job, index)) is not None:
                            active.append(pod)
                else:
                    wanted = min(int(spec.get("parallelism") or 1), completions - len(succeeded))
                    while len(active) < wanted and (pod := self._create_pod(job, None)) is not None:
                        active.append(pod)
            status.update(
                active=len(active),
                ready=sum(1 for p in active if p["status"]["phase"] == "Running"),
                succeeded=len(succeeded),
                failed=len(failed),
                terminating=sum(1 for p in pods if "deletionTimestamp" in p["metadata"]),
                conditions=conditions,
            )
            if indexed:
                status["completedIndexes"] = ",".join(
                    str(i) for i in sorted(int(p["metadata"]["annotations"][INDEX_KEY]) for p in succeeded)
                )
            for key in [k for k, v in status.items() if v in (0, [], None) and k != "active"]:
                del status[key]
            self.store.put_status("jobs", ns, name, status)

    def _fail_job(
        self,
        job: dict[str, Any],
        conditions: list[dict[str, Any]],
        active: list[dict[str, Any]],
        reason: str,
        message: str,
    ) -> None:
        conditions += [_cond("FailureTarget", "True", reason, message), _cond("Failed", "True", reason, message)]
        self.store.record_event(job, "Warning", reason, message, "job-controller")
        self._end_pods(active)

    def _end_pods(self, pods: list[dict[str, Any]]) -> None:
        for pod in pods:
            self.store.delete("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], {})

    def _create_pod(self, job: dict[str, Any], index: int | None) -> dict[str, Any] | None:
        """A pod of the Job, through the API server's admission (None when refused: a ``FailedCreate`` event on the
        Job, as the controller's ``CreatePods`` records it, and the next pass tries again)."""
        template = job["spec"]["template"]
        meta = job["metadata"]
        name = meta["name"] if index is None else f"{meta['name']}-{index}"
        labels = dict(template["metadata"].get("labels") or {})
        annotations = dict(template["metadata"].get("annotations") or {})
        spec = dict(template["spec"])
        if index is not None:
            labels[INDEX_KEY] = annotations[INDEX_KEY] = str(index)
            spec.setdefault("hostname", f"{meta['name']}-{index}")
            env = {
                "name": "JOB_COMPLETION_INDEX",
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_KEY}']"}},
            }
            spec["containers"] = [{**c, "env": [*(c.get("env") or []), env]} for c in spec["containers"]]
        pod = {
            "metadata": {
                "name": f"{name}-{uuid.uuid4().hex[:5]}",
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
        }
        if refusal := quota_refusal(self.store, meta["namespace"], pod):
            self.store.record_event(job, "Warning", "FailedCreate", f"Error creating: {refusal}", "job-controller")
            return None
        created = self.store.create("pods", meta["namespace"], pod)
        self.store.record_event(
            job, "Normal", "SuccessfulCreate", f"Created pod: {created['metadata']['name']}", "job-controller"
        )
        live = self.store.find("pods", meta["namespace"], created["metadata"]["name"])
        assert live is not None
        return live

    def _expire_finished_jobs(self) -> None:
        with self.store.lock:
            for job in list(self.store.all("jobs")):
                ttl = job["spec"].get("ttlSecondsAfterFinished")
                ended = next(
                    (
                        c
                        for c in (job.get("status") or {}).get("conditions") or []
                        if c["type"] in ("Complete", "Failed") and c["status"] == "True"
                    ),
                    None,
                )
                if ttl is not None and ended and age_of(ended["lastTransitionTime"]) >= float(ttl):
                    meta = job["metadata"]
                    self.store.delete("jobs", meta["namespace"], meta["name"], {"propagationPolicy": "Background"})

    # ------------------------------------------------------------------ scheduler

    def _schedule(self) -> None:
        with self.store.lock:
            nodes = self.store.all("nodes")
            used: dict[str, int] = {n["metadata"]["name"]: 0 for n in nodes}
            pods = self.store.all("pods")
            for pod in pods:
                if pod["spec"].get("nodeName") and pod["status"]["phase"] in ("Pending", "Running"):
                    used[pod["spec"]["nodeName"]] += _gpus(pod)
            for pod in pods:
                if pod["spec"].get("nodeName") or "deletionTimestamp" in pod["metadata"]:
                    continue
                problem = self._unfit_reason(pod, nodes, used)
                if problem is None:
                    node = next(n for n in nodes if self._fits(pod, n, used))
                    node_name = node["metadata"]["name"]
                    pod["spec"]["nodeName"] = node_name
                    used[node_name] += _gpus(pod)
                    _set_condition(pod, _cond("PodScheduled", "True", None, None))
                    self.store.record_event(
                        pod,
                        "Normal",
                        "Scheduled",
                        f"Successfully assigned "
                        f"{pod['metadata']['namespace']}/{pod['metadata']['name']} to {node_name}",
                        "default-scheduler",
                    )
                else:
                    message = (
                        f"0/{len(nodes)} nodes are available: {problem}. preemption: 0/{len(nodes)} nodes are "
                        f"available: {len(nodes)} No preemption victims found for incoming pod."
                    )
                    if _set_condition(pod, _cond("PodScheduled", "False", "Unschedulable", message)):
                        self.store.record_event(pod, "Warning", "FailedScheduling", message, "default-scheduler")
                self.store._stamp(pod)

    def _fits(self, pod: dict[str, Any], node: dict[str, Any], used: dict[str, int]) -> bool:
        labels = node["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in (pod["spec"].get("nodeSelector") or {}).items()):
            return False
        free = int(node["status"]["allocatable"]["nvidia.com/gpu"]) - used[node["metadata"]["name"]]
        return _gpus(pod) <= free

    def _unfit_reason(self, pod: dict[str, Any], nodes: list[dict[str, Any]], used: dict[str, int]) -> str | None:
        ns = pod["metadata"]["namespace"]
        for volume in pod["spec"].get("volumes") or []:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if claim and self.store.find("persistentvolumeclaims", ns, claim) is None:
                return f'persistentvolumeclaim "{claim}" not found'
        if any(self._fits(pod, node, used) for node in nodes):
            return None
        selector = pod["spec"].get("nodeSelector") or {}
        mismatched = sum(
            1 for n in nodes if any((n["metadata"].get("labels") or {}).get(k) != v for k, v in selector.items())
        )
        parts = []
        if mismatched:
            parts.append(f"{mismatched} node(s) didn't match Pod's node affinity/selector")
        if len(nodes) - mismatched:
            parts.append(f"{len(nodes) - mismatched} Insufficient nvidia.com/gpu")
        return ", ".join(parts)

    # ------------------------------------------------------------------ kubelet

    def _kubelet(self, states: dict[str, dict[str, Any]]) -> None:
        with self.store.lock:
            pods = [p for p in self.store.all("pods") if p["spec"].get("nodeName")]
        for pod in pods:
            uid = pod["metadata"]["uid"]
            if "deletionTimestamp" in pod["metadata"]:
                self._terminate(pod, uid in states)
            elif uid in self._evictions:
                self._evict(pod, self._evictions.pop(uid))
            elif pod["status"]["phase"] == "Pending" and uid not in states:
                self._start(pod)
            elif pod["status"]["phase"] in ("Pending", "Running") and uid in states:
                self._update(pod, states[uid])

    def _start(self, pod: dict[str, Any]) -> None:
        container = pod["spec"]["containers"][0]
        try:
            env = self._env(pod)
            volumes = self._volumes(pod)
            if not self.runtime.has_image(container["image"]):
                self._image_pull_failed(pod, container["image"])
                return
            self._set_waiting(pod, "ContainerCreating", None)
            self.store.record_event(
                pod, "Normal", "Pulled", f'Container image "{container["image"]}" already present on machine', "kubelet"
            )
            container_id = self.runtime.start(pod, env, volumes)
        except RuntimeProblem as problem:
            self._set_waiting(pod, problem.reason, problem.message)
            return
        except Exception as exc:  # the runtime refused (a bad mount, an unknown user): the container cannot start
            self._set_waiting(pod, "CreateContainerError", str(exc))
            return
        self.store.record_event(pod, "Normal", "Started", f"Started container {container['name']}", "kubelet")
        with self.store.lock:
            pod["status"].update(phase="Running", startTime=now_rfc3339(), podIP="10.244.0.2", hostIP="172.18.0.2")
            pod["status"]["containerStatuses"] = [
                _container_status(
                    container, {"running": {"startedAt": now_rfc3339()}}, ready=True, container_id=container_id
                )
            ]
            for kind in ("Initialized", "Ready", "ContainersReady"):
                _set_condition(pod, _cond(kind, "True", None, None))
            self.store._stamp(pod)

    def _image_pull_failed(self, pod: dict[str, Any], image: str) -> None:
        uid = pod["metadata"]["uid"]
        first = self._waiting_since.setdefault(uid, time.time())
        if time.time() - first < BACKOFF_SECONDS:
            message = (
                f'failed to pull and unpack image "docker.io/{image}": failed to resolve reference '
                f'"docker.io/{image}": pull access denied, repository does not exist or may require '
                "authorization: server message: insufficient_scope: authorization failed"
            )
            self.store.record_event(pod, "Warning", "Failed", f'Failed to pull image "{image}": {message}', "kubelet")
            self._set_waiting(pod, "ErrImagePull", message)
        else:
            self.store.record_event(pod, "Normal", "BackOff", f'Back-off pulling image "{image}"', "kubelet")
            self._set_waiting(pod, "ImagePullBackOff", f'Back-off pulling image "{image}"')

    def _set_waiting(self, pod: dict[str, Any], reason: str, message: str | None) -> None:
        container = pod["spec"]["containers"][0]
        waiting = {"reason": reason, **({"message": message} if message else {})}
        with self.store.lock:
            statuses = [_container_status(container, {"waiting": waiting}, ready=False)]
            if pod["status"].get("containerStatuses") != statuses:
                pod["status"]["containerStatuses"] = statuses
                _set_condition(
                    pod,
                    _cond(
                        "Ready", "False", "ContainersNotReady", f"containers with unready status: [{container['name']}]"
                    ),
                )
                self.store._stamp(pod)

    def _update(self, pod: dict[str, Any], state: dict[str, Any]) -> None:
        if state["running"]:
            return
        container = pod["spec"]["containers"][0]
        code = state["exitCode"]
        reason = "OOMKilled" if state["oom"] else "Completed" if code == 0 else "Error"
        if state["oom"]:
            self.store.record_event(
                pod,
                "Warning",
                "OOMKilling",
                f"Memory cardinality violation: container {container['name']} was OOM-killed",
                "kubelet",
            )
        old = (pod["status"].get("containerStatuses") or [{}])[0].get("containerID", "")
        terminated = {
            "exitCode": code,
            "reason": reason,
            "startedAt": state["startedAt"],
            "finishedAt": state["finishedAt"],
            "containerID": old,
        }
        with self.store.lock:
            pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
            pod["status"]["containerStatuses"] = [
                _container_status(container, {"terminated": terminated}, ready=False, container_id=old)
            ]
            _set_condition(pod, _cond("Ready", "False", "PodCompleted", None))
            self.store._stamp(pod)

    def _evict(self, pod: dict[str, Any], message: str) -> None:
        self.runtime.stop(pod["metadata"]["uid"], 0)
        container = pod["spec"]["containers"][0]
        self.store.record_event(pod, "Warning", "Evicted", message, "kubelet")
        with self.store.lock:
            pod["status"].update(phase="Failed", reason="Evicted", message=message)
            terminated = {
                "exitCode": 137,
                "reason": "Error",
                "startedAt": pod["status"].get("startTime", now_rfc3339()),
                "finishedAt": now_rfc3339(),
            }
            pod["status"]["containerStatuses"] = [_container_status(container, {"terminated": terminated}, ready=False)]
            _set_condition(pod, _cond("DisruptionTarget", "True", "TerminationByKubelet", message))
            self.store._stamp(pod)

    def _terminate(self, pod: dict[str, Any], has_container: bool) -> None:
        uid = pod["metadata"]["uid"]
        if uid in self._stopping:
            return
        self._stopping.add(uid)
        meta = pod["metadata"]

        def _finish() -> None:
            try:
                if has_container:
                    self.store.record_event(
                        pod,
                        "Normal",
                        "Killing",
                        f"Stopping container {pod['spec']['containers'][0]['name']}",
                        "kubelet",
                    )
                    self.runtime.stop(uid, int(meta.get("deletionGracePeriodSeconds") or 0))
                    self.runtime.remove(uid)
                shutil.rmtree(self.workdir / "pods" / uid, ignore_errors=True)
            finally:
                self.store.remove("pods", meta["namespace"], meta["name"])
                self._stopping.discard(uid)
                self._waiting_since.pop(uid, None)
                self._wake.set()

        threading.Thread(target=_finish, name=f"kubefake-kill-{meta['name']}", daemon=True).start()

    # ------------------------------------------------------------------ what a container gets

    def _object(self, pod: dict[str, Any], resource: str, name: str, optional: bool = False) -> dict[str, Any] | None:
        found = self.store.find(resource, pod["metadata"]["namespace"], name)
        if found is None and not optional:
            raise RuntimeProblem("CreateContainerConfigError", f'{resource[:-1]} "{name}" not found')
        return found

    def _env(self, pod: dict[str, Any]) -> dict[str, str]:
        container = pod["spec"]["containers"][0]
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            for kind, resource in (("secretRef", "secrets"), ("configMapRef", "configmaps")):
                if ref := source.get(kind):
                    obj = self._object(pod, resource, ref["name"], bool(ref.get("optional")))
                    env.update({(source.get("prefix") or "") + k: v for k, v in _data(obj).items()})
        for item in container.get("env") or []:
            if "value" in item or "valueFrom" not in item:
                env[item["name"]] = str(item.get("value") or "")
                continue
            source = item["valueFrom"]
            if ref := source.get("secretKeyRef"):
                env[item["name"]] = _data(self._object(pod, "secrets", ref["name"])).get(ref["key"], "")
            elif ref := source.get("configMapKeyRef"):
                env[item["name"]] = _data(self._object(pod, "configmaps", ref["name"])).get(ref["key"], "")
            elif ref := source.get("fieldRef"):
                env[item["name"]] = _pod_field(pod, ref["fieldPath"])
        return env

    def _volumes(self, pod: dict[str, Any]) -> dict[str, Path]:
        """Each volume as a folder on this host (``tmpfs:<options>`` for a memory emptyDir)."""
        root = self.workdir / "pods" / pod["metadata"]["uid"] / "volumes"
        found: dict[str, Path] = {}
        for volume in pod["spec"].get("volumes") or []:
            path = root / volume["name"]
            if "emptyDir" in volume:
                if (volume["emptyDir"] or {}).get("medium") == "Memory":
                    limit = (volume["emptyDir"] or {}).get("sizeLimit")
                    found[volume["name"]] = Path(f"tmpfs:rw,size={quantity_bytes(limit)}" if limit else "tmpfs:rw")
                    continue
                path.mkdir(parents=True, exist_ok=True)
                path.chmod(0o777)
            elif claim := volume.get("persistentVolumeClaim"):
                path = self.workdir / "pvc" / pod["metadata"]["namespace"] / claim["claimName"]
                path.mkdir(parents=True, exist_ok=True)
                path.chmod(0o777)
            else:
                files = dict(self._projected(pod, volume))
                path.mkdir(parents=True, exist_ok=True)
                for rel, (content, mode) in files.items():
                    target = path / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(content)
                    target.chmod(mode)
            found[volume["name"]] = path
        return found

    def _projected(self, pod: dict[str, Any], volume: dict[str, Any]) -> Iterator[tuple[str, tuple[bytes, int]]]:
        sources = (volume.get("projected") or {}).get("sources") or [volume]
        default_mode = int(
            (volume.get("projected") or volume.get("secret") or volume.get("configMap") or {}).get("defaultMode")
            or 0o644
        )
        for source in sources:
            for kind, resource, key in (("secret", "secrets", "secretName"), ("configMap", "configmaps", "name")):
                ref = source.get(kind)
                if not ref:
                    continue
                obj = self.store.find(resource, pod["metadata"]["namespace"], ref[key])
                if obj is None:
                    self.store.record_event(
                        pod,
                        "Warning",
                        "FailedMount",
                        f"MountVolume.SetUp failed for volume "
                        f'"{volume["name"]}" : {kind.lower()} "{ref[key]}" not found',
                        "kubelet",
                    )
                    raise RuntimeProblem("ContainerCreating", "")
                content = _raw_data(obj)
                items = ref.get("items") or [{"key": k, "path": k} for k in content]
                for item in items:
                    yield item["path"], (content[item["key"]], int(item.get("mode") or default_mode))


def _data(obj: dict[str, Any] | None) -> dict[str, str]:
    return {k: v.decode(errors="replace") for k, v in _raw_data(obj).items()}


def _raw_data(obj: dict[str, Any] | None) -> dict[str, bytes]:
    if obj is None:
        return {}
    if obj["kind"] == "Secret":
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    raw = {k: str(v).encode() for k, v in (obj.get("data") or {}).items()}
    raw.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return raw


def _pod_field(pod: dict[str, Any], path: str) -> str:
    if match := re.match(r"^metadata\.(annotations|labels)\['(.+)'\]$", path):
        return str((pod["metadata"].get(match.group(1)) or {}).get(match.group(2), ""))
    simple = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "metadata.uid": pod["metadata"]["uid"],
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "status.podIP": "10.244.0.2",
        "status.hostIP": "172.18.0.2",
    }
    return simple.get(path, "")


def _gpus(pod: dict[str, Any]) -> int:
    return sum(
        int(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu") or 0)
        for c in pod["spec"]["containers"]
    )


def _cond(kind: str, status: str, reason: str | None, message: str | None) -> dict[str, Any]:
    stamp = now_rfc3339()
    cond: dict[str, Any] = {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": stamp}
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


def _condition(conditions: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c["type"] == kind), None)


def _set_condition(obj: dict[str, Any], cond: dict[str, Any]) -> bool:
    """Set a condition; the transition time moves only when its status changes. True when something changed."""
    conditions = obj["status"].setdefault("conditions", [])
    old = _condition(conditions, cond["type"])
    if old is None:
        conditions.append(cond)
        return True
    if old["status"] == cond["status"] and old.get("reason") == cond.get("reason"):
        if old.get("message") != cond.get("message"):
            old["message"] = cond.get("message")
            return True
        return False
    if old["status"] == cond["status"]:
        cond["lastTransitionTime"] = old["lastTransitionTime"]
    old.clear()
    old.update(cond)
    return True


def _container_status(
    container: dict[str, Any], state: dict[str, Any], *, ready: bool, container_id: str | None = None
) -> dict[str, Any]:
    status = {
        "name": container["name"],
        "image": container["image"],
        "imageID": "",
        "ready": ready,
        "started": "running" in state,
        "restartCount": 0,
        "state": state,
    }
    if container_id:
        status["containerID"] = container_id
    return status


def workdir_for(pid: int | None = None) -> Path:
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"kubefake-{pid or os.getpid()}"
