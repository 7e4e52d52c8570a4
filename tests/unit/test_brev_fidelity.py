"""What the real ``brev`` CLI (brevdev/brev-cli v0.6.327) and the programs it runs do, against the Brev platform's
session and rules: OpenSSH's alias resolution from a private HOME, the Kubernetes service-account token brev prefers
to its credentials file, API-key credentials, and the CLI's words for a bad instance type or a network error.

The ssh resolution is the real OpenSSH client's (``ssh -G``, and ``scp`` with the fake's resolving shim as its ssh
program), exactly as the fake ``brev`` resolves an alias (``tests/brevfake/instances.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_provider_tao.hooks.brev_cli import BrevSession
from tests.brevfake import instances

TOKEN = "brev-secret-token-0123456789"


def _session(tmp_path: Path, token: str = TOKEN, org: str | None = None, **kwargs: str) -> BrevSession:
    BrevSession._states.clear()
    return BrevSession(
        executable=str(tmp_path / "brev"), token=token, org=org, identity="c", home_root=tmp_path / "homes", **kwargs
    )


def _brev_refresh(home: Path, alias: str, ip: str) -> None:
    """What ``brev refresh`` writes (pkg/ssh/sshconfigurer.go): ``~/.brev/ssh_config`` with the alias, and an
    ``Include`` of it at the top of ``~/.ssh/config`` -- both under ``$HOME``."""
    (home / ".brev").mkdir(exist_ok=True)
    (home / ".brev" / "ssh_config").write_text(
        f'Host {alias}\n  Hostname {ip}\n  IdentityFile "{home}/.brev/brev.pem"\n  User ubuntu\n'
        "  ControlMaster auto\n  ControlPath ~/.ssh/brev-control-%C\n  ControlPersist 10m\n"
    )
    (home / ".ssh").mkdir(mode=0o700, exist_ok=True)
    (home / ".ssh" / "config").write_text(f'Include "{home}/.brev/ssh_config"\n')


def test_ssh_and_scp_run_by_brev_find_the_alias_it_wrote_in_the_private_home(tmp_path: Path) -> None:
    session = _session(tmp_path)
    session.login()
    env = session.environment()
    _brev_refresh(session.home, "my-gpu", "10.9.8.7")
    # OpenSSH reads the passwd home's config, not $HOME's: a bare `ssh` does not know the alias
    bare = {**env, "PATH": os.environ["PATH"]}
    assert instances.openssh_resolve(["my-gpu"], bare)["hostname"] == "my-gpu"
    # brev exec (bash -c "... ssh ...") and its readiness probe (exec.Command("ssh", ...)): the ssh on PATH
    resolved = instances.openssh_resolve(["-T", "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR", "my-gpu"], env)
    assert resolved["hostname"] == "10.9.8.7"
    # the multiplexing sockets stay in the private HOME, never in the worker user's ~/.ssh
    assert resolved["controlpath"].startswith(f"{session.home}/")
    # brev copy: exec.Command("scp", ...), whose ssh is /usr/bin/ssh (not PATH's): it must get -F from scp
    assert instances.scp_resolve("my-gpu", upload=True, env=env)["hostname"] == "10.9.8.7"
    assert instances.scp_resolve("my-gpu", upload=True, env=bare)["hostname"] == "my-gpu"


@pytest.mark.parametrize("program", ["ssh", "scp"])
def test_the_wrappers_hold_no_secret_and_only_their_user_reads_them(tmp_path: Path, program: str) -> None:
    session = _session(tmp_path)
    session.login()
    wrapper = session.home / ".tao-bin" / program
    assert wrapper.stat().st_mode & 0o777 == 0o700
    assert TOKEN not in wrapper.read_text()
