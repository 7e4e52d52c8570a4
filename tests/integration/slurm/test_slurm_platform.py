"""The SLURM platform on a REAL cluster (slurmctld + 2 slurmd + slurmdbd behind a real sshd), through
``TAOSubmitOperator.execute`` -> the real ``TAOJobTrigger.run()`` on a triggerer loop -> ``execute_complete``.

Nothing is mocked between the operator and Slurm: the hook stages and submits over SSH as the unprivileged user,
the trigger polls through the batched poller and the cached asyncssh connection.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
import uuid
from datetime import timedelta
from functools import partial
from pathlib import PurePosixPath
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowTaskTimeout, TaskDeferred

from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.hooks.ownership import CancelOutcome
from airflow_provider_tao.hooks.slurm import SlurmHook
from airflow_provider_tao.hooks.slurm import ssh as slurm_ssh
from airflow_provider_tao.jobs import JobHandle, JobSpec, JobState
from tests.integration.slurm.conftest import accepted_logins
from tests.integration.taskrun import event_of, finish, kill, make_operator, start
from tests.unit.test_results_reading import assert_refused

pytestmark = pytest.mark.integration


@pytest.fixture
def hook(slurm_conn: str) -> SlurmHook:
    return SlurmHook(conn_id=slurm_conn)


def _cat(cluster: Any, path: str | PurePosixPath) -> str:
    return cluster.ssh(f"cat {shlex.quote(str(path))}").stdout


def _exists(cluster: Any, path: str | PurePosixPath) -> bool:
    return cluster.ssh(f"test -e {shlex.quote(str(path))}", check=False).returncode == 0


def _wait_state(hook: SlurmHook, handle: JobHandle | dict[str, Any], state: JobState, timeout: float = 60) -> Any:
    handle = handle if isinstance(handle, JobHandle) else JobHandle.from_json(handle)
    deadline = time.monotonic() + timeout
    while True:
        status = hook.get_job_status(handle)
        if status.state is state:
            return status
        assert time.monotonic() < deadline, f"job {handle.job_id} never {state}: last {status}"
        time.sleep(0.5)


def _runs(cluster: Any, slurm_id: str) -> list[str]:
    """Every run of a Slurm job (sacct -D keeps requeued runs): ["REQUEUED 1:0", "COMPLETED 0:0"]."""
    out = cluster.ssh(f"sacct -X -D -n -P -j {slurm_id} -o State,ExitCode").stdout
    return [line.replace("|", " ") for line in out.splitlines() if line]


def _py(cluster: Any) -> str:
    return str(cluster.oci_bundle_py)


# --------------------------------------------------------------------------- TIMEOUT runs in the background first


@pytest.fixture(scope="module")
def timeout_run(slurm_cluster: Any, triggerer: Any) -> Any:
    """Started before the other tests (it needs ~65 s of wall time on the 1-minute partition)."""
    op = make_operator(
        image=_py(slurm_cluster),
        command="echo started; sleep 300",
        backend_details={"partition": slurm_cluster.partition_short, "time_minutes": 1, "nodelist": "c1"},
    )
    return start(triggerer, op)


def test_timeout_job_starts(timeout_run: Any) -> None:
    assert timeout_run.backend_job_id  # collected at the end of the module (test_timeout_on_the_short_partition)


# --------------------------------------------------------------------------- the basic outcomes


def test_completed_job_results_land_in_the_results_folder(slurm_cluster: Any, triggerer: Any, capfd: Any) -> None:
    op = make_operator(
        image=_py(slurm_cluster),
        command='echo "model of $TAO_JOB_ID" > "$TAO_RESULTS_ROOT/$TAO_JOB_ID/model.txt"; echo epoch-1; echo epoch-2',
    )
    run = start(triggerer, op)
    result = finish(run)

    assert result["state"] == "Complete" and result["platform"] == "slurm"
    assert result["job_id"] == run.job_id and result["backend_job_id"] == run.backend_job_id
    assert result["results_dir"] == f"{slurm_cluster.results_root}/results/{run.job_id}"
    # inside the job TAO_JOB_ID is the XCom job_id, and TAO_RESULTS_ROOT/<job_id> is the results folder
    assert _cat(slurm_cluster, f"{result['results_dir']}/model.txt") == f"model of {run.job_id}\n"
    assert slurm_cluster.wait_terminal(run.backend_job_id).exit_code == "0:0"
    logged = capfd.readouterr()
    assert "[job] epoch-1" in logged.out + logged.err and "[job] epoch-2" in logged.out + logged.err
    # the job's env file (where its secrets live) is gone once the job has ended for good
    env_file = f"{slurm_cluster.results_root}/jobs/{run.job_id}/env/{run.job_id}.env"
    assert not _exists(slurm_cluster, env_file)
    assert _exists(slurm_cluster, f"{slurm_cluster.results_root}/jobs/{run.job_id}/marks/consumed_by")


def test_failed_job_reports_its_exit_code_and_a_program_error(slurm_cluster: Any, triggerer: Any) -> None:
    command = (
        "python3 -c \"import sys; print('Traceback (most recent call last):', file=sys.stderr); "
        "print('ValueError: learning rate must be positive', file=sys.stderr); sys.exit(3)\""
    )
    run = start(triggerer, make_operator(image=_py(slurm_cluster), command=command))
    with pytest.raises(AirflowFailException, match="ERR_PROGRAM") as failure:
        finish(run)
    assert "exit code 3" in str(failure.value) or "exited with code 3" in str(failure.value)
    event = event_of(run)
    assert (event["status"], event["job_status"]["exit_code"], event["job_status"]["raw_state"]) == (
        "error",
        3,
        "FAILED",
    )
    assert slurm_cluster.wait_terminal(run.backend_job_id).exit_code == "3:0"


@pytest.mark.parametrize("inner_exit", [3, 124])
def test_trap_a_failing_command_never_ends_complete_whatever_the_wrapper(
    slurm_cluster: Any, triggerer: Any, hook: SlurmHook, inner_exit: int
) -> None:
    # time_hours=1 puts the command under the inner `timeout` wrapper; the old SDK's requeue-on-124 check made
    # every such job COMPLETED. Here the job's status is the command's, even for the wrapper's own code 124.
    run = start(triggerer, make_operator(image=_py(slurm_cluster), command=f"echo x; exit {inner_exit}"))
    script = _cat(slurm_cluster, hook.layout(run.job_id, run.trigger.handle.name).sbatch_file)
    assert "timeout --signal=TERM" in script and "scontrol requeue" not in script
    with pytest.raises(AirflowFailException):
        finish(run)
    assert slurm_cluster.wait_terminal(run.backend_job_id).state == "FAILED"
    assert event_of(run)["job_status"]["exit_code"] == inner_exit


def test_cancel_by_marking_the_task_failed_and_by_worker_kill(
    slurm_cluster: Any, triggerer: Any, hook: SlurmHook
) -> None:
    deferred = start(triggerer, make_operator(image=_py(slurm_cluster), command="sleep 300"))
    on_worker = start(triggerer, make_operator(image=_py(slurm_cluster), command="sleep 300"))
    _wait_state(hook, deferred.handle, JobState.RUNNING)

    kill(deferred)  # marked failed while deferred: trigger on_kill -> the shared cancel routine -> scancel
    record = slurm_cluster.wait_terminal(deferred.backend_job_id, timeout=30)
    assert record.raw_state == f"CANCELLED by {slurm_cluster.uid}"
    _wait_state(hook, deferred.handle, JobState.CANCELED, timeout=30)  # squeue says COMPLETING for a moment
    assert hook.cancel_requested_by(JobHandle.from_json(deferred.handle)) == 1

    on_worker.op.on_kill()  # worker-side kill (sync wait, execution_timeout on the worker)
    assert slurm_cluster.wait_terminal(on_worker.backend_job_id, timeout=30).state == "CANCELLED"
    # Had this try really been killed it would never resume; one that does resume after a cancel of its own (a
    # spurious trigger on_kill) runs the job again instead of failing for good.
    with pytest.raises(TaskDeferred) as again:
        finish(on_worker)
    rerun = JobHandle.from_json(again.value.trigger.serialize()[1]["handle"])
    assert rerun.job_id != on_worker.job_id
    assert hook.cancel_job(rerun) is CancelOutcome.STOPPED


def test_trap_held_job_is_pending_with_its_reason_and_cancel_is_recognised(
    slurm_cluster: Any, triggerer: Any, hook: SlurmHook
) -> None:
    run = start(
        triggerer,
        make_operator(image=_py(slurm_cluster), command="true", backend_details={"partition": "held"}),
    )
    handle = JobHandle.from_json(run.handle)
    status = _wait_state(hook, handle, JobState.PENDING)
    assert status.message == "PENDING (PartitionDown)"
    time.sleep(2)
    assert not run.future.done()  # the trigger keeps waiting: Pending is not an outcome
    # trap: Slurm never creates the --output folder; it exists before the job could start
    assert _exists(slurm_cluster, hook.layout(run.job_id, handle.name).log_dir)

    assert hook.cancel_job(handle) is CancelOutcome.STOPPED  # the old SDK: 32 s and False ("CANCELLED by 1001" unknown)
    assert slurm_cluster.wait_terminal(run.backend_job_id, timeout=30).raw_state == f"CANCELLED by {slurm_cluster.uid}"
    facts = hook.failure_facts(handle)
    assert facts.canceled and facts.raw_state.startswith("CANCELLED")
    assert event_of(run)["job_status"]["state"] == "Canceled"
    with pytest.raises(TaskDeferred) as again:  # canceled by this very try, which resumes: not the user's kill
        finish(run)
    assert hook.cancel_job(JobHandle.from_json(again.value.trigger.serialize()[1]["handle"])) is CancelOutcome.STOPPED


def test_a_job_held_pending_says_why_in_the_task_log_and_in_its_timeout(
    slurm_cluster: Any, triggerer: Any, hook: SlurmHook, capfd: Any
) -> None:
    """Issue 23.5: squeue's reason reaches the task log while the job waits, and the timeout error names it."""
    op = make_operator(
        image=_py(slurm_cluster),
        command="true",
        backend_details={"partition": "held"},
        execution_timeout=timedelta(seconds=6),
    )
    run = start(triggerer, op)
    with pytest.raises(AirflowTaskTimeout, match=r"still pending after \d+ s: PENDING \(PartitionDown\)"):
        finish(run)
    logged = capfd.readouterr()
    assert f"Job {run.job_id} is pending: PENDING (PartitionDown)" in logged.out + logged.err
    assert slurm_cluster.wait_terminal(run.backend_job_id, timeout=30).raw_state.startswith("CANCELLED")


