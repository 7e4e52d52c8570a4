"""The ``docker`` platform: each job is one detached container on a Docker daemon.

The package exports :class:`~airflow_provider_tao.hooks.docker.TAODockerHook` so its class path stays
``airflow_provider_tao.hooks.docker.TAODockerHook``.
"""

from __future__ import annotations

from airflow_provider_tao.hooks.docker.hook import TAODockerHook

__all__ = ["TAODockerHook"]
