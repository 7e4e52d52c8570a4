"""Sphinx extension of the provider's docs: tables generated from the code, so the docs cannot drift from it.

Directives:

* ``tao-connection-fields`` *conn_type*: the connection form of a platform (standard and extra fields).
* ``tao-connection-example`` *conn_type*: one connection of that type, as an ``AIRFLOW_CONN_*`` variable and as
  ``airflow connections add`` (:data:`CONNECTION_EXAMPLES`; a unit test checks every field is in the form).
* ``tao-config``: the ``[tao]`` section.
* ``tao-error-classes``: the failure classes, retriable or not, and what to do.
* ``tao-error-messages``: every error message the code can raise, with its fix (see :func:`message_sites`).

``tests/unit/test_docs.py`` uses :func:`message_sites` and :data:`FIXES` to keep the troubleshooting page complete.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "airflow_provider_tao"

#: Exception classes (and message helpers) whose messages people read, and how a site's fix is found.
MESSAGE_CALLS = {
    "JobValidationError",
    "JobSubmitError",
    "ConnectionProblem",
    "BrevError",
    "AirflowException",
    "AirflowFailException",
    "AirflowTaskTimeout",
    "SlurmTransportError",
    "ValueError",
    "ConfigError",
    "InfraError",
    "OSError",
    "ConnectionError",
    "LookupError",
    "UnknownVersionKeyError",
    "HTTPException",
    "_fail",
}

#: What to do about a connection test's failure, by its kind.
KIND_FIXES = {
    "unreachable": "Check the host / URL / port and that the service runs and is reachable from the Airflow hosts "
    "(a firewall, a VPN, a DNS name).",
    "auth": "Update the connection's credentials (user, key, password, token, TLS files, host key).",
    "not_found": "Create the missing namespace / partition, or fix its name in the connection.",
    "permission": "Grant the connection's identity the access it needs (RBAC role, docker group, folder rights).",
    "config": "Fill in or fix the connection field the message names.",
}

#: Fixes of the messages that do not carry their own: static fragment of the message -> what to do.
FIXES: dict[str, str] = {
    # TAOAutoMLOperator
    "Bad input, no trial was submitted": "Fix the parameter the message names (the search space, the metric, the "
    "algorithm's extra); nothing ran.",
    "The search's state is gone from the task's state store": "The task's state store was emptied while the search "
    "was deferred: clear the task to start a new search.",
    "The search ended without a completed trial": "Read the trials' rows in the task log: a program error, an OOM or "
    "a metric never reported (the log names the line forms the search reads); fix the trainer and run again.",
    "passed max_gpu_hours=": "The job used its GPU-hour budget (GPUs x hours run) and was canceled (ERR_BUDGET, "
    "not retried): raise max_gpu_hours, ask for fewer GPUs, or resume from the last checkpoint.",
    "The search passed the task's execution_timeout": "Raise execution_timeout, lower max_trials, or use a pruner "
    "that stops losing trials sooner; the best trial so far is in the message.",
    # airflow tao
    "is not a job id": "Copy the job id from `airflow tao jobs` or the task's XCom `job_id` (12 hex digits).",
    "in this Airflow's task records": "The job was not started by this Airflow (or its records were cleaned up): "
    "list the known jobs with `airflow tao jobs`.",
    "which cannot be read": "Make the connection again under the id the message names (`airflow connections add`, "
    "an `AIRFLOW_CONN_*` variable, or the UI), or install the extra it names.",
    "which this installation does not have": "Install the platform's extra "
    "(`pip install 'airflow-provider-tao[...]'`).",
    "matches several jobs": "Give more digits of the job id.",
    "no such job": "The job page of a task that never submitted a job, or of a DAG you may not read: open it from the "
    "task's 'TAO job' link.",
    # the job page's Cancel button
    "to protect the Cancel button with": "Set [api] secret_key (AIRFLOW__API__SECRET_KEY) on the API servers, the same "
    "on all of them, and restart them.",
    "so you may not cancel its jobs": "Ask for edit rights on the DAG (the auth manager's PUT on it), or ask someone "
    "who has them to cancel the job.",
    "did not come from this job's page": "Open the job's page again (its Cancel button carries a token of your login) "
    "and press Cancel; a form from another site cannot cancel jobs.",
    # settings
    "log_reads_per_interval must be a whole number": "Set `[tao] log_reads_per_interval` to a whole number (8 by "
    "default), e.g. `AIRFLOW__TAO__LOG_READS_PER_INTERVAL=20`, and restart the triggerer.",
    # operator
    "Bad input, nothing was submitted": "Fix the parameter the message names (see the table below); the task fails "
    "without retries because a retry would meet the same input.",
    "Bad input, nothing more was submitted": "A fallback connection of the chain rejected the job (the message names "
    "it and the parameter); fix that connection or its backend_details. The job that found no capacity was canceled.",
    "found no capacity, but another try owns it now": "A newer try of the task (a clear or a retry) took the job over "
    "while this one decided to move it; nothing to do: the newer try carries on with it.",
    "of an earlier try: {…}. The next try asks again.": "The platform did not answer whether the earlier try's job "
    "still runs (or whether its result was used); nothing was submitted, to avoid a duplicate, and the next try asks "
    "again. Restore the platform connection, or cancel the old job by hand.",
    "the next try decides again": "A fact the decision needs could not be read (a platform or the task state "
    "store did not answer): the task is retried and decides again with the facts still binding it -- see the "
    "decision table (docs/decisions.md). Restore the platform connection if it keeps happening.",
    "looks in a row could not read how": "An AutoML trial's job ended but the platform did not answer how (its "
    "marks or its failure analysis) five times in a row: the search's try failed for a retry, which continues the "
    "same search and decides the trial first. Restore the platform connection if it keeps happening.",
    "; the next try asks again": "The task's cancel record (`airflow tao cancel`) could not be read: nothing was "
    "submitted; the next try reads it again. Check the metadata database / state store.",
    "execution_timeout (or [tao] lease_hours)": "Raise the task's execution_timeout (or [tao] lease_hours), or resume "
    "from the last checkpoint.",
    "failed with": "Read the failure class in the message (table above) and the evidence lines in the task log.",
    "Job {…} failed: {…}": "The job failed but its platform gave no facts to classify: read the job's log "
    "(`airflow tao logs JOB`).",
    # platforms refusing a job
    "Docker refused container": "Read the daemon's reason: an unknown runtime, a bad mount or device, a name clash. "
    "Fix backend_details or the connection; the task is retried only when the class is retriable.",
    "did not start": "The container was created but could not start (a bad entrypoint, mount or device): fix the "
    "image or backend_details; nothing was left running.",
    "Check the image name and tag": "The message says it: check the image name and tag and the registry login.",
    "Kubernetes refused Job": "Read the API server's reason (quota, admission webhook, invalid field) and fix "
    "backend_details or the namespace's limits.",
    "could not be set up": "A Secret or ConfigMap of the Job was refused (too large, quota): nothing ran; fix the "
    "reason the message gives.",
    "its old Job did not go away": "A finished Job of the same task instance is still being deleted (finalizers): "
    "wait, or delete it with kubectl; the task's retry submits again.",
    "of its earlier Job still run past": "The earlier try's pod outlived its termination grace (a node that no "
    "longer answers keeps it Terminating): nothing of the new Job ran. Force-delete the pod (the message names it); "
    "the task's retry submits again.",
    # local
    "is not there (an unmounted or moved volume?)": "Mount the jobs folder again on the worker (or fix jobs_dir): the "
    "wait goes on while it is missing and picks the job up when it is back.",
    # slurm transport
    "cannot reach any login host": "Check the login hosts, port, network and credentials; the message lists each "
    "host's error.",
    "cannot reach the login node": "The triggerer lost SSH to the login node; it reconnects by itself. Check the "
    "network if it lasts.",
    "not reconnecting for another": "A reconnect just failed: the next one comes after a short back-off.",
    "cannot open a channel to": "The login node refused a new SSH session (MaxSessions?): it is retried on the next "
    "poll.",
    "command on": "The SSH connection broke during a command; it is retried on the next poll.",
    "command failed on the login node": "The SSH connection broke during a command; it is retried on the next poll.",
    "no answer from the requeue of Slurm job": "The requeue's output was lost (an SSH session dropped): the trigger "
    "reads the job again at its next poll and asks again while it is still failed (at most 3 times; the requeue count "
    "lives on the cluster, so it never requeues twice). Nothing to do unless the login node keeps refusing sessions.",
    "submitting job": "sbatch refused the job: read its message (partition, account, QOS, time limit) and fix the "
    "connection or backend_details.",
    "scancel": "scancel failed: the job may already have ended; check with squeue / sacct.",
    "sacct could not say what Slurm job": "Reattaching, Slurm's accounting did not answer (slurmdbd down?): this try "
    "ends without adopting or submitting anything; its retry asks again. Check slurmdbd.",
    "give the minutes between sweeps": "Give `--every` minutes above 0 (e.g. `airflow tao reap --every 5`).",
    "writing mark {…} of job": "The shared filesystem of the login node refused a write: check its space and "
    "permissions.",
    "unsupported host key type": "Give an ssh-ed25519, ecdsa-sha2-* or ssh-rsa host key (ssh-keyscan -t ed25519).",
    "bad mark": "Internal: a mark name or value the cluster's shell cannot keep. Please report it.",
    "unsafe sbatch value for": "Use plain characters in that backend_details value (no newline, no shell syntax).",
    "is not a relative path inside the job folder": "Use relative file names in the job's files.",
    # lepton
    "Lepton refused job": "Read Lepton's reason in the message: a 400 / 404 / 422 means a field of the job (shape, "
    "node group, mounts, image pull secret) is wrong -- fix backend_details or the connection (ERR_CONFIG, not "
    "retried); other refusals are retried.",
    "Lepton did not create job": "The workspace failed (5xx) or did not answer while the job was created, and no "
    "job of its name appeared: the task is retried (ERR_INFRA). If it repeats, check the workspace in the Lepton "
    "dashboard.",
    "its old job did not go away": "An ended job of the same task instance is still being deleted: the task's retry "
    "submits again; remove it by hand (`lep job remove --id <id>`) if it stays.",
    "could not write the job's files onto the shared volume": "A staging job failed: read its log in the Lepton "
    "console (storage permissions of the volume, a full volume), or keep the job's files under 1 MiB packed (large "
    "specs and inputs through S3).",
    "staging the job's files took more than": "The staging jobs waited for capacity on the node group: retry later, "
    "raise staging_timeout_seconds on the connection, or keep the job's files under 1 MiB packed.",
    # brev
    "no Brev API token": "Put the Brev API token in the password of the tao_brev connection.",
    "needs the id of its org": "A Brev API key (bak-...) works in one org: put its id in the tao_brev connection's "
    "org_id extra (`brev ls orgs --json` lists them), or use a token from `brev login` instead.",
    "set org_id on the tao_brev connection": "A Brev API key (bak-...) works in one org: put its id in the "
    "tao_brev connection's org_id extra (`brev ls orgs --json` lists them).",
    "there is no instance": "Create the instance (`brev create`) or fix backend_details['instance_id']: `brev ls` "
    "lists your instances (a teammate's only when the connection holds an API key of the org).",
    "is still STOPPING (boot_timeout_seconds)": "The reused instance did not finish stopping: check it in the Brev "
    "console (brev ls), then retry; a longer boot_timeout_seconds waits longer.",
    "could not list the org's instance types": "Nothing to fix: a Brev API outage; the task is retried (ERR_INFRA).",
    "on the tao_brev connection is not a file": "Install cloudflared (the cloudflared-linux-amd64 release brev "
    "names) at that path on every Airflow host, or remove cloudflared_path to let brev download it.",
    "a Brev or ssh outage": "Nothing to fix in the job: brev's ssh probe crashed on every try (an ssh failure "
    "without output); the task is retried. If it persists, check that the instance answers `brev exec`.",
    "it cannot run a job (brev ls)": "The reused instance is FAILURE or being deleted: name another instance_id, or "
    "drop it for an instance of the task's own.",
    "s after its delete": "Brev did not finish deleting the failed instance of an earlier try: the task's retry tries "
    "again; look at it with `brev ls`.",
    "disappeared while it was starting": "Brev lost the new instance while it booted (ERR_INFRA): the task is retried "
    "on a new one; if it repeats, try another instance type.",
    "instead of starting (brev ls)": "The new instance failed or stopped while it booted (ERR_INFRA): the task is "
    "retried on a new one; if it repeats, try another instance type.",
    "the type may be short of capacity": "ERR_CAPACITY (retried): wait, raise boot_timeout_seconds, or add types to "
    "the instance_type chain.",
    "is RUNNING but brev exec did not answer": "The instance's ssh never came up (ERR_INFRA): the task is retried on "
    "a fresh instance; try `brev shell <instance>` to see why.",
    "has no usable Docker": "Create instances in VM mode (`brev create`'s default): Docker and the NVIDIA Container "
    "Toolkit are preinstalled there. A reused instance needs Docker installed.",
    " failed at ": "The launch on the instance failed at the step the message names -- login: the NGC key "
    "(ERR_AUTH); create: the image (ERR_IMAGE_PULL) or backend_details (ERR_CONFIG); start: GPUs or mounts the "
    "instance lacks (ERR_CONFIG). Fix that; the task's own instance is deleted.",
    "launching job": "`brev exec` lost the connection during the launch (ERR_INFRA): the retry finds the launch if it "
    "went through, else launches again.",
    "did not answer the search for job": "`brev exec` to the instance failed (a flaky connection): the task cannot "
    "tell whether its job exists, so it submits nothing and is retried; check `brev shell <instance>` if it lasts.",
    "did not answer the stop of job": "`brev exec` to the reused instance failed while its job was stopped: cancel "
    "again (`airflow tao cancel JOB`) or stop it by hand (`brev exec <instance> 'docker stop tao-job-<id>'`).",
    "did not answer (reading marks)": "`brev exec` to the instance failed (a flaky connection): repeated on the next "
    "poll or try.",
    "did not answer (writing mark": "`brev exec` to the instance failed (a flaky connection): repeated on the next "
    "poll or try.",
    "are not Brev instance types": "Use types `brev search` lists, in instance_type on the connection or "
    "backend_details['instance_type'] (ERR_CONFIG, not retried).",
    "no capacity for any instance type of the chain": "ERR_CAPACITY (retried): wait, or add instance types to the "
    "chain.",
    "cannot select org": "Fix the connection's org: `brev ls orgs` lists the orgs of the token's account.",
    "selecting org {…} failed": "The Brev API did not answer while the org was selected (ERR_INFRA, retried); check "
    "the network and the Brev status page if it lasts.",
    "Install the brev CLI on the Airflow hosts": "Install the brev CLI on every Airflow host that runs tasks, "
    "triggers or the UI (the Test button), or set brev_path on the connection.",
    "printed no JSON object": "The brev CLI answered `ls --json` with something else: update the brev CLI on the "
    "Airflow hosts.",
    "Brev refused the token": "Put a valid Brev API token in the connection's password (create one in the Brev "
    "console); the provider logs the CLI in with it by itself.",
    "brev create failed": "Read the CLI's words in the message: a name or org problem is ERR_CONFIG (fix the "
    "connection), anything else ERR_INFRA (retried).",
    "deleting instance {…} failed": "`brev delete` failed: the instance may stay (and cost): delete it by hand "
    "(`brev delete <instance>`) or let `airflow tao reap` delete it when its lease expires.",
    "{…} failed: {…}": "A brev call failed (the CLI, the Brev API or the network; ERR_INFRA, retried): read the CLI's "
    "words in the message.",
    # images
    "expected a mapping with 'images:' and 'wheels:' trees": "Fix versions.yaml: it needs 'images:' and 'wheels:'.",
    "Use one of them, or give an absolute image URI": "The message lists the known keys: use one, or an image URI.",
    "image: empty image": "Give a versions.yaml key such as tao_toolkit.pyt or an image URI.",
}

#: Fixes by module (a path, or a folder ending in ``/``) and exception, for modules whose messages all follow one rule.
MODULE_FIXES: dict[tuple[str, str], str] = {
    ("runner/validation.py", "ValueError"): "The task fails before anything is submitted, with the parameter and the "
    "expected form in the message: fix that part of specs / args / inputs / outputs / command.",
    ("runner/job/", "ConfigError"): "The job itself reports ERR_CONFIG (not retried): fix the input, output, "
    "credentials or spec the message names.",
    ("runner/job/", "ValueError"): "The job itself reports ERR_CONFIG (not retried): fix the spec or URI the message "
    "names.",
    ("runner/job/", "InfraError"): "The job itself reports ERR_INFRA (retried): storage or network trouble; if it "
    "repeats, check the storage endpoint and credentials.",
    ("runner/job/", "OSError"): "A short read from storage: the job reports ERR_INFRA and is retried.",
    ("decorators/job_main.py", "_fail"): "@task.tao: ERR_PROGRAM is the function's own exception (its traceback is "
    "in the task log); ERR_CONFIG names what the job's Python lacks (a module, the worker's Python version for "
    "cloudpickle/dill): install it in the image or set python_command= (not retried).",
    ("decorators/payload.py", "ValueError"): "@task.tao: pass plain, small arguments (data as inputs=), or "
    "serializer='cloudpickle' / 'dill' for richer objects (see the TaskFlow how-to).",
    ("decorators/tao.py", "AirflowFailException"): "@task.tao: return plain values, install the module on the "
    "workers, or give the task a results_uri the worker reads (S3 with storage_conn_id).",
}


@dataclass(frozen=True)
class MessageSite:
    """One place in the code that raises (or returns) an error message.

    :param module: the module's path under ``airflow_provider_tao``.
    :param line: the line number.
    :param kind: the exception class (or helper) name.
    :param message: the message with its run-time parts as ``{...}``.
    :param parameter: for ``JobValidationError``, the parameter it names.
    :param fix: the fix the site itself states (``JobValidationError``'s third argument), else "".
    :param problem_kind: for ``ConnectionProblem``, its kind.
    """

    module: str
    line: int
    kind: str
    message: str
    parameter: str = ""
    fix: str = ""
    problem_kind: str = ""

    @property
    def key(self) -> str:
        """The longest static part of the message: how the page and :data:`FIXES` find it."""
        parts = [p.strip(" :.;,'\"") for p in re.split(r"\{[^}]*\}", self.message)]
        return max(parts, key=len) if parts else ""


def _template(node: ast.AST | None) -> str:
    """A message expression as text, run-time parts as ``{...}``."""
    if node is None:
        return ""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(_template(v) if isinstance(v, ast.Constant) else "{…}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _template(node.left) + _template(node.right)
    if isinstance(node, ast.IfExp):
        return _template(node.body)
    return "{…}"


def message_sites() -> list[MessageSite]:
    """Every construction of a message-carrying exception in the package, with a message."""
    sites = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name not in MESSAGE_CALLS or not node.args:
                continue
            module = str(path.relative_to(PACKAGE))
            args = node.args
            if name == "JobValidationError" and len(args) == 3:
                site = MessageSite(
                    module, node.lineno, name, _template(args[1]), _template(args[0]), _template(args[2])
                )
            elif name == "ConnectionProblem" and len(args) == 2:
                site = MessageSite(module, node.lineno, name, _template(args[1]), problem_kind=_template(args[0]))
            elif name in ("JobSubmitError", "HTTPException", "BrevError") and len(args) >= 2:
                site = MessageSite(module, node.lineno, name, _template(args[1]))
            else:
                site = MessageSite(module, node.lineno, name, _template(args[0]))
            if site.message.strip("{…} ") and site.key:
                sites.append(site)
    return sites


def fix_of(site: MessageSite) -> str:
    """What to do about ``site``'s message ("" = not documented: the test fails)."""
    if site.fix:
        return site.fix
    if site.kind == "ConnectionProblem":
        return KIND_FIXES.get(site.problem_kind, "")
    for (module, kind), fix in MODULE_FIXES.items():
        if site.kind == kind and (site.module == module or (module.endswith("/") and site.module.startswith(module))):
            return fix
    for fragment, fix in FIXES.items():
        if fragment in site.message:
            return fix
    return ""


# ----------------------------------------------------------------------------- rendering (markdown tables)


def _cell(text: str) -> str:
    """Text for a Markdown table cell: no pipe, newline, backtick or HTML tag (``<root>`` is text here)."""
    text = text.replace("|", "\\|").replace("\n", " ").replace("`", "'")
    return text.replace("<", "&lt;").replace(">", "&gt;")


def connection_fields_table(conn_type: str) -> str:
    from airflow_provider_tao.get_provider_info import CONNECTION_FORMS

    form = CONNECTION_FORMS[conn_type]()
    behaviour = form["ui-field-behaviour"]
    rows = ["| Field | Label in the form | Type | Help | Example |", "|---|---|---|---|---|"]
    for name in ("host", "login", "password", "port", "schema"):
        if name in behaviour["hidden-fields"]:
            continue
        label = behaviour["relabeling"].get(name, name.capitalize())
        rows.append(f"| `{name}` (standard) | {_cell(label)} | | | {_cell(behaviour['placeholders'].get(name, ''))} |")
    for name, field in form["conn-fields"].items():
        schema = field["schema"]
        kind = schema["type"][0] + (" (secret)" if schema.get("format") == "password" else "")
        example = ", ".join(str(e) for e in schema.get("examples", []))
        rows.append(
            f"| `{name}` | {_cell(field['label'])} | {kind} | {_cell(field['description'])} | {_cell(example)} |"
        )
    hidden = ", ".join(f"`{h}`" for h in behaviour["hidden-fields"])
    return "\n".join(rows) + f"\n\nHidden standard fields: {hidden}.\n"


#: A typical connection of each type (its id is the hook's default): standard fields, then the extras.
CONNECTION_EXAMPLES: dict[str, dict[str, Any]] = {
    "tao_local": {"extra": {"jobs_dir": "/data/tao/jobs", "results_root": "/data/tao/results"}},
    "tao_slurm": {
        "host": "login1.cluster.example.com,login2.cluster.example.com",
        "port": 22,
        "login": "jdoe",
        "extra": {
            "key_file": "/home/airflow/.ssh/id_ed25519",
            "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB...",
            "partition": "batch",
            "account": "ml-research",
            "results_root": "/lustre/fsw/ml-research/jdoe/tao",
        },
    },
    "tao_docker": {
        "host": "unix:///var/run/docker.sock",
        "login": "$oauthtoken",
        "password": "<NGC API key>",
        "extra": {"registry": "nvcr.io", "results_root": "/data/tao/results"},
    },
    "tao_kubernetes": {
        "login": "$oauthtoken",
        "password": "<NGC API key>",
        "extra": {
            "namespace": "ml-training",
            "kube_config_path": "/home/airflow/.kube/config",
            "results_pvc": "tao-results",
        },
    },
    "tao_lepton": {
        "password": "<Lepton API token>",
        "extra": {"workspace_id": "tao-research", "node_group": "h100-pool", "ngc_api_key": "<NGC API key>"},
    },
    "tao_brev": {
        "password": "<Brev API token>",
        "extra": {"org": "ml-research", "instance_type": "g5.xlarge,g6.xlarge", "ngc_api_key": "<NGC API key>"},
    },
}


def connection_example(conn_type: str) -> str:
    """One connection of ``conn_type`` as an ``AIRFLOW_CONN_*`` JSON variable and as ``airflow connections add``."""
    import json
    import shlex

    from airflow_provider_tao.hooks import hook_class, platform_for_conn_type

    platform = platform_for_conn_type(conn_type)
    assert platform is not None, conn_type
    conn_id = hook_class(platform).default_conn_name
    fields = CONNECTION_EXAMPLES[conn_type]
    as_json = json.dumps({"conn_type": conn_type, **fields})
    options = [("--conn-type", conn_type)]
    options += [
        (f"--conn-{name}", str(fields[name])) for name in ("host", "port", "login", "password") if name in fields
    ]
    options.append(("--conn-extra", json.dumps(fields["extra"])))
    lines = [f"airflow connections add {conn_id}"] + [f"    {flag} {shlex.quote(value)}" for flag, value in options]
    add = " \\\n".join(lines)
    return (
        f"As an environment variable of every Airflow process (JSON), or saved in the metadata database; "
        f"`{conn_id}` is the connection the platform's hook uses by default.\n\n"
        f"```bash\nexport AIRFLOW_CONN_{conn_id.upper()}={shlex.quote(as_json)}\n\n{add}\n```\n"
    )


def config_table() -> str:
    from airflow_provider_tao.settings import OPTIONS, config_section

    declared = config_section()["tao"]["options"]
    rows = ["| Option | Type | Default | Example | What it does |", "|---|---|---|---|---|"]
    for name, (kind, default, description) in OPTIONS.items():
        example = declared[name]["example"] or ""
        shown = default if default is not None else "(unset)"
        rows.append(f"| `{name}` | {kind} | {shown} | {example} | {_cell(description)} |")
    return "\n".join(rows) + "\n"


def error_classes_table() -> str:
    from airflow_provider_tao.failures import SUGGESTIONS
    from airflow_provider_tao.jobs import ErrClass

    rows = ["| Class | Retried by Airflow | What to do |", "|---|---|---|"]
    for err_class in ErrClass:
        rows.append(
            f"| `{err_class.value}` | {'yes' if err_class.retriable else 'no'} | {_cell(SUGGESTIONS[err_class])} |"
        )
    return "\n".join(rows) + "\n"


def error_messages_table() -> str:
    rows = ["| Message | Raised by | Fix |", "|---|---|---|"]
    seen = set()
    for site in message_sites():
        key = (site.message, fix_of(site))
        if key in seen:
            continue
        seen.add(key)
        # the module as code (``hooks/__init__.py`` must not read as bold "init"); the rest as text
        where = f"`{site.module}` " + _cell(f"({site.kind}{', ' + site.parameter if site.parameter else ''})")
        rows.append(f"| {_cell(site.message)} | {where} | {_cell(fix_of(site))} |")
    return "\n".join(rows) + "\n"


# ----------------------------------------------------------------------------- Sphinx glue


def setup(app: Any) -> dict[str, Any]:
    from docutils import nodes
    from docutils.parsers.rst import Directive, directives
    from docutils.statemachine import StringList

    def markdown_directive(render: Any, with_argument: bool) -> type[Directive]:
        class Generated(Directive):
            required_arguments = 1 if with_argument else 0
            has_content = False

            def run(self) -> list[Any]:
                container = nodes.container()
                lines = render(*self.arguments).splitlines()  # MyST parses it: a Markdown pipe table
                self.state.nested_parse(StringList(lines, source="generated"), self.content_offset, container)
                return list(container.children)

        return Generated

    directives.register_directive("tao-connection-fields", markdown_directive(connection_fields_table, True))
    directives.register_directive("tao-connection-example", markdown_directive(connection_example, True))
    directives.register_directive("tao-config", markdown_directive(config_table, False))
    directives.register_directive("tao-error-classes", markdown_directive(error_classes_table, False))
    directives.register_directive("tao-error-messages", markdown_directive(error_messages_table, False))
    return {"version": "1", "parallel_read_safe": True}
