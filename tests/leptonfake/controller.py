"""The fake platform's control loop: scheduling, replicas, the job state machine, retries, TTL and deletion.

A job moves ``Queueing`` (while its node group has no room for its shape) -> ``Starting`` (replicas placed on
nodes, "Pulling image") -> ``Running`` (as soon as one replica runs; ``ready`` follows ``active`` after
``ready_seconds``; what ``ready`` counts is the ``ready_counts`` mode, and an ``unready`` injection dips it) ->
``Completed`` / ``Failed``; ``spec.stopped`` gives ``Stopping`` -> ``Stopped``;
``DELETE`` gives ``Deleting`` -> ``Deleted``; a finished job is ``Archived`` after ``ttl_seconds_after_finished``.
A failed replica is restarted while ``max_failure_retry`` allows; then the whole job is retried
(``PendingRetry`` -> ``Restarting`` -> ``Queueing``) while ``max_job_failure_retry`` allows; both default to 0.

Failures show up where the platform shows them: the replica's ``readiness_issue`` (``InProgress`` / "Pulling
image", ``Failed`` for an image that cannot be pulled, ``ConfigError`` for a missing secret or a bad node), the
job's events, and the failure analysis (``err_class``, ``suggestion``, node events such as ``OOM``).
"""

from __future__ import annotations

import os
import re
import secrets
import string
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from tests.leptonfake.runtime import Launch, Runtime, StartFailure
from tests.leptonfake.store import FINISHED, Injection, Job, Replica, Store
from tests.leptonfake.world import Placement

# runc's own words when the container's command cannot be executed
_EXEC_FAILURE = re.compile(
    r"^exec .+: (argument list too long|no such file or directory|permission denied|exec format error)$"
)
# Kubernetes' message when a Job gives up (Lepton jobs are Kubernetes jobs underneath)
BACKOFF_MESSAGE = "Job has reached the specified backoff limit"


class _MissingSecret(Exception):
    pass


