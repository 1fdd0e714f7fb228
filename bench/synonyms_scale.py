"""Scale of the synonym pass: HNSW build + k-NN of every entity + pair extraction on N random unit vectors.

    .venv/bin/python bench/synonyms_scale.py --n 100000
    .venv/bin/python bench/synonyms_scale.py --n 1000000        # several minutes; run with nohup

Data (--data): `lowrank` (default) = random unit vectors with the structure real embeddings have, a random
32-dimensional subspace of the 384 dimensions plus isotropic noise; `uniform` = uniform on the sphere, the
worst case for any graph index (full intrinsic dimension: every point's 10 nearest neighbours sit at cosine
~0.2, barely nearer than the rest, so "recall@10" there measures noise, while the synonym pairs above the
threshold are still found). In both, a fraction (--dup, default 0.2) are noisy copies of another vector
(cosine 0.80-0.98 to it), so the pass has synonym pairs to find.

Runs the stage's own code (hrag_cli.vectors.VectorIndex.sync, hrag_cli.synonyms.update_knn and
candidate_pairs) with the default settings.vectors / settings.synonyms, and prints:
  wall time per step, peak RSS, recall@k of the k-NN lists against exact brute force on a sample of
  entities (target >= 0.98), and recall of the synonym pairs (cos >= threshold) touching the sample.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hrag_cli.config import Settings  # noqa: E402
from hrag_cli.progress import Reporter  # noqa: E402
from hrag_cli.synonyms import KnnLists, candidate_pairs, update_knn  # noqa: E402
from hrag_cli.vectors import VectorIndex  # noqa: E402


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024


def make_vectors(n: int, dim: int, dup: float, seed: int, data: str = "lowrank") -> np.ndarray:
    rng = np.random.default_rng(seed)
    m = np.empty((n, dim), dtype=np.float32)
    step = 100_000
    basis = rng.standard_normal((32, dim), dtype=np.float32)
    for s in range(0, n, step):
        size = min(step, n - s)
        if data == "uniform":
            block = rng.standard_normal((size, dim), dtype=np.float32)
        else:
            block = rng.standard_normal((size, 32), dtype=np.float32) @ basis
            block += 0.3 * rng.standard_normal((size, dim), dtype=np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        m[s:s + len(block)] = block
    n_dup = int(n * dup)
    dst = rng.choice(n, size=n_dup, replace=False)
    src = rng.integers(0, n, size=n_dup)
    src = np.where(src == dst, (src + 1) % n, src)
    cos = rng.uniform(0.80, 0.98, size=n_dup).astype(np.float32)[:, None]
    noise = rng.standard_normal((n_dup, dim), dtype=np.float32)   # a random direction, made orthogonal to src
    noise -= (noise * m[src]).sum(1, keepdims=True) * m[src]
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    m[dst] = cos * m[src] + np.sqrt(1 - cos * cos) * noise
    m[dst] /= np.linalg.norm(m[dst], axis=1, keepdims=True)
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--dup", type=float, default=0.2)
    ap.add_argument("--sample", type=int, default=1000)
    ap.add_argument("--data", choices=("lowrank", "uniform"), default="lowrank")
    ap.add_argument("--ef-search", type=int, default=None, help="override settings.synonyms.ef_search")
    ap.add_argument("--ef-construction", type=int, default=None, help="override settings.vectors.ef_construction")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    s = Settings()
    if args.ef_search:
        s.synonyms.ef_search = args.ef_search
    if args.ef_construction:
        s.vectors.ef_construction = args.ef_construction
    k, thr = s.synonyms.top_k, s.synonyms.threshold
    print(f"data={args.data} n={args.n} dim={args.dim} dup={args.dup} k={k} threshold={thr} M={s.vectors.m} "
          f"ef_construction={s.vectors.ef_construction} synonyms.ef_search={s.synonyms.ef_search}", flush=True)

    t0 = time.perf_counter()
    m = make_vectors(args.n, args.dim, args.dup, args.seed, args.data)
    ids = [f"e{i}" for i in range(args.n)]
    hashes = [str(i) for i in range(args.n)]
    t_data = time.perf_counter() - t0
    print(f"data          {t_data:8.1f} s", flush=True)

    quiet = Reporter("quiet")
    c0 = time.process_time()
    t0 = time.perf_counter()
    idx = VectorIndex.create("bench", args.dim, s.vectors, "bench")
    idx.sync(ids, hashes, m)
    t_build = time.perf_counter() - t0
    print(f"hnsw build    {t_build:8.1f} s   peak {peak_gb():.2f} GB", flush=True)

    t0 = time.perf_counter()
    knn, queried = update_knn(KnnLists(k, "bench"), ids, hashes, m, idx, k, quiet, ef=s.synonyms.ef_search)
    t_knn = time.perf_counter() - t0
    print(f"knn queries   {t_knn:8.1f} s   ({queried} entities)  peak {peak_gb():.2f} GB", flush=True)

    t0 = time.perf_counter()
    pairs = candidate_pairs(knn, set(ids), thr)
    t_pairs = time.perf_counter() - t0
    total = t_build + t_knn + t_pairs
    print(f"pairs         {t_pairs:8.1f} s   ({len(pairs)} synonym pairs)", flush=True)
    cpu = time.process_time() - c0
    print(f"synonym pass  {total:8.1f} s   (build + knn + pairs; data generation excluded); "
          f"CPU {cpu:.0f} s over all threads, load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
          flush=True)

    # recall against brute force on a sample
    rng = np.random.default_rng(args.seed + 1)
    sample = rng.choice(args.n, size=min(args.sample, args.n), replace=False)
    hit = tot = 0
    pair_hit = pair_tot = 0
    for s0 in range(0, len(sample), 250):
        rows = sample[s0:s0 + 250]
        sims = m[rows] @ m.T
        sims[np.arange(len(rows)), rows] = -np.inf
        top = np.argpartition(-sims, k, axis=1)[:, :k]
        for r, row in enumerate(rows):
            truth = {ids[j] for j in top[r]}
            got = {b for b, _ in knn.lists[ids[row]]}
            hit += len(truth & got)
            tot += k
            # every true pair >= threshold involving this entity within its exact top-k
            for j in top[r]:
                if sims[r, j] >= thr:
                    pair_tot += 1
                    a, b = sorted((ids[row], ids[j]))
                    pair_hit += (a, b) in pairs
    print(f"recall@{k}     {hit / tot:8.4f}   (sample of {len(sample)} entities vs exact brute force)")
    print(f"pair recall   {pair_hit / max(pair_tot, 1):8.4f}   ({pair_tot} true pairs >= {thr} in the sample)")
    print(f"peak RSS      {peak_gb():8.2f} GB")


if __name__ == "__main__":
    main()
