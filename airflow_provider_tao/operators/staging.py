"""``S3StagingMixin``: wraps a job's command in the in-job runner when it has a data contract.

When the operator is given ``specs`` / ``args`` / ``inputs`` / ``outputs`` or a ``storage_conn_id``, the job runs
the in-job runner (``runner/job/``, shipped as ``runner.pyz``) instead of the bare command: it downloads the declared
inputs, writes the spec, runs the command and commits the outputs with a manifest. Before anything is submitted the
mixin checks that every declared input exists -- on S3 through the amazon provider's ``S3Hook``, on the platform's
own storage through the platform hook -- and it passes the storage credentials into the job as secret environment
variables only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_provider_tao.hooks.base import JobValidationError

if TYPE_CHECKING:
    from airflow_provider_tao.hooks.base import TAOPlatformHook
    from airflow_provider_tao.jobs import JobSpec
    from airflow_provider_tao.runner.entrypoint import Entrypoint

#: Operator parameters that make a job use the runner.
STAGING_FIELDS = ("specs", "args", "inputs", "outputs", "storage_conn_id")


class S3StagingMixin:
    """Data staging for :class:`~airflow_provider_tao.operators.submit.TAOSubmitOperator`.

    Reads the operator's ``command``, ``specs``, ``args``, ``inputs``, ``outputs``, ``config_format``,
    ``upload_excludes``, ``storage_conn_id``, ``results_uri`` and ``backend_details["mount_path"]`` (else the
    platform's own shared cache, :meth:`~airflow_provider_tao.hooks.base.TAOPlatformHook.runner_mount_path`).
    """

    command: str | list[str]
    specs: dict[str, Any] | None
    args: dict[str, Any] | None
    inputs: Mapping[str, Any] | Sequence[str] | None
    outputs: Mapping[str, Any] | Sequence[str] | None
    config_format: str
    upload_excludes: Sequence[str] | None
    storage_conn_id: str | None
    results_uri: str | None
    backend_details: dict[str, Any]

    @property
    def uses_runner(self) -> bool:
        return any(getattr(self, name) is not None for name in STAGING_FIELDS)

    def build_job_entrypoint(self, mount_path: str | None = None) -> Entrypoint:
        """The runner entrypoint for this task (pure: the same rendered parameters give the same result).

        :param mount_path: the platform's shared input cache, when ``backend_details`` names none.
        """
        from airflow_provider_tao.runner.entrypoint import build_entrypoint

        try:
            entrypoint = build_entrypoint(
                self.command,
                specs=self.specs,
                args=self.args,
                inputs=self.inputs,
                outputs=self.outputs,
                config_format=self.config_format,
                upload_excludes=self.upload_excludes,
                mount_path=self.backend_details.get("mount_path") or mount_path,
            )
        except ValueError as exc:
            parameter, _, rest = str(exc).partition(": ")
            raise JobValidationError(parameter, rest or str(exc), "Fix the task's data parameters") from exc
        if entrypoint.mode == "config" and not _names_the_spec(self.command):
            raise JobValidationError(
                "command",
                "config mode (specs=...) writes the spec to a file, but the command never names {config_path} or "
                "$TAO_CONFIG_PATH, so the program would not read it",
                "Put {config_path} where the program takes its spec (e.g. 'train.py --config {config_path}'), "
                "or pass args=... instead of specs=...",
            )
        return entrypoint

    def stage(self, spec: JobSpec, hook: TAOPlatformHook) -> tuple[JobSpec, dict[str, str]]:
        """Wrap ``spec`` in the runner when the task has a data contract.

        :returns: the job spec to submit and the final URI of every declared output (for the task's XCom).
        """
        if self.results_uri and self.results_uri.startswith("s3://") and self.storage_conn_id is None:
            raise JobValidationError(
                "results_uri",
                f"{self.results_uri!r} is on S3 but no storage_conn_id is given",
                "Pass storage_conn_id=<an aws connection> so the job can upload its results",
            )
        if not self.uses_runner:
            return spec, {}
        # the job's own details first: with a chain of connections, a mount path may be given per connection
        entrypoint = self.build_job_entrypoint(spec.backend_details.get("mount_path") or hook.runner_mount_path(spec))
        self._check_inputs(entrypoint, hook)
        env = {**spec.env, **entrypoint.env}
        secret_env = dict(spec.secret_env)
        if self.storage_conn_id is not None:
            secret_env.update(self._storage_env())
            if bucket := self._storage_extras().get("bucket_name"):
                env.setdefault("S3_BUCKET_NAME", str(bucket))
        staged = replace(
            spec,
            command=entrypoint.command,
            files={**spec.files, **{name: _as_bytes(content) for name, content in entrypoint.files.items()}},
            env=env,
            secret_env=secret_env,
        )
        results_dir = hook.results_dir_for(staged)
        if spec.results_uri:
            staged = replace(staged, env={**env, "TAO_RESULTS_URI": results_dir})
        return staged, entrypoint.output_uris(results_dir)

    # ----------------------------------------------------------------- storage

    def _storage_extras(self) -> dict[str, Any]:
        from airflow_provider_tao.connections import get_connection

        assert self.storage_conn_id is not None
        extras = get_connection(self.storage_conn_id).extra_dejson
        return extras if isinstance(extras, dict) else {}

    def _s3_hook(self) -> Any:
        try:
            from airflow.providers.amazon.aws.hooks.s3 import S3Hook
        except ImportError as exc:
            raise JobValidationError(
                "storage_conn_id",
                "the amazon provider is not installed",
                "pip install 'airflow-provider-tao[s3]'",
            ) from exc
        return S3Hook(aws_conn_id=self.storage_conn_id)

    def _storage_env(self) -> dict[str, str]:
        """Credentials of ``storage_conn_id`` as the job's secret environment (never logged or written)."""
        hook = self._s3_hook()
        refreshable = hook.get_session().get_credentials()
        credentials = refreshable.get_frozen_credentials()
        expiry = getattr(refreshable, "_expiry_time", None)  # botocore keeps it on temporary credentials only
        self._credentials_expiry = expiry.timestamp() if expiry is not None else None
        env = {"AWS_ACCESS_KEY_ID": credentials.access_key, "AWS_SECRET_ACCESS_KEY": credentials.secret_key}
        if credentials.token:
            env["AWS_SESSION_TOKEN"] = credentials.token
        endpoint = hook.conn_config.get_service_endpoint_url("s3") or hook.conn_config.endpoint_url
        if endpoint:
            env["AWS_ENDPOINT_URL"] = endpoint
        if hook.conn_config.region_name:
            env["AWS_DEFAULT_REGION"] = hook.conn_config.region_name
        return env

    def storage_credentials_expiry(self) -> float | None:
        """Epoch seconds at which the storage credentials handed to the job expire, when botocore knows it."""
        return getattr(self, "_credentials_expiry", None)

    def _check_inputs(self, entrypoint: Entrypoint, hook: TAOPlatformHook) -> None:
        """Every declared input must exist before a GPU is asked for."""
        for where, uri in _input_uris(entrypoint):
            if uri.startswith("s3://"):
                if self.storage_conn_id is None:
                    raise JobValidationError(
                        where, f"{uri} is on S3 but no storage_conn_id is given", "Pass storage_conn_id=<aws conn>"
                    )
                exists = _s3_exists(self._s3_hook(), uri)
            elif uri.startswith(("hf_model://", "hf_dataset://", "ngc://")):
                continue  # model hubs are checked by the runner in the job (their clients are not host deps)
            else:
                exists = hook.check_path(uri)
            if not exists:
                raise JobValidationError(where, f"{uri} does not exist", "Fix the path or upload the data first")


def _input_uris(entrypoint: Entrypoint) -> list[tuple[str, str]]:
    """(parameter path, URI) of every declared input, from the runner manifest."""
    from airflow_provider_tao.runner.job.paths import get_path

    manifest = entrypoint.manifest
    found: list[tuple[str, str]] = []
    for key in manifest.get("inputs") or {}:
        values: Any
        if entrypoint.mode == "passthrough":
            values = manifest["inputs"][key]  # {container path: uri}
        elif entrypoint.mode == "config":
            values = get_path(manifest.get("specs"), key)
        else:
            values = (manifest.get("args") or {}).get(key)
        for value in values if isinstance(values, list) else [values]:
            if isinstance(value, str) and value:
                found.append((f"inputs[{key!r}]", value))
    return found


def _s3_exists(hook: Any, uri: str) -> bool:
    """A key, or a prefix with at least one object under it ("folder").

    Keys are listed in order and a key sorts before every longer key it prefixes, so one listing of ``key``
    answers "is there an object at exactly this key" and one of ``key/`` answers "is it a folder" -- however many
    siblings such as ``train.csv`` / ``train2.csv`` share the prefix.
    """
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    client = hook.get_conn()

    def first(prefix: str) -> str | None:
        contents = client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("Contents", [])
        return contents[0]["Key"] if contents else None

    folder = key.rstrip("/") + "/" if key.rstrip("/") else ""
    return (bool(key) and not key.endswith("/") and first(key) == key) or first(folder) is not None


def _as_bytes(content: str | bytes) -> bytes:
    return content.encode() if isinstance(content, str) else content


def _names_the_spec(command: Any) -> bool:
    """Config mode: the command says where the spec goes -- ``{config_path}`` (replaced by the spec's path) or the
    variable ``TAO_CONFIG_PATH`` (a shell command expanding it, or a program told to read it). Otherwise its program
    never reads the spec and the job fails with the program's own argument error after waiting for GPUs: an error
    before submission, since a program reading the variable unasked cannot be told from one that never reads the
    spec, and the second is the common mistake."""
    texts = [command] if isinstance(command, str) else list(command)
    return any("{config_path}" in t or "TAO_CONFIG_PATH" in t for t in texts if isinstance(t, str))
