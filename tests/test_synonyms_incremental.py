"""After resolve patched its records (graph/changed_ids.json), the synonyms stage embeds only the records it
changed and splices them into the saved vector indices (VectorIndex.insert): the indices must read as a full
pass's, and the synonym pairs must be its bytes; without a usable change list every record is read. A spliced
index is its base with a patch segment beside it (the vector index's RowPatch), so the indices are compared as what a reader
sees: ids, text hashes and rows in row order, and the digest."""

from __future__ import annotations

import shutil
from pathlib import Path

from hrag_cli.core.project import ProjectDir
from hrag_cli.storage.vectors.index import VectorIndex

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_corpus"
SPLICED = ("entities", "facts", "entity_names")


def _index(docs: Path, project: Path, *extra: str) -> None:
    from typer.testing import CliRunner

    from hrag_cli.cli import app

    result = CliRunner().invoke(app, ["index", str(docs), "-p", str(project), "--chunk-tokens", "120",
                                      "--chunk-overlap", "10", *extra], catch_exceptions=False)
    assert result.exit_code == 0, result.output


def _vector_file_names(project: Path) -> list[str]:
    d = ProjectDir(project).vectors_dir
    return sorted(p.name for name in ("chunks", *SPLICED) for p in VectorIndex.files(d, name) if p.exists())


def _logical(project: Path) -> dict[str, tuple]:
    """Per index, what a reader of it sees: ids, text hashes, unit rows (float16 bytes) in row order, storage."""
    from hrag_cli.core.config import VectorSettings

    d = ProjectDir(project).vectors_dir
    out = {}
    for name in ("chunks", *SPLICED):
        idx = VectorIndex.load(d, name, VectorSettings(), lazy_ids=True, read_at=False)
        out[name] = (list(idx.ids), idx.hash_array().tolist(), idx.vectors().tobytes(), idx.rows().kind,
                     idx.model_id, idx.dim, idx.digest())
    return out


def _add(docs: Path) -> None:
    (docs / "new_a.txt").write_text("Hana Okafor visited Port Ellery in 2001 with the Lantern Archive. "
                                    "Quillon Vesk founded the Amberline Guild in Port Ellery.\n", encoding="utf-8")
    (docs / "new_b.txt").write_text("HANA OKAFOR met Edric Solano at the Quillon Fair. The Amberline Guild hired "
                                    "Edric Solano.\n", encoding="utf-8")


def _built_then_added(tmp_path: Path) -> tuple[Path, Path]:
    """The sample corpus built whole (`base`), then two documents added to the folder."""
    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    base = tmp_path / "base"
    _index(docs, base)
    _add(docs)
    return docs, base


def _resolved_copy(docs: Path, base: Path, project: Path) -> ProjectDir:
    """A copy of `base` brought up to date through resolve (its changed_ids.json written, vectors not synced)."""
    shutil.copytree(base, project, symlinks=True)
    _index(docs, project, "--stop-after", "resolve")
    return ProjectDir(project)


def test_added_documents_are_spliced_into_the_indices_as_a_full_pass_holds_them(tmp_path: Path) -> None:
    """The same +2 documents two ways: with resolve's change list (spliced), and with one that starts from
    another resolve output (so every record is read and synced, as without one). The indices as read, synonym
    pairs and digests are the same; a fresh build (whose IDF table is fitted on every chunk, where the incremental
    project keeps the one it froze) holds the same ids and text hashes in the same rows."""
    docs, base = _built_then_added(tmp_path)
    assert ProjectDir(base).stage("synonyms").counts["indices_spliced"] == 0      # a first build reads everything
    runs = {}
    for how in ("spliced", "stale"):
        project = tmp_path / how
        path = _resolved_copy(docs, base, project).graph_dir / "changed_ids.json"
        assert path.is_file()
        if how == "stale":
            path.write_bytes(path.read_bytes().replace(b'"from"', b'"from":"elsewhere","was"', 1))
        _index(docs, project)
        p = ProjectDir(project)
        assert p.stage("synonyms").counts["indices_spliced"] == (4 if how == "spliced" else 1), how
        runs[how] = (_logical(project), p.synonyms_path.read_bytes(), p.stage("synonyms").output_digest)
        patches = [n for n in _vector_file_names(project) if n.endswith(".patch.npz")]
        assert patches == ([f"{n}.patch.npz" for n in ("chunks", "entities", "entity_names", "facts")]
                           if how == "spliced" else ["chunks.patch.npz"]), how
    # the stale change list is a damaged resolve output: resolve ran whole there, and its output digest names the
    # record files' layout (base, or base + patch), so only the resolve output the vectors synced may differ
    assert [n for n, got in runs["stale"][0].items() if runs["spliced"][0][n] != got] == []
    assert runs["stale"][1:] == runs["spliced"][1:]
    fresh = tmp_path / "fresh"
    _index(docs, fresh)
    want = _logical(fresh)
    assert [n for n, got in want.items() if runs["spliced"][0][n][:2] != got[:2]] == []


