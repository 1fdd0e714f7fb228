"""Loading documents and the chunk stage: formats, selection, skipped files, ids, incremental re-chunking."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from hrag_cli.core import store
from hrag_cli.core.config import DocumentSettings, Settings
from hrag_cli.chunk.documents import glob_match, scan
from hrag_cli.core.errors import UsageError
from hrag_cli.chunk.stage import run_chunk
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir, text_hash

SAMPLE = Path(__file__).resolve().parent.parent / "sample_corpus"


def reporter() -> tuple[Reporter, io.StringIO]:
    buf = io.StringIO()
    return Reporter("plain", stream=buf), buf


def write(root: Path, rel: str, data: str | bytes) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(data, encoding="utf-8")
    return p


def test_recursive_scan_of_text_markdown_and_records(tmp_path: Path) -> None:
    write(tmp_path, "a.txt", "Alpha text.")
    write(tmp_path, "sub/deeper/b.md", "# Title\n\nBeta text.")
    write(tmp_path, "sub/c.markdown", "Gamma.")
    write(tmp_path, "photo.png", "not read")
    write(tmp_path, ".hidden/secret.txt", "never read")
    write(tmp_path, ".dotfile.txt", "never read")
    rep, _ = reporter()
    result = scan([tmp_path], DocumentSettings(), rep)
    paths = [d.doc.path for d in result.documents]
    assert paths == ["a.txt", "sub/c.markdown", "sub/deeper/b.md"]
    assert result.skipped == ["photo.png: unsupported type '.png'"] and result.skipped_by_ext == {".png": 1}
    doc = result.documents[0].doc
    assert doc.doc_id == text_hash("a.txt") and doc.bytes == len("Alpha text.")


def test_jsonl_records_text_field_title_metadata_and_bad_lines(tmp_path: Path) -> None:
    lines = [
        json.dumps({"id": "r1", "title": "First", "text": "Body one.", "year": 1949}),
        "{not json",
        json.dumps({"id": "r2", "body": "Body two."}),           # no text field: skipped
        json.dumps(["a", "list"]),
        json.dumps({"text": "No id here."}),                      # keyed by line number
        json.dumps({"id": "r1", "text": "Same id again."}),       # duplicate id: keyed by line number
    ]
    write(tmp_path, "recs.jsonl", "\n".join(lines) + "\n")
    rep, buf = reporter()
    result = scan([tmp_path], DocumentSettings(), rep)
    docs = {d.doc.path: d for d in result.documents}
    assert set(docs) == {"recs.jsonl#r1", "recs.jsonl#line5", "recs.jsonl#line6"}
    first = docs["recs.jsonl#r1"]
    assert first.text == "First\n\nBody one."
    assert first.doc.metadata == {"id": "r1", "title": "First", "year": 1949}
    warnings = buf.getvalue()
    assert "recs.jsonl:2" in warnings and "not valid JSON" in warnings
    assert "recs.jsonl:3" in warnings and "recs.jsonl:4" in warnings
    assert len(result.skipped) == 3

    # another text field, chosen by settings
    result = scan([tmp_path], DocumentSettings(jsonl_text_field="body"), reporter()[0])
    assert [d.doc.path for d in result.documents] == ["recs.jsonl#r2"]


def test_sample_corpus_records_file() -> None:
    result = scan([SAMPLE], DocumentSettings(), reporter()[0])
    recs = [d for d in result.documents if d.doc.path.startswith("records.jsonl#")]
    assert len(recs) >= 3 and all("year" in d.doc.metadata for d in recs)
    assert any(d.doc.path.endswith(".md") for d in result.documents)


@pytest.mark.parametrize("path,pattern,expected", [
    ("a.txt", "*.txt", True),
    ("sub/deep/a.txt", "*.txt", True),            # no '/': matches the file name at any depth
    ("sub/deep/a.txt", "sub/*.txt", False),       # '*' stays inside one folder
    ("sub/deep/a.txt", "sub/**/*.txt", True),
    ("sub/a.txt", "sub/**/*.txt", True),          # '**/' also matches no folder
    ("sub/a.txt", "**/a.txt", True),
    ("a.md", "*.txt", False),
    ("drafts/x.md", "drafts/**", True),
    ("b1.txt", "b[0-9].txt", True),
    ("b1.txt", "b[!0-9].txt", False),
    ("sub/a.txt", "./sub/a.txt", True),
])
def test_glob_match(path: str, pattern: str, expected: bool) -> None:
    assert glob_match(path, pattern) is expected


def test_include_and_exclude(tmp_path: Path) -> None:
    write(tmp_path, "keep/a.txt", "A.")
    write(tmp_path, "keep/b.md", "B.")
    write(tmp_path, "drafts/c.txt", "C.")
    settings = DocumentSettings(include=["**/*.txt"], exclude=["drafts/**"])
    result = scan([tmp_path], settings, reporter()[0])
    assert [d.doc.path for d in result.documents] == ["keep/a.txt"]


def test_bad_glob_pattern_is_a_usage_error(tmp_path: Path) -> None:
    write(tmp_path, "a.txt", "Text.")
    with pytest.raises(UsageError, match=r"pattern '\[z-a\]\.txt'"):
        scan([tmp_path], DocumentSettings(include=["[z-a].txt"]), reporter()[0])


def test_binary_and_non_utf8_files_are_skipped_with_a_named_warning(tmp_path: Path) -> None:
    write(tmp_path, "good.txt", "Fine text.")
    write(tmp_path, "blob.txt", b"abc\x00\x01\x02")
    write(tmp_path, "latin.txt", "Caf\u00e9".encode("latin-1"))
    write(tmp_path, "empty.md", "   \n")
    write(tmp_path, "bom.txt", "\ufeffWith BOM\r\nand CRLF.".encode("utf-8"))
    rep, buf = reporter()
    result = scan([tmp_path], DocumentSettings(), rep)
    assert sorted(d.doc.path for d in result.documents) == ["bom.txt", "good.txt"]
    bom = next(d for d in result.documents if d.doc.path == "bom.txt")
    assert bom.text == "With BOM\nand CRLF."
    out = buf.getvalue()
    assert "blob.txt: binary file" in out and "latin.txt: not UTF-8 text" in out and "empty.md: empty" in out


def test_missing_path_and_empty_corpus_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        scan([tmp_path / "missing"], DocumentSettings(), reporter()[0])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no usable documents"):
        scan([tmp_path / "empty"], DocumentSettings(), reporter()[0])
    write(tmp_path, "only_bad/x.txt", b"\x00\x00")
    with pytest.raises(UsageError, match="1 skipped"):
        scan([tmp_path / "only_bad"], DocumentSettings(), reporter()[0])


def test_single_files_and_several_roots(tmp_path: Path) -> None:
    a = write(tmp_path, "one/a.txt", "From one.")
    write(tmp_path, "two/a.txt", "From two.")
    result = scan([a], DocumentSettings(), reporter()[0])
    assert [d.doc.path for d in result.documents] == ["a.txt"]
    result = scan([tmp_path / "one", tmp_path / "two"], DocumentSettings(), reporter()[0])
    assert [d.doc.path for d in result.documents] == ["one/a.txt", "two/a.txt"]
    rep, buf = reporter()
    odd = write(tmp_path, "odd.png", "x,y")
    with pytest.raises(UsageError):
        scan([odd], DocumentSettings(), rep)
    assert "unsupported type" in buf.getvalue()


def test_roots_with_the_same_name_keep_every_file_and_a_file_given_twice_is_read_once(tmp_path: Path) -> None:
    write(tmp_path, "x/docs/a.txt", "From x.")
    write(tmp_path, "y/docs/a.txt", "From y.")
    result = scan([tmp_path / "x/docs", tmp_path / "y/docs"], DocumentSettings(), reporter()[0])
    assert [(d.doc.path, d.text) for d in result.documents] == [("x/docs/a.txt", "From x."),
                                                                ("y/docs/a.txt", "From y.")]
    result = scan([tmp_path / "x/docs", tmp_path / "x/docs/a.txt", tmp_path / "x/docs"], DocumentSettings(),
                  reporter()[0])
    assert [d.text for d in result.documents] == ["From x."]


def test_chunk_size_below_one_token_is_a_usage_error(tmp_path: Path) -> None:
    write(tmp_path, "docs/a.txt", "Text.")
    settings = Settings()
    settings.chunk.tokens = 0
    with pytest.raises(UsageError, match="chunk.tokens"):
        run_chunk(ProjectDir(tmp_path / "proj"), settings, reporter()[0], [tmp_path / "docs"])


def test_project_folder_inside_docs_is_never_read(tmp_path: Path) -> None:
    write(tmp_path, "a.txt", "Text.")
    proj = ProjectDir(tmp_path / "proj")
    proj.init()
    write(tmp_path, "proj/stray.txt", "must not be indexed")
    out = run_chunk(proj, Settings(), reporter()[0], [tmp_path])
    assert [d.path for d in out.documents] == ["a.txt"]


def test_chunk_stage_replaces_changed_and_drops_deleted(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    write(docs, "a.txt", "Alpha is a document about the Alpha Company.")
    write(docs, "b.txt", "Beta is a document about the Beta River.")
    write(docs, "dup.txt", "Alpha is a document about the Alpha Company.")     # same text as a.txt
    proj = ProjectDir(tmp_path / "proj")
    proj.init()
    settings = Settings()
    first = run_chunk(proj, settings, reporter()[0], [docs])
    assert first.counts["docs"] == 3 and first.counts["chunks"] == 3 and first.counts["new_chunks"] == 3
    ids = [c.chunk_id for c in first.chunks]
    assert len(set(ids)) == 3                       # identical text in two documents: distinct ids
    a_chunk = next(c for c in first.chunks if c.doc_id == text_hash("a.txt"))
    assert a_chunk.chunk_id == text_hash(a_chunk.text)
    from hrag_cli.stages import chunks_reusable, expected_fingerprint

    proj.record_stage("chunk", expected_fingerprint(proj, settings, "chunk"), first.output_digest, first.counts)

    write(docs, "b.txt", "Beta was rewritten entirely.")
    (docs / "dup.txt").unlink()
    assert chunks_reusable(proj, settings)
    second = run_chunk(proj, settings, reporter()[0], [docs], reuse=True)
    assert second.counts["new_chunks"] == 1 and second.counts["removed_chunks"] == 2
    assert second.counts["reused_docs"] == 1            # a.txt unchanged: its chunks reused
    stored = list(store.read_jsonl(proj.chunks_path))
    assert sorted(c["text"] for c in stored) == ["Alpha is a document about the Alpha Company.",
                                                 "Beta was rewritten entirely."]
    docs_rec = {d["path"]: d for d in store.read_jsonl(proj.docs_path)}
    assert set(docs_rec) == {"a.txt", "b.txt"} and docs_rec["a.txt"]["n_chunks"] == 1
    assert second.output_digest != first.output_digest

    # write=False (dry run) leaves the files alone
    write(docs, "c.txt", "Gamma.")
    before = proj.chunks_path.read_bytes()
    third = run_chunk(proj, settings, reporter()[0], [docs], write=False)
    assert third.counts["new_chunks"] == 1 and proj.chunks_path.read_bytes() == before


def test_repeated_text_inside_one_document_is_kept_once(tmp_path: Path) -> None:
    para = "The same paragraph, repeated word for word, again and again in one file. " * 6
    write(tmp_path, "docs/rep.txt", "\n\n".join([para] * 6))
    proj = ProjectDir(tmp_path / "proj")
    proj.init()
    settings = Settings()
    settings.chunk.tokens = 90
    settings.chunk.overlap = 0
    out = run_chunk(proj, settings, reporter()[0], [tmp_path / "docs"])
    assert len({c.chunk_id for c in out.chunks}) == len(out.chunks)
    assert [c.order for c in out.chunks] == list(range(len(out.chunks)))


def _chunk_run(proj: ProjectDir, settings: Settings, docs: Path, rehash: bool = False):
    """One chunk stage as `hrag index --stop-after chunk` runs it: reuse when vouched for, then recorded."""
    from hrag_cli.stages import chunks_reusable, expected_fingerprint

    out = run_chunk(proj, settings, reporter()[0], [docs], reuse=chunks_reusable(proj, settings), rehash=rehash)
    proj.record_stage("chunk", expected_fingerprint(proj, settings, "chunk"), out.output_digest, out.counts)
    return out


def test_unchanged_files_go_unread_and_every_change_is_still_seen(tmp_path: Path) -> None:
    import os
    import time

    docs = tmp_path / "docs"
    write(docs, "a.txt", "Alpha is a document about the Alpha Company.")
    write(docs, "b.txt", "Beta is a document about the Beta River.")
    write(docs, "c.txt", "Gamma is a document about the Gamma Bridge.")
    write(docs, "r.jsonl", '{"id": 1, "text": "Delta Port."}\n{"id": 2, "text": "Epsilon Hill.", "title": "E"}\n')
    write(docs, "bad.jsonl", '{"id": 1, "text": "Zeta Lake."}\nnot json\n')      # warns: read every time
    time.sleep(1.05)            # older than documents.RACY_NS, so the first run may stamp them
    proj = ProjectDir(tmp_path / "proj")
    proj.init()
    settings = Settings()
    first = _chunk_run(proj, settings, docs)
    assert first.counts["unread_files"] == 0 and proj.files_path.exists()
    files = json.loads(proj.files_path.read_bytes())["files"]
    assert set(files) == {"a.txt", "b.txt", "c.txt", "r.jsonl"}                   # bad.jsonl warned
    snapshot = (proj.docs_path.read_bytes(), list(store.read_jsonl(proj.chunks_path)), first.output_digest)

    second = _chunk_run(proj, settings, docs)
    assert second.counts["unread_files"] == 4 and second.counts["skipped_files"] == 1
    assert (proj.docs_path.read_bytes(), list(store.read_jsonl(proj.chunks_path)), second.output_digest) == snapshot
    assert _chunk_run(proj, settings, docs, rehash=True).counts["unread_files"] == 0
    assert (proj.docs_path.read_bytes(), list(store.read_jsonl(proj.chunks_path))) == snapshot[:2]

    # an in-place edit keeping size and mtime (touch -d back): ctime moved, so the file is read
    st = (docs / "a.txt").stat()
    (docs / "a.txt").write_text("ALPHA is a document about the Alpha Company.", encoding="utf-8")
    os.utime(docs / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (docs / "a.txt").stat().st_size == st.st_size
    # a deleted file and a renamed one
    (docs / "b.txt").unlink()
    (docs / "c.txt").rename(docs / "c2.txt")
    third = _chunk_run(proj, settings, docs)
    assert third.counts["unread_files"] == 1                                      # r.jsonl only
    paths = {d["path"]: d for d in store.read_jsonl(proj.docs_path)}
    assert set(paths) == {"a.txt", "c2.txt", "r.jsonl#1", "r.jsonl#2", "bad.jsonl#1"}
    assert any(c["text"].startswith("ALPHA") for c in store.read_jsonl(proj.chunks_path))

    # settings that change chunking re-chunk every file, stamps or not
    settings.chunk.tokens = 5
    settings.chunk.overlap = 0
    fourth = _chunk_run(proj, settings, docs)
    assert fourth.counts["unread_files"] == 0 and fourth.counts["chunks"] > third.counts["chunks"]


def test_a_damaged_stamp_file_is_caught_and_costs_only_a_full_read(tmp_path: Path) -> None:
    import time

    docs = tmp_path / "docs"
    write(docs, "a.txt", "Alpha is a document about the Alpha Company.")
    time.sleep(1.05)
    proj = ProjectDir(tmp_path / "proj")
    proj.init()
    settings = Settings()
    first = _chunk_run(proj, settings, docs)
    proj.files_path.write_bytes(b"{ not json")
    from hrag_cli.stages import chunks_reusable

    assert [p.path for p in proj.check(stages=("chunk",))] == ["files.json"]
    assert not chunks_reusable(proj, settings)
    again = _chunk_run(proj, settings, docs)
    assert again.counts["unread_files"] == 0 and again.output_digest == first.output_digest
    written = {p: p.stat().st_mtime_ns for p in (proj.docs_path, proj.chunks_path, proj.files_path)}
    assert _chunk_run(proj, settings, docs).counts["unread_files"] == 1
    # nothing changed at all: the three files are left as they are, and still vouched for
    assert {p: p.stat().st_mtime_ns for p in written} == written and not proj.check(full=True, stages=("chunk",))
