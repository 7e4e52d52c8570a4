#!/usr/bin/env python3
"""In-job runtime of airflow-provider-tao: stage inputs, write the spec, run the command, commit outputs.

Run as ``python3 script_runner.py <runner.json>``; the platform stages this file and ``runner.json`` (written by
``runner/entrypoint.py`` on the Airflow side) into ``$TAO_JOB_FILES``. The file is self-contained on purpose:

* stdlib only, Python >= 3.8 (bare-metal SLURM nodes); it never imports airflow or ``airflow_provider_tao``;
* ``boto3`` is imported only when an ``s3://`` location is used, PyYAML only to write a YAML spec (JSON, which is
  valid YAML, is written without it), ``huggingface_hub`` / ``ngcsdk`` only for ``hf_*://`` / ``ngc://``. A missing
  package is a configuration error naming the version pinned in ``versions.yaml`` -- nothing is ever pip-installed.

Lines it prints for machines (one per line, ASCII JSON after the prefix):

* ``TAO_PROGRESS {"phase": "download"|"spec"|"run"|"upload"|"done", "files": n, "bytes": n, ...}`` -- at most one
  heartbeat per ``$TAO_PROGRESS_INTERVAL`` seconds (default 10) during transfers and the run, with ``"step"`` /
  ``"epoch"`` once the command prints ``step N``, ``global_step=N`` or ``Epoch N/M``.
* ``TAO_FAILURE {"err_class": "ERR_CONFIG"|"ERR_INFRA"|"ERR_UNKNOWN", "message": "..."}`` -- printed once, just
  before the runner exits non-zero *because of its own failure* (exit 2 = configuration: missing or denied input,
  bad manifest; 75 = infrastructure: connection dropped / endpoint gone after retries; 70 = runner bug).

Exit code: the command's own (128+N when it died from signal N). Outputs are committed even when the command fails
(checkpoints survive for a resume); each output manifest records the command's ``exit_code``. When the command
succeeded but committing its outputs failed, the runner exits 2 or 75 with a ``TAO_FAILURE`` line.

Every output destination is committed atomically: data first, then ``_TAO_MANIFEST.json`` (relative path, size,
sha256 of each file) written last at its root; an existing manifest there is removed before any data is written,
so a destination without a manifest is incomplete (:func:`read_manifest`, :func:`is_complete`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    from collections.abc import Mapping, Sequence

RUNNER_FORMAT = 1
MANIFEST_NAME = "_TAO_MANIFEST.json"
MANIFEST_FORMAT = "tao-output-manifest/1"
PROGRESS_PREFIX = "TAO_PROGRESS "
FAILURE_PREFIX = "TAO_FAILURE "
#: The only placeholders replaced in the user command (literal substring replacement, never ``str.format``).
PLACEHOLDERS = ("{config_path}", "{results_dir}", "{job_id}")
MODES = ("config", "args", "passthrough")
CONFIG_FORMATS = ("yaml", "toml", "json")
EXIT_CONFIG = 2
EXIT_SOFTWARE = 70
EXIT_INFRA = 75  # EX_TEMPFAIL: retrying later may work
# Forwarded to the command's whole process group: a cancel stops every process the command started.
GROUP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: Cache bookkeeping lives beside the data tree, never inside it (training code lists data folders).
CACHE_META_DIR = ".tao-cache-meta"
PART_SUFFIX = ".tao-part"
DEFAULT_LOCAL_RESULTS_BASE = "/results"
MODEL_FILE_EXTENSIONS = (".pth", ".pth.tar", ".pt", ".ckpt", ".hdf5", ".tlt", ".safetensors", ".onnx")
# Which versions.yaml `wheels:` key pins each optional package.
WHEEL_KEYS = {"boto3": "boto3", "yaml": "pyyaml", "huggingface_hub": "huggingface_hub", "ngcsdk": "ngcsdk"}

_S3_NOT_FOUND = {"NoSuchKey", "NoSuchBucket", "NotFound", "404", "NoSuchUpload"}
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
_STEP_PATTERNS = (
    re.compile(r"\bglobal_step\s*[=:]\s*(\d+)", re.IGNORECASE),
    re.compile(r"\bstep\s*[=:#]?\s*\[?\s*(\d+)", re.IGNORECASE),
)
_EPOCH_PATTERN = re.compile(r"\bepoch\s*[=:\[]?\s*(\d+)\s*/\s*(\d+)", re.IGNORECASE)
_SAFE_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


# --------------------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------------------
class RunnerError(Exception):
    """A failure of the runner itself, with the class and exit code failure analysis expects."""

    err_class = "ERR_UNKNOWN"
    exit_code = EXIT_SOFTWARE


class ConfigError(RunnerError):
    """Missing / denied input, bad manifest, missing package: a retry will not help."""

    err_class = "ERR_CONFIG"
    exit_code = EXIT_CONFIG


class InfraError(RunnerError):
    """Connection dropped, endpoint gone, timeouts after retries: a retry may help."""

    err_class = "ERR_INFRA"
    exit_code = EXIT_INFRA


def missing_package(module: str, purpose: str, wheels: Mapping[str, str] | None) -> ConfigError:
    """The error for an optional package the job image lacks; names the pinned version, installs nothing.

    :param module: the import name (``boto3``, ``huggingface_hub``, ...).
    :param purpose: what needed it, e.g. ``"s3:// inputs"``.
    :param wheels: the ``wheels:`` tree of versions.yaml copied into runner.json.
    """
    key = WHEEL_KEYS.get(module, module)
    pin = (wheels or {}).get(key)
    if pin:
        fix = f"add it to the job image: pip install '{pin}' (pinned in versions.yaml wheels.{key})"
    else:
        fix = f"add it to the job image and pin it under 'wheels: {key}:' in versions.yaml"
    return ConfigError(f"python package '{module}' is not installed in the job image but {purpose} need it; {fix}")


# --------------------------------------------------------------------------------------------------------------
# Output lines
# --------------------------------------------------------------------------------------------------------------
def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        return default


def _env_int(name: str, default: int) -> int:
    try:
        return max(1, int(os.environ.get(name, "") or default))
    except ValueError:
        return default


class Reporter:
    """Serialises everything the runner and the command print, so machine lines never split a user line.

    :param out: binary stream for stdout (defaults to ``sys.stdout.buffer``).
    :param err: binary stream for stderr.
    """

    def __init__(self, out: IO[bytes] | None = None, err: IO[bytes] | None = None) -> None:
        self.out = out if out is not None else sys.stdout.buffer
        self.err = err if err is not None else sys.stderr.buffer
        self.lock = threading.Lock()
        self._out_at_line_start = True
        self._err_at_line_start = True
        self.interval = _env_float("TAO_PROGRESS_INTERVAL", 10.0)

    def _write(self, stream: IO[bytes], data: bytes, is_out: bool) -> None:
        if not data:
            return
        stream.write(data)
        stream.flush()
        at_start = data.endswith((b"\n", b"\r"))
        if is_out:
            self._out_at_line_start = at_start
        else:
            self._err_at_line_start = at_start

    def forward(self, data: bytes, is_out: bool = True) -> None:
        """Pass the command's output through unchanged."""
        with self.lock:
            self._write(self.out if is_out else self.err, data, is_out)

    def line(self, text: str, is_out: bool = True) -> None:
        """Print one whole line, starting a new one if the command left a partial line."""
        with self.lock:
            at_start = self._out_at_line_start if is_out else self._err_at_line_start
            payload = ("" if at_start else "\n") + text + "\n"
            self._write(self.out if is_out else self.err, payload.encode("utf-8", "replace"), is_out)

    def progress(self, phase: str, files: int = 0, nbytes: int = 0, **fields: Any) -> None:
        """Print one ``TAO_PROGRESS`` line."""
        data: dict[str, Any] = {"phase": phase, "files": int(files), "bytes": int(nbytes)}
        data.update({k: v for k, v in fields.items() if v is not None})
        self.line(PROGRESS_PREFIX + json.dumps(data, separators=(",", ":"), sort_keys=False))

    def info(self, message: str) -> None:
        """A human line for the job log."""
        self.line("[tao-runner] " + message)

    def warn(self, message: str) -> None:
        """A loud warning, on stdout (the log people read) and stderr."""
        bar = "!" * 78
        for text in (bar, "[tao-runner] WARNING: " + message, bar):
            self.line(text)
            self.line(text, is_out=False)

    def failure(self, err_class: str, message: str) -> None:
        """The one ``TAO_FAILURE`` line failure analysis reads."""
        payload = {"err_class": err_class, "message": message[:2000]}
        self.line(FAILURE_PREFIX + json.dumps(payload, separators=(",", ":")))


