"""The upload case of the fault matrix (``tests/e2e/matrix/test_matrix_upload.py``): one DAG, a task per platform,
each a job that waits ``hold`` seconds, then writes ``files`` outputs of ``file_kib`` KiB (the run's conf), which
the in-job runner uploads to ``s3://<the matrix's bucket>/mx-upload/<tag>/<platform>/<job id>/`` with its
manifests; ``retries=1``.

A file's bytes follow from the run's ``seed`` and its index (``shake_256("<seed>/<index>")``), so the test knows
what every file must hold without asking the job.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG

from airflow_provider_tao.operators.submit import TAOSubmitOperator

#: platform -> {"conn_id", "image", "python_image"} (set by the matrix's standalone)
PLATFORMS: dict[str, dict[str, Any]] = json.loads(os.environ.get("TAO_MX_PLATFORMS") or "{}")
#: {"bucket", "tasks": platform -> {"storage_conn_id", "env", "backend_details"}} (set by the matrix's standalone)
S3: dict[str, Any] = json.loads(os.environ.get("TAO_MX_S3") or '{"bucket": "", "tasks": {}}')

UPLOAD_DAG_ID = "mx_upload"
OUTPUT_NAME = "part-%03d.bin"

WRITE_OUTPUTS = r"""
import hashlib, json, os, sys, time
time.sleep(int(os.environ["UPLOAD_HOLD_SECONDS"]))
out = json.load(open(sys.argv[1]))["train"]["results_dir"]
os.makedirs(out, exist_ok=True)
seed, size = os.environ["UPLOAD_SEED"], int(os.environ["UPLOAD_FILE_KIB"]) * 1024
count = int(os.environ["UPLOAD_FILES"])
for index in range(count):
    with open(os.path.join(out, "part-%03d.bin" % index), "wb") as handle:
        handle.write(hashlib.shake_256(("%s/%d" % (seed, index)).encode()).digest(size))
print("wrote", count, "outputs of", size, "bytes")
"""

with DAG(
    UPLOAD_DAG_ID,
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=4,
    default_args={"retries": 1, "retry_delay": timedelta(seconds=1)},
    tags=["tao-matrix"],
):
    for platform, where in PLATFORMS.items():
        task = S3["tasks"].get(platform) or {}
        TAOSubmitOperator(
            task_id=platform,
            conn_id=where["conn_id"],
            image=where["python_image"],
            command=["python3", "-c", WRITE_OUTPUTS, "{config_path}"],
            specs={"train": {"results_dir": "output"}},
            outputs=["train.results_dir"],
            config_format="json",
            storage_conn_id=task.get("storage_conn_id"),
            results_uri=f"s3://{S3['bucket']}/mx-upload/{{{{ dag_run.conf['tag'] }}}}/{platform}",
            env={
                "UPLOAD_SEED": "{{ dag_run.conf['seed'] }}",
                "UPLOAD_FILES": "{{ dag_run.conf['files'] }}",
                "UPLOAD_FILE_KIB": "{{ dag_run.conf['file_kib'] }}",
                "UPLOAD_HOLD_SECONDS": "{{ dag_run.conf.get('hold', 0) }}",
                # two uploads at a time: the first objects appear on S3 early, the rest take a while
                "TAO_TRANSFER_CONCURRENCY": "2",
                **task.get("env", {}),
            },
            backend_details=task.get("backend_details") or {},
            gpu_count=0,
            poll_interval=1,
            deferrable=True,
        )
