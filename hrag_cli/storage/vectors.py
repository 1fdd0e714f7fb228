"""The four vector indices of DESIGN.md §5: float16 unit rows per index (sparse rows when the vectors are mostly
zeros, as the builtin embedder's are; else a dense matrix), searched exactly, plus an HNSW graph only for a dense
index of at least `vectors.exact_below` items.

API (the query stage codes against this):

    from hrag_cli.storage.vectors import VectorIndex, INDEX_NAMES      # ("chunks", "entities", "relations", "facts")
    idx = VectorIndex.load(project.vectors_dir, "chunks", settings.vectors)   # None when never built
    idx.model_id            # embedder model_id the vectors came from; compare with get_embedder(...).model_id
    idx.dim, len(idx), idx.ids (list[str], id order)
    ids, sims = idx.search(queries, k, ef=None)   # queries float32 (nq, dim) or (dim,); ids: list[list[str]] (nq lists,
                                         # each <= k, best first); sims: float32 (nq, k) cosine, -inf padded
    idx.vectors()           # (len, dim) unit rows in idx.ids order, float16 (memory-mapped after load)
    idx.scores(query)       # float32 (len,): exact cosine of one query with every row
    idx.position(id) -> int | None       # row of an id in idx.ids / idx.vectors()

Writers (the synonyms stage):

    idx = VectorIndex.load_or_create(vectors_dir, "chunks", settings.vectors, model_id, dim)
    todo = idx.missing(ids, hashes)          # positions whose (id, text hash) the index lacks: embed only those
    counts = idx.sync(ids, hashes, vectors_of_todo, rows=todo)   # or sync(ids, hashes, full_matrix)
    idx.save(project.vectors_dir)            # <name>.f16.npy or <name>.csr-*.npy (a posted sparse index: only
                                             # csr-indptr, its values in <name>.csc-*.npy), <name>.keys/koff/
                                             # korder.npy, <name>.hashes.npy (+ .labels.npy and <name>.hnsw:
                                             # large dense only), then <name>.ids.jsonl (its header alone);
                                             # a sparse index `insert` took rows into: <name>.patch.npz and
                                             # the id map alone, beside its untouched base (`Patch`)
    idx = VectorIndex.load(vectors_dir, "facts", settings.vectors, lazy_ids=True)     # an incremental run:
    idx.insert(ids, hashes, old_rows, before, vectors)   # rows inserted or made again, the rest kept in place

Why it is shaped this way (measured on MuSiQue-100 and the 2Wiki corpus, 2 cores):
- Building HNSW graphs was 78 % of a MuSiQue build (2048-dim vectors, 2k-20k items per index), and at those
  sizes an exact scan per query takes milliseconds. So below `exact_below` items there is no graph at all; a dense
  index above it gets one (built on every core) because an exact scan of millions of dense rows is not cheap.
- The builtin embedder hashes a text's words and n-grams into 2048 buckets and fills 20-500 of them: stored as
  sparse rows (a one-byte column in its band + float16 value) a fact takes ~160 bytes instead of 8 KB, and a scan costs in
  proportion to the values stored. A sparse index never gets a graph (it would hold every vector dense).
- A top-k search of a posted index (a fact search) sums only the postings that can reach its top k
  (`SparseRows.posting_top`: a Cauchy-Schwarz bound on the columns not yet summed), then sums its few candidates
  as a full scoring does, so it returns the same rows and scores to the last bit from about a quarter of the sums.
- float16 halves the bytes on disk and in the page cache; cosines of unit vectors move by < 1e-3, far below the
  gaps between neighbours that matter. Rows are stored unit-length, so the product is the cosine. A query widens
  the values through their bits (`_products`, the same float32 products): numpy's own cast goes one value at a
  time and cost half of a posting search.
- The index is its own embedding store: `missing` names the items whose (id, text hash) it does not hold, so a
  later run embeds only new or changed texts and copies the other rows (no separate cache file needed).
- The matrix is saved as .npy and memory-mapped at query time: a query process touches only the pages it reads.
- An incremental run (a few % new items) splices: `insert` copies the kept rows' values run by run (a posted
  index's postings column by column, renumbered) and puts the new ones in, with no Python object per row, so a
  +1 % run at 100,000 passages reads and writes the indices' bytes once instead of parsing 3M id-map lines and
  deriving, merging and re-posting every value (the id map is its header alone since format 6 for that reason).
- Saving goes through store.atomic_path for every file; the id map is written last and names the matrix rows and
  the hnsw file's size, so a crash between renames is detected at load and reported as "rebuild with hrag
  synonyms" instead of returning wrong ids. An index of a format before 6 raises the same error (and the
  synonyms stage, whose fingerprint includes FORMAT, rebuilds it on the next `hrag index`); a format 6 one reads
  as a base without a patch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hrag_cli.core import store
from hrag_cli.core.config import VectorSettings
from hrag_cli.core.errors import HragError

INDEX_NAMES = ("chunks", "entities", "relations", "facts")
FORMAT = 7                    # 7: + a patch segment beside the base (<name>.patch.npz; 6, its base alone, reads
                              # as a base without one); 6: text hashes and graph labels as arrays, the id map is
                              # its header alone; 5: a posted index keeps its values once, by column; 4: + column
                              # postings and memory-mapped ids; 3: byte columns; 2: two-byte columns
_READ_FORMATS = (6, 7)
PATCH_SHARE = 0.15            # a patch past this share of its base's rows is folded into a new base (as resolve's
                              # record patches, resolve_patch.FOLD_SHARE): a +1 % run writes ~1 % of the rows, and
                              # one in about 15 pays a whole rewrite
DTYPE = np.float16
_REBUILD_DELETED_FRACTION = 0.25
_SCAN_ROWS = 1 << 16          # rows per block of a sparse scan or a bookkeeping pass
_BLOCK_FLOATS = 1 << 23       # float32 values per dense block (32 MB)
_F32_CACHE_ELEMENTS = 1 << 25  # an index up to this many numbers keeps a float32 copy for repeated searches
_SPARSE_CACHE_VALUES = 1 << 24  # a sparse index up to this many values keeps them widened (6 bytes each)
_POSTING_QUERIES = 16         # up to this many queries at once are scored through the column postings
POSTED = ("chunks", "facts", "relations")   # the sparse indices saved with column postings (see `_posted`)
_ROW_BAND = 1 << 16           # rows per band of a posting's row (two bytes of row within it)
_UNIT_SLACK = 1.01            # a stored row's norm is at most this (unit rows, float16 values: 1 + 2^-11)
_PRUNE_TOL = 1e-4             # covers the float32 rounding of a partial posting sum (60 columns: < 1e-5)
_PRUNE_CANDIDATES = 256       # a pruned posting search sums exactly at most about this many rows
_LISTED_CANDIDATES = 1 << 13  # ... counted over every row while more (and halving), listed when fewer
_SEARCHED_ROWS = 4 * _PRUNE_CANDIDATES   # up to this many rows a posting search finds in the columns step by step
_THETA_FIRST, _THETA_AGAIN = 0.7, 0.5   # its first theta once the bound is under 0.7, again at half the bound


def _dense_rows(dim: int) -> int:
    """Rows per dense float32 block of this width."""
    return max(1, _BLOCK_FLOATS // max(dim, 1))


def _hnswlib():
    import hnswlib

    return hnswlib


def _as_matrix(x: np.ndarray, dim: int) -> np.ndarray:
    m = np.asarray(x, dtype=np.float32)
    if m.ndim == 1:
        m = m[None, :]
    if m.ndim != 2 or m.shape[1] != dim:
        raise ValueError(f"expected vectors of dimension {dim}, got shape {m.shape}")
    return np.ascontiguousarray(m)


def _unit(m: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    return m / np.where(norms > 0, norms, 1)


def exact_topk(matrix: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact cosine top-k of unit vectors in a dense matrix: (rows int64 (nq, k), sims float32), best first."""
    return exact_search(DenseRows(matrix), queries, k)


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


