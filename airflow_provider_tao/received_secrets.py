"""The secrets a job received, found again in another process -- the triggerer, a resumed worker -- to mask them in
the task log.

The worker registers every secret it hands a job with its own masker, but a deferred job's log lines are written by
the triggerer, which never saw them; and trigger kwargs (stored in the metadata database) must never carry secrets.
So the triggerer derives them again, from the same sources and by the same rules the worker used:

* every field a task's ``secret_env`` names (``conn:<id>.<field>`` entries of ``secret_conn_ids``,
  :mod:`airflow_provider_tao.secret_refs`);
* every connection of ``secret_conn_ids``: its password, its extras Airflow calls sensitive, the key and kubeconfig
  extras (and the credentials inside a kubeconfig);
* a platform connection's settings that fall back to the environment (``NGC_KEY``, ``HF_TOKEN``,
  ``LEPTON_AUTH_TOKEN``, ``BREV_API_TOKEN``), read from the triggerer's environment -- the deployment's, as the
  worker's;
* an ``aws`` storage connection's credentials through the boto chain the job's credentials came from (keys of the
  connection, the environment, a shared credentials file, an instance profile).

Why not another way: carrying the values (or reversible forms of them) in the trigger's kwargs puts them in the
metadata database; hashes of them would let a reader of the database test guesses of a weak password offline.

Limit: credentials that a chain issues anew to each process (an STS ``role_arn`` of the connection, web identity)
differ between the worker and the triggerer and cannot be found again this way; they are masked by the worker only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from airflow_provider_tao.secret_refs import is_ref, ref_conn_id, referenced_value

log = logging.getLogger(__name__)

#: kubeconfig keys whose values are credentials (besides the names Airflow's masker knows).
_KUBECONFIG_SECRETS = frozenset({"client-key-data", "token", "id-token", "refresh-token", "password"})


#: Lookups under way, by event loop and connections: the triggers a restarted triggerer starts by the thousand share
#: one (a connection read and a boto chain per burst, not per trigger); each burst still reads afresh.
_LOOKUPS: dict[tuple[int, tuple[str, ...]], asyncio.Future[list[str]]] = {}


async def asecrets_received(conn_ids: Sequence[str]) -> list[str]:
    """Every secret value a job of these connections received (a connection that cannot be read adds none)."""
    key = (id(asyncio.get_running_loop()), tuple(conn_ids))
    lookup = _LOOKUPS.get(key)
    if lookup is None:
        lookup = _LOOKUPS[key] = asyncio.ensure_future(_asecrets_received(key[1]))
        lookup.add_done_callback(lambda _: _LOOKUPS.pop(key, None))
    return list(await asyncio.shield(lookup))  # a waiter cancelled does not cancel the others' lookup


async def _asecrets_received(conn_ids: Sequence[str]) -> list[str]:
    from airflow_provider_tao.connections import aget_connection

    values: list[str] = []
    for conn_id in conn_ids:
        try:
            conn = await aget_connection(ref_conn_id(conn_id))
            extras = await conn.aextra_dejson()
            values += await asyncio.to_thread(_secrets_of, conn_id, conn, extras if isinstance(extras, dict) else {})
        except Exception as exc:  # masking is best effort per connection; the others still count
            log.warning("Could not find the secrets of connection %r to mask them: %s", conn_id, exc)
    return [v for v in dict.fromkeys(values) if v]


def secrets_received(conn_ids: Sequence[str]) -> list[str]:
    """:func:`asecrets_received` for a worker: a resumed task (``execute_complete``) or a reattached one is a new
    process that never handed the job its secrets, yet writes the job's lines (its log, the failure evidence)."""
    from airflow_provider_tao.connections import get_connection

    values: list[str] = []
    for conn_id in conn_ids:
        try:
            conn = get_connection(ref_conn_id(conn_id))
            extras = conn.extra_dejson
            values += _secrets_of(conn_id, conn, extras if isinstance(extras, dict) else {})
        except Exception as exc:  # masking is best effort per connection; the others still count
            log.warning("Could not find the secrets of connection %r to mask them: %s", conn_id, exc)
    return [v for v in dict.fromkeys(values) if v]


