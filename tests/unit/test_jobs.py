"""The shared job vocabulary (``jobs.py``): state sets, failure classes and JSON round trips."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from airflow_provider_tao.jobs import (
    ACTIVE_STATES,
    RETRIABLE_CLASSES,
    TERMINAL_STATES,
    ErrClass,
    FailureAnalysis,
    JobHandle,
    JobSpec,
    JobState,
    JobStatus,
)

SECRET = "s3cr3t-Value-that-must-not-leak"


def _json_trip(data: dict) -> dict:
    """Through real JSON text: fails on anything that is not a JSON primitive (tuples, enums, bytes, ...)."""
    text = json.dumps(data, allow_nan=False)
    return json.loads(text)


# ----------------------------------------------------------------------------- JobState


def test_job_state_values_are_exactly_the_tao_sdk_words():
    assert [s.value for s in JobState] == [
        "Pending",
        "Running",
        "Paused",
        "Canceling",
        "Complete",
        "Error",
        "Canceled",
        "Unknown",
    ]
    assert JobState("Complete") is JobState.COMPLETE
    assert JobState.ERROR == "Error"  # a StrEnum compares equal to its word


def test_terminal_and_active_sets_partition_every_state_but_unknown():
    assert frozenset({JobState.COMPLETE, JobState.ERROR, JobState.CANCELED}) == TERMINAL_STATES
    assert frozenset({JobState.PENDING, JobState.RUNNING, JobState.PAUSED, JobState.CANCELING}) == ACTIVE_STATES
    assert not TERMINAL_STATES & ACTIVE_STATES
    assert set(JobState) - TERMINAL_STATES - ACTIVE_STATES == {JobState.UNKNOWN}


@pytest.mark.parametrize("state", list(JobState))
def test_is_terminal_and_is_active_follow_the_sets(state):
    assert state.is_terminal == (state in TERMINAL_STATES)
    assert state.is_active == (state in ACTIVE_STATES)


def test_unknown_is_neither_terminal_nor_active():
    # Unknown = the backend could not be asked; it must never end a watch as a failure by itself.
    assert not JobState.UNKNOWN.is_terminal
    assert not JobState.UNKNOWN.is_active


# ----------------------------------------------------------------------------- ErrClass


def test_err_class_names_are_their_values():
    for err in ErrClass:
        assert err.value == err.name
    required = {
        "ERR_PROGRAM",
        "ERR_OOM",
        "ERR_CONFIG",
        "ERR_INFRA",
        "ERR_PREEMPTED",
        "ERR_CAPACITY",
        "ERR_IMAGE_PULL",
        "ERR_AUTH",
        "ERR_TIMEOUT",
        "ERR_UNKNOWN",
    }
    assert required <= {e.value for e in ErrClass}


@pytest.mark.parametrize("err", [ErrClass.ERR_PROGRAM, ErrClass.ERR_OOM, ErrClass.ERR_CONFIG])
def test_program_oom_and_config_errors_are_not_retriable(err):
    assert not err.retriable
    assert err not in RETRIABLE_CLASSES


@pytest.mark.parametrize("err", [ErrClass.ERR_INFRA, ErrClass.ERR_PREEMPTED, ErrClass.ERR_CAPACITY])
def test_infra_preemption_and_capacity_are_retriable(err):
    assert err.retriable
    assert err in RETRIABLE_CLASSES


def test_retriable_property_matches_the_set_for_every_class():
    for err in ErrClass:
        assert err.retriable == (err in RETRIABLE_CLASSES)


# ----------------------------------------------------------------------------- JobSpec


def _full_spec(**overrides) -> JobSpec:
    values = {
        "name": "train-abc123",
        "job_id": "0123456789ab",
        "command": ["python", "train.py", "--epochs", "3"],
        "image": "nvcr.io/nvidia/tao/tao-toolkit:6.26.3-pyt",
        "gpu_count": -1,
        "num_nodes": 2,
        "env": {"EPOCHS": "3", "EMPTY": ""},
        "secret_env": {"HF_TOKEN": SECRET, "AWS_SECRET_ACCESS_KEY": SECRET + "2"},
        "files": {"spec.yaml": b"a: 1\n", "sub/dir.txt": b"x"},
        "backend_details": {"partition": "gpu", "nested": {"mem_limit": "8g", "list": [1, 2.5, None, True]}},
        "results_uri": "/results/here",
        "deadline": 1_800_000_000.25,
    }
    values.update(overrides)
    return JobSpec(**values)


def test_spec_to_json_never_contains_secret_values():
    spec = _full_spec()
    data = spec.to_json()
    text = json.dumps(data)
    assert SECRET not in text
    assert SECRET + "2" not in text
    # The names survive (so a reader knows which secrets the job had), the values do not.
    assert data["secret_env"] == {"HF_TOKEN": "***", "AWS_SECRET_ACCESS_KEY": "***"}
    # ... and the object itself still holds them for the platform.
    assert spec.secret_env["HF_TOKEN"] == SECRET


def test_spec_repr_hides_secret_values():
    assert SECRET not in repr(_full_spec())
    assert SECRET not in str(_full_spec())


def test_spec_to_json_does_not_mutate_the_spec():
    spec = _full_spec()
    data = spec.to_json()
    data["env"]["EPOCHS"] = "99"
    data["backend_details"]["nested"]["mem_limit"] = "1g"
    assert spec.env["EPOCHS"] == "3"
    assert spec.backend_details["nested"]["mem_limit"] == "8g"


def test_spec_round_trips_through_json_text_without_secrets():
    spec = _full_spec(secret_env={})
    data = _json_trip(spec.to_json())
    assert data["files"] == {"spec.yaml": 5, "sub/dir.txt": 1}  # sizes only: file contents are never stored
    again = JobSpec.from_json(data)
    assert again == replace(spec, files={})
    assert again.command == ["python", "train.py", "--epochs", "3"]
    assert again.backend_details["nested"]["list"] == [1, 2.5, None, True]


def test_spec_round_trip_keeps_secret_names_but_masks_values():
    spec = _full_spec()
    again = JobSpec.from_json(_json_trip(spec.to_json()))
    assert again.secret_env == {"HF_TOKEN": "***", "AWS_SECRET_ACCESS_KEY": "***"}
    # everything else is intact
    assert again == _full_spec(secret_env={"HF_TOKEN": "***", "AWS_SECRET_ACCESS_KEY": "***"}, files={})


@pytest.mark.parametrize("command", ["echo 'a b' \"$HOME\" {x}\nsecond line", ["/bin/echo", "{x}", "$HOME"]])
def test_spec_command_string_or_argv_round_trips_verbatim(command):
    spec = JobSpec(name="n", job_id="j", command=command)
    assert JobSpec.from_json(_json_trip(spec.to_json())).command == command


def test_spec_defaults():
    spec = JobSpec(name="n", job_id="j", command="true")
    assert (spec.image, spec.gpu_count, spec.num_nodes) == (None, 1, 1)
    assert spec.env == {} and spec.secret_env == {} and spec.files == {} and spec.backend_details == {}
    assert spec.results_uri is None and spec.deadline is None
    assert JobSpec.from_json(spec.to_json()) == spec


def test_spec_from_json_ignores_unknown_keys():
    data = {**JobSpec(name="n", job_id="j", command="true").to_json(), "added_in_v9": {"x": 1}, "priority": 5}
    spec = JobSpec.from_json(data)
    assert spec == JobSpec(name="n", job_id="j", command="true")


def test_spec_from_json_missing_required_key_is_an_error():
    with pytest.raises(TypeError):
        JobSpec.from_json({"name": "n", "command": "true"})  # no job_id


# ----------------------------------------------------------------------------- JobHandle


def _handle(**overrides) -> JobHandle:
    values = {
        "platform": "local",
        "conn_id": "tao_local_default",
        "job_id": "0123456789ab",
        "name": "train-abc123",
        "backend_job_id": "4242",
        "results_dir": "/results/0123456789ab",
        "try_number": 3,
        "submitted_at": 1_790_000_000.5,
        "console_url": "file:///jobs/0123456789ab/job.log",
    }
    values.update(overrides)
    return JobHandle(**values)


def test_handle_round_trips_through_json_text():
    handle = _handle()
    data = handle.to_json()
    assert data == _json_trip(data)
    assert JobHandle.from_json(_json_trip(data)) == handle


def test_handle_with_no_connection_round_trips():
    handle = _handle(conn_id=None)
    assert JobHandle.from_json(_json_trip(handle.to_json())) == handle
    assert handle.to_json()["conn_id"] is None


def test_handle_to_json_has_every_field_as_a_primitive():
    data = _handle().to_json()
    assert set(data) == {
        "platform",
        "conn_id",
        "job_id",
        "name",
        "backend_job_id",
        "results_dir",
        "try_number",
        "submitted_at",
        "console_url",
    }
    for value in data.values():
        assert value is None or type(value) in (str, int, float)


def test_handle_from_json_ignores_unknown_keys():
    data = {**_handle().to_json(), "submitter_pid": 123, "submitter_host": "worker-1"}  # as in local meta.json
    assert JobHandle.from_json(data) == _handle()


def test_handle_from_json_fills_defaults_for_missing_optional_keys():
    handle = JobHandle.from_json({"platform": "local", "conn_id": None, "job_id": "j", "name": "n"})
    assert handle.try_number == 1
    assert handle.backend_job_id == ""
    assert handle.results_dir == ""
    assert isinstance(handle.submitted_at, float)


def test_handle_owned_by_changes_only_the_try():
    handle = _handle(try_number=1)
    taken = handle.owned_by(2)
    assert taken.try_number == 2
    assert handle.try_number == 1  # frozen: the original is unchanged
    assert {**taken.to_json(), "try_number": 1} == handle.to_json()


def test_handle_is_frozen():
    with pytest.raises(AttributeError):
        _handle().job_id = "other"  # type: ignore[misc]


# ----------------------------------------------------------------------------- JobStatus


@pytest.mark.parametrize("state", list(JobState))
def test_status_round_trips_for_every_state(state):
    status = JobStatus(state=state, message="m", exit_code=-9, raw_state="RAW", updated_at=12.5)
    data = status.to_json()
    assert data["state"] == state.value
    assert type(data["state"]) is str  # the plain word, not an enum member
    again = JobStatus.from_json(_json_trip(data))
    assert again == status
    assert again.state is state


def test_status_from_json_ignores_unknown_keys():
    data = {"state": "Running", "message": "", "exit_code": None, "raw_state": "R", "updated_at": 1.0, "node": "n1"}
    assert JobStatus.from_json(data) == JobStatus(JobState.RUNNING, "", None, "R", 1.0)


def test_status_from_json_rejects_an_unknown_state_word():
    with pytest.raises(ValueError):
        JobStatus.from_json({"state": "Exploded"})


def test_status_unknown_helper():
    status = JobStatus.unknown("ssh timed out")
    assert status.state is JobState.UNKNOWN
    assert status.message == "ssh timed out"
    assert status.exit_code is None


# ----------------------------------------------------------------------------- FailureAnalysis


@pytest.mark.parametrize("err", list(ErrClass))
def test_failure_analysis_round_trips_for_every_class(err):
    analysis = FailureAnalysis(
        err_class=err,
        retriable=err.retriable,
        suggestion="do something",
        evidence=["line 1", "RuntimeError: CUDA error: out of memory"],
        details={"exit_code": 1, "signal": None, "node": "n1", "raw_state": "FAILED"},
    )
    data = analysis.to_json()
    assert data["err_class"] == err.value and type(data["err_class"]) is str
    again = FailureAnalysis.from_json(_json_trip(data))
    assert again == analysis
    assert again.err_class is err


def test_failure_analysis_from_json_ignores_unknown_keys():
    data = {"err_class": "ERR_OOM", "retriable": False, "suggestion": "s", "evidence": [], "details": {}, "v2": 1}
    assert FailureAnalysis.from_json(data) == FailureAnalysis(ErrClass.ERR_OOM, False, "s")


def test_failure_analysis_summary_names_the_class_literally():
    not_retriable = FailureAnalysis(ErrClass.ERR_PROGRAM, False, "Fix the code.")
    assert not_retriable.summary().startswith("ERR_PROGRAM ")
    assert "not retriable" in not_retriable.summary()
    assert "Fix the code." in not_retriable.summary()
    retriable = FailureAnalysis(ErrClass.ERR_INFRA, True, "Retry.")
    assert retriable.summary().startswith("ERR_INFRA ")
    assert "not retriable" not in retriable.summary()
    assert "retriable" in retriable.summary()
