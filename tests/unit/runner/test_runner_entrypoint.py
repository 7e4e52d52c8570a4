"""build_entrypoint: mode inference, every validation error, and the Entrypoint contract."""

from __future__ import annotations

import json
import math
from enum import Enum
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from airflow_provider_tao.runner import entrypoint as ep_mod
from airflow_provider_tao.runner.bundle import runner_archive
from airflow_provider_tao.runner.entrypoint import (
    RUNNER_FILE,
    RUNNER_MANIFEST_FILE,
    Entrypoint,
    build_entrypoint,
    parse_progress,
)

REPO = Path(__file__).resolve().parents[3]


def manifest(ep: Entrypoint) -> dict[str, Any]:
    return json.loads(ep.files[RUNNER_MANIFEST_FILE])


# ---------------------------------------------------------------------------------------------------- modes
@pytest.mark.parametrize(
    ("kwargs", "mode"),
    [
        ({"specs": {"a": 1}}, "config"),
        ({"args": {"lr": 0.1}}, "args"),
        ({}, "passthrough"),
        ({"inputs": {"/data": "s3://b/k"}, "outputs": ["/out"]}, "passthrough"),
        ({"specs": {}}, "config"),
        ({"args": {}}, "args"),
    ],
)
def test_mode_is_inferred_from_the_arguments(kwargs: dict[str, Any], mode: str) -> None:
    ep = build_entrypoint("train", **kwargs)
    assert ep.mode == mode
    assert manifest(ep)["mode"] == mode


def test_explicit_mode_that_agrees_is_accepted() -> None:
    assert build_entrypoint("t", specs={"a": 1}, mode="config").mode == "config"
    assert build_entrypoint("t", args={"a": 1}, mode="args").mode == "args"
    assert build_entrypoint("t", mode="passthrough").mode == "passthrough"


def test_specs_and_args_together_are_an_error() -> None:
    with pytest.raises(ValueError, match="specs and args are mutually exclusive"):
        build_entrypoint("t", specs={"a": 1}, args={"b": 2})


@pytest.mark.parametrize(
    ("mode", "kwargs", "fix"),
    [
        ("config", {}, "specs=..."),
        ("config", {"args": {"a": 1}}, "specs=..."),
        ("args", {"specs": {"a": 1}}, "args=..."),
        ("args", {}, "args=..."),
        ("passthrough", {"specs": {"a": 1}}, "neither specs nor args"),
        ("passthrough", {"args": {"a": 1}}, "neither specs nor args"),
    ],
)
def test_explicit_mode_that_disagrees_names_the_parameter_and_the_fix(
    mode: str, kwargs: dict[str, Any], fix: str
) -> None:
    with pytest.raises(ValueError, match=r"mode=") as info:
        build_entrypoint("t", mode=mode, **kwargs)
    assert fix in str(info.value)
    assert "drop mode=" in str(info.value)


def test_unknown_mode() -> None:
    with pytest.raises(ValueError, match="mode: 'spec' is not one of config, args, passthrough"):
        build_entrypoint("t", specs={}, mode="spec")


# ---------------------------------------------------------------------------------------------------- flat keys
def test_flat_dotted_key_is_rejected_with_the_nested_form() -> None:
    with pytest.raises(ValueError) as info:
        build_entrypoint("t", specs={"a.b.c": 1})
    message = str(info.value)
    assert '{"a": {"b": {"c": 1}}}' in message
    assert '{"a.b.c": 1}' in message
    assert message.startswith("specs:")


def test_several_flat_keys_are_merged_into_one_nested_suggestion() -> None:
    with pytest.raises(ValueError) as info:
        build_entrypoint("t", specs={"train.lr": 0.1, "train.epochs": 3, "ok": 1})
    assert '{"train": {"lr": 0.1, "epochs": 3}}' in str(info.value)


def test_dots_below_the_top_level_are_data() -> None:
    ep = build_entrypoint("t", specs={"files": {"a.txt": 1, "b.tar.gz": 2}})
    assert manifest(ep)["specs"] == {"files": {"a.txt": 1, "b.tar.gz": 2}}


# ---------------------------------------------------------------------------------------------------- validation
class Color(Enum):
    RED = "red"


class Opaque:
    pass


