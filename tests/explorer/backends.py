"""What each platform's backend itself says about the jobs of a task instance -- never asked through the provider:
the local platform's job folders and ``/proc``, the Docker engine's containers by label.

A job that *ran* started on the backend; it is *live* while its process (container) runs; it was *stopped* when it
ended by a signal (a cancel) rather than by its own exit; ``created`` orders the jobs of one name.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The job of every schedule: short, and it leaves its own id in its results folder (I5 reads it back).
JOB_SECONDS = 1.5
#: It ends on a cancel's SIGTERM at once (as a trainer does; a shell as a container's PID 1 would ignore it and run on
#: through the cancel's grace, long enough to end by itself at the explorer's time scale).
COMMAND = (
    f'trap "exit 143" TERM; sleep {JOB_SECONDS} & wait $!; mkdir -p "$TAO_RESULTS_ROOT/$TAO_JOB_ID"; '
    'echo "$TAO_JOB_ID" > "$TAO_RESULTS_ROOT/$TAO_JOB_ID/ran"'
)
#: The same job, but the first one of each task instance fails as a node fault does (ERR_INFRA: Airflow retries), so
#: the explorer also walks the retry's path: an ended job found, a new one submitted.
FLAKY = (
    'flag="$TAO_RESULTS_ROOT/.failed-once-$TAO_JOB_NAME"; '
    'if [ ! -e "$flag" ]; then touch "$flag"; echo "NCCL WARN net: remote process exited"; exit 1; fi; ' + COMMAND
)
JOBS = {"ok": COMMAND, "flaky": FLAKY}
#: The secret every explored connection carries (its password; Kubernetes: the kubeconfig's bearer token), so I7
#: can look for it where no secret may be: logs, trigger kwargs, job specs and the backend's records.
SECRET = "tao-explorer-secret-" + uuid.uuid4().hex
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
    #: It ended carrying a cancel's mark (read on the backend where the marks live with the job): the platform's
    #: verdict is Canceled whatever its exit code (docs/architecture.md, the cancel routine) -- a job that exited 0
    #: on its own while the cancel was on its way was canceled, and no try takes its result.
    cancel_marked: bool = False

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
    #: Most schedules of this platform run at once (0: the pool's size).
    parallel = 0
    #: The platform reruns a job a node fault ended in place (Slurm's requeue): the flaky job's retry is no new job.
    requeues = False

    conn_id: str
    engine: Any  # the Docker engine the platform's jobs run on (those with containers)

    def operator_kwargs(self, command: str) -> dict[str, Any]:
        raise NotImplementedError

    def _shell_in_busybox(self, command: str, **extra: Any) -> dict[str, Any]:
        """The operator arguments of a platform running containers: ``command`` in a shell in the engine's busybox."""
        return {
            "conn_id": self.conn_id,
            "image": self.engine.busybox,
            "command": ["sh", "-c", command],
            "poll_interval": self.poll_interval,
            "retries": 3,
            **extra,
        }

    def jobs(self, name: str) -> list[BackendJob]:
        raise NotImplementedError

    def live_ids(self, name: str) -> set[str]:
        return {job.job_id for job in self.jobs(name) if job.live}

    def leftovers(self, name: str, run_id: str, state: str, recorded: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """Platform resources of the name still held after its jobs ended and one sweep ran (I6); ``run_id`` and
        ``state`` are the task instance's (a sweep keeps what a waiting task will read), ``recorded`` what its task
        records give the sweep (:func:`airflow_provider_tao.sweeper.recorded_jobs`)."""
        return []

    def _sweep(self, run_id: str, state: str, recorded: Mapping[str, Mapping[str, Any]]) -> None:
        """One real sweep of the platform's resources (``reap_resources``) as ``airflow tao reap`` makes it: the task
        instance of ``run_id`` is ``state``, any other one still running."""
        from airflow_provider_tao.hooks import get_platform_hook

        hook = get_platform_hook(self.platform, self.conn_id)
        try:
            hook.reap_resources(
                lambda origin: state if origin.get("run_id") == run_id else "running", dry_run=False, recorded=recorded
            )
        finally:  # a sweep is a process of its own in the product: its SSH connection (SLURM) ends with it
            getattr(hook, "close", lambda: None)()

    def records(self, name: str) -> list[str]:
        """What the backend keeps of the name's jobs outside the job's private secret channel (I7 reads them)."""
        return []

    def forget(self, name: str) -> None:
        """Once its schedule was judged: what the name's jobs left on the platform as it keeps ended jobs (exited
        containers, finished Jobs until their TTL) goes. The engine lists every container it holds at each list,
        the fakes' controllers list at each tick: a thousand schedules' leftovers made each list take 0.5 s and the
        engine the busiest process of the machine."""

    def host_path(self, results_dir: str) -> Path:
        """A job's results folder as this machine sees it (I5 reads the job's own marker there)."""
        return Path(results_dir)


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
                # launched, not started: its supervisor never starts a job whose cancel mark is there
                live = (folder / "launch.json").exists() and not (folder / "marks" / "cancel_requested_by").exists()
            found.append(
                BackendJob(
                    job_id=folder.name,
                    created=float(meta.get("submitted_at") or 0),
                    ran=pid is not None,
                    live=live,
                    exit_code=None if verdict is None else int(verdict["exit_code"]),
                    results_dir=str(meta.get("results_dir", "")),
                    cancel_marked=verdict is not None
                    and int(verdict["exit_code"]) == 0
                    and (folder / "marks" / "cancel_requested_by").exists(),
                )
            )
        return sorted(found, key=lambda j: j.created)

    def records(self, name: str) -> list[str]:
        """Every file of the name's job folders but the 0600 environment file (the job's private channel)."""
        texts = []
        for folder in self.jobs_dir.iterdir() if self.jobs_dir.is_dir() else []:
            if (_json(folder / "meta.json") or {}).get("name") != name:
                continue
            for path in folder.rglob("*"):
                if path.is_file() and path.stat().st_mode & 0o077:
                    texts.append(f"{path}: {path.read_text(errors='replace')}")
        return texts


class DockerBackend(Backend):
    """The Docker engine: this provider's containers carrying the job name's label."""

    platform = "docker"

    def __init__(self, conn_id: str, engine: Any) -> None:
        self.conn_id = conn_id
        self.engine = engine
        self.client = engine.client

    def operator_kwargs(self, command: str) -> dict[str, Any]:
        return self._shell_in_busybox(command)

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
            exit_code = None if live else int(state.get("ExitCode", 0))
            found.append(
                BackendJob(
                    job_id=labels.get(ct.LABEL_JOB_ID, ""),
                    created=float(summary.get("Created") or 0),
                    ran=ran,
                    live=(live and ran) or state["Status"] == "created",
                    exit_code=exit_code,
                    results_dir=labels.get(ct.LABEL_RESULTS_DIR, ""),
                    cancel_marked=exit_code == 0 and self._cancel_marked(summary["Id"]),
                )
            )
        return sorted(found, key=lambda j: j.created)

    def _cancel_marked(self, container: str) -> bool:
        """The container's marks folder (files in the container itself) holds a cancel's mark."""
        from airflow_provider_tao.hooks.base import MARK_CANCEL
        from airflow_provider_tao.hooks.shared import container as ct

        try:
            stream, _ = self.client.get_archive(container, ct.MARKS_DIR)
            return MARK_CANCEL in ct.read_mark_archive(b"".join(stream))
        except Exception:  # removed meanwhile, or no marks folder
            return False

    def records(self, name: str) -> list[str]:
        """``docker inspect`` of the name's containers."""
        return _inspected(self.client, self.engine.named(name))

    def forget(self, name: str) -> None:
        for summary in self.engine.named(name):
            with contextlib.suppress(Exception):  # removed meanwhile
                self.client.remove_container(summary["Id"], force=True)


def _inspected(client: Any, summaries: list[dict[str, Any]]) -> list[str]:
    texts = []
    for summary in summaries:
        try:
            texts.append(json.dumps(client.inspect_container(summary["Id"])))
        except Exception:  # removed meanwhile
            continue
    return texts


def _json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


class KubernetesBackend(Backend):
    """The fake API server (``tests/kubefake``): its record of every Job ever created (``/fake/created``, deleted
    ones too) and its objects read over its own HTTP API; a Job's pods are real containers on the test engine
    (labelled with the Job's uid), whose state and exit code say whether it ran, runs, or was stopped.

    A pod's container is removed with its Job, so each state seen is kept: a Job deleted before any sample saw its
    pod reads as never ran (I2 cannot judge it; I1 sampled it while it ran).
    """

    platform = "kubernetes"

    def __init__(self, conn_id: str, fake: Any, engine: Any) -> None:
        self.conn_id = conn_id
        self.fake = fake
        self.engine = engine
        self.seen: dict[str, dict[str, Any]] = {}  # Job uid -> the last state of its pod's container

    def operator_kwargs(self, command: str) -> dict[str, Any]:
        return self._shell_in_busybox(command, gpu_count=0)

    def _pod_state(self, uid: str) -> dict[str, Any] | None:
        listed = self.engine.client.containers(all=True, filters={"label": f"kubefake.owner-uid={uid}"})
        for summary in listed:
            if summary["State"] in ("running", "restarting"):
                self.seen[uid] = {"live": True, "exit": None}
            else:
                try:
                    state = self.engine.client.inspect_container(summary["Id"])["State"]
                except Exception:  # removed between the list and the inspect
                    continue
                self.seen[uid] = {"live": False, "exit": int(state.get("ExitCode") or 0)}
        state = self.seen.get(uid)
        if state is not None and state["live"] and not listed:
            self.seen[uid] = state = {"live": False, "exit": None}  # deleted with its Job while it ran
        return state

    def jobs(self, name: str) -> list[BackendJob]:
        """A Job is live while its pod runs, or while the server holds it neither finished nor suspended (its pod
        is pending: it will run)."""
        from airflow_provider_tao.hooks.base import MARK_CANCEL
        from airflow_provider_tao.hooks.kubernetes.marks import mark_annotation
        from airflow_provider_tao.hooks.shared import container as ct

        held = {j.metadata.uid: j for j in self.fake.jobs_named(name)}
        found = []
        for entry in self.fake.created("jobs"):
            if entry["name"] != name:
                continue
            state = self._pod_state(entry["uid"])
            job = held.get(entry["uid"])
            waiting = job is not None and not job.spec.suspend and not _finished(job)
            labels = entry.get("labels") or {}
            found.append(
                BackendJob(
                    job_id=labels.get(ct.LABEL_JOB_ID, ""),
                    created=float(entry.get("created") or 0),
                    ran=state is not None,
                    live=bool(state and state["live"]) or (waiting and state is None),
                    exit_code=None if state is None else state["exit"],
                    results_dir=labels.get(ct.LABEL_RESULTS_DIR, ""),
                    # the Job's annotations as its last write left them (a deleted Job's too: the fake's history)
                    cancel_marked=mark_annotation(MARK_CANCEL) in (entry.get("annotations") or {}),
                )
            )
        return sorted(found, key=lambda j: j.created)

    def records(self, name: str) -> list[str]:
        """The name's Job and pods as the API server holds them (its Secrets are the job's private channel), and
        ``docker inspect`` of the pods' containers."""
        texts = [json.dumps(self.fake.api().api_client.sanitize_for_serialization(o))
                 for o in [*self.fake.jobs_named(name), *self.fake.pods_of(name)]]  # fmt: skip
        for entry in self.fake.created("jobs"):
            if entry["name"] == name:
                owned = self.engine.client.containers(all=True, filters={"label": f"kubefake.owner-uid={entry['uid']}"})
                texts += _inspected(self.engine.client, owned)
        return texts

    def leftovers(self, name: str, run_id: str, state: str, recorded: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """One sweep (``reap_resources``: canceled Jobs no task waits on, Jobs left suspended by a dead submission),
        then what is left of the name's jobs on the server: a Job that has not finished, or an object (Secret,
        ConfigMap, Service, pod) of a Job that is gone. A finished Job stays until its ``ttlSecondsAfterFinished``
        with what it owns (Kubernetes' own garbage collection, not ours)."""
        from airflow_provider_tao.hooks.kubernetes.hook import PODS_GONE_MARGIN_SECONDS
        from airflow_provider_tao.hooks.kubernetes.spec import CANCEL_GRACE_SECONDS
        from airflow_provider_tao.hooks.kubernetes.status import SETUP_TIMEOUT_SECONDS
        from airflow_provider_tao.hooks.shared import container as ct

        ids = {job.job_id for job in self.jobs(name)}
        batch = self.fake.api("batch")
        live_jobs = {j.metadata.labels.get(ct.LABEL_JOB_ID): j for j in batch.list_namespaced_job("default").items}
        if any(j.spec.suspend and j.metadata.name == name for j in live_jobs.values()):
            time.sleep(SETUP_TIMEOUT_SECONDS + 1)  # a suspended Job of a dead submission is swept past its window
            self._sweep(run_id, state, recorded)
        left = []
        for job_id in ids:
            objects = self.fake.objects_of(job_id)
            # a bound, not a wait: what a deleted Job owns goes with it (background deletion), a pod once its container
            # stopped -- a container cut before its shell's trap ignores SIGTERM (PID 1) for the grace, as the
            # hook's own wait for its pods allows
            deadline = time.monotonic() + CANCEL_GRACE_SECONDS + PODS_GONE_MARGIN_SECONDS
            while objects and not objects.get("jobs") and time.monotonic() < deadline:
                time.sleep(0.3)
                objects = self.fake.objects_of(job_id)
            job = live_jobs.get(job_id) if objects.get("jobs") else None
            if job is not None and _finished(job) and job.spec.ttl_seconds_after_finished is not None:
                continue
            if objects:
                left.append(f"job {job_id}: {objects} ({'suspended' if job and job.spec.suspend else 'no Job'})")
        return left

    def forget(self, name: str) -> None:
        batch = self.fake.api("batch")
        for job in self.fake.jobs_named(name):  # its pods (and their containers) go with it
            with contextlib.suppress(Exception):  # deleted meanwhile
                batch.delete_namespaced_job(job.metadata.name, "default", propagation_policy="Background")

    def host_path(self, results_dir: str) -> Path:
        from airflow_provider_tao.hooks.kubernetes.spec import RESULTS_MOUNT

        return self.fake.results_dir / Path(results_dir).relative_to(RESULTS_MOUNT)


def _finished(job: Any) -> bool:
    return any(c.type in ("Complete", "Failed") and c.status == "True" for c in job.status.conditions or [])


#: Slurm states of a job that has not ended (a pending job is live: it will run).
_SLURM_ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                          "DEADLINE", "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT"})  # fmt: skip

