"""The ``slurm`` platform: jobs staged on a cluster's shared filesystem and submitted with ``sbatch`` over SSH.

The package exports :class:`~airflow_provider_tao.hooks.slurm.SlurmHook` so its class path stays
``airflow_provider_tao.hooks.slurm.SlurmHook``.
"""

from __future__ import annotations

from airflow_provider_tao.hooks.slurm.hook import SlurmHook

__all__ = ["SlurmHook"]