def job_secrets(secret_conn_ids: Sequence[str], platform_conn_id: str | None, platform: str | None = None) -> list[str]:
    """The secrets a job received, found as a resumed task finds them, for its log shown outside a task -- its job
    page, ``airflow tao logs`` -- where no task-log masker runs: the storage connection's and the platform
    connection's (its NGC or HF key, set in the connection or by the environment fallback) -- or, for a job
    submitted with no connection (``conn_id=None``), the platform's environment fallbacks."""
    values = secrets_received([c for c in dict.fromkeys([*secret_conn_ids, platform_conn_id]) if c])
    if platform_conn_id is None and platform:
        values += platform_default_secrets(platform)
    return [v for v in dict.fromkeys(values) if v]


def platform_default_secrets(platform: str) -> list[str]:
    """The secrets a job submitted with no connection (``conn_id=None``) received: its platform's secret settings
    from their environment fallbacks (``LEPTON_AUTH_TOKEN``, ``NGC_KEY``, ``HF_TOKEN``, ``BREV_API_TOKEN``). Best
    effort: an unknown platform adds none."""
    from types import SimpleNamespace

    from airflow_provider_tao.hooks import get_platform_hook

    try:
        no_connection = SimpleNamespace(conn_type=None, host=None, login=None, port=None, password=None, schema=None)
        return _fallback_secrets(get_platform_hook(platform, None), no_connection, {})
    except Exception as exc:
        log.warning("Could not find the %s platform's default secrets to mask them: %s", platform, exc)
        return []


def _secrets_of(conn_id: str, conn: Any, extras: dict[str, Any]) -> list[str]:
    from airflow_provider_tao.hooks import get_platform_hook, platform_for_conn_type
    from airflow_provider_tao.hooks.shared.secrets import connection_secrets

    if is_ref(conn_id):  # a field the task's secret_env names (conn:<id>.<field>): that value only
        return referenced_value(conn_id, conn, extras)
    values = connection_secrets(conn, extras) + kubeconfig_secrets(extras.get("kube_config"))
    platform = platform_for_conn_type(conn.conn_type or "")
    if platform is not None:
        values += _fallback_secrets(get_platform_hook(platform, conn_id), conn, extras)
    elif conn.conn_type == "aws":
        values += _aws_chain_secrets(conn)
    return values


def _fallback_secrets(hook: Any, conn: Any, extras: dict[str, Any]) -> list[str]:
    """The hook's secret settings as the job got them: field or extra, else the environment fallback."""
    from airflow.sdk._shared.secrets_masker import should_hide_value_for_key

    hook._set_connection(conn, extras)  # the connection already read: no second lookup from this thread
    secret = [name for name in hook.env_fallbacks if should_hide_value_for_key(name)]
    return [str(hook.setting(name)) for name in secret if hook.setting(name)]


def _aws_chain_secrets(conn: Any) -> list[str]:
    """The credentials an ``aws`` connection's boto chain gives (as the staging step handed them to the job)."""
    from airflow.providers.amazon.aws.hooks.base_aws import BaseSessionFactory
    from airflow.providers.amazon.aws.utils.connection_wrapper import AwsConnectionWrapper

    wrapper = AwsConnectionWrapper(conn=conn)
    if wrapper.role_arn:  # an STS call here would only issue other keys than the job's (see the module's limit)
        return []
    credentials = BaseSessionFactory(conn=wrapper).create_session().get_credentials()
    if credentials is None:
        return []
    frozen = credentials.get_frozen_credentials()
    # the access key id is an identifier (AWS does not keep it secret; moto's is the word "testing")
    return [v for v in (frozen.secret_key, frozen.token) if v]


def kubeconfig_secrets(kube_config: Any) -> list[str]:
    """The credentials inside a kubeconfig (YAML text or a mapping): tokens, passwords, client keys."""
    if isinstance(kube_config, str):
        import yaml

        try:
            kube_config = yaml.safe_load(kube_config)
        except yaml.YAMLError:
            return []
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, str) and str(key) in _KUBECONFIG_SECRETS:
                    found.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(kube_config)
    return [v for v in found if len(v) >= 4]
