"""Provider metadata read by Airflow's ProvidersManager (entry point ``apache_airflow_provider``).

Kept light: every Airflow process reads it, so it imports no hook, no SDK and no ``airflow`` module. The connection
forms are declared here (Airflow >= 3.2 renders ``conn-fields`` / ``ui-field-behaviour`` without importing the hook)
and listed in the order of the platform registry (:data:`airflow_provider_tao.hooks.PLATFORMS`): a platform appears
in the UI by having an entry in :data:`CONNECTION_FORMS` under its connection type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_provider_tao.hooks import PLATFORMS
from airflow_provider_tao.settings import config_section

INTEGRATION = "NVIDIA TAO"
#: The Airflow plugin of the provider: the "TAO jobs" view and the job pages (see ``airflow_provider_tao.plugins``).
PLUGIN_CLASS = "airflow_provider_tao.plugins.plugin.TAOPlugin"


def _field(
    label: str, description: str, *, kind: str = "string", secret: bool = False, default: Any = None
) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": [kind, "null"]}
    if secret:
        schema["format"] = "password"
    if default is not None:
        schema["default"] = default
    return {"label": label, "description": description, "schema": schema}


#: The standard fields of a connection form (the rest of a form's examples are its extra fields').
STANDARD_FIELDS = ("description", "host", "schema", "login", "password", "port")


def _form(
    hook_name: str,
    fields: dict[str, dict[str, Any]],
    *,
    hidden: list[str],
    relabeling: dict[str, str],
    examples: dict[str, str],
) -> dict[str, Any]:
    """A connection form. ``examples`` are real values: a standard field shows its example as the input's placeholder,
    an extra field offers it as a suggestion (``schema.examples``: the UI renders extra fields from their schema)."""
    for name, example in examples.items():
        if name in fields:
            kind = fields[name]["schema"]["type"][0]
            fields[name]["schema"]["examples"] = [{"integer": int, "number": float}.get(kind, str)(example)]
    return {
        "hook-name": hook_name,
        "conn-fields": fields,
        "ui-field-behaviour": {
            "hidden-fields": hidden,
            "relabeling": relabeling,
            "placeholders": {k: v for k, v in examples.items() if k in STANDARD_FIELDS},
        },
    }


def _local_form() -> dict[str, Any]:
    """``tao_local``: nothing to connect to; only where jobs and results live on the worker host."""
    return _form(
        "TAO local",
        {
            "jobs_dir": _field(
                "Jobs folder",
                "Folder on the worker host for job folders (log, exit code, marks). "
                "Default: [tao] local_jobs_dir, else $AIRFLOW_HOME/tao/jobs.",
            ),
            "results_root": _field(
                "Results root",
                "Folder on the worker host where a job's results land as <results root>/<job id>. "
                "Default: [tao] local_results_root, else $AIRFLOW_HOME/tao/results.",
            ),
            "cancel_grace_seconds": _field(
                "Cancel grace (seconds)",
                "Seconds between SIGTERM and SIGKILL when a job is canceled (default 10).",
                kind="number",
            ),
        },
        hidden=["host", "schema", "login", "password", "port", "extra"],
        relabeling={},
        examples={
            "jobs_dir": "/var/lib/airflow/tao/jobs",
            "results_root": "/data/tao/results",
            "cancel_grace_seconds": "10",
        },
    )


def _slurm_form() -> dict[str, Any]:
    """``tao_slurm``: host = login host(s), comma-separated for failover; login; port; key or password."""
    return _form(
        "TAO SLURM",
        {
            "key_file": _field(
                "Private key file", "Path of the SSH private key on the Airflow hosts (env SSH_KEY_PATH)."
            ),
            "private_key": _field("Private key", "The SSH private key itself, instead of a key file.", secret=True),
            "private_key_passphrase": _field("Key passphrase", "Passphrase of the private key, if any.", secret=True),
            "host_key": _field(
                "Host key",
                "The login node's public host key, checked on every connection (ssh-keyscan -t ed25519 <host>).",
            ),
            "no_host_key_check": _field(
                "Skip host key check",
                "Disable host key checking (not recommended; exclusive with Host key).",
                kind="boolean",
            ),
            "partition": _field(
                "Partition(s)", "Partitions for sbatch, comma-separated; a job may override (env SLURM_PARTITION)."
            ),
            "account": _field("Account", "Account charged with #SBATCH --account (env SLURM_ACCOUNT)."),
            "results_root": _field(
                "Results root",
                "Shared-filesystem folder of job folders and results: <root>/jobs/<id>, <root>/results/<id> "
                "(env SLURM_BASE_RESULTS_DIR). Required.",
            ),
            "container_runtime": _field(
                "Container runtime", "pyxis (default: srun --container-image), oci (Slurm --container) or none."
            ),
            "oci_bundle": _field("OCI bundle", "Default OCI bundle folder on the cluster (container runtime oci)."),
            "container_mounts": _field("Container mounts", "Pyxis --container-mounts (default /lustre)."),
            "sqsh_cache_dir": _field(
                "Squashfs cache", "Folder of converted .sqsh images on the cluster (pyxis; default <root>/sqsh)."
            ),
            "time_hours": _field("Wall time (hours)", "Default --time of a job (4).", kind="number"),
            "timeout_hours": _field(
                "Inner timeout (hours)",
                "The command is stopped after this long, leaving time to save (default: wall time - 0.2).",
                kind="number",
            ),
            "max_time_hours": _field(
                "Max wall time (hours)",
                "Longer requests are rejected before submission (4); the partition's MaxTime.",
                kind="number",
            ),
            "gpus_per_node": _field("GPUs per node", "GPUs of one node (8); 0 for a CPU-only cluster.", kind="integer"),
            "cpus_per_task": _field("CPUs per task", "--cpus-per-task of the one task per node (16).", kind="integer"),
            "max_resubmits": _field(
                "Max resubmissions", "Requeues of a job after an infrastructure failure (3).", kind="integer"
            ),
        },
        hidden=["schema", "extra"],
        relabeling={"host": "Login host(s)", "login": "User", "password": "Password (prefer a key)"},
        examples={
            "host": "login1.cluster.example.com,login2.cluster.example.com",
            "port": "22",
            "login": "jdoe",
            "key_file": "/home/airflow/.ssh/id_ed25519",
            "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI...",
            "partition": "batch,batch_short",
            "account": "ml-research",
            "results_root": "/lustre/fsw/ml-research/jdoe/tao",
            "container_runtime": "pyxis",
            "container_mounts": "/lustre",
            "oci_bundle": "/lustre/fsw/ml-research/bundles/tao-pyt",
            "sqsh_cache_dir": "/lustre/fsw/ml-research/jdoe/tao/sqsh",
            "time_hours": "4",
            "timeout_hours": "3.8",
            "max_resubmits": "3",
            "max_time_hours": "4",
            "gpus_per_node": "8",
            "cpus_per_task": "16",
        },
    )


def _docker_form() -> dict[str, Any]:
    """``tao_docker``: host = daemon URL; login/password = registry user and key (NGC) for pulls."""
    return _form(
        "TAO Docker",
        {
            "registry": _field(
                "Registry", "Registry the user and key are for, e.g. nvcr.io (empty: used for any image)."
            ),
            "network": _field(
                "Network", "Docker network of the jobs, created when missing (env DOCKER_NETWORK; tao_default)."
            ),
            "auto_remove": _field(
                "Remove ended containers",
                "Remove a job's container once its result is read (env DOCKER_AUTO_REMOVE; default: keep).",
                kind="boolean",
            ),
            "results_root": _field(
                "Results root",
                "Folder on the daemon's host, mounted into every job at the same path: results in <root>/<job id>.",
            ),
            "shm_size": _field("Shared memory", "Size of /dev/shm in each job (16g)."),
            "cancel_grace_seconds": _field(
                "Cancel grace (seconds)",
                "Seconds between SIGTERM and SIGKILL when a job is stopped (10).",
                kind="number",
            ),
            "tls_ca_cert": _field("TLS CA certificate", "Path of the CA certificate (tcp:// daemon with TLS)."),
            "tls_client_cert": _field("TLS client certificate", "Path of the client certificate."),
            "tls_client_key": _field("TLS client key", "Path of the client key."),
        },
        hidden=["schema", "port", "extra"],
        relabeling={"host": "Docker daemon URL", "login": "Registry user", "password": "Registry key"},
        examples={
            "host": "unix:///var/run/docker.sock or tcp://gpu-box.example.com:2376",
            "login": "$oauthtoken",
            "password": "NGC API key",
            "registry": "nvcr.io",
            "network": "tao_default",
            "results_root": "/data/tao/results",
            "shm_size": "16g",
            "cancel_grace_seconds": "10",
            "tls_ca_cert": "/etc/docker/certs/ca.pem",
            "tls_client_cert": "/etc/docker/certs/cert.pem",
            "tls_client_key": "/etc/docker/certs/key.pem",
        },
    )


def _kubernetes_form() -> dict[str, Any]:
    """``tao_kubernetes``: the cluster as a ``kubernetes`` connection names it, plus the jobs' defaults."""
    return _form(
        "TAO Kubernetes",
        {
            "namespace": _field("Namespace", "Namespace of the jobs (default: default; env TAO_K8S_NAMESPACE)."),
            "kube_config_path": _field("Kubeconfig path", "Path of a kubeconfig file on the Airflow hosts."),
            "kube_config": _field("Kubeconfig", "A kubeconfig itself (YAML or JSON), instead of a path.", secret=True),
            "in_cluster": _field("In cluster", "Use the service account of the pod Airflow runs in.", kind="boolean"),
            "cluster_context": _field("Context", "Kubeconfig context (default: the current one)."),
            "results_pvc": _field(
                "Results PVC",
                "PersistentVolumeClaim mounted at /results in every job (TAO_RESULTS_ROOT); without one, "
                "outputs go to S3.",
            ),
            "dashboard_url": _field(
                "Dashboard URL",
                "Link of a job in your Kubernetes console; {namespace} and {name} are filled in. "
                "Empty: the job link opens the provider's job page in Airflow.",
            ),
            "service_account": _field("Service account", "Service account of the jobs' pods."),
            "image_pull_secret": _field("Image pull Secret", "Name of an existing Secret for pulling the images."),
            "registry": _field("Registry", "Registry the password (NGC key) is for (nvcr.io)."),
            "node_selector": _field("Node selector", "Default node selector of the jobs, as JSON."),
            "tolerations": _field("Tolerations", "Default tolerations of the jobs, as a JSON list."),
            "priority_class": _field("Priority class", "Default priorityClassName of the jobs."),
            "ttl_seconds_after_finished": _field(
                "TTL after finished (seconds)", "Seconds a finished Job is kept (86400).", kind="integer"
            ),
            "cancel_grace_seconds": _field(
                "Cancel grace (seconds)", "terminationGracePeriodSeconds of the jobs' pods (30).", kind="integer"
            ),
            "shm_size": _field("Shared memory", "Size of /dev/shm in each pod (16Gi)."),
        },
        hidden=["host", "schema", "port", "extra"],
        relabeling={"login": "Registry user", "password": "NGC API key"},
        examples={
            "login": "$oauthtoken",
            "namespace": "ml-training",
            "kube_config_path": "/home/airflow/.kube/config",
            "cluster_context": "gpu-cluster",
            "results_pvc": "tao-results",
            "dashboard_url": "https://dashboard.example.com/#/job/{namespace}/{name}",
            "service_account": "tao-jobs",
            "image_pull_secret": "ngc-pull",
            "registry": "nvcr.io",
            "node_selector": '{"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}',
            "tolerations": '[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]',
            "priority_class": "training",
            "ttl_seconds_after_finished": "86400",
            "cancel_grace_seconds": "30",
            "shm_size": "16Gi",
        },
    )


