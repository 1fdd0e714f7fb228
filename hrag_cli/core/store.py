"""The one JSONL reader/appender and the one atomic-write helper.

Growing files (cache/*.jsonl) are append-only: a crash can leave a torn last line, which readers skip and
appenders cut off before writing, so the file always reads cleanly. Every other artifact is replaced whole
through a temp file in the same folder and os.replace, so a reader never sees half of it.
"""

from __future__ import annotations

import errno
import io
import mmap
import os
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from hrag_cli.core.errors import HragError

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
        from hrag_cli.core.errors import HragError

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


_GZIP_MAGIC = b"\x1f\x8b"        # no JSON line starts with these bytes, so a reader can tell the two forms apart
_WRITE_BLOCK = 1 << 20          # bytes gathered per write
_MEMBER = 1 << 16               # bytes of whole lines per gzip member of a compressed file
_MEMBER_BUFFER = 1 << 24        # the most output buffer a member's inflation starts with
_INDEX_TAG = b"hrag-lines-v1:"  # the comment of a compressed file's last (empty) member: its line index
# the last member is a gzip header with a comment, an empty deflate block, crc 0 and size 0; the comment ends
# with the member's own offset (16 hex digits), so a reader finds it from the file's last 28 bytes
_INDEX_END = b"\x00\x03\x00" + bytes(8)
_INDEX_HEADER = b"\x1f\x8b\x08\x10" + bytes(4) + b"\x00\xff"        # FCOMMENT, no time, unknown OS


def _line_index_member(offsets: list[int], lines: list[int], at: int) -> bytes:
    """The member that ends a compressed file: (byte offset, lines before it) of every member, in hex."""
    table = b"".join(int(o).to_bytes(8, "big") + int(n).to_bytes(8, "big") for o, n in zip(offsets, lines))
    return _INDEX_HEADER + _INDEX_TAG + table.hex().encode() + b":" + b"%016x" % at + _INDEX_END


def write_jsonl(path: Path, records: Iterable[Any], compress: bool = False, base: bool = False) -> int:
    """Atomically replace `path` with one JSON object per line; returns the number of lines written. `compress`
    writes the lines gzip-compressed (level 1, `zcat` reads it): for artifacts that are replaced whole and
    mostly read whole, whose records repeat one another (a rules project's relations share their sentence): a
    quarter to a third of the bytes, for about as much CPU again as writing them plain (measured on 17.7k
    relations: 59 -> 112 ms to write, 152 -> 253 ms to read). The lines go in independent gzip members of
    ~64 KiB of lines each, and a last, empty member's comment lists where each starts and its first line
    number: `JsonlLines` then reads line i by decompressing one member instead of the whole file (a query
    wants a few dozen of a 100k project's 500k entities). `read_jsonl` reads both forms. `base`: a record file
    written whole, a base with no patch (the one beside it goes)."""
    with atomic_writer(path) as fh:
        n = _write_lines(fh, records, compress)
    if base:
        patch_path(path).unlink(missing_ok=True)
    return n


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
    limit = _MEMBER if compress else _WRITE_BLOCK
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
        fh.write(_line_index_member(offsets + [at], firsts + [n], at))
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
        compressed = src.read(2) == _GZIP_MAGIC
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
    """A compressed file's line index (`_line_index`) as lists of ints: each member's offset and first line."""
    index = _line_index(fh)
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
        block = src.read(min(_WRITE_BLOCK, count - done))
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
        if fh.read(2) == _GZIP_MAGIC:
            index = _int_index(fh)
            if index is None:
                return None
            offsets, firsts = index
            start = firsts[-1] - count
            if start < 0:
                return None
            m = max(i for i in range(len(firsts) - 1) if firsts[i] <= start)
            fh.seek(offsets[m])
            data = b"".join(_gunzip(io.BytesIO(fh.read(offsets[-1] - offsets[m]))))   # a damaged member: cut short
            lines = data.split(b"\n")
            if lines[-1] != b"" or len(lines) - 1 != firsts[-1] - firsts[m]:
                return None
            return [line + b"\n" for line in lines[start - firsts[m]:-1]]
        size = os.fstat(fh.fileno()).st_size
        data, pos = b"", size
        while pos > 0 and data.count(b"\n") <= count:
            step = min(pos, _WRITE_BLOCK)
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
        yield from _whole_lines(fh)


