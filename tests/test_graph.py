"""Graph schema (docs/design.md, "The graph"): vertex and edge kinds, attributes, weights, PART_OF / NEXT_CHUNK order,
the one loader with its key map, and SYNONYM edge replacement."""

from __future__ import annotations

import pickle
import zlib
from pathlib import Path

import numpy as np
import pytest

from hrag_cli.graph import pickle_format as graph_pickle
from hrag_cli.core.errors import HragError
from hrag_cli.graph.model import (
    EDGE_KINDS, add_synonym_edges, build_graph, edge_counts, graph_columns, load_columns, load_graph, save_graph,
    save_synonym_edges, set_synonym_edges, walk_arrays)
from hrag_cli.graph.pickle_format import Column
from hrag_cli.core.project import ProjectDir
from hrag_cli.core.records import ChunkRef, Document, Entity, Relation, Synonym


def _sample():
    docs = [Document("d2", "b.txt", "h2", 5), Document("d1", "a.txt", "h1", 5)]
    chunks = [ChunkRef("k3", "d1", 2), ChunkRef("k1", "d1", 0), ChunkRef("k2", "d1", 1), ChunkRef("k9", "d2", 0),
              ChunkRef("k1", "d2", 1)]   # k1: the same text in both documents -> one vertex, two PART_OF
    entities = [Entity("acme", "Acme", "organization", "A firm.", [], ["k1", "k2"]),
                Entity("bob", "Bob", "person", "A man.", ["BOB"], ["k1"]),
                Entity("zürich", "Zürich", "location", "", [], ["k9"])]
    relations = [Relation("r1", "acme", "bob", ["employs"], ["work"], "Acme employs Bob.", 7.5, ["k1"])]
    mentions = [("k1", "acme", 2), ("k2", "acme", 1), ("k1", "bob", 3), ("k9", "zürich", 1)]
    return docs, chunks, entities, relations, mentions


def _assert_same_graph(a, b) -> None:
    """Same vertices, edges and every attribute, in the same order."""
    assert (a.vcount(), a.ecount(), a.is_directed()) == (b.vcount(), b.ecount(), b.is_directed())
    assert a.get_edgelist() == b.get_edgelist()
    assert sorted(a.vs.attributes()) == sorted(b.vs.attributes()) and sorted(a.es.attributes()) == sorted(b.es.attributes())
    for k in b.vs.attributes():
        assert a.vs[k] == b.vs[k], k
    for k in b.es.attributes():
        assert a.es[k] == b.es[k], k


def _edges(g, kind: str) -> list[tuple[str, str, float]]:
    keys = g.vs["key"]
    return sorted((keys[e.source], keys[e.target], e["weight"]) for e in g.es.select(kind_eq=kind))


def test_vertices_kinds_and_attributes() -> None:
    g = build_graph(*_sample())
    assert g.vs["kind"] == ["document"] * 2 + ["chunk"] * 4 + ["entity"] * 3
    assert g.vs["key"] == ["d1", "d2", "k1", "k2", "k3", "k9", "acme", "bob", "zürich"]
    assert not g.is_directed()
    doc = g.vs[0]
    assert (doc["path"], doc["doc_id"], doc["name"]) == ("a.txt", None, None)
    k3 = g.vs[4]
    assert (k3["doc_id"], k3["order"], k3["path"]) == ("d1", 2, None)
    bob = g.vs[7]
    assert (bob["name"], bob["type"], bob["aliases"]) == ("Bob", "person", ["BOB"])
    assert g.vs[8]["name"] == "Zürich"
    # text bodies and source lists stay in the JSONL records (export joins them in): the pickle is structure
    assert not {"text", "description", "source_ids"} & set(g.vs.attributes())
    assert not {"description", "predicates", "keywords", "source_ids"} & set(g.es.attributes())


