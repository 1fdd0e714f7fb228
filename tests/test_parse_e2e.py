"""Dropped rows end to end: counted per reason in each extraction record, shown by `hrag status` (plain and
--json), and `hrag index --reparse` rebuilding records written by an older parser from the cached answers
with no request to the model (the stub server counts them)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hrag_cli.core import store
from hrag_cli.extract.parser import PARSER_VERSION
from tests.test_index_e2e import CHAT, D, index, is_gleaning, passage_of, run, small_corpus, summary


def damaged_extraction(body: dict) -> str:
    """Good rows for the passage's capitalised words, one relation behind a mutated delimiter (`<[#|>`, which
    older parsers lost), a name-only row and a relation that lost its target."""
    if is_gleaning(body):
        return "<|COMPLETE|>"
    words: list[str] = []
    for w in re.findall(r"\b[A-Z][a-z]{3,}\b", passage_of(body)):
        if w not in words:
            words.append(w)
    a, b = words[0], words[1]
    rows = [f"entity{D}{w}{D}concept{D}{w} is mentioned in the passage." for w in words[:6]]
    rows += [f"relation<[#|>{a}{D}{b}{D}appears with{D}co-occurrence{D}{a} and {b} appear together.{D}5",
             f"entity{D}2023",
             f"relation{D}{a}{D}was founded by{D}origin, {b}{D}{b} founded it.{D}7",
             "<|COMPLETE|>"]
    return "\n".join(rows)


def latest_records(project: Path) -> dict[str, dict]:
    return {r["chunk_id"]: r for r in store.read_jsonl(project / "cache" / "extractions.jsonl")}


def test_dropped_rows_counted_shown_and_reparse_recovers_without_the_model(stub, tmp_path: Path) -> None:
    stub.set_chat(damaged_extraction)
    docs, proj = small_corpus(tmp_path, 3), tmp_path / "proj"
    assert index(docs, proj, stub, "--max-gleanings", "0").returncode == 0
    recs = latest_records(proj)
    n = len(recs)
    assert n >= 3 and stub.count(CHAT) == n
    for rec in recs.values():
        assert rec["dropped"] == {"name_only": 1, "shifted_fields": 1} and rec["dropped_rows"] == 2
        assert rec["parser"] == PARSER_VERSION and len(rec["relations"]) == 1

    status = json.loads(run(["status", "-p", str(proj), "--json"], inprocess=True).stdout)
    assert status["dropped_by_reason"] == {"name_only": n, "shifted_fields": n}
    assert status["extraction"]["dropped_rows"] == 2 * n
    assert {c["chunk_id"] for c in status["dropped_chunks"]} == set(recs)
    assert all(c["dropped"] == {"name_only": 1, "shifted_fields": 1} and c["path"] for c in status["dropped_chunks"])
    assert "reparse" not in status
    plain = run(["status", "-p", str(proj)], inprocess=True).stdout
    assert f"chunks with dropped rows: {n}" in plain and "name_only=1, shifted_fields=1" in plain

    # The same cache as an older parser left it: the relation behind `<[#|>` lost, one uncounted total.
    path = proj / "cache" / "extractions.jsonl"
    old = []
    for rec in recs.values():
        rec = {k: v for k, v in rec.items() if k not in ("dropped", "retyped", "parser")}
        old.append({**rec, "relations": [], "dropped_rows": 1})
    path.write_text("".join(json.dumps(r) + "\n" for r in old), encoding="utf-8")
    status = json.loads(run(["status", "-p", str(proj), "--json"], inprocess=True).stdout)
    assert status["dropped_by_reason"] == {"reason_not_recorded": n}
    assert "--reparse" in status["reparse"]

    before = stub.count(CHAT)
    rep = index(None, proj, stub, "--max-gleanings", "0", "--reparse")
    assert rep.returncode == 0, rep.stderr
    assert summary(rep)["extract"]["reparsed"] == n and summary(rep)["extract"]["reparse_changed"] == n
    assert stub.count(CHAT) == before                     # no request: every answer came from the cache
    for rec in latest_records(proj).values():
        assert len(rec["relations"]) == 1 and rec["dropped"] == {"name_only": 1, "shifted_fields": 1}
    status = json.loads(run(["status", "-p", str(proj), "--json"], inprocess=True).stdout)
    assert status["dropped_by_reason"] == {"name_only": n, "shifted_fields": n} and "reparse" not in status
