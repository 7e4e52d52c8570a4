"""What the Brev platform runs ON an instance through ``brev exec``, and how it reads the answers.

``brev exec`` passes no exit code through (0 or 1 only), re-runs a command whose run failed, and appends the instance
name to stdout. So every script here prints its answer between two lines carrying a random nonce
(``TAO-BEGIN <nonce>`` ... ``TAO-END <nonce> <rc>``), always exits 0 (nothing for exec to re-run), and is
idempotent (a re-run after a dropped connection changes nothing): the launch takes a lock, creates the container only
when it does not exist and starts it only while it is ``created`` -- a second launch of a job never starts a second
container nor restarts an ended one.

On the instance, in the login user's home (0700 folders, 0600 files, never /tmp)::

    ~/.tao-brev/lease.json          the lease of an instance this provider created (see ``BrevHook.reap``);
                                    the startup script also leaves a copy in /var/tmp/tao-brev-lease.json, readable
                                    whoever it ran as
    ~/.tao-brev/jobs/<job_id>/      launch.sh; job.tar and ngc.key until used; exit (the container's exit code,
                                    written by a waiter); marks/<key> (the ownership marks)
    ~/.tao-stage-<job_id>.tar       the staged archive as ``brev copy`` leaves it, until unpacked

Scripts are POSIX ``sh`` and use only the docker CLI, ``nohup``, ``tar``, ``head``, ``cat``, ``mv``, ``mkdir``.
"""

from __future__ import annotations

import io
import json
import secrets
import shlex
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_tao.hooks.base import LOG_READ_LIMIT
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.hooks.shared.cli import CliResult

HOME_DIR = ".tao-brev"
LEASE_FILE = f"{HOME_DIR}/lease.json"
#: The user the NGC registry wants with an API key.
NGC_USER = "$oauthtoken"

