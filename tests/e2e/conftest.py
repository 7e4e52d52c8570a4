"""Fixtures for end-to-end tests against a real ``airflow standalone`` (see ``airflow_harness.py``).

Fixtures:

* ``airflow_standalone_config`` (module scope): the :class:`StandaloneConfig` a test module wants.
  The default points at ``tests/e2e/dags`` with no extra environment. A module (or a conftest
  below this one) overrides it by defining a fixture of the same name, e.g.::

      @pytest.fixture(scope="module")
      def airflow_standalone_config(tmp_path_factory) -> StandaloneConfig:
          return StandaloneConfig(dags_folder=E2E_DAGS, extra_env={"AIRFLOW_CONN_TAO_LOCAL": "..."})

* ``airflow_standalone`` (module scope, backed by one session-wide pool): a running, healthy
  :class:`AirflowStandalone` for that config, on a new database of the session's PostgreSQL server.
  Modules with equal configs share one instance for the whole session; a module with a different
  config stops the running instance and starts another (only one runs at a time: each takes about
  1 GiB PSS). Teardown (at session end or on a switch) kills the process group and fails if anything
  of the instance survives.
* ``airflow_client``: ``airflow_standalone.client`` (an :class:`AirflowClient`).

Every test under ``tests/e2e`` gets the ``e2e`` marker. The terminal summary reports, per instance,
the time to healthy and peak memory, and the duration of each e2e test.

Modules import the harness as ``from tests.e2e.airflow_harness import ...``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.airflow_harness import AirflowClient, AirflowStandalone, StandaloneConfig
from tests.e2e.postgres import PostgresServer
from tests.e2e.tao_connection import TAO_E2E_CONN
from tests.e2e.tao_jobs import E2E_DAG_IDS

E2E_DIR = Path(__file__).resolve().parent

E2E_DAGS = E2E_DIR / "dags"
"""The DAGs folder shared by the e2e tests."""

_POOL_KEY = pytest.StashKey["StandalonePool"]()


class StandalonePool:
    """Hands out running standalone instances; keeps at most one alive and reuses it for equal configs.

    :param base_dir: where the instances' folders go.
    :param database: the server on which each new instance gets a database of its own.
    """

    def __init__(self, base_dir: Path, database: PostgresServer) -> None:
        self.base_dir = base_dir
        self.database = database
        self.current: AirflowStandalone | None = None
        self.history: list[AirflowStandalone] = []

    def acquire(self, config: StandaloneConfig) -> AirflowStandalone:
        """Return a healthy instance for ``config``, starting one (and stopping another) if needed."""
        if self.current is not None and self.current.config == config and self.current.is_running():
            return self.current
        self.release()
        instance = AirflowStandalone(config, database_url=self.database.create_database(), base_dir=self.base_dir)
        self.history.append(instance)
        instance.start()
        self.current = instance
        return instance

    def release(self) -> None:
        """Stop the running instance, if any (raises if processes of it survive)."""
        instance, self.current = self.current, None
        if instance is not None:
            instance.stop()


@pytest.fixture(scope="session")
def airflow_standalone_pool(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StandalonePool]:
    """Session-wide owner of the running standalone instance(s) and of their PostgreSQL server."""
    database = PostgresServer()
    database.start()
    try:
        pool = StandalonePool(tmp_path_factory.mktemp("airflow"), database)
        request.config.stash[_POOL_KEY] = pool
        yield pool
        pool.release()
    finally:
        database.stop()


@pytest.fixture(scope="module")
def airflow_standalone_config() -> StandaloneConfig:
    """Default config: the shared ``tests/e2e/dags`` folder and the ``tao_e2e`` connection. Override per module."""
    return StandaloneConfig(
        dags_folder=E2E_DAGS,
        extra_env={
            "AIRFLOW_CONN_TAO_E2E": TAO_E2E_CONN,
            # a successful try's task_state_store rows are dropped: a clear must still not reuse its job
            "AIRFLOW__STATE_STORE__CLEAR_ON_SUCCESS": "True",
            # outage reports every 5 s, so a 20 s outage stands for a 20-minute one at the default 300 s
            "AIRFLOW__TAO__OUTAGE_REPORT_SECONDS": "5",
        },
    )


@pytest.fixture(scope="module")
def airflow_standalone(
    airflow_standalone_pool: StandalonePool, airflow_standalone_config: StandaloneConfig
) -> AirflowStandalone:
    """A running, healthy ``airflow standalone`` for this module's config (shared while configs are equal)."""
    return airflow_standalone_pool.acquire(airflow_standalone_config)


@pytest.fixture
def tao_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test process reads the ``tao_e2e`` connection (the same jobs folder) as the Airflow processes."""
    monkeypatch.setenv("AIRFLOW_CONN_TAO_E2E", TAO_E2E_CONN)


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    """The run's ``mark_dir``: where its jobs write their started / done marks."""
    folder = tmp_path / "marks"
    folder.mkdir()
    return folder


@pytest.fixture(scope="module")
def dags(airflow_standalone: AirflowStandalone) -> Iterator[AirflowClient]:
    """The client, once every DAG of ``dags/tao_e2e.py`` is parsed and unpaused."""
    client = airflow_standalone.client
    for dag_id in E2E_DAG_IDS:
        client.wait_for_dag(dag_id, timeout=90)
        client.unpause_dag(dag_id)
    yield client


@pytest.fixture
def airflow_client(airflow_standalone: AirflowStandalone) -> AirflowClient:
    """REST client of the running standalone."""
    return airflow_standalone.client


_e2e_nodeids: set[str] = set()
_durations: dict[str, float] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in item.path.resolve().parents:
            item.add_marker(pytest.mark.e2e)
            _e2e_nodeids.add(item.nodeid)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    # After the last e2e test the instance is stopped: its scheduler and DAG processor would otherwise keep a CPU
    # busy through every test that follows.
    if nextitem is None or E2E_DIR not in nextitem.path.resolve().parents:
        pool = item.config.stash.get(_POOL_KEY, None)
        if pool is not None:
            pool.release()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.nodeid in _e2e_nodeids:
        _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    pool = config.stash.get(_POOL_KEY, None)
    if pool is None:
        return
    terminalreporter.section("airflow standalone (e2e harness)")
    for index, instance in enumerate(pool.history, 1):
        terminalreporter.write_line(
            f"instance {index}: dags={instance.config.dags_folder} home={instance.home}\n    {instance.stats.summary()}"
        )
        for line in instance.stats.killed_at_stop:
            terminalreporter.write_line(f"    killed at stop: {line}")
    for nodeid, seconds in _durations.items():
        terminalreporter.write_line(f"{seconds:7.1f}s  {nodeid}  (setup+call+teardown)")
