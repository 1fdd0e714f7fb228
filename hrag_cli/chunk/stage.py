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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hrag_cli.core import store
from hrag_cli.chunk.chunking import chunk_sections
from hrag_cli.core.config import Settings
from hrag_cli.core.errors import UsageError
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir, StageOutcome, StageRecord, fingerprint, text_hash
from hrag_cli.core.records import Chunk, ChunkRef, Document, from_dict, to_dict

if TYPE_CHECKING:
    from hrag_cli.chunk.documents import LoadedDocument, ScanResult

CHUNKER_VERSION = "chunk-v2"     # v2: format readers, sections and pages, sentence-aligned overlap


@dataclass
class ChunkOutcome(StageOutcome):
    chunks: list[Chunk] = field(default_factory=list)
    documents: list[Document] = field(default_factory=list)
    # True: `chunks` and `documents` hold only what this run added after the lines the files had (the rest is
    # as the last run left it); False: they hold every chunk and document
    appended: bool = False


@dataclass
class ChunksHanded:
    """The chunk stage's payload for the extract stage of the same run, so it need not read chunks.jsonl back."""

    chunks: list[Chunk] | None   # None: read chunks.jsonl
    # True: only the chunks this run appended, the extract stage's record covering every other one
    added: bool = False


def settings_fingerprint(settings: Settings) -> str:
    """Everything that changes which chunks a corpus yields (document selection is part of it, so a changed
    --include re-runs the stage; the scan itself always runs)."""
    d, c = settings.documents, settings.chunk
    return fingerprint(CHUNKER_VERSION, c.tokens, c.overlap, c.encoding, d.jsonl_text_field, d.jsonl_id_field,
                       d.jsonl_title_field, sorted(d.include), sorted(d.exclude))


def load_chunks(project: ProjectDir) -> list[Chunk]:
    return [from_dict(Chunk, r) for r in store.read_jsonl(project.chunks_path)]


def load_documents(project: ProjectDir) -> list[Document]:
    return [from_dict(Document, r) for r in store.read_jsonl(project.docs_path)]


def load_chunk_refs(project: ProjectDir) -> list[ChunkRef]:
    """Every chunk without its text, for a stage that needs only where chunks are (resolve's graph)."""
    return [ChunkRef(r["chunk_id"], r["doc_id"], int(r["order"])) for r in store.read_jsonl(project.chunks_path)]


# ------------------------------------------------------------------------------------------------ marks


def chunk_mark(project: ProjectDir) -> dict | None:
    """Where docs.jsonl and chunks.jsonl end now: {"epoch", "docs", "chunks"} (line counts). A later stage that
    keeps it can ask `added_since` for what came after, as long as the files were only appended to since (the
    epoch changes whenever they are written again whole). None before the chunk stage ran."""
    rec = project.stage("chunk")
    if rec is None or not isinstance(rec.counts.get("docs"), int) or not isinstance(rec.counts.get("chunks"), int):
        return None
    return {"epoch": _epoch(rec), "docs": rec.counts["docs"], "chunks": rec.counts["chunks"]}


def added_since(project: ProjectDir, mark: dict | None) -> tuple[list[Document], list[Chunk]] | None:
    """The documents and chunks appended after `mark` (a `chunk_mark`), reading only the files' ends; None when
    they were written whole since (or cannot say): the caller then reads everything."""
    now = chunk_mark(project)
    if not isinstance(mark, dict) or now is None or mark.get("epoch") != now["epoch"]:
        return None
    docs, chunks = now["docs"] - mark.get("docs", -1), now["chunks"] - mark.get("chunks", -1)
    if docs < 0 or chunks < 0 or docs > now["docs"] or chunks > now["chunks"]:
        return None
    doc_lines, chunk_lines = store.last_lines(project.docs_path, docs), store.last_lines(project.chunks_path, chunks)
    if doc_lines is None or chunk_lines is None:
        return None
    return ([from_dict(Document, store.loads(line)) for line in doc_lines],
            [from_dict(Chunk, store.loads(line)) for line in chunk_lines])


def _epoch(rec: StageRecord) -> str:
    """The files' epoch: a project from before epochs wrote them whole on every change, so its output digest
    (the content it wrote) names them."""
    return str(rec.counts.get("epoch") or rec.output_digest)


def load_stamps(project: ProjectDir) -> dict[str, tuple[list[int], list[str]]]:
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


def _save_stamps(project: ProjectDir, files: dict[str, tuple[list[int], list[str]]]) -> None:
    """files.json, which `load_stamps` reads."""
    store.atomic_write_bytes(project.files_path, store.dumps({"version": 1, "files": files}))


