"""Staging throughput: the in-job runner vs boto3's own TransferManager, side by side, in one run.

Starts its own moto S3 server on loopback (a separate process, so neither client shares its GIL), builds the data
sets, and measures for each case (a) 1 file of 512 MiB and (b) 2,000 files of 64 KiB, download and upload:

* **runner** -- the real thing: ``build_entrypoint`` -> staged files -> ``/bin/sh -c ... python3 runner.pyz``
  as a subprocess, timed from process start to exit (interpreter start-up, boto3 import, listing, the transfer,
  sha256 of every uploaded file and the manifests all count). Its own phase time is shown too.
* **boto3 TM** -- ``s3transfer.manager.TransferManager`` (what ``upload_file`` / ``download_file`` use) with the same
  concurrency, all files submitted at once, timed around the transfers only.

Each measurement is repeated (``--repeat``, best of N) and the ratio runner/TM of MB/s is printed (>= 1.0: the
runner is at least as fast). ``--small`` runs a quick version (64 MiB and 200 files).

Usage: ``python benchmarks/staging_throughput.py [--small] [--repeat N] [--concurrency N]``
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from s3transfer.manager import TransferConfig, TransferManager

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from airflow_provider_tao.runner.entrypoint import build_entrypoint, parse_progress

CREDS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
MiB = 1024 * 1024


@contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server in its own process on a free loopback port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError("moto server did not start")
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def make_client(endpoint: str, concurrency: int) -> Any:
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
        config=Config(max_pool_connections=concurrency + 4),
    )


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def total_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in files_under(root))


# ---------------------------------------------------------------------------------------------------- runner
def run_runner(ep: Any, endpoint: str, work: Path, env: dict[str, str]) -> tuple[float, float]:
    """Run the real entrypoint; returns (wall seconds, the runner's own phase seconds)."""
    files = work / "files"
    files.mkdir(parents=True, exist_ok=True)
    for name, content in ep.files.items():
        (files / name).write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    job_env = {k: v for k, v in os.environ.items() if not k.startswith(("TAO_", "AWS_", "S3_"))}
    job_env.update(
        CREDS,
        AWS_ENDPOINT_URL=endpoint,
        TAO_JOB_FILES=str(files),
        TAO_JOB_ID=f"bench-{uuid.uuid4().hex[:8]}",
        TAO_WORK_DIR=str(work / "work"),
        TAO_LOCAL_RESULTS_BASE=str(work / "results"),
        PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        **env,
    )
    started = time.perf_counter()
    proc = subprocess.run(ep.command, env=job_env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"runner failed ({proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-2000:]}")
    phase = 0.0
    for line in proc.stdout.splitlines():
        event = parse_progress(line)
        if (
            event
            and event.get("status") == "complete"
            and event["phase"] in ("download", "upload")
            and event.get("files")
        ):
            phase = float(event["elapsed_s"])
    return wall, phase


def runner_download(
    endpoint: str, bucket: str, prefix: str, dest: Path, work: Path, *, concurrency: int
) -> tuple[float, float]:
    ep = build_entrypoint("true", inputs={str(dest): f"s3://{bucket}/{prefix}/"})
    return run_runner(ep, endpoint, work, {"TAO_TRANSFER_CONCURRENCY": str(concurrency)})


def runner_upload(endpoint: str, bucket: str, src: Path, work: Path, concurrency: int) -> tuple[float, float]:
    ep = build_entrypoint("true", outputs=[str(src)])
    return run_runner(ep, endpoint, work, {"TAO_TRANSFER_CONCURRENCY": str(concurrency), "S3_BUCKET_NAME": bucket})


# ---------------------------------------------------------------------------------------------------- boto3 TM
def tm_download(client: Any, bucket: str, prefix: str, dest: Path, concurrency: int) -> float:
    started = time.perf_counter()
    keys = [
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
        for o in page.get("Contents", [])
    ]
    with TransferManager(client, TransferConfig(max_request_concurrency=concurrency)) as tm:
        futures = []
        for key in keys:
            target = dest / key[len(prefix) + 1 :]
            target.parent.mkdir(parents=True, exist_ok=True)
            futures.append(tm.download(bucket, key, str(target)))
        for future in futures:
            future.result()
    return time.perf_counter() - started


def tm_upload(client: Any, bucket: str, src: Path, prefix: str, concurrency: int) -> float:
    started = time.perf_counter()
    with TransferManager(client, TransferConfig(max_request_concurrency=concurrency)) as tm:
        futures = [tm.upload(str(p), bucket, f"{prefix}/{p.relative_to(src).as_posix()}") for p in files_under(src)]
        for future in futures:
            future.result()
    return time.perf_counter() - started


# ---------------------------------------------------------------------------------------------------- main
def make_dataset(root: Path, count: int, size: int) -> Path:
    root.mkdir(parents=True)
    chunk = os.urandom(min(size, 8 * MiB))
    for i in range(count):
        with open(root / f"part-{i:05d}.bin", "wb") as fh:
            left = size
            while left:
                n = min(left, len(chunk))
                fh.write(chunk[:n] if i % 2 == 0 else chunk[-n:])
                left -= n
    return root


def best(fn: Callable[[], Any], repeat: int, reset: Callable[[], None]) -> Any:
    results = []
    for _ in range(repeat):
        reset()
        results.append(fn())
    return min(results, key=lambda r: r[0] if isinstance(r, tuple) else r)


class Bench:
    """One benchmark session against one moto server."""

    def __init__(self, endpoint: str, tmp: Path, concurrency: int, repeat: int) -> None:
        self.endpoint = endpoint
        self.tmp = tmp
        self.concurrency = concurrency
        self.repeat = repeat
        self.client = make_client(endpoint, concurrency)
        self.bucket = "bench"
        self.client.create_bucket(Bucket=self.bucket)

    def delete_prefix(self, prefix: str) -> None:
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            objs = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if objs:
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": objs})

    def reset_download(self) -> None:
        for name in ("dl-runner", "dl-tm", "work"):
            shutil.rmtree(self.tmp / name, ignore_errors=True)

    def reset_upload(self) -> None:
        shutil.rmtree(self.tmp / "work", ignore_errors=True)
        self.delete_prefix("results/")
        self.delete_prefix("tm-up/")

    def case(self, label: str, count: int, size: int) -> list[dict[str, Any]]:
        src = make_dataset(self.tmp / f"src-{count}", count, size)
        nbytes = total_bytes(src)
        seed = f"seed-{count}"
        c, b, work = self.concurrency, self.bucket, self.tmp / "work"
        tm_upload(self.client, b, src, seed, c)  # the download source (and a warm-up)
        fetch = functools.partial(runner_download, self.endpoint, b, seed, self.tmp / "dl-runner", work, concurrency=c)
        r_dl = best(fetch, self.repeat, self.reset_download)
        assert total_bytes(self.tmp / "dl-runner") == nbytes
        t_dl = best(
            functools.partial(tm_download, self.client, b, seed, self.tmp / "dl-tm", c),
            self.repeat,
            self.reset_download,
        )
        assert total_bytes(self.tmp / "dl-tm") == nbytes
        self.reset_download()
        r_ul = best(functools.partial(runner_upload, self.endpoint, b, src, work, c), self.repeat, self.reset_upload)
        t_ul = best(functools.partial(tm_upload, self.client, b, src, "tm-up", c), self.repeat, self.reset_upload)
        self.reset_upload()
        shutil.rmtree(src)
        self.delete_prefix(seed + "/")
        return [
            {
                "case": label,
                "direction": direction,
                "mb": nbytes / 1e6,
                "runner_wall_s": runner_t[0],
                "runner_phase_s": runner_t[1],
                "tm_s": tm_t,
            }
            for direction, runner_t, tm_t in (("download", r_dl, t_dl), ("upload", r_ul, t_ul))
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--small", action="store_true", help="quick run: 64 MiB and 200 x 64 KiB")
    parser.add_argument("--repeat", type=int, default=2, help="best of N for each measurement")
    parser.add_argument("--concurrency", type=int, default=10, help="threads for both (boto3's default is 10)")
    opts = parser.parse_args()
    cases = [
        ("1 x 64 MiB" if opts.small else "1 x 512 MiB", 1, (64 if opts.small else 512) * MiB),
        ("200 x 64 KiB" if opts.small else "2000 x 64 KiB", 200 if opts.small else 2000, 64 * 1024),
    ]
    tmp = Path(tempfile.mkdtemp(prefix="tao-bench-"))
    rows: list[dict[str, Any]] = []
    try:
        with moto_server() as endpoint:
            bench = Bench(endpoint, tmp, opts.concurrency, opts.repeat)
            for label, count, size in cases:
                rows += bench.case(label, count, size)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(
        f"\nStaging throughput vs moto S3 on loopback (concurrency {opts.concurrency}, best of {opts.repeat}; "
        f"runner timed as a whole process incl. start-up, sha256 + manifests)"
    )
    header = f"{'case':<16}{'direction':<10}{'runner MB/s':>12}{'(phase)':>10}{'boto3 TM MB/s':>15}{'ratio':>8}"
    print(header)
    print("-" * len(header))
    for row in rows:
        runner_mbs = row["mb"] / row["runner_wall_s"]
        phase_mbs = row["mb"] / row["runner_phase_s"] if row["runner_phase_s"] else float("nan")
        tm_mbs = row["mb"] / row["tm_s"]
        row.update(runner_mb_s=runner_mbs, runner_phase_mb_s=phase_mbs, tm_mb_s=tm_mbs, ratio=runner_mbs / tm_mbs)
        print(
            f"{row['case']:<16}{row['direction']:<10}{runner_mbs:>12.1f}{phase_mbs:>10.1f}{tm_mbs:>15.1f}"
            f"{row['ratio']:>8.2f}"
        )
    print("\nJSON:", json.dumps(rows))


if __name__ == "__main__":
    main()
