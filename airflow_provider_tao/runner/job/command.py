"""The user's command: its argv (placeholders replaced literally, args as separate tokens) and its run as a process
group whose output is passed through, whose signals are forwarded, and whose leftovers are stopped."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import threading
import time
from typing import IO, TYPE_CHECKING, Any

from .errors import ConfigError
from .progress import StepWatcher, Ticker
from .tuning import env_float

if TYPE_CHECKING:  # pragma: no cover - typing only
    from collections.abc import Mapping, Sequence

    from .progress import Reporter

#: The only placeholders replaced in the user command (literal substring replacement, never ``str.format``).
PLACEHOLDERS = ("{config_path}", "{results_dir}", "{job_id}")
# Forwarded to the command's whole process group: a cancel stops every process the command started.
GROUP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FORWARDED_SIGNALS = (*GROUP_SIGNALS, signal.SIGUSR1, signal.SIGUSR2)


def replace_placeholders(text: str, values: Mapping[str, str], quote: bool) -> str:
    """Replace the documented placeholders by literal substring replacement (never ``str.format``).

    :param text: a command string or argv element.
    :param values: placeholder -> value.
    :param quote: shell-quote values that need it (string commands run by bash).
    """
    for placeholder, value in values.items():
        if placeholder in text:
            text = text.replace(placeholder, shlex.quote(value) if quote else value)
    return text


def args_tokens(args: Mapping[str, Any]) -> list[str]:
    """Args mode: ``{"lr": 0.1, "amp": True, "tags": ["a", "b"]}`` -> ``["--lr", "0.1", "--amp", "--tags", "a",
    "--tags", "b"]``. ``False`` / ``None`` are omitted; dicts are passed as compact JSON.

    :param args: flat mapping of argument name -> value.
    """
    tokens: list[str] = []
    for key, value in args.items():
        flag = key if key.startswith("-") else "--" + key
        for item in value if isinstance(value, list) else [value]:
            if item is None or item is False:
                continue
            if item is True:
                tokens.append(flag)
            elif isinstance(item, (dict, list)):
                tokens.extend([flag, json.dumps(item, separators=(",", ":"), ensure_ascii=False)])
            elif isinstance(item, float):
                tokens.extend([flag, repr(item)])
            else:
                tokens.extend([flag, str(item)])
    return tokens


def build_argv(command: Any, values: Mapping[str, str], tokens: Sequence[str]) -> list[str]:
    """The command as argv: a string under exactly one ``/bin/bash -c``, a list as is; args tokens appended.

    :param command: runner.json's ``command``.
    :param values: placeholder -> value.
    :param tokens: args-mode tokens (see :func:`args_tokens`).
    """
    if isinstance(command, str):
        script = replace_placeholders(command, values, quote=True)
        if tokens:
            script = script.rstrip() + " " + " ".join(shlex.quote(t) for t in tokens)
        return ["/bin/bash", "-c", script]
    if isinstance(command, list) and command and all(isinstance(c, str) for c in command):
        return [replace_placeholders(c, values, quote=False) for c in command] + list(tokens)
    raise ConfigError("runner.json: command must be a string or a list of strings")


def run_process(argv: Sequence[str], env: Mapping[str, str], reporter: Reporter) -> int:
    """Run the command, forwarding its output and signals; returns its exit code (128+N for signal N).

    :param argv: what to run.
    :param env: its environment.
    :param reporter: where its output and the run's progress lines go.
    """
    watcher = StepWatcher(reporter)
    reporter.progress("run", status="starting")
    _reset_inherited_signals()
    try:
        # Its own process group: a background process it leaves behind (``tensorboard &``) can be found and
        # stopped, and a cancel reaches every process of the command, not only the first one.
        proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as exc:
        raise ConfigError(f"cannot start the command: {exc}") from None
    previous = {}

    def forward(signum: int, _frame: Any) -> None:
        with contextlib.suppress(OSError):
            if signum in GROUP_SIGNALS:
                os.killpg(proc.pid, signum)
            else:  # SIGUSR1/2 ask the trainer for something (a checkpoint); helpers would die of them
                proc.send_signal(signum)

    for sig in FORWARDED_SIGNALS:
        with contextlib.suppress(ValueError, OSError):
            previous[sig] = signal.signal(sig, forward)
    pumps = [
        threading.Thread(target=_pump, args=(proc.stdout, reporter, True, watcher), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, reporter, False, watcher), daemon=True),
    ]
    for pump in pumps:
        pump.start()
    with Ticker(reporter.interval, watcher.heartbeat):
        rc = proc.wait()
        _drain(pumps, env_float("TAO_RUNNER_DRAIN_SECONDS", 5.0))
    stopped = _stop_group(proc.pid)
    _drain(pumps, 1.0)
    if stopped:
        reporter.info(f"stopped {stopped} background process(es) the command left running")
    if any(pump.is_alive() for pump in pumps):
        # A process that left the group (setsid) still holds the pipe: its output is no longer shown.
        reporter.warn("a process outside the command's group still holds its output; not waiting for it")
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    rc = 128 - rc if rc < 0 else rc
    watcher.emit(final=True, exit_code=rc)
    return rc


def _reset_inherited_signals() -> None:
    """Undo a stop signal blocked or ignored by whoever started the runner, before the command inherits it.

    A blocked mask and an ignored disposition both survive ``exec``: a runner started by a parent that blocked
    SIGTERM (a Python thread's mask, some container inits) would start a command no cancel reaches, and would not
    hear the cancel itself. Only SIGTERM, the signal every platform's stop sends, loses an ignore: ``nohup`` or a
    shell's ``&`` ignore SIGHUP / SIGINT on purpose.
    """
    with contextlib.suppress(ValueError, OSError):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _drain(pumps: Sequence[threading.Thread], seconds: float) -> None:
    """Wait up to ``seconds`` in all for the output readers to reach the end of their pipes."""
    deadline = time.monotonic() + seconds
    for pump in pumps:
        pump.join(max(0.0, deadline - time.monotonic()))


def _stop_group(pgid: int) -> int:
    """Stop what is left of the command's process group (TERM, then KILL after a grace); returns how many."""
    left = _group_members(pgid)
    if not left:
        return 0
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + env_float("TAO_RUNNER_KILL_GRACE", 5.0)
    while _group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)
    return len(left)


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of group ``pgid``; from /proc, so an orphan reaped by nobody is not counted."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses, so split after the last ")"
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def _pump(stream: IO[bytes] | None, reporter: Reporter, is_out: bool, watcher: StepWatcher) -> None:
    if stream is None:
        return
    fd = stream.fileno()
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        reporter.forward(data, is_out)
        watcher.feed(data, is_out)
    stream.close()
