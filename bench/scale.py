"""Index cost at scale: a corpus of N distinct passages, indexed offline as a user would, stage by stage.

The corpus recombines real passages (the MuSiQue and 2WikiMultiHopQA corpora in ../shared/bench) and renames
their entities: passage i is real passage i mod L (L = 8,009 real passages), plus one sentence of another
real passage, with every capitalised word (names, mostly) replaced by an invented word that depends on the word
and on the generation i // L. So every passage is new text with new names, while the number of names, their
reuse across passages (within a generation) and the sentence structure stay those of real Wikipedia passages.
`--real` instead takes the first N passages of the 2Wiki corpus as they are.

Each stage runs as its own `hrag` process (rules extractor, builtin embedder, no network), measured with
wait4: wall, CPU (user + system), peak RSS, then the project's bytes on disk and the manifest's item counts.
The chunk, extract and resolve processes each re-scan the documents first (a no-op chunk pass), as a cron
job's `hrag index` would. Then an incremental run (1 % new documents added, `hrag index` again, through
resolve and then the synonyms stage, so each one's share shows), and query
timings: cold `hrag query` (median of 3 fresh processes), batch p50 over `hrag query --file`, batch peak RSS.

    .venv/bin/python bench/scale.py --passages 1000 3000            # sizes side by side, CPU/passage ratio
    .venv/bin/python bench/scale.py --real --passages 1000 4000     # the first 2Wiki passages as they are
    nice -n 10 .venv/bin/python bench/scale.py --passages 100000 --work WORK
    .venv/bin/python bench/scale.py --passages 3000 --json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from harness import data_dir, measured, parse_args

PER_FILE = 1000                          # passages per .jsonl file of the generated folder

_CAP_WORD = re.compile(r"\b[A-Z][A-Za-z]+\b")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
# Capitalised words that are not names (sentence openers, months): kept as they are.
_KEEP = set("""The A An In On At By For From With As To Of And But Or If It He She They We You I His Her Its Their
This That These Those There Here When Where What Which Who Whom Why How After Before During Since Although
Though While However Also Both Each Every Many Most Some Several One Two Three First Second Third Other Such
Not No Yes Only Even Just All Then Thus Later Today January February March April May June July August
September October November December Monday Tuesday Wednesday Thursday Friday Saturday Sunday""".split())
_CONS = "bcdfghjklmnprstvwz"
_VOW = "aeiou"


def load_real() -> list[dict]:
    """Real passages, 2Wiki first (so --real takes its first N), then MuSiQue; duplicate texts dropped."""
    out, seen = [], set()
    for path in (data_dir() / "2wiki" / "2wikimultihopqa_corpus.json", data_dir() / "musique_train_corpus.json"):
        for p in json.loads(path.read_text(encoding="utf-8")):
            if p["text"] not in seen:
                seen.add(p["text"])
                out.append({"title": p["title"], "text": p["text"]})
    return out


def invented(word: str, generation: int) -> str:
    """A pronounceable word standing for `word` in this generation (stable across runs and processes)."""
    h = int.from_bytes(hashlib.blake2b(f"{generation}:{word}".encode(), digest_size=8).digest(), "little")
    syllables = max(2, min(4, (len(word) + 1) // 3))
    out = []
    for _ in range(syllables):
        out.append(_CONS[h % len(_CONS)] + _VOW[(h // 18) % len(_VOW)])
        h //= 90
    if h % 2:
        out.append(_CONS[(h // 2) % len(_CONS)])
    return "".join(out).capitalize()


def rename(text: str, generation: int) -> str:
    return _CAP_WORD.sub(lambda m: m.group(0) if m.group(0) in _KEEP else invented(m.group(0), generation), text)


def passage(real: list[dict], i: int) -> dict:
    """Passage i of the synthetic corpus: real passage i mod L plus one sentence of another, renamed."""
    n = len(real)
    g, b = divmod(i, n)
    base = real[b]
    other = real[(b * 7919 + g * 104729 + 13) % n]["text"]
    extra = _SENTENCE.split(other)
    text = base["text"] + " " + extra[(g + b) % len(extra)]
    return {"id": f"s{i:07d}", "title": rename(base["title"], g), "text": rename(text, g)}


def write_corpus(folder: Path, real: list[dict], start: int, stop: int, as_is: bool) -> None:
    """Passages [start, stop) as .jsonl files of PER_FILE records (names that sort in passage order)."""
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(start, stop, PER_FILE):
        e = min(stop, s + PER_FILE)
        rows = ({"id": f"r{i:07d}", **real[i]} if as_is else passage(real, i) for i in range(s, e))
        path = folder / f"part-{s:07d}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def disk(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def items(project: Path) -> dict:
    stages = json.loads((project / "manifest.json").read_text())["stages"]
    c = lambda st: stages.get(st, {}).get("counts", {})   # noqa: E731
    out = {"chunks": c("chunk").get("chunks"), "entities": c("resolve").get("entities"),
           "relations": c("resolve").get("relations"), "facts": c("resolve").get("facts"),
           "unknown_entities": c("resolve").get("unknown_entities")}
    syn = c("synonyms")
    if syn:
        out["vectors"] = sum(int(syn.get(f"vectors_{n}", 0)) for n in ("chunks", "entities", "relations", "facts"))
        out["synonym_pairs"] = syn.get("synonym_pairs")
    return {k: v for k, v in out.items() if v is not None}


def queries(real: list[dict], n: int, as_is: bool) -> list[str]:
    """2Wiki questions, renamed like generation 0 (their names then occur in the corpus)."""
    lines = (data_dir() / "2wiki" / "2wikimultihopqa_100.jsonl").read_text(encoding="utf-8").splitlines()
    qs = [json.loads(x)["question"] for x in lines if x.strip()][:n]
    return qs if as_is else [rename(q, 0) for q in qs]


def measure(n: int, work: Path, real: list[dict], as_is: bool, incremental: bool, n_queries: int) -> dict:
    docs, proj = work / "docs", work / "project"
    for p in (docs, proj):
        if p.exists():
            shutil.rmtree(p)
    write_corpus(docs, real, 0, n, as_is)
    proj.mkdir(parents=True)
    (proj / "hrag.toml").write_text('[extract]\nextractor = "rules"\n[embed]\nmodel = "builtin"\n')
    p = ["-p", str(proj), "-q"]
    stages: dict[str, dict] = {}
    for stop in ("chunk", "extract", "resolve", None):
        name = stop or "synonyms"
        stages[name] = measured("index", str(docs), *(["--stop-after", stop] if stop else []), *p)
        stages[name]["disk_mb"] = round(disk(proj) / 1e6, 1)
        print(f"[{n} passages] {name}: {json.dumps(stages[name])}", file=sys.stderr, flush=True)   # partial runs
    total = {"wall_s": round(sum(s["wall_s"] for s in stages.values()), 2),
             "cpu_s": round(sum(s["cpu_s"] for s in stages.values()), 2),
             "peak_rss_mb": max(s["peak_rss_mb"] for s in stages.values()), "disk_mb": round(disk(proj) / 1e6, 1)}
    total["cpu_ms_per_passage"] = round(1000 * total["cpu_s"] / n, 2)
    total["disk_kb_per_passage"] = round(1000 * total["disk_mb"] / n, 2)
    result = {"passages": n, "stages": stages, "total": total, "items": items(proj),
              "disk_by_folder_mb": {d.name: round(disk(d) / 1e6, 1) for d in sorted(proj.iterdir()) if d.is_dir()}}
    files = sorted((f for f in proj.rglob("*") if f.is_file()), key=lambda f: -f.stat().st_size)[:8]
    result["largest_files_mb"] = {str(f.relative_to(proj)): round(f.stat().st_size / 1e6, 1) for f in files}

    qs = queries(real, n_queries, as_is)
    qfile = work / "queries.txt"
    qfile.write_text("\n".join(qs) + "\n", encoding="utf-8")
    cold = [measured("query", qs[0], "--mode", "ppr", "--json", "-p", str(proj)) for _ in range(3)]
    batch = measured("query", "--file", str(qfile), "--mode", "ppr", "-p", str(proj), stdout_path=work / "batch.jsonl")
    lat = [json.loads(x)["timings"]["total_ms"] for x in (work / "batch.jsonl").read_text().splitlines() if x.strip()]
    result["query"] = {"cold_wall_s": statistics.median(c["wall_s"] for c in cold),
                       "cold_cpu_s": statistics.median(c["cpu_s"] for c in cold),
                       "cold_peak_rss_mb": max(c["peak_rss_mb"] for c in cold),
                       "batch_p50_ms": round(statistics.median(lat), 1) if lat else None,
                       "batch_queries": len(lat), "batch_peak_rss_mb": batch["peak_rss_mb"]}

    if incremental and not as_is:
        add = max(1, n // 100)
        write_corpus(docs, real, n, n + add, as_is)
        parts = {"to_resolve": measured("index", str(docs), "--stop-after", "resolve", *p),
                 "synonyms": measured("index", str(docs), *p)}     # the synonyms stage's own share, measured apart
        inc = {key: round(sum(part[key] for part in parts.values()), 2) for key in ("wall_s", "cpu_s")}
        inc["peak_rss_mb"] = max(part["peak_rss_mb"] for part in parts.values())
        inc["stages"] = parts
        inc["added_passages"] = add
        inc["cpu_share_of_full"] = round(inc["cpu_s"] / max(total["cpu_s"], 1e-9), 3)
        inc["wall_share_of_full"] = round(inc["wall_s"] / max(total["wall_s"], 1e-9), 3)
        result["incremental_1pct"] = inc
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passages", type=int, nargs="+", default=[1000])
    ap.add_argument("--real", action="store_true", help="the first N 2Wiki passages as they are, no renaming")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "hrag-scale")
    ap.add_argument("--no-incremental", action="store_true")
    ap.add_argument("--queries", type=int, default=100, help="questions in the batch (at most 100)")
    ap.add_argument("--keep", action="store_true", help="keep each size's project (default: only the last)")
    ap.add_argument("--json", action="store_true")
    args = parse_args(ap)
    real = load_real()
    if args.real and max(args.passages) > 6119:
        sys.exit("--real has 6,119 passages (the 2Wiki corpus)")
    results = []
    for n in args.passages:
        work = args.work / f"n{n}" if args.keep or len(args.passages) > 1 else args.work
        r = measure(n, work, real, args.real, not args.no_incremental, args.queries)
        results.append(r)
        if not args.json:
            print(f"\n== {n} passages ({'2Wiki as is' if args.real else 'renamed recombinations'}) ==")
            for name, s in r["stages"].items():
                print(f"  {name:9s} wall {s['wall_s']:8.1f} s  cpu {s['cpu_s']:8.1f} s  peak RSS {s['peak_rss_mb']:7.0f} MB"
                      f"  disk after {s['disk_mb']:8.1f} MB")
            t = r["total"]
            print(f"  {'total':9s} wall {t['wall_s']:8.1f} s  cpu {t['cpu_s']:8.1f} s  peak RSS {t['peak_rss_mb']:7.0f} MB"
                  f"  disk {t['disk_mb']:8.1f} MB  | {t['cpu_ms_per_passage']} ms CPU/passage,"
                  f" {t['disk_kb_per_passage']} KB/passage")
            print("  items:", json.dumps(r["items"]))
            print("  disk by folder (MB):", json.dumps(r["disk_by_folder_mb"]))
            print("  largest files (MB):", json.dumps(r["largest_files_mb"]))
            print("  query:", json.dumps(r["query"]))
            if "incremental_1pct" in r:
                print("  incremental +1 %:", json.dumps(r["incremental_1pct"]))
            sys.stdout.flush()
        if not args.keep and len(args.passages) > 1 and work.exists():
            shutil.rmtree(work / "project", ignore_errors=True)
    if len(results) > 1:
        base = results[0]["total"]["cpu_ms_per_passage"]
        ratios = {r["passages"]: round(r["total"]["cpu_ms_per_passage"] / base, 2) for r in results}
        if not args.json:
            print(f"\nCPU per passage relative to {results[0]['passages']} passages:", json.dumps(ratios))
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
