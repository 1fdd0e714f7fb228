"""Import a GraphRAG output folder: its documents and text units as this project's documents and chunks, its
entities and relationships as per-chunk extraction records, calling no LLM.

Why: a GraphRAG user has paid for the extraction; importing it lets PPR and every hrag mode run on it.
Read with pyarrow (the optional extra `hrag[graphrag]`): documents.parquet (`id, title, text, text_unit_ids`),
text_units.parquet (`id, text, n_tokens, document_ids` or `document_id`), entities.parquet (`title` or `name`,
`type, description, text_unit_ids`) and relationships.parquet (`source, target, description, weight,
text_unit_ids`); the older `create_final_*.parquet` names too. GraphRAG keeps no per-chunk answers in its
output, only the merged entities and relationships with the text units each came from, so a chunk's record
holds every entity and relationship that names it; descriptions are GraphRAG's summarised ones.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from pathlib import Path
from typing import Any

from hrag_cli.core.errors import UsageError
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import fingerprint
from hrag_cli.core.records import ExtractedEntity, ExtractedRelation, ExtractionRecord
from hrag_cli.extract.imported import ForeignDoc, ImportedCorpus, build_corpus
from hrag_cli.extract.parser import DEFAULT_PREDICATE, UNKNOWN_TYPE, clean_name, clean_type

__all__ = ["EXTRACTOR_PREFIX", "check_dir", "import_records", "read_corpus"]

IMPORT_VERSION = "graphrag-import-v1"
EXTRACTOR_PREFIX = "graphrag:"
TABLES = ("documents", "text_units", "entities", "relationships")
FLAG = "--import-graphrag"


def _pq() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError(f"{FLAG} reads Parquet with pyarrow, which is not installed: "
                         "pip install 'hrag[graphrag]' (or pip install pyarrow)") from None
    return pq


def _table_path(path: Path, name: str) -> Path | None:
    for candidate in (path / f"{name}.parquet", path / f"create_final_{name}.parquet"):
        if candidate.is_file():
            return candidate
    return None


def check_dir(path: Path) -> Path:
    path = Path(path).expanduser()
    if not path.is_dir():
        raise UsageError(f"{FLAG}: {path} is not a directory (give a GraphRAG output folder)")
    missing = [f"{n}.parquet" for n in TABLES if _table_path(path, n) is None]
    if missing:
        raise UsageError(f"{FLAG}: {path} has no {', '.join(missing)} (not a GraphRAG output folder)")
    _pq()
    return path.resolve()


def _rows(path: Path, name: str) -> list[dict]:
    f = _table_path(path, name)
    assert f is not None    # check_dir found every table
    try:
        return _pq().read_table(f).to_pylist()
    except Exception as exc:   # pyarrow raises several kinds for a damaged file
        raise UsageError(f"{FLAG}: {f} is not a readable Parquet table ({exc})") from None


def _ids(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []


def read_corpus(path: Path) -> ImportedCorpus:
    """Documents in GraphRAG's order; each one's text units in its `text_unit_ids` order (else the units'
    `human_readable_id`)."""
    units = {str(u.get("id")): u for u in _rows(path, "text_units") if isinstance(u.get("text"), str)}
    unit_docs: dict[str, list[str]] = defaultdict(list)
    for uid, u in units.items():
        for d in _ids(u.get("document_ids")) or _ids(u.get("document_id")):
            unit_docs[d].append(uid)
    foreign = []
    seen_units: set[str] = set()
    for doc in _rows(path, "documents"):
        key = str(doc.get("id"))
        listed = [u for u in _ids(doc.get("text_unit_ids")) if u in units]
        order = listed or sorted(unit_docs.get(key, []), key=lambda u: (units[u].get("human_readable_id") or 0, u))
        order = [u for u in order if u not in seen_units]   # a unit spanning documents goes to the first
        seen_units.update(order)
        title = doc.get("title")
        foreign.append(ForeignDoc(key, title if isinstance(title, str) else "",
                                  doc.get("text") if isinstance(doc.get("text"), str) else "",
                                  [(u, units[u]["text"], units[u].get("n_tokens")) for u in order]))
    corpus = build_corpus(foreign)
    corpus.counts["units_without_document"] = len(set(units) - seen_units)
    return corpus


def importer_id(path: Path) -> str:
    """The `extractor` of imported records: changes when a table or this importer does."""
    h = hashlib.sha256()
    for name in TABLES:
        f = _table_path(path, name)
        with open(f, "rb") as fh:   # type: ignore[arg-type]  (check_dir found every table)
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return f"{EXTRACTOR_PREFIX}{fingerprint(IMPORT_VERSION, h.hexdigest())}"


def import_records(path: Path, corpus: ImportedCorpus,
                   reporter: Reporter | None = None) -> tuple[str, list[ExtractionRecord], dict[str, Any]]:
    """(extractor id, one record per chunk some entity or relationship names, counts)."""
    extractor = importer_id(path)
    per: dict[str, ExtractionRecord] = {}

    def rec(unit: str) -> ExtractionRecord | None:
        cid = corpus.ids.get(unit)
        if cid is None:
            return None
        return per.setdefault(cid, ExtractionRecord(chunk_id=cid, extractor=extractor, entities=[], relations=[]))

    entities = _rows(path, "entities")
    relationships = _rows(path, "relationships")
    counts: dict[str, Any] = {"table_entities": len(entities), "table_relationships": len(relationships),
                              "unnamed": 0, "unplaced": 0}
    for e in entities:
        name = clean_name(str(e.get("title") or e.get("name") or ""))
        if not name:
            counts["unnamed"] += 1
            continue
        row = ExtractedEntity(name=name, type=clean_type(str(e.get("type") or "")) or UNKNOWN_TYPE,
                              description=str(e.get("description") or ""))
        targets = [r for r in (rec(u) for u in _ids(e.get("text_unit_ids"))) if r is not None]
        counts["unplaced"] += not targets
        for r in targets:
            r.entities.append(row)
    for rel in relationships:
        s, t = clean_name(str(rel.get("source") or "")), clean_name(str(rel.get("target") or ""))
        if not s or not t:
            counts["unnamed"] += 1
            continue
        weight = rel.get("weight")
        row = ExtractedRelation(src=s, tgt=t, predicate=DEFAULT_PREDICATE, keywords=[],
                                description=str(rel.get("description") or ""),
                                strength=float(weight) if isinstance(weight, (int, float)) else 1.0)
        targets = [r for r in (rec(u) for u in _ids(rel.get("text_unit_ids"))) if r is not None]
        counts["unplaced"] += not targets
        for r in targets:
            r.relations.append(row)
    records = [per[ch.chunk_id] for ch in corpus.chunks if ch.chunk_id in per]
    counts["without_extraction"] = len(corpus.chunks) - len(records)
    if reporter is not None:
        reporter.info(f"graphrag import: {len(corpus.chunks)} text units, {len(entities)} entities and "
                      f"{len(relationships)} relationships placed on {len(records)} of them")
        if counts["unplaced"]:
            reporter.warn(f"graphrag import: {counts['unplaced']} entities/relationships name no imported text "
                          "unit (left out)")
    return extractor, records, counts
