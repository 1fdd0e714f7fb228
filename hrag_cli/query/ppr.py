"""HippoRAG 2 retrieval: seed entities from the facts closest to the query, add every chunk with a small dense
weight (the best `query.passage_node_top_k` their own, the rest their mean), and rank chunks by Personalized
PageRank, walked locally from the seeds and the best chunks plus a chunk prior walked once per graph.

Why this shape: the facts pick the entities a multi-hop question is about; PageRank then walks from them through
MENTIONED_IN/RELATION/SYNONYM edges to the chunks that connect them, while the dense passage weights keep a
passage that answers the question directly in the running.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hrag_cli.core import store
from hrag_cli.core.artifacts import quick_sum
from hrag_cli.core.config import Settings
from hrag_cli.graph.model import CHUNK, EDGE_KINDS, VERTEX_KINDS
from hrag_cli.core.intsets import unique_marked, unique_sorted
from hrag_cli.core.project import ProjectDir
from hrag_cli.storage.vectors import top_order
from hrag_cli.graph.walk import Scale, WalkGraph, kind_factors, scale_key

__all__ = ["personalized_pagerank", "walk_mass", "passage_walk", "chunk_prior", "minmax", "SeedWeights", "Reset",
           "build_reset"]


def minmax(scores: np.ndarray) -> np.ndarray:
    """Scale to [0, 1]; a constant vector becomes all ones (every item equally good), empty stays empty."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0:
        return scores
    lo, hi = float(scores.min()), float(scores.max())
    if hi - lo <= 1e-12:
        return np.ones_like(scores)
    return (scores - lo) / (hi - lo)


# A round of the walk spreads the residual of some vertices. Gathering their rows costs about SWEEP_COST times
# as much per entry as one sweep over every entry (the power iteration's step, whose shares are precomputed):
# bench/walk_speed.py measures both. So a round whose vertices hold more than 1 / SWEEP_COST of all entries is
# done as a sweep.
SWEEP_COST = 8
# A vertex's residual is spread once it exceeds PUSH_EPS x its entry count x the reset's total: what is left
# unspread is then at most that much per vertex. On 100 real questions at 100,000 passages (`bench/walk_speed.py
# --questions`), the chunks a query ranks (the walk fused with the passage scores) are those of a walk to 1e-12
# as often at 2e-7 as at 1e-7 (the first 5 on 99 questions, the first 10 on 93), and the first 5 those of 1e-7 on
# all 100, while the walk reads half the entries (549k against 1.1M; at 1e-8 a walk took 2.7x the CPU of 1e-7).
# 3e-7 already lost ranks 6 to 10 on 6 more questions. On the dev sets' graphs (1,890 to 6,119 passages, their
# 100 questions each) the first 5 stay the converged walk's on 99-100 questions and the first 10 on 90-98 (96-100
# at 1e-7), and bench/retrieval.py's recall is the same in every cell, builtin and MiniLM.
PUSH_EPS = 2e-7
# A round that sent mass along fewer than 1 / SPARSE_ROUND as many entries as there are vertices tests only the
# vertices it reached for the next round; a larger one scans every vertex (cheaper than sorting its targets).
SPARSE_ROUND = 32
# A round spreads its vertices in blocks of about this many entries, each block's rows gathered, multiplied and
# added before the next: the block's temporaries (~1 MB) stay in the core's cache, where a round's whole
# (up to 500,000 entries at 100,000 passages) did not: 2-3 ms less a question.
SPREAD_BLOCK = 1 << 15
PRIOR_EPS = 1e-12     # converged: the chunk prior (walked once) and personalized_pagerank's default
PRIOR_FILE = "chunk_prior.npz"


def walk_mass(graph: WalkGraph, reset: np.ndarray | Reset, damping: float, scale: Scale = None, eps: float = PUSH_EPS,
              max_rounds: int = 10_000) -> np.ndarray:
    """(1 - damping) x sum over k of (damping x P)^k reset, P the walk's step (each vertex spreads its mass
    over its edges in proportion to their weights, kinds in `scale` multiplied by their factor; a vertex with
    no usable edge spreads nothing): the mass each vertex holds, linear in `reset`, which
    `personalized_pagerank` normalises.

    How: forward push (Andersen, Chung and Lang's local PageRank) in synchronous rounds. The mass starts at 0
    and a residual at the reset; a round takes every vertex whose residual exceeds `eps` x its entry count x
    the reset's total, keeps 1 - damping of it and spreads the rest over its edges; what is left unspread at
    the end is counted as kept. The work follows where the reset's mass goes, not the graph's size: at
    100,000 passages, with passage weights on a bounded set of chunks (`query.passage_node_top_k`), a walk
    reads about half a million of 7.2M entries, where the power iteration read all of them 24 times. A
    round whose vertices hold over 1 / SWEEP_COST of the entries is one sweep over all of them (spreading
    every residual, however small): on a small graph, or from a reset on every chunk, that is the power
    iteration."""
    walked = _push(graph, reset, damping, scale, eps, max_rounds)
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


