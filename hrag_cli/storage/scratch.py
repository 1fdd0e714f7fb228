"""Scratch arrays kept across calls."""

from __future__ import annotations

from typing import Any

import numpy as np


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
