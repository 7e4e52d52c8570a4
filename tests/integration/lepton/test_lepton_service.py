"""LeptonHook against the fake's modes for what the real Lepton server does that is not knowable here (issue 21):
which node-group key ``GET /shapes`` filters by, whether a job page is capped below the asked size, what
``status.ready`` counts on a Running job (and its dips), whether events carry a message; and over the wire, the
queue priority, the server's err_class, a cancel through an outage and the reaping of secrets no job reads (issue
22, holes 6 and 7). The hook talks to the fake only through the real ``leptonai`` client. Jobs here are created
``stopped`` (no replica runs) or on a simulated server, so no container starts.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from leptonai.api.v2.types.job import LeptonJob
from leptonai.api.v2.types.secret import SecretItem

from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.hooks.lepton import LeptonHook
from airflow_provider_tao.hooks.lepton import status as ls
from airflow_provider_tao.hooks.ownership import CancelOutcome
from airflow_provider_tao.jobs import JobHandle, JobSpec, JobState
from tests.integration.lepton.conftest import CONN_ID, NODE_GROUP, LeptonFake, lepton_connection
from tests.integration.lepton.test_leptonfake import configured, group_ids, wait_for

pytestmark = pytest.mark.integration

SIM_CONN = "tao_lepton_sim"


def _managed(name: str, job_id: str, *, client: Any, group: str = "ng-plain", **spec: Any) -> LeptonJob:
    """A job labelled as the hook labels its own (what its label queries find)."""
    labels = {ls.LABEL_MANAGED: "true", ls.LABEL_JOB_ID: job_id, ls.LABEL_NAME: name, **spec.pop("labels", {})}
    body = {
        "resource_shape": spec.pop("resource_shape", "cpu.small"),
        "affinity": {"allowed_dedicated_node_groups": [group_ids(client)[group]]},
        "container": {"image": "nvcr.io/nvidia/tao/tao-toolkit:6", "command": ["python3", "train.py"]},
        **spec,
    }
    return LeptonJob(metadata={"id": name, "name": name, "labels": labels}, spec=body)


# ----------------------------------------------------------------------------- 9: shapes by node-group id or name


@pytest.mark.parametrize("shape_filter", ["id", "name"])
def test_shapes_are_found_whichever_node_group_key_the_server_filters_by(
    lepton_fake: LeptonFake, shape_filter: str
) -> None:
    client = lepton_fake.client()
    ng_id = group_ids(client)[NODE_GROUP]
    with configured(lepton_fake, shape_filter=shape_filter):
        by_id, by_name = client.shapes.list_shapes(ng_id, "job"), client.shapes.list_shapes(NODE_GROUP, "job")
        assert (bool(by_id), bool(by_name)) == (shape_filter == "id", shape_filter == "name"), "the mode holds"
        hook = LeptonHook(CONN_ID)
        assert "gpu.8xh100-80gb" in hook.list_resource_shapes(NODE_GROUP)
        spec = JobSpec(name="shape-0123456789", job_id=uuid.uuid4().hex[:12], command="x", image="i", gpu_count=8)
        placement = hook.placement(spec)
        assert (placement.shape, placement.node_group_id) == ("gpu.8xh100-80gb", ng_id)


# ----------------------------------------------------------------------------- 10: a page cap below the asked size


@pytest.fixture
def five_live_jobs(lepton_fake: LeptonFake) -> Iterator[list[tuple[str, str]]]:
    """Five of the hook's jobs, alive (Stopped: nothing runs), as ``(backend id, job_id)``."""
    client = lepton_fake.client()
    made = []
    for _ in range(5):
        job_id = uuid.uuid4().hex[:12]
        name = f"page-{job_id[:8]}"
        made.append((client.job.create(_managed(name, job_id, client=client, stopped=True)).metadata.id_, job_id))
    yield made
    for backend_id, _ in made:
        client.job.delete(backend_id)


