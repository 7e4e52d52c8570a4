"""What a deferred task's log says while its job waits and runs: why it waits (issue 23.5), progress bars and lines
that never end (23.6), and the secrets the job received, masked though the triggerer never got them (23.7)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from typing import Any

import pytest

from airflow_provider_tao.joblog import JobLogWriter, readable_log
from airflow_provider_tao.jobs import JobHandle, JobSpec, JobState
from airflow_provider_tao.triggers.job import TAOJobTrigger
from tests.unit.fakes import FakeHook

UNSCHEDULABLE = "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu"


def _submit(conn_id: str = "fake_conn") -> JobHandle:
    job_id = uuid.uuid4().hex[:12]
    spec = JobSpec(name=f"job-{job_id}", job_id=job_id, command="x", image="i")
    return FakeHook(conn_id=conn_id).create_job(spec)


async def _more(calls: list[Any], count: int) -> None:
    """Return once the fake has recorded ``count`` more of these calls (``status_calls``: status polls; ``log_reads``:
    the trigger's log reads, each written before the next begins -- they run apart from the poller and may lag it)."""
    until = len(calls) + count
    while len(calls) < until:
        await asyncio.sleep(0.01)


def _job_lines(out: str) -> list[str]:
    """The job's lines in the (console-rendered) log output, without the logger's trailing fields."""
    lines = [line.split("[job] ", 1)[1] for line in out.splitlines() if "[job] " in line]
    return [re.sub(r"\s+\[airflow_provider_tao\.\S+\] loc=\S+$", "", line) for line in lines]


async def test_a_waiting_job_says_why_again_and_again_and_names_it_in_the_timeout(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AIRFLOW__TAO__OUTAGE_REPORT_SECONDS", "0.3")
    handle = _submit()
    job = fake_platform.jobs[handle.job_id]
    job.update(state=JobState.PENDING, message="Job is waiting for its pods")

    seen = ""

    async def schedule_fails_then_time_out() -> None:
        nonlocal seen
        # the trigger has seen the first reason, however slowly a loaded machine runs
        await _more(fake_platform.status_calls, 2)
        job["message"] = UNSCHEDULABLE
        # the deadline passes once two reminders are out: a poll count, not a wall-clock time (a loaded machine
        # polled too few times within a fixed 1.2 s for a second reminder, issue 35)
        while seen.count("is still pending after") < 2:
            seen += capsys.readouterr().out
            await asyncio.sleep(0.01)
        trigger.deadline = time.time()

    trigger = TAOJobTrigger(handle=handle.to_json(), poll_interval=0.05, deadline=time.time() + 600)
    asyncio.get_running_loop().create_task(schedule_fails_then_time_out())
    payload = (await asyncio.wait_for(trigger.run().__anext__(), 60)).payload

    out = seen + capsys.readouterr().out
    assert f"Job {handle.job_id} is pending: Job is waiting for its pods" in out  # each change, with its reason
    assert f"Job {handle.job_id} is pending: {UNSCHEDULABLE}" in out
    assert out.count("is still pending after") >= 2  # the reminder while it lasts, not one line per poll
    assert out.count(UNSCHEDULABLE) < 8
    assert payload["status"] == "timeout"
    assert payload["waiting"].startswith("the job was still pending after ")
    assert payload["waiting"].endswith(UNSCHEDULABLE)


async def test_the_state_change_that_ends_a_wait_is_logged(
    fake_platform: type[FakeHook], capsys: pytest.CaptureFixture[str]
) -> None:
    handle = _submit()
    job = fake_platform.jobs[handle.job_id]
    job.update(state=JobState.PENDING, message="PENDING (Resources)")

    async def run_then_end() -> None:
        await _more(fake_platform.status_calls, 2)
        job.update(state=JobState.RUNNING, message="RUNNING on node1")
        await _more(fake_platform.status_calls, 2)
        job.update(state=JobState.COMPLETE, message="COMPLETED")

    asyncio.get_running_loop().create_task(run_then_end())
    trigger = TAOJobTrigger(handle=handle.to_json(), poll_interval=0.05)
    assert (await asyncio.wait_for(trigger.run().__anext__(), 60)).payload["status"] == "complete"
    out = capsys.readouterr().out
    assert f"Job {handle.job_id} is pending: PENDING (Resources)" in out
    assert f"Job {handle.job_id} is Running after " in out and "s pending: RUNNING on node1" in out


async def test_a_progress_bar_shows_its_latest_state_and_a_line_without_end_never_grows_without_bound(
    fake_platform: type[FakeHook], capsys: pytest.CaptureFixture[str]
) -> None:
    handle = _submit()
    log = fake_platform.logs
    log[handle.job_id] = "starting\n"
    trigger = TAOJobTrigger(handle=handle.to_json(), poll_interval=0.03)
    task = asyncio.ensure_future(trigger.run().__anext__())
    for percent in range(0, 101, 10):  # tqdm: one line rewritten with \r, its newline only at the very end
        log[handle.job_id] += f"\rtrain: {percent:3d}%|" + "#" * (percent // 10)
        await _more(fake_platform.log_reads, 2)
    shown = _job_lines(capsys.readouterr().out)
    assert shown[0] == "starting"
    assert "train: 100%|##########" in shown  # shown while the job runs, not only when it ends
    assert not any("\r" in line for line in shown)
    assert len(shown) == len(set(shown))  # each state once

    log[handle.job_id] += "\n" + "x" * 100_000  # a line that never ends (no newline, no \r)
    await _more(fake_platform.log_reads, 3)
    assert len(trigger._writer.partial) < 20_000  # capped, not held without bound
    assert any(line.startswith("xxxx") for line in _job_lines(capsys.readouterr().out))  # flushed at the limit
    fake_platform.jobs[handle.job_id]["state"] = JobState.COMPLETE
    assert (await asyncio.wait_for(task, 60)).payload["status"] == "complete"
    assert "train: 100%|##########" not in _job_lines(capsys.readouterr().out)  # its newline did not repeat it


def test_runner_heartbeats_read_as_words_and_collapse() -> None:
    beats = ["TAO_PROGRESS " + json.dumps({"phase": "run", "files": 0, "bytes": 0, "step": step}) for step in (1, 2, 3)]
    text = "\n".join(["loading", *beats, "epoch done", beats[0]]) + "\n"
    assert readable_log(text).splitlines() == [
        "loading",
        "progress: run, step 3",
        "epoch done",
        "progress: run, step 1",
    ]
    writer = JobLogWriter()
    assert writer.feed(text) == readable_log(text).splitlines()


@pytest.mark.parametrize(
    "case",
    [
        # a platform key the worker took from its environment (no field of the connection holds it)
        (
            {"conn_type": "tao_lepton", "extra": {"workspace_id": "w"}},
            {"NGC_KEY": "nvapi-ngc-from-env-1"},
            "nvapi-ngc-from-env-1",
        ),
        # a kubeconfig extra: its user token (Airflow's masker does not know the name kube_config)
        (
            {
                "conn_type": "tao_kubernetes",
                "extra": {"kube_config": "users:\n- name: u\n  user:\n    token: kt-secret-42\n"},
            },
            {},
            "kt-secret-42",
        ),
        # storage credentials from the boto chain's environment, not from the connection
        (
            {"conn_type": "aws"},
            {"AWS_ACCESS_KEY_ID": "AKIAFROMENV0000", "AWS_SECRET_ACCESS_KEY": "chain-secret-key-77"},
            "chain-secret-key-77",
        ),
    ],
    ids=["env-fallback", "kube_config", "boto-chain"],
)
async def test_a_secret_the_job_received_outside_its_connections_fields_is_masked_in_the_task_log(
    fake_platform: type[FakeHook],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    case: tuple[dict[str, Any], dict[str, str], str],
) -> None:
    conn, env, secret = case  # the connection, the worker's (and triggerer's) environment, the secret the job got
    monkeypatch.setenv("AIRFLOW_CONN_JOB_SECRETS", json.dumps(conn))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    handle = _submit()
    fake_platform.logs[handle.job_id] = f"the job prints {secret} and more\n"
    fake_platform.jobs[handle.job_id]["state"] = JobState.COMPLETE
    trigger = TAOJobTrigger(handle=handle.to_json(), poll_interval=0.02, secret_conn_ids=["job_secrets"])
    assert secret not in json.dumps(trigger.serialize())  # the kwargs (stored in the database) never hold it
    await asyncio.wait_for(trigger.run().__anext__(), 60)
    out = capsys.readouterr().out
    assert "[job] the job prints *** and more" in out
    assert secret not in out


def test_a_resumed_worker_masks_the_secrets_it_never_handed_the_job(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``execute_complete`` runs in a new process, which writes the job's failure evidence (its log's last lines)."""
    from airflow_provider_tao.operators.submit import TAOSubmitOperator
    from tests.unit.fakes import Store, make_context

    monkeypatch.setattr(FakeHook, "env_fallbacks", {"ngc_api_key": "NGC_KEY"})
    monkeypatch.setenv("NGC_KEY", "nvapi-worker-env-key-9")
    masked: list[Any] = []
    monkeypatch.setattr("airflow.sdk.log.mask_secret", lambda value, name=None: masked.append(value))
    handle = _submit()
    fake_platform.jobs[handle.job_id].update(state=JobState.ERROR, exit=1)
    fake_platform.logs[handle.job_id] = "Traceback: login with nvapi-worker-env-key-9 refused\n"
    resumed = TAOSubmitOperator(task_id="train", conn_id="fake_conn", image="img:1", command="x")
    event = {"status": "error", "handle": handle.to_json(), "log_cursor": "", "message": ""}
    event["job_status"] = FakeHook().get_job_status(handle).to_json()
    with pytest.raises(Exception, match="failed"):
        resumed.execute_complete(make_context(Store()), event)
    assert "nvapi-worker-env-key-9" in masked


def test_a_worker_killed_while_its_job_waits_says_why_the_job_waited(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The worker-side wait: Airflow's execution_timeout (or a kill) lands in it and calls on_kill."""
    from airflow.sdk.exceptions import AirflowTaskTimeout

    from airflow_provider_tao.operators.submit import TAOSubmitOperator
    from tests.unit.fakes import Store, make_context

    fake_platform.queueing = {"fake_conn"}
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:  # Airflow's timeout signal arrives during the second wait
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise AirflowTaskTimeout("Timeout, PID: 1")

    monkeypatch.setattr("time.sleep", sleep)
    op = TAOSubmitOperator(
        task_id="train", conn_id="fake_conn", image="img:1", command="x", deferrable=False, poll_interval=1
    )
    with pytest.raises(AirflowTaskTimeout):
        op.execute(make_context(Store()))
    op.on_kill()
    out = capsys.readouterr().out
    (job,) = fake_platform.jobs.values()
    assert f"Job {job['handle'].job_id} is pending: fake Pending" in out
    assert f"Job {job['handle'].job_id} was killed while waiting: the job was still pending after " in out
    assert job["state"] is JobState.CANCELED


async def test_triggers_started_together_share_one_lookup_of_the_secrets_their_jobs_received(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restarted triggerer starts thousands of triggers at once: they read their connections (and run a boto chain)
    once per burst, not once each; a later trigger reads afresh."""
    from airflow_provider_tao import received_secrets

    calls: list[tuple[str, ...]] = []

    async def lookup(conn_ids: Any) -> list[str]:
        calls.append(tuple(conn_ids))
        await asyncio.sleep(0.05)
        return ["s3cr3t"]

    monkeypatch.setattr(received_secrets, "_asecrets_received", lookup)
    found = await asyncio.gather(*(received_secrets.asecrets_received(["job_secrets"]) for _ in range(50)))
    assert found == [["s3cr3t"]] * 50 and calls == [("job_secrets",)]
    await received_secrets.asecrets_received(["job_secrets"])
    assert len(calls) == 2


#: Machine lines a job may print that are not what the runner prints (issue 38.4): wrong types, numbers no float
#: holds, numbers no int holds, nesting deeper than any parser's stack.
MALFORMED_MACHINE_LINES = [
    'TAO_PROGRESS {"phase": "run", "bytes": "x"}',
    'TAO_PROGRESS {"phase": "run", "bytes": 1e999}',
    'TAO_PROGRESS {"phase": "run", "bytes": [1]}',
    'TAO_PROGRESS {"phase": "run", "bytes": {"a": 1}}',
    'TAO_PROGRESS {"bytes": ' + "9" * 400 + "}",
    'TAO_PROGRESS {"bytes": ' + "9" * 5000 + "}",
    "TAO_PROGRESS " + "[" * 100_000,
    'TAO_PROGRESS {"phase": ' + "[" * 5000 + "]" * 5000 + "}",
    "TAO_PROGRESS [1]",
    "TAO_PROGRESS null",
    'TAO_FAILURE {"err_class": [1]}',
    'TAO_FAILURE {"err_class": {"a": 1}}',
    "TAO_FAILURE " + "[" * 100_000,
]


@pytest.mark.parametrize("line", MALFORMED_MACHINE_LINES, ids=range(len(MALFORMED_MACHINE_LINES)))
def test_a_malformed_machine_line_is_shown_as_text_never_raised(line: str) -> None:
    from airflow_provider_tao.failures import runner_verdict
    from airflow_provider_tao.runner.entrypoint import parse_progress

    text = f"before\n{line}\nafter\n"
    shown = JobLogWriter().feed(text)
    assert shown[0] == "before" and shown[-1] == "after" and len(shown) == 3
    assert shown[1] == line or shown[1].startswith("progress: ")  # as text, or in words where the words hold
    assert readable_log(text).splitlines()[:3] == shown
    parse_progress(line)  # the runner's own reading of a heartbeat, as the tests and tools use it
    assert runner_verdict([line]) is None


async def test_a_job_printing_a_malformed_heartbeat_still_completes_its_task_and_moves_the_log_cursor(
    fake_platform: type[FakeHook], capsys: pytest.CaptureFixture[str]
) -> None:
    handle = _submit()
    fake_platform.logs[handle.job_id] = 'TAO_PROGRESS {"phase": "run", "bytes": "x"}\nTAO_PROGRESS {"bytes": 1e999}\n'
    fake_platform.jobs[handle.job_id]["state"] = JobState.COMPLETE
    trigger = TAOJobTrigger(handle=handle.to_json(), poll_interval=0.05)
    payload = (await asyncio.wait_for(trigger.run().__anext__(), 60)).payload
    assert payload["status"] == "complete"
    assert payload["log_cursor"] not in ("", "0")  # past the lines: a retry does not read them again
    assert 'TAO_PROGRESS {"bytes": 1e999}' in _job_lines(capsys.readouterr().out)


class _EndsWithMalformedHeartbeats(FakeHook):
    """A job that has ended by its first poll, its log two heartbeats no runner prints."""

    def create_job(self, spec: JobSpec, try_number: int = 1) -> JobHandle:
        handle = super().create_job(spec, try_number)
        self.logs[handle.job_id] = "TAO_PROGRESS " + "[" * 100_000 + '\nTAO_PROGRESS {"bytes": [1]}\n'
        self.jobs[handle.job_id]["state"] = JobState.COMPLETE
        return handle


def test_a_worker_waiting_on_a_job_with_a_malformed_heartbeat_still_returns_its_result(
    fake_platform: type[FakeHook], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The worker's own wait (``deferrable=False``) copies the log through the same writer (issue 38.4)."""
    from airflow_provider_tao import hooks
    from airflow_provider_tao.operators.submit import TAOSubmitOperator
    from tests.unit.fakes import Store, make_context

    monkeypatch.setitem(hooks.PLATFORMS, "fake", ("tao_fake", f"{__name__}._EndsWithMalformedHeartbeats"))
    op = TAOSubmitOperator(
        task_id="t", conn_id="fake_conn", image="i:1", command="x", deferrable=False, poll_interval=0.02
    )
    assert op.execute(make_context(Store()))["state"] == "Complete"
    assert any(line.startswith('TAO_PROGRESS {"bytes": [1]}') for line in _job_lines(capsys.readouterr().out))
