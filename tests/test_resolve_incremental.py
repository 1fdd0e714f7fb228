"""Resolve after new documents merges only their records into the saved state (resolve_state.py) and patches
the record files (resolve_patch.py): the graph files must equal a fresh build's byte for byte (a record file's
logical lines: its base with its patch applied), whatever happened in between (additions, an edit, a deletion, a damaged or missing state)."""

from __future__ import annotations

import bisect
import dataclasses
import os
import shutil
from pathlib import Path

import orjson
import pytest

from hrag_cli.core import base_patch, jsonl_lines, line_patch, store
from hrag_cli.core.project import ProjectDir

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_corpus"
RECORDS = ("entities_path", "relations_path", "facts_path")
COMPARED = (*RECORDS, "merges_path", "graph_path")


def _index(docs: Path, project: Path, *extra: str) -> str:
    from typer.testing import CliRunner

    from hrag_cli.cli import app

    result = CliRunner().invoke(app, ["index", str(docs), "-p", str(project), "--stop-after", "resolve",
                                      "--chunk-tokens", "120", "--chunk-overlap", "10", *extra],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _files(project: Path) -> dict[str, bytes]:
    """The graph files' bytes; a record file's are its logical lines (base + patch, as a reader sees them)."""
    p = ProjectDir(project)
    return {name: b"".join(store.line_blocks(getattr(p, name))) if name in RECORDS else getattr(p, name).read_bytes()
            for name in COMPARED}


def _same_as_fresh(docs: Path, project: Path, tmp_path: Path, *extra: str) -> None:
    fresh = tmp_path / f"fresh{len(list(tmp_path.glob('fresh*')))}"
    _index(docs, fresh, *extra)
    got, want = _files(project), _files(fresh)
    assert [n for n in COMPARED if got[n] != want[n]] == [], (project, fresh)


def _merged(project: Path) -> int:
    return ProjectDir(project).stage("resolve").counts["records_merged"]


def _add(docs: Path, name: str, text: str) -> None:
    (docs / name).write_text(text, encoding="utf-8")


def test_added_documents_merge_into_the_state_and_equal_a_fresh_build(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from hrag_cli.resolve import state as resolve_state

    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    inc = tmp_path / "inc"
    _index(docs, inc)
    assert ProjectDir(inc).resolve_state_path.is_file()
    # new names, and names the corpus already has (their records and facts change; Hana's display name may)
    lines = {name: {orjson.dumps(r) for r in store.read_jsonl(getattr(ProjectDir(inc), f"{name}_path"))}
             for name in ("entities", "relations", "facts")}      # each record as it was
    _add(docs, "new_a.txt", "Hana Okafor visited Port Ellery in 2001 with the Lantern Archive. "
                            "Quillon Vesk founded the Amberline Guild in Port Ellery.\n")
    _add(docs, "new_b.txt", "HANA OKAFOR met Edric Solano at the Quillon Fair. The Amberline Guild hired Edric Solano.\n")
    before = ProjectDir(inc).stage("resolve").output_digest
    parsed = []
    parse = resolve_state._parse_header
    monkeypatch.setattr(resolve_state, "_parse_header", lambda data: parsed.append(1) or parse(data))
    _index(docs, inc)
    assert _merged(inc) == 2      # one chunk per new document: only their records were merged
    assert len(parsed) == 1       # the state's header, read to decide on the state, is the one its load uses
    monkeypatch.undo()
    _same_as_fresh(docs, inc, tmp_path)
    # what changed, for a later stage to sync only that: exactly the records whose lines differ
    p = ProjectDir(inc)
    changed = orjson.loads((p.graph_dir / "changed_ids.json").read_bytes())
    assert (changed["from"], changed["to"]) == (before, p.stage("resolve").output_digest)
    fresh = ProjectDir(tmp_path / "fresh0")
    for name, path in (("entities", "entities_path"), ("relations", "relations_path"), ("facts", "facts_path")):
        ids = {r["id"] for r in store.read_jsonl(getattr(fresh, path)) if orjson.dumps(r) not in lines[name]}
        assert changed[name] == sorted(ids) and ids, name


def test_a_renamed_entity_remakes_the_old_facts_that_name_it_as_subject_or_object(tmp_path: Path) -> None:
    """A new mention that changes an entity's display name changes every fact naming it, also those of chunks
    the run did not read (found from the entity's sources, not by reading every fact key)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    _add(docs, "a.txt", "Alma Brenner visited Port Ellery.\n")
    _add(docs, "b.txt", "Port Ellery welcomed Casimir Dole.\n")
    inc = tmp_path / "inc"
    _index(docs, inc)
    def objects() -> set[tuple[str, str]]:
        return {(f["subject"], f["object"]) for f in store.read_jsonl(ProjectDir(inc).facts_path)}
    assert ("Alma Brenner", "Port Ellery") in objects()
    _add(docs, "c.txt", "Port ELLERY hosted Dana Frey. Port ELLERY hosted Egon Falk. Port ELLERY hosted Greta Holm. "
                        "Port ELLERY hosted Ivo Jensen.\n")
    _index(docs, inc)
    assert _merged(inc) == 1
    assert {("Alma Brenner", "Port ELLERY"), ("Port ELLERY", "Casimir Dole")} <= objects()
    _same_as_fresh(docs, inc, tmp_path)


def test_an_edit_or_a_deletion_merges_from_scratch_and_the_next_addition_uses_the_state_again(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    inc = tmp_path / "inc"
    _index(docs, inc)
    everything = _merged(inc)
    (docs / "people" / "zoe_almqvist.txt").unlink()                        # delete
    miravel = docs / "places" / "miravel.txt"                               # edit
    miravel.write_text("Miravel also hosts the Quillon Fair, run by Edric Solano.\n\n"
                       + miravel.read_text(encoding="utf-8"), encoding="utf-8")
    _index(docs, inc)
    assert _merged(inc) > everything - 5     # every record again: a chunk's contribution cannot be taken out
    _same_as_fresh(docs, inc, tmp_path)
    assert not (ProjectDir(inc).graph_dir / "changed_ids.json").exists()      # after a merge from scratch: unknown
    _add(docs, "new_a.txt", "Hana Okafor visited Port Ellery in 2001 with the Lantern Archive.\n")
    _index(docs, inc)
    assert _merged(inc) == 1
    _same_as_fresh(docs, inc, tmp_path)


@pytest.mark.parametrize("how", ["truncate", "garbage", "v1"])
def test_a_damaged_state_warns_and_merges_from_scratch(tmp_path: Path, how: str) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    inc = tmp_path / "inc"
    _index(docs, inc)
    state = ProjectDir(inc).resolve_state_path
    data = state.read_bytes()
    state.unlink()          # a new file, not the generation's hard link: as damage on disk would be
    if how == "v1":     # a state of the earlier format: its header frame has no version
        import marshal
        import zlib

        blob = zlib.compress(marshal.dumps({"basis": "x", "offsets": {}, "cache_size": 0, "cache_sum": ""}))
        data = len(blob).to_bytes(8, "little") + blob
    state.write_bytes(data[: len(data) // 2] if how == "truncate" else
                      data if how == "v1" else data[:8] + b"\x00" * (len(data) - 8))
    _add(docs, "new_a.txt", "Hana Okafor visited Port Ellery in 2001 with the Lantern Archive.\n")
    out = _index(docs, inc)
    assert "resolve_state.bin" in out and _merged(inc) > 1
    _same_as_fresh(docs, inc, tmp_path)
    _add(docs, "new_b.txt", "Quillon Vesk founded the Amberline Guild in Port Ellery.\n")
    _index(docs, inc)
    assert _merged(inc) == 1
    _same_as_fresh(docs, inc, tmp_path)


def test_a_schema_is_part_of_the_state(tmp_path: Path) -> None:
    """The rules extractor under a schema: pruned records merge into the state; switching the schema off
    merges from scratch (the state was pruned under it)."""
    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    inc = tmp_path / "inc"
    schema = ("--schema", str(SAMPLE / "schema.toml"))
    _index(docs, inc, *schema)
    _add(docs, "new_a.txt", "Hana Okafor visited Port Ellery in 2001 with the Lantern Archive.\n")
    _index(docs, inc, *schema)
    assert _merged(inc) == 1
    _same_as_fresh(docs, inc, tmp_path, *schema)
    _add(docs, "new_b.txt", "Quillon Vesk founded the Amberline Guild in Port Ellery.\n")
    _index(docs, inc, "--schema", "")
    assert _merged(inc) > 1
    _same_as_fresh(docs, inc, tmp_path, "--schema", "")


def test_llm_records_with_aliases_merge_from_scratch_and_keep_no_state(stub, tmp_path: Path) -> None:
    from tests.test_aliases import DOCS, scripted

    stub.set_chat(scripted)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text(DOCS["a.txt"])
    llm = ("--llm-model", "openai/stub-model", "--llm-api-base", stub.url)
    inc = tmp_path / "inc"
    _index(docs, inc, *llm)
    assert not ProjectDir(inc).resolve_state_path.exists()
    (docs / "b.txt").write_text(DOCS["b.txt"])
    _index(docs, inc, *llm)
    assert not ProjectDir(inc).resolve_state_path.exists() and _merged(inc) == 2
    assert ProjectDir(inc).merges_path.read_bytes()      # the alias joined two names
    _same_as_fresh(docs, inc, tmp_path, *llm)


def test_the_state_reader_calls_every_cut_or_garbled_file_damaged(tmp_path: Path) -> None:
    """What resolve sees when the manifest cannot vouch (the state is read after any check): a cut anywhere or
    garbage is Damaged when the file is opened (header, index at its end) or when the block a key lives in is
    read, never a half-read accumulator; a file of version 1 or 2 is OldFormat."""
    import marshal
    import zlib

    from hrag_cli.resolve import state as resolve_state
    from hrag_cli.resolve.stage import Merged

    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    _index(docs, tmp_path / "p")
    path = ProjectDir(tmp_path / "p").resolve_state_path
    reader = resolve_state.Reader(path)
    assert all(list(reader.keys(s)) for s in resolve_state.SECTIONS)
    data = path.read_bytes()
    for n, bad in enumerate([data[:len(data) - 1], data[:len(data) // 2], data[:20],
                             data[:8] + b"\x00" * (len(data) - 8), b"\x00" * 16, b""]):
        broken = tmp_path / f"broken{n}.bin"
        broken.write_bytes(bad)
        with pytest.raises(resolve_state.Damaged):
            resolve_state.load(broken, Merged)
    key = reader.keys("entities")[0]
    at = reader.index["entities"][1][0] + 20        # a byte inside the first entity block
    flipped = tmp_path / "flipped.bin"
    flipped.write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:])
    merged, _ = resolve_state.load(flipped, Merged)     # header and index are whole
    with pytest.raises(resolve_state.Damaged):
        merged.entities.get(key)
    v1 = tmp_path / "v1.bin"
    blob = zlib.compress(marshal.dumps({"basis": "x", "offsets": {}, "cache_size": 0, "cache_sum": ""}))
    v1.write_bytes(len(blob).to_bytes(8, "little") + blob)
    with pytest.raises(resolve_state.OldFormat):
        resolve_state.read_header(v1)
    blob = zlib.compress(marshal.dumps({"version": 2, "basis": "x", "offsets": {}, "cache_size": 0, "cache_sum": ""}))
    v1.write_bytes(len(blob).to_bytes(8, "little") + blob)      # version 2: sources as chunk ids, whole blocks
    with pytest.raises(resolve_state.OldFormat):
        resolve_state.read_header(v1)


def test_small_additions_write_a_delta_which_the_next_run_replays_until_the_state_is_saved_again(
        tmp_path: Path) -> None:
    """A few new chunks leave resolve_state.bin as it was and list themselves in resolve_delta.json; the next
    run merges the delta's records again before its own, and once the delta passes `base_patch.RESOLVE_STATE` of the state's
    chunks the state is saved whole. Every step equals a fresh build; a delta that does not parse is damage."""
    from hrag_cli.resolve import state as resolve_state

    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    inc = tmp_path / "inc"
    _index(docs, inc)
    p = ProjectDir(inc)
    state_bytes = p.resolve_state_path.read_bytes()
    chunks = len(resolve_state.read_header(p.resolve_state_path)[0].offsets)
    fits = int(base_patch.RESOLVE_STATE.share * chunks)
    assert fits >= 2, chunks
    texts = ["Hana Okafor visited Port Ellery in 2001 with the Lantern Archive.\n",
             "Quillon Vesk founded the Amberline Guild in Port Ellery.\n",
             "HANA OKAFOR met Edric Solano at the Quillon Fair.\n",
             "The Amberline Guild hired Edric Solano in Miravel.\n"]
    for n, text in enumerate(texts[:fits], start=1):
        _add(docs, f"new_{n}.txt", text)
        _index(docs, inc)
        p = ProjectDir(inc)
        assert _merged(inc) == 1
        assert p.resolve_state_path.read_bytes() == state_bytes
        delta = resolve_state.read_delta(p.resolve_state_path, resolve_state.read_header(p.resolve_state_path)[0])
        assert delta is not None and len(delta.offsets) == n
    _same_as_fresh(docs, inc, tmp_path)
    for n in range(fits + 1, chunks):      # past the share: saved whole, no delta
        _add(docs, f"new_{n}.txt", f"Orvan Pell{n} sailed from Port Ellery to Miravel.\n")
        _index(docs, inc)
        if not resolve_state.delta_path(ProjectDir(inc).resolve_state_path).exists():
            break
    assert _merged(inc) == 1 and ProjectDir(inc).resolve_state_path.read_bytes() != state_bytes
    _add(docs, "late.txt", texts[-1])
    _index(docs, inc)
    _same_as_fresh(docs, inc, tmp_path)     # a delta over the state saved again
    delta = resolve_state.delta_path(ProjectDir(inc).resolve_state_path)
    data = delta.read_bytes()
    delta.unlink()          # damage on disk: a new file, not the generation's hard link
    delta.write_bytes(data[: len(data) // 2])
    _add(docs, "later.txt", "Edric Solano left the Quillon Fair.\n")
    out = _index(docs, inc)
    assert "resolve_delta.json" in out and _merged(inc) > 2
    _same_as_fresh(docs, inc, tmp_path)


def test_a_keyed_state_reads_only_the_blocks_of_the_keys_asked_for_and_a_fold_equals_a_save(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded state reads nothing but its header and index; a key is read from its one block, as its saved
    tuple, and a key the state lacks is `absent`. Writing it again after a merge (fold) copies the blocks no
    merged key falls in as their bytes and holds what a save of every accumulator holds."""
    from hrag_cli.resolve import state as resolve_state
    from hrag_cli.resolve.stage import Merged
    from hrag_cli.resolve.merge_records import _EntityAcc, live

    monkeypatch.setattr(resolve_state, "BLOCK", dict.fromkeys(resolve_state.SECTIONS, 4))     # many blocks from the sample corpus
    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    _index(docs, tmp_path / "p")
    path = ProjectDir(tmp_path / "p").resolve_state_path
    merged, _ = resolve_state.load(path, Merged)
    reader = merged.entities.reader
    assert len(reader.index["entities"][0]) > 10 and not reader._keys and not reader._fields
    keys = list(reader.keys("entities"))
    rels = reader.keys("relations")     # reading keys fills no block cache
    one = next(k for k in keys[4:12] if any(k in pair for pair in rels))   # in block 1 or 2, with a relation
    saved = merged.entities.get(one)
    assert type(saved) is tuple and saved[0] == one and len(reader._fields) == 1
    new_key = keys[0] + "\x00"      # sorts into the first block
    assert merged.entities.get("no such entity") is None and "no such entity" in merged.entities.absent
    assert len(reader._fields) == 1     # an absent key reads its block's keys only
    read = dict(reader._keys)           # a relation or fact of an entity the state lacks is not looked up
    pair = min(k for k in reader.keys("relations") if k[0] == one or k[1] == one)
    gone = tuple(sorted((one, "no such entity")))
    assert merged.relations.get(gone) is None and merged.facts.get((gone[0], "knows", gone[1])) is None
    assert reader._keys == read and merged.relations.get(pair)[0] == pair
    acc = live(merged.entities, one, _EntityAcc)     # touched: its accumulator changes
    acc.names["Someone Else"] = 7
    new_chunk = "0" * 32        # a chunk merged since: numbered after the saved ones, though it sorts first
    assert new_chunk not in reader.header.offsets and new_chunk < min(reader.chunks)
    acc.sources.insert(0, new_chunk)
    created = merged.entities[new_key] = _EntityAcc()
    created.sources.append(new_chunk)
    merged.entities.absent.add(new_key)
    assert merged.totals()["entities"] == len(keys) + 1
    every = sorted([*keys, new_key])
    assert merged.entities.ranks(every) == list(range(len(every)))
    rels = reader.keys("relations")     # pairs whose parts hold NUL rank as the tuples sort, not as joined
    odd = [(k[0] + "\x00", "") for k in rels[::7]] + [(k[0], k[1] + "\x00") for k in rels[::5]]
    assert reader.ranks("relations", odd) == [bisect.bisect_left(rels, k) for k in odd]
    header = reader.header
    header.counts = merged.totals()
    header.offsets = {**header.offsets, new_chunk: 1 << 40}
    folded = tmp_path / "folded.bin"
    resolve_state.fold(folded, header, merged)
    data, out = path.read_bytes(), folded.read_bytes()
    copied = [reader.block_bytes("entities", b) for b in range(3, len(reader.index["entities"][1]))]   # past the touched block
    assert all(f in out for f in copied)
    again = resolve_state.Reader(folded)
    def items(r: resolve_state.Reader, s: str) -> list[tuple]:
        return [r.find(s, k) for k in r.keys(s)]

    whole = {s: items(reader, s) for s in resolve_state.SECTIONS}
    whole["entities"] = sorted([*(t for t in whole["entities"] if t[0] != one), acc.item(one),
                                created.item(new_key)])
    assert again.chunks == [*reader.chunks, new_chunk]      # the saved numbers kept: copied blocks stay right
    assert again.find("entities", one) == acc.item(one) and acc.item(one)[4][0] == new_chunk
    assert again.find("entities", new_key)[4] == [new_chunk]
    at = again.index["entities"][1]
    # a key with a NUL in it: its block keeps the list; an untouched block, copied, keeps its one string
    assert again._frame(at[bisect.bisect_right(again.index["entities"][0], new_key) - 1]).__class__ is list
    assert again._frame(at[-1]).__class__ is str
    first_copied = reader.index["entities"][0][3]
    assert again.find("entities", first_copied) == reader.find("entities", first_copied)
    assert {s: items(again, s) for s in resolve_state.SECTIONS} == whole
    assert again.header.counts == header.counts and data != out
    # a save of the same accumulators (its chunks numbered afresh, every block written) reads back the same
    plain = Merged()
    for s in resolve_state.SECTIONS:
        setattr(plain, s, {t[0]: t for t in whole[s]})
    plain.records, plain.dropped_rows, plain.self_loops, plain.inexact = (
        merged.records, merged.dropped_rows, merged.self_loops, merged.inexact)
    saved = tmp_path / "saved.bin"
    resolve_state.save(saved, dataclasses.replace(header), plain, resolve_state.sorted_keys(plain))
    resaved = resolve_state.Reader(saved)
    assert {s: items(resaved, s) for s in resolve_state.SECTIONS} == whole
    same = ("basis", "offsets", "unknown", "records", "dropped_rows", "self_loops", "inexact")
    assert {k: resaved._raw[k] for k in same} == {k: again._raw[k] for k in same}


def test_a_version_3_state_reads_as_the_same_accumulators_and_additions_merge_into_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Version 4 keeps a block's keys as one string (a key a line, NUL between a key's parts) and its
    accumulators in frames of about FIELDS[s]; a version 3 file (the keys as a list, one fields frame a block)
    reads as the same accumulators and ranks, and a run after additions merges into it like a fresh build."""
    from hrag_cli.resolve import state as rs

    monkeypatch.setattr(rs, "FIELDS", dict.fromkeys(rs.SECTIONS, 5))
    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    inc = tmp_path / "inc"
    _index(docs, inc)
    p = ProjectDir(inc)
    new = rs.Reader(p.resolve_state_path)
    blocks = [(s, b) for s in rs.SECTIONS for b in range(len(new.index[s][1]))]
    assert all(new._frame(new.index[s][1][b]).__class__ is str for s, b in blocks)
    parts = [len(new._fields_spans(s, b)) for s, b in blocks]
    assert parts == [-(-new.index[s][2][b] // 5) for s, b in blocks] and max(parts) > 1
    monkeypatch.setattr(rs, "_keys_value", lambda keys: keys)
    monkeypatch.setattr(rs, "FIELDS", dict.fromkeys(rs.SECTIONS, 1 << 30))
    v3_path = tmp_path / "v3.bin"
    with store.atomic_writer(v3_path) as fh:
        w = rs._Writer(fh, {})
        w.frame({**new._raw, "version": 3})
        for s, b in blocks:
            w.block(s, new.block_keys(s, b), new.block_fields(s, b))
        w.finish()
    monkeypatch.undo()
    v3 = rs.Reader(v3_path)
    assert all(len(v3._fields_spans(s, b)) == 1 and v3._frame(v3.index[s][1][b]).__class__ is list
               for s, b in blocks)
    for s in rs.SECTIONS:
        keys = new.keys(s)
        assert v3.keys(s) == keys and [v3.find(s, k) for k in keys] == [new.find(s, k) for k in keys]
        assert v3.ranks(s, keys) == new.ranks(s, keys) == list(range(len(keys)))
    # as the project's state (recorded as the last run left it): an addition merges into it, and the state
    # written again (a fold) copies the version 3 blocks it did not touch beside version 4 ones
    os.replace(v3_path, p.resolve_state_path)
    rec = p.stage("resolve")
    p.record_stage("resolve", rec.fingerprint, rec.output_digest, rec.counts)
    monkeypatch.setattr(base_patch, "RESOLVE_STATE", base_patch.FoldShare(0.0))
    _add(docs, "new_a.txt", "Hana Okafor visited Port Ellery in 2001 with the Lantern Archive.\n")
    _index(docs, inc)
    assert _merged(inc) == 1
    _same_as_fresh(docs, inc, tmp_path)
    mixed = rs.Reader(ProjectDir(inc).resolve_state_path)
    kinds = {mixed._frame(mixed.index[s][1][b]).__class__ for s in rs.SECTIONS
             for b in range(len(mixed.index[s][1]))}
    assert kinds == {list, str} and mixed._raw["version"] == rs.STATE_VERSION
    _add(docs, "new_b.txt", "Quillon Vesk founded the Amberline Guild in Port Ellery.\n")
    _index(docs, inc)
    assert _merged(inc) == 1
    _same_as_fresh(docs, inc, tmp_path)


@pytest.mark.parametrize("fold", [False, True])
def test_additions_patch_the_record_files_and_a_patch_past_its_share_folds_into_a_new_base(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fold: bool) -> None:
    """Two additions in a row: the bases stay as the full build wrote them and each file's patch holds every
    line they no longer have (the second patch carries the first one's lines on); past `base_patch.RECORD_FILES`
    the file is written whole, with no patch. Either way the logical files equal a fresh build's."""
    monkeypatch.setattr(base_patch, "RECORD_FILES", base_patch.FoldShare(0.0 if fold else 1.0))
    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    inc = tmp_path / "inc"
    _index(docs, inc)
    p = ProjectDir(inc)
    bases = {name: getattr(p, name).read_bytes() for name in RECORDS}
    _add(docs, "new_a.txt", "Hana Okafor visited Port Ellery in 2001 with the Lantern Archive.\n")
    _index(docs, inc)
    _add(docs, "new_b.txt", "HANA OKAFOR met Edric Solano at the Quillon Fair. Quillon Vesk founded Miravel.\n")
    _index(docs, inc)
    p = ProjectDir(inc)
    for name in RECORDS:
        path = getattr(p, name)
        assert line_patch.patch_path(path).exists() is not fold, name
        assert (path.read_bytes() == bases[name]) is not fold, name
    assert p.check() == []
    _same_as_fresh(docs, inc, tmp_path)


def test_a_damaged_or_missing_patch_is_caught_and_the_next_index_restores_the_records(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    inc = tmp_path / "inc"
    _index(docs, inc)
    _add(docs, "new_a.txt", "Hana Okafor visited Port Ellery in 2001 with the Lantern Archive.\n")
    _index(docs, inc)
    pristine = tmp_path / "pristine"        # each damage starts from the patched project
    shutil.copytree(inc, pristine, symlinks=True)
    p = ProjectDir(inc)
    want = list(store.read_jsonl(p.entities_path))
    data = line_patch.patch_path(p.entities_path).read_bytes()
    for damage in (data[:len(data) // 2], b"", None):
        shutil.rmtree(inc)
        shutil.copytree(pristine, inc, symlinks=True)
        patch = line_patch.patch_path(ProjectDir(inc).entities_path)
        assert patch.read_bytes() == data
        if damage is None:
            patch.unlink()
        else:
            patch.write_bytes(damage)
            with pytest.raises(line_patch.PatchError):
                jsonl_lines.JsonlLines(ProjectDir(inc).entities_path)
        assert [x.path for x in ProjectDir(inc).check()] == ["graph/entities.patch"]
        _index(docs, inc)
        assert list(store.read_jsonl(ProjectDir(inc).entities_path)) == want
        assert ProjectDir(inc).check() == []
