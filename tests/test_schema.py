"""The schema file, schema-guided extraction, the prune step and grounding verification.

The LLM runs go through the stub server with a scripted answer for one known chunk: an entity of a synonym
type ("company"), one of a type outside the schema ("city"), one name the chunk never mentions, and relations
that fit, break or have no pattern, so every count below is exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hrag_cli.core import store
from hrag_cli.core.config import Settings
from hrag_cli.core.errors import UsageError
from hrag_cli.extract.grounding import Grounder
from hrag_cli.extract.schema import load_schema
from hrag_cli.extract.stage import settings_fingerprint
from hrag_cli.core.project import ProjectDir
from hrag_cli.extract.prune import PruneSpec, prune_record
from hrag_cli.core.records import ExtractedEntity, ExtractedRelation, ExtractionRecord
from tests.test_index_e2e import CHAT, D, is_gleaning, passage_of, run, summary

SCHEMA = """\
[entities.person]
description = "A human being."
[entities.organization]
description = "A company, institute, agency or society."
synonyms = ["company"]
[relations.works_for]
description = "A person is employed by or leads an organization."
patterns = [["person", "organization"]]
synonyms = ["employed_by"]
"""
TEXT = "Mara Quint works for the Harbour Trust of Oldport. She lives in Selby."


def answer(body: dict) -> str:
    """The model's answer for TEXT: typed relation rows (the schema prompt's format)."""
    if is_gleaning(body):
        return "<|COMPLETE|>"
    assert passage_of(body) == TEXT
    return "\n".join([
        f"entity{D}Mara Quint{D}person{D}A member of the Harbour Trust of Oldport.",
        f"entity{D}Harbour Trust of Oldport{D}company{D}The trust Mara Quint works for.",
        f"entity{D}Selby{D}city{D}Where Mara Quint lives.",
        f"entity{D}Quentin Marsh{D}person{D}A colleague the passage never names.",
        f"relation{D}Mara Quint{D}Harbour Trust of Oldport{D}works_for{D}works for{D}employment{D}Mara works there.{D}9",
        f"relation{D}Mara Quint{D}Harbour Trust of Oldport{D}employed_by{D}is employed by{D}employment{D}Same.{D}8",
        f"relation{D}Harbour Trust of Oldport{D}Mara Quint{D}works_for{D}employs{D}employment{D}Backwards.{D}7",
        f"relation{D}Mara Quint{D}Selby{D}lives_in{D}lives in{D}home{D}Mara lives in Selby.{D}5",
        f"relation{D}Quentin Marsh{D}Mara Quint{D}works_for{D}works with{D}colleagues{D}Invented.{D}4",
        "<|COMPLETE|>",
    ])


STRICT = {"entities_retyped": 1, "entities_dropped": 1, "ungrounded": 1, "relations_retyped": 1,
          "relations_dropped": 1, "relations_dropped_with_entity": 2}
LENIENT = {"entities_retyped": 1, "entities_unknown": 1, "ungrounded": 1, "relations_retyped": 1,
           "relations_untyped": 2, "relations_dropped_with_entity": 1}
PRUNE_KEYS = set(STRICT) | set(LENIENT)


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, Path, Path]:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text(TEXT)
    schema = tmp_path / "schema.toml"
    schema.write_text(SCHEMA)
    return docs, schema, tmp_path / "proj"


def index(proj: Path, stub, *extra: str, docs: Path | None = None):
    args = ["index", *([str(docs)] if docs else []), "-p", str(proj), "--llm-model", "openai/stub-model",
            "--llm-api-base", stub.url, "--max-gleanings", "0", "--stop-after", "resolve", "--json", *extra]
    return run(args, inprocess=True)


def prune_counts(proc) -> dict:
    return {k: v for k, v in summary(proc)["prune"].items() if k in PRUNE_KEYS}


def graph(proj: Path) -> tuple[dict[str, str], list[dict]]:
    p = ProjectDir(proj)
    ents = {e["name"]: e["type"] for e in store.read_jsonl(p.entities_path)}
    return ents, list(store.read_jsonl(p.relations_path))


def set_toml(proj: Path, text: str) -> None:
    (proj / "hrag.toml").write_text(text)


# ------------------------------------------------------------------------------------------ schema file


def test_issue_toml_form_and_json_read_alike(tmp_path: Path) -> None:
    toml = tmp_path / "s.toml"
    toml.write_text(SCHEMA)
    as_json = tmp_path / "s.json"
    as_json.write_text(json.dumps({
        "entities": {"person": {"description": "A human being."},
                     "organization": {"description": "A company, institute, agency or society.",
                                      "synonyms": ["company"]}},
        "relations": {"works_for": {"description": "A person is employed by or leads an organization.",
                                    "patterns": [["person", "organization"]], "synonyms": ["employed_by"]}}}))
    a, b = load_schema(toml), load_schema(as_json)
    assert a.entity_names == ["person", "organization"] and a.fingerprint == b.fingerprint
    assert a.relations[0].patterns == (("person", "organization"),)
    # by name or synonym, singular or plural, British spelling
    assert [a.entity_type(t) for t in ("Persons", "companies", "Organisations", "PEOPLE", "city", "")] == \
        ["person", "organization", "organization", "person", None, None]
    assert a.relation_type("Employed By").name == "works_for" and a.relation_type("lives_in") is None


def test_sample_corpus_schema_loads() -> None:
    schema = load_schema(Path(__file__).parent.parent / "sample_corpus" / "schema.toml")
    assert len(schema.entities) >= 4 and schema.relations


@pytest.mark.parametrize("text, words", [
    ("[entities.person\n", ("not valid TOML",)),
    ("[entities]\n", ("no entity types",)),
    ("[entities.person]\ndescription = ''\n", ("entities.person.description", "missing or empty")),
    ("[entities.person]\ndescription = 'x'\ncolour = 'red'\n", ("entities.person.colour", "not a schema key")),
    ("[entities.person]\ndescription = 'x'\n[relations.knows]\ndescription = 'y'\npatterns = [['person', 'city']]\n",
     ("relations.knows.patterns", "'city'", "not an entity type")),
    ("[entities.person]\ndescription = 'x'\n[relations.knows]\ndescription = 'y'\npatterns = [['person']]\n",
     ("relations.knows.patterns[0]", "pair")),
    ("[entities.person]\ndescription = 'x'\nsynonyms = 'human'\n", ("entities.person.synonyms", "list")),
    ("[entities.person]\ndescription = 'x'\n[entities.Person]\ndescription = 'y'\n", ("same type",)),
    ("[types.person]\ndescription = 'x'\n", ("unknown key 'types'",)),
])
def test_bad_schema_one_line_error(tmp_path: Path, text: str, words: tuple[str, ...]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as err:
        load_schema(path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and all(w in msg for w in words), msg


def test_bad_schema_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text(TEXT)
    bad = tmp_path / "bad.toml"
    bad.write_text("[entities.person]\n")
    for schema in (bad, tmp_path / "missing.toml"):
        proc = run(["index", str(docs), "-p", str(tmp_path / "proj"), "--extractor", "rules",
                    "--schema", str(schema)], inprocess=True)
        assert proc.returncode == 2 and str(schema) in proc.stderr
        assert not (tmp_path / "proj").exists()


def test_no_schema_keeps_the_extractor_fingerprint() -> None:
    """Without a schema (and without candidate names) the prompt and the extractor id are what they were
    before schemas existed (a changed id would re-extract every cached chunk)."""
    from hrag_cli.extract.prompts import PROMPT_VERSION
    from hrag_cli.core.project import fingerprint

    s = Settings()
    s.llm.model = "openai/stub-model"
    e = s.extract
    e.hints = "none"
    before = fingerprint(s.llm.model, PROMPT_VERSION, e.entity_types, e.language, e.max_gleanings,
                         e.glean_min_tokens, s.llm.temperature, s.llm.max_tokens, e.answer_tokens_min,
                         e.answer_tokens_per_token)     # the inputs it had before schemas existed
    assert settings_fingerprint(s) == f"llm:openai/stub-model:{before[:16]}"
    s.schema.mode, e.grounding = "lenient", "off"       # prune settings never re-extract
    assert settings_fingerprint(s) == f"llm:openai/stub-model:{before[:16]}"


# ------------------------------------------------------------------------------------------ prune, grounding


def _record() -> ExtractionRecord:
    ents = [ExtractedEntity("Ann Lee", "individual", ""), ExtractedEntity("Acme", "organisation", ""),
            ExtractedEntity("Paris", "city", "")]
    rels = [ExtractedRelation("Ann Lee", "Acme", "works at", [], "", rel_type="works_for"),
            ExtractedRelation("Ann Lee", "Paris", "lives in", [], "", rel_type="lives_in")]
    return ExtractionRecord("c1", "llm:x", ents, rels)


def test_prune_record_strict_and_lenient(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(SCHEMA.replace('description = "A human being."', 'description = "A human being."\n'
                                   'synonyms = ["individual"]'))
    schema, rec = load_schema(path), _record()
    strict = prune_record(rec, "Ann Lee works at Acme in Paris.", PruneSpec(schema, "strict", "off"))
    assert [(e.name, e.type) for e in strict.record.entities] == [("Ann Lee", "person"), ("Acme", "organization")]
    assert [r.rel_type for r in strict.record.relations] == ["works_for"]
    assert strict.counts == {"entities_retyped": 2, "entities_dropped": 1, "relations_dropped_with_entity": 1}
    lenient = prune_record(rec, "", PruneSpec(schema, "lenient", "off"))
    assert [e.type for e in lenient.record.entities] == ["person", "organization", "unknown"]
    assert [r.rel_type for r in lenient.record.relations] == ["works_for", ""]
    assert lenient.counts == {"entities_retyped": 2, "entities_unknown": 1, "relations_untyped": 1}
    assert [e.type for e in rec.entities] == ["individual", "organisation", "city"]   # input untouched
    off = prune_record(rec, "", PruneSpec())
    assert off.record is rec and off.counts == {}


def test_grounding_tolerates_case_inflection_and_word_order() -> None:
    g = Grounder("The HARBOUR boards met; Smith, Mary chaired. Straße Nº 5 opened in 東京都.")
    for name in ("harbour board", "Mary Smith", "Straße", "No 5", "東京",
                 "Boards of the Harbour"):
        assert g.grounded([name]), name
    for name in ("Quentin Marsh", "Mary Jones", "Harbour Trust of Oldport"):
        assert not g.grounded([name]), name
    assert g.grounded(["Quentin Marsh", "Smith"])      # an alias found is enough


# ------------------------------------------------------------------------------------------ through the stub


def test_schema_prompt_relation_types_and_strict_counts(stub, corpus) -> None:
    docs, schema, proj = corpus
    stub.set_chat(answer)
    proj.mkdir()
    (proj / "hrag.toml").write_text('[extract]\nformat = "delimited"\n')   # the line format's schema prompt
    proc = index(proj, stub, "--schema", str(schema), docs=docs)
    assert proc.returncode == 0, proc.stderr
    (_, body), = stub.requests
    system = body["messages"][0]["content"]
    for line in ("- person: A human being.", "- organization: A company, institute, agency or society.",
                 "- works_for: A person is employed by or leads an organization. (person -> organization)",
                 "RELATION_TYPE"):
        assert line in system
    assert "Allowed types" not in body["messages"][1]["content"]
    rec, = store.read_jsonl(proj / "cache" / "extractions.jsonl")   # the raw answer, nothing pruned
    assert [r["rel_type"] for r in rec["relations"]] == ["works_for", "employed_by", "works_for", "lives_in",
                                                         "works_for"]
    assert {e["type"] for e in rec["entities"]} == {"person", "company", "city"}
    assert prune_counts(proc) == STRICT
    ents, rels = graph(proj)
    assert ents == {"Mara Quint": "person", "Harbour Trust of Oldport": "organization"}
    assert len(rels) == 1 and sorted(rels[0]["predicates"]) == ["is employed by", "works for"]

    status = json.loads(run(["status", "-p", str(proj), "--json"], inprocess=True).stdout)
    assert {k: v for k, v in status["stages"]["prune"]["counts"].items() if k in PRUNE_KEYS} == STRICT
    assert status["ungrounded_chunks"] == [{"chunk_id": rec["chunk_id"], "path": "a.txt", "order": 0,
                                            "ungrounded": 1, "names": ["Quentin Marsh"]}]
    plain = run(["status", "-p", str(proj)], inprocess=True).stdout
    assert "chunks with ungrounded names: 1, the most first:" in plain and "1 ungrounded (Quentin Marsh)" in plain
    assert "with the schema" in status["built_with"]


def test_mode_and_grounding_switches_reprune_with_zero_calls(stub, corpus) -> None:
    docs, schema, proj = corpus
    stub.set_chat(answer)
    assert index(proj, stub, "--schema", str(schema), docs=docs).returncode == 0
    calls = stub.count(CHAT)

    set_toml(proj, '[schema]\nmode = "lenient"\n')
    proc = index(proj, stub)            # the schema is remembered
    assert proc.returncode == 0, proc.stderr
    assert stub.count(CHAT) == calls and summary(proc)["extract"]["llm_requests"] == 0
    assert prune_counts(proc) == LENIENT
    ents, rels = graph(proj)
    assert ents == {"Mara Quint": "person", "Harbour Trust of Oldport": "organization", "Selby": "UNKNOWN"}
    assert len(rels) == 2

    set_toml(proj, '[schema]\nmode = "lenient"\n[extract]\ngrounding = "flag"\n')
    proc = index(proj, stub)
    assert stub.count(CHAT) == calls
    flagged = {k: v for k, v in LENIENT.items() if k != "relations_dropped_with_entity"}
    assert prune_counts(proc) == {**flagged, "relations_untyped": 3}   # Quentin's relation stays, untyped
    assert "Quentin Marsh" in graph(proj)[0]          # flagged, kept

    set_toml(proj, '[extract]\ngrounding = "off"\n')
    proc = index(proj, stub)
    assert stub.count(CHAT) == calls
    assert "ungrounded" not in prune_counts(proc) and "Quentin Marsh" in graph(proj)[0]


def test_no_schema_llm_grounding_drops_invented_name_with_its_relations(stub, corpus) -> None:
    docs, _, proj = corpus

    def untyped(body: dict) -> str:
        if is_gleaning(body):
            return "<|COMPLETE|>"
        return "\n".join([
            f"entity{D}Mara Quint{D}person{D}A member of the trust.",
            f"entity{D}Harbour Trust of Oldport{D}organization{D}A trust.",
            f"entity{D}Quentin Marsh{D}person{D}Invented.",
            f"relation{D}Mara Quint{D}Harbour Trust of Oldport{D}works for{D}employment{D}She works there.{D}9",
            f"relation{D}Quentin Marsh{D}Mara Quint{D}works with{D}colleagues{D}Invented.{D}4",
            f"relation{D}Harbour Trust of Oldport{D}Quentin Marsh{D}employs{D}employment{D}Invented.{D}4",
            "<|COMPLETE|>"])

    stub.set_chat(untyped)
    proc = index(proj, stub, docs=docs)
    assert proc.returncode == 0, proc.stderr
    prune = summary(proc)["prune"]
    listed = prune.pop("ungrounded_chunks")
    assert prune == {"schema": "", "mode": "", "grounding": "drop", "ungrounded": 1,
                     "relations_dropped_with_entity": 2, "chunks_with_ungrounded": 1}
    assert [(c["path"], c["names"]) for c in listed] == [("a.txt", ["Quentin Marsh"])]
    ents, rels = graph(proj)
    # the model's grounded names stay (beside the rules' candidates it did not reject); the invented one goes
    assert {"Mara Quint", "Harbour Trust of Oldport"} <= set(ents) and "Quentin Marsh" not in ents
    assert len(rels) == 1


def test_reparse_after_schema_change_makes_zero_calls(stub, corpus) -> None:
    docs, schema, proj = corpus
    stub.set_chat(answer)
    assert index(proj, stub, "--schema", str(schema), docs=docs).returncode == 0
    calls = stub.count(CHAT)
    # the new schema knows cities and where people live: a new prompt, so a plain run would ask again
    schema.write_text(SCHEMA + '[entities.place]\ndescription = "A town or city."\nsynonyms = ["city"]\n'
                               '[relations.lives_in]\ndescription = "Where a person lives."\n'
                               'patterns = [["person", "place"]]\n')
    proc = index(proj, stub, "--reparse")
    assert proc.returncode == 0, proc.stderr
    assert stub.count(CHAT) == calls
    ext = summary(proc)["extract"]
    assert ext["llm_requests"] == 0 and ext["reparse_from_earlier"] == 1 and ext["extracted_now"] == 0
    counts = prune_counts(proc)
    assert counts == {"entities_retyped": 2, "ungrounded": 1, "relations_retyped": 1, "relations_dropped": 1,
                      "relations_dropped_with_entity": 1}
    ents, _ = graph(proj)
    assert ents["Selby"] == "place"


def test_parser_reads_the_relation_type_only_from_a_typed_row() -> None:
    from hrag_cli.extract.parser import parse_extraction

    typed = f"relation{D}A Co{D}B Co{D}Owned By{D}is owned by{D}ownership{D}A is B's.{D}7"
    r, = parse_extraction(typed, typed=True).relations
    assert (r.rel_type, r.predicate, r.keywords, r.description, r.strength) == \
        ("owned_by", "is owned by", ["ownership"], "A is B's.", 7.0)
    untyped = f"relation{D}A Co{D}B Co{D}is owned by{D}ownership{D}A is B's.{D}7"
    r, = parse_extraction(untyped, typed=True).relations      # the model left the type out
    assert (r.rel_type, r.predicate, r.description) == ("", "is owned by", "A is B's.")
    r, = parse_extraction(typed).relations                    # no schema: what it always was
    assert r.rel_type == "" and r.predicate == "Owned By"
    rec = ExtractionRecord("c", "x", [], [r]).to_json()
    assert "rel_type" not in rec["relations"][0]               # records without a schema keep their old shape


def test_offline_build_prunes_nothing_and_keeps_resolve_input(tmp_path: Path) -> None:
    """Rules extractor, no schema: the prune step reads nothing and hands resolve the extract stage's digest,
    so a project built before the step existed keeps its resolve stage fresh."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text(TEXT)
    proj = tmp_path / "proj"
    proc = run(["index", str(docs), "-p", str(proj), "--extractor", "rules", "--stop-after", "resolve", "--json"],
               inprocess=True)
    assert proc.returncode == 0, proc.stderr
    assert summary(proc)["prune"] == {"schema": "", "mode": "", "grounding": "off"}
    stages = ProjectDir(proj).manifest()["stages"]
    assert stages["prune"]["output_digest"] == stages["extract"]["output_digest"]


