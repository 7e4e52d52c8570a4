"""The fault matrix's world: ONE ``airflow standalone`` (real scheduler + triggerer) with a ``tao_mx_<platform>``
connection on each of the six platforms' test backends, all up at once, and a :class:`Census` that counts each
task instance's jobs on the backends themselves -- never through the provider's code:

============ ================================================================================================
platform     what is asked, and how "unreachable" is made (:meth:`Backend.cut` / :meth:`Backend.restore`)
============ ================================================================================================
local        the connection's job folders (the platform's own records) and ``/proc`` (live processes with the
             job's ``TAO_JOB_ID``); unreachable = the jobs folder vanishes (an NFS mount gone: no status, no
             logs, no marks), the jobs keep running
slurm        ``squeue -t all`` / ``sacct`` over our own ssh to the real login node; unreachable = the login node's
             sshd port refuses connections and every open SSH connection is reset (the connection reaches sshd
             through a proxy of this session: the real sshd is shared with other test sessions on this machine)
docker       the engine's container list by this provider's labels; unreachable = the daemon's API refuses
             connections and resets the open ones (a proxy in front of its TCP socket, as for sshd: the real
             dockerd also runs the other platforms' containers; ``tests/integration/docker`` stops the daemon
             itself); its containers keep running, as with dockerd's live-restore
kubernetes   the fake API server's own record of every Job ever created, and the engine's pod containers;
             unreachable = every API request answers 503 for the duration
lepton       the fake workspace's records of every job (replicas and their phases); unreachable = 503 answers
brev         the engine's job containers on the world's instances, and the world's instances; unreachable = the
             CLI's connection is broken: every API call answers 502 and every ssh / exec to an instance drops
============ ================================================================================================

A task instance's jobs are recognised by the 10 hex digits every platform keeps at the end of the job's name
(sha256 of dag, task, run and map index: the same for every try, different for every run).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg2
import pytest

from airflow_provider_tao.hooks.lepton.status import LABEL_JOB_ID as LEPTON_JOB_ID_LABEL
from airflow_provider_tao.hooks.shared import container as ct
from tests.brevfake.control import BrevWorld
from tests.brevfake.world import World as _BrevState
from tests.e2e.airflow_harness import AirflowClient, AirflowStandalone, StandaloneConfig, wait_until
from tests.e2e.tao_jobs import job_processes
from tests.integration.brev.conftest import brev_connection
from tests.integration.docker.conftest import DockerEngine, docker_engine, remove_containers_under  # noqa: F401
from tests.integration.kubernetes.conftest import KubeFake, kubefake, kubernetes_connection  # noqa: F401
from tests.integration.lepton.conftest import lepton_connection, lepton_fake, lepton_fake_factory  # noqa: F401
from tests.integration.runner.tcp_proxy import TcpProxy
from tests.integration.slurm.conftest import SlurmCluster, slurm_cluster  # noqa: F401
from tests.leptonfake.control import LeptonFake

REPO = Path(__file__).resolve().parents[3]
MATRIX_DAGS = Path(__file__).resolve().parent / "dags"
SWEEPER_DAG = REPO / "example_dags" / "tao_orphan_sweeper.py"
PLATFORMS = ("local", "slurm", "docker", "kubernetes", "lepton", "brev")
#: How long a backend stays unreachable in the outage case.
OUTAGE_SECONDS = 60.0
_SLURM_ACTIVE = frozenset({"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING"})


def conn_id(platform: str) -> str:
    return f"tao_mx_{platform}"


def digest_of(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """The identity every platform keeps at the end of a task instance's job name."""
    return hashlib.sha256(f"{dag_id}\n{task_id}\n{run_id}\n{map_index}".encode()).hexdigest()[:10]


# ---------------------------------------------------------------------------------------------- the table

#: case -> platform -> (held, what was seen): the matrix table printed at the end of the session.
RESULTS: dict[str, dict[str, tuple[bool, str]]] = {}


