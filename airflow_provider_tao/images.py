"""``versions.yaml``: container images and in-job wheels addressed by dotted keys.

``resolve_container_image("tao_toolkit.pyt")`` looks the key up in the ``images:`` tree. Anything that is not a
dotted key -- an absolute URI (``nvcr.io/nvidia/tao/tao-toolkit:6.26.3-pyt``) or a bare name (``ubuntu``,
``python:3.11``) -- is returned exactly as given: a bare image name is never mistaken for a key.
"""

from __future__ import annotations

import difflib
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

#: Environment variable naming another versions file (for sites that pin their own images).
VERSIONS_FILE_ENV = "TAO_VERSIONS_FILE"
PACKAGED_VERSIONS_FILE = Path(__file__).with_name("versions.yaml")

# A key has at least one dot and only identifier-ish parts; URIs have "/" or ":" and bare names no dot.
_KEY_RE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)+$")


class UnknownVersionKeyError(KeyError):
    """A dotted key that is not in versions.yaml."""

    def __str__(self) -> str:  # KeyError's default repr-quotes the message
        return str(self.args[0])


def versions_file() -> Path:
    """The versions file in use: ``$TAO_VERSIONS_FILE`` if set, else the one shipped with the package."""
    override = os.environ.get(VERSIONS_FILE_ENV)
    return Path(override) if override else PACKAGED_VERSIONS_FILE


def load_versions(path: Path | None = None) -> dict[str, Any]:
    """Parse a versions file (cached per path, modification time, size and inode, so edits are seen).

    :param path: the file; defaults to :func:`versions_file`.
    """
    path = path or versions_file()
    stat = path.stat()
    return _load(path, (stat.st_mtime_ns, stat.st_size, stat.st_ino))


@lru_cache(maxsize=8)
def _load(path: Path, _version: tuple[int, int, int]) -> dict[str, Any]:
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping with 'images:' and 'wheels:' trees")
    return data


def looks_like_key(value: str) -> bool:
    """True for ``tao_toolkit.pyt``; False for ``ubuntu``, ``python:3.11`` and ``nvcr.io/x/y:tag``."""
    return bool(_KEY_RE.match(value))


def _leaf_keys(tree: Any, prefix: str = "") -> list[str]:
    if not isinstance(tree, dict):
        return [prefix]
    return [key for name, sub in tree.items() for key in _leaf_keys(sub, f"{prefix}.{name}" if prefix else name)]


def _lookup(tree_name: str, key: str, path: Path | None) -> str:
    tree = load_versions(path).get(tree_name) or {}
    dotted = key.removeprefix(f"{tree_name}.")
    node: Any = tree
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, str):
        keys = sorted(f"{tree_name}.{k}" if key.startswith(f"{tree_name}.") else k for k in _leaf_keys(tree))
        close = difflib.get_close_matches(key, keys, n=1, cutoff=0.8)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UnknownVersionKeyError(
            f"{key!r} is not a key of the '{tree_name}:' tree in {path or versions_file()}.{hint} "
            f"Known keys: {', '.join(keys) or '(none)'}. Use one of them, or give an absolute image URI."
        )
    return node


def resolve_container_image(value: str, path: Path | None = None) -> str:
    """Resolve an image given as a versions.yaml key or as an image reference.

    :param value: ``tao_toolkit.pyt`` (or ``images.tao_toolkit.pyt``), an absolute URI, or a bare name.
    :param path: another versions file, for tests.
    """
    value = value.strip()
    if not value:
        raise ValueError("image: empty image; give a versions.yaml key such as 'tao_toolkit.pyt' or an image URI")
    return _lookup("images", value, path) if looks_like_key(value) else value


def resolve_wheel(key: str, path: Path | None = None) -> str:
    """The pinned requirement for an in-job package, e.g. ``boto3`` -> ``boto3==1.43.117``.

    :param key: a key of the ``wheels:`` tree.
    :param path: another versions file, for tests.
    """
    return _lookup("wheels", key, path)
