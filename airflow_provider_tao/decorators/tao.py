"""``@task.tao``: run a Python function as a TAO job on any platform (``local``, SLURM, Docker, Kubernetes, Lepton,
Brev), with ``TAOSubmitOperator``'s GPUs, nodes, staging, failover and durable-job promises.

The function's source and its arguments travel with the job as ``@task.docker``'s do (the same serializers and
limits: see docs/howto/taskflow.md), as job files (:mod:`~airflow_provider_tao.decorators.payload`); the job runs
:mod:`~airflow_provider_tao.decorators.job_main` in its own Python through the in-job runner, and the return value
comes back from the job's results folder -- the job that ran, so a reattached job's value, never a second run's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.decorator import DecoratedOperator, task_decorator_factory
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_tao.decorators.payload import (
    MAX_RETURN_BYTES,
    RETURN_FILE,
    SERIALIZERS,
    ReturnValueError,
    function_files,
    read_return_value,
    return_in_log,
)
from airflow_provider_tao.hooks.base import JobValidationError
from airflow_provider_tao.operators.submit import TAOSubmitOperator

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.sdk.bases.decorator import TaskDecorator

    from airflow_provider_tao.hooks.base import TAOPlatformHook
    from airflow_provider_tao.jobs import JobHandle, JobSpec, JobStatus

#: XCom key of the job's summary (job id, GPU-hours, results folder...): the return value is the function's.
XCOM_JOB = "tao_job_result"
#: Lines of the end of a job's log searched for its return value (the runner prints a few after the function).
LOG_TAIL_LINES = 50
_PYTHON_COMMAND = re.compile(r"^[A-Za-z0-9_./+-]+$")


class _TAODecoratedOperator(DecoratedOperator, TAOSubmitOperator):
    """Runs a Python callable as a TAO job; its return value is the task's.

    Takes every :class:`~airflow_provider_tao.operators.submit.TAOSubmitOperator` argument but ``command``.

    :param python_callable: the function (defined in a file; its imports inside its body).
    :param op_args: positional arguments of the function (templated).
    :param op_kwargs: keyword arguments of the function (templated).
    :param serializer: how arguments and return value travel: ``pickle`` (default), ``cloudpickle`` or ``dill``
        (the latter two must be installed on the worker and in the job, with the same Python major.minor).
    :param python_command: the job's Python interpreter (default ``python3`` on the job's ``PATH``).
    :param multiple_outputs: a dict return value unrolled into one XCom per key.
    """

    custom_operator_name = "@task.tao"
    template_fields: Sequence[str] = (*TAOSubmitOperator.template_fields, "op_args", "op_kwargs")
    template_fields_renderers = {**TAOSubmitOperator.template_fields_renderers, "op_args": "py", "op_kwargs": "py"}
    shallow_copy_attrs: Sequence[str] = ("python_callable",)

    def __init__(
        self,
        *,
        python_command: str = "python3",
        serializer: str | None = None,
        outputs: dict[str, Any] | list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        serializer = serializer or "pickle"
        if serializer not in SERIALIZERS:
            raise JobValidationError(
                "serializer", f"{serializer!r} is not supported", f"Use one of: {', '.join(SERIALIZERS)}"
            )
        if not _PYTHON_COMMAND.fullmatch(python_command):
            raise JobValidationError(
                "python_command", f"{python_command!r} is not an interpreter name or path", "Use e.g. python3.11"
            )
        if "command" in kwargs:
            raise JobValidationError("command", "@task.tao runs the decorated function", "Remove command=")
        self.serializer = serializer
        self.python_command = python_command
        # The function runs through the in-job runner (outputs=[] when none: its results folder, TAO_RESULTS_DIR,
        # is where the return value is kept with the job).
        super().__init__(
            command=f'{python_command} -u -B "$TAO_JOB_FILES/tao_function.py"',
            outputs=[] if outputs is None else outputs,
            **kwargs,
        )

    def _job_spec(self, context: Context, hook: TAOPlatformHook, name: str) -> JobSpec:
        spec = super()._job_spec(context, hook, name)
        try:
            files = function_files(
                self.python_callable.__name__,
                self.get_python_source(),
                self.serializer,
                list(self.op_args),
                dict(self.op_kwargs),
            )
        except (OSError, TypeError) as exc:  # inspect.getsource: a lambda, a function typed into a console
            raise JobValidationError(
                "python_callable", f"its source cannot be read ({exc})", "Define the function in a DAG file"
            ) from exc
        except ValueError as exc:
            parameter, _, rest = str(exc).partition(": ")
            raise JobValidationError(parameter, rest, "") from exc
        return replace(spec, files={**spec.files, **files})

    def _succeed(self, context: Context, handle: JobHandle, status: JobStatus, outputs: dict[str, str]) -> Any:
        job = super()._succeed(context, handle, status, outputs)
        context["ti"].xcom_push(key=XCOM_JOB, value=job)
        where = f"{handle.results_dir.rstrip('/')}/{RETURN_FILE}"
        try:
            return read_return_value(self._read_return_file(handle), self.serializer, where)
        except ReturnValueError as exc:
            raise AirflowFailException(f"Job {handle.job_id}: {exc}") from exc

    def _read_return_file(self, handle: JobHandle) -> bytes | None:
        """``<results_dir>/tao_return.out`` of the job that ran: on S3 through the storage connection, else through
        the platform (a path the worker reads, SLURM over SSH); else its copy in the end of the job's log."""
        from airflow_provider_tao.hooks import get_platform_hook

        if handle.results_dir.startswith("s3://") and self.storage_conn_id:
            bucket, _, key = handle.results_dir.removeprefix("s3://").partition("/")
            found = self._s3_hook().get_key(f"{key.rstrip('/')}/{RETURN_FILE}", bucket)
            if found is not None:
                return bytes(found.get()["Body"].read(MAX_RETURN_BYTES))
        hook = get_platform_hook(handle.platform, handle.conn_id)
        hook.load_connection()
        if not handle.results_dir.startswith("s3://"):
            data = hook.read_result_file(handle, RETURN_FILE, limit=MAX_RETURN_BYTES)
            if data is not None:
                return data
        text, _ = hook.get_job_logs(handle, tail=LOG_TAIL_LINES)
        return return_in_log(text)


def tao_task(
    python_callable: Callable | None = None, multiple_outputs: bool | None = None, **kwargs: Any
) -> TaskDecorator:
    """``@task.tao(...)``: run the decorated function as a TAO job (any ``TAOSubmitOperator`` argument but
    ``command``; plus ``serializer`` and ``python_command``).

    :param python_callable: the function to decorate.
    :param multiple_outputs: unroll a dict return value into one XCom per key.
    """
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=multiple_outputs,
        decorated_operator_class=_TAODecoratedOperator,
        **kwargs,
    )
