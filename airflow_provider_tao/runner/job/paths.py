"""Dotted paths into a nested spec, output folder names and URI helpers (shared with the host-side builder)."""

from __future__ import annotations

import os
import re
from typing import Any

from .errors import ConfigError

#: What :func:`get_path` returns when there is nothing at the path.
MISSING = object()


def parse_dotted(path: str) -> list[str | int]:
    """Split ``a.b[0].c`` into ``["a", "b", 0, "c"]``.

    :param path: a dotted path into a nested spec; ``[N]`` indexes a list.
    """
    parts: list[str | int] = []
    for raw in path.split("."):
        match = re.match(r"^([^\[\]]*)((?:\[\d+\])*)$", raw)
        if not match or (not match.group(1) and not match.group(2)):
            raise ValueError(f"bad path {path!r}: empty or malformed segment {raw!r}")
        if match.group(1):
            parts.append(match.group(1))
        parts.extend(int(i) for i in re.findall(r"\[(\d+)\]", match.group(2)))
    return parts


def get_path(tree: Any, path: str) -> Any:
    """The value at a dotted path, or :data:`MISSING`.

    :param tree: nested dicts / lists.
    :param path: dotted path.
    """
    node = tree
    for part in parse_dotted(path):
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                return MISSING
            node = node[part]
        else:
            if not isinstance(node, dict) or part not in node:
                return MISSING
            node = node[part]
    return node


def set_path(tree: Any, path: str, value: Any) -> None:
    """Set the value at a dotted path; the parent must exist.

    :param tree: nested dicts / lists.
    :param path: dotted path.
    :param value: new value.
    """
    parts = parse_dotted(path)
    node = tree
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value


def output_dir_name(key: str, mode: str) -> str:
    """The folder name of an output under the job's results dir: ``train.results_dir`` -> ``train_results_dir``.

    Passthrough outputs (container paths) use their base name, as the seeds do.

    :param key: the declared output key (dotted path, arg name or container path).
    :param mode: ``config``, ``args`` or ``passthrough``.
    """
    if mode == "passthrough":
        key = os.path.basename(key.rstrip("/")) or "output"
    name = re.sub(r"[^A-Za-z0-9_]+", "_", key).strip("_")
    return name or "output"


def is_remote(value: str) -> bool:
    """True for a URI with a scheme (``s3://``, ``hf_model://`` ...)."""
    return "://" in value


def parse_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> ``("bucket", "key")``.

    :param uri: an ``s3://`` URI.
    """
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[5:].partition("/")
    if not bucket:
        raise ValueError(f"s3 URI without a bucket: {uri!r}")
    return bucket, key


def mount_mapping(mount_path: str, uri: str) -> str:
    """The seeds' Lustre mapping ``s3://bucket/path`` -> ``<mount>/bucket/path``, never outside ``<mount>``.

    :param mount_path: the shared cache root.
    :param uri: an ``s3://`` URI.
    :raises ConfigError: the bucket or a segment of the key is ``..`` (S3 takes such keys literally; on a file system
        they would climb out of the cache root).
    """
    bucket, key = parse_s3(uri)
    return cache_path(mount_path, bucket, key)


def cache_path(root: str, bucket: str, key: str, suffix: str = "") -> str:
    """``<root>/<bucket>/<key segments><suffix>``, refusing a bucket or key segment that climbs out of ``root``.

    :param root: a cache root.
    :param bucket: the object's bucket.
    :param key: the object's key (empty segments dropped).
    :param suffix: appended to the last segment (``.json`` for the cache's metadata).
    """
    parts = [bucket, *(p for p in key.split("/") if p and p != ".")]
    if any(p in ("..", ".") or "\0" in p for p in parts):
        raise ConfigError(
            f"refusing s3://{bucket}/{key}: a '..' segment would place it outside the cache root {root!r}; "
            "name the object without '..'"
        )
    return os.path.join(root, *parts) + suffix
