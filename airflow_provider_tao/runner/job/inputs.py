"""Staging the declared inputs before the command runs: ``s3://`` objects and prefixes (through the shared cache
when there is one), local paths and ``file://`` URIs, hub references; then the spec / args point at the local copies.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any

from . import transfers
from .errors import ConfigError
from .fsops import CACHE_META_DIR, copy_path, link_or_copy, safe_relpath
from .hubs import MODEL_SCHEMES, fetch_model
from .paths import MISSING, cache_path, get_path, is_remote, mount_mapping, output_dir_name, parse_s3, set_path
from .progress import Progress, Ticker

if TYPE_CHECKING:  # pragma: no cover - typing only
    from collections.abc import Callable, Mapping, Sequence

    from .view import JobView


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


class InputStaging:
    """Downloads every declared input of a job (and, in config mode, every ngc:// / hf_*:// value of its spec).

    :param job: the run whose inputs these are.
    """

    def __init__(self, job: JobView) -> None:
        self.job = job

    def run(self) -> None:
        """Stage everything, then rewrite the spec / args values to the local paths."""
        job = self.job
        declared: Mapping[str, Any] = job.m.get("inputs") or {}
        items: list[InputItem] = []
        if job.mode == "passthrough":
            for target, uri in declared.items():
                items.append(InputItem(str(uri), _ignore, target=target))
        else:
            tree = job.spec if job.mode == "config" else job.args
            for key, cfg in declared.items():
                value = get_path(tree, key) if job.mode == "config" else tree.get(key, MISSING)
                if value is MISSING or value is None or value == "":
                    job.r.info(f"input {key} is empty; skipped")
                    continue
                forced = (cfg or {}).get("container_path") or None
                name = output_dir_name(key, job.mode)
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
            if job.mode == "config":
                items.extend(self._model_refs(set(declared)))
        self._fetch(items)

    @staticmethod
    def _check_uri(key: str, value: Any) -> str:
        if not isinstance(value, str):
            raise ConfigError(f"inputs[{key!r}]: expected a URI or path, got {type(value).__name__}")
        return value

    def _setter(self, key: str, idx: int | None) -> Callable[[str], None]:
        job = self.job

        def set_value(local: str) -> None:
            if job.mode == "config":
                if idx is None:
                    set_path(job.spec, key, local)
                else:
                    get_path(job.spec, key)[idx] = local
            elif idx is None:
                job.args[key] = local
            else:
                job.args[key][idx] = local

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

        walk(self.job.spec, "")
        return found

    def _fetch(self, items: Sequence[InputItem]) -> None:
        job = self.job
        objects: list[transfers.S3Object] = []
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
                    after.append(functools.partial(copy_path, local, item.target))
                    after.append(functools.partial(item.setter, item.target))
                else:
                    after.append(functools.partial(item.setter, local))
        total = sum(o.size for o in objects)
        progress = Progress(job.r, "download", len(objects), total)
        progress.emit()
        with Ticker(job.r.interval, progress.emit):
            if objects:
                transfers.download(job.s3, objects, progress)
            for step in after:
                step()
        progress.emit(final=True)

    def _plan_s3(self, item: InputItem, objects: list[transfers.S3Object]) -> Callable[[], None]:
        """Queue the objects of one s3:// input; returns what to do once they are local."""
        job = self.job
        kind, listing = job.s3.resolve(item.uri)
        bucket, key = parse_s3(item.uri)
        # The shared cache (seeds' Lustre mapping) is used unless the input asks for an exact local path;
        # passthrough inputs are linked from the cache to their container path.
        use_cache = bool(job.mount_path) and (item.target is None or job.mode == "passthrough")
        if use_cache:
            local_root = mount_mapping(job.mount_path or "", item.uri)
        elif item.target:
            local_root = item.target
        else:
            local_root = os.path.join(job.work, "inputs", item.sub or "input")
            if kind == "file":
                local_root = os.path.join(local_root, os.path.basename(key) or "data")
        if kind == "file":
            targets = [(listing[0], local_root)]
        else:
            prefix = key if (not key or key.endswith("/")) else key + "/"
            os.makedirs(local_root, exist_ok=True)
            targets = [(entry, os.path.join(local_root, safe_relpath(entry[0][len(prefix) :]))) for entry in listing]
        for (obj_key, size, etag), local in targets:
            meta = self._meta(bucket, obj_key) if use_cache else None
            objects.append(transfers.S3Object(bucket, obj_key, size, etag, local=local, meta=meta))
        value = local_root + ("/" if item.uri.endswith("/") and kind == "folder" else "")
        if job.mode == "passthrough" and use_cache and item.target:
            return functools.partial(link_or_copy, local_root, item.target)
        return functools.partial(item.setter, value)

    def _meta(self, bucket: str, key: str) -> str:
        return cache_path(os.path.join(self.job.mount_path or "", CACHE_META_DIR), bucket, key, ".json")

    def _stage_model(self, item: InputItem) -> None:
        dest = item.target or os.path.join(self.job.work, "inputs", item.sub or "ptm")
        item.setter(fetch_model(item.uri, dest, self.job.wheels))
