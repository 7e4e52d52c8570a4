"""The retraining pipeline of ``example_dags/tao_retraining_pipeline.py`` end to end on a real ``airflow standalone``:
the training DAG's job publishes the model Asset, and the Asset event -- not a person -- starts the evaluation DAG."""

from __future__ import annotations

from tests.e2e.airflow_harness import AirflowClient, wait_until


def test_a_new_model_asset_event_triggers_the_evaluation_dag(ui_dags: AirflowClient) -> None:
    before = {r["dag_run_id"] for r in _runs(ui_dags, "tao_retraining_evaluate")}
    run_id = ui_dags.trigger_dag_run("tao_retraining_train")
    ui_dags.wait_for_dag_run("tao_retraining_train", run_id, ["success"], timeout=180)
    trained = ui_dags.get_xcom("tao_retraining_train", run_id, "train")

    # the Asset event carries which model this is
    events = ui_dags._json("GET", "/assets/events", params={"source_dag_id": "tao_retraining_train", "limit": 100})
    (event,) = [e for e in events["asset_events"] if e["source_run_id"] == run_id]
    extra = event["extra"]
    assert extra["job_id"] == trained["job_id"] and extra["platform"] == "local"
    assert extra["results_dir"] == trained["results_dir"]
    assert extra["metrics"]["epochs"] == 8 and extra["metrics"]["train_mse"] < 0.01
    assert (extra["dag_id"], extra["run_id"], extra["task_id"]) == ("tao_retraining_train", run_id, "train")

    new_run = wait_until(
        lambda: next((r for r in _runs(ui_dags, "tao_retraining_evaluate") if r["dag_run_id"] not in before), None),
        timeout=120,
        message="the Asset event did not start tao_retraining_evaluate",
    )
    assert new_run["run_type"] == "asset_triggered", new_run
    ui_dags.wait_for_dag_run("tao_retraining_evaluate", new_run["dag_run_id"], ["success"], timeout=120)
    scores = ui_dags.get_xcom("tao_retraining_evaluate", new_run["dag_run_id"], "evaluate")
    assert list(scores) == [trained["job_id"]] and scores[trained["job_id"]] < 0.05
    log = ui_dags.get_task_log("tao_retraining_evaluate", new_run["dag_run_id"], "evaluate", 1)
    assert f"model of job {trained['job_id']} on local" in log, log[-3000:]


def _runs(client: AirflowClient, dag_id: str) -> list[dict]:
    return list(client._json("GET", f"/dags/{dag_id}/dagRuns", params={"limit": 100})["dag_runs"])
