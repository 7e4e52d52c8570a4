"""Keeping secrets out of sight: the secret values of a connection, their redaction from text shown outside a task, and
their registration with Airflow's masker."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_provider_tao import connections


def connection_secrets(conn: Any, extras: dict[str, Any] | None = None) -> list[str]:
    """The secret values of a connection: its password and every extra Airflow's masker calls sensitive (plus the
    key and kubeconfig extras, whose names it does not know)."""
    from airflow.sdk._shared.secrets_masker import should_hide_value_for_key

    if extras is None:
        extras = getattr(conn, "extra_dejson", None) or {}
    values = [getattr(conn, "password", None)]
    values += [v for k, v in extras.items() if should_hide_value_for_key(k) or k in _SECRET_EXTRAS]
    return [v for v in values if isinstance(v, str) and len(v) >= 4]


def secrets_of(conn_ids: Sequence[str]) -> list[str]:
    """The secret values of these connections (one that cannot be read adds none), for text shown outside a task
    -- a job's log on its job page or from ``airflow tao logs`` -- where Airflow's task-log masker does not run."""
    values: list[str] = []
    for conn_id in conn_ids:
        try:
            values += connection_secrets(connections.get_connection(conn_id))
        except Exception:  # a deleted connection: nothing of it to hide
            continue
    return values


def redact(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every one of ``secrets`` replaced by ``***`` (longest first, so no part of one survives)."""
    for value in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(value, "***")
    return text


def register_secrets(values: Sequence[str]) -> None:
    """Hand every secret a job receives to Airflow's secrets masker (task log and supervisor)."""
    from airflow.sdk.log import mask_secret

    for value in values:
        if value:
            mask_secret(value)


#: Extras that hold secrets although their names do not say so (Airflow's masker only knows generic names).
_SECRET_EXTRAS = frozenset({"private_key", "private_key_passphrase", "kube_config"})
