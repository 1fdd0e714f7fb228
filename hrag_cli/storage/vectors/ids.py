"""The ids and text hashes of an index's rows as arrays (a UTF-8 blob with offsets and an id order,
fixed-width bytes), read without a Python object per row."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np


def packed(enc: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(blob uint8, offsets int64 (n + 1)) of byte strings laid end to end."""
    off = np.zeros(len(enc) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in enc], out=off[1:])
    return np.frombuffer(b"".join(enc), dtype=np.uint8), off


class Listing(Sequence):
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


class IdKeys(Listing):
    """The ids of an index's rows as one UTF-8 blob, its offsets and the rows in id order, memory-mapped: a
    query maps the rows a search found to ids and a fact's id to its row (binary search, a few dozen ids read)
    without parsing the id map (millions of facts in a large corpus). Listing it decodes every id once."""

    def __init__(self, blob: np.ndarray, off: np.ndarray, order: np.ndarray) -> None:
        self._blob, self._off, self._order = blob, off, order
        self._all: list[str] | None = None

    @staticmethod
    def arrays(ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(blob uint8, offsets int64 (n + 1), rows sorted by id bytes int64) of a list of ids: made in numpy
        from their fixed-width bytes (ids hold no NUL, so the padded ones sort as the bytes do), without a
        bytes object per id nor a sort in Python (an index of millions of facts is saved at the peak of the
        stage)."""
        lens = _utf8_lengths(ids)
        fixed = _fixed(ids, lens)
        order = np.argsort(fixed, kind="stable").astype(np.int64, copy=False)
        off = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=off[1:])
        if not len(lens):
            return np.zeros(0, dtype=np.uint8), off, order
        w = fixed.dtype.itemsize
        blob = fixed.view(np.uint8).reshape(len(lens), w)[np.arange(w) < lens[:, None]]
        return blob, off, order

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


def fixed_bytes(items: Sequence[str]) -> np.ndarray:
    """Strings as fixed-width UTF-8 bytes (NUL-padded, one numpy item each): text hashes saved and spliced, ids
    sorted and searched, without a Python object per row."""
    return _fixed(items, _utf8_lengths(items))


def _utf8_lengths(items: Sequence[str]) -> np.ndarray:
    return np.fromiter((len(s) if s.isascii() else len(s.encode("utf-8")) for s in items), dtype=np.int64,
                       count=len(items))


def _fixed(items: Sequence[str], lens: np.ndarray) -> np.ndarray:
    """`fixed_bytes` of strings whose UTF-8 lengths are `lens`: encoded one at a time into the array, no list
    of every one's bytes on the way."""
    return np.fromiter((s.encode("utf-8") for s in items), dtype=f"S{max(1, int(lens.max(initial=1)))}",
                       count=len(items))


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


def rows_in(table: np.ndarray, keys: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """Per key, its position in `table` (distinct fixed-width bytes), -1 when absent; searched through `order`
    (the table's ascending order, if known; no sorted copy of the table is made)."""
    if not len(table) or not len(keys):
        return np.full(len(keys), -1, dtype=np.int64)
    if order is None and not bool((table[1:] > table[:-1]).all()):
        order = np.argsort(table, kind="stable")
    at = np.minimum(np.searchsorted(table, keys, sorter=order), len(table) - 1)
    where = at if order is None else order[at]
    return np.where(table[where] == keys, where, -1).astype(np.int64)
