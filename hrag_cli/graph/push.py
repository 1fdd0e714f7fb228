"""The walk: Personalized PageRank mass by forward push (`walk_mass`), from a reset given by its vertices
(`Reset`) or as a vertex-length vector."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hrag_cli.core.intsets import unique_marked
from hrag_cli.graph.walk import Scale, WalkGraph


# A round of the walk spreads the residual of some vertices. Gathering their rows costs about SWEEP_COST times
# as much per entry as one sweep over every entry (the power iteration's step, whose shares are precomputed;
# bench/walk_speed.py times both). So a round whose vertices hold more than 1 / SWEEP_COST of all entries is
# done as a sweep.
SWEEP_COST = 8
# A vertex's residual is spread once it exceeds PUSH_EPS x its entry count x the reset's total: what is left
# unspread is then at most that much per vertex. The loosest tolerance at which the chunks a query ranks (the
# walk fused with the passage scores) stay those of a converged walk on real questions, with recall unchanged;
# a tighter one reads many more entries for the same ranks (`bench/walk_speed.py --questions` compares them).
PUSH_EPS = 2e-7
# A round that sent mass along fewer than 1 / SPARSE_ROUND as many entries as there are vertices tests only the
# vertices it reached for the next round; a larger one scans every vertex (cheaper than sorting its targets).
SPARSE_ROUND = 32
# A round spreads its vertices in blocks of about this many entries, each block's rows gathered, multiplied and
# added before the next: the block's temporaries stay in the core's cache, where a whole round's would not.
SPREAD_BLOCK = 1 << 15
PRIOR_EPS = 1e-12     # converged: the chunk prior (walked once) and personalized_pagerank's default


def walk_mass(graph: WalkGraph, reset: np.ndarray | Reset, damping: float, scale: Scale = None, eps: float = PUSH_EPS,
              max_rounds: int = 10_000) -> np.ndarray:
    """(1 - damping) x sum over k of (damping x P)^k reset, P the walk's step (each vertex spreads its mass
    over its edges in proportion to their weights, kinds in `scale` multiplied by their factor; a vertex with
    no usable edge spreads nothing): the mass each vertex holds, linear in `reset`, which
    `personalized_pagerank` normalises.

    How: forward push (Andersen, Chung and Lang's local PageRank) in synchronous rounds. The mass starts at 0
    and a residual at the reset; a round takes every vertex whose residual exceeds `eps` x its entry count x
    the reset's total, keeps 1 - damping of it and spreads the rest over its edges; what is left unspread at
    the end is counted as kept. The work follows where the reset's mass goes, not the graph's size: with
    passage weights on a bounded set of chunks (`query.passage_node_top_k`), a walk reads a small part of the
    entries, where the power iteration reads all of them in every iteration. A
    round whose vertices hold over 1 / SWEEP_COST of the entries is one sweep over all of them (spreading
    every residual, however small): on a small graph, or from a reset on every chunk, that is the power
    iteration."""
    walked = push(graph, reset, damping, scale, eps, max_rounds)
    return walked.mass() * walked.total


@dataclass
class _Walked:
    """A walk of the reset scaled to total 1 (the walk is linear), in the graph's scratch arrays (valid until
    the next walk): each vertex's mass is its kept mass plus 1 - damping of its residual. Reading the mass of
    some vertices, or the sum of all, costs no vertex-length pass beyond the sums."""

    kept: np.ndarray
    residual: np.ndarray
    keep: float          # 1 - damping
    total: float         # the reset's total

    def mass(self, vertices: np.ndarray | None = None) -> np.ndarray:
        if vertices is None:
            return self.kept + self.residual * self.keep
        return self.kept[vertices] + self.residual[vertices] * self.keep

    def mass_sum(self) -> float:
        return float(self.kept.sum()) + float(self.residual.sum()) * self.keep


def push(graph: WalkGraph, reset: np.ndarray | Reset, damping: float, scale: Scale, eps: float,
          max_rounds: int = 10_000) -> _Walked:
    """`walk_mass` of the reset scaled to total 1, into the graph's scratch arrays: a batch's walks reuse the
    vertex-length residual and kept arrays (a full pass each) instead of allocating them every question, and
    share the limits (`WalkGraph.push_limit`). Scaling changes the arithmetic by rounding alone (a relative
    1e-16 or so). A `Reset` is placed by its vertices alone: no pass over
    a vertex-length reset, and the first round's vertices are the reset's over the limit, not a scan's."""
    n = graph.vcount()
    vertices, weights, total = _reset_parts(reset, n)
    if total <= 0:
        raise ValueError("reset vector is all zeros")
    degree = graph.degrees()
    entries = len(graph.weight)
    residual = graph.scratch("residual", n, np.float64)
    residual.fill(0.0)
    start = np.divide(weights, total)
    residual[vertices] = start
    kept = graph.scratch("kept", n, np.float64)
    kept.fill(0.0)
    limit = graph.push_limit(eps)                      # spread a residual over it
    over = graph.scratch("over", n, np.bool_)
    touched = vertices[start > limit[vertices]]        # the next round's vertices (ascending); None: test all
    for _ in range(max_rounds):
        active = np.flatnonzero(np.greater(residual, limit, out=over)) if touched is None else touched
        if not len(active):
            break
        lens = degree[active]
        ends = np.cumsum(lens)
        if int(ends[-1]) * SWEEP_COST > entries:
            # the float32 step at the reset's own scale, as before the reset was scaled: x / total rounds to
            # float32 otherwise than x (~6e-8 relative), which would move the saved chunk prior
            step = graph.transition(scale)
            stepped = step((residual * total).astype(np.float32)).astype(np.float64)
            kept += np.multiply(residual, 1.0 - damping, out=graph.scratch("spent", n, np.float64))
            np.multiply(stepped, damping / total, out=residual)
            touched = None
            continue
        amount = residual[active]
        residual[active] = 0.0
        kept[active] += (1.0 - damping) * amount
        amount *= damping
        # the next round's vertices are among those that receive mass now: when those are few, only they are
        # tested (a scan of every vertex each round would be a large part of a walk), else every vertex. A
        # residual only grows within a round, so a target tested right after its block holds its final verdict
        # unless a later block reaches it again (and tests it again).
        sparse = int(ends[-1]) * SPARSE_ROUND < n
        over_t = []
        for a, b in _blocks(ends):
            sources, share = active[a:b], amount[a:b]
            if not lens[a:b].all():                    # a vertex without edges (a reset on it) spreads nothing
                rows = lens[a:b] > 0
                sources, share = sources[rows], share[rows]
            targets, mass = graph.spread(sources, share, scale)
            np.add.at(residual, targets, mass)
            if sparse:
                over_t.append(targets[residual[targets] > limit[targets]])
        touched = unique_marked(np.concatenate(over_t), over) if sparse else None  # ascending, as a scan finds them
    return _Walked(kept, residual, 1.0 - damping, total)


