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

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from . import store
from .graph import GraphEntity, GraphRelation
from .resolve_records import UNKNOWN, _top, entity_record, fact_record, relation_id, relation_record, relation_type
from .summaries import Summarizer


class OutOfStep(Exception):
    """An output file does not match the saved state."""


_RUN = 4096     # untouched lines copied as one block at most (a few MiB: memory stays flat whatever the file)


class _OldLines:
    """An old record file's lines, walked in step with the state's keys: a run of lines whose keys the merge did
    not touch is taken as one byte block (its newlines found with numpy), so no per-line Python runs for them."""

    def __init__(self, path: Path) -> None:
        self._blocks = store.line_blocks(path)
        self._data = b""
        self._starts = np.zeros(1, dtype=np.int64)   # line starts in _data, and its end
        self._at = 0                                 # the next line, as an index into _starts

    def _fill(self) -> bool:
        """False when no line is left."""
        while self._at >= len(self._starts) - 1:
            data = next(self._blocks, None)
            if data is None:
                return False
            ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10) + 1
            self._data, self._starts, self._at = data, np.concatenate([np.zeros(1, np.int64), ends]), 0
        return True

    def take(self, n: int) -> bytes:
        """The next `n` lines as they are, newlines included."""
        parts = []
        while n:
            if not self._fill():
                raise OutOfStep("ends early")
            k = min(n, len(self._starts) - 1 - self._at)
            parts.append(self._data[self._starts[self._at]:self._starts[self._at + k]])
            self._at += k
            n -= k
        return b"".join(parts)

    def copied(self, n: int) -> orjson.Fragment:
        """The next `n` lines, for write_jsonl (which ends each item with the newline cut off here)."""
        return orjson.Fragment(self.take(n)[:-1])

    def done(self) -> bool:
        return not self._fill()


def _patched(path: Path, keys: list, changed: Callable[[Any], bool], new: set, remake: Callable[[Any, bytes | None], Any],
             keep: Callable[[Any], None]) -> Iterator[Any]:
    """The items of the patched file in key order: `remake(key, old line or None)` for a changed key (None: a
    key the merge created), the old lines as they were, in runs, for the rest (`keep(key)` still sees each)."""
    old = _OldLines(path)
    run = 0
    for key in keys:
        if not changed(key):
            keep(key)
            run += 1
            if run == _RUN:
                yield old.copied(run)
                run = 0
            continue
        if run:
            yield old.copied(run)
            run = 0
        yield remake(key, None if key in new else old.take(1))
    if run:
        yield old.copied(run)
    if not old.done():
        raise OutOfStep("has lines past the last key")


def _parse(line: bytes, field: str, key: str) -> dict:
    """An old line about to be replaced, checked to be about `key` (the lines copied as they are are not
    parsed: parsing every one cost more than the rest of the pass)."""
    try:
        rec = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise OutOfStep("has a line that is not JSON") from None
    if not isinstance(rec, dict) or rec.get(field) != key:
        raise OutOfStep(f"has {rec.get(field) if isinstance(rec, dict) else rec!r} where {key!r} belongs")
    return rec


def patch_outputs(project: Any, merged: Any, summarizer: Summarizer, keys: dict[str, list]
                  ) -> tuple[list[GraphEntity], list[GraphRelation], int, dict[str, list[str]]]:
    """Rewrite the three record files for `merged.touched` (`keys`: each section's keys, sorted); returns the
    graph's entities and relations, how many entities changed between UNKNOWN and a real type (+1 became
    UNKNOWN), and the ids of the records made again (added or changed), per file, sorted."""
    t = merged.touched
    ents, rels, facts = merged.entities, merged.relations, merged.facts
    names: dict[str, str] = {}        # display names of touched entities
    renamed: set[str] = set()
    graph_ents: list[GraphEntity] = []
    unknown = 0
    changed: dict[str, list[str]] = {"entities": [], "relations": [], "facts": []}

    def keep_entity(eid: str) -> None:   # the graph needs all but the description
        acc = ents[eid]
        e = entity_record(eid, acc, _top(acc.names), "")
        graph_ents.append(GraphEntity(eid, e.name, e.type, e.aliases))

    def remake_entity(eid: str, line: bytes | None) -> Any:
        nonlocal unknown
        acc = ents[eid]
        rec = None if line is None else _parse(line, "id", eid)
        name = names[eid] = _top(acc.names)
        e = entity_record(eid, acc, name, summarizer.describe("entity", name, acc.descs) if acc.descs else "")
        if rec is not None and rec["name"] != name:
            renamed.add(eid)
        unknown += (e.type == UNKNOWN) - (rec is not None and rec["type"] == UNKNOWN)
        graph_ents.append(GraphEntity(eid, e.name, e.type, e.aliases))
        changed["entities"].append(eid)
        return e

    graph_rels: list[GraphRelation] = []
    rel_ids: dict[tuple[str, str], str] = {}

    def name_of(eid: str) -> str:
        got = names.get(eid)
        if got is None:
            got = names[eid] = _top(ents[eid].names)
        return got

    def keep_relation(pair: tuple[str, str]) -> None:   # the graph's part of relation_record
        racc = rels[pair]
        graph_rels.append(GraphRelation(relation_id(pair), pair[0], pair[1], racc.weight, relation_type(racc)))

    def remake_relation(pair: tuple[str, str], line: bytes | None) -> Any:
        racc = rels[pair]
        if line is not None:
            _parse(line, "id", relation_id(pair))
        desc = (summarizer.describe("relation", f"{name_of(pair[0])} and {name_of(pair[1])}", racc.descs)
                if racc.descs else "")
        r = relation_record(pair, racc, desc)
        rel_ids[pair] = r.id
        graph_rels.append(GraphRelation(r.id, r.src, r.tgt, r.weight, r.rel_type))
        changed["relations"].append(r.id)
        return r.to_json()

    def fact_changed(fkey: tuple[str, str, str]) -> bool:
        return fkey in t.facts or fkey[0] in renamed or fkey[2] in renamed

    def remake_fact(fkey: tuple[str, str, str], line: bytes | None) -> Any:
        s, _, o = fkey
        pair = (s, o) if s < o else (o, s)
        f = fact_record(fkey, facts[fkey], name_of(s), name_of(o), rel_ids.get(pair) or relation_id(pair))
        if line is not None:
            _parse(line, "id", f.id)
        changed["facts"].append(f.id)
        return f

    entity_lines = _patched(project.entities_path, keys["entities"], t.entities.__contains__, t.new_entities,
                            remake_entity, keep_entity)
    relation_lines = _patched(project.relations_path, keys["relations"], t.relations.__contains__,
                              t.new_relations, remake_relation, keep_relation)
    fact_lines = _patched(project.facts_path, keys["facts"], fact_changed, t.new_facts, remake_fact,
                          lambda fkey: None)
    store.write_jsonl(project.entities_path, entity_lines, compress=True)
    store.write_jsonl(project.relations_path, relation_lines, compress=True)
    store.write_jsonl(project.facts_path, fact_lines)
    return graph_ents, graph_rels, unknown, {k: sorted(v) for k, v in changed.items()}
