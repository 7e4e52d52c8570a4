"""A search whose trials are Kubernetes Jobs on the fake API server (real clients, pods as real containers)."""

from __future__ import annotations

import pytest

from airflow_provider_tao.hooks.kubernetes import TAOKubernetesHook
from airflow_provider_tao.jobs import JobHandle, JobState
from airflow_provider_tao.operators.automl import TAOAutoMLOperator
from tests.integration.automl.search_run import follow_search
from tests.integration.docker.conftest import DockerEngine
from tests.integration.kubernetes.conftest import CONN_ID, KubeFake
from tests.integration.taskrun import Triggerer, start

pytestmark = pytest.mark.integration

TRAIN = 'echo "TAO_METRIC {\\"step\\": 1, \\"acc\\": 0.$TAO_TRIAL_NUMBER}"'


def test_trials_are_kubernetes_jobs_and_the_best_is_maximised(
    docker_engine: DockerEngine, kubefake: KubeFake, triggerer: Triggerer
) -> None:
    def make() -> TAOAutoMLOperator:
        return TAOAutoMLOperator(
            task_id="tune", conn_id=CONN_ID, image=docker_engine.busybox, command=TRAIN, gpu_count=0,
            search_space={"depth": {"type": "int", "low": 1, "high": 3}},
            metric="acc", direction="maximize", algorithm="random", pruner=None, seed=1,
            max_trials=2, max_concurrent_trials=2, deferrable=True, poll_interval=1.0,
        )  # fmt: skip

    run = start(triggerer, make())
    result = follow_search(run, make)
    rows = result["trials"]
    assert [r["state"] for r in rows] == ["complete", "complete"]
    assert result["best"]["trial"] == 1 and result["best"]["value"] == pytest.approx(0.1)  # maximised
    hook = TAOKubernetesHook(CONN_ID)
    hook.load_connection()
    for trial in run.store.data["tao_automl"]["trials"]:  # each its own Job on the API server, complete
        assert hook.get_job_status(JobHandle.from_json(trial["handle"])).state is JobState.COMPLETE
