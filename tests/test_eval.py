"""`hrag eval`: Recall@k on a toy gold file whose expected values follow from the rankings themselves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hrag_cli.cli import app
from hrag_cli.core.errors import UsageError
from hrag_cli.api import Project
from hrag_cli.query.evaluate import GoldResolver, evaluate, load_qa
from hrag_cli.core.project import ProjectDir
from hrag_cli.query.index import QueryIndex
from hrag_cli.query.retrieval import retrieve

QA = "Who led the strike at the salt pans?"
QB = "Which bridge did Corvane Works build over the Tessaly River?"


def _toy(tmp_path: Path, project: ProjectDir) -> tuple[Path, dict]:
    """Gold items chosen from the naive ranking: each question has one hit at a known rank and one miss."""
    ix = QueryIndex(project, project.settings())
    s = project.settings()
    a = retrieve(ix, QA, s, mode="naive").chunks
    b = retrieve(ix, QB, s, mode="naive").chunks
    outside_a = next(cid for cid in ix.chunk_ids if cid not in {c.chunk_id for c in a})
    strike = next(c for c in ix.chunks.values() if c.text.startswith("Salt Strike Ends After Eleven Weeks"))
    rows = [
        # hit at rank 1 (by document path), a miss (by chunk id of a chunk outside the top 5)
        {"id": "a", "question": QA, "gold_docs": [a[0].path, outside_a]},
        # hit at rank 3 (by exact passage text, whitespace changed), a gold that matches nothing
        {"id": "b", "query": QB, "gold": ["  ".join(b[2].text.split()), "no/such/doc.txt"]},
        # by title (first line of a .jsonl record chunk) and by a trailing path
        {"question": QA, "gold_passages": ["Salt Strike Ends After Eleven Weeks", "edric_solano.txt"]},
    ]
    path = tmp_path / "qa.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    ranked_c = [c.chunk_id for c in a]
    edric = next(c.chunk_id for c in ix.chunks.values() if ix.doc_path(c.doc_id) == "people/edric_solano.txt")

    def found(cid: str, k: int) -> int:
        return int(cid in ranked_c[:k])

    expect = {}
    for k in (1, 2, 5):
        qa = 0.5 * (1 if k >= 1 else 0)
        qb = 0.5 * (1 if k >= 3 else 0)
        qc = (found(strike.chunk_id, k) + found(edric, k)) / 2
        expect[k] = (qa + qb + qc) / 3
    return path, expect


def test_recall_at_k_on_a_toy_gold_file(sample_project: Path, tmp_path: Path) -> None:
    project = ProjectDir(sample_project)
    path, expect = _toy(tmp_path, project)
    result = evaluate(project, project.settings(), load_qa(path), ["naive"], [1, 2, 5])
    assert result["questions"] == 3 and result["unresolved_gold"] == 1
    for k in (1, 2, 5):
        assert result["modes"]["naive"]["recall"][str(k)] == pytest.approx(expect[k], abs=1e-4)


def test_eval_cli_json_and_table(sample_project: Path, tmp_path: Path) -> None:
    path, expect = _toy(tmp_path, ProjectDir(sample_project))
    res = CliRunner().invoke(app, ["eval", str(path), "-p", str(sample_project), "--modes", "naive,bm25",
                                   "-k", "5,2", "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    assert obj["k"] == [2, 5] and set(obj["modes"]) == {"naive", "bm25"}
    assert obj["modes"]["naive"]["recall"]["5"] == pytest.approx(expect[5], abs=1e-4)
    assert obj["modes"]["bm25"]["ms_per_query"] >= 0
    res = CliRunner().invoke(app, ["eval", str(path), "-p", str(sample_project), "--modes", "naive"],
                             catch_exceptions=False)
    assert res.exit_code == 0 and "R@2" in res.stdout and "R@5" in res.stdout and "naive" in res.stdout


def test_gold_resolver_forms(sample_project: Path) -> None:
    ix = QueryIndex(ProjectDir(sample_project), ProjectDir(sample_project).settings())
    r = GoldResolver(ix.chunks, ix.docs)
    assert len(r.resolve("records.jsonl#eg-1968-astrolabe")) == 1
    assert r.resolve("people/edric_solano.txt") == r.resolve("edric_solano.txt")
    cid = next(iter(ix.chunks))
    assert r.resolve(cid) == {cid}
    assert r.resolve("nothing at all") == set()


def test_bad_eval_input(sample_project: Path, tmp_path: Path) -> None:
    project = ProjectDir(sample_project)
    bad = tmp_path / "bad.jsonl"
    for content, msg in [('{"question": "q"}\n', "no gold"), ("nope\n", "not valid JSON"),
                         ('{"gold": ["x"]}\n', "question"), ("\n", "no questions")]:
        bad.write_text(content, encoding="utf-8")
        with pytest.raises(UsageError, match=msg):
            load_qa(bad)
    good = tmp_path / "good.jsonl"
    good.write_text('{"question": "q", "gold": ["x"]}\n', encoding="utf-8")
    with pytest.raises(UsageError, match="unknown mode"):
        Project(project.root).evaluate(good, modes=["ppr", "dense"], ks=[2])
    bad_k = CliRunner().invoke(app, ["eval", str(good), "-p", str(project.root), "--modes", "ppr", "-k", "two"])
    assert isinstance(bad_k.exception, UsageError) and "-k" in str(bad_k.exception)
    with pytest.raises(UsageError, match="does not exist"):
        load_qa(tmp_path / "missing.jsonl")


def test_table_title_with_markup_like_file_name(sample_project: Path, tmp_path: Path, capsys) -> None:
    """The QA file's name is printed as written (rich used to swallow "[citation needed]" as a style tag)."""
    project = ProjectDir(sample_project)
    src, _ = _toy(tmp_path, project)
    path = tmp_path / "qa [citation needed].jsonl"
    src.rename(path)
    result = CliRunner().invoke(app, ["eval", str(path), "-p", str(project.root), "--modes", "bm25", "-k", "2"])
    assert result.exit_code == 0, result.output
    print(result.stdout)
    assert "qa[citationneeded].jsonl" in "".join(capsys.readouterr().out.split())   # the title may wrap
