"""HippoRAG 2 retrieval: seed entities from the facts closest to the query, add every chunk with a small dense
weight (the best `query.passage_node_top_k` their own, the rest their mean), and rank chunks by Personalized
PageRank, walked locally from the seeds and the best chunks plus a chunk prior walked once per graph.

Why this shape: the facts pick the entities a multi-hop question is about; PageRank then walks from them through
MENTIONED_IN/RELATION/SYNONYM edges to the chunks that connect them, while the dense passage weights keep a
passage that answers the question directly in the running.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hrag_cli.core.intsets import unique_sorted
from hrag_cli.graph.chunk_prior import chunk_prior, prior_key
from hrag_cli.graph.push import PUSH_EPS, Reset, push
from hrag_cli.graph.walk import Scale, WalkGraph
from hrag_cli.storage.vectors.search import top_order

__all__ = ["passage_walk", "seed_walk", "minmax", "SeedWeights", "build_reset"]


def minmax(scores: np.ndarray) -> np.ndarray:
    """Scale to [0, 1]; a constant vector becomes all ones (every item equally good), empty stays empty."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0:
        return scores
    lo, hi = float(scores.min()), float(scores.max())
    if hi - lo <= 1e-12:
        return np.ones_like(scores)
    return (scores - lo) / (hi - lo)


def passage_walk(graph: WalkGraph, reset: np.ndarray | Reset, floor: float, damping: float,
                 scale: Scale = None, vertices: np.ndarray | None = None) -> np.ndarray:
    """The walk's score of every vertex (summing to 1) from `reset` plus `floor` on every chunk: by linearity
    the walk of `reset` alone, which stays local, plus `floor` x the chunk prior. `vertices`: the scores of
    those alone (a query ranks the chunks, a part of the vertices), the same values,
    read without a vertex-length pass beyond the walk's sums."""
    prior, prior_sum = _prior_and_sum(graph, damping, scale) if floor > 0 else (None, 0.0)   # before: it walks
    # a process's second question on: a batch, which makes the walk's table once (`WalkGraph.prepare`); a
    # single query, and the chunk prior's walk, never pay for it
    graph.memo["passage walks"] = walks = graph.memo.get("passage walks", 0) + 1
    if walks > 1:
        graph.prepare(scale)
    walked = push(graph, reset, damping, scale, PUSH_EPS)
    mass, whole = walked.mass(vertices), walked.mass_sum()
    if prior is not None:
        share = floor / walked.total                   # the prior's weight against the reset scaled to 1
        mass += (prior if vertices is None else prior[vertices]) * share
        whole += prior_sum * share
    return mass / whole


def _prior_and_sum(graph: WalkGraph, damping: float, scale: Scale) -> tuple[np.ndarray, float]:
    """The chunk prior and its sum, summed once per process (walked first if not saved: a walk reuses the
    scratch arrays of the last)."""
    prior = chunk_prior(graph, damping, scale)
    key = ("chunk_prior_sum", *prior_key(damping, scale)[1:])
    if key not in graph.memo:
        graph.memo[key] = float(prior.sum())
    return prior, graph.memo[key]


@dataclass
class SeedWeights:
    """The reset vector in parts, so the output can say which entities seeded the walk and why."""

    entity: dict[int, float] = field(default_factory=dict)     # vertex -> weight
    sources: dict[int, list[str]] = field(default_factory=dict)  # vertex -> fact ids / "name" that seeded it


def seed_walk(graph: WalkGraph, seeds: SeedWeights, damping: float, scale: Scale = None,
              vertices: np.ndarray | None = None) -> np.ndarray:
    """The walk from the seed entities alone, no passage weights (summing to 1; `vertices`: the scores of those
    alone): the graph's own evidence, which ppr's fused first ranks set beside the passage scores without
    counting those twice. A local walk (a few seeds); it never makes a batch's table."""
    order = sorted(seeds.entity)
    reset = Reset(np.asarray(order, dtype=np.intp), np.asarray([seeds.entity[v] for v in order], dtype=np.float64))
    walked = push(graph, reset, damping, scale, PUSH_EPS)
    return walked.mass(vertices) / walked.mass_sum()


def build_reset(seeds: SeedWeights, chunk_vertices: np.ndarray, chunk_weights: np.ndarray,
                top: int = 0) -> tuple[Reset, float]:
    """The walk's reset as (local part, floor): the seeds' weights, and each chunk's passage weight
    (HippoRAG 2 gives one to every chunk). With `top` > 0 and more chunks than that, the best `top` chunks
    carry their weight above `floor`, the mean weight of the others, and `floor` stands for every chunk's
    share (`passage_walk` adds it through the chunk prior): the same reset, except that the chunks below the
    best `top` count as their mean. Ties at the cut go to the chunk listed first. A vertex that is both a seed
    and a chunk gets the seed's weight plus the chunk's, in that order (as the vertex-length sum did)."""
    chunk_weights = np.asarray(chunk_weights, dtype=np.float64)
    chunk_vertices = np.asarray(chunk_vertices, dtype=np.intp)
    floor = 0.0
    if 0 < top < len(chunk_weights):
        cut = chunk_weights[top_order(chunk_weights, top)[top - 1]]       # the top-th best weight
        above = np.flatnonzero(chunk_weights > cut)
        keep = np.concatenate([above, np.flatnonzero(chunk_weights == cut)[: top - len(above)]])
        rest = np.ones(len(chunk_weights), dtype=bool)
        rest[keep] = False
        floor = float(chunk_weights[rest].mean())
        chunk_vertices, chunk_weights = chunk_vertices[keep], chunk_weights[keep] - floor
    vertices = np.concatenate([np.fromiter(seeds.entity, dtype=np.intp, count=len(seeds.entity)), chunk_vertices])
    weights = np.concatenate([np.fromiter(seeds.entity.values(), dtype=np.float64, count=len(seeds.entity)),
                              chunk_weights])
    distinct = unique_sorted(vertices)
    summed = np.zeros(len(distinct), dtype=np.float64)
    np.add.at(summed, np.searchsorted(distinct, vertices), weights)    # seeds first, then chunks: 0 + a + b
    nonzero = summed != 0
    return Reset(distinct[nonzero], summed[nonzero]), floor
