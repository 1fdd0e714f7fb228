"""What a small local model extracts, per answer format, against the rules extractor and gpt-3.5's entities.

Takes MuSiQue questions in order and, for each, all of its supporting (gold) passages, until --passages
passages are covered; the gpt-3.5-turbo-1106 named entities of the same passages (the HippoRAG OpenIE file)
are the reference. For each format (delimited, json) it serves Qwen2.5-Coder-1.5B-Instruct on loopback
(bench/local_server.py) and runs `hrag index --stop-after extract` over those passages, one per document, then
prints: answers parsed (records whose answer gave rows without a format drop), rows dropped by reason,
answers that ran to the token cap, entity precision / recall / F1 (names compared case- and blank-folded,
micro-averaged over passages), wall seconds per chunk and the model server's CPU seconds per chunk. The rules
extractor is scored on the same passages. --hints sets [extract] hints (default: hrag's default).

--minutes M stops each format's extraction after M minutes (as Ctrl-C would: hrag keeps the finished chunks)
and scores the passages it finished, the rules extractor on the same ones; --answers FILE seeds the project
with an earlier run's cache/llm.jsonl, so a stopped run continues without asking anything twice.

With --retrieval it also indexes the extracted passages three ways (the local model's answers in the last
format run, reused from its cache; the rules extractor; the gpt-3.5 OpenIE import) and runs `hrag eval` for
the questions whose gold passages were all extracted: Recall@2/5 over that small corpus.

SIGTERM, SIGHUP and Ctrl-C stop the model server and the running hrag too.

    .venv/bin/python bench/llm_extraction.py [--passages 8] [--formats delimited json] [--hints rules|none]
        [--minutes M] [--answers LLM_JSONL] [--retrieval] [--out FIGURES_JSON]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import harness
from harness import Run
from hrag_cli.core import store
from hrag_cli.core.records import ExtractionRecord
from hrag_cli.extract.rules import extract_rules
from local_server import MODEL_NAME, free_port, model_file, start_server, stop, stop_on_signals, wait_ready

OPENIE = "openie_musique_train_results_ner_gpt-3.5-turbo-1106_1890.json"
FORMAT_DROPS = ("unreadable_row", "unknown_record", "not_json", "bad_item", "unreadable_gleaning")
# A verb phrase where a name belongs: in the line format a row's fields shifted, a format fault; a JSON answer
# names its fields, so there it is what the model said, not how (counted among the drops, not the format's).
LINE_FORMAT_DROPS = ("shifted_fields",)


def norm(name: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", name.casefold()).split())


def pick(n: int, data: Path) -> tuple[list[dict], list[dict]]:
    """(passages, questions): questions in order with all their gold passages, as long as they fit in n."""
    questions = json.loads((data / "musique_train.json").read_text(encoding="utf-8"))
    openie = {d["passage"]: d for d in json.loads((data / OPENIE).read_text(encoding="utf-8"))["docs"]}
    passages: dict[str, dict] = {}
    chosen = []
    for q in questions:
        gold = [f"{p['title']}\n{p['paragraph_text']}" for p in q["paragraphs"] if p["is_supporting"]]
        if not all(g in openie for g in gold):
            continue
        if len(passages) == n:
            break
        if len(passages) + len([g for g in gold if g not in passages]) > n:
            continue        # a later question's passages may still fit
        for g in gold:
            passages.setdefault(g, openie[g])
        chosen.append(q)
    return list(passages.values()), chosen


def score(found: list[set[str]], truth: list[set[str]]) -> dict:
    tp = sum(len(f & t) for f, t in zip(found, truth))
    nf, nt = sum(map(len, found)), sum(map(len, truth))
    p, r = tp / max(nf, 1), tp / max(nt, 1)
    return {"precision": round(p, 3), "recall": round(r, 3), "f1": round(2 * p * r / max(p + r, 1e-9), 3)}


def hrag(*args: str, interrupt_after: float | None = None) -> tuple[Run, float]:
    """One command with the user's own HRAG_ settings left out; (the run, its wall seconds)."""
    run = harness.hrag(*args, check=False, env={k: v for k, v in os.environ.items() if not k.startswith("HRAG_")},
                       interrupt_after=interrupt_after)
    return run, run.wall_s


def write_docs(passages: list[dict], folder: Path) -> dict[str, int]:
    """One .txt per passage; returns file name -> passage index."""
    folder.mkdir(parents=True)
    names = {}
    for i, p in enumerate(passages):
        name = f"p{i:03d}.txt"
        (folder / name).write_text(p["passage"], encoding="utf-8")
        names[name] = i
    return names


