"""The runner end to end against a real S3 API (moto server on loopback): staging, results kinds, the Lustre-style
cache, atomic commits with manifests, and classified failures."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tao.runner.entrypoint import (
    MANIFEST_NAME,
    build_entrypoint,
    is_complete,
    parse_progress,
    read_manifest,
)
from airflow_provider_tao.runner.job.fsops import CACHE_META_DIR
from tests.integration.runner.tcp_proxy import TcpProxy
from tests.unit.runner.runner_harness import JobRun, job_env, stage

pytestmark = pytest.mark.integration
RunJob = Callable[..., JobRun]

# Runs inside the job: reads the JSON spec, checks the staged inputs, writes outputs.
TRAIN = r"""
import json, os, sys
spec = json.load(open(sys.argv[1]))
d = spec["dataset"]
out = spec["train"]["results_dir"]
images = sorted(os.path.relpath(os.path.join(r, f), d["images"]) for r, _, fs in os.walk(d["images"]) for f in fs)
with open(os.path.join(out, "report.txt"), "w") as fh:
    fh.write(open(d["train_csv"]).read() + "|" + ",".join(images))
os.makedirs(os.path.join(out, "ckpt"), exist_ok=True)
open(os.path.join(out, "ckpt", "model.pt"), "wb").write(b"\0weights" * 1000)
print("Epoch 1/1 step 10")
"""


def put(s3: Any, bucket: str, objects: dict[str, bytes]) -> None:
    for key, body in objects.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)


def keys(s3: Any, bucket: str, prefix: str = "") -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []) or [])


def body(s3: Any, bucket: str, key: str) -> bytes:
    data: bytes = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    return data


def s3_manifest(s3: Any, uri: str) -> dict[str, Any]:
    doc = read_manifest(uri, s3_client=s3)
    assert doc is not None, f"no manifest at {uri}"
    return doc


def failure(run: JobRun) -> dict[str, Any]:
    assert len(run.failures) == 1, run.stdout + run.proc.stderr
    return run.failures[0]


DATA = {"data/train.csv": b"a,b\n1,2\n", "data/images/x.jpg": b"X" * 100, "data/images/sub/y.jpg": b"Y" * 50}


# ---------------------------------------------------------------------------------------------------- modes
def test_config_mode_end_to_end_to_the_bucket(run_job: RunJob, s3: Any, bucket: str) -> None:
    put(s3, bucket, DATA)
    spec = {
        "dataset": {"train_csv": f"s3://{bucket}/data/train.csv", "images": f"s3://{bucket}/data/images/"},
        "train": {"results_dir": "output", "epochs": 1},
    }
    ep = build_entrypoint(
        ["python3", "-c", TRAIN, "{config_path}"],
        specs=spec,
        inputs=["dataset.train_csv", "dataset.images"],
        outputs=["train.results_dir"],
        config_format="json",
    )
    run = run_job(ep, env={"S3_BUCKET_NAME": bucket})
    assert run.rc == 0, run.stdout + run.proc.stderr
    dest = f"s3://{bucket}/results/{run.job_id}/train_results_dir"
    prefix = f"results/{run.job_id}/train_results_dir/"
    assert keys(s3, bucket, prefix) == [prefix + p for p in (MANIFEST_NAME, "ckpt/model.pt", "report.txt")]
    assert body(s3, bucket, prefix + "report.txt") == b"a,b\n1,2\n|sub/y.jpg,x.jpg"
    manifest = s3_manifest(s3, dest)
    weights = b"\0weights" * 1000
    assert manifest["files"][0] == {
        "path": "ckpt/model.pt",
        "size": len(weights),
        "sha256": hashlib.sha256(weights).hexdigest(),
    }
    assert manifest["exit_code"] == 0 and manifest["key"] == "train.results_dir"
    assert is_complete(dest, s3_client=s3)
    assert run.done()["outputs"] == {"train.results_dir": dest}
    assert ep.output_uris(f"s3://{bucket}/results/{run.job_id}") == {"train.results_dir": dest}
    download = [p for p in run.progress if p["phase"] == "download"][-1]
    assert (download["files"], download["bytes"], download["status"]) == (3, 158, "complete")
    assert any(p.get("step") == 10 for p in run.progress if p["phase"] == "run")


def test_args_mode_end_to_end(run_job: RunJob, s3: Any, bucket: str) -> None:
    put(s3, bucket, {"in/x.txt": b"hello"})
    copy = (
        "import shutil,sys,os; a=sys.argv[1:]; d=a[a.index('--data')+1]; o=a[a.index('--out')+1]; "
        "shutil.copy(d, os.path.join(o, 'copied.txt')); print(a[a.index('--note')+1])"
    )
    ep = build_entrypoint(
        ["python3", "-c", copy],
        args={"data": f"s3://{bucket}/in/x.txt", "out": "", "note": "it's $(x) {y}"},
        inputs=["data"],
        outputs=["out"],
    )
    run = run_job(ep, env={"S3_BUCKET_NAME": bucket})
    assert run.rc == 0, run.stdout + run.proc.stderr
    assert "it's $(x) {y}" in run.stdout.splitlines()
    assert body(s3, bucket, f"results/{run.job_id}/out/copied.txt") == b"hello"
    assert is_complete(f"s3://{bucket}/results/{run.job_id}/out", s3_client=s3)


def test_passthrough_prefix_and_file_inputs_and_uploaded_outputs(
    run_job: RunJob, s3: Any, bucket: str, tmp_path: Path
) -> None:
    put(s3, bucket, DATA)
    data, one, out = tmp_path / "c" / "data", tmp_path / "c" / "one.csv", tmp_path / "c" / "out"
    ep = build_entrypoint(
        f"mkdir -p {out}/logs && ls -R {data} > {out}/listing.txt && cat {one} > {out}/one.csv "
        f"&& echo x > {out}/logs/debug.tmp",
        inputs={str(data): f"s3://{bucket}/data", str(one): f"s3://{bucket}/data/train.csv"},
        outputs=[str(out)],
        upload_excludes=["*.tmp"],
    )
    run = run_job(ep, env={"S3_BUCKET_NAME": bucket})
    assert run.rc == 0, run.stdout + run.proc.stderr
    assert (data / "images" / "sub" / "y.jpg").read_bytes() == b"Y" * 50
    prefix = f"results/{run.job_id}/out/"
    assert keys(s3, bucket, prefix) == [prefix + p for p in (MANIFEST_NAME, "listing.txt", "one.csv")]
    assert body(s3, bucket, prefix + "one.csv") == b"a,b\n1,2\n"
    assert is_complete(f"s3://{bucket}/results/{run.job_id}/out", s3_client=s3)


# ---------------------------------------------------------------------------------------------------- results kinds
def test_results_root_mount_kind_with_the_lustre_cache(run_job: RunJob, s3: Any, bucket: str, tmp_path: Path) -> None:
    put(s3, bucket, DATA)
    spec = {
        "dataset": {"train_csv": f"s3://{bucket}/data/train.csv", "images": f"s3://{bucket}/data/images/"},
        "train": {"results_dir": ""},
    }
    ep = build_entrypoint(
        ["python3", "-c", TRAIN, "{config_path}"],
        specs=spec,
        inputs=["dataset.train_csv", "dataset.images"],
        outputs=["train.results_dir"],
        config_format="json",
        mount_path=str(tmp_path / "lustre" / "cache"),
    )
    run = run_job(ep, env={"TAO_RESULTS_ROOT": str(tmp_path / "lustre" / "results"), "S3_BUCKET_NAME": bucket})
    assert run.rc == 0, run.stdout + run.proc.stderr
    dest = tmp_path / "lustre" / "results" / run.job_id / "train_results_dir"
    assert (dest / "report.txt").read_text() == "a,b\n1,2\n|sub/y.jpg,x.jpg"
    assert is_complete(str(dest), verify="sha256")
    assert keys(s3, bucket, "results/") == []  # mount kind: nothing uploaded
    cache = tmp_path / "lustre" / "cache"
    assert (cache / bucket / "data" / "images" / "sub" / "y.jpg").read_bytes() == b"Y" * 50
    sidecar = json.loads((cache / CACHE_META_DIR / bucket / "data" / "train.csv.json").read_text())
    assert sidecar["etag"] == s3.head_object(Bucket=bucket, Key="data/train.csv")["ETag"]
    assert not list((cache / bucket).rglob("*.json"))  # bookkeeping stays out of the data tree


def test_stale_cache_is_refetched_when_the_object_changes(
    run_job: RunJob, s3: Any, bucket: str, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    put(s3, bucket, {"cfg/prompt.txt": b"version-1"})
    ep = build_entrypoint(
        'cat {config_path} > /dev/null; python3 -c "import json,sys; '
        "print('CONTENT=' + open(json.load(open(sys.argv[1]))['p']).read())\" {config_path}",
        specs={"p": f"s3://{bucket}/cfg/prompt.txt"},
        inputs=["p"],
        config_format="json",
        mount_path=str(cache),
    )

    def content(run: JobRun) -> str:
        assert run.rc == 0, run.stdout + run.proc.stderr
        return next(line for line in run.stdout.splitlines() if line.startswith("CONTENT="))[8:]

    def cached(run: JobRun) -> int:
        return int([p for p in run.progress if p["phase"] == "download"][-1].get("cached", 0))

    first = run_job(ep)
    assert (content(first), cached(first)) == ("version-1", 0)
    second = run_job(ep)
    assert (content(second), cached(second)) == ("version-1", 1)
    put(s3, bucket, {"cfg/prompt.txt": b"version-2"})  # same key, same size, new ETag
    third = run_job(ep)
    assert (content(third), cached(third)) == ("version-2", 0)
    cached_file = cache / bucket / "cfg" / "prompt.txt"
    cached_file.write_bytes(b"vers")  # truncated by a crashed writer
    fourth = run_job(ep)
    assert (content(fourth), cached(fourth)) == ("version-2", 0)
    assert not [p for p in cached_file.parent.iterdir() if p.name != "prompt.txt"]  # no temp files left


def test_passthrough_input_is_linked_from_the_cache(run_job: RunJob, s3: Any, bucket: str, tmp_path: Path) -> None:
    put(s3, bucket, DATA)
    target = tmp_path / "c" / "images"
    ep = build_entrypoint(
        f"ls {target}/sub", inputs={str(target): f"s3://{bucket}/data/images/"}, mount_path=str(tmp_path / "cache")
    )
    run = run_job(ep)
    assert run.rc == 0 and "y.jpg" in run.stdout
    assert target.is_symlink() and target.resolve() == (tmp_path / "cache" / bucket / "data" / "images").resolve()


def test_ephemeral_kind_warns_before_the_command(run_job: RunJob, s3: Any, bucket: str) -> None:
    put(s3, bucket, {"k": b"v"})
    ep = build_entrypoint("echo COMMAND-STARTED", specs={"d": f"s3://{bucket}/k", "o": ""}, inputs=["d"], outputs=["o"])
    run = run_job(ep)
    lines = run.stdout.splitlines()
    first_warning = next(i for i, line in enumerate(lines) if "WARNING" in line and "LOST" in line)
    assert first_warning < lines.index("COMMAND-STARTED")
    assert is_complete(str(run.root / "ephemeral" / run.job_id / "o"))


def test_explicit_s3_output_overrides_the_results_dir(run_job: RunJob, s3: Any, bucket: str) -> None:
    ep = build_entrypoint(
        "python3 -c \"import json,sys,os; d=json.load(open(sys.argv[1]))['export']['dir']; "
        "open(os.path.join(d,'model.onnx'),'w').write('onnx')\" {config_path}",
        specs={"export": {"dir": f"s3://{bucket}/custom/export/"}},
        outputs=["export.dir"],
        config_format="json",
    )
    run = run_job(ep, env={"S3_BUCKET_NAME": bucket})
    assert run.rc == 0, run.stdout + run.proc.stderr
    job_root = f"results/{run.job_id}/"
    assert keys(s3, bucket) == [f"custom/export/{MANIFEST_NAME}", "custom/export/model.onnx", job_root + MANIFEST_NAME]
    assert is_complete(f"s3://{bucket}/custom/export", s3_client=s3)
    assert run.done()["outputs"] == {"export.dir": f"s3://{bucket}/custom/export"}
    job_manifest = s3_manifest(s3, f"s3://{bucket}/{job_root}")  # the job's commit marker, written last
    assert job_manifest["files"] == [] and job_manifest["outputs"] == run.done()["outputs"]


def test_upload_excludes_and_loose_files_with_a_job_manifest(run_job: RunJob, s3: Any, bucket: str) -> None:
    ep = build_entrypoint(
        "cd {results_dir} && mkdir -p o/logs o/ckpt && echo a > o/ckpt/a.pt && echo t > o/x.tmp "
        "&& echo l > o/logs/run.log && echo s > summary.json && echo t > loose.tmp",
        args={"o": "o"},
        outputs=["o"],
        upload_excludes=["*.tmp", "logs/*"],
    )
    run = run_job(ep, env={"S3_BUCKET_NAME": bucket})
    assert run.rc == 0, run.stdout + run.proc.stderr
    root = f"results/{run.job_id}/"
    assert keys(s3, bucket) == [root + p for p in (MANIFEST_NAME, f"o/{MANIFEST_NAME}", "o/ckpt/a.pt", "summary.json")]
    job_manifest = s3_manifest(s3, f"s3://{bucket}/{root}")
    assert [f["path"] for f in job_manifest["files"]] == ["o/ckpt/a.pt", "summary.json"]
    assert [f["path"] for f in s3_manifest(s3, f"s3://{bucket}/{root}o")["files"]] == ["ckpt/a.pt"]


def test_failing_command_still_uploads_and_exits_non_zero(
    run_job: RunJob, s3: Any, bucket: str, tmp_path: Path
) -> None:
    out = tmp_path / "c" / "ckpt"
    ep = build_entrypoint(f"mkdir -p {out} && echo e3 > {out}/epoch3.pt && exit 4", outputs=[str(out)])
    run = run_job(ep, env={"S3_BUCKET_NAME": bucket})
    assert run.rc == 4
    assert s3_manifest(s3, f"s3://{bucket}/results/{run.job_id}/ckpt")["exit_code"] == 4
    assert not run.failures


def test_multipart_download_and_upload_round_trip(run_job: RunJob, s3: Any, bucket: str) -> None:
    blob = os.urandom(23 * 1024 * 1024 + 123)
    put(s3, bucket, {"big/blob.bin": blob})
    script = (
        "import hashlib,sys,os,json; s=json.load(open(sys.argv[1])); d=open(s['blob'],'rb').read(); "
        "print('SHA=' + hashlib.sha256(d).hexdigest()); "
        "open(os.path.join(s['out'], 'copy.bin'), 'wb').write(d[::-1])"
    )
    ep = build_entrypoint(
        ["python3", "-c", script, "{config_path}"],
        specs={"blob": f"s3://{bucket}/big/blob.bin", "out": ""},
        inputs=["blob"],
        outputs=["out"],
        config_format="json",
    )
    run = run_job(ep, env={"S3_BUCKET_NAME": bucket, "TAO_PART_SIZE_MB": "5"})
    assert run.rc == 0, run.stdout + run.proc.stderr
    assert f"SHA={hashlib.sha256(blob).hexdigest()}" in run.stdout.splitlines()
    key = f"results/{run.job_id}/out/copy.bin"
    assert body(s3, bucket, key) == blob[::-1]
    assert "-" in s3.head_object(Bucket=bucket, Key=key)["ETag"]  # really multipart
    manifest = s3_manifest(s3, f"s3://{bucket}/results/{run.job_id}/out")
    assert manifest["files"] == [
        {"path": "copy.bin", "size": len(blob), "sha256": hashlib.sha256(blob[::-1]).hexdigest()}
    ]


# ---------------------------------------------------------------------------------------------------- failures
def test_kill_mid_upload_leaves_no_manifest(s3: Any, bucket: str, tmp_path: Path, moto_endpoint: str) -> None:
    out = tmp_path / "c" / "out"
    out.mkdir(parents=True)
    for i in range(1000):
        (out / f"f{i:04d}.bin").write_bytes(os.urandom(8192))
    ep = build_entrypoint("true", outputs=[str(out)])
    root = tmp_path / "kill"
    stage(ep, root / "files")
    env = job_env(
        root,
        "killed-job",
        {
            "S3_BUCKET_NAME": bucket,
            "AWS_ENDPOINT_URL": moto_endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "TAO_TRANSFER_CONCURRENCY": "1",
            "TAO_PROGRESS_INTERVAL": "0.05",
        },
    )
    seen = None
    with subprocess.Popen(ep.command, env=env, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            event = parse_progress(line)
            if event and event["phase"] == "upload" and 20 <= event["files"] < event["total_files"]:
                seen = event
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait(timeout=30)
    assert seen is not None and proc.returncode == -signal.SIGKILL
    dest = f"s3://{bucket}/results/killed-job/out"
    uploaded = keys(s3, bucket, "results/killed-job/")
    assert 20 <= len(uploaded) < 1000
    assert not [k for k in uploaded if k.endswith(MANIFEST_NAME)]
    assert read_manifest(dest, s3_client=s3) is None
    assert not is_complete(dest, s3_client=s3)
    assert not is_complete(f"s3://{bucket}/results/killed-job", s3_client=s3)


def test_rerun_over_a_committed_destination_removes_the_old_manifest_first(
    run_job: RunJob, s3: Any, bucket: str
) -> None:
    ep = build_entrypoint("echo v > {results_dir}/o/x.txt", args={"o": ""}, outputs=["o"])
    first = run_job(ep, env={"S3_BUCKET_NAME": bucket}, job_id="same-job")
    assert first.rc == 0 and is_complete(f"s3://{bucket}/results/same-job/o", s3_client=s3)
    s3.put_object(Bucket=bucket, Key="results/same-job/o/stale.bin", Body=b"from an older try")
    # A retry that dies right after its command: simulate by breaking the upload with a bad endpoint.
    second = run_job(
        ep,
        env={
            "S3_BUCKET_NAME": bucket,
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
            "TAO_S3_MAX_ATTEMPTS": "1",
            "TAO_TRANSFER_RETRIES": "1",
        },
        job_id="same-job",
    )
    assert second.rc == 75 and failure(second)["err_class"] == "ERR_INFRA"
    third = run_job(ep, env={"S3_BUCKET_NAME": bucket}, job_id="same-job")
    assert third.rc == 0
    assert is_complete(f"s3://{bucket}/results/same-job/o", s3_client=s3)


@pytest.mark.parametrize("missing", ["nope/train.csv", "data/images-typo/"])
def test_missing_input_is_err_config_and_the_command_never_runs(
    run_job: RunJob, s3: Any, bucket: str, tmp_path: Path, missing: str
) -> None:
    put(s3, bucket, DATA)
    marker = tmp_path / "ran"
    ep = build_entrypoint(f"touch {marker}", specs={"d": f"s3://{bucket}/{missing}"}, inputs=["d"])
    run = run_job(ep, env={"S3_BUCKET_NAME": bucket})
    assert run.rc == 2
    verdict = failure(run)
    assert verdict["err_class"] == "ERR_CONFIG"
    assert f"s3://{bucket}/{missing}" in verdict["message"] and "NoSuchKey" in verdict["message"]
    assert not marker.exists()


def test_missing_bucket_is_err_config(run_job: RunJob) -> None:
    ep = build_entrypoint("true", inputs={"/tmp/x": "s3://no-such-bucket-tao/k"})
    run = run_job(ep)
    assert run.rc == 2 and failure(run)["err_class"] == "ERR_CONFIG"


def test_endpoint_gone_mid_transfer_is_err_infra(
    run_job: RunJob, s3: Any, bucket: str, tmp_path: Path, proxy: TcpProxy
) -> None:
    put(s3, bucket, {f"many/f{i:04d}.bin": os.urandom(4096) for i in range(400)})
    target = tmp_path / "c" / "many"
    ep = build_entrypoint("echo SHOULD-NOT-RUN", inputs={str(target): f"s3://{bucket}/many/"})
    root = tmp_path / "infra"
    stage(ep, root / "files")
    env = job_env(
        root,
        "infra-job",
        {
            "AWS_ENDPOINT_URL": proxy.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "TAO_TRANSFER_CONCURRENCY": "1",
            "TAO_PROGRESS_INTERVAL": "0.05",
            "TAO_S3_MAX_ATTEMPTS": "2",
            "TAO_TRANSFER_RETRIES": "2",
            "TAO_S3_CONNECT_TIMEOUT": "2",
        },
    )
    lines: list[str] = []
    killed_at = None
    with subprocess.Popen(ep.command, env=env, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            event = parse_progress(line)
            if killed_at is None and event and event["phase"] == "download" and event["files"] >= 10:
                killed_at = event["files"]
                proxy.kill()
        rc = proc.wait(timeout=120)
    out = "".join(lines)
    assert killed_at is not None and killed_at < 400, out
    assert rc == 75, out
    verdicts = [json.loads(line.split("TAO_FAILURE ", 1)[1]) for line in lines if "TAO_FAILURE " in line]
    assert len(verdicts) == 1 and verdicts[0]["err_class"] == "ERR_INFRA", out
    assert "SHOULD-NOT-RUN" not in out
    assert not list(target.rglob("*.tao-part"))  # downloads are atomic: no half files left behind
    for path in target.rglob("*.bin"):
        assert path.stat().st_size == 4096


def test_heartbeats_during_a_long_transfer(run_job: RunJob, s3: Any, bucket: str, tmp_path: Path) -> None:
    put(s3, bucket, {f"hb/f{i:03d}": b"x" * 1024 for i in range(300)})
    ep = build_entrypoint("true", inputs={str(tmp_path / "hb"): f"s3://{bucket}/hb/"})
    started = time.monotonic()
    run = run_job(ep, env={"TAO_TRANSFER_CONCURRENCY": "1", "TAO_PROGRESS_INTERVAL": "0.1"})
    elapsed = time.monotonic() - started
    assert run.rc == 0
    beats = [p for p in run.progress if p["phase"] == "download"]
    assert beats[0]["total_files"] == 300 and beats[-1]["files"] == 300
    assert len(beats) >= 3 or elapsed < 0.3
    assert len(beats) <= elapsed / 0.1 + 3  # never more often than the interval (plus start / end)
