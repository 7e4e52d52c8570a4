"""Host side of the in-job runner: turn (mode, specs | args, inputs, outputs) into what a platform runs.

:func:`build_entrypoint` validates everything before any job exists (errors name the parameter and the fix) and
returns an :class:`Entrypoint`:

* ``command`` -- a fixed argv with no user content:
  ``["/bin/sh", "-c", '... exec python3 -u -B "$TAO_JOB_FILES/runner.pyz" "$TAO_JOB_FILES/runner.json"']``;
* ``files`` -- ``{"runner.pyz": <the runner as one zip archive>, "runner.json": <the job's manifest>}``, which the
  platform stages into a per-job folder exported as ``TAO_JOB_FILES`` (so specs of any size work: nothing large or
  user-provided rides on the command line or in one env var);
* ``env`` -- extra plain env for the job (none today; secrets never go here);
* ``mode`` and ``outputs`` -- the resolved mode and the declared output keys, for the operator's XCom.

The platform also exports ``TAO_JOB_ID`` (always), ``TAO_RESULTS_ROOT`` (persistent results mount) or
``TAO_RESULTS_URI`` (an explicit results location, e.g. the operator's ``results_uri``), and storage credentials as
secret env. The runtime is the package :mod:`airflow_provider_tao.runner.job` (stdlib only, never imports airflow),
packed by :mod:`airflow_provider_tao.runner.bundle`; this module imports its shared parts (paths, placeholders,
manifests) directly, and the checks of the data contract live in :mod:`airflow_provider_tao.runner.validation`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_provider_tao.runner import validation
from airflow_provider_tao.runner.bundle import RUNNER_ARCHIVE, runner_archive
from airflow_provider_tao.runner.job.command import PLACEHOLDERS
from airflow_provider_tao.runner.job.manifest import MANIFEST_NAME, is_complete, read_manifest
from airflow_provider_tao.runner.job.paths import get_path, output_dir_name
from airflow_provider_tao.runner.job.progress import FAILURE_PREFIX, PROGRESS_PREFIX
from airflow_provider_tao.runner.job.runfile import RUNNER_FORMAT

__all__ = [
    "FAILURE_PREFIX",
    "MANIFEST_NAME",
    "PLACEHOLDERS",
    "PROGRESS_PREFIX",
    "RUNNER_FILE",
    "RUNNER_MANIFEST_FILE",
    "Entrypoint",
    "build_entrypoint",
    "is_complete",
    "parse_progress",
    "read_manifest",
]

RUNNER_FILE = RUNNER_ARCHIVE
RUNNER_MANIFEST_FILE = "runner.json"

# Fixed argv: no user content, nothing that grows with the spec. python3 -B: TAO_JOB_FILES may be read-only.
_NO_PYTHON = json.dumps(
    {"err_class": "ERR_CONFIG", "message": "python3 (>= 3.8) is not on PATH in the job image; the TAO runner needs it"}
)
_NO_FILES = json.dumps(
    {"err_class": "ERR_CONFIG", "message": "TAO_JOB_FILES is not set: the platform did not stage the runner files"}
)
RUNNER_COMMAND: tuple[str, ...] = (
    "/bin/sh",
    "-c",
    f"[ -n \"$TAO_JOB_FILES\" ] || {{ echo '{FAILURE_PREFIX}{_NO_FILES}'; exit 2; }}; "
    f"command -v python3 >/dev/null 2>&1 || {{ echo '{FAILURE_PREFIX}{_NO_PYTHON}'; exit 2; }}; "
    f'exec python3 -u -B "$TAO_JOB_FILES/{RUNNER_FILE}" "$TAO_JOB_FILES/{RUNNER_MANIFEST_FILE}"',
)


@dataclass(frozen=True)
class Entrypoint:
    """What a platform runs for one job.

    :param command: fixed argv (no user content) that starts the runner from ``$TAO_JOB_FILES``.
    :param files: relative file name -> content, staged by the platform into ``$TAO_JOB_FILES``: the runner archive
        (bytes) and ``runner.json`` (ASCII text).
    :param env: extra plain environment for the job (never secrets).
    :param mode: ``config``, ``args`` or ``passthrough``.
    :param outputs: the declared output keys (dotted spec paths, arg names or container paths).
    """

    command: list[str]
    files: dict[str, str | bytes] = field(repr=False)
    env: dict[str, str] = field(default_factory=dict)
    mode: str = "passthrough"
    outputs: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """JSON-primitive form (for XCom / trigger kwargs); :meth:`from_json` reverses it.

        The runner archive is code, not data: it is left out and :meth:`from_json` builds it again from the
        installed package (the same bytes for the same code).
        """
        data = asdict(self)
        data["files"] = {name: text for name, text in self.files.items() if name != RUNNER_FILE}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str | bytes) -> Entrypoint:
        """Rebuild from :meth:`to_json` output (a dict or its JSON text).

        :param data: the JSON form.
        """
        raw = json.loads(data) if isinstance(data, (str, bytes)) else dict(data)
        return cls(
            command=list(raw["command"]),
            files={RUNNER_FILE: runner_archive(), **raw["files"]},
            env=dict(raw.get("env") or {}),
            mode=str(raw.get("mode") or "passthrough"),
            outputs=list(raw.get("outputs") or []),
        )

    @property
    def manifest(self) -> dict[str, Any]:
        """The parsed ``runner.json``."""
        parsed: dict[str, Any] = json.loads(self.files[RUNNER_MANIFEST_FILE])
        return parsed

    def output_uris(self, results_dir: str) -> dict[str, str]:
        """Where each declared output will be committed, given the job's results dir.

        Explicit destinations in the spec / args (``s3://...`` or absolute paths) win; everything else lands in
        ``<results_dir>/<name>``, the runner's auto-fill. Each destination holds a ``_TAO_MANIFEST.json`` once
        committed (see :func:`is_complete`).

        :param results_dir: the job's results dir: ``$TAO_RESULTS_ROOT/<job_id>``,
            ``s3://<bucket>/results/<job_id>``, ``/results/<job_id>`` or an explicit results URI.
        """
        manifest = self.manifest
        base = results_dir.rstrip("/")
        uris: dict[str, str] = {}
        for key, raw_cfg in (manifest.get("outputs") or {}).items():
            cfg = raw_cfg or {}
            if self.mode == "passthrough":
                explicit = str(cfg.get("destination") or "")
                is_file = False
            else:
                tree = manifest.get("specs") if self.mode == "config" else manifest.get("args")
                value = get_path(tree, key) if self.mode == "config" else (tree or {}).get(key)
                explicit = value if isinstance(value, str) else ""
                is_file = cfg.get("type") == "file"
            explicit = explicit[len("file://") :] if explicit.startswith("file://") else explicit
            if explicit.startswith("s3://") or os.path.isabs(explicit):
                dest = explicit.rstrip("/")
                uris[key] = dest.rsplit("/", 1)[0] if is_file and "/" in dest.split("://")[-1] else dest
            else:
                uris[key] = f"{base}/{output_dir_name(key, self.mode)}"
        return uris


def parse_progress(line: str) -> dict[str, Any] | None:
    """The payload of one ``TAO_PROGRESS`` line (as printed by the runner), else None.

    :param line: a log line.
    """
    start = line.find(PROGRESS_PREFIX)
    if start < 0:
        return None
    try:
        payload = json.loads(line[start + len(PROGRESS_PREFIX) :])
    except (ValueError, RecursionError):  # the job's own text: anything can be there
        return None
    return payload if isinstance(payload, dict) and "phase" in payload else None


def _load_wheels() -> dict[str, str]:
    """versions.yaml ``wheels:`` (copied into runner.json so the job can name pinned versions)."""
    try:
        from airflow_provider_tao.images import load_versions

        wheels = load_versions().get("wheels") or {}
    except Exception:  # a missing/broken versions file must not block a job; the runner then names no pin
        return {}
    return {str(k): str(v) for k, v in wheels.items() if isinstance(v, str)} if isinstance(wheels, dict) else {}


def build_entrypoint(
    command: str | Sequence[str],
    *,
    specs: Mapping[str, Any] | None = None,
    args: Mapping[str, Any] | None = None,
    inputs: Mapping[str, Any] | Sequence[str] | None = None,
    outputs: Mapping[str, Any] | Sequence[str] | None = None,
    config_format: str = "yaml",
    upload_excludes: Sequence[str] | None = None,
    mount_path: str | None = None,
    mode: str | None = None,
) -> Entrypoint:
    """Validate a job's data contract and build what the platform runs.

    Modes (as the seeds say): ``specs`` -> config (the spec is written at ``{config_path}``), ``args`` -> args
    (values appended as ``--key value`` tokens), neither -> passthrough (path-keyed inputs / outputs).

    :param command: a string, run by exactly one ``/bin/bash -c``, or an argv list (no shell). Only the
        placeholders ``{config_path}``, ``{results_dir}`` and ``{job_id}`` are replaced (literal substring
        replacement; never ``str.format``); everything else arrives verbatim.
    :param specs: config mode: the nested spec (dicts, not flat dotted keys).
    :param args: args mode: flat ``{name: value}``; ``True`` -> bare ``--name``, ``False``/``None`` omitted, lists
        -> the flag repeated per item, dicts -> compact JSON.
    :param inputs: config/args mode: dotted paths (or arg names) whose values are URIs to stage, as a list or as
        ``{path: {"container_path": "/abs"} | None}``; passthrough: ``{container_path: uri}``. URIs: ``s3://``
        (file or prefix), ``file://``, absolute paths, ``hf_model://``, ``hf_dataset://``, ``ngc://``.
    :param outputs: config/args mode: dotted paths (or arg names), as a list or ``{path: {"type": "folder"|"file"}}``;
        relative / empty values are auto-filled to ``<results_dir>/<name>``, ``s3://`` or absolute values are used
        as given. Passthrough: a list of container paths, or ``{container_path: {"destination": uri} | None}``.
    :param config_format: ``yaml``, ``toml`` or ``json``.
    :param upload_excludes: fnmatch patterns of output files not to upload / commit (relative path or base name).
    :param mount_path: a shared cache mounted in the job (Lustre / NFS): ``s3://b/k`` is cached at
        ``<mount_path>/b/k`` and reused while its size and ETag match the source.
    :param mode: optional; when given it must agree with the arguments.
    :raises ValueError: naming the parameter and the fix, before any job exists.
    """
    resolved = validation.resolve_mode(mode, specs, args)
    cmd = validation.check_command(command, resolved)
    fmt, excludes = validation.check_options(config_format, upload_excludes, mount_path)
    spec_tree: dict[str, Any] | None = None
    arg_map: dict[str, Any] | None = None
    if resolved == "config":
        spec_tree, in_decl, out_decl = validation.check_config(specs, inputs, outputs, fmt)
    elif resolved == "args":
        arg_map, in_decl, out_decl = validation.check_args_mode(cmd, args, inputs, outputs)
    else:
        in_decl, out_decl = validation.check_passthrough(inputs, outputs)
    validation.unique_names(list(out_decl), resolved, "outputs")

    manifest = {
        "format": RUNNER_FORMAT,
        "mode": resolved,
        "command": cmd,
        "specs": spec_tree,
        "args": arg_map,
        "inputs": in_decl,
        "outputs": out_decl,
        "config_format": fmt,
        "upload_excludes": excludes,
        "mount_path": mount_path,
        "wheels": _load_wheels(),
    }
    files: dict[str, str | bytes] = {
        RUNNER_FILE: runner_archive(),
        # ASCII-only JSON: survives any staging channel (ConfigMap, scp, docker cp) byte for byte.
        RUNNER_MANIFEST_FILE: json.dumps(manifest, ensure_ascii=True, allow_nan=False, separators=(",", ":")),
    }
    return Entrypoint(command=list(RUNNER_COMMAND), files=files, env={}, mode=resolved, outputs=list(out_decl))
