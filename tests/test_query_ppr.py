"""PPR core: our float32 numpy PageRank over the walk arrays, against igraph's PRPACK and a dense power iteration
(to float32 precision: relative 2e-5)."""

from __future__ import annotations

import igraph
import numpy as np
import pytest

from hrag_cli.graph.chunk_prior import chunk_prior, load_chunk_prior
from hrag_cli.graph.push import Reset, personalized_pagerank, walk_mass
from hrag_cli.query.ppr import SeedWeights, build_reset, minmax, passage_walk
from hrag_cli.graph.model import CHUNK, VERTEX_KINDS, walk_arrays
from hrag_cli.graph.walk import WalkGraph, _runs, scale_key


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
        scaled = {"SYNONYM": 0.0}                        # the rules-graph walk: SYNONYM edges not taken
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
        personalized_pagerank(g, np.ones(3), 0.5, {"RELATION": -1.0})


def test_build_reset_and_minmax() -> None:
    seeds = SeedWeights(entity={0: 0.5, 3: 0.25})
    reset, floor = build_reset(seeds, np.array([1, 2, 3]), np.array([0.1, 0.2, 0.3]))
    np.testing.assert_allclose(reset.dense(5), [0.5, 0.1, 0.2, 0.55, 0.0])
    assert list(reset.vertices) == [0, 1, 2, 3] and reset.weights[3] == 0.25 + 0.3   # the seed's, then the chunk's
    assert floor == 0.0
    np.testing.assert_allclose(minmax(np.array([2.0, 4.0, 3.0])), [0.0, 1.0, 0.5])
    np.testing.assert_allclose(minmax(np.array([3.0, 3.0])), [1.0, 1.0])
    assert minmax(np.array([])).size == 0


def _ring(n: int = 4000, seed: int = 3) -> tuple[list[tuple[int, int, float]], WalkGraph]:
    """A ring lattice (each vertex joined to the next two): far vertices are far apart, as in a big corpus."""
    rng = np.random.default_rng(seed)
    edges = [(i, (i + k) % n, float(rng.choice([0.5, 1.0, 2.0]))) for i in range(n) for k in (1, 2)]
    return edges, _graph(n, edges)


def test_local_walk_reads_only_the_reset_neighbourhood_and_matches_prpack() -> None:
    # a reset on three vertices of a 4,000-vertex graph: every round gathers its active rows (no sweep over
    # all entries is ever set up), and the result is PRPACK's to the push tolerance
    edges, walk = _ring()
    reset = np.zeros(walk.vcount())
    reset[[5, 17, 2999]] = [0.5, 0.3, 0.2]
    got = personalized_pagerank(walk, reset, 0.5, eps=1e-12)
    assert walk._steps == {}
    np.testing.assert_allclose(got, _prpack(walk.vcount(), edges, reset, 0.5), rtol=1e-5, atol=1e-9)
    # a coarser tolerance reads less of the graph and keeps the ranking's head
    coarse = walk_mass(walk, reset, 0.5, eps=1e-4)
    assert np.count_nonzero(coarse) < np.count_nonzero(got)
    assert list(np.argsort(-coarse)[:5]) == list(np.argsort(-got)[:5])


def test_a_batch_walk_prepares_its_arrays_and_walks_the_same_bits() -> None:
    """Prepared (`WalkGraph.prepare`), the scaled weights and native neighbours are made whole; the walk's mass
    is the same to the last bit, with scaled SYNONYM edges too, and a walk alone never prepares them."""
    (_, cold), (_, batch) = _ring(), _ring()
    reset = np.zeros(cold.vcount())
    reset[[5, 17, 2999]] = [0.5, 0.3, 0.2]
    scale = {"SYNONYM": 0.25}
    batch.prepare(scale)                             # as a batch's second walk does
    first, again = walk_mass(cold, reset, 0.5, scale, eps=1e-7), walk_mass(batch, reset, 0.5, scale, eps=1e-7)
    assert not any(k[0] == "weights" for k in cold.memo) and ("weights", scale_key(scale)) in batch.memo
    assert np.array_equal(first, again)


