"""The checks of a job's text before anything is submitted: its environment, its command and its image reference."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from airflow_provider_tao.hooks.errors import JobValidationError
from airflow_provider_tao.jobs import JobSpec

#: Platforms where every job is a container, and why: a missing image is refused before any connection is read
#: (at parse time when the platform is named), not by a daemon or API server that may not even answer.
IMAGE_REQUIRED: dict[str, str] = {
    "docker": "every job is a container",
    "kubernetes": "every job is a pod",
    "lepton": "every job is a container",
    "brev": "every job is a container on the instance",
}

#: An image reference or path: registry/name:tag@digest, Pyxis' registry#name, enroot's docker://, an absolute path.
_IMAGE_REFERENCE = re.compile(r"^[A-Za-z0-9/][A-Za-z0-9._/:@#+=~-]*$")


def _checked(check: Callable[..., Any], value: Any, where: str) -> None:
    """Run one of the runner's text checks, whose ``ValueError`` starts with the parameter, as a
    ``JobValidationError``."""
    try:
        check(value, where)
    except ValueError as exc:
        parameter, _, problem = str(exc).partition(": ")
        raise JobValidationError(parameter, problem, "Fix the value") from exc


def env_value_fix(value: object) -> str:
    """How to fix an ``env`` value that is not a string: ``None`` is no value to quote."""
    if value is None:
        return 'Give a string ("" for an empty one), or leave the variable out'
    return f"Quote it: {str(value)!r}"


def check_spec_text(spec: JobSpec) -> None:
    """Refuse, naming the field, what no operating system can hand a process (NUL, lone surrogates, > 128 KiB
    strings) instead of letting it be cut short or fail in the job's exec; and environment names that are not
    names, an empty command, an image that is not an image reference."""
    from airflow_provider_tao.runner.validation import check_command, check_exec_text

    for key, value in {**spec.env, **spec.secret_env}.items():
        if not isinstance(value, str):
            raise JobValidationError(f"env[{key!r}]", f"{value!r} is not a string", env_value_fix(value))
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise JobValidationError(
                f"env[{key!r}]", "is not a valid environment variable name", "Use [A-Za-z_][A-Za-z0-9_]*"
            )
        _checked(check_exec_text, value, f"env[{key!r}]")
    if not spec.command:
        raise JobValidationError("command", "is empty", "Give the command the job runs")
    _checked(check_command, spec.command, "config")  # "config": placeholders are the runner's business
    if spec.image is not None and not _IMAGE_REFERENCE.match(spec.image):
        raise JobValidationError(
            "image",
            f"{spec.image!r} is not an image reference",
            "Use a versions.yaml key, an image URI such as nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt or a path, "
            "without spaces, quotes or shell characters",
        )


def image_required_words(platform: str) -> str:
    """What the image check says of a missing image on ``platform`` (after the parameter's name)."""
    why = IMAGE_REQUIRED.get(platform)
    return f"is required on the {platform} platform" + (f": {why}" if why else "")


def check_image_given(platform: str | None, image: object) -> None:
    """Refuse ``image=None`` on a platform whose every job is a container (no connection, no SDK needed).

    :param platform: the platform name, or None when it is not known yet.
    :param image: the operator's ``image`` (a template or an XComArg counts as given).
    """
    if image is None and platform in IMAGE_REQUIRED:
        raise JobValidationError(
            "image", image_required_words(platform), "Give a versions.yaml key such as tao_toolkit.pyt or an image URI"
        )
