"""The job side of ``@task.tao``: run the decorated function in the job's Python and keep its return value.

Shipped as ``tao_function.py`` into ``$TAO_JOB_FILES`` with ``function.py`` (the function's source),
``function.json`` (what the worker knows: its Python, the serializer, the versions of the modules the function and
its arguments name) and, when the task has arguments, ``function.in`` (``{"args": [...], "kwargs": {...}}``
serialised as ``@task.docker`` does). Standard library only, never imports Airflow; runs on Python >= 3.8.

* Every node runs the function (``NODE_RANK`` is set on multi-node jobs); rank 0 writes the return value to
  ``$TAO_RESULTS_DIR/tao_return.out`` (atomically: a JSON header line naming the job's Python, then the value
  serialised), where the task reads it back from the job that ran; a small one also goes into the job's log on a
  ``TAO_RETURN`` line (base64), for platforms whose results folder the worker cannot read (a Kubernetes PVC).
* An exception prints its traceback (so the task log shows it) and a ``TAO_FAILURE`` line classifying it
  ``ERR_PROGRAM``; an environment that cannot run the function (another Python where the serializer needs the
  same one, a module missing) is ``ERR_CONFIG``, naming the job's side and the worker's.
"""

import base64
import json
import os
import platform
import sys
import traceback

FAILURE_PREFIX = "TAO_FAILURE "
RETURN_FILE = "tao_return.out"
#: The return file also goes into the job's log (base64, on one line after this prefix) when it is this small.
RETURN_PREFIX = "TAO_RETURN "
LOG_RETURN_BYTES = 12 << 10
#: Serializers whose payloads carry code, so that only the worker's major.minor Python can load them.
SAME_PYTHON = ("dill", "cloudpickle")


def _fail(err_class, message):
    # One write per line, on stdout: the job runs with python -u (a print is two writes) and the runner merges
    # stdout and stderr, so a line written in pieces could take another stream's text into its middle.
    sys.stderr.flush()
    sys.stdout.write(FAILURE_PREFIX + json.dumps({"err_class": err_class, "message": message}) + "\n")
    sys.stdout.flush()
    sys.exit(3 if err_class == "ERR_CONFIG" else 1)


def _traceback():
    """The current exception's traceback, on stdout in one write (see :func:`_fail`)."""
    sys.stdout.write(traceback.format_exc())
    sys.stdout.flush()


def _job_python():
    return f"Python {platform.python_version()} at {sys.executable}"


def _missing(exc, meta, what):
    name = (getattr(exc, "name", None) or str(exc)).split(".")[0]
    known = meta.get("modules", {}).get(name)
    worker = f"{name} {known}" if known else f"no record of {name}"
    _fail(
        "ERR_CONFIG",
        "{} needs module {!r}, which the job's {} does not have (the worker: Python {}, {}). Install it in the "
        "job's image/environment or set python_command=".format(what, name, _job_python(), meta["python"], worker),
    )


def _serializer(meta):
    name = meta["serializer"]
    if name in SAME_PYTHON and tuple(sys.version_info[:2]) != tuple(meta["python_info"][:2]):
        _fail(
            "ERR_CONFIG",
            "serializer={!r} needs the same Python on both sides: the worker runs Python {}, the job runs {}. Use "
            "an image with Python {}.{}, or serializer='pickle'".format(
                name, meta["python"], _job_python(), *meta["python_info"][:2]
            ),
        )
    try:
        return __import__(name)
    except ImportError as exc:
        _missing(exc, meta, f"serializer={name!r}")


def main():
    files = os.environ.get("TAO_JOB_FILES", "")
    with open(os.path.join(files, "function.json")) as handle:
        meta = json.load(handle)
    serializer = _serializer(meta)
    arguments: dict = {"args": [], "kwargs": {}}
    if os.path.exists(os.path.join(files, "function.in")):
        try:
            with open(os.path.join(files, "function.in"), "rb") as handle:
                arguments = serializer.load(handle)
        except ImportError as exc:
            _missing(exc, meta, "The function's arguments")
        except Exception as exc:  # a pickle another Python cannot read
            _fail(
                "ERR_CONFIG",
                "the job's {} cannot load the arguments the worker (Python {}) serialised with {}: {}: {}".format(
                    _job_python(), meta["python"], meta["serializer"], type(exc).__name__, exc
                ),
            )
    scope: dict = {"__name__": "tao_function"}
    try:
        with open(os.path.join(files, "function.py")) as handle:
            exec(compile(handle.read(), "function.py", "exec"), scope)
        function = scope[meta["callable"]]
    except ImportError as exc:
        _missing(exc, meta, "The function's module")
    try:
        value = function(*arguments["args"], **arguments["kwargs"])
    except ImportError as exc:
        _traceback()
        _missing(exc, meta, "The function")
    except BaseException as exc:  # the function's own failure: its traceback goes to the task log
        _traceback()
        _fail("ERR_PROGRAM", "{} raised {}: {}".format(meta["callable"], type(exc).__name__, exc))
    rank = os.environ.get("NODE_RANK", "0") or "0"
    if rank != "0":
        return 0  # rank 0's value is the task's
    results = os.environ.get("TAO_RESULTS_DIR") or "."
    os.makedirs(results, exist_ok=True)
    partial = os.path.join(results, "." + RETURN_FILE)
    with open(partial, "wb") as handle:
        header = {"python": platform.python_version(), "executable": sys.executable}
        handle.write(json.dumps(header).encode() + b"\n")
        serializer.dump(value, handle)
    os.replace(partial, os.path.join(results, RETURN_FILE))
    with open(os.path.join(results, RETURN_FILE), "rb") as handle:
        written = handle.read(LOG_RETURN_BYTES + 1)
    if len(written) <= LOG_RETURN_BYTES:  # also in the log, for a worker that cannot read the results folder
        sys.stdout.write(RETURN_PREFIX + base64.b64encode(written).decode("ascii") + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
