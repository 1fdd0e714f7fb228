"""The one JSONL reader/appender and the one atomic-write helper.

Growing files (cache/*.jsonl) are append-only: a crash can leave a torn last line, which readers skip and
appenders cut off before writing, so the file always reads cleanly. Every other artifact is replaced whole
through a temp file in the same folder and os.replace, so a reader never sees half of it.
"""

from __future__ import annotations

import errno
import io
import os
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from hrag_cli.core.errors import HragError
from hrag_cli.core.line_format import (
    GZIP_MAGIC, MEMBER, WRITE_BLOCK, base_blocks, gunzip, line_index, line_index_member, whole_lines)
from hrag_cli.core.line_patch import LinePatch, patch_path, patched_blocks, read_patch

_DUMP_OPTS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=_DUMP_OPTS)


def loads(data: bytes | str) -> Any:
    return orjson.loads(data)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temp path beside `path` to write (for writers such as hnswlib that want a file name); on
    success fsync it, give it the mode a plain open() would, and rename it over `path`; on failure remove it,
    leaving the old file as it was. The one way every replaced artifact is written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())   # mkstemp makes files private; artifacts are ordinary files
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        _raise_named(exc, path)
        raise


_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EIO}


def _raise_named(exc: BaseException, path: Path) -> None:
    """A full disk (or quota, or read-only file system) while writing becomes one line naming the file; the
    previous version of the file is untouched."""
    if isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS:
        raise HragError(f"cannot write {path}: {exc.strerror or exc}; the previous version is kept, free some "
                        "space and run the command again") from None


@contextmanager
def atomic_writer(path: Path) -> Iterator[BinaryIO]:
    """A binary file handle whose contents replace `path` whole when the block ends without error."""
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        yield fh


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_writer(path) as fh:
        fh.write(data)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, orjson.dumps(obj, option=_DUMP_OPTS | orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))


def read_input_text(path: Path, what: str) -> str:
    """A file the user named on the command line (queries, QA, a review TSV): any reason it cannot be read
    is a one-line usage error that says which flag or argument it came from."""
    from hrag_cli.core.errors import UsageError

    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{what}: {path} does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"{what}: {path} is a directory, expected a file") from None
    except UnicodeDecodeError:
        raise UsageError(f"{what}: {path} is not UTF-8 text") from None
    except OSError as exc:
        raise UsageError(f"{what}: cannot read {path} ({exc.strerror or exc})") from None


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return orjson.loads(Path(path).read_bytes())
    except FileNotFoundError:
        return default


def write_jsonl(path: Path, records: Iterable[Any], compress: bool = False, base: bool = False) -> int:
    """Atomically replace `path` with one JSON object per line; returns the number of lines written. `compress`
    writes the lines gzip-compressed (level 1, `zcat` reads it): for artifacts that are replaced whole and mostly
    read whole, whose records repeat one another (a rules project's relations share their sentence): a quarter to a
    third of the bytes, for about as much CPU again as writing them plain. The lines go in independent gzip members
    of ~64 KiB of lines each, and a last, empty member's comment lists where each starts and its first line number:
    `JsonlLines` then reads line i by decompressing one member instead of the whole file (a query wants a few dozen
    of a large project's entities). `read_jsonl` reads both forms. `base`: a record file written whole, a base with
    no patch (the one beside it goes)."""
    with atomic_writer(path) as fh:
        n = _write_lines(fh, records, compress)
    if base:
        patch_path(path).unlink(missing_ok=True)
    return n


def write_lines(fh: BinaryIO, records: Iterable[Any]) -> int:
    """write_jsonl's plain lines into an open file (one written in parts: a caller's atomic_writer); returns the
    number of lines."""
    return _write_lines(fh, records, False)


def _write_lines(fh: BinaryIO, records: Iterable[Any], compress: bool, at: int = 0, n: int = 0,
                 offsets: list[int] | None = None, firsts: list[int] | None = None, head: bytes = b"") -> int:
    """write_jsonl's lines into `fh`; a compressed file goes on from a state `extend_jsonl` read back: its
    members so far (`offsets`, `firsts`, ending at byte `at` and line `n`) and the lines of the member it took
    off again (`head`), so the members come out as writing every line at once gives them."""
    offsets = [] if offsets is None else offsets
    firsts = [] if firsts is None else firsts
    buf = bytearray(head)
    pos = 0     # buf[:pos] is written; cut off once per record, not per member (a run of lines handed over
                # as one Fragment had its whole tail moved for every member it filled)

    def flush(cut: int) -> None:
        nonlocal at, n, pos
        part = bytes(buf[pos:cut])
        pos = cut
        if compress:
            # zlib's gzip container (wbits 31) has no file name or time in its header: same records, same
            # bytes
            packer = zlib.compressobj(1, wbits=31)
            out = packer.compress(part) + packer.flush()
            offsets.append(at)
            firsts.append(n)
            at += len(out)
            fh.write(out)
        else:
            fh.write(part)
        n += part.count(b"\n")

    # a member ends after the first line that takes it to `limit` bytes, found in the bytes rather than
    # counted per record: a caller may hand over many lines as one orjson.Fragment (resolve_patch copies
    # untouched runs so) and must get the members, line index and bytes that one record per line gives
    limit = MEMBER if compress else WRITE_BLOCK
    for rec in records:
        if pos:
            del buf[:pos]
            pos = 0
        buf += orjson.dumps(rec, option=_DUMP_OPTS)
        buf += b"\n"
        while len(buf) - pos >= limit:
            flush(buf.index(b"\n", pos + limit - 1) + 1)
    if len(buf) > pos or (compress and not offsets):
        flush(len(buf))
    if compress:
        fh.write(line_index_member(offsets + [at], firsts + [n], at))
    return n


