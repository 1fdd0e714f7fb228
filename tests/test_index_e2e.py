"""`hrag index` end to end through the real CLI, with litellm talking to the stub server.

The stub's chat responder writes a valid extraction in our row format straight from the passage it is sent
(capitalised words become entities, neighbours are related), so these tests exercise prompts, parsing,
caching, resume and exit codes without any model.

Runs that must be separate processes (kill -9, the lock, the bad-input exit codes as the shell sees them,
the first full run) start `.venv/bin/hrag`; the rest call the same entry point, `hrag_cli.cli.main`, in this process, since
importing litellm costs seconds per process.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hrag_cli.core import store
from hrag_cli.extract.rules import RULES_FINGERPRINT
from hrag_cli.chunk.stage import load_chunks
from hrag_cli.core.project import ProjectDir
from hrag_cli.core.records import ExtractionRecord
from tests.stub_server import D, StubReply, fake_extraction, is_gleaning, passage_of  # noqa: F401 (other test files import them from here)

ROOT = Path(__file__).resolve().parent.parent
HRAG = str(ROOT / ".venv" / "bin" / "hrag")
SAMPLE = ROOT / "sample_corpus"
CHAT = "/chat/completions"


# ----------------------------------------------------------------------------------------------- helpers


def small_corpus(tmp: Path, n: int = 6) -> Path:
    """A copy of part of the sample corpus (one folder of prose plus the Markdown guide and the records)."""
    docs = tmp / "docs"
    docs.mkdir()
    files = sorted(p for p in SAMPLE.rglob("*.txt"))[:n]
    for p in files:
        shutil.copy(p, docs / p.name)
    shutil.copy(SAMPLE / "guides" / "kestrel_island.md", docs / "kestrel_island.md")
    return docs


def run_inprocess(args: list[str]) -> subprocess.CompletedProcess:
    """`hrag ARGS` through cli.main in this process: same parsing, output and exit codes."""
    from hrag_cli.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    saved = sys.argv
    sys.argv = ["hrag", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
    return subprocess.CompletedProcess(["hrag", *args], code, out.getvalue(), err.getvalue())


def child_env(env: dict | None = None) -> dict:
    """The environment of an `hrag` subprocess: a dummy key, and no model or project from the caller's shell."""
    full_env = {**os.environ, "OPENAI_API_KEY": "sk-test-dummy", "HRAG_DEBUG": "", **(env or {})}
    full_env.pop("HRAG_LLM_MODEL", None)
    full_env.pop("HRAG_PROJECT", None)
    return full_env


def run(args: list[str], *, env: dict | None = None, timeout: float = 120,
        inprocess: bool = False) -> subprocess.CompletedProcess:
    if inprocess:
        return run_inprocess(args)
    return subprocess.run([HRAG, *args], capture_output=True, text=True, env=child_env(env), timeout=timeout)


def index(docs: Path | None, project: Path, stub, *extra: str, model: str = "openai/stub-model",
          inprocess: bool = True) -> subprocess.CompletedProcess:
    args = ["index", *([str(docs)] if docs else []), "-p", str(project), "--llm-model", model,
            "--llm-api-base", stub.url, "--stop-after", "extract", "--json", *extra]
    return run(args, inprocess=inprocess)


def summary(proc: subprocess.CompletedProcess) -> dict:
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout)


def extraction_lines(project: Path) -> list[dict]:
    return list(store.read_jsonl(project / "cache" / "extractions.jsonl"))


def assert_jsonl_clean(project: Path) -> None:
    """Every line of every JSONL artifact parses and ends with a newline (no torn tail left behind); a
    compressed one (store.write_jsonl(compress=True)) decompresses whole first."""
    for path in project.rglob("*.jsonl"):
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        assert not data or data.endswith(b"\n"), path
        for line in data.splitlines():
            json.loads(line)


def requested_passages(stub) -> list[str]:
    return [passage_of(body) for path, body in stub.requests if path.endswith(CHAT) and not is_gleaning(body)]


# ----------------------------------------------------------------------------------------------- tests


