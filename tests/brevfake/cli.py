"""Entry point of the fake ``brev``: finds the command as cobra does, runs it, prints a failure the way brev-cli's
``main`` does (the error's cause alone on stderr, yellow for validation errors and red otherwise when stdout is a
terminal, nothing coloured otherwise) and exits 0 or 1 -- or 2 with a goroutine trace when the real CLI panics
(``brev copy``'s ssh probe on output without a newline). Every call is appended to the
world's invocation log (argv, pid, HOME, start and end time, exit code, the instances it targeted).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time
import traceback
from typing import Any

from .client import VERSION, Session
from .commands import COMMANDS, Context, Io
from .flags import GLOBAL_FLAGS, parse
from .goerr import GoError, GoPanic
from .world import World, jwt_claims

ROOT_USAGE = """brev client for managing instances

Usage:
  brev [command]

Commands:
  copy, create, delete, exec, login, logout, ls, refresh, search, set, start, stop

Flags:
  -h, --help              Help for Brev
      --no-check-latest   Do not check for the latest version when printing version
      --user string       Non root user to use for per user configuration of commands run as root
      --version           Print version output
"""


def _is_char_device(fd: int) -> bool:
    try:
        return stat.S_ISCHR(os.fstat(fd).st_mode)
    except OSError:
        return True


LOGGED_OUTPUT = 32 * 1024  # the last bytes of stdout / stderr kept in the invocation log


def _writer(fd: int, kept: bytearray) -> Any:
    def write(data: bytes) -> None:
        kept.extend(data)
        del kept[:-LOGGED_OUTPUT]
        try:
            while data:
                data = data[os.write(fd, data) :]
        except BrokenPipeError:
            pass

    return write


def make_io(out: bytearray, err: bytearray) -> Io:
    return Io(
        stdout_piped=not _is_char_device(1),
        stdin_piped=not _is_char_device(0),
        color=os.isatty(1) and os.environ.get("TERM") != "dumb" and "NO_COLOR" not in os.environ,
        write_out=_writer(1, out),
        write_err=_writer(2, err),
        read_in=sys.stdin.buffer.read,
    )


def credentials_seen(home: str) -> dict[str, Any]:
    """What ``$HOME/.brev/credentials.json`` held when the call started (its kind and mtime, never a token)."""
    path = os.path.join(home, ".brev", "credentials.json")
    try:
        mtime = os.stat(path).st_mtime
        with open(path) as handle:
            tokens = json.load(handle)
    except (OSError, ValueError):
        return {"state": "missing" if not os.path.exists(path) else "unreadable", "mtime": None}
    if str(tokens.get("api_key", "")).startswith("bak-"):
        state = "apikey"
    elif tokens.get("access_token") == "auto-login":
        state = "auto-login"
    elif jwt_claims(str(tokens.get("access_token", ""))) is not None:
        state = "jwt"
    else:
        state = "other"
    return {"state": state, "mtime": mtime}


def find_command(args: list[str]) -> tuple[str, list[str]]:
    """The subcommand (first argument that is not a root flag or a root flag's value) and the other arguments."""
    valued = {f"--{f.name}" for f in GLOBAL_FLAGS if f.kind != "bool"}
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            break
        if not arg.startswith("-") or arg == "-":
            return arg, args[:index] + args[index + 1 :]
        index += 2 if arg in valued else 1
    return "", args


def resolve(name: str) -> str:
    for command, (_, _, aliases) in COMMANDS.items():
        if name == command or name in aliases:
            return command
    suggestions = [c for c in COMMANDS if _distance(name, c) <= 2 or c.startswith(name)]
    hint = "".join(f"\t{c}\n" for c in suggestions)
    raise GoError(f'unknown command "{name}" for "brev"' + (f"\n\nDid you mean this?\n{hint}" if hint else ""))


def _distance(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def run(io: Io, world: World, home: str, args: list[str], record: dict[str, Any]) -> None:
    session = Session(world, home, io.out)
    session.startup_notice()
    name, rest = find_command(args)
    if not name:
        values, _, _ = parse(rest, ())
        if values["version"]:
            io.out(f"Current Version: {VERSION}\n")
        else:
            io.err(ROOT_USAGE)
        return
    command = resolve(name)
    record["command"] = command
    handler, flags, _ = COMMANDS[command]
    values, positional, _ = parse(rest, flags)
    if values["help"]:
        io.out(f"Usage:\n  brev {command} [flags]\n")
        return
    context = Context(io=io, world=world, session=session)
    try:
        handler(context, values, positional)
    finally:
        record["targets"] = context.targets
        if command == "exec":
            record["ssh_agents_started"] = context.ssh_agents_started


def print_error(io: Io, error: GoError) -> None:
    """``cmderrors.DisplayAndHandleError``: the cause, yellow for validation errors, red for the others."""
    sneaky = "unknown flag:" in error.full or "unknown command" in error.full
    io.err((io.yellow if error.validation or sneaky else io.red)(error.cause) + "\n")


def main() -> int:
    args = sys.argv[1:]
    out, err = bytearray(), bytearray()
    io = make_io(out, err)
    state_dir = os.environ.get("BREV_FAKE_STATE", "")
    if not state_dir or not World(state_dir).exists():
        io.err(f"brevfake: BREV_FAKE_STATE must name a fake Brev world (got {state_dir!r})\n")
        return 1
    world = World(state_dir)
    home = os.environ.get("HOME") or os.path.expanduser("~")
    record: dict[str, Any] = {
        "pid": os.getpid(),
        "argv": ["brev", *args],
        "home": home,
        "start": time.time(),
        "credentials": credentials_seen(home),
    }
    world.log_call({**record, "event": "start"})

    def ended(code: int | None) -> dict[str, Any]:
        output = {"stdout": out.decode(errors="replace"), "stderr": err.decode(errors="replace")}
        return {**record, **output, "event": "end", "end": time.time(), "exit": code}

    def on_signal(number: int, _frame: Any) -> None:
        world.log_call({**ended(None), "signal": number})
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = 1
    try:
        run(io, world, home, args, record)
        code = 0
    except GoError as error:
        print_error(io, error)
    except GoPanic as panic:  # the runtime's exit: trace on stderr, status 2
        io.err(panic.trace())
        code = 2
    except Exception as bug:  # a fault of the fake itself, never a behaviour of the real CLI
        io.err(f"brevfake: internal error: {bug!r}\n{traceback.format_exc()}")
    finally:
        world.log_call(ended(code))
    return code
