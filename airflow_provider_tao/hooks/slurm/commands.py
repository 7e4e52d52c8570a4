"""The other commands run on the login host -- marks, find a job, list active jobs, preflight, resubmission -- and how
their answers read. Pure functions, no I/O."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from airflow_provider_tao.hooks.slurm.script import RUN_MARK, JobLayout, parse_slurm_minutes
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
    q = shlex.quote
    return (
        f'f={q(layout.names_index)}; [ -f "$f" ] || exit 0; jid=$(head -c 64 "$f"); '
        f'J={q(layout.jobs_root)}/"$jid"; printf "@@JOB %s\\n" "$jid"; '
        'cat "$J/meta/$jid.json" 2>/dev/null; printf "\\n@@ID %s\\n" "$(cat "$J/meta/slurm_job_id" 2>/dev/null)"; '
        f"squeue -h -t all -n {q(layout.name)} -o '%i|%k' 2>/dev/null; exit 0"
    )


def parse_find_job(text: str) -> tuple[str, dict[str, Any], str, dict[str, str]] | None:
    """(job_id, meta, recorded slurm id, {slurm id: comment} of same-named jobs) or None."""
    if not text.startswith("@@JOB "):
        return None
    head, _, rest = text.partition("\n")
    job_id = head.split(" ", 1)[1].strip()
    meta_text, _, tail = rest.partition("\n@@ID ")
    id_line, _, queue = tail.partition("\n")
    try:
        meta = json.loads(meta_text) if meta_text.strip() else {}
    except ValueError:
        meta = {}
    comments = {}
    for line in queue.splitlines():
        slurm_id, _, comment = line.partition("|")
        if slurm_id.strip():
            comments[slurm_id.strip()] = comment.strip()
    return job_id, meta, id_line.strip(), comments


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
