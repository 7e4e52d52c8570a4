"""Where a ``lepton`` job runs: its resource shape, its node group and the volumes mounted into it, resolved once per
submission from the workspace's API (the TAO SDK's discovery calls live here too).

The shape is the explicit ``resource_shape`` or the shape of the workspace whose GPU count fits ``gpu_count``; the
node group is found by name or id; a shared volume of the node group (Lustre before filestore before the first) is
mounted at the prefix its storage permissions grant, with ``TAO_RESULTS_ROOT`` on it and, on Lustre, the runner's S3
input cache (``<mount>/<bucket>/<key>``, reused while size and ETag match). Explicit ``mounts`` replace the
auto-detected one, each checked against the volume's storage permissions before anything is created.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.hooks.lepton.api import LeptonAPIHook
from airflow_provider_tao.jobs import JobSpec

NODE_GROUP_PARAMETER = "backend_details['dedicated_node_group']"


@dataclass(frozen=True)
class Placement:
    """Where a job runs: the shape, the node group, the mounts; resolved once per submission from the API.

    :param shape: the resource shape id.
    :param gpus_per_node: accelerators of the shape.
    :param node_group_id: the dedicated node group's id, or None for shared resources.
    :param node_group_name: its name (for messages).
    :param mounts: Lepton mount objects (``{"path", "from", "mount_path"}``).
    :param volume_mount: the container path of the shared volume (auto-detected or the first explicit one).
    :param volume_kind: ``lustre``, ``filestore``, ...
    :param stage_shape: the shape staging jobs use (the node group's smallest CPU shape, else the job's).
    :param memory_mb: the shape's memory, when listed.
    :param priority_class: the job's queue priority in Lepton's canonical form (``high-7000``), if asked for.
    :param can_be_preempted: whether the job may be preempted, if said.
    """

    shape: str
    gpus_per_node: int
    node_group_id: str | None = None
    node_group_name: str | None = None
    mounts: tuple[dict[str, Any], ...] = ()
    volume_mount: str | None = None
    volume_kind: str | None = None
    stage_shape: str | None = None
    memory_mb: int | None = None
    priority_class: str | None = None
    can_be_preempted: bool | None = None

    @property
    def results_root(self) -> str | None:
        return f"{self.volume_mount}/results" if self.volume_mount else None

    @property
    def cache_path(self) -> str | None:
        return self.volume_mount if self.volume_kind == "lustre" else None

    def spec_fields(self, *, staging: bool = False) -> dict[str, Any]:
        """The fields of a ``LeptonJobUserSpec`` that put a job here: shape (the staging shape for a staging job),
        node group affinity and mounts."""
        from leptonai.api.v2.types.affinity import LeptonResourceAffinity
        from leptonai.api.v2.types.deployment import Mount, QueueConfig

        affinity = None
        if self.node_group_id:
            affinity = LeptonResourceAffinity(allowed_dedicated_node_groups=[self.node_group_id])
        queue = None
        if not staging and (self.priority_class or self.can_be_preempted is not None):
            queue = QueueConfig(priority_class=self.priority_class, can_be_preempted=self.can_be_preempted)
        return {
            "resource_shape": self.stage_shape if staging else self.shape,
            "affinity": affinity,
            "mounts": [Mount(**m) for m in self.mounts],
            "queue_config": queue,
        }


#: Lepton's queue priorities: three tiers of three levels each, ``<tier>-<level>000`` (as the CLI's
#: ``--queue-priority`` normalizes them: a tier alone is its lowest level, a digit 1-9 the level itself).
_TIERS = {"low": (1, 2, 3), "mid": (4, 5, 6), "high": (7, 8, 9)}
PRIORITY_CLASSES = {level: f"{tier}-{level}000" for tier, levels in _TIERS.items() for level in levels}


def priority_class_of(value: Any) -> str | None:
    """``value`` as a canonical priority class (``high`` -> ``high-7000``, ``high-9`` / ``9`` -> ``high-9000``,
    ``mid-4000`` stays), or None when it is none of Lepton's."""
    text = str(value).strip().lower()
    if isinstance(value, bool) or not text:
        return None
    if text.isdigit() and int(text) in PRIORITY_CLASSES:
        return PRIORITY_CLASSES[int(text)]
    tier, _, level = text.partition("-")
    tier = {"l": "low", "m": "mid", "h": "high"}.get(tier, tier) if not level else tier
    levels = _TIERS.get(tier)
    if levels is None:
        return None
    if not level:
        return PRIORITY_CLASSES[levels[0]]
    number = int(level) if level.isdigit() else -1
    number = number // 1000 if number >= 1000 and number % 1000 == 0 else number
    return PRIORITY_CLASSES[number] if number in levels else None


