"""RBAC authorization of the fake API server: a Role's rules, applied to every resource request as the real
server's RBAC authorizer applies them, with its 403 and its words.

Faithful to Kubernetes v1.33 (FIDELITY.md, "kubefake RBAC"):

* the verb of a request: ``RequestInfoFactory.NewRequestInfo`` (k8s.io/apiserver pkg/endpoints/request/
  requestinfo.go): GET with a name ``get``, without ``list`` (``watch`` with ``?watch=true``), POST ``create``, PUT
  ``update``, PATCH ``patch``, DELETE with a name ``delete``, without ``deletecollection``; a subresource is
  ``<resource>/<sub>`` (``pods/log``);
* a rule matches: ``RuleAllows`` (k8s.io/kubernetes plugin/pkg/auth/authorizer/rbac/rbac.go) -- ``VerbMatches``,
  ``APIGroupMatches``, ``ResourceMatches`` (``*``, ``*/<sub>``, exact ``<resource>/<sub>``), ``ResourceNameMatches``;
* the refusal: ``forbiddenMessage`` + ``NewForbidden`` (k8s.io/apiserver pkg/endpoints/handlers/responsewriters/
  errors.go, apimachinery pkg/api/errors): ``<resource>.<group> "<name>" is forbidden: User "<user>" cannot
  <verb> resource "<resource>" in API group "<group>" in the namespace "<ns>"``.

Discovery (``/version``, ``/api``, ``/apis``) is every authenticated user's (the ``system:discovery`` ClusterRole).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.kubefake.store import RESOURCES, ApiError, _qualified

#: The user the fake names in its refusals (the connection's kubeconfig user).
USER = "system:serviceaccount:airflow:tao-airflow"


def _verb(method: str, name: str, query: dict[str, str]) -> str:
    if method == "GET":
        return "get" if name else ("watch" if query.get("watch") in ("true", "1") else "list")
    if method == "DELETE":
        return "delete" if name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def _matches(allowed: list[str], wanted: str) -> bool:
    return "*" in allowed or wanted in allowed


@dataclass
class Rbac:
    """The rules of the Roles bound to the fake's one user.

    :param rules: the ``rules`` of a Role (or of several), as in its manifest.
    :param user: the user named in refusals.
    """

    rules: list[dict[str, Any]] = field(default_factory=list)
    user: str = USER

    def allows(self, verb: str, group: str, resource: str, sub: str = "", name: str = "") -> bool:
        """Whether a rule grants ``verb`` on ``resource[/sub]`` of API ``group`` (and object ``name``)."""
        wanted = f"{resource}/{sub}" if sub else resource
        for rule in self.rules:
            resources = rule.get("resources") or []
            if not (
                _matches(rule.get("verbs") or [], verb)
                and _matches(rule.get("apiGroups") or [], group)
                and (_matches(resources, wanted) or (sub and f"*/{sub}" in resources))
            ):
                continue
            names = rule.get("resourceNames") or []
            if not names or (name and name in names):
                return True
        return False

    def authorize(
        self, method: str, resource: str, *, name: str, sub: str, namespace: str, query: dict[str, str]
    ) -> None:
        """Raise the API server's 403 when no rule grants the request."""
        verb = _verb(method, name, query)
        api_version = RESOURCES[resource][1]
        group = api_version.split("/")[0] if "/" in api_version else ""
        if self.allows(verb, group, resource, sub, name):
            return
        shown = f"{resource}/{sub}" if sub else resource
        where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        reason = f'User "{self.user}" cannot {verb} resource "{shown}" in API group "{group}" {where}'
        qualified = _qualified(resource)
        message = f'{qualified} "{name}" is forbidden: {reason}' if name else f"{qualified} is forbidden: {reason}"
        raise ApiError(403, "Forbidden", message, {"name": name, "group": group, "kind": resource})