@pytest.mark.parametrize("page_cap", [0, 2])
def test_a_capped_page_hides_no_job_and_the_mark_sweep_keeps_every_live_jobs_marks(
    lepton_fake: LeptonFake, five_live_jobs: list[tuple[str, str]], page_cap: int
) -> None:
    client = lepton_fake.client()
    gone = uuid.uuid4().hex[:12]
    marks = [f"tao.{job_id}.mark.owner_try.1" for _, job_id in five_live_jobs] + [f"tao.{gone}.mark.owner_try.1"]
    client.secret.create([SecretItem(name=name, value="1") for name in marks])
    with configured(lepton_fake, page_cap=page_cap):
        assert len(client.job.list_all(query=f"{ls.LABEL_MANAGED}=true", page=1, page_size=500)) <= (page_cap or 500)
        hook = LeptonHook(CONN_ID)
        listed = {ls.labels_of(j).get(ls.LABEL_JOB_ID) for j in hook._list_jobs(f"{ls.LABEL_MANAGED}=true")}
        assert {job_id for _, job_id in five_live_jobs} <= listed
        hook._sweep_orphan_marks()
    left = {s.name for s in client.secret.list_all()}
    assert set(marks[:-1]) <= left, "a live job's marks were swept"
    assert marks[-1] not in left, "the marks of a job that does not exist stay"


