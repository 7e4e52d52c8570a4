"""``airflow tao`` against a real ``airflow standalone``: a run's jobs on two platforms, the log of one, a cancel that
fails the deferred task with ERR_CANCELED and no retry, the reaper on orphans and on Brev's leased instances."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from tests.brevfake.control import BrevWorld
from tests.e2e.airflow_harness import AirflowClient, AirflowStandalone, wait_until
from tests.e2e.ui.conftest import airflow_cli, cli_json, cli_json_run


def test_jobs_lists_the_jobs_of_a_run_on_two_platforms(airflow_standalone: AirflowStandalone, ui_dags: AirflowClient):
    run_id = ui_dags.trigger_dag_run("tao_ui_two_platforms")
    ui_dags.wait_for_dag_run("tao_ui_two_platforms", run_id, ["success"], timeout=180)

    rows = cli_json(airflow_standalone, "tao", "jobs", "--run-id", run_id)
    assert sorted((r["task_id"], r["platform"], r["state"]) for r in rows) == [
        ("train_docker", "docker", "Complete"),
        ("train_local", "local", "Complete"),
    ]
    for row in rows:
        assert row["dag_id"] == "tao_ui_two_platforms" and row["run_id"] == run_id
        assert row["task_state"] == "success" and row["try_number"] == 1
        assert row["runtime_seconds"] >= 3.0
        gpus = 2 if row["platform"] == "docker" else 1
        assert (row["gpus"], row["nodes"]) == (gpus, 1)
        assert row["gpu_hours"] == pytest.approx(gpus * row["runtime_seconds"] / 3600, rel=0.02, abs=1e-4)
        assert row["job_id"] == ui_dags.get_xcom("tao_ui_two_platforms", run_id, row["task_id"])["job_id"]
    # the other filters narrow the same list
    assert [r["platform"] for r in cli_json(airflow_standalone, "tao", "jobs", "-r", run_id, "-p", "docker")] == [
        "docker"
    ]

    # (the local job's log: other test sessions on the shared Docker engine may remove this provider's containers)
    local_job = next(r for r in rows if r["platform"] == "local")
    log = cli_json(airflow_standalone, "tao", "logs", local_job["job_id"])
    steps = [line for line in log[0]["log"].splitlines() if line.startswith("step")]
    assert steps == [f"step {i}" for i in range(1, 5)], log
    tail = airflow_cli(airflow_standalone, "tao", "logs", local_job["job_id"], "--tail", "1")
    assert tail.returncode == 0 and tail.stdout.strip().endswith("step 4"), tail.stdout + tail.stderr


def test_cancel_fails_the_deferred_task_with_err_canceled(
    airflow_standalone: AirflowStandalone, ui_dags: AirflowClient
):
    run_id = ui_dags.trigger_dag_run("tao_ui_cancel")
    ui_dags.wait_for_task_instance("tao_ui_cancel", run_id, "train", ["deferred"], timeout=120)
    # str: XCom's JSON reads an id that happens to be 12 digits back as a number
    job_id = ui_dags.get_job_id("tao_ui_cancel", run_id, "train")  # pushed before deferring
    (row,) = cli_json(airflow_standalone, "tao", "jobs", "--run-id", run_id)
    assert (row["job_id"], row["state"], row["task_state"]) == (job_id, "Running", "deferred")
    pid = int(row["backend_job_id"])
    assert _alive(pid)

    started = time.monotonic()
    (result,) = cli_json(airflow_standalone, "tao", "cancel", job_id)
    assert (result["was"], result["canceled"], result["state"]) == ("Running", True, "Canceled"), result
    ti = ui_dags.wait_for_task_instance("tao_ui_cancel", run_id, "train", ["failed"], timeout=180)
    print(f"airflow tao cancel -> task failed in {time.monotonic() - started:.1f}s")
    assert ti["try_number"] == 1  # retries=2, yet no retry: a person canceled it
    wait_until(lambda: not _alive(pid), timeout=180, message=f"job process group {pid} still runs")
    log = ui_dags.get_task_log("tao_ui_cancel", run_id, "train", 1)
    assert "ERR_CANCELED (not retriable)" in log and "canceled by cli:" in log, log[-3000:]
    (row,) = cli_json(airflow_standalone, "tao", "jobs", "--run-id", run_id)
    assert (row["state"], row["err_class"], row["task_state"]) == ("Canceled", "ERR_CANCELED", "failed")
    # canceling again says so and changes nothing
    (again,) = cli_json(airflow_standalone, "tao", "cancel", job_id)
    assert (again["was"], again["canceled"]) == ("Canceled", False)


def test_reap_cancels_the_job_of_a_killed_worker(airflow_standalone: AirflowStandalone, ui_dags: AirflowClient):
    """A worker killed while it waited on its job (no retries): the task fails, the job runs on with no one watching
    it -- an orphan. ``airflow tao reap`` finds it on the platform and cancels it; jobs still watched are kept."""
    watched = ui_dags.trigger_dag_run("tao_ui_cancel")  # a deferred job: its task still wants it
    ui_dags.wait_for_task_instance("tao_ui_cancel", watched, "train", ["deferred"], timeout=120)
    run_id = ui_dags.trigger_dag_run("tao_ui_orphan")
    ui_dags.wait_for_task_instance("tao_ui_orphan", run_id, "train", ["running"], timeout=120)
    job_id = wait_until(
        lambda: _xcom_or_none(ui_dags, "tao_ui_orphan", run_id, "tao_job_id"), timeout=180, message="no job id XCom"
    )
    airflow_standalone.kill_task_runner("tao_ui_orphan", run_id, "train")
    ui_dags.wait_for_task_instance("tao_ui_orphan", run_id, "train", ["failed"], timeout=120)
    (row,) = cli_json(airflow_standalone, "tao", "jobs", "--run-id", run_id)
    pid = int(row["backend_job_id"])
    assert row["task_state"] == "failed" and _alive(pid)  # the orphan
    # the platform says it runs (not "Unknown" with an end time and a frozen runtime: issue 36 point 4)
    assert (row["state"], row["state_from"], row["ended"]) == ("Running", "platform", None), row

    dry = cli_json(airflow_standalone, "tao", "reap", "--dry-run", "--min-age-minutes", "0")
    verdicts = {r["job_id"]: (r["action"], r["why"]) for r in dry}
    assert verdicts[job_id] == ("would cancel", "orphan: its task is failed"), dry
    watched_job = ui_dags.get_job_id("tao_ui_cancel", watched, "train")
    assert verdicts[watched_job] == ("kept", "its task is deferred"), dry
    assert _alive(pid)  # a dry run changes nothing

    reaped = cli_json(airflow_standalone, "tao", "reap", "--min-age-minutes", "0")
    assert {r["job_id"]: r["action"] for r in reaped}[job_id] == "canceled", reaped
    wait_until(lambda: not _alive(pid), timeout=180, message=f"orphan {pid} still runs")
    (row,) = cli_json(airflow_standalone, "tao", "jobs", "--run-id", run_id)
    assert row["state"] == "Canceled", row  # reaped: the platform's word, not "Unknown"
    assert ui_dags.get_task_instance_state("tao_ui_cancel", watched, "train") == "deferred"
    ui_dags.mark_task_instance_failed("tao_ui_cancel", watched, "train")  # (its job is canceled by the trigger)
    # a young orphan is left alone by default (its task may be writing its record right now)
    again = cli_json(airflow_standalone, "tao", "reap")
    assert job_id not in {r["job_id"] for r in again}  # canceled: no longer active on the platform


def _xcom_or_none(client: AirflowClient, dag_id: str, run_id: str, key: str) -> str | None:
    try:
        return str(client.get_xcom(dag_id, run_id, "train", key=key))
    except KeyError:
        return None


def test_bad_job_ids_are_refused_before_anything_is_looked_up(airflow_standalone: AirflowStandalone) -> None:
    for bad in ("../../etc/passwd", "abc", "0123456789abcdef" * 3, "$(touch /tmp/x)"):
        proc = airflow_cli(airflow_standalone, "tao", "logs", bad)
        assert proc.returncode == 1 and "is not a job id" in proc.stderr, proc.stderr
    proc = airflow_cli(airflow_standalone, "tao", "cancel", "abcdef012345")
    assert proc.returncode == 1 and "no job abcdef012345" in proc.stderr, proc.stderr


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_reap_deletes_an_expired_brev_lease_and_keeps_a_running_tasks_and_a_hand_made_instance(
    airflow_standalone: AirflowStandalone, ui_dags: AirflowClient, ui_brev_world: BrevWorld
):
    """Brev's cost guard in ``airflow tao reap``, on the fake Brev world: an instance whose lease expired and whose
    task is gone is deleted; one whose lease expired under a task that still waits has its job canceled (the task
    fails with ERR_CANCELED, no retry, and deletes it); a running task's instance and one made by hand are kept. An
    instance that failed (no exec, so no lease to read) is deleted once its task is finished, by the task records."""
    ui_brev_world.create_instance("made-by-hand")
    dags = {"orphan": "tao_ui_brev_lease", "expired": "tao_ui_brev_lease", "running": "tao_ui_brev"}
    dags["broken"] = "tao_ui_brev_lease"
    runs = {name: ui_dags.trigger_dag_run(dag) for name, dag in dags.items()}
    for name, run_id in runs.items():
        ui_dags.wait_for_task_instance(dags[name], run_id, "train", ["deferred"], timeout=180)
    rows = {name: cli_json(airflow_standalone, "tao", "jobs", "--run-id", run_id)[0] for name, run_id in runs.items()}
    instances = {name: row["backend_job_id"] for name, row in rows.items()}
    assert all(ui_brev_world.instance(i)["status"] == "RUNNING" for i in instances.values())
    for name in ("orphan", "broken"):  # cancel_on_kill=False: their jobs run on
        ui_dags.mark_task_instance_failed("tao_ui_brev_lease", runs[name], "train")
        ui_dags.wait_for_task_instance("tao_ui_brev_lease", runs[name], "train", ["failed"], timeout=180)
    ui_brev_world.set_status(instances["broken"], "FAILURE", "host lost")  # its lease is on it: unreadable now
    for name in ("orphan", "expired"):  # 10.8 s leases
        lease = json.loads((ui_brev_world.home_of(instances[name]) / ".tao-brev" / "lease.json").read_text())
        expires = float(lease["expires_at"])
        wait_until(lambda e=expires: time.time() > e + 1, timeout=180, message="the lease did not expire")

    def verdicts(rows: list[dict[str, Any]]) -> tuple[dict[str, tuple[str, str]], dict[str, tuple[str, str]]]:
        brev = [r for r in rows if r["platform"] == "brev"]
        machines = {r["name"]: (r["action"], r["why"]) for r in brev if r["job_id"] is None}
        return machines, {r["job_id"]: (r["action"], r["why"]) for r in brev if r["job_id"]}

    def dry_run() -> tuple[dict[str, tuple[str, str]], dict[str, tuple[str, str]]] | None:
        found = verdicts(cli_json(airflow_standalone, "tao", "reap", "--dry-run", "--min-age-minutes", "0"))
        # an instance whose exec did not answer in time lists no job this sweep (the next one does)
        return found if all(rows[name]["job_id"] in found[1] for name in dags if name != "broken") else None

    machines, jobs = wait_until(dry_run, timeout=180, interval=2, message="a dry run never listed the three jobs")
    assert machines[instances["orphan"]][0] == "would delete" and "lease expired" in machines[instances["orphan"]][1]
    assert machines[instances["expired"]][0] == "would cancel jobs", machines
    assert machines[instances["running"]][0] == "kept" and "is deferred" in machines[instances["running"]][1]
    assert machines["made-by-hand"] == ("kept", "not created by this provider (no lease of its own)")
    owner = f"tao_ui_brev_lease.train run {runs['broken']}"
    assert machines[instances["broken"]] == ("would delete", f"it is FAILURE and its task {owner} is failed (by this "
                                             "Airflow's record)"), machines  # fmt: skip
    # the job sweep's own lease never overrides its ownership rules (issue 22 hole 4); the machine's lease (Brev's
    # cost guard, on the instance itself) still deletes the instance, and the job with it: its row says so
    action, why = jobs[rows["orphan"]["job_id"]]
    assert action == "would cancel" and why.startswith(f"its machine {instances['orphan']}: "), jobs
    assert jobs[rows["running"]["job_id"]] == ("kept", "its task is deferred"), jobs
    assert all(ui_brev_world.instance(i)["status"] in ("RUNNING", "FAILURE") for i in instances.values())  # a dry run

    answer, reap = cli_json_run(airflow_standalone, "tao", "reap", "--min-age-minutes", "0")
    machines, jobs = verdicts(answer)
    assert machines[instances["orphan"]][0] == "deleted" and machines[instances["broken"]][0] == "deleted", machines
    assert machines[instances["expired"]][0] == "jobs canceled", machines
    assert machines[instances["running"]][0] == "kept" and machines["made-by-hand"][0] == "kept", machines
    # the job sweep keeps a live task's job (hole 4); the machine's lease cancels it ("jobs canceled" above, and the
    # job's row says so), which the task reads as a cancel by reap below
    for name in ("orphan", "expired"):
        if rows[name]["job_id"] not in jobs:  # its instance did not answer this pass's listing in time (a busy
            # machine: the probe's 30 s): no row for its job, and the pass says why; the machine's row above holds
            assert f"Instance {instances[name]} did not answer: its jobs are not listed" in reap.stdout + reap.stderr
            continue
        action, why = jobs[rows[name]["job_id"]]
        assert action == "canceled" and why.startswith(f"its machine {instances[name]}: "), jobs
    assert jobs[rows["running"]["job_id"]] == ("kept", "its task is deferred"), jobs
    ti = ui_dags.wait_for_task_instance("tao_ui_brev_lease", runs["expired"], "train", ["failed"], timeout=180)
    assert ti["try_number"] == 1  # retries=2, yet no retry: the reaper canceled it
    log = ui_dags.get_task_log("tao_ui_brev_lease", runs["expired"], "train", 1)
    assert "ERR_CANCELED (not retriable)" in log and "canceled by reap: lease expired" in log, log[-3000:]
    for name in ("orphan", "broken", "expired"):  # the reaper deleted two, the task that saw the cancel the other
        wait_until(lambda n=name: _gone(ui_brev_world, instances[n]), timeout=180, message=f"{name} instance stays")
    assert ui_brev_world.instance(instances["running"])["status"] == "RUNNING"
    assert ui_brev_world.instance("made-by-hand")["status"] == "RUNNING"

    # a person cancels the running one: its task fails with ERR_CANCELED and deletes its instance
    (result,) = cli_json(airflow_standalone, "tao", "cancel", rows["running"]["job_id"])
    assert (result["was"], result["canceled"], result["state"]) == ("Running", True, "Canceled"), result
    ui_dags.wait_for_task_instance("tao_ui_brev", runs["running"], "train", ["failed"], timeout=180)
    log = ui_dags.get_task_log("tao_ui_brev", runs["running"], "train", 1)
    assert "ERR_CANCELED (not retriable)" in log and "canceled by cli:" in log, log[-3000:]
    wait_until(lambda: _gone(ui_brev_world, instances["running"]), timeout=180, message="the instance stays")


def _gone(world: BrevWorld, instance: str) -> bool:
    return all(i["name"] != instance or i["status"] == "DELETING" for i in world.instances())
