"""Aliases: the parser reads the optional aliases field, resolution joins names through
them type-aware (aliases.plan_merges), and the aliases reach graph/merges.jsonl, the graph, an export and
`--select around:ALIAS`, end to end through the stub LLM server."""

from __future__ import annotations

import json
from pathlib import Path

from hrag_cli.core import store
from hrag_cli.resolve.aliases import plan_merges as _plan
from hrag_cli.extract.parser import merge_gleaning, parse_extraction
from hrag_cli.graph.model import load_graph
from hrag_cli.core.project import ProjectDir
from hrag_cli.core.records import ExtractedEntity, ExtractedRelation, ExtractionRecord
from tests.test_index_e2e import D, is_gleaning, passage_of, run
from tests.test_resolve import resolve_records

LLM = "llm:openai/stub-model:0123456789abcdef"
ROOT = Path(__file__).resolve().parent.parent


def plan_merges_of(records: dict[str, ExtractionRecord]):
    """plan_merges over the records as resolve streams them: in chunk_id order."""
    return _plan(records[c] for c in sorted(records))


def E(name: str, type_: str, aliases: list[str] | None = None, desc: str = "d") -> ExtractedEntity:
    return ExtractedEntity(name, type_, desc, aliases or [])


def rec(chunk_id: str, entities: list, relations: list | None = None, extractor: str = LLM) -> ExtractionRecord:
    return ExtractionRecord(chunk_id, extractor, entities, relations or [])


# ----------------------------------------------------------------------------------------------- parsing


def test_parser_reads_the_aliases_field_and_leaves_description_tails_alone() -> None:
    res = parse_extraction("\n".join([
        f"entity{D}International Business Machines{D}organization{D}A computer company.{D}IBM; Big Blue",
        f"entity{D}Irmãos Faria{D}organization{D}A glassworks.{D}Aliases: the Faria Brothers",
        f"entity{D}Zurich{D}location{D}A city.{D}none",
        f"entity{D}Ada{D}person{D}A mathematician{D}born in 1815",        # the description, split
        f"entity{D}Bea{D}person{D}A writer.{D}She lived in Paris.",         # a sentence, not names
        f"entity{D}Cy{D}person{D}A painter.",                               # the old four fields
        "<|COMPLETE|>"]))
    got = {e.name: (e.description, e.aliases) for e in res.entities}
    assert got == {
        "International Business Machines": ("A computer company.", ["IBM", "Big Blue"]),
        "Irmãos Faria": ("A glassworks.", ["the Faria Brothers"]),
        "Zurich": ("A city.", []),
        "Ada": ("A mathematician; born in 1815", []),
        "Bea": ("A writer.; She lived in Paris.", []),
        "Cy": ("A painter.", []),
    }
    # an old extraction record without the field still loads
    old = ExtractionRecord.from_json({"chunk_id": "c", "extractor": "x", "relations": [],
                                      "entities": [{"name": "A", "type": "person", "description": "d"}]})
    assert old.entities[0].aliases == []


def test_rows_of_one_entity_keep_the_union_of_their_aliases() -> None:
    first = parse_extraction(f"entity{D}IBM{D}organization{D}A company.{D}Big Blue\n<|COMPLETE|>")
    more = parse_extraction(f"entity{D}ibm{D}organization{D}A computer company.{D}I.B.M.; Big Blue\n"
                            "<|COMPLETE|>")
    [e] = merge_gleaning(first, more).entities
    assert e.name == "IBM" and e.aliases == ["Big Blue", "I.B.M."]


# ----------------------------------------------------------------------------------------------- merging


