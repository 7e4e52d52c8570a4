"""The fake API server's object store: what the real API server does with an object before any controller sees it.

Create (validation and defaulting as the API server does them), get, list by label / field selector, the three
patch content types, delete with preconditions and propagation (``Orphan`` -- the default for Jobs --,
``Background``, ``Foreground``), graceful pod deletion, and the garbage collector that follows owner references.
Errors are :class:`ApiError`, answered as the API's ``Status`` object.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tests.kubefake import jsonpatch

#: resource -> (kind, apiVersion, namespaced)
RESOURCES: dict[str, tuple[str, str, bool]] = {
    "pods": ("Pod", "v1", True),
    "secrets": ("Secret", "v1", True),
    "configmaps": ("ConfigMap", "v1", True),
    "services": ("Service", "v1", True),
    "events": ("Event", "v1", True),
    "persistentvolumeclaims": ("PersistentVolumeClaim", "v1", True),
    "resourcequotas": ("ResourceQuota", "v1", True),
    "jobs": ("Job", "batch/v1", True),
    "nodes": ("Node", "v1", False),
    "namespaces": ("Namespace", "v1", False),
}
#: The real server's limit on one Secret's or ConfigMap's data (``MaxSecretSize``).
MAX_DATA_BYTES = 1 << 20
MAX_ANNOTATION_BYTES = 256 * 1024
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DATA_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(stamp: str) -> float:
    return datetime.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()


class ApiError(Exception):
    """An error the API server answers with a ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _qualified(resource: str) -> str:
    """``jobs.batch`` / ``pods``: how the API server names a resource in its messages."""
    api_version = RESOURCES[resource][1]
    return f"{resource}.{api_version.split('/')[0]}" if "/" in api_version else resource


