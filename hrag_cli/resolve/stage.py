"""The resolve stage: the current chunks' extraction records -> entities, relations, facts and the graph.

The outputs are a pure function of (current chunks, their extraction records, the summary cache, settings):
after any add/change/delete they equal a from-scratch build, byte for byte. Chunks are visited in chunk_id
order, which makes even float weight sums independent of document order. When documents were only added, the
new chunks' records are merged into the accumulators the last run saved (resolve/state.py) and the record
files patched for the keys they touched (resolve/patch.py); anything else merges from scratch.

Merge rules (LightRAG semantics; docs/design.md, "Records and resolve"):
- entity id = normalize_name(surface form), except where aliases.plan_merges joins names through the aliases
  the model gave or splits one name used for two types (graph/merges.jsonl says which); display name = most
  frequent surface form (ties: smallest text); aliases = the other surface forms and the declared aliases;
  type = most frequent real type (ties: smallest text; "unknown"/empty votes count only when nothing else was
  said; none at all -> UNKNOWN);
- a mention is an entity row or a relation endpoint; source_ids = every chunk with a mention;
  MENTIONED_IN weight = the chunk's mention count of that entity (rows + endpoints);
- one relation per unordered pair (src < tgt by id, id = hash of the pair); weight = sum of strengths;
  predicates/keywords unioned (case-insensitive) and sorted; rel_type = the most frequent schema relation type
  of its typed mentions (ties: smallest text; no typed mention -> ""); self-loops dropped; an endpoint without
  an entity row becomes an UNKNOWN-typed entity;
- one fact per (subject id, predicate, object id), direction kept, linked to its relation;
- descriptions: see summaries.Summarizer.
"""

from __future__ import annotations

import bisect
import gc
import hashlib
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from hrag_cli.resolve import partition
from hrag_cli.resolve import patch as resolve_patch
from hrag_cli.resolve import state as resolve_state
from hrag_cli.core import base_patch, line_patch, store
from hrag_cli.resolve.aliases import MergeKeys, needs_plan, plan_merges
from hrag_cli.core.config import Settings
from hrag_cli.extract.parser import DEFAULT_PREDICATE
from hrag_cli.graph.model import edge_counts, graph_columns, save_graph
from hrag_cli.resolve.graph_update import every_input, graph_inputs, save_updated, updated_graph
from hrag_cli.core.normalize import clean_surface, normalize_name
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir, StageOutcome, fingerprint
from hrag_cli.core.records import ChunkRef, Document, Entity, ExtractionRecord, Fact, Relation, to_dict
from hrag_cli.resolve.merge_records import (
    UNKNOWN, _EntityAcc, _FactAcc, _RelationAcc, _top, _vote_type, entity_record, fact_record, live, relation_ends,
    relation_record)
from hrag_cli.resolve.summaries import SummaryJob, Summarizer, summary_prompt_version
from hrag_cli.chunk.stage import chunk_mark, load_chunk_refs, load_documents

def settings_fingerprint(settings: Settings) -> str:
    """Resolve settings; the model, language, context size and prompt wording only when summaries can run."""
    llm_part = None
    if settings.llm.model:
        llm_part = (settings.llm.model, settings.llm.context_tokens, settings.extract.language,
                    summary_prompt_version())
    return fingerprint("resolve-v1", to_dict(settings.resolve), llm_part)


# ----------------------------------------------------------------------------------------------- merging


@dataclass
class Merged:
    """Accumulated mentions, before descriptions are decided."""

    entities: dict[str, _EntityAcc] = field(default_factory=dict)
    relations: dict[tuple[str, str], _RelationAcc] = field(default_factory=dict)
    facts: dict[tuple[str, str, str], _FactAcc] = field(default_factory=dict)
    mentions: list[tuple[str, str, int]] = field(default_factory=list)   # (chunk_id, entity_id, count)
    dropped_rows: int = 0
    self_loops: int = 0
    records: int = 0
    keys: MergeKeys = field(default_factory=MergeKeys)
    # relations that summed a strength that is not a multiple of 1/1024: their float weight depends on the order
    # of the sum, so a later merge cannot add to it and match a fresh build (resolve then merges from scratch)
    inexact: set[tuple[str, str]] = field(default_factory=set)
    touched: Touched | None = None     # set by a merge `into` saved state: what it changed
    base_mentions: int = 0             # mentions a loaded state had (it keeps their count, not them)

    def totals(self) -> dict[str, int]:
        """Items per section and mentions: after a merge into a state (Lazy sections holding only the keys read
        or created) from the state's counts, not len()."""
        out = {s: (accs.total() if isinstance(accs, resolve_state.Lazy) else len(accs))
               for s, accs in (("entities", self.entities), ("relations", self.relations), ("facts", self.facts))}
        return {**out, "mentions": self.base_mentions + len(self.mentions)}


