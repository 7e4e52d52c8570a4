"""Reading an Airflow connection from every process this provider runs in, wherever Airflow keeps it.

A task or a triggerer asks its supervisor, which reads every place Airflow keeps connections (the Task SDK's own
lookup, ``BaseHook.get_connection``). Outside a supervisor -- ``airflow tao reap | logs | cancel`` (and the
``tao_orphan_sweeper`` DAG, which runs ``airflow tao reap``), and the trigger that ``airflow dags test`` runs inline
(its in-process supervisor cannot answer an async lookup) -- the Task SDK reads only ``AIRFLOW_CONN_*`` variables
and a configured secrets backend, so a connection saved in the metadata database (``airflow connections add``, the
UI) is not found. Airflow's own commands that read connections (``airflow connections get | test``) declare
themselves server processes, whose search path includes the metadata database; here the same server search path is
read when the Task SDK's lookup finds nothing and no task supervisor is there to ask, so every caller gets one
answer wherever the connection lives. Every hook, the operator, the trigger and the CLI read connections here.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.sdk import Connection

log = logging.getLogger(__name__)


def get_connection(conn_id: str) -> Connection:
    """The connection ``conn_id`` (its password and extra masked in logs).

    :raises AirflowNotFoundException: no place Airflow keeps connections has it.
    """
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        conn = _from_server_backends(conn_id) if _no_task_supervisor() else None
        if conn is None:
            raise
        return conn


async def aget_connection(conn_id: str) -> Connection:
    """Async twin of :func:`get_connection`, for triggers (the database is read in a worker thread, as Airflow's
    own async lookup reads a sync secrets backend).

    :raises AirflowNotFoundException: no place Airflow keeps connections has it.
    """
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException
    from asgiref.sync import sync_to_async

    try:
        return await BaseHook.aget_connection(conn_id)
    except AirflowNotFoundException:
        conn = await sync_to_async(_from_server_backends)(conn_id) if _no_task_supervisor() else None
        if conn is None:
            raise
        return conn


def _no_task_supervisor() -> bool:
    """No supervisor process answers this process's lookups: a CLI command, or ``airflow dags test`` (whose
    in-process stand-in answers sync lookups only). In a real task or triggerer the supervisor's answer is final
    (it applies the deployment's rules, and task code may not open the database)."""
    from airflow.sdk.execution_time import task_runner

    return getattr(task_runner, "SUPERVISOR_COMMS", None) is None or runs_inline()


def runs_inline() -> bool:
    """This process is ``airflow dags test`` (or ``dag.test()``): the task and its trigger run here, with an
    in-process stand-in for the supervisor, and no scheduler races the trigger's event."""
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.supervisor import InProcessSupervisorComms

    return isinstance(getattr(task_runner, "SUPERVISOR_COMMS", None), InProcessSupervisorComms)


def _from_server_backends(conn_id: str) -> Connection | None:
    """The connection from the server search path (variables, a configured backend, the metadata database), as a
    Task SDK connection with its secrets masked; None when none has it."""
    from airflow.sdk.configuration import ensure_secrets_loaded
    from airflow.sdk.exceptions import AirflowSecretsBackendAccessDenied

    for backend in ensure_secrets_loaded():  # Airflow's server search path, as `airflow connections get` reads
        try:
            found = backend.get_connection(conn_id=conn_id)
        except AirflowSecretsBackendAccessDenied:
            raise  # an authoritative no: never fall through to a less restrictive place
        except Exception as exc:  # an unreachable backend: the next one may have it (Airflow's rule too)
            log.debug("Reading connection %r from %s failed: %s", conn_id, type(backend).__name__, exc)
            continue
        if found:
            return _sdk_connection(conn_id, found)
    return None


def _sdk_connection(conn_id: str, found: Any) -> Connection:
    """A Task SDK ``Connection`` of a connection a backend returned (the metadata database returns its ORM model,
    which has no async accessors), with its password and extra masked as the Task SDK's lookup masks them."""
    from airflow.sdk import Connection
    from airflow.sdk.log import mask_secret

    conn = Connection(
        conn_id=conn_id,
        conn_type=found.conn_type,
        description=found.description,
        host=found.host,
        schema=found.schema,
        login=found.login,
        password=found.password,
        port=found.port,
        extra=found.extra,
    )
    for secret in (conn.password, conn.extra):
        if secret:
            mask_secret(secret)
    return conn


def console_safe(message: str) -> str:
    """A Test button's message as ``airflow connections test`` must hand it to its console: that command prints it
    as Rich markup, which eats ``[slurm]`` of ``pip install 'airflow-provider-tao[slurm]'``; the UI shows the text
    as it is, so only that command gets it escaped."""
    import sys

    if sys.argv[1:3] != ["connections", "test"]:
        return message
    from rich.markup import escape

    return escape(message)


def similar_conn_ids(conn_id: str) -> list[str]:
    """Connection ids one typo away from ``conn_id`` that this process can see: ``AIRFLOW_CONN_*`` variables, and
    the metadata database's outside a task (a task may not read it)."""
    import difflib
    import os

    seen = {name[len("AIRFLOW_CONN_") :].lower() for name in os.environ if name.startswith("AIRFLOW_CONN_")}
    if _no_task_supervisor():
        try:
            from airflow.models.connection import Connection as Stored
            from airflow.utils.session import create_session
            from sqlalchemy import select

            with create_session() as session:
                seen |= set(session.scalars(select(Stored.conn_id)).all())
        except Exception as exc:  # a hint only: no database, no hint from it
            log.debug("Listing connections for a hint failed: %s", exc)
    return difflib.get_close_matches(conn_id, sorted(seen - {conn_id}), n=1, cutoff=0.8)
