"""After new records were merged into resolve's saved state: the record files rewritten in one streaming pass
each, making records again only for the keys the merge touched and copying every other line as it was.

entities.jsonl, relations.jsonl and facts.jsonl are sorted by key (entity id, entity pair, fact key), and the
saved state holds every key, so a key's line in the old file is its place among the sorted keys less the keys
the merge created before it: the changed lines are found by bisection and the lines between them copied as
byte runs, with no Python per unchanged key. A fact names its subject and object, so a fact whose entity
changed its display name is made again too. The graph gets the entities and relations made again (the rest
are as the graph on disk has them). The result is the file a full resolve would write; a file with fewer or
more lines than the state has keys, or a replaced line whose key is not the one expected, raises OutOfStep,
and resolve merges from scratch instead.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from . import store
from .graph import GraphEntity, GraphRelation
from .resolve_records import (UNKNOWN, _aliases, _EntityAcc, _FactAcc, _RelationAcc, _top, _vote_type, entity_record,
                              fact_record, live, relation_id, relation_record, relation_type)
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


def _patched(path: Path, keys: list, changed: Callable[[], list], new: set,
             remake: Callable[[Any, bytes | None], Any]) -> Iterator[Any]:
    """The items of the patched file in key order: `remake(key, old line or None)` for each of `changed()`
    (sorted; called when the first item is wanted, so it may depend on what an earlier file's patch found; None:
    a key the merge created), the old lines as they were, in runs, for the rest. A changed key's line is found
    by its place among the sorted `keys` (every key, `new` among them), less the new keys before it: no Python
    runs per unchanged key."""
    old = _OldLines(path)
    at = n_new = lo = 0         # old lines passed, new keys passed, where the last key was found in `keys`
    for key in changed():
        lo = bisect.bisect_left(keys, key, lo)
        line = lo - n_new
        yield from _copies(old, line - at)
        if key in new:
            n_new += 1
            yield remake(key, None)
            at = line
        else:
            yield remake(key, old.take(1))
            at = line + 1
    yield from _copies(old, len(keys) - len(new) - at)
    if not old.done():
        raise OutOfStep("has lines past the last key")


def _copies(old: _OldLines, n: int) -> Iterator[orjson.Fragment]:
    """The next `n` old lines as they are, in runs of at most _RUN lines."""
    while n > 0:
        k = min(n, _RUN)
        yield old.copied(k)
        n -= k


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
    graph's entities and relations that were made again (the rest are as the graph on disk has them), how many
    entities changed between UNKNOWN and a real type (+1 became UNKNOWN), and the ids of the records made again
    (added or changed), per file, sorted."""
    t = merged.touched
    ents, rels, facts = merged.entities, merged.relations, merged.facts
    names: dict[str, str] = {}        # display names of touched entities
    renamed: set[str] = set()
    graph_ents: list[GraphEntity] = []
    unknown = 0
    changed: dict[str, list[str]] = {"entities": [], "relations": [], "facts": []}

    def remake_entity(eid: str, line: bytes | None) -> Any:
        nonlocal unknown
        acc = live(ents, eid, _EntityAcc)
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
            got = names[eid] = _top(live(ents, eid, _EntityAcc).names)
        return got

    def remake_relation(pair: tuple[str, str], line: bytes | None) -> Any:
        racc = live(rels, pair, _RelationAcc)
        if line is not None:
            _parse(line, "id", relation_id(pair))
        desc = (summarizer.describe("relation", f"{name_of(pair[0])} and {name_of(pair[1])}", racc.descs)
                if racc.descs else "")
        r = relation_record(pair, racc, desc)
        rel_ids[pair] = r.id
        graph_rels.append(GraphRelation(r.id, r.src, r.tgt, r.weight, r.rel_type))
        changed["relations"].append(r.id)
        return r.to_json()

    def changed_facts() -> list[tuple[str, str, str]]:
        """The facts merged into, and those naming a renamed entity (known once the entities are written)."""
        out = set(t.facts)
        if renamed:
            order = keys["facts"]
            for s in renamed:     # as subject: a run of the sorted keys
                i = bisect.bisect_left(order, (s,))
                while i < len(order) and order[i][0] == s:
                    out.add(order[i])
                    i += 1
            out.update(fkey for fkey in order if fkey[2] in renamed)
        return sorted(out)

    def remake_fact(fkey: tuple[str, str, str], line: bytes | None) -> Any:
        s, _, o = fkey
        pair = (s, o) if s < o else (o, s)
        f = fact_record(fkey, live(facts, fkey, _FactAcc), name_of(s), name_of(o),
                        rel_ids.get(pair) or relation_id(pair))
        if line is not None:
            _parse(line, "id", f.id)
        changed["facts"].append(f.id)
        return f

    entity_lines = _patched(project.entities_path, keys["entities"], lambda: sorted(t.entities), t.new_entities,
                            remake_entity)
    relation_lines = _patched(project.relations_path, keys["relations"], lambda: sorted(t.relations),
                              t.new_relations, remake_relation)
    fact_lines = _patched(project.facts_path, keys["facts"], changed_facts, t.new_facts, remake_fact)
    store.write_jsonl(project.entities_path, entity_lines, compress=True)
    store.write_jsonl(project.relations_path, relation_lines, compress=True)
    store.write_jsonl(project.facts_path, fact_lines)
    return graph_ents, graph_rels, unknown, {k: sorted(v) for k, v in changed.items()}