def _cycle() -> dict[str, Any]:
    d: dict[str, Any] = {"a": {}}
    d["a"]["self"] = d
    return d


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"command": ""}, "command: empty command"),
        ({"command": "   \n"}, "command: empty command"),
        ({"command": []}, "command: an argv list needs"),
        ({"command": ["", "x"]}, "command: an argv list needs"),
        ({"command": ["python", 3]}, r"command\[1\]: argv elements must be strings"),
        ({"command": 42}, "command: expected a string"),
        ({"command": "echo a\x00b"}, "command: contains a NUL"),
        ({"command": "x" * (121 * 1024)}, "command: longer than 120 KiB"),
        ({"command": "t", "config_format": "yml", "specs": {}}, "config_format: 'yml' is not one of yaml, toml, json"),
        ({"command": "t", "config_format": None}, "config_format"),
        ({"command": "t", "upload_excludes": "*.tmp"}, "upload_excludes: give a list"),
        ({"command": "t", "upload_excludes": ["ok", ""]}, r"upload_excludes\[1\]"),
        ({"command": "t", "mount_path": "lustre/cache"}, "mount_path: must be an absolute path"),
        ({"command": "t", "specs": {"a": math.nan}}, r"specs\['a'\]: NaN / Infinity"),
        ({"command": "t", "specs": {"a": [1, math.inf]}}, r"specs\['a'\]\[1\]: NaN / Infinity"),
        ({"command": "t", "specs": {"a": {1: 2}}}, r"specs\['a'\]\[1\]: keys must be strings"),
        ({"command": "t", "specs": {"a": Opaque()}}, r"specs\['a'\]: Opaque is not JSON-safe"),
        ({"command": "t", "specs": {"a": "\ud800"}}, r"specs\['a'\]: text is not valid Unicode"),
        ({"command": "t", "specs": _cycle()}, "a cycle"),
        ({"command": "t", "specs": ["a"]}, "specs: expected a dict"),
        (
            {"command": "t", "specs": {"d": {"x": "s3://b/k"}}, "inputs": ["d.y"]},
            r"inputs\['d.y'\]: 'd.y' is not a path",
        ),
        (
            {"command": "t", "specs": {"d": "s3://b/k"}, "inputs": {"d": "s3://b/k"}},
            r"inputs\['d'\]: expected a dict of options",
        ),
        ({"command": "t", "specs": {"d": "s3://b/k"}, "inputs": {"d": {"container": "/x"}}}, "unknown option"),
        (
            {"command": "t", "specs": {"d": "s3://b/k"}, "inputs": {"d": {"container_path": "rel"}}},
            "container paths must be absolute",
        ),
        ({"command": "t", "specs": {"d": "gs://b/k"}, "inputs": ["d"]}, "unsupported scheme in 'gs://b/k'"),
        ({"command": "t", "specs": {"d": "data/train"}, "inputs": ["d"]}, "is a relative path"),
        ({"command": "t", "specs": {"d": "s3://B!/k"}, "inputs": ["d"]}, "not a valid s3://bucket/key"),
        ({"command": "t", "specs": {"d": "file://rel/x"}, "inputs": ["d"]}, "file:// URIs must be absolute"),
        ({"command": "t", "specs": {"d": "ngc://nvidia/model"}, "inputs": ["d"]}, "ngc://org/"),
        ({"command": "t", "specs": {"d": "hf_model://a/b/c"}, "inputs": ["d"]}, "hf_model://org/name"),
        ({"command": "t", "specs": {"d": ["s3://b/k", 3]}, "inputs": ["d"]}, r"inputs\['d'\]\[1\]"),
        ({"command": "t", "specs": {"d": 1}, "inputs": "d"}, "inputs: give a list of paths"),
        ({"command": "t", "specs": {"d": 1}, "inputs": ["d", "d"]}, "listed twice"),
        ({"command": "t", "specs": {"d": 1}, "inputs": ["d..x"]}, "malformed segment"),
        ({"command": "t", "specs": {"t": {}}, "outputs": ["x.y.z"]}, r"outputs\['x.y.z'\]: the spec has no section"),
        ({"command": "t", "specs": {"t": {"o": "gs://b/o"}}, "outputs": ["t.o"]}, "unsupported destination"),
        ({"command": "t", "specs": {"t": {"o": 5}}, "outputs": ["t.o"]}, "must be a string path/URI or empty"),
        (
            {"command": "t", "specs": {"t": {"o": ""}}, "outputs": {"t.o": {"type": "blob"}}},
            "type must be 'folder' or 'file'",
        ),
        (
            {"command": "t", "specs": {"a": {"o": ""}, "a_o": ""}, "outputs": ["a.o", "a_o"]},
            "would both be stored as 'a_o/'",
        ),
        (
            {"command": "t", "specs": {"d": "s3://b/k"}, "inputs": ["d"], "outputs": ["d"]},
            "both as an input and as an output",
        ),
        ({"command": "t", "specs": {"a": None}, "config_format": "toml"}, r"specs: 'a' is None, which TOML"),
        ({"command": "t", "specs": {"a": [1, None]}, "config_format": "toml"}, r"'a\[1\]' is None"),
        ({"command": "t", "inputs": ["s3://b/k"]}, "passthrough inputs are path-keyed"),
        ({"command": "t", "inputs": {"data": "s3://b/k"}}, "container paths must be absolute"),
        ({"command": "t", "inputs": {"/w/../etc": "s3://b/k"}}, "must not contain '..'"),
        ({"command": "t", "inputs": {"/data": "gs://x/y"}}, "unsupported scheme"),
        ({"command": "t", "outputs": "/out"}, "outputs: give a list of container paths"),
        ({"command": "t", "outputs": ["out"]}, "container paths must be absolute"),
        ({"command": "t", "outputs": ["/a/model", "/b/model"]}, "would both be stored as 'model/'"),
        ({"command": "t", "outputs": {"/out": {"destination": "rel/x"}}}, "destination must be s3://"),
        ({"command": "t", "outputs": {"/out": {"dest": "s3://b/x"}}}, "unknown option"),
        ({"command": "t", "args": ["--lr", "1"]}, "args: expected a dict"),
        ({"command": "t", "args": {"bad key": 1}}, r"args\['bad key'\]: argument names"),
        ({"command": "t", "args": {"lr\n": 1}}, "argument names"),
        ({"command": "t", "specs": {"d": "s3://bkt\n/k"}, "inputs": ["d"]}, "not a valid s3://bucket/key"),
        ({"command": "t", "args": {"x": [[1, 2]]}}, "nested lists cannot be CLI flags"),
        ({"command": "t", "args": {"x": "a\x00b"}}, "NUL"),
        ({"command": "t", "args": {"x": math.nan}}, "NaN"),
        ({"command": "t", "args": {"x": "v" * 200_000}}, "too long for Linux"),
        ({"command": ["t"], "args": {f"k{i}": "v" * 60_000 for i in range(20)}}, "too long for Linux"),
        ({"command": "t", "args": {"x": 1}, "inputs": ["y"]}, r"inputs\['y'\]: 'y' is not a key of args"),
        ({"command": "t", "args": {"x": "rel/path"}, "inputs": ["x"]}, "relative path"),
        ({"command": "t", "args": {"o": "http://x/y"}, "outputs": ["o"]}, "unsupported destination"),
        ({"command": "train --cfg {config_path}", "args": {"a": 1}}, r"uses \{config_path\} but mode is 'args'"),
        ({"command": ["train", "{config_path}"]}, r"uses \{config_path\} but mode is 'passthrough'"),
    ],
)
def test_validation_errors_name_the_parameter(kwargs: dict[str, Any], match: str) -> None:
    command = kwargs.pop("command")
    with pytest.raises(ValueError, match=match):
        build_entrypoint(command, **kwargs)