#: The lease where every user of the instance reads it: Brev may run the startup script as a user other than the
#: one ``brev exec`` logs in as (root, with its own $HOME), and the reaper must read the lease of an instance whose
#: worker died before the first exec wrote the exec user's copy. Not secret (the owning task's ids).
MACHINE_LEASE = "/var/tmp/tao-brev-lease.json"
_MACHINE_LEASE_WRITE = f"umask 022; printf '%s' \"$L\" > {MACHINE_LEASE}.$$ && mv -f {MACHINE_LEASE}.$$ {MACHINE_LEASE}"
_LEASE_WRITE = (
    'mkdir -p "$HOME/.tao-brev/jobs" && chmod 700 "$HOME/.tao-brev" "$HOME/.tao-brev/jobs" && '
    '{ [ -z "$L" ] || [ -f "$HOME/.tao-brev/lease.json" ] || '
    '{ printf "%s" "$L" > "$HOME/.tao-brev/.lease.tmp" && '
    'mv "$HOME/.tao-brev/.lease.tmp" "$HOME/.tao-brev/lease.json"; }; }'
)
# Readiness (and the instance's folders and lease): $1 = the lease JSON or "".
_PREPARE = (
    f'L="$1"; umask 077; {_LEASE_WRITE} && '
    "v=$(docker version --format '{{.Server.Version}}' 2>&1) && printf 'DOCKER %s\\n' \"$v\" || "
    "printf 'NODOCKER %s\\n' \"$v\""
)
# Unpack the staged archive into the job's folder and run its launch script: $1 = job id.
_LAUNCH = (
    'umask 077; D="$HOME/.tao-brev/jobs/$1"; S="$HOME/.tao-stage-$1.tar"; '
    # stages whose launch never came (a worker killed between copy and launch) hold secrets: gone after a day
    'find "$HOME" -maxdepth 1 -name ".tao-stage-*.tar" -mmin +1440 -exec rm -f {} + 2>/dev/null; '
    'mkdir -p "$D" && { [ ! -f "$S" ] || { tar -xf "$S" -C "$D" && rm -f "$S"; }; } && '
    '{ [ -f "$D/launch.sh" ] || { printf "FAIL setup\\nnothing was staged for job %s\\n" "$1"; exit 0; }; } && '
    'sh "$D/launch.sh"'
)
_STATE = "'S {{.Name}} {{.Created}} {{json .State}}'"
# The exec user's lease, else the machine's (the startup script may have run as another user, e.g. root).
_LEASE_READ = (
    f"printf 'LEASE '; cat \"$HOME/.tao-brev/lease.json\" 2>/dev/null || cat {MACHINE_LEASE} 2>/dev/null || "
    "printf -- '-'; printf '\\n'"
)
_LOG_CUT = LOG_READ_LIMIT + 1  # one byte more than a read returns: tells a cut log from one that ended
# The logs of job $j since $s ("all" = from the start) into the probe's answer, as ``L <job> <bytes>`` + the bytes.
_LOGS_OF = (
    'c="tao-job-$j"; if docker container inspect "$c" >/dev/null 2>&1; then '
    'if [ "$s" = all ]; then docker logs --timestamps $t "$c" 2>&1; '
    'else docker logs --timestamps $t --since "$s" "$c" 2>&1; fi | '
    f'head -c {_LOG_CUT} > "$d/.log"; else : > "$d/.log"; fi; '
    'printf \'L %s %s\\n\' "$j" "$(wc -c < "$d/.log")"; cat "$d/.log"; printf \'\\n\'; rm -f "$d/.log"'
)
# The marks of job $j, as ``M <job> <key> <value>`` lines.
_MARKS_OF = (
    'for m in "$HOME/.tao-brev/jobs/$j"/marks/*; do [ ! -f "$m" ] || '
    'printf \'M %s %s %s\\n\' "$j" "${m##*/}" "$(head -c 200 "$m" | tr -d \'\\n\')"; done'
)
# Everything about some jobs of one instance in one call: $@ = "<job_id>=<log since|all|->" each.
_PROBE = (
    f'D="$HOME/.tao-brev/jobs"; t=""; {_LEASE_READ}; '
    'ids=""; for a in "$@"; do ids="$ids tao-job-${a%%=*}"; done; '
    f'[ -z "$ids" ] || docker inspect -f {_STATE} $ids 2>/dev/null; '
    'for a in "$@"; do j="${a%%=*}"; s="${a#*=}"; d="$D/$j"; [ -d "$d" ] || continue; '
    "printf 'K %s\\n' \"$j\"; "
    '[ ! -f "$d/exit" ] || printf \'X %s %s\\n\' "$j" "$(head -c 20 "$d/exit" | tr -d \'\\n\')"; '
    f"{_MARKS_OF}; "
    f'[ "$s" = - ] || {{ {_LOGS_OF}; }}; done'
)
# One job's log: $1 = job id, $2 = since|all, $3 = tail ("" = all lines).
_LOGS = (
    'umask 077; d="$HOME/.tao-brev/jobs/$1"; mkdir -p "$d" && j="$1" && s="$2" && t="${3:+--tail $3}" && '
    f"{{ {_LOGS_OF}; }}"
)
# Stop a job's container (SIGTERM, then SIGKILL after $2 s) and report its state and marks: $1 = job id.
# Ownership is checked again right before the act, in the same shell: when a newer try claimed the job after this
# cancel was decided (its cancel mark names another try than the owner mark), the container is left running.
_STOP = (
    'm="$HOME/.tao-brev/jobs/$1/marks"; o=$(head -c 20 "$m/owner_try" 2>/dev/null); '
    'c=$(head -c 20 "$m/cancel_requested_by" 2>/dev/null); '
    'if [ -n "$o" ] && [ -n "$c" ] && [ "$o" != "$c" ]; then printf \'KEPT %s %s\\n\' "$1" "$o"; '
    'else docker stop -t "$2" "tao-job-$1" >/dev/null 2>&1; fi; '
    f'docker inspect -f {_STATE} "tao-job-$1" 2>/dev/null; {_LEASE_READ}; j="$1"; {_MARKS_OF}'
)
# Keep one mark with the job: $1 = job id, $2 = key, $3 = JSON value.
_MARK = (
    'umask 077; d="$HOME/.tao-brev/jobs/$1"; [ -d "$d" ] || { echo NOJOB; exit 0; }; '
    'mkdir -p "$d/marks" && printf "%s" "$3" > "$d/marks/.$2.tmp" && mv "$d/marks/.$2.tmp" "$d/marks/$2" && echo OK'
)
# One ``F <job id> <state> <created> <try> <job name> <results dir>`` line per container of $ids.
_CONTAINERS = (
    '[ -z "$ids" ] || docker inspect -f \'F {{index .Config.Labels "tao.nvidia.com/job-id"}} {{.State.Status}} '
    '{{.Created}} {{index .Config.Labels "tao.nvidia.com/try"}} {{index .Config.Labels "tao.nvidia.com/job-name"}} '
    '{{index .Config.Labels "tao.nvidia.com/results-dir"}}\' $ids'
)
# This provider's containers of a job name, and its launches still going on: $1 = the name.
_FIND = (
    'ids=$(docker ps -aq --filter "label=tao.nvidia.com/managed=true" --filter "label=tao.nvidia.com/job-name=$1"); '
    f"{_CONTAINERS}; "
    'for d in "$HOME"/.tao-brev/jobs/*; do [ -d "$d/.lock" ] && [ "$(cat "$d/name" 2>/dev/null)" = "$1" ] || continue; '
    'p=$(cat "$d/.lock/pid" 2>/dev/null); '
    '[ -z "$p" ] || ! kill -0 "$p" 2>/dev/null || printf "P %s\\n" "${d##*/}"; done'
)
# What runs on an instance: its lease and this provider's containers that have not ended.
_ACTIVE = f'{_LEASE_READ}; ids=$(docker ps -q --filter "label=tao.nvidia.com/managed=true"); {_CONTAINERS}'
# Remove a container that was created but never started, and its job folder: $1 = job id.
_REMOVE = 'docker rm -f "tao-job-$1" >/dev/null 2>&1; rm -rf "$HOME/.tao-brev/jobs/$1"; echo OK'


