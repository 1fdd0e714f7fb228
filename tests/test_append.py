"""A run that only adds files: the chunk stage appends them to docs.jsonl and chunks.jsonl and
the extract stage carries its totals on with theirs, and the project still equals a fresh build of the same files;
anything else (a changed file, a new text the files may hold already, a record appended since for another chunk)
takes the full pass."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from hrag_cli.core import store
from hrag_cli.extract.stage import SUMMED
from hrag_cli.chunk.stage import added_since, chunk_mark
from hrag_cli.core.project import ProjectDir
from tests.damage import answers, cli

SAMPLE = Path(__file__).resolve().parent.parent / "sample_corpus"
ARGS = ("-q", "--extractor", "rules", "--embed-model", "builtin")


def _docs(tmp_path: Path) -> Path:
    """The sample corpus without records.jsonl (the last file in path order), old enough to be stamped."""
    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs, ignore=shutil.ignore_patterns("records.jsonl", "schema.toml"))
    time.sleep(1.05)    # older than documents.RACY_NS
    return docs


def _index(docs: Path, proj: Path, *more: str, exit_code: int = 0) -> dict:
    code, out, err = cli("index", str(docs), "-p", str(proj), "--json", *ARGS, *more)
    assert code == exit_code, err
    return json.loads(out)


def _gen_file(proj: Path, name: str) -> bytes:
    return (ProjectDir(proj).gen_dir / name).read_bytes()


def _extract_totals(proj: Path) -> dict:
    counts = ProjectDir(proj).stage("extract").counts
    return {k: counts[k] for k in (*SUMMED, "chunks", "extractor")}


def test_new_files_are_appended_and_the_project_equals_a_fresh_build(tmp_path: Path) -> None:
    docs = _docs(tmp_path)
    inc, fresh = tmp_path / "inc", tmp_path / "fresh"
    old_files = _index(docs, inc)["chunk"]["docs"]
    mark = chunk_mark(ProjectDir(inc))
    shutil.copy(SAMPLE / "records.jsonl", docs / "records.jsonl")
    summary = _index(docs, inc)
    assert summary["chunk"]["unread_files"] == old_files and summary["chunk"]["new_chunks"] > 0
    assert summary["extract"]["extracted_now"] == summary["chunk"]["new_chunks"]
    added = added_since(ProjectDir(inc), mark)
    assert added is not None and chunk_mark(ProjectDir(inc))["epoch"] == mark["epoch"]   # appended, not rewritten
    new_docs, new_chunks = added
    assert new_docs and all(d.path.startswith("records.jsonl#") for d in new_docs)
    assert {c.doc_id for c in new_chunks} == {d.doc_id for d in new_docs}

    _index(docs, fresh)
    # the new file sorts last, so the appended files are the bytes a fresh build writes
    for name in ("docs.jsonl", "chunks.jsonl"):
        assert _gen_file(inc, name) == _gen_file(fresh, name), name
    assert _extract_totals(inc) == _extract_totals(fresh)
    assert answers(inc) == answers(fresh)
    assert added_since(ProjectDir(inc), chunk_mark(ProjectDir(inc))) == ([], [])


def test_a_file_added_in_the_middle_keeps_the_order_of_addition(tmp_path: Path) -> None:
    docs = _docs(tmp_path)
    (docs / "places" / "port_ellery.txt").rename(tmp_path / "held.txt")
    time.sleep(1.05)
    inc, fresh = tmp_path / "inc", tmp_path / "fresh"
    _index(docs, inc, "--stop-after", "extract")
    shutil.copy(tmp_path / "held.txt", docs / "places" / "port_ellery.txt")
    _index(docs, inc, "--stop-after", "extract")
    _index(docs, fresh, "--stop-after", "extract")
    # the same records by key; the appended document comes last instead of in path order
    for name in ("docs.jsonl", "chunks.jsonl"):
        key = "doc_id" if name == "docs.jsonl" else "chunk_id"
        mine, theirs = (list(store.read_jsonl(ProjectDir(p).gen_dir / name)) for p in (inc, fresh))
        assert {r[key]: r for r in mine} == {r[key]: r for r in theirs} and len(mine) == len(theirs)
        assert [r[key] for r in mine] != [r[key] for r in theirs]
    assert _extract_totals(inc) == _extract_totals(fresh)


def test_a_repeated_text_or_a_changed_file_takes_the_full_pass(tmp_path: Path) -> None:
    docs = _docs(tmp_path)
    inc, fresh = tmp_path / "inc", tmp_path / "fresh"
    _index(docs, inc, "--stop-after", "extract")
    mark = chunk_mark(ProjectDir(inc))
    # a new file sorting first whose text another document has: a fresh build salts the OLD document's chunk id
    shutil.copy(docs / "people" / "edric_solano.txt", docs / "aaa.txt")
    summary = _index(docs, inc, "--stop-after", "extract")
    assert summary["chunk"]["new_chunks"] == 1 and summary["chunk"]["removed_chunks"] == 0   # the salted id
    assert added_since(ProjectDir(inc), mark) is None          # written whole: a mark from before says so
    _index(docs, fresh, "--stop-after", "extract")
    assert _gen_file(inc, "chunks.jsonl") == _gen_file(fresh, "chunks.jsonl")
    assert _extract_totals(inc) == _extract_totals(fresh)

    mark = chunk_mark(ProjectDir(inc))
    (docs / "aaa.txt").write_text("Aaa is now about the Harrowgate Institute alone.", encoding="utf-8")
    summary = _index(docs, inc, "--stop-after", "extract")
    assert summary["chunk"]["new_chunks"] == 1 and added_since(ProjectDir(inc), mark) is None


def test_a_record_appended_for_an_old_chunk_since_the_last_run_is_counted(tmp_path: Path) -> None:
    docs = _docs(tmp_path)
    inc = tmp_path / "inc"
    _index(docs, inc, "--stop-after", "extract")
    # as a stopped `--retry-failed` run would leave it: a newer record of a chunk the stage already counted
    old = next(store.read_jsonl(ProjectDir(inc).extractions_path))
    with store.JsonlAppender(ProjectDir(inc).extractions_path) as out:
        out.append({**old, "status": "failed", "error": "made up", "entities": [], "relations": []})
    shutil.copy(SAMPLE / "records.jsonl", docs / "records.jsonl")
    summary = _index(docs, inc, "--stop-after", "extract", exit_code=4)      # partial: one chunk failed
    assert summary["extract"]["failed"] == 1 and summary["chunk"]["new_chunks"] > 0


def test_a_killed_append_run_resumes_as_an_append(tmp_path: Path, monkeypatch) -> None:
    from hrag_cli import pipeline

    docs = _docs(tmp_path)
    inc, fresh = tmp_path / "inc", tmp_path / "fresh"
    _index(docs, inc, "--stop-after", "extract")
    mark = chunk_mark(ProjectDir(inc))
    shutil.copy(SAMPLE / "records.jsonl", docs / "records.jsonl")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt     # after the new chunks' records went to the cache, before the commit

    with monkeypatch.context() as m:
        m.setattr(pipeline, "_extract_exit_code", killed)
        code, _, _ = cli("index", str(docs), "-p", str(inc), *ARGS, "--stop-after", "extract")
        assert code != 0
    assert chunk_mark(ProjectDir(inc)) == mark                 # the last complete version is still current
    summary = _index(docs, inc, "--stop-after", "extract")
    assert summary["extract"]["extracted_now"] == 0 and summary["chunk"]["unread_files"] > 0
    assert added_since(ProjectDir(inc), mark) is not None      # the records the killed run saved did not stop it
    _index(docs, fresh, "--stop-after", "extract")
    assert _gen_file(inc, "chunks.jsonl") == _gen_file(fresh, "chunks.jsonl")
    assert _extract_totals(inc) == _extract_totals(fresh)


def test_stage_by_stage_runs_look_only_at_what_was_appended(tmp_path: Path, monkeypatch) -> None:
    from hrag_cli.chunk import stage as ingest
    from hrag_cli.extract import stage

    docs = _docs(tmp_path)
    inc, fresh = tmp_path / "inc", tmp_path / "fresh"
    _index(docs, inc, "--stop-after", "extract")
    shutil.copy(SAMPLE / "records.jsonl", docs / "records.jsonl")
    time.sleep(1.05)    # stamped by the chunk-only run, so the next one reads nothing
    with monkeypatch.context() as m:    # neither stage may read every chunk back
        m.setattr(ingest, "load_chunks", lambda project: (_ for _ in ()).throw(AssertionError("read whole")))
        m.setattr(stage, "load_chunks", ingest.load_chunks)
        added = _index(docs, inc, "--stop-after", "chunk")["chunk"]["new_chunks"]
        summary = _index(docs, inc, "--stop-after", "extract")
    assert summary["chunk"]["new_chunks"] == 0 and summary["extract"]["extracted_now"] == added > 0
    _index(docs, fresh, "--stop-after", "extract")
    assert _gen_file(inc, "chunks.jsonl") == _gen_file(fresh, "chunks.jsonl")
    assert _extract_totals(inc) == _extract_totals(fresh)


def test_with_no_extract_record_the_stage_looks_at_every_chunk(tmp_path: Path) -> None:
    docs = _docs(tmp_path)
    inc = tmp_path / "inc"
    chunks = _index(docs, inc, "--stop-after", "extract")["extract"]["chunks"]
    p = ProjectDir(inc)
    with p.lock(), p.generation():      # as a run that left chunks pending leaves it
        p.forget_stage("extract")
    summary = _index(docs, inc, "--stop-after", "extract")
    assert summary["chunk"]["unread_files"] > 0 and summary["extract"]["chunks"] == chunks
    assert summary["extract"]["cached"] == chunks


def test_a_file_read_again_unchanged_still_lets_the_next_files_append(tmp_path: Path) -> None:
    """The cron case: a file written just before the run is appended but not stamped (too recent to trust), so
    the next run reads it again; finding it as it was, that run still appends its own new file (it used to
    chunk and write the whole corpus again), and the project equals a fresh build. The same file edited instead
    takes the full pass."""
    docs = _docs(tmp_path)
    inc, fresh = tmp_path / "inc", tmp_path / "fresh"
    _index(docs, inc, "--stop-after", "extract")
    shutil.copy(SAMPLE / "records.jsonl", docs / "records.jsonl")          # just written: appended, unstamped
    _index(docs, inc, "--stop-after", "extract")
    assert "records.jsonl" not in json.loads(_gen_file(inc, "files.json"))["files"]
    mark = chunk_mark(ProjectDir(inc))
    time.sleep(1.05)
    (docs / "zz_late.txt").write_text("Orla Venn opened the Harrow Library in Port Ellery in 1911.\n")
    summary = _index(docs, inc, "--stop-after", "extract")
    assert summary["chunk"]["new_chunks"] == 1 and summary["extract"]["extracted_now"] == 1
    new_docs, _ = added_since(ProjectDir(inc), mark)                          # appended, not rewritten
    assert [d.path for d in new_docs] == ["zz_late.txt"]
    assert "records.jsonl" in json.loads(_gen_file(inc, "files.json"))["files"]   # stamped now
    _index(docs, fresh, "--stop-after", "extract")
    for name in ("docs.jsonl", "chunks.jsonl"):
        assert _gen_file(inc, name) == _gen_file(fresh, name), name
    assert _extract_totals(inc) == _extract_totals(fresh)

    again = tmp_path / "again"
    shutil.copytree(inc, again, symlinks=True)
    (docs / "zz_later.txt").write_text("Orla Venn sold the Harrow Library in 1920.\n")   # appended, unstamped
    _index(docs, again, "--stop-after", "extract")
    mark = chunk_mark(ProjectDir(again))
    (docs / "zz_later.txt").write_text("Orla Venn sold the Harrow Library in 1921.\n")   # then edited
    summary = _index(docs, again, "--stop-after", "extract")
    assert summary["chunk"]["removed_chunks"] == 1 and added_since(ProjectDir(again), mark) is None   # whole pass


# ------------------------------------------------------------------------ a nightly run over days-old files

GONE = "orgs/lantern_archive.txt"


def _days_old(tmp_path: Path) -> Path:
    """The sample corpus as a nightly job finds it: every file last written two days ago, so the stat stamps of
    the first run are what every later run goes by. (mtime is set back; ctime, which no call can set back,
    needs the one wait past documents.RACY_NS.)"""
    docs = tmp_path / "docs"
    shutil.copytree(SAMPLE, docs, ignore=shutil.ignore_patterns("schema.toml"))
    back = time.time_ns() - 2 * 86_400 * 10**9
    for path in docs.rglob("*"):
        os.utime(path, ns=(back, back))
    time.sleep(1.05)
    return docs


def _paths(proj: Path) -> list[str]:
    return sorted(d["path"].split("#")[0] for d in store.read_jsonl(ProjectDir(proj).docs_path))


def _graph(proj: Path) -> dict[str, list]:
    """The graph's records, for comparing with a fresh build (query scores may differ a little: the BM25
    weights are refit only when the corpus drifts far enough)."""
    return {name: sorted(store.read_jsonl(ProjectDir(proj).gen_dir / "graph" / name), key=json.dumps)
            for name in ("entities.jsonl", "facts.jsonl")}


def _bm25_paths(proj: Path, query: str) -> list[str]:
    code, out, err = cli("query", query, "-p", str(proj), "--mode", "bm25", "--json")
    assert code == 0, err
    return [c["path"] for c in json.loads(out)["chunks"]]


def test_an_old_file_deleted_with_nothing_new_is_gone_from_the_index(tmp_path: Path) -> None:
    docs = _days_old(tmp_path)
    inc, fresh = tmp_path / "inc", tmp_path / "fresh"
    before = _index(docs, inc)["chunk"]
    assert _bm25_paths(inc, "parish registers wage books ships' logs")[0] == GONE
    (docs / GONE).unlink()                          # the only change: no new file forces the full pass
    after = _index(docs, inc)["chunk"]
    files = len(json.loads(_gen_file(inc, "files.json"))["files"])
    assert after["unread_files"] == files > 0       # every other file went by its stamp, unread
    assert after["docs"] == before["docs"] - 1 and after["removed_chunks"] > 0 and after["new_chunks"] == 0
    assert GONE not in _paths(inc)
    assert GONE not in _bm25_paths(inc, "parish registers wage books ships' logs")
    _index(docs, fresh)
    assert _paths(inc) == _paths(fresh) and _graph(inc) == _graph(fresh)


def test_an_old_file_edited_in_place_with_its_time_set_back_is_read_again(tmp_path: Path) -> None:
    """Same size, mtime put back (touch -d): only ctime tells the file changed."""
    docs = _days_old(tmp_path)
    inc, fresh = tmp_path / "inc", tmp_path / "fresh"
    before = _index(docs, inc)["chunk"]
    path = docs / GONE
    st = path.stat()
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("lamp factory", "wick foundry"), encoding="utf-8")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    time.sleep(1.05)                                # so this run stamps the edited file like the others
    after = _index(docs, inc)["chunk"]
    assert after["unread_files"] == len(json.loads(_gen_file(inc, "files.json"))["files"]) - 1
    assert after["docs"] == before["docs"] and after["new_chunks"] > 0 and after["removed_chunks"] > 0
    assert _paths(inc).count(GONE) == 1
    texts = [c["text"] for c in store.read_jsonl(ProjectDir(inc).chunks_path)
             if c["doc_id"] in {d["doc_id"] for d in store.read_jsonl(ProjectDir(inc).docs_path) if d["path"] == GONE}]
    assert any("wick foundry" in t for t in texts) and not any("lamp factory" in t for t in texts)
    assert _bm25_paths(inc, "wick foundry")[0] == GONE
    _index(docs, fresh)
    assert _paths(inc) == _paths(fresh) and _graph(inc) == _graph(fresh)
