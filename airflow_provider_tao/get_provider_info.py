"""Provider metadata read by Airflow's ProvidersManager (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from typing import Any

INTEGRATION = "NVIDIA TAO"


def _field(label: str, description: str, *, kind: str = "string", secret: bool = False) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": [kind, "null"]}
    if secret:
        schema["format"] = "password"
    return {"label": label, "description": description, "schema": schema}


def _slurm_connection_type() -> dict[str, Any]:
    """``tao_slurm``: host = login host(s), comma-separated for failover; login; port; password (optional)."""
    return {
        "connection-type": "tao_slurm",
        "hook-class-name": "airflow_provider_tao.hooks.slurm.SlurmHook",
        "hook-name": "TAO SLURM",
        "conn-fields": {
            "key_file": _field("Private key file", "Path of the SSH private key on the Airflow hosts (SSH_KEY_PATH)."),
            "private_key": _field("Private key", "The SSH private key itself (instead of a key file).", secret=True),
            "private_key_passphrase": _field("Key passphrase", "Passphrase of the private key.", secret=True),
            "host_key": _field(
                "Host key", "The login node's public host key ('ssh-ed25519 AAAA...'); checked on every connection."
            ),
            "no_host_key_check": _field(
                "Skip host key check", "Explicitly disable host key checking (not recommended).", kind="boolean"
            ),
            "partition": _field("Partition(s)", "Partition list for sbatch, e.g. 'gpu,gpu-long' (SLURM_PARTITION)."),
            "account": _field("Account", "Account charged by #SBATCH --account (SLURM_ACCOUNT)."),
            "results_root": _field(
                "Results root",
                "Shared-filesystem folder for job folders and results: <root>/jobs/<id>, <root>/results/<id> "
                "(SLURM_BASE_RESULTS_DIR).",
            ),
            "container_runtime": _field("Container runtime", "pyxis (default), oci (Slurm --container) or none."),
            "oci_bundle": _field("OCI bundle", "Default OCI bundle folder on the cluster (container_runtime=oci)."),
            "container_mounts": _field("Container mounts", "Pyxis --container-mounts (default /lustre)."),
            "time_hours": _field("Wall time (h)", "Default --time of a job (4).", kind="number"),
            "timeout_hours": _field(
                "Inner timeout (h)",
                "The command is stopped after this long (default: wall time - 0.2 h).",
                kind="number",
            ),
            "max_time_hours": _field(
                "Max wall time (h)", "Longer requests are rejected before submission (4).", kind="number"
            ),
            "gpus_per_node": _field("GPUs per node", "GPUs of one node (8); 0 for a CPU-only cluster.", kind="integer"),
            "cpus_per_task": _field("CPUs per task", "--cpus-per-task of the one task per node (16).", kind="integer"),
            "max_resubmits": _field(
                "Max resubmissions", "Requeues of a job after an infrastructure failure (3).", kind="integer"
            ),
        },
        "ui-field-behaviour": {
            "hidden-fields": ["schema", "extra"],
            "relabeling": {"host": "Login host(s)", "login": "User", "password": "Password (prefer a key)"},
            "placeholders": {
                "host": "login1.cluster.example,login2.cluster.example",
                "results_root": "/lustre/fsw/<project>/<user>",
                "partition": "polar,polar3,polar4,grizzly",
                "host_key": "ssh-ed25519 AAAA...",
                "container_runtime": "pyxis",
            },
        },
    }


def _brev_connection_type() -> dict[str, Any]:
    """``tao_brev``: password = the Brev API token; the CLI, the org and the instances this provider creates."""
    return {
        "connection-type": "tao_brev",
        "hook-class-name": "airflow_provider_tao.hooks.brev.BrevHook",
        "hook-name": "TAO Brev",
        "conn-fields": {
            "brev_path": _field(
                "brev CLI", "Path of the brev executable on the Airflow hosts (default: brev on PATH)."
            ),
            "org": _field("Org", "The Brev org to work in (default: the account's)."),
            "instance_type": _field(
                "Instance types",
                "Fallback chain of the instances this provider creates, e.g. 'g5.xlarge,g6.xlarge' (default: the "
                "CLI's own choice). A job's backend_details['instance_type'] wins.",
            ),
            "lease_hours": _field(
                "Lease (h)",
                "An instance this provider created is deleted by the reaper this long after its creation (8).",
                kind="number",
            ),
            "ngc_api_key": _field("NGC API key", "Key for pulling images from the registry (NGC_KEY).", secret=True),
            "registry": _field("Registry", "The registry the NGC key is for (default nvcr.io)."),
            "network": _field("Docker network", "Docker network of the job containers on the instance."),
            "shm_size": _field("Shared memory", "Size of /dev/shm in each job (default 16g)."),
            "cancel_grace_seconds": _field(
                "Cancel grace (s)", "Seconds between SIGTERM and SIGKILL when a job is stopped (10).", kind="number"
            ),
            "boot_timeout_seconds": _field(
                "Boot timeout (s)", "How long a new instance may take to reach RUNNING (1200).", kind="number"
            ),
            "launch_timeout_seconds": _field(
                "Launch timeout (s)", "How long the launch (image pull included) may take (1800).", kind="number"
            ),
        },
        "ui-field-behaviour": {
            "hidden-fields": ["host", "schema", "login", "port", "extra"],
            "relabeling": {"password": "Brev API token"},
            "placeholders": {
                "brev_path": "/usr/local/bin/brev",
                "instance_type": "g5.xlarge,g6.xlarge",
                "lease_hours": "8",
                "registry": "nvcr.io",
            },
        },
    }


def _docker_connection_type() -> dict[str, Any]:
    """``tao_docker``: host = daemon URL; login/password = registry user and key (NGC) for pulls."""
    return {
        "connection-type": "tao_docker",
        "hook-class-name": "airflow_provider_tao.hooks.docker.TAODockerHook",
        "hook-name": "TAO Docker",
        "conn-fields": {
            "registry": _field("Registry", "Registry the login/password are for, e.g. nvcr.io (empty: any image)."),
            "network": _field("Network", "Docker network of the jobs, created when missing (DOCKER_NETWORK)."),
            "auto_remove": _field(
                "Remove ended containers",
                "Remove a job's container once its result is read (DOCKER_AUTO_REMOVE; default: keep).",
                kind="boolean",
            ),
            "results_root": _field(
                "Results root",
                "Folder on the daemon's host mounted into every job at the same path: <root>/<job_id>.",
            ),
            "shm_size": _field("Shared memory", "Size of /dev/shm in each job (default 16g)."),
            "cancel_grace_seconds": _field(
                "Cancel grace (s)", "Seconds between SIGTERM and SIGKILL when a job is stopped (10).", kind="number"
            ),
            "tls_ca_cert": _field("TLS CA certificate", "Path of the CA certificate (tcp:// daemons with TLS)."),
            "tls_client_cert": _field("TLS client certificate", "Path of the client certificate."),
            "tls_client_key": _field("TLS client key", "Path of the client key."),
        },
        "ui-field-behaviour": {
            "hidden-fields": ["schema", "port", "extra"],
            "relabeling": {"host": "Docker daemon URL", "login": "Registry user", "password": "Registry key"},
            "placeholders": {
                "host": "unix:///var/run/docker.sock or tcp://gpu-box:2376",
                "login": "$oauthtoken",
                "registry": "nvcr.io",
                "network": "tao_default",
                "results_root": "/data/tao/results",
            },
        },
    }


def _kubernetes_connection_type() -> dict[str, Any]:
    """``tao_kubernetes``: the cluster as a ``kubernetes`` connection names it, plus the jobs' defaults."""
    return {
        "connection-type": "tao_kubernetes",
        "hook-class-name": "airflow_provider_tao.hooks.kubernetes.TAOKubernetesHook",
        "hook-name": "TAO Kubernetes",
        "conn-fields": {
            "namespace": _field("Namespace", "Namespace of the jobs (TAO_K8S_NAMESPACE; default 'default')."),
            "kube_config_path": _field("Kubeconfig path", "Path of a kubeconfig file on the Airflow hosts."),
            "kube_config": _field("Kubeconfig", "A kubeconfig itself (instead of a path).", secret=True),
            "in_cluster": _field("In cluster", "Use the service account of the pod Airflow runs in.", kind="boolean"),
            "cluster_context": _field("Context", "Kubeconfig context (default: the current one)."),
            "results_pvc": _field(
                "Results PVC", "PersistentVolumeClaim mounted at /results in every job (TAO_RESULTS_ROOT)."
            ),
            "service_account": _field("Service account", "Service account of the jobs' pods."),
            "image_pull_secret": _field("Image pull Secret", "An existing Secret for pulling the jobs' images."),
            "registry": _field("Registry", "Registry the password (NGC key) is for (default nvcr.io)."),
            "node_selector": _field(
                "Node selector", 'Default node selector, JSON: {"nvidia.com/gpu.product": "A100"}.'
            ),
            "tolerations": _field("Tolerations", 'Default tolerations, JSON: [{"key": "nvidia.com/gpu", ...}].'),
            "priority_class": _field("Priority class", "Default priorityClassName of the jobs."),
            "ttl_seconds_after_finished": _field(
                "TTL after finished (s)", "Seconds a finished Job is kept (default 86400).", kind="integer"
            ),
            "cancel_grace_seconds": _field(
                "Cancel grace (s)", "terminationGracePeriodSeconds of the jobs' pods (default 30).", kind="integer"
            ),
            "shm_size": _field("Shared memory", "Size of /dev/shm in each pod (default 16Gi)."),
        },
        "ui-field-behaviour": {
            "hidden-fields": ["host", "schema", "port", "extra"],
            "relabeling": {"login": "Registry user", "password": "NGC API key"},
            "placeholders": {"login": "$oauthtoken", "namespace": "default", "results_pvc": "tao-results"},
        },
    }