def read_jsonl_at(path: Path, offsets: Iterable[int]) -> Iterator[Any]:
    """The records of a plain file at these byte offsets (each the start of a line), in the order given."""
    with open(path, "rb") as fh:
        for at in offsets:
            fh.seek(at)
            yield orjson.loads(fh.readline())


def _gunzip(fh: BinaryIO) -> Iterator[bytes]:
    """The decompressed bytes of a gzip file, member after member, block by block; ends quietly at the first
    damaged byte (a cut or damaged file yields what came before it)."""
    unzip = zlib.decompressobj(wbits=31)          # 31: the gzip container
    pending = b""
    while True:
        block = pending or fh.read(_WRITE_BLOCK)
        pending = b""
        if not block:
            return
        try:
            yield unzip.decompress(block)
        except zlib.error:
            return
        if unzip.eof:                              # the next member, if any, starts in what was left over
            pending = unzip.unused_data
            unzip = zlib.decompressobj(wbits=31)


def _whole_lines(fh: BinaryIO) -> Iterator[bytes]:
    """The newline-ended lines of a plain or gzip-compressed file. A torn last line (the writer died before
    finishing it) is left out; so is whatever follows the break in a cut or damaged compressed file."""
    compressed = fh.read(2) == _GZIP_MAGIC
    fh.seek(0)
    if not compressed:
        for line in fh:
            if not line.endswith(b"\n"):
                return
            yield line
        return
    # blocks split by hand: gzip.GzipFile's readline is Python code per line, several times slower
    tail = b""
    for block in _gunzip(fh):
        *lines, tail = (tail + block).split(b"\n")
        yield from lines


def line_blocks(path: Path) -> Iterator[bytes]:
    """The whole lines of a plain or compressed JSONL file in blocks of about a MiB, each ending with a newline
    (a torn last line, or whatever follows the break in a damaged compressed file, left out): for a caller that
    copies long runs of lines as they are and must not pay Python's per-line cost. Nothing when missing. A
    file with a patch: the blocks of its logical lines (some shorter: a patch line is a block of its own)."""
    patch = read_patch(path)
    if patch is not None:
        yield from patched_blocks(path, patch)
        return
    yield from _base_blocks(path)


def _base_blocks(path: Path) -> Iterator[bytes]:
    """line_blocks of the file itself, a patch beside it ignored."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return
    with fh:
        compressed = fh.read(2) == _GZIP_MAGIC
        fh.seek(0)
        tail = b""
        for block in _gunzip(fh) if compressed else iter(lambda: fh.read(_WRITE_BLOCK), b""):
            data = tail + block
            cut = data.rfind(b"\n") + 1
            tail = data[cut:]
            if cut:
                yield data[:cut]


def _whole_lines_buffer(fh: BinaryIO) -> Any:
    """The bytes of a plain or compressed JSONL file as one buffer: a plain file memory-mapped (its pages are
    read only when touched), a compressed one decompressed up to the last newline before any damage."""
    if fh.read(2) != _GZIP_MAGIC:
        size = os.fstat(fh.fileno()).st_size
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    fh.seek(0)
    data = b"".join(_gunzip(fh))
    return data[:data.rfind(b"\n") + 1]


def _line_ends(data: bytes) -> Any:
    """The offset just past each newline of `data` (the start of the line after it), found by numpy."""
    import numpy as np

    return np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10) + 1


def _line_index(fh: BinaryIO) -> tuple[Any, Any] | None:
    """(member offsets, first line of each member) of a compressed file's line index, each ending with the
    index member's offset and the line count; None when the file has none or it does not fit the file."""
    import numpy as np

    size = os.fstat(fh.fileno()).st_size
    if size < 64:
        return None
    tail = 1 + 16 + len(_INDEX_END)            # ":", the member's offset in hex, the member's end
    fh.seek(size - tail)
    end = fh.read(tail)
    if not end.endswith(_INDEX_END) or end[:1] != b":":
        return None
    try:
        at = int(end[1:17], 16)
        fh.seek(at)
        raw = fh.read(size - at)
        head = len(_INDEX_HEADER) + len(_INDEX_TAG)
        if raw[:head] != _INDEX_HEADER + _INDEX_TAG:
            return None
        table = np.frombuffer(bytes.fromhex(raw[head:-tail].decode("ascii")), dtype=">i8").astype(np.int64)
    except ValueError:
        return None
    offsets, firsts = table[0::2], table[1::2]
    if (len(offsets) < 2 or offsets[0] != 0 or offsets[-1] != at or np.any(np.diff(offsets) <= 0)
            or firsts[0] != 0 or np.any(np.diff(firsts) < 0)):
        return None
    return offsets, firsts


