"""Ownership marks of ``lepton`` jobs (who owns a job, who asked to cancel it, who consumed its verdict).

Marks are labels of the job, patched. Whether a workspace lets a PATCH change labels is not documented, so every
write is read back; where labels do not change, the marks are user secrets named ``tao.<job_id>.mark.<key>.<try>``
(marks only ever grow, so the highest try wins). Reads merge both. Mark secrets live as long as their job: those of
jobs that no longer exist are swept before the next submission.
"""

from __future__ import annotations

import asyncio
from typing import Any

from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.hooks.lepton_api import LeptonAPIHook, mark_prefix, status_of
from airflow_provider_tao.hooks.lepton_status import LABEL_JOB_ID, LABEL_MANAGED, MARK_LABELS, id_of, labels_of
from airflow_provider_tao.jobs import JobHandle

#: Per workspace URL: whether a PATCH changes a job's labels (None: not yet seen in this process).
_LABELS_PATCHABLE: dict[str, bool] = {}


class LeptonMarksHook(LeptonAPIHook):
    """Ownership marks of :class:`~airflow_provider_tao.hooks.lepton.LeptonHook` (its base; not a platform by itself).

    :param conn_id: the ``tao_lepton`` connection, or None for the environment's ``LEPTON_*`` variables.
    """

    def _labels_patchable(self) -> bool | None:
        """Whether this workspace lets a PATCH change labels (None: not yet seen in this process)."""
        return _LABELS_PATCHABLE.get(self._url())

    def read_marks(self, handle: JobHandle) -> dict[str, Any]:
        self._ready()
        job = self._own_job(handle)
        if job is None:
            return {}  # gone, or a newer job: nothing of this one was claimed
        marks: dict[str, Any] = {}
        labels = labels_of(job)
        for key, label in MARK_LABELS.items():
            if str(labels.get(label, "")).isdigit():
                marks[key] = int(labels[label])
        if self._labels_patchable() is not True:
            prefix = mark_prefix(handle.job_id)
            for name in self._secret_names():
                key, _, value = name.removeprefix(prefix).rpartition(".")
                if name.startswith(prefix) and key in MARK_LABELS and value.isdigit():
                    marks[key] = max(int(value), marks.get(key, 0))
        return marks

    def write_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        """Patch the job's label and read it back; where the workspace keeps labels as created, a mark secret."""
        self._ready()
        job = self._own_job(handle)
        if job is None:
            self.log.info("Lepton job %s no longer exists: mark %s not kept", handle.backend_job_id, key)
            return
        url, label = self._url(), MARK_LABELS[key]
        if _LABELS_PATCHABLE.get(url) is not False:
            labels = {**labels_of(job), label: str(value)}
            try:
                self._api("marking the job", lambda c: c.job.update(id_of(job), spec={"metadata": {"labels": labels}}))
                after = self._get_job(id_of(job))
                _LABELS_PATCHABLE[url] = after is not None and labels_of(after).get(label) == str(value)
            except Exception as exc:
                code = status_of(exc)  # None for a refused token (JobValidationError): raised
                if code is None or code >= 500 or code == 404:
                    raise
                _LABELS_PATCHABLE[url] = False
            if _LABELS_PATCHABLE[url]:
                return
            self.log.info("This Lepton workspace keeps job labels as created: ownership marks are kept in secrets")
        name = f"{mark_prefix(handle.job_id)}{key}.{int(value)}"
        try:
            self._create_secrets({name: str(value)})
        except Exception as exc:
            if status_of(exc) != 409:  # the same mark, written before
                raise

    def _sweep_orphan_marks(self) -> None:
        """Where marks are secrets, those of jobs that no longer exist (expired after their TTL, deleted outside
        Airflow) are deleted: marks live as long as their job, as labels would."""
        try:
            marks = [n for n in self._secret_names() if n.startswith("tao.") and ".mark." in n]
            if not marks:
                return
            alive = {labels_of(j).get(LABEL_JOB_ID) for j in self._list_jobs(f"{LABEL_MANAGED}=true")}
            for name in marks:
                if name.split(".")[1] not in alive:
                    self._delete_secret(name)
        except JobValidationError:
            raise
        except Exception as exc:
            self.log.warning("Sweeping the marks of ended jobs failed: %s", exc)

    async def aread_marks(self, handle: JobHandle) -> dict[str, Any]:
        await self._aready()
        return await asyncio.to_thread(self.read_marks, handle)

    async def awrite_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        await self._aready()
        await asyncio.to_thread(self.write_mark, handle, key, value)
