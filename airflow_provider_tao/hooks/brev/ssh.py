"""The ``ssh`` and ``scp`` the ``brev`` CLI runs in a private HOME: they must find the aliases brev writes there.

``brev exec`` runs ``bash -c "... ssh -T ... <alias> '<command>'"`` and ``brev copy`` runs ``scp [-r] <local>
<alias>:<remote>`` (brevdev/brev-cli v0.6.327, ``pkg/cmd/exec/exec.go`` ``runSSHWithTimeout``,
``pkg/cmd/copy/copy.go`` ``runSCP``). The alias lives in ``$HOME/.brev/ssh_config``, included from
``$HOME/.ssh/config`` (Go's home is ``$HOME``). OpenSSH reads the user config from the passwd home
(``getpwuid()->pw_dir``), never from ``$HOME``: with the session's private HOME the alias is unknown and every exec
fails with "Could not resolve hostname".

So the session puts two small wrappers first on the CLI's ``PATH`` (``<home>/.tao-bin/ssh`` and ``scp``, where brev
looks them up): each runs the real program with ``-F <home>/.tao-ssh-config``, a config that includes the private
HOME's ``~/.ssh/config`` (brev's aliases) and then the system's ``/etc/ssh/ssh_config`` (which ``-F`` would
otherwise skip). ``scp`` needs its own wrapper: it runs ``/usr/bin/ssh`` (its compiled-in path), not the one on
PATH, and passes its ``-F`` on. Nothing of the worker user's ``~/.ssh`` is read or written: brev's
``ControlPath ~/.ssh/brev-control-%C`` would put the multiplexing sockets in the passwd home (shared by every
connection of the worker), so the config sets the ControlPath inside the private HOME first (the first value wins).
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

from airflow_provider_tao.hooks.shared.cli import private_folder, write_private_file

BIN_DIR = ".tao-bin"
CONFIG = ".tao-ssh-config"
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
PROGRAMS = ("ssh", "scp")


def search_path(home: Path, path: str) -> str:
    """The ``PATH`` of the CLI's calls: the wrappers' folder first, then ``path``."""
    return os.pathsep.join(part for part in (str(home / BIN_DIR), path) if part)


def install(home: Path, path: str) -> None:
    """Write the wrappers and their config into ``home`` (a private folder). A program not found on ``path`` gets
    no wrapper (brev then says it is missing)."""
    bin_dir = private_folder(home / BIN_DIR)
    config = home / CONFIG
    text = (
        "# airflow-provider-tao: brev's aliases from this private HOME (OpenSSH reads the passwd home's otherwise)\n"
        f'ControlPath "{home}/.ssh/cm-%C"\n'
        f'Include "{home}/.ssh/config"\n'
        f"Include {SYSTEM_CONFIG}\n"
    )
    write_private_file(config, text.encode())
    for program in PROGRAMS:
        real = shutil.which(program, path=path)
        if real is None:
            continue
        wrapper = bin_dir / program
        script = f'#!/bin/sh\nexec {shlex.quote(real)} -F {shlex.quote(str(config))} "$@"\n'
        write_private_file(wrapper, script.encode())
        os.chmod(wrapper, 0o700)
