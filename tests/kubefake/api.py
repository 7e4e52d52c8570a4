"""The HTTP face of the fake API server: the Kubernetes REST paths, plus ``/fake/*`` for the tests.

``/fake/faults`` (POST ``{"status": 503, "seconds": 60}``) makes every API request fail with that ``Status`` for a
while; ``/fake/evict`` (POST ``{"namespace", "pod", "message"}``) has the kubelet evict a pod for node pressure;
``/fake/objects`` (GET) lists the names of every object by resource (events apart); ``/fake/created`` (GET) lists
every object ever created, deleted ones too (``resource``, ``namespace``, ``name``, ``uid``, ``labels``, ``created``,
and ``annotations`` as the object's last write left them);
``/fake/stats`` (GET, and POST to reset) counts the API requests by verb and resource and lists the log reads (their
options and the bytes served).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.kubefake.authz import Authorizer
from tests.kubefake.cluster import Cluster
from tests.kubefake.rbac import Rbac
from tests.kubefake.store import RESOURCES, ApiError, Store, not_found, quota_refusal

VERSION = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0-kubefake",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.24.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}


class FakeApiServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], store: Store, cluster: Cluster) -> None:
        super().__init__(address, _Handler)
        self.store = store
        self.cluster = cluster
        self.fault_status = 0
        self.fault_until = 0.0
        self.requests: Counter[str] = Counter()
        self.stats_lock = threading.Lock()
        #: When set, the Kubernetes API wants ``Authorization: Bearer <token>`` (401 otherwise, as the real server).
        self.token: str | None = None
        #: OwnerReferencesPermissionEnforcement on, for a user without ``update`` on any ``<owner>/finalizers`` (the
        #: usual job-submitting role): a new blocking owner reference is refused (403), as on OpenShift.
        self.owner_references_enforcement = False
        #: What the user may do (every verb on every resource, less a deny list: tests/kubefake/authz.py).
        self.authorizer = Authorizer()
        #: RBAC: when set, the rules of the Roles bound to the user, applied to every resource request (``/fake/role``).
        self.rbac: Rbac | None = None
        #: The options and size of every log read (``/fake/stats``).
        self.log_reads: list[dict[str, Any]] = []


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real server: the clients reuse their connections
    # headers and body go out as two writes: without TCP_NODELAY, Nagle + delayed ACK add 40 ms to each answer
    disable_nagle_algorithm = True
    server: FakeApiServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    # ------------------------------------------------------------------ plumbing

    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _json_body(self) -> Any:
        raw = self._body()
        try:
            return json.loads(raw) if raw else {}
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"the object provided is unrecognized: {exc}") from exc

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        parts = [p for p in url.path.split("/") if p]
        try:
            if parts[:1] == ["fake"]:
                self._fake(method, parts[1:])
                return
            if time.time() < self.server.fault_until:
                self._body()
                raise ApiError(
                    self.server.fault_status,
                    "ServiceUnavailable" if self.server.fault_status == 503 else "InternalError",
                    "the server is currently unable to handle the request",
                )
            if self.server.token is not None and self.headers.get("Authorization") != f"Bearer {self.server.token}":
                self._body()
                raise ApiError(401, "Unauthorized", "Unauthorized")
            self._api(method, parts, query)
        except ApiError as exc:
            self._send(exc.code, exc.status())
        except Exception as exc:  # a fake's bug: answer as the real server's 500 would
            self._send(500, ApiError(500, "InternalError", f"kubefake: {exc!r}").status())
            raise

    # ------------------------------------------------------------------ the Kubernetes API

    def _api(self, method: str, parts: list[str], query: dict[str, str]) -> None:
        if parts == ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"] and method == "POST":
            self._send(201, self.server.authorizer.review(self._json_body()))
            return
        if parts == ["version"]:
            self._send(200, VERSION)
            return
        if parts == ["api"]:
            self._send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
            return
        if parts == ["apis"]:
            group = {
                "name": "batch",
                "versions": [{"groupVersion": "batch/v1", "version": "v1"}],
                "preferredVersion": {"groupVersion": "batch/v1", "version": "v1"},
            }
            self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]})
            return
        # /api/v1/... or /apis/<group>/<version>/...
        rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
        namespace: str | None = None
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        resource: str | None = rest[0] if rest else None
        name: str = rest[1] if len(rest) > 1 else ""
        sub: str = rest[2] if len(rest) > 2 else ""
        if resource not in RESOURCES:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        _, api_version, namespaced = RESOURCES[resource]
        expected_prefix = ["api", "v1"] if "/" not in api_version else ["apis", *api_version.split("/")]
        if parts[: len(expected_prefix)] != expected_prefix:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns = (namespace or "") if namespaced else ""
        self._authorize(method, resource, name=name, sub=sub, ns=ns, query=query)
        with self.server.stats_lock:
            self.server.requests[f"{method} {resource}{'/' + sub if sub else ''}{'' if name else ' (list)'}"] += 1
        self.server.authorizer.check(method, resource, sub, name, ns)
        store = self.server.store
        if method == "GET" and not name:
            self._send(
                200,
                store.select(
                    resource,
                    namespace if namespaced else None,
                    query.get("labelSelector", ""),
                    query.get("fieldSelector", ""),
                ),
            )
        elif method == "POST" and not name:
            body = self._json_body()
            self._admit_owner_references(resource, None, body)
            if resource == "pods" and (refusal := quota_refusal(store, ns, body)):
                raise ApiError(
                    403, "Forbidden", refusal, {"name": (body.get("metadata") or {}).get("name", ""), "kind": "pods"}
                )
            self._send(201, store.create(resource, ns, body))
        elif method == "GET" and sub == "log":
            self._log(ns, name, query)
        elif method == "GET":
            self._send(200, store.get(resource, ns, name))
        elif method == "PATCH":
            content_type = self.headers.get("Content-Type", "")
            admit = lambda old, new: self._admit_owner_references(resource, old, new)  # noqa: E731
            self._send(200, store.patch(resource, ns, name, content_type, self._body(), admit=admit))
        elif method == "DELETE":
            options = self._json_body() or {}
            for key in ("propagationPolicy", "gracePeriodSeconds"):
                if key in query:
                    options[key] = int(query[key]) if key == "gracePeriodSeconds" else query[key]
            result = store.delete(resource, ns, name, options)
            # A foreground delete still waiting for its dependents is "202 Accepted"; a pod's graceful one is 200.
            self._send(202 if result.get("kind") != "Status" and resource != "pods" else 200, result)
        else:
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    def _authorize(self, method: str, resource: str, *, name: str, sub: str, ns: str, query: dict[str, str]) -> None:
        """RBAC, before the request is looked at (the body read off the connection, kept alive)."""
        if self.server.rbac is None:
            return
        try:
            self.server.rbac.authorize(method, resource, name=name, sub=sub, namespace=ns, query=query)
        except ApiError:
            self._body()
            raise

    def _may_delete(self, resource: str) -> bool:
        """Both authorizers of the fake (the deny list and, when set, the Roles) allow ``delete`` on ``resource``."""
        rbac = self.server.rbac
        group = "batch" if resource == "jobs" else ""
        return self.server.authorizer.allows("delete", resource) and (
            rbac is None or rbac.allows("delete", group, resource)
        )

    def _admit_owner_references(self, resource: str, old: dict[str, Any] | None, new: dict[str, Any]) -> None:
        """The OwnerReferencesPermissionEnforcement admission plugin (k8s.io/kubernetes
        plugin/pkg/admission/gc/gc_admission.go ``gcPermissionsEnforcement.Admit``): first, changing the owner
        references of an object (``isChangingOwnerReference``) needs ``delete`` on that object; then setting
        ``blockOwnerDeletion`` on a reference (new, or not blocking before: ``newBlockingOwnerDeletionRefs``) needs
        ``update`` on the owner's ``finalizers``, which the user here never has."""
        if not self.server.owner_references_enforcement:
            return
        refs_before = ((old or {}).get("metadata") or {}).get("ownerReferences") or []
        refs_after = (new.get("metadata") or {}).get("ownerReferences") or []
        if refs_after != refs_before and not self._may_delete(resource):
            name = (new.get("metadata") or {}).get("name", "")
            raise ApiError(
                403,
                "Forbidden",
                f'{resource} "{name}" is forbidden: cannot set an ownerRef on a resource you can\'t delete: , <nil>',
                {"name": name, "kind": resource},
            )
        before = {r.get("uid"): r for r in refs_before}
        for ref in (new.get("metadata") or {}).get("ownerReferences") or []:
            if (
                ref.get("blockOwnerDeletion") is True
                and before.get(ref.get("uid"), {}).get("blockOwnerDeletion") is not True
            ):
                name = (new.get("metadata") or {}).get("name", "")
                raise ApiError(
                    403,
                    "Forbidden",
                    f'{resource} "{name}" is forbidden: cannot set blockOwnerDeletion if an ownerReference refers to '
                    "a resource you can't set finalizers on: , <nil>",
                    {"name": name, "kind": resource},
                )

    def _log(self, namespace: str, name: str, query: dict[str, str]) -> None:
        """``GET pods/{name}/log``: the options checked as ``ValidatePodLogOptions`` does (422), the container as
        ``LogLocation`` picks it (400), an unscheduled pod's log empty, a waiting container refused as the kubelet
        refuses it (400), the text cut at ``limitBytes`` (timestamps count, as they do through the kubelet)."""
        pod = self.server.store.get("pods", namespace, name)
        options = _log_options(name, query)
        names = [c["name"] for c in pod["spec"]["containers"]]
        container = query.get("container") or (names[0] if len(names) == 1 else "")
        if container not in names:
            problem = (
                f"container {container} is not valid for pod {name}"
                if container
                else (f"a container name must be specified for pod {name}, choose one of: [{' '.join(names)}]")
            )
            raise ApiError(400, "BadRequest", problem)
        statuses = pod["status"].get("containerStatuses") or []
        if not pod["spec"].get("nodeName"):
            text = b""  # LogLocation: no host assigned yet, an empty location (an empty answer)
        elif not statuses or "waiting" in statuses[0]["state"]:
            reason = statuses[0]["state"]["waiting"]["reason"] if statuses else "ContainerCreating"
            raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start: {reason}')
        else:
            text = self.server.cluster.runtime.logs(pod["metadata"]["uid"], query)
        if "limitBytes" in options:
            text = text[: options["limitBytes"]]
        with self.server.stats_lock:
            self.server.log_reads.append({"bytes": len(text), **options})
        self._send(200, text, "text/plain")

    # ------------------------------------------------------------------ the tests' controls

    def _fake(self, method: str, parts: list[str]) -> None:
        server = self.server
        if parts == ["faults"] and method == "POST":
            body = self._json_body()
            server.fault_status = int(body.get("status", 503))
            server.fault_until = time.time() + float(body.get("seconds", 0))
            self._send(200, {"until": server.fault_until})
        elif parts == ["evict"] and method == "POST":
            body = self._json_body()
            message = (
                body.get("message")
                or "The node was low on resource: memory. Threshold quantity: 100Mi, "
                "available: 52Mi. Container tao was using 3Gi, request is 0."
            )
            server.cluster.evict(body["namespace"], body["pod"], message)
            self._send(200, {"evicted": body["pod"]})
        elif parts == ["objects"]:
            with server.store.lock:
                found: dict[str, list[str]] = {}
                for resource, _, name in server.store.objects:
                    if resource not in ("events", "nodes", "namespaces"):
                        found.setdefault(resource, []).append(name)
            self._send(200, {k: sorted(v) for k, v in found.items()})
        elif parts == ["role"] and method == "POST":  # {"rules": [...]} of the Roles bound to the user, or null
            rules = self._json_body().get("rules")
            server.rbac = None if rules is None else Rbac(rules)
            self._send(200, {"rules": rules})
        elif parts == ["created"]:
            with server.store.lock:
                history = [dict(entry) for entry in server.store.created]
            self._send(200, history)
        elif parts == ["deny"] and method == "POST":
            server.authorizer.denied = {str(rule).strip() for rule in self._json_body().get("rules") or []}
            self._send(200, {"denied": sorted(server.authorizer.denied)})
        elif parts == ["stats"]:
            with server.stats_lock:
                counts, logs = dict(server.requests), list(server.log_reads)
                if method == "POST":
                    server.requests.clear()
                    server.log_reads.clear()
            self._send(200, {"total": sum(counts.values()), "by": counts, "log_reads": logs})
        else:
            raise not_found("pods", "/".join(parts))