def record_result(case: str, platform: str, ok: bool, detail: str) -> None:
    """One cell of the matrix table (recorded before the test's own asserts, so a failing cell shows too)."""
    RESULTS.setdefault(case, {})[platform] = (ok, detail)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    if not RESULTS:
        return
    terminalreporter.section("the fault matrix (tests/e2e/matrix)")
    terminalreporter.write_line("| case | " + " | ".join(PLATFORMS) + " |")
    terminalreporter.write_line("|---|" + "---|" * len(PLATFORMS))
    for case, cells in RESULTS.items():
        row = [f"{'ok' if cells[p][0] else 'FAILED'}: {cells[p][1]}" if p in cells else "--" for p in PLATFORMS]
        terminalreporter.write_line(f"| {case} | " + " | ".join(row) + " |")


# ---------------------------------------------------------------------------------------------- the backends


class Backend:
    """One platform's test backend as the tests see it: its jobs, asked of the backend itself.

    :param platform: the platform name.
    :param conn: the Airflow connection (a dict) the standalone gets for it.
    :param image: the job image (None: the worker host runs the job).
    :param python_image: an image with ``python3`` (the in-job runner).
    """

    def __init__(self, platform: str, conn: dict[str, Any], image: str | None, python_image: str | None) -> None:
        self.platform = platform
        self.conn = conn
        self.image = image
        self.python_image = python_image

    def observe(self) -> dict[str, bool]:
        """Every job of this provider the backend knows now or recorded (its own key, e.g. a Slurm job id) -> whether
        it is running or queued; keys carry the job's name after a ``|`` (``key|name``)."""
        raise NotImplementedError

    def cut(self) -> None:
        """Make the backend unreachable for the provider (see the module's table)."""
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError


class LocalBackend(Backend):
    def __init__(self, root: Path) -> None:
        self.jobs_dir = root / "jobs"
        conn = {"conn_type": "tao_local", "extra": {"jobs_dir": str(self.jobs_dir),
                "results_root": str(root / "results"), "cancel_grace_seconds": 2}}  # fmt: skip
        super().__init__("local", conn, None, None)

    def observe(self) -> dict[str, bool]:
        found = {}
        jobs_dir = self.jobs_dir if self.jobs_dir.is_dir() else self.jobs_dir.with_name("jobs-away")
        for meta in jobs_dir.glob("*/meta.json"):
            with contextlib.suppress(OSError, ValueError):
                job = json.loads(meta.read_text())
                found[f"{job['job_id']}|{job['name']}"] = bool(job_processes([job["job_id"]]))
        return found

    def cut(self) -> None:
        self.jobs_dir.rename(self.jobs_dir.with_name("jobs-away"))

    def restore(self) -> None:
        self.jobs_dir.with_name("jobs-away").rename(self.jobs_dir)


class SlurmBackend(Backend):
    def __init__(self, cluster: SlurmCluster, proxy: TcpProxy) -> None:
        self.cluster, self.proxy = cluster, proxy
        conn = {**cluster.airflow_conn, "port": proxy.port}
        super().__init__("slurm", conn, str(cluster.oci_bundle_py), str(cluster.oci_bundle_py))

    def observe(self) -> dict[str, bool]:
        out = self.cluster.ssh("squeue -h -t all -o '%i|%j|%T'", check=False, timeout=30).stdout
        found = {}
        for line in out.splitlines():
            slurm_id, _, rest = line.partition("|")
            name, _, state = rest.rpartition("|")
            found[f"{slurm_id}|{name}"] = state in _SLURM_ACTIVE
        return found

    def cut(self) -> None:
        self.proxy.kill()

    def restore(self) -> None:
        self.proxy.revive()


class DockerBackend(Backend):
    def __init__(self, engine: DockerEngine, proxy: TcpProxy, results_root: Path) -> None:
        self.engine, self.proxy = engine, proxy
        # an NGC key that must never show (pulls of nvcr.io images would carry it; the matrix's images are local)
        conn = {"conn_type": "tao_docker", "host": f"tcp://127.0.0.1:{proxy.port}", "password": f"ngc-{uuid.uuid4()}",
                "extra": {"results_root": str(results_root), "network": "host", "cancel_grace_seconds": 2,
                          "registry": "nvcr.io"}}  # fmt: skip
        super().__init__("docker", conn, engine.busybox, engine.python)

    def observe(self) -> dict[str, bool]:
        found = {}
        for c in self.engine.containers():
            labels = c.get("Labels") or {}
            if instances_label not in labels:  # a job on a fake Brev instance is Brev's
                found[f"{labels[ct.LABEL_JOB_ID]}|{labels.get(ct.LABEL_NAME, '')}"] = c["State"] == "running"
        return found

    def cut(self) -> None:
        self.proxy.kill()

    def restore(self) -> None:
        self.proxy.revive()


