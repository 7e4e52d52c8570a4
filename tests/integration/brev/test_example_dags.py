"""``example_dags/tao_brev_train.py`` and ``tao_brev_reaper.py`` run by ``dag.test()`` against the fake ``brev`` CLI."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tao.hooks.brev import remote
from tests.brevfake.control import BrevWorld
from tests.integration.brev.conftest import brev_connection
from tests.integration.docker.conftest import DockerEngine
from tests.integration.example_dag import run_example_dag

pytestmark = pytest.mark.integration


def test_example_dag_trains_on_its_own_instance_and_reports_the_uploads(
    brev_world: BrevWorld, docker_engine: DockerEngine, moto_endpoint: str, bucket: str, tmp_path: Path
) -> None:
    aws = {"conn_type": "aws", "login": "testing", "password": "testing"}
    aws["extra"] = {"endpoint_url": moto_endpoint, "region_name": "us-east-1"}  # type: ignore[assignment]
    env = {
        "AIRFLOW_CONN_TAO_BREV_EXAMPLE": brev_connection(brev_world),
        "AIRFLOW_CONN_S3_BREV_EXAMPLE": json.dumps(aws),
        "TAO_BREV_CONN_ID": "tao_brev_example",
        "TAO_BREV_AWS_CONN_ID": "s3_brev_example",
        "TAO_BREV_IMAGE": docker_engine.python,
        "TAO_BREV_GPUS": "0",
        "TAO_BREV_RESULTS": f"s3://{bucket}/tao/results",
        "TAO_BREV_NETWORK": "host",  # the moto server is on this machine's loopback
        "TAO_BREV_POLL": "1",
    }
    output = run_example_dag("tao_brev_train", tmp_path, env)
    assert "[job] no tao CLI in this image: writing a placeholder model" in output  # streamed from the instance
    assert "/out/model.json'" in output and "uploaded [" in output  # report listed the upload in S3
    (created,) = [c for c in brev_world.calls() if c["argv"][1] == "create"]
    name = created["argv"][2]
    assert name not in {i["name"] for i in brev_world.instances() if i["status"] != "DELETING"}  # deleted after


def _plant_lease(world: BrevWorld, name: str, **lease: Any) -> None:
    body = json.dumps({"created_by": "airflow-provider-tao", "instance": name, **lease})
    code, said = world.exec_in(name, f"mkdir -p ~/.tao-brev && printf '%s' '{body}' > ~/{remote.LEASE_FILE}")
    assert code == 0, said


def test_example_reaper_deletes_the_expired_lease_only(brev_world: BrevWorld, tmp_path: Path) -> None:
    now = time.time()
    owner = {"dag_id": "tao_brev_train", "task_id": "train", "run_id": "manual__gone", "map_index": "-1"}
    for name in ("old-train", "current-train", "by-hand"):
        brev_world.create_instance(name)
    _plant_lease(brev_world, "old-train", created_at=now - 9 * 3600, expires_at=now - 3600, lease_hours=8, **owner)
    _plant_lease(brev_world, "current-train", created_at=now, expires_at=now + 8 * 3600, lease_hours=8, **owner)
    env = {"AIRFLOW_CONN_TAO_BREV_EXAMPLE": brev_connection(brev_world), "TAO_BREV_CONN_ID": "tao_brev_example"}
    output = run_example_dag("tao_brev_reaper", tmp_path, env)
    assert "Reaper: deleted old-train: its lease expired at" in output
    assert "Reaper: kept current-train: leased until" in output and "unknown to this Airflow" in output
    assert "Reaper: kept by-hand: not created by this provider" in output
    assert "Deleted 1 instance(s): old-train" in output
    statuses = {i["name"]: i["status"] for i in brev_world.instances()}
    assert (
        statuses.get("old-train") in (None, "DELETING")
        and statuses["current-train"] == statuses["by-hand"] == "RUNNING"
    )
