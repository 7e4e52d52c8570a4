"""``python -m tests.leptonfake --ready-file F [--port 0] [--docker-host URL | --sim] [--token T] [--workspace ws-ci]
[--id-mode name|suffix|auto] [--config JSON-or-@file] [--tick S]``.

Writes ``{"url", "workspace_url", "token", "workspace_id", "pid", "workdir"}`` to the ready file once it answers,
and runs until SIGTERM / SIGINT, then removes the containers it made (and its work folder).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import threading
import uuid
from pathlib import Path
from typing import NoReturn

from tests.fakeserver import announce_ready, exit_process, hold_stop_signals, wait_for_stop_signal
from tests.leptonfake.api import FakeLeptonServer
from tests.leptonfake.controller import Controller
from tests.leptonfake.runtime import DockerRuntime, Runtime, SimRuntime, workdir_for
from tests.leptonfake.store import Store
from tests.leptonfake.world import DEFAULT_SETTINGS, DEFAULT_WORLD, World, deep_merge


def main(argv: list[str] | None = None) -> NoReturn:
    parser = argparse.ArgumentParser(prog="leptonfake")
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--docker-host", default=os.environ.get("DOCKER_CI_HOST", "unix:///var/run/docker.sock"))
    parser.add_argument("--sim", action="store_true", help="replicas are simulated (benchmarks): no containers")
    parser.add_argument("--token", default="leptonfake-token")
    parser.add_argument("--workspace", default="ws-ci")
    parser.add_argument("--id-mode", choices=("name", "suffix", "auto"), default="name")
    parser.add_argument("--config", default="", help='{"world": {...}, "settings": {...}} (JSON, or @path)')
    parser.add_argument("--tick", type=float, default=0.1, help="seconds between two controller passes")
    args = parser.parse_args(argv)

    config = {}
    if args.config:
        text = Path(args.config[1:]).read_text() if args.config.startswith("@") else args.config
        config = json.loads(text)
    world = World(
        args.workspace,
        deep_merge(DEFAULT_WORLD, config.get("world") or {}),
        deep_merge(DEFAULT_SETTINGS, config.get("settings") or {}),
    )
    workdir = Path(workdir_for())
    workdir.mkdir(parents=True, exist_ok=True)
    runtime: Runtime = (
        SimRuntime(float(world.settings["sim_seconds"]))
        if args.sim
        else DockerRuntime(args.docker_host, uuid.uuid4().hex[:12])
    )
    store = Store(world, args.id_mode)
    controller = Controller(store, runtime, workdir, args.tick)
    server = FakeLeptonServer(("127.0.0.1", args.port), store, controller, args.token)
    hold_stop_signals()
    controller.start()
    threading.Thread(target=server.serve_forever, name="leptonfake-http", daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    ready = {
        "url": url,
        "workspace_url": f"{url}/api/v2/workspaces/{args.workspace}",
        "token": args.token,
        "workspace_id": args.workspace,
        "pid": os.getpid(),
        "workdir": str(workdir),
    }
    announce_ready(args.ready_file, ready)
    wait_for_stop_signal()
    server.shutdown()
    controller.stop()
    shutil.rmtree(workdir, ignore_errors=True)
    exit_process()


if __name__ == "__main__":
    main()
