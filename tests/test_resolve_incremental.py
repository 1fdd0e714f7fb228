"""Resolve after new documents merges only their records into the saved state (resolve_state.py) and patches
the record files (resolve_patch.py): the graph files must equal a fresh build's byte for byte, whatever
happened in between (additions, an edit, a deletion, a damaged or missing state)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hrag_cli.project import Project

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_corpus"
COMPARED = ("entities_path", "relations_path", "facts_path", "merges_path", "graph_path")


def _index(docs: Path, project: Path, *extra: str) -> str:
    from typer.testing import CliRunner

    from hrag_cli.cli import app

    result = CliRunner().invoke(app, ["index", str(docs), "-p", str(project), "--stop-after", "resolve",
                                      "--chunk-tokens", "120", "--chunk-overlap", "10", *extra],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _files(project: Path) -> dict[str, bytes]:
    p = Project(project)
    return {name: getattr(p, name).read_bytes() for name in COMPARED}


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
    _add(docs, "new_a.txt", "Hana Okafor visited Port Ellery in 2001 with the Lantern Archive. "
                            "Quillon Vesk founded the Amberline Guild in Port Ellery.\n")
    _add(docs, "new_b.txt", "HANA OKAFOR met Edric Solano at the Quillon Fair. The Amberline Guild hired Edric Solano.\n")
    _index(docs, inc)
    assert _merged(inc) == 2      # one chunk per new document: only their records were merged
    _same_as_fresh(docs, inc, tmp_path)
