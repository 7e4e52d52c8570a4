"""Ownership marks as annotations of the Job (merge patches), and the cancel they guard: a JSON patch that suspends
the Job only as read."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from airflow_provider_tao.hooks.base import MARK_CANCEL, MARK_CANCELED_BY, MARK_CONSUMED, MARK_OWNER
from airflow_provider_tao.hooks.kubernetes.api import KubernetesAPIHook
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.jobs import JobHandle

_MARK_KEYS = frozenset({MARK_OWNER, MARK_CANCEL, MARK_CONSUMED, MARK_CANCELED_BY})
JSON_PATCH = "application/json-patch+json"
#: Times a cancel re-reads a Job whose marks changed between its read and its suspension.
CANCEL_CONFLICT_RETRIES = 5


def mark_annotation(key: str) -> str:
    """The Job annotation that keeps ownership mark ``key``."""
    return f"{ct.LABEL_DOMAIN}/{key}"


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
