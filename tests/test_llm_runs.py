"""An LLM run a cron job can trust, through the real CLI and litellm against the stub server.

Each failure mode of a real server: its exit code, one line naming cause and fix, nothing lost (the chunks it
hit stay pending, finished ones stay saved), and the same command finishing the job once the cause is gone.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hrag_cli.core import store
from hrag_cli.core.config import LLMSettings
from hrag_cli.extract.rules import RULES_FINGERPRINT
from hrag_cli.core.llm import LOCAL_CONCURRENCY, LOCAL_TIMEOUT, REMOTE_CONCURRENCY, REMOTE_TIMEOUT, effective_settings
from hrag_cli.core.project import ProjectDir
from tests.stub_server import StubReply, StubServer, context_exceeded, free_port, refused_port
from tests.test_index_e2e import (CHAT, D, _one_line_error, extraction_lines, fake_extraction, index, is_gleaning,
                                  one_doc, run, summary)

QUICK = "[llm]\nmax_retries = 1\nbackoff_base = 0.01\n"


def corpus(tmp_path: Path, n: int = 4, toml: str = QUICK) -> tuple[Path, Path]:
    """n one-sentence documents (one chunk each) and a project whose hrag.toml retries quickly."""
    docs = tmp_path / "docs"
    docs.mkdir()
    names = ["Mara Quint", "Tobiah Renn", "Ilse Varga", "Odo Brisk", "Pell Arun", "Nessa Holt"]
    for i in range(n):
        (docs / f"d{i}.txt").write_text(f"{names[i]} built the Selby Lighthouse for the Harbour Trust of "
                                        f"Oldport in 190{i}, with stone from the Calder Quarry.")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "hrag.toml").write_text(toml)
    return docs, proj


def statuses(proj: Path) -> list[str]:
    return [r["status"] for r in extraction_lines(proj)]


# ------------------------------------------------------------------------------------- run-wide failures


def test_no_server_stops_at_once_with_one_line_and_the_same_command_finishes(tmp_path: Path) -> None:
    docs, proj = corpus(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    args = ("--llm-model", "openai/m", "--llm-api-base", url, "--max-gleanings", "0")
    proc = run(["index", str(docs), "-p", str(proj), "--stop-after", "extract", *args], inprocess=True)
    _one_line_error(proc, 1, "cannot reach the LLM at " + url, "start the server", "4 chunk(s) left")
    assert extraction_lines(proj) == []                       # nothing recorded as failed: all pending

    with StubServer(port=port) as stub:                       # the server is up: the same command does the job
        stub.set_chat(fake_extraction)
        again = run(["index", str(docs), "-p", str(proj), "--stop-after", "extract", "--json", *args],
                    inprocess=True)
        assert again.returncode == 0, again.stderr
        assert summary(again)["extract"]["extracted_now"] == 4 and stub.count(CHAT) == 4


def failure(proc, code: int) -> dict:
    """The one failure object `--json` prints: cause, fix and exit code, beside the run's counts."""
    assert proc.returncode == code, proc.stderr
    assert len(proc.stdout.strip().splitlines()) == 1, proc.stdout
    obj = json.loads(proc.stdout)
    assert obj["failure"]["exit_code"] == code and obj["failure"]["cause"], obj
    assert "never awaited" not in proc.stderr and "RuntimeWarning" not in proc.stderr
    return obj


def test_refused_connection_on_this_machine_fails_at_once_and_status_says_what_was_asked(tmp_path: Path) -> None:
    docs, proj = corpus(tmp_path, n=3, toml="")               # the default retries: none are spent on a refusal
    with refused_port() as port:
        for model in ("openai/m", "hosted_vllm/m"):          # our own HTTP path, and litellm's
            url = f"http://127.0.0.1:{port}/v1"
            proc = run(["index", str(docs), "-p", str(proj), "--llm-model", model, "--llm-api-base", url,
                        "--json"], inprocess=True)
            obj = failure(proc, 1)
            assert "cannot reach the LLM at " + url in obj["failure"]["cause"]
            assert obj["failure"]["fix"].startswith("start the server")
            assert obj["extract"]["pending"] == 3 and obj["extract"]["retries"] == 0
            status = json.loads(run(["status", "-p", str(proj), "--json"], inprocess=True).stdout)
            assert status["built_with"].startswith(f"the LLM {model} at {url}")
            assert status["extraction"]["chunks"] == 3 and status["extraction"]["extracted"] == 0
            assert status["extraction"]["pending"] == 3