# ------------------------------------------------------------------------------------------ base + patch
# A record file (graph/entities.jsonl, relations.jsonl, facts.jsonl) is a BASE, written whole by write_jsonl,
# plus an optional PATCH beside it (graph/entities.patch): the lines an addition replaced (by base row) and
# inserted (by logical row), so a +1 % writes a few MB beside an untouched, hard-linked base of hundreds. The
# LOGICAL file is the base with the patch applied: exactly the lines a fresh build writes, in the same order.
# Every reader here (JsonlLines, read_jsonl, iter_lines, line_blocks) presents the logical file.
# Patch layout: magic, a JSON header line (padded to 8 bytes), int64 arrays rows[n] (logical row of each patch
# line, ascending), base[n] (the base row it replaces, -1: inserted), starts[n+1] (line offsets in the data),
# then the n lines. The header names its base: size and CRC-32 of its last 4 KiB, checked on open, and an id
# that changes with the base's content (given by the writer: resolve's output digest of the run that left the
# base without a patch), which resolve's output digest takes instead of reading the base.
_PATCH_MAGIC = b"hrag-patch-v1\n"
_TAIL = 4096


class PatchError(HragError, ValueError):
    """A patch that does not fit its base or is damaged: the logical file cannot be read (a HragError, so a
    reader that meets one prints it on one line with its fix: the stage that rebuilds it)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{message}; run 'hrag index' (or 'hrag resolve') to rebuild the record files")


def patch_path(path: Path) -> Path:
    """The patch segment beside record file `path` (graph/entities.jsonl -> graph/entities.patch)."""
    return Path(path).with_suffix(".patch")


def base_mark(path: Path) -> tuple[int, int]:
    """(size, CRC-32 of the last 4 KiB) of a base file: what a patch checks it is applied to."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        fh.seek(max(0, size - _TAIL))
        return size, zlib.crc32(fh.read())


class Patch:
    """A record file's patch, loaded (it is small: the fold keeps it under a share of the base)."""

    def __init__(self, rows: Any, base: Any, lines: list[bytes] | None, base_lines: int, base_size: int,
                 base_tail: int, base_id: str, data: bytes = b"", starts: Any = None) -> None:
        import numpy as np

        self.rows = np.asarray(rows, dtype=np.int64)
        self.base = np.asarray(base, dtype=np.int64)
        if lines is not None:
            data = b"".join(lines)
            starts = np.concatenate([np.zeros(1, np.int64), np.cumsum([len(x) for x in lines], dtype=np.int64)])
        self.data, self.starts = data, np.asarray(starts, dtype=np.int64)
        self.base_lines, self.base_size, self.base_tail, self.base_id = base_lines, base_size, base_tail, base_id
        inserted = self.base < 0
        self.ins_before = np.concatenate([np.zeros(1, np.int64), np.cumsum(inserted, dtype=np.int64)])
        self.lines = base_lines + int(self.ins_before[-1])      # of the logical file
        self.at = self.rows - self.ins_before[:-1]              # base lines before each patch line

    def __len__(self) -> int:
        return len(self.rows)

    def line(self, j: int) -> bytes:
        return self.data[int(self.starts[j]):int(self.starts[j + 1])]

    def check(self) -> None:
        """Raise PatchError unless the arrays describe a patch of a base of `base_lines` lines."""
        import numpy as np

        n, rows, at, replaced = len(self.rows), self.rows, self.at, self.base >= 0
        ok = (len(self.base) == n and len(self.starts) == n + 1 and (n == 0 or (
            rows[0] >= 0 and rows[-1] < self.lines and bool(np.all(np.diff(rows) > 0))
            and bool(np.all(self.base[replaced] == at[replaced])) and bool(np.all(at[replaced] < self.base_lines))
            and bool(np.all(np.diff(at) >= replaced[:-1]))))
            and int(self.starts[0]) == 0 and int(self.starts[-1]) == len(self.data)
            and bool(np.all(np.diff(self.starts) > 0)))
        if ok and n:
            ends = np.frombuffer(self.data, dtype=np.uint8)[self.starts[1:] - 1]
            ok = bool(np.all(ends == 10))
        if not ok:
            raise PatchError("its rows or lines do not fit together")

    def to_bytes(self) -> bytes:
        head = dumps({"n": len(self.rows), "base_lines": self.base_lines, "base_size": self.base_size,
                      "base_tail": self.base_tail, "base_id": self.base_id})
        pad = -(len(_PATCH_MAGIC) + len(head) + 1) % 8
        return b"".join([_PATCH_MAGIC, head, b" " * pad, b"\n", self.rows.astype("<i8").tobytes(),
                         self.base.astype("<i8").tobytes(), self.starts.astype("<i8").tobytes(), self.data])


