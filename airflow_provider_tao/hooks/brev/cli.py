"""The ``brev`` CLI as the Brev platform drives it: a private session per connection, and its errors as failure classes.

The session: every call runs in a private ``HOME`` (0700, one per connection and process) so the CLI's credentials,
its ssh config and keys are never the worker user's own ``~/.brev`` / ``~/.ssh``. The token never reaches a command
line: instead of ``brev login --token T`` (whose ``T`` every user of the worker can read in ``ps``), the session
writes the CLI's own credentials file, ``$HOME/.brev/credentials.json``, exactly as that login (or ``brev login
--api-key K --org-id O`` for an API key) does (:mod:`~airflow_provider_tao.hooks.brev.auth`; a worker whose
Kubernetes service-account token brev would use instead is told before any call). That write is the headless login
before the first call; when a call still answers with the logged-out prompt and ``EOF`` (cached credentials
desynchronise), the session writes it once more and repeats the call once. A second refusal is ``ERR_AUTH``.

The CLI's habits this module accounts for (brevdev/brev-cli, read from its source): any error exits 1 and is
written to stderr; with stdin not a terminal several commands read instance names from it until EOF (so stdin is
always ``/dev/null``); logged out, a command prompts on stdout and fails with ``EOF``; ``create`` tries each type
of a comma-separated chain in turn and says per type whether it is unknown or has no capacity; ``exec`` starts an
``ssh-agent`` of its own for every call unless ``SSH_AUTH_SOCK`` is set (the session points it at a socket that
does not exist: no agent is started, and the worker user's agent is never offered).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

from airflow_provider_tao.hooks.base import ConnectionProblem
from airflow_provider_tao.hooks.brev import auth as brev_auth
from airflow_provider_tao.hooks.brev import ssh as brev_ssh
from airflow_provider_tao.hooks.shared.cli import (
    CliNotFoundError,
    CliResult,
    cli_environment,
    private_folder,
    run_cli,
    write_private_file,
)
from airflow_provider_tao.jobs import ErrClass

#: Seconds of one call of each kind (``exec`` and ``copy`` get theirs from the caller).
LS_TIMEOUT = 60.0
CREATE_TIMEOUT = 300.0
DELETE_TIMEOUT = 120.0
SET_TIMEOUT = 60.0
#: How many times a ``brev copy`` that panicked is run (its probe crashes on an ssh blip), and the pause unit (s).
COPY_PANIC_TRIES = 4
COPY_PANIC_PAUSE = 2.0

_LOGGED_OUT = "You are currently logged out"
_AUTH_TEXT = re.compile(
    r"\b401\b|\bunauthori[sz]ed\b|invalid (?:refresh |access )?token|token (?:is )?expired|not logged in|"
    r"invalid_grant|please log ?in",
    re.IGNORECASE,
)
#: A type the org's listing does not know (``validateInstanceTypeAvailability``), or one it has no workspace group
#: for when the instance is created (``createWorkspace``: "invalid or unavailable", a configuration error).
_UNKNOWN_TYPE = re.compile(r'instance type "([^"]+)" is (?:not a recognized type|invalid or unavailable)')
_NO_CAPACITY = re.compile(r'instance type "([^"]+)" is currently unavailable \(no capacity\)')
_WORKER_FAILED = re.compile(r"\[Worker \d+\] (\S+) Failed: (.*)")
#: ``brev set``'s words for an org name it does not know (or knows twice).
_NO_ORG = re.compile(r"no orgs? (?:exist|found) with name|more than one org exist")
#: brev could not list the org's instance types (``newCreateContext`` only warns), so no type had a workspace group
#: (``createWorkspace``): the Brev API failed, nothing is known about capacity -- an outage, retried.
_LISTING_UNAVAILABLE = re.compile(r"instance-type listing was unavailable")
_CAPACITY_TEXT = re.compile(r"capacity|insufficient|unavailable|out of stock|quota", re.IGNORECASE)


class BrevError(RuntimeError):
    """A ``brev`` call failed; ``err_class`` says what kind of failure it is.

    :param err_class: ``ERR_AUTH``, ``ERR_CONFIG``, ``ERR_CAPACITY`` or ``ERR_INFRA`` (the CLI or the network).
    :param message: what happened and what to do.
    :param result: the failed call, if there was one.
    """

    def __init__(self, err_class: ErrClass, message: str, result: CliResult | None = None) -> None:
        super().__init__(message)
        self.err_class = err_class
        self.result = result


def connection_problem(exc: BrevError) -> ConnectionProblem:
    """The Test button's words for a ``brev`` call that failed: the token refused (``auth``), the CLI unable to run
    (``config``: no executable at ``brev_path``), the org the connection names missing (``not_found``: ``brev set``
    refused it), else the Brev API not answering (``unreachable``)."""
    if exc.err_class is ErrClass.ERR_AUTH:
        return ConnectionProblem("auth", str(exc))
    if exc.err_class is ErrClass.ERR_CONFIG:
        return ConnectionProblem("config" if exc.result is None else "not_found", str(exc))
    return ConnectionProblem("unreachable", f"{exc}; check the network and that the Brev API answers")


def go_panic(result: CliResult) -> str | None:
    """The panic line of a CLI that crashed (Go's runtime exits 2 with ``panic: ...`` and a goroutine trace; brev
    itself exits 0 or 1), or None. brev-cli v0.6.327 ``copy.go`` ``waitForSSHToBeAvailable`` panics on an ssh
    failure whose output has no newline: an outage to wait out, nothing about the instance or the job."""
    if result.returncode != 2:
        return None
    return next((line.strip() for line in result.stderr.splitlines() if line.startswith("panic: ")), None)


def is_logged_out(result: CliResult) -> bool:
    """The CLI's answer when its session is not valid: the login prompt (on stdout) and ``EOF``, or a 401-like
    refusal. A Go network error ends with ``EOF`` too (``Get "https://...": EOF``): only a last line that is
    ``EOF`` alone is the prompt's -- a network blip is an outage, never a refused token."""
    if result.ok:
        return False
    lines = result.stderr.strip().splitlines()
    if _LOGGED_OUT in result.text or (lines and lines[-1].strip() == "EOF"):
        return True
    return bool(_AUTH_TEXT.search(result.stderr))


