"""walk.npz's adjacency and key arrays (layout: graph/walk.py) made in blocks, so a large graph's build holds the
arrays it writes and a block's temporaries, not a sort over every entry at once.

Why blocks: one stable argsort over the 2m entries needs an int64 order of 16 bytes an edge and a gather through
it for each array, the largest temporaries of a large graph's build. A counting sort gives the same rows: each
row's size is known from the degrees, and the entries, taken in their order (entry j < m: edge j from its first
end, m + j: from its second), fill their rows from the front; a block's entries are ranked among themselves by
a sort of that block alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

BLOCK = 1 << 20         # entries placed at a time: their temporaries are a few tens of MB


def row_starts(n: int, edges: np.ndarray) -> np.ndarray:
    """walk.npz's indptr: where each vertex's row of entries starts (and where the last ends)."""
    m = len(edges)
    degree = np.zeros(n, dtype=np.int64)
    for lo in range(0, m, BLOCK):
        part = edges[lo:lo + BLOCK]
        degree += np.bincount(part[:, 0], minlength=n)
        degree += np.bincount(part[:, 1], minlength=n)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(degree, out=indptr[1:])
    return indptr


def _placed(edges: np.ndarray, indptr: np.ndarray) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """(side, first edge of the block, the block's edges in the order they are placed, where each goes) for each
    block of entries, in entry order."""
    fill = indptr[:-1].copy()               # where each row's next entry goes
    for side in (0, 1):
        for lo in range(0, len(edges), BLOCK):
            rows = edges[lo:lo + BLOCK, side]
            order = np.argsort(rows, kind="stable")
            sorted_rows = rows[order]
            # each entry's rank among this block's entries of its row: its place in the sorted block minus the
            # place where its row's run begins
            starts = np.flatnonzero(np.diff(sorted_rows, prepend=-1))
            runs = np.diff(starts, append=len(sorted_rows))
            at = fill[sorted_rows] + (np.arange(len(sorted_rows)) - np.repeat(starts, runs))
            fill[sorted_rows[starts]] += runs
            yield side, lo, order, at


def adjacency(n: int, edges: np.ndarray, weight: np.ndarray, kind: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """indptr, cols, weight, kind of walk.npz for undirected `edges` (m, 2) over `n` vertices: row v holds the
    edges of which v is the first end, then those of which it is the second, each in edge order (what a stable
    argsort of the entries' rows gives)."""
    indptr = row_starts(n, edges)
    m = len(edges)
    cols = np.empty(2 * m, dtype=np.int32)
    w_out = np.empty(2 * m, dtype=np.float64)
    k_out = np.empty(2 * m, dtype=np.uint8)
    for side, lo, order, at in _placed(edges, indptr):
        cols[at] = edges[lo:lo + BLOCK, 1 - side][order]
        w_out[at] = weight[lo + order]
        k_out[at] = kind[lo + order]
    return indptr, cols, w_out, k_out


def adjacency_columns(edges: np.ndarray, weight: np.ndarray, kind: np.ndarray, indptr: np.ndarray
                      ) -> tuple[Callable[[], np.ndarray], ...]:
    """`adjacency`'s cols, weight and kind, each made by its own call (a pass over the entries each): a writer
    that saves each before making the next holds one of them at a time."""
    m = len(edges)

    def made(dtype: Any, fill: Callable[[np.ndarray, int, int, np.ndarray, np.ndarray], None]) -> np.ndarray:
        out = np.empty(2 * m, dtype=dtype)
        for side, lo, order, at in _placed(edges, indptr):
            fill(out, side, lo, order, at)
        return out

    def cols(out: np.ndarray, side: int, lo: int, order: np.ndarray, at: np.ndarray) -> None:
        out[at] = edges[lo:lo + BLOCK, 1 - side][order]

    def w(out: np.ndarray, side: int, lo: int, order: np.ndarray, at: np.ndarray) -> None:
        out[at] = weight[lo + order]

    def k(out: np.ndarray, side: int, lo: int, order: np.ndarray, at: np.ndarray) -> None:
        out[at] = kind[lo + order]

    return (lambda: made(np.int32, cols), lambda: made(np.float64, w), lambda: made(np.uint8, k))


def key_arrays(blobs: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """keys, koff and order of walk.npz for the vertex keys `blobs` (UTF-8, in vertex order)."""
    n = len(blobs)
    koff = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(b) for b in blobs], out=koff[1:])
    # UTF-8 bytes sort as their strings do; keys never end in NUL, which numpy's bytes type would drop
    order = np.argsort(np.array(blobs, dtype=bytes), kind="stable").astype(np.int64) if n else np.zeros(0, np.int64)
    return np.frombuffer(b"".join(blobs), dtype=np.uint8), koff, order


class SortedKeys:
    """walk.npz's key arrays of a graph whose last vertices (the entities) come in key order, one run of them
    at a time (`add`): their bytes are kept, never a list of them, and their place among the first vertices'
    keys is found by a binary search of those (few) keys within each run, so no sort covers every key.
    `arrays` falls back on a sort of every key when the runs did not come in order."""

    def __init__(self, first: list[bytes]) -> None:
        self.first = first
        self.first_keys = np.array(first, dtype=bytes) if first else np.zeros(0, dtype="S1")
        self.first_order = np.argsort(self.first_keys, kind="stable") if first else np.zeros(0, np.int64)
        self.sorted_first = self.first_keys[self.first_order]
        self.blob = bytearray(b"".join(first))
        self.lengths: list[np.ndarray] = [np.fromiter(map(len, first), dtype=np.int64, count=len(first))]
        # per first key (in sorted order), the entity keys below it
        self.below = np.zeros(len(first), dtype=np.int64)
        self.after = np.zeros(len(first) + 1, dtype=np.int64)   # difference array: runs wholly below a key
        self.entities = 0
        self.last: bytes | None = None
        self.in_order = True

    def add(self, keys: Iterable[str]) -> None:
        """The next run of entity keys, ascending (after every earlier run)."""
        blobs = [k.encode("utf-8") for k in keys]
        if not blobs:
            return
        self.blob += b"".join(blobs)
        self.lengths.append(np.fromiter(map(len, blobs), dtype=np.int64, count=len(blobs)))
        self.entities += len(blobs)
        if not self.in_order:
            return
        run = np.array(blobs, dtype=bytes)
        if (self.last is not None and not run[0] > np.array([self.last], dtype=bytes)[0]) or \
                (len(run) > 1 and not (run[1:] > run[:-1]).all()):
            self.in_order = False
            return
        self.last = blobs[-1]
        s = self.sorted_first
        # first keys at or below the run's first key have no key of it below them; those above its last, all
        lo = int(np.searchsorted(s, run[0], side="right"))
        hi = int(np.searchsorted(s, run[-1], side="right"))
        if hi > lo:
            self.below[lo:hi] += np.searchsorted(run, s[lo:hi], side="left")
        self.after[hi] += len(run)

    def key(self, v: int) -> str:
        """Vertex v's key (slow: for the rare key whose hash clashes)."""
        lengths = np.concatenate(self.lengths)
        start = int(lengths[:v].sum())
        return self.blob[start:start + int(lengths[v])].decode("utf-8")

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """keys, koff, order: what `key_arrays` gives for every key, first and entity keys."""
        lengths = np.concatenate(self.lengths)
        n = len(lengths)
        koff = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=koff[1:])
        keys = np.frombuffer(self.blob, dtype=np.uint8)
        if not self.in_order:
            blobs = [bytes(self.blob[a:b]) for a, b in zip(koff[:-1].tolist(), koff[1:].tolist())]
            return keys, koff, key_arrays(blobs)[2]
        nf = len(self.first)
        below = self.below + np.cumsum(self.after)[:nf]
        # a first key goes after the entity keys below it and the first keys before it in sorted order; an entity
        # key after the first keys at or below it (equal keys: the lower vertex first, as a stable sort has them)
        order = np.empty(n, dtype=np.int64)
        placed = np.zeros(n, dtype=bool)
        at = np.arange(nf) + below
        order[at] = self.first_order
        placed[at] = True
        order[~placed] = np.arange(nf, n)
        return keys, koff, order