def test_toml_none_is_fine_at_a_declared_output() -> None:
    ep = build_entrypoint(
        "t {config_path}", specs={"train": {"results_dir": None}}, outputs=["train.results_dir"], config_format="toml"
    )
    assert manifest(ep)["config_format"] == "toml"


def test_normalisation_makes_a_fresh_json_safe_tree() -> None:
    spec = {"t": (1, 2.5, Color.RED, PurePosixPath("/a/b"), True, None)}
    ep = build_entrypoint("t", specs=spec)
    assert manifest(ep)["specs"] == {"t": [1, 2.5, "red", "/a/b", True, None]}


def test_empty_inputs_are_allowed_and_skipped_at_runtime() -> None:
    ep = build_entrypoint("t", specs={"model": {"ptm": "", "resume": None}}, inputs=["model.ptm", "model.resume"])
    assert manifest(ep)["inputs"] == {"model.ptm": {}, "model.resume": {}}


def test_declarations_are_normalised_to_dicts() -> None:
    ep = build_entrypoint(
        "t",
        specs={"d": {"train": "s3://b/train/", "val": ["s3://b/v1", "/abs/v2"]}, "out": {"dir": "output"}},
        inputs=["d.train", "d.val"],
        outputs={"out.dir": {"type": "folder"}},
        upload_excludes=["*.tmp"],
        mount_path="/lustre/cache",
    )
    m = manifest(ep)
    assert m["inputs"] == {"d.train": {}, "d.val": {}}
    assert m["outputs"] == {"out.dir": {"type": "folder"}}
    assert m["upload_excludes"] == ["*.tmp"]
    assert m["mount_path"] == "/lustre/cache"
    assert ep.outputs == ["out.dir"]


def test_passthrough_declarations() -> None:
    ep = build_entrypoint(
        "t",
        inputs={"/data/x": "s3://b/x/"},
        outputs={"/out/a": None, "/out/b": "s3://b/custom", "/out/c": {"destination": "/mnt/c"}},
    )
    m = manifest(ep)
    assert m["inputs"] == {"/data/x": "s3://b/x/"}
    assert m["outputs"] == {
        "/out/a": {},
        "/out/b": {"destination": "s3://b/custom"},
        "/out/c": {"destination": "/mnt/c"},
    }
    assert ep.outputs == ["/out/a", "/out/b", "/out/c"]


