"""The triggerer's long-lived heap, frozen once: the full garbage collections of a triggerer watching thousands of
jobs then walk the objects of its triggers, not every module and class it imported.

At 10,000 watched jobs the triggerer's worst event-loop stall is one full collection (``benchmarks/triggerer_load.py``):
CPython walks every tracked object of the process, and about half of them are the process's imports (Airflow, the
Task SDK, SQLAlchemy, this provider), alive as long as the process. ``gc.freeze`` moves the objects alive at that
moment into a generation no collection walks; Airflow's DAG processor does it for its own heap. Done once, at the
first poller of the process (its first TAO trigger), after a collection, so no garbage of that moment is kept.
"""

from __future__ import annotations

import functools
import gc

from airflow_provider_tao.settings import freeze_triggerer_heap


@functools.cache  # once per process: the objects made after the freeze are collected as usual
def freeze_long_lived_heap() -> bool:
    """Freeze the objects alive now, the first time this process asks (``[tao] freeze_triggerer_heap``).

    :return: whether the heap was frozen (by the first call).
    """
    if not freeze_triggerer_heap():
        return False
    gc.collect()  # what is garbage now is freed, not frozen with the rest
    gc.freeze()
    return True
