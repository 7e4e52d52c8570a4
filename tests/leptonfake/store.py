"""What the fake Lepton control plane holds: jobs (with the exact body each was created from, its state history,
replicas and events), user secrets and image pull secrets; the server-side checks a job gets at create; the
queries ``GET /jobs`` answers; and every object rendered in the JSON shapes ``leptonai`` 0.47.1 parses.

Errors are :class:`ApiError`, answered as the backend's ``{"code": ..., "message": ...}`` body (the shape the
client's own tests use for the real server's answers).
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import string
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tests.kubefake.store import parse_label_selector  # the same selector grammar (the CLI's labels_to_selector)
from tests.leptonfake.world import Placement, World

#: States in which a job is still "alive" (listed with job_query_mode=alive_only).
ALIVE = ("Queueing", "Starting", "Running", "Stopping", "Stopped", "Deleting", "Completed", "Failed",
         "PendingRetry", "Restarting", "Awaiting")  # fmt: skip
FINISHED = ("Completed", "Failed")
_JOB_NAME = re.compile(r"^[a-z][a-z0-9-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_NAME = re.compile(r"^[A-Za-z0-9._-]{1,253}$")  # a Kubernetes Secret data key
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class ApiError(Exception):
    """An answer other than 2xx, with the backend's JSON error body."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = headers or {}

    def body(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def bad_request(message: str) -> ApiError:
    return ApiError(400, "InvalidRequest", message)


def not_found(kind: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f"{kind} {name} not found")


def now_ms() -> int:
    return int(time.time() * 1000)


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _random_suffix(n: int) -> str:
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(n))


@dataclass
class Replica:
    """One worker of one attempt of a job (a pod on the real platform)."""

    rid: str
    index: int
    attempt: int
    placement: Placement | None  # None while the job waits for capacity (no node yet)
    created: float = field(default_factory=time.time)
    phase: str = "Pending"  # Pending | Running | Succeeded | Failed
    ready: bool = False
    issue: tuple[str, str] | None = ("InProgress", "Pulling image")  # readiness_issue (reason, message)
    pull_started: float | None = None
    container_id: str | None = None
    running_since: float | None = None
    finished: float | None = None
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    oom: bool = False
    logs: list[tuple[int, str]] | None = None  # kept once the container has ended (the platform's log store)
    terminating: bool = False
    unready_until: float = 0.0  # an injected readiness dip: not ready until then, though running

    @property
    def alive(self) -> bool:
        return self.phase in ("Pending", "Running")


@dataclass
class Injection:
    """A fault the tests asked for: applies to the next ``times`` jobs that match (0 = every one)."""

    kind: str  # oom | image_pull | no_capacity | evict | preempt | unhealthy_node | exit | unready
    match: dict[str, Any]  # id / name / name_prefix: str; labels: dict
    code: int = 1
    after_seconds: float = 0.0
    replica: int | None = None
    times: int = 1
    message: str = ""
    seconds: float = 0.0  # how long an "unready" dip lasts

    def matches(self, job: Job) -> bool:
        m = self.match
        labels = job.metadata.get("labels") or {}
        return (
            ("id" not in m or m["id"] == job.id)
            and ("name" not in m or m["name"] == job.name)
            and ("name_prefix" not in m or job.name.startswith(m["name_prefix"]))
            and all(labels.get(k) == v for k, v in (m.get("labels") or {}).items())
        )


