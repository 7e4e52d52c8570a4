"""airflow-provider-tao: run TAO (or any containerised) GPU training jobs from Airflow on many platforms."""

from __future__ import annotations

__version__ = "0.1.0"
