"""The ``brev`` platform: each job is a Docker container on an NVIDIA Brev GPU instance, through the ``brev`` CLI.

The package exports :class:`~airflow_provider_tao.hooks.brev.BrevHook` so its class path stays
``airflow_provider_tao.hooks.brev.BrevHook``.
"""

from __future__ import annotations

from airflow_provider_tao.hooks.brev.hook import BrevHook

__all__ = ["BrevHook"]
