"""Offline extraction quality: are the rules extractor's entities names a reader would call names?

1. MuSiQue (../shared/bench, 1,890 passages): the extractor runs on each passage (title + text, what gpt-3.5
   saw) and its entity names are compared, casefolded, with the named entities gpt-3.5-turbo extracted from the
   same passages (the OpenIE file's `extracted_entities`): micro precision / recall / F1 over (passage, name)
   pairs; the UNKNOWN share of entity rows; the share of names that are one lowercase word or a bare number
   (for the extractor and for gpt-3.5); CPU seconds per passage of the extraction alone. The figures come for
   the first half of the passages in file order (where rules are decided), the second half (held out: a rule
   that helps only the first half is fitted to it) and all, each over all names and over the names that are
   neither dates nor quantities (gpt-3.5 lists a year it reads only about a third of the time, and quantities
   less, so those rows count against the extractor's dates; the `years` line measures it). Then the false
   positives and negatives of each half by kind (dates and quantities, a name's extent: an article or
   possessive, part of a longer name, glued to its neighbours; lowercase nouns, titles in quotes, ...), each
   with its count and most frequent names; `--brief` prints only the first half's false positives.
2. A documentation folder (default ../shared/bench/docs-mixed/corpus) indexed offline as a user would
   (`hrag index DOCS`, rules extractor, builtin embedder): the top entities by chunk count with their types,
   the function words and common words among the top 100 (a common word: a one-word name whose lowercase form
   the corpus uses more often than the capitalised one, such as "Update" in release notes), and the synonym
   pairs whose two names are function words.

    .venv/bin/python bench/extraction_quality.py                       # both parts, table
    .venv/bin/python bench/extraction_quality.py --skip-docs --json    # MuSiQue only, one JSON object
    .venv/bin/python bench/extraction_quality.py --docs FOLDER --top 30
    .venv/bin/python bench/extraction_quality.py --extractor package.module:function   # another extractor

`--extractor` takes any function (chunk_id, text) -> ExtractionRecord, so a candidate replacement is measured on
the same work; the docs part always measures the pipeline's own offline extractor.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable

from harness import data_dir, hrag, parse_args
from hrag_cli.core.records import ExtractionRecord
from hrag_cli.core.store import read_jsonl
from hrag_cli.core.textnorm import STOP_WORDS

OPENIE = "openie_musique_train_results_ner_gpt-3.5-turbo-1106_1890.json"
# Words no reader calls a name: the stop words plus the pronouns, determiners, prepositions, conjunctions and
# auxiliaries they leave out. Used only to judge, never by the extractor (which must not depend on this list).
FUNCTION_WORDS = STOP_WORDS | set("""
    across along although among amongst anybody anyone anything around away became become becomes beside besides
    beyond can cannot could despite either else elsewhere enough etc ever every everybody everyone everything
    here hereby herein however how-to indeed instead less let like many may maybe might much must neither
    never nevertheless nobody none nothing now often onto otherwise per perhaps rather regardless several
    shall since somebody someone something sometimes somewhere still thereby therefore though thus toward towards
    unless unlike upon us via whatever whenever wherever whether whichever whoever will within without yet
    """.split())
_TRIVIAL_RE = re.compile(r"^(?:[a-z][\w'’\-]*|[\d.,]+)$")


def trivial(name: str) -> bool:
    """One lowercase word or a bare number: rarely what a reader calls a name."""
    return bool(_TRIVIAL_RE.match(name.strip()))


def load_extractor(spec: str) -> Callable[[str, str], ExtractionRecord]:
    module, _, func = spec.partition(":")
    return getattr(importlib.import_module(module), func)


# What the judge calls a date or a quantity, independently of the extractor: a name with a digit whose other
# words are all lowercase, month names or era marks ("January 1960", "1940s", "3,200 tonnes", "early 2009",
# "17th century"), so "2018 Impact Factor" and "1964 Summer Olympics" stay names.
_MONTH_NAMES = set("""january february march april may june july august september october november december
    jan feb mar apr jun jul aug sep sept oct nov dec bc bce ad ce""".split())
_QUOTES = "\"“”‘’'«»"


def figure(name: str) -> bool:
    """A date or a quantity (see above), not a name."""
    if not re.search(r"\d", name):
        return False
    words = re.findall(r"[^\W\d_][\w'’\-]*", name)
    return all(w.islower() or w.lower().rstrip(".") in _MONTH_NAMES or re.match(r"^\d", w) for w in words)


def _core(name: str) -> str:
    """A name without a leading article and a trailing possessive: "the Beatles'" -> "beatles"."""
    low = name.casefold().strip()
    low = re.sub(r"^(?:the|a|an)\s+", "", low)
    return re.sub(r"['’]s?$", "", low).strip()


def _within(part: str, whole: str) -> bool:
    """`part` is a run of whole words inside `whole` (both casefolded)."""
    return part != whole and re.search(rf"(?<!\w){re.escape(part)}(?!\w)", whole) is not None


def _words(name: str) -> set[str]:
    return {w for w in re.findall(r"\w+", name.casefold()) if w not in FUNCTION_WORDS and not w.isdigit()}


def error_kind(name: str, others: set[str], passage: str, side: str) -> str:
    """Why a name is on one side only. `others`: the other side's names of the passage (casefolded); `side`
    "fp" for an extractor's name gpt-3.5 does not list, "fn" for a gpt-3.5 name the extractor misses."""
    low = name.casefold()
    if figure(name):
        return "date or quantity"
    core = _core(name)
    if any(_core(o) == core for o in others):
        return "extent: article or possessive"
    if any(_within(low, o) for o in others):
        return "extent: part of a longer name" if side == "fp" else "extent: extractor has it inside a longer span"
    if any(_within(o, low) for o in others):
        return "extent: glued to its neighbours" if side == "fp" else "extent: extractor has only part of it"
    if _words(name) & set().union(*(_words(o) for o in others)) if others else False:
        return "extent: overlaps a name otherwise"
    plow = passage.casefold()
    if side == "fn":
        if low not in plow:
            return "not written so in the passage"
        if any(f"{q}{low}" in plow for q in _QUOTES):
            return "title in quotes"
        if name.islower():
            return "lowercase common noun"
        if re.search(r"\s[a-z]+\s", name):
            return "name with a lowercase particle"
    elif name.islower():
        return "lowercase word"
    return "one capitalised word" if " " not in name.strip() else "name of several words"


