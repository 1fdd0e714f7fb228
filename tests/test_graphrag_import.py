"""`hrag index --import-graphrag DIR`: a GraphRAG output folder becomes a project with no LLM call.

The tables are written here with GraphRAG's column names (documents, text_units, entities, relationships).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hrag_cli.chunk.stage import load_chunks
from hrag_cli.core.project import ProjectDir
from tests.test_index_e2e import _one_line_error, run, summary

UNITS = ["Mara Quint founded the Harbour Trust in Oldport.",
         "The Harbour Trust restored the Selby Lighthouse.",
         "Ilse Varga keeps the Oldport museum."]


def output_folder(tmp_path: Path) -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    out = tmp_path / "output"
    out.mkdir()
    units = ["u-a", "u-b", "u-c"]
    pq.write_table(pa.Table.from_pylist([
        {"id": "d1", "human_readable_id": 0, "title": "trust.txt", "text": " ".join(UNITS[:2]),
         "text_unit_ids": ["u-a", "u-b"]},
        {"id": "d2", "human_readable_id": 1, "title": "museum.txt", "text": UNITS[2], "text_unit_ids": ["u-c"]},
    ]), out / "documents.parquet")
    pq.write_table(pa.Table.from_pylist([
        {"id": u, "human_readable_id": i, "text": t, "n_tokens": len(t.split()),
         "document_ids": ["d2" if u == "u-c" else "d1"]} for i, (u, t) in enumerate(zip(units, UNITS))
    ][::-1]), out / "text_units.parquet")
    ents = [("MARA QUINT", "PERSON", ["u-a"]), ("HARBOUR TRUST", "ORGANIZATION", ["u-a", "u-b"]),
            ("SELBY LIGHTHOUSE", "GEO", ["u-b"]), ("ILSE VARGA", "PERSON", ["u-c"]),
            ("OLDPORT MUSEUM", "ORGANIZATION", ["u-c"])]
    pq.write_table(pa.Table.from_pylist([
        {"id": f"e{i}", "human_readable_id": i, "title": n, "type": t, "description": f"About {n}.",
         "text_unit_ids": u, "degree": 1} for i, (n, t, u) in enumerate(ents)]), out / "entities.parquet")
    rels = [("MARA QUINT", "HARBOUR TRUST", ["u-a"]), ("HARBOUR TRUST", "SELBY LIGHTHOUSE", ["u-b"]),
            ("ILSE VARGA", "OLDPORT MUSEUM", ["u-c"])]
    pq.write_table(pa.Table.from_pylist([
        {"id": f"r{i}", "human_readable_id": i, "source": s, "target": t, "description": f"{s} and {t}.",
         "weight": 2.0, "text_unit_ids": u} for i, (s, t, u) in enumerate(rels)]), out / "relationships.parquet")
    return out


def test_graphrag_tables_become_a_project(tmp_path: Path, stub) -> None:
    folder = output_folder(tmp_path)
    with_llm = run(["index", "-p", str(tmp_path / "llm"), "--import-graphrag", str(folder), "--llm-model",
                    "openai/stub-model", "--llm-api-base", stub.url, "--json"], inprocess=True)
    assert with_llm.returncode == 0, with_llm.stderr
    assert stub.count() == 0 and summary(with_llm)["extract"]["llm_requests"] == 0   # a model set, never asked
    proj = tmp_path / "proj"
    proc = run(["index", "-p", str(proj), "--import-graphrag", str(folder), "--json"], inprocess=True)
    assert proc.returncode == 0, proc.stderr
    out = summary(proc)
    # one text unit is one chunk, in its document's text_unit_ids order (the table lists them reversed)
    chunks = load_chunks(ProjectDir(proj))
    assert [c.text for c in chunks] == UNITS and [c.order for c in chunks] == [0, 1, 0]
    ex = out["extract"]
    assert (ex["graphrag_table_entities"], ex["graphrag_table_relationships"]) == (5, 3)
    assert (out["resolve"]["entities"], out["resolve"]["relations"]) == (5, 3)
    again = summary(run(["index", "-p", str(proj), "--json"], inprocess=True))   # imports the same folder again
    assert again["resolve"] == "fresh"
    q = run(["query", "Who keeps the Oldport museum?", "--mode", "ppr", "-p", str(proj), "--json"], inprocess=True)
    assert q.returncode == 0 and UNITS[2] in q.stdout


def test_graphrag_bad_folders_and_missing_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proj = tmp_path / "proj"
    _one_line_error(run(["index", "-p", str(proj), "--import-graphrag", str(tmp_path)], inprocess=True), 2,
                    "--import-graphrag", "documents.parquet")
    folder = output_folder(tmp_path)
    (folder / "entities.parquet").write_bytes(b"not parquet")
    _one_line_error(run(["index", "-p", str(proj), "--import-graphrag", str(folder)], inprocess=True), 2,
                    "entities.parquet", "not a readable Parquet")
    monkeypatch.setitem(sys.modules, "pyarrow", None)          # as if the extra were not installed
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    _one_line_error(run(["index", "-p", str(proj), "--import-graphrag", str(folder)], inprocess=True), 2,
                    "hrag[graphrag]")
    assert not proj.exists()
