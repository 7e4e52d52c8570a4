"""The failure taxonomy (``failures.py``): every rule of ``classify`` and the order in which they apply."""

from __future__ import annotations

import json
import signal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_tao.failures import (
    RUNNER_FAILURE_PREFIX,
    SUGGESTIONS,
    FailureFacts,
    classify,
    runner_verdict,
    signal_of,
)
from airflow_provider_tao.jobs import ErrClass, FailureAnalysis

CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.15 GiB of which 1.06 GiB is free."
)
CUDA_ERROR_OOM = "RuntimeError: CUDA error: out of memory"
DEVICE_ASSERT = "RuntimeError: CUDA error: device-side assert triggered"
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."
NCCL = "node1:123:456 [0] NCCL WARN Call to recv from 10.0.0.2<5678> failed : Connection reset by peer"
NCCL_SYSTEM = "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"


def _verdict(err_class: str, message: str) -> str:
    return RUNNER_FAILURE_PREFIX + json.dumps({"err_class": err_class, "message": message})


def classify_(**facts) -> FailureAnalysis:
    return classify(FailureFacts(**facts))


def _assert_well_formed(analysis: FailureAnalysis) -> None:
    assert isinstance(analysis, FailureAnalysis)
    assert analysis.retriable == analysis.err_class.retriable
    assert SUGGESTIONS[analysis.err_class] in analysis.suggestion
    assert all(isinstance(line, str) for line in analysis.evidence)
    json.dumps(analysis.to_json())  # JSON primitives only


# ----------------------------------------------------------------------------- signal_of


@pytest.mark.parametrize(
    ("exit_code", "expected"),
    [
        (None, None),
        (0, None),
        (1, None),
        (2, None),
        (127, None),
        (128, None),  # 128 + 0 is no signal
        (137, signal.SIGKILL),
        (139, signal.SIGSEGV),
        (143, signal.SIGTERM),
        (134, signal.SIGABRT),
        (129, signal.SIGHUP),
        (159, signal.SIGSYS),
        (160, None),  # past the shell's signal range
        (255, None),
        (-9, signal.SIGKILL),
        (-11, signal.SIGSEGV),
        (-15, signal.SIGTERM),
        (-200, None),  # no such signal
        (-(10**20), None),
        (10**20, None),
    ],
)
def test_signal_of(exit_code, expected):
    assert signal_of(exit_code) == expected


# ----------------------------------------------------------------------------- rule 1/2: cancel and runner verdict


def test_canceled_wins_over_everything():
    analysis = classify_(
        canceled=True,
        exit_code=-15,
        raw_state="NODE_FAIL",
        oom_killed=True,
        timed_out=True,
        log_tail=[CUDA_OOM, _verdict("ERR_INFRA", "upload failed")],
        message="canceled by try 2",
    )
    assert analysis.err_class is ErrClass.ERR_CANCELED
    assert analysis.retriable is False
    assert analysis.evidence == ["canceled by try 2"]


def test_canceled_without_message_has_no_evidence():
    assert classify_(canceled=True).evidence == []


@pytest.mark.parametrize("err", ["ERR_CONFIG", "ERR_INFRA", "ERR_UNKNOWN", "ERR_OOM"])
def test_runner_verdict_line_decides_before_platform_state_flags_and_log(err):
    message = "input s3://bucket/data is missing (403 Forbidden)"
    analysis = classify_(
        exit_code=2,
        raw_state="NODE_FAIL",
        oom_killed=True,
        timed_out=True,
        log_tail=["epoch 1", CUDA_OOM, XID, _verdict(err, message), "after the verdict"],
    )
    assert analysis.err_class is ErrClass(err)
    assert analysis.evidence == [message]
    assert analysis.suggestion.startswith(message)
    assert analysis.retriable == ErrClass(err).retriable


def test_runner_verdict_last_one_wins_and_may_be_prefixed():
    lines = [
        _verdict("ERR_CONFIG", "first"),
        "2026-01-01T00:00:00 stderr | " + _verdict("ERR_INFRA", "second"),
    ]
    assert runner_verdict(lines) == (ErrClass.ERR_INFRA, "second")
    assert classify_(exit_code=75, log_tail=lines).err_class is ErrClass.ERR_INFRA


def test_runner_verdict_is_read_from_the_log_tail_not_from_events():
    analysis = classify_(exit_code=1, events=[_verdict("ERR_INFRA", "x")], log_tail=["ValueError: boom"])
    assert analysis.err_class is ErrClass.ERR_PROGRAM