def test_edge_kinds_weights_and_order() -> None:
    g = build_graph(*_sample())
    assert g.es["kind"] == ["PART_OF"] * 5 + ["NEXT_CHUNK"] * 3 + ["RELATION"] + ["MENTIONED_IN"] * 4
    assert _edges(g, "PART_OF") == sorted([("d1", "k1", 1.0), ("d1", "k2", 1.0), ("d1", "k3", 1.0),
                                           ("d2", "k9", 1.0), ("d2", "k1", 1.0)])
    # consecutive by order within each document: d1: k1-k2-k3, d2: k9-k1
    nxt = {frozenset((a, b)) for a, b, _ in _edges(g, "NEXT_CHUNK")}
    assert nxt == {frozenset(("k1", "k2")), frozenset(("k2", "k3")), frozenset(("k9", "k1"))}
    assert _edges(g, "MENTIONED_IN") == [("k1", "acme", 2.0), ("k1", "bob", 3.0), ("k2", "acme", 1.0),
                                         ("k9", "zürich", 1.0)]
    rel = g.es.select(kind_eq="RELATION")[0]
    assert (rel["weight"], rel["key"]) == (7.5, "r1")
    assert g.es.select(kind_eq="PART_OF")[0]["key"] is None
    assert edge_counts(g) == {"PART_OF": 5, "NEXT_CHUNK": 3, "RELATION": 1, "MENTIONED_IN": 4, "SYNONYM": 0}


def test_next_chunk_exact() -> None:
    docs = [Document("d1", "a.txt", "h", 1)]
    chunks = [ChunkRef(f"k{i}", "d1", i) for i in (3, 0, 2, 1)]
    g = build_graph(docs, chunks, [], [], [])
    keys = g.vs["key"]
    assert keys == ["d1", "k0", "k1", "k2", "k3"]
    pairs = sorted(tuple(sorted((keys[e.source], keys[e.target]))) for e in g.es.select(kind_eq="NEXT_CHUNK"))
    assert pairs == [("k0", "k1"), ("k1", "k2"), ("k2", "k3")]
    assert edge_counts(g) == {"PART_OF": 4, "NEXT_CHUNK": 3, "RELATION": 0, "MENTIONED_IN": 0, "SYNONYM": 0}


def test_save_load_roundtrip_and_key_map(tmp_path: Path) -> None:
    project = ProjectDir(tmp_path / "p")
    project.init()
    with pytest.raises(HragError, match="no graph"):
        load_graph(project)
    g = build_graph(*_sample())
    save_graph(project, g)
    g2, keys = load_graph(project)
    assert g2.vcount() == g.vcount() and g2.ecount() == g.ecount()
    assert keys["bob"] == 7 and keys["d1"] == 0 and keys["k9"] == 5
    assert g2.vs[keys["zürich"]]["name"] == "Zürich"
    assert g2.es["weight"] == g.es["weight"]
    _assert_same_graph(pickle.loads(project.graph_path.read_bytes()), g)   # a plain pickle: igraph alone loads it
    for earlier in (pickle.dumps(g), zlib.compress(pickle.dumps(g), 1)):      # igraph's own, plain or compressed
        project.graph_path.write_bytes(earlier)
        assert load_graph(project)[0].vs["key"] == g.vs["key"]
        _assert_same_graph(load_columns(project).to_igraph(), g)
    project.graph_path.write_bytes(b"not a pickle")
    with pytest.raises(HragError, match="damaged"):
        load_graph(project)


def test_add_synonym_edges_replaces_previous() -> None:
    g = build_graph(*_sample())
    n_before = g.ecount()
    add_synonym_edges(g, [Synonym("acme", "bob", 0.91), ("bob", "zürich", 0.85), {"a": "bob", "b": "acme",
                                                                                 "similarity": 0.5},
                          ("bob", "bob", 1.0), ("bob", "nobody", 0.9)])
    syn = _edges(g, "SYNONYM")
    assert syn == [("acme", "bob", 0.91), ("bob", "zürich", 0.85)]
    assert g.ecount() == n_before + 2
    add_synonym_edges(g, [("acme", "zürich", 0.88)])
    assert _edges(g, "SYNONYM") == [("acme", "zürich", 0.88)]
    assert g.ecount() == n_before + 1
    assert edge_counts(g)["RELATION"] == 1               # other edges untouched
    add_synonym_edges(g, [])
    assert g.ecount() == n_before