def test_every_failure_path_prints_one_failure_object_under_json(stub, tmp_path: Path) -> None:
    docs, proj = corpus(tmp_path, n=4)
    bad = failure(run(["index", str(docs), "-p", str(proj), "--extractor", "bogus", "--json"], inprocess=True), 2)
    assert "--extractor" in bad["failure"]["cause"]
    flag = failure(run(["index", str(docs), "--no-such-flag", "--json"], inprocess=True), 2)
    assert "no-such-flag" in flag["failure"]["cause"]

    stub.set_chat(lambda body: context_exceeded(512))         # a run-wide cause seen in a streak: exit 1
    streak = failure(index(docs, proj, stub, "--max-gleanings", "0"), 1)
    assert "3 chunks in a row failed" in streak["failure"]["cause"] and "--n_ctx" in streak["failure"]["fix"]
    assert streak["extract"]["pending"] == 4

    stub.set_chat(lambda body: context_exceeded() if "Ilse" in json.dumps(body) else fake_extraction(body))
    part = failure(index(docs, proj, stub, "--max-gleanings", "0"), 4)    # one chunk of its own: exit 4
    assert part["failure"]["cause"] == "1 chunk(s) failed and 0 are partial"
    assert "--retry-failed" in part["failure"]["fix"] and part["extract"]["failed"] == 1

    stub.set_chat(fake_extraction)
    (tmp_path / "b").mkdir()
    docs2, proj2 = corpus(tmp_path / "b", n=2)
    budget = failure(index(docs2, proj2, stub, "--max-gleanings", "0", "--max-cost", "0",
                           model="openai/gpt-4o-mini"), 3)
    assert "--max-cost" in budget["failure"]["fix"]


def test_model_without_provider_prefix_stops_with_the_fix(stub, tmp_path: Path) -> None:
    stub.set_chat(fake_extraction)
    docs, proj = corpus(tmp_path)
    proc = index(docs, proj, stub, "--max-gleanings", "0", model="local")
    _one_line_error(proc, 1, "'local'", "openai/")
    assert stub.count(CHAT) == 0 and extraction_lines(proj) == []
    fixed = index(docs, proj, stub, "--max-gleanings", "0", model="openai/local")
    assert fixed.returncode == 0, fixed.stderr
    assert summary(fixed)["extract"]["pending"] == 0


def test_context_too_small_stops_after_a_streak_leaving_chunks_pending(stub, tmp_path: Path) -> None:
    stub.set_chat(lambda body: context_exceeded(512))
    docs, proj = corpus(tmp_path, n=5)
    proc = index(docs, proj, stub, "--max-gleanings", "0")
    _one_line_error(proc, 1, "3 chunks in a row failed", "maximum context length is 512", "--n_ctx")
    assert stub.count(CHAT) == 3                              # stopped, not sent for every chunk
    assert extraction_lines(proj) == []
    stub.set_chat(fake_extraction)                            # a server with a larger context
    again = index(docs, proj, stub, "--max-gleanings", "0")
    assert again.returncode == 0, again.stderr
    assert summary(again)["extract"]["extracted_now"] == 5


def test_one_chunk_too_large_is_its_own_failure_exit_4(stub, tmp_path: Path) -> None:
    docs, proj = corpus(tmp_path, n=4)
    stub.set_chat(lambda body: context_exceeded() if "Ilse" in json.dumps(body) else fake_extraction(body))
    proc = index(docs, proj, stub, "--max-gleanings", "0")
    assert proc.returncode == 4, proc.stderr
    warn = [ln for ln in proc.stderr.splitlines() if "could not be extracted" in ln]
    assert len(warn) == 1 and "1 of 4" in warn[0] and "--retry-failed" in warn[0]
    assert sorted(statuses(proj)) == ["failed", "ok", "ok", "ok"]
    stub.set_chat(fake_extraction)
    assert index(docs, proj, stub, "--max-gleanings", "0").returncode == 4       # still failed: cron sees it
    fixed = index(docs, proj, stub, "--max-gleanings", "0", "--retry-failed")
    assert fixed.returncode == 0 and summary(fixed)["extract"]["failed"] == 0