def test_two_entities_joined_by_an_alias_become_one_with_both_names(tmp_path: Path) -> None:
    res = resolve_records(tmp_path, [
        rec("c1", [E("International Business Machines", "organization", ["IBM"], "Makes computers."),
                   E("Armonk", "location")]),
        rec("c2", [E("IBM", "organization", [], "Based in Armonk."), E("Armonk", "location")],
            [ExtractedRelation("IBM", "Armonk", "is based in", [], "", 5.0)]),
        rec("c3", [E("Big Blue", "organization", ["IBM"]), E("IBM", "organization")]),
    ])
    ents = {e.id: e for e in res.entities}
    assert set(ents) == {"ibm", "armonk"}          # the key with the most rows names the merged entity
    ibm = ents["ibm"]
    assert ibm.name == "IBM" and sorted(ibm.aliases) == ["Big Blue", "International Business Machines"]
    assert ibm.source_ids == ["c1", "c2", "c3"] and ibm.type == "organization"
    [rel] = res.relations
    assert {rel.src, rel.tgt} == {"ibm", "armonk"}
    assert res.merges == [{"merged": "ibm", "type": "organization",
                           "keys": ["big blue", "ibm", "international business machines"],
                           "via": [["big blue", "ibm"], ["international business machines", "ibm"]]}]
    assert res.stats["alias_merges"] == 1 and res.stats["alias_keys_merged"] == 3


def test_a_person_and_a_place_that_share_a_name_do_not_merge(tmp_path: Path) -> None:
    res = resolve_records(tmp_path, [
        rec("c1", [E("Jordan", "person", [], "A basketball player."), E("Chicago", "location")],
            [ExtractedRelation("Jordan", "Chicago", "played in", [], "", 5.0)]),
        rec("c2", [E("Jordan", "location", ["Hashemite Kingdom of Jordan"], "A country."), E("Amman", "location")],
            [ExtractedRelation("Amman", "Jordan", "is the capital of", [], "", 5.0)]),
        rec("c3", [E("Jordan", "location", [], "Borders Israel.")]),
        # an alias naming the person from a country row is not followed: its types differ
        rec("c4", [E("Kingdom of Jordan", "location", ["Jordan"])]),
    ])
    ents = {e.id: e for e in res.entities}
    assert ents["jordan"].type == "location" and ents["jordan (person)"].type == "person"
    assert ents["jordan (person)"].name == ents["jordan"].name == "Jordan"
    assert ents["jordan (person)"].source_ids == ["c1"]
    assert ents["jordan"].source_ids == ["c2", "c3", "c4"]
    assert "Hashemite Kingdom of Jordan" in ents["jordan"].aliases and "kingdom of jordan" not in ents
    ends = {frozenset((r.src, r.tgt)) for r in res.relations}
    assert ends == {frozenset(("jordan (person)", "chicago")), frozenset(("amman", "jordan"))}
    assert {"split": "jordan", "ids": ["jordan", "jordan (person)"], "types": ["location", "person"]} in res.merges


def test_alias_chains_never_join_two_real_types_and_placeholders_join_the_main_type() -> None:
    keys = plan_merges_of({
        "c1": rec("c1", [E("Mercury", "person", ["Freddie"])]),
        "c2": rec("c2", [E("Mercury", "person")]),
        "c3": rec("c3", [E("Freddie", "unknown", ["Mercury"])]),     # a placeholder takes the main type
        "c4": rec("c4", [E("Mercury", "concept", ["Hg"])]),
        "c5": rec("c5", [E("Hg", "concept", ["Freddie"])]),           # would chain a concept to a person
        "c6": rec("c6", [E("Hg", "concept")]),
    })
    assert keys.entity_id("freddie", "unknown") == keys.entity_id("mercury", "person") == "mercury"
    assert keys.entity_id("mercury") == "mercury"                        # an endpoint: the main type
    assert keys.entity_id("hg", "concept") == keys.entity_id("mercury", "concept") == "hg"
    assert keys.refused == 1
    # an endpoint written with an alias that is never a name of its own joins the entity
    keys = plan_merges_of({"c1": rec("c1", [E("Big Blue", "organization", ["IBM"])])})
    assert keys.entity_id("ibm") == "big blue"