def _prf(tp: int, n_pred: int, n_true: int) -> dict:
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_true if n_true else 0.0
    return {"precision": round(p, 3), "recall": round(r, 3), "f1": round(2 * p * r / (p + r), 3) if p + r else 0.0}


def score(pairs: list[tuple[dict, dict]]) -> dict:
    """Precision / recall / F1 of (gold, pred) name maps (casefolded name -> name), over all names and over the
    names that are neither dates nor quantities on both sides."""
    tp = n_pred = n_true = tp_n = pred_n = true_n = 0
    for gold, pred in pairs:
        tp += len(gold.keys() & pred.keys())
        n_pred += len(pred)
        n_true += len(gold)
        gn = {k for k, v in gold.items() if not figure(v)}
        pn = {k for k, v in pred.items() if not figure(v)}
        tp_n += len(gn & pn)
        pred_n += len(pn)
        true_n += len(gn)
    return {"passages": len(pairs), **_prf(tp, n_pred, n_true), "names_only": _prf(tp_n, pred_n, true_n)}


def breakdown(pairs: list[tuple[dict, dict]], passages: list[str], examples: int) -> dict:
    """The false positives and false negatives by kind, each with its count and its most frequent names."""
    out: dict[str, dict[str, Counter[str]]] = {"fp": {}, "fn": {}}
    for (gold, pred), passage in zip(pairs, passages):
        for side, mine, other in (("fp", pred, gold), ("fn", gold, pred)):
            keys = set(other)
            for k in mine.keys() - other.keys():
                out[side].setdefault(error_kind(mine[k], keys, passage, side), Counter())[mine[k]] += 1
    return {side: [{"kind": kind, "count": sum(c.values()), "top": c.most_common(examples)}
                   for kind, c in sorted(kinds.items(), key=lambda kv: -sum(kv[1].values()))]
            for side, kinds in out.items()}


def year_fairness(docs: list[dict], records: list[ExtractionRecord]) -> dict:
    """Does gpt-3.5 list the dates it reads? Of the bare years (4 digits, 1000-2099) written in the passages,
    the share gpt-3.5 lists as a name of its own or inside one; and of the extractor's date and quantity names,
    the share gpt-3.5 lists exactly."""
    years = listed = inside = figs = figs_listed = 0
    for d, rec in zip(docs, records):
        gold = [e for e in d["extracted_entities"] if isinstance(e, str)]
        for y in set(re.findall(r"(?<![\w.,])(1\d{3}|20\d\d)(?![\w.,]\d)", d["passage"])):
            years += 1
            if y in gold:
                listed += 1
            elif any(y in g for g in gold):
                inside += 1
        lows = {g.casefold() for g in gold}
        for e in rec.entities:
            if figure(e.name):
                figs += 1
                figs_listed += e.name.casefold() in lows
    return {"passage_years": years, "years_listed": round(listed / max(years, 1), 3),
            "years_inside_a_listed_name": round(inside / max(years, 1), 3),
            "extractor_figures": figs, "extractor_figures_listed": round(figs_listed / max(figs, 1), 3)}


