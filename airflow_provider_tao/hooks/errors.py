"""The errors of the platform contract: bad input (nothing submitted), a refused submission, and what the connection
test found wrong."""

from __future__ import annotations

from airflow_provider_tao.jobs import ErrClass


class JobValidationError(ValueError):
    """Bad input found before anything was submitted. The message names the parameter and the fix."""

    def __init__(self, parameter: str, problem: str, fix: str) -> None:
        self.parameter, self.problem, self.fix = parameter, problem, fix
        # a problem that is a sentence of its own (an exception's text) keeps its one full stop
        super().__init__(f"{parameter}: {problem.rstrip('. ')}" + (f". {fix}" if fix else "."))


class JobSubmitError(RuntimeError):
    """The platform refused the job at submission (an image it cannot pull, a quota): nothing runs.

    :param err_class: the failure class; the operator retries only the retriable ones.
    :param message: what happened and what to do, for the task log.
    """

    def __init__(self, err_class: ErrClass, message: str) -> None:
        super().__init__(message)
        self.err_class = err_class


class ConnectionProblem(Exception):
    """What :meth:`TAOPlatformHook.probe_connection` found wrong, in words a person can act on.

    :param kind: ``unreachable`` (no answer: host, port, socket, DNS), ``auth`` (credentials refused), ``not_found``
        (the namespace / partition / folder does not exist), ``permission`` (authenticated, but not allowed) or
        ``config`` (the connection itself is incomplete or contradictory).
    :param message: what failed and what to check, without any secret.
    """

    KINDS = ("unreachable", "auth", "not_found", "permission", "config")

    def __init__(self, kind: str, message: str) -> None:
        assert kind in self.KINDS, kind
        self.kind = kind
        super().__init__(message)
