"""The four vector indices and the entities' name vectors brought up to date: every text hashed and only the
ones an index lacks embedded (`sync_index`), or an incremental run's records spliced in (`insert_index`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from hrag_cli.core import forkpool, store
from hrag_cli.core.config import Settings
from hrag_cli.core.errors import HragError
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir, text_hash
from hrag_cli.embed.embedder import Embedder
from hrag_cli.embed.plans import (
    Chunks, Names, Plan, appended_chunks, changed_texts, chunk_plan, chunks_token, sorted_plan)
from hrag_cli.embed.texts import entity_text, fact_row_text, relation_text
from hrag_cli.storage.vectors.index import INDEX_NAMES, VectorIndex
from hrag_cli.storage.vectors.sparse import SparseRows, mostly_zero, sparse_rows

NAMES = "entity_names"     # the name vectors of the synonym pass
EMBED_BLOCK = 4096        # texts embedded per block (bounds the dense float32 in flight: 32 MB at 2048 dims)
_HELD_TEXTS = 16 * EMBED_BLOCK     # texts to embed kept from the hashing pass (else read again)
_PARALLEL_MIN = 4 * EMBED_BLOCK    # fewer texts than this are embedded in this process (a pool costs a fork)


def _encode_in_worker(emb: Embedder, texts: list[str]) -> tuple[np.ndarray | SparseRows, int]:
    before = emb.stats["embedded"]
    m = emb.encode(texts)
    return (sparse_rows(m) if mostly_zero(m) else m), emb.stats["embedded"] - before


def embed_blocks(emb: Embedder, batches: Iterable[list[str]], total: int, reporter: Reporter,
                 min_parallel: int = _PARALLEL_MIN) -> Iterator[np.ndarray | SparseRows]:
    """The embedded batches, in order. The builtin embedder (no cache, pure Python and numpy, most of the
    stage) runs in one forked worker per core (forkpool.py), each handing back sparse rows (a small share of
    the dense bytes); a cached or remote embedder, a single core, or a job under `min_parallel` texts stays in
    this process. At most two batches per worker are in flight, so memory stays bounded whatever the total."""
    if emb.cache is not None or forkpool.workers() < 2 or total < min_parallel:
        for batch in batches:
            yield emb.encode(batch, reporter=reporter)
        return
    with reporter.task(f"embed {emb.model_id}", total=total) as task:
        for block, embedded in forkpool.forked_map(_encode_in_worker, emb, batches):
            emb.stats["embedded"] += embedded
            task.advance(len(block))
            yield block


def sync_index(project: ProjectDir, settings: Settings, emb: Embedder, name: str,
               items: Callable[[], Iterable[tuple[str, str]]], reporter: Reporter, graph: bool = True,
               synced: str = "") -> tuple[VectorIndex, dict]:
    """Bring one vector index up to date: hash every item's text (one streamed pass), embed only the items
    the saved index lacks, save. `items()` yields (id, text) afresh on each call. The pass keeps the texts to
    embed while they are few (a later run adds a few %); past _HELD_TEXTS it drops them and a second pass
    streams them in blocks, so a first build of millions of items never holds its texts."""
    vs = settings.vectors if graph else replace(settings.vectors, exact_below=1 << 62)   # never an HNSW graph
    idx = VectorIndex.load_or_create(project.vectors_dir, name, vs, emb.model_id, emb.backend.known_dim() or 0)
    ids: list[str] = []
    hashes: list[str] = []
    stored: list[int] = []
    held: list[str] | None = []
    stored_row = idx.stored_row
    for item_id, text in items():
        h = text_hash(text)
        r = stored_row(item_id, h)
        if held is not None and r < 0:
            held.append(text)
            if len(held) > _HELD_TEXTS:
                held = None
        ids.append(item_id)
        hashes.append(h)
        stored.append(r)
    rows = np.array(stored, dtype=np.int64)
    wanted = rows < 0
    todo = np.flatnonzero(wanted)

    def batches() -> Iterator[list[str]]:
        if held is not None:
            yield from (held[i:i + EMBED_BLOCK] for i in range(0, len(held), EMBED_BLOCK))
            return
        batch: list[str] = []
        for p, (_, text) in enumerate(items()):
            if wanted[p]:
                batch.append(text)
                if len(batch) >= EMBED_BLOCK:
                    yield batch
                    batch = []
        if batch:
            yield batch

    counts = idx.sync(ids, hashes, embed_blocks(emb, batches(), len(todo), reporter), rows=todo, stored=rows)
    idx.synced = synced          # the resolve output these rows follow: a later run's change list starts there
    idx.save(project.vectors_dir)
    return idx, counts


def load_for_insert(project: ProjectDir, name: str, settings: Settings, emb: Embedder, synced: str | None
                    ) -> VectorIndex | None:
    """The saved index when `insert` can bring it up to date: same embedder and dimension, synced with the
    resolve output the change list starts from (None: any), no graph."""
    try:
        idx = VectorIndex.load(project.vectors_dir, name, settings.vectors, lazy_ids=True, read_at=False)
    except HragError:
        return None
    dim = emb.backend.known_dim() or 0
    if idx is None or not len(idx) or idx.model_id != emb.model_id or (dim and idx.dim != dim) \
            or (synced is not None and idx.synced != synced) or not idx.insertable():
        return None
    return idx


def insert_index(project: ProjectDir, emb: Embedder, idx: VectorIndex, plan: Plan, texts: list[str],
                 synced: str, reporter: Reporter) -> dict:
    """Embed the changed records' texts and splice them into the index (`VectorIndex.insert`), save. A record
    made again from the same text (a new source of an old fact) keeps its row: it is not embedded again."""
    hashes = [text_hash(t) for t in texts]
    held = idx.hash_rows(plan.old_rows)
    redo = [p for p, (r, h) in enumerate(zip(plan.old_rows.tolist(), hashes)) if r < 0 or held[p] != h]
    texts, hashes = [texts[p] for p in redo], [hashes[p] for p in redo]
    batches = (texts[i:i + EMBED_BLOCK] for i in range(0, len(texts), EMBED_BLOCK))
    counts = idx.insert([plan.ids[p] for p in redo], hashes, plan.old_rows[redo], plan.before[redo],
                        embed_blocks(emb, batches, len(texts), reporter))
    idx.synced = synced
    idx.save(project.vectors_dir)
    return counts


def jsonl_items(path: Path, text: Callable[[dict], str]) -> Callable[[], Iterator[tuple[str, str]]]:
    return lambda: ((r["id"], text(r)) for r in store.read_jsonl(path))


@dataclass
class SyncedIndices:
    """What `sync_indices` did: the stage's counts and digests so far, and what the name vectors and BM25 go on
    from."""
    counts: dict[str, Any]
    digests: dict[str, Any]
    inserted: int                          # indices spliced (`insert_index`) rather than synced
    entity_plan: Plan | None               # where the changed entities went; None: the entity index was synced
    appended: dict[str, str] | None        # chunks appended since the chunk index's mark (None: read all)


def sync_indices(project: ProjectDir, settings: Settings, emb: Embedder, names: Names, chunks: Chunks,
                 mark: dict | None, synced: str, change: dict | None, with_relations: bool,
                 reporter: Reporter) -> SyncedIndices:
    """Bring the chunk, entity, relation and fact indices up to date with the records on disk: the records
    resolve changed spliced in where an incremental run can (`change`, the chunks appended since `mark`), else
    every record read and its text hashed. The entities' pass fills `names`."""

    def entity_items() -> Iterator[tuple[str, str]]:
        for r in store.read_jsonl(project.entities_path):
            names[r["id"]] = r["name"]
            yield r["id"], entity_text(r["name"], r["description"])
        names.filled()

    items: dict[str, Callable[[], Iterable[tuple[str, str]]]] = {
        "chunks": lambda: chunks.all().items(),
        "entities": entity_items,        # before relations, whose texts name their entities
        "relations": jsonl_items(project.relations_path, lambda r: relation_text(r, names)),
        "facts": jsonl_items(project.facts_path, fact_row_text),
    }
    if not with_relations:
        del items["relations"]
        for path in VectorIndex.files(project.vectors_dir, "relations"):   # an earlier run's: never read stale
            path.unlink(missing_ok=True)
    counts: dict[str, Any] = {"relation_vectors": "on" if with_relations else "off"}
    digests: dict[str, Any] = {"model_id": emb.model_id}
    added = inserted = 0
    entity_plan: Plan | None = None
    appended: dict[str, str] | None = None
    for name in (n for n in INDEX_NAMES if n in items):
        if name == "chunks":           # chunk ids name their texts: no change list needed
            idx = load_for_insert(project, name, settings, emb, None)
            tail = appended_chunks(project, idx) if idx is not None else None
            if tail is not None:
                plan, appended = tail
            else:
                plan = chunk_plan(idx, list(chunks.all())) if idx is not None else None
            got = (plan, [(appended or chunks.all())[i] for i in plan.ids]) if plan is not None else None
        else:
            idx = load_for_insert(project, name, settings, emb, change["from"]) \
                if change is not None and name in ("entities", "facts") else None
            got = changed_texts(project, name, idx, change, names) if idx is not None else None
        token = chunks_token(mark, synced) if name == "chunks" else synced
        if got is not None:
            plan, texts = got
            c = insert_index(project, emb, idx, plan, texts, token, reporter)
            entity_plan = plan if name == "entities" else entity_plan
            inserted += 1
        else:
            idx, c = sync_index(project, settings, emb, name, items[name], reporter, synced=token)
        counts[f"vectors_{name}"] = len(idx)
        added += c["added"]
        digests[name] = idx.digest()
        del idx
    counts["vectors_added"] = added
    return SyncedIndices(counts, digests, inserted, entity_plan, appended)


