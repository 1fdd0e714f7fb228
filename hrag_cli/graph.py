"""Building, saving and loading the one igraph graph (DESIGN.md §3).

Vertices: kind ∈ {document, chunk, entity}, all with `key` (doc_id / chunk_id / entity id).
  document: path; chunk: doc_id, order; entity: name, type, aliases.
  Attributes a kind does not have are None.
Edges: kind ∈ {PART_OF, NEXT_CHUNK, RELATION, MENTIONED_IN, SYNONYM}, all with `weight`.
  RELATION edges also carry key (relation id) and rel_type (the schema relation type; None when untyped); None
  elsewhere.
The graph is built in bulk (Graph(n, edges) then whole attribute lists), which is what lets a million
mentions resolve in seconds. The pickle holds structure only: chunk text, descriptions, source ids, predicates
and keywords stay in the JSONL records beside it (export joins them in by key), since a copy of every
description in the pickle was a third of a rules project's graph folder and no walk reads them.
"""

from __future__ import annotations

import pickle
import sys
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import store
from .errors import HragError
from .project import Project
from .records import Document, Entity, Relation, Synonym

DOCUMENT, CHUNK, ENTITY = "document", "chunk", "entity"
PART_OF, NEXT_CHUNK, RELATION, MENTIONED_IN, SYNONYM = "PART_OF", "NEXT_CHUNK", "RELATION", "MENTIONED_IN", "SYNONYM"
EDGE_KINDS = (PART_OF, NEXT_CHUNK, RELATION, MENTIONED_IN, SYNONYM)


@dataclass
class ChunkRef:
    """What the graph needs of a chunk (no text)."""

    chunk_id: str
    doc_id: str
    order: int


@dataclass(slots=True)
class GraphEntity:
    """What the graph needs of an entity (an Entity has these fields too)."""

    id: str
    name: str
    type: str
    aliases: list[str]


@dataclass(slots=True)
class GraphRelation:
    """What the graph needs of a relation (a Relation has these fields too)."""

    id: str
    src: str
    tgt: str
    weight: float
    rel_type: str


