"""The ``local`` platform: jobs run as detached process groups on the worker host. Needs no service.

Layout of one job, ``<jobs_dir>/<job_id>/`` (folder mode 0700):

``meta.json``      name, try, submitter -- written before the process starts, so a job is findable by name
                   even when the worker dies during submission
``launch.json``    the argv and working folder the supervisor runs (no secrets: those ride in its environment)
``pid``            supervisor pid and process group
``job.log``        stdout + stderr of the command
``exit_code``      written atomically when the command ends
``marks/``         ownership marks (``owner_try``, ``cancel_requested_by``)
``files/``         the job's staged files (``TAO_JOB_FILES``)
``work/``          the command's working folder

The job's environment is built from scratch (a few host variables such as PATH and HOME, then the spec's),
so the worker's own secrets -- ``AIRFLOW_CONN_*``, the Fernet key, database URLs -- never reach the job.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from airflow_provider_tao import settings
from airflow_provider_tao.accounting import JobUsage
from airflow_provider_tao.failures import FailureFacts
from airflow_provider_tao.hooks.base import ConnectionProblem, JobValidationError, TAOPlatformHook
from airflow_provider_tao.hooks.local import supervisor
from airflow_provider_tao.hooks.ownership import cancel_binds
from airflow_provider_tao.jobs import JobHandle, JobSpec, JobState, JobStatus

#: Host variables a local job inherits from the worker; everything else comes from the job spec.
INHERITED_ENV = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "VIRTUAL_ENV",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "NVIDIA_DRIVER_CAPABILITIES",
)
#: How long a job may show no supervisor before it counts as never started.
LAUNCH_TIMEOUT_SECONDS = 30.0
LOG_CHUNK_BYTES = 1 << 20
_HOST = os.uname().nodename


def visible_gpus() -> list[str]:
    """GPU indices this worker host can give a job: ``CUDA_VISIBLE_DEVICES`` if the worker has one, else the
    NVIDIA driver's device list, else none."""
    restricted = os.environ.get("CUDA_VISIBLE_DEVICES")
    if restricted is not None:
        return [d.strip() for d in restricted.split(",") if d.strip() and d.strip() not in ("-1", "void", "none")]
    try:
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return []


def gpu_model() -> str | None:
    """The model of this host's first GPU, from the NVIDIA driver's ``information`` file (no nvidia-smi needed)."""
    try:
        first = sorted(os.listdir("/proc/driver/nvidia/gpus"))[0]
        text = Path("/proc/driver/nvidia/gpus", first, "information").read_text()
    except (OSError, IndexError):
        return None
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Model:")), None)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def _airflow_home() -> Path:
    return Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow"))


