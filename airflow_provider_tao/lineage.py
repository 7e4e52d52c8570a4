"""OpenLineage for TAO jobs: the data a job reads, the results it writes, and a run facet saying where and how it ran.

The OpenLineage provider (``apache-airflow-providers-openlineage``, the ``openlineage`` extra) calls the operator's
``get_openlineage_facets_on_start`` / ``_on_complete`` / ``_on_failure``, which call :func:`operator_lineage`; an
operator of another shape (the AutoML search) calls :func:`job_lineage` with its own URIs and :class:`JobFacts`.
Nothing here imports OpenLineage at module level: importing the operator or parsing a DAG costs nothing when the
provider is not installed, and the methods are only called by it.

Dataset names follow OpenLineage's naming spec (https://openlineage.io/docs/spec/naming): ``s3://bucket/key`` ->
namespace ``s3://bucket``, name ``key``; a path (``/data/x``, ``file:///data/x``) -> namespace ``file://<host>``
(the host whose filesystem holds it: the SLURM login host, the worker for ``local``), name the path; a model hub
URI (``hf_model://org/model``, ``ngc://org/team/model``) -> namespace ``<scheme>://<first segment>``, name the rest.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage

    from airflow_provider_tao.records import JobRecord

#: The key of our run facet in an event's ``run.facets``.
RUN_FACET = "tao_job"
#: Where the run facet's JSON schema is published (docs/lineage/TAOJobRunFacet.json).
RUN_FACET_SCHEMA = (
    "https://raw.githubusercontent.com/NVIDIA/airflow-provider-tao/main/docs/lineage/TAOJobRunFacet.json"
    "#/$defs/TAOJobRunFacet"
)
_HUBS = ("hf_model://", "hf_dataset://", "ngc://")


@dataclass(frozen=True)
class JobFacts:
    """What the run facet says about one job (None where it is not known yet, e.g. at START).

    :param platform: ``local``, ``slurm``, ``docker``, ``kubernetes``, ``lepton`` or ``brev``.
    :param connection: the Airflow connection id (None: the platform's defaults).
    :param job_id: our job id (``TAO_JOB_ID``, the task's XCom ``job_id``).
    :param backend_job_id: the platform's own id (SLURM job id, container id...).
    :param image: the container image.
    :param gpu_count: GPUs per node asked for.
    :param num_nodes: nodes asked for.
    :param gpu_hours: GPUs x nodes x the run time the platform reports.
    :param state: the job's state (``Complete``, ``Error``, ``Canceled``...).
    :param failure_class: the failure class of a job that did not complete (``ERR_PROGRAM``...).
    """

    platform: str | None
    connection: str | None
    job_id: str | None = None
    backend_job_id: str | None = None
    image: str | None = None
    gpu_count: int | None = None
    num_nodes: int | None = None
    gpu_hours: float | None = None
    state: str | None = None
    failure_class: str | None = None

    def facet_fields(self) -> dict[str, Any]:
        """The run facet's fields (camelCase, as OpenLineage facets name them; unknown ones left out)."""
        names = {
            "platform": self.platform,
            "connection": self.connection,
            "jobId": self.job_id,
            "backendJobId": self.backend_job_id,
            "image": self.image,
            "gpuCount": self.gpu_count,
            "numNodes": self.num_nodes,
            "gpuHours": self.gpu_hours,
            "state": self.state,
            "failureClass": self.failure_class,
        }
        return {key: value for key, value in names.items() if value not in (None, "")}


def dataset_name(uri: str, host: str) -> tuple[str, str] | None:
    """``(namespace, name)`` of ``uri`` by OpenLineage's naming spec; None for what is not a dataset location.

    :param uri: ``s3://``, ``file://``, an absolute path or a model hub URI.
    :param host: the host whose filesystem holds a path.
    """
    if uri.startswith("s3://"):
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        return (f"s3://{bucket}", key.rstrip("/") or "/") if bucket else None
    if uri.startswith(_HUBS):
        scheme, _, rest = uri.partition("://")
        first, _, name = rest.partition("/")
        return (f"{scheme}://{first}", name or "/") if first else None
    path = uri.removeprefix("file://")
    if path.startswith("/"):
        return f"file://{host}", os.path.normpath(path)
    return None


def job_lineage(inputs: Iterable[str], outputs: Iterable[str], facts: JobFacts, host: str) -> OperatorLineage:
    """The OpenLineage of one job (or of a search over jobs): its input and output datasets and the run facet.

    :param inputs: URIs the job reads.
    :param outputs: URIs the job writes (its results folder, its declared outputs).
    :param facts: the run facet's content.
    :param host: the host whose filesystem holds the paths among the URIs.
    """
    from airflow.providers.common.compat.openlineage.facet import Dataset, InputDataset, OutputDataset
    from airflow.providers.openlineage.extractors import OperatorLineage

    def named(uris: Iterable[str]) -> list[tuple[str, str]]:
        return list(dict.fromkeys(found for uri in uris if (found := dataset_name(uri, host)) is not None))

    def as_dataset(kind: type[Dataset], namespace: str, name: str) -> Dataset:
        return kind(namespace=namespace, name=name)

    return OperatorLineage(
        inputs=[as_dataset(InputDataset, ns, name) for ns, name in named(inputs)],
        outputs=[as_dataset(OutputDataset, ns, name) for ns, name in named(outputs)],
        run_facets={RUN_FACET: _run_facet(facts)},
    )


def _run_facet(facts: JobFacts) -> Any:
    from openlineage.client.facet_v2 import RunFacet

    facet = RunFacet().with_additional_properties(**facts.facet_fields())
    facet._schemaURL = RUN_FACET_SCHEMA  # our facet's own schema, not the generic RunFacet's
    return facet


# ----------------------------------------------------------------------------- TAOSubmitOperator


def operator_lineage(operator: Any, record: JobRecord | None) -> OperatorLineage:
    """The lineage of a :class:`~airflow_provider_tao.operators.submit.TAOSubmitOperator` (or ``@task.tao``) task
    from its fields and, once there is one, its job's record.

    :param operator: the operator (its rendered fields).
    :param record: the record of the task's job (None before a job exists).
    """
    job = record.job if record is not None else None
    facts = JobFacts(
        platform=job.platform if job else operator.platform,
        connection=job.conn_id if job else operator.conn_id,
        job_id=job.job_id if job else None,
        backend_job_id=job.backend_job_id if job else None,
        image=_image(operator),
        gpu_count=operator.gpu_count,
        num_nodes=operator.num_nodes,
        gpu_hours=record.gpu_hours() if record is not None and record.ended_at is not None else None,
        state=record.state if record is not None else None,
        failure_class=(record.err_class or None) if record is not None else None,
    )
    outputs = [*(record.outputs.values() if record else []), *([job.results_dir] if job and job.results_dir else [])]
    return job_lineage(_input_uris(operator), outputs, facts, _host(facts.platform, facts.connection))


def _image(operator: Any) -> str | None:
    try:
        return operator._resolved_image()  # a versions.yaml key as the image reference
    except Exception:
        return operator.image if isinstance(operator.image, str) else None


def _input_uris(operator: Any) -> list[str]:
    """The URIs of the task's declared inputs (what the in-job runner downloads), from its data contract."""
    if not getattr(operator, "uses_runner", False) or not operator.inputs:
        return []
    from airflow_provider_tao.operators.staging import _input_uris as declared

    try:
        return [uri for _where, uri in declared(operator.build_job_entrypoint())]
    except Exception:  # a contract that does not validate has no lineage; the task says why it failed
        return []


def _host(platform: str | None, conn_id: str | None) -> str:
    """The host whose filesystem holds a job's paths: the connection's host (SLURM's login node), else this one."""
    if conn_id and platform not in ("local", "docker"):
        try:
            from airflow_provider_tao.connections import get_connection

            if host := get_connection(conn_id).host:
                return str(host)
        except Exception:
            pass
    return os.uname().nodename
