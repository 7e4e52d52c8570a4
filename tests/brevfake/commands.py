"""The commands of the fake ``brev``, each following its brev-cli v0.6.327 source (``pkg/cmd/<name>``).

Every command writes what the real one writes, where it writes it (stdout vs stderr, piped vs terminal), and
fails with the real error text (:class:`tests.brevfake.goerr.GoError`). The waits the real commands do (create's
and copy's 5 s polls, exec's start-up polls, ssh connect timeouts) are real sleeps multiplied by the world's time
scale.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .client import Session
from .flags import Flag
from .goerr import GoError, GoPanic, errorf, exit_status, multierror, validation
from .server import LostResponse
from .world import World

CAPABILITY = {"A10G": 8.6, "L4": 8.9, "T4": 7.5, "A100": 8.0, "H100": 9.0, "L40S": 8.9, "V100": 7.0}
NAME_RULE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*$")
SORTS = (
    "arch", "boot-time", "capability", "disk", "gpu-count", "price", "provider", "ram", "total-vram", "type", "vcpu",
    "vram",
)  # fmt: skip


@dataclass
class Io:
    """The process's streams, as the real CLI sees them."""

    stdout_piped: bool
    stdin_piped: bool
    color: bool
    write_out: Callable[[bytes], None]
    write_err: Callable[[bytes], None]
    read_in: Callable[[], bytes]

    def out(self, text: str) -> None:
        self.write_out(text.encode())

    def err(self, text: str) -> None:
        self.write_err(text.encode())

    def paint(self, code: int, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color and text else text

    def green(self, text: str) -> str:
        return self.paint(32, text)

    def yellow(self, text: str) -> str:
        return self.paint(33, text)

    def red(self, text: str) -> str:
        return self.paint(31, text)

    def stdin_names(self) -> list[str]:
        """Lines of a piped stdin, read to EOF (what ``bufio.Scanner`` over ``os.Stdin`` does)."""
        if not self.stdin_piped:
            return []
        return [line.strip() for line in self.read_in().decode(errors="replace").splitlines() if line.strip()]


@dataclass
class Context:
    """What a command works with."""

    io: Io
    world: World
    session: Session
    targets: list[str] = field(default_factory=list)
    ssh_agents_started: int = 0

    @property
    def scale(self) -> float:
        return self.world.time_scale()

    def sleep(self, world_seconds: float) -> None:
        time.sleep(world_seconds * self.scale)


Command = Callable[[Context, dict[str, Any], list[str]], None]


# ---------------------------------------------------------------------------------------------------- login
def login(ctx: Context, v: dict[str, Any], args: list[str]) -> None:
    io, session = ctx.io, ctx.session
    if args:
        raise validation(f'unknown command "{args[0]}" for "brev login"')
    api_key = v["api-key"].strip()
    if api_key:
        if v["token"] or v["skip-browser"] or v["email"] or v["auth"]:
            raise validation("api-key cannot be used with token, skip-browser, email, or auth flags")
        org_id = v["org-id"].strip()
        if not org_id:
            raise validation("api key auth requires an org id; run brev login --api-key <api-key> --org-id <org-id>")
        if not api_key.startswith("bak-"):
            raise validation("api key must start with bak-")
        tokens = session.read_tokens() or {}
        session.save_tokens({**tokens, "api_key": api_key, "api_key_org_id": org_id})
        session.set_active_org({"id": org_id, "name": org_id})
        io.out(io.green(f"API key saved for org {org_id}") + "\n")
        return
    if v["org-id"].strip():
        raise validation("org-id can only be used with api-key")
    if v["auth"] not in ("", "nvidia", "legacy"):
        raise validation("auth provider must be nvidia or legacy")
    session.startup_notice()
    if v["email"] and v["auth"] == "legacy":
        raise validation("email flag can only be used with nvidia auth provider")
    io.out("\n" + f"   {io.green('▸')}     Starting Login\n" + "\n")
    token = v["token"]
    if token:
        if session.token_valid(token):
            session.save_tokens({"access_token": token, "refresh_token": "auto-login"})
        else:
            session.save_tokens({"access_token": "auto-login", "refresh_token": token})
    else:
        io.out(io.green("Enter your email: "))
        io.out("failed.\n\n")
        raise GoError("EOF")
    user = session.me(login=False)
    org = session.active_org(login=False)
    if org is None:
        name = f"{user['username']}-hq"
        io.out(f"Creating your first org {name} ...\n")
        with ctx.world.mutate() as state:
            org = {"id": f"org{len(state['orgs'])}x", "name": name, "userNetworkId": ""}
            state["orgs"].append(org)
        io.out("done!\n")
    orgs = session.call(session.server.orgs, login=False)
    everyone = session.call(lambda t: session.server.workspaces(t, org["id"]), login=False)
    mine = [w for w in everyone if w["createdByUserId"] == user["id"]]
    io.out(io.green("current organization: ") + io.yellow(f"{org['name']}\n"))
    if len(orgs) > 1:
        other = next(o for o in orgs if o["id"] != org["id"])
        io.out(io.green("switch organizations:\n") + io.yellow(f"\tbrev set {other['name']}\n"))
    if not everyone:
        io.out(io.green("create an instance:\n"))
    if not mine and len(everyone) > 1:
        io.out(io.green("list teammates instances:\n") + io.yellow("\tbrev ls --all\n"))
        io.out(io.green("clone a teammate's instance:\n") + io.yellow(f"\tbrev start {everyone[0]['name']}\n"))
    if mine:
        io.out(io.green("list your instances:\n") + io.yellow("\tbrev ls\n"))
    io.out(f"\n👋 New to Brev? Run {io.yellow('brev hello')} for a guided walkthrough.\n")


def logout(ctx: Context, v: dict[str, Any], args: list[str]) -> None:
    if args:
        raise validation(f'unknown command "{args[0]}" for "brev logout"')
    for name in ("credentials.json", "active_org.json"):
        (ctx.session.brev_dir / name).unlink(missing_ok=True)


def set_org(ctx: Context, v: dict[str, Any], args: list[str]) -> None:
    if not args:
        raise validation("requires at least 1 arg(s), only received 0")
    if ctx.session.is_api_key():
        raise validation(
            "api key auth is scoped to the org saved during login; run brev login --api-key <api-key> "
            "--org-id <org-id> to change it"
        )
    orgs = ctx.session.organizations(args[0])
    if not orgs:
        raise GoError(f"no orgs exist with name {args[0]}")
    if len(orgs) > 1:
        raise GoError(f"more than one org exist with name {args[0]}")
    ctx.session.set_active_org(orgs[0])


def refresh(ctx: Context, v: dict[str, Any], args: list[str]) -> None:
    ctx.io.out("refreshing brev...\n")
    ctx.session.refresh_ssh_config()
    ctx.io.out(ctx.io.green("brev has been refreshed\n"))


# ---------------------------------------------------------------------------------------------------- ls
def ls(ctx: Context, v: dict[str, Any], args: list[str]) -> None:
    io, session = ctx.io, ctx.session
    api_key = session.is_api_key()
    user = None if api_key else session.me()
    if v["org"]:
        if api_key:
            raise validation("api key auth is scoped to the org saved during login; --org is not supported")
        orgs = session.organizations(v["org"])
        if not orgs:
            raise validation(f"no org found with name {v['org']}")
        if len(orgs) > 1:
            raise validation(f"more than one org found with name {v['org']}")
        org = orgs[0]
    else:
        found = session.active_org()
        if found is None:
            raise validation("no orgs exist")
        org = found
    if len(args) > 1:
        raise validation("too many args provided")
    kind = _ls_kind(args[0]) if args else "instances"
    if kind == "orgs":
        if api_key:
            raise validation("api key auth cannot list organizations")
        _ls_orgs(ctx, v["json"])
    elif kind == "nodes":
        if v["json"]:
            io.out("[]\n")
        elif not io.stdout_piped:
            io.out(io.yellow("No external nodes in this org.") + "\n")
    elif kind == "instances":
        _ls_instances(ctx, org, user, everyone=v["all"] or api_key, as_json=v["json"], show_all=v["all"])


def _ls_kind(arg: str) -> str:
    for kind, words in (
        ("orgs", ("org", "orgs", "organization", "organizations")),
        ("instances", ("workspace", "workspaces", "instance", "instances")),
        ("nodes", ("node", "nodes")),
    ):
        if arg in words:
            return kind
    return "nothing"  # users / hosts (admins only) and unknown words print nothing


def _ls_orgs(ctx: Context, as_json: bool) -> None:
    io, session = ctx.io, ctx.session
    orgs = session.organizations()
    if not orgs:
        io.out("[]\n" if as_json else io.yellow("You don't have any orgs. Create one! https://brev.nvidia.com") + "\n")
        return
    active = session.active_org()
    if as_json:
        infos = [
            {"name": o["name"], "id": o["id"], "is_active": bool(active and o["id"] == active["id"])} for o in orgs
        ]
        io.out(go_json(infos) + "\n")
        return
    io.out(io.yellow("Your organizations:") + "\n")
    rows = [[("* " if active and o["id"] == active["id"] else "") + o["name"], o["id"]] for o in orgs]
    io.out(render_table(["NAME", "ID"], rows))
    if len(orgs) > 1 and active:
        other = next(o for o in orgs if o["id"] != active["id"])
        io.out("\n" + io.green("Switch orgs:\n") + io.yellow(f"\tbrev set <NAME> ex: brev set {other['name']}\n"))


def _ls_instances(
    ctx: Context, org: dict[str, Any], user: dict[str, Any] | None, *, everyone: bool, as_json: bool, show_all: bool
) -> None:
    io, session = ctx.io, ctx.session
    workspaces = session.call(lambda t: session.server.workspaces(t, org["id"]))
    gpus = {t["type"]: (t["gpu"] or "-") for t in session.server.public_instance_types()}
    shown = workspaces if everyone or user is None else [w for w in workspaces if w["createdByUserId"] == user["id"]]
    if as_json:
        infos = [
            {
                "name": w["name"],
                "id": w["id"],
                "status": display_status(w),
                "build_status": w["verbBuildStatus"],
                "shell_status": "READY"
                if w["status"] == "RUNNING" and w["verbBuildStatus"] == "COMPLETED"
                else "NOT READY",
                "health_status": w["healthStatus"],
                "instance_type": w["instanceType"],
                "instance_kind": "gpu" if gpus.get(w["instanceType"], "-") != "-" else "cpu",
                "gpu": gpus.get(w["instanceType"], "-"),
            }
            for w in shown
        ]
        io.out(go_json({"workspaces": infos or None}) + "\n")
        return
    if user is None:  # API key: the org's instances
        if not shown:
            io.out(io.yellow(f"No instances in org {org['name']}\n") + "\n")
            return
        io.out(f"Org {io.yellow(org['name'])} has {len(shown)} instances\n")
        io.out(_instances_table(shown, gpus) + "\n")
        return
    orgs = session.organizations()
    if not shown:
        io.out(io.yellow(f"No instances in org {org['name']}\n") + "\n")
        if not show_all and workspaces:
            io.out(io.green("See teammates' instances:\n") + io.yellow("\tbrev ls --all\n"))
        else:
            io.out(io.green("Start a new instance:\n"))
        if len(orgs) > 1:
            other = next(o for o in orgs if o["id"] != org["id"])
            io.out(io.green("Switch to another org:\n") + io.yellow(f"\tbrev set {other['name']}\n"))
        return
    lead = f"{len(shown)} instances in Org" if show_all else f"You have {len(shown)} instances in Org"
    io.out(f"{lead} {io.yellow(org['name'])}\n")
    io.out(_instances_table(shown, gpus) + "\n")


def display_status(workspace: dict[str, Any]) -> str:
    """RUNNING with an UNHEALTHY health status shows as UNHEALTHY."""
    if workspace["status"] == "RUNNING" and workspace["healthStatus"] == "UNHEALTHY":
        return "UNHEALTHY"
    return str(workspace["status"])


def _instances_table(workspaces: list[dict[str, Any]], gpus: dict[str, str]) -> str:
    rows = []
    for w in workspaces:
        shell = "READY" if w["status"] == "RUNNING" and w["verbBuildStatus"] == "COMPLETED" else "NOT READY"
        gpu = gpus.get(w["instanceType"], "-")
        rows.append([w["name"], display_status(w), w["verbBuildStatus"], shell, w["id"], w["instanceType"], gpu])
    return render_table(["NAME", "STATUS", "BUILD", "SHELL", "ID", "MACHINE", "GPU"], rows)


def go_json(value: Any) -> str:
    """``json.MarshalIndent(value, "", "  ")``: integral floats print without a fraction (``16``, not ``16.0``)."""

    def as_go(item: Any) -> Any:
        if isinstance(item, float) and item.is_integer():
            return int(item)
        if isinstance(item, dict):
            return {k: as_go(v) for k, v in item.items()}
        if isinstance(item, list):
            return [as_go(v) for v in item]
        return item

    return json.dumps(as_go(value), indent=2)


def render_table(header: list[str], rows: list[list[str]]) -> str:
    """go-pretty with brev's options (no borders, no separators): each cell padded by one space each side."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["".join(f" {str(cell).ljust(widths[i])} " for i, cell in enumerate(row)) for row in [header, *rows]]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------- search
def search_rows(ctx: Context, v: dict[str, Any], gpu: bool) -> list[dict[str, Any]]:
    """``ProcessInstances`` + the filters + the sort of ``brev search``."""
    rows = []
    for spec in ctx.session.server.public_instance_types():
        if bool(spec["gpu_count"]) != gpu:
            continue
        capability = CAPABILITY.get(spec["gpu"], 0.0)
        row = {
            "type": spec["type"],
            "cloud": spec["provider"],
            "provider": spec["provider"],
            "gpu_name": spec["gpu"],
            "gpu_count": spec["gpu_count"],
            "vram_per_gpu_gb": float(spec["vram_gb"]),
            "total_vram_gb": float(spec["vram_gb"] * spec["gpu_count"]),
            "capability": capability,
            "vcpus": spec["vcpu"],
            "memory": f"{spec['memory_gb']}GiB",
            "ram_gb": float(spec["memory_gb"]),
            "arch": "x86_64",
            "disk_min_gb": 100.0,
            "disk_max_gb": 16000.0,
            "boot_time_seconds": spec["boot_minutes"] * 60,
            "stoppable": spec["stoppable"],
            "rebootable": True,
            "flex_ports": spec["provider"] in ("aws", "gcp"),
            "target_disk_gb": 100.0,
            "price_per_hour": spec["price"],
        }
        if gpu and v.get("gpu-name") and v["gpu-name"].lower() not in spec["gpu"].lower():
            continue
        if v.get("provider") and v["provider"].lower() not in spec["provider"].lower():
            continue
        if gpu and (v.get("min-vram") or 0) > row["vram_per_gpu_gb"]:
            continue
        if gpu and (v.get("min-total-vram") or 0) > row["total_vram_gb"]:
            continue
        if gpu and (v.get("min-capability") or 0) > capability:
            continue
        if v.get("max-boot-time") and row["boot_time_seconds"] > v["max-boot-time"] * 60:
            continue
        if v.get("stoppable") and not spec["stoppable"]:
            continue
        rows.append(row)
    key = {"gpu-count": "gpu_count", "vram": "vram_per_gpu_gb", "total-vram": "total_vram_gb", "vcpu": "vcpus"}
    sort = (v.get("sort") or "price").lower()
    field_name = key.get(sort, {"price": "price_per_hour", "boot-time": "boot_time_seconds"}.get(sort, sort))
    rows.sort(key=lambda r: (r.get(field_name, r["price_per_hour"]), r["type"]), reverse=bool(v.get("desc")))
    return rows


def search(ctx: Context, v: dict[str, Any], args: list[str]) -> None:
    io = ctx.io
    sort = v["sort"]
    if sort and sort.lower() not in SORTS:
        raise validation(f'invalid sort option "{sort}". Valid options: {", ".join(SORTS)}')
    gpu = not (args and args[0] == "cpu")
    rows = search_rows(ctx, v, gpu)
    what = "GPU" if gpu else "CPU"
    if not rows:
        if v["json"]:
            io.out("[]\n")
        elif not io.stdout_piped:
            io.out(io.yellow(f"No {what} instances match the specified filters") + "\n")
        return
    if v["json"]:
        io.out(go_json(rows) + "\n")
        return
    header = ["TYPE", "TARGET_DISK", "PROVIDER", "GPU", "COUNT", "VRAM/GPU", "TOTAL_VRAM", "CAPABILITY", "DISK"]
    header += ["$/GB/MO", "BOOT", "FEATURES", "VCPUs", "$/HR"]
    table = [
        [
            r["type"], f"{r['target_disk_gb']:.0f}", r["provider"], r["gpu_name"] or "-", str(r["gpu_count"]),
            f"{r['vram_per_gpu_gb']:.0f}GB", f"{r['total_vram_gb']:.0f}GB", f"{r['capability']:.1f}",
            "100GB-16TB", "-", f"{r['boot_time_seconds'] // 60}m",
            "".join(c for c, on in (("S", r["stoppable"]), ("R", r["rebootable"]), ("P", r["flex_ports"])) if on),
            str(r["vcpus"]), f"${r['price_per_hour']:.2f}",
        ]
        for r in rows
    ]  # fmt: skip
    io.out(render_table(header, table))
    if not io.stdout_piped:
        io.out("\n" + io.green(f"Found {len(rows)} {what} instance types") + "\n")


# ---------------------------------------------------------------------------------------------------- create
def create(ctx: Context, v: dict[str, Any], args: list[str]) -> None:
    io = ctx.io
    name = v["name"] or (args[0] if args else "")
    if v["launchable"]:
        raise GoError(f'failed to fetch launchable "{v["launchable"]}": launchables are not available in brevfake')
    if v["mode"] not in ("vm", "k8s", "container", "compose"):
        raise validation(f'invalid mode "{v["mode"]}": must be one of vm, k8s, container, compose')
    if v["mode"] == "container" and not v["container-image"]:
        raise validation("--container-image is required for container mode")
    if v["mode"] == "compose" and not v["compose-file"]:
        raise validation("--compose-file is required for compose mode")
    if not name:
        raise validation("name is required")
    if len(name) > 63:
        raise validation(f"name must be 63 characters or fewer (got {len(name)})")
    if not NAME_RULE.match(name):
        raise validation(
            "name must start with a letter or digit and contain only letters, digits, hyphens, underscores, and dots"
        )
    if v["count"] < 1:
        raise validation("--count must be at least 1")
    types = _instance_types(ctx, v["type"])
    startup_script = read_at_file(v["startup-script"])
    if not types:
        filters = {**v, "min-total-vram": v["min-total-vram"] or 20.0, "min-capability": v["min-capability"] or 8.0}
        if not any(v[k] for k in ("gpu-name", "provider", "min-vram", "min-disk", "max-boot-time", "stoppable")):
            filters["max-boot-time"] = filters["max-boot-time"] or 7
        types = [r["type"] for r in search_rows(ctx, filters, gpu=True)]
        if not types:
            raise validation("no GPU instances match the specified filters. Try 'brev search' to see available options")
    if v["dry-run"]:
        io.out(", ".join(types) + "\n")
        return
    _run_create(ctx, name, types, v, startup_script)


def read_at_file(value: str) -> str:
    """A flag or argument that reads a local file when it starts with ``@`` (exec's command, create's startup
    script); a missing file fails as Go's ``os.ReadFile`` does."""
    if not value.startswith("@"):
        return value
    try:
        with open(value[1:]) as script:
            return script.read()
    except OSError as missing:
        raise GoError(f"open {value[1:]}: {(missing.strerror or 'error').lower()}") from None


def _instance_types(ctx: Context, flag: str) -> list[str]:
    """``parseInstanceTypes``: the ``--type`` list, then whatever a piped stdin holds (read to EOF): a
    ``brev search --json`` array, or table lines whose first field looks like a type (letters and digits)."""
    types = [t.strip() for t in flag.split(",") if t.strip()]
    if not ctx.io.stdin_piped:
        return types
    text = ctx.io.read_in().decode(errors="replace").strip()
    if not text:
        return types
    if text.startswith("["):
        try:
            types += [str(item["type"]) for item in json.loads(text)]
        except (ValueError, TypeError, KeyError):
            raise GoError("invalid character in JSON input") from None
        return types
    for index, raw in enumerate(text.split("\n")):
        if index == 0 and ("TYPE" in raw or "GPU" in raw):
            continue
        line = raw.strip()
        if not line or line.startswith("Found "):
            continue
        first = line.split()[0]
        if len(first) >= 2 and any(c.isalpha() for c in first) and any(c.isdigit() for c in first):
            types.append(first)
    return types


def _run_create(ctx: Context, base: str, types: list[str], v: dict[str, Any], startup_script: str) -> None:
    io, session = ctx.io, ctx.session
    piped = io.stdout_piped

    def log(text: str) -> None:
        (io.err if piped else io.out)(text)

    def colour(text: str, paint: Callable[[str], str]) -> str:
        return text if piped else paint(text)

    if not session.is_api_key():
        session.me()
    org = session.active_org()
    if org is None:
        raise validation("no organization found")
    try:
        available: dict[str, dict[str, Any]] | None = session.call(
            lambda t: session.server.available_types(t, org["id"])
        )
    except GoError as unavailable:
        log(f"Warning: could not fetch instance types with workspace groups: {unavailable.full}\n")
        log("Falling back to default workspace group\n")
        available = None
    count, parallel = v["count"], max(1, v["parallel"])
    log(f"Attempting to create {count} instance(s) with {parallel} parallel attempts\n")
    log(f"Instance types to try: {', '.join(types)}\n\n")
    created: list[dict[str, Any]] = []
    for instance_type in types:
        if len(created) >= count:
            break
        log(f"Trying {instance_type} for {count - len(created)} instance(s)...\n")
        had_failure, fatal = False, ""
        group = (available or {}).get(instance_type, {}).get("workspace_group_id", "")
        if available is not None and not group:
            reason = (
                f'instance type "{instance_type}" is currently unavailable (no capacity); try again later or run '
                "'brev search' to find another type"
                if instance_type in available
                else f"instance type \"{instance_type}\" is not a recognized type; run 'brev search' to see "
                "available types"
            )
            log(f"Skipping: {reason}\n")
            had_failure = True
        else:
            workers = min(parallel, count - len(created))
            for offset, index in enumerate(range(len(created), count)):
                worker = offset % workers + 1
                name = base if count == 1 else f"{base}-{index + 1}"
                log(f"[Worker {worker}] Trying {instance_type} for instance '{name}'...\n")
                try:
                    workspace = _create_one(
                        ctx, org["id"], name, instance_type, group=group, startup_script=startup_script
                    )
                except GoError as failed:
                    log(f"[Worker {worker}] {colour(instance_type, io.yellow)} Failed: {failed.full}\n")
                    had_failure = True
                    if "duplicate workspace" in failed.full:
                        fatal = (
                            f"workspace '{name}' already exists. Use a different name or delete the existing workspace"
                        )
                    continue
                log(f"[Worker {worker}] {colour(instance_type, io.green)} Success! Created instance '{name}'\n")
                created.append(workspace)
                ctx.targets.append(name)
        if fatal:
            log(f"\nError: {fatal}\n")
            break
        if not had_failure and len(created) >= count:
            break
        if len(created) < count and had_failure:
            log(f"\nType {instance_type} had failures, trying next type...\n\n")
    if len(created) < count:
        log(f"\nWarning: Only created {len(created)}/{count} instances\n")
        if created:
            log("Successfully created instances:\n")
            for workspace in created:
                log(f"  - {workspace['name']} (ID: {workspace['id']})\n")
        raise validation(f"could only create {len(created)}/{count} instances")
    if not v["detached"]:
        log("\nWaiting for instance(s) to be ready...\n")
        log("You can safely ctrl+c to exit\n")
        for workspace in created:
            failure = _poll_until_ready(ctx, workspace, v["timeout"])
            if failure is None:
                log(f"  {workspace['name']}: {colour('Ready', io.green)}\n")
            elif "timeout waiting" in failure:
                log(f"  {workspace['name']}: Timeout waiting for ready state\n")
            else:
                log(f"  {workspace['name']}: {colour(failure, io.red)}\n")
    if piped:
        io.out("".join(f"{w['name']}\n" for w in created))
        return
    io.out("\n" + io.green(f"Successfully created {len(created)} instance(s)!\n\n") + "\n")
    for workspace in created:
        io.out(
            f"Instance: {io.green(workspace['name'])}\n  ID: {workspace['id']}\n  Type: {workspace['instanceType']}\n"
        )
        io.out("  Connect:\n")
        io.out(
            f"    {io.yellow('brev open ' + workspace['name'])}\n    {io.yellow('brev shell ' + workspace['name'])}\n\n"
        )


def _create_one(
    ctx: Context, org_id: str, name: str, instance_type: str, *, group: str, startup_script: str
) -> dict[str, Any]:
    session = ctx.session
    if not group:
        raise validation(
            f'could not resolve workspace group for "{instance_type}" (instance-type listing was unavailable); '
            "please retry"
        )
    try:
        return session.call(
            lambda t: session.server.create_workspace(
                t, org_id, name, instance_type, group=group, startup_script=startup_script
            )
        )
    except LostResponse:
        url = f"https://brevapi.us-west-2-prod.control-plane.brev.dev/api/organizations/{org_id}/workspaces"
        url += "?cli_version=v0.6.327&local=true&os=linux&utm_source=cli"
        ctx.io.err(f'WARN  RESTY Post "{url}": unexpected EOF, Attempt 1\n')
        ctx.io.err(f'ERROR RESTY Post "{url}": unexpected EOF\n')
        raise GoError(f'Post "{url}": unexpected EOF').traced(
            "pkg/cmd/gpucreate.(*createContext).createWorkspace", "pkg/cmd/gpucreate/gpucreate.go", 1075
        ) from None
    except GoError as failed:
        raise failed.traced(
            "pkg/cmd/gpucreate.(*createContext).createWorkspace", "pkg/cmd/gpucreate/gpucreate.go", 1075
        ) from None


def _poll_until_ready(ctx: Context, workspace: dict[str, Any], timeout_s: int) -> str | None:
    """``pollUntilReady``: ``None`` once RUNNING, else why not (every 5 s until ``--timeout``)."""
    deadline = time.monotonic() + timeout_s * ctx.scale
    while time.monotonic() < deadline:
        try:
            current = ctx.session.workspace(workspace["id"])
        except GoError as failed:
            return failed.full
        if current["status"] == "RUNNING":
            return None
        if current["status"] == "FAILURE":
            detail = f": {current['statusMessage']}" if current["statusMessage"] else ""
            return f"instance {current['name']} failed{detail}"
        ctx.sleep(5)
    return "timeout waiting for instance to be ready"


# ---------------------------------------------------------------------------------------------------- exec
def exec_command(ctx: Context, v: dict[str, Any], args: list[str]) -> None:
    io = ctx.io
    if not args:
        raise GoError("requires at least 1 arg(s), only received 0")
    command, names = args[-1], args[:-1] + io.stdin_names()
    if not names:
        raise validation("instance name required: provide as argument or pipe from another command")
    command = read_at_file(command)
    if not command:
        raise validation("command is required")
    errors = []
    for name in names:
        ctx.targets.append(name)
        if len(names) > 1:
            io.err(f"\n=== {name} ===\n")
        try:
            _exec_on(ctx, name, v["host"], command)
        except GoError as failed:
            if len(names) > 1:
                io.err(f"Error on {name}: {failed.full}\n")
                errors.append(failed)
                continue
            raise
        if io.stdout_piped:
            io.out(f"{name}\n")
    if errors:
        raise multierror(errors)


def _ssh(ctx: Context, alias: str, command: str, connect_timeout: float) -> int:
    """``runSSHWithTimeout``. Its shell line starts an ``ssh-agent`` (never stopped) when ``SSH_AUTH_SOCK`` is
    unset: the fake counts those instead of leaking them."""
    from . import instances  # lazily: API-only calls start faster without the engine client

    if not os.environ.get("SSH_AUTH_SOCK"):
        ctx.ssh_agents_started += 1

    def relay(stream: int, chunk: bytes) -> None:
        (ctx.io.write_out if stream == 1 else ctx.io.write_err)(chunk)

    return instances.ssh_run(ctx.world, alias, command, connect_timeout=connect_timeout, on_output=relay)


def _collect(into: list[bytes]) -> Callable[[int, bytes], None]:
    return lambda _stream, chunk: into.append(chunk)


def _ssh_probe(ctx: Context, alias: str, checked: bool = True) -> str | None:
    """``WaitForSSHToBeAvailable``: ``ssh <alias> echo " "`` until it works; ``None`` when it does, else the
    error (the second line of ssh's output, as the source picks it, decides whether it is worth waiting).
    ``checked=False`` is ``copy.go`` ``waitForSSHToBeAvailable``: ``strings.Split(out, "\n")[1]`` without a length
    check, so a failure whose output has no newline panics."""
    from . import instances  # lazily: API-only calls start faster without the engine client

    for attempt in range(41):
        output: list[bytes] = []
        code = instances.ssh_run(ctx.world, alias, 'echo " "', connect_timeout=10, on_output=_collect(output))
        if code == 0:
            return None
        lines = b"".join(output).decode(errors="replace").split("\n")
        if len(lines) < 2 and not checked:
            frames = [("pkg/cmd/copy.waitForSSHToBeAvailable", "pkg/cmd/copy/copy.go", 264),
                      ("pkg/cmd/copy.setupSSHConnection", "pkg/cmd/copy/copy.go", 175),
                      ("pkg/cmd/copy.runCopyCommand", "pkg/cmd/copy/copy.go", 97)]  # fmt: skip
            raise GoPanic(f"runtime error: index out of range [1] with length {len(lines)}", frames)
        second = lines[1] if len(lines) > 1 else lines[0]
        satisfactory = any(
            s in second for s in ("Connection refused", "Operation timed out", "Warning:", "Connection timed out")
        )
        if attempt == 40 or not satisfactory:
            return "\n" + second
        ctx.sleep(1)
    return None


def _exec_on(ctx: Context, name: str, host: bool, command: str) -> None:
    """``runExecCommand``: ssh straight away; on any failure (a failing command included) look the instance up,
    start it if STOPPED, and run the command once more."""
    io, session = ctx.io, ctx.session
    here = ("pkg/cmd/exec.runExecCommand", "pkg/cmd/exec/exec.go")
    alias = f"{name}-host" if host else name
    code = _ssh(ctx, alias, command, 5)
    if code == 0:
        return
    first = _ssh_error(code)
    io.err("Connection failed, checking instance status...\n")
    try:
        workspace = session.user_workspace(name)
    except GoError:
        raise errorf(
            f'ssh connection failed and could not look up instance "{name}": %w\n'
            "Please check your instances with: brev ls",
            first,
        ).traced(*here, 201) from None
    if workspace["status"] == "STOPPED":
        _start_stopped(ctx, name, workspace, 600)
        _poll_until(ctx, workspace["id"], "RUNNING", 600)
        session.refresh_ssh_config()
        probe = _ssh_probe(ctx, alias)
        if probe is not None:
            raise (
                GoError(probe)
                .traced("pkg/cmd/util.WaitForSSHToBeAvailable", "pkg/cmd/util/ssh.go", 75)
                .traced(*here, 230)
            )
        code = _ssh(ctx, alias, command, 10)
        if code != 0:
            raise _ssh_error(code).traced(*here, 235)
        return
    if workspace["status"] != "RUNNING":
        raise GoError(f'instance "{name}" is in state "{workspace["status"]}" — please check with: brev ls').traced(
            *here, 242
        )
    session.refresh_ssh_config()
    probe = _ssh_probe(ctx, alias)
    if probe is not None:
        wait_error = GoError(probe).traced("pkg/cmd/util.WaitForSSHToBeAvailable", "pkg/cmd/util/ssh.go", 75)
        raise errorf(f'could not connect to instance "{name}": %w\nPlease check with: brev ls', wait_error).traced(
            *here, 262
        )
    code = _ssh(ctx, alias, command, 10)
    if code != 0:
        raise _ssh_error(code).traced(*here, 269)


def _ssh_error(code: int) -> GoError:
    """What ``runSSHWithTimeout`` returns when ssh (or the remote command) exits non-zero."""
    return exit_status(code).traced("pkg/cmd/exec.runSSHWithTimeout", "pkg/cmd/exec/exec.go", 311)


def _start_stopped(ctx: Context, name: str, workspace: dict[str, Any], timeout_s: float | None) -> None:
    """``util.StartWorkspaceIfStopped``."""
    session = ctx.session
    started = session.call(lambda t: session.server.start_workspace(t, workspace["id"]))
    ctx.io.out(ctx.io.yellow(f"Instance {started['name']} is starting. \n\n"))
    _poll_until(ctx, workspace["id"], "RUNNING", timeout_s)
    session.user_workspace(name)


def _poll_until(ctx: Context, workspace_id: str, state: str, timeout_s: float | None) -> None:
    """``util.PollUntil`` (and copy's / start's variants without a timeout): sleep 5 s, then look."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s * ctx.scale
    while True:
        if deadline is not None and time.monotonic() > deadline:
            minutes = int(timeout_s or 0) // 60
            raise GoError(f"timed out waiting for instance to reach {state} state after {minutes}m0s")
        ctx.sleep(5)
        if ctx.session.workspace(workspace_id)["status"] == state:
            return


# ---------------------------------------------------------------------------------------------------- copy
def copy(ctx: Context, v: dict[str, Any], args: list[str]) -> None:
    from . import instances  # lazily: API-only calls start faster without the engine client

    io, session = ctx.io, ctx.session
    if len(args) != 2:
        raise validation(f"accepts 2 arg(s), received {len(args)}")
    session.access_token(login=True)
    (src_instance, src_path), (dst_instance, dst_path) = (_instance_path(a) for a in args)
    if bool(src_instance) == bool(dst_instance):
        raise validation("exactly one of source or destination must be an instance path (format: instance_name:/path)")
    upload = bool(dst_instance)
    name, remote, local = (dst_instance, dst_path, args[0]) if upload else (src_instance, src_path, args[1])
    if upload and not os.path.exists(local):
        raise validation(f"local file or directory does not exist: {local}")
    ctx.targets.append(name)
    workspace = session.user_workspace(name)
    if workspace["status"] == "STOPPED":
        _start_stopped(ctx, workspace["name"], workspace, None)
    _poll_until(ctx, workspace["id"], "RUNNING", None)
    workspace = session.user_workspace(workspace["name"])
    if workspace["status"] != "RUNNING":
        raise GoError("Workspace is not running")
    alias = f"{workspace['name']}-host" if v["host"] else workspace["name"]
    session.refresh_ssh_config()
    probe = _ssh_probe(ctx, alias, checked=False)
    if probe is not None:
        raise GoError(probe)
    started = time.monotonic()
    # scp resolves the alias itself, through the ssh it runs (not the one the probe above ran)
    instance = instances.instance_at(ctx.world, instances.scp_resolve(alias, upload))
    try:
        if instance is None:
            unknown = f"ssh: Could not resolve hostname {alias}: Name or service not known\r\nscp: Connection closed\n"
            raise instances.ScpError(unknown, 255)
        if upload:
            instances.scp_upload(ctx.world, instance, local, remote)
        else:
            instances.scp_download(ctx.world, instance, remote, local)
    except instances.ScpError as failed:
        raise GoError(f"scp failed: exit status {failed.code}\nOutput: {failed}") from None
    source, dest = (local, f"{alias}:{remote}") if upload else (f"{alias}:{remote}", local)
    took = go_duration(time.monotonic() - started)
    io.out("\n" + io.green(f"✓ Successfully copied {source} → {dest} ({took})\n") + "\n")


def _instance_path(arg: str) -> tuple[str, str]:
    if ":" not in arg:
        return "", arg
    parts = arg.split(":")
    if len(parts) != 2:
        raise validation("invalid instance path format, use instance_name:/path")
    return parts[0], parts[1]


def go_duration(seconds: float) -> str:
    """``time.Duration.Round(time.Millisecond).String()``."""
    ms = round(seconds * 1000)
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest = divmod(ms, 60_000)
    text = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if minutes:
        hours, minutes = divmod(minutes, 60)
        text = (f"{hours}h" if hours else "") + f"{minutes}m" + text
    return text


# ---------------------------------------------------------------------------------------------------- delete / stop
def for_each_instance(ctx: Context, args: list[str], act: Callable[[str], None]) -> None:
    """``util.GetInstanceNames`` (the arguments, then a piped stdin's lines), ``act`` on each, the failures
    aggregated in one multierror; piped, the names are printed only when every one succeeded."""
    names = args + ctx.io.stdin_names()
    if not names:
        raise validation("instance name required: provide as argument or pipe from another command")
    errors = []
    for name in names:
        ctx.targets.append(name)
        try:
            act(name)
        except GoError as failed:
            errors.append(failed)
    if errors:
        raise multierror(errors)
    if ctx.io.stdout_piped:
        ctx.io.out("".join(f"{n}\n" for n in names))


def delete(ctx: Context, v: dict[str, Any], args: list[str]) -> None:
    io, session = ctx.io, ctx.session
    where = ("pkg/cmd/delete.deleteWorkspace", "pkg/cmd/delete/delete.go")

    def delete_one(name: str) -> None:
        try:
            workspace = session.user_workspace(name)
        except GoError as lookup:
            raise _admin_only(ctx, lookup).traced(*where, 78) from None
        try:
            deleted = session.call(lambda t: session.server.delete_workspace(t, workspace["id"]))
        except GoError as failed:
            raise failed.traced(*where, 91) from None
        if not io.stdout_piped:
            io.out(f"Deleting instance {deleted['name']}. This can take a few minutes. Run 'brev ls' to check status\n")

    for_each_instance(ctx, args, delete_one)


def _admin_only(ctx: Context, lookup: GoError) -> GoError:
    """``handleAdminUser`` for a user who is not an admin: the lookup error, traced where the CLI wraps it."""
    where = ("pkg/cmd/delete.handleAdminUser", "pkg/cmd/delete/delete.go")
    if "not found" not in lookup.full:
        return lookup.traced(*where, 120)
    if ctx.session.is_api_key():
        return lookup.traced(*where, 104)
    try:
        ctx.session.me()
    except GoError as failed:
        return failed.traced(*where, 108)
    return lookup.traced(*where, 111)


def stop(ctx: Context, v: dict[str, Any], args: list[str]) -> None:
    io, session = ctx.io, ctx.session
    if v["all"]:
        _stop_all(ctx)
        return
    where = ("pkg/cmd/stop.stopWorkspace", "pkg/cmd/stop/stop.go")

    def stop_one(name: str) -> None:
        if not session.is_api_key():
            try:
                session.me()
            except GoError as failed:
                raise failed.traced(*where, 143) from None
        try:
            workspace = session.user_workspace(name)
        except GoError as lookup:
            raise lookup.traced(*where, 173 if "not found" in lookup.full else 162) from None
        if not workspace["instanceTypeInfo"]["stoppable"]:
            raise validation(f'instance "{workspace["name"]}" does not support stop.')
        try:
            session.call(lambda t: session.server.stop_workspace(t, workspace["id"]))
        except GoError as failed:
            raise failed.traced(*where, 185) from None
        if not io.stdout_piped:
            io.out(
                io.green(f"Stopping instance {name}.\n")
                + "Note: this can take a few seconds. Run 'brev ls' to check status\n"
            )

    for_each_instance(ctx, args, stop_one)


def _stop_by_id(session: Session, workspace_id: str) -> None:
    session.call(lambda t: session.server.stop_workspace(t, workspace_id))


def _stop_all(ctx: Context) -> None:
    io, session = ctx.io, ctx.session
    org = session.active_org()
    user_id = None if session.is_api_key() else session.me()["id"]
    workspaces = session.user_workspaces(org["id"], user_id) if org else []
    if not io.stdout_piped:
        io.out("Turning off all of your instances")
    stopped = []
    for workspace in workspaces:
        if workspace["status"] != "RUNNING":
            continue
        if not workspace["instanceTypeInfo"]["stoppable"]:
            if not io.stdout_piped:
                io.out(io.yellow(f"\n{workspace['name']} skipped (does not support stop)"))
            continue
        _stop_by_id(session, workspace["id"])
        stopped.append(workspace["name"])
        ctx.targets.append(workspace["name"])
        if not io.stdout_piped:
            io.out(io.green(f"\n{workspace['name']} stopped ✓"))
    if io.stdout_piped:
        io.out("".join(f"{n}\n" for n in stopped))


# ---------------------------------------------------------------------------------------------------- start
def start(ctx: Context, v: dict[str, Any], args: list[str]) -> None:
    io = ctx.io
    names = args + io.stdin_names()
    known = set(ctx.world.read()["types"]) | {"n1-highmem-4:nvidia-tesla-t4:1"}
    if v["gpu"] and v["gpu"] not in known:
        raise GoError(
            f"invalid GPU instance type: {v['gpu']}, more information can be found on "
            "https://docs.nvidia.com/brev/latest/quick-start.html#select-your-compute"
        )
    if io.stdin_piped and names:
        started, errors = [], []
        for name in names:
            ctx.targets.append(name)
            try:
                _start_one(ctx, name, v, detached=True)
            except GoError as failed:
                io.err(f"Error starting {name}: {failed.full}\n")
                errors.append(failed)
                continue
            started.append(name)
        if errors:
            raise multierror(errors)
        if io.stdout_piped:
            io.out("".join(f"{n}\n" for n in started))
        return
    name = names[0] if names else ""
    if name:
        ctx.targets.append(name)
    _start_one(ctx, name, v, detached=v["detached"])
    if io.stdout_piped and name:
        io.out(f"{name}\n")


def _start_one(ctx: Context, name: str, v: dict[str, Any], detached: bool) -> None:
    """``runStartWorkspace`` for an existing instance; creating one from a repo or a path is not faked."""
    io, session = ctx.io, ctx.session
    if not session.is_api_key():
        session.me()
    if not name:
        if not v["name"]:
            raise validation("name field is required for empty workspaces")
        raise GoError("brevfake: creating an instance with 'brev start' is not supported; use 'brev create'")
    if re.match(r"^(https?://|git@)", name):
        raise GoError("brevfake: creating an instance from a git URL is not supported; use 'brev create'")
    found = session.find_workspaces(name)
    if len(found) > 1:
        found = [w for w in found if w["status"] != "FAILURE"]
        if len(found) > 1:
            raise validation(f"multiple instances found with id/name {name}")
        if not found:
            raise validation(f"workspace with id/name {name} is a failed workspace")
    if found:
        workspace = found[0]
        if workspace["status"] != "STOPPED":
            raise validation(f"Instance is not stopped status={workspace['status']}")
        if v["name"]:
            io.out("Existing instance found. Name flag ignored.\n")
        started = session.call(lambda t: session.server.start_workspace(t, workspace["id"]))
        io.out(
            io.yellow(
                f"Instance {started['name']} is starting. \n"
                "Note: this can take about a minute. Run 'brev ls' to check status\n\n"
            )
        )
        if detached:
            return
        io.out("You can safely ctrl+c to exit\n")
        _poll_until(ctx, workspace["id"], "RUNNING", None)
        io.out("\n" + io.green("Your instance is ready!\n") + "\n")
        io.out(io.green("Connect to the instance:\n"))
        io.out(io.yellow(f"\tbrev open {started['name']}\t# brev open <NAME> -> open instance in VS Code\n"))
        io.out(io.yellow(f"\tbrev shell {started['name']}\t# brev shell <NAME> -> ssh into instance (shortcut)\n"))
        return
    if os.path.exists(name):
        raise GoError("brevfake: creating an instance from a local path is not supported; use 'brev create'")
    io.out(io.yellow("tried to start with local path but path not found") + "\n")


# ---------------------------------------------------------------------------------------------------- the table
SEARCH_FLAGS = (
    Flag("gpu-name", "g"), Flag("min-vram", "v", "float", 0.0), Flag("min-total-vram", "t", "float", 0.0),
    Flag("min-capability", "c", "float", 0.0), Flag("wide", "w", "bool", False), Flag("provider", "p"),
    Flag("arch"), Flag("min-vcpu", "", "int", 0), Flag("min-ram", "", "float", 0.0),
    Flag("min-disk", "", "float", 0.0), Flag("max-boot-time", "", "int", 0), Flag("stoppable", "", "bool", False),
    Flag("rebootable", "", "bool", False), Flag("flex-ports", "", "bool", False), Flag("sort", "s", "str", "price"),
    Flag("desc", "d", "bool", False), Flag("json", "", "bool", False),
)  # fmt: skip
CREATE_FLAGS = (
    Flag("name", "n", "str", ""), Flag("type", "t", "str", ""), Flag("count", "c", "int", 1),
    Flag("parallel", "p", "int", 1), Flag("detached", "d", "bool", False), Flag("timeout", "", "int", 300),
    Flag("startup-script", "s", "str", ""), Flag("dry-run", "", "bool", False), Flag("mode", "m", "str", "vm"),
    Flag("jupyter", "", "bool", True), Flag("container-image", "", "str", ""), Flag("compose-file", "", "str", ""),
    Flag("launchable", "l", "str", ""), Flag("gpu-name", "g", "str", ""), Flag("provider", "", "str", ""),
    Flag("min-vram", "v", "float", 0.0), Flag("min-total-vram", "", "float", 0.0),
    Flag("min-capability", "", "float", 0.0), Flag("min-disk", "", "float", 0.0),
    Flag("max-boot-time", "", "int", 0), Flag("stoppable", "", "bool", False), Flag("rebootable", "", "bool", False),
    Flag("flex-ports", "", "bool", False), Flag("sort", "", "str", "price"), Flag("desc", "", "bool", False),
)  # fmt: skip

LOGIN_FLAGS = (
    Flag("token", "", "str", ""), Flag("api-key", "", "str", ""), Flag("org-id", "", "str", ""),
    Flag("skip-browser", "", "bool", False), Flag("email", "", "str", ""), Flag("auth", "", "str", ""),
)  # fmt: skip
START_FLAGS = (
    Flag("detached", "d", "bool", False), Flag("empty", "e", "bool", False), Flag("name", "n", "str", ""),
    Flag("setup-script", "s", "str", ""), Flag("setup-repo", "r", "str", ""), Flag("setup-path", "p", "str", ""),
    Flag("org", "o", "str", ""), Flag("gpu", "g", "str", "n1-highmem-4:nvidia-tesla-t4:1"),
)  # fmt: skip
LS_FLAGS = (Flag("org", "o", "str", ""), Flag("all", "", "bool", False), Flag("json", "", "bool", False))

# name -> (handler, its flags, its aliases)
COMMANDS: dict[str, tuple[Command, tuple[Flag, ...], tuple[str, ...]]] = {
    "login": (login, LOGIN_FLAGS, ()),
    "logout": (logout, (), ()),
    "set": (set_org, (), ()),
    "refresh": (refresh, (), ()),
    "ls": (ls, LS_FLAGS, ("list",)),
    "search": (search, SEARCH_FLAGS, ()),
    "create": (create, CREATE_FLAGS, ("provision",)),
    "exec": (exec_command, (Flag("host", "", "bool", False),), ()),
    "copy": (copy, (Flag("host", "", "bool", False),), ("cp", "scp")),
    "delete": (delete, (), ()),
    "stop": (stop, (Flag("all", "a", "bool", False),), ()),
    "start": (start, START_FLAGS, ()),
}
