"""Fake Brev instances as real containers on the test Docker engine, and the "ssh" / "scp" that reach them.

An instance is a container ``brevfake-<world tag>-<instance id>`` of the Debian + python image, labelled
``brevfake=1``, ``brevfake.world=<tag>``, ``brevfake.instance=<name>``, ``brevfake.instance-id=<id>``. Its
``/home/ubuntu`` and ``/tmp`` are host folders under the world's state directory, so a job container started with
``docker run -v $HOME/x:/x`` from inside the instance (a sibling on the same engine, through the instance's docker
socket proxy, see ``instance/init.py``) sees the same files. Stopping an instance kills its containers and the
job containers started on it; deleting it removes them, as a VM takes its containers with it.

``ssh_run`` is what ``ssh <alias> <command>`` does against the instance: it resolves the alias as OpenSSH does
(the real ``ssh -G`` of the ``ssh`` on PATH: the passwd home's ``~/.ssh/config`` and the files it includes, or the
``-F`` a wrapper gives), fails the way ssh fails (exit 255 and ssh's own messages) when the alias is unknown or the
instance is not up, and otherwise runs ``bash -c <command>`` as ``ubuntu`` in the container with output streamed.
``scp_resolve`` is the same for ``scp``, whose ssh is ``/usr/bin/ssh`` with scp's own ``-F`` / ``-o``.
``scp_upload`` / ``scp_download`` copy with ``scp -r`` semantics through the engine's archive API.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .engine import Engine, EngineError, is_directory_mode, socket_path_of
from .world import World, has_ssh_faults, take_ssh_fault

HOME = "/home/ubuntu"
UID = 1000
INIT_DIR = Path(__file__).resolve().parent / "instance"
BACKED_PATHS = {"/home/ubuntu": "home", "/tmp": "tmp"}
LABEL = "brevfake"
LABEL_WORLD = "brevfake.world"
LABEL_STATE = "brevfake.state"
LABEL_INSTANCE = "brevfake.instance"
LABEL_INSTANCE_ID = "brevfake.instance-id"
LABEL_ON_INSTANCE = "brevfake.on-instance"
STARTUP_DONE = "/var/lib/brevfake/startup-done"
SSH_ENV = [
    f"HOME={HOME}",
    "USER=ubuntu",
    "LOGNAME=ubuntu",
    "SHELL=/bin/bash",
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/games:/usr/local/games:/snap/bin",
    "LANG=C.UTF-8",
]


def container_name(state: dict[str, Any], instance_id: str) -> str:
    return f"brevfake-{state['tag']}-{instance_id}"


def engine_of(state: dict[str, Any], timeout: float | None = 120) -> Engine:
    return Engine(state["engine"], timeout)


def docker_client_binary() -> str:
    for candidate in (shutil.which("docker"), "/usr/bin/docker"):
        if candidate and os.path.exists(candidate):
            return os.path.realpath(candidate)
    raise RuntimeError("brevfake: no docker client binary on this machine (the docker.io package provides it)")


# ---------------------------------------------------------------------------------------------------- lifecycle
def provision(world: World, state: dict[str, Any], instance: dict[str, Any]) -> None:
    """Create and start the instance's container (its host folders first)."""
    root = world.instance_dir(instance["id"])
    binds = []
    path_map = {}
    for inside, folder in BACKED_PATHS.items():
        host = root / folder
        host.mkdir(parents=True, exist_ok=True)
        if folder == "home":
            os.chown(host, UID, UID)
            host.chmod(0o755)
        else:
            host.chmod(0o1777)
        binds.append(f"{host}:{inside}")
        path_map[inside] = str(host)
    if (root / "boot").is_dir():
        binds.append(f"{root / 'boot'}:/var/lib/brevfake-boot:ro")
    binds += [
        f"{socket_path_of(state['engine'])}:/run/brevfake/engine.sock",
        f"{docker_client_binary()}:/usr/bin/docker:ro",
        f"{INIT_DIR}:/opt/brevfake:ro",
    ]
    instance_type = state["types"].get(instance["instance_type"], {})
    gpus = f"{instance_type.get('gpu', '')}:{instance_type.get('gpu_count', 0)}:{instance_type.get('vram_gb', 0)}"
    config = {
        "Image": state["image"],
        "Cmd": ["python3", "/opt/brevfake/init.py"],
        "Env": [
            f"BREVFAKE_INSTANCE_ID={instance['id']}",
            f"BREVFAKE_WORLD={state['tag']}",
            f"BREVFAKE_STATE_DIR={world.dir}",
            f"BREVFAKE_PATH_MAP={json.dumps(path_map)}",
            f"BREVFAKE_GPUS={gpus if instance_type.get('gpu_count') else ''}",
            f"BREVFAKE_NGC_KEY_SHA256={state['auth'].get('ngc_key_sha256', '')}",
            f"BREVFAKE_STARTUP_USER={state.get('startup_user', 'ubuntu')}",
        ],
        "Labels": {
            LABEL: "1",
            LABEL_WORLD: state["tag"],
            LABEL_STATE: str(world.dir),
            LABEL_INSTANCE: instance["name"],
            LABEL_INSTANCE_ID: instance["id"],
        },
        "HostConfig": {"NetworkMode": "host", "Init": True, "Binds": binds},
    }
    engine = engine_of(state)
    name = container_name(state, instance["id"])
    engine.create(name, config)
    engine.start(name)


