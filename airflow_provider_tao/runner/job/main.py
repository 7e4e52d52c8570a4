"""The runner's entry point: ``python3 runner.pyz <runner.json>`` (the archive's ``__main__`` calls :func:`main`).

Exit code: the command's own (128+N when it died from signal N). Outputs are committed even when the command fails
(checkpoints survive for a resume); each output manifest records the command's ``exit_code``. When the runner fails
by itself it prints one ``TAO_FAILURE`` line and exits 2 (configuration: missing or denied input, bad manifest,
missing package), 75 (infrastructure: connection dropped / endpoint gone after retries) or 70 (a runner bug); when
the command succeeded but committing its outputs failed, it exits 2 or 75 the same way.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from .errors import EXIT_SOFTWARE, ConfigError, RunnerError
from .job import Job
from .progress import Reporter
from .runfile import load_runner_manifest

if TYPE_CHECKING:  # pragma: no cover - typing only
    from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run one job; returns the exit code.

    :param argv: ``[runner.json]`` (default: ``sys.argv[1:]``).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    reporter = Reporter()
    try:
        if len(args) != 1:
            raise ConfigError("usage: python3 runner.pyz <runner.json>")
        job = Job(load_runner_manifest(args[0]), reporter)
        try:
            return job.run()
        finally:
            job.cleanup()
    except RunnerError as exc:
        reporter.failure(exc.err_class, str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        reporter.failure("ERR_UNKNOWN", "interrupted")
        return 130
    except Exception as exc:  # a bug in the runner: say so, never hide it as the command's failure
        import traceback

        traceback.print_exc()
        reporter.failure("ERR_UNKNOWN", f"runner error: {type(exc).__name__}: {exc}")
        return EXIT_SOFTWARE
