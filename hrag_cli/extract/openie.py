"""Import a HippoRAG `openie_results_ner_*.json` as extraction records, calling no LLM.

Why: existing HippoRAG users keep the (paid-for) extractions they already have, and a benchmark can run on the
HippoRAG authors' own extractions of its corpus (bench/musique.py). The file is
`{"docs": [{"passage" (title + "\n" + text), "title", "text", "extracted_entities": [...],
"extracted_triples": [[s, p, o], ...]}]}`.

A chunk takes a passage's extractions when its text equals the passage's `passage` or its `text` after
whitespace normalisation (so "title\n\ntext" from the .jsonl loader matches "title\ntext"). Index such a
corpus so that one passage is one chunk (bench/musique.py writes a .jsonl with title/text fields).
Triples that are not three non-empty strings are dropped and counted, as are self-relations and names over
256 characters; each record keeps its per-reason `dropped` counts like an LLM extraction.

`parse_openie_messages` reads HippoRAG 2's raw per-passage model answers instead of the results file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson

from hrag_cli.core.errors import UsageError
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir, fingerprint, text_hash
from hrag_cli.core.records import Chunk, ExtractedEntity, ExtractedRelation, ExtractionRecord
from hrag_cli.extract.parser import (
    MAX_NAME_CHARS, NAME_TOO_LONG, NO_NAME, SELF_RELATION, UNKNOWN_TYPE, ParseResult, clean_name)

__all__ = ["import_openie", "openie_extractor_id", "normalise_ws", "openie_rows", "parse_openie_messages"]

_WS = re.compile(r"\s+")
IMPORT_VERSION = "openie-import-v2"     # v2: names keep their punctuation, long names and drops counted
EXTRACTOR_PREFIX = "openie:"            # of every imported record's `extractor`
MALFORMED_TRIPLE = "malformed_triple"
TRUNCATED = "truncated"                 # same reason as a cut-off LLM answer's last row


def normalise_ws(text: str) -> str:
    return _WS.sub(" ", text).strip()


def openie_extractor_id(path: Path) -> str:
    """The `extractor` field of imported records: changes when the file's content or this importer does."""
    return f"{EXTRACTOR_PREFIX}{fingerprint(IMPORT_VERSION, text_hash(Path(path).read_bytes().decode('utf-8', 'replace')))}"


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


def openie_rows(entities: Any, triples: Any) -> ParseResult:
    """HippoRAG's named entities and (subject, predicate, object) triples as extraction rows: names cleaned
    as the parser cleans them, triple endpoints added as entities (type unknown), every item left out counted
    per reason (no_name, name_too_long, malformed_triple, self_relation)."""
    res = ParseResult(complete=True)
    seen: set[str] = set()

    def drop(reason: str) -> None:
        res.dropped[reason] = res.dropped.get(reason, 0) + 1

    def add_entity(name: str) -> None:
        key = name.casefold()
        if key not in seen:
            seen.add(key)
            res.entities.append(ExtractedEntity(name=name, type=UNKNOWN_TYPE, description=""))

    for raw in entities if isinstance(entities, list) else []:
        name = clean_name(raw) if isinstance(raw, str) else ""
        if not name:
            drop(NO_NAME)
        elif len(name) > MAX_NAME_CHARS:
            drop(NAME_TOO_LONG)
        else:
            add_entity(name)
    for triple in triples if isinstance(triples, list) else []:
        if triple is TRUNCATED:
            drop(TRUNCATED)
            continue
        if not (isinstance(triple, (list, tuple)) and len(triple) == 3 and all(isinstance(t, str) for t in triple)):
            drop(MALFORMED_TRIPLE)
            continue
        s, o = clean_name(triple[0]), clean_name(triple[2])
        p = normalise_ws(triple[1])
        if not s or not p or not o:
            drop(MALFORMED_TRIPLE)
        elif max(len(s), len(o)) > MAX_NAME_CHARS:
            drop(NAME_TOO_LONG)
        elif s.casefold() == o.casefold():
            drop(SELF_RELATION)
        else:
            add_entity(s)
            add_entity(o)
            res.relations.append(ExtractedRelation(src=s, tgt=o, predicate=p, keywords=[p],
                                                   description=f"{s} {p} {o}", strength=1.0))
    return res


