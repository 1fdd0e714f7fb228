"""Loading documents: a recursive scan of folders or single files into documents and their sections.

Paths are relative to the DOCS root they were found under, so the same corpus indexed from another working
directory gets the same doc ids. With several roots, each path is prefixed by its root's name so two roots
holding `a.txt` stay distinct. A `.jsonl` file yields one document per record, `file.jsonl#<id>`; other
formats are read by `readers`. Folders reached through symlinks are followed, each real folder once.
Nothing is dropped in silence: every file found is either a document or listed in `skipped` with its reason
(unsupported type, no text layer, encrypted, binary, not UTF-8, unreadable, too big, symlink loop); a file
that failed to read is also warned about. Only a missing path or a corpus with nothing usable is an error.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import orjson

from hrag_cli.chunk import readers
from hrag_cli.chunk.chunking import stream_segments
from hrag_cli.chunk.readers import Section, Skip
from hrag_cli.core.config import DocumentSettings
from hrag_cli.core.errors import UsageError
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import text_hash
from hrag_cli.core.records import Document

RECORD_SUFFIXES = {".jsonl"}
# HTML and DOCX files are parsed whole: bigger ones are listed as too big (text files of any size stream)
MAX_WHOLE_BYTES = 256 << 20


# Text files bigger than this are never read whole: the scan hashes them a block at a time and the chunk
# stage reads them again a segment at a time (chunking.stream_segments), so memory stays a few segments.
BIG_FILE_BYTES = 1 << 24
BLOCK_BYTES = 1 << 22


@dataclass
class LoadedDocument:
    doc: Document
    text: str
    source: Path | None = None   # a big text file, read again segment by segment; `text` is then empty
    kind: str = "plain"          # the reader's kind (readers.kind_of): how sections are found in the text
    parts: list[Section] | None = None   # the sections of a file that is not plain text (HTML, PDF, DOCX)

    def segments(self) -> Iterator[str]:
        """The text in pieces that are each chunked on their own (one piece unless the file is big)."""
        if self.parts is not None:
            yield from (p.text for p in self.parts)
        elif self.source is None:
            yield self.text
        else:
            yield from stream_segments(_text_blocks(self.source))

    def sections(self) -> Iterator[Section]:
        """The text split at headings, each piece with its heading trail (and PDF pages)."""
        if self.parts is not None:
            yield from self.parts
        else:
            yield from readers.structured(self.segments(), self.kind)


class _NotText(Exception):
    pass


def _text_blocks(path: Path) -> Iterator[str]:
    """The file's text as `_decode` would give it, a block at a time; _NotText when it is binary or not
    UTF-8 (a "\r" at a block's end waits for the next block, which may start with "\n")."""
    dec = codecs.getincrementaldecoder("utf-8-sig")()
    carry = ""
    with open(path, "rb") as fh:
        while True:
            data = fh.read(BLOCK_BYTES)
            if b"\x00" in data:
                raise _NotText("binary file")
            try:
                text = carry + dec.decode(data, final=not data)
            except UnicodeDecodeError:
                raise _NotText("not UTF-8 text") from None
            carry = "\r" if data and text.endswith("\r") else ""
            text = text[:-1] if carry else text
            if text:
                yield text.replace("\r\n", "\n").replace("\r", "\n")
            if not data:
                return


def _big_text_file(path: Path, rel: str, kind: str) -> LoadedDocument | None:
    """Hash a big text file a block at a time; None when it holds only white space."""
    h, size, blank = hashlib.sha256(), 0, True
    for text in _text_blocks(path):
        raw = text.encode("utf-8")
        h.update(raw)
        size += len(raw)
        blank = blank and text.isspace()
    if blank:
        return None
    return LoadedDocument(Document(doc_id=text_hash(rel), path=rel, sha256=h.hexdigest(), bytes=size, metadata={}),
                          "", path, kind)


@dataclass
class ScanResult:
    documents: list[LoadedDocument] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)     # "path: reason" of each file or record not indexed
    skipped_by_ext: dict[str, int] = field(default_factory=dict)      # ".png" -> files skipped
    skipped_by_reason: dict[str, int] = field(default_factory=dict)   # "unsupported type" -> files skipped
    excluded: int = 0                                    # files --include / --exclude left out
    read: int = 0                                        # files read (not found unchanged)
    warnings: int = 0                                    # every warning, so a file that caused one is re-read
    # rel path -> (stat stamp, its doc ids) of every file read without a warning or found unchanged
    stamps: dict[str, tuple[list[int], list[str]]] = field(default_factory=dict)
    unchanged: list[str] = field(default_factory=list)   # files skipped because their stamp matched `known`


