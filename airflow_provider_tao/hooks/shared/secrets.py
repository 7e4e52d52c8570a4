"""Keeping secrets out of sight: the secret values of a connection, their redaction from text shown outside a task, and
their registration with Airflow's masker."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def connection_secrets(conn: Any, extras: dict[str, Any] | None = None) -> list[str]:
    """The secret values of a connection: its password and every extra Airflow's masker calls sensitive (plus the
    key and kubeconfig extras, whose names it does not know)."""
    from airflow.sdk._shared.secrets_masker import should_hide_value_for_key

    if extras is None:
        extras = getattr(conn, "extra_dejson", None) or {}
    values = [getattr(conn, "password", None)]
    values += [v for k, v in extras.items() if should_hide_value_for_key(k) or k in _SECRET_EXTRAS]
    return [v for v in values if isinstance(v, str) and len(v) >= 4]


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
