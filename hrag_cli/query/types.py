"""What a retrieval returns, independent of the mode, so output, context building and eval treat every mode
alike. `to_json` is the documented `hrag query --json` object (schema in query/run.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hrag_cli.core.records import to_dict


@dataclass
class RankedChunk:
    chunk_id: str
    doc_id: str
    path: str
    score: float
    text: str
    section: list[str] = field(default_factory=list)   # heading trail in its document
    page: int = 0                                      # PDF page it starts on, 0 for other files
    page_end: int = 0                                  # PDF page it ends on when a later one, else 0

    @property
    def where(self) -> str:
        """`guide/deps.md › Dependencies › With yield`, `manual.pdf p. 12`: what a person is shown."""
        from hrag_cli.chunk.readers import where

        return where(self.path, self.section, self.page, self.page_end)


@dataclass
class Retrieval:
    query: str
    mode: str
    chunks: list[RankedChunk] = field(default_factory=list)
    entities: list[dict] = field(default_factory=list)    # {id, name, type, description, score}
    relations: list[dict] = field(default_factory=list)   # {id, src, tgt, predicates, keywords, description, weight, score[, rel_type]}
    facts: list[dict] = field(default_factory=list)       # {id, subject, predicate, object, score}
    keywords: dict[str, list[str]] = field(default_factory=dict)   # {"high": [...], "low": [...]}
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = to_dict(self)     # asdict's deep copy of every leaf would be a noticeable part of a ppr question
        out["chunks"] = [{"rank": i + 1, **c, "where": ch.where} for i, (c, ch) in enumerate(zip(out["chunks"],
                                                                                                  self.chunks))]
        return out
