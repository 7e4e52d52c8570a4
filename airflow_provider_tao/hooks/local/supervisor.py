"""The supervisor of one ``local`` job: ``python supervisor.py <job_dir>`` (this file).

Started by :class:`~airflow_provider_tao.hooks.local.LocalHook` as the leader of a new session, so the job outlives the
Airflow worker and can be killed as one process group. It records its pid (= its process group), runs the command with
stdin from /dev/null and output into ``job.log``, and writes ``exit_code`` atomically when the command ends: the file
the hook reads the job's fate from (waiting for the jobs folder to come back if it has gone away). It survives the
group-wide SIGTERM of a cancel long enough to record the command's exit; a SIGKILL leaves no exit file, which the hook
reports as canceled (if a cancel was asked for) or as an error (if not). Standard library only: it is executed as a
file, never imported by Airflow.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

STRAGGLER_GRACE_SECONDS = 2.0
#: How long the verdict waits for a jobs folder that has gone away (a network filesystem's outage) before it is lost.
VERDICT_PATIENCE_SECONDS = 3600.0


def write_json_atomic(path: Path, data: Mapping[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (field 22 of /proc/<pid>/stat): with the boot id it
    tells a recorded process from a later one that got the same pid."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _live_processes() -> list[tuple[int, int]]:
    """(pid, process group) of every live process; zombies count as dead (PID 1 may never reap them)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            found.append((int(entry), int(fields[2])))
    return found


def live_groups() -> set[int]:
    """Process groups that still have a live member."""
    return {pgid for _, pgid in _live_processes()}


def group_members(pgid: int, exclude: int | None = None) -> list[int]:
    """Live processes of a process group."""
    return [pid for pid, group in _live_processes() if group == pgid and pid != exclude]


def _stop_stragglers(pgid: int) -> None:
    """Background processes the command left behind die with the job, not after it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = group_members(pgid, exclude=os.getpid())
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + STRAGGLER_GRACE_SECONDS
        while group_members(pgid, exclude=os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.05)


def _run(argv: list[str], cwd: str, log: BinaryIO, stop_requested: list[int]) -> int:
    try:
        child = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    except OSError as exc:
        log.write(f"tao-local: cannot start {argv[0]!r}: {exc}\n".encode())
        return 127 if isinstance(exc, FileNotFoundError) else 126
    if stop_requested:  # the signal came while the child was being created, before it was in our group
        child.terminate()
    return child.wait()


def main(job_dir: str) -> int:
    job = Path(job_dir)
    pid = os.getpid()
    stop_requested: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        # The command gets the same signal from the group-wide kill; we stay to record how it ended.
        stop_requested.append(signum)

    stop_signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    for sig in stop_signals:
        signal.signal(sig, on_signal)
    # A mask survives exec: a worker thread that blocked SIGTERM would leave this job deaf to its cancel.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)
    # Record ourselves first, then look for a cancel: a cancel that came before this point finds no pid file
    # and waits for it, so either it sees the mark here or it kills our group afterwards.
    identity = {
        "pid": pid,
        "pgid": os.getpgid(0),
        "start_ticks": start_ticks(pid),
        "boot_id": boot_id(),
        "started_at": time.time(),  # the job's start for its GPU-hours (exit_code holds its end)
    }
    write_json_atomic(job / "pid", identity)
    launch = json.loads((job / "launch.json").read_text())
    with open(job / "job.log", "ab", buffering=0) as log:
        if (job / "marks" / "cancel_requested_by").exists() or stop_requested:
            log.write(b"tao-local: canceled before the command started\n")
            returncode = -signal.SIGTERM
        else:
            returncode = _run(list(launch["argv"]), str(launch["cwd"]), log, stop_requested)
    _stop_stragglers(os.getpgid(0))
    _record_verdict(job, {"exit_code": returncode, "finished_at": time.time()})
    return 0


def _record_verdict(job: Path, verdict: Mapping[str, object]) -> None:
    """Write ``exit_code``; while the jobs folder is gone (a network filesystem's outage), wait for it to come back
    rather than lose the verdict -- a job that ended during an outage must not read as killed afterwards."""
    deadline = time.monotonic() + VERDICT_PATIENCE_SECONDS
    while True:
        try:
            write_json_atomic(job / "exit_code", verdict)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