class DenseRows:
    """Unit rows as a float16 matrix (memory-mapped after load); a small one keeps a float32 copy for
    repeated scans, since a float16 -> float32 conversion per query costs more than the product."""
    kind = "dense"

    def __init__(self, matrix: np.ndarray) -> None:
        self.matrix = matrix
        self._f32: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.matrix)

    def dense(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(self.matrix[rows], dtype=np.float32)

    def _scan(self) -> np.ndarray:
        if self._f32 is None and self.matrix.size <= _F32_CACHE_ELEMENTS:
            self._f32 = np.asarray(self.matrix, dtype=np.float32)
        return self._f32 if self._f32 is not None else self.matrix

    def blocks(self, q: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, cosines (nq, rows)) per block of rows."""
        mat = self._scan()
        step = len(mat) if mat.dtype == np.float32 else _dense_rows(mat.shape[1])
        for s in range(0, len(mat), max(step, 1)):
            yield s, q @ np.asarray(mat[s:s + step], dtype=np.float32).T


BAND = 256                    # columns per band of a sparse row (one byte of column within it)


def _n_bands(dim: int) -> int:
    return max(1, (dim + BAND - 1) // BAND)


class SparseRows:
    """Unit rows in compressed sparse rows, float16 values in column order. A value's column is stored as one
    byte (its place within its band of 256 columns) plus, per row, how many values fall in each band (uint16,
    8 per row at 2048 dims). The builtin embedder hashes a text's few words and n-grams into 2048 buckets: a
    fact or a name fills 20-100 of them, a relation with its sentence ~150, so this is 10-40x smaller than
    dense rows, the byte columns a quarter less than two-byte ones, and a scan costs in proportion to the
    values stored."""
    kind = "sparse"

    def __init__(self, indptr: np.ndarray, low: np.ndarray | None, bands: np.ndarray | None,
                 data: np.ndarray | None, dim: int) -> None:
        self.indptr, self.dim = indptr, dim
        self._low, self._bands, self._data = low, bands, data
        self._cache: tuple[np.ndarray, np.ndarray] | None = None
        self._scans = 0
        self.postings: tuple[np.ndarray, ...] | None = None   # (ptr, low rows, bands, values): build_postings

    @classmethod
    def from_postings(cls, indptr: np.ndarray, postings: tuple[np.ndarray, ...], dim: int) -> "SparseRows":
        """Rows saved by column only (a posted index keeps its values once): a query reads the postings;
        the row arrays are derived the first time something reads rows (the synonyms stage's sync, a scan
        of more than _POSTING_QUERIES queries)."""
        rows = cls(indptr, None, None, None, dim)
        rows.postings = postings
        return rows

    def _rows_from_postings(self) -> None:
        """Each column's entries go to the next free place of their rows: columns ascend, so every row's
        values come out in column order, as a row-wise build stores them. Linear in the values, one column
        at a time."""
        n, total = len(self), int(self.indptr[-1])
        low, data = np.empty(total, dtype=np.uint8), np.empty(total, dtype=DTYPE)
        bands = np.zeros((n, _n_bands(self.dim)), dtype=np.uint16)
        cursor = np.asarray(self.indptr[:-1], dtype=np.int64).copy()
        for c in range(self.dim):
            rows, values = self._posted_column(c)
            if not len(rows):
                continue
            at = cursor[rows]
            low[at] = c % BAND
            data[at] = values
            cursor[rows] += 1                      # a column holds each row at most once
            bands[rows, c // BAND] += 1
        if not np.array_equal(cursor, np.asarray(self.indptr[1:])):
            raise HragError("the postings of a vector index do not fill its rows; run 'hrag synonyms' to rebuild it")
        self._low, self._bands, self._data = low, bands, data

    def _row_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(low column bytes, band counts, values), derived from the postings on first use."""
        if self._low is None:
            self._rows_from_postings()
        return self._low, self._bands, self._data                   # type: ignore[return-value]

    low = property(lambda self: self._row_arrays()[0])
    bands = property(lambda self: self._row_arrays()[1])
    data = property(lambda self: self._row_arrays()[2])

    @property
    def values(self) -> int:
        return int(self.indptr[-1])

    @property
    def by_column_only(self) -> bool:
        """Loaded from postings alone, the row arrays not derived: saving again can reuse the postings."""
        return self._low is None and self.postings is not None

    def __len__(self) -> int:
        return len(self.indptr) - 1

    @staticmethod
    def _cols(bands: np.ndarray, low: np.ndarray) -> np.ndarray:
        """Columns (intp) of the values of consecutive rows whose band counts are `bands` (rows, n_bands)."""
        bands = np.asarray(bands)
        high = np.repeat(np.tile(np.arange(bands.shape[1], dtype=np.intp), len(bands)), bands.ravel())
        return (high * BAND) | np.asarray(low, dtype=np.intp)

    def take(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(values per row, columns, values) of `rows`, in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        starts = self.indptr[rows]
        lens = self.indptr[rows + 1] - starts
        pos = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(int(lens.sum()), dtype=np.int64)
        return lens, self._cols(self.bands[rows], self.low[pos]).astype(np.uint16), self.data[pos]

    def dense(self, rows: np.ndarray) -> np.ndarray:
        lens, cols, vals = self.take(rows)
        out = np.zeros((len(lens), self.dim), dtype=np.float32)
        out[np.repeat(np.arange(len(lens)), lens), cols] = vals
        return out

    def _scan(self) -> tuple[np.ndarray, np.ndarray] | None:
        """From the second scan on, every value's column (uint16) and value (float32), kept for an index of
        up to _SPARSE_CACHE_VALUES values: a batch of queries otherwise spells the columns out of the band
        counts and widens the float16 values again for every query, half the cost of a fact search (a single
        cold query streams its one scan instead)."""
        self._scans += 1
        if self._cache is None and self._scans > 1 and self.values <= _SPARSE_CACHE_VALUES:
            self._cache = (self._cols(self.bands, self.low).astype(np.uint16),
                           np.asarray(self.data, dtype=np.float32))
        return self._cache

    def posting_scores(self, q: np.ndarray) -> np.ndarray:
        """Cosines (nq, rows) from the column postings: each query reads only the postings of its nonzero
        columns (a fact query fills ~50 of 2048, so ~2 % of a 1.9M-row index's values instead of all of them).
        A row's products are summed in column order, as the row scan's are, but one by one: sums may differ
        from the scan's in the last bit of float32. Each column is read, turned into rows and products and
        added in scratch arrays of its own length (`_posted_column`), so the work stays in cache."""
        out = np.zeros((len(q), len(self)), dtype=np.float32)
        for j, qv in enumerate(q):
            for c in np.flatnonzero(qv).tolist():
                rows, values = self._posted_column(c)
                np.add.at(out[j], rows, _products(values, qv[c], self._buffer("prod", len(values), np.float32)))
        return out

    def _posted_column(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Column c's rows (intp: np.add.at scatters by them 1.2x faster than by int32 ones, the widening
        included) and float16 values, in scratch arrays (valid until the next call)."""
        ptr, plow, pbands, pdata = self.postings          # type: ignore[misc]
        s, e = int(ptr[c]), int(ptr[c + 1])
        low = _read_run(plow, s, e, self._buffer("low", e - s, np.uint16))
        rows = _band_rows(low, np.asarray(pbands[c]), self._buffer("rows", e - s, np.intp))
        return rows, _read_run(pdata, s, e, self._buffer("values", e - s, DTYPE))

    def posting_top(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best rows for one query (rows, float32 cosines; best first, ties to the lower row) with the
        very scores `posting_scores` gives, summing only as many postings as it takes to prove them (a fact
        search read 1.1M-5M values a question at 100,000 passages and sums about a quarter of them now).

        Why it holds: columns are summed in order of the query's weight, heaviest first. What the columns not
        yet summed can add to a unit row is at most the norm of the query's rest (Cauchy-Schwarz), so once
        that bound is below a score some k rows are known to reach (`theta`, their exact sums), no row that
        none of the summed columns holds can reach the top k, and one that they hold only if its partial sum
        plus the bound reaches theta (each column's test holds alone: a candidate is a row that passed the
        last one). More columns are summed until few such candidates are left; those are
        then summed exactly as `posting_scores` sums them (float32, column by column in column order), so
        their scores are the same to the last bit. `_PRUNE_TOL` covers the float32 rounding of the partial
        sums. When no bound ever prunes (the k-th best score near 0), every row is scored as before."""
        n, k = len(self), min(k, len(self))
        q = np.asarray(q, dtype=np.float32)
        cols = np.flatnonzero(q)
        if k <= 0 or not len(cols):
            return self._full_top(q, k)
        post = self._gather(cols)
        by_weight = np.argsort(-np.abs(q[cols]), kind="stable")
        square = q[cols[by_weight]].astype(np.float64) ** 2
        rest = np.append(np.cumsum(square[::-1])[::-1], 0.0)[1:]   # the query's squared norm after each column
        tol = _PRUNE_TOL * (1 + len(cols) / 256)
        partial = self._buffer("partial", n, np.float32)
        partial.fill(0)
        theta, cand, tried, count = -np.inf, None, np.inf, np.inf
        for i, (j, bound) in enumerate(zip(by_weight.tolist(), (np.sqrt(rest) * _UNIT_SLACK + tol).tolist())):
            s, e = post.at[j], post.at[j + 1]
            rows = _band_rows(post.low[s:e], post.counts[j], self._buffer("rows", e - s, np.intp))
            np.add.at(partial, rows, _products(post.values[s:e], q[cols[j]], self._buffer("prod", e - s, np.float32)))
            if cand is None:
                # theta: the k-th best exact score of the rows whose partial sums lead, made again when the
                # bound has halved since (a better theta stops sooner; each costs about two columns' sums)
                if bound < min(_THETA_FIRST, _THETA_AGAIN * tried) and bound >= theta:
                    seen = np.sort(top_order(partial, 4 * k))
                    theta, tried = max(theta, float(np.sort(post.exact(seen, q))[-k])), bound
                if bound >= theta:
                    continue
                # the rows that can still reach theta: counted over every row while many and halving (listing
                # 125,000 of 1.9M took 1 ms, counting them 0.07), listed once few or no longer halving (near
                # ties) or at the last column, then narrowed by a gather of their sums
                above = np.greater_equal(partial, theta - bound, out=self._buffer("above", n, np.bool_))
                count, counted = np.count_nonzero(above), count
                if _LISTED_CANDIDATES < count < counted / 2 and i + 1 < len(cols):
                    continue
                cand = np.flatnonzero(above)
            else:
                cand = cand[partial[cand] >= theta - bound]
            if len(cand) <= _PRUNE_CANDIDATES:
                break
        if cand is None:
            return self._full_top(q, k)
        exact = post.exact(cand, q)
        best = np.lexsort((cand, -exact))[:k]
        return cand[best], exact[best]

    def _full_top(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Every row scored (`posting_scores`), the k best by `top_order`."""
        sims = self.posting_scores(q[None, :])[0]
        rows = top_order(sims, k)
        return rows, sims[rows]

    def _buffer(self, name: str, size: int, dtype: type) -> np.ndarray:
        return scratch(self.__dict__.setdefault("_scratch", {}), name, size, dtype)

    def _gather(self, cols: np.ndarray) -> "_Postings":
        """The postings of `cols` (ascending) one after another in scratch arrays: low row bytes and values
        (a column's rows are spelled out only when it is summed: most of a fact search's columns are only
        searched for a few candidates, `_Postings.exact`)."""
        ptr, plow, pbands, pdata = self.postings          # type: ignore[misc]
        starts, ends = np.asarray(ptr[cols], dtype=np.int64), np.asarray(ptr[cols + 1], dtype=np.int64)
        at = np.concatenate(([0], np.cumsum(ends - starts))).tolist()
        low, values = self._buffer("gathered low", at[-1], np.uint16), self._buffer("gathered values", at[-1], DTYPE)
        for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
            _read_run(pdata, s, e, values[at[i]:at[i + 1]])
            _read_run(plow, s, e, low[at[i]:at[i + 1]])
        return _Postings(cols, at, low, np.asarray(pbands[cols], dtype=np.int64), values)

    def blocks(self, q: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        n = len(self)
        step = max(1, _SCAN_ROWS // 4)
        if self.postings is not None and len(q) <= _POSTING_QUERIES:
            full = self.posting_scores(q)          # the same blocks as a scan: the same top-k merge and ties
            for s in range(0, n, step):
                yield s, full[:, s:s + step]
            return
        cache = self._scan()
        for s in range(0, n, step):
            e = min(n, s + step)
            p0, p1 = int(self.indptr[s]), int(self.indptr[e])
            if cache is not None:
                cols, vals = cache[0][p0:p1], cache[1][p0:p1]
            else:
                cols = self._cols(self.bands[s:e], self.low[p0:p1])
                vals = np.asarray(self.data[p0:p1], dtype=np.float32)
            starts = np.asarray(self.indptr[s:e], dtype=np.int64) - p0
            out = np.zeros((len(q), e - s), dtype=np.float32)
            if p1 > p0:
                prod = q[:, cols] * vals
                live = starts < (np.asarray(self.indptr[s + 1:e + 1]) - p0)      # reduceat needs non-empty rows
                out[:, live] = np.add.reduceat(prod, starts[live], axis=1)
            yield s, out


class _Postings:
    """The postings of a query's columns, one run per column (`at`: where each begins), for `posting_top`:
    the low two bytes of each entry's row, the count of entries in each band of 65,536 rows per column, and
    the float16 values."""

    def __init__(self, cols: np.ndarray, at: list[int], low: np.ndarray, counts: np.ndarray,
                 values: np.ndarray) -> None:
        self.cols, self.at, self.low, self.counts, self.values = cols, at, low, counts, values
        # where each column's run of each band begins (absolute, in `low`), one more per column for its end;
        # int32 while they fit (a search steps through these a third faster than through int64 ones)
        band_at = np.concatenate([np.zeros((len(cols), 1), np.int64), np.cumsum(counts, axis=1)], axis=1) \
            + np.asarray(at[:-1], dtype=np.int64)[:, None]
        self.band_at = band_at.astype(np.int32) if at[-1] <= np.iinfo(np.int32).max // 2 else band_at   # a probe reaches 2x

    def exact(self, rows: np.ndarray, q: np.ndarray) -> np.ndarray:
        """The scores of `rows` (ascending) as `posting_scores` sums them: float32 products added one column
        after another in column order."""
        out = np.zeros(len(rows), dtype=np.float32)
        if not self.at[-1] or not len(rows):
            return out
        rows = np.asarray(rows, dtype=np.int64)
        where, end = self._search(rows) if len(rows) <= _SEARCHED_ROWS else self._search_spelled(rows)
        at = np.minimum(where, self.at[-1] - 1)
        hit = (where < end) & (self.low[at] == (rows & (_ROW_BAND - 1)))
        prod = np.where(hit, self.values[at].astype(np.float32), np.float32(0))
        prod *= q[self.cols][:, None]
        for line in prod:                          # float32, in column order
            out += line
        return out

    def _search(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(where each column's entry for each row is or would go, the end of the column's run of the row's
        band: an entry past it is another band's), each (columns, rows): a binary search of the row's two low
        bytes in the column's run of its band (a column's rows ascend), every column and row at once, so no
        column's rows are spelled out. It steps by halving powers of two from the longest run's: a step is
        taken where the entry it lands on is still in the run and below the key."""
        band, key = rows >> 16, (rows & (_ROW_BAND - 1)).astype(np.uint16)
        pos, end = self.band_at[:, band], self.band_at[:, band + 1]
        longest = int((end - pos).max(initial=0))
        step = 1 << (longest.bit_length() - 1) if longest else 0
        while step >= 1:
            probe = pos + pos.dtype.type(step - 1)
            take = probe < end
            take &= self.low.take(probe, mode="clip") < key
            pos += take * pos.dtype.type(step)     # (an add with where= took 4x as long)
            step >>= 1
        return pos, end

    def _search_spelled(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`_search` for many rows (a bound that never pruned far): each column's rows spelled out and
        searched, cheaper than a binary search step by step for thousands of rows."""
        where = np.empty((len(self.cols), len(rows)), dtype=np.int64)
        for i in range(len(self.cols)):
            a, b = self.at[i], self.at[i + 1]
            where[i] = np.searchsorted(_band_rows(self.low[a:b], self.counts[i], np.empty(b - a, np.intp)), rows) + a
        return where, self.band_at[:, (rows >> 16) + 1]


def _band_rows(low: np.ndarray, counts: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The rows of a column's entries into `out` (intp): their low two bytes plus 65,536 times their band,
    band by band from the column's count of entries in each (a run of additions: np.repeat of the band
    offsets took twice as long)."""
    np.copyto(out, low)
    at = 0
    for band, count in enumerate(np.asarray(counts).tolist()):
        if band and count:
            out[at:at + count] += band * _ROW_BAND
        at += count
    return out


_F16_KEEP = np.int32(-0x70000001)   # 0x8FFFFFFF: the sign bit and the float16's exponent and mantissa bits
_F16_SCALE = np.float32(2.0 ** 112)  # float32's exponent bias less float16's, as a factor


def _products(values: np.ndarray, weight: np.float32, out: np.ndarray) -> np.ndarray:
    """float32(values) * weight (a float32) into `out` (float32, of values' length), the same bits as
    `values.astype(np.float32) * weight`, in a third of the time: numpy widens float16 one value at a time
    (1.7 ns a value here, half the cost of the sums). A float16 widened as an int16 (sign extended) and
    shifted 13 places left holds its exponent and mantissa where float32 keeps them and its sign in bits 28
    to 31; with bits 28 to 30 cleared it is a float32 equal to the value times 2^-112, exactly (float16
    subnormals included: they land on float32 subnormals). Times weight * 2^112 (exact: a power of two)
    the one rounding is that of the same real product, so the float32 result is the same. Finite values
    only (unit rows hold no inf or NaN)."""
    bits = out.view(np.int32)
    np.copyto(bits, values.view(np.int16))
    np.left_shift(bits, 13, out=bits)
    np.bitwise_and(bits, _F16_KEEP, out=bits)
    return np.multiply(out, np.float32(weight) * _F16_SCALE, out=out)


def _packed(enc: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(blob uint8, offsets int64 (n + 1)) of byte strings laid end to end."""
    off = np.zeros(len(enc) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in enc], out=off[1:])
    return np.frombuffer(b"".join(enc), dtype=np.uint8), off


def _read_run(arr: Any, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
    """arr[start:stop], into `out` when given (a `ReadAt` reads straight into it)."""
    if isinstance(arr, ReadAt):
        return arr.read_into(start, stop, out) if out is not None else arr[start:stop]
    if out is None:
        return np.asarray(arr[start:stop])
    out[...] = arr[start:stop]
    return out


def build_postings(rows: SparseRows) -> tuple[np.ndarray, ...]:
    """Column postings of sparse rows: (ptr int64 (dim + 1), low two bytes of each row uint16, per column the
    count of its entries in each band of 65,536 rows uint32 (dim, bands), float16 values); column c's entries
    are at ptr[c]:ptr[c + 1], rows ascending. 4 bytes a value, as the rows' 3 (+ band counts). A counting
    sort, block by block of rows (a stable sort of 16-bit columns is a radix sort): linear in the values,
    temporaries of a few MB."""
    n, dim, total = len(rows), rows.dim, len(rows.data)
    nb = max(1, -(-n // _ROW_BAND))
    step = _SCAN_ROWS // 4

    def block(s: int) -> tuple[int, int, np.ndarray]:
        e = min(n, s + step)
        p0, p1 = int(rows.indptr[s]), int(rows.indptr[e])
        return e, p0, rows._cols(rows.bands[s:e], rows.low[p0:p1]).astype(np.uint16)

    bands = np.zeros((dim, nb), dtype=np.int64)
    for s in range(0, n, step):
        e, _, cols = block(s)
        row = np.repeat(np.arange(s, e, dtype=np.int64), np.diff(np.asarray(rows.indptr[s:e + 1])))
        bands += np.bincount(cols.astype(np.int64) * nb + row // _ROW_BAND, minlength=dim * nb).reshape(dim, nb)
    ptr = np.concatenate([[0], np.cumsum(bands.sum(axis=1))]).astype(np.int64)
    cursor = ptr[:-1].copy()
    plow, pdata = np.empty(total, dtype=np.uint16), np.empty(total, dtype=DTYPE)
    for s in range(0, n, step):
        e, p0, cols = block(s)
        order = np.argsort(cols, kind="stable")
        c = cols[order].astype(np.intp)
        cnt = np.bincount(c, minlength=dim)[:dim]
        dest = cursor[c] + (np.arange(len(c)) - (np.cumsum(cnt) - cnt)[c])
        row = np.repeat(np.arange(s, e, dtype=np.int64), np.diff(np.asarray(rows.indptr[s:e + 1])))
        plow[dest], pdata[dest] = (row[order] % _ROW_BAND).astype(np.uint16), np.asarray(rows.data[p0:p0 + len(c)])[order]
        cursor += cnt
    return ptr, plow, bands.astype(np.uint32), pdata


class _Listing(Sequence):
    """A sequence of ids read one at a time from arrays (`_one`), or listed whole once (`_listed`)."""

    _all: list[str] | None

    def __getitem__(self, i: Any) -> Any:
        if self._all is not None or isinstance(i, slice):
            return self._listed()[i]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        return self._one(int(i) % n)

    def _one(self, row: int) -> str:
        raise NotImplementedError

    def _listed(self) -> list[str]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[str]:
        return iter(self._listed())


class IdKeys(_Listing):
    """The ids of an index's rows as one UTF-8 blob, its offsets and the rows in id order, memory-mapped: a
    query maps the rows a search found to ids and a fact's id to its row (binary search, ~20 ids read)
    without parsing the id map (1.9M facts at 100k passages). Listing it decodes every id once."""

    def __init__(self, blob: np.ndarray, off: np.ndarray, order: np.ndarray) -> None:
        self._blob, self._off, self._order = blob, off, order
        self._all: list[str] | None = None

    @staticmethod
    def arrays(ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(blob uint8, offsets int64 (n + 1), rows sorted by id bytes int64) of a list of ids."""
        enc = [i.encode("utf-8") for i in ids]
        order = np.array(sorted(range(len(enc)), key=enc.__getitem__), dtype=np.int64)
        return (*_packed(enc), order)

    def __len__(self) -> int:
        return len(self._order)

    def _bytes(self, row: int) -> bytes:
        return bytes(self._blob[int(self._off[row]):int(self._off[row + 1])])

    def _one(self, row: int) -> str:
        return self._bytes(row).decode("utf-8")

    def position(self, key: str) -> int | None:
        """The row of `key`, or None."""
        want, order = key.encode("utf-8"), self._order
        lo, hi = 0, len(order)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._bytes(int(order[mid])) < want:
                lo = mid + 1
            else:
                hi = mid
        return int(order[lo]) if lo < len(order) and self._bytes(int(order[lo])) == want else None

    def _listed(self) -> list[str]:
        if self._all is None:
            blob, off = bytes(self._blob), self._off.tolist()
            self._all = [blob[a:b].decode("utf-8") for a, b in zip(off, off[1:])]
        return self._all


def mostly_zero(b: np.ndarray) -> bool:
    """Whether a block of vectors is stored as sparse rows: under half of its values are nonzero. A sparse
    value takes 3 bytes (a column byte and float16) against 2 per dense cell, so sparse rows are smaller up to
    two thirds full; a dense embedder fills every cell. Not a quarter: the builtin embedder's entity texts
    (name and description) fill 8 % of the cells on average, but at 100k passages the first block in id order
    (numbers and sums of money, with descriptions of thousands of characters) filled 25.5 %, which made the
    whole 521k-row index dense (2.1 GB) and gave it an HNSW graph (4.35 GB)."""
    return np.count_nonzero(b) < 0.5 * b.size


def _sparsify(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values per row, columns, float16 values) of a dense float32 block, row by row in column order."""
    r, c = np.nonzero(b)
    return (np.bincount(r, minlength=len(b)).astype(np.int64), c.astype(np.uint16),
            b[r, c].astype(DTYPE))


def _csr(lens: np.ndarray, cols: np.ndarray, vals: np.ndarray, dim: int) -> SparseRows:
    """Sparse rows from each row's count of values and the columns (ascending within a row, as `_sparsify`
    and `take` give them) and values in row order."""
    n, nb = len(lens), _n_bands(dim)
    indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    bands = np.empty((n, nb), dtype=np.uint16)
    step = _SCAN_ROWS // 8            # rows per block: the temporaries stay a few MB at any size
    for s in range(0, n, step):
        e = min(n, s + step)
        row = np.repeat(np.arange(e - s, dtype=np.int64), lens[s:e])
        band = np.asarray(cols[indptr[s]:indptr[e]], dtype=np.int64) // BAND
        bands[s:e] = np.bincount(row * nb + band, minlength=(e - s) * nb).reshape(e - s, nb)
    return SparseRows(indptr, (np.asarray(cols) % BAND).astype(np.uint8), bands, vals, dim)


def sparse_rows(b: np.ndarray) -> SparseRows:
    """A dense float32 block as sparse rows."""
    return _csr(*_sparsify(b), b.shape[1])


def join_sparse(parts: list[SparseRows], dim: int) -> SparseRows:
    """Sparse row blocks one after another."""
    if not parts:
        return _csr(np.zeros(0, np.int64), np.zeros(0, np.uint16), np.zeros(0, DTYPE), dim)
    lens = np.concatenate([np.diff(p.indptr) for p in parts])
    return SparseRows(np.concatenate([[0], np.cumsum(lens)]).astype(np.int64), np.concatenate([p.low for p in parts]),
                      np.concatenate([p.bands for p in parts]), np.concatenate([p.data for p in parts]), dim)


def _kept_runs(is_new: np.ndarray, old_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[start, end) of each run of kept positions whose old rows are consecutive (old_of[s] .. old_of[s] + e - s
    - 1): an incremental run that inserts a few % of rows keeps the rest in a few long runs."""
    kept = ~is_new
    step = np.zeros(len(kept), dtype=bool)
    step[1:] = kept[1:] & kept[:-1] & (old_of[1:] == old_of[:-1] + 1)
    return np.flatnonzero(kept & ~step), np.flatnonzero(kept & ~np.append(step[1:], False)) + 1


def _copy_runs(dst: np.ndarray, dst_ptr: np.ndarray, src: np.ndarray, src_ptr: np.ndarray,
               runs: tuple[np.ndarray, np.ndarray], old_of: np.ndarray) -> None:
    """The values of each run of kept rows (`_kept_runs`), copied as one slice: row p's values are at
    dst_ptr[p]:dst_ptr[p + 1] in `dst`, old row r's at src_ptr[r]:src_ptr[r + 1] in `src`."""
    src, src_ptr = np.asarray(src), np.asarray(src_ptr)        # memory-mapped: no subclass per slice
    starts, ends = runs[0], runs[1]
    firsts = np.asarray(src_ptr[old_of[starts]], dtype=np.int64).tolist()
    lasts = np.asarray(src_ptr[old_of[ends - 1] + 1], dtype=np.int64).tolist()
    for at, a, b in zip(np.asarray(dst_ptr[starts], dtype=np.int64).tolist(), firsts, lasts):
        dst[at:at + b - a] = src[a:b]


def _put_rows(dst: np.ndarray, dst_ptr: np.ndarray, at: np.ndarray, values: np.ndarray, lens: np.ndarray) -> None:
    """Rows of `values` (consecutive, `lens` values each) put at the positions `at` of a row-pointed array."""
    inner = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
    dst[np.repeat(dst_ptr[at], lens) + inner] = values


def _merge_sparse_runs(is_new: np.ndarray, old: SparseRows, old_of: np.ndarray, new: SparseRows,
                       runs: tuple[np.ndarray, np.ndarray]) -> SparseRows:
    """`_merge_sparse` when the kept rows come in a few long runs of old rows (rows inserted between them): one
    slice copy per run instead of an index per value (85M values of the entity index at 100k passages)."""
    n = len(is_new)
    at = np.flatnonzero(is_new)
    lens = np.empty(n, dtype=np.int64)
    kept = ~is_new
    lens[kept] = np.diff(np.asarray(old.indptr, dtype=np.int64))[old_of[kept]]
    new_lens = np.diff(new.indptr)
    lens[at] = new_lens
    indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    low = np.empty(int(indptr[-1]), dtype=np.uint8)
    data = np.empty(int(indptr[-1]), dtype=DTYPE)
    bands = np.empty((n, old.bands.shape[1]), dtype=np.uint16)
    _copy_runs(low, indptr, old.low, old.indptr, runs, old_of)
    _copy_runs(data, indptr, old.data, old.indptr, runs, old_of)
    _copy_runs(bands, np.arange(n + 1), old.bands, np.arange(len(old) + 1), runs, old_of)
    _put_rows(low, indptr, at, new.low, new_lens)
    _put_rows(data, indptr, at, new.data, new_lens)
    bands[at] = new.bands
    return SparseRows(indptr, low, bands, data, old.dim)


def fixed_width(blob: np.ndarray, off: np.ndarray) -> np.ndarray:
    """The byte strings of a blob (`IdKeys`) as a fixed-width numpy array (NUL-padded; ids hold no NUL), for
    sorting and searching them in numpy: a view when they are all of one width (fact and chunk ids)."""
    lens = np.diff(np.asarray(off, dtype=np.int64))
    n, w = len(lens), max(1, int(lens.max(initial=1)))
    if n and bool((lens == w).all()):
        return np.asarray(blob).reshape(n, w).view(f"S{w}").ravel()
    total = int(lens.sum())
    # byte i of row r goes to r * w + (i - off[r]): one repeat of the rows' shifts, one flat scatter
    dest = np.repeat(np.arange(0, n * w, w, dtype=np.int64) - np.asarray(off[:-1], dtype=np.int64), lens)
    dest += np.arange(total, dtype=np.int64)
    m = np.zeros(n * w, dtype=np.uint8)
    m[dest] = np.asarray(blob[:total])
    return m.view(f"S{w}")


def _splice_keys(blob: np.ndarray, off: np.ndarray, order: np.ndarray, is_new: np.ndarray, old_of: np.ndarray,
                 moved: np.ndarray, pos: np.ndarray, ins: np.ndarray, enc: list[bytes], old_fixed: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`IdKeys.arrays` of the ids after `VectorIndex.insert`: kept ids' bytes copied run by run, the listed
    ids' put at their rows (`pos`), and the inserted ones (`ins`) merged into the sorted order by a binary
    search of the old sorted ids (`old_fixed`: the old ids as `fixed_width` gives them)."""
    blob2, off2 = _splice_blob(blob, off, is_new, old_of, pos, enc)
    return blob2, off2, _splice_order(order, moved, pos, ins, enc, old_fixed)


def _splice_blob(blob: np.ndarray, off: np.ndarray, is_new: np.ndarray, old_of: np.ndarray, pos: np.ndarray,
                 enc: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """The id blob and offsets of `_splice_keys`."""
    n = len(is_new)
    lens = np.empty(n, dtype=np.int64)
    kept = ~is_new
    lens[kept] = np.diff(np.asarray(off, dtype=np.int64))[old_of[kept]]
    new_lens = np.array([len(b) for b in enc], dtype=np.int64)
    lens[pos] = new_lens
    off2 = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=off2[1:])
    blob2 = np.empty(int(off2[-1]), dtype=np.uint8)
    _copy_runs(blob2, off2, blob, off, _kept_runs(is_new, old_of), old_of)
    _put_rows(blob2, off2, pos, np.frombuffer(b"".join(enc), dtype=np.uint8), new_lens)
    return blob2, off2


def _splice_order(order: np.ndarray, moved: np.ndarray, pos: np.ndarray, ins: np.ndarray, enc: list[bytes],
                  old_fixed: np.ndarray) -> np.ndarray:
    """The sorted order of `_splice_keys`: the old one renumbered, the inserted ids merged in."""
    order = np.asarray(order, dtype=np.int64)
    order2 = moved[order]
    if ins.any():
        fresh = np.flatnonzero(ins)
        names = np.array([enc[i] for i in fresh.tolist()])
        by_name = np.argsort(names, kind="stable")
        at = np.searchsorted(old_fixed, names[by_name], sorter=order)
        order2 = np.insert(order2, at, pos[fresh[by_name]])
    return order2


def _merge_sparse(is_new: np.ndarray, old: SparseRows, old_of: np.ndarray, new: SparseRows) -> SparseRows:
    """Rows in position order: position p is the next row of `new` where is_new[p], else row old_of[p] of `old`.
    Written block by block into arrays of the final size: an incremental run of a 2M-row index touches each
    value once, with no whole-index temporaries."""
    n = len(is_new)
    new_of = np.cumsum(is_new) - 1
    lens = np.empty(n, dtype=np.int64)
    lens[~is_new] = old.indptr[old_of[~is_new] + 1] - old.indptr[old_of[~is_new]]
    lens[is_new] = np.diff(new.indptr)
    indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    low = np.empty(int(indptr[-1]), dtype=np.uint8)
    data = np.empty(int(indptr[-1]), dtype=DTYPE)
    bands = np.empty((n, old.bands.shape[1]), dtype=np.uint16)
    step = _SCAN_ROWS
    for s in range(0, n, step):
        pos = np.arange(s, min(n, s + step))
        for src, mask, rows in ((old, ~is_new[pos], old_of[pos]), (new, is_new[pos], new_of[pos])):
            if not mask.any():
                continue
            at, rows = pos[mask], rows[mask]
            starts = src.indptr[rows]
            count = src.indptr[rows + 1] - starts
            offset = np.cumsum(count) - count
            inner = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(offset, count)
            take = np.repeat(starts, count) + inner
            put = np.repeat(indptr[at], count) + inner
            low[put] = src.low[take]
            data[put] = src.data[take]
            bands[at] = src.bands[rows]
    return SparseRows(indptr, low, bands, data, old.dim)


def _merge_postings(is_new: np.ndarray, old: SparseRows, old_of: np.ndarray, new: SparseRows) -> SparseRows:
    """`_merge_sparse` for an index loaded by column only whose kept rows keep their order (an incremental run
    inserts rows between them): the old postings are renumbered and the new rows' entries inserted into each
    column, so the row arrays are never derived and the postings never rebuilt from them (two passes over every
    value of a 2M-row index, a third of a +1 % run's synonyms stage). Column by column: each one's entries fit
    in the CPU's cache. The result is by column only and its postings are `build_postings` of the merged rows,
    byte for byte."""
    n, dim = len(is_new), old.dim
    ptr, plow, pbands, pdata = (np.asarray(a) for a in old.postings)      # type: ignore[union-attr]
    kept = np.flatnonzero(~is_new)
    moved = np.full(len(old), -1, dtype=np.int32)    # old row -> its new row (-1: gone); 32 bits: half the traffic
    moved[old_of[kept]] = kept
    gone = bool((moved < 0).any())
    new_at = np.flatnonzero(is_new)
    lens = np.empty(n, dtype=np.int64)
    lens[kept] = np.diff(np.asarray(old.indptr, dtype=np.int64))[old_of[kept]]
    lens[new_at] = np.diff(new.indptr)
    indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    # the new rows' entries, ordered by (column, row): their rows and values, and where each column's start
    nrow = np.repeat(new_at, np.diff(new.indptr))
    ncol = SparseRows._cols(new.bands, new.low).astype(np.int64)
    order = np.lexsort((nrow, ncol))
    nrow, ncol, nval = nrow[order].astype(np.int32), ncol[order], np.asarray(new.data)[order]
    nstart = np.searchsorted(ncol, np.arange(dim + 1)).tolist()
    nb_old, nb = pbands.shape[1], max(1, -(-n // _ROW_BAND))
    band_base = np.arange(nb_old, dtype=np.int32) * _ROW_BAND
    edges = np.arange(nb + 1, dtype=np.int64) * _ROW_BAND
    out_low = np.empty(int(indptr[-1]), dtype=np.uint16)
    out_data = np.empty(int(indptr[-1]), dtype=DTYPE)
    out_bands = np.zeros((dim, nb), dtype=np.uint32)
    bounds = np.asarray(ptr, dtype=np.int64).tolist()
    at = 0
    if not gone and (not len(new_at) or int(new_at[0]) == len(kept)):      # kept rows 0.. in order
        # rows only appended (the chunk index of a +1 %): old rows keep their numbers, so each column's old
        # entries are copied as they are and the new ones follow them
        out_bands[:, :nb_old] = pbands
        np.add.at(out_bands, (ncol, nrow // _ROW_BAND), 1)
        for c in range(dim):
            s, e, a, b = bounds[c], bounds[c + 1], nstart[c], nstart[c + 1]
            out_low[at:at + e - s] = plow[s:e]
            out_data[at:at + e - s] = pdata[s:e]
            at += e - s
            out_low[at:at + b - a] = nrow[a:b] & (_ROW_BAND - 1)
            out_data[at:at + b - a] = nval[a:b]
            at += b - a
    else:
        for c in range(dim):
            s, e = bounds[c], bounds[c + 1]
            rows = moved[np.repeat(band_base, pbands[c]) | plow[s:e]]
            vals = pdata[s:e]
            if gone:
                live = rows >= 0
                rows, vals = rows[live], vals[live]
            a, b = nstart[c], nstart[c + 1]
            if b > a:                                      # kept rows keep their order: rows ascend
                put = np.searchsorted(rows, nrow[a:b])
                rows, vals = np.insert(rows, put, nrow[a:b]), np.insert(vals, put, nval[a:b])
            m = len(rows)
            out_low[at:at + m] = rows & (_ROW_BAND - 1)
            out_data[at:at + m] = vals
            out_bands[c] = np.diff(np.searchsorted(rows, edges))
            at += m
    if at != len(out_low):
        raise HragError("the postings of a vector index do not match its rows; run 'hrag synonyms' to rebuild it")
    out_ptr = np.zeros(dim + 1, dtype=np.int64)
    np.cumsum(out_bands.sum(axis=1, dtype=np.int64), out=out_ptr[1:])
    return SparseRows.from_postings(indptr, (out_ptr, out_low, out_bands, out_data), dim)


def _spliced_fixed(old: np.ndarray, is_new: np.ndarray, old_of: np.ndarray, pos: np.ndarray, new: list[bytes]
                   ) -> np.ndarray:
    """A fixed-width bytes column after an insert: kept rows from `old` (row `old_of` of it), `new` at `pos`,
    as wide as the widest of either."""
    width = max(old.dtype.itemsize, max(map(len, new), default=1))
    out = np.empty(len(is_new), dtype=f"S{width}")
    out[~is_new] = old[old_of[~is_new]]
    out[pos] = np.array(new, dtype=f"S{width}")
    return out


def merge_rows(is_new: np.ndarray, old: SparseRows, old_of: np.ndarray, new: SparseRows) -> SparseRows:
    """Sparse rows in position order: position p is the next row of `new` where is_new[p], else row old_of[p]
    of `old`, by the cheapest of the three splices (postings renumbered, run copies, a gather per value)."""
    kept = np.flatnonzero(~is_new)
    if not len(kept):                        # a fresh build: the new rows are all the rows, in order
        return new
    if old.by_column_only and bool((np.diff(old_of[kept]) > 0).all()):
        return _merge_postings(is_new, old, old_of, new)
    runs = _kept_runs(is_new, old_of)
    if len(runs[0]) <= max(64, len(is_new) // 4):
        return _merge_sparse_runs(is_new, old, old_of, new, runs)
    return _merge_sparse(is_new, old, old_of, new)


class Patch:
    """The rows an incremental run inserted or made again, kept beside the untouched base arrays of a sparse
    index (<name>.patch.npz): a +1 % run writes them alone (the base files stay hard links of the previous
    generation) instead of rewriting every array of a 1.9M-row index. The logical index is the base's rows in
    order with the patch's rows at their logical rows `pos` (ascending): a row with base[j] >= 0 stands for base
    row base[j] (made again, same id), one with -1 is inserted. Past PATCH_SHARE of the base's rows the patch is
    folded into a new base (`folded`)."""

    def __init__(self, base_dir: Path, meta: dict, keys: tuple[np.ndarray, ...], hashes: np.ndarray,
                 rows: SparseRows, pos: np.ndarray, base: np.ndarray, ids: list[bytes], new_hashes: list[bytes],
                 patch_rows: SparseRows) -> None:
        self.base_dir, self.meta = Path(base_dir), meta      # where the base's files are and their header
        self.base_keys, self.base_hashes, self.base_rows = keys, hashes, rows
        self.pos, self.base = np.asarray(pos, dtype=np.int64), np.asarray(base, dtype=np.int64)
        self.ids, self.hashes, self.rows = ids, new_hashes, patch_rows
        self.n_base = len(hashes)
        inserted = self.base < 0
        self.ins_pos = self.pos[inserted]
        self.ins_before = self.ins_pos - np.arange(len(self.ins_pos), dtype=np.int64)   # the base row each precedes
        self.n = self.n_base + len(self.ins_pos)
        self._at = dict(zip(ids, self.pos.tolist()))          # id -> its logical row
        self._cache: dict[str, Any] = {}
        if rows.postings is not None and patch_rows.postings is None and len(patch_rows):
            patch_rows.postings = build_postings(patch_rows)   # scored as the base is: the same sums, bit for bit

    def __len__(self) -> int:
        return len(self.pos)

    def check(self) -> bool:
        """Whether the patch fits its base: rows ascending inside the logical index, each made-again row where
        its base row lands."""
        k, made = len(self.pos), self.base >= 0
        return (len(self.base) == len(self.ids) == len(self.hashes) == len(self.rows) == k
                and (not k or (int(self.pos[0]) >= 0 and int(self.pos[-1]) < self.n
                               and bool((np.diff(self.pos) > 0).all())))
                and bool((self.base[made] < self.n_base).all())
                and np.array_equal(self.logical(self.base[made]), self.pos[made])
                and (self.rows.dim == self.base_rows.dim))

    def logical(self, base_rows: np.ndarray) -> np.ndarray:
        """The logical row of each base row."""
        r = np.asarray(base_rows, dtype=np.int64)
        return r + np.searchsorted(self.ins_before, r, side="right")

    def base_of(self, rows: np.ndarray) -> np.ndarray:
        """The base row of each logical row that is not an inserted one."""
        p = np.asarray(rows, dtype=np.int64)
        return p - np.searchsorted(self.ins_pos, p)

    def find(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per logical row: whether the patch holds it, and its patch row there."""
        p = np.asarray(rows, dtype=np.int64)
        j = np.searchsorted(self.pos, p)
        hit = np.zeros(len(p), dtype=bool)
        inside = j < len(self.pos)
        hit[inside] = self.pos[j[inside]] == p[inside]
        return hit, j

    def layout(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(is_new per logical row, base row of each other logical row (-1 on patch rows), logical row of each
        base row): the whole-index arrays the splices of `insert` take."""
        if "layout" not in self._cache:
            is_new = np.zeros(self.n, dtype=bool)
            is_new[self.pos] = True
            replaced = np.zeros(self.n_base, dtype=bool)
            replaced[self.base[self.base >= 0]] = True
            old_of = np.full(self.n, -1, dtype=np.int64)
            old_of[~is_new] = np.flatnonzero(~replaced)
            moved = np.empty(self.n_base, dtype=np.int64)
            moved[~replaced] = np.flatnonzero(~is_new)
            moved[self.base[self.base >= 0]] = self.pos[self.base >= 0]
            self._cache["layout"] = (is_new, old_of, moved)
        return self._cache["layout"]

    def keys(self, order: bool = True) -> tuple[np.ndarray, ...]:
        """`IdKeys.arrays` of the logical index (without `order`: the blob and offsets alone)."""
        if "blob" not in self._cache:
            is_new, old_of, _ = self.layout()
            self._cache["blob"] = _splice_blob(*self.base_keys[:2], is_new, old_of, self.pos, self.ids)
        if order and "order" not in self._cache:
            base_order = self.base_keys[2]
            _, _, moved = self.layout()
            ins = self.base < 0
            old_fixed = self.base_fixed() if ins.any() else np.zeros(0, dtype="S1")
            self._cache["order"] = _splice_order(base_order, moved, self.pos, ins, self.ids, old_fixed)
        return (*self._cache["blob"], self._cache["order"]) if order else self._cache["blob"]

    def base_fixed(self) -> np.ndarray:
        """The base's ids as `fixed_width` gives them (kept: the id order's merge and `id_array` both read them)."""
        if "base_fixed" not in self._cache:
            self._cache["base_fixed"] = fixed_width(*self.base_keys[:2])
        return self._cache["base_fixed"]

    def id_array(self) -> np.ndarray:
        """The logical index's ids as fixed-width bytes, spliced from the base's: what `fixed_width` of the
        spliced blob gives (a row made again keeps its id, so the width is the same)."""
        if "fixed" not in self._cache:
            is_new, old_of, _ = self.layout()
            self._cache["fixed"] = _spliced_fixed(self.base_fixed(), is_new, old_of, self.pos, self.ids)
        return self._cache["fixed"]

    def hashes_of(self, rows: np.ndarray) -> np.ndarray:
        """The text hashes (fixed-width bytes) of some logical rows, without splicing every row's."""
        hit, j = self.find(rows)
        out = np.empty(len(hit), dtype=object)
        out[hit] = [self.hashes[i] for i in j[hit].tolist()]
        out[~hit] = np.asarray(self.base_hashes)[self.base_of(np.asarray(rows)[~hit])].tolist()
        return out

    def hash_array(self) -> np.ndarray:
        """The logical index's text hashes (fixed-width bytes)."""
        if "hashes" not in self._cache:
            is_new, old_of, _ = self.layout()
            self._cache["hashes"] = _spliced_fixed(np.asarray(self.base_hashes), is_new, old_of, self.pos,
                                                   self.hashes)
        return self._cache["hashes"]

    def folded(self) -> tuple[tuple[np.ndarray, ...], np.ndarray, SparseRows]:
        """The logical index as one base: (id keys, text hashes, rows), what a fresh build of it holds."""
        return self.keys(), self.hash_array(), self.merged_rows()

    def merged_rows(self) -> SparseRows:
        """The logical index's rows in one store (kept: the synonyms stage reads them every run), without
        the id order and hash array `folded` also makes."""
        if "rows" not in self._cache:
            is_new, old_of, _ = self.layout()
            self._cache["rows"] = merge_rows(is_new, self.base_rows, old_of, self.rows)
        return self._cache["rows"]

    def spliced(self, pos: np.ndarray, old_rows: np.ndarray, moved: np.ndarray, ids: list[bytes],
                hashes: list[bytes], new: SparseRows) -> "Patch":
        """This patch with `VectorIndex.insert`'s rows put in: `pos` their final logical rows, `old_rows` the
        current logical row each makes again (-1: inserted), `moved` each current logical row's final row."""
        old_rows = np.asarray(old_rows, dtype=np.int64)
        remade = old_rows >= 0
        hit, j = self.find(old_rows[remade])
        made_base = self.base_of(old_rows[remade])
        made_base[hit] = self.base[j[hit]]         # a patch row made again: the base row it stands for, or -1
        base_of = np.full(len(pos), -1, dtype=np.int64)
        base_of[remade] = made_base
        keep = np.ones(len(self), dtype=bool)
        keep[j[hit]] = False                         # patch rows made again now
        kept = np.flatnonzero(keep)
        all_pos = np.concatenate([moved[self.pos[kept]], np.asarray(pos, dtype=np.int64)])
        order = np.argsort(all_pos, kind="stable")
        both = join_sparse([self.rows, new], self.rows.dim)
        pick = np.concatenate([kept, len(self) + np.arange(len(new), dtype=np.int64)])[order]
        rows = _csr(*both.take(pick), self.rows.dim) if len(pick) else join_sparse([], self.rows.dim)
        all_ids, all_hashes = [*self.ids, *ids], [*self.hashes, *hashes]
        return Patch(self.base_dir, self.meta, self.base_keys, self.base_hashes, self.base_rows, all_pos[order],
                     np.concatenate([self.base[kept], base_of])[order], [all_ids[i] for i in pick.tolist()],
                     [all_hashes[i] for i in pick.tolist()], rows)

    def arrays(self) -> dict[str, np.ndarray]:
        """What <name>.patch.npz holds."""
        blob, off = _packed(self.ids)      # as `IdKeys.arrays` packs them, without its sort
        r = self.rows
        return {"pos": self.pos, "base": self.base, "keys": blob, "koff": off,
                "hashes": np.array(self.hashes, dtype=f"S{max(1, max(map(len, self.hashes), default=1))}"),
                "indptr": r.indptr, "low": r.low, "bands": r.bands, "data": r.data}

    @classmethod
    def load(cls, path: Path, want: dict, base_dir: Path, meta: dict, keys: tuple[np.ndarray, ...],
             hashes: np.ndarray, rows: SparseRows, dim: int) -> "Patch":
        """The saved patch of a base (`want`: what the id map says of it); ValueError when it is damaged or
        does not fit the base."""
        import zipfile

        if path.stat().st_size != int(want.get("bytes", -1)):
            raise ValueError("size")
        try:
            with np.load(path, allow_pickle=False) as z:
                a = {k: z[k] for k in ("pos", "base", "keys", "koff", "hashes", "indptr", "low", "bands", "data")}
        except (zipfile.BadZipFile, KeyError, OSError, EOFError) as exc:
            raise ValueError(str(exc)) from None
        k, off = len(a["pos"]), a["koff"]
        if len(off) != k + 1 or a["indptr"].shape != (k + 1,) or k != int(want.get("rows", -1)) \
                or a["data"].dtype != DTYPE or a["low"].dtype != np.uint8 \
                or a["bands"].shape != (k, _n_bands(dim)) \
                or not len(a["low"]) == len(a["data"]) == int(a["indptr"][-1]):
            raise ValueError("shape")
        blob = bytes(a["keys"])
        ids = [blob[s:e] for s, e in zip(off.tolist(), off[1:].tolist())]
        patch = cls(base_dir, meta, keys, hashes, rows, a["pos"], a["base"], ids,
                    a["hashes"].tolist(), SparseRows(a["indptr"], a["low"], a["bands"], a["data"], dim))
        if patch.n != int(want.get("count", -1)) or not patch.check():
            raise ValueError("layout")
        return patch


class PatchedRows:
    """The rows of a patched index in logical order, searched as one store: every base row scored as the base
    scores it (the replaced ones left out), every patch row as a row of the same kind is, so a search returns
    the rows and float32 scores a fresh build's index returns (ties to the lower logical row)."""
    kind = "sparse"

    def __init__(self, patch: Patch) -> None:
        self.patch, self.base, self.dim = patch, patch.base_rows, patch.base_rows.dim

    def __len__(self) -> int:
        return self.patch.n

    @property
    def postings(self) -> Any:
        return self.base.postings

    def dense(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        hit, j = self.patch.find(rows)
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        if hit.any():
            out[hit] = self.patch.rows.dense(j[hit])
        if not hit.all():
            out[~hit] = self.base.dense(self.patch.base_of(rows[~hit]))
        return out

    def blocks(self, q: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """The base's blocks in logical order, each widened by the patch rows that fall among its rows."""
        p = self.patch
        psims = np.concatenate([s for _, s in p.rows.blocks(q)], axis=1) if len(p) else \
            np.zeros((len(q), 0), dtype=np.float32)
        start = 0
        for s, sims in self.base.blocks(q):
            e = s + sims.shape[1]
            end = p.n if e >= p.n_base else int(p.logical(np.array([e]))[0])
            out = np.empty((len(q), end - start), dtype=np.float32)
            out[:, p.logical(np.arange(s, e)) - start] = sims
            a, b = np.searchsorted(p.pos, [start, end]).tolist()
            out[:, p.pos[a:b] - start] = psims[:, a:b]
            yield start, out
            start = end
        if start < p.n:                     # an empty base: the patch rows alone
            yield start, psims[:, np.searchsorted(p.pos, start):]

    def posting_top(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """`SparseRows.posting_top` of the logical rows: the base's best k live rows (asked again for as many
        more as its best held rows the patch made again: those rarely lead, and each one asked for weakens the
        pruning), the patch's best k, merged."""
        p = self.patch
        made = p.base[p.base >= 0]
        want = k
        while True:
            rows, sims = self.base.posting_top(q, want)
            live = ~np.isin(rows, made) if len(made) else np.ones(len(rows), dtype=bool)
            if int(live.sum()) >= k or len(rows) < want or want >= k + len(made):
                break
            want = k + int((~live).sum())
        rows, sims = rows[live][:k], sims[live][:k]
        rows = p.logical(rows)
        if len(p):
            prow, psim = p.rows.posting_top(q, min(k, len(p)))
            rows, sims = np.concatenate([rows, p.pos[prow]]), np.concatenate([sims, psim])
        best = np.lexsort((rows, -sims))[:k]
        return rows[best], sims[best].astype(np.float32)


class PatchedKeys(_Listing):
    """The ids of a patched index in logical order (`IdKeys` of the base, the patch's ids at their rows)."""

    def __init__(self, base: IdKeys, patch: Patch) -> None:
        self._base, self._patch = base, patch
        self._all: list[str] | None = None

    def __len__(self) -> int:
        return self._patch.n

    def _one(self, i: int) -> str:
        hit, j = self._patch.find(np.array([i]))
        if hit[0]:
            return self._patch.ids[int(j[0])].decode("utf-8")
        return self._base[int(self._patch.base_of(np.array([i]))[0])]

    def position(self, key: str) -> int | None:
        """The logical row of `key`, or None."""
        at = self._patch._at.get(key.encode("utf-8"))
        if at is not None:
            return at
        r = self._base.position(key)
        return None if r is None else int(self._patch.logical(np.array([r]))[0])

    def _listed(self) -> list[str]:
        if self._all is None:
            is_new, old_of, _ = self._patch.layout()
            out = np.empty(len(self), dtype=object)
            out[~is_new] = np.array(self._base._listed(), dtype=object)[old_of[~is_new]]
            out[self._patch.pos] = [i.decode("utf-8") for i in self._patch.ids]
            self._all = out.tolist()
        return self._all


def scratch(buffers: dict, name: str, size: int, dtype: Any, fill: Any = None) -> np.ndarray:
    """The first `size` items of the scratch array `name` in `buffers`, grown when too small and kept across
    calls: a query gathers megabytes, and a fresh array of that size costs its page faults every time. `fill`:
    the value a new array is filled with (a caller that leaves it as it found it then has it so every time)."""
    buf = buffers.get(name)
    if buf is None or len(buf) < size:
        buf = buffers[name] = np.empty(max(size, 1 << 16), dtype=dtype)
        if fill is not None:
            buf.fill(fill)
    return buf[:size]


def exact_search(rows_store, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact cosine top-k over a DenseRows or SparseRows: (rows int64 (nq, k), sims float32), best first."""
    q = np.ascontiguousarray(queries, dtype=np.float32)
    k = min(k, len(rows_store))
    if k <= 0:
        return np.zeros((len(q), 0), dtype=np.int64), np.zeros((len(q), 0), dtype=np.float32)
    if getattr(rows_store, "postings", None) is not None and len(q) <= _POSTING_QUERIES:
        tops = [rows_store.posting_top(x, k) for x in q]
        return (np.stack([r for r, _ in tops]).astype(np.int64),
                np.stack([s for _, s in tops]).astype(np.float32))
    return _merge_topk([_block_topk(sims, s, k) for s, sims in rows_store.blocks(q)], k)


def top_order(scores: np.ndarray, m: int) -> np.ndarray:
    """`np.argsort(-scores, kind="stable")[:m]` (the m best, ties to the lower index: `_merge_topk`'s order)
    without sorting the rest. Over blocks of the scores, the m-th best block maximum is a floor no m-th best
    score is under, so only the scores at or above it are sorted (a fact search: a dozen of 1.9M, where a
    partition of every score took 19 ms; 100,000 chunks: 0.2 ms against 8 ms for the sort)."""
    n = len(scores)
    m = min(m, n)
    if n <= 4 * m or m <= 0:
        return np.argsort(-scores, kind="stable")[:m]
    width = max(1, n // (2 * m))
    blocks = n // width
    # any blocks do; numpy takes maxima fastest along long rows: short blocks as columns (block r holds every
    # blocks-th score from r: 0.3 -> 0.2 ms for m = 1,024 of 100,000), long ones as rows
    grid = scores[: blocks * width]
    peaks = grid.reshape(width, blocks).max(axis=0) if width < blocks else grid.reshape(blocks, width).max(axis=1)
    floor = np.partition(peaks, len(peaks) - m)[len(peaks) - m]
    cand = np.flatnonzero(scores >= floor)
    if len(cand) < m:                      # NaN compares false: sort every score as argsort would
        return np.argsort(-scores, kind="stable")[:m]
    return cand[np.argsort(-scores[cand], kind="stable")][:m]


class VectorIndex:
    """One named cosine index: unit rows (float16) in id order, the text hash each came from, and for a large
    index an hnswlib graph whose label of row p is labels[p]."""

    def __init__(self, name: str, dim: int, settings: VectorSettings, model_id: str) -> None:
        self.name = name
        self.dim = int(dim)
        self.settings = settings
        self.model_id = model_id
        self.ids: list[str] = []          # live ids, in row order
        self.hashes: list[str] = []       # text hash per row
        self.labels: np.ndarray = np.zeros(0, dtype=np.int64)   # hnsw label per row (graph only)
        self.m = settings.m
        self.ef_construction = settings.ef_construction
        self._pos: dict[str, int] | None = None
        self._free = 0                    # tombstoned graph slots awaiting reuse
        self._next_label = 0
        self._index = None
        self._rows: DenseRows | SparseRows = DenseRows(np.zeros((0, self.dim), dtype=DTYPE))
        self._lut: np.ndarray | None = None
        self.synced = ""                  # what the rows were last brought up to date with (the caller's token)
        self._keys: tuple[np.ndarray, ...] | None = None     # IdKeys.arrays(ids), when known without listing ids
        self._hash_array: np.ndarray | None = None           # fixed_bytes(hashes), likewise
        self._fixed: tuple[np.ndarray, np.ndarray] | None = None   # (id blob, `fixed_width` of it): id_array
        self._patch: Patch | None = None  # rows kept beside the saved base (an incremental run's `insert`)
        self._saved: tuple[Path, dict] | None = None       # the folder and header of the base on disk

    # -- construction -----------------------------------------------------------------------------------
    @classmethod
    def create(cls, name: str, dim: int, settings: VectorSettings, model_id: str) -> "VectorIndex":
        return cls(name, dim, settings, model_id)

    @classmethod
    def load_or_create(cls, vectors_dir: Path, name: str, settings: VectorSettings, model_id: str,
                       dim: int) -> "VectorIndex":
        """The saved index when it was built by this embedder at this dimension (0: not known yet, any), else a
        fresh empty one."""
        try:
            idx = cls.load(vectors_dir, name, settings)
        except HragError:
            idx = None
        if idx is None or idx.model_id != model_id or (dim and idx.dim != dim and len(idx)):
            return cls.create(name, dim, settings, model_id)
        if not len(idx) and dim:
            idx.dim = dim
            idx._rows = DenseRows(np.zeros((0, dim), dtype=DTYPE))
        return idx

    @classmethod
    def build(cls, name: str, ids: list[str], matrix: np.ndarray, settings: VectorSettings, model_id: str,
              hashes: list[str] | None = None) -> "VectorIndex":
        idx = cls(name, int(np.asarray(matrix).shape[1]) if len(ids) else 0, settings, model_id)
        idx.sync(list(ids), list(hashes) if hashes is not None else [""] * len(ids), matrix)
        return idx

    def _uses_graph(self, n: int) -> bool:
        return n >= max(1, self.settings.exact_below)

    def missing(self, ids: list[str], hashes: list[str]) -> np.ndarray:
        """Positions in `ids` whose (id, hash) this index does not hold: the texts to embed before `sync`."""
        return np.flatnonzero(self.stored_rows(ids, hashes) < 0)

    def stored_rows(self, ids: Iterable[str], hashes: Iterable[str]) -> np.ndarray:
        """Per (id, hash), the row holding its vector (-1: none, or one made from another text)."""
        row = self.stored_row
        return np.fromiter((row(i, h) for i, h in zip(ids, hashes)), dtype=np.int64)

    def stored_row(self, item_id: str, text_hash: str) -> int:
        """The row with a vector for this id made from a text with this hash, else -1."""
        r = self._positions().get(item_id)
        return r if r is not None and self.hashes[r] == text_hash else -1

    def sync(self, ids: list[str], hashes: list[str], vectors, rows: np.ndarray | None = None,
             stored: np.ndarray | None = None) -> dict:
        """Make the index hold exactly `ids` in this order. `vectors` holds a row per id, or (with `rows`, as
        `missing` returned) a row per listed position only, the other rows being kept from the index (which
        must hold them). `vectors` may also be an iterator of row blocks in that order, so a caller can embed
        millions of texts without holding them all; a block may be SparseRows of unit rows (`sparse_rows` of
        an embedder's output), which a worker process can hand back at a fraction of the dense bytes. Returns
        counts: added, removed, kept, rebuilt (0/1: the graph was built from scratch). `stored` (`stored_rows`
        of the same ids and hashes, when the caller has it) spares a second lookup of every id."""
        n = len(ids)
        if len(set(ids)) != n:
            raise ValueError(f"index {self.name}: duplicate ids")
        self._fold()
        if stored is None or len(stored) != n:
            stored = self.stored_rows(ids, hashes)
        if rows is None:     # a full matrix: only the rows the index lacks are taken from it
            todo = np.flatnonzero(stored < 0)
            vectors = np.asarray(vectors)[todo] if n else vectors
        else:
            todo = np.asarray(rows, dtype=np.int64)
        blocks = iter([vectors]) if isinstance(vectors, np.ndarray) or not hasattr(vectors, "__next__") \
            else vectors
        first = next(blocks, None) if len(todo) else None
        if first is not None and self.dim == 0:
            self.dim = first.dim if isinstance(first, SparseRows) else int(np.asarray(first).shape[-1])
        is_new = np.zeros(n, dtype=bool)
        is_new[todo] = True
        lacking = np.flatnonzero(~is_new & (stored < 0))
        if len(lacking):
            raise ValueError(f"index {self.name}: no stored vector for {ids[lacking[0]]!r}; pass it in `vectors`")
        old_row = np.where(is_new, -1, stored)
        kept_rows = old_row[~is_new]
        gone = np.ones(len(self.ids), dtype=bool)
        gone[kept_rows] = False
        n_gone = int(gone.sum())

        rows_store = self._store(n, todo, is_new, old_row, first, blocks)
        rebuilt = 0
        old_labels = self.labels
        labels = np.full(n, -1, dtype=np.int64)
        if not self._uses_graph(n) or rows_store.kind == "sparse":
            # sparse rows are scanned exactly at any size: an HNSW graph would hold every vector dense (8 KB at
            # 2048 dims), more than the whole sparse index
            self._index, self._free, self._next_label = None, 0, 0
        elif (self._index is None or self.m != self.settings.m or self.ef_construction != self.settings.ef_construction
              or (self._free + n_gone) > _REBUILD_DELETED_FRACTION * max(n, 1)):
            self._build_graph(rows_store)
            labels = np.arange(n, dtype=np.int64)
            rebuilt = 1
        else:
            for lab in old_labels[gone]:
                self._index.mark_deleted(int(lab))
            self._free += n_gone
            labels[~is_new] = old_labels[kept_rows]
            labels[todo] = np.arange(self._next_label, self._next_label + len(todo), dtype=np.int64)
            self._next_label += len(todo)
            reuse = min(self._free, len(todo))
            needed = self._index.get_current_count() + len(todo) - reuse
            if needed > self._index.get_max_elements():
                self._index.resize_index(max(needed, int(self._index.get_max_elements() * 1.5)))
            # replace_deleted reuses tombstoned slots first, so memory stays bounded by the live count
            for s in range(0, len(todo), _dense_rows(self.dim)):
                part = todo[s:s + _dense_rows(self.dim)]
                self._index.add_items(rows_store.dense(part), labels[part], replace_deleted=True)
            self._free -= reuse
        self.ids, self.hashes, self.labels = list(ids), list(hashes), labels
        self._rows, self._lut, self._pos, self._keys, self._hash_array = rows_store, None, None, None, None
        return {"added": len(todo), "removed": n_gone, "kept": n - len(todo), "rebuilt": rebuilt}

    @staticmethod
    def insert_positions(n_old: int, old_rows: np.ndarray, before: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the final row of each id listed for `insert`, the final row of each old row)."""
        old_rows, before = np.asarray(old_rows, dtype=np.int64), np.asarray(before, dtype=np.int64)
        ins = old_rows < 0
        k = int(ins.sum())
        if bool((before[ins] > n_old).any()) or bool((before[ins] < 0).any()):
            raise ValueError("an id is inserted ahead of a row the index does not have")
        ahead = np.cumsum(np.bincount(before[ins], minlength=n_old + 1))        # inserted at or before old row r
        moved = np.arange(n_old, dtype=np.int64) + ahead[:n_old]                 # old row -> its new row
        pos = np.empty(len(old_rows), dtype=np.int64)
        pos[ins] = before[ins] + np.arange(k)
        pos[~ins] = moved[old_rows[~ins]]
        if len(pos) and (bool((np.diff(pos) <= 0).any()) or int(pos[-1]) >= n_old + k):
            raise ValueError("ids to insert must be listed in their final order")
        return pos, moved

    def id_array(self) -> np.ndarray:
        """The ids in row order as fixed-width bytes (`fixed_width`), from the saved arrays (a patched index:
        spliced from its base's)."""
        if self._patch is not None:
            return self._patch.id_array()
        blob, off = self._key_arrays(order=False)[:2]
        if self._fixed is None or self._fixed[0] is not blob:
            self._fixed = (blob, fixed_width(blob, off))
        return self._fixed[1]

    def id_order(self) -> np.ndarray:
        """Rows in id order (bytes)."""
        return np.asarray(self._key_arrays()[2], dtype=np.int64)

    def _key_arrays(self, order: bool = True) -> tuple[np.ndarray, ...]:
        """`IdKeys.arrays` of the ids in row order (a patched index: spliced from its base's and its patch's;
        without `order`, the blob and offsets alone)."""
        if self._patch is not None:
            return self._patch.keys(order)
        return self._keys or IdKeys.arrays(self.ids)

    def hash_array(self) -> np.ndarray:
        """The text hashes in row order as fixed-width bytes (`fixed_bytes`), from the saved array."""
        if self._patch is not None:
            return self._patch.hash_array()
        return self._hash_array if self._hash_array is not None else fixed_bytes(self.hashes)

    def hash_rows(self, rows: np.ndarray) -> list[str]:
        """The text hash of each of these rows ("" for -1)."""
        rows = np.asarray(rows, dtype=np.int64)
        at = np.maximum(rows, 0)
        if self._patch is not None:          # these rows' hashes alone, without splicing every row's
            got = self._patch.hashes_of(at).tolist() if len(self) else [b""] * len(rows)
        else:
            arr = self.hash_array()
            got = arr[at].tolist() if len(arr) else [b""] * len(rows)
        return [h.decode("utf-8") if r >= 0 else "" for h, r in zip(got, rows.tolist())]

    def insertable(self) -> bool:
        """Whether `insert` can take rows: a saved index without a graph (sparse rows, or dense under
        exact_below), its id and hash arrays at hand, its postings mapped (not read by `ReadAt`)."""
        read_at = self._rows.kind == "sparse" and any(isinstance(a, ReadAt) for a in (self._rows.postings or ()))
        saved = self._patch is not None or (self._keys is not None and self._hash_array is not None)
        return self._index is None and saved and not read_at and \
            (self._rows.kind == "sparse" or not self._uses_graph(len(self)))

    def insert(self, ids: list[str], hashes: list[str], old_rows: np.ndarray, before: np.ndarray, vectors
               ) -> dict:
        """Rows for `ids` (made from texts with `hashes`), listed in their final order: one whose old_rows entry
        is a row of the index is made again in place, one with -1 is inserted ahead of old row before[i]
        (len(self): at the end). `vectors` as `sync` takes them, a row per listed id. Every other row is kept
        where it was, and the id blob, its sorted order and the hash array are spliced, so an index of millions
        of rows takes a few thousand without a Python object per row (ids stay `IdKeys`).

        A sparse index keeps the rows in a `Patch` beside its saved base (saving writes the patch alone) until
        the patch passes PATCH_SHARE of the base's rows; then, and for a dense index, every array is spliced."""
        if not self.insertable():
            raise ValueError(f"index {self.name}: insert needs a saved index without a graph")
        old_rows, before = np.asarray(old_rows, dtype=np.int64), np.asarray(before, dtype=np.int64)
        ins = old_rows < 0
        n_old = len(self)
        n = n_old + int(ins.sum())
        pos, moved = self.insert_positions(n_old, old_rows, before)
        blocks = iter([vectors]) if isinstance(vectors, np.ndarray) or not hasattr(vectors, "__next__") \
            else vectors
        first = next(blocks, None) if len(pos) else None
        counts = {"added": len(pos), "removed": 0, "kept": n - len(pos), "rebuilt": 0}
        enc = [i.encode("utf-8") for i in ids]
        if self._rows.kind == "sparse" and self._saved is not None and \
                (first is None or isinstance(first, SparseRows) or mostly_zero(_as_matrix(first, self.dim))):
            new = join_sparse(list(self._incoming(len(pos), first, blocks, True)), self.dim)
            patch = (self._patch if self._patch is not None else self._empty_patch()).spliced(
                pos, old_rows, moved, enc, [h.encode("utf-8") for h in hashes], new)
            if len(patch):                   # nothing to put in: the index stays as it is
                self._use_patch(patch)
            if len(patch) > PATCH_SHARE * patch.n_base:
                self._fold()
            return counts
        self._fold()
        is_new = np.zeros(n, dtype=bool)
        is_new[pos] = True
        old_of = np.full(n, -1, dtype=np.int64)
        old_of[moved] = np.arange(n_old, dtype=np.int64)
        old_of[pos] = -1
        rows_store = self._store(n, pos, is_new, old_of, first, blocks)
        old_fixed = self.id_array()
        blob, off, order = self._keys                                           # type: ignore[misc]
        keys = _splice_keys(blob, off, order, is_new, old_of, moved, pos, ins, enc, old_fixed)
        fixed = _spliced_fixed(old_fixed, is_new, old_of, pos, enc)
        hash_arr = _spliced_fixed(self._hash_array, is_new, old_of, pos,          # type: ignore[arg-type]
                                  [h.encode("utf-8") for h in hashes])
        self.ids, self.hashes = IdKeys(*keys), HashColumn(hash_arr)              # type: ignore[assignment]
        self._keys, self._hash_array, self._fixed = keys, hash_arr, (keys[0], fixed)
        self.labels = np.full(n, -1, dtype=np.int64)
        self._rows, self._lut, self._pos = rows_store, None, None
        return counts

    def _empty_patch(self) -> Patch:
        """A patch of nothing over this saved index."""
        rows = self._rows
        assert self._saved is not None and self._keys is not None and self._hash_array is not None
        assert isinstance(rows, SparseRows)
        return Patch(self._saved[0], self._saved[1], self._keys, self._hash_array, rows, np.zeros(0, np.int64),
                     np.zeros(0, np.int64), [], [], join_sparse([], self.dim))

    def _use_patch(self, patch: Patch) -> None:
        """Present the base and `patch` as the index (ids, hashes, rows in logical order)."""
        self._patch = patch
        self._keys, self._hash_array, self._fixed = patch.base_keys, patch.base_hashes, None
        self.ids = PatchedKeys(IdKeys(*patch.base_keys[:3]), patch)           # type: ignore[assignment]
        self.hashes = HashColumn(None, patch.hash_array)                     # type: ignore[assignment]
        self.labels = np.full(patch.n, -1, dtype=np.int64)
        self._rows, self._lut, self._pos = PatchedRows(patch), None, None

    def _fold(self) -> None:
        """A patched index made one whole index in memory (the next save writes every array). Every caller is
        about to make the index differ from the base on disk, so that base is forgotten: a later `insert` must
        not tag a patch with it (a load would apply the patch to the wrong rows)."""
        self._saved = None
        if self._patch is None:
            return
        keys, hashes, rows = self._patch.folded()
        self._patch = None
        self.ids, self.hashes = IdKeys(*keys), HashColumn(hashes)            # type: ignore[assignment]
        self._keys, self._hash_array, self._fixed = keys, hashes, None
        self._rows, self._lut, self._pos = rows, None, None

    def _incoming(self, count: int, first, blocks, sparse: bool) -> Iterator[SparseRows | np.ndarray]:
        """The `count` rows to add, yielded block by block as unit rows (sparse rows, or dense blocks) so a dense
        build writes each block as it arrives; the counts are checked as they come and once the blocks end."""
        done = 0
        block = first
        while block is not None:
            if isinstance(block, SparseRows) and block.dim != self.dim:
                raise ValueError(f"expected vectors of dimension {self.dim}, got {block.dim}")
            b = block if isinstance(block, SparseRows) and sparse else _unit(_as_matrix(
                block.dense(np.arange(len(block))) if isinstance(block, SparseRows) else block, self.dim))
            if done + len(b) > count:
                raise ValueError(f"index {self.name}: more vectors than the {count} rows to add")
            yield (b if isinstance(b, SparseRows) else sparse_rows(b)) if sparse else b
            done += len(b)
            block = next(blocks, None)
        if done != count:
            raise ValueError(f"index {self.name}: {count} rows to add, {done} vectors given")

    def _store(self, n: int, todo: np.ndarray, is_new: np.ndarray, old_row: np.ndarray, first, blocks
               ) -> DenseRows | SparseRows:
        """The new rows in `ids` order: kept rows from the current store, the rest from the incoming blocks.
        Sparse when the first incoming block (else the current store) is `mostly_zero`."""
        if isinstance(first, SparseRows):
            b0, sparse = first, True
        elif first is not None:
            b0 = _as_matrix(first, self.dim)
            sparse = mostly_zero(b0)
        else:
            b0, sparse = None, self._rows.kind == "sparse"
        kept = np.flatnonzero(~is_new)
        done = 0
        dense_out = None if sparse else np.empty((n, self.dim), dtype=DTYPE)
        old_rows, old_of = self._rows, old_row      # where kept rows come from: a store and a row per position
        if sparse and self._rows.kind != "sparse" and len(kept):   # dense to sparse (rare): convert the kept rows
            step = _dense_rows(self.dim)
            old_rows = join_sparse([sparse_rows(self._rows.dense(old_row[kept[s:s + step]]))
                                    for s in range(0, len(kept), step)], self.dim)
            old_of = np.full(n, -1, dtype=np.int64)
            old_of[kept] = np.arange(len(kept))
        elif not sparse:
            for s in range(0, len(kept), _dense_rows(self.dim)):   # kept rows, in blocks (old may be a memmap)
                pos = kept[s:s + _dense_rows(self.dim)]
                dense_out[pos] = self._rows.dense(old_row[pos])
        got = self._incoming(len(todo), b0, blocks, sparse)
        if sparse:
            return merge_rows(is_new, old_rows, old_of, join_sparse(list(got), self.dim))  # type: ignore[arg-type]
        for b in got:                                 # each dense block written as it arrives
            dense_out[todo[done:done + len(b)]] = b
            done += len(b)
        return DenseRows(dense_out)

    def _build_graph(self, rows_store: DenseRows | SparseRows) -> None:
        n = len(rows_store)
        self.m, self.ef_construction = self.settings.m, self.settings.ef_construction
        index = _hnswlib().Index(space="cosine", dim=self.dim)
        index.init_index(max_elements=max(n, 16), M=self.m, ef_construction=self.ef_construction,
                         random_seed=100, allow_replace_deleted=True)
        index.set_ef(max(self.settings.ef_search, 16))
        step = _dense_rows(self.dim)
        for s in range(0, n, step):                  # float32 copies one block at a time; every core inserts
            rows = np.arange(s, min(n, s + step), dtype=np.int64)
            index.add_items(rows_store.dense(rows), rows, num_threads=os.cpu_count() or 1)
        self._index, self._free, self._next_label = index, 0, n

    # -- reading ----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.ids)

    def _positions(self) -> dict[str, int]:
        if self._pos is None:
            self._pos = {i: p for p, i in enumerate(self.ids)}
        return self._pos

    def position(self, item_id: str) -> int | None:
        """The row of an id; a query's index (ids memory-mapped, `IdKeys`) searches its sorted ids instead of
        building the map of every id."""
        if self._pos is None and isinstance(self.ids, (IdKeys, PatchedKeys)):
            return self.ids.position(item_id)
        return self._positions().get(item_id)

    def rows(self) -> DenseRows | SparseRows:
        """The stored unit rows as they are kept (sparse rows stay sparse), row i = self.ids[i]; a patched
        index's spliced in memory (the synonyms stage reads every name row)."""
        if self._patch is not None:
            return self._patch.merged_rows()
        return self._rows

    def vectors(self) -> np.ndarray:
        """All live vectors (unit rows, float16), row i = self.ids[i]: memory-mapped when stored dense."""
        if self._rows.kind == "dense":
            return self._rows.matrix
        return self._rows.dense(np.arange(len(self.ids))).astype(DTYPE)

    def scores(self, query: np.ndarray) -> np.ndarray:
        """float32 (len,): the cosine of one query with every row, exact (ppr and naive score every chunk)."""
        q = _as_matrix(query, self.dim)
        out = np.empty(len(self.ids), dtype=np.float32)
        for s, sims in self._rows.blocks(q):
            out[s:s + sims.shape[1]] = sims[0]
        return out

    def search(self, queries: np.ndarray, k: int, ef: int | None = None) -> tuple[list[list[str]], np.ndarray]:
        """Top-k ids by cosine per query, best first; exact unless the index has a graph (>= exact_below
        items). `ef` overrides settings.ef_search for this call."""
        q = _as_matrix(queries, self.dim)
        n = len(self.ids)
        k = int(k)
        sims_out = np.full((len(q), max(k, 0)), -np.inf, dtype=np.float32)
        if n == 0 or k <= 0:
            return [[] for _ in range(len(q))], sims_out
        kk = min(k, n)
        if self._index is None:
            rows, sims = exact_search(self._rows, q, kk)
        else:
            rows, sims = self._hnsw_search(q, kk, ef or self.settings.ef_search)
        ids_out: list[list[str]] = []
        for r in range(len(q)):
            valid = rows[r] >= 0
            found = [int(p) for p in rows[r][valid]]
            ids_out.append([self.ids[p] for p in found])
            sims_out[r, : int(valid.sum())] = sims[r][valid]
        return ids_out, sims_out

    def _hnsw_search(self, q: np.ndarray, k: int, ef: int) -> tuple[np.ndarray, np.ndarray]:
        self._index.set_ef(max(ef, k))
        try:
            labels, dists = self._index.knn_query(q, k=k)
        except RuntimeError:
            # hnswlib refuses when it cannot fill k results (tombstones, tiny ef): answer exactly instead
            return exact_search(self._rows, q, k)
        rows = self._label_rows()[labels.astype(np.int64)]
        return rows, (1.0 - dists).astype(np.float32)

    def _label_rows(self) -> np.ndarray:
        """label -> row in self.ids (-1 for tombstones), as an array so 1M results map in one gather."""
        if self._lut is None:
            top = max(self._next_label, int(self.labels.max(initial=-1)) + 1)
            lut = np.full(top, -1, dtype=np.int64)
            lut[self.labels] = np.arange(len(self.labels), dtype=np.int64)
            self._lut = lut
        return self._lut

    # -- persistence ------------------------------------------------------------------------------------
    def _posted(self) -> bool:
        """Whether the index is saved by column (postings, its values once): sparse rows that ppr and naive
        search (facts, chunks; relations when embedded). Not the entities (local/hybrid/mix only, 85M values at
        100,000 passages) nor the synonym stage's name vectors, which the synonyms stage reads row by row: a
        posted index's rows are derived from its columns on each such load."""
        return self._rows.kind == "sparse" and len(self.ids) > 0 and self.name in POSTED

    @staticmethod
    def paths(vectors_dir: Path, name: str) -> tuple[Path, Path]:
        return Path(vectors_dir) / f"{name}.hnsw", Path(vectors_dir) / f"{name}.ids.jsonl"

    @staticmethod
    def matrix_path(vectors_dir: Path, name: str) -> Path:
        """The dense float16 rows."""
        return Path(vectors_dir) / f"{name}.f16.npy"

    @staticmethod
    def sparse_paths(vectors_dir: Path, name: str) -> tuple[Path, Path, Path, Path]:
        """The sparse rows: row starts, column bytes, values per band, float16 values."""
        d = Path(vectors_dir)
        return (d / f"{name}.csr-indptr.npy", d / f"{name}.csr-cols.npy", d / f"{name}.csr-bands.npy",
                d / f"{name}.csr-data.npy")

    @staticmethod
    def query_paths(vectors_dir: Path, name: str) -> tuple[Path, ...]:
        """What a query reads instead of parsing the id map or scanning every value: the ids (UTF-8 blob,
        offsets, rows in id order) and, for sparse rows, the column postings (starts, rows, float16 values)."""
        d = Path(vectors_dir)
        return (d / f"{name}.keys.npy", d / f"{name}.koff.npy", d / f"{name}.korder.npy",
                d / f"{name}.csc-ptr.npy", d / f"{name}.csc-rows.npy", d / f"{name}.csc-bands.npy",
                d / f"{name}.csc-data.npy")

    @staticmethod
    def row_paths(vectors_dir: Path, name: str) -> tuple[Path, Path]:
        """The text hash of each row (fixed-width bytes) and, for an index with a graph, each row's label."""
        d = Path(vectors_dir)
        return d / f"{name}.hashes.npy", d / f"{name}.labels.npy"

    @classmethod
    def files(cls, vectors_dir: Path, name: str) -> list[Path]:
        """Every file of one index, including format 1's <name>.npy and format 2's two-byte columns, for
        removal."""
        d = Path(vectors_dir)
        return [*cls.paths(vectors_dir, name), cls.matrix_path(vectors_dir, name),
                *cls.sparse_paths(vectors_dir, name), *cls.query_paths(vectors_dir, name),
                *cls.row_paths(vectors_dir, name), cls.patch_path(vectors_dir, name), d / f"{name}.npy",
                d / f"{name}.csr-indices.npy"]

    @staticmethod
    def patch_path(vectors_dir: Path, name: str) -> Path:
        """The patch segment beside the base (`Patch`)."""
        return Path(vectors_dir) / f"{name}.patch.npz"

    def save(self, vectors_dir: Path) -> None:
        """Matrix and graph first, each temp + rename, then the id map that vouches for them (atomic). A
        patched index saved where its base is writes its patch and the id map alone."""
        hnsw_path, ids_path = self.paths(vectors_dir, self.name)
        if self._patch is not None:
            if self._save_patch(vectors_dir):
                return
            self._fold()
        hnsw_path.parent.mkdir(parents=True, exist_ok=True)
        size = 0
        if self._index is not None:
            with store.atomic_path(hnsw_path) as tmp:
                self._index.save_index(str(tmp))
                size = os.path.getsize(tmp)
        else:
            hnsw_path.unlink(missing_ok=True)
        rs = self._rows
        posted = self._posted()
        if rs.kind == "dense":
            arrays = [(self.matrix_path(vectors_dir, self.name), rs.matrix)]
        elif posted:        # the values once, by column (the postings below); the row starts give each row's size
            arrays = [(self.sparse_paths(vectors_dir, self.name)[0], rs.indptr)]
        else:
            arrays = list(zip(self.sparse_paths(vectors_dir, self.name), (rs.indptr, rs.low, rs.bands, rs.data)))
        postings = (rs.postings if rs.by_column_only else build_postings(rs)) if posted else ()
        query = [*(self._keys or IdKeys.arrays(self.ids)), *postings]
        arrays += list(zip(self.query_paths(vectors_dir, self.name), query))
        hashes = self.hash_array()
        arrays += list(zip(self.row_paths(vectors_dir, self.name), (hashes, self.labels)[:2 if self._index else 1]))
        for path, arr in arrays:
            if _maps_whole(arr, path):     # that very file (an insert of nothing): its bytes are already there
                continue
            with store.atomic_writer(path) as fh:
                np.save(fh, np.ascontiguousarray(arr), allow_pickle=False)
        written = {path for path, _ in arrays}
        for path in self.files(vectors_dir, self.name)[2:]:       # the other storage's and format 1's files
            if path not in written:
                path.unlink(missing_ok=True)
        header = {"_meta": {"format": FORMAT, "name": self.name, "dim": self.dim, "model_id": self.model_id,
                            "space": "cosine", "m": self.m, "ef_construction": self.ef_construction,
                            "count": len(self.ids), "free": self._free, "next_label": self._next_label,
                            "hnsw_bytes": size, "matrix_rows": len(self.ids), "storage": rs.kind,
                            "values": int(rs.matrix.size if rs.kind == "dense" else rs.values),
                            "key_bytes": len(query[0]), "synced": self.synced}}
        store.write_jsonl(ids_path, [header], compress=True)
        self._keys, self._hash_array = tuple(query[:3]), hashes
        self._saved = (Path(vectors_dir), header["_meta"])

    def _save_patch(self, vectors_dir: Path) -> bool:
        """The patch, then the id map naming it (its base's header, the patch's size and rows); False when the
        folder does not hold the patch's base (the caller saves the index whole)."""
        patch = self._patch
        assert patch is not None
        ids_path = self.paths(vectors_dir, self.name)[1]
        try:
            if not os.path.samefile(self.row_paths(vectors_dir, self.name)[0],
                                    self.row_paths(patch.base_dir, self.name)[0]):
                return False
        except OSError:
            return False
        path = self.patch_path(vectors_dir, self.name)
        with store.atomic_path(path) as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, **patch.arrays())
            size = os.path.getsize(tmp)
        meta = {**patch.meta, "format": FORMAT, "synced": self.synced,
                "patch": {"rows": len(patch), "count": patch.n, "bytes": size}}
        store.write_jsonl(ids_path, [{"_meta": meta}], compress=True)
        return True

    def digest(self) -> str:
        """A digest of the ids and text hashes in row order (the synonyms stage's output digest), from their
        arrays: the same for an index brought up to date by `insert` as for a fresh build."""
        import hashlib

        keys = self._key_arrays(order=False)
        hashes = self.hash_array()
        h = hashlib.blake2b(digest_size=12)
        for arr in (keys[0], keys[1], np.frombuffer(hashes.dtype.str.encode(), np.uint8), hashes):
            h.update(np.ascontiguousarray(arr).view(np.uint8).data)
        return h.hexdigest()

    @classmethod
    def load(cls, vectors_dir: Path, name: str, settings: VectorSettings,
             lazy_ids: bool = False, read_at: bool | None = None) -> "VectorIndex | None":
        """The saved index, or None when it was never built. A damaged set or an earlier format raises
        HragError naming the fix. `lazy_ids` (a query, which never writes): the ids are the memory-mapped
        `IdKeys` and the hashes are decoded only if asked for. The id map is its header alone (format 6): the
        ids, hashes and labels are arrays, so neither a query nor a writer parses a line per row. `read_at`
        (default: as `lazy_ids`) reads the postings by `ReadAt` instead of mapping them; an incremental sync
        loads lazily but maps them (it reads them all)."""
        hnsw_path, ids_path = cls.paths(vectors_dir, name)
        if not ids_path.exists():
            return None
        header = next(iter(store.read_jsonl(ids_path)), None)
        meta = header.get("_meta") if isinstance(header, dict) else None
        if not meta or meta.get("format") not in _READ_FORMATS:
            raise HragError(f"{ids_path} is damaged or from another version; run 'hrag synonyms' to rebuild it")
        try:   # a hand-edited or damaged id map: missing keys or wrong types
            idx = cls(name, int(meta["dim"]), settings, str(meta.get("model_id", "")))
            idx.m, idx.ef_construction = int(meta["m"]), int(meta["ef_construction"])
            graph = bool(meta.get("hnsw_bytes"))
            count = int(meta["count"])
            idx.synced = str(meta.get("synced", ""))
            query = cls._load_query_arrays(vectors_dir, name, meta, count, idx.dim,
                                           read_at=lazy_ids if read_at is None else read_at)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise HragError(f"{ids_path} is damaged; run 'hrag synonyms' to rebuild it") from None
        hashes, labels = cls._load_row_arrays(vectors_dir, name, count, graph)
        idx.ids, idx.hashes = IdKeys(*query[:3]), HashColumn(hashes)         # type: ignore[assignment]
        idx._keys, idx._hash_array = tuple(query[:3]), hashes
        if int(meta.get("matrix_rows", -1)) != count:
            raise HragError(f"{ids_path} is truncated; run 'hrag synonyms' to rebuild it")
        idx.labels = np.asarray(labels, dtype=np.int64) if graph else np.full(count, -1, dtype=np.int64)
        idx._free = int(meta.get("free", 0))
        idx._next_label = int(meta.get("next_label", 0))
        idx._rows = cls._load_rows(vectors_dir, name, meta, count, idx.dim, query[3:])
        idx._saved = (Path(vectors_dir), {k: v for k, v in meta.items() if k != "patch"})
        if meta.get("patch"):
            if graph or not isinstance(idx._rows, SparseRows):
                raise HragError(f"{ids_path} is damaged; run 'hrag synonyms' to rebuild it")
            try:
                patch = Patch.load(cls.patch_path(vectors_dir, name), meta["patch"], Path(vectors_dir),
                                   idx._saved[1], idx._keys, hashes, idx._rows, idx.dim)
            except (OSError, ValueError, TypeError, AttributeError):   # AttributeError: "patch" not a dict
                raise HragError(f"the patch of index {name} in {vectors_dir} is damaged or does not match its "
                                f"id map; run 'hrag synonyms' to rebuild it") from None
            idx._use_patch(patch)
            if not lazy_ids:                 # a writer that lists every id: the whole index in memory
                idx._fold()
        if not lazy_ids:                     # listed once, after any patch is folded in
            idx.ids, idx.hashes = idx.ids._listed(), idx.hashes._listed()          # type: ignore[attr-defined]
        if graph:
            if not hnsw_path.exists() or hnsw_path.stat().st_size != int(meta["hnsw_bytes"]):
                raise HragError(f"{hnsw_path} does not match its id map; run 'hrag synonyms' to rebuild it")
            index = _hnswlib().Index(space="cosine", dim=idx.dim)
            try:
                index.load_index(str(hnsw_path), allow_replace_deleted=True)
            except (RuntimeError, OSError, ValueError) as exc:   # right size, wrong bytes
                raise HragError(f"{hnsw_path} is damaged ({exc}); run 'hrag synonyms' to rebuild it") from None
            index.set_ef(max(settings.ef_search, 16))
            idx._index = index
        return idx

    @classmethod
    def _load_query_arrays(cls, vectors_dir: Path, name: str, meta: dict, count: int,
                           dim: int, read_at: bool = False) -> tuple[np.ndarray, ...]:
        """The ids' blob, offsets and order, then (sparse rows) the postings, memory-mapped and checked
        against the id map's header. `read_at` (a query): the postings' rows and values are read column by
        column (`ReadAt`) instead of mapped."""
        paths = cls.query_paths(vectors_dir, name)
        sparse = meta.get("storage") == "sparse" and count > 0 and name in POSTED   # as `_posted`
        try:
            arrays = tuple(_mapped(p) if not (read_at and i in (4, 6)) else ReadAt(p)
                           for i, p in enumerate(paths[:7 if sparse else 3]))
        except (OSError, ValueError, EOFError):
            arrays = ()
        values, key_bytes = int(meta.get("values", -1)), int(meta.get("key_bytes", -1))
        ok = len(arrays) >= 3 and arrays[0].shape == (key_bytes,) and arrays[1].shape == (count + 1,) \
            and arrays[2].shape == (count,) and (not count or int(arrays[1][-1]) == key_bytes)
        if sparse and ok:
            ptr, plow, pbands, pdata = arrays[3:]
            ok = (ptr.shape == (dim + 1,) and plow.shape == pdata.shape == (values,) and plow.dtype == np.uint16
                  and pbands.shape == (dim, max(1, -(-count // _ROW_BAND))) and pbands.dtype == np.uint32
                  and pdata.dtype == DTYPE and int(ptr[-1]) == values
                  # each column's band counts fill its run: a search adds band offsets run by run, so counts
                  # that do not add up would put rows in the wrong band without an error (0.2 MB at 100k)
                  and np.array_equal(np.asarray(pbands).sum(axis=1, dtype=np.int64), np.diff(np.asarray(ptr))))
        if not ok:
            raise HragError(f"the id keys or postings of index {name} in {vectors_dir} do not match its id map; "
                            f"run 'hrag synonyms' to rebuild it")
        return arrays

    @classmethod
    def _load_row_arrays(cls, vectors_dir: Path, name: str, count: int, graph: bool
                         ) -> tuple[np.ndarray, np.ndarray | None]:
        """The rows' text hashes and (graph) labels, memory-mapped and checked against the id map's count."""
        paths = cls.row_paths(vectors_dir, name)
        try:
            arrays = [np.load(p, mmap_mode="r", allow_pickle=False) for p in paths[:2 if graph else 1]]
        except (OSError, ValueError, EOFError):
            arrays = []
        if len(arrays) != (2 if graph else 1) or arrays[0].shape != (count,) or arrays[0].dtype.kind != "S" \
                or (graph and (arrays[1].shape != (count,) or arrays[1].dtype != np.int64)):
            raise HragError(f"the text hashes of index {name} in {vectors_dir} do not match its id map; "
                            f"run 'hrag synonyms' to rebuild it")
        return arrays[0], (arrays[1] if graph else None)

    @classmethod
    def _load_rows(cls, vectors_dir: Path, name: str, meta: dict, count: int, dim: int,
                   postings: tuple[np.ndarray, ...] = ()) -> DenseRows | SparseRows:
        """The rows, memory-mapped (a query touches only the pages it scores); checked against the id map. A
        posted index (`postings`, checked by _load_query_arrays) keeps only its row starts beside them."""
        if not count:
            return DenseRows(np.zeros((0, dim), dtype=DTYPE))
        sparse = meta.get("storage") == "sparse"
        paths = cls.sparse_paths(vectors_dir, name) if sparse else (cls.matrix_path(vectors_dir, name),)
        try:
            arrays = [_mapped(p) for p in paths[:1 if postings else None]]
        except (OSError, ValueError, EOFError):   # numpy reads an empty file as EOFError
            arrays = []
        values = int(meta.get("values", -1))
        if sparse and postings and len(arrays) == 1:
            indptr = arrays[0]
            if indptr.shape == (count + 1,) and int(indptr[-1]) == values and int(indptr[0]) == 0:
                return SparseRows.from_postings(indptr, postings, dim)
        elif sparse and len(arrays) == 4:
            indptr, low, bands, data = arrays
            if (indptr.shape == (count + 1,) and len(low) == len(data) == values and data.dtype == DTYPE
                    and low.dtype == np.uint8 and bands.shape == (count, _n_bands(dim)) and int(indptr[-1]) == values):
                return SparseRows(indptr, low, bands, data, dim)
        elif not sparse and len(arrays) == 1 and arrays[0].shape == (count, dim) and arrays[0].dtype == DTYPE:
            return DenseRows(arrays[0])
        raise HragError(f"the vectors of index {name} in {vectors_dir} do not match its id map; "
                        f"run 'hrag synonyms' to rebuild it")


def _maps_whole(arr, path: Path) -> bool:
    """Whether `arr` is the whole of the saved .npy at `path`, memory-mapped (`_mapped` or np.load's memmap):
    saving it there again writes the bytes the file holds, so a save of an index that did not change (a +1 %
    run that inserts nothing) spares rewriting every array of its base."""
    import mmap

    m = arr if isinstance(arr, np.memmap) else getattr(arr, "base", None)
    if not isinstance(m, np.memmap) or not isinstance(m.base, mmap.mmap) or m.filename is None \
            or os.path.abspath(m.filename) != os.path.abspath(path):
        return False                 # not a file's own map (a slice of one has another memmap as its base)
    try:
        size = os.path.getsize(path)
    except OSError:
        return False
    return m.shape == arr.shape and m.dtype == arr.dtype and bool(arr.flags.c_contiguous) \
        and arr.__array_interface__["data"][0] == m.__array_interface__["data"][0] \
        and size == m.offset + m.nbytes


def _mapped(path: Path) -> np.ndarray:
    """A saved .npy memory-mapped, as a plain array: indexing an np.memmap costs ~4 us a call in its Python
    wrapper, and a query's id and vertex lookups make thousands of them."""
    return np.asarray(np.load(path, mmap_mode="r", allow_pickle=False))


class ReadAt:
    """A saved 1-D .npy read slice by slice (`os.pread`), for a query's posting reads: mapped, every column a
    batch of questions read stayed resident in the process (430 MB of postings for 20 questions at 100,000
    passages); read, a column's bytes last as long as its scoring."""

    def __init__(self, path: Path) -> None:
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)     # the header: shape, dtype, data offset
        if mapped.ndim != 1:
            raise ValueError(f"{path}: not a 1-D array")
        self.shape, self.dtype, self._offset = mapped.shape, mapped.dtype, int(mapped.offset)
        self._path = Path(path)
        self._fd = os.open(path, os.O_RDONLY)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, part: slice) -> np.ndarray:
        start, stop, step = part.indices(self.shape[0])
        if step != 1:
            raise IndexError("ReadAt reads runs of items")
        size, count = self.dtype.itemsize, max(stop - start, 0)
        raw = os.pread(self._fd, count * size, self._offset + start * size) if count else b""
        if len(raw) != count * size:
            raise HragError(f"{self._path} is truncated; run 'hrag synonyms' to rebuild it")
        return np.frombuffer(raw, dtype=self.dtype)

    def read_into(self, start: int, stop: int, out: np.ndarray) -> np.ndarray:
        """Items start .. stop - 1 read straight into `out` (contiguous, of this dtype and length)."""
        size, count = self.dtype.itemsize, max(stop - start, 0)
        got = os.preadv(self._fd, [memoryview(out).cast("B")], self._offset + start * size) if count else 0
        if got != count * size:
            raise HragError(f"{self._path} is truncated; run 'hrag synonyms' to rebuild it")
        return out

    def __del__(self) -> None:
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            os.close(fd)


def fixed_bytes(items: Sequence[str]) -> np.ndarray:
    """Strings as fixed-width UTF-8 bytes (NUL-padded, one numpy item each): text hashes saved and spliced, ids
    sorted and searched, without a Python object per row."""
    enc = [h.encode("utf-8") for h in items]
    return np.array(enc, dtype=f"S{max(1, max(map(len, enc), default=1))}")


class HashColumn(Sequence):
    """The text hashes of a saved index (fixed-width bytes, memory-mapped), decoded when asked for: a query
    never reads them, a writer lists them. `made` (a patched index): makes the array the first time."""

    def __init__(self, arr: np.ndarray | None, made: Any = None) -> None:
        self._got, self._made = arr, made

    @property
    def _arr(self) -> np.ndarray:
        if self._got is None:
            self._got = self._made()
        return self._got

    def _listed(self) -> list[str]:
        return [h.decode("utf-8") for h in self._arr.tolist()]

    def __len__(self) -> int:
        return len(self._arr)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return self._listed()[i]
        return bytes(self._arr[i]).decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        return iter(self._listed())
