"""Resolve's merge state on disk (graph/resolve_state.bin), so a run after new documents merges only their
records into what the last run accumulated instead of re-reading every record, and reads only the saved
accumulators those records touch.

What is kept: every entity, relation and fact accumulator, the counters (items per section, mentions, UNKNOWN
entities), and which record each chunk's contribution came from (its byte offset in the append-only
cache/extractions.jsonl, plus a sampled hash of the cache up to the size it had, so a cache that was deleted or
rewritten is noticed). The mentions themselves are not kept: a run after additions gives the graph only the new
chunks' mentions. The state is only used when adding is all that happened: a chunk whose record changed or went
away, a record that needs an alias plan, a strength that is not a multiple of 1/1024 added to a relation seen
before, different settings or an LLM that may summarise make resolve merge from scratch. Either way the outputs
equal a fresh build's, byte for byte.

Keyed: each section's keys are sorted and stored in blocks of BLOCK keys (one zlib frame of the keys, as one
string, and their accumulators, each marshalled on its own, over frames of FIELDS), and an index at the end of
the file holds each block's first key and place. A run after additions opens the file (header and index
only), and the merge looks each key
its records name up in one block (resolve_state.Lazy), so the accumulators no new record touches are never
read or decompressed; a key no block has is new.

A run that adds a few records does not rewrite the state: it writes graph/resolve_delta.json instead, the chunks
(and their record offsets) merged since the state file was saved, tied to that file by its header's id. The next run
merges the delta's records again (one merge: the same result, since records merge in chunk_id order), then its own
new ones. Once the delta holds more than `base_patch.RESOLVE_STATE` of the state's chunks the state is written again
(`fold`): blocks no merged key falls in are copied as the bytes they are, the others decoded and written with the
merged accumulators; so the replay stays a small part of a run.

Format (version 4): frames of (8-byte length, zlib(marshal(value))): the header first, then per section its
blocks, then the index frame, then a 16-byte trailer (the index's offset and a magic). A block is its keys
frame (one string, a key a line and NUL between a pair's or triple's parts: splitting it is a fraction of the cost
of unmarshalling as many tuples; a block with a key that holds a newline or NUL keeps the list) and its
accumulators in frames of about FIELDS[s] each (a list of each accumulator's own marshal bytes, so a lookup
decompresses one frame and unmarshals the one accumulator it wants: even a small addition touches keys in most
blocks). A version 3 file (keys as a list, one accumulators frame a block) is read as it is, and
a fold writes its new blocks in this format beside the copied ones (a block's frames say which it is). marshal
is fast for plain dicts, lists and tuples and its format belongs to the Python version, which the header's
basis records. A frame that does not read back whole (zlib's checksum, marshal, the shapes) is damage: one
warning, and a merge from scratch; a version 1 file (one stream of batches) is merged from scratch once, with
an info line, and saved in this format (so is a version 2 file, whose accumulator frames were one marshalled
list and held chunk ids). An accumulator's sources are saved as numbers into the header's chunk list
(`chunks`: numbers are kept by a fold, so copied blocks stay right; new chunks are appended): a chunk id is 32
hex characters, and spelled out in every accumulator they would be a large part of the file.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import marshal
import mmap
import shutil
import struct
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from hrag_cli.core import store
from hrag_cli.core.project import fingerprint
from hrag_cli.resolve.merge_records import _EntityAcc, _FactAcc, _RelationAcc

STATE_VERSION = 4
_READS = (3, 4)             # versions read as they are (a version 3 file: every keys frame a marshalled list)
_BASIS_VERSION = 3          # what the accumulators mean, in `basis` (a version 3 state stays usable)
# keys per block: a lookup decompresses one block; smaller blocks read less in a small addition but compress
# worse (zlib per block), so the file grows as they shrink. A small addition touches keys in most blocks of
# relations and facts; these sizes balance its lookups against the file's size (bench/resolve_scale.py)
BLOCK = {"entities": 64, "relations": 128, "facts": 128}
# accumulators per fields frame (a block's accumulators in frames of about this many): a lookup decompresses
# one, so a small addition decompresses far less than whole-block frames would, for a little more on disk
# (zlib over fewer accumulators)
FIELDS = {"entities": 16, "relations": 128, "facts": 128}      # at BLOCK or more: one fields frame a block
SECTIONS = ("entities", "relations", "facts")
# accumulator fields saved per key
_ACCS = (("entities", _EntityAcc), ("relations", _RelationAcc), ("facts", _FactAcc))
WIDTH = {s: len(cls.__slots__) for s, cls in _ACCS}
_SOURCES = {s: cls.__slots__.index("sources") for s, cls in _ACCS}     # the field saved as chunk numbers
_LEN = struct.Struct("<Q")
_TRAILER = struct.Struct("<Q8s")
_MAGIC = b"hragRS2\n"


@dataclass
class StateHeader:
    basis: str                  # settings, pruning and extractor the accumulators were merged under
    offsets: dict[str, int]     # chunk id -> offset of the record that was merged
    cache_size: int             # cache/extractions.jsonl's size then, and its quick hash over that size
    cache_sum: str
    unknown: int = 0            # entities typed UNKNOWN (a count resolve reports, kept up to date)
    counts: dict[str, int] = field(default_factory=dict)   # items per section and "mentions"


def basis(*parts: Any) -> str:
    return fingerprint("resolve-state", _BASIS_VERSION, sys.version_info[:2], marshal.version, *parts)


def _prefix_sum(path: Path, size: int) -> str:
    """A hash of the file's first `size` bytes, sampled (64 KiB at each end, 4 KiB at eight points between):
    catches a cache that was deleted and made again, or cut, without reading gigabytes."""
    h = hashlib.blake2b(str(size).encode(), digest_size=16)
    with open(path, "rb") as fh:
        for pos, n in [(0, 1 << 16), *((size * i // 9, 4096) for i in range(1, 9)), (max(0, size - (1 << 16)), 1 << 16)]:
            fh.seek(pos)
            h.update(fh.read(max(0, min(n, size - pos))))
    return h.hexdigest()


def cache_mark(path: Path) -> tuple[int, str]:
    size = path.stat().st_size if path.exists() else 0
    return size, _prefix_sum(path, size) if size else ""


def cache_grew_only(path: Path, header: StateHeader) -> bool:
    """The cache still begins with the bytes it had when the state was saved (appends only since)."""
    size = path.stat().st_size if path.exists() else 0
    return size >= header.cache_size and (not header.cache_size or
                                          _prefix_sum(path, header.cache_size) == header.cache_sum)


# -------------------------------------------------------------------------------------------- writing


def _saved_fields(acc: Any) -> tuple:
    """An accumulator's fields as saved: a tuple kept from a load is (key, *fields); an object has its slots."""
    return acc[1:] if acc.__class__ is tuple else acc.fields()