def test_trap_log_folder_exists_so_the_job_runs(slurm_cluster: Any, triggerer: Any, hook: SlurmHook) -> None:
    run = start(triggerer, make_operator(image=_py(slurm_cluster), command="echo to-out; echo to-err >&2"))
    finish(run)
    layout = hook.layout(run.job_id, run.trigger.handle.name)
    assert slurm_cluster.wait_terminal(run.backend_job_id).exit_code == "0:0"  # not FAILED 0:53 (no log folder)
    assert _cat(slurm_cluster, layout.out_file).splitlines()[1:] == ["to-out"]  # after the run marker
    assert "to-err" in _cat(slurm_cluster, layout.err_file)


def test_wall_time_above_the_partition_maximum_is_rejected_before_submission(
    slurm_cluster: Any, triggerer: Any, hook: SlurmHook
) -> None:
    op = make_operator(
        image=_py(slurm_cluster), command="true", backend_details={"partition": "short", "time_minutes": 2}
    )
    with pytest.raises(AirflowFailException, match="partition maximum"):
        start(triggerer, op)
    op = make_operator(image=_py(slurm_cluster), command="true", backend_details={"inputs": ["lustre:///no/such/x"]})
    with pytest.raises(AirflowFailException, match="not found on the cluster"):
        start(triggerer, op)
    op = make_operator(image=_py(slurm_cluster), command="true", backend_details={"inputs": ["file:///etc/hosts"]})
    with pytest.raises(AirflowFailException, match="Airflow worker"):
        start(triggerer, op)
    assert hook.check_path(f"lustre://{slurm_cluster.results_root}") is True
    assert hook.check_path("/no/such/path") is False


