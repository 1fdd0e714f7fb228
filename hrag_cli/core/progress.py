"""How a long stage tells the user where it is: a rich bar on a terminal, timestamped lines for cron, or
nothing with --quiet. Stages only call this interface, so they run the same under the CLI and the tests."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from hrag_cli.core.redact import printable


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())


def _fmt_stats(stats: dict[str, Any]) -> str:
    parts = []
    for k, v in stats.items():
        if isinstance(v, float):
            parts.append(f"{k}={v:.4f}" if k == "cost" else f"{k}={v:.1f}")
        else:
            parts.append(f"{k}={v}")
    return " ".join(parts)


class Task:
    """One counted unit of work; `advance` moves it, `stats` is shown beside it (calls, tokens, cost)."""

    def __init__(self, reporter: "Reporter", name: str, total: int | None) -> None:
        self.reporter = reporter
        self.name = name
        self.total = total
        self.done = 0
        self.stats: dict[str, Any] = {}
        self._rich_id: Any = None
        self._t0 = time.monotonic()
        self._last_line = self._t0   # plain mode: first progress line only after `interval` seconds

    def advance(self, n: int = 1, **stats: Any) -> None:
        self.done += n
        self.stats.update(stats)
        self.reporter._on_advance(self)

    def update(self, **stats: Any) -> None:
        self.stats.update(stats)
        self.reporter._on_advance(self)


class Reporter:
    """mode: 'rich' (terminal), 'plain' (timestamped lines every `interval` seconds) or 'quiet'."""

    def __init__(self, mode: str = "plain", stream: TextIO | None = None, interval: float = 10.0) -> None:
        self.mode = mode
        self.stream = stream or sys.stderr
        self.interval = interval
        self._progress: Any = None

    @classmethod
    def auto(cls, quiet: bool = False, json_output: bool = False) -> "Reporter":
        if quiet:
            return cls("quiet")
        if sys.stderr.isatty():
            return cls("rich")
        return cls("plain")

    # -- messages -------------------------------------------------------------------------------------
    def info(self, msg: str) -> None:
        if self.mode == "quiet":
            return
        msg = printable(msg, keep_newlines=False)   # file names and document text are data, never escapes
        if self.mode == "rich":
            from rich.console import Console

            Console(file=self.stream, highlight=False).print(msg, markup=False)
        else:
            print(f"{_stamp()} {msg}", file=self.stream, flush=True)

    def warn(self, msg: str) -> None:
        """Warnings are shown even with --quiet: a skipped file is something a cron log must keep."""
        msg = printable(msg, keep_newlines=False)
        if self.mode == "rich":
            from rich.console import Console
            from rich.markup import escape

            Console(file=self.stream, highlight=False).print(f"[yellow]warning:[/yellow] {escape(msg)}")
        else:
            print(f"{_stamp()} warning: {msg}", file=self.stream, flush=True)

    # -- counted work ---------------------------------------------------------------------------------
    @contextmanager
    def task(self, name: str, total: int | None) -> Iterator[Task]:
        task = Task(self, name, total)
        if self.mode == "rich":
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[stats]}"),
                                transient=False, console=None)
            progress.start()
            task._rich_id = progress.add_task(name, total=total, stats="")
            self._progress = progress
            try:
                yield task
            finally:
                progress.update(task._rich_id, completed=task.done, stats=_fmt_stats(task.stats))
                progress.stop()
                self._progress = None
        else:
            try:
                yield task
            finally:
                if self.mode == "plain":
                    secs = time.monotonic() - task._t0
                    print(f"{_stamp()} {name}: {task.done}/{task.total if task.total is not None else '?'} "
                          f"in {secs:.1f}s {_fmt_stats(task.stats)}".rstrip(), file=self.stream, flush=True)

    def _on_advance(self, task: Task) -> None:
        if self.mode == "rich" and self._progress is not None:
            self._progress.update(task._rich_id, completed=task.done, stats=_fmt_stats(task.stats))
        elif self.mode == "plain":
            now = time.monotonic()
            if now - task._last_line >= self.interval:
                task._last_line = now
                eta = ""
                if task.total and task.done:
                    rate = task.done / max(now - task._t0, 1e-9)
                    eta = f" eta={max(task.total - task.done, 0) / rate:.0f}s"
                print(f"{_stamp()} {task.name}: {task.done}/{task.total if task.total is not None else '?'}"
                      f"{eta} {_fmt_stats(task.stats)}".rstrip(), file=self.stream, flush=True)


def stdout_console() -> Any:
    """A rich console on stdout. Outside a terminal (cron, a pipe, a log file) rich would assume 80 columns and
    cut table cells and wrap lines there; lines are kept whole instead."""
    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    return Console(width=1 << 14, soft_wrap=True)