def _numbered(chunks: list[str]) -> dict[str, int]:
    return {c: i for i, c in enumerate(chunks)}


class _Writer:
    """Frames to a file handle, and the index of the blocks written; `number`: chunk id -> its number (the
    header's chunk list)."""

    def __init__(self, fh: BinaryIO, number: dict[str, int]) -> None:
        self.fh, self.at, self.number = fh, 0, number
        self.index: dict[str, tuple[list, list, list]] = {s: ([], [], []) for s in SECTIONS}  # first keys, places, sizes

    def frame(self, value: Any) -> None:
        self.raw(zlib.compress(marshal.dumps(value), 1))

    def raw(self, blob: bytes) -> None:
        self.fh.write(_LEN.pack(len(blob)))
        self.fh.write(blob)
        self.at += _LEN.size + len(blob)

    def item(self, section: str, fields: tuple) -> bytes:
        """One accumulator's saved fields as its block lists them: marshalled, its sources as chunk numbers."""
        at, number = _SOURCES[section], self.number
        return marshal.dumps((*fields[:at], [number[c] for c in fields[at]], *fields[at + 1:]))

    def block(self, section: str, keys: list, items: list[bytes]) -> None:
        """A block of `keys` (one keys frame) and their accumulators (`item` bytes, over frames of FIELDS)."""
        firsts, places, sizes = self.index[section]
        firsts.append(keys[0])
        places.append(self.at)
        sizes.append(len(keys))
        self.frame(_keys_value(keys))
        for part in _runs(items, FIELDS[section]):
            self.frame(part)

    def copied(self, section: str, first: Any, n: int, frames: bytes) -> None:
        """A block read from an earlier file, its frames as they were."""
        firsts, places, sizes = self.index[section]
        firsts.append(first)
        places.append(self.at)
        sizes.append(n)
        self.fh.write(frames)
        self.at += len(frames)

    def section(self, section: str, items: Iterable[tuple[Any, tuple]]) -> None:
        """(key, fields) in key order, as blocks."""
        keys: list = []
        fields: list = []
        item = self.item
        for key, f in items:
            keys.append(key)
            fields.append(item(section, f))
            if len(keys) >= BLOCK[section]:
                self.block(section, keys, fields)
                keys, fields = [], []
        if keys:
            self.block(section, keys, fields)

    def finish(self) -> None:
        where = self.at
        self.frame({s: self.index[s] for s in SECTIONS})
        self.fh.write(_TRAILER.pack(where, _MAGIC))


