"""The Python API: the README's snippet, run as written on the sample corpus, and the API against the CLI."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hrag_cli import Hit, IndexResult, Project
from hrag_cli.cli import app
from hrag_cli.core.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent


def _snippet() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_snippet_indexes_and_queries_the_sample_corpus(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sample_corpus").symlink_to(ROOT / "sample_corpus")
    scope: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(_snippet(), scope)
    result, hits, p = scope["result"], scope["hits"], scope["p"]
    assert isinstance(result, IndexResult) and result.exit_code == 0
    assert result.summary["chunk"]["docs"] > 10 and result.summary["resolve"]["entities"] > 0
    assert 0 < len(hits) <= 5 and all(isinstance(h, Hit) for h in hits)
    assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert any("harrowgate_institute" in h.source or "great_flood" in h.source for h in hits)
    assert len(out.getvalue().splitlines()) == len(hits)
    status = p.status()
    assert all(s["state"] == "fresh" for s in status["stages"].values())
    assert (tmp_path / ".hrag-demo" / "manifest.json").exists()


def test_the_api_answers_as_the_cli_does(sample_project: Path) -> None:
    q = "Who founded the institute that warned of the Great Flood of 1987?"
    hits = Project(sample_project).query(q, mode="naive", k=3)
    cli = CliRunner().invoke(app, ["query", q, "-p", str(sample_project), "--json", "-m", "naive", "-k", "3"])
    assert cli.exit_code == 0, cli.output
    chunks = json.loads(cli.stdout)["chunks"]
    assert [(h.chunk_id, h.source, h.score) for h in hits] == [(c["chunk_id"], c["path"], c["score"]) for c in chunks]
    status = CliRunner().invoke(app, ["status", "-p", str(sample_project), "--json"])
    assert json.loads(status.stdout)["stages"] == Project(sample_project).status()["stages"]


def test_errors_raise_what_the_cli_maps_to_exit_codes(tmp_path: Path, sample_project: Path) -> None:
    with pytest.raises(UsageError, match="no hrag project"):
        Project(tmp_path / "none").query("anything")
    with pytest.raises(UsageError, match="--stop-after"):
        Project(tmp_path / "p").index([ROOT / "sample_corpus"], stop_after="synonyms")
    with pytest.raises(UsageError, match="unknown mode"):
        Project(sample_project).evaluate(tmp_path / "qa.jsonl", modes=["dense"])
    assert not (tmp_path / "p").exists()


def test_the_cli_loads_no_api_for_help() -> None:
    code = ("import sys\nimport hrag_cli.cli\n"
            "assert 'hrag_cli.api' not in sys.modules and 'numpy' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
