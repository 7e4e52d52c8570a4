"""How the real CLI's errors read, modelled on its Go error values (brev-cli pkg/errors, cmderrors, go-multierror).

A Go error has two texts that matter: ``err.Error()`` -- what a wrapping ``fmt.Errorf("...%w")``, a multierror or
a log line embeds -- and ``errors.Cause(err).Error()`` -- the one line ``main`` prints on stderr before exiting 1.
``breverrors.WrapAndTrace`` (a ``pkg/errors`` wrap) changes the first, adding
``[error] \\n<function>\\n<file>:<line>\\n: `` in front, and leaves the cause alone. :class:`GoError` carries both.
Function names and line numbers are those of brev-cli v0.6.327 (commit 12d39b7); the source root is where its
release build mounts the module (``/go/src/github.com/brevdev/brev-cli``).
"""

from __future__ import annotations

MODULE = "github.com/brevdev/brev-cli"
SOURCE_ROOT = "/go/src/github.com/brevdev/brev-cli"


class GoError(Exception):
    """An error of the real CLI.

    :param cause: ``errors.Cause(err).Error()``: what is printed when the command fails with it.
    :param full: ``err.Error()`` (defaults to ``cause``).
    :param validation: a ``ValidationError`` (printed yellow on a terminal, red otherwise).
    """

    def __init__(self, cause: str, full: str | None = None, validation: bool = False) -> None:
        super().__init__(cause)
        self.cause = cause
        self.full = cause if full is None else full
        self.validation = validation

    def traced(self, function: str, source: str, line: int) -> GoError:
        """``breverrors.WrapAndTrace(err)`` called in ``function`` (``pkg/cmd/exec.runSSHWithTimeout``) at
        ``source:line`` (``pkg/cmd/exec/exec.go``, 311)."""
        head = f"[error] \n{MODULE}/{function}\n{SOURCE_ROOT}/{source}:{line}\n"
        return GoError(self.cause, f"{head}: {self.full}", self.validation)


def validation(message: str) -> GoError:
    """``breverrors.NewValidationError(message)``."""
    return GoError(message, validation=True)


def errorf(template: str, wrapped: GoError) -> GoError:
    """``fmt.Errorf(template with %w, wrapped)``: a new cause embedding the wrapped error's full text."""
    text = template.replace("%w", wrapped.full)
    return GoError(text)


def multierror(errors: list[GoError]) -> GoError:
    """``multierror.Append`` of several errors (its own text is also its cause)."""
    points = "\n\t".join(f"* {e.full}" for e in errors)
    count = "1 error occurred" if len(errors) == 1 else f"{len(errors)} errors occurred"
    text = f"{count}:\n\t{points}\n\n"
    return GoError(text)


def exit_status(code: int) -> GoError:
    """An ``*exec.ExitError`` of a child process."""
    return GoError(f"exit status {code}")


class GoPanic(Exception):
    """A Go runtime panic: the CLI prints ``panic: <message>`` and the goroutine's trace on stderr and exits 2
    (Go's runtime, not ``DisplayAndHandleError``).

    :param message: the panic's value, e.g. ``runtime error: index out of range [1] with length 1``.
    :param frames: ``(function, source, line)`` from the innermost call out, as in ``traced``.
    """

    def __init__(self, message: str, frames: list[tuple[str, str, int]]) -> None:
        super().__init__(message)
        self.message = message
        self.frames = frames

    def trace(self) -> str:
        lines = [f"panic: {self.message}\n", "\ngoroutine 1 [running]:\n"]
        for function, source, line in self.frames:
            lines += [f"{MODULE}/{function}(...)\n", f"\t{SOURCE_ROOT}/{source}:{line} +0x1d4\n"]
        return "".join(lines)
