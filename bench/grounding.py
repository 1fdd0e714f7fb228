"""Grounding verification on real model output: how often it flags a real name, how often it catches an invented one,
and what pruning costs per record.

Real names: every entity gpt-3.5-turbo extracted from the 1890 MuSiQue passages (HippoRAG's OpenIE file). The
extraction is the truth only loosely (a model may paraphrase or normalise a name: "January 1960" from "Jan. 1960"),
so the flagged share is an upper bound of false flags. Invented names: for each passage, `--planted` names taken
from other passages whose words are not all in this one as written (checked on the folded text, a stricter test
than the verifier's), the kind of name a model invents from its own knowledge or the prompt's example. Recall is
the share of those flagged; a harder set swaps one word of a real name for a word not in the passage
("American Institute of Chemistry"), which the overlap test lets through from four content words on. Timings are per 1000 records with a schema and grounding on (the slow path) and with
both off (the offline default), on whatever machine runs this.

    .venv/bin/python bench/grounding.py [--planted 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
import time
from pathlib import Path

from harness import ROOT, data_dir, parse_args
from hrag_cli.extract.grounding import Grounder
from hrag_cli.extract.parser import fold
from hrag_cli.extract.schema import load_schema
from hrag_cli.extract.prune import PruneSpec, prune_record
from hrag_cli.core.records import ExtractedEntity, ExtractedRelation, ExtractionRecord
from hrag_cli.core.textnorm import normalize_text, tokenize

OPENIE = "openie_musique_train_results_ner_gpt-3.5-turbo-1106_1890.json"   # in the benchmark data folder


def absent(name: str, passage_words: set[str]) -> bool:
    return not set(tokenize(name, stop_words=False)) <= passage_words


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--openie", type=Path, default=None, help=f"default: {OPENIE} in the data folder")
    ap.add_argument("--planted", type=int, default=3, help="invented names per passage")
    ap.add_argument("--seed", type=int, default=0)
    args = parse_args(ap)
    args.openie = args.openie or data_dir() / OPENIE
    docs = [d for d in json.loads(args.openie.read_text())["docs"] if d.get("passage")]
    rng = random.Random(args.seed)
    all_names = [n for d in docs for n in d.get("extracted_entities", []) if isinstance(n, str) and n.strip()]

    real = flagged_real = planted = caught = hard = missed_hard = 0
    by_len: dict[int, list[int]] = defaultdict(lambda: [0, 0])   # content words -> [planted, flagged]
    examples: list[str] = []
    records: list[tuple[ExtractionRecord, str]] = []
    for d in docs:
        g = Grounder(d["passage"])
        names = [n for n in d.get("extracted_entities", []) if isinstance(n, str) and n.strip()]
        for n in names:
            real += 1
            if not g.grounded([n]):
                flagged_real += 1
                if len(examples) < 8:
                    examples.append(f"{n!r} in {d['title']!r}")
        words = set(tokenize(normalize_text(d["passage"]), stop_words=False))
        picked = 0
        while picked < args.planted:
            cand = rng.choice(all_names)
            if absent(cand, words) and fold(cand) not in fold(d["passage"]):
                planted += 1
                picked += 1
                caught += not g.grounded([cand])
        for n in [n for n in names if len(n.split()) >= 2][:args.planted]:   # one word changed: partly there
            other = rng.choice(all_names).split()[-1]
            if absent(other, words):
                hard += 1
                fake = " ".join(n.split()[:-1] + [other])
                missed_hard += g.grounded([fake])
                by_len[len(tokenize(fake))][0] += 1
                by_len[len(tokenize(fake))][1] += not g.grounded([fake])
        ents = [ExtractedEntity(n, "person", "") for n in names]
        rels = [ExtractedRelation(t[0], t[2], t[1], [], "", rel_type="works_for")
                for t in d.get("extracted_triples", []) if isinstance(t, list) and len(t) == 3
                and all(isinstance(x, str) for x in t)]
        records.append((ExtractionRecord(d["title"], "llm:x", ents, rels), d["passage"]))

    print(f"passages: {len(docs)}; real names: {real}; flagged as ungrounded: {flagged_real} "
          f"({100 * flagged_real / max(real, 1):.2f} %)")
    print("  e.g. " + "; ".join(examples))
    print(f"invented names planted: {planted}; flagged: {caught} (recall {100 * caught / max(planted, 1):.2f} %)")
    print(f"real names with their last word swapped for one not in the passage: {hard}; flagged: "
          f"{hard - missed_hard} (recall {100 * (hard - missed_hard) / max(hard, 1):.2f} %)")
    print("  by content words: " + ", ".join(f"{k}: {v[1]}/{v[0]}" for k, v in sorted(by_len.items())))

    schema_path = ROOT / "sample_corpus" / "schema.toml"
    specs = {"schema strict + grounding drop": PruneSpec(load_schema(schema_path), "strict", "drop"),
             "no schema, grounding off (offline default)": PruneSpec()}
    for label, spec in specs.items():
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for rec, text in records:
                prune_record(rec, text, spec)
            best = min(best, time.perf_counter() - t0)
        print(f"prune, {label}: {1000 * best / len(records) * 1000:.1f} ms per 1000 records (best of 3)")


if __name__ == "__main__":
    main()