# A file changed less than this before the scan is never stamped: a write in the same clock tick after the
# stat could leave size, mtime and ctime all equal (the "racily clean" case git guards the same way; 1 s
# covers file systems that keep whole seconds).
RACY_NS = 1_000_000_000


def stamp(st: os.stat_result) -> list[int]:
    """What says a file is the one read before without reading it: an in-place edit that keeps size and mtime
    (touch -d back) still moves ctime, which no user call can set; a replaced file has a new inode."""
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, st.st_ctime_ns]


# ------------------------------------------------------------------------------------------------ globs


@lru_cache(maxsize=256)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    """fnmatch-style glob on '/'-separated paths: `*` and `?` stay inside one folder, `**` crosses folders
    (`**/` also matches no folder at all), `[...]` is a character class."""
    i, n, out = 0, len(pattern), []
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                i += 2
                if i < n and pattern[i] == "/":
                    i += 1
                    out.append("(?:.*/)?")
                else:
                    out.append(".*")
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = pattern.find("]", i + 2 if pattern[i + 1:i + 2] in ("!", "]") else i + 1)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1:j]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    try:
        return re.compile("(?s:" + "".join(out) + r")\Z")
    except re.error as exc:     # e.g. a reversed range, [z-a]
        raise UsageError(f"bad --include/--exclude pattern '{pattern}': {exc}") from None


def glob_match(rel_path: str, pattern: str) -> bool:
    """A pattern with no '/' also matches the file name alone (like .gitignore), so `*.jsonl` works at any
    depth; otherwise it is matched against the whole relative path."""
    pattern = pattern.strip()
    if pattern.startswith("./"):
        pattern = pattern[2:]
    if not pattern:
        return False
    rx = _glob_regex(pattern)
    if rx.match(rel_path):
        return True
    return "/" not in pattern and rx.match(rel_path.rsplit("/", 1)[-1]) is not None


def selected(rel_path: str, settings: DocumentSettings) -> bool:
    if settings.include and not any(glob_match(rel_path, p) for p in settings.include):
        return False
    return not any(glob_match(rel_path, p) for p in settings.exclude)


# ------------------------------------------------------------------------------------------------ scan


def _real(path: Path) -> Path | None:
    """The resolved path, or None for a symlink loop or a link that cannot be followed."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):
        return None


def _walk(root: Path, skip: set[Path], visited: set[Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Files under root, sorted, skipping hidden files and folders (.git, .hrag, ...) and `skip` folders; and
    the folders that could not be followed, with the reason (reported as skipped, never silently lost).
    Symlinked folders are followed; a real folder already walked (`visited`) is not walked again: a link
    back to a folder above it is a symlink loop, any other a second name for a folder read once."""
    found: list[Path] = []
    unreadable: list[tuple[Path, str]] = []

    def failed(exc: OSError) -> None:
        unreadable.append((Path(exc.filename or root), exc.strerror or str(exc)))

    real_root = _real(root)
    if real_root is not None:
        visited.add(real_root)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True, onerror=failed):
        here = Path(dirpath)
        here_real = _real(here)
        keep = []
        for d in sorted(dirnames):
            if d.startswith("."):
                continue
            real = _real(here / d)
            if real is None:
                unreadable.append((here / d, "symlink loop or broken link"))
            elif real in skip:
                continue
            elif real in visited:
                if here_real is not None and here_real.is_relative_to(real):
                    unreadable.append((here / d, "symlink loop"))
                # else: another name for a folder read once already
            else:
                visited.add(real)
                keep.append(d)
        dirnames[:] = keep
        for name in filenames:
            if not name.startswith("."):
                found.append(here / name)
    return sorted(found), unreadable