def extend_jsonl(path: Path, records: Iterable[Any]) -> int | None:
    """Atomically replace `path` with its own lines followed by `records`, without reading what it holds: the
    bytes are copied by the kernel, except a compressed file's last member, which is decompressed and written
    again with the new lines, so the file comes out byte for byte as write_jsonl writes all its lines at once.
    Returns how many records were added; None when the file is missing, ends in a torn line, is a compressed
    file without a sound line index, or has a patch: the caller writes it whole instead."""
    src = _unpatched(path)
    if src is None:
        return None
    with src:
        size = os.fstat(src.fileno()).st_size
        compressed = src.read(2) == GZIP_MAGIC
        head, state = b"", {}
        if compressed:
            index = _int_index(src)
            if index is None:
                return None
            offsets, firsts = index     # each ends with the index member
            src.seek(offsets[-2])
            try:
                head = zlib.decompress(src.read(offsets[-1] - offsets[-2]), wbits=31)
            except zlib.error:
                return None
            if head.count(b"\n") != firsts[-1] - firsts[-2] or not head.endswith(b"\n") and head:
                return None
            keep = offsets[-2]
            state = {"at": keep, "n": firsts[-2], "offsets": offsets[:-2], "firsts": firsts[:-2], "head": head}
        else:
            src.seek(max(0, size - 1))
            if size and src.read(1) != b"\n":
                return None
            keep = size
        added = 0

        def counted() -> Iterator[Any]:
            nonlocal added
            for rec in records:
                added += 1
                yield rec

        with atomic_writer(path) as fh:
            _copy_bytes(src, fh, keep)
            _write_lines(fh, counted(), compressed, **state)
    return added


def _unpatched(path: Path) -> BinaryIO | None:
    """The file itself, open, for a caller that works on its bytes: None when it is missing or has a patch (its
    bytes are then not the logical file)."""
    if patch_path(path).exists():
        return None
    try:
        return open(path, "rb")
    except FileNotFoundError:
        return None


def _int_index(fh: BinaryIO) -> tuple[list[int], list[int]] | None:
    """A compressed file's line index (`line_index`) as lists of ints: each member's offset and first line."""
    index = line_index(fh)
    return None if index is None else ([int(x) for x in index[0]], [int(x) for x in index[1]])


def _copy_bytes(src: BinaryIO, dst: BinaryIO, count: int) -> None:
    """The first `count` bytes of `src` to the end of `dst`, in the kernel where it can (no user-space copy)."""
    dst.flush()
    done = 0
    try:
        while done < count:
            got = os.copy_file_range(src.fileno(), dst.fileno(), count - done, done)
            if not got:
                break
            done += got
    except OSError:     # a file system or kernel without it: copied below
        pass
    dst.seek(0, os.SEEK_END)
    src.seek(done)
    while done < count:
        block = src.read(min(WRITE_BLOCK, count - done))
        if not block:
            raise OSError(errno.EIO, f"{src.name} ended while it was copied")
        dst.write(block)
        done += len(block)


def last_lines(path: Path, count: int) -> list[bytes] | None:
    """The last `count` whole lines of a plain or compressed JSONL file, reading only its end (a compressed
    file: the members holding them, found through its line index); None when it is missing, has fewer lines,
    ends torn, is compressed without a sound line index, or has a patch."""
    fh = _unpatched(path)
    if fh is None:
        return None
    with fh:
        if count <= 0:
            return []
        if fh.read(2) == GZIP_MAGIC:
            index = _int_index(fh)
            if index is None:
                return None
            offsets, firsts = index
            start = firsts[-1] - count
            if start < 0:
                return None
            m = max(i for i in range(len(firsts) - 1) if firsts[i] <= start)
            fh.seek(offsets[m])
            data = b"".join(gunzip(io.BytesIO(fh.read(offsets[-1] - offsets[m]))))   # a damaged member: cut short
            lines = data.split(b"\n")
            if lines[-1] != b"" or len(lines) - 1 != firsts[-1] - firsts[m]:
                return None
            return [line + b"\n" for line in lines[start - firsts[m]:-1]]
        size = os.fstat(fh.fileno()).st_size
        data, pos = b"", size
        while pos > 0 and data.count(b"\n") <= count:
            step = min(pos, WRITE_BLOCK)
            pos -= step
            fh.seek(pos)
            data = fh.read(step) + data
        if not data.endswith(b"\n"):
            return None
        lines = data.split(b"\n")[:-1]
        if len(lines) < count + (pos > 0):
            return None
        return [line + b"\n" for line in lines[len(lines) - count:]]