@dataclass
class Touched:
    """The keys a merge into saved state changed (their records must be made again), and which of them it
    created (they have no line in the previous files)."""

    records: int
    entities: set[str]
    relations: set[tuple[str, str]]
    facts: set[tuple[str, str, str]]
    new_entities: set[str]
    new_relations: set[tuple[str, str]]
    new_facts: set[tuple[str, str, str]]
    mentions: list[tuple[str, str, int]]     # the new chunks' mentions, in chunk_id order (for the graph)
    # entity id -> its (display name, type) before this merge, for each entity it touched that existed
    old_entities: dict[str, tuple[str, str]] = field(default_factory=dict)
    # (the Merged, entity ids) -> every fact key naming one of them (set by a merge into the state:
    # _facts_naming with the records it read; the Merged is an argument, so no cycle keeps it alive)
    facts_naming: Callable[[Merged, set[str]], set[tuple[str, str, str]]] | None = None


@lru_cache(maxsize=1_000_000)
def _ident_str(name: str) -> tuple[str, str]:
    return normalize_name(name), clean_surface(name)


def _ident(name: str) -> tuple[str, str]:
    """(entity id, cleaned surface form) of a name as written: one cached call per mention. The type test
    comes first: a hand-edited or damaged record can hold a list or dict there, which lru_cache cannot hash."""
    return _ident_str(name) if isinstance(name, str) else ("", "")


def _strength(value: object) -> float:
    """A relation strength as a finite float; anything else counts as 1 (a NaN would poison every sum)."""
    try:
        w = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 1.0
    return w if math.isfinite(w) else 1.0


@lru_cache(maxsize=200_000)
def _phrase(s: str) -> str:
    """Predicates/keywords: single spaces, trimmed."""
    return " ".join(s.split())


def merge_records(records: Callable[[], Iterable[ExtractionRecord]]) -> Merged:
    """`records()` yields the records one at a time in chunk_id order (so source lists come out sorted and
    float sums do not depend on document order), afresh on each call. Which names are one entity (aliases,
    one name with two types) is decided first, in a pass of its own (aliases.plan_merges), for records that
    need it; offline records never do, so for them the merge is the only pass (it starts over, planned, if
    such a record turns up)."""
    return _merge(records(), None) or _merge(records(), plan_merges(records()))


def _insert_source(sources: list[str], chunk_id: str) -> None:
    """A chunk id that sorts before the last of `sources` goes in its place, once. Records come in chunk_id
    order, so only a merge into saved state (new chunks among old ones) meets one; the merge loop appends."""
    i = bisect.bisect_left(sources, chunk_id)
    if sources[i] != chunk_id:
        sources.insert(i, chunk_id)


