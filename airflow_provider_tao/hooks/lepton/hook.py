"""The ``lepton`` platform: each job is one DGX Cloud Lepton batch job in a workspace, through ``leptonai``'s
``APIClient`` (imported on first use, never at DAG parse; in the triggerer only inside threads: its calls are blocking
``requests``).

Where things live (one module each; :class:`LeptonHook` is the platform, the classes it is made of are not):

* Requests: the client (one per thread), job lists by label query, user secrets, one way of reporting a refused
  token: :mod:`~airflow_provider_tao.hooks.lepton.api`.
* Placement: the resource shape (explicit, or fitted to ``gpu_count``), the node group by name or id, a shared volume
  (Lustre before filestore) mounted at the prefix its storage permissions grant, with ``TAO_RESULTS_ROOT`` and, on
  Lustre, the runner's S3 input cache on it: :mod:`~airflow_provider_tao.hooks.lepton.placement`.
* Files (the in-job runner, the rendered spec, this platform's ``setup.sh``): one gzip'd tar in secret-held
  environment variables, staged onto the shared volume by short staging jobs when larger than 1 MiB:
  :mod:`~airflow_provider_tao.hooks.lepton.files`.
* Status and logs: ONE job list per poll for every watched job of the workspace; the replicas' readiness of jobs
  still starting; logs by timestamp cursor: :mod:`~airflow_provider_tao.hooks.lepton.watch`, on the rule in
  :mod:`~airflow_provider_tao.hooks.lepton.status` (a job queueing past ``capacity_timeout_seconds`` (900) or starting
  past ``start_timeout_seconds`` (600) is an Error, ``ERR_CAPACITY`` / ``ERR_IMAGE_PULL`` / ``ERR_INFRA``, and is
  stopped and deleted by its cleanup).
* Ownership marks: labels of the job, patched and read back; user secrets ``tao.<job_id>.mark.<key>.<try>`` where
  the workspace keeps labels as created: :mod:`~airflow_provider_tao.hooks.lepton.marks`.
* Secrets no job will read (a worker that died between creating them and posting its job, a job that ended without
  its cleanup), deleted by ``airflow tao reap``: :mod:`~airflow_provider_tao.hooks.lepton.reap`.

Here: validation, submission, finding a task instance's job, cancel, failure facts and cleanup.

* Secrets (``secret_env``, the connection's NGC key and HF token): user secrets ``tao.<job_id>.env.<VAR>`` referenced
  with ``value_from.secret_name_ref``; the NGC key also becomes an image pull secret ``tao-<job_id>-pull``. Deleted
  with the job (cancel) or once its verdict is read (cleanup).
* Multi-node: ``completions = parallelism = num_nodes`` with ``intra_job_communication``; ``setup.sh`` (shipped with
  the files) turns Lepton's worker variables into the multi-node contract in every replica.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from airflow_provider_tao.accounting import JobUsage
from airflow_provider_tao.failures import FailureFacts, classify
from airflow_provider_tao.hooks.base import MARK_OWNER, JobSubmitError, JobValidationError
from airflow_provider_tao.hooks.lepton.api import pull_secret_name, secret_prefix, status_of
from airflow_provider_tao.hooks.lepton.files import FilesChannel, LeptonStagingHook, files_channel
from airflow_provider_tao.hooks.lepton.marks import LeptonMarksHook
from airflow_provider_tao.hooks.lepton.placement import LeptonPlacementHook, Placement
from airflow_provider_tao.hooks.lepton.reap import LeptonReapHook
from airflow_provider_tao.hooks.lepton.status import (
    DEFAULT_CAPACITY_TIMEOUT,
    DEFAULT_START_TIMEOUT,
    ENDING_STATES,
    FINISHED_STATES,
    LABEL_CAPACITY,
    LABEL_JOB_ID,
    LABEL_MANAGED,
    LABEL_NAME,
    LABEL_START,
    LABEL_TRY,
    MARK_LABELS,
    ORIGIN_LABELS,
    created_at,
    failure_facts_of,
    follow_server_verdict,
    id_of,
    labels_of,
    state_of,
    usage_of,
)
from airflow_provider_tao.hooks.lepton.watch import LeptonWatchHook
from airflow_provider_tao.hooks.shared import container as ct
from airflow_provider_tao.hooks.shared.env import multi_node_env
from airflow_provider_tao.hooks.shared.secrets import register_secrets
from airflow_provider_tao.jobs import ErrClass, FailureAnalysis, JobHandle, JobSpec, JobState, JobStatus

T = TypeVar("T")

#: Plain variable holding the job's results folder (how :meth:`LeptonHook.find_job` restores a handle).
RESULTS_DIR_ENV = "TAO_RESULTS_DIR"
DEFAULT_TTL_SECONDS = 24 * 3600
#: Waits between the attempts of a cancel that failed in a way that may pass.
CANCEL_RETRY_WAITS = (1.0, 2.0, 4.0)
#: ``backend_details`` keys this platform understands.
DETAIL_KEYS = frozenset(
    {
        "resource_shape",
        "dedicated_node_group",
        "mounts",
        "auto_mount",
        "shared_memory_size",
        "capacity_timeout_seconds",
        "start_timeout_seconds",
        "ttl_seconds_after_finished",
        "priority_class",
        "can_be_preempted",
    }
)


class LeptonHook(LeptonPlacementHook, LeptonStagingHook, LeptonMarksHook, LeptonWatchHook, LeptonReapHook):
    """Runs jobs on DGX Cloud Lepton through the ``leptonai`` client.

    Connection type ``tao_lepton``: password = the Lepton API token (``LEPTON_AUTH_TOKEN``, else the client's own
    ``LEPTON_WORKSPACE_TOKEN``). Extras: ``workspace_id`` (``LEPTON_WORKSPACE_ID``), ``workspace_url``
    (``LEPTON_WORKSPACE_URL``; default the DGX Cloud gateway of the workspace), ``node_group`` (default dedicated node
    group, name or id), ``resource_shape`` (default shape), ``image_pull_secret`` (an existing Lepton image pull
    secret), ``ngc_api_key`` (``NGC_KEY``: becomes a per-job image pull secret for ``registry``, default nvcr.io, and
    the job's ``NGC_KEY``), ``hf_token`` (``HF_TOKEN``), ``ttl_seconds_after_finished`` (default one day),
    ``capacity_timeout_seconds`` (900), ``start_timeout_seconds`` (600), ``staging_timeout_seconds`` (600).

    ``backend_details`` of a job: ``resource_shape``, ``dedicated_node_group``, ``mounts`` (a list of
    ``{"volume", "path", "mount_path"}``, checked against the volume's storage permissions; they replace the
    auto-detected mount), ``auto_mount`` (default true), ``shared_memory_size`` (MiB), ``capacity_timeout_seconds``,
    ``start_timeout_seconds``, ``ttl_seconds_after_finished``, ``priority_class``, ``can_be_preempted``.

    :param conn_id: the ``tao_lepton`` connection, or None for the environment's ``LEPTON_*`` variables.
    """

    platform = "lepton"
    conn_type = "tao_lepton"
    extra_modules = ("lepton", ("leptonai",))
    default_conn_name = "tao_lepton_default"
    hook_name = "TAO DGX Cloud Lepton"
    name_pattern = re.compile(r"^[a-z]([a-z0-9-]{0,34}[a-z0-9])?$")
    name_rule = "lower-case letters, digits and '-', starting with a letter, at most 36 characters (Lepton's rule)"
    name_max_length = 36
    name_letter_first = True
    supports_multi_node = True
    marks_storage = (
        "labels of the Lepton job (PATCH, read back); where the workspace does not let labels change, user secrets "
        "named tao.<job_id>.mark.<key>.<try>"
    )
    env_fallbacks = {
        "workspace_id": "LEPTON_WORKSPACE_ID",
        "password": "LEPTON_AUTH_TOKEN",
        "workspace_url": "LEPTON_WORKSPACE_URL",
        "ngc_api_key": "NGC_KEY",
        "hf_token": "HF_TOKEN",
    }

    def __init__(self, conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(conn_id, **kwargs)
        self._channels: dict[str, FilesChannel] = {}

    def _number(self, details: dict[str, Any], key: str, default: float) -> float:
        self.load_connection()
        value = details.get(key)
        return float(value if value is not None else self.setting(key, default))

    # ----------------------------------------------------------------- validation (before submission)

    def validate_spec(self, spec: JobSpec) -> None:
        """Everything is checked before anything is created: the details, the placement (shape, node group, mounts,
        storage permissions: API reads), and that the job's files and environment fit."""
        super().validate_spec(spec)
        details = self.platform_details(spec)
        if unknown := sorted(set(details) - DETAIL_KEYS):
            raise JobValidationError(
                f"backend_details[{unknown[0]!r}]",
                "is not a lepton platform setting",
                f"Use one of: {', '.join(sorted(DETAIL_KEYS))}",
            )
        for key in ("capacity_timeout_seconds", "start_timeout_seconds", "ttl_seconds_after_finished"):
            if key in details and not (isinstance(details[key], int | float) and details[key] > 0):
                raise JobValidationError(
                    f"backend_details[{key!r}]", f"{details[key]!r} is not a positive number", "Give seconds, e.g. 900"
                )
        if "shared_memory_size" in details and not (
            isinstance(details["shared_memory_size"], int) and details["shared_memory_size"] > 0
        ):
            raise JobValidationError(
                "backend_details['shared_memory_size']", "is not a positive integer", "Give MiB, e.g. 16384"
            )
        if spec.results_uri and not spec.results_uri.startswith("s3://"):
            placement = self.placement(spec)
            if not any(spec.results_uri.startswith(m["mount_path"]) for m in placement.mounts):
                raise JobValidationError(
                    "results_uri",
                    f"{spec.results_uri!r} is neither s3:// nor on a volume mounted into the job",
                    "Use s3:// with storage_conn_id, or a path under one of the job's mounts",
                )
        self._channel(spec)

    def list_path(self, uri: str) -> list[str]:
        raise JobValidationError("uri", f"{uri} is inside the Lepton workspace", "Read results from s3:// instead")

    def _hook_secrets(self) -> dict[str, str]:
        """The connection's keys the job receives as secrets (``NGC_KEY``, ``HF_TOKEN``)."""
        self.load_connection()
        found = {"NGC_KEY": self.setting("ngc_api_key"), "HF_TOKEN": self.setting("hf_token")}
        return {k: str(v) for k, v in found.items() if v}

    def _channel(self, spec: JobSpec) -> FilesChannel:
        """How the job's files reach it, and that everything fits into the environment Linux gives a process
        (:func:`~airflow_provider_tao.hooks.lepton.files.files_channel`, once per submission)."""
        cached = self._channels.get(spec.job_id)
        if cached is None:
            placement = self.placement(spec)
            cached = self._channels[spec.job_id] = files_channel(
                spec, placement, {**spec.secret_env, **self._hook_secrets()}
            )
        return cached

    # ----------------------------------------------------------------- submit

    def create_job(self, spec: JobSpec, try_number: int = 1) -> JobHandle:
        """Create the job's secrets (and stage large files), then the job. An ended job of the same name (an
        earlier try's) is deleted first; one still active is returned as it is (never a second job)."""
        self.validate_spec(spec)
        placement, channel = self.placement(spec), self._channel(spec)
        handle = self.new_handle(spec, try_number)
        for job in self._jobs_named(spec.name):
            if state_of(job) in ENDING_STATES:
                # on its way out, not running: the new job waits for its id (409 while it is deleted)
                self.log.info("Lepton job %s of an earlier try is being deleted: submitting anew", id_of(job))
                continue
            if state_of(job) not in FINISHED_STATES:
                self.log.info("Lepton job %s already runs for this task instance: watching it", spec.name)
                return self._handle_of(job)
            self.log.info("Deleting the ended Lepton job %s of an earlier try before submitting", id_of(job))
            self._delete_job(id_of(job), labels_of(job).get(LABEL_JOB_ID))
        if self._labels_patchable() is False:
            self._sweep_orphan_marks()
        secrets = {**spec.secret_env, **self._hook_secrets()}
        register_secrets(list(secrets.values()))
        refs = _secret_refs(spec.job_id, secrets, channel)
        created: list[str] = []
        pull = pull_secret_name(spec.job_id) if self.setting("ngc_api_key") else None
        try:
            if channel.route == "volume":
                self._stage(spec, placement, channel)
            if refs:
                values = {**secrets, **channel.env}
                self._create_secrets({name: values[var] for var, name in refs.items()})
                created += list(refs.values())
            if pull:
                self._create_pull_secret(pull)
            body = self._job_body(spec, handle, placement=placement, channel=channel, refs=refs, pull=pull)
            backend_id = self._post_job(body, spec)
        except BaseException:
            self._delete_secrets(spec.job_id, created, pull_secret=pull is not None)
            raise
        return replace(handle, backend_job_id=backend_id, console_url=self._console_url(backend_id))

    def _post_job(self, body: Any, spec: JobSpec) -> str:
        """POST the job; its id as the server gave it. An answer lost to a 5xx or a timeout may hide a job that was
        created: it is looked for by name before the submission is reported as failed."""
        name = spec.name
        for _ in range(30):
            try:
                return str(self._api("creating the job", lambda c: c.job.create(body)).metadata.id_)
            except JobValidationError:
                raise
            except ValueError as exc:  # the client's own validation
                raise JobValidationError("job_name", str(exc), "Fix the name or the environment") from exc
            except Exception as exc:
                status = status_of(exc)
                if status == 409:  # the old job of this name is still being deleted
                    time.sleep(2)
                    continue
                if status is not None and status < 500:
                    kind = ErrClass.ERR_CONFIG if status in (400, 404, 422) else ErrClass.ERR_INFRA
                    raise JobSubmitError(kind, f"Lepton refused job {name}: {exc}") from exc
                found = [j for j in self._jobs_named(name) if labels_of(j).get(LABEL_JOB_ID) == spec.job_id]
                if found:
                    return id_of(found[0])
                raise JobSubmitError(ErrClass.ERR_INFRA, f"Lepton did not create job {name}: {exc}") from exc
        raise JobSubmitError(ErrClass.ERR_INFRA, f"Lepton job {name} could not be created: its old job did not go away")

    def _job_body(
        self,
        spec: JobSpec,
        handle: JobHandle,
        *,
        placement: Placement,
        channel: FilesChannel,
        refs: dict[str, str],
        pull: str | None,
    ) -> Any:
        """The ``LeptonJob``: plain variables by value, secret ones (and the files) by ``secret_name_ref``."""
        from leptonai.api.v2.types.common import LeptonVisibility, Metadata
        from leptonai.api.v2.types.deployment import EnvValue, EnvVar, LeptonContainer, LeptonLog
        from leptonai.api.v2.types.job import LeptonJob, LeptonJobUserSpec

        assert spec.image is not None, "image_required() makes the operator demand one"
        details = self.platform_details(spec)
        env = self.tao_env(spec, files_dir=ct.FILES_DIR, results_root=placement.results_root)
        env[RESULTS_DIR_ENV] = handle.results_dir
        if spec.num_nodes > 1:
            gpus = spec.gpu_count if spec.gpu_count > 0 else placement.gpus_per_node
            env.update(multi_node_env(spec.num_nodes, gpus))
        envs = [EnvVar(name=k, value=v) for k, v in env.items()]
        envs += [EnvVar(name=k, value=v) for k, v in channel.env.items() if not k.startswith(ct.PARTS_ENV_PREFIX)]
        envs += [EnvVar(name=k, value_from=EnvValue(secret_name_ref=ref)) for k, ref in refs.items()]
        labels = {
            LABEL_MANAGED: "true",
            LABEL_JOB_ID: spec.job_id,
            LABEL_NAME: spec.name,
            LABEL_TRY: str(handle.try_number),
            MARK_LABELS[MARK_OWNER]: str(handle.try_number),
            LABEL_CAPACITY: str(int(self._number(details, "capacity_timeout_seconds", DEFAULT_CAPACITY_TIMEOUT))),
            LABEL_START: str(int(self._number(details, "start_timeout_seconds", DEFAULT_START_TIMEOUT))),
        }
        labels |= {ORIGIN_LABELS[k]: ct.label_value(v) for k, v in spec.origin.items() if k in ORIGIN_LABELS}
        shm = details.get("shared_memory_size") or self.setting("shared_memory_size")
        if shm is None and placement.memory_mb:
            shm = min(16 * 1024, placement.memory_mb // 2)  # PyTorch data loaders die on Docker's 64 MiB default
        pulls = [str(s) for s in (self.setting("image_pull_secret"), pull) if s]
        return LeptonJob(
            metadata=Metadata(id=spec.name, name=spec.name, labels=labels, visibility=LeptonVisibility.PRIVATE),
            spec=LeptonJobUserSpec(
                **placement.spec_fields(),
                container=LeptonContainer(image=spec.image, command=ct.launcher_argv(spec.command)),
                shared_memory_size=int(shm) if shm else None,
                completions=spec.num_nodes,
                parallelism=spec.num_nodes,
                # Airflow owns retries: a replica restarted by Lepton would leave its peers' rendezvous behind.
                max_failure_retry=0,
                max_job_failure_retry=0,
                envs=envs,
                image_pull_secrets=pulls,
                ttl_seconds_after_finished=int(
                    self._number(details, "ttl_seconds_after_finished", DEFAULT_TTL_SECONDS)
                ),
                intra_job_communication=True if spec.num_nodes > 1 else None,
                log=LeptonLog(enable_collection=True),
            ),
        )

    # ----------------------------------------------------------------- find

    def _jobs_named(self, name: str) -> list[dict[str, Any]]:
        """This task instance's jobs (alive), newest first."""
        jobs = [
            j
            for j in self._list_jobs(f"{LABEL_MANAGED}=true,{LABEL_NAME}={name}")
            if labels_of(j).get(LABEL_NAME) == name and labels_of(j).get(LABEL_JOB_ID)
        ]
        return sorted(jobs, key=lambda j: created_at(j) or 0, reverse=True)

    def _handle_of(self, job: dict[str, Any]) -> JobHandle:
        labels = labels_of(job)
        env = {e.get("name"): e.get("value") for e in (job.get("spec") or {}).get("envs") or []}
        return JobHandle(
            platform=self.platform,
            conn_id=self.conn_id,
            job_id=labels[LABEL_JOB_ID],
            name=labels[LABEL_NAME],
            backend_job_id=id_of(job),
            results_dir=str(env.get(RESULTS_DIR_ENV) or ""),
            try_number=int(labels.get(LABEL_TRY) or 1),
            submitted_at=created_at(job) or time.time(),
            console_url=self._console_url(id_of(job)),
        )

    def find_job(self, name: str) -> JobHandle | None:
        """This task instance's newest job (found by its name label, whatever id the server gave it). The secrets
        of its jobs that have ended are removed on the way (a try that died before its cleanup left them)."""
        self._ready()
        jobs = self._jobs_named(name)
        ended = [labels_of(j)[LABEL_JOB_ID] for j in jobs if state_of(j) in FINISHED_STATES]
        if ended:
            existing = self._secret_names()
            for job_id in ended:
                self._delete_secrets(job_id, [n for n in existing if n.startswith(secret_prefix(job_id))])
        jobs = [j for j in jobs if state_of(j) not in ENDING_STATES]  # being deleted: no try's job any more
        return self._handle_of(jobs[0]) if jobs else None

    # ----------------------------------------------------------------- where the job is, what runs (UI, CLI)

    def job_url(self, handle: JobHandle) -> str:
        """The job's page in the Lepton dashboard (built from the workspace URL: no API call)."""
        return super().job_url(handle) or (self._console_url(handle.backend_job_id) if handle.backend_job_id else "")

    def job_location(self, handle: JobHandle) -> dict[str, str]:
        job = handle.backend_job_id or handle.name
        return {"Workspace": self.workspace_id, "Lepton job": job, "Log": f"lep job log --id {job}"}

    def list_active_jobs(self) -> list[JobHandle]:
        """This provider's jobs of the workspace that have not ended and are not being deleted (one labelled job
        list, as a poll)."""
        self._ready()
        return [
            self._handle_of(job)
            for job in self._list_jobs(f"{LABEL_MANAGED}=true")
            if labels_of(job).get(LABEL_JOB_ID)
            and labels_of(job).get(LABEL_NAME)
            and state_of(job) not in FINISHED_STATES | ENDING_STATES
        ]

    # ----------------------------------------------------------------- cancel, failure analysis, cleanup

    def _delete_job(self, backend_id: str, job_id: str | None) -> None:
        """Stop (SIGTERM to the replicas), then delete; the job's secrets go with it. Idempotent."""
        self._stop_and_delete(backend_id)
        if job_id:
            self._delete_secrets(job_id, None, pull_secret=True, marks=True)

    def _cancel(self, handle: JobHandle) -> bool:
        """Stop and delete the job, again after a failure that may pass (a 5xx, a 429, no answer): 1, 2 then 4 s
        apart, so a blip of the API does not leave a job running whose task is gone."""
        self._ready()
        for wait in CANCEL_RETRY_WAITS:
            try:
                self._delete_own_job(handle)
                return True
            except JobValidationError:
                raise
            except Exception as exc:
                status = status_of(exc)
                if status is not None and status < 500 and status != 429:
                    raise
                self.log.warning("Canceling Lepton job %s failed (%s): again in %.0f s", handle.job_id, exc, wait)
                time.sleep(wait)
        self._delete_own_job(handle)
        return True

    def _delete_own_job(self, handle: JobHandle) -> None:
        """Delete the handle's job -- never a newer job that holds its id now (where the workspace makes the id
        from the name, a retry's job of the same task instance: a cancel of the ended old job must not stop it);
        the handle's secrets go either way."""
        job = self._own_job(handle) if handle.backend_job_id else None
        if job is None and handle.backend_job_id:
            self.log.info("Lepton job %s (%s) is gone already: nothing to stop", handle.job_id, handle.backend_job_id)
            self._delete_secrets(handle.job_id, None, pull_secret=True, marks=True)
            return
        self._delete_job(id_of(job) if job is not None else handle.name, handle.job_id)

    async def _acancel(self, handle: JobHandle) -> bool:
        await self._aready()
        return await asyncio.to_thread(self._cancel, handle)

    def failure_facts(self, handle: JobHandle) -> FailureFacts:
        """The job's status, its replicas (readiness, terminations), its events and the server's failure analysis
        (where the workspace has that route), and the log tail of the replica that failed."""
        job = self._get_job(handle.backend_job_id) if handle.backend_job_id else None
        status = self._status_of(handle.job_id, job, time.time()) if job else JobStatus.missing("the job is gone")
        replicas: list[dict[str, Any]] = self._optional(lambda: self.get_job_replicas(handle), [])
        events: list[dict[str, Any]] = self._optional(
            lambda: self._raw("reading events", "get", f"/jobs/{handle.backend_job_id}/events"), []
        )
        analysis: dict[str, Any] = self._optional(
            lambda: self._raw("reading the failure analysis", "get", f"/jobs/{handle.backend_job_id}/failure-analysis"),
            {},
        )
        tail: list[str] = self._optional(lambda: _lines(self.get_job_logs(handle, tail=200)), [])
        return failure_facts_of(
            status,
            replicas=replicas,
            events=events or [],
            analysis=analysis or {},
            log_tail=tail,
            job=handle.backend_job_id,
            workspace=self.setting("workspace_id"),
        )

    def get_failure_analysis(self, handle: JobHandle) -> FailureAnalysis | None:
        """The taxonomy's class of the facts, then Lepton's own verdict where the server gives one
        (:func:`~airflow_provider_tao.hooks.lepton.status.follow_server_verdict`)."""
        status = self.get_job_status(handle)
        if status.state not in (JobState.ERROR, JobState.CANCELED):
            return None
        facts = self.failure_facts(handle)
        return follow_server_verdict(classify(facts), facts)

    def get_job_usage(self, handle: JobHandle) -> JobUsage:
        """From the job (creation, completion), its replicas (terminations) and its resource shape (GPUs, model)."""
        self._ready()
        job = self._own_job(handle)
        if job is None:
            return super().get_job_usage(handle)
        spec = job.get("spec") or {}
        groups = (spec.get("affinity") or {}).get("allowed_dedicated_node_groups") or []
        wanted = spec.get("resource_shape")
        shapes: list[dict[str, Any]] = self._optional(
            lambda: self._group_shapes(groups[0] if groups else None, known=False), []
        )
        shape = next((s for s in shapes if wanted in (s["id"], s["name"])), None)
        return usage_of(job, self._optional(lambda: self.get_job_replicas(handle), []), shape)

    def _optional(self, read: Callable[[], T], default: T) -> T:
        """A fact that may be missing (a route this workspace lacks, a job already gone): the default then."""
        try:
            return read()
        except JobValidationError:
            raise
        except Exception as exc:
            self.log.info("A failure fact was not available: %s", exc)
            return default

    def cleanup_job(self, handle: JobHandle, *, adoptable: bool = False) -> None:
        """Once the verdict is read: a job given up on while Lepton still holds it (no capacity, replicas that never
        became ready) is stopped and deleted with all its secrets; an ended job keeps its marks (and stays until its
        TTL), its other secrets are deleted."""
        try:
            self._ready()
            job = self._own_job(handle)
            if (
                job is not None
                and state_of(job) not in FINISHED_STATES
                and self._status_of(handle.job_id, job, time.time()).state.is_terminal
            ):
                self.log.info("Deleting Lepton job %s: it was given up on (%s)", id_of(job), handle.job_id)
                self._delete_job(id_of(job), handle.job_id)
                return
            self._delete_secrets(handle.job_id, None, pull_secret=True)
        except Exception as exc:  # best effort
            self.log.warning("Cleaning up Lepton job %s failed: %s", handle.backend_job_id, exc)


def _secret_refs(job_id: str, secrets: dict[str, str], channel: FilesChannel) -> dict[str, str]:
    """``{variable: user secret}`` of the job's variables held in secrets: its secret ones, then its files."""
    refs = {k: f"{secret_prefix(job_id)}env.{k}" for k in secrets}
    refs |= {k: f"{secret_prefix(job_id)}files.{k}" for k in channel.env if k.startswith(ct.PARTS_ENV_PREFIX)}
    return refs


def _lines(log: tuple[str, str]) -> list[str]:
    return log[0].splitlines()