def _details(resource: str, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": resource}
    if "/" in RESOURCES[resource][1]:
        details["group"] = RESOURCES[resource][1].split("/")[0]
    return details


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{_qualified(resource)} "{name}" not found', _details(resource, name))


def invalid(resource: str, name: str, field: str, problem: str) -> ApiError:
    kind, api_version, _ = RESOURCES[resource]
    group = f".{api_version.split('/')[0]}" if "/" in api_version else ""
    cause = {"reason": "FieldValueInvalid", "message": problem, "field": field}
    return ApiError(
        422,
        "Invalid",
        f'{kind}{group} "{name}" is invalid: {field}: {problem}',
        {**_details(resource, name), "kind": kind, "causes": [cause]},
    )


# ----------------------------------------------------------------------------- selectors


@dataclass(frozen=True)
class _Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        return not present or value not in self.values  # "!=", "notin"


def parse_label_selector(text: str) -> list[_Requirement]:
    """Kubernetes label selector syntax: ``a=b,c!=d,e,!f,g in (x,y),h notin (z)``."""
    requirements: list[_Requirement] = []
    for raw in re.findall(r"[^,(]+(?:\([^)]*\))?", text or ""):
        part = raw.strip().strip(",").strip()
        if not part:
            continue
        if match := re.match(r"^(\S+)\s+(in|notin)\s+\(([^)]*)\)$", part):
            values = tuple(v.strip() for v in match.group(3).split(",") if v.strip())
            requirements.append(_Requirement(match.group(1), match.group(2), values))
        elif "!=" in part:
            key, value = part.split("!=", 1)
            requirements.append(_Requirement(key.strip(), "!=", (value.strip(),)))
        elif "=" in part:
            key, value = re.split(r"==?", part, maxsplit=1)
            requirements.append(_Requirement(key.strip(), "=", (value.strip(),)))
        elif part.startswith("!"):
            requirements.append(_Requirement(part[1:].strip(), "!exists"))
        else:
            requirements.append(_Requirement(part, "exists"))
    return requirements


def _field(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return "" if value is None else str(value)


#: The field labels each resource can be selected by (any other: 400), from each registry's ``ToSelectableFields`` /
#: ``GetAttrs`` (k8s.io/kubernetes pkg/registry/core/{event,pod}/strategy.go, pkg/registry/batch/job/strategy.go).
SELECTABLE_FIELDS: dict[str, frozenset[str]] = {
    "events": frozenset(
        {
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        }
    ),
    "pods": frozenset(
        {
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.podIPs",
            "status.nominatedNodeName",
        }
    ),
    "jobs": frozenset({"status.successful"}),
    "secrets": frozenset({"type"}),
}


def field_matcher(text: str, resource: str = "") -> Callable[[dict[str, Any]], bool]:
    """Field selectors: ``involvedObject.name=x,status.phase!=Running`` (equality only, as the API), on the labels
    the resource supports (plus ``metadata.name`` / ``metadata.namespace``)."""
    tests: list[tuple[str, bool, str]] = []
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        negate = "!=" in part
        key, value = re.split(r"!=|==?", part, maxsplit=1)
        key = key.strip()
        if resource and key not in SELECTABLE_FIELDS.get(resource, frozenset()) | {
            "metadata.name",
            "metadata.namespace",
        }:
            raise ApiError(400, "BadRequest", f"field label not supported: {key}")
        tests.append((key, negate, value.strip()))
    return lambda obj: all((_field(obj, key) == value) != negate for key, negate, value in tests)


# ----------------------------------------------------------------------------- patches


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (``null`` deletes)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# ----------------------------------------------------------------------------- the store


class Store:
    """Every object of the fake cluster, under one lock (as etcd is one consistent store)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._rv = itertools.count(1000)
        #: Every object ever created, in order: ``{resource, namespace, name, uid, labels, annotations, created}``
        #: (a deleted object stays here: the tests count what was ever submitted on the server itself; its
        #: annotations as its last write left them, so an observer reads the marks a Job carried when it went).
        self.created: list[dict[str, Any]] = []
        self._history: dict[str, dict[str, Any]] = {}  # uid -> its entry of ``created``
        #: Called after a create, with (resource, object) -- the controllers' informer, in short.
        self.on_change: Callable[[], None] = lambda: None

    # -- helpers

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        return obj

    def find(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((resource, namespace, name))

    def by_uid(self, uid: str) -> tuple[tuple[str, str, str], dict[str, Any]] | None:
        return next(((key, obj) for key, obj in self.objects.items() if obj["metadata"]["uid"] == uid), None)

    def all(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return [
            obj
            for (kind, ns, _), obj in self.objects.items()
            if kind == resource and (namespace is None or ns == namespace)
        ]

    # -- API verbs

    def create(self, resource: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        kind, api_version, namespaced = RESOURCES[resource]
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {}) or {}
        obj["metadata"] = meta
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        name = meta.get("name") or ""
        if not name:
            raise invalid(resource, "", "metadata.name", "Required value: name or generateName is required")
        if namespaced and meta.get("namespace") not in (None, namespace):
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        _validate(resource, obj)
        with self.lock:
            key = (resource, namespace if namespaced else "", name)
            if key in self.objects:
                raise ApiError(
                    409, "AlreadyExists", f'{_qualified(resource)} "{name}" already exists', _details(resource, name)
                )
            obj["kind"], obj["apiVersion"] = kind, api_version
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
            if namespaced:
                meta["namespace"] = namespace
            _DEFAULTS.get(resource, lambda o: None)(obj)
            self.objects[key] = self._stamp(obj)
            created = copy.deepcopy(obj)
            entry = {"resource": resource, "namespace": namespace, "name": name, "uid": meta["uid"],
                     "labels": dict(meta.get("labels") or {}), "annotations": dict(meta.get("annotations") or {}),
                     "created": time.time()}  # fmt: skip
            self.created.append(entry)
            self._history[meta["uid"]] = entry
        self.on_change()
        return created

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        with self.lock:
            obj = self.find(resource, namespace, name)
            if obj is None:
                raise not_found(resource, name)
            return copy.deepcopy(obj)

    def select(self, resource: str, namespace: str | None, labels: str = "", fields: str = "") -> dict[str, Any]:
        requirements = parse_label_selector(labels)
        field_ok = field_matcher(fields, resource)
        with self.lock:
            items = [
                copy.deepcopy(obj)
                for obj in self.all(resource, namespace)
                if all(r.matches(obj["metadata"].get("labels") or {}) for r in requirements) and field_ok(obj)
            ]
            version = str(next(self._rv))
        kind, api_version, _ = RESOURCES[resource]
        return {
            "kind": f"{kind}List",
            "apiVersion": api_version,
            "metadata": {"resourceVersion": version},
            "items": items,
        }

    def patch(
        self,
        resource: str,
        namespace: str,
        name: str,
        content_type: str,
        body: bytes,
        *,
        admit: Callable[[dict[str, Any] | None, dict[str, Any]], None] = lambda old, new: None,
    ) -> dict[str, Any]:
        """A patch; ``admit(old, new)`` is the admission chain's say on the result (raises to refuse)."""
        try:
            patch = json.loads(body or b"null")
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"error decoding patch: {exc}") from exc
        with self.lock:
            current = self.find(resource, namespace, name)
            if current is None:
                raise not_found(resource, name)
            if content_type.startswith("application/json-patch+json"):
                try:
                    updated = jsonpatch.apply(current, patch)
                except jsonpatch.Refusal as exc:
                    raise ApiError(exc.code, exc.reason, exc.message, exc.details) from exc
            elif content_type.startswith(("application/merge-patch+json", "application/strategic-merge-patch+json")):
                if not isinstance(patch, dict):
                    raise ApiError(
                        400, "BadRequest", "json: cannot unmarshal array into Go value of type map[string]interface {}"
                    )
                wanted_rv = (patch.get("metadata") or {}).get("resourceVersion")
                if wanted_rv is not None and wanted_rv != current["metadata"]["resourceVersion"]:
                    raise _conflict(resource, name)
                updated = merge_patch(current, patch)
            else:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types include: "
                    f"application/json-patch+json, application/merge-patch+json, "
                    f'application/apply-patch+yaml (got "{content_type}")',
                )
            for fixed in ("uid", "name", "namespace", "creationTimestamp"):
                updated["metadata"][fixed] = current["metadata"][fixed]
            if resource == "jobs" and updated["spec"].get("template") != current["spec"].get("template"):
                raise invalid(resource, name, "spec.template", "Invalid value: field is immutable")
            _validate(resource, updated)
            admit(current, updated)
            self.objects[(resource, namespace, name)] = self._stamp(updated)
            if (entry := self._history.get(updated["metadata"]["uid"])) is not None:
                entry["annotations"] = dict(updated["metadata"].get("annotations") or {})
            result = copy.deepcopy(updated)
        self.on_change()
        return result

    def put_status(self, resource: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        """A controller's status write (no API request)."""
        with self.lock:
            obj = self.find(resource, namespace, name)
            if obj is not None and obj.get("status") != status:
                obj["status"] = status
                self._stamp(obj)

    def delete(self, resource: str, namespace: str, name: str, options: dict[str, Any]) -> dict[str, Any]:
        """DELETE: preconditions, then the propagation policy; pods terminate gracefully (the kubelet ends them)."""
        with self.lock:
            obj = self.find(resource, namespace, name)
            if obj is None:
                raise not_found(resource, name)
            meta = obj["metadata"]
            pre = options.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != meta["uid"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {meta['uid']}",
                    _details(resource, name),
                )
            if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
                raise _conflict(resource, name)
            # The API's default for Jobs is to orphan their pods (kept for backward compatibility).
            policy = options.get("propagationPolicy") or ("Orphan" if resource == "jobs" else "Background")
            if policy == "Orphan":
                for dependent in self._dependents(meta["uid"]):
                    dependent["metadata"]["ownerReferences"] = [
                        ref for ref in dependent["metadata"]["ownerReferences"] if ref["uid"] != meta["uid"]
                    ]
                    self._stamp(dependent)
            if (
                resource == "pods"
                and obj["spec"].get("nodeName")
                and (obj.get("status") or {}).get("phase")
                in (
                    "Pending",
                    "Running",
                )
            ):
                grace = options.get("gracePeriodSeconds")
                if grace is None:
                    grace = obj["spec"].get("terminationGracePeriodSeconds", 30)
                meta.setdefault("deletionTimestamp", now_rfc3339())
                meta["deletionGracePeriodSeconds"] = int(grace)
                return copy.deepcopy(self._stamp(obj))
            if policy == "Foreground" and self._dependents(meta["uid"]):
                meta.setdefault("deletionTimestamp", now_rfc3339())
                meta["finalizers"] = sorted({*(meta.get("finalizers") or []), "foregroundDeletion"})
                return copy.deepcopy(self._stamp(obj))
            del self.objects[(resource, namespace, name)]
        self.on_change()
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {**_details(resource, name), "uid": meta["uid"]},
        }

    def remove(self, resource: str, namespace: str, name: str) -> None:
        """The last step of a graceful delete (the kubelet confirmed the pod is gone)."""
        with self.lock:
            self.objects.pop((resource, namespace, name), None)

    def _dependents(self, uid: str) -> list[dict[str, Any]]:
        return [
            obj
            for obj in self.objects.values()
            if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])
        ]

    def collect_garbage(self) -> None:
        """The garbage collector: dependents of a vanished owner go (background); a foreground-deleted owner goes
        once its dependents are gone."""
        with self.lock:
            live = {obj["metadata"]["uid"] for obj in self.objects.values()}
            for (resource, ns, name), obj in list(self.objects.items()):
                meta = obj["metadata"]
                refs = meta.get("ownerReferences") or []
                owner_gone = refs and all(ref["uid"] not in live for ref in refs)
                owner_foreground = any("foregroundDeletion" in (self._owner_finalizers(ref["uid"])) for ref in refs)
                if (owner_gone or owner_foreground) and "deletionTimestamp" not in meta:
                    self.delete(resource, ns, name, {"propagationPolicy": "Background"})
            for (resource, ns, name), obj in list(self.objects.items()):
                meta = obj["metadata"]
                if "foregroundDeletion" in (meta.get("finalizers") or []) and not self._dependents(meta["uid"]):
                    del self.objects[(resource, ns, name)]

    def _owner_finalizers(self, uid: str) -> list[str]:
        found = self.by_uid(uid)
        return list(found[1]["metadata"].get("finalizers") or []) if found else []

    def record_event(
        self, involved: dict[str, Any], event_type: str, reason: str, message: str, component: str
    ) -> None:
        """A core/v1 Event about ``involved``; a repeat of the same event counts up, as the event recorder does."""
        meta = involved["metadata"]
        with self.lock:
            for event in self.all("events", meta.get("namespace", "")):
                if event["involvedObject"]["uid"] == meta["uid"] and (event["reason"], event["message"]) == (
                    reason,
                    message,
                ):
                    event["count"] += 1
                    event["lastTimestamp"] = now_rfc3339()
                    self._stamp(event)
                    return
            name = f"{meta['name']}.{uuid.uuid4().hex[:16]}"
            stamp = now_rfc3339()
            event = {
                "kind": "Event",
                "apiVersion": "v1",
                "metadata": {"name": name, "namespace": meta.get("namespace", ""), "uid": str(uuid.uuid4())},
                "involvedObject": {
                    "kind": involved["kind"],
                    "namespace": meta.get("namespace", ""),
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "apiVersion": involved["apiVersion"],
                },
                "reason": reason,
                "message": message,
                "source": {"component": component},
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
                "type": event_type,
                "reportingComponent": component,
            }
            self.objects[("events", event["metadata"]["namespace"], name)] = self._stamp(event)