@pytest.mark.parametrize(
    "line",
    [
        RUNNER_FAILURE_PREFIX + "not json",
        RUNNER_FAILURE_PREFIX + '{"err_class": "ERR_BOGUS", "message": "x"}',
        RUNNER_FAILURE_PREFIX + '{"message": "no class"}',
        RUNNER_FAILURE_PREFIX + '["ERR_INFRA"]',
        RUNNER_FAILURE_PREFIX + '{"err_class": ["ERR_INFRA"]}',
        RUNNER_FAILURE_PREFIX + '"ERR_INFRA"',
    ],
)
def test_malformed_runner_verdicts_are_ignored(line):
    assert runner_verdict([line]) is None
    analysis = classify_(exit_code=1, log_tail=[line])
    assert analysis.err_class is ErrClass.ERR_PROGRAM  # falls through to the exit code


def test_a_malformed_verdict_after_a_good_one_does_not_hide_it():
    lines = [_verdict("ERR_CONFIG", "good"), RUNNER_FAILURE_PREFIX + "{broken"]
    assert runner_verdict(lines) == (ErrClass.ERR_CONFIG, "good")


def test_deeply_nested_runner_verdict_does_not_crash_classify():
    # A job controls its own log: a line that makes json.loads recurse too deep must not crash the analysis.
    line = RUNNER_FAILURE_PREFIX + "[" * 100_000
    analysis = classify_(exit_code=1, log_tail=[line])
    assert analysis.err_class is ErrClass.ERR_PROGRAM


# ----------------------------------------------------------------------------- rule 3/4: OOM flag, timeout


def test_oom_flag_wins_over_raw_state_and_log_signatures():
    analysis = classify_(oom_killed=True, exit_code=137, raw_state="NODE_FAIL", log_tail=[XID])
    assert analysis.err_class is ErrClass.ERR_OOM
    assert analysis.retriable is False
    assert analysis.evidence == ["killed by the out-of-memory killer"]
    assert analysis.details["signal"] == "SIGKILL"


def test_oom_flag_evidence_is_the_platform_message_when_there_is_one():
    assert classify_(oom_killed=True, message="OOMKilled: container memory 8Gi").evidence == [
        "OOMKilled: container memory 8Gi"
    ]


def test_oom_flag_beats_timeout_flag():
    assert classify_(oom_killed=True, timed_out=True).err_class is ErrClass.ERR_OOM


def test_timeout_flag_wins_over_raw_state_and_log():
    analysis = classify_(timed_out=True, exit_code=-15, raw_state="PREEMPTED", log_tail=[CUDA_OOM], message="late")
    assert analysis.err_class is ErrClass.ERR_TIMEOUT
    assert analysis.retriable is False
    assert analysis.evidence == ["late"]


# ----------------------------------------------------------------------------- rule 5: raw platform states


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("PREEMPTED", ErrClass.ERR_PREEMPTED),
        ("NODE_FAIL", ErrClass.ERR_INFRA),
        ("BOOT_FAIL", ErrClass.ERR_INFRA),
        ("LOST", ErrClass.ERR_INFRA),
        ("TIMEOUT", ErrClass.ERR_TIMEOUT),
        ("DeadlineExceeded", ErrClass.ERR_TIMEOUT),
        ("OUT_OF_MEMORY", ErrClass.ERR_OOM),
        ("OOMKilled", ErrClass.ERR_OOM),
        ("ImagePullBackOff", ErrClass.ERR_IMAGE_PULL),
        ("ErrImagePull", ErrClass.ERR_IMAGE_PULL),
        ("node fail", ErrClass.ERR_INFRA),  # spaces and case do not matter
    ],
)
def test_raw_state_classes(raw, expected):
    analysis = classify_(raw_state=raw, exit_code=1, log_tail=["ValueError: unrelated"])
    assert analysis.err_class is expected
    assert analysis.retriable == expected.retriable
    assert analysis.evidence[0] == f"platform state {raw}"
    assert analysis.details["raw_state"] == raw


def test_preempted_and_node_fail_are_retriable():
    assert classify_(raw_state="PREEMPTED").retriable is True
    assert classify_(raw_state="NODE_FAIL").retriable is True


def test_raw_state_beats_log_signatures():
    # The node failed; the CUDA OOM line in the log is not why.
    assert classify_(raw_state="NODE_FAIL", log_tail=[CUDA_OOM]).err_class is ErrClass.ERR_INFRA
    assert classify_(raw_state="PREEMPTED", log_tail=["ValueError: x"], exit_code=1).err_class is (
        ErrClass.ERR_PREEMPTED
    )


