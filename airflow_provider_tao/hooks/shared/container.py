"""What every container platform shares: the labels that find a job again, the job folder inside the container,
the launcher that hands the job its files and secrets without a command line or an environment the platform shows,
the container settings a job may ask for (``backend_details``), the verdict of a container's state, and the reading
of a container log by timestamp cursor.

Inside the container::

    /tao-job/files/       the spec's files (the in-job runner and its manifest): ``TAO_JOB_FILES``
    /tao-job/secret.env   the secrets as ``export K='v'`` lines, 0600; sourced and deleted by the launcher
    /tao-job/marks/<key>  the ownership marks (one small JSON value per file), kept with the job
    /tao-job/setup.sh     a platform's setup, sourced by the launcher after unpacking (Lepton: the multi-node
                          variables from its worker variables)
    /tao-job-parts/*      where the files arrive in pieces (Kubernetes: gzip'd tar chunks from ConfigMaps; Lepton:
                          ``$TAO_JOB_PARTS_DIR`` on a shared volume); the launcher unpacks them into /tao-job first
    $TAO_JOB_PART_<i>     the same gzip'd tar, base64 in ``$TAO_JOB_PARTS_ENV`` environment variables (Lepton:
                          each under Linux's 128 KiB limit of one string); unpacked, then unset
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import re
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from airflow_provider_tao.accounting import JobUsage
from airflow_provider_tao.hooks.base import LOG_READ_LIMIT, JobValidationError
from airflow_provider_tao.hooks.shared.env import render_env_file
from airflow_provider_tao.jobs import JobSpec, JobState, JobStatus

LABEL_DOMAIN = "tao.nvidia.com"
LABEL_MANAGED = f"{LABEL_DOMAIN}/managed"
LABEL_JOB_ID = f"{LABEL_DOMAIN}/job-id"
LABEL_NAME = f"{LABEL_DOMAIN}/job-name"
LABEL_TRY = f"{LABEL_DOMAIN}/try"
LABEL_RESULTS_DIR = f"{LABEL_DOMAIN}/results-dir"
#: ``JobSpec.origin`` keys, as labels (``dag_id`` -> ``tao.nvidia.com/dag-id``).
_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]+")
ORIGIN_LABELS = {key: f"{LABEL_DOMAIN}/{key.replace('_', '-')}" for key in ("dag_id", "task_id", "run_id", "map_index")}

JOB_ROOT = "/tao-job"
FILES_DIR = f"{JOB_ROOT}/files"
SECRETS_FILE = f"{JOB_ROOT}/secret.env"
MARKS_DIR = f"{JOB_ROOT}/marks"
PARTS_DIR = "/tao-job-parts"
SETUP_FILE = f"{JOB_ROOT}/setup.sh"
#: Environment variables of the files-in-environment channel: the number of parts, and each part's name prefix.
PARTS_ENV_COUNT = "TAO_JOB_PARTS_ENV"
PARTS_ENV_PREFIX = "TAO_JOB_PART_"
#: Environment variable naming another folder of parts (a shared volume) instead of :data:`PARTS_DIR`.
PARTS_DIR_ENV = "TAO_JOB_PARTS_DIR"
#: Exit code of a launcher that could not unpack the job's files (the image lacks tar, gzip or base64).
UNPACK_FAILED_EXIT = 70

_UNPACK = (
    f"gzip -dc | tar -xf - -C {JOB_ROOT} || "
    f'{{ echo "tao-launch: cannot unpack the job files (the image needs tar, gzip and base64)" >&2; '
    f"exit {UNPACK_FAILED_EXIT}; }}"
)
# Fixed text: the command arrives as "$@", the secrets from a file; nothing of either is in the container's spec.
# A string command runs under bash, or sh in an image without bash (alpine, busybox). Parts in the environment are
# unset once unpacked: the command's own children never inherit megabytes of environment.
_LAUNCHER = (
    f'if [ -n "${{{PARTS_ENV_COUNT}:-}}" ]; then mkdir -p {JOB_ROOT}; '
    f'i=0; while [ "$i" -lt "${PARTS_ENV_COUNT}" ]; do eval "printf %s \\"\\${PARTS_ENV_PREFIX}$i\\""; '
    f"i=$((i+1)); done | base64 -d | {_UNPACK}; "
    f'i=0; while [ "$i" -lt "${PARTS_ENV_COUNT}" ]; do unset "{PARTS_ENV_PREFIX}$i"; i=$((i+1)); done; '
    f"unset {PARTS_ENV_COUNT} i; "
    f'elif [ -d "${{{PARTS_DIR_ENV}:-{PARTS_DIR}}}" ]; then mkdir -p {JOB_ROOT}; '
    f'cat "${{{PARTS_DIR_ENV}:-{PARTS_DIR}}}"/part-* | {_UNPACK}; fi; '
    f"if [ -f {SETUP_FILE} ]; then . {SETUP_FILE}; fi; "
    f"if [ -f {SECRETS_FILE} ]; then set -a; . {SECRETS_FILE}; set +a; rm -f {SECRETS_FILE}; fi; "
    'if [ "$1" = --shell ]; then [ -x /bin/bash ] && exec /bin/bash -c "$2"; exec /bin/sh -c "$2"; fi; exec "$@"'
)


#: ``backend_details`` of the job's container, on every platform that runs one container per job.
CONTAINER_DETAIL_KEYS = frozenset(
    {"mem_limit", "cpus", "shm_size", "mounts", "user", "entrypoint", "gpu_ids", "working_dir"}
)
#: NGC images set NVIDIA_VISIBLE_DEVICES=all: on a host whose default runtime is nvidia, a job asked for no GPU
#: would otherwise get every one.
NO_GPU_ENV = {"NVIDIA_VISIBLE_DEVICES": "void"}
#: A container created but not started after this long was left behind by a worker that died mid-submission.
START_TIMEOUT_SECONDS = 60.0
#: Docker's words for a container that has not ended.
LIVE_STATES = {
    "created": JobState.PENDING,
    "running": JobState.RUNNING,
    "restarting": JobState.RUNNING,
    "paused": JobState.PAUSED,
}


def container_name(job_id: str) -> str:
    """The container of a job: ``tao-job-<job_id>``, the name the TAO SDK uses (``docker logs tao-job-...``)."""
    return f"tao-job-{job_id}"


def label_value(value: str) -> str:
    """``value`` as a valid Kubernetes-style label value (at most 63 of ``[A-Za-z0-9_.-]``, alphanumeric at both
    ends), for platforms whose labels follow that rule (Kubernetes, Lepton); the exact value is kept elsewhere."""
    return _LABEL_VALUE_BAD.sub("-", value)[:63].strip("-_.")


def job_labels(spec: JobSpec, try_number: int, results_dir: str) -> dict[str, str]:
    """The labels of a job's container: how :meth:`find_job` finds it and how the batched poll lists it."""
    labels = {
        LABEL_MANAGED: "true",
        LABEL_JOB_ID: spec.job_id,
        LABEL_NAME: spec.name,
        LABEL_TRY: str(try_number),
        LABEL_RESULTS_DIR: results_dir,
    }
    labels.update({ORIGIN_LABELS[key]: value for key, value in spec.origin.items() if key in ORIGIN_LABELS})
    return labels