def _joined(key: Any) -> str:
    """A key as a keys frame's string holds it: an entity id as it is, a pair or triple's parts joined by NUL
    (which sorts before every other character, so the strings sort as the tuples do)."""
    return key if key.__class__ is str else "\x00".join(key)


def _parts(key: Any) -> int:
    """Parts of a key: 1 for an entity id, 2 or 3 for a pair or triple."""
    return 1 if key.__class__ is str else len(key)


def _keys_value(keys: list) -> str | list:
    """A block's keys as its frame holds them: one string, a key a line (splitting it costs far less than
    unmarshalling as many tuples, and keys frames are much of what a small run reads), or the list itself when a
    key holds a newline or NUL (a damaged or hand-made name: then the joined keys would not sort as the keys)."""
    text = "\n".join(map(_joined, keys))
    if text.count("\n") != len(keys) - 1 or text.count("\x00") != len(keys) * (_parts(keys[0]) - 1):
        return keys
    return text


def _header_frame(header: StateHeader, merged: Any, chunks: list[str]) -> dict:
    return {"version": STATE_VERSION, "basis": header.basis, "offsets": header.offsets, "chunks": chunks,
            "cache_size": header.cache_size, "cache_sum": header.cache_sum, "unknown": header.unknown,
            "counts": header.counts, "records": merged.records, "dropped_rows": merged.dropped_rows,
            "self_loops": merged.self_loops, "inexact": list(merged.inexact)}


def sorted_keys(merged: Any) -> dict[str, list]:
    """Each section's keys in order, of a Merged from a merge over every record (a merge into the state never
    needs them all: its patch ranks keys through Lazy.ranks, and fold copies the blocks it did not touch)."""
    return {s: sorted(getattr(merged, s)) for s in SECTIONS}


def save(path: Path, header: StateHeader, merged: Any, keys: dict[str, list]) -> None:
    """Atomically write `merged` (resolve.Merged from a merge over every record, before finalize empties it)
    in key order (`keys`: each section's keys sorted), block by block, so the file never needs a second copy
    of the state in memory."""
    header.counts = {**{s: len(keys[s]) for s in SECTIONS}, "mentions": len(merged.mentions)}
    chunks = sorted(header.offsets)
    with store.atomic_writer(path) as fh:
        w = _Writer(fh, _numbered(chunks))
        w.frame(_header_frame(header, merged, chunks))
        for s in SECTIONS:
            accs = getattr(merged, s)
            w.section(s, ((k, _saved_fields(accs[k])) for k in keys[s]))
        w.finish()