class LocalHook(TAOPlatformHook):
    """Runs jobs on the worker host as detached process groups.

    Connection type ``tao_local`` (optional: without a connection the defaults below are used). Extras:
    ``jobs_dir`` (default ``[tao] local_jobs_dir`` or ``$AIRFLOW_HOME/tao/jobs``), ``results_root`` (default
    ``[tao] local_results_root`` or ``$AIRFLOW_HOME/tao/results``), ``cancel_grace_seconds`` (default 10).

    :param conn_id: the ``tao_local`` connection, or None for the defaults.
    """

    platform = "local"
    conn_type = "tao_local"
    default_conn_name = "tao_local_default"
    hook_name = "TAO local"
    name_pattern = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    name_rule = "letters, digits, '_', '.' and '-', at most 128 characters, starting with a letter or digit"
    name_max_length = 128
    marks_storage = "small files in the job's folder (marks/)"
    log_reads_batched = True  # files on this host: no backend call

    def __init__(self, conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(conn_id=conn_id, **kwargs)
        self._log_ends: dict[str, int] = {}  # job id -> where its last log read ended (offset in job.log)

    # ----------------------------------------------------------------- settings

    @property
    def jobs_dir(self) -> Path:
        self.load_connection()
        configured = self.setting("jobs_dir")
        return Path(configured or settings.local_jobs_dir() or _airflow_home() / "tao" / "jobs")

    @property
    def results_root(self) -> Path:
        self.load_connection()
        configured = self.setting("results_root")
        return Path(configured or settings.local_results_root() or _airflow_home() / "tao" / "results")

    @property
    def cancel_grace_seconds(self) -> float:
        self.load_connection()
        return float(self.setting("cancel_grace_seconds", 10))

    def default_results_root(self) -> str:
        return str(self.results_root)

    def _job_dir(self, handle: JobHandle) -> Path:
        return self.jobs_dir / handle.job_id

    def probe_connection(self) -> str:
        """The jobs and results folders exist (or can be made) and the worker user may write them."""
        for label, folder in (("jobs folder", self.jobs_dir), ("results root", self.results_root)):
            if folder.exists() and not folder.is_dir():
                raise ConnectionProblem("config", f"the {label} {folder} is a file, not a folder")
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except PermissionError as exc:
                raise ConnectionProblem("permission", f"cannot create the {label} {folder}: {exc.strerror}") from exc
            except OSError as exc:  # a missing or read-only mount, a file on the way: the folder cannot be
                raise ConnectionProblem(
                    "not_found", f"cannot create the {label} {folder}: {exc.strerror} ({exc.filename})"
                ) from exc
            if not os.access(folder, os.W_OK | os.X_OK):
                raise ConnectionProblem("permission", f"the {label} {folder} is not writable by the worker user")
        return f"jobs in {self.jobs_dir}, results in {self.results_root}; {len(visible_gpus())} GPU(s) visible"

    def job_location(self, handle: JobHandle) -> dict[str, str]:
        where = {"Host": _host_of(handle) or _HOST, "Log file": str(self._job_dir(handle) / "job.log")}
        if handle.backend_job_id:
            where["Process group"] = handle.backend_job_id
        return where

    def list_active_jobs(self) -> list[JobHandle]:
        """Jobs of this host's jobs folder whose process group still runs."""
        handles = []
        try:
            folders = [p for p in self.jobs_dir.iterdir() if p.is_dir() and not p.name.startswith("_")]
        except OSError:
            return []
        for folder in folders:
            meta = _read_json(folder / "meta.json")
            if meta is not None and _host_of(JobHandle.from_json(meta)) in ("", _HOST):
                handles.append(JobHandle.from_json(meta))
        statuses = self.get_job_statuses(handles) if handles else {}
        return [h for h in handles if statuses[h.job_id].state.is_active]

    # ----------------------------------------------------------------- validation

    def image_required(self, spec: JobSpec) -> str | None:
        return None  # the job runs on the worker host

    def validate_spec(self, spec: JobSpec) -> None:
        super().validate_spec(spec)
        gpus = visible_gpus()
        if spec.gpu_count > len(gpus):
            raise JobValidationError(
                "gpu_count",
                f"asked for {spec.gpu_count} GPU(s) but this worker host has {len(gpus)} visible",
                "Use gpu_count=0 to run without GPUs, -1 for all visible GPUs, or a platform that has GPUs",
            )
        if spec.results_uri and not (spec.results_uri.startswith(("s3://", "file://", "/"))):
            raise JobValidationError(
                "results_uri",
                f"{spec.results_uri!r} is neither a local folder nor an s3:// URI",
                "On the local platform use an absolute path, a file:// URI, or s3:// with storage_conn_id",
            )
        for name in spec.files:
            if Path(name).is_absolute() or ".." in Path(name).parts:
                raise JobValidationError("files", f"{name!r} points outside the job folder", "Use relative names")
        if spec.image:
            self.log.warning("image=%r is ignored on the local platform: the job runs on the worker host", spec.image)

    def _gpu_env(self, gpu_count: int) -> str:
        gpus = visible_gpus()
        return ",".join(gpus if gpu_count == -1 else gpus[:gpu_count])

    # ----------------------------------------------------------------- submit

    def create_job(self, spec: JobSpec, try_number: int = 1) -> JobHandle:
        self.validate_spec(spec)
        self.jobs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        job_dir = self.jobs_dir / spec.job_id
        job_dir.mkdir(mode=0o700)
        for sub in ("marks", "files", "work"):
            (job_dir / sub).mkdir(mode=0o700)
        spec = replace(spec, results_uri=spec.results_uri and spec.results_uri.removeprefix("file://"))
        results_dir = self.results_dir_for(spec)
        # A local results root is TAO_RESULTS_ROOT; an s3:// one is uploaded to by the in-job runner.
        results_root = Path(spec.results_uri) if spec.results_uri and spec.results_uri.startswith("/") else None
        results_root = results_root or self.results_root
        if not results_dir.startswith("s3://"):
            Path(results_dir).mkdir(parents=True, exist_ok=True)
        for name, content in spec.files.items():
            target = job_dir / "files" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
            target.chmod(0o600)
        # The log's file URI names the host: only a process on that host can watch or cancel the job.
        handle = self.new_handle(spec, try_number, console_url=f"file://{_HOST}{job_dir / 'job.log'}")
        # Findable by name before the process exists: a worker killed mid-submit must not cause a duplicate.
        gpus = self._gpu_env(spec.gpu_count)
        supervisor.write_json_atomic(
            job_dir / "meta.json",
            {
                **handle.to_json(),
                "submitter_pid": os.getpid(),
                "submitter_host": _HOST,
                "gpus": len([g for g in gpus.split(",") if g]),
            },
        )
        self._index_name(spec.name, spec.job_id)
        self.write_mark(handle, "owner_try", try_number)
        argv = ["/bin/bash", "-c", spec.command] if isinstance(spec.command, str) else list(spec.command)
        supervisor.write_json_atomic(job_dir / "launch.json", {"argv": argv, "cwd": str(job_dir / "work")})
        with open(job_dir / "job.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, supervisor.__file__, str(job_dir)],
                env=self._job_env(spec, results_root, job_dir),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                close_fds=True,
            )
        handle = JobHandle(**{**handle.to_json(), "backend_job_id": str(proc.pid)})
        meta = {**(_read_json(job_dir / "meta.json") or {}), **handle.to_json()}
        supervisor.write_json_atomic(job_dir / "meta.json", meta)
        self.log.info(
            "Started local job %s (%s) as process group %s; log: %s",
            spec.job_id,
            spec.name,
            proc.pid,
            job_dir / "job.log",
        )
        return handle

    def _job_env(self, spec: JobSpec, results_root: Path, job_dir: Path) -> dict[str, str]:
        """A clean environment: a few host variables, the TAO ones, the secrets (private to the job's user)."""
        env = {key: os.environ[key] for key in INHERITED_ENV if key in os.environ}
        env.update(self.tao_env(spec, files_dir=str(job_dir / "files"), results_root=str(results_root)))
        env.update(spec.secret_env)
        env["CUDA_VISIBLE_DEVICES"] = self._gpu_env(spec.gpu_count)
        return env

    def _index_name(self, name: str, job_id: str) -> None:
        index = self.jobs_dir / "_names"
        index.mkdir(exist_ok=True, mode=0o700)
        tmp = index / f".{name}.{uuid.uuid4().hex}"
        tmp.write_text(job_id)
        os.replace(tmp, index / name)

    def find_job(self, name: str) -> JobHandle | None:
        try:
            job_id = (self.jobs_dir / "_names" / name).read_text().strip()
        except OSError:
            return None
        meta = _read_json(self.jobs_dir / job_id / "meta.json")
        if meta is None:
            return None
        handle = JobHandle.from_json(meta)
        pid = _read_json(self.jobs_dir / job_id / "pid")
        return JobHandle(**{**handle.to_json(), "backend_job_id": str(pid["pid"])}) if pid else handle

    # ----------------------------------------------------------------- status

    def get_job_status(self, handle: JobHandle) -> JobStatus:
        self._check_jobs_dir()
        return self._status(handle, supervisor.live_groups())

    def get_job_statuses(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        self._check_jobs_dir()
        live = supervisor.live_groups()  # one /proc scan for the whole batch
        statuses = {h.job_id: self._status(h, live) for h in handles}
        self._log_ends = {h.job_id: end for h in handles if (end := self._log_ends.get(h.job_id)) is not None}
        jobs_dir = self.jobs_dir
        self._quiet_logs = frozenset(
            job for job, end in self._log_ends.items() if _size(jobs_dir / job / "job.log") == end
        )
        return statuses

    def _check_jobs_dir(self) -> None:
        # Without its jobs folder (an unmounted or moved volume) the platform cannot answer at all: that is an
        # outage, not a verdict that every job is gone.
        if not self.jobs_dir.is_dir():
            raise ConnectionError(f"the jobs folder {self.jobs_dir} is not there (an unmounted or moved volume?)")

    def _status(self, handle: JobHandle, live: set[int]) -> JobStatus:
        job_dir = self._job_dir(handle)
        meta = _read_json(job_dir / "meta.json")
        if meta is None:
            return JobStatus.missing(f"no local job {handle.job_id} under {self.jobs_dir}")
        if (done := self._finished(handle)) is not None:
            return done
        pid = _read_json(job_dir / "pid")
        canceling = cancel_binds(self.read_marks(handle), handle.try_number)
        if pid is None:
            if time.time() - float(meta.get("submitted_at", 0)) < LAUNCH_TIMEOUT_SECONDS:
                return JobStatus(JobState.PENDING, "starting", raw_state="LAUNCHING")
            if canceling:
                return JobStatus(JobState.CANCELED, "canceled before it started", raw_state="CANCELED")
            return JobStatus(
                JobState.ERROR,
                "the job never started: its supervisor did not come up "
                f"within {LAUNCH_TIMEOUT_SECONDS:.0f} s (the submitting worker died?)",
                raw_state="LOST",
            )
        if _group_alive(pid, live):
            state = JobState.CANCELING if canceling else JobState.RUNNING
            return JobStatus(state, f"process group {pid['pgid']}", raw_state="RUNNING")
        # Dead: look again for the exit file, which the supervisor may have written just before exiting.
        if (done := self._finished(handle)) is not None:
            return done
        if canceling:
            return JobStatus(JobState.CANCELED, "killed on cancel", raw_state="KILLED")
        return JobStatus(
            JobState.ERROR,
            f"the job's supervisor (pid {pid['pid']}) vanished without recording an exit code "
            "(killed with SIGKILL, or the host rebooted)",
            raw_state="LOST",
        )

    def _finished(self, handle: JobHandle) -> JobStatus | None:
        job_dir = self._job_dir(handle)
        record = _read_json(job_dir / "exit_code")
        if record is None:
            return None
        code = int(record["exit_code"])
        at = float(record.get("finished_at", time.time()))
        # the cancel mark decides, not the code: a command that checkpoints on SIGTERM and exits 0 was stopped --
        # while the mark binds (hooks/ownership.py): an older try's, written before a newer try claimed the job, not
        if cancel_binds(self.read_marks(handle), handle.try_number):
            return JobStatus(JobState.CANCELED, "canceled", exit_code=code, raw_state="CANCELED", updated_at=at)
        if code == 0:
            return JobStatus(JobState.COMPLETE, "exit code 0", exit_code=0, raw_state="EXITED", updated_at=at)
        how = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        return JobStatus(JobState.ERROR, how, exit_code=code, raw_state="EXITED", updated_at=at)

    def get_job_usage(self, handle: JobHandle) -> JobUsage:
        """From the job folder: ``meta.json`` (submission, GPUs given), the supervisor's ``pid`` record (start) and
        its ``exit_code`` record (end)."""
        job_dir = self._job_dir(handle)
        meta = _read_json(job_dir / "meta.json") or {}
        started = (_read_json(job_dir / "pid") or {}).get("started_at")
        ended = (_read_json(job_dir / "exit_code") or {}).get("finished_at")
        gpus = meta.get("gpus")
        return JobUsage(
            queued_at=float(meta.get("submitted_at") or handle.submitted_at),
            started_at=float(started) if started is not None else None,
            ended_at=float(ended) if ended is not None else None,
            gpus_per_node=int(gpus) if gpus is not None else None,
            nodes=1,
            gpu_type=gpu_model() if gpus else None,
            source="the local supervisor's timestamps",
        )

    # ----------------------------------------------------------------- logs

    def get_job_logs(self, handle: JobHandle, cursor: str = "", tail: int | None = None) -> tuple[str, str]:
        """The cursor is the byte offset in ``job.log`` as a decimal string."""
        offset = int(cursor) if cursor else 0
        path = self._job_dir(handle) / "job.log"
        try:
            with open(path, "rb") as log:
                size = os.fstat(log.fileno()).st_size
                if tail is not None:
                    start = max(0, size - LOG_CHUNK_BYTES)
                    log.seek(start)
                    lines = log.read().decode(errors="replace").splitlines()
                    return "\n".join(lines[-tail:]) + ("\n" if lines else ""), str(size)
                log.seek(offset)
                data = log.read(LOG_CHUNK_BYTES)
        except FileNotFoundError:
            return "", str(offset)
        data = data[: _utf8_safe_end(data)]  # a character cut by the chunk boundary comes with the next chunk
        self._log_ends[handle.job_id] = offset + len(data)  # a status poll tells the trigger whether it grew since
        return data.decode(errors="replace"), str(offset + len(data))

    # ----------------------------------------------------------------- cancel / failure analysis

    def _cancel(self, handle: JobHandle) -> bool:
        job_dir = self._job_dir(handle)
        meta = _read_json(job_dir / "meta.json")
        if meta is None:
            return True  # no such job
        # The cancel mark is already written: a supervisor that has not recorded itself yet will see it and not
        # start the command; one that has is killed below. Only a job still in its launch window is waited for.
        deadline = float(meta.get("submitted_at", 0)) + LAUNCH_TIMEOUT_SECONDS
        while (pid := _read_json(job_dir / "pid")) is None and time.time() < deadline:
            time.sleep(0.05)
        if pid is None or self._finished(handle) is not None:
            return True
        pgid = int(pid["pgid"])
        for sig, grace in ((signal.SIGTERM, self.cancel_grace_seconds), (signal.SIGKILL, 5.0)):
            if not _group_alive(pid, supervisor.live_groups()):
                return True  # gone -- or the number now belongs to another program, which we must not signal
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                return True
            deadline = time.monotonic() + grace
            while supervisor.group_members(pgid) and time.monotonic() < deadline:
                time.sleep(0.1)
        return not supervisor.group_members(pgid)

    def failure_facts(self, handle: JobHandle) -> FailureFacts:
        status = self.get_job_status(handle)
        text, _ = self.get_job_logs(handle, tail=200)
        return FailureFacts(
            exit_code=status.exit_code,
            raw_state=status.raw_state,
            canceled=status.state is JobState.CANCELED,
            log_tail=text.splitlines(),
            message=status.message,
            details={"log": str(self._job_dir(handle) / "job.log")},
        )

    # ----------------------------------------------------------------- paths and marks

    def check_path(self, uri: str) -> bool:
        return Path(uri.removeprefix("file://")).exists()

    def list_path(self, uri: str) -> list[str]:
        path = Path(uri.removeprefix("file://"))
        return sorted(os.listdir(path)) if path.is_dir() else []

    def read_marks(self, handle: JobHandle) -> dict[str, Any]:
        marks = self._job_dir(handle) / "marks"
        try:
            return {p.name: p.read_text() for p in marks.iterdir() if not p.name.startswith(".")}
        except OSError:
            return {}

    def watch_problem(self, handle: JobHandle) -> str | None:
        """A local job can only be watched and canceled from the host that runs it."""
        host = _host_of(handle)
        if not host or host == _HOST:
            return None
        return (
            f"local job {handle.job_id} runs on worker host {host!r}, but it is being watched from host {_HOST!r} "
            "(a triggerer or worker on another machine, e.g. docker-compose or Celery) which can neither see nor "
            "cancel it. Use deferrable=False for the local platform on such deployments, run the triggerer on the "
            "worker's host (as `airflow standalone` does), or use the docker or slurm platform"
        )

    def write_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        marks = self._job_dir(handle) / "marks"
        if not marks.is_dir():
            return
        tmp = marks / f".{key}.{uuid.uuid4().hex}"
        tmp.write_text(str(value))
        os.replace(tmp, marks / key)


def _host_of(handle: JobHandle) -> str:
    """The host in the handle's ``file://host/...`` log URI ("" for handles of older versions)."""
    return handle.console_url.removeprefix("file://").split("/", 1)[0] if handle.console_url else ""


def _group_alive(pid: dict[str, Any], live: set[int]) -> bool:
    """Whether the job's process group still runs -- and is still the job's: after a reboot or pid wrap-around
    the recorded number may belong to another program (its leader then has another start time)."""
    if pid.get("boot_id") and pid["boot_id"] != supervisor.boot_id():
        return False
    if int(pid["pgid"]) not in live:
        return False
    ticks = supervisor.start_ticks(int(pid["pid"]))
    # Leader gone but members left: the kernel never hands out a pid still in use as a process group id.
    # A record without a start time was not written by our supervisor and cannot be verified.
    return ticks is None or (pid.get("start_ticks") is not None and ticks == pid["start_ticks"])


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _utf8_safe_end(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not end inside a UTF-8 sequence."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: keep looking for its lead byte
            continue
        need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
        return len(data) if need <= back else len(data) - back
    return len(data)
