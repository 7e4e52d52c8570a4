"""``TAOAutoMLOperator`` on ``local``: real trial processes, the real trigger on a triggerer loop, Optuna for real.

The trainer's loss depends on its parameters and falls with its epochs, so a bad trial is behind at every rung and
ASHA stops it; each epoch waits for a file the test writes (no sleeps: the test decides when an epoch passes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_tao.automl.trials import STATE_KEY
from airflow_provider_tao.hooks.local.hook import LocalHook
from airflow_provider_tao.jobs import JobHandle, JobState
from airflow_provider_tao.operators.automl import TAOAutoMLOperator
from tests.integration.automl.search_run import follow_search
from tests.integration.taskrun import Triggerer, _deferred, start

EPOCHS = 6
OPEN = 1000
TRAINER = """
import json, math, os, sys, time
spec = json.load(open(sys.argv[1]))
lr, depth = spec["train"]["lr"], spec["model"]["depth"]
gate = os.path.join(sys.argv[2], "epochs")
OPEN = {open_gate}  # the gate at this value lets every epoch pass
def passed():
    return int(open(gate).read() or 0) if os.path.exists(gate) else 0
start = passed()
open(os.path.join(sys.argv[2], "started." + os.environ["TAO_JOB_ID"]), "w").close()  # its gate is read
for epoch in range(1, {epochs} + 1):
    while passed() < min(start + epoch, OPEN):  # the test lets each epoch pass, one per decision, for every trial
        time.sleep(0.05)
    loss = (math.log10(lr) + 2.5) ** 2 + 0.2 * abs(depth - 3) + 1.0 / epoch
    if int(os.environ["TAO_TRIAL_NUMBER"]) % 2:  # odd trials report as TAO does: status.json, followed by the runner
        status = os.path.join(os.environ["TAO_RESULTS_DIR"], "train", "status.json")
        os.makedirs(os.path.dirname(status), exist_ok=True)
        with open(status, "a") as fh:
            fh.write(json.dumps({{"epoch": epoch, "max_epoch": {epochs}, "kpi": {{"val_loss": loss}}}}) + "\\n")
    else:
        print(f"Epoch {{epoch}}/{epochs} - loss: {{loss + 0.1:.4f}} - val_loss: {{loss:.4f}}", flush=True)
