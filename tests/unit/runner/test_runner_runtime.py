"""script_runner's pure parts: spec writers, paths, args tokens, placeholders, steps, manifests, portability."""

from __future__ import annotations

import ast
import io
import json
import math
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_tao.runner import script_runner as sr

# ---------------------------------------------------------------------------------------------------- strategies
text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=30)
keys = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), min_size=0, max_size=12)
scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    text,
)


def trees(leaf: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    values = st.recursive(
        leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4), max_leaves=20
    )
    return st.dictionaries(keys, values, max_size=6)


# ---------------------------------------------------------------------------------------------------- writers
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(trees(scalars))
def test_toml_writer_round_trips_through_tomllib(spec: dict[str, Any]) -> None:
    assert tomllib.loads(sr.dumps_toml(spec)) == spec


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(trees(st.one_of(scalars, st.none())))
def test_yaml_writer_round_trips_through_pyyaml(spec: dict[str, Any]) -> None:
    out, fmt = sr.dumps_spec(spec, "yaml")
    assert fmt == "yaml"
    assert yaml.safe_load(out) == spec


@settings(max_examples=200)
@given(trees(st.one_of(scalars, st.none())))
def test_json_writer_round_trips(spec: dict[str, Any]) -> None:
    out, fmt = sr.dumps_spec(spec, "json")
    assert fmt == "json"
    assert json.loads(out) == spec


def test_toml_writer_shapes() -> None:
    spec = {
        "name": 'a "quoted" \\ path\nnew\tline\x01\x7f',
        "dotted.key": 1,
        "": "empty key",
        "ключ": "значение",
        "model": {"arch": "resnet", "layers": [1, 2, 3], "deep": {"x": {"y": True}}, "empty": {}},
        "datasets": [{"path": "/a", "weights": [0.5, 1e-05]}, {"path": "/b", "sub": {"k": -0.0}}],
        "mixed": [1, "two", [3, 4], {"five": 5}],
        "empty_list": [],
        "0\n": {"k\n": []},  # `$` in a regex would let a trailing newline pass as a bare key
    }
    text = sr.dumps_toml(spec)
    assert tomllib.loads(text) == spec
    assert "[[datasets]]" in text
    assert "[model.deep.x]" in text