instances_label = "brevfake.on-instance"


class KubernetesBackend(Backend):
    def __init__(self, fake: KubeFake, engine: DockerEngine) -> None:
        self.fake, self.engine = fake, engine
        super().__init__("kubernetes", json.loads(kubernetes_connection(fake)), engine.busybox, engine.python)

    def observe(self) -> dict[str, bool]:
        running = {
            (c.get("Labels") or {}).get("kubefake.owner-uid", "")
            for c in self.engine.client.containers(filters={"label": "kubefake=1", "status": "running"})
        }
        return {f"{job['uid']}|{job['name']}": job["uid"] in running for job in self.fake.created("jobs")}

    def cut(self) -> None:
        self.fake.faults(503, OUTAGE_SECONDS * 10)

    def restore(self) -> None:
        self.fake.faults(503, 0)


class LeptonBackend(Backend):
    def __init__(self, fake: LeptonFake, engine: DockerEngine) -> None:
        self.fake = fake
        super().__init__("lepton", json.loads(lepton_connection(fake)), engine.busybox, engine.python)

    def observe(self) -> dict[str, bool]:
        # a retry's job has the same name (and, where the workspace makes the id from the name, the same id): the
        # key carries our job id from the job's labels too
        return {
            f"{job['id']}/{(job.get('labels') or {}).get(LEPTON_JOB_ID_LABEL, '')}|{job['name']}": any(
                r["phase"] in ("Pending", "Running") for r in job["replicas"]
            )
            or (not job["replicas"] and not job["deleted"] and job["state"] not in ("Completed", "Failed"))
            for job in self.fake.jobs()
        }

    def cut(self) -> None:
        self.fake.faults(503, OUTAGE_SECONDS * 10)

    def restore(self) -> None:
        self.fake.clear_faults()


class BrevBackend(Backend):
    def __init__(self, world: BrevWorld, engine: DockerEngine) -> None:
        self.world = world
        super().__init__("brev", json.loads(brev_connection(world)), engine.busybox, engine.python)

    def observe(self) -> dict[str, bool]:
        found = {}
        for c in self.world.engine().containers(f"brevfake.world={self.world.tag}", instances_label):
            labels = c.get("Labels") or {}
            if ct.LABEL_JOB_ID in labels:
                found[f"{labels[ct.LABEL_JOB_ID]}|{labels.get(ct.LABEL_NAME, '')}"] = c["State"] == "running"
        return found

    def instances_named(self, digest: str) -> list[str]:
        """Every instance of this world ever created for the task instance (deleted ones too)."""
        state = self.world.state()
        names = [i["name"] for i in state["instances"].values()] + [i["name"] for i in state["deleted"]]
        return [name for name in names if name.endswith(digest)]

    def cut(self) -> None:
        self.world.api_errors(1_000_000, 502, "Bad Gateway")
        self.world.flaky_ssh(1_000_000)

    def restore(self) -> None:
        with _BrevState(self.world.dir).mutate() as state:
            state["faults"]["api_errors"] = []
            state["faults"]["flaky_ssh"] = []


# ---------------------------------------------------------------------------------------------- the census


@dataclass
class Seen:
    """What the census saw of one task instance's jobs on its backend."""

    jobs: dict[str, bool] = field(default_factory=dict)  # backend key -> ever seen running or queued
    active_now: set[str] = field(default_factory=set)
    most_active: int = 0  # the most jobs running or queued at one moment

    @property
    def count(self) -> int:
        return len(self.jobs)


