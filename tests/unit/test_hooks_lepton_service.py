"""LeptonHook against what the real ``leptonai`` 0.47.1 client models and does (issue 21, points 8 and 10-14; issue
22, hole 7): the job, replica and event JSON here is built with the client's own pydantic models and dumped as the
server would send it; the log read goes through the client's own ``LogAPI.get_log``. What the server does where it
is unknown here (node-group filter, page cap, ``ready``, event messages) runs against each mode of the fake in
``tests/integration/lepton/test_lepton_service.py``."""

from __future__ import annotations

import datetime
import time
from typing import Any

import pytest

from airflow_provider_tao.failures import FailureFacts, classify
from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.hooks.lepton import hook as lp
from airflow_provider_tao.hooks.lepton import placement as lpl
from airflow_provider_tao.hooks.lepton import status as ls
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobSpec, JobState, JobStatus
from airflow_provider_tao.runner.job.progress import FAILURE_PREFIX

NOW = 1_800_000_000.0


def _model_job(state: str, *, ready: int, active: int, parallelism: int, age: float, **labels: str) -> Any:
    """A job as the server sends it, through the client's ``LeptonJob`` model."""
    from leptonai.api.v2.types.common import Metadata
    from leptonai.api.v2.types.job import LeptonJob, LeptonJobState, LeptonJobStatus, LeptonJobUserSpec

    created = int((NOW - age) * 1000)
    job = LeptonJob(
        metadata=Metadata(id="train-0123456789", name="train-0123456789", created_at=created, labels=labels),
        spec=LeptonJobUserSpec(parallelism=parallelism, completions=parallelism),
        status=LeptonJobStatus(state=LeptonJobState(state), ready=ready, active=active, creation_time=created),
    )
    return job.model_dump(mode="json", by_alias=True, exclude_none=True)


def _model_replica(index: int, created_ms: int | None, node: str | None, **extra_status: Any) -> dict[str, Any]:
    from leptonai.api.v2.types.common import Metadata
    from leptonai.api.v2.types.replica import Node, Replica, ReplicaStatus

    rid = f"train-0123456789-{index}-abcde"
    status = ReplicaStatus(node=Node(name=node, id=node) if node else None)
    replica = Replica(metadata=Metadata(id=rid, created_at=created_ms), id=rid, status=status)
    data = replica.model_dump(mode="json", by_alias=True, exclude_none=True)
    data.setdefault("status", {}).update(extra_status)
    return data


# ----------------------------------------------------------------------------- 8: ready dips on a Running job


@pytest.mark.parametrize(("ready", "active"), [(1, 2), (1, 1), (0, 2), (0, 0)])
@pytest.mark.parametrize("age", [30, 601, 1800, 86400])
def test_a_running_job_whose_ready_dips_is_running_at_any_age_and_with_any_clock(
    ready: int, active: int, age: float
) -> None:
    """A worker that finished before rank 0, a readiness dip, the gap before Completed: ``ready < parallelism`` on a
    Running job, read by a hook that watched it (``starting_since``) and by a new one (a triggerer restart)."""
    job = _model_job("Running", ready=ready, active=active, parallelism=2, age=age, **{ls.LABEL_START: "600"})
    for since in (None, NOW - age, NOW - 5):
        for readiness in (None, ls.Readiness("InProgress", "Pulling image"), ls.Readiness("ConfigError", "x")):
            status = ls.job_status(job, NOW, readiness, starting_since=since)
            assert status.state is JobState.RUNNING, (since, readiness, status)
            assert f"{ready}/2 replica(s) ready" in status.message


