"""The +1 % incremental run, stage by stage, on a project bench/scale.py built.

Copies WORK/docs and WORK/project (so the run can be repeated on the same starting point), adds 1 % new
passages the way scale.py does, then runs `hrag index` with --stop-after chunk, extract, resolve and finally in
full, each as its own measured process: the per-stage CPU of an incremental run, which one `hrag index` does
not show. With --fresh, also builds the same documents from scratch and compares the graph files byte for
byte after resolve (entities, relations, facts: their logical lines, base with patch; merges, graph.pkl).

    nice -n 10 .venv/bin/python bench/scale.py --passages 10000 --work WORK --queries 5
    nice -n 10 .venv/bin/python bench/incremental.py --work WORK [--fresh]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from harness import measured, parse_args
from scale import load_real, write_corpus

RECORDS = ("entities.jsonl", "relations.jsonl", "facts.jsonl")
COMPARED = (*RECORDS, "merges.jsonl", "graph.pkl")


def passages_in(docs: Path) -> int:
    return sum(sum(1 for line in p.open(encoding="utf-8") if line.strip()) for p in docs.glob("part-*.jsonl"))


def graph_files(project: Path) -> dict[str, bytes]:
    """The graph files' bytes; a record file's are its logical lines (its base with its patch applied, which
    is what a fresh build writes, decompressed)."""
    from hrag_cli.core import store

    graph = (project / "current").resolve() / "graph" if (project / "current").exists() else project / "graph"
    return {name: b"".join(store.line_blocks(graph / name)) if name in RECORDS else (graph / name).read_bytes()
            for name in COMPARED if (graph / name).exists()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="a bench/scale.py --work folder")
    ap.add_argument("--fresh", action="store_true", help="also build the same documents from scratch and compare")
    args = parse_args(ap)
    src_docs, src_proj = args.work / "docs", args.work / "project"
    if not (src_docs.is_dir() and src_proj.is_dir()):
        sys.exit(f"{args.work} has no docs/ and project/: run bench/scale.py --work {args.work} first")
    run_dir = args.work / "incremental"
    shutil.rmtree(run_dir, ignore_errors=True)
    docs, proj = run_dir / "docs", run_dir / "project"
    shutil.copytree(src_docs, docs)
    shutil.copytree(src_proj, proj, symlinks=True)
    # copies are new files to the project (new inodes): one unmeasured run stamps them, as a cron job's own
    # folder is, so the measured run reads only the added file
    time.sleep(1.05)
    measured("index", str(docs), "-p", str(proj), "-q")
    n = passages_in(docs)
    add = max(1, n // 100)
    write_corpus(docs, load_real(), n, n + add, False)
    p = ["-p", str(proj), "-q"]
    stages = {}
    for stop in ("chunk", "extract", "resolve", None):
        name = stop or "synonyms"
        stages[name] = measured("index", str(docs), *(["--stop-after", stop] if stop else []), *p)
        print(f"[+{add} to {n}] {name}: {json.dumps(stages[name])}", file=sys.stderr, flush=True)
        if stop == "resolve":
            after_resolve = graph_files(proj)   # before synonyms adds its edges to graph.pkl
    total = sum(s["cpu_s"] for s in stages.values())
    out = {"passages": n, "added": add, "stages": stages, "cpu_s": round(total, 2)}
    if args.fresh:
        fresh = run_dir / "fresh"
        fresh.mkdir()
        shutil.copy(src_proj / "hrag.toml", fresh / "hrag.toml")
        out["fresh"] = measured("index", str(docs), "--stop-after", "resolve", "-p", str(fresh), "-q")
        a, b = after_resolve, graph_files(fresh)
        out["identical"] = {name: a.get(name) == b.get(name) for name in COMPARED}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
