"""Known-truth extraction benchmark: precision and recall of alias merging, grounding and pruning, measured on
extractions whose truth is known because this script writes them.

It writes a corpus of short chunks, a schema, and the model's answer for every chunk, with planted cases:
- pruning: entities of types outside the schema (vessel, dish, instrument: dropped in strict mode) beside
  types that are schema synonyms (company, town, individual: re-typed and kept); relations whose relation
  type or endpoint types break the schema's patterns beside ones that fit;
- grounding: invented names absent from their chunk (another chunk's person, a place's "Shipping Authority",
  a four-word name with one word not in the chunk, which the token-overlap test lets through) beside real names
  written differently in the chunk ("Smith, Mary", "the Board of the Harbour of X" for "X Harbour Board", a
  name whose alias alone is in the chunk);
- aliases: organizations introduced with their acronym as an alias and later named by the acronym alone (one
  in five introduced without the alias: a merge nobody asked for, so a miss), one name used for a person and
  a place, a person whose alias is a town's name, and one organization whose alias wrongly names another
  organization (a model error the type check cannot catch).
Then it runs the real pipeline (`hrag index --schema ... --stop-after resolve`, strict mode, grounding drop)
against the stub LLM server answering with those answers, and reads what survived in graph/entities.jsonl and
relations.jsonl:
- alias merging over pairs of kept surface forms: predicted together when they landed in one entity;
- grounding over in-schema entity rows: predicted ungrounded when the row's name is gone from its chunk;
- pruning over grounded entity rows and over relation rows between kept entities: predicted pruned when gone.

    .venv/bin/python bench/extraction_truth.py [--chunks 48] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

from harness import hrag
from hrag_cli.core import store
from hrag_cli.extract.parser import fold
from hrag_cli.core.project import ProjectDir

D = "<|#|>"
SCHEMA = """
[entities.person]
description = "A human being."
synonyms = ["individual", "sailor"]
[entities.organization]
description = "A company, trust, guild or society."
synonyms = ["company", "guild"]
[entities.place]
description = "A named town, island, valley or coast."
synonyms = ["location", "town", "island"]
[entities.event]
description = "Something that happened: a storm, a fair, a launch."
[relations.works_for]
description = "A person works for or leads an organization."
patterns = [["person", "organization"]]
[relations.located_in]
description = "Something is in a place."
patterns = [["organization", "place"], ["event", "place"], ["place", "place"]]
[relations.took_part_in]
description = "A person or organization took part in an event."
patterns = [["person", "event"], ["organization", "event"]]
"""

FIRST = ["Mara", "Tobiah", "Ilse", "Odo", "Pell", "Nessa", "Ansel", "Brisa", "Corin", "Dagny", "Eamon", "Fenna",
         "Gisli", "Hedda", "Ivo", "Jorun"]
LAST = ["Quint", "Renn", "Varga", "Brisk", "Arun", "Holt", "Calder", "Fenwick", "Garrow", "Hesketh", "Ingle",
        "Jessel", "Kettering", "Lorimer", "Marchbank", "Nettleship"]
W1 = ["Calder", "Fenwick", "Marrow", "Oster", "Pellin", "Quarle", "Rusk", "Sable", "Tarn", "Umber", "Vell", "Wick",
      "Yarrow", "Zenner", "Bexley", "Dunmore"]
W2 = ["Rope", "Salt", "Lamp", "Net", "Tide", "Sail", "Anchor", "Pier"]
PLACES = ["Brinmoor", "Carrow", "Dunsel", "Eskby", "Farrow", "Gorsey", "Hollin", "Ivyholt", "Jessop", "Kelmarsh",
          "Lunby", "Mardale", "Norrow", "Orlick", "Pentre", "Quinby"]
VESSELS = ["Sea Wren", "Grey Heron", "Morning Gull", "Salt Maiden"]
DISHES = ["smoked herring pie", "samphire broth"]


@dataclass
class Row:
    chunk: int
    name: str
    type: str                 # what the model wrote
    truth: str                # keep | prune | invented
    entity: str = ""          # kept: truth identity (same string: same entity); invented: which kind
    aliases: list[str] = field(default_factory=list)


@dataclass
class Rel:
    chunk: int
    src: str
    tgt: str
    rel_type: str
    truth: str                # keep | prune


@dataclass
class Chunk:
    text: str
    rows: list[Row] = field(default_factory=list)
    rels: list[Rel] = field(default_factory=list)


def person(i: int) -> str:
    return f"{FIRST[i % 16]} {LAST[(i * 5 + 3) % 16]}"


def org(i: int) -> tuple[str, str]:
    a, b = W1[i % 16], W2[i % 8]
    return f"{a} {b} Society", f"{a[0]}{b[0]}S"


def build(n_chunks: int) -> list[Chunk]:
    """The planted corpus: six kinds of chunk in turn, every name indexed so kinds do not collide."""
    chunks: list[Chunk] = []
    for i in range(n_chunks):
        k, j = i % 6, i // 6
        c = Chunk("")
        add = c.rows.append
        rel = c.rels.append
        if k == 0:                                   # an organization introduced with its acronym
            full, short = org(j)
            p, place, vessel = person(j), PLACES[j % 16], VESSELS[j % 4]
            c.text = (f"Record {i}. The {full} ({short}) was founded in {place} by {p}. {p} sailed on the "
                      f"{vessel} every spring.")
            declared = j % 5 != 4                    # one in five: the model did not give the acronym
            add(Row(i, full, "organization", "keep", f"org{j % 16}", [short] if declared else []))
            add(Row(i, place, "town" if j % 2 else "place", "keep", f"place{j % 16}"))
            add(Row(i, p, "person", "keep", f"person{j % 16}"))
            add(Row(i, vessel, "vessel", "prune"))
            rel(Rel(i, p, full, "works_for", "keep"))
            rel(Rel(i, full, place, "located_in", "keep"))
        elif k == 1:                                 # the acronym alone, an event, a broken pattern
            full, short = org(j)
            p2, place2 = person(j + 40), PLACES[(j + 5) % 16]
            event = f"{place2} Spring Fair"
            c.text = (f"Record {i}. {short} hired {p2} before the {event}. The {event} was held in {place2}, "
                      f"where stalls sold {DISHES[j % 2]}.")
            add(Row(i, short, "company" if j % 2 else "organization", "keep", f"org{j % 16}"))
            add(Row(i, p2, "individual", "keep", f"person{(j + 40) % 16}"))
            add(Row(i, event, "event", "keep", f"event{j}"))
            add(Row(i, place2, "place", "keep", f"place{(j + 5) % 16}"))
            add(Row(i, DISHES[j % 2], "dish", "prune"))
            rel(Rel(i, p2, short, "works_for", "keep"))
            rel(Rel(i, event, place2, "located_in", "keep"))
            rel(Rel(i, p2, place2, "works_for", "prune"))            # person -> place breaks works_for
            rel(Rel(i, short, event, "sponsored", "prune"))          # no such relation type
        elif k == 2:                                 # one name, a person here ...
            name = f"Jordan {LAST[(j + 7) % 16]}"
            c.text = (f"Record {i}. {name}, a surveyor, mapped the coast for the {org(j)[0]}. "
                      f"{name} carried a brass theodolite.")
            add(Row(i, name, "person", "keep", f"jperson{j}"))
            add(Row(i, org(j)[0], "organization", "keep", f"org{j % 16}"))
            add(Row(i, "brass theodolite", "instrument", "prune"))
            rel(Rel(i, name, org(j)[0], "works_for", "keep"))
            # invented: a person of another chunk the model brought in from elsewhere
            add(Row(i, person(j + 80), "person", "invented", "absent"))
            rel(Rel(i, person(j + 80), org(j)[0], "works_for", "keep"))
        elif k == 3:                                 # ... and a valley there; a person called by a town's name
            name = f"Jordan {LAST[(j + 7) % 16]}"
            town = PLACES[(j + 9) % 16]
            p = f"Anna {town}"
            c.text = (f"Record {i}. {name} is a valley north of {town}. {p}, whom the crew called {town}, "
                      f"farmed in {name}.")
            add(Row(i, name, "location", "keep", f"jvalley{j}"))
            add(Row(i, town, "town", "keep", f"place{(j + 9) % 16}"))
            add(Row(i, p, "person", "keep", f"anna{j}", [town]))       # alias naming a place: not followed
            rel(Rel(i, name, town, "located_in", "keep"))
            rel(Rel(i, p, name, "located_in", "prune"))               # person -> place: no located_in pattern
        elif k == 4:                                 # real names written differently in the chunk
            first, last = FIRST[(j + 3) % 16], LAST[(j + 11) % 16]
            port = PLACES[(j + 2) % 16]
            full, short = org(j + 8)
            c.text = (f"Record {i}. {last}, {first} chaired the Board of the Harbour of {port}. "
                      f"{short} paid for the new pier.")
            add(Row(i, f"{first} {last}", "person", "keep", f"chair{j}"))
            add(Row(i, f"{port} Harbour Board", "organization", "keep", f"board{j}"))
            add(Row(i, full, "organization", "keep", f"org{(j + 8) % 16}", [short]))   # only the alias is written
            rel(Rel(i, f"{first} {last}", f"{port} Harbour Board", "works_for", "keep"))
            # invented: an authority the chunk never names (one word of three there) ...
            add(Row(i, f"{port} Shipping Authority", "organization", "invented", "one word of three"))
            # ... and a four-word name with one word missing, which the overlap test lets through
            add(Row(i, f"{port} Harbour Pilots Board", "organization", "invented", "three words of four"))
        else:                                        # a storm, and an alias that names another organization
            full, short = org(j + 8)
            wrong = org(j + 9)[0]
            place = PLACES[(j + 13) % 16]
            c.text = (f"Record {i}. The storm of {1880 + j} flooded {place}. The {full} rebuilt the sea wall "
                      f"with the {wrong}.")
            add(Row(i, f"storm of {1880 + j}", "event", "keep", f"storm{j}"))
            add(Row(i, place, "island", "keep", f"place{(j + 13) % 16}"))
            add(Row(i, full, "organization", "keep", f"org{(j + 8) % 16}", [wrong] if j % 4 == 0 else []))
            add(Row(i, wrong, "guild", "keep", f"org{(j + 9) % 16}"))
            rel(Rel(i, f"storm of {1880 + j}", place, "located_in", "keep"))
            rel(Rel(i, full, f"storm of {1880 + j}", "took_part_in", "keep"))
        chunks.append(c)
    return chunks


def answer(c: Chunk) -> str:
    lines = [f"entity{D}{r.name}{D}{r.type}{D}{r.name} is named in the record."
             + (f"{D}{'; '.join(r.aliases)}" if r.aliases else "") for r in c.rows]
    lines += [f"relation{D}{x.src}{D}{x.tgt}{D}{x.rel_type}{D}is linked to{D}link{D}{x.src} and {x.tgt}.{D}5"
              for x in c.rels]
    return "\n".join([*lines, "<|COMPLETE|>"])


def pr(tp: int, fp: int, fn: int) -> dict:
    return {"precision": round(100 * tp / (tp + fp), 1) if tp + fp else None,
            "recall": round(100 * tp / (tp + fn), 1) if tp + fn else None, "tp": tp, "fp": fp, "fn": fn}


def run_pipeline(chunks: list[Chunk], work: Path) -> ProjectDir:
    from tests.stub_server import StubServer

    docs, proj = work / "docs", work / "proj"
    docs.mkdir()
    for i, c in enumerate(chunks):
        (docs / f"r{i:03d}.txt").write_text(c.text, encoding="utf-8")
    (work / "schema.toml").write_text(SCHEMA, encoding="utf-8")
    by_record = {f"Record {i}.": answer(c) for i, c in enumerate(chunks)}

    def respond(body: dict) -> str:
        passage = body["messages"][-1]["content"]
        return next((a for k, a in by_record.items() if k + " " in passage), "<|COMPLETE|>")

    with StubServer(record=False) as stub:
        stub.set_chat(respond)
        env = {**os.environ, "OPENAI_API_KEY": "sk-bench-dummy"}
        hrag("index", docs, "-p", proj, "--llm-model", "openai/stub-model", "--llm-api-base", stub.url,
             "--schema", work / "schema.toml", "--stop-after", "resolve", "--json", env=env)
    return ProjectDir(proj)


def measure(chunks: list[Chunk], project: ProjectDir) -> dict:
    chunk_ids = {}
    for c in store.read_jsonl(project.chunks_path):
        chunk_ids[int(c["text"].split(".", 1)[0].split()[-1])] = c["chunk_id"]
    where: dict[tuple[str, str], str] = {}          # (chunk id, folded name) -> entity id; names before aliases
    types: dict[str, str] = {}
    entities = list(store.read_jsonl(project.entities_path))
    for e in entities:
        types[e["id"]] = e["type"]
        for cid in e["source_ids"]:
            where[(cid, fold(e["name"]))] = e["id"]
    for e in entities:
        for cid in e["source_ids"]:
            for n in e["aliases"]:
                where.setdefault((cid, fold(n)), e["id"])
    pairs = {frozenset((r["src"], r["tgt"])) for r in store.read_jsonl(project.relations_path)}

    def found(r: Row | Rel, name: str) -> str | None:
        return where.get((chunk_ids[r.chunk], fold(name)))

    rows = [r for c in chunks for r in c.rows]
    grounded_rows = [r for r in rows if r.truth != "invented"]
    in_schema = [r for r in rows if r.truth != "prune"]
    g = pr(sum(r.truth == "invented" and found(r, r.name) is None for r in in_schema),
           sum(r.truth != "invented" and found(r, r.name) is None for r in in_schema),
           sum(r.truth == "invented" and found(r, r.name) is not None for r in in_schema))
    p = pr(sum(r.truth == "prune" and found(r, r.name) is None for r in grounded_rows),
           sum(r.truth == "keep" and found(r, r.name) is None for r in grounded_rows),
           sum(r.truth == "prune" and found(r, r.name) is not None for r in grounded_rows))
    kept = {(r.chunk, r.name) for r in rows if r.truth == "keep"}
    rels = [x for c in chunks for x in c.rels if (x.chunk, x.src) in kept and (x.chunk, x.tgt) in kept]
    gone = [x for x in rels if frozenset((found(x, x.src), found(x, x.tgt))) not in pairs]
    rp = pr(sum(x.truth == "prune" for x in gone), sum(x.truth == "keep" for x in gone),
            sum(x.truth == "prune" for x in rels if x not in gone))

    # alias merging: every pair of kept surface forms (name + truth identity) that both survived
    forms: dict[tuple[str, str], str] = {}           # (folded name, truth entity) -> predicted entity id
    for r in rows:
        if r.truth == "keep" and found(r, r.name) is not None:
            forms.setdefault((fold(r.name), r.entity), found(r, r.name))
    js = range(len(chunks) // 6)
    wrong = {frozenset((f"org{(j + 8) % 16}", f"org{(j + 9) % 16}")) for j in js if j % 4 == 0}   # kind 5
    tp = fp = fn = fp_wrong = 0
    for (a, ta), (b, tb) in combinations(sorted(forms), 2):
        same_truth, same_pred = ta == tb, forms[(a, ta)] == forms[(b, tb)]
        tp += same_truth and same_pred
        fp += same_pred and not same_truth
        fp_wrong += same_pred and not same_truth and frozenset((ta, tb)) in wrong
        fn += same_truth and not same_pred
    by_truth: dict[str, set[str]] = {}
    for (_, t), eid in forms.items():
        by_truth.setdefault(t, set()).add(eid)

    def apart(a: str, b: str) -> bool:
        return not (by_truth.get(a, set()) & by_truth.get(b, set()))

    invented = {}
    for r in in_schema:
        if r.truth == "invented":
            n = invented.setdefault(r.entity, [0, 0])
            n[0] += 1
            n[1] += found(r, r.name) is None
    retyped = [r for r in rows if r.truth == "keep" and r.type not in ("person", "organization", "place", "event")]
    want = {"individual": "person", "company": "organization", "guild": "organization", "town": "place",
            "island": "place", "location": "place"}
    right = sum(types.get(found(r, r.name) or "") == want[r.type] for r in retyped)
    return {"chunks": len(chunks), "entity_rows": len(rows), "relation_rows": sum(len(c.rels) for c in chunks),
            "alias_merging": pr(tp, fp, fn), "grounding": g, "pruning_entities": p, "pruning_relations": rp,
            "retyped_correctly": f"{right}/{len(retyped)}",
            "same_name_person_and_place_apart": f"{sum(apart(f'jperson{j}', f'jvalley{j}') for j in js)}/{len(js)}",
            "person_alias_naming_a_town_apart": f"{sum(apart(f'anna{j}', f'place{(j + 9) % 16}') for j in js)}/{len(js)}",
            "wrong_same_type_aliases_planted": len(wrong), "false_merge_pairs_from_them": fp_wrong,
            "invented_flagged_by_kind": {k: f"{v[1]}/{v[0]}" for k, v in invented.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=48, help="chunks to write (six kinds in turn; 6 to 96)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not 6 <= args.chunks <= 96:
        ap.error("--chunks takes 6 to 96 (beyond, the invented names repeat)")
    chunks = build(args.chunks)
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(chunks, run_pipeline(chunks, Path(tmp)))
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['chunks']} chunks, {result['entity_rows']} entity rows, {result['relation_rows']} relation rows "
          "(strict schema, grounding drop)")
    for key in ("alias_merging", "grounding", "pruning_entities", "pruning_relations"):
        m = result[key]
        print(f"  {key:18s} precision {m['precision']}%  recall {m['recall']}%  "
              f"(tp {m['tp']}, fp {m['fp']}, fn {m['fn']})")
    print(f"  synonym types re-typed to the right schema type: {result['retyped_correctly']}")
    print(f"  kept apart: one name for a person and a place {result['same_name_person_and_place_apart']}, "
          f"a person whose alias is a town's name {result['person_alias_naming_a_town_apart']}")
    print(f"  false-merge pairs from the {result['wrong_same_type_aliases_planted']} planted aliases naming another "
          f"organization (a model error of one type, which no rule sees): {result['false_merge_pairs_from_them']} "
          f"of {result['alias_merging']['fp']}")
    print("  invented names dropped, by kind: " + ", ".join(f"{k} {v}" for k, v in
                                                            result["invented_flagged_by_kind"].items()))


if __name__ == "__main__":
    main()
