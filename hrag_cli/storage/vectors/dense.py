"""Dense unit rows: a float16 matrix (memory-mapped after load), scored block by block."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from hrag_cli.storage.vectors.search import exact_search

_BLOCK_FLOATS = 1 << 23       # float32 values per dense block (32 MB)
_F32_CACHE_ELEMENTS = 1 << 25  # an index up to this many numbers keeps a float32 copy for repeated searches


def dense_rows(dim: int) -> int:
    """Rows per dense float32 block of this width."""
    return max(1, _BLOCK_FLOATS // max(dim, 1))


def exact_topk(matrix: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact cosine top-k of unit vectors in a dense matrix: (rows int64 (nq, k), sims float32), best first."""
    return exact_search(DenseRows(matrix), queries, k)


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
        step = len(mat) if mat.dtype == np.float32 else dense_rows(mat.shape[1])
        for s in range(0, len(mat), max(step, 1)):
            yield s, q @ np.asarray(mat[s:s + step], dtype=np.float32).T