def sync_name_index(project: ProjectDir, settings: Settings, emb: Embedder, names: Names, change: dict | None,
                    entity_plan: Plan | None, synced: str, reporter: Reporter) -> tuple[VectorIndex, bool]:
    """The entities' name vectors, an index of their own (never searched at query time), so a later run embeds
    only new or renamed entities; its hashes double as the neighbour lists' keys. Spliced (True) when the
    entity index was and the name index follows it, else synced from every name."""
    names_idx = load_for_insert(project, NAMES, settings, emb, change["from"]) \
        if change is not None and entity_plan is not None else None
    name_plan = sorted_plan(names_idx, entity_plan.ids) if names_idx is not None else None   # type: ignore[union-attr]
    if names_idx is not None and name_plan is not None and name_plan.total == entity_plan.total:   # type: ignore[union-attr]
        insert_index(project, emb, names_idx, name_plan, [names[i] for i in name_plan.ids], synced, reporter)
        return names_idx, True
    names_idx, _ = sync_index(project, settings, emb, NAMES, names.items, reporter, graph=False, synced=synced)
    return names_idx, False


def drop_name_graph(vectors_dir: Path) -> None:
    """Earlier versions kept an HNSW graph of the name vectors; the cells replaced it, so its files go."""
    for path in (VectorIndex.paths(vectors_dir, NAMES)[0], vectors_dir / f"{NAMES}.pca.npy"):
        path.unlink(missing_ok=True)
