"""Column postings of sparse rows (each column's rows and values, made by `sparse.build_postings`, so a query
reads only the columns it fills): the exact scoring of a few candidate rows from them (`Postings`), and the
float16 products a posting sum adds."""

from __future__ import annotations


import numpy as np

from hrag_cli.storage.vectors.layout import ROW_BAND

PRUNE_CANDIDATES = 256        # a pruned posting search sums exactly at most about this many rows
_SEARCHED_ROWS = 4 * PRUNE_CANDIDATES   # up to this many rows a posting search finds in the columns step by step


class Postings:
    """The postings of a query's columns, one run per column (`at`: where each begins), for `posting_top`:
    the low two bytes of each entry's row, the count of entries in each band of 65,536 rows per column, and
    the float16 values."""

    def __init__(self, cols: np.ndarray, at: list[int], low: np.ndarray, counts: np.ndarray,
                 values: np.ndarray) -> None:
        self.cols, self.at, self.low, self.counts, self.values = cols, at, low, counts, values
        # where each column's run of each band begins (absolute, in `low`), one more per column for its end;
        # int32 while they fit (a search steps through these faster than through int64 ones)
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
        hit = (where < end) & (self.low[at] == (rows & (ROW_BAND - 1)))
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
        band, key = rows >> 16, (rows & (ROW_BAND - 1)).astype(np.uint16)
        pos, end = self.band_at[:, band], self.band_at[:, band + 1]
        longest = int((end - pos).max(initial=0))
        step = 1 << (longest.bit_length() - 1) if longest else 0
        while step >= 1:
            probe = pos + pos.dtype.type(step - 1)
            take = probe < end
            take &= self.low.take(probe, mode="clip") < key
            pos += take * pos.dtype.type(step)     # (an add with where= is several times slower)
            step >>= 1
        return pos, end

    def _search_spelled(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`_search` for many rows (a bound that never pruned far): each column's rows spelled out and
        searched, cheaper than a binary search step by step for thousands of rows."""
        where = np.empty((len(self.cols), len(rows)), dtype=np.int64)
        for i in range(len(self.cols)):
            a, b = self.at[i], self.at[i + 1]
            where[i] = np.searchsorted(band_rows(self.low[a:b], self.counts[i], np.empty(b - a, np.intp)), rows) + a
        return where, self.band_at[:, (rows >> 16) + 1]


def band_rows(low: np.ndarray, counts: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The rows of a column's entries into `out` (intp): their low two bytes plus 65,536 times their band,
    band by band from the column's count of entries in each (a run of additions: np.repeat of the band
    offsets is slower)."""
    np.copyto(out, low)
    at = 0
    for band, count in enumerate(np.asarray(counts).tolist()):
        if band and count:
            out[at:at + count] += band * ROW_BAND
        at += count
    return out


_F16_KEEP = np.int32(-0x70000001)   # 0x8FFFFFFF: the sign bit and the float16's exponent and mantissa bits
_F16_SCALE = np.float32(2.0 ** 112)  # float32's exponent bias less float16's, as a factor


def products(values: np.ndarray, weight: np.float32, out: np.ndarray) -> np.ndarray:
    """float32(values) * weight (a float32) into `out` (float32, of values' length), the same bits as
    `values.astype(np.float32) * weight`, in a fraction of the time: numpy widens float16 one value at a time
    (as costly as the sums themselves). A float16 widened as an int16 (sign extended) and
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
