"""Fixtures for tests against the REAL single-host SLURM cluster built by ``scripts/slurm-up.sh``.

``slurm_cluster`` (session scope) makes sure the cluster is up -- it runs ``scripts/slurm-up.sh``
(through ``sudo -n`` when not root) if any daemon is missing -- then parses ``$SLURM_CI_ROOT/env.sh``
and returns a :class:`SlurmCluster`. A missing or broken backend is a test FAILURE, never a skip.
The cluster is left running at session end (it is shared; ``scripts/slurm-down.sh`` removes it).

What the cluster offers (details in ``scripts/slurm-up.sh``):

* login node: key-only sshd on 127.0.0.1:2222, user ``slurmci`` (unprivileged), ed25519 client key,
  ONE ed25519 host key (``host_key`` / ``known_hosts``; always verify it);
* nodes ``c1``, ``c2`` (2 CPUs each, no GPUs), account ``ci``, ``sacct`` through slurmdbd;
* partitions ``debug`` (default, MaxTime 4 h), ``held`` (DOWN: jobs stay PENDING/PartitionDown),
  ``short`` (MaxTime 1 min, for TIMEOUT), ``preempt`` (victims) + ``urgent`` (preemptor);
* OCI bundles for ``--container``: ``oci_bundle`` (busybox-static only) and ``oci_bundle_py``
  (the host's /usr read-only, so ``python3`` works inside); both bind-mount ``results_root`` rw.

Helpers on :class:`SlurmCluster` run commands as the CI user through the real sshd with strict
host-key checking (``ssh``), wait for ``sacct`` terminal states, and stop/start daemons by PID file
(for outage tests: ``stop_daemon("sshd")`` ... ``ensure_up()``).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.integration.taskrun import Triggerer

REPO_ROOT = Path(__file__).resolve().parents[3]
SLURM_UP = REPO_ROOT / "scripts" / "slurm-up.sh"
SLURM_CI_ROOT = Path(os.environ.get("SLURM_CI_ROOT", "/var/tmp/slurm-ci"))
ENV_FILE = SLURM_CI_ROOT / "env.sh"
UP_TIMEOUT_S = 1800  # a cold machine installs ~20 Debian packages first

TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
# daemon name -> pid file name under SLURM_CI_PID_DIR
DAEMONS = {
    "sshd": "sshd.pid",
    "slurmctld": "slurmctld.pid",
    "slurmdbd": "slurmdbd.pid",
    "slurmd-c1": "slurmd-c1.pid",
    "slurmd-c2": "slurmd-c2.pid",
}


@dataclass(frozen=True)
class SacctRecord:
    """One ``sacct -X`` line (the job allocation, not its steps)."""

    job_id: str
    state: str  # first word only: "CANCELLED by 1001" -> "CANCELLED"
    raw_state: str  # as printed, e.g. "CANCELLED by 1001"
    exit_code: str  # "<code>:<signal>", e.g. "3:0", "0:53"
    reason: str
    node_list: str


@dataclass(frozen=True)
class SlurmCluster:
    """Connection facts of the CI cluster (from env.sh) plus small helpers."""

    host: str
    port: int
    user: str
    uid: int
    key_file: Path
    host_key: str  # "ssh-ed25519 AAAA..." (the only host key the sshd offers)
    known_hosts: Path  # "[127.0.0.1]:2222 ssh-ed25519 AAAA..."
    results_root: Path
    account: str
    cluster_name: str
    partition: str
    partition_held: str
    partition_short: str
    partition_preempt: str
    partition_urgent: str
    nodes: tuple[str, ...]
    cpus_per_node: int
    oci_bundle: Path
    oci_bundle_py: Path
    slurm_version: str
    log_dir: Path
    sshd_log: Path
    pid_dir: Path
    root: Path
    airflow_conn_json: str  # value of AIRFLOW_CONN_TAO_SLURM_CI
    env: dict[str, str] = field(repr=False, compare=False)  # every SLURM_CI_*/AIRFLOW_CONN_* from env.sh

    # ---------------------------------------------------------------- connection
    @property
    def airflow_conn(self) -> dict[str, Any]:
        return json.loads(self.airflow_conn_json)

    def ssh_argv(self, *options: str) -> list[str]:
        """``ssh`` argv for the CI user, host key checked against the recorded key only."""
        return [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "ConnectTimeout=10",
            "-i",
            str(self.key_file),
            "-p",
            str(self.port),
            *options,
            f"{self.user}@{self.host}",
        ]

    def ssh(
        self, command: str, *, check: bool = True, timeout: float = 60, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` (a remote shell string) on the login node as the CI user."""
        proc = subprocess.run(
            [*self.ssh_argv(), command], input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"ssh command failed (rc={proc.returncode}): {command}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
            )
        return proc

    # ---------------------------------------------------------------- slurm helpers
    def sbatch(self, *args: str, script: str | None = None) -> str:
        """``sbatch --parsable <args>`` over ssh (``script`` is sent on stdin); returns the job id."""
        out = self.ssh(" ".join(["sbatch", "--parsable", *map(shlex.quote, args)]), input=script).stdout
        return out.strip().split(";")[0]

    def sacct(self, job_id: str) -> SacctRecord | None:
        """The allocation line of ``job_id`` in sacct, or None if slurmdbd has no record yet."""
        out = self.ssh(f"sacct -X -n -P -j {shlex.quote(job_id)} -o JobID,State,ExitCode,Reason,NodeList").stdout
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) == 5 and parts[0] == job_id:
                return SacctRecord(parts[0], parts[1].split()[0], parts[1], parts[2], parts[3], parts[4])
        return None

    def wait_terminal(self, job_id: str, timeout: float = 120, interval: float = 0.5) -> SacctRecord:
        """Poll sacct until the job is in a terminal state (a requeued job is NOT terminal)."""
        deadline = time.monotonic() + timeout
        rec = None
        while time.monotonic() < deadline:
            rec = self.sacct(job_id)
            if rec is not None and rec.state in TERMINAL_STATES:
                return rec
            time.sleep(interval)
        raise AssertionError(f"job {job_id} not terminal after {timeout}s (last sacct: {rec})")

    def squeue(self, job_id: str) -> tuple[str, str] | None:
        """(state, reason) from squeue, or None once the job left the queue.

        Note: ``squeue -j`` prints nothing for finished jobs (even within MinJobAge) unless
        ``-t all`` is given; use sacct for them.
        """
        out = self.ssh(f"squeue -h -j {shlex.quote(job_id)} -o '%T|%r'", check=False).stdout.strip()
        if not out:
            return None
        state, _, reason = out.splitlines()[0].partition("|")
        return state, reason

    # ---------------------------------------------------------------- daemon control (root)
    def pidfile(self, daemon: str) -> Path:
        return self.pid_dir / DAEMONS[daemon]

    def daemon_pid(self, daemon: str) -> int | None:
        try:
            pid = int(self.pidfile(daemon).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _pid_alive(pid) else None

    def stop_daemon(self, daemon: str, timeout: float = 20) -> None:
        """SIGTERM the daemon named in its PID file (only that PID) and wait until it is gone."""
        pid = self.daemon_pid(daemon)
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _pid_alive(pid):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def ensure_up(self) -> None:
        """(Re)start whatever is not running (``scripts/slurm-up.sh`` is idempotent, ~1 s when up)."""
        _run_slurm_up()


def _pid_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie (this VM's PID 1 does not always reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def _read_env_file(path: Path) -> dict[str, str]:
    """Source env.sh in a clean bash and return the variables it exports."""
    proc = subprocess.run(
        ["env", "-i", "bash", "--noprofile", "--norc", "-c", '. "$1" && env -0', "_", str(path)],
        capture_output=True,
        check=True,
        timeout=30,
    )
    out: dict[str, str] = {}
    for item in proc.stdout.split(b"\0"):
        key, sep, value = item.decode().partition("=")
        if sep and (key.startswith("SLURM_CI_") or key.startswith("AIRFLOW_CONN_")):
            out[key] = value
    return out


def _cluster_problems(env: dict[str, str] | None) -> list[str]:
    """Empty list when every daemon of the cluster is running and the sshd port answers."""
    if env is None:
        return [f"{ENV_FILE} missing"]
    pid_dir = Path(env["SLURM_CI_PID_DIR"])
    problems = []
    for daemon, name in DAEMONS.items():
        try:
            pid = int((pid_dir / name).read_text().strip())
        except (OSError, ValueError):
            problems.append(f"{daemon}: no pid file")
            continue
        if not _pid_alive(pid):
            problems.append(f"{daemon}: pid {pid} not running")
    if not _port_open(env["SLURM_CI_HOST"], int(env["SLURM_CI_PORT"])):
        problems.append(f"sshd port {env['SLURM_CI_PORT']} closed")
    return problems


def _run_slurm_up() -> None:
    argv = ["bash", str(SLURM_UP)]
    if os.geteuid() != 0:
        argv = ["sudo", "-n", "--preserve-env=SLURM_CI_ROOT", *argv]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=UP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"scripts/slurm-up.sh could not run: {exc}", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(
            f"scripts/slurm-up.sh failed (rc={proc.returncode})\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}",
            pytrace=False,
        )


def _load_env() -> dict[str, str] | None:
    return _read_env_file(ENV_FILE) if ENV_FILE.is_file() else None


def _cluster_from_env(env: dict[str, str]) -> SlurmCluster:
    return SlurmCluster(
        host=env["SLURM_CI_HOST"],
        port=int(env["SLURM_CI_PORT"]),
        user=env["SLURM_CI_USER"],
        uid=int(env["SLURM_CI_UID"]),
        key_file=Path(env["SLURM_CI_KEY_FILE"]),
        host_key=env["SLURM_CI_HOST_KEY"],
        known_hosts=Path(env["SLURM_CI_KNOWN_HOSTS"]),
        results_root=Path(env["SLURM_CI_RESULTS_ROOT"]),
        account=env["SLURM_CI_ACCOUNT"],
        cluster_name=env["SLURM_CI_CLUSTER"],
        partition=env["SLURM_CI_PARTITION"],
        partition_held=env["SLURM_CI_PARTITION_HELD"],
        partition_short=env["SLURM_CI_PARTITION_SHORT"],
        partition_preempt=env["SLURM_CI_PARTITION_PREEMPT"],
        partition_urgent=env["SLURM_CI_PARTITION_URGENT"],
        nodes=tuple(env["SLURM_CI_NODES"].split(",")),
        cpus_per_node=int(env["SLURM_CI_CPUS_PER_NODE"]),
        oci_bundle=Path(env["SLURM_CI_OCI_BUNDLE"]),
        oci_bundle_py=Path(env["SLURM_CI_OCI_BUNDLE_PY"]),
        slurm_version=env["SLURM_CI_SLURM_VERSION"],
        log_dir=Path(env["SLURM_CI_LOG_DIR"]),
        sshd_log=Path(env["SLURM_CI_SSHD_LOG"]),
        pid_dir=Path(env["SLURM_CI_PID_DIR"]),
        root=Path(env["SLURM_CI_ROOT"]),
        airflow_conn_json=env["AIRFLOW_CONN_TAO_SLURM_CI"],
        env=env,
    )


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    """The running CI cluster; brought up by scripts/slurm-up.sh if any part of it is down."""
    problems = _cluster_problems(_load_env())
    if problems:
        _run_slurm_up()
        problems = _cluster_problems(_load_env())
        if problems:
            pytest.fail(f"SLURM cluster still not up after slurm-up.sh: {problems}", pytrace=False)
    env = _load_env()
    assert env is not None
    cluster = _cluster_from_env(env)
    # end-to-end liveness through the real sshd, as the unprivileged user
    proc = cluster.ssh("scontrol ping && sinfo -h -o %a", check=False, timeout=30)
    if proc.returncode != 0 or "UP" not in proc.stdout:
        pytest.fail(f"SLURM cluster not answering over ssh: {proc.stdout}{proc.stderr}", pytrace=False)
    return cluster


# ---------------------------------------------------------------------------- SlurmHook / operator fixtures


def accepted_logins(cluster: SlurmCluster) -> int:
    """SSH logins of the CI user accepted so far by the cluster's sshd (its log has LogLevel VERBOSE)."""
    try:
        text = cluster.sshd_log.read_text(errors="replace")
    except OSError:
        return 0
    return text.count(f"Accepted publickey for {cluster.user} ")


@pytest.fixture(scope="session")
def slurm_conn(slurm_cluster: SlurmCluster) -> str:
    """The Airflow connection ``tao_slurm_ci`` (from env.sh) for the operator, hooks and triggers."""
    os.environ["AIRFLOW_CONN_TAO_SLURM_CI"] = slurm_cluster.airflow_conn_json
    return "tao_slurm_ci"


@pytest.fixture(scope="session")
def triggerer(slurm_conn: str, triggerer: Triggerer) -> Triggerer:
    """The session's triggerer loop, with the SLURM connection defined first."""
    return triggerer
