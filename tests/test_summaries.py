"""Description summaries through litellm against the stub server: thresholds, map-reduce when the fragments
exceed the context budget, the summary cache (second run free; unchanged entities never re-summarised)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hrag_cli.core import store
from hrag_cli.chunk.chunking import count_tokens
from hrag_cli.core.config import Settings
from hrag_cli.core.project import ProjectDir
from hrag_cli.resolve.stage import run_resolve
from hrag_cli.resolve.summaries import Summarizer, SummaryJob
from tests.test_resolve import E, R, rec, write_project
from tests.stub_server import stub_settings


def _settings(stub, **resolve) -> Settings:
    return stub_settings(stub, llm_model="openai/stub-model", retries=1, section="resolve", **resolve)


def _summary_reply(body: dict) -> str:
    """'SUM(n)' where n = how many fragments the request listed; partial summaries have no '(' in them... so
    the final call of a map-reduce lists the partials, which are themselves SUM(...) strings."""
    user = body["messages"][-1]["content"]
    name = re.search(r"descriptions of the (?:entity|relation between) (.+?)\.\n", user).group(1)
    items = [line[2:] for line in user.splitlines() if line.startswith("- ")]
    return f"{name}: SUM[{'+'.join(i if i.startswith('SUM') or ': SUM' in i else '1' for i in items)}]"


def _fragments(n: int, words: int = 12) -> list[str]:
    return [f"Fact number {i} about the subject: " + " ".join(f"w{i}x{j}" for j in range(words)) + "."
            for i in range(n)]


def test_below_thresholds_no_llm_call(tmp_path: Path, stub) -> None:
    settings = _settings(stub, summary_min_fragments=3)
    project = ProjectDir(tmp_path)
    project.init()
    s = Summarizer(project, settings)
    assert s.describe("entity", "Bob", {"b": 1, "a": 2}) == "a | b"
    job = s.describe("entity", "Bob", {"a": 1, "b": 1, "c": 1})
    assert isinstance(job, SummaryJob) and job.fragments == ["a", "b", "c"]
    # one long fragment crosses the token threshold
    settings.resolve.summary_max_input_tokens = 20
    long = " ".join(["word"] * 40)
    assert isinstance(s.describe("entity", "Bob", {long: 1}), SummaryJob)
    assert stub.count() == 0


def test_single_request_summary_and_cache(tmp_path: Path, stub) -> None:
    stub.set_chat(_summary_reply)
    settings = _settings(stub, summary_min_fragments=3)
    project = ProjectDir(tmp_path)
    project.init()
    s = Summarizer(project, settings)
    job = s.describe("entity", "Bob", dict.fromkeys(_fragments(4), 1))
    assert isinstance(job, SummaryJob)
    out = s.run([job])
    assert out[job.key] == "Bob: SUM[1+1+1+1]"
    assert (stub.count(), s.llm_calls, s.summarised, s.cached) == (1, 1, 1, 0)
    # a fresh summarizer (next run) serves it from cache/summaries.jsonl: no request at all
    s2 = Summarizer(project, settings)
    job2 = s2.describe("entity", "Bob", dict.fromkeys(_fragments(4), 1))
    assert s2.run([job2]) == {job.key: "Bob: SUM[1+1+1+1]"} and s2.cached == 1
    assert stub.count() == 1
    # a different model or target length is a different summary
    settings.resolve.summary_target_tokens = 300
    assert Summarizer(project, settings).describe("entity", "Bob", dict.fromkeys(_fragments(4), 1)).key != job.key


def test_map_reduce_when_fragments_exceed_context(tmp_path: Path, stub) -> None:
    stub.set_chat(_summary_reply)
    settings = _settings(stub, summary_min_fragments=3, summary_target_tokens=40)
    project = ProjectDir(tmp_path)
    project.init()
    frags = _fragments(12)
    per = count_tokens(frags[0]) + 2
    s = Summarizer(project, settings)
    job = s.describe("entity", "Bob", dict.fromkeys(frags, 1))
    overhead = s._budget(job)  # with the default context, everything fits in one request
    assert per * 12 < overhead
    # shrink the context so about 4 fragments fit one request
    settings.llm.context_tokens = settings.llm.context_tokens - overhead + per * 4 + 1
    s = Summarizer(project, settings)
    job = s.describe("entity", "Bob", dict.fromkeys(frags, 1))
    out = s.run([job])[job.key]
    # 3 map requests of 4 fragments, then 1 reduce request over the 3 partials
    assert stub.count() == 4 and s.llm_calls == 4
    assert out == "Bob: SUM[Bob: SUM[1+1+1+1]+Bob: SUM[1+1+1+1]+Bob: SUM[1+1+1+1]]"
    bodies = [b for _, b in stub.requests]
    assert all(b["max_tokens"] == 80 for b in bodies)
    cached = list(store.read_jsonl(project.summaries_path))
    assert len(cached) == 1 and cached[0]["summary"] == out and cached[0]["fragments"] == 12


def test_context_too_small_is_a_clear_error(tmp_path: Path, stub) -> None:
    from hrag_cli.core.errors import UsageError

    settings = _settings(stub, summary_min_fragments=2)
    settings.llm.context_tokens = 300
    project = ProjectDir(tmp_path)
    project.init()
    s = Summarizer(project, settings)
    job = s.describe("entity", "Bob", {"a": 1, "b": 1})
    with pytest.raises(UsageError, match="context_tokens"):
        s.run([job])


def test_stage_summaries_cached_and_unrelated_doc_adds_no_calls(tmp_path: Path, stub) -> None:
    stub.set_chat(_summary_reply)
    settings = _settings(stub, summary_min_fragments=3)

    def docs(extra: bool, changed: bool = False):
        d = {
            "bob.txt": [(f"bob chunk {i}", rec("", [E("Bob", "person", f"Bob fact {i}.")],
                                               [R("Bob", "Acme", "works for", [], f"Bob works at Acme {i}.", 1)]))
                        for i in range(4)],
            "acme.txt": [("acme chunk", rec("", [E("Acme", "organization", "A firm.")]))],
        }
        if changed:
            d["bob.txt"].append(("bob chunk new", rec("", [E("Bob", "person", "Bob fact new.")])))
        if extra:
            d["other.txt"] = [("other chunk", rec("", [E("Carol", "person", "Someone else.")]))]
        return d

    p1 = write_project(tmp_path / "p", docs(extra=False))
    out = run_resolve(p1, settings)
    # Bob (4 fragments) and the Acme–Bob relation (4 fragments) are summarised; Acme (1) is not
    assert out.counts["summaries_llm_calls"] == 2 and out.counts["summaries"] == 2
    ents = {e["id"]: e for e in store.read_jsonl(p1.entities_path)}
    assert ents["bob"]["description"] == "Bob: SUM[1+1+1+1]"
    assert ents["acme"]["description"] == "A firm."
    rel = next(iter(store.read_jsonl(p1.relations_path)))
    assert rel["description"] == "Acme and Bob: SUM[1+1+1+1]"
    assert stub.count() == 2

    again = run_resolve(p1, settings)                                  # second run: all from the cache
    assert again.counts["summaries_llm_calls"] == 0 and again.counts["summaries_cached"] == 2
    assert again.output_digest == out.output_digest
    assert stub.count() == 2

    # an unrelated document added (same project directory, so the same caches): still no summary call
    p2 = write_project(tmp_path / "p", docs(extra=True))
    plus = run_resolve(p2, settings)
    assert plus.counts["summaries_llm_calls"] == 0 and plus.counts["entities"] == 3
    assert stub.count() == 2

    # Bob's fragments change: exactly Bob is summarised again
    p3 = write_project(tmp_path / "p", docs(extra=True, changed=True))
    changed = run_resolve(p3, settings)
    assert changed.counts["summaries_llm_calls"] == 1 and changed.counts["summaries_cached"] == 1
    assert {e["id"]: e for e in store.read_jsonl(p3.entities_path)}["bob"]["description"] == "Bob: SUM[1+1+1+1+1]"


def test_fallback_selection_beyond_first_candidates(tmp_path: Path) -> None:
    """No LLM, many short fragments: the description keeps as many as fit, most frequent first."""
    settings = Settings()
    settings.resolve.summary_target_tokens = 200
    s = Summarizer(ProjectDir(tmp_path), settings)
    counts = {f"fact {i:03d}.": (3 if i % 10 == 0 else 1) for i in range(300)}
    out = s.fallback(counts).split(" | ")
    assert out[:3] == ["fact 000.", "fact 010.", "fact 020."]      # the frequent ones first, in text order
    assert len(out) > 32
    # fragments are counted one by one (a safe upper bound of the joined count) until the next would not fit
    parts = sum(count_tokens(f) for f in out) + count_tokens(" | ") * (len(out) - 1)
    assert count_tokens(" | ".join(out)) <= parts <= 200 < parts + count_tokens(" | ") + count_tokens("fact 004.")
    rest = [f for f in out if not f.endswith("0.")]
    assert rest == sorted(rest)