def musique(extract: Callable[[str, str], ExtractionRecord], data: Path, examples: int = 8) -> dict:
    """The MuSiQue comparison, on the first half of the passages in file order (where changes are decided), the
    second half (held out) and all; the error breakdown of the first half and the second."""
    docs = json.loads((data / OPENIE).read_text(encoding="utf-8"))["docs"]
    rows = unknown = triv = gold_rows = gold_triv = 0
    types: Counter[str] = Counter()
    t0 = time.process_time()
    records = [extract(f"m{i}", d["passage"]) for i, d in enumerate(docs)]
    cpu = time.process_time() - t0
    pairs = []
    for d, rec in zip(docs, records):
        names = {e for e in d["extracted_entities"] if isinstance(e, str) and e.strip()}
        pairs.append(({e.casefold(): e for e in names}, {e.name.casefold(): e.name for e in rec.entities}))
        rows += len(rec.entities)
        unknown += sum(1 for e in rec.entities if e.type.lower() == "unknown")
        triv += sum(1 for e in rec.entities if trivial(e.name))
        types.update(e.type for e in rec.entities)
        gold_rows += len(names)
        gold_triv += sum(1 for g in names if trivial(g))
    half = len(docs) // 2
    passages = [d["passage"] for d in docs]
    return {
        **score(pairs), "develop": score(pairs[:half]), "held_out": score(pairs[half:]),
        "entity_rows": rows, "unknown_share": round(unknown / max(rows, 1), 3),
        "trivial_share": round(triv / max(rows, 1), 3), "gold_trivial_share": round(gold_triv / max(gold_rows, 1), 3),
        "cpu_ms_per_passage": round(1000 * cpu / len(docs), 2),
        "types": dict(types.most_common(12)),
        "years": year_fairness(docs, records),
        "errors_develop": breakdown(pairs[:half], passages[:half], examples),
        "errors_held_out": breakdown(pairs[half:], passages[half:], examples),
    }


def _corpus_case_counts(docs: Path) -> tuple[Counter[str], Counter[str]]:
    """How often each word is written lowercase and capitalised in the folder's text files."""
    lower: Counter[str] = Counter()
    cap: Counter[str] = Counter()
    for path in docs.rglob("*"):
        if not path.is_file() or path.suffix.lower() in (".png", ".svg", ".pdf", ".jpg", ".gif"):
            continue
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for w in re.findall(r"[A-Za-z][A-Za-z\-]+", text):
            (lower if w.islower() else cap)[w.lower()] += 1
    return lower, cap


