"""Building, saving and loading the one igraph graph (docs/design.md, "The graph").

Vertices: kind ∈ {document, chunk, entity}, all with `key` (doc_id / chunk_id / entity id).
  document: path; chunk: doc_id, order; entity: name, type, aliases.
  Attributes a kind does not have are None.
Edges: kind ∈ {PART_OF, NEXT_CHUNK, RELATION, MENTIONED_IN, SYNONYM}, all with `weight`.
  RELATION edges also carry key (relation id) and rel_type (the schema relation type; None when untyped); None
  elsewhere.
The graph is built in bulk (Graph(n, edges) then whole attribute lists), which is what lets a million
mentions resolve in seconds. The pickle holds structure only: chunk text, descriptions, source ids, predicates
and keywords stay in the JSONL records beside it (export joins them in by key), since a copy of every
description in the pickle would be a large part of the graph folder and no walk reads them.
"""

from __future__ import annotations

import bisect
import operator
import pickle
import zipfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import islice, repeat
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from hrag_cli.core import artifacts
from hrag_cli.graph import csr
from hrag_cli.graph import pickle_format as graph_pickle
from hrag_cli.core import store
from hrag_cli.core.errors import HragError
from hrag_cli.graph.pickle_format import Column, GraphColumns, ListJSON
from hrag_cli.core.project import ProjectDir
from hrag_cli.core.records import ChunkRef, Document, Entity, Relation, Synonym
from hrag_cli.core.stage_list import STAGES

DOCUMENT, CHUNK, ENTITY = "document", "chunk", "entity"
PART_OF, NEXT_CHUNK, RELATION, MENTIONED_IN, SYNONYM = "PART_OF", "NEXT_CHUNK", "RELATION", "MENTIONED_IN", "SYNONYM"
EDGE_KINDS = (PART_OF, NEXT_CHUNK, RELATION, MENTIONED_IN, SYNONYM)


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
    """The igraph graph of `graph_columns` (for callers that walk or export a graph in memory)."""
    return graph_columns(docs, chunks, entities, relations, mentions).to_igraph()


@dataclass
class _Structure:
    """The documents and chunks of a graph: its first vertices, and the PART_OF and NEXT_CHUNK edges."""

    keys: list[str]
    paths: list[str]                    # per document
    chunk_docs: list[str]               # per chunk vertex
    chunk_orders: list[int]
    pairs: np.ndarray                   # (PART_OF + NEXT_CHUNK, 2)
    n_part: int
    n_next: int


