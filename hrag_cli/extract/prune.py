"""The prune step, between extract and resolve: holds each chunk's extraction to the schema and to its chunk.

`prune_record` is a pure function applied to every record as resolve reads it (iter_pruned), so nothing is
copied: cache/extractions.jsonl keeps the raw extractions, and
switching `schema.mode` or `extract.grounding` re-prunes with no model call. The stage itself (run_prune) only
counts what pruning does, for `hrag status` and `--json`, and gives resolve a digest that changes when the
pruning does. With no schema and grounding off (rules extractor, OpenIE import) it reads nothing.

- Schema (`--schema`): an entity type outside the schema is re-typed when it names a schema type or synonym
  (singular or plural); else strict drops the entity, lenient keeps it as "unknown". A relation whose relation
  type is not in the schema, or whose endpoint types fit none of its patterns, is dropped (strict) or kept with
  no relation type (lenient).
  Relation types are checked only on LLM extractions (the rules extractor gives none); imported OpenIE
  extractions, which type nothing, are not held to a schema at all.
- Grounding (`extract.grounding`, LLM extractions only): an entity none of whose names is found in its chunk
  (extract/grounding.py) is counted (flag) or dropped (drop).
Relations of a dropped entity go with it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

from hrag_cli.core.config import Settings
from hrag_cli.core.errors import UsageError
from hrag_cli.extract.grounding import Grounder
from hrag_cli.extract.openie import EXTRACTOR_PREFIX as OPENIE_PREFIX
from hrag_cli.extract.parser import UNKNOWN_TYPE, add_counts
from hrag_cli.extract.schema import Schema, schema_of
from hrag_cli.extract.stage import CurrentRecords, current_extractor, iter_current_records
from hrag_cli.chunk.stage import load_documents
from hrag_cli.core.normalize import normalize_name
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir, StageOutcome, fingerprint
from hrag_cli.core.records import ExtractionRecord

MODES = ("strict", "lenient")
GROUNDING = ("off", "flag", "drop")
TOP_UNGROUNDED = 10        # chunks `hrag status` lists, most ungrounded names first
NAMES_SHOWN = 3            # ungrounded names kept per listed chunk


@dataclass(frozen=True)
class PruneSpec:
    schema: Schema | None = None
    mode: str = "strict"
    grounding: str = "off"      # "off" whatever the setting when the extractor is not an LLM
    # relation types are held to the schema only where the extractor was asked for them (an LLM with the schema
    # prompt); the rules extractor's relations have none, and keep only the entity checks
    relation_types: bool = True

    @property
    def active(self) -> bool:
        return self.schema is not None or self.grounding != "off"

    def describe(self) -> list:
        return [self.schema.fingerprint if self.schema else "", self.mode if self.schema else "", self.grounding,
                self.relation_types]


@dataclass
class Pruned:
    record: ExtractionRecord
    counts: dict[str, int] = field(default_factory=dict)
    ungrounded: list[str] = field(default_factory=list)


def check_prune_settings(settings: Settings) -> None:
    """Fail fast (exit 2) on a bad mode, grounding value or schema file."""
    if settings.schema.mode not in MODES:
        raise UsageError(f"setting schema.mode: '{settings.schema.mode}' is not a mode; use strict or lenient")
    if settings.extract.grounding not in GROUNDING:
        raise UsageError(f"setting extract.grounding: '{settings.extract.grounding}' is not one of off, flag, drop")
    schema_of(settings.extract)


def prune_spec(settings: Settings, extractor: str) -> PruneSpec:
    """The pruning for records of `extractor` under these settings: grounding checks LLM extractions only."""
    check_prune_settings(settings)
    llm = extractor.startswith("llm:")
    # imported OpenIE rows have no types to hold to a schema
    schema = None if extractor.startswith(OPENIE_PREFIX) else schema_of(settings.extract)
    return PruneSpec(schema, settings.schema.mode, settings.extract.grounding if llm else "off", relation_types=llm)


def prune_record(rec: ExtractionRecord, chunk_text: str, spec: PruneSpec) -> Pruned:
    """`rec` held to the schema and its chunk; the input is not changed. Counts are per what happened."""
    if not spec.active:
        return Pruned(rec)
    counts: dict[str, int] = {}

    def bump(key: str) -> None:
        counts[key] = counts.get(key, 0) + 1

    schema, strict = spec.schema, spec.mode == "strict"
    grounder = Grounder(chunk_text) if spec.grounding != "off" else None
    entities, ungrounded = [], []
    removed: set[str] = set()          # normalised names of entities taken out
    types: dict[str, str] = {}         # normalised name (or alias) of a kept entity -> its type
    for e in rec.entities:
        names = [e.name, *e.aliases]   # a relation may name its endpoint by an alias
        keys, typ = [normalize_name(n) for n in names], e.type
        if schema is not None:
            typ = schema.entity_type(e.type)
            if typ is None and strict:
                bump("entities_dropped")
                removed.update(keys)
                continue
            if typ is None:
                typ = UNKNOWN_TYPE
                bump("entities_unknown")
            elif typ != e.type:
                bump("entities_retyped")
        if grounder is not None and not grounder.grounded(names):
            ungrounded.append(e.name)
            bump("ungrounded")
            if spec.grounding == "drop":
                removed.update(keys)
                continue
        entities.append(e if typ == e.type else replace(e, type=typ))
        types[keys[0]] = typ
        for k in keys[1:]:
            types.setdefault(k, typ)   # an entity's own name wins over another entity's alias
    removed -= types.keys()     # a name a kept entity also carries still stands
    typed = schema is not None and bool(schema.relations) and spec.relation_types
    relations = []
    for r in rec.relations:
        src, tgt = normalize_name(r.src), normalize_name(r.tgt)
        if src in removed or tgt in removed:
            bump("relations_dropped_with_entity")
            continue
        if typed:
            rt = schema.relation_type(r.rel_type)
            ends = (types.get(src), types.get(tgt))
            fits = rt is not None and (ends in rt.patterns if rt.patterns else
                                       all(t not in (None, UNKNOWN_TYPE) for t in ends))
            if not fits and strict:
                bump("relations_dropped")
                continue
            if not fits:
                bump("relations_untyped")
                r = replace(r, rel_type="")
            elif rt.name != r.rel_type:
                bump("relations_retyped")
                r = replace(r, rel_type=rt.name)
        relations.append(r)
    if not counts:   # every change is counted: nothing counted, nothing changed
        return Pruned(rec)
    return Pruned(replace(rec, entities=entities, relations=relations), counts, ungrounded)


# ----------------------------------------------------------------------------------------------- the stage


def settings_fingerprint(settings: Settings) -> str:
    """The schema's content, the mode and the grounding setting: what the pruning depends on besides the records."""
    schema = schema_of(settings.extract)
    return fingerprint("prune-v1", schema.fingerprint if schema else "", settings.schema.mode,
                       settings.extract.grounding)


