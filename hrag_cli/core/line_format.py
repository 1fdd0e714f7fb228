"""How a JSONL file's lines sit on disk: plain, or in independent gzip members closed by a member whose comment
indexes them (where each member starts and its first line), and the whole lines read back from either form."""

from __future__ import annotations

import mmap
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

GZIP_MAGIC = b"\x1f\x8b"        # no JSON line starts with these bytes, so a reader can tell the two forms apart
WRITE_BLOCK = 1 << 20          # bytes gathered per write
MEMBER = 1 << 16               # bytes of whole lines per gzip member of a compressed file
MEMBER_BUFFER = 1 << 24        # the most output buffer a member's inflation starts with
_INDEX_TAG = b"hrag-lines-v1:"  # the comment of a compressed file's last (empty) member: its line index
# the last member is a gzip header with a comment, an empty deflate block, crc 0 and size 0; the comment ends
# with the member's own offset (16 hex digits), so a reader finds it from the file's last 28 bytes
_INDEX_END = b"\x00\x03\x00" + bytes(8)
_INDEX_HEADER = b"\x1f\x8b\x08\x10" + bytes(4) + b"\x00\xff"        # FCOMMENT, no time, unknown OS


def line_index_member(offsets: list[int], lines: list[int], at: int) -> bytes:
    """The member that ends a compressed file: (byte offset, lines before it) of every member, in hex."""
    table = b"".join(int(o).to_bytes(8, "big") + int(n).to_bytes(8, "big") for o, n in zip(offsets, lines))
    return _INDEX_HEADER + _INDEX_TAG + table.hex().encode() + b":" + b"%016x" % at + _INDEX_END


def gunzip(fh: BinaryIO) -> Iterator[bytes]:
    """The decompressed bytes of a gzip file, member after member, block by block; ends quietly at the first
    damaged byte (a cut or damaged file yields what came before it)."""
    unzip = zlib.decompressobj(wbits=31)          # 31: the gzip container
    pending = b""
    while True:
        block = pending or fh.read(WRITE_BLOCK)
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


def whole_lines(fh: BinaryIO) -> Iterator[bytes]:
    """The newline-ended lines of a plain or gzip-compressed file. A torn last line (the writer died before
    finishing it) is left out; so is whatever follows the break in a cut or damaged compressed file."""
    compressed = fh.read(2) == GZIP_MAGIC
    fh.seek(0)
    if not compressed:
        for line in fh:
            if not line.endswith(b"\n"):
                return
            yield line
        return
    # blocks split by hand: gzip.GzipFile's readline is Python code per line, several times slower
    tail = b""
    for block in gunzip(fh):
        *lines, tail = (tail + block).split(b"\n")
        yield from lines


def base_blocks(path: Path) -> Iterator[bytes]:
    """line_blocks of the file itself, a patch beside it ignored."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return
    with fh:
        compressed = fh.read(2) == GZIP_MAGIC
        fh.seek(0)
        tail = b""
        for block in gunzip(fh) if compressed else iter(lambda: fh.read(WRITE_BLOCK), b""):
            data = tail + block
            cut = data.rfind(b"\n") + 1
            tail = data[cut:]
            if cut:
                yield data[:cut]


def whole_lines_buffer(fh: BinaryIO) -> Any:
    """The bytes of a plain or compressed JSONL file as one buffer: a plain file memory-mapped (its pages are
    read only when touched), a compressed one decompressed up to the last newline before any damage."""
    if fh.read(2) != GZIP_MAGIC:
        size = os.fstat(fh.fileno()).st_size
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    fh.seek(0)
    data = b"".join(gunzip(fh))
    return data[:data.rfind(b"\n") + 1]


def line_ends(data: bytes) -> Any:
    """The offset just past each newline of `data` (the start of the line after it), found by numpy."""
    import numpy as np

    return np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10) + 1


def line_index(fh: BinaryIO) -> tuple[Any, Any] | None:
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
