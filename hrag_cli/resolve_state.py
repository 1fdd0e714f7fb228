"""Resolve's merge state on disk (graph/resolve_state.bin), so a run after new documents merges only their
records into what the last run accumulated instead of re-reading every record.

What is kept: every entity, relation and fact accumulator, the mentions, the counters, and which record each
chunk's contribution came from (its byte offset in the append-only cache/extractions.jsonl, plus a sampled hash
of the cache up to the size it had, so a cache that was deleted or rewritten is noticed). The state is only
used when adding is all that happened: a chunk whose record changed or went away, a record that needs an alias
plan, a strength that is not a multiple of 1/1024 added to a relation seen before, different settings or an LLM
that may summarise make resolve merge from scratch. Either way the outputs equal a fresh build's, byte for byte.

Saving the whole state costs about as much as loading it (at 100k passages a fifth of an incremental resolve),
so a run that adds a few records does not re-save it: it writes graph/resolve_delta.json instead, the chunks
(and their record offsets) merged since the state file was saved, tied to that file by its header's id. The
next run loads the state, merges the delta's records again (one merge: the same result, since records merge
in chunk_id order), then its own new ones. The state is saved whole again once the delta holds more than
RESAVE_SHARE of the state's chunks, so the replay stays a small part of a run.

Format: frames of (8-byte length, zlib(marshal(batch))), the header first and an end frame last; marshal is
fast for plain dicts, lists and tuples and its format belongs to the Python version, which the header records.
A file that does not read back whole is damage: one warning, and a merge from scratch.
"""

from __future__ import annotations

import hashlib
import marshal
import operator
import struct
import sys
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from . import store
from .project import fingerprint

STATE_VERSION = 1
RESAVE_SHARE = 0.1          # delta chunks past this share of the state's chunks: save the state whole again
_BATCH = 20_000
_LEN = struct.Struct("<Q")


@dataclass
class StateHeader:
    basis: str                  # settings, pruning and extractor the accumulators were merged under
    offsets: dict[str, int]     # chunk id -> offset of the record that was merged
    cache_size: int             # cache/extractions.jsonl's size then, and its quick hash over that size
    cache_sum: str
    unknown: int = 0            # entities typed UNKNOWN (a count resolve reports, kept up to date)


def basis(*parts: Any) -> str:
    return fingerprint("resolve-state", STATE_VERSION, sys.version_info[:2], marshal.version, *parts)


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


def _frame(fh: BinaryIO, value: Any) -> None:
    blob = zlib.compress(marshal.dumps(value), 1)
    fh.write(_LEN.pack(len(blob)))
    fh.write(blob)


def _batches(items: Iterable[Any]) -> Iterator[list]:
    batch: list = []
    for item in items:
        batch.append(item)
        if len(batch) >= _BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def sorted_keys(merged: Any) -> dict[str, list]:
    """Each section's keys in order. A loaded state is in key order with the new keys after it, which
    Python's sort merges in about linear time."""
    return {"entities": sorted(merged.entities), "relations": sorted(merged.relations), "facts": sorted(merged.facts)}


def save(path: Path, header: StateHeader, merged: Any, keys: dict[str, list]) -> None:
    """Atomically write `merged` (resolve.Merged, before finalize empties it) in key order (`keys`:
    sorted_keys), in batches of plain tuples, so the file never needs a second copy of the state in memory."""
    ents, rels, facts = merged.entities, merged.relations, merged.facts
    sections = {   # an accumulator a load kept as its saved tuple is written as it is
        "entities": (a if a.__class__ is tuple else (k, a.names, a.types, a.descs, a.sources, a.aliases)
                     for k in keys["entities"] for a in (ents[k],)),
        "relations": (a if a.__class__ is tuple else (k, a.weight, a.predicates, a.keywords, a.descs, a.sources,
                                                      a.types)
                      for k in keys["relations"] for a in (rels[k],)),
        "facts": (a if a.__class__ is tuple else (k, a.predicates, a.sources)
                  for k in keys["facts"] for a in (facts[k],)),
        "mentions": iter(merged.mentions),
    }
    with store.atomic_writer(path) as fh:
        _frame(fh, {"basis": header.basis, "offsets": header.offsets, "cache_size": header.cache_size,
                    "cache_sum": header.cache_sum, "unknown": header.unknown, "records": merged.records,
                    "dropped_rows": merged.dropped_rows, "self_loops": merged.self_loops,
                    "inexact": list(merged.inexact)})
        counts = {}
        for name, items in sections.items():
            n = 0
            for batch in _batches(items):
                _frame(fh, (name, batch))
                n += len(batch)
            counts[name] = n
        _frame(fh, ("end", counts))


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


def _frames(fh: BinaryIO) -> Iterator[Any]:
    while True:
        head = fh.read(_LEN.size)
        if not head:
            return
        if len(head) < _LEN.size:
            raise Damaged("cut short")
        (n,) = _LEN.unpack(head)
        blob = fh.read(n)
        if len(blob) < n:
            raise Damaged("cut short")
        try:
            yield marshal.loads(zlib.decompress(blob))
        except (ValueError, EOFError, TypeError, zlib.error) as exc:
            raise Damaged(type(exc).__name__) from None


_first = operator.itemgetter(0)


def read_header(path: Path) -> StateHeader | None:
    """The header alone (cheap: the caller decides from it whether the accumulators are worth loading);
    None when there is no state file. Raises Damaged."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return None
    with fh:
        h = next(_frames(fh), None)
    try:
        return StateHeader(h["basis"], dict(h["offsets"]), int(h["cache_size"]), h["cache_sum"])
    except (TypeError, KeyError, ValueError):
        raise Damaged("no header") from None


def load(path: Path, merged_cls: type) -> tuple[Any, int]:
    """The Merged the file holds and the header's UNKNOWN count. Each accumulator stays the tuple it was saved
    as, (key, *fields), until a merge touches its key (resolve_records.live makes the object then): building
    millions of objects nobody reads was a third of the load. Raises Damaged."""
    m = merged_cls()
    sections = {"entities": (m.entities, 6), "relations": (m.relations, 7), "facts": (m.facts, 3)}
    counts = {"entities": 0, "relations": 0, "facts": 0, "mentions": 0}
    with open(path, "rb") as fh:
        frames = _frames(fh)
        h = next(frames, None)
        try:
            m.records, m.dropped_rows, m.self_loops = h["records"], h["dropped_rows"], h["self_loops"]
            m.inexact = set(map(tuple, h["inexact"]))
            unknown = h["unknown"]
        except (TypeError, KeyError):
            raise Damaged("no header") from None
        for frame in frames:
            try:
                name, batch = frame
            except (TypeError, ValueError):
                raise Damaged("a frame is not (section, items)") from None
            if name == "end":
                if batch != counts:
                    raise Damaged("counts differ")
                return m, unknown
            try:
                counts[name] = counts.get(name, 0) + len(batch)
                if name == "mentions":
                    m.mentions.extend(batch)
                    continue
                if name not in sections:
                    raise Damaged(f"unknown section {name!r}")
                accs, width = sections[name]
                if set(map(type, batch)) != {tuple} or set(map(len, batch)) != {width}:
                    raise Damaged(f"a {name} item has the wrong shape")
                accs.update(zip(map(_first, batch), batch))
            except (TypeError, ValueError):
                raise Damaged(f"a {name} item has the wrong shape") from None
    raise Damaged("no end frame")
