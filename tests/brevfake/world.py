"""The fake Brev world: what Brev's servers hold, in a JSON file every ``brev`` process and the tests share.

``$BREV_FAKE_STATE/world.json`` holds the user, the orgs, the instance types (GPU, count, stoppable, capacity),
the instances, the auth server's state and the fault settings. Writers take an exclusive ``flock`` on
``world.lock`` and replace the file atomically, so readers never need the lock and any number of concurrent CLI
calls stay consistent. Instance status transitions (DEPLOYING/STARTING -> RUNNING, STOPPING -> STOPPED,
DELETING -> gone) happen on a clock: each instance records what it becomes and when, and every reader settles
the world to "now" before looking.

The server operations (``me``, ``workspaces``, ``create_workspace``, ...) take the bearer token the CLI would
send and raise :class:`ApiError` with the status a real server answers. Each instance is a real container on the
test Docker engine (:mod:`tests.brevfake.instances`); the server operations start, kill and remove them.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STATE_FILE = "world.json"
LOCK_FILE = "world.lock"
CALLS_FILE = "calls.jsonl"
KAS_ISSUER = "https://login.nvidia.com"
DEFAULT_TIME_SCALE = 0.02
# World seconds (multiplied by the time scale): how long each transition takes.
DEFAULT_DURATIONS = {"deploy": 60.0, "start": 30.0, "stop": 20.0, "delete": 20.0}
TOKEN_TTL_S = 3600
#: ``getServiceTokenFilePath`` (brev-cli pkg/store/authtoken.go).
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"

# name -> (gpu, count, vram GB per GPU, vcpus, memory GiB, provider, $/h, stoppable, boot minutes)
DEFAULT_TYPES: dict[str, tuple[str, int, int, int, int, str, float, bool, int]] = {
    "g5.xlarge": ("A10G", 1, 24, 4, 16, "aws", 1.006, True, 4),
    "g5.2xlarge": ("A10G", 1, 24, 8, 32, "aws", 1.212, True, 4),
    "g5.12xlarge": ("A10G", 4, 24, 48, 192, "aws", 5.672, True, 5),
    "g6.xlarge": ("L4", 1, 24, 4, 16, "aws", 0.805, True, 4),
    "n1-highmem-4:nvidia-tesla-t4:1": ("T4", 1, 16, 4, 26, "gcp", 0.541, True, 3),
    "p4d.24xlarge": ("A100", 8, 40, 96, 1152, "aws", 32.773, True, 8),
    "hyperstack_H100": ("H100", 1, 80, 28, 180, "hyperstack", 2.28, False, 6),
    "c5.2xlarge": ("", 0, 0, 8, 16, "aws", 0.34, True, 2),
}


class ApiError(Exception):
    """An HTTP error answer of the Brev API: status, reason phrase, body and the path that was called."""

    def __init__(self, status: int, reason: str, body: str, path: str) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body
        self.path = path


def api_errors_body(message: str) -> str:
    """The body shape the CLI turns into a plain message (``{"errors": [{"type", "message"}]}``)."""
    return json.dumps({"errors": [{"type": "error", "message": message}]})


def new_id(length: int = 9) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(length))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


#: What golang-jwt v5.3.0 registers a signing method for (``ParseUnverified`` refuses any other ``alg``).
_JWT_ALGS = {f"{k}{n}" for k in ("HS", "RS", "PS", "ES") for n in (256, 384, 512)} | {"EdDSA", "none"}


def jwt_alg_known(token: str) -> bool:
    """``ParseUnverified``'s signing-method lookup: the header's ``alg`` is a string it has a method for."""
    try:
        header = json.loads(_unb64(token.split(".", maxsplit=1)[0]))
    except ValueError:
        return False
    return isinstance(header, dict) and header.get("alg") in _JWT_ALGS


def jwt_claims(token: str) -> dict[str, Any] | None:
    """The claims of a JWT parsed WITHOUT verifying it (what the CLI does), ``None`` if it is not one."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        header = json.loads(_unb64(parts[0]))
        claims = json.loads(_unb64(parts[1]))
    except ValueError:
        return None
    return claims if isinstance(header, dict) and isinstance(claims, dict) else None