def test_failures_of_different_causes_are_each_recorded_not_lost(stub, tmp_path: Path) -> None:
    def respond(body: dict):
        text = json.dumps(body)
        if "Mara" in text:
            return context_exceeded()
        if "Tobiah" in text:
            return StubReply(500, content="boom")
        return fake_extraction(body)

    stub.set_chat(respond)
    docs, proj = corpus(tmp_path, n=4)
    proc = index(docs, proj, stub, "--max-gleanings", "0")
    assert proc.returncode == 4, proc.stderr
    assert sorted(statuses(proj)) == ["failed", "failed", "ok", "ok"]
    kinds = sorted(r.get("error_kind") for r in extraction_lines(proj) if r["status"] == "failed")
    assert kinds == ["context", "server"]


def test_server_failing_mid_run_stops_and_resumes_without_resending(stub, tmp_path: Path) -> None:
    docs, proj = corpus(tmp_path, n=6)
    answered: list[int] = []

    def dies_after_two(body: dict):
        if len(answered) >= 2:
            return StubReply(500, content="model crashed")
        answered.append(1)
        return fake_extraction(body)

    stub.set_chat(dies_after_two)
    proc = index(docs, proj, stub, "--max-gleanings", "0")
    _one_line_error(proc, 1, "3 chunks in a row failed", "500", "server's log", "4 chunk(s) left")
    assert statuses(proj) == ["ok", "ok"]
    sent = stub.count(CHAT)
    stub.set_chat(fake_extraction)
    again = index(docs, proj, stub, "--max-gleanings", "0")
    assert again.returncode == 0, again.stderr
    assert summary(again)["extract"]["cached"] == 2 and stub.count(CHAT) == sent + 4


def test_every_request_timing_out_never_exits_0(stub, tmp_path: Path) -> None:
    stub.set_chat(lambda body: StubReply(content="late", delay=1.0))
    docs, proj = corpus(tmp_path, n=3, toml=QUICK.replace("max_retries = 1", "max_retries = 0") + "timeout = 0.2\n")
    proc = index(docs, proj, stub, "--max-gleanings", "0")
    _one_line_error(proc, 1, "timed out after 0.2 s", "raise [llm] timeout")
    assert extraction_lines(proj) == []


def test_negative_timeout_is_a_usage_error(stub, tmp_path: Path) -> None:
    docs, proj = corpus(tmp_path, toml="[llm]\ntimeout = -5\n")
    proc = index(docs, proj, stub)
    _one_line_error(proc, 2, "llm.timeout", "-5.0")
    assert stub.count(CHAT) == 0 and not (proj / "chunks.jsonl").exists()