def test_raw_state_evidence_carries_the_platform_events():
    analysis = classify_(raw_state="NODE_FAIL", events=["node n3 not responding", "", "node n3 DOWN"])
    assert analysis.evidence == ["platform state NODE_FAIL", "node n3 not responding", "node n3 DOWN"]


@pytest.mark.parametrize("raw", ["CANCELLED by 1001", "CANCELLED", "cancelled by 0", "Canceled"])
def test_slurm_cancelled_by_uid_is_canceled(raw):
    analysis = classify_(raw_state=raw, exit_code=0)
    assert analysis.err_class is ErrClass.ERR_CANCELED
    assert analysis.retriable is False
    assert analysis.evidence == [f"platform state {raw}"]


def test_cancelled_state_lets_log_signatures_say_why():
    # SLURM reports a job killed at its time limit by slurmstepd as CANCELLED in some versions; the log says why.
    line = "slurmstepd: error: *** JOB 12 ON node1 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***"
    analysis = classify_(raw_state="CANCELLED by 0", exit_code=15, log_tail=[line])
    assert analysis.err_class is ErrClass.ERR_TIMEOUT
    assert analysis.evidence == [line]


def test_slurm_preemption_line_is_preemption_not_timeout():
    line = "slurmstepd: error: *** JOB 12 ON node1 CANCELLED AT 2026-01-01T00:00:00 DUE TO PREEMPTION ***"
    analysis = classify_(raw_state="CANCELLED by 0", exit_code=15, log_tail=[line])
    assert analysis.err_class is ErrClass.ERR_PREEMPTED
    assert analysis.retriable is True


def test_unknown_raw_state_falls_through():
    assert classify_(raw_state="FAILED", exit_code=1).err_class is ErrClass.ERR_PROGRAM


# ----------------------------------------------------------------------------- rule 6: log signatures


@pytest.mark.parametrize(
    "line",
    [
        CUDA_OOM,
        CUDA_ERROR_OOM,
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "MemoryError",
        "terminate called after throwing an instance of 'std::bad_alloc'",
        "OSError: [Errno 12] Cannot allocate memory",
    ],
)
def test_oom_log_signatures_are_err_oom(line):
    analysis = classify_(exit_code=1, log_tail=["epoch 3/10", line, "Exiting"])
    assert analysis.err_class is ErrClass.ERR_OOM
    assert analysis.retriable is False
    assert analysis.evidence == [line]


@pytest.mark.parametrize("other", [XID, NCCL, NCCL_SYSTEM, "Failed to initialize NVML: Driver/library mismatch"])
def test_cuda_oom_is_never_infra_even_next_to_infra_lines(other):
    for lines in ([CUDA_OOM, other], [other, CUDA_OOM], [other, CUDA_ERROR_OOM, other]):
        analysis = classify_(exit_code=1, log_tail=lines)
        assert analysis.err_class is ErrClass.ERR_OOM
        assert analysis.err_class is not ErrClass.ERR_INFRA
        assert not analysis.retriable


def test_oom_in_events_counts_too():
    assert classify_(exit_code=1, events=[CUDA_OOM]).err_class is ErrClass.ERR_OOM


@pytest.mark.parametrize("line", [DEVICE_ASSERT, "RuntimeError: CUDA error: an illegal memory access was encountered"])
def test_device_side_assert_and_illegal_access_are_program_errors(line):
    analysis = classify_(exit_code=1, log_tail=[line, NCCL])  # the NCCL noise that follows does not win
    assert analysis.err_class is ErrClass.ERR_PROGRAM
    assert analysis.retriable is False
    assert analysis.evidence == [line]


@pytest.mark.parametrize(
    "line",
    [
        XID,
        "kernel: NVRM: Xid (PCI:0000:07:00): 48, An uncorrectable double bit error",
        "uncorrectable ECC error encountered",
        NCCL,
        NCCL_SYSTEM,
        "node2:99:99 [1] NCCL WARN [Service thread] Error encountered progressing operation=Connect, "
        "res=3, closing connection; remote process exited",
        "RuntimeError: No CUDA GPUs are available: no CUDA-capable device is detected",
        "Failed to initialize NVML: Unknown Error",
        "CUDA driver version is insufficient for CUDA runtime version",
    ],
)
def test_xid_nccl_and_driver_faults_are_infra(line):
    analysis = classify_(exit_code=1, log_tail=["Traceback (most recent call last):", line])
    assert analysis.err_class is ErrClass.ERR_INFRA
    assert analysis.retriable is True
    assert line in analysis.evidence


