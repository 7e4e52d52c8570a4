"""PID 1 of a fake Brev instance (a container on the test Docker engine); runs INSIDE the instance, stdlib only.

It makes the container look like a Brev VM to a user who reaches it through ``brev exec`` / ``brev copy``:

- the login user ``ubuntu`` (uid 1000, home ``/home/ubuntu``, bash, member of ``docker``);
- an ``nvidia-smi`` that lists the GPUs of the instance type (none on CPU types);
- a Docker socket at ``/var/run/docker.sock``. It is a proxy to the test engine (mounted at
  ``/run/brevfake/engine.sock``, root only) that makes the engine look like the VM's own dockerd:

  * containers created through it are labelled ``brevfake.on-instance=<id>`` (so deleting or stopping the instance
    removes or kills them, as a VM takes its containers with it) and listings show only those;
  * bind-mount sources are paths of THIS instance: ``/home/ubuntu/...`` and ``/tmp/...`` are rewritten to the host
    folders backing them, so ``docker run -v $HOME/data:/data`` sees the files the user put there; any other
    absolute source is refused with a message saying so (the engine host's own folders are not the VM's);
  * GPU device requests are checked against the instance's GPU count when a container starts (a CPU instance
    answers like a dockerd without the NVIDIA runtime);
  * ``docker login`` is answered here (no registry is reachable): accepted when the password matches the key the
    world expects (its sha256 is in ``BREVFAKE_NGC_KEY_SHA256``), or always when no key is set.

Configuration comes from the environment the fake CLI gives the container: ``BREVFAKE_INSTANCE_ID``,
``BREVFAKE_PATH_MAP`` (JSON ``{instance path: host path}``), ``BREVFAKE_GPUS`` (``name:count:vram_gb``),
``BREVFAKE_NGC_KEY_SHA256``.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import urllib.parse

ENGINE_SOCK = "/run/brevfake/engine.sock"
PROXY_SOCK = "/var/run/docker.sock"
LABEL_ON_INSTANCE = "brevfake.on-instance"
HOME = "/home/ubuntu"
USER_UID = 1000
DOCKER_GID = 999

INSTANCE_ID = os.environ.get("BREVFAKE_INSTANCE_ID", "unknown")
PATH_MAP: dict[str, str] = json.loads(os.environ.get("BREVFAKE_PATH_MAP", "{}"))
GPU_SPEC = os.environ.get("BREVFAKE_GPUS", "")
NGC_KEY_SHA256 = os.environ.get("BREVFAKE_NGC_KEY_SHA256", "")
GPU_NAME, GPU_COUNT, GPU_VRAM = [*GPU_SPEC.split(":"), "", "0", "0"][:3] if GPU_SPEC else ("", "0", "0")

CONTAINER_PATH = re.compile(r"^(?:/v[0-9.]+)?/containers/([^/]+)(/.*)?$")
VERSIONED = re.compile(r"^(/v[0-9.]+)?(/.*)$")


# ---------------------------------------------------------------------------------------------------- the VM user
def prepare_user() -> None:
    """Create ``ubuntu`` (first boot only: the container's disk persists across stop/start, like a VM's)."""
    if subprocess.run(["getent", "group", "docker"], capture_output=True, check=False).returncode != 0:
        subprocess.run(["groupadd", "-g", str(DOCKER_GID), "docker"], check=True)
    if subprocess.run(["getent", "passwd", "ubuntu"], capture_output=True, check=False).returncode != 0:
        subprocess.run(
            ["useradd", "-u", str(USER_UID), "-d", HOME, "-s", "/bin/bash", "-G", "docker", "-M", "ubuntu"],
            check=True,
        )
    os.makedirs(HOME, exist_ok=True)
    if not os.path.exists(f"{HOME}/.profile"):
        for name in (".bashrc", ".profile", ".bash_logout"):
            if os.path.exists(f"/etc/skel/{name}"):
                shutil.copy(f"/etc/skel/{name}", f"{HOME}/{name}")
                os.chown(f"{HOME}/{name}", USER_UID, USER_UID)
        os.chown(HOME, USER_UID, USER_UID)
    os.chmod("/tmp", 0o1777)
    if int(GPU_COUNT or 0) > 0:
        with open("/etc/brevfake-gpus", "w") as spec:
            spec.write(GPU_SPEC)
        shutil.copy("/opt/brevfake/nvidia-smi", "/usr/bin/nvidia-smi")
        os.chmod("/usr/bin/nvidia-smi", 0o755)


# ---------------------------------------------------------------------------------------------------- the proxy
def engine_json(method: str, path: str) -> tuple[int, dict | list | None]:
    conn = http.client.HTTPConnection("localhost", timeout=60)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(ENGINE_SOCK)
    conn.sock = sock
    try:
        conn.request(method, path)
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    try:
        return response.status, json.loads(data) if data else None
    except ValueError:
        return response.status, None


def answer(client: socket.socket, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    reason = http.client.responses.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    client.sendall(head.encode() + data)


def read_head(client: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = client.recv(65536)
        if not chunk:
            return b"", b""
        data += chunk
        if len(data) > 1 << 20:
            raise ValueError("request head too large")
    head, rest = data.split(b"\r\n\r\n", 1)
    return head, rest


def read_body(client: socket.socket, headers: dict[str, str], rest: bytes) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        data, body = rest, b""
        while True:
            while b"\r\n" not in data:
                data += client.recv(65536)
            size_line, data = data.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            while len(data) < size + 2:
                data += client.recv(65536)
            body += data[:size]
            data = data[size + 2 :]
            if size == 0:
                return body
    length = int(headers.get("content-length", "0") or 0)
    body = rest
    while len(body) < length:
        chunk = client.recv(65536)
        if not chunk:
            break
        body += chunk
    return body


def host_path(source: str) -> str:
    """The engine host's path behind an instance path; ValueError for a path no host folder backs."""
    for inside in sorted(PATH_MAP, key=len, reverse=True):
        if source == inside or source.startswith(inside.rstrip("/") + "/"):
            return PATH_MAP[inside] + source[len(inside.rstrip("/")) :]
    backed = ", ".join(sorted(PATH_MAP))
    raise ValueError(
        f"brevfake: bind mount source {source!r} is not a folder of this instance the test engine can reach "
        f"(instance paths backed by host folders: {backed}); put the files under $HOME"
    )


