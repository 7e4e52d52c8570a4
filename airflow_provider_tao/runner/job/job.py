"""One run of the runner, from a parsed ``runner.json`` to the exit code: where results go, the work folder, the
spec, and the order of things (plan outputs, stage inputs, write the spec, run, commit)."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import uuid
from typing import TYPE_CHECKING, Any

from .command import args_tokens, build_argv, run_process
from .errors import ConfigError, RunnerError
from .fsops import write_atomic
from .inputs import InputStaging
from .outputs import Outputs
from .paths import mount_mapping
from .runfile import MODES
from .s3 import S3
from .specs import dumps_spec
from .status import StatusFollower

if TYPE_CHECKING:  # pragma: no cover - typing only
    from collections.abc import Mapping

    from .progress import Reporter

DEFAULT_LOCAL_RESULTS_BASE = "/results"
_SAFE_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


class Job:
    """One run of the runner, driven by a ``runner.json`` manifest.

    Results go, in this order of precedence, to ``$TAO_RESULTS_URI`` (an explicit location), ``$TAO_RESULTS_ROOT/
    <job_id>`` (a persistent mount), ``s3://$S3_BUCKET_NAME/results/<job_id>``, else ``/results/<job_id>`` inside
    the job, with a loud warning that they will be lost.

    :param manifest: the parsed runner.json.
    :param reporter: where lines go.
    """

    def __init__(self, manifest: Mapping[str, Any], reporter: Reporter) -> None:
        self.m = manifest
        self.r = reporter
        self.mode = str(manifest.get("mode"))
        if self.mode not in MODES:
            raise ConfigError("runner.json: unknown mode {!r}".format(manifest.get("mode")))
        self.wheels: dict[str, str] = dict(manifest.get("wheels") or {})
        self.excludes: list[str] = list(manifest.get("upload_excludes") or [])
        self.mount_path: str | None = manifest.get("mount_path") or None
        self.config_format = str(manifest.get("config_format") or "yaml")
        self.job_id = self._job_id()
        self._s3: S3 | None = None
        # A platform-provided TAO_WORK_DIR (big scratch disk) is the platform's; a temp one is removed at the end.
        self.own_work = not os.environ.get("TAO_WORK_DIR")
        self.work = os.environ.get("TAO_WORK_DIR") or tempfile.mkdtemp(prefix=f"tao-job-{self.job_id}-")
        os.makedirs(self.work, exist_ok=True)
        self.results_kind, self.results_dest, self.results_local = self._results()
        self.outputs = Outputs(self)
        self.config_path: str | None = None
        self.spec: Any = json.loads(json.dumps(manifest.get("specs"))) if self.mode == "config" else None
        self.args: dict[str, Any] = dict(manifest.get("args") or {}) if self.mode == "args" else {}

    # -- environment -----------------------------------------------------------------------------------------
    def _job_id(self) -> str:
        job_id = os.environ.get("TAO_JOB_ID", "").strip()
        if not job_id:
            job_id = uuid.uuid4().hex
            self.r.info(f"TAO_JOB_ID is not set; using a fresh id {job_id}")
        if not _SAFE_JOB_ID.fullmatch(job_id) or ".." in job_id:
            raise ConfigError(f"TAO_JOB_ID {job_id!r} is not a safe path component")
        return job_id

    @property
    def s3(self) -> S3:
        """The S3 client, made on first use (a job without ``s3://`` never imports boto3)."""
        if self._s3 is None:
            self._s3 = S3(self.wheels)
        return self._s3

    def _results(self) -> tuple[str, str, str]:
        """``(kind, destination root, local root)`` following the seeds' table (plus an explicit override)."""
        explicit = os.environ.get("TAO_RESULTS_URI", "").strip()
        if explicit:
            if explicit.startswith("s3://"):
                dest = explicit.rstrip("/")
                return "s3", dest, self._local_stage(dest)
            path = explicit[len("file://") :] if explicit.startswith("file://") else explicit
            if not os.path.isabs(path):
                raise ConfigError(f"TAO_RESULTS_URI must be s3://... or an absolute path, got {explicit!r}")
            return "mount", path.rstrip("/") or "/", path.rstrip("/") or "/"
        root = os.environ.get("TAO_RESULTS_ROOT", "").strip()
        if root:
            path = os.path.join(root, self.job_id)
            return "mount", path, path
        bucket = os.environ.get("S3_BUCKET_NAME", "").strip()
        if bucket:
            bucket = bucket[len("s3://") :] if bucket.startswith("s3://") else bucket
            dest = "s3://{}/results/{}".format(bucket.strip("/"), self.job_id)
            return "s3", dest, self._local_stage(dest)
        base = os.environ.get("TAO_LOCAL_RESULTS_BASE") or DEFAULT_LOCAL_RESULTS_BASE
        path = self._writable(os.path.join(base, self.job_id))
        return "ephemeral", path, path

    def _local_stage(self, dest: str) -> str:
        if self.mount_path:
            return mount_mapping(self.mount_path, dest)
        base = os.environ.get("TAO_LOCAL_RESULTS_BASE") or DEFAULT_LOCAL_RESULTS_BASE
        return self._writable(os.path.join(base, self.job_id))

    def _writable(self, path: str) -> str:
        try:
            os.makedirs(path, exist_ok=True)
            return path
        except OSError:
            fallback = os.path.join(self.work, "results")
            self.r.info(f"{path} is not writable; staging outputs in {fallback}")
            return fallback

    def _ephemeral_warning(self) -> None:
        self.r.warn(
            f"outputs of job {self.job_id} are written to {self.results_local} INSIDE the job and will be "
            "LOST when it ends: neither "
            "TAO_RESULTS_ROOT (a persistent mount) nor S3_BUCKET_NAME is set. Set a storage connection / "
            "results_uri, or mount persistent storage at /results."
        )

    # -- spec and command --------------------------------------------------------------------------------------
    def write_spec(self) -> None:
        """Write the (rewritten) spec at the config path."""
        fmt = self.config_format
        try:
            text, written = dumps_spec(self.spec, fmt)
        except ValueError as exc:
            raise ConfigError(f"spec: {exc}") from None
        if written != fmt:
            self.r.info("PyYAML is not installed in the job image; writing the spec as JSON (valid YAML)")
        path = os.path.join(self.work, "spec." + fmt)
        data = text.encode("utf-8")
        write_atomic(path, data)
        self.config_path = path
        self.r.progress("spec", 1, len(data), format=written)

    def run_command(self) -> int:
        """Run the command with the job's variables; returns its exit code (128+N for signal N)."""
        values = {"{config_path}": self.config_path or "", "{results_dir}": self.results_local, "{job_id}": self.job_id}
        tokens = args_tokens(self.args) if self.mode == "args" else []
        argv = build_argv(self.m.get("command"), values, tokens)
        env = dict(os.environ)
        env["TAO_JOB_ID"] = self.job_id
        env["TAO_RESULTS_DIR"] = self.results_local
        if self.config_path:
            env["TAO_CONFIG_PATH"] = self.config_path
        env.setdefault("PYTHONUNBUFFERED", "1")  # so training steps reach the log (and the step parser) live
        with StatusFollower(self.results_local, self.r):  # TAO's status.json lines into the log, as they come
            return run_process(argv, env, self.r)

    # -- whole run ---------------------------------------------------------------------------------------------
    def cleanup(self) -> None:
        """Remove a temp work dir (staged inputs, the spec) unless ``TAO_KEEP_WORK=1``."""
        if self.own_work and os.environ.get("TAO_KEEP_WORK", "") not in ("1", "true", "yes"):
            shutil.rmtree(self.work, ignore_errors=True)

    def run(self) -> int:
        """Stage, write, run, commit; returns the exit code."""
        self.r.info(f"job {self.job_id}, mode {self.mode}, results: {self.results_dest} ({self.results_kind})")
        if self.results_kind == "ephemeral":
            self._ephemeral_warning()
        self.outputs.plan()
        InputStaging(self).run()
        if self.mode == "config":
            self.write_spec()
        rc = self.run_command()
        try:
            outputs = self.outputs.commit(rc)
        except RunnerError as exc:
            if rc == 0:
                raise
            self.r.info(f"could not commit outputs after the command failed: {exc}")
            outputs = {}
        if self.results_kind == "ephemeral":
            self._ephemeral_warning()
        self.r.progress(
            "done", exit_code=rc, results_dir=self.results_dest, results_kind=self.results_kind, outputs=outputs
        )
        return rc