def read_jsonl(path: Path) -> list[dict]:
    return [r for r in store.read_jsonl(path) if isinstance(r, dict)]    # compressed or not


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def newest(proj: Path, name: str) -> Path:
    """A stage file of the project's newest generation: an interrupted run's chunks are in a generation that
    never became `current`."""
    gens = sorted(proj.glob(f"gens/*/{name}"), key=lambda p: int(p.parent.name))
    return gens[-1] if gens else proj / name


def run_format(fmt: str, passages: list[dict], truth: list[set[str]], rules: list[set[str]], url: str, work: Path,
               args: argparse.Namespace, server_pid: int) -> dict:
    """Index the passages with the model in one format and score what it extracted. With --minutes the run is
    interrupted (as by Ctrl-C: the finished chunks are kept) and only the finished passages are scored, for
    the model and the rules extractor alike."""
    docs = work / "docs"
    names = {f"p{i:03d}.txt": i for i in range(len(passages))}
    if not docs.exists():
        write_docs(passages, docs)
    proj = work / f"proj-{fmt}"
    (proj / "cache").mkdir(parents=True)
    hints = f'hints = "{args.hints}"\n' if args.hints else ""
    (proj / "hrag.toml").write_text(f'[extract]\nformat = "{fmt}"\n{hints}')
    seeded: set[str] = set()
    if args.answers is not None:        # an earlier run's answers: the same requests are not sent again
        shutil.copyfile(args.answers, proj / "cache" / "llm.jsonl")
        seeded = {r["key"] for r in read_jsonl(args.answers)}
    cpu0 = cpu_seconds(server_pid)
    proc, seconds = hrag("index", str(docs), "-p", str(proj), "--llm-model", MODEL_NAME, "--llm-api-base", url,
                         "--stop-after", "extract", "--json",
                         interrupt_after=args.minutes * 60 if args.minutes else None)
    server_cpu = cpu_seconds(server_pid) - cpu0
    chunks = {c["chunk_id"]: c for c in read_jsonl(newest(proj, "chunks.jsonl"))}
    doc_names = {d["doc_id"]: Path(d["path"]).name for d in read_jsonl(newest(proj, "docs.jsonl"))}
    answers = {r["key"]: r for r in read_jsonl(proj / "cache" / "llm.jsonl")}
    found = [set() for _ in passages]
    done: set[int] = set()
    dropped: dict[str, int] = {}
    parsed = capped = n_answers = records = fresh = 0
    for rec in read_jsonl(proj / "cache" / "extractions.jsonl"):
        chunk = chunks.get(rec["chunk_id"])
        if chunk is None:
            continue
        records += 1
        fresh += not set(rec.get("llm_keys", [])) <= seeded      # asked in this run, not answered from --answers
        idx = names[doc_names[chunk["doc_id"]]]
        done.add(idx)
        for k, v in (rec.get("dropped") or {}).items():
            dropped[k] = dropped.get(k, 0) + v
        turns = [answers[k] for k in rec.get("llm_keys", []) if k in answers]
        n_answers += len(turns)
        capped += sum(t.get("finish_reason") == "length" for t in turns)
        reasons = FORMAT_DROPS + (LINE_FORMAT_DROPS if fmt == "delimited" else ())
        format_drops = sum((rec.get("dropped") or {}).get(k, 0) for k in reasons)
        parsed += rec["status"] != "failed" and not format_drops
        found[idx] |= {norm(e.name) for e in ExtractionRecord.from_json(rec).entities}
    kept = sorted(done)
    return {"format": fmt, "exit": proc.returncode, "chunks": len(chunks), "records": records,
            "passages_done": len(kept), "answers": n_answers,
            "parsed": parsed, "parsed_share": round(parsed / max(records, 1), 3), "capped_answers": capped,
            "dropped": dropped, "asked_now": fresh, "seconds_per_chunk": round(seconds / max(fresh, 1), 1),
            "server_cpu_s_per_chunk": round(server_cpu / max(fresh, 1), 1),
            "hrag_cpu_s": round(proc.cpu_s, 1), "load_average": round(os.getloadavg()[0], 1),
            **score([found[i] for i in kept], [truth[i] for i in kept]),
            "rules_same_passages": score([rules[i] for i in kept], [truth[i] for i in kept]),
            "project": str(proj), "done": kept, "found": [sorted(f) for f in found]}


