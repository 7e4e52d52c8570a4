"""A search whose trials are real SLURM jobs: three at once, watched by one trigger whose poller asks the cluster
about all of them in one ``squeue`` per interval."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_tao.hooks.slurm import SlurmHook
from airflow_provider_tao.operators.automl import TAOAutoMLOperator
from tests.integration.automl.search_run import follow_search
from tests.integration.taskrun import start

pytestmark = pytest.mark.integration

TRAIN = 'for e in 1 2 3; do echo "TAO_METRIC {\\"step\\": $e, \\"val_loss\\": $TAO_TRIAL_NUMBER.$e}"; sleep 1; done'


def test_trials_are_slurm_jobs_polled_together(
    slurm_cluster: Any, slurm_conn: str, triggerer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[set[str]] = []
    real = SlurmHook.aget_job_statuses

    async def counted(self: SlurmHook, handles: Any) -> Any:
        batches.append({h.job_id for h in handles})
        return await real(self, handles)

    monkeypatch.setattr(SlurmHook, "aget_job_statuses", counted)
    op = TAOAutoMLOperator(
        task_id="tune", conn_id=slurm_conn, image=str(slurm_cluster.oci_bundle_py), command=TRAIN, gpu_count=0,
        search_space={"lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True}},
        metric="val_loss", direction="minimize", algorithm="random", pruner=None, seed=5,
        max_trials=3, max_concurrent_trials=3, deferrable=True, poll_interval=1.0,
    )  # fmt: skip
    run = start(triggerer, op)
    trials = {t["handle"]["job_id"] for t in run.trigger.trials}
    assert len(trials) == 3
    result = follow_search(run, lambda: op)
    assert {r["job_id"] for r in result["trials"]} == trials
    assert all(r["state"] == "complete" and r["last_step"] == 3 for r in result["trials"])
    assert result["best"]["trial"] == 0 and result["best"]["value"] == pytest.approx(0.3)
    watched_together = [b for b in batches if b & trials]
    assert watched_together and trials in watched_together  # one squeue for all three trials
    for trial in result["trials"]:  # each one a real SLURM job that ran to its end
        assert (
            slurm_cluster.wait_terminal(
                run.store.data["tao_automl"]["trials"][trial["trial"]]["handle"]["backend_job_id"]
            ).exit_code
            == "0:0"
        )
