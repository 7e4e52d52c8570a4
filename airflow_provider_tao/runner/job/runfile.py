"""``runner.json``: what the host-side builder (``runner/entrypoint.py``) writes for one job and the runner reads."""

from __future__ import annotations

import json
from typing import Any

from .errors import ConfigError

RUNNER_FORMAT = 1
MODES = ("config", "args", "passthrough")


def load_runner_manifest(path: str) -> dict[str, Any]:
    """Read and sanity-check runner.json.

    :param path: the file.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"runner manifest {path}: file not found (is TAO_JOB_FILES staged?)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"runner manifest {path} is unreadable: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != RUNNER_FORMAT:
        raise ConfigError(f"runner manifest {path}: not a format-{RUNNER_FORMAT} runner.json")
    for key in ("inputs", "outputs"):
        if not isinstance(manifest.get(key) or {}, dict):
            raise ConfigError(f"runner manifest {path}: {key!r} must be a mapping")
    return manifest
