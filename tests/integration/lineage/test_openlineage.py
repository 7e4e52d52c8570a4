"""OpenLineage from a real DAG run: the OpenLineage provider and client (file transport), ``dag.test()`` with the real
task runner (triggers inline), the ``local`` platform. Every event validates against the OpenLineage run event
schema; the TAO run facet against the schema the docs publish (docs/lineage/TAOJobRunFacet.json)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema

from tests.integration.example_dag import REPO, run_example_dag

HERE = Path(__file__).parent


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_dag_run_emits_start_complete_and_fail_with_our_datasets_and_run_facet(tmp_path: Path) -> None:
    data = tmp_path / "data.csv"
    data.write_text("a\nb\nc\n")
    events_file = tmp_path / "openlineage.jsonl"
    env = {
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(events_file), "append": True}
        ),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "tao-ci",
        "TAO_LINEAGE_DATA": str(data),
        "TAO_LINEAGE_STAGED": str(tmp_path / "staged" / "train.csv"),
        "TAO_LINEAGE_RESULTS": str(tmp_path / "results"),
        "CUDA_VISIBLE_DEVICES": "",
    }
    run_example_dag("tao_lineage_local", tmp_path, env, dag_file=HERE / "tao_lineage_local.py", state="failed")

    events = _events(events_file)
    run_schema = json.loads((HERE / "run_event.schema.json").read_text())
    facet_schema = json.loads((REPO / "docs" / "lineage" / "TAOJobRunFacet.json").read_text())
    for event in events:
        jsonschema.validate(event, run_schema)
    by_task = {}
    for event in events:
        name = event["job"]["name"]
        if name.startswith("tao_lineage_local."):
            by_task.setdefault(name.split(".", 1)[1], []).append(event)
    train, diverge = by_task["train"], by_task["diverge"]
    assert train[0]["eventType"] == "START" and train[-1]["eventType"] == "COMPLETE"
    assert [e["eventType"] for e in diverge] == ["START", "FAIL"]

    host = os.uname().nodename
    for event in (train[0], train[-1]):
        assert {"namespace": f"file://{host}", "name": str(data)} in _named(event["inputs"])
    done = train[-1]["run"]["facets"]["tao_job"]
    jsonschema.validate(done, {**facet_schema, "$ref": "#/$defs/TAOJobRunFacet"})
    assert done["platform"] == "local" and done["state"] == "Complete" and done["gpuCount"] == 0
    assert done["numNodes"] == 1 and done["gpuHours"] == 0.0 and done["jobId"]
    assert _named(train[-1]["outputs"]) == [
        {"namespace": f"file://{host}", "name": str(tmp_path / "results" / done["jobId"])}
    ]
    failed = diverge[-1]["run"]["facets"]["tao_job"]
    jsonschema.validate(failed, {**facet_schema, "$ref": "#/$defs/TAOJobRunFacet"})
    assert failed["failureClass"] == "ERR_PROGRAM" and failed["state"] == "Error"


def _named(datasets: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [{"namespace": d["namespace"], "name": d["name"]} for d in datasets]
