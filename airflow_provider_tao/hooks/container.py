"""What every container platform shares: the labels that find a job again, the job folder inside the container,
and the launcher that hands the job its secrets without a command line or an environment the platform shows.

Inside the container::

    /tao-job/files/       the spec's files (the in-job runner and its manifest): ``TAO_JOB_FILES``
    /tao-job/secret.env   the secrets as ``export K='v'`` lines, 0600; sourced and deleted by the launcher
    /tao-job/marks/<key>  the ownership marks (one small JSON value per file), kept with the job
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_tao.hooks.base import render_env_file
from airflow_provider_tao.jobs import JobSpec

LABEL_DOMAIN = "tao.nvidia.com"
LABEL_MANAGED = f"{LABEL_DOMAIN}/managed"
LABEL_JOB_ID = f"{LABEL_DOMAIN}/job-id"
LABEL_NAME = f"{LABEL_DOMAIN}/job-name"
LABEL_TRY = f"{LABEL_DOMAIN}/try"
LABEL_RESULTS_DIR = f"{LABEL_DOMAIN}/results-dir"
#: ``JobSpec.origin`` keys, as labels (``dag_id`` -> ``tao.nvidia.com/dag-id``).
ORIGIN_LABELS = {key: f"{LABEL_DOMAIN}/{key.replace('_', '-')}" for key in ("dag_id", "task_id", "run_id", "map_index")}

JOB_ROOT = "/tao-job"
FILES_DIR = f"{JOB_ROOT}/files"
SECRETS_FILE = f"{JOB_ROOT}/secret.env"
MARKS_DIR = f"{JOB_ROOT}/marks"

# Fixed text: the command arrives as "$@", the secrets from a file; nothing of either is in the container's spec.
# A string command runs under bash, or sh in an image without bash (alpine, busybox).
_LAUNCHER = (
    f"if [ -f {SECRETS_FILE} ]; then set -a; . {SECRETS_FILE}; set +a; rm -f {SECRETS_FILE}; fi; "
    'if [ "$1" = --shell ]; then [ -x /bin/bash ] && exec /bin/bash -c "$2"; exec /bin/sh -c "$2"; fi; exec "$@"'
)


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
        for folder in (JOB_ROOT, FILES_DIR, MARKS_DIR):
            _add(tar, folder.lstrip("/"), None, 0o700, owner)
        for name, content in sorted(files.items()):
            parts = name.split("/")
            for depth in range(1, len(parts)):
                _add(tar, f"{FILES_DIR.lstrip('/')}/{'/'.join(parts[:depth])}", None, 0o700, owner)
            _add(tar, f"{FILES_DIR.lstrip('/')}/{name}", content, 0o600, owner)
        if secret_env:
            _add(tar, SECRETS_FILE.lstrip("/"), render_env_file(dict(secret_env)).encode(), 0o600, owner)
        for key, value in marks.items():
            _add(tar, f"{MARKS_DIR.lstrip('/')}/{key}", json.dumps(value).encode(), 0o600, owner)
    return buffer.getvalue()


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
