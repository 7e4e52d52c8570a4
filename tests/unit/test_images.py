"""``images.py`` + ``versions.yaml``: dotted keys, image references returned as given, overrides and caching."""

from __future__ import annotations

import os

import pytest
import yaml

from airflow_provider_tao.images import (
    PACKAGED_VERSIONS_FILE,
    VERSIONS_FILE_ENV,
    UnknownVersionKeyError,
    load_versions,
    looks_like_key,
    resolve_container_image,
    resolve_wheel,
    versions_file,
)

SITE_FILE = """\
images:
  tao_toolkit:
    pyt: registry.example.com/tao/tao-toolkit:site-pyt
  custom:
    trainer: registry.example.com/team/trainer:1.2.3
wheels:
  boto3: boto3==9.9.9
"""


@pytest.fixture(autouse=True)
def _no_override(monkeypatch):
    monkeypatch.delenv(VERSIONS_FILE_ENV, raising=False)


@pytest.fixture
def site_file(tmp_path):
    path = tmp_path / "site-versions.yaml"
    path.write_text(SITE_FILE)
    return path


def _packaged() -> dict:
    return yaml.safe_load(PACKAGED_VERSIONS_FILE.read_text())


def _leaves(tree, prefix=""):
    for name, sub in tree.items():
        key = f"{prefix}.{name}" if prefix else name
        if isinstance(sub, dict):
            yield from _leaves(sub, key)
        else:
            yield key, sub


# ----------------------------------------------------------------------------- the packaged file


def test_packaged_file_has_images_and_wheels_trees():
    data = _packaged()
    assert isinstance(data["images"], dict) and data["images"]
    assert isinstance(data["wheels"], dict) and data["wheels"]
    assert versions_file() == PACKAGED_VERSIONS_FILE


def test_every_packaged_image_key_resolves_to_its_value_with_and_without_prefix():
    for key, value in _leaves(_packaged()["images"]):
        assert resolve_container_image(key) == value
        assert resolve_container_image(f"images.{key}") == value
        assert "/" in value or ":" in value  # an image reference, not another key


def test_tao_pyt_key():
    assert resolve_container_image("tao_toolkit.pyt") == _packaged()["images"]["tao_toolkit"]["pyt"]
    assert resolve_container_image("tao_toolkit.pyt").startswith("nvcr.io/nvidia/tao/tao-toolkit:")


def test_every_packaged_wheel_is_a_pinned_requirement():
    for key, value in _leaves(_packaged()["wheels"]):
        assert resolve_wheel(key) == value
        assert resolve_wheel(f"wheels.{key}") == value
        assert "==" in value, f"{key} is not pinned: {value}"


def test_resolve_wheel_unknown_key_lists_known_wheels():
    with pytest.raises(UnknownVersionKeyError) as exc:
        resolve_wheel("torch")
    message = str(exc.value)
    assert "'torch'" in message
    for key, _ in _leaves(_packaged()["wheels"]):
        assert key in message


def test_wheel_keys_are_not_image_keys():
    with pytest.raises(UnknownVersionKeyError):
        resolve_container_image("wheels.boto3")
    with pytest.raises(UnknownVersionKeyError):
        resolve_wheel("tao_toolkit.pyt")


# ----------------------------------------------------------------------------- references returned as given


@pytest.mark.parametrize(
    "ref",
    [
        "ubuntu",
        "python:3.11",
        "python:3.11-slim",
        "nvcr.io/x/y:tag",
        "nvcr.io/nvidia/tao/tao-toolkit:6.26.3-pyt",
        "localhost:5000/img",
        "localhost:5000/img:1.0",
        "docker.io/library/ubuntu:22.04",
        "ghcr.io/org/image@sha256:" + "a" * 64,
        "my-image",
        "registry.example.com/team/trainer",
    ],
)
def test_image_references_are_returned_exactly_as_given(ref):
    assert not looks_like_key(ref)
    assert resolve_container_image(ref) == ref


def test_references_are_never_looked_up_even_in_an_empty_versions_file(tmp_path, monkeypatch):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    monkeypatch.setenv(VERSIONS_FILE_ENV, str(empty))
    for ref in ("ubuntu", "python:3.11", "nvcr.io/x/y:tag", "localhost:5000/img"):
        assert resolve_container_image(ref) == ref


def test_surrounding_whitespace_is_ignored():
    assert resolve_container_image("  ubuntu \n") == "ubuntu"
    assert resolve_container_image(" tao_toolkit.pyt ") == resolve_container_image("tao_toolkit.pyt")


@pytest.mark.parametrize("empty", ["", "   "])
def test_empty_image_is_an_error_naming_image(empty):
    with pytest.raises(ValueError, match=r"^image: "):
        resolve_container_image(empty)


