"""Moving data between S3 and local files with boto3's ``TransferManager`` (multipart, threads, retries of cut
streams), plus what the runner adds on top:

* every download lands atomically: the manager writes into a hidden ``.tao-part`` temp file beside the destination,
  renamed once its size is right (a killed or failed job leaves no half file under a real name);
* sizes and ETags come from the listing, so no object is HEAD'ed again, and every GET carries ``If-Match`` with the
  listed ETag (older s3transfer does not add it itself), so two versions of an object are never spliced;
* a shared cache (``mount_path``) keeps a sidecar per object; a cached copy counts only while the source's ETag and
  size still match it;
* uploads are hashed (sha256, for the manifest) while the manager sends them;
* one manager and a bounded window of transfers per batch; the first failure cancels the rest.
"""

from __future__ import annotations

import json
import os
import queue
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, InfraError
from .fsops import sha256_file, temp_beside, unlink_quietly, write_atomic
from .manifest import now_iso

if TYPE_CHECKING:  # pragma: no cover - typing only
    from collections.abc import Callable, Sequence

    from .progress import Progress
    from .s3 import S3


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
        meta = {"source": obj.uri, "etag": obj.etag, "size": obj.size, "fetched_at": now_iso()}
        write_atomic(obj.meta, json.dumps(meta).encode("utf-8"))


class _Watch:
    """A TransferManager subscriber for one object: gives its size and ETag (so nothing is HEAD'ed), counts its
    bytes, and hands the finished future back to the batch."""

    def __init__(self, obj: S3Object, progress: Progress, done: queue.Queue[Any]) -> None:
        self.obj = obj
        self.progress = progress
        self.done = done

    def on_queued(self, future: Any, **_kwargs: Any) -> None:
        future.meta.provide_transfer_size(self.obj.size)
        if self.obj.etag and hasattr(future.meta, "provide_object_etag"):  # s3transfer >= 0.11
            future.meta.provide_object_etag(self.obj.etag)

    def on_progress(self, future: Any, bytes_transferred: int, **_kwargs: Any) -> None:
        self.progress.add(nbytes=bytes_transferred)

    def on_done(self, future: Any, **_kwargs: Any) -> None:
        self.done.put(future)


class _Batch:
    """Runs one batch of transfers through one TransferManager, at most ``window`` at a time (so a batch of
    thousands of files never holds thousands of open files); the first failure cancels everything else."""

    def __init__(self, s3: S3, progress: Progress) -> None:
        self.s3 = s3
        self.progress = progress
        self.done: queue.Queue[Any] = queue.Queue()
        self.window = max(32, 4 * s3.concurrency)

    def run(
        self,
        objects: Sequence[S3Object],
        start: Callable[[Any, S3Object, _Watch], tuple[Any, Any]],
        finish: Callable[[S3Object, Any], None],
        discard: Callable[[Any], None],
        submitted: Callable[[S3Object], None] | None = None,
    ) -> None:
        """Transfer every object.

        :param start: submits one transfer: ``(manager, object, subscriber) -> (future, state)``.
        :param finish: completes one successful transfer (in this thread).
        :param discard: cleans up the state of a transfer that failed or was canceled.
        :param submitted: work to do on an object while the manager moves it (in this thread).
        """
        manager = self.s3.transfer_manager()
        pending: dict[Any, tuple[S3Object, Any]] = {}
        try:
            for obj in objects:
                while len(pending) >= self.window:
                    self._settle(pending, finish)
                future, state = start(manager, obj, _Watch(obj, self.progress, self.done))
                pending[future] = (obj, state)
                if submitted is not None:
                    submitted(obj)
            while pending:
                self._settle(pending, finish)
        except BaseException:
            # Cancel what is queued or running (multipart uploads are aborted), one future at a time: some
            # s3transfer releases pass shutdown(cancel=True)'s arguments on in the wrong order and raise TypeError.
            for future in pending:
                future.cancel()
            manager.shutdown()
            for _obj, state in pending.values():
                discard(state)
            raise
        manager.shutdown()

    def _settle(self, pending: dict[Any, tuple[S3Object, Any]], finish: Callable[[S3Object, Any], None]) -> None:
        future = self.done.get()
        obj, state = pending[future]
        try:
            future.result()
        except Exception as exc:
            raise self.s3.classify(exc, obj.uri) from exc
        finish(obj, state)  # when it raises, the state is still pending: discarded with the rest
        del pending[future]


def download(s3: S3, objects: Sequence[S3Object], progress: Progress) -> None:
    """Download objects concurrently; each lands atomically (temp file beside it + rename).

    :param s3: the client.
    :param objects: what to fetch (``local`` is the final path).
    :param progress: counters.
    """
    todo = []
    for obj in objects:
        if obj.meta and cache_hit(obj):
            progress.add(files=1, cached=1)
            continue
        if obj.meta:
            unlink_quietly(obj.meta)  # data may change below; never leave an old etag beside new bytes
        todo.append(obj)
    if not todo:
        return
    etags: dict[tuple[Any, Any], str] = {(o.bucket, o.key): o.etag for o in todo if o.etag}

    def if_match(params: dict[str, Any], **_kwargs: Any) -> None:
        etag = etags.get((params.get("Bucket"), params.get("Key")))
        if etag:
            params.setdefault("IfMatch", etag)

    def start(manager: Any, obj: S3Object, watch: _Watch) -> tuple[Any, Any]:
        fd, tmp = temp_beside(obj.local)
        fh = os.fdopen(fd, "wb")
        try:
            return manager.download(obj.bucket, obj.key, fh, subscribers=[watch]), (fh, tmp)
        except BaseException:
            discard((fh, tmp))
            raise

    def finish(obj: S3Object, state: tuple[Any, str]) -> None:
        fh, tmp = state
        fh.close()
        if os.path.getsize(tmp) != obj.size:
            raise InfraError(f"{obj.uri}: incomplete download")
        os.replace(tmp, obj.local)
        write_cache_meta(obj)
        progress.add(files=1)

    def discard(state: tuple[Any, str]) -> None:
        fh, tmp = state
        fh.close()
        unlink_quietly(tmp)

    events = s3.client.meta.events
    events.register("before-parameter-build.s3.GetObject", if_match)
    try:
        _Batch(s3, progress).run(todo, start, finish, discard)
    finally:
        events.unregister("before-parameter-build.s3.GetObject", if_match)


def upload(s3: S3, objects: Sequence[S3Object], progress: Progress) -> None:
    """Upload local files concurrently (multipart above the part size); sets each object's ``sha256``.

    :param s3: the client.
    :param objects: what to send (``local`` is the source file, ``size`` its size).
    :param progress: counters.
    """
    from s3transfer.manager import TransferManager

    # CRC32 on every request, as recent s3transfer does by default: S3 then validates each part and the object.
    extra = {"ChecksumAlgorithm": "CRC32"} if "ChecksumAlgorithm" in TransferManager.ALLOWED_UPLOAD_ARGS else {}

    def start(manager: Any, obj: S3Object, watch: _Watch) -> tuple[Any, Any]:
        return manager.upload(obj.local, obj.bucket, obj.key, extra_args=extra, subscribers=[watch]), None

    def hash_while_sending(obj: S3Object) -> None:
        size, obj.sha256 = sha256_file(obj.local)
        if size != obj.size:
            raise ConfigError(f"{obj.local} changed while it was being uploaded")

    def finish(_obj: S3Object, _state: Any) -> None:
        progress.add(files=1)

    _Batch(s3, progress).run(objects, start, finish, lambda _state: None, submitted=hash_while_sending)