def test_schema_is_remembered_until_unset_and_a_lost_file_is_exit_2(stub, corpus) -> None:
    docs, schema, proj = corpus
    stub.set_chat(answer)
    assert index(proj, stub, "--schema", str(schema), docs=docs).returncode == 0
    assert ProjectDir(proj).remembered()["extract.schema"] == str(schema.resolve())
    moved = schema.with_name("moved.toml")
    schema.rename(moved)
    proc = index(proj, stub)
    assert proc.returncode == 2 and str(schema) in proc.stderr and "not found" in proc.stderr
    status = json.loads(run(["status", "-p", str(proj), "--json"], inprocess=True).stdout)
    assert "not found" in status["settings_error"]
    proc = index(proj, stub, "--schema", "", "--extractor", "rules")
    assert proc.returncode == 0, proc.stderr
    assert "extract.schema" not in ProjectDir(proj).remembered()
    assert summary(proc)["prune"]["schema"] == ""


def test_changed_schema_file_is_said_and_asks_again(stub, corpus) -> None:
    docs, schema, proj = corpus
    stub.set_chat(answer)
    assert index(proj, stub, "--schema", str(schema), docs=docs).returncode == 0
    calls = stub.count(CHAT)
    schema.write_text(SCHEMA.replace("A human being.", "A human being, living or dead."))
    proc = index(proj, stub)
    assert proc.returncode == 0, proc.stderr
    assert stub.count(CHAT) == calls + 1 and "living or dead" in stub.requests[-1][1]["messages"][0]["content"]
    assert "changed since the last run: 1 chunk(s)" in proc.stderr and "--reparse" in proc.stderr


