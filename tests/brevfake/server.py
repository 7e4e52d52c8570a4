"""The Brev API of the fake world: the calls the CLI makes, with the answers and HTTP errors a server gives.

Every operation takes the bearer token the CLI would send (``""`` = no Authorization header). A missing token is
401, a token the server does not accept (unknown, expired, revoked) is 403 -- the status the real CLI retries
once after refreshing. Errors injected with ``BrevWorld.api_errors`` are answered first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .world import (
    ApiError,
    World,
    api_errors_body,
    fake_ip,
    new_id,
    schedule,
    take_api_error,
    verify_bearer,
    workspace_entity,
)


class LostResponse(Exception):
    """The server did the work but the client saw ``unexpected EOF`` (brevdev/brev-cli#382)."""


class Server:
    """The fake Brev control plane.

    :param world: the world's state directory.
    """

    def __init__(self, world: World) -> None:
        self.world = world

    # ------------------------------------------------------------------------------------------------ plumbing
    def _enter(self, token: str, path: str) -> tuple[dict[str, Any], str, str]:
        """Injected failures, then authentication: ``(state, "user"|"apikey", user or org id)``."""
        snapshot = self.world.read()
        if snapshot["faults"]["api_errors"]:
            with self.world.mutate() as live:
                injected = take_api_error(live)
            if injected:
                raise ApiError(injected["status"], injected["reason"], injected["body"], path)
        who = verify_bearer(snapshot, token)
        if who is None:
            if not token:
                raise ApiError(401, "Unauthorized", '{"message":"Unauthorized"}', path)
            raise ApiError(403, "Forbidden", '{"message":"Forbidden"}', path)
        return snapshot, who[0], who[1]

    @staticmethod
    def _visible(state: dict[str, Any], kind: str, ident: str, org_id: str) -> bool:
        if kind == "apikey":
            return ident == org_id
        return any(o["id"] == org_id for o in state["orgs"])

    # ------------------------------------------------------------------------------------------------ reads
    def me(self, token: str) -> dict[str, Any]:
        state, kind, _ = self._enter(token, "api/me")
        if kind == "apikey":
            raise ApiError(403, "Forbidden", '{"message":"Forbidden"}', "api/me")
        return dict(state["user"])

    def orgs(self, token: str) -> list[dict[str, Any]]:
        state, kind, ident = self._enter(token, "api/organizations")
        return [dict(o) for o in state["orgs"] if kind == "user" or o["id"] == ident]

    def org(self, token: str, org_id: str) -> dict[str, Any]:
        path = f"api/organizations/{org_id}"
        state, kind, ident = self._enter(token, path)
        for org in state["orgs"]:
            if org["id"] == org_id and self._visible(state, kind, ident, org_id):
                return dict(org)
        raise ApiError(404, "Not Found", api_errors_body("organization not found"), path)

    def workspaces(self, token: str, org_id: str) -> list[dict[str, Any]]:
        path = f"api/organizations/{org_id}/workspaces"
        state, kind, ident = self._enter(token, path)
        if not self._visible(state, kind, ident, org_id):
            raise ApiError(403, "Forbidden", '{"message":"Forbidden"}', path)
        found = [i for i in state["instances"].values() if i["org_id"] == org_id]
        return [workspace_entity(state, i) for i in sorted(found, key=lambda i: i["created_at"])]

    def workspace(self, token: str, workspace_id: str) -> dict[str, Any]:
        path = f"api/workspaces/{workspace_id}"
        state, _, _ = self._enter(token, path)
        instance = state["instances"].get(workspace_id)
        if instance is None:
            raise ApiError(404, "Not Found", api_errors_body("workspace not found"), path)
        return workspace_entity(state, instance)

    def public_instance_types(self) -> list[dict[str, Any]]:
        """``GET v1/instance/types`` of the public API (no authentication)."""
        return [
            {"type": name, **spec}
            for name, spec in sorted(self.world.read()["types"].items(), key=lambda kv: kv[1]["price"])
        ]

    def available_types(self, token: str, org_id: str) -> dict[str, dict[str, Any]]:
        """``GET api/instances/alltypesavailable/{org}``: type -> its workspace group id ('' = no capacity)."""
        state, _, _ = self._enter(token, f"api/instances/alltypesavailable/{org_id}")
        return {name: {"workspace_group_id": _group_with_capacity(state, name)} for name in state["types"]}

    # ------------------------------------------------------------------------------------------------ writes
    def create_workspace(
        self, token: str, org_id: str, name: str, instance_type: str, *, group: str, startup_script: str = ""
    ) -> dict[str, Any]:
        path = f"api/organizations/{org_id}/workspaces"
        _, kind, _ = self._enter(token, path)
        with self.world.mutate() as state:
            taken = [i for i in state["instances"].values() if i["org_id"] == org_id and i["name"] == name]
            if taken:
                raise ApiError(400, "Bad Request", api_errors_body(f"duplicate workspace name {name}"), path)
            if instance_type not in state["types"] or not _group_with_capacity(state, instance_type):
                message = f"no capacity for instance type {instance_type} in workspace group {group}"
                raise ApiError(400, "Bad Request", api_errors_body(message), path)
            instance = new_instance(state, name, instance_type, org_id, state["user"]["id"] if kind == "user" else "")
            instance["startup_script"] = bool(startup_script)
            lost = state["faults"].get("create_lost_response", 0) > 0
            if lost:
                state["faults"]["create_lost_response"] -= 1
        if startup_script:
            boot = self.world.instance_dir(instance["id"]) / "boot"
            boot.mkdir(parents=True, exist_ok=True)
            (boot / "startup.sh").write_text(startup_script)
        self._provision(instance)
        if lost:
            raise LostResponse()
        return self.workspace(token, instance["id"])

    def _provision(self, instance: dict[str, Any]) -> None:
        from . import instances  # lazily: API-only calls start faster without the engine client

        state = self.world.read()
        try:
            instances.provision(self.world, state, instance)
        except Exception as failed:  # the VM never comes up: the instance fails, as a provider error would
            with self.world.mutate() as live:
                if instance["id"] in live["instances"]:
                    live["instances"][instance["id"]].update(
                        status="FAILURE", build_status="CREATE_FAILED", until=None, status_message=str(failed)
                    )

    def delete_workspace(self, token: str, workspace_id: str) -> dict[str, Any]:
        def begin(state: dict[str, Any], instance: dict[str, Any], _path: str) -> bool:
            if instance["status"] != "DELETING":
                schedule(state, instance, "DELETING", "delete", "GONE")
            return True

        return self._transition(token, workspace_id, "", begin)

    def stop_workspace(self, token: str, workspace_id: str) -> dict[str, Any]:
        def begin(state: dict[str, Any], instance: dict[str, Any], _path: str) -> bool:
            if instance["status"] in ("DELETING", "STOPPING", "STOPPED"):
                return False
            schedule(state, instance, "STOPPING", "stop", "STOPPED")
            return True

        return self._transition(token, workspace_id, "/stop", begin)

    def start_workspace(self, token: str, workspace_id: str) -> dict[str, Any]:
        def begin(state: dict[str, Any], instance: dict[str, Any], path: str) -> bool:
            if instance["status"] != "STOPPED":
                message = f"workspace is not stopped (status {instance['status']})"
                raise ApiError(400, "Bad Request", api_errors_body(message), path)
            schedule(state, instance, "STARTING", "start", "RUNNING")
            return True

        return self._transition(token, workspace_id, "/start", begin)

    def _transition(
        self, token: str, workspace_id: str, action: str, begin: Callable[[dict[str, Any], dict[str, Any], str], bool]
    ) -> dict[str, Any]:
        """``DELETE api/workspaces/{id}`` (action ``""``) or ``PUT api/workspaces/{id}/stop|start``: ``begin``
        moves the instance to its next status under the world's lock (False: nothing to do), then the VM's
        containers follow (removed, killed or started)."""
        from . import instances  # lazily: API-only calls start faster without the engine client

        path = f"api/workspaces/{workspace_id}{action}"
        self._enter(token, path)
        with self.world.mutate() as state:
            instance = state["instances"].get(workspace_id)
            if instance is None:
                raise ApiError(404, "Not Found", api_errors_body("workspace not found"), path)
            act = begin(state, instance, path)
            entity = workspace_entity(state, instance)
        if act:
            current = self.world.read()
            if action == "":
                instances.destroy(self.world, current, workspace_id)
            elif action == "/stop":
                instances.halt(current, workspace_id)
            else:
                instances.resume(current, workspace_id)
        return entity


def new_instance(state: dict[str, Any], name: str, instance_type: str, org_id: str, user_id: str) -> dict[str, Any]:
    """Record a new instance (DEPLOYING until the deploy time has passed)."""
    instance_id = new_id()
    while instance_id in state["instances"]:
        instance_id = new_id()
    instance: dict[str, Any] = {
        "id": instance_id,
        "name": name,
        "org_id": org_id,
        "created_by": user_id,
        "created_at": time.time(),
        "instance_type": instance_type,
        "workspace_group_id": state["types"].get(instance_type, {}).get("workspace_group_id", ""),
        "build_status": "PENDING",
        "health_status": "",
        "status_message": "",
        "ip": fake_ip(instance_id),
    }
    failing = state["faults"].get("failing_deploys") or []
    if failing:
        instance["status_message"] = failing.pop(0)
    schedule(state, instance, "DEPLOYING", "deploy", "FAILURE" if instance["status_message"] else "RUNNING")
    state["instances"][instance_id] = instance
    return instance


def _group_with_capacity(state: dict[str, Any], instance_type: str) -> str:
    spec = state["types"].get(instance_type)
    if spec is None:
        return ""
    capacity = spec.get("capacity")
    if capacity is not None:
        used = sum(1 for i in state["instances"].values() if i["instance_type"] == instance_type)
        if used >= capacity:
            return ""
    return str(spec["workspace_group_id"])