# --------------------------------------------------------------------------- requeue, resubmission, OOM


def test_requeued_job_is_followed_to_completion(slurm_cluster: Any, triggerer: Any, hook: SlurmHook) -> None:
    command = (
        'echo "run ${SLURM_RESTART_COUNT:-0}"; [ "${SLURM_RESTART_COUNT:-0}" != 0 ] || { sleep 300; exit 9; }; '
        "echo done"
    )
    run = start(
        triggerer,
        make_operator(
            image=_py(slurm_cluster),
            command=command,
            backend_details={"partition": slurm_cluster.partition_preempt, "nodelist": "c2"},
        ),
    )
    _wait_state(hook, run.handle, JobState.RUNNING)
    # a job in the high-priority partition that needs every CPU of c2 preempts it; --requeue puts it back
    slurm_cluster.sbatch(
        "-p", slurm_cluster.partition_urgent, "-N", "1", "-w", "c2", "--exclusive",
        "-o", "/dev/null", "--wrap", "sleep 1",
    )  # fmt: skip
    result = finish(run, timeout=180)

    # the same job, followed through
    assert result["state"] == "Complete" and result["backend_job_id"] == run.backend_job_id
    runs = _runs(slurm_cluster, run.backend_job_id)
    assert len(runs) == 2 and runs[-1] == "COMPLETED 0:0" and runs[0].split()[0] in ("PREEMPTED", "REQUEUED")
    out = _cat(slurm_cluster, hook.layout(run.job_id, run.trigger.handle.name).out_file)
    # --open-mode=append keeps both runs (and the log offsets valid), each after its run marker
    assert [line.split(" of job")[0] for line in out.splitlines()] == [
        "TAO: run 0",
        "run 0",
        "TAO: run 1",
        "run 1",
        "done",
    ]


