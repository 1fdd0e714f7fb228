"""The JSONL store and atomic writes: what every artifact's crash safety rests on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hrag_cli.core import jsonl_lines, line_patch, store


def test_append_and_read_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "c" / "x.jsonl"
    with store.JsonlAppender(path) as app:
        for i in range(5):
            app.append({"i": i, "s": "ünï\n\"q\""})
    assert [r["i"] for r in store.read_jsonl(path)] == list(range(5))
    assert list(store.read_jsonl(path))[0]["s"] == "ünï\n\"q\""


def test_torn_tail_is_skipped_then_cut_before_next_append(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    with store.JsonlAppender(path) as app:
        app.append({"i": 0})
        app.append({"i": 1})
    with open(path, "ab") as fh:           # a writer killed mid-line
        fh.write(b'{"i": 2, "tru')
    assert [r["i"] for r in store.read_jsonl(path)] == [0, 1]
    with store.JsonlAppender(path) as app:  # reopening repairs the tail
        app.append({"i": 3})
    assert [r["i"] for r in store.read_jsonl(path)] == [0, 1, 3]
    assert path.read_bytes().endswith(b"\n")


def test_torn_tail_without_any_newline(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"half"')
    assert list(store.read_jsonl(path)) == []
    assert store.repair_tail(path) == len(b'{"half"')
    assert path.read_bytes() == b""


def test_corrupt_middle_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"i": 0}\nnot json\n{"i": 2}\n')
    assert [r["i"] for r in store.read_jsonl(path)] == [0, 2]


def test_offsets_read_back_the_records_at_them(tmp_path: Path) -> None:
    """read_jsonl_at reads the records whose lines start at the given offsets, in the order given."""
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"i": 0}\n{"i": "\xc3\xbc"}\n{"i": 2}\n')
    assert list(store.read_jsonl_at(path, [len(b'{"i": 0}\n{"i": "\xc3\xbc"}\n'), 9, 0])) == [{"i": 2}, {"i": "ü"}, {"i": 0}]


def test_missing_file_reads_empty(tmp_path: Path) -> None:
    assert list(store.read_jsonl(tmp_path / "nope.jsonl")) == []
    assert store.read_json(tmp_path / "nope.json", default={"a": 1}) == {"a": 1}


def test_atomic_write_leaves_old_file_on_failure(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    store.write_jsonl(path, [{"v": 1}])

    def bad():
        yield {"v": 2}
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        store.write_jsonl(path, bad())
    assert list(store.read_jsonl(path)) == [{"v": 1}]
    assert [p.name for p in tmp_path.iterdir()] == ["a.jsonl"]  # no temp file left behind


def test_write_json_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    store.write_json(path, {"b": 1, "a": [1, 2]})
    assert store.read_json(path) == {"a": [1, 2], "b": 1}
    store.atomic_write_text(path, "{}")
    assert store.read_json(path) == {}
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_fsync_appender(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    with store.JsonlAppender(path, fsync=True) as app:
        app.append({"ok": True})
    assert os.path.getsize(path) > 0
    assert list(store.read_jsonl(path)) == [{"ok": True}]


def test_appender_without_lock_never_truncates(tmp_path: Path) -> None:
    """A second process (a query) appending while a writer may be mid-line must not cut that line off."""
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"i": 0}\n{"i": 1, "half')
    with store.JsonlAppender(path, exclusive=False) as app:
        app.append({"i": 2})
        app.append({"i": 3})
    assert path.read_bytes().startswith(b'{"i": 0}\n{"i": 1, "half\n')
    assert [r["i"] for r in store.read_jsonl(path)] == [0, 2, 3]


def test_append_returns_where_the_record_is(tmp_path: Path) -> None:
    """The offset an append returns reads that record back, after a torn tail cut or skipped, and on reopening."""
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"i": 0}\n{"i": 1, "half')
    at = []
    with store.JsonlAppender(path, exclusive=False) as app:
        at += [app.append({"i": 2}), app.append({"i": 3})]
    with store.JsonlAppender(path) as app:
        at.append(app.append({"i": 4, "s": "ünï"}))
    assert [r["i"] for r in store.read_jsonl_at(path, at)] == [2, 3, 4]


def test_compressed_jsonl_reads_like_plain_and_a_cut_one_ends_cleanly(tmp_path: Path) -> None:
    import gzip

    recs = [{"i": i, "s": "the same sentence, again and again " * 3} for i in range(3000)]
    plain, packed = tmp_path / "plain.jsonl", tmp_path / "packed.jsonl"
    assert store.write_jsonl(plain, recs) == store.write_jsonl(packed, iter(recs), compress=True) == 3000
    assert list(store.read_jsonl(packed)) == list(store.read_jsonl(plain)) == recs
    assert packed.stat().st_size < plain.stat().st_size / 10
    assert gzip.decompress(packed.read_bytes()) == plain.read_bytes()      # what `zcat` shows
    store.write_jsonl(tmp_path / "again.jsonl", recs, compress=True)
    assert (tmp_path / "again.jsonl").read_bytes() == packed.read_bytes()  # same records, same bytes
    data = packed.read_bytes()
    packed.write_bytes(data[: len(data) // 2])                             # cut: whole lines up to the break
    got = list(store.read_jsonl(packed))
    assert 0 < len(got) < 3000 and got == recs[: len(got)]
    packed.write_bytes(data[:10] + b"\0" * 64 + data[74:])                 # damaged: no exception either
    got = list(store.read_jsonl(packed))
    assert got == recs[: len(got)]


def test_line_blocks_give_the_whole_lines_of_plain_compressed_and_multi_member_files(tmp_path: Path) -> None:
    """What resolve_patch copies in runs: every whole line once, in order, whichever way the file was written
    (gzip members may split a line; a torn tail is left out)."""
    import zlib

    raw = b"".join(b'{"i":%d}\n' % i for i in range(30000))

    def gz(data: bytes) -> bytes:
        c = zlib.compressobj(1, wbits=31)
        return c.compress(data) + c.flush()

    forms = {"plain.jsonl": raw + b'{"torn"', "one.jsonl": gz(raw),
             "members.jsonl": b"".join(gz(raw[i:i + 70001]) for i in range(0, len(raw), 70001)) + gz(b"")}
    for name, data in forms.items():
        (tmp_path / name).write_bytes(data)
        blocks = list(store.line_blocks(tmp_path / name))
        assert b"".join(blocks) == raw and all(b.endswith(b"\n") for b in blocks), name
    assert list(store.line_blocks(tmp_path / "none.jsonl")) == []


def test_compressed_jsonl_lines_are_read_one_member_at_a_time(tmp_path: Path) -> None:
    """A compressed file's line index lets JsonlLines read line i by decompressing the one member holding it;
    a file cut short (the index gone) or with a damaged member still reads right, through the slow path or
    as a missing line, never as another line's record."""
    recs = [{"id": f"r{i}", "text": f"line {i} " + "word " * (i % 50)} for i in range(20000)]
    path = tmp_path / "recs.jsonl"
    store.write_jsonl(path, recs, compress=True)
    lines = jsonl_lines.JsonlLines(path)
    assert lines._members is not None and len(lines._members[0]) > 10 and len(lines) == len(recs)
    for i in (0, 1, 4999, 12345, 19999):
        assert lines.record(i) == recs[i]
    assert lines.record(20000) is None and lines.record(-1) is None and len(lines._cache) <= 5
    assert lines.all() == recs
    data = path.read_bytes()
    path.write_bytes(data[:-5])                                              # the index's end is cut off
    cut = jsonl_lines.JsonlLines(path)
    assert cut._members is None and cut.record(12345) == recs[12345]
    path.write_bytes(data)
    m = jsonl_lines.JsonlLines(path)._members
    at = int(m[0][3]) + 40
    path.write_bytes(data[:at] + bytes(32) + data[at + 32:])                  # member 3 damaged, same size
    bad = jsonl_lines.JsonlLines(path)
    assert bad.record(int(m[1][3])) is None and bad.record(int(m[1][4])) == recs[int(m[1][4])]
    for size in (1, 2**32 - 1):      # a member's length field (which sizes the output buffer) damaged
        end = int(m[0][4]) - 4
        path.write_bytes(data[:end] + size.to_bytes(4, "little") + data[end + 4:])
        bad = jsonl_lines.JsonlLines(path)
        assert bad.record(int(m[1][3])) is None and bad.record(int(m[1][4])) == recs[int(m[1][4])]
    store.write_jsonl(path, [], compress=True)
    assert len(jsonl_lines.JsonlLines(path)) == 0 and list(store.read_jsonl(path)) == []


