"""Resolve after new documents merges only their records into the saved state (resolve_state.py) and patches
the record files (resolve_patch.py): the graph files must equal a fresh build's byte for byte (a record file's
logical lines: its base with its patch applied), whatever happened in between (additions, an edit, a deletion, a damaged or missing state)."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from hrag_cli import store
from hrag_cli.project import Project

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
    p = Project(project)
    return {name: b"".join(store.line_blocks(getattr(p, name))) if name in RECORDS else getattr(p, name).read_bytes()
            for name in COMPARED}


def _same_as_fresh(docs: Path, project: Path, tmp_path: Path, *extra: str) -> None:
    fresh = tmp_path / f"fresh{len(list(tmp_path.glob('fresh*')))}"
    _index(docs, fresh, *extra)
    got, want = _files(project), _files(fresh)
    assert [n for n in COMPARED if got[n] != want[n]] == [], (project, fresh)


def _merged(project: Path) -> int:
    return Project(project).stage("resolve").counts["records_merged"]


def _add(docs: Path, name: str, text: str) -> None:
    (docs / name).write_text(text, encoding="utf-8")


def test_added_documents_merge_into_the_state_and_equal_a_fresh_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    inc = tmp_path / "inc"
    _index(docs, inc)
    assert Project(inc).resolve_state_path.is_file()
    # new names, and names the corpus already has (their records and facts change; Hana's display name may)
    lines = {name: {orjson.dumps(r) for r in store.read_jsonl(getattr(Project(inc), f"{name}_path"))}
             for name in ("entities", "relations", "facts")}      # each record as it was
    _add(docs, "new_a.txt", "Hana Okafor visited Port Ellery in 2001 with the Lantern Archive. "
                            "Quillon Vesk founded the Amberline Guild in Port Ellery.\n")
    _add(docs, "new_b.txt", "HANA OKAFOR met Edric Solano at the Quillon Fair. The Amberline Guild hired Edric Solano.\n")
    before = Project(inc).stage("resolve").output_digest
    _index(docs, inc)
    assert _merged(inc) == 2      # one chunk per new document: only their records were merged
    _same_as_fresh(docs, inc, tmp_path)
    # what changed, for a later stage to sync only that: exactly the records whose lines differ
    p = Project(inc)
    changed = orjson.loads((p.graph_dir / "changed_ids.json").read_bytes())
    assert (changed["from"], changed["to"]) == (before, p.stage("resolve").output_digest)
    fresh = Project(tmp_path / "fresh0")
    for name, path in (("entities", "entities_path"), ("relations", "relations_path"), ("facts", "facts_path")):
        ids = {r["id"] for r in store.read_jsonl(getattr(fresh, path)) if orjson.dumps(r) not in lines[name]}
        assert changed[name] == sorted(ids) and ids, name


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
    assert not (Project(inc).graph_dir / "changed_ids.json").exists()      # after a merge from scratch: unknown
    _add(docs, "new_a.txt", "Hana Okafor visited Port Ellery in 2001 with the Lantern Archive.\n")
    _index(docs, inc)
    assert _merged(inc) == 1
    _same_as_fresh(docs, inc, tmp_path)


@pytest.mark.parametrize("how", ["truncate", "garbage"])
def test_a_damaged_state_warns_and_merges_from_scratch(tmp_path: Path, how: str) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    inc = tmp_path / "inc"
    _index(docs, inc)
    state = Project(inc).resolve_state_path
    data = state.read_bytes()
    state.unlink()          # a new file, not the generation's hard link: as damage on disk would be
    state.write_bytes(data[: len(data) // 2] if how == "truncate" else data[:8] + b"\x00" * (len(data) - 8))
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
    assert not Project(inc).resolve_state_path.exists()
    (docs / "b.txt").write_text(DOCS["b.txt"])
    _index(docs, inc, *llm)
    assert not Project(inc).resolve_state_path.exists() and _merged(inc) == 2
    assert Project(inc).merges_path.read_bytes()      # the alias joined two names
    _same_as_fresh(docs, inc, tmp_path, *llm)


def test_the_state_reader_calls_every_cut_or_garbled_file_damaged(tmp_path: Path) -> None:
    """What resolve sees when the manifest cannot vouch (the state is read after any check): a cut at any
    frame boundary or inside one, or garbage, is Damaged, never a half-loaded state."""
    from hrag_cli import resolve_state
    from hrag_cli.resolve import Merged

    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    _index(docs, tmp_path / "p")
    path = Project(tmp_path / "p").resolve_state_path
    merged, _ = resolve_state.load(path, Merged)
    assert merged.entities and merged.mentions
    data = path.read_bytes()
    for n, bad in enumerate([data[:len(data) - 1], data[:len(data) // 2], data[:20],
                             data[:8] + b"\x00" * (len(data) - 8), b"\x00" * 16]):
        broken = tmp_path / f"broken{n}.bin"
        broken.write_bytes(bad)
        with pytest.raises(resolve_state.Damaged):
            resolve_state.load(broken, Merged)


def test_small_additions_write_a_delta_which_the_next_run_replays_until_the_state_is_saved_again(
        tmp_path: Path) -> None:
    """A few new chunks leave resolve_state.bin as it was and list themselves in resolve_delta.json; the next
    run merges the delta's records again before its own, and once the delta passes RESAVE_SHARE of the state's
    chunks the state is saved whole. Every step equals a fresh build; a delta that does not parse is damage."""
    from hrag_cli import resolve_state

    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    inc = tmp_path / "inc"
    _index(docs, inc)
    p = Project(inc)
    state_bytes = p.resolve_state_path.read_bytes()
    chunks = len(resolve_state.read_header(p.resolve_state_path).offsets)
    fits = int(resolve_state.RESAVE_SHARE * chunks)
    assert fits >= 2, chunks
    texts = ["Hana Okafor visited Port Ellery in 2001 with the Lantern Archive.\n",
             "Quillon Vesk founded the Amberline Guild in Port Ellery.\n",
             "HANA OKAFOR met Edric Solano at the Quillon Fair.\n",
             "The Amberline Guild hired Edric Solano in Miravel.\n"]
    for n, text in enumerate(texts[:fits], start=1):
        _add(docs, f"new_{n}.txt", text)
        _index(docs, inc)
        p = Project(inc)
        assert _merged(inc) == 1
        assert p.resolve_state_path.read_bytes() == state_bytes
        delta = resolve_state.read_delta(p.resolve_state_path, resolve_state.read_header(p.resolve_state_path))
        assert delta is not None and len(delta.offsets) == n
    _same_as_fresh(docs, inc, tmp_path)
    for n in range(fits + 1, chunks):      # past the share: saved whole, no delta
        _add(docs, f"new_{n}.txt", f"Orvan Pell{n} sailed from Port Ellery to Miravel.\n")
        _index(docs, inc)
        if not resolve_state.delta_path(Project(inc).resolve_state_path).exists():
            break
    assert _merged(inc) == 1 and Project(inc).resolve_state_path.read_bytes() != state_bytes
    _add(docs, "late.txt", texts[-1])
    _index(docs, inc)
    _same_as_fresh(docs, inc, tmp_path)     # a delta over the state saved again
    delta = resolve_state.delta_path(Project(inc).resolve_state_path)
    data = delta.read_bytes()
    delta.unlink()          # damage on disk: a new file, not the generation's hard link
    delta.write_bytes(data[: len(data) // 2])
    _add(docs, "later.txt", "Edric Solano left the Quillon Fair.\n")
    out = _index(docs, inc)
    assert "resolve_delta.json" in out and _merged(inc) > 2
    _same_as_fresh(docs, inc, tmp_path)


def test_a_loaded_state_keeps_untouched_keys_as_saved_tuples_and_saves_them_back_unchanged(tmp_path: Path) -> None:
    """resolve_state.load makes no accumulator object (a saved tuple stays one until a merge touches its key:
    resolve_records.live); saving such a state writes what was loaded."""
    from hrag_cli import resolve_state
    from hrag_cli.resolve import Merged
    from hrag_cli.resolve_records import _EntityAcc, _FactAcc, _RelationAcc, live

    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    _index(docs, tmp_path / "p")
    path = Project(tmp_path / "p").resolve_state_path
    merged, unknown = resolve_state.load(path, Merged)
    sections = ((merged.entities, _EntityAcc), (merged.relations, _RelationAcc), (merged.facts, _FactAcc))
    assert all(type(v) is tuple for accs, _ in sections for v in accs.values())
    for accs, cls in sections:                  # touch one key of each section
        key = next(iter(accs))
        saved = accs[key]
        acc = live(accs, key, cls)
        assert type(acc) is cls and accs[key] is acc and acc.item(key) == saved
    header = resolve_state.read_header(path)
    header.unknown = unknown
    again = tmp_path / "again.bin"
    resolve_state.save(again, header, merged, resolve_state.sorted_keys(merged))
    back, _ = resolve_state.load(again, Merged)
    first, _ = resolve_state.load(path, Merged)
    for name in ("entities", "relations", "facts", "mentions", "records", "inexact"):
        assert getattr(back, name) == getattr(first, name), name


@pytest.mark.parametrize("fold", [False, True])
def test_additions_patch_the_record_files_and_a_patch_past_its_share_folds_into_a_new_base(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fold: bool) -> None:
    """Two additions in a row: the bases stay as the full build wrote them and each file's patch holds every
    line they no longer have (the second patch carries the first one's lines on); past FOLD_SHARE the file is
    written whole, with no patch. Either way the logical files equal a fresh build's."""
    from hrag_cli import resolve_patch

    monkeypatch.setattr(resolve_patch, "FOLD_SHARE", 0.0 if fold else 1.0)
    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    inc = tmp_path / "inc"
    _index(docs, inc)
    p = Project(inc)
    bases = {name: getattr(p, name).read_bytes() for name in RECORDS}
    _add(docs, "new_a.txt", "Hana Okafor visited Port Ellery in 2001 with the Lantern Archive.\n")
    _index(docs, inc)
    _add(docs, "new_b.txt", "HANA OKAFOR met Edric Solano at the Quillon Fair. Quillon Vesk founded Miravel.\n")
    _index(docs, inc)
    p = Project(inc)
    for name in RECORDS:
        path = getattr(p, name)
        assert store.patch_path(path).exists() is not fold, name
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
    p = Project(inc)
    patch = store.patch_path(p.entities_path)
    want = list(store.read_jsonl(p.entities_path))
    data = patch.read_bytes()
    for damage in (data[:len(data) // 2], b"", None):
        if damage is None:
            patch.unlink()
        else:
            patch.write_bytes(damage)
        if damage is not None:
            with pytest.raises(store.PatchError):
                store.JsonlLines(p.entities_path)
        assert [x.path for x in Project(inc).check()] == ["graph/entities.patch"]
        _index(docs, inc)
        assert list(store.read_jsonl(Project(inc).entities_path)) == want
        assert Project(inc).check() == []
        patch = store.patch_path(Project(inc).entities_path)
        if not patch.exists():
            break
        data = patch.read_bytes()