def test_infrastructure_failure_is_resubmitted_by_the_trigger_then_succeeds(
    slurm_cluster: Any, triggerer: Any, hook: SlurmHook, capfd: Any
) -> None:
    command = (
        'if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then '
        'echo "RuntimeError: Failed to initialize NVML: Unknown Error" >&2; exit 1; fi; '
        'echo recovered > "$TAO_RESULTS_ROOT/$TAO_JOB_ID/ok"'
    )
    run = start(triggerer, make_operator(image=_py(slurm_cluster), command=command))
    result = finish(run, timeout=180)

    assert result["state"] == "Complete" and result["backend_job_id"] == run.backend_job_id
    assert _cat(slurm_cluster, f"{result['results_dir']}/ok") == "recovered\n"
    assert _runs(slurm_cluster, run.backend_job_id) == ["REQUEUED 1:0", "COMPLETED 0:0"]  # exactly one resubmission
    marks = hook.layout(run.job_id, run.trigger.handle.name).marks_dir
    assert slurm_cluster.ssh(f"ls {marks}/resubmits").stdout.split() == ["run-0"]  # the count lives on the cluster
    logged = capfd.readouterr()
    assert "requeued it (resubmission 1 of 3" in logged.out + logged.err  # visible in the task log
    # asking again about the same (already requeued) failure never requeues twice
    from airflow_provider_tao.jobs import JobStatus

    again = hook.resubmit_if_retriable(JobHandle.from_json(run.handle), JobStatus(JobState.ERROR, "FAILED"))
    assert again is None  # the last run completed: its log has no infrastructure failure
    assert len(_runs(slurm_cluster, run.backend_job_id)) == 2


def test_cuda_out_of_memory_is_a_program_error_and_never_resubmitted(
    slurm_cluster: Any, triggerer: Any, hook: SlurmHook
) -> None:
    command = 'echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB" >&2; exit 1'
    run = start(triggerer, make_operator(image=_py(slurm_cluster), command=command))
    with pytest.raises(AirflowFailException, match="ERR_OOM"):
        finish(run)
    assert _runs(slurm_cluster, run.backend_job_id) == ["FAILED 1:0"]
    marks = hook.layout(run.job_id, run.trigger.handle.name).marks_dir
    assert not _exists(slurm_cluster, f"{marks}/resubmits")


# --------------------------------------------------------------------------- multi-node, containers


def test_two_node_job_ranks_and_rendezvous(slurm_cluster: Any, triggerer: Any) -> None:
    command = (
        'echo "$NODE_RANK $MASTER_ADDR $MASTER_PORT $WORLD_SIZE $NNODES $NUM_GPU_PER_NODE $SLURMD_NODENAME" '
        '> "$TAO_RESULTS_ROOT/$TAO_JOB_ID/rank-$NODE_RANK"'
    )
    # bare metal: this emulated cluster's OCI runtime hands both tasks of a step the same SLURM_NODEID
    op = make_operator(image="unused:1", num_nodes=2, command=command, backend_details={"container_runtime": "none"})
    result = finish(start(triggerer, op))
    rows = sorted(_cat(slurm_cluster, f"{result['results_dir']}/rank-{r}").split() for r in (0, 1))
    assert [r[0] for r in rows] == ["0", "1"]
    assert {r[1] for r in rows} == {"c1"}  # one MASTER_ADDR: the first host of the allocation
    assert {tuple(r[2:6]) for r in rows} == {("29500", "2", "2", "0")}
    assert sorted(r[6] for r in rows) == ["c1", "c2"]