def build_graph(docs: list[Document], chunks: list[ChunkRef], entities: list[Entity] | list[GraphEntity],
                relations: list[Relation] | list[GraphRelation], mentions: Iterable[tuple[str, str, int]]) -> Any:
    """Vertices: documents (sorted by doc_id), chunks (by doc_id, order; one vertex per chunk_id even when
    the same text occurs in two documents), entities (sorted by id). `mentions` = (chunk_id, entity_id, count).
    Edges in the order PART_OF, NEXT_CHUNK, RELATION, MENTIONED_IN, so equal inputs give equal graphs."""
    import igraph

    docs = sorted(docs, key=lambda d: d.doc_id)
    chunks = sorted(chunks, key=lambda c: (c.doc_id, c.order, c.chunk_id))
    first_chunk: dict[str, ChunkRef] = {}
    for c in chunks:
        first_chunk.setdefault(c.chunk_id, c)
    uchunks = list(first_chunk.values())
    nd, nc, ne = len(docs), len(uchunks), len(entities)
    n = nd + nc + ne

    index: dict[str, int] = {}
    for i, d in enumerate(docs):
        index[d.doc_id] = i
    for i, c in enumerate(uchunks, nd):
        index[c.chunk_id] = i
    for i, e in enumerate(entities, nd + nc):
        index[e.id] = i

    edges: list[tuple[int, int]] = []
    kinds: list[str] = []
    weights: list[float] = []

    part_of = sorted({(index[c.doc_id], index[c.chunk_id]) for c in chunks if c.doc_id in index})
    edges.extend(part_of)
    kinds.extend([PART_OF] * len(part_of))
    weights.extend([1.0] * len(part_of))

    nxt: set[tuple[int, int]] = set()
    prev: ChunkRef | None = None
    for c in chunks:  # sorted by (doc_id, order)
        if prev is not None and prev.doc_id == c.doc_id and prev.chunk_id != c.chunk_id:
            a, b = index[prev.chunk_id], index[c.chunk_id]
            nxt.add((a, b) if a < b else (b, a))
        prev = c
    nxt_sorted = sorted(nxt)
    edges.extend(nxt_sorted)
    kinds.extend([NEXT_CHUNK] * len(nxt_sorted))
    weights.extend([1.0] * len(nxt_sorted))

    n_before_rel = len(edges)
    edges.extend((index[r.src], index[r.tgt]) for r in relations)
    kinds.extend([RELATION] * len(relations))
    weights.extend(float(r.weight) for r in relations)

    for chunk_id, entity_id, count in mentions:
        edges.append((index[chunk_id], index[entity_id]))
        kinds.append(MENTIONED_IN)
        weights.append(float(count))

    g = igraph.Graph(n=n, edges=edges, directed=False)
    del edges
    # every string interned: pickle writes a string once per object, so equal strings must be one object
    # whichever way the inputs were made (resolve builds them from records or, after additions, from its files)
    # for equal graphs to pickle to equal bytes
    s = sys.intern
    none_d, none_c, none_e = [None] * nd, [None] * nc, [None] * ne
    g.vs["kind"] = [DOCUMENT] * nd + [CHUNK] * nc + [ENTITY] * ne
    g.vs["key"] = [s(d.doc_id) for d in docs] + [s(c.chunk_id) for c in uchunks] + [s(e.id) for e in entities]
    g.vs["path"] = [s(d.path) for d in docs] + none_c + none_e
    g.vs["doc_id"] = none_d + [s(c.doc_id) for c in uchunks] + none_e
    g.vs["order"] = none_d + [c.order for c in uchunks] + none_e
    g.vs["name"] = none_d + none_c + [s(e.name) for e in entities]
    g.vs["type"] = none_d + none_c + [s(e.type) for e in entities]
    g.vs["aliases"] = none_d + none_c + [[s(a) for a in e.aliases] for e in entities]

    m = g.ecount()
    n_rel = len(relations)
    pad_front, pad_back = [None] * n_before_rel, [None] * (m - n_before_rel - n_rel)
    g.es["kind"] = kinds
    g.es["weight"] = weights
    g.es["key"] = pad_front + [s(r.id) for r in relations] + pad_back
    g.es["rel_type"] = pad_front + [s(r.rel_type) if r.rel_type else None for r in relations] + pad_back
    return g


def key_index(graph: Any) -> dict[str, int]:
    """vertex key -> vertex index (rebuilt on every load; never stored)."""
    return {k: i for i, k in enumerate(graph.vs["key"])} if graph.vcount() else {}


def save_graph(project: Project, graph: Any) -> None:
    """The pickle, zlib-compressed (level 1): its keys and kinds are repetitive text, a third of the bytes for a
    few milliseconds; then graph/walk.npz, the arrays a query walks."""
    data = zlib.compress(pickle.dumps(graph, protocol=pickle.HIGHEST_PROTOCOL), 1)
    store.atomic_write_bytes(project.graph_path, data)
    save_walk(project, graph)


VERTEX_KINDS = (DOCUMENT, CHUNK, ENTITY)    # walk.npz's vertex kind codes (layout: walk.py)