class Census:
    """Samples every backend once a second (one thread each) and keeps, per task instance (its digest), every job
    the backend ever showed and the most that ran at once.

    :param backends: the platforms' backends.
    """

    def __init__(self, backends: dict[str, Backend]) -> None:
        self.backends = backends
        self.lock = threading.Lock()
        self.seen: dict[tuple[str, str], Seen] = {}
        self.errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(b,), daemon=True) for b in backends.values()]
        for thread in self._threads:
            thread.start()

    def _loop(self, backend: Backend) -> None:
        while not self._stop.is_set():
            self.sample(backend)
            self._stop.wait(1.0)

    def sample(self, backend: Backend) -> None:
        try:
            observed = backend.observe()
        except Exception as exc:  # a sample that failed is skipped (and said at the end if the test fails)
            self.errors[backend.platform] = f"{type(exc).__name__}: {exc}"
            return
        by_digest: dict[str, dict[str, bool]] = {}
        for key, active in observed.items():
            name = key.rpartition("|")[2]
            by_digest.setdefault(name[-10:], {})[key] = active
        with self.lock:
            for digest, jobs in by_digest.items():
                seen = self.seen.setdefault((backend.platform, digest), Seen())
                for key, active in jobs.items():
                    seen.jobs[key] = seen.jobs.get(key, False) or active
                seen.active_now = {key for key, active in jobs.items() if active}
                seen.most_active = max(seen.most_active, len(seen.active_now))
            for (platform, digest), seen in self.seen.items():
                if platform == backend.platform and digest not in by_digest:  # its jobs are gone from the backend
                    seen.active_now = set()

    def of(self, platform: str, digest: str, *, fresh: bool = True) -> Seen:
        """The jobs of one task instance (after a fresh sample of its backend)."""
        if fresh:
            self.sample(self.backends[platform])
        with self.lock:
            seen = self.seen.get((platform, digest), Seen())
            return Seen(dict(seen.jobs), set(seen.active_now), seen.most_active)

    def wait(
        self, platform: str, digest: str, condition: Callable[[Seen], bool], what: str, timeout: float = 120
    ) -> Seen:
        return wait_until(
            lambda: seen if condition(seen := self.of(platform, digest)) else None,
            timeout=timeout,
            interval=0.5,
            message=lambda: (
                f"{platform}: {what}; saw {self.of(platform, digest, fresh=False)} "
                f"(sampling errors: {self.errors.get(platform)})"
            ),
        )

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


# ---------------------------------------------------------------------------------------------- the secrets

#: Connection fields that hold a secret (the rest -- paths, host keys, URLs -- are not).
_SECRET_FIELDS = re.compile(r"password|token|secret|passphrase|api_key|ngc_key|private_key", re.I)


def secrets_of(env: dict[str, str]) -> dict[str, str]:
    """Every secret of the ``AIRFLOW_CONN_*`` connections in ``env`` -> where it comes from."""
    found = {}
    for name, value in env.items():
        if not name.startswith("AIRFLOW_CONN_"):
            continue
        conn = json.loads(value)
        extra = conn.get("extra") or {}
        fields = {"password": conn.get("password"), **(json.loads(extra) if isinstance(extra, str) else extra)}
        for field_name, secret in fields.items():
            if isinstance(secret, str) and len(secret) >= 8 and _SECRET_FIELDS.search(field_name):
                found[secret] = f"{name[len('AIRFLOW_CONN_') :].lower()}.{field_name}"
    return found


