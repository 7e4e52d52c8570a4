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
- ``pkg/auth/auth.go`` ``isAccessTokenValid`` parses with golang-jwt v5.3.0 ``Parser.ParseUnverified``, which refuses
  a header without ``alg`` ("signing method (alg) is unspecified") or with one no signing method is registered for
  ("... is unavailable"): such a JWT becomes a refresh token that is not ``<session>:<device>`` and brev logs out on
  its first call. :func:`token_problem` says so before any call.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

#: Where brev looks for a Kubernetes service-account token first (``getServiceTokenFilePath``).
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
#: What every Brev API key starts with (``auth.BrevAPIKeyPrefix``).
API_KEY_PREFIX = "bak-"


#: The ``alg`` values golang-jwt v5.3.0 registers (hmac.go, rsa.go, rsa_pss.go, ecdsa.go, ed25519.go, none.go).
JWT_ALGORITHMS = frozenset(
    {"HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"}
    | {"EdDSA", "none"}
)


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


def _jwt_parts(token: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The header and claims of a JWT, unverified: three segments whose first two are JSON objects, else None."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        header, claims = (json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))) for part in parts[:2])
    except (ValueError, UnicodeDecodeError):
        return None
    return (header, claims) if isinstance(header, dict) and isinstance(claims, dict) else None


def token_problem(token: str) -> str | None:
    """Why brev would refuse the connection's token as it is (a JWT whose ``alg`` ``ParseUnverified`` rejects), or
    None. Any other token is brev's to judge."""
    parsed = _jwt_parts(token.strip())
    if parsed is None:
        return None
    alg = parsed[0].get("alg")
    if isinstance(alg, str) and alg in JWT_ALGORITHMS:
        return None
    said = "has no alg" if alg is None else f"has alg {alg!r}, which is not a JWT signing method"
    return (
        f"the tao_brev connection's token is a JWT whose header {said}: brev cannot parse it "
        "(golang-jwt ParseUnverified) and logs out on the first call. Put the token `brev login` prints, or an "
        "API key (bak-...), in the connection's password"
    )


def _valid_jwt(token: str, now: float) -> bool:
    """What the CLI's unverified JWT parse accepts: three segments whose first two are JSON objects, a known
    ``alg``, and claims that are not expired or not yet valid (an ``iat`` in the future is tolerated, as the CLI
    does)."""
    parsed = _jwt_parts(token)
    if parsed is None or token_problem(token) is not None:
        return False
    claims = parsed[1]
    try:
        if "exp" in claims and float(claims["exp"]) <= now:
            return False
        if "nbf" in claims and float(claims["nbf"]) > now:
            return False
    except (TypeError, ValueError):
        return False
    return True