@pytest.mark.parametrize("sample", [1, 3, 64])
def test_a_key_search_through_samples_finds_what_a_scan_finds(sample: int) -> None:
    """`vertex` bisects every `_SAMPLE`-th sorted key before the keys between two samples: every key is found
    at its vertex, and a key before, between or after them (UTF-8 byte order) at none."""
    import igraph as ig

    from hrag_cli.graph.walk import WalkGraph

    rng = np.random.default_rng(5)
    keys = sorted({"".join(rng.choice(list("abcé z0"), size=int(rng.integers(1, 6)))) for _ in range(400)})
    keys = [keys[i] for i in rng.permutation(len(keys))]        # vertices in no key order
    g = ig.Graph(n=len(keys))
    g.vs["key"], g.vs["kind"] = keys, ["entity"] * len(keys)
    g.es["weight"], g.es["kind"] = [], []
    walk = WalkGraph(walk_arrays(g))
    walk._SAMPLE = sample
    assert all(walk.vertex(k) == v for v, k in enumerate(keys))
    absent = {k + x for k in keys for x in ("", "!", "~", "\uffff")} - set(keys) | {"", "\x00", "\uffff", "ab!"}
    assert all(walk.vertex(k) is None for k in absent - set(keys))


def test_walk_arrays_saved_beside_the_graph(tmp_path: Path) -> None:
    """save_graph writes graph/walk.npz, the graph as a query walks it: every edge both ways with its weight
    and kind, every key findable; a missing file (a project built before it) comes from graph.pkl, a damaged
    one is an error naming the fix."""
    from hrag_cli.graph.walk import WalkGraph

    project = ProjectDir(tmp_path / "p")
    project.init()
    g = add_synonym_edges(build_graph(*_sample()), [("acme", "bob", 0.9)])
    save_graph(project, g)
    walk = WalkGraph.load(project)
    assert (walk.vcount(), walk.ecount()) == (g.vcount(), g.ecount())
    assert [walk.key(v) for v in range(walk.vcount())] == g.vs["key"]
    assert all(walk.vertex(k) == v for v, k in enumerate(g.vs["key"]))
    assert walk.vertex("nobody") is None and walk.vertex("") is None and walk.vertex("zzz") is None

    def searched(key: str) -> None:
        raise AssertionError(f"{key!r} searched again")

    walk._search = searched                                        # remembered: a second ask searches nothing
    assert all(walk.vertex(k) == v for v, k in enumerate(g.vs["key"])) and walk.vertex("zzz") is None
    del walk._search
    walk._FOUND_KEEP, at = 2, {k: v for v, k in enumerate(g.vs["key"])}   # full: cleared, then the answer kept
    walk._found.clear()
    assert [walk.vertex(k) for k in ("acme", "bob", "zürich")] == [at["acme"], at["bob"], at["zürich"]]
    assert list(walk._found) == ["zürich"]
    entries = sorted((walk.key(int(r)), walk.key(int(c)), float(w), int(k)) for r, c, w, k in
                     zip(walk.rows(), walk.cols, walk.weight, walk.kind))
    both_ways = sorted(t for e in g.es for t in (
        (g.vs[e.source]["key"], g.vs[e.target]["key"], e["weight"], EDGE_KINDS.index(e["kind"])),
        (g.vs[e.target]["key"], g.vs[e.source]["key"], e["weight"], EDGE_KINDS.index(e["kind"]))))
    assert entries == both_ways
    assert walk.keys_of_kind("chunk") == {"k1": 2, "k2": 3, "k3": 4, "k9": 5}
    # entities: their line in entities.jsonl (id order), and the chunks naming them (MENTIONED_IN edges)
    assert [walk.entity_row(k) for k in ("acme", "bob", "zürich", "k1", "nobody")] == [0, 1, 2, None, None]
    assert [walk.degree_of_kind(walk.vertex(k), "MENTIONED_IN") for k in ("acme", "bob", "zürich")] == [2, 1, 1]
    syn = walk.weights({"SYNONYM": 0.0})
    is_syn = walk.kind == EDGE_KINDS.index("SYNONYM")
    assert syn[is_syn].tolist() == [0.0, 0.0] and (syn[~is_syn] == walk.weight[~is_syn]).all()
    # the arrays are mapped from the file, not read whole, and hold what np.load reads; a compressed .npz
    # (not what save_walk writes) still loads, read whole
    assert isinstance(walk.indptr.base, np.memmap) and isinstance(walk.weight.base, np.memmap)
    with np.load(project.walk_path) as npz:
        saved = {k: npz[k] for k in npz.files}
    assert (walk.indptr == saved["indptr"]).all() and (walk.weight == saved["weight"]).all()
    with open(project.walk_path, "wb") as fh:
        np.savez_compressed(fh, **saved)
    packed = WalkGraph.load(project)
    assert not isinstance(packed.weight.base, np.memmap) and (packed.cols == walk.cols).all()
    assert all(packed.vertex(k) == v for v, k in enumerate(g.vs["key"]))

    project.walk_path.unlink()                                     # built before walk.npz existed
    old = WalkGraph.load(project)
    assert [old.key(v) for v in range(old.vcount())] == g.vs["key"] and (old.cols == walk.cols).all()
    project.walk_path.write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(HragError, match="walk.npz is damaged.*hrag resolve"):
        WalkGraph.load(project)


