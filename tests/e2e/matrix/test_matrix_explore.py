"""The crash-point explorer's second level: a sampled set of its schedules (boundary x interruption) through the
matrix's real ``airflow standalone`` -- the real scheduler, task runner and API -- on all six platforms at once.

One clean run of ``mx_explore`` (a task per platform, ``dags/tao_matrix.py``'s ``Explored``) lists each platform's
boundaries as the in-process explorer names them (``<phase>:<call>#n``, :mod:`tests.explorer.recorder`, installed in
the task runner's process). With a fixed seed (:data:`SEED`, or ``TAO_EXPLORE_SEED``) one schedule per platform is
drawn: an interruption of :data:`INTERRUPTIONS`, then a boundary of the worker's phases it is applied at (pruned as
the in-process level prunes, :func:`tests.explorer.simulate.explored`). One run of the DAG puts the six schedules:
each task's try 1 blocks at its boundary, and the interruption is applied through Airflow itself -- SIGKILL of the
task runner (then Airflow's retry), a clear or a mark through the REST API (the supervisor stops the try; on_kill),
``airflow tao cancel`` on its recorded job (then the try goes on). The invariants are counted on the backends (the
matrix's census): I1 never two live jobs of the task instance; I2 no job of it still runs once it ended; I3 a
person's cancel of a running job ends the task failed with ERR_CANCELED and no job after it.

A failing schedule prints a line that reruns it alone: ``TAO_EXPLORE_SCHEDULES='{"slurm": ["execute:create_job#1",
"worker_kill"]}' python -m pytest tests/e2e/matrix/test_matrix_explore.py``. The triggerer's phase is the in-process
level's only (no trigger of this DAG is instrumented).
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

from tests.e2e.airflow_harness import wait_until
from tests.e2e.matrix.conftest import PLATFORMS, Matrix, record_result
from tests.e2e.ui.conftest import airflow_cli
from tests.explorer.simulate import EQUIVALENT, WORKER_PHASES, explored

DAG_ID = "mx_explore"
SEED = 22
#: What Airflow or a person can do to a try blocked in the worker (the triggerer's phase is the in-process level's).
INTERRUPTIONS = ("worker_kill", "clear", "mark_failed", "mark_success", "cli_cancel")
#: The task's end for each interruption (``cli_cancel``: failed when a job was canceled, else success).
ENDS = {"worker_kill": "success", "clear": "success", "mark_failed": "failed", "mark_success": "success"}


def _mark(matrix: Matrix, run_id: str, platform: str, kind: str) -> Path:
    """The file ``Explored`` (``dags/tao_matrix.py``) writes (``boundaries``, ``hit``) or reads (``release``)."""
    return matrix.marks / f"explore.{run_id.replace('/', '_')}.{platform}.{kind}"


def _sample(boundaries: dict[str, list[str]]) -> dict[str, tuple[str, str]]:
    """platform -> (boundary, interruption): ``TAO_EXPLORE_SCHEDULES`` (a reproducer) or the seed's draw."""
    if forced := os.environ.get("TAO_EXPLORE_SCHEDULES"):
        return {p: (b, i) for p, (b, i) in json.loads(forced).items()}
    rng = random.Random(int(os.environ.get("TAO_EXPLORE_SEED", SEED)))
    kinds = [*INTERRUPTIONS, rng.choice(INTERRUPTIONS)]  # every interruption in every round, on a drawn platform
    rng.shuffle(kinds)
    chosen = {}
    for platform, interruption in zip(PLATFORMS, kinds, strict=True):
        # an interruption the in-process level prunes as another's equivalent (mark_success: mark_failed) is put,
        # here, where that other one is explored: the real standalone checks the equivalence it rests on
        pruned_as = EQUIVALENT.get(interruption, interruption)
        where = [b for b in explored(boundaries[platform], pruned_as) if b.split(":", 1)[0] in WORKER_PHASES]
        chosen[platform] = (rng.choice(where), interruption)
    return chosen


