"""What the Lepton hook reads as leptonai 0.47.1 reads it (issue 32 points 1, 4 and 8): log values with or without
their metadata, job times in s / ms / µs / ns, the replica whose log is the job's when replica ids are not
``<job id>-<index>-<suffix>``, and user-secret names the client's strictest rule accepts."""

from __future__ import annotations

import time
from typing import Any

import pytest

from airflow_provider_tao.accounting import attempt_of
from airflow_provider_tao.hooks.lepton import hook as lp
from airflow_provider_tao.hooks.lepton import status as ls
from airflow_provider_tao.hooks.lepton.api import mark_prefix, pull_secret_name
from airflow_provider_tao.jobs import JobHandle
from tests.unit.test_hooks_lepton_service import NOW, _model_job, _model_replica

# ----------------------------------------------------------------------------- 1: log values with metadata


@pytest.mark.parametrize("metadata", [None, {}, {"level": "info", "stream": "stdout"}])
def test_log_values_with_or_without_their_metadata_read_alike(metadata: dict[str, str] | None) -> None:
    """``_parse_log_entries`` (leptonai ``cli/log.py``) takes ``[ts_ns, line]`` and ``[ts_ns, line, metadata]``."""
    pair = [["1800000000000000001", "step 1\n"], ["1800000000000000002", "step 2"]]
    values = pair if metadata is None else [[*v, metadata] for v in pair]
    data = {"data": {"result": [{"stream": {"replica": "r"}, "values": values}]}}
    assert ls.log_lines(data) == [("1800000000000000001", "step 1"), ("1800000000000000002", "step 2")]


# ----------------------------------------------------------------------------- 4: times in s, ms, µs, ns


@pytest.mark.parametrize("unit", [1, 10**3, 10**6, 10**9])
def test_job_times_in_any_unit_the_cli_reads_give_the_same_gpu_hours(unit: int) -> None:
    """``_preprocess_time`` reads a job's ``creation_time`` / ``completion_time`` as s, ms, µs or ns by magnitude;
    a µs or ns ``completion_time`` read as ms put the end thousands of years ahead."""
    job = _model_job("Completed", ready=0, active=0, parallelism=1, age=3600)
    job["metadata"].pop("created_at")
    job["status"]["creation_time"] = int(NOW - 3600) * unit
    job["status"]["completion_time"] = int(NOW - 60) * unit
    replicas = [_model_replica(0, int((NOW - 3000) * 1000), "node-a")]
    usage = ls.usage_of(job, replicas, {"gpus": 8, "gpu_type": "H100"})
    assert (usage.queued_at, usage.started_at, usage.ended_at) == (int(NOW - 3600), NOW - 3000, int(NOW - 60))
    handle = JobHandle("lepton", "c", "abc", "train", backend_job_id="train", submitted_at=NOW - 3600)
    attempt = attempt_of(handle, usage, outcome="success", reason="", try_number=1, requested_gpus=8,
                         requested_nodes=1, now=NOW)  # fmt: skip
    assert attempt.gpu_hours == pytest.approx(8 * (3000 - 60) / 3600)


# ----------------------------------------------------------------------------- 8: replica ids, secret names


def _replicas_hook(monkeypatch: pytest.MonkeyPatch, ids: list[str]) -> lp.LeptonHook:
    hook = lp.LeptonHook(conn_id="tao_lepton_x")
    monkeypatch.setattr(hook, "get_job_replicas", lambda handle: [{"metadata": {"id": i}, "id": i} for i in ids])
    return hook


@pytest.mark.parametrize(
    ("ids", "rank0"),
    [
        (["train-1-zzzzz", "train-0-abcde"], "train-0-abcde"),  # indexed: found by its index
        (["train-qx81m", "train-aa0b2"], "train-qx81m"),  # not indexed: the first listed, as `lep job log` picks
    ],
)
def test_the_log_replica_is_index_0_else_the_first_the_server_lists(
    monkeypatch: pytest.MonkeyPatch, ids: list[str], rank0: str
) -> None:
    handle = JobHandle("lepton", "tao_lepton_x", "abc", "train", backend_job_id="train", submitted_at=time.time())
    assert _replicas_hook(monkeypatch, ids)._rank0_replica(handle) == rank0


def test_every_secret_name_of_a_submission_passes_the_clients_strictest_rule() -> None:
    """The client shows one rule for a secret name: ``lep job create --secret NAME`` makes it an environment
    variable name (``spec_utils.validate_environment_variable_name``: letters, digits, '-', '_', '.'; not a
    reserved ``LEPTON_`` name). Every name a submission creates passes it, whatever the variable."""
    from leptonai.api.v2.spec_utils import validate_environment_variable_name

    job_id = "0123456789ab"
    refs = lp._secret_refs(job_id, {"AWS_SECRET_ACCESS_KEY": "x", "hf_token": "y", "_X1": "z"}, _Channel())
    names = [*refs.values(), f"{mark_prefix(job_id)}owner", pull_secret_name(job_id)]
    for name in names:
        validate_environment_variable_name(name, is_secret=True)
        assert not name.upper().startswith("LEPTON_"), name


class _Channel:
    env: dict[str, Any] = {"TAO_FILES_PART_0": "p"}
