"""Stopping a run on SIGINT or SIGTERM: Ctrl-C, `kill`, a cron wrapper's or a benchmark's deadline all stop it
the same way, at once, keeping everything finished.

The CLI handles both signals (`handled`). SIGTERM would otherwise end the process mid-line with no word and no
failure object. A SIGINT the process inherited ignored stays ignored: a shell starts a script's background
job (`hrag index ... &`) that way so the terminal's Ctrl-C does not reach it, and `nohup`-style wrappers rely
on it; such a job is stopped with SIGTERM (`kill`), which is always handled.

Outside an event loop the handler raises Interrupted where the program is. An event loop run by `run` gets its
main task cancelled instead, so every `finally` below it runs in order (requests in flight are abandoned and
their connections closed, nothing waits for an answer) and Interrupted is raised once it has unwound. What was
finished is already on disk: records and answers are appended a line at a time. A second signal while the
first is being handled raises at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal. A KeyboardInterrupt, so no `except Exception` on the way swallows it.
    `counts`: what the run did before (a stage fills it in; the CLI prints it under --json)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.counts: dict = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum      # the shell's convention: 130 for SIGINT, 143 for SIGTERM


_stop: Interrupted | None = None        # the signal that stopped this run, once one came
_cancelled: Interrupted | None = None   # a stop `run` has yet to raise (its main task was cancelled)
_tasks: dict[Any, Any] = {}             # event loop run by `run` -> its main task


def stopped() -> Interrupted | None:
    """The stop a signal asked for during `handled`, if one did (typer hands the CLI only an exit code)."""
    return _stop


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Within it, SIGINT and SIGTERM stop the run (see above); the previous handlers come back after. Only the
    main thread can set handlers: elsewhere it does nothing."""
    global _stop, _cancelled
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _stop = _cancelled = None
    old = {sig: signal.signal(sig, _on_signal) for sig in SIGNALS
           if not (sig == signal.SIGINT and signal.getsignal(sig) is signal.SIG_IGN)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _on_signal(signum: int, _frame: Any) -> None:
    global _stop, _cancelled
    if _stop is not None:
        raise _stop                     # a second signal: stop now
    _stop = Interrupted(signum)
    task = _main_task()
    if task is None:
        raise _stop
    _cancelled = _stop
    task.cancel()
    task.get_loop().call_soon_threadsafe(lambda: None)     # wake the loop if it sleeps in select


def _main_task() -> Any:
    """The main task of the event loop `run` runs in this (the main) thread, if one runs and has not ended."""
    if not _tasks:
        return None
    import asyncio

    try:
        task = _tasks.get(asyncio.get_running_loop())
    except RuntimeError:
        return None
    return task if task is not None and not task.done() else None


def run(make: Callable[[], Awaitable[T]]) -> T:
    """asyncio.run(make()) that a signal stops by cancelling its main task, raising Interrupted once that task
    has unwound (even if something below swallowed the cancellation)."""
    import asyncio

    global _cancelled

    async def main() -> T:
        loop = asyncio.get_running_loop()
        _tasks[loop] = asyncio.current_task()
        try:
            return await make()
        finally:
            _tasks.pop(loop, None)

    try:
        result = asyncio.run(main())
    except BaseException:
        if _cancelled is None:
            raise
    if _cancelled is not None:
        stop, _cancelled = _cancelled, None
        raise stop
    return result
