"""Gleaning, through the stub LLM server: only for chunks of at least
`extract.glean_min_tokens`, and stopped as soon as the model says nothing was missed (in any of the
recognised languages, bare or wrapped in the completion marker) or a round brings nothing new."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hrag_cli.core import store
from hrag_cli.extract.parser import says_nothing_more
from hrag_cli.core.project import ProjectDir
from tests.test_index_e2e import CHAT, D, extraction_lines, index, passage_of, summary

NOTHING_MORE = [
    "<|COMPLETE|>",
    "No more entities or relations.",
    "Nothing was missed.\n<|COMPLETE|>",
    "Keine weiteren Entitäten oder Beziehungen gefunden.",
    "Nichts übersehen. <|COMPLETE|>",
    "Rien à ajouter.",
    "Aucune autre entité.<|COMPLETE|>",
    "No hay más entidades ni relaciones.",
    "Nada más que añadir. <|COMPLETE|>",
    "没有遗漏。",
    "无<|COMPLETE|>",
]


@pytest.mark.parametrize("text", NOTHING_MORE)
def test_nothing_more_forms_are_recognised(text: str) -> None:
    assert says_nothing_more(text)


@pytest.mark.parametrize("text", ["Here are the records you asked for:", "Nordic countries",
                                  f"entity{D}Ada{D}person{D}A mathematician.\n<|COMPLETE|>"])
def test_other_answers_are_not_nothing_more(text: str) -> None:
    assert not says_nothing_more(text)


def _doc(i: int) -> str:
    return f"Document {i}: the keeper Mara Quint{i} lit the Selby lamp{i} on the island of Oldport{i}."


def _doc_number(text: str) -> int:
    return int(re.search(r"Document (\d+):", text).group(1))


def test_each_nothing_more_form_stops_gleaning_and_other_answers_are_counted(stub, tmp_path: Path) -> None:
    # one document per gleaning answer; then prose that is no answer, a round that only repeats its rows,
    # and a round with a new row followed by a Chinese "nothing more"
    gleanings = [[form] for form in NOTHING_MORE]
    prose, repeat, more = len(gleanings), len(gleanings) + 1, len(gleanings) + 2
    gleanings += [["Here are the records you asked for:"], ["REPEAT"], ["NEW", "没有更多了"]]

    def respond(body: dict) -> str:
        msgs = body["messages"]
        i = _doc_number(passage_of(body))
        first = f"entity{D}Mara Quint{i}{D}person{D}The keeper.\n<|COMPLETE|>"
        if len(msgs) == 2:
            return first
        answer = gleanings[i][(len(msgs) - 4) // 2]
        if answer == "REPEAT":
            return first
        if answer == "NEW":
            return f"entity{D}Oldport{i}{D}location{D}An island.\n<|COMPLETE|>"
        return answer

    stub.set_chat(respond)
    docs, proj = tmp_path / "docs", tmp_path / "proj"
    docs.mkdir()
    for i in range(len(gleanings)):
        (docs / f"d{i:02d}.txt").write_text(_doc(i))
    proc = index(docs, proj, stub, "--max-gleanings", "3", "--glean-min-tokens", "0")
    assert proc.returncode == 0, proc.stderr
    chunk_doc = {c["chunk_id"]: _doc_number(c["text"]) for c in store.read_jsonl(ProjectDir(proj).chunks_path)}
    recs = {chunk_doc[r["chunk_id"]]: r for r in extraction_lines(proj)}
    assert len(recs) == len(gleanings)
    for i in range(len(NOTHING_MORE)):
        assert (recs[i]["gleaning_rounds"], recs[i]["status"], recs[i]["dropped"]) == (1, "ok", {}), NOTHING_MORE[i]
    assert recs[prose]["gleaning_rounds"] == 1 and recs[prose]["dropped"] == {"unreadable_gleaning": 1}
    assert recs[repeat]["gleaning_rounds"] == 1 and recs[repeat]["dropped"] == {}
    # the gleaning round's new row joins the first answer's (beside the rules' candidates nobody rejected)
    names = {e["name"] for e in recs[more]["entities"]}
    assert recs[more]["gleaning_rounds"] == 2 and {f"Mara Quint{more}", f"Oldport{more}"} <= names
    assert stub.count(CHAT) == 2 * len(gleanings) + 1


def test_gleaning_only_for_chunks_of_glean_min_tokens_or_more(stub, tmp_path: Path) -> None:
    stub.set_chat(lambda body: (f"entity{D}Mara Quint1{D}person{D}The keeper.\n<|COMPLETE|>"
                                if len(body["messages"]) == 2 else "<|COMPLETE|>"))
    docs, proj = tmp_path / "docs", tmp_path / "proj"
    docs.mkdir()
    (docs / "d.txt").write_text(_doc(1))
    assert index(docs, proj, stub, "--stop-after", "chunk").returncode == 0
    [chunk] = list(store.read_jsonl(ProjectDir(proj).chunks_path))
    n = chunk["n_tokens"]

    est = summary(index(docs, proj, stub, "--dry-run", "--glean-min-tokens", str(n + 1)))["estimate"]
    assert est["llm_requests"] == 1
    proc = index(docs, proj, stub, "--glean-min-tokens", str(n + 1))       # one token short: no gleaning
    assert proc.returncode == 0 and stub.count(CHAT) == 1
    assert extraction_lines(proj)[-1]["gleaning_rounds"] == 0

    est = summary(index(docs, proj, stub, "--dry-run", "--glean-min-tokens", str(n)))["estimate"]
    assert est["llm_requests"] == 2
    proc = index(docs, proj, stub, "--glean-min-tokens", str(n))           # long enough: one round
    assert proc.returncode == 0 and stub.count(CHAT) == 2                   # the first answer was cached
    assert extraction_lines(proj)[-1]["gleaning_rounds"] == 1