def test_a_restarted_hook_neither_fails_nor_deletes_a_running_job_whose_ready_dipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The trigger's verdict and ``cleanup_job``'s (which stops and deletes a job given up on) from a fresh hook."""
    job = _model_job("Running", ready=1, active=1, parallelism=2, age=1800, **{ls.LABEL_JOB_ID: "abc"})
    job["metadata"]["created_at"] = int((time.time() - 1800) * 1000)
    hook = lp.LeptonHook(conn_id="tao_lepton_x")
    hook._extras = {"workspace_id": "ws1"}
    deleted: list[str] = []
    monkeypatch.setattr(hook, "_list_jobs", lambda selector, mode="alive_only", wanted=(): [job])
    monkeypatch.setattr(hook, "_get_job", lambda backend_id: job)
    monkeypatch.setattr(hook, "get_job_replicas", lambda h: [{"status": {"readiness_issue": {"reason": "InProgress"}}}])
    monkeypatch.setattr(hook, "_delete_job", lambda backend_id, job_id: deleted.append(backend_id))
    monkeypatch.setattr(hook, "_delete_secrets", lambda *a, **k: None)
    handle = JobHandle("lepton", "tao_lepton_x", "abc", "train-0123456789", backend_job_id="train-0123456789")
    assert hook.get_job_statuses([handle])["abc"].state is JobState.RUNNING
    hook.cleanup_job(handle)
    assert deleted == []


def test_a_job_still_starting_past_its_bound_is_still_an_error() -> None:
    """The start bound stays for Starting (where no replica has run)."""
    job = _model_job("Starting", ready=0, active=2, parallelism=2, age=1800, **{ls.LABEL_START: "600"})
    assert ls.job_status(job, NOW).state is JobState.ERROR


# ----------------------------------------------------------------------------- 11: priority class


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("high", "high-7000"),
        ("H", "high-7000"),
        ("high-9", "high-9000"),
        ("high-9000", "high-9000"),
        (9, "high-9000"),
        ("1", "low-1000"),
        ("mid", "mid-4000"),
        ("mid-5000", "mid-5000"),
        ("low-3", "low-3000"),
        ("urgent", None),
        ("high-4000", None),
        ("mid-7", None),
        (0, None),
        (True, None),
        ("", None),
    ],
)
def test_priority_classes_are_mapped_as_the_cli_maps_them(given: Any, canonical: str | None) -> None:
    assert lpl.priority_class_of(given) == canonical


def _placement_hook(quota_enabled: bool) -> lpl.LeptonPlacementHook:
    hook = lpl.LeptonPlacementHook(conn_id="tao_lepton_x")
    hook._extras = {"workspace_id": "ws1"}
    hook._quota_enabled = {"ng-1-abcde": quota_enabled}
    return hook


@pytest.mark.parametrize(
    ("details", "group", "quota", "parameter", "says"),
    [
        ({"priority_class": "urgent"}, "ng-1-abcde", True, "priority_class", "is not a Lepton queue priority"),
        ({"priority_class": "high"}, None, True, "priority_class", "need a dedicated node group"),
        ({"priority_class": "high"}, "ng-1-abcde", False, "priority_class", "does not have quota enabled"),
        ({"can_be_preempted": True}, "ng-1-abcde", False, "can_be_preempted", "does not have quota enabled"),
        ({"can_be_preempted": "yes"}, "ng-1-abcde", True, "can_be_preempted", "is not true or false"),
    ],
)
def test_a_bad_queue_setting_is_refused_naming_the_parameter_and_the_fix(
    details: dict[str, Any], group: str | None, quota: bool, parameter: str, says: str
) -> None:
    with pytest.raises(JobValidationError) as caught:
        _placement_hook(quota)._queue(details, group, "ng-1")
    assert caught.value.parameter == f"backend_details[{parameter!r}]" and says in caught.value.problem
    assert caught.value.fix


def test_the_job_carries_the_canonical_priority_class() -> None:
    priority, preemptible = _placement_hook(True)._queue({"priority_class": "high", "can_be_preempted": False},
                                                          "ng-1-abcde", "ng-1")  # fmt: skip
    placement = lpl.Placement("gpu.1xh100", 1, "ng-1-abcde", "ng-1", priority_class=priority,
                              can_be_preempted=preemptible)  # fmt: skip
    queue = placement.spec_fields()["queue_config"]
    assert (queue.priority_class, queue.can_be_preempted) == ("high-7000", False)
    assert placement.spec_fields(staging=True)["queue_config"] is None


def test_bad_input_reaches_the_task_as_nothing_was_submitted(
    fake_platform: type[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator's wording for a JobValidationError raised by validate_spec (here: the priority class)."""
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_tao.operators.submit import TAOSubmitOperator
    from tests.unit.fakes import Store, make_context

    def refuse(self: Any, spec: Any) -> None:
        _placement_hook(True)._queue({"priority_class": "urgent"}, "ng-1-abcde", "ng-1")

    monkeypatch.setattr(fake_platform, "validate_spec", refuse)
    op = TAOSubmitOperator(task_id="t", conn_id="fake_conn", command="echo", image="i", gpu_count=0)
    with pytest.raises(AirflowFailException, match=r"^Bad input, nothing was submitted: backend_details\['priority"):
        op.execute(make_context(Store()))  # type: ignore[arg-type]
    assert fake_platform.jobs == {}


