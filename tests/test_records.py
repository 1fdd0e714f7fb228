"""to_dict: the same dicts as dataclasses.asdict (which it replaces for speed), and independent copies."""

from __future__ import annotations

from dataclasses import asdict

from hrag_cli.records import (Document, Entity, ExtractedEntity, ExtractedRelation, ExtractionRecord, Fact,
                              Relation, to_dict)


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
