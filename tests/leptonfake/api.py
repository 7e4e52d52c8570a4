"""The HTTP face of the fake: the workspace API under ``/api/v2/workspaces/<ws>/`` (what ``leptonai`` 0.47.1 and
the TAO SDK's raw requests call), plus ``/fake/*`` for the tests (no auth, outside the workspace path).

Workspace routes need ``Authorization: Bearer <token>``. ``/fake/faults`` makes matching workspace requests fail
(``{"status": 503|500|429|"timeout", "seconds": N, "route": "GET /jobs", "retry_after": 2}``; ``route`` is a
substring of ``"<METHOD> <route template>"``); ``/fake/inject`` plants a failure in matching jobs, now and to come;
``/fake/capacity`` and ``/fake/config`` change the world and the clock; ``/fake/jobs``, ``/fake/secrets``,
``/fake/containers``, ``/fake/stats`` and ``/fake/requests`` are what the tests check.
"""

from __future__ import annotations

import collections
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.leptonfake.controller import Controller
from tests.leptonfake.store import ApiError, Injection, Job, Store, bad_request, not_found

#: ``time_unit`` -> the factor from the milliseconds the store keeps (leptonai's CLI reads s, ms, µs and ns).
_TIME_UNITS = {"s": 1e-3, "ms": 1.0, "us": 1e3, "ns": 1e6}
_INJECTIONS = ("oom", "image_pull", "no_capacity", "evict", "preempt", "unhealthy_node", "exit", "unready")


class FakeLeptonServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], store: Store, controller: Controller, token: str) -> None:
        super().__init__(address, _Handler)
        self.store = store
        self.controller = controller
        self.world = store.world
        self.token = token
        self.faults: list[dict[str, Any]] = []
        self.stats: Counter[str] = Counter()
        self.recent: collections.deque[str] = collections.deque(maxlen=1000)
        self.stats_lock = threading.Lock()

    def fault_for(self, route: str) -> dict[str, Any] | None:
        now = time.time()
        with self.stats_lock:
            self.faults = [f for f in self.faults if f["until"] > now]
            return next((f for f in self.faults if f.get("route", "") in route), None)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client's requests.Session reuses its connections
    # headers and body go out as two writes: without TCP_NODELAY, Nagle + delayed ACK add 40 ms to each answer
    disable_nagle_algorithm = True
    server: FakeLeptonServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet; /fake/requests keeps the lines
        return

    # ------------------------------------------------------------------ plumbing

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None, text: bool = False) -> None:
        data = body.encode() if text else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8" if text else "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)
        self._status = status

    def _stream(self, chunks: Iterable[bytes]) -> None:
        """A chunked plain-text response, written as the chunks come (a replica's log, followed)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._status = 200
        try:
            for chunk in chunks:
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _raw(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _json(self, raw: bytes) -> Any:
        try:
            return json.loads(raw) if raw else {}
        except ValueError as exc:
            raise bad_request(f"the request body is not valid JSON: {exc}") from exc

    def _dispatch(self) -> None:
        method = self.command
        url = urlsplit(self.path)
        query = parse_qs(url.query, keep_blank_values=True)
        parts = [unquote(p) for p in url.path.split("/") if p]
        self._status = 0
        raw = self._raw()
        try:
            if parts[:1] == ["fake"]:
                self._fake(method, parts[1:], query, raw)
            elif parts[:3] == ["api", "v2", "workspaces"] and len(parts) >= 4:
                self._workspace(method, parts[3], parts[4:], query, raw)
            else:
                raise ApiError(404, "NotFound", "404 page not found")
        except ApiError as exc:
            self._send(exc.status, exc.body(), exc.headers)
        except Exception as exc:  # a fake's bug: answer as a server error, and show it in the server log
            self._send(500, {"code": "InternalError", "message": f"leptonfake: {exc!r}"})
            raise
        finally:
            if parts[:1] != ["fake"]:
                self.server.recent.append(f"{method} {self.path} -> {self._status}")

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _dispatch

    # ------------------------------------------------------------------ the workspace API

    def _workspace(self, method: str, ws: str, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        route, handler = _route(method, parts)
        key = f"{method} {route}"
        with self.server.stats_lock:
            self.server.stats[key] += 1
        if fault := self.server.fault_for(key):
            if fault["status"] == "timeout":
                time.sleep(float(fault.get("hold_seconds", 30)))
                self.close_connection = True
                self._status = -1
                return
            status = int(fault["status"])
            headers = {"Retry-After": str(fault["retry_after"])} if fault.get("retry_after") else {}
            code = {503: "ServiceUnavailable", 429: "TooManyRequests"}.get(status, "InternalError")
            raise ApiError(status, code, f"injected fault: {status}", headers)
        if self.headers.get("Authorization", "") != f"Bearer {self.server.token}":
            raise ApiError(401, "Unauthorized", "invalid or expired token")
        if self.server.world.settings["auth"] == "forbid":
            raise ApiError(403, "StatusForbidden", f"the token has no access to workspace {ws}")
        if ws != self.server.world.workspace_id:
            raise ApiError(404, "NotFound", f"workspace {ws} not found")
        if handler is None:
            raise ApiError(404, "NotFound", "404 page not found")
        handler(self, parts, query, raw)

    # jobs

    def jobs_list(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        self._send(200, {"jobs": [self._render(j) for j in self.server.store.list_jobs(query)]})

    def jobs_create(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        job = self.server.store.create_job(self._json(raw), len(raw))
        self._send(201, self._render(job))

    def _render(self, job: Job) -> dict[str, Any]:
        """The job as sent, its ``creation_time`` / ``completion_time`` (kept in ms) in the world's ``time_unit``."""
        record = job.render()
        scale = _TIME_UNITS[str(self.server.world.settings["time_unit"])]
        for status in (record["status"], *(record["status"].get("job_history") or [])):
            for key in ("creation_time", "completion_time"):
                if isinstance(status.get(key), int):
                    status[key] = int(status[key] * scale)
        return record

    def _job(self, job_id: str, query: dict[str, list[str]], default: str = "alive_and_archive") -> Job:
        mode = (query.get("job_query_mode") or [default])[-1]
        return self.server.store.find(job_id, mode)

    def job_get(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        self._send(200, self._render(self._job(parts[1], query)))

    def job_patch(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        job = self._job(parts[1], query, "alive_only")
        body = self._json(raw)
        if not isinstance(body, dict):
            raise bad_request("no valid field to update")
        self.server.store.patch_job(job, body)
        self._send(200, self._render(job))

    def job_delete(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        job = self._job(parts[1], query, "alive_only")
        with self.server.store.lock:
            if job.state == "Archived":
                job.deleted_at = time.time()
                job.set_state("Deleted")
            elif job.state not in ("Deleting", "Deleted"):
                job.record_event("Normal", "Deleting", f"Job {job.id} is being deleted")
                job.set_state("Deleting")
        self.server.controller.wake()
        self._send(200, self._render(job))

    def job_events(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        events = list(self._job(parts[1], query).events)
        if not self.server.world.settings["event_message"]:
            events = [{k: v for k, v in e.items() if k != "message"} for e in events]
        self._send(200, events)

    def job_replicas(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        job = self._job(parts[1], query)
        mode = (query.get("job_query_mode") or ["alive_and_archive"])[-1]
        replicas = job.current() if job.alive else list(job.replicas)
        if mode == "alive_only":
            replicas = [r for r in replicas if r.alive]
        self._send(200, [job.render_replica(r, self.server.world) for r in replicas])

    def job_failure_analysis(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        if not self.server.world.settings["failure_analysis"]:
            raise ApiError(404, "NotFound", "404 page not found")
        self._send(200, self._job(parts[1], query).analysis())

    def replica_log(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        job = self._job(parts[1], query)
        replica = next((r for r in job.replicas if r.rid == parts[3]), None)
        if replica is None:
            raise not_found("replica", parts[3])
        if replica.logs is not None:
            self._stream([("".join(line + "\n" for _, line in replica.logs)).encode()])
        elif replica.container_id is None:
            raise bad_request(f"replica {replica.rid} has not started yet")
        else:
            self._stream(self.server.controller.runtime.follow(replica.rid))

    def logs(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        """The log store's Loki ``query_range`` answer for one job (or one replica of it)."""

        def one(key: str) -> str | None:
            values = query.get(key)
            return values[-1] if values else None

        job_id = one("job") or one("job_history_name")
        mode = one("job_query_mode") or "alive_and_archive"
        try:
            job = self.server.store.find(job_id or "", mode)
        except ApiError:
            self._send(200, {"status": "success", "data": {"resultType": "streams", "result": []}})
            return
        start, end = int(one("start") or 0), int(one("end") or 0)
        limit = int(one("limit") or self.server.world.settings["log_default_limit"])
        text = one("q") or ""
        backward = (one("direction") or "backward") == "backward"
        rows: list[tuple[int, str, str]] = []
        runtime = self.server.controller.runtime
        for replica in job.replicas:
            if one("replica") and replica.rid != one("replica"):
                continue
            lines = replica.logs
            if lines is None:
                lines = runtime.logs(replica.rid) if replica.container_id else []
            rows += [
                (ts, replica.rid, line)
                for ts, line in lines
                if (not start or ts >= start) and (not end or ts < end) and text in line
            ]
        rows.sort(key=lambda r: r[0], reverse=backward)
        streams: dict[str, list[list[Any]]] = {}
        # each value [ts_ns, line] | [ts_ns, line, metadata] (``log_values``; leptonai reads both)
        metadata = {"triple": [{"stream": "stdout"}], "pair": []}[str(self.server.world.settings["log_values"])]
        for ts, rid, line in rows[:limit]:
            streams.setdefault(rid, []).append([str(ts), line, *metadata])
        result = [
            {"stream": {"job": job.id, "replica": rid, "workspace": self.server.world.workspace_id}, "values": values}
            for rid, values in streams.items()
        ]
        self._send(200, {"status": "success", "data": {"resultType": "streams", "result": result}})

    # workspace, node groups, shapes, storage

    def workspace_info(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        store = self.server.store
        with store.lock:
            counts = {
                "jobs": sum(1 for j in store.jobs.values() if j.alive),
                "secrets": len(store.user_secrets),
                "image_pull_secrets": len(store.pull_secrets),
            }
        counts["gpus"] = sum(sum(g.values()) for g in self.server.controller.allocated().values())
        self._send(200, self.server.world.render_workspace(counts))

    def _group(self, ng_id: str) -> str:
        if self.server.world.group(ng_id) is None:
            raise not_found("dedicated node group", ng_id)
        return ng_id

    def node_groups(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        used = self.server.controller.allocated()
        world = self.server.world
        self._send(200, [world.render_group(ng, used.get(ng, {})) for ng in world.groups()])

    def node_group(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        ng = self._group(parts[1])
        self._send(200, self.server.world.render_group(ng, self.server.controller.allocated().get(ng, {})))

    def nodes(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        ng = self._group(parts[1])
        idle = (query.get("idle") or ["false"])[-1] == "true"
        used = self.server.controller.allocated().get(ng, {})
        self._send(200, self.server.world.render_nodes(ng, used, idle))

    def datasources(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        self._group(parts[1])
        self._send(200, {"items": []})

    def shapes(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        world = self.server.world
        asked = [g for value in query.get("node_groups") or [] for g in value.split(",") if g]
        wanted = [ng for ng in (world.group_by_filter(value) for value in asked) if ng is not None]
        purpose = (query.get("purpose") or [""])[-1] or None
        self._send(200, world.render_shapes(wanted if asked else [""], purpose))

    def storage_permissions(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        ng = self._group((query.get("nodegroup_id") or [""])[-1])
        volume = parts[1]
        if self.server.world.volume(ng, volume) is None:
            raise not_found("volume", f"{volume} in node group {ng}")
        self._send(200, self.server.world.render_permissions(volume, ng))

    def storage_permission_add(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        body = self._json(raw)
        ng = self._group(str(body.get("nodegroup_id") or ""))
        volume, prefix = parts[1], str(body.get("path_prefix") or "")
        if self.server.world.volume(ng, volume) is None:
            raise not_found("volume", f"{volume} in node group {ng}")
        if not prefix.startswith("/"):
            raise bad_request("path_prefix must be an absolute path")
        perms = self.server.world.data.setdefault("storage_permissions", {}).setdefault(volume, [])
        if prefix in perms:
            raise ApiError(409, "AlreadyExists", f"permission for path {prefix} already exists on {volume}")
        perms.append(prefix)
        self._send(200, {"path_prefix": prefix, "nodegroup_id": ng})

    def storage_permission_delete(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        self._group((query.get("nodegroup_id") or [""])[-1])
        volume, prefix = parts[1], "/" + "/".join(parts[2:])
        perms = (self.server.world.data.get("storage_permissions") or {}).get(volume) or []
        if prefix not in perms:
            raise not_found("storage permission", f"{volume}{prefix}")
        perms.remove(prefix)
        self._send(200, {})

    # secrets

    def user_secrets(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        self._send(200, self.server.store.render_user_secrets())

    def user_secrets_create(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        self.server.store.create_user_secrets(self._json(raw))
        self.server.controller.wake()  # a replica waiting for a secret may start now
        self._send(200, {})

    def user_secret_delete(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        self.server.store.delete_user_secret(parts[1])
        self._send(200, {})

    def pull_secrets(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        self._send(200, self.server.store.render_pull_secrets())

    def pull_secret_create(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        self._send(201, self.server.store.create_pull_secret(self._json(raw)))

    def pull_secret_delete(self, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        self.server.store.delete_pull_secret(parts[1])
        self._send(200, {})

    # ------------------------------------------------------------------ the tests' controls

    def _fake(self, method: str, parts: list[str], query: dict[str, list[str]], raw: bytes) -> None:
        server, store = self.server, self.server.store
        body = self._json(raw) if method == "POST" else {}
        path = "/".join(parts)
        if path == "health":
            self._send(200, {"ok": True})
        elif path == "faults":
            if method == "POST":
                with server.stats_lock:
                    if body.get("clear"):
                        server.faults.clear()
                    else:
                        status = body.get("status", 503)
                        server.faults.append(
                            {
                                "status": status if status == "timeout" else int(status),
                                "until": time.time() + float(body.get("seconds", 60)),
                                "route": str(body.get("route") or ""),
                                "retry_after": body.get("retry_after"),
                                "hold_seconds": float(body.get("hold_seconds", 30)),
                            }
                        )
            with server.stats_lock:
                self._send(200, {"faults": list(server.faults)})
        elif path == "inject":
            self._send(200, self._inject(body))
        elif path == "capacity":
            if method == "POST":
                server.world.update(world={"capacity": {("" if k == "(shared)" else k): v for k, v in body.items()}})
                server.controller.wake()
            self._send(200, server.world.render_capacity(server.controller.allocated()))
        elif path == "config":
            if method == "POST":
                try:
                    server.world.update(world=body.get("world"), settings=body.get("settings"))
                except ValueError as exc:
                    raise bad_request(str(exc)) from exc
                server.controller.wake()
            self._send(200, {"settings": server.world.settings, "world": server.world.data})
        elif parts[:1] == ["jobs"]:
            # ?label=k=v: only the jobs labelled so, rendered (a whole run's thousands of records cost seconds)
            wanted = [item.partition("=")[::2] for item in query.get("label", [])]
            with store.lock:
                records = [
                    store.record(j)
                    for j in sorted(store.jobs.values(), key=lambda j: j.created)
                    if all((j.metadata.get("labels") or {}).get(k) == v for k, v in wanted)
                ]
            if len(parts) > 1:
                records = [r for r in records if parts[1] in (r["id"], r["key"], r["name"])]
            self._send(200, records)
        elif path == "secrets":
            with store.lock:
                if query.get("ever") == ["names"]:  # no values, no scan of every job's spec for them
                    ever = [{"kind": item["kind"], "name": item["name"]} for item in store.secret_record]
                else:
                    bodies = {j.id: json.dumps(j.body) for j in store.jobs.values()}
                    ever = [
                        {**item, "in_job_specs": sorted(i for i, t in bodies.items() if _occurs(item["value"], t))}
                        for item in store.secret_record
                    ]
                self._send(
                    200,
                    {
                        "user": {k: v["value"] for k, v in store.user_secrets.items()},
                        "image_pull": {k: v["spec"].get("password") for k, v in store.pull_secrets.items()},
                        "ever": ever,
                    },
                )
        elif path == "network":
            self._send(200, server.controller.runtime.network())
        elif path == "stats":
            with server.stats_lock:
                counts = dict(server.stats)
                if method == "POST":
                    server.stats.clear()
            self._send(200, {"total": sum(counts.values()), "by": counts})
        elif path == "requests":
            self._send(200, list(server.recent))
        elif path == "containers":
            self._send(200, server.controller.runtime.containers())
        elif path == "volumes":
            root = server.controller.workdir / "volumes"
            names = {v["name"] for g in server.world.groups().values() for v in g.get("volumes") or []}
            self._send(200, {name: str(root / name) for name in sorted(names)})
        else:
            raise ApiError(404, "NotFound", f"no fake control /fake/{path}")

    def _inject(self, body: dict[str, Any]) -> dict[str, Any]:
        store = self.server.store
        if body.get("clear"):
            with store.lock:
                store.injections.clear()
                for job in store.jobs.values():
                    job.injections.clear()
            self.server.controller.wake()
            return {"cleared": True}
        kind = body.get("kind")
        if kind not in _INJECTIONS:
            raise bad_request(f"kind must be one of {', '.join(_INJECTIONS)}")
        match = {k: body[k] for k in ("id", "name", "name_prefix", "labels") if body.get(k)}
        if not match:
            raise bad_request("say which jobs: id, name, name_prefix or labels")
        rule = Injection(
            kind=kind,
            match=match,
            code=int(body.get("code", 1)),
            after_seconds=float(body.get("after_seconds", 0)),
            replica=body.get("replica"),
            times=int(body.get("times", 1)),
            message=str(body.get("message") or ""),
            seconds=float(body.get("seconds", 0)),
        )
        applied = []
        with store.lock:
            for job in sorted(store.jobs.values(), key=lambda j: -j.created):
                if job.alive and rule.matches(job) and rule.times != -1:
                    job.injections.append(rule)
                    applied.append(job.id)
                    if rule.times == 1:
                        rule.times = -1  # used up
                    elif rule.times > 1:
                        rule.times -= 1
            if rule.times != -1:
                store.injections.append(rule)
        self.server.controller.wake()
        return {"applied_to": applied, "pending": rule.times != -1}


def _occurs(value: str, text: str) -> bool:
    """Whether a secret value occurs in a JSON text, raw or JSON-escaped."""
    return bool(value) and (value in text or json.dumps(value)[1:-1] in text)


_Handler_t = Callable[[_Handler, list[str], dict[str, list[str]], bytes], None]

#: (method, path pattern after the workspace, route template, handler)
ROUTES: list[tuple[str, re.Pattern[str], str, _Handler_t]] = [
    (m, re.compile(p), t, h)
    for m, p, t, h in [
        ("GET", r"^workspace$", "/workspace", _Handler.workspace_info),
        ("GET", r"^jobs$", "/jobs", _Handler.jobs_list),
        ("POST", r"^jobs$", "/jobs", _Handler.jobs_create),
        ("GET", r"^jobs/[^/]+$", "/jobs/{id}", _Handler.job_get),
        ("PATCH", r"^jobs/[^/]+$", "/jobs/{id}", _Handler.job_patch),
        ("DELETE", r"^jobs/[^/]+$", "/jobs/{id}", _Handler.job_delete),
        ("GET", r"^jobs/[^/]+/events$", "/jobs/{id}/events", _Handler.job_events),
        ("GET", r"^jobs/[^/]+/replicas$", "/jobs/{id}/replicas", _Handler.job_replicas),
        ("GET", r"^jobs/[^/]+/replicas/[^/]+/log$", "/jobs/{id}/replicas/{replica}/log", _Handler.replica_log),
        ("GET", r"^jobs/[^/]+/failure-analysis$", "/jobs/{id}/failure-analysis", _Handler.job_failure_analysis),
        ("GET", r"^logs$", "/logs", _Handler.logs),
        ("GET", r"^dedicated-node-groups$", "/dedicated-node-groups", _Handler.node_groups),
        ("GET", r"^dedicated-node-groups/[^/]+$", "/dedicated-node-groups/{id}", _Handler.node_group),
        ("GET", r"^dedicated-node-groups/[^/]+/nodes$", "/dedicated-node-groups/{id}/nodes", _Handler.nodes),
        (
            "GET",
            r"^dedicated-node-groups/[^/]+/datasources$",
            "/dedicated-node-groups/{id}/datasources",
            _Handler.datasources,
        ),
        ("GET", r"^shapes$", "/shapes", _Handler.shapes),
        ("GET", r"^storage-permission/[^/]+$", "/storage-permission/{volume}", _Handler.storage_permissions),
        ("POST", r"^storage-permission/[^/]+$", "/storage-permission/{volume}", _Handler.storage_permission_add),
        (
            "DELETE",
            r"^storage-permission/[^/]+/.+$",
            "/storage-permission/{volume}/{path}",
            _Handler.storage_permission_delete,
        ),
        ("GET", r"^usersecrets$", "/usersecrets", _Handler.user_secrets),
        ("POST", r"^usersecrets$", "/usersecrets", _Handler.user_secrets_create),
        ("DELETE", r"^usersecrets/[^/]+$", "/usersecrets/{name}", _Handler.user_secret_delete),
        ("GET", r"^imagepullsecrets$", "/imagepullsecrets", _Handler.pull_secrets),
        ("POST", r"^imagepullsecrets$", "/imagepullsecrets", _Handler.pull_secret_create),
        ("DELETE", r"^imagepullsecrets/[^/]+$", "/imagepullsecrets/{name}", _Handler.pull_secret_delete),
    ]
]


def _route(method: str, parts: list[str]) -> tuple[str, _Handler_t | None]:
    rest = "/".join(parts)
    for m, pattern, template, handler in ROUTES:
        if m == method and pattern.match(rest):
            return template, handler
    return "/" + rest, None
