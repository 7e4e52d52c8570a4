"""The fault matrix's upload case: a job killed while the in-job runner uploads its outputs leaves no manifest, and
Airflow's retry produces complete outputs -- on all six platforms at once, on the matrix's ONE standalone.

Each platform's job writes 48 outputs of 128 KiB; its S3 link is slow (the proxy of ``conftest.MatrixS3``) until
its job is killed, so the upload takes more than half a minute. As soon as the first objects of a job appear on S3
(read from the moto server itself), the job is killed with the backend's own tools, as a crash would kill it:

============ ================================================================================================
local        SIGKILL to the job's process group (the supervisor leads it: no exit record is left)
slurm        SIGKILL, sent over our own ssh on the node, to the job step's processes (Slurm sees the step die;
             ``scancel`` would be a cancel, which by design is never retried)
docker       the engine kills the job's container
kubernetes   the engine kills the pod's container (the kubelet sees it exit 137)
lepton       the fake workspace's control API fails the replica (its container is killed, exit 137)
brev         the engine kills the job's container on the instance
============ ================================================================================================

Every job first waits ``HOLD_SECONDS``: Airflow 3.3's scheduler can fail a task whose trigger fires within a second or
two of its deferral (the executor's "success" of the deferring process arrives after the task was queued again:
"finished with state success, but the task instance's state attribute is queued"), which a 1-second local job hits.

Then, on S3 and on the backends themselves: try 1's prefix holds some outputs and no manifest; try 2's holds every
output byte for byte and the manifests; one job per try; the task succeeded after two tries.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tao.hooks.shared import container as ct
from tests.e2e.airflow_harness import wait_until
from tests.e2e.matrix.conftest import (
    PLATFORMS,
    BrevBackend,
    DockerBackend,
    KubernetesBackend,
    LeptonBackend,
    Matrix,
    MatrixS3,
    SlurmBackend,
    check_no_secret_leaked,
    digest_of,
    record_result,
)
from tests.e2e.matrix.dags.tao_matrix_upload import OUTPUT_NAME, UPLOAD_DAG_ID
from tests.e2e.tao_jobs import job_processes

CASE = "job killed mid-upload of outputs"
FILES, FILE_KIB = 48, 128
#: Each platform's S3 link while its first try uploads: 48 x 128 KiB take ~38 s (the first objects come in ~2 s).
SLOW_LINK = 160 * 1024
MANIFEST = "_TAO_MANIFEST.json"
#: Every job runs this long before it writes its outputs: a trigger that fires within a second or two of its task's
#: deferral races Airflow's scheduler (see the module's docstring), which is not what this case is about.
HOLD_SECONDS = 8


@pytest.fixture(scope="module")
def upload_dag(matrix: Matrix) -> Iterator[None]:
    matrix.client.wait_for_dag(UPLOAD_DAG_ID, timeout=180)
    matrix.client.unpause_dag(UPLOAD_DAG_ID)
    yield


def expected_output(seed: str, index: int) -> bytes:
    """What the job writes as output ``index`` (see the DAG's ``WRITE_OUTPUTS``)."""
    return hashlib.shake_256(f"{seed}/{index}".encode()).digest(FILE_KIB * 1024)


def _keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [obj["Key"] for obj in page.get("Contents", []) or []]
    return keys


def _by_job(keys: list[str], prefix: str) -> dict[str, list[str]]:
    """Keys under ``<prefix><job id>/`` grouped by job id, relative to the job's folder."""
    jobs: dict[str, list[str]] = {}
    for key in keys:
        job_id, _, rest = key[len(prefix) :].partition("/")
        jobs.setdefault(job_id, []).append(rest)
    return jobs


# ---------------------------------------------------------------------------------------------- the kills


def _kill_local(matrix: Matrix, job_id: str, digest: str) -> None:
    for group in {os.getpgid(pid) for pid in job_processes([job_id])}:
        os.killpg(group, signal.SIGKILL)


def _kill_slurm(matrix: Matrix, job_id: str, digest: str) -> None:
    backend = matrix.backends["slurm"]
    assert isinstance(backend, SlurmBackend)
    # the program in the step's container, as the kernel's OOM killer would pick it: not the container's init (the
    # job's launch shell, which reports its child's death), not the batch script or srun outside the container.
    # The cluster's nodes are this machine; the ssh goes to its login node.
    host_pids = os.readlink("/proc/self/ns/pid")
    pids = [
        pid for pid in job_processes([job_id])
        if _pid_namespace(pid) not in (host_pids, None) and _pid_in_namespace(pid) not in (1, None)
    ]  # fmt: skip
    assert pids, f"slurm: no process of job {job_id} in a container on the node"
    backend.cluster.ssh(f"kill -KILL {' '.join(map(str, pids))}")


def _pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _pid_in_namespace(pid: int) -> int | None:
    """The process's pid in its own (innermost) pid namespace."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"^NSpid:\s*(.*)$", status, re.MULTILINE)
    return int(found.group(1).split()[-1]) if found else None


def _kill_docker(matrix: Matrix, job_id: str, digest: str) -> None:
    backend = matrix.backends["docker"]
    assert isinstance(backend, DockerBackend)
    backend.engine.client.kill(ct.container_name(job_id))


def _kill_kubernetes(matrix: Matrix, job_id: str, digest: str) -> None:
    backend = matrix.backends["kubernetes"]
    assert isinstance(backend, KubernetesBackend)
    client = backend.engine.client
    pods = [
        c["Id"]
        for c in client.containers(filters={"label": "kubefake=1", "status": "running"})
        if f"TAO_JOB_ID={job_id}" in (client.inspect_container(c["Id"])["Config"].get("Env") or [])
    ]
    assert len(pods) == 1, f"kubernetes: pod containers of job {job_id}: {pods}"
    client.kill(pods[0])


def _kill_lepton(matrix: Matrix, job_id: str, digest: str) -> None:
    backend = matrix.backends["lepton"]
    assert isinstance(backend, LeptonBackend)
    (job,) = [j for j in backend.fake.jobs() if j["name"].endswith(digest) and not j["deleted"]]
    backend.fake.inject("exit", id=job["id"], code=137)


def _kill_brev(matrix: Matrix, job_id: str, digest: str) -> None:
    backend = matrix.backends["brev"]
    assert isinstance(backend, BrevBackend)
    engine = backend.world.engine()
    (container,) = engine.containers(f"brevfake.world={backend.world.tag}", f"{ct.LABEL_JOB_ID}={job_id}")
    engine.kill(container["Id"])


KILLS: dict[str, Callable[[Matrix, str, str], None]] = {
    "local": _kill_local,
    "slurm": _kill_slurm,
    "docker": _kill_docker,
    "kubernetes": _kill_kubernetes,
    "lepton": _kill_lepton,
    "brev": _kill_brev,
}


def _kill_each_once_its_upload_began(
    matrix: Matrix, s3: MatrixS3, run_id: str, tag: str
) -> dict[str, tuple[str, float]]:
    """Watch every platform's prefix at once; kill each job as soon as objects of it are on S3, and give its
    platform a fast link back once the backend shows the job gone (try 2 then uploads at full speed).

    :returns: platform -> (try 1's job id, seconds from the first object seen to the job gone).
    """
    client = s3.client
    killed: dict[str, tuple[str, float]] = {}
    gone: set[str] = set()

    def step() -> bool:
        for platform in PLATFORMS:
            digest = digest_of(UPLOAD_DAG_ID, run_id, platform)
            if platform not in killed:
                prefix = f"mx-upload/{tag}/{platform}/"
                jobs = _by_job(_keys(client, s3.bucket, prefix), prefix)
                if jobs:
                    (job_id,) = jobs
                    KILLS[platform](matrix, job_id, digest)
                    killed[platform] = (job_id, time.monotonic())
            elif platform not in gone and not matrix.census.of(platform, digest).active_now:
                gone.add(platform)
                s3.proxies[platform].rate = None
                killed[platform] = (killed[platform][0], time.monotonic() - killed[platform][1])
        return len(gone) == len(PLATFORMS)

    wait_until(
        step, timeout=240, interval=0.3,
        message=lambda: f"uploads seen and killed: {sorted(killed)}; jobs gone: {sorted(gone)}",
    )  # fmt: skip
    return killed


# ---------------------------------------------------------------------------------------------- the case


def test_job_killed_mid_upload_leaves_no_manifest_and_the_retry_uploads_complete_outputs(
    matrix: Matrix, matrix_s3: MatrixS3, upload_dag: None
) -> None:
    started = time.monotonic()
    tag, seed = uuid.uuid4().hex[:12], uuid.uuid4().hex
    for proxy in matrix_s3.proxies.values():
        proxy.rate = SLOW_LINK
    try:
        run_id = matrix.trigger(UPLOAD_DAG_ID, tag=tag, seed=seed, files=FILES, file_kib=FILE_KIB, hold=HOLD_SECONDS)
        killed = _kill_each_once_its_upload_began(matrix, matrix_s3, run_id, tag)
    finally:
        for proxy in matrix_s3.proxies.values():
            proxy.rate = None
    # every platform's cell is decided (and recorded) before the test fails for any of them
    states = matrix.wait_states(UPLOAD_DAG_ID, run_id, ["success", "failed"], PLATFORMS, timeout=300)
    problems = {}
    for platform in PLATFORMS:
        detail, wrong = _check(
            matrix, matrix_s3, run_id=run_id, tag=tag, seed=seed, platform=platform, killed=killed[platform]
        )
        wrong += [] if states[platform] == "success" else [f"the task ended {states[platform]}"]
        record_result(CASE, platform, not wrong, detail + "".join(f"; {w}" for w in wrong))
        if wrong:
            problems[platform] = wrong
    assert not problems, f"{problems}\n{matrix.logs_of(UPLOAD_DAG_ID, run_id, list(problems))}"
    print(f"{CASE}: {time.monotonic() - started:.0f} s")


def _check(
    matrix: Matrix, s3: MatrixS3, *, run_id: str, tag: str, seed: str, platform: str, killed: tuple[str, float]
) -> tuple[str, list[str]]:
    """What S3, the backend and Airflow show of one platform's task: (the table's cell, what is wrong)."""
    client, bucket = s3.client, s3.bucket
    first, kill_took = killed
    prefix = f"mx-upload/{tag}/{platform}/"
    jobs = _by_job(_keys(client, bucket, prefix), prefix)
    (final,) = set(jobs) - {first} or {""}  # the retry's job: the other folder
    seen = matrix.census.of(platform, digest_of(UPLOAD_DAG_ID, run_id, platform))
    tries = len(matrix.client.list_task_instance_tries(UPLOAD_DAG_ID, run_id, platform))
    log = matrix.log(UPLOAD_DAG_ID, run_id, platform, 1)
    failure = re.search(r"failed(?: with|:) (ERR_\w+) \((retriable|not retriable)\)", log)
    err = f"{failure.group(1)} ({failure.group(2)})" if failure else "no verdict in try 1's log"

    want = {OUTPUT_NAME % i: expected_output(seed, i) for i in range(FILES)}
    partial, complete = jobs.get(first, []), jobs.get(final, [])
    outputs = {os.path.basename(k): k for k in complete if not k.endswith(MANIFEST)}
    manifests = [k for k in complete if k.endswith(MANIFEST)]
    equal = set(outputs) == set(want) and all(
        client.get_object(Bucket=bucket, Key=f"{prefix}{final}/{outputs[name]}")["Body"].read() == data
        for name, data in want.items()
    )
    listed = _manifest_files(client, bucket, prefix, final, manifests)
    wrong = [
        what
        for bad, what in (
            (len(jobs) != 2, f"job folders on S3: {sorted(jobs)}"),
            (any(k.endswith(MANIFEST) for k in partial), "try 1 left a manifest"),
            (not 0 < len(partial) < FILES, f"try 1 was not killed mid-upload: {len(partial)} objects"),
            (bool(failure) and failure.group(2) != "retriable", f"try 1's crash was classified {err}"),
            (not equal, "try 2's outputs are not every file byte for byte"),
            (len(manifests) != 2, f"try 2's manifests: {manifests}"),  # the output's and the job's
            (listed != {n: hashlib.sha256(d).hexdigest() for n, d in want.items()}, "try 2's manifest is wrong"),
            (seen.count != 2 or seen.most_active > 1, f"jobs on the backend: {seen}"),
            (tries != 2, f"{tries} tries"),
        )
        if bad
    ]
    detail = (
        f"try 1 ({err}) killed mid-upload, gone {kill_took:.0f} s after the kill: {len(partial)}/{FILES} outputs, "
        f"{'no manifest' if not any(k.endswith(MANIFEST) for k in partial) else 'A MANIFEST'}; try 2: "
        f"{len(outputs)}/{FILES} outputs{' byte-equal' if equal else ''}, {len(manifests)} manifests; "
        f"{seen.count} jobs, {tries} tries"
    )
    return detail, wrong


def _manifest_files(client: Any, bucket: str, prefix: str, job_id: str, manifests: list[str]) -> dict[str, str]:
    """name -> sha256 of every file the output's manifest (the deeper one) lists."""
    if not manifests:
        return {}
    output = max(manifests, key=lambda k: k.count("/"))
    doc = json.loads(client.get_object(Bucket=bucket, Key=f"{prefix}{job_id}/{output}")["Body"].read())
    return {entry["path"]: entry["sha256"] for entry in doc["files"]}


def test_no_secret_in_the_upload_case(matrix: Matrix) -> None:
    """The storage keys the jobs used (``s3_mx_*``) and the platforms' secrets never showed while the case ran."""
    assert any(name.startswith("s3_mx_") for name in matrix.secrets.secrets.values())
    check_no_secret_leaked(matrix, "no secret while jobs upload (S3 keys)")