def _decode(data: bytes) -> str | None:
    """UTF-8 text (BOM dropped, newlines normalised), or None when it is binary or not UTF-8."""
    if b"\x00" in data:
        return None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _make_doc(path: str, text: str, metadata: dict | None = None) -> LoadedDocument:
    raw = text.encode("utf-8")
    return LoadedDocument(Document(doc_id=text_hash(path), path=path, sha256=hashlib.sha256(raw).hexdigest(),
                                   bytes=len(raw), metadata=metadata or {}), text)


def _records(rel: str, text: str, settings: DocumentSettings, reporter: Reporter,
             result: ScanResult) -> list[LoadedDocument]:
    """One document per JSONL line; a line that is not a JSON object with a text field is skipped, named."""
    docs: list[LoadedDocument] = []
    seen: set[str] = set()
    tf, idf, titlef = settings.jsonl_text_field, settings.jsonl_id_field, settings.jsonl_title_field
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{rel}:{lineno}"
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            _skip(result, reporter, where, "not valid JSON")
            continue
        if not isinstance(rec, dict):
            _skip(result, reporter, where, "not a JSON object")
            continue
        body = rec.get(tf)
        if not isinstance(body, str) or not body.strip():
            _skip(result, reporter, where, f"no text in field '{tf}'")
            continue
        key = rec.get(idf)
        key = str(key).strip() if isinstance(key, (str, int, float)) and not isinstance(key, bool) else ""
        key = key or f"line{lineno}"
        if key in seen:
            _warn(result, reporter, f"{where}: duplicate id '{key}', keyed by line number instead")
            key = f"line{lineno}"
        seen.add(key)
        title = rec.get(titlef)
        full = f"{title.strip()}\n\n{body}" if isinstance(title, str) and title.strip() else body
        metadata = {k: v for k, v in rec.items() if k != tf}
        docs.append(_make_doc(f"{rel}#{key}", full.replace("\r\n", "\n"), metadata))
    return docs


def _warn(result: ScanResult, reporter: Reporter, message: str) -> None:
    """Every warning goes through here: a file that gave one is not stat-stamped, so it is read next time."""
    result.warnings += 1
    reporter.warn(message)


def _skip(result: ScanResult, reporter: Reporter | None, where: str, reason: str, file: bool = True) -> None:
    """List `where` as not indexed; warn when a reporter is given (a file that failed, not one of a type
    hrag does not read). `file`: a whole file, counted by extension and reason (else a JSONL record)."""
    result.skipped.append(f"{where}: {reason}")
    if file:
        ext = Path(where).suffix.lower() or "(none)"
        result.skipped_by_ext[ext] = result.skipped_by_ext.get(ext, 0) + 1
        kind = reason.split(" (", 1)[0].split(" '", 1)[0]
        result.skipped_by_reason[kind] = result.skipped_by_reason.get(kind, 0) + 1
    if reporter is not None:
        _warn(result, reporter, f"skipped {where}: {reason}")


