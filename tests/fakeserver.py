"""How the fake API servers (``tests.kubefake``, ``tests.leptonfake``) run as processes of their own, and stop.

Server side: :func:`hold_stop_signals` before any thread starts, :func:`announce_ready` once it answers,
:func:`wait_for_stop_signal`, clean up, then
:func:`exit_process`. SIGTERM / SIGINT are taken with ``sigwait``: no Python handler runs in the middle of the main
thread's own locking (a handler setting an Event once left a fake deaf to SIGTERM), and SIGUSR1 prints every
thread's stack. Test side: :func:`stop_process` stops one and, if it does not stop, fails with those stacks.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def alive(pid: int) -> bool:
    """True while ``pid`` is a live (non-zombie) process."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def announce_ready(ready_file: str, info: dict[str, object]) -> None:
    """Write the ready file whole or not at all (a rename): the test side reads it as soon as it exists, and on a
    busy machine once read an empty file (the Kubernetes lane's every setup failed with a JSONDecodeError)."""
    partial = Path(f"{ready_file}.partial")
    partial.write_text(json.dumps(info))
    os.replace(partial, ready_file)


def hold_stop_signals() -> None:
    """Block SIGTERM / SIGINT (threads started later inherit the mask) and print the stacks on SIGUSR1."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def wait_for_stop_signal() -> None:
    """Return once SIGTERM or SIGINT has arrived (after :func:`hold_stop_signals`)."""
    signal.sigwait(STOP_SIGNALS)


def exit_process() -> NoReturn:
    """Exit now: the request threads of open watches are daemons, nothing is left to wait for."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def stop_process(proc: subprocess.Popen[bytes], log: Path, what: str, timeout: float = 60) -> None:
    """SIGTERM ``proc``; if it has not stopped within ``timeout`` s, its threads' stacks (SIGUSR1, written to
    ``log``) go into the AssertionError, after a SIGKILL."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
        proc.kill()
        proc.wait()
        raise AssertionError(f"{what} did not stop on SIGTERM:\n{log.read_text()[-6000:]}") from None
