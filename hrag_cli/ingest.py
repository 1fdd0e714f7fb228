"""The chunk stage: scan DOCS, chunk every document, write docs.jsonl and chunks.jsonl.

chunks.jsonl always describes the corpus as it is now: a changed file's old chunks are replaced, a deleted
file's chunks disappear. Nothing is lost by that, because extraction is cached by chunk text, not by file.
A document whose sha256 and chunk settings are unchanged reuses its previous chunks instead of being
re-tokenised. A file whose stat stamp (size, mtime, inode, device, ctime) equals the one files.json kept from
the run that read it is not even read: its documents and chunks are taken from docs.jsonl and chunks.jsonl
(`rehash` reads every file again).

Chunk ids are the hash of the chunk text. Identical text repeated inside one document is kept once (it adds
nothing to the graph); identical text in two different documents keeps both chunks, the later one (in path
order) with an id salted by its doc_id so ids stay unique. Its extraction request is identical, so the LLM
cache answers it without a network call.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from . import store
from .chunking import chunk_text
from .config import Settings
from .errors import UsageError
from .progress import Reporter
from .project import Project, StageOutcome, fingerprint, text_hash
from .records import Chunk, Document, from_dict, to_dict

CHUNKER_VERSION = "chunk-v1"


@dataclass
class ChunkOutcome(StageOutcome):
    chunks: list[Chunk] = field(default_factory=list)
    documents: list[Document] = field(default_factory=list)


def settings_fingerprint(settings: Settings) -> str:
    """Everything that changes which chunks a corpus yields (document selection is part of it, so a changed
    --include re-runs the stage; the scan itself always runs)."""
    d, c = settings.documents, settings.chunk
    return fingerprint(CHUNKER_VERSION, c.tokens, c.overlap, c.encoding, d.jsonl_text_field, d.jsonl_id_field,
                       d.jsonl_title_field, sorted(d.include), sorted(d.exclude))


def load_chunks(project: Project) -> list[Chunk]:
    return [from_dict(Chunk, r) for r in store.read_jsonl(project.chunks_path)]


def load_documents(project: Project) -> list[Document]:
    return [from_dict(Document, r) for r in store.read_jsonl(project.docs_path)]


def load_stamps(project: Project) -> dict[str, tuple[list[int], list[str]]]:
    """files.json: rel path -> (stat stamp, doc ids) of each file as the last chunk run read it; trusted only
    when the chunk stage's record vouches for it (written by the same run as docs.jsonl and chunks.jsonl)."""
    rec = project.manifest()["stages"].get("chunk") or {}
    if "files.json" not in (rec.get("artifacts") or {}):
        return {}
    try:
        data = store.read_json(project.files_path, default={})
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict):
        return {}
    return {rel: (v[0], v[1]) for rel, v in files.items()
            if isinstance(v, list) and len(v) == 2 and isinstance(v[0], list) and isinstance(v[1], list)}


def _known(stamps: dict[str, tuple[list[int], list[str]]], old_docs: dict[str, Document],
           old_by_doc: dict[str, list[Chunk]]) -> dict[str, list[int]]:
    """The stamps a file may be skipped on: only those whose every document and its chunks are still there."""
    return {rel: st for rel, (st, ids) in stamps.items()
            if ids and all(i in old_docs and old_by_doc.get(i) for i in ids)}


def run_chunk(project: Project, settings: Settings, reporter: Reporter, roots: list[Path],
              write: bool = True, reuse: bool = False, rehash: bool = False) -> ChunkOutcome:
    """`reuse`: the pipeline vouches that the previous chunks were made with these settings and are intact;
    only then may unchanged files go unread (`rehash` reads them all the same)."""
    from .documents import LoadedDocument, scan

    if settings.chunk.tokens < 1:
        raise UsageError(f"chunk.tokens (--chunk-tokens) must be at least 1, not {settings.chunk.tokens}")
    old_docs = {d.doc_id: d for d in load_documents(project)}
    old_chunks = load_chunks(project)
    old_by_doc: dict[str, list[Chunk]] = defaultdict(list)
    for ch in old_chunks:
        old_by_doc[ch.doc_id].append(ch)
    stamps = load_stamps(project) if reuse and not rehash else {}
    scanned = scan(roots, settings.documents, reporter, skip_dirs=[project.root],
                   known=_known(stamps, old_docs, old_by_doc))
    for rel in scanned.unchanged:
        scanned.stamps[rel] = stamps[rel]
        scanned.documents.extend(LoadedDocument(old_docs[i], "") for i in stamps[rel][1])
    unread_docs = sum(len(stamps[rel][1]) for rel in scanned.unchanged)

    c = settings.chunk
    chunks: list[Chunk] = []
    documents: list[Document] = []
    used_ids: set[str] = set()
    reused = 0
    with reporter.task("chunk", len(scanned.documents)) as task:
        for loaded in sorted(scanned.documents, key=lambda d: d.doc.path):
            doc = loaded.doc
            old = old_docs.get(doc.doc_id)
            if reuse and old is not None and old.sha256 == doc.sha256 and old_by_doc.get(doc.doc_id):   # or unread
                pieces = [(ch.text, ch.n_tokens) for ch in sorted(old_by_doc[doc.doc_id], key=lambda x: x.order)]
                reused += 1
            else:
                pieces = [(p.text, p.n_tokens) for seg in loaded.segments()
                          for p in chunk_text(seg, c.tokens, c.overlap, c.encoding)]
            seen_here: set[str] = set()
            order = 0
            for text, n_tokens in pieces:
                cid = text_hash(text)
                if cid in seen_here:
                    continue                      # repeated inside this document: keep one
                seen_here.add(cid)
                if cid in used_ids:               # same text in an earlier document
                    cid = text_hash(f"{doc.doc_id}\n{text}")
                used_ids.add(cid)
                chunks.append(Chunk(chunk_id=cid, doc_id=doc.doc_id, order=order, n_tokens=n_tokens, text=text))
                order += 1
            doc.n_chunks = order
            documents.append(doc)
            task.advance()

    old_ids = {ch.chunk_id for ch in old_chunks}
    new_ids = {ch.chunk_id for ch in chunks}
    digest = fingerprint([(d.doc_id, d.path) for d in documents], [(ch.chunk_id, ch.doc_id, ch.order) for ch in chunks])
    counts = {
        "docs": len(documents),
        "chunks": len(chunks),
        "tokens": sum(ch.n_tokens for ch in chunks),
        "new_chunks": len(new_ids - old_ids),
        "removed_chunks": len(old_ids - new_ids),
        "reused_docs": reused,
        "unread_files": len(scanned.unchanged),
        "skipped_files": len(scanned.skipped),
        "ignored_files": scanned.ignored,
        "roots": [str(Path(r).expanduser().resolve()) for r in roots],
    }
    prev = project.stage("chunk") if reuse else None
    same = prev is not None and prev.output_digest == digest and unread_docs == len(documents)   # digest: every id
    if write and not same:   # (same: every file unread and nothing gone, so the files would come out as they are)
        # chunks first: docs.jsonl's sha256 values are what allow reuse, so they must never be newer than
        # the chunks they describe. Chunks are read whole (text is most of them), so they are compressed.
        store.write_jsonl(project.chunks_path, (to_dict(ch) for ch in chunks), compress=True)
        store.write_jsonl(project.docs_path, (to_dict(d) for d in documents))
        store.atomic_write_bytes(project.files_path, store.dumps({"version": 1, "files": scanned.stamps}))
    return ChunkOutcome(counts=counts, output_digest=digest, chunks=chunks, documents=documents)