def halt(state: dict[str, Any], instance_id: str) -> None:
    """A VM stop: its job containers and the instance container are killed (their disks stay)."""
    engine = engine_of(state)
    for sibling in engine.containers(f"{LABEL_ON_INSTANCE}={instance_id}", all_states=False):
        engine.kill(sibling["Id"])
    engine.kill(container_name(state, instance_id))


def resume(state: dict[str, Any], instance_id: str) -> None:
    engine_of(state).start(container_name(state, instance_id))


def destroy(world: World, state: dict[str, Any], instance_id: str) -> None:
    """A VM deletion: the instance container, every container started on it, and its disk."""
    engine = engine_of(state)
    for sibling in engine.containers(f"{LABEL_ON_INSTANCE}={instance_id}"):
        engine.remove(sibling["Id"])
    engine.remove(container_name(state, instance_id))
    shutil.rmtree(world.instance_dir(instance_id), ignore_errors=True)


# ---------------------------------------------------------------------------------------------------- ssh
def openssh_resolve(args: list[str], env: dict[str, str] | None = None) -> dict[str, str]:
    """What OpenSSH makes of an ssh command line (``ssh -G <args>``: the options it would use, lower case, without
    connecting). The ``ssh`` is the one on this process's ``PATH``, as brev's ``bash -c "... ssh ..."`` and Go's
    ``exec.Command("ssh", ...)`` find it; OpenSSH reads the user config of the passwd home (``getpwuid()->pw_dir``),
    not ``$HOME``, unless the command line gives one with ``-F``. Empty when ssh refuses the command line."""
    environment = dict(os.environ if env is None else env)
    ssh = shutil.which("ssh", path=environment.get("PATH", ""))
    if ssh is None:
        return {}
    done = subprocess.run(
        [ssh, "-G", *args], env=environment, stdin=subprocess.DEVNULL, capture_output=True, check=False, timeout=30
    )
    return _options(done.stdout) if done.returncode == 0 else {}


#: scp's "ssh program" in the fake (``scp -S``): prints what ``/usr/bin/ssh -G`` makes of the arguments scp gives
#: its ssh (Debian's scp runs ``/usr/bin/ssh``, its compiled-in ``_PATH_SSH_PROGRAM``, never the one on PATH).
SCP_SSH_SHIM = Path(__file__).resolve().parent / "scp-ssh-shim"


def scp_resolve(alias: str, upload: bool, env: dict[str, str] | None = None) -> dict[str, str]:
    """What OpenSSH makes of ``alias`` when brev runs ``scp [-r] <local> <alias>:<remote>`` (``exec.Command("scp",
    ...)``: the scp on PATH, with whatever it adds): scp is run with the shim as its ssh program, which answers
    with ``ssh -G`` of the arguments scp passes (its ``-F`` and ``-o`` options included) and connects nowhere."""
    environment = dict(os.environ if env is None else env)
    scp = shutil.which("scp", path=environment.get("PATH", ""))
    if scp is None:
        return {}
    with tempfile.TemporaryDirectory(prefix="brevfake-scp-") as folder:
        local, answer = os.path.join(folder, "f"), os.path.join(folder, "resolved")
        Path(local).write_text("")
        paths = [local, f"{alias}:x"] if upload else [f"{alias}:x", local]
        environment["BREVFAKE_SSH_G"] = answer
        subprocess.run(
            [scp, "-S", str(SCP_SSH_SHIM), *paths],
            env=environment,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
            check=False,
        )
        return _options(Path(answer).read_bytes()) if os.path.exists(answer) else {}


