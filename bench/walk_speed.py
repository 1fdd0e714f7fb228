"""The ppr walk alone on a built project: load time, CPU per walk, entries read, peak RSS, and whether the chunk
ranking matches a float64 power iteration of the same reset run to 1e-13.

Each walk starts from a reset vector shaped like a ppr query's: a few seed entities with weights about 0.1,
and every chunk with passage_node_weight (0.05) x a min-max-scaled score, cosine-like noise with a handful of
strong matches; the best `--passage-top-k` chunks keep their own weight and the others count as their mean
(query.passage_node_top_k, `ppr.build_reset`), which `ppr.passage_walk` walks locally plus the chunk prior
(one walk per process, timed apart). `--hipporag` also compares the ranking with the walk of HippoRAG 2's
reset, every chunk with its own weight (what the bound changes). Needs only graph/walk.npz (a project built
through resolve is enough).

`--questions Q.txt` walks real queries instead (a project built through synonyms): each question ranked as
`hrag query --mode ppr` ranks it, with the walk pushed to each `--eps` and to convergence, the tolerance
`ppr.PUSH_EPS` is chosen by.

    .venv/bin/python bench/walk_speed.py --project P [--walks 5] [--top 50] [--passage-top-k M] [--hipporag]
    .venv/bin/python bench/walk_speed.py --project P --questions Q.txt --eps 1e-7 2e-7 3e-7 [--ranks 10]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from harness import peak_rss_mb
from hrag_cli.core.config import QuerySettings
from hrag_cli.graph.model import CHUNK, ENTITY, VERTEX_KINDS
from hrag_cli.core.project import ProjectDir
from hrag_cli.query import ppr
from hrag_cli.graph import push
from hrag_cli.graph.chunk_prior import chunk_prior, project_walk_scale
from hrag_cli.query.ppr import SeedWeights, build_reset, passage_walk
from hrag_cli.graph.walk import WalkGraph


def reference(walk: WalkGraph, reset: np.ndarray, damping: float, scale=None, tol: float = 1e-13) -> np.ndarray:
    """float64 power iteration (dangling mass back to the reset), the yardstick for the ranking."""
    n = walk.vcount()
    weight = np.asarray(walk.weights(scale), dtype=np.float64)
    strength = np.bincount(walk.rows(), weights=weight, minlength=n)
    live = strength > 0
    inv = np.divide(1.0, strength, out=np.zeros(n), where=live)
    r = reset / reset.sum()
    p = r
    for _ in range(10_000):
        spread = np.bincount(walk.rows(), weights=weight * (p * inv)[walk.cols], minlength=n)
        nxt = (1 - damping) * r + damping * (spread + p[~live].sum() * r)
        nxt /= nxt.sum()
        if np.abs(nxt - p).sum() < tol:
            return nxt
        p = nxt
    return p


def first_difference(a: np.ndarray, b: np.ndarray) -> int | None:
    """The first rank (1-based) where two rankings differ, None when equal."""
    diff = np.flatnonzero(a != b)
    return int(diff[0]) + 1 if len(diff) else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--project", type=Path, required=True)
    ap.add_argument("--walks", type=int, default=5)
    ap.add_argument("--top", type=int, default=50, help="chunk ranks compared with the float64 walk (0: skip)")
    ap.add_argument("--passage-top-k", type=int, default=QuerySettings().passage_node_top_k,
                    help="chunks keeping their own passage weight (0: every chunk)")
    ap.add_argument("--eps", type=float, nargs="+", default=[ppr.PUSH_EPS],
                    help="the push's tolerance (ppr.PUSH_EPS); several with --questions")
    ap.add_argument("--questions", type=Path,
                    help="real queries instead of made-up resets: these questions (one a line) as `hrag query "
                         "--mode ppr` ranks them, with each --eps and with a converged walk")
    ap.add_argument("--ranks", type=int, default=10, help="with --questions: the chunk ranks compared")
    ap.add_argument("--hipporag", action="store_true", help="also rank with HippoRAG 2's reset (every chunk's own weight)")
    args = ap.parse_args()
    project = ProjectDir(args.project)
    if args.questions:
        if args.hipporag:
            ap.error("--hipporag compares made-up resets: not with --questions")
        return question_walks(project, args.questions, args.eps, args.ranks)
    if len(args.eps) > 1:
        ap.error("several --eps need --questions")
    ppr.PUSH_EPS = args.eps[0]
    damping, scale = QuerySettings().damping, project_walk_scale(project, project.settings())
    t0 = time.process_time()
    walk = WalkGraph.load(project)
    load_s = time.process_time() - t0
    chunks = np.flatnonzero(walk.vkind == VERTEX_KINDS.index(CHUNK))
    entities = np.flatnonzero(walk.vkind == VERTEX_KINDS.index(ENTITY))
    read = count_spreads(walk)
    t0 = time.process_time()
    chunk_prior(walk, damping, scale)
    prior_s = time.process_time() - t0
    rng = np.random.default_rng(1)
    cpu, entries, first, hippo = [], [], [], []
    for _ in range(args.walks):
        seeds = SeedWeights(entity={int(v): float(w) for v, w in zip(rng.choice(entities, 6), rng.random(6) / 10)})
        score = rng.normal(0.2, 0.08, len(chunks))
        score[rng.choice(len(chunks), min(20, len(chunks)))] += 0.3
        weight = 0.05 * (score - score.min()) / max(score.max() - score.min(), 1e-12)
        read.clear()
        t0 = time.process_time()
        reset, floor = build_reset(seeds, chunks, weight, args.passage_top_k)
        pr = passage_walk(walk, reset, floor, damping, scale, vertices=chunks)    # the chunks' scores, as a query
        cpu.append(time.process_time() - t0)
        entries.append(sum(read))
        if not args.top:
            continue
        ranked = chunks[np.argsort(-pr, kind="stable")[:args.top]]
        full = reset.dense(walk.vcount())
        full[chunks] += floor
        exact = reference(walk, full, damping, scale)
        first.append(first_difference(ranked, chunks[np.argsort(-exact[chunks], kind="stable")[:args.top]]))
        if args.hipporag:
            old, _ = build_reset(seeds, chunks, weight)
            theirs = reference(walk, old.dense(walk.vcount()), damping, scale)
            order = chunks[np.argsort(-theirs[chunks], kind="stable")[:args.top]]
            hippo.append((first_difference(ranked, order), len(set(ranked[:5]) & set(order[:5]))))
    rss = peak_rss_mb()
    print(f"vertices {walk.vcount():,}  entries {len(walk.weight):,}  load {load_s:.3f} s CPU  "
          f"chunk prior {prior_s:.3f} s CPU (walked here; a query reads the one the synonyms stage saved)  "
          f"passage_node_top_k {args.passage_top_k}  eps {args.eps[0]:g}  scale {scale}")
    print(f"walk CPU per query: median {np.median(cpu):.3f} s (min {min(cpu):.3f}, max {max(cpu):.3f}); entries "
          f"read by pushes: median {int(np.median(entries)):,}; peak RSS {rss:.0f} MB"
          + (" (with the float64 yardstick)" if args.top else ""))
    if args.top:
        same = sum(f is None for f in first)
        print(f"top {args.top} chunks as the float64 walk of the same reset: {same} of {len(first)} walks; first "
              f"differing ranks {[f for f in first if f is not None]}")
    if hippo:
        print("against HippoRAG 2's reset (every chunk its own weight): first differing rank, top-5 overlap: "
              + ", ".join(f"{f or '-'}/{o}" for f, o in hippo))


def count_spreads(walk: WalkGraph) -> list[int]:
    """The entries each of the walk's spreads reads, appended to the list returned (a sweep round reads
    every entry without a spread: not counted)."""
    read: list[int] = []
    spread = walk.spread

    def counted(vertices: np.ndarray, amount: np.ndarray, scale=None):
        read.append(int(walk.degrees()[vertices].sum()))
        return spread(vertices, amount, scale)

    walk.spread = counted        # type: ignore[method-assign]
    return read


def question_walks(project: ProjectDir, questions: Path, eps: list[float], ranks: int) -> None:
    """Each question's ranked chunks (the walk fused with the passage and BM25 scores, as a query shows them)
    with the walk pushed to each tolerance and converged (push.PRIOR_EPS): how often the first 5 and the first
    `ranks` are the converged walk's, and the first tolerance's; the entries its pushes read and the question's
    CPU (one pass per tolerance in turn, not paired: the entries are the steadier figure). The converged walks
    go first, so the timed passes find the batch's table made. No LLM: a fact filter would make the passes
    differ for reasons of its own."""
    from hrag_cli.query.run import QuerySession, read_queries  # noqa: E402  (only this mode runs whole queries)

    settings = project.settings()
    settings.query.top_k = max(ranks, 5)
    settings.llm.model = ""
    session = QuerySession(project, settings)
    walk = session.index.walk
    read = count_spreads(walk)
    qs = [q for _, q in read_queries(questions)]       # as `hrag query --file` reads them

    def ranked(tolerance: float) -> tuple[list[list[str]], list[float], list[int], int]:
        ppr.PUSH_EPS = tolerance
        order, cpu, entries, walked = [], [], [], 0
        for q in qs:
            read.clear()
            t0 = time.process_time()
            r, _ = session.run(q, mode="ppr")
            cpu.append(time.process_time() - t0)
            entries.append(sum(read))
            walked += "ppr_ms" in r.timings           # the others fell back to the passage scores
            order.append([c.chunk_id for c in r.chunks])
        return order, cpu, entries, walked

    exact, _, _, walked = ranked(push.PRIOR_EPS)
    first = None
    print(f"{len(qs)} questions, {walked} of them walked; chunks ranked as `hrag query --mode ppr` ranks them, "
          f"against a walk to {push.PRIOR_EPS:g} (converged){' and eps ' + format(eps[0], 'g') if len(eps) > 1 else ''}")
    for tolerance in eps:
        order, cpu, entries, _ = ranked(tolerance)
        first = first or order
        same = [sum(a[:k] == b[:k] for a, b in zip(order, ref)) for ref in (exact, first) for k in (5, ranks)]
        print(f"eps {tolerance:g}: question CPU median {1e3 * float(np.median(cpu)):.1f} ms, pushed entries median "
              f"{int(np.median(entries)):,}; first 5 / {ranks} chunks as converged: {same[0]} / {same[1]}"
              + (f", as eps {eps[0]:g}: {same[2]} / {same[3]}" if len(eps) > 1 else ""))


if __name__ == "__main__":
    main()