def test_a_stage_killed_between_two_indices_is_finished_by_the_next_run(tmp_path: Path) -> None:
    """As if the stage died after saving the chunk and entity indices of a spliced run: the fact and name
    indices and BM25 still follow the previous resolve output. (`hrag index` would find them unlike its record
    and rebuild every index; the stage itself must not trust them either.) Run again, it splices what still
    follows that output (chunks: nothing left to add; facts), reads every record for the indices already synced
    further (entities, and so the names), gives BM25 the chunks the chunk index took before the kill, and ends
    with the files of a run that was never killed."""
    from hrag_cli.storage.bm25 import BM25_FILE, BM25Index
    from hrag_cli.core.config import load_settings
    from hrag_cli.core.progress import Reporter
    from hrag_cli.embed.stage import run_synonyms

    docs, base = _built_then_added(tmp_path)
    runs = {}
    for how in ("whole", "killed"):
        project = tmp_path / how
        vectors = _resolved_copy(docs, base, project).vectors_dir
        before = {p.name: p.read_bytes() for name in ("facts", "entity_names")
                  for p in VectorIndex.files(vectors, name) if p.exists()}
        before[BM25_FILE] = (vectors / BM25_FILE).read_bytes()
        _index(docs, project)
        if how == "killed":
            p = ProjectDir(project)
            for name, data in before.items():
                (p.vectors_dir / name).unlink()
                (p.vectors_dir / name).write_bytes(data)
            with p.lock():
                again = run_synonyms(p, load_settings(None), Reporter("quiet"))
            assert again.counts["indices_spliced"] == 2 and again.counts["idf_refit"] is False
        runs[how] = (_logical(project), ProjectDir(project).synonyms_path.read_bytes(),
                     sorted(BM25Index.load(ProjectDir(project).vectors_dir / BM25_FILE).doc_ids()))
    assert runs["killed"][1] == runs["whole"][1] and runs["killed"][2] == runs["whole"][2]
    assert [n for n, got in runs["killed"][0].items() if runs["whole"][0][n] != got] == []


def test_a_spliced_run_takes_entities_and_facts_from_the_record_patches_and_only_the_appended_chunks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The +2 documents' run plans the entity and fact indices from the record patches' lines (no scan of the
    files) and the chunk index and BM25 from the chunks appended since the index's mark (no read of every
    chunk); the files it ends with are the spliced ones the test above compares with a full pass."""
    import time

    from hrag_cli.core import line_patch
    from hrag_cli.embed import indices, plans, stage
    from hrag_cli.core.config import load_settings
    from hrag_cli.core.progress import Reporter

    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs)
    time.sleep(1.1)     # files older than a second get stamped, so adding two is an append, as in a real folder
    base = tmp_path / "base"
    _index(docs, base)
    _add(docs)
    p = _resolved_copy(docs, base, tmp_path / "p")
    assert line_patch.patch_path(p.facts_path).exists()
    got: dict[str, list] = {"records": [], "chunks": []}
    for name, module, fn in (("records", plans, "_patch_plan"), ("chunks", indices, "appended_chunks")):
        real = getattr(module, fn)
        monkeypatch.setattr(module, fn, lambda *a, real=real, name=name: got[name].append(real(*a)) or got[name][-1])

    def whole(*_args):
        raise AssertionError("a record file scanned or every chunk read")

    monkeypatch.setattr(plans, "_line_ids", whole)
    monkeypatch.setattr(plans.Chunks, "all", whole)
    with p.lock():
        out = stage.run_synonyms(p, load_settings(None), Reporter("quiet"))
    assert out.counts["indices_spliced"] == 4
    assert len(got["records"]) == 2 and None not in got["records"]     # the entities' and the facts' patch
    (entity_plan, entities), (fact_plan, facts) = got["records"]
    assert [r["id"] for r in entities] == entity_plan.ids and all("name" in r for r in entities)
    assert [r["id"] for r in facts] == fact_plan.ids and all("subject" in r for r in facts)
    assert len(got["chunks"]) == 1 and got["chunks"][0] is not None


def test_a_plan_from_patched_rows_matches_the_plan_from_a_scan_of_the_file(tmp_path: Path) -> None:
    """The facts index's plan built from the logical rows of the changed lines (a record patch) is the plan the
    scan of the whole file gives: held ids made again in place, new ones inserted at their lines."""
    import numpy as np

    from hrag_cli.core.config import VectorSettings
    from hrag_cli.embed.plans import _file_order_plan, _rows_plan
    from hrag_cli.storage.vectors.ids import fixed_bytes

    old = ["f3", "f1", "f7", "f5"]                                    # file order, not id order
    rng = np.random.default_rng(3)
    VectorIndex.build("facts", old, rng.normal(size=(4, 8)), VectorSettings(), "m",
                      [f"h{i}" for i in old]).save(tmp_path)
    idx = VectorIndex.load(tmp_path, "facts", VectorSettings(), lazy_ids=True, read_at=False)
    now = ["f0", "f3", "f2", "f1", "f7", "f9", "f5", "f8"]
    changed, rows = ["f0", "f2", "f1", "f9", "f8"], np.array([0, 2, 3, 5, 7])
    want = _file_order_plan(idx, changed, fixed_bytes(now))
    got = _rows_plan(idx, changed, rows, len(now))
    assert want is not None and got is not None
    assert got.ids == want.ids and np.array_equal(got.old_rows, want.old_rows)
    assert np.array_equal(got.before, want.before) and np.array_equal(got.lines, rows) and got.total == len(now)
    assert _rows_plan(idx, changed, rows, len(now) + 1) is None          # rows that do not add up: the scan
    assert _rows_plan(idx, changed, rows[::-1], len(now)) is None
