"""HippoRAG 2 retrieval: seed entities from the facts closest to the query, add every chunk with a small dense
weight, and rank chunks by Personalized PageRank over the whole graph.

Why this shape: the facts pick the entities a multi-hop question is about; PageRank then walks from them through
MENTIONED_IN/RELATION/SYNONYM edges to the chunks that connect them, while the dense passage weights keep a
passage that answers the question directly in the running.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["personalized_pagerank", "minmax", "SeedWeights", "build_reset"]


def minmax(scores: np.ndarray) -> np.ndarray:
    """Scale to [0, 1]; a constant vector becomes all ones (every item equally good), empty stays empty."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0:
        return scores
    lo, hi = float(scores.min()), float(scores.max())
    if hi - lo <= 1e-12:
        return np.ones_like(scores)
    return (scores - lo) / (hi - lo)


def personalized_pagerank(graph, reset: np.ndarray, damping: float, weights: list[float] | None = None) -> np.ndarray:
    """igraph PPR, undirected, edge weights (`weights`, one per edge, in place of the stored ones); the reset
    vector need not be normalised. Mass at vertices with no edges goes back to the reset distribution (igraph's
    PRPACK behaviour, which the numpy reference in the tests reproduces)."""
    reset = np.asarray(reset, dtype=np.float64)
    if reset.shape != (graph.vcount(),):
        raise ValueError(f"reset has {reset.shape} entries, graph has {graph.vcount()} vertices")
    if reset.sum() <= 0:
        raise ValueError("reset vector is all zeros")
    if weights is None:
        weights = "weight" if "weight" in graph.es.attributes() and graph.ecount() else None
    pr = graph.personalized_pagerank(directed=False, damping=damping, reset=reset.tolist(), weights=weights)
    return np.asarray(pr, dtype=np.float64)


@dataclass
class SeedWeights:
    """The reset vector in parts, so the output can say which entities seeded the walk and why."""

    entity: dict[int, float] = field(default_factory=dict)     # vertex -> weight
    sources: dict[int, list[str]] = field(default_factory=dict)  # vertex -> fact ids / "name" that seeded it


def build_reset(n_vertices: int, seeds: SeedWeights, chunk_vertices: np.ndarray, chunk_weights: np.ndarray) -> np.ndarray:
    reset = np.zeros(n_vertices, dtype=np.float64)
    for v, w in seeds.entity.items():
        reset[v] += w
    if len(chunk_vertices):
        np.add.at(reset, chunk_vertices, chunk_weights)
    return reset