class SecretWatch:
    """Looks for the connections' secrets where they must never be, while the matrix runs: every process's command
    line and the trigger rows of the metadata database (their kwargs decrypted), once a second; at the end, every
    task and trigger log file and every XCom value.

    :param standalone: the running standalone (its database, Fernet key and logs).
    :param secrets: secret -> where it comes from.
    """

    def __init__(self, standalone: AirflowStandalone, secrets: dict[str, str]) -> None:
        self.standalone = standalone
        self.secrets = secrets
        self.leaks: dict[str, str] = {}  # where it was seen -> which secret
        self.samples = {"processes": 0, "trigger rows": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _seen(self, where: str, text: str) -> None:
        for secret, name in self.secrets.items():
            if secret in text:
                self.leaks.setdefault(where, name)

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            for proc in psutil.process_iter(["pid", "cmdline"]):
                self._seen(f"command line of pid {proc.info['pid']}", " ".join(proc.info["cmdline"] or []))
                self.samples["processes"] += 1
            with contextlib.suppress(psycopg2.Error):
                for trigger_id, kwargs in self._query("SELECT id, kwargs FROM trigger"):
                    self._seen(f"trigger row {trigger_id}", kwargs + self._decrypt(kwargs))
                    self.samples["trigger rows"] += 1

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        url = self.standalone.database_url.replace("postgresql+psycopg2://", "postgresql://")
        with contextlib.closing(psycopg2.connect(url, connect_timeout=5)) as db, db.cursor() as cursor:
            cursor.execute(sql)
            return cursor.fetchall()

    def _decrypt(self, kwargs: str) -> str:
        from cryptography.fernet import Fernet

        if kwargs.startswith("{"):
            return kwargs
        return Fernet(self.standalone.env["AIRFLOW__CORE__FERNET_KEY"].encode()).decrypt(kwargs.encode()).decode()

    def finish(self) -> dict[str, str]:
        """Stop sampling, read every log and XCom; every place a secret was seen -> which secret."""
        self._stop.set()
        self._thread.join(timeout=30)
        for path in (self.standalone.home / "logs").rglob("*"):
            if path.is_file():
                self._seen(f"log {path.relative_to(self.standalone.home)}", path.read_text(errors="replace"))
        for dag_id, run_id, task_id, key, value in self._query("SELECT dag_id, run_id, task_id, key, value FROM xcom"):
            self._seen(f"XCom {key} of {dag_id}/{run_id}/{task_id}", str(value))
        return self.leaks


def check_no_secret_leaked(matrix: Matrix, case: str) -> None:
    """The end of a matrix module: the secrets it watched never showed (one cell per platform in the table)."""
    watch = matrix.secrets
    names = set(watch.secrets.values())
    assert {"tao_mx_lepton.password", "tao_mx_brev.password", "tao_mx_docker.password"} <= names, names
    leaks = watch.finish()
    detail = f"{len(watch.secrets)} secrets, {watch.samples['processes']} command lines, " \
             f"{watch.samples['trigger rows']} trigger rows sampled"  # fmt: skip
    for platform in PLATFORMS:
        record_result(case, platform, not leaks, detail)
    assert watch.samples["trigger rows"] > 0 and watch.samples["processes"] > 0, watch.samples
    assert not leaks, leaks


# ---------------------------------------------------------------------------------------------- the world


@dataclass
class Matrix:
    """The running standalone, its backends and the census.

    :param standalone: the ``airflow standalone``.
    :param backends: platform -> backend.
    :param census: the job counter.
    :param marks: a folder the matrix's DAGs write marks into (the worker host is this machine).
    :param secrets: the watch for the connections' secrets.
    """

    standalone: AirflowStandalone
    backends: dict[str, Backend]
    census: Census
    marks: Path
    secrets: SecretWatch
    started: list[tuple[str, str]] = field(default_factory=list)

    @property
    def client(self) -> AirflowClient:
        return self.standalone.client

    def trigger(self, dag_id: str, **conf: Any) -> str:
        run_id = self.client.trigger_dag_run(dag_id, conf=conf)
        self.started.append((dag_id, run_id))
        return run_id

    def states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        return {ti["task_id"]: ti["state"] for ti in self.client.list_task_instances(dag_id, run_id)}

    def wait_states(
        self, dag_id: str, run_id: str, wanted: Sequence[str], task_ids: Sequence[str], timeout: float = 180
    ) -> dict[str, str | None]:
        """Until every task of ``task_ids`` is in one of ``wanted``; any other end state fails at once."""
        from tests.e2e.airflow_harness import TERMINAL_TI_STATES, HarnessTimeout

        def check() -> dict[str, str | None] | None:
            states = self.states(dag_id, run_id)
            bad = {t: s for t, s in states.items() if t in task_ids and s in TERMINAL_TI_STATES and s not in wanted}
            if bad:
                raise HarnessTimeout(f"{dag_id}/{run_id}: {bad} (wanted {wanted})\n{self.logs_of(dag_id, run_id, bad)}")
            return states if all(states.get(t) in wanted for t in task_ids) else None

        return wait_until(
            check, timeout=timeout, interval=1.0,
            message=lambda: f"{dag_id}/{run_id}: {self.states(dag_id, run_id)}, wanted {wanted} for {list(task_ids)}",
        )  # fmt: skip

    def logs_of(self, dag_id: str, run_id: str, task_ids: Sequence[str] | dict[str, Any]) -> str:
        parts = []
        for task_id in task_ids:
            ti = self.client.get_task_instance(dag_id, run_id, task_id)
            for try_number in range(1, int(ti["try_number"] or 0) + 1):
                log = self.client.get_task_log_safe(dag_id, run_id, task_id, try_number)
                parts.append(f"--- {task_id} try {try_number}\n{log[-4000:]}")
        return "\n".join(parts)

    def log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        return self.client.get_task_log_safe(dag_id, run_id, task_id, try_number)

    def wait_watched(self, dag_id: str, run_id: str, task_ids: Sequence[str], try_number: int = 1) -> None:
        """Until a triggerer runs each task's trigger (Airflow calls a trigger's on_kill only once it runs)."""
        for task_id in task_ids:
            wait_until(
                lambda t=task_id: "Watching " in self.log(dag_id, run_id, t, try_number),
                timeout=120, interval=1.0, message=f"no triggerer picked up the trigger of {dag_id}/{run_id}/{task_id}",
            )  # fmt: skip

    def jobs(self, platform: str, dag_id: str, run_id: str, task_id: str) -> Seen:
        return self.census.of(platform, digest_of(dag_id, run_id, task_id))

    def wait_jobs(
        self,
        platform: str,
        dag_id: str,
        run_id: str,
        task_id: str,
        *,
        until: Callable[[Seen], bool],
        what: str,
        timeout: float = 120,
    ) -> Seen:
        """Until the task instance's jobs on the backend satisfy ``until`` (``what`` it waits for, for the error)."""
        return self.census.wait(platform, digest_of(dag_id, run_id, task_id), until, what, timeout)


@pytest.fixture(scope="session")
def matrix_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("matrix")


@pytest.fixture(scope="session")
def matrix_backends(
    matrix_root: Path,
    docker_engine: DockerEngine,  # noqa: F811
    slurm_cluster: SlurmCluster,  # noqa: F811
    kubefake: KubeFake,  # noqa: F811
    lepton_fake: LeptonFake,  # noqa: F811
) -> Iterator[dict[str, Backend]]:
    """Every platform's backend up at once (a fake Brev world of the session's own)."""
    BrevWorld.sweep_orphans(docker_engine.host)
    world = BrevWorld.create(matrix_root / "brev-world", docker_engine.host)
    ssh_proxy = TcpProxy((slurm_cluster.host, slurm_cluster.port))
    host, port = docker_engine.tcp.removeprefix("tcp://").rsplit(":", 1)
    docker_proxy = TcpProxy((host, int(port)))
    (matrix_root / "docker-results").mkdir()
    backends: dict[str, Backend] = {
        "local": LocalBackend(matrix_root / "local"),
        "slurm": SlurmBackend(slurm_cluster, ssh_proxy),
        "docker": DockerBackend(docker_engine, docker_proxy, matrix_root / "docker-results"),
        "kubernetes": KubernetesBackend(kubefake, docker_engine),
        "lepton": LeptonBackend(lepton_fake, docker_engine),
        "brev": BrevBackend(world, docker_engine),
    }
    try:
        yield backends
    finally:
        world.teardown()
        remove_containers_under(docker_engine, matrix_root)
        for proxy in (ssh_proxy, docker_proxy):
            if proxy.alive:
                proxy.kill()


# ---------------------------------------------------------------------------------------------- S3 for the jobs
# (the upload case, test_matrix_upload.py: begin) ------------------------------------------------------------


@dataclass
class MatrixS3:
    """A moto S3 server of the session, reached by every platform's jobs through a proxy of their own (the test can
    slow one down: an upload that takes a while), and the ``aws`` connection ``s3_mx_<platform>`` for each.

    :param endpoint: the moto server itself (what the tests read S3 through: never a proxy, never our code).
    :param bucket: the session's bucket.
    :param proxies: platform -> the proxy its jobs (and its tasks) reach S3 through, on an address they can reach:
        loopback for processes and host-network containers (local, slurm, docker, brev), the gateway of the Docker
        bridge the pods / replicas are on (kubernetes, lepton).
    :param task_settings: platform -> ``{"env", "backend_details"}`` the platform's task of the upload DAG adds.
    """

    endpoint: str
    bucket: str
    proxies: dict[str, TcpProxy]
    task_settings: dict[str, dict[str, Any]]
    secret_key: str = field(default_factory=lambda: f"s3-secret-{uuid.uuid4().hex}")

    @property
    def client(self) -> Any:
        from tests.integration.conftest import client_for

        return client_for(self.endpoint)

    def conn(self, platform: str) -> dict[str, Any]:
        extra = {"endpoint_url": self.proxies[platform].endpoint, "region_name": "us-east-1"}
        # a secret key of its own: the matrix watches that it never shows (moto takes any key)
        return {"conn_type": "aws", "login": "testing", "password": self.secret_key, "extra": extra}


def s3_conn_id(platform: str) -> str:
    return f"s3_mx_{platform}"


def _bridge_gateway(engine: DockerEngine, network: str) -> str:
    (found,) = [n for n in engine.client.networks(names=[network]) if n["Name"] == network]
    return str(engine.client.inspect_network(found["Id"])["IPAM"]["Config"][0]["Gateway"])


def _slurm_python_libs(cluster: SlurmCluster) -> Path:
    """boto3 and what it needs, on the cluster's shared filesystem: the nodes' python3 (the OCI bundle's /usr) has
    none, a TAO image has it. Copied once per botocore version (a folder of this test suite's own)."""
    import shutil

    import botocore

    target = cluster.results_root / f".mx-pylib-{botocore.__version__}"
    if target.is_dir():
        return target
    site = Path(botocore.__file__).resolve().parents[1]
    staging = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    for name in ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3"):
        shutil.copytree(site / name, staging / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(site / "six.py", staging / "six.py")
    os.chmod(staging, 0o755)
    with contextlib.suppress(OSError):  # another session was quicker: its copy is as good
        staging.rename(target)
    shutil.rmtree(staging, ignore_errors=True)
    return target


@pytest.fixture(scope="session")
def matrix_s3(
    matrix_root: Path,
    docker_engine: DockerEngine,  # noqa: F811
    slurm_cluster: SlurmCluster,  # noqa: F811
    lepton_fake: LeptonFake,  # noqa: F811
    kubefake: KubeFake,  # noqa: F811
) -> Iterator[MatrixS3]:
    """The session's moto server, its bucket and a proxy per platform (see :class:`MatrixS3`)."""
    import secrets
    import shutil

    from moto.server import ThreadedMotoServer

    from tests.kubefake.cluster import DockerRuntime

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    addresses = {p: "127.0.0.1" for p in PLATFORMS}
    addresses["kubernetes"] = _bridge_gateway(docker_engine, DockerRuntime.NETWORK)
    addresses["lepton"] = str(lepton_fake.network()["gateway"])
    proxies = {p: TcpProxy((host, int(port)), host=address) for p, address in addresses.items()}
    scratch = slurm_cluster.results_root / "scratch" / f"mx-upload-{secrets.token_hex(4)}"
    scratch.mkdir(parents=True)
    scratch.chmod(0o1777)  # the job's TMPDIR: the bundle's root filesystem is read-only
    slurm_env = {"PYTHONPATH": str(_slurm_python_libs(slurm_cluster)), "TMPDIR": str(scratch)}
    settings: dict[str, dict[str, Any]] = {p: {"env": {}, "backend_details": {}} for p in PLATFORMS}
    settings["slurm"]["env"] = slurm_env
    settings["brev"]["backend_details"] = {"network": "host"}  # the job containers on the proxy's loopback
    world = MatrixS3(f"http://{host}:{port}", f"tao-mx-{secrets.token_hex(4)}", proxies, settings)
    world.client.create_bucket(Bucket=world.bucket)
    try:
        yield world
    finally:
        for proxy in proxies.values():
            if proxy.alive:
                proxy.kill()
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def matrix_s3_env(s3: MatrixS3) -> dict[str, str]:
    """The standalone's share of :class:`MatrixS3`: the connections and what the upload DAG reads."""
    env = {f"AIRFLOW_CONN_{s3_conn_id(p).upper()}": json.dumps(s3.conn(p)) for p in PLATFORMS}
    tasks = {p: {"storage_conn_id": s3_conn_id(p), **s3.task_settings[p]} for p in PLATFORMS}
    return {**env, "TAO_MX_S3": json.dumps({"bucket": s3.bucket, "tasks": tasks})}


# (the upload case: end) -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def airflow_standalone_config(
    matrix_root: Path, matrix_backends: dict[str, Backend], matrix_s3: MatrixS3
) -> StandaloneConfig:
    marks = matrix_root / "marks"
    marks.mkdir(exist_ok=True)
    env = {f"AIRFLOW_CONN_{conn_id(p).upper()}": json.dumps(b.conn) for p, b in matrix_backends.items()}
    images = {p: {"conn_id": conn_id(p), "image": b.image, "python_image": b.python_image}
              for p, b in matrix_backends.items()}  # fmt: skip
    return StandaloneConfig(
        dags_folder=MATRIX_DAGS,
        extra_dag_files=(SWEEPER_DAG,),
        extra_env={
            **env,
            **matrix_s3_env(matrix_s3),  # the upload case
            "TAO_MX_PLATFORMS": json.dumps(images),
            "TAO_MX_MARKS": str(marks),
            # outage reports every 10 s: the 60 s outage is reported while it lasts
            "AIRFLOW__TAO__OUTAGE_REPORT_SECONDS": "10",
        },
        # every platform's task of two cases at once on the worker (the rest waits in the triggerer)
        parallelism=14,
        pythonpath=(REPO,),  # the explorer's instrumentation (tests.explorer) in the task runners
    )


@pytest.fixture(scope="module")
def matrix(
    airflow_standalone: AirflowStandalone,
    matrix_backends: dict[str, Backend],
    matrix_root: Path,
) -> Iterator[Matrix]:
    """The standalone with every matrix DAG (and the sweeper) parsed and unpaused, and the census running."""
    client = airflow_standalone.client
    from tests.e2e.matrix.dags.tao_matrix import MATRIX_DAG_IDS

    # the sweeper DAG reaches the metadata database through this connection (Airflow 3 blocks it in task code)
    database = {"sql_alchemy_conn": airflow_standalone.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]}
    made = client.http.post("/connections", json={"connection_id": "tao_metadata_db", "conn_type": "generic",
                            "extra": json.dumps(database)})  # fmt: skip
    if made.status_code != 409:  # 409: made for an earlier matrix module on the same standalone
        made.raise_for_status()
    for dag_id in MATRIX_DAG_IDS:
        client.wait_for_dag(dag_id, timeout=180)
        client.unpause_dag(dag_id)
    # the sweeper stays paused (its schedule would sweep in the middle of other cases): the orphan case runs it
    client.wait_for_dag("tao_orphan_sweeper", timeout=180)
    census = Census(matrix_backends)
    watch = SecretWatch(airflow_standalone, secrets_of(airflow_standalone.env))
    world = Matrix(airflow_standalone, matrix_backends, census, matrix_root / "marks", watch)
    try:
        yield world
    finally:
        census.close()
        watch.finish()
        for backend in matrix_backends.values():  # a case that failed half-way must not leave a backend cut
            with contextlib.suppress(Exception):
                backend.restore()
        _cancel_leftovers(world)


