"""An in-memory platform for operator and trigger tests: jobs are dict entries whose state the test sets."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from unittest import mock

from airflow_provider_tao.accounting import JobUsage
from airflow_provider_tao.failures import FailureFacts
from airflow_provider_tao.hooks.base import JobSubmitError, TAOPlatformHook
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobSpec, JobState, JobStatus


class FakeHook(TAOPlatformHook):
    """Shared state lives on the class so every hook instance (operator, trigger) sees the same jobs. Each job
    belongs to the connection it was submitted on (``find_job`` looks on its own connection only, as a platform does).
    ``no_capacity`` connections refuse every submission with ``ERR_CAPACITY``; on ``queueing`` connections a job waits
    for resources (Pending, ``capacity_wait_since`` = its submission) until the test moves it on."""

    platform = "fake"
    conn_type = "tao_fake"
    default_conn_name = "tao_fake_default"
    hook_name = "TAO fake"
    supports_multi_node = True
    marks_storage = "the in-memory job entry"

    jobs: dict[str, dict[str, Any]] = {}
    status_calls: list[list[str]] = []
    logs: dict[str, str] = {}
    #: (status calls made so far, job id) of each log read; the most bytes one read returns
    log_reads: list[tuple[int, str]] = []
    log_read_limit: int = 1 << 20
    resubmit_budget: int = 0
    no_capacity: set[str | None] = set()
    queueing: set[str | None] = set()
    #: paths each connection can see (``check_path``); a connection without an entry sees every path
    visible: dict[str | None, set[str]] = {}

    @classmethod
    def reset(cls) -> None:
        cls.jobs = {}
        cls.status_calls = []
        cls.logs = {}
        cls.log_reads = []
        cls.log_read_limit = 1 << 20
        cls.resubmit_budget = 0
        cls.no_capacity = set()
        cls.queueing = set()
        cls.visible = {}

    def resubmit_if_retriable(self, handle: JobHandle, status: JobStatus) -> str | None:
        if type(self).resubmit_budget <= 0:
            return None
        type(self).resubmit_budget -= 1
        self.jobs[handle.job_id]["state"] = JobState.RUNNING
        return "infrastructure failure: resubmitted"

    def create_job(self, spec: JobSpec, try_number: int = 1) -> JobHandle:
        if self.conn_id in self.no_capacity:
            raise JobSubmitError(ErrClass.ERR_CAPACITY, f"no capacity on {self.conn_id}")
        handle = JobHandle(
            platform="fake",
            conn_id=self.conn_id,
            job_id=spec.job_id,
            name=spec.name,
            backend_job_id=f"b-{spec.job_id}",
            results_dir=f"/results/{spec.job_id}",
            try_number=try_number,
            console_url=f"https://fake/{spec.job_id}",
        )
        queued = self.conn_id in self.queueing
        self.jobs[spec.job_id] = {
            "handle": handle,
            "spec": spec,
            "state": JobState.PENDING if queued else JobState.RUNNING,
            "marks": {},
            "exit": None,
            "raw": "Queueing" if queued else "",
            "capacity_wait_since": handle.submitted_at if queued else None,
            "started": None if queued else handle.submitted_at,
            "ended": None,
        }
        self.write_mark(handle, "owner_try", try_number)
        return handle

    def find_job(self, name: str) -> JobHandle | None:
        found = [
            j["handle"] for j in self.jobs.values() if j["handle"].name == name and j["handle"].conn_id == self.conn_id
        ]
        return max(found, key=lambda h: h.submitted_at) if found else None

    def get_job_status(self, handle: JobHandle) -> JobStatus:
        job = self.jobs.get(handle.job_id)
        if job is None:
            return JobStatus.missing("not found")
        return JobStatus(
            job["state"],
            job.get("message") or f"fake {job['state'].value}",
            exit_code=job["exit"],
            raw_state=job.get("raw", ""),
            capacity_wait_since=job.get("capacity_wait_since") if job["state"] is JobState.PENDING else None,
        )

    def get_job_usage(self, handle: JobHandle) -> JobUsage:
        job = self.jobs[handle.job_id]
        return JobUsage(
            queued_at=handle.submitted_at,
            started_at=job.get("started"),
            ended_at=job.get("ended"),
            gpus_per_node=job.get("gpus"),
            nodes=job["spec"].num_nodes,
            gpu_type=job.get("gpu_type"),
            source="the fake's record",
        )

    def get_job_statuses(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        self.status_calls.append([h.job_id for h in handles])
        return {h.job_id: self.get_job_status(h) for h in handles}

    def get_job_logs(self, handle: JobHandle, cursor: str = "", tail: int | None = None) -> tuple[str, str]:
        self.log_reads.append((len(self.status_calls), handle.job_id))
        data = self.logs.get(handle.job_id, "").encode()
        start = int(cursor or 0)
        new = data[start : start + self.log_read_limit]
        if len(new) == self.log_read_limit and b"\n" in new:
            new = new[: new.rfind(b"\n") + 1]  # whole lines, as the timestamp-cursor platforms return them
        return new.decode(), str(start + len(new))

    def log_read_reached_end(self, text: str) -> bool:
        return len(text.encode()) < self.log_read_limit - 30  # shorter than a cut read (lines are shorter)

    def _cancel(self, handle: JobHandle) -> bool:
        job = self.jobs[handle.job_id]
        if not job["state"].is_terminal:
            job["state"] = JobState.CANCELED
        return True

    def failure_facts(self, handle: JobHandle) -> FailureFacts:
        job = self.jobs[handle.job_id]
        return FailureFacts(
            exit_code=job["exit"],
            raw_state=job.get("raw", ""),
            oom_killed=job.get("raw") == "OOMKilled",
            log_tail=self.logs.get(handle.job_id, "").splitlines(),
        )

    def check_path(self, uri: str) -> bool:
        return self.conn_id not in self.visible or uri in self.visible[self.conn_id]

    def read_marks(self, handle: JobHandle) -> dict[str, Any]:
        return dict(self.jobs[handle.job_id]["marks"]) if handle.job_id in self.jobs else {}

    def write_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        self.jobs[handle.job_id]["marks"][key] = value


class Store:
    """A dict-backed stand-in for ``context["task_state_store"]`` (shared by all tries of a task instance)."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        assert value is not None
        self.data[key] = value


def make_context(store: Store, try_number: int = 1, run_id: str = "manual__1") -> dict[str, Any]:
    ti = mock.MagicMock()
    ti.dag_id, ti.task_id, ti.run_id, ti.map_index = "dag", "train", run_id, -1
    ti.try_number = try_number
    ti.start_date = datetime.now(UTC)
    return {"ti": ti, "task_state_store": store}