#: sacct states of a job waiting in the queue (squeue lists every such job).
_SLURM_QUEUED = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})


class SlurmBackend(Backend):
    """The real cluster (``tests/integration/slurm``): ``squeue`` and ``sacct`` by job name, run on its login node
    over its own sshd (one login per look). Slurm keeps no comment here (``AccountingStoreFlags`` unset), so a Slurm
    job is tied to its TAO job id by the comment ``squeue`` shows while it is queued or running, or else by the
    ``meta/slurm_job_id`` file the submission left in the job's folder on the cluster's shared file system.

    :param cluster: the cluster's facts and ssh helper (:class:`tests.integration.slurm.conftest.SlurmCluster`).
    """

    platform = "slurm"
    poll_interval = 0.5
    parallel = 6  # 2 nodes x 2 CPUs: more would wait queued, shared with the other tests' jobs
    requeues = True

    def __init__(self, conn_id: str, cluster: Any) -> None:
        self.conn_id = conn_id
        self.cluster = cluster
        self.jobs_root = Path(cluster.results_root) / "jobs"
        self.ids: dict[str, str] = {}  # Slurm job id -> TAO job id
        self.read: set[str] = set()  # job folders whose Slurm id is known
        # one multiplexed login for every look (a login per look costs a key exchange each, hundreds a run)
        self.master = f"/tmp/tao-explore-ssh-{uuid.uuid4().hex[:8]}"
        options = ("ControlMaster=auto", f"ControlPath={self.master}", "ControlPersist=300")
        self.argv = cluster.ssh_argv(*(arg for option in options for arg in ("-o", option)))

    def close(self) -> None:
        """The multiplexed login ends."""
        import subprocess

        subprocess.run([*self.argv[:-1], "-O", "exit", self.argv[-1]], capture_output=True, timeout=30, check=False)

    def ssh(self, command: str) -> str:
        import subprocess

        done = subprocess.run([*self.argv, command], capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise AssertionError(f"ssh {command!r} failed: {done.stderr}")
        return done.stdout

    def operator_kwargs(self, command: str) -> dict[str, Any]:
        return {
            "conn_id": self.conn_id,
            "image": str(self.cluster.oci_bundle_py),  # the host's /usr: bash runs the command
            "command": command,
            "poll_interval": self.poll_interval,
            "retries": 3,
        }

    def _tao_id(self, slurm_id: str) -> str:
        if slurm_id not in self.ids:
            for folder in set(os.listdir(self.jobs_root)) - self.read:
                try:
                    recorded = (self.jobs_root / folder / "meta" / "slurm_job_id").read_text().strip()
                except OSError:
                    continue
                self.read.add(folder)
                self.ids[recorded] = folder
        return self.ids.get(slurm_id, f"slurm:{slurm_id}")

    def jobs(self, name: str) -> list[BackendJob]:
        # sacct first: a job it shows waiting in the queue that squeue (slurmctld's own queue, every pending job)
        # no longer lists right after has left the queue: slurmdbd's record lags. Seen once 24 wide: the flaky job,
        # requeued and canceled while pending (trigger:aget_job_logs#2 cli_cancel), read "still runs" 8 s after
        # the task ended, while sacct later gave its End before the task's end; idle, sacct had it at once.
        out = self.ssh(
            f"sacct -X -n -P -S now-1hour --name={name} -o JobID,State,ExitCode,Submit,Start; echo @@; "
            f"squeue -h --name={name} -o '%i|%k'"
        )
        acct, _, queued = out.partition("@@\n")
        in_queue = set()
        for line in queued.splitlines():
            slurm_id, _, comment = line.partition("|")
            in_queue.add(slurm_id)
            if comment.startswith("tao:"):
                self.ids[slurm_id] = comment[4:]
        # slurmdbd records a job a moment after sbatch: one only squeue shows yet is queued, so live
        acct += "".join(f"{i}|PENDING|0:0|{time.strftime('%Y-%m-%dT%H:%M:%S')}|Unknown\n" for i in in_queue
                        if f"\n{i}|" not in f"\n{acct}")  # fmt: skip
        found = []
        for line in acct.splitlines():
            slurm_id, state, code, submit, start = (line.split("|") + [""] * 5)[:5]
            state = state.split()[0] if state else ""
            live = state not in _SLURM_ENDED and not (state in _SLURM_QUEUED and slurm_id not in in_queue)
            status, _, signal = code.partition(":")
            exit_code = int(status or 0) if not int(signal or 0) else 128 + int(signal)
            exit_code = None if live or state == "CANCELLED" else exit_code
            found.append(
                BackendJob(
                    job_id=self._tao_id(slurm_id),
                    created=_epoch(submit) + int(slurm_id) * 1e-9,  # whole seconds: the id orders one second's jobs
                    ran=start not in ("", "Unknown", "None"),
                    live=live,
                    exit_code=exit_code,
                    results_dir="",
                )
            )
        return sorted(found, key=lambda j: j.created)

    def records(self, name: str) -> list[str]:
        """The name's sbatch scripts, specs, metas and launchers on the cluster, and Slurm's own record of each job
        (``scontrol show job``: its command line, environment names, comment) -- not the 0600 env file."""
        texts = []
        for job in self.jobs(name):
            folder = self.jobs_root / job.job_id
            for path in folder.rglob("*") if folder.is_dir() else []:
                if path.is_file() and path.parent.name != "env" and path.stat().st_size < 1_000_000:
                    texts.append(f"{path}: {path.read_text(errors='replace')}")
        live = self.ssh(f"squeue -h --name={name} -o %i").split()
        texts += [self.ssh(f"scontrol show job {slurm_id}") for slurm_id in live]
        return texts

    def leftovers(self, name: str, run_id: str, state: str, recorded: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """The env file (every secret of the job) of each of the name's jobs, once its jobs have ended and one sweep
        (``reap_resources``: the env files of ended jobs whose task is over) ran."""
        self._sweep(run_id, state, recorded)
        left = []
        for job in self.jobs(name):
            if not job.live and (self.jobs_root / job.job_id / "env" / f"{job.job_id}.env").exists():
                left.append(f"job {job.job_id}: its env file (the job's secrets) is still on the cluster")
        return left


def _epoch(stamp: str) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return 0.0
