"""The explorer's observers of the two platforms that exist here only as fakes: DGX Cloud Lepton (``tests/leptonfake``:
its server's own record of every job ever posted and of its secrets) and NVIDIA Brev (``tests/brevfake``: its world's
instances, and the containers its machines run jobs in on the test Docker engine). Never asked through the provider.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.explorer.backends import JOBS, Backend, BackendJob, _inspected

#: Lepton job states in which no replica runs or will run again (the fake's ``FINISHED``, stopped, gone).
_LEPTON_OVER = frozenset({"Completed", "Failed", "Stopped", "Deleted", "Archived"})
#: Where the lustre-fs volume's permitted prefix is mounted in every Lepton job (the node group's volume).
_LUSTRE_MOUNT = "/mnt/lustre-fs"
_LUSTRE_PREFIX = "fsw/portfolios/ci"


class LeptonBackend(Backend):
    """The fake Lepton server (``tests/integration/lepton``): ``/fake/jobs`` (every job ever created, deleted ones
    too, with the exact body the client sent, its state history and its replicas) and ``/fake/secrets``. A job ran
    once its history shows ``Running`` or a replica left ``Pending`` (a replica stopped before its container started
    counts as ran and stopped: the stop ended it); it is live while a replica runs or is pending, or while the server
    has not finished it; a replica ended by a stop or a delete has no exit code of its own (or the trainer's 143).

    :param fake: the running server (:class:`tests.leptonfake.control.LeptonFake`).
    """

    platform = "lepton"

    def __init__(self, conn_id: str, fake: Any, engine: Any) -> None:
        self.conn_id = conn_id
        self.fake = fake
        self.engine = engine

    def operator_kwargs(self, command: str) -> dict[str, Any]:
        if command == JOBS["flaky"]:
            # A node fault as Lepton shows it: the replica ends as one killed from outside (exit 137, no OOM; the
            # shell is the container's PID 1, which a SIGKILL from inside does not end). A replica that exits 1
            # itself is the server's ERR_PROGRAM, whose verdict rightly beats a log line
            # (hooks/lepton/status.py follow_server_verdict): not retried, so not the flaky job's path.
            # The flag's folder, the volume's results root, exists once a job wrote its results there.
            command = 'mkdir -p "$TAO_RESULTS_ROOT"; ' + command.replace("exit 1;", "exit 137;")
        return self._shell_in_busybox(command, gpu_count=0)

    def _named(self, name: str) -> list[dict[str, Any]]:
        from airflow_provider_tao.hooks.lepton.status import LABEL_NAME

        return [
            j for j in self.fake.jobs(label=f"{LABEL_NAME}={name}") if (j.get("labels") or {}).get(LABEL_NAME) == name
        ]

    def jobs(self, name: str) -> list[BackendJob]:
        from airflow_provider_tao.hooks.lepton.hook import RESULTS_DIR_ENV
        from airflow_provider_tao.hooks.lepton.status import LABEL_JOB_ID, MARK_LABELS
        from airflow_provider_tao.hooks.ownership import MARK_CANCEL

        found = []
        marked: set[str] | None = None  # the jobs a cancel marked, read once one exited 0 (rare: the list is long)
        for record in self._named(name):
            replicas = record["replicas"]
            live = any(r["phase"] in ("Pending", "Running") for r in replicas) or (
                not record["deleted"] and record["state"] not in _LEPTON_OVER
            )
            codes = [r["exit_code"] for r in replicas if r["exit_code"] is not None]
            envs = {e.get("name"): e.get("value") for e in record["body"].get("spec", {}).get("envs") or []}
            job_id = record["labels"].get(LABEL_JOB_ID, "")
            exit_code = None if live or not codes else int(codes[-1])
            if exit_code == 0 and marked is None:
                marked = self._cancel_marked()
            found.append(
                BackendJob(
                    job_id=job_id,
                    created=float(record["history"][0]["at"]) if record["history"] else 0.0,
                    # the job turns Running a controller pass after its replica did: a job stopped in between
                    # shows only its replica's end (Terminated, no exit code: ended by the stop, not by itself)
                    ran=any(h["state"] == "Running" for h in record["history"])
                    or any(r["phase"] != "Pending" for r in replicas),
                    live=live,
                    exit_code=exit_code,
                    results_dir=str(envs.get(RESULTS_DIR_ENV) or ""),
                    cancel_marked=exit_code == 0
                    and (job_id in (marked or ()) or MARK_LABELS[MARK_CANCEL] in record["labels"]),
                )
            )
        return sorted(found, key=lambda j: j.created)

    def _cancel_marked(self) -> set[str]:
        """The job ids a cancel mark was ever kept for as a secret (``tao.<job_id>.mark.cancel.<try>``; a deleted
        job's marks go with it, the server's record of every secret stored keeps their names). Where the workspace
        patches labels, the mark is the job's label, kept on its record."""
        from airflow_provider_tao.hooks.ownership import MARK_CANCEL

        names = [item["name"] for item in self.fake.secrets(values=False)["ever"]]
        return {n.split(".")[1] for n in names if n.startswith("tao.") and f".mark.{MARK_CANCEL}." in n}

    def records(self, name: str) -> list[str]:
        """The name's jobs as the server stored them (their bodies: specs, labels, environment; the user secrets
        they reference are the job's private channel)."""
        return [json.dumps(record) for record in self._named(name)]

    def leftovers(self, name: str, run_id: str, state: str, recorded: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """One real sweep (``reap_resources``), then any user secret (``tao.<job_id>.env.*``, ``.files.*``, marks)
        or image pull secret of the name's jobs that is still held although its job is over: a deleted job keeps
        nothing, an ended one only its ownership marks (they go with it, at its TTL).

        A secret created for a job that was never posted has no job record to be found by; the explorer cannot make
        one: its interruptions come between two platform calls, and ``create_job`` posts the job in the same call
        that created the secrets (an outage fails a call before it starts)."""
        from airflow_provider_tao.hooks.lepton.api import pull_secret_name, secret_prefix
        from airflow_provider_tao.hooks.lepton.status import LABEL_JOB_ID

        self._sweep(run_id, state, recorded)
        stored = self.fake.secrets()
        by_id: dict[str, list[dict[str, Any]]] = {}
        for record in self._named(name):
            by_id.setdefault(record["labels"].get(LABEL_JOB_ID, ""), []).append(record)
        left = []
        for job_id, records in by_id.items():
            if any(j.live for j in self.jobs(name) if j.job_id == job_id):
                continue
            gone = all(r["deleted"] for r in records)
            held = [n for n in stored["user"] if n.startswith(secret_prefix(job_id))]
            held = [n for n in held if gone or ".mark." not in n]
            held += [n for n in stored["image_pull"] if n == pull_secret_name(job_id)]
            if held:
                left.append(f"job {job_id} ({'deleted' if gone else records[-1]['state']}): secrets {held}")
        return left

    def forget(self, name: str) -> None:
        client = self.fake.client()
        for record in self._named(name):  # an ended job's replica containers go with it
            if not record["deleted"]:
                with contextlib.suppress(Exception):  # deleted meanwhile
                    client.job.delete(record["id"])

    def host_path(self, results_dir: str) -> Path:
        relative = results_dir.removeprefix(_LUSTRE_MOUNT).strip("/")
        return self.fake.volumes()["lustre-fs"] / _LUSTRE_PREFIX / relative


#: Where a Brev job writes its results: a folder of the instance's disk (``/home/ubuntu`` is a host folder of the
#: fake's, see tests/brevfake/instance/init.py), gone with the instance.
BREV_RESULTS = "/home/ubuntu/results"
#: The flaky job on Brev: its first machine fails under it (see :meth:`BrevBackend.operator_kwargs`).
FAULT_ENV = "EXPLORE_NODE_FAULT"


def _kill(client: Any, container: str) -> None:
    """Kill a running container; one that ended (or went) since it was listed is dead already."""
    import docker

    try:
        client.kill(container)
    except docker.errors.APIError as exc:
        if exc.status_code not in (404, 409):
            raise


class BrevBackend(Backend):
    """The fake Brev world (``tests/integration/brev``): its instances (``world.json``) and the job containers its
    machines started on the test engine (labels ``brevfake.world`` and ``brevfake.on-instance``, and this provider's
    job labels), ``docker inspect`` of each.

    A task's own instance is deleted with its job, and its containers and disk with it, so what the observer saw is
    kept: each container's last state (a container removed while it ran was stopped), its ``docker inspect``, the
    instance's readable files, a copy of each job's results folder made as it appeared, and the jobs whose cancel
    mark appeared (a thread watching the world's disks every 0.1 s: a job's marker is written before it exits, and
    its instance is deleted only after a poll saw it exit; a cancel's mark is written a stop and a ``brev ls`` before
    the cancel deletes the instance).

    :param world: the world (:class:`tests.brevfake.control.BrevWorld`), ``brev`` first on ``PATH``.
    :param engine: the test engine (:class:`tests.integration.docker.conftest.DockerEngine`).
    :param kept: a folder of this session for the copies of the results folders.
    """

    platform = "brev"
    poll_interval = 0.5  # a poll is one ``brev ls`` and one ``brev exec`` (an ssh login): seconds, not milliseconds
    parallel = 4  # each schedule runs a machine (a container) and a CLI process per call on 2 cores

    def __init__(self, conn_id: str, world: Any, engine: Any, kept: Path) -> None:
        self.conn_id = conn_id
        self.world = world
        self.engine = engine
        self.kept = kept
        self.seen: dict[str, dict[str, Any]] = {}  # container id -> {job, inspect, live}
        self.files: dict[str, dict[str, str]] = {}  # job name -> {instance file: text}
        self.lock = threading.Lock()
        self.checked: set[str] = set()  # job containers the node fault has looked at
        self.cancel_marked: set[str] = set()  # job ids whose cancel mark was seen on their instance's disk
        self.faulted: set[str] = set()  # task instances (job names) whose machine failed once
        self.watch_errors: list[str] = []  # what the watcher could not look at (it looks again 0.1 s later)
        self.stop = threading.Event()
        self.watcher = threading.Thread(target=self._watch, name="explore-brev-results", daemon=True)
        self.watcher.start()

    def close(self) -> None:
        self.stop.set()
        self.watcher.join(10)
        if self.watch_errors:  # each was looked at again 0.1 s later; shown, so a persistent one is seen
            failed, last = len(self.watch_errors), self.watch_errors[-1]
            print(f"brev: the disk watcher's looks failed {failed} time(s), the last with {last}")

    def _watch(self) -> None:
        while not self.stop.wait(0.1):
            try:
                self._node_fault()
                self._look_at_disks()
            except Exception as exc:  # the engine slow under load, a container gone meanwhile: the next look sees it
                # a watcher that died here once copied no result again: every later success read as I5
                self.watch_errors.append(repr(exc))

    def _look_at_disks(self) -> None:
        """Note the cancel marks that appeared and copy each job's results marker as it appears."""
        from airflow_provider_tao.hooks.base import MARK_CANCEL

        for mark in (self.world.dir / "instances").glob(f"*/home/.tao-brev/jobs/*/marks/{MARK_CANCEL}"):
            self.cancel_marked.add(mark.parent.parent.name)
        for marker in (self.world.dir / "instances").glob("*/home/results/*/ran"):
            copy = self.kept / marker.parent.name / "ran"
            if not copy.exists():
                try:
                    text = marker.read_text()
                except OSError:
                    continue
                if text.strip():
                    copy.parent.mkdir(parents=True, exist_ok=True)
                    copy.write_text(text)

    def _node_fault(self) -> None:
        """The flaky job's node fault as Brev shows it: the first job container of a task instance that asked for
        one (``EXPLORE_NODE_FAULT``) has its instance fail under it (``FAILURE``) once it runs, and dies with it."""
        running = self.engine.client.containers(
            filters={"label": [f"brevfake.world={self.world.tag}", "brevfake.on-instance"], "status": "running"}
        )
        for summary in running:
            if summary["Id"] in self.checked:
                continue
            (text,) = _inspected(self.engine.client, [summary]) or [""]
            env = json.loads(text)["Config"]["Env"] if text else []
            instance = summary["Labels"].get("tao.nvidia.com/job-name", "")
            if f"{FAULT_ENV}=1" in env and instance not in self.faulted:
                self.world.set_status(instance, "FAILURE", "explorer: the machine failed under its job")
                # its processes die with it (the fake's FAILURE only flips the status): a job on a failed machine
                # that ran on would read as live to a person's cancel, which the task rightly takes for ended
                _kill(self.engine.client, summary["Id"])
                self.faulted.add(instance)
            self.checked.add(summary["Id"])  # last: a look that failed half-way is made again (each step holds twice)

    def operator_kwargs(self, command: str) -> dict[str, Any]:
        env = {}
        if command == JOBS["flaky"]:
            # The flaky job's own failure marks its task instance in a file of its results root; a Brev task's
            # results root is its own instance's disk, deleted with the failed job, so a retry on a new instance
            # would fail again for ever. Its node fault is the instance's instead (:meth:`_node_fault`).
            command, env = JOBS["ok"], {FAULT_ENV: "1"}
        return self._shell_in_busybox(command, env=env, gpu_count=0, results_uri=BREV_RESULTS)

    def _look(self, name: str) -> None:
        """Sample the engine and the instance's disk: every container of the name as it is now."""
        from airflow_provider_tao.hooks.shared import container as ct

        summaries = self.engine.client.containers(
            all=True, filters={"label": [f"brevfake.world={self.world.tag}", "brevfake.on-instance"]}
        )
        present = set()
        for summary in summaries:
            labels = summary.get("Labels") or {}
            if labels.get(ct.LABEL_NAME) != name:
                continue
            (text,) = _inspected(self.engine.client, [summary]) or [""]
            if not text:
                continue
            present.add(summary["Id"])
            state = json.loads(text)["State"]
            with self.lock:
                self.seen[summary["Id"]] = {"name": name, "labels": labels, "created": summary.get("Created"),
                                            "state": state, "inspect": text}  # fmt: skip
        with self.lock:
            for cid, entry in self.seen.items():
                if entry["name"] == name and cid not in present and entry["state"]["Status"] == "running":
                    entry["state"] = {**entry["state"], "Status": "removed", "ExitCode": None}  # deleted as it ran
        # by the instance's id, as listed (asking by name again races the instance's deletion)
        home = next((self.world.world.instance_dir(i["id"]) / "home" for i in self.world.instances()
                     if i["name"] == name), None)  # fmt: skip
        if home is not None and home.is_dir():
            for path in home.rglob("*"):
                try:
                    if path.is_file() and path.stat().st_mode & 0o077 and path.stat().st_size < 1_000_000:
                        self.files.setdefault(name, {})[str(path)] = path.read_text(errors="replace")
                except OSError:  # removed with its instance meanwhile
                    continue

    def jobs(self, name: str) -> list[BackendJob]:
        from airflow_provider_tao.hooks.shared import container as ct

        self._look(name)
        found = []
        with self.lock:
            entries = [e for e in self.seen.values() if e["name"] == name]
        for entry in entries:
            state = entry["state"]
            status = state["Status"]
            ran = not str(state.get("StartedAt", "")).startswith("0001-")
            live = status in ("running", "restarting", "paused", "created")
            code = state.get("ExitCode")
            found.append(
                BackendJob(
                    job_id=entry["labels"].get(ct.LABEL_JOB_ID, ""),
                    created=float(entry["created"] or 0),
                    ran=ran,
                    live=(live and ran) or status == "created",
                    exit_code=None if live or code is None else int(code),
                    results_dir=entry["labels"].get(ct.LABEL_RESULTS_DIR, ""),
                    cancel_marked=entry["labels"].get(ct.LABEL_JOB_ID, "") in self.cancel_marked,
                )
            )
        return sorted(found, key=lambda j: j.created)

    def records(self, name: str) -> list[str]:
        """``docker inspect`` of the name's job containers and the readable files of its instance's disk, as they
        were seen (the 0600 stage archive is the job's private channel)."""
        self._look(name)
        with self.lock:
            texts = [e["inspect"] for e in self.seen.values() if e["name"] == name]
        return texts + [f"{path}: {text}" for path, text in self.files.get(name, {}).items()]

    def leftovers(self, name: str, run_id: str, state: str, recorded: Mapping[str, Mapping[str, Any]]) -> list[str]:
        """One real sweep (``reap_resources``: instances whose task is finished or lease expired), then the task's
        own instance (its lease is a file on it) or a job container of the name that is still there."""
        from airflow_provider_tao.hooks.shared import container as ct

        self._sweep(run_id, state, recorded)
        left = [f"instance {i['name']} ({i['status']})" for i in self.world.instances()
                if i["name"] == name and i["status"] != "DELETING"]  # fmt: skip
        for summary in self.engine.client.containers(all=True, filters={"label": f"brevfake.world={self.world.tag}"}):
            if (summary.get("Labels") or {}).get(ct.LABEL_NAME) == name:
                left.append(f"job container {summary['Names'][0]} ({summary['State']})")
        return left

    def host_path(self, results_dir: str) -> Path:
        return self.kept / Path(results_dir).name
