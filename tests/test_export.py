"""hrag export: every file format round-trips the project's graph, awkward text survives, nothing in the project
changes. A real sample-corpus project (built once per module with `hrag index`, rules extractor, built-in
embedder) checks counts and values; a small hand-built project carries the awkward text."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hrag_cli.core import store
from hrag_cli.core.config import Settings, VectorSettings
from hrag_cli.core.errors import UsageError
from hrag_cli.export.run import ExportOptions, load_export_graph, run_export, select_subgraph
from hrag_cli.export.formats import ARRAY_DELIMITER, cypher_string, read_cypher_statements
from hrag_cli.graph.model import add_synonym_edges, build_graph, load_graph, save_graph
from hrag_cli.core.normalize import normalize_name
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir, fingerprint
from hrag_cli.core.records import Chunk, ChunkRef, Document, Entity, Fact, Relation, to_dict
from hrag_cli.storage.vectors.index import VectorIndex

ROOT = Path(__file__).resolve().parent.parent
HRAG = [sys.executable, "-m", "hrag_cli.cli"]

TRICKY = ("He said \"hi\" & 'bye' <b>\nnew line\r\n\ttab \\ back\\slash \\n not-a-newline; semi;colon, "
          "ünïcødé 東京 Zürich 😀 \u2028 end")
TRICKY_NAME = "O'Brien \"The Rock\" \\ Łódź"


def make_tricky_project(root: Path, dim: int = 8) -> ProjectDir:
    """A small project written with the real record, graph and vector modules, full of awkward text."""
    project = ProjectDir(root)
    project.init()
    docs = [Document(doc_id="d1", path="dir/ü \"quoted\".txt", sha256="x", bytes=10, n_chunks=2),
            Document(doc_id="d2", path="other.md", sha256="y", bytes=5, n_chunks=1)]
    chunks = [Chunk("c1", "d1", 0, 5, TRICKY), Chunk("c2", "d1", 1, 5, "second chunk\nwith 'quotes'"),
              Chunk("c3", "d2", 0, 3, "plain text about Port Ellery")]
    names = [TRICKY_NAME, "Port Ellery", "Zoë Almqvist", "Harrowgate; Institute"]
    entities = [Entity(id=normalize_name(n), name=n, type="person" if i != 1 else "location",
                       description=f"{TRICKY} #{i}", aliases=[n.upper(), "a;b"] if i == 0 else [],
                       source_ids=["c1", "c3"] if i < 2 else ["c2"]) for i, n in enumerate(names)]
    entities.sort(key=lambda e: e.id)
    ids = {e.name: e.id for e in entities}
    pairs = [(ids[TRICKY_NAME], ids["Port Ellery"]), (ids["Port Ellery"], ids["Zoë Almqvist"]),
             (ids["Zoë Almqvist"], ids["Harrowgate; Institute"])]
    relations = []
    for i, (a, b) in enumerate(pairs):
        s, t = sorted((a, b))
        relations.append(Relation(id=fingerprint("relation", s, t), src=s, tgt=t, predicates=["lives in", "said \"x\""],
                                  keywords=["k1", "ü\nk2"], description=f"rel {TRICKY}", weight=2.5,
                                  source_ids=["c1"], rel_type="lives_in" if i == 0 else ""))
    facts = [Fact(id=fingerprint("fact", r.src, "p", r.tgt),
                  subject=next(e.name for e in entities if e.id == r.src), predicate="related to",
                  object=next(e.name for e in entities if e.id == r.tgt), relation_id=r.id, source_ids=["c1"])
             for r in relations]
    mentions = [("c1", ids[TRICKY_NAME], 2), ("c1", ids["Port Ellery"], 1), ("c3", ids["Port Ellery"], 1),
                ("c2", ids["Zoë Almqvist"], 1), ("c2", ids["Harrowgate; Institute"], 3)]
    store.write_jsonl(project.docs_path, (to_dict(d) for d in docs))
    store.write_jsonl(project.chunks_path, (to_dict(c) for c in chunks))
    store.write_jsonl(project.entities_path, (to_dict(e) for e in entities))
    store.write_jsonl(project.relations_path, (r.to_json() for r in relations))
    store.write_jsonl(project.facts_path, (to_dict(f) for f in facts))
    g = build_graph(docs, [ChunkRef(c.chunk_id, c.doc_id, c.order) for c in chunks], entities, relations, mentions)
    add_synonym_edges(g, [(ids["Port Ellery"], ids["Harrowgate; Institute"], 0.91)])
    save_graph(project, g)
    rng = np.random.default_rng(7)
    for name, item_ids in (("entities", [e.id for e in entities]), ("chunks", [c.chunk_id for c in chunks]),
                           ("facts", [f.id for f in facts])):
        VectorIndex.build(name, item_ids, rng.normal(size=(len(item_ids), dim)).astype(np.float32),
                          VectorSettings(), "test-model").save(project.vectors_dir)
    return project


def snapshot(root: Path) -> dict[str, str]:
    """Every file under the project with its content hash and mtime, to prove export changed nothing."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest() + f"@{p.stat().st_mtime_ns}"
    return out


