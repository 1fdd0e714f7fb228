"""SYNONYM edges from the neighbour lists: the narrowed vectors the neighbour search runs on (`fold`), the
exact cosines put back (`rescore`), and the pairs at or above the threshold whose names may be linked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hrag_cli.core import store
from hrag_cli.core.config import Settings
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir
from hrag_cli.embed.indices import EMBED_BLOCK, NAMES
from hrag_cli.embed.knn import KnnLists, decoded, update_knn
from hrag_cli.storage.vectors.dense import DenseRows
from hrag_cli.storage.vectors.layout import BAND
from hrag_cli.storage.vectors.sparse import SparseRows

KNN_FILE = f"{NAMES}.knn.npz"     # the neighbour lists of the name vectors


def name_chars(name: str) -> int:
    return sum(map(str.isalnum, name))


FOLD_DIM = 256     # columns the neighbour search of sparse (builtin) name vectors runs in
assert BAND % FOLD_DIM == 0, "fold reads a column mod FOLD_DIM off its byte within its band"
# How far below the threshold the neighbour search keeps candidates: only neighbours at or above the threshold
# become pairs, so weaker ones are never listed. Folded cosines stray from the exact ones, by well under this
# margin on the scale benchmark's corpus (bench/scale.py), so it leaves room.
FOLD_MARGIN = 0.3
EXACT_MARGIN = 1e-3    # unfolded vectors are searched at their own cosines: float rounding only


def fold(rows: DenseRows | SparseRows) -> np.ndarray | None:
    """The matrix the neighbour search runs on for sparse name vectors (None: search the vectors themselves).
    The builtin embedder's names fill a few dozen of 2048 hashed buckets; folded to FOLD_DIM columns (bucket b
    adds into b mod FOLD_DIM, i.e. the same features hashed into fewer buckets) the self-join, which costs in
    proportion to the width, runs 8x narrower, and `rescore` puts the exact full-width cosines back, so
    thresholds and edge weights are unchanged."""
    if not isinstance(rows, SparseRows) or rows.dim <= FOLD_DIM or rows.dim % FOLD_DIM:
        return None
    n = len(rows)
    out = np.empty((n, FOLD_DIM), dtype=np.float32)
    # a value's column mod FOLD_DIM is its byte within its band (`SparseRows.low`, bands of BAND columns: see the
    # assert below FOLD_DIM), and a block's values lie in one run of the row arrays: no `take` of each block's columns
    # (the sums in float64, each row then cast, normed and divided in place in its slice of `out`: the same
    # floats as a float32 copy normed by np.linalg.norm, with fewer whole-matrix passes)
    low, data, ptr = rows.low, rows.data, rows.indptr
    for s in range(0, n, EMBED_BLOCK):
        e = min(n, s + EMBED_BLOCK)
        a, b = int(ptr[s]), int(ptr[e])
        cell = np.repeat(np.arange(0, (e - s) * FOLD_DIM, FOLD_DIM, dtype=np.int64), np.diff(ptr[s:e + 1]))
        cell += low[a:b] if FOLD_DIM == BAND else low[a:b] % FOLD_DIM      # uint8 % 256 would overflow
        f = out[s:e]
        np.copyto(f, np.bincount(cell, weights=data[a:b].astype(np.float64), minlength=(e - s) * FOLD_DIM
                                 ).reshape(e - s, FOLD_DIM), casting="same_kind")
        norms = np.sqrt(np.add.reduce(f * f, axis=1, keepdims=True))
        f /= np.where(norms > 0, norms, 1)
    return out


def rescore(knn: KnnLists, full: SparseRows, rows: np.ndarray | None = None, block: int = 4096,
            slots: np.ndarray | None = None) -> None:
    """Replace the cosines of the lists of `rows` (default: all, or those with a slot in `slots`) by exact ones
    from the full (sparse) vectors and re-order each list by them. Each neighbour's stored values are multiplied
    into the row's dense vector: a name fills a few dozen of the 2048 columns, so this touches a small share of
    what densifying both sides would. `slots` ((n, k) bool): only those slots' cosines are computed, the others
    are exact already (a small run offers many kept lists a row or two; their other slots are the cosines an
    earlier rescore gave, which it would give again)."""
    n, k = knn.nbr.shape
    if rows is None:
        rows = np.arange(n) if slots is None else np.flatnonzero(slots.any(axis=1))
    rows = np.asarray(rows, dtype=np.int64)
    # A featureless name (a bare number) gets a fully dense fallback vector and is a neighbour of many lists:
    # such rows are densified once and dotted as dense vectors, not spelled out value by value per list.
    heavy = np.flatnonzero(np.diff(full.indptr) > full.dim // 8)
    heavy_at = np.full(len(full), -1, dtype=np.int64)
    heavy_at[heavy] = np.arange(len(heavy))
    heavy_rows = full.dense(heavy)
    # the rows' dense vectors in one buffer whose written entries are zeroed again after each block (a small
    # run extends few of the lists: a fresh (block, dim) array each block would be most of the work)
    a = np.zeros((min(block, len(rows)), full.dim), dtype=np.float32)
    for s in range(0, len(rows), block):
        at = rows[s:s + block]
        nbr = knn.nbr[at]
        ok = nbr >= 0
        lens, cols, vals = full.take(at)
        filled = (np.repeat(np.arange(len(at)), lens), cols)
        a[filled] = vals
        todo = np.flatnonzero(ok if slots is None else ok & slots[at])    # the slots computed
        flat = nbr.ravel()[todo].astype(np.int64)
        hv = heavy_at[flat]
        light = np.flatnonzero(hv < 0)
        lens, cols, vals = full.take(flat[light])
        pair = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
        dots = np.zeros(len(flat), dtype=np.float64)
        dots[light] = np.bincount(pair, weights=a[todo[light[pair]] // k, cols] * vals, minlength=len(lens))
        dense_at = np.flatnonzero(hv >= 0)
        dots[dense_at] = np.einsum("id,id->i", a[todo[dense_at] // k], heavy_rows[hv[dense_at]])
        sims = np.where(ok, knn.sim[at], -np.inf).astype(np.float32)
        sims.ravel()[todo] = dots
        order = np.lexsort((np.where(ok, nbr, np.iinfo(np.int32).max), -sims), axis=1)
        knn.nbr[at] = np.take_along_axis(np.where(ok, nbr, -1), order, 1)
        knn.sim[at] = np.take_along_axis(sims, order, 1)
        a[filled] = 0


FLOOR_MIN_ENTITIES = 100     # fewer linkable entities with a neighbour: too few to rank, the threshold alone


def similarity_floor(knn: KnnLists, linkable: np.ndarray, threshold: float, top_share: float) -> float:
    """The cosine a pair needs: the threshold, or the cosine to its nearest linkable neighbour that only the
    best-matched `top_share` of the linkable entities reach, when that is higher (an entity with no listed
    neighbour ranks below every one). 0 or 1, or under FLOOR_MIN_ENTITIES ranked: the threshold alone."""
    if not 0 < top_share < 1 or not len(knn.nbr):
        return threshold
    nbr = knn.nbr
    listed = (nbr >= 0) & (nbr != np.arange(len(nbr))[:, None]) & linkable[np.maximum(nbr, 0)]
    best = np.where(listed, knn.sim, -np.inf).max(axis=1)[linkable]
    if int(np.isfinite(best).sum()) < FLOOR_MIN_ENTITIES:
        return threshold
    at = np.sort(best)[min(len(best) - 1, int(np.ceil((1.0 - top_share) * len(best))))]
    return max(threshold, float(at)) if np.isfinite(at) else threshold


def names_only(knn: KnnLists, linkable: np.ndarray, floor: float) -> np.ndarray:
    """`linkable` less the entities in a pair at or above `floor` that are not names: dates, quantities and bare
    numbers ("12 october 2025" ~ "14 october 2025"), function words. Judged on the ids (normalised names), so
    an incremental run reads no names."""
    from hrag_cli.extract.rules import is_name

    rows = np.flatnonzero(linkable & ((knn.nbr >= 0) & (knn.sim >= floor)).any(axis=1))
    if not len(rows):
        return linkable
    out = linkable.copy()
    keys = knn.keys[rows]
    out[rows] = np.fromiter((is_name(k.decode("utf-8")) for k in keys.tolist()), dtype=bool, count=len(rows))
    return out


def candidate_pairs(knn: KnnLists, ok: Callable[[str], bool] | np.ndarray, threshold: float
                    ) -> dict[tuple[str, str], float]:
    """(a, b) with a < b -> similarity, for every listed neighbour at or above the threshold, both `ok` (a
    predicate on ids, asked only of the entities in such a pair: a fraction of them; or a bool per row)."""
    lo, hi, s, named = _pair_rows(knn, ok, threshold)
    pairs: dict[tuple[str, str], float] = {}
    for x, y, v in zip(lo.tolist(), hi.tolist(), s.tolist()):
        ia, ib = named[x], named[y]
        pairs[(ia, ib) if ia < ib else (ib, ia)] = v
    return pairs


def pair_records(knn: KnnLists, ok: np.ndarray, threshold: float) -> list[dict] | None:
    """The records of `candidate_pairs` in (a, b) order ({a, b, similarity} rounded to 6 places), made from
    the row pairs without a dict of every pair and its sort; None when the lists' rows are not in id order
    (then their order is not the ids')."""
    keys = knn.keys
    if len(keys) > 1 and not bool((keys[1:] > keys[:-1]).all()):
        return None
    lo, hi, s, named = _pair_rows(knn, ok, threshold)
    return [{"a": named[x], "b": named[y], "similarity": round(v, 6)}
            for x, y, v in zip(lo.tolist(), hi.tolist(), s.tolist())]


def _pair_rows(knn: KnnLists, ok: Callable[[str], bool] | np.ndarray, threshold: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """The pairs of `candidate_pairs` as rows lo < hi in (lo, hi) order and their best cosines; lo and hi as
    places in the ids of the rows in a pair (the last item, decoded once each)."""
    n = len(knn.nbr)
    a, slot = np.nonzero((knn.nbr >= 0) & (knn.sim >= threshold))       # row by row, as the lists are laid out
    b, s = knn.nbr[a, slot].astype(np.int64), knn.sim[a, slot]
    keep = a != b
    a, b, s = a[keep].astype(np.int64), b[keep], s[keep]
    keys = knn.keys
    if isinstance(ok, np.ndarray):
        linkable_row = ok
    else:
        linkable_row = np.zeros(n, dtype=bool)
        asked = np.unique(np.concatenate([a, b]))
        linkable_row[asked] = np.fromiter((ok(keys[r].decode("utf-8")) for r in asked.tolist()), dtype=bool,
                                          count=len(asked))
    keep = linkable_row[a] & linkable_row[b]
    a, b, s = a[keep], b[keep], s[keep]
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    order = np.lexsort((-s, hi, lo))                    # per pair, its best cosine first
    lo, hi, s = lo[order], hi[order], s[order]
    first = np.ones(len(lo), dtype=bool)
    first[1:] = (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])
    lo, hi, s = lo[first], hi[first], s[first]
    used = np.zeros(n, dtype=bool)                      # each entity's id decoded once, not once per pair
    used[lo], used[hi] = True, True
    at = np.cumsum(used) - 1
    return at[lo], at[hi], s, decoded(keys[used])


def find_neighbours(project: ProjectDir, settings: Settings, model_id: str, keys: np.ndarray, hashes: np.ndarray,
                    full: DenseRows | SparseRows, names: Any, reporter: Reporter) -> tuple[KnnLists, int]:
    """Every entity's nearest entities by name vector (`full`: the name index's rows, `keys` and `hashes` its
    ids and text hashes), from the saved lists brought up to date, then saved; and how many were queried."""
    s = settings.synonyms
    search_matrix = fold(full)
    knn_path = project.vectors_dir / KNN_FILE
    min_sim = s.threshold - (FOLD_MARGIN if search_matrix is not None else EXACT_MARGIN)
    knn_model = model_id + (f"+fold{FOLD_DIM}" if search_matrix is not None else "") + f"+min{min_sim:.4f}"
    prev = KnnLists.load(knn_path, s.top_k, knn_model)
    if prev.damaged:
        reporter.warn(f"{prev.damaged}; finding every entity's neighbours again")
    knn, queried = update_knn(prev, keys, hashes,
                              search_matrix if search_matrix is not None else full.dense(np.arange(len(keys))),
                              s.top_k, reporter, s.cells_per_entity, s.cell_size, min_sim,
                              chars_of=lambda rows: np.array([name_chars(names[b.decode("utf-8")])
                                                              for b in keys[rows].tolist()], dtype=np.int32))
    if search_matrix is not None:
        rescore(knn, full, slots=knn.joined)
    del search_matrix
    knn.save(knn_path)
    return knn, queried


def save_edges(project: ProjectDir, settings: Settings, records: list[dict]) -> None:
    """The pairs as graph/synonyms.jsonl and, replacing the previous SYNONYM edges, into the graph, whose
    chunk prior they change."""
    store.write_jsonl(project.synonyms_path, records)
    from hrag_cli.graph.model import save_synonym_edges

    if project.graph_path.exists():
        save_synonym_edges(project, records)
        from hrag_cli.graph.chunk_prior import save_chunk_prior

        save_chunk_prior(project, settings)