@dataclass
class Job:
    """A job and everything the platform knows about it."""

    key: str  # internal, unique for ever (ids may repeat once a job is gone)
    id: str
    name: str
    body: dict[str, Any]  # exactly what the client sent
    metadata: dict[str, Any]
    spec: dict[str, Any]
    created: float = field(default_factory=time.time)
    state: str = "Queueing"
    state_since: float = field(default_factory=time.time)
    history: list[dict[str, Any]] = field(default_factory=list)
    replicas: list[Replica] = field(default_factory=list)  # every replica of every attempt, oldest first
    attempt: int = 0
    replica_retries: int = 0
    job_retries: int = 0
    failed: int = 0
    completion_time: float | None = None
    deleted_at: float | None = None
    purged: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)
    node_events: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)  # status details of earlier attempts
    injections: list[Injection] = field(default_factory=list)
    failure: dict[str, Any] | None = None  # err_class + suggestion once something went wrong
    ready_counts: str = "running"  # the world's ready_counts when the job was created

    def set_state(self, state: str) -> None:
        if self.state in ("Deleting", "Deleted") and state != "Deleted":
            return  # a deletion is final: the controller's step that read an older state must not undo a DELETE
        if state != self.state:
            self.state, self.state_since = state, time.time()
            self.history.append({"state": state, "at": time.time()})

    @property
    def alive(self) -> bool:
        return self.state in ALIVE

    @property
    def archived(self) -> bool:
        return self.state in ("Archived", "Deleted") and not self.purged

    def current(self) -> list[Replica]:
        return [r for r in self.replicas if r.attempt == self.attempt]

    def completions(self) -> int:
        return max(int(self.spec.get("completions") or 1), 1)

    def parallelism(self) -> int:
        return max(int(self.spec.get("parallelism") or 1), 1)

    def node_group(self) -> str:
        groups = (self.spec.get("affinity") or {}).get("allowed_dedicated_node_groups") or []
        return groups[0] if groups else ""

    def injection(self, kind: str, index: int | None = None) -> Injection | None:
        for inj in self.injections:
            if inj.kind == kind and (inj.replica is None or index is None or inj.replica == index):
                return inj
        return None

    def record_event(self, kind: str, reason: str, message: str, replica: str | None = None) -> None:
        now = time.time()
        for event in self.events:
            if (event["type"], event["reason"], event["message"]) == (kind, reason, message):
                event["count"] += 1
                event["last_observed_time"] = iso(now)
                return
        regarding = {"kind": "Pod" if replica else "Job", "name": replica or self.id}
        self.events.append(
            {
                "type": kind,
                "reason": reason,
                "message": message,
                "count": 1,
                "first_observed_time": iso(now),
                "last_observed_time": iso(now),
                "regarding": regarding,
            }
        )

    # ------------------------------------------------------------------ rendering

    def counts(self) -> dict[str, int]:
        current = self.current()
        done = {r.index for r in self.replicas if r.phase == "Succeeded" and r.attempt == self.attempt}
        finished = "Succeeded" if self.ready_counts == "succeeded_too" else None
        return {
            "ready": sum(1 for r in current if (r.phase == "Running" and r.ready) or r.phase == finished),
            "active": sum(1 for r in current if r.alive and not r.terminating),
            "failed": self.failed,
            "succeeded": len(done),
        }

    def render(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "job_name": self.id,
            "state": self.state,
            **self.counts(),
            "creation_time": int(self.created * 1000),
            "job_history": copy.deepcopy(self.attempts),
        }
        if self.completion_time:
            status["completion_time"] = int(self.completion_time * 1000)
        return {"metadata": copy.deepcopy(self.metadata), "spec": copy.deepcopy(self.spec), "status": status}

    def render_replica(self, replica: Replica, world: World) -> dict[str, Any]:
        shape = world.shapes(self.node_group()).get(self.spec.get("resource_shape") or "cpu.small") or {}
        status: dict[str, Any] = {
            "state": replica.phase,
            "public_ip": None,
            "domains": [],
            "cpu": shape.get("cpu"),
            "memory_in_mb": shape.get("memory_in_mb"),
            "ready": replica.ready,
            "worker_index": replica.index,
        }
        if replica.placement is not None:
            node = replica.placement.node
            status["node"] = {"name": node, "id": node, "node_group_id": self.node_group()}
        if replica.issue and replica.alive:
            reason, message = replica.issue
            since = iso(replica.created)
            status["readiness_issue"] = {"reason": reason, "message": message, "creationTimestamp": since}
        meta = {"id": replica.rid, "name": replica.rid, "created_at": int(replica.created * 1000)}
        return {"metadata": meta, "id": replica.rid, "status": status}

    def analysis(self) -> dict[str, Any]:
        failure = self.failure or {}
        streams = []
        for replica in self.replicas:
            if replica.phase == "Failed" and replica.logs:
                streams.append({"replica": replica.rid, "lines": [line for _, line in replica.logs[-50:]]})
        return {
            "job_id": self.id,
            "err_class": failure.get("err_class", ""),
            "suggestion": failure.get("suggestion", ""),
            "job_failure_by_node_event": copy.deepcopy(self.node_events),
            "log_streams": streams,
        }


