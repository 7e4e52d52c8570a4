"""The files of a job's results folder, as the job page lists them: only inside a results root the job's
connection declares on this host (the local platform's ``results_root``, a Docker daemon's bind-mounted one).

A record names its results folder; the page never walks a folder a record merely names (``/``, another job's), and
never follows a link out of the root.
"""

from __future__ import annotations

import os
from typing import Any

#: The most names the job page lists.
LIMIT = 200


def declared_root(hook: Any) -> str | None:
    """The results root ``hook``'s connection declares on this host, or None (the platform's results are elsewhere:
    a cluster, a bucket, a volume)."""
    root: Any = None
    try:
        if hook.platform == "local":
            root = hook.results_root
        elif hook.platform == "docker":
            root = hook.default_results_root()
    except Exception:  # a connection that cannot say: nothing is listed
        return None
    return os.path.realpath(str(root)) if root else None


def results_files(hook: Any, results_dir: str) -> list[str]:
    """Up to :data:`LIMIT` file names (relative) of ``results_dir`` when it lies strictly inside the connection's
    declared results root on this host, else []."""
    root = declared_root(hook)
    if not root or not isinstance(results_dir, str) or not results_dir.startswith("/"):
        return []
    folder = os.path.realpath(results_dir)
    if folder == root or os.path.commonpath([folder, root]) != root or not os.path.isdir(folder):
        return []
    files: list[str] = []
    for top, _, names in os.walk(folder):  # links to folders are not followed
        files += [os.path.relpath(os.path.join(top, name), folder) for name in names]
        if len(files) > LIMIT:
            break
    return sorted(files)[:LIMIT]