def iter_pruned(project: ProjectDir, settings: Settings, current: CurrentRecords | None = None
                ) -> Iterator[ExtractionRecord]:
    """What resolve merges, one record at a time in chunk_id order: each current chunk's latest usable record
    (extract.stage.iter_current_records; only those of `current` when given), pruned under `settings`."""
    extractor = current_extractor(project)
    if extractor is None:
        return
    spec = prune_spec(settings, extractor)
    for chunk, rec in iter_current_records(project, extractor, current):
        yield prune_record(rec, chunk.text if spec.active else "", spec).record


def run_prune(project: ProjectDir, settings: Settings, reporter: Reporter | None = None) -> StageOutcome:
    """Count what pruning does to the current records (resolve applies it as it reads them). The output digest
    is the extract stage's when pruning is off, so resolve stays fresh; else it covers the pruning too."""
    extract = project.stage("extract")
    digest = extract.output_digest if extract else ""
    extractor = current_extractor(project)
    spec = prune_spec(settings, extractor or "")
    if settings.extract.schema and spec.schema is None and reporter is not None:
        reporter.warn("the schema is not applied to imported OpenIE extractions: their entities have no types")
    counts: dict[str, Any] = {"schema": spec.schema.path if spec.schema else "",
                              "mode": spec.mode if spec.schema else "", "grounding": spec.grounding}
    if not spec.active or extractor is None:
        return StageOutcome(counts=counts, output_digest=digest)
    totals: dict[str, int] = {}
    flagged: list[tuple[int, str, str, int, list[str]]] = []
    for chunk, rec in iter_current_records(project, extractor):
        pruned = prune_record(rec, chunk.text, spec)
        add_counts(totals, pruned.counts)
        if pruned.ungrounded:
            flagged.append((len(pruned.ungrounded), chunk.chunk_id, chunk.doc_id, chunk.order,
                            pruned.ungrounded[:NAMES_SHOWN]))
    counts.update(totals)
    if spec.grounding != "off":
        paths = {d.doc_id: d.path for d in load_documents(project)} if flagged else {}
        counts["chunks_with_ungrounded"] = len(flagged)
        counts["ungrounded_chunks"] = [
            {"chunk_id": cid, "path": paths.get(doc, doc), "order": order, "ungrounded": n, "names": names}
            for n, cid, doc, order, names in heapq.nlargest(TOP_UNGROUNDED, flagged, key=lambda f: (f[0], f[1]))]
    if reporter is not None and totals:
        reporter.info("prune: " + ", ".join(f"{k}={v}" for k, v in sorted(totals.items())))
    return StageOutcome(counts=counts, output_digest=fingerprint(digest, spec.describe()))


def iter_ungrounded(status: dict) -> list[str]:
    """One line per listed chunk with ungrounded names, for the plain `hrag status` output."""
    return [f"{c['path']} chunk {c['order']} ({c['chunk_id'][:12]}): {c['ungrounded']} ungrounded "
            f"({', '.join(c['names'])})" for c in status.get("ungrounded_chunks", [])]
