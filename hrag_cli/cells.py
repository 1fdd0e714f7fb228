"""Approximate k-nearest-neighbour self-join of unit vectors over overlapping k-means cells.

The synonym pass needs the neighbours of every entity: a self-join, not a stream of queries. Through HNSW that is
a graph build plus one search per entity, which took 6 minutes for 1M low-rank vectors on this 2-core machine and
22 for 1M with the spread of real name vectors (recall@10 0.99 and 0.63). Here every vector joins the `per_vector`
cells whose centroids are nearest to it, and two vectors are compared when they share a cell: one matrix product
per cell, at BLAS speed, with exact cosines. Two vectors at cosine c share a cell with a probability that climbs
steeply with c, which suits a pass that keeps only neighbours above a high threshold. On uniform random unit
vectors (dim 384: the worst case, no clusters for the centroids to follow), with 10 of 8000 cells each, pairs
share a cell 84 % of the time at cosine 0.7, 96 % at 0.8 and 99.9 % at 0.9; the weak neighbours of an entity
(cosine far below the threshold) are found far less reliably. bench/synonyms_scale.py measures both. Up to
`per_vector * cell_size` vectors form one cell: an exact join.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

BLOCK_CELLS = 1 << 22        # cosines per matrix product (16 MB of float32)


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


def _centred(x: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """Rows less the mean, re-normalised. Sentence embeddings share a common direction; on raw vectors the
    centroids near it are among the nearest of nearly every row and their cells swell (measured on vectors with
    the spread of MiniLM names: the largest cell 20x the mean, the join 5.5x the work of even cells; centred:
    9x and 2x). Centring moves no vector relative to another, so near pairs stay near."""
    y = x - mean
    norms = np.linalg.norm(y, axis=1, keepdims=True)
    return y / np.where(norms > 0, norms, 1)


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
    x = _centred(x, mean)
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


def nearest_cells(matrix: np.ndarray, plan: CellPlan, r: int, block: int = 8192,
                  on_rows: Callable[[int], None] | None = None) -> np.ndarray:
    """(n, r) int32: per row the r cells whose centroids are nearest to it, in no particular order; [[0]] per
    row for the single cell. `on_rows(count)` reports progress."""
    n = len(matrix)
    centroids = plan.centroids
    if len(centroids) == 0:
        if on_rows is not None:
            on_rows(n)
        return np.zeros((n, 1), dtype=np.int32)
    r = min(r, len(centroids))
    out = np.empty((n, r), dtype=np.int32)
    for s in range(0, n, block):
        if r == len(centroids):
            out[s:s + block] = np.arange(r, dtype=np.int32)
        else:
            sims = _centred(matrix[s:s + block], plan.mean) @ centroids.T
            if r == 1:
                out[s:s + block, 0] = sims.argmax(axis=1)
            else:
                # partition finds each row's r-th best cosine; a mask then picks the cells at or above it
                # (faster than argpartition on wide rows), keeping the first r where ties give more
                kth = np.partition(sims, -r, axis=1)[:, -r]
                rows, cols = np.nonzero(sims >= kth[:, None])
                slot = np.arange(len(rows)) - np.searchsorted(rows, rows)
                ok = slot < r
                out[s + rows[ok], slot[ok]] = cols[ok]
        if on_rows is not None:
            on_rows(min(block, n - s))
    return out


def members(cells: np.ndarray, n_cells: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, bounds): rows[bounds[c]:bounds[c + 1]] are the rows in cell c, ascending."""
    flat = cells.ravel()
    order = np.argsort(flat, kind="stable")
    rows = (order // cells.shape[1]).astype(np.int64)
    bounds = np.searchsorted(flat[order], np.arange(n_cells + 1))
    return rows, bounds


@dataclass
class Joined:
    """What a join found: candidates for the queried rows, and offers of queried rows to the other rows."""
    rows: np.ndarray          # the queried rows, ascending
    nbr: np.ndarray           # (len(rows), cells per row * k) int32: up to k from each cell, -1 padded; may repeat
    sim: np.ndarray           # their exact cosines, -inf padded
    offer_to: np.ndarray      # offers: an unqueried row ...
    offer_from: np.ndarray    # ... may take this queried row ...
    offer_sim: np.ndarray     # ... at this cosine


def join(matrix: np.ndarray, cells: np.ndarray, n_cells: int, query: np.ndarray, k: int, floor: np.ndarray,
         on_cell: Callable[[int], None] | None = None, min_sim: float = -np.inf) -> Joined:
    """Compare each queried row (`query`, a bool mask) with every row sharing one of its cells. An unqueried
    member x of a cell is offered the k best queried rows of that cell that beat floor[x] (its k-th neighbour
    so far: a later run adds a few entities to cells of thousands, and most members need none of them).
    Neighbours below `min_sim` are never kept: a caller that only wants neighbours above a threshold lets the
    join pick candidates with one comparison per cosine instead of a partition of every row (at 66k entities
    the partition was a third of the join). `on_cell(done_rows)` reports progress."""
    n = len(matrix)
    qrows = np.nonzero(query)[0]
    slots = cells.shape[1]
    nbr = np.full((len(qrows), slots * k), -1, dtype=np.int32)
    sim = np.full((len(qrows), slots * k), -np.inf, dtype=np.float32)
    qpos = np.full(n, -1, dtype=np.int64)
    qpos[qrows] = np.arange(len(qrows))
    slot_of = np.zeros(n, dtype=np.int64)      # per row, how many of its cells have been done
    rows_in, bounds = members(cells, n_cells)
    offers: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for c in range(n_cells):
        mem = rows_in[bounds[c]:bounds[c + 1]]
        qmask = query[mem]
        q = mem[qmask]
        if len(q) == 0 or len(mem) < 2:
            if on_cell is not None:
                on_cell(len(q))
            continue
        kept = mem[~qmask]
        width = min(k, len(mem) - 1)
        step = max(1, BLOCK_CELLS // len(mem))
        self_col = np.searchsorted(mem, q)
        vectors_t = matrix[mem].T
        best_src: list[np.ndarray] = []
        best_sim: list[np.ndarray] = []
        for s in range(0, len(q), step):
            part = q[s:s + step]
            sims = matrix[part] @ vectors_t
            sims[np.arange(len(part)), self_col[s:s + step]] = -np.inf    # never its own neighbour
            r, c = np.nonzero(sims >= min_sim)              # row-major: r ascending
            v = sims[r, c]
            order = np.lexsort((-v, r))                      # per row, best first
            r, c, v = r[order], c[order], v[order]
            rank = np.arange(len(r)) - np.searchsorted(r, r)
            top = rank < width
            r, rank = r[top], rank[top]
            at, col = qpos[part][r], slot_of[part][r] * k + rank
            nbr[at, col] = mem[c[top]]
            sim[at, col] = v[top]
            if len(kept):
                ks = sims[:, ~qmask]
                if len(part) > k:
                    pick = np.argpartition(ks, -k, axis=0)[-k:]
                    best_src.append(part[pick])
                    best_sim.append(np.take_along_axis(ks, pick, 0))
                else:
                    best_src.append(np.broadcast_to(part[:, None], ks.shape))
                    best_sim.append(ks)
        slot_of[q] += 1
        if len(kept):
            src, cos = np.concatenate(best_src), np.concatenate(best_sim)
            if len(src) > k:     # several row blocks: the k best over all of them
                pick = np.argpartition(cos, -k, axis=0)[-k:]
                src, cos = np.take_along_axis(src, pick, 0), np.take_along_axis(cos, pick, 0)
            better = (cos > floor[kept]) & (cos >= min_sim)
            offers.append((np.broadcast_to(kept, src.shape)[better], src[better], cos[better]))
        if on_cell is not None:
            on_cell(len(q))
    if offers:
        return Joined(qrows, nbr, sim, *(np.concatenate(x) for x in zip(*offers)))
    none = np.zeros(0, dtype=np.int64)
    return Joined(qrows, nbr, sim, none, none, np.zeros(0, dtype=np.float32))