def _merge(records: Iterable[ExtractionRecord], keys: MergeKeys | None, into: Merged | None = None
           ) -> Merged | None:
    """One pass; keys None: unplanned, and None back at the first record that needs a plan. `into`: add the
    records to what an earlier merge accumulated (records of chunks it did not see); None back, and `into`
    half-changed, when a record needs a plan or a strength that is not a multiple of 1/1024 meets a relation
    seen before (the float sum would not equal a fresh build's). The loop is written out flat (no helper
    calls per mention but the rare out-of-order source, plain dicts instead of Counters): it runs once per
    mention, millions of times at scale."""
    m = into or Merged(keys=keys or MergeKeys())
    ents, rels, facts = m.entities, m.relations, m.facts
    mentions: list[tuple[str, str, int]] = [] if into else m.mentions
    inexact = m.inexact
    born: set[tuple[str, str]] = set()     # relations this `into` merge created: all their strengths are here
    t_rel: set[tuple[str, str]] = set()
    t_fact: set[tuple[str, str, str]] = set()
    absent_before = (set(getattr(ents, "absent", ())), set(getattr(facts, "absent", ())))
    ident, phrase, entity_id, insert_source = _ident, _phrase, m.keys.entity_id, _insert_source
    ent_saved, rel_saved, fact_saved = _EntityAcc.saved, _RelationAcc.saved, _FactAcc.saved
    dropped = loops = n_records = 0
    track = into is not None
    old: dict[str, tuple[str, str] | None] = {}     # (track) entities touched: their name and type before

    for rec in records:
        if keys is None and needs_plan(rec):
            return None
        chunk_id = rec.chunk_id
        n_records += 1
        per_chunk: dict[str, int] = {}
        row_ids: dict[str, str] = {}        # name (or alias) key -> entity id of this chunk's entity rows
        for e in rec.entities:
            key, sf = ident(e.name)
            if not key:
                dropped += 1
                continue
            eid = row_ids[key] = entity_id(key, e.type)     # a row's own name wins over another row's alias
            acc = ents.get(eid)
            if track and eid not in old:
                old[eid] = _name_type(acc)
            if acc is None:
                acc = ents[eid] = _EntityAcc()
            elif acc.__class__ is tuple:    # a saved key, touched for the first time (merge_records.live)
                acc = ents[eid] = ent_saved(acc)
            acc.names[sf] = acc.names.get(sf, 0) + 1
            src = acc.sources
            if not src or src[-1] < chunk_id:
                src.append(chunk_id)
            elif src[-1] != chunk_id:
                insert_source(src, chunk_id)
            per_chunk[eid] = per_chunk.get(eid, 0) + 1
            t = e.type.strip() if isinstance(e.type, str) else ""
            acc.types[t] = acc.types.get(t, 0) + 1
            d = e.description.strip() if isinstance(e.description, str) else ""
            if d:
                acc.descs[d] = acc.descs.get(d, 0) + 1
            if e.aliases:
                if acc.aliases is None:
                    acc.aliases = set()
                for a in e.aliases:
                    akey, asf = ident(a)
                    if akey:
                        acc.aliases.add(asf)
                        row_ids.setdefault(akey, eid)   # an endpoint written with it, in this chunk: this entity
        for r in rec.relations:
            ends = relation_ends(r, ident, row_ids, entity_id)
            if ends is None:
                dropped += 1
                continue
            s, s_sf, t, t_sf = ends
            ends = ((s, s_sf),) if s == t else ((s, s_sf), (t, t_sf))
            for eid, sf in ends:  # endpoints are mentions; a self-loop row names its entity once
                acc = ents.get(eid)
                if track and eid not in old:
                    old[eid] = _name_type(acc)
                if acc is None:
                    acc = ents[eid] = _EntityAcc()
                elif acc.__class__ is tuple:
                    acc = ents[eid] = ent_saved(acc)
                acc.names[sf] = acc.names.get(sf, 0) + 1
                src = acc.sources
                if not src or src[-1] < chunk_id:
                    src.append(chunk_id)
                elif src[-1] != chunk_id:
                    insert_source(src, chunk_id)
                per_chunk[eid] = per_chunk.get(eid, 0) + 1
            if s == t:
                loops += 1
                continue
            pair = (s, t) if s < t else (t, s)
            racc = rels.get(pair)
            if racc is None:
                racc = rels[pair] = _RelationAcc()
                if into is not None:
                    born.add(pair)
            elif racc.__class__ is tuple:
                racc = rels[pair] = rel_saved(racc)
            w = _strength(r.strength)
            # sums of multiples of 1/1024 below 2^42 are exact in any order (the rules extractor gives 1 and 0.5)
            if not ((w * 1024.0).is_integer() and -1e4 < w < 1e4) or pair in inexact:
                if into is not None and pair not in born:
                    return None
                inexact.add(pair)
            racc.weight += w
            if into is not None:
                t_rel.add(pair)
            pred = phrase(r.predicate) if isinstance(r.predicate, str) else ""
            if pred and pred not in racc.predicates:
                racc.predicates.append(pred)
            if r.keywords:
                for kw in ([r.keywords] if isinstance(r.keywords, str) else r.keywords):
                    kw = phrase(kw) if isinstance(kw, str) else ""
                    if kw and kw not in racc.keywords:
                        racc.keywords.append(kw)
            d = r.description.strip() if isinstance(r.description, str) else ""
            if d:
                racc.descs[d] = racc.descs.get(d, 0) + 1
            src = racc.sources
            if not src or src[-1] < chunk_id:
                src.append(chunk_id)
            elif src[-1] != chunk_id:
                insert_source(src, chunk_id)
            if r.rel_type and isinstance(r.rel_type, str):
                types = racc.types = racc.types or {}
                types[r.rel_type] = types.get(r.rel_type, 0) + 1
            if not pred:
                pred = DEFAULT_PREDICATE  # a fact needs a predicate to read as one
            fkey = (s, pred.casefold(), t)
            facc = facts.get(fkey)
            if facc is None:
                facc = facts[fkey] = _FactAcc()
            elif facc.__class__ is tuple:
                facc = facts[fkey] = fact_saved(facc)
            facc.predicates[pred] = facc.predicates.get(pred, 0) + 1
            if into is not None:
                t_fact.add(fkey)
            src = facc.sources
            if not src or src[-1] < chunk_id:
                src.append(chunk_id)
            elif src[-1] != chunk_id:
                insert_source(src, chunk_id)
        for eid, n in per_chunk.items():
            mentions.append((chunk_id, eid, n))
    m.records += n_records
    m.dropped_rows += dropped
    m.self_loops += loops
    if into is not None:
        _insert_mentions(m.mentions, mentions)
        # a key the state did not have (resolve_state.Lazy.created), first asked for by this merge, is new
        new_ents, new_facts = (set(d.created()) - before
                               for d, before in ((ents, absent_before[0]), (facts, absent_before[1])))
        m.touched = Touched(n_records, {eid for _, eid, _ in mentions}, t_rel, t_fact, new_ents, born, new_facts,
                            mentions, {eid: nt for eid, nt in old.items() if nt is not None})
    return m


