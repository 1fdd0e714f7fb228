"""The graph a partitioned resolve makes in arrays (resolve/graph_build.py, graph/csr.py) is the graph
`graph_columns` makes from every record, byte for byte: graph.pkl and walk.npz's arrays, whatever the partitions,
with display names shared by several entities, an entity key equal to a chunk key, keys that are not ASCII, and
keys whose hashes clash; walk.npz's rows made in blocks are those of one sort over every entry."""

from __future__ import annotations

import random

import numpy as np
import pytest

from hrag_cli.graph import csr
from hrag_cli.graph import pickle_format as graph_pickle
from hrag_cli.graph.model import EDGE_KINDS, GraphEntity, GraphRelation, _structure, graph_columns, walk_arrays
from hrag_cli.core.records import ChunkRef, Document
from hrag_cli.resolve import graph_build
from hrag_cli.resolve.graph_build import GraphBuild


def _corpus(seed: int):
    rnd = random.Random(seed)
    docs = [Document(f"d{i}", f"f{i}.txt", "h", 1) for i in range(4)]
    chunks = [ChunkRef(f"c{i:02d}", f"d{i % 4}", i // 4) for i in range(14)]
    ids = sorted({"c03", "zürich", "émile", "a", "ab", "b b", *(f"e{i:03d}" for i in range(40))})
    names = ["Paris", "Paris", "Zürich", "Émile", "A", "AB", "B b"]      # a name shared by two entities
    ents = [GraphEntity(eid, names[i % len(names)] if i % 3 else eid.title(), rnd.choice(["person", "UNKNOWN"]),
                        sorted(rnd.sample(["x", "Y", "ü"], rnd.randrange(3))))
            for i, eid in enumerate(ids)]
    pairs = sorted({tuple(sorted(rnd.sample(ids, 2))) for _ in range(60)})
    rels = [GraphRelation(f"r{i}", a, b, rnd.choice([1.0, 0.5, 2.25]), rnd.choice(["", "WORKS_AT"]))
            for i, (a, b) in enumerate(pairs)]
    mentions = sorted({(c.chunk_id, rnd.choice(ids), rnd.randrange(1, 4)) for c in chunks for _ in range(3)},
                      key=lambda m: m[0])
    return docs, chunks, ents, rels, mentions


def _built(docs, chunks, ents, rels, mentions, cuts: list[int]):
    """GraphBuild fed as a partitioned resolve feeds it, the entities and relations in runs cut at `cuts`."""
    g = GraphBuild(_structure(docs, chunks))
    bounds = [0, *cuts, len(ents)]
    for lo, hi in zip(bounds, bounds[1:]):
        part = ents[lo:hi]
        g.add_entities([e.id for e in part], [e.name for e in part], [e.type for e in part], [e.aliases for e in part])
    for lo in range(0, len(rels), 7):
        part = rels[lo:lo + 7]
        g.add_relation_ends(g.vertices([r.src for r in part]), g.vertices([r.tgt for r in part]))
        for r in part:
            g.add_relation(r.id, float(r.weight), r.rel_type or None)
    for lo in range(0, len(mentions), 5):
        g.add_mentions(mentions[lo:lo + 5])
    return g.finish()


@pytest.mark.parametrize("clash", [False, True])
@pytest.mark.parametrize("seed", [0, 1, "distinct names"])
def test_graph_built_in_arrays_is_the_graph_of_every_record(monkeypatch: pytest.MonkeyPatch, clash: bool,
                                                            seed: int | str) -> None:
    if clash:       # few hash values: most keys and names clash with another
        monkeypatch.setattr(graph_build, "_hash", lambda s: len(s) % 3)
    items = _corpus(seed if isinstance(seed, int) else 2)
    if seed == "distinct names":
        items[2][:] = [GraphEntity(e.id, e.id.upper(), e.type, e.aliases) for e in items[2]]
    want = graph_columns(*items)
    for cuts in ([], [5], [1, 2, 17, 30]):
        got, keys = _built(*items, cuts)
        assert graph_pickle.dumps(got) == graph_pickle.dumps(want)
        a, b = walk_arrays(got, keys), walk_arrays(want)
        assert a.keys() == b.keys()
        for name in a:
            assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name
        assert got.to_igraph().vs["aliases"] == want.to_igraph().vs["aliases"]


def test_names_of_entities_and_unknown_keys() -> None:
    docs, chunks, ents, rels, mentions = _corpus(0)
    g = GraphBuild(_structure(docs, chunks))
    g.add_entities([e.id for e in ents], [e.name for e in ents], [e.type for e in ents], [e.aliases for e in ents])
    v = g.vertices([ents[3].id, ents[0].id])
    assert list(g.entity_names(v)) == [ents[3].name, ents[0].name]
    assert g.vertices(["c03"]).tolist() == [len(docs) + len(chunks) + [e.id for e in ents].index("c03")]
    with pytest.raises(KeyError):
        g.vertices(["no such key"])


def _one_sort(n: int, el: np.ndarray, weight: np.ndarray, kind: np.ndarray):
    m = len(el)
    ends = np.concatenate([el[:, 0], el[:, 1]])
    order = np.argsort(ends, kind="stable")
    other = np.concatenate([el[:, 1], el[:, 0]])[order].astype(np.int32)
    order[order >= m] -= m
    return np.concatenate([[0], np.cumsum(np.bincount(ends, minlength=n))]), other, weight[order], kind[order]


@pytest.mark.parametrize("n,m", [(0, 0), (3, 0), (7, 40), (300, 2000)])
def test_rows_made_in_blocks_are_those_of_one_sort(monkeypatch: pytest.MonkeyPatch, n: int, m: int) -> None:
    rng = np.random.default_rng(n + m)
    el = rng.integers(0, max(n, 1), size=(m, 2)).astype(np.int64)
    el[: m // 2] = np.sort(el[: m // 2], axis=0)        # runs already in order, as relation edges come
    weight, kind = rng.random(m), rng.integers(0, len(EDGE_KINDS), m).astype(np.uint8)
    for block in (1, 3, 64, 1 << 20):
        monkeypatch.setattr(csr, "BLOCK", block)
        got = csr.adjacency(n, el, weight, kind)
        for a, b in zip(got, _one_sort(n, el, weight, kind)):
            assert np.array_equal(a, b)


def test_keys_not_in_order_fall_back_on_a_sort() -> None:
    first = [b"m", b"a"]
    sk = csr.SortedKeys(first)
    sk.add(["b", "z"])
    sk.add(["c"])               # not after the last run: every key sorted instead
    got = sk.arrays()
    want = csr.key_arrays([b"m", b"a", b"b", b"z", b"c"])
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_walk_written_array_by_array_is_what_savez_writes(tmp_path) -> None:
    import io

    from hrag_cli.core.project import ProjectDir
    from hrag_cli.graph.model import save_graph

    cols = graph_columns(*_corpus(0))
    project = ProjectDir(tmp_path / "p")
    project.graph_path.parent.mkdir(parents=True)
    save_graph(project, cols)
    want = io.BytesIO()
    np.savez(want, **walk_arrays(cols))
    assert project.walk_path.read_bytes() == want.getvalue()