@pytest.mark.parametrize(
    "bad", [{"a": None}, {"a": [1, None]}, {"a": math.nan}, {"a": {"b": math.inf}}, {"a": object()}]
)
def test_toml_writer_refuses_what_toml_cannot_hold(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        sr.dumps_toml(bad)


def test_yaml_without_pyyaml_falls_back_to_json(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_yaml(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "yaml":
            raise ImportError("no yaml")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_yaml)
    out, fmt = sr.dumps_spec({"a": {"b": [1, "x"]}}, "yaml")
    assert fmt == "json"
    assert yaml.safe_load(out) == {"a": {"b": [1, "x"]}}  # JSON is valid YAML


# ---------------------------------------------------------------------------------------------------- paths
def test_dotted_paths() -> None:
    assert sr.parse_dotted("a.b[0].c") == ["a", "b", 0, "c"]
    assert sr.parse_dotted("a[1][2]") == ["a", 1, 2]
    tree = {"a": {"b": [{"c": 1}]}}
    assert sr.get_path(tree, "a.b[0].c") == 1
    assert sr.get_path(tree, "a.b[1].c") is sr._MISSING
    assert sr.get_path(tree, "a.x") is sr._MISSING
    sr.set_path(tree, "a.b[0].c", 2)
    sr.set_path(tree, "a.new", "v")
    assert tree == {"a": {"b": [{"c": 2}], "new": "v"}}
    for bad in ("", "a..b", "a.", "a[x]"):
        with pytest.raises(ValueError):
            sr.parse_dotted(bad)


def test_output_dir_names() -> None:
    assert sr.output_dir_name("train.results_dir", "config") == "train_results_dir"
    assert sr.output_dir_name("a.b[0].c-d", "config") == "a_b_0_c_d"
    assert sr.output_dir_name("output-dir", "args") == "output_dir"
    assert sr.output_dir_name("/workspace/out/", "passthrough") == "out"
    assert sr.output_dir_name("/w/model.pt", "passthrough") == "model_pt"


def test_s3_helpers() -> None:
    assert sr.parse_s3("s3://b/k/x.txt") == ("b", "k/x.txt")
    assert sr.parse_s3("s3://b") == ("b", "")
    assert sr.mount_mapping("/lustre", "s3://bkt/data/x.txt") == "/lustre/bkt/data/x.txt"
    assert sr.mount_mapping("/lustre", "s3://bkt/data/") == "/lustre/bkt/data"
    with pytest.raises(ValueError):
        sr.parse_s3("gs://b/k")
    with pytest.raises(sr.ConfigError):
        sr._safe_relpath("../../etc/passwd")


# ---------------------------------------------------------------------------------------------------- command
def test_args_tokens() -> None:
    tokens = sr.args_tokens(
        {
            "lr": 0.1,
            "amp": True,
            "debug": False,
            "resume": None,
            "tags": ["a", "b"],
            "--raw": "x",
            "epochs": 3,
            "cfg": {"a": [1]},
            "flags": [True, False, "v"],
        }
    )
    assert tokens == [
        "--lr",
        "0.1",
        "--amp",
        "--tags",
        "a",
        "--tags",
        "b",
        "--raw",
        "x",
        "--epochs",
        "3",
        "--cfg",
        '{"a":[1]}',
        "--flags",
        "--flags",
        "v",
    ]


def test_placeholders_are_replaced_literally() -> None:
    values = {"{config_path}": "/w/spec.yaml", "{results_dir}": "/r/j 1", "{job_id}": "j1"}
    cmd = 'run {config_path} {results_dir} {job_id} {x} ${HOME} {config_path!r} {0} "{job_id}"'
    assert sr.replace_placeholders(cmd, values, quote=False) == (
        'run /w/spec.yaml /r/j 1 j1 {x} ${HOME} {config_path!r} {0} "j1"'
    )
    # For bash, a value that needs quoting is quoted; safe values stay as they are.
    assert sr.replace_placeholders("ls {results_dir} {job_id}", values, quote=True) == "ls '/r/j 1' j1"


@pytest.mark.parametrize(
    ("lines", "step", "epoch"),
    [
        (["Epoch 3/10: loss=0.1"], None, 3),
        (["train step 17 loss 0.3"], 17, None),
        (["global_step=42 lr=1e-4"], 42, None),
        (["Step: 9/100"], 9, None),
        (["[INFO] epoch [2/5] step=120"], 120, 2),
        (["100%|###| 5/5 [00:01<00:00] step 5\r", "step 6\r"], 6, None),
        (["steps 5", "no numbers here"], None, None),
    ],
)
def test_step_watcher_finds_training_progress(lines: list[str], step: int | None, epoch: int | None) -> None:
    out = io.BytesIO()
    watcher = sr.StepWatcher(sr.Reporter(out=out, err=io.BytesIO()))
    for line in lines:
        watcher.feed(line.encode() + (b"" if line.endswith("\r") else b"\n"), True)
    assert watcher.step == step
    assert watcher.epoch == epoch
    if step is not None or epoch is not None:
        first = json.loads(out.getvalue().decode().splitlines()[0][len("TAO_PROGRESS ") :])
        assert first["phase"] == "run"


def test_reporter_never_splits_a_partial_user_line() -> None:
    out = io.BytesIO()
    rep = sr.Reporter(out=out, err=io.BytesIO())
    rep.forward(b"epoch 1 [=====")
    rep.progress("run", step=3)
    rep.forward(b"=====]\n")
    lines = out.getvalue().decode().splitlines()
    assert lines[0] == "epoch 1 [====="
    assert lines[1].startswith('TAO_PROGRESS {"phase":"run"')
    assert json.loads(lines[1][len("TAO_PROGRESS ") :]) == {"phase": "run", "files": 0, "bytes": 0, "step": 3}


def test_failure_line_shape() -> None:
    out = io.BytesIO()
    sr.Reporter(out=out, err=io.BytesIO()).failure("ERR_CONFIG", "s3://b/k: not found (NoSuchKey)")
    line = out.getvalue().decode().strip()
    assert line.startswith("TAO_FAILURE ")
    assert json.loads(line[len("TAO_FAILURE ") :]) == {
        "err_class": "ERR_CONFIG",
        "message": "s3://b/k: not found (NoSuchKey)",
    }


def test_missing_package_names_the_pin() -> None:
    err = sr.missing_package("boto3", "s3:// inputs/outputs", {"boto3": "boto3==1.43.117"})
    assert isinstance(err, sr.ConfigError)
    assert "pip install 'boto3==1.43.117'" in str(err)
    assert "wheels.boto3" in str(err)
    assert "pin it under 'wheels: ngcsdk:'" in str(sr.missing_package("ngcsdk", "ngc:// inputs", {}))


# ---------------------------------------------------------------------------------------------------- manifests
def test_local_manifest_read_and_complete(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    (dest / "sub").mkdir(parents=True)
    (dest / "a.bin").write_bytes(b"abc")
    (dest / "sub" / "b.txt").write_text("hello")
    assert sr.read_manifest(str(dest)) is None
    assert not sr.is_complete(str(dest))
    files = [(rel, *sr.sha256_file(full)) for rel, full in sr.walk_files(str(dest))]
    sr.write_atomic(str(dest / sr.MANIFEST_NAME), sr.build_manifest("j", "k", str(dest), 0, files))
    doc = sr.read_manifest(str(dest))
    assert doc is not None
    assert [f["path"] for f in doc["files"]] == ["a.bin", "sub/b.txt"]
    assert doc["files"][0]["sha256"] == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert doc["total_bytes"] == 8
    assert sr.is_complete(str(dest)) and sr.is_complete("file://" + str(dest), verify="sha256")
    (dest / "a.bin").write_bytes(b"abd")  # same size, other content
    assert sr.is_complete(str(dest)) and not sr.is_complete(str(dest), verify="sha256")
    (dest / "sub" / "b.txt").unlink()
    assert not sr.is_complete(str(dest))
    (dest / sr.MANIFEST_NAME).write_text("{truncated")
    assert sr.read_manifest(str(dest)) is None


def test_walk_files_skips_manifest_temp_files_and_excludes(tmp_path: Path) -> None:
    for rel in (
        "keep.pt",
        "x.tmp",
        "logs/a.log",
        "logs/b.txt",
        ".keep.pt.abc.tao-part",
        sr.MANIFEST_NAME,
        "sub/" + sr.MANIFEST_NAME,
    ):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    got = [rel for rel, _full in sr.walk_files(str(tmp_path), ["*.tmp", "logs/*.log"])]
    assert got == ["keep.pt", "logs/b.txt", "sub/" + sr.MANIFEST_NAME]


def test_atomic_write_leaves_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "d" / "f.txt"
    sr.write_atomic(str(target), b"one")
    sr.write_atomic(str(target), b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in target.parent.iterdir()] == ["f.txt"]


# ---------------------------------------------------------------------------------------------------- portability
RUNNER_SOURCE = Path(sr.__file__).read_text(encoding="utf-8")


def test_runner_parses_as_python_3_8() -> None:
    ast.parse(RUNNER_SOURCE, feature_version=(3, 8))


def test_runner_avoids_newer_stdlib_and_never_imports_airflow() -> None:
    for newer in (
        ".removeprefix(",
        ".removesuffix(",
        "functools.cache(",
        "hashlib.file_digest",
        "strict=True",
        "datetime.UTC",
        "import tomllib",
        "import zoneinfo",
        "from typing import Self",
    ):
        assert newer not in RUNNER_SOURCE, newer
    tree = ast.parse(RUNNER_SOURCE)
    top_level: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top_level.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            top_level.add(node.module.split(".")[0])
    assert not top_level & {"airflow", "airflow_provider_tao", "boto3", "botocore", "yaml", "huggingface_hub"}
    everywhere = {n.names[0].name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)}
    everywhere |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not everywhere & {"airflow", "airflow_provider_tao"}
