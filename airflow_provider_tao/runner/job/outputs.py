"""Outputs: where each declared output is written in the job and where it ends up, and committing them -- data
first, then ``_TAO_MANIFEST.json`` at every destination (an existing one is removed before any data is written),
then, for S3 results, the job-level manifest that lists every committed output."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from . import transfers
from .errors import ConfigError
from .fsops import copy_atomic, excluded, sha256_file, unlink_quietly, walk_files, write_atomic
from .manifest import MANIFEST_NAME, build_manifest
from .paths import MISSING, get_path, is_remote, mount_mapping, output_dir_name, parse_s3, set_path
from .progress import Progress, Ticker
from .tuning import env_int

if TYPE_CHECKING:  # pragma: no cover - typing only
    from collections.abc import Mapping, Sequence

    from .view import JobView


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


class Outputs:
    """The outputs of one job: planned before the command runs, committed after it.

    :param job: the run whose outputs these are.
    """

    def __init__(self, job: JobView) -> None:
        self.job = job
        self.units: list[OutputUnit] = []

    # -- planning --------------------------------------------------------------------------------------------
    def plan(self) -> None:
        """Decide every output's local folder and final destination; fill spec / args values."""
        job = self.job
        declared = job.m.get("outputs") or {}
        for key, raw_cfg in declared.items():
            cfg = raw_cfg or {}
            if job.mode == "passthrough":
                self.units.append(self._passthrough_output(key, cfg))
                continue
            tree = job.spec if job.mode == "config" else job.args
            current = get_path(tree, key) if job.mode == "config" else tree.get(key, MISSING)
            unit = self._spec_output(key, cfg, None if current is MISSING else current)
            self.units.append(unit)
            if job.mode == "config":
                try:
                    set_path(job.spec, key, unit.value)
                except (KeyError, IndexError, TypeError):
                    raise ConfigError(f"outputs: the spec has no parent for {key!r}") from None
            else:
                job.args[key] = unit.value
        for unit in self.units:
            if unit.source is None:
                os.makedirs(unit.local, exist_ok=True)

    def _spec_output(self, key: str, cfg: Mapping[str, Any], value: Any) -> OutputUnit:
        job = self.job
        kind = str(cfg.get("type") or "folder")
        name = output_dir_name(key, job.mode)
        text = value if isinstance(value, str) else ""
        filename = ""
        if kind == "file":
            filename = os.path.basename(text.rstrip("/")) or name
        if text.startswith("s3://"):
            dest = text.rstrip("/")
            if kind == "file":
                dest = dest.rsplit("/", 1)[0] if "/" in dest[5:] else dest
            local = mount_mapping(job.mount_path, dest) if job.mount_path else os.path.join(job.work, "outputs", name)
            return OutputUnit(key, kind, local, dest, filename=filename)
        if text.startswith("file://"):
            text = text[len("file://") :]
        if os.path.isabs(text):
            folder = os.path.dirname(text.rstrip("/")) if kind == "file" else text.rstrip("/") or "/"
            return OutputUnit(key, kind, folder, folder, filename=filename)
        if is_remote(text):
            raise ConfigError(f"outputs[{key!r}]: unsupported destination {text!r} (use s3:// or an absolute path)")
        # Relative or empty: auto-fill under the job's results dir, as the seeds do.
        dest = job.results_dest + "/" + name
        return OutputUnit(key, kind, os.path.join(job.results_local, name), dest, filename=filename)

    def _passthrough_output(self, path: str, cfg: Mapping[str, Any]) -> OutputUnit:
        job = self.job
        name = output_dir_name(path, "passthrough")
        override = str(cfg.get("destination") or "")
        if override.startswith("s3://"):
            dest = override.rstrip("/")
            local = os.path.join(job.work, "outputs", name)
        elif override:
            dest = local = override.rstrip("/")
        else:
            dest = job.results_dest + "/" + name
            local = os.path.join(job.results_local, name)
        return OutputUnit(path, "folder", local, dest, source=path)

    # -- commit ----------------------------------------------------------------------------------------------
    def commit(self, exit_code: int) -> dict[str, str]:
        """Data first, manifest last, for every output; returns ``{key: destination}``."""
        job = self.job
        uploads: list[tuple[OutputUnit, list[transfers.S3Object]]] = []
        local_units: list[tuple[OutputUnit, list[tuple[str, str]]]] = []
        for unit in self.units:
            files = self._collect(unit)
            if files is None:
                continue
            if unit.dest.startswith("s3://"):
                job.s3.delete(unit.dest + "/" + MANIFEST_NAME)
                bucket, prefix = parse_s3(unit.dest)
                objs = [
                    transfers.S3Object(
                        bucket, (prefix + "/" if prefix else "") + rel, os.path.getsize(full), "", local=full
                    )
                    for rel, full in files
                ]
                uploads.append((unit, objs))
            else:
                unlink_quietly(os.path.join(unit.dest, MANIFEST_NAME))
                local_units.append((unit, files))
        loose = self._loose_files()
        total_files = sum(len(o) for _u, o in uploads) + sum(len(f) for _u, f in local_units) + len(loose)
        total_bytes = sum(o.size for _u, objs in uploads for o in objs)
        progress = Progress(job.r, "upload", total_files, total_bytes)
        progress.emit()
        with Ticker(job.r.interval, progress.emit):
            everything = [o for _u, objs in uploads for o in objs] + [o for _r, o in loose]
            if everything:
                transfers.upload(job.s3, everything, progress)
            for unit, objs in uploads:
                entries = [(o.key[len(parse_s3(unit.dest)[1]) :].lstrip("/"), o.size, o.sha256) for o in objs]
                job.s3.put_bytes(
                    unit.dest + "/" + MANIFEST_NAME,
                    build_manifest(job.job_id, unit.key, unit.dest, exit_code, entries),
                )
                unit.committed = True
            for unit, files in local_units:
                entries = self._commit_local(unit, files, progress)
                write_atomic(
                    os.path.join(unit.dest, MANIFEST_NAME),
                    build_manifest(job.job_id, unit.key, unit.dest, exit_code, entries),
                )
                unit.committed = True
            if job.results_kind == "s3" and (loose or uploads):
                self._root_manifest(exit_code, uploads, loose)
        progress.emit(final=True)
        return {u.key: u.dest for u in self.units if u.committed}

    def _collect(self, unit: OutputUnit) -> list[tuple[str, str]] | None:
        """``[(relative path, local file)]`` of one output; None when a passthrough output was not produced."""
        excludes = self.job.excludes
        if unit.source is not None:
            src = unit.source
            if os.path.isfile(src):
                name = os.path.basename(src)
                unit.kind, unit.filename = "file", name
                return [] if excluded(name, excludes) else [(name, src)]
            if os.path.isdir(src):
                return walk_files(src, excludes)
            self.job.r.warn(f"declared output {src} was not produced by the command; nothing to commit")
            return None
        if unit.kind == "file":
            full = os.path.join(unit.local, unit.filename)
            if not os.path.isfile(full):
                self.job.r.info(f"output {unit.key}: file {full} was not produced")
                return []
            return [(unit.filename, full)]
        return walk_files(unit.local, excludes)

    @staticmethod
    def _commit_local(
        unit: OutputUnit, files: Sequence[tuple[str, str]], progress: Progress
    ) -> list[tuple[str, int, str]]:
        entries: list[tuple[str, int, str]] = []
        lock = threading.Lock()
        failed = threading.Event()  # the first failure stops the copies that have not started

        def one(rel: str, full: str) -> None:
            if failed.is_set():
                return
            target = os.path.join(unit.dest, *rel.split("/"))
            try:
                if os.path.abspath(target) == os.path.abspath(full):
                    size, digest = sha256_file(full)
                else:
                    size, digest = copy_atomic(full, target)
            except BaseException:
                failed.set()
                raise
            with lock:
                entries.append((rel, size, digest))
            progress.add(files=1, nbytes=size)

        os.makedirs(unit.dest, exist_ok=True)
        with ThreadPoolExecutor(env_int("TAO_TRANSFER_CONCURRENCY", 16), thread_name_prefix="tao-copy") as pool:
            for future in [pool.submit(one, rel, full) for rel, full in files]:
                future.result()
        return entries

    def _loose_files(self) -> list[tuple[str, transfers.S3Object]]:
        """s3 results kind: files written to ``{results_dir}`` outside every declared output are uploaded too."""
        job = self.job
        if job.results_kind != "s3" or not os.path.isdir(job.results_local):
            return []
        owned = {os.path.abspath(u.local) for u in self.units}
        bucket, prefix = parse_s3(job.results_dest)
        found = []
        for rel, full in walk_files(job.results_local, job.excludes):
            path = os.path.abspath(full)
            if any(path.startswith(o + os.sep) for o in owned):
                continue
            found.append((rel, transfers.S3Object(bucket, prefix + "/" + rel, os.path.getsize(full), "", local=full)))
        return found

    def _root_manifest(
        self,
        exit_code: int,
        uploads: Sequence[tuple[OutputUnit, list[transfers.S3Object]]],
        loose: Sequence[tuple[str, transfers.S3Object]],
    ) -> None:
        """The job-level manifest at ``s3://.../results/<job_id>/``, written after every other one."""
        job = self.job
        _bucket, root_prefix = parse_s3(job.results_dest)
        entries = [(rel, o.size, o.sha256) for rel, o in loose]
        for _unit, objs in uploads:
            for o in objs:
                if o.key.startswith(root_prefix + "/"):
                    entries.append((o.key[len(root_prefix) + 1 :], o.size, o.sha256))
        job.s3.put_bytes(
            job.results_dest + "/" + MANIFEST_NAME,
            build_manifest(
                job.job_id,
                "results_dir",
                job.results_dest,
                exit_code,
                entries,
                outputs={u.key: u.dest for u in self.units if u.committed},
            ),
        )