def create_failure(result: CliResult, types: Sequence[str]) -> BrevError:
    """Why ``brev create`` made no instance, as a failure class: at least one type of the chain unknown or invalid
    -> ``ERR_CONFIG`` (a typo never fixes itself, no failover for it); no capacity -> ``ERR_CAPACITY``; else
    ``ERR_INFRA`` (first of all when brev could not list the types: the API failed, not the chain)."""
    said = f"{result.stderr}\n{result.text}"
    if _LISTING_UNAVAILABLE.search(said):
        return BrevError(
            ErrClass.ERR_INFRA,
            "brev could not list the org's instance types (GET api/instances/alltypesavailable failed), so it could "
            f"not create any; a Brev API outage, retried: {result.describe()}",
            result,
        )
    unknown = list(dict.fromkeys(_UNKNOWN_TYPE.findall(said)))
    full = list(dict.fromkeys(_NO_CAPACITY.findall(said)))
    full += [
        kind
        for kind, why in _WORKER_FAILED.findall(said)
        if _CAPACITY_TEXT.search(why) and not _UNKNOWN_TYPE.search(why) and kind not in full
    ]
    chain = ",".join(types) or "the CLI's default choice"
    if unknown:
        return BrevError(
            ErrClass.ERR_CONFIG,
            f"instance type(s) {', '.join(unknown)} of the chain {chain!r} are not Brev instance types "
            "(`brev search` lists them); fix instance_type on the tao_brev connection or in backend_details",
            result,
        )
    if full:
        return BrevError(
            ErrClass.ERR_CAPACITY,
            f"no capacity for any instance type of the chain {chain!r} ({', '.join(full)}); retry later or add "
            "types to the chain",
            result,
        )
    err_class = ErrClass.ERR_CONFIG if "name must" in said or "no organization" in said else ErrClass.ERR_INFRA
    return BrevError(err_class, f"brev create failed: {result.describe()}", result)