def _interrupt(matrix: Matrix, run_id: str, platform: str, interruption: str) -> bool:
    """Apply ``interruption`` to the try blocked at its boundary; True when a person canceled a running job."""
    client = matrix.client
    if interruption == "worker_kill":
        matrix.standalone.kill_task_runner(DAG_ID, run_id, platform)
    elif interruption == "clear":
        client.clear_task_instances(DAG_ID, run_id, [platform])
    elif interruption == "mark_failed":
        client.mark_task_instance_failed(DAG_ID, run_id, platform)
    elif interruption == "mark_success":
        client.mark_task_instance_success(DAG_ID, run_id, platform)
    else:  # cli_cancel: the job Airflow has recorded for the task, if any yet (as a person finds it); the try goes on
        canceled = False
        listed = airflow_cli(matrix.standalone, "tao", "jobs", "-d", DAG_ID, "-r", run_id, "-o", "json")
        assert listed.returncode == 0, f"airflow tao jobs:\n{listed.stdout}\n{listed.stderr}"
        rows = json.loads(listed.stdout.strip().splitlines()[-1])
        job_id = next((row["job_id"] for row in rows if row["task_id"] == platform), None)  # newest first
        if job_id:
            proc = airflow_cli(matrix.standalone, "tao", "cancel", str(job_id), "-o", "json")
            assert proc.returncode == 0, f"airflow tao cancel {job_id}:\n{proc.stdout}\n{proc.stderr}"
            row = json.loads(proc.stdout.strip().splitlines()[-1])[0]
            canceled = bool(row["canceled"])
        _mark(matrix, run_id, platform, "release").touch()
        return canceled
    return False


def _ended(matrix: Matrix, run_id: str, platform: str) -> Any:
    seen = matrix.jobs(platform, DAG_ID, run_id, platform)
    return None if seen.active_now else seen


def test_sampled_schedules_hold_the_invariants_through_a_real_standalone(matrix: Matrix) -> None:
    clean = matrix.trigger(DAG_ID, seconds=6)
    matrix.wait_states(DAG_ID, clean, ["success"], PLATFORMS, timeout=240)
    boundaries = {p: _mark(matrix, clean, p, "boundaries").read_text().split() for p in PLATFORMS}
    schedules = _sample(boundaries)
    print(f"boundaries of the clean run: { {p: len(b) for p, b in boundaries.items()} }; sampled: {schedules}")

    run_id = matrix.trigger(DAG_ID, seconds=12, boundaries={p: b for p, (b, _) in schedules.items()})
    pending, canceled, jobs_at_cancel = dict(schedules), {}, {}
    started = time.monotonic()
    while pending:
        assert time.monotonic() - started < 240, f"never reached: {pending}\n{matrix.states(DAG_ID, run_id)}"
        for platform, (boundary, interruption) in list(pending.items()):
            hit = _mark(matrix, run_id, platform, "hit")
            if hit.exists():
                assert hit.read_text() == boundary, (platform, hit.read_text(), boundary)
                canceled[platform] = _interrupt(matrix, run_id, platform, interruption)
                jobs_at_cancel[platform] = matrix.jobs(platform, DAG_ID, run_id, platform).count
                del pending[platform]
        time.sleep(0.5)

    failed = []
    for platform, (boundary, interruption) in schedules.items():
        end = "failed" if canceled[platform] else ENDS.get(interruption, "success")
        matrix.wait_states(DAG_ID, run_id, [end], [platform], timeout=300)
        seen = wait_until(
            lambda p=platform: _ended(matrix, run_id, p), timeout=60, interval=1.0,
            message=f"{platform}: a job of the ended task still runs (I2)",
        )  # fmt: skip
        problems = []
        if seen.most_active > 1:
            problems.append(f"I1: {seen.most_active} jobs ran at once")
        if canceled[platform]:
            log = matrix.log(DAG_ID, run_id, platform, int(matrix.client.get_task_instance(
                DAG_ID, run_id, platform)["try_number"]))  # fmt: skip
            if "ERR_CANCELED" not in log:
                problems.append("I3: the canceled task did not fail with ERR_CANCELED")
            if seen.count > jobs_at_cancel[platform]:
                problems.append(f"I3: {seen.count - jobs_at_cancel[platform]} job(s) submitted after the cancel")
        detail = f"{interruption} at {boundary}: {end}, {seen.count} job(s)"
        case = f"explorer sample (seed {os.environ.get('TAO_EXPLORE_SEED', SEED)})"
        record_result(case, platform, not problems, detail)
        if problems:
            failed.append(
                f"{platform} {boundary} {interruption}: {'; '.join(problems)}\n  rerun: TAO_EXPLORE_SCHEDULES="
                f"'{json.dumps({platform: [boundary, interruption]})}' python -m pytest -p no:cacheprovider "
                "tests/e2e/matrix/test_matrix_explore.py"
            )
    print(f"explorer sample through the standalone: {len(schedules)} schedules, {len(failed)} violating")
    assert not failed, "\n".join(failed)