def test_local_openai_server_needs_no_key(stub, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    stub.set_chat(fake_extraction)
    docs, proj = one_doc(tmp_path)
    proc = index(docs, proj, stub, "--max-gleanings", "0")
    assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------------------------------------- defaults for the server


def test_a_server_on_this_machine_gets_one_request_at_a_time_and_a_long_timeout() -> None:
    local = effective_settings(LLMSettings(model="openai/m", api_base="http://127.0.0.1:8080/v1"))
    assert (local.concurrency, local.timeout) == (LOCAL_CONCURRENCY, LOCAL_TIMEOUT) == (1, 600.0)
    assert effective_settings(LLMSettings(model="ollama/qwen2.5")).concurrency == 1
    remote = effective_settings(LLMSettings(model="openai/gpt-4o-mini"))
    assert (remote.concurrency, remote.timeout) == (REMOTE_CONCURRENCY, REMOTE_TIMEOUT)
    given = effective_settings(LLMSettings(model="openai/m", api_base="http://localhost:1/v1", concurrency=4,
                                           timeout=30))
    assert (given.concurrency, given.timeout) == (4, 30)


def test_max_tokens_is_capped_by_the_chunk_size(stub, tmp_path: Path) -> None:
    stub.set_chat(fake_extraction)
    docs, proj = one_doc(tmp_path)
    assert index(docs, proj, stub, "--max-gleanings", "0").returncode == 0
    [chunk] = list(store.read_jsonl(proj / "chunks.jsonl"))
    assert stub.requests[0][1]["max_tokens"] == 512 + 3 * chunk["n_tokens"]


# ------------------------------------------------------------------------------------- truncation, gleaning


CUT = (f"entity{D}Mara Quint{D}person{D}Builder of the Selby Lighthouse.\n"
       f"entity{D}Selby Lighthouse{D}artifact{D}Lighthouse built in 1902.\n"
       f"entity{D}Oldport{D}location{D}Harbour town that meets an unusually")
REST = (f"entity{D}Oldport{D}location{D}Harbour town of the Harbour Trust.\n"
        f"relation{D}Mara Quint{D}Selby Lighthouse{D}built{D}construction{D}Mara Quint built it.{D}9\n<|COMPLETE|>")


def is_continuation(body: dict) -> bool:
    return "cut off by the length limit" in body["messages"][-1]["content"]


def test_cut_answer_is_continued_in_the_same_conversation(stub, tmp_path: Path) -> None:
    stub.enqueue(CHAT, StubReply(content=CUT, finish_reason="length"), StubReply(content=REST))
    stub.set_chat(fake_extraction)          # the gleaning round after the finished continuation: nothing new
    docs, proj = one_doc(tmp_path)
    proc = index(docs, proj, stub, "--max-gleanings", "1", "--glean-min-tokens", "0")
    assert proc.returncode == 0, proc.stderr
    first, cont, glean = (body for _, body in stub.requests)
    assert is_continuation(cont) and cont["messages"][-2] == {"role": "assistant", "content": CUT}
    assert cont["max_tokens"] == first["max_tokens"]               # the chunk's own budget
    assert is_gleaning(glean) and not is_continuation(glean)       # the finished answer may be gleaned
    [rec] = extraction_lines(proj)
    assert rec["status"] == "ok" and rec["continuations"] == 1 and rec["gleaning_rounds"] == 1
    assert rec["dropped"] == {"truncated": 1}                      # the cut row, asked for again
    # the three the model wrote, and a candidate of the rules it did not reject
    assert [e["name"] for e in rec["entities"]] == ["Mara Quint", "Selby Lighthouse", "Oldport", "1902"]
    assert len(rec["relations"]) == 1 and len(rec["llm_keys"]) == 3
    assert summary(proc)["extract"]["truncated_rows"] == 1

    # --reparse replays the same three answers and keeps the rounds apart
    again = index(docs, proj, stub, "--max-gleanings", "1", "--glean-min-tokens", "0", "--reparse")
    assert again.returncode == 0 and stub.count(CHAT) == 3
    assert extraction_lines(proj)[-1]["gleaning_rounds"] == 1 and extraction_lines(proj)[-1]["continuations"] == 1


def test_answer_still_cut_is_partial_and_retry_continues_instead_of_resending(stub, tmp_path: Path) -> None:
    stub.set_chat(lambda body: StubReply(content=CUT, finish_reason="length"))
    docs, proj = one_doc(tmp_path)
    proc = index(docs, proj, stub, "--max-gleanings", "2", "--glean-min-tokens", "0")
    assert proc.returncode == 4, proc.stderr
    assert "only partly extracted" in proc.stderr
    assert stub.count(CHAT) == 3                                   # the answer and 2 continuation rounds
    [rec] = extraction_lines(proj)
    assert rec["status"] == "partial" and rec["error_kind"] == "truncated" and rec["continuations"] == 2
    assert "still cut at max_tokens after 2 continuation round(s)" in rec["error"]
    assert rec["entities"] and rec["dropped"] == {"truncated": 3} and rec["gleaning_rounds"] == 0
    assert summary(proc)["extract"]["partial"] == 1

    stub.reset()
    stub.set_chat(lambda body: REST if is_continuation(body) else fake_extraction(body))
    again = index(docs, proj, stub, "--max-gleanings", "2", "--glean-min-tokens", "0", "--retry-failed")
    assert again.returncode == 0, again.stderr
    (_, body), (_, glean) = stub.requests                          # the cached rounds were not sent again
    assert is_continuation(body) and len(body["messages"]) == 2 + 2 * 3
    assert is_gleaning(glean) and not is_continuation(glean)       # then the finished answer is gleaned
    last = extraction_lines(proj)[-1]
    assert last["status"] == "ok" and last["continuations"] == 3 and last["attempt"] == 1
    assert last["gleaning_rounds"] == 1
    assert "Oldport" in [e["name"] for e in last["entities"]]


def test_lost_continuation_round_is_partial_and_retry_sends_only_that_round(stub, tmp_path: Path) -> None:
    docs, proj = one_doc(tmp_path)
    (proj.mkdir(), (proj / "hrag.toml").write_text(QUICK))
    stub.set_chat(lambda body: StubReply(500, content="out of memory") if is_continuation(body)
                  else StubReply(content=CUT, finish_reason="length"))
    proc = index(docs, proj, stub, "--max-gleanings", "0")
    assert proc.returncode == 4, proc.stderr
    [rec] = extraction_lines(proj)
    assert rec["status"] == "partial" and rec["error_kind"] == "continuation"
    assert "continuation round 1 lost" in rec["error"]
    stub.reset()
    stub.set_chat(lambda body: REST)
    again = index(docs, proj, stub, "--max-gleanings", "0", "--retry-failed")
    assert again.returncode == 0, again.stderr
    assert stub.count(CHAT) == 1 and is_continuation(stub.requests[0][1])
    assert extraction_lines(proj)[-1]["status"] == "ok"


def test_cut_answer_without_a_complete_row_fails_and_retry_completes_it(stub, tmp_path: Path) -> None:
    stub.set_chat(lambda body: StubReply(content=f"entity{D}Mara Quint{D}person{D}Buil", finish_reason="length"))
    docs, proj = one_doc(tmp_path)
    proc = index(docs, proj, stub, "--max-gleanings", "0")
    assert proc.returncode == 1, proc.stderr
    assert stub.count(CHAT) == 3                                   # continued twice, still nothing whole
    [rec] = extraction_lines(proj)
    assert rec["status"] == "failed" and rec["error_kind"] == "truncated" and "max_tokens" in rec["error"]
    stub.set_chat(fake_extraction)
    again = index(docs, proj, stub, "--max-gleanings", "0", "--retry-failed")
    assert again.returncode == 0 and extraction_lines(proj)[-1]["attempt"] == 2


def test_no_gleaning_without_usable_rows_or_without_the_completion_marker(stub, tmp_path: Path) -> None:
    no_marker = f"entity{D}Mara Quint{D}person{D}Builder of the Selby Lighthouse."
    stub.set_chat(lambda body: no_marker)
    docs, proj = one_doc(tmp_path)
    assert index(docs, proj, stub, "--max-gleanings", "2").returncode == 0
    assert stub.count(CHAT) == 1 and extraction_lines(proj)[-1]["gleaning_rounds"] == 0

    stub.reset()
    stub.set_chat(lambda body: "Sure! Here are the entities: Mara Quint, Selby.")
    (tmp_path / "b").mkdir()
    docs2, proj2 = corpus(tmp_path / "b", n=1)
    assert index(docs2, proj2, stub, "--max-gleanings", "2").returncode == 1
    assert stub.count(CHAT) == 1


def test_lost_gleaning_round_is_partial_and_retry_failed_sends_only_that_round(stub, tmp_path: Path) -> None:
    stub.set_chat(lambda body: StubReply(500, content="out of memory") if is_gleaning(body)
                  else fake_extraction(body))
    docs, proj = one_doc(tmp_path)
    (proj.mkdir(), (proj / "hrag.toml").write_text(QUICK))
    proc = index(docs, proj, stub, "--max-gleanings", "1", "--glean-min-tokens", "0")
    assert proc.returncode == 4, proc.stderr
    assert "only partly extracted" in proc.stderr
    [rec] = extraction_lines(proj)
    assert rec["status"] == "partial" and "gleaning round 1 lost" in rec["error"] and rec["entities"]
    assert summary(proc)["extract"]["partial"] == 1
    status = json.loads(run(["status", "-p", str(proj), "--json"], inprocess=True).stdout)
    assert [f["status"] for f in status["failed_chunks"]] == ["partial"]

    stub.reset()
    stub.set_chat(fake_extraction)
    again = index(docs, proj, stub, "--max-gleanings", "1", "--glean-min-tokens", "0", "--retry-failed")
    assert again.returncode == 0, again.stderr
    assert stub.count(CHAT) == 1 and is_gleaning(stub.requests[0][1])   # the first answer came from cache
    assert extraction_lines(proj)[-1]["status"] == "ok" and extraction_lines(proj)[-1]["gleaning_rounds"] == 1


def test_server_gone_during_gleaning_leaves_the_chunk_pending(stub, tmp_path: Path) -> None:
    docs, proj = one_doc(tmp_path)
    (proj.mkdir(), (proj / "hrag.toml").write_text(QUICK))
    stub.set_chat(lambda body: StubReply(401, content="key revoked") if is_gleaning(body) else fake_extraction(body))
    proc = index(docs, proj, stub, "--max-gleanings", "1", "--glean-min-tokens", "0")
    _one_line_error(proc, 1, "API key")
    assert extraction_lines(proj) == []
    stub.reset()
    stub.set_chat(fake_extraction)
    again = index(docs, proj, stub, "--max-gleanings", "1", "--glean-min-tokens", "0")
    assert again.returncode == 0 and stub.count(CHAT) == 1      # only the gleaning round was still to do


# ------------------------------------------------------------------------------------- remembered settings


def test_the_project_remembers_its_model_and_switching_is_explicit(stub, tmp_path: Path) -> None:
    stub.set_chat(fake_extraction)
    docs, proj = one_doc(tmp_path)
    first = index(docs, proj, stub)
    assert first.returncode == 0, first.stderr
    llm_extractor = summary(first)["extract"]["extractor"]
    manifest = json.loads((proj / "manifest.json").read_text())
    assert manifest["built_with"] == {"extract.extractor": "llm", "extract.format": "json", "extract.hints": "rules",
                                      "llm.model": "openai/stub-model",
                                      "llm.api_base": stub.url, "embed.model": "builtin", "embed.api_base": "",
                                      "embed.precision": "bf16"}
    assert "key" not in json.dumps(manifest).lower()

    plain = run(["index", "-p", str(proj), "--stop-after", "extract", "--json"], inprocess=True)
    assert plain.returncode == 0, plain.stderr
    assert summary(plain)["extract"]["extractor"] == llm_extractor and "from now on" not in plain.stderr
    status = run(["status", "-p", str(proj), "--json"], inprocess=True)
    info = json.loads(status.stdout)
    assert info["stages"]["extract"]["state"] == "fresh"
    assert info["built_with"] == (f"the LLM openai/stub-model at {stub.url} (JSON answers), shown the rules "
                                  "extractor's names")

    switched = run(["index", "-p", str(proj), "--stop-after", "extract", "--json", "--extractor", "rules"],
                   inprocess=True)
    assert switched.returncode == 0, switched.stderr
    assert summary(switched)["extract"]["extractor"] == RULES_FINGERPRINT
    assert "extracting with the rules extractor from now on, as given (was the LLM openai/stub-model" in switched.stderr
    again = run(["index", "-p", str(proj), "--stop-after", "extract", "--json"], inprocess=True)
    assert summary(again)["extract"]["extractor"] == RULES_FINGERPRINT

    # a model given anew switches back to the LLM, without inheriting another model's API base
    from hrag_cli.core.config import load_settings

    s = load_settings(None, {"llm.model": "openai/other"}, environ={}, remembered=ProjectDir(proj).remembered())
    assert s.extract.extractor == "auto" and s.llm.api_base == ""


def test_the_project_remembers_its_embedder_and_a_cron_run_keeps_it(stub, tmp_path: Path) -> None:
    """Built with a remote embedder: a plain `hrag index` (cron) and a plain query use it, never the builtin one
    silently; only an explicit --embed-model switches, and says so."""
    docs, proj = corpus(tmp_path, n=3)
    embed = ["--embed-model", "openai/stub-embed", "--embed-api-base", stub.url]
    first = run(["index", str(docs), "-p", str(proj), "--extractor", "rules", "--json", *embed], inprocess=True)
    assert first.returncode == 0, first.stderr
    sent = stub.count("/embeddings")
    assert sent > 0
    plain = run(["index", str(docs), "-p", str(proj), "--json"], inprocess=True)
    assert plain.returncode == 0, plain.stderr
    assert summary(plain)["synonyms"] == "fresh" and stub.count("/embeddings") == sent
    query = run(["query", "Who built the Selby Lighthouse?", "-p", str(proj), "--json"], inprocess=True)
    assert query.returncode == 0, query.stderr
    assert json.loads(query.stdout)["chunks"] and stub.count("/embeddings") == sent + 1   # the question, remotely
    status = json.loads(run(["status", "-p", str(proj), "--json"], inprocess=True).stdout)
    assert status["embedded_with"] == f"the embedder openai/stub-embed at {stub.url}"

    switched = run(["synonyms", "-p", str(proj), "--embed-model", "builtin", "--json"], inprocess=True)
    assert switched.returncode == 0, switched.stderr
    assert ("embedding with the embedder builtin from now on, as given (was the embedder openai/stub-embed at "
            f"{stub.url})") in switched.stderr
    after = run(["index", str(docs), "-p", str(proj), "--json"], inprocess=True)
    assert summary(after)["synonyms"] == "fresh" and "from now on" not in after.stderr
    # an embedder given anew does not inherit the remembered API base of another one
    from hrag_cli.core.config import load_settings

    ProjectDir(proj).remember({**ProjectDir(proj).remembered(), "embed.model": "openai/stub-embed",
                            "embed.api_base": stub.url, "embed.precision": "float32"})
    s = load_settings(None, {"embed.model": "st:some-folder"}, environ={}, remembered=ProjectDir(proj).remembered())
    assert s.embed.api_base == "" and s.embed.precision == "bf16"


def test_query_llm_calls_go_to_their_own_cache(stub, tmp_path: Path, sample_project: Path) -> None:
    proj = tmp_path / "proj"
    shutil.copytree(sample_project, proj)
    stub.set_chat(lambda body: "Edric Solano founded it [1].")
    llm_cache = proj / "cache" / "llm.jsonl"
    before = llm_cache.read_bytes() if llm_cache.exists() else None
    proc = run(["query", "Who founded Corvane Works?", "-p", str(proj), "--answer", "--json",
                "--llm-model", "openai/stub-model", "--llm-api-base", stub.url], inprocess=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["answer"].startswith("Edric Solano")
    assert (llm_cache.read_bytes() if llm_cache.exists() else None) == before
    # ppr with an LLM also asks it to filter the seed facts (query.fact_filter = auto): same cache file
    recs = list(store.read_jsonl(proj / "cache" / "query_llm.jsonl"))
    assert sorted(r["purpose"] for r in recs) == ["answer", "fact_filter"]


def test_dry_run_completion_estimate_follows_real_answers(stub, tmp_path: Path) -> None:
    from hrag_cli.chunk.chunking import count_tokens

    docs, proj = corpus(tmp_path, n=1)
    text = " ".join(f"Mara Quint{i} built the Selby Lighthouse{i} for the Harbour Trust of Oldport{i}."
                    for i in range(25))
    (docs / "d0.txt").write_text(text)
    proc = index(docs, proj, stub, "--dry-run", "--glean-min-tokens", "0")
    est = summary(proc)["estimate"]
    n = count_tokens(text)
    assert est["chunks"] == 1 and est["llm_requests"] == 2           # one request, one gleaning round
    # about 2.3 completion tokens per chunk token in all (1.5 first answer + 0.8 gleaning), see stage.py
    assert abs(est["completion_tokens"] - 2.3 * n) <= 2
    # each round by its own documented ratio (README): 1.5 for the first answer, 0.8 for the gleaning round
    first = summary(index(docs, proj, stub, "--dry-run", "--max-gleanings", "0"))["estimate"]
    assert first["llm_requests"] == 1 and abs(first["completion_tokens"] - 1.5 * n) <= 1
    assert abs((est["completion_tokens"] - first["completion_tokens"]) - 0.8 * n) <= 1
    assert stub.count(CHAT) == 0


# ------------------------------------------------------------------------------------- query-time calls


def test_query_with_the_remembered_model_down_falls_back_at_once(tmp_path: Path, sample_project: Path) -> None:
    from tests.stub_server import refused_port

    proj = tmp_path / "proj"
    shutil.copytree(sample_project, proj)
    (proj / "hrag.toml").write_text("[llm]\nmax_retries = 6\nbackoff_base = 30\n")   # index-time patience
    with refused_port() as port:
        url = f"http://127.0.0.1:{port}/v1"
        ProjectDir(proj).remember({"extract.extractor": "llm", "llm.model": "openai/m", "llm.api_base": url})
        proc = run(["query", "Who founded Corvane Works?", "-p", str(proj), "--mode", "hybrid", "--json"],
                   inprocess=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["keywords"] == {"high": ["Who founded Corvane Works?"], "low": ["Who founded Corvane Works?"]}
    [note] = [n for n in out["notes"] if "LLM" in n]
    assert f"cannot reach the LLM at {url}" in note and "start the server" in note and "retr" not in note
    assert not (proj / "cache" / "query_llm.jsonl").exists()


def test_query_time_calls_get_one_attempt_and_none_after_a_run_level_failure(stub, tmp_path: Path,
                                                                              sample_project: Path) -> None:
    from hrag_cli.core.llm import QUERY_CONNECT_TIMEOUT, query_client

    proj = tmp_path / "proj"
    shutil.copytree(sample_project, proj)
    (proj / "hrag.toml").write_text("[llm]\nmax_retries = 3\nbackoff_base = 0.01\n")
    queries = tmp_path / "q.txt"
    queries.write_text("Who founded Corvane Works?\nWhere is Corvane Works?\n")
    args = ["-p", str(proj), "--mode", "hybrid", "--llm-model", "openai/m", "--llm-api-base", stub.url]

    stub.set_chat(lambda body: StubReply(503, content="loading model"))     # transient: one attempt per query
    proc = run(["query", "--file", str(queries), *args], inprocess=True)
    assert proc.returncode == 0, proc.stderr
    assert stub.count(CHAT) == 2
    assert all("keeps failing" in " ".join(json.loads(line)["notes"]) for line in proc.stdout.splitlines())

    stub.reset()
    stub.set_chat(lambda body: StubReply(401, content="bad key"))            # run-wide: asked once in all
    proc = run(["query", "--file", str(queries), *args], inprocess=True)
    assert proc.returncode == 0, proc.stderr
    assert stub.count(CHAT) == 1
    assert all("refused the API key" in " ".join(json.loads(line)["notes"]) for line in proc.stdout.splitlines())

    client = query_client(ProjectDir(proj), LLMSettings(model="openai/m", api_base=stub.url))
    assert client.settings.max_retries == 0 and client.request_timeout().connect == QUERY_CONNECT_TIMEOUT


def test_query_time_rerank_and_embedding_give_up_at_the_connect_timeout(monkeypatch, tmp_path: Path,
                                                                         sample_project: Path) -> None:
    """A dead host at query time costs one short connect timeout, not the request timeout with retries and
    backoff (index-time patience): for rerank and embedding requests as for chat."""
    import time
    from dataclasses import replace

    import pytest

    from hrag_cli.core import llm
    from hrag_cli.core.errors import HragError
    from hrag_cli.query.index import QueryIndex
    from tests.stub_server import unanswered_port

    monkeypatch.setattr(llm, "QUERY_CONNECT_TIMEOUT", 0.5)
    proj = tmp_path / "proj"
    shutil.copytree(sample_project, proj)
    patient = LLMSettings(timeout=60, max_retries=4, backoff_base=30)
    with unanswered_port() as port:
        url = f"http://127.0.0.1:{port}/v1"
        client = llm.query_client(ProjectDir(proj), replace(patient, model="hosted_vllm/rr", api_base=url))
        llm.import_litellm()            # its import (seconds when cold) is no part of the wait timed here
        t0 = time.monotonic()
        with pytest.raises(HragError, match="timed out"):
            client.rerank("Who founded Corvane Works?", ["Corvane Works was founded by Ada Brell."])
        assert time.monotonic() - t0 < 10
        client.close()

        settings = ProjectDir(proj).settings()
        settings = replace(settings, llm=patient, embed=replace(settings.embed, model="openai/e", api_base=url))
        t0 = time.monotonic()
        with pytest.raises(HragError, match="timed out"):
            QueryIndex(ProjectDir(proj), settings).embed_query("Who founded Corvane Works?")
        assert time.monotonic() - t0 < 10
