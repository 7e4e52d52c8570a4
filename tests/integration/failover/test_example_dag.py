"""``example_dags/tao_failover_train.py`` run by ``dag.test()``: Lepton has no capacity for the job, which moves to
the SLURM cluster in the same try; ``report`` prints every attempt's GPU-hours from the task's XCom."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.example_dag import run_example_dag
from tests.integration.lepton.conftest import LeptonFake, lepton_connection
from tests.integration.slurm.conftest import SlurmCluster

pytestmark = pytest.mark.integration


def test_example_dag_fails_over_from_lepton_to_slurm_and_reports_gpu_hours(
    lepton_fake: LeptonFake, slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    lepton, slurm = "tao_fo_lepton_example", "tao_fo_slurm_example"
    lepton_fake.inject("no_capacity", name_prefix="tao-failover-train-train")  # the example's job name
    env = {
        f"AIRFLOW_CONN_{lepton.upper()}": lepton_connection(lepton_fake),
        f"AIRFLOW_CONN_{slurm.upper()}": slurm_cluster.airflow_conn_json,
        "TAO_FAILOVER_CHAIN": f"{lepton},{slurm}",
        "TAO_FAILOVER_IMAGE": "local/busybox:ci",
        "TAO_FAILOVER_GPUS": "0",
        "TAO_FAILOVER_CAPACITY_TIMEOUT": "4",
        "TAO_FAILOVER_POLL": "1",
        "TAO_FAILOVER_DETAILS": json.dumps({slurm: {"oci_bundle": str(slurm_cluster.oci_bundle_py)}}),
    }
    output = run_example_dag("tao_failover_train", tmp_path, env)
    assert "Failing over from lepton job" in output
    assert f"attempt 1: lepton ({lepton}) capacity" in output and "waited" in output
    assert f"attempt 2: slurm ({slurm}) complete" in output
    assert "trained on slurm" in output and "GPU-hours in all" in output