def test_schema_without_relation_types_keeps_relation_rows_untyped(tmp_path: Path) -> None:
    from hrag_cli.core.config import ExtractSettings
    from hrag_cli.extract.llm_extractor import frame_of
    from hrag_cli.extract.prompts import build_extraction_messages

    path = tmp_path / "s.toml"
    path.write_text('[entities.person]\ndescription = "A human being."\nproperties = ["birth year"]\n')
    frame = frame_of(ExtractSettings(schema=str(path)))
    assert frame.types == ["person"] and not frame.typed
    system = build_extraction_messages("x", frame.types, "English", frame.schema)[0]["content"]
    assert "RELATION_TYPE" not in system and "Relation types:" not in system
    assert "- person: A human being. Properties worth describing: birth year." in system
    rec = ExtractionRecord("c", "llm:x", [ExtractedEntity("Ann", "person", "")],
                           [ExtractedRelation("Ann", "Bo", "knows", [], "")])
    pruned = prune_record(rec, "Ann knows Bo.", PruneSpec(frame.schema, "strict", "drop"))
    assert pruned.record is rec and pruned.counts == {}


def test_prune_knows_an_endpoint_by_its_alias(tmp_path: Path) -> None:
    """A relation naming an entity by one of its aliases meets its type, and an entity found in the chunk only
    under an alias is grounded."""
    path = tmp_path / "s.toml"
    path.write_text(SCHEMA)
    acme = ExtractedEntity("Acme Corporation", "organization", "", ["Acme"])
    rec = ExtractionRecord("c", "llm:x", [ExtractedEntity("Ann Lee", "person", ""), acme],
                           [ExtractedRelation("Ann Lee", "Acme", "works at", [], "", rel_type="works_for")])
    pruned = prune_record(rec, "Ann Lee works at Acme.", PruneSpec(load_schema(path), "strict", "drop"))
    assert pruned.counts == {} and pruned.record is rec


def test_rules_and_openie_records_keep_untyped_relations_and_skip_grounding(tmp_path: Path) -> None:
    from hrag_cli.extract.prune import prune_spec

    path = tmp_path / "s.toml"
    path.write_text(SCHEMA)
    settings = Settings()
    settings.extract.schema = str(path)
    rec = ExtractionRecord("c", "rules-v2", [ExtractedEntity("Ann Lee", "person", ""),
                                              ExtractedEntity("Acme", "organization", "")],
                           [ExtractedRelation("Ann Lee", "Acme", "works at", [], "")])
    for extractor in ("rules-v2", "openie:abc"):
        spec = prune_spec(settings, extractor)
        assert spec.grounding == "off" and not spec.relation_types
        assert prune_record(rec, "nothing here", spec).record is rec
    assert prune_spec(settings, "openie:abc").schema is None        # OpenIE entities have no type to hold
    llm = prune_spec(settings, "llm:m:1")
    assert llm.grounding == "drop" and llm.relation_types
    assert prune_record(rec, "Ann Lee works at Acme.", llm).counts == {"relations_dropped": 1}
