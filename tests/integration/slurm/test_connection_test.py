"""The connection form's Test button (``test_connection``) against the real cluster: success, and each failure
named in words -- refused key, another host key, no answer, a partition that does not exist -- with no secret."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tao.hooks.slurm import SlurmHook
from tests.e2e.airflow_harness import free_ports

pytestmark = pytest.mark.integration


def _test(monkeypatch: pytest.MonkeyPatch, conn: dict[str, Any]) -> tuple[bool, str]:
    monkeypatch.setenv("AIRFLOW_CONN_TAO_SLURM_TEST", json.dumps(conn))
    hook = SlurmHook(conn_id="tao_slurm_test")
    try:
        return hook.test_connection()
    finally:
        hook.close()


def _other_key(tmp_path: Path) -> Path:
    key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def test_success_names_the_host_user_and_partitions(slurm_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ok, message = _test(monkeypatch, slurm_cluster.airflow_conn)
    assert ok, message
    assert f"Connected to {slurm_cluster.host} as {slurm_cluster.user}" in message
    assert slurm_cluster.partition in message and slurm_cluster.partition_held in message


def test_a_refused_key_is_authentication_refused(
    slurm_cluster: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    conn = slurm_cluster.airflow_conn
    conn["extra"] = {**conn["extra"], "key_file": str(_other_key(tmp_path))}
    ok, message = _test(monkeypatch, conn)
    assert not ok
    assert message.startswith("Authentication refused:"), message
    assert "check the user, key file / private key or password" in message


def test_another_host_key_is_refused_before_any_credential(
    slurm_cluster: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    other = " ".join((_other_key(tmp_path).with_suffix(".pub")).read_text().split()[:2])
    conn = slurm_cluster.airflow_conn
    conn["extra"] = {**conn["extra"], "host_key": other}
    ok, message = _test(monkeypatch, conn)
    assert not ok
    assert message.startswith("Authentication refused:") and "host key does not match" in message, message


def test_no_answer_is_unreachable(slurm_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = {**slurm_cluster.airflow_conn, "port": free_ports(1)[0]}
    ok, message = _test(monkeypatch, conn)
    assert not ok
    assert message.startswith("Unreachable: no login host answered on SSH"), message
    assert "check host, port and network" in message


def test_a_missing_partition_is_not_found(slurm_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = slurm_cluster.airflow_conn
    conn["extra"] = {**conn["extra"], "partition": f"{slurm_cluster.partition},nosuchpartition"}
    ok, message = _test(monkeypatch, conn)
    assert not ok
    assert message.startswith("Not found: partition(s) nosuchpartition do not exist"), message


def test_a_password_never_appears_in_the_answer(slurm_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "pw-Sup3r-s3cret"
    conn = {**slurm_cluster.airflow_conn, "password": secret, "port": free_ports(1)[0]}
    ok, message = _test(monkeypatch, conn)
    assert not ok and secret not in message
