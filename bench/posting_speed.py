"""A ppr question's two posting reads alone on a built project: the fact search (`posting_top`, the top
query.fact_top_k facts) and the dense chunk scores (`VectorIndex.scores`, every chunk, as ppr asks; both also
of a patched index, after a +1 % run), CPU per question, the system time and minor page faults they cost, and a
digest of what they return (the same digest means the same rows and float32 scores to the last bit, so a copy
of this script in an older tree, which imports its own hrag_cli, checks that tree against this one).

Every question is run once first (scratch arrays grown, postings in the page cache), then `--rounds` times; a
question's figure is its least CPU over the rounds.

    .venv/bin/python bench/posting_speed.py --project P --queries Q.txt [--rounds 5]
"""

from __future__ import annotations

import argparse
import hashlib
import resource
import statistics
import time
from pathlib import Path

import numpy as np

from harness import peak_rss_mb
from hrag_cli.core.project import ProjectDir
from hrag_cli.query.index import QueryIndex


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--project", type=Path, required=True)
    ap.add_argument("--queries", type=Path, required=True, help="one question per line")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    project = ProjectDir(args.project)
    ix = QueryIndex(project, project.settings())
    k = ix.settings.query.fact_top_k
    facts, chunks = ix.vector_index("facts")._rows, ix.vector_index("chunks")
    vecs = [ix.embed_query(q.strip()) for q in args.queries.read_text(encoding="utf-8").splitlines() if q.strip()]
    steps = {"facts": lambda v: facts.posting_top(v, k), "chunks": chunks.scores}
    digest = hashlib.blake2b(digest_size=8)
    for v in vecs:
        rows, sims = steps["facts"](v)
        for arr in (np.asarray(rows, np.int64), sims, steps["chunks"](v)):
            digest.update(np.ascontiguousarray(arr).tobytes())
    print(f"{len(vecs)} questions, {len(facts):,} facts, {len(chunks):,} chunks; results digest {digest.hexdigest()}")
    for name, step in steps.items():
        best = [float("inf")] * len(vecs)
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(args.rounds):
            for i, v in enumerate(vecs):
                t0 = time.process_time()
                step(v)
                best[i] = min(best[i], time.process_time() - t0)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        calls = args.rounds * len(vecs)
        print(f"{name:>6}: CPU p50 {1e3 * statistics.median(best):.2f} ms, mean {1e3 * statistics.fmean(best):.2f} ms "
              f"a question (least of {args.rounds}); system {1e3 * (r1.ru_stime - r0.ru_stime) / calls:.2f} ms and "
              f"{(r1.ru_minflt - r0.ru_minflt) / calls:.1f} minor faults a call; peak RSS {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
