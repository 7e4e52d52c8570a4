"""A private PostgreSQL server for the e2e tests' ``airflow standalone`` instances.

Airflow's scheduler, DAG processor, triggerer, API server and task workers all write the metadata database at
once; on SQLite they take turns on one file lock, and on a loaded 2-CPU machine a request of the API server waits
past the lock's timeout ("database is locked", a 500). PostgreSQL is what Airflow is run on, so the tests run on it:
one server per test session (Debian's ``postgresql`` package, started as the ``postgres`` user in a folder of the
session), one database per standalone instance. Only loopback TCP, ``trust`` authentication: no password exists
that could leak into a log.
"""

from __future__ import annotations

import glob
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.e2e.airflow_harness import HarnessError, free_ports

_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "400",  # ~40 Airflow processes with a small pool each (the matrix's busiest moment)
    # test data: durability is not wanted, speed is
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "64MB",
}


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found:
        raise HarnessError("PostgreSQL is not installed: apt-get install postgresql (scripts/test.sh does)")
    return Path(found[-1]).parent


class PostgresServer:
    """One ``postgres`` on a free loopback port, run as the ``postgres`` user (it refuses root), in a folder of its
    own under ``/var/tmp`` (pytest's folders are private to root); :meth:`stop` removes it."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="tao-e2e-postgres-", dir="/var/tmp"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = free_ports(1)[0]
        self._bin = _bin_dir()
        self._databases = 0

    def _run(self, *argv: str) -> str:
        done = subprocess.run(
            ["runuser", "-u", "postgres", "--", *argv],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.root,
        )
        if done.returncode != 0:
            raise HarnessError(f"{' '.join(argv[:2])} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        return done.stdout

    def start(self) -> None:
        """initdb, write the settings, start it and wait until it accepts connections."""
        shutil.chown(self.root, "postgres", "postgres")
        self._run(str(self._bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(f"port = {self.port}\nunix_socket_directories = '{self.root}'\n")
            conf.writelines(f"{key} = {value}\n" for key, value in _SETTINGS.items())
        self._run(str(self._bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self) -> None:
        """Stop it (fast shutdown: open sessions are ended) and remove its folder."""
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(str(self._bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def create_database(self) -> str:
        """A new, empty database; its SQLAlchemy URL (psycopg2; Airflow derives the asyncpg one from it)."""
        self._databases += 1
        name = f"airflow_{self._databases}"
        self._run(str(self._bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name)
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{name}"