def _conflict(resource: str, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(resource)} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        _details(resource, name),
    )


# ----------------------------------------------------------------------------- validation and defaults


def _validate(resource: str, obj: dict[str, Any]) -> None:
    meta = obj["metadata"]
    name = meta["name"]
    if resource == "services":
        if len(name) > 63 or not _DNS1035.match(name):
            raise invalid(
                resource,
                name,
                "metadata.name",
                f'Invalid value: "{name}": a DNS-1035 label must consist '
                "of lower case alphanumeric characters or '-', start with an alphabetic character, and end "
                "with an alphanumeric character",
            )
    elif len(name) > 253 or not _SUBDOMAIN.match(name):
        raise invalid(
            resource,
            name,
            "metadata.name",
            f'Invalid value: "{name}": a lowercase RFC 1123 subdomain '
            "must consist of lower case alphanumeric characters, '-' or '.', and must start and end with "
            "an alphanumeric character",
        )
    for key, value in (meta.get("labels") or {}).items():
        _validate_label(resource, name, f'metadata.labels: Invalid value: "{key}"', key, value)
    annotations = meta.get("annotations") or {}
    if sum(len(k) + len(str(v)) for k, v in annotations.items()) > MAX_ANNOTATION_BYTES:
        raise invalid(
            resource, name, "metadata.annotations", f"Too long: must have at most {MAX_ANNOTATION_BYTES} bytes"
        )
    if resource in ("secrets", "configmaps"):
        _validate_data(resource, obj)
    if resource == "jobs":
        if len(name) > 63:
            raise invalid(resource, name, "metadata.name", "Invalid value: must be no more than 63 characters")
        pod_spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        if pod_spec.get("restartPolicy") not in ("Never", "OnFailure"):
            raise invalid(
                resource, name, "spec.template.spec.restartPolicy", 'Required value: valid values: "OnFailure", "Never"'
            )
        _validate_pod_spec(resource, name, pod_spec, "spec.template.spec")
    if resource == "pods":
        _validate_pod_spec(resource, name, obj.get("spec") or {}, "spec")


