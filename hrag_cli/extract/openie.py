"""Import a HippoRAG `openie_results_ner_*.json` as extraction records, calling no LLM.

Why: existing HippoRAG users keep the (paid-for) extractions they already have, and the MuSiQue benchmark
can be measured on the HippoRAG authors' own GPT-3.5 output. The file is
`{"docs": [{"passage" (title + "\n" + text), "title", "text", "extracted_entities": [...],
"extracted_triples": [[s, p, o], ...]}]}`.

A chunk takes a passage's extractions when its text equals the passage's `passage` or its `text` after
whitespace normalisation (so "title\n\ntext" from the .jsonl loader matches "title\ntext"). Index such a
corpus so that one passage is one chunk (bench/musique.py writes a .jsonl with title/text fields).
Triples that are not three non-empty strings are dropped and counted, as are self-relations.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson

from ..errors import UsageError
from ..progress import Reporter
from ..project import Project, fingerprint, text_hash
from ..records import Chunk, ExtractedEntity, ExtractedRelation, ExtractionRecord
from .parser import UNKNOWN_TYPE, clean_name

__all__ = ["import_openie", "openie_extractor_id", "normalise_ws"]

_WS = re.compile(r"\s+")
IMPORT_VERSION = "openie-import-v1"


def normalise_ws(text: str) -> str:
    return _WS.sub(" ", text).strip()


def openie_extractor_id(path: Path) -> str:
    """The `extractor` field of imported records: changes when the file's content or this importer does."""
    return f"openie:{fingerprint(IMPORT_VERSION, text_hash(Path(path).read_bytes().decode('utf-8', 'replace')))}"


def _load_docs(path: Path) -> list[dict]:
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise UsageError(f"--import-openie: {path} does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"--import-openie: {path} is a directory, expected a JSON file") from None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # HippoRAG writes NaN for empty averages, which strict JSON (orjson) refuses; the stdlib reads it
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise UsageError(f"--import-openie: {path} is not valid JSON ({exc})") from None
    docs = data.get("docs") if isinstance(data, dict) else data
    if not isinstance(docs, list):
        raise UsageError(f"--import-openie: {path} has no 'docs' list (expected a HippoRAG openie_results file)")
    return [d for d in docs if isinstance(d, dict)]


def _passage_record(doc: dict, extractor: str, chunk_id: str, counts: dict[str, int]) -> ExtractionRecord:
    entities: list[ExtractedEntity] = []
    seen: set[str] = set()

    def add_entity(name: str) -> None:
        key = name.casefold()
        if key not in seen:
            seen.add(key)
            entities.append(ExtractedEntity(name=name, type=UNKNOWN_TYPE, description=""))

    for raw in doc.get("extracted_entities") or []:
        name = clean_name(raw) if isinstance(raw, str) else ""
        if name:
            add_entity(name)
        else:
            counts["dropped_entities"] += 1
    relations: list[ExtractedRelation] = []
    for triple in doc.get("extracted_triples") or []:
        if not (isinstance(triple, (list, tuple)) and len(triple) == 3 and all(isinstance(t, str) for t in triple)):
            counts["dropped_triples"] += 1
            continue
        s, o = clean_name(triple[0]), clean_name(triple[2])
        p = normalise_ws(triple[1])
        if not s or not p or not o:
            counts["dropped_triples"] += 1
            continue
        if s.casefold() == o.casefold():
            counts["self_triples"] += 1
            continue
        add_entity(s)
        add_entity(o)
        relations.append(ExtractedRelation(src=s, tgt=o, predicate=p, keywords=[p], description=f"{s} {p} {o}",
                                           strength=1.0))
        counts["triples"] += 1
    counts["entities"] += len(entities)
    return ExtractionRecord(chunk_id=chunk_id, extractor=extractor, entities=entities, relations=relations,
                            dropped_rows=0)


def import_openie(project: Project, chunks: list[Chunk], path: Path,
                  reporter: Reporter | None = None) -> tuple[list[ExtractionRecord], dict[str, Any]]:
    """One extraction record per chunk whose text matches a passage; counts say what matched and what was
    dropped. Chunks without a matching passage get no record (the caller decides what to do with them)."""
    path = Path(path)
    docs = _load_docs(path)
    extractor = openie_extractor_id(path)
    by_text: dict[str, dict] = {}
    for doc in docs:
        for key in ("passage", "text"):
            val = doc.get(key)
            if isinstance(val, str) and val.strip():
                by_text.setdefault(normalise_ws(val), doc)
        title, text = doc.get("title"), doc.get("text")
        if isinstance(title, str) and isinstance(text, str):
            by_text.setdefault(normalise_ws(f"{title}\n{text}"), doc)
    counts: dict[str, int] = {"passages": len(docs), "matched_chunks": 0, "unmatched_chunks": 0,
                              "entities": 0, "triples": 0, "dropped_triples": 0, "self_triples": 0,
                              "dropped_entities": 0}
    records: list[ExtractionRecord] = []
    for chunk in chunks:
        doc = by_text.get(normalise_ws(chunk.text))
        if doc is None:
            counts["unmatched_chunks"] += 1
            continue
        counts["matched_chunks"] += 1
        records.append(_passage_record(doc, extractor, chunk.chunk_id, counts))
    if reporter is not None:
        reporter.info(f"openie import: {counts['matched_chunks']}/{len(chunks)} chunks matched a passage, "
                      f"{counts['triples']} triples, {counts['dropped_triples']} malformed triples dropped")
        if counts["unmatched_chunks"]:
            reporter.warn(f"openie import: {counts['unmatched_chunks']} chunks match no passage of {path.name} "
                          "(index one passage per chunk, e.g. a .jsonl with title/text fields)")
    return records, counts
