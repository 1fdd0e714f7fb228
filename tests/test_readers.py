"""Format readers and the scan around them: PDF, HTML, DOCX and the plain-text markups read with their
structure; every file under DOCS indexed or listed with its reason; chunks that know their section and page,
shown by `hrag query`; and the cron summary."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hrag_cli.chunk import documents, readers
from hrag_cli.chunk.chunking import chunk_sections, chunk_text
from hrag_cli.chunk.documents import scan
from hrag_cli.cli import app
from hrag_cli.core.config import DocumentSettings
from hrag_cli.core.progress import Reporter
from tests.docmakers import make_docx, make_pdf

FIXTURES = Path(__file__).parent / "fixtures"
HRAG = [sys.executable, "-m", "hrag_cli.cli"]

PAGE = """<!DOCTYPE html>
<html><head><title>Site title</title><style>.x { color: red }</style><script>var tracking = 1;</script></head>
<body>
<nav><a href="/">Home</a> | <a href="/about">About navigation link</a></nav>
<header role="banner">Banner slogan</header>
<main>
<h1>Dependencies</h1>
<p>Dependencies are functions that run before a view.</p>
<h2>With yield</h2>
<p>A dependency with <code>yield</code> runs its cleanup after the response. It is useful for sessions.</p>
<pre>def get_db():
    yield db</pre>