@dataclass
class _SessionState:
    """What the processes' sessions of one connection share: the login generation and its lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    generation: int = 0  # 0 = not logged in yet
    relogins: int = 0


class BrevSession:
    """Runs ``brev`` for one connection: private ``HOME``, credentials written by the session, one re-login.

    :param executable: the ``brev`` executable (a path, or a name looked up on ``PATH``).
    :param token: the Brev API token (never put on a command line).
    :param org: the org to work in (``brev set <org>`` once per session); None = the account's default.
    :param org_id: the id of the org of an API-key token (``bak-...``: brev stores it with the key).
    :param identity: what tells connections apart (the connection id); the token is part of the key too, so a
        changed token gets a fresh session.
    :param home_root: where the private homes live (default: ``<tmp>/tao-brev-<uid>``).
    :param cloudflared: a ``cloudflared`` executable for brev to use (an air-gapped worker's); None = the one the
        first ``brev refresh`` of the connection downloads, kept beside the homes for every later process.
    """

    _states: dict[str, _SessionState] = {}
    _states_lock = threading.Lock()

    def __init__(
        self,
        *,
        executable: str,
        token: str,
        org: str | None,
        identity: str,
        org_id: str | None = None,
        home_root: Path | None = None,
        cloudflared: str | None = None,
        log: Any = None,
    ) -> None:
        self.executable = executable
        self._token = token
        self.org = org
        self.org_id = org_id
        self.log = log or logging.getLogger(__name__)
        key = sha256(f"{identity}\n{executable}\n{org}\n{org_id}\n{token}".encode()).hexdigest()[:16]
        root = home_root or Path(tempfile.gettempdir()) / f"tao-brev-{os.getuid()}"
        self.home = root / f"{key}-{os.getpid()}"
        # brev's refresh (also run by copy and a failed exec) downloads cloudflared into ~/.brev when it is not
        # there: one copy per connection (not per process home), or the configured one.
        self.cloudflared = Path(cloudflared) if cloudflared else root / f"{key}-cloudflared"
        self._cloudflared_given = bool(cloudflared)
        with self._states_lock:
            self._state = self._states.setdefault(str(self.home), _SessionState())

    @property
    def relogins(self) -> int:
        """How many times this process re-logged in after a refused call (tests and logs)."""
        return self._state.relogins

    def environment(self) -> dict[str, str]:
        """The environment of every call: the worker's without its secrets (:func:`cli_environment`), with a
        private HOME (and XDG folders inside it) and the ``ssh`` / ``scp`` that find brev's aliases there first on
        ``PATH`` (:mod:`~airflow_provider_tao.hooks.brev.ssh`)."""
        home = str(self.home)
        env = cli_environment(
            HOME=home,
            XDG_CONFIG_HOME=f"{home}/.config",
            XDG_CACHE_HOME=f"{home}/.cache",
            XDG_DATA_HOME=f"{home}/.local/share",
            # `brev exec` starts an ssh-agent per call when none is set, and never stops it.
            SSH_AUTH_SOCK=f"{home}/no-agent",
        )
        env["PATH"] = brev_ssh.search_path(self.home, env.get("PATH", ""))
        return env

    # ----------------------------------------------------------------- login

    def login(self) -> None:
        """The headless login before the first call: write the CLI's credentials file (and select the org), once
        per process and session."""
        with self._state.lock:
            if not self._state.generation:
                self._login_locked()

    def _relogin(self, failed_generation: int) -> None:
        """After a refused call: log in again, unless another thread already did since that call started."""
        with self._state.lock:
            if self._state.generation != failed_generation:
                return
            self.log.warning("brev refused the session (logged out / EOF): logging in again, once")
            self._state.relogins += 1
            self._login_locked()

    def _login_locked(self) -> None:
        if problem := brev_auth.service_account_problem():
            raise BrevError(ErrClass.ERR_CONFIG, problem)
        if problem := brev_auth.token_problem(self._token):
            raise BrevError(ErrClass.ERR_AUTH, problem)
        try:
            credentials = brev_auth.credentials_for(self._token, self.org_id)
        except ValueError as exc:
            raise BrevError(
                ErrClass.ERR_CONFIG, f"{exc}: set org_id on the tao_brev connection (`brev ls orgs --json`)"
            ) from exc
        fresh = not self.home.exists()
        private_folder(self.home.parent)
        private_folder(self.home)
        if fresh:
            _sweep_dead_homes(self.home.parent)
            atexit.register(shutil.rmtree, self.home, True)
        private_folder(self.home / ".brev")
        self._link_cloudflared()
        brev_ssh.install(self.home, cli_environment().get("PATH", ""))
        write_private_file(self.home / ".brev" / "credentials.json", json.dumps(credentials, indent=2).encode())
        # An API key works in its own org (brev ignores the active org then): nothing to select.
        if self.org and "api_key" not in credentials and not (self.home / ".brev" / "active_org.json").exists():
            result = self._run(["set", self.org], SET_TIMEOUT)
            if is_logged_out(result):
                raise _auth_error(result)
            if not result.ok and _NO_ORG.search(result.stderr):
                raise BrevError(
                    ErrClass.ERR_CONFIG,
                    f"cannot select org {self.org!r}: {result.describe()}. Fix 'org' on the tao_brev connection",
                    result,
                )
            if not result.ok:  # the API or the network: nothing says the org is wrong
                raise BrevError(ErrClass.ERR_INFRA, f"selecting org {self.org!r} failed: {result.describe()}", result)
        self._state.generation += 1

    # ----------------------------------------------------------------- calls

    def _link_cloudflared(self) -> None:
        """``~/.brev/cloudflared`` -> the connection's cloudflared, when there is one: brev's
        ``DownloadCloudflaredBinaryIfItDNE`` then finds it (a symlink to a file exists for it) and downloads
        nothing."""
        if self._cloudflared_given and not self.cloudflared.is_file():
            raise BrevError(
                ErrClass.ERR_CONFIG,
                f"cloudflared_path {str(self.cloudflared)!r} on the tao_brev connection is not a file: install "
                "cloudflared there (brev uses it to reach proxied instances) or remove the setting",
            )
        link = self.home / ".brev" / "cloudflared"
        if self.cloudflared.is_file() and not link.exists():
            link.unlink(missing_ok=True)  # a dangling link
            link.symlink_to(self.cloudflared)

    def _keep_cloudflared(self) -> None:
        """After a call: a cloudflared brev downloaded into this process's home becomes the connection's."""
        downloaded = self.home / ".brev" / "cloudflared"
        if self._cloudflared_given or downloaded.is_symlink() or not downloaded.is_file() or self.cloudflared.exists():
            return
        partial = self.cloudflared.with_name(f".{self.cloudflared.name}.{os.getpid()}")
        shutil.copy2(downloaded, partial)
        os.replace(partial, self.cloudflared)  # atomic: another process sees all of it or nothing

    def _run(self, args: Sequence[str], timeout: float) -> CliResult:
        try:
            result = run_cli([self.executable, *args], env=self.environment(), timeout=timeout, cwd=self.home)
        except CliNotFoundError as exc:
            raise BrevError(
                ErrClass.ERR_CONFIG,
                f"{exc}. Install the brev CLI on the Airflow hosts or set brev_path on the tao_brev connection",
            ) from exc
        try:
            self._keep_cloudflared()
        except OSError as exc:  # best effort: the next process downloads it again
            self.log.warning("Keeping brev's cloudflared for the connection failed: %s", exc)
        return result

    def call(self, args: Sequence[str], timeout: float) -> CliResult:
        """Run ``brev <args>`` logged in; a refused session is re-logged once and the call repeated once. Returns
        the result whatever its exit code (the caller reads its errors); raises :class:`BrevError` (``ERR_AUTH``)
        when the session is refused twice, or ``ERR_CONFIG`` when the CLI cannot run."""
        self.login()
        generation = self._state.generation
        result = self._run(args, timeout)
        if not is_logged_out(result):
            return result
        self._relogin(generation)
        result = self._run(args, timeout)
        if is_logged_out(result):
            raise _auth_error(result)
        return result

    def check(self, args: Sequence[str], timeout: float, what: str) -> CliResult:
        """:meth:`call`, and a failed call is a :class:`BrevError` (``ERR_INFRA``: the CLI, the API or the
        network) naming ``what`` was attempted."""
        result = self.call(args, timeout)
        if not result.ok:
            raise BrevError(
                ErrClass.ERR_INFRA, f"{what} failed: {result.describe()}{_cloudflared_hint(result)}", result
            )
        return result

    # ----------------------------------------------------------------- commands

    def instances(self, timeout: float = LS_TIMEOUT) -> dict[str, dict[str, Any]]:
        """``brev ls --json``: the account's instances by name (``{"workspaces": null}`` is none)."""
        result = self.check(["ls", "--json"], timeout, "listing the instances (brev ls --json)")
        text = result.text
        # The CLI may print notices on stdout first (e.g. about the saved token at start-up): the JSON object is
        # the one that starts a line.
        start = 0 if text.startswith("{") else text.find("\n{") + 1
        try:
            listed, _ = json.JSONDecoder().raw_decode(text, start) if start >= 0 else (None, 0)
        except ValueError:
            listed = None
        if not isinstance(listed, dict):
            raise BrevError(ErrClass.ERR_INFRA, f"brev ls --json printed no JSON object: {text[:300]!r}", result)
        return {str(w.get("name")): w for w in (listed.get("workspaces") or []) if isinstance(w, dict)}

    def create(self, name: str, types: Sequence[str], startup_script: str) -> list[str]:
        """``brev create <name> [--type a,b] --detached --startup-script <script>``; a refusal is a
        :class:`BrevError` of the class :func:`create_failure` decides. Returns what the CLI said about the types
        it skipped (unknown, no capacity) before one worked."""
        args = ["create", name, "--detached"]
        if types:
            args += ["--type", ",".join(types)]
        if startup_script:
            args += ["--startup-script", startup_script]
        result = self.call(args, CREATE_TIMEOUT)
        if not result.ok:
            raise create_failure(result, types)
        return [line.removeprefix("Skipping: ").strip() for line in result.stderr.splitlines() if "Skipping:" in line]

    def delete(self, name: str) -> bool:
        """``brev delete <name>`` (no flags: the CLI has no ``--yes``). False when it was not there."""
        result = self.call(["delete", name], DELETE_TIMEOUT)
        if result.ok:
            return True
        if "not found" in result.stderr:
            return False
        raise BrevError(ErrClass.ERR_INFRA, f"deleting instance {name} failed: {result.describe()}", result)

    def exec(self, instance: str, command: str, timeout: float) -> CliResult:
        """``brev exec <instance> <command>``: the LAST argument is the one shell command, every other one an
        instance name. A failing command is re-run once by the CLI and its exit code is not passed through (0/1
        only): callers read what the command printed, never the exit code."""
        return self.call(["exec", instance, command], timeout)

    def copy(self, local: Path, instance: str, remote: str, timeout: float) -> None:
        """``brev copy <local> <instance>:<remote>`` (scp over the CLI's ssh alias; a relative remote path is
        relative to the instance user's home). A CLI that panicked (:func:`go_panic`: an ssh blip in its probe)
        said nothing about the instance: the copy is tried again after a pause, :data:`COPY_PANIC_TRIES` times."""
        args, what = ["copy", str(local), f"{instance}:{remote}"], f"copying {local.name} to {instance}"
        for attempt in range(1, COPY_PANIC_TRIES + 1):
            result = self.call(args, timeout)
            if result.ok:
                return
            panic = go_panic(result)
            if panic is None:
                raise BrevError(
                    ErrClass.ERR_INFRA, f"{what} failed: {result.describe()}{_cloudflared_hint(result)}", result
                )
            if attempt == COPY_PANIC_TRIES:
                raise BrevError(
                    ErrClass.ERR_INFRA, f"{what}: brev crashed {attempt} times ({panic}); a Brev or ssh outage", result
                )
            self.log.warning("%s: brev crashed (%s), an ssh blip in its probe; trying again", what, panic)
            time.sleep(COPY_PANIC_PAUSE * attempt)


def _auth_error(result: CliResult) -> BrevError:
    return BrevError(
        ErrClass.ERR_AUTH,
        f"Brev refused the token (logged out after a fresh login): {result.describe()}. Put a valid Brev API token "
        "in the password of the tao_brev connection (or BREV_API_TOKEN)",
        result,
    )


def _cloudflared_hint(result: CliResult) -> str:
    """What to do when brev could not download cloudflared (``refresh`` needs it; a worker without internet)."""
    if "cloudflared" not in result.stderr:
        return ""
    return (
        ". brev could not download cloudflared (github.com): on a worker without internet install it and set "
        "cloudflared_path on the tao_brev connection (docs/howto/brev.md, air-gapped workers)"
    )


def _sweep_dead_homes(root: Path) -> None:
    """Remove the private homes of processes that are gone (killed before their exit handler ran): they hold
    credentials nobody uses any more."""
    for home in root.iterdir():
        pid = home.name.rpartition("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(home, ignore_errors=True)