results = os.path.join(os.environ["TAO_RESULTS_ROOT"], os.environ["TAO_JOB_ID"])
os.makedirs(results, exist_ok=True)
json.dump({{"val_loss": loss}}, open(os.path.join(results, "metrics.json"), "w"))
"""


@pytest.fixture
def local_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AIRFLOW__TAO__LOCAL_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("AIRFLOW__TAO__LOCAL_RESULTS_ROOT", str(tmp_path / "results"))
    (tmp_path / "trainer.py").write_text(TRAINER.format(epochs=EPOCHS, open_gate=OPEN))
    return tmp_path


def let_epochs_pass(where: Path, epochs: int) -> None:
    """Let every trial run up to ``epochs`` more epochs than the gate's value when it started -- once every trial
    job submitted so far has read the gate (a trainer starting late would otherwise start one epoch behind)."""
    jobs = lambda: {d.name for d in launched(where)}  # noqa: E731
    started = lambda: {p.name.split(".", 1)[1] for p in where.glob("started.*")}  # noqa: E731
    wait_for(lambda: jobs() <= started(), "every trial's trainer reading its gate")
    (where / "epochs").write_text(str(epochs))


def launched(where: Path) -> list[Path]:
    """The local jobs submitted: a folder with its ``meta.json`` (a worker killed early inside ``create_job`` leaves
    one without it, which nothing runs or finds)."""
    return [d for d in (where / "jobs").iterdir() if not d.name.startswith("_") and (d / "meta.json").exists()]


def search(where: Path, **kwargs: Any) -> TAOAutoMLOperator:
    defaults: dict[str, Any] = {
        "task_id": "tune", "platform": "local", "gpu_count": 0, "deferrable": True, "poll_interval": 0.5,
        "command": f"{sys.executable} {where / 'trainer.py'} {{config_path}} {where}", "config_format": "json",
        "specs": {"train": {"lr": 0.01}, "model": {"depth": 2}},
        "search_space": {
            "train.lr": {"type": "float", "low": 1e-5, "high": 1e-1, "log": True},
            "model.depth": {"type": "int", "low": 1, "high": 6},
        },
        "metric": "val_loss", "direction": "minimize", "seed": 4, "algorithm": "tpe", "pruner": "asha",
        "max_trials": 6, "max_concurrent_trials": 3, "env": {"TAO_STATUS_INTERVAL": "0.1"},
    }  # fmt: skip
    return TAOAutoMLOperator(**{**defaults, **kwargs})


def test_parallel_trials_pruned_early_and_the_best_published(local_dirs: Path, triggerer: Triggerer) -> None:
    op = search(local_dirs)
    run = start(triggerer, op, run_id="manual__automl_local")
    hook = LocalHook()
    first = [JobHandle.from_json(t["handle"]) for t in run.trigger.trials]
    assert len(first) == 3
    # three trial processes alive at once on the host (each waits at its first epoch's gate until let through)
    wait_for(
        lambda: {s.state for s in hook.get_job_statuses(first).values()} == {JobState.RUNNING},
        "three trials running at once",
    )
    epochs = iter(range(1, 1000))
    result = follow_search(run, lambda: search(local_dirs), lambda: let_epochs_pass(local_dirs, next(epochs)))
    rows = {r["trial"]: r for r in result["trials"]}
    assert len(rows) == 6 and {r["state"] for r in rows.values()} <= {"complete", "pruned"}
    pruned = [r for r in rows.values() if r["state"] == "pruned"]
    assert pruned, rows  # ASHA stopped some
    for row in pruned:  # its process is gone before its last epoch
        handle = JobHandle.from_json(run.store.data[STATE_KEY]["trials"][row["trial"]]["handle"])
        assert hook.get_job_status(handle).state is JobState.CANCELED
        assert row["last_step"] < EPOCHS
    best = result["best"]
    complete = [r for r in rows.values() if r["state"] == "complete"]
    assert best["value"] == min(r["value"] for r in complete)
    metrics = json.loads(Path(best["results_dir"], "metrics.json").read_text())
    assert metrics["val_loss"] == pytest.approx(best["value"])  # the metrics.json of the best trial's own job


WORKER = """
import json, sys
from pathlib import Path
from tests.integration.taskrun import FileStore
from tests.integration.automl.test_automl_local import search
from tests.unit.fakes import make_context
op = search(Path(sys.argv[1]), deferrable=False)
op.execute(make_context(FileStore(Path(sys.argv[2])), 1, "manual__automl_kill"))
"""


def wait_for(predicate: Any, what: str, timeout: float = 240) -> None:
    """Until ``predicate()`` holds: an event waited for, bounded generously (trainers start slowly on a loaded
    machine), never a duration asserted."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def test_a_worker_killed_mid_search_is_continued_by_the_retry_with_no_trial_lost_or_doubled(
    local_dirs: Path, triggerer: Triggerer
) -> None:
    import signal
    import subprocess

    from tests.integration.taskrun import FileStore

    store = FileStore(local_dirs / "store.json")
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(local_dirs), str(store.path)])

    def running() -> list[dict[str, Any]]:
        trials = (store.get(STATE_KEY) or {}).get("trials", [])
        return [t for t in trials if t["state"] == "running"]

    try:
        wait_for(lambda: len(running()) == 3, "three trials running on the killed worker")
        let_epochs_pass(local_dirs, 1)
        wait_for(lambda: any(t["intermediate"] for t in running()), "a reported step recorded by the worker")
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    before = {t["number"]: t["job_id"] for t in running()}
    op = search(local_dirs)
    run = start(triggerer, op, store=store, try_number=2, run_id="manual__automl_kill")
    adopted = {t["number"]: JobHandle.from_json(t["handle"]).job_id for t in run.trigger.trials}
    assert {n: adopted[n] for n in before} == before  # the trials in flight were adopted, not run again
    (local_dirs / "epochs").write_text(str(OPEN))  # every epoch of every trial, whenever its trainer starts
    result = follow_search(run, lambda: search(local_dirs))
    rows = result["trials"]
    assert [r["trial"] for r in rows] == list(range(6))
    # the jobs that ran (their supervisor started): one per trial, none twice. A job the killed worker was still
    # creating never started; its trial was adopted by name and, the job never starting, run again.
    jobs = [d for d in launched(local_dirs) if (d / "pid").exists()]
    assert sorted(d.name for d in jobs) == sorted(r["job_id"] for r in rows)
    assert all(r["state"] in ("complete", "pruned") for r in rows)


