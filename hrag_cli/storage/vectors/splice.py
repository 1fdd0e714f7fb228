"""Splices of an incremental run: the rows, id blob, id order and hash column of an index after rows were
inserted or made again, copied run by run from the old arrays (no Python object per row)."""

from __future__ import annotations

import numpy as np

from hrag_cli.core.errors import HragError
from hrag_cli.storage.vectors.layout import DTYPE, ROW_BAND, SCAN_ROWS
from hrag_cli.storage.vectors.sparse import SparseRows


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
    slice copy per run instead of an index per value (the entity index holds the most values)."""
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


def splice_keys(blob: np.ndarray, off: np.ndarray, order: np.ndarray, is_new: np.ndarray, old_of: np.ndarray,
                moved: np.ndarray, pos: np.ndarray, ins: np.ndarray, enc: list[bytes], old_fixed: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`IdKeys.arrays` of the ids after `VectorIndex.insert`: kept ids' bytes copied run by run, the listed
    ids' put at their rows (`pos`), and the inserted ones (`ins`) merged into the sorted order by a binary
    search of the old sorted ids (`old_fixed`: the old ids as `fixed_width` gives them)."""
    blob2, off2 = splice_blob(blob, off, is_new, old_of, pos, enc)
    return blob2, off2, splice_order(order, moved, pos, ins, enc, old_fixed)


def splice_blob(blob: np.ndarray, off: np.ndarray, is_new: np.ndarray, old_of: np.ndarray, pos: np.ndarray,
                enc: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """The id blob and offsets of `splice_keys`."""
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


def splice_order(order: np.ndarray, moved: np.ndarray, pos: np.ndarray, ins: np.ndarray, enc: list[bytes],
                 old_fixed: np.ndarray) -> np.ndarray:
    """The sorted order of `splice_keys`: the old one renumbered, the inserted ids merged in."""
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
    Written block by block into arrays of the final size: an incremental run of a large index touches each
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
    step = SCAN_ROWS
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
    value, a large part of a small run's synonyms stage). Column by column: each one's entries fit
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
    ncol = SparseRows.cols_of(new.bands, new.low).astype(np.int64)
    order = np.lexsort((nrow, ncol))
    nrow, ncol, nval = nrow[order].astype(np.int32), ncol[order], np.asarray(new.data)[order]
    nstart = np.searchsorted(ncol, np.arange(dim + 1)).tolist()
    nb_old, nb = pbands.shape[1], max(1, -(-n // ROW_BAND))
    band_base = np.arange(nb_old, dtype=np.int32) * ROW_BAND
    edges = np.arange(nb + 1, dtype=np.int64) * ROW_BAND
    out_low = np.empty(int(indptr[-1]), dtype=np.uint16)
    out_data = np.empty(int(indptr[-1]), dtype=DTYPE)
    out_bands = np.zeros((dim, nb), dtype=np.uint32)
    bounds = np.asarray(ptr, dtype=np.int64).tolist()
    at = 0
    if not gone and (not len(new_at) or int(new_at[0]) == len(kept)):      # kept rows 0.. in order
        # rows only appended (the chunk index of a small run): old rows keep their numbers, so each column's old
        # entries are copied as they are and the new ones follow them
        out_bands[:, :nb_old] = pbands
        np.add.at(out_bands, (ncol, nrow // ROW_BAND), 1)
        for c in range(dim):
            s, e, a, b = bounds[c], bounds[c + 1], nstart[c], nstart[c + 1]
            out_low[at:at + e - s] = plow[s:e]
            out_data[at:at + e - s] = pdata[s:e]
            at += e - s
            out_low[at:at + b - a] = nrow[a:b] & (ROW_BAND - 1)
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
            out_low[at:at + m] = rows & (ROW_BAND - 1)
            out_data[at:at + m] = vals
            out_bands[c] = np.diff(np.searchsorted(rows, edges))
            at += m
    if at != len(out_low):
        raise HragError("the postings of a vector index do not match its rows; run 'hrag synonyms' to rebuild it")
    out_ptr = np.zeros(dim + 1, dtype=np.int64)
    np.cumsum(out_bands.sum(axis=1, dtype=np.int64), out=out_ptr[1:])
    return SparseRows.from_postings(indptr, (out_ptr, out_low, out_bands, out_data), dim)


def spliced_fixed(old: np.ndarray, is_new: np.ndarray, old_of: np.ndarray, pos: np.ndarray, new: list[bytes]
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