def test_lines_handed_over_in_runs_write_the_same_bytes_and_line_index(tmp_path: Path) -> None:
    """resolve_patch hands write_jsonl untouched runs of lines as one orjson.Fragment: the compressed file must
    be byte for byte the one a record per line gives, so its line index names the right lines."""
    import orjson

    recs = [{"id": f"r{i}", "text": "word " * (i % 40)} for i in range(9000)]
    lines = [orjson.dumps(r) for r in recs]
    runs = [orjson.Fragment(b"\n".join(lines[i:i + 700])) for i in range(0, len(lines), 700)]
    one, ran = tmp_path / "one.jsonl", tmp_path / "ran.jsonl"
    assert store.write_jsonl(one, recs, compress=True) == store.write_jsonl(ran, runs, compress=True) == 9000
    assert one.read_bytes() == ran.read_bytes()
    assert jsonl_lines.JsonlLines(ran).record(8123) == recs[8123]


@pytest.mark.parametrize("compress", [False, True])
def test_extending_a_file_gives_the_bytes_of_writing_it_whole(tmp_path: Path, compress: bool) -> None:
    recs = [{"i": i, "t": "x" * (i * 37 % 900)} for i in range(400)]      # several 64 KiB members
    whole, grown = tmp_path / "whole.jsonl", tmp_path / "grown.jsonl"
    store.write_jsonl(whole, recs, compress=compress)
    for cut in (0, 1, 250, 399):
        store.write_jsonl(grown, recs[:cut], compress=compress)
        assert store.extend_jsonl(grown, iter(recs[cut:])) == len(recs) - cut
        assert grown.read_bytes() == whole.read_bytes(), cut
    for n in (0, 1, 7, 400):
        assert [store.loads(line) for line in store.last_lines(whole, n)] == recs[len(recs) - n:]
    assert store.last_lines(whole, 401) is None
    assert store.extend_jsonl(tmp_path / "missing.jsonl", recs) is None
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(whole.read_bytes()[:-10])
    assert store.extend_jsonl(torn, recs) is None and store.last_lines(torn, 1) is None   # never built on a torn file