def rewrite_create(body: dict) -> dict:
    config = body
    labels = dict(config.get("Labels") or {})
    labels[LABEL_ON_INSTANCE] = INSTANCE_ID
    labels["brevfake.world"] = os.environ.get("BREVFAKE_WORLD", "")
    labels["brevfake.state"] = os.environ.get("BREVFAKE_STATE_DIR", "")
    config["Labels"] = labels
    host_config = config.get("HostConfig") or {}
    binds = []
    for bind in host_config.get("Binds") or []:
        source, _, rest = bind.partition(":")
        binds.append(f"{host_path(source)}:{rest}" if source.startswith("/") else bind)
    if binds:
        host_config["Binds"] = binds
    for mount in host_config.get("Mounts") or []:
        if mount.get("Type") == "bind" and str(mount.get("Source", "")).startswith("/"):
            mount["Source"] = host_path(mount["Source"])
    config["HostConfig"] = host_config
    return config


def scoped_query(query: str) -> str:
    params = urllib.parse.parse_qs(query, keep_blank_values=True)
    filters = json.loads(params.get("filters", ["{}"])[0] or "{}")
    mine = f"{LABEL_ON_INSTANCE}={INSTANCE_ID}"
    label = filters.get("label")
    if isinstance(label, dict):
        label[mine] = True
    else:
        filters["label"] = [*(label or []), mine]
    params["filters"] = [json.dumps(filters)]
    return urllib.parse.urlencode(params, doseq=True)


def owned(container: str) -> dict | None:
    status, found = engine_json("GET", f"/containers/{urllib.parse.quote(container)}/json")
    if status != 200 or not isinstance(found, dict):
        return None
    labels = (found.get("Config") or {}).get("Labels") or {}
    return found if labels.get(LABEL_ON_INSTANCE) == INSTANCE_ID else None


def gpu_refusal(container: dict) -> str:
    """Why this container's GPU requests cannot be met on this instance ('' when they can)."""
    gpus = int(GPU_COUNT or 0)
    for request in (container.get("HostConfig") or {}).get("DeviceRequests") or []:
        capabilities = [c for group in request.get("Capabilities") or [] for c in group]
        if "gpu" not in capabilities and request.get("Driver") != "nvidia":
            continue
        if gpus == 0:
            return 'could not select device driver "" with capabilities: [[gpu]]'
        wanted = [int(d) for d in request.get("DeviceIDs") or [] if str(d).isdigit()]
        count = int(request.get("Count") or 0)
        missing = [d for d in wanted if d >= gpus] or ([count] if count > gpus else [])
        if missing:
            return (
                "failed to create shim task: OCI runtime create failed: runc create failed: unable to start "
                "container process: error during container init: error running hook #0: error running hook: "
                f"exit status 1, stdout: , stderr: nvidia-container-cli: device error: {missing[0]}: unknown device"
            )
    return ""


def docker_login(body: bytes) -> tuple[int, dict]:
    try:
        password = str(json.loads(body or b"{}").get("password", ""))
    except ValueError:
        password = ""
    if NGC_KEY_SHA256 and hashlib.sha256(password.encode()).hexdigest() != NGC_KEY_SHA256:
        return 401, {"message": 'Get "https://nvcr.io/v2/": unauthorized: authentication required'}
    return 200, {"Status": "Login Succeeded", "IdentityToken": ""}


