"""PPR core: our float32 numpy PageRank over the walk arrays, against igraph's PRPACK and a dense power iteration
(to float32 precision: relative 2e-5)."""

from __future__ import annotations

import igraph
import numpy as np
import pytest

from hrag_cli.query.ppr import SeedWeights, build_reset, minmax, personalized_pagerank
from hrag_cli.graph import walk_arrays
from hrag_cli.walk import WalkGraph


def power_iteration(n: int, edges: list[tuple[int, int, float]], reset: np.ndarray, damping: float,
                    iters: int = 500) -> np.ndarray:
    """Undirected weighted PPR: p = (1-d) r + d (W D^-1 p), dangling mass back to r."""
    w = np.zeros((n, n))
    for a, b, wt in edges:
        w[a, b] += wt
        w[b, a] += wt      # a self-loop counts twice, as igraph counts it
    strength = w.sum(axis=1)
    r = reset / reset.sum()
    p = r.copy()
    for _ in range(iters):
        spread = np.zeros(n)
        live = strength > 0
        spread += w[:, live] @ (p[live] / strength[live])
        dangling = p[~live].sum()
        p = (1 - damping) * r + damping * (spread + dangling * r)
    return p / p.sum()


def _igraph(n: int, edges: list[tuple[int, int, float]]) -> igraph.Graph:
    g = igraph.Graph(n=n, edges=[(a, b) for a, b, _ in edges], directed=False)
    g.es["weight"] = [w for _, _, w in edges]
    g.es["kind"] = ["SYNONYM" if i % 3 == 2 else "RELATION" for i in range(len(edges))]
    g.vs["key"] = [f"v{i}" for i in range(n)]
    g.vs["kind"] = ["entity"] * n
    return g


def _graph(n: int, edges: list[tuple[int, int, float]]) -> WalkGraph:
    return WalkGraph(walk_arrays(_igraph(n, edges)))


def _prpack(n: int, edges: list[tuple[int, int, float]], reset: np.ndarray, damping: float) -> np.ndarray:
    return np.asarray(_igraph(n, edges).personalized_pagerank(directed=False, damping=damping, reset=reset.tolist(),
                                                              weights="weight"))


@pytest.mark.parametrize("damping", [0.5, 0.85])
def test_ppr_matches_power_iteration(damping: float) -> None:
    # a small hand-built graph: two "documents", chunks, entities, a synonym edge and an isolated vertex
    edges = [(0, 1, 1.0), (1, 2, 1.0), (2, 3, 3.0), (3, 4, 0.5), (4, 5, 2.0), (5, 2, 1.0), (6, 7, 0.9),
             (7, 3, 1.0)]
    n = 9  # vertex 8 has no edges
    reset = np.array([0, 0, 0.2, 0, 0.05, 0, 0.6, 0, 0.1])
    got = personalized_pagerank(_graph(n, edges), reset, damping)
    np.testing.assert_allclose(got, power_iteration(n, edges, reset, damping), rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(got, _prpack(n, edges, reset, damping), rtol=2e-5, atol=1e-7)
    assert abs(got.sum() - 1) < 1e-6


def test_self_loops_and_zero_weights_as_prpack_counts_them() -> None:
    # a self-loop counts twice on its vertex; a weight-0 edge is never walked, so vertex 4 (only such edges)
    # sends its mass back to the reset vector like an isolated vertex
    edges = [(0, 1, 1.0), (1, 1, 2.0), (1, 2, 1.0), (2, 3, 0.5), (3, 3, 1.0), (3, 4, 0.0), (4, 4, 0.0)]
    reset = np.array([0.1, 0.0, 0.5, 0.3, 0.1])
    got = personalized_pagerank(_graph(5, edges), reset, 0.5)
    np.testing.assert_allclose(got, _prpack(5, edges, reset, 0.5), rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(got, power_iteration(5, edges, reset, 0.5), rtol=2e-5, atol=1e-7)


def test_random_graphs_match_prpack() -> None:
    rng = np.random.default_rng(7)
    for n, m in ((30, 60), (200, 900), (500, 400)):      # the last one has many isolated vertices
        edges = [(int(a), int(b), float(w)) for a, b, w in
                 zip(rng.integers(0, n, m), rng.integers(0, n, m), rng.choice([0.0, 0.3, 1.0, 2.5], m))]
        reset = np.where(rng.random(n) < 0.2, rng.random(n), 0.0)
        reset[0] += 0.5
        walk = _graph(n, edges)
        np.testing.assert_allclose(personalized_pagerank(walk, reset, 0.5), _prpack(n, edges, reset, 0.5),
                                   rtol=2e-5, atol=1e-7)
        scaled = walk.weights({"SYNONYM": 0.0})          # the rules-graph walk: SYNONYM edges not taken
        kept = [(a, b, 0.0 if i % 3 == 2 else w) for i, (a, b, w) in enumerate(edges)]
        np.testing.assert_allclose(personalized_pagerank(walk, reset, 0.85, scaled), _prpack(n, kept, reset, 0.85),
                                   rtol=2e-5, atol=1e-7)


def test_parallel_edges_add_their_weights() -> None:
    edges = [(0, 1, 1.0), (0, 1, 2.0), (1, 2, 1.0), (0, 2, 0.5)]
    reset = np.array([1.0, 0.0, 0.0])
    np.testing.assert_allclose(personalized_pagerank(_graph(3, edges), reset, 0.5),
                               power_iteration(3, edges, reset, 0.5), atol=1e-6)


def test_reset_must_fit_and_be_positive() -> None:
    g = _graph(3, [(0, 1, 1.0)])
    with pytest.raises(ValueError):
        personalized_pagerank(g, np.zeros(3), 0.5)
    with pytest.raises(ValueError):
        personalized_pagerank(g, np.ones(2), 0.5)
    with pytest.raises(ValueError):
        personalized_pagerank(g, np.ones(3), 0.5, np.array([-1.0, -1.0]))


def test_build_reset_and_minmax() -> None:
    seeds = SeedWeights(entity={0: 0.5, 3: 0.25})
    reset = build_reset(5, seeds, np.array([1, 2, 3]), np.array([0.1, 0.2, 0.3]))
    np.testing.assert_allclose(reset, [0.5, 0.1, 0.2, 0.55, 0.0])
    np.testing.assert_allclose(minmax(np.array([2.0, 4.0, 3.0])), [0.0, 1.0, 0.5])
    np.testing.assert_allclose(minmax(np.array([3.0, 3.0])), [1.0, 1.0])
    assert minmax(np.array([])).size == 0