# ---------------------------------------------------------------------------------------------------- contract
def test_command_is_fixed_and_carries_no_user_content() -> None:
    marker = "USER-MARKER-7f3a"
    ep = build_entrypoint(f"echo {marker}", specs={"v": marker * 1000}, outputs=[], config_format="json")
    assert ep.command == list(ep_mod.RUNNER_COMMAND)
    assert ep.command[:2] == ["/bin/sh", "-c"]
    assert 'exec python3 -u -B "$TAO_JOB_FILES/runner.pyz" "$TAO_JOB_FILES/runner.json"' in ep.command[2]
    assert marker not in json.dumps(ep.command) + json.dumps(ep.env)
    assert marker in ep.files[RUNNER_MANIFEST_FILE]
    assert set(ep.files) == {RUNNER_FILE, RUNNER_MANIFEST_FILE}


def test_files_hold_the_runner_archive_and_an_ascii_manifest() -> None:
    ep = build_entrypoint(["python", "x.py"], specs={"name": "日本語 é"})
    assert ep.files[RUNNER_FILE] == runner_archive()
    ep.files[RUNNER_MANIFEST_FILE].encode("ascii")
    m = manifest(ep)
    assert m["specs"] == {"name": "日本語 é"}
    assert m["command"] == ["python", "x.py"]
    assert m["format"] == 1


def test_wheels_are_copied_from_versions_yaml() -> None:
    wheels = yaml.safe_load((REPO / "airflow_provider_tao" / "versions.yaml").read_text())["wheels"]
    assert manifest(build_entrypoint("t"))["wheels"] == wheels
    assert wheels["boto3"].startswith("boto3==")


def test_entrypoint_json_round_trip() -> None:
    ep = build_entrypoint("t {config_path}", specs={"a": {"b": "s3://x/y"}}, inputs=["a.b"])
    data = json.loads(json.dumps(ep.to_json()))
    assert Entrypoint.from_json(data) == ep
    assert Entrypoint.from_json(json.dumps(data)) == ep


def test_entrypoint_is_frozen() -> None:
    ep = build_entrypoint("t")
    with pytest.raises(AttributeError):
        ep.mode = "config"  # type: ignore[misc]


def test_output_uris_follow_auto_fill_and_explicit_destinations() -> None:
    ep = build_entrypoint(
        "t",
        specs={
            "train": {
                "results_dir": "output",
                "ckpt": None,
                "export": "s3://bkt/exports/",
                "onnx": "model.onnx",
                "abs": "/mnt/keep/x.onnx",
            }
        },
        outputs={
            "train.results_dir": None,
            "train.ckpt": None,
            "train.export": None,
            "train.onnx": {"type": "file"},
            "train.abs": {"type": "file"},
        },
    )
    assert ep.output_uris("s3://bkt/results/j1/") == {
        "train.results_dir": "s3://bkt/results/j1/train_results_dir",
        "train.ckpt": "s3://bkt/results/j1/train_ckpt",
        "train.export": "s3://bkt/exports",
        "train.onnx": "s3://bkt/results/j1/train_onnx",
        "train.abs": "/mnt/keep",
    }
    passthrough = build_entrypoint("t", outputs={"/w/out": None, "/w/model.pt": "s3://b/m"})
    assert passthrough.output_uris("/lustre/results/j1") == {
        "/w/out": "/lustre/results/j1/out",
        "/w/model.pt": "s3://b/m",
    }
    args = build_entrypoint("t", args={"output-dir": "", "x": 1}, outputs=["output-dir"])
    assert args.output_uris("/r/j") == {"output-dir": "/r/j/output_dir"}


def test_parse_progress() -> None:
    assert parse_progress('TAO_PROGRESS {"phase":"run","files":0,"bytes":0,"step":5}') == {
        "phase": "run",
        "files": 0,
        "bytes": 0,
        "step": 5,
    }
    assert parse_progress('2026-01-01 stdout: TAO_PROGRESS {"phase":"done","files":1,"bytes":2}') == {
        "phase": "done",
        "files": 1,
        "bytes": 2,
    }
    assert parse_progress("TAO_PROGRESS {not json") is None
    assert parse_progress("step 5") is None
    assert parse_progress('TAO_PROGRESS {"files": 1}') is None


def test_a_4mib_spec_does_not_touch_the_command_line() -> None:
    blob = "x" * (4 * 1024 * 1024)
    ep = build_entrypoint(["cat", "{config_path}"], specs={"blob": blob}, config_format="json")
    assert sum(len(a) for a in ep.command) < 600
    assert manifest(ep)["specs"]["blob"] == blob