def test_a_batch_prepares_the_table_at_its_second_question() -> None:
    # a single query's walk reads rows as they are (the table costs a cold query ~0.3 s at 100,000 passages);
    # a second passage walk in the process (a batch) has it made, with the same scores; the chunk prior's
    # walk is no question and never asks for it
    _, walk = _ring()
    walk.vkind[:] = VERTEX_KINDS.index(CHUNK)                    # every vertex a chunk: the prior walks them all
    reset, floor = Reset(np.array([5, 17]), np.array([0.5, 0.3])), 0.01

    def tables() -> set:
        return {k for k in walk.memo if k[0] == "weights"}

    chunk_prior(walk, 0.5)
    first = passage_walk(walk, reset, floor, 0.5)
    assert tables() == set()
    second = passage_walk(walk, reset, floor, 0.5)
    assert tables() == {("weights", scale_key(None))} and np.array_equal(first, second)


def test_bounded_reset_is_its_head_plus_the_mean_of_the_rest() -> None:
    seeds = SeedWeights(entity={0: 0.5})
    reset, floor = build_reset(seeds, np.array([1, 2, 3, 4, 5]), np.array([0.1, 0.4, 0.2, 0.4, 0.3]), top=2)
    assert floor == pytest.approx(0.2)                        # mean of 0.1, 0.2, 0.3: the chunks below the best 2
    np.testing.assert_allclose(reset.dense(6), [0.5, 0.0, 0.2, 0.0, 0.2, 0.0])
    # ties at the cut go to the chunk listed first; top >= the chunks keeps every weight as it is
    reset, floor = build_reset(SeedWeights(), np.array([1, 2, 3]), np.array([0.3, 0.3, 0.1]), top=1)
    assert floor == pytest.approx(0.2) and list(reset.vertices) == [1] and reset.weights[0] == pytest.approx(0.1)
    reset, floor = build_reset(SeedWeights(), np.array([1, 2, 3]), np.array([0.3, 0.3, 0.1]), top=3)
    assert floor == 0.0 and list(reset.dense(4)) == [0.0, 0.3, 0.3, 0.1]


def test_passage_walk_is_the_walk_of_the_whole_reset() -> None:
    # by linearity: the local walk of the head plus floor x the chunk prior = PageRank of head + floor on
    # every chunk, the reset HippoRAG 2's form would walk with the tail at its mean
    g = _igraph(300, [])
    rng = np.random.default_rng(5)
    g.add_edges([(int(a), int(b)) for a, b in zip(rng.integers(0, 300, 900), rng.integers(0, 300, 900))])
    g.es["weight"] = list(rng.choice([0.5, 1.0, 3.0], g.ecount()))
    g.es["kind"] = ["MENTIONED_IN"] * g.ecount()
    g.vs["kind"] = ["chunk" if v < 120 else "entity" for v in range(300)]
    walk = WalkGraph(walk_arrays(g))
    chunks = np.arange(120)
    reset, floor = build_reset(SeedWeights(entity={200: 0.4, 250: 0.1}), chunks, rng.random(120) * 0.05, top=10)
    assert floor > 0
    whole = reset.dense(300)
    whole[chunks] += floor
    full = passage_walk(walk, reset, floor, 0.5)
    # the push leaves up to PUSH_EPS x its entry count unspread on a vertex: 1.65e-4 of the smallest score here
    # at PUSH_EPS 2e-7 (8.5e-5 at 1e-7)
    np.testing.assert_allclose(full, np.asarray(g.personalized_pagerank(
        directed=False, damping=0.5, reset=whole.tolist(), weights="weight")), rtol=2e-4, atol=1e-8)
    # the chunks' scores alone (what a query ranks) are the very values, and a second walk in the same
    # scratch arrays gives them again
    assert np.array_equal(passage_walk(walk, reset, floor, 0.5, vertices=chunks), full[chunks])
    assert np.array_equal(passage_walk(walk, reset, floor, 0.5), full)


