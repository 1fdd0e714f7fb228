"""Exact top-k over scored rows: a block-by-block merge of candidates (ties to the lower row), and
`top_order`, the m best of a score array without sorting the rest."""

from __future__ import annotations

import numpy as np

POSTING_QUERIES = 16         # up to this many queries at once are scored through the column postings


def _merge_topk(parts: list[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Best k of per-block candidates (rows, sims), best first (ties: lower row)."""
    rows, sims = np.concatenate([r for r, _ in parts], axis=1), np.concatenate([x for _, x in parts], axis=1)
    if rows.shape[1] > k:
        part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        rows, sims = np.take_along_axis(rows, part, 1), np.take_along_axis(sims, part, 1)
    order = np.lexsort((rows, -sims), axis=1)
    return np.take_along_axis(rows, order, axis=1), np.take_along_axis(sims, order, axis=1).astype(np.float32)


def _block_topk(sims: np.ndarray, offset: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    kk = min(k, sims.shape[1])
    part = np.argpartition(-sims, kk - 1, axis=1)[:, :kk] if kk < sims.shape[1] else \
        np.broadcast_to(np.arange(sims.shape[1]), sims.shape).copy()
    return part + offset, np.take_along_axis(sims, part, axis=1)


def exact_search(rows_store, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact cosine top-k over a DenseRows or SparseRows: (rows int64 (nq, k), sims float32), best first."""
    q = np.ascontiguousarray(queries, dtype=np.float32)
    k = min(k, len(rows_store))
    if k <= 0:
        return np.zeros((len(q), 0), dtype=np.int64), np.zeros((len(q), 0), dtype=np.float32)
    if getattr(rows_store, "postings", None) is not None and len(q) <= POSTING_QUERIES:
        tops = [rows_store.posting_top(x, k) for x in q]
        return (np.stack([r for r, _ in tops]).astype(np.int64),
                np.stack([s for _, s in tops]).astype(np.float32))
    return _merge_topk([_block_topk(sims, s, k) for s, sims in rows_store.blocks(q)], k)


def top_order(scores: np.ndarray, m: int) -> np.ndarray:
    """`np.argsort(-scores, kind="stable")[:m]` (the m best, ties to the lower index: `_merge_topk`'s order)
    without sorting the rest. Over blocks of the scores, the m-th best block maximum is a floor no m-th best
    score is under, so only the scores at or above it are sorted (a fact search: a dozen of millions, where a
    partition or a sort of every score costs a pass over all of them)."""
    n = len(scores)
    m = min(m, n)
    if n <= 4 * m or m <= 0:
        return np.argsort(-scores, kind="stable")[:m]
    width = max(1, n // (2 * m))
    blocks = n // width
    # any blocks do; numpy takes maxima fastest along long rows: short blocks as columns (block r holds every
    # blocks-th score from r), long ones as rows
    grid = scores[: blocks * width]
    peaks = grid.reshape(width, blocks).max(axis=0) if width < blocks else grid.reshape(blocks, width).max(axis=1)
    floor = np.partition(peaks, len(peaks) - m)[len(peaks) - m]
    cand = np.flatnonzero(scores >= floor)
    if len(cand) < m:                      # NaN compares false: sort every score as argsort would
        return np.argsort(-scores, kind="stable")[:m]
    return cand[np.argsort(-scores[cand], kind="stable")][:m]
