"""Reading a file of a job's results folder (its ``metrics.json``) outside the job, where the job wrote it.

The folder is the job's: on ``local`` and Docker (whose results root is bind-mounted read-write) the job can make
``metrics.json`` a symbolic link to any file the worker's user may read (a registry login, a key), a FIFO that blocks
the reader for ever, or a file of gigabytes; on S3 an object of any size. What is read lands in the task's XCom and
its Asset events, so a results file is read only as what it claims to be:

* a regular file, opened without following a symbolic link at any level below the results folder (``O_NOFOLLOW``
  on every component, the job's own folder included), and without blocking (``O_NONBLOCK``: a FIFO is refused by
  its type before anything is read);
* no larger than a cap (:data:`RESULT_FILE_LIMIT` by default): a bigger file is refused, never read in part;
* on S3 the object's size is asked first (``HeadObject``) and at most the cap is fetched (a ranged ``GetObject``);
* on a SLURM cluster (read over SSH with shell tools) by :func:`remote_read_command`, the same checks in ``sh``.

A refused file is an :class:`UnsafeResultFile` (its reason in words); a missing one is None.
"""

from __future__ import annotations

import errno
import os
import shlex
import stat
from typing import Any

#: The largest results file read (1 MiB): metrics, not models.
RESULT_FILE_LIMIT = 1 << 20
#: Exit codes of :func:`remote_read_command` beyond ``head``'s own.
_REMOTE_MISSING, _REMOTE_LINK, _REMOTE_NOT_REGULAR, _REMOTE_TOO_BIG = 40, 41, 42, 43


class UnsafeResultFile(ValueError):
    """A results file refused: a symbolic link, not a regular file, too large, or a name leaving the folder."""


def _parts(name: str) -> list[str]:
    """The components of a results file's name, relative to its folder (never ``..``, never absolute)."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or name.startswith("/") or ".." in parts:
        raise UnsafeResultFile(f"results file name {name!r} must be a relative path inside the results folder")
    return parts


def read_local_result(results_dir: str, name: str, limit: int = RESULT_FILE_LIMIT) -> bytes | None:
    """The content of ``<results_dir>/<name>`` on this host, or None if there is no such file.

    :param results_dir: the job's results folder (an absolute path); its own last component, which the job may
        replace, is not followed if it is a link either.
    :param name: the file's name inside it (``metrics.json`` or ``sub/metrics.json``).
    :param limit: the largest size read.
    :raises UnsafeResultFile: the file (or a folder on its way) is a link, it is not a regular file or too large.
    """
    parts = _parts(name)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        folder = os.open(results_dir, flags | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _refused(results_dir, exc) from exc
    fds = [folder]
    try:
        for part in parts[:-1]:
            try:
                fds.append(os.open(part, flags | os.O_DIRECTORY, dir_fd=fds[-1]))
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise _refused(f"{results_dir}/{name}", exc) from exc
        try:
            fds.append(os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=fds[-1]))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _refused(f"{results_dir}/{name}", exc) from exc
        info = os.fstat(fds[-1])
        _check(f"{results_dir}/{name}", stat.S_ISREG(info.st_mode), info.st_size, limit)
        with os.fdopen(fds.pop(), "rb") as file:
            return file.read(limit + 1)[:limit]
    finally:
        for fd in fds:
            os.close(fd)


def _refused(path: str, exc: OSError) -> Exception:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW met a link (ENOTDIR: a link or file as a folder)
        return UnsafeResultFile(f"{path} is a symbolic link (or passes through one); results files are read only as "
                                "regular files of the results folder")  # fmt: skip
    return exc


def _check(path: str, regular: bool, size: int, limit: int) -> None:
    if not regular:
        raise UnsafeResultFile(f"{path} is not a regular file (a FIFO, device or folder): not read")
    if size > limit:
        raise UnsafeResultFile(f"{path} has {size} bytes, more than the {limit} read from a results file")


def read_s3_result(client: Any, bucket: str, key: str, limit: int = RESULT_FILE_LIMIT) -> bytes | None:
    """The content of ``s3://<bucket>/<key>``, or None if there is no such object: its size asked first, at most
    ``limit`` bytes fetched.

    :param client: a boto3 S3 client (``S3Hook.get_conn()``).
    :raises UnsafeResultFile: the object is larger than ``limit``.
    """
    from botocore.exceptions import ClientError

    try:
        head = client.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if str(exc.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    _check(f"s3://{bucket}/{key}", True, int(head.get("ContentLength") or 0), limit)
    # ranged: an object replaced since its size was asked still brings no more than the cap
    body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{max(limit - 1, 0)}")
    return bytes(body["Body"].read(limit))


def remote_read_command(results_dir: str, name: str, limit: int = RESULT_FILE_LIMIT) -> str:
    """An ``sh`` command printing ``<results_dir>/<name>`` on a host reached over SSH, with the checks of
    :func:`read_local_result` (no link at any level below the folder, a regular file, at most ``limit`` bytes);
    its exit code says why not (:func:`remote_read_result`)."""
    parts = _parts(name)
    paths = [results_dir.rstrip("/")]
    for part in parts:
        paths.append(f"{paths[-1]}/{part}")
    checks = " ".join(f"[ -L {shlex.quote(p)} ] && exit {_REMOTE_LINK};" for p in paths)
    f = shlex.quote(paths[-1])
    return (
        f"{checks} [ -e {f} ] || exit {_REMOTE_MISSING}; [ -f {f} ] || exit {_REMOTE_NOT_REGULAR}; "
        f'[ "$(stat -c %s -- {f})" -le {int(limit)} ] || exit {_REMOTE_TOO_BIG}; head -c {int(limit)} -- {f}'
    )


def remote_read_result(rc: int, out: bytes, path: str, limit: int = RESULT_FILE_LIMIT) -> bytes | None:
    """What :func:`remote_read_command` answered: the content, None (missing or unreadable), or the refusal."""
    if rc == 0:
        return out
    if rc == _REMOTE_LINK:
        raise UnsafeResultFile(f"{path} is a symbolic link (or passes through one): not read")
    if rc == _REMOTE_NOT_REGULAR:
        _check(path, False, 0, limit)
    if rc == _REMOTE_TOO_BIG:
        raise UnsafeResultFile(f"{path} has more than the {limit} bytes read from a results file")
    return None
