"""The workspace the fake serves: node groups (with nodes, volumes and GPU capacity), resource shapes, storage
permissions, and the knobs of the clock and of the uncertain server behaviours.

Everything here is plain data (:data:`DEFAULT_WORLD`, :data:`DEFAULT_SETTINGS`) that ``--config`` and
``POST /fake/config`` merge into; :class:`World` renders it in the JSON shapes the ``leptonai`` client parses
(``DedicatedNodeGroup``, ``Node``, ``Shape``, ``StoragePermission``, ``WorkspaceInfo``) and places replicas on nodes.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from typing import Any

#: Shapes every node group offers (``listable_in`` says where the dashboard lists them; jobs need ``job``).
SHAPES: list[dict[str, Any]] = [
    {"name": "cpu.small", "cpu": 2, "memory_in_mb": 8192, "accelerator_num": 0},
    {"name": "gpu.1xh100-80gb", "cpu": 16, "memory_in_mb": 204800, "accelerator_num": 1},
    {"name": "gpu.2xh100-80gb", "cpu": 32, "memory_in_mb": 409600, "accelerator_num": 2},
    {"name": "gpu.4xh100-80gb", "cpu": 64, "memory_in_mb": 819200, "accelerator_num": 4},
    {"name": "gpu.8xh100-80gb", "cpu": 128, "memory_in_mb": 1638400, "accelerator_num": 8},
]

DEFAULT_WORLD: dict[str, Any] = {
    "user": "ci-user@example.com",
    "node_groups": {
        # name -> description; the id the API uses is derived from the name (see node_group_id)
        "ng-lustre": {
            "gpu_product": "NVIDIA-H100-80GB-HBM3",
            "nodes": 2,
            "gpus_per_node": 8,
            "volumes": [
                {"name": "lustre-fs", "from": "nfs", "from_path": "/lustre", "size_in_gb": 100000},
                {"name": "filestore-fs", "from": "nfs", "from_path": "/filestore", "size_in_gb": 10000},
            ],
        },
        "ng-filestore": {
            "gpu_product": "NVIDIA-H100-80GB-HBM3",
            "nodes": 1,
            "gpus_per_node": 8,
            "volumes": [{"name": "filestore-data", "from": "nfs", "from_path": "/filestore", "size_in_gb": 10000}],
        },
        "ng-plain": {"gpu_product": "NVIDIA-H100-80GB-HBM3", "nodes": 1, "gpus_per_node": 8, "volumes": []},
    },
    # per node group: {shape name: {spec overrides}} on top of SHAPES (null removes a shape)
    "shape_overrides": {},
    # volume name -> path prefixes a job may mount (an empty list or a missing volume: anything)
    "storage_permissions": {
        "lustre-fs": ["/lustre/fsw/portfolios/ci"],
        "filestore-fs": ["/filestore/home"],
        "filestore-data": ["/"],
    },
    # node group name -> GPUs the fake may hand out (null: every GPU of its nodes); "" is the shared pool
    "capacity": {"": 8},
}

DEFAULT_SETTINGS: dict[str, Any] = {
    # the clock, in seconds
    "start_seconds": 0.3,  # Starting: replicas created, image "pulled", before the container starts
    "ready_seconds": 0.5,  # a running replica turns ready after this (Running with ready < active first)
    "pull_fail_seconds": 1.0,  # an image that cannot be pulled: "Pulling image" this long, then Failed
    "stop_grace_seconds": 2.0,  # SIGTERM -> SIGKILL when a job is stopped or deleted
    "deleted_visible_seconds": 60.0,  # a deleted job stays visible (alive_and_archive) as Deleted this long
    "retry_seconds": 1.0,  # PendingRetry before a job-level retry restarts it
    "sim_seconds": 30.0,  # how long a replica "runs" under --sim
    # uncertain server behaviours: each can be switched so the hook is tested against every variant
    "patch_labels": "accept",  # PATCH metadata.labels: accept | ignore | reject (400 "no valid field to update")
    "unique_names": False,  # suffix id mode: reject a second job of the same metadata.name (409)
    "mount_check": "start",  # a mount the node group cannot serve: ConfigError at replica start | 400 at create
    "secret_overwrite": "reject",  # POST /usersecrets of an existing name: reject (409) | replace
    "failure_analysis": True,  # False: GET /jobs/{id}/failure-analysis answers 404 (the route is not in leptonai)
    "label_rules": "kubernetes",  # label values checked as Kubernetes label values | none
    "auth": "ok",  # ok | forbid (every workspace route answers 403)
    # GET /shapes?node_groups=X: X is matched against the node group's id | name (a miss is an empty list)
    "shape_filter": "id",
    # GET /jobs: at most this many jobs on a page, whatever page_size asked (0: as asked)
    "page_cap": 0,
    # status.ready counts running ready replicas only | running ready and succeeded ones (a worker done early)
    "ready_counts": "running",
    # GET /jobs/{id}/events: each event carries a "message" (LeptonEvent models none) | it does not
    "event_message": True,
    # GET /logs values: [ts_ns, line] (pair) | [ts_ns, line, metadata] (triple): leptonai's reader takes both
    "log_values": "pair",
    # the unit of status.creation_time / completion_time: ms | s | us | ns (leptonai's CLI reads each)
    "time_unit": "ms",
    # replica ids: <job id>-<index>-<suffix> (indexed, the Kubernetes Indexed Job pod name) | <job id>-<suffix>
    "replica_ids": "indexed",
    "workspace_state": "normal",  # GET /workspace's workspace_state: normal | paused | all-pods-terminated | terminated
    # limits derived from what a Kubernetes-based control plane stores (etcd objects, Secrets)
    "max_job_bytes": 1536 * 1024,
    "max_secret_bytes": 1024 * 1024,
    "log_default_limit": 5000,
}


def deep_merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``patch`` merged into a copy of ``base``: dicts recursively, ``None`` deletes, anything else replaces."""
    result = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = deep_merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def node_group_id(name: str) -> str:
    """Lepton node group ids are not their names: a stable id, so a hook that confuses the two fails here."""
    return f"{name}-{hashlib.sha1(name.encode()).hexdigest()[:5]}"