def launcher_argv(command: str | list[str]) -> list[str]:
    """The container's command: a fixed ``/bin/sh`` launcher that sources (and deletes) the secrets file, then
    execs the job's command -- a string through exactly one ``bash -c`` (``sh -c`` without bash), a list as
    argv."""
    argv = ["--shell", command] if isinstance(command, str) else list(command)
    return ["/bin/sh", "-c", _LAUNCHER, "tao-launch", *argv]


# ----------------------------------------------------------------------------- the container a job asks for


def check_container_details(spec: JobSpec, details: Mapping[str, Any], allowed: frozenset[str], platform: str) -> None:
    """Reject container settings the platform does not know or cannot honour, before anything is submitted.

    :param details: the job's ``backend_details`` (without the operator's own keys).
    :param allowed: the keys the platform understands (:data:`CONTAINER_DETAIL_KEYS` and its own).
    """
    if unknown := sorted(set(details) - allowed):
        raise JobValidationError(
            f"backend_details[{unknown[0]!r}]",
            f"is not a {platform} platform setting",
            f"Use one of: {', '.join(sorted(allowed))}",
        )
    container_gpu_ids(spec)
    container_owner(details)
    container_mounts(details)
    if (cpus := details.get("cpus")) is not None and not _positive_number(cpus):
        raise JobValidationError("backend_details['cpus']", f"{cpus!r} is not a positive number", "Use e.g. 2.5")