def export(project: ProjectDir, fmt: str, output: Path | None = None, **kw) -> dict:
    return run_export(project, Settings(), Reporter("quiet"), ExportOptions(fmt=fmt, output=output, **kw))


@pytest.fixture(scope="module")
def tricky(tmp_path_factory) -> ProjectDir:
    return make_tricky_project(tmp_path_factory.mktemp("tricky") / "proj")


def index_sample(root: Path) -> ProjectDir:
    """The sample corpus indexed offline (rules extractor, built-in embedder) through the real CLI."""
    env = {**os.environ, "HRAG_LLM_MODEL": "", "HRAG_EMBED_MODEL": "builtin"}
    run = subprocess.run(HRAG + ["index", str(ROOT / "sample_corpus"), "-p", str(root), "--extractor", "rules",
                                 "--quiet"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    return ProjectDir(root)


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> ProjectDir:
    return index_sample(tmp_path_factory.mktemp("sample") / "proj")


def graph_of(project: ProjectDir):
    g, _ = load_graph(project)
    return g


# -- jsonl -----------------------------------------------------------------------------------------------
def test_jsonl_round_trip_sample(sample: ProjectDir, tmp_path: Path) -> None:
    before = snapshot(sample.root)
    summary = export(sample, "jsonl", tmp_path / "out")
    g = graph_of(sample)
    nodes = list(store.read_jsonl(tmp_path / "out" / "nodes.jsonl"))
    edges = list(store.read_jsonl(tmp_path / "out" / "edges.jsonl"))
    assert len(nodes) == g.vcount() == summary["nodes"]
    assert len(edges) == g.ecount() == summary["edges"]
    kinds = {"document": "Document", "chunk": "Chunk", "entity": "Entity"}
    assert sorted(n["label"] for n in nodes) == sorted(kinds[k] for k in g.vs["kind"])
    assert sorted(e["type"] for e in edges) == sorted(g.es["kind"])
    by_id = {n["id"]: n for n in nodes}
    assert len(by_id) == len(nodes)
    for ent in store.read_jsonl(sample.entities_path):
        n = by_id["entity:" + ent["id"]]
        assert (n["name"], n["type"], n["description"]) == (ent["name"], ent["type"], ent["description"])
        assert n["source_ids"] == ent["source_ids"] and n.get("aliases", []) == ent["aliases"]
    for ch in store.read_jsonl(sample.chunks_path):
        n = by_id["chunk:" + ch["chunk_id"]]
        assert n["text"] == ch["text"] and n["order"] == ch["order"] and n["doc_id"] == ch["doc_id"]
    for d in store.read_jsonl(sample.docs_path):
        assert by_id["doc:" + d["doc_id"]]["path"] == d["path"]
    rels = {r["id"]: r for r in store.read_jsonl(sample.relations_path)}
    rel_edges = [e for e in edges if e["type"] == "RELATION"]
    assert len(rel_edges) == len(rels)
    for e in rel_edges:
        r = rels[e["key"]]
        assert (e["source"], e["target"]) == ("entity:" + r["src"], "entity:" + r["tgt"])
        assert e["weight"] == pytest.approx(r["weight"]) and e["keywords"] == r["keywords"]
    for e in edges:
        assert e["source"] in by_id and e["target"] in by_id
        if e["type"] == "PART_OF":
            assert e["source"].startswith("chunk:") and e["target"].startswith("doc:")
        if e["type"] == "MENTIONED_IN":
            assert e["source"].startswith("entity:") and e["target"].startswith("chunk:")
    assert snapshot(sample.root) == before


def test_jsonl_tricky_text(tricky: ProjectDir, tmp_path: Path) -> None:
    export(tricky, "jsonl", tmp_path)
    nodes = {n["id"]: n for n in store.read_jsonl(tmp_path / "nodes.jsonl")}
    assert nodes["chunk:c1"]["text"] == TRICKY
    ent = nodes["entity:" + normalize_name(TRICKY_NAME)]
    assert ent["name"] == TRICKY_NAME and ent["aliases"] == [TRICKY_NAME.upper(), "a;b"]
    assert nodes["doc:d1"]["path"] == "dir/ü \"quoted\".txt"
    edges = list(store.read_jsonl(tmp_path / "edges.jsonl"))
    syn = [e for e in edges if e["type"] == "SYNONYM"]
    assert len(syn) == 1 and syn[0]["weight"] == pytest.approx(0.91)


# -- graphml ---------------------------------------------------------------------------------------------
def test_graphml_loads_in_networkx_and_igraph(sample: ProjectDir, tmp_path: Path) -> None:
    import igraph
    import networkx as nx

    out = tmp_path / "g.graphml"
    export(sample, "graphml", out)
    g = graph_of(sample)
    G = nx.read_graphml(out)
    assert G.number_of_nodes() == g.vcount() and G.number_of_edges() == g.ecount()
    h = igraph.Graph.Read_GraphML(str(out))
    assert h.vcount() == g.vcount() and h.ecount() == g.ecount()
    assert sorted(h.es["kind"]) == sorted(g.es["kind"])
    ent = next(iter(store.read_jsonl(sample.entities_path)))
    node = G.nodes["entity:" + ent["id"]]
    assert node["kind"] == "entity" and node["name"] == ent["name"] and node["description"] == ent["description"]
    assert json.loads(node["source_ids"]) == ent["source_ids"]
    ch = next(iter(store.read_jsonl(sample.chunks_path)))
    assert G.nodes["chunk:" + ch["chunk_id"]]["text"] == ch["text"]
    assert G.nodes["chunk:" + ch["chunk_id"]]["order"] == ch["order"]
    weights = sorted(round(d["weight"], 6) for _, _, d in G.edges(data=True))
    assert weights == sorted(round(w, 6) for w in g.es["weight"])


def test_graphml_round_trips_directed_through_networkx(sample: ProjectDir, tricky: ProjectDir, tmp_path: Path) -> None:
    """Every edge comes back from networkx with its kind, its relation type and the model's direction; the one
    symmetric kind is named at graph level."""
    from collections import Counter

    import igraph
    import networkx as nx

    kinds: set[str] = set()
    for project in (sample, tricky):
        out = tmp_path / f"{project.root.parent.name}.graphml"
        export(project, "graphml", out)
        G = nx.read_graphml(out)
        assert G.is_directed() and G.graph["symmetric_kinds"] == "SYNONYM"
        model = load_export_graph(project)
        want = Counter((e.source, e.target, e.type, e.props.get("rel_type")) for e in model.edges)
        got = Counter((u, v, d["kind"], d.get("rel_type")) for u, v, d in G.edges(data=True))
        assert got == want and sum(got.values()) == graph_of(project).ecount()
        kinds |= {d["kind"] for _, _, d in G.edges(data=True)}
        for u, v, d in G.edges(data=True):
            if d["kind"] == "PART_OF":
                assert G.nodes[u]["kind"] == "chunk" and G.nodes[v]["kind"] == "document"
            elif d["kind"] == "MENTIONED_IN":
                assert G.nodes[u]["kind"] == "entity" and G.nodes[v]["kind"] == "chunk"
            elif d["kind"] == "NEXT_CHUNK":
                assert G.nodes[u]["order"] < G.nodes[v]["order"]
        rels = list(store.read_jsonl(project.relations_path))
        for r in rels:
            data = G.get_edge_data("entity:" + r["src"], "entity:" + r["tgt"])
            edges = list(data.values()) if G.is_multigraph() else [data]
            assert [d["kind"] for d in edges].count("RELATION") == 1
        assert igraph.Graph.Read_GraphML(str(out)).is_directed()
    assert kinds == {"PART_OF", "NEXT_CHUNK", "RELATION", "MENTIONED_IN", "SYNONYM"}
    typed = [d for _, _, d in G.edges(data=True) if d.get("rel_type")]
    assert [d["rel_type"] for d in typed] == ["lives_in"]


def test_output_dash_writes_stdout(tricky: ProjectDir, tmp_path: Path) -> None:
    for fmt in ("graphml", "cypher"):
        export(tricky, fmt, tmp_path / f"g.{fmt}")
        run = subprocess.run(HRAG + ["export", "-f", fmt, "-o", "-", "-p", str(tricky.root)], capture_output=True,
                             cwd=tmp_path, timeout=120)
        assert run.returncode == 0, run.stderr
        assert run.stdout == (tmp_path / f"g.{fmt}").read_bytes() and run.stderr == b""
    assert not (tmp_path / "-").exists()
    for args, msg in ((["-f", "jsonl", "-o", "-"], "writes a folder"), (["-f", "csv", "-o", "-"], "writes a folder"),
                      (["-f", "graphml", "-o", "-", "--json"], "choose one")):
        bad = subprocess.run(HRAG + ["export", *args, "-p", str(tricky.root)], capture_output=True, text=True,
                             cwd=tmp_path, timeout=120)
        assert bad.returncode == 2 and msg in bad.stderr
        # under --json the one thing on stdout is the failure object
        assert (json.loads(bad.stdout)["failure"]["exit_code"] == 2) if "--json" in args else bad.stdout == ""
    assert not (tmp_path / "-").exists()


def test_graphml_tricky_text(tricky: ProjectDir, tmp_path: Path) -> None:
    import igraph
    import networkx as nx

    out = tmp_path / "t.graphml"
    export(tricky, "graphml", out)
    G = nx.read_graphml(out)
    assert G.nodes["chunk:c1"]["text"] == TRICKY
    eid = "entity:" + normalize_name(TRICKY_NAME)
    assert G.nodes[eid]["name"] == TRICKY_NAME
    assert json.loads(G.nodes[eid]["aliases"]) == [TRICKY_NAME.upper(), "a;b"]
    h = igraph.Graph.Read_GraphML(str(out))
    assert h.vs.find(id="chunk:c1")["text"] == TRICKY
    assert h.vcount() == graph_of(tricky).vcount() and h.ecount() == graph_of(tricky).ecount()


# -- csv -------------------------------------------------------------------------------------------------
def _read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    return rows[0], [dict(zip(rows[0], r)) for r in rows[1:]]


def test_csv_neo4j_headers_and_counts(sample: ProjectDir, tmp_path: Path) -> None:
    export(sample, "csv", tmp_path)
    g = graph_of(sample)
    n_nodes = 0
    for label in ("Document", "Chunk", "Entity"):
        header, rows = _read_csv(tmp_path / f"nodes_{label}.csv")
        assert header[:2] == ["id:ID", ":LABEL"] and all(r[":LABEL"] == label for r in rows)
        n_nodes += len(rows)
    assert n_nodes == g.vcount()
    header, _ = _read_csv(tmp_path / "nodes_Chunk.csv")
    assert "order:int" in header and "text" in header
    header, _ = _read_csv(tmp_path / "nodes_Entity.csv")
    assert "source_ids:string[]" in header
    n_edges = 0
    for etype in set(g.es["kind"]):
        header, rows = _read_csv(tmp_path / f"rels_{etype}.csv")
        assert header[:3] == [":START_ID", ":END_ID", ":TYPE"] and "weight:float" in header
        assert all(r[":TYPE"] == etype for r in rows)
        n_edges += len(rows)
    assert n_edges == g.ecount()
    _, rows = _read_csv(tmp_path / "nodes_Entity.csv")
    ents = {"entity:" + e["id"]: e for e in store.read_jsonl(sample.entities_path)}
    for r in rows:
        assert r["name"] == ents[r["id:ID"]]["name"]
        assert r["source_ids:string[]"].split(ARRAY_DELIMITER) == ents[r["id:ID"]]["source_ids"]
    assert "--multiline-fields=true" in (tmp_path / "import.sh").read_text()


def test_csv_tricky_text(tricky: ProjectDir, tmp_path: Path) -> None:
    export(tricky, "csv", tmp_path)
    _, rows = _read_csv(tmp_path / "nodes_Chunk.csv")
    assert {r["id:ID"]: r["text"] for r in rows}["chunk:c1"] == TRICKY
    _, rows = _read_csv(tmp_path / "nodes_Entity.csv")
    ent = {r["id:ID"]: r for r in rows}["entity:" + normalize_name(TRICKY_NAME)]
    assert ent["name"] == TRICKY_NAME
    # neo4j-admin has no escape for the array delimiter inside an element: it becomes ","
    assert ent["aliases:string[]"].split(ARRAY_DELIMITER) == [TRICKY_NAME.upper(), "a,b"]


# -- cypher ----------------------------------------------------------------------------------------------
def test_cypher_script_shape(sample: ProjectDir, tmp_path: Path) -> None:
    out = tmp_path / "g.cypher"
    export(sample, "cypher", out)
    stmts = read_cypher_statements(out.read_text(encoding="utf-8"))
    assert stmts[0].startswith("CREATE INDEX FOR (n:Document) ON (n.id)")
    merges = [s for s in stmts if s.startswith("UNWIND [")]
    assert merges and all(" AS row " in s for s in merges)
    for label in ("Document", "Chunk", "Entity"):
        assert any(f"MERGE (n:{label} {{id: row.id}}) SET n += row" in s for s in merges)
    for etype in set(graph_of(sample).es["kind"]):
        assert any(f"MERGE (a)-[r:{etype}]->(b)" in s for s in merges)


def test_cypher_string_escaping() -> None:
    assert cypher_string("a'b") == "'a\\'b'"
    assert cypher_string('a"b\\c\nd\re\tf') == "'a\\\"b\\\\c\\nd\\re\\tf'"
    assert cypher_string("x\x00y 東京 😀") == "'xy 東京 😀'"
    assert "\n" not in cypher_string(TRICKY)


# -- select, errors, read-only ---------------------------------------------------------------------------
def test_select_entities_and_around(tricky: ProjectDir) -> None:
    full = load_export_graph(tricky)
    ents = select_subgraph(full, "entities")
    assert {n.label for n in ents.nodes} == {"Entity"} and len(ents.nodes) == 4
    assert {e.type for e in ents.edges} == {"RELATION", "SYNONYM"}
    around = select_subgraph(full, "entities,around:port ellery", hops=1)
    names = {n.props["name"] for n in around.nodes}
    assert names == {"Port Ellery", TRICKY_NAME, "Zoë Almqvist", "Harrowgate; Institute"}
    around0 = select_subgraph(full, "around:Port Ellery", hops=0)
    assert [n.props["name"] for n in around0.nodes] == ["Port Ellery"] and around0.edges == []
    around1 = select_subgraph(full, "around:PORT ELLERY", hops=1)
    assert {"chunk:c1", "chunk:c3"} <= {n.id for n in around1.nodes}
    assert {n.label for n in around1.nodes} == {"Entity", "Chunk"}
    by_alias = select_subgraph(full, f"entities,around:{TRICKY_NAME.upper()}", hops=0)
    assert [n.props["name"] for n in by_alias.nodes] == [TRICKY_NAME]
    with pytest.raises(UsageError, match="did you mean"):
        select_subgraph(full, "around:Port Elery")
    with pytest.raises(UsageError, match="unknown term"):
        select_subgraph(full, "documents")


def test_select_applies_to_every_format(tricky: ProjectDir, tmp_path: Path) -> None:
    summary = export(tricky, "jsonl", tmp_path, select="entities")
    assert summary["nodes"] == 4 and summary["types"] == {"RELATION": 3, "SYNONYM": 1}
    assert all(n["label"] == "Entity" for n in store.read_jsonl(tmp_path / "nodes.jsonl"))


def test_bad_usage_is_a_one_line_error(tricky: ProjectDir, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="unknown --format"):
        export(tricky, "dot", tmp_path / "x")
    with pytest.raises(UsageError, match="needs --output"):
        export(tricky, "graphml", None)
    with pytest.raises(UsageError, match="inside the project"):
        export(tricky, "jsonl", tricky.root / "out")
    with pytest.raises(UsageError, match="needs --url"):
        export(tricky, "falkordb")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        export(tricky, "csv", tmp_path / "afile")


def test_reexport_is_byte_identical_and_project_untouched(tricky: ProjectDir, tmp_path: Path) -> None:
    before = snapshot(tricky.root)
    for fmt, out in (("graphml", tmp_path / "a.graphml"), ("cypher", tmp_path / "a.cypher"),
                     ("jsonl", tmp_path / "j"), ("csv", tmp_path / "c")):
        export(tricky, fmt, out)
        first = {p.name: p.read_bytes() for p in ([out] if out.is_file() else sorted(out.iterdir()))}
        export(tricky, fmt, out)
        second = {p.name: p.read_bytes() for p in ([out] if out.is_file() else sorted(out.iterdir()))}
        assert first == second, fmt
    assert snapshot(tricky.root) == before
    assert not tricky.lock_path.exists() or tricky.lock_path.read_text() == ""


def test_cli_export_runs_while_a_writer_holds_the_lock(tricky: ProjectDir, tmp_path: Path) -> None:
    out = tmp_path / "x.graphml"
    with tricky.lock():   # a writer (say a long `hrag index`) is running: export only reads
        run = subprocess.run(HRAG + ["export", "-f", "graphml", "-o", str(out), "-p", str(tricky.root), "--json"],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["nodes"] == graph_of(tricky).vcount() and out.exists()
    bad = subprocess.run(HRAG + ["export", "-f", "graphml", "-p", str(tricky.root)], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "needs --output" in bad.stderr


def test_control_characters_do_not_break_any_format(tmp_path: Path) -> None:
    """XML 1.0 cannot hold most C0 controls (they become U+FFFD there); JSONL and CSV keep them; Cypher keeps
    them raw except NUL, which no FalkorDB string can hold."""
    import networkx as nx

    from hrag_cli.export.run import Edge, ExportGraph, Node
    from hrag_cli.export.formats import WRITERS

    text = "bell\x07 vt\x0b ff\x0c nul\x00 del\x7f end"
    graph = ExportGraph([Node("chunk:a", "Chunk", {"text": text}), Node("chunk:b", "Chunk", {"text": "b"})],
                        [Edge("chunk:a", "chunk:b", "NEXT_CHUNK", {"weight": 1.0})])
    WRITERS["graphml"](graph, tmp_path / "g.graphml")
    assert nx.read_graphml(tmp_path / "g.graphml").nodes["chunk:a"]["text"] == \
        "bell\ufffd vt\ufffd ff\ufffd nul\ufffd del\x7f end"
    WRITERS["jsonl"](graph, tmp_path / "j")
    assert next(iter(store.read_jsonl(tmp_path / "j" / "nodes.jsonl")))["text"] == text
    WRITERS["csv"](graph, tmp_path / "c")
    assert _read_csv(tmp_path / "c" / "nodes_Chunk.csv")[1][0]["text"] == text
    WRITERS["cypher"](graph, tmp_path / "g.cypher")
    stmts = read_cypher_statements((tmp_path / "g.cypher").read_text(encoding="utf-8"))
    assert any("'bell\x07 vt\x0b ff\\f nul del\x7f end'" in s for s in stmts)