@dataclass(frozen=True)
class Script:
    """One remote call: the command line for ``brev exec`` and the nonce its answer is framed with.

    :param command: the one shell command (the LAST argument of ``brev exec``).
    :param nonce: the random word of the frame.
    """

    command: str
    nonce: str

    def answer(self, result: CliResult) -> bytes | None:
        """What the script printed, or None when its frame is missing or cut (the call failed or was cut off).
        After a re-run by the CLI the last complete frame counts."""
        data = result.stdout
        end = data.rfind(f"\nTAO-END {self.nonce} ".encode())
        begin = data.rfind(f"TAO-BEGIN {self.nonce}\n".encode(), 0, end if end >= 0 else None)
        if begin < 0 or end < 0:
            return None
        return data[begin + len(self.nonce) + 11 : end]


def script(body: str, *args: str) -> Script:
    """``sh -c '<body>' <nonce> <args>``: the body runs in a subshell between the frame lines and sees ``$1``...
    as its arguments; whatever it does, the command exits 0."""
    nonce = secrets.token_hex(8)
    wrapped = (
        'printf "TAO-BEGIN %s\\n" "$0"; ( ' + body + ' ); printf "\\nTAO-END %s %s\\n" "$0" "$?"; exit 0'
    )  # fmt: skip
    return Script(" ".join(shlex.quote(part) for part in ["sh", "-c", wrapped, nonce, *args]), nonce)


def prepare(lease: Mapping[str, Any] | None) -> Script:
    """Readiness: the instance answers, has its folders (0700) and, for an instance this provider made, its lease
    (never overwritten: a retry keeps the first creation time). Answers ``DOCKER <version>`` or ``NODOCKER <why>``."""
    return script(_PREPARE, lease_json(lease) if lease else "")


def startup_script(lease: Mapping[str, Any]) -> str:
    """The instance's startup script (``brev create --startup-script``): its lease, from its first boot on."""
    return f"L={shlex.quote(lease_json(lease))}; {_MACHINE_LEASE_WRITE}; umask 077; {_LEASE_WRITE}\n"


def lease_json(lease: Mapping[str, Any]) -> str:
    return json.dumps(dict(lease), sort_keys=True, separators=(",", ":"))


def launch(job_id: str) -> Script:
    return script(_LAUNCH, job_id)


def probe(jobs: Mapping[str, str]) -> Script:
    """Every job's container state, exit file, marks and (where a cursor is given) new log lines, plus the
    instance's lease, in one call. ``jobs``: job id -> log "since" (RFC 3339 timestamp, ``all``, or ``-`` = none)."""
    return script(_PROBE, *(f"{job}={since}" for job, since in jobs.items()))


def logs(job_id: str, since: str, tail: int | None) -> Script:
    return script(_LOGS, job_id, since, str(tail) if tail else "")


def stop(job_id: str, grace_seconds: int) -> Script:
    return script(_STOP, job_id, str(grace_seconds))