def test_an_endpoint_written_with_an_alias_lands_on_its_own_chunk_entity(tmp_path: Path) -> None:
    # "the Trust" names two organizations in two chunks: globally ambiguous, locally clear
    res = resolve_records(tmp_path, [
        rec("c1", [E("Oldport Harbour Trust", "organization", ["the Trust"]), E("Mara Quint", "person")],
            [ExtractedRelation("Mara Quint", "the Trust", "works for", [], "", 5.0)]),
        rec("c2", [E("Selby Lamp Trust", "organization", ["the Trust"]), E("Odo Brisk", "person")],
            [ExtractedRelation("Odo Brisk", "the Trust", "works for", [], "", 5.0)]),
    ])
    assert {frozenset((r.src, r.tgt)) for r in res.relations} == {
        frozenset(("mara quint", "oldport harbour trust")), frozenset(("odo brisk", "selby lamp trust"))}
    assert "the trust" not in {e.id for e in res.entities}


def test_prune_types_an_endpoint_by_its_own_name_before_another_entity_alias() -> None:
    from hrag_cli.extract.schema import load_schema
    from hrag_cli.extract.prune import PruneSpec, prune_record

    schema = load_schema(ROOT / "sample_corpus" / "schema.toml")
    text = "Kelmarsh is a town. Anna Kelmarsh, whom the crew called Kelmarsh, farmed near the Calder Inn."
    for order in (1, -1):      # the person's row before the town's, and after it
        ents = [E("Kelmarsh", "place"), E("Anna Kelmarsh", "person", ["Kelmarsh"]), E("Calder Inn", "organization")]
        rec_ = rec("c1", ents[::order], [ExtractedRelation("Calder Inn", "Kelmarsh", "is in", [], "", 5.0,
                                                           rel_type="located_in")])
        pruned = prune_record(rec_, text, PruneSpec(schema, "strict", "drop"))
        assert len(pruned.record.relations) == 1 and not pruned.counts.get("relations_dropped")


def test_a_split_name_whose_main_type_joined_another_name_keeps_its_minor_type_apart() -> None:
    keys = plan_merges_of({
        "c1": rec("c1", [E("Mercury", "person", ["Freddie"])]),
        "c2": rec("c2", [E("Mercury", "person")]),
        "c3": rec("c3", [E("Freddie", "person")]),
        "c4": rec("c4", [E("Freddie", "person")]),
        "c5": rec("c5", [E("Freddie", "person")]),
        "c6": rec("c6", [E("Mercury", "concept")]),
    })
    assert keys.entity_id("mercury", "person") == keys.entity_id("freddie", "person") == "freddie"
    assert keys.entity_id("mercury") == "freddie"                    # an endpoint: the main type's entity
    assert keys.entity_id("mercury", "concept") == "mercury"


def test_rules_types_split_nothing_so_offline_graphs_do_not_change() -> None:
    keys = plan_merges_of({"c1": rec("c1", [E("Charlemagne", "person")], extractor="rules-v3"),
                        "c2": rec("c2", [E("Charlemagne", "location")], extractor="rules-v3")})
    assert keys.entity_id("charlemagne", "person") == keys.entity_id("charlemagne", "location") == "charlemagne"
    assert keys.report() == [] and not keys.node_ids


# ----------------------------------------------------------------------------------------------- end to end

DOCS = {
    "a.txt": "International Business Machines (IBM) opened a laboratory in Zurich. Jordan, the basketball "
             "player, visited the laboratory in Zurich.",
    "b.txt": "IBM hired Ada Byron in Armonk. Jordan is a country in the Middle East; its capital is Amman.",
}
ANSWERS = {
    "a.txt": [f"entity{D}International Business Machines{D}organization{D}A company with a laboratory.{D}IBM",
              f"entity{D}Zurich{D}location{D}City of the laboratory.",
              f"entity{D}Jordan{D}person{D}A basketball player who visited the laboratory.",
              f"relation{D}International Business Machines{D}Zurich{D}opened a laboratory in{D}research{D}"
              f"IBM has a laboratory in Zurich.{D}8",
              f"relation{D}Jordan{D}Zurich{D}visited{D}visit{D}Jordan visited Zurich.{D}4"],
    "b.txt": [f"entity{D}IBM{D}organization{D}A company that hired Ada Byron.",
              f"entity{D}Ada Byron{D}person{D}Hired by IBM.",
              f"entity{D}Armonk{D}location{D}Where Ada Byron was hired.",
              f"entity{D}Jordan{D}location{D}A country in the Middle East.",
              f"entity{D}Amman{D}location{D}Capital of Jordan.",
              f"relation{D}IBM{D}Ada Byron{D}hired{D}employment{D}IBM hired Ada Byron.{D}8",
              f"relation{D}Amman{D}Jordan{D}is the capital of{D}geography{D}Amman is Jordan's capital.{D}9"],
}


