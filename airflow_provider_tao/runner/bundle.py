"""The in-job runner as one zip archive, ``runner.pyz``, built on the host at submission time.

Python runs a zip archive that has a ``__main__.py`` (``python3 runner.pyz runner.json``), so the runner ships as one
file however many modules it has. The archive holds ``__main__.py`` and every module of
:mod:`airflow_provider_tao.runner.job`, as the package ``tao_runner`` (its imports are relative, so it runs under any
name). It is deterministic -- sorted entries, a fixed timestamp, fixed permissions, stored uncompressed (no
dependence on the zlib version; the platforms compress what they ship) -- so the same code always gives the same
bytes, and it is built once per process.
"""

from __future__ import annotations

import functools
import io
import zipfile
from pathlib import Path

from airflow_provider_tao.runner import job as _job_package

#: The archive's name in ``$TAO_JOB_FILES``.
RUNNER_ARCHIVE = "runner.pyz"
#: The runner package's name inside the archive.
ARCHIVE_PACKAGE = "tao_runner"

_MAIN = f"import sys\n\nfrom {ARCHIVE_PACKAGE}.main import main\n\nsys.exit(main())\n"
_TIMESTAMP = (1980, 1, 1, 0, 0, 0)  # the earliest a zip entry can carry
_MODE = 0o100644  # a regular file, rw-r--r--
_UNIX = 3  # ZipInfo.create_system: the mode bits are Unix ones


def archive_members() -> list[tuple[str, bytes]]:
    """``[(name in the archive, content)]``, sorted by name: ``__main__.py`` and the runner package's modules."""
    package = Path(_job_package.__file__).parent
    members = [("__main__.py", _MAIN.encode("utf-8"))]
    members += [(f"{ARCHIVE_PACKAGE}/{path.name}", path.read_bytes()) for path in package.glob("*.py")]
    return sorted(members)


@functools.cache
def runner_archive() -> bytes:
    """The bytes of ``runner.pyz`` (built on first use, then the same bytes for the life of the process)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, content in archive_members():
            info = zipfile.ZipInfo(name, date_time=_TIMESTAMP)
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = _MODE << 16
            info.create_system = _UNIX
            archive.writestr(info, content)
    return buffer.getvalue()