def test_sample_corpus_through_stub_then_rerun_is_free(stub, tmp_path: Path) -> None:
    stub.set_chat(fake_extraction)
    proj = tmp_path / "proj"
    first = index(SAMPLE, proj, stub, inprocess=False)
    assert first.returncode == 0, first.stderr
    s = summary(first)
    n_chunks = s["chunk"]["chunks"]
    assert s["chunk"]["docs"] >= 16
    ex = s["extract"]
    assert ex["chunks"] == n_chunks and ex["extracted_now"] == n_chunks and ex["pending"] == 0
    assert ex["failed"] == 0 and ex["extractor"].startswith("llm:openai/stub-model:")
    # one extraction request per chunk, and a gleaning round for each chunk of 500 tokens or more
    big = {c["chunk_id"] for c in store.read_jsonl(ProjectDir(proj).chunks_path) if c["n_tokens"] >= 500}
    assert 0 < len(big) < n_chunks
    assert stub.count(CHAT) == n_chunks + len(big) == ex["llm_requests"]
    assert ex["prompt_tokens"] > 0 and ex["entity_mentions"] > 0
    records = extraction_lines(proj)
    assert len(records) == n_chunks and all(r["status"] == "ok" for r in records)
    assert all(len(r["llm_keys"]) == 1 + (r["chunk_id"] in big) == 1 + r["gleaning_rounds"] for r in records)

    before = stub.count(CHAT)
    again = index(None, proj, stub)          # no DOCS: the roots indexed last time
    assert again.returncode == 0, again.stderr
    s2 = summary(again)
    assert stub.count(CHAT) == before
    assert s2["extract"]["cached"] == n_chunks and s2["extract"]["llm_requests"] == 0
    assert len(extraction_lines(proj)) == n_chunks

    # the records resolve will merge: one ok record per current chunk, from the manifest's extractor
    from hrag_cli.extract.stage import load_current_extractions

    current = load_current_extractions(ProjectDir(proj))
    assert len(current) == n_chunks and all(r.entities for r in current.values())

    # --reparse rebuilds the records from cached answers without a request
    rep = index(None, proj, stub, "--reparse")
    assert rep.returncode == 0, rep.stderr
    assert summary(rep)["extract"]["reparsed"] == n_chunks
    assert stub.count(CHAT) == before
    assert_jsonl_clean(proj)


def test_add_change_delete_only_new_chunks_requested(stub, tmp_path: Path) -> None:
    stub.set_chat(fake_extraction)
    docs = small_corpus(tmp_path, 4)
    proj = tmp_path / "proj"
    assert index(docs, proj, stub).returncode == 0
    stub.reset()
    stub.set_chat(fake_extraction)

    (docs / "new_doc.txt").write_text("Orla Mendes founded the Quillon Society in Brightwater in 1990.\n")
    changed = sorted(docs.glob("*.txt"))[0]
    changed.write_text(changed.read_text() + "\n\nAppendix: Tobiah Renn later edited these papers for Varrow.\n")
    deleted = sorted(docs.glob("*.txt"))[1]
    deleted_text = deleted.read_text()
    deleted.unlink()

    proc = index(docs, proj, stub)
    assert proc.returncode == 0, proc.stderr
    s = summary(proc)
    assert s["chunk"]["removed_chunks"] >= 1
    passages = requested_passages(stub)
    new_count = s["chunk"]["new_chunks"]
    assert len(passages) == new_count == s["extract"]["extracted_now"]
    assert any("Quillon Society" in p for p in passages)
    assert any("Tobiah Renn" in p for p in passages)
    # the deleted file's chunks left chunks.jsonl
    chunk_texts = [c["text"] for c in store.read_jsonl(proj / "chunks.jsonl")]
    assert not any(deleted_text.strip()[:80] in t for t in chunk_texts)


def _extract_only(docs: Path, proj: Path, url: str, *, concurrency: int, chunk_tokens: int, out: str) -> list[str]:
    """`hrag index` arguments for a run against the stub that stops after extraction (the runs a signal cuts)."""
    return ["index", str(docs), "-p", str(proj), "--llm-model", "openai/stub-model", "--llm-api-base", url,
            "--stop-after", "extract", "--concurrency", str(concurrency), "--max-gleanings", "0",
            "--chunk-tokens", str(chunk_tokens), "--chunk-overlap", "10", out]


