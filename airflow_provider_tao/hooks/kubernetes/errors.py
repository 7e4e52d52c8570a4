"""The ``kubernetes`` platform's words for an API server's refusal: a connection test's problem, a submission's
failure class."""

from __future__ import annotations

import json

from airflow_provider_tao.hooks.base import ConnectionProblem
from airflow_provider_tao.hooks.kubernetes.permissions import owner_reference_hint
from airflow_provider_tao.jobs import ErrClass


def kubernetes_problem(exc: Exception, namespace: str) -> ConnectionProblem:
    """The words for an API call the server refused."""
    status = getattr(exc, "status", None)
    if status == 401:
        return ConnectionProblem("auth", "the API server refused the credentials (401); check the kubeconfig's user")
    if status == 403:
        return ConnectionProblem(
            "permission", f"the credentials may not list Jobs in namespace {namespace} (403): {explain(exc)}"
        )
    if status == 404:
        return ConnectionProblem("not_found", f"namespace {namespace} does not exist (404); create it or fix the name")
    return ConnectionProblem("unreachable", f"the API server answered {status}: {explain(exc)}")


def explain(exc: Exception) -> str:
    """The server's message (and, for an owner-reference refusal, the permission it asks for)."""
    body = getattr(exc, "body", None)
    try:
        status = json.loads(body) if body else {}
        message = str(status["message"]) if status else str(exc)
        kind = str((status.get("details") or {}).get("kind") or "") if status else ""
    except (ValueError, KeyError, TypeError, AttributeError):
        return str(exc)
    return message + owner_reference_hint(message, kind)


def refusal_class(exc: Exception) -> ErrClass:
    """The API server refusing a job: 401/403 are credentials, 422/400 the job's configuration, the rest (quota
    409s, 5xx) the platform's."""
    status = int(getattr(exc, "status", 0) or 0)
    if status in (401, 403):
        return ErrClass.ERR_AUTH
    return ErrClass.ERR_CONFIG if status in (400, 404, 422) else ErrClass.ERR_INFRA
