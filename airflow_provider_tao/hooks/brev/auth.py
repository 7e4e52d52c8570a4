"""What the ``brev`` CLI authenticates with, and the credentials file the Brev session writes for it.

Read from brevdev/brev-cli v0.6.327:

- ``pkg/store/authtoken.go`` ``FileStore.GetAuthTokens``: when ``/var/run/secrets/kubernetes.io/serviceaccount/token``
  exists and is not empty, its content IS the access token, before ``$HOME/.brev/credentials.json`` is read. On an
  Airflow worker that is a Kubernetes pod with an automounted token, every call then presents the pod's Kubernetes
  token to Brev and is refused, whatever the connection says: :func:`service_account_problem` tells it before any
  call (the path is absolute: no private HOME avoids it).
- ``pkg/auth/auth.go`` ``LoginWithToken``: a token that parses as a valid JWT is the access token, anything else is
  the refresh token the CLI exchanges on its next call; ``LoginWithAPIKey``: an API key (``bak-...``) is stored as
  ``api_key`` with its org's id as ``api_key_org_id`` (``entity.AuthTokens``), and every call then uses it as it
  is, in that org (``GetAPIKeyOrgID``: without the org id every command fails).
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

#: Where brev looks for a Kubernetes service-account token first (``getServiceTokenFilePath``).
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
#: What every Brev API key starts with (``auth.BrevAPIKeyPrefix``).
API_KEY_PREFIX = "bak-"


def is_api_key(token: str) -> bool:
    """``auth.IsBrevAPIKey``."""
    return token.strip().startswith(API_KEY_PREFIX)


def service_account_problem() -> str | None:
    """Why the CLI cannot use the connection's token on this worker (a Kubernetes service-account token it would
    use instead), or None."""
    try:
        mounted = SERVICE_ACCOUNT_TOKEN.read_bytes()
    except OSError:  # absent or unreadable: the CLI reads credentials.json (GetCurrentWorkspaceServiceToken)
        return None
    if not mounted:
        return None
    return (
        f"this worker has a Kubernetes service-account token at {SERVICE_ACCOUNT_TOKEN}, and the brev CLI "
        "authenticates with it instead of the connection's token whenever that file exists (brev-cli "
        "FileStore.GetAuthTokens): every Brev call would be refused. Run Brev tasks on workers without it "
        "(automountServiceAccountToken: false on the worker pod or its service account, or a queue of workers "
        "that are not Kubernetes pods)"
    )


def credentials_for(token: str, org_id: str | None = None, now: float | None = None) -> dict[str, str]:
    """The content of ``~/.brev/credentials.json`` that ``brev login --token <token>`` writes, or for an API key
    ``brev login --api-key <key> --org-id <org_id>``.

    :raises ValueError: an API key without ``org_id``.
    """
    if is_api_key(token):
        if not org_id or not org_id.strip():
            raise ValueError("a Brev API key (bak-...) needs the id of its org")
        return {"access_token": "", "refresh_token": "", "api_key": token.strip(), "api_key_org_id": org_id.strip()}
    if _valid_jwt(token, time.time() if now is None else now):
        return {"access_token": token, "refresh_token": "auto-login"}
    return {"access_token": "auto-login", "refresh_token": token}


def _valid_jwt(token: str, now: float) -> bool:
    """What the CLI's unverified JWT parse accepts: three segments whose first two are JSON objects, and claims
    that are not expired or not yet valid (an ``iat`` in the future is tolerated, as the CLI does)."""
    parts = token.split(".")
    if len(parts) != 3:
        return False
    try:
        header, claims = (json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))) for part in parts[:2])
    except (ValueError, UnicodeDecodeError):
        return False
    if not isinstance(header, dict) or not isinstance(claims, dict):
        return False
    try:
        if "exp" in claims and float(claims["exp"]) <= now:
            return False
        if "nbf" in claims and float(claims["nbf"]) > now:
            return False
    except (TypeError, ValueError):
        return False
    return True