# ----------------------------------------------------------------------------- 12: usage from what is modelled


def test_usage_reads_the_modelled_times_and_leaves_the_rest_unknown() -> None:
    placed = int((NOW - 3000) * 1000)
    job = _model_job("Completed", ready=0, active=0, parallelism=2, age=3600)
    replicas = [
        # a termination record in milliseconds that no client model has: neither read nor trusted
        _model_replica(0, placed, "node-a", last_termination={"started_at": 1, "finished_at": 2}),
        _model_replica(1, placed + 5000, "node-b"),
        _model_replica(2, int(NOW * 1000), None),  # never placed: no start
    ]
    for completion in (int((NOW - 60) * 1000), int(NOW - 60)):  # the unit of completion_time is not documented
        job["status"]["completion_time"] = completion
        usage = ls.usage_of(job, replicas, {"gpus": 8, "gpu_type": "H100"})
        assert (usage.queued_at, usage.started_at, usage.ended_at) == (NOW - 3600, NOW - 3000, NOW - 60)
        assert (usage.gpus_per_node, usage.nodes, usage.gpu_type) == (8, 2, "H100")
    running = _model_job("Running", ready=2, active=2, parallelism=2, age=3600)
    running["status"]["completion_time"] = 0
    usage = ls.usage_of(running, replicas, None)
    assert usage.started_at == NOW - 3000 and usage.ended_at is None and usage.gpus_per_node is None


@pytest.mark.parametrize(("stamp", "seconds"), [(1_800_000_000, 1.8e9), (1_800_000_000_123, 1_800_000_000.123),
                                                (None, None), (0, None), ("x", None)])  # fmt: skip
def test_time_stamps_in_seconds_or_milliseconds_read_alike(stamp: Any, seconds: float | None) -> None:
    assert ls.epoch_seconds(stamp) == seconds


# ----------------------------------------------------------------------------- 13: events and log reads


def test_an_event_without_a_message_keeps_its_reason_count_and_object() -> None:
    from leptonai.api.v2.types.events import LeptonEvent

    event = LeptonEvent(type="Warning", reason="BackOff", count=4, last_observed_time=datetime.datetime(2027, 1, 1),
                        regarding={"kind": "Pod", "name": "train-0-abcde"})  # fmt: skip
    facts = ls.failure_facts_of(
        JobStatus(JobState.ERROR, "failed", raw_state="Failed"),
        replicas=[],
        events=[event.model_dump(mode="json", by_alias=True, exclude_none=True)],
        analysis={},
        log_tail=[],
        job="j",
        workspace="ws1",
    )
    assert facts.events == ["event BackOff (x4) on Pod train-0-abcde"]


class _Response:
    ok, status_code, content = True, 200, b"{}"

    def json(self) -> dict[str, Any]:
        return {"data": {"result": [{"stream": {}, "values": [[str(self.ts), "late line"]]}]}}

    def __init__(self, ts: int) -> None:
        self.ts = ts


