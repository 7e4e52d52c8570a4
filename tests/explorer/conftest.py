"""Backends of the explorer: the local platform in a folder of this session, the test Docker engine
(``tests/integration/docker/conftest.py``'s fixtures), kubefake, the SLURM cluster, a Lepton fake server and a Brev
fake world of the explorer's own (started by the Lepton and Brev integration tests' fixtures). Every platform hook
class is instrumented while this package's tests run (package scope: nothing of the explorer -- its wrappers, its time
scale, its environment -- reaches the tests after it)."""

from __future__ import annotations

import json
import os
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tao.hooks.brev import BrevHook
from airflow_provider_tao.hooks.docker import TAODockerHook
from airflow_provider_tao.hooks.kubernetes import TAOKubernetesHook
from airflow_provider_tao.hooks.lepton import LeptonHook
from airflow_provider_tao.hooks.local import LocalHook
from airflow_provider_tao.hooks.slurm import SlurmHook
from airflow_provider_tao.hooks.slurm.ssh import SyncSession
from tests.explorer.backends import SECRET, Backend, DockerBackend, KubernetesBackend, LocalBackend, SlurmBackend
from tests.explorer.cloud_backends import BrevBackend, LeptonBackend
from tests.explorer.recorder import CURRENT, instrument_hook
from tests.integration.brev.conftest import brev_connection, world_on_path
from tests.integration.docker.conftest import docker_connection, docker_engine, results_root  # noqa: F401
from tests.integration.kubernetes.conftest import kubefake, kubernetes_connection  # noqa: F401
from tests.integration.lepton.conftest import lepton_connection, lepton_fake_factory  # noqa: F401
from tests.integration.slurm.conftest import slurm_cluster  # noqa: F401

#: Every platform the explorer can run on, in the order they are set up.
EXPLORABLE = ("local", "docker", "kubernetes", "slurm", "lepton", "brev")
#: The platforms explored in this run: ``TAO_EXPLORE_PLATFORMS`` (comma-separated), by default those that fit every
#: CI run's time (see docs/reliability.md for what the others take here).
PLATFORMS = tuple(os.environ.get("TAO_EXPLORE_PLATFORMS", "local,docker").split(","))
#: The other platforms, whose whole products do not fit every CI run (docs/reliability.md): each run explores one
#: slice of one of them. A schedule's slice is a hash of (job, boundary, interruption) modulo ``SLICES``, so the
#: slices part the product whatever the clean run's poll count. The commit's number n (``git rev-list --count
#: HEAD``) picks the platform (n modulo 4) and its slice (n // 4 modulo ``SLICES``): any 4 x ``SLICES`` commits in a
#: row explore the four whole products. ``TAO_EXPLORE_SLICED=<platforms>`` (comma-separated; empty for none) and
#: ``TAO_EXPLORE_SLICE=<n>`` choose instead (a failing slice's reproducer).
ROTATED = ("kubernetes", "slurm", "lepton", "brev")
SLICES = int(os.environ.get("TAO_EXPLORE_SLICES", "12"))


