"""The built entrypoint, run for real as a subprocess (no S3): hostile input arrives verbatim, placeholders,
exit codes, failures, progress, results kinds, optional packages."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
import threading
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_tao.runner.entrypoint import (
    MANIFEST_NAME,
    PLACEHOLDERS,
    RUNNER_MANIFEST_FILE,
    build_entrypoint,
    is_complete,
    read_manifest,
)
from airflow_provider_tao.runner.job.hubs import MODEL_SCHEMES
from tests.unit.runner.runner_harness import JobRun, job_env, stage

RunJob = Callable[..., JobRun]
ECHO = Path(__file__).with_name("_echo_argv.py")

FRAGMENTS = [
    "'",
    '"',
    ";",
    "$(id)",
    "`id`",
    "${HOME}",
    "$HOME",
    "{x}",
    "{}",
    "{0}",
    "{config_path!r}",
    "\n",
    "\\",
    "\\n",
    "é",
    "日本語",
    "😀",
    "*",
    "~",
    "&&",
    "|",
    ">",
    "<",
    "#",
    "!",
    "%s",
    "--flag",
    " ",
    "\t",
    "$'\\x41'",
    "\r",
    "'\"'\"'",
    "\\'",
    "-",
]
hostile = (
    st.lists(
        st.sampled_from(FRAGMENTS)
        | st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=6),
        min_size=1,
        max_size=8,
    )
    .map("".join)
    .filter(lambda s: not any(p in s for p in PLACEHOLDERS) and "TAO_END_OF_TEXT" not in s)
    # a spec value that starts like a model reference is one, staged by design (Hypothesis draws literals of the
    # code under test: it once made "ngc://", which the runner fetches and refuses as malformed)
    .filter(lambda s: not s.startswith(MODEL_SCHEMES))
)
SETTINGS = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


def echoed(run: JobRun) -> Any:
    assert run.rc == 0, run.stdout + run.proc.stderr
    return json.loads((run.root / "echo.json").read_text(encoding="utf-8"))


def run_echo(run_job: RunJob, ep: Any, **env: str) -> JobRun:
    return run_job(ep, env=env)


# ---------------------------------------------------------------------------------------------------- verbatim
@SETTINGS
@given(a=hostile, b=hostile)
def test_string_command_is_parsed_by_exactly_one_bash(run_job: RunJob, a: str, b: str) -> None:
    ep = build_entrypoint(f"python3 {ECHO} {shlex.quote(a)} {shlex.quote(b)}")
    assert echoed(run_echo(run_job, ep)) == [a, b]


@SETTINGS
@given(body=hostile)
def test_string_command_body_arrives_verbatim(run_job: RunJob, body: str) -> None:
    ep = build_entrypoint(f"cat > \"$ECHO_OUT\" <<'TAO_END_OF_TEXT'\n{body}\nTAO_END_OF_TEXT\n")
    run = run_echo(run_job, ep)
    assert run.rc == 0, run.stdout + run.proc.stderr
    assert (run.root / "echo.json").read_bytes().decode("utf-8") == body + "\n"


@SETTINGS
@given(a=hostile, b=hostile)
def test_list_command_is_argv_without_a_shell(run_job: RunJob, a: str, b: str) -> None:
    ep = build_entrypoint(["python3", str(ECHO), a, b, "${HOME}", "$(id)"])
    assert echoed(run_echo(run_job, ep)) == [a, b, "${HOME}", "$(id)"]


@SETTINGS
@given(a=hostile, b=hostile, as_list=st.booleans())
def test_args_values_become_separate_argv_tokens(run_job: RunJob, a: str, b: str, as_list: bool) -> None:
    command: Any = ["python3", str(ECHO)] if as_list else f"python3 {ECHO}"
    args = {"name": a, "tags": [b, a], "amp": True, "off": False, "none": None, "epochs": 3, "lr": 0.5, "--raw": b}
    ep = build_entrypoint(command, args=args)
    assert echoed(run_echo(run_job, ep)) == [
        "--name",
        a,
        "--tags",
        b,
        "--tags",
        a,
        "--amp",
        "--epochs",
        "3",
        "--lr",
        "0.5",
        "--raw",
        b,
    ]


def _load(text: str, fmt: str) -> Any:
    loaders: dict[str, Callable[[str], Any]] = {"json": json.loads, "yaml": yaml.safe_load, "toml": tomllib.loads}
    return loaders[fmt](text)


@SETTINGS
@given(a=hostile, b=hostile, key=hostile, fmt=st.sampled_from(["yaml", "toml", "json"]))
def test_spec_values_arrive_verbatim(run_job: RunJob, a: str, b: str, key: str, fmt: str) -> None:
    spec = {"section": {"value": a, key: [b, a], "n": 1, "nested": {"k": b}}, "top": b}
    ep = build_entrypoint(["python3", str(ECHO), "--copy", "{config_path}"], specs=spec, config_format=fmt)
    run = run_echo(run_job, ep)
    assert run.rc == 0, run.stdout + run.proc.stderr
    assert _load((run.root / "echo.json").read_text(encoding="utf-8"), fmt) == spec


@pytest.mark.parametrize("fmt", ["json", "yaml", "toml"])
def test_a_4mib_spec_round_trips(run_job: RunJob, fmt: str) -> None:
    blob = ("{x} ${HOME} $(id) `id` 'q' \"dq\" é 日本\n" * 120_000)[: 4 * 1024 * 1024 + 17]
    spec = {"data": {"blob": blob, "items": [{"i": i, "s": f"v{i}"} for i in range(2000)]}}
    ep = build_entrypoint(["python3", str(ECHO), "--copy", "{config_path}"], specs=spec, config_format=fmt)
    assert len(json.dumps(ep.command)) < 600
    run = run_echo(run_job, ep)
    assert run.rc == 0, run.stdout[-2000:] + run.proc.stderr[-2000:]
    assert _load((run.root / "echo.json").read_text(encoding="utf-8"), fmt) == spec
    assert next(p for p in run.progress if p["phase"] == "spec")["bytes"] > 4 * 1024 * 1024


# ---------------------------------------------------------------------------------------------------- placeholders
def test_placeholders_in_a_string_command(run_job: RunJob) -> None:
    ep = build_entrypoint(
        "printf '%s\\n' {config_path} {results_dir} {job_id} '{x}' \"${TAO_JOB_ID}\" "
        '"$TAO_CONFIG_PATH" > "$ECHO_OUT"',
        specs={"a": 1},
    )
    run = run_echo(run_job, ep)
    assert run.rc == 0, run.stdout + run.proc.stderr
    config, results, job_id, x, env_job, env_config = (run.root / "echo.json").read_text().splitlines()
    assert config.endswith("/spec.yaml") and config == env_config
    assert results == str(run.root / "ephemeral" / run.job_id)
    assert job_id == env_job == run.job_id
    assert x == "{x}"


def test_placeholders_in_a_list_command(run_job: RunJob) -> None:
    ep = build_entrypoint(["python3", str(ECHO), "{job_id}", "pre-{results_dir}", "{x}", "{job_id!r}"])
    run = run_echo(run_job, ep)
    assert echoed(run) == [run.job_id, f"pre-{run.root / 'ephemeral' / run.job_id}", "{x}", "{job_id!r}"]


# ---------------------------------------------------------------------------------------------------- exit codes
def test_exit_code_is_the_commands(run_job: RunJob) -> None:
    run = run_job(build_entrypoint("echo partial; exit 7"))
    assert run.rc == 7
    assert run.done()["exit_code"] == 7
    assert not run.failures  # the command's failure is not the runner's


def test_a_signal_death_is_128_plus_n(run_job: RunJob) -> None:
    run = run_job(build_entrypoint("kill -9 $$"))
    assert run.rc == 128 + 9


def test_outputs_are_committed_even_when_the_command_fails(run_job: RunJob, tmp_path: Path) -> None:
    out = tmp_path / "container" / "ckpt"
    ep = build_entrypoint(f"mkdir -p {out} && echo epoch1 > {out}/last.pt && exit 3", outputs=[str(out)])
    run = run_job(ep, env={"TAO_RESULTS_ROOT": str(tmp_path / "lustre")})
    assert run.rc == 3
    dest = tmp_path / "lustre" / run.job_id / "ckpt"
    manifest = read_manifest(str(dest))
    assert manifest is not None and manifest["exit_code"] == 3
    assert [f["path"] for f in manifest["files"]] == ["last.pt"]


def test_sigterm_is_forwarded_and_outputs_still_committed(tmp_path: Path) -> None:
    out = tmp_path / "c" / "out"
    ep = build_entrypoint(
        f"mkdir -p {out}; trap 'echo saved > {out}/ckpt.pt; exit 5' TERM; echo READY; sleep 30 & wait",
        outputs=[str(out)],
    )
    root = tmp_path / "sig"
    stage(ep, root / "files")
    env = job_env(root, "sigjob", {"TAO_RESULTS_ROOT": str(tmp_path / "lustre")})
    with subprocess.Popen(ep.command, env=env, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "READY":
                break
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        rest = proc.stdout.read()
        rc = proc.wait(timeout=30)
    assert rc == 5, rest
    assert is_complete(str(tmp_path / "lustre" / "sigjob" / "out"))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def test_a_background_process_holding_the_output_pipe_does_not_hold_the_job(run_job: RunJob, tmp_path: Path) -> None:
    """Defect 7: ``tensorboard &`` kept the job running until its wall time. The runner reads the command's
    output until it exits plus a bounded drain, then stops what the command left in its process group."""
    pid_file = tmp_path / "bg.pid"
    cmd = f"(sleep 600 & echo $! > {pid_file}); (sleep 0.3; echo late line) & echo trained"
    run = run_job(build_entrypoint(cmd), timeout=90)  # the old runner waited the whole 600 s: TimeoutExpired
    assert run.rc == 0, run.stdout
    assert "trained" in run.stdout
    assert "late line" in run.stdout  # output written during the drain is still shown
    assert "stopped 1 background process(es)" in run.stdout
    assert _gone(int(pid_file.read_text()))


def test_a_process_that_left_the_group_cannot_hold_the_job_either(run_job: RunJob, tmp_path: Path) -> None:
    pid_file = tmp_path / "daemon.pid"
    cmd = f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 600' & sleep 0.5; echo trained"
    try:
        run = run_job(build_entrypoint(cmd), timeout=90, env={"TAO_RUNNER_DRAIN_SECONDS": "1"})
        assert run.rc == 0, run.stdout
        assert "not waiting for it" in run.stdout
    finally:
        os.kill(int(pid_file.read_text()), signal.SIGKILL)


def _start_runner(argv: list[str], env: dict[str, str], inherited: str) -> subprocess.Popen[str]:
    """Start the runner with SIGTERM as a parent may leave it: default, blocked (a mask) or ignored."""
    if inherited == "ignored":  # an ignore set by the shell survives its exec
        argv = ["/bin/sh", "-c", "trap '' TERM; exec \"$@\"", "sh", *argv]
    if inherited != "blocked":
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    started: list[subprocess.Popen[str]] = []

    def start() -> None:  # a thread's mask is what its fork inherits
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        started.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    return started[0]


# A mask and an ignore survive exec: a worker thread that blocked SIGTERM (CI saw one) started a runner no cancel
# reached, and the command ran its whole 600 s.
@pytest.mark.parametrize("inherited", ["default", "blocked", "ignored"])
def test_a_cancel_stops_every_process_of_the_command(tmp_path: Path, inherited: str) -> None:
    pid_file = tmp_path / "helper.pid"
    ep = build_entrypoint(f"sleep 600 & echo $! > {pid_file}; echo READY; wait")
    root = tmp_path / "cancel"
    stage(ep, root / "files")
    with _start_runner(list(ep.command), job_env(root, "canceljob"), inherited) as proc:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                if line.strip() == "READY":
                    break
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=60)  # a deaf runner fails here, not after the command's 600 s
        finally:
            proc.kill()  # a no-op once it ended; the test's failure is then the assertion below
    assert rc == 128 + signal.SIGTERM
    assert _gone(int(pid_file.read_text()))


# ---------------------------------------------------------------------------------------------------- runner failures
def _failure(run: JobRun) -> dict[str, Any]:
    assert len(run.failures) == 1, run.stdout
    return run.failures[0]


def test_missing_local_input_is_a_config_failure_before_the_command(run_job: RunJob, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    ep = build_entrypoint(f"touch {marker}", specs={"data": "file:///nonexistent/x.csv"}, inputs=["data"])
    run = run_job(ep)
    assert run.rc == 2
    assert _failure(run) == {"err_class": "ERR_CONFIG", "message": "input file:///nonexistent/x.csv: file not found"}
    assert not marker.exists()


def test_missing_or_broken_runner_files(tmp_path: Path) -> None:
    ep = build_entrypoint("true")
    root = tmp_path / "r"
    stage(ep, root / "files")
    env = job_env(root, "j")
    (root / "files" / "runner.json").write_text("{not json")
    proc = subprocess.run(ep.command, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert 'TAO_FAILURE {"err_class":"ERR_CONFIG","message":"runner manifest' in proc.stdout
    (root / "files" / "runner.json").unlink()
    proc = subprocess.run(ep.command, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "file not found" in proc.stdout
    del env["TAO_JOB_FILES"]
    proc = subprocess.run(ep.command, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert json.loads(proc.stdout.split("TAO_FAILURE ", 1)[1])["err_class"] == "ERR_CONFIG"


def test_unsafe_job_id_is_refused(run_job: RunJob) -> None:
    run = run_job(build_entrypoint("true"), job_id="../../etc")
    assert run.rc == 2 and _failure(run)["err_class"] == "ERR_CONFIG"


# ---------------------------------------------------------------------------------------------------- progress
def test_progress_heartbeats_and_training_steps(run_job: RunJob) -> None:
    ep = build_entrypoint(
        'for i in 1 2 3 4 5; do echo "Epoch $i/5 global_step=$((i*10))"; sleep 0.3; done; '
        "printf 'no newline at the end'"
    )
    run = run_job(ep, env={"TAO_PROGRESS_INTERVAL": "0.2"})
    assert run.rc == 0
    for line in run.stdout.splitlines():
        if "TAO_PROGRESS" in line:
            assert line.startswith("TAO_PROGRESS {"), line
    runs = [p for p in run.progress if p["phase"] == "run"]
    assert len(runs) >= 4
    assert runs[-1]["status"] == "exited" and runs[-1]["step"] == 50 and runs[-1]["epoch"] == 5
    assert runs[-1]["epochs"] == 5
    assert {p["phase"] for p in run.progress} >= {"download", "run", "upload", "done"}
    assert all({"files", "bytes"} <= set(p) for p in run.progress)
    assert "no newline at the end\n" in run.stdout


# ---------------------------------------------------------------------------------------------------- results kinds
def test_passthrough_outputs_are_copied_on_a_mount_with_excludes(run_job: RunJob, tmp_path: Path) -> None:
    out = tmp_path / "container" / "out"
    model = tmp_path / "container" / "model.onnx"
    ep = build_entrypoint(
        f"mkdir -p {out}/logs && echo w > {out}/weights.pt && echo t > {out}/scratch.tmp && echo l > {out}/logs/a.log"
        f" && echo m > {model}",
        outputs=[str(out), str(model)],
        upload_excludes=["*.tmp", "logs/*"],
    )
    run = run_job(ep, env={"TAO_RESULTS_ROOT": str(tmp_path / "lustre")})
    assert run.rc == 0, run.stdout
    base = tmp_path / "lustre" / run.job_id
    assert sorted(p.name for p in (base / "out").iterdir()) == [MANIFEST_NAME, "weights.pt"]
    assert (base / "model_onnx" / "model.onnx").read_text() == "m\n"
    assert is_complete(str(base / "out"), verify="sha256") and is_complete(str(base / "model_onnx"))
    assert run.done()["outputs"] == {str(out): str(base / "out"), str(model): str(base / "model_onnx")}
    assert not [line for line in run.stdout.splitlines() if "WARNING" in line]


def test_config_outputs_auto_fill_and_explicit_paths(run_job: RunJob, tmp_path: Path) -> None:
    keep = tmp_path / "keep"
    spec = {"train": {"results_dir": "output", "ckpt": None, "onnx": "model.onnx"}, "export": {"dir": str(keep)}}
    ep = build_entrypoint(
        ["python3", str(ECHO), "--copy", "{config_path}"],
        specs=spec,
        outputs={"train.results_dir": None, "train.ckpt": None, "train.onnx": {"type": "file"}, "export.dir": None},
        config_format="json",
    )
    run = run_echo(run_job, ep, TAO_RESULTS_ROOT=str(tmp_path / "lustre"))
    written = json.loads((run.root / "echo.json").read_text())
    base = tmp_path / "lustre" / run.job_id
    assert written["train"] == {
        "results_dir": str(base / "train_results_dir"),
        "ckpt": str(base / "train_ckpt"),
        "onnx": str(base / "train_onnx" / "model.onnx"),
    }
    assert written["export"]["dir"] == str(keep)
    for folder in ("train_results_dir", "train_ckpt", "train_onnx"):
        assert is_complete(str(base / folder))
    assert is_complete(str(keep))
    assert run.done()["outputs"]["export.dir"] == str(keep)


def test_explicit_results_uri_wins(run_job: RunJob, tmp_path: Path) -> None:
    ep = build_entrypoint("echo x > {results_dir}/../ignored; true", args={"out": ""}, outputs=["out"])
    run = run_job(ep, env={"TAO_RESULTS_URI": str(tmp_path / "exact"), "TAO_RESULTS_ROOT": str(tmp_path / "no")})
    assert run.rc == 0, run.stdout
    assert run.done()["outputs"] == {"out": str(tmp_path / "exact" / "out")}
    assert is_complete(str(tmp_path / "exact" / "out"))
    assert not (tmp_path / "no").exists()


def test_ephemeral_results_warn_before_and_after_the_command(run_job: RunJob) -> None:
    run = run_job(build_entrypoint("echo COMMAND-RAN", outputs=["/tmp/never-written-xyz"]))
    lines = run.stdout.splitlines()
    warnings = [i for i, line in enumerate(lines) if "WARNING" in line and "LOST" in line]
    ran = lines.index("COMMAND-RAN")
    assert warnings and warnings[0] < ran < warnings[-1]
    assert "LOST" in run.proc.stderr
    assert run.done()["results_kind"] == "ephemeral"


def test_local_inputs_file_and_folder(run_job: RunJob, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("A")
    (src / "sub" / "b.txt").write_text("B")
    target = tmp_path / "container" / "data"
    ep = build_entrypoint(
        f'cat {target}/a.txt {target}/sub/b.txt {target}.csv > "$ECHO_OUT"',
        inputs={str(target): f"file://{src}", f"{target}.csv": str(src / "a.txt")},
    )
    run = run_echo(run_job, ep)
    assert run.rc == 0, run.stdout + run.proc.stderr
    assert (run.root / "echo.json").read_text() == "ABA"
    config = build_entrypoint(
        ["python3", str(ECHO), "--copy", "{config_path}"],
        specs={"d": {"train": f"file://{src}", "list": [str(src / "a.txt")]}},
        inputs=["d.train", "d.list"],
        config_format="json",
    )
    written = json.loads((run_echo(run_job, config).root / "echo.json").read_text())
    assert written == {"d": {"train": str(src), "list": [str(src / "a.txt")]}}


# ---------------------------------------------------------------------------------------------------- packages
FAKE_HF = """
import os, json
def snapshot_download(repo_id, repo_type, revision, local_dir, token):
    os.makedirs(local_dir, exist_ok=True)
    with open(os.path.join(local_dir, "model.safetensors"), "w") as fh:
        json.dump({"repo_id": repo_id, "repo_type": repo_type, "revision": revision,
                   "has_token": token is not None}, fh)
    return local_dir