def _options(output: bytes) -> dict[str, str]:
    options: dict[str, str] = {}
    for line in output.decode(errors="replace").splitlines():
        key, _, value = line.partition(" ")
        options.setdefault(key.lower(), value)
    return options


def instance_at(world: World, options: dict[str, str]) -> dict[str, Any] | None:
    """The instance an ssh resolution lands on (by its ``hostname``), or None: ssh then tries the bare alias as a
    host name, which no resolver knows."""
    ip = options.get("hostname", "")
    return next((i for i in world.read()["instances"].values() if i["ip"] == ip), None) if ip else None


def ssh_connect(world: World, alias: str, connect_timeout: float) -> tuple[dict[str, Any] | None, str, bool]:
    """Where ``ssh <alias>`` lands: ``(instance, "", dropped)`` when it connects (``dropped``: the connection
    will drop before the command's output arrives), else ``(None, ssh's stderr, False)``. Connection failures
    take as long as ssh would take (scaled)."""
    options = openssh_resolve(["-T", "-o", f"ConnectTimeout={connect_timeout:g}", "-o", "LogLevel=ERROR", alias])
    if instance_at(world, options) is None:
        return None, f"ssh: Could not resolve hostname {alias}: Name or service not known\r\n", False
    ip = options["hostname"]
    state = world.read()
    scale = world.time_scale(state)
    instance = next((i for i in state["instances"].values() if i["ip"] == ip), None)
    refused = f"ssh: connect to host {ip} port 22: Connection refused\r\n"
    fault = ""
    if instance is not None and has_ssh_faults(state, instance):
        with world.mutate() as live:
            instance = live["instances"].get(instance["id"])
            fault = take_ssh_fault(live, instance) if instance else ""
        if fault == "refused":
            return None, refused, False
        if fault == "unresolvable":
            return None, f"ssh: Could not resolve hostname {alias}: Name or service not known\r\n", False
        if fault == "silent":  # exit 255 and not a line of output (brev copy's probe panics on it)
            return None, "", False
        if fault == "flaky":
            reset = (
                f"kex_exchange_identification: read: Connection reset by peer\r\nConnection reset by {ip} port 22\r\n"
            )
            return None, reset, False
    status = instance["status"] if instance else "GONE"
    if status in ("DEPLOYING", "STARTING"):
        return None, refused, False
    if status != "RUNNING":
        time.sleep(connect_timeout * scale)
        return None, f"ssh: connect to host {ip} port 22: Connection timed out\r\n", False
    if instance and instance.get("startup_script") and not instance.get("startup_done"):
        if engine_of(state).stat_path(container_name(state, instance["id"]), STARTUP_DONE) is None:
            return None, refused, False  # sshd comes up once the startup script has run
        with world.mutate() as live:
            if instance["id"] in live["instances"]:
                live["instances"][instance["id"]]["startup_done"] = True
    return instance, "", fault == "dropped"


def ssh_run(
    world: World,
    alias: str,
    command: str,
    *,
    connect_timeout: float,
    on_output: Callable[[int, bytes], None],
) -> int:
    """``ssh -T -o ConnectTimeout=<t> <alias> '<command>'``: the remote exit code, 255 when ssh fails."""
    instance, failure, dropped = ssh_connect(world, alias, connect_timeout)
    if instance is None:
        on_output(2, failure.encode())
        return 255
    state = world.read()
    try:
        code = engine_of(state, timeout=None).exec_stream(
            container_name(state, instance["id"]),
            ["bash", "-c", command],
            (lambda _s, _c: None) if dropped else on_output,
            user="ubuntu",
            workdir=HOME,
            env=[*SSH_ENV, f"SSH_CONNECTION=10.0.0.1 50022 {instance['ip']} 22", "SSH_CLIENT=10.0.0.1 50022 22"],
        )
    except EngineError:  # the container is not running: what ssh sees of a VM that went away
        on_output(2, f"ssh: connect to host {instance['ip']} port 22: Connection refused\r\n".encode())
        return 255
    if dropped:
        on_output(2, f"Connection to {instance['ip']} closed by remote host.\r\n".encode())
        return 255
    return code


# ---------------------------------------------------------------------------------------------------- scp
def remote_path(path: str) -> str:
    """scp's remote path: relative paths and ``~`` are in the login user's home."""
    if path in ("", "~"):
        return HOME
    if path.startswith("~/"):
        return f"{HOME}/{path[2:]}"
    return path if path.startswith("/") else f"{HOME}/{path}"


