"""After new records were merged into resolve's saved state: the record files rewritten in one streaming pass
each, making records again only for the keys the merge touched and copying every other line as it was.

entities.jsonl, relations.jsonl and facts.jsonl are sorted by key (entity id, entity pair, fact key), and the
saved state holds every key, so walking the state's keys in order walks the old file's lines in step (a key
the merge created has no old line). A fact names its subject and object, so a fact whose entity changed its
display name is made again too. What the graph needs of every entity and relation comes from the state's
accumulators. The result is the file a full resolve would write; a file with fewer or more lines than the
state has keys, or a replaced line whose key is not the one expected, raises OutOfStep, and resolve merges from
scratch instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from . import store
from .graph import GraphEntity, GraphRelation
from .resolve_records import UNKNOWN, _top, entity_record, fact_record, relation_id, relation_record, relation_type
from .summaries import Summarizer


class OutOfStep(Exception):
    """An output file does not match the saved state."""


def _old_lines(path: Path) -> Iterator[bytes]:
    for line in store.iter_lines(path):
        if line.strip():
            yield line.rstrip(b"\n")


def _next(lines: Iterator[bytes]) -> bytes:
    line = next(lines, None)
    if line is None:
        raise OutOfStep("ends early")
    return line


def _parse(line: bytes, field: str, key: str) -> dict:
    """An old line about to be replaced, checked to be about `key` (the lines copied as they are are not
    parsed: parsing every one cost more than the rest of the pass)."""
    rec = orjson.loads(line)
    if rec.get(field) != key:
        raise OutOfStep(f"has {rec.get(field)!r} where {key!r} belongs")
    return rec


def patch_outputs(project: Any, merged: Any, summarizer: Summarizer, keys: dict[str, list]
                  ) -> tuple[list[GraphEntity], list[GraphRelation], int]:
    """Rewrite the three record files for `merged.touched` (`keys`: each section's keys, sorted); returns the
    graph's entities and relations and how many entities changed between UNKNOWN and a real type (+1 became
    UNKNOWN)."""
    t = merged.touched
    ents, rels, facts = merged.entities, merged.relations, merged.facts
    names: dict[str, str] = {}        # display names of touched entities
    renamed: set[str] = set()
    graph_ents: list[GraphEntity] = []
    unknown = 0

    def entity_lines() -> Iterator[Any]:
        nonlocal unknown
        old = _old_lines(project.entities_path)
        for eid in keys["entities"]:
            line = None if eid in t.new_entities else _next(old)
            acc = ents[eid]
            if eid not in t.entities:   # the graph needs all but the description
                e = entity_record(eid, acc, _top(acc.names), "")
                graph_ents.append(GraphEntity(eid, e.name, e.type, e.aliases))
                yield orjson.Fragment(line)
                continue
            rec = None if line is None else _parse(line, "id", eid)
            name = names[eid] = _top(acc.names)
            e = entity_record(eid, acc, name, summarizer.describe("entity", name, acc.descs) if acc.descs else "")
            if rec is not None and rec["name"] != name:
                renamed.add(eid)
            unknown += (e.type == UNKNOWN) - (rec is not None and rec["type"] == UNKNOWN)
            graph_ents.append(GraphEntity(eid, e.name, e.type, e.aliases))
            yield e
        if next(old, None) is not None:
            raise OutOfStep("has lines past the last key")

    graph_rels: list[GraphRelation] = []
    rel_ids: dict[tuple[str, str], str] = {}

    def name_of(eid: str) -> str:
        got = names.get(eid)
        if got is None:
            got = names[eid] = _top(ents[eid].names)
        return got

    def relation_lines() -> Iterator[Any]:
        old = _old_lines(project.relations_path)
        for pair in keys["relations"]:
            line = None if pair in t.new_relations else _next(old)
            racc = rels[pair]
            if pair not in t.relations:   # the graph's part of relation_record
                graph_rels.append(GraphRelation(relation_id(pair), pair[0], pair[1], racc.weight,
                                                relation_type(racc)))
                yield orjson.Fragment(line)
                continue
            if line is not None:
                _parse(line, "id", relation_id(pair))
            desc = (summarizer.describe("relation", f"{name_of(pair[0])} and {name_of(pair[1])}", racc.descs)
                    if racc.descs else "")
            r = relation_record(pair, racc, desc)
            rel_ids[pair] = r.id
            graph_rels.append(GraphRelation(r.id, r.src, r.tgt, r.weight, r.rel_type))
            yield r.to_json()
        if next(old, None) is not None:
            raise OutOfStep("has lines past the last key")

    def fact_lines() -> Iterator[Any]:
        old = _old_lines(project.facts_path)
        for fkey in keys["facts"]:
            line = None if fkey in t.new_facts else _next(old)
            s, _, o = fkey
            if fkey not in t.facts and s not in renamed and o not in renamed:
                yield orjson.Fragment(line)
                continue
            pair = (s, o) if s < o else (o, s)
            rid = rel_ids.get(pair) or relation_id(pair)
            f = fact_record(fkey, facts[fkey], name_of(s), name_of(o), rid)
            if line is not None:
                _parse(line, "id", f.id)
            yield f
        if next(old, None) is not None:
            raise OutOfStep("has lines past the last key")

    store.write_jsonl(project.entities_path, entity_lines(), compress=True)
    store.write_jsonl(project.relations_path, relation_lines(), compress=True)
    store.write_jsonl(project.facts_path, fact_lines())
    return graph_ents, graph_rels, unknown
