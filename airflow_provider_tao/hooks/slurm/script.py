"""What the SLURM platform writes and runs on the cluster, and how it reads Slurm's answers. Pure functions, no I/O.

Layout of one job under the connection's ``results_root`` (every folder 0700, every file 0600: the staging shell
runs under ``umask 077``)::

    jobs/<job_id>/specs/<job_id>.json       the JobSpec without secret values
    jobs/<job_id>/env/<job_id>.env          ``export K='v'`` lines: the job's whole environment, secrets included
    jobs/<job_id>/meta/<job_id>.json        the handle (name, try, results folder); meta/slurm_job_id after sbatch
    jobs/<job_id>/files/                    JobSpec.files (TAO_JOB_FILES): the in-job runner arrives here
    jobs/<job_id>/command/                  the command: ``command.txt`` (a string) or ``argv.sh`` (a list)
    jobs/<job_id>/launch.sh                 per-task launcher (POSIX sh: rank variables, then exec the command)
    jobs/<job_id>/marks/                    ownership marks and resubmission guards (small files, written atomically)
    jobs/<job_id>/sbatch/job_<job_id>.sbatch
    jobs/<job_id>/slurm-logs/<name>-<job_id>/main.out | main.err   (created BEFORE sbatch: Slurm never creates it)
    jobs/_names/<name>                      the newest job_id of a deterministic name (find_job)
    results/<job_id>/                       the job's results (TAO_RESULTS_ROOT=<results_root>/results)

The sbatch script holds no environment value: it sources the 0600 env file when it runs. The command is staged in
a file and run by exactly one ``/bin/bash -c`` (a string) or exec'd as is (a list); nothing user-provided is ever
interpolated into a shell line unquoted, and job names / partitions / paths are checked against strict patterns.
"""

from __future__ import annotations

import io
import json
import math
import re
import shlex
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_tao.accounting import JobUsage
from airflow_provider_tao.jobs import JobState, JobStatus

# ----------------------------------------------------------------------------- state map

#: Slurm's job states (squeue %T / sacct State, first word) -> the shared vocabulary. The seeds' map with two
#: corrections: PREEMPTED is a (retriable) failure, not Canceled; REQUEUED & co. are Pending (the job runs again).
STATE_MAP: dict[str, JobState] = {
    "PENDING": JobState.PENDING,
    "CONFIGURING": JobState.PENDING,
    "RESIZING": JobState.PENDING,
    "REQUEUED": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "SPECIAL_EXIT": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "SUSPENDED": JobState.PAUSED,
    "STOPPED": JobState.PAUSED,
    "COMPLETED": JobState.COMPLETE,
    "CANCELLED": JobState.CANCELED,
    "REVOKED": JobState.CANCELED,
    "FAILED": JobState.ERROR,
    "BOOT_FAIL": JobState.ERROR,
    "DEADLINE": JobState.ERROR,
    "OUT_OF_MEMORY": JobState.ERROR,
    "NODE_FAIL": JobState.ERROR,
    "TIMEOUT": JobState.ERROR,
    "PREEMPTED": JobState.ERROR,
}
#: Terminal states whose exit code / accounting record is worth one ``sacct``.
NEEDS_ACCOUNTING = frozenset(s for s, js in STATE_MAP.items() if js is JobState.ERROR)

_WHY = {
    "TIMEOUT": "the wall time ran out",
    "NODE_FAIL": "a node of the allocation failed",
    "BOOT_FAIL": "a node failed to boot",
    "PREEMPTED": "preempted by a higher-priority job",
    "OUT_OF_MEMORY": "the job ran out of memory",
    "DEADLINE": "the job's deadline passed",
}

# ----------------------------------------------------------------------------- input rules