def write_mark(job_id: str, key: str, value: Any) -> Script:
    return script(_MARK, job_id, key, json.dumps(value))


def find(name: str) -> Script:
    return script(_FIND, name)


def active() -> Script:
    """The instance's lease and this provider's containers still running (or paused, restarting), in one call."""
    return script(_ACTIVE)


def remove(job_id: str) -> Script:
    return script(_REMOVE, job_id)


# ----------------------------------------------------------------------------- the launch


def launch_script(job_id: str, create_argv: Sequence[str], registry: str | None) -> str:
    """The job's ``launch.sh``: under a lock, log in to the registry (the key from the 0600 ``ngc.key``, on stdin),
    create the container unless it exists, copy the job's archive in (``docker cp -`` from the 0600 ``job.tar``, then
    delete it), start it only while it is ``created``, and leave a waiter that writes its exit code to ``exit``.
    Prints ``LAUNCHED <id> <state>``, or ``FAIL <step>`` and the step's own words."""
    container = ct.container_name(job_id)
    login = (
        f"out=$(docker login {shlex.quote(registry)} -u {shlex.quote(NGC_USER)} --password-stdin < ngc.key 2>&1); "
        'rc=$?; rm -f ngc.key; [ "$rc" -eq 0 ] || fail login "$out"; '
        if registry
        else ""
    )
    create = " ".join(shlex.quote(arg) for arg in create_argv)
    return f"""# generated by airflow-provider-tao: launches job {job_id} once, however often it runs
umask 077
C={container}; D="$HOME/.tao-brev/jobs/{job_id}"
fail() {{ printf 'FAIL %s\\n%s\\n' "$1" "$2"; exit 0; }}
cd "$D" || fail setup "no job folder $D"
i=0
until mkdir .lock 2>/dev/null; do
  p=$(cat .lock/pid 2>/dev/null)
  if [ -n "$p" ] && ! kill -0 "$p" 2>/dev/null; then rm -rf .lock; continue; fi
  i=$((i + 1)); [ "$i" -le 900 ] || fail lock "another launch of this job holds $D/.lock"
  sleep 1
done
echo $$ > .lock/pid
trap 'rm -rf "$D/.lock"' EXIT
if ! docker container inspect "$C" >/dev/null 2>&1; then
  if [ -f ngc.key ]; then {login}: ; fi
  out=$({create} 2>&1) || {{ docker container inspect "$C" >/dev/null 2>&1 || fail create "$out"; }}
fi
rm -f ngc.key
if [ -f job.tar ]; then
  out=$(docker cp - "$C:/" < job.tar 2>&1) || fail copy "$out"
  rm -f job.tar
fi
state=$(docker inspect -f '{{{{.State.Status}}}}' "$C" 2>&1) || fail inspect "$state"
if [ "$state" = created ]; then out=$(docker start "$C" 2>&1) || fail start "$out"; fi
w=$(cat waiter.pid 2>/dev/null)
if [ ! -f exit ] && {{ [ -z "$w" ] || ! kill -0 "$w" 2>/dev/null; }}; then
  nohup sh -c 'c=$(docker wait "$1") && printf "%s\\n" "$c" > "$2/exit.tmp" && mv "$2/exit.tmp" "$2/exit"' \\
    tao-wait "$C" "$D" </dev/null >/dev/null 2>&1 &
  echo $! > waiter.pid
fi
printf 'LAUNCHED %s\\n' "$(docker inspect -f '{{{{.Id}}}} {{{{.State.Status}}}}' "$C")"
"""


def stage_archive(
    job_archive: bytes, launch_sh: str, *, name: str, owner_try: int, ngc_key: str | None, mark_key: str = "owner_try"
) -> bytes:
    """The one file ``brev copy`` puts on the instance: the job's archive for ``docker cp``, its launch script, its
    name, the first ownership mark and the registry key -- all 0600, unpacked into the job's 0700 folder."""
    buffer = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        entries: list[tuple[str, bytes | None]] = [
            ("job.tar", job_archive),
            ("launch.sh", launch_sh.encode()),
            ("name", name.encode()),
            ("marks", None),
            (f"marks/{mark_key}", json.dumps(owner_try).encode()),
        ]
        if ngc_key:
            entries.append(("ngc.key", ngc_key.encode()))
        for entry, content in entries:
            info = tarfile.TarInfo(entry)
            info.mtime = now
            if content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o700
                tar.addfile(info)
            else:
                info.size, info.mode = len(content), 0o600
                tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