def _load_file(path: Path, rel: str, settings: DocumentSettings, reporter: Reporter, result: ScanResult,
               known: dict[str, list[int]], now_ns: int) -> None:
    """Read one file, or only stat it when its stamp equals `known[rel]`; stamp it when it read cleanly."""
    try:
        st = path.stat()
    except OSError as exc:
        _skip(result, reporter, rel, f"unreadable ({exc.strerror or exc})")
        return
    now = stamp(st)
    if known.get(rel) == now:
        result.unchanged.append(rel)
        return
    first, warnings = len(result.documents), result.warnings
    _read_file(path, rel, settings, reporter, result, st.st_size)
    result.read += len(result.documents) > first
    if result.warnings == warnings and max(st.st_mtime_ns, st.st_ctime_ns) < now_ns - RACY_NS:
        result.stamps[rel] = (now, [d.doc.doc_id for d in result.documents[first:]])


def _read_file(path: Path, rel: str, settings: DocumentSettings, reporter: Reporter,
               result: ScanResult, size: int) -> None:
    kind = readers.kind_of(path.name) or ("records" if path.suffix.lower() in RECORD_SUFFIXES else "")
    data: bytes | None = None
    try:
        if kind in readers.TEXT_KINDS:   # the content decides what a text name hides (HTML, PDF)
            if size > BIG_FILE_BYTES:
                with open(path, "rb") as fh:
                    head = fh.read(4096)
            else:
                data = path.read_bytes()
                head = data[:4096]
            kind = readers.sniff(head, kind)
        if kind in readers.TEXT_KINDS and data is None:
            try:
                big = _big_text_file(path, rel, kind)
            except _NotText as exc:
                _skip(result, reporter, rel, str(exc))
                return
            if big is None:
                _skip(result, reporter, rel, "empty")
            else:
                result.documents.append(big)
            return
        if kind == "pdf":
            _read_pdf(path, rel, reporter, result)
            return
        if size > MAX_WHOLE_BYTES and kind in ("html", "docx"):
            _skip(result, reporter, rel, f"too big ({size >> 20} MB; {kind or 'this type'} files are read whole, "
                                         f"up to {MAX_WHOLE_BYTES >> 20} MB)")
            return
        if kind == "docx":
            parts = readers.read_docx(path)
            if not parts:
                _skip(result, reporter, rel, "empty")
                return
            result.documents.append(_make_parts_doc(rel, path.read_bytes(), parts, kind))
            return
        if data is None:
            data = path.read_bytes()
    except Skip as exc:
        _skip(result, reporter, rel, str(exc))
        return
    except OSError as exc:
        _skip(result, reporter, rel, f"unreadable ({exc.strerror or exc})")
        return
    text = _decode(data)
    if text is None:
        _skip(result, reporter, rel, "binary file" if b"\x00" in data else "not UTF-8 text")
        return
    if kind == "records":
        docs = _records(rel, text, settings, reporter, result)
        if not docs and text.strip():
            _warn(result, reporter, f"{rel}: no usable records")
        result.documents.extend(docs)
        return
    if not text.strip():
        _skip(result, reporter, rel, "empty")
        return
    if kind == "html":
        try:
            parts = readers.read_html(text)
        except Skip as exc:
            _skip(result, reporter, rel, str(exc))
            return
        if not parts:
            _skip(result, reporter, rel, "no text (an HTML page without body text)")
            return
        result.documents.append(_make_parts_doc(rel, data, parts, kind))
        return
    loaded = _make_doc(rel, text)
    loaded.kind = kind
    result.documents.append(loaded)


def _make_parts_doc(rel: str, data: bytes, parts: list[Section], kind: str) -> LoadedDocument:
    """A document read by a format reader: its sha256 is the file's, so an unchanged file keeps its chunks."""
    return LoadedDocument(Document(doc_id=text_hash(rel), path=rel, sha256=hashlib.sha256(data).hexdigest(),
                                   bytes=len(data), metadata={}), "", None, kind, parts)


