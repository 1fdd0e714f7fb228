"""The graph after an incremental resolve (graph_update.update_columns) is the graph a build from every item
gives: the same columns, so graph.pkl has the same bytes."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from hrag_cli.graph import model as graph
from hrag_cli.graph import pickle_format as graph_pickle
from hrag_cli.graph.model import (
    GraphEntity, GraphRelation, graph_columns, intact, load_columns, save_graph, save_synonym_edges,
    set_synonym_edges, walk_arrays)
from hrag_cli.resolve.graph_update import GraphInputs, OutOfStep, spliced_columns, spliced_walk, update_columns
from hrag_cli.core.project import ProjectDir
from hrag_cli.core.records import ChunkRef, Document


def _corpus(rng: random.Random, n_docs: int, ents: dict, rels: dict, tag: str):
    """Documents of 1-3 chunks; each chunk mentions a few entities (new ones made as needed), and relations
    join entities it mentions."""
    docs, chunks, mentions = [], [], []
    for d in range(n_docs):
        doc_id = f"d{tag}{rng.randrange(10**6):06d}"
        docs.append(Document(doc_id, f"{doc_id}.txt", "h", 1))
        for o in range(rng.randint(1, 3)):
            chunk_id = f"c{rng.randrange(10**6):06d}"
            chunks.append(ChunkRef(chunk_id, doc_id, o))
            named = sorted({rng.choice(sorted(ents)) if ents and rng.random() < 0.6 else f"e{rng.randrange(10**6):06d}"
                            for _ in range(rng.randint(1, 4))})
            for eid in named:
                ents[eid] = GraphEntity(eid, f"N{rng.randrange(40)}", rng.choice(["person", "place", "UNKNOWN"]),
                                        [f"a{rng.randrange(3)}"] if rng.random() < 0.2 else [])
                mentions.append((chunk_id, eid, rng.randint(1, 3)))
            for a, b in zip(named, named[1:]):
                rels[(a, b)] = GraphRelation(f"r-{a}-{b}", a, b, float(rng.randint(1, 9)) / 2,
                                             rng.choice(["", "works_for", "born_in"]))
    return docs, chunks, mentions


def _sorted_items(ents: dict, rels: dict):
    return [ents[k] for k in sorted(ents)], [rels[k] for k in sorted(rels)]


@pytest.mark.parametrize("seed", range(4))
def test_update_equals_a_build_from_every_item(tmp_path: Path, seed: int, monkeypatch) -> None:
    rng = random.Random(seed)
    ents: dict = {}
    rels: dict = {}
    docs, chunks, mentions = _corpus(rng, 30, ents, rels, "a")
    e_list, r_list = _sorted_items(ents, rels)
    before_ents, before_rels = dict(ents), dict(rels)
    old = set_synonym_edges(graph_columns(docs, chunks, e_list, r_list, sorted(mentions, key=lambda m: m[0])),
                            [(e_list[0].id, e_list[-1].id, 0.9)])
    project = ProjectDir(tmp_path / "p")
    project.init()
    save_graph(project, old)
    # additions: new documents whose chunks name old and new entities (old ones renamed/retyped, old relations
    # weighed again), and (given every document) one old document renamed
    new_docs, new_chunks, new_mentions = _corpus(rng, 5, ents, rels, "b")
    renamed = [Document(d.doc_id, "renamed.txt", "h", 1) if i == 3 else d for i, d in enumerate(docs)]
    changed_e = [e for k, e in sorted(ents.items()) if before_ents.get(k) is not e]
    changed_r = [r for k, r in sorted(rels.items()) if before_rels.get(k) is not r]
    assert changed_e and changed_r
    all_mentions = sorted(mentions + new_mentions, key=lambda m: m[0])
    new_mentions = [m for m in all_mentions if m[0] in {c.chunk_id for c in new_chunks}]
    e_list, r_list = _sorted_items(ents, rels)
    fresh = graph_columns(renamed + new_docs, chunks + new_chunks, e_list, r_list, all_mentions)
    got = update_columns(load_columns(project), renamed + new_docs, chunks + new_chunks, changed_e, changed_r,
                         new_mentions)
    assert graph_pickle.dumps(got) == graph_pickle.dumps(fresh)
    # given only the added documents and chunks, the same graph; walk.npz spliced from the saved one (SYNONYM
    # edges and all) is the one made from the columns
    fresh = graph_columns(docs + new_docs, chunks + new_chunks, e_list, r_list, all_mentions)
    got, splice = spliced_columns(load_columns(project), new_docs, new_chunks, changed_e, changed_r, new_mentions)
    assert graph_pickle.dumps(got) == graph_pickle.dumps(fresh)
    with np.load(project.walk_path) as saved:
        spliced = spliced_walk(dict(saved), load_columns(project), got, splice)
    want = walk_arrays(fresh)
    assert spliced is not None and spliced.keys() == want.keys()
    assert all(np.array_equal(spliced[k], want[k]) and spliced[k].dtype == want[k].dtype for k in want)
    # the synonyms stage then puts its edges into the saved walk arrays (recorded, so intact: spliced, never
    # made from the columns): the arrays made from scratch
    save_graph(project, got)
    project.record_stage("resolve", "fp", "d")

    def made(*_args):
        raise AssertionError("walk.npz made from the columns, not from the saved arrays")

    monkeypatch.setattr(graph, "walk_arrays", made)
    for round_ in range(2):
        pairs = [(rng.choice(e_list).id, rng.choice(e_list).id, rng.random()) for _ in range(25)]
        save_synonym_edges(project, pairs)
        project.record_stage("synonyms", "fp", f"s{round_}")
        with np.load(project.walk_path) as saved:
            want = walk_arrays(load_columns(project))
            assert all(np.array_equal(saved[k], want[k]) for k in want), round_


def test_out_of_step_when_the_saved_graph_does_not_fit() -> None:
    docs = [Document("d1", "a.txt", "h", 1)]
    chunks = [ChunkRef("c1", "d1", 0)]
    ents = [GraphEntity("e1", "E", "person", [])]
    old = graph_columns(docs, chunks, ents, [], [("c1", "e1", 1)])
    with pytest.raises(OutOfStep, match="went away"):            # a document removed: not an addition
        update_columns(old, [], [], [], [], [])
    with pytest.raises(OutOfStep, match="unknown entity"):
        update_columns(old, docs, chunks, [], [GraphRelation("r", "e1", "e9", 1.0, "")], [])


def test_a_damaged_or_other_saved_graph_warns_and_gives_none(tmp_path: Path) -> None:
    """updated_graph: the caller builds from every item, after one warning naming the file."""
    import io

    from hrag_cli.resolve.graph_update import graph_inputs, updated_graph
    from hrag_cli.core.progress import Reporter

    docs = [Document("d1", "a.txt", "h", 1), Document("d2", "b.txt", "h", 1)]
    chunks = [ChunkRef("c1", "d1", 0), ChunkRef("c2", "d2", 0)]
    ents = [GraphEntity("e1", "E", "person", []), GraphEntity("e2", "F", "place", [])]
    project = ProjectDir(tmp_path / "p")
    project.init()
    save_graph(project, graph_columns(docs[:1], chunks[:1], ents[:1], [], [("c1", "e1", 1)]))
    project.record_stage("resolve", "fp", "d")
    assert intact(project, "graph/graph.pkl")
    out = io.StringIO()
    args = (project, GraphInputs(docs, chunks, chunks, load_columns(project)), ents[1:], [], [("c2", "e2", 2)])
    got = updated_graph(*args, (2, 0, 2), Reporter("quiet", out))
    assert got is not None and out.getvalue() == ""
    assert graph_pickle.dumps(got[0]) == graph_pickle.dumps(graph_columns(docs, chunks, ents, [],
                                                                          [("c1", "e1", 1), ("c2", "e2", 2)]))
    assert updated_graph(*args, (3, 0, 2), Reporter("quiet", out)) is None      # not the graph the merge expects
    data = project.graph_path.read_bytes()
    for i in range(len(data)):      # a same-size change the load lets through: the whole hash still finds it
        project.graph_path.write_bytes(data[:i] + bytes([data[i] ^ 0x55]) + data[i + 1:])
        try:
            load_columns(project)
            break
        except Exception:
            continue
    else:
        pytest.fail("every change found by the load")
    assert not intact(project, "graph/graph.pkl") and graph_inputs(project, {}).old is None     # no saved graph
    project.graph_path.write_bytes(data[:100])
    assert not intact(project, "graph/graph.pkl")
    no_saved = GraphInputs(docs, chunks, chunks)
    assert updated_graph(project, no_saved, *args[2:], (2, 0, 2), Reporter("quiet", out)) is None
    warnings = out.getvalue().splitlines()
    assert len(warnings) == 2 and all("graph.pkl cannot be updated" in w and "from every item" in w for w in warnings)


def test_an_added_chunk_of_a_document_the_graph_has_is_out_of_step() -> None:
    docs = [Document("d1", "a.txt", "h", 1)]
    old = graph_columns(docs, [ChunkRef("c1", "d1", 0)], [GraphEntity("e1", "E", "person", [])], [],
                        [("c1", "e1", 1)])
    with pytest.raises(OutOfStep, match="a document the graph has"):
        spliced_columns(old, [], [ChunkRef("c2", "d1", 1)], [], [], [])
    with pytest.raises(OutOfStep, match="in the graph already"):
        spliced_columns(old, docs, [], [], [], [])


def _index(docs: Path, project: Path) -> str:
    from typer.testing import CliRunner

    from hrag_cli.cli import app

    result = CliRunner().invoke(app, ["index", str(docs), "-p", str(project), "--stop-after", "resolve",
                                      "--chunk-tokens", "120", "--chunk-overlap", "10"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _sample_docs(tmp_path: Path) -> Path:
    import shutil
    import time

    docs = tmp_path / "docs"
    shutil.copytree(Path(__file__).resolve().parent.parent / "sample_corpus", docs)
    time.sleep(1.05)        # files younger than a second get no stamp: the next run would read them all again
    return docs


def _same_graph(a: Path, b: Path) -> None:
    got, want = ProjectDir(a), ProjectDir(b)
    assert got.graph_path.read_bytes() == want.graph_path.read_bytes()
    with np.load(got.walk_path) as x, np.load(want.walk_path) as y:
        assert x.files == y.files and all(np.array_equal(x[k], y[k]) for k in x.files)


def test_resolve_after_an_addition_reads_only_the_added_lines_and_equals_a_fresh_build(tmp_path: Path,
                                                                                       monkeypatch) -> None:
    """The saved graph holds the documents and chunks of the last resolve (its `chunk_mark`): the next one reads
    only what was appended since, and splices graph.pkl and walk.npz, which equal a fresh build's."""
    from hrag_cli.resolve import graph_update

    docs = _sample_docs(tmp_path)
    inc = tmp_path / "inc"
    _index(docs, inc)
    assert ProjectDir(inc).stage("resolve").counts["chunk_mark"]["chunks"] > 0
    (docs / "new_a.txt").write_text("Hana Okafor visited Port Ellery in 2001 with the Lantern Archive.\n")
    (docs / "zz_new.txt").write_text("Quillon Vesk founded the Amberline Guild in Port Ellery. Orvan Pell sailed "
                                     "from Port Ellery to Miravel with Hana Okafor.\n")

    def whole(*_args):
        raise AssertionError("every document or chunk read, or every walk entry sorted")

    monkeypatch.setattr(graph_update, "load_documents", whole)
    monkeypatch.setattr(graph_update, "load_chunk_refs", whole)
    monkeypatch.setattr(graph_update, "walk_arrays", whole)       # walk.npz spliced, not made again
    out = _index(docs, inc)
    assert "cannot be updated" not in out and "new ones merged" in out
    assert "chunk_mark" not in out          # bookkeeping for the next run: not in the summary a person reads
    monkeypatch.undo()
    _index(docs, tmp_path / "fresh")
    _same_graph(inc, tmp_path / "fresh")