def _validate_label(resource: str, name: str, field: str, key: str, value: Any) -> None:
    prefix, _, label = key.rpartition("/")
    bad_key = (prefix and (len(prefix) > 253 or not _SUBDOMAIN.match(prefix))) or len(label) > 63
    if bad_key or not _LABEL_NAME.match(label):
        raise invalid(resource, name, field, "name part must consist of alphanumeric characters, '-', '_' or '.'")
    value = str(value)
    if value and (len(value) > 63 or not _LABEL_NAME.match(value)):
        raise invalid(
            resource,
            name,
            f'metadata.labels: Invalid value: "{value}"',
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character; must be no more than 63 characters",
        )


def _validate_data(resource: str, obj: dict[str, Any]) -> None:
    name = obj["metadata"]["name"]
    total = 0
    for field in ("data", "binaryData", "stringData"):
        for key, value in (obj.get(field) or {}).items():
            if not _DATA_KEY.match(key):
                raise invalid(
                    resource,
                    name,
                    f"{field}[{key}]",
                    "Invalid value: a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                )
            encoded = field == "binaryData" or (field == "data" and resource == "secrets")
            try:
                total += len(base64.b64decode(value, validate=True)) if encoded else len(str(value).encode())
            except ValueError as exc:
                raise ApiError(400, "BadRequest", f"illegal base64 data in {field}[{key}]") from exc
    if total > MAX_DATA_BYTES:
        field = "data" if resource == "secrets" else "[]"
        raise invalid(resource, name, field, f"Too long: must have at most {MAX_DATA_BYTES} bytes")


def _validate_pod_spec(resource: str, name: str, spec: dict[str, Any], field: str) -> None:
    containers = spec.get("containers") or []
    if not containers:
        raise invalid(resource, name, f"{field}.containers", "Required value")
    for index, container in enumerate(containers):
        if not container.get("name"):
            raise invalid(resource, name, f"{field}.containers[{index}].name", "Required value")
        if not container.get("image"):
            raise invalid(resource, name, f"{field}.containers[{index}].image", "Required value")
        for env in container.get("env") or []:
            if not re.match(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", env.get("name") or ""):
                raise invalid(
                    resource,
                    name,
                    f"{field}.containers[{index}].env.name",
                    f'Invalid value: "{env.get("name")}": a valid environment variable name',
                )
    volumes = {v.get("name") for v in spec.get("volumes") or []}
    for index, container in enumerate(containers):
        for mount in container.get("volumeMounts") or []:
            if mount.get("name") not in volumes:
                raise invalid(
                    resource,
                    name,
                    f"{field}.containers[{index}].volumeMounts[0].name",
                    f'Not found: "{mount.get("name")}"',
                )


def _default_job(job: dict[str, Any]) -> None:
    spec = job.setdefault("spec", {})
    spec.setdefault("parallelism", 1)
    spec.setdefault("completions", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    uid = job["metadata"]["uid"]
    name = job["metadata"]["name"]
    spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    template = spec.setdefault("template", {})
    labels = template.setdefault("metadata", {}).setdefault("labels", {}) or {}
    template["metadata"]["labels"] = labels
    labels.update(
        {
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": name,
            "controller-uid": uid,
            "job-name": name,
        }
    )
    pod_spec = template.setdefault("spec", {})
    pod_spec.setdefault("terminationGracePeriodSeconds", 30)
    pod_spec.setdefault("dnsPolicy", "ClusterFirst")
    pod_spec.setdefault("schedulerName", "default-scheduler")
    if not job["metadata"].get("labels"):
        job["metadata"]["labels"] = dict(labels)
    job["status"] = {}


def _default_pod(pod: dict[str, Any]) -> None:
    pod["spec"].setdefault("terminationGracePeriodSeconds", 30)
    pod["spec"].setdefault("restartPolicy", "Always")
    pod["status"] = {"phase": "Pending", "qosClass": "BestEffort", "conditions": []}


def _default_service(service: dict[str, Any]) -> None:
    spec = service.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    if spec.get("clusterIP") != "None":
        spec["clusterIP"] = "10.96.0.10"
    service["status"] = {"loadBalancer": {}}


def _default_pvc(claim: dict[str, Any]) -> None:
    claim["status"] = {"phase": "Bound"}


def _default_secret(secret: dict[str, Any]) -> None:
    secret.setdefault("type", "Opaque")
    string_data = secret.pop("stringData", None) or {}
    data = secret.setdefault("data", {}) or {}
    secret["data"] = data
    data.update({k: base64.b64encode(str(v).encode()).decode() for k, v in string_data.items()})


_DEFAULTS: dict[str, Callable[[dict[str, Any]], None]] = {
    "jobs": _default_job,
    "pods": _default_pod,
    "services": _default_service,
    "persistentvolumeclaims": _default_pvc,
    "secrets": _default_secret,
}


#: The one quota resource modelled: GPUs asked for by a namespace's live pods (extended resources are quota'd by
#: their ``requests.`` name; a limit-only extended resource defaults its request to the limit).
GPU_QUOTA = "requests.nvidia.com/gpu"


def quota_refusal(store: Store, namespace: str, pod: dict[str, Any]) -> str | None:
    """The ResourceQuota admission's verdict on a new pod (k8s plugin/pkg/admission/resourcequota/controller.go
    ``CheckRequest``): the ``exceeded quota`` message when it would take the namespace's pods past a quota's hard
    ``requests.nvidia.com/gpu``, else None."""

    def gpus(spec: dict[str, Any]) -> int:
        limits = [((c.get("resources") or {}).get("limits") or {}) for c in spec.get("containers") or []]
        return sum(int(limit.get("nvidia.com/gpu") or 0) for limit in limits)

    requested = gpus(pod.get("spec") or {})
    if not requested:
        return None
    with store.lock:
        used = sum(
            gpus(p["spec"]) for p in store.all("pods", namespace) if p["status"].get("phase") in ("Pending", "Running")
        )
        for quota in store.all("resourcequotas", namespace):
            hard = ((quota.get("spec") or {}).get("hard") or {}).get(GPU_QUOTA)
            if hard is not None and used + requested > int(hard):
                return (
                    f'pods "{pod["metadata"]["name"]}" is forbidden: exceeded quota: {quota["metadata"]["name"]}, '
                    f"requested: {GPU_QUOTA}={requested}, used: {GPU_QUOTA}={used}, limited: {GPU_QUOTA}={hard}"
                )
    return None


def iter_owned(store: Store, uid: str, resource: str) -> Iterable[dict[str, Any]]:
    """Objects of ``resource`` whose controller owner is ``uid`` (live references into the store)."""
    for obj in store.all(resource):
        if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or []):
            yield obj


def age_of(stamp: str | None) -> float:
    return time.time() - parse_time(stamp) if stamp else 0.0