def _push(graph: WalkGraph, reset: np.ndarray | Reset, damping: float, scale: Scale, eps: float,
          max_rounds: int = 10_000) -> _Walked:
    """`walk_mass` of the reset scaled to total 1, into the graph's scratch arrays: a batch's walks reuse the
    vertex-length residual and kept arrays (721,648 vertices at 100,000 passages, a full pass each) instead of
    allocating them every question, and share the limits (`WalkGraph.push_limit`). Scaling changes the
    arithmetic by rounding alone (~1e-16 relative). A `Reset` is placed by its vertices alone: no pass over
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
        # tested (a scan of every vertex each round was a sixth of a walk's time), else every vertex. A
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


def walk_scale(rules_graph: bool, synonym_weight: float) -> dict[str, float] | None:
    """The walk's edge weight factors: on a rules-extractor graph SYNONYM edges x `synonym_weight` (None: the
    stored weights). Those edges join names whose builtin vectors are close, i.e. names sharing words, which on
    2Wiki-100 (many people and films share a name's words) likely lead the walk to the wrong namesake: without
    them ppr went from 59.0 to 60.2 at R@2, MuSiQue-100 rules unchanged (bench/retrieval.py)."""
    return {"SYNONYM": synonym_weight} if rules_graph and synonym_weight != 1.0 else None


def is_rules_graph(extractor: str) -> bool:
    """Whether the graph came from the rules extractor (its extract stage's `extractor` count)."""
    return extractor.startswith("rules")


def project_walk_scale(project: ProjectDir, settings: Settings) -> Scale:
    """`walk_scale` for a built project: its extract stage says whether the graph is a rules graph."""
    stage = project.stage("extract")
    extractor = str(stage.counts.get("extractor", "")) if stage is not None else ""
    return walk_scale(is_rules_graph(extractor), settings.query.rules_synonym_weight)


def _factor_row(scale: Scale) -> np.ndarray:
    factors = kind_factors(scale)
    return np.ones(len(EDGE_KINDS)) if factors is None else factors


def _prior_key(damping: float, scale: Scale) -> tuple:
    return ("chunk_prior", float(damping), scale_key(scale))


def chunk_prior(graph: WalkGraph, damping: float, scale: Scale = None) -> np.ndarray:
    """`walk_mass` of a reset of 1 on every chunk: what a passage weight shared by every chunk adds to the
    walk. It depends on the graph and settings alone: the synonyms stage saves it (`save_chunk_prior`), and
    a query whose settings differ walks it once per process (1.1 s CPU at 100,000 passages)."""
    key = _prior_key(damping, scale)
    if key not in graph.memo:
        chunks = (graph.vkind == VERTEX_KINDS.index(CHUNK)).astype(np.float64)
        graph.memo[key] = (walk_mass(graph, chunks, damping, scale, PRIOR_EPS) if chunks.any()
                           else np.zeros(graph.vcount()))
    return graph.memo[key]


def _prior_path(project: ProjectDir) -> Path:
    return project.graph_dir / PRIOR_FILE


def _walk_digest(project: ProjectDir) -> str:
    """Which walk.npz a saved prior was walked on (a sampled hash: reads ~200 KiB)."""
    return quick_sum(project.walk_path, project.walk_path.stat().st_size)


def save_chunk_prior(project: ProjectDir, settings: Settings) -> None:
    """Write graph/chunk_prior.npz (atomically): the chunk prior of graph/walk.npz for the project's query
    settings, with those settings and the walk's digest, so a query reads it instead of walking every chunk."""
    q = settings.query
    scale = project_walk_scale(project, settings)
    prior = chunk_prior(WalkGraph.load(project), q.damping, scale)
    with store.atomic_writer(_prior_path(project)) as fh:
        np.savez(fh, prior=prior, damping=np.float64(q.damping), scale=_factor_row(scale),
                 walk=np.frombuffer(_walk_digest(project).encode(), dtype=np.uint8))


def load_chunk_prior(project: ProjectDir, graph: WalkGraph, damping: float, scale: Scale) -> None:
    """Put the saved chunk prior into `graph.memo` when it was walked on this walk.npz with these settings
    (otherwise `chunk_prior` walks it)."""
    key = _prior_key(damping, scale)
    if key in graph.memo:
        return
    try:
        with np.load(_prior_path(project), allow_pickle=False) as z:
            same = (float(z["damping"]) == float(damping) and np.array_equal(z["scale"], _factor_row(scale))
                    and bytes(z["walk"]).decode() == _walk_digest(project) and z["prior"].shape == (graph.vcount(),))
            if same:
                graph.memo[key] = np.asarray(z["prior"], dtype=np.float64)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return          # missing or unreadable: walked instead


def passage_walk(graph: WalkGraph, reset: np.ndarray | Reset, floor: float, damping: float,
                 scale: Scale = None, vertices: np.ndarray | None = None) -> np.ndarray:
    """The walk's score of every vertex (summing to 1) from `reset` plus `floor` on every chunk: by linearity
    the walk of `reset` alone, which stays local, plus `floor` x the chunk prior. `vertices`: the scores of
    those alone (a query ranks the chunks: a sixth of the vertices at 100,000 passages), the same values,
    read without a vertex-length pass beyond the walk's sums."""
    prior, prior_sum = _prior_and_sum(graph, damping, scale) if floor > 0 else (None, 0.0)   # before: it walks
    # a process's second question on: a batch, which makes the walk's table once (`WalkGraph.prepare`); a
    # single query, and the chunk prior's walk (~600k pushed entries at 100,000 passages), never pay for it
    graph.memo["passage walks"] = walks = graph.memo.get("passage walks", 0) + 1
    if walks > 1:
        graph.prepare(scale)
    walked = _push(graph, reset, damping, scale, PUSH_EPS)
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
    key = ("chunk_prior_sum", *_prior_key(damping, scale)[1:])
    if key not in graph.memo:
        graph.memo[key] = float(prior.sum())
    return prior, graph.memo[key]


@dataclass
class SeedWeights:
    """The reset vector in parts, so the output can say which entities seeded the walk and why."""

    entity: dict[int, float] = field(default_factory=dict)     # vertex -> weight
    sources: dict[int, list[str]] = field(default_factory=dict)  # vertex -> fact ids / "name" that seeded it


@dataclass
class Reset:
    """A walk's reset by its nonzero vertices: a query's has ~1,000 (the seeds and the best chunks) of 721,648
    at 100,000 passages, so it is built, placed and tested without a vertex-length pass."""

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
