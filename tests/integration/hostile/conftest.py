"""The six platforms side by side for the hostile-input and secret suite, each on its own session backend (the
fixtures of ``tests/integration/<platform>/conftest.py``), with every secret a platform can carry set to a
recognisable unique value.

A :class:`Platform` says how to submit a job there (connection, image, details) and what to read on the backend
itself -- never through our hooks -- to check a job: the job names it ever saw, and every text it keeps about a job
(sbatch scripts, Kubernetes objects, Lepton job bodies, container inspects) where no secret may appear.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tao.hooks.shared import container as ct
from tests.brevfake.control import BrevWorld
from tests.integration.brev.conftest import brev_connection, no_trigger_outlives_its_test  # noqa: F401
from tests.integration.docker.conftest import (  # noqa: F401  (the shared engine and its connection)
    DockerEngine,
    docker_conn,
    docker_connection,
    docker_engine,
    results_root,
)
from tests.integration.kubernetes.conftest import NAMESPACE, KubeFake, kubefake  # noqa: F401
from tests.integration.lepton.conftest import (  # noqa: F401
    lepton_connection,
    lepton_fake_factory,
)
from tests.integration.slurm.conftest import SlurmCluster, slurm_cluster  # noqa: F401
from tests.leptonfake.control import LeptonFake

PLATFORMS = ("local", "slurm", "docker", "kubernetes", "lepton", "brev")
TAG = uuid.uuid4().hex[:8]
#: The storage connection's secret key: every runner job receives it as AWS_SECRET_ACCESS_KEY.
S3_SECRET = f"hostile-s3-secret-{TAG}"
NGC_KEY = f"hostile-ngc-key-{TAG}"
LEPTON_TOKEN = f"hostile-lepton-token-{TAG}"
HF_TOKEN = f"hostile-hf-token-{TAG}"
K8S_TOKEN = f"hostile-k8s-token-{TAG}"
SSH_PASSPHRASE = f"hostile-ssh-passphrase-{TAG}"
STORAGE_CONN = "s3_hostile"
#: A DAG author's own secret (``secret_env``), in the password of :data:`AUTHOR_CONN`: every job receives it.
AUTHOR_SECRET = f"hostile-author-secret-{TAG}"
AUTHOR_CONN = "hostile_author"


@dataclass
class Platform:
    """One platform as the suite uses it.

    :param name: the platform.
    :param conn_id: its Airflow connection (None for ``local``).
    :param image: the image with python3 (an OCI bundle on SLURM; none on ``local``).
    :param secrets: every secret of the connection, by what it is (the storage key is added by the test).
    :param names: every job name the backend ever saw (deleted ones too), read on the backend.
    :param records: every text the backend keeps about the job with this id while it runs (no secret may be in it).
    :param details: ``backend_details`` of its jobs.
    """

    name: str
    conn_id: str | None
    image: str | None
    secrets: dict[str, str]
    names: Callable[[], set[str]]
    records: Callable[[str, str], dict[str, str]]
    details: dict[str, Any] = field(default_factory=dict)

    def operator_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"conn_id": self.conn_id, "image": self.image, "backend_details": dict(self.details)}
        if self.conn_id is None:
            kwargs["platform"] = "local"
        return kwargs


@pytest.fixture(scope="session")
def storage_conn() -> str:
    """An ``aws`` connection whose secret key is :data:`S3_SECRET` (no job of the suite talks to S3), and the DAG
    author's connection :data:`AUTHOR_CONN`."""
    conn = {"conn_type": "aws", "login": "AKIDHOSTILE", "password": S3_SECRET, "extra": {"region_name": "us-east-1"}}
    os.environ[f"AIRFLOW_CONN_{STORAGE_CONN.upper()}"] = json.dumps(conn)
    os.environ[f"AIRFLOW_CONN_{AUTHOR_CONN.upper()}"] = json.dumps({"conn_type": "generic", "password": AUTHOR_SECRET})
    return STORAGE_CONN


def on_login_node(cluster: SlurmCluster, command: str) -> subprocess.CompletedProcess[str]:
    """``command`` on the SLURM login node, from an ssh WITHOUT this process's environment (which defines the
    suite's connections, secrets and all): the process sampler must find no secret in it."""
    argv = [*cluster.ssh_argv(), command]
    env = {"PATH": os.environ["PATH"]}
    return subprocess.run(argv, check=False, capture_output=True, text=True, errors="replace", timeout=60, env=env)


# --------------------------------------------------------------------------- one fixture per platform


