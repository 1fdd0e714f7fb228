"""`hrag schema suggest` through the stub LLM server: a seeded sample, one cached request per sampled chunk, a
parseable TOML draft with how often each type was seen, and exit codes and failure lines like `hrag index`."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from hrag_cli.extract.schema import load_schema
from tests.stub_server import CHAT, StubReply, refused_port
from tests.test_index_e2e import run
from tests.test_llm_runs import QUICK

N_DOCS = 6


def _docs(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(N_DOCS):
        extra = " A storm closed the harbour." if i % 2 == 0 else ""
        (docs / f"d{i}.txt").write_text(f"Document {i}: Mara Quint{i} works for the Harbour Trust of Oldport{i}."
                                        + extra)
    return docs


def types_answer(body: dict) -> str:
    """Person and organization everywhere (organisation spelled twice, once in plural), works_for between
    them, and an event with its pattern in the documents that mention a storm; chatter around the JSON."""
    passage = body["messages"][-1]["content"]
    ents = [{"type": "Person", "description": "A human being."},
            {"type": "organizations", "description": "A body of people."},
            {"type": "organization", "description": "A company or trust."}]
    rels = [{"type": "works for", "description": "A person is employed by an organization.",
             "source": "person", "target": "organization"}]
    if "storm" in passage:
        ents.append({"type": "event", "description": "Something that happened."})
        rels.append({"type": "affected", "description": "An event affected something.", "source": "event",
                     "target": "place"})
    return "Here is the JSON:\n```json\n" + json.dumps({"entity_types": ents, "relation_types": rels}) + "\n```"


def suggest(docs: Path, proj: Path, stub_url: str, *extra: str):
    return run(["schema", "suggest", str(docs), "-p", str(proj), "--llm-model", "openai/stub-model",
                "--llm-api-base", stub_url, *extra], inprocess=True)


def test_suggest_writes_a_parseable_draft_with_counts_and_reruns_from_cache(stub, tmp_path: Path) -> None:
    stub.set_chat(types_answer)
    docs, proj = _docs(tmp_path), tmp_path / "proj"
    out = tmp_path / "schema.toml"
    proc = suggest(docs, proj, stub.url, "--sample", "4", "--seed", "7", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary == {"sampled": 4, "answered": 4, "failed": 0, "unreadable": 0, "llm_requests": 4,
                       "entity_types": 3, "relation_types": 2, "out": str(out)}
    assert stub.count(CHAT) == 4
    text = out.read_text()
    data = tomllib.loads(text)
    assert set(data["entities"]) == {"person", "organization", "event"}
    assert data["entities"]["person"] == {"description": "A human being."}
    assert data["relations"]["works_for"]["patterns"] == [["person", "organization"]]
    # 'place' is no entity type of the draft: the pattern is in the comment, not in the table
    assert "patterns" not in data["relations"]["affected"]
    schema = load_schema(out)                         # what `hrag index --schema` reads
    assert schema.entity_names == ["organization", "person", "event"]
    assert [(r.name, r.patterns) for r in schema.relations] == [("works_for", (("person", "organization"),)),
                                                                ("affected", ())]
    sampled = [b for _, b in stub.requests]
    storms = sum("storm" in b["messages"][-1]["content"] for b in sampled)
    assert "# seen in 4 of 4\n[entities.person]" in text
    assert "# seen in 4 of 4\n[entities.organization]" in text            # once per chunk, not per spelling
    assert f"# seen in {storms} of 4\n[entities.event]" in text
    assert f"# seen in {storms} of 4; patterns seen: event -> place ({storms})\n[relations.affected]" in text

    # the same seed samples the same chunks: every answer from the cache, the same draft
    again = tmp_path / "again.toml"
    proc = suggest(docs, proj, stub.url, "--sample", "4", "--seed", "7", "--out", str(again))
    assert proc.returncode == 0, proc.stderr
    assert stub.count(CHAT) == 4 and again.read_text() == text
    # without --out the draft goes to stdout; another seed draws another sample
    proc = suggest(docs, proj, stub.url, "--sample", "4", "--seed", "9")       # chunks 0, 1, 2, 4: not 0, 3, 4, 5
    assert proc.returncode == 0 and tomllib.loads(proc.stdout)["entities"]["person"]
    assert stub.count(CHAT) == 6                                               # two not asked before


def test_suggest_never_overwrites_and_reports_failures_like_index(stub, tmp_path: Path) -> None:
    docs, proj = _docs(tmp_path), tmp_path / "proj"
    proj.mkdir()
    (proj / "hrag.toml").write_text(QUICK)
    out = tmp_path / "schema.toml"
    out.write_text("# my edited schema\n")
    proc = suggest(docs, proj, stub.url, "--out", str(out))
    assert proc.returncode == 2 and "exists" in proc.stderr and stub.count(CHAT) == 0
    assert out.read_text() == "# my edited schema\n"

    # one unreadable answer: the draft is written from the others, exit 4 (partial)
    stub.set_chat(types_answer)
    stub.enqueue(CHAT, StubReply(content="I cannot tell."))
    part = tmp_path / "part.toml"
    proc = suggest(docs, proj, stub.url, "--sample", "3", "--out", str(part), "--json")
    assert proc.returncode == 4, proc.stderr
    assert json.loads(proc.stdout)["unreadable"] == 1 and "got no usable answer" in proc.stderr
    assert tomllib.loads(part.read_text())["entities"]["person"]

    # no server: exit 1 at once, the cause and its fix in one line, nothing written
    none = tmp_path / "none.toml"
    with refused_port() as port:
        proc = suggest(docs, proj, f"http://127.0.0.1:{port}/v1", "--sample", "2", "--seed", "3",
                       "--out", str(none))
    assert proc.returncode == 1 and not none.exists()
    [line] = proc.stderr.strip().splitlines()[-1:]
    assert re.search(r"schema suggest stopped: cannot reach .*start the server", line), line

    proc = run(["schema", "suggest", str(docs), "-p", str(proj)], inprocess=True)
    assert proc.returncode == 2 and "needs a model" in proc.stderr
