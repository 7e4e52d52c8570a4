"""The ``kubernetes`` platform: each job is one ``batch/v1`` Job named after the task instance.

The package exports :class:`~airflow_provider_tao.hooks.kubernetes.TAOKubernetesHook` so its class path stays
``airflow_provider_tao.hooks.kubernetes.TAOKubernetesHook``.
"""

from __future__ import annotations

from airflow_provider_tao.hooks.kubernetes.hook import TAOKubernetesHook

__all__ = ["TAOKubernetesHook"]
