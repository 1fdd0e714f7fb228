"""Worker processes forked from this one, one per core, that see its memory as it was at the fork.

Why fork: the synonyms stage's heavy steps (builtin embedding, the k-means cells, the name join) read arrays of
hundreds of MB (the folded name vectors, the cells and their members). Forked workers read them in place,
without pickling or copying them; what they return is small, and a large result goes into a `shared_array`
made before the fork. Python's collector is frozen across the fork, so a worker's collections leave the
parent's objects (and the pages they share) alone. Ctrl-C reaches the whole process group: the parent stops
the workers, so they ignore it themselves.

    with forked_pool(state) as pool: ...        # a multiprocessing Pool; its workers see `state`
    for r in run_tasks(fn, state, tasks): ...   # fn(state, task) per task, in workers when that pays, any order
    for r in forked_map(fn, state, tasks): ...  # the same in task order, tasks streamed, bounded in flight
"""

from __future__ import annotations

import gc
import mmap
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from multiprocessing.pool import Pool
from typing import Any, TypeVar

import numpy as np

from hrag_cli.core import heap

S = TypeVar("S")
T = TypeVar("T")
R = TypeVar("R")
_state: Any = None          # set before a pool forks; its workers inherit it


def workers() -> int:
    """Worker processes a pool gets (one per core); below 2, or without fork, callers stay in this process."""
    n = os.cpu_count() or 1
    return n if n >= 2 and "fork" in multiprocessing.get_all_start_methods() else 1


@contextmanager
def forked_pool(shared: Any) -> Iterator[Pool]:
    """A pool of `workers()` forked processes whose `state()` is `shared`."""
    global _state
    _state = shared
    gc.freeze()
    heap.give_back()
    pool = multiprocessing.get_context("fork").Pool(workers(), initializer=_worker_signals)
    try:
        yield pool
        pool.close()
    finally:
        pool.terminate()
        pool.join()
        gc.unfreeze()
        _state = None


def _worker_signals() -> None:
    """A worker leaves Ctrl-C to the parent, and ends at once on the SIGTERM the parent's pool.terminate()
    sends (not through the parent's handler, core.interrupt, which it inherits)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _call(job: tuple[Callable[[Any, Any], Any], Any]) -> Any:
    fn, task = job
    return fn(_state, task)


def run_tasks(fn: Callable[[S, T], R], shared: S, tasks: list[T], parallel: bool = True) -> Iterator[R]:
    """fn(shared, task) for each task, as they finish: in forked workers when `parallel`, there are two tasks or
    more and more than one core, else here in order. `fn` must be a module-level function (it is sent by name)."""
    if not parallel or len(tasks) < 2 or workers() < 2:
        for task in tasks:
            yield fn(shared, task)
        return
    with forked_pool(shared) as pool:
        yield from pool.imap_unordered(_call, [(fn, t) for t in tasks])


def forked_map(fn: Callable[[S, T], R], shared: S, tasks: Iterable[T], parallel: bool = True) -> Iterator[R]:
    """fn(shared, task) for each task, yielded in task order: in forked workers when `parallel` and there is
    more than one core, else here. `tasks` is consumed as results are taken and at most two per worker are in
    flight, so the parent holds a bounded number of results however many tasks a stream brings (the builtin
    embedder's batches, the rules extractor's chunk ranges). `fn` must be a module-level function."""
    if not parallel or workers() < 2:
        for task in tasks:
            yield fn(shared, task)
        return
    with forked_pool(shared) as pool:
        pending: deque = deque()
        for task in tasks:
            pending.append(pool.apply_async(_call, ((fn, task),)))
            while len(pending) > 2 * workers() or (pending and pending[0].ready()):
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def ranges(n: int, step: int) -> list[tuple[int, int]]:
    """[start, stop) of consecutive runs of `step` over n items: the tasks of a job split by position."""
    return [(s, min(n, s + step)) for s in range(0, n, step)]


def shared_array(shape: tuple[int, ...], dtype: Any, fill: Any) -> np.ndarray:
    """An array in an anonymous shared mapping, filled with `fill`: made before a pool forks, what its workers
    write into it the parent reads (each worker writing its own cells of it)."""
    count = int(np.prod(shape, dtype=np.int64))
    buf = mmap.mmap(-1, max(1, count * np.dtype(dtype).itemsize))
    out = np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)
    out[...] = fill
    return out