SAFE_PATH = re.compile(r"^/[A-Za-z0-9_./@+=,-]*$")
SAFE_WORD = re.compile(r"^[A-Za-z0-9_.,:@+=%\[\]-]+$")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
NAME_RULE = "letters, digits, '_', '.' and '-', at most 128 characters, starting with a letter or digit"
RUNTIMES = ("pyxis", "oci", "none")
#: Exit code of ``timeout`` when the inner wall-time guard (``timeout_hours``) fires.
INNER_TIMEOUT_EXIT = 124
INNER_TIMEOUT_MARK = "TAO_INNER_TIMEOUT"
#: First line of every run of a job in main.out and main.err.
RUN_MARK = "TAO: run"
LOG_CHUNK_BYTES = 1 << 20
#: An unterminated line is shown once this much of it piled up (progress bars that only use ``\r``).
PARTIAL_LINE_FLUSH_BYTES = 64 * 1024
#: Log bytes one poll's status command reads of all its jobs together: each log file gets its share, between
#: ``PARTIAL_LINE_FLUSH_BYTES`` (a share below would hold a long unfinished line back for ever) and
#: ``LOG_CHUNK_BYTES``; a job that printed more is read on at the next polls.
POLL_LOG_BYTES = 8 << 20
#: Offsets of main.out and main.err travel as one opaque integer: out + err * 2**40.
OFFSET_SHIFT = 40


def pack_offset(out: int, err: int) -> int:
    return out + (err << OFFSET_SHIFT)


def unpack_offset(offset: int) -> tuple[int, int]:
    return offset & ((1 << OFFSET_SHIFT) - 1), offset >> OFFSET_SHIFT


def cluster_path(uri: str) -> str | None:
    """``lustre:///abs``, ``slurm:///abs`` or ``/abs`` -> ``/abs``; anything else -> None."""
    for scheme in ("lustre://", "slurm://"):
        if uri.startswith(scheme):
            rest = uri[len(scheme) :]
            return rest if rest.startswith("/") else None
    return uri if uri.startswith("/") else None


def parse_slurm_minutes(text: str) -> float | None:
    """Slurm time limits (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``) -> minutes; None = no limit."""
    text = text.strip()
    if text.lower() in ("unlimited", "infinite", "none", "n/a", ""):
        return None
    days = 0
    if "-" in text:
        day_text, text = text.split("-", 1)
        days = int(day_text)
        parts = [int(p) for p in text.split(":")]
        hours, minutes, seconds = [*parts, 0, 0][:3]
    else:
        parts = [int(p) for p in text.split(":")]
        if len(parts) == 1:
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, minutes, seconds = 0, parts[0], parts[1]
        else:
            hours, minutes, seconds = parts[:3]
    return days * 1440 + hours * 60 + minutes + seconds / 60


def format_slurm_time(minutes: float) -> str:
    """Minutes -> ``D-HH:MM:SS`` (rounded up to the second)."""
    seconds = max(1, math.ceil(minutes * 60))
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    mins, secs = divmod(seconds, 60)
    return f"{days}-{hours:02d}:{mins:02d}:{secs:02d}" if days else f"{hours:02d}:{mins:02d}:{secs:02d}"


def pyxis_image(image: str) -> str:
    """An image reference in the form Pyxis/enroot expect (``registry#path:tag``, a .sqsh path, or a Hub name)."""
    image = image.removeprefix("docker://")
    if image.startswith("/") or "#" in image:
        return image
    first, sep, rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return image


