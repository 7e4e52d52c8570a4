"""What no operating system can hand a job -- NUL, lone surrogates, argv / environment strings over 128 KiB -- and
image references with shell characters are refused before submission, naming the field, on every platform."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_tao.hooks import PLATFORMS, get_platform_hook
from airflow_provider_tao.hooks.base import JobValidationError, TAOPlatformHook
from airflow_provider_tao.jobs import JobSpec

BIG = "x" * (121 * 1024)


def _spec(**changes: Any) -> JobSpec:
    fields: dict[str, Any] = {"name": "tao-0123456789", "job_id": "0123456789ab", "command": ["true"], "gpu_count": 0}
    return JobSpec(**{**fields, **changes})


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"env": {"A": "x\x00y"}}, "env['A']"),
        ({"env": {"A": "\ud800"}}, "env['A']"),
        ({"env": {"A": BIG}}, "env['A']"),
        ({"secret_env": {"TOKEN": "t\x00"}}, "env['TOKEN']"),
        ({"command": ["echo", "a\x00b"]}, "command[1]"),
        ({"command": ["echo", "\udfff"]}, "command[1]"),
        ({"command": ["echo", BIG]}, "command[1]"),
        ({"command": "echo \x00"}, "command"),
        ({"command": ["echo", 3]}, "command[1]"),
        ({"image": "busybox; touch /tmp/x"}, "image"),
        ({"image": "busybox\n:1"}, "image"),
        ({"image": "$(touch /tmp/x)"}, "image"),
    ],
)
@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_impossible_values_are_refused_naming_the_field(platform: str, changes: dict[str, Any], field: str) -> None:
    hook: TAOPlatformHook = get_platform_hook(platform, None)
    with pytest.raises(JobValidationError) as refused:
        TAOPlatformHook.validate_spec(hook, _spec(**changes))
    assert refused.value.parameter == field


@pytest.mark.parametrize(
    "image", ["busybox", "nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt", "docker://nvcr.io#nvidia/pytorch:24.01-py3",
              "/shared/images/pyt.sqsh", "registry:5000/a/b@sha256:" + "0" * 64]
)  # fmt: skip
def test_real_image_references_pass(image: str) -> None:
    TAOPlatformHook.validate_spec(get_platform_hook("local", None), _spec(image=image))


def test_values_a_process_can_carry_pass() -> None:
    hostile = 'it\'s "q"; $(touch /x) `y` && z\n\t\u00e9\u65e5\U0001f642 ' + "v" * (100 * 1024)
    spec = _spec(env={"A": hostile}, command=["echo", hostile], secret_env={"T": "s3cr3t"})
    TAOPlatformHook.validate_spec(get_platform_hook("local", None), spec)