def _commit_number() -> int:
    found = subprocess.run(
        ["git", "rev-list", "--count", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, check=False
    )
    return int(found.stdout) if found.returncode == 0 and found.stdout.strip().isdigit() else 0


COMMIT = _commit_number()
_sliced = os.environ.get("TAO_EXPLORE_SLICED", ROTATED[COMMIT % len(ROTATED)])
SLICED = tuple(p for p in _sliced.split(",") if p and p not in PLATFORMS)
SLICE = int(os.environ.get("TAO_EXPLORE_SLICE") or COMMIT // len(ROTATED) % SLICES)
#: The default run (no ``TAO_EXPLORE_PLATFORMS``: every CI run) explores one part of local and Docker's products
#: too -- the explorer is CPU-bound, and the suite's time is the machine's (issue 35) -- a schedule's part being a
#: hash of (job, boundary, interruption) modulo ``PARTS`` and the commit's number modulo ``PARTS`` picking it: any
#: ``PARTS`` commits in a row explore both whole. Naming the platforms (``TAO_EXPLORE_PLATFORMS``, every reproducer
#: and the whole-product commands do) explores them whole; ``TAO_EXPLORE_PARTS`` / ``TAO_EXPLORE_PART`` choose.
_NAMED = "TAO_EXPLORE_PLATFORMS" in os.environ or os.environ.get("TAO_EXPLORE_PAIRS") == "all"
PARTS = int(os.environ.get("TAO_EXPLORE_PARTS") or (1 if _NAMED else 3))
PART = int(os.environ.get("TAO_EXPLORE_PART") or COMMIT % PARTS)


def in_part(job: str, boundary: str | None, interruption: str | None) -> bool:
    """Whether the schedule (job, boundary, interruption) is in this run's part of its platform's product."""
    return PARTS == 1 or zlib.crc32(f"part|{job}|{boundary}|{interruption}".encode()) % PARTS == PART


@pytest.fixture(scope="package", autouse=True)
def _instrumented() -> Iterator[None]:
    import structlog

    from airflow_provider_tao.hooks.kubernetes import status as kubernetes_status
    from airflow_provider_tao.hooks.local import hook as local

    processors = structlog.get_config()["processors"]
    structlog.configure(processors=[*processors[:-1], _captured, processors[-1]])
    with pytest.MonkeyPatch.context() as patch:
        for cls in (LocalHook, TAODockerHook, TAOKubernetesHook, SlurmHook, LeptonHook, BrevHook):
            instrument_hook(cls, patch.setattr)
        # the explorer's time scale: a submission cut before its process started is given up on after 3 s, not 30
        patch.setattr(local, "LAUNCH_TIMEOUT_SECONDS", 3.0)
        # and a Kubernetes Job left suspended by a dead submission is swept 3 s after its creation, not 60
        patch.setattr(kubernetes_status, "SETUP_TIMEOUT_SECONDS", 3.0)
        # a worker's SSH connection ends with its process in Airflow; here the schedule's end closes it (a thousand
        # schedules' open connections would otherwise hold as many sshd processes on the cluster)
        opened = SyncSession.__init__

        def tracked(session: SyncSession, *args: Any, **kwargs: Any) -> None:
            opened(session, *args, **kwargs)
            if (recorder := CURRENT.get()) is not None:
                recorder.closers.append(session.close)

        patch.setattr(SyncSession, "__init__", tracked)
        _record_decisions(patch)
        _person_cancel_records(patch)
        yield
    structlog.configure(processors=processors)


def _record_decisions(patch: pytest.MonkeyPatch) -> None:
    """Every ``decide(facts, situation)`` call is told to the schedule's recorder (the pair explorer's dedupe)."""
    from airflow_provider_tao.operators import decisions, lifecycle, outcome
    from airflow_provider_tao.triggers import job

    decide = decisions.decide

    def recorded(facts: Any, situation: Any) -> Any:
        if (recorder := CURRENT.get()) is not None:
            recorder.decided(facts, situation)
        return decide(facts, situation)

    for module in (decisions, lifecycle, outcome, job):  # the hooks' and the sweeper's import it when they decide
        patch.setattr(module, "decide", recorded)


def _person_cancel_records(patch: pytest.MonkeyPatch) -> None:
    """``airflow tao cancel`` keeps its record in the metadata database; the explorer's in the schedule's store."""
    from airflow_provider_tao import person_cancel

    def task(job: Any) -> Any:
        recorder = CURRENT.get()
        assert recorder is not None and recorder.task is not None, "a person's cancel outside a schedule"
        return recorder.task

    patch.setattr(person_cancel, "_task_instance_now", lambda job: task(job).person_record())
    patch.setattr(person_cancel, "_keep", lambda job, value: task(job).person_record(value))


def _captured(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    """The structlog processor of the explorer: each event of a schedule kept, masked, on its recorder (I7)."""
    from airflow.sdk._shared.secrets_masker import redact

    recorder = CURRENT.get()
    if recorder is not None:
        recorder.logs.append(str(redact(dict(event))))
    return event


@pytest.fixture(scope="package")
def local_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    root = tmp_path_factory.mktemp("explore-local")
    conn_id = "tao_local_explore"
    extra = {"jobs_dir": str(root / "jobs"), "results_root": str(root / "results"), "cancel_grace_seconds": 1}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CUDA_VISIBLE_DEVICES", "")
        connection = {"conn_type": "tao_local", "password": SECRET, "extra": extra}
        patch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(connection))
        backend = LocalBackend(conn_id, root / "jobs")
        yield backend
        _kill_jobs(backend)


def _kill_jobs(backend: LocalBackend) -> None:
    """What a failing schedule left running (only this session's job folders' process groups)."""
    import signal

    for folder in backend.jobs_dir.iterdir() if backend.jobs_dir.is_dir() else []:
        try:
            pgid = int(json.loads((folder / "pid").read_text())["pgid"])
            os.killpg(pgid, signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            continue


@pytest.fixture(scope="package")
def docker_backend(docker_engine, results_root: Path) -> Iterator[Backend]:  # noqa: F811
    conn_id = "tao_docker_explore"
    # the password is a registry's (for pulls from registry.explorer.invalid only: never used, never to be seen)
    connection = json.loads(
        docker_connection(docker_engine, results_root, cancel_grace_seconds=1, registry="registry.explorer.invalid")
    )
    connection = json.dumps({**connection, "password": SECRET})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", connection)
        yield DockerBackend(conn_id, docker_engine)


@pytest.fixture(scope="package")
def kubernetes_backend(kubefake, docker_engine) -> Iterator[Backend]:  # noqa: F811
    conn_id = "tao_k8s_explore"
    with pytest.MonkeyPatch.context() as patch:
        # the kubeconfig inline (a secret extra), its bearer token the explorer's secret (the fake takes any)
        kubeconfig = json.loads(kubefake.kubeconfig.read_text())
        kubeconfig["users"][0]["user"]["token"] = SECRET
        connection = json.loads(kubernetes_connection(kubefake, cancel_grace_seconds=1))
        connection["extra"].pop("kube_config_path")
        connection["extra"]["kube_config"] = json.dumps(kubeconfig)
        patch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(connection))
        yield KubernetesBackend(conn_id, kubefake, docker_engine)


@pytest.fixture(scope="package")
def slurm_backend(slurm_cluster) -> Iterator[Backend]:  # noqa: F811
    conn_id = "tao_slurm_explore"
    connection = slurm_cluster.airflow_conn
    connection["extra"]["cancel_grace_seconds"] = 1
    connection["password"] = SECRET  # the key logs in first: the password is never sent
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(connection))
        backend = SlurmBackend(conn_id, slurm_cluster)
        yield backend
        backend.close()


@pytest.fixture(scope="package")
def lepton_backend(lepton_fake_factory, docker_engine) -> Iterator[Backend]:  # noqa: F811
    """A fake Lepton workspace of the explorer's own whose API token is the explorer's secret; the connection
    gives the job an HF token (the same secret), so every job has ``tao.<job_id>.env.*`` user secrets (I6)."""
    conn_id = "tao_lepton_explore"
    fake = lepton_fake_factory("--token", SECRET)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", lepton_connection(fake, hf_token=SECRET))
        yield LeptonBackend(conn_id, fake, docker_engine)


@pytest.fixture(scope="package")
def brev_backend(docker_engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:  # noqa: F811
    """A fake Brev world of the explorer's own whose login token holds the explorer's secret (its session key)."""
    conn_id = "tao_brev_explore"
    root = tmp_path_factory.mktemp("explore-brev")
    with pytest.MonkeyPatch.context() as patch, world_on_path(docker_engine, root / "world", patch) as world:
        with world.world.mutate() as state:
            state["auth"]["session_key"] = SECRET
        patch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", brev_connection(world, cancel_grace_seconds=1))
        backend = BrevBackend(conn_id, world, docker_engine, root / "kept")
        yield backend
        backend.close()


@pytest.fixture(scope="package")
def backends(request: pytest.FixtureRequest) -> dict[str, Backend]:
    """Platform name -> its backend, set up on first use."""
    return _Lazy(request)  # type: ignore[return-value]


class _Lazy(dict):  # type: ignore[type-arg]
    def __init__(self, request: pytest.FixtureRequest) -> None:
        super().__init__()
        self.request = request

    def __missing__(self, platform: str) -> Backend:
        backend = self.request.getfixturevalue(f"{platform}_backend")
        self[platform] = backend
        return backend