def sqsh_cache_name(image: str) -> str:
    """File name of an image's cached SquashFS (the seeds' convention: ``/`` ``:`` ``#`` become ``_``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", pyxis_image(image)) + ".sqsh"


# ----------------------------------------------------------------------------- layout and plan


@dataclass(frozen=True)
class JobLayout:
    """Where one job's files live on the cluster."""

    results_root: str
    job_id: str
    name: str

    @property
    def jobs_root(self) -> str:
        return f"{self.results_root}/jobs"

    @property
    def job_dir(self) -> str:
        return f"{self.jobs_root}/{self.job_id}"

    @property
    def env_file(self) -> str:
        return f"{self.job_dir}/env/{self.job_id}.env"

    @property
    def files_dir(self) -> str:
        return f"{self.job_dir}/files"

    @property
    def marks_dir(self) -> str:
        return f"{self.job_dir}/marks"

    @property
    def sbatch_file(self) -> str:
        return f"{self.job_dir}/sbatch/job_{self.job_id}.sbatch"

    @property
    def launch_file(self) -> str:
        return f"{self.job_dir}/launch.sh"

    @property
    def log_dir(self) -> str:
        return f"{self.job_dir}/slurm-logs/{self.name}-{self.job_id}"

    @property
    def out_file(self) -> str:
        return f"{self.log_dir}/main.out"

    @property
    def err_file(self) -> str:
        return f"{self.log_dir}/main.err"

    @property
    def default_results_parent(self) -> str:
        return f"{self.results_root}/results"

    @property
    def names_index(self) -> str:
        return f"{self.jobs_root}/_names/{self.name}"


@dataclass(frozen=True)
class SbatchPlan:
    """Every scheduling decision of one job (validated; rendered by :func:`render_sbatch`)."""

    nodes: int
    gpus_per_node: int
    cpus_per_task: int
    time_minutes: float
    timeout_minutes: float | None
    runtime: str
    partition: str | None = None
    account: str | None = None
    exclusive: bool = False
    container: str | None = None  # OCI bundle dir, or the pyxis image (registry#path / .sqsh)
    container_mounts: tuple[str, ...] = ()
    container_env: tuple[str, ...] = ()
    sqsh_cache: str | None = None  # pyxis: cache file of the converted image (None = no conversion)
    enroot_uri: str | None = None
    force_reconvert: bool = False
    master_port: int = 29500
    directives: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # extra (--option, value) pairs


# ----------------------------------------------------------------------------- rendering


def render_command(command: str | list[str]) -> dict[str, str]:
    """The staged command files: ``command/command.txt`` for a string, ``command/argv.sh`` (``set -- 'a' 'b'``)
    for a list."""
    if isinstance(command, str):
        return {"command/command.txt": command}
    return {"command/argv.sh": "set -- " + " ".join(shlex.quote(str(arg)) for arg in command) + "\n"}


def render_launcher(layout: JobLayout, multi_node: bool) -> str:
    """Per-task launcher (POSIX sh, runs inside the container): rank variables, then the command.

    A string command becomes the single argument of one ``/bin/bash -c`` (read from its file, trailing newlines
    kept); a list runs as is. Normally ``exec`` replaces this shell, so nothing stands between Slurm and the
    command's exit status. As PID 1 of a container (Slurm's OCI runtime) the command would ignore SIGTERM --
    cancel and time limits could not stop it -- so there the launcher stays, forwards the signals and exits with
    the command's own status.
    """
    job_dir = shlex.quote(layout.job_dir)
    lines = [
        "#!/bin/sh",
        "# generated by airflow-provider-tao: runs once per node (srun --ntasks-per-node=1)",
        f"d={job_dir}",
    ]
    if multi_node:
        lines.append('NODE_RANK="${SLURM_NODEID:-0}"; export NODE_RANK')
    lines += [
        'cd "$d/work" || exit 70',
        'if [ -f "$d/command/argv.sh" ]; then . "$d/command/argv.sh"; else',
        '  cmd=$(cat "$d/command/command.txt"; printf .) || exit 70',
        '  set -- /bin/bash -c "${cmd%.}"',
        "fi",
        'if [ "$$" = 1 ]; then',
        '  "$@" &',
        "  child=$!",
        "  trap 'kill -TERM \"$child\" 2>/dev/null' TERM INT HUP",
        '  while :; do wait "$child"; rc=$?; kill -0 "$child" 2>/dev/null || break; done',
        '  exit "$rc"',
        "fi",
        'exec "$@"',
    ]
    return "\n".join(lines) + "\n"


