"""Resolve's merge from scratch in partitions of the entity id range, spilled to disk, so its peak memory is one
partition's accumulators and not the corpus's (docs/design.md, "Records and resolve").

One pass over the records, in chunk_id order, applies the mention rules of resolve.stage._merge per record (entity
ids, an alias written in the same chunk, dropped rows, self-loops) and appends each mention as an event to the
spill file of its key's partition: entity rows and relation endpoints by entity id, relations by their pair's first
id, facts by their subject; each chunk's mention counts go to one more file (the graph's MENTIONED_IN edges). A
partition is a range of entity ids, so merging the partitions one after another meets every key in key order:
the record files, the state file's blocks and the graph's columns are appended partition by partition and come
out as the merge of every record in memory writes them, byte for byte. Each key's events keep the records'
order, so its accumulator is the one that merge makes. Entities first (every partition), then relations and facts,
which need the display names of entities in other partitions (a fact names its subject and object; kept as the
graph's name column).

The bounds are quantiles of the ids named in the first records (records come in chunk_id order, a hash order, so
they are a fair sample), and the number of partitions is the events those records give, scaled to every record,
over PART_EVENTS: small projects are one partition, merged in memory as before (`bounds` gives no cuts).
"""

from __future__ import annotations

import bisect
import marshal
import math
import shutil
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from hrag_cli.core import line_patch, store
from hrag_cli.core.records import ChunkRef, Document, Entity, ExtractionRecord, Fact
from hrag_cli.extract.parser import DEFAULT_PREDICATE
from hrag_cli.graph.model import _structure
from hrag_cli.graph.pickle_format import GraphColumns
from hrag_cli.resolve import state as resolve_state
from hrag_cli.resolve.aliases import MergeKeys, needs_plan
from hrag_cli.resolve.graph_build import GraphBuild
from hrag_cli.resolve.merge_records import (
    UNKNOWN, _EntityAcc, _FactAcc, _RelationAcc, _top, entity_record, fact_record, relation_ends, relation_id,
    relation_record)
from hrag_cli.resolve.summaries import SummaryJob, Summarizer

# mention events (entity rows, relation endpoints, relations, facts) merged at once: an event's share of the
# accumulators is a few hundred bytes in CPython, so a partition holds a few hundred MB at most whatever the
# corpus (docs/benchmarks.md); fewer would add partitions (each a pass over its spill file) for little memory
PART_EVENTS = 500_000
SAMPLE = 2_000          # records read to place the bounds and count events per record
_BUFFERED = 1 << 16     # events a spill buffers over its partitions before they are appended to their files
_LEN = struct.Struct("<Q")


@dataclass
class Cuts:
    """The first entity id of each partition but the first, of the entities' partitions and of the relations'
    and facts' (by the pair's first id and by the subject)."""

    entities: list[str]
    relations: list[str]

    def __bool__(self) -> bool:
        return bool(self.entities or self.relations)


def bounds(records: Iterable[ExtractionRecord], n_records: int, ident: Callable[[Any], tuple[str, str]]) -> Cuts:
    """Cuts for `n_records` records (empty: one partition does), from the first records in chunk_id order
    (SAMPLE of them are read): each kind's events as they spread over the ids."""
    ents: list[str] = []        # an entity event's id (rows and relation endpoints)
    rels: list[str] = []        # a relation's first id and a fact's subject
    seen = 0
    for rec in islice(records, SAMPLE):
        seen += 1
        for e in rec.entities:
            k = ident(e.name)[0]
            if k:
                ents.append(k)
        for r in rec.relations:
            s, t = ident(r.src)[0], ident(r.tgt)[0]
            if s and t and s != t:
                ents += (s, t)
                rels += (min(s, t), s)
    scale = n_records / max(seen, 1) / PART_EVENTS
    return Cuts(_quantiles(ents, math.ceil(len(ents) * scale)), _quantiles(rels, math.ceil(len(rels) * scale)))


