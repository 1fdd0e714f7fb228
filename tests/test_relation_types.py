"""A schema relation type travels from the extraction to relations.jsonl, the graph's RELATION edges,
every export format and the query context; a project without a schema writes what it wrote before.

The LLM runs reuse test_schema's stub answer: after strict pruning one relation is left (Mara Quint and the
Harbour Trust, two typed mentions); lenient keeps one more, untyped (Mara Quint and Selby)."""

from __future__ import annotations

import csv
import gzip
import xml.etree.ElementTree as ET
from pathlib import Path

import orjson

from hrag_cli.core import store
from hrag_cli.core.config import Settings
from hrag_cli.export.run import ExportOptions, run_export
from hrag_cli.graph.model import RELATION, load_graph
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir
from hrag_cli.query.context import build_context, relation_line
from hrag_cli.query.index import QueryIndex
from hrag_cli.query.retrieval import retrieve
from hrag_cli.core.records import Relation
from tests.test_index_e2e import D, is_gleaning, run
from tests.test_resolve import E, R, rec, resolve_records
from tests.test_schema import answer, corpus, graph, index, set_toml  # noqa: F401  (corpus: a fixture)


def relation_edges(proj: Path) -> list[tuple[str, str | None]]:
    """(relation id, rel_type attribute) of each RELATION edge of graph.pkl."""
    g, _ = load_graph(ProjectDir(proj))
    return [(e["key"], e["rel_type"]) for e in g.es if e["kind"] == RELATION]


def export(proj: Path, fmt: str, out: Path) -> Path:
    run_export(ProjectDir(proj), Settings(), Reporter("quiet"), ExportOptions(fmt=fmt, output=out))
    return out


def exported_rel_types(proj: Path, tmp: Path) -> dict[str, list]:
    """The rel_type each export format gives the RELATION edges (None: the edge has no such property)."""
    out: dict[str, list] = {}
    edges = list(store.read_jsonl(export(proj, "jsonl", tmp / "jsonl") / "edges.jsonl"))
    out["jsonl"] = sorted((e.get("rel_type") for e in edges if e["type"] == "RELATION"), key=str)

    root = ET.parse(export(proj, "graphml", tmp / "g.graphml")).getroot()
    ns = {"g": "http://graphml.graphdrawing.org/xmlns"}
    keys = {k.get("id"): k.get("attr.name") for k in root.iterfind("g:key", ns) if k.get("for") == "edge"}
    rows = [{keys[d.get("key")]: d.text for d in edge.iterfind("g:data", ns)} for edge in root.iterfind(".//g:edge", ns)]
    out["graphml"] = sorted((r.get("rel_type") for r in rows if r["kind"] == "RELATION"), key=str)

    folder = export(proj, "csv", tmp / "csv")
    rows = []
    for path in sorted(folder.glob("rels_RELATION*.csv")):
        with open(path, newline="") as fh:
            rows += list(csv.DictReader(fh))
    out["csv"] = sorted((r.get("rel_type") or None for r in rows), key=str)

    cypher = export(proj, "cypher", tmp / "g.cypher").read_text()
    out["cypher"] = [t for t in ("works_for", "lives_in") if f"rel_type: '{t}'" in cypher]
    return out


def test_schema_typed_index_carries_rel_type_everywhere(stub, corpus, tmp_path: Path) -> None:  # noqa: F811
    docs, schema, proj = corpus
    stub.set_chat(answer)
    proc = index(proj, stub, "--schema", str(schema), docs=docs)
    assert proc.returncode == 0, proc.stderr
    _, rels = graph(proj)
    assert [r["rel_type"] for r in rels] == ["works_for"]      # works_for + employed_by (re-typed): one vote
    assert relation_edges(proj) == [(rels[0]["id"], "works_for")]
    got = exported_rel_types(proj, tmp_path)
    assert got["jsonl"] == got["graphml"] == got["csv"] == ["works_for"]
    assert got["cypher"] == ["works_for"]

    set_toml(proj, '[schema]\nmode = "lenient"\n')      # Selby kept: its lives_in row is outside the schema
    assert index(proj, stub).returncode == 0
    ents, rels = graph(proj)
    ids = {name: eid for eid, name in ((e["id"], e["name"]) for e in store.read_jsonl(ProjectDir(proj).entities_path))}
    by_pair = {frozenset((r["src"], r["tgt"])): r for r in rels}
    typed = by_pair[frozenset((ids["Mara Quint"], ids["Harbour Trust of Oldport"]))]
    untyped = by_pair[frozenset((ids["Mara Quint"], ids["Selby"]))]
    assert typed["rel_type"] == "works_for"        # two typed mentions outvote none: the untyped one has no vote
    assert "rel_type" not in untyped                # an untyped relation keeps the old record shape
    assert dict(relation_edges(proj)) == {typed["id"]: "works_for", untyped["id"]: None}
    got = exported_rel_types(proj, tmp_path / "lenient")
    assert got["jsonl"] == got["graphml"] == got["csv"] == [None, "works_for"]