_FENCE_RE = re.compile(r"```[a-zA-Z]*+")
_STRING_RE = re.compile(r'"((?:[^"\\]|\\.)*+)"')
_OPEN_LIST_RE = re.compile(r'\[\s*+"')
_TRIPLE_RE = re.compile(r'\[\s*+("(?:[^"\\]|\\.)*+")\s*+,\s*+("(?:[^"\\]|\\.)*+")\s*+,\s*+("(?:[^"\\]|\\.)*+")\s*+\]')


def _json_string(literal: str) -> str | None:
    try:
        value = json.loads(literal)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _message_items(text: str) -> tuple[list, list, bool]:
    """(named_entities, triples, whole) from one model message: the JSON object in it (code fence and prose
    around it ignored), or, when it does not parse (an answer cut off mid-list), every complete string /
    three-string list after the key."""
    body = _FENCE_RE.sub(" ", text)
    start, end = body.find("{"), body.rfind("}")
    if start >= 0 and end > start:
        try:
            data = json.loads(body[start:end + 1])
        except ValueError:
            data = None
        if isinstance(data, dict):
            return data.get("named_entities") or [], data.get("triples") or [], True
    ents: list = []
    triples: list = []
    k = body.find('"named_entities"')
    if k >= 0:
        close = body.find("]", k)
        for m in _STRING_RE.finditer(body, k + len('"named_entities"'), close if close >= 0 else len(body)):
            ents.append(_json_string(m.group(0)))
    k = body.find('"triples"')
    if k >= 0:
        for m in _TRIPLE_RE.finditer(body, k):
            triples.append([_json_string(g) for g in m.groups()])
        cut = len(_OPEN_LIST_RE.findall(body, k + len('"triples"'))) - len(triples)
        triples.extend([TRUNCATED] * max(0, cut))    # a triple the answer ended in the middle of
    return ents, triples, False


def parse_openie_messages(*texts: str) -> ParseResult:
    """HippoRAG 2's raw NER and triple answers (`{"named_entities": [...]}`, `{"triples": [[s, p, o], ...]}`,
    either or both, maybe in a ```json fence) as one extraction; `complete` when every message was whole
    JSON."""
    entities: list = []
    triples: list = []
    whole = True
    for text in texts:
        e, t, ok = _message_items(text if isinstance(text, str) else "")
        entities.extend(e if isinstance(e, list) else [e])
        triples.extend(t if isinstance(t, list) else [t])
        whole = whole and ok
    res = openie_rows(entities, triples)
    res.complete = whole
    return res


def _passage_record(doc: dict, extractor: str, chunk_id: str, counts: dict[str, int]) -> ExtractionRecord:
    res = openie_rows(doc.get("extracted_entities") or [], doc.get("extracted_triples") or [])
    counts["dropped_entities"] += res.dropped.get(NO_NAME, 0)
    counts["dropped_triples"] += res.dropped.get(MALFORMED_TRIPLE, 0)
    counts["self_triples"] += res.dropped.get(SELF_RELATION, 0)
    counts["long_names"] += res.dropped.get(NAME_TOO_LONG, 0)
    counts["triples"] += len(res.relations)
    counts["entities"] += len(res.entities)
    return ExtractionRecord(chunk_id=chunk_id, extractor=extractor, entities=res.entities, relations=res.relations,
                            dropped_rows=res.n_dropped, dropped=dict(res.dropped))


def import_openie(project: ProjectDir, chunks: list[Chunk], path: Path,
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
                              "dropped_entities": 0, "long_names": 0}
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
