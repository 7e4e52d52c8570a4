"""Provider metadata read by Airflow's ProvidersManager (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from typing import Any

INTEGRATION = "NVIDIA TAO"


def _field(label: str, description: str, *, kind: str = "string", secret: bool = False) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": [kind, "null"]}
    if secret:
        schema["format"] = "password"
    return {"label": label, "description": description, "schema": schema}


def get_provider_info() -> dict[str, Any]:
    """The provider's metadata: connection types with their form fields, hooks, triggers, links and config."""
    return {
        "package-name": "airflow-provider-tao",
        "name": "NVIDIA TAO",
        "description": "Run TAO (or any containerised) GPU training jobs on SLURM, Lepton, Brev, Docker, "
        "Kubernetes or the worker host, with deferrable monitoring, S3 staging and failure analysis.",
        "versions": ["0.1.0"],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": "https://docs.nvidia.com/tao/tao-toolkit/",
                "tags": ["software"],
            }
        ],
        "operators": [{"integration-name": INTEGRATION, "python-modules": ["airflow_provider_tao.operators.submit"]}],
        "hooks": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["airflow_provider_tao.hooks.base", "airflow_provider_tao.hooks.local"],
            }
        ],
        "triggers": [{"integration-name": INTEGRATION, "python-modules": ["airflow_provider_tao.triggers.job"]}],
        "extra-links": ["airflow_provider_tao.links.TAOJobLink"],
        "connection-types": [
            {
                "connection-type": "tao_local",
                "hook-class-name": "airflow_provider_tao.hooks.local.LocalHook",
                "hook-name": "TAO local",
                "conn-fields": {
                    "jobs_dir": _field("Jobs folder", "Where job folders (logs, exit codes) are kept."),
                    "results_root": _field("Results root", "Where job results land: <results_root>/<job_id>."),
                    "cancel_grace_seconds": _field(
                        "Cancel grace (s)", "Seconds between SIGTERM and SIGKILL on cancel.", kind="number"
                    ),
                },
                "ui-field-behaviour": {
                    "hidden-fields": ["host", "schema", "login", "password", "port", "extra"],
                    "relabeling": {},
                    "placeholders": {"jobs_dir": "/var/lib/airflow/tao/jobs"},
                },
            }
        ],
        "config": {
            "tao": {
                "description": "Settings of the NVIDIA TAO provider.",
                "options": {
                    "local_jobs_dir": {
                        "description": "Jobs folder of the local platform when its connection does not set one.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "/var/lib/airflow/tao/jobs",
                        "default": None,
                    },
                    "local_results_root": {
                        "description": "Results root of the local platform when its connection does not set one.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "/var/lib/airflow/tao/results",
                        "default": None,
                    },
                    "default_poll_interval": {
                        "description": "Seconds between status polls of a watched job.",
                        "version_added": "0.1.0",
                        "type": "float",
                        "example": "30",
                        "default": "10",
                    },
                },
            }
        },
    }
