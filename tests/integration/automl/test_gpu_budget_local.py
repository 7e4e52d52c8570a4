"""``max_gpu_hours`` on a single ``TAOSubmitOperator`` job on ``local`` (issue 33 point 6): a real process, the real
trigger on a triggerer loop; the job passes a tiny budget, is canceled, and the task fails for good with
``ERR_BUDGET``. The worker host shows one GPU through ``CUDA_VISIBLE_DEVICES`` (the local platform's own way of
giving GPUs: the job is charged 1 GPU x the seconds it ran); the test waits on the trigger's events, not on time."""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_tao.hooks.local.hook import LocalHook
from airflow_provider_tao.jobs import JobHandle, JobState
from airflow_provider_tao.records import STATE_KEY
from tests.integration.taskrun import Triggerer, follow, make_operator, start


def test_a_job_past_its_gpu_hours_is_canceled_and_fails_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, triggerer: Triggerer
) -> None:
    monkeypatch.setenv("AIRFLOW__TAO__LOCAL_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("AIRFLOW__TAO__LOCAL_RESULTS_ROOT", str(tmp_path / "results"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    budget = 0.0005  # 1.8 GPU-seconds
    op = make_operator(
        None, platform="local", command="sleep 600", gpu_count=1, max_gpu_hours=budget, poll_interval=0.2
    )
    run = start(triggerer, op)
    with pytest.raises(AirflowFailException, match=r"passed max_gpu_hours=0.0005 .*ERR_BUDGET, it was canceled"):
        follow(run)  # the trigger wakes at the earliest moment; a job that started late is watched again
    handle = JobHandle.from_json(run.handle)
    assert LocalHook().get_job_status(handle).state is JobState.CANCELED
    assert run.store.get(STATE_KEY)["err_class"] == "ERR_BUDGET"