def default_state(engine: str, tag: str) -> dict[str, Any]:
    """A fresh world: one user, two orgs, the default instance types, one valid login token and API key."""
    user_id = f"user-{new_id(8)}"
    orgs = [
        {"id": new_id(), "name": "ci-org", "userNetworkId": ""},
        {"id": new_id(), "name": "ci-other-org", "userNetworkId": ""},
    ]
    types = {
        name: {
            "gpu": gpu,
            "gpu_count": count,
            "vram_gb": vram,
            "vcpu": vcpu,
            "memory_gb": memory,
            "provider": provider,
            "price": price,
            "stoppable": stoppable,
            "boot_minutes": boot,
            "capacity": None,
            "workspace_group_id": f"wg-{provider}-{new_id(6)}",
        }
        for name, (gpu, count, vram, vcpu, memory, provider, price, stoppable, boot) in DEFAULT_TYPES.items()
    }
    return {
        "version": 1,
        "tag": tag,
        "engine": engine,
        "image": "local/debian-py:ci",
        "time_scale": DEFAULT_TIME_SCALE,
        "durations": dict(DEFAULT_DURATIONS),
        "user": {
            "id": user_id,
            "username": "ci-user",
            "name": "CI User",
            "email": "ci-user@example.com",
            "globalUserType": "Standard",
        },
        "other_users": [{"id": f"user-{new_id(8)}", "username": "teammate", "email": "teammate@example.com"}],
        "orgs": orgs,
        "auth": {
            "session_key": secrets.token_hex(16),
            "device_id": str(uuid.uuid4()),
            "token_valid": True,
            "api_keys": {f"bak-{secrets.token_hex(20)}": orgs[0]["id"]},
            "secret": secrets.token_hex(32),
            "clock_offset": 0.0,
            "desync_before": 0.0,
            "failing_logins": 0,
            "ngc_key_sha256": "",
        },
        "types": types,
        "instances": {},
        "deleted": [],
        "faults": {"flaky_ssh": [], "api_errors": [], "create_lost_response": 0, "failing_deploys": []},
    }


