"""Scale of the synonym pass: cells + k-NN join of every entity + pair extraction on N random unit vectors.

    .venv/bin/python bench/synonyms_scale.py --n 100000
    .venv/bin/python bench/synonyms_scale.py --n 1000000        # several minutes; run with nohup

Data (--data), each a fraction (--dup, default 0.2) of noisy copies of another vector (cosine 0.80-0.98 to it),
so the pass has synonym pairs to find:
- `uniform` (default): uniform on the sphere, as the issue asks, and the worst case for the cells: there are
  no clusters for the centroids to follow. Every point's 10 nearest neighbours that are not planted copies sit
  at cosine ~0.2, barely nearer than the rest, so recall@10 of those measures noise.
- `lowrank`: a random 32-dimensional subspace of the 384 dimensions plus isotropic noise.
- `spectrum`: Gaussian with the mean norm and the covariance spectrum of real all-MiniLM-L6-v2 vectors of
  entity names (bench/minilm_names_spectrum.txt, from the MuSiQue bench project). It has their spread but none
  of their clusters (variants of one name), so unplanted neighbours sit at near-equal distances (~0.45).

Runs the stage's own code (hrag_cli.embed.knn.update_knn and synonym_edges.candidate_pairs) with the default
settings.synonyms, and prints:
  wall time and peak RSS of the pass; against exact brute force on a sample of entities: the recall of the
  neighbours the pass keeps (exact top-k at >= threshold: the target, >= 0.98) and of their pairs, and recall@k
  of the whole k-NN lists, also as ann-benchmarks counts it (a neighbour within 1e-3 cosine of the true k-th
  counts). The weak neighbours below the threshold are never used; the cells find them less reliably.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from harness import peak_rss_mb
from hrag_cli.core.config import Settings
from hrag_cli.core.progress import Reporter
from hrag_cli.embed.knn import KnnLists, update_knn
from hrag_cli.embed.synonym_edges import candidate_pairs


EPSILON = 1e-3
SPECTRUM = Path(__file__).resolve().parent / "minilm_names_spectrum.txt"
MEAN_NORM = 0.355


def peak_gb() -> float:
    return peak_rss_mb() / 1024


def make_vectors(n: int, dim: int, dup: float, seed: int, data: str = "uniform") -> np.ndarray:
    rng = np.random.default_rng(seed)
    m = np.empty((n, dim), dtype=np.float32)
    step = 100_000
    basis = rng.standard_normal((32, dim), dtype=np.float32)
    if data == "spectrum":
        rotation = np.linalg.qr(rng.standard_normal((dim, dim)))[0].astype(np.float32)
        share = np.loadtxt(SPECTRUM)[:dim]
        mean = rotation[0] * MEAN_NORM            # one common direction, as sentence embeddings have
        scale = np.sqrt(share / share.sum() * (1 - MEAN_NORM ** 2)).astype(np.float32)
    for s in range(0, n, step):
        size = min(step, n - s)
        if data == "uniform":
            block = rng.standard_normal((size, dim), dtype=np.float32)
        elif data == "spectrum":
            block = mean + (rng.standard_normal((size, dim), dtype=np.float32) * scale) @ rotation
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
    ap.add_argument("--sample", type=int, default=4000)
    ap.add_argument("--add", type=int, default=1000, help="then a later run with this many new entities (0: none)")
    ap.add_argument("--data", choices=("uniform", "lowrank", "spectrum"), default="uniform")
    ap.add_argument("--cells-per-entity", type=int, default=None, help="override settings.synonyms.cells_per_entity")
    ap.add_argument("--cell-size", type=int, default=None, help="override settings.synonyms.cell_size")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    s = Settings()
    for key in ("cells_per_entity", "cell_size"):
        if getattr(args, key):
            setattr(s.synonyms, key, getattr(args, key))
    syn = s.synonyms
    k, thr = syn.top_k, syn.threshold
    print(f"data={args.data} n={args.n} dim={args.dim} dup={args.dup} k={k} threshold={thr} "
          f"cells_per_entity={syn.cells_per_entity} cell_size={syn.cell_size}", flush=True)

    t0 = time.perf_counter()
    m = make_vectors(args.n, args.dim, args.dup, args.seed, args.data)
    ids = [f"e{i}" for i in range(args.n)]
    hashes = [str(i) for i in range(args.n)]
    t_data = time.perf_counter() - t0
    print(f"data          {t_data:8.1f} s", flush=True)

    quiet = Reporter("quiet")
    c0 = time.process_time()
    t0 = time.perf_counter()
    knn, queried = update_knn(KnnLists(k, "bench"), ids, hashes, m, k, quiet, syn.cells_per_entity, syn.cell_size)
    t_knn = time.perf_counter() - t0
    sizes = np.bincount(knn.cells.ravel(), minlength=knn.plan.cells)
    print(f"cells + join  {t_knn:8.1f} s   ({queried} entities, {knn.plan.cells} cells of {sizes.mean():.0f} "
          f"(largest {sizes.max()}), {knn.cells.shape[1]} per entity)  peak {peak_gb():.2f} GB", flush=True)

    t0 = time.perf_counter()
    pairs = candidate_pairs(knn, set(ids).__contains__, thr)
    t_pairs = time.perf_counter() - t0
    total = t_knn + t_pairs
    print(f"pairs         {t_pairs:8.1f} s   ({len(pairs)} synonym pairs)", flush=True)
    cpu = time.process_time() - c0
    pass_peak = peak_gb()
    print(f"synonym pass  {total:8.1f} s   (cells + join + pairs; data generation excluded); "
          f"CPU {cpu:.0f} s over all threads, load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
          flush=True)

    check = against_brute_force(m, knn, pairs, ids, np.random.default_rng(args.seed + 1).choice(
        args.n, size=min(args.sample, args.n), replace=False), k, thr)
    print(f"synonym recall {check['kept']:7.4f}   ({check['kept_n']} exact top-{k} neighbours >= {thr} in a sample "
          f"of {check['sample']}: the neighbours the pass keeps; target >= 0.98)")
    print(f"  just above  {check['edge']:8.4f}   ({check['edge_n']} of them at {thr}-{thr + 0.05:.2f})")
    print(f"pair recall   {check['pairs']:8.4f}   (those as SYNONYM pairs, either side's list)")
    print(f"recall@{k}     {check['all']:8.4f}   (all {k} neighbours vs exact brute force)")
    print(f"eps-recall@{k} {check['eps']:8.4f}   (a neighbour counts when within {EPSILON} cosine of the true "
          f"{k}th, as ann-benchmarks counts)")

    if args.add:   # a later run: the same entities plus new ones, a fifth of them copies (cosine 0.8-0.98)
        extra = make_vectors(args.add, args.dim, 0.0, args.seed + 2, args.data)
        rng = np.random.default_rng(args.seed + 3)
        copies = rng.choice(args.add, size=args.add // 5, replace=False)
        src = rng.integers(0, args.n, size=len(copies))
        extra[copies] = m[src] + rng.uniform(0.2, 0.75, size=(len(copies), 1)).astype(np.float32) * extra[copies]
        extra[copies] /= np.linalg.norm(extra[copies], axis=1, keepdims=True)
        m2 = np.vstack([m, extra])
        del m
        ids2 = ids + [f"n{i}" for i in range(args.add)]
        hashes2 = hashes + [f"n{i}" for i in range(args.add)]
        t0 = time.perf_counter()
        knn2, queried = update_knn(knn, ids2, hashes2, m2, k, quiet, syn.cells_per_entity, syn.cell_size)
        pairs2 = candidate_pairs(knn2, set(ids2).__contains__, thr)
        t_inc = time.perf_counter() - t0
        added = against_brute_force(m2, knn2, pairs2, ids2, np.arange(args.n, args.n + args.add), k, thr)
        print(f"later run     {t_inc:8.1f} s   (+{args.add} entities: {queried} joined, the rest kept their lists; "
              f"their kept neighbours found {added['kept']:.4f} of {added['kept_n']}, as pairs {added['pairs']:.4f})")
    print(f"peak RSS      {peak_gb():8.2f} GB   (with the brute-force check; the pass itself: {pass_peak:.2f} GB)")


def against_brute_force(m: np.ndarray, knn: KnnLists, pairs: dict, ids: list[str], sample: np.ndarray, k: int,
                        thr: float) -> dict:
    """Recall of the lists of the `sample` rows against their exact top-k: all k, ann-benchmarks style, the
    neighbours at or above the threshold (the kept ones), those just above it, and the kept ones as pairs."""
    hit = eps_hit = tot = 0
    syn_hit = syn_tot = pair_hit = 0
    edge_hit = edge_tot = 0      # the hardest of them: just above the threshold
    for s0 in range(0, len(sample), 250):
        rows = sample[s0:s0 + 250]
        sims = m[rows] @ m.T
        sims[np.arange(len(rows)), rows] = -np.inf
        top = np.argpartition(-sims, k, axis=1)[:, :k]
        for r, row in enumerate(rows):
            truth = set(top[r].tolist())
            got = knn.nbr[row][knn.nbr[row] >= 0]
            hit += len(truth & set(got.tolist()))
            kth = sims[r, top[r]].min()
            eps_hit += int((knn.sim[row][: len(got)] >= kth - EPSILON).sum())
            tot += k
            for j in top[r]:
                if sims[r, j] >= thr:
                    syn_tot += 1
                    syn_hit += int(j in got)
                    if sims[r, j] < thr + 0.05:
                        edge_tot += 1
                        edge_hit += int(j in got)
                    a, b = sorted((ids[row], ids[j]))
                    pair_hit += (a, b) in pairs
    return {"sample": len(sample), "all": hit / tot, "eps": eps_hit / tot, "kept": syn_hit / max(syn_tot, 1),
            "kept_n": syn_tot, "edge": edge_hit / max(edge_tot, 1), "edge_n": edge_tot,
            "pairs": pair_hit / max(syn_tot, 1)}

if __name__ == "__main__":
    main()
