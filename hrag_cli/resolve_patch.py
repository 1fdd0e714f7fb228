"""After new records were merged into resolve's saved state: the record files rewritten in one streaming pass
each, making records again only for the keys the merge touched and copying every other line as it was.

entities.jsonl, relations.jsonl and facts.jsonl are sorted by key (entity id, entity pair, fact key), and the
saved state holds every key, so walking the state's keys in order walks the old file's lines in step (a key
the merge created has no old line). A fact names its subject and object, so a fact whose entity changed its
display name is made again too. What the graph needs of every entity and relation is read off the lines on
the way. The result is the file a full resolve would write; a line whose key is not the one expected (the file
does not belong to the state) raises OutOfStep, and resolve merges from scratch instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from . import store
from .graph import GraphEntity, GraphRelation
from .summaries import Summarizer


class OutOfStep(Exception):
    """An output file does not match the saved state."""


def _old_lines(path: Path) -> Iterator[bytes]:
    for line in store.iter_lines(path):
        if line.strip():
            yield line.rstrip(b"\n")


def _next(lines: Iterator[bytes], key: str, field: str = "id") -> tuple[bytes, dict]:
    line = next(lines, None)
    if line is None:
        raise OutOfStep("ends early")
    rec = orjson.loads(line)
    if rec.get(field) != key:
        raise OutOfStep(f"has {rec.get(field)!r} where {key!r} belongs")
    return line, rec


def patch_outputs(project: Any, merged: Any, summarizer: Summarizer
                  ) -> tuple[list[GraphEntity], list[GraphRelation], int]:
    """Rewrite the three record files for `merged.touched`; returns the graph's entities and relations and
    how many entities changed between UNKNOWN and a real type (+1 became UNKNOWN)."""
    from .resolve import UNKNOWN, _top, entity_record, fact_record, relation_record

    t = merged.touched
    ents, rels, facts = merged.entities, merged.relations, merged.facts
    names: dict[str, str] = {}        # display names of touched entities
    renamed: set[str] = set()
    graph_ents: list[GraphEntity] = []
    unknown = 0

    def entity_lines() -> Iterator[Any]:
        nonlocal unknown
        old = _old_lines(project.entities_path)
        for eid in sorted(ents):
            line, rec = (None, None) if eid in t.new_entities else _next(old, eid)
            if eid not in t.entities:
                graph_ents.append(GraphEntity(eid, rec["name"], rec["type"], rec["aliases"]))
                yield orjson.Fragment(line)
                continue
            acc = ents[eid]
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
        for pair in sorted(rels):
            line, rec = (None, None) if pair in t.new_relations else _next(old, pair[0], "src")
            if rec is not None and rec["tgt"] != pair[1]:
                raise OutOfStep(f"has {rec['tgt']!r} where {pair[1]!r} belongs")
            if pair not in t.relations:
                graph_rels.append(GraphRelation(rec["id"], pair[0], pair[1], rec["weight"], rec.get("rel_type", "")))
                yield orjson.Fragment(line)
                continue
            racc = rels[pair]
            desc = (summarizer.describe("relation", f"{name_of(pair[0])} and {name_of(pair[1])}", racc.descs)
                    if racc.descs else "")
            r = relation_record(pair, racc, desc)
            rel_ids[pair] = r.id
            graph_rels.append(GraphRelation(r.id, r.src, r.tgt, r.weight, r.rel_type))
            yield r.to_json()
        if next(old, None) is not None:
            raise OutOfStep("has lines past the last key")

    def fact_lines() -> Iterator[Any]:
        from .project import fingerprint

        old = _old_lines(project.facts_path)
        for fkey in sorted(facts):
            line = None
            if fkey not in t.new_facts:
                line = next(old, None)
                if line is None:
                    raise OutOfStep("ends early")
            s, _, o = fkey
            if fkey not in t.facts and s not in renamed and o not in renamed:
                yield orjson.Fragment(line)
                continue
            pair = (s, o) if s < o else (o, s)
            rid = rel_ids.get(pair) or fingerprint("relation", *pair)
            f = fact_record(fkey, facts[fkey], name_of(s), name_of(o), rid)
            if line is not None and orjson.loads(line).get("id") != f.id:
                raise OutOfStep("a fact line is not the one expected")
            yield f
        if next(old, None) is not None:
            raise OutOfStep("has lines past the last key")

    store.write_jsonl(project.entities_path, entity_lines(), compress=True)
    store.write_jsonl(project.relations_path, relation_lines(), compress=True)
    store.write_jsonl(project.facts_path, fact_lines())
    return graph_ents, graph_rels, unknown