def test_job_runs_inside_an_oci_container(slurm_cluster: Any, triggerer: Any) -> None:
    argv = ["/bin/sh", "-c", 'grep ^NAME= /etc/os-release > "$TAO_RESULTS_ROOT/$TAO_JOB_ID/os"; hostname >> '
            '"$TAO_RESULTS_ROOT/$TAO_JOB_ID/os"']  # fmt: skip
    result = finish(start(triggerer, make_operator(image=str(slurm_cluster.oci_bundle), command=argv)))
    assert _cat(slurm_cluster, f"{result['results_dir']}/os") == 'NAME="slurm-ci-busybox"\noci-busybox\n'


# ------------------------------------------------------------- secrets (hostile strings: tests/integration/hostile)


def test_no_secret_in_the_script_in_readable_files_or_on_login_node_command_lines(
    slurm_cluster: Any, triggerer: Any, hook: SlurmHook
) -> None:
    secret = f"S3CR3T-{uuid.uuid4().hex}"
    job_id = uuid.uuid4().hex[:12]
    spec = JobSpec(
        name=f"secret-{job_id}",
        job_id=job_id,
        image=_py(slurm_cluster),
        gpu_count=0,
        command=(
            "python3 -c \"import hashlib, os; print(hashlib.sha256(os.environ['MY_TOKEN'].encode()).hexdigest())\" "
            '> "$TAO_RESULTS_ROOT/$TAO_JOB_ID/token.sha256"; sleep 4'
        ),
        secret_env={"MY_TOKEN": secret},
        env={"PLAIN": "visible"},
    )
    handle = hook.create_job(spec)
    _wait_state(hook, handle, JobState.RUNNING)
    layout = hook.layout(job_id, spec.name)
    root = slurm_cluster.results_root
    # while it runs: no process on the login node (the job's nodes are this same host) shows the secret
    assert secret not in slurm_cluster.ssh("ps -eo args").stdout
    assert secret not in _cat(slurm_cluster, layout.sbatch_file)
    assert secret not in slurm_cluster.ssh(f"scontrol write batch_script {handle.backend_job_id} -").stdout
    readable = slurm_cluster.ssh(f"find {root} -type f -perm /044 -exec grep -l {secret} {{}} +", check=False)
    assert readable.stdout == ""
    modes = slurm_cluster.ssh(f"stat -c '%a %n' {layout.env_file} {layout.job_dir} {layout.job_dir}/env").stdout
    assert [line.split()[0][-3:] for line in modes.splitlines()] == ["600", "700", "700"]  # (setgid root is fine)
    assert slurm_cluster.ssh(f"grep -rl {secret} {root}/jobs/{job_id}", check=False).stdout.strip() == layout.env_file
    _wait_state(hook, handle, JobState.COMPLETE)
    digest = _cat(slurm_cluster, f"{handle.results_dir}/token.sha256").strip()
    assert digest == hashlib.sha256(secret.encode()).hexdigest()  # the job did get it


# --------------------------------------------------------------------------- identity, cost


def test_a_retry_reattaches_instead_of_submitting_again(slurm_cluster: Any, triggerer: Any, hook: SlurmHook) -> None:
    run_id = f"manual__{uuid.uuid4().hex[:8]}"
    first = start(triggerer, make_operator(image=_py(slurm_cluster), command="sleep 300"), run_id=run_id)
    # try 2 on another worker that lost nothing (task_state_store) ...
    second = start(triggerer, make_operator(image=_py(slurm_cluster), command="sleep 300"), store=first.store,
                   try_number=2, run_id=run_id)  # fmt: skip
    # ... and try 3 whose worker died before the store write: found by its deterministic name on the cluster
    third = start(triggerer, make_operator(image=_py(slurm_cluster), command="sleep 300"), try_number=3, run_id=run_id)
    assert first.job_id == second.job_id == third.job_id and first.backend_job_id == third.backend_job_id
    names = slurm_cluster.ssh(f"squeue -h -t all -n {first.trigger.handle.name} -o %i").stdout.split()
    assert names == [first.backend_job_id]  # one Slurm job, never a duplicate
    assert hook.job_owner(JobHandle.from_json(third.handle)) == 3
    kill(first)  # try 1's cleanup must not cancel the job try 3 owns now
    time.sleep(1)
    assert hook.get_job_status(JobHandle.from_json(third.handle)).state in (JobState.PENDING, JobState.RUNNING)
    kill(third)
    assert slurm_cluster.wait_terminal(first.backend_job_id, timeout=30).state == "CANCELLED"
    second.future.cancel()