def test_no_schema_run_writes_no_rel_type(stub, corpus, tmp_path: Path) -> None:  # noqa: F811
    docs, _, proj = corpus

    def untyped(body: dict) -> str:
        if is_gleaning(body):
            return "<|COMPLETE|>"
        return "\n".join([f"entity{D}Mara Quint{D}person{D}A member of the trust.",
                          f"entity{D}Harbour Trust of Oldport{D}organization{D}A trust.",
                          f"relation{D}Mara Quint{D}Harbour Trust of Oldport{D}works for{D}employment{D}Works.{D}9",
                          "<|COMPLETE|>"])

    stub.set_chat(untyped)
    assert index(proj, stub, docs=docs).returncode == 0
    raw = gzip.decompress(ProjectDir(proj).relations_path.read_bytes())     # written compressed
    assert raw.count(b"\n") == 1 and b"rel_type" not in raw
    assert [t for _, t in relation_edges(proj)] == [None]
    assert exported_rel_types(proj, tmp_path)["jsonl"] == [None]


def test_relation_type_vote_most_frequent_then_smallest_text(tmp_path: Path) -> None:
    def typed(src: str, tgt: str, rel_type: str):
        r = R(src, tgt, "knows")
        r.rel_type = rel_type
        return r

    ents = [E("Ann"), E("Bo"), E("Cy")]
    out = resolve_records(tmp_path, [
        rec("c1", ents, [typed("Ann", "Bo", "mentors"), typed("Ann", "Cy", "mentors"), R("Bo", "Cy")]),
        rec("c2", ents, [typed("Bo", "Ann", "knows"), typed("Cy", "Ann", "knows"), R("Bo", "Cy")]),
        rec("c3", ents, [typed("Ann", "Bo", "knows"), R("Ann", "Cy"), R("Ann", "Cy")]),
    ])
    types = {(r.src, r.tgt): r.rel_type for r in out.relations}
    assert types == {("ann", "bo"): "knows",       # 2 against 1
                     ("ann", "cy"): "knows",       # a 1-1 tie: the smallest text; the two untyped rows: no vote
                     ("bo", "cy"): ""}             # no typed mention


def test_relation_record_json_shape_and_context_line() -> None:
    plain = Relation("r", "a", "b", ["works at"], [], "d", 1.0, ["c1"])
    assert plain.to_json() == {"id": "r", "src": "a", "tgt": "b", "predicates": ["works at"], "keywords": [],
                               "description": "d", "weight": 1.0, "source_ids": ["c1"]}
    typed = Relation("r", "a", "b", ["works at"], [], "d", 1.0, ["c1"], rel_type="works_for")
    assert orjson.loads(orjson.dumps(typed.to_json())) == {**plain.to_json(), "rel_type": "works_for"}
    line = {"src": "Ann", "tgt": "Acme", "predicates": ["works at"], "description": "She does."}
    assert relation_line(line) == "- Ann —[works at]→ Acme: She does."
    assert relation_line({**line, "rel_type": typed.rel_type}) == "- Ann —[works_for: works at]→ Acme: She does."


def test_query_context_shows_the_type_in_local_global_and_hybrid(stub, corpus) -> None:  # noqa: F811
    """A typed project indexed through every stage (builtin embedder); the LightRAG modes' relation lines
    and --json relations carry the type (keywords given, so the only model calls are the extraction's)."""
    docs, schema, proj = corpus
    stub.set_chat(answer)
    proc = run(["index", str(docs), "-p", str(proj), "--llm-model", "openai/stub-model", "--llm-api-base",
                stub.url, "--max-gleanings", "0", "--embed-model", "builtin", "--schema", str(schema)],
               inprocess=True)
    assert proc.returncode == 0, proc.stderr
    project = ProjectDir(proj)
    ix = QueryIndex(project, project.settings())
    q = "Who works for the Harbour Trust of Oldport?"
    for mode in ("local", "global", "hybrid"):
        r = retrieve(ix, q, project.settings(), mode=mode, keywords={"high": [q], "low": [q]})
        assert [x.get("rel_type") for x in r.relations] == ["works_for"], mode
        assert "—[works_for: " in build_context(r), mode
