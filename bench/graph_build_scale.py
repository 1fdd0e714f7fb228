"""The graph build of a partitioned resolve alone (resolve/graph_build.py, then graph.pkl and walk.npz written) on
synthetic items as many as N passages of `scale.py`'s corpus give, so its memory at sizes this machine cannot
index (1M passages) is measured rather than extrapolated.

    .venv/bin/python bench/graph_build_scale.py --passages 100000 1000000

Per 100,000 passages the 100k run had 100,063 chunks, 547,926 entities, 1,747,846 relations and about 1.45M
mentions (docs/benchmarks.md); ids, names and relation ids here have the lengths of real ones. Each size runs in
its own process: peak RSS (VmHWM) after the items are in, and at the end, CPU of the build and of the write.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import peak_rss_mb

PER_100K = {"chunks": 100_063, "entities": 547_926, "relations": 1_747_846, "mentions": 1_450_000}
PART = 40_000       # entities per partition, as the 100k run's 13 partitions had


def run(passages: int, work: Path) -> dict:
    import numpy as np

    from hrag_cli.core.project import ProjectDir
    from hrag_cli.core.records import ChunkRef, Document
    from hrag_cli.graph.model import _structure, save_graph
    from hrag_cli.resolve.graph_build import GraphBuild

    scale = passages / 100_000
    n = {k: int(v * scale) for k, v in PER_100K.items()}
    rng = np.random.default_rng(7)
    docs = [Document(f"{i:016x}", f"part-{i // 1000:07d}.jsonl#s{i:07d}", "", 0) for i in range(n["chunks"])]
    chunks = [ChunkRef(f"{i * 7919:024x}", f"{i:016x}", 0) for i in range(n["chunks"])]
    t0 = time.process_time()
    g = GraphBuild(_structure(docs, chunks))
    ids = np.sort(rng.choice(2 ** 62, size=n["entities"], replace=False))
    for lo in range(0, len(ids), PART):
        part = [f"ent {int(x):016x}" for x in ids[lo:lo + PART]]
        g.add_entities(part, [p.title() for p in part], ["person"] * len(part), [[] for _ in part])
    per_part = max(1, n["relations"] * PART // max(n["entities"], 1))
    for lo in range(0, n["entities"], PART):
        src = rng.integers(lo, min(lo + PART, n["entities"]), size=per_part)
        tgt = rng.integers(0, n["entities"], size=per_part)
        order = np.lexsort((tgt, src))
        base = len(docs) + len(chunks)
        g.add_relation_ends(base + src[order], base + tgt[order])
        for j in range(per_part):
            g.add_relation(f"{lo + j:024x}", 1.0, None)
    chunk_ids = [c.chunk_id for c in chunks]
    for lo in range(0, n["mentions"], 65_536):
        k = min(65_536, n["mentions"] - lo)
        cs = np.sort(rng.integers(0, len(chunks), size=k))
        es = rng.integers(0, n["entities"], size=k)
        g.add_mentions([(chunk_ids[c], f"ent {int(ids[e]):016x}", 1) for c, e in zip(cs.tolist(), es.tolist())])
    build_cpu = time.process_time() - t0
    held = peak_rss_mb()
    t1 = time.process_time()
    graph, keys = g.finish()
    project = ProjectDir(work)
    project.graph_path.parent.mkdir(parents=True, exist_ok=True)
    save_graph(project, graph, keys)
    return {"passages": passages, **n, "edges": graph.m, "build_cpu_s": round(build_cpu, 1),
            "peak_rss_mb_items_in": round(held), "write_cpu_s": round(time.process_time() - t1, 1),
            "peak_rss_mb": round(peak_rss_mb()), "graph_pkl_mb": round(project.graph_path.stat().st_size / 1e6, 1),
            "walk_npz_mb": round(project.walk_path.stat().st_size / 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passages", type=int, nargs="+", default=[100_000])
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)     # one size, in this process
    args = ap.parse_args()
    if args.one:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(run(args.one, Path(tmp))))
        return
    for p in args.passages:
        out = subprocess.run([sys.executable, __file__, "--one", str(p)], capture_output=True, text=True, check=True)
        print(out.stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