def test_a_triggerer_restart_loses_no_report_and_no_trial(local_dirs: Path, triggerer: Triggerer) -> None:
    """The first trigger dies (its run cancelled, no on_kill: a triggerer killed) after the trials reported; a new
    trigger from the same kwargs reads their logs again from the last decision's cursors."""
    import importlib

    from tests.integration.taskrun import first_event

    op = search(local_dirs, pruner=None, max_trials=3)
    run = start(triggerer, op, run_id="manual__automl_restart")
    let_epochs_pass(local_dirs, 2)
    hook = LocalHook()
    handles = [JobHandle.from_json(t["handle"]) for t in run.trigger.trials]
    epoch_2 = ("Epoch 2/", 'TAO_STATUS {"epoch": 2,')  # printed, or TAO's status.json line the runner printed
    wait_for(
        lambda: all(any(form in hook.get_job_logs(h)[0] for form in epoch_2) for h in handles),
        "two epochs in every trial's log",
    )
    run.future.cancel()  # the triggerer dies; the trials run on
    classpath, kwargs = run.deferred.trigger.serialize()
    module, _, name = classpath.rpartition(".")
    let_epochs_pass(local_dirs, OPEN)
    event = triggerer.call(first_event(getattr(importlib.import_module(module), name)(**kwargs)), timeout=120)
    result, context = None, run.context
    while result is None:
        try:
            result = search(local_dirs, pruner=None, max_trials=3).execute_complete(context, event)
        except TaskDeferred as deferred:
            event = _deferred(triggerer, op, context, run.store, deferred).future.result(120)
    rows = result["trials"]
    assert [r["state"] for r in rows] == ["complete"] * 3
    trials = run.store.data[STATE_KEY]["trials"]
    assert all(sorted(map(int, t["intermediate"])) == list(range(1, EPOCHS + 1)) for t in trials)  # every step
    jobs = launched(local_dirs)
    assert len(jobs) == 3


def test_the_gpu_hour_budget_over_all_trials_stops_the_running_ones_and_starts_no_more(
    local_dirs: Path, triggerer: Triggerer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``max_gpu_hours`` from the platform's own times: three trials of one GPU each pass three GPU-seconds together
    while they wait at their first epoch; the trigger wakes at the budget, every running trial is stopped and
    recorded ``budget``, and no fourth one starts."""
    from airflow.sdk.exceptions import AirflowFailException

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")  # the local platform hands each trial one (a label here)
    budget = 3 / 3600
    run = start(triggerer, search(local_dirs, gpu_count=1, max_gpu_hours=budget), run_id="manual__automl_budget")
    with pytest.raises(AirflowFailException, match=r"without a completed trial \(max_gpu_hours"):
        follow_search(run, lambda: search(local_dirs, gpu_count=1, max_gpu_hours=budget))
    trials = run.store.data[STATE_KEY]["trials"]
    assert [t["state"] for t in trials] == ["budget"] * 3  # stopped when it passed; none started after it
    assert sum(t["gpu_hours"] for t in trials) >= budget
    hook = LocalHook()
    assert {hook.get_job_status(JobHandle.from_json(t["handle"])).state for t in trials} == {JobState.CANCELED}
