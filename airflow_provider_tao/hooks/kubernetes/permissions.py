"""What the connection's Kubernetes user must be allowed to do, asked as ``kubectl auth can-i`` asks it.

A Job's Secret, ConfigMaps and Service are created owned by the Job (the garbage collector deletes them with it).
Where the OwnerReferencesPermissionEnforcement admission plugin is on (OpenShift's default), setting an owner
reference needs ``delete`` on the object itself (k8s ``plugin/pkg/admission/gc/gc_admission.go``
``gcPermissionsEnforcement.Admit``: "cannot set an ownerRef on a resource you can't delete"), although this
provider never deletes them: a role with create but not delete works on most clusters and is refused there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

#: ``(verb, API group, resource, subresource)`` of every call a submission, a watch and a cancel make.
NEEDED: tuple[tuple[str, str, str, str], ...] = (
    *((verb, "batch", "jobs", "") for verb in ("create", "get", "list", "patch", "delete")),
    *((verb, "", kind, "") for kind in ("secrets", "configmaps", "services") for verb in ("create", "delete")),
    ("list", "", "pods", ""),
    ("get", "", "pods", "log"),
    ("list", "", "events", ""),
)
_OWNER_REF_REFUSAL = "cannot set an ownerRef on a resource you can't delete"
#: What the Test button says after the missing permissions.
MISSING_FIX = (
    "in the connection's namespace; add them to the role bound to the connection's user (a Job's Secret, ConfigMaps "
    "and Service are owned by the Job: where owner-reference permissions are enforced, creating them needs delete "
    "on them too)"
)


def access_review(api_client: Any) -> Callable[[dict[str, Any]], bool | None]:
    """``kubectl auth can-i`` through ``api_client``: one SelfSubjectAccessReview per question; None when the server
    does not answer it (no verdict from a failed read)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = client.AuthorizationV1Api(api_client)

    def allowed(attributes: dict[str, Any]) -> bool | None:
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview"}
        try:
            answer = api.create_self_subject_access_review(
                {**body, "spec": {"resourceAttributes": attributes}}, _preload_content=False
            )
            return bool(json.loads(answer.data).get("status", {}).get("allowed"))
        except (ApiException, ValueError, OSError, TypeError, AttributeError):
            return None

    return allowed


def missing_permissions(allowed: Callable[[dict[str, Any]], bool | None], namespace: str) -> list[str]:
    """``verb resource`` of each permission of :data:`NEEDED` the user lacks in ``namespace``; ``allowed`` answers
    one SelfSubjectAccessReview's ``resourceAttributes`` (None: the server cannot tell, counted as allowed)."""
    missing = []
    for verb, group, resource, sub in NEEDED:
        attributes = {"namespace": namespace, "verb": verb, "group": group, "resource": resource}
        if sub:
            attributes["subresource"] = sub
        if allowed(attributes) is False:
            missing.append(f"{verb} {resource}/{sub}" if sub else f"{verb} {resource}")
    return missing


def owner_reference_hint(message: str, kind: str) -> str:
    """The permission an OwnerReferencesPermissionEnforcement refusal asks for, in words ('' for other
    refusals)."""
    if _OWNER_REF_REFUSAL not in message:
        return ""
    return (
        f"; the connection's Kubernetes role needs `delete` on {kind or 'the objects the Job owns'} (the cluster "
        "enforces owner-reference permissions: an object owned by the Job can only be created by a user who may "
        "delete it)"
    )
