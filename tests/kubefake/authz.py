"""The fake's authorization: which verbs on which resources the one user of the API may use.

The model is a deny list over "every verb on every resource": ``"<verb> <resource>"`` rules (``"delete secrets"``,
``"create services"``; subresources as ``pods/log``), set at start (``--deny VERB:RESOURCE``, repeatable) or at run
time (``POST /fake/deny {"rules": [...]}``). What it answers, as the real server does:

- a request whose verb the user may not use: 403 Forbidden, ``<resource> "<name>" is forbidden: User "<user>"
  cannot <verb> resource "<resource>" in API group "<group>" in the namespace "<ns>"`` (k8s
  ``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go`` ``ForbiddenStatusError``,
  ``pkg/endpoints/filters/authorization.go`` ``WithAuthorization``);
- ``POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews``: ``status.allowed`` for the review's
  ``resourceAttributes`` (k8s ``pkg/registry/authorization/selfsubjectaccessreview/rest.go`` ``Create``; what
  ``kubectl auth can-i`` asks);
- OwnerReferencesPermissionEnforcement's first check asks :meth:`Authorizer.allows` for ``delete`` on the object
  (``tests/kubefake/api.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tests.kubefake.store import RESOURCES, ApiError, _qualified

#: Who the fake's one user is (a service account, as an Airflow worker's usually is).
USER = "system:serviceaccount:default:airflow-worker"
#: HTTP method (and whether a name is given) -> the verb the API server authorizes.
VERBS = {("GET", True): "get", ("GET", False): "list", ("POST", False): "create", ("PATCH", True): "patch",
         ("PUT", True): "update", ("DELETE", True): "delete", ("DELETE", False): "deletecollection"}  # fmt: skip


class Authorizer:
    """The deny list: every verb on every resource is allowed unless a rule names it."""

    def __init__(self, denied: Iterable[str] = ()) -> None:
        self.denied: set[str] = {rule.strip() for rule in denied}

    def allows(self, verb: str, resource: str) -> bool:
        return f"{verb} {resource}" not in self.denied

    def check(self, method: str, resource: str, sub: str, name: str, namespace: str) -> None:
        """Refuse the request (403) when the user may not use its verb on its resource."""
        verb = VERBS.get((method, bool(name)), method.lower())
        target = f"{resource}/{sub}" if sub else resource
        if not self.allows(verb, target):
            raise forbidden(verb, target, name, namespace)

    def review(self, body: dict[str, Any]) -> dict[str, Any]:
        """A SelfSubjectAccessReview answered: its spec, and ``status.allowed`` (a reason when refused)."""
        attributes = (body.get("spec") or {}).get("resourceAttributes") or {}
        resource = str(attributes.get("resource") or "")
        if attributes.get("subresource"):
            resource = f"{resource}/{attributes['subresource']}"
        allowed = self.allows(str(attributes.get("verb") or ""), resource)
        status: dict[str, Any] = {"allowed": allowed}
        if not allowed:
            status["reason"] = "no RBAC policy matched"
        return {**body, "kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1", "status": status}


def forbidden(verb: str, resource: str, name: str, namespace: str) -> ApiError:
    base = resource.split("/", maxsplit=1)[0]
    group = RESOURCES[base][1].split("/")[0] if base in RESOURCES and "/" in RESOURCES[base][1] else ""
    subject = f'{_qualified(base) if base in RESOURCES else base} "{name}"' if name else _qualified(base)
    where = f' in the namespace "{namespace}"' if namespace else ""
    return ApiError(
        403,
        "Forbidden",
        f'{subject} is forbidden: User "{USER}" cannot {verb} resource "{resource}" in API group "{group}"{where}',
        {"name": name, "kind": base} if name else {"kind": base},
    )
