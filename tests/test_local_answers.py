"""Real answers of a small local model, captured once by `make e2e-local` (bench/e2e_local.py --capture), replayed
offline: the parser and the whole extract stage must cope with what such models really write (cut answers,
missing completion markers, rows in the wrong shape), not only with the stub's perfect rows.

Fixture: tests/fixtures/local_llm_answers.jsonl, one line per chunk: {model, chunk_text, answers: [{purpose,
response, finish_reason, completion_tokens}]}, the first answer and then each gleaning round, in order.
"""

from __future__ import annotations

import json
from pathlib import Path

from hrag_cli.extract import llm_extractor
from hrag_cli.extract.llm_extractor import read_answer
from tests.stub_server import StubReply
from tests.test_index_e2e import CHAT, extraction_lines, index, passage_of, summary

FIXTURE = Path(__file__).parent / "fixtures" / "local_llm_answers.jsonl"
ROWS = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines() if line.strip()]


def _norm(text: str) -> str:
    return " ".join(text.split())


def test_fixture_holds_real_answers() -> None:
    assert len(ROWS) >= 3
    answers = [a for row in ROWS for a in row["answers"]]
    assert all(a["response"] and a["finish_reason"] in ("stop", "length") for a in answers)
    assert {a["finish_reason"] for a in answers} == {"stop", "length"}     # finished and cut answers
    assert all("SmolLM2" in row["model"] for row in ROWS)


def test_every_captured_answer_parses_and_a_cut_last_row_is_dropped() -> None:
    for row in ROWS:
        for a in row["answers"]:
            ans = read_answer(a["response"], a["finish_reason"])
            for e in ans.result.entities:
                assert e.name.strip() and "<|" not in e.name and "\n" not in e.name
            for r in ans.result.relations:
                assert r.src.strip() and r.tgt.strip()
            tail = a["response"].rpartition("\n")[2]
            assert ans.cut == (a["finish_reason"] == "length")
            if ans.cut and "<|" in tail:                       # a record cut short: dropped, counted
                assert ans.truncated == 1
            elif not ans.cut or not tail.strip():
                assert ans.truncated == 0


def _runs() -> list[list[dict]]:
    """The captured rows split into runs of distinct chunks (the same chunk was captured with and without a
    cap on answer tokens: each replays in a project of its own)."""
    runs: list[list[dict]] = []
    for row in ROWS:
        for run in runs:
            if all(_norm(r["chunk_text"]) != _norm(row["chunk_text"]) for r in run):
                run.append(row)
                break
        else:
            runs.append([row])
    return runs


def test_extract_stage_over_the_captured_answers(stub, tmp_path: Path, monkeypatch) -> None:
    # The captured run predates continuation rounds (a cut answer now asks for its rest, which the fixture
    # does not hold): replay it as it ran, with none, so each cut answer leaves its chunk partial.
    monkeypatch.setattr(llm_extractor, "CONTINUATIONS", 0)
    for n, rows in enumerate(_runs()):
        stub.reset()
        _replay(stub, rows, tmp_path / f"run{n}")


def _replay(stub, rows: list[dict], tmp_path: Path) -> None:
    by_text = {_norm(row["chunk_text"]): row for row in rows}
    unknown: list[str] = []

    def respond(body: dict):
        row = by_text.get(_norm(passage_of(body)))
        turn = (len(body["messages"]) - 2) // 2          # 0: the first answer, n: gleaning round n
        if row is None or turn >= len(row["answers"]):
            unknown.append(passage_of(body)[:60])
            return StubReply(500, content="not in the fixture")
        a = row["answers"][turn]
        return StubReply(content=a["response"], finish_reason=a["finish_reason"])

    stub.set_chat(respond)
    docs = tmp_path / "docs"
    docs.mkdir(parents=True)
    for i, row in enumerate(rows):
        (docs / f"chunk{i}.txt").write_text(row["chunk_text"], encoding="utf-8")
    proj = tmp_path / "proj"
    proc = index(docs, proj, stub)              # the captured run's settings: one gleaning round
    assert unknown == [], unknown               # the same requests as the real run, no other
    assert stub.count(CHAT) == sum(len(row["answers"]) for row in rows)
    ex = summary(proc)["extract"]
    records = extraction_lines(proj)
    assert len(records) == len(rows) and ex["pending"] == 0
    # The README: the captured run extracted not one chunk (prose answers and malformed rows; with the cap on
    # answer tokens, rows cut short), "so no chunk was extracted and `hrag index` exits 1".
    assert [r["status"] for r in records] == ["failed"] * len(rows)
    assert proc.returncode == 1, proc.stderr
    cut = sum(read_answer(a["response"], a["finish_reason"]).truncated for row in rows for a in row["answers"])
    assert ex["truncated_rows"] == sum(r.get("dropped", {}).get("truncated", 0) for r in records) == cut
    for rec in records:
        if rec["status"] == "failed":
            assert rec["error"] and not rec["entities"] and not rec["relations"]
        if rec["status"] == "partial":
            assert rec["error_kind"] == "truncated" and rec["continuations"] == 0
