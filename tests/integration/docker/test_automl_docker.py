"""A search whose trials are containers on the real Docker engine: two at once, a third once one ends."""

from __future__ import annotations

import pytest

from airflow_provider_tao.operators.automl import TAOAutoMLOperator
from tests.integration.automl.search_run import follow_search
from tests.integration.docker.conftest import CONN_ID, DockerEngine
from tests.integration.taskrun import Triggerer, start

pytestmark = pytest.mark.integration

TRAIN = 'for e in 1 2; do echo "epoch $e val_loss=1$TAO_TRIAL_NUMBER.$e"; sleep 1; done'


def test_trials_run_as_containers_two_at_once(docker_engine: DockerEngine, triggerer: Triggerer) -> None:
    def make() -> TAOAutoMLOperator:
        return TAOAutoMLOperator(
            task_id="tune", conn_id=CONN_ID, image=docker_engine.busybox, command=TRAIN, gpu_count=0,
            search_space={"width": {"type": "categorical", "choices": [16, 32, 64]}},
            metric="val_loss", direction="minimize", algorithm="grid", pruner=None,
            max_concurrent_trials=2, deferrable=True, poll_interval=1.0,
        )  # fmt: skip

    run = start(triggerer, make())
    first = [t["handle"]["job_id"] for t in run.trigger.trials]
    assert len(first) == 2 and all(docker_engine.state(job_id)["Running"] for job_id in first)
    result = follow_search(run, make)
    rows = result["trials"]
    assert len(rows) == 3  # the grid's three points, each once
    assert sorted(r["params"]["width"] for r in rows) == [16, 32, 64]
    assert [r["state"] for r in rows] == ["complete"] * 3 and [r["last_step"] for r in rows] == [2, 2, 2]
    assert result["best"]["trial"] == 0 and result["best"]["value"] == pytest.approx(10.2)
    for row in rows:  # each a container of its own that exited 0
        assert docker_engine.state(row["job_id"])["ExitCode"] == 0
