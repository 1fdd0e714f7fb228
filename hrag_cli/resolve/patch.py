"""After new records were merged into resolve's saved state: the record files patched, making records again
only for the keys the merge touched.

entities.jsonl, relations.jsonl and facts.jsonl are sorted by key (entity id, entity pair, fact key), and the
saved state holds every key, so a changed key's row in the new file is its place among the sorted keys, and
its row in the old one that less the keys the merge created before it. The lines made again go into each
file's patch (line_patch.LinePatch: the base stays as it is, hard-linked from the last generation), merged with the
patch it had; a patch past `base_patch.RECORD_FILES` of its base's lines is folded into a new base instead (the file written
whole). A fact names its subject and object, so a fact whose entity changed its display name is made again
too. The graph gets the entities and relations made again (the rest are as the graph on disk has them). The
logical file is the one a full resolve would write; a file with more or fewer lines than the state has keys,
a patch that does not fit its base, or a checked line whose key is not the one expected raises OutOfStep, and
resolve merges from scratch instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from hrag_cli.core import base_patch, jsonl_lines, line_patch, store
from hrag_cli.graph.model import GraphEntity, GraphRelation
from hrag_cli.resolve.merge_records import (
    UNKNOWN, _EntityAcc, _FactAcc, _RelationAcc, _top, entity_record, fact_record, live, relation_id,
    relation_record)
from hrag_cli.resolve.summaries import Summarizer

_CHECKS = 3             # replaced lines per file read back and checked to hold the key expected


# record file -> gzip-indexed: entities and relations are read whole and their descriptions repeat; facts stay
# plain lines, which a query reads one by one at their offsets (resolve.write_outputs and a fold both write by it)
COMPRESSED = {"entities": True, "relations": True, "facts": False}


class OutOfStep(Exception):
    """An output file does not match the saved state."""


class _Section:
    """One record file being patched: its changed keys in key order, where they go, and the lines made."""

    def __init__(self, path: Path, accs: Any, changed: list, new: set) -> None:
        self.path, self.keys = path, changed
        try:
            self.old = jsonl_lines.JsonlLines(path)
        except FileNotFoundError:
            raise OutOfStep("is missing") from None
        except line_patch.PatchError as exc:
            raise OutOfStep(str(exc)) from None
        total = accs.total()
        if len(self.old) != total - len(new):
            raise OutOfStep(f"has {len(self.old)} lines for {total - len(new)} keys")
        # a key's row in the new file: its rank among the state's keys and the created ones (one block's keys
        # read per key, never every key)
        self.rows = np.array(accs.ranks(changed), dtype=np.int64)
        self.new = np.fromiter((k in new for k in changed), dtype=bool, count=len(changed))
        # in the old file: an old key's row; a new key's, the old rows before it
        self.old_rows = self.rows - (np.cumsum(self.new) - self.new)
        # a few replaced lines read back: where that is cheap (a compressed base reads one member; a plain one
        # would find every line start first, so only its line count is checked)
        old = np.flatnonzero(~self.new) if self.old.compressed else []
        self.checked = set(old[np.linspace(0, len(old) - 1, _CHECKS).astype(int)].tolist()) if len(old) else set()
        self.made: list[bytes] = []

    def old_line(self, i: int) -> bytes:
        line = self.old.raw(int(self.old_rows[i]))
        if line is None:
            raise OutOfStep("has a damaged line")
        return line

    def remake(self, remake: Callable[[Any, bytes | None, bool], Any]) -> None:
        """The line of every changed key, made by `remake(key, old line or None, existed)`; an old line is read
        only for the few keys checked."""
        for i, (key, new) in enumerate(zip(self.keys, self.new.tolist())):
            line = None if new or i not in self.checked else self.old_line(i)
            self.made.append(store.dumps(remake(key, line, not new)) + b"\n")

    def write(self, compress: bool, base_id: str) -> None:
        """The old patch and the lines made, as the file's new patch; the file written whole when that patch
        passes `base_patch.RECORD_FILES` of the base; nothing when no line was made. `base_id` names the base's content for a
        first patch on it."""
        if not self.made:
            return
        was = self.old.patch
        exists = ~self.new
        at = self.old_rows[exists]
        base = np.full(len(self.rows), -1, dtype=np.int64)
        if was is not None and len(was):
            j = np.searchsorted(was.rows, at)
            jc = np.minimum(j, len(was.rows) - 1)
            hit = (j < len(was.rows)) & (was.rows[jc] == at)
            base[exists] = np.where(hit, was.base[jc], at - was.ins_before[j])
            kept = np.ones(len(was.rows), dtype=bool)
            kept[j[hit]] = False
            kept = np.flatnonzero(kept)
            moved = was.rows[kept] + np.searchsorted(self.old_rows[self.new], was.rows[kept], side="right")
            rows = np.concatenate([moved, self.rows])
            base = np.concatenate([was.base[kept], base])
            lines = [was.line(k) for k in kept.tolist()] + self.made
        else:
            base[exists] = at
            rows, lines = self.rows, self.made
        order = np.argsort(rows, kind="stable")
        lines = [lines[k] for k in order.tolist()]
        if was is not None:
            mark = (was.base_lines, was.base_size, was.base_tail, was.base_id)
        else:
            mark = (len(self.old), *line_patch.base_mark(self.path), base_id)
        patch = line_patch.LinePatch(rows[order], base[order], lines, *mark)
        try:
            patch.check()
        except line_patch.PatchError as exc:
            raise OutOfStep(str(exc)) from None
        if not base_patch.RECORD_FILES.folds(len(patch), patch.base_lines):
            store.write_patch(self.path, patch)
            return
        try:        # a base found short (a damaged member ends its lines early) while folding: merge from scratch
            store.write_jsonl(self.path, (orjson.Fragment(b[:-1]) for b in line_patch.patched_blocks(self.path, patch)),
                              compress=compress, base=True)
        except line_patch.PatchError as exc:
            raise OutOfStep(str(exc)) from None


def _parse(line: bytes, field: str, key: str) -> dict:
    """An old line about to be replaced, checked to be about `key`."""
    try:
        rec = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise OutOfStep("has a line that is not JSON") from None
    if not isinstance(rec, dict) or rec.get(field) != key:
        raise OutOfStep(f"has {rec.get(field) if isinstance(rec, dict) else rec!r} where {key!r} belongs")
    return rec


def patch_outputs(project: Any, merged: Any, summarizer: Summarizer, base_id: str
                  ) -> tuple[list[GraphEntity], list[GraphRelation], int, dict[str, list[str]]]:
    """Patch the three record files for `merged.touched` (its sections resolve_state.Lazy: they rank a key
    among every key without reading them all); returns the
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

    def remake_entity(eid: str, line: bytes | None, existed: bool) -> Any:
        nonlocal unknown
        acc = live(ents, eid, _EntityAcc)
        name = names[eid] = _top(acc.names)
        e = entity_record(eid, acc, name, summarizer.describe("entity", name, acc.descs) if acc.descs else "")
        if existed:
            if line is not None:        # a spot check: the line is about this entity
                _parse(line, "id", eid)
            # its name and type before this run, as the merge saw them: not the line, which a run killed
            # between two files' patches may already have made again
            old = t.old_entities[eid]
            if old[0] != name:
                renamed.add(eid)
            unknown -= old[1] == UNKNOWN
        unknown += e.type == UNKNOWN
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

    def remake_relation(pair: tuple[str, str], line: bytes | None, existed: bool) -> Any:
        racc = live(rels, pair, _RelationAcc)
        desc = (summarizer.describe("relation", f"{name_of(pair[0])} and {name_of(pair[1])}", racc.descs)
                if racc.descs else "")
        r = relation_record(pair, racc, desc)
        if line is not None:
            _parse(line, "id", r.id)
        rel_ids[pair] = r.id
        graph_rels.append(GraphRelation(r.id, r.src, r.tgt, r.weight, r.rel_type))
        changed["relations"].append(r.id)
        return r.to_json()

    def changed_facts() -> list[tuple[str, str, str]]:
        """The facts merged into, and those naming a renamed entity (known once the entities are made)."""
        out = set(t.facts)
        if renamed:
            out.update(t.facts_naming(merged, renamed))
        return sorted(out)

    def remake_fact(fkey: tuple[str, str, str], line: bytes | None, existed: bool) -> Any:
        s, _, o = fkey
        pair = (s, o) if s < o else (o, s)
        f = fact_record(fkey, live(facts, fkey, _FactAcc), name_of(s), name_of(o),
                        rel_ids.get(pair) or relation_id(pair))
        if line is not None:
            _parse(line, "id", f.id)
        changed["facts"].append(f.id)
        return f

    # every section is made and checked before any file is written: an OutOfStep leaves the files as they were
    entities = _Section(project.entities_path, ents, sorted(t.entities), t.new_entities)
    entities.remake(remake_entity)
    relations = _Section(project.relations_path, rels, sorted(t.relations), t.new_relations)
    relations.remake(remake_relation)
    fact_section = _Section(project.facts_path, facts, changed_facts(), t.new_facts)
    fact_section.remake(remake_fact)
    # `base_id`, the last resolve's output digest: a base without a patch is as that run left it, and its digest
    # hashed it whole, so it names the base's content (no base is read again to name it)
    if not base_id:
        raise OutOfStep("have no resolve output digest to name their bases by")
    entities.write(COMPRESSED["entities"], base_id)
    relations.write(COMPRESSED["relations"], base_id)
    fact_section.write(COMPRESSED["facts"], base_id)
    return graph_ents, graph_rels, unknown, {k: sorted(v) for k, v in changed.items()}