# ----------------------------------------------------------------------------- answers


@dataclass
class InstanceProbe:
    """What a probe found on one instance.

    :param lease: the instance's lease, if this provider made it.
    :param containers: job id -> (creation time, the container's ``State`` as ``docker inspect`` shows it).
    :param known: the jobs whose folder exists on the instance (launched by this provider).
    :param exits: job id -> the exit code its waiter wrote.
    :param marks: job id -> its marks.
    :param logs: job id -> the log bytes read (timestamped lines).
    :param kept: the jobs a stop left running: a newer try owns them now.
    """

    lease: dict[str, Any] | None = None
    containers: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)
    exits: dict[str, int] = field(default_factory=dict)
    marks: dict[str, dict[str, Any]] = field(default_factory=dict)
    logs: dict[str, bytes] = field(default_factory=dict)
    kept: set[str] = field(default_factory=set)


def parse_probe(data: bytes) -> InstanceProbe:
    """Read the answer of :func:`probe` (also of :func:`stop` and :func:`logs`, which print parts of it)."""
    found = InstanceProbe()
    pos = 0
    while pos < len(data):
        newline = data.find(b"\n", pos)
        line = data[pos : newline if newline >= 0 else len(data)].decode(errors="replace")
        pos = len(data) if newline < 0 else newline + 1
        kind, _, rest = line.partition(" ")
        if kind == "L":
            job, _, size = rest.partition(" ")
            count = int(size.strip() or 0)
            found.logs[job] = data[pos : pos + count]
            pos += count + 1  # the bytes, then the newline the script adds
        elif kind == "LEASE":
            found.lease = _json_object(rest)
        elif kind == "S":
            name, created, state = _split(rest, 3)
            parsed = _json_object(state)
            if parsed is not None and name.lstrip("/").startswith("tao-job-"):
                found.containers[name.lstrip("/").removeprefix("tao-job-")] = (ct.docker_time(created) or 0.0, parsed)
        elif kind == "K":
            found.known.add(rest.strip())
        elif kind == "KEPT":
            found.kept.add(rest.partition(" ")[0])
        elif kind == "X":
            job, _, code = rest.partition(" ")
            if code.strip().lstrip("-").isdigit():
                found.exits[job] = int(code.strip())
        elif kind == "M":
            job, key, value = _split(rest, 3)
            try:
                found.marks.setdefault(job, {})[key] = json.loads(value)
            except ValueError:
                continue  # a half-written or foreign file is not a mark
    return found


@dataclass(frozen=True)
class FoundContainer:
    """A container of a job name, as :func:`find` reports it."""

    job_id: str
    state: str
    created_at: float
    try_number: int
    name: str
    results_dir: str


def parse_find(data: bytes) -> tuple[list[FoundContainer], list[str]]:
    """The containers :func:`find` (or :func:`active`) reported, and the job ids whose launch is still going on."""
    found, launching = [], []
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("P "):
            launching.append(line[2:].strip())
        if not line.startswith("F "):
            continue
        job, state, created, try_number, name, results = _split(line[2:], 6)
        if job and job != "<no value>":
            try_text = try_number if try_number.isdigit() else "1"
            found.append(FoundContainer(job, state, ct.docker_time(created) or 0.0, int(try_text), name, results))
    return found, launching


def parse_active(data: bytes) -> tuple[dict[str, Any] | None, list[FoundContainer]]:
    """The instance's lease and this provider's running containers, as :func:`active` reported them."""
    return parse_probe(data).lease, parse_find(data)[0]


def parse_launch(data: bytes) -> tuple[str, str] | tuple[None, str]:
    """``(container id, state)`` of a launch, or ``(None, "<step>\\n<what the step said>")`` when it failed."""
    text = data.decode(errors="replace")
    for line in text.splitlines():
        if line.startswith("LAUNCHED "):
            container, _, state = line.removeprefix("LAUNCHED ").partition(" ")
            return container, state.strip()
    start = text.find("FAIL ")
    return None, text[start + 5 :].strip() if start >= 0 else text.strip()


def _split(text: str, parts: int) -> list[str]:
    pieces = text.split(" ", parts - 1)
    return pieces + [""] * (parts - len(pieces))


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