def write_patch(path: Path, patch: Patch) -> None:
    """Atomically write the patch of record file `path` (checked first: a wrong patch is never written)."""
    patch.check()
    atomic_write_bytes(patch_path(path), patch.to_bytes())


def read_patch(path: Path) -> Patch | None:
    """The patch of record file `path`, None when it has none; PatchError when it is damaged or belongs to
    another base (the file cannot be read as it stands)."""
    import numpy as np

    try:
        raw = patch_path(path).read_bytes()
    except FileNotFoundError:
        return None
    try:
        if not raw.startswith(_PATCH_MAGIC):
            raise ValueError
        end = raw.index(b"\n", len(_PATCH_MAGIC)) + 1
        head = orjson.loads(raw[len(_PATCH_MAGIC):end])
        n = int(head["n"])
        arrays = np.frombuffer(raw, dtype="<i8", count=3 * n + 1, offset=end).astype(np.int64)
        patch = Patch(arrays[:n], arrays[n:2 * n], None, int(head["base_lines"]), int(head["base_size"]),
                      int(head["base_tail"]), str(head["base_id"]), raw[end + 8 * (3 * n + 1):], arrays[2 * n:])
    except (ValueError, KeyError, TypeError, orjson.JSONDecodeError):
        raise PatchError(f"{patch_path(path)} is damaged") from None
    try:
        mark = base_mark(path)
    except FileNotFoundError:
        raise PatchError(f"{patch_path(path)} has no base {Path(path).name}") from None
    if mark != (patch.base_size, patch.base_tail):
        raise PatchError(f"{patch_path(path)} belongs to another {Path(path).name}")
    try:
        patch.check()
    except PatchError:
        raise PatchError(f"{patch_path(path)} is damaged") from None
    return patch


class LineWalker:
    """A file's lines walked in order as byte runs (their newlines found with numpy a block at a time), so
    copying long runs of lines costs no Python per line."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        import numpy as np

        self._np = np
        self._blocks = blocks
        self._data = b""
        self._starts = np.zeros(1, dtype=np.int64)   # line starts in _data, and its end
        self._at = 0                                 # the next line, as an index into _starts

    def _fill(self) -> bool:
        """False when no line is left."""
        np = self._np
        while self._at >= len(self._starts) - 1:
            data = next(self._blocks, None)
            if data is None:
                return False
            ends = _line_ends(data)
            self._data, self._starts, self._at = data, np.concatenate([np.zeros(1, np.int64), ends]), 0
        return True

    def runs(self, n: int) -> Iterator[bytes]:
        """The next `n` lines as they are (newlines included), in runs of whole lines of at most a block;
        EOFError when fewer are left."""
        while n:
            if not self._fill():
                raise EOFError("the file ends early")
            k = min(n, len(self._starts) - 1 - self._at)
            yield self._data[self._starts[self._at]:self._starts[self._at + k]]
            self._at += k
            n -= k

    def take(self, n: int) -> bytes:
        return b"".join(self.runs(n))

    def done(self) -> bool:
        return not self._fill()


def patched_blocks(path: Path, patch: Patch) -> Iterator[bytes]:
    """The logical file's lines in runs: base runs between the patch lines, each patch line in its place."""
    yield from _patched_blocks_of(LineWalker(_base_blocks(path)), patch, Path(path).name)


