"""What a new user's trial met (issue 36 points 5, 6 and 8): mistakes refused before any platform is asked, hints
that survive the console that prints them, and words that say what they mean."""

from __future__ import annotations

import json
from argparse import Namespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.operators.submit import TAOSubmitOperator
from tests.unit.fakes import Store, make_context


def _op(**kwargs: Any) -> TAOSubmitOperator:
    defaults: dict[str, Any] = {"task_id": "train", "image": "img:1", "command": "train.sh"}
    return TAOSubmitOperator(**{**defaults, **kwargs})


# ----------------------------------------------------------------- 5: an image check that needs no daemon


@pytest.mark.parametrize("platform", ["docker", "kubernetes", "lepton", "brev"])
def test_a_container_platform_without_an_image_fails_the_dag_at_parse_time(platform: str) -> None:
    with pytest.raises(JobValidationError) as bad:
        _op(platform=platform, image=None)
    assert bad.value.parameter == "image"
    assert str(bad.value).startswith(f"image: is required on the {platform} platform")
    assert "versions.yaml key" in str(bad.value)
    _op(platform="local", image=None)  # runs on the worker host: no image needed
    _op(platform="slurm", image=None)  # container_runtime=none needs none: checked when the connection is read
    _op(platform=platform, image="{{ params.image }}")  # a template is checked when it is rendered


def test_a_docker_connection_without_an_image_is_refused_before_the_daemon_is_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    # a daemon that cannot answer: before the fix the task died with the client's raw connection error
    sock = f"unix://{tmp_path}/no-daemon.sock"
    monkeypatch.setenv("AIRFLOW_CONN_TAO_DOCKER_NODAEMON", json.dumps({"conn_type": "tao_docker", "host": sock}))
    asked: list[str] = []
    from airflow_provider_tao.hooks.docker import TAODockerHook

    monkeypatch.setattr(TAODockerHook, "load_connection", lambda self: asked.append(self.conn_id))
    op = _op(conn_id="tao_docker_nodaemon", image=None, deferrable=True)
    with pytest.raises(AirflowFailException) as bad:
        op.execute(make_context(Store()))
    assert "Bad input, nothing was submitted: image: is required on the docker platform" in str(bad.value)
    assert asked == []  # the connection (and so the daemon) was never touched


# ----------------------------------------------------------------- 6: `airflow connections test` keeps [slurm]


def test_the_connection_test_command_prints_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow.cli.commands import connection_command

    from airflow_provider_tao.hooks import base

    monkeypatch.setenv("AIRFLOW__CORE__TEST_CONNECTION", "Enabled")
    monkeypatch.setenv("AIRFLOW_CONN_TAO_SLURM_TRIAL", json.dumps({"conn_type": "tao_slurm", "host": "login1"}))
    monkeypatch.setattr(base, "_absent", lambda module: True)  # the [slurm] extra is not installed
    monkeypatch.setattr("sys.argv", ["airflow", "connections", "test", "tao_slurm_trial"])
    with pytest.raises(SystemExit):
        connection_command.connections_test(Namespace(conn_id="tao_slurm_trial", verbose=False))
    printed = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "pip install 'airflow-provider-tao[slurm]'" in printed, printed