def test_saved_chunk_prior_is_read_only_for_its_walk_and_settings(sample_project, tmp_path) -> None:
    import shutil

    from hrag_cli.core.project import ProjectDir

    shutil.copytree(sample_project, tmp_path / "p")
    project = ProjectDir(tmp_path / "p")
    walk = WalkGraph.load(project)
    scale = {"SYNONYM": project.settings().query.rules_synonym_weight}    # the rules graph's walk
    load_chunk_prior(project, walk, 0.5, scale)                          # the synonyms stage saved it
    saved = dict(walk.memo)
    assert len(saved) == 1
    fresh = WalkGraph.load(project)
    np.testing.assert_allclose(next(iter(saved.values())), chunk_prior(fresh, 0.5, scale), rtol=1e-6)
    for damping, sc in ((0.7, scale), (0.5, None)):                     # other settings: walked, not read
        other = WalkGraph.load(project)
        load_chunk_prior(project, other, damping, sc)
        assert other.memo == {}
    with open(project.walk_path, "r+b") as fh:                          # another walk.npz: not read either
        fh.seek(40)
        fh.write(b"\x00" * 8)
    other = WalkGraph.load(project)
    load_chunk_prior(project, other, 0.5, scale)
    assert other.memo == {}


def test_runs_spell_out_each_rows_entries_in_order() -> None:
    """The entries a spread gathers: each run starts[i] .. starts[i] + lens[i] - 1, in the order given (empty
    runs add nothing)."""
    starts, lens = np.array([7, 2, 40, 3, 9]), np.array([3, 0, 1, 4, 2])
    ends = np.cumsum(lens)
    want = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lens)])
    assert np.array_equal(_runs(starts, lens, ends - lens, int(ends[-1])), want)
    assert len(_runs(starts[:0], lens[:0], lens[:0], 0)) == 0
    # steps taken from a kept array of ones (a batch's spreads): the same entries, the ones left as they were
    ones, out = np.ones(20, dtype=np.intp), np.empty(int(ends[-1]), dtype=np.intp)
    assert np.array_equal(_runs(starts, lens, ends - lens, int(ends[-1]), out, ones), want) and (ones == 1).all()


def _reference_push(n: int, edges: list[tuple[int, int, float]], reset: np.ndarray, damping: float,
                    eps: float) -> np.ndarray:
    """The walk's rounds spelled out one vertex and one edge at a time: every vertex whose residual exceeds eps x
    its entry count x the reset's total keeps 1 - damping of it and sends the rest along its edges in proportion
    to their weights; what stays unspread is kept at the end."""
    rows: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for a, b, w in edges:
        rows[a].append((b, w))
        rows[b].append((a, w))                           # a self-loop: two entries on its row
    residual, kept = reset.astype(float).copy(), np.zeros(n)
    limit = [eps * max(len(r), 1) * reset.sum() for r in rows]
    while True:
        active = [v for v in range(n) if residual[v] > limit[v]]
        if not active:
            return kept + (1 - damping) * residual
        amounts = {v: residual[v] for v in active}
        for v in active:
            residual[v] = 0.0
        for v in active:
            kept[v] += (1 - damping) * amounts[v]
            strength = sum(w for _, w in rows[v])
            for u, w in rows[v] if strength > 0 else []:
                residual[u] += damping * amounts[v] * w / strength


def test_walk_in_blocks_is_the_walk_spelled_out(monkeypatch) -> None:
    """The rounds' vertices spread in blocks of a few entries (a block's targets tested right after it), from
    rows as stored and from prepared ones: the very bits of one block a round, and the reference's values."""
    from hrag_cli.graph import push

    rng = np.random.default_rng(11)
    n, m = 3000, 4000                                    # sparse: no round is a sweep over every entry
    edges = [(int(a), int(b), float(w)) for a, b, w in
             zip(rng.integers(0, n - 1, m), rng.integers(0, n - 1, m), rng.choice([0.0, 0.5, 1.0, 3.0], m))]
    reset = np.zeros(n)
    reset[[3, 1700, 2200, n - 1]] = [0.7, 0.2, 0.05, 0.2]   # the last vertex has no edge: it spreads nothing
    eps = 1e-6
    whole = walk_mass(_graph(n, edges), reset, 0.5, eps=eps)
    for prepared in (False, True):
        for block in (1, 7, 64):
            monkeypatch.setattr(push, "SPREAD_BLOCK", block)
            walk = _graph(n, edges)
            if prepared:
                walk.prepare()
            assert np.array_equal(walk_mass(walk, reset, 0.5, eps=eps), whole)
            assert walk._steps == {}
    np.testing.assert_allclose(whole, _reference_push(n, edges, reset, 0.5, eps), rtol=1e-12, atol=1e-15)