_LOG_INTEGERS = ("sinceSeconds", "tailLines", "limitBytes")


def _log_options(name: str, query: dict[str, str]) -> dict[str, Any]:
    """The integer options of a log read, checked as ``ValidatePodLogOptions`` (k8s.io/kubernetes
    pkg/apis/core/validation) checks them: an Invalid ``PodLogOptions`` (422) otherwise."""
    options: dict[str, Any] = {}
    for key in _LOG_INTEGERS:
        if key in query:
            try:
                options[key] = int(query[key])
            except ValueError as exc:
                raise ApiError(400, "BadRequest", f'strconv.ParseInt: parsing "{query[key]}": invalid syntax') from exc
    problems = []
    if options.get("tailLines", 0) < 0:
        problems.append(f"tailLines: Invalid value: {options['tailLines']}: must be greater than or equal to 0")
    if options.get("limitBytes", 1) < 1:
        problems.append(f"limitBytes: Invalid value: {options['limitBytes']}: must be greater than 0")
    if "sinceSeconds" in options and "sinceTime" in query:
        problems.append("Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified")
    elif options.get("sinceSeconds", 1) < 1:
        problems.append(f"sinceSeconds: Invalid value: {options['sinceSeconds']}: must be greater than 0")
    if problems:
        raise ApiError(
            422,
            "Invalid",
            f'PodLogOptions "{name}" is invalid: {", ".join(problems)}',
            {"name": name, "kind": "PodLogOptions"},
        )
    if "sinceTime" in query:
        options["sinceTime"] = query["sinceTime"]
    return options