def _name_type(acc: Any) -> tuple[str, str] | None:
    """An entity accumulator's (display name, type) as its record has them; None for no accumulator."""
    if acc is None:
        return None
    names, types = (acc[1], acc[2]) if acc.__class__ is tuple else (acc.names, acc.types)
    return _top(names), _vote_type(types)


def _insert_mentions(mentions: list[tuple[str, str, int]], new: list[tuple[str, str, int]]) -> None:
    """Put new chunks' mentions where a merge in chunk_id order would have them (each chunk's run stays whole
    and in its own order). `new` is in chunk_id order; the list is made again in one pass (inserting run by
    run would move the whole tail each time)."""
    runs: dict[str, list[tuple[str, str, int]]] = {}
    for m in new:
        runs.setdefault(m[0], []).append(m)
    pieces: list[Any] = []
    at = 0
    for chunk_id in sorted(runs):
        cut = bisect.bisect_left(mentions, chunk_id, lo=at, key=_first)
        pieces += (mentions[at:cut], runs[chunk_id])
        at = cut
    if pieces:
        pieces.append(mentions[at:])
        mentions[:] = list(itertools.chain.from_iterable(pieces))


def _first(t: tuple) -> str:
    return t[0]


@dataclass
class Resolved:
    entities: list[Entity]
    relations: list[Relation]
    facts: Iterator[Fact]     # made while written (one pass): at scale there are millions, and no graph needs them
    fact_count: int
    mentions: list[tuple[str, str, int]]
    stats: dict
    merges: list[dict] = field(default_factory=list)    # aliases.MergeKeys.report()
    records: int = 0                                     # extraction records merged


def finalize(merged: Merged, summarizer: Summarizer, keys: dict[str, list] | None = None) -> Resolved:
    """Decide names, types and descriptions (summaries run here, all at once) and build the records, in key
    order (`keys`: resolve_state.sorted_keys, when already made)."""
    keys = keys or resolve_state.sorted_keys(merged)
    names = {eid: _top(acc.names) for eid, acc in merged.entities.items()}
    entity_desc: dict[str, str | SummaryJob] = {}
    for eid, acc in merged.entities.items():
        entity_desc[eid] = summarizer.describe("entity", names[eid], acc.descs) if acc.descs else ""
    relation_desc: dict[tuple[str, str], str | SummaryJob] = {}
    for pair, racc in merged.relations.items():
        relation_desc[pair] = (summarizer.describe("relation", f"{names[pair[0]]} and {names[pair[1]]}", racc.descs)
                               if racc.descs else "")
    jobs = [d for d in entity_desc.values() if isinstance(d, SummaryJob)]
    jobs += [d for d in relation_desc.values() if isinstance(d, SummaryJob)]
    summaries = summarizer.run(jobs) if jobs else {}

    def text(d: str | SummaryJob) -> str:
        return summaries[d.key] if isinstance(d, SummaryJob) else d

    entities: list[Entity] = []
    unknown = 0
    for eid in keys["entities"]:   # each accumulator let go once its record is made
        e = entity_record(eid, merged.entities.pop(eid), names[eid], text(entity_desc.pop(eid)))
        unknown += e.type == UNKNOWN
        entities.append(e)
    relations: list[Relation] = []
    rel_ids: dict[tuple[str, str], str] = {}
    for pair in keys["relations"]:
        r = relation_record(pair, merged.relations.pop(pair), text(relation_desc.pop(pair)))
        rel_ids[pair] = r.id
        relations.append(r)
    return Resolved(entities, relations, _facts(merged.facts, keys["facts"], names, rel_ids), len(merged.facts),
                    merged.mentions,
                    _stats(merged, unknown, len(jobs)), merged.keys.report(), merged.records)


