"""What every part of a vector index agrees on: the value type of a stored row and how sparse rows and
column postings split columns and rows into bands (one byte of column within a band of columns, two bytes of
row within a band of rows)."""

from __future__ import annotations

import numpy as np

DTYPE = np.float16
SCAN_ROWS = 1 << 16          # rows per block of a sparse scan or a bookkeeping pass
ROW_BAND = 1 << 16           # rows per band of a posting's row (two bytes of row within it)
BAND = 256                    # columns per band of a sparse row (one byte of column within it)


def n_bands(dim: int) -> int:
    return max(1, (dim + BAND - 1) // BAND)
