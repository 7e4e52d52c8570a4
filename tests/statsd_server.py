"""A StatsD server for tests: a UDP socket on loopback that records every metric line it receives.

:class:`StatsdServer` configures Airflow's metrics the way a deployment does (``[metrics] statsd_on``, host, port,
through ``AIRFLOW__METRICS__*``) and initialises the task SDK's ``Stats`` exactly as Airflow's task runner does
(``stats.initialize(factory=stats_utils.get_stats_factory(), ...)``): what arrives here went through Airflow's own
StatsD client over the wire, with nothing of ours in between.
"""

from __future__ import annotations

import os
import socket
import threading
import time
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
        self._env = {
            "AIRFLOW__METRICS__STATSD_ON": "True",
            "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(self.port),
            "AIRFLOW__METRICS__STATSD_PREFIX": PREFIX,
        }
        self._saved: dict[str, str | None] = {}

    def __enter__(self) -> StatsdServer:
        self._thread.start()
        self._saved = {key: os.environ.get(key) for key in self._env}
        os.environ.update(self._env)
        self._initialize()
        return self

    def __exit__(self, *exc: Any) -> None:
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._initialize()
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()

    @staticmethod
    def _initialize() -> None:
        from airflow.sdk import conf
        from airflow.sdk.observability import stats
        from airflow.sdk.observability.metrics import stats_utils

        stats.initialize(
            factory=stats_utils.get_stats_factory(),
            export_legacy_names=conf.getboolean("metrics", "legacy_names_on"),
        )

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
            assert time.monotonic() < deadline, f"no {name}|{kind} among {self.received}"
            time.sleep(0.05)
        return found
