"""``_TAO_MANIFEST.json``: the commit marker of an output destination, written last at its root (relative path,
size and sha256 of every file). A destination without one is incomplete. The operator reads them too.
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

from .fsops import MANIFEST_NAME, sha256_file
from .paths import parse_s3
from .s3 import S3, S3_NOT_FOUND

if TYPE_CHECKING:  # pragma: no cover - typing only
    from collections.abc import Mapping, Sequence

__all__ = ["MANIFEST_FORMAT", "MANIFEST_NAME", "build_manifest", "is_complete", "now_iso", "read_manifest"]

MANIFEST_FORMAT = "tao-output-manifest/1"


def now_iso() -> str:
    """The current UTC time as ``YYYY-MM-DDTHH:MM:SSZ``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def build_manifest(
    job_id: str,
    key: str,
    destination: str,
    exit_code: int | None,
    files: Sequence[tuple[str, int, str]],
    *,
    outputs: Mapping[str, str] | None = None,
) -> bytes:
    """The manifest document for one output destination.

    :param job_id: the job.
    :param key: the declared output key.
    :param destination: where the files are.
    :param exit_code: the command's exit code.
    :param files: ``[(relative path, size, sha256)]``.
    :param outputs: job-level manifest only: every committed output key -> its destination.
    """
    entries = [{"path": p, "size": s, "sha256": h} for p, s, h in sorted(files)]
    doc: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "job_id": job_id,
        "key": key,
        "destination": destination,
        "exit_code": exit_code,
        "created_at": now_iso(),
        "file_count": len(entries),
        "total_bytes": sum(size for _p, size, _h in files),
        "files": entries,
    }
    if outputs is not None:
        doc["outputs"] = dict(outputs)
    return (json.dumps(doc, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def _manifest_location(location: str) -> str:
    location = location.rstrip("/") if location not in ("/", "s3://") else location
    if location.startswith("file://"):
        location = location[len("file://") :]
    return location + "/" + MANIFEST_NAME


def read_manifest(location: str, s3_client: Any = None) -> dict[str, Any] | None:
    """The manifest of an output destination, or None when there is none (= not committed / incomplete).

    :param location: the destination folder: a local path, ``file://`` or ``s3://bucket/prefix``.
    :param s3_client: a boto3 S3 client to use (e.g. from the amazon provider's S3Hook); default: a new one.
    """
    path = _manifest_location(location)
    try:
        if path.startswith("s3://"):
            bucket, key = parse_s3(path)
            client = s3_client if s3_client is not None else S3().client
            try:
                body = client.get_object(Bucket=bucket, Key=key)["Body"]
            except Exception as exc:
                code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
                if code in S3_NOT_FOUND:
                    return None
                raise
            raw = body.read()
        else:
            with open(path, "rb") as fh:
                raw = fh.read()
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("files"), list) else None


def is_complete(location: str, s3_client: Any = None, verify: str = "size") -> bool:
    """True only when the destination has a manifest and (by default) every listed file is there.

    :param location: the destination folder (local path, ``file://`` or ``s3://``).
    :param s3_client: a boto3 S3 client to use.
    :param verify: ``"none"`` (manifest present), ``"size"`` (files present with their sizes), ``"sha256"``
        (local destinations: contents re-hashed; on S3 same as ``"size"``).
    """
    manifest = read_manifest(location, s3_client=s3_client)
    if manifest is None:
        return False
    if verify == "none":
        return True
    base = _manifest_location(location)[: -len(MANIFEST_NAME) - 1]
    if base.startswith("s3://"):
        bucket, prefix = parse_s3(base)
        client = s3_client if s3_client is not None else S3().client
        sizes: dict[str, int] = {}
        root = prefix + "/" if prefix else ""  # a bucket-root destination has no prefix
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=root):
            for obj in page.get("Contents", []) or []:
                sizes[obj["Key"][len(root) :]] = int(obj["Size"])
        return all(sizes.get(f["path"]) == f["size"] for f in manifest["files"])
    for entry in manifest["files"]:
        full = os.path.join(base, *entry["path"].split("/"))
        try:
            if os.path.getsize(full) != entry["size"]:
                return False
        except OSError:
            return False
        if verify == "sha256" and sha256_file(full)[1] != entry["sha256"]:
            return False
    return True