"""
FAKE_NGC = """
import os
class _Model:
    def download_version(self, target, destination):
        folder = os.path.join(destination, target.split("/")[-1].replace(":", "_v"))
        os.makedirs(folder, exist_ok=True)
        open(os.path.join(folder, "README.md"), "w").close()
        open(os.path.join(folder, "model.pth"), "w").write(target)
class _Registry:
    model = _Model()
class Client:
    registry = _Registry()
    def configure(self, api_key, org_name, team_name):
        assert api_key and org_name and team_name
"""


def test_hf_and_ngc_references_are_staged_and_rewritten(run_job: RunJob, tmp_path: Path) -> None:
    pkgs = tmp_path / "pkgs"
    (pkgs / "huggingface_hub").mkdir(parents=True)
    (pkgs / "huggingface_hub" / "__init__.py").write_text(FAKE_HF)
    (pkgs / "ngcsdk").mkdir()
    (pkgs / "ngcsdk" / "__init__.py").write_text(FAKE_NGC)
    spec = {
        "model": {"hf": "hf_model://org/name@v1", "ngc": "ngc://nvidia/tao/resnet:1.0"},
        "data": ["hf_dataset://org/ds"],
    }
    ep = build_entrypoint(
        ["python3", str(ECHO), "--copy", "{config_path}"], specs=spec, inputs=["model.hf"], config_format="json"
    )
    run = run_echo(run_job, ep, PYTHONPATH=str(pkgs), HF_TOKEN="hf-secret-value", NGC_KEY="ngc-secret-value")
    assert run.rc == 0, run.stdout + run.proc.stderr
    written = json.loads((run.root / "echo.json").read_text())
    hf = json.loads((Path(written["model"]["hf"]) / "model.safetensors").read_text())
    assert hf == {"repo_id": "org/name", "repo_type": "model", "revision": "v1", "has_token": True}
    ds = json.loads((Path(written["data"][0]) / "model.safetensors").read_text())
    assert ds["repo_type"] == "dataset" and ds["revision"] is None
    assert written["model"]["ngc"].endswith("/resnet_v1.0/model.pth")
    assert "secret-value" not in run.stdout + run.proc.stderr


@pytest.mark.parametrize(
    ("spec", "env", "needle"),
    [
        ({"m": "hf_model://org/name"}, {}, "pip install 'huggingface_hub==0.36.0'"),
        ({"m": "ngc://nvidia/model:1"}, {"NGC_KEY": "k"}, "pip install 'ngcsdk==3.64.3'"),
        ({"m": "ngc://nvidia/model:1"}, {}, "NGC_KEY is not set"),
    ],
)
def test_missing_optional_packages_name_the_pinned_version(
    run_job: RunJob, spec: dict[str, Any], env: dict[str, str], needle: str
) -> None:
    run = run_job(build_entrypoint("true", specs=spec), env=env)
    assert run.rc == 2
    failure = _failure(run)
    assert failure["err_class"] == "ERR_CONFIG" and needle in failure["message"]


def test_runner_is_stdlib_only_and_yaml_falls_back_to_json(run_job: RunJob, bare_python: Path) -> None:
    ep = build_entrypoint('cat {config_path} > "$ECHO_OUT"', specs={"a": {"b": ["é", 1]}}, config_format="yaml")
    run = run_echo(run_job, ep, PATH=f"{bare_python}{os.pathsep}/usr/bin:/bin")
    assert run.rc == 0, run.stdout + run.proc.stderr
    assert "PyYAML is not installed" in run.stdout
    assert yaml.safe_load((run.root / "echo.json").read_text()) == {"a": {"b": ["é", 1]}}


def test_s3_without_boto3_names_the_pinned_version(run_job: RunJob, bare_python: Path) -> None:
    ep = build_entrypoint("true", specs={"d": "s3://bucket/key"}, inputs=["d"])
    run = run_job(ep, env={"PATH": f"{bare_python}{os.pathsep}/usr/bin:/bin"})
    assert run.rc == 2
    assert "pip install 'boto3==1.43.117'" in _failure(run)["message"]


def test_secrets_are_never_printed_or_staged(run_job: RunJob, tmp_path: Path) -> None:
    secrets = {
        "AWS_SECRET_ACCESS_KEY": "s3cr3t-aws-value",
        "HF_TOKEN": "s3cr3t-hf-value",
        "NGC_KEY": "s3cr3t-ngc-value",
        "AWS_SESSION_TOKEN": "s3cr3t-session",
    }
    ep = build_entrypoint("echo done", specs={"a": "file:///nonexistent"}, inputs=["a"])
    run = run_job(ep, env=secrets)
    ok = run_job(build_entrypoint("echo done", outputs=[str(tmp_path / "o")]), env=secrets)
    blob = run.stdout + run.proc.stderr + ok.stdout + ok.proc.stderr + json.dumps(ep.files[RUNNER_MANIFEST_FILE])
    assert not [value for value in secrets.values() if value in blob]


def test_work_dir_is_removed_when_the_runner_made_it(run_job: RunJob) -> None:
    ep = build_entrypoint('echo {config_path} > "$ECHO_OUT"', specs={"a": 1})
    run = run_echo(run_job, ep, TAO_WORK_DIR="")
    config = (run.root / "echo.json").read_text().strip()
    assert "tao-job-" in config and not Path(config).exists()
    digest = hashlib.sha256(config.encode()).hexdigest()
    assert digest  # the path was real and is gone


def test_tao_status_json_lines_are_followed_into_the_log_where_the_metric_parser_reads_them(
    run_job: RunJob, tmp_path: Path
) -> None:
    """TAO appends JSON lines to ``status.json`` in its action's results folder; the runner prints each new one as
    ``TAO_STATUS <line>`` (an earlier run's lines are not this run's; a huge line keeps its kpi; the last line
    without a newline is printed too), and the AutoML metric parser finds every epoch's kpi there."""
    from airflow_provider_tao.automl.metrics import MetricParser

    results = tmp_path / "lustre" / "job-status"
    (results / "train").mkdir(parents=True)
    (results / "train" / "status.json").write_text('{"epoch": 9, "kpi": {"val_loss": 9.0}}\n')  # an earlier run's
    big = "x" * 20000
    ep = build_entrypoint(
        "f={results_dir}/train/status.json; for e in 1 2 3; do "
        """echo '{"epoch": '$e', "max_epoch": 5, "kpi": {"val_loss": 0.'$e'}, "status": "RUNNING"}' >> $f; """
        "sleep 0.1; done; "
        f"""echo '{{"epoch": 4, "graphical": "{big}", "kpi": {{"val_loss": 0.04}}}}' >> $f; """
        """printf '{"epoch": 5, "kpi": {"val_loss": 0.05}}' >> $f""",
        specs={"train": {"results_dir": "unused"}},
    )
    run = run_job(ep, job_id="job-status", env={"TAO_RESULTS_ROOT": str(tmp_path / "lustre"),
                                                "TAO_STATUS_INTERVAL": "0.05"})  # fmt: skip
    assert run.rc == 0, run.stdout
    lines = [line for line in run.stdout.splitlines() if line.startswith("TAO_STATUS ")]
    assert [json.loads(line[len("TAO_STATUS ") :])["epoch"] for line in lines] == [1, 2, 3, 4, 5]
    assert all(len(line) < 1000 for line in lines)  # the huge line without its graphical data
    reports = MetricParser(("val_loss",)).feed(run.stdout, final=True)
    assert [(r.step, r.values["val_loss"]) for r in reports] == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.04), (5, 0.05)]