def render_sbatch(layout: JobLayout, plan: SbatchPlan, name: str) -> str:
    """The batch script: directives, the env file sourced at run time, one srun step whose status is the job's."""
    d: list[tuple[str, str | None]] = [
        ("--job-name", name),
        ("--partition", plan.partition),
        ("--account", plan.account),
        ("--nodes", str(plan.nodes)),
        ("--ntasks-per-node", "1"),
        ("--cpus-per-task", str(plan.cpus_per_task)),
        ("--gres", f"gpu:{plan.gpus_per_node}" if plan.gpus_per_node > 0 else None),
        ("--exclusive", "" if plan.exclusive else None),
        ("--time", format_slurm_time(plan.time_minutes)),
        ("--requeue", ""),
        ("--open-mode", "append"),
        ("--output", layout.out_file),
        ("--error", layout.err_file),
        ("--comment", f"tao:{layout.job_id}"),
        ("--wait-all-nodes", "1" if plan.nodes > 1 else None),
        *plan.directives,
    ]
    lines = ["#!/bin/bash"]
    for option, value in d:
        if value is None:
            continue
        if value and not SAFE_WORD.match(value) and not SAFE_PATH.match(value):
            raise ValueError(f"unsafe sbatch value for {option}: {value!r}")
        lines.append(f"#SBATCH {option}={value}" if value else f"#SBATCH {option}")
    q = shlex.quote
    lines += [
        "# generated by airflow-provider-tao. No secrets here: the environment is sourced from a 0600 file.",
        "set +x",
        f". {q(layout.env_file)} || {{ echo 'TAO: cannot read the job environment file' >&2; exit 70; }}",
        # one marker per run in both logs (--open-mode=append keeps every run): failure analysis reads the last run
        f'm="{RUN_MARK} ${{SLURM_RESTART_COUNT:-0}} of job $TAO_JOB_ID (slurm $SLURM_JOB_ID) on $SLURM_JOB_NODELIST"',
        'echo "$m"; echo "$m" >&2',
    ]
    if plan.nodes > 1:
        lines += [
            'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1); export MASTER_ADDR',
            f"MASTER_PORT=${{MASTER_PORT:-{plan.master_port}}}; export MASTER_PORT",
        ]
    srun = ["srun", f"--nodes={plan.nodes}", f"--ntasks={plan.nodes}", "--ntasks-per-node=1"]
    srun += [f"--cpus-per-task={plan.cpus_per_task}", "--kill-on-bad-exit=1"]
    if plan.runtime == "oci" and plan.container:
        srun.append(f"--container={q(plan.container)}")
    elif plan.runtime == "pyxis" and plan.container:
        image = '"$TAO_IMAGE"' if plan.sqsh_cache else q(plan.container)
        srun.append(f"--container-image={image}")
        if plan.container_mounts:
            srun.append(f"--container-mounts={q(','.join(plan.container_mounts))}")
        if plan.container_env:
            srun.append(f"--container-env={q(','.join(plan.container_env))}")
        if plan.sqsh_cache:
            lines += _sqsh_lines(plan)
    srun += ["/bin/sh", q(layout.launch_file)]
    if plan.timeout_minutes:
        srun = ["timeout", "--signal=TERM", "--kill-after=120", f"{max(1, int(plan.timeout_minutes))}m", *srun]
    lines += [
        " ".join(srun),
        "rc=$?",
        f'if [ "$rc" -eq {INNER_TIMEOUT_EXIT} ]; then echo "{INNER_TIMEOUT_MARK}: the command ran past '
        f'timeout_hours and was stopped" >&2; fi',
        'exit "$rc"',
    ]
    return "\n".join(lines) + "\n"