class ScpError(Exception):
    """scp's own complaint (its output) and its exit status (1; 255 when its ssh failed)."""

    def __init__(self, output: str, code: int = 1) -> None:
        super().__init__(output)
        self.code = code


def scp_upload(world: World, instance: dict[str, Any], local: str, remote: str) -> None:
    """``scp [-r] <local> <alias>:<remote>``: into ``remote`` when it is a directory, else as ``remote``."""
    state = world.read()
    engine = engine_of(state)
    name = container_name(state, instance["id"])
    target = remote_path(remote)
    found = engine.stat_path(name, target)
    if found is not None and is_directory_mode(int(found["mode"])):
        directory, entry = target, os.path.basename(os.path.normpath(local))
    else:
        directory, entry = os.path.dirname(target.rstrip("/")) or "/", os.path.basename(target.rstrip("/"))
        parent = engine.stat_path(name, directory)
        if parent is None or not is_directory_mode(int(parent["mode"])):
            raise ScpError(f'scp: dest open "{remote}": No such file or directory\r\n')
        if found is not None and os.path.isdir(local):
            raise ScpError(f'scp: "{remote}" exists but is not a directory\r\n')
    if not _may(engine, name, "-w", directory):
        raise ScpError(f'scp: dest open "{remote}": Permission denied\r\n')
    engine.put_archive(name, directory, _tar_of(local, entry))


def scp_download(world: World, instance: dict[str, Any], remote: str, local: str) -> None:
    """``scp -r <alias>:<remote> <local>``: into ``local`` when it is a directory, else as ``local``."""
    state = world.read()
    engine = engine_of(state)
    name = container_name(state, instance["id"])
    source = remote_path(remote)
    if engine.stat_path(name, source) is not None and not _may(engine, name, "-r", source):
        raise ScpError(f'scp: open remote "{remote}": Permission denied\r\n')
    try:
        data = engine.get_archive(name, source)
    except EngineError as missing:
        raise ScpError(f"scp: {remote}: No such file or directory\r\n") from missing
    if os.path.isdir(local):
        directory, rename = local, None
    else:
        directory, rename = os.path.dirname(os.path.abspath(local)), os.path.basename(local)
        if not os.path.isdir(directory):
            raise ScpError(f'scp: open local "{local}": No such file or directory\r\n')
    _extract(data, directory, rename)


def _may(engine: Engine, name: str, test: str, path: str) -> bool:
    """Whether the login user passes ``test -w`` / ``test -r`` on a path (the engine's archive calls run as root;
    scp runs as the user)."""
    return engine.exec_stream(name, ["test", test, path], lambda _s, _c: None, user="ubuntu") == 0


def _tar_of(local: str, entry: str) -> bytes:
    """A tar of a local file or tree as scp writes it: owned by the login user, modes masked by the umask,
    modification time now (scp without -p)."""
    umask = os.umask(0)
    os.umask(umask)
    now = time.time()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:

        def add(path: str, arcname: str) -> None:
            info = tar.gettarinfo(path, arcname)
            info.uid = info.gid = UID
            info.uname = info.gname = "ubuntu"
            info.mode &= ~umask & 0o7777
            info.mtime = int(now)
            if info.isfile():
                with open(path, "rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)
            if os.path.isdir(path) and not os.path.islink(path):
                for child in sorted(os.listdir(path)):
                    add(os.path.join(path, child), f"{arcname}/{child}")

        add(local, entry)
    return buffer.getvalue()


_UNSAFE = re.compile(r"(^/|(^|/)\.\.(/|$))")


def _extract(data: bytes, directory: str, rename: str | None) -> None:
    """Unpack a container archive locally as scp would write it (local owner, umask applied)."""
    umask = os.umask(0)
    os.umask(umask)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            if _UNSAFE.search(member.name):
                continue
            name = member.name
            if rename is not None:
                tail = name.partition("/")[2]
                name = f"{rename}/{tail}" if tail else rename
            path = os.path.join(directory, name)
            if member.isdir():
                os.makedirs(path, exist_ok=True)
                os.chmod(path, (member.mode & ~umask) | stat.S_IRWXU)
            elif member.isfile():
                os.makedirs(os.path.dirname(path), exist_ok=True)
                extracted = tar.extractfile(member)
                assert extracted is not None  # a regular file member always has content
                with open(path, "wb") as out:
                    shutil.copyfileobj(extracted, out)
                os.chmod(path, member.mode & ~umask & 0o7777)
            elif member.issym():
                if os.path.lexists(path):
                    os.unlink(path)
                os.symlink(member.linkname, path)
