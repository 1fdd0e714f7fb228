"""Saved index arrays read back: memory-mapped whole, or read a run at a time (`ReadAt`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from hrag_cli.core.errors import HragError


def read_run(arr: Any, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
    """arr[start:stop], into `out` when given (a `ReadAt` reads straight into it)."""
    if isinstance(arr, ReadAt):
        return arr.read_into(start, stop, out) if out is not None else arr[start:stop]
    if out is None:
        return np.asarray(arr[start:stop])
    out[...] = arr[start:stop]
    return out


def maps_whole(arr, path: Path) -> bool:
    """Whether `arr` is the whole of the saved .npy at `path`, memory-mapped (`mapped_array` or np.load's memmap):
    saving it there again writes the bytes the file holds, so a save of an index that did not change (a small
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


def mapped_array(path: Path) -> np.ndarray:
    """A saved .npy memory-mapped, as a plain array: indexing an np.memmap costs a call of its Python wrapper,
    and a query's id and vertex lookups make thousands of them."""
    return np.asarray(np.load(path, mmap_mode="r", allow_pickle=False))


class ReadAt:
    """A saved 1-D .npy read slice by slice (`os.pread`), for a query's posting reads: mapped, every column a
    batch of questions read would stay resident in the process; read, a column's bytes last as long as its
    scoring."""

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
