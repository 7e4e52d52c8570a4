"""The job's S3 client: boto3 with the job's endpoint and timeouts, errors mapped to the failure taxonomy, listings,
small objects, and the ``TransferManager`` that moves data (see ``transfers``).

``boto3`` is imported when an ``s3://`` location is used, never at import; a job image without it gets a
configuration error naming the pinned version. ``s3transfer`` (TransferManager) ships with every boto3.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, InfraError, RunnerError, missing_package
from .paths import parse_s3
from .tuning import env_float, env_int

if TYPE_CHECKING:  # pragma: no cover - typing only
    from collections.abc import Callable, Mapping

S3_NOT_FOUND = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "404", "NoSuchUpload"})
_S3_DENIED = {
    "AccessDenied",
    "403",
    "Forbidden",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AllAccessDisabled",
    "AccountProblem",
    "InvalidToken",
    "ExpiredToken",
    "InvalidBucketName",
}


class S3:
    """A boto3 S3 client configured from the job's environment, with classified errors.

    :param wheels: pinned versions for the missing-package message.
    """

    def __init__(self, wheels: Mapping[str, str] | None = None) -> None:
        try:
            import boto3
            import botocore.config
            import botocore.exceptions
        except ImportError:
            raise missing_package("boto3", "s3:// inputs/outputs", wheels) from None
        self.exceptions = botocore.exceptions
        self.concurrency = env_int("TAO_TRANSFER_CONCURRENCY", 16)
        self.part_size = env_int("TAO_PART_SIZE_MB", 8) << 20
        self.retries = env_int("TAO_TRANSFER_RETRIES", 3)
        config = botocore.config.Config(
            retries={"max_attempts": env_int("TAO_S3_MAX_ATTEMPTS", 5), "mode": "standard"},
            max_pool_connections=self.concurrency + 4,
            connect_timeout=env_float("TAO_S3_CONNECT_TIMEOUT", 10.0),
            read_timeout=env_float("TAO_S3_READ_TIMEOUT", 60.0),
        )
        kwargs: dict[str, Any] = {"config": config}
        # Older botocore does not read AWS_ENDPOINT_URL by itself.
        if os.environ.get("AWS_ENDPOINT_URL"):
            kwargs["endpoint_url"] = os.environ["AWS_ENDPOINT_URL"]
        if os.environ.get("AWS_DEFAULT_REGION"):
            kwargs["region_name"] = os.environ["AWS_DEFAULT_REGION"]
        self.client = boto3.session.Session().client("s3", **kwargs)

    def transfer_manager(self) -> Any:
        """A ``s3transfer`` TransferManager on this client: multipart above the part size, the job's concurrency."""
        from s3transfer.manager import TransferConfig, TransferManager

        config = TransferConfig(
            multipart_threshold=self.part_size,
            multipart_chunksize=self.part_size,
            max_request_concurrency=self.concurrency,
            num_download_attempts=self.retries,
        )
        return TransferManager(self.client, config)

    # -- error classification ------------------------------------------------------------------------------
    def classify(self, exc: BaseException, what: str) -> RunnerError:
        """Map a botocore / s3transfer / socket error to ERR_CONFIG or ERR_INFRA.

        :param exc: the exception.
        :param what: the URI concerned (for the message).
        """
        if isinstance(exc, RunnerError):
            return exc
        if type(exc).__module__.startswith("s3transfer"):
            # s3transfer wraps what went wrong: RetriesExceededError(last_exception), S3DownloadFailedError raised
            # while handling a ClientError (412 when If-Match failed)
            cause = getattr(exc, "last_exception", None) or exc.__cause__ or exc.__context__
            if cause is not None:
                return self.classify(cause, what)
            return InfraError(f"{what}: transfer failed ({type(exc).__name__}: {exc})")
        exc_mod = self.exceptions
        if isinstance(exc, exc_mod.NoCredentialsError):
            return ConfigError(f"{what}: no S3 credentials in the job environment (AWS_ACCESS_KEY_ID)")
        if isinstance(exc, exc_mod.ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code in S3_NOT_FOUND or status == 404:
                return ConfigError(f"{what}: not found ({code or status})")
            if code in _S3_DENIED or status == 403:
                return ConfigError(f"{what}: access denied ({code or status})")
            if code in ("PreconditionFailed", "412") or status == 412:
                return InfraError(f"{what}: the object changed while it was being downloaded; retry")
            if status >= 500 or code in ("SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable"):
                return InfraError(f"{what}: S3 kept failing after retries ({code or status})")
            return ConfigError(f"{what}: S3 refused the request ({code or status})")
        if isinstance(exc, (exc_mod.BotoCoreError, OSError)) or type(exc).__module__.startswith("urllib3"):
            return InfraError(f"{what}: connection to S3 failed ({type(exc).__name__}: {exc})")
        return RunnerError(f"{what}: {type(exc).__name__}: {exc}")

    def _retrying(self, what: str, fn: Callable[[], Any]) -> Any:
        """Retry transient failures botocore does not (a body stream cut mid-read)."""
        for attempt in range(self.retries):
            try:
                return fn()
            except Exception as exc:
                err = self.classify(exc, what)
                if not isinstance(err, InfraError) or attempt == self.retries - 1:
                    raise err from exc
                time.sleep(min(0.25 * (2**attempt), 4.0))
        raise AssertionError("unreachable")

    # -- metadata --------------------------------------------------------------------------------------------
    def head(self, bucket: str, key: str) -> tuple[int, str] | None:
        """``(size, etag)`` of an object, or None when there is none.

        :param bucket: bucket.
        :param key: key.
        """
        uri = f"s3://{bucket}/{key}"
        try:
            resp = self._retrying(uri, lambda: self.client.head_object(Bucket=bucket, Key=key))
        except ConfigError as exc:
            if "not found" in str(exc):
                return None
            raise
        return int(resp["ContentLength"]), str(resp.get("ETag", ""))

    def list_prefix(self, bucket: str, prefix: str) -> list[tuple[str, int, str]]:
        """``[(key, size, etag)]`` under a prefix.

        :param bucket: bucket.
        :param prefix: key prefix.
        """
        uri = f"s3://{bucket}/{prefix}"

        def run() -> list[tuple[str, int, str]]:
            found = []
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
                for obj in page.get("Contents", []) or []:
                    found.append((obj["Key"], int(obj["Size"]), str(obj.get("ETag", ""))))
            return found

        result: list[tuple[str, int, str]] = self._retrying(uri, run)
        return result

    def resolve(self, uri: str) -> tuple[str, list[tuple[str, int, str]]]:
        """Decide file vs prefix: ``("file", [(key, size, etag)])`` or ``("folder", [...])``.

        :param uri: ``s3://bucket/key`` or ``s3://bucket/prefix/``.
        """
        bucket, key = parse_s3(uri)
        if key and not key.endswith("/"):
            head = self.head(bucket, key)
            if head is not None:
                return "file", [(key, head[0], head[1])]
        prefix = key if (not key or key.endswith("/")) else key + "/"
        objects = [o for o in self.list_prefix(bucket, prefix) if not (o[0].endswith("/") and o[1] == 0)]
        if not objects:
            raise ConfigError(f"{uri}: no such object or prefix (NoSuchKey)")
        return "folder", objects

    # -- small objects -------------------------------------------------------------------------------------
    def put_bytes(self, uri: str, data: bytes) -> None:
        """Write one small object.

        :param uri: destination.
        :param data: content.
        """
        bucket, key = parse_s3(uri)
        self._retrying(uri, lambda: self.client.put_object(Bucket=bucket, Key=key, Body=data))

    def delete(self, uri: str) -> None:
        """Delete one object (no error when absent).

        :param uri: the object.
        """
        bucket, key = parse_s3(uri)
        self._retrying(uri, lambda: self.client.delete_object(Bucket=bucket, Key=key))
