"""Local files the runner writes: atomically (temp file beside + rename), hashed on the way, walked in order."""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import os
import shutil
import tempfile
from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from collections.abc import Sequence

#: Suffix of the runner's temp files: never committed, never counted as data.
PART_SUFFIX = ".tao-part"
#: Cache bookkeeping lives beside the data tree, never inside it (training code lists data folders).
CACHE_META_DIR = ".tao-cache-meta"
#: Manifests are skipped when an output folder is walked (see ``manifest.MANIFEST_NAME``).
MANIFEST_NAME = "_TAO_MANIFEST.json"
_CHUNK = 4 << 20


def temp_beside(path: str) -> tuple[int, str]:
    """``(fd, temp path)`` of a new hidden temp file in the destination's folder (created if needed).

    :param path: the final path the temp file will be renamed to.
    """
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    return tempfile.mkstemp(prefix="." + os.path.basename(path)[:80] + ".", suffix=PART_SUFFIX, dir=directory)


def unlink_quietly(path: str) -> None:
    """Remove a file if it is there.

    :param path: the file.
    """
    with contextlib.suppress(OSError):
        os.unlink(path)


def write_atomic(path: str, data: bytes) -> None:
    """Write a file so readers see the old content or the new one, never a part.

    :param path: destination.
    :param data: content.
    """
    fd, tmp = temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise


def sha256_file(path: str) -> tuple[int, str]:
    """``(size, sha256 hex)`` of a local file.

    :param path: the file.
    """
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            digest.update(chunk)
    return size, digest.hexdigest()


def copy_atomic(src: str, dst: str) -> tuple[int, str]:
    """Copy a file through a temp file + rename, hashing on the way; returns ``(size, sha256)``.

    :param src: source file.
    :param dst: destination file.
    """
    digest = hashlib.sha256()
    size = 0
    fd, tmp = temp_beside(dst)
    try:
        with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
            while True:
                chunk = fin.read(_CHUNK)
                if not chunk:
                    break
                fout.write(chunk)
                digest.update(chunk)
                size += len(chunk)
        shutil.copymode(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        unlink_quietly(tmp)
        raise
    return size, digest.hexdigest()


def excluded(rel: str, patterns: Sequence[str]) -> bool:
    """True when a relative path or its base name matches one of the ``upload_excludes`` patterns.

    :param rel: relative path (``/`` or ``os.sep`` separated).
    :param patterns: fnmatch patterns.
    """
    rel = rel.replace(os.sep, "/")
    base = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(base, p) for p in patterns)


def walk_files(root: str, excludes: Sequence[str] = ()) -> list[tuple[str, str]]:
    """``[(relative posix path, absolute path)]`` of the regular files under ``root``, sorted.

    Skips the manifest at the root, the runner's own temp files and anything matching ``excludes``.

    :param root: a folder.
    :param excludes: fnmatch patterns matched against the relative path and the base name.
    """
    found: list[tuple[str, str]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == os.curdir:
            dirnames[:] = [d for d in dirnames if d != CACHE_META_DIR]
        for name in sorted(filenames):
            rel = name if rel_dir == os.curdir else os.path.join(rel_dir, name)
            rel = rel.replace(os.sep, "/")
            full = os.path.join(dirpath, name)
            if rel == MANIFEST_NAME or name.endswith(PART_SUFFIX) or not os.path.isfile(full):
                continue
            if excluded(rel, excludes):
                continue
            found.append((rel, full))
    return found


def safe_relpath(rel: str) -> str:
    """An object name as a relative local path; refuses names that would escape the destination.

    :param rel: the part of an object key below the listed prefix.
    """
    parts = [p for p in rel.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        raise ConfigError(f"refusing unsafe object name {rel!r} (empty or contains '..')")
    return os.path.join(*parts)


def copy_path(src: str, dst: str) -> None:
    """Copy a file or a folder (atomically per file).

    :param src: a file or folder.
    :param dst: where it goes.
    """
    if os.path.isdir(src):
        for rel, full in walk_files(src):
            copy_atomic(full, os.path.join(dst, *rel.split("/")))
        os.makedirs(dst, exist_ok=True)
    else:
        copy_atomic(src, dst)


def link_or_copy(src: str, dst: str) -> None:
    """Expose a cached input at a container path: a symlink when the path is free, else a copy.

    :param src: the cached file or folder.
    :param dst: the path the command expects.
    """
    parent = os.path.dirname(dst.rstrip("/")) or "/"
    os.makedirs(parent, exist_ok=True)
    dst = dst.rstrip("/") or dst
    if os.path.islink(dst) or not os.path.exists(dst):
        tmp = f"{dst}.tao-link-{os.getpid()}"
        unlink_quietly(tmp)
        os.symlink(src, tmp)
        os.replace(tmp, dst)
        return
    copy_path(src, dst)