class Ticker:
    """Calls ``fn`` every ``interval`` seconds on a daemon thread until stopped.

    :param interval: seconds between calls.
    :param fn: the callback (a heartbeat).
    """

    def __init__(self, interval: float, fn: Callable[[], None]) -> None:
        self.interval = max(0.01, interval)
        self.fn = fn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tao-heartbeat", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(Exception):  # a heartbeat must never kill the run
                self.fn()

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class Progress:
    """Thread-safe transfer counters with a heartbeat and a final line.

    :param reporter: where lines go.
    :param phase: ``download`` or ``upload``.
    :param total_files: files planned.
    :param total_bytes: bytes planned.
    """

    def __init__(self, reporter: Reporter, phase: str, total_files: int = 0, total_bytes: int = 0) -> None:
        self.reporter = reporter
        self.phase = phase
        self.total_files = total_files
        self.total_bytes = total_bytes
        self.files = 0
        self.nbytes = 0
        self.cached = 0
        self.start = time.monotonic()
        self.lock = threading.Lock()

    def add(self, files: int = 0, nbytes: int = 0, cached: int = 0) -> None:
        """Count finished files / transferred bytes."""
        with self.lock:
            self.files += files
            self.nbytes += nbytes
            self.cached += cached

    def emit(self, final: bool = False) -> None:
        """Print the current state."""
        with self.lock:
            elapsed = max(time.monotonic() - self.start, 1e-9)
            self.reporter.progress(
                self.phase,
                self.files,
                self.nbytes,
                total_files=self.total_files,
                total_bytes=self.total_bytes,
                cached=self.cached or None,
                elapsed_s=round(elapsed, 2),
                mb_per_s=round(self.nbytes / elapsed / 1e6, 2),
                status="complete" if final else "running",
            )


# --------------------------------------------------------------------------------------------------------------
# Small helpers shared with entrypoint.py (host side)
# --------------------------------------------------------------------------------------------------------------
def parse_dotted(path: str) -> list[str | int]:
    """Split ``a.b[0].c`` into ``["a", "b", 0, "c"]``.

    :param path: a dotted path into a nested spec; ``[N]`` indexes a list.
    """
    parts: list[str | int] = []
    for raw in path.split("."):
        match = re.match(r"^([^\[\]]*)((?:\[\d+\])*)$", raw)
        if not match or (not match.group(1) and not match.group(2)):
            raise ValueError(f"bad path {path!r}: empty or malformed segment {raw!r}")
        if match.group(1):
            parts.append(match.group(1))
        parts.extend(int(i) for i in re.findall(r"\[(\d+)\]", match.group(2)))
    return parts


_MISSING = object()


def get_path(tree: Any, path: str) -> Any:
    """The value at a dotted path, or the module's ``_MISSING`` sentinel.

    :param tree: nested dicts / lists.
    :param path: dotted path.
    """
    node = tree
    for part in parse_dotted(path):
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                return _MISSING
            node = node[part]
        else:
            if not isinstance(node, dict) or part not in node:
                return _MISSING
            node = node[part]
    return node


def set_path(tree: Any, path: str, value: Any) -> None:
    """Set the value at a dotted path; the parent must exist.

    :param tree: nested dicts / lists.
    :param path: dotted path.
    :param value: new value.
    """
    parts = parse_dotted(path)
    node = tree
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value


def output_dir_name(key: str, mode: str) -> str:
    """The folder name of an output under the job's results dir: ``train.results_dir`` -> ``train_results_dir``.

    Passthrough outputs (container paths) use their base name, as the seeds do.

    :param key: the declared output key (dotted path, arg name or container path).
    :param mode: ``config``, ``args`` or ``passthrough``.
    """
    if mode == "passthrough":
        key = os.path.basename(key.rstrip("/")) or "output"
    name = re.sub(r"[^A-Za-z0-9_]+", "_", key).strip("_")
    return name or "output"


def is_remote(value: str) -> bool:
    """True for a URI with a scheme (``s3://``, ``hf_model://`` ...)."""
    return "://" in value