def _known(stamps: dict[str, tuple[list[int], list[str]]], old_docs: dict[str, Document],
           old_by_doc: dict[str, list[Chunk]]) -> dict[str, list[int]]:
    """The stamps a file may be skipped on: only those whose every document and its chunks are still there."""
    return {rel: st for rel, (st, ids) in stamps.items()
            if ids and all(i in old_docs and old_by_doc.get(i) for i in ids)}


def _content_digest(documents: list[Document], chunks: list[Chunk]) -> str:
    """What the chunk stage made of a corpus, whatever order the files hold it in: documents by path, chunks by
    their document's path and order."""
    docs = sorted(documents, key=lambda d: d.path)
    where = {d.doc_id: i for i, d in enumerate(docs)}
    ordered = sorted(chunks, key=lambda ch: (where.get(ch.doc_id, -1), ch.order))
    return fingerprint([(d.doc_id, d.path) for d in docs], [(ch.chunk_id, ch.doc_id, ch.order) for ch in ordered])


def _cut(loaded: list[LoadedDocument], settings: Settings, reporter: Reporter, used_ids: set[str],
         previous: Callable[[Document], list[Chunk] | None]) -> tuple[list[Document], list[Chunk], int]:
    """Chunk documents in path order: (documents, chunks, how many reused `previous` chunks). Identical text
    inside one document is kept once; the same text in a document after one that has it (`used_ids`) gets an
    id salted by its doc_id."""
    c = settings.chunk
    chunks: list[Chunk] = []
    documents: list[Document] = []
    reused = 0
    with reporter.task("chunk", len(loaded)) as task:
        for item in sorted(loaded, key=lambda d: d.doc.path):
            doc = item.doc
            old = previous(doc)
            if old:
                pieces = [(ch.text, ch.n_tokens, ch.section, ch.page, ch.page_end)
                          for ch in sorted(old, key=lambda x: x.order)]
                reused += 1
            else:
                pieces = []
                for p in chunk_sections(item.sections(), c.tokens, c.overlap, c.encoding):
                    pieces.append((p.text, p.n_tokens, list(p.trail), p.page, p.page_end))
                    if len(pieces) % 256 == 0:   # a big file takes a while: show its chunks growing
                        task.update(chunks=len(chunks) + len(pieces))
            seen_here: set[str] = set()
            order = 0
            for text, n_tokens, section, page, page_end in pieces:
                cid = text_hash(text)
                if cid in seen_here:
                    continue                      # repeated inside this document: keep one
                seen_here.add(cid)
                if cid in used_ids:               # same text in an earlier document
                    cid = text_hash(f"{doc.doc_id}\n{text}")
                used_ids.add(cid)
                chunks.append(Chunk(chunk_id=cid, doc_id=doc.doc_id, order=order, n_tokens=n_tokens, text=text,
                                    section=section, page=page, page_end=page_end))
                order += 1
            doc.n_chunks = order
            documents.append(doc)
            task.advance()
    return documents, chunks, reused


def _counts(documents: int, chunks: int, tokens: int, scanned: ScanResult, roots: list[Path], **more: Any) -> dict:
    skipped_files = sum(scanned.skipped_by_ext.values())
    return {"docs": documents, "chunks": chunks, "tokens": tokens, **more,
            "read_files": scanned.read, "unread_files": len(scanned.unchanged), "skipped_files": skipped_files,
            "skipped_records": len(scanned.skipped) - skipped_files, "excluded_files": scanned.excluded,
            "skipped_by_ext": dict(sorted(scanned.skipped_by_ext.items())),
            "skipped_by_reason": dict(sorted(scanned.skipped_by_reason.items())),
            "skipped": list(scanned.skipped), "roots": [str(Path(r).expanduser().resolve()) for r in roots]}


# ------------------------------------------------------------------------------------------------ the stage


