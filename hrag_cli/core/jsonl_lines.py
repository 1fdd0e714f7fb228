"""Random access to the lines of a JSONL file by line number (`JsonlLines`)."""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from hrag_cli.core.line_format import GZIP_MAGIC, MEMBER_BUFFER, line_ends, line_index, whole_lines_buffer
from hrag_cli.core.line_patch import LineWalker, patched_blocks_of, read_patch


class JsonlLines:
    """Random access to the whole lines of a plain or compressed JSONL file, for a reader that wants a few
    records of a large file by line number (a query: the facts its search found, the entities it seeds) and
    must not parse the rest. A plain file's newlines are found once, with numpy, reading it block by block
    (its pages stay in the page cache, not in this process), and a line
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
        if self._fh.read(2) == GZIP_MAGIC:
            self._members = line_index(self._fh)
            if self._members is None:
                self._fh.seek(0)
                self._data = whole_lines_buffer(self._fh)
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
                    ends.append(line_ends(block) + s)
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
            # CRC is): no regrowing of the buffer during the inflation
            size = min(max(int.from_bytes(raw[-4:], "little"), 1), MEMBER_BUFFER) if len(raw) >= 4 else 1
            try:
                data = zlib.decompress(raw, wbits=31, bufsize=size)
            except zlib.error:
                return None
            starts = [0, *line_ends(data).tolist()]
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
            self._data = whole_lines_buffer(self._fh)              # the file this index is of, not a newer one
            self._members, self._starts = None, None
        end = int(self._index()[-1])
        data = bytes(self._data[:end])
        if self.patch is not None:
            data = b"".join(patched_blocks_of(LineWalker(iter([data])), self.patch, "the file"))
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