def container_gpu_ids(spec: JobSpec) -> list[str] | None:
    """The explicit GPU device ids of ``backend_details['gpu_ids']`` (they must agree with ``gpu_count``)."""
    ids = spec.backend_details.get("gpu_ids")
    if ids is None:
        return None
    ids = [s.strip() for s in ids.split(",")] if isinstance(ids, str) else [str(s).strip() for s in ids]
    if not ids or not all(ids):
        raise JobValidationError("backend_details['gpu_ids']", f"{ids!r} names no GPU", "Use e.g. ['0', '2']")
    if spec.gpu_count not in (len(ids), -1):
        raise JobValidationError(
            "backend_details['gpu_ids']",
            f"names {len(ids)} GPU(s) but gpu_count={spec.gpu_count}",
            f"Set gpu_count={len(ids)} (or -1) with these device ids",
        )
    return ids


def container_owner(details: Mapping[str, Any]) -> tuple[int, int]:
    """Who owns the job's files in the container: the job's ``user`` must read its own secrets."""
    user = str(details.get("user") or "0")
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or (gid and not gid.isdigit()):
        raise JobValidationError(
            "backend_details['user']",
            f"{user!r} is not numeric",
            "Give the container user as uid[:gid] (e.g. '1000:1000'): its files are created before it starts",
        )
    return int(uid), int(gid or uid)


def container_mounts(details: Mapping[str, Any]) -> list[str]:
    """``backend_details['mounts']``: ``host:container[:ro|rw]`` strings (host = the container host's paths)."""
    mounts = details.get("mounts") or []
    if isinstance(mounts, str) or not all(isinstance(m, str) for m in mounts):
        raise JobValidationError("backend_details['mounts']", f"{mounts!r} is not a list", 'Use ["/data:/data:ro"]')
    for mount in mounts:
        parts = mount.split(":")
        if len(parts) not in (2, 3) or not parts[1].startswith("/") or parts[2:] not in ([], ["ro"], ["rw"]):
            raise JobValidationError(
                "backend_details['mounts']",
                f"{mount!r} is not host:container[:ro]",
                'Use e.g. "/data/coco:/data:ro" (the host path is on the container host)',
            )
    return list(mounts)


def _positive_number(value: Any) -> bool:
    try:
        return float(value) > 0
    except (TypeError, ValueError):
        return False


# ----------------------------------------------------------------------------- a container's state as a job status


def never_started(state: str, created_at: float | None) -> bool:
    """A container ``created`` more than :data:`START_TIMEOUT_SECONDS` ago: its submitting worker died."""
    return state == "created" and time.time() - float(created_at or 0) > START_TIMEOUT_SECONDS


def live_status(name: str, state: str, created_at: float, message: str) -> JobStatus:
    """The status of a container that has not ended (``state`` in :data:`LIVE_STATES`). One created but never
    started for :data:`START_TIMEOUT_SECONDS` belongs to a submission that died half-way: it will never run."""
    if never_started(state, created_at):
        return JobStatus(
            JobState.ERROR,
            f"container {name} was created but never started (the submitting worker died?)",
            raw_state="created",
        )
    return JobStatus(LIVE_STATES[state], message or state, raw_state=state)


def ended_status(name: str, state: Mapping[str, Any], cancel_marked: Callable[[], bool]) -> JobStatus:
    """The verdict of an ended container from its ``State`` (as ``docker inspect`` shows it): one that carries a
    cancel mark is Canceled, whatever code it chose to exit with; else exit code 0 is Complete and anything else
    (an OOM kill, a non-zero code, a dead container) is Error with the code.

    :param cancel_marked: whether the job carries a cancel mark that binds it (a cancel through this provider on
        behalf of its owning try: :func:`~airflow_provider_tao.hooks.ownership.cancel_binds`).
    """
    code = int(state.get("ExitCode") or 0)
    raw = "OOMKilled" if state.get("OOMKilled") else str(state.get("Status") or "exited")
    if state.get("Status") in ("dead", "removing"):
        return JobStatus(JobState.ERROR, f"container {name} is {state['Status']}: {state.get('Error')}", code, raw)
    # The mark decides, not the code: a trainer that checkpoints on SIGTERM and exits 0 was stopped, not done.
    if not state.get("OOMKilled") and cancel_marked():
        return JobStatus(JobState.CANCELED, f"container {name} was stopped by a cancel (code {code})", code, raw)
    if code == 0 and not state.get("OOMKilled"):
        return JobStatus(JobState.COMPLETE, f"container {name} exited with code 0", 0, raw)
    why = "killed by the out-of-memory killer" if state.get("OOMKilled") else f"exited with code {code}"
    error = f" ({state['Error']})" if state.get("Error") else ""
    return JobStatus(JobState.ERROR, f"container {name} {why}{error}", code, raw)


