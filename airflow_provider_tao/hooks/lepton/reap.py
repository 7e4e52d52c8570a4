"""What ``airflow tao reap`` removes on a ``lepton`` connection besides jobs: the secrets of jobs that will never
read them.

A submission creates the job's user secrets (``tao.<job_id>.env.*``: AWS, NGC, HF values; ``tao.<job_id>.files.*``)
and its image pull secret (``tao-<job_id>-pull``) BEFORE it posts the job -- staging and the wait for an old job's
id can take minutes. A worker that dies in between leaves them with no job, and no later try uses that job id. Such
secrets are deleted once they have been seen without a job for :data:`ORPHAN_GRACE_SECONDS` (longer than any
submission takes): the first sweep that sees them writes ``tao.<job_id>.orphan-since.<epoch>`` (the API gives a
secret no creation time), a later one deletes them. The secrets of a job that has ended go at once (its task's own
cleanup does the same; its ownership marks stay, for their own sweep). A job is judged absent only by a query for
it alone: a page missed from the whole list never makes a live job's secrets look orphaned.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from airflow_provider_tao.hooks.base import Recorded
from airflow_provider_tao.hooks.lepton.api import LeptonAPIHook, pull_secret_name, secret_prefix
from airflow_provider_tao.hooks.lepton.status import (
    ENDING_STATES,
    FINISHED_STATES,
    LABEL_JOB_ID,
    LABEL_MANAGED,
    labels_of,
    state_of,
)

#: Secrets seen without a job are deleted this long after they were first seen so (a submission posts its job
#: within the staging timeout, 600 s by default, plus a minute of waiting for an old job's id).
ORPHAN_GRACE_SECONDS = 3600
_SINCE = "orphan-since"
_PULL_PREFIX, _PULL_SUFFIX = pull_secret_name("|").split("|")


class LeptonReapHook(LeptonAPIHook):
    """Secret reaping of :class:`~airflow_provider_tao.hooks.lepton.LeptonHook` (its base; not a platform by itself).

    :param conn_id: the ``tao_lepton`` connection, or None for the environment's ``LEPTON_*`` variables.
    """

    def reap_resources(
        self,
        task_state: Callable[[Mapping[str, Any]], str | None],
        *,
        dry_run: bool,
        recorded: Recorded | None = None,
        now: float | None = None,
    ) -> list[dict[str, str]]:
        """One row per job whose secrets were deleted, marked as orphaned, or would be (``dry_run``).

        :param now: epoch seconds (tests); the time now by default.
        """
        self._ready()
        now = time.time() if now is None else now
        held = self._secrets_by_job()
        if not held:
            return []
        alive = {labels_of(j).get(LABEL_JOB_ID): j for j in self._list_jobs(f"{LABEL_MANAGED}=true")}
        rows = []
        for job_id, (names, pull) in sorted(held.items()):
            jobs = [alive[job_id]] if job_id in alive else self._jobs_of(job_id)
            live = [j for j in jobs if state_of(j) not in FINISHED_STATES | ENDING_STATES]
            since = [float(n.rsplit(".", 1)[1]) for n in names if f".{_SINCE}." in n and _stamp(n)]
            if live:
                if since and not dry_run:
                    self._delete_secrets(job_id, [n for n in names if f".{_SINCE}." in n])
                continue
            if jobs:
                why = f"its job has ended ({state_of(jobs[0])})"
            elif since and now - min(since) >= ORPHAN_GRACE_SECONDS:
                why = f"no job has used them for {now - min(since):.0f} s (a submission that died before its job)"
            else:
                if not since and not dry_run:
                    # another sweep (a scheduled reap beside a person's) may have marked it in the same second
                    self._create_secrets({f"{secret_prefix(job_id)}{_SINCE}.{int(now)}": "1"}, exists_ok=True)
                rows.append(self._row(job_id, "would mark" if dry_run and not since else "kept", _waiting(since, now)))
                continue
            if not dry_run:
                self._delete_secrets(job_id, names, pull_secret=pull)
            rows.append(self._row(job_id, "would delete" if dry_run else "deleted", why))
        return rows

    def _row(self, job_id: str, action: str, why: str) -> dict[str, str]:
        self.log.info("Reaper: %s the secrets of Lepton job %s: %s", action, job_id, why)
        return {"resource": f"secrets of job {job_id}", "action": action, "why": why}

    def _secrets_by_job(self) -> dict[str, tuple[list[str], bool]]:
        """``{job_id: (its user secrets other than marks, whether it has an image pull secret)}``."""
        held: dict[str, tuple[list[str], bool]] = {}
        for name in self._secret_names():
            parts = name.split(".")
            if len(parts) >= 3 and parts[0] == "tao" and parts[2] != "mark":
                held.setdefault(parts[1], ([], False))[0].append(name)
        for name in self._pull_secret_names():
            if name.startswith(_PULL_PREFIX) and name.endswith(_PULL_SUFFIX):
                job_id = name[len(_PULL_PREFIX) : -len(_PULL_SUFFIX)]
                held[job_id] = (held.get(job_id, ([], False))[0], True)
        return held

    def _pull_secret_names(self) -> list[str]:
        listed = self._raw("listing image pull secrets", "get", "/imagepullsecrets") or []
        return [str((s.get("metadata") or {}).get("name") or "") for s in listed if isinstance(s, dict)]

    def _jobs_of(self, job_id: str) -> list[dict[str, Any]]:
        """The jobs of one job id, alive or archived (asked alone: absent from the whole list is not yet gone)."""
        return self._list_jobs(f"{LABEL_MANAGED}=true,{LABEL_JOB_ID}={job_id}", mode="alive_and_archive")


def _stamp(name: str) -> bool:
    return name.rsplit(".", 1)[1].isdigit()


def _waiting(since: list[float], now: float) -> str:
    if not since:
        return "no job has them yet: first seen now (a submission may still be posting it)"
    return f"no job has them for {now - min(since):.0f} s of the {ORPHAN_GRACE_SECONDS} s a submission may take"
