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
