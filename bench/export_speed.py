"""Export speed on a synthetic project: seconds per format and for a FalkorDB load, and peak RSS.

The project is written with the real record, graph and vector modules (no extraction), sized by --entities;
chunks = entities / 2, relations = 3 x entities, mentions = 4 x entities, vectors of --dim dimensions.

    .venv/bin/python bench/export_speed.py                    # 20k entities, every format + FalkorDB
    .venv/bin/python bench/export_speed.py --entities 100000 --no-falkordb
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from harness import peak_rss_mb
from hrag_cli import Project
from hrag_cli.core import store
from hrag_cli.core.config import VectorSettings
from hrag_cli.graph.model import add_synonym_edges, build_graph, save_graph
from hrag_cli.core.project import ProjectDir
from hrag_cli.core.records import Chunk, ChunkRef, Document, Entity, Fact, Relation, to_dict
from hrag_cli.storage.vectors.index import VectorIndex


def make_project(root: Path, n_ent: int, dim: int) -> ProjectDir:
    rng = np.random.default_rng(0)
    project = ProjectDir(root)
    project.init()
    n_chunk = max(n_ent // 2, 1)
    n_doc = max(n_chunk // 10, 1)
    docs = [Document(f"d{i}", f"docs/{i}.txt", "x", 1000, 10) for i in range(n_doc)]
    text = "Lorem ipsum dolor sit amet, \"quoted\" text with a newline\nand Unicode ü 東京. " * 60
    chunks = [Chunk(f"c{i}", f"d{i // 10}", i % 10, 1000, text) for i in range(n_chunk)]
    ents = [Entity(f"entity {i:07d}", f"Entity {i}", "concept", "A description of the entity. " * 8,
                   [], [f"c{i % n_chunk}"]) for i in range(n_ent)]
    pairs = {tuple(sorted((int(a), int(b)))) for a, b in rng.integers(0, n_ent, size=(3 * n_ent, 2)) if a != b}
    rels = [Relation(f"r{a}-{b}", ents[a].id, ents[b].id, ["related to"], ["k"], "relation description", 1.0,
                     ["c0"]) for a, b in sorted(pairs)]
    facts = [Fact(f"f{i}", ents[int(r.src.split()[1])].name, "related to", ents[int(r.tgt.split()[1])].name,
                  r.id, ["c0"]) for i, r in enumerate(rels)]
    mentions = sorted({(f"c{int(c)}", ents[int(e)].id, 1) for c, e in
                       zip(rng.integers(0, n_chunk, 4 * n_ent), rng.integers(0, n_ent, 4 * n_ent))})
    store.write_jsonl(project.docs_path, (to_dict(d) for d in docs))
    store.write_jsonl(project.chunks_path, (to_dict(c) for c in chunks))
    store.write_jsonl(project.entities_path, (to_dict(e) for e in ents))
    store.write_jsonl(project.relations_path, (to_dict(r) for r in rels))
    store.write_jsonl(project.facts_path, (to_dict(f) for f in facts))
    g = build_graph(docs, [ChunkRef(c.chunk_id, c.doc_id, c.order) for c in chunks], ents, rels, mentions)
    add_synonym_edges(g, [(ents[i].id, ents[i + 1].id, 0.9) for i in range(0, n_ent - 1, 50)])
    save_graph(project, g)
    for name, ids in (("entities", [e.id for e in ents]), ("chunks", [c.chunk_id for c in chunks]),
                      ("facts", [f.id for f in facts])):
        VectorIndex.build(name, ids, rng.normal(size=(len(ids), dim)).astype(np.float32), VectorSettings(),
                          "bench").save(project.vectors_dir)
    return project


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entities", type=int, default=20000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--no-falkordb", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        project = make_project(Path(tmp) / "proj", args.entities, args.dim)
        print(f"project built in {time.perf_counter() - t0:.1f}s", flush=True)
        outs = {"graphml": Path(tmp) / "g.graphml", "jsonl": Path(tmp) / "j", "csv": Path(tmp) / "c",
                "cypher": Path(tmp) / "g.cypher"}
        for fmt, out in outs.items():
            t0 = time.perf_counter()
            s = Project(project.root).export(fmt, out)
            print(f"{fmt:8s} {time.perf_counter() - t0:6.1f}s  nodes={s['nodes']} edges={s['edges']}", flush=True)
        if not args.no_falkordb:
            from tests.falkordb_server import FalkorServer, unavailable_reason

            reason = unavailable_reason()
            if reason:
                print(f"falkordb skipped: {reason}")
            else:
                with FalkorServer() as srv:
                    t0 = time.perf_counter()
                    s = Project(project.root).export("falkordb", url=srv.url, graph="bench")
                    print(f"falkordb {time.perf_counter() - t0:6.1f}s  nodes={s['nodes']} edges={s['edges']} "
                          f"vectors={s['vectors']} (dim {args.dim})", flush=True)
    print(f"peak RSS {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
