"""Operator -> local platform -> in-job runner -> outputs + manifest in S3 (moto) -> XCom, for real.

The job is a real detached process on this host; S3 is a moto server on loopback; the storage credentials come
from an ``aws`` Airflow connection and must reach the job only through its environment.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from airflow_provider_tao.hooks.local import LocalHook
from airflow_provider_tao.jobs import JobHandle
from airflow_provider_tao.operators.submit import TAOSubmitOperator
from airflow_provider_tao.runner.entrypoint import MANIFEST_NAME
from tests.unit.fakes import Store, make_context

SECRET = "moto-secret-Zq9"  # a test credential whose leaks we look for


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, moto_endpoint: str) -> Path:
    monkeypatch.setenv(
        "AIRFLOW_CONN_TAO_LOCAL_T",
        json.dumps(
            {
                "conn_type": "tao_local",
                "extra": {"jobs_dir": str(tmp_path / "jobs"), "results_root": str(tmp_path / "results")},
            }
        ),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_S3_T",
        json.dumps(
            {
                "conn_type": "aws",
                "login": "testing",
                "password": SECRET,
                "extra": {"endpoint_url": moto_endpoint, "region_name": "us-east-1"},
            }
        ),
    )
    return tmp_path


def _run_to_end(op: TAOSubmitOperator, store: Store) -> dict[str, Any]:
    """execute -> (deferred) -> poll the real job until it ends -> execute_complete, like the triggerer would."""
    context = make_context(store)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context)
    handle = JobHandle.from_json(deferred.value.trigger.serialize()[1]["handle"])
    hook = LocalHook("tao_local_t")
    deadline = time.monotonic() + 120
    while not (status := hook.get_job_status(handle)).state.is_terminal:
        assert time.monotonic() < deadline, hook.get_job_logs(handle)[0]
        time.sleep(0.2)
    event = {
        "status": {"Complete": "complete", "Error": "error", "Canceled": "canceled"}[status.state.value],
        "handle": handle.to_json(),
        "job_status": status.to_json(),
        "log_cursor": "",
        "message": "",
    }
    return op.execute_complete(context, event)


TRAIN = r"""
import json, os, sys
spec = json.load(open(sys.argv[1]))
train_dir = spec["dataset"]["train_dir"]
assert os.path.isdir(train_dir), train_dir  # the s3:// prefix was downloaded and rewritten to a local folder
out = spec["train"]["results_dir"]
with open(os.path.join(out, "model.pth"), "w") as f:
    f.write(",".join(sorted(os.listdir(train_dir))))
with open(os.path.join(os.environ["TAO_RESULTS_DIR"], "env.txt"), "w") as f:
    f.write("\n".join(f"{k}={v}" for k, v in os.environ.items()))