def test_reattach_adopts_no_job_the_clusters_files_were_rewritten_to_name(slurm_cluster: Any, hook: SlurmHook) -> None:
    """Issue 38.8: any job of the account can rewrite ``jobs/_names/<name>`` and ``meta/...``; a reattaching task
    adopts only a job whose recorded handle and Slurm id agree with what was submitted and with Slurm's records."""
    job_id = uuid.uuid4().hex[:12]
    spec = JobSpec(name=f"adopt-{job_id}", job_id=job_id, image=_py(slurm_cluster), gpu_count=0, command="sleep 120")
    handle = hook.create_job(spec)
    victim = slurm_cluster.sbatch("-J", f"victim-{job_id}", "-o", "/dev/null", "--wrap", "sleep 120")
    layout = hook.layout(job_id, spec.name)
    sid_file = f"{layout.job_dir}/meta/slurm_job_id"
    try:
        assert hook.find_job(spec.name) == handle  # the job as submitted is adopted
        slurm_cluster.ssh(f"echo {victim} > {sid_file}")  # another Slurm job of the account
        assert hook.find_job(spec.name) is None
        slurm_cluster.ssh(f"echo {handle.backend_job_id} > {sid_file}")
        forged = uuid.uuid4().hex[:12]  # a job folder made to look like the job's, pointing at the victim
        meta = json.dumps({**handle.to_json(), "job_id": forged, "results_dir": f"/tmp/{forged}"})
        forged_dir = f"{layout.jobs_root}/{forged}/meta"
        slurm_cluster.ssh(
            f"mkdir -p {forged_dir} && echo {victim} > {forged_dir}/slurm_job_id && "
            f"cat > {forged_dir}/{forged}.json && echo {forged} > {layout.names_index}",
            input=meta,
        )
        assert hook.find_job(spec.name) is None
        slurm_cluster.ssh(f"printf '../{job_id}' > {layout.names_index}")
        assert hook.find_job(spec.name) is None
    finally:
        hook.cancel_job(handle)
        slurm_cluster.ssh(f"scancel {victim}", check=False)


def test_results_files_are_read_on_the_cluster_without_links_fifos_or_huge_files(
    slurm_cluster: Any, hook: SlurmHook
) -> None:
    """Issue 38.5 on the cluster (``sh`` on the login node): a job's link to a file of the account, a FIFO, a huge
    file and a linked folder are refused; a regular file is read."""
    job_id = uuid.uuid4().hex[:12]
    folder = f"{slurm_cluster.results_root}/{job_id}"
    slurm_cluster.ssh(
        f"mkdir -p {folder} && cd {folder} && echo 'secret-of-the-account' > ../{job_id}.secret && "
        f"ln -s ../{job_id}.secret metrics.json && mkfifo fifo.json && ln -s .. up && "
        "head -c 1100000 /dev/zero > big.json && echo '{\"map\": 1}' > ok.json"
    )
    handle = JobHandle(platform="slurm", conn_id=hook.conn_id, job_id=job_id, name="n", results_dir=folder)
    try:
        assert_refused(partial(hook.read_result_file, handle), link="metrics.json", linked_folder="up/ok.json")
        assert hook.read_result_file(handle, "ok.json") == b'{"map": 1}\n'
        assert hook.read_result_file(handle, "missing.json") is None
    finally:
        slurm_cluster.ssh(f"rm -rf {folder} {folder}.secret", check=False)


def test_one_submission_is_one_ssh_connection(slurm_cluster: Any, triggerer: Any) -> None:
    before_logins, before = accepted_logins(slurm_cluster), dict(slurm_ssh.STATS)
    started = time.monotonic()
    run = start(triggerer, make_operator(image=_py(slurm_cluster), command="true"))
    wall = time.monotonic() - started
    time.sleep(0.5)  # let sshd flush its log line
    commands = slurm_ssh.STATS["sync_commands"] - before["sync_commands"]
    print(f"\nsubmission: {accepted_logins(slurm_cluster) - before_logins} SSH connection(s), {commands} commands, "
          f"{wall:.3f} s through TAOSubmitOperator.execute (old SDK: 13 connections, 2.9 s)")  # fmt: skip
    assert slurm_ssh.STATS["sync_connects"] - before["sync_connects"] == 1
    # counted by the real sshd; the triggerer's own connection (opened when its first watcher arrives) aside
    triggerer_logins = slurm_ssh.STATS["async_connects"] - before["async_connects"]
    assert accepted_logins(slurm_cluster) - before_logins - triggerer_logins == 1
    assert commands <= 3  # preflight, find-by-name, stage + sbatch
    finish(run)


# --------------------------------------------------------------------------- the background TIMEOUT job