def _sqsh_lines(plan: SbatchPlan) -> list[str]:
    """Pyxis: convert the image once per name into a cached .sqsh (atomic rename, one converter at a time per
    image), reconverting only when asked (``force_reconvert_latest`` for ``:latest``); fall back to the registry
    image when there is no valid SquashFS."""
    q = shlex.quote
    assert plan.sqsh_cache and plan.container and plan.enroot_uri
    force = "1" if plan.force_reconvert else "0"
    return [
        f"TAO_SQSH={q(plan.sqsh_cache)}; TAO_IMAGE={q(plan.container)}",
        'mkdir -p "$(dirname "$TAO_SQSH")"',
        f'if [ ! -s "$TAO_SQSH" ] || [ {force} = 1 ]; then',
        "  (",
        "    flock 9",
        f'    if [ ! -s "$TAO_SQSH" ] || [ {force} = 1 ]; then',
        '      p="$TAO_SQSH.partial.$SLURM_JOB_ID"; rm -f "$p"',
        '      ENROOT_TEMP_PATH="$(dirname "$TAO_SQSH")/.enroot-tmp-$SLURM_JOB_ID" \\',
        f'        enroot import -o "$p" {q(plan.enroot_uri)} >&2 \\',
        '        && [ "$(head -c 4 "$p")" = hsqs ] && mv -f "$p" "$TAO_SQSH" || rm -f "$p"',
        "    fi",
        '  ) 9>"$TAO_SQSH.lock"',
        "fi",
        'if [ -s "$TAO_SQSH" ] && [ "$(head -c 4 "$TAO_SQSH")" = hsqs ]; then TAO_IMAGE="$TAO_SQSH"; '
        'else echo "TAO: no cached SquashFS image, using the registry image" >&2; fi',
    ]


