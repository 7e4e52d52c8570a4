"""Writing the spec the command reads, as yaml, toml or json.

A well-kept writer is used when the job image has it -- PyYAML for YAML, ``tomli_w`` for TOML. Without them the
standard library must do (the runner promises to run on a bare ``python3 >= 3.8``): JSON is written for YAML (JSON
is valid YAML 1.2), and TOML comes from :func:`dumps_toml`, a small writer kept here because the standard library
only reads TOML (``tomllib``, and only from 3.11).
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    from collections.abc import Mapping

CONFIG_FORMATS = ("yaml", "toml", "json")

_TOML_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f"}
_YAML_BREAKS = re.compile("[\x85\u2028\u2029\ufeff]")


def _toml_str(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _toml_key(key: str) -> str:
    return key if _TOML_BARE_KEY.fullmatch(key) else _toml_str(key)


def _toml_value(value: Any, where: str) -> str:
    if value is None:
        raise ValueError(f"{where}: TOML has no null; give a value or use config_format='yaml'/'json'")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ValueError(f"{where}: NaN/Infinity are not allowed")
        return repr(value)
    if isinstance(value, str):
        return _toml_str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v, f"{where}[{i}]") for i, v in enumerate(value)) + "]"
    if isinstance(value, dict):
        items = ("{} = {}".format(_toml_key(k), _toml_value(v, f"{where}.{k}")) for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    raise ValueError(f"{where}: cannot write {type(value).__name__} to TOML")


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def dumps_toml(data: Mapping[str, Any]) -> str:
    """A TOML 1.0 document for nested dicts with the standard library only (round-trips through ``tomllib``).

    :param data: the spec.
    """
    lines: list[str] = []

    def table(tbl: Mapping[str, Any], keys: list[str]) -> None:
        where = ".".join(keys) or "spec"
        for key, value in tbl.items():
            if not isinstance(value, dict) and not _is_table_array(value):
                lines.append("{} = {}".format(_toml_key(key), _toml_value(value, f"{where}.{key}")))
        for key, value in tbl.items():
            if isinstance(value, dict):
                sub = [*keys, key]
                lines.append("")
                lines.append("[{}]".format(".".join(_toml_key(k) for k in sub)))
                table(value, sub)
        for key, value in tbl.items():
            if _is_table_array(value):
                sub = [*keys, key]
                for item in value:
                    lines.append("")
                    lines.append("[[{}]]".format(".".join(_toml_key(k) for k in sub)))
                    table(item, sub)

    table(data, [])
    return "\n".join(lines).lstrip("\n") + "\n"


def _has_yaml_breaks(node: Any) -> bool:
    if isinstance(node, str):
        return bool(_YAML_BREAKS.search(node))
    if isinstance(node, dict):
        return any(_has_yaml_breaks(k) or _has_yaml_breaks(v) for k, v in node.items())
    if isinstance(node, list):
        return any(_has_yaml_breaks(v) for v in node)
    return False


def _dumps_yaml(spec: Mapping[str, Any]) -> str | None:
    """YAML from PyYAML, or None when the image has no PyYAML."""
    try:
        import yaml
    except ImportError:
        return None
    # PyYAML emits NEL / LS / PS / BOM raw under allow_unicode and reads them back changed; escape then.
    text: str = yaml.safe_dump(
        spec, sort_keys=False, allow_unicode=not _has_yaml_breaks(spec), default_flow_style=False, width=2**31 - 1
    )
    return text


def _dumps_tomli_w(spec: Mapping[str, Any]) -> str | None:
    """TOML from ``tomli_w``, or None when the image has no ``tomli_w``."""
    try:
        import tomli_w
    except ImportError:
        return None
    try:
        text: str = tomli_w.dumps(spec)
    except TypeError as exc:  # tomli_w's word for "TOML cannot hold this" (None, objects)
        raise ValueError(str(exc)) from None
    return text


def dumps_spec(spec: Mapping[str, Any], fmt: str) -> tuple[str, str]:
    """Serialise the spec; returns ``(text, format actually written)``.

    YAML needs PyYAML; without it the JSON text is written instead (JSON is valid YAML 1.2). TOML uses ``tomli_w``
    when present, :func:`dumps_toml` otherwise.

    :param spec: the spec.
    :param fmt: ``yaml``, ``toml`` or ``json``.
    """
    if fmt == "toml":
        text = _dumps_tomli_w(spec)
        return (dumps_toml(spec) if text is None else text), "toml"
    if fmt == "yaml":
        text = _dumps_yaml(spec)
        if text is not None:
            return text, "yaml"
    return json.dumps(spec, indent=2, ensure_ascii=False, allow_nan=False) + "\n", "json"
