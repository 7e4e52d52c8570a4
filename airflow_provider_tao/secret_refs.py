"""A DAG author's own secrets for a job (``TAOSubmitOperator(secret_env=...)``): references to connection fields,
never values.

``secret_env`` maps environment variable names to ``conn:<conn_id>.<field>`` -- ``password``, ``login``, ``host``,
``schema``, ``port``, or the name of an extra (``conn:my_hf.password``, ``conn:wandb.api_key``). The worker reads
the values when it builds the job and hands them over the platform's secret channel (``JobSpec.secret_env``: the
0600 env file on SLURM and ``local``, the launcher's secrets file in a Docker container or on a Brev instance, a
Kubernetes Secret, Lepton workspace secrets) -- never the job spec, a command line, ``docker inspect`` or the trigger's
kwargs. Only the references travel (the trigger's ``secret_conn_ids``, the job's record): every process that shows
the job's lines (the triggerer, a resumed worker, the job page, ``airflow tao logs``) reads the values again from
the same connections and masks them (:mod:`airflow_provider_tao.received_secrets`).

Why references only: a value rendered into the task (a templated Variable, ``{{ conn.x.password }}``) would have to
be carried to those processes to be masked there -- in the metadata database, which must never hold it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from airflow_provider_tao.hooks.errors import JobValidationError

PREFIX = "conn:"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REF = re.compile(r"^conn:([\w.\-#!()/\\:]+)\.([A-Za-z0-9_\-]+)$")
_FIELDS = ("password", "login", "host", "schema", "port")
_FIX = "Map each variable to a connection field: {'HF_TOKEN': 'conn:my_hf.password'} (or conn:<id>.<extra key>)"


def is_ref(entry: str) -> bool:
    """Whether an entry of ``secret_conn_ids`` is a field reference (else it names a whole connection)."""
    return entry.startswith(PREFIX)


def parse_secret_env(secret_env: Any) -> dict[str, tuple[str, str]]:
    """``{name: (conn_id, field)}`` of a task's ``secret_env``, or a :class:`JobValidationError` naming the entry.

    The error never repeats a value that is not a reference: it may be the secret itself.

    :param secret_env: the operator's parameter.
    """
    if secret_env is None:
        return {}
    if not isinstance(secret_env, Mapping):
        raise JobValidationError("secret_env", f"is a {type(secret_env).__name__}, not a mapping", _FIX)
    refs = {}
    for name, ref in secret_env.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise JobValidationError(f"secret_env[{name!r}]", "is not an environment variable name", _FIX)
        match = _REF.match(ref) if isinstance(ref, str) else None
        if match is None:
            raise JobValidationError(
                f"secret_env[{name!r}]", "is not a connection field reference (its value is not shown)", _FIX
            )
        refs[name] = (match.group(1), match.group(2))
    return refs


def references(refs: Mapping[str, tuple[str, str]]) -> list[str]:
    """The references as ``secret_conn_ids`` entries (what the trigger and the record carry: never a value)."""
    return list(dict.fromkeys(f"{PREFIX}{conn_id}.{field}" for conn_id, field in refs.values()))


def field_of(conn: Any, field: str, extras: Mapping[str, Any] | None = None) -> str | None:
    """The value of ``field`` of a connection: one of its fields, else an extra; None when it has none."""
    if field in _FIELDS:
        value = getattr(conn, field, None)
    else:
        value = (extras if extras is not None else (getattr(conn, "extra_dejson", None) or {})).get(field)
    return None if value is None or value == "" else str(value)


def resolve(refs: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """The values of the references, read from the connections (a worker, before submitting).

    :raises JobValidationError: a connection that does not exist, or a field it does not have.
    """
    from airflow.sdk.exceptions import AirflowNotFoundException

    from airflow_provider_tao.connections import get_connection
    from airflow_provider_tao.runner.validation import check_exec_text

    values = {}
    for name, (conn_id, field) in refs.items():
        where = f"secret_env[{name!r}]"
        try:
            conn = get_connection(conn_id)
        except AirflowNotFoundException as exc:
            raise JobValidationError(where, f"there is no Airflow connection {conn_id!r}", _FIX) from exc
        value = field_of(conn, field)
        if value is None:
            raise JobValidationError(where, f"connection {conn_id!r} has no {field!r} (field or extra)", _FIX)
        try:
            check_exec_text(value, where)
        except ValueError as exc:
            raise JobValidationError(where, str(exc).partition(": ")[2], "Fix the connection's value") from exc
        values[name] = value
    return values


def referenced_value(entry: str, conn: Any, extras: Mapping[str, Any]) -> list[str]:
    """The value a ``conn:<id>.<field>`` entry names, read from its connection (already read), for masking."""
    match = _REF.match(entry)
    value = field_of(conn, match.group(2), extras) if match else None
    return [value] if value else []


def ref_conn_id(entry: str) -> str:
    """The connection a ``secret_conn_ids`` entry reads: the entry itself, or a reference's connection."""
    match = _REF.match(entry) if is_ref(entry) else None
    return match.group(1) if match else entry
