"""Proves the e2e harness against a real ``airflow standalone`` using only Airflow's own operators.

DAGs: ``tests/e2e/dags/e2e_smoke.py``. All tests share one standalone (the default config).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.airflow_harness import HEALTH_COMPONENTS, AirflowStandalone, HarnessError, StandaloneConfig, wait_until

DEFERRED_DAG = "e2e_smoke_deferred"
KILL_DAG = "e2e_smoke_worker_kill"


@pytest.fixture(scope="module")
def smoke(airflow_standalone: AirflowStandalone) -> AirflowStandalone:
    """The standalone with both smoke DAGs parsed and unpaused, and a triggerer running."""
    client = airflow_standalone.client
    for dag_id in (DEFERRED_DAG, KILL_DAG):
        client.wait_for_dag(dag_id, timeout=60)
        client.unpause_dag(dag_id)
    return airflow_standalone


def test_standalone_is_healthy_isolated_and_complete(smoke: AirflowStandalone) -> None:
    health = smoke.client.health()
    assert all(health[c]["status"] == "healthy" for c in HEALTH_COMPONENTS), health
    # Never the default ports, so another Airflow on this machine cannot clash.
    ports = {smoke.api_port, smoke.worker_log_port, smoke.trigger_log_port}
    assert len(ports) == 3
    assert not ports & {8080, 8793, 8794}
    titles = [" ".join(p.cmdline()) for p in smoke.processes()]
    tree = smoke.process_tree_text()
    for component in ("standalone", "scheduler", "dag-processor", "api_server", "triggerer"):
        assert any(component in t for t in titles), f"{component} missing:\n{tree}"
    assert sum("LocalExecutor:" in t for t in titles) == smoke.config.parallelism, tree
    # Idle (no task running): every process is in a process group the harness started.
    assert all(os.getpgid(p.pid) in smoke.sessions for p in smoke.processes()), tree
    assert smoke.find_triggerer() is not None


# Graceful only: triggers are released at exit and picked up as soon as the new triggerer runs. The crash (SIGKILL:
# triggers move once the dead triggerer's heartbeat is older than the threshold) is the fault matrix's
# test_triggerer_sigkill_and_restart_neither_resubmits_nor_loses_a_job, through this same harness call.
@pytest.mark.parametrize(("sig", "wait_seconds"), [pytest.param(signal.SIGTERM, 20, id="sigterm")])
def test_triggerer_restart_while_deferred(smoke: AirflowStandalone, sig: signal.Signals, wait_seconds: int) -> None:
    client = smoke.client
    smoke.ensure_triggerer()
    started = time.monotonic()
    run_id = client.trigger_dag_run(DEFERRED_DAG, {"wait_seconds": wait_seconds})
    client.wait_for_task_instance(DEFERRED_DAG, run_id, "wait", ["deferred"], timeout=60)
    phases = {"deferred": time.monotonic() - started}
    owner = wait_until(
        lambda: (client.get_task_instance(DEFERRED_DAG, run_id, "wait").get("trigger") or {}).get("triggerer_id"),
        timeout=30,
        message="trigger never assigned to a triggerer",
    )
    phases["trigger assigned"] = time.monotonic() - started

    old_job, new_job = smoke.restart_triggerer(sig)
    phases["replacement heartbeating"] = time.monotonic() - started
    assert old_job == owner
    assert new_job != old_job

    ti = client.wait_for_trigger_owner(DEFERRED_DAG, run_id, "wait", new_job, timeout=60)
    assert ti["state"] == "deferred"
    phases["trigger moved"] = time.monotonic() - started
    client.wait_for_dag_run(DEFERRED_DAG, run_id, ["success"], timeout=wait_seconds + 60)
    phases["run success"] = time.monotonic() - started
    print(f"{sig.name}: " + ", ".join(f"{k} at {v:.1f}s" for k, v in phases.items()))

    # Not resubmitted, not retried: one try, and the new triggerer fired the event.
    tries = client.list_task_instance_tries(DEFERRED_DAG, run_id, "wait")
    assert [(t["try_number"], t["state"]) for t in tries] == [(1, "success")]
    log = client.get_task_log(DEFERRED_DAG, run_id, "wait", 1)
    assert f"attempt=1.log.trigger.{new_job}.log" in log, log
    assert "Trigger fired event" in log, log
    assert client.get_xcom(DEFERRED_DAG, run_id, "report") == {"waited": wait_seconds, "ok": True}
    assert client.get_task_instance_links(DEFERRED_DAG, run_id, "wait") == {}
    # Back to healthy with the replacement.
    wait_until(lambda: not client.unhealthy_components(), timeout=30, message=lambda: str(client.health()))


def test_mark_deferred_task_failed(smoke: AirflowStandalone) -> None:
    client = smoke.client
    smoke.ensure_triggerer()
    run_id = client.trigger_dag_run(DEFERRED_DAG, {"wait_seconds": 600})
    client.wait_for_task_instance(DEFERRED_DAG, run_id, "wait", ["deferred"], timeout=60)
    # The trigger's own log lines are readable over REST while the task is deferred.
    wait_until(
        lambda: "DateTimeTrigger: trigger starting" in client.get_task_log(DEFERRED_DAG, run_id, "wait", 1),
        timeout=30,
        message=lambda: client.get_task_log(DEFERRED_DAG, run_id, "wait", 1),
    )

    marked = time.monotonic()
    client.mark_task_instance_failed(DEFERRED_DAG, run_id, "wait")
    ti = client.wait_for_task_instance(DEFERRED_DAG, run_id, "wait", ["failed"], timeout=30)
    assert ti["try_number"] == 1
    # The trigger is withdrawn from the triggerer and the run fails (downstream upstream_failed).
    wait_until(
        lambda: client.get_task_instance(DEFERRED_DAG, run_id, "wait")["trigger"] is None,
        timeout=30,
        message="trigger still attached",
    )
    client.wait_for_dag_run(DEFERRED_DAG, run_id, ["failed"], timeout=60)
    assert client.get_task_instance_state(DEFERRED_DAG, run_id, "report") == "upstream_failed"
    print(f"mark failed -> TI failed and trigger gone in {time.monotonic() - marked:.1f}s")

    log = client.get_task_log(DEFERRED_DAG, run_id, "wait", 1)
    assert "Pausing task as DEFERRED" in log, log
    assert "DateTimeTrigger: trigger starting" in log, log

    # Clear -> try 2 defers again; mark it successful -> the run succeeds.
    cleared = client.clear_task_instances(DEFERRED_DAG, run_id, ["wait"], include_downstream=True)
    assert {ti["task_id"] for ti in cleared} == {"wait", "report"}
    ti = client.wait_for_task_instance(DEFERRED_DAG, run_id, "wait", ["deferred"], timeout=60)
    assert ti["try_number"] == 2
    client.mark_task_instance_success(DEFERRED_DAG, run_id, "wait")
    client.wait_for_dag_run(DEFERRED_DAG, run_id, ["success"], timeout=60)
    tries = client.list_task_instance_tries(DEFERRED_DAG, run_id, "wait")
    assert [(t["try_number"], t["state"]) for t in tries] == [(1, "failed"), (2, "success")]


def test_find_and_kill_task_runner_then_retry(smoke: AirflowStandalone) -> None:
    client = smoke.client
    run_id = client.trigger_dag_run(KILL_DAG, {"sleep_seconds": 300})
    client.wait_for_task_instance(KILL_DAG, run_id, "sleepy", ["running"], timeout=60)
    # Wait until try 1 is really inside execute() (its log line), then kill its runner.
    wait_until(
        lambda: "try 1 sleeping" in client.get_task_log(KILL_DAG, run_id, "sleepy", 1),
        timeout=60,
        message="try 1 never started sleeping",
    )
    ti = client.get_task_instance(KILL_DAG, run_id, "sleepy")
    runner = smoke.find_task_runner(KILL_DAG, run_id, "sleepy")
    assert runner.pid == ti["pid"]
    # setproctitle pads the title with spaces
    assert " ".join(runner.cmdline()).strip() == f"airflow worker -- {ti['id']}"
    assert os.getpgid(runner.pid) == runner.pid  # the runner leads its own process group
    supervisor = runner.parent()
    assert supervisor is not None
    assert " ".join(supervisor.cmdline()).strip().endswith(f"LocalExecutor: {ti['id']}")

    killed = smoke.kill_task_runner(KILL_DAG, run_id, "sleepy")
    assert killed == runner.pid

    # The supervisor reports the try failed; the retry (try 2) returns at once.
    client.wait_for_dag_run(KILL_DAG, run_id, ["success"], timeout=90)
    tries = client.list_task_instance_tries(KILL_DAG, run_id, "sleepy")
    assert [(t["try_number"], t["state"]) for t in tries] == [(1, "failed"), (2, "success")]
    assert client.get_xcom(KILL_DAG, run_id, "sleepy") == 2
    assert "try 1 sleeping" in client.get_task_log(KILL_DAG, run_id, "sleepy", 1)


def test_new_dag_file_is_picked_up(smoke: AirflowStandalone) -> None:
    source = (
        "from airflow.sdk import DAG\n"
        "from airflow.providers.standard.operators.empty import EmptyOperator\n"
        "with DAG('e2e_smoke_added', schedule=None):\n"
        "    EmptyOperator(task_id='noop')\n"
    )
    written = time.monotonic()
    smoke.write_dag_file("e2e_smoke_added.py", source)
    smoke.client.wait_for_dag("e2e_smoke_added", timeout=60)
    print(f"new DAG file visible over REST after {time.monotonic() - written:.1f}s")


def test_start_fails_clearly_without_dags_folder(tmp_path: Path) -> None:
    config = StandaloneConfig(dags_folder=tmp_path / "missing")
    instance = AirflowStandalone(config, database_url="postgresql+psycopg2://never-reached/db", base_dir=tmp_path)
    with pytest.raises(HarnessError, match="does not exist"):
        instance.start()
    assert not instance.is_running()


def test_a_triggerer_that_dies_by_itself_is_restarted_and_one_a_test_stops_is_not(smoke: AirflowStandalone) -> None:
    """Airflow 3.3's triggerer exits on a StaleDataError when a trigger's event races a clear of its task instance,
    and ``airflow standalone`` never restarts it: the harness does, as a deployment's supervisor would, and says so;
    a triggerer a test stops stays stopped until the test starts one."""
    main = smoke.ensure_triggerer()
    restarts = len(smoke.stats.triggerer_restarts)
    for proc in [main, *main.children(recursive=True)]:  # a crash: gone without the harness's kill
        proc.kill()
    wait_until(lambda: len(smoke.stats.triggerer_restarts) > restarts and smoke.find_triggerer() is not None,
               timeout=120, interval=0.5, message="the dead triggerer was not restarted")  # fmt: skip
    smoke.kill_triggerer(signal.SIGKILL)
    rounds = smoke.stats.samples  # each round of the sampler looks at the triggerer after its sample
    wait_until(lambda: smoke.stats.samples >= rounds + 3, timeout=120, interval=0.5, message="the sampler stopped")
    assert smoke.find_triggerer() is None, "a triggerer a test stopped was started again"
    smoke.ensure_triggerer()


@pytest.mark.parametrize(("method", "asked"), [("GET", 2), ("POST", 1)])
def test_a_read_the_api_server_did_not_answer_is_asked_again_and_a_write_is_not(method: str, asked: int) -> None:
    """The loaded rehearsal: the standalone's API server starved past the client's 30 s, and a test waiting on a task
    state failed on the ReadTimeout. A GET is asked again; a write that may have been done is not."""
    import httpx

    from tests.e2e.airflow_harness import AirflowClient

    calls: list[str] = []

    def server(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        if len(calls) == 1:
            raise httpx.ReadTimeout("timed out", request=request)
        return httpx.Response(200, json={"state": "deferred"})

    client = AirflowClient("http://api.invalid")
    client.http = httpx.Client(base_url="http://api.invalid/api/v2", transport=httpx.MockTransport(server))
    try:
        if method == "GET":
            assert client._json("GET", "/dags") == {"state": "deferred"}
        else:
            with pytest.raises(httpx.ReadTimeout):
                client._json("POST", "/dags")
        assert calls == [method] * asked
    finally:
        client.close()


def test_a_trigger_the_api_server_did_not_answer_is_sent_again_and_makes_one_run() -> None:
    """The loaded machine's CI failure: the standalone's API server starved past the client's 30 s on a trigger. The
    run is named by the client, so the POST is sent again; the resend's 409 (the first made the run) is the run."""
    import httpx

    from tests.e2e.airflow_harness import AirflowClient

    runs: dict[str, dict[str, object]] = {}
    calls: list[str] = []

    def server(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        calls.append(body["dag_run_id"])
        if body["dag_run_id"] in runs:
            return httpx.Response(409, json={"detail": "exists"})
        runs[body["dag_run_id"]] = body["conf"]
        if len(calls) == 1:  # done, but the answer comes too late
            raise httpx.ReadTimeout("timed out", request=request)
        return httpx.Response(200, json={"dag_run_id": body["dag_run_id"]})

    client = AirflowClient("http://api.invalid")
    client.http = httpx.Client(base_url="http://api.invalid/api/v2", transport=httpx.MockTransport(server))
    try:
        run_id = client.trigger_dag_run("dag", {"epochs": 2})
        assert calls == [run_id, run_id] and runs == {run_id: {"epochs": 2}}
        assert client.trigger_dag_run("dag") != run_id and len(runs) == 2  # a new trigger is a new run
        with pytest.raises(httpx.HTTPStatusError, match="409"):  # a first answer's 409 is the caller's conflict
            client.trigger_dag_run("dag", run_id=run_id)
    finally:
        client.close()


def test_a_try_that_died_without_a_log_line_is_described_with_the_instance_log_lines_that_name_it(
    tmp_path: Path,
) -> None:
    """A try killed by its worker before the operator ran (its log ends at "Pre Execute") is explained by the
    scheduler's and the API server's lines in the instance's own log, which name the try's id: the failure's
    description quotes them, and no line about another try."""
    import httpx

    from tests.e2e.airflow_harness import AirflowClient, HarnessTimeout

    ti_id = "01a223e7-b8bc-799f-984f-e6c2c751e9c6"
    log = tmp_path / "standalone.log"
    log.write_text(
        f"scheduler  | Executor reported that the task instance ti_id={ti_id} finished with state failed\n"
        "scheduler  | ti_id=another-try finished\n"
        f"api-server | request finished duration_us=7606964 path=/execution/task-instances/{ti_id}/run\n"
    )

    def server(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/taskInstances/train"):
            return httpx.Response(200, json={"id": ti_id, "state": "failed", "try_number": 1})
        return httpx.Response(404, json={"detail": "not here"})

    client = AirflowClient("http://api.invalid", server_logs=lambda: [log, tmp_path / "no-such.log"])
    client.http = httpx.Client(base_url="http://api.invalid/api/v2", transport=httpx.MockTransport(server))
    try:
        with pytest.raises(HarnessTimeout) as raised:
            client.wait_for_task_instance("dag", "run", "train", ["success"], timeout=30)
    finally:
        client.close()
    quoted = str(raised.value).split(f"--- instance log lines naming try {ti_id} ---\n")[1].splitlines()
    assert [line.split(" | ")[0] for line in quoted] == ["scheduler ", "api-server"]
