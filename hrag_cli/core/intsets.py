"""Distinct values of integer arrays by sorting: numpy 2's hash-based np.unique is several times slower on int64
keys than np.sort plus a neighbour compare."""

from __future__ import annotations

import numpy as np

__all__ = ["unique_counts", "unique_marked", "unique_sorted"]


def _starts(ordered: np.ndarray) -> np.ndarray:
    """Where each run of equal values begins in a sorted array (a mask, True at position 0)."""
    first = np.empty(len(ordered), dtype=bool)
    if len(ordered):
        first[0] = True
        np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    return first


def unique_sorted(values: np.ndarray) -> np.ndarray:
    """The distinct values, ascending (what np.unique returns)."""
    ordered = np.sort(values, kind="quicksort")
    return ordered[_starts(ordered)]


def unique_counts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values, ascending, and how often each occurs."""
    ordered = np.sort(values, kind="quicksort")
    edge = np.flatnonzero(_starts(ordered))
    return ordered[edge], np.diff(np.append(edge, len(ordered)))


def unique_marked(values: np.ndarray, mark: np.ndarray) -> np.ndarray:
    """The distinct `values` (each in range(len(mark))), ascending: sorted when few, else marked in the bool array
    `mark` (its contents are overwritten) and read back by one scan, which beats sorting more than 1/64 of its
    length (a walk's round reaches a small share of the vertices)."""
    if len(values) * 64 < len(mark):
        return unique_sorted(values)
    mark.fill(False)
    mark[values] = True
    return np.flatnonzero(mark)