class World:
    """The state directory of one fake world.

    :param state_dir: the folder ``$BREV_FAKE_STATE`` names.
    """

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(state_dir)
        self.file = self.dir / STATE_FILE

    # ------------------------------------------------------------------------------------------------ storage
    def exists(self) -> bool:
        return self.file.exists()

    def read(self) -> dict[str, Any]:
        """A settled snapshot (no lock needed: writers replace the file atomically)."""
        state = json.loads(self.file.read_text())
        settle(state, time.time())
        return state

    @contextlib.contextmanager
    def mutate(self) -> Iterator[dict[str, Any]]:
        """Read-modify-write under the world's exclusive lock; the state is settled before it is handed out."""
        with open(self.dir / LOCK_FILE, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state = json.loads(self.file.read_text())
                settle(state, time.time())
                yield state
                self.write(state)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def write(self, state: dict[str, Any]) -> None:
        tmp = self.file.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
        os.replace(tmp, self.file)

    def time_scale(self, state: dict[str, Any] | None = None) -> float:
        """World seconds -> real seconds. ``BREV_FAKE_TIME_SCALE`` overrides the world's own setting."""
        override = os.environ.get("BREV_FAKE_TIME_SCALE", "")
        if override:
            return float(override)
        return float((state or self.read()).get("time_scale", DEFAULT_TIME_SCALE))

    def log_call(self, record: dict[str, Any]) -> None:
        """Append one line to the invocation log (O_APPEND: concurrent writers do not interleave lines)."""
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        fd = os.open(self.dir / CALLS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def calls(self) -> list[dict[str, Any]]:
        path = self.dir / CALLS_FILE
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def instance_dir(self, instance_id: str) -> Path:
        return self.dir / "instances" / instance_id


# ---------------------------------------------------------------------------------------------------- the clock
def settle(state: dict[str, Any], now: float) -> None:
    """Apply every transition that is due: DEPLOYING/STARTING -> RUNNING, STOPPING -> STOPPED, DELETING -> gone."""
    for instance_id, instance in list(state["instances"].items()):
        until = instance.get("until")
        if until is None or until > now:
            continue
        after = instance.pop("after", None)
        instance["until"] = None
        if after == "GONE":
            del state["instances"][instance_id]
            state["deleted"].append({"id": instance_id, "name": instance["name"], "gone_at": until})
            continue
        instance["status"] = after
        if after == "FAILURE":
            instance.update(build_status="CREATE_FAILED", health_status="UNAVAILABLE")
        if after == "RUNNING":
            instance["build_status"] = "COMPLETED"
            instance["health_status"] = "HEALTHY"


def schedule(state: dict[str, Any], instance: dict[str, Any], status: str, duration: str, after: str) -> None:
    """Put an instance in ``status`` until the world-time ``duration`` has passed, then in ``after``."""
    scale = float(os.environ.get("BREV_FAKE_TIME_SCALE", "") or state.get("time_scale", DEFAULT_TIME_SCALE))
    instance["status"] = status
    instance["after"] = after
    instance["until"] = time.time() + float(state["durations"][duration]) * scale


# ---------------------------------------------------------------------------------------------------- auth server
def auth_now(state: dict[str, Any]) -> float:
    """The clock tokens are checked against (``expire_session`` moves it forward, as an hour passing would)."""
    return time.time() + float(state["auth"]["clock_offset"])


def mint_jwt(state: dict[str, Any]) -> str:
    """An access token as KAS issues it (HS256 with the world's secret; the CLI never verifies signatures)."""
    now = int(auth_now(state))
    user = state["user"]
    claims = {
        "iss": KAS_ISSUER,
        "sub": user["id"],
        "email": user["email"],
        "iat": now,
        "exp": now + TOKEN_TTL_S,
        "jti": secrets.token_hex(8),
    }
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = _b64(json.dumps(claims).encode())
    signature = hmac.new(state["auth"]["secret"].encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64(signature)}"


def login_token(state: dict[str, Any]) -> str:
    """The token a user copies from the console for ``brev login --token`` (``<session key>:<device id>``)."""
    return f"{state['auth']['session_key']}:{state['auth']['device_id']}"


def kas_exchange(state: dict[str, Any], refresh_token: str, credentials_written_at: float) -> str | None:
    """KAS ``GET /token`` for a refresh token: a fresh access token, or ``None`` for UNAUTHORIZED.

    A session "desynced" by ``expire_session`` stays refused for the credentials saved before it; credentials
    written again afterwards (``brev login --token``, or by hand) rebuild it, as the seed describes. Failures
    planned with ``fail_logins`` are taken by the caller before this."""
    auth = state["auth"]
    if not auth["token_valid"] or refresh_token != login_token(state):
        return None
    if credentials_written_at < float(auth["desync_before"]):
        return None
    return mint_jwt(state)


def verify_bearer(state: dict[str, Any], token: str) -> tuple[str, str] | None:
    """``("user", user id)`` or ``("apikey", org id)`` for a token the API accepts, else ``None``."""
    if not token:
        return None
    if token in state["auth"]["api_keys"]:
        return "apikey", state["auth"]["api_keys"][token]
    parts = token.split(".")
    claims = jwt_claims(token)
    if claims is None or len(parts) != 3:
        return None
    expected = hmac.new(state["auth"]["secret"].encode(), f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256)
    if not hmac.compare_digest(_b64(expected.digest()), parts[2]):
        return None
    if float(claims.get("exp", 0)) <= auth_now(state) or claims.get("sub") != state["user"]["id"]:
        return None
    return "user", str(claims["sub"])


def service_account_token(state: dict[str, Any]) -> str:
    """The content of ``/var/run/secrets/kubernetes.io/serviceaccount/token`` under the world's ``root`` (the
    machine's ``/`` unless a test gives the world a root of its own), ``""`` when absent or unreadable."""
    path = Path(state.get("root") or "/") / SERVICE_ACCOUNT_TOKEN.lstrip("/")
    try:
        return path.read_text()
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------------- faults
def take_api_error(state: dict[str, Any]) -> dict[str, Any] | None:
    """Consume one injected API failure (``{status, reason, body}``), if any is left."""
    errors = state["faults"]["api_errors"]
    if not errors:
        return None
    first = errors[0]
    first["count"] -= 1
    if first["count"] <= 0:
        errors.pop(0)
    return dict(first)


def take_ssh_fault(state: dict[str, Any], instance: dict[str, Any]) -> str:
    """The failure (if any) of the next ssh connection to an instance: '' (connects), 'refused', 'unresolvable'
    (the instance is still coming up), 'flaky' (reset before the command runs) or 'dropped' (the command runs,
    then the connection drops before its output arrives)."""
    pending = instance.get("not_ready", {"tries": 0, "kind": "refused"})
    if pending.get("tries", 0) > 0:
        pending["tries"] -= 1
        instance["not_ready"] = pending
        return str(pending.get("kind", "refused"))
    for fault in state["faults"]["flaky_ssh"]:
        if fault["count"] > 0 and fault.get("instance") in (None, instance["name"], instance["id"]):
            fault["count"] -= 1
            state["faults"]["flaky_ssh"] = [f for f in state["faults"]["flaky_ssh"] if f["count"] > 0]
            return "dropped" if fault.get("when") == "after" else "flaky"
    return ""


def has_ssh_faults(state: dict[str, Any], instance: dict[str, Any]) -> bool:
    return bool(instance.get("not_ready", {}).get("tries", 0) > 0 or state["faults"]["flaky_ssh"])


# ---------------------------------------------------------------------------------------------------- entities
def workspace_entity(state: dict[str, Any], instance: dict[str, Any]) -> dict[str, Any]:
    """An instance as the API returns it (``entity.Workspace``)."""
    instance_type = state["types"].get(instance["instance_type"], {})
    return {
        "id": instance["id"],
        "name": instance["name"],
        "workspaceGroupId": instance["workspace_group_id"],
        "organizationId": instance["org_id"],
        "workspaceClassId": "",
        "instanceType": instance["instance_type"],
        "createdByUserId": instance["created_by"],
        "instanceTypeInfo": {"stoppable": bool(instance_type.get("stoppable", False))},
        "dns": f"{instance['name']}-{instance['id']}.brevlab.com",
        "status": instance["status"],
        "verbBuildStatus": instance.get("build_status", ""),
        "healthStatus": instance.get("health_status", ""),
        "statusMessage": instance.get("status_message", ""),
        "sshUser": "ubuntu",
        "sshPort": 22,
        "ip": instance["ip"],
    }


def fake_ip(instance_id: str) -> str:
    digest = hashlib.sha256(instance_id.encode()).digest()
    return f"10.{digest[0]}.{digest[1]}.{max(digest[2], 1)}"
