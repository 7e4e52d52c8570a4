"""The client side of the fake CLI: ``$HOME/.brev`` (credentials, active org, ssh config), the login flow as
brev-cli's ``pkg/auth`` runs it, and API calls with the real error texts.

Credentials (``~/.brev/credentials.json``, Go ``MarshalIndent`` with one space, created 0666 & ~umask as the
real CLI does) hold ``access_token`` / ``refresh_token`` (+ ``api_key`` / ``api_key_org_id``). Before each API
call the CLI wants a fresh access token: an API key is used as it is; an access token is used while it is a JWT
whose ``exp`` has not passed; otherwise the refresh token is exchanged with KAS -- a refresh token that is not
``<session>:<device>`` is "malformed" (the CLI prints ``WARN: malformed refresh token, logging out`` and writes
it to ``~/.brev/.invalid-refresh-token``), one KAS refuses is a logout too. Logged out, a command that needs a
login asks ``You are currently logged out, would you like to log in? [Y/n]: `` on stdout and reads stdin; at
EOF it fails with ``EOF``.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .goerr import GoError, validation
from .server import Server
from .world import ApiError, World, auth_now, jwt_alg_known, jwt_claims, kas_exchange, service_account_token

VERSION = "v0.6.327"
API_URL = os.environ.get("BREV_API_URL", "https://brevapi.us-west-2-prod.control-plane.brev.dev")
PUBLIC_API_URL = os.environ.get("BREV_PUBLIC_API_URL", "https://api.brev.dev")
QUERY = f"cli_version={VERSION}&local=true&os=linux&utm_source=cli"
LOGGED_OUT_PROMPT = "You are currently logged out, would you like to log in? [Y/n]: "
T = TypeVar("T")


def http_error_text(error: ApiError, base: str = API_URL) -> str:
    """``store.HTTPResponseError.Error()``: the messages of an ``{"errors": [...]}`` body, else
    ``<url> <status> <body>``."""
    try:
        messages = [str(e.get("message", "")) for e in json.loads(error.body).get("errors") or []]
    except (ValueError, AttributeError):
        messages = []
    text = "".join(f"{m}\n" for m in messages)
    if text.strip():
        return text
    return f"{base}/{error.path}?{QUERY} {error.status} {error.reason} {error.body}"


def write_go_json(path: Path, value: Any) -> None:
    """``files.OverwriteJSON``: folder 0770, file created 0666 (both minus the umask), truncated then written."""
    path.parent.mkdir(mode=0o770, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(value, indent=1))


class Session:
    """One CLI process's login and API access.

    :param world: the fake world (its server and clock).
    :param home: ``$HOME`` of the process.
    :param out: writes to stdout (text, flushed).
    """

    def __init__(self, world: World, home: str, out: Callable[[str], None]) -> None:
        self.world = world
        self.server = Server(world)
        self.home = Path(home)
        self.out = out
        self._token: str | None = None

    # ------------------------------------------------------------------------------------------------ files
    @property
    def brev_dir(self) -> Path:
        return self.home / ".brev"

    @property
    def credentials_path(self) -> Path:
        return self.brev_dir / "credentials.json"

    def read_tokens(self) -> dict[str, str] | None:
        """``GetAuthTokens``: a Kubernetes service-account token, when its file exists and is not empty, is the
        access token (``GetCurrentWorkspaceServiceToken``, before the credentials file is looked at); else the
        credentials file, ``None`` when it does not exist (a JSON error is an error)."""
        mounted = service_account_token(self.world.read())
        if mounted:
            return {"access_token": mounted}
        try:
            text = self.credentials_path.read_text()
        except FileNotFoundError:
            return None
        try:
            tokens = json.loads(text)
        except ValueError:
            raise GoError("unexpected end of JSON input" if not text.strip() else "invalid character in JSON") from None
        return {k: str(v) for k, v in tokens.items()} if isinstance(tokens, dict) else None

    def save_tokens(self, tokens: dict[str, str]) -> None:
        if not tokens.get("access_token") and not tokens.get("api_key"):
            raise GoError("access token and api key are empty")
        ordered = {"access_token": tokens.get("access_token", ""), "refresh_token": tokens.get("refresh_token", "")}
        for key in ("api_key", "api_key_org_id"):
            if tokens.get(key):
                ordered[key] = tokens[key]
        write_go_json(self.credentials_path, ordered)

    def active_org_file(self) -> dict[str, Any] | None:
        try:
            return dict(json.loads((self.brev_dir / "active_org.json").read_text()))
        except (FileNotFoundError, ValueError):
            return None

    def set_active_org(self, org: dict[str, Any]) -> None:
        write_go_json(
            self.brev_dir / "active_org.json",
            {"id": org["id"], "name": org["name"], "userNetworkId": org.get("userNetworkId", "")},
        )

    # ------------------------------------------------------------------------------------------------ tokens
    def startup_notice(self) -> None:
        """``auth.StandardLogin`` at start-up: a saved access token that no authenticator recognises (e.g. the
        ``auto-login`` placeholder a non-JWT ``--token`` login leaves) makes it print this on stdout."""
        try:
            tokens = self.read_tokens()
        except GoError:
            return
        if tokens and tokens.get("access_token") and not tokens.get("api_key"):
            claims = jwt_claims(tokens["access_token"]) or {}
            if claims.get("iss") not in ("https://login.nvidia.com", "https://brevdev.us.auth0.com/"):
                self.out("no oauth found for token\n")

    def is_api_key(self) -> bool:
        try:
            tokens = self.read_tokens()
        except GoError:
            return False
        return bool(tokens and tokens.get("api_key", "").strip().startswith("bak-"))

    def token_valid(self, token: str) -> bool:
        """``isAccessTokenValid``: a JWT whose ``exp`` (and ``nbf``) the clock accepts; the signature is not
        checked, and "used before issued" is ignored."""
        claims = jwt_claims(token)
        if claims is None or not jwt_alg_known(token):  # golang-jwt ParseUnverified: ErrTokenUnverifiable
            return False
        now = auth_now(self.world.read())
        if "exp" in claims and float(claims["exp"]) <= now:
            return False
        return not ("nbf" in claims and float(claims["nbf"]) > now)

    def fresh_token_or_empty(self) -> str:
        """``GetFreshAccessTokenOrNil``."""
        tokens = self.read_tokens()
        if not tokens or not any(tokens.get(k) for k in ("access_token", "refresh_token", "api_key")):
            return ""
        if tokens.get("api_key", "").strip():
            return tokens["api_key"].strip()
        access, refresh = tokens.get("access_token", ""), tokens.get("refresh_token", "")
        if not self.token_valid(access) and refresh:
            return self.refresh(refresh) or ""
        if not refresh and not access:
            return ""
        return access

    def refresh(self, refresh_token: str) -> str | None:
        """KAS ``GetNewAuthTokensWithRefresh``: a new access token saved with the same refresh token, or
        ``None`` (logged out)."""
        if len(refresh_token.split(":")) != 2:
            invalid = self.brev_dir / ".invalid-refresh-token"
            try:
                fd = os.open(invalid, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as out:
                    out.write(refresh_token)
                self.out("WARN: malformed refresh token, logging out\n")
            except OSError:
                pass
            return None
        state = self.world.read()
        if state["auth"].get("failing_logins", 0) > 0:
            with self.world.mutate() as live:
                failing = live["auth"]["failing_logins"] > 0
                live["auth"]["failing_logins"] = max(0, live["auth"]["failing_logins"] - 1)
            if failing:
                return None
        try:
            written_at = self.credentials_path.stat().st_mtime
        except OSError:
            written_at = 0.0
        fresh = kas_exchange(state, refresh_token, written_at)
        if fresh is None:
            return None
        self.save_tokens({"access_token": fresh, "refresh_token": refresh_token})
        return fresh

    def access_token(self, login: bool) -> str:
        """The bearer token of the next API call; logged out, ``login`` stores ask to log in (and fail at EOF)."""
        if self._token:
            return self._token
        token = self.fresh_token_or_empty()
        if not token and login:
            self.prompt_for_login()
        self._token = token
        return token

    def prompt_for_login(self) -> None:
        """``Auth.PromptForLogin`` without a terminal to log in from."""
        self.out(LOGGED_OUT_PROMPT)
        line = sys.stdin.buffer.readline()
        if not line.endswith(b"\n"):
            raise GoError("EOF")
        answer = line.decode(errors="replace").strip().lower()
        if answer not in ("y", ""):
            raise GoError("declined to login")
        self.out("Enter your email: ")
        self.out("failed.\n\n")
        raise GoError("EOF")

    # ------------------------------------------------------------------------------------------------ API
    def call(self, operation: Callable[[str], T], login: bool = True) -> T:
        """One API call with the process's token. A 403 makes the login store refresh and retry once (the
        CLI's forbidden-status retry handler); any HTTP error becomes the CLI's error text."""
        token = self.access_token(login)
        try:
            return operation(token)
        except ApiError as error:
            if error.status == 0:  # the connection dropped before an answer: Go's net/http error, through resty
                url = f"{API_URL}/{error.path}?{QUERY}"
                raise GoError(f'Get "{url}": EOF') from None
            if error.status == 403 and login:
                self._token = None
                try:
                    return operation(self.access_token(login))
                except ApiError as again:
                    raise GoError(http_error_text(again)) from None
            raise GoError(http_error_text(error)) from None

    def me(self, login: bool = True) -> dict[str, Any]:
        return self.call(self.server.me, login)

    def organizations(self, name: str = "") -> list[dict[str, Any]]:
        orgs = self.call(self.server.orgs)
        return [o for o in orgs if not name or o["name"].lower() == name.lower()]

    def active_org(self, login: bool = True) -> dict[str, Any] | None:
        """``GetActiveOrganizationOrDefault``: the API key's org, the saved active org, or the first org."""
        if self.is_api_key():
            tokens = self.read_tokens() or {}
            org_id = tokens.get("api_key_org_id", "").strip()
            if not org_id:
                raise validation(
                    "api key auth requires an org id; run brev login --api-key <api-key> --org-id <org-id>"
                )
            try:
                return self.call(lambda t: self.server.org(t, org_id), login)
            except GoError:
                return {"id": org_id, "name": org_id, "userNetworkId": ""}
        cached = self.active_org_file()
        if cached:
            try:
                return self.call(lambda t: self.server.org(t, cached["id"]), login)
            except GoError as error:
                if " 404 " not in error.cause and " 403 " not in error.cause:
                    raise
        orgs = self.call(self.server.orgs, login)
        return orgs[0] if orgs else None

    def user_workspaces(self, org_id: str, user_id: str | None) -> list[dict[str, Any]]:
        workspaces = self.call(lambda t: self.server.workspaces(t, org_id))
        return [w for w in workspaces if user_id is None or w["createdByUserId"] == user_id]

    def find_workspaces(self, name_or_id: str) -> list[dict[str, Any]]:
        """``GetWorkspaceByNameOrID`` in the active org (the user's own unless logged in with an API key)."""
        user_id = None if self.is_api_key() else self.me()["id"]
        org = self.active_org()
        if org is None:
            return []
        return [w for w in self.user_workspaces(org["id"], user_id) if name_or_id in (w["name"], w["id"])]

    def user_workspace(self, name_or_id: str) -> dict[str, Any]:
        """``util.GetUserWorkspaceByNameOrIDErr``."""
        found = self.find_workspaces(name_or_id)
        if self.is_api_key() and len(found) > 1:
            found = [w for w in found if w["status"] != "FAILURE"]
            if not found:
                raise validation(f"instance with id/name {name_or_id} is a failed workspace")
            if len(found) > 1:
                raise validation(f"multiple instances found with id/name {name_or_id}")
        if not found:
            raise validation(f"instance with id/name {name_or_id} not found")
        return found[0]

    def workspace(self, workspace_id: str) -> dict[str, Any]:
        return self.call(lambda t: self.server.workspace(t, workspace_id))

    # ------------------------------------------------------------------------------------------------ refresh
    def refresh_ssh_config(self) -> None:
        """``refresh.RunRefresh``: the private key, ``~/.brev/ssh_config`` with an entry (and a ``-host``
        entry) per RUNNING instance of the user, and an ``Include`` of it at the top of ``~/.ssh/config``."""
        self.download_cloudflared()
        user_id = None if self.is_api_key() else self.me()["id"]
        org = self.active_org()
        workspaces = self.user_workspaces(org["id"], user_id) if org else []
        key = self.brev_dir / "brev.pem"
        self.brev_dir.mkdir(mode=0o770, parents=True, exist_ok=True)
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write("-----BEGIN OPENSSH PRIVATE KEY-----\nYnJldmZha2U=\n-----END OPENSSH PRIVATE KEY-----\n")
        key.chmod(stat.S_IRUSR | stat.S_IWUSR)
        user_config = self.home / ".ssh" / "config"
        brev_config = self.brev_dir / "ssh_config"
        text = f"# included in {user_config}\n"
        for workspace in workspaces:
            if workspace["status"] != "RUNNING":
                continue
            for alias in (workspace["name"], f"{workspace['name']}-host"):
                text += ssh_entry(alias, workspace["ip"], key)
        brev_config.write_text(text)
        include = f'Include "{brev_config}"\n'
        user_config.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        current = user_config.read_text() if user_config.exists() else ""
        if include not in current:
            user_config.write_text(include + current)

    def download_cloudflared(self) -> None:
        """``Cloudflared.DownloadCloudflaredBinaryIfItDNE`` (pkg/store/cloudflared.go), the first step of
        ``RunRefresh``: nothing when ``~/.brev/cloudflared`` exists (afero ``Exists``: a symlink to a file counts),
        else a GET of the release on github.com -- modelled: refused when the world is ``offline`` (Go's error for
        a host it cannot resolve), else a stand-in executable, each download counted in the world."""
        binary = self.brev_dir / "cloudflared"
        if binary.exists():
            return
        url = (
            f"https://github.com/cloudflare/cloudflared/releases/download/{CLOUDFLARED_VERSION}/cloudflared-linux-amd64"
        )
        state = self.world.read()
        if state["faults"].get("offline"):
            raise GoError(f'Get "{url}": dial tcp: lookup github.com: no such host').traced(
                "pkg/store.Cloudflared.DownloadBinary", "pkg/store/cloudflared.go", 68
            )
        self.brev_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        binary.write_text("#!/bin/sh\necho 'cloudflared version 2024.10.0 (brevfake stand-in)'\n")
        binary.chmod(0o755)
        with self.world.mutate() as live:
            live.setdefault("cloudflared_downloads", []).append({"home": str(self.home), "pid": os.getpid()})


#: ``store.CloudflaredVersion``.
CLOUDFLARED_VERSION = "2024.10.0"


def ssh_entry(alias: str, ip: str, key: Path) -> str:
    """One ``Host`` block as ``SSHConfigEntryTemplateV3`` renders it."""
    return (
        f'Host {alias}\n  Hostname {ip}\n  IdentityFile "{key}"\n  User ubuntu\n  ServerAliveInterval 30\n'
        "  UserKnownHostsFile /dev/null\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
        "  PasswordAuthentication no\n  AddKeysToAgent yes\n  ForwardAgent yes\n  RequestTTY yes\n"
        "  ControlMaster auto\n  ControlPath ~/.ssh/brev-control-%C\n  ControlPersist 10m\n  Port 22\n\n"
    )
