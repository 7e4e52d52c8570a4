"""The checks of a job's data contract, run on the host before any job exists (``build_entrypoint``).

Every error is a ``ValueError`` whose text starts with the parameter (``specs['a'][0]: ...``) and says the fix; the
operator turns it into a ``JobValidationError``. The dotted-path, output-name and args-token rules are the in-job
runner's own (imported from :mod:`airflow_provider_tao.runner.job`), so the host and the job never disagree.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from airflow_provider_tao.runner.job.command import args_tokens
from airflow_provider_tao.runner.job.paths import MISSING, get_path, output_dir_name, parse_dotted
from airflow_provider_tao.runner.job.runfile import MODES
from airflow_provider_tao.runner.job.specs import CONFIG_FORMATS

# Linux caps one argv string at 128 KiB (MAX_ARG_STRLEN); a string command is one `bash -c` argument.
_MAX_ARG_BYTES = 120 * 1024
_INPUT_OPTIONS = {"container_path"}
_OUTPUT_OPTIONS = {"type"}
_PASSTHROUGH_OUTPUT_OPTIONS = {"destination"}
_ARG_NAME = re.compile(r"^-{0,2}[A-Za-z0-9_][A-Za-z0-9_.:/+\-]*$")
_S3_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-_]{0,254}$")  # lenient: S3-compatible stores vary
_NGC_REF = re.compile(r"^ngc://[^/\s:]+/(?:[^/\s:]+/)?[^/\s:]+:[^/\s:]+$")
_HF_REF = re.compile(r"^hf_(?:model|dataset)://[^/\s@]+(?:/[^/\s@]+)?(?:@[^\s@]+)?$")


def _where(base: str, part: str | int) -> str:
    return f"{base}[{part!r}]"


def _check_text(value: str, where: str, *, argv: bool = False) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{where}: text is not valid Unicode (lone surrogate); fix the value") from None
    if argv and "\x00" in value:
        raise ValueError(f"{where}: contains a NUL character, which no command line or environment carries")
    return value


def check_exec_text(value: str, where: str) -> str:
    """``value`` if one argv or environment string can carry it (Unicode, no NUL, <= 120 KiB), else ValueError."""
    if len(_check_text(value, where, argv=True).encode("utf-8")) > _MAX_ARG_BYTES:
        raise ValueError(
            f"{where}: longer than 120 KiB, which Linux refuses in a command line or an environment; put large "
            "content in specs (config mode) or an input file"
        )
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


def _short(value: Any) -> Any:
    text = json.dumps(value, ensure_ascii=False)
    return value if len(text) <= 40 else "..."


def _reject_flat_keys(specs: Mapping[str, Any]) -> None:
    flat = [k for k in specs if "." in k]
    if not flat:
        return
    wrong: dict[str, Any] = {k: _short(specs[k]) for k in flat}
    nested: dict[str, Any] = {}
    for key in flat:  # the nested form the user meant, e.g. {"train": {"lr": 0.1, "epochs": 3}}
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = _short(specs[key])
    raise ValueError(
        f"specs: top-level key(s) {', '.join(repr(k) for k in flat)} contain dots. A spec is nested dicts, not "
        f"flat dotted keys: write {json.dumps(nested, ensure_ascii=False)} instead of "
        f"{json.dumps(wrong, ensure_ascii=False)}. Dotted paths belong only in inputs= / outputs=."
    )


def _check_path_syntax(path: Any, where: str) -> str:
    if not isinstance(path, str) or not path:
        raise ValueError(f"{where}: expected a non-empty dotted path string, got {path!r}")
    try:
        parse_dotted(path)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return path


def _check_input_uri(uri: Any, where: str) -> None:
    if not isinstance(uri, str) or not uri:
        raise ValueError(f"{where}: expected a URI or absolute path string, got {uri!r}")
    if uri.startswith("s3://"):
        bucket, _key = uri[5:].partition("/")[::2]
        if not _S3_BUCKET.fullmatch(bucket) or ".." in _key.split("/"):  # '..': mapped to a path, it climbs
            raise ValueError(f"{where}: {uri!r} is not a valid s3://bucket/key URI (without '..' key segments)")
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


def unique_names(keys: Sequence[str], mode: str, param: str) -> None:
    seen: dict[str, str] = {}
    for key in keys:
        name = output_dir_name(key, mode)
        if name in seen:
            raise ValueError(
                f"{param}: {seen[name]!r} and {key!r} would both be stored as '{name}/' in the results dir; rename one"
            )
        seen[name] = key


def resolve_mode(mode: str | None, specs: Any, args: Any) -> str:
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


def check_command(command: Any, mode: str) -> str | list[str]:
    if isinstance(command, str):
        if not command.strip():
            raise ValueError("command: empty command")
        cmd: str | list[str] = check_exec_text(command, "command")
        texts = [command]
    elif isinstance(command, Sequence) and not isinstance(command, bytes):
        cmd = [
            check_exec_text(c, _where("command", i)) if isinstance(c, str) else _bad_arg(c, i)
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


def _check_config_decl(spec: dict[str, Any], inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    for key, cfg in inputs.items():
        where = _where("inputs", key)
        value = get_path(spec, key)
        if value is MISSING:
            raise ValueError(
                f"{where}: {key!r} is not a path in specs. inputs name dotted paths into the nested spec (the URI "
                f"lives in the spec at that path); add it to specs or drop it from inputs"
            )
        _check_input_value(value, where)
        if cfg.get("container_path") is not None:
            _container_path(cfg["container_path"], _where(where, "container_path"))
    for key, cfg in outputs.items():
        where = _where("outputs", key)
        parts = parse_dotted(key)
        parent = spec if len(parts) == 1 else get_path(spec, _join(parts[:-1]))
        leaf = parts[-1]
        ok = (isinstance(parent, dict) and isinstance(leaf, str)) or (
            isinstance(parent, list) and isinstance(leaf, int) and leaf < len(parent)
        )
        if not ok:
            raise ValueError(
                f"{where}: the spec has no section for {key!r}; outputs name dotted paths into the nested spec"
            )
        value = get_path(spec, key)
        _check_output_value(None if value is MISSING else value, where)
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
    tokens = args_tokens(probe)
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


def check_passthrough(inputs: Any, outputs: Any) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
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


def check_options(config_format: Any, upload_excludes: Any, mount_path: Any) -> tuple[str, list[str]]:
    """``(config format lower-cased, upload_excludes)``; ``mount_path`` must be absent or absolute.

    :param config_format: ``yaml``, ``toml`` or ``json``.
    :param upload_excludes: fnmatch patterns, or None.
    :param mount_path: the shared cache root inside the job, or None.
    """
    if not isinstance(config_format, str) or config_format.lower() not in CONFIG_FORMATS:
        raise ValueError(f"config_format: {config_format!r} is not one of {', '.join(CONFIG_FORMATS)}")
    if mount_path is not None and (not isinstance(mount_path, str) or not os.path.isabs(mount_path)):
        raise ValueError(f"mount_path: must be an absolute path inside the job, got {mount_path!r}")
    if upload_excludes is None:
        return config_format.lower(), []
    if isinstance(upload_excludes, str) or not isinstance(upload_excludes, Sequence):
        raise ValueError(f"upload_excludes: give a list of fnmatch patterns, e.g. ['*.tmp'], not {upload_excludes!r}")
    for i, pattern in enumerate(upload_excludes):
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"upload_excludes[{i}]: patterns must be non-empty strings, got {pattern!r}")
    return config_format.lower(), list(upload_excludes)


def check_config(
    specs: Any, inputs: Any, outputs: Any, fmt: str
) -> tuple[dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]:
    """Config mode: ``(spec, inputs, outputs)``, normalised; the spec is a fresh JSON-safe tree.

    :param specs: the nested spec.
    :param inputs: dotted paths (list, or ``{path: options}``).
    :param outputs: dotted paths (list, or ``{path: options}``).
    :param fmt: the config format (TOML cannot hold ``None`` except at declared outputs).
    """
    if not isinstance(specs, Mapping):
        raise ValueError(f"specs: expected a dict (the nested spec), got {type(specs).__name__}")
    spec_tree: dict[str, Any] = _normalize(specs, "specs", set())
    _reject_flat_keys(spec_tree)
    in_decl = _keyed(inputs, "inputs", _INPUT_OPTIONS)
    out_decl = _keyed(outputs, "outputs", _OUTPUT_OPTIONS)
    _check_config_decl(spec_tree, in_decl, out_decl)
    if fmt == "toml":
        _check_toml(spec_tree, set(out_decl))
    return spec_tree, in_decl, out_decl


def check_args_mode(
    cmd: str | list[str], args: Any, inputs: Any, outputs: Any
) -> tuple[dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]:
    """Args mode: ``(args, inputs, outputs)``, normalised; the command line must stay within Linux's limits.

    :param cmd: the checked command.
    :param args: flat ``{name: value}``.
    :param inputs: arg names whose values are URIs to stage.
    :param outputs: arg names whose values are output folders.
    """
    arg_map = _check_args(args)
    in_decl = _keyed(inputs, "inputs", _INPUT_OPTIONS)
    out_decl = _keyed(outputs, "outputs", _OUTPUT_OPTIONS)
    _check_args_decl(arg_map, in_decl, out_decl)
    _check_args_size(cmd, arg_map, out_decl)
    return arg_map, in_decl, out_decl
