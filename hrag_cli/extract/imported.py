"""Corpora another tool chunked and extracted (LightRAG, GraphRAG): what the importers share.

An importer module (IMPORTERS) has `check_dir(path) -> Path`, `read_corpus(path) -> ImportedCorpus` and
`import_records(path, corpus, reporter) -> (extractor id, records, counts)`; the chunk stage writes its corpus,
the extract stage its records, so resolve and synonyms run on them as on hrag's own.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from hrag_cli.core.project import text_hash
from hrag_cli.core.records import Chunk, Document

IMPORTERS = ("lightrag", "graphrag")


@dataclass(frozen=True)
class ImportSource:
    kind: str        # a key of IMPORTERS
    path: Path

    @property
    def flag(self) -> str:
        return f"--import-{self.kind}"

    def to_json(self) -> dict:
        return {"kind": self.kind, "dir": str(self.path)}

    @staticmethod
    def from_json(data: object) -> "ImportSource | None":
        if isinstance(data, dict) and data.get("kind") in IMPORTERS and isinstance(data.get("dir"), str):
            return ImportSource(data["kind"], Path(data["dir"]))
        return None


@dataclass
class ImportedCorpus:
    documents: list[Document]
    chunks: list[Chunk]
    ids: dict[str, str]      # the other tool's chunk id -> chunk id here
    counts: dict[str, int] = field(default_factory=dict)


@dataclass
class ForeignDoc:
    """One document as the other tool holds it: its chunks (id, text, tokens or None) in order."""

    key: str
    path: str                # "" when the tool names no file: the key is used
    content: str             # "" when the tool keeps no full text: the chunks joined
    chunks: list[tuple[str, str, int | None]]


def build_corpus(docs: list[ForeignDoc]) -> ImportedCorpus:
    """Documents and chunks as the chunk stage would write them: a chunk's id is its text's hash (salted when
    the text came before), a document's id its path's; one foreign chunk is one chunk, in the given order."""
    documents: list[Document] = []
    chunks: list[Chunk] = []
    ids: dict[str, str] = {}
    used: set[str] = set()
    paths: set[str] = set()
    for fd in docs:
        parts = [(k, t, n) for k, t, n in fd.chunks if isinstance(t, str) and t.strip()]
        if not parts:
            continue
        rel = fd.path if fd.path and fd.path not in paths else fd.key
        paths.add(rel)
        raw = (fd.content or "\n".join(t for _, t, _ in parts)).encode("utf-8")
        doc = Document(doc_id=text_hash(rel), path=rel, sha256=hashlib.sha256(raw).hexdigest(), bytes=len(raw),
                       metadata={"source_id": fd.key})
        for order, (key, text, tokens) in enumerate(parts):
            cid = text_hash(text)
            if cid in used:
                cid = text_hash(f"{doc.doc_id}\n{text}\n{order}")
            used.add(cid)
            ids[key] = cid
            chunks.append(Chunk(chunk_id=cid, doc_id=doc.doc_id, order=order, text=text,
                                n_tokens=tokens if isinstance(tokens, int) else len(text.split())))
        doc.n_chunks = len(parts)
        documents.append(doc)
    return ImportedCorpus(documents, chunks, ids, {"imported_docs": len(documents), "imported_chunks": len(chunks)})