def pick_shape(shapes: Sequence[dict[str, Any]], gpu_count: int) -> dict[str, Any] | None:
    """The shape for ``gpu_count`` GPUs per node: CPU-only for 0, the largest for -1 (all), else exactly that many
    accelerators, else the fewest above it. Shapes are ``{"id", "gpus", "cpu", "memory_mb"}``."""
    if gpu_count == 0:
        cpus = [s for s in shapes if not s["gpus"]]
        return min(cpus, key=lambda s: (s["cpu"], s["memory_mb"], s["id"]), default=None)
    gpus = [s for s in shapes if s["gpus"]]
    if gpu_count == -1:
        return max(gpus, key=lambda s: (s["gpus"], -s["cpu"], s["id"]), default=None)
    exact = [s for s in gpus if s["gpus"] == gpu_count]
    above = [s for s in gpus if s["gpus"] > gpu_count]
    return min(exact or above, key=lambda s: (s["gpus"], s["cpu"], s["memory_mb"], s["id"]), default=None)


def pick_volume(volumes: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The volume to mount: one named like Lustre, else filestore, else the first (the TAO SDK's order)."""
    for kind in ("lustre", "filestore"):
        found = [v for v in volumes if kind in str(v.get("name", "")).lower()]
        if found:
            return found[0]
    return volumes[0] if volumes else None


def volume_kind(volume: dict[str, Any]) -> str:
    name = str(volume.get("name", "")).lower()
    return "lustre" if "lustre" in name else "filestore" if "filestore" in name else str(volume.get("from") or "")


def _mount_source(volume: dict[str, Any]) -> str:
    kind = str(volume.get("from") or "nfs")
    return f"node-{'nfs' if kind in ('', 'UNK') else kind}:{volume['name']}"


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


class LeptonPlacementHook(LeptonAPIHook):
    """Placement of :class:`~airflow_provider_tao.hooks.lepton.LeptonHook` (its base; not a platform by itself).

    :param conn_id: the ``tao_lepton`` connection, or None for the environment's ``LEPTON_*`` variables.
    """

    def __init__(self, conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(conn_id, **kwargs)
        self._placements: dict[str, Placement] = {}
        self._last_placement: Placement | None = None
        self._quota_enabled: dict[str, bool] = {}

    # ----------------------------------------------------------------- the seed's discovery calls

    def list_resource_shapes(self, node_group: str | None = None) -> dict[str, dict[str, Any]]:
        """``{shape id: {"id", "name", "gpus", "gpu_type", "cpu", "memory_mb", "node_group_id"}}`` of the workspace
        (of one node group, by name or id), as the TAO SDK's ``list_resource_shapes``."""
        return {s["id"]: s for s in self._group_shapes(node_group)}

    def get_volumes(self, node_group_id: str | None = None) -> list[dict[str, Any]]:
        """``[{"name", "from_path", "type", "from", "default_mount_path"}]`` of a node group (the connection's by
        default), as the TAO SDK's ``get_volumes``."""
        group = self._node_group(node_group_id or self.setting("node_group"))
        if group is None:
            raise JobValidationError(
                "node_group_id", "no node group given", "Name one, or set node_group on the connection"
            )
        return group[1]

    def get_storage_permissions(self, volume_name: str, node_group_id: str) -> list[str]:
        """The path prefixes of ``volume_name`` this workspace may mount on a node group (name or id)."""
        group = self._node_group(node_group_id)
        ng_id = group[0] if group else node_group_id

        def call(client: Any) -> list[str]:
            return [p.path_prefix for p in client.nodegroup.list_storage_permissions(ng_id, volume_name)]

        return self._api_unless("reading storage permissions", call, {404}, [])

    def _node_group(
        self, name_or_id: str | None, parameter: str = NODE_GROUP_PARAMETER
    ) -> tuple[str, list[dict[str, Any]], str] | None:
        """``(id, volumes, name)`` of a node group given by name or id; an unknown one lists those that exist, in an
        error naming ``parameter`` (where the name came from)."""
        if not name_or_id:
            return None
        groups = self._api("listing node groups", lambda c: c.nodegroup.list_all())
        for group in groups:
            if name_or_id in (group.metadata.id_, group.metadata.name):
                volumes = [
                    {
                        "name": v.name,
                        "from": v.from_.value,
                        "from_path": v.from_path,
                        "type": volume_kind({"name": v.name, "from": v.from_.value}),
                        "default_mount_path": v.default_mount_path,
                    }
                    for v in group.spec.volumes or []
                ]
                self._quota_enabled[str(group.metadata.id_)] = bool(group.status and group.status.quota_enabled)
                return str(group.metadata.id_), volumes, str(group.metadata.name or group.metadata.id_)
        known = ", ".join(sorted(str(g.metadata.name or g.metadata.id_) for g in groups)) or "none"
        raise JobValidationError(
            parameter,
            f"node group {name_or_id!r} is not in workspace {self.workspace_id} (node groups: {known})",
            "Use one of them, here or as the connection's node_group",
        )

    def _group_shapes(self, node_group: str | None, *, known: bool = True) -> list[dict[str, Any]]:
        """The job shapes of a node group given by name or id (of the workspace without one). ``known=False``: a
        node group no longer listed (a finished job's) is asked for as given instead of refused."""
        try:
            group = self._node_group(node_group)
        except JobValidationError as exc:
            if known or exc.parameter != NODE_GROUP_PARAMETER:
                raise
            return self._shapes(node_group)
        return self._shapes(group[0], group[2]) if group else self._shapes(None)

    def _shapes(self, node_group_id: str | None, node_group_name: str | None = None) -> list[dict[str, Any]]:
        """The job shapes of a node group: asked by its id, then by its name when the id finds none (the client
        documents a name filter, the CLI's ``lep node resource-shape`` asks by id and falls back to the name)."""

        def ask(group: str | None) -> list[Any]:
            return list(self._api("listing resource shapes", lambda c: c.shapes.list_shapes(group, "job")))

        shapes = ask(node_group_id)
        if not shapes and node_group_name and node_group_name != node_group_id:
            shapes = ask(node_group_name)
        return [
            {
                "id": str(s.metadata.id_ or s.spec.name),
                "name": s.spec.name,
                "gpus": int(s.spec.accelerator_num or 0),
                "gpu_type": s.spec.accelerator_type,
                "cpu": float(s.spec.cpu or 0),
                "memory_mb": int(s.spec.memory_in_mb or 0),
                "node_group_id": s.spec.node_group_id,
            }
            for s in shapes
            if s.spec.listable_in is None or "job" in s.spec.listable_in
        ]

    # ----------------------------------------------------------------- placement (before submission)

    def placement(self, spec: JobSpec) -> Placement:
        """Shape, node group and mounts of ``spec``'s job (API reads, once per submission)."""
        cached = self._placements.get(spec.job_id)
        if cached is None:
            cached = self._placements[spec.job_id] = self._resolve_placement(spec)
        self._last_placement = cached
        return cached

    def _resolve_placement(self, spec: JobSpec) -> Placement:
        self._ready()
        details = self.platform_details(spec)
        if details.get("dedicated_node_group"):
            group = self._node_group(details["dedicated_node_group"])
        else:
            group = self._node_group(self.setting("node_group"), f"connection {self.conn_id!r} extra node_group")
        ng_id, volumes, ng_name = group if group else (None, [], None)
        shapes = self._shapes(ng_id, ng_name)
        wanted = details.get("resource_shape") or self.setting("resource_shape")
        listed = ", ".join(f"{s['id']} ({s['gpus']} GPU)" for s in shapes) or "none"
        where = f"node group {ng_name}" if ng_name else f"workspace {self.workspace_id}"
        if wanted:
            shape = next((s for s in shapes if wanted in (s["id"], s["name"])), None)
            if shape is None:
                raise JobValidationError(
                    "backend_details['resource_shape']",
                    f"{wanted!r} is not a resource shape of {where} (shapes: {listed})",
                    "Use one of them, or leave resource_shape unset to choose one from gpu_count",
                )
        else:
            shape = pick_shape(shapes, spec.gpu_count)
            if shape is None:
                asked = "no GPU" if spec.gpu_count == 0 else f"{spec.gpu_count} GPU(s) per node"
                raise JobValidationError(
                    "gpu_count",
                    f"no resource shape of {where} has {asked} (shapes: {listed})",
                    "Ask for a GPU count one of them has, or name a resource_shape",
                )
            if spec.gpu_count > 0 and shape["gpus"] != spec.gpu_count:
                self.log.warning(
                    "No shape of %s has exactly %d GPUs: using %s (%d GPUs)", where, spec.gpu_count, shape["id"],
                    shape["gpus"],
                )  # fmt: skip
        cpu = pick_shape([s for s in shapes if not s["gpus"]], 0)
        mounts, volume_mount, kind = self._mounts(details, ng_id, ng_name, volumes)
        priority, preemptible = self._queue(details, ng_id, ng_name)
        return Placement(
            shape=shape["id"],
            gpus_per_node=shape["gpus"],
            node_group_id=ng_id,
            node_group_name=ng_name,
            mounts=tuple(mounts),
            volume_mount=volume_mount,
            volume_kind=kind,
            stage_shape=cpu["id"] if cpu else shape["id"],
            memory_mb=shape["memory_mb"] or None,
            priority_class=priority,
            can_be_preempted=preemptible,
        )

    def _queue(self, details: dict[str, Any], ng_id: str | None, ng_name: str | None) -> tuple[str | None, bool | None]:
        """``priority_class`` (canonical) and ``can_be_preempted``: both are queue settings of a dedicated node
        group whose quota is enabled (what the CLI demands before it sends a ``queue_config``)."""
        raw, preemptible = details.get("priority_class"), details.get("can_be_preempted")
        if raw is None and preemptible is None:
            return None, None
        key = "priority_class" if raw is not None else "can_be_preempted"
        priority = None
        if raw is not None and (priority := priority_class_of(raw)) is None:
            raise JobValidationError(
                "backend_details['priority_class']",
                f"{raw!r} is not a Lepton queue priority",
                "Use low, mid or high (low-1000 ... high-9000, or a level 1-9), e.g. 'high' or 'mid-5000'",
            )
        if preemptible is not None and not isinstance(preemptible, bool):
            raise JobValidationError(
                "backend_details['can_be_preempted']", f"{preemptible!r} is not true or false", "Give true or false"
            )
        if ng_id is None:
            raise JobValidationError(
                f"backend_details[{key!r}]",
                "queue settings need a dedicated node group, and the job has none",
                "Set backend_details['dedicated_node_group'] (or the connection's node_group) to a dedicated node "
                "group with quota enabled, or drop the queue settings",
            )
        if not self._quota_enabled.get(ng_id):
            raise JobValidationError(
                f"backend_details[{key!r}]",
                f"node group {ng_name} does not have quota enabled, so it takes no queue priority",
                "Use a dedicated node group with quota enabled (ask the workspace admin), or drop the queue settings",
            )
        return priority, preemptible

    def _mounts(
        self, details: dict[str, Any], ng_id: str | None, ng_name: str | None, volumes: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], str | None, str | None]:
        """The job's mounts, the shared volume's container path and kind: explicit mounts (each checked against
        the volume's storage permissions) or the auto-detected volume at the prefix the permissions grant."""
        explicit = details.get("mounts")
        if explicit:
            return self._explicit_mounts(explicit, ng_id, ng_name, {v["name"]: v for v in volumes})
        if not volumes or details.get("auto_mount", True) is False:
            return [], None, None
        volume = pick_volume(volumes)
        assert volume is not None
        allowed = self.get_storage_permissions(volume["name"], str(ng_id))
        if not allowed:
            self.log.info("Volume %s of node group %s: no storage permission, not mounted", volume["name"], ng_name)
            return [], None, None
        target = str(volume.get("default_mount_path") or f"/mnt/{volume['name']}")
        return [{"path": allowed[0], "from": _mount_source(volume), "mount_path": target}], target, volume["type"]

    def _explicit_mounts(
        self, explicit: Any, ng_id: str | None, ng_name: str | None, by_name: dict[str, dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], str | None, str | None]:
        """``backend_details['mounts']``, each checked: a volume of the node group, an absolute mount path Lepton
        accepts, a path under a prefix the workspace may mount. The first is the shared volume."""
        from leptonai.api.v2.job_validation import validate_mount_path

        if not isinstance(explicit, list) or not all(isinstance(m, dict) for m in explicit):
            raise JobValidationError(
                "backend_details['mounts']",
                "is not a list of mappings",
                'Use [{"volume": "lustre-fs", "path": "/lustre/ws1/data", "mount_path": "/data"}]',
            )
        mounts, kinds = [], []
        for index, mount in enumerate(explicit):
            where = f"backend_details['mounts'][{index}]"
            name = str(mount.get("volume") or str(mount.get("from", "")).partition(":")[2])
            if name not in by_name:
                raise JobValidationError(
                    where,
                    f"volume {name!r} is not a volume of node group {ng_name} (volumes: "
                    f"{', '.join(sorted(by_name)) or 'none'})",
                    "Name one of them, or set dedicated_node_group to the node group that has it",
                )
            path, target = str(mount.get("path") or ""), str(mount.get("mount_path") or "")
            try:
                validate_mount_path(target)
            except ValueError as exc:
                raise JobValidationError(where, str(exc), "Mount it somewhere else, e.g. /data") from exc
            if not target.startswith("/"):
                raise JobValidationError(where, f"mount_path {target!r} is not absolute", "Use e.g. /data")
            allowed = self.get_storage_permissions(name, str(ng_id))
            if not any(_under(path, p) for p in allowed):
                raise JobValidationError(
                    where,
                    f"path {path!r} of volume {name} is not under a prefix this workspace may mount "
                    f"({', '.join(allowed) or 'none'})",
                    "Use a path under one of them, or ask the workspace admin for a storage permission",
                )
            mounts.append({"path": path, "from": _mount_source(by_name[name]), "mount_path": target})
            kinds.append(volume_kind(by_name[name]))
        return mounts, mounts[0]["mount_path"], kinds[0]

    def runner_mount_path(self, spec: JobSpec) -> str | None:
        return self.placement(spec).cache_path

    def results_dir_for(self, spec: JobSpec) -> str:
        """An explicit ``results_uri``, else ``results/`` on the job's shared volume, else the base rule."""
        if not spec.results_uri and (root := self.placement(spec).results_root):
            return f"{root}/{spec.job_id}"
        return super().results_dir_for(spec)

    def check_path(self, uri: str) -> bool:
        """A local input must be on a volume mounted into the job (the job itself checks that the file exists); the
        Airflow hosts cannot see it."""
        mounts = self._last_placement.mounts if self._last_placement else ()
        path = uri.removeprefix("file://")
        if any(_under(path, m["mount_path"]) for m in mounts):
            self.log.info("%s is on a volume mounted into the job: the job checks it", uri)
            return True
        raise JobValidationError(
            "inputs",
            f"{uri} is not on a volume mounted into the Lepton job "
            f"(mounts: {', '.join(m['mount_path'] for m in mounts) or 'none'})",
            "Use s3:// with storage_conn_id, or a path under one of the mounts",
        )
