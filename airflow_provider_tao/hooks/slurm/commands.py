"""The other commands run on the login host -- marks, find a job, list active jobs, preflight, resubmission -- and how
their answers read. Pure functions, no I/O."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from airflow_provider_tao.hooks.slurm.script import RUN_MARK, JobLayout, parse_slurm_minutes
from airflow_provider_tao.hooks.slurm.ssh import SlurmTransportError
from airflow_provider_tao.hooks.slurm.status import sacct_command, squeue_command


def marks_read_command(layout: JobLayout) -> str:
    return (
        f"cd {shlex.quote(layout.marks_dir)} 2>/dev/null || exit 0; "
        'for f in *; do [ -f "$f" ] && printf "%s=%s\\n" "$f" "$(head -c 256 "$f")"; done; exit 0'
    )


def mark_write_command(layout: JobLayout, key: str, value: str) -> str:
    if not re.match(r"^[A-Za-z0-9_]+$", key) or "\n" in value:
        raise ValueError(f"bad mark {key!r}={value!r}")
    m = shlex.quote(layout.marks_dir)
    return f"[ -d {m} ] || exit 0; printf %s {shlex.quote(value)} > {m}/.{key}.$$ && mv -f {m}/.{key}.$$ {m}/{key}"


def last_run(lines: list[str]) -> list[str]:
    """The lines of the newest run (after the last run marker) of an appended log."""
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].startswith(RUN_MARK + " "):
            return lines[index + 1 :]
    return lines


def failure_facts_command(layout: JobLayout, slurm_id: str, lines: int = 200) -> str:
    q = shlex.quote
    return (
        f"{sacct_command([slurm_id])}; printf '@@SQ %d\\n' 0; {squeue_command([slurm_id])} 2>/dev/null; "
        f"printf '@@OUT\\n'; tail -n {lines} {q(layout.out_file)} 2>/dev/null; "
        f"printf '\\n@@ERR\\n'; tail -n {lines} {q(layout.err_file)} 2>/dev/null; exit 0"
    )


def resubmit_command(layout: JobLayout, slurm_id: str, max_resubmits: int) -> str:
    """Requeue a job that ended with a retriable infrastructure failure, at most ``max_resubmits`` times.

    The attempt count lives on the cluster (``marks/resubmits/run-<Restarts>``, created with ``mkdir``, which is
    atomic): whoever asks -- a trigger, a restarted triggerer, a second poll that saw the same failure -- at most
    one requeue happens per failed run. Prints ``@@RS <verdict> ...``.
    """
    q = shlex.quote
    return "\n".join(
        [
            f"J={q(layout.job_dir)}; id={q(slurm_id)}",
            f'max=$(cat "$J/meta/max_resubmits" 2>/dev/null || echo {int(max_resubmits)}); max=$((max+0))',
            '[ -e "$J/marks/cancel_requested_by" ] && { echo "@@RS CANCELED"; exit 0; }',
            'line=$(scontrol -o show job "$id" 2>&1) || { echo "@@RS GONE $line" | head -n1; exit 0; }',
            "state=$(printf '%s' \"$line\" | sed -n 's/.*JobState=\\([A-Z_]*\\).*/\\1/p')",
            "restarts=$(printf '%s' \"$line\" | sed -n 's/.*Restarts=\\([0-9]*\\).*/\\1/p')",
            'case "$state" in FAILED|NODE_FAIL|BOOT_FAIL|PREEMPTED|OUT_OF_MEMORY|DEADLINE) ;; '
            '*) echo "@@RS NOT_FAILED $state"; exit 0;; esac',
            'mkdir -p "$J/marks/resubmits"',
            'used=$(ls "$J/marks/resubmits" | wc -l); used=$((used+0))',
            'if ! mkdir "$J/marks/resubmits/run-${restarts:-0}" 2>/dev/null; then echo "@@RS DONE_BEFORE $used"; '
            "exit 0; fi",
            'if [ "$used" -ge "$max" ]; then rmdir "$J/marks/resubmits/run-${restarts:-0}"; '
            'echo "@@RS EXHAUSTED $used $max"; exit 0; fi',
            'if err=$(scontrol requeue "$id" 2>&1); then echo "@@RS REQUEUED $((used+1)) $max $state"; '
            'else rmdir "$J/marks/resubmits/run-${restarts:-0}"; echo "@@RS FAILED $err" | head -n1; fi',
        ]
    )


def find_job_command(layout: JobLayout) -> str:
    """The newest job of a deterministic name: its index entry, its handle, its recorded Slurm id, the Slurm jobs
    of that name (``id|comment``) and what Slurm's accounting says the recorded id is (``@@ACCT id|name``) -- the
    files are the account's to rewrite, Slurm's records are checked against them (:func:`adoptable`)."""
    q = shlex.quote
    return (
        f'f={q(layout.names_index)}; [ -f "$f" ] && [ ! -L "$f" ] || exit 0; jid=$(head -c 64 "$f"); '
        'case "$jid" in *[!0-9a-f]*|"") printf "@@JOB %s\n" "-"; exit 0;; esac; '
        f'J={q(layout.jobs_root)}/"$jid"; printf "@@JOB %s\n" "$jid"; '
        'head -c 65536 "$J/meta/$jid.json" 2>/dev/null; sid=$(head -c 32 "$J/meta/slurm_job_id" 2>/dev/null); '
        'printf "\n@@ID %s\n" "$sid"; '
        f"squeue -h -t all -n {q(layout.name)} -o '%i|%k' 2>/dev/null; "
        'case "$sid" in *[!0-9]*|"") ;; *) printf "@@ACCT\n"; '
        'sacct -n -X -P -j "$sid" -o JobIDRaw,JobName%300 2>/dev/null || echo "@@FAILED|";; esac; exit 0'
    )


def parse_find_job(text: str) -> tuple[str, dict[str, Any], str, dict[str, str]] | None:
    """(job_id, meta, recorded slurm id, {slurm id: comment} of same-named jobs) or None."""
    found = parse_found_job(text)
    return None if found is None else found[:4]


def parse_found_job(text: str) -> tuple[str, dict[str, Any], str, dict[str, str], dict[str, str]] | None:
    """:func:`parse_find_job` plus ``{slurm id: job name}`` from Slurm's accounting of the recorded id."""
    if not text.startswith("@@JOB "):
        return None
    head, _, rest = text.partition("\n")
    job_id = head.split(" ", 1)[1].strip()
    meta_text, _, tail = rest.partition("\n@@ID ")
    id_line, _, queue = tail.partition("\n")
    queue, _, accounted = queue.partition("@@ACCT\n")
    try:
        meta = json.loads(meta_text) if meta_text.strip() else {}
    except (ValueError, RecursionError):
        meta = {}
    return job_id, meta if isinstance(meta, dict) else {}, id_line.strip(), _pairs(queue), _pairs(accounted)