print("step 7", flush=True)
"""


def test_config_mode_end_to_end_through_s3(connections: Path, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="data/train/a.csv", Body=b"1,2\n")
    s3.put_object(Bucket=bucket, Key="data/train/b.csv", Body=b"3,4\n")
    op = TAOSubmitOperator(
        task_id="train",
        conn_id="tao_local_t",
        storage_conn_id="s3_t",
        command=["python3", "-c", TRAIN, "{config_path}"],
        gpu_count=0,
        deferrable=True,
        specs={"dataset": {"train_dir": f"s3://{bucket}/data/train/"}, "train": {"results_dir": "output"}},
        inputs=["dataset.train_dir"],
        outputs=["train.results_dir"],
        config_format="json",
        results_uri=f"s3://{bucket}/runs",
    )
    result = _run_to_end(op, Store())

    job_id = result["job_id"]
    assert result["results_dir"] == f"s3://{bucket}/runs/{job_id}"
    assert result["outputs"] == {"train.results_dir": f"s3://{bucket}/runs/{job_id}/train_results_dir"}
    prefix = f"runs/{job_id}/train_results_dir"
    assert s3.get_object(Bucket=bucket, Key=f"{prefix}/model.pth")["Body"].read() == b"a.csv,b.csv"
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}/{MANIFEST_NAME}")["Body"].read())
    assert manifest["job_id"] == job_id and manifest["exit_code"] == 0
    assert [f["path"] for f in manifest["files"]] == ["model.pth"]
    # the secret reached the job through its environment only: not in job files, logs, runner.json or XCom
    env_txt = s3.get_object(Bucket=bucket, Key=f"runs/{job_id}/env.txt")["Body"].read().decode()
    assert f"AWS_SECRET_ACCESS_KEY={SECRET}" in env_txt and f"TAO_JOB_ID={job_id}" in env_txt
    for path in (connections / "jobs").rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path
    assert SECRET not in json.dumps(result)


def test_passthrough_on_the_local_platform_keeps_outputs_in_the_results_root(connections: Path) -> None:
    data = connections / "input.txt"
    data.write_text("hello")
    workdir = connections / "job-paths"  # "container" paths are host paths on the local platform
    op = TAOSubmitOperator(
        task_id="train",
        conn_id="tao_local_t",
        command=f"mkdir -p {workdir}/out && cp {workdir}/in/input.txt {workdir}/out/copy.txt",
        gpu_count=0,
        deferrable=True,
        inputs={f"{workdir}/in/input.txt": str(data)},
        outputs=[f"{workdir}/out"],
    )
    result = _run_to_end(op, Store())
    out = Path(result["outputs"][f"{workdir}/out"])
    assert out == connections / "results" / result["job_id"] / "out"
    assert (out / "copy.txt").read_text() == "hello"
    assert json.loads((out / MANIFEST_NAME).read_text())["files"][0]["path"] == "copy.txt"


def test_a_missing_s3_input_fails_before_any_job_is_submitted(connections: Path, bucket: str) -> None:
    op = TAOSubmitOperator(
        task_id="train",
        conn_id="tao_local_t",
        storage_conn_id="s3_t",
        command="true {config_path}",
        gpu_count=0,
        specs={"dataset": {"train_dir": f"s3://{bucket}/nope/"}},
        inputs=["dataset.train_dir"],
    )
    with pytest.raises(AirflowFailException, match=r"inputs\['dataset.train_dir'\]: s3://.*/nope/ does not exist"):
        op.execute(make_context(Store()))
    assert not (connections / "jobs").exists() or not any((connections / "jobs").iterdir())


def test_flat_dotted_spec_keys_fail_before_submission(connections: Path) -> None:
    op = TAOSubmitOperator(
        task_id="train", conn_id="tao_local_t", command="true", gpu_count=0, specs={"train.epochs": 3}
    )
    with pytest.raises(AirflowFailException, match=r"specs.*\{\"train\": \{\"epochs\": 3\}\}|specs.*'train'"):
        op.execute(make_context(Store()))


def test_s3_input_check_finds_a_folder_behind_siblings_with_the_same_prefix(
    s3: Any, bucket: str, connections: Path
) -> None:
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    from airflow_provider_tao.operators.staging import _s3_exists

    # "-" and "." sort before "/": with two such siblings a short listing of "data/train" never reaches the folder
    for key in ("data/train-a.csv", "data/train.csv", "data/train/a.csv", "exact.bin"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    hook = S3Hook(aws_conn_id="s3_t")
    assert _s3_exists(hook, f"s3://{bucket}/data/train/")
    assert _s3_exists(hook, f"s3://{bucket}/data/train")
    assert _s3_exists(hook, f"s3://{bucket}/data/train.csv")
    assert _s3_exists(hook, f"s3://{bucket}/exact.bin")
    assert _s3_exists(hook, f"s3://{bucket}")
    assert not _s3_exists(hook, f"s3://{bucket}/data/tra")
    assert not _s3_exists(hook, f"s3://{bucket}/data/nope/")


def test_the_local_how_tos_config_mode_example_runs_as_written(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """docs/howto/local.md's config-mode example: the spec reaches the program, its output folder is committed."""
    import re

    page = (Path(__file__).resolve().parents[3] / "docs" / "howto" / "local.md").read_text()
    section = page[page.index("## Config mode") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    monkeypatch.setenv("AIRFLOW__TAO__LOCAL_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("AIRFLOW__TAO__LOCAL_RESULTS_ROOT", str(tmp_path / "results"))
    namespace: dict[str, Any] = {}
    exec(compile(code, "local.md", "exec"), namespace)
    op: TAOSubmitOperator = namespace["train"]
    op.poll_interval = 0.2
    result = op.execute(make_context(Store()))  # not deferrable: waits on the worker
    out = Path(result["outputs"]["train.results_dir"])
    assert out == tmp_path / "results" / result["job_id"] / "train_results_dir"
    assert json.loads((out / "model.json").read_text()) == {"epochs": 3, "lr": 0.01}
    assert json.loads((out / MANIFEST_NAME).read_text())["files"][0]["path"] == "model.json"