def handle(client: socket.socket) -> None:
    engine = None
    try:
        head, rest = read_head(client)
        if not head:
            return
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        path, _, query = target.partition("?")
        api_path = VERSIONED.match(path).group(2) if VERSIONED.match(path) else path  # type: ignore[union-attr]
        body: bytes | None = None
        if method == "POST" and api_path == "/auth":
            status, result = docker_login(read_body(client, headers, rest))
            answer(client, status, result)
            return
        if method == "POST" and api_path == "/containers/create":
            try:
                body = json.dumps(rewrite_create(json.loads(read_body(client, headers, rest) or b"{}"))).encode()
            except ValueError as refused:
                answer(client, 400, {"message": str(refused)})
                return
            rest = b""
        elif api_path in ("/containers/json", "/containers/prune"):
            target = f"{path}?{scoped_query(query)}"
        else:
            match = CONTAINER_PATH.match(path)
            if match and match.group(1) not in ("create", "json", "prune"):
                container = owned(urllib.parse.unquote(match.group(1)))
                if container is None:
                    answer(client, 404, {"message": f"No such container: {urllib.parse.unquote(match.group(1))}"})
                    return
                refusal = gpu_refusal(container) if method == "POST" and match.group(2) == "/start" else ""
                if refusal:
                    if (container.get("HostConfig") or {}).get("AutoRemove"):  # dockerd cleans up a failed --rm
                        engine_json("DELETE", f"/containers/{container['Id']}?force=1")
                    answer(client, 500, {"message": refusal})
                    return
        upgrade = "upgrade" in headers.get("connection", "").lower()
        out_lines = [f"{method} {target} {version}"]
        for line in lines[1:]:
            name = line.partition(":")[0].strip().lower()
            if name in ("content-length", "transfer-encoding") and body is not None:
                continue
            if name == "connection" and not upgrade:
                continue
            out_lines.append(line)
        if body is not None:
            out_lines.append(f"Content-Length: {len(body)}")
        if not upgrade:
            out_lines.append("Connection: close")  # one request per connection: every request gets rewritten
        engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        engine.connect(ENGINE_SOCK)
        engine.sendall(("\r\n".join(out_lines) + "\r\n\r\n").encode("latin-1") + (body or b"") + rest)
        splice(client, engine)
    except Exception as exc:  # the proxy must never die with a connection
        print(f"brevfake proxy: {exc!r}", file=sys.stderr, flush=True)
    finally:
        for sock in (client, engine):
            if sock is not None:
                sock.close()


def splice(client: socket.socket, engine: socket.socket) -> None:
    def pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    back = threading.Thread(target=pump, args=(engine, client), daemon=True)
    back.start()
    pump(client, engine)
    back.join()


def run_startup_script() -> None:
    """The instance's startup script (``brev create --startup-script``), once, at first boot; output in
    /var/log/brevfake-startup.log. ``/var/lib/brevfake/startup-done`` (with its exit code) tells the fake's ssh
    that the instance may answer. Which user Brev runs it as is not knowable from the CLI's source (the platform
    runs ``lifeCycleScriptAttr``): ``BREVFAKE_STARTUP_USER`` picks the login user in its home (``ubuntu``) or
    ``root`` in ``/root``, and the tests run against each."""
    script, done = "/var/lib/brevfake-boot/startup.sh", "/var/lib/brevfake/startup-done"
    if not os.path.exists(script) or os.path.exists(done):
        return
    as_root = os.environ.get("BREVFAKE_STARTUP_USER") == "root"
    home, user, uid = ("/root", "root", 0) if as_root else (HOME, "ubuntu", USER_UID)
    env = {
        "HOME": home,
        "USER": user,
        "LOGNAME": user,
        "SHELL": "/bin/bash",
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    }
    with open("/var/log/brevfake-startup.log", "ab") as log:
        code = subprocess.run(
            ["bash", script],
            cwd=home,
            env=env,
            user=uid,
            group=uid,
            extra_groups=[DOCKER_GID],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
        ).returncode
    os.makedirs(os.path.dirname(done), exist_ok=True)
    with open(done, "w") as marker:
        marker.write(str(code))


def serve() -> None:
    if os.path.exists(PROXY_SOCK):
        os.unlink(PROXY_SOCK)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(PROXY_SOCK)
    os.chown(PROXY_SOCK, 0, DOCKER_GID)
    os.chmod(PROXY_SOCK, 0o660)
    server.listen(64)
    with open("/run/brevfake/ready", "w") as ready:
        ready.write(str(os.getpid()))

    def accept() -> None:
        while True:
            client, _ = server.accept()
            threading.Thread(target=handle, args=(client,), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    run_startup_script()
    acceptor.join()


if __name__ == "__main__":
    prepare_user()
    serve()
