"""LeptonHook against the fake's modes for three things leptonai 0.47.1 reads in more than one form (issue 32
points 1, 4, 8): log values with or without metadata (``cli/log.py`` ``_parse_log_entries``), job times in s, ms,
µs or ns (``_preprocess_time``), and replica ids that are not ``<job id>-<index>-<suffix>`` (``lep job log`` takes
the first replica listed). One simulated job, read in every mode: no container starts."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable

import pytest

from airflow_provider_tao.hooks.lepton import LeptonHook
from airflow_provider_tao.jobs import JobHandle
from tests.integration.lepton.conftest import NODE_GROUP, LeptonFake, lepton_connection
from tests.integration.lepton.test_lepton_service import _managed
from tests.integration.lepton.test_leptonfake import configured

pytestmark = pytest.mark.integration

CONN = "tao_lepton_fidelity"


@pytest.fixture(scope="module")
def lepton_short(lepton_fake_factory: Callable[..., LeptonFake]) -> LeptonFake:
    """A simulated workspace whose replicas run 3 s (three ``step N`` lines each), ids without an index."""
    settings = {"sim_seconds": 3, "start_seconds": 0, "ready_seconds": 0, "replica_ids": "opaque"}
    return lepton_fake_factory("--sim", "--config", json.dumps({"settings": settings}))


def test_logs_times_and_replica_ids_read_in_every_form_the_client_reads(
    lepton_short: LeptonFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = lepton_short
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN.upper()}", lepton_connection(fake))
    client = fake.client()
    job_id, name = uuid.uuid4().hex[:12], f"fid-{uuid.uuid4().hex[:8]}"
    body = _managed(name, job_id, client=client, group=NODE_GROUP, resource_shape="gpu.1xh100-80gb",
                    completions=2, parallelism=2)  # fmt: skip
    submitted = time.time()
    backend_id = client.job.create(body).metadata.id_
    record = fake.wait_state(backend_id, "Completed", timeout=60)
    handle = JobHandle("lepton", CONN, job_id, name, backend_job_id=backend_id, submitted_at=submitted)
    replicas = [r.metadata.id_ for r in client.job.get_replicas(backend_id)]
    assert all(r.count("-") == backend_id.count("-") + 1 for r in replicas), replicas  # no index in the ids
    for log_values in ("pair", "triple"):
        with configured(fake, log_values=log_values):
            hook = LeptonHook(CONN)
            text, _ = hook.get_job_logs(handle, tail=100)
            assert hook._rank0_replica(handle) == replicas[0]
        assert "step 1" in text, (log_values, text)
    ends = []
    for time_unit in ("s", "ms", "us", "ns"):
        with configured(fake, time_unit=time_unit):
            usage = LeptonHook(CONN).get_job_usage(handle)
        assert usage.ended_at is not None and usage.started_at is not None, (time_unit, usage)
        assert submitted - 1 <= usage.started_at <= usage.ended_at <= time.time() + 1, (time_unit, usage)
        ends.append(usage.ended_at)
    assert max(ends) - min(ends) < 1.0, ends  # the same instant whatever the unit (s loses the fraction)
    assert record["state"] == "Completed"
    client.job.delete(backend_id)