class Store:
    """Jobs and secrets, behind one lock the HTTP threads and the controller share."""

    def __init__(self, world: World, id_mode: str = "name") -> None:
        self.world = world
        self.id_mode = id_mode
        self.lock = threading.RLock()
        self.jobs: dict[str, Job] = {}
        self.user_secrets: dict[str, dict[str, Any]] = {}
        self.pull_secrets: dict[str, dict[str, Any]] = {}
        self.secret_record: list[dict[str, Any]] = []  # every secret value ever stored, for leak checks
        self.injections: list[Injection] = []
        self.on_change: Any = lambda: None

    # ------------------------------------------------------------------ lookup

    def find(self, job_id: str, mode: str = "alive_and_archive") -> Job:
        """The job a route names: an alive one first, else (modes permitting) the newest archived one."""
        with self.lock:
            matches = sorted(
                (j for j in self.jobs.values() if j.id == job_id and not j.purged), key=lambda j: -j.created
            )
            alive = [j for j in matches if j.alive]
            archived = [j for j in matches if j.archived]
            pool = {"alive_only": alive, "archive_only": archived}.get(mode, alive + archived)
            if not pool:
                raise not_found("job", job_id)
            return pool[0]

    # ------------------------------------------------------------------ create

    def create_job(self, body: dict[str, Any], raw_size: int) -> Job:
        settings = self.world.settings
        if raw_size > int(settings["max_job_bytes"]):
            raise ApiError(
                413,
                "RequestEntityTooLarge",
                f"request body is {raw_size} bytes; the job spec limit is {settings['max_job_bytes']} bytes",
            )
        if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
            raise bad_request("metadata is required")
        meta_in = body["metadata"]
        spec = copy.deepcopy(body.get("spec") or {})
        requested = meta_in.get("id") or meta_in.get("name") or ""
        name = meta_in.get("name") or requested
        if not _JOB_NAME.match(requested) or len(requested) > 36 or requested.endswith("-"):
            raise bad_request(
                f"invalid job name {requested!r}: must match ^[a-z][a-z0-9-]*$, at most 36 characters, "
                "not ending with '-'"
            )
        self._check_spec(spec, meta_in.get("labels") or {})
        with self.lock:
            alive = [j for j in self.jobs.values() if j.alive]
            suffixed = self.id_mode == "suffix" or (self.id_mode == "auto" and not meta_in.get("id"))
            if suffixed:
                if settings["unique_names"] and any(j.name == name for j in alive):
                    raise ApiError(409, "AlreadyExists", f"job with name {name} already exists")
                job_id = f"{requested}-{_random_suffix(4)}"
                while any(j.id == job_id for j in alive):
                    job_id = f"{requested}-{_random_suffix(4)}"
            else:
                job_id = requested
                if any(j.id == job_id for j in alive):
                    raise ApiError(409, "AlreadyExists", f"job {job_id} already exists")
            metadata = {
                **copy.deepcopy(meta_in),
                "id": job_id,
                "name": name,
                "created_at": now_ms(),
                "last_modified_at": now_ms(),
                "version": 1,
                "created_by": self.world.data["user"],
                "owner": self.world.data["user"],
                "visibility": meta_in.get("visibility") or "public",
            }
            spec.setdefault("resource_shape", "cpu.small")
            spec.setdefault("completions", 1)
            spec.setdefault("parallelism", 1)
            spec.setdefault("ttl_seconds_after_finished", 600)
            job = Job(uuid.uuid4().hex, job_id, name, copy.deepcopy(body), metadata, spec)
            job.ready_counts = str(settings["ready_counts"])
            job.history.append({"state": job.state, "at": job.created})
            for rule in list(self.injections):
                if rule.matches(job):
                    job.injections.append(rule)
                    if rule.times == 1:
                        self.injections.remove(rule)
                    elif rule.times > 1:
                        rule.times -= 1
            self.jobs[job.key] = job
        self.on_change()
        return job

    def _check_spec(self, spec: dict[str, Any], labels: dict[str, Any]) -> None:
        world, settings = self.world, self.world.settings
        container = spec.get("container") or {}
        if not container.get("image"):
            raise bad_request("spec.container.image is required")
        affinity = spec.get("affinity") or {}
        groups = affinity.get("allowed_dedicated_node_groups") or []
        for ng in groups:
            if world.group(ng) is None:
                raise bad_request(f"dedicated node group {ng} not found in workspace {world.workspace_id}")
        ng_id = groups[0] if groups else ""
        shape_name = spec.get("resource_shape") or "cpu.small"
        shape = world.shapes(ng_id).get(shape_name)
        if shape is None or "job" not in (shape.get("listable_in") or ["job"]):
            offered = ", ".join(sorted(world.shapes(ng_id)))
            raise bad_request(f"resource shape {shape_name} is not available (available: {offered})")
        for key in ("completions", "parallelism"):
            if key in spec and (not isinstance(spec[key], int) or spec[key] < 1):
                raise bad_request(f"spec.{key} must be a positive integer")
        for env in spec.get("envs") or []:
            if not _ENV_NAME.match(str(env.get("name", ""))):
                raise bad_request(f"invalid environment variable name {env.get('name')!r}")
            source = env.get("value_from")
            if source is not None and (env.get("value") is not None or not (source or {}).get("secret_name_ref")):
                raise bad_request(f"environment variable {env['name']}: either value or value_from.secret_name_ref")
        for mount in spec.get("mounts") or []:
            source = str(mount.get("from") or "")
            if source.startswith("node-nfs:"):
                volume = source.split(":", 1)[1]
                if settings["mount_check"] != "create":
                    continue  # checked when a replica starts (ConfigError), as a node mounts it
                if world.volume(ng_id, volume) is None:
                    raise bad_request(f"volume {volume} is not attached to node group {ng_id or '(none)'}")
                if not world.mount_allowed(volume, mount.get("path") or "/"):
                    raise bad_request(
                        f"permission denied: path {mount.get('path') or '/'} of volume {volume} is outside its "
                        f"storage permissions ({', '.join(world.permissions(volume))})"
                    )
            elif source not in ("node-local",) and not source.startswith("local:"):
                raise bad_request(f"unsupported mount source {source!r}")
        if settings["label_rules"] == "kubernetes":
            self._check_labels(labels)

    @staticmethod
    def _check_labels(labels: dict[str, Any]) -> None:
        for key, value in labels.items():
            if not _LABEL_KEY.match(key) or len(key.split("/")[-1]) > 63:
                raise bad_request(f"invalid label key {key!r}")
            if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
                raise bad_request(
                    f"invalid label value {value!r} for {key}: at most 63 characters, alphanumerics, "
                    "'-', '_' or '.', starting and ending with an alphanumeric"
                )

    # ------------------------------------------------------------------ list

    def list_jobs(self, query: dict[str, list[str]]) -> list[Job]:
        mode = _one(query, "job_query_mode") or "alive_only"
        q = _one(query, "q")
        selector = parse_label_selector(_one(query, "query") or "")
        states = set(query.get("status") or [])
        groups = set(query.get("node_groups") or [])
        created_by = _one(query, "created_by")
        with self.lock:
            found = []
            for job in self.jobs.values():
                if job.purged:
                    continue
                if mode == "alive_only" and not job.alive:
                    continue
                if mode == "archive_only" and not job.archived:
                    continue
                if q and q not in job.name and q not in job.id:
                    continue
                labels = job.metadata.get("labels") or {}
                if not all(req.matches(labels) for req in selector):
                    continue
                if states and job.state not in states:
                    continue
                if groups and job.node_group() not in groups:
                    continue
                if created_by and job.metadata.get("created_by") != created_by:
                    continue
                found.append(job)
        found.sort(key=lambda j: (-j.created, j.key))
        page, size = _one(query, "page"), _one(query, "page_size")
        if page or size:
            n, per = max(int(page or 1), 1), max(int(size or 50), 1)
            per = min(per, int(self.world.settings["page_cap"]) or per)
            found = found[(n - 1) * per : n * per]
        return found

    # ------------------------------------------------------------------ patch

    def patch_job(self, job: Job, body: dict[str, Any]) -> None:
        """``spec.stopped`` (stop / start) and, as ``patch_labels`` says, ``metadata.labels``."""
        spec_in = body.get("spec") or {} if isinstance(body, dict) else {}
        labels = (body.get("metadata") or {}).get("labels") if isinstance(body, dict) else None
        stopped = spec_in.get("stopped")
        label_mode = self.world.settings["patch_labels"]
        if (stopped is None and labels is None) or (labels is not None and label_mode == "reject"):
            raise bad_request("no valid field to update")
        with self.lock:
            if stopped and job.state in FINISHED:
                raise bad_request(f"job {job.id} has already finished ({job.state}) and cannot be stopped")
            if labels is not None and label_mode == "accept":
                merged = {k: v for k, v in {**(job.metadata.get("labels") or {}), **labels}.items() if v is not None}
                if self.world.settings["label_rules"] == "kubernetes":
                    self._check_labels(merged)
                job.metadata["labels"] = merged
            if stopped is not None:
                job.spec["stopped"] = bool(stopped)
            job.metadata["last_modified_at"] = now_ms()
            job.metadata["version"] = int(job.metadata.get("version") or 1) + 1
        self.on_change()

    # ------------------------------------------------------------------ secrets

    def create_user_secrets(self, items: Any) -> None:
        if not isinstance(items, list) or not items:
            raise bad_request("the request body must be a non-empty list of secrets")
        with self.lock:
            for item in items:
                name, value = (item or {}).get("name"), (item or {}).get("value")
                if not isinstance(name, str) or not _SECRET_NAME.match(name):
                    raise bad_request(f"invalid secret name {name!r}: letters, digits, '.', '_' or '-'")
                if not isinstance(value, str):
                    raise bad_request(f"secret {name}: a value is required")
                if len(value.encode()) > int(self.world.settings["max_secret_bytes"]):
                    raise bad_request(
                        f"secret {name} is {len(value.encode())} bytes; at most "
                        f"{self.world.settings['max_secret_bytes']} bytes"
                    )
                if name in self.user_secrets and self.world.settings["secret_overwrite"] == "reject":
                    raise ApiError(409, "AlreadyExists", f"secret {name} already exists")
            for item in items:
                self.user_secrets[item["name"]] = {
                    "name": item["name"],
                    "value": item["value"],
                    "visibility": item.get("visibility") or "private",
                    "owner": self.world.data["user"],
                }
                self.secret_record.append({"kind": "user", "name": item["name"], "value": item["value"]})

    def render_user_secrets(self) -> list[dict[str, Any]]:
        with self.lock:
            return [{k: v for k, v in s.items() if k != "value"} for s in self.user_secrets.values()]

    def delete_user_secret(self, name: str) -> None:
        with self.lock:
            if self.user_secrets.pop(name, None) is None:
                raise not_found("secret", name)

    def create_pull_secret(self, body: Any) -> dict[str, Any]:
        meta, spec = (body or {}).get("metadata") or {}, (body or {}).get("spec") or {}
        name = meta.get("name") or meta.get("id")
        if not name or not spec.get("registry_server") or not spec.get("password"):
            raise bad_request("metadata.name, spec.registry_server and spec.password are required")
        with self.lock:
            if name in self.pull_secrets:
                raise ApiError(409, "AlreadyExists", f"image pull secret {name} already exists")
            self.pull_secrets[name] = {"metadata": {"name": name, "id": name, "created_at": now_ms()}, "spec": spec}
            self.secret_record.append({"kind": "image_pull", "name": name, "value": spec["password"]})
            return self._public_pull_secret(name)

    def _public_pull_secret(self, name: str) -> dict[str, Any]:
        item = copy.deepcopy(self.pull_secrets[name])
        item["spec"].pop("password", None)
        return dict(item)

    def render_pull_secrets(self) -> list[dict[str, Any]]:
        with self.lock:
            return [self._public_pull_secret(name) for name in self.pull_secrets]

    def delete_pull_secret(self, name: str) -> None:
        with self.lock:
            if self.pull_secrets.pop(name, None) is None:
                raise not_found("image pull secret", name)

    # ------------------------------------------------------------------ records for the tests

    def record(self, job: Job) -> dict[str, Any]:
        return {
            "id": job.id,
            "name": job.name,
            "key": job.key,
            "body": job.body,
            "body_json": json.dumps(job.body, sort_keys=True),
            "state": job.state,
            "history": job.history,
            "labels": job.metadata.get("labels") or {},
            "replicas": [
                {
                    "id": r.rid,
                    "index": r.index,
                    "attempt": r.attempt,
                    "phase": r.phase,
                    "container_id": r.container_id,
                    "exit_code": r.exit_code,
                    "reason": r.reason,
                    "node": r.placement.node if r.placement else None,
                    "placed_at": r.created if r.placement else None,  # its metadata.created_at
                }
                for r in job.replicas
            ],
            "completion_time": job.completion_time,
            "deleted": job.deleted_at is not None,
            "purged": job.purged,
        }


def _one(query: dict[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[-1] if values else None