def run_chunk(project: ProjectDir, settings: Settings, reporter: Reporter, roots: list[Path],
              write: bool = True, reuse: bool = False, rehash: bool = False,
              taken: Callable[[set[str]], bool] | None = None) -> ChunkOutcome:
    """`reuse`: the pipeline vouches that the previous chunks were made with these settings and are intact;
    only then may unchanged files go unread (`rehash` reads them all the same). `taken(ids)`: whether any of
    these chunk ids may already be in chunks.jsonl; given, a run that only finds new files appends them to the
    files instead of reading and writing every chunk again (a run that finds nothing new needs no `taken`)."""
    from hrag_cli.chunk.documents import scan

    if settings.chunk.tokens < 1:
        raise UsageError(f"chunk.tokens (--chunk-tokens) must be at least 1, not {settings.chunk.tokens}")
    prev = project.stage("chunk") if reuse else None
    stamps = load_stamps(project) if reuse and not rehash else {}
    scanned = scan(roots, settings.documents, reporter, skip_dirs=[project.root],
                   known={rel: st for rel, (st, _) in stamps.items()})
    if prev is not None and stamps and write:   # a dry run's estimate wants every chunk
        appended = _append(project, settings, reporter, roots, prev, stamps, scanned, taken)
        if appended is not None:
            return appended
    return _rechunk(project, settings, reporter, roots, prev, stamps, scanned, write, reuse)


def _append(project: ProjectDir, settings: Settings, reporter: Reporter, roots: list[Path], prev: StageRecord,
            stamps: dict[str, tuple[list[int], list[str]]], scanned: ScanResult,
            taken: Callable[[set[str]], bool] | None) -> ChunkOutcome | None:
    """Every file the last run read is unchanged and was, with files read again that hold what they held, its
    only source of documents, so whatever else was read now is new: chunk only that and append it to the files
    (O(new documents)). None when that does not hold, or a new chunk's text is one the files may hold already
    (the ids a full pass gives would differ)."""
    before = prev.counts
    if set(scanned.unchanged) != stamps.keys() or not isinstance(before.get("chunks"), int):
        return None     # a file changed or went: the full pass sorts it out
    loaded = _unstamped_as_before(project, stamps, scanned, before.get("docs"))
    if loaded is None:
        return None
    used: set[str] = set()
    documents, chunks, _ = _cut(loaded, settings, reporter, used, lambda doc: None)
    if used and (taken is None or taken(used)):
        return None
    digest = prev.output_digest
    if documents:
        digest = fingerprint("chunk-append", digest, [(d.doc_id, d.path) for d in documents],
                             [(ch.chunk_id, ch.doc_id, ch.order) for ch in chunks])
        # chunks first: docs.jsonl's sha256 values are what allow reuse, so they must never be newer than the
        # chunks they describe
        if store.extend_jsonl(project.chunks_path, (to_dict(ch) for ch in chunks)) is None:
            return None
        if store.extend_jsonl(project.docs_path, (to_dict(d) for d in documents)) is None:
            return None
    if documents or scanned.stamps:     # new files, or a file read again that can now be stamped
        _save_stamps(project, {**{rel: stamps[rel] for rel in scanned.unchanged}, **scanned.stamps})
    counts = _counts(before["docs"] + len(documents), before["chunks"] + len(chunks),
                     int(before.get("tokens", 0)) + sum(ch.n_tokens for ch in chunks), scanned, roots,
                     new_chunks=len(chunks), removed_chunks=0, reused_docs=before["docs"], epoch=_epoch(prev))
    return ChunkOutcome(counts=counts, output_digest=digest, chunks=chunks, documents=documents, appended=True)


def _unstamped_as_before(project: ProjectDir, stamps: dict[str, tuple[list[int], list[str]]], scanned: ScanResult,
                         n_docs: Any) -> list[LoadedDocument] | None:
    """What was read now that is new, when the documents no stamp covers (a file touched in the second before
    the last scan, so read again now) were all read again unchanged: the run after one that appended a file
    just written must not chunk the corpus whole for it. None when any of them changed or was not found."""
    covered = sum(len(ids) for _, ids in stamps.values())
    if covered == n_docs:
        return list(scanned.documents)
    if not isinstance(n_docs, int) or covered > n_docs:
        return None
    stamped = {i for _, ids in stamps.values() for i in ids}
    before = {d.doc_id: d.sha256 for d in load_documents(project) if d.doc_id not in stamped}
    again = [item for item in scanned.documents if item.doc.doc_id in before]
    if len(before) != n_docs - covered or len(again) != len(before) \
            or any(before[item.doc.doc_id] != item.doc.sha256 for item in again):
        return None
    return [item for item in scanned.documents if item.doc.doc_id not in before]


