"""The instance a job runs on: a reused one (started if stopped, never deleted) or the task's own, created with the type
chain and its lease, waited for until it answers, deleted when the job ends."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_tao import settings
from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.hooks.brev import lease as leases
from airflow_provider_tao.hooks.brev import remote
from airflow_provider_tao.hooks.brev.cli import BrevError
from airflow_provider_tao.hooks.brev.session import CALL_TIMEOUT, PROBE_TIMEOUT, BrevSessionHook
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobSpec

#: The lease of an instance when neither the job, the connection nor ``[tao] lease_hours`` gives one.
DEFAULT_LEASE_HOURS = 8.0
#: An instance has this long to reach RUNNING after ``brev create`` (GPU instances boot in 2-5 min, some slower).
DEFAULT_BOOT_TIMEOUT = 20 * 60.0
#: Then ``brev exec`` has this long to answer (sshd, name resolution and the user's shell come up after RUNNING).
READY_TIMEOUT = 5 * 60.0
_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")


class BrevInstancesHook(BrevSessionHook):
    """Finds, creates, waits for and deletes the instances jobs run on."""

    def _types(self, details: Mapping[str, Any]) -> list[str]:
        """The instance-type fallback chain: the job's, else the connection's (empty: the CLI's own choice)."""
        self.load_connection()
        where = "backend_details['instance_type']" if "instance_type" in details else "instance_type"
        chain = details.get("instance_type", self.setting("instance_type", ""))
        types = [t.strip() for t in chain.split(",")] if isinstance(chain, str) else chain
        if not isinstance(types, list) or not all(isinstance(t, str) and _TYPE.match(t.strip()) for t in types if t):
            raise JobValidationError(
                where, f"{chain!r} is not a chain of instance types", 'Use e.g. "g5.xlarge,g6.xlarge" (`brev search`)'
            )
        return [t.strip() for t in types if t and t.strip()]

    def _lease_hours(self, details: Mapping[str, Any]) -> float:
        """The job's ``lease_hours``, else the connection's, else ``[tao] lease_hours``, else 8: an instance this
        provider rents always has a lease (``[tao] lease_hours = 0``, "no lease", does not apply to machines)."""
        value = details.get("lease_hours", self._number("lease_hours", settings.lease_hours() or DEFAULT_LEASE_HOURS))
        try:
            hours = float(value)
        except (TypeError, ValueError):
            hours = 0.0
        if hours <= 0:
            raise JobValidationError(
                "lease_hours", f"{value!r} is not a positive number of hours", "Use e.g. 8 (longer than the job)"
            )
        return hours

    def _reused_instance(
        self, wanted: str, instances: Mapping[str, Mapping[str, Any]]
    ) -> tuple[str, Mapping[str, Any]]:
        """The existing instance a job asked for (by name or id), running and answering: its name and ``brev ls``
        entry."""
        entry = instances.get(wanted) or next((e for e in instances.values() if e.get("id") == wanted), None)
        if entry is None:
            raise BrevError(
                ErrClass.ERR_CONFIG,
                f"backend_details['instance_id']: there is no instance {wanted!r} "
                f"(brev ls shows: {', '.join(sorted(instances)) or 'none'}); create it or fix the name. brev ls "
                "lists only the instances of the connection's user (and those shared with it): a teammate's "
                "instance is not there unless the connection holds an API key (bak-...) of the org",
            )
        name = str(entry["name"])
        status = str(entry.get("status"))
        if status == "RUNNING":
            return name, entry
        if status == "STOPPING":  # `brev start` refuses all but STOPPED (startStopppedWorkspace)
            self.log.info("Instance %s is STOPPING: waiting for STOPPED to start it", name)
            status = self._wait_stopped(name)
        if status == "STOPPED":
            self.log.info("Instance %s is %s: starting it", name, status)
            self.session.check(["start", name, "--detached"], CALL_TIMEOUT, f"starting instance {name}")
        elif status not in ("STARTING", "DEPLOYING", "RUNNING"):  # RUNNING: started by someone while it stopped
            raise BrevError(ErrClass.ERR_INFRA, f"instance {name} is {status}: it cannot run a job (brev ls)")
        return name, self._wait_ready(name, None)

    def _own_instance(
        self, spec: JobSpec, types: Sequence[str], lease: Mapping[str, Any], instances: Mapping[str, Mapping[str, Any]]
    ) -> None:
        """The task's own instance, named after the task instance: found (an earlier try made it) or created with
        the type chain. Returns once it exists; a refused creation leaves nothing behind and raises."""
        name = spec.name
        entry = instances.get(name)
        if entry is not None and entry.get("status") in ("FAILURE", "DELETING"):
            self.log.info("Instance %s of an earlier try is %s: replacing it", name, entry.get("status"))
            if entry.get("status") == "FAILURE":
                self.session.delete(name)
            self._wait_gone(name)
            entry = None
        if entry is not None:
            self.log.info("Instance %s of an earlier try exists (%s): using it", name, entry.get("status"))
            return
        self.log.info(
            "Creating instance %s (types %s; lease %s h)", name, ",".join(types) or "auto", lease["lease_hours"]
        )
        try:
            skipped = self.session.create(name, types, remote.startup_script(lease))
            for line in skipped:
                self.log.warning("brev create: %s (instance type chain %s)", line, ",".join(types))
        except BrevError as exc:
            # A lost answer (the API made it, the CLI saw an error) or another submission of this task instance
            # that made it just now: the instance is there, and it is this task's.
            if exc.err_class in (ErrClass.ERR_CONFIG, ErrClass.ERR_CAPACITY) or name not in self.session.instances():
                raise
            self.log.warning("brev create failed (%s), yet instance %s exists: using it", exc, name)

    def _lease(self, spec: JobSpec, details: Mapping[str, Any], try_number: int) -> dict[str, Any]:
        return leases.new_lease(spec, self._lease_hours(details), self.conn_id, try_number)

    def _wait_stopped(self, name: str) -> str:
        """``brev ls --json`` until a STOPPING instance has left STOPPING (``boot_timeout_seconds``); its status."""
        deadline = time.monotonic() + self._number("boot_timeout_seconds", DEFAULT_BOOT_TIMEOUT)
        delay = 1.0
        while (status := str((self.session.instances().get(name) or {}).get("status"))) == "STOPPING":
            if time.monotonic() > deadline:
                raise BrevError(ErrClass.ERR_INFRA, f"instance {name} is still STOPPING (boot_timeout_seconds)")
            time.sleep(delay)
            delay = min(delay * 1.5, 10.0)
        return status

    def _wait_gone(self, name: str) -> None:
        deadline = time.monotonic() + DEFAULT_BOOT_TIMEOUT
        delay = 1.0
        while name in self.session.instances():
            if time.monotonic() > deadline:
                raise BrevError(
                    ErrClass.ERR_INFRA, f"instance {name} is still there {DEFAULT_BOOT_TIMEOUT:.0f} s after its delete"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 10.0)

    def _wait_ready(self, name: str, lease: Mapping[str, Any] | None) -> dict[str, Any]:
        """``brev ls --json`` until the instance is RUNNING (``boot_timeout_seconds``), then a trivial exec until it
        answers (5 minutes): a fresh instance reports RUNNING before sshd and its shell are up. Returns its
        ``brev ls`` entry."""
        boot_timeout = self._number("boot_timeout_seconds", DEFAULT_BOOT_TIMEOUT)
        deadline = time.monotonic() + boot_timeout
        delay, missing = 1.0, 0
        while True:
            entry = self.session.instances().get(name)
            status = str((entry or {}).get("status"))
            missing = missing + 1 if entry is None else 0
            if missing >= 2:  # one answer without it is not yet "gone"
                raise BrevError(ErrClass.ERR_INFRA, f"instance {name} disappeared while it was starting")
            if entry is not None and status == "RUNNING":
                running = dict(entry)
                break
            if status in ("FAILURE", "DELETING", "STOPPED"):
                raise BrevError(ErrClass.ERR_INFRA, f"instance {name} is {status} instead of starting (brev ls)")
            if time.monotonic() > deadline:
                raise BrevError(
                    ErrClass.ERR_CAPACITY,
                    f"instance {name} is still {status} after {boot_timeout:.0f} s (boot_timeout_seconds); the type "
                    "may be short of capacity: retry later or add types to the chain",
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 10.0)
        call = remote.prepare(lease)
        deadline = time.monotonic() + READY_TIMEOUT
        delay = 1.0
        while True:
            result = self.session.exec(name, call.command, PROBE_TIMEOUT)
            answer = call.answer(result)
            if answer is not None:
                break
            if time.monotonic() > deadline:
                raise BrevError(
                    ErrClass.ERR_INFRA,
                    f"instance {name} is RUNNING but brev exec did not answer for {READY_TIMEOUT:.0f} s: "
                    f"{result.describe()}",
                    result,
                )
            self.log.info("Instance %s does not answer brev exec yet (%s); trying again", name, result.describe())
            time.sleep(delay)
            delay = min(delay * 1.5, 10.0)
        said = answer.decode(errors="replace").strip()
        if not said.startswith("DOCKER "):
            raise BrevError(
                ErrClass.ERR_CONFIG,
                f"instance {name} has no usable Docker ({said}): use an instance in VM mode (Docker and the NVIDIA "
                "Container Toolkit are preinstalled there)",
            )
        return running

    @staticmethod
    def _ephemeral(handle: JobHandle) -> bool:
        """The task's own instance is named after the task instance, as the job is (validation keeps a reused
        instance from having that name)."""
        return handle.backend_job_id == handle.name

    def _delete_instance(self, name: str, why: str) -> None:
        try:
            if self.session.delete(name):
                self.log.info("Deleted instance %s: %s", name, why)
        except BrevError as exc:
            self.log.warning("Could not delete instance %s (%s): %s; the reaper will", name, why, exc)