def _patched_blocks_of(base: LineWalker, patch: Patch, name: str) -> Iterator[bytes]:
    done = 0            # base lines passed
    try:
        for j, at in enumerate(patch.at.tolist()):
            yield from base.runs(at - done)
            yield patch.line(j)
            done = at + (int(patch.base[j]) >= 0)
            if done > at:
                base.take(1)
        yield from base.runs(patch.base_lines - done)
        if not base.done():
            raise EOFError
    except EOFError:
        raise PatchError(f"{name} has not the lines its patch says") from None


class JsonlLines:
    """Random access to the whole lines of a plain or compressed JSONL file, for a reader that wants a few
    records of a large file by line number (a query: the facts its search found, the entities it seeds) and
    must not parse the rest. A plain file's newlines are found once, with numpy, reading it block by block
    (its pages stay in the page cache, not in this process: 377 MB of facts at 100,000 passages), and a line
    is read at its offset; a compressed one with a line index (`write_jsonl`) decompresses only the members
    holding the lines asked for (a few recent ones are kept), one without an index is decompressed whole. A
    torn last line is not a line. A file with a patch reads as its logical file: line i is a patch line (one
    searchsorted in the patch's rows) or a base line; PatchError when the patch does not fit."""

    _KEEP = 64                  # decompressed members kept

    def __init__(self, path: Path) -> None:
        self.patch = read_patch(path)
        self._members: tuple[Any, Any] | None = None
        self._cache: dict[int, tuple[bytes, list[int]]] = {}
        self._data: Any = None
        self._fh: BinaryIO | None = open(path, "rb")          # FileNotFoundError passes through
        if self._fh.read(2) == _GZIP_MAGIC:
            self._members = _line_index(self._fh)
            if self._members is None:
                self._fh.seek(0)
                self._data = _whole_lines_buffer(self._fh)
                self._fh.close()
                self._fh = None
        self._starts: Any = None
        self._counted: int | None = None     # a plain base's line count, when counted without the index

    def _index(self) -> Any:
        if self._starts is None:
            import numpy as np

            step = 1 << 24      # bytes per newline search: no mask the size of the whole file
            if self._data is not None:
                data = np.frombuffer(self._data, dtype=np.uint8) if len(self._data) else np.zeros(0, np.uint8)
                ends = [np.flatnonzero(data[s:s + step] == 10) + s + 1 for s in range(0, len(data), step)]
            else:
                fd = self._fh.fileno()                                # type: ignore[union-attr]
                size, ends = os.fstat(fd).st_size, []
                for s in range(0, size, step):
                    block = os.pread(fd, min(step, size - s), s)
                    ends.append(_line_ends(block) + s)
            self._starts = np.concatenate([np.zeros(1, np.int64), *ends])
        return self._starts

    def __len__(self) -> int:
        if self.patch is not None:
            return self.patch.lines
        return self._base_len()

    @property
    def compressed(self) -> bool:
        """Whether a line is read by decompressing one member (a compressed file with its line index)."""
        return self._members is not None

    def _base_len(self) -> int:
        if self._members is not None:
            return int(self._members[1][-1])
        if self._starts is None and self._data is None:
            # a plain file's lines counted without the index of their starts (bytes.count: a tenth of the CPU;
            # a caller that wants the count alone, such as resolve's patch, never pays for the index)
            if self._counted is None:
                fd, size, n = self._fh.fileno(), os.fstat(self._fh.fileno()).st_size, 0  # type: ignore[union-attr]
                for s in range(0, size, 1 << 24):
                    n += os.pread(fd, min(1 << 24, size - s), s).count(b"\n")
                self._counted = n
            return self._counted
        return len(self._index()) - 1

    def _member(self, m: int) -> tuple[bytes, list[int]] | None:
        """Member m's bytes and its lines' starts (None when it is damaged)."""
        got = self._cache.get(m)
        if got is None:
            offsets, firsts = self._members                         # type: ignore[misc]
            self._fh.seek(int(offsets[m]))                          # type: ignore[union-attr]
            raw = self._fh.read(int(offsets[m + 1] - offsets[m]))   # type: ignore[union-attr]
            # the output sized by the trailer's length field (capped: the field is not checked before the
            # CRC is): no regrowing of the buffer, 7 % of the inflation
            size = min(max(int.from_bytes(raw[-4:], "little"), 1), _MEMBER_BUFFER) if len(raw) >= 4 else 1
            try:
                data = zlib.decompress(raw, wbits=31, bufsize=size)
            except zlib.error:
                return None
            starts = [0, *_line_ends(data).tolist()]
            if len(starts) - 1 != int(firsts[m + 1] - firsts[m]):
                return None
            if len(self._cache) >= self._KEEP:
                self._cache.pop(next(iter(self._cache)))
            got = self._cache[m] = (data, starts)
        return got

    def all(self) -> list[Any]:
        """Every line parsed, in order (a blank or unparsable line as None): one pass, for a reader that
        turns out to need them all."""
        if self._data is None:
            self._fh.seek(0)                                        # type: ignore[union-attr]
            self._data = _whole_lines_buffer(self._fh)              # the file this index is of, not a newer one
            self._members, self._starts = None, None
        end = int(self._index()[-1])
        data = bytes(self._data[:end])
        if self.patch is not None:
            data = b"".join(_patched_blocks_of(LineWalker(iter([data])), self.patch, "the file"))
        return [orjson.loads(line) if line.strip() else None for line in data.split(b"\n")[:-1]] if data else []

    def patch_lines(self) -> tuple[Any, list[bytes]] | None:
        """The lines the patch adds or replaces: (their logical line numbers, int64 ascending; their bytes, as
        `raw` gives them), None without a patch. A reader that wants only what changed since the base (the
        synonyms stage's fact and entity indices) reads these instead of the file."""
        if self.patch is None:
            return None
        return self.patch.rows.copy(), [self.patch.line(j) for j in range(len(self.patch))]

    def raw(self, i: int) -> bytes | None:
        """Line i as bytes, or None past the end (or in a damaged member)."""
        patch = self.patch
        if patch is not None:
            import numpy as np

            if not 0 <= i < patch.lines:
                return None
            j = int(np.searchsorted(patch.rows, i))
            if j < len(patch.rows) and int(patch.rows[j]) == i:
                return patch.line(j)
            i -= int(patch.ins_before[j])
        return self._base_raw(i)

    def _base_raw(self, i: int) -> bytes | None:
        if self._members is not None:
            import numpy as np

            if not 0 <= i < self._base_len():
                return None
            m = int(np.searchsorted(self._members[1], i, side="right")) - 1
            got = self._member(m)
            if got is None:
                return None
            data, starts = got
            j = i - int(self._members[1][m])
            return data[starts[j]:starts[j + 1]]
        starts = self._index()
        if not 0 <= i < len(starts) - 1:
            return None
        if self._data is None:
            return os.pread(self._fh.fileno(), int(starts[i + 1] - starts[i]), int(starts[i]))  # type: ignore[union-attr]
        return bytes(self._data[int(starts[i]):int(starts[i + 1])])

    def record(self, i: int) -> Any:
        """Line i parsed (None past the end, for a blank line or one that is not JSON)."""
        line = self.raw(i)
        try:
            return orjson.loads(line) if line and line.strip() else None
        except orjson.JSONDecodeError:
            return None


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

    def append(self, record: Any) -> None:
        try:
            self._fh.write(self._lead + orjson.dumps(record, option=_DUMP_OPTS) + b"\n")
            self._lead = b""
            self._fh.flush()
            if self._fsync:
                os.fsync(self._fh.fileno())
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