def retrieval(passages: list[dict], questions: list[dict], res: dict, work: Path, data: Path) -> None:
    """Recall@2/5 of `hrag eval` for the chosen questions whose gold passages were all extracted by the model,
    over those passages (the same documents in each project, no LLM at query time), three extractions. The
    model's graph is a fresh project over those documents seeded with the model's cached answers, so no request
    is sent again."""
    done = set(res["done"])
    titles = {passages[i]["passage"].split("\n", 1)[0]: i for i in range(len(passages))}
    chosen = [q for q in questions if all(titles.get(p["title"]) in done
                                          for p in q["paragraphs"] if p["is_supporting"])]
    if not chosen:
        print("\nretrieval: no question has all its gold passages extracted")
        return
    docs = work / "ret-docs"
    docs.mkdir()
    for i in sorted(done):
        (docs / f"p{i:03d}.txt").write_text(passages[i]["passage"], encoding="utf-8")
    qa = work / "qa.jsonl"
    qa.write_text("".join(json.dumps({"question": q["question"], "gold":
                                      [p["title"] for p in q["paragraphs"] if p["is_supporting"]]}) + "\n"
                          for q in chosen))
    llm_proj = work / "ret-model"
    (llm_proj / "cache").mkdir(parents=True)
    shutil.copyfile(Path(res["project"]) / "hrag.toml", llm_proj / "hrag.toml")
    shutil.copyfile(Path(res["project"]) / "cache" / "llm.jsonl", llm_proj / "cache" / "llm.jsonl")
    model = ["--llm-model", MODEL_NAME, "--llm-api-base", res["url"]]
    print(f"\nretrieval: {len(chosen)} questions over their {len(done)} gold passages (hrag eval, default modes)")
    projects = [(f"local model ({res['format']})", llm_proj, model),
                ("rules", work / "ret-rules", ["--extractor", "rules"]),
                ("gpt-3.5 OpenIE", work / "ret-openie", ["--import-openie", str(data / OPENIE)])]
    for label, proj, extra in projects:
        proc, _ = hrag("index", str(docs), "-p", str(proj), *extra, "--json")
        sent = (json.loads(proc.stdout or "{}").get("extract") or {}).get("llm_requests", "") \
            if proc.returncode == 0 else ""
        # the graphs are compared, not query-time help: no model picks the query's keywords in any of them
        ev, _ = hrag("eval", str(qa), "-p", str(proj), "--llm-model", "", "--json")
        print(f"  {label}: index exit {proc.returncode}{f', {sent} requests sent' if sent != '' else ''}; "
              f"eval {ev.stdout.strip()[:600] or ev.stderr.strip()[-300:]}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passages", type=int, default=8)
    ap.add_argument("--formats", nargs="+", default=["delimited", "json"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hints", choices=["rules", "none"], default=None)
    ap.add_argument("--minutes", type=float, default=None, help="stop each format's extraction after this long "
                    "and score the passages it finished")
    ap.add_argument("--answers", type=Path, default=None, help="cache/llm.jsonl of an earlier run to reuse")
    ap.add_argument("--retrieval", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="also write the figures (and each passage's names) here, "
                    "and each format's answers beside it (OUT.FORMAT.jsonl, for --answers)")
    args = harness.parse_args(ap)
    args.data = harness.data_dir()

    passages, questions = pick(args.passages, args.data)
    truth = [{norm(e) for e in p["extracted_entities"] if isinstance(e, str)} for p in passages]
    print(f"{len(passages)} passages (the gold passages of {len(questions)} MuSiQue questions), "
          f"{sum(map(len, truth))} gpt-3.5 entities; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    rules = [{norm(e.name) for e in extract_rules(str(i), p["passage"]).entities} for i, p in enumerate(passages)]
    print(f"rules extractor: {score(rules, truth)}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="hrag-llm-extraction-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    log = work / "server.log"
    stop_on_signals()
    server = start_server(model_file(), port, args.threads, 4096, log)
    results = []
    try:
        print(f"model server ready in {wait_ready(url, server, log):.0f} s ({model_file().name})")
        for fmt in args.formats:
            res = {**run_format(fmt, passages, truth, rules, url, work, args, server.pid), "url": url}
            results.append(res)
            print(json.dumps({k: v for k, v in res.items() if k not in ("project", "done", "found", "url")}),
                  flush=True)
            if args.out is not None:
                args.out.write_text(json.dumps({"titles": [p["passage"].split("\n", 1)[0] for p in passages],
                                                "truth": [sorted(t) for t in truth],
                                                "rules": [sorted(r) for r in rules], "results": results}, indent=1))
                # the answers too, so that a stopped run can be continued with --answers
                shutil.copyfile(Path(res["project"]) / "cache" / "llm.jsonl", args.out.with_suffix(f".{fmt}.jsonl"))
        if args.retrieval and results:
            retrieval(passages, questions, results[-1], work, args.data)
    finally:
        stop(server)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