def test_kill_9_mid_run_then_resume(stub, tmp_path: Path) -> None:
    def slow(body: dict):
        return StubReply(content=fake_extraction(body), delay=0.15)

    stub.set_chat(slow)
    docs = small_corpus(tmp_path, 8)
    proj = tmp_path / "proj"
    args = _extract_only(docs, proj, stub.url, concurrency=2, chunk_tokens=120, out="-q")
    proc = subprocess.Popen([HRAG, *args], env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ex_path = proj / "cache" / "extractions.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if ex_path.exists() and ex_path.read_bytes().count(b"\n") >= 3:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    proc.stdout.close()
    proc.stderr.close()
    done_before = {r["chunk_id"] for r in store.read_jsonl(ex_path)}
    assert len(done_before) >= 3
    # the killed run's chunks are in the generation it was filling (never made current)
    gen = max((p for p in (proj / "gens").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    chunks = list(store.read_jsonl(gen / "chunks.jsonl"))
    assert len(done_before) < len(chunks), "the run finished before it was killed; make the stub slower"
    text_of = {c["chunk_id"]: c["text"] for c in chunks}
    written = {text_of[c] for c in done_before}

    stub.reset()
    stub.set_chat(fake_extraction)
    again = run(args[:-1] + ["--json"], inprocess=True)
    assert again.returncode == 0, again.stderr
    s = summary(again)
    assert s["extract"]["pending"] == 0
    resent = [p for p in requested_passages(stub) if p in written]
    assert resent == []
    ids = [r["chunk_id"] for r in store.read_jsonl(ex_path)]
    assert set(ids) == set(text_of) and len(ids) == len(set(ids))
    assert_jsonl_clean(proj)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("sig, background", [(signal.SIGINT, False), (signal.SIGTERM, True)],
                         ids=["sigint", "sigterm-to-a-background-job"])
def test_a_signal_mid_extraction_stops_at_once_and_the_same_command_asks_nothing_twice(
        stub, tmp_path: Path, sig: int, background: bool) -> None:
    """A real SIGINT or SIGTERM to a running `hrag index` while the stub holds its third request: the process
    goes without waiting for that answer, exits 128 + the signal with one line and (--json) one failure object,
    keeps the two answered chunks' records and answers, and the same command then finishes the job without
    sending any request the stub had answered. `background`: started with SIGINT ignored, as a shell starts a
    script's background job (a cron wrapper, a benchmark's runner), which `kill` (SIGTERM) stops."""
    held, release = threading.Event(), threading.Event()

    def slow(body: dict) -> str:
        if stub.count(CHAT) >= 3 and not release.is_set():
            held.set()
            release.wait(60)             # held until the interrupted process is gone
        return fake_extraction(body)

    stub.set_chat(slow)
    docs = small_corpus(tmp_path, 2)
    proj = tmp_path / "proj"
    args = _extract_only(docs, proj, stub.url, concurrency=1, chunk_tokens=150, out="--json")
    proc = subprocess.Popen([HRAG, *args], env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_ignore_sigint if background else None)
    try:
        assert held.wait(120), "the run never reached its third request"
        proc.send_signal(sig)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
        still_held = stub.in_flight == 1 and not release.is_set()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        release.set()
    assert still_held and took < 15, f"the process waited on its request ({took:.1f} s)"
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, err
    assert [ln for ln in err.splitlines() if ln.startswith("hrag:")] == [
        f"hrag: interrupted by {name}; everything finished so far is saved, run the same command to resume"]
    assert "Traceback" not in err and "never awaited" not in err
    obj = json.loads(out)                # one failure object, with what the run did before the stop
    assert obj["failure"] == {"cause": f"interrupted by {name}", "fix": "run the same command to resume",
                              "exit_code": 128 + sig}
    assert obj["extract"]["extracted_now"] == 2 and obj["extract"]["pending"] == obj["extract"]["chunks"] - 2
    first = requested_passages(stub)
    assert len(first) == 3
    answered = first[:2]                 # the third was still held when the process went
    text_of = {c.chunk_id: c.text for c in load_chunks(ProjectDir(proj))}   # a first run keeps its chunks
    assert sorted(text_of[r["chunk_id"]] for r in extraction_lines(proj)) == sorted(answered)
    assert len(list(store.read_jsonl(proj / "cache" / "llm.jsonl"))) == 2
    assert_jsonl_clean(proj)
    status = json.loads(run(["status", "-p", str(proj), "--json"], inprocess=True).stdout)
    assert status["built_with"].startswith("the LLM openai/stub-model")
    assert status["extraction"]["extracted"] == 2 and status["extraction"]["pending"] == len(text_of) - 2

    stub.reset()
    stub.set_chat(fake_extraction)
    again = run(args, inprocess=True)
    assert again.returncode == 0, again.stderr
    ex = summary(again)["extract"]
    second = requested_passages(stub)
    assert [p for p in second if p in answered] == []
    assert first[2] in second and len(second) == len(set(second)) == ex["chunks"] - 2
    assert ex["pending"] == 0 and ex["failed"] == 0
    ids = [r["chunk_id"] for r in extraction_lines(proj)]
    assert len(ids) == len(set(ids)) == ex["chunks"]
    assert_jsonl_clean(proj)


def one_doc(tmp_path: Path) -> tuple[Path, Path]:
    """A one-sentence corpus and a project path beside it."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Mara Quint built the Selby Lighthouse for the Harbour Trust of Oldport in 1902.")
    return docs, tmp_path / "proj"


def test_429_then_success(stub, tmp_path: Path) -> None:
    stub.set_chat(fake_extraction)
    stub.enqueue(CHAT, StubReply(status=429, content="slow down", headers={"Retry-After": "0"}),
                 StubReply(status=503, content="busy"))
    docs, proj = one_doc(tmp_path)
    proc = index(docs, proj, stub, "--max-gleanings", "0")
    assert proc.returncode == 0, proc.stderr
    s = summary(proc)
    assert s["extract"]["retries"] == 2 and s["extract"]["failed"] == 0
    assert stub.count(CHAT) == 3
    [rec] = extraction_lines(proj)
    assert rec["status"] == "ok" and {e["name"] for e in rec["entities"]} >= {"Mara", "Quint", "Selby"}


def test_unparsable_answer_is_failed_listed_and_retried(stub, tmp_path: Path) -> None:
    stub.set_chat(lambda body: "I cannot help with that request, sorry.")
    docs, proj = one_doc(tmp_path)
    first = index(docs, proj, stub, "--max-gleanings", "0")
    assert first.returncode == 1, first.stderr          # not one chunk extracted: a cron job must notice
    assert summary(first)["extract"]["failed"] == 1
    status = run(["status", "-p", str(proj), "--json"])
    assert status.returncode == 0, status.stderr
    assert [f["path"] for f in json.loads(status.stdout)["failed_chunks"]] == ["a.txt"]
    from hrag_cli.extract.stage import extraction_status
    from hrag_cli.core.config import Settings

    settings = Settings()
    settings.llm.model = "openai/stub-model"
    st = extraction_status(ProjectDir(proj), settings)
    assert [f["path"] for f in st["failed_chunks"]] == ["a.txt"]

    # a plain re-run does not resend a failed chunk; --retry-failed does
    plain = index(docs, proj, stub, "--max-gleanings", "0")
    assert plain.returncode == 1 and stub.count(CHAT) == 1
    stub.set_chat(fake_extraction)
    retry = index(docs, proj, stub, "--max-gleanings", "0", "--retry-failed")
    assert retry.returncode == 0, retry.stderr
    assert stub.count(CHAT) == 2
    assert summary(retry)["extract"]["failed"] == 0


def test_rejected_request_gives_a_failed_record_not_a_crash(stub, tmp_path: Path) -> None:
    stub.set_chat(fake_extraction)
    stub.enqueue(CHAT, StubReply(status=400, content="context length exceeded"))
    docs, proj = one_doc(tmp_path)
    (docs / "b.txt").write_text("Tobiah Renn edited the Varrow Papers at the Quillon Society in Brightwater.")
    proc = index(docs, proj, stub, "--max-gleanings", "0", "--concurrency", "1")
    assert proc.returncode == 4, proc.stderr                                         # partial
    ex = summary(proc)["extract"]
    assert ex["failed"] == 1 and ex["pending"] == 0 and stub.count(CHAT) == 2      # 4xx: no retry
    failed = [r for r in extraction_lines(proj) if r["status"] == "failed"]
    assert len(failed) == 1 and "400" in failed[0]["error"] and failed[0]["llm_keys"] == []
    assert "retry-failed" in proc.stderr


def test_bad_api_key_stops_the_run_and_leaves_chunks_pending(stub, tmp_path: Path) -> None:
    stub.set_chat(lambda body: StubReply(status=401, content="invalid api key"))
    docs, proj = one_doc(tmp_path)
    (docs / "b.txt").write_text("Tobiah Renn edited the Varrow Papers at the Quillon Society in Brightwater.")
    proc = index(docs, proj, stub, "--max-gleanings", "0", "--concurrency", "1")
    _one_line_error(proc, 1, "401")
    assert stub.count(CHAT) == 1                          # not once per chunk
    assert [r for r in extraction_lines(proj) if r["status"] == "failed"] == []

    stub.set_chat(fake_extraction)                        # the key is fixed: a plain re-run does the work
    again = index(docs, proj, stub, "--max-gleanings", "0", "--concurrency", "1")
    assert again.returncode == 0, again.stderr
    ex = summary(again)["extract"]
    assert ex["failed"] == 0 and ex["pending"] == 0 and ex["extracted_now"] == 2


def test_budget_stop_then_resume(stub, tmp_path: Path) -> None:
    stub.set_chat(fake_extraction)
    docs = small_corpus(tmp_path, 6)
    proj = tmp_path / "proj"
    model = "openai/gpt-4o-mini"       # priced in litellm's cost map, so spend grows
    common = ("--max-gleanings", "0", "--concurrency", "1", "--chunk-tokens", "150", "--chunk-overlap", "10")
    stopped = index(docs, proj, stub, *common, "--max-cost", "0.0000001", model=model)
    assert stopped.returncode == 3, stopped.stderr
    assert "max-cost" in stopped.stderr and stopped.stderr.count("again to continue") == 1
    saved = extraction_lines(proj)
    assert 1 <= len(saved)
    assert ProjectDir(proj).stage("extract") is None
    assert not (proj / "chunks.jsonl").exists()   # the stopped run's version never became current
    first_requests = stub.count(CHAT)

    resumed = index(docs, proj, stub, *common, model=model)
    assert resumed.returncode == 0, resumed.stderr
    s = summary(resumed)
    n_chunks = s["chunk"]["chunks"]
    assert len(saved) < n_chunks
    assert s["extract"]["pending"] == 0 and s["extract"]["cached"] == len(saved)
    assert stub.count(CHAT) == first_requests + (n_chunks - len(saved))
    assert s["extract"]["cost"] > 0


def test_gleaning_rounds_merge_and_stop_when_nothing_new(stub, tmp_path: Path) -> None:
    def respond(body: dict) -> str:
        n = len(body["messages"])
        if n == 2:
            return fake_extraction(body)
        if n == 4:        # first gleaning round: one missed entity and a longer description
            return (f"entity{D}Lighthouse Keeper{D}person{D}The keeper.\n"
                    f"entity{D}Selby{D}concept{D}Selby is mentioned in the passage, as the name of a lighthouse.\n"
                    "<|COMPLETE|>")
        return "<|COMPLETE|>"

    stub.set_chat(respond)
    docs, proj = one_doc(tmp_path)
    proc = index(docs, proj, stub, "--max-gleanings", "3", "--glean-min-tokens", "0")
    assert proc.returncode == 0, proc.stderr
    # extraction, gleaning 1 (new rows), gleaning 2 (nothing new: stop before round 3)
    assert stub.count(CHAT) == 3
    glean2 = stub.requests[2][1]["messages"]
    assert [m["role"] for m in glean2] == ["system", "user", "assistant", "user", "assistant", "user"]
    [rec] = extraction_lines(proj)
    assert rec["gleaning_rounds"] == 2 and len(rec["llm_keys"]) == 3
    names = {e.name: e for e in ExtractionRecord.from_json(rec).entities}
    assert "Lighthouse Keeper" in names and names["Selby"].description.endswith("name of a lighthouse.")

    # chunks shorter than glean_min_tokens (default 500) get no gleaning round (a new extractor fingerprint:
    # re-extracted)
    (proj / "hrag.toml").write_text("[extract]\nglean_min_tokens = 500\n")
    stub.reset()
    stub.set_chat(respond)
    proc = index(docs, proj, stub, "--max-gleanings", "3")
    assert proc.returncode == 0, proc.stderr
    assert stub.count(CHAT) == 0          # the first request is the same as before: answered from the cache
    assert extraction_lines(proj)[-1]["gleaning_rounds"] == 0


def test_import_openie_replaces_the_extractor(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    passages = [{"id": "p1", "title": "Corvane Works", "text": "Corvane Works was founded by Edric Solano."},
                {"id": "p2", "title": "Gullhaven", "text": "Gullhaven is a village on Kestrel Island."}]
    (docs / "p.jsonl").write_text("\n".join(json.dumps(p) for p in passages) + "\n")
    openie = tmp_path / "openie_results_ner_x.json"
    openie.write_text(json.dumps({"docs": [
        {"title": p["title"], "text": p["text"], "passage": f"{p['title']}\n{p['text']}",
         "extracted_entities": [p["title"]], "extracted_triples": [[p["title"], "mentioned with", "Zed"]]}
        for p in passages]}))
    proj = tmp_path / "proj"
    proc = run(["index", str(docs), "-p", str(proj), "--stop-after", "extract", "--json",
                "--import-openie", str(openie)], inprocess=True)
    assert proc.returncode == 0, proc.stderr
    ex = json.loads(proc.stdout)["extract"]
    assert ex["extractor"].startswith("openie:") and ex["pending"] == 0 and ex["unmatched"] == 0
    from hrag_cli.extract.stage import load_current_extractions

    current = load_current_extractions(ProjectDir(proj))
    assert len(current) == 2
    assert all(r.relations[0].predicate == "mentioned with" for r in current.values())

    # a plain re-run (cron) keeps the imported extractions instead of switching to the rules extractor
    proc = run(["index", "-p", str(proj), "--stop-after", "extract", "--json"], inprocess=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["extract"]["extractor"] == ex["extractor"]
    # an explicit --extractor switches
    proc = run(["index", "-p", str(proj), "--stop-after", "extract", "--json", "--extractor", "rules"],
               inprocess=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["extract"]["extractor"] == RULES_FINGERPRINT
    # the import file gone: a clear usage error, not a silent switch
    run(["index", str(docs), "-p", str(proj), "--stop-after", "extract", "--import-openie", str(openie)],
        inprocess=True)
    openie.unlink()
    proc = run(["index", "-p", str(proj), "--stop-after", "extract"], inprocess=True)
    assert proc.returncode == 2 and "--import-openie" in proc.stderr


def test_dry_run_calls_and_writes_nothing(stub, tmp_path: Path) -> None:
    stub.set_chat(fake_extraction)
    docs = small_corpus(tmp_path, 3)
    proj = tmp_path / "proj"
    proc = index(docs, proj, stub, "--dry-run", model="openai/gpt-4o-mini")
    assert proc.returncode == 0, proc.stderr
    est = summary(proc)["estimate"]
    assert est["to_extract"] == est["chunks"] > 0
    # a gleaning round only for the chunks of 500 tokens or more (the guide has one), none for the rest
    assert est["chunks"] < est["llm_requests"] < 2 * est["chunks"]
    assert est["prompt_tokens"] > 1000 and est["cost"] > 0
    glean = summary(index(docs, proj, stub, "--dry-run", "--glean-min-tokens", "0", model="openai/gpt-4o-mini"))
    assert glean["estimate"]["llm_requests"] == 2 * est["chunks"]           # one gleaning round each
    assert glean["estimate"]["prompt_tokens"] > est["prompt_tokens"]
    assert stub.count(CHAT) == 0
    assert not (proj / "chunks.jsonl").exists() and not (proj / "cache" / "extractions.jsonl").exists()


def _one_line_error(proc: subprocess.CompletedProcess, code: int, *words: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hrag: error:")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_bad_inputs_give_one_line_errors(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    _one_line_error(run(["index", str(tmp_path / "nope"), "-p", str(proj), "--stop-after", "extract"]), 2,
                    "no such file")
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_line_error(run(["index", str(empty), "-p", str(proj), "--stop-after", "extract"]), 2, "no usable")

    binary = tmp_path / "binary"
    binary.mkdir()
    (binary / "blob.txt").write_bytes(b"\x00\x01\x02PK\x03\x04" * 50)
    proc = run(["index", str(binary), "-p", str(proj), "--stop-after", "extract"])
    _one_line_error(proc, 2, "no usable")
    assert "blob.txt" in proc.stderr and "binary" in proc.stderr

    latin = tmp_path / "latin"
    latin.mkdir()
    (latin / "old.txt").write_bytes("Caf\u00e9 au lait \u00e0 Paris".encode("latin-1"))
    proc = run(["index", str(latin), "-p", str(proj), "--stop-after", "extract"])
    _one_line_error(proc, 2, "no usable")
    assert "old.txt" in proc.stderr and "UTF-8" in proc.stderr

    # a skipped file next to good ones is only a warning
    (latin / "good.txt").write_text("Mara Quint built the Selby Lighthouse in 1902.")
    proc = run(["index", str(latin), "-p", str(proj), "--stop-after", "extract", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert "old.txt" in proc.stderr and json.loads(proc.stdout)["chunk"]["skipped_files"] == 1

    _one_line_error(run(["index", str(latin), "-p", str(proj), "--extractor", "llm"]), 2, "--extractor llm")
    _one_line_error(run(["index", str(latin), "-p", str(proj), "--extractor", "magic"]), 2, "--extractor")

    with ProjectDir(proj).lock():
        proc = run(["index", str(latin), "-p", str(proj), "--stop-after", "extract"])
    _one_line_error(proc, 75, "locked by pid")


def test_offline_rules_index_of_sample_corpus(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proc = run(["index", str(SAMPLE), "-p", str(proj), "--stop-after", "extract", "--json"])
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    assert s["extract"]["extractor"] == RULES_FINGERPRINT and s["extract"]["pending"] == 0
    assert s["extract"]["entity_mentions"] > 100
    again = run(["index", "-p", str(proj), "--stop-after", "extract", "--json"])
    assert again.returncode == 0, again.stderr
    s2 = json.loads(again.stdout)
    assert s2["extract"]["extracted_now"] == 0 and s2["chunk"]["reused_docs"] == s2["chunk"]["docs"]


def test_full_index_offline(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proc = run(["index", str(SAMPLE), "-p", str(proj), "--json"])
    assert proc.returncode == 0, proc.stderr
    status = run(["status", "-p", str(proj), "--json"])
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert all(st["state"] == "fresh" for st in info["stages"].values()), info["stages"]


def test_a_damaged_stage_is_rebuilt_with_one_warning(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    assert run(["index", str(SAMPLE), "-p", str(proj)], inprocess=True).returncode == 0
    (ProjectDir(proj).gen_dir / "graph" / "graph.pkl").unlink()
    proc = run(["index", "-p", str(proj)], inprocess=True)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "rebuilding the" in line]
    assert len(warnings) == 1 and "graph/graph.pkl is missing" in warnings[0], proc.stderr
    assert (ProjectDir(proj).gen_dir / "graph" / "graph.pkl").is_file()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
