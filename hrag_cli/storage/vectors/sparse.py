"""Sparse unit rows (`SparseRows`): compressed rows with one-byte columns within bands, scanned row by row
or scored from their column postings, and the helpers that make them from dense blocks."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from hrag_cli.core.errors import HragError
from hrag_cli.storage.scratch import scratch
from hrag_cli.storage.vectors.files import read_run
from hrag_cli.storage.vectors.layout import BAND, DTYPE, ROW_BAND, SCAN_ROWS, n_bands
from hrag_cli.storage.vectors.postings import PRUNE_CANDIDATES, Postings, band_rows, products
from hrag_cli.storage.vectors.search import POSTING_QUERIES, top_order

_SPARSE_CACHE_VALUES = 1 << 24  # a sparse index up to this many values keeps them widened (6 bytes each)
_UNIT_SLACK = 1.01            # a stored row's norm is at most this (unit rows, float16 values: 1 + 2^-11)
_PRUNE_TOL = 1e-4             # covers the float32 rounding of a partial posting sum (60 columns: < 1e-5)
_LISTED_CANDIDATES = 1 << 13  # a pruned search counts its candidates over every row while more (and halving)
_THETA_FIRST, _THETA_AGAIN = 0.7, 0.5   # its first theta once the bound is under 0.7, again at half the bound


class SparseRows:
    """Unit rows in compressed sparse rows, float16 values in column order. A value's column is stored as one
    byte (its place within its band of 256 columns) plus, per row, how many values fall in each band (uint16,
    8 per row at 2048 dims). The builtin embedder hashes a text's few words and n-grams into 2048 buckets: a
    fact, a name or a relation fills a few dozen to a few hundred of them, so this is many times smaller than
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
        of more than POSTING_QUERIES queries)."""
        rows = cls(indptr, None, None, None, dim)
        rows.postings = postings
        return rows

    def _rows_from_postings(self) -> None:
        """Each column's entries go to the next free place of their rows: columns ascend, so every row's
        values come out in column order, as a row-wise build stores them. Linear in the values, one column
        at a time."""
        n, total = len(self), int(self.indptr[-1])
        low, data = np.empty(total, dtype=np.uint8), np.empty(total, dtype=DTYPE)
        bands = np.zeros((n, n_bands(self.dim)), dtype=np.uint16)
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
    def cols_of(bands: np.ndarray, low: np.ndarray) -> np.ndarray:
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
        return lens, self.cols_of(self.bands[rows], self.low[pos]).astype(np.uint16), self.data[pos]

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
            self._cache = (self.cols_of(self.bands, self.low).astype(np.uint16),
                           np.asarray(self.data, dtype=np.float32))
        return self._cache

    def posting_scores(self, q: np.ndarray) -> np.ndarray:
        """Cosines (nq, rows) from the column postings: each query reads only the postings of its nonzero
        columns (a fact query fills a few dozen of 2048, so it reads a small share of the index's values).
        A row's products are summed in column order, as the row scan's are, but one by one: sums may differ
        from the scan's in the last bit of float32. Each column is read, turned into rows and products and
        added in scratch arrays of its own length (`_posted_column`), so the work stays in cache."""
        out = np.zeros((len(q), len(self)), dtype=np.float32)
        for j, qv in enumerate(q):
            for c in np.flatnonzero(qv).tolist():
                rows, values = self._posted_column(c)
                np.add.at(out[j], rows, products(values, qv[c], self._buffer("prod", len(values), np.float32)))
        return out

    def _posted_column(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Column c's rows (intp: np.add.at scatters by them faster than by int32 ones, the widening
        included) and float16 values, in scratch arrays (valid until the next call)."""
        ptr, plow, pbands, pdata = self.postings          # type: ignore[misc]
        s, e = int(ptr[c]), int(ptr[c + 1])
        low = read_run(plow, s, e, self._buffer("low", e - s, np.uint16))
        rows = band_rows(low, np.asarray(pbands[c]), self._buffer("rows", e - s, np.intp))
        return rows, read_run(pdata, s, e, self._buffer("values", e - s, DTYPE))

    def posting_top(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best rows for one query (rows, float32 cosines; best first, ties to the lower row) with the
        very scores `posting_scores` gives, summing only as many postings as it takes to prove them (a fact
        search sums a fraction of the values its columns hold).

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
            rows = band_rows(post.low[s:e], post.counts[j], self._buffer("rows", e - s, np.intp))
            np.add.at(partial, rows, products(post.values[s:e], q[cols[j]], self._buffer("prod", e - s, np.float32)))
            if cand is None:
                # theta: the k-th best exact score of the rows whose partial sums lead, made again when the
                # bound has halved since (a better theta stops sooner; each costs about two columns' sums)
                if bound < min(_THETA_FIRST, _THETA_AGAIN * tried) and bound >= theta:
                    seen = np.sort(top_order(partial, 4 * k))
                    theta, tried = max(theta, float(np.sort(post.exact(seen, q))[-k])), bound
                if bound >= theta:
                    continue
                # the rows that can still reach theta: counted over every row while many and halving (counting
                # is far cheaper than listing), listed once few or no longer halving (near ties) or at the last
                # column, then narrowed by a gather of their sums
                above = np.greater_equal(partial, theta - bound, out=self._buffer("above", n, np.bool_))
                count, counted = np.count_nonzero(above), count
                if _LISTED_CANDIDATES < count < counted / 2 and i + 1 < len(cols):
                    continue
                cand = np.flatnonzero(above)
            else:
                cand = cand[partial[cand] >= theta - bound]
            if len(cand) <= PRUNE_CANDIDATES:
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

    def _gather(self, cols: np.ndarray) -> "Postings":
        """The postings of `cols` (ascending) one after another in scratch arrays: low row bytes and values
        (a column's rows are spelled out only when it is summed: most of a fact search's columns are only
        searched for a few candidates, `Postings.exact`)."""
        ptr, plow, pbands, pdata = self.postings          # type: ignore[misc]
        starts, ends = np.asarray(ptr[cols], dtype=np.int64), np.asarray(ptr[cols + 1], dtype=np.int64)
        at = np.concatenate(([0], np.cumsum(ends - starts))).tolist()
        low, values = self._buffer("gathered low", at[-1], np.uint16), self._buffer("gathered values", at[-1], DTYPE)
        for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
            read_run(pdata, s, e, values[at[i]:at[i + 1]])
            read_run(plow, s, e, low[at[i]:at[i + 1]])
        return Postings(cols, at, low, np.asarray(pbands[cols], dtype=np.int64), values)

    def blocks(self, q: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        n = len(self)
        step = max(1, SCAN_ROWS // 4)
        if self.postings is not None and len(q) <= POSTING_QUERIES:
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
                cols = self.cols_of(self.bands[s:e], self.low[p0:p1])
                vals = np.asarray(self.data[p0:p1], dtype=np.float32)
            starts = np.asarray(self.indptr[s:e], dtype=np.int64) - p0
            out = np.zeros((len(q), e - s), dtype=np.float32)
            if p1 > p0:
                prod = q[:, cols] * vals
                live = starts < (np.asarray(self.indptr[s + 1:e + 1]) - p0)      # reduceat needs non-empty rows
                out[:, live] = np.add.reduceat(prod, starts[live], axis=1)
            yield s, out


def mostly_zero(b: np.ndarray) -> bool:
    """Whether a block of vectors is stored as sparse rows: under half of its values are nonzero. A sparse
    value takes 3 bytes (a column byte and float16) against 2 per dense cell, so sparse rows are smaller up to
    two thirds full; a dense embedder fills every cell. Not a quarter: the builtin embedder's entity texts
    (name and description) fill few cells on average, but the first block in id order (numbers and sums of
    money, with long descriptions) can fill a quarter, which would make a whole large index dense and give it
    an HNSW graph."""
    return np.count_nonzero(b) < 0.5 * b.size


def _sparsify(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values per row, columns, float16 values) of a dense float32 block, row by row in column order."""
    r, c = np.nonzero(b)
    return (np.bincount(r, minlength=len(b)).astype(np.int64), c.astype(np.uint16),
            b[r, c].astype(DTYPE))


def csr(lens: np.ndarray, cols: np.ndarray, vals: np.ndarray, dim: int) -> SparseRows:
    """Sparse rows from each row's count of values and the columns (ascending within a row, as `_sparsify`
    and `take` give them) and values in row order."""
    n, nb = len(lens), n_bands(dim)
    indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    bands = np.empty((n, nb), dtype=np.uint16)
    step = SCAN_ROWS // 8            # rows per block: the temporaries stay a few MB at any size
    for s in range(0, n, step):
        e = min(n, s + step)
        row = np.repeat(np.arange(e - s, dtype=np.int64), lens[s:e])
        band = np.asarray(cols[indptr[s]:indptr[e]], dtype=np.int64) // BAND
        bands[s:e] = np.bincount(row * nb + band, minlength=(e - s) * nb).reshape(e - s, nb)
    return SparseRows(indptr, (np.asarray(cols) % BAND).astype(np.uint8), bands, vals, dim)


def sparse_rows(b: np.ndarray) -> SparseRows:
    """A dense float32 block as sparse rows."""
    return csr(*_sparsify(b), b.shape[1])


def join_sparse(parts: list[SparseRows], dim: int) -> SparseRows:
    """Sparse row blocks one after another."""
    if not parts:
        return csr(np.zeros(0, np.int64), np.zeros(0, np.uint16), np.zeros(0, DTYPE), dim)
    lens = np.concatenate([np.diff(p.indptr) for p in parts])
    return SparseRows(np.concatenate([[0], np.cumsum(lens)]).astype(np.int64), np.concatenate([p.low for p in parts]),
                      np.concatenate([p.bands for p in parts]), np.concatenate([p.data for p in parts]), dim)


POSTING_BLOCK_VALUES = 1 << 20     # values per block of `build_postings` (each takes a few int64 temporaries)


def _value_spans(indptr: np.ndarray, n: int, max_rows: int, max_values: int) -> list[tuple[int, int]]:
    """Consecutive row ranges [s, e) of at most `max_rows` rows and `max_values` values (a longer row alone)."""
    out, s = [], 0
    while s < n:
        fit = int(np.searchsorted(indptr, int(indptr[s]) + max_values, side="right")) - 1
        e = max(s + 1, min(n, s + max_rows, fit))
        out.append((s, e))
        s = e
    return out


def build_postings(rows: SparseRows) -> tuple[np.ndarray, ...]:
    """Column postings of sparse rows: (ptr int64 (dim + 1), low two bytes of each row uint16, per column the
    count of its entries in each band of 65,536 rows uint32 (dim, bands), float16 values); column c's entries
    are at ptr[c]:ptr[c + 1], rows ascending. 4 bytes a value, as the rows' 3 (+ band counts). A counting
    sort, block by block of rows (a stable sort of 16-bit columns is a radix sort): linear in the values; a
    block holds at most POSTING_BLOCK_VALUES values (a chunk's row holds hundreds), so its temporaries stay a
    few tens of MB."""
    n, dim, total = len(rows), rows.dim, len(rows.data)
    nb = max(1, -(-n // ROW_BAND))
    spans = _value_spans(np.asarray(rows.indptr), n, SCAN_ROWS // 4, POSTING_BLOCK_VALUES)

    def block(s: int, e: int) -> tuple[int, np.ndarray]:
        p0, p1 = int(rows.indptr[s]), int(rows.indptr[e])
        return p0, rows.cols_of(rows.bands[s:e], rows.low[p0:p1]).astype(np.uint16)

    bands = np.zeros((dim, nb), dtype=np.int64)
    for s, e in spans:
        _, cols = block(s, e)
        row = np.repeat(np.arange(s, e, dtype=np.int64), np.diff(np.asarray(rows.indptr[s:e + 1])))
        bands += np.bincount(cols.astype(np.int64) * nb + row // ROW_BAND, minlength=dim * nb).reshape(dim, nb)
    ptr = np.concatenate([[0], np.cumsum(bands.sum(axis=1))]).astype(np.int64)
    cursor = ptr[:-1].copy()
    plow, pdata = np.empty(total, dtype=np.uint16), np.empty(total, dtype=DTYPE)
    for s, e in spans:
        p0, cols = block(s, e)
        order = np.argsort(cols, kind="stable")
        c = cols[order].astype(np.intp)
        cnt = np.bincount(c, minlength=dim)[:dim]
        dest = cursor[c] + (np.arange(len(c)) - (np.cumsum(cnt) - cnt)[c])
        row = np.repeat(np.arange(s, e, dtype=np.int64), np.diff(np.asarray(rows.indptr[s:e + 1])))
        plow[dest], pdata[dest] = (row[order] % ROW_BAND).astype(np.uint16), np.asarray(rows.data[p0:p0 + len(c)])[order]
        cursor += cnt
    return ptr, plow, bands.astype(np.uint32), pdata