@pytest.mark.parametrize("page_cap", [0, 2])
def test_a_poll_stops_paging_once_every_watched_job_was_seen_and_finds_those_on_later_pages(
    lepton_fake: LeptonFake, five_live_jobs: list[tuple[str, str]], page_cap: int
) -> None:
    """The poll's list needs no empty page when every job it watches is listed (one request, not two); a watched
    job on a later page of a capped list is still found (the pages go on until it is seen or a page is empty)."""
    hook = LeptonHook(CONN_ID)
    selector = f"{ls.LABEL_MANAGED}=true"
    with configured(lepton_fake, page_cap=page_cap):
        first_page = lepton_fake.client().job.list_all(query=selector, page=1, page_size=500)
        on_first = [(j.metadata.labels or {}).get(ls.LABEL_JOB_ID) for j in first_page]
        lepton_fake.stats(reset=True)
        hook._list_jobs(selector, wanted=[job_id for job_id in on_first if job_id][:1])
        assert lepton_fake.stats()["by"] == {"GET /jobs": 1}
        lepton_fake.stats(reset=True)
        everyone = [job_id for _, job_id in five_live_jobs]
        listed = {ls.labels_of(j).get(ls.LABEL_JOB_ID) for j in hook._list_jobs(selector, wanted=everyone)}
        assert set(everyone) <= listed
        assert lepton_fake.stats()["by"]["GET /jobs"] <= (-(-len(listed) // page_cap) if page_cap else 1)


# ----------------------------------------------------------------------------- 8: ready dips on a Running job


@pytest.fixture(scope="module")
def lepton_sim_fast(lepton_fake_factory: Callable[..., LeptonFake]) -> LeptonFake:
    """A simulated workspace whose replicas run 6 s and turn ready at once."""
    settings = {"sim_seconds": 6, "start_seconds": 0, "ready_seconds": 0}
    return lepton_fake_factory("--sim", "--config", json.dumps({"settings": settings}))


@pytest.mark.parametrize("ready_counts", ["running", "succeeded_too"])
def test_a_running_job_whose_ready_dips_is_never_a_start_failure_nor_deleted(
    lepton_sim_fast: LeptonFake, monkeypatch: pytest.MonkeyPatch, ready_counts: str
) -> None:
    """Two workers: worker 1 ends first (at 1 s), worker 0 goes unready for 2 s (from 2 s); the start bound is 1 s.
    A watching hook and a new hook at every poll (a triggerer restart each time) see Running, then Complete, and
    the cleanup of a new hook leaves the job alone."""
    fake = lepton_sim_fast
    monkeypatch.setenv(f"AIRFLOW_CONN_{SIM_CONN.upper()}", lepton_connection(fake))
    client = fake.client()
    job_id, name = uuid.uuid4().hex[:12], f"dip-{uuid.uuid4().hex[:8]}"
    with configured(fake, ready_counts=ready_counts):
        fake.inject("exit", name=name, replica=1, code=0, after_seconds=1)
        fake.inject("unready", name=name, replica=0, after_seconds=2, seconds=2)
        labels = {ls.LABEL_START: "1"}
        body = _managed(name, job_id, client=client, group=NODE_GROUP, resource_shape="gpu.1xh100-80gb",
                        completions=2, parallelism=2, labels=labels)  # fmt: skip
        backend_id = client.job.create(body).metadata.id_
        handle = JobHandle("lepton", SIM_CONN, job_id, name, backend_job_id=backend_id, submitted_at=time.time())
        watching = LeptonHook(SIM_CONN)
        seen: list[tuple[str, int]] = []
        while not seen or seen[-1][0] not in ("Complete", "Error", "Canceled"):
            job = client.job.get(backend_id)
            for hook in (watching, LeptonHook(SIM_CONN)):
                status = hook.get_job_status(handle)
                assert status.state is not JobState.ERROR, f"{status} (ready {job.status.ready}/2)"
                seen.append((status.state.value, int(job.status.ready or 0)))
            if job.status.state.value == "Running" and int(job.status.ready or 0) < 2:
                LeptonHook(SIM_CONN).cleanup_job(handle)
                # the job may complete between the read above and the cleanup (a loaded machine, issue 35): then
                # deleting it is right; a live one never goes (the fake records a completion only for a job that
                # ran to its end)
                if client.job.get(backend_id).status.state.value != "Running":
                    assert fake.job_named(name)[-1]["completion_time"] is not None, "cleanup deleted a live job"
                    break
            time.sleep(0.3)
        ended = seen[-1][0] == "Complete" or fake.job_named(name)[-1]["completion_time"] is not None
        assert ended, seen
        assert any(state == "Running" and ready < 2 for state, ready in seen), f"no dip was seen: {seen}"
    wait_for(lambda: fake.job_named(name)[-1]["completion_time"] is not None, "the job completed")


# ----------------------------------------------------------------------------- 13, 14: events and the server's verdict


@pytest.mark.parametrize("event_message", [True, False])
def test_a_program_error_follows_the_servers_verdict_whether_events_carry_a_message(
    lepton_sim_fast: LeptonFake, monkeypatch: pytest.MonkeyPatch, event_message: bool
) -> None:
    """``LeptonEvent`` models no message: whether the server sends one is unknown. Either way the events stay
    evidence, and the failure analysis' ``err_class`` (ERR_PROGRAM: not retried) is the task's."""
    fake = lepton_sim_fast
    monkeypatch.setenv(f"AIRFLOW_CONN_{SIM_CONN.upper()}", lepton_connection(fake))
    client = fake.client()
    job_id, name = uuid.uuid4().hex[:12], f"exit-{uuid.uuid4().hex[:8]}"
    with configured(fake, event_message=event_message):
        fake.inject("exit", name=name, code=3, after_seconds=0.5)
        body = _managed(name, job_id, client=client, group=NODE_GROUP, resource_shape="gpu.1xh100-80gb")
        backend_id = client.job.create(body).metadata.id_
        fake.wait_state(backend_id, "Failed", timeout=30)
        handle = JobHandle("lepton", SIM_CONN, job_id, name, backend_job_id=backend_id, submitted_at=time.time() - 5)
        hook = LeptonHook(SIM_CONN)
        facts = hook.failure_facts(handle)
        analysis = hook.get_failure_analysis(handle)
    failed = [line for line in facts.events if line.startswith("event Failed")]
    assert failed and all(("exited with code 3" in line) is event_message for line in failed), facts.events
    assert analysis is not None and analysis.err_class.value == "ERR_PROGRAM" and not analysis.retriable
    assert analysis.details["lepton_err_class"] == "ERR_PROGRAM"
    client.job.delete(backend_id)


# ----------------------------------------------------------------------------- 11: queue priority


def test_a_priority_class_is_sent_canonical_and_only_to_a_quota_enabled_node_group(
    lepton_sim_fast: LeptonFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = lepton_sim_fast
    monkeypatch.setenv(f"AIRFLOW_CONN_{SIM_CONN.upper()}", lepton_connection(fake))
    job_id = uuid.uuid4().hex[:12]
    spec = JobSpec(name=f"prio-{job_id}", job_id=job_id, command="python3 train.py", image="nvcr.io/nvidia/tao:6",
                   gpu_count=1, backend_details={"priority_class": "high"})  # fmt: skip
    before = len(fake.jobs())
    with pytest.raises(JobValidationError, match=r"^backend_details\['priority_class'\]: node group ng-lustre"):
        LeptonHook(SIM_CONN).validate_spec(spec)
    assert len(fake.jobs()) == before and not fake.secrets()["user"]
    with configured(fake, world={"node_groups": {NODE_GROUP: {"quota_enabled": True}}}):
        hook = LeptonHook(SIM_CONN)
        handle = hook.create_job(spec)
        try:
            body = fake.job_named(handle.backend_job_id)[-1]["body"]
            assert body["spec"]["queue_config"] == {"priority_class": "high-7000"}
        finally:
            hook.cancel_job(handle)


# ----------------------------------------------------------------------------- issue 22, hole 7: a cancel that fails


def test_a_cancel_refused_by_a_short_outage_is_tried_again_until_the_job_is_deleted(
    lepton_sim_fast: LeptonFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = lepton_sim_fast
    monkeypatch.setenv(f"AIRFLOW_CONN_{SIM_CONN.upper()}", lepton_connection(fake))
    job_id = uuid.uuid4().hex[:12]
    spec = JobSpec(name=f"kill-{job_id}", job_id=job_id, command="python3 train.py", image="nvcr.io/nvidia/tao:6",
                   gpu_count=1)  # fmt: skip
    hook = LeptonHook(SIM_CONN)
    handle = hook.create_job(spec)
    fake.faults(503, seconds=2.5, route="DELETE /jobs/{id}")
    try:
        assert hook.cancel_job(handle) is CancelOutcome.STOPPED
    finally:
        fake.clear_faults()
    assert fake.job_named(handle.backend_job_id)[-1]["state"] in ("Deleting", "Deleted")
    assert not [n for n in fake.secrets()["user"] if n.startswith(f"tao.{job_id}.")]


# ----------------------------------------------------------------------------- issue 22, hole 6: secrets of no job


def test_the_reaper_deletes_the_secrets_of_a_submission_that_died_before_its_job_after_a_grace(
    lepton_sim_fast: LeptonFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed between creating a job's secrets and posting the job; a job that ended without its cleanup;
    a live job. The first sweep marks the orphan, a sweep past the grace deletes it; the ended job's secrets go at
    once; the live job's stay. A dry run deletes nothing."""
    fake = lepton_sim_fast
    monkeypatch.setenv(f"AIRFLOW_CONN_{SIM_CONN.upper()}", lepton_connection(fake, ngc_api_key="ngc-key"))
    client = fake.client()
    hook = LeptonHook(SIM_CONN)
    live_id, dead_id, ended_id = (uuid.uuid4().hex[:12] for _ in range(3))
    secret = {"AWS_SECRET": "s"}
    spec = JobSpec(f"live-{live_id}", live_id, "python3 train.py", image="nvcr.io/nvidia/tao:6", secret_env=secret)
    live = hook.create_job(spec)
    try:
        ended = f"ended-{ended_id[:8]}"
        fake.inject("exit", name=ended, code=3)
        client.job.create(_managed(ended, ended_id, client=client, group=NODE_GROUP, resource_shape="gpu.1xh100-80gb"))
        fake.wait_state(ended, "Failed", timeout=30)
        leftovers = {f"tao.{job_id}.env.AWS_SECRET" for job_id in (dead_id, ended_id)}
        client.secret.create([SecretItem(name=name, value="s") for name in leftovers])
        pull = {"metadata": {"name": f"tao-{dead_id}-pull"}, "spec": {"registry_server": "nvcr.io",
                "username": "$oauthtoken", "password": "ngc-key", "email": ""}}  # fmt: skip
        client.job._raise_if_not_ok(client.job._post("/imagepullsecrets", json=pull))

        def held() -> set[str]:
            users = set(fake.secrets()["user"])
            pulls = {f"pull:{n}" for n in fake.secrets()["image_pull"]}
            return {n for n in users | pulls if any(i in n for i in (live_id, dead_id, ended_id))}

        def actions(rows: list[dict[str, str]]) -> dict[str, str]:
            return {r["resource"].rsplit(" ", 1)[1]: r["action"] for r in rows if r["resource"].rsplit(" ", 1)[1]
                    in (live_id, dead_id, ended_id)}  # fmt: skip

        before = held()
        rows = hook.reap_resources(lambda ti: None, dry_run=True)
        assert actions(rows) == {dead_id: "would mark", ended_id: "would delete"}
        assert held() == before
        now = time.time()
        rows = hook.reap_resources(lambda ti: None, dry_run=False, now=now)
        assert actions(rows) == {dead_id: "kept", ended_id: "deleted"}
        assert not [n for n in held() if ended_id in n]
        assert {n for n in held() if dead_id in n} == {f"tao.{dead_id}.env.AWS_SECRET", f"pull:tao-{dead_id}-pull",
                                                       f"tao.{dead_id}.orphan-since.{int(now)}"}  # fmt: skip
        assert actions(hook.reap_resources(lambda ti: None, dry_run=False, now=now + 600)) == {dead_id: "kept"}
        later = hook.reap_resources(lambda ti: None, dry_run=False, now=now + 3601)
        assert actions(later) == {dead_id: "deleted"}
        assert held() == {n for n in before if live_id in n} and f"tao.{live_id}.env.AWS_SECRET" in held()
    finally:
        hook.cancel_job(live)


def test_two_sweeps_marking_one_orphan_in_the_same_second_both_finish(
    lepton_sim_fast: LeptonFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two reapers (a scheduled one beside a person's ``airflow tao reap``; found by the crash-point explorer, whose
    schedules each sweep once) list the same orphaned secrets; one marks them, the other marks them in the same
    second: that mark is already there (409), and the sweep goes on instead of failing."""
    fake = lepton_sim_fast
    monkeypatch.setenv(f"AIRFLOW_CONN_{SIM_CONN.upper()}", lepton_connection(fake))
    hook = LeptonHook(SIM_CONN)
    dead_id = uuid.uuid4().hex[:12]
    now = time.time()
    mark = f"tao.{dead_id}.orphan-since.{int(now)}"
    fake.client().secret.create([SecretItem(name=f"tao.{dead_id}.env.AWS_SECRET", value="s")])
    listed = hook._secrets_by_job()  # this sweep's listing, before the other sweep's mark
    fake.client().secret.create([SecretItem(name=mark, value="1")])  # the other sweep marks
    monkeypatch.setattr(hook, "_secrets_by_job", lambda: listed)
    rows = hook.reap_resources(lambda ti: None, dry_run=False, now=now)
    assert {r["action"] for r in rows if dead_id in r["resource"]} == {"kept"}
    assert mark in fake.secrets()["user"]


def test_a_cancel_of_an_ended_job_leaves_the_retrys_job_that_holds_its_id_running(
    lepton_sim_fast: LeptonFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the workspace makes a job's id from its name, a retry's job has the id of the ended job before it. A
    person's ``airflow tao cancel`` of the job Airflow's record still names (the old one, ended: the new try has not
    kept its record yet) must not stop the new job (found by the crash-point explorer: lepton flaky
    ``execute:create_job#2`` cli_cancel); the old job's secrets go."""
    fake = lepton_sim_fast
    monkeypatch.setenv(f"AIRFLOW_CONN_{SIM_CONN.upper()}", lepton_connection(fake))
    hook = LeptonHook(SIM_CONN)
    name = f"retry-{uuid.uuid4().hex[:8]}"
    old_id, new_id = (uuid.uuid4().hex[:12] for _ in range(2))
    old = hook.create_job(JobSpec(name, old_id, "train", image="nvcr.io/nvidia/tao:6", secret_env={"K": "v"}))
    fake.wait_state(old.backend_job_id, "Completed", timeout=30)
    new = hook.create_job(JobSpec(name, new_id, "train", image="nvcr.io/nvidia/tao:6"), try_number=2)
    try:
        assert new.backend_job_id == old.backend_job_id  # the id this test is about (the server's id mode "name")
        assert hook.cancel_job(old, requested_by="cli:jdoe") is CancelOutcome.ENDED
        (record,) = [j for j in fake.jobs() if j["labels"].get(ls.LABEL_JOB_ID) == new_id]
        assert not record["deleted"] and record["state"] in ("Queueing", "Starting", "Running"), record["history"]
        assert hook.get_job_status(new).state.is_active
        assert not [n for n in fake.secrets()["user"] if n.startswith(f"tao.{old_id}.")]
    finally:
        hook.cancel_job(new)


def test_an_unknown_node_group_of_the_connection_is_refused_naming_the_connections_extra(
    lepton_fake: LeptonFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TAO_LEPTON_GONE", lepton_connection(lepton_fake, node_group="ng-gone"))
    spec = JobSpec(name="gone-0123456789", job_id=uuid.uuid4().hex[:12], command="x", image="i", gpu_count=0)
    before = len(lepton_fake.jobs())
    with pytest.raises(JobValidationError) as refused:
        LeptonHook("tao_lepton_gone").validate_spec(spec)
    assert refused.value.parameter == "connection 'tao_lepton_gone' extra node_group"
    assert "ng-lustre" in refused.value.problem and len(lepton_fake.jobs()) == before
