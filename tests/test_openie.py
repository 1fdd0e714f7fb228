"""HippoRAG OpenIE import: passages matched to chunks by text, predicates kept, malformed triples counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hrag_cli.core.errors import UsageError
from hrag_cli.extract.openie import import_openie, openie_extractor_id, parse_openie_messages
from hrag_cli.core.records import Chunk


def _write(tmp_path: Path, docs: list[dict], extra: str = "") -> Path:
    path = tmp_path / "openie_results_ner_test.json"
    body = json.dumps({"docs": docs})
    if extra:  # HippoRAG writes NaN averages, which strict JSON parsers refuse
        body = body[:-1] + ', "avg_ent_chars": NaN}'
    path.write_text(body, encoding="utf-8")
    return path


DOCS = [
    {"title": "Corvane Works", "text": "Corvane Works was founded by Edric Solano in 1902.",
     "passage": "Corvane Works\nCorvane Works was founded by Edric Solano in 1902.",
     "extracted_entities": ["Corvane Works", "Edric Solano", "1902", 7],
     "extracted_triples": [["Corvane Works", "founded by", "Edric Solano"],
                           ["Corvane Works", "founded in", "1902"],
                           ["Corvane Works", "founded"],                      # two items
                           ["Edric Solano", "born in", "Gullhaven", "1870"],  # four items
                           ["Edric Solano", None, "Gullhaven"],               # not a string
                           ["Edric Solano", "is", "edric solano"],            # self relation
                           "Corvane Works founded 1902"]},                    # not a list
    {"title": "Gullhaven", "text": "Gullhaven is a village on Kestrel Island.",
     "passage": "Gullhaven\nGullhaven is a village on Kestrel Island.",
     "extracted_entities": ["Gullhaven", "Kestrel Island"],
     "extracted_triples": [["Gullhaven", "is a village on", "Kestrel Island"]]},
]


def test_import_matches_chunks_and_keeps_predicates(tmp_path: Path) -> None:
    path = _write(tmp_path, DOCS, extra="nan")
    chunks = [
        Chunk("c1", "d1", 0, 20, "Corvane Works\n\nCorvane Works was founded by  Edric Solano in 1902."),  # title+text
        Chunk("c2", "d2", 0, 10, "Gullhaven is a village on Kestrel Island."),                             # text only
        Chunk("c3", "d3", 0, 10, "Something no passage says."),
    ]
    records, counts = import_openie(None, chunks, path, None)
    assert [r.chunk_id for r in records] == ["c1", "c2"]
    assert counts["matched_chunks"] == 2 and counts["unmatched_chunks"] == 1
    assert counts["dropped_triples"] == 4 and counts["self_triples"] == 1 and counts["triples"] == 3
    assert counts["dropped_entities"] == 1
    r1 = records[0]
    assert r1.extractor == openie_extractor_id(path) and r1.extractor.startswith("openie:")
    assert [e.name for e in r1.entities] == ["Corvane Works", "Edric Solano", "1902"]
    rel = r1.relations[0]
    assert (rel.src, rel.tgt, rel.predicate, rel.keywords) == ("Corvane Works", "Edric Solano", "founded by", ["founded by"])
    assert rel.description == "Corvane Works founded by Edric Solano"
    # an endpoint missing from extracted_entities still becomes an entity of the record
    assert {e.name for e in records[1].entities} == {"Gullhaven", "Kestrel Island"}


def test_extractor_id_follows_file_content(tmp_path: Path) -> None:
    a = openie_extractor_id(_write(tmp_path, DOCS))
    b = openie_extractor_id(_write(tmp_path, DOCS[:1]))
    assert a != b


@pytest.mark.parametrize("content", ["not json", '{"nodocs": 1}', "[1, 2"])
def test_bad_files_are_usage_errors(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(UsageError):
        import_openie(None, [], path, None)
    with pytest.raises(UsageError, match="does not exist"):
        import_openie(None, [], tmp_path / "missing.json", None)


# HippoRAG 2's raw per-passage answers, as models write them
NER_FENCED = '```json\n{"named_entities": ["*NSYNC", "Only My Heart Talkin\'", "(*)", "", 7, "' + "Q" * 300 + '"]}\n```'
TRIPLES_PROSE = ('Here are the triples:\n{"triples": [["*NSYNC", "recorded", "(*)"], ["*NSYNC", "sang"], '
                 '["*NSYNC", "is", "*nsync"], ["6\'11\\"", "is the height of", "Odo Baker"]]}')
TRIPLES_CUT = '{"triples": [["Corvane Works", "founded by", "Edric Solano"], ["Edric Solano", "born in", "Gull'


def test_raw_messages_entry_point() -> None:
    res = parse_openie_messages(NER_FENCED, TRIPLES_PROSE)
    assert [(e.name, e.type) for e in res.entities] == [
        ("*NSYNC", "unknown"), ("Only My Heart Talkin'", "unknown"), ("(*)", "unknown"), ("6'11\"", "unknown"),
        ("Odo Baker", "unknown")]
    assert [(r.src, r.predicate, r.tgt) for r in res.relations] == [
        ("*NSYNC", "recorded", "(*)"), ("6'11\"", "is the height of", "Odo Baker")]
    assert res.dropped == {"no_name": 2, "name_too_long": 1, "malformed_triple": 1, "self_relation": 1}
    assert res.complete


def test_raw_messages_cut_off_or_unfenced() -> None:
    cut = parse_openie_messages(TRIPLES_CUT)
    assert [(r.src, r.predicate, r.tgt) for r in cut.relations] == [("Corvane Works", "founded by", "Edric Solano")]
    assert cut.dropped == {"truncated": 1} and not cut.complete
    ner_cut = parse_openie_messages('{"named_entities": ["Gullhaven", "Kestrel Isl')
    assert [e.name for e in ner_cut.entities] == ["Gullhaven"]
    plain = parse_openie_messages('{"named_entities": ["Gullhaven"], "triples": [["Gullhaven", "is on", "Kestrel"]]}')
    assert [e.name for e in plain.entities] == ["Gullhaven", "Kestrel"] and plain.complete
    assert parse_openie_messages("no json at all", "").entities == []


def test_import_keeps_punctuation_and_counts_per_record(tmp_path: Path) -> None:
    docs = [{"passage": "*NSYNC released (*) in 2001.", "extracted_entities": ["*NSYNC", "(*)", "Z" * 300],
             "extracted_triples": [["*NSYNC", "released", "(*)"]]}]
    path = _write(tmp_path, docs)
    records, counts = import_openie(None, [Chunk("c1", "d1", 0, 9, "*NSYNC released (*) in 2001.")], path, None)
    assert [e.name for e in records[0].entities] == ["*NSYNC", "(*)"]
    assert records[0].dropped == {"name_too_long": 1} and counts["long_names"] == 1
