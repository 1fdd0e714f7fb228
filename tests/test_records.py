"""to_dict: the same dicts as dataclasses.asdict (which it replaces for speed), and independent copies."""

from __future__ import annotations

from dataclasses import asdict

from hrag_cli.core.records import (
    Document, Entity, ExtractedEntity, ExtractedRelation, ExtractionRecord, Fact, Relation, to_dict)


def test_to_dict_matches_asdict_and_copies_containers() -> None:
    rec = ExtractionRecord("c1", "rules-v2", [ExtractedEntity("Ada", "person", "d")],
                           [ExtractedRelation("Ada", "Babbage", "met", ["met"], "d", 0.5)], llm_keys=["k"])
    items = [rec, Document("d", "a.txt", "h", 3, 1, {"tags": ["x", {"y": (1, 2)}]}),
             Entity("ada", "Ada", "person", "d", ["A."], ["c1"]), Relation("r", "a", "b", ["p"], ["k"], "d", 1.0, ["c1"]),
             Fact("f", "Ada", "met", "Babbage", "r", ["c1"])]
    for item in items:
        assert to_dict(item) == asdict(item)
    d = rec.to_json()
    d["entities"][0]["name"] = "changed"
    d["llm_keys"].append("x")
    assert rec.entities[0].name == "Ada" and rec.llm_keys == ["k"]


def test_extraction_record_stores_each_description_once_and_reads_both_forms() -> None:
    sentence = "Ada met Babbage in London."
    rec = ExtractionRecord("c1", "rules-v2", [ExtractedEntity(n, "person", sentence) for n in ("Ada", "Babbage")] +
                           [ExtractedEntity("London", "location", "A city.")],
                           [ExtractedRelation("Ada", "Babbage", "met", ["met"], sentence, 1.0),
                            ExtractedRelation("Babbage", "London", "in", [], sentence, 0.5)])
    data = rec.to_json()
    assert data["texts"] == [sentence, "A city."]
    assert [e["description"] for e in data["entities"]] == [0, 0, 1]
    assert [r["description"] for r in data["relations"]] == [0, 0]
    assert ExtractionRecord.from_json(data) == rec
    inline = asdict(rec)             # a line written before descriptions were shared still reads the same
    assert "texts" not in inline and ExtractionRecord.from_json(inline) == rec