def walk_arrays(graph: Any) -> dict[str, np.ndarray]:
    """The arrays of the layout above from an igraph graph (undirected; every edge has kind and weight)."""
    n, m = graph.vcount(), graph.ecount()
    el = np.asarray(graph.get_edgelist(), dtype=np.int64).reshape(m, 2)
    weight = np.asarray(graph.es["weight"], dtype=np.float64) if m else np.zeros(0)
    kind_index = {k: i for i, k in enumerate(EDGE_KINDS)}
    kind = np.fromiter((kind_index[k] for k in graph.es["kind"]), dtype=np.uint8, count=m) if m else \
        np.zeros(0, np.uint8)
    rows = np.concatenate([el[:, 0], el[:, 1]])
    order = np.argsort(rows, kind="stable")
    vkind_index = {k: i for i, k in enumerate(VERTEX_KINDS)}
    keys = graph.vs["key"] if n else []
    blobs = [k.encode("utf-8") for k in keys]
    koff = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(b) for b in blobs], out=koff[1:])
    return {
        "indptr": np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))]).astype(np.int64),
        "cols": np.concatenate([el[:, 1], el[:, 0]])[order].astype(np.int32),
        "weight": np.concatenate([weight, weight])[order],
        "kind": np.concatenate([kind, kind])[order],
        "vkind": np.fromiter((vkind_index[k] for k in graph.vs["kind"]), dtype=np.uint8, count=n) if n else
        np.zeros(0, np.uint8),
        "keys": np.frombuffer(b"".join(blobs), dtype=np.uint8),
        "koff": koff,
        "order": np.asarray(sorted(range(n), key=keys.__getitem__), dtype=np.int64),
    }


def save_walk(project: Project, graph: Any) -> None:
    """Write graph/walk.npz for `graph` (atomically: temp file, then rename)."""
    with store.atomic_writer(project.walk_path) as fh:
        np.savez(fh, **walk_arrays(graph))


def load_graph(project: Project) -> tuple[Any, dict[str, int]]:
    """THE loader every later stage uses: the graph and its key -> vertex index map. Reads the compressed
    pickle and the plain one earlier versions wrote (a pickle starts with 0x80, a zlib stream never does)."""
    try:
        data = project.graph_path.read_bytes()
    except FileNotFoundError:
        raise HragError(f"no graph in {project.root} yet: run 'hrag index DOCS' (or 'hrag resolve')") from None
    try:
        graph = pickle.loads(data if data[:1] == b"\x80" else zlib.decompress(data))
    except Exception as exc:  # a damaged pickle can raise nearly anything
        raise HragError(f"{project.graph_path} is damaged ({type(exc).__name__}); run 'hrag resolve' to rebuild it") from None
    return graph, key_index(graph)


def edge_counts(graph: Any) -> dict[str, int]:
    """Edges per kind, every kind present (0 when none)."""
    counts = dict.fromkeys(EDGE_KINDS, 0)
    if graph.ecount():
        for k in graph.es["kind"]:
            counts[k] = counts.get(k, 0) + 1
    return counts


def add_synonym_edges(graph: Any, pairs: Iterable[Synonym | tuple[str, str, float] | dict]) -> Any:
    """Replace every SYNONYM edge with `pairs` (entity keys a, b and a cosine similarity as weight).
    Pairs naming an unknown key, a self-pair, or a repeat of an unordered pair are skipped. Returns the
    same graph, changed in place."""
    old = [e.index for e in graph.es.select(kind_eq=SYNONYM)] if graph.ecount() else []
    if old:
        graph.delete_edges(old)
    index = key_index(graph)
    new_edges: list[tuple[int, int]] = []
    sims: list[float] = []
    seen: set[tuple[int, int]] = set()
    for p in pairs:
        if isinstance(p, Synonym):
            a, b, s = p.a, p.b, p.similarity
        elif isinstance(p, dict):
            a, b, s = p["a"], p["b"], p["similarity"]
        else:
            a, b, s = p
        ia, ib = index.get(a), index.get(b)
        if ia is None or ib is None or ia == ib:
            continue
        pair = (ia, ib) if ia < ib else (ib, ia)
        if pair in seen:
            continue
        seen.add(pair)
        new_edges.append(pair)
        sims.append(float(s))
    if new_edges:
        none = [None] * len(new_edges)
        graph.add_edges(new_edges, attributes={"kind": [SYNONYM] * len(new_edges), "weight": sims, "key": none,
                                               "rel_type": none})
    return graph
