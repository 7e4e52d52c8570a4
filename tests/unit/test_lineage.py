"""``lineage.py``: dataset names by OpenLineage's naming spec, the run facet, the operator's facets at each phase,
and nothing of OpenLineage imported with the operator. (A DAG run's real events: tests/integration/lineage/.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from airflow_provider_tao.jobs import JobHandle
from airflow_provider_tao.lineage import RUN_FACET, JobFacts, dataset_name, job_lineage
from airflow_provider_tao.operators.submit import TAOSubmitOperator
from airflow_provider_tao.records import JobRecord

FACET_SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "lineage" / "TAOJobRunFacet.json").read_text())


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://bucket/data/train/", ("s3://bucket", "data/train")),
        ("s3://bucket", ("s3://bucket", "/")),
        ("/lustre/data/../data/coco", ("file://host-a", "/lustre/data/coco")),
        ("file:///data/x.csv", ("file://host-a", "/data/x.csv")),
        ("hf_model://nvidia/segformer", ("hf_model://nvidia", "segformer")),
        ("ngc://nvidia/tao/pretrained:1", ("ngc://nvidia", "tao/pretrained:1")),
        ("relative/path", None),
        ("s3://", None),
    ],
)
def test_dataset_names_follow_the_openlineage_naming_spec(uri: str, expected: tuple[str, str] | None) -> None:
    assert dataset_name(uri, "host-a") == expected


def test_job_lineage_is_a_function_another_operator_can_call() -> None:
    facts = JobFacts(platform="slurm", connection="tao_slurm", job_id="j1", gpu_count=8, num_nodes=2, gpu_hours=3.5,
                     state="Error", failure_class="ERR_OOM", image="nvcr.io/nvidia/tao/tao-toolkit:6.0")  # fmt: skip
    lineage = job_lineage(["s3://b/train/", "s3://b/train/", "/data/val"], ["/results/j1"], facts, "login1")

    assert [(d.namespace, d.name) for d in lineage.inputs] == [("s3://b", "train"), ("file://login1", "/data/val")]
    assert [(d.namespace, d.name) for d in lineage.outputs] == [("file://login1", "/results/j1")]
    from openlineage.client.serde import Serde

    facet = json.loads(Serde.to_json(lineage.run_facets[RUN_FACET]))
    jsonschema.validate(facet, {**FACET_SCHEMA, "$ref": "#/$defs/TAOJobRunFacet"})
    assert facet["gpuHours"] == 3.5 and facet["failureClass"] == "ERR_OOM" and facet["connection"] == "tao_slurm"
    assert facet["_schemaURL"].endswith("docs/lineage/TAOJobRunFacet.json#/$defs/TAOJobRunFacet")


def test_the_operator_reports_its_inputs_at_start_and_its_job_at_the_end(tmp_path: Path) -> None:
    op = TAOSubmitOperator(task_id="t", platform="local", command="train", gpu_count=2, inputs={"/w/d": "/data/d"},
                           image="nvcr.io/nvidia/tao/tao-toolkit:6.0")  # fmt: skip
    start = op.get_openlineage_facets_on_start()
    assert [(d.namespace.startswith("file://"), d.name) for d in start.inputs] == [(True, "/data/d")]
    assert start.outputs == [] and start.run_facets[RUN_FACET].gpuCount == 2
    assert not hasattr(start.run_facets[RUN_FACET], "jobId")

    handle = JobHandle(platform="local", conn_id=None, job_id="j9", name="n", backend_job_id="42",
                       results_dir=str(tmp_path / "j9"))  # fmt: skip
    record = JobRecord(handle=handle.to_json(), outputs={"/w/out": str(tmp_path / "j9" / "out")}, gpu_count=2)
    op._lineage_record = record.ended("Error", err_class="ERR_PROGRAM", run_seconds=1800)
    failed = op.get_openlineage_facets_on_failure(None)
    facet = failed.run_facets[RUN_FACET]
    assert (facet.jobId, facet.backendJobId, facet.state, facet.failureClass) == ("j9", "42", "Error", "ERR_PROGRAM")
    assert facet.gpuHours == 1.0 and facet.image == "nvcr.io/nvidia/tao/tao-toolkit:6.0"
    assert sorted(d.name for d in failed.outputs) == [str(tmp_path / "j9"), str(tmp_path / "j9" / "out")]


def test_importing_the_operator_and_the_decorator_imports_no_openlineage() -> None:
    """Neither the client nor the provider's code (Airflow's provider discovery reads its provider info only)."""
    code = (
        "import sys; import airflow_provider_tao.operators.submit, airflow_provider_tao.decorators.tao, "
        "airflow_provider_tao.lineage; print(sorted(m for m in sys.modules if 'openlineage' in m))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    imported = set(json.loads(out.strip().splitlines()[-1].replace("'", '"')))
    assert imported <= {"airflow.providers.openlineage", "airflow.providers.openlineage.get_provider_info"}
