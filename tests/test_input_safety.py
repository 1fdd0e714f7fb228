"""Inputs and settings checked before anything is written; hostile text kept off the terminal; keys kept out of
stored and printed provider errors; unreadable inputs reported as skipped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.damage import cli

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "sample_corpus"


@pytest.mark.parametrize("args", [
    ("--chunk-overlap", "-1"),
    ("--chunk-overlap", "1200"),               # not smaller than the chunk size
    ("--concurrency", "-1"),                   # 0 is automatic: 8, or 1 for a server on this machine
    ("--max-cost", "-1"),
    ("--max-cost", "nan"),
    ("--chunk-tokens", str(1 << 70)),          # an integer beyond 64 bits
    ("--max-gleanings", "-3"),
])
def test_out_of_range_flags_exit_2_and_create_nothing(tmp_path: Path, args: tuple) -> None:
    proj = tmp_path / "p"
    code, _, err = cli("index", str(CORPUS), "-p", str(proj), "--extractor", "rules", *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("hrag: error: "), err
    assert not proj.exists()


@pytest.mark.parametrize("toml", [
    "[vectors]\nm = 0\n",                      # used to segfault inside hnswlib
    "[query]\npassage_node_weight = nan\n",
    "[query]\ntop_k = 100000000\n",
    "[synonyms]\ntop_k = 1e8\n",
    "[llm]\ntimeout = -5\n",
    "[query]\ndamping = inf\n",
])
def test_out_of_range_toml_values_are_usage_errors_before_any_write(tmp_path: Path, toml: str) -> None:
    proj = tmp_path / "p"
    proj.mkdir()
    (proj / "hrag.toml").write_text(toml)
    code, _, err = cli("index", str(CORPUS), "-p", str(proj), "--extractor", "rules")
    assert code == 2 and "out of range" in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in proj.iterdir()) == ["hrag.toml"]


def test_usage_errors_and_dry_run_create_no_project(tmp_path: Path) -> None:
    for args in (("--extractor", "nosuch"), ("--stop-after", "synonyms"), ("--embed-model", "nosuchprovider/x"),
                 ("--dry-run",)):
        proj = tmp_path / "p"
        code, _, err = cli("index", str(CORPUS), "-p", str(proj), "--extractor", "rules", *args)
        assert not proj.exists(), args
        assert code == (0 if args == ("--dry-run",) else 2), (args, err)
    (tmp_path / "empty").mkdir()
    for docs in (tmp_path / "empty", tmp_path / "nosuch"):   # bad input found once the run has started
        code, _, err = cli("index", str(docs), "-p", str(tmp_path / "p"), "-q")
        assert code == 2 and len(err.strip().splitlines()) == 1 and not (tmp_path / "p").exists(), err


def test_symlink_loop_is_skipped_not_fatal(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Mara Quint built the Selby Lighthouse in 1902.")
    os.symlink("loop.txt", docs / "loop.txt")
    os.symlink("b", docs / "a_dir_loop")
    os.symlink("a_dir_loop", docs / "b")
    code, _, err = cli("index", str(docs), "-p", str(tmp_path / "p"), "--extractor", "rules", "-q")
    assert code == 0, err
    assert "skipped loop.txt: symlink loop" in err


def test_unreadable_folder_is_reported_as_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hrag_cli.core.config import DocumentSettings
    from hrag_cli.chunk.documents import scan
    from hrag_cli.core.progress import Reporter

    docs = tmp_path / "docs"
    (docs / "locked").mkdir(parents=True)
    (docs / "a.txt").write_text("Mara Quint built the Selby Lighthouse in 1902.")
    (docs / "locked" / "b.txt").write_text("Hidden text.")
    real = os.scandir

    def scandir(path="."):   # what a folder without read permission does (root ignores chmod, so simulate it)
        if Path(path).name == "locked":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    result = scan([docs], DocumentSettings(), Reporter("quiet"))
    assert [d.doc.path for d in result.documents] == ["a.txt"]
    assert result.skipped == ["locked: unreadable folder (Permission denied)"]


def test_control_characters_never_reach_the_terminal(tmp_path: Path) -> None:
    from hrag_cli.core.redact import printable

    docs = tmp_path / "docs"
    docs.mkdir()
    hostile = "\x1b]0;pwned\x07\x1b[2J"
    (docs / f"evil{hostile}.txt").write_text(f"Mara Quint {hostile} built the Selby Lighthouse in 1902.")
    (docs / f"empty{hostile}.txt").write_text("")
    proj = tmp_path / "p"
    code, out, err = cli("index", str(docs), "-p", str(proj), "--extractor", "rules", "--embed-model", "builtin")
    assert code == 0, err
    assert "\x1b" not in out + err and "\x07" not in out + err and "\\x1b]0;pwned" in err
    for args in (("query", "Selby Lighthouse", "--mode", "naive"), ("status",)):
        code, out, err = cli(*args, "-p", str(proj))
        assert code == 0 and "\x1b" not in out + err and "\x07" not in out + err, err
    assert printable("a\x1b[2Jb\u202ec\td\n") == "a\\x1b[2Jb\\u202ec\td\n"


def test_provider_error_text_is_scrubbed_before_it_is_stored_or_printed(stub, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.stub_server import CHAT, StubReply

    key = "sk-live-" + "Zq7" * 12
    monkeypatch.setenv("OPENAI_API_KEY", key)
    echo = f"invalid request; headers: Authorization: Bearer {key}; api_key={key}"
    stub.enqueue(CHAT, *[StubReply(status=400, content=echo) for _ in range(20)])
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Mara Quint built the Selby Lighthouse in 1902.")
    proj = tmp_path / "p"
    code, out, err = cli("index", str(docs), "-p", str(proj), "--extractor", "llm", "--llm-model", "openai/stub",
                         "--llm-api-base", stub.url, "--stop-after", "extract")
    stored = b"".join(p.read_bytes() for p in (proj / "cache").rglob("*.jsonl"))
    assert b"invalid request" in stored                  # the provider's message is kept ...
    assert key.encode() not in stored and key not in out + err   # ... without the key
    code, out, err = cli("status", "-p", str(proj))
    assert key not in out + err


def test_disk_full_is_one_line_naming_the_file(tmp_path: Path) -> None:
    from hrag_cli.core import store
    from hrag_cli.core.errors import HragError

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    path = tmp_path / "extractions.jsonl"
    os.symlink("/dev/full", path)        # every write there fails with ENOSPC, as on a full disk
    appender = store.JsonlAppender(path)
    with pytest.raises(HragError, match=r"cannot write .*extractions\.jsonl: No space left on device"):
        appender.append({"chunk_id": "a" * 5000})


def test_every_numeric_setting_has_a_range() -> None:
    """A new numeric setting must say its range (config.RANGES), or a bad value reaches the stages unchecked."""
    from dataclasses import fields

    from hrag_cli.core.config import RANGES, Settings

    s = Settings()
    numeric = {f"{sec.name}.{f.name}" for sec in fields(s) for f in fields(getattr(s, sec.name))
               if type(getattr(getattr(s, sec.name), f.name)) in (int, float)}
    assert numeric - set(RANGES) == set()
    assert set(RANGES) - numeric == set()


def test_a_big_text_file_is_streamed_with_the_same_documents_and_chunks(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A file over BIG_FILE_BYTES is hashed and chunked a block at a time, never read whole; the result is the
    one a whole read gives (BOM, CRLF split across blocks, multi-byte characters, segment cuts)."""
    from hrag_cli.chunk import chunking
    from hrag_cli.chunk import documents
    from hrag_cli.core.config import DocumentSettings
    from hrag_cli.core.progress import Reporter

    para = "Ünïcode Mara Quint\r\nbuilt the lighthouse.\r\n\r\nOldport — harbour " * 40
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "big.txt").write_bytes(b"\xef\xbb\xbf" + para.encode("utf-8"))
    (docs / "binary.txt").write_bytes(b"text " * 10 + b"\x00" + b"more" * 10)

    def scan() -> list:
        res = documents.scan([docs], DocumentSettings(), Reporter("quiet"))
        return [(d.doc, list(d.segments())) for d in res.documents], res.skipped

    whole, skipped_whole = scan()
    monkeypatch.setattr(documents, "BIG_FILE_BYTES", 64)
    for block in (7, 64, 1000):
        monkeypatch.setattr(documents, "BLOCK_BYTES", block)
        (doc, segs), = [x for x in scan()[0]]
        assert doc == whole[0][0] and "".join(segs) == whole[0][1][0]
        assert scan()[1] == skipped_whole and "binary" in skipped_whole[0]
    text = whole[0][1][0]
    for size in (50, 333, 5000):
        blocks = [text[i:i + 97] for i in range(0, len(text), 97)]
        assert list(chunking.stream_segments(blocks, size)) == [text[a:b] for a, b in chunking.segments(text, size)]
