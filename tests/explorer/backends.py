"""What each platform's backend itself says about the jobs of a task instance -- never asked through the provider:
the local platform's job folders and ``/proc``, the Docker engine's containers by label.

A job that *ran* started on the backend; it is *live* while its process (container) runs; it was *stopped* when it
ended by a signal (a cancel) rather than by its own exit; ``created`` orders the jobs of one name.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The job of every schedule: short, and it leaves its own id in its results folder (I5 reads it back).
JOB_SECONDS = 1.5
#: It ends on a cancel's SIGTERM at once (as a trainer does; a shell as a container's PID 1 would ignore it and run on
#: through the cancel's grace, long enough to end by itself at the explorer's time scale).
COMMAND = (
    f'trap "exit 143" TERM; sleep {JOB_SECONDS} & wait $!; echo "$TAO_JOB_ID" > "$TAO_RESULTS_ROOT/$TAO_JOB_ID/ran"'
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

    def leftovers(self, name: str) -> list[str]:
        """Platform resources of the name still held after its jobs ended (I6)."""
        return []


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
        from airflow_provider_tao.hooks.shared import container as ct

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