def _quantiles(ids: list[str], parts: int) -> list[str]:
    if parts <= 1 or not ids:
        return []
    ids.sort()
    return sorted({ids[len(ids) * i // parts] for i in range(1, parts)} - {ids[0]})


class _Spill:
    """Events per partition, buffered and appended to that partition's file as marshal frames (opened for each
    append: a large corpus has more partitions than a process may keep files open)."""

    def __init__(self, folder: Path, name: str, parts: int) -> None:
        self.paths = [folder / f"{name}-{p}.bin" for p in range(parts)]
        self.parts = parts
        self.bufs: list[list] = [[] for _ in range(parts)]
        self.flush_at = max(256, _BUFFERED // parts)

    def add(self, p: int, event: tuple) -> None:
        buf = self.bufs[p]
        buf.append(event)
        if len(buf) >= self.flush_at:
            self._flush(p)

    def _flush(self, p: int) -> None:
        blob = marshal.dumps(self.bufs[p])
        with open(self.paths[p], "ab") as fh:
            fh.write(_LEN.pack(len(blob)) + blob)
        self.bufs[p] = []

    def close(self) -> None:
        for p in range(len(self.bufs)):
            if self.bufs[p]:
                self._flush(p)

    def read(self, p: int) -> Iterator[list]:
        """Partition p's events, a frame at a time, in the order they were added."""
        if not self.paths[p].exists():
            return
        with open(self.paths[p], "rb") as fh:
            while head := fh.read(_LEN.size):
                (n,) = _LEN.unpack(head)
                yield marshal.loads(fh.read(n))


@dataclass
class Bucketed:
    """The records' events on disk, and what the pass counted."""

    keys: MergeKeys
    ents: _Spill
    rels: _Spill
    mentions: _Spill
    records: int = 0
    dropped_rows: int = 0
    self_loops: int = 0
    n_mentions: int = 0
    inexact: set[tuple[str, str]] = field(default_factory=set)


def bucket(records: Iterable[ExtractionRecord], keys: MergeKeys | None, cuts: Cuts, folder: Path,
           ident: Callable[[Any], tuple[str, str]], phrase: Callable[[str], str], strength: Callable[[Any], float]
           ) -> Bucketed | None:
    """One pass over `records` (chunk_id order) into events by partition (`cuts`: bounds); keys None: unplanned,
    and None back at the first record that needs a plan (as resolve.stage._merge)."""
    b = Bucketed(keys or MergeKeys(), _Spill(folder, "entities", len(cuts.entities) + 1),
                 _Spill(folder, "relations", len(cuts.relations) + 1), _Spill(folder, "mentions", 1))
    ent_cuts, rel_cuts, part = cuts.entities, cuts.relations, bisect.bisect_right
    entity_id, ent_add, rel_add, men_add = b.keys.entity_id, b.ents.add, b.rels.add, b.mentions.add
    dropped = loops = n_records = n_mentions = 0
    try:
        for rec in records:
            if keys is None and needs_plan(rec):
                return None
            chunk_id = rec.chunk_id
            n_records += 1
            per_chunk: dict[str, int] = {}
            row_ids: dict[str, str] = {}
            for e in rec.entities:
                key, sf = ident(e.name)
                if not key:
                    dropped += 1
                    continue
                eid = row_ids[key] = entity_id(key, e.type)
                per_chunk[eid] = per_chunk.get(eid, 0) + 1
                t = e.type.strip() if isinstance(e.type, str) else ""
                d = e.description.strip() if isinstance(e.description, str) else ""
                aliases = None
                if e.aliases:
                    aliases = []
                    for a in e.aliases:
                        akey, asf = ident(a)
                        if akey:
                            aliases.append(asf)
                            row_ids.setdefault(akey, eid)
                ent_add(part(ent_cuts, eid), (eid, chunk_id, sf, t, d, aliases))
            for r in rec.relations:
                ends = relation_ends(r, ident, row_ids, entity_id)
                if ends is None:
                    dropped += 1
                    continue
                s, s_sf, t, t_sf = ends
                for eid, sf in (((s, s_sf),) if s == t else ((s, s_sf), (t, t_sf))):
                    per_chunk[eid] = per_chunk.get(eid, 0) + 1
                    ent_add(part(ent_cuts, eid), (eid, chunk_id, sf))
                if s == t:
                    loops += 1
                    continue
                pair = (s, t) if s < t else (t, s)
                pred = phrase(r.predicate) if isinstance(r.predicate, str) else ""
                kws = None
                if r.keywords:
                    kws = [k for k in (phrase(kw) if isinstance(kw, str) else "" for kw in
                                       ([r.keywords] if isinstance(r.keywords, str) else r.keywords)) if k]
                d = r.description.strip() if isinstance(r.description, str) else ""
                rtype = r.rel_type if r.rel_type and isinstance(r.rel_type, str) else None
                rel_add(part(rel_cuts, pair[0]), (pair[0], pair[1], chunk_id, strength(r.strength), pred, kws, d, rtype))
                pred = pred or DEFAULT_PREDICATE
                rel_add(part(rel_cuts, s), (s, pred.casefold(), t, chunk_id, pred))
            for eid, n in per_chunk.items():
                men_add(0, (chunk_id, eid, n))
            n_mentions += len(per_chunk)
    finally:
        for spill in (b.ents, b.rels, b.mentions):
            spill.close()
    b.records, b.dropped_rows, b.self_loops, b.n_mentions = n_records, dropped, loops, n_mentions
    return b


def _entities(frames: Iterable[list]) -> dict[str, _EntityAcc]:
    """One partition's entity accumulators (events in chunk_id order: a source is new or the last one)."""
    ents: dict[str, _EntityAcc] = {}
    for batch in frames:
        for ev in batch:
            eid, chunk_id, sf = ev[0], ev[1], ev[2]
            acc = ents.get(eid)
            if acc is None:
                acc = ents[eid] = _EntityAcc()
            acc.names[sf] = acc.names.get(sf, 0) + 1
            src = acc.sources
            if not src or src[-1] < chunk_id:
                src.append(chunk_id)
            if len(ev) > 3:
                t, d, aliases = ev[3], ev[4], ev[5]
                acc.types[t] = acc.types.get(t, 0) + 1
                if d:
                    acc.descs[d] = acc.descs.get(d, 0) + 1
                if aliases is not None:
                    if acc.aliases is None:
                        acc.aliases = set()
                    acc.aliases.update(aliases)
    return ents


def _relations(frames: Iterable[list], inexact: set[tuple[str, str]]
               ) -> tuple[dict[tuple[str, str], _RelationAcc], dict[tuple[str, str, str], _FactAcc]]:
    """One partition's relation and fact accumulators."""
    rels: dict[tuple[str, str], _RelationAcc] = {}
    facts: dict[tuple[str, str, str], _FactAcc] = {}
    for batch in frames:
        for ev in batch:
            if len(ev) == 5:
                fkey = ev[:3]
                facc = facts.get(fkey)
                if facc is None:
                    facc = facts[fkey] = _FactAcc()
                facc.predicates[ev[4]] = facc.predicates.get(ev[4], 0) + 1
                src = facc.sources
                if not src or src[-1] < ev[3]:
                    src.append(ev[3])
                continue
            pair, chunk_id, w, pred, kws, d, rtype = ev[:2], ev[2], ev[3], ev[4], ev[5], ev[6], ev[7]
            racc = rels.get(pair)
            if racc is None:
                racc = rels[pair] = _RelationAcc()
            # as resolve.stage._merge: a sum of strengths that are not multiples of 1/1024 depends on its order
            if not ((w * 1024.0).is_integer() and -1e4 < w < 1e4):
                inexact.add(pair)
            racc.weight += w
            if pred and pred not in racc.predicates:
                racc.predicates.append(pred)
            if kws:
                for kw in kws:
                    if kw not in racc.keywords:
                        racc.keywords.append(kw)
            if d:
                racc.descs[d] = racc.descs.get(d, 0) + 1
            src = racc.sources
            if not src or src[-1] < chunk_id:
                src.append(chunk_id)
            if rtype is not None:
                types = racc.types = racc.types or {}
                types[rtype] = types.get(rtype, 0) + 1
    return rels, facts


@dataclass
class Built:
    """What a partitioned build wrote, for resolve's counts."""

    graph: GraphColumns
    keys: tuple[np.ndarray, np.ndarray, np.ndarray]     # walk.npz's key arrays (graph.model.walk_arrays)
    entities: int
    relations: int
    facts: int
    unknown: int
    summaries: int
    merges: list[dict]


def build(project: Any, b: Bucketed, summarizer: Summarizer, docs: list[Document],
          chunks: list[ChunkRef], state: resolve_state.Spooled | None, compressed: dict[str, bool]) -> Built:
    """Merge the partitions of `b` one at a time into the record files, the state (`state`, when one is kept)
    and the graph (resolve/graph_build.py: its columns made as the partitions come, in arrays)."""
    g = GraphBuild(_structure(docs, chunks))
    unknown = summaries = 0

    def entities() -> Iterator[Entity]:
        nonlocal unknown, summaries
        for p in range(b.ents.parts):
            accs = _entities(b.ents.read(p))
            keys = sorted(accs)
            _save(state, "entities", keys, accs)
            shown = {eid: _top(accs[eid].names) for eid in keys}
            desc = {eid: summarizer.describe("entity", shown[eid], accs[eid].descs) for eid in keys
                    if accs[eid].descs}
            texts = _run(summarizer, desc)
            summaries += sum(isinstance(d, SummaryJob) for d in desc.values())
            types, aliases = [], []
            for eid in keys:
                e = entity_record(eid, accs.pop(eid), shown[eid], texts.get(eid, ""))
                unknown += e.type == UNKNOWN
                types.append(e.type)
                aliases.append(e.aliases)
                yield e
            g.add_entities(keys, [shown[eid] for eid in keys], types, aliases)

    n_ent = store.write_jsonl(project.entities_path, entities(), compressed["entities"], base=True)
    n_fact = 0

    def relations(facts_out: BinaryIO) -> Iterator[dict]:
        nonlocal summaries, n_fact
        for p in range(b.rels.parts):
            rels, facts = _relations(b.rels.read(p), b.inexact)
            keys = sorted(rels)
            _save(state, "relations", keys, rels)
            fkeys = sorted(facts)
            _save(state, "facts", fkeys, facts)
            src, tgt = g.vertices([pair[0] for pair in keys]), g.vertices([pair[1] for pair in keys])
            g.add_relation_ends(src, tgt)
            pick = np.flatnonzero(np.fromiter((bool(rels[pair].descs) for pair in keys), dtype=bool, count=len(keys)))
            ends = zip(map(keys.__getitem__, pick.tolist()), g.entity_names(src[pick]), g.entity_names(tgt[pick]))
            desc = {pair: summarizer.describe("relation", f"{a} and {z}", rels[pair].descs) for pair, a, z in ends}
            del src, tgt, pick, ends
            texts = _run(summarizer, desc)
            summaries += sum(isinstance(d, SummaryJob) for d in desc.values())
            for pair in keys:
                r = relation_record(pair, rels.pop(pair), texts.get(pair, ""))
                g.add_relation(r.id, float(r.weight), r.rel_type or None)
                yield r.to_json()
            n_fact += len(fkeys)
            store.write_lines(facts_out, _facts(facts, fkeys, g))

    with store.atomic_writer(project.facts_path) as fh:
        n_rel = store.write_jsonl(project.relations_path, relations(fh), compressed["relations"], base=True)
    line_patch.patch_path(project.facts_path).unlink(missing_ok=True)
    for batch in b.mentions.read(0):
        g.add_mentions(batch)
    graph, keys = g.finish()
    return Built(graph, keys, n_ent, n_rel, n_fact, unknown, summaries, b.keys.report())


def _run(summarizer: Summarizer, desc: dict[Any, str | SummaryJob]) -> dict[Any, str]:
    """The descriptions of one partition's keys, its summaries run together."""
    jobs = [d for d in desc.values() if isinstance(d, SummaryJob)]
    done = summarizer.run(jobs) if jobs else {}
    return {k: done[d.key] if isinstance(d, SummaryJob) else d for k, d in desc.items()}


def _facts(accs: dict[tuple[str, str, str], _FactAcc], order: list[tuple[str, str, str]], g: GraphBuild
           ) -> Iterator[Fact]:
    """One partition's fact records, in key order (the names of their subjects and objects looked up at once)."""
    subjects = g.entity_names(g.vertices([fkey[0] for fkey in order]))
    objects = g.entity_names(g.vertices([fkey[2] for fkey in order]))
    for fkey, s_name, o_name in zip(order, subjects, objects):
        s, _, o = fkey
        yield fact_record(fkey, accs.pop(fkey), s_name, o_name, relation_id((s, o) if s < o else (o, s)))


def _save(state: resolve_state.Spooled | None, section: str, keys: list, accs: dict) -> None:
    """A partition's accumulators into the state, in key order."""
    if state is not None:
        for key in keys:
            state.add(section, key, accs[key].fields())


def spill_folder(project: Any) -> Path:
    """Where the events go (removed after the build, and at the start of the next one if a run was killed)."""
    return project.graph_path.parent / "resolve-spill"


def clear(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