def stage_archive(files: Mapping[str, str | bytes]) -> bytes:
    """A tar of the job folder's files (modes 0600/0700; the remote ``umask 077`` enforces it again)."""
    buffer = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        dirs: set[str] = set()
        for name in sorted(files):
            parts = name.split("/")
            if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise ValueError(f"{name!r} is not a relative path inside the job folder")
            for i in range(1, len(parts)):
                folder = "/".join(parts[:i])
                if folder not in dirs:
                    dirs.add(folder)
                    info = tarfile.TarInfo(folder)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o700, now
                    tar.addfile(info)
            data = files[name]
            payload = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(payload), 0o600, now
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def submit_script(layout: JobLayout, results_dir: str | None, try_number: int) -> str:
    """One remote shell run: unpack the staged files (stdin), create the log and results folders, index the name,
    submit, record the Slurm id. Prints ``@@SUBMITTED <id>``."""
    q = shlex.quote
    lines = [
        "set -eu",
        "umask 077",
        f"J={q(layout.job_dir)}",
        f"mkdir -p {q(layout.jobs_root)}/_names",
        'mkdir "$J"',
        'tar -x -f - -C "$J"',
        f'mkdir -p "$J/marks" "$J/meta" "$J/work" {q(layout.log_dir)}',
        f'printf %s {try_number} > "$J/marks/.owner_try.$$" && mv -f "$J/marks/.owner_try.$$" "$J/marks/owner_try"',
    ]
    if results_dir:
        lines.append(f"(umask 027; mkdir -p {q(results_dir)})")
    lines += [
        f"printf %s {q(layout.job_id)} > {q(layout.names_index)}.$$ && mv -f {q(layout.names_index)}.$$ "
        f"{q(layout.names_index)}",
        f"out=$(sbatch --parsable --export=ALL {q(layout.sbatch_file)})",
        "id=${out%%;*}",
        'printf "%s\\n" "$id" > "$J/meta/slurm_job_id.$$" && mv -f "$J/meta/slurm_job_id.$$" "$J/meta/slurm_job_id"',
        'echo "@@SUBMITTED $id"',
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- status


SQUEUE_MARK = b"@@SQ "


def squeue_command(ids: list[str]) -> str:
    """All given jobs, finished ones too (``-t all``; plain ``squeue -j`` prints nothing for finished jobs), with
    their submit time in epoch seconds (``SLURM_TIME_FORMAT=%s``: the cluster's local time needs no time zone)."""
    return f"SLURM_TIME_FORMAT=%s squeue -h -t all -j {','.join(ids)} -o '%i|%T|%r|%N|%V'"


def sacct_command(ids: list[str]) -> str:
    return f"sacct -X -n -P -j {','.join(ids)} -o JobID,State,ExitCode,Reason,NodeList"


@dataclass(frozen=True)
class SlurmRecord:
    job_id: str
    state: str  # first word, upper case: "CANCELLED"
    raw: str  # as printed: "CANCELLED by 1001"
    reason: str = ""
    nodes: str = ""
    exit_code: str = ""  # sacct "N:S"
    submitted: float | None = None  # squeue %V, epoch seconds


def parse_squeue(text: str) -> dict[str, SlurmRecord]:
    records = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 3 and parts[0]:
            state = parts[1].split()[0].rstrip("+").upper() if parts[1].strip() else ""
            nodes = parts[3] if len(parts) > 3 else ""
            submitted = _epoch(parts[4]) if len(parts) > 4 else None
            records[parts[0]] = SlurmRecord(parts[0], state, parts[1], parts[2], nodes, submitted=submitted)
    return records


def _epoch(text: str) -> float | None:
    """A time field printed with ``SLURM_TIME_FORMAT=%s``; None for ``Unknown`` / ``None`` / empty."""
    try:
        return float(text)
    except ValueError:
        return None


#: Pending reasons that mean "no resources for the job now" (the shared capacity-wait notion): the cluster is
#: full or the job waits behind others, the nodes it needs are down or reserved, its partition is down, or an
#: association / QOS limit on resources (GPUs, CPUs, nodes, memory, jobs) holds it. Not capacity: dependencies,
#: begin times, holds, and limits no capacity would lift (wall time above a partition's or QOS's maximum).
CAPACITY_REASONS = frozenset({"Resources", "Priority", "PartitionDown", "PartitionInactive", "ReqNodeNotAvail"})
_CAPACITY_REASON = re.compile(
    r"^(?:ReqNodeNotAvail|Nodes_required_for_job_are_DOWN|(?:QOS|Assoc)(?:Grp|Max)(?!\w*(?:Wall|Time))\w+)"
)


def waits_for_resources(reason: str) -> bool:
    """Whether a pending job's reason (squeue ``%r``) says it waits for resources rather than for anything else."""
    return reason in CAPACITY_REASONS or bool(_CAPACITY_REASON.match(reason))


def parse_sacct(text: str) -> dict[str, SlurmRecord]:
    records = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) >= 3 and parts[0] and "." not in parts[0]:
            raw = parts[1].strip()
            state = raw.split()[0].rstrip("+").upper() if raw else ""
            records[parts[0]] = SlurmRecord(
                parts[0],
                state,
                raw,
                parts[3] if len(parts) > 3 else "",
                parts[4] if len(parts) > 4 else "",
                parts[2],
            )
    return records


def squeue_says_gone(rc: int, stderr: str) -> bool:
    """``squeue -j`` exits 1 with "Invalid job id" when NONE of the ids is known any more: not an error."""
    return rc != 0 and "invalid job id" in stderr.lower()


def exit_code_of(exit_field: str) -> int | None:
    """sacct ``N:S`` -> N, or -S when a signal ended the job; None when unknown."""
    code, _, sig = exit_field.partition(":")
    try:
        number, signal_number = int(code), int(sig or 0)
    except ValueError:
        return None
    return -signal_number if signal_number and not number else number