def docker_time(stamp: str) -> float | None:
    """Epoch seconds of a Docker timestamp (RFC 3339, nanoseconds, UTC or an offset); None for Docker's zero time
    (``0001-01-01T00:00:00Z``: it never happened) or one that cannot be read."""
    if not stamp or stamp.startswith("0001-"):
        return None
    text = stamp[:-1] + "+00:00" if stamp.endswith("Z") else stamp
    head, dot, rest = text.partition(".")
    if dot:  # Python reads at most microseconds: keep six digits of the fraction, then the offset
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[: min(digits, 6)]}{rest[digits:]}"
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def container_usage(created: float | None, state: Mapping[str, Any], gpus: int | None, source: str) -> JobUsage:
    """A container job's usage from its creation time and ``State`` (``StartedAt`` / ``FinishedAt``, as ``docker
    inspect`` shows them): one node, ``gpus`` GPUs when known.

    :param source: where the times were read, for the task log.
    """
    started = docker_time(str(state.get("StartedAt") or ""))
    finished = docker_time(str(state.get("FinishedAt") or ""))
    running = str(state.get("Status") or "") in ("running", "paused", "restarting")
    return JobUsage(
        queued_at=created,
        started_at=started,
        # a container restarted after it ended keeps its last FinishedAt while it runs again: not its end
        ended_at=None if running or (finished is not None and started is not None and finished < started) else finished,
        gpus_per_node=gpus,
        nodes=1,
        source=source,
    )


def requested_gpus(host_config: Mapping[str, Any]) -> int | None:
    """GPUs a container asked for in its ``HostConfig.DeviceRequests`` (0 without any); None when its
    ``HostConfig`` does not say how many (``--gpus all``, or GPUs from the ``nvidia`` runtime on Jetson)."""
    if host_config.get("Runtime") == "nvidia":
        return None
    count = 0
    for request in host_config.get("DeviceRequests") or []:
        if ["gpu"] not in (request.get("Capabilities") or []):
            continue
        if request.get("DeviceIDs"):
            count += len(request["DeviceIDs"])
        elif int(request.get("Count") or 0) < 0:
            return None
        else:
            count += int(request.get("Count") or 0)
    return count


# ----------------------------------------------------------------------------- what goes into the container


