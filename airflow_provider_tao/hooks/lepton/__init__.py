"""The ``lepton`` platform: each job is one DGX Cloud Lepton batch job, through ``leptonai``'s ``APIClient``.

The package exports :class:`~airflow_provider_tao.hooks.lepton.LeptonHook` so its class path stays
``airflow_provider_tao.hooks.lepton.LeptonHook``.
"""

from __future__ import annotations

from airflow_provider_tao.hooks.lepton.hook import LeptonHook

__all__ = ["LeptonHook"]
