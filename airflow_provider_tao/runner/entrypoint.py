"""Host side of the in-job runner: turn (mode, specs | args, inputs, outputs) into what a platform runs.

:func:`build_entrypoint` validates everything before any job exists (errors name the parameter and the fix) and
returns an :class:`Entrypoint`:

* ``command`` -- a fixed argv with no user content:
  ``["/bin/sh", "-c", '... exec python3 -u -B "$TAO_JOB_FILES/script_runner.py" "$TAO_JOB_FILES/runner.json"']``;
* ``files`` -- ``{"script_runner.py": <the runtime's source>, "runner.json": <the job's manifest>}``, which the
  platform stages into a per-job folder exported as ``TAO_JOB_FILES`` (so specs of any size work: nothing large or
  user-provided rides on the command line or in one env var);
* ``env`` -- extra plain env for the job (none today; secrets never go here);
* ``mode`` and ``outputs`` -- the resolved mode and the declared output keys, for the operator's XCom.

The platform also exports ``TAO_JOB_ID`` (always), ``TAO_RESULTS_ROOT`` (persistent results mount) or
``TAO_RESULTS_URI`` (an explicit results location, e.g. the operator's ``results_uri``), and storage credentials as
secret env. The runtime itself is ``script_runner.py`` (stdlib only, never imports airflow).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from airflow_provider_tao.runner import script_runner as _rt
from airflow_provider_tao.runner.script_runner import (
    CONFIG_FORMATS,
    FAILURE_PREFIX,
    MANIFEST_NAME,
    MODES,
    PLACEHOLDERS,
    PROGRESS_PREFIX,
    RUNNER_FORMAT,
    is_complete,
    output_dir_name,
    read_manifest,
)

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

RUNNER_FILE = "script_runner.py"
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

# Linux caps one argv string at 128 KiB (MAX_ARG_STRLEN); a string command is one `bash -c` argument.
_MAX_ARG_BYTES = 120 * 1024
_INPUT_OPTIONS = {"container_path"}
_OUTPUT_OPTIONS = {"type"}
_PASSTHROUGH_OUTPUT_OPTIONS = {"destination"}
_ARG_NAME = re.compile(r"^-{0,2}[A-Za-z0-9_][A-Za-z0-9_.:/+\-]*$")
_S3_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-_]{0,254}$")  # lenient: S3-compatible stores vary
_NGC_REF = re.compile(r"^ngc://[^/\s:]+/(?:[^/\s:]+/)?[^/\s:]+:[^/\s:]+$")
_HF_REF = re.compile(r"^hf_(?:model|dataset)://[^/\s@]+(?:/[^/\s@]+)?(?:@[^\s@]+)?$")


@dataclass(frozen=True)
class Entrypoint:
    """What a platform runs for one job.

    :param command: fixed argv (no user content) that starts the runner from ``$TAO_JOB_FILES``.
    :param files: relative file name -> text, staged by the platform into ``$TAO_JOB_FILES``.
    :param env: extra plain environment for the job (never secrets).
    :param mode: ``config``, ``args`` or ``passthrough``.
    :param outputs: the declared output keys (dotted spec paths, arg names or container paths).
    """

    command: list[str]
    files: dict[str, str] = field(repr=False)
    env: dict[str, str] = field(default_factory=dict)
    mode: str = "passthrough"
    outputs: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """JSON-primitive form (for XCom / trigger kwargs); :meth:`from_json` reverses it."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str | bytes) -> Entrypoint:
        """Rebuild from :meth:`to_json` output (a dict or its JSON text).

        :param data: the JSON form.
        """
        raw = json.loads(data) if isinstance(data, (str, bytes)) else dict(data)
        return cls(
            command=list(raw["command"]),
            files=dict(raw["files"]),
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
                value = _rt.get_path(tree, key) if self.mode == "config" else (tree or {}).get(key)
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
    except ValueError:
        return None
    return payload if isinstance(payload, dict) and "phase" in payload else None


# ----------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------
def _where(base: str, part: str | int) -> str:
    return f"{base}[{part!r}]"


def _check_text(value: str, where: str, *, argv: bool = False) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{where}: text is not valid Unicode (lone surrogate); fix the value") from None
    if argv and "\x00" in value:
        raise ValueError(f"{where}: contains a NUL character, which cannot be passed on a command line")
    return value


def _normalize(value: Any, where: str, seen: set[int], *, argv: bool = False) -> Any:
    """A fresh JSON-safe copy of ``value``; errors name the path, e.g. ``specs['a'][0]``."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, Enum):
        return _normalize(value.value, where, seen, argv=argv)
    if isinstance(value, str):
        return _check_text(value, where, argv=argv)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ValueError(f"{where}: NaN / Infinity cannot be written to a spec; use a finite number")
        return float(value)
    if isinstance(value, os.PathLike):
        return _check_text(os.fspath(value), where, argv=argv) if isinstance(os.fspath(value), str) else None
    if isinstance(value, Mapping | list | tuple):
        if id(value) in seen:
            raise ValueError(f"{where}: the structure contains itself (a cycle)")
        seen.add(id(value))
        try:
            if isinstance(value, Mapping):
                out: dict[str, Any] = {}
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise ValueError(f"{_where(where, key)}: keys must be strings, got {type(key).__name__}")
                    _check_text(key, _where(where, key))
                    out[key] = _normalize(item, _where(where, key), seen, argv=argv)
                return out
            return [_normalize(item, _where(where, i), seen, argv=argv) for i, item in enumerate(value)]
        finally:
            seen.discard(id(value))
    if hasattr(value, "tolist"):  # numpy scalars / arrays
        return _normalize(value.tolist(), where, seen, argv=argv)
    raise ValueError(f"{where}: {type(value).__name__} is not JSON-safe; use str, int, float, bool, None, list or dict")


def _nest(dotted: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    node = out
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def _merge(into: dict[str, Any], more: Mapping[str, Any]) -> None:
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _short(value: Any) -> Any:
    text = json.dumps(value, ensure_ascii=False)
    return value if len(text) <= 40 else "..."


def _reject_flat_keys(specs: Mapping[str, Any]) -> None:
    flat = [k for k in specs if "." in k]
    if not flat:
        return
    wrong: dict[str, Any] = {k: _short(specs[k]) for k in flat}
    nested: dict[str, Any] = {}
    for key in flat:
        _merge(nested, _nest(key, _short(specs[key])))
    raise ValueError(
        f"specs: top-level key(s) {', '.join(repr(k) for k in flat)} contain dots. A spec is nested dicts, not "
        f"flat dotted keys: write {json.dumps(nested, ensure_ascii=False)} instead of "
        f"{json.dumps(wrong, ensure_ascii=False)}. Dotted paths belong only in inputs= / outputs=."
    )


def _check_path_syntax(path: Any, where: str) -> str:
    if not isinstance(path, str) or not path:
        raise ValueError(f"{where}: expected a non-empty dotted path string, got {path!r}")
    try:
        _rt.parse_dotted(path)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return path


def _check_input_uri(uri: Any, where: str) -> None:
    if not isinstance(uri, str) or not uri:
        raise ValueError(f"{where}: expected a URI or absolute path string, got {uri!r}")
    if uri.startswith("s3://"):
        bucket, _key = uri[5:].partition("/")[::2]
        if not _S3_BUCKET.fullmatch(bucket):
            raise ValueError(f"{where}: {uri!r} is not a valid s3://bucket/key URI")
    elif uri.startswith("file://"):
        if not os.path.isabs(uri[len("file://") :]):
            raise ValueError(f"{where}: {uri!r}: file:// URIs must be absolute (file:///data/x)")
    elif uri.startswith("ngc://"):
        if not _NGC_REF.fullmatch(uri):
            raise ValueError(f"{where}: {uri!r} is not ngc://org/[team/]model:version")
    elif uri.startswith(("hf_model://", "hf_dataset://")):
        if not _HF_REF.fullmatch(uri):
            raise ValueError(f"{where}: {uri!r} is not hf_model://org/name[@revision]")
    elif "://" in uri:
        raise ValueError(
            f"{where}: unsupported scheme in {uri!r}; use s3://, file://, an absolute path, hf_model://, "
            "hf_dataset:// or ngc://"
        )
    elif not os.path.isabs(uri):
        raise ValueError(f"{where}: {uri!r} is a relative path; inputs must be URIs or absolute paths")


def _check_output_value(value: Any, where: str) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise ValueError(f"{where}: an output value must be a string path/URI or empty, got {type(value).__name__}")
    if value.startswith("s3://"):
        _check_input_uri(value, where)
    elif "://" in value and not value.startswith("file://"):
        raise ValueError(
            f"{where}: unsupported destination {value!r}; use s3://..., an absolute path, or leave it relative/empty "
            "to have it placed under the job's results dir"
        )


def _container_path(path: Any, where: str) -> str:
    if not isinstance(path, str) or not os.path.isabs(path):
        raise ValueError(f"{where}: container paths must be absolute, got {path!r}")
    if ".." in path.split("/"):
        raise ValueError(f"{where}: container path {path!r} must not contain '..'")
    return path


def _options(cfg: Any, allowed: set[str], where: str) -> dict[str, Any]:
    if cfg is None:
        return {}
    if not isinstance(cfg, Mapping):
        raise ValueError(
            f"{where}: expected a dict of options ({', '.join(sorted(allowed))}) or None, got {cfg!r}; in config "
            "and args mode the URI lives in the spec / args at that path, inputs/outputs only name the path"
        )
    unknown = set(cfg) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    return dict(cfg)


def _keyed(decl: Any, param: str, allowed: set[str]) -> dict[str, dict[str, Any]]:
    """``inputs`` / ``outputs`` of config and args mode: a list of paths, or ``{path: options}``."""
    if decl is None:
        return {}
    if isinstance(decl, str):
        raise ValueError(f"{param}: give a list of paths, e.g. [{decl!r}], not a bare string")
    if isinstance(decl, Mapping):
        return {
            _check_path_syntax(k, _where(param, k)): _options(v, allowed, _where(param, k)) for k, v in decl.items()
        }
    if isinstance(decl, Sequence):
        out: dict[str, dict[str, Any]] = {}
        for i, path in enumerate(decl):
            _check_path_syntax(path, _where(param, i))
            if path in out:
                raise ValueError(f"{param}: {path!r} is listed twice")
            out[path] = {}
        return out
    raise ValueError(f"{param}: expected a list of paths or a dict, got {type(decl).__name__}")


def _unique_names(keys: Sequence[str], mode: str, param: str) -> None:
    seen: dict[str, str] = {}
    for key in keys:
        name = output_dir_name(key, mode)
        if name in seen:
            raise ValueError(
                f"{param}: {seen[name]!r} and {key!r} would both be stored as '{name}/' in the results dir; rename one"
            )
        seen[name] = key


def _resolve_mode(mode: str | None, specs: Any, args: Any) -> str:
    if specs is not None and args is not None:
        raise ValueError(
            "specs and args are mutually exclusive: pass specs=... (config mode: a spec file is written) or "
            "args=... (args mode: values become CLI flags), not both"
        )
    inferred = "config" if specs is not None else "args" if args is not None else "passthrough"
    if mode is None:
        return inferred
    if mode not in MODES:
        raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    if mode != inferred:
        need = {"config": "specs=...", "args": "args=...", "passthrough": "neither specs nor args"}
        raise ValueError(
            f"mode={mode!r} disagrees with the arguments, which mean mode={inferred!r}: mode {mode!r} takes "
            f"{need[mode]}. Pass {need[mode]}, or drop mode= / set mode={inferred!r}"
        )
    return mode


def _check_command(command: Any, mode: str) -> str | list[str]:
    if isinstance(command, str):
        if not command.strip():
            raise ValueError("command: empty command")
        _check_text(command, "command", argv=True)
        cmd: str | list[str] = command
        texts = [command]
    elif isinstance(command, Sequence) and not isinstance(command, bytes):
        cmd = [
            _check_text(c, _where("command", i), argv=True) if isinstance(c, str) else _bad_arg(c, i)
            for i, c in enumerate(command)
        ]
        if not cmd or not cmd[0]:
            raise ValueError("command: an argv list needs at least the program name")
        texts = list(cmd)
    else:
        raise ValueError(
            f"command: expected a string (run by /bin/bash -c) or a list of strings (argv), "
            f"got {type(command).__name__}"
        )
    for text in texts:
        if len(text.encode("utf-8")) > _MAX_ARG_BYTES:
            raise ValueError(
                "command: longer than 120 KiB, which Linux refuses on a command line; put large content in specs "
                "(config mode) or an input file"
            )
    if mode != "config" and any("{config_path}" in t for t in texts):
        raise ValueError(
            f"command: uses {{config_path}} but mode is {mode!r}, which writes no spec file; pass specs=... "
            "(config mode) or remove the placeholder"
        )
    return cmd


def _bad_arg(value: Any, index: int) -> str:
    raise ValueError(f"command[{index}]: argv elements must be strings, got {type(value).__name__}")


def _check_args(args: Any) -> dict[str, Any]:
    if not isinstance(args, Mapping):
        raise ValueError(f"args: expected a dict of argument name -> value, got {type(args).__name__}")
    out: dict[str, Any] = {}
    for key, value in args.items():
        where = _where("args", key)
        if not isinstance(key, str) or not _ARG_NAME.fullmatch(key):
            raise ValueError(
                f"{where}: argument names are like 'lr', 'model.lr' or '--lr' (letters, digits, _ . : / + -)"
            )
        norm = _normalize(value, where, set(), argv=True)
        if isinstance(norm, list) and any(isinstance(v, list) for v in norm):
            raise ValueError(f"{where}: nested lists cannot be CLI flags; use a flat list or a dict (passed as JSON)")
        out[key] = norm
    return out


def _load_wheels() -> dict[str, str]:
    """versions.yaml ``wheels:`` (copied into runner.json so the job can name pinned versions)."""
    try:
        from airflow_provider_tao.images import load_versions

        wheels = load_versions().get("wheels") or {}
    except Exception:  # a missing/broken versions file must not block a job; the runner then names no pin
        return {}
    return {str(k): str(v) for k, v in wheels.items() if isinstance(v, str)} if isinstance(wheels, dict) else {}


def _runner_source() -> str:
    return Path(_rt.__file__).read_text(encoding="utf-8")


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
    resolved = _resolve_mode(mode, specs, args)
    cmd = _check_command(command, resolved)
    if not isinstance(config_format, str) or config_format.lower() not in CONFIG_FORMATS:
        raise ValueError(f"config_format: {config_format!r} is not one of {', '.join(CONFIG_FORMATS)}")
    fmt = config_format.lower()
    excludes = _check_excludes(upload_excludes)
    if mount_path is not None and (not isinstance(mount_path, str) or not os.path.isabs(mount_path)):
        raise ValueError(f"mount_path: must be an absolute path inside the job, got {mount_path!r}")

    spec_tree: dict[str, Any] | None = None
    arg_map: dict[str, Any] | None = None
    in_decl: dict[str, Any]
    out_decl: dict[str, dict[str, Any]]
    if resolved == "config":
        if not isinstance(specs, Mapping):
            raise ValueError(f"specs: expected a dict (the nested spec), got {type(specs).__name__}")
        spec_tree = _normalize(specs, "specs", set())
        _reject_flat_keys(spec_tree or {})
        in_decl = _keyed(inputs, "inputs", _INPUT_OPTIONS)
        out_decl = _keyed(outputs, "outputs", _OUTPUT_OPTIONS)
        _check_config_decl(spec_tree or {}, in_decl, out_decl)
        if fmt == "toml":
            _check_toml(spec_tree or {}, set(out_decl))
    elif resolved == "args":
        arg_map = _check_args(args)
        in_decl = _keyed(inputs, "inputs", _INPUT_OPTIONS)
        out_decl = _keyed(outputs, "outputs", _OUTPUT_OPTIONS)
        _check_args_decl(arg_map, in_decl, out_decl)
        _check_args_size(cmd, arg_map, out_decl)
    else:
        in_decl, out_decl = _check_passthrough(inputs, outputs)
    _unique_names(list(out_decl), resolved, "outputs")

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
    files = {
        RUNNER_FILE: _runner_source(),
        # ASCII-only JSON: survives any staging channel (ConfigMap, scp, docker cp) byte for byte.
        RUNNER_MANIFEST_FILE: json.dumps(manifest, ensure_ascii=True, allow_nan=False, separators=(",", ":")),
    }
    return Entrypoint(command=list(RUNNER_COMMAND), files=files, env={}, mode=resolved, outputs=list(out_decl))


def _check_excludes(upload_excludes: Any) -> list[str]:
    if upload_excludes is None:
        return []
    if isinstance(upload_excludes, str) or not isinstance(upload_excludes, Sequence):
        raise ValueError(f"upload_excludes: give a list of fnmatch patterns, e.g. ['*.tmp'], not {upload_excludes!r}")
    for i, pattern in enumerate(upload_excludes):
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"upload_excludes[{i}]: patterns must be non-empty strings, got {pattern!r}")
    return list(upload_excludes)


def _check_config_decl(spec: dict[str, Any], inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    for key, cfg in inputs.items():
        where = _where("inputs", key)
        value = _rt.get_path(spec, key)
        if value is _rt._MISSING:
            raise ValueError(
                f"{where}: {key!r} is not a path in specs. inputs name dotted paths into the nested spec (the URI "
                f"lives in the spec at that path); add it to specs or drop it from inputs"
            )
        _check_input_value(value, where)
        if cfg.get("container_path") is not None:
            _container_path(cfg["container_path"], _where(where, "container_path"))
    for key, cfg in outputs.items():
        where = _where("outputs", key)
        parts = _rt.parse_dotted(key)
        parent = spec if len(parts) == 1 else _rt.get_path(spec, _join(parts[:-1]))
        leaf = parts[-1]
        ok = (isinstance(parent, dict) and isinstance(leaf, str)) or (
            isinstance(parent, list) and isinstance(leaf, int) and leaf < len(parent)
        )
        if not ok:
            raise ValueError(
                f"{where}: the spec has no section for {key!r}; outputs name dotted paths into the nested spec"
            )
        value = _rt.get_path(spec, key)
        _check_output_value(None if value is _rt._MISSING else value, where)
        _check_output_type(cfg, where)
        if key in inputs:
            raise ValueError(f"{where}: {key!r} is declared both as an input and as an output")


def _join(parts: Sequence[str | int]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _check_output_type(cfg: Mapping[str, Any], where: str) -> None:
    if cfg.get("type") not in (None, "folder", "file"):
        raise ValueError(f"{where}: type must be 'folder' or 'file', got {cfg.get('type')!r}")


def _check_input_value(value: Any, where: str) -> None:
    if value is None or value == "":
        return  # an optional input left empty: nothing to stage
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_input_uri(item, _where(where, i))
        return
    _check_input_uri(value, where)


def _check_args_decl(args: dict[str, Any], inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    for key, cfg in inputs.items():
        where = _where("inputs", key)
        if key not in args:
            raise ValueError(f"{where}: {key!r} is not a key of args; inputs name the args whose values are URIs")
        _check_input_value(args[key], where)
        if cfg.get("container_path") is not None:
            _container_path(cfg["container_path"], _where(where, "container_path"))
    for key, cfg in outputs.items():
        where = _where("outputs", key)
        if not _ARG_NAME.fullmatch(key):
            raise ValueError(f"{where}: not a valid argument name")
        _check_output_value(args.get(key), where)
        _check_output_type(cfg, where)
        if key in inputs:
            raise ValueError(f"{where}: {key!r} is declared both as an input and as an output")


def _check_args_size(cmd: str | list[str], args: dict[str, Any], outputs: dict[str, Any]) -> None:
    probe = dict(args)
    for key in outputs:  # auto-filled outputs become paths; leave room for them
        probe[key] = "x" * 256
    tokens = _rt.args_tokens(probe)
    if isinstance(cmd, str):
        script = cmd.rstrip() + " " + " ".join(shlex.quote(t) for t in tokens)
        sizes = [len(script.encode("utf-8"))]
    else:
        sizes = [len(t.encode("utf-8")) for t in tokens]
    if max(sizes, default=0) > _MAX_ARG_BYTES or sum(sizes) > 1024 * 1024:
        raise ValueError(
            "args: the values make the command line too long for Linux (128 KiB per argument); pass large values "
            "through specs (config mode) or an input file"
        )


def _check_passthrough(inputs: Any, outputs: Any) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    in_decl: dict[str, str] = {}
    if inputs is not None:
        if not isinstance(inputs, Mapping):
            raise ValueError(
                "inputs: passthrough inputs are path-keyed: {'/workspace/data': 's3://bucket/data/'} "
                f"(container path -> URI), got {type(inputs).__name__}"
            )
        for path, uri in inputs.items():
            where = _where("inputs", path)
            _container_path(path, where)
            _check_input_uri(uri, where)
            in_decl[path] = uri
    out_decl: dict[str, dict[str, Any]] = {}
    if outputs is None:
        return in_decl, out_decl
    if isinstance(outputs, str):
        raise ValueError(f"outputs: give a list of container paths, e.g. [{outputs!r}], not a bare string")
    if isinstance(outputs, Mapping):
        items = list(outputs.items())
    elif isinstance(outputs, Sequence):
        items = [(p, None) for p in outputs]
    else:
        raise ValueError(f"outputs: expected a list of container paths, got {type(outputs).__name__}")
    for path, raw_cfg in items:
        where = _where("outputs", path)
        _container_path(path, where)
        cfg = {"destination": raw_cfg} if isinstance(raw_cfg, str) else raw_cfg
        options = _options(cfg, _PASSTHROUGH_OUTPUT_OPTIONS, where)
        dest = options.get("destination")
        if dest is not None:
            if not isinstance(dest, str) or not (dest.startswith("s3://") or os.path.isabs(dest)):
                raise ValueError(f"{where}: destination must be s3://... or an absolute path, got {dest!r}")
            _check_output_value(dest, where)
        if path in out_decl:
            raise ValueError(f"outputs: {path!r} is listed twice")
        out_decl[path] = options
    return in_decl, out_decl


def _check_toml(spec: dict[str, Any], outputs: set[str]) -> None:
    """TOML has no null: every None must be at a declared output (the runner fills it in)."""

    def walk(node: Any, path: str) -> None:
        if node is None:
            if path not in outputs:
                raise ValueError(
                    f"specs: {path!r} is None, which TOML cannot express; give a value, declare it as an output "
                    "(auto-filled), or use config_format='yaml' / 'json'"
                )
        elif isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else key)
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")

    walk(spec, "")