@pytest.fixture(scope="session")
def local_platform(tmp_path_factory: pytest.TempPathFactory) -> Platform:
    root = tmp_path_factory.mktemp("hostile-local")
    extra = {"jobs_dir": str(root / "jobs"), "results_root": str(root / "results"), "cancel_grace_seconds": 2}
    os.environ["AIRFLOW_CONN_TAO_LOCAL_HOSTILE"] = json.dumps({"conn_type": "tao_local", "extra": extra})

    def names() -> set[str]:
        metas = (root / "jobs").glob("*/meta.json")
        return {json.loads(meta.read_text()).get("name", "") for meta in metas}

    def records(job_id: str, name: str) -> dict[str, str]:
        job_dir = root / "jobs" / job_id
        return {f"local {p.name}": p.read_text(errors="replace") for p in job_dir.glob("*.json")}

    return Platform("local", "tao_local_hostile", None, {}, names, records)


@pytest.fixture(scope="session")
def slurm_platform(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Platform:  # noqa: F811
    """The CI cluster through a connection whose private key is encrypted with :data:`SSH_PASSPHRASE` (the same
    key pair, so the login node accepts it)."""
    key = tmp_path_factory.mktemp("hostile-ssh") / "id_ed25519"
    key.write_bytes(slurm_cluster.key_file.read_bytes())
    key.chmod(0o600)
    subprocess.run(
        ["ssh-keygen", "-q", "-p", "-P", "", "-N", SSH_PASSPHRASE, "-f", str(key)], check=True, capture_output=True
    )
    conn = slurm_cluster.airflow_conn
    extra = {k: v for k, v in conn["extra"].items() if k != "key_file"}
    extra |= {"private_key": key.read_text(), "private_key_passphrase": SSH_PASSPHRASE}
    os.environ["AIRFLOW_CONN_TAO_SLURM_HOSTILE"] = json.dumps({**conn, "extra": extra})
    root = slurm_cluster.results_root

    def names() -> set[str]:
        queued = on_login_node(slurm_cluster, "squeue -h -t all -o %j").stdout.split()
        done = on_login_node(slurm_cluster, "sacct -X -n -P -S now-3hours -o JobName%300").stdout.split()
        return {*queued, *done}

    def records(job_id: str, name: str) -> dict[str, str]:
        slurm_ids = on_login_node(slurm_cluster, f"squeue -h -t all -n {shlex.quote(name)} -o %i").stdout.split()
        texts = {
            f"slurm batch script {i}": on_login_node(slurm_cluster, f"scontrol write batch_script {i} -").stdout
            for i in slurm_ids
        }
        if slurm_ids:
            texts["slurm job records"] = on_login_node(
                slurm_cluster, f"scontrol show job -d {' '.join(slurm_ids)}"
            ).stdout
        listing = on_login_node(slurm_cluster, f"find {root}/jobs/{job_id} -type f -printf '%m %u %p\\n'").stdout
        for mode, owner, path in (line.split(" ", 2) for line in listing.splitlines()):
            private = mode == "600" and owner == slurm_cluster.user  # the job's secret channel: its owner's only
            if not (path == f"{root}/jobs/{job_id}/env/{job_id}.env" and private):
                texts[f"slurm {path} ({mode} {owner})"] = on_login_node(
                    slurm_cluster, f"cat {shlex.quote(path)}"
                ).stdout
        return texts

    secrets = {"ssh key passphrase": SSH_PASSPHRASE}
    return Platform("slurm", "tao_slurm_hostile", str(slurm_cluster.oci_bundle_py), secrets, names, records)


@pytest.fixture(scope="session")
def docker_platform(docker_engine: DockerEngine, docker_conn: str) -> Platform:  # noqa: F811
    def names() -> set[str]:
        return {(c.get("Labels") or {}).get(ct.LABEL_NAME, "") for c in docker_engine.containers()}

    def records(job_id: str, name: str) -> dict[str, str]:
        return {}  # its container is inspected with every other container of the engine

    return Platform("docker", docker_conn, docker_engine.python, {}, names, records)


@pytest.fixture(scope="session")
def kubernetes_platform(kubefake: KubeFake, tmp_path_factory: pytest.TempPathFactory) -> Platform:  # noqa: F811
    """The fake API server through a kubeconfig whose bearer token is :data:`K8S_TOKEN`."""
    config = json.loads(kubefake.kubeconfig.read_text())
    config["users"][0]["user"]["token"] = K8S_TOKEN
    kubeconfig = tmp_path_factory.mktemp("hostile-k8s") / "kubeconfig"
    kubeconfig.write_text(json.dumps(config))
    kubeconfig.chmod(0o600)
    extra = {"kube_config": json.dumps(config), "namespace": NAMESPACE, "results_pvc": "tao-results"}
    os.environ["AIRFLOW_CONN_TAO_K8S_HOSTILE"] = json.dumps(
        {"conn_type": "tao_kubernetes", "extra": {**extra, "cancel_grace_seconds": 2}}
    )

    def names() -> set[str]:
        return {entry["name"] for entry in kubefake.created("jobs")}

    def records(job_id: str, name: str) -> dict[str, str]:
        texts = {}
        for resource, prefix in (
            ("jobs", "/apis/batch/v1"),
            ("pods", "/api/v1"),
            ("configmaps", "/api/v1"),
            ("services", "/api/v1"),
            ("events", "/api/v1"),
        ):  # every object but Secrets, as the server serves them
            url = f"{kubefake.url}{prefix}/namespaces/{NAMESPACE}/{resource}"
            with urllib.request.urlopen(url, timeout=30) as response:
                texts[f"kubernetes {resource}"] = response.read().decode()
        return texts

    return Platform("kubernetes", "tao_k8s_hostile", None, {"kubeconfig token": K8S_TOKEN}, names, records)


@pytest.fixture(scope="session")
def lepton_server(lepton_fake_factory: Callable[..., LeptonFake]) -> LeptonFake:  # noqa: F811
    """A fake workspace of the suite's own, whose API token is :data:`LEPTON_TOKEN`."""
    return lepton_fake_factory("--token", LEPTON_TOKEN)


@pytest.fixture(scope="session")
def lepton_platform(lepton_server: LeptonFake) -> Platform:
    """The fake workspace through a connection with an NGC key and a Hugging Face token besides its API token."""
    lepton_fake = lepton_server
    os.environ["AIRFLOW_CONN_TAO_LEPTON_HOSTILE"] = lepton_connection(
        lepton_fake, ngc_api_key=NGC_KEY, hf_token=HF_TOKEN
    )

    def names() -> set[str]:
        return {job["labels"].get("tao.nvidia.com/job-name", "") for job in lepton_fake.jobs()}

    def records(job_id: str, name: str) -> dict[str, str]:
        jobs = [j for j in lepton_fake.jobs() if j["labels"].get("tao.nvidia.com/job-id") == job_id]
        return {"lepton job specs": json.dumps([j["body_json"] for j in jobs])}

    secrets = {"lepton token": lepton_fake.token, "ngc key": NGC_KEY, "hf token": HF_TOKEN}
    return Platform("lepton", "tao_lepton_hostile", None, secrets, names, records)


@pytest.fixture
def brev_platform(docker_engine: DockerEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Platform]:  # noqa: F811
    """A fresh fake Brev world with one instance ``box`` the jobs run on; the connection carries the world's token
    and an NGC key (the instance logs in to the image registry with it)."""
    BrevWorld.sweep_orphans(docker_engine.host)
    world = BrevWorld.create(tmp_path / "brevworld", docker_engine.host)
    monkeypatch.setenv("PATH", f"{world.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("BREV_FAKE_STATE", str(world.dir))
    world.set_ngc_key(NGC_KEY)
    monkeypatch.setenv("AIRFLOW_CONN_TAO_BREV_HOSTILE", brev_connection(world, ngc_api_key=NGC_KEY, registry="local"))
    world.create_instance("box")

    def names() -> set[str]:
        jobs = {(c.get("Labels") or {}).get(ct.LABEL_NAME, "") for c in world.job_containers()}
        return jobs | {i["name"] for i in world.instances()}

    def records(job_id: str, name: str) -> dict[str, str]:
        calls = [" ".join(c["argv"]) for c in world.calls()]
        return {"brev CLI calls": "\n".join(calls)}

    try:
        yield Platform(
            "brev", "tao_brev_hostile", None, {"brev token": world.token, "ngc key": NGC_KEY}, names, records,
            details={"network": "host", "instance_id": "box"},
        )  # fmt: skip
    finally:
        world.teardown()


@pytest.fixture
def platforms(request: pytest.FixtureRequest) -> dict[str, Platform]:
    """Every platform, images filled in from the shared engine. The fake servers start before any secret of the
    suite is in this process's environment (where the connections are defined), so none inherits one."""
    import asyncssh  # noqa: F401  (its import runs gcc to find liboqs: before any secret is in the environment)

    engine = request.getfixturevalue("docker_engine")
    for backend in ("slurm_cluster", "kubefake", "lepton_server", "triggerer"):
        request.getfixturevalue(backend)
    request.getfixturevalue("storage_conn")
    found = {name: request.getfixturevalue(f"{name}_platform") for name in PLATFORMS}
    for name in ("kubernetes", "lepton", "brev"):
        found[name].image = engine.python
    return found
