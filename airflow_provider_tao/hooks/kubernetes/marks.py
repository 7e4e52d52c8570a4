"""Ownership marks as annotations of the Job, and the cancel they guard: JSON patches that act only on the Job as the
handle (or the cancel's read) knows it -- never on another try's Job of the same name."""

from __future__ import annotations

import contextlib
import json
from typing import Any, TypeGuard

from airflow_provider_tao.hooks.kubernetes.api import KubernetesAPIHook
from airflow_provider_tao.hooks.ownership import MARK_CANCEL, MARK_KEYS, MARK_OWNER, cancel_binds
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.jobs import JobHandle

_MARK_KEYS = MARK_KEYS
JSON_PATCH = "application/json-patch+json"
#: Times a cancel re-reads a Job whose marks changed between its read and its suspension.
CANCEL_CONFLICT_RETRIES = 5
#: Times a mark is written again on our Job that changed between a refused write and the read explaining it.
MARK_CONFLICT_RETRIES = 3


def mark_annotation(key: str) -> str:
    """The Job annotation that keeps ownership mark ``key``."""
    return f"{ct.LABEL_DOMAIN}/{key}"


def _ours(job: dict[str, Any] | None, handle: JobHandle) -> TypeGuard[dict[str, Any]]:
    """``job`` is ``handle``'s own (its job id label), not a newer try's Job of the same name."""
    return job is not None and (job["metadata"].get("labels") or {}).get(ct.LABEL_JOB_ID) == handle.job_id


def _marks(job: dict[str, Any] | None, handle: JobHandle) -> dict[str, Any]:
    if not _ours(job, handle):
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


def _mark_patch(handle: JobHandle, key: str, value: Any, job: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A JSON patch that keeps mark ``key`` only on the Job ``handle`` names: a ``test`` of its job id first, in the
    same request, so another try's Job of the name (retries share it) refuses it (422) and stays unmarked. A Job
    read (``job``) without annotations gets the map -- only as read (its resourceVersion): RFC 6902's ``add``
    needs the parent, and an ``add`` of the whole map would replace one written meanwhile."""
    ours = {"op": "test", "path": f"/metadata/labels/{_pointer(ct.LABEL_JOB_ID)}", "value": handle.job_id}
    annotation, text = mark_annotation(key), json.dumps(value)
    if job is None or job["metadata"].get("annotations") is not None:
        return [ours, {"op": "add", "path": f"/metadata/annotations/{_pointer(annotation)}", "value": text}]
    as_read = {"op": "test", "path": "/metadata/resourceVersion", "value": job["metadata"]["resourceVersion"]}
    return [ours, as_read, {"op": "add", "path": "/metadata/annotations", "value": {annotation: text}}]


class KubernetesMarksHook(KubernetesAPIHook):
    """Reads and writes a Job's marks; cancels (suspends) and deletes Jobs."""

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
        if not _ours(job, handle):
            return True
        marks = _marks(job, handle)
        if not cancel_binds(marks, handle.try_number):  # a newer try claimed the Job since the mark
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

    def read_marks(self, handle: JobHandle) -> dict[str, Any]:
        job = self._read_job(handle.name)
        return _marks(job, handle)

    async def aread_marks(self, handle: JobHandle) -> dict[str, Any]:
        return _marks(await self._aread_job(handle.name), handle)

    def _not_ours(self, job: dict[str, Any] | None, handle: JobHandle, key: str) -> bool:
        """True, logged, when ``job`` -- read after a refused mark -- is not ``handle``'s: the mark is not kept, and
        nothing of another try's Job is touched (its cancel sees the same: nothing of ``handle``'s left to stop)."""
        if job is None:
            self.log.info("Job %s no longer exists: mark %s not kept", handle.name, key)
        elif not _ours(job, handle):
            self.log.info("Job %s is another job's now (not %s): mark %s not kept", handle.name, handle.job_id, key)
        return not _ours(job, handle)

    def write_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        """Keep ``key`` on ``handle``'s own Job only (see :func:`_mark_patch`). A refusal (422) is explained by the
        Job read after it: gone or another job's -- the mark is not kept --, or ours and changed: written again."""
        from kubernetes.client.exceptions import ApiException

        job: dict[str, Any] | None = None
        for _ in range(MARK_CONFLICT_RETRIES):
            try:
                ops = _mark_patch(handle, key, value, job)
                self._call("batch", "patch_namespaced_job", handle.name, self.namespace, ops, _content_type=JSON_PATCH)
                return
            except ApiException as exc:
                if exc.status not in (404, 422):
                    raise
                refused = exc
            job = None if refused.status == 404 else self._read_job(handle.name)
            if self._not_ours(job, handle, key):
                return
        raise refused

    async def awrite_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        job: dict[str, Any] | None = None
        for _ in range(MARK_CONFLICT_RETRIES):
            try:
                ops = _mark_patch(handle, key, value, job)
                await self._acall("batch", "patch_namespaced_job", handle.name, self.namespace, ops,
                                  _content_type=JSON_PATCH)  # fmt: skip
                return
            except ApiException as exc:
                if exc.status not in (404, 422):
                    raise
                refused = exc
            job = None if refused.status == 404 else await self._aread_job(handle.name)
            if self._not_ours(job, handle, key):
                return
        raise refused