</main>
<footer>Copyright footer text</footer>
</body></html>
"""


def reporter() -> tuple[Reporter, io.StringIO]:
    buf = io.StringIO()
    return Reporter("plain", stream=buf), buf


def sections_of(path: Path) -> list[tuple[tuple[str, ...], str]]:
    result = scan([path], DocumentSettings(), reporter()[0])
    (loaded,) = result.documents
    return [(s.trail, s.text) for s in loaded.sections()]


def index(*args: str) -> subprocess.CompletedProcess:
    """`hrag index` in a child process whose stdout is a pipe, as under cron."""
    return subprocess.run([*HRAG, "index", *args, "--extractor", "rules", "--embed-model", "builtin"],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)


# ------------------------------------------------------------------------------------------------ readers


def test_html_keeps_main_text_and_headings_without_navigation_scripts_or_styles(tmp_path: Path) -> None:
    (tmp_path / "deps.html").write_text(PAGE)
    secs = sections_of(tmp_path / "deps.html")
    text = "\n".join(t for _, t in secs)
    for gone in ("tracking", "color: red", "navigation link", "Banner slogan", "Copyright footer", "Site title"):
        assert gone not in text, gone
    assert [trail for trail, _ in secs] == [("Dependencies",), ("Dependencies", "With yield")]
    assert "def get_db():\n    yield db" in text          # <pre> keeps its lines
    assert secs[1][1].startswith("With yield\n\nA dependency with yield runs")


def test_an_html_page_renamed_txt_is_read_as_html(tmp_path: Path) -> None:
    (tmp_path / "saved.txt").write_text(PAGE)
    secs = sections_of(tmp_path / "saved.txt")
    assert secs[0][0] == ("Dependencies",) and "<p>" not in secs[0][1] and "tracking" not in secs[0][1]
    (tmp_path / "saved.txt").write_text('<?xml version="1.0" encoding="utf-8"?>\n' + PAGE.split("\n", 1)[1])
    assert sections_of(tmp_path / "saved.txt")[0][0] == ("Dependencies",)      # XHTML with an XML declaration


def test_pdf_text_layer_page_by_page_and_pages_without_text_reported(tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "manual.pdf", [["Chapter one explains the sea wall.", "It was built of stone-",
                                              "work in 1902."], None, ["Page three names Mara Quint."]])
    rep, buf = reporter()
    result = scan([pdf], DocumentSettings(), rep)
    (loaded,) = result.documents
    (sec,) = list(loaded.sections())
    assert "built of stonework in 1902." in sec.text and "Mara Quint" in sec.text
    assert [p for _, p in sec.pages] == [1, 3] and loaded.doc.metadata == {"pages": 3}
    assert "manual.pdf: 1 of 3 pages have no text layer" in buf.getvalue() and "p. 2" in buf.getvalue()
    chunks = list(chunk_sections([sec], tokens=12, overlap=0))
    assert chunks[0].page == 1 and chunks[-1].page == 3 and "Mara Quint" in chunks[-1].text
    assert [c.page_end for c in chunk_sections([sec], tokens=1000)] == [3]


def test_pdf_without_text_layer_encrypted_and_damaged_are_listed_with_their_reason(tmp_path: Path) -> None:
    make_pdf(tmp_path / "scan.pdf", [None, None])
    (tmp_path / "locked.pdf").write_bytes((FIXTURES / "encrypted.pdf").read_bytes())
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4\nnot really")
    (tmp_path / "ok.md").write_text("# Fine\n\nSome text.")
    rep, buf = reporter()
    result = scan([tmp_path], DocumentSettings(), rep)
    assert [d.doc.path for d in result.documents] == ["ok.md"]
    reasons = dict(line.split(": ", 1) for line in result.skipped)
    assert reasons["scan.pdf"].startswith("no text layer") and "OCR" in reasons["scan.pdf"]
    assert reasons["locked.pdf"].startswith("encrypted")
    assert reasons["broken.pdf"].startswith("unreadable PDF")
    assert result.skipped_by_ext == {".pdf": 3}
    assert "skipped locked.pdf: encrypted" in buf.getvalue()


def test_docx_paragraphs_with_heading_styles(tmp_path: Path) -> None:
    make_docx(tmp_path / "guide.docx", [("Title", "Guide"), ("", "Intro & overview."), ("Heading1", "Install"),
                                        ("", "Run pip install."), ("Heading2", "Extras"), ("", "Add the pdf extra."),
                                        ("Heading1", "Use"), ("", "Call it.")])
    secs = sections_of(tmp_path / "guide.docx")
    assert [t for t, _ in secs] == [("Guide",), ("Guide", "Install"), ("Guide", "Install", "Extras"), ("Guide", "Use")]
    assert secs[0][1] == "Guide\n\nIntro & overview." and secs[3][1] == "Use\n\nCall it."
    (tmp_path / "fake.docx").write_bytes(b"\xd0\xcf\x11\xe0 an OLE file, as an encrypted DOCX is")
    result = scan([tmp_path], DocumentSettings(), reporter()[0])
    assert result.skipped == ["fake.docx: encrypted or damaged DOCX (not a zip file)"]


@pytest.mark.parametrize("name, text, trails", [
    ("a.rst", "Guide\n=====\n\nIntro.\n\nInstall\n-------\n\nRun it.\n\nExtras\n~~~~~~\n\nMore.\n\nUse\n---\n\nGo.\n",
     [("Guide",), ("Guide", "Install"), ("Guide", "Install", "Extras"), ("Guide", "Use")]),
    ("a.adoc", "= Guide\n\nIntro.\n\n== Install\n\nRun it.\n\n=== Extras\n\nMore.\n",
     [("Guide",), ("Guide", "Install"), ("Guide", "Install", "Extras")]),
    ("a.org", "* Guide\nIntro.\n** Install\nRun it.\n* Other\nGo.\n", [("Guide",), ("Guide", "Install"), ("Other",)]),
    ("a.tex", "\\section{Guide}\nIntro.\n\\subsection{Install}\nRun it.\n% \\section{Not one}\n",
     [("Guide",), ("Guide", "Install")]),
    ("a.md", "Intro.\n\n# Guide\n\n```\n# not a heading\n```\n\n## Install\n\nRun it.\n",
     [(), ("Guide",), ("Guide", "Install")]),
    ("a.py", "# a comment, not a heading\ndef f():\n    return 1\n", [()]),
    ("data.csv", "name,city\nMara,Oldport\n", [()]),
    ("Makefile", "all:\n\techo hi\n", [()]),
])
def test_plain_text_markups_keep_their_headings(tmp_path: Path, name: str, text: str, trails: list) -> None:
    (tmp_path / name).write_text(text)
    secs = sections_of(tmp_path / name)
    assert [t for t, _ in secs] == trails
    assert "".join(t for _, t in secs).replace("\n", "") == text.replace("\n", "")   # nothing lost


# ------------------------------------------------------------------------------------------------ the scan


def test_every_file_is_indexed_or_listed_with_its_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\n\nMara Quint built the Selby Lighthouse.")
    (docs / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (docs / "logo2.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x01")
    (docs / "bin.txt").write_bytes(b"abc\x00def")
    (docs / "latin.txt").write_bytes("café".encode("latin-1"))
    (docs / "empty.rst").write_text("  \n")
    (docs / "big.html").write_text(PAGE)
    (docs / "real").mkdir()
    (docs / "real" / "inner.txt").write_text("Read once through either name.")
    os.symlink("real", docs / "alias")                 # a second name for a folder: read once
    os.symlink(".", docs / "real" / "up")              # a link to a folder above: a loop
    monkeypatch.setattr(documents, "MAX_WHOLE_BYTES", 100)
    result = scan([docs], DocumentSettings(), reporter()[0])
    assert sorted(d.doc.path for d in result.documents) == ["a.md", "alias/inner.txt"]
    reasons = dict(line.split(": ", 1) for line in result.skipped)
    assert reasons == {"bin.txt": "binary file", "big.html": reasons["big.html"], "empty.rst": "empty",
                       "latin.txt": "not UTF-8 text", "logo.png": "unsupported type '.png'",
                       "logo2.png": "unsupported type '.png'", "alias/up": "symlink loop"}
    assert reasons["big.html"].startswith("too big")
    assert result.skipped_by_ext[".png"] == 2 and result.skipped_by_reason["unsupported type"] == 2
    files = [p for p in docs.rglob("*") if p.is_file() and "alias" not in p.parts]
    assert len(files) == len(result.documents) + len(result.skipped) - 1     # -1: the loop is a folder


def test_include_takes_every_supported_type(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "page.html").write_text(PAGE)
    make_pdf(docs / "doc.pdf", [["A PDF sentence about harbours."]])
    make_docx(docs / "doc.docx", [("", "A DOCX sentence about harbours.")])
    (docs / "page.rst").write_text("Title\n=====\n\nAn rst sentence.\n")
    (docs / "code.py").write_text("def harbour():\n    return 'wall'\n")
    for pattern, made in (("*.pdf", "doc.pdf"), ("*.docx", "doc.docx"), ("*.rst", "page.rst"), ("*.py", "code.py")):
        result = scan([docs], DocumentSettings(include=[pattern]), reporter()[0])
        assert [d.doc.path for d in result.documents] == [made] and result.excluded == 4 and not result.skipped
    proc = index(str(docs), "-p", str(tmp_path / "p"), "--include", "*.html", "--stop-after", "chunk", "--json")
    assert proc.returncode == 0, proc.stderr
    chunk = json.loads(proc.stdout)["chunk"]
    assert chunk["docs"] == 1 and chunk["excluded_files"] == 4 and chunk["skipped_files"] == 0


# ------------------------------------------------------------------------------------------------ chunks


def test_chunks_break_at_sentences_and_never_start_mid_sentence() -> None:
    text = " ".join(f"Sentence {i} tells of the harbour wall at Oldport, which stood for years." for i in range(300))
    for overlap in (0, 30, 100):
        chunks = chunk_text(text, 100, overlap)
        assert len(chunks) > 10
        for c in chunks:
            assert c.text.startswith("Sentence ") and c.text.endswith("years."), c.text[:40]
    long_one = "word " * 500 + "end."          # one sentence longer than a chunk: cut, as it must be
    assert len(chunk_text(long_one, 100, 10)) > 4


def test_sections_split_chunks_and_carry_their_trail() -> None:
    secs = [readers.Section("Intro\n\nShort intro.", ("Guide",)),
            readers.Section("Install\n\n" + "Run the installer now. " * 80, ("Guide", "Install"))]
    chunks = list(chunk_sections(secs, tokens=120, overlap=20))
    assert chunks[0].text == "Intro\n\nShort intro." and chunks[0].trail == ("Guide",)
    assert len(chunks) > 2 and all(c.trail == ("Guide", "Install") for c in chunks[1:])


def test_short_sections_are_packed_into_one_chunk_under_their_common_trail() -> None:
    secs = [readers.Section("Guide\n\nIntro.", ("Guide",)), readers.Section("Install\n\nRun it.", ("Guide", "Install")),
            readers.Section("Extras\n\nMore.", ("Guide", "Install", "Extras")),
            readers.Section("Use\n\n" + "Call it often. " * 60, ("Guide", "Use"))]
    chunks = list(chunk_sections(secs, tokens=100, overlap=0))
    assert chunks[0].text == "Guide\n\nIntro.\n\nInstall\n\nRun it.\n\nExtras\n\nMore." and chunks[0].trail == ("Guide",)
    assert all(c.trail == ("Guide", "Use") and c.text.startswith(("Use", "Call")) for c in chunks[1:])
    assert len(chunks) >= 3


def test_query_shows_section_and_page_and_answer_cites_them(tmp_path: Path, stub) -> None:
    docs = tmp_path / "docs"
    (docs / "guide").mkdir(parents=True)
    (docs / "guide" / "deps.md").write_text(
        "# Dependencies\n\nDependencies run before a view.\n\n## With yield\n\n"
        "Marlowe Vance wrote the yield cleanup hook for the Quillfeather framework.\n")
    make_pdf(docs / "manual.pdf", [["The manual starts here."], ["Ottoline Brask maintains the Quillfeather",
                                                                 "harbour gauge at Pellmouth."]])
    proj = tmp_path / "p"
    proc = index(str(docs), "-p", str(proj), "--chunk-tokens", "30", "--chunk-overlap", "5")   # each section its own chunk
    assert proc.returncode == 0, proc.stderr
    res = CliRunner().invoke(app, ["query", "Who maintains the Quillfeather harbour gauge at Pellmouth?", "-p",
                                   str(proj), "--json", "-m", "bm25"])
    assert res.exit_code == 0, res.output
    top = json.loads(res.stdout)["chunks"][0]
    assert top["path"] == "manual.pdf" and (top["page"], top["page_end"]) == (1, 2)
    assert top["where"] == "manual.pdf pp. 1-2"
    res = CliRunner().invoke(app, ["query", "Who wrote the yield cleanup hook?", "-p", str(proj), "-m", "bm25"],
                             env={"COLUMNS": "200"})
    assert "guide/deps.md › Dependencies › With yield" in res.stdout
    stub.set_chat(lambda body: "Marlowe Vance wrote it [1].")
    res = CliRunner().invoke(app, ["query", "Who wrote the yield cleanup hook?", "-p", str(proj), "-m", "bm25",
                                   "--answer", "--json", "--llm-model", "openai/stub-model", "--llm-api-base",
                                   stub.url])
    obj = json.loads(res.stdout)
    assert obj["citations"][0]["where"] == "guide/deps.md › Dependencies › With yield"
    assert obj["citations"][0]["section"] == ["Dependencies", "With yield"]
    assert "[1] guide/deps.md › Dependencies › With yield" in obj["context"]


def test_a_project_chunked_by_the_previous_chunker_is_rechunked(tmp_path: Path, monkeypatch) -> None:
    from hrag_cli.chunk import stage
    from hrag_cli.pipeline import IndexOptions, run_index
    from hrag_cli.core.project import ProjectDir

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# Harbour\n\nMara Quint built the sea wall.\n\n## Stone\n\nIt was stone.\n")
    proj = ProjectDir(tmp_path / "p")
    proj.init()
    monkeypatch.setattr(stage, "CHUNKER_VERSION", "chunk-v1")
    old = run_index(proj, proj.settings(), Reporter("quiet"), IndexOptions(docs=[docs]))
    before = stage.load_chunks(proj)
    for ch in before:     # as the previous chunker wrote them: no section
        ch.section = []
    monkeypatch.undo()
    new = run_index(proj, proj.settings(), Reporter("quiet"), IndexOptions(docs=[docs]))
    assert old.exit_code == new.exit_code == 0
    assert new.summary["chunk"]["reused_docs"] == 0 and new.summary["chunk"]["read_files"] == 1
    after = stage.load_chunks(proj)
    assert [c.section for c in after] == [["Harbour"]]     # both sections fit one chunk: their common trail
    # the same text keeps its id, so nothing is extracted again
    assert [c.chunk_id for c in after] == [c.chunk_id for c in before]
    assert new.summary["extract"]["extracted_now"] == 0


# ------------------------------------------------------------------------------------------------ output


def test_cron_summary_is_full_lines_in_a_users_words(tmp_path: Path) -> None:
    deep = tmp_path / "docs" / "tutorial" / "dependencies" / "dependencies-with-yield-and-exceptions"
    deep.mkdir(parents=True)
    (deep / "install-custom-exception-handlers-for-every-dependency.md").write_text("# X\n\nMara built it.\n")
    (tmp_path / "docs" / "photo-of-the-dependency-graph-in-the-tutorial-section.png").write_bytes(b"\x89PNG")
    time.sleep(1.1)       # a file changed in the last second is read again next time (documents.RACY_NS)
    proc = index(str(tmp_path / "docs"), "-p", str(tmp_path / "p"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for word in ("epoch", "cache_mark", "idf_fingerprint", "unread_files", "…"):
        assert word not in out, word
    assert "files: 1 read, 0 unchanged, 1 skipped (unsupported type 1; by type: .png 1)" in out
    assert "chunks: 1 (1 new, 0 removed)" in out and "time: " in out and "entities" in out
    assert "photo-of-the-dependency-graph-in-the-tutorial-section.png: unsupported type '.png'" in out
    again = index(str(tmp_path / "docs"), "-p", str(tmp_path / "p"))
    assert "files: 0 read, 1 unchanged, 1 skipped" in again.stdout
    status = CliRunner().invoke(app, ["status", "-p", str(tmp_path / "p")])
    assert "files not indexed: 1 (unsupported type 1; by type: .png 1)" in status.stdout
    assert "photo-of-the-dependency-graph-in-the-tutorial-section.png: unsupported type '.png'" in status.stdout