@dataclass
class Placement:
    """Where one replica runs: its node and the GPUs it holds there."""

    node_group: str  # id ("" = the shared pool)
    node: str
    gpus: int


class World:
    """The workspace's fixed parts, rendered in the API's shapes, and GPU placement."""

    def __init__(self, workspace_id: str, data: dict[str, Any], settings: dict[str, Any]) -> None:
        self.workspace_id = workspace_id
        self.data = data
        self.settings = settings

    def update(self, world: dict[str, Any] | None = None, settings: dict[str, Any] | None = None) -> None:
        if world:
            self.data = deep_merge(self.data, world)
        if settings:
            unknown = set(settings) - set(DEFAULT_SETTINGS)
            if unknown:
                raise ValueError(f"unknown settings {sorted(unknown)}; known: {sorted(DEFAULT_SETTINGS)}")
            self.settings.update(settings)

    # ------------------------------------------------------------------ node groups

    def groups(self) -> dict[str, dict[str, Any]]:
        """id -> description (with its name)."""
        return {node_group_id(name): {**desc, "name": name} for name, desc in self.data["node_groups"].items()}

    def group(self, ng_id: str) -> dict[str, Any] | None:
        return self.groups().get(ng_id)

    def group_by_filter(self, value: str) -> str | None:
        """The id of the node group a ``node_groups`` filter value names, as ``shape_filter`` says the server
        matches it (by id or by name); None when it names none."""
        if self.settings["shape_filter"] == "name":
            return next((ng for ng, g in self.groups().items() if g["name"] == value), None)
        return value if self.group(value) is not None else None

    def node_names(self, ng_id: str) -> list[str]:
        group = self.group(ng_id)
        if group is None:
            return ["shared-node-0"]
        return [f"{group['name']}-node-{i}" for i in range(int(group["nodes"]))]

    def render_group(self, ng_id: str, used: dict[str, int]) -> dict[str, Any]:
        group = self.groups()[ng_id]
        volumes = [
            {"from": v.get("from", "nfs"), "size_in_gb": int(v.get("size_in_gb", 1000)), **v}
            for v in group.get("volumes") or []
        ]
        return {
            "metadata": {"id": ng_id, "name": group["name"], "created_at": 1735689600000, "version": 1},
            "spec": {
                "workspaces": [self.workspace_id],
                "volumes": volumes,
                "gpu_product": group["gpu_product"],
                "desired_nodes": int(group["nodes"]),
                "allocation_mode": "static",
                "owner": "customer",
            },
            "status": {"ready_nodes": int(group["nodes"]), "quota_enabled": bool(group.get("quota_enabled"))},
        }

    def render_nodes(self, ng_id: str, allocated: dict[str, int], idle_only: bool) -> list[dict[str, Any]]:
        group = self.groups()[ng_id]
        nodes = []
        for name in self.node_names(ng_id):
            used = allocated.get(name, 0)
            if idle_only and used:
                continue
            nodes.append(
                {
                    "metadata": {"id": name, "name": name},
                    "spec": {
                        "dedicated_node_group": ng_id,
                        "hostname": name,
                        "unschedulable": False,
                        "resource": {
                            "gpu": {
                                "product": group["gpu_product"],
                                "total": int(group["gpus_per_node"]),
                                "allocated": used,
                            },
                            "cpu": {"type": "x86_64", "total": 224, "allocated": 0},
                            "memory": {"total": 2 * 1024**4, "allocated": 0},
                        },
                    },
                    "status": {"status": ["Ready"], "hostname": name},
                }
            )
        return nodes

    # ------------------------------------------------------------------ shapes

    def shapes(self, ng_id: str) -> dict[str, dict[str, Any]]:
        """Shape name -> spec offered in one node group (the shared pool offers the same)."""
        name = (self.group(ng_id) or {}).get("name", "")
        overrides = (self.data.get("shape_overrides") or {}).get(name) or {}
        found: dict[str, dict[str, Any]] = {}
        for shape in SHAPES:
            if shape["name"] in overrides and overrides[shape["name"]] is None:
                continue
            found[shape["name"]] = {**shape, **(overrides.get(shape["name"]) or {})}
        for shape_name, spec in overrides.items():
            if spec is not None and shape_name not in found:
                found[shape_name] = {"name": shape_name, "cpu": 1, "memory_in_mb": 1024, "accelerator_num": 0, **spec}
        return found

    def render_shapes(self, ng_ids: list[str], purpose: str | None) -> list[dict[str, Any]]:
        out = []
        for ng_id in ng_ids:
            gpu_product = (self.group(ng_id) or {}).get("gpu_product", "NVIDIA-H100-80GB-HBM3")
            for shape in self.shapes(ng_id).values():
                listable = list(shape.get("listable_in") or ["deployment", "job", "pod"])
                if purpose and purpose not in listable:
                    continue
                gpus = int(shape.get("accelerator_num") or 0)
                spec = {
                    "name": shape["name"],
                    "description": f"{shape['cpu']} CPU, {shape['memory_in_mb'] // 1024} GiB"
                    + (f", {gpus} x {gpu_product}" if gpus else ""),
                    "listable_in": listable,
                    "cpu": float(shape["cpu"]),
                    "memory_in_mb": int(shape["memory_in_mb"]),
                    "ephemeral_storage_in_gb": 100,
                    "accelerator_num": float(gpus),
                    "node_group_id": ng_id or None,
                }
                if gpus:
                    spec.update(accelerator_type=gpu_product, accelerator_memory_in_mb=81559, accelerator_fraction=1.0)
                out.append({"metadata": {"id": shape["name"], "name": shape["name"]}, "spec": spec})
        return out

    # ------------------------------------------------------------------ storage

    def volume(self, ng_id: str, name: str) -> dict[str, Any] | None:
        group = self.group(ng_id) or {}
        return next((v for v in group.get("volumes") or [] if v["name"] == name), None)

    def permissions(self, volume: str) -> list[str]:
        return list((self.data.get("storage_permissions") or {}).get(volume) or [])

    def render_permissions(self, volume: str, ng_id: str) -> list[dict[str, Any]]:
        return [
            {"path_prefix": prefix, "allowed_users": [], "subfolder_policy": "", "nodegroup_id": ng_id}
            for prefix in self.permissions(volume)
        ]

    def mount_allowed(self, volume: str, path: str) -> bool:
        prefixes = self.permissions(volume)
        norm = "/" + path.strip("/")
        return not prefixes or any(
            p.rstrip("/") in ("", norm) or norm.startswith(p.rstrip("/") + "/") for p in prefixes
        )

    # ------------------------------------------------------------------ capacity

    def capacity(self, ng_id: str) -> int:
        """GPUs the fake may hand out in one node group ("" = the shared pool)."""
        group = self.group(ng_id)
        caps = self.data.get("capacity") or {}
        key = group["name"] if group else ""
        cap = caps.get(key)
        if cap is None:
            return int(group["nodes"]) * int(group["gpus_per_node"]) if group else 0
        return int(cap)

    def place(self, ng_id: str, gpus_each: int, count: int, allocated: dict[str, int]) -> list[Placement] | None:
        """First-fit placement of ``count`` replicas of ``gpus_each`` GPUs, or None when they do not fit now."""
        group = self.group(ng_id)
        per_node = int(group["gpus_per_node"]) if group else max(self.capacity(""), gpus_each)
        in_use = sum(allocated.values())
        if in_use + gpus_each * count > self.capacity(ng_id):
            return None
        free = {node: per_node - allocated.get(node, 0) for node in self.node_names(ng_id)}
        placed = []
        for _ in range(count):
            node = next((n for n, left in free.items() if left >= gpus_each), None)
            if node is None:
                return None
            free[node] -= gpus_each
            placed.append(Placement(ng_id, node, gpus_each))
        return placed

    def render_capacity(self, allocated: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
        out = {}
        for ng_id, group in [("", {"name": ""}), *self.groups().items()]:
            used = sum((allocated.get(ng_id) or {}).values())
            total = self.capacity(ng_id)
            out[group["name"] or "(shared)"] = {"capacity": total, "used": used, "free": max(total - used, 0)}
        return out

    # ------------------------------------------------------------------ workspace

    def render_workspace(self, counts: dict[str, int]) -> dict[str, Any]:
        total_gpus = sum(self.capacity(ng) for ng in self.groups())
        return {
            "build_time": "2026-01-01T00:00:00Z",
            "git_commit": "0.26.4",
            "workspace_name": self.workspace_id,
            "workspace_tier": "enterprise",
            "workspace_state": self.settings["workspace_state"],
            "supported_shapes": {},
            "workspace_disk_usage_bytes": 0,
            "workloads": {
                "num_deployments": 0,
                "num_jobs": counts.get("jobs", 0),
                "num_pods": 0,
                "num_secrets": counts.get("secrets", 0),
                "num_image_pull_secrets": counts.get("image_pull_secrets", 0),
            },
            "resource_quota": {
                "limit": {"cpu": 4096.0, "memory": 64 * 1024**4, "accelerator_num": float(total_gpus)},
                "used": {"cpu": 0.0, "memory": 0, "accelerator_num": float(counts.get("gpus", 0))},
            },
            "dedicated_node_group_only": False,
            "features": {"enable_new_deployment_api": False},
        }