def _unique_pairs(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """The distinct (a, b) rows, sorted (as `sorted(set(zip(a, b)))`), as a (k, 2) array; every value < n."""
    code = np.unique(a * max(n, 1) + b)
    return np.stack([code // max(n, 1), code % max(n, 1)], axis=1)


def _structure(docs: list[Document], chunks: list[ChunkRef]) -> _Structure:
    """Sorted by key getters and paired by array work, not a loop per chunk."""
    docs = sorted(docs, key=attrgetter("doc_id"))
    chunks = sorted(chunks, key=attrgetter("doc_id", "order", "chunk_id"))
    chunk_ids = [c.chunk_id for c in chunks]
    first = dict(zip(reversed(chunk_ids), range(len(chunks) - 1, -1, -1)))   # chunk_id -> its first place
    uchunks = chunks if len(first) == len(chunks) else [chunks[i] for i in sorted(first.values())]
    keys = [d.doc_id for d in docs] + [c.chunk_id for c in uchunks]
    index = dict(zip(keys, range(len(keys))))
    n = len(keys)
    doc_ids = [c.doc_id for c in chunks]
    d = np.fromiter(map(index.get, doc_ids, repeat(-1)), dtype=np.int64, count=len(chunks))
    c = np.fromiter(map(index.__getitem__, chunk_ids), dtype=np.int64, count=len(chunks))
    has_doc = d >= 0
    part_of = _unique_pairs(d[has_doc], c[has_doc], n)
    # consecutive chunks of one document (sorted by doc_id, order), an unordered pair each
    same = np.fromiter(map(str.__eq__, doc_ids[1:], doc_ids[:-1]), dtype=bool, count=max(len(chunks) - 1, 0))
    step = np.flatnonzero(same & (c[1:] != c[:-1]))
    a, b = c[step], c[step + 1]
    nxt = _unique_pairs(np.minimum(a, b), np.maximum(a, b), n)
    pairs = np.concatenate([part_of, nxt]).astype(np.int64).reshape(-1, 2)
    return _Structure(keys, [d.path for d in docs], [c.doc_id for c in uchunks], [c.order for c in uchunks], pairs,
                      len(part_of), len(nxt))


def _padded(values: list | Column, before: int, after: int = 0) -> Column:
    """Column.of(None x before + values + None x after), None coded 0, without walking the padding (`values`
    may come coded so already)."""
    c = values if isinstance(values, Column) else Column.of(values, (None,))
    return c.recoded(np.concatenate([np.zeros(before, np.int32), c.codes, np.zeros(after, np.int32)]))


def _assemble(st: _Structure, ent_ids: list[str] | Column, names: list | Column, types: list | Column,
              aliases: list | ListJSON, rel_ends: np.ndarray, rel_weight: np.ndarray, rel_ids: list[str] | Column,
              rel_types: list | Column, men_ends: np.ndarray, men_weight: np.ndarray) -> GraphColumns:
    """The columns of a graph from its parts, entity and relation lists in id order (vertex numbers in the
    ends: documents and chunks as in `st`, then the entities; `rel_ids` may come as a vocabulary, [None] + the
    ids). A build that makes the columns itself (resolve/graph_build.py) gives `ent_ids` as the key column of
    every vertex and `aliases` as every vertex's ListJSON."""
    nd = len(st.paths)
    nc, n_rel = len(st.keys) - nd, len(rel_weight)
    ne = len(ent_ids.codes) - len(st.keys) if isinstance(ent_ids, Column) else len(ent_ids)
    n = nd + nc + ne
    edges = np.concatenate([st.pairs, rel_ends.reshape(-1, 2), men_ends.reshape(-1, 2)]).astype(np.int64, copy=False)
    n_struct = len(st.pairs)
    weight = np.concatenate([np.ones(n_struct), rel_weight, men_weight]).astype(np.float64, copy=False)
    kind = np.repeat(np.arange(4, dtype=np.int32), [st.n_part, st.n_next, n_rel, len(men_weight)])
    vattrs: dict[str, Column | list] = {
        "kind": Column(list(VERTEX_KINDS), np.repeat(np.arange(3, dtype=np.int32), [nd, nc, ne])),
        "key": ent_ids if isinstance(ent_ids, Column) else Column(st.keys + ent_ids, np.arange(n, dtype=np.int32)),
        "path": _padded(st.paths, 0, nc + ne),
        "doc_id": _padded(st.chunk_docs, nd, ne),
        "order": _padded(st.chunk_orders, nd, ne),
        "name": _padded(names, nd + nc),
        "type": _padded(types, nd + nc),
        "aliases": aliases if isinstance(aliases, ListJSON) else [None] * (nd + nc) + aliases,
    }
    m = len(edges)
    key_codes = np.zeros(m, dtype=np.int32)
    key_codes[n_struct:n_struct + n_rel] = np.arange(1, n_rel + 1, dtype=np.int32)
    rel_type = _padded(rel_types, n_struct, m - n_struct - n_rel)
    ids = rel_ids if isinstance(rel_ids, Column) else Column([None, *rel_ids], None)
    eattrs = {"kind": Column(list(EDGE_KINDS), kind), "key": ids.recoded(key_codes), "rel_type": rel_type}
    return GraphColumns(n, edges, weight, vattrs, eattrs, split=m)


def graph_columns(docs: list[Document], chunks: list[ChunkRef], entities: list[Entity] | list[GraphEntity],
                  relations: list[Relation] | list[GraphRelation],
                  mentions: Iterable[tuple[str, str, int]]) -> GraphColumns:
    """Vertices: documents (sorted by doc_id), chunks (by doc_id, order; one vertex per chunk_id even when
    the same text occurs in two documents), entities (sorted by id). `mentions` = (chunk_id, entity_id, count).
    Edges in the order PART_OF, NEXT_CHUNK, RELATION, MENTIONED_IN, so equal inputs give equal graphs."""
    st = _structure(docs, chunks)
    ent_ids = [e.id for e in entities]
    index = {k: i for i, k in enumerate(st.keys + ent_ids)}
    n_rel = len(relations)
    rel_ends = np.fromiter((index[k] for r in relations for k in (r.src, r.tgt)), dtype=np.int64, count=2 * n_rel)
    men_ends: list[int] = []
    men_weight: list[float] = []
    for chunk_id, entity_id, count in mentions:
        men_ends += (index[chunk_id], index[entity_id])
        men_weight.append(float(count))
    return _assemble(st, ent_ids, [e.name for e in entities], [e.type for e in entities],
                     [list(e.aliases) for e in entities], rel_ends,
                     np.fromiter((float(r.weight) for r in relations), dtype=np.float64, count=n_rel),
                     [r.id for r in relations], [r.rel_type or None for r in relations],
                     np.asarray(men_ends, dtype=np.int64), np.asarray(men_weight, dtype=np.float64))


def key_index(graph: Any) -> dict[str, int]:
    """vertex key -> vertex index (rebuilt on every load; never stored)."""
    return {k: i for i, k in enumerate(graph.vs["key"])} if graph.vcount() else {}


def save_graph(project: ProjectDir, graph: Any, keys: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
               ) -> None:
    """graph/graph.pkl (`graph_pickle`: arrays a pickle turns back into the igraph graph, no zlib over the whole),
    then graph/walk.npz, the arrays a query walks. `graph`: GraphColumns or an igraph graph; `keys`: as
    `walk_arrays` takes them."""
    cols = graph if isinstance(graph, GraphColumns) else GraphColumns.of_igraph(graph)
    with store.atomic_writer(project.graph_path) as fh:
        graph_pickle.dump(cols, fh)
    # walk.npz's arrays made one at a time as they are written: a large graph holds one of them beside its
    # columns, not all (the rows' placement is then made once per array)
    n = cols.n
    kind = _codes_in(cols.eattrs["kind"], EDGE_KINDS) if cols.m else np.zeros(0, np.uint8)
    indptr = csr.row_starts(n, cols.edges)
    made = csr.adjacency_columns(cols.edges, cols.weight, kind, indptr)
    if keys is None:
        key = cols.vattrs["key"] if n else Column([], np.zeros(0, np.int32))
        keys = csr.key_arrays([k.encode("utf-8") for k in key.values()])
    vkind = _codes_in(cols.vattrs["kind"], VERTEX_KINDS) if n else np.zeros(0, np.uint8)
    _write_walk(project, dict(zip(WALK_ARRAYS, (lambda: indptr, *made, lambda: vkind, lambda: keys[0],
                                                lambda: keys[1], lambda: keys[2]))))


VERTEX_KINDS = (DOCUMENT, CHUNK, ENTITY)    # walk.npz's vertex kind codes (layout: walk.py)


def _codes_in(col: Column, names: tuple[str, ...]) -> np.ndarray:
    """A column's values as their index in `names` (uint8)."""
    lut = np.array([names.index(v) for v in col.vocab] or [0], dtype=np.uint8)
    return lut[col.codes]


def walk_arrays(graph: Any, keys: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The arrays of the layout above from the graph's columns (or an igraph graph: undirected, every edge
    with kind and weight). `keys`: the keys, koff and order arrays when the caller made them (a build that
    never held its keys as a list: csr.SortedKeys)."""
    cols = graph if isinstance(graph, GraphColumns) else GraphColumns.of_igraph(graph)
    n = cols.n
    kind = _codes_in(cols.eattrs["kind"], EDGE_KINDS) if cols.m else np.zeros(0, np.uint8)
    indptr, other, weight, kind = csr.adjacency(n, cols.edges, cols.weight, kind)
    if keys is None:
        key = cols.vattrs["key"] if n else Column([], np.zeros(0, np.int32))
        keys = csr.key_arrays([k.encode("utf-8") for k in key.values()])
    return {
        "indptr": indptr,
        "cols": other,
        "weight": weight,
        "kind": kind,
        "vkind": _codes_in(cols.vattrs["kind"], VERTEX_KINDS) if n else np.zeros(0, np.uint8),
        "keys": keys[0],
        "koff": keys[1],
        "order": keys[2],
    }


def save_walk(project: ProjectDir, graph: Any) -> None:
    """Write graph/walk.npz for `graph` (atomically: temp file, then rename)."""
    _write_walk(project, walk_arrays(graph))


def _write_walk(project: ProjectDir, arrays: dict[str, np.ndarray | Callable[[], np.ndarray]]) -> None:
    """walk.npz as np.savez writes it (the same bytes), each array made when its turn comes when it is given as
    a function that makes it (and let go once written)."""
    with store.atomic_writer(project.walk_path) as fh, \
            zipfile.ZipFile(fh, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in arrays.items():
            array = np.asanyarray(value() if callable(value) else value)
            with zf.open(name + ".npy", "w", force_zip64=True) as out:
                np.lib.format.write_array(out, array, allow_pickle=True, pickle_kwargs=None)
            del array


def _unpickle(project: ProjectDir, data: bytes) -> Any:
    try:
        return pickle.loads(data if data[:1] == b"\x80" else zlib.decompress(data))
    except Exception as exc:  # a damaged pickle can raise nearly anything
        raise HragError(f"{project.graph_path} is damaged ({type(exc).__name__}); run 'hrag resolve' to rebuild it") from None


def _graph_bytes(project: ProjectDir) -> bytes:
    try:
        return project.graph_path.read_bytes()
    except FileNotFoundError:
        raise HragError(f"no graph in {project.root} yet: run 'hrag index DOCS' (or 'hrag resolve')") from None


def load_graph(project: ProjectDir) -> tuple[Any, dict[str, int]]:
    """THE loader every later stage uses: the graph and its key -> vertex index map. Reads the compressed
    pickle and a plain one (a pickle starts with 0x80, a zlib stream never does)."""
    graph = _unpickle(project, _graph_bytes(project))
    return graph, key_index(graph)


def load_columns(project: ProjectDir) -> GraphColumns:
    """The saved graph as columns, without making the igraph graph (igraph's own pickle: made, then taken
    apart)."""
    data = _graph_bytes(project)
    if data[:1] != b"\x80":        # zlib: igraph's own pickle
        return GraphColumns.of_igraph(_unpickle(project, data))
    try:
        return graph_pickle.loads(data)
    except graph_pickle.NotColumns:
        return GraphColumns.of_igraph(_unpickle(project, data))
    except Exception as exc:  # a damaged pickle can raise nearly anything
        raise HragError(f"{project.graph_path} is damaged ({type(exc).__name__}); run 'hrag resolve' to rebuild it") from None


def edge_counts(graph: Any) -> dict[str, int]:
    """Edges per kind, every kind present (0 when none)."""
    cols = graph.eattrs["kind"] if isinstance(graph, GraphColumns) else Column.of(graph.es["kind"]) \
        if graph.ecount() else Column([], np.zeros(0, np.int32))
    per_code = np.bincount(cols.codes, minlength=len(cols.vocab))
    counts = dict.fromkeys(EDGE_KINDS, 0)
    for k, c in zip(cols.vocab, per_code.tolist()):
        counts[k] = counts.get(k, 0) + c
    return counts


def _pair_columns(pairs: Iterable[Synonym | tuple[str, str, float] | dict]) -> tuple[list, list, list]:
    """The names a, b and the similarities of `pairs`; records as read from synonyms.jsonl (dicts) by C loops."""
    rows = pairs if isinstance(pairs, list) else list(pairs)
    if set(map(type, rows)) <= {dict}:      # (a C loop: no generator per record)
        return [list(map(itemgetter(k), rows)) for k in ("a", "b", "similarity")]   # type: ignore[return-value]
    rows = [(p.a, p.b, p.similarity) if isinstance(p, Synonym) else (p["a"], p["b"], p["similarity"])
            if isinstance(p, dict) else tuple(p) for p in rows]
    return [[r[i] for r in rows] for i in range(3)]     # type: ignore[return-value]


def column_keys(key: Column, n: int) -> list[str]:
    """The vertex keys of a graph's `key` column (its vocabulary as it is when a build coded it so)."""
    in_order = len(key.codes) == n and np.array_equal(key.codes, np.arange(n))
    return key.vocab[:n] if in_order and len(key.vocab) == n else key.values()


def _key_finder(keys: list[str], kinds: np.ndarray) -> Callable[[list[str]], np.ndarray]:
    """names -> their vertices (-1: no such key), `kinds` the vertices' VERTEX_KINDS codes. The entities (the
    last vertices, in key order when a build made the graph) are found by bisection, which hashes no key (a
    dict of every key of a large graph is slow to make); other names by a dict of the other keys."""
    others = np.flatnonzero(kinds != VERTEX_KINDS.index(ENTITY))
    ent0 = int(others[-1]) + 1 if len(others) else 0
    ents = keys[ent0:]
    if not all(map(operator.lt, ents, islice(ents, 1, None))):
        ent0, ents = len(keys), []
    rest: dict[str, int] = {}

    def find(names: list[str]) -> np.ndarray:
        k = len(names)
        at = np.fromiter(map(bisect.bisect_left, repeat(ents), names), dtype=np.int64, count=k)
        got = map(ents.__getitem__, np.minimum(at, len(ents) - 1).tolist()) if ents else repeat(None)
        out = np.where(np.fromiter(map(operator.eq, got, names), dtype=bool, count=k), ent0 + at, -1)
        miss = np.flatnonzero(out < 0)
        if len(miss) and ent0:
            if not rest:
                rest.update(zip(keys[:ent0], range(ent0)))
            out[miss] = np.fromiter(map(rest.get, map(names.__getitem__, miss.tolist()), repeat(-1)),
                                    dtype=np.int64, count=len(miss))
        return out
    return find


def _synonym_edges(find: Callable[[list[str]], np.ndarray],
                   pairs: Iterable[Synonym | tuple[str, str, float] | dict]) -> tuple[np.ndarray, np.ndarray]:
    """The SYNONYM edges of `pairs` (entity keys a, b and a cosine similarity as weight) as (k, 2) vertex
    pairs, smaller first, and their weights (`find`: `_key_finder`'s). Pairs naming an unknown key, a
    self-pair, or a repeat of an unordered pair are skipped."""
    names_a, names_b, sims = _pair_columns(pairs)
    k = len(sims)
    a, b = find(names_a), find(names_b)
    sim = np.fromiter(map(float, sims), dtype=np.float64, count=k)
    ok = np.flatnonzero((a >= 0) & (b >= 0) & (a != b))
    ends = np.sort(np.stack([a[ok], b[ok]], axis=1), axis=1) if len(ok) else np.zeros((0, 2), np.int64)
    _, first = np.unique(ends[:, 0] * (int(ends.max(initial=0)) + 1) + ends[:, 1], return_index=True)
    first.sort()                                    # the first of each unordered pair, in the order given
    return ends[first], sim[ok][first]


def add_synonym_edges(graph: Any, pairs: Iterable[Synonym | tuple[str, str, float] | dict]) -> Any:
    """Replace every SYNONYM edge with `pairs` (as `_synonym_edges` reads them). Returns the same graph,
    changed in place."""
    old = [e.index for e in graph.es.select(kind_eq=SYNONYM)] if graph.ecount() else []
    if old:
        graph.delete_edges(old)
    kinds = _codes_in(Column.of(graph.vs["kind"]), VERTEX_KINDS) if graph.vcount() else np.zeros(0, np.uint8)
    new_edges, sims = _synonym_edges(_key_finder(graph.vs["key"] if graph.vcount() else [], kinds), pairs)
    if len(new_edges):
        none = [None] * len(new_edges)
        graph.add_edges(new_edges.tolist(), attributes={"kind": [SYNONYM] * len(new_edges), "weight": sims.tolist(),
                                                        "key": none, "rel_type": none})
    return graph


def set_synonym_edges(cols: GraphColumns, pairs: Iterable[Synonym | tuple[str, str, float] | dict]) -> GraphColumns:
    """`add_synonym_edges` on columns: every SYNONYM edge dropped, those of `pairs` appended after the rest."""
    kind = cols.eattrs["kind"]
    keep = np.flatnonzero(kind.codes != kind.vocab.index(SYNONYM)) if SYNONYM in kind.vocab else None
    if keep is not None and len(keep) < cols.m:
        cols = GraphColumns(cols.n, cols.edges[keep], cols.weight[keep], cols.vattrs,
                            {k: c.take(keep) for k, c in cols.eattrs.items()}, cols.packed)
    cols.split = cols.m
    kinds = _codes_in(cols.vattrs["kind"], VERTEX_KINDS) if cols.n else np.zeros(0, np.uint8)
    new_edges, sims = _synonym_edges(_key_finder(column_keys(cols.vattrs["key"], cols.n) if cols.n else [], kinds),
                                     pairs)
    if not len(new_edges):
        return cols
    k = len(new_edges)
    tail = {"kind": Column([SYNONYM], np.zeros(k, np.int32)), "key": Column([None], np.zeros(k, np.int32)),
            "rel_type": Column([None], np.zeros(k, np.int32))}
    return GraphColumns(cols.n, np.concatenate([cols.edges, new_edges]), np.concatenate([cols.weight, sims]), cols.vattrs,
                        {name: c.concat(tail[name]) for name, c in cols.eattrs.items()}, cols.packed, cols.split)


def intact(project: ProjectDir, rel: str) -> bool:
    """`rel` (graph/graph.pkl, graph/walk.npz) of the current generation is the file the last commit recorded,
    by its full hash (CRC-32 of the whole file up to artifacts.FULL_HASH_MAX, cheap beside the stage; a dense sample
    above): a stage that makes the new file from the saved one copies most of it, and damage must not pass into
    the new file (which the commit then vouches for)."""
    try:
        stages = project.manifest()["stages"]
    except HragError:
        return False
    metas = [((stages.get(name) or {}).get("artifacts") or {}).get(rel)
             for name in reversed(STAGES)]    # the later stage's record wins, as project.check has it
    meta = next((m for m in metas if isinstance(m, dict)), None)
    return meta is not None and artifacts.check_one(project.gen_dir / rel, meta, True) == ""


def save_synonym_edges(project: ProjectDir, pairs: Iterable[Synonym | tuple[str, str, float] | dict]) -> None:
    """The saved graph with its SYNONYM edges replaced by `pairs`, saved (graph.pkl and walk.npz; the walk
    arrays from the saved ones when they fit and are intact, which is the same arrays for a fraction of the
    work). graph.pkl's other members are written back as they were, never inflated, when the whole file is
    the one the last commit recorded, by its whole hash (`_tail_replaced`; a file past artifacts.FULL_HASH_MAX
    has only a sampled hash, so it takes the whole load); otherwise it is loaded whole, which checks every
    member: the same bytes either way."""
    pairs = pairs if isinstance(pairs, list) else list(pairs)      # the whole load may read them after the tail
    intact_walk = intact(project, "graph/walk.npz")
    # intact first: a missing file is left to load_columns' one-line error
    whole_hash = intact(project, "graph/graph.pkl") and project.graph_path.stat().st_size <= artifacts.FULL_HASH_MAX
    got = _tail_replaced(project, pairs) if whole_hash else None
    cols = None
    if got is None:
        cols = set_synonym_edges(load_columns(project), pairs)
        got = (graph_pickle.dumps(cols), cols.n, cols.edges[:cols.split], cols.edges[cols.split:],
               cols.weight[cols.split:])
    data, n, own, syn, weight = got
    store.atomic_write_bytes(project.graph_path, data)
    arrays = _walk_with_synonyms(project, n, own, syn, weight) if intact_walk else None
    _write_walk(project, arrays if arrays is not None else walk_arrays(cols or load_columns(project)))


def _tail_replaced(project: ProjectDir, pairs: Iterable[Synonym | tuple[str, str, float] | dict]
                   ) -> tuple[bytes, int, np.ndarray, np.ndarray, np.ndarray] | None:
    """graph.pkl's new bytes, made from the saved file by `graph_pickle.SynonymTail` (only the vertex kinds and
    keys and the other edges inflated), its vertex count, other edges, and the new SYNONYM edges and weights;
    None when the file is not of that shape or its other edges include SYNONYM ones."""
    try:
        tail = graph_pickle.SynonymTail(_graph_bytes(project))
        kind = tail.head_codes("kind")
        syn_code = kind.code(SYNONYM)
        key, vkind = tail.vertex("key"), tail.vertex("kind")
        if (syn_code is not None and (kind.codes == syn_code).any()) or not isinstance(key, Column) or \
                not isinstance(vkind, Column):
            return None
        edges, sims = _synonym_edges(_key_finder(column_keys(key, tail.n), _codes_in(vkind, VERTEX_KINDS)), pairs)
        return (tail.dumps(edges, sims, {"kind": SYNONYM, "key": None, "rel_type": None}), tail.n,
                tail.head_edges(), edges, sims)
    except (graph_pickle.NotColumns, zlib.error, ValueError):
        return None


WALK_ARRAYS = ("indptr", "cols", "weight", "kind", "vkind", "keys", "koff", "order")


def saved_walk(project: ProjectDir) -> dict[str, np.ndarray] | None:
    """The arrays of the saved walk.npz; None when it is missing or unreadable (the caller makes them from the
    columns instead)."""
    try:
        with np.load(project.walk_path, allow_pickle=False) as z:
            return {k: z[k] for k in WALK_ARRAYS}
    except Exception:  # missing, or damaged (a damaged zip or array can raise nearly anything)
        return None


def kept_entries(walk: dict[str, np.ndarray], own: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Which entries of saved walk arrays are not SYNONYM ones, and how many each row keeps; None when those are
    not the entries of edges `own` over `n` vertices (the arrays are another graph's)."""
    indptr = walk["indptr"]
    if len(walk["vkind"]) != n or len(indptr) != n + 1 or int(indptr[-1]) != len(walk["cols"]):
        return None
    keep = walk["kind"] != EDGE_KINDS.index(SYNONYM)
    syn_rows = np.searchsorted(indptr, np.flatnonzero(~keep), side="right") - 1
    degree = np.diff(indptr) - np.bincount(syn_rows, minlength=n)
    if not np.array_equal(degree, np.bincount(own.ravel(), minlength=n)):
        return None
    return keep, degree


def _walk_with_synonyms(project: ProjectDir, n: int, own: np.ndarray, syn: np.ndarray, weight: np.ndarray
                        ) -> dict[str, np.ndarray] | None:
    """`walk_arrays` of a graph of `n` vertices, edges `own` then SYNONYM edges `syn` of `weight`, from the
    saved walk.npz: its SYNONYM entries dropped, the new ones put where walk_arrays has them. A row there holds
    the edges of which the vertex is the first end, then those of which it is the second, each in edge order;
    the SYNONYM edges come last, so their entries end each of the two groups. None when the saved arrays are
    missing or not those of `own`."""
    old = saved_walk(project)
    kept = kept_entries(old, own, n) if old is not None else None
    if kept is None:
        return None
    keep, degree = kept
    start = np.concatenate([[0], np.cumsum(degree)])
    first_group = np.bincount(own[:, 0], minlength=n)
    at = np.concatenate([start[syn[:, 0]] + first_group[syn[:, 0]], start[syn[:, 1] + 1]])
    # one place can end one row and open the next: the earlier row's entries first (lexsort is stable)
    order = np.lexsort((np.concatenate([syn[:, 0], syn[:, 1]]), at))
    at = at[order]
    ends = np.concatenate([syn[:, 1], syn[:, 0]])[order]
    out = dict(old)
    # the arrays a resolve saved have no SYNONYM entries: nothing dropped, no copy
    rest = (lambda name: old[name]) if keep.all() else (lambda name: old[name][keep])
    out["cols"] = np.insert(rest("cols"), at, ends.astype(np.int32))
    out["weight"] = np.insert(rest("weight"), at, np.concatenate([weight, weight])[order])
    out["kind"] = np.insert(rest("kind"), at, np.full(len(at), EDGE_KINDS.index(SYNONYM), np.uint8))
    out["indptr"] = np.concatenate([[0], np.cumsum(degree + np.bincount(syn.ravel(), minlength=n))]).astype(np.int64)
    return out
