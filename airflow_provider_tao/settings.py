"""The ``[tao]`` section of Airflow's configuration: every option the provider reads, in one place.

Each option is declared (description, type, default) in :mod:`airflow_provider_tao.get_provider_info` and read here
with the same default, so ``airflow config get-value tao <option>`` and the code always agree. The operator reads them
when a task runs (not at DAG parse), so a changed setting applies to the next task without re-parsing DAGs.
"""

from __future__ import annotations

from typing import Any

SECTION = "tao"

#: option -> (type, default as Airflow stores it, description). ``get_provider_info`` declares exactly these.
OPTIONS: dict[str, tuple[str, str | None, str]] = {
    "default_poll_interval": (
        "float",
        "10",
        "Seconds between status polls of a watched job, for tasks that do not set poll_interval.",
    ),
    "default_storage_conn_id": (
        "string",
        None,
        "An aws connection used for S3 staging by tasks that move data (specs, args, inputs, outputs or an s3:// "
        "results_uri) without a storage_conn_id of their own.",
    ),
    "default_results_uri": (
        "string",
        None,
        "Results root (absolute path or s3:// URI) of tasks that do not set results_uri; a job's results land in "
        "<root>/<job_id>. Unset: each platform's own default (its connection's results_root).",
    ),
    "stream_logs": (
        "boolean",
        "True",
        "Copy each job's new log lines into its task log while the task waits, for tasks that do not set stream_logs.",
    ),
    "log_reads_per_interval": (
        "integer",
        "8",
        "Log reads per poll interval per connection on the platforms without a batched log read (docker, kubernetes, "
        "lepton): so many jobs' logs are read per interval, those that printed lately first, quiet ones less often "
        "(down to once a minute), and every job's log in full at its end. SLURM, Brev and local read every watched "
        "log in their one status call and ignore it.",
    ),
    "lease_hours": (
        "float",
        "0",
        "Longest a job may run when its task sets no execution_timeout: the watch cancels it after this many hours "
        "(like an execution_timeout), and `airflow tao reap` stops any job of this provider older than this whose "
        "task no longer watches it. 0 = no lease. Brev instances take it as their lease when neither the job nor the "
        "connection sets lease_hours (a rented machine always has one: 8 h when this is 0).",
    ),
    "outage_report_seconds": (
        "float",
        "300",
        "While a platform does not answer, or a job waits (pending) with the platform's reason, the task log says so "
        "again every this many seconds. An outage never fails a task: only its execution_timeout ends the wait.",
    ),
    "trigger_event_hold_seconds": (
        "float",
        "10",
        "A trigger reports a job's end no sooner than this many seconds after it started watching: Airflow 3.2-3.3's "
        "scheduler can fail a task whose trigger fires while the executor's report of the deferral is still on its "
        "way (apache/airflow#67287, #71580: 'finished with state success, but the task instance's state attribute "
        "is queued'). 0 turns the hold off.",
    ),
    "freeze_triggerer_heap": (
        "boolean",
        "True",
        "At the first TAO trigger a triggerer process runs, move the objects alive then (its imported modules and "
        "Airflow's own state, which live as long as the process) out of the garbage collector's walk (gc.freeze, as "
        "Airflow's DAG processor does), so the full collections of a triggerer watching thousands of jobs walk only "
        "what came later: at 10,000 watched jobs such a collection is the event loop's worst stall. It is "
        "process-wide: turn it off if another trigger of the triggerer leaves reference cycles made before that "
        "moment for the collector to free.",
    ),
    "local_jobs_dir": ("string", None, "Jobs folder of the local platform when its connection does not set one."),
    "local_results_root": (
        "string",
        None,
        "Results root of the local platform when its connection does not set one.",
    ),
}


def _raw(option: str) -> str | None:
    from airflow.sdk import conf  # not at import: get_provider_info() (read by every Airflow process) imports us

    default = OPTIONS[option][1]
    value: Any = conf.get(SECTION, option, fallback=default)
    return None if value in (None, "") else str(value)


def default_poll_interval() -> float:
    """``[tao] default_poll_interval``."""
    return float(_raw("default_poll_interval") or OPTIONS["default_poll_interval"][1] or 10)


def default_storage_conn_id() -> str | None:
    """``[tao] default_storage_conn_id`` (None when unset)."""
    return _raw("default_storage_conn_id")


def default_results_uri() -> str | None:
    """``[tao] default_results_uri`` (None when unset)."""
    return _raw("default_results_uri")


def stream_logs() -> bool:
    """``[tao] stream_logs``."""
    return _flag("stream_logs")


def _flag(option: str) -> bool:
    return str(_raw(option) or OPTIONS[option][1]).strip().lower() in ("1", "true", "yes", "on")


def log_reads_per_interval() -> int:
    """``[tao] log_reads_per_interval`` (at least 1: an ended job's log is always read)."""
    raw = _raw("log_reads_per_interval") or OPTIONS["log_reads_per_interval"][1] or "8"
    try:
        return max(1, int(raw))
    except ValueError:
        raise ValueError(f"[tao] log_reads_per_interval must be a whole number of log reads, not {raw!r}") from None


def lease_hours() -> float:
    """``[tao] lease_hours`` (0 = no lease)."""
    return max(0.0, float(_raw("lease_hours") or 0))


def outage_report_seconds() -> float:
    """``[tao] outage_report_seconds``: how often a continuing outage, or a job's wait, is logged again."""
    return float(_raw("outage_report_seconds") or 300)


def trigger_event_hold_seconds() -> float:
    """``[tao] trigger_event_hold_seconds``: how long after it starts a trigger may report a job's end."""
    return max(0.0, float(_raw("trigger_event_hold_seconds") or 10))


def freeze_triggerer_heap() -> bool:
    """``[tao] freeze_triggerer_heap``."""
    return _flag("freeze_triggerer_heap")


def local_jobs_dir() -> str | None:
    """``[tao] local_jobs_dir`` (None when unset: ``$AIRFLOW_HOME/tao/jobs``)."""
    return _raw("local_jobs_dir")


def local_results_root() -> str | None:
    """``[tao] local_results_root`` (None when unset: ``$AIRFLOW_HOME/tao/results``)."""
    return _raw("local_results_root")


def config_section() -> dict[str, Any]:
    """The ``config`` entry of the provider info: the ``[tao]`` section as Airflow's schema wants it."""
    return {
        SECTION: {
            "description": "Settings of the NVIDIA TAO provider.",
            "options": {
                name: {
                    "description": description,
                    "version_added": "0.1.0",
                    "type": kind,
                    "example": _EXAMPLES.get(name),
                    "default": default,
                }
                for name, (kind, default, description) in OPTIONS.items()
            },
        }
    }


_EXAMPLES = {
    "default_poll_interval": "30",
    "default_storage_conn_id": "aws_default",
    "default_results_uri": "s3://ml-artifacts/tao/results",
    "stream_logs": "False",
    "log_reads_per_interval": "20",
    "lease_hours": "24",
    "outage_report_seconds": "60",
    "trigger_event_hold_seconds": "10",
    "freeze_triggerer_heap": "False",
    "local_jobs_dir": "/var/lib/airflow/tao/jobs",
    "local_results_root": "/var/lib/airflow/tao/results",
}
