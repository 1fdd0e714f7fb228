"""HippoRAG OpenIE import: passages matched to chunks by text, predicates kept, malformed triples counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hrag_cli.errors import UsageError
from hrag_cli.extract.openie import import_openie, openie_extractor_id
from hrag_cli.records import Chunk


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