def _pairs(text: str) -> dict[str, str]:
    pairs = {}
    for line in text.splitlines():
        key, _, value = line.partition("|")
        if key.strip():
            pairs[key.strip()] = value.strip()
    return pairs


def adoptable(
    name: str, conn_id: str, found: tuple[str, dict[str, Any], str, dict[str, str], dict[str, str]]
) -> tuple[dict[str, Any], str] | str:
    """(handle fields, Slurm id) of the job :func:`find_job_command` found, when what the cluster's files say agrees
    with what the task submitted and with Slurm's own records; else why not (a sentence).

    The index, the handle and the recorded Slurm id are files any job of the connection's account may rewrite:
    the handle must name this job id, name, platform and connection, its results folder must be the job's own;
    the Slurm job must carry this name (and, while Slurm still queues it, the comment ``tao:<job_id>`` the submit
    gave it). One account per trust domain stays the boundary: a job of the same account can still submit a
    Slurm job of that name and comment.
    """
    job_id, meta, slurm_id, same_named, accounted = found
    if not re.fullmatch(r"[0-9a-f]{1,64}", job_id):
        return f"the name index of {name} does not hold a job id"
    mine = {"job_id": job_id, "name": name, "platform": "slurm", "conn_id": conn_id}
    differing = sorted(k for k, v in mine.items() if meta.get(k) != v)
    if differing:
        return f"the recorded handle of job {job_id} does not match the submitted job ({', '.join(differing)})"
    results_dir = meta.get("results_dir")
    if not isinstance(results_dir, str) or not results_dir.rstrip("/").endswith(f"/{job_id}"):
        return f"the recorded results folder of job {job_id} is not the job's own"
    if not slurm_id:  # the submitter died before recording the id: the Slurm job of this name and comment
        slurm_id = next((sid for sid, c in same_named.items() if c == f"tao:{job_id}"), "")
    elif slurm_id in same_named:
        if same_named[slurm_id] != f"tao:{job_id}":
            return f"Slurm job {slurm_id} recorded for job {job_id} carries another job's comment"
    elif "@@FAILED" in accounted:  # a failed read decides nothing: the caller asks again later
        raise SlurmTransportError(f"sacct could not say what Slurm job {slurm_id} (recorded for {job_id}) is")
    elif accounted.get(slurm_id) != name:
        return f"Slurm job {slurm_id} recorded for job {job_id} is not a job named {name}"
    return meta, slurm_id


