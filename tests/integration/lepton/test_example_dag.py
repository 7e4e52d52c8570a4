"""``example_dags/tao_lepton_multinode.py``: parsed without importing ``leptonai``, and run by ``dag.test()`` against
the fake Lepton workspace: a 2-node train -> report, both on the node group's Lustre volume."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.contract.test_contracts import REPO, _fresh_import
from tests.integration.docker.conftest import DockerEngine
from tests.integration.example_dag import run_example_dag
from tests.integration.lepton.conftest import LeptonFake, lepton_connection

pytestmark = pytest.mark.integration


def test_parsing_the_example_dag_imports_no_heavy_sdk(tmp_path: Path) -> None:
    result = _fresh_import(str(REPO / "example_dags" / "tao_lepton_multinode.py"), tmp_path)
    assert "airflow_provider_tao.operators.submit" in result["ours"]
    assert result["attempts"] == [] and result["loaded"] == [], result  # no leptonai (nor any other SDK) at parse
    assert "airflow_provider_tao.hooks.lepton" not in result["ours"]


def test_example_dag_trains_on_two_nodes_and_reports(
    docker_engine: DockerEngine, lepton_fake: LeptonFake, tmp_path: Path
) -> None:
    env = {
        "AIRFLOW_CONN_TAO_LEPTON_EXAMPLE": lepton_connection(lepton_fake, ngc_api_key="example-ngc-key"),
        "TAO_LEPTON_CONN_ID": "tao_lepton_example",
        "TAO_LEPTON_IMAGE": docker_engine.python,
        "TAO_LEPTON_GPUS": "1",
        "TAO_LEPTON_POLL": "1",
    }
    output = run_example_dag("tao_lepton_multinode", tmp_path, env)
    assert "[job] rank 0 of 2, master " in output  # streamed from the rank-0 replica's log
    assert "[job] model-rank0.json" in output and "[job] model-rank1.json" in output  # report saw both ranks' files
    (train,) = [
        j
        for j in lepton_fake.jobs()
        if j["labels"].get("tao-dag-id") == "tao_lepton_multinode" and j["labels"].get("tao-task-id") == "train"
    ]
    assert train["body"]["spec"]["resource_shape"] == "gpu.1xh100-80gb" and len(train["replicas"]) == 2
