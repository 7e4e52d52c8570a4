"""What ``airflow tao reap`` removes on a ``slurm`` connection besides jobs: the 0600 env files (every secret of a
job) of jobs that have ended and whose task is over.

A job's env file is deleted by :meth:`~airflow_provider_tao.hooks.slurm.SlurmHook.cleanup_job` only -- the task's
resume or a kill's cleanup, best effort. It stays when the resume never runs (the task was marked failed after its
trigger's event), a worker kill cuts the resume short, or the ``rm`` fails under an outage. The sweep lists every env
file under the connection's jobs folder with its Slurm job id, and Slurm's queue, in ONE command, and deletes in one
more those of jobs Slurm no longer runs or queues whose task this Airflow's records say is over (the rule of
:mod:`~airflow_provider_tao.hooks.shared.reaping`, as Brev's failed instances). It keeps the env file of a job that
is pending or running (it reads it at every start, a requeue too), of a task that may still resume and requeue its
job (running, deferred, up for retry, cleared), and of a job no record names: another deployment's, or one whose
submitting try died before recording it -- its next try adopts it by name, and the write-ahead names it once the
task is over.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

from airflow_provider_tao.hooks.base import Recorded
from airflow_provider_tao.hooks.shared.reaping import TaskState, task_over_by_record
from airflow_provider_tao.hooks.slurm.plan import SlurmPlanHook
from airflow_provider_tao.hooks.slurm.ssh import SlurmTransportError
from airflow_provider_tao.hooks.slurm.status import STATE_MAP

_FILE, _QUEUE_RC, _GONE = "@@ENV ", "@@SQ ", "@@GONE "
#: A job folder's name as the submission makes it (a job id): anything else under the jobs folder is not a job's.
_JOB_FOLDER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


@dataclass(frozen=True)
class EnvFile:
    """One job's env file as the listing found it: its job id, the Slurm id its submission recorded ("" when the
    submitter died before recording it) and its job name (from the job's ``meta/<job_id>.json``)."""

    job_id: str
    slurm_id: str
    name: str


def env_files_command(jobs_root: str) -> str:
    """ONE remote run: every job folder's env file with its Slurm id and meta, THEN this user's jobs Slurm knows
    (``squeue -t all``: every pending or running one, and ended ones for a while), each with its comment
    (``tao:<job_id>``: the job of a submitter that died before recording the Slurm id). Files first: a job
    submitted after the listing is not judged; one submitted before it is in the queue that follows."""
    return (
        f"cd {shlex.quote(jobs_root)} 2>/dev/null || exit 0; "
        # shell builtins only: no process per file (hundreds of files cost seconds with a fork each)
        'for J in *; do [ -f "$J/env/$J.env" ] || continue; sid=; meta=; '
        '{ read -r sid; } 2>/dev/null < "$J/meta/slurm_job_id"; { read -r meta; } 2>/dev/null < "$J/meta/$J.json"; '
        f'printf "{_FILE}%s|%s|%s\\n" "$J" "$sid" "$meta"; done; '
        f"squeue -h --me -t all -o '%i|%T|%k'; printf '{_QUEUE_RC}%d\\n' $?; exit 0"
    )


def parse_env_files(text: str) -> tuple[list[EnvFile], dict[str, str] | None, dict[str, set[str]]]:
    """:func:`env_files_command`'s answer: the env files, Slurm's job states by Slurm id (None when ``squeue`` failed
    or did not answer: nothing may then be judged ended) and the Slurm ids of each TAO job id by comment."""
    files: list[EnvFile] = []
    states: dict[str, str] = {}
    by_comment: dict[str, set[str]] = {}
    queue_rc = None
    for line in text.splitlines():
        if line.startswith(_FILE):
            job_id, slurm_id, meta = [*line[len(_FILE) :].split("|", 2), "", ""][:3]
            if _JOB_FOLDER.match(job_id):
                files.append(EnvFile(job_id, slurm_id.strip(), _name(meta)))
        elif line.startswith(_QUEUE_RC):
            queue_rc = line[len(_QUEUE_RC) :].strip()
        elif line.count("|") >= 2:
            slurm_id, state, comment = line.split("|", 2)
            states[slurm_id.strip()] = state.split()[0].rstrip("+").upper() if state.strip() else ""
            if comment.startswith("tao:"):
                by_comment.setdefault(comment[4:].strip(), set()).add(slurm_id.strip())
    return files, (states if queue_rc == "0" else None), by_comment


def _name(meta: str) -> str:
    try:
        data = json.loads(meta)
    except ValueError:
        return ""
    return str(data.get("name") or "") if isinstance(data, dict) else ""


#: Deletes the env files named on stdin (one path a line); prints each one gone.
DELETE_COMMAND = f'while IFS= read -r f; do rm -f -- "$f" && printf \'{_GONE}%s\\n\' "$f"; done; exit 0'


def still_runs(state: str) -> bool:
    """Whether a job in Slurm's ``state`` may still start and read its env file (a word Slurm added since: yes)."""
    known = STATE_MAP.get(state)
    return known is None or not known.is_terminal


class SlurmReapHook(SlurmPlanHook):
    """Env-file reaping of :class:`~airflow_provider_tao.hooks.slurm.SlurmHook` (its base; not a platform by itself)."""

    def reap_resources(
        self, task_state: TaskState, *, dry_run: bool, recorded: Recorded | None = None
    ) -> list[dict[str, str]]:
        """One row per env file deleted (or that would be, ``dry_run``); one ``skipped`` row when Slurm's queue
        could not be read. Kept files are logged only. Two commands at most: the listing, the delete."""
        jobs_root = self.layout("_", "_").jobs_root
        listing = self.run(env_files_command(jobs_root), timeout=120)
        files, states, by_comment = parse_env_files(listing.text)
        if not files:
            return []
        if states is None:  # an unread queue says nothing about which jobs ended: keep every file
            why = f"Slurm's queue could not be read ({listing.err_text[:300] or 'no answer'}): no job judged ended"
            self.log.warning("Reaper: skipped the env files under %s: %s", jobs_root, why)
            return [{"resource": jobs_root, "kind": "env files", "action": "skipped", "why": why}]
        doomed: dict[str, str] = {}
        for found in files:
            path = self.layout(found.job_id, found.name).env_file
            ids = sorted(({found.slurm_id} | by_comment.get(found.job_id, set())) - {""})
            running = [f"{i} is {states[i]}" for i in ids if i in states and still_runs(states[i])]
            if running:
                self.log.debug("Reaper: kept %s: its Slurm job %s", path, ", ".join(running))
                continue
            origins = [(recorded or {}).get(key) for key in (*ids, found.name)]
            origin = next((o for o in origins if o is not None and o.get("name") == found.name), None)
            over, why = task_over_by_record(origin, found.name, task_state)
            if not over:
                self.log.debug("Reaper: kept %s: %s", path, why or "no task record of this Airflow names it")
                continue
            ended = ", ".join(f"{i} {states.get(i, 'no longer listed')}" for i in ids) or "none was submitted"
            doomed[path] = f"its Slurm job has ended ({ended}) and {why}"
        gone, failure = set(), ""
        if doomed and not dry_run:
            stdin = "".join(f"{path}\n" for path in doomed).encode()
            try:
                done = self.run(DELETE_COMMAND, stdin=stdin, timeout=120)
            except SlurmTransportError as exc:  # the files wait for the next sweep; this one's job cancels go on
                failure = f"; rm failed: {exc}"
            else:
                gone = {line[len(_GONE) :] for line in done.text.splitlines() if line.startswith(_GONE)}
                failure = f"; rm failed: {done.err_text[:300] or done.rc}"
        rows = []
        for path, reason in doomed.items():
            action = "would delete" if dry_run else "deleted" if path in gone else "failed"
            why = reason + (failure if action == "failed" else "")
            self.log.info("Reaper: %s the env file %s: %s", action, path, why)
            rows.append({"resource": path, "kind": "env file", "action": action, "why": why})
        return rows
