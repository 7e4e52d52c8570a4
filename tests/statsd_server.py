"""A StatsD server for tests: a UDP socket on loopback that records every metric line it receives.

Airflow sends its metrics -- and a task's, through the task SDK's ``Stats`` -- to it when configured the way a
deployment is (:attr:`StatsdServer.env`: ``[metrics] statsd_on``, host, port). :meth:`StatsdServer.configure` does
for this process what Airflow's task runner does for a task (``stats.initialize(factory=get_stats_factory())``), for
tests that run the operator in-process; an ``airflow standalone`` gets :attr:`StatsdServer.env` in its environment.
What arrives here went through Airflow's own StatsD client over the wire, with nothing of ours in between.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

PREFIX = "airflow"


class StatsdServer:
    """Collects StatsD lines (``<prefix>.<name>:<value>|<type>``) sent to ``127.0.0.1:<port>``."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, name="statsd", daemon=True)

    @property
    def env(self) -> dict[str, str]:
        """Airflow's ``[metrics]`` settings that send to this server."""
        return {
            "AIRFLOW__METRICS__STATSD_ON": "True",
            "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(self.port),
            "AIRFLOW__METRICS__STATSD_PREFIX": PREFIX,
        }

    def __enter__(self) -> StatsdServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()

    @contextlib.contextmanager
    def configure(self) -> Iterator[None]:
        """This process's ``Stats`` sends here while the block runs, initialised as Airflow's task runner does."""
        saved = {key: os.environ.get(key) for key in self.env}
        os.environ.update(self.env)
        _initialize_stats()
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            _initialize_stats()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            self.received.extend(line for line in data.decode().splitlines() if line)

    def values(self, name: str, kind: str) -> list[float]:
        """The values received for ``<prefix>.<name>`` of a kind (``c`` counter, ``ms`` timer)."""
        found = []
        for line in list(self.received):
            stat, _, rest = line.partition(":")
            value, _, tail = rest.partition("|")
            if stat == f"{PREFIX}.{name}" and tail.split("|")[0] == kind:
                found.append(float(value))
        return found

    def wait_for(self, name: str, kind: str, timeout: float = 10) -> list[float]:
        deadline = time.monotonic() + timeout
        while not (found := self.values(name, kind)):
            assert time.monotonic() < deadline, f"no {name}|{kind} among {self.received[-50:]}"
            time.sleep(0.05)
        return found


def _initialize_stats() -> None:
    """What Airflow's task runner does at start (``task_runner.main``)."""
    from airflow.sdk import conf
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils

    stats.initialize(
        factory=stats_utils.get_stats_factory(),
        export_legacy_names=conf.getboolean("metrics", "legacy_names_on"),
    )
