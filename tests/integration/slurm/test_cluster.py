"""Smoke tests of the CI SLURM cluster itself, through the real sshd as the unprivileged user.

They check the infrastructure the SlurmHook tests rely on, not the hook: sbatch + sacct exit codes,
a PENDING job in the DOWN ``held`` partition, Slurm-native OCI containers, a 2-node allocation,
the host-key check, and Slurm's refusal to create ``--output`` folders.
"""

from __future__ import annotations

import shlex
import subprocess
import time
import uuid
from pathlib import PurePosixPath

import pytest

pytestmark = pytest.mark.integration


@pytest.fixture
def job_dir(slurm_cluster) -> PurePosixPath:
    """A fresh folder under the results root, created over ssh by the CI user."""
    path = PurePosixPath(slurm_cluster.results_root) / "ci-smoke" / uuid.uuid4().hex[:12]
    slurm_cluster.ssh(f"mkdir -p {shlex.quote(str(path))}")
    return path


def _cat(cluster, path: PurePosixPath) -> str:
    return cluster.ssh(f"cat {shlex.quote(str(path))}").stdout


def test_ssh_is_the_unprivileged_user_with_checked_host_key(slurm_cluster, tmp_path):
    out = slurm_cluster.ssh("id -u; id -un; command -v python3 sbatch sacct").stdout.split()
    assert out[0] == str(slurm_cluster.uid) != "0"
    assert out[1] == slurm_cluster.user
    assert out[2] == "/usr/bin/python3"

    # the recorded host key is really checked: a different key for the same host is refused
    wrong = tmp_path / "known_hosts"
    other = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    assert other.returncode == 0
    pub = (tmp_path / "k.pub").read_text().split()[:2]
    wrong.write_text(f"[{slurm_cluster.host}]:{slurm_cluster.port} {' '.join(pub)}\n")
    argv = slurm_cluster.ssh_argv()
    argv[argv.index(f"UserKnownHostsFile={slurm_cluster.known_hosts}")] = f"UserKnownHostsFile={wrong}"
    proc = subprocess.run([*argv, "true"], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 255
    assert "host key" in proc.stderr.lower()


def test_sbatch_completed_and_failed_exit_codes_in_sacct(slurm_cluster, job_dir):
    ok = slurm_cluster.sbatch(
        "-A", slurm_cluster.account, "-o", f"{job_dir}/ok-%j.out", "--wrap", "echo hello-$SLURM_JOB_ID"
    )
    bad = slurm_cluster.sbatch("-o", f"{job_dir}/bad-%j.out", "--wrap", "echo failing; exit 3")

    rec_ok = slurm_cluster.wait_terminal(ok)
    assert (rec_ok.state, rec_ok.exit_code) == ("COMPLETED", "0:0")
    assert rec_ok.node_list in slurm_cluster.nodes
    assert _cat(slurm_cluster, job_dir / f"ok-{ok}.out").strip() == f"hello-{ok}"

    rec_bad = slurm_cluster.wait_terminal(bad)
    assert (rec_bad.state, rec_bad.exit_code) == ("FAILED", "3:0")


def test_held_partition_keeps_job_pending_with_reason(slurm_cluster):
    job = slurm_cluster.sbatch("-p", slurm_cluster.partition_held, "-o", "/dev/null", "--wrap", "true")
    try:
        assert slurm_cluster.squeue(job) == ("PENDING", "PartitionDown")
        # slurmctld hands the record to slurmdbd asynchronously: sacct may not know a job that squeue already
        # shows for a moment after sbatch. Its Reason column is only refreshed by a later state message (on a
        # freshly started cluster it stays "None"), which is why the hook takes pending reasons from squeue.
        deadline = time.monotonic() + 180
        while (rec := slurm_cluster.sacct(job)) is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert rec is not None and rec.state == "PENDING"
    finally:
        slurm_cluster.ssh(f"scancel {job}")
    # cancelling a PENDING job: sacct says "CANCELLED by <uid>" (the SDK trap), exit 0:0
    rec = slurm_cluster.wait_terminal(job, timeout=30)
    assert rec.raw_state == f"CANCELLED by {slurm_cluster.uid}"
    assert slurm_cluster.squeue(job) is None


def test_job_runs_inside_oci_container(slurm_cluster, job_dir):
    marker = job_dir / "written-in-container.txt"
    job = slurm_cluster.sbatch(
        f"--container={slurm_cluster.oci_bundle}",
        "-o",
        f"{job_dir}/oci-%j.out",
        "-e",
        f"{job_dir}/oci-%j.err",
        "--wrap",
        f"grep ^NAME= /etc/os-release; hostname; echo job=$SLURM_JOB_ID; echo in-container > {marker}",
    )
    rec = slurm_cluster.wait_terminal(job)
    assert (rec.state, rec.exit_code) == ("COMPLETED", "0:0")
    out = _cat(slurm_cluster, job_dir / f"oci-{job}.out").splitlines()
    assert out == ['NAME="slurm-ci-busybox"', "oci-busybox", f"job={job}"]  # not the Debian host
    assert _cat(slurm_cluster, job_dir / f"oci-{job}.err") == ""  # no slurmstepd noise in job logs
    assert _cat(slurm_cluster, marker).strip() == "in-container"  # results root is mounted rw

    # the python bundle runs the host's python3 inside the container; exit codes propagate
    job = slurm_cluster.sbatch(
        f"--container={slurm_cluster.oci_bundle_py}",
        "-o",
        f"{job_dir}/py-%j.out",
        "--wrap",
        "python3 -c 'import sys; print(open(\"/etc/os-release\").readline().strip()); sys.exit(7)'",
    )
    rec = slurm_cluster.wait_terminal(job)
    assert (rec.state, rec.exit_code) == ("FAILED", "7:0")
    assert _cat(slurm_cluster, job_dir / f"py-{job}.out").strip() == 'NAME="slurm-ci-python"'


def test_two_node_job_has_two_node_ids_and_one_master(slurm_cluster, job_dir):
    script = (
        "#!/bin/bash\n"
        "#SBATCH -N 2 --ntasks-per-node=1\n"
        "srun bash -c 'echo $SLURM_NODEID $SLURMD_NODENAME "
        '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)\'\n'
    )
    job = slurm_cluster.sbatch("-o", f"{job_dir}/two-%j.out", script=script)
    rec = slurm_cluster.wait_terminal(job)
    assert (rec.state, rec.exit_code) == ("COMPLETED", "0:0")
    rows = [line.split() for line in _cat(slurm_cluster, job_dir / f"two-{job}.out").splitlines()]
    assert sorted(r[0] for r in rows) == ["0", "1"]
    assert sorted(r[1] for r in rows) == sorted(slurm_cluster.nodes)
    assert len({r[2] for r in rows}) == 1  # same MASTER_ADDR candidate on both tasks
    assert rows[0][2] == slurm_cluster.nodes[0]


def test_slurm_does_not_create_output_folder(slurm_cluster, job_dir):
    missing = job_dir / "slurm-logs" / "name-id"
    job = slurm_cluster.sbatch(
        "-o", f"{missing}/main.out", "-e", f"{missing}/main.err", "--wrap", f"touch {job_dir}/ran"
    )
    rec = slurm_cluster.wait_terminal(job)
    # the job fails at I/O setup, before its command runs, and leaves no trace of logs
    assert (rec.state, rec.exit_code) == ("FAILED", "0:53")
    assert slurm_cluster.ssh(f"test -e {missing} || test -e {job_dir}/ran", check=False).returncode == 1