def parse_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> ``("bucket", "key")``.

    :param uri: an ``s3://`` URI.
    """
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[5:].partition("/")
    if not bucket:
        raise ValueError(f"s3 URI without a bucket: {uri!r}")
    return bucket, key


def mount_mapping(mount_path: str, uri: str) -> str:
    """The seeds' Lustre mapping ``s3://bucket/path`` -> ``<mount>/bucket/path``.

    :param mount_path: the shared cache root.
    :param uri: an ``s3://`` URI.
    """
    bucket, key = parse_s3(uri)
    return os.path.join(mount_path, bucket, *[p for p in key.split("/") if p])


def _safe_relpath(rel: str) -> str:
    parts = [p for p in rel.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        raise ConfigError(f"refusing unsafe object name {rel!r} (empty or contains '..')")
    return os.path.join(*parts)


def _excluded(rel: str, patterns: Sequence[str]) -> bool:
    rel = rel.replace(os.sep, "/")
    base = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(base, p) for p in patterns)


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# --------------------------------------------------------------------------------------------------------------
# Spec writers
# --------------------------------------------------------------------------------------------------------------
_TOML_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f"}


def _toml_str(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _toml_key(key: str) -> str:
    return key if _TOML_BARE_KEY.fullmatch(key) else _toml_str(key)


def _toml_value(value: Any, where: str) -> str:
    if value is None:
        raise ValueError(f"{where}: TOML has no null; give a value or use config_format='yaml'/'json'")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise ValueError(f"{where}: NaN/Infinity are not allowed")
        return repr(value)
    if isinstance(value, str):
        return _toml_str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v, f"{where}[{i}]") for i, v in enumerate(value)) + "]"
    if isinstance(value, dict):
        items = ("{} = {}".format(_toml_key(k), _toml_value(v, f"{where}.{k}")) for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    raise ValueError(f"{where}: cannot write {type(value).__name__} to TOML")


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def dumps_toml(data: Mapping[str, Any]) -> str:
    """A TOML 1.0 document for nested dicts (stdlib only; round-trips through ``tomllib``).

    :param data: the spec.
    """
    lines: list[str] = []

    def table(tbl: Mapping[str, Any], keys: list[str]) -> None:
        where = ".".join(keys) or "spec"
        for key, value in tbl.items():
            if not isinstance(value, dict) and not _is_table_array(value):
                lines.append("{} = {}".format(_toml_key(key), _toml_value(value, f"{where}.{key}")))
        for key, value in tbl.items():
            if isinstance(value, dict):
                sub = [*keys, key]
                lines.append("")
                lines.append("[{}]".format(".".join(_toml_key(k) for k in sub)))
                table(value, sub)
        for key, value in tbl.items():
            if _is_table_array(value):
                sub = [*keys, key]
                for item in value:
                    lines.append("")
                    lines.append("[[{}]]".format(".".join(_toml_key(k) for k in sub)))
                    table(item, sub)

    table(data, [])
    return "\n".join(lines).lstrip("\n") + "\n"


_YAML_BREAKS = re.compile("[\x85\u2028\u2029\ufeff]")


def _has_yaml_breaks(node: Any) -> bool:
    if isinstance(node, str):
        return bool(_YAML_BREAKS.search(node))
    if isinstance(node, dict):
        return any(_has_yaml_breaks(k) or _has_yaml_breaks(v) for k, v in node.items())
    if isinstance(node, list):
        return any(_has_yaml_breaks(v) for v in node)
    return False


def dumps_spec(spec: Mapping[str, Any], fmt: str) -> tuple[str, str]:
    """Serialise the spec; returns ``(text, format actually written)``.

    YAML needs PyYAML; without it the JSON text is written instead (JSON is valid YAML 1.2).

    :param spec: the spec.
    :param fmt: ``yaml``, ``toml`` or ``json``.
    """
    if fmt == "toml":
        return dumps_toml(spec), "toml"
    if fmt == "yaml":
        try:
            import yaml
        except ImportError:
            pass  # JSON below is valid YAML
        else:
            # PyYAML emits NEL / LS / PS / BOM raw under allow_unicode and reads them back changed; escape then.
            text = yaml.safe_dump(
                spec,
                sort_keys=False,
                allow_unicode=not _has_yaml_breaks(spec),
                default_flow_style=False,
                width=2**31 - 1,
            )
            return text, "yaml"
    return json.dumps(spec, indent=2, ensure_ascii=False, allow_nan=False) + "\n", "json"


# --------------------------------------------------------------------------------------------------------------
# Atomic local files
# --------------------------------------------------------------------------------------------------------------
def _temp_beside(path: str) -> tuple[int, str]:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    return tempfile.mkstemp(prefix="." + os.path.basename(path)[:80] + ".", suffix=PART_SUFFIX, dir=directory)


def write_atomic(path: str, data: bytes) -> None:
    """Write a file so readers see the old content or the new one, never a part.

    :param path: destination.
    :param data: content.
    """
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def sha256_file(path: str) -> tuple[int, str]:
    """``(size, sha256 hex)`` of a local file.

    :param path: the file.
    """
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(4 << 20)
            if not chunk:
                break
            size += len(chunk)
            digest.update(chunk)
    return size, digest.hexdigest()


def copy_atomic(src: str, dst: str, progress: Progress | None = None) -> tuple[int, str]:
    """Copy a file through a temp file + rename, hashing on the way; returns ``(size, sha256)``.

    :param src: source file.
    :param dst: destination file.
    :param progress: counters to advance.
    """
    digest = hashlib.sha256()
    size = 0
    fd, tmp = _temp_beside(dst)
    try:
        with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
            while True:
                chunk = fin.read(4 << 20)
                if not chunk:
                    break
                fout.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                if progress is not None:
                    progress.add(nbytes=len(chunk))
        shutil.copymode(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        _unlink(tmp)
        raise
    return size, digest.hexdigest()


def walk_files(root: str, excludes: Sequence[str] = ()) -> list[tuple[str, str]]:
    """``[(relative posix path, absolute path)]`` of the regular files under ``root``, sorted.

    Skips the manifest at the root, the runner's own temp files and anything matching ``excludes``.

    :param root: a folder.
    :param excludes: fnmatch patterns matched against the relative path and the base name.
    """
    found: list[tuple[str, str]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == os.curdir:
            dirnames[:] = [d for d in dirnames if d != CACHE_META_DIR]
        for name in sorted(filenames):
            rel = name if rel_dir == os.curdir else os.path.join(rel_dir, name)
            rel = rel.replace(os.sep, "/")
            full = os.path.join(dirpath, name)
            if rel == MANIFEST_NAME or name.endswith(PART_SUFFIX) or not os.path.isfile(full):
                continue
            if _excluded(rel, excludes):
                continue
            found.append((rel, full))
    return found


# --------------------------------------------------------------------------------------------------------------
# S3
# --------------------------------------------------------------------------------------------------------------
class _Pool:
    """One thread pool for a whole transfer batch; the first failure stops what has not started."""

    def __init__(self, workers: int) -> None:
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tao-xfer")
        self.failed = threading.Event()
        self.errors: list[BaseException] = []
        self.lock = threading.Lock()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        def run() -> None:
            if self.failed.is_set():
                return
            try:
                fn(*args)
            except BaseException as exc:
                with self.lock:
                    self.errors.append(exc)
                self.failed.set()

        self.executor.submit(run)

    def wait(self) -> None:
        self.executor.shutdown(wait=True)
        if self.errors:
            raise self.errors[0]


class _Countdown:
    """Runs ``done`` once, in the thread that finishes the last of ``n`` parts."""

    def __init__(self, n: int, done: Callable[[], None]) -> None:
        self.left = n
        self.done = done
        self.lock = threading.Lock()

    def tick(self) -> None:
        with self.lock:
            self.left -= 1
            last = self.left == 0
        if last:
            self.done()


class S3Object:
    """One object to move.

    :param bucket: bucket.
    :param key: object key.
    :param size: bytes.
    :param etag: the ETag (quoted, as S3 returns it), when known.
    :param local: local file path.
    :param meta: cache sidecar path (downloads into a shared cache only).
    """

    def __init__(self, bucket: str, key: str, size: int, etag: str, *, local: str, meta: str | None = None) -> None:
        self.bucket = bucket
        self.key = key
        self.size = size
        self.etag = etag
        self.local = local
        self.meta = meta
        self.sha256 = ""

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


class S3:
    """A thin, concurrent S3 client: multipart for big files, a thread pool for many files.

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
        self.concurrency = _env_int("TAO_TRANSFER_CONCURRENCY", 16)
        self.part_size = _env_int("TAO_PART_SIZE_MB", 8) << 20
        self.threshold = self.part_size
        self.retries = _env_int("TAO_TRANSFER_RETRIES", 3)
        config = botocore.config.Config(
            retries={"max_attempts": _env_int("TAO_S3_MAX_ATTEMPTS", 5), "mode": "standard"},
            max_pool_connections=self.concurrency + 4,
            connect_timeout=_env_float("TAO_S3_CONNECT_TIMEOUT", 10.0),
            read_timeout=_env_float("TAO_S3_READ_TIMEOUT", 60.0),
        )
        kwargs: dict[str, Any] = {"config": config}
        # Older botocore does not read AWS_ENDPOINT_URL by itself.
        if os.environ.get("AWS_ENDPOINT_URL"):
            kwargs["endpoint_url"] = os.environ["AWS_ENDPOINT_URL"]
        if os.environ.get("AWS_DEFAULT_REGION"):
            kwargs["region_name"] = os.environ["AWS_DEFAULT_REGION"]
        self.client = boto3.session.Session().client("s3", **kwargs)

    # -- error classification ------------------------------------------------------------------------------
    def classify(self, exc: BaseException, what: str) -> RunnerError:
        """Map a botocore / socket error to ERR_CONFIG or ERR_INFRA.

        :param exc: the exception.
        :param what: the URI concerned (for the message).
        """
        if isinstance(exc, RunnerError):
            return exc
        exc_mod = self.exceptions
        if isinstance(exc, exc_mod.NoCredentialsError):
            return ConfigError(f"{what}: no S3 credentials in the job environment (AWS_ACCESS_KEY_ID)")
        if isinstance(exc, exc_mod.ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code in _S3_NOT_FOUND or status == 404:
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

    # -- transfers -----------------------------------------------------------------------------------------
    def download(self, objects: Sequence[S3Object], progress: Progress) -> None:
        """Download objects concurrently; each lands atomically (temp file beside it + rename).

        :param objects: what to fetch (``local`` is the final path).
        :param progress: counters.
        """
        pool = _Pool(self.concurrency)
        partials: list[_Partial] = []
        try:
            for obj in objects:
                if obj.meta and cache_hit(obj):
                    progress.add(files=1, cached=1)
                    continue
                if obj.meta:
                    _unlink(obj.meta)  # data may change below; never leave an old etag beside new bytes
                if obj.size < self.threshold:
                    pool.submit(self._get_small, obj, progress)
                    continue
                partial = _Partial(obj)
                partials.append(partial)
                part = max(self.part_size, -(-obj.size // 9000))
                ranges = [(o, min(o + part, obj.size) - 1) for o in range(0, obj.size, part)]
                countdown = _Countdown(len(ranges), functools.partial(partial.finish, progress))
                for start, end in ranges:
                    pool.submit(self._get_range, obj, partial.fd, (start, end), countdown, progress)
            pool.wait()
        except BaseException:
            pool.failed.set()
            pool.executor.shutdown(wait=True)
            raise
        finally:
            for partial in partials:
                partial.discard()

    def _get_kwargs(self, obj: S3Object) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"Bucket": obj.bucket, "Key": obj.key}
        if obj.etag:
            kwargs["IfMatch"] = obj.etag  # never splice two versions of an object
        return kwargs

    def _get_small(self, obj: S3Object, progress: Progress) -> None:
        def run() -> bytes:
            body = self.client.get_object(**self._get_kwargs(obj))["Body"]
            try:
                data: bytes = body.read()
            finally:
                body.close()
            return data

        data = self._retrying(obj.uri, run)
        if len(data) != obj.size:
            raise InfraError(f"{obj.uri}: got {len(data)} bytes, expected {obj.size}")
        write_atomic(obj.local, data)
        if obj.meta:
            write_cache_meta(obj)
        progress.add(files=1, nbytes=len(data))

    def _get_range(
        self, obj: S3Object, fd: int, span: tuple[int, int], countdown: _Countdown, progress: Progress
    ) -> None:
        start, end = span

        def run() -> None:
            resp = self.client.get_object(Range=f"bytes={start}-{end}", **self._get_kwargs(obj))
            body = resp["Body"]
            pos = start
            try:
                while True:
                    chunk = body.read(1 << 20)
                    if not chunk:
                        break
                    os.pwrite(fd, chunk, pos)
                    pos += len(chunk)
                    progress.add(nbytes=len(chunk))
            finally:
                body.close()
            if pos != end + 1:
                progress.add(nbytes=start - pos)
                raise OSError(f"short read of {obj.uri}: {pos - start} of {end + 1 - start} bytes")

        self._retrying(obj.uri, run)
        countdown.tick()

    def upload(self, objects: Sequence[S3Object], progress: Progress) -> None:
        """Upload local files concurrently (multipart above the part size); sets each object's ``sha256``.

        :param objects: what to send (``local`` is the source file, ``size`` its size).
        :param progress: counters.
        """
        pool = _Pool(self.concurrency)
        started: list[tuple[S3Object, str]] = []
        try:
            for obj in objects:
                if obj.size < self.threshold:
                    pool.submit(self._put_small, obj, progress)
                    continue
                # CRC32 on create + parts, as s3transfer does: S3 then validates each part and the whole object.
                create = functools.partial(
                    self.client.create_multipart_upload, Bucket=obj.bucket, Key=obj.key, ChecksumAlgorithm="CRC32"
                )
                upload_id = str(self._retrying(obj.uri, create)["UploadId"])
                started.append((obj, upload_id))
                part = max(self.part_size, -(-obj.size // 9000))
                ranges = list(enumerate(range(0, obj.size, part), start=1))
                mp = _Multipart(obj, upload_id)
                mp.countdown = _Countdown(len(ranges) + 1, functools.partial(self._complete, mp, progress))
                pool.submit(self._hash, obj, mp.countdown)
                for number, offset in ranges:
                    pool.submit(self._put_part, mp, (number, offset, min(part, obj.size - offset)), progress)
            pool.wait()
        except BaseException:
            pool.failed.set()
            pool.executor.shutdown(wait=True)
            for obj, upload_id in started:
                with contextlib.suppress(Exception):  # best effort; a lifecycle rule cleans what is left
                    self.client.abort_multipart_upload(Bucket=obj.bucket, Key=obj.key, UploadId=upload_id)
            raise

    def _put_small(self, obj: S3Object, progress: Progress) -> None:
        with open(obj.local, "rb") as fh:
            data = fh.read()
        obj.sha256 = hashlib.sha256(data).hexdigest()
        obj.size = len(data)
        self._retrying(obj.uri, lambda: self.client.put_object(Bucket=obj.bucket, Key=obj.key, Body=data))
        progress.add(files=1, nbytes=len(data))

    def _hash(self, obj: S3Object, countdown: _Countdown) -> None:
        size, obj.sha256 = sha256_file(obj.local)
        if size != obj.size:
            raise ConfigError(f"{obj.local} changed while it was being uploaded")
        countdown.tick()

    def _put_part(self, mp: _Multipart, part: tuple[int, int, int], progress: Progress) -> None:
        number, offset, length = part
        obj = mp.obj
        with open(obj.local, "rb") as fh:
            data = os.pread(fh.fileno(), length, offset)
        send = functools.partial(
            self.client.upload_part,
            Bucket=obj.bucket,
            Key=obj.key,
            UploadId=mp.upload_id,
            PartNumber=number,
            Body=data,
            ChecksumAlgorithm="CRC32",
        )
        resp = self._retrying(obj.uri, send)
        # Echo the part's checksum back on completion, as s3transfer does (S3 then checks the whole object).
        mp.etags[number] = {k: v for k, v in resp.items() if k == "ETag" or k.startswith("Checksum")}
        progress.add(nbytes=len(data))
        if mp.countdown is not None:
            mp.countdown.tick()

    def _complete(self, mp: _Multipart, progress: Progress) -> None:
        parts = [{"PartNumber": n, **mp.etags[n]} for n in sorted(mp.etags)]
        finish = functools.partial(
            self.client.complete_multipart_upload,
            Bucket=mp.obj.bucket,
            Key=mp.obj.key,
            UploadId=mp.upload_id,
            MultipartUpload={"Parts": parts},
        )
        self._retrying(mp.obj.uri, finish)
        progress.add(files=1)

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


class _Multipart:
    """An upload in progress: its id, the ETags of the parts sent, and what completes it."""

    def __init__(self, obj: S3Object, upload_id: str) -> None:
        self.obj = obj
        self.upload_id = upload_id
        self.etags: dict[int, dict[str, str]] = {}
        self.countdown: _Countdown | None = None


class _Partial:
    """A download in progress: a preallocated temp file beside the destination, renamed when complete."""

    def __init__(self, obj: S3Object) -> None:
        self.obj = obj
        self.fd, self.tmp = _temp_beside(obj.local)
        self.done = False
        os.ftruncate(self.fd, obj.size)

    def finish(self, progress: Progress) -> None:
        os.close(self.fd)
        self.fd = -1
        if os.path.getsize(self.tmp) != self.obj.size:
            raise InfraError(f"{self.obj.uri}: incomplete download")
        os.replace(self.tmp, self.obj.local)
        self.done = True
        if self.obj.meta:
            write_cache_meta(self.obj)
        progress.add(files=1)

    def discard(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
        if not self.done:
            _unlink(self.tmp)


def cache_hit(obj: S3Object) -> bool:
    """A cached copy counts only when its size AND the source's ETag still match the sidecar.

    :param obj: the object, with ``local`` in the cache and ``meta`` its sidecar.
    """
    try:
        if os.stat(obj.local).st_size != obj.size or not obj.meta:
            return False
        with open(obj.meta, encoding="utf-8") as fh:
            meta = json.load(fh)
    except (OSError, ValueError):
        return False
    return bool(obj.etag) and meta.get("etag") == obj.etag and meta.get("size") == obj.size


def write_cache_meta(obj: S3Object) -> None:
    """Record which version of the source the cached file holds (after the data is in place).

    :param obj: the downloaded object.
    """
    if obj.meta:
        meta = {"source": obj.uri, "etag": obj.etag, "size": obj.size, "fetched_at": _now_iso()}
        write_atomic(obj.meta, json.dumps(meta).encode("utf-8"))


# --------------------------------------------------------------------------------------------------------------
# Manifests (also used by the operator to read results)
# --------------------------------------------------------------------------------------------------------------
def build_manifest(
    job_id: str,
    key: str,
    destination: str,
    exit_code: int | None,
    files: Sequence[tuple[str, int, str]],
    *,
    outputs: Mapping[str, str] | None = None,
) -> bytes:
    """The manifest document for one output destination.

    :param job_id: the job.
    :param key: the declared output key.
    :param destination: where the files are.
    :param exit_code: the command's exit code.
    :param files: ``[(relative path, size, sha256)]``.
    :param outputs: job-level manifest only: every committed output key -> its destination.
    """
    entries = [{"path": p, "size": s, "sha256": h} for p, s, h in sorted(files)]
    doc: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "job_id": job_id,
        "key": key,
        "destination": destination,
        "exit_code": exit_code,
        "created_at": _now_iso(),
        "file_count": len(entries),
        "total_bytes": sum(size for _p, size, _h in files),
        "files": entries,
    }
    if outputs is not None:
        doc["outputs"] = dict(outputs)
    return (json.dumps(doc, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def _manifest_location(location: str) -> str:
    location = location.rstrip("/") if location not in ("/", "s3://") else location
    if location.startswith("file://"):
        location = location[len("file://") :]
    return location + "/" + MANIFEST_NAME


def read_manifest(location: str, s3_client: Any = None) -> dict[str, Any] | None:
    """The manifest of an output destination, or None when there is none (= not committed / incomplete).

    :param location: the destination folder: a local path, ``file://`` or ``s3://bucket/prefix``.
    :param s3_client: a boto3 S3 client to use (e.g. from the amazon provider's S3Hook); default: a new one.
    """
    path = _manifest_location(location)
    try:
        if path.startswith("s3://"):
            bucket, key = parse_s3(path)
            client = s3_client if s3_client is not None else S3().client
            try:
                body = client.get_object(Bucket=bucket, Key=key)["Body"]
            except Exception as exc:
                code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
                if code in _S3_NOT_FOUND:
                    return None
                raise
            raw = body.read()
        else:
            with open(path, "rb") as fh:
                raw = fh.read()
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("files"), list) else None


def is_complete(location: str, s3_client: Any = None, verify: str = "size") -> bool:
    """True only when the destination has a manifest and (by default) every listed file is there.

    :param location: the destination folder (local path, ``file://`` or ``s3://``).
    :param s3_client: a boto3 S3 client to use.
    :param verify: ``"none"`` (manifest present), ``"size"`` (files present with their sizes), ``"sha256"``
        (local destinations: contents re-hashed; on S3 same as ``"size"``).
    """
    manifest = read_manifest(location, s3_client=s3_client)
    if manifest is None:
        return False
    if verify == "none":
        return True
    base = _manifest_location(location)[: -len(MANIFEST_NAME) - 1]
    if base.startswith("s3://"):
        bucket, prefix = parse_s3(base)
        client = s3_client if s3_client is not None else S3().client
        sizes: dict[str, int] = {}
        root = prefix + "/" if prefix else ""  # a bucket-root destination has no prefix
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=root):
            for obj in page.get("Contents", []) or []:
                sizes[obj["Key"][len(root) :]] = int(obj["Size"])
        return all(sizes.get(f["path"]) == f["size"] for f in manifest["files"])
    for entry in manifest["files"]:
        full = os.path.join(base, *entry["path"].split("/"))
        try:
            if os.path.getsize(full) != entry["size"]:
                return False
        except OSError:
            return False
        if verify == "sha256" and sha256_file(full)[1] != entry["sha256"]:
            return False
    return True


# --------------------------------------------------------------------------------------------------------------
# The job
# --------------------------------------------------------------------------------------------------------------
class OutputUnit:
    """One output destination committed with its own manifest.

    :param key: the declared key (dotted path, arg name, container path).
    :param kind: ``folder`` or ``file``.
    :param local: the local folder that holds the files when the command ends.
    :param dest: the final folder: a local path or an ``s3://`` prefix (no trailing slash).
    :param filename: for ``file`` outputs, the file's name inside ``local``.
    :param source: passthrough only: the container path the command writes.
    """

    def __init__(
        self, key: str, kind: str, local: str, dest: str, *, filename: str = "", source: str | None = None
    ) -> None:
        self.key = key
        self.kind = kind
        self.local = local
        self.dest = dest
        self.filename = filename
        self.source = source
        self.committed = False

    @property
    def value(self) -> str:
        """What the spec / args get: the folder, or the file inside it."""
        return os.path.join(self.local, self.filename) if self.kind == "file" else self.local


MODEL_SCHEMES = ("ngc://", "hf_model://", "hf_dataset://")


def _set_item(node: Any, key: Any, value: str) -> None:
    node[key] = value


def _ignore(_value: str) -> None:
    """Setter for inputs that are not referenced by a spec (passthrough)."""


class InputItem:
    """One input to stage.

    :param uri: the source.
    :param setter: called with the local path once staged (rewrites the spec / args value).
    :param target: an exact local path asked for (passthrough container path, ``container_path``).
    :param sub: the default folder name under ``<work>/inputs``.
    """

    def __init__(
        self, uri: str, setter: Callable[[str], None], target: str | None = None, sub: str | None = None
    ) -> None:
        self.uri = uri
        self.setter = setter
        self.target = target
        self.sub = sub


class Job:
    """One run of the runner, driven by a ``runner.json`` manifest.

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
        self.outputs: list[OutputUnit] = []
        self.config_path: str | None = None
        self.spec: Any = json.loads(json.dumps(manifest.get("specs"))) if self.mode == "config" else None
        self.args: dict[str, Any] = dict(manifest.get("args") or {}) if self.mode == "args" else {}
        self.exit_code: int | None = None

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

    # -- outputs ---------------------------------------------------------------------------------------------
    def plan_outputs(self) -> None:
        """Decide every output's local folder and final destination; fill spec / args values."""
        declared = self.m.get("outputs") or {}
        for key, raw_cfg in declared.items():
            cfg = raw_cfg or {}
            if self.mode == "passthrough":
                self.outputs.append(self._passthrough_output(key, cfg))
                continue
            tree = self.spec if self.mode == "config" else self.args
            current = get_path(tree, key) if self.mode == "config" else tree.get(key, _MISSING)
            unit = self._spec_output(key, cfg, None if current is _MISSING else current)
            self.outputs.append(unit)
            if self.mode == "config":
                try:
                    set_path(self.spec, key, unit.value)
                except (KeyError, IndexError, TypeError):
                    raise ConfigError(f"outputs: the spec has no parent for {key!r}") from None
            else:
                self.args[key] = unit.value
        for unit in self.outputs:
            if unit.source is None:
                os.makedirs(unit.local, exist_ok=True)

    def _spec_output(self, key: str, cfg: Mapping[str, Any], value: Any) -> OutputUnit:
        kind = str(cfg.get("type") or "folder")
        name = output_dir_name(key, self.mode)
        text = value if isinstance(value, str) else ""
        filename = ""
        if kind == "file":
            filename = os.path.basename(text.rstrip("/")) or name
        if text.startswith("s3://"):
            dest = text.rstrip("/")
            if kind == "file":
                dest = dest.rsplit("/", 1)[0] if "/" in dest[5:] else dest
            local = (
                mount_mapping(self.mount_path, dest) if self.mount_path else os.path.join(self.work, "outputs", name)
            )
            return OutputUnit(key, kind, local, dest, filename=filename)
        if text.startswith("file://"):
            text = text[len("file://") :]
        if os.path.isabs(text):
            folder = os.path.dirname(text.rstrip("/")) if kind == "file" else text.rstrip("/") or "/"
            return OutputUnit(key, kind, folder, folder, filename=filename)
        if is_remote(text):
            raise ConfigError(f"outputs[{key!r}]: unsupported destination {text!r} (use s3:// or an absolute path)")
        # Relative or empty: auto-fill under the job's results dir, as the seeds do.
        dest = self.results_dest + "/" + name
        return OutputUnit(key, kind, os.path.join(self.results_local, name), dest, filename=filename)

    def _passthrough_output(self, path: str, cfg: Mapping[str, Any]) -> OutputUnit:
        name = output_dir_name(path, "passthrough")
        override = str(cfg.get("destination") or "")
        if override.startswith("s3://"):
            dest = override.rstrip("/")
            local = os.path.join(self.work, "outputs", name)
        elif override:
            dest = local = override.rstrip("/")
        else:
            dest = self.results_dest + "/" + name
            local = os.path.join(self.results_local, name)
        return OutputUnit(path, "folder", local, dest, source=path)

    # -- inputs ----------------------------------------------------------------------------------------------
    def stage_inputs(self) -> None:
        """Download every declared input (and, in config mode, every ngc:// / hf_*:// value)."""
        declared: Mapping[str, Any] = self.m.get("inputs") or {}
        items: list[InputItem] = []
        if self.mode == "passthrough":
            for target, uri in declared.items():
                items.append(InputItem(str(uri), _ignore, target=target))
        else:
            tree = self.spec if self.mode == "config" else self.args
            for key, cfg in declared.items():
                value = get_path(tree, key) if self.mode == "config" else tree.get(key, _MISSING)
                if value is _MISSING or value is None or value == "":
                    self.r.info(f"input {key} is empty; skipped")
                    continue
                forced = (cfg or {}).get("container_path") or None
                name = output_dir_name(key, self.mode)
                if isinstance(value, list):
                    for idx, item in enumerate(value):
                        items.append(
                            InputItem(
                                self._check_uri(key, item),
                                self._setter(key, idx),
                                target=os.path.join(forced, str(idx)) if forced else None,
                                sub=os.path.join(name, str(idx)),
                            )
                        )
                else:
                    items.append(
                        InputItem(self._check_uri(key, value), self._setter(key, None), target=forced, sub=name)
                    )
            if self.mode == "config":
                items.extend(self._model_refs(set(declared)))
        self._fetch(items)

    @staticmethod
    def _check_uri(key: str, value: Any) -> str:
        if not isinstance(value, str):
            raise ConfigError(f"inputs[{key!r}]: expected a URI or path, got {type(value).__name__}")
        return value

    def _setter(self, key: str, idx: int | None) -> Callable[[str], None]:
        def set_value(local: str) -> None:
            if self.mode == "config":
                if idx is None:
                    set_path(self.spec, key, local)
                else:
                    get_path(self.spec, key)[idx] = local
            elif idx is None:
                self.args[key] = local
            else:
                self.args[key][idx] = local

        return set_value

    def _model_refs(self, declared: set[str]) -> list[InputItem]:
        """Every ngc:// and hf_*:// value anywhere in the spec (pretrained models), as the SDK stages them."""
        found: list[InputItem] = []

        def walk(node: Any, path: str) -> None:
            items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
            for k, v in items:
                sub = f"{path}[{k}]" if isinstance(k, int) else (f"{path}.{k}" if path else k)
                if isinstance(v, str) and v.startswith(MODEL_SCHEMES):
                    if sub not in declared:
                        found.append(
                            InputItem(
                                v,
                                functools.partial(_set_item, node, k),
                                sub=os.path.join("ptm", output_dir_name(sub, "config")),
                            )
                        )
                else:
                    walk(v, sub)

        walk(self.spec, "")
        return found

    def _fetch(self, items: Sequence[InputItem]) -> None:
        objects: list[S3Object] = []
        after: list[Callable[[], None]] = []
        for item in items:
            uri = item.uri
            if uri.startswith("s3://"):
                after.append(self._plan_s3(item, objects))
            elif uri.startswith(MODEL_SCHEMES):
                after.append(functools.partial(self._stage_model, item))
            else:
                local = uri[len("file://") :] if uri.startswith("file://") else uri
                if not os.path.isabs(local) or is_remote(local):
                    raise ConfigError(
                        f"input {uri!r}: unsupported scheme (use s3://, file://, an absolute path, "
                        "hf_model://, hf_dataset:// or ngc://)"
                    )
                if not os.path.exists(local):
                    raise ConfigError(f"input {uri}: file not found")
                if item.target:
                    after.append(functools.partial(_copy_path, local, item.target))
                    after.append(functools.partial(item.setter, item.target))
                else:
                    after.append(functools.partial(item.setter, local))
        total = sum(o.size for o in objects)
        progress = Progress(self.r, "download", len(objects), total)
        progress.emit()
        with Ticker(self.r.interval, progress.emit):
            if objects:
                self.s3.download(objects, progress)
            for step in after:
                step()
        progress.emit(final=True)

    def _plan_s3(self, item: InputItem, objects: list[S3Object]) -> Callable[[], None]:
        """Queue the objects of one s3:// input; returns what to do once they are local."""
        kind, listing = self.s3.resolve(item.uri)
        bucket, key = parse_s3(item.uri)
        # The shared cache (seeds' Lustre mapping) is used unless the input asks for an exact local path;
        # passthrough inputs are linked from the cache to their container path.
        use_cache = bool(self.mount_path) and (item.target is None or self.mode == "passthrough")
        if use_cache:
            local_root = mount_mapping(self.mount_path or "", item.uri)
        elif item.target:
            local_root = item.target
        else:
            local_root = os.path.join(self.work, "inputs", item.sub or "input")
            if kind == "file":
                local_root = os.path.join(local_root, os.path.basename(key) or "data")
        if kind == "file":
            targets = [(listing[0], local_root)]
        else:
            prefix = key if (not key or key.endswith("/")) else key + "/"
            os.makedirs(local_root, exist_ok=True)
            targets = [(entry, os.path.join(local_root, _safe_relpath(entry[0][len(prefix) :]))) for entry in listing]
        for (obj_key, size, etag), local in targets:
            meta = self._meta(bucket, obj_key) if use_cache else None
            objects.append(S3Object(bucket, obj_key, size, etag, local=local, meta=meta))
        value = local_root + ("/" if item.uri.endswith("/") and kind == "folder" else "")
        if self.mode == "passthrough" and use_cache and item.target:
            return functools.partial(_link_or_copy, local_root, item.target)
        return functools.partial(item.setter, value)

    def _meta(self, bucket: str, key: str) -> str:
        return os.path.join(self.mount_path or "", CACHE_META_DIR, bucket, *[p for p in key.split("/") if p]) + ".json"

    def _stage_model(self, item: InputItem) -> None:
        item.setter(self._fetch_model(item))

    def _fetch_model(self, item: InputItem) -> str:
        """Download an ``hf_model://``, ``hf_dataset://`` or ``ngc://`` reference; returns the local path."""
        uri = item.uri
        dest = item.target or os.path.join(self.work, "inputs", item.sub or "ptm")
        os.makedirs(dest, exist_ok=True)
        if uri.startswith("ngc://"):
            return self._fetch_ngc(uri, dest)
        repo_type = "dataset" if uri.startswith("hf_dataset://") else "model"
        repo_id, _, revision = uri.split("://", 1)[1].partition("@")
        try:
            import huggingface_hub
        except ImportError:
            raise missing_package("huggingface_hub", "hf_model:// / hf_dataset:// inputs", self.wheels) from None
        try:
            huggingface_hub.snapshot_download(
                repo_id=repo_id,
                repo_type=repo_type,
                revision=revision or None,
                local_dir=dest,
                token=os.environ.get("HF_TOKEN") or None,
            )
        except Exception as exc:
            raise _classify_hub(exc, uri) from exc
        return dest

    def _fetch_ngc(self, uri: str, dest: str) -> str:
        ref = uri[len("ngc://") :]
        parts = ref.split("/")
        if len(parts) not in (2, 3) or ":" not in parts[-1]:
            raise ConfigError(f"input {uri}: expected ngc://org/[team/]model:version")
        if not os.environ.get("NGC_KEY"):
            raise ConfigError(f"input {uri}: NGC_KEY is not set in the job environment")
        try:
            import ngcsdk
        except ImportError:
            raise missing_package("ngcsdk", "ngc:// inputs", self.wheels) from None
        org = parts[0]
        team = parts[1] if len(parts) == 3 else "no-team"
        try:
            client = ngcsdk.Client()
            client.configure(api_key=os.environ["NGC_KEY"], org_name=org, team_name=team)
            client.registry.model.download_version(ref, destination=dest)
        except Exception as exc:
            raise _classify_hub(exc, uri) from exc
        for dirpath, _dirs, files in sorted(os.walk(dest)):
            for name in sorted(files):
                if name.endswith(MODEL_FILE_EXTENSIONS):
                    return os.path.join(dirpath, name)
        return dest

    # -- spec --------------------------------------------------------------------------------------------------
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

    # -- command -----------------------------------------------------------------------------------------------
    def argv(self) -> list[str]:
        """The command as argv: a string under exactly one ``/bin/bash -c``, a list as is; args appended."""
        command = self.m.get("command")
        values = {"{config_path}": self.config_path or "", "{results_dir}": self.results_local, "{job_id}": self.job_id}
        tokens = args_tokens(self.args) if self.mode == "args" else []
        if isinstance(command, str):
            script = replace_placeholders(command, values, quote=True)
            if tokens:
                script = script.rstrip() + " " + " ".join(shlex.quote(t) for t in tokens)
            return ["/bin/bash", "-c", script]
        if isinstance(command, list) and command and all(isinstance(c, str) for c in command):
            return [replace_placeholders(c, values, quote=False) for c in command] + tokens
        raise ConfigError("runner.json: command must be a string or a list of strings")

    def run_command(self) -> int:
        """Run the command, forwarding its output and signals; returns its exit code (128+N for signal N)."""
        argv = self.argv()
        env = dict(os.environ)
        env["TAO_JOB_ID"] = self.job_id
        env["TAO_RESULTS_DIR"] = self.results_local
        if self.config_path:
            env["TAO_CONFIG_PATH"] = self.config_path
        env.setdefault("PYTHONUNBUFFERED", "1")  # so training steps reach the log (and the step parser) live
        watcher = StepWatcher(self.r)
        self.r.progress("run", status="starting")
        try:
            # Its own process group: a background process it leaves behind (``tensorboard &``) can be found and
            # stopped, and a cancel reaches every process of the command, not only the first one.
            proc = subprocess.Popen(
                argv,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            raise ConfigError(f"cannot start the command: {exc}") from None
        previous = {}

        def forward(signum: int, _frame: Any) -> None:
            with contextlib.suppress(OSError):
                if signum in GROUP_SIGNALS:
                    os.killpg(proc.pid, signum)
                else:  # SIGUSR1/2 ask the trainer for something (a checkpoint); helpers would die of them
                    proc.send_signal(signum)

        for sig in (*GROUP_SIGNALS, signal.SIGUSR1, signal.SIGUSR2):
            with contextlib.suppress(ValueError, OSError):
                previous[sig] = signal.signal(sig, forward)
        pumps = [
            threading.Thread(target=_pump, args=(proc.stdout, self.r, True, watcher), daemon=True),
            threading.Thread(target=_pump, args=(proc.stderr, self.r, False, watcher), daemon=True),
        ]
        for pump in pumps:
            pump.start()
        with Ticker(self.r.interval, watcher.heartbeat):
            rc = proc.wait()
            _drain(pumps, _env_float("TAO_RUNNER_DRAIN_SECONDS", 5.0))
        stopped = _stop_group(proc.pid)
        _drain(pumps, 1.0)
        if stopped:
            self.r.info(f"stopped {stopped} background process(es) the command left running")
        if any(pump.is_alive() for pump in pumps):
            # A process that left the group (setsid) still holds the pipe: its output is no longer shown.
            self.r.warn("a process outside the command's group still holds its output; not waiting for it")
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        rc = 128 - rc if rc < 0 else rc
        watcher.emit(final=True, exit_code=rc)
        return rc

    # -- commit -----------------------------------------------------------------------------------------------
    def commit_outputs(self, exit_code: int) -> dict[str, str]:
        """Data first, manifest last, for every output; returns ``{key: destination}``."""
        uploads: list[tuple[OutputUnit, list[S3Object]]] = []
        local_units: list[tuple[OutputUnit, list[tuple[str, str]]]] = []
        for unit in self.outputs:
            files = self._collect(unit)
            if files is None:
                continue
            if unit.dest.startswith("s3://"):
                self.s3.delete(unit.dest + "/" + MANIFEST_NAME)
                bucket, prefix = parse_s3(unit.dest)
                objs = [
                    S3Object(bucket, (prefix + "/" if prefix else "") + rel, os.path.getsize(full), "", local=full)
                    for rel, full in files
                ]
                uploads.append((unit, objs))
            else:
                _unlink(os.path.join(unit.dest, MANIFEST_NAME))
                local_units.append((unit, files))
        loose = self._loose_files()
        total_files = sum(len(o) for _u, o in uploads) + sum(len(f) for _u, f in local_units) + len(loose)
        total_bytes = sum(o.size for _u, objs in uploads for o in objs)
        progress = Progress(self.r, "upload", total_files, total_bytes)
        progress.emit()
        with Ticker(self.r.interval, progress.emit):
            everything = [o for _u, objs in uploads for o in objs] + [o for _r, o in loose]
            if everything:
                self.s3.upload(everything, progress)
            for unit, objs in uploads:
                entries = [(o.key[len(parse_s3(unit.dest)[1]) :].lstrip("/"), o.size, o.sha256) for o in objs]
                self.s3.put_bytes(
                    unit.dest + "/" + MANIFEST_NAME,
                    build_manifest(self.job_id, unit.key, unit.dest, exit_code, entries),
                )
                unit.committed = True
            for unit, files in local_units:
                entries = self._commit_local(unit, files, progress)
                write_atomic(
                    os.path.join(unit.dest, MANIFEST_NAME),
                    build_manifest(self.job_id, unit.key, unit.dest, exit_code, entries),
                )
                unit.committed = True
            if self.results_kind == "s3" and (loose or uploads):
                self._root_manifest(exit_code, uploads, loose)
        progress.emit(final=True)
        return {u.key: u.dest for u in self.outputs if u.committed}

    def _collect(self, unit: OutputUnit) -> list[tuple[str, str]] | None:
        """``[(relative path, local file)]`` of one output; None when a passthrough output was not produced."""
        if unit.source is not None:
            src = unit.source
            if os.path.isfile(src):
                name = os.path.basename(src)
                unit.kind, unit.filename = "file", name
                return [] if _excluded(name, self.excludes) else [(name, src)]
            if os.path.isdir(src):
                return walk_files(src, self.excludes)
            self.r.warn(f"declared output {src} was not produced by the command; nothing to commit")
            return None
        if unit.kind == "file":
            full = os.path.join(unit.local, unit.filename)
            if not os.path.isfile(full):
                self.r.info(f"output {unit.key}: file {full} was not produced")
                return []
            return [(unit.filename, full)]
        return walk_files(unit.local, self.excludes)

    def _commit_local(
        self, unit: OutputUnit, files: Sequence[tuple[str, str]], progress: Progress
    ) -> list[tuple[str, int, str]]:
        entries: list[tuple[str, int, str]] = []
        lock = threading.Lock()

        def one(rel: str, full: str) -> None:
            target = os.path.join(unit.dest, *rel.split("/"))
            if os.path.abspath(target) == os.path.abspath(full):
                size, digest = sha256_file(full)
            else:
                size, digest = copy_atomic(full, target)
            with lock:
                entries.append((rel, size, digest))
            progress.add(files=1, nbytes=size)

        os.makedirs(unit.dest, exist_ok=True)
        pool = _Pool(_env_int("TAO_TRANSFER_CONCURRENCY", 16))
        for rel, full in files:
            pool.submit(one, rel, full)
        pool.wait()
        return entries

    def _loose_files(self) -> list[tuple[str, S3Object]]:
        """s3 results kind: files written to ``{results_dir}`` outside every declared output are uploaded too."""
        if self.results_kind != "s3" or not os.path.isdir(self.results_local):
            return []
        owned = {os.path.abspath(u.local) for u in self.outputs}
        bucket, prefix = parse_s3(self.results_dest)
        found = []
        for rel, full in walk_files(self.results_local, self.excludes):
            path = os.path.abspath(full)
            if any(path.startswith(o + os.sep) for o in owned):
                continue
            found.append((rel, S3Object(bucket, prefix + "/" + rel, os.path.getsize(full), "", local=full)))
        return found

    def _root_manifest(
        self,
        exit_code: int,
        uploads: Sequence[tuple[OutputUnit, list[S3Object]]],
        loose: Sequence[tuple[str, S3Object]],
    ) -> None:
        """The job-level manifest at ``s3://.../results/<job_id>/``, written after every other one."""
        _bucket, root_prefix = parse_s3(self.results_dest)
        entries = [(rel, o.size, o.sha256) for rel, o in loose]
        for _unit, objs in uploads:
            for o in objs:
                if o.key.startswith(root_prefix + "/"):
                    entries.append((o.key[len(root_prefix) + 1 :], o.size, o.sha256))
        self.s3.put_bytes(
            self.results_dest + "/" + MANIFEST_NAME,
            build_manifest(
                self.job_id,
                "results_dir",
                self.results_dest,
                exit_code,
                entries,
                outputs={u.key: u.dest for u in self.outputs if u.committed},
            ),
        )

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
        self.plan_outputs()
        self.stage_inputs()
        if self.mode == "config":
            self.write_spec()
        rc = self.run_command()
        self.exit_code = rc
        try:
            outputs = self.commit_outputs(rc)
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


def _classify_hub(exc: BaseException, uri: str) -> RunnerError:
    name = type(exc).__name__
    if any(word in name for word in ("NotFound", "Gated", "Unauthorized", "Forbidden", "Auth", "Value")):
        return ConfigError(f"input {uri}: {name}: {exc}")
    return InfraError(f"input {uri}: download failed ({name}: {exc})")


def _link_or_copy(src: str, dst: str) -> None:
    """Expose a cached input at a container path: a symlink when the path is free, else a copy."""
    parent = os.path.dirname(dst.rstrip("/")) or "/"
    os.makedirs(parent, exist_ok=True)
    dst = dst.rstrip("/") or dst
    if os.path.islink(dst) or not os.path.exists(dst):
        tmp = f"{dst}.tao-link-{os.getpid()}"
        _unlink(tmp)
        os.symlink(src, tmp)
        os.replace(tmp, dst)
        return
    _copy_path(src, dst)


def _copy_path(src: str, dst: str) -> None:
    """Copy a file or a folder (atomically per file)."""
    if os.path.isdir(src):
        for rel, full in walk_files(src):
            copy_atomic(full, os.path.join(dst, *rel.split("/")))
        os.makedirs(dst, exist_ok=True)
    else:
        copy_atomic(src, dst)


def replace_placeholders(text: str, values: Mapping[str, str], quote: bool) -> str:
    """Replace the documented placeholders by literal substring replacement (never ``str.format``).

    :param text: a command string or argv element.
    :param values: placeholder -> value.
    :param quote: shell-quote values that need it (string commands run by bash).
    """
    for placeholder, value in values.items():
        if placeholder in text:
            text = text.replace(placeholder, shlex.quote(value) if quote else value)
    return text


def args_tokens(args: Mapping[str, Any]) -> list[str]:
    """Args mode: ``{"lr": 0.1, "amp": True, "tags": ["a", "b"]}`` -> ``["--lr", "0.1", "--amp", "--tags", "a",
    "--tags", "b"]``. ``False`` / ``None`` are omitted; dicts are passed as compact JSON.

    :param args: flat mapping of argument name -> value.
    """
    tokens: list[str] = []
    for key, value in args.items():
        flag = key if key.startswith("-") else "--" + key
        for item in value if isinstance(value, list) else [value]:
            if item is None or item is False:
                continue
            if item is True:
                tokens.append(flag)
            elif isinstance(item, (dict, list)):
                tokens.extend([flag, json.dumps(item, separators=(",", ":"), ensure_ascii=False)])
            elif isinstance(item, float):
                tokens.extend([flag, repr(item)])
            else:
                tokens.extend([flag, str(item)])
    return tokens


class StepWatcher:
    """Finds training steps in the command's output and reports them (rate-limited) and heartbeats.

    :param reporter: where lines go.
    """

    def __init__(self, reporter: Reporter) -> None:
        self.r = reporter
        self.lock = threading.Lock()
        self.step: int | None = None
        self.epoch: int | None = None
        self.epochs: int | None = None
        self.start = time.monotonic()
        self.last_emit = 0.0
        self.reported: tuple[int | None, int | None] = (None, None)
        self.partial = {True: b"", False: b""}

    def feed(self, data: bytes, is_out: bool) -> None:
        """Scan a chunk of output (split on ``\\n`` and ``\\r`` so progress bars count)."""
        buf = self.partial[is_out] + data
        lines = re.split(rb"[\r\n]", buf)
        self.partial[is_out] = lines.pop()[-4096:]
        changed = False
        for raw in lines:
            if raw:
                changed = self._scan(raw.decode("utf-8", "replace")) or changed
        if changed:
            self._maybe_emit()

    def _scan(self, text: str) -> bool:
        changed = False
        for pattern in _STEP_PATTERNS:
            match = pattern.search(text)
            if match:
                with self.lock:
                    self.step = int(match.group(1))
                changed = True
                break
        match = _EPOCH_PATTERN.search(text)
        if match:
            with self.lock:
                self.epoch, self.epochs = int(match.group(1)), int(match.group(2))
            changed = True
        return changed

    def _maybe_emit(self) -> None:
        now = time.monotonic()
        with self.lock:
            state = (self.step, self.epoch)
            due = state != self.reported and (
                self.reported == (None, None) or now - self.last_emit >= min(self.r.interval, 2.0)
            )
        if due:
            self.emit()

    def heartbeat(self) -> None:
        """Called by the ticker: print a line when nothing was printed for an interval."""
        if time.monotonic() - self.last_emit >= self.r.interval * 0.9:
            self.emit()

    def emit(self, final: bool = False, exit_code: int | None = None) -> None:
        """Print the run state."""
        with self.lock:
            self.last_emit = time.monotonic()
            self.reported = (self.step, self.epoch)
            fields: dict[str, Any] = {
                "status": "exited" if final else "running",
                "elapsed_s": round(time.monotonic() - self.start, 2),
                "step": self.step,
                "epoch": self.epoch,
                "epochs": self.epochs,
                "exit_code": exit_code,
            }
        self.r.progress("run", **fields)


def _drain(pumps: Sequence[threading.Thread], seconds: float) -> None:
    """Wait up to ``seconds`` in all for the output readers to reach the end of their pipes."""
    deadline = time.monotonic() + seconds
    for pump in pumps:
        pump.join(max(0.0, deadline - time.monotonic()))


def _stop_group(pgid: int) -> int:
    """Stop what is left of the command's process group (TERM, then KILL after a grace); returns how many."""
    left = _group_members(pgid)
    if not left:
        return 0
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + _env_float("TAO_RUNNER_KILL_GRACE", 5.0)
    while _group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)
    return len(left)


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of group ``pgid``; from /proc, so an orphan reaped by nobody is not counted."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses, so split after the last ")"
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def _pump(stream: IO[bytes] | None, reporter: Reporter, is_out: bool, watcher: StepWatcher) -> None:
    if stream is None:
        return
    fd = stream.fileno()
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        reporter.forward(data, is_out)
        watcher.feed(data, is_out)
    stream.close()


# --------------------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------------------
def load_runner_manifest(path: str) -> dict[str, Any]:
    """Read and sanity-check runner.json.

    :param path: the file.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"runner manifest {path}: file not found (is TAO_JOB_FILES staged?)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"runner manifest {path} is unreadable: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != RUNNER_FORMAT:
        raise ConfigError(f"runner manifest {path}: not a format-{RUNNER_FORMAT} runner.json")
    for key in ("inputs", "outputs"):
        if not isinstance(manifest.get(key) or {}, dict):
            raise ConfigError(f"runner manifest {path}: {key!r} must be a mapping")
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    """Run one job; returns the exit code.

    :param argv: ``[runner.json]`` (default: ``sys.argv[1:]``).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    reporter = Reporter()
    try:
        if len(args) != 1:
            raise ConfigError("usage: script_runner.py <runner.json>")
        job = Job(load_runner_manifest(args[0]), reporter)
        try:
            return job.run()
        finally:
            job.cleanup()
    except RunnerError as exc:
        reporter.failure(exc.err_class, str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        reporter.failure("ERR_UNKNOWN", "interrupted")
        return 130
    except Exception as exc:  # a bug in the runner: say so, never hide it as the command's failure
        import traceback

        traceback.print_exc()
        reporter.failure("ERR_UNKNOWN", f"runner error: {type(exc).__name__}: {exc}")
        return EXIT_SOFTWARE


if __name__ == "__main__":
    sys.exit(main())