def _lepton_form() -> dict[str, Any]:
    """``tao_lepton``: password = the Lepton API token; the workspace and the jobs' defaults in extras."""
    return _form(
        "TAO DGX Cloud Lepton",
        {
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
        hidden=["host", "schema", "login", "port", "extra"],
        relabeling={"password": "API token"},
        examples={
            "workspace_id": "tao-research",
            "workspace_url": "https://gateway.dgxc-lepton.nvidia.com/api/v2/workspaces/tao-research",
            "node_group": "h100-pool",
            "resource_shape": "gpu.8xh100-80gb",
            "image_pull_secret": "ngc-pull",
            "registry": "nvcr.io",
            "ttl_seconds_after_finished": "86400",
            "capacity_timeout_seconds": "900",
            "start_timeout_seconds": "600",
            "staging_timeout_seconds": "600",
            "shared_memory_size": "16384",
        },
    )


def _brev_form() -> dict[str, Any]:
    """``tao_brev``: password = the Brev API token; the CLI, the org and the instances this provider creates."""
    return _form(
        "TAO Brev",
        {
            "brev_path": _field(
                "brev CLI", "Path of the brev executable on the Airflow hosts (default: brev on PATH)."
            ),
            "cloudflared_path": _field(
                "cloudflared",
                "A cloudflared executable for brev (workers without internet; default: the one brev downloads once).",
            ),
            "org": _field("Org", "The Brev org to work in (default: the account's)."),
            "org_id": _field(
                "Org id (API key)", "With a Brev API key (bak-...) as the token: the id of its org (brev ls orgs)."
            ),
            "instance_type": _field(
                "Instance types",
                "Fallback chain of the instances this provider creates, e.g. 'g5.xlarge,g6.xlarge' (default: the "
                "CLI's own choice). A job's backend_details['instance_type'] wins.",
            ),
            "lease_hours": _field(
                "Lease (h)",
                "An instance this provider creates is deleted by the reaper (airflow tao reap) this long after its "
                "creation; a job's backend_details['lease_hours'] wins (default: [tao] lease_hours when set, else 8).",
                kind="number",
            ),
            "console_url": _field(
                "Console instance page",
                "Link of an instance in the Brev console, opened by the task's TAO job link; {id} and {name} are "
                "filled in (default https://brev.nvidia.com/environment/{id}).",
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
        hidden=["host", "schema", "login", "port", "extra"],
        relabeling={"password": "Brev API token or key"},
        examples={
            "brev_path": "/usr/local/bin/brev",
            "cloudflared_path": "/usr/local/bin/cloudflared",
            "org": "ml-research",
            "org_id": "ejmrvoj8m",
            "instance_type": "g5.xlarge,g6.xlarge",
            "lease_hours": "8",
            "console_url": "https://brev.nvidia.com/environment/{id}",
            "registry": "nvcr.io",
            "network": "host",
            "shm_size": "16g",
            "cancel_grace_seconds": "10",
            "boot_timeout_seconds": "1200",
            "launch_timeout_seconds": "1800",
        },
    )


#: connection type -> its UI entry (``hook-name``, ``conn-fields``, ``ui-field-behaviour``). A new platform adds its
#: entry here; ``hook-name`` must equal the hook class's ``hook_name``.
CONNECTION_FORMS: dict[str, Callable[[], dict[str, Any]]] = {
    "tao_local": _local_form,
    "tao_slurm": _slurm_form,
    "tao_docker": _docker_form,
    "tao_kubernetes": _kubernetes_form,
    "tao_lepton": _lepton_form,
    "tao_brev": _brev_form,
}


def connection_types() -> list[dict[str, Any]]:
    """One ``connection-types`` entry per registered platform, in registry order."""
    entries = []
    for conn_type, class_path in PLATFORMS.values():
        entries.append(
            {
                "connection-type": conn_type,
                "hook-class-name": class_path,
                **CONNECTION_FORMS[conn_type](),
            }
        )
    return entries


def get_provider_info() -> dict[str, Any]:
    """The provider's metadata: connection types with their forms, hooks, triggers, links, config, CLI, plugin."""
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
                    # each platform package defines its hook class in ``hook.py`` and exports it
                    *(f"{class_path.rpartition('.')[0]}.hook" for _, class_path in PLATFORMS.values()),
                ],
            }
        ],
        "triggers": [{"integration-name": INTEGRATION, "python-modules": ["airflow_provider_tao.triggers.job"]}],
        "extra-links": ["airflow_provider_tao.links.TAOJobLink", "airflow_provider_tao.links.TAOResultsLink"],
        "task-decorators": [{"class-name": "airflow_provider_tao.decorators.tao.tao_task", "name": "tao"}],
        "connection-types": connection_types(),
        "config": config_section(),
        "cli": ["airflow_provider_tao.cli.definition.get_tao_cli_commands"],
        "plugins": [{"name": "tao", "plugin-class": PLUGIN_CLASS}],
    }
