"""hrag: a folder of documents -> a knowledge-graph retrieval index (see README.md and docs/design.md)."""

import os

# One BLAS thread per process, set before numpy loads: the heavy steps already run in one forked worker per core
# (forkpool.py), so BLAS threads on top only over-subscribe the cores, and on the small products of an
# incremental run (a few new names against a cell of ~1,250) OpenBLAS's thread hand-off cost 8x the product's
# CPU (the +1 % name join at 10,000 passages: 4.4 s wall in 531 products). A user's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