def _stats(merged: Merged, unknown: int, summaries: int) -> dict:
    return {"unknown_entities": unknown, "self_loops_dropped": merged.self_loops,
            "dropped_rows": merged.dropped_rows, "summaries": summaries, **merged.keys.stats()}


def _facts(accs: dict[tuple[str, str, str], _FactAcc], order: list[tuple[str, str, str]], names: dict[str, str],
           rel_ids: dict[tuple[str, str], str]) -> Iterator[Fact]:
    """The fact records in key order, each accumulator let go once its record is made."""
    for fkey in order:
        s, _, o = fkey
        yield fact_record(fkey, accs.pop(fkey), names[s], names[o], rel_ids[(s, o) if s < o else (o, s)])


# ----------------------------------------------------------------------------------------------- inputs


def load_records(project: ProjectDir, settings: Settings | None = None) -> Iterator[ExtractionRecord]:
    """The records resolve merges, one at a time in chunk_id order: the extract stage owns which record is
    current, and prune.py prunes it under `settings` when given."""
    if settings is None:
        from hrag_cli.extract.stage import iter_current_extractions

        return iter_current_extractions(project)
    from hrag_cli.extract.prune import iter_pruned

    return iter_pruned(project, settings)


def load_inputs(project: ProjectDir, settings: Settings | None = None
                ) -> tuple[list[Document], list[ChunkRef], Callable[[], Iterator[ExtractionRecord]]]:
    """Documents, chunks, and what merge_records reads the records through (they are never all held)."""
    docs = load_documents(project)
    return docs, load_chunk_refs(project), lambda: load_records(project, settings)


# ----------------------------------------------------------------------------------------------- stage


@dataclass
class Fresh:
    """What a merge from scratch reads: the current records, afresh on each call, in chunk_id order."""

    records: Callable[[], Iterator[ExtractionRecord]]
    count: int


def _merge_current(project: ProjectDir, settings: Settings, reporter: Reporter, use_state: bool, chunks: list[ChunkRef]
                   ) -> tuple[Merged | None, resolve_state.StateHeader, Fresh, resolve_state.Delta | None]:
    """The current records merged into the saved state, when `use_state` and adding is all that happened
    (then `merged.touched` says what changed since the last run), else None (merge from scratch); the header
    to save the result under; the records a merge from scratch reads (also when the saved outputs turn out not
    to match the state); and the delta to write instead of saving the state whole (None: save it whole)."""
    from hrag_cli.extract.stage import CurrentRecords, current_extractor, current_records
    from hrag_cli.extract.prune import iter_pruned, prune_spec

    extractor = current_extractor(project)
    spec = prune_spec(settings, extractor or "")
    # pruning reads the chunks' text: then they are read here, once, not by every pass over the records
    current = current_records(project, extractor, None if spec.active else chunks) if extractor else \
        CurrentRecords({}, [], [])
    base = resolve_state.basis(settings_fingerprint(settings), spec.describe(), extractor)
    header = resolve_state.StateHeader(base, dict(zip(current.ids, current.offsets)),
                                       *resolve_state.cache_mark(project.extractions_path))

    fresh = Fresh(lambda: iter_pruned(project, settings, current), len(current.ids))

    since = _since_state(project, reporter, base, header.offsets) if use_state else None
    saved = _load_state(project, reporter, since[0]) if since is not None else None
    if since is not None and saved is not None:
        (state, _), replay, new, unknown = since
        merged: Merged | None = saved[0]
        header.unknown = saved[1] if unknown is None else unknown
        try:
            if replay:      # the last runs' delta, already in the outputs: merged again, not "touched"
                merged = _merge(iter_pruned(project, settings, current.only(replay)), None, merged)
                if merged is not None:
                    merged.touched = None
            if merged is not None:
                merged = _merge(iter_pruned(project, settings, current.only(new)), None, merged)
        except resolve_state.Damaged as exc:    # a block read for a key the new records name
            reporter.warn(f"{project.resolve_state_path} is damaged ({exc}); merging every record again")
            merged = None
        if merged is not None:
            if merged.touched is not None:
                merged.touched.facts_naming = lambda m, eids: _facts_naming(
                    m, eids, lambda ids: iter_pruned(project, settings, current.only(ids)))
            added = replay | new
            small = not base_patch.RESOLVE_STATE.folds(len(added), len(state.offsets))
            delta = resolve_state.Delta(resolve_state.header_id(state), {c: header.offsets[c] for c in added},
                                        header.unknown) if small else None
            return merged, header, fresh, delta
    return None, header, fresh, None


