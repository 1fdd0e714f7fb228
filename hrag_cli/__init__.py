"""hrag: a folder of documents -> a knowledge-graph retrieval index (see README.md and docs/design.md)."""

import os

# One BLAS thread per process, set before numpy loads: the heavy steps already run in one forked worker per core
# (forkpool.py), so BLAS threads on top only over-subscribe the cores, and on the small products of an
# incremental run (a few new names against a cell) OpenBLAS's thread hand-off costs far more than the product
# itself. A user's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

__all__ = ["Hit", "IndexResult", "Project"]


def __getattr__(name: str):
    """`from hrag_cli import Project` loads the API on first use, so `hrag --help` never imports it."""
    if name in __all__:
        from hrag_cli import api

        return getattr(api, name)
    raise AttributeError(f"module 'hrag_cli' has no attribute {name!r}")
