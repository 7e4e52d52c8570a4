"""The ``local`` platform: jobs run as detached process groups on the worker host.

The package exports :class:`~airflow_provider_tao.hooks.local.LocalHook` so its class path stays
``airflow_provider_tao.hooks.local.LocalHook``.
"""

from __future__ import annotations

from airflow_provider_tao.hooks.local.hook import LocalHook

__all__ = ["LocalHook"]
