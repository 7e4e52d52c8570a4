"""The ``airflow tao`` command group's arguments; the commands themselves load lazily from ``commands.py``."""

from __future__ import annotations

from airflow.cli.cli_config import ARG_OUTPUT, ARG_VERBOSE, ActionCommand, Arg, GroupCommand, lazy_load_command

_COMMANDS = "airflow_provider_tao.cli.commands"

ARG_JOB_ID = Arg(("job_id",), help="The job's id (TAO_JOB_ID, the task's XCom job_id), or a unique prefix of 6+ chars")
ARG_DAG_ID = Arg(("-d", "--dag-id"), help="Only jobs of this DAG")
ARG_RUN_ID = Arg(("-r", "--run-id"), help="Only jobs of this DAG run")
ARG_PLATFORM = Arg(("-p", "--platform"), help="Only jobs on this platform (local, slurm, docker, kubernetes, ...)")
ARG_STATE = Arg(
    ("-s", "--state"), help="Only jobs in this state (Running, Complete, Error, Canceled, Unknown; any case)"
)
ARG_LIMIT = Arg(("--limit",), type=int, default=100, help="At most this many jobs, newest first (default 100)")
ARG_TAIL = Arg(("--tail",), type=int, default=None, help="Only the last N lines of the log")
ARG_DRY_RUN = Arg(("--dry-run",), action="store_true", help="Say what would be canceled; cancel nothing")
ARG_MIN_AGE = Arg(
    ("--min-age-minutes",),
    type=float,
    default=0.0,
    help="Leave jobs younger than this alone (default 0: a job is recorded before its task can end, so even a young "
    "orphan is judged right; a job no task recorded is never canceled)",
)
ARG_EVERY = Arg(
    ("--every",),
    type=float,
    default=None,
    metavar="MINUTES",
    help="Sweep again every MINUTES, for ever (run it as a service beside the scheduler, e.g. a docker-compose service "
    "or a Kubernetes sidecar: the sweep needs the metadata database, which task code must not have)",
)

TAO_COMMANDS = (
    ActionCommand(
        name="jobs",
        help="List the jobs this provider started, across connections, with their task and GPU-hours",
        func=lazy_load_command(f"{_COMMANDS}.list_jobs"),
        args=(ARG_DAG_ID, ARG_RUN_ID, ARG_PLATFORM, ARG_STATE, ARG_LIMIT, ARG_OUTPUT, ARG_VERBOSE),
    ),
    ActionCommand(
        name="logs",
        help="Print a job's log, read from its platform",
        func=lazy_load_command(f"{_COMMANDS}.job_logs"),
        args=(ARG_JOB_ID, ARG_TAIL, ARG_OUTPUT, ARG_VERBOSE),
    ),
    ActionCommand(
        name="cancel",
        help="Cancel a job on its platform; its task fails with ERR_CANCELED and is not retried",
        func=lazy_load_command(f"{_COMMANDS}.cancel_job"),
        args=(ARG_JOB_ID, ARG_OUTPUT, ARG_VERBOSE),
    ),
    ActionCommand(
        name="reap",
        help="The orphan sweeper: cancel jobs no task watches any more (orphans) and jobs past their lease, and delete "
        "the machines a platform rents for them (Brev instances) whose lease expired or whose task ended, on every "
        "connection in use; every decision is listed with its reason",
        func=lazy_load_command(f"{_COMMANDS}.reap"),
        args=(ARG_DRY_RUN, ARG_MIN_AGE, ARG_EVERY, ARG_OUTPUT, ARG_VERBOSE),
    ),
)


def get_tao_cli_commands() -> list[GroupCommand]:
    """The ``cli`` entry of the provider info."""
    return [GroupCommand(name="tao", help="NVIDIA TAO jobs: list, logs, cancel, reap", subcommands=TAO_COMMANDS)]