def status_of(queue: SlurmRecord | None, acct: SlurmRecord | None) -> JobStatus:
    """One job's status from its squeue line (authoritative while present) and its sacct line."""
    record = queue or acct
    if record is None:
        return JobStatus.missing("Slurm knows no such job")
    state = STATE_MAP.get(record.state)
    exit_code = exit_code_of(acct.exit_code) if acct is not None and acct.state == record.state else None
    raw = acct.raw if acct is not None and acct.state == record.state else record.raw
    if state is None:
        return JobStatus(JobState.UNKNOWN, f"unexpected Slurm state {record.raw!r}", raw_state=record.raw)
    capacity_wait_since = None
    if state is JobState.PENDING:
        message = f"{record.state} ({record.reason})" if record.reason and record.reason != "None" else record.state
        if waits_for_resources(record.reason):
            capacity_wait_since = record.submitted
    elif state in (JobState.RUNNING, JobState.PAUSED):
        message = f"{record.state} on {record.nodes}" if record.nodes else record.state
    elif state is JobState.COMPLETE:
        message, exit_code = "COMPLETED, exit code 0", 0
    elif state is JobState.CANCELED:
        message = raw
    else:
        why = _WHY.get(record.state) or (
            f"exit code {exit_code}"
            if exit_code is not None and exit_code >= 0
            else f"killed by signal {-exit_code}"
            if exit_code is not None
            else record.reason or ""
        )
        message = f"{record.state} ({why})" if why else record.state
    return JobStatus(state, message, exit_code=exit_code, raw_state=raw, capacity_wait_since=capacity_wait_since)


# ----------------------------------------------------------------------------- usage (GPU-hours)


def usage_command(slurm_id: str) -> str:
    """The accounting record of one job's allocation: its times in epoch seconds, its elapsed seconds and nodes,
    and the resources it was given (``AllocTRES``: ``gres/gpu=N`` and, where the cluster tracks types,
    ``gres/gpu:<type>=N``)."""
    return f"SLURM_TIME_FORMAT=%s sacct -X -n -P -j {slurm_id} -o JobID,Submit,Start,End,ElapsedRaw,NNodes,AllocTRES"


def parse_usage(text: str, slurm_id: str) -> JobUsage | None:
    """:func:`usage_command`'s answer as a :class:`JobUsage`; None when sacct has no record of the job (yet)."""
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 7 or parts[0] != slurm_id:
            continue
        submitted, started, ended = (_epoch(parts[i]) for i in (1, 2, 3))
        nodes = int(parts[5]) if parts[5].isdigit() else None
        tres = dict(item.split("=", 1) for item in parts[6].split(",") if "=" in item)
        gpus = int(tres.get("gres/gpu", "0") or 0)
        typed = sorted(key.partition(":")[2] for key in tres if key.startswith("gres/gpu:"))
        return JobUsage(
            queued_at=submitted,
            started_at=started,
            ended_at=ended,
            run_seconds=float(parts[4]) if started is not None and parts[4].isdigit() else None,
            gpus_per_node=gpus // nodes if nodes else None,
            nodes=nodes,
            gpu_type=",".join(typed) or None,
            source="sacct Submit/Start/End/ElapsedRaw/AllocTRES",
        )
    return None


# ----------------------------------------------------------------------------- logs

_READER_PY = (
    "import os,sys\n"
    "M=int(sys.argv[1]);o=sys.stdout.buffer\n"
    "for l in sys.stdin:\n"
    " t,a,p=l.rstrip('\\n').split('|',2);a=int(a)\n"
    " try:\n"
    "  f=open(p,'rb')\n"
    " except OSError:\n"
    "  o.write(b'@@F %s -1 0 0\\n'%t.encode());continue\n"
    " with f:\n"
    "  s=os.fstat(f.fileno()).st_size;a=0 if s<a else a;f.seek(a);d=f.read(min(M,s-a))\n"
    " o.write(b'@@F %s %d %d %d\\n'%(t.encode(),s,a,len(d)));o.write(d)\n"
)
_READER_SH = (
    "while IFS='|' read -r t a p; do "
    'if [ -f "$p" ]; then s=$(wc -c < "$p"); s=$((s+0)); [ "$s" -lt "$a" ] && a=0; n=$((s-a)); '
    '[ "$n" -gt "$M" ] && n=$M; printf "@@F %s %s %s %s\\n" "$t" "$s" "$a" "$n"; '
    '[ "$n" -gt 0 ] && tail -c +$((a+1)) "$p" | head -c "$n"; '
    'else printf "@@F %s -1 0 0\\n" "$t"; fi; done'
)