def test_sorted_distinct_values_are_numpys() -> None:
    from hrag_cli.core.intsets import unique_counts, unique_marked, unique_sorted

    rng = np.random.default_rng(2)
    for values in (rng.integers(0, 50, 300), rng.integers(-5, 10 ** 12, 1000), np.zeros(0, dtype=np.int64)):
        uniq, counts = np.unique(values, return_counts=True)
        assert np.array_equal(unique_sorted(values), uniq)
        got, got_counts = unique_counts(values)
        assert np.array_equal(got, uniq) and np.array_equal(got_counts, counts) and got_counts.dtype == np.int64
    # by sorting (few values against the mark's length) and by marking (many): the mark's old contents ignored
    for size in (10, 500, 5000):
        values = rng.integers(0, 6400, size)
        mark = rng.random(6400) < 0.5
        assert np.array_equal(unique_marked(values, mark), np.unique(values))


def test_a_reset_by_its_vertices_walks_as_its_vector() -> None:
    # a query's reset names its ~1,000 vertices alone: placed and tested without a vertex-length pass, it walks
    # as the vertex-length vector does (the total summed over the weights alone: rounding apart, the same)
    _, walk = _ring()
    reset = Reset(np.array([5, 17, 2999, 3500]), np.array([0.5, 0.3, 0.2, 1e-9]))
    dense = reset.dense(walk.vcount())
    for eps in (1e-7, 1e-12):
        np.testing.assert_allclose(walk_mass(walk, reset, 0.5, eps=eps), walk_mass(walk, dense, 0.5, eps=eps),
                                   rtol=1e-14, atol=0)
    assert np.array_equal(passage_walk(walk, reset, 0.0, 0.5), passage_walk(walk, dense, 0.0, 0.5))
    with pytest.raises(ValueError):
        walk_mass(walk, Reset(np.array([walk.vcount()]), np.array([1.0])), 0.5)
    with pytest.raises(ValueError):
        walk_mass(walk, Reset(np.array([3]), np.array([0.0])), 0.5)
    with pytest.raises(ValueError):
        Reset(np.array([17, 5]), np.array([0.5, 0.3]))          # unsorted: the mass would land elsewhere
    with pytest.raises(ValueError):
        Reset(np.array([5, 5]), np.array([0.5, 0.3]))           # repeated


def test_a_sweep_steps_the_reset_at_its_own_scale() -> None:
    # a round over most entries is one float32 sweep; the walk scales the reset to total 1, so the sweep must
    # scale back first, or x / total rounds to float32 otherwise than x (~1e-7 relative: the saved chunk prior
    # would move). One round from a reset of total 3.7 against that round spelled out at the reset's scale.
    rng = np.random.default_rng(5)
    edges = [(int(a), int(b), float(w)) for a, b, w in zip(rng.integers(0, 60, 400), rng.integers(0, 60, 400),
                                                              rng.random(400) + 0.1)]
    walk = _graph(60, edges)
    reset = rng.random(60)
    reset *= 3.7 / reset.sum()
    step = walk.transition(None)
    residual = 0.5 * step(reset.astype(np.float32)).astype(np.float64)
    expected = 0.5 * reset + 0.5 * residual
    np.testing.assert_allclose(walk_mass(walk, reset, 0.5, max_rounds=1), expected, rtol=1e-13, atol=0)