@pytest.mark.parametrize(
    ("value", "is_key"),
    [
        ("tao_toolkit.pyt", True),
        ("images.tao_toolkit.pyt", True),
        ("a.b.c-d_e", True),
        ("ubuntu", False),
        ("python:3.11", False),
        ("nvcr.io/x/y:tag", False),
        ("localhost:5000/img", False),
        (".leading", False),
        ("trailing.", False),
    ],
)
def test_looks_like_key(value, is_key):
    assert looks_like_key(value) is is_key


# ----------------------------------------------------------------------------- unknown keys


def test_unknown_dotted_key_error_lists_every_known_key():
    with pytest.raises(UnknownVersionKeyError) as exc:
        resolve_container_image("tao_toolkit.nope")
    message = str(exc.value)
    assert message.startswith("'tao_toolkit.nope' is not a key")
    for key, _ in _leaves(_packaged()["images"]):
        assert key in message
    assert "absolute image URI" in message
    assert str(PACKAGED_VERSIONS_FILE) in message


def test_unknown_key_is_a_key_error_whose_str_is_not_repr_quoted():
    with pytest.raises(KeyError) as exc:
        resolve_container_image("images.nope.nope")
    assert not str(exc.value).startswith('"')


def test_a_key_naming_a_subtree_is_not_an_image():
    # "tao_toolkit" alone has no dot, so it is a bare image name; "images.tao_toolkit" names a subtree.
    assert resolve_container_image("tao_toolkit") == "tao_toolkit"
    with pytest.raises(UnknownVersionKeyError, match=r"tao_toolkit\.pyt"):
        resolve_container_image("images.tao_toolkit")


def test_a_key_through_a_leaf_is_unknown():
    with pytest.raises(UnknownVersionKeyError):
        resolve_container_image("tao_toolkit.pyt.extra")


# ----------------------------------------------------------------------------- other files


def test_explicit_path_argument(site_file):
    assert resolve_container_image("custom.trainer", path=site_file) == "registry.example.com/team/trainer:1.2.3"
    assert resolve_wheel("boto3", path=site_file) == "boto3==9.9.9"
    with pytest.raises(UnknownVersionKeyError) as exc:
        resolve_container_image("pytorch.base", path=site_file)  # packaged key, absent here
    assert str(site_file) in str(exc.value)
    assert "custom.trainer" in str(exc.value) and "tao_toolkit.pyt" in str(exc.value)


def test_tao_versions_file_env_overrides_the_packaged_file(site_file, monkeypatch):
    monkeypatch.setenv(VERSIONS_FILE_ENV, str(site_file))
    assert versions_file() == site_file
    assert resolve_container_image("tao_toolkit.pyt") == "registry.example.com/tao/tao-toolkit:site-pyt"
    assert resolve_wheel("boto3") == "boto3==9.9.9"
    with pytest.raises(UnknownVersionKeyError) as exc:
        resolve_container_image("pytorch.base")
    assert str(site_file) in str(exc.value)
    monkeypatch.delenv(VERSIONS_FILE_ENV)
    assert resolve_container_image("tao_toolkit.pyt") == _packaged()["images"]["tao_toolkit"]["pyt"]


def test_override_pointing_nowhere_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv(VERSIONS_FILE_ENV, str(tmp_path / "missing.yaml"))
    with pytest.raises(OSError):
        resolve_container_image("tao_toolkit.pyt")


def test_edits_to_the_file_are_seen(site_file):
    assert resolve_container_image("custom.trainer", path=site_file).endswith(":1.2.3")
    # same length, rewritten immediately: only the modification time tells the cache
    site_file.write_text(SITE_FILE.replace("trainer:1.2.3", "trainer:4.5.6"))
    assert resolve_container_image("custom.trainer", path=site_file).endswith(":4.5.6")
    site_file.write_text(SITE_FILE.replace("  custom:\n", "  custom:\n    added: example.com/added:1\n"))
    assert resolve_container_image("custom.added", path=site_file) == "example.com/added:1"


def test_unchanged_file_is_parsed_once(site_file, monkeypatch):
    load_versions(site_file)
    calls = []
    real = yaml.safe_load
    monkeypatch.setattr(yaml, "safe_load", lambda text: calls.append(1) or real(text))
    for _ in range(5):
        resolve_container_image("custom.trainer", path=site_file)
    assert calls == []
    os.utime(site_file, ns=(0, site_file.stat().st_mtime_ns + 1_000_000))
    resolve_container_image("custom.trainer", path=site_file)
    assert calls == [1]


@pytest.mark.parametrize("content", ["- a\n- b\n", "just a string\n", "42\n"])
def test_a_file_that_is_not_a_mapping_is_an_error(tmp_path, content):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(ValueError, match="expected a mapping"):
        load_versions(path)


def test_file_without_images_tree_lists_none(tmp_path):
    path = tmp_path / "only-wheels.yaml"
    path.write_text("wheels:\n  boto3: boto3==1\n")
    with pytest.raises(UnknownVersionKeyError, match=r"Known keys: \(none\)"):
        resolve_container_image("tao_toolkit.pyt", path=path)
