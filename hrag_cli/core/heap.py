"""Keep freed memory in the process instead of handing it back to the kernel (glibc only).

By default glibc serves every allocation of 128 KiB or more (the bar rises to at most 32 MiB as such blocks are
freed) with its own mmap and unmaps it on free, and returns the top of its heap past a small margin. Our stages
allocate and free hundreds of megabytes of numpy temporaries and bytes buffers one after another, so each new
one gets fresh pages that the kernel must fault in and zero (`clear_page`, a large share of a run's system
time). With mmap off and the top kept, a freed block serves the next allocation with pages already there.

The cost: a freed block in the middle of the heap serves only allocations that fit in it, so the peak can rise
by what such holes hold (bench/scale.py reports the peak RSS). Set GLIBC_TUNABLES or a MALLOC_*_ variable to
choose your own malloc settings: then this does nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
TRIM_THRESHOLD = (1 << 31) - 1   # mallopt takes an int: return the heap's top only past 2 GiB free
TOP_PAD = 64 << 20               # grow the heap 64 MiB at a time (address space only: pages come on first use)


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to reuse freed memory rather than unmap it (once, at process start); True when set."""
    if not sys.platform.startswith("linux") or any(k == "GLIBC_TUNABLES" or k.startswith("MALLOC_")
                                                   for k in os.environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):   # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return all(mallopt(param, value) == 1 for param, value in
               ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD)))


def give_back() -> None:
    """Return the heap's free pages to the kernel (glibc's malloc_trim): before a fork, so the workers do not
    inherit (and the parent then copy on write) memory nobody holds."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