def _facts_naming(merged: Merged, eids: set[str], records_of: Callable[[set[str]], Iterable[ExtractionRecord]]
                  ) -> set[tuple[str, str, str]]:
    """The fact keys with an entity of `eids` as subject or object, after a merge into the state: a fact's
    endpoints are mentions, so its chunks are among each endpoint's sources; those chunks' records (a few,
    where reading every fact key of the state is O(project)) merged again on their own, with the state's keys,
    give every such fact."""
    chunks: set[str] = set()
    for eid in eids:
        chunks.update(live(merged.entities, eid, _EntityAcc).sources)
    again = _merge(records_of(chunks), merged.keys)
    assert again is not None        # a merge with keys never stops for a plan
    return {f for f in again.facts if f[0] in eids or f[2] in eids}


def _since_state(project: ProjectDir, reporter: Reporter, base: str, now: dict[str, int]
                 ) -> tuple[resolve_state.Head, set[str], set[str], int | None] | None:
    """When adding is all that happened since the saved state: its header (read_header's answer, for the
    load), the chunks its delta merged after it was saved, the chunks neither has (`now`: chunk id -> offset
    of its current record), and the delta's UNKNOWN count (None without a delta); else None."""
    path = project.resolve_state_path
    try:
        head = resolve_state.read_header(path)
        if head is None:
            return None
        header = head[0]
        if header.basis != base or not resolve_state.cache_grew_only(project.extractions_path, header):
            return None
        delta = resolve_state.read_delta(path, header)
    except resolve_state.OldFormat as exc:
        reporter.info(f"resolve: {path.name} is of an earlier format ({exc}); merging every record once to save "
                      "it in this one")
        return None
    except resolve_state.Damaged as exc:
        reporter.warn(f"{path} is damaged ({exc}); merging every record again")
        return None
    merged_before = {**header.offsets, **(delta.offsets if delta else {})}
    if not merged_before.items() <= now.items():     # (a set comparison, in C)
        return None     # a chunk's record changed or went away: its old contribution cannot be taken out
    return (head, set(delta.offsets) if delta else set(), now.keys() - merged_before.keys(),
            delta.unknown if delta else None)


def _load_state(project: ProjectDir, reporter: Reporter, head: resolve_state.Head) -> tuple[Merged, int] | None:
    try:
        return resolve_state.load(project.resolve_state_path, Merged, head)
    except resolve_state.Damaged as exc:
        reporter.warn(f"{project.resolve_state_path} is damaged ({exc}); merging every record again")
        return None


def _file_digest(h: "hashlib._Hash", path) -> None:
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)


def _record_digest(h: "hashlib._Hash", path) -> None:
    """A record file's part of resolve's output digest: its bytes, or, when it has a patch, the patch's bytes
    alone (the patch holds every line its base does not, and names its base's content by the resolve output
    digest that last hashed it whole, and checks it is that file by its size and the CRC-32 of its last 4 KiB),
    so a small run hashes its patches, not the bases."""
    patch = line_patch.patch_path(path)
    if patch.exists():
        h.update(b"patched:")
        _file_digest(h, patch)
    else:
        _file_digest(h, path)


def write_outputs(project: ProjectDir, resolved: Resolved, docs: list[Document], chunks: list[ChunkRef]) -> Any:
    """Each file atomically (orjson serialises the dataclasses directly; asdict would dominate at scale); the
    graph is built once the record files are out, so the fact accumulators are gone before its lists exist,
    and `resolved` is emptied before the graph is pickled (on a large corpus each copy is gigabytes).
    The set is not atomic, but the manifest is written only after all of them, so a crash leaves resolve stale.
    Which record files are compressed: resolve_patch.COMPRESSED."""
    compressed = resolve_patch.COMPRESSED
    store.write_jsonl(project.entities_path, resolved.entities, compressed["entities"], base=True)
    store.write_jsonl(project.relations_path, (r.to_json() for r in resolved.relations), compressed["relations"],
                      base=True)
    store.write_jsonl(project.facts_path, resolved.facts, compressed["facts"], base=True)
    store.write_jsonl(project.merges_path, resolved.merges)
    graph = graph_columns(docs, chunks, resolved.entities, resolved.relations, resolved.mentions)
    resolved.entities, resolved.relations, resolved.mentions = [], [], []
    save_graph(project, graph)
    return graph