def test_a_log_cursor_ahead_of_this_hosts_clock_reads_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The nodes' clocks run ahead of the Airflow host's: the cursor (a node's stamp) is past this host's now, and
    the client's ``get_log`` refuses ``end <= start`` with a plain RuntimeError before any request."""
    from leptonai.api.v2.client import APIClient

    ahead = time.time_ns() + 120 * 10**9
    client = APIClient("ws1", "token", "http://127.0.0.1:9/api/v2/workspaces/ws1")
    asked: list[dict[str, Any]] = []

    def get(path: str, params: dict[str, Any], **kwargs: Any) -> _Response:
        asked.append(params)
        return _Response(ahead + 1)

    monkeypatch.setattr(client.log, "_get", get)
    hook = lp.LeptonHook(conn_id="tao_lepton_x")
    hook._extras = {"workspace_id": "ws1"}
    monkeypatch.setattr(hook, "_client", lambda: client)
    monkeypatch.setattr(hook, "_rank0_replica", lambda handle: "train-0-abcde")
    handle = JobHandle("lepton", "tao_lepton_x", "abc", "train-0123456789", backend_job_id="train-0123456789")
    hook._ended.add("abc")  # read to the end
    text, cursor = hook.get_job_logs(handle, cursor=f"{ahead}#1")
    assert text == "late line\n" and int(asked[0]["end"]) > int(asked[0]["start"]) == ahead
    assert cursor.startswith(str(ahead + 1))


# ----------------------------------------------------------------------------- 14: the server's verdict


def _facts(err_class: str | None, **facts: Any) -> FailureFacts:
    details = {"lepton_err_class": err_class, "lepton_suggestion": "Check the job's logs."}
    return FailureFacts(**{"raw_state": "Failed", **facts}, details=details)


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        # a program error whose log looks like a network fault: the server says program, not retried
        (_facts("ERR_PROGRAM", exit_code=1, log_tail=["NCCL WARN Connection reset by peer remote process exited"]),
         ErrClass.ERR_PROGRAM),
        # killed from outside (137, no OOM flag): the program did not end itself; the safe reading, a retry, wins
        # over a verdict that would fail the task for good; a retriable verdict is followed
        (_facts("ERR_PROGRAM", exit_code=137), ErrClass.ERR_UNKNOWN),
        (_facts("ERR_PROGRAM", exit_code=143), ErrClass.ERR_UNKNOWN),
        (_facts("ERR_INFRA", exit_code=137), ErrClass.ERR_INFRA),
        # an unhealthy node under an exit code 1: the server says infrastructure, retried
        (_facts("ERR_INFRA", exit_code=1), ErrClass.ERR_INFRA),
        # stronger facts keep their class
        (_facts("ERR_PROGRAM", oom_killed=True, exit_code=137), ErrClass.ERR_OOM),
        (_facts("ERR_PROGRAM", raw_state="Evicted", exit_code=137), ErrClass.ERR_PREEMPTED),
        (_facts("ERR_INFRA", raw_state="ImagePullFailed"), ErrClass.ERR_IMAGE_PULL),
        (_facts("ERR_INFRA", exit_code=1, log_tail=[FAILURE_PREFIX + '{"err_class": "ERR_CONFIG", "message": "m"}']),
         ErrClass.ERR_CONFIG),
        (_facts("ERR_INFRA", canceled=True), ErrClass.ERR_CANCELED),
        # no verdict, or a word that is no class: the facts decide
        (_facts(None, exit_code=1), ErrClass.ERR_PROGRAM),
        (_facts("OOM", exit_code=137), ErrClass.ERR_UNKNOWN),
    ],
)  # fmt: skip
def test_the_servers_err_class_is_the_tasks_unless_stronger_facts_say_otherwise(
    facts: FailureFacts, expected: ErrClass
) -> None:
    result = ls.follow_server_verdict(classify(facts), facts)
    assert result.err_class is expected and result.retriable is expected.retriable


