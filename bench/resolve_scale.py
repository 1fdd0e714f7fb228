"""Resolve at scale: synthetic extraction records with Zipf-distributed entity names, then the resolve stage
(load, merge, descriptions, graph build, writing) timed phase by phase, with peak RSS.

    .venv/bin/python bench/resolve_scale.py                      # 100k and 1M entity mentions
    .venv/bin/python bench/resolve_scale.py --mentions 200000    # one size

A "mention" is one entity row; each chunk also carries 0.6 relation rows per entity row (whose endpoints are
mentions too, as in resolve). Descriptions are unique per row (the worst case for memory). No LLM: long
descriptions take the no-LLM path. Each size runs in a fresh process so its peak RSS is its own; generation
happens in another process first. Target on a 2-core machine: 1M mentions < 60 s and < 4 GB.
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

ENTITIES_PER_CHUNK = 10
RELATIONS_PER_CHUNK = 6
TYPES = ["person", "organization", "location", "event", "artifact", "concept"]
PREDICATES = ["works for", "is located in", "founded", "met", "is part of", "wrote", "owns", "visited"]


def generate(root: Path, mentions: int, seed: int = 7) -> None:
    """Write docs.jsonl, chunks.jsonl and cache/extractions.jsonl for `mentions` entity rows."""
    import numpy as np

    from hrag_cli.core import store
    from hrag_cli.core.project import ProjectDir, text_hash

    rng = np.random.default_rng(seed)
    project = ProjectDir(root)
    project.init()
    n_chunks = mentions // ENTITIES_PER_CHUNK
    vocab = max(1000, mentions // 5)
    names = [f"Entity {i} {'Ünïcødé' if i % 7 == 0 else 'Name'}" for i in range(vocab)]
    ranks = (rng.zipf(1.3, size=n_chunks * ENTITIES_PER_CHUNK) - 1) % vocab
    variant = rng.random(n_chunks * ENTITIES_PER_CHUNK)
    types = rng.integers(0, len(TYPES), size=n_chunks * ENTITIES_PER_CHUNK)
    pick = rng.integers(0, ENTITIES_PER_CHUNK, size=(n_chunks, RELATIONS_PER_CHUNK, 2))
    preds = rng.integers(0, len(PREDICATES), size=(n_chunks, RELATIONS_PER_CHUNK))
    strengths = rng.integers(1, 11, size=(n_chunks, RELATIONS_PER_CHUNK))
    docs, chunks = [], []
    chunks_per_doc = 20
    with store.JsonlAppender(project.extractions_path) as ext:
        for c in range(n_chunks):
            doc = c // chunks_per_doc
            if c % chunks_per_doc == 0:
                docs.append({"doc_id": text_hash(f"doc{doc}"), "path": f"doc{doc}.txt", "sha256": "x", "bytes": 1,
                             "n_chunks": chunks_per_doc})
            cid = text_hash(f"chunk {c}")
            chunks.append({"chunk_id": cid, "doc_id": docs[-1]["doc_id"], "order": c % chunks_per_doc,
                           "n_tokens": 1, "text": f"chunk {c}"})
            rows = []
            base = c * ENTITIES_PER_CHUNK
            for k in range(ENTITIES_PER_CHUNK):
                name = names[int(ranks[base + k])]
                v = variant[base + k]
                surface = name.upper() if v < 0.05 else (name.lower() if v < 0.1 else name)
                rows.append({"name": surface, "type": TYPES[int(types[base + k])],
                             "description": f"{name} as seen in chunk {c}, row {k}: a synthetic description."})
            rels = []
            for r in range(RELATIONS_PER_CHUNK):
                a, b = int(pick[c, r, 0]), int(pick[c, r, 1])
                rels.append({"src": rows[a]["name"], "tgt": rows[b]["name"],
                             "predicate": PREDICATES[int(preds[c, r])], "keywords": ["synthetic", f"k{r}"],
                             "description": f"Relation {r} of chunk {c}.", "strength": float(strengths[c, r])})
            ext.append({"chunk_id": cid, "extractor": "bench", "entities": rows, "relations": rels,
                        "gleaning_rounds": 0, "status": "ok"})
    store.write_jsonl(project.docs_path, docs)
    store.write_jsonl(project.chunks_path, chunks)
    # as after a real extract stage: the manifest names the current extractor
    project.record_stage("extract", "bench", "bench", {"extractor": "bench"})


def run(root: Path) -> dict:
    """The resolve stage phase by phase (same calls as resolve.run_resolve)."""
    from hrag_cli.core.config import Settings
    from hrag_cli.core.project import ProjectDir
    from hrag_cli.resolve.stage import finalize, gc_paused, load_inputs, merge_records, write_outputs
    from hrag_cli.resolve.summaries import Summarizer

    project = ProjectDir(root)
    settings = Settings()
    times: dict[str, float] = {}
    t0 = t = time.perf_counter()
    cpu0 = time.process_time()

    cpu_laps: dict[str, float] = {}
    c = cpu0

    def lap(name: str) -> None:
        nonlocal t, c
        now, cnow = time.perf_counter(), time.process_time()
        times[name] = round(now - t, 2)
        cpu_laps[name] = round(cnow - c, 2)
        t, c = now, cnow

    pause = gc_paused()   # as run_resolve does
    pause.__enter__()
    docs, chunks, load = load_inputs(project)
    records = list(load())
    n_mentions = sum(len(r.entities) for r in records)
    lap("load")
    merged = merge_records(lambda: records)
    del records
    lap("merge")
    resolved = finalize(merged, Summarizer(project, settings))
    del merged
    sizes = {"entities": len(resolved.entities), "relations": len(resolved.relations), "facts": resolved.fact_count}
    lap("descriptions+records")
    graph = write_outputs(project, resolved, docs, chunks)
    lap("write+graph")
    pause.__exit__(None, None, None)
    times["total"] = round(time.perf_counter() - t0, 2)
    times["cpu"] = round(time.process_time() - cpu0, 2)
    return {"mentions": n_mentions, "chunks": len(chunks), **sizes, "vertices": graph.n,
            "edges": graph.m, "seconds": times, "cpu_seconds": cpu_laps,
            "peak_rss_mb": round(peak_rss_mb(), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mentions", type=int, nargs="*", default=[100_000, 1_000_000])
    ap.add_argument("--run", type=Path, help=argparse.SUPPRESS)        # child: resolve this project
    ap.add_argument("--generate", type=Path, help=argparse.SUPPRESS)   # child: generate into this project
    args = ap.parse_args()
    if args.run:
        print(json.dumps(run(args.run)))
        return
    if args.generate:
        generate(args.generate, args.mentions[0])
        return
    for n in args.mentions:
        with tempfile.TemporaryDirectory(prefix="hrag-bench-") as tmp:
            root = Path(tmp) / "p"
            t = time.perf_counter()
            subprocess.run([sys.executable, __file__, "--generate", str(root), "--mentions", str(n)], check=True)
            gen = time.perf_counter() - t
            out = subprocess.run([sys.executable, __file__, "--run", str(root)], check=True, capture_output=True,
                                 text=True)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            size = sum(f.stat().st_size for f in (root / "graph").iterdir()) / 1e6
            print(f"{n:>9,} mentions (generated in {gen:.1f}s): total {res['seconds']['total']:.1f}s wall "
                  f"({res['seconds']['cpu']:.1f}s CPU), "
                  f"peak RSS {res['peak_rss_mb']:.0f} MB, graph/ {size:.0f} MB")
            print("   phases (wall):", ", ".join(f"{k}={v}s" for k, v in res["seconds"].items()
                                             if k not in ("total", "cpu")))
            print("   phases (CPU): ", ", ".join(f"{k}={v}s" for k, v in res["cpu_seconds"].items()))
            print(f"   entities={res['entities']:,} relations={res['relations']:,} facts={res['facts']:,} "
                  f"vertices={res['vertices']:,} edges={res['edges']:,}")


if __name__ == "__main__":
    main()
