"""Functions run as ``@task.tao`` jobs by the tests (in a file: their source travels with the job), and
:func:`decorated`, the operator of one call of such a function in a DAG."""

from __future__ import annotations

import uuid
from typing import Any

from airflow.sdk import DAG

from airflow_provider_tao.decorators.tao import tao_task


def add(a, b, counter=None):  # type: ignore[no-untyped-def]
    import os
    import sys

    print(f"adding {a} and {b} on Python {sys.version_info[0]}.{sys.version_info[1]}", flush=True)
    if counter:  # one line per run of the function: how many jobs really ran it
        with open(counter, "a") as runs:
            runs.write(os.environ["TAO_JOB_ID"] + "\n")
    return {"sum": a + b, "job_id": os.environ["TAO_JOB_ID"], "rank": os.environ.get("NODE_RANK", "0")}


def wait_for_go(go_file):  # type: ignore[no-untyped-def]
    import os
    import time

    print("epoch-1 started", flush=True)
    while not os.path.exists(go_file):
        time.sleep(0.05)
    print("epoch-2 done", flush=True)
    return "went"


def broken(rate):  # type: ignore[no-untyped-def]
    def check_learning_rate(value):  # type: ignore[no-untyped-def]
        raise ValueError(f"bad learning rate {value}")

    check_learning_rate(rate)


def needs_missing_module():  # type: ignore[no-untyped-def]
    import tao_module_nobody_has  # noqa: F401


def decorated(function: Any, *args: Any, **operator_kwargs: Any) -> Any:
    """The ``@task.tao`` operator of ``function(*args)`` (a fresh DAG each time)."""
    with DAG(f"taskflow_{uuid.uuid4().hex[:8]}", schedule=None):
        called = tao_task(**operator_kwargs)(function)(*args)
    return called.operator