def test_the_hooks_failure_analysis_follows_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = lp.LeptonHook(conn_id="tao_lepton_x")
    facts = _facts("ERR_PROGRAM", exit_code=1, log_tail=["NCCL WARN Connection reset by peer remote process exited"])
    monkeypatch.setattr(hook, "get_job_status", lambda h: JobStatus(JobState.ERROR, "failed", raw_state="Failed"))
    monkeypatch.setattr(hook, "failure_facts", lambda h: facts)
    analysis = hook.get_failure_analysis(JobHandle("lepton", "c", "abc", "n"))
    assert analysis is not None and analysis.err_class is ErrClass.ERR_PROGRAM and not analysis.retriable
    assert analysis.evidence[0] == "Lepton's failure analysis: ERR_PROGRAM: Check the job's logs"


# ----------------------------------------------------------------------------- 10: absent from one list is not gone


def test_jobs_missing_from_the_list_beyond_the_lookup_budget_are_unknown_not_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A page missed by the list (a cap, a shift while paging): every job not in it is looked up, at most
    ``MISSING_LOOKUPS_PER_POLL`` per poll; the rest are Unknown this poll -- never "no longer exists"."""
    hook = lp.LeptonHook(conn_id="tao_lepton_x")
    hook._extras = {"workspace_id": "ws1"}
    jobs = {f"job-{i}": _model_job("Running", ready=1, active=1, parallelism=1, age=60) for i in range(25)}
    for key, job in jobs.items():
        job["metadata"]["labels"] = {ls.LABEL_JOB_ID: key}
    monkeypatch.setattr(hook, "_list_jobs", lambda selector, mode="alive_only", wanted=(): [])
    monkeypatch.setattr(hook, "_get_job", lambda backend_id: jobs[backend_id])
    handles = [JobHandle("lepton", "c", key, key, backend_job_id=key) for key in jobs]
    statuses = hook.get_job_statuses(handles)
    assert not any(s.not_found for s in statuses.values())
    assert sum(s.state is JobState.RUNNING for s in statuses.values()) == 20


# ----------------------------------------------------------------------------- issue 22, hole 7: a job being deleted


@pytest.mark.parametrize("ending", ["Deleting", "Terminating"])
def test_a_job_being_deleted_is_not_this_tasks_running_job(monkeypatch: pytest.MonkeyPatch, ending: str) -> None:
    """Neither found (a new try would watch it vanish) nor "already runs" at submission: a new job is posted."""
    hook = lp.LeptonHook(conn_id="tao_lepton_x")
    hook._extras = {"workspace_id": "ws1"}
    dying = _model_job(ending, ready=0, active=0, parallelism=1, age=600)
    dying["metadata"]["labels"] = {ls.LABEL_JOB_ID: "old", ls.LABEL_NAME: "train-0123456789"}
    monkeypatch.setattr(hook, "_jobs_named", lambda name: [dying])
    monkeypatch.setattr(hook, "_secret_names", lambda: [])
    monkeypatch.setattr(hook, "_console_url", lambda backend_id: "")
    assert hook.find_job("train-0123456789") is None
    posted: list[str] = []
    monkeypatch.setattr(hook, "validate_spec", lambda spec: None)
    monkeypatch.setattr(hook, "placement", lambda spec: lpl.Placement("cpu.small", 0))
    monkeypatch.setattr(hook, "_channel", lambda spec: lp.FilesChannel("env"))
    monkeypatch.setattr(hook, "_labels_patchable", lambda: True)
    monkeypatch.setattr(hook, "_job_body", lambda spec, handle, **kw: spec.name)
    monkeypatch.setattr(hook, "_post_job", lambda body, spec: posted.append(body) or "train-0123456789")
    monkeypatch.setattr(hook, "_delete_job", lambda *a: pytest.fail("a job being deleted is deleted again"))
    spec = JobSpec(name="train-0123456789", job_id="new", command="x", image="i")
    handle = hook.create_job(spec)
    assert posted == ["train-0123456789"] and handle.job_id == "new"