def test_timeout_on_the_short_partition(timeout_run: Any, slurm_cluster: Any) -> None:
    with pytest.raises(AirflowFailException, match="ERR_TIMEOUT"):
        finish(timeout_run, timeout=180)
    assert event_of(timeout_run)["job_status"]["raw_state"] == "TIMEOUT"
    assert slurm_cluster.wait_terminal(timeout_run.backend_job_id).state == "TIMEOUT"


# --------------------------------------------------------------------------- outage: sshd 60 s, slurmctld restart


@pytest.mark.stops_shared_backend  # the cluster every lane uses: run alone (tests/lanes.py)
def test_sshd_outage_and_slurmctld_restart_neither_fail_nor_duplicate_jobs(
    slurm_cluster: Any, triggerer: Any, hook: SlurmHook
) -> None:
    runs = [
        start(triggerer, make_operator(image=_py(slurm_cluster), command="sleep 40; echo survived")) for _ in range(2)
    ]
    for run in runs:
        _wait_state(hook, run.handle, JobState.RUNNING)
    t0 = time.monotonic()
    try:
        slurm_cluster.stop_daemon("slurmctld")
        time.sleep(3)
        slurm_cluster.ensure_up()  # slurmctld restarted while the jobs run
        print(f"\noutage: slurmctld back after {time.monotonic() - t0:.1f} s")

        async def drop() -> None:
            slurm_ssh.AsyncPool.drop_connections()  # the outage also cuts the triggerer's open connection

        slurm_cluster.stop_daemon("sshd")
        triggerer.call(drop())
        time.sleep(20)  # 20 polls; the matrix's outage case holds every backend down for 60 s
        assert not any(run.future.done() for run in runs)  # Unknown is never an outcome by itself
    finally:
        slurm_cluster.ensure_up()
    print(f"outage: sshd back after {time.monotonic() - t0:.1f} s")
    results = [finish(run, timeout=240) for run in runs]
    print(f"outage: both tasks done after {time.monotonic() - t0:.1f} s (jobs sleep 40 s)")
    assert [r["state"] for r in results] == ["Complete", "Complete"]
    for run in runs:
        assert _runs(slurm_cluster, run.backend_job_id) == ["COMPLETED 0:0"]
        same_name = slurm_cluster.ssh(f"sacct -X -n -P --name={run.trigger.handle.name} -o JobID").stdout.split()
        assert same_name == [run.backend_job_id]  # no duplicate submitted


def test_transport_errors_are_not_job_failures(slurm_conn: str) -> None:
    import os

    os.environ["AIRFLOW_CONN_TAO_SLURM_BROKEN"] = json.dumps(
        {"conn_type": "tao_slurm", "host": "127.0.0.1", "port": 1, "login": "x",
         "extra": {"results_root": "/tmp/x", "no_host_key_check": True}}
    )  # fmt: skip
    broken = SlurmHook(conn_id="tao_slurm_broken")
    with pytest.raises(slurm_ssh.SlurmTransportError):
        broken.run("true")
    ok, message = broken.test_connection()
    assert ok is False and message.startswith("Unreachable: no login host answered on SSH"), message


def test_no_node_was_drained_by_an_unkillable_job(slurm_cluster: Any) -> None:
    # cancel and time limits must really stop the command (inside containers too); a step Slurm cannot kill
    # drains its node ("Kill task failed") and takes the cluster down for everyone
    assert slurm_cluster.ssh("sinfo -h -R -o '%N %E'").stdout.strip() == ""


def test_bare_metal_preflight_says_what_the_nodes_lack(slurm_cluster: Any, hook: SlurmHook) -> None:
    # container_runtime=none + the in-job runner: python3 >= 3.8 is checked over SSH (the login node has 3.11),
    # and boto3 too when S3 is used -- this cluster's python3 has no boto3
    def runner_spec(manifest: str) -> JobSpec:
        return JobSpec(
            name=f"bare-{uuid.uuid4().hex[:8]}",
            job_id=uuid.uuid4().hex[:12],
            command=["/bin/sh", "-c", "true"],
            gpu_count=0,
            files={"script_runner.py": b"# runner", "runner.json": manifest.encode()},
            backend_details={"container_runtime": "none"},
        )

    hook.validate_spec(runner_spec('{"outputs": {"model": "/abs/out"}}'))
    with pytest.raises(JobValidationError, match="boto3"):
        hook.validate_spec(runner_spec('{"inputs": {"data": "s3://bucket/train"}}'))


