"""Loading documents: a recursive scan of folders or single files into (Document, text) pairs.

Paths are relative to the DOCS root they were found under, so the same corpus indexed from another working
directory gets the same doc ids. With several roots, each path is prefixed by its root's name so two roots
holding `a.txt` stay distinct. A `.jsonl` file yields one document per record, `file.jsonl#<id>`.
Bad input never stops the scan: binary, non-UTF-8 and unreadable files, and bad JSONL lines, are skipped with a
warning that names them; only a missing path or a corpus with nothing usable is an error.
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

from hrag_cli.chunk.chunking import stream_segments
from hrag_cli.core.config import DocumentSettings
from hrag_cli.core.errors import UsageError
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import text_hash
from hrag_cli.core.records import Document

TEXT_SUFFIXES = {".txt", ".md", ".markdown"}
RECORD_SUFFIXES = {".jsonl"}
SUPPORTED_SUFFIXES = TEXT_SUFFIXES | RECORD_SUFFIXES


# Text files bigger than this are never read whole: the scan hashes them a block at a time and the chunk
# stage reads them again a segment at a time (chunking.stream_segments), so memory stays a few segments.
BIG_FILE_BYTES = 1 << 24
BLOCK_BYTES = 1 << 22


@dataclass
class LoadedDocument:
    doc: Document
    text: str
    source: Path | None = None   # a big text file, read again segment by segment; `text` is then empty

    def segments(self) -> Iterator[str]:
        """The text in pieces that are each chunked on their own (one piece unless the file is big)."""
        if self.source is None:
            yield self.text
        else:
            yield from stream_segments(_text_blocks(self.source))


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


def _big_text_file(path: Path, rel: str) -> LoadedDocument | None:
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
                          "", path)


@dataclass
class ScanResult:
    documents: list[LoadedDocument] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)     # "path: reason", each also warned about
    ignored: int = 0                                     # files of unsupported types, silently passed over
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


def _walk(root: Path, skip: set[Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Files under root, sorted, skipping hidden files and folders (.git, .hrag, ...) and `skip` folders; and
    the folders that could not be read, with the reason (reported as skipped, never silently lost)."""
    found: list[Path] = []
    unreadable: list[tuple[Path, str]] = []

    def failed(exc: OSError) -> None:
        unreadable.append((Path(exc.filename or root), exc.strerror or str(exc)))

    for dirpath, dirnames, filenames in os.walk(root, followlinks=False, onerror=failed):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and _real(here / d) not in skip)
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


def _skip(result: ScanResult, reporter: Reporter, where: str, reason: str) -> None:
    result.skipped.append(f"{where}: {reason}")
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
    if result.warnings == warnings and max(st.st_mtime_ns, st.st_ctime_ns) < now_ns - RACY_NS:
        result.stamps[rel] = (now, [d.doc.doc_id for d in result.documents[first:]])


def _read_file(path: Path, rel: str, settings: DocumentSettings, reporter: Reporter,
               result: ScanResult, size: int) -> None:
    try:
        if path.suffix.lower() in TEXT_SUFFIXES and size > BIG_FILE_BYTES:
            try:
                big = _big_text_file(path, rel)
            except _NotText as exc:
                _skip(result, reporter, rel, str(exc))
                return
            if big is None:
                _skip(result, reporter, rel, "empty")
            else:
                result.documents.append(big)
            return
        data = path.read_bytes()
    except OSError as exc:
        _skip(result, reporter, rel, f"unreadable ({exc.strerror or exc})")
        return
    text = _decode(data)
    if text is None:
        _skip(result, reporter, rel, "binary file" if b"\x00" in data else "not UTF-8 text")
        return
    if path.suffix.lower() in RECORD_SUFFIXES:
        docs = _records(rel, text, settings, reporter, result)
        if not docs and text.strip():
            _warn(result, reporter, f"{rel}: no usable records")
        result.documents.extend(docs)
        return
    if not text.strip():
        _skip(result, reporter, rel, "empty")
        return
    result.documents.append(_make_doc(rel, text))


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
    for root in resolved:
        if root.is_file():
            files, base = [root], root.parent
            explicit = True
        else:
            (files, unreadable), base = _walk(root, skip), root
            explicit = False
            for folder, reason in unreadable:
                inner = folder.relative_to(base).as_posix() if folder.is_relative_to(base) else str(folder)
                _skip(result, reporter, f"{prefixes[root]}/{inner}" if prefix_roots else inner,
                      f"unreadable folder ({reason})")
        for f in files:
            inner = f.relative_to(base).as_posix()
            rel = f"{prefixes[root]}/{inner}" if prefix_roots else inner
            if f.suffix.lower() not in SUPPORTED_SUFFIXES:
                if explicit:
                    _skip(result, reporter, rel, f"unsupported file type '{f.suffix or '(none)'}' "
                          f"(takes {', '.join(sorted(SUPPORTED_SUFFIXES))})")
                else:
                    result.ignored += 1
                continue
            if not explicit and not selected(inner, settings):
                continue
            real = _real(f)
            if real is None:
                _skip(result, reporter, rel, "symlink loop or broken link")
                continue
            if rel in seen_paths or seen_files.get(real, root) != root:   # a file inside a root also given
                continue
            seen_paths.add(rel)
            seen_files.setdefault(real, root)
            _load_file(f, rel, settings, reporter, result, known, now_ns)
    if not result.documents and not result.unchanged:
        where = ", ".join(str(r) for r in roots)
        detail = f" ({len(result.skipped)} skipped)" if result.skipped else ""
        raise UsageError(f"no usable documents in {where}{detail}: hrag reads "
                         f"{', '.join(sorted(SUPPORTED_SUFFIXES))} files")
    return result
