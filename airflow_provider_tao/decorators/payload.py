"""The worker side of ``@task.tao``'s function payload: what travels to the job and what comes back.

To the job (as ``JobSpec.files``, staged into ``$TAO_JOB_FILES``, never on a command line): ``tao_function.py``
(:mod:`~airflow_provider_tao.decorators.job_main`), ``function.py`` (the function's source), ``function.json`` and,
with arguments, ``function.in``. Back from the job: ``<results_dir>/tao_return.out``, a JSON header line (the job's
Python) and the serialised return value.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from airflow_provider_tao.decorators.job_main import RETURN_FILE, RETURN_PREFIX

SERIALIZERS = ("pickle", "dill", "cloudpickle")
#: The arguments ride in the job's files, which some platforms ship in pieces (ConfigMaps, secrets): data belongs
#: in ``inputs=`` or in storage, not in the arguments.
MAX_ARGUMENTS_BYTES = 8 << 20
#: The largest return value read back (the same reasoning: an XCom is not a model).
MAX_RETURN_BYTES = 32 << 20

__all__ = ["MAX_ARGUMENTS_BYTES", "MAX_RETURN_BYTES", "RETURN_FILE", "SERIALIZERS", "ReturnValueError"]


class ReturnValueError(Exception):
    """The function's return value cannot be read back on the worker (says why and how to fix it)."""


def load_serializer(name: str) -> Any:
    """The module of serializer ``name`` (``pickle``, ``dill``, ``cloudpickle``)."""
    import importlib

    return importlib.import_module(name)


def function_files(
    callable_name: str, source: str, serializer: str, args: list[Any], kwargs: dict[str, Any]
) -> dict[str, bytes]:
    """``JobSpec.files`` of one call of the function.

    :param callable_name: the function's name in ``source``.
    :param source: the function's source, its ``@task.tao`` line removed.
    :param serializer: one of :data:`SERIALIZERS`.
    :param args: positional arguments (rendered).
    :param kwargs: keyword arguments (rendered).
    :raises ValueError: arguments the serializer cannot write, or too large to travel with the job.
    """
    files = {
        "tao_function.py": Path(__file__).with_name("job_main.py").read_bytes(),
        "function.py": source.encode("utf-8"),
    }
    pickled = b""
    if args or kwargs:
        try:
            pickled = load_serializer(serializer).dumps({"args": list(args), "kwargs": dict(kwargs)})
        except Exception as exc:
            raise ValueError(
                f"op_args/op_kwargs: {serializer} cannot serialise the function's arguments ({type(exc).__name__}: "
                f"{exc}). Pass plain values, or serializer='cloudpickle' / 'dill' for richer objects"
            ) from exc
        if len(pickled) > MAX_ARGUMENTS_BYTES:
            raise ValueError(
                f"op_args/op_kwargs: the arguments serialise to {len(pickled)} bytes, over "
                f"{MAX_ARGUMENTS_BYTES} bytes. Pass data as inputs= (a URI the job downloads), not as an argument"
            )
        files["function.in"] = pickled
    meta = {
        "callable": callable_name,
        "serializer": serializer,
        "python": worker_python(),
        "python_info": [int(part) for part in worker_python().split(".")[:3] if part.isdigit()],
        "modules": module_versions(source, pickled),
    }
    files["function.json"] = json.dumps(meta, sort_keys=True).encode()
    return files


def worker_python() -> str:
    """This worker's Python version (``3.11.7``)."""
    import platform

    return platform.python_version()


def module_versions(source: str, pickled: bytes) -> dict[str, str]:
    """``top-level module -> version`` on the worker, of the modules the function imports and its arguments name
    (so that a module missing in the job is reported with the worker's version of it)."""
    import ast
    import pickletools

    names: set[str] = set()
    try:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    except SyntaxError:
        pass
    if pickled:
        try:
            for _opcode, arg, _pos in pickletools.genops(pickled):
                if isinstance(arg, str) and arg.split(".")[0].isidentifier():
                    names.add(arg.split(".")[0].split(" ")[0])
        except Exception:  # a payload pickletools cannot walk (dill/cloudpickle extensions): no versions then
            pass
    versions = {}
    for name in sorted(names):
        module = sys.modules.get(name)
        if module is not None and name not in sys.builtin_module_names:
            versions[name] = str(getattr(module, "__version__", "") or f"(Python {worker_python()})")
    return versions


def return_in_log(text: str) -> bytes | None:
    """The return file's copy in a job's log text (the last ``TAO_RETURN`` line), or None."""
    import base64
    import binascii

    for line in reversed(text.splitlines()):
        start = line.find(RETURN_PREFIX)
        if start >= 0:
            try:
                return base64.b64decode(line[start + len(RETURN_PREFIX) :].strip(), validate=True)
            except (binascii.Error, ValueError):
                continue
    return None


def read_return_value(data: bytes | None, serializer: str, where: str) -> Any:
    """The function's return value from the bytes of its return file.

    :param data: the file's content, None when there is none.
    :param serializer: the task's serializer.
    :param where: the file's location, for messages.
    :raises ReturnValueError: no file, or a value the worker cannot load (naming both Pythons).
    """
    if data is None:
        raise ReturnValueError(
            f"the job completed but its return value {where} cannot be read from the worker, and it is too large "
            "for the job's log (over 12 KiB). Return less (the model belongs in the results folder), or give the "
            "task a results location the worker reads: results_uri='s3://...' with storage_conn_id, or a platform "
            "results root (local, SLURM, Docker results_root)"
        )
    header, _, body = data.partition(b"\n")
    try:
        job_python = str(json.loads(header).get("python"))
    except ValueError:
        job_python = "unknown"
    try:
        loaded = load_serializer(serializer).loads(body)
    except ImportError as exc:
        raise ReturnValueError(
            f"the function's return value needs module {exc.name or exc!s}, which the worker's Python "
            f"{worker_python()} does not have (the job ran Python {job_python}). Return plain values or "
            "install the module on the workers"
        ) from exc
    except Exception as exc:
        raise ReturnValueError(
            f"the worker's Python {worker_python()} cannot load the return value the job's Python "
            f"{job_python} wrote with {serializer}: {type(exc).__name__}: {exc}"
        ) from exc
    return loaded