def _cancel_leftovers(world: Matrix) -> None:
    """Whatever the matrix's runs left running (a failed case, the jobs kept with cancel_on_kill=False) is stopped
    on its backend, through the backend's own tools."""
    client = world.client
    for dag_id, run_id in world.started:
        with contextlib.suppress(Exception):
            for task_id, state in world.states(dag_id, run_id).items():
                if state not in ("success", "failed", "skipped", "upstream_failed", "removed"):
                    client.mark_task_instance_failed(dag_id, run_id, task_id)
    backends = world.backends
    digests = {digest_of(d, r, t) for d, r in world.started for t in _task_ids(world, d, r)}
    for backend in backends.values():
        with contextlib.suppress(Exception):
            for key, active in backend.observe().items():
                job, _, name = key.partition("|")
                if active and name[-10:] in digests:
                    _stop(backend, job)


def _task_ids(world: Matrix, dag_id: str, run_id: str) -> list[str]:
    with contextlib.suppress(Exception):
        return list(world.states(dag_id, run_id))
    return []


def _stop(backend: Backend, key: str) -> None:
    """Stop one job with the backend's own tools (a Brev world's containers go with the world at the end)."""
    if isinstance(backend, LocalBackend):
        for pid in job_processes([key]):
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
    elif isinstance(backend, SlurmBackend):
        backend.cluster.ssh(f"scancel {shlex.quote(key)}", check=False)
    elif isinstance(backend, DockerBackend):
        backend.engine.client.kill(ct.container_name(key))
    elif isinstance(backend, KubernetesBackend):
        batch = backend.fake.api("batch")
        for job in batch.list_namespaced_job("default").items:
            if job.metadata.uid == key:
                batch.delete_namespaced_job(job.metadata.name, "default", propagation_policy="Background")
    elif isinstance(backend, LeptonBackend):
        backend.fake.client().job.delete(key.split("/", maxsplit=1)[0])
