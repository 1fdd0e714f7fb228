"""Approximate k-nearest-neighbour self-join of unit vectors over overlapping k-means cells.

The synonym pass needs the neighbours of every entity: a self-join, not a stream of queries. Through HNSW that is
a graph build plus one search per entity, slow at a million names and of poor recall on the spread of real name
vectors. Here every vector joins the `per_vector`
cells whose centroids are nearest to it, and two vectors are compared when they share a cell: one matrix product
per cell, at BLAS speed, with exact cosines. Two vectors at cosine c share a cell with a probability that climbs
steeply with c, which suits a pass that keeps only neighbours above a high threshold; the weak neighbours of an
entity (cosine far below the threshold) are found far less reliably (bench/synonyms_scale.py measures the
recall on uniform random vectors, the worst case: no clusters for the centroids to follow). Up to
`per_vector * cell_size` vectors form one cell: an exact join. A large join or cell assignment runs in forked
workers, one per core (forkpool.py): on a large corpus it is most of the synonyms stage.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hrag_cli.core import forkpool

BLOCK_CELLS = 1 << 22        # cosines per matrix product (16 MB of float32)
PARALLEL_MIN = 1 << 26       # cosines a join or a cell assignment computes below which it stays in-process
TASKS_PER_WORKER = 8         # cell ranges per worker process: a slow range (a big cell) does not idle the others


@dataclass
class CellPlan:
    """Where the cells are: unit centroids (none: one cell holding everything) of the vectors less their mean,
    and the vector count they were fitted at, so the caller can refit as the collection grows."""
    centroids: np.ndarray           # (cells, dim) float32; (0, dim) for the single exact cell
    mean: np.ndarray                # (dim,) float32, subtracted before assignment
    fit_count: int

    @property
    def cells(self) -> int:
        return max(1, len(self.centroids))


def cell_count(n: int, per_vector: int, cell_size: int) -> int:
    """Cells for n vectors: one (exact) while that is no more work than the cells would be."""
    if n <= per_vector * cell_size:
        return 1
    return math.ceil(n * per_vector / cell_size)


def _centred(x: np.ndarray, mean: np.ndarray, in_place: bool = False) -> np.ndarray:
    """Rows less the mean, re-normalised. Sentence embeddings share a common direction; on raw vectors the
    centroids near it are among the nearest of nearly every row and their cells swell, and the join's work with
    them. Centring moves no vector relative to another, so near pairs stay near. `in_place`: in `x` itself (a
    copy the caller made), so no second sample-sized array is held."""
    y = np.subtract(x, mean, out=x if in_place else None)
    norms = np.linalg.norm(y, axis=1, keepdims=True)
    y /= np.where(norms > 0, norms, 1)
    return y


def fit_cells(matrix: np.ndarray, per_vector: int, cell_size: int, seed: int = 0, sample: int = 100_000,
              rounds: int = 6) -> CellPlan:
    """Spherical k-means on a sample of the centred rows (deterministic for a given matrix); an emptied centroid
    is re-seeded on a random sample row so no cell is wasted."""
    n, dim = matrix.shape
    c = min(cell_count(n, per_vector, cell_size), n)      # cells smaller than per_vector ask for more than n
    rng = np.random.default_rng(seed)
    x = matrix[np.sort(rng.choice(n, size=min(n, max(sample, 2 * c)), replace=False))]
    mean = x.mean(axis=0, dtype=np.float64).astype(np.float32)
    if c == 1:
        return CellPlan(np.zeros((0, dim), dtype=np.float32), mean, n)
    x = _centred(x, mean, in_place=True)
    cent = x[rng.choice(len(x), size=c, replace=False)].copy()
    for _ in range(rounds):
        near = nearest_cells(x, CellPlan(cent, np.zeros(dim, np.float32), n), 1)[:, 0]
        order = np.argsort(near, kind="stable")
        counts = np.bincount(near, minlength=c)
        sums = np.zeros_like(cent)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        full = counts > 0
        sums[full] = np.add.reduceat(x[order], starts[full], axis=0)
        empty = ~full
        sums[empty] = x[rng.choice(len(x), size=int(empty.sum()), replace=False)]
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        cent = (sums / np.where(norms > 0, norms, 1)).astype(np.float32)
    return CellPlan(cent, mean, n)


def nearest_cells(matrix: np.ndarray, plan: CellPlan, r: int, block: int | None = None,
                  on_rows: Callable[[int], None] | None = None, parallel_min: int | None = None) -> np.ndarray:
    """(n, r) int32: per row the r cells whose centroids are nearest to it, in no particular order; [[0]] per
    row for the single cell. At least `parallel_min` cosines (rows x cells; default PARALLEL_MIN) are computed
    in forked workers, one per core. `on_rows(count)` reports progress."""
    n = len(matrix)
    if len(plan.centroids) == 0:
        if on_rows is not None:
            on_rows(n)
        return np.zeros((n, 1), dtype=np.int32)
    r = min(r, len(plan.centroids))
    out = np.empty((n, r), dtype=np.int32)
    parallel = n * len(plan.centroids) >= (PARALLEL_MIN if parallel_min is None else parallel_min)
    block = block or min(8192, max(64, 4 * BLOCK_CELLS // len(plan.centroids)))    # 64 MB of cosines at most
    blocks = forkpool.ranges(n, block)
    for s, near in forkpool.run_tasks(_nearest_block, (matrix, plan, r), blocks, parallel):
        out[s:s + len(near)] = near
        if on_rows is not None:
            on_rows(len(near))
    return out


def _nearest_block(job: tuple[np.ndarray, CellPlan, int], span: tuple[int, int]) -> tuple[int, np.ndarray]:
    """(first row, nearest cells) of the rows s <= row < e."""
    matrix, plan, r = job
    s, e = span
    centroids = plan.centroids
    if r == len(centroids):
        return s, np.broadcast_to(np.arange(r, dtype=np.int32), (e - s, r)).copy()
    sims = _centred(matrix[s:e], plan.mean) @ centroids.T
    if r == 1:
        return s, sims.argmax(axis=1).astype(np.int32)[:, None]
    # partition finds each row's r-th best cosine; a mask then picks the cells at or above it (faster than
    # argpartition on wide rows), keeping the first r where ties give more
    out = np.empty((e - s, r), dtype=np.int32)
    kth = np.partition(sims, -r, axis=1)[:, -r]
    rows, cols = np.nonzero(sims >= kth[:, None])
    slot = np.arange(len(rows)) - np.searchsorted(rows, rows)
    ok = slot < r
    out[rows[ok], slot[ok]] = cols[ok]
    return s, out


def members(cells: np.ndarray, n_cells: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, slots, bounds): rows[bounds[c]:bounds[c + 1]] are the rows in cell c, ascending, and c is
    cells[row, slot] (which of the row's cells it is)."""
    flat = cells.ravel()
    # stable either way; as uint16 numpy sorts by radix, far faster than a comparison sort of the slots
    order = np.argsort(flat.astype(np.uint16) if n_cells <= 1 << 16 else flat, kind="stable")
    rows = (order // cells.shape[1]).astype(np.int64)
    bounds = np.zeros(n_cells + 1, dtype=np.intp)            # rows of cells before c: counted, not searched
    np.cumsum(np.bincount(flat, minlength=n_cells)[:n_cells], out=bounds[1:])
    return rows, (order % cells.shape[1]).astype(np.int64), bounds


@dataclass
class Joined:
    """What a join found: candidates for the queried rows, and offers of queried rows to the other rows."""
    rows: np.ndarray          # the queried rows, ascending
    nbr: np.ndarray           # (len(rows), cells per row * k) int32: up to k from each cell, -1 padded; may repeat
    sim: np.ndarray           # their exact cosines, -inf padded
    offer_to: np.ndarray      # offers: an unqueried row ...
    offer_from: np.ndarray    # ... may take this queried row ...
    offer_sim: np.ndarray     # ... at this cosine




@dataclass
class _Join:
    """One join's inputs and outputs, read by the workers forked from the process that made it: each cell range
    writes the candidate slots of its own (row, cell) pairs into `nbr` and `sim` (shared arrays when forked)."""
    matrix: np.ndarray
    query: np.ndarray
    listed: np.ndarray        # the queried rows whose candidates this join lists (and offers to the others)
    qpos: np.ndarray          # row -> its row in nbr/sim (-1: not queried)
    rows_in: np.ndarray
    slot_in: np.ndarray
    bounds: np.ndarray
    k: int
    floor: np.ndarray
    min_sim: float
    nbr: np.ndarray
    sim: np.ndarray


def _best_per(group: np.ndarray, value: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions, ranks) of the k highest values of each group, by group then best first (equal values in
    their given order): a queried row's candidates, a kept member's offers."""
    order = np.lexsort((-value, group))
    g = group[order]
    rank = np.arange(len(g)) - np.searchsorted(g, g)
    top = rank < k
    return order[top], rank[top]


def _join_cells(j: _Join, span: tuple[int, int]) -> tuple[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Join the cells c0 <= c < c1: (queried rows done, offers to unqueried members)."""
    k, matrix, query = j.k, j.matrix, j.query
    done = 0
    offers: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for c in range(*span):
        b0, b1 = j.bounds[c], j.bounds[c + 1]
        mem, mslot = j.rows_in[b0:b1], j.slot_in[b0:b1]
        qmask = query[mem]
        lmask = j.listed[mem]
        q, qslot = mem[lmask], mslot[lmask]
        done += len(q)
        if len(q) == 0 or len(mem) < 2:
            continue
        kept = mem[~qmask]
        floor = j.floor[kept]
        width = min(k, len(mem) - 1)
        step = max(1, BLOCK_CELLS // len(mem))
        self_col = np.searchsorted(mem, q)
        vectors_t = matrix[mem].T
        got: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []     # offers: (kept member, queried row, cosine)
        for s in range(0, len(q), step):
            part = q[s:s + step]
            sims = matrix[part] @ vectors_t
            sims[np.arange(len(part)), self_col[s:s + step]] = -np.inf    # never its own neighbour
            r, col = np.nonzero(sims >= j.min_sim)
            v = sims[r, col]
            pick, rank = _best_per(r, v, width)
            r, col, v = r[pick], col[pick], v[pick]
            at, slot = j.qpos[part][r], qslot[s:s + step][r] * k + rank
            j.nbr[at, slot] = mem[col]
            j.sim[at, slot] = v
            if len(kept):
                ks = sims[:, ~qmask]
                r, x = np.nonzero((ks > floor) & (ks >= j.min_sim))     # the offers that beat the member's k-th
                got.append((x, part[r], ks[r, x]))
        if got:
            # each member takes its k best offers of this cell: the cosines beating its floor are few (a small
            # run puts a few queried rows in a cell of many), so they are ranked after the comparison instead of
            # partitioning every member's column of cosines first
            x, src, cos = (np.concatenate(arrays) for arrays in zip(*got))
            pick, _ = _best_per(x, cos, k)
            offers.append((kept[x[pick]], src[pick], cos[pick]))
    return done, offers


def spans(cost: np.ndarray, parts: int) -> list[tuple[int, int]]:
    """Consecutive ranges of items (cells) of about equal total cost, at most `parts` of them, none empty."""
    if len(cost) == 0:
        return []
    total = np.cumsum(cost, dtype=np.float64)
    ends = np.searchsorted(total, total[-1] * np.arange(1, parts) / parts) + 1     # after the item reaching it
    cuts = np.unique(np.concatenate([[0], ends, [len(cost)]]))
    return [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def join(matrix: np.ndarray, cells: np.ndarray, n_cells: int, query: np.ndarray, k: int, floor: np.ndarray,
         on_cell: Callable[[int], None] | None = None, min_sim: float = -np.inf,
         parallel_min: int | None = None, listed: np.ndarray | None = None,
         cell_members: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> Joined:
    """Compare each queried row (`query`, a bool mask) with every row sharing one of its cells. An unqueried
    member x of a cell is offered the k best queried rows of that cell that beat floor[x] (its k-th neighbour
    so far: a later run adds a few entities to cells of thousands, and most members need none of them).
    Neighbours below `min_sim` are never kept: a caller that only wants neighbours above a threshold lets the
    join pick candidates with one comparison per cosine instead of a partition of every row (a large part of
    the join). A join of at least `parallel_min` cosines (default PARALLEL_MIN) runs its cells in
    forked workers, one per core (forkpool.py), each writing the slots of its own (row, cell) pairs.
    `listed` (a bool mask within `query`, default all of it): only these queried rows are compared and offered,
    so a caller can join a large query in parts (`join_parts`), holding one part's candidates at a time;
    `cell_members`: `members(cells, n_cells)`, when the caller made it once for its parts.
    `on_cell(done_rows)` reports progress."""
    n = len(matrix)
    listed = query if listed is None else listed
    qrows = np.nonzero(listed)[0]
    rows_in, slot_in, bounds = cell_members or members(cells, n_cells)
    upto = np.concatenate([[0], np.cumsum(listed[rows_in], dtype=np.int64)])
    cost = (upto[bounds[1:]] - upto[bounds[:-1]]) * np.diff(bounds)     # per cell: queried rows x members
    parallel = int(cost.sum()) >= (PARALLEL_MIN if parallel_min is None else parallel_min) and forkpool.workers() > 1
    shape = (len(qrows), cells.shape[1] * k)
    nbr = forkpool.shared_array(shape, np.int32, -1) if parallel else np.full(shape, -1, dtype=np.int32)
    sim = forkpool.shared_array(shape, np.float32, -np.inf) if parallel else np.full(shape, -np.inf, np.float32)
    qpos = np.full(n, -1, dtype=np.int64)
    qpos[qrows] = np.arange(len(qrows))
    work = _Join(matrix, query, listed, qpos, rows_in, slot_in, bounds, k, floor, min_sim, nbr, sim)
    tasks = spans(cost, TASKS_PER_WORKER * max(2, forkpool.workers()))    # in-process too: progress per range
    offers: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for done, found in forkpool.run_tasks(_join_cells, work, tasks, parallel):
        offers.extend(found)
        if on_cell is not None:
            on_cell(done)
    # a forked join's candidates stay in the shared mappings (the caller ranks them, then lets them go): a copy
    # out of them would hold the largest arrays of the pass twice
    if offers:
        return Joined(qrows, nbr, sim, *(np.concatenate(x) for x in zip(*offers)))
    none = np.zeros(0, dtype=np.int64)
    return Joined(qrows, nbr, sim, none, none, np.zeros(0, dtype=np.float32))