def _lepton_connection_type() -> dict[str, Any]:
    """``tao_lepton``: password = the Lepton API token; the workspace and the jobs' defaults in extras."""
    return {
        "connection-type": "tao_lepton",
        "hook-class-name": "airflow_provider_tao.hooks.lepton.LeptonHook",
        "hook-name": "TAO DGX Cloud Lepton",
        "conn-fields": {
            "workspace_id": _field("Workspace id", "The Lepton workspace the jobs run in (LEPTON_WORKSPACE_ID)."),
            "workspace_url": _field(
                "Workspace URL",
                "API URL of the workspace (LEPTON_WORKSPACE_URL); default the DGX Cloud gateway's "
                "https://gateway.dgxc-lepton.nvidia.com/api/v2/workspaces/<id>.",
            ),
            "node_group": _field("Node group", "Default dedicated node group of the jobs (name or id)."),
            "resource_shape": _field(
                "Resource shape",
                "Default resource shape (else chosen from the task's gpu_count), e.g. gpu.8xh100-80gb.",
            ),
            "image_pull_secret": _field("Image pull secret", "An existing Lepton image pull secret for the jobs."),
            "ngc_api_key": _field(
                "NGC API key",
                "Becomes a per-job image pull secret for the registry and the jobs' NGC_KEY (NGC_KEY).",
                secret=True,
            ),
            "hf_token": _field("Hugging Face token", "The jobs' HF_TOKEN, as a secret (HF_TOKEN).", secret=True),
            "registry": _field("Registry", "Registry the NGC key is for (default nvcr.io)."),
            "ttl_seconds_after_finished": _field(
                "TTL after finished (s)", "Seconds Lepton keeps a finished job (default 86400).", kind="integer"
            ),
            "capacity_timeout_seconds": _field(
                "Capacity timeout (s)",
                "A job queueing for capacity longer fails as ERR_CAPACITY and is deleted (default 900).",
                kind="integer",
            ),
            "start_timeout_seconds": _field(
                "Start timeout (s)",
                "Replicas not ready after this long (image pull, node fault) fail the job (default 600).",
                kind="integer",
            ),
            "staging_timeout_seconds": _field(
                "Staging timeout (s)",
                "How long large job files may take to stage onto the volume (600).",
                kind="integer",
            ),
            "shared_memory_size": _field(
                "Shared memory (MiB)",
                "/dev/shm of the jobs (default: half the shape's memory, at most 16384).",
                kind="integer",
            ),
        },
        "ui-field-behaviour": {
            "hidden-fields": ["host", "schema", "login", "port", "extra"],
            "relabeling": {"password": "API token"},
            "placeholders": {
                "workspace_id": "my-workspace",
                "node_group": "h100-pool",
                "resource_shape": "gpu.8xh100-80gb",
                "registry": "nvcr.io",
            },
        },
    }


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
                "python-modules": [
                    "airflow_provider_tao.hooks.base",
                    "airflow_provider_tao.hooks.local",
                    "airflow_provider_tao.hooks.slurm",
                    "airflow_provider_tao.hooks.brev",
                    "airflow_provider_tao.hooks.docker",
                    "airflow_provider_tao.hooks.kubernetes",
                    "airflow_provider_tao.hooks.lepton",
                ],
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
            },
            _slurm_connection_type(),
            _brev_connection_type(),
            _docker_connection_type(),
            _kubernetes_connection_type(),
            _lepton_connection_type(),
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
                    "outage_report_seconds": {
                        "description": "While a platform does not answer, the task log says so again every this many "
                        "seconds. An outage never fails a task: only its execution_timeout ends the wait.",
                        "version_added": "0.1.0",
                        "type": "float",
                        "example": "60",
                        "default": "300",
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
