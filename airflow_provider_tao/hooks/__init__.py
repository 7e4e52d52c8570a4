"""Platform hooks, found by platform name or connection type without importing any platform SDK up front."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_provider_tao.hooks.base import TAOPlatformHook

#: platform name -> (connection type, hook class path). Importing a hook module happens only when it is used.
PLATFORMS: dict[str, tuple[str, str]] = {
    "local": ("tao_local", "airflow_provider_tao.hooks.local.LocalHook"),
    "slurm": ("tao_slurm", "airflow_provider_tao.hooks.slurm.SlurmHook"),
    "brev": ("tao_brev", "airflow_provider_tao.hooks.brev.BrevHook"),
    "docker": ("tao_docker", "airflow_provider_tao.hooks.docker.TAODockerHook"),
    "kubernetes": ("tao_kubernetes", "airflow_provider_tao.hooks.kubernetes.TAOKubernetesHook"),
    "lepton": ("tao_lepton", "airflow_provider_tao.hooks.lepton.LeptonHook"),
}


def platform_for_conn_type(conn_type: str) -> str | None:
    """The platform whose connection type this is, or None."""
    return next((name for name, (ctype, _) in PLATFORMS.items() if ctype == conn_type), None)


def hook_class(platform: str) -> type[TAOPlatformHook]:
    """The hook class of a platform; an unknown platform is an error that lists the known ones.

    :param platform: a platform name such as ``local`` or ``slurm``.
    """
    from airflow_provider_tao.hooks.base import JobValidationError

    if platform not in PLATFORMS:
        raise JobValidationError(
            "platform", f"unknown platform {platform!r}", f"Use one of: {', '.join(sorted(PLATFORMS))}"
        )
    module, _, name = PLATFORMS[platform][1].rpartition(".")
    hook: type[TAOPlatformHook] = getattr(import_module(module), name)
    return hook


def get_platform_hook(platform: str, conn_id: str | None) -> TAOPlatformHook:
    """A hook instance for ``platform`` on connection ``conn_id``.

    :param platform: the platform name.
    :param conn_id: the Airflow connection id, or None for the platform's defaults.
    """
    return hook_class(platform)(conn_id=conn_id)
