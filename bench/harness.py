"""What every benchmark script shares: the one runner of `hrag` commands, the one peak-RSS meter, and where the
benchmark data lives.

- `hrag(*args)` runs one command in a fresh process as a user would (`python -m hrag_cli.cli`, so
  `PYTHONPATH=OTHER_CHECKOUT` measures another version of the code on the same inputs) and measures that
  process alone with wait4: wall, CPU (user + system) and peak RSS.
- `peak_rss_mb()` is this process's own peak, for scripts that call hrag_cli in-process.
- `data_dir()`: the benchmark data, `--data DIR` (scripts that take it call `parse_args`), else
  $HRAG_BENCH_DATA, else `../shared/bench` beside the checkout.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the suite's helpers under tests/ (damage kinds, document makers, the browser driver) are shared with these
# scripts but are not part of the installed package; appended, so PYTHONPATH still picks the hrag_cli measured
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))


def data_dir() -> Path:
    """The benchmark data folder: --data, else $HRAG_BENCH_DATA, else ../shared/bench beside the checkout."""
    return Path(os.environ.get("HRAG_BENCH_DATA") or ROOT.parent / "shared" / "bench")


def parse_args(ap: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """`ap.parse_args()` with a --data option; the folder given is what `data_dir()` returns from then on (in
    this process and the ones it starts)."""
    ap.add_argument("--data", type=Path, default=None,
                    help="benchmark data folder (default: $HRAG_BENCH_DATA, else ../shared/bench beside the checkout)")
    args = ap.parse_args(argv)
    if args.data is not None:
        os.environ["HRAG_BENCH_DATA"] = str(args.data.resolve())
    return args


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class Run:
    """One finished `hrag` process."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    cpu_s: float          # user + system, of this process and the workers it forked
    peak_rss_mb: float    # of the largest one of them

    def figures(self) -> dict[str, float]:
        return {"wall_s": round(self.wall_s, 2), "cpu_s": round(self.cpu_s, 2),
                "peak_rss_mb": round(self.peak_rss_mb, 1)}


def measured(*args: str | Path, stdout_path: Path | None = None) -> dict[str, float]:
    """`hrag ARGS` (which must succeed) reduced to its figures: wall, CPU, peak RSS."""
    return hrag(*args, stdout_path=stdout_path).figures()


def _interrupt(proc: subprocess.Popen, grace: float = 60.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds. SIGTERM, not SIGINT: a benchmark started in the background
    passes SIGINT on ignored, and hrag keeps it so. os.kill, not Popen's methods: those may reap the process,
    which hrag() waits for itself (wait4, for its CPU time)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.returncode is not None:
            return
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while proc.returncode is None and time.monotonic() < deadline:
            time.sleep(0.5)


def hrag(*args: str | Path, check: bool = True, env: dict[str, str] | None = None, cwd: Path | None = None,
         stdout_path: Path | None = None, on_stderr_line: Callable[[str], None] | None = None,
         interrupt_after: float | None = None, on_start: Callable[[subprocess.Popen], None] | None = None) -> Run:
    """Run `hrag ARGS` in a fresh process and measure it. `check`: a non-zero exit ends the benchmark with the
    command and the end of its stderr. `stdout_path`: its stdout goes to that file (batch output) instead of
    `Run.stdout`. `on_stderr_line`: called with each stderr line as it is written (progress timing).
    `interrupt_after`: seconds after which it gets a SIGTERM, as from a deadline (hrag keeps what it finished
    and exits), and a SIGKILL a minute later should it still be running.
    `on_start`: called with the process once started (a script that kills it mid-run keeps it)."""
    argv = [str(a) for a in args]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out_tmp:
        out = open(stdout_path, "wb") if stdout_path is not None else out_tmp
        proc: subprocess.Popen | None = None
        timer: threading.Timer | None = None
        try:
            proc = subprocess.Popen([sys.executable, "-m", "hrag_cli.cli", *argv], stdout=out,
                                    stderr=subprocess.PIPE, env=env, cwd=cwd)
            if on_start is not None:
                on_start(proc)
            assert proc.stderr is not None
            if interrupt_after is not None:
                timer = threading.Timer(interrupt_after, _interrupt, (proc,))
                timer.daemon = True
                timer.start()
            lines = []
            for raw in proc.stderr:     # read to the end before reaping, so a full pipe never blocks it
                line = raw.decode("utf-8", errors="replace")
                lines.append(line)
                if on_stderr_line is not None:
                    on_stderr_line(line)
            _, status, ru = os.wait4(proc.pid, 0)
            proc.returncode = code = os.waitstatus_to_exitcode(status)
        finally:
            if timer is not None:
                timer.cancel()
            if proc is not None and proc.returncode is None:    # the benchmark was stopped: stop hrag too
                proc.terminate()
                proc.wait()
            if stdout_path is not None:
                out.close()
        out_tmp.seek(0)
        stdout = out_tmp.read().decode("utf-8", errors="replace")
    run = Run(argv, code, stdout, "".join(lines), time.perf_counter() - t0, ru.ru_utime + ru.ru_stime,
              ru.ru_maxrss / 1024)
    if check and code != 0:
        sys.exit(f"hrag {' '.join(argv)} failed ({code}):\n{run.stderr[-3000:]}")
    return run