class Spooled:
    """The state file of a merge done in partitions (resolve/partition.py): each section's (key, fields) come in
    key order over many calls and go to a spool file of that section in the blocks `save` makes; `finish` then
    writes the header (known only at the end), the three spools and the index as one file, atomically: the file
    `save` of the whole merge writes (the same blocks, keys and accumulators; marshal's bytes may differ where it
    marks a string that other objects share)."""

    def __init__(self, path: Path, header: StateHeader) -> None:
        self.path, self.header = path, header
        self.chunks = sorted(header.offsets)
        number = _numbered(self.chunks)
        self.spools = {s: open(path.with_name(f".{path.name}.{s}.spool"), "w+b") for s in SECTIONS}
        self.writers = {s: _Writer(self.spools[s], number) for s in SECTIONS}
        self.pending: dict[str, tuple[list, list]] = {s: ([], []) for s in SECTIONS}
        self.counts = dict.fromkeys(SECTIONS, 0)

    def add(self, section: str, key: Any, fields: tuple) -> None:
        keys, items = self.pending[section]
        w = self.writers[section]
        keys.append(key)
        items.append(w.item(section, fields))
        self.counts[section] += 1
        if len(keys) >= BLOCK[section]:
            w.block(section, keys, items)
            self.pending[section] = ([], [])

    def finish(self, merged: Any, mentions: int) -> None:
        """`merged`: the counters the header keeps (records, dropped_rows, self_loops, inexact)."""
        self.header.counts = {**self.counts, "mentions": mentions}
        with store.atomic_writer(self.path) as fh:
            w = _Writer(fh, {})
            w.frame(_header_frame(self.header, merged, self.chunks))
            for s in SECTIONS:
                keys, items = self.pending[s]
                if keys:
                    self.writers[s].block(s, keys, items)
                spool, base = self.spools[s], w.at
                firsts, places, sizes = self.writers[s].index[s]
                w.index[s] = (firsts, [base + at for at in places], sizes)
                spool.seek(0)
                shutil.copyfileobj(spool, fh, 1 << 20)
                w.at += self.writers[s].at
            w.finish()
        self.close()

    def close(self) -> None:
        for s, fh in self.spools.items():
            fh.close()
            Path(fh.name).unlink(missing_ok=True)


def fold(path: Path, header: StateHeader, merged: Any) -> None:
    """Write the state again after a merge into it (`merged`'s sections are Lazy over the file at `path`):
    every block of the old file that none of the merged keys falls in is copied as its bytes; the others are
    decoded and written with the merged accumulators in their place. `header.counts` must be the new totals."""
    old = merged.entities.reader
    number = _numbered(old.chunks)
    chunks = old.chunks + sorted(c for c in header.offsets if c not in number)     # the old numbers kept
    with store.atomic_writer(path) as fh:
        w = _Writer(fh, _numbered(chunks))
        w.frame(_header_frame(header, merged, chunks))
        for s in SECTIONS:
            _fold_section(w, s, old, getattr(merged, s))
        w.finish()


def _fold_section(w: _Writer, s: str, old: Reader, mine: dict) -> None:
    firsts, places, sizes = old.index[s]
    ours = sorted(mine)
    j = 0
    for b, first in enumerate(firsts):
        nxt = firsts[b + 1] if b + 1 < len(firsts) else None
        lo = j                      # the merged keys before the next block's first key (block 0: any before too)
        while j < len(ours) and (nxt is None or ours[j] < nxt):
            j += 1
        if lo == j:
            w.copied(s, first, sizes[b], old.block_bytes(s, b))
            continue
        # the block's other accumulators are copied as their bytes, never decoded
        keys, fields = old.block_keys(s, b), old.block_fields(s, b)
        items = sorted({**dict(zip(keys, fields)), **{k: w.item(s, _saved_fields(mine[k])) for k in ours[lo:j]}}
                       .items())
        _balanced(w, s, items)
    _balanced(w, s, [(k, w.item(s, _saved_fields(mine[k]))) for k in ours[j:]])