def test_graph_inputs_fall_back_to_every_document_or_a_walk_made_again(tmp_path: Path, monkeypatch) -> None:
    """What the saved graph and walk.npz may be used for when the mark or a file does not fit: a damaged walk.npz
    is made from the columns, a graph whose mark does not fit is updated given every document and chunk, and
    docs.jsonl written whole (a new epoch) is read whole; the graph is then still a fresh build's."""
    import shutil

    from hrag_cli.resolve import graph_update
    from hrag_cli.resolve.graph_update import graph_inputs

    docs = _sample_docs(tmp_path)
    inc = tmp_path / "inc"
    _index(docs, inc)
    project = ProjectDir(inc)
    mark = project.stage("resolve").counts["chunk_mark"]
    n_docs = mark["docs"]
    got = graph_inputs(project, mark)
    assert got.old is not None and got.added_only and got.walk_ok and got.docs == [] and got.added == []
    walk = project.walk_path.read_bytes()
    flipped = bytearray(walk)
    flipped[len(walk) // 2] ^= 0xFF
    project.walk_path.write_bytes(bytes(flipped))
    assert not graph_inputs(project, mark).walk_ok          # spliced graph, walk.npz made from the columns
    project.walk_path.write_bytes(walk)
    for other in ({**mark, "chunks": mark["chunks"] - 1}, {}):   # not the graph's mark, or no mark recorded
        got = graph_inputs(project, other)
        assert got.old is not None and not got.added_only and len(got.docs) == n_docs
    assert graph_inputs(project, None).old is None          # a run merging from scratch: no saved graph
    # a new file sorting first with an old document's text: the old chunk's id is salted, so docs.jsonl and
    # chunks.jsonl are written whole; the saved graph is updated given every document and chunk
    shutil.copy(docs / "people" / "edric_solano.txt", docs / "aaa.txt")
    reads = []
    real = graph_update.load_documents
    monkeypatch.setattr(graph_update, "load_documents", lambda p: reads.append(1) or real(p))
    out = _index(docs, inc)
    assert reads and "cannot be updated" not in out and "new ones merged" in out
    monkeypatch.undo()
    _index(docs, tmp_path / "fresh")
    _same_graph(inc, tmp_path / "fresh")


def test_relation_ids_spliced_as_json_bytes() -> None:
    """The relation id vocabulary is spliced as JSON bytes (ids made again replaced, new ones put in, at the
    front, among and after the old ones): the bytes of the list spliced and dumped; a vocabulary with an
    escaped id is left to the list (None)."""
    import orjson

    from hrag_cli.resolve.graph_update import _spliced_json

    ids = ["r1", "r3", "ré5", "r7"]
    raw = orjson.dumps([None, *ids])
    put = [(1, "r3b"), (3, "r7")]
    at, new = np.array([0, 0, 2, 4, 4]), ["r0", "r0b", "r2", "r8", "r9"]
    want = [None, "r0", "r0b", "r1", "r3b", "r2", "ré5", "r7", "r8", "r9"]
    assert _spliced_json(raw, 4, put, at, new) == orjson.dumps(want)
    assert _spliced_json(raw, 4, [], np.zeros(0, np.int64), []) == raw
    assert _spliced_json(b"[null]", 0, [], np.array([0, 0]), ["a", 'q"uote']) == orjson.dumps([None, "a", 'q"uote'])
    assert _spliced_json(orjson.dumps([None, 'q"uote', "b"]), 2, [], np.array([1]), ["a"]) is None
    assert _spliced_json(orjson.dumps([None, "a", "b"]), 3, [], np.array([1]), ["a"]) is None    # not its count