def log_reader_command(max_bytes: int = LOG_CHUNK_BYTES) -> str:
    """Reads ``tag|offset|path`` lines on stdin, prints ``@@F tag size offset n`` + n bytes for each (one python3
    process when the login node has one, else a POSIX sh loop)."""
    return (
        f'M={max_bytes}; if command -v python3 >/dev/null 2>&1; then python3 -c {shlex.quote(_READER_PY)} "$M"; '
        f"else {_READER_SH}; fi"
    )


def poll_log_bound(jobs: int) -> int:
    """Bytes per log file a poll's command reads of each of ``jobs`` jobs (see ``POLL_LOG_BYTES``)."""
    return max(PARTIAL_LINE_FLUSH_BYTES, min(LOG_CHUNK_BYTES, POLL_LOG_BYTES // max(1, 2 * jobs)))


def log_requests(layout: JobLayout, offset: int, tag: str) -> list[str]:
    out, err = unpack_offset(offset)
    return [f"{tag}.o|{out}|{layout.out_file}", f"{tag}.e|{err}|{layout.err_file}"]


def parse_log_chunks(data: bytes) -> dict[str, tuple[int, bytes, int]]:
    """``tag -> (start offset, bytes, file size)`` from the reader's output."""
    chunks: dict[str, tuple[int, bytes, int]] = {}
    pos = 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        if end < 0 or not data.startswith(b"@@F ", pos):
            break
        tag, size, start, length = data[pos + 4 : end].decode().split(" ")
        body = data[end + 1 : end + 1 + int(length)]
        if int(size) >= 0:
            chunks[tag] = (int(start), body, int(size))
        pos = end + 1 + int(length)
    return chunks


def complete_lines(chunk: bytes, final: bool) -> bytes:
    """The part of ``chunk`` up to its last newline (everything when final or when a huge line piled up)."""
    if final or len(chunk) >= PARTIAL_LINE_FLUSH_BYTES:
        return chunk
    cut = chunk.rfind(b"\n")
    return chunk[: cut + 1] if cut >= 0 else b""


def chunks_at_end(chunks: dict[str, tuple[int, bytes, int]], tag: str) -> bool:
    """Whether the reader's chunks of ``tag`` reach the end of both files (a read bound did not cut them)."""
    return all(start + len(body) >= size for start, body, size in (chunks.get(f"{tag}.{s}", (0, b"", 0)) for s in "oe"))


def merge_log_chunks(chunks: dict[str, tuple[int, bytes, int]], tag: str, offset: int, final: bool) -> tuple[str, int]:
    """Text of main.out then main.err from the reader's chunks, and the packed offset to continue from. ``final``
    (the job ended) shows an unfinished last line only where the chunks reach the files' end."""
    final = final and chunks_at_end(chunks, tag)
    out_off, err_off = unpack_offset(offset)
    texts = []
    offsets = []
    for suffix, current in (("o", out_off), ("e", err_off)):
        start, body, _ = chunks.get(f"{tag}.{suffix}", (current, b"", 0))
        body = complete_lines(body, final)
        text = body.decode(errors="replace")
        texts.append(text + "\n" if final and text and not text.endswith("\n") and suffix == "o" else text)
        offsets.append(start + len(body) if body else (current if start >= current else start))
    return "".join(texts), pack_offset(offsets[0], offsets[1])


# ----------------------------------------------------------------------------- other remote scripts


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