def test_columns_file_round_trip_and_synonym_part_reused(tmp_path: Path) -> None:
    """graph.pkl is written from columns and read back as columns without making the graph; replacing the
    SYNONYM edges gives the graph add_synonym_edges gives, and keeps every other member's compressed bytes."""
    project = ProjectDir(tmp_path / "p")
    project.init()
    cols = graph_columns(*_sample())
    save_graph(project, cols)
    back = load_columns(project)
    _assert_same_graph(back.to_igraph(), build_graph(*_sample()))
    assert back.split == back.m and edge_counts(back) == edge_counts(build_graph(*_sample()))
    first = project.graph_path.read_bytes()
    pairs = [("acme", "bob", 0.91), ("bob", "zürich", 0.85), ("bob", "bob", 1.0)]
    save_synonym_edges(project, pairs)
    with_syn = project.graph_path.read_bytes()
    expected = add_synonym_edges(build_graph(*_sample()), pairs)
    _assert_same_graph(pickle.loads(with_syn), expected)
    # equal to the columns made in one go: the same bytes whichever way the graph came
    assert with_syn == _saved_bytes(tmp_path / "q", set_synonym_edges(graph_columns(*_sample()), pairs))
    assert load_columns(project).split == cols.m
    _assert_walk_of(project)                          # walk.npz updated in place: the arrays walk_arrays makes
    save_synonym_edges(project, [("acme", "zürich", 0.5)])              # replaced, not added to
    _assert_same_graph(pickle.loads(project.graph_path.read_bytes()),
                       add_synonym_edges(build_graph(*_sample()), [("acme", "zürich", 0.5)]))
    _assert_walk_of(project)
    save_synonym_edges(project, [])
    assert project.graph_path.read_bytes() == first
    _assert_walk_of(project)
    project.walk_path.unlink()                        # missing (or not of this graph): made from the columns
    save_synonym_edges(project, pairs)
    _assert_walk_of(project)
    project.graph_path.write_bytes(first[:-40])
    with pytest.raises(HragError, match="damaged"):
        load_columns(project)