def _balanced(w: _Writer, s: str, items: list[tuple[Any, bytes]]) -> None:
    """`items` (key, `_Writer.item` bytes) as blocks of nearly equal size, none past BLOCK[s] keys."""
    for chunk in _runs(items, BLOCK[s]):
        w.block(s, [k for k, _ in chunk], [f for _, f in chunk])


def _runs(items: list, most: int) -> Iterator[list]:
    """`items` in runs of nearly equal length, none past `most` (run j: items n*j//k up to n*(j+1)//k, the
    arithmetic Reader._field finds a block's fields frame by)."""
    n = len(items)
    k = -(-n // most)
    return (items[n * j // k:n * (j + 1) // k] for j in range(k))


def header_id(header: StateHeader) -> str:
    """What a delta names its state by: the basis, the cache mark and every chunk's record offset."""
    h = hashlib.blake2b(marshal.dumps((header.basis, header.cache_size, header.cache_sum,
                                       sorted(header.offsets.items()))), digest_size=16)
    return h.hexdigest()


@dataclass
class Delta:
    """Chunks merged since the state file was saved (graph/resolve_delta.json)."""

    state: str                  # header_id of the state file it adds to
    offsets: dict[str, int]     # chunk id -> offset of the record that was merged
    unknown: int                # entities typed UNKNOWN after it (the state's own count is older)


def delta_path(state_path: Path) -> Path:
    return state_path.with_name("resolve_delta.json")


def save_delta(state_path: Path, delta: Delta) -> None:
    store.write_json(delta_path(state_path), {"state": delta.state, "offsets": delta.offsets,
                                              "unknown": delta.unknown})


def drop_delta(state_path: Path) -> None:
    delta_path(state_path).unlink(missing_ok=True)


def read_delta(state_path: Path, header: StateHeader) -> Delta | None:
    """The delta for the state whose header is `header`; None when there is none. Raises Damaged when it
    does not parse or belongs to another state file (the outputs then match neither)."""
    try:
        d = store.read_json(delta_path(state_path))
    except ValueError:
        raise Damaged("its delta does not parse") from None
    if d is None:
        return None
    try:
        delta = Delta(str(d["state"]), {str(k): int(v) for k, v in d["offsets"].items()}, int(d["unknown"]))
    except (TypeError, KeyError, ValueError, AttributeError):
        raise Damaged("its delta has the wrong shape") from None
    if delta.state != header_id(header):
        raise Damaged("its delta belongs to another state")
    return delta


# -------------------------------------------------------------------------------------------- reading


class Damaged(Exception):
    """The state file does not read back whole."""


class OldFormat(Exception):
    """A state file of an earlier version: merged from scratch once and saved in this one."""


def _decode(blob: bytes | memoryview) -> Any:
    try:
        return marshal.loads(zlib.decompress(blob))
    except (ValueError, EOFError, TypeError, zlib.error) as exc:
        raise Damaged(type(exc).__name__) from None


class Reader:
    """An open state file: its header and block index read, blocks decoded when a key in them is looked up
    (and kept: the keys a merge touches cluster in few blocks only by chance, but a block is looked up again
    for each of its keys)."""

    def __init__(self, path: Path, head: Head | None = None) -> None:
        """`head`: read_header's answer for this file, so its header is not parsed again."""
        with open(path, "rb") as fh:
            try:
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:      # an empty file
                raise Damaged("empty") from None
        self.header, self._raw = head or _parse_header(self._map)
        if len(self._map) < _TRAILER.size:
            raise Damaged("cut short")
        where, magic = _TRAILER.unpack_from(self._map, len(self._map) - _TRAILER.size)
        if magic != _MAGIC or where >= len(self._map):
            raise Damaged("no index at its end")
        index = self._frame(where)
        try:
            self.index = {s: (list(index[s][0]), list(index[s][1]), list(index[s][2])) for s in SECTIONS}
            ok = all(len(f) == len(p) == len(z) and sum(z) == self.header.counts[s]
                     for s, (f, p, z) in self.index.items())
            # where each block ends: the next block's start (the sections' blocks lie in file order), or the index
            self._starts = sorted([*itertools.chain.from_iterable(p for _, p, _ in self.index.values()), where])
            ok = ok and all(p.__class__ is int for p in self._starts) and self._starts[0] >= 0 and \
                len(set(self._starts)) == len(self._starts) and self._starts[-1] == where
        except (TypeError, KeyError, IndexError):
            raise Damaged("its index has the wrong shape") from None
        if not ok:
            raise Damaged("its index and header counts differ")
        self.chunks: list[str] = self._raw.get("chunks")       # what sources' numbers name
        if self.chunks.__class__ is not list:
            raise Damaged("no chunk list")
        # blocks' keys as searched (a string frame's joined keys, flagged True, or a list frame's keys) and their
        # fields, as they were decoded
        self._keys: dict[tuple[str, int], tuple[list, bool]] = {}
        self._fields: dict[tuple[str, int, int], list] = {}    # (section, block, its fields frame)
        self._parts: dict[tuple[str, int], list[tuple[int, int]]] = {}
        self._cum: dict[str, list[int]] = {}      # per section: keys before each block

    def _span(self, at: int) -> tuple[int, int]:
        if at + _LEN.size > len(self._map):
            raise Damaged("cut short")
        (n,) = _LEN.unpack_from(self._map, at)
        if at + _LEN.size + n > len(self._map):
            raise Damaged("cut short")
        return at + _LEN.size, at + _LEN.size + n

    def _frame(self, at: int) -> Any:
        lo, hi = self._span(at)
        return _decode(self._map[lo:hi])

    def _end(self, s: str, b: int) -> int:
        at = self.index[s][1][b]
        return self._starts[bisect.bisect_right(self._starts, at)]

    def block_bytes(self, s: str, b: int) -> bytes:
        """Block `b` of section `s`, its frames as bytes."""
        return self._map[self.index[s][1][b]:self._end(s, b)]

    def _fields_spans(self, s: str, b: int) -> list[tuple[int, int]]:
        """Where block `b`'s fields frames lie: every frame after its keys frame, up to the block's end (one
        frame in a version 3 file; `_Writer.block` splits them)."""
        got = self._parts.get((s, b))
        if got is None:
            end, at, got = self._end(s, b), self._span(self.index[s][1][b])[1], []
            while at < end:
                got.append(self._span(at))
                at = got[-1][1]
            if at != end or not got or len(got) > self.index[s][2][b]:
                raise Damaged(f"a {s} block has the wrong shape")
            self._parts[(s, b)] = got
        return got

    def _searched(self, s: str, b: int) -> tuple[list, bool]:
        """Block `b`'s keys as a lookup searches them, and whether they are joined (`_joined`)."""
        got = self._keys.get((s, b))
        if got is None:
            got = self._keys[(s, b)] = self._read_keys(s, b)
        return got

    def block_keys(self, s: str, b: int) -> list:
        """The keys of block `b` of section `s` (its fields frames are not read)."""
        return _keys_of(*self._searched(s, b))

    def _read_keys(self, s: str, b: int) -> tuple[list, bool]:
        got = self._frame(self.index[s][1][b])
        first = self.index[s][0][b]
        if got.__class__ is str:
            got, first, joined = got.split("\n"), _joined(first), True
        else:
            joined = False
        if got.__class__ is not list or len(got) != self.index[s][2][b] or not got or got[0] != first:
            raise Damaged(f"a {s} block has the wrong shape")
        return got, joined

    def block_fields(self, s: str, b: int) -> list[bytes]:
        """The accumulators of block `b`'s keys, in their order, as saved (`_Writer.item` bytes)."""
        return list(itertools.chain.from_iterable(self._part(s, b, j)
                                                  for j in range(len(self._fields_spans(s, b)))))

    def _field(self, s: str, b: int, i: int) -> bytes:
        """The saved accumulator of block `b`'s key `i` (one fields frame read)."""
        k, n = len(self._fields_spans(s, b)), self.index[s][2][b]
        j = i * k // n
        if n * (j + 1) // k <= i:       # frame j holds items n*j//k up to n*(j+1)//k
            j += 1
        return self._part(s, b, j)[i - n * j // k]

    def _part(self, s: str, b: int, j: int) -> list[bytes]:
        got = self._fields.get((s, b, j))
        if got is None:
            spans, n = self._fields_spans(s, b), self.index[s][2][b]
            k, (lo, hi) = len(spans), spans[j]
            got = _decode(self._map[lo:hi])
            if got.__class__ is not list or len(got) != n * (j + 1) // k - n * j // k:   # items: checked when read
                raise Damaged(f"a {s} block has the wrong shape")
            self._fields[(s, b, j)] = got
        return got

    def _item(self, s: str, blob: bytes) -> tuple:
        """An accumulator's saved fields, its sources as chunk ids again."""
        try:
            fields = marshal.loads(blob)
            at = _SOURCES[s]
            if fields.__class__ is not tuple or len(fields) != WIDTH[s] or fields[at].__class__ is not list:
                raise TypeError
            chunks = self.chunks
            return (*fields[:at], [chunks[i] for i in fields[at]], *fields[at + 1:])
        except (ValueError, EOFError, TypeError, IndexError):
            raise Damaged(f"a {s} item has the wrong shape") from None

    def find(self, s: str, key: Any) -> tuple | None:
        """The saved tuple (key, *fields) of `key`, or None when the state has no such key (then only the
        keys of the one block it would be in are read)."""
        b = bisect.bisect_right(self.index[s][0], key) - 1
        if b < 0:
            return None
        keys, joined = self._searched(s, b)
        k = _joined(key) if joined else key
        i = bisect.bisect_left(keys, k)
        if i == len(keys) or keys[i] != k:
            return None
        return (key, *self._item(s, self._field(s, b, i)))

    def ranks(self, s: str, keys: list) -> list[int]:
        """How many keys of section `s` sort before each of `keys` (per key, one block's keys read)."""
        cum = self._cum.get(s)
        if cum is None:
            cum = self._cum[s] = [0, *itertools.accumulate(self.index[s][2])]
        firsts, searched, find, out = self.index[s][0], self._searched, bisect.bisect_left, []
        for key in keys:
            b = bisect.bisect_right(firsts, key) - 1
            if b < 0:
                out.append(0)
                continue
            block, joined = searched(s, b)
            k = _joined(key) if joined else key
            if joined and k.count("\x00") != _parts(key) - 1:     # a part holds NUL: joined, it misorders
                block, k = _keys_of(block, True), key
            out.append(cum[b] + find(block, k))
        return out

    def keys(self, s: str) -> list:
        """Every key of section `s` in order, reading the key frames only (each checked as a lookup's is; not
        kept)."""
        out: list = []
        for b in range(len(self.index[s][1])):
            out += _keys_of(*(self._keys.get((s, b)) or self._read_keys(s, b)))
        return out


def _keys_of(keys: list, joined: bool) -> list:
    """A block's keys from their searched form (`Reader._searched`)."""
    if not joined or not keys or "\x00" not in keys[0]:
        return keys
    return [tuple(k.split("\x00")) for k in keys]


Head = tuple[StateHeader, dict]     # the header, and the frame it was parsed from


def _parse_header(data: Any) -> Head:
    if len(data) < _LEN.size:
        raise Damaged("cut short")
    (n,) = _LEN.unpack_from(data, 0)
    if _LEN.size + n > len(data):
        raise Damaged("cut short")
    h = _decode(data[_LEN.size:_LEN.size + n])
    if isinstance(h, dict) and "basis" in h and h.get("version") not in _READS:
        raise OldFormat(f"version {h.get('version', 1)}")
    try:
        header = StateHeader(h["basis"], dict(h["offsets"]), int(h["cache_size"]), h["cache_sum"], int(h["unknown"]),
                             {k: int(v) for k, v in h["counts"].items()})
        if set(header.counts) != {*SECTIONS, "mentions"}:
            raise KeyError("counts")
    except (TypeError, KeyError, ValueError, AttributeError):
        raise Damaged("no header") from None
    return header, h


def read_header(path: Path) -> Head | None:
    """The header alone (cheap: the caller decides from it whether the state is worth opening; `load` takes
    it, so the header, a chunk list and offsets of every chunk, is parsed once); None when there is no state
    file. Raises Damaged, or OldFormat for a file of an earlier version."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return None
    with fh:
        head = fh.read(_LEN.size)
        (n,) = _LEN.unpack(head) if len(head) == _LEN.size else (0,)
        return _parse_header(head + fh.read(n))


class Lazy(dict):
    """A section of a Merged over an open state: a key is read from the state the first time it is asked
    for (`get`, `[]`), as its saved tuple, so a merge into the state reads only the blocks of the keys its
    records name. `absent`: the keys asked for that the state does not have (a merge then creates them).
    `may_have(key)` False answers absent without a read (a relation with an endpoint the state lacks).
    len() counts the keys read and created, not the section: `total()` is that."""

    def __init__(self, reader: Reader, section: str, may_have: Callable[[Any], bool] | None = None) -> None:
        super().__init__()
        self.reader, self.section, self.may_have = reader, section, may_have
        self.absent: set = set()
        self._created: list | None = None    # (rank) the created keys, sorted once the merge is done

    def get(self, key: Any, default: Any = None) -> Any:
        got = dict.get(self, key, _NONE)
        if got is _NONE:
            if key in self.absent:
                return default
            got = None if self.may_have and not self.may_have(key) else self.reader.find(self.section, key)
            if got is None:
                self.absent.add(key)
                return default
            dict.__setitem__(self, key, got)
        return got

    def __missing__(self, key: Any) -> Any:
        got = self.get(key, _NONE)
        if got is _NONE:
            raise KeyError(key)
        return got

    def __contains__(self, key: Any) -> bool:
        return self.get(key, _NONE) is not _NONE

    def created(self) -> list:
        """Keys this run added to the section (asked for, not in the state, then set)."""
        return [k for k in self.absent if dict.__contains__(self, k)]

    def total(self) -> int:
        return self.reader.header.counts[self.section] + len(self.created())

    def ranks(self, keys: list) -> list[int]:
        """The place of each of `keys` among the section's keys after this run's merge (the state's and the
        created ones, sorted): the line a record file sorted by key has it on, without reading every key."""
        if self._created is None:
            self._created = sorted(self.created())
        created, find = self._created, bisect.bisect_left
        return [r + find(created, k) for r, k in zip(self.reader.ranks(self.section, keys), keys)]


_NONE = object()


def load(path: Path, merged_cls: type, head: Head | None = None) -> tuple[Any, int]:
    """A Merged over the state file (its sections Lazy: nothing but the header and index is read yet) and the
    header's UNKNOWN count (`head`: the file's read_header, when the caller has it). Raises Damaged or
    OldFormat."""
    reader = Reader(path, head)
    h = reader._raw
    m = merged_cls()
    # a relation is saved only with both its entities, and a fact only with its relation: a key whose
    # entities or relation the state lacks is new without a read (most keys of new documents are)
    ents = m.entities = Lazy(reader, "entities")
    rels = m.relations = Lazy(reader, "relations", lambda p: p[0] not in ents.absent and p[1] not in ents.absent)
    m.facts = Lazy(reader, "facts", lambda f: ((f[0], f[2]) if f[0] < f[2] else (f[2], f[0])) not in rels.absent)
    try:
        m.records, m.dropped_rows, m.self_loops = int(h["records"]), int(h["dropped_rows"]), int(h["self_loops"])
        m.inexact = set(map(tuple, h["inexact"]))
    except (TypeError, KeyError, ValueError):
        raise Damaged("no header") from None
    m.base_mentions = reader.header.counts["mentions"]
    return m, reader.header.unknown