def test_the_test_buttons_message_is_not_escaped_for_the_ui(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_tao.connections import console_safe

    monkeypatch.setattr("sys.argv", ["airflow", "api-server"])
    assert console_safe("pip install 'airflow-provider-tao[slurm]'") == "pip install 'airflow-provider-tao[slurm]'"


# ----------------------------------------------------------------- 8: the small ones


def test_an_attempt_line_says_what_each_number_is_and_ends_its_reason_once() -> None:
    from airflow_provider_tao.accounting import JobUsage, attempt_of, describe
    from airflow_provider_tao.jobs import JobHandle

    handle = JobHandle("local", None, "a3e30d4826ee", "n", backend_job_id="10332", submitted_at=100.0)
    usage = JobUsage(queued_at=100.0, started_at=100.2, ended_at=110.0, gpus_per_node=0, nodes=1)
    attempt = attempt_of(handle, usage, outcome="error", reason="the program failed; a retry fails again.",
                         try_number=1, requested_gpus=0, requested_nodes=1, now=120.0)  # fmt: skip
    line = describe(1, attempt)
    assert "on local: job a3e30d4826ee (pid 10332) error" in line, line
    assert "fails again; queued 0.2 s" in line and "connection None" not in line, line


def test_a_reap_decision_without_a_connection_does_not_say_on_none() -> None:
    from airflow_provider_tao.sweeper import describe

    row = {"action": "kept", "platform": "local", "conn_id": None, "job_id": "abc", "why": "its task runs"}
    assert describe(row) == "kept: local job abc -- its task runs"
    assert " on tao_slurm" in describe({**row, "platform": "slurm", "conn_id": "tao_slurm"})


def test_a_dry_run_reap_with_nothing_to_do_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_provider_tao.cli.commands import _print_reaped

    _print_reaped([], 3, Namespace(output="table", dry_run=True))
    assert capsys.readouterr().out.strip() == (
        "Nothing to reap: no orphaned job or machine on 3 connection(s) (dry run: nothing would be canceled)."
    )
    _print_reaped([], 3, Namespace(output="json", dry_run=True))
    assert capsys.readouterr().out.strip() == "[]"  # scripts keep their JSON


def test_logs_tail_counts_the_lines_people_see_not_the_progress_lines_they_collapse(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from unittest import mock

    from airflow_provider_tao.cli import commands

    bars = [f"epoch 3 {'#' * i}\r" for i in range(40)]  # one progress bar redrawn: one line to read
    lines = ["step 85", "step 86", "step 87", "".join(bars) + "epoch 3 done", *["TAO_PROGRESS {}"] * 30]
    text = "\n".join(lines) + "\n"

    def get_job_logs(handle: Any, cursor: str, tail: int | None = None) -> tuple[str, str]:
        kept = [line + "\n" for line in text.split("\n")[:-1]]  # not splitlines(): a \r ends no line here
        return "".join(kept[-tail:] if tail else kept), "1"

    hook = mock.MagicMock(get_job_logs=get_job_logs)
    job = mock.MagicMock(record=mock.MagicMock(secret_conn_ids=[]), conn_id=None)
    monkeypatch.setattr(commands, "_job_on_platform", lambda job_id: (job, None, hook))
    commands.job_logs.__wrapped__.__wrapped__(Namespace(job_id="abcdef123456", tail=3, output="plain"))  # type: ignore[attr-defined]
    shown = capsys.readouterr().out.splitlines()
    assert shown == ["step 87", "epoch 3 done", "progress: ?"], shown  # before: ["progress: ?"]


def test_env_none_is_not_told_to_be_quoted() -> None:
    with pytest.raises(JobValidationError) as bad:
        _op(platform="local", env={"A": None})
    assert "'None'" not in str(bad.value) and "leave the variable out" in str(bad.value)


def test_a_templated_gpu_count_is_told_it_is_not_a_templated_field() -> None:
    with pytest.raises(JobValidationError) as bad:
        _op(platform="local", gpu_count="{{ params.gpus }}")
    assert "gpu_count is not a templated field" in str(bad.value) and ".expand(gpu_count=" in str(bad.value)


def test_an_image_key_one_typo_away_is_named() -> None:
    with pytest.raises(JobValidationError) as bad:
        _op(platform="local", image="tao_toolkit.ptt")
    assert "Did you mean 'tao_toolkit.pyt'?" in str(bad.value)


def test_a_connection_id_one_typo_away_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TAO_SLURM_PROD", json.dumps({"conn_type": "tao_slurm", "host": "login1"}))
    with pytest.raises(AirflowFailException) as bad:
        _op(conn_id="tao_slurm_prd", image=None, deferrable=True).execute(make_context(Store()))
    assert "there is no Airflow connection 'tao_slurm_prd' (did you mean 'tao_slurm_prod'?)" in str(bad.value)