def _rechunk(project: ProjectDir, settings: Settings, reporter: Reporter, roots: list[Path], prev: StageRecord | None,
             stamps: dict[str, tuple[list[int], list[str]]], scanned: ScanResult, write: bool,
             reuse: bool) -> ChunkOutcome:
    """The full pass: every document's chunks (an unchanged document keeps its previous ones), written whole in
    path order."""
    from hrag_cli.chunk.documents import LoadedDocument, scan

    old_doc_list, old_chunks = load_documents(project), load_chunks(project)
    old_docs = {d.doc_id: d for d in old_doc_list}
    old_by_doc: dict[str, list[Chunk]] = defaultdict(list)
    for ch in old_chunks:
        old_by_doc[ch.doc_id].append(ch)
    known = _known(stamps, old_docs, old_by_doc)
    if any(rel not in known for rel in scanned.unchanged):   # stamped, but its documents are not all there
        scanned = scan(roots, settings.documents, reporter, skip_dirs=[project.root], known=known)
    for rel in scanned.unchanged:
        scanned.stamps[rel] = stamps[rel]
        scanned.documents.extend(LoadedDocument(old_docs[i], "") for i in stamps[rel][1])
    unread_docs = sum(len(stamps[rel][1]) for rel in scanned.unchanged)

    def previous(doc: Document) -> list[Chunk] | None:
        old = old_docs.get(doc.doc_id)
        if reuse and old is not None and old.sha256 == doc.sha256:   # or unread
            return old_by_doc.get(doc.doc_id)
        return None

    documents, chunks, reused = _cut(scanned.documents, settings, reporter, set(), previous)
    old_ids = {ch.chunk_id for ch in old_chunks}
    new_ids = {ch.chunk_id for ch in chunks}
    digest = _content_digest(documents, chunks)
    unchanged = prev is not None and digest == _content_digest(old_doc_list, old_chunks)
    same = unchanged and unread_docs == len(documents)     # every file unread and nothing gone: files as they are
    epoch = _epoch(prev) if prev is not None else ""
    if write and not same:
        # chunks first: docs.jsonl's sha256 values are what allow reuse, so they must never be newer than
        # the chunks they describe. Chunks are read whole (text is most of them), so they are compressed.
        store.write_jsonl(project.chunks_path, (to_dict(ch) for ch in chunks), compress=True)
        store.write_jsonl(project.docs_path, (to_dict(d) for d in documents))
        _save_stamps(project, scanned.stamps)
        in_place = ([d.doc_id for d in documents] == [d.doc_id for d in old_doc_list]
                    and [ch.chunk_id for ch in chunks] == [ch.chunk_id for ch in old_chunks])
        if not (unchanged and in_place):    # lines moved or changed: what a mark counted no longer holds
            epoch = fingerprint("epoch", digest, epoch)
    counts = _counts(len(documents), len(chunks), sum(ch.n_tokens for ch in chunks), scanned, roots,
                     new_chunks=len(new_ids - old_ids), removed_chunks=len(old_ids - new_ids), reused_docs=reused,
                     epoch=epoch or fingerprint("epoch", digest, ""))
    # an unchanged corpus keeps its digest (an appended one's is not its content digest), so nothing downstream
    # runs again
    return ChunkOutcome(counts=counts, output_digest=prev.output_digest if unchanged else digest,
                        chunks=chunks, documents=documents)


def write_imported(project: ProjectDir, documents: list[Document], chunks: list[Chunk], source: Any,
                   more: dict[str, Any]) -> ChunkOutcome:
    """The chunk stage for documents and chunks another tool cut (`source`: an extract.imported.ImportSource,
    remembered so a plain `hrag index` imports it again): written whole when they
    differ from what the files hold; an unchanged import keeps its digest, so nothing downstream runs again."""
    prev = project.stage("chunk")
    old_docs, old_chunks = load_documents(project), load_chunks(project)
    digest = _content_digest(documents, chunks)
    unchanged = prev is not None and digest == _content_digest(old_docs, old_chunks)
    epoch = _epoch(prev) if prev is not None else ""
    if not unchanged:
        store.write_jsonl(project.chunks_path, (to_dict(ch) for ch in chunks), compress=True)
        store.write_jsonl(project.docs_path, (to_dict(d) for d in documents))
        _save_stamps(project, {})
        epoch = fingerprint("epoch", digest, epoch)
    counts = {"docs": len(documents), "chunks": len(chunks), "tokens": sum(ch.n_tokens for ch in chunks),
              "new_chunks": len({ch.chunk_id for ch in chunks} - {ch.chunk_id for ch in old_chunks}),
              "removed_chunks": len({ch.chunk_id for ch in old_chunks} - {ch.chunk_id for ch in chunks}),
              **more, "roots": [str(source.path)], "imported_from": source.to_json(), "epoch": epoch}
    return ChunkOutcome(counts=counts, output_digest=prev.output_digest if unchanged else digest,
                        chunks=chunks, documents=documents)
