"""DAGs of the fault matrix (``tests/e2e/matrix``): one DAG per case, one task per platform (``local``, ``slurm``,
``docker``, ``kubernetes``, ``lepton``, ``brev``) on the ``tao_mx_<platform>`` connections, so one DAG run puts the
case to all six platforms at once.

Every job prints ``tick <i> of <job id>`` once a second for ``seconds`` (the run's conf), then ``finished``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
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


class Explored(TAOSubmitOperator):
    """The explorer's second level (``test_matrix_explore.py``): try 1 runs with the in-process explorer's
    instrumentation (:mod:`tests.explorer.recorder`: every platform call and ``task_state_store`` write is a boundary
    ``<phase>:<call>#n``, phases ``execute`` and ``resume``), each boundary passed appended to
    ``explore.<run>.<task>.boundaries``. At its schedule's boundary (the run's conf ``boundaries``: task -> boundary)
    it touches ``explore.<run>.<task>.hit`` and blocks there until the test has interrupted it through Airflow (its
    process killed, the task cleared or marked) or lets it go on (``.release``). Later tries run as usual."""

    def execute(self, context: Any) -> Any:
        with _explored(context, "execute"):
            return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        with _explored(context, "resume"):
            return super().execute_complete(context, event)


_INSTRUMENTED: set[type] = set()


class _RecordedStore:
    """``task_state_store`` whose writes are boundaries, as ``tests.explorer.recorder.RecordingStore``'s."""

    def __init__(self, store: Any, recorder: Any) -> None:
        self.store, self.recorder = store, recorder

    def get(self, key: str, default: Any = None) -> Any:
        return self.store.get(key, default)

    def set(self, key: str, value: Any, **kwargs: Any) -> None:
        self.store.set(key, value, **kwargs)
        self.recorder.passed(f"store.set[{key}]")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


@contextlib.contextmanager
def _explored(context: Any, phase: str) -> Iterator[None]:
    ti = context["ti"]
    if ti.try_number != 1:
        yield
        return
    from airflow_provider_tao.hooks import get_platform_hook
    from tests.explorer.recorder import CURRENT, Recorder, instrument_hook

    platform = ti.task_id
    cls = type(get_platform_hook(platform, PLATFORMS[platform]["conn_id"]))
    if cls not in _INSTRUMENTED:
        instrument_hook(cls, setattr)
        _INSTRUMENTED.add(cls)
    stem = f"explore.{ti.run_id.replace('/', '_')}.{ti.task_id}"
    target = ((context["dag_run"].conf or {}).get("boundaries") or {}).get(platform)

    def passed(label: str) -> None:
        with (MARKS / f"{stem}.boundaries").open("a") as out:
            out.write(label + "\n")

    def hit(label: str) -> None:
        (MARKS / f"{stem}.hit").write_text(label)
        release = MARKS / f"{stem}.release"
        deadline = time.monotonic() + 600
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.2)

    recorder = Recorder(target, on_hit=hit, on_boundary=passed)
    recorder.phase = phase
    context["task_state_store"] = _RecordedStore(context["task_state_store"], recorder)
    token = CURRENT.set(recorder)
    try:
        yield
    finally:
        CURRENT.reset(token)


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
# (60 s: the timeout counts from the task's start, and the submission must be over -- the task deferred -- before it
# passes; under load a Kubernetes submission took over 20 s and the task timed out on the worker, issue 35)
_case("mx_timeout", execution_timeout=timedelta(seconds=60))
# triggerer SIGKILL and restart, and two triggerers of which one is killed
_case("mx_triggerer")
# the backend unreachable for 60 s
_case("mx_outage")
# the explorer's sampled schedules through this standalone
_case("mx_explore", operator=Explored, retries=1)

MATRIX_DAG_IDS = (
    "mx_unrecorded",
    "mx_clear",
    "mx_kill",
    "mx_orphan",
    "mx_timeout",
    "mx_triggerer",
    "mx_outage",
    "mx_explore",
)