def test_a_bare_xid_word_is_not_infra():
    # "Xid" without a number is not a driver event (e.g. a variable name in a traceback).
    assert classify_(exit_code=1, log_tail=["NameError: name 'Xid' is not defined"]).err_class is (ErrClass.ERR_PROGRAM)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('Failed to pull image "nvcr.io/x/y:1": manifest unknown', ErrClass.ERR_IMAGE_PULL),
        ("Back-off pulling image: ImagePullBackOff", ErrClass.ERR_IMAGE_PULL),
        ("Error response from daemon: pull access denied for foo", ErrClass.ERR_IMAGE_PULL),
        ("HTTP 401 Unauthorized", ErrClass.ERR_AUTH),
        ("error: invalid api token", ErrClass.ERR_AUTH),
        ("0/4 nodes are available: 4 Insufficient nvidia.com/gpu.", ErrClass.ERR_CAPACITY),
        ("Reason=QOSMaxGRESPerUser", ErrClass.ERR_CAPACITY),
        ("*** JOB 5 ON n1 CANCELLED AT 2026-01-01 DUE TO TIME LIMIT ***", ErrClass.ERR_TIMEOUT),
    ],
)
def test_other_log_signatures(line, expected):
    analysis = classify_(exit_code=1, log_tail=[line])
    assert analysis.err_class is expected
    assert analysis.retriable == expected.retriable


def test_log_signature_evidence_is_bounded_to_the_last_hits():
    lines = [f"{CUDA_OOM} #{i}" for i in range(40)]
    analysis = classify_(exit_code=1, log_tail=lines)
    assert analysis.evidence == lines[-12:]


def test_log_signatures_beat_exit_code_rules():
    # 127 alone is a config error, but a CUDA OOM line says more.
    assert classify_(exit_code=127, log_tail=[CUDA_OOM]).err_class is ErrClass.ERR_OOM
    assert classify_(exit_code=-11, log_tail=[XID]).err_class is ErrClass.ERR_INFRA


# ----------------------------------------------------------------------------- rule 7+: exit codes and signals


@pytest.mark.parametrize(("code", "why"), [(127, "not found"), (126, "not executable")])
def test_exit_127_and_126_are_config_errors(code, why):
    analysis = classify_(exit_code=code, log_tail=["bash: line 1: trian.py: command not found"])
    assert analysis.err_class is ErrClass.ERR_CONFIG
    assert analysis.retriable is False
    assert why in analysis.suggestion
    assert analysis.evidence == ["bash: line 1: trian.py: command not found"]


@pytest.mark.parametrize("code", [139, -11, 134, -6, 135, -7, 136, -8, 132, -4])
def test_segv_abort_bus_fpe_ill_are_program_errors(code):
    analysis = classify_(exit_code=code)
    assert analysis.err_class is ErrClass.ERR_PROGRAM
    assert analysis.retriable is False
    assert analysis.details["signal"] == signal_of(code).name
    assert signal_of(code).name in analysis.suggestion


@pytest.mark.parametrize("code", [137, -9, 143, -15])
def test_kill_and_term_without_other_facts_are_unknown(code):
    analysis = classify_(exit_code=code, log_tail=["epoch 7", ""])
    assert analysis.err_class is ErrClass.ERR_UNKNOWN
    assert analysis.details["signal"] == signal_of(code).name
    assert signal_of(code).name in analysis.suggestion
    assert analysis.evidence == ["epoch 7"]  # blank lines are not evidence


def test_plain_nonzero_exit_is_a_program_error_with_the_last_traceback_as_evidence():
    lines = [
        "epoch 1 loss 0.5",
        "Traceback (most recent call last):",
        '  File "old.py", line 1, in <module>',
        "KeyError: 'first failure, handled'",
        "retrying ...",
        "Traceback (most recent call last):",
        '  File "train.py", line 42, in <module>',
        "    model.fit(data)",
        "ValueError: shapes (3,) and (4,) not aligned",
    ]
    analysis = classify_(exit_code=1, log_tail=lines)
    assert analysis.err_class is ErrClass.ERR_PROGRAM
    assert analysis.retriable is False
    assert analysis.evidence == lines[5:]
    assert "exited with code 1" in analysis.suggestion
    assert analysis.details["exit_code"] == 1
    assert "signal" not in analysis.details


def test_long_traceback_keeps_its_last_lines():
    lines = ["Traceback (most recent call last):", *[f'  File "f{i}.py", line {i}' for i in range(30)], "OSError: x"]
    analysis = classify_(exit_code=3, log_tail=lines)
    assert analysis.evidence[-1] == "OSError: x"
    assert len(analysis.evidence) == 12