@pytest.mark.parametrize("compress", [False, True])
def test_a_patch_reads_as_the_logical_file_through_every_reader(tmp_path: Path, compress: bool) -> None:
    """A base plus a patch (lines replaced by base row, lines inserted by logical row) reads as the file written
    whole with those lines: random access, iteration, blocks, all. A patch of another base, or damaged, is a
    PatchError; writing the file whole drops its patch; appending refuses a patched file."""
    import random

    path = tmp_path / "x.jsonl"
    base = [{"id": f"k{i:05d}", "v": "x" * (i % 50)} for i in range(0, 6000, 2)]
    store.write_jsonl(path, base, compress=compress)
    rng = random.Random(3)
    logical = {r["id"]: r for r in base}
    replaced = {base[b]["id"] for b in rng.sample(range(len(base)), 90)}
    inserted = {f"k{k:05d}" for k in rng.sample(range(1, 6000, 2), 60)} | {"k99999", "a"}
    for k in replaced | inserted:
        logical[k] = {"id": k, "v": "patched"}
    keys = sorted(logical)
    at = {r["id"]: i for i, r in enumerate(base)}
    changed = [(row, k) for row, k in enumerate(keys) if k in replaced | inserted]
    patch = line_patch.LinePatch([row for row, _ in changed], [at.get(k, -1) for _, k in changed],
                        [store.dumps(logical[k]) + b"\n" for _, k in changed], len(base), *line_patch.base_mark(path), "b0")
    store.write_patch(path, patch)
    want = [logical[k] for k in keys]
    lines = jsonl_lines.JsonlLines(path)
    assert len(lines) == len(want) and [lines.record(i) for i in range(len(want))] == want
    assert lines.raw(len(want)) is None and lines.all() == want
    rows, raws = lines.patch_lines()                          # the changed lines alone, at their logical rows
    assert rows.tolist() == [row for row, _ in changed] and raws == [lines.raw(row) for row, _ in changed]
    assert [store.loads(r)["id"] for r in raws] == [k for _, k in changed]
    assert list(store.read_jsonl(path)) == want
    assert b"".join(store.line_blocks(path)) == b"".join(store.dumps(r) + b"\n" for r in want)
    assert store.last_lines(path, 1) is None and store.extend_jsonl(path, [{"id": "z"}]) is None
    raw = line_patch.patch_path(path).read_bytes()
    for bad in (raw[:-3], raw[:40], raw[:-1] + b"x"):       # cut, cut in its header, a last line torn
        line_patch.patch_path(path).write_bytes(bad)
        with pytest.raises(line_patch.PatchError):
            list(store.read_jsonl(path))
    line_patch.patch_path(path).write_bytes(raw)
    store.write_jsonl(path, base[:-1], compress=compress, base=True)    # a base written whole: its patch goes
    assert not line_patch.patch_path(path).exists() and list(store.read_jsonl(path)) == base[:-1]
    assert jsonl_lines.JsonlLines(path).patch_lines() is None
    line_patch.patch_path(path).write_bytes(raw)                   # a patch of another base
    with pytest.raises(line_patch.PatchError):
        jsonl_lines.JsonlLines(path)
