"""The ``@task.tao`` check every platform passes (tests/integration/*/test_taskflow.py): two tasks in one
triggerer -- arguments in and the return value out of the job that ran, the function's print output in the task
log; an exception failing its task as ERR_PROGRAM with the function's traceback in the task log."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from tests import taskflow_cases as cases
from tests.integration.taskrun import Triggerer, finish, start


def check_taskflow(triggerer: Triggerer, capfd: Any, **operator_kwargs: Any) -> dict[str, Any]:
    """Run ``add(20, 22)`` and ``broken(0.1)`` as ``@task.tao`` tasks with ``operator_kwargs``; the value."""
    kwargs = {"gpu_count": 0, "deferrable": True, "poll_interval": 1.0, **operator_kwargs}
    ok = start(triggerer, cases.decorated(cases.add, 20, 22, **kwargs))
    bad = start(triggerer, cases.decorated(cases.broken, 0.1, **kwargs))

    value = finish(ok, timeout=180)
    with pytest.raises(AirflowFailException, match="ERR_PROGRAM") as failure:
        finish(bad, timeout=180)

    assert value["sum"] == 42 and value["job_id"] == ok.job_id
    assert "broken raised ValueError: bad learning rate 0.1" in str(failure.value)
    captured = capfd.readouterr()
    logged = captured.out + captured.err
    assert "[job] adding 20 and 22 on Python 3." in logged
    assert "in check_learning_rate" in logged and "[job] ValueError: bad learning rate 0.1" in logged
    return dict(value)