def test_recorded_graph_synonyms_replaced_without_loading_it_whole(tmp_path: Path, monkeypatch) -> None:
    """A graph.pkl the last commit recorded (whole-file hash) has its SYNONYM edges replaced from its members as
    they are, never loading the columns: the bytes and walk arrays a whole load gives, over several rounds (a
    name no vertex has, a chunk's key, an empty list); a file not recorded so is loaded whole, so damage shows."""
    import hrag_cli.graph.model as graph

    project = ProjectDir(tmp_path / "p")
    project.init()
    save_graph(project, graph_columns(*_sample()))
    first = project.graph_path.read_bytes()
    whole = load_columns
    monkeypatch.setattr(graph, "load_columns", lambda _p: pytest.fail("loaded whole"))
    rounds = [[("acme", "bob", 0.91), ("bob", "zürich", 0.85), ("bob", "bob", 1.0), ("nobody", "bob", 0.8)],
              [("acme", "zürich", 0.5), ("k9", "acme", 0.7), ("zürich", "acme", 0.6)], []]
    for i, pairs in enumerate(rounds):
        project.record_stage("resolve" if i == 0 else "synonyms", "fp", f"d{i}")
        save_synonym_edges(project, pairs)
        got = project.graph_path.read_bytes()
        assert got == _saved_bytes(tmp_path / f"q{i}", set_synonym_edges(graph_columns(*_sample()), pairs)), i
        _assert_same_graph(pickle.loads(got), add_synonym_edges(build_graph(*_sample()), pairs))
        want = walk_arrays(whole(project))
        with np.load(project.walk_path) as saved:
            assert all(np.array_equal(saved[k], want[k]) and saved[k].dtype == want[k].dtype for k in want), i
    assert project.graph_path.read_bytes() == first
    bad = bytearray(first)
    bad[len(bad) // 2] ^= 0x55                    # not the recorded file: loaded whole, and found damaged
    project.graph_path.write_bytes(bytes(bad))
    monkeypatch.setattr(graph, "load_columns", whole)
    with pytest.raises(HragError, match="damaged"):
        save_synonym_edges(project, rounds[0])
    project.graph_path.unlink()                 # no graph: the load's one-line error, not a raw OSError
    with pytest.raises(HragError, match="no graph"):
        save_synonym_edges(project, rounds[0])


def test_vertex_columns_written_back_compressed(tmp_path: Path) -> None:
    """A loaded graph's vertex columns keep their compressed members until read and are written back as
    they were; a column made anew whose member equals a kept one is written as that one member, as a build
    writes it, so the bytes match the build's."""
    project = ProjectDir(tmp_path / "p")
    project.init()
    save_graph(project, graph_columns(*_sample()))
    back = load_columns(project)
    assert all(c.codes_z is not None for c in back.vattrs.values() if isinstance(c, Column))
    assert graph_pickle.dumps(back) == project.graph_path.read_bytes()
    key = load_columns(project).vattrs["key"]
    back.vattrs["name"] = Column(list(key.vocab), key.codes.copy())
    fresh = graph_columns(*_sample())
    fresh.vattrs["name"] = Column(list(fresh.vattrs["key"].vocab), fresh.vattrs["key"].codes.copy())
    assert graph_pickle.dumps(back) == graph_pickle.dumps(fresh)
    assert back.to_igraph().vs["name"] == back.to_igraph().vs["key"]


@pytest.mark.parametrize("member", ["codes", "vocabulary"])
def test_a_damaged_kept_member_is_found_when_the_graph_loads(tmp_path: Path, member: str) -> None:
    """The members a loaded graph keeps compressed (to write them back as they were) are inflated at load: one
    damaged inside is "damaged" there, never a raw zlib error for whoever reads the column first, and never
    written back into a new graph.pkl as if it were good."""
    project = ProjectDir(tmp_path / "p")
    project.init()
    save_graph(project, graph_columns(*_sample()))
    col = load_columns(project).vattrs["name"]
    kept = col.codes_z if member == "codes" else col._z
    data = project.graph_path.read_bytes()
    at = data.find(kept)
    assert kept and at > 0 and data.count(kept) == 1
    bad = bytearray(data)
    bad[at + len(kept) // 2] ^= 0x55
    project.graph_path.write_bytes(bytes(bad))
    with pytest.raises(HragError, match="damaged"):
        load_columns(project)


def _assert_walk_of(project: ProjectDir) -> None:
    want = walk_arrays(load_columns(project))
    with np.load(project.walk_path) as got:
        assert sorted(got.files) == sorted(want)
        for k in want:
            assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k


def _saved_bytes(root: Path, cols) -> bytes:
    project = ProjectDir(root)
    project.init()
    save_graph(project, cols)
    return project.graph_path.read_bytes()


def test_key_finder_bisects_sorted_entities_and_falls_back_to_a_dict() -> None:
    """Names to vertices: entities (the last vertices) by bisection when their keys are sorted, any other key
    (a chunk's, or every key when the entities are not sorted) by a dict; -1 for a name no vertex has."""
    from hrag_cli.graph.model import _key_finder

    kinds = np.array([0, 1, 1, 2, 2, 2], dtype=np.uint8)
    names = ["c", "zz", "k1", "d1", "a", "b", "", "k2"]
    for keys in (["d1", "k2", "k1", "a", "b", "c"], ["d1", "k2", "k1", "c", "a", "b"]):
        want = [keys.index(x) if x in keys else -1 for x in names]
        assert _key_finder(keys, kinds)(names).tolist() == want
    assert _key_finder([], np.zeros(0, np.uint8))(["a"]).tolist() == [-1]