def test_plain_nonzero_exit_without_traceback_uses_the_log_tail():
    lines = [f"line {i}" for i in range(20)]
    analysis = classify_(exit_code=2, log_tail=lines)
    assert analysis.err_class is ErrClass.ERR_PROGRAM
    assert analysis.evidence == lines[-12:]


@pytest.mark.parametrize("code", [None, 0])
def test_no_facts_at_all_is_unknown(code):
    analysis = classify_(exit_code=code)
    assert analysis.err_class is ErrClass.ERR_UNKNOWN
    assert analysis.retriable is True


def test_details_carry_platform_facts():
    analysis = classify_(exit_code=139, raw_state="FAILED", details={"node": "n7", "log": "/x/job.log"})
    assert analysis.details == {
        "exit_code": 139,
        "raw_state": "FAILED",
        "node": "n7",
        "log": "/x/job.log",
        "signal": "SIGSEGV",
    }


# ----------------------------------------------------------------------------- properties


_codes = st.one_of(st.none(), st.integers(min_value=-(2**63), max_value=2**63), st.integers(-300, 300))
_text_lines = st.lists(st.text(max_size=200), max_size=30)
# Lines that look like the runner's verdict or a log signature, with arbitrary (often broken) payloads.
_tricky_lines = st.lists(
    st.one_of(
        st.text(max_size=80),
        st.builds(lambda s: RUNNER_FAILURE_PREFIX + s, st.text(max_size=80)),
        st.builds(lambda n: RUNNER_FAILURE_PREFIX + "[" * n, st.integers(0, 20_000)),
        st.builds(lambda n: RUNNER_FAILURE_PREFIX + '{"a":' * n, st.integers(0, 20_000)),
        st.builds(
            lambda v, m: RUNNER_FAILURE_PREFIX + json.dumps({"err_class": v, "message": m}),
            st.one_of(st.sampled_from([e.value for e in ErrClass]), st.text(max_size=10), st.integers()),
            st.one_of(st.text(max_size=20), st.none(), st.integers(), st.lists(st.integers(), max_size=3)),
        ),
        st.sampled_from([CUDA_OOM, XID, NCCL, DEVICE_ASSERT, "Traceback (most recent call last):"]),
    ),
    max_size=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    exit_code=_codes,
    raw_state=st.text(max_size=30),
    oom=st.booleans(),
    canceled=st.booleans(),
    timed_out=st.booleans(),
    log_tail=st.one_of(_text_lines, _tricky_lines),
    events=_text_lines,
    message=st.text(max_size=50),
)
def test_classify_never_raises(  # noqa: PLR0917
    exit_code, raw_state, oom, canceled, timed_out, log_tail, events, message
):
    analysis = classify_(
        exit_code=exit_code,
        raw_state=raw_state,
        oom_killed=oom,
        canceled=canceled,
        timed_out=timed_out,
        log_tail=log_tail,
        events=events,
        message=message,
    )
    _assert_well_formed(analysis)
    if canceled:
        assert analysis.err_class is ErrClass.ERR_CANCELED


@settings(max_examples=200, deadline=None)
@given(exit_code=_codes)
def test_signal_of_never_raises(exit_code):
    sig = signal_of(exit_code)
    assert sig is None or isinstance(sig, signal.Signals)


@settings(max_examples=200, deadline=None)
@given(prefix=_text_lines, suffix=_text_lines, exit_code=st.one_of(st.none(), st.integers(-300, 300)))
def test_a_cuda_oom_line_anywhere_is_never_infra(prefix, suffix, exit_code):
    analysis = classify_(exit_code=exit_code, log_tail=[*prefix, CUDA_OOM, XID, NCCL, *suffix])
    # Only explicit evidence (a runner verdict in the random text) could change it; random text has none of those
    # unless it happens to spell a verdict, which hypothesis does not produce without the prefix.
    if runner_verdict([*prefix, *suffix]) is None:
        assert analysis.err_class is ErrClass.ERR_OOM


def test_a_slurm_task_killed_from_outside_is_not_the_programs_exit_code() -> None:
    """SIGKILL of the program in the step's container: sacct says FAILED 9:0 (read as exit code 9), srun says
    the task was killed -- who sent it cannot be told, so it is retriable, not the program's fault."""
    log = ["tick 3", "srun: error: c2: task 0: Killed", "srun: Terminating StepId=697.0"]
    analysis = classify(FailureFacts(exit_code=9, raw_state="FAILED", log_tail=log))
    assert analysis.err_class is ErrClass.ERR_UNKNOWN and analysis.retriable
    plain = classify(FailureFacts(exit_code=9, raw_state="FAILED", log_tail=["tick 3", "bad input"]))
    assert plain.err_class is ErrClass.ERR_PROGRAM
