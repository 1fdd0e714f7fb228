"""cache/extractions.index.jsonl (extract/cache_index.py): what it says must always be what a parse of the whole
extraction cache says, whatever happened to the cache or to the index."""

from __future__ import annotations

from pathlib import Path

import orjson

from hrag_cli.core import store
from hrag_cli.extract import cache_index
from hrag_cli.core.project import ProjectDir, fingerprint


def _rec(chunk: str, status: str = "ok", n: int = 1, extractor: str = "rules-v1") -> dict:
    return {"chunk_id": chunk, "extractor": extractor, "status": status,
            "entities": [{"name": f"E{i}", "type": "x"} for i in range(n)], "relations": [], "retyped": n,
            "dropped": {"truncated": n}}


def _by_parsing(project: ProjectDir) -> dict:
    """What the index must say: the latest parsable record of each (chunk, extractor), read the slow way."""
    out = {}
    for rec in store.read_jsonl(project.extractions_path):
        if isinstance(rec, dict) and isinstance(rec.get("chunk_id"), str) and isinstance(rec.get("extractor"), str):
            out[(rec["chunk_id"], rec["extractor"])] = (fingerprint(rec), rec["status"], len(rec["entities"]))
    return out


def _by_index(project: ProjectDir) -> dict:
    return {k: (s.digest, s.status, s.entities) for k, s in cache_index.latest(project).items()}


def _project(tmp_path: Path) -> ProjectDir:
    p = ProjectDir(tmp_path / "p")
    p.init()
    return p


def _indexed(tmp_path: Path, chunks: str) -> ProjectDir:
    """A project whose cache holds one record per chunk, indexed."""
    p = _project(tmp_path)
    with p.lock():
        with store.JsonlAppender(p.extractions_path) as out:
            for c in chunks:
                out.append(_rec(c))
        cache_index.latest(p)
    return p


def test_the_index_follows_appends_and_reads_records_back_at_their_offsets(tmp_path: Path, monkeypatch) -> None:
    p = _project(tmp_path)
    scans: list[int] = []
    scan = cache_index._scan_from
    monkeypatch.setattr(cache_index, "_scan_from", lambda fh, at, crc: scans.append(at) or scan(fh, at, crc))
    with p.lock(), store.JsonlAppender(p.extractions_path) as out:
        out.append(_rec("a"))
        out.append(_rec("b", "failed", 0))
    with p.lock():
        assert _by_index(p) == _by_parsing(p)
    assert cache_index.index_path(p).is_file()
    with p.lock():
        with store.JsonlAppender(p.extractions_path) as out:
            out.append(_rec("a", n=3))        # a later record of the same chunk wins
            out.append(_rec("c", extractor="llm:m:1"))
        before = cache_index.entries(p)[-1][1]         # where the indexed lines ended ...
        scans.clear()
        latest = cache_index.latest(p)
    assert scans == [before]                          # ... is where the next run starts parsing: not at 0
    assert _by_index(p) == _by_parsing(p)
    assert latest[("a", "rules-v1")].entities == 3
    assert cache_index.full_record(p, latest[("a", "rules-v1")]) == _rec("a", n=3)
    assert latest[("a", "rules-v1")].dropped == {"truncated": 3}
    entries = cache_index.entries(p)
    assert len(entries) == 4 and next(store.read_jsonl(cache_index.index_path(p)))["index_version"] == 1


def test_an_edited_cut_or_replaced_cache_is_indexed_again(tmp_path: Path) -> None:
    p = _indexed(tmp_path, "abcdef")
    data = p.extractions_path.read_bytes()
    # the same length, one status changed in the middle: no size or line check could see it
    edited = data.replace(b'"chunk_id":"c","extractor":"rules-v1","status":"ok"',
                          b'"chunk_id":"c","extractor":"rules-v1","status":"no"')
    assert edited != data and len(edited) == len(data)
    p.extractions_path.write_bytes(edited)
    assert _by_index(p) == _by_parsing(p) and cache_index.latest(p)[("c", "rules-v1")].status == "no"
    p.extractions_path.write_bytes(data[: len(data) // 2])          # cut (a torn last line too)
    assert _by_index(p) == _by_parsing(p)
    p.extractions_path.write_bytes(b"not json\n" + orjson.dumps(_rec("z")) + b"\n")
    assert _by_index(p) == _by_parsing(p) == {("z", "rules-v1"): _by_parsing(p)[("z", "rules-v1")]}


def test_a_damaged_or_torn_index_is_never_trusted(tmp_path: Path) -> None:
    p = _indexed(tmp_path, "abcd")
    path = cache_index.index_path(p)
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join(lines[:2] + lines[3:]))                # an entry lost in the middle
    cache_index._MEMO.clear()                                         # as a new process finds it
    assert _by_index(p) == _by_parsing(p)
    path.write_bytes(b"\n".join(lines)[:-20])                           # a torn last entry (a kill)
    cache_index._MEMO.clear()
    with p.lock():
        assert _by_index(p) == _by_parsing(p)
        with store.JsonlAppender(p.extractions_path) as out:
            out.append(_rec("e"))
        assert _by_index(p) == _by_parsing(p)
    assert len(cache_index.entries(p)) == 5
    path.write_bytes(b"garbage")
    cache_index._MEMO.clear()
    assert _by_index(p) == _by_parsing(p)


def test_a_sampled_check_catches_a_cut_zeroed_or_replaced_cache_and_a_full_one_every_edit(tmp_path: Path) -> None:
    p = _indexed(tmp_path, [f"c{i:03d}" for i in range(200)])       # more records than the sample reads
    data = p.extractions_path.read_bytes()
    cache_index._MEMO.clear()
    assert _by_index(p) == _by_parsing(p)
    for damaged in (b"\0" * len(data), data[: len(data) // 2], b"x" * 10 + data):
        for content in (damaged, data):     # each as a new process finds it
            p.extractions_path.write_bytes(content)
            cache_index._MEMO.clear()
            assert _by_index(p) == _by_parsing(p)
    # the same length, one status changed in a record the sample does not read: only a full check sees it
    lines = data.split(b"\n")
    sampled = {0, 199, *(200 * k // (cache_index._SAMPLES + 1) for k in range(1, cache_index._SAMPLES + 1))}
    i = min(set(range(200)) - sampled)
    lines[i] = lines[i].replace(b'"status":"ok"', b'"status":"no"')
    p.extractions_path.write_bytes(b"\n".join(lines))
    cache_index._MEMO.clear()
    assert cache_index.latest(p)[(f"c{i:03d}", "rules-v1")].status == "ok"
    cache_index.entries(p, full=True)
    assert cache_index.latest(p)[(f"c{i:03d}", "rules-v1")].status == "no" and _by_index(p) == _by_parsing(p)


def test_one_process_reads_the_index_once(tmp_path: Path, monkeypatch) -> None:
    p = _indexed(tmp_path, "abc")
    reads: list[Path] = []
    read = cache_index._read_index
    monkeypatch.setattr(cache_index, "_read_index", lambda path: reads.append(path) or read(path))
    cache_index._MEMO.clear()
    with p.lock():
        cache_index.latest(p)
        with store.JsonlAppender(p.extractions_path) as out:
            out.append(_rec("d"))
        assert _by_index(p) == _by_parsing(p) and len(cache_index.latest(p)) == 4
    assert len(reads) == 1
    cache_index._MEMO.clear()
    assert len(cache_index.entries(p)) == 4 and len(reads) == 2      # what the first process saved
