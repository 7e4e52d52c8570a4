"""DAGs of the fault matrix (``tests/e2e/matrix``): one DAG per case, one task per platform (``local``, ``slurm``,
``docker``, ``kubernetes``, ``lepton``, ``brev``) on the ``tao_mx_<platform>`` connections, so one DAG run puts the
case to all six platforms at once.

Every job prints ``tick <i> of <job id>`` once a second for ``seconds`` (the run's conf), then ``finished``.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG

from airflow_provider_tao.operators.submit import TAOSubmitOperator
from airflow_provider_tao.records import SUBMITTED, JobRecord

#: platform -> {"conn_id", "image", "python_image"} (set by the matrix's standalone)
PLATFORMS: dict[str, dict[str, Any]] = json.loads(os.environ.get("TAO_MX_PLATFORMS") or "{}")
MARKS = Path(os.environ.get("TAO_MX_MARKS") or "/tmp")
TICKS = (
    'echo "started $TAO_JOB_ID"; i=0; while [ "$i" -lt "$RUN_SECONDS" ]; do i=$((i + 1)); '
    'echo "tick $i of $TAO_JOB_ID"; sleep 1; done; echo finished'
)
ENV = {"RUN_SECONDS": "{{ dag_run.conf.get('seconds', 20) }}"}


class HeldBeforeRecording(TAOSubmitOperator):
    """Try 1 stops after it submitted its job and before it recorded it anywhere (``task_state_store``, XCom): the
    test SIGKILLs its worker there. Later tries run as usual."""

    def _keep(self, context: Any, record: JobRecord) -> None:
        ti = context["ti"]
        if ti.try_number == 1 and record.state == SUBMITTED:
            (MARKS / f"held.{record.job_id}.{ti.task_id}.{ti.run_id.replace('/', '_')}").touch()
            time.sleep(3600)
        super()._keep(context, record)


def _case(dag_id: str, *, variants: dict[str, dict[str, Any]] | None = None, operator: type = TAOSubmitOperator,
          retries: int = 0, **task: Any) -> None:  # fmt: skip
    """One DAG: a task per platform (and per variant, named ``<platform>_<variant>``)."""
    with DAG(
        dag_id,
        schedule=None,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        max_active_runs=4,
        default_args={"retries": retries, "retry_delay": timedelta(seconds=1)},
        tags=["tao-matrix"],
    ):
        for platform, where in PLATFORMS.items():
            for variant, extra in (variants or {"": {}}).items():
                operator(
                    task_id=f"{platform}_{variant}" if variant else platform,
                    conn_id=where["conn_id"],
                    image=where["image"],
                    command=TICKS,
                    env=ENV,
                    gpu_count=0,
                    poll_interval=1,
                    **{"deferrable": True, **task, **extra},
                )


# worker SIGKILL right after submission, then Airflow's retry: it waits on the worker, so the kill hits the waiter
_case("mx_worker_kill", deferrable=False, retries=1)
# worker SIGKILL between submission and recording the job: the retry finds it by its name
_case("mx_unrecorded", operator=HeldBeforeRecording, retries=1)
# clear while deferred
_case("mx_clear", retries=1)
# mark failed / success while deferred: canceled; with cancel_on_kill=False: kept
_case(
    "mx_kill",
    variants={"failed": {}, "success": {}, "keep": {"cancel_on_kill": False}},
)
# mark failed before a triggerer picked the trigger up: the sweeper cancels the job (kept with cancel_on_kill=False)
_case("mx_orphan", variants={"": {}, "keep": {"cancel_on_kill": False}})
# execution_timeout while deferred
_case("mx_timeout", execution_timeout=timedelta(seconds=20))
# triggerer SIGKILL and restart, and two triggerers of which one is killed
_case("mx_triggerer")
# the backend unreachable for 60 s
_case("mx_outage")

MATRIX_DAG_IDS = (
    "mx_worker_kill",
    "mx_unrecorded",
    "mx_clear",
    "mx_kill",
    "mx_orphan",
    "mx_timeout",
    "mx_triggerer",
    "mx_outage",
)