def _reset_parts(reset: np.ndarray | Reset, n: int) -> tuple[np.ndarray, np.ndarray, float]:
    """A reset as its nonzero vertices (ascending), their weights and its total. A vertex-length reset's total
    is its own sum, so a walk of it gives the bits it gave before `Reset` existed."""
    if isinstance(reset, Reset):
        if len(reset.vertices) and (int(reset.vertices[0]) < 0 or int(reset.vertices[-1]) >= n):
            raise ValueError(f"reset has vertices outside the graph's {n}")
        return reset.vertices, reset.weights, float(reset.weights.sum())
    reset = np.asarray(reset, dtype=np.float64)
    if reset.shape != (n,):
        raise ValueError(f"reset has {reset.shape} entries, graph has {n} vertices")
    vertices = np.flatnonzero(reset)
    return vertices, reset[vertices], float(reset.sum())


def _blocks(ends: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive slices of a round's vertices holding about SPREAD_BLOCK entries each (`ends`: the running
    entry count), cut between vertices (a vertex's row is never split)."""
    if int(ends[-1]) <= SPREAD_BLOCK:
        return [(0, len(ends))]
    cuts = (np.searchsorted(ends, np.arange(SPREAD_BLOCK, int(ends[-1]), SPREAD_BLOCK)) + 1).tolist()
    bounds = [0, *sorted({c for c in cuts if c < len(ends)}), len(ends)]    # a vertex over a block: one cut
    return list(zip(bounds[:-1], bounds[1:]))


def personalized_pagerank(graph: WalkGraph, reset: np.ndarray, damping: float, scale: Scale = None,
                          eps: float = PRIOR_EPS) -> np.ndarray:
    """Personalized PageRank of the undirected weighted graph as igraph's PRPACK computes it (tests compare
    the two): from each vertex the walk follows an edge with probability proportional to its weight (kinds
    in `scale` multiplied by their factor; an edge of weight 0 is never taken), jumps back to the normalised
    `reset` with probability 1 - damping, and a vertex with no usable edge sends all its mass back to
    `reset`. That last rule only scales `walk_mass` (which drops such mass), since PageRank is linear in
    the reset: so this is `walk_mass` normalised, converged by default (a query's walk, `passage_walk`, stops
    at PUSH_EPS). numpy alone, so a query never imports igraph."""
    mass = walk_mass(graph, reset, damping, scale, eps)
    return mass / mass.sum()


@dataclass
class Reset:
    """A walk's reset by its nonzero vertices: a query's holds the seeds and the best chunks, a small part of
    the vertices, so it is built, placed and tested without a vertex-length pass."""

    vertices: np.ndarray        # distinct, ascending
    weights: np.ndarray         # float64, one a vertex

    def __post_init__(self) -> None:
        # a walk places the weights by these vertices and takes them as its first round's: unsorted or
        # repeated vertices would put the mass on the wrong vertices without a sign
        ascending = len(self.vertices) < 2 or bool((np.diff(self.vertices) > 0).all())
        if len(self.vertices) != len(self.weights) or not ascending:
            raise ValueError("a Reset's vertices must be distinct and ascending, one weight each")

    def dense(self, n_vertices: int) -> np.ndarray:
        """The vertex-length reset vector."""
        reset = np.zeros(n_vertices, dtype=np.float64)
        reset[self.vertices] = self.weights
        return reset