def docs_folder(docs: Path, top: int, work: Path) -> dict:
    proj = work / "project"
    env = dict(os.environ, HRAG_EMBED_MODEL="", HRAG_LLM_MODEL="")
    wall = hrag("index", docs, "-p", proj, "--extractor", "rules", "-q", "--json", env=env).wall_s
    ents = list(read_jsonl(proj / "graph" / "entities.jsonl"))
    ents.sort(key=lambda e: (-len(e.get("source_ids") or []), e["name"]))
    lower, cap = _corpus_case_counts(docs)

    def common(name: str) -> bool:
        w = name.lower()
        return " " not in w and lower[w] > cap[w]

    head = ents[:100]
    bad_function = [e["name"] for e in head if e["name"].casefold() in FUNCTION_WORDS]
    bad_common = [e["name"] for e in head if common(e["name"]) and e["name"].casefold() not in FUNCTION_WORDS]
    pairs = list(read_jsonl(proj / "graph" / "synonyms.jsonl"))
    fw_pairs = [p for p in pairs if p["a"].casefold() in FUNCTION_WORDS and p["b"].casefold() in FUNCTION_WORDS]
    any_fw = [p for p in pairs if p["a"].casefold() in FUNCTION_WORDS or p["b"].casefold() in FUNCTION_WORDS]
    chunks = sum(1 for _ in read_jsonl(proj / "chunks.jsonl"))
    return {
        "docs": str(docs), "chunks": chunks, "entities": len(ents), "index_wall_s": round(wall, 1),
        "unknown_share": round(sum(1 for e in ents if e["type"].lower() == "unknown") / max(len(ents), 1), 3),
        "top": [{"name": e["name"], "type": e["type"], "chunks": len(e.get("source_ids") or [])}
                for e in ents[:top]],
        "top100_function_words": bad_function, "top100_common_words": bad_common,
        "synonym_pairs": len(pairs), "function_word_pairs": len(fw_pairs),
        "pairs_with_a_function_word": len(any_fw),
        "function_word_pair_examples": [(p["a"], p["b"], p["similarity"]) for p in fw_pairs[:5]],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--extractor", default="hrag_cli.extract.rules:extract_rules")
    ap.add_argument("--docs", type=Path, default=None, help="default: docs-mixed/corpus in the data folder")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--skip-docs", action="store_true")
    ap.add_argument("--skip-musique", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--brief", action="store_true", help="only the first half's false positives in the error table")
    args = parse_args(ap)
    args.data, args.docs = data_dir(), args.docs or data_dir() / "docs-mixed" / "corpus"
    result: dict = {"extractor": args.extractor}
    if not args.skip_musique:
        result["musique"] = musique(load_extractor(args.extractor), args.data)
    if not args.skip_docs:
        with tempfile.TemporaryDirectory(prefix="hrag-xq-") as tmp:
            result["docs"] = docs_folder(args.docs, args.top, Path(tmp))
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
        return
    m = result.get("musique")
    if m:
        print(f"MuSiQue {m['passages']} passages vs gpt-3.5 named entities ({args.extractor})")
        for label, part in (("develop (first half)", m["develop"]), ("held out (second half)", m["held_out"]),
                            ("all", m)):
            n = part["names_only"]
            print(f"  {label:23s} {part['passages']:5d} passages: precision {part['precision']:.3f}  recall "
                  f"{part['recall']:.3f}  F1 {part['f1']:.3f} | without dates and quantities: precision "
                  f"{n['precision']:.3f}  recall {n['recall']:.3f}  F1 {n['f1']:.3f}")
        print(f"  entity rows {m['entity_rows']}, UNKNOWN {100 * m['unknown_share']:.1f} %, one lowercase word or "
              f"bare number {100 * m['trivial_share']:.1f} % (gpt-3.5: {100 * m['gold_trivial_share']:.1f} %)")
        print(f"  CPU {m['cpu_ms_per_passage']:.2f} ms per passage; types {m['types']}")
        y = m["years"]
        print(f"  years: gpt-3.5 lists {100 * y['years_listed']:.0f} % of the {y['passage_years']} bare years the "
              f"passages write ({100 * y['years_inside_a_listed_name']:.0f} % more inside a longer name); "
              f"{100 * y['extractor_figures_listed']:.0f} % of the extractor's {y['extractor_figures']} dates and "
              f"quantities are among its names")
        for key, label in (("errors_develop", "first half"), ("errors_held_out", "second half")):
            for side, what in (("fp", "false positives (the extractor's, not gpt-3.5's)"),
                               ("fn", "false negatives (gpt-3.5's, missed)")):
                rows_ = m[key][side]
                print(f"  {label}, {what}: {sum(r['count'] for r in rows_)}")
                for r in rows_:
                    top = ", ".join(f"{name} {c}" if c > 1 else name for name, c in r["top"])
                    print(f"    {r['count']:5d}  {r['kind']:45s} {top}")
                if args.brief:
                    break
            if args.brief:
                break
    d = result.get("docs")
    if d:
        print(f"\n{d['docs']}: {d['chunks']} chunks, {d['entities']} entities, UNKNOWN "
              f"{100 * d['unknown_share']:.1f} %, indexed in {d['index_wall_s']} s")
        print(f"  top {len(d['top'])} entities by chunk count:")
        for i, e in enumerate(d["top"], 1):
            print(f"  {i:3d}. {e['name'][:40]:40s} {e['type']:14s} {e['chunks']}")
        print(f"  top 100: function words {d['top100_function_words']}, common words {d['top100_common_words']}")
        print(f"  synonym pairs {d['synonym_pairs']}: both names function words {d['function_word_pairs']} "
              f"{d['function_word_pair_examples']}, one of them {d['pairs_with_a_function_word']}")


if __name__ == "__main__":
    main()
