"""The runner's own failures: the class failure analysis reads and the exit code that goes with it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - typing only
    from collections.abc import Mapping

EXIT_CONFIG = 2
EXIT_SOFTWARE = 70
EXIT_INFRA = 75  # EX_TEMPFAIL: retrying later may work
# Which versions.yaml `wheels:` key pins each optional package.
WHEEL_KEYS = {"boto3": "boto3", "yaml": "pyyaml", "huggingface_hub": "huggingface_hub", "ngcsdk": "ngcsdk"}


class RunnerError(Exception):
    """A failure of the runner itself, with the class and exit code failure analysis expects."""

    err_class = "ERR_UNKNOWN"
    exit_code = EXIT_SOFTWARE


class ConfigError(RunnerError):
    """Missing / denied input, bad manifest, missing package: a retry will not help."""

    err_class = "ERR_CONFIG"
    exit_code = EXIT_CONFIG


class InfraError(RunnerError):
    """Connection dropped, endpoint gone, timeouts after retries: a retry may help."""

    err_class = "ERR_INFRA"
    exit_code = EXIT_INFRA


def missing_package(module: str, purpose: str, wheels: Mapping[str, str] | None) -> ConfigError:
    """The error for an optional package the job image lacks; names the pinned version, installs nothing.

    :param module: the import name (``boto3``, ``huggingface_hub``, ...).
    :param purpose: what needed it, e.g. ``"s3:// inputs"``.
    :param wheels: the ``wheels:`` tree of versions.yaml copied into runner.json.
    """
    key = WHEEL_KEYS.get(module, module)
    pin = (wheels or {}).get(key)
    if pin:
        fix = f"add it to the job image: pip install '{pin}' (pinned in versions.yaml wheels.{key})"
    else:
        fix = f"add it to the job image and pin it under 'wheels: {key}:' in versions.yaml"
    return ConfigError(f"python package '{module}' is not installed in the job image but {purpose} need it; {fix}")
