"""Where a connection is looked up (:mod:`airflow_provider_tao.connections`): the Task SDK first; Airflow's server
search path (which holds the metadata database) only where no task supervisor answers. The CLI and ``airflow dags
test`` paths against a real database: ``tests/e2e/test_first_hour.py``."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowNotFoundException
from airflow.sdk.execution_time import task_runner
from airflow.sdk.execution_time.supervisor import InProcessSupervisorComms

from airflow_provider_tao import connections


class _Backend:
    """A server-side place that has the connection (as the metadata database returns it: an ORM-like object)."""

    calls = 0

    def get_connection(self, conn_id: str) -> Any:
        type(self).calls += 1
        fields = dict(conn_type="tao_local", description=None, host=None, schema=None, login="u", port=None)
        return type("Row", (), {**fields, "password": "pw-Zq9x", "extra": '{"jobs_dir": "/j"}'})()


@pytest.fixture
def server_has_it(monkeypatch: pytest.MonkeyPatch) -> type[_Backend]:
    _Backend.calls = 0
    from airflow.sdk import configuration

    real = configuration.ensure_secrets_loaded
    # the server search path is the default one; the Task SDK's own lookups name theirs (workers', fallback)
    monkeypatch.setattr(
        configuration, "ensure_secrets_loaded", lambda *a, **k: real(*a, **k) if a or k else [_Backend()]
    )
    monkeypatch.delenv("AIRFLOW_CONN_IN_DB_ONLY", raising=False)
    return _Backend


@pytest.mark.parametrize("comms", ["none", "in-process"])
async def test_without_a_task_supervisor_the_server_search_path_is_read(
    monkeypatch: pytest.MonkeyPatch, server_has_it: type[_Backend], comms: str
) -> None:
    """A CLI process (no supervisor) and ``airflow dags test`` (its in-process stand-in cannot answer async)."""
    stand_in = InProcessSupervisorComms.__new__(InProcessSupervisorComms) if comms == "in-process" else None
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", stand_in, raising=False)
    conn = await connections.aget_connection("in_db_only")
    assert (conn.conn_id, conn.conn_type, conn.login, conn.password) == ("in_db_only", "tao_local", "u", "pw-Zq9x")
    assert await conn.aextra_dejson() == {"jobs_dir": "/j"}  # a Task SDK connection (the hooks' async accessors)
    if comms == "none":  # (a sync lookup through the in-process stand-in would ask its execution API)
        assert connections.get_connection("in_db_only").extra_dejson == {"jobs_dir": "/j"}


def test_in_a_task_the_supervisors_answer_is_final(monkeypatch: pytest.MonkeyPatch, server_has_it: Any) -> None:
    """Task code never opens the database, and the supervisor applies the deployment's rules (teams, backends)."""

    class Supervisor:  # a real task's comms: it says "no such connection"
        def send(self, msg: Any) -> Any:
            from airflow.sdk.execution_time.comms import ErrorResponse

            return ErrorResponse()

    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", Supervisor(), raising=False)
    with pytest.raises(AirflowNotFoundException):
        connections.get_connection("in_db_only")
    assert server_has_it.calls == 0


def test_a_cli_command_on_a_job_whose_connection_is_gone_says_so_in_words(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``airflow tao logs | cancel``: a message naming the connection, not a traceback."""
    from types import SimpleNamespace

    from airflow_provider_tao.cli import commands
    from airflow_provider_tao.jobs import JobHandle

    handle = JobHandle("local", "tao_gone", "a1b2c3d4e5f6", "n")
    monkeypatch.setattr(
        commands, "_job", lambda job_id: SimpleNamespace(job_id=job_id, record=SimpleNamespace(job=handle))
    )
    monkeypatch.setattr("airflow.sdk.configuration.ensure_secrets_loaded", lambda *a, **k: [])  # nowhere has it
    with pytest.raises(SystemExit) as exc:
        commands._job_on_platform("a1b2c3d4e5f6")
    assert exc.value.code == 1
    assert "job a1b2c3d4e5f6 ran on the local connection 'tao_gone', which cannot be read:" in capsys.readouterr().err
