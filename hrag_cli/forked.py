"""Pure-Python work spread over the machine's cores: forked workers that inherit the parent's data, results in
order. A stage that spends its time in Python code (the rules extractor: about 1 ms per chunk, 100k chunks)
runs on one core otherwise.

    forked_map(func, n_jobs, workers=None) -> Iterator   # func(i) for i in range(n_jobs), in order

`func` and whatever it reads are inherited through fork, never pickled; only its results travel back. At
most two jobs per worker are in flight, so the parent holds a bounded number of results whatever `n_jobs`.
Without fork (or with one core) the jobs simply run in this process.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

_func: Callable[[int], Any] | None = None    # set before the pool forks; its workers inherit it


def cores() -> int:
    """The cores this process may run on (the affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _call(i: int) -> Any:
    assert _func is not None
    return _func(i)


def forked_map(func: Callable[[int], Any], n_jobs: int, workers: int | None = None) -> Iterator[Any]:
    """func(0), func(1), ... func(n_jobs - 1), computed in one forked worker per core, yielded in order."""
    workers = min(workers or cores(), n_jobs)
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        yield from (func(i) for i in range(n_jobs))
        return
    global _func
    _func = func
    gc.freeze()     # the workers' collector then leaves the parent's objects (and their shared pages) alone
    # Ctrl-C reaches the whole process group: the parent stops the workers, so they ignore it themselves
    pool = multiprocessing.get_context("fork").Pool(workers, initializer=signal.signal,
                                                    initargs=(signal.SIGINT, signal.SIG_IGN))
    try:
        pending: deque = deque()
        for i in range(n_jobs):
            pending.append(pool.apply_async(_call, (i,)))
            while len(pending) > 2 * workers or (pending and pending[0].ready()):
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
        pool.close()
    finally:
        pool.terminate()
        pool.join()
        gc.unfreeze()
        _func = None
