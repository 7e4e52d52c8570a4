"""The runner package's pure parts: spec writers, paths, args tokens, placeholders, steps, manifests, portability."""

from __future__ import annotations

import ast
import io
import json
import math
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_tao.runner.bundle import runner_archive
from airflow_provider_tao.runner.job import command, errors, fsops, manifest, paths, progress, specs

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
    assert tomllib.loads(specs.dumps_toml(spec)) == spec


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(trees(st.one_of(scalars, st.none())))
def test_yaml_writer_round_trips_through_pyyaml(spec: dict[str, Any]) -> None:
    out, fmt = specs.dumps_spec(spec, "yaml")
    assert fmt == "yaml"
    assert yaml.safe_load(out) == spec


@settings(max_examples=200)
@given(trees(st.one_of(scalars, st.none())))
def test_json_writer_round_trips(spec: dict[str, Any]) -> None:
    out, fmt = specs.dumps_spec(spec, "json")
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
    text = specs.dumps_toml(spec)
    assert tomllib.loads(text) == spec
    assert "[[datasets]]" in text
    assert "[model.deep.x]" in text


@pytest.mark.parametrize(
    "bad", [{"a": None}, {"a": [1, None]}, {"a": math.nan}, {"a": {"b": math.inf}}, {"a": object()}]
)
def test_toml_writer_refuses_what_toml_cannot_hold(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        specs.dumps_toml(bad)


def test_yaml_without_pyyaml_falls_back_to_json(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_yaml(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "yaml":
            raise ImportError("no yaml")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_yaml)
    out, fmt = specs.dumps_spec({"a": {"b": [1, "x"]}}, "yaml")
    assert fmt == "json"
    assert yaml.safe_load(out) == {"a": {"b": [1, "x"]}}  # JSON is valid YAML


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(trees(scalars), st.booleans())
def test_toml_spec_uses_tomli_w_when_present_and_the_stdlib_writer_otherwise(
    spec: dict[str, Any], with_tomli_w: bool
) -> None:
    import tomli_w

    with mock.patch.dict(sys.modules, {} if with_tomli_w else {"tomli_w": None}):  # None: import fails
        out, fmt = specs.dumps_spec(spec, "toml")
    assert fmt == "toml"
    assert out == (tomli_w.dumps(spec) if with_tomli_w else specs.dumps_toml(spec))
    assert tomllib.loads(out) == spec


@pytest.mark.parametrize("with_tomli_w", [True, False])
def test_toml_spec_refuses_null_with_either_writer(with_tomli_w: bool) -> None:
    with (
        mock.patch.dict(sys.modules, {} if with_tomli_w else {"tomli_w": None}),
        pytest.raises(ValueError, match=r"None|null"),
    ):
        specs.dumps_spec({"a": {"b": None}}, "toml")


# ---------------------------------------------------------------------------------------------------- paths
def test_dotted_paths() -> None:
    assert paths.parse_dotted("a.b[0].c") == ["a", "b", 0, "c"]
    assert paths.parse_dotted("a[1][2]") == ["a", 1, 2]
    tree = {"a": {"b": [{"c": 1}]}}
    assert paths.get_path(tree, "a.b[0].c") == 1
    assert paths.get_path(tree, "a.b[1].c") is paths.MISSING
    assert paths.get_path(tree, "a.x") is paths.MISSING
    paths.set_path(tree, "a.b[0].c", 2)
    paths.set_path(tree, "a.new", "v")
    assert tree == {"a": {"b": [{"c": 2}], "new": "v"}}
    for bad in ("", "a..b", "a.", "a[x]"):
        with pytest.raises(ValueError):
            paths.parse_dotted(bad)


def test_output_dir_names() -> None:
    assert paths.output_dir_name("train.results_dir", "config") == "train_results_dir"
    assert paths.output_dir_name("a.b[0].c-d", "config") == "a_b_0_c_d"
    assert paths.output_dir_name("output-dir", "args") == "output_dir"
    assert paths.output_dir_name("/workspace/out/", "passthrough") == "out"
    assert paths.output_dir_name("/w/model.pt", "passthrough") == "model_pt"


def test_s3_helpers() -> None:
    assert paths.parse_s3("s3://b/k/x.txt") == ("b", "k/x.txt")
    assert paths.parse_s3("s3://b") == ("b", "")
    assert paths.mount_mapping("/lustre", "s3://bkt/data/x.txt") == "/lustre/bkt/data/x.txt"
    assert paths.mount_mapping("/lustre", "s3://bkt/data/") == "/lustre/bkt/data"
    with pytest.raises(ValueError):
        paths.parse_s3("gs://b/k")
    with pytest.raises(errors.ConfigError):
        fsops.safe_relpath("../../etc/passwd")


@pytest.mark.parametrize(
    "uri", ["s3://bkt/../../etc/cron.d/x", "s3://bkt/a/../../../x", "s3://../x", "s3://./x", "s3://bkt/a/.."]
)
def test_the_cache_mapping_never_leaves_the_cache_root(uri: str) -> None:
    """Issue 38.9: S3 takes a ``..`` key segment literally; mapped on the cache mount it would climb out of it."""
    with pytest.raises(errors.ConfigError, match=r"outside the cache root '/lustre'"):
        paths.mount_mapping("/lustre", uri)
    with pytest.raises(errors.ConfigError):
        paths.cache_path("/lustre/.meta", *paths.parse_s3(uri), ".json")
    assert paths.mount_mapping("/lustre", "s3://bkt/a/..b/./c..") == "/lustre/bkt/a/..b/c.."  # names, not climbs


def test_an_s3_uri_with_a_dotdot_segment_is_refused_before_submission() -> None:
    from airflow_provider_tao.runner.validation import _check_input_uri

    with pytest.raises(ValueError, match=r"inputs\.x: 's3://bkt/a/\.\./b' is not a valid .* \(without '\.\.' key"):
        _check_input_uri("s3://bkt/a/../b", "inputs.x")
    _check_input_uri("s3://bkt/a/..b", "inputs.x")


# ---------------------------------------------------------------------------------------------------- command
def test_args_tokens() -> None:
    tokens = command.args_tokens(
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
    assert command.replace_placeholders(cmd, values, quote=False) == (
        'run /w/spec.yaml /r/j 1 j1 {x} ${HOME} {config_path!r} {0} "j1"'
    )
    # For bash, a value that needs quoting is quoted; safe values stay as they are.
    assert command.replace_placeholders("ls {results_dir} {job_id}", values, quote=True) == "ls '/r/j 1' j1"


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
    watcher = progress.StepWatcher(progress.Reporter(out=out, err=io.BytesIO()))
    for line in lines:
        watcher.feed(line.encode() + (b"" if line.endswith("\r") else b"\n"), True)
    assert watcher.step == step
    assert watcher.epoch == epoch
    if step is not None or epoch is not None:
        first = json.loads(out.getvalue().decode().splitlines()[0][len("TAO_PROGRESS ") :])
        assert first["phase"] == "run"


def test_reporter_never_splits_a_partial_user_line() -> None:
    out = io.BytesIO()
    rep = progress.Reporter(out=out, err=io.BytesIO())
    rep.forward(b"epoch 1 [=====")
    rep.progress("run", step=3)
    rep.forward(b"=====]\n")
    lines = out.getvalue().decode().splitlines()
    assert lines[0] == "epoch 1 [====="
    assert lines[1].startswith('TAO_PROGRESS {"phase":"run"')
    assert json.loads(lines[1][len("TAO_PROGRESS ") :]) == {"phase": "run", "files": 0, "bytes": 0, "step": 3}


def test_failure_line_shape() -> None:
    out = io.BytesIO()
    progress.Reporter(out=out, err=io.BytesIO()).failure("ERR_CONFIG", "s3://b/k: not found (NoSuchKey)")
    line = out.getvalue().decode().strip()
    assert line.startswith("TAO_FAILURE ")
    assert json.loads(line[len("TAO_FAILURE ") :]) == {
        "err_class": "ERR_CONFIG",
        "message": "s3://b/k: not found (NoSuchKey)",
    }


def test_missing_package_names_the_pin() -> None:
    err = errors.missing_package("boto3", "s3:// inputs/outputs", {"boto3": "boto3==1.43.117"})
    assert isinstance(err, errors.ConfigError)
    assert "pip install 'boto3==1.43.117'" in str(err)
    assert "wheels.boto3" in str(err)
    assert "pin it under 'wheels: ngcsdk:'" in str(errors.missing_package("ngcsdk", "ngc:// inputs", {}))


# ---------------------------------------------------------------------------------------------------- manifests
def test_local_manifest_read_and_complete(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    (dest / "sub").mkdir(parents=True)
    (dest / "a.bin").write_bytes(b"abc")
    (dest / "sub" / "b.txt").write_text("hello")
    assert manifest.read_manifest(str(dest)) is None
    assert not manifest.is_complete(str(dest))
    files = [(rel, *fsops.sha256_file(full)) for rel, full in fsops.walk_files(str(dest))]
    fsops.write_atomic(str(dest / manifest.MANIFEST_NAME), manifest.build_manifest("j", "k", str(dest), 0, files))
    doc = manifest.read_manifest(str(dest))
    assert doc is not None
    assert [f["path"] for f in doc["files"]] == ["a.bin", "sub/b.txt"]
    assert doc["files"][0]["sha256"] == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert doc["total_bytes"] == 8
    assert manifest.is_complete(str(dest)) and manifest.is_complete("file://" + str(dest), verify="sha256")
    (dest / "a.bin").write_bytes(b"abd")  # same size, other content
    assert manifest.is_complete(str(dest)) and not manifest.is_complete(str(dest), verify="sha256")
    (dest / "sub" / "b.txt").unlink()
    assert not manifest.is_complete(str(dest))
    (dest / manifest.MANIFEST_NAME).write_text("{truncated")
    assert manifest.read_manifest(str(dest)) is None


def test_walk_files_skips_manifest_temp_files_and_excludes(tmp_path: Path) -> None:
    for rel in (
        "keep.pt",
        "x.tmp",
        "logs/a.log",
        "logs/b.txt",
        ".keep.pt.abc.tao-part",
        manifest.MANIFEST_NAME,
        "sub/" + manifest.MANIFEST_NAME,
    ):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    got = [rel for rel, _full in fsops.walk_files(str(tmp_path), ["*.tmp", "logs/*.log"])]
    assert got == ["keep.pt", "logs/b.txt", "sub/" + manifest.MANIFEST_NAME]


def test_atomic_write_leaves_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "d" / "f.txt"
    fsops.write_atomic(str(target), b"one")
    fsops.write_atomic(str(target), b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in target.parent.iterdir()] == ["f.txt"]


# ---------------------------------------------------------------------------------------------------- portability
# Every Python file of the archive the job runs (``runner.pyz``), as shipped.
with zipfile.ZipFile(io.BytesIO(runner_archive())) as _archive:
    RUNNER_SOURCES = {name: _archive.read(name).decode("utf-8") for name in _archive.namelist()}


@pytest.mark.parametrize("name", sorted(RUNNER_SOURCES))
def test_runner_parses_as_python_3_8(name: str) -> None:
    ast.parse(RUNNER_SOURCES[name], feature_version=(3, 8))


@pytest.mark.parametrize("name", sorted(RUNNER_SOURCES))
def test_runner_avoids_newer_stdlib_and_never_imports_airflow(name: str) -> None:
    source = RUNNER_SOURCES[name]
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
        assert newer not in source, newer
    tree = ast.parse(source)
    top_level: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top_level.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            top_level.add(node.module.split(".")[0])
    assert not top_level & {"airflow", "airflow_provider_tao", "boto3", "botocore", "yaml", "huggingface_hub"}
    # stdlib-only at import: what is not the standard library is imported where it is needed, inside a function
    assert top_level <= sys.stdlib_module_names | {"__future__", "tao_runner"}, top_level
    everywhere = {n.names[0].name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)}
    everywhere |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not everywhere & {"airflow", "airflow_provider_tao"}
