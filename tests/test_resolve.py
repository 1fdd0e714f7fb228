"""Resolve: merge rules on hand-written records, the stage on a hand-built project, and incremental ==
from-scratch on the sample corpus through the real `hrag index` pipeline."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hrag_cli.core import store
from hrag_cli.core.config import Settings
from hrag_cli.graph.model import load_graph
from hrag_cli.core.normalize import clean_surface, normalize_name
from hrag_cli.core.project import ProjectDir
from hrag_cli.core.records import (
    Chunk, Document, Entity, ExtractedEntity, ExtractedRelation, ExtractionRecord, Fact, Relation, from_dict,
    to_dict)
from hrag_cli.resolve.stage import UNKNOWN, finalize, merge_records, run_resolve, settings_fingerprint
from hrag_cli.resolve.summaries import Summarizer

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_corpus"


def E(name: str, type_: str = "person", desc: str = "") -> ExtractedEntity:
    return ExtractedEntity(name, type_, desc)


def R(src: str, tgt: str, pred: str = "related to", kws: list[str] | None = None, desc: str = "",
      strength: float = 1.0) -> ExtractedRelation:
    return ExtractedRelation(src, tgt, pred, kws or [], desc, strength)


def rec(chunk_id: str, entities: list, relations: list | None = None) -> ExtractionRecord:
    return ExtractionRecord(chunk_id, "test", entities, relations or [])


def resolve_records(tmp_path: Path, records: list[ExtractionRecord], settings: Settings | None = None):
    settings = settings or Settings()
    latest = {r.chunk_id: r for r in records}
    res = finalize(merge_records(lambda: (latest[c] for c in sorted(latest))), Summarizer(ProjectDir(tmp_path), settings))
    res.facts = list(res.facts)
    return res


def by_id(items):
    return {x.id: x for x in items}


# ----------------------------------------------------------------------------------------------- names


@pytest.mark.parametrize("raw,expected", [
    ("Zürich", "zürich"), ("  ZÜRICH  ", "zürich"), ("東京", "東京"), ("Łódź", "łódź"), ("\"Łódź\"", "łódź"),
    ("«Paris»", "paris"), ("ＡＢＣ Corp", "abc corp"), ("Straße", "strasse"), ("New\n  York", "new york"),
    ("C++", "c++"), ("Foo (band)", "foo (band)"), ("(Foo)", "foo"), ("U.S.", "u.s"), ("-40 °C", "-40 °c"),
    ("!!!", "!!!"), ("(*)", "(*)"), ("*NSYNC", "nsync"), ("", ""), ("  ", ""),
])
def test_normalize_name(raw: str, expected: str) -> None:
    assert normalize_name(raw) == expected


def test_clean_surface_keeps_case_and_inner_punctuation() -> None:
    assert clean_surface(' "U.S."  ') == "U.S."
    assert clean_surface("東京") == "東京"
    assert clean_surface("Łódź") == "Łódź"


# ----------------------------------------------------------------------------------------------- entities


def test_entity_merge_rules(tmp_path: Path) -> None:
    res = resolve_records(tmp_path, [
        rec("c1", [E("Ada Lovelace", "person", "Wrote the first program."), E("Analytical Engine", "artifact", "A machine.")]),
        rec("c2", [E("ada lovelace", "person", "Wrote the first program."), E("Analytical Engine", "concept", "A design.")]),
        rec("c3", [E("Ada Lovelace", "writer", "  Daughter of Byron. "), E("Analytical Engine", "unknown", "")]),
        rec("c4", [E("'Ada Lovelace'", "unknown", "")]),
    ])
    ents = by_id(res.entities)
    assert set(ents) == {"ada lovelace", "analytical engine"}
    ada = ents["ada lovelace"]
    assert ada.name == "Ada Lovelace"                 # most frequent surface form (quotes removed)
    assert ada.aliases == ["ada lovelace"]
    assert ada.type == "person"                       # 2 votes beat 1; "unknown" never wins over a real type
    # de-duplicated, sorted, joined with the separator
    assert ada.description == "Daughter of Byron. | Wrote the first program."
    assert ada.source_ids == ["c1", "c2", "c3", "c4"]
    eng = ents["analytical engine"]
    assert eng.type == "artifact"                     # 1-1 tie between real types: smallest text wins
    assert eng.description == "A design. | A machine."


def test_type_tie_is_order_independent(tmp_path: Path) -> None:
    a = resolve_records(tmp_path, [rec("c1", [E("X", "beta")]), rec("c2", [E("X", "alpha")])])
    b = resolve_records(tmp_path, [rec("c1", [E("X", "alpha")]), rec("c2", [E("X", "beta")])])
    assert a.entities[0].type == b.entities[0].type == "alpha"
    only_unknown = resolve_records(tmp_path, [rec("c1", [E("Y", "unknown")]), rec("c2", [E("Y", "")])])
    assert only_unknown.entities[0].type == UNKNOWN


def test_unicode_names_merge_and_survive(tmp_path: Path) -> None:
    res = resolve_records(tmp_path, [
        rec("c1", [E("Zürich", "location", "Swiss city."), E("東京", "location", "Capital of Japan."),
                   E("Łódź", "location", "Polish city.")],
            [R("Zürich", "東京", "is twinned with", strength=2)]),
        rec("c2", [E("ZÜRICH", "location", "Largest Swiss city."), E("「東京」", "location", "Capital of Japan."),
                   E("ŁÓDŹ", "location")],
            [R("東京", "Łódź", "trades with", strength=3)]),
    ])
    ents = by_id(res.entities)
    assert set(ents) == {"zürich", "東京", "łódź"}
    assert ents["東京"].name == "東京" and ents["東京"].description == "Capital of Japan."
    assert ents["zürich"].name in ("Zürich", "ZÜRICH") and len(ents["zürich"].aliases) == 1
    assert ents["łódź"].source_ids == ["c1", "c2"]
    assert {(r.src, r.tgt) for r in res.relations} == {("zürich", "東京"), ("łódź", "東京")}
    assert {f.subject for f in res.facts} == {"Zürich", "東京"}


# ----------------------------------------------------------------------------------------------- relations


def test_relation_merge_rules(tmp_path: Path) -> None:
    res = resolve_records(tmp_path, [
        rec("c1", [E("Acme", "organization"), E("Bob")],
            [R("Bob", "Acme", "works for", ["Employment", "career"], "Bob works at Acme.", 7),
             R("Acme", "Acme", "owns", [], "self", 5)]),
        rec("c2", [E("Acme", "organization"), E("Bob")],
            [R("Acme", "Bob", "employs", ["employment", "hiring"], "Acme employs Bob.", 2.5),
             R("Bob", "Acme", "works   for", ["career"], "Bob works at Acme.", 1)]),
        rec("c3", [E("Bob")], [R("Bob", "Globex", "applied to", ["jobs"], "Bob applied to Globex.", 4)]),
    ])
    rels = {(r.src, r.tgt): r for r in res.relations}
    assert set(rels) == {("acme", "bob"), ("bob", "globex")}     # one per unordered pair; self-loop dropped
    ab = rels[("acme", "bob")]
    assert ab.weight == pytest.approx(10.5)                     # 7 + 2.5 + 1
    assert ab.predicates == ["employs", "works for"]            # unioned, whitespace collapsed, sorted
    assert ab.keywords == ["career", "Employment", "hiring"]    # case-insensitive union, sorted
    assert ab.description == "Acme employs Bob. | Bob works at Acme."
    assert ab.source_ids == ["c1", "c2"]
    assert res.stats["self_loops_dropped"] == 1
    # an endpoint never extracted as an entity becomes an UNKNOWN entity
    globex = by_id(res.entities)["globex"]
    assert globex.type == UNKNOWN and globex.name == "Globex" and globex.source_ids == ["c3"]
    assert res.stats["unknown_entities"] == 1
    # relation ids: hash of the sorted pair, stable
    again = resolve_records(tmp_path, [rec("c9", [], [R("acme", "BOB")])])
    assert again.relations[0].id == ab.id


def test_facts_keep_direction_and_link_relation(tmp_path: Path) -> None:
    res = resolve_records(tmp_path, [
        rec("c1", [E("Bob"), E("Acme", "organization")],
            [R("Bob", "Acme", "works for", strength=2), R("Acme", "Bob", "employs", strength=3)]),
        rec("c2", [E("Bob"), E("Acme", "organization")], [R("bob", "ACME", "Works for", strength=1)]),
        rec("c3", [], [R("Bob", "Acme", "works for")]),
    ])
    rel = res.relations[0]
    facts = {(f.subject, f.predicate, f.object): f for f in res.facts}
    assert set(facts) == {("Bob", "works for", "Acme"), ("Acme", "employs", "Bob")}
    wf = facts[("Bob", "works for", "Acme")]
    assert wf.source_ids == ["c1", "c2", "c3"] and wf.relation_id == rel.id   # predicate: most frequent spelling
    assert wf.text == "(Bob, works for, Acme)"
    assert facts[("Acme", "employs", "Bob")].source_ids == ["c1"]
    assert len({f.id for f in res.facts}) == 2


def test_mentions_count_rows_and_endpoints(tmp_path: Path) -> None:
    res = resolve_records(tmp_path, [
        rec("c1", [E("Bob"), E("Acme")], [R("Bob", "Acme"), R("Bob", "Carol"), R("Bob", "Bob")]),
    ])
    mentions = {(c, e): n for c, e, n in res.mentions}
    # Bob: 1 entity row + 2 relation endpoints + 1 self-loop row (named once) = 4
    assert mentions == {("c1", "bob"): 4, ("c1", "acme"): 2, ("c1", "carol"): 1}


def test_no_llm_long_descriptions_keep_most_frequent_within_budget(tmp_path: Path) -> None:
    settings = Settings()
    settings.resolve.summary_min_fragments = 3
    settings.resolve.summary_target_tokens = 13
    records = [rec(f"c{i}", [E("Bob", "person", d)]) for i, d in enumerate(
        ["Rare fact one about Bob.", "Common fact.", "Common fact.", "Common fact.", "Second fact.",
         "Second fact.", "Zeta fact.", "Alpha fact."])]
    bob = resolve_records(tmp_path, records, settings).entities[0]
    # most frequent first, ties by text, whole fragments while they fit 13 tokens
    assert bob.description.startswith("Common fact. | Second fact. | Alpha fact.")
    assert "Rare fact one" not in bob.description
    # below the thresholds everything is kept, sorted
    settings.resolve.summary_min_fragments = 100
    settings.resolve.summary_max_input_tokens = 10_000
    bob = resolve_records(tmp_path, records, settings).entities[0]
    assert bob.description.split(" | ") == sorted({"Rare fact one about Bob.", "Common fact.", "Second fact.",
                                                   "Zeta fact.", "Alpha fact."})


def test_settings_fingerprint_tracks_what_shapes_output() -> None:
    s = Settings()
    base = settings_fingerprint(s)
    s.llm.concurrency = 1            # not output-shaping
    s.llm.context_tokens = 999       # only matters with an LLM
    assert settings_fingerprint(s) == base
    s.resolve.description_separator = "; "
    assert settings_fingerprint(s) != base
    s2 = Settings()
    s2.llm.model = "openai/stub-model"
    fp_model = settings_fingerprint(s2)
    assert fp_model != base
    s2.llm.context_tokens = 999
    assert settings_fingerprint(s2) != fp_model


# ----------------------------------------------------------------------------------------------- the stage


def write_project(root: Path, docs: dict[str, list[tuple[str, ExtractionRecord | None]]]) -> ProjectDir:
    """docs: path -> [(chunk text, its extraction record or None)], written through the store helpers."""
    from hrag_cli.core.project import text_hash

    project = ProjectDir(root)
    project.init()
    doc_rows, chunk_rows = [], []
    ext = store.JsonlAppender(project.extractions_path)
    for path, chunks in docs.items():
        doc_id = text_hash("doc:" + path)
        doc_rows.append(to_dict(Document(doc_id, path, text_hash(path), 10, len(chunks))))
        for order, (text, record) in enumerate(chunks):
            cid = text_hash(text)
            chunk_rows.append(to_dict(Chunk(cid, doc_id, order, 5, text)))
            if record is not None:
                record.chunk_id = cid
                ext.append(record.to_json())
    ext.close()
    store.write_jsonl(project.docs_path, doc_rows)
    store.write_jsonl(project.chunks_path, chunk_rows)
    return project


def test_run_resolve_writes_artifacts_and_counts(tmp_path: Path) -> None:
    project = write_project(tmp_path / "p", {
        "a.txt": [("alpha", rec("", [E("Bob", "person", "A man.")], [R("Bob", "Acme", "works for", ["job"], "d", 3)])),
                  ("beta", rec("", [E("Acme", "organization", "A firm.")]))],
        "b.txt": [("gamma", rec("", [E("bob", "person", "A man.")]))],
    })
    settings = Settings()
    out = run_resolve(project, settings)
    c = out.counts
    assert (c["entities"], c["relations"], c["facts"]) == (2, 1, 1)
    assert c["vertices"] == 2 + 3 + 2
    assert (c["edges_part_of"], c["edges_next_chunk"], c["edges_relation"], c["edges_mentioned_in"]) == (3, 1, 1, 4)
    assert c["edges"] == 9 and c["summaries_llm_calls"] == 0
    ents = [from_dict(Entity, e) for e in store.read_jsonl(project.entities_path)]
    assert [e.id for e in ents] == ["acme", "bob"] and len(ents[1].source_ids) == 2
    rels = [from_dict(Relation, r) for r in store.read_jsonl(project.relations_path)]
    facts = [from_dict(Fact, f) for f in store.read_jsonl(project.facts_path)]
    assert facts[0].relation_id == rels[0].id
    g, keys = load_graph(project)
    assert g.vcount() == 7 and keys["bob"] >= 5
    # pure function: a second run gives the same digest
    assert run_resolve(project, settings).output_digest == out.output_digest


def test_resolve_ignores_records_of_chunks_no_longer_current(tmp_path: Path) -> None:
    project = write_project(tmp_path / "p", {"a.txt": [("alpha", rec("", [E("Bob")]))]})
    stale = rec("deadbeef", [E("Ghost")])
    with store.JsonlAppender(project.extractions_path) as ap:
        ap.append(stale.to_json())
    run_resolve(project, Settings())
    assert [e["id"] for e in store.read_jsonl(project.entities_path)] == ["bob"]


def test_records_stream_latest_usable_in_chunk_id_order(tmp_path: Path) -> None:
    """Resolve reads records one at a time: each current chunk's latest record, in chunk_id order; a later
    failed record hides an earlier good one, and another extractor's or a gone chunk's records never count."""
    from hrag_cli.extract.stage import iter_current_extractions

    project = write_project(tmp_path / "p", {"a.txt": [(t, rec("", [E(t.title())])) for t in
                                                        ("alpha", "beta", "gamma", "delta")]})
    cids = {r["text"]: r["chunk_id"] for r in store.read_jsonl(project.chunks_path)}
    newer = rec(cids["alpha"], [E("Alpha Two")])
    failed = rec(cids["beta"], [E("Beta Two")])
    failed.status = "failed"
    other = ExtractionRecord(cids["gamma"], "another", [E("Nobody")], [])
    with store.JsonlAppender(project.extractions_path) as ap:
        for r in (newer, failed, other, rec("deadbeef", [E("Ghost")])):
            ap.append(r.to_json())
    got = list(iter_current_extractions(project))
    assert [r.chunk_id for r in got] == sorted(cids[t] for t in ("alpha", "gamma", "delta"))
    assert {r.entities[0].name for r in got} == {"Alpha Two", "Gamma", "Delta"}
    assert merge_records(lambda: iter_current_extractions(project)).records == 3


def test_a_record_with_aliases_after_plain_ones_starts_the_merge_over_planned(tmp_path: Path) -> None:
    """Plain records merge in one pass; an alias further on makes merge_records plan and merge again."""
    records = [rec("c1", [E("IBM", "organization")]),
               rec("c2", [ExtractedEntity("Big Blue", "organization", "", ["IBM"])])]
    merged = merge_records(lambda: iter(records))
    assert sorted(merged.entities) == ["big blue"] and merged.records == 2
    assert merge_records(lambda: iter(records[:1])).keys.entity_id("ibm") == "ibm"


# ----------------------------------------------------------------------------------------------- incremental


def _cli(args: list[str]) -> None:
    from typer.testing import CliRunner

    from hrag_cli.cli import app

    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output


def _index(docs: Path, project: Path) -> None:
    # small chunks: several per document, so NEXT_CHUNK edges and shifted chunk orders are exercised too
    _cli(["index", str(docs), "-p", str(project), "--stop-after", "resolve", "--quiet",
          "--chunk-tokens", "120", "--chunk-overlap", "10"])


def _graph_state(project: Path) -> dict:
    g, _ = load_graph(ProjectDir(project))
    vertices = {(v["kind"], v["key"], v["path"], v["doc_id"], v["order"], v["name"], v["type"]) for v in g.vs}
    keys = g.vs["key"]
    edges = sorted((e["kind"], *sorted((keys[e.source], keys[e.target])), e["weight"], e["key"] or "") for e in g.es)
    files = {name: sorted(store.read_jsonl(getattr(ProjectDir(project), name)), key=lambda r: r["id"])
             for name in ("entities_path", "relations_path", "facts_path")}
    return {"vertices": vertices, "edges": edges, "files": files}


def test_incremental_equals_from_scratch(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    inc = tmp_path / "inc"
    _index(docs, inc)
    before = _graph_state(inc)
    assert any(e[0] == "NEXT_CHUNK" for e in before["edges"])
    # an entity that only the deleted document names
    victim = docs / "people" / "zoe_almqvist.txt"
    only_there = {e["id"] for e in before["files"]["entities_path"]
                  if all(src in _chunks_of(inc, "people/zoe_almqvist.txt") for src in e["source_ids"])}
    assert only_there, "the deleted document should name at least one entity nobody else names"

    # a rename alone changes no chunk text and no extraction, yet the document vertex must follow
    (docs / "orgs" / "corvane_works.txt").rename(docs / "orgs" / "corvane.txt")
    _index(docs, inc)
    _index(docs, tmp_path / "scratch0")
    renamed = _graph_state(inc)
    assert renamed == _graph_state(tmp_path / "scratch0")
    assert "orgs/corvane.txt" in {v[2] for v in renamed["vertices"]}

    victim.unlink()                                                         # delete
    miravel = docs / "places" / "miravel.txt"                               # change (at the start: orders shift)
    miravel.write_text("Miravel also hosts the Quillon Fair, run by Edric Solano.\n\n"
                       + miravel.read_text(encoding="utf-8"), encoding="utf-8")
    (docs / "new_note.txt").write_text(                                     # add
        "Hana Okafor visited Port Ellery in 2001 with the Lantern Archive.\n", encoding="utf-8")
    _index(docs, inc)

    scratch = tmp_path / "scratch"
    _index(docs, scratch)
    after_inc, after_scratch = _graph_state(inc), _graph_state(scratch)
    assert after_inc["vertices"] == after_scratch["vertices"]
    assert after_inc["edges"] == after_scratch["edges"]
    assert after_inc["files"] == after_scratch["files"]
    remaining = {e["id"] for e in after_inc["files"]["entities_path"]}
    assert not (only_there & remaining)
    assert before["vertices"] != after_inc["vertices"]


def _chunks_of(project: Path, rel_path: str) -> set[str]:
    p = ProjectDir(project)
    doc_ids = {d["doc_id"] for d in store.read_jsonl(p.docs_path) if d["path"] == rel_path}
    return {c["chunk_id"] for c in store.read_jsonl(p.chunks_path) if c["doc_id"] in doc_ids}


def test_damaged_rows_are_skipped_not_fatal(tmp_path: Path) -> None:
    bad = rec("c1", [E(None, None, None), E("Bob", "person", "ok"), E("   ", "person", "blank")],  # type: ignore[arg-type]
              [R("Bob", "Acme", None, "single keyword", None, "nan"),  # type: ignore[arg-type]
               R("Bob", "Acme", "pays", ["x", None], "", float("inf")),  # type: ignore[list-item]
               R(None, "Acme")])  # type: ignore[arg-type]
    res = resolve_records(tmp_path, [bad])
    assert {e.id for e in res.entities} == {"bob", "acme"}
    rel = res.relations[0]
    assert rel.weight == 2.0 and rel.keywords == ["single keyword", "x"] and rel.predicates == ["pays"]
    assert res.stats["dropped_rows"] == 3
    assert sorted(f.predicate for f in res.facts) == ["pays", "related to"]


def test_empty_project_resolves_to_an_empty_graph(tmp_path: Path) -> None:
    project = ProjectDir(tmp_path / "p")
    project.init()
    out = run_resolve(project, Settings())
    assert out.counts["entities"] == 0 and out.counts["vertices"] == 0 and out.counts["edges"] == 0
    g, keys = load_graph(project)
    assert g.vcount() == 0 and keys == {}


def test_resolve_marks_synonyms_stale_even_with_an_unchanged_digest(tmp_path: Path) -> None:
    # resolve rewrites graph.pkl without SYNONYM edges; if the synonyms stage stayed recorded, its fingerprint
    # (built from resolve's digest, unchanged here) would call it fresh and the edges would never come back
    project = write_project(tmp_path / "p", {"a.txt": [("alpha", rec("", [E("Bob")]))]})
    first = run_resolve(project, Settings())
    project.record_stage("synonyms", "fp", "digest", {"synonym_pairs": 1})
    again = run_resolve(project, Settings())
    assert again.output_digest == first.output_digest
    assert project.stage("synonyms") is None


def test_non_string_names_in_a_damaged_record_are_dropped_not_a_crash(tmp_path: Path) -> None:
    raw = {"chunk_id": "c1", "extractor": "x",
           "entities": [{"name": ["Bob"], "type": "person", "description": ""},
                        {"name": "Al", "type": "person", "description": ""}],
           "relations": [{"src": {"x": 1}, "tgt": "Al", "predicate": "p", "keywords": [], "description": ""}]}
    res = resolve_records(tmp_path, [ExtractionRecord.from_json(raw)])
    assert [e.id for e in res.entities] == ["al"] and res.relations == []
    assert res.stats["dropped_rows"] == 2