def test_runner_passthrough_job_with_cluster_inputs_commits_its_outputs(slurm_cluster: Any, triggerer: Any) -> None:
    # the operator's data contract on SLURM: the in-job runner arrives in TAO_JOB_FILES, the input is a cluster
    # path checked over SSH before submission, the output is committed (with its manifest) under results_dir
    data = f"{slurm_cluster.results_root}/datasets/{uuid.uuid4().hex[:8]}"
    slurm_cluster.ssh(f"mkdir -p {data} && printf 'a,b\\n1,2\\n3,4\\n' > {data}/train.csv")
    # a container path (the rootfs is read-only) of this test alone, right under the cluster's own shared root
    box = f"{slurm_cluster.results_root}/box-{uuid.uuid4().hex[:8]}"
    op = make_operator(
        image=_py(slurm_cluster),
        command=f"mkdir -p {box}/out && wc -l < {box}/train.csv > {box}/out/lines.txt",
        inputs={f"{box}/train.csv": f"{data}/train.csv"},
        outputs=[f"{box}/out"],
    )
    result = finish(start(triggerer, op))
    (out_uri,) = result["outputs"].values()
    assert out_uri.startswith(f"{result['results_dir']}/")
    assert _cat(slurm_cluster, f"{out_uri}/lines.txt").strip() == "3"
    assert _exists(slurm_cluster, f"{out_uri}/_TAO_MANIFEST.json")

    missing = make_operator(image=_py(slurm_cluster), command="true", inputs={f"{box}/x": f"{data}/nope.csv"})
    with pytest.raises(AirflowFailException, match="does not exist"):
        start(triggerer, missing)
    local = make_operator(image=_py(slurm_cluster), command="true", inputs={f"{box}/x": "file:///etc/hosts"})
    with pytest.raises(AirflowFailException, match="Airflow worker"):
        start(triggerer, local)


def test_runner_on_bare_metal_nodes_runs_the_archive_with_the_nodes_python3(slurm_cluster: Any, triggerer: Any) -> None:
    # container_runtime=none: runner.pyz arrives in TAO_JOB_FILES and the nodes' own python3 (3.11, PyYAML, no
    # boto3) runs it; config mode writes the spec, the cluster input is rewritten in place, the output auto-filled
    data = f"{slurm_cluster.results_root}/datasets/{uuid.uuid4().hex[:8]}"
    slurm_cluster.ssh(f"mkdir -p {data} && printf 'a,b\\n1,2\\n' > {data}/train.csv")
    count = (
        "import sys, yaml; s = yaml.safe_load(open(sys.argv[1])); "
        "open(s['out'] + '/lines.txt', 'w').write(str(len(open(s['data']).read().splitlines())))"
    )
    op = make_operator(
        command=["python3", "-c", count, "{config_path}"],
        specs={"data": f"{data}/train.csv", "out": ""},
        inputs=["data"],
        outputs=["out"],
        backend_details={"container_runtime": "none"},
    )
    run = start(triggerer, op)
    result = finish(run)
    assert result["state"] == "Complete"
    assert _cat(slurm_cluster, f"{result['outputs']['out']}/lines.txt").strip() == "2"
    assert _exists(slurm_cluster, f"{result['outputs']['out']}/_TAO_MANIFEST.json")


def test_batched_status_of_many_jobs_is_one_squeue_and_at_most_one_sacct(
    slurm_cluster: Any, triggerer: Any, hook: SlurmHook
) -> None:
    failed = start(triggerer, make_operator(image=_py(slurm_cluster), command="exit 4"))
    held = start(
        triggerer, make_operator(image=_py(slurm_cluster), command="true", backend_details={"partition": "held"})
    )
    with pytest.raises(AirflowFailException):
        finish(failed)
    handles = [JobHandle.from_json(failed.handle), JobHandle.from_json(held.handle)]
    handles.append(JobHandle("slurm", "tao_slurm_ci", "nosuchjob", "nosuchjob", backend_job_id="9999999"))
    before = slurm_ssh.STATS["sync_commands"]
    statuses = hook.get_job_statuses(handles)
    assert slurm_ssh.STATS["sync_commands"] - before == 2  # squeue for all three, sacct for the two it lacks
    assert (statuses[failed.job_id].state, statuses[failed.job_id].exit_code) == (JobState.ERROR, 4)
    assert statuses[held.job_id].message == "PENDING (PartitionDown)"
    assert (statuses["nosuchjob"].state, statuses["nosuchjob"].not_found) == (JobState.UNKNOWN, True)
    kill(held)