def scripted(body: dict) -> str:
    if is_gleaning(body):
        return "<|COMPLETE|>"
    passage = passage_of(body)
    for name, text in DOCS.items():
        if text in passage:
            return "\n".join([*ANSWERS[name], "<|COMPLETE|>"])
    return "<|COMPLETE|>"


def test_aliases_reach_the_graph_an_export_and_select_around_alias(stub, tmp_path: Path) -> None:
    stub.set_chat(scripted)
    docs, proj = tmp_path / "docs", tmp_path / "proj"
    docs.mkdir()
    for name, text in DOCS.items():
        (docs / name).write_text(text)
    proc = run(["index", str(docs), "-p", str(proj), "--llm-model", "openai/stub-model", "--llm-api-base",
                stub.url, "--stop-after", "resolve", "--json"], inprocess=True)
    assert proc.returncode == 0, proc.stderr

    project = ProjectDir(proj)
    ents = {e["id"]: e for e in store.read_jsonl(project.entities_path)}
    assert "international business machines" not in ents
    assert ents["ibm"]["aliases"] == ["International Business Machines"]
    assert ents["jordan"]["type"] == "location" and ents["jordan (person)"]["type"] == "person"
    merges = list(store.read_jsonl(project.merges_path))
    assert {"merged": "ibm", "type": "organization", "keys": ["ibm", "international business machines"],
            "via": [["international business machines", "ibm"]]} in merges

    g, index = load_graph(project)
    assert g.vs[index["ibm"]]["aliases"] == ["International Business Machines"]
    assert g.vs[index["zurich"]]["aliases"] == []

    out = tmp_path / "export"
    proc = run(["export", "-p", str(proj), "--format", "jsonl", "-o", str(out),
                "--select", "entities,around:International Business Machines"], inprocess=True)
    assert proc.returncode == 0, proc.stderr
    nodes = {n["id"]: n for n in store.read_jsonl(out / "nodes.jsonl")}
    assert nodes["entity:ibm"]["aliases"] == ["International Business Machines"]
    assert set(nodes) == {"entity:ibm", "entity:zurich", "entity:ada byron"}   # one hop from the alias

    for fmt, target in (("graphml", tmp_path / "g.graphml"), ("csv", tmp_path / "csv"),
                        ("cypher", tmp_path / "g.cypher")):
        proc = run(["export", "-p", str(proj), "--format", fmt, "-o", str(target), "--select", "entities"],
                   inprocess=True)                       # entities only: no chunk text holds the name
        assert proc.returncode == 0, proc.stderr
        files = [target] if target.is_file() else sorted(target.iterdir())
        assert any("International Business Machines" in f.read_text() for f in files), fmt

    status = json.loads(run(["status", "-p", str(proj), "--json"], inprocess=True).stdout)
    assert status["stages"]["resolve"]["counts"]["alias_merges"] == 1
    assert status["stages"]["resolve"]["counts"]["type_splits"] == 1
    assert status["merged_names"] == ["ibm <- ibm + international business machines",
                                      "jordan: split into jordan / jordan (person)"]
    plain = run(["status", "-p", str(proj)], inprocess=True).stdout
    assert "merged_names: ibm <- ibm + international" in plain
