"""100 SLURM submissions through ONE ``SlurmHook`` (its one kept SSH connection) vs a fresh SSH connection for each
(a new hook per submission), same run, same real cluster (``scripts/slurm-up.sh``). Not a test: it prints both.

A submission is what the operator does: validate (preflight over SSH), find-by-name, stage + ``sbatch``. Jobs go to
the DOWN ``held`` partition, so they stay PENDING; the script cancels them all at the end.

Counted: wall time per submission, SSH connections (the real sshd's "Accepted publickey" lines and the hook's own
connect counter), this process's CPU, and the sshd's CPU (the login node's load).

    python benchmarks/slurm_submissions.py --submissions 100
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import slurm_polling  # loads the cluster's env.sh and its connection first
from measure import cpu, print_side_by_side

from airflow_provider_tao.hooks.slurm import SlurmHook
from airflow_provider_tao.hooks.slurm import ssh as slurm_ssh
from airflow_provider_tao.jobs import JobHandle, JobSpec


def _spec() -> JobSpec:
    job_id = uuid.uuid4().hex[:12]
    return JobSpec(
        name=f"bench-submit-{job_id}",
        job_id=job_id,
        command="true",
        gpu_count=0,
        backend_details={"partition": "held", "container_runtime": "none"},
    )


def _submit(hook: SlurmHook) -> JobHandle:
    spec = _spec()
    hook.validate_spec(spec)
    hook.find_job(spec.name)
    return hook.create_job(spec)


def _sshd_cpu() -> float:
    """CPU seconds of the CI sshd and its reaped children (the sessions it served)."""
    pid_file = Path(os.environ.get("SLURM_CI_PID_DIR", "/run/slurm-ci")) / "sshd.pid"
    try:
        stat = Path(f"/proc/{int(pid_file.read_text())}/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return float("nan")


def _phase(count: int, *, shared: bool) -> tuple[list[JobHandle], dict[str, Any]]:
    walls, handles = [], []
    connects0, logins0, cpu0, sshd0 = slurm_ssh.STATS["sync_connects"], slurm_polling.logins(), cpu(), _sshd_cpu()
    started = time.monotonic()
    one = SlurmHook(conn_id=slurm_polling.CONN_ID)
    for _ in range(count):
        hook = one if shared else SlurmHook(conn_id=slurm_polling.CONN_ID)
        begin = time.monotonic()
        handles.append(_submit(hook))
        walls.append(time.monotonic() - begin)
        if not shared:
            hook.close()
    total = time.monotonic() - started
    one.close()
    time.sleep(0.5)  # let sshd write its last log lines
    return handles, {
        "total_s": total,
        "p50_s": statistics.median(walls),
        "p95_s": statistics.quantiles(walls, n=20)[18],
        "connects": slurm_ssh.STATS["sync_connects"] - connects0,
        "sshd_logins": slurm_polling.logins() - logins0,
        "cpu_s": cpu() - cpu0,
        "sshd_cpu_s": _sshd_cpu() - sshd0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submissions", type=int, default=100)
    args = parser.parse_args()
    results, handles = {}, []
    for name, shared in (("one hook", True), ("fresh connection each", False)):
        submitted, results[name] = _phase(args.submissions, shared=shared)
        handles += submitted
    canceler = SlurmHook(conn_id=slurm_polling.CONN_ID)
    ids = " ".join(h.backend_job_id for h in handles if h.backend_job_id)
    canceler.run(f"scancel {ids}", timeout=120)
    canceler.close()
    one, fresh = results["one hook"], results["fresh connection each"]
    print(f"{args.submissions} SLURM submissions (preflight + find-by-name + stage + sbatch), real cluster")
    rows = [
        ("total, s", "total_s", "{:.1f}"),
        ("per submission p50, s", "p50_s", "{:.3f}"),
        ("per submission p95, s", "p95_s", "{:.3f}"),
        ("SSH connections (client)", "connects", "{:.0f}"),
        ("SSH logins (sshd log)", "sshd_logins", "{:.0f}"),
        ("CPU s (this process)", "cpu_s", "{:.2f}"),
        ("CPU s (sshd, login node)", "sshd_cpu_s", "{:.2f}"),
    ]
    print_side_by_side(rows, one, fresh, ("one hook", "fresh each"))


if __name__ == "__main__":
    main()