def job_archive(
    files: Mapping[str, bytes],
    secret_env: Mapping[str, str],
    marks: Mapping[str, Any],
    owner: tuple[int, int],
    folders: Sequence[str] = (),
) -> bytes:
    """A tar of ``/tao-job`` (relative to ``/``) with the files, the secrets file and the first marks.

    :param owner: (uid, gid) that owns the entries: the container's user must read its secrets.
    :param folders: more absolute folders to create (a results folder inside a mounted results root).
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for folder in folders:
            _add(tar, folder.strip("/"), None, 0o755, owner)
        for folder in (JOB_ROOT, MARKS_DIR):
            _add(tar, folder.lstrip("/"), None, 0o700, owner)
        _add_files(tar, FILES_DIR.lstrip("/"), files, owner)
        if secret_env:
            _add(tar, SECRETS_FILE.lstrip("/"), render_env_file(dict(secret_env)).encode(), 0o600, owner)
        for key, value in marks.items():
            _add(tar, f"{MARKS_DIR.lstrip('/')}/{key}", json.dumps(value).encode(), 0o600, owner)
    return buffer.getvalue()


def pack_files(files: Mapping[str, bytes], setup: bytes | None = None) -> bytes:
    """The job's files (and a platform's :data:`SETUP_FILE`) as one gzip'd tar relative to :data:`JOB_ROOT`, the
    form every parts channel of the launcher unpacks. Owned by whoever unpacks it (the container's user)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        _add_files(tar, FILES_DIR.removeprefix(f"{JOB_ROOT}/"), files, (0, 0))
        if setup is not None:
            _add(tar, SETUP_FILE.removeprefix(f"{JOB_ROOT}/"), setup, 0o600, (0, 0))
    return gzip.compress(buffer.getvalue(), compresslevel=6, mtime=0)


def files_in_parts(files: Mapping[str, bytes], part_size: int, setup: bytes | None = None) -> list[bytes]:
    """:func:`pack_files` cut into pieces of at most ``part_size`` bytes, for platforms whose objects are
    size-limited; the launcher joins and unpacks them from :data:`PARTS_DIR` (or ``$TAO_JOB_PARTS_DIR``)."""
    packed = pack_files(files, setup)
    return [packed[start : start + part_size] for start in range(0, len(packed), part_size)]


def files_in_env(files: Mapping[str, bytes], value_size: int, setup: bytes | None = None) -> dict[str, str]:
    """:func:`pack_files` as base64 environment variables of at most ``value_size`` characters each, plus their
    count in :data:`PARTS_ENV_COUNT`: for platforms whose only way into a container is its environment. The
    launcher joins, decodes and unpacks them, then unsets them."""
    text = base64.b64encode(pack_files(files, setup)).decode()
    chunks = [text[start : start + value_size] for start in range(0, len(text), value_size)]
    return {PARTS_ENV_COUNT: str(len(chunks))} | {f"{PARTS_ENV_PREFIX}{i}": chunk for i, chunk in enumerate(chunks)}


def _add_files(tar: tarfile.TarFile, root: str, files: Mapping[str, bytes], owner: tuple[int, int]) -> None:
    _add(tar, root, None, 0o700, owner)
    for name, content in sorted(files.items()):
        parts = name.split("/")
        for depth in range(1, len(parts)):
            _add(tar, f"{root}/{'/'.join(parts[:depth])}", None, 0o700, owner)
        _add(tar, f"{root}/{name}", content, 0o600, owner)


def mark_archive(key: str, value: Any) -> bytes:
    """A tar holding one mark file, to unpack into :data:`MARKS_DIR`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        _add(tar, key, json.dumps(value).encode(), 0o600, (0, 0))
    return buffer.getvalue()


def read_mark_archive(data: bytes) -> dict[str, Any]:
    """The marks in a tar of :data:`MARKS_DIR` (as the container runtime returns it: ``marks/<key>``)."""
    marks: dict[str, Any] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        for member in tar.getmembers():
            handle = tar.extractfile(member) if member.isfile() else None
            if handle is None:
                continue
            try:
                marks[member.name.rsplit("/", 1)[-1]] = json.loads(handle.read(256))
            except ValueError:
                continue  # a half-written or foreign file is not a mark
    return marks


def _add(tar: tarfile.TarFile, name: str, content: bytes | None, mode: int, owner: tuple[int, int]) -> None:
    info = tarfile.TarInfo(name)
    info.mode, (info.uid, info.gid), info.mtime = mode, owner, int(time.time())
    if content is None:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    else:
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))


# ----------------------------------------------------------------------------- logs by timestamp cursor
#
# Container logs have no byte offsets a client can ask from; both Docker and Kubernetes give each line its RFC 3339
# timestamp and accept "from this second on". The cursor is ``<timestamp>#<n>``: the newest timestamp shown and how
# many lines carried it. The next read asks from that second and drops what was shown: nothing is read twice beyond
# one second of log, and nothing is lost between two polls.


def parse_log_cursor(cursor: str) -> tuple[str, int]:
    """``(timestamp, lines shown with it)`` of a cursor ("" = nothing shown yet)."""
    stamp, _, count = cursor.partition("#")
    return stamp, int(count) if count.isdigit() else 0


def cursor_second(stamp: str) -> int:
    """The whole second of an RFC 3339 timestamp (``2026-11-25T10:00:01.123456789Z``) as epoch seconds."""
    return int(datetime.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp())


def timestamped_lines(chunks: Iterable[bytes]) -> Iterator[tuple[str, str]]:
    """``(timestamp, text)`` of each line of a timestamped log stream (fixed-width timestamps compare as strings)."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        for raw in complete:
            stamp, _, text = raw.decode(errors="replace").partition(" ")
            yield stamp, text
    if buffer:
        stamp, _, text = buffer.decode(errors="replace").partition(" ")
        yield stamp, text


def read_after(lines: Iterable[tuple[str, str]], cursor: str) -> tuple[str, str]:
    """The text of the lines after ``cursor`` (at most about ``LOG_READ_LIMIT`` bytes) and the new cursor."""
    last, seen = parse_log_cursor(cursor)
    shown_at, skip = last, seen
    kept: list[str] = []
    size = 0
    for stamp, text in lines:
        if stamp < shown_at or (stamp == shown_at and skip > 0):
            skip -= stamp == shown_at
            continue
        kept.append(text)
        size += len(text) + 1
        last, seen = (stamp, seen + 1) if stamp == last else (stamp, 1)
        if size >= LOG_READ_LIMIT:
            break
    return "".join(f"{line}\n" for line in kept), f"{last}#{seen}" if last else ""