class Controller:
    """Runs :meth:`tick` every ``tick_seconds`` (and at once when the store changes)."""

    def __init__(self, store: Store, runtime: Runtime, workdir: Path, tick_seconds: float = 0.1) -> None:
        self.store = store
        self.world = store.world
        self.runtime = runtime
        self.workdir = workdir
        self.tick_seconds = tick_seconds
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._applied: set[tuple[str, str]] = set()  # (replica id, injection kind) already done
        store.on_change = self._wake.set
        self.thread = threading.Thread(target=self._loop, name="leptonfake-controller", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.thread.join(timeout=10)
        self.runtime.close()

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.tick_seconds)
            self._wake.clear()
            try:
                self.tick()
            except Exception:  # a controller bug must show in the server log, not stop the platform
                traceback.print_exc()

    # ------------------------------------------------------------------ the loop

    def tick(self) -> None:
        states = self.runtime.poll()
        with self.store.lock:
            jobs = [j for j in self.store.jobs.values() if not j.purged and j.state != "Archived"]
        images: dict[str, bool] = {}
        for job in sorted(jobs, key=lambda j: j.created):
            self._step(job, states, images)

    def _step(self, job: Job, states: dict[str, dict[str, Any]], images: dict[str, bool]) -> None:
        settings = self.world.settings
        now = time.time()
        state = job.state
        if state == "Deleted":
            if job.deleted_at is not None and now - job.deleted_at >= float(settings["deleted_visible_seconds"]):
                job.purged = True
            return
        if state == "Deleting":
            for replica in job.replicas:
                self._terminate(job, replica, remove=True)
            if not any(r.terminating for r in job.replicas):
                job.deleted_at = now
                job.set_state("Deleted")
            return
        if state in FINISHED:
            ttl = job.spec.get("ttl_seconds_after_finished")
            if ttl is not None and job.completion_time is not None and now - job.completion_time >= float(ttl):
                for replica in job.replicas:
                    self._terminate(job, replica, remove=True)
                job.set_state("Archived")
            return
        if job.spec.get("stopped") and state not in ("Stopping", "Stopped"):
            job.record_event("Normal", "Stopping", f"Job {job.id} is being stopped")
            job.set_state("Stopping")
            state = job.state
        if state in ("Stopping", "Restarting"):
            for replica in job.current():
                self._terminate(job, replica, remove=False)
            if not any(r.alive or r.terminating for r in job.current()):
                if state == "Stopping":
                    job.record_event("Normal", "Stopped", f"Job {job.id} stopped")
                    job.set_state("Stopped")
                else:
                    job.attempt += 1
                    job.replica_retries = 0  # each attempt of the job has its own replica restarts
                    job.set_state("Queueing")
            return
        if state == "Stopped":
            if not job.spec.get("stopped"):
                job.attempt += 1
                job.record_event("Normal", "Resumed", f"Job {job.id} resumed")
                job.set_state("Queueing")
            return
        if state == "PendingRetry":
            if now - job.state_since >= float(settings["retry_seconds"]):
                job.record_event("Normal", "Restarting", f"Restarting job {job.id} (retry {job.job_retries})")
                job.set_state("Restarting")
            return
        if state == "Queueing":
            self._schedule(job)
            return
        if state in ("Starting", "Running"):
            self._advance(job, states, images)

    # ------------------------------------------------------------------ scheduling

    def allocated(self) -> dict[str, dict[str, int]]:
        """node group id -> node -> GPUs held by live replicas."""
        used: dict[str, dict[str, int]] = {}
        with self.store.lock:
            jobs = list(self.store.jobs.values())
        for job in jobs:
            for replica in job.replicas:
                if replica.placement is not None and (replica.alive or replica.terminating):
                    group = used.setdefault(replica.placement.node_group, {})
                    group[replica.placement.node] = group.get(replica.placement.node, 0) + replica.placement.gpus
        return used

    def _gpus_each(self, job: Job) -> int:
        shape = self.world.shapes(job.node_group()).get(job.spec.get("resource_shape") or "cpu.small") or {}
        return int(shape.get("accelerator_num") or 0)

    def _schedule(self, job: Job) -> None:
        """Replicas exist at once (as pods would); they get nodes when the node group has room for all of them."""
        for index in self._indices_to_run(job):
            self._new_replica(job, index, None)
        if self._place(job):
            job.record_event("Normal", "Scheduled", f"Scheduled {len(job.current())} replica(s) of job {job.id}")
            job.set_state("Starting")

    def _place(self, job: Job) -> bool:
        """Nodes for the job's unplaced replicas, all or none (a gang, as multi-node training needs)."""
        waiting = [r for r in job.current() if r.alive and r.placement is None]
        if not waiting:
            return True
        ng, gpus = job.node_group(), self._gpus_each(job)
        placed = None
        if not job.injection("no_capacity"):
            placed = self.world.place(ng, gpus, len(waiting), self.allocated().get(ng, {}))
        if placed is None:
            message = (
                f"Queueing: waiting for {len(waiting)} x {job.spec.get('resource_shape')} "
                f"({gpus * len(waiting)} GPUs) in node group {ng or 'shared'}"
            )
            for replica in waiting:
                replica.issue = ("NoCapacity", message)
            job.record_event("Normal", "Queueing", message)
            return False
        for replica, placement in zip(waiting, placed, strict=True):
            replica.placement, replica.created, replica.issue = placement, time.time(), ("InProgress", "Pulling image")
        return True

    def _indices_to_run(self, job: Job) -> list[int]:
        done = {r.index for r in job.current() if r.phase == "Succeeded"}
        running = {r.index for r in job.current() if r.alive}
        free = job.parallelism() - len(running)
        return [i for i in range(job.completions()) if i not in done and i not in running][: max(free, 0)]

    def _new_replica(self, job: Job, index: int, placement: Placement | None) -> Replica:
        suffix = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))
        indexed = self.world.settings["replica_ids"] == "indexed"
        replica = Replica(
            f"{job.id}-{index}-{suffix}" if indexed else f"{job.id}-{suffix}", index, job.attempt, placement
        )
        job.replicas.append(replica)
        return replica

    # ------------------------------------------------------------------ replicas

    def _advance(self, job: Job, states: dict[str, dict[str, Any]], images: dict[str, bool]) -> None:
        for replica in list(job.current()):
            if replica.terminating or replica.placement is None:
                continue
            if replica.phase == "Pending":
                self._start(job, replica, images)
            elif replica.phase == "Running":
                self._watch(job, replica, states.get(replica.rid))
        if job.state not in ("Starting", "Running"):
            return  # a failure above moved the job on
        current = job.current()
        if job.state == "Starting" and any(r.phase == "Running" for r in current):
            job.set_state("Running")
        done = {r.index for r in current if r.phase == "Succeeded"}
        if len(done) >= job.completions():
            job.completion_time = time.time()
            job.record_event("Normal", "Completed", "Job completed")
            job.set_state("Completed")
        else:
            # completions > parallelism: the next index starts when a worker is free and a node has room
            for index in self._indices_to_run(job):
                self._new_replica(job, index, None)
            self._place(job)

    def _start(self, job: Job, replica: Replica, images: dict[str, bool]) -> None:
        settings = self.world.settings
        now = time.time()
        if inj := job.injection("unhealthy_node", replica.index):
            message = inj.message or f"Mount point not found on node {self._node(replica)}"
            if replica.issue != ("ConfigError", message):
                replica.issue = ("ConfigError", message)
                job.record_event("Warning", "FailedMount", message, replica.rid)
                job.node_events.append(
                    {"node_event_name": "NodeUnhealthy", "message": message, "node_name": self._node(replica)}
                )
                job.failure = {
                    "err_class": "ERR_INFRA",
                    "suggestion": "The node has an infrastructure problem; stop the job and submit it again.",
                }
            return
        if now - replica.created < float(settings["start_seconds"]):
            return
        image = str((job.spec.get("container") or {}).get("image"))
        if image not in images:
            images[image] = self.runtime.has_image(image)
        if job.injection("image_pull", replica.index) or not images[image]:
            self._pull_failing(job, replica, image)
            return
        try:
            env = self._env(job, replica)
        except _MissingSecret as missing:
            message = f'secret "{missing}" not found'
            if replica.issue != ("ConfigError", message):
                replica.issue = ("ConfigError", message)
                job.record_event("Warning", "Failed", f"Error: {message}", replica.rid)
            return
        binds = self._binds(job, replica)
        if binds is None:
            return
        for name in job.spec.get("image_pull_secrets") or []:
            if name not in self.store.pull_secrets:
                job.record_event(
                    "Warning",
                    "FailedToRetrieveImagePullSecret",
                    f"Unable to retrieve some image pull secrets ({name}); attempting to pull the image may not "
                    "succeed.",
                    replica.rid,
                )
        job.record_event("Normal", "Pulled", f'Container image "{image}" already present on machine', replica.rid)
        try:
            replica.container_id = self.runtime.start(self._launch(job, replica, env, binds))
        except Exception as exc:  # the runtime's own words, as the kubelet reports a StartError
            message = str(exc) if isinstance(exc, StartFailure) else f"{type(exc).__name__}: {exc}"
            job.record_event("Warning", "Failed", f'Error: failed to start container "main": {message}', replica.rid)
            self._ended(job, replica, 128, "StartError", message, oom=False)
            return
        replica.phase, replica.running_since, replica.issue = "Running", time.time(), None
        job.record_event("Normal", "Started", "Started container main", replica.rid)

    def _pull_failing(self, job: Job, replica: Replica, image: str) -> None:
        if replica.pull_started is None:
            replica.pull_started = time.time()
        if time.time() - replica.pull_started < float(self.world.settings["pull_fail_seconds"]):
            return  # still "Pulling image"
        message = (
            f'Failed to pull image "{image}": rpc error: code = Unknown desc = failed to pull and unpack image '
            f'"{image}": failed to resolve reference "{image}": pulling from host failed with status code '
            "[manifests]: 401 Unauthorized"
        )
        if replica.issue is None or replica.issue[0] != "Failed":
            replica.issue = ("Failed", f"ImagePullBackOff: {message}")
            job.record_event("Warning", "Failed", message, replica.rid)
            job.record_event("Warning", "Failed", "Error: ErrImagePull", replica.rid)
            job.failure = {
                "err_class": "ERR_INFRA",
                "suggestion": f"The image {image} cannot be pulled: check the image name and the image pull secret.",
            }
        job.record_event("Normal", "BackOff", f'Back-off pulling image "{image}"', replica.rid)

    def _watch(self, job: Job, replica: Replica, state: dict[str, Any] | None) -> None:
        now = time.time()
        since = replica.running_since or now
        dip = job.injection("unready", replica.index)
        if dip and (replica.rid, "unready") not in self._applied and now - since >= dip.after_seconds:
            self._applied.add((replica.rid, "unready"))
            replica.unready_until = now + dip.seconds
        replica.ready = now - since >= float(self.world.settings["ready_seconds"]) and now >= replica.unready_until
        for kind in ("oom", "evict", "preempt", "exit"):
            inj = job.injection(kind, replica.index)
            if inj and (replica.rid, kind) not in self._applied and now - since >= inj.after_seconds:
                self._applied.add((replica.rid, kind))
                self._inject(job, replica, inj)
                return
        if state is None or state.get("running", True):
            return
        self._ended(job, replica, int(state["exit_code"]), "", state.get("error") or "", oom=bool(state["oom"]))

    def _inject(self, job: Job, replica: Replica, inj: Injection) -> None:
        """Kill the replica's container now, and record the end the test asked for."""
        self.runtime.stop(replica.rid, 0)
        if inj.kind == "oom":
            self._ended(job, replica, 137, "", "", oom=True)
        elif inj.kind in ("evict", "preempt"):
            reason = "Evicted" if inj.kind == "evict" else "Preempted"
            message = inj.message or (
                "The node was low on resource: memory. Container main was using 61Gi, request is 0."
                if inj.kind == "evict"
                else "Preempted by a workload of a higher priority class on a shared node group"
            )
            job.record_event("Warning", reason, message, replica.rid)
            job.node_events.append({"node_event_name": reason, "message": message, "node_name": self._node(replica)})
            job.failure = {
                "err_class": "ERR_INFRA",
                "suggestion": "The replica was evicted from a shared node group; retry, or use a dedicated node group.",
            }
            self._ended(job, replica, 137, reason, message, oom=False)
        else:
            self._ended(job, replica, inj.code, "", "", oom=False)

    def _ended(self, job: Job, replica: Replica, code: int, reason: str, message: str, *, oom: bool) -> None:
        """A replica's container has ended: record it, then apply the retry policy."""
        replica.finished = time.time()
        replica.oom, replica.ready = oom, False
        replica.logs = self.runtime.logs(replica.rid) if replica.container_id else []
        if code and not reason and replica.logs and (failed_exec := _EXEC_FAILURE.match(replica.logs[-1][1])):
            # runc could not exec the command (E2BIG for an env over the exec limit, a missing binary): on a
            # Kubernetes node that is the kubelet's StartError with exit code 128 and the runtime's message
            code, reason = 128, "StartError"
            message = f"failed to create containerd task: OCI runtime start failed: {failed_exec.group(0)}"
            job.record_event("Warning", "Failed", f'Error: failed to start container "main": {message}', replica.rid)
        replica.exit_code = code
        if code == 0 and not reason:
            replica.phase, replica.reason = "Succeeded", "Completed"
            job.record_event("Normal", "Completed", f"Replica {replica.rid} completed", replica.rid)
            return
        replica.phase = "Failed"
        replica.reason = reason or ("OOMKilled" if oom else "Error")
        replica.message = message or f"exit code {code}"
        job.failed += 1
        if oom:
            command = (job.spec.get("container") or {}).get("command") or ["main"]
            victim = os.path.basename(str(command[0]))[:15]
            text = f"OOM encountered, victim process: {victim}, pid: {1000 + replica.index}"
            job.node_events.append({"node_event_name": "OOM", "message": text, "node_name": self._node(replica)})
            job.record_event("Warning", "OOMKilling", f"Replica {replica.rid}: {text}", replica.rid)
            job.failure = {
                "err_class": "ERR_PROGRAM",
                "suggestion": "The container ran out of memory: reduce the batch size or use a larger shape.",
            }
        elif reason == "StartError":
            job.failure = {"err_class": "ERR_PROGRAM", "suggestion": f"The container could not start: {message}"}
        elif reason not in ("Evicted", "Preempted"):
            job.record_event(
                "Warning", "Failed", f"Replica {replica.rid} exited with code {code} ({replica.reason})", replica.rid
            )
            job.failure = {
                "err_class": "ERR_PROGRAM",
                "suggestion": f"Replica {replica.index} exited with code {code} ({replica.reason}): "
                f"{replica.message}. Check the job's logs.",
            }
        self._failure_policy(job, replica)

    def _failure_policy(self, job: Job, replica: Replica) -> None:
        if job.replica_retries < int(job.spec.get("max_failure_retry") or 0):
            job.replica_retries += 1
            job.record_event("Normal", "Restarting", f"Restarting replica {replica.index} ({job.replica_retries})")
            self._new_replica(job, replica.index, replica.placement)
            return
        for other in job.current():
            self._terminate(job, other, remove=False)
        job.record_event("Warning", "BackoffLimitExceeded", BACKOFF_MESSAGE)
        if job.job_retries < int(job.spec.get("max_job_failure_retry") or 0):
            job.job_retries += 1
            attempt = {**job.render()["status"], "state": "Failed", "completion_time": int(time.time() * 1000)}
            attempt.pop("job_history", None)
            job.attempts.append(attempt)
            job.set_state("PendingRetry")
            return
        job.completion_time = time.time()
        job.set_state("Failed")

    def _terminate(self, job: Job, replica: Replica, *, remove: bool) -> None:
        """Stop a replica's container (with grace) in the background; remove it too when the job goes away."""
        if replica.terminating or (not replica.alive and not (remove and replica.container_id)):
            return
        replica.terminating = True

        def run() -> None:
            try:
                if replica.container_id and replica.alive:
                    self.runtime.stop(replica.rid, float(self.world.settings["stop_grace_seconds"]))
                if replica.container_id and replica.logs is None:
                    replica.logs = self.runtime.logs(replica.rid)
                if remove and replica.container_id:
                    self.runtime.remove(replica.rid)
                    replica.container_id = None
                if replica.alive:
                    replica.phase, replica.reason, replica.finished = "Terminated", "Terminated", time.time()
            finally:
                replica.terminating = False
                self._wake.set()

        threading.Thread(target=run, name=f"leptonfake-stop-{replica.rid}", daemon=True).start()

    @staticmethod
    def _node(replica: Replica) -> str:
        return replica.placement.node if replica.placement else ""

    # ------------------------------------------------------------------ what a container gets

    def _env(self, job: Job, replica: Replica) -> dict[str, str]:
        env: dict[str, str] = {}
        for item in job.spec.get("envs") or []:
            ref = (item.get("value_from") or {}).get("secret_name_ref")
            if ref:
                secret = self.store.user_secrets.get(ref)
                if secret is None:
                    raise _MissingSecret(ref)
                env[item["name"]] = secret["value"]
            else:
                env[item["name"]] = str(item.get("value") or "")
        group = self.world.group(job.node_group()) or {}
        gpus = self._gpus_each(job)
        # the platform's own variables come last: they win over a user's of the same name
        env.update(
            {
                "LEPTON_WORKSPACE_ID": self.world.workspace_id,
                "LEPTON_JOB_NAME": job.id,
                "LEPTON_JOB_SERVICE_PREFIX": job.id,
                "LEPTON_JOB_WORKER_PREFIX": job.id,
                "LEPTON_JOB_WORKER_HOSTNAME_PREFIX": job.id,
                "LEPTON_SUBDOMAIN": f"{job.id}-job-svc",
                "LEPTON_JOB_WORKER_INDEX": str(replica.index),
                "LEPTON_JOB_TOTAL_WORKERS": str(job.completions()),
                "LEPTON_RESOURCE_ACCELERATOR_TYPE": group.get("gpu_product", "") if gpus else "",
                "LEPTON_RESOURCE_ACCELERATOR_NUM": str(gpus),
                "LEPTON_REPLICA_ID": replica.rid,
            }
        )
        return env

    def _binds(self, job: Job, replica: Replica) -> list[tuple[str, str, bool]] | None:
        """Host folders for the job's mounts, or None (and a ConfigError) when one is not allowed."""
        binds = []
        for mount in job.spec.get("mounts") or []:
            source = str(mount.get("from") or "")
            path = str(mount.get("path") or "/")
            read_only = bool((mount.get("mount_options") or {}).get("read_only"))
            if source.startswith("node-nfs:"):
                name = source.split(":", 1)[1]
                problem = ""
                if self.world.volume(job.node_group(), name) is None:
                    problem = f"Mount point not found: volume {name} is not attached to node group {job.node_group()}"
                elif not self.world.mount_allowed(name, path):
                    problem = f"MountVolume.SetUp failed for volume {name}: permission denied for path {path}"
                if problem:
                    if replica.issue != ("ConfigError", problem):
                        replica.issue = ("ConfigError", problem)
                        job.record_event("Warning", "FailedMount", problem, replica.rid)
                    return None
                host = self.volume_path(name, path, job.node_group())
            else:
                host = self.workdir / "local" / job.key / path.strip("/")
            host.mkdir(parents=True, exist_ok=True)
            host.chmod(0o777)
            binds.append((str(host), str(mount["mount_path"]), read_only))
        return binds

    def volume_path(self, volume: str, path: str, ng_id: str = "") -> Path:
        """The host folder behind ``path`` on a node-group volume (paths may start with the volume's from_path)."""
        spec = self.world.volume(ng_id, volume) if ng_id else None
        from_path = str((spec or {}).get("from_path") or "").rstrip("/")
        rel = path
        if from_path and (path == from_path or path.startswith(from_path + "/")):
            rel = path[len(from_path) :]
        return self.workdir / "volumes" / volume / rel.strip("/")

    def _launch(self, job: Job, replica: Replica, env: dict[str, str], binds: list[tuple[str, str, bool]]) -> Launch:
        shape = self.world.shapes(job.node_group()).get(job.spec.get("resource_shape") or "cpu.small") or {}
        host = f"{job.id}-{replica.index}"
        sub = f"{job.id}-job-svc"
        aliases = [host]
        if job.spec.get("intra_job_communication"):
            # the job's headless service exists only when replicas may talk to each other
            aliases += [f"{host}.{sub}", f"{host}.{sub}.ws-{self.world.workspace_id}.svc.cluster.local"]
        shm = job.spec.get("shared_memory_size")
        return Launch(
            rid=replica.rid,
            job_id=job.id,
            image=str(job.spec["container"]["image"]),
            command=(job.spec.get("container") or {}).get("command") or None,
            env=env,
            binds=binds,
            shm_bytes=int(shm) * 1024 * 1024 if shm else None,
            mem_bytes=int(shape.get("memory_in_mb") or 0) * 1024 * 1024 or None,
            gpus=int(shape.get("accelerator_num") or 0),
            hostname=host,
            aliases=aliases,
        )
