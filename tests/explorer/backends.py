"""What each platform's backend itself says about the jobs of a task instance -- never asked through the provider:
the local platform's job folders and ``/proc``, the Docker engine's containers by label.

A job that *ran* started on the backend; it is *live* while its process (container) runs; it was *stopped* when it
ended by a signal (a cancel) rather than by its own exit; ``created`` orders the jobs of one name.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The job of every schedule: short, and it leaves its own id in its results folder (I5 reads it back).
JOB_SECONDS = 1.5
#: It ends on a cancel's SIGTERM at once (as a trainer does; a shell as a container's PID 1 would ignore it and run on
#: through the cancel's grace, long enough to end by itself at the explorer's time scale).
COMMAND = (
    f'trap "exit 143" TERM; sleep {JOB_SECONDS} & wait $!; mkdir -p "$TAO_RESULTS_ROOT/$TAO_JOB_ID"; echo "$TAO_JOB_ID" > "$TAO_RESULTS_ROOT/$TAO_JOB_ID/ran"'
)
#: The same job, but the first one of each task instance fails as a node fault does (ERR_INFRA: Airflow retries), so
#: the explorer also walks the retry's path: an ended job found, a new one submitted.
FLAKY = (
    'flag="$TAO_RESULTS_ROOT/.failed-once-$TAO_JOB_NAME"; '
    'if [ ! -e "$flag" ]; then touch "$flag"; echo "NCCL WARN net: remote process exited"; exit 1; fi; ' + COMMAND
)
JOBS = {"ok": COMMAND, "flaky": FLAKY}
POLL_INTERVAL = 0.2
SIGNALLED = frozenset({-15, -9, 128 + 15, 128 + 9})


@dataclass(frozen=True)
class BackendJob:
    job_id: str
    created: float
    ran: bool
    live: bool
    exit_code: int | None  # None: still live, or killed with no exit recorded
    results_dir: str

    @property
    def stopped(self) -> bool:
        """Ended by a signal (a cancel), not by its own exit."""
        return not self.live and self.ran and (self.exit_code is None or self.exit_code in SIGNALLED)

    @property
    def completed(self) -> bool:
        return not self.live and self.exit_code == 0


class Backend:
    platform = ""
    poll_interval = POLL_INTERVAL

    def operator_kwargs(self, command: str) -> dict[str, Any]:
        raise NotImplementedError

    def jobs(self, name: str) -> list[BackendJob]:
        raise NotImplementedError

    def live_ids(self, name: str) -> set[str]:
        return {job.job_id for job in self.jobs(name) if job.live}

    def leftovers(self, name: str, run_id: str, state: str) -> list[str]:
        """Platform resources of the name still held after its jobs ended and one sweep ran (I6); ``run_id`` and
        ``state`` are the task instance's (a sweep keeps what a waiting task will read)."""
        return []

    def host_path(self, results_dir: str) -> Path:
        """A job's results folder as this machine sees it (I5 reads the job's own marker there)."""
        return Path(results_dir)


def _proc_groups() -> dict[int, list[int]]:
    """Live (non-zombie) processes by process group, from ``/proc``."""
    groups: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            groups.setdefault(int(fields[2]), []).append(int(entry))
    return groups


class LocalBackend(Backend):
    """The local platform: one folder per job under the connection's ``jobs_dir`` and its process group."""

    platform = "local"

    def __init__(self, conn_id: str, jobs_dir: Path) -> None:
        self.conn_id = conn_id
        self.jobs_dir = jobs_dir

    def operator_kwargs(self, command: str) -> dict[str, Any]:
        return {"conn_id": self.conn_id, "command": command, "poll_interval": self.poll_interval, "retries": 3}

    def jobs(self, name: str) -> list[BackendJob]:
        groups = None
        found = []
        for folder in self.jobs_dir.iterdir() if self.jobs_dir.is_dir() else []:
            meta = _json(folder / "meta.json")
            if meta is None or meta.get("name") != name:
                continue
            pid = _json(folder / "pid")
            verdict = _json(folder / "exit_code")
            live = False
            if pid is not None and verdict is None:
                groups = _proc_groups() if groups is None else groups
                live = bool(groups.get(int(pid["pgid"])))
            if pid is None and verdict is None:
                live = (folder / "launch.json").exists() and not (folder / "marks" / "cancel").exists()
            found.append(
                BackendJob(
                    job_id=folder.name,
                    created=float(meta.get("submitted_at") or 0),
                    ran=pid is not None,
                    live=live,
                    exit_code=None if verdict is None else int(verdict["exit_code"]),
                    results_dir=str(meta.get("results_dir", "")),
                )
            )
        return sorted(found, key=lambda j: j.created)


