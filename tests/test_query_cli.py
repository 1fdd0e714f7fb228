"""`hrag query` through the CLI: --json schema, --context, batch files, --mode bm25, and --answer and keyword
extraction through the stub LLM server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hrag_cli.cli import app
from hrag_cli.core.errors import UsageError
from hrag_cli.core.project import ProjectDir
from hrag_cli.api import Project
from hrag_cli.query.run import read_queries

Q = "In which village was the founder of the company that built Port Ellery's sea wall born?"
CHUNK_KEYS = {"rank", "chunk_id", "doc_id", "path", "score", "text", "section", "page", "page_end", "where"}
TOP_KEYS = {"query", "mode", "chunks", "entities", "relations", "facts", "keywords", "notes", "timings"}


def _hrag(*args: str) -> list[str]:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return [line for line in result.stdout.splitlines() if line.strip()]


def test_json_schema(sample_project: Path) -> None:
    # common_name_share off: Port Ellery, in 11 of the 20 chunks, still counts as naming the subject, so it walks
    lines = _hrag("query", Q, "-p", str(sample_project), "--json", "--top-k", "3", "--set", "query.common_name_share=0")
    assert len(lines) == 1
    obj = json.loads(lines[0])
    assert set(obj) == TOP_KEYS
    assert obj["query"] == Q and obj["mode"] == "ppr"
    assert len(obj["chunks"]) == 3 and [c["rank"] for c in obj["chunks"]] == [1, 2, 3]
    for c in obj["chunks"]:
        assert set(c) == CHUNK_KEYS and isinstance(c["score"], float) and c["text"]
        assert not c["path"].startswith("/") and c["path"]
    for f in obj["facts"]:
        assert set(f) == {"id", "subject", "predicate", "object", "score"}
    for e in obj["entities"]:
        assert {"id", "name", "type", "description", "score", "seeded_by"} <= set(e)
    assert obj["timings"]["total_ms"] > 0 and "ppr_ms" in obj["timings"]


def test_every_mode_has_the_same_schema(sample_project: Path) -> None:
    for mode in ("local", "global", "hybrid", "naive", "mix", "bm25"):
        obj = json.loads(_hrag("query", Q, "-p", str(sample_project), "--json", "-m", mode)[0])
        assert set(obj) == TOP_KEYS and obj["mode"] == mode and obj["chunks"]
        if mode in ("local", "global", "hybrid", "mix"):
            assert obj["keywords"] == {"high": [Q], "low": [Q]}   # no LLM: the query serves as both
            assert obj["relations"]
            for r in obj["relations"]:
                assert set(r) == {"id", "src", "tgt", "predicates", "keywords", "description", "weight", "score"}


def test_mode_bm25_end_to_end(sample_project: Path) -> None:
    from hrag_cli.storage.bm25 import BM25Index

    query = "salt strike Ruth Calloway"
    obj = json.loads(_hrag("query", query, "-p", str(sample_project), "--json", "-m", "bm25")[0])
    bm = BM25Index.load(sample_project / "vectors" / "bm25")
    want = bm.top_k(query, 5)
    assert [c["chunk_id"] for c in obj["chunks"]] == [cid for cid, _ in want]
    assert obj["chunks"][0]["path"] == "records.jsonl#eg-1949-strike"
    assert obj["chunks"][0]["score"] == pytest.approx(want[0][1])


def test_context_is_numbered_and_pasteable(sample_project: Path) -> None:
    out = "\n".join(_hrag("query", Q, "-p", str(sample_project), "--context", "-m", "hybrid"))
    assert "-----Entities-----" in out and "-----Relations-----" in out and "-----Sources-----" in out
    assert "[1] " in out and "[5] " in out and "[6] " not in out


def test_table_output(sample_project: Path) -> None:
    out = "\n".join(_hrag("query", Q, "-p", str(sample_project)))
    assert "people/edric_solano.txt" in out and "facts" in out


def test_batch_file_three_queries(sample_project: Path, tmp_path: Path) -> None:
    qs = tmp_path / "q.jsonl"
    qs.write_text("\n".join(json.dumps({"id": f"q{i}", "query": q}) for i, q in enumerate(
        [Q, "Who chairs Corvane Works?", "When did the Great Flood happen?"])) + "\n\n", encoding="utf-8")
    lines = _hrag("query", "--file", str(qs), "-p", str(sample_project), "-m", "naive")
    objs = [json.loads(line) for line in lines]
    assert [o["id"] for o in objs] == ["q0", "q1", "q2"]
    assert all(set(o) == TOP_KEYS | {"id"} and len(o["chunks"]) == 5 for o in objs)
    # plain text: one query per line, ids are line numbers
    txt = tmp_path / "q.txt"
    txt.write_text(f"{Q}\n\nWho chairs Corvane Works?\nWhen did the Great Flood happen?\n", encoding="utf-8")
    objs = [json.loads(line) for line in _hrag("query", "--file", str(txt), "-p", str(sample_project), "--context")]
    assert [o["id"] for o in objs] == ["1", "3", "4"] and all(o["context"] for o in objs)


def test_bad_query_input(sample_project: Path, tmp_path: Path) -> None:
    def usage_error(*args: str) -> str:
        result = CliRunner().invoke(app, ["query", *args, "-p", str(sample_project), "--json"])
        assert isinstance(result.exception, UsageError), result.output
        return str(result.exception)

    assert "either a question or --file" in usage_error()
    assert "does not exist" in usage_error("--file", str(tmp_path / "none.txt"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "query": "ok"}\n{"id": 2}\n', encoding="utf-8")
    with pytest.raises(UsageError, match="line 2"):
        read_queries(bad)
    with pytest.raises(UsageError, match="needs an LLM"):
        list(Project(sample_project).retrieve([Q], answer=True))
    empty = ProjectDir(tmp_path / "empty")
    empty.init()
    with pytest.raises(UsageError, match="not built"):
        Project(empty.root).query(Q)


KEYWORDS = {"high_level_keywords": ["sea defences", "company founders"],
            "low_level_keywords": ["Port Ellery", "sea wall", "Edric Solano"]}


def _stub_llm(body: dict) -> str:
    system = body["messages"][0]["content"]
    if "high_level_keywords" in system:
        return "```json\n" + json.dumps(KEYWORDS) + "\n```"
    assert "[1]" in body["messages"][-1]["content"]       # the numbered context reached the model
    return "Edric Solano, who founded Corvane Works, was born in Gullhaven [2][9]. See also [1]."


def test_answer_and_keywords_through_the_stub(sample_project: Path, stub, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "p"
    shutil.copytree(sample_project, root)        # the LLM cache is written into the project
    stub.set_chat(_stub_llm)
    args = ["query", Q, "-p", str(root), "-m", "hybrid", "--json", "--answer",
            "--llm-model", "openai/stub-model", "--llm-api-base", stub.url]
    obj = json.loads(_hrag(*args)[0])
    assert obj["keywords"] == {"high": KEYWORDS["high_level_keywords"], "low": KEYWORDS["low_level_keywords"]}
    assert obj["answer"].startswith("Edric Solano")
    # [9] is not a chunk of the context and is ignored; citations keep the order they appear in
    assert [c["n"] for c in obj["citations"]] == [2, 1]
    assert obj["citations"][0]["path"] == obj["chunks"][1]["path"]
    assert obj["citations"][1]["chunk_id"] == obj["chunks"][0]["chunk_id"]
    assert "-----Sources-----" in obj["context"]
    assert stub.count() == 2
    # the same question again: both calls come from cache/llm.jsonl
    again = json.loads(_hrag(*args)[0])
    assert stub.count() == 2 and again["answer"] == obj["answer"]


def test_a_passage_cited_twice_is_one_citation(sample_project: Path, stub, tmp_path: Path) -> None:
    import shutil

    from tests.stub_server import citing

    root = tmp_path / "p"
    shutil.copytree(sample_project, root)
    stub.set_chat(citing(2, 1, 2, 1, 3))
    obj = json.loads(_hrag("query", Q, "-p", str(root), "-m", "naive", "--top-k", "3", "--json", "--answer",
                           "--llm-model", "openai/stub-model", "--llm-api-base", stub.url)[0])
    assert len(obj["chunks"]) == 3 and obj["answer"].count("[2]") == 2 and obj["answer"].count("[1]") == 2
    # one citation per passage (the last one too), in the order of first mention, each naming its own chunk
    assert [c["n"] for c in obj["citations"]] == [2, 1, 3]
    assert [c["chunk_id"] for c in obj["citations"]] == [obj["chunks"][i]["chunk_id"] for i in (1, 0, 2)]


def test_unparsable_keywords_fall_back_to_the_query(sample_project: Path, stub, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "p"
    shutil.copytree(sample_project, root)
    stub.set_chat(lambda body: "sorry, I cannot help with that")
    obj = json.loads(_hrag("query", Q, "-p", str(root), "-m", "local", "--json",
                           "--llm-model", "openai/stub-model", "--llm-api-base", stub.url)[0])
    assert obj["keywords"] == {"high": [Q], "low": [Q]}
    assert any("could not be parsed" in n for n in obj["notes"])


def test_table_prints_text_that_looks_like_markup(capsys) -> None:
    """Document text, paths, names and the query are printed as written: "[/b]" used to end the command with a
    MarkupError and "[citation needed]" vanished from the table."""
    from hrag_cli.query.run import print_table
    from hrag_cli.query.types import RankedChunk, Retrieval

    r = Retrieval("why [/x] here?", "local",
                  chunks=[RankedChunk("c1", "d1", "notes/[draft].txt", 0.5, "[/b] Lisbon [citation needed]\nmore")],
                  entities=[{"id": "e", "name": "[bold]Lisbon", "type": "place", "description": "", "score": 1.0}],
                  keywords={"high": ["[/h]"], "low": ["[red]low"]}, notes=["kept [/n] of it"])
    print_table(r, {})
    out = capsys.readouterr().out
    for text in ("why [/x] here?", "notes/[draft].txt", "[/b] Lisbon [citation needed]", "[bold]Lisbon",
                 "[/h]", "[red]low", "kept [/n] of it"):
        assert text in out, text
