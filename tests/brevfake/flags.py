"""Command-line parsing as cobra + spf13/pflag do it, with their error texts.

Flags may appear anywhere among the arguments (interspersed); ``--`` ends flag parsing and is dropped (so
``brev exec box -- echo hi`` has the positional arguments ``box echo hi``); ``--name=value`` and
``--name value`` both work, booleans take ``--flag=false`` but never a separate value; shorthands combine
(``-da``) and take values attached or separate (``-tX`` / ``-t X``); a lone ``-`` is positional.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .goerr import GoError


@dataclass(frozen=True)
class Flag:
    """One flag: its long name, shorthand, kind (``bool`` / ``str`` / ``int`` / ``float``) and default."""

    name: str
    short: str = ""
    kind: str = "str"
    default: Any = None

    def usage_name(self) -> str:
        return f"-{self.short}, --{self.name}" if self.short else f"--{self.name}"

    def convert(self, raw: str) -> Any:
        try:
            if self.kind == "bool":
                return _parse_bool(raw)
            if self.kind == "int":
                return int(raw, 0) if raw.lower().startswith(("0x", "0o", "0b")) else int(raw)
            if self.kind == "float":
                return float(raw)
        except ValueError:
            parser = {"bool": "ParseBool", "int": "ParseInt", "float": "ParseFloat"}[self.kind]
            raise GoError(
                f'invalid argument "{raw}" for "{self.usage_name()}" flag: '
                f'strconv.{parser}: parsing "{raw}": invalid syntax'
            ) from None
        return raw


GLOBAL_FLAGS = (
    Flag("help", "h", "bool", False),
    Flag("user", "", "str", ""),
    Flag("version", "", "bool", False),
    Flag("no-check-latest", "", "bool", False),
)


def _parse_bool(raw: str) -> bool:
    if raw in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if raw in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(raw)


def parse(args: list[str], flags: tuple[Flag, ...]) -> tuple[dict[str, Any], list[str], set[str]]:
    """``(values by long name, positional arguments, names of the flags that were set)``."""
    every = flags + GLOBAL_FLAGS
    by_name = {f.name: f for f in every}
    by_short = {f.short: f for f in every if f.short}
    values: dict[str, Any] = {f.name: f.default for f in every}
    changed: set[str] = set()
    positional: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg == "--":
            positional.extend(args[index:])
            break
        if arg.startswith("--"):
            name, has_value, raw = arg[2:].partition("=")
            flag = by_name.get(name)
            if flag is None:
                raise GoError(f"unknown flag: --{name}")
            if not has_value and flag.kind != "bool":
                if index >= len(args):
                    raise GoError(f"flag needs an argument: --{name}")
                raw, index = args[index], index + 1
            values[flag.name] = flag.convert(raw if has_value or flag.kind != "bool" else "true")
            changed.add(flag.name)
        elif arg.startswith("-") and arg != "-":
            shorts = arg[1:]
            while shorts:
                letter, shorts = shorts[0], shorts[1:]
                flag = by_short.get(letter)
                if flag is None:
                    raise GoError(f"unknown shorthand flag: '{letter}' in {arg}")
                if flag.kind == "bool":
                    if shorts.startswith("="):
                        values[flag.name], shorts = flag.convert(shorts[1:]), ""
                    else:
                        values[flag.name] = True
                else:
                    raw = shorts[1:] if shorts.startswith("=") else shorts
                    if not raw:
                        if index >= len(args):
                            raise GoError(f"flag needs an argument: '{letter}' in -{letter}")
                        raw, index = args[index], index + 1
                    values[flag.name], shorts = flag.convert(raw), ""
                changed.add(flag.name)
        else:
            positional.append(arg)
    return values, positional, changed