@contextmanager
def gc_paused() -> Iterator[None]:
    """Resolve allocates millions of small acyclic objects; the cyclic GC would rescan them again and again
    (loading and merging several times slower). Paused, then restored."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def run_resolve(project: ProjectDir, settings: Settings, reporter: Reporter | None = None) -> StageOutcome:
    """Rebuild graph/entities.jsonl, relations.jsonl, facts.jsonl, merges.jsonl and graph.pkl from the current
    records."""
    with gc_paused():
        return _run_resolve(project, settings, reporter)


def _run_resolve(project: ProjectDir, settings: Settings, reporter: Reporter | None) -> StageOutcome:
    reporter = reporter or Reporter("quiet")
    before = project.stage("resolve")     # its output digest names the record files a patch starts from
    changed: dict[str, list[str]] | None = None
    mark = chunk_mark(project)
    summarizer = Summarizer(project, settings, reporter)
    # the chunks without their text (pruning reads it if it must): when the last run's outputs may be patched,
    # the saved graph (the documents and chunks of the last run) and those added since; else every one (an LLM
    # summary run merges from scratch, see below)
    last = (before.counts.get("chunk_mark") or {}) if before and not summarizer.enabled else None
    inputs = graph_inputs(project, last)
    chunks = inputs.chunks
    merged, header, fresh, delta = _merge_current(project, settings, reporter, not summarizer.enabled, chunks)
    # graph.pkl is about to lose its SYNONYM edges: the synonyms stage must rerun even when this output's
    # digest comes out unchanged (otherwise a stopped or failed synonyms run leaves it "fresh" forever)
    project.forget_stage("synonyms")
    graph = None
    if merged is not None and merged.touched is not None:
        reporter.info(f"resolve: {merged.records} extraction records over {len(chunks)} chunks, "
                      f"{merged.touched.records} new ones merged into the saved state")
        try:
            graph_ents, graph_rels, unknown, changed = resolve_patch.patch_outputs(
                project, merged, summarizer, before.output_digest if before else "")
        except (resolve_patch.OutOfStep, resolve_state.Damaged) as exc:
            reporter.warn(f"the resolve outputs do not match {project.resolve_state_path.name} ({exc}); "
                          "merging every record again")
            inputs = every_input(project, inputs)       # the saved graph let go before the merge
            merged, changed = None, None
        else:
            header.unknown += unknown
            totals = merged.totals()
            # the saved graph updated with the items made again and the new chunks' mentions; when it cannot be
            # (missing, damaged, or not the graph these changes apply to: updated_graph warns), every record is
            # merged again and the graph built from every item (the state keeps no mentions to build it from)
            update = updated_graph(project, inputs, graph_ents, graph_rels, merged.touched.mentions,
                                   (totals["entities"], totals["relations"], totals["mentions"]), reporter)
            del graph_ents, graph_rels
            graph = update[0] if update is not None else None
            if update is None:
                inputs = every_input(project, inputs)
                merged, changed = None, None
            else:
                sizes = {k: totals[k] for k in ("entities", "relations", "facts")}
                stats = {**_stats(merged, header.unknown, 0), "records_merged": merged.touched.records}
                if delta is not None:   # the state file stays as it is (a hard link to the last generation's)
                    delta.unknown = header.unknown
                    resolve_state.save_delta(project.resolve_state_path, delta)
                else:
                    header.counts = totals
                    # the delta first: killed in between, the next run finds a state without the delta's chunks
                    # and merges them again (its outputs do not fit: from scratch), never a delta of another state
                    resolve_state.drop_delta(project.resolve_state_path)
                    try:
                        resolve_state.fold(project.resolve_state_path, header, merged)
                    except resolve_state.Damaged as exc:    # a block first decoded by the fold
                        reporter.warn(f"{project.resolve_state_path} is damaged ({exc}); it is removed, and the "
                                      "next run merges every record again")
                        project.resolve_state_path.unlink(missing_ok=True)
                del merged
                save_updated(project, *update)
                del update
    else:       # merged from scratch: the saved graph is not updated
        inputs = every_input(project, inputs)
    if graph is None:
        del merged
        graph, sizes, stats = _from_scratch(project, reporter, summarizer, header, fresh, inputs)

    h = hashlib.sha256()
    for path in (project.entities_path, project.relations_path, project.facts_path):
        _record_digest(h, path)
    # the graph also holds documents and chunks, which can change without any record changing (a rename): the
    # chunk stage's digest says when they did
    chunk_stage = project.stage("chunk")
    h.update((chunk_stage.output_digest if chunk_stage else "").encode())
    digest = h.hexdigest()[:24]
    _write_changed(project, changed, before.output_digest if before else "", digest)
    ec = edge_counts(graph)
    counts = {
        **sizes,
        "vertices": graph.n,
        "edges": graph.m,
        **{f"edges_{k.lower()}": v for k, v in ec.items() if k != "SYNONYM"},
        **stats,
        "summaries_llm_calls": summarizer.llm_calls,
        "summaries_cached": summarizer.cached,
        "chunk_mark": mark,     # the documents and chunks the graph holds (the next run's `graph_inputs`)
    }
    return StageOutcome(counts=counts, output_digest=digest)


def _from_scratch(project: ProjectDir, reporter: Reporter, summarizer: Summarizer, header: resolve_state.StateHeader,
                  fresh: Fresh, inputs: Any) -> tuple[Any, dict[str, int], dict]:
    """Every current record merged, and every output written (the state file only when the project keeps one):
    in memory when one partition holds the records' mentions, else in partitions spilled to disk
    (resolve/partition.py). Returns the graph, the item counts and the stats."""
    cuts = partition.bounds(fresh.records(), fresh.count, _ident)
    if cuts:
        return _partitioned(project, reporter, summarizer, header, fresh, inputs, cuts)
    merged = merge_records(fresh.records)
    reporter.info(f"resolve: {merged.records} extraction records over {len(inputs.chunks)} chunks")
    keys = resolve_state.sorted_keys(merged)
    if _keeps_state(summarizer, merged.keys):
        header.unknown = sum(_vote_type(acc.types) == UNKNOWN for acc in merged.entities.values())
        resolve_state.save(project.resolve_state_path, header, merged, keys)
    else:
        project.resolve_state_path.unlink(missing_ok=True)
    resolve_state.drop_delta(project.resolve_state_path)
    resolved = finalize(merged, summarizer, keys)
    del keys, merged
    sizes = {"entities": len(resolved.entities), "relations": len(resolved.relations),
             "facts": resolved.fact_count}
    stats = {**resolved.stats, "records_merged": resolved.records}
    return write_outputs(project, resolved, inputs.docs, inputs.chunks), sizes, stats


def _keeps_state(summarizer: Summarizer, keys: MergeKeys) -> bool:
    """An LLM may summarise: descriptions are decided over every item, so such a project merges from scratch
    each time and keeps no state; nor does a merge planned by aliases (its plan is over every record)."""
    return not summarizer.enabled and not keys.node_ids and not keys.alias_only


def _partitioned(project: ProjectDir, reporter: Reporter, summarizer: Summarizer, header: resolve_state.StateHeader,
                 fresh: Fresh, inputs: Any, cuts: partition.Cuts) -> tuple[Any, dict[str, int], dict]:
    """`_from_scratch` in the partitions of `cuts`. The old state file goes first (a run killed before the new
    one is written whole then merges from scratch again), and the spill folder is removed however the run
    ends."""
    folder = partition.spill_folder(project)
    project.resolve_state_path.unlink(missing_ok=True)
    resolve_state.drop_delta(project.resolve_state_path)
    spooled = None
    try:
        b = None
        for planned in (False, True):
            partition.clear(folder)
            folder.mkdir(parents=True)
            b = partition.bucket(fresh.records(), plan_merges(fresh.records()) if planned else None, cuts, folder,
                                 _ident, _phrase, _strength)
            if b is not None:
                break
        assert b is not None        # a merge with keys never stops for a plan
        _ident_str.cache_clear()    # (up to a million names each: the partitions' accumulators use the room)
        normalize_name.cache_clear()
        _phrase.cache_clear()
        reporter.info(f"resolve: {b.records} extraction records over {len(inputs.chunks)} chunks, merged in "
                      f"{b.ents.parts} + {b.rels.parts} partitions")
        if _keeps_state(summarizer, b.keys):
            spooled = resolve_state.Spooled(project.resolve_state_path, header)
        built = partition.build(project, b, summarizer, inputs.docs, inputs.chunks, spooled,
                                resolve_patch.COMPRESSED)
        if spooled is not None:
            header.unknown = built.unknown
            spooled.finish(b, b.n_mentions)
        store.write_jsonl(project.merges_path, built.merges)
        save_graph(project, built.graph, built.keys)
    finally:
        if spooled is not None:
            spooled.close()
        partition.clear(folder)
    sizes = {"entities": built.entities, "relations": built.relations, "facts": built.facts}
    stats = {**_stats(b, built.unknown, built.summaries), "records_merged": b.records}  # type: ignore[arg-type]
    return built.graph, sizes, stats


def _write_changed(project: ProjectDir, changed: dict[str, list[str]] | None, before: str, after: str) -> None:
    """graph/changed_ids.json after a patch: the ids of the records added or made again between the outputs
    whose digest was `before` and these (`after`), so a later stage can sync only them (additions never
    remove a record). A merge from scratch removes the file: what changed is then unknown."""
    path = project.changed_ids_path
    if changed is None or not before:
        path.unlink(missing_ok=True)
        return
    store.write_json(path, {"from": before, "to": after, **changed,
                            "removed": {"entities": [], "relations": [], "facts": []}})
