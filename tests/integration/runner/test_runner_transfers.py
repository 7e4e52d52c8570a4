"""The runner's S3 data path (boto3's TransferManager plus what the runner adds) against a real S3 API (moto):
sizes and ETags come from the listing (no HEAD per object), every GET carries If-Match with the listed ETag -- from
s3transfer itself or, where s3transfer does not add it, from the runner -- so an object that changed after it was
listed is refused instead of spliced, downloads land atomically, and the first failure cancels the rest."""

from __future__ import annotations

import hashlib
import io
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from s3transfer.futures import TransferMeta

from airflow_provider_tao.runner.job import transfers
from airflow_provider_tao.runner.job.errors import ConfigError, InfraError
from airflow_provider_tao.runner.job.progress import Progress, Reporter
from airflow_provider_tao.runner.job.s3 import S3

pytestmark = pytest.mark.integration
MiB = 1024 * 1024


@pytest.fixture
def job_s3(monkeypatch: pytest.MonkeyPatch, moto_endpoint: str) -> S3:
    """The runner's client, configured from a job environment like the platforms give it."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": moto_endpoint,
        "TAO_PART_SIZE_MB": "5",
        "TAO_TRANSFER_CONCURRENCY": "4",
    }.items():
        monkeypatch.setenv(name, value)
    return S3()


@pytest.fixture(params=["s3transfer adds If-Match", "only the runner adds If-Match"])
def if_match_source(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """s3transfer >= 0.11 adds If-Match once it is given the ETag; older releases (the Debian image's 0.6) cannot
    be given one, so the runner's own request hook must be enough on its own."""
    if request.param == "only the runner adds If-Match":
        monkeypatch.setattr(TransferMeta, "provide_object_etag", lambda self, etag: None)
    return str(request.param)


class Wire:
    """What the client really sent: operations, and the If-Match header of every GET."""

    def __init__(self, client: Any) -> None:
        self.calls: Counter[str] = Counter()
        self.if_match: list[tuple[str, str | None]] = []
        client.meta.events.register("before-send.s3", self._sent)

    def _sent(self, request: Any, event_name: str, **_kwargs: Any) -> None:
        operation = event_name.rsplit(".", 1)[-1]  # before-send.s3.GetObject
        self.calls[operation] += 1
        if operation == "GetObject":
            header = request.headers.get("If-Match")
            self.if_match.append((request.url, header.decode() if isinstance(header, bytes) else header))


def _progress() -> Progress:
    return Progress(Reporter(out=io.BytesIO(), err=io.BytesIO()), "download")


def _listed(job_s3: S3, bucket: str, prefix: str, dest: Path) -> list[transfers.S3Object]:
    _kind, listing = job_s3.resolve(f"s3://{bucket}/{prefix}/")
    return [
        transfers.S3Object(bucket, key, size, etag, local=str(dest / key[len(prefix) + 1 :]))
        for key, size, etag in listing
    ]


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.is_file() and ".tao-part" in p.name)


def test_downloads_need_one_request_per_small_object_and_no_head(
    job_s3: S3, s3: Any, bucket: str, tmp_path: Path
) -> None:
    bodies = {f"d/f{i:03d}.bin": os.urandom(1000 + i) for i in range(60)}
    for key, body in bodies.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    objects = _listed(job_s3, bucket, "d", tmp_path)
    wire = Wire(job_s3.client)
    progress = _progress()
    transfers.download(job_s3, objects, progress)
    assert wire.calls == Counter({"GetObject": 60})
    assert (progress.files, progress.nbytes) == (60, sum(len(b) for b in bodies.values()))
    for key, body in bodies.items():
        assert (tmp_path / key[2:]).read_bytes() == body
    assert _leftovers(tmp_path) == []


def test_every_get_carries_the_listed_etag(
    job_s3: S3, s3: Any, bucket: str, tmp_path: Path, if_match_source: str
) -> None:
    big = os.urandom(12 * MiB + 7)  # above the 5 MiB part size: ranged GETs
    s3.put_object(Bucket=bucket, Key="m/big.bin", Body=big)
    s3.put_object(Bucket=bucket, Key="m/small.txt", Body=b"small")
    objects = _listed(job_s3, bucket, "m", tmp_path)
    wire = Wire(job_s3.client)
    transfers.download(job_s3, objects, _progress())
    assert (tmp_path / "big.bin").read_bytes() == big
    etags = {f"/{o.key}": o.etag for o in objects}
    assert len(wire.if_match) == 3 + 1, wire.if_match  # 3 ranges of the big object, 1 GET of the small one
    for url, header in wire.if_match:
        assert header == etags[url[url.index(f"/{bucket}/") + len(bucket) + 1 :]], (if_match_source, url)


@pytest.mark.usefixtures("if_match_source")
@pytest.mark.parametrize("size", [100, 12 * MiB], ids=["one GET", "ranged GETs"])
def test_an_object_changed_after_it_was_listed_is_refused_not_spliced(
    job_s3: S3, s3: Any, bucket: str, tmp_path: Path, size: int
) -> None:
    s3.put_object(Bucket=bucket, Key="c/x.bin", Body=b"1" * size)
    objects = _listed(job_s3, bucket, "c", tmp_path)
    s3.put_object(Bucket=bucket, Key="c/x.bin", Body=b"2" * size)  # same key and size, new ETag
    with pytest.raises(InfraError, match="changed while it was being downloaded"):
        transfers.download(job_s3, objects, _progress())
    assert not (tmp_path / "x.bin").exists()
    assert _leftovers(tmp_path) == []


def test_the_first_failure_cancels_what_has_not_started(
    monkeypatch: pytest.MonkeyPatch, job_s3: S3, s3: Any, bucket: str, tmp_path: Path
) -> None:
    for i in range(300):
        s3.put_object(Bucket=bucket, Key=f"f/f{i:03d}", Body=b"x" * 100)
    objects = _listed(job_s3, bucket, "f", tmp_path)
    s3.delete_object(Bucket=bucket, Key="f/f000")  # gone after the listing
    monkeypatch.setenv("TAO_TRANSFER_CONCURRENCY", "1")
    one_at_a_time = S3()
    wire = Wire(one_at_a_time.client)
    with pytest.raises(ConfigError, match=r"f/f000: not found"):
        transfers.download(one_at_a_time, objects, _progress())
    assert wire.calls["GetObject"] < 100  # not the 300 a batch that keeps going would make
    assert _leftovers(tmp_path) == []


def test_uploads_are_hashed_and_multipart_above_the_part_size(job_s3: S3, s3: Any, bucket: str, tmp_path: Path) -> None:
    files = {"a.txt": b"hello", "big.bin": os.urandom(11 * MiB)}
    objects = []
    for name, body in files.items():
        (tmp_path / name).write_bytes(body)
        objects.append(transfers.S3Object(bucket, f"u/{name}", len(body), "", local=str(tmp_path / name)))
    progress = _progress()
    transfers.upload(job_s3, objects, progress)
    assert progress.files == 2
    for obj, (name, body) in zip(objects, files.items(), strict=True):
        assert s3.get_object(Bucket=bucket, Key=f"u/{name}")["Body"].read() == body
        assert obj.sha256 == hashlib.sha256(body).hexdigest()
    assert "-" in s3.head_object(Bucket=bucket, Key="u/big.bin")["ETag"]  # really multipart
    assert "-" not in s3.head_object(Bucket=bucket, Key="u/a.txt")["ETag"]
