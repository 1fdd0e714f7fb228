"""Plain records shared by every stage; their dict forms are what the JSONL artifacts hold."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any, TypeVar

T = TypeVar("T")


def to_dict(obj: Any) -> dict:
    """What dataclasses.asdict gives, without its deepcopy of every leaf value: records hold only strings,
    numbers, lists, dicts and records, and asdict's copies are a noticeable part of a build."""
    return {f: _plain(getattr(obj, f)) for f in _field_order(type(obj))}


def _plain(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if hasattr(v, "__dataclass_fields__"):
        return to_dict(v)
    return copy.deepcopy(v)       # anything else (tuples, ...): as asdict would


@lru_cache(maxsize=None)
def _field_order(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


@lru_cache(maxsize=None)
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(_field_order(cls))


def from_dict(cls: type[T], data: dict) -> T:
    """Build a record from a dict, ignoring keys a newer/older version added, so old artifacts still load.
    (Fast path when the keys match exactly: resolve builds millions of these.)"""
    names = _field_names(cls)
    if names.issuperset(data):
        return cls(**data)
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class Document:
    doc_id: str          # hash of the path relative to the DOCS root (plus record key for .jsonl records)
    path: str            # relative path, "file.jsonl#<key>" for a record of a .jsonl file
    sha256: str          # of the document text
    bytes: int
    n_chunks: int = 0
    metadata: dict = field(default_factory=dict)


@dataclass
class Chunk:
    chunk_id: str        # hash of the chunk text
    doc_id: str
    order: int
    n_tokens: int
    text: str
    section: list[str] = field(default_factory=list)   # heading trail of the section it was cut from
    page: int = 0        # the PDF page it starts on; 0 for other files
    page_end: int = 0    # the PDF page it ends on, when that is a later one; else 0


@dataclass
class ChunkRef:
    """Where a chunk is, without its text: what the graph needs of it."""

    chunk_id: str
    doc_id: str
    order: int


@dataclass
class ExtractedEntity:
    name: str
    type: str
    description: str
    aliases: list[str] = field(default_factory=list)   # other names the chunk uses for it (resolve merges on them)


@dataclass
class ExtractedRelation:
    src: str
    tgt: str
    predicate: str
    keywords: list[str]
    description: str
    strength: float = 1.0
    rel_type: str = ""       # a schema relation type (schema-guided extraction); "" when untyped or no schema


@dataclass
class ExtractionRecord:
    """What one extractor said about one chunk; merging happens only in resolve."""

    chunk_id: str
    extractor: str                       # extractor fingerprint
    entities: list[ExtractedEntity]
    relations: list[ExtractedRelation]
    gleaning_rounds: int = 0
    # "ok"; "failed" (nothing usable: unreadable answer or a refused request); "partial" (usable rows, but a
    # gleaning or continuation round was lost, or the answer was still cut at max_tokens after its
    # continuation rounds). --retry-failed redoes failed and partial chunks.
    status: str = "ok"
    dropped_rows: int = 0                # total of `dropped` (older records have only this)
    llm_keys: list[str] = field(default_factory=list)   # cache/llm.jsonl keys, for --reparse
    error: str = ""
    dropped: dict[str, int] = field(default_factory=dict)   # reason -> rows left out, e.g. {"truncated": 1}
    retyped: int = 0                     # entities whose type was outside the configured list, now "other"
    parser: int = 0                      # PARSER_VERSION that read the answers (0: before versions existed)
    error_kind: str = ""                 # failed/partial: llm.FailureCause kind, "unreadable" or "truncated"
    attempt: int = 1                     # 1, or n for the (n-1)th --retry-failed of a failed chunk
    continuations: int = 0               # rounds that asked for the rest of an answer cut at max_tokens

    def to_json(self) -> dict:
        """The cache line. Each distinct description is stored once, in `texts`, and rows name it by position:
        the rules extractor gives every name and every pair of a sentence that sentence as description, which
        made descriptions four fifths of the cache. Read it back with `from_json` (which also reads the older
        lines that hold the descriptions inline)."""
        texts: dict[str, int] = {}
        ents = []
        for e in self.entities:     # built field by field: the generic to_dict is slow on the rules extract's hot path
            row: dict[str, Any] = {"name": e.name, "type": e.type,
                                   "description": texts.setdefault(e.description, len(texts))}
            if e.aliases:
                row["aliases"] = list(e.aliases)
            ents.append(row)
        rels = []
        for r in self.relations:
            row = {"src": r.src, "tgt": r.tgt, "predicate": r.predicate, "keywords": list(r.keywords),
                   "description": texts.setdefault(r.description, len(texts)), "strength": r.strength}
            if r.rel_type:
                row["rel_type"] = r.rel_type
            rels.append(row)
        rows = {"entities": ents, "relations": rels}
        data = {f: rows[f] if f in rows else _plain(getattr(self, f)) for f in _field_order(ExtractionRecord)}
        data["texts"] = list(texts)
        return data

    @classmethod
    def from_json(cls, data: dict) -> "ExtractionRecord":
        rec = from_dict(cls, data)
        texts = data.get("texts")

        def row(kind: type, d: dict) -> Any:
            if texts is not None:
                d = {**d, "description": texts[d["description"]]}
            return from_dict(kind, d)

        rec.entities = [row(ExtractedEntity, e) for e in data.get("entities", [])]
        rec.relations = [row(ExtractedRelation, r) for r in data.get("relations", [])]
        return rec


@dataclass(slots=True)     # millions at scale: no __dict__ each
class Entity:
    id: str
    name: str
    type: str
    description: str
    aliases: list[str] = field(default_factory=list)
    source_ids: list[str] = field(default_factory=list)


@dataclass(slots=True)     # millions at scale: no __dict__ each
class Relation:
    id: str
    src: str
    tgt: str
    predicates: list[str]
    keywords: list[str]
    description: str
    weight: float
    source_ids: list[str] = field(default_factory=list)
    rel_type: str = ""       # schema relation type, the most frequent among the mentions; "" when untyped

    def to_json(self) -> "dict | Relation":
        """The relations.jsonl line: orjson writes a typed relation as it is, and an untyped one without
        `rel_type`, so a project without a schema writes what it wrote before relation types."""
        if self.rel_type:
            return self
        return {f: getattr(self, f) for f in _field_order(Relation) if f != "rel_type"}


def fact_text(subject: str, predicate: str, obj: str) -> str:
    """The text a fact is embedded and shown as: "(subject, predicate, object)"."""
    return f"({subject}, {predicate}, {obj})"


@dataclass(slots=True)     # millions at scale: no __dict__ each
class Fact:
    id: str
    subject: str
    predicate: str
    object: str
    relation_id: str
    source_ids: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return fact_text(self.subject, self.predicate, self.object)


@dataclass
class Synonym:
    a: str
    b: str
    similarity: float
