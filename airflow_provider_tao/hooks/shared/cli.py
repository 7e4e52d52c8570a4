"""Calling a platform's command-line tool from a hook: one way, used by every platform that drives a CLI.

Every call runs with stdin from ``/dev/null`` (several CLIs read names or answers from a piped stdin until EOF, and
prompt when they think a human is there), a timeout after which the whole process group is killed (a CLI that
spawns ``ssh`` leaves nothing behind), an environment the hook chooses (a private ``HOME`` so the CLI's state is
never the worker user's own), and stdout and stderr captured separately. Nothing secret belongs on ``argv``: every
user of the machine can read it in ``/proc/<pid>/cmdline``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: How much of a CLI's output an error message quotes.
QUOTE_CHARS = 2000


class CliNotFoundError(FileNotFoundError):
    """The executable is not there (or not executable)."""


@dataclass(frozen=True)
class CliResult:
    """What one CLI call did.

    :param argv: the command line (it never holds a secret).
    :param returncode: the exit code; None when the call timed out and was killed.
    :param stdout: standard output, bytes as written.
    :param stderr: standard error, decoded.
    :param seconds: how long it took.
    """

    argv: tuple[str, ...]
    returncode: int | None
    stdout: bytes
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")

    def describe(self) -> str:
        """One line for an error message: the subcommand, how it ended and what it said."""
        said = (self.stderr.strip() or self.text.strip())[-QUOTE_CHARS:]
        ended = f"timed out after {self.seconds:.0f} s" if self.timed_out else f"exited {self.returncode}"
        return f"`{' '.join(self.argv[:2])}` {ended}" + (f": {said}" if said else "")


#: Variables that hold secrets although their names do not say so to Airflow's masker.
_SECRET_VARIABLES = frozenset({"NGC_KEY", "NGC_API_KEY", "NGC_CLI_API_KEY", "SSH_AUTH_SOCK"})
#: Prefixes of Airflow's own variables: connections, variables, every setting (the Fernet key, database URLs).
_AIRFLOW_PREFIXES = ("AIRFLOW_CONN_", "AIRFLOW_VAR_", "AIRFLOW__")


def cli_environment(**overrides: str) -> dict[str, str]:
    """The worker's environment for a CLI without anything secret in it: Airflow's connections, variables and
    settings, and every variable Airflow's masker calls sensitive (``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``,
    ``*API_KEY*``, ...) are left out -- a third-party CLI and the ssh it spawns get what they need, which the hook
    hands over in files and ``overrides``, never the worker's secrets.

    :param overrides: variables to set (a private ``HOME``, ...).
    """
    from airflow.sdk._shared.secrets_masker import should_hide_value_for_key

    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(_AIRFLOW_PREFIXES) and key not in _SECRET_VARIABLES and not should_hide_value_for_key(key)
    }
    return env | overrides


def run_cli(
    argv: Sequence[str], *, env: Mapping[str, str], timeout: float, cwd: str | os.PathLike[str] | None = None
) -> CliResult:
    """Run ``argv`` to its end or until ``timeout`` seconds pass (then kill its process group).

    :param argv: the executable and its arguments.
    :param env: the complete environment of the call.
    :param timeout: seconds before the call and everything it started are killed.
    :param cwd: the working folder (default: the caller's).
    """
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,  # its own process group: a timeout kills the ssh it spawned as well
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        raise CliNotFoundError(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from exc
    try:
        out, err = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, err = proc.communicate()
        code = None
    except BaseException:  # interrupted (a killed task): leave nothing running
        _kill_group(proc.pid)
        proc.wait()
        raise
    return CliResult(tuple(argv), code, out, err.decode(errors="replace"), time.monotonic() - started)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def private_folder(path: Path) -> Path:
    """``path`` as a folder only this user can enter (0700), created if missing (its parent must exist).

    Refuses a folder that is a symlink or owned by someone else, and closes one open to group or others: a CLI's
    credentials and ssh keys are kept there.
    """
    path.mkdir(mode=0o700, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PermissionError(
            f"{path} is not a folder of this user (uid {os.getuid()}): refusing to keep secrets there"
        )
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def write_private_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, readable by this user only (0600) from its first byte on."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as file:
        os.fchmod(fd, 0o600)  # the mode of open() is masked by the umask
        file.write(data)
    os.replace(temp, path)
