"""What input staging and output committing read of a run: :class:`JobView`, which
:class:`~airflow_provider_tao.runner.job.job.Job` is.

A protocol, so ``inputs`` and ``outputs`` need not import ``job`` -- which imports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .progress import Reporter
    from .s3 import S3


class JobView(Protocol):
    """The parts of one run of the runner that :class:`~.inputs.InputStaging` and :class:`~.outputs.Outputs` use."""

    m: Mapping[str, Any]
    r: Reporter
    mode: str
    job_id: str
    wheels: dict[str, str]
    excludes: list[str]
    mount_path: str | None
    work: str
    results_kind: str
    results_dest: str
    results_local: str
    spec: Any
    args: dict[str, Any]

    @property
    def s3(self) -> S3: ...
