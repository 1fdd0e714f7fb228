"""The synonyms stage: embeddings, the four vector indices, BM25 over chunks, and SYNONYM edges.

    run_synonyms(project, settings, reporter, review_path=None, accept_path=None) -> StageOutcome

1. Embeds (through the cache) chunks, entities, relations and facts and syncs the vector indices (embed/indices.py
   over storage/vectors, incremental plans in embed/plans.py);
   for the builtin embedder it first refreshes the frozen IDF table when the corpus moved (embed.refresh_idf).
   After a resolve that patched its records, graph/changed_ids.json lists the records it added or made again;
   when it starts from the resolve output the indices were last synced with (their id map's "synced"), only
   those records are read (at their lines), embedded and spliced in (VectorIndex.insert), and the chunk index
   takes the chunks it lacks: when its "synced" names the `chunk.stage.chunk_mark` it holds and chunks were only
   appended since, just those are read (from the file's end); otherwise every record is read and its text hashed.
2. Updates the BM25 index over chunks (embed/bm25_sync.py: storage/bm25.BM25Index saved at vectors/bm25): new
   chunk ids added, gone ones removed (a chunk id is a hash of its text, so a changed chunk is a removal plus an
   addition).
3. SYNONYM edges, HippoRAG style: for each entity its `synonyms.top_k` nearest entities by cosine of their NAME
   vectors (HippoRAG links entity phrases, and name+description vectors of entities described by the same sentence
   look alike whatever their names); a pair with similarity >= the floor (`synonyms.threshold`, raised to the
   nearest-neighbour similarity of the best-matched `synonyms.top_share` of the entities) whose names both have
   >= `min_name_chars` letters/digits and are names (no date, quantity, number or function word) becomes one
   undirected edge (weight = similarity). The neighbours come from a
   self-join over overlapping k-means cells (storage/cells.py; exact up to cells_per_entity * cell_size entities),
   with exact cosines. The name vectors are kept as a vector index of their own (vectors/entity_names.*, never
   searched at query time), so a later run embeds only new or renamed entities. The builtin embedder, the cells, the
   join and the ranking of its candidates run in one forked worker process per core (forkpool.py) when the work is
   large. Neighbour lists, the cells and their centroids are kept as arrays in vectors/entity_names.knn.npz keyed by
   (entity id, text hash), and a run that kept the cells writes only the lists and keys that differ from it as
   vectors/entity_names.knn.patch (embed/knn.py, `KnnLists.save`): a later run joins only new or changed entities
   (and entities whose neighbours changed or vanished) with the members of their cells and offers each to the kept
   entities there, instead of comparing everything again. Written to graph/synonyms.jsonl and, replacing previous
   SYNONYM edges, into graph/graph.pkl. Pairs and edges: embed/synonym_edges.py.
4. Review (embed/review.py): `review_path` writes the candidate pairs as TSV (a, b, a_name, b_name, similarity,
   action) and changes nothing in graph/; `accept_path` reads such a TSV back: action `link` forces an edge, `skip`
   drops the pair, `merge` marks the two entities as the same thing. Decisions persist in
   graph/synonym_decisions.jsonl and are re-applied on every later run (after new documents too). A merge is
   realised as a SYNONYM edge of weight 1.0 (PPR then moves freely between the two); resolve may read the `merge`
   rows of graph/synonym_decisions.jsonl to fold the entities together.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np

from hrag_cli.chunk.stage import chunk_mark
from hrag_cli.core import store
from hrag_cli.core.config import Settings
from hrag_cli.core.errors import UsageError
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir, StageOutcome, fingerprint
from hrag_cli.embed.bm25_sync import sync_bm25
from hrag_cli.embed.embedder import get_embedder, refresh_idf
from hrag_cli.embed.indices import NAMES, drop_name_graph, sync_indices, sync_name_index
from hrag_cli.embed.plans import Chunks, Names, resolve_change
from hrag_cli.embed.review import (
    accept, apply_decisions, load_decisions, read_review, review_rows, save_decisions, write_review)
from hrag_cli.embed.synonym_edges import (candidate_pairs, find_neighbours, names_only, pair_records, save_edges,
                                          similarity_floor)
from hrag_cli.embed.texts import relation_vectors
from hrag_cli.storage.vectors.index import FORMAT as VECTOR_FORMAT


def settings_fingerprint(settings: Settings) -> str:
    e = settings.embed
    return fingerprint("synonyms-v1", VECTOR_FORMAT, e.model.strip() or "builtin", e.idf_refresh_growth,
                       asdict(settings.vectors), asdict(settings.synonyms))


def check_settings(settings: Settings) -> None:
    """Out-of-range [synonyms] values stop the run before anything is embedded or written."""
    s = settings.synonyms
    for key, ok, rule in (("top_k", s.top_k >= 1, "at least 1"),
                          ("threshold", -1.0 <= s.threshold <= 1.0, "between -1 and 1"),
                          ("min_name_chars", s.min_name_chars >= 0, "at least 0"),
                          ("cells_per_entity", s.cells_per_entity >= 1, "at least 1"),
                          ("cell_size", s.cell_size >= 2, "at least 2")):
        if not ok:
            raise UsageError(f"setting synonyms.{key}: {getattr(s, key)!r} must be {rule}")


def run_synonyms(project: ProjectDir, settings: Settings, reporter: Reporter, review_path: Path | None = None,
                 accept_path: Path | None = None) -> StageOutcome:
    check_settings(settings)
    if review_path is not None and accept_path is not None:
        raise UsageError("--review and --accept cannot be used together: review first, then accept the file")
    # entity id -> name, filled by the entity index's pass over the file (one read of it, not two); a reviewed
    # file is checked against the names before anything is written
    names = Names(project.entities_path)
    accepted = read_review(accept_path, names.fill()) if accept_path is not None else None
    chunks = Chunks(project)
    mark = chunk_mark(project)
    n_chunk_rows = mark["chunks"] if mark is not None else chunks.rows()
    idf = refresh_idf(project, settings, (c["text"] for c in store.read_jsonl(project.chunks_path)), n_chunk_rows,
                      reporter)
    emb = get_embedder(project, settings, cache_writes=True)
    extract = project.stage("extract")
    with_relations = relation_vectors(settings, str(extract.counts.get("extractor", "")) if extract else "")
    resolved = project.stage("resolve")
    synced = resolved.output_digest if resolved else ""
    # an incremental run embeds only what resolve changed, spliced into indices synced with its previous output
    # (relation texts name their entities: with relation vectors every name is read, so every record is)
    change = resolve_change(project) if review_path is None and accept_path is None and not with_relations \
        else None
    done = sync_indices(project, settings, emb, names, chunks, mark, synced, change, with_relations, reporter)
    counts, digests = done.counts, done.digests
    counts.update(sync_bm25(project, chunks, done.appended, reporter, counts["vectors_chunks"]))
    counts.update(idf)
    del chunks                 # every chunk's text, read for the chunk index and BM25: not held through the join

    # -- synonym edges --
    s = settings.synonyms
    drop_name_graph(project.vectors_dir)
    names_idx, spliced = sync_name_index(project, settings, emb, names, change, done.entity_plan, synced, reporter)
    counts["indices_spliced"] = done.inserted + spliced
    ent_keys, ent_hashes = names_idx.id_array(), names_idx.hash_array()     # fixed-width bytes, no str per row
    names_full = names_idx.rows()
    counts["embedded_now"] = emb.stats["embedded"]
    counts["cached"] = emb.stats["cached"]
    digests[NAMES] = names_idx.digest()
    del names_idx
    knn, queried = find_neighbours(project, settings, emb.model_id, ent_keys, ent_hashes, names_full, names,
                                   reporter)
    counts["entities_queried"] = queried
    linkable = knn.chars >= s.min_name_chars
    floor = similarity_floor(knn, linkable, s.threshold, s.top_share)
    linkable = names_only(knn, linkable, floor)
    counts["synonym_floor"] = round(floor, 4)
    decisions = load_decisions(project)
    # a plain run (nothing reviewed) writes the pairs as they come, in order; reviewed decisions need them by key
    records = pair_records(knn, linkable, floor) \
        if accepted is None and review_path is None and not decisions else None
    auto = candidate_pairs(knn, linkable, floor) if records is None else {}
    n_auto = len(auto) if records is None else len(records)
    if accepted is not None:
        row_of = {i: p for p, i in enumerate(knn.ids)}

        def cosine(a: str, b: str) -> float:
            va, vb = names_full.dense(np.array([row_of[a], row_of[b]]))
            return round(float(va @ vb), 6)

        accept(decisions, accepted, auto, cosine)
        save_decisions(project, decisions)
        counts["accepted_rows"] = len(accepted)

    if review_path is not None:
        rows = review_rows(auto, decisions, names)
        write_review(review_path, rows, names)
        counts.update({"review_pairs": len(rows), "review_file": str(review_path), "review_only": 1})
        return StageOutcome(counts=counts, output_digest="")

    if records is None:
        pairs, forced, merges = apply_decisions(auto, decisions, names)
        records = [{"a": a, "b": b, "similarity": round(float(sim), 6)} for (a, b), sim in sorted(pairs.items())]
    else:
        forced = merges = 0
    save_edges(project, settings, records)
    counts.update({"synonym_pairs": len(records), "synonym_auto": n_auto, "synonym_forced": forced,
                   "synonym_merges": merges})
    digests["synonyms"] = fingerprint(records)
    return StageOutcome(counts=counts, output_digest=fingerprint(digests))
