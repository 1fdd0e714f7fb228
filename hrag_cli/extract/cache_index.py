"""An index of cache/extractions.jsonl (cache/extractions.index.jsonl), so a run does not parse every record
ever made to learn which chunks have one: on a large corpus the cache is hundreds of MB of JSON, which would be
parsed whole by the extract stage and again by resolve on every run, even one that adds a few documents.

One line per record of the cache, in cache order: where it is, what the extract stage counts of it, and the
CRC-32 of the cache from its first byte up to the record's end. The index is derived data: a run reads it,
checks that the cache still holds what it covers, and indexes only the records appended since. The check is
sampled, as a reader's check of an artifact is (artifacts.quick_sum): the cache must be at least as long as the
index says, and its first and last records and a few dozen spread between must each give their running CRC
from the one before (the CRCs chain, so each line is checked alone). A cut, emptied, zeroed or replaced cache
fails it and is indexed again from its first byte; `full=True` (`hrag status --verify`, `hrag index --rehash`)
checks every byte. A record edited in place between samples keeps its old entry until then: the extract stage
counts it as it was, and resolve reads the edited bytes (a line that no longer parses is skipped as a damaged
cache line is everywhere). Written only by a process holding the project's writer lock (append-only, torn tail
cut on open, or replaced whole); a reader without the lock (`hrag status`) indexes the new records in memory
only. One process checks and reads the index once: later calls go on from where the last one ended.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from hrag_cli.core import store
from hrag_cli.core.project import ProjectDir, fingerprint

INDEX_VERSION = 1
_BLOCK = 1 << 20
_SAMPLES = 32               # records checked between the first and the last (each a few KiB)
# per cache file, what this process last read of its index: the cache's (inode, size, mtime) then, the entries,
# and whether the index file holds exactly those; a later call goes on from there when the cache only grew
_MEMO: dict[Path, tuple[tuple[int, int, int], list[list], bool]] = {}


@dataclass(slots=True)
class Seen:
    """What the extract stage needs of one record without parsing it again (the record itself is read back at
    its offset when needed: held whole, a large run's records would be gigabytes of Python objects)."""

    at: int             # byte offset in the cache
    status: str
    digest: str         # fingerprint of the record (the extract stage's output digest is made of these)
    entities: int
    relations: int
    dropped: dict[str, int]
    retyped: int
    llm_keys: bool
    parser: int


def count(value: Any) -> int:
    """A count from a record, 0 when a damaged or hand-edited record holds something else."""
    return int(value) if isinstance(value, (int, float)) and value == value else 0


def record_dropped(rec: dict) -> dict[str, int]:
    """A record's dropped rows per reason; a record written before reasons were kept has only a total."""
    dropped = rec.get("dropped")
    if isinstance(dropped, dict) and dropped:
        return {str(k): count(v) for k, v in dropped.items() if count(v)}
    n = count(rec.get("dropped_rows"))
    return {"reason_not_recorded": n} if n else {}


def seen_of(rec: dict, at: int) -> Seen:
    return Seen(at, str(rec.get("status", "ok")), fingerprint(rec), len(rec.get("entities") or []),
                len(rec.get("relations") or []), record_dropped(rec), count(rec.get("retyped")),
                bool(rec.get("llm_keys")), count(rec.get("parser")))


def full_record(project: ProjectDir, seen: Seen) -> dict:
    """The whole record `seen` describes (read back at its offset)."""
    return next(store.read_jsonl_at(project.extractions_path, [seen.at]))


def index_path(project: ProjectDir) -> Path:
    return project.extractions_path.with_name("extractions.index.jsonl")


def _entry(at: int, end: int, crc: int, rec: dict | None) -> list:
    """A line that is not a record (blank, not JSON, no chunk id) gets an entry too, with no chunk: the entries
    then tile the cache, which is what lets a lost entry be noticed."""
    if rec is None:
        return [at, end, crc, None, None, "", "", 0, 0, {}, 0, False, 0]
    s = seen_of(rec, at)
    return [at, end, crc, rec["chunk_id"], rec["extractor"], s.status, s.digest, s.entities, s.relations,
            s.dropped, s.retyped, s.llm_keys, s.parser]


def _seen(e: list) -> Seen:
    return Seen(e[0], e[5], e[6], e[7], e[8], e[9], e[10], e[11], e[12])


def _read_index(path: Path) -> list[list] | None:
    """The entries of an index of this version whose entries tile the cache from its first byte (None: none,
    not one this code wrote, or an entry lost or garbled). A torn last entry (a kill while appending) is left
    out: the records it was for are indexed again."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    head, _, body = data.partition(b"\n")
    try:
        info = orjson.loads(head)
        lines = body[:body.rfind(b"\n") + 1]
        found = orjson.loads(b"[" + lines.replace(b"\n", b",")[:-1] + b"]") if lines else []   # one parse
    except orjson.JSONDecodeError:
        return None
    if not isinstance(info, dict) or info.get("index_version") != INDEX_VERSION:
        return None
    end = 0
    for e in found:
        if not isinstance(e, list) or len(e) != 13 or e[0] != end:
            return None
        end = e[1]
    return found


def _prefix_crc(fh: Any, size: int) -> int:
    fh.seek(0)
    crc, left = 0, size
    while left > 0:
        block = fh.read(min(_BLOCK, left))
        if not block:
            break
        crc = zlib.crc32(block, crc)
        left -= len(block)
    return crc


def _holds(fh: Any, entries: list[list], size: int, full: bool = False, last: bool = False) -> bool:
    """Whether the cache (`fh`, `size` bytes) still holds what `entries` index: every byte's CRC with `full`,
    else the length and a sample of lines (only the last line with `last`), each checked against its running
    CRC."""
    end = entries[-1][1]
    if end > size:
        return False
    if full:
        return _prefix_crc(fh, end) == entries[-1][2]
    n = len(entries)
    picks = {n - 1} if last else {0, n - 1, *(n * k // (_SAMPLES + 1) for k in range(1, _SAMPLES + 1))}
    for i in sorted(picks):
        at, stop, crc = entries[i][:3]
        fh.seek(at)
        if zlib.crc32(fh.read(stop - at), entries[i - 1][2] if i else 0) != crc:
            return False
    return True


def _scan_from(fh: Any, at: int, crc: int) -> list[list]:
    """Entries for the whole lines from byte `at` on (the CRC running on from `crc`)."""
    fh.seek(at)
    out = []
    for line in fh:
        if not line.endswith(b"\n"):
            break                       # torn tail, as store.read_jsonl
        start, at = at, at + len(line)
        crc = zlib.crc32(line, crc)
        try:
            rec = orjson.loads(line) if line.strip() else None
        except orjson.JSONDecodeError:
            rec = None
        ok = isinstance(rec, dict) and isinstance(rec.get("chunk_id"), str) and isinstance(rec.get("extractor"), str)
        out.append(_entry(start, at, crc, rec if ok else None))
    return out


def entries(project: ProjectDir, full: bool = False) -> list[list]:
    """Every record's entry, in cache order: the stored index checked and brought up to date (saved when this
    process holds the writer lock). `full`: check every byte of the cache, not a sample."""
    cache, path = project.extractions_path, index_path(project)
    try:
        fh = open(cache, "rb")
    except FileNotFoundError:
        _MEMO.pop(cache, None)
        return []
    with fh:
        st = os.fstat(fh.fileno())
        now = (st.st_ino, st.st_size, st.st_mtime_ns)
        memo = _MEMO.get(cache)
        if memo is not None and not full and memo[0][0] == now[0] and (memo[0] == now or (
                memo[0][1] < now[1] and (not memo[1] or _holds(fh, memo[1], now[1], last=True)))):
            old, saved = memo[1], memo[2]      # read and checked earlier in this process: at most appended to
        else:
            old, saved = _read_index(path), True
            if old and not _holds(fh, old, st.st_size, full):
                old = None              # the cache was cut, rewritten or edited: index it again
        new = _scan_from(fh, old[-1][1] if old else 0, old[-1][2] if old else 0)
    out = (old or []) + new
    if project.holds_lock and (new or old is None or not saved):
        if old is None or not saved:
            store.write_jsonl(path, [{"index_version": INDEX_VERSION, "of": cache.name}, *out])
        else:
            with store.JsonlAppender(path) as app:
                for e in new:
                    app.append(e)
        saved = True
    else:
        saved = saved and not new and old is not None
    _MEMO[cache] = (now, out, saved)
    return out


def latest(project: ProjectDir, extractors: set[str] | None = None, chunks: set[str] | None = None
           ) -> dict[tuple[str, str], Seen]:
    """(chunk_id, extractor) -> what the latest record says (later records win), for `extractors` or all, and
    `chunks` or all."""
    last: dict[tuple[str, str], list] = {}
    for e in entries(project):
        if e[3] is not None and (extractors is None or e[4] in extractors) and (chunks is None or e[3] in chunks):
            last[(e[3], e[4])] = e
    return {key: _seen(e) for key, e in last.items()}


def latest_offsets(project: ProjectDir, extractor: str, statuses: tuple[str, ...]) -> dict[str, int]:
    """chunk_id -> the offset of its latest record of `extractor`, for chunks whose latest record has one of
    these statuses (what `latest` says, without making a Seen of every record)."""
    last: dict[str, list] = {}
    for e in entries(project):
        if e[4] == extractor and e[3] is not None:
            last[e[3]] = e
    return {cid: e[0] for cid, e in last.items() if e[5] in statuses}