def read_jsonl(path: Path) -> Iterator[Any]:
    """Yield each record; a torn or unparsable last line (crash mid-append) is skipped, a bad line elsewhere
    is skipped too, since one corrupt cache line must not make a whole cache unreadable. A compressed file
    (`write_jsonl(compress=True)`) is read the same way; a cut or damaged one ends at its last whole line."""
    for line in iter_lines(path):
        line = line.strip()
        if not line:
            continue
        try:
            yield orjson.loads(line)
        except orjson.JSONDecodeError:
            continue


def iter_lines(path: Path) -> Iterator[bytes]:
    """The whole lines of a plain or compressed JSONL file as bytes, unparsed (for a caller that copies most
    of them as they are); nothing when the file is missing."""
    patch = read_patch(path)
    if patch is not None:
        for block in patched_blocks(path, patch):
            lines = block.split(b"\n")
            lines.pop()
            yield from lines
        return
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return
    with fh:
        yield from whole_lines(fh)


def read_jsonl_at(path: Path, offsets: Iterable[int]) -> Iterator[Any]:
    """The records of a plain file at these byte offsets (each the start of a line), in the order given."""
    with open(path, "rb") as fh:
        for at in offsets:
            fh.seek(at)
            yield orjson.loads(fh.readline())


def line_blocks(path: Path) -> Iterator[bytes]:
    """The whole lines of a plain or compressed JSONL file in blocks of about a MiB, each ending with a newline
    (a torn last line, or whatever follows the break in a damaged compressed file, left out): for a caller that
    copies long runs of lines as they are and must not pay Python's per-line cost. Nothing when missing. A
    file with a patch: the blocks of its logical lines (some shorter: a patch line is a block of its own)."""
    patch = read_patch(path)
    if patch is not None:
        yield from patched_blocks(path, patch)
        return
    yield from base_blocks(path)


def write_patch(path: Path, patch: LinePatch) -> None:
    """Atomically write the patch of record file `path` (checked first: a wrong patch is never written)."""
    patch.check()
    atomic_write_bytes(patch_path(path), patch.to_bytes())


def repair_tail(path: Path) -> int:
    """Cut a torn last line off an append-only file; returns the bytes removed."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb+") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return 0
        # walk back to the previous newline
        pos = size
        chunk = 65536
        keep = 0
        while pos > 0:
            start = max(0, pos - chunk)
            fh.seek(start)
            buf = fh.read(pos - start)
            idx = buf.rfind(b"\n")
            if idx >= 0:
                keep = start + idx + 1
                break
            pos = start
        fh.truncate(keep)
        return size - keep


def _ends_torn(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell() == 0:
                return False
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) != b"\n"
    except FileNotFoundError:
        return False


class JsonlAppender:
    """Append-only writer that writes whole lines and flushes each one, so a kill -9 loses at most the line
    being written.

    `exclusive=True` (the caller holds the project's writer lock) cuts a torn tail off on open. A writer
    without the lock (a query caching an LLM answer) must not truncate, since the tail may be a line another
    process is writing right now; it starts its first record on a fresh line instead, leaving any torn
    fragment as a bad line that readers skip."""

    def __init__(self, path: Path, fsync: bool = False, exclusive: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lead = b""
        if exclusive:
            repair_tail(self.path)
        elif _ends_torn(self.path):
            self._lead = b"\n"
        self._fh = open(self.path, "ab")
        self._fsync = fsync

    def append(self, record: Any) -> int:
        """Write one record; returns the byte offset its line starts at (where `read_jsonl_at` finds it: the
        file position after the write, an appending one, less the line), so a caller need not hold it."""
        line = orjson.dumps(record, option=_DUMP_OPTS) + b"\n"
        try:
            self._fh.write(self._lead + line)
            self._lead = b""
            self._fh.flush()
            if self._fsync:
                os.fsync(self._fh.fileno())
            return self._fh.tell() - len(line)
        except OSError as exc:   # a torn tail is cut by the next writer; the message names the file
            _raise_named(exc, self.path)
            raise

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            self._fh.close()

    def __enter__(self) -> "JsonlAppender":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
