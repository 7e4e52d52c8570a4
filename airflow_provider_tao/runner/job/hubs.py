"""Pretrained models and data sets from hubs: ``hf_model://org/name[@rev]``, ``hf_dataset://...`` (huggingface_hub)
and ``ngc://org/[team/]model:version`` (ngcsdk), each imported only when such a reference is staged."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .errors import ConfigError, InfraError, RunnerError, missing_package

if TYPE_CHECKING:  # pragma: no cover - typing only
    from collections.abc import Mapping

MODEL_SCHEMES = ("ngc://", "hf_model://", "hf_dataset://")
MODEL_FILE_EXTENSIONS = (".pth", ".pth.tar", ".pt", ".ckpt", ".hdf5", ".tlt", ".safetensors", ".onnx")


def classify_hub(exc: BaseException, uri: str) -> RunnerError:
    """A hub client's error as ERR_CONFIG (not found, gated, refused) or ERR_INFRA (anything else).

    :param exc: the error.
    :param uri: the reference being fetched.
    """
    name = type(exc).__name__
    if any(word in name for word in ("NotFound", "Gated", "Unauthorized", "Forbidden", "Auth", "Value")):
        return ConfigError(f"input {uri}: {name}: {exc}")
    return InfraError(f"input {uri}: download failed ({name}: {exc})")


def fetch_model(uri: str, dest: str, wheels: Mapping[str, str] | None) -> str:
    """Download a hub reference into ``dest``; returns the local path the spec should point at.

    :param uri: ``hf_model://``, ``hf_dataset://`` or ``ngc://`` reference.
    :param dest: the folder to download into.
    :param wheels: pinned versions for the missing-package message.
    """
    os.makedirs(dest, exist_ok=True)
    if uri.startswith("ngc://"):
        return _fetch_ngc(uri, dest, wheels)
    repo_type = "dataset" if uri.startswith("hf_dataset://") else "model"
    repo_id, _, revision = uri.split("://", 1)[1].partition("@")
    try:
        import huggingface_hub
    except ImportError:
        raise missing_package("huggingface_hub", "hf_model:// / hf_dataset:// inputs", wheels) from None
    try:
        huggingface_hub.snapshot_download(
            repo_id=repo_id,
            repo_type=repo_type,
            revision=revision or None,
            local_dir=dest,
            token=os.environ.get("HF_TOKEN") or None,
        )
    except Exception as exc:
        raise classify_hub(exc, uri) from exc
    return dest


def _fetch_ngc(uri: str, dest: str, wheels: Mapping[str, str] | None) -> str:
    """An NGC model version; returns its model file when there is one (as the TAO SDK does), else the folder."""
    ref = uri[len("ngc://") :]
    parts = ref.split("/")
    if len(parts) not in (2, 3) or ":" not in parts[-1]:
        raise ConfigError(f"input {uri}: expected ngc://org/[team/]model:version")
    if not os.environ.get("NGC_KEY"):
        raise ConfigError(f"input {uri}: NGC_KEY is not set in the job environment")
    try:
        import ngcsdk
    except ImportError:
        raise missing_package("ngcsdk", "ngc:// inputs", wheels) from None
    org = parts[0]
    team = parts[1] if len(parts) == 3 else "no-team"
    try:
        client = ngcsdk.Client()
        client.configure(api_key=os.environ["NGC_KEY"], org_name=org, team_name=team)
        client.registry.model.download_version(ref, destination=dest)
    except Exception as exc:
        raise classify_hub(exc, uri) from exc
    for dirpath, _dirs, files in sorted(os.walk(dest)):
        for name in sorted(files):
            if name.endswith(MODEL_FILE_EXTENSIONS):
                return os.path.join(dirpath, name)
    return dest
