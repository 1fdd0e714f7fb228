"""A record file kept as a base plus a patch beside it.

A record file (graph/entities.jsonl, relations.jsonl, facts.jsonl) is a BASE, written whole by
`store.write_jsonl`, plus an optional PATCH beside it (graph/entities.patch): the lines an addition replaced (by
base row) and inserted (by logical row), so a small addition writes its lines beside an untouched, hard-linked
base. The LOGICAL file is the base with the patch applied: exactly the lines a fresh build writes, in the same
order. Every reader (store's readers, `JsonlLines`) presents the logical file; this module reads a patch back,
checks it against its base and walks the logical file's lines in runs (`patched_blocks`).

Patch layout: magic, a JSON header line (padded to 8 bytes), int64 arrays rows[n] (logical row of each patch
line, ascending), base[n] (the base row it replaces, -1: inserted), starts[n+1] (line offsets in the data),
then the n lines. The header names its base: size and CRC-32 of its last 4 KiB, checked on open, and an id
that changes with the base's content (given by the writer: resolve's output digest of the run that left the
base without a patch), which resolve's output digest takes instead of reading the base.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from hrag_cli.core.errors import HragError
from hrag_cli.core.line_format import base_blocks, line_ends

_PATCH_MAGIC = b"hrag-patch-v1\n"
_TAIL = 4096
_HEADER_OPTS = orjson.OPT_SERIALIZE_NUMPY     # its numbers may be numpy's


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


class LinePatch:
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
        head = orjson.dumps({"n": len(self.rows), "base_lines": self.base_lines, "base_size": self.base_size,
                             "base_tail": self.base_tail, "base_id": self.base_id}, option=_HEADER_OPTS)
        pad = -(len(_PATCH_MAGIC) + len(head) + 1) % 8
        return b"".join([_PATCH_MAGIC, head, b" " * pad, b"\n", self.rows.astype("<i8").tobytes(),
                         self.base.astype("<i8").tobytes(), self.starts.astype("<i8").tobytes(), self.data])


def read_patch(path: Path) -> LinePatch | None:
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
        patch = LinePatch(arrays[:n], arrays[n:2 * n], None, int(head["base_lines"]), int(head["base_size"]),
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
            ends = line_ends(data)
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


def patched_blocks(path: Path, patch: LinePatch) -> Iterator[bytes]:
    """The logical file's lines in runs: base runs between the patch lines, each patch line in its place."""
    yield from patched_blocks_of(LineWalker(base_blocks(path)), patch, Path(path).name)


def patched_blocks_of(base: LineWalker, patch: LinePatch, name: str) -> Iterator[bytes]:
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
