"""The ppr walk alone on a built project: load time, CPU per walk, peak RSS, and whether the chunk ranking
matches a float64 power iteration run to 1e-13 (the walk before it became float32 at tol 1e-7).

Each walk starts from a reset vector shaped like a ppr query's: a few seed entities with weights about 0.1,
and every chunk with passage_node_weight (0.05) x a min-max-scaled score, cosine-like noise with a handful of
strong matches. Needs only graph/walk.npz (a project built through resolve is enough).

    .venv/bin/python bench/walk_speed.py --project P [--walks 5] [--top 50]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hrag_cli.graph import CHUNK, ENTITY, VERTEX_KINDS  # noqa: E402
from hrag_cli.project import Project  # noqa: E402
from hrag_cli.query.ppr import personalized_pagerank  # noqa: E402
from hrag_cli.walk import WalkGraph  # noqa: E402


def reference(walk: WalkGraph, reset: np.ndarray, damping: float, tol: float = 1e-13) -> np.ndarray:
    """float64 power iteration (dangling mass back to the reset), the yardstick for the ranking."""
    n = walk.vcount()
    strength = np.bincount(walk.rows(), weights=walk.weight, minlength=n)
    live = strength > 0
    inv = np.divide(1.0, strength, out=np.zeros(n), where=live)
    r = reset / reset.sum()
    p = r
    for _ in range(10_000):
        spread = np.bincount(walk.rows(), weights=walk.weight * (p * inv)[walk.cols], minlength=n)
        nxt = (1 - damping) * r + damping * (spread + p[~live].sum() * r)
        nxt /= nxt.sum()
        if np.abs(nxt - p).sum() < tol:
            return nxt
        p = nxt
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--project", type=Path, required=True)
    ap.add_argument("--walks", type=int, default=5)
    ap.add_argument("--top", type=int, default=50, help="chunk ranks compared with the float64 walk (0: skip)")
    args = ap.parse_args()
    t0 = time.process_time()
    walk = WalkGraph.load(Project(args.project))
    load_s = time.process_time() - t0
    chunks = np.flatnonzero(walk.vkind == VERTEX_KINDS.index(CHUNK))
    entities = np.flatnonzero(walk.vkind == VERTEX_KINDS.index(ENTITY))
    rng = np.random.default_rng(1)
    cpu, same = [], []
    for _ in range(args.walks):
        reset = np.zeros(walk.vcount())
        reset[rng.choice(entities, 6)] = rng.random(6) / 10
        score = rng.normal(0.2, 0.08, len(chunks))
        score[rng.choice(len(chunks), min(20, len(chunks)))] += 0.3
        reset[chunks] += 0.05 * (score - score.min()) / max(score.max() - score.min(), 1e-12)
        t0 = time.process_time()
        pr = personalized_pagerank(walk, reset, 0.5)
        cpu.append(time.process_time() - t0)
        if args.top:
            exact = reference(walk, reset, 0.5)
            same.append(np.array_equal(chunks[np.argsort(-pr[chunks], kind="stable")[:args.top]],
                                       chunks[np.argsort(-exact[chunks], kind="stable")[:args.top]]))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"vertices {walk.vcount():,}  entries {len(walk.cols):,}  load {load_s:.3f} s CPU")
    print(f"walk CPU per query: median {np.median(cpu):.3f} s (min {min(cpu):.3f}, max {max(cpu):.3f})  "
          f"peak RSS {rss:.0f} MB" + (" (with the float64 yardstick)" if args.top else ""))
    if args.top:
        print(f"top {args.top} chunks as the float64 walk's: {sum(same)} of {len(same)} walks")


if __name__ == "__main__":
    main()