class DockerBackend(Backend):
    """The Docker engine: this provider's containers carrying the job name's label."""

    platform = "docker"

    def __init__(self, conn_id: str, engine: Any) -> None:
        self.conn_id = conn_id
        self.engine = engine
        self.client = engine.client

    def operator_kwargs(self, command: str) -> dict[str, Any]:
        return {
            "conn_id": self.conn_id,
            "image": self.engine.busybox,
            "command": ["sh", "-c", command],
            "poll_interval": self.poll_interval,
            "retries": 3,
        }

    def jobs(self, name: str) -> list[BackendJob]:
        from airflow_provider_tao.hooks import container as ct

        found = []
        for summary in self.engine.named(name):
            labels = summary.get("Labels") or {}
            try:
                state = self.client.inspect_container(summary["Id"])["State"]
            except Exception:  # removed between the list and the inspect
                continue
            live = state["Status"] in ("running", "restarting", "paused", "created")
            ran = not str(state.get("StartedAt", "")).startswith("0001-")
            found.append(
                BackendJob(
                    job_id=labels.get(ct.LABEL_JOB_ID, ""),
                    created=float(summary.get("Created") or 0),
                    ran=ran,
                    live=(live and ran) or state["Status"] == "created",
                    exit_code=None if live else int(state.get("ExitCode", 0)),
                    results_dir=labels.get(ct.LABEL_RESULTS_DIR, ""),
                )
            )
        return sorted(found, key=lambda j: j.created)


def _json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


class KubernetesBackend(Backend):
    """The fake API server (``tests/kubefake``): its record of every Job ever created (``/fake/created``, deleted
    ones too) and its objects read over its own HTTP API; a Job's pods are real containers on the test engine
    (labelled with the Job's uid), whose state and exit code say whether it ran, runs, or was stopped.

    A pod's container is removed with its Job, so each state seen is kept: a Job deleted before any sample saw its
    pod reads as never ran (I2 cannot judge it; I1 sampled it while it ran).
    """

    platform = "kubernetes"

    def __init__(self, conn_id: str, fake: Any, engine: Any) -> None:
        self.conn_id = conn_id
        self.fake = fake
        self.engine = engine
        self.seen: dict[str, dict[str, Any]] = {}  # Job uid -> the last state of its pod's container

    def operator_kwargs(self, command: str) -> dict[str, Any]:
        return {
            "conn_id": self.conn_id,
            "image": self.engine.busybox,
            "command": ["sh", "-c", command],
            "gpu_count": 0,
            "poll_interval": self.poll_interval,
            "retries": 3,
        }

    def _pod_state(self, uid: str) -> dict[str, Any] | None:
        listed = self.engine.client.containers(all=True, filters={"label": f"kubefake.owner-uid={uid}"})
        for summary in listed:
            if summary["State"] in ("running", "restarting"):
                self.seen[uid] = {"live": True, "exit": None}
            else:
                try:
                    state = self.engine.client.inspect_container(summary["Id"])["State"]
                except Exception:  # removed between the list and the inspect
                    continue
                self.seen[uid] = {"live": False, "exit": int(state.get("ExitCode") or 0)}
        state = self.seen.get(uid)
        if state is not None and state["live"] and not listed:
            self.seen[uid] = state = {"live": False, "exit": None}  # deleted with its Job while it ran
        return state

    def jobs(self, name: str) -> list[BackendJob]:
        from airflow_provider_tao.hooks import container as ct

        found = []
        for entry in self.fake.created("jobs"):
            if entry["name"] != name:
                continue
            state = self._pod_state(entry["uid"])
            labels = entry.get("labels") or {}
            found.append(
                BackendJob(
                    job_id=labels.get(ct.LABEL_JOB_ID, ""),
                    created=float(entry.get("created") or 0),
                    ran=state is not None,
                    live=bool(state and state["live"]),
                    exit_code=None if state is None else state["exit"],
                    results_dir=labels.get(ct.LABEL_RESULTS_DIR, ""),
                )
            )
        return sorted(found, key=lambda j: j.created)

    def leftovers(self, name: str, run_id: str, state: str) -> list[str]:
        """One sweep (``reap_resources``: canceled Jobs no task waits on, Jobs left suspended by a dead submission),
        then what is left of the name's jobs on the server: a Job that has not finished, or an object (Secret,
        ConfigMap, Service, pod) of a Job that is gone. A finished Job stays until its ``ttlSecondsAfterFinished``
        with what it owns (Kubernetes' own garbage collection, not ours)."""
        from airflow_provider_tao.hooks import container as ct
        from airflow_provider_tao.hooks import get_platform_hook
        from airflow_provider_tao.hooks.kubernetes_status import SETUP_TIMEOUT_SECONDS

        ids = {job.job_id for job in self.jobs(name)}
        batch = self.fake.api("batch")
        live_jobs = {j.metadata.labels.get(ct.LABEL_JOB_ID): j for j in batch.list_namespaced_job("default").items}
        if any(j.spec.suspend and j.metadata.name == name for j in live_jobs.values()):
            time.sleep(SETUP_TIMEOUT_SECONDS + 1)  # a suspended Job of a dead submission is swept past its window
            hook = get_platform_hook("kubernetes", self.conn_id)
            hook.reap_resources(lambda origin: state if origin.get("run_id") == run_id else "running", dry_run=False)
        left = []
        for job_id in ids:
            objects = self.fake.objects_of(job_id)
            job = live_jobs.get(job_id) if objects.get("jobs") else None
            finished = job is not None and any(
                c.type in ("Complete", "Failed") and c.status == "True" for c in job.status.conditions or []
            )
            if finished and job.spec.ttl_seconds_after_finished is not None:
                continue
            if objects:
                left.append(f"job {job_id}: {objects} ({'suspended' if job and job.spec.suspend else 'no Job'})")
        return left

    def host_path(self, results_dir: str) -> Path:
        from airflow_provider_tao.hooks.kubernetes import RESULTS_MOUNT

        return self.fake.results_dir / Path(results_dir).relative_to(RESULTS_MOUNT)
