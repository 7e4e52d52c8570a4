"""The ``slurm`` platform: jobs staged on a cluster's shared filesystem and submitted with ``sbatch`` over SSH.

Connection type ``tao_slurm``: host = login host(s), comma-separated for failover in order; port; login; password
(optional); extras ``key_file`` | ``private_key`` (+ ``private_key_passphrase``), ``host_key`` (checked by default;
``no_host_key_check: true`` is the explicit opt-out), ``partition``, ``account``, ``results_root``,
``container_runtime`` (``pyxis`` | ``oci`` | ``none``), ``time_hours`` (4), ``timeout_hours`` (time - 0.2 h),
``max_time_hours`` (4), ``gpus_per_node`` (8), ``cpus_per_task`` (16), ``max_resubmits`` (3), ``oci_bundle``,
``container_mounts`` (``/lustre``), ``use_sqsh`` (true), ``sqsh_cache_dir``, ``force_reconvert_latest`` (false).
Environment fallbacks: SLURM_USER, SLURM_HOSTNAME, SLURM_PARTITION, SLURM_ACCOUNT, SLURM_BASE_RESULTS_DIR,
SSH_KEY_PATH.

``backend_details`` (per job): ``partition``, ``account``, ``time_hours`` | ``time_minutes``, ``timeout_hours``,
``cpus_per_task``, ``gpus_per_node``, ``container_runtime``, ``oci_bundle``, ``container_mounts``, ``nodelist``,
``exclude``, ``qos``, ``constraint``, ``reservation``, ``mem``, ``master_port``, ``max_resubmits``, ``use_sqsh``,
``force_reconvert_latest``, ``inputs`` (cluster paths checked with ``test -e`` before submission).

Cost: a submission is ONE SSH connection (paramiko through the ssh provider's ``SSHHook``, TCP_NODELAY) and two
commands -- preflight, then stage + sbatch -- plus the operator's find-by-name. In the triggerer, every job of a
connection shares ONE cached asyncssh connection; each poll interval costs one command (``squeue`` for every
watched job, plus the new log bytes of the jobs that may be writing) and, only when jobs left the queue or failed,
one ``sacct``. The file layout and every script are in :mod:`~airflow_provider_tao.hooks.slurm.script`.

The hook is made of parts, one module each: the connection's settings and SSH sessions
(:mod:`~airflow_provider_tao.hooks.slurm.connection`), the validation and sbatch plan of a job
(:mod:`~airflow_provider_tao.hooks.slurm.plan`) and the sweep of env files
(:mod:`~airflow_provider_tao.hooks.slurm.reap`); this module joins them and adds submission, status, logs, cancel,
resubmission and marks.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from collections.abc import Sequence
from typing import Any

from airflow_provider_tao.accounting import JobUsage
from airflow_provider_tao.failures import FailureFacts, classify
from airflow_provider_tao.hooks.base import ConnectionProblem, JobValidationError
from airflow_provider_tao.hooks.shared.env import multi_node_env, render_env_file
from airflow_provider_tao.hooks.shared.results import RESULT_FILE_LIMIT, remote_read_command, remote_read_result
from airflow_provider_tao.hooks.slurm import commands as scmd
from airflow_provider_tao.hooks.slurm import logs as slog
from airflow_provider_tao.hooks.slurm import script as ss
from airflow_provider_tao.hooks.slurm import status as sst
from airflow_provider_tao.hooks.slurm.connection import ssh_problem
from airflow_provider_tao.hooks.slurm.reap import SlurmReapHook
from airflow_provider_tao.hooks.slurm.ssh import Result, SlurmTransportError
from airflow_provider_tao.jobs import ErrClass, JobHandle, JobSpec, JobState, JobStatus

#: How long a job squeue shows as failed may wait for its accounting record (exit code) before being reported.
ACCOUNTING_GRACE_SECONDS = 20.0
RESUBMITTABLE = frozenset({ErrClass.ERR_INFRA, ErrClass.ERR_PREEMPTED})


class SlurmHook(SlurmReapHook):
    """Submits, watches and cancels jobs on a SLURM cluster through its login node(s).

    :param conn_id: a ``tao_slurm`` connection, or None to use the environment variables only.
    """

    platform = "slurm"
    conn_type = "tao_slurm"
    extra_modules = ("slurm", ("airflow.providers.ssh", "paramiko", "asyncssh"))
    default_conn_name = "tao_slurm_default"
    hook_name = "TAO SLURM"
    supports_multi_node = True
    name_pattern = ss.NAME_PATTERN
    name_rule = ss.NAME_RULE
    name_max_length = 128
    marks_storage = "small files in the job's folder on the shared filesystem (marks/)"
    log_reads_batched = True  # the poll's one command reads every watched job's new log bytes
    env_fallbacks = {
        "login": "SLURM_USER",
        "host": "SLURM_HOSTNAME",
        "partition": "SLURM_PARTITION",
        "account": "SLURM_ACCOUNT",
        "results_root": "SLURM_BASE_RESULTS_DIR",
        "key_file": "SSH_KEY_PATH",
    }

    # ----------------------------------------------------------------- settings

    # ----------------------------------------------------------------- transport

    def probe_connection(self) -> str:
        """SSH to a login node with the connection's credentials and list its partitions (``sinfo``)."""
        try:
            result = self.run("sinfo -h -o %P", timeout=30)
        except SlurmTransportError as exc:
            raise ssh_problem(exc) from exc
        if result.rc != 0:
            raise ConnectionProblem(
                "not_found", f"connected, but sinfo failed ({result.err_text or result.rc}): is Slurm on the PATH?"
            )
        session = self.session()
        partitions = result.text.split()
        wanted = [p.strip() for p in str(self.setting("partition", "")).split(",") if p.strip()]
        missing = [p for p in wanted if p not in {name.rstrip("*") for name in partitions}]
        if missing:
            raise ConnectionProblem(
                "not_found", f"partition(s) {', '.join(missing)} do not exist on {session.host}; it has {partitions}"
            )
        return f"Connected to {session.host} as {session.settings.username}; partitions: {', '.join(partitions)}"

    def job_location(self, handle: JobHandle) -> dict[str, str]:
        layout = self.layout(handle.job_id, handle.name)
        return {
            "Slurm job": handle.backend_job_id,
            "Cluster": str(self.setting("host", "")).split(",")[0].strip(),
            "Log file": layout.out_file,
        }

    def read_result_file(self, handle: JobHandle, name: str, limit: int = RESULT_FILE_LIMIT) -> bytes | None:
        """A file of the results folder, read on the cluster with the checks of
        :func:`~airflow_provider_tao.hooks.shared.results.read_local_result` (no link, a regular file, bounded)."""
        if not handle.results_dir.startswith("/"):
            return None
        result = self.run(remote_read_command(handle.results_dir, name, limit), timeout=60)
        return remote_read_result(result.rc, result.out, f"{handle.results_dir.rstrip('/')}/{name}", limit)

    def list_active_jobs(self) -> list[JobHandle]:
        """This user's queued or running Slurm jobs that carry this provider's comment (one ``squeue``)."""
        found = []
        for slurm_id, meta in scmd.parse_active_jobs(
            self.run(scmd.active_jobs_command(self.results_root), timeout=60).text
        ):
            handle = JobHandle.from_json(meta)
            found.append(JobHandle(**{**handle.to_json(), "backend_job_id": slurm_id}))
        return found

    # ----------------------------------------------------------------- validation (before submission)

    # ----------------------------------------------------------------- submit

    def create_job(self, spec: JobSpec, try_number: int = 1) -> JobHandle:
        self.validate_spec(spec)
        plan = self.plan(spec)
        layout = self.layout(spec.job_id, spec.name)
        root, results_dir = self.results_root_for(spec), self.results_dir_for(spec)
        on_cluster = not results_dir.startswith("s3://")
        # The standard TAO variables; an explicit results_uri is the runner's TAO_RESULTS_URI (the final folder).
        env = self.tao_env(spec, files_dir=layout.files_dir, results_root=root if on_cluster else None)
        if spec.results_uri:
            env["TAO_RESULTS_URI"] = results_dir
        if plan.nodes > 1:  # NODE_RANK and MASTER_ADDR are only known inside the allocation (launch.sh)
            env |= multi_node_env(plan.nodes, plan.gpus_per_node, master_port=plan.master_port)
        env |= spec.secret_env  # only ever written to the 0600 env file
        handle = self.new_handle(spec, try_number)
        rel: dict[str, str | bytes] = {
            f"specs/{spec.job_id}.json": json.dumps(spec.to_json(), indent=1, default=str),
            f"env/{spec.job_id}.env": render_env_file(env),
            f"meta/{spec.job_id}.json": json.dumps(handle.to_json()),
            "meta/max_resubmits": str(int(self._detail(spec, "max_resubmits", 3))),
            f"sbatch/job_{spec.job_id}.sbatch": ss.render_sbatch(layout, plan, spec.name),
            "launch.sh": ss.render_launcher(layout, plan.nodes > 1),
            **ss.render_command(spec.command),
            **{f"files/{name}": text for name, text in spec.files.items()},
        }
        try:
            archive = ss.stage_archive(rel)
        except ValueError as exc:
            raise JobValidationError("files", str(exc), "Use relative names inside the job folder") from exc
        script = ss.submit_script(layout, results_dir if on_cluster else None, try_number)
        started = time.monotonic()
        result = self.run(f"/bin/sh -c {shlex.quote(script)}", stdin=archive, timeout=120)
        slurm_id = next((ln.split()[1] for ln in result.text.splitlines() if ln.startswith("@@SUBMITTED ")), "")
        if result.rc != 0 or not slurm_id:
            raise SlurmTransportError(
                f"submitting job {spec.job_id} failed (rc={result.rc}): {result.err_text or result.text.strip()}"
            )
        self.log.info(
            "Submitted Slurm job %s for %s (%s) in %.2f s; job folder %s",
            slurm_id, spec.job_id, spec.name, time.monotonic() - started, layout.job_dir,
        )  # fmt: skip
        return JobHandle(**{**handle.to_json(), "backend_job_id": slurm_id})

    def find_job(self, name: str) -> JobHandle | None:
        """The newest job of ``name``, adopted only when the cluster's files about it agree with what was submitted
        and with Slurm's records (:func:`~airflow_provider_tao.hooks.slurm.commands.adoptable`)."""
        layout = self.layout("_", name)
        found = scmd.parse_found_job(self.run(scmd.find_job_command(layout), timeout=60).text)
        if found is None or not found[1]:
            return None
        verdict = scmd.adoptable(name, self.conn_id or "", found)
        if isinstance(verdict, str):
            self.log.warning("Not adopting the job recorded for %s: %s", name, verdict)
            return None
        meta, slurm_id = verdict
        try:
            return JobHandle(**{**JobHandle.from_json(meta).to_json(), "backend_job_id": slurm_id})
        except (KeyError, TypeError, ValueError) as exc:
            self.log.warning("Not adopting the job recorded for %s: its handle does not read (%s)", name, exc)
            return None

    # ----------------------------------------------------------------- status (worker side)

    def get_job_status(self, handle: JobHandle) -> JobStatus:
        return self.get_job_statuses([handle])[handle.job_id]

    def get_job_statuses(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        ids = sorted({h.backend_job_id for h in handles if h.backend_job_id})
        queue: dict[str, sst.SlurmRecord] = {}
        if ids:
            result = self.run(sst.squeue_command(ids), timeout=60)
            if result.rc == 0:
                queue = sst.parse_squeue(result.text)
            elif not sst.squeue_says_gone(result.rc, result.err_text):
                return {h.job_id: JobStatus.unknown(f"squeue failed: {result.err_text}") for h in handles}
        acct: dict[str, sst.SlurmRecord] | None = {}
        need = [i for i in ids if i not in queue or queue[i].state in sst.NEEDS_ACCOUNTING]
        if need:  # sacct lags squeue by seconds: a just-failed job may have no exit code yet (failure_facts has it)
            result = self.run(sst.sacct_command(need), timeout=60)
            acct = sst.parse_sacct(result.text) if result.rc == 0 else None
        return {h.job_id: self._status(h, queue, acct) for h in handles}

    @staticmethod
    def _status(
        handle: JobHandle, queue: dict[str, sst.SlurmRecord], acct: dict[str, sst.SlurmRecord] | None
    ) -> JobStatus:
        if not handle.backend_job_id:
            return JobStatus.missing("no Slurm job id recorded")
        sid = handle.backend_job_id
        if sid not in queue and acct is None:
            return JobStatus.unknown("sacct failed")
        return sst.status_of(queue.get(sid), (acct or {}).get(sid))

    # ----------------------------------------------------------------- status (triggerer side, batched)

    async def aget_job_statuses(self, handles: Sequence[JobHandle]) -> dict[str, JobStatus]:
        """ONE command for every job (``squeue`` + the new log bytes of running jobs), plus ONE ``sacct`` only
        when some jobs left the queue or failed. Log bytes read here are handed to :meth:`aget_job_logs`."""
        entry = await self._entry()
        ids = sorted({h.backend_job_id for h in handles if h.backend_job_id})
        # New log bytes of every job whose trigger streams its log (it has read once, from its stored cursor) and
        # that may be writing one. A job nobody reads (stream_logs=False) or whose trigger has not asked yet costs
        # nothing here: a restarted triggerer never re-reads a log from 0 inside the status call.
        readers = [
            h for h in handles
            if h.job_id in entry.log_offsets
            and entry.states.get(h.job_id) in (JobState.PENDING, JobState.RUNNING, JobState.PAUSED)
        ]  # fmt: skip
        requests = [line for i, h in enumerate(readers) for line in self._log_requests(h, entry, f"p{i}")]
        command = sst.squeue_command(ids) + "; printf '@@SQ %d\\n' $?" if ids else "printf '@@SQ 0\\n'"
        if requests:
            command += "; " + slog.log_reader_command(slog.poll_log_bound(len(readers)))  # bounded per job and poll
        result = await entry.run(command, stdin="\n".join(requests).encode() + b"\n" if requests else None)
        queue_text, _, rest = result.out.partition(sst.SQUEUE_MARK)
        rc_text, _, log_data = rest.partition(b"\n")
        squeue_rc = int(rc_text or b"255")
        if squeue_rc == 0:
            queue = sst.parse_squeue(queue_text.decode(errors="replace"))
        elif sst.squeue_says_gone(squeue_rc, result.err_text):
            queue = {}
        else:
            return {h.job_id: JobStatus.unknown(f"squeue failed: {result.err_text[:300]}") for h in handles}
        now = time.monotonic()
        need = [i for i in ids if i not in queue or queue[i].state in sst.NEEDS_ACCOUNTING]
        acct: dict[str, sst.SlurmRecord] | None = {}
        if need:
            acct_result = await entry.run(sst.sacct_command(need))
            acct = sst.parse_sacct(acct_result.text) if acct_result.rc == 0 else None
        statuses = {}
        for handle in handles:
            status = self._status(handle, queue, acct)
            record = queue.get(handle.backend_job_id)
            if (
                status.state is JobState.ERROR and record is not None and status.exit_code is None
                and record.state == "FAILED"
            ):  # fmt: skip
                first = entry.terminal_seen.setdefault(handle.job_id, now)
                if now - first < ACCOUNTING_GRACE_SECONDS:
                    status = JobStatus(JobState.RUNNING, "FAILED; waiting for Slurm's accounting record (exit code)")
            statuses[handle.job_id] = status
            entry.states[handle.job_id] = status.state
        self._forget_unwatched(entry, handles)
        chunks = slog.parse_log_chunks(log_data)
        for i, handle in enumerate(readers):
            offset = entry.log_offsets.get(handle.job_id, 0)
            final = statuses[handle.job_id].state.is_terminal
            text, new = slog.merge_log_chunks(chunks, f"p{i}", offset, final)
            # the last read of an ended job only when nothing is left after it (a cut chunk is read on)
            entry.log_cache[handle.job_id] = (offset, text, new, final and slog.chunks_at_end(chunks, f"p{i}"))
        self._quiet_logs = frozenset(
            h.job_id for h in readers if entry.log_cache[h.job_id][2] == entry.log_cache[h.job_id][0]
        )
        return statuses

    @staticmethod
    def _forget_unwatched(entry: Any, handles: Sequence[JobHandle]) -> None:
        """Drop the per-job state of jobs no poll has asked about for a while (their triggers ended)."""
        entry.polls += 1
        for handle in handles:
            entry.seen[handle.job_id] = entry.polls
        if entry.polls % 50:
            return
        stale = [job for job, last in entry.seen.items() if last < entry.polls - 50]
        for job in stale:
            for table in (entry.seen, entry.states, entry.log_offsets, entry.log_cache, entry.terminal_seen):
                table.pop(job, None)

    def _log_requests(self, handle: JobHandle, entry: Any, tag: str) -> list[str]:
        return slog.log_requests(self.layout(handle.job_id, handle.name), entry.log_offsets.get(handle.job_id, 0), tag)

    # ----------------------------------------------------------------- logs

    def get_job_logs(self, handle: JobHandle, cursor: str = "", tail: int | None = None) -> tuple[str, str]:
        """The cursor is the packed (main.out, main.err) byte offsets as a decimal string."""
        layout = self.layout(handle.job_id, handle.name)
        if tail is not None:
            return self._parse_tail(self.run(self._tail_command(layout, tail), timeout=60).out)
        offset = _offset(cursor)
        requests = "\n".join(slog.log_requests(layout, offset, "s")) + "\n"
        result = self.run(slog.log_reader_command(), stdin=requests.encode(), timeout=120)
        text, new = slog.merge_log_chunks(slog.parse_log_chunks(result.out), "s", offset, final=True)
        return text, str(new)

    @staticmethod
    def _tail_command(layout: ss.JobLayout, lines: int) -> str:
        q = shlex.quote
        return (
            "; ".join(
                f"printf '@@T %s\\n' \"$(wc -c < {q(path)} 2>/dev/null || echo 0)\"; tail -n {int(lines)} {q(path)} "
                "2>/dev/null"
                for path in (layout.out_file, layout.err_file)
            )
            + "; exit 0"
        )

    @staticmethod
    def _parse_tail(data: bytes) -> tuple[str, str]:
        sections = data.split(b"@@T ")[1:]
        texts, sizes = [], []
        for section in sections:
            size, _, body = section.partition(b"\n")
            sizes.append(int(size.strip() or 0))
            texts.append(body.decode(errors="replace"))
        while len(sizes) < 2:
            sizes.append(0)
        text = "".join(t if t.endswith("\n") or not t else t + "\n" for t in texts)
        return text, str(slog.pack_offset(sizes[0], sizes[1]))

    def log_read_reached_end(self, text: str) -> bool:
        # a poll reads less than LOG_READ_LIMIT of each job; the read that finds nothing more costs no command
        return False

    async def aget_job_logs(self, handle: JobHandle, cursor: str = "", tail: int | None = None) -> tuple[str, str]:
        """New log text, mostly for free: the poller already read it in its status command. Pending jobs have no
        log yet (no command at all); other reads of the same moment are batched into one command."""
        entry = await self._entry()
        layout = self.layout(handle.job_id, handle.name)
        if tail is not None:
            return self._parse_tail((await entry.run(self._tail_command(layout, tail))).out)
        text, new = await self._aread_log(entry, handle, _offset(cursor))
        return text, str(new)

    async def _aread_log(self, entry: Any, handle: JobHandle, offset: int) -> tuple[str, int]:
        layout = self.layout(handle.job_id, handle.name)
        job = handle.job_id
        cached = entry.log_cache.pop(job, None)
        state = entry.states.get(job)
        if cached is not None and cached[0] == offset:
            _, text, new, final = cached
            if text is None:  # the trigger's last read of a finished job (nothing after the final chunk): forget it
                for table in (entry.states, entry.log_offsets, entry.terminal_seen):
                    table.pop(job, None)
                return "", new
            if final:
                entry.log_cache[job] = (new, None, new, True)
            entry.log_offsets[job] = new
            return text, new
        entry.log_offsets[job] = offset
        final = state is not None and state.is_terminal
        if not final:  # registered: the next poll's one command reads its new bytes with every other job's
            return "", offset
        text, new, at_end = await _batched_read(entry, slog.log_requests(layout, offset, "{tag}"), offset, final)
        entry.log_offsets[job] = new
        if final and at_end:
            entry.log_cache[job] = (new, None, new, True)
        return text, new

    # ----------------------------------------------------------------- cancel, failure facts, resubmission

    def _cancel(self, handle: JobHandle) -> bool:
        if not handle.backend_job_id:
            return True
        return self._canceled(handle, self.run(f"scancel {shlex.quote(handle.backend_job_id)}", timeout=60))

    async def _acancel(self, handle: JobHandle) -> bool:
        if not handle.backend_job_id:
            return True
        entry = await self._entry()
        return self._canceled(handle, await entry.run(f"scancel {shlex.quote(handle.backend_job_id)}"))

    @staticmethod
    def _canceled(handle: JobHandle, result: Result) -> bool:
        if result.rc == 0 or any(w in result.err_text.lower() for w in ("invalid job id", "already complet")):
            return True
        raise SlurmTransportError(f"scancel {handle.backend_job_id} failed: {result.err_text}")

    def cleanup_job(self, handle: JobHandle, *, adoptable: bool = False) -> None:
        """Delete the job's 0600 env file (it holds the secrets) once the job has ended for good."""
        env_file = self.layout(handle.job_id, handle.name).env_file
        try:
            self.run(f"rm -f -- {shlex.quote(env_file)}", timeout=60)
        except Exception as exc:  # best effort: the file stays private to the cluster user
            self.log.warning("Could not delete %s of job %s: %s", env_file, handle.job_id, exc)

    def failure_facts(self, handle: JobHandle) -> FailureFacts:
        layout = self.layout(handle.job_id, handle.name)
        command = scmd.failure_facts_command(layout, handle.backend_job_id or "0")
        return self._facts(handle, self.run(command, timeout=60).text)

    def _facts(self, handle: JobHandle, text: str) -> FailureFacts:
        acct_text, _, rest = text.partition("@@SQ 0\n")
        queue_text, _, rest = rest.partition("@@OUT\n")
        out_text, _, err_text = rest.partition("\n@@ERR\n")
        sid = handle.backend_job_id
        queue, acct = sst.parse_squeue(queue_text), sst.parse_sacct(acct_text)
        status = sst.status_of(queue.get(sid), acct.get(sid))
        record = acct.get(sid) or queue.get(sid)
        exit_code = sst.exit_code_of(acct[sid].exit_code) if sid in acct else status.exit_code
        lines = [*scmd.last_run(out_text.splitlines()), *scmd.last_run(err_text.splitlines())]
        return FailureFacts(
            exit_code=exit_code,
            raw_state=record.raw if record else status.raw_state,
            canceled=record is not None and record.state == "CANCELLED",
            timed_out=exit_code == ss.INNER_TIMEOUT_EXIT and any(ss.INNER_TIMEOUT_MARK in ln for ln in lines),
            log_tail=lines,
            message=status.message,
            details={
                "slurm_job_id": sid,
                "nodes": record.nodes if record else "",
                "reason": record.reason if record else "",
                "log": layout_logs(self.layout(handle.job_id, handle.name)),
            },
        )

    def get_job_usage(self, handle: JobHandle) -> JobUsage:
        """From Slurm's accounting (``sacct``): Submit, Start, End, ElapsedRaw, NNodes and the GPUs in AllocTRES."""
        if not handle.backend_job_id:
            return super().get_job_usage(handle)
        result = self.run(sst.usage_command(handle.backend_job_id), timeout=60)
        usage = sst.parse_usage(result.text, handle.backend_job_id) if result.rc == 0 else None
        return usage or super().get_job_usage(handle)

    def resubmit_if_retriable(self, handle: JobHandle, status: JobStatus) -> str | None:
        if status.state is not JobState.ERROR or not handle.backend_job_id:
            return None
        analysis = classify(self.failure_facts(handle))
        if analysis.err_class not in RESUBMITTABLE:
            return None
        command = scmd.resubmit_command(self.layout(handle.job_id, handle.name), handle.backend_job_id, self._max())
        return self._resubmit_verdict(handle, analysis, self.run(command, timeout=60).text)

    async def aresubmit_if_retriable(self, handle: JobHandle, status: JobStatus) -> str | None:
        """Requeue (same Slurm id, same staged script) a job that ended with a retriable infrastructure failure;
        the attempt count is kept on the cluster, so no restart of the triggerer ever resubmits twice."""
        if status.state is not JobState.ERROR or not handle.backend_job_id:
            return None
        entry = await self._entry()
        layout = self.layout(handle.job_id, handle.name)
        facts = self._facts(handle, (await entry.run(scmd.failure_facts_command(layout, handle.backend_job_id))).text)
        analysis = classify(facts)
        if analysis.err_class not in RESUBMITTABLE:
            return None
        result = await entry.run(scmd.resubmit_command(layout, handle.backend_job_id, self._max()))
        note = self._resubmit_verdict(handle, analysis, result.text)
        if note is not None:
            entry.states[handle.job_id] = JobState.PENDING
            entry.terminal_seen.pop(handle.job_id, None)
        return note

    def _max(self) -> int:
        """The connection's bound; a job's own bound (backend_details) was staged in meta/max_resubmits."""
        return int(self.setting("max_resubmits", 3))

    def _resubmit_verdict(self, handle: JobHandle, analysis: Any, text: str) -> str | None:
        line = next((ln for ln in text.splitlines() if ln.startswith("@@RS ")), None)
        if line is None:  # the command's verdict was lost with its output: the requeue may have happened
            raise SlurmTransportError(f"no answer from the requeue of Slurm job {handle.backend_job_id}")
        verdict, *rest = line[5:].split(" ")
        why = f"{analysis.err_class.value}: {analysis.evidence[0] if analysis.evidence else analysis.suggestion}"
        if verdict == "REQUEUED":
            used, limit, state = rest[:3]
            return (
                f"Slurm job {handle.backend_job_id} ended {state} with a retriable infrastructure failure ({why}); "
                f"requeued it (resubmission {used} of {limit}, same job id and staged script)"
            )
        if verdict == "NOT_FAILED":  # requeued by someone else meanwhile, or the status was stale: keep watching
            return f"Slurm job {handle.backend_job_id} is no longer failed (now {' '.join(rest)}); not resubmitting"
        self.log.warning(
            "Not resubmitting Slurm job %s (%s): %s", handle.backend_job_id, why, " ".join([verdict, *rest])
        )
        return None

    # ----------------------------------------------------------------- paths and marks

    def check_path(self, uri: str) -> bool:
        path = self._cluster_input(uri)
        if path is None:
            raise JobValidationError("uri", f"{uri!r} is not a cluster path", "Check remote objects with their hook")
        return self.run(f"test -e {shlex.quote(path)}", timeout=60).rc == 0

    def list_path(self, uri: str) -> list[str]:
        path = self._cluster_input(uri)
        if path is None:
            raise JobValidationError("uri", f"{uri!r} is not a cluster path", "List remote objects with their hook")
        result = self.run(f"[ -d {shlex.quote(path)} ] && ls -1A -- {shlex.quote(path)}; exit 0", timeout=60)
        return sorted(result.text.splitlines())

    def read_marks(self, handle: JobHandle) -> dict[str, Any]:
        return _marks(self.run(scmd.marks_read_command(self.layout(handle.job_id, handle.name)), timeout=60))

    def write_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        command = scmd.mark_write_command(self.layout(handle.job_id, handle.name), key, str(value))
        _check_mark_written(handle, key, self.run(command, timeout=60))

    async def aread_marks(self, handle: JobHandle) -> dict[str, Any]:
        entry = await self._entry()
        return _marks(await entry.run(scmd.marks_read_command(self.layout(handle.job_id, handle.name))))

    async def awrite_mark(self, handle: JobHandle, key: str, value: Any) -> None:
        entry = await self._entry()
        command = scmd.mark_write_command(self.layout(handle.job_id, handle.name), key, str(value))
        _check_mark_written(handle, key, await entry.run(command))


def _offset(cursor: str) -> int:
    return int(cursor) if cursor else 0


def _marks(result: Result) -> dict[str, Any]:
    return dict(line.split("=", 1) for line in result.text.splitlines() if "=" in line)


def _check_mark_written(handle: JobHandle, key: str, result: Result) -> None:
    if result.rc != 0:
        raise SlurmTransportError(f"writing mark {key} of job {handle.job_id} failed: {result.err_text}")


def layout_logs(layout: ss.JobLayout) -> str:
    return f"{layout.out_file} | {layout.err_file}"


async def _batched_read(entry: Any, requests: list[str], offset: int, final: bool) -> tuple[str, int, bool]:
    """Read one job's logs (its text, the offset after it, whether that is the files' end); reads asked for in the
    same moment share one remote command."""
    future: asyncio.Future[tuple[str, int, bool]] = asyncio.get_running_loop().create_future()
    entry.pending_reads.append(((requests, offset, final), future))
    if entry.read_task is None or entry.read_task.done():
        entry.read_task = asyncio.create_task(_flush_reads(entry))
    return await future


async def _flush_reads(entry: Any) -> None:
    await asyncio.sleep(0.02)
    batch, entry.pending_reads = entry.pending_reads, []
    lines = [r.format(tag=f"b{i}") for i, ((requests, _, _), _) in enumerate(batch) for r in requests]
    try:
        result = await entry.run(slog.log_reader_command(), stdin=("\n".join(lines) + "\n").encode())
        chunks = slog.parse_log_chunks(result.out)
    except Exception as exc:
        for _, future in batch:
            if not future.done():
                future.set_exception(exc)
        return
    for i, ((_, offset, final), future) in enumerate(batch):
        if not future.done():
            future.set_result(
                (*slog.merge_log_chunks(chunks, f"b{i}", offset, final), slog.chunks_at_end(chunks, f"b{i}"))
            )