def active_jobs_command(results_root: str) -> str:
    """This user's queued or running jobs with this provider's comment (``tao:<job_id>``), each with its meta."""
    jobs_root = shlex.quote(f"{results_root}/jobs")
    return (
        "squeue -h --me -o '%i|%k' 2>/dev/null | while IFS='|' read -r sid c; do case \"$c\" in tao:*) "
        'jid=${c#tao:}; case "$jid" in *[!0-9a-f]*|"") continue;; esac; '
        f'm={jobs_root}/"$jid"/meta/"$jid".json; '
        '[ -f "$m" ] && printf "@@JOB %s %s\\n" "$sid" "$(tr -d "\\n" < "$m")";; esac; done; exit 0'
    )


def parse_active_jobs(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(Slurm job id, meta) pairs from :func:`active_jobs_command`'s output."""
    found = []
    for line in text.splitlines():
        if not line.startswith("@@JOB "):
            continue
        _, slurm_id, meta_text = line.split(" ", 2) if line.count(" ") >= 2 else (line, "", "")
        try:
            meta = json.loads(meta_text)
        except ValueError:
            continue
        if isinstance(meta, dict) and slurm_id:
            found.append((slurm_id, meta))
    return found


def preflight_command(partitions: list[str] | None, paths: list[str], check_python: bool, need_boto3: bool) -> str:
    """One remote run answering every check before submission (partition time limits, inputs, bare-metal python)."""
    q = shlex.quote
    parts = [f"sinfo -h -o '%P|%l' {'-p ' + q(','.join(partitions)) if partitions else ''} 2>&1 | sed 's/^/@@PART /'"]
    for index, path in enumerate(paths):
        parts.append(f"if test -e {q(path)}; then echo '@@IN {index} 1'; else echo '@@IN {index} 0'; fi")
    if check_python:
        parts.append(
            "if command -v python3 >/dev/null 2>&1; then echo \"@@PY $(python3 -c 'import sys; "
            "print(\"%d.%d\" % sys.version_info[:2])' 2>&1)\"; else echo '@@PY missing'; fi"
        )
        if need_boto3:
            parts.append("if python3 -c 'import boto3' >/dev/null 2>&1; then echo '@@BOTO 1'; else echo '@@BOTO 0'; fi")
    return "; ".join(parts) + "; exit 0"


def parse_preflight(text: str) -> dict[str, Any]:
    result: dict[str, Any] = {"partitions": {}, "inputs": {}, "python": None, "boto3": None, "sinfo_errors": []}
    for line in text.splitlines():
        if line.startswith("@@PART "):
            body = line[7:]
            name, sep, limit = body.partition("|")
            if not sep:
                result["sinfo_errors"].append(body)
                continue
            result["partitions"][name.rstrip("*")] = (parse_slurm_minutes(limit), name.endswith("*"))
        elif line.startswith("@@IN "):
            _, index, ok = line.split()
            result["inputs"][int(index)] = ok == "1"
        elif line.startswith("@@PY "):
            result["python"] = line[5:].strip()
        elif line.startswith("@@BOTO "):
            result["boto3"] = line[7:].strip() == "1"
    return result
