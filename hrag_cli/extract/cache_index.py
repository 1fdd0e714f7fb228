"""An index of cache/extractions.jsonl (cache/extractions.index.jsonl), so a run does not parse every record
ever made to learn which chunks have one: at 100k passages the cache is ~460 MB of JSON, parsed whole by the
extract stage and again by resolve on every run, even one that adds 1 % of documents.

One line per record of the cache, in cache order: where it is, what the extract stage counts of it, and the
CRC-32 of the cache from its first byte up to the record's end. The index is derived data: a run reads it,
checks the CRC of the cache prefix it covers against the disk (one C pass over bytes, no parsing), and indexes
only the records appended since. A cache that was cut, rewritten or edited anywhere in the covered part (the
CRC differs, or the cache is shorter) makes the index be built again from the whole cache, so a wrong index is
never used. Written only by a process holding the project's writer lock (append-only, torn tail cut on open,
or replaced whole); a reader without the lock (`hrag status`) indexes the new records in memory only.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .. import store
from ..project import Project, fingerprint

INDEX_VERSION = 1
_BLOCK = 1 << 20


@dataclass(slots=True)
class Seen:
    """What the extract stage needs of one record without parsing it again; `record` holds it whole when it
    was made in this run (it has no offset yet)."""

    at: int             # byte offset in the cache (-1: made in this run)
    status: str
    digest: str         # fingerprint of the record (the extract stage's output digest is made of these)
    entities: int
    relations: int
    dropped: dict[str, int]
    retyped: int
    llm_keys: bool
    parser: int
    record: dict | None = None


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


def seen_of(rec: dict, at: int = -1, keep: bool = False) -> Seen:
    return Seen(at, str(rec.get("status", "ok")), fingerprint(rec), len(rec.get("entities") or []),
                len(rec.get("relations") or []), record_dropped(rec), count(rec.get("retyped")),
                bool(rec.get("llm_keys")), count(rec.get("parser")), rec if keep else None)


def full_record(project: Project, seen: Seen) -> dict:
    """The whole record `seen` describes (read back at its offset)."""
    if seen.record is not None:
        return seen.record
    return next(store.read_jsonl_at(project.extractions_path, [seen.at]))


def index_path(project: Project) -> Path:
    return project.extractions_path.with_name("extractions.index.jsonl")


def _entry(at: int, end: int, crc: int, rec: dict | None) -> list:
    """A line that is not a record (blank, not JSON, no chunk id) gets an entry too, with no chunk: the entries
    then tile the cache, which is what lets a lost entry be noticed."""
    if rec is None:
        return [at, end, crc, None, None, "", "", 0, 0, {}, 0, False, 0]
    s = seen_of(rec)
    return [at, end, crc, rec["chunk_id"], rec["extractor"], s.status, s.digest, s.entities, s.relations,
            s.dropped, s.retyped, s.llm_keys, s.parser]


def _seen(e: list) -> Seen:
    return Seen(e[0], e[5], e[6], e[7], e[8], e[9], e[10], e[11], e[12])


def _read_index(path: Path) -> list[list] | None:
    """The entries of an index of this version whose entries tile the cache from its first byte (None: none,
    not one this code wrote, or an entry lost or garbled)."""
    lines = store.read_jsonl(path)
    head = next(lines, None)
    if not isinstance(head, dict) or head.get("index_version") != INDEX_VERSION:
        return None
    out, end = [], 0
    for e in lines:
        if not isinstance(e, list) or len(e) != 13 or e[0] != end:
            return None
        out.append(e)
        end = e[1]
    return out


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


def entries(project: Project) -> list[list]:
    """Every record's entry, in cache order: the stored index checked and brought up to date (saved when this
    process holds the writer lock)."""
    cache, path = project.extractions_path, index_path(project)
    try:
        fh = open(cache, "rb")
    except FileNotFoundError:
        return []
    with fh:
        size = fh.seek(0, 2)
        old = _read_index(path)
        if old:
            end, crc = old[-1][1], old[-1][2]
            if end > size or _prefix_crc(fh, end) != crc:
                old = None              # the cache was cut, rewritten or edited: index it again
        new = _scan_from(fh, old[-1][1] if old else 0, old[-1][2] if old else 0)
    if project.holds_lock and (new or old is None):
        if old is None:
            store.write_jsonl(path, [{"index_version": INDEX_VERSION, "of": cache.name}, *new])
        else:
            with store.JsonlAppender(path) as out:
                for e in new:
                    out.append(e)
    return (old or []) + new


def latest(project: Project, extractors: set[str] | None = None) -> dict[tuple[str, str], Seen]:
    """(chunk_id, extractor) -> what the latest record says (later records win), for `extractors` or all."""
    out: dict[tuple[str, str], Seen] = {}
    for e in entries(project):
        if e[3] is not None and (extractors is None or e[4] in extractors):
            out[(e[3], e[4])] = _seen(e)
    return out
