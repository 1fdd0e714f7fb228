"""A batch of ppr queries in this process, split by thread: what the main thread computes, what the helper thread
does beside it (`QueryIndex.aside`: the fact search, a large walk round's later entries, the seeds' entity records),
and the wall a machine with two free cores would take.

On a shared 2-core machine the measured wall says how busy the other core was; the CPU each thread spends does not.
So for each hand-off the main thread's CPU between handing the call over and waiting for it is compared with the
helper's CPU for the call: the helper keeps the main thread waiting only for the difference, when it is longer.
Two-free-cores wall = main-thread CPU + those differences. Also prints the measured wall and the process's CPU
(user + system, both threads). Read-only: the project is never written.

    .venv/bin/python bench/query_threads.py --project P --queries Q.txt
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))     # after PYTHONPATH: an older copy can be timed
from hrag_cli.project import Project  # noqa: E402
from hrag_cli.query import index  # noqa: E402
from hrag_cli.query.run import QuerySession, read_queries  # noqa: E402


class _Tracked:
    """A helper call's future that, when waited for, notes how long the main thread was kept waiting."""

    def __init__(self, future, main_cpu: float, waits: list[float], helper: list[float]) -> None:
        self.future, self.main_cpu, self.waits, self.helper = future, main_cpu, waits, helper

    def result(self):
        between = time.thread_time() - self.main_cpu
        value, spent = self.future.result()
        self.waits.append(max(0.0, spent - between))
        self.helper.append(spent)
        return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--project", type=Path, required=True)
    ap.add_argument("--queries", type=Path, required=True, help="one question per line")
    args = ap.parse_args()
    waits: list[float] = []
    helper: list[float] = []
    handed = getattr(index.QueryIndex, "aside", None)      # None: code without a helper (PYTHONPATH at an older copy)

    def aside(self, fn, *a):
        def timed():
            t = time.thread_time()
            value = fn(*a)
            return value, time.thread_time() - t
        return _Tracked(handed(self, timed), time.thread_time(), waits, helper)

    if handed is not None:
        index.QueryIndex.aside = aside
    project = Project(args.project)
    session = QuerySession(project, project.settings())
    rows = []
    for _, question in read_queries(args.queries):
        waits.clear()
        helper.clear()
        m0, w0, c0 = time.thread_time(), time.perf_counter(), time.process_time()
        session.run(question, mode="ppr")
        main_cpu = time.thread_time() - m0
        rows.append({"main-thread CPU": main_cpu, "helper CPU": sum(helper),
                     "two-free-cores wall": main_cpu + sum(waits), "measured wall": time.perf_counter() - w0,
                     "process CPU": time.process_time() - c0})
    session.close()
    for name in rows[0]:
        ms = [1000 * r[name] for r in rows]
        print(f"{name:20s} p50 {statistics.median(ms):7.1f} ms   per question {[round(x) for x in ms]}")


if __name__ == "__main__":
    main()
