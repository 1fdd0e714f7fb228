"""Errors that the CLI turns into one line on stderr and an exit code."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_BUDGET = 3
EXIT_PARTIAL = 4     # the run finished, but some chunks failed or are partial (--retry-failed)
EXIT_TEMPFAIL = 75   # EX_TEMPFAIL (sysexits.h): another run holds the project; try again later


class HragError(Exception):
    """A failure the user should read as one line; `exit_code` is what the process returns. `cause` and `fix`
    split that line where the raiser knows them, `counts` is what the run did before it failed (all three go
    into the failure object `--json` prints)."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str = "", *, cause: str = "", fix: str = "", counts: dict | None = None) -> None:
        super().__init__(message)
        self.cause, self.fix = cause, fix
        self.counts: dict = counts if counts is not None else {}


class UsageError(HragError):
    """Bad flags, bad paths, bad input files: nothing was changed on disk."""

    exit_code = EXIT_USAGE


class ProjectLocked(HragError):
    """Another writer holds the project lock: not a usage error, so a cron wrapper can tell "already running"
    (75, try later) from "my command is wrong" (2)."""

    exit_code = EXIT_TEMPFAIL


class RunStopped(HragError):
    """The LLM failed in a way every remaining chunk would meet too (no server, unknown provider, bad key,
    context too small): the run stopped early, the unfinished chunks stay pending for the same command."""


class BudgetExceeded(HragError):
    """The run's LLM spend reached --max-cost; everything done so far is saved and resumable."""

    exit_code = EXIT_BUDGET