def _read_pdf(path: Path, rel: str, reporter: Reporter, result: ScanResult) -> None:
    """The text layer, page by page; pages without one (scans) are named in a warning, a PDF with none is
    skipped."""
    blank: list[int] = []
    parts = list(readers.read_pdf(path, blank))     # Skip when no page has text
    data_hash = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(BLOCK_BYTES), b""):
            data_hash.update(block)
    pages = sum(len(p.pages) for p in parts)
    if blank:
        shown = ", ".join(map(str, blank[:10])) + (f" … (+{len(blank) - 10})" if len(blank) > 10 else "")
        _warn(result, reporter, f"{rel}: {len(blank)} of {pages + len(blank)} pages have no text layer and are "
                                f"not indexed (OCR is not done): p. {shown}")
    result.documents.append(LoadedDocument(
        Document(doc_id=text_hash(rel), path=rel, sha256=data_hash.hexdigest(), bytes=path.stat().st_size,
                 metadata={"pages": pages + len(blank)}), "", None, "pdf", parts))


def scan(roots: list[Path], settings: DocumentSettings, reporter: Reporter,
         skip_dirs: list[Path] | None = None, known: dict[str, list[int]] | None = None) -> ScanResult:
    """Load every supported document under `roots` (folders or files). `skip_dirs` (the project folder)
    is never read even when it sits inside a root under a non-hidden name. A file whose stamp equals
    `known[rel]` is not read: it is listed in `unchanged` and the caller reuses what it made of it before."""
    if not roots:
        raise UsageError("no documents given")
    resolved: list[Path] = []
    for r in roots:
        p = Path(r).expanduser()
        if not p.exists():
            raise UsageError(f"no such file or folder: {r}")
        resolved.append(p.resolve())
    skip = {Path(s).resolve() for s in (skip_dirs or [])}
    resolved = list(dict.fromkeys(resolved))           # the same root given twice is read once
    prefix_roots = len(resolved) > 1
    prefixes = {r: r.name for r in resolved}
    if len(set(prefixes.values())) < len(prefixes):
        # two roots with the same name (x/docs, y/docs): prefix each by its path below their common folder
        common = Path(os.path.commonpath([r.parent for r in resolved]))
        prefixes = {r: r.relative_to(common).as_posix() for r in resolved}
    result = ScanResult()
    known, now_ns = known or {}, time.time_ns()
    seen_paths: set[str] = set()
    seen_files: dict[Path, Path] = {}                  # file -> the root it was first read under
    visited: set[Path] = set()                         # real folders walked, each once
    for root in resolved:
        if root.is_file():
            files, base = [root], root.parent
            explicit = True
        else:
            (files, unreadable), base = _walk(root, skip, visited), root
            explicit = False
            for folder, reason in unreadable:
                inner = folder.relative_to(base).as_posix() if folder.is_relative_to(base) else str(folder)
                _skip(result, reporter, f"{prefixes[root]}/{inner}" if prefix_roots else inner,
                      reason if "symlink" in reason else f"unreadable folder ({reason})")
        for f in files:
            inner = f.relative_to(base).as_posix()
            rel = f"{prefixes[root]}/{inner}" if prefix_roots else inner
            if not explicit and not selected(inner, settings):
                result.excluded += 1
                continue
            real = _real(f)
            if real is None:
                _skip(result, reporter, rel, "symlink loop or broken link")
                continue
            if not readers.kind_of(f.name) and f.suffix.lower() not in RECORD_SUFFIXES:
                # a type hrag does not read: listed, warned about only when named on the command line
                _skip(result, reporter if explicit else None, rel, f"unsupported type '{f.suffix or '(none)'}'")
                continue
            if rel in seen_paths or seen_files.get(real, root) != root:   # a file inside a root also given
                continue
            seen_paths.add(rel)
            seen_files.setdefault(real, root)
            _load_file(f, rel, settings, reporter, result, known, now_ns)
    if not result.documents and not result.unchanged:
        where = ", ".join(str(r) for r in roots)
        detail = f" ({len(result.skipped)} skipped)" if result.skipped else ""
        raise UsageError(f"no usable documents in {where}{detail}: hrag reads {readers.FORMATS} "
                         f"('hrag index --json' lists what was skipped and why)")
    return result
