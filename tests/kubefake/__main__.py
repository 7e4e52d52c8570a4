"""``python -m tests.kubefake --port 0 --ready-file F [--runtime docker|sim] [--docker-host URL]
[--owner-references-permission-enforcement]``.

Writes ``{"port": N, "pid": P}`` to the ready file once it answers, and runs until SIGTERM / SIGINT, then removes the
containers its kubelet made. SIGUSR1 prints every thread's stack (a test that waits for it to stop says why it did not).
"""

from __future__ import annotations

import argparse
import os
import shutil
import threading
from typing import NoReturn

from tests.fakeserver import announce_ready, exit_process, hold_stop_signals, wait_for_stop_signal
from tests.kubefake.api import FakeApiServer
from tests.kubefake.authz import Authorizer
from tests.kubefake.cluster import Cluster, DockerRuntime, SimRuntime, workdir_for
from tests.kubefake.store import Store


def main(argv: list[str] | None = None) -> NoReturn:
    parser = argparse.ArgumentParser(prog="kubefake")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--runtime", choices=("docker", "sim"), default="docker")
    parser.add_argument("--docker-host", default="unix:///var/run/docker.sock")
    parser.add_argument("--sim-seconds", type=float, default=60.0)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--gpus-per-node", type=int, default=1)
    parser.add_argument("--tick", type=float, default=0.2, help="seconds between two controller passes")
    parser.add_argument("--token", default=None, help="bearer token the API wants (default: none checked)")
    parser.add_argument(
        "--owner-references-permission-enforcement",
        action="store_true",
        help="admission refuses new blocking owner references (the user may not update <owner>/finalizers)",
    )
    parser.add_argument(
        "--deny",
        action="append",
        default=[],
        metavar="VERB:RESOURCE",
        help="a verb the user may not use on a resource, e.g. delete:secrets (repeatable; tests/kubefake/authz.py)",
    )
    args = parser.parse_args(argv)

    workdir = workdir_for()
    runtime = DockerRuntime(args.docker_host) if args.runtime == "docker" else SimRuntime(args.sim_seconds)
    store = Store()
    cluster = Cluster(store, runtime, workdir, nodes=args.nodes, gpus_per_node=args.gpus_per_node)
    cluster.tick_seconds = args.tick
    server = FakeApiServer(("127.0.0.1", args.port), store, cluster)
    server.token = args.token
    server.owner_references_enforcement = args.owner_references_permission_enforcement
    server.authorizer = Authorizer(rule.replace(":", " ", 1) for rule in args.deny)
    hold_stop_signals()
    cluster.start()
    threading.Thread(target=server.serve_forever, name="kubefake-http", daemon=True).start()
    announce_ready(args.ready_file, {"port": server.server_address[1], "pid": os.getpid()})
    wait_for_stop_signal()
    server.shutdown()
    cluster.stop()
    shutil.rmtree(workdir, ignore_errors=True)
    exit_process()


if __name__ == "__main__":
    main()
