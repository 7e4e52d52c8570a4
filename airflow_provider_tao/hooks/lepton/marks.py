"""Ownership marks of ``lepton`` jobs (who owns a job, who asked to cancel it, who consumed its verdict, who canceled
it from outside its task).

Marks are labels of the job, patched: try numbers as digits, who canceled the job in label characters (``cli:jdoe``
is kept as ``cli-jdoe``). Whether a workspace lets a PATCH change labels is not documented, so every write is read
back; where labels do not change, the marks are user secrets named ``tao.<job_id>.mark.<key>.<value>`` (try numbers
only ever grow, so the highest wins); an archived job's too (a PATCH names alive jobs only, so the one mark written
after a job ends -- its result used -- is a secret once its TTL passed). Reads merge both. Mark secrets live as long
as their job: those of jobs that no longer exist are swept before the next submission (who canceled a job outlives
its deletion until then: its task reads it when it resumes). A deleted job -- gone, or still shown as ``Deleted`` --
takes no mark: its secrets went with its deletion, and one written after would outlive it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.hooks.lepton.api import LeptonAPIHook, mark_prefix, status_of
from airflow_provider_tao.hooks.lepton.status import (
    GONE_STATES,
    LABEL_JOB_ID,
    LABEL_MANAGED,
    MARK_LABELS,
    TEXT_MARKS,
    id_of,
    labels_of,
    mark_text,
    mark_value,
    marks_of,
    state_of,
)
from airflow_provider_tao.jobs import JobHandle

#: Per workspace URL: whether a PATCH changes a job's labels (None: not yet seen in this process).
_LABELS_PATCHABLE: dict[str, bool] = {}
#: Where a mark is kept (``_patched``): the job's label, a secret, or nowhere (the job was deleted).
_Kept = Literal["label", "secret", "deleted"]


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
        marks = marks_of(job)
        if self._labels_patchable() is not True or _archived(job):
            prefix = mark_prefix(handle.job_id)
            for name in self._secret_names():
                for key in MARK_LABELS:
                    if not name.startswith(f"{prefix}{key}."):
                        continue
                    value = mark_value(key, name.removeprefix(f"{prefix}{key}."))
                    if key in TEXT_MARKS and value is not None:
                        marks[key] = value
                    elif value is not None:
                        marks[key] = max(value, marks.get(key, 0))  # marks only grow: the highest try wins
        return marks

    def write_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        """Patch the job's label and read it back; where the workspace keeps labels as created, or the job was
        archived (a PATCH names alive jobs only), a mark secret."""
        self._ready()
        job = self._own_job(handle)
        if job is None or _deleted(job):
            self.log.info("Lepton job %s no longer exists: mark %s not kept", handle.backend_job_id, key)
            return
        text = mark_text(key, value)
        patchable = not _archived(job) and _LABELS_PATCHABLE.get(self._url()) is not False
        kept = self._patched(handle, job, MARK_LABELS[key], text) if patchable else "secret"
        if kept == "label":
            return
        if kept == "deleted":  # deleted as it was patched (the PATCH's 404)
            self.log.info("Lepton job %s was deleted meanwhile: mark %s not kept", handle.backend_job_id, key)
            return
        name = f"{mark_prefix(handle.job_id)}{key}.{text}"
        try:
            self._create_secrets({name: str(value)})
        except Exception as exc:
            if status_of(exc) != 409:  # the same mark, written before
                raise

    def _patched(self, handle: JobHandle, job: dict[str, Any], label: str, text: str) -> _Kept:
        """Where the mark is to be kept: ``label`` (kept as the job's label), ``secret`` (this workspace keeps labels
        as created, or the job was archived as it was patched) or ``deleted`` (nowhere: the job was deleted as it
        was patched); learns whether this workspace changes labels."""
        url = self._url()
        labels = {**labels_of(job), label: text}
        try:
            self._api("marking the job", lambda c: c.job.update(id_of(job), spec={"metadata": {"labels": labels}}))
            after = self._get_job(id_of(job))
            _LABELS_PATCHABLE[url] = after is not None and labels_of(after).get(label) == text
        except Exception as exc:
            code = status_of(exc)  # None for a refused token (JobValidationError): raised
            now = self._own_job(handle) if code == 404 else None
            if code == 404 and _deleted(now):
                return "deleted"
            if code == 404 and _archived(now):
                return "secret"  # archived since it was read (its TTL passed as it ended)
            if code is None or code >= 500 or code == 404:
                raise
            _LABELS_PATCHABLE[url] = False
        if not _LABELS_PATCHABLE[url]:
            self.log.info("This Lepton workspace keeps job labels as created: ownership marks are kept in secrets")
        return "label" if _LABELS_PATCHABLE[url] else "secret"

    def _sweep_orphan_marks(self) -> None:
        """Where marks are secrets, those of jobs that no longer exist (expired after their TTL, deleted outside
        Airflow) are deleted: marks live as long as their job, as labels would."""
        try:
            marks = [n for n in self._secret_names() if n.startswith("tao.") and ".mark." in n]
            if not marks:
                return
            alive = {labels_of(j).get(LABEL_JOB_ID) for j in self._list_jobs(f"{LABEL_MANAGED}=true")}
            gone: dict[str, bool] = {}
            for name in marks:
                job_id = name.split(".")[1]
                if job_id in alive:
                    continue
                if job_id not in gone:
                    # absent from the whole list is not yet gone (a page may have been missed): its own query says
                    narrow = f"{LABEL_MANAGED}=true,{LABEL_JOB_ID}={job_id}"
                    gone[job_id] = not self._list_jobs(narrow)
                if gone[job_id]:
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


def _deleted(job: dict[str, Any] | None) -> bool:
    """Whether the job is gone or deleted (Lepton shows a deleted job as ``Deleted`` for a while)."""
    return job is None or state_of(job) == "Deleted"


def _archived(job: dict[str, Any] | None) -> bool:
    """Whether the job is gone, archived (its ``ttl_seconds_after_finished`` passed) or deleted: a PATCH of its
    labels is refused (404), so its marks from then on are secrets."""
    return job is None or state_of(job) in GONE_STATES
