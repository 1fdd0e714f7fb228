"""The graph after an incremental resolve, from the saved one and what changed (docs/design.md, "The graph").

Why: a resolve that only adds documents changes a few percent of the entities and relations, but building the
graph from every entity and relation record costs a pass over all of them. Here the saved graph's columns are
kept and only the new or changed items are put in, where a build from scratch would have them, so the result
is the graph `graph_columns` would build from all the items (the same columns, so graph.pkl has the same bytes).

What it takes (resolve's patch path; additions only, no record goes away): the documents and chunks added since
the saved graph was made (`chunk.stage.added_since`: the graph holds the old ones, so a small run reads no other line
of docs.jsonl and chunks.jsonl), or every one, the entities and relations added or made again, in id order, and
the mentions of the new chunks. Anything that does not fit the saved graph raises OutOfStep, and the caller
builds the graph from every item instead. walk.npz is spliced the same way from the saved one (`spliced_walk`:
the same arrays `graph.walk_arrays` makes, at array speed, where sorting every entry again would be slow).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter, itemgetter

import numpy as np
import orjson

from hrag_cli.graph import pickle_format as graph_pickle
from hrag_cli.core import store
from hrag_cli.core.errors import HragError
from hrag_cli.graph.model import (
    CHUNK, DOCUMENT, EDGE_KINDS, ENTITY, SYNONYM, VERTEX_KINDS, GraphEntity, GraphRelation, _assemble, _codes_in,
    _padded, _structure, _write_walk, column_keys, edge_counts, intact, kept_entries, load_columns, saved_walk,
    walk_arrays)
from hrag_cli.graph.pickle_format import Column, GraphColumns
from hrag_cli.chunk.stage import added_since, load_chunk_refs, load_documents
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir
from hrag_cli.core.records import ChunkRef, Document

_REL, _MEN, _SYN = EDGE_KINDS.index("RELATION"), EDGE_KINDS.index("MENTIONED_IN"), EDGE_KINDS.index(SYNONYM)


class OutOfStep(ValueError):
    """The saved graph is not the one the changes apply to."""


def _spliced(old: list, at: np.ndarray, new: list) -> list:
    """`old` with new[j] inserted before old[at[j]] (`at` non-decreasing; equal places keep new's order)."""
    out: list = []
    prev = 0
    for a, item in zip(at.tolist(), new):
        out += old[prev:a]
        out.append(item)
        prev = a
    out += old[prev:]
    return out


class _Coded:
    """A column's rows (or those of `rows`), to change and insert into by value while staying codes; `column`
    then gives them coded as Column.of(values, (None,)) would."""

    def __init__(self, col: Column, rows: np.ndarray | None = None) -> None:
        self.vocab = list(col.vocab)
        self.index = dict(zip(self.vocab, range(len(self.vocab))))
        self.codes = col.codes[rows] if rows is not None else col.codes.copy()

    def _code(self, value: object) -> int:
        code = self.index.get(value)
        if code is None:
            code = self.index[value] = len(self.vocab)
            self.vocab.append(value)
        return code

    def _codes(self, values: list) -> list[int]:
        """The codes of `values` (looked up in a C loop; a value not seen yet coded in the order given)."""
        codes = list(map(self.index.get, values))
        return [self._code(v) if c is None else c for v, c in zip(values, codes)] if None in codes else codes

    def set(self, rows: np.ndarray, values: list) -> None:
        """Row rows[i] := values[i]."""
        self.codes[rows] = self._codes(values)

    def insert(self, at: np.ndarray, values: list) -> None:
        """values[j] put before row at[j]."""
        if len(values):
            self.codes = np.insert(self.codes, at, np.asarray(self._codes(values), dtype=np.int32))

    def column(self) -> Column:
        if not len(self.codes):
            return Column([None], self.codes)
        uniq, first = np.unique(self.codes, return_index=True)
        seen = uniq[np.argsort(first)]
        none = self.index.get(None)
        seen = seen[seen != none] if none is not None else seen
        remap = np.zeros(len(self.vocab), dtype=np.int32)
        remap[seen] = np.arange(1, len(seen) + 1, dtype=np.int32)
        return Column([None] + [self.vocab[i] for i in seen.tolist()], remap[self.codes])


def _inserted(old: np.ndarray, at: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`old` with new[j] put before old[at[j]] (equal places keep new's order), and where each new row went."""
    if not len(new):
        return old, np.zeros(0, np.int64)
    order = np.argsort(at, kind="stable")
    placed = np.empty(len(at), dtype=np.int64)
    placed[order] = at[order] + np.arange(len(at))
    return np.insert(old, at, new, axis=0), placed


def _shifted(rows: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Where old rows `rows` are once rows were inserted before old[at] (`at` any order)."""
    return rows + np.searchsorted(np.sort(at), rows, side="right")


@dataclass
class Splice:
    """How the updated graph's vertices and edges lie against the saved graph's (walk.npz is spliced from it)."""

    at: np.ndarray          # the added vertices went before these old vertices (sorted)
    remap: np.ndarray       # old vertex -> its vertex in the updated graph
    added: np.ndarray       # the updated graph's edges that are new
    reweighed: np.ndarray   # the updated graph's edges that were there and may weigh otherwise now
    old: GraphColumns       # the saved graph


def _entity_vertices(ent_ids: list[str], n_dc: int) -> Callable[[list[str]], np.ndarray]:
    """eids -> their entity vertices (entities numbered from `n_dc` in id order); bisect and compare in C loops:
    one Python call per list, not per id."""
    def vertices(eids: list[str]) -> np.ndarray:
        at = list(map(bisect.bisect_left, repeat(ent_ids), eids))
        last = len(ent_ids) - 1
        got = list(map(ent_ids.__getitem__, map(min, at, repeat(last)))) if ent_ids else []
        if got != eids:
            bad = next((e for e, g in zip(eids, got + [None] * len(eids)) if e != g), None)
            raise OutOfStep(f"relation or mention names an unknown entity {bad!r}")
        return n_dc + np.asarray(at, dtype=np.int64)
    return vertices


def _entity_rows(old: GraphColumns, ent0: int, keys: list, entities: list[GraphEntity]
                 ) -> tuple[list[str], np.ndarray, list[GraphEntity]]:
    """The entity ids after the update (the old ones with the new put in, in id order), where the added ones
    go among the old (places from 0 = the first old entity), and the added entities."""
    old_ents = keys[ent0:]
    ent_rows = {e.id: bisect.bisect_left(old_ents, e.id) for e in entities}
    added = [e for e in entities if not (ent_rows[e.id] < len(old_ents) and old_ents[ent_rows[e.id]] == e.id)]
    at = np.asarray([ent_rows[e.id] for e in added], dtype=np.int64)
    return (_spliced(old_ents, at, [e.id for e in added]) if added else old_ents), at, added


def _spliced_json(raw: bytes, count: int, put: list[tuple[int, str]], at: np.ndarray, new: list[str]) -> bytes | None:
    """orjson.dumps([None, *ids]) for the ids of `raw` (that JSON of `count` ids) with id p := s for each (p, s)
    in `put` and new[j] put before id at[j] (`at` non-decreasing), made by cutting and joining `raw`'s bytes:
    no id is parsed, spliced as a list and dumped again (millions of relation ids in a large graph). None
    unless every id in `raw` is a JSON string without escapes (then each `"` opens or closes one)."""
    if not raw.startswith(b"[null") or b"\\" in raw:
        return None
    quotes = np.flatnonzero(np.frombuffer(raw, dtype=np.uint8) == 0x22)
    starts, ends = quotes[0::2], quotes[1::2] + 1               # id i is raw[starts[i]:ends[i]]
    if len(quotes) != 2 * count or not raw.endswith(b"]") or (count and not (
            starts[0] == 6 and ends[-1] == len(raw) - 1 and (starts[1:] - ends[:-1] == 1).all())) or \
            (not count and raw != b"[null]"):
        return None
    edits = [(int(starts[a]), 0, int(starts[a]), orjson.dumps(s) + b",") if a < count else
             (len(raw) - 1, 0, len(raw) - 1, b"," + orjson.dumps(s)) for a, s in zip(at.tolist(), new)]
    edits += [(int(starts[p]), 1, int(ends[p]), orjson.dumps(s)) for p, s in put]
    edits.sort(key=itemgetter(0, 1))                            # stable: inserts at one place keep their order
    out, done = [], 0
    for cut, _, resume, text in edits:
        out += (raw[done:cut], text)
        done = resume
    out.append(raw[done:])
    return b"".join(out)


def _relations(old: GraphColumns, ek: np.ndarray, remap: np.ndarray, n: int,
               vertices: Callable[[list[str]], np.ndarray], relations: list[GraphRelation]
               ) -> tuple[np.ndarray, np.ndarray, Column, Column, np.ndarray, np.ndarray]:
    """The relation edges after the update, in (src, tgt) order, which is the order of their end vertices
    (entities are numbered in id order): ends, weights, ids (a vocabulary, [None] + the ids in edge order),
    types; and the places of the new ones and of those made again among them."""
    rel = np.flatnonzero(ek == _REL)
    r_ends = remap[old.edges[rel]]
    r_weight = old.weight[rel].copy()
    key = old.eattrs["key"]
    in_order = len(rel) == 0 or (key.code(None) == 0 and np.array_equal(key.codes[rel], np.arange(1, len(rel) + 1)))
    r_types = _Coded(old.eattrs["rel_type"], rel)
    r_order = r_ends[:, 0] * n + r_ends[:, 1]
    if len(r_order) and not (np.diff(r_order) > 0).all():
        raise OutOfStep("relation edges are not in id order")
    ends = np.stack([vertices([r.src for r in relations]), vertices([r.tgt for r in relations])], axis=1) \
        .reshape(-1, 2)
    order = ends[:, 0] * n + ends[:, 1]
    pos = np.searchsorted(r_order, order)
    found = (pos < len(r_order)) & (r_order[np.minimum(pos, max(len(r_order) - 1, 0))] == order) if len(r_order) \
        else np.zeros(len(order), dtype=bool)
    again = np.flatnonzero(found)
    made = [relations[j] for j in again.tolist()]
    r_weight[pos[again]] = [float(r.weight) for r in made]
    r_types.set(pos[again], [r.rel_type or None for r in made])
    new_r = np.flatnonzero(~found)
    at_r = pos[new_r]
    r_ends, placed = _inserted(r_ends, at_r, ends[new_r])
    r_weight = _inserted(r_weight, at_r, np.asarray([float(relations[j].weight) for j in new_r.tolist()]))[0]
    by = np.argsort(at_r, kind="stable")
    put, new_ids = list(zip(pos[again].tolist(), (r.id for r in made))), [relations[j].id for j in new_r[by].tolist()]
    # a build's vocabulary holds the ids in edge order: spliced as JSON when it is plain, else as a list
    spliced = _spliced_json(key.vocab_json(), len(rel), put, at_r[by], new_ids) if in_order else None
    if spliced is not None:
        r_ids = Column(None, None, spliced)
    else:
        ids = key.vocab[1:len(rel) + 1] if in_order else key.take(rel).values()
        for p, rid in put:
            ids[p] = rid
        r_ids = Column([None, *_spliced(ids, at_r[by], new_ids)], None)
    r_types.insert(at_r, [relations[j].rel_type or None for j in new_r.tolist()])
    return r_ends, r_weight, r_ids, r_types.column(), placed, _shifted(pos[again], at_r)


def _mentions(old: GraphColumns, ek: np.ndarray, keys: list, remap: np.ndarray, where: dict[str, int],
              vertices: Callable[[list[str]], np.ndarray], mentions: Iterable[tuple[str, str, int]]
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The MENTIONED_IN edges after the update, in chunk_id order, each chunk's run whole (a new chunk's run
    goes before any run of its chunk_id), their weights, and the places of the new ones. `where`: the chunk
    vertices mentions may name."""
    men = np.flatnonzero(ek == _MEN)
    m_ends = old.edges[men]
    m_weight = old.weight[men]
    starts = np.flatnonzero(np.diff(m_ends[:, 0], prepend=-1)) if len(men) else np.zeros(0, np.int64)
    run_keys = list(map(keys.__getitem__, m_ends[starts, 0].tolist()))
    m_ends = remap[m_ends]
    men_rows = list(mentions)
    chunk_ids = [m[0] for m in men_rows]
    cs = list(map(where.get, chunk_ids))
    if None in cs:
        raise OutOfStep(f"a mention names an unknown chunk {chunk_ids[cs.index(None)]!r}")
    runs = np.fromiter(map(bisect.bisect_left, repeat(run_keys), chunk_ids), dtype=np.int64, count=len(chunk_ids))
    at_m = starts[np.minimum(runs, len(starts) - 1)] if len(starts) else np.zeros(len(runs), np.int64)
    at_m = np.where(runs < len(starts), at_m, len(m_weight)).astype(np.int64)
    new_ends = np.stack([np.asarray(cs, dtype=np.int64), vertices([m[1] for m in men_rows])], axis=1).reshape(-1, 2)
    new_weight = np.fromiter((float(m[2]) for m in men_rows), dtype=np.float64, count=len(men_rows))
    m_ends, placed = _inserted(m_ends, at_m, new_ends)
    return m_ends, _inserted(m_weight, at_m, new_weight)[0], placed


def _kinds(old: GraphColumns) -> tuple[np.ndarray, int, int, list]:
    """The saved graph's edge kind codes, its first chunk and first entity vertex, and its vertex keys; OutOfStep
    unless it is laid out as a build lays a graph out."""
    vk = _codes_in(old.vattrs["kind"], VERTEX_KINDS) if old.n else np.zeros(0, np.uint8)
    if not (np.diff(vk.astype(np.int16)) >= 0).all():
        raise OutOfStep("vertices are not documents, then chunks, then entities")
    ek = _codes_in(old.eattrs["kind"], EDGE_KINDS) if old.m else np.zeros(0, np.uint8)
    if len(ek) and not (np.diff(ek.astype(np.int16)) >= 0).all():
        raise OutOfStep("edges are not in kind order")
    keys = column_keys(old.vattrs["key"], old.n)
    nd0 = int(np.count_nonzero(vk == VERTEX_KINDS.index(DOCUMENT)))
    return ek, nd0, nd0 + int(np.count_nonzero(vk == VERTEX_KINDS.index(CHUNK))), keys


def update_columns(old: GraphColumns, docs: list[Document], chunks: list[ChunkRef], entities: list[GraphEntity],
                   relations: list[GraphRelation], mentions: Iterable[tuple[str, str, int]]) -> GraphColumns:
    """`graph_columns` of every item, from `old` (the graph saved by the last resolve or synonyms run: its
    SYNONYM edges are dropped, as a resolve's graph has none), every document and chunk (their vertices and
    PART_OF/NEXT_CHUNK edges are remade: a document may be renamed, a chunk may move), and the items added
    or made again (see `spliced_columns`, the way of a run that knows which documents and chunks are new)."""
    ek, _nd0, ent0, keys = _kinds(old)
    st = _structure(docs, chunks)
    nd, n_dc = len(st.paths), len(st.keys)
    ent_ids, at, added = _entity_rows(old, ent0, keys, entities)
    where = dict(zip(st.keys, range(len(st.keys))))
    remap = np.empty(old.n, dtype=np.int64)
    try:
        remap[:ent0] = [where[k] for k in keys[:ent0]]
    except KeyError as exc:
        raise OutOfStep(f"document or chunk {exc} went away") from None
    remap[ent0:] = n_dc + np.arange(old.n - ent0) + np.searchsorted(at, np.arange(old.n - ent0), side="right")
    aliases = _spliced(old.vattrs["aliases"][ent0:], at, [None] * len(added))
    names, types = (_Coded(old.vattrs[k], np.arange(ent0, old.n)) for k in ("name", "type"))
    names.insert(at, [None] * len(added))
    types.insert(at, [None] * len(added))
    rows = list(map(bisect.bisect_left, repeat(ent_ids), [e.id for e in entities]))
    names.set(np.asarray(rows, dtype=np.int64), [e.name for e in entities])
    types.set(np.asarray(rows, dtype=np.int64), [e.type for e in entities])
    for i, e in zip(rows, entities):
        aliases[i] = list(e.aliases)
    vertices = _entity_vertices(ent_ids, n_dc)
    r_ends, r_weight, r_ids, r_types, _, _ = _relations(old, ek, remap, n_dc + len(ent_ids), vertices, relations)
    m_ends, m_weight, _ = _mentions(old, ek, keys, remap, {k: v for k, v in where.items() if v >= nd}, vertices,
                                    mentions)
    return _assemble(st, ent_ids, names.column(), types.column(), aliases, r_ends, r_weight, r_ids, r_types,
                     m_ends, m_weight)


def spliced_columns(old: GraphColumns, docs: list[Document], chunks: list[ChunkRef], entities: list[GraphEntity],
                    relations: list[GraphRelation], mentions: Iterable[tuple[str, str, int]]
                    ) -> tuple[GraphColumns, Splice]:
    """`graph_columns` of every item, from `old` and the documents and chunks added since it was made (each
    added chunk in an added document), the entities and relations added or made again, and the new chunks'
    mentions. The old rows stay in their order, the new ones go in where a build would have them: array work
    over the old columns, Python work per added item only. Also how the result lies against `old`."""
    ek, nd0, ent0, keys = _kinds(old)
    old_docs, old_chunks = keys[:nd0], keys[nd0:ent0]
    docs = sorted(docs, key=attrgetter("doc_id"))
    chunks = sorted(chunks, key=attrgetter("doc_id", "order", "chunk_id"))
    doc_ids = [d.doc_id for d in docs]
    doc_at = np.fromiter(map(bisect.bisect_left, repeat(old_docs), doc_ids), dtype=np.int64, count=len(docs))
    if any(a < nd0 and old_docs[a] == d for a, d in zip(doc_at.tolist(), doc_ids)) or \
            not set(old_chunks).isdisjoint(c.chunk_id for c in chunks):
        raise OutOfStep("an added document or chunk is in the graph already")
    if len(set(doc_ids)) < len(docs) or len({c.chunk_id for c in chunks}) < len(chunks):
        raise OutOfStep("added documents or chunks repeat an id")
    if not {c.doc_id for c in chunks} <= set(doc_ids):
        raise OutOfStep("a chunk was added to a document the graph has")
    st = _structure(docs, chunks)        # the added ones alone (their vertices numbered apart)
    old_chunk_docs = old.vattrs["doc_id"].take(np.arange(nd0, ent0)).values()      # sorted, as the chunks are
    chunk_at = nd0 + np.fromiter(map(bisect.bisect_left, repeat(old_chunk_docs), [c.doc_id for c in chunks]),
                                 dtype=np.int64, count=len(chunks))
    ent_ids, ent_at, added = _entity_rows(old, ent0, keys, entities)
    at = np.concatenate([doc_at, chunk_at, ent0 + ent_at]).astype(np.int64)
    remap = _shifted(np.arange(old.n, dtype=np.int64), at)
    placed = at + np.arange(len(at))                # the added vertices' numbers, in the order of `at`
    n, nd, n_dc = old.n + len(at), nd0 + len(docs), ent0 + len(st.keys)

    # vertex columns: the old rows, the new ones put in; the entities given take their values
    nones = [None] * len(at)
    nc = len(st.keys) - len(docs)
    ent_rows = n_dc + np.fromiter(map(bisect.bisect_left, repeat(ent_ids), [e.id for e in entities]),
                                  dtype=np.int64, count=len(entities))      # the vertices of the entities given
    vattrs: dict[str, Column | list] = {
        "kind": Column(list(VERTEX_KINDS), np.repeat(np.arange(3, dtype=np.int32), [nd, n_dc - nd, n - n_dc])),
        "key": Column(_spliced(keys, at, st.keys + [e.id for e in added]), np.arange(n, dtype=np.int32))}
    for name, values in (("path", st.paths + nones[len(docs):]),
                         ("doc_id", nones[:len(docs)] + st.chunk_docs + nones[:len(added)]),
                         ("order", nones[:len(docs)] + st.chunk_orders + nones[:len(added)]),
                         ("name", nones), ("type", nones)):
        col = _Coded(old.vattrs[name])
        col.insert(at, values)
        if name in ("name", "type"):
            col.set(ent_rows, [getattr(e, name) for e in entities])
        vattrs[name] = col.column()
    aliases = _spliced(old.vattrs["aliases"], at, nones)
    for i, e in zip(ent_rows.tolist(), entities):
        aliases[i] = list(e.aliases)
    vattrs["aliases"] = aliases

    # PART_OF and NEXT_CHUNK: the old pairs renumbered, the added documents' put in (pairs sort by their ends)
    new_pairs = placed[st.pairs] if len(st.pairs) else np.zeros((0, 2), np.int64)
    struct, placed_s = [], []
    for k, new in ((0, new_pairs[:st.n_part]), (1, new_pairs[st.n_part:])):
        old_pairs = remap[old.edges[ek == k]].reshape(-1, 2)
        pairs, where = _inserted(old_pairs, np.searchsorted(old_pairs[:, 0] * n + old_pairs[:, 1],
                                                           new[:, 0] * n + new[:, 1]), new)
        placed_s.append(where + sum(map(len, struct)))
        struct.append(pairs)
    vertices = _entity_vertices(ent_ids, n_dc)
    r_ends, r_weight, r_ids, r_types, placed_r, again = _relations(old, ek, remap, n, vertices, relations)
    m_ends, m_weight, placed_m = _mentions(old, ek, keys, remap, dict(zip(st.keys[len(docs):],
                                                                          placed[len(docs):len(docs) + nc].tolist())),
                                           vertices, mentions)
    n_struct, n_rel = len(struct[0]) + len(struct[1]), len(r_weight)
    m = n_struct + n_rel + len(m_weight)
    key_codes = np.zeros(m, dtype=np.int32)
    key_codes[n_struct:n_struct + n_rel] = np.arange(1, n_rel + 1, dtype=np.int32)
    eattrs = {"kind": Column(list(EDGE_KINDS), np.repeat(np.arange(4, dtype=np.int32),
                                                        [len(struct[0]), len(struct[1]), n_rel, len(m_weight)])),
              "key": r_ids.recoded(key_codes), "rel_type": _padded(r_types, n_struct, m - n_struct - n_rel)}
    cols = GraphColumns(n, np.concatenate([*struct, r_ends, m_ends]).astype(np.int64),
                        np.concatenate([np.ones(n_struct), r_weight, m_weight]).astype(np.float64), vattrs, eattrs,
                        old.packed, m)
    added_e = np.concatenate([*placed_s, n_struct + placed_r, n_struct + n_rel + placed_m]).astype(np.int64)
    return cols, Splice(at, remap, added_e, n_struct + again, old)


def _touched(indptr: np.ndarray, keep: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kept entries of CSR rows `rows` (ascending, distinct), one row after another: their places in the
    CSR, their rows, and each one's place among its row's kept entries."""
    lens = indptr[rows + 1] - indptr[rows]
    idx = np.repeat(indptr[rows] - np.cumsum(lens) + lens, lens) + np.arange(int(lens.sum()))
    ok = keep[idx]
    idx, row = idx[ok], np.repeat(rows, lens)[ok]
    first = np.searchsorted(row, row)               # each entry's row's first kept entry among these
    return idx, row, np.arange(len(idx)) - first


def spliced_walk(old_walk: dict[str, np.ndarray], old: GraphColumns, cols: GraphColumns, sp: Splice
                 ) -> dict[str, np.ndarray] | None:
    """`walk_arrays(cols)` from the saved graph's (`old_walk`, of `old`) and how `cols` came from `old`: the old
    entries (their SYNONYM ones dropped) renumbered and kept in their order, the new edges' entries put in. A
    row holds the entries of which its vertex is the first end, then those of the second end, each group in
    edge order, which is kind by kind: PART_OF, NEXT_CHUNK and RELATION edges sorted by their ends, MENTIONED_IN
    by chunk run. So an entry's place sorts by (row, group, kind, the other end or its chunk's run), a key the old
    entries already follow: a new entry goes in by a binary search among the old entries of its row (only the
    rows that take new entries are read entry by entry; the rest is copied). None when the old arrays are not
    those of `old` (the caller makes them from the columns)."""
    n0, n = old.n, cols.n
    indptr = old_walk["indptr"]
    ek = _codes_in(old.eattrs["kind"], EDGE_KINDS) if old.m else np.zeros(0, np.uint8)
    own = old.edges[ek != _SYN]
    kept = kept_entries(old_walk, own, n0)
    if kept is None:
        return None
    keep, degree = kept                                 # degree: kept entries per old row
    first = np.bincount(own[:, 0], minlength=n0)      # a row's entries of which its vertex is the first end
    # the run of each chunk vertex among the updated graph's MENTIONED_IN edges (they come in runs by chunk)
    nk = _codes_in(cols.eattrs["kind"], EDGE_KINDS)
    men = np.flatnonzero(nk == _MEN)
    run_of = np.zeros(n, dtype=np.int64)
    if len(men):
        mc = cols.edges[men, 0]
        starts = np.flatnonzero(np.diff(mc, prepend=-1))
        run_of[mc[starts]] = np.arange(len(starts))
    width = max(n, cols.m, int(degree.max(initial=0))) + 1
    if (2 * 5 * (n + 1)) * width >= 2 ** 62:
        return None

    def sort_key(rows: np.ndarray, group: np.ndarray, kind: np.ndarray, other: np.ndarray, place: np.ndarray
                 ) -> np.ndarray:
        sub = np.where(kind == _MEN, np.where(group == 0, place, run_of[other]), other)
        return ((rows * 2 + group) * 5 + kind) * width + sub

    e, r = sp.added, sp.reweighed
    a, b = cols.edges[e, 0], cols.edges[e, 1]
    ke = nk[e].astype(np.int64)
    new_rows, new_other = np.concatenate([a, b]), np.concatenate([b, a])
    new_group = np.repeat(np.array([0, 1], dtype=np.int64), len(e))
    new_kind = np.concatenate([ke, ke])
    new_key = sort_key(new_rows, new_group, new_kind, new_other, np.concatenate([e, e]))
    by = np.argsort(new_key, kind="stable")
    new_key, new_rows = new_key[by], new_rows[by]
    # the old rows that take new entries or new weights, read entry by entry
    back = np.full(n, -1, dtype=np.int64)
    back[sp.remap] = np.arange(n0)
    rows = np.unique(back[np.concatenate([new_rows, cols.edges[r].ravel()])])
    rows = rows[rows >= 0]
    idx, row, place = _touched(indptr, keep, rows)
    kind = old_walk["kind"][idx].astype(np.int64)
    group = (place >= first[row]).astype(np.int64)
    old_key = sort_key(sp.remap[row], group, kind, sp.remap[old_walk["cols"][idx]], place)
    if len(old_key) and not (np.diff(old_key) > 0).all():
        return None
    kept_start = np.concatenate([[0], np.cumsum(degree)])
    local_start = np.concatenate([[0], np.cumsum(np.bincount(np.searchsorted(rows, row), minlength=len(rows)))])
    # where each new entry goes among the kept old ones: its row's start, plus the old entries of its row before it
    u = np.searchsorted(sp.remap, new_rows)        # its old row, or (an added vertex) the old row after it
    at = kept_start[u]
    old_row = back[new_rows] >= 0
    j = np.searchsorted(rows, u[old_row])
    hit = np.searchsorted(old_key, new_key[old_row])
    if len(old_key) and (old_key[np.minimum(hit, len(old_key) - 1)] == new_key[old_row]).any():
        return None
    at[old_row] += hit - local_start[j]
    weight = old_walk["weight"][keep]
    if len(r):
        ra, rb = cols.edges[r, 0], cols.edges[r, 1]
        rk = nk[r].astype(np.int64)
        for ends, g in (((ra, rb), 0), ((rb, ra), 1)):
            want = sort_key(ends[0], np.full(len(r), g), rk, ends[1], np.zeros(len(r), np.int64))
            found = np.searchsorted(old_key, want)
            if not (found < len(old_key)).all() or not np.array_equal(old_key[found], want):
                return None
            rr = back[ends[0]]
            weight[kept_start[rr] + found - local_start[np.searchsorted(rows, rr)]] = cols.weight[r]
    w2 = np.concatenate([cols.weight[e], cols.weight[e]])[by]
    new_degree = np.zeros(n, dtype=np.int64)
    new_degree[sp.remap] = degree
    out = {
        "indptr": np.concatenate([[0], np.cumsum(new_degree + np.bincount(new_rows, minlength=n))]).astype(np.int64),
        "cols": np.insert(sp.remap.astype(np.int32)[old_walk["cols"][keep]], at, new_other[by].astype(np.int32)),
        "weight": np.insert(weight, at, w2),
        "kind": np.insert(old_walk["kind"][keep], at, new_kind[by].astype(np.uint8)),
        "vkind": np.insert(old_walk["vkind"], sp.at, _codes_in(cols.vattrs["kind"], VERTEX_KINDS)[sp.at +
                                                                                               np.arange(len(sp.at))]),
    }
    out.update(_spliced_keys(old_walk, cols, sp))
    return out


def _spliced_keys(old_walk: dict[str, np.ndarray], cols: GraphColumns, sp: Splice) -> dict[str, np.ndarray]:
    """keys, koff and order with the added vertices' keys put in (their places in the key order by a binary
    search over the old keys, all at once: each step gathers the probed keys as fixed-width byte strings)."""
    placed = sp.at + np.arange(len(sp.at))
    key = cols.vattrs["key"]
    blobs = [key.vocab[c].encode("utf-8") for c in key.codes[placed].tolist()]
    lens = np.fromiter(map(len, blobs), dtype=np.int64, count=len(blobs))
    koff0, keys0, order0 = old_walk["koff"], old_walk["keys"], old_walk["order"]
    keys = np.insert(keys0, np.repeat(koff0[sp.at], lens), np.frombuffer(b"".join(blobs), dtype=np.uint8))
    koff = np.concatenate([[0], np.cumsum(np.insert(np.diff(koff0), sp.at, lens))]).astype(np.int64)
    # where each added key goes in the old key order: a binary search, every added key at once
    width = int(max(lens.max(initial=0), np.diff(koff0).max(initial=0))) + 1
    want = np.array(blobs, dtype=f"S{width}")
    lo, hi = np.zeros(len(blobs), np.int64), np.full(len(blobs), len(order0), np.int64)
    while (lo < hi).any():
        mid = (lo + hi) // 2
        probe = _fixed(keys0, koff0, order0[np.minimum(mid, len(order0) - 1)], width)
        less = (probe < want) & (lo < hi)
        lo = np.where(less, mid + 1, lo)
        hi = np.where(~less & (lo < hi), mid, hi)
    if len(order0) and (_fixed(keys0, koff0, order0[np.minimum(lo, len(order0) - 1)], width) == want).any():
        raise OutOfStep("an added vertex's key is in the graph already")
    by = np.lexsort((want, lo))
    return {"keys": keys, "koff": koff,
            "order": np.insert(sp.remap[order0], lo[by], placed[by]).astype(np.int64)}


def _fixed(keys: np.ndarray, koff: np.ndarray, vs: np.ndarray, width: int) -> np.ndarray:
    """Keys of vertices `vs` as fixed-width byte strings (NUL-padded: they compare as the keys do)."""
    start, lens = koff[vs], koff[vs + 1] - koff[vs]
    grid = np.zeros((len(vs), width), dtype=np.uint8)
    mask = np.arange(width) < lens[:, None]
    grid[mask] = keys[(start[:, None] + np.arange(width))[mask]]
    return grid.view(f"S{width}").ravel()


@dataclass
class GraphInputs:
    """The documents and chunks resolve gives the graph, and the saved graph when it is the one the last run
    recorded: every document and chunk, or (`added_only`) those added since the saved graph was made."""

    docs: list[Document]            # every document, or those added since `old`
    chunks: list[ChunkRef]          # every chunk (what the merge reads records for)
    added: list[ChunkRef]           # the chunks added since `old` (every chunk unless `added_only`)
    old: GraphColumns | None = None
    added_only: bool = False        # `docs` and `added` are what came after `old`: spliced in (`spliced_columns`)
    walk_ok: bool = False           # walk.npz is the one recorded with `old` (`graph.intact`): it may be spliced


def graph_inputs(project: ProjectDir, mark: dict | None) -> GraphInputs:
    """The saved graph (when `mark` is not None: a run that may update it; {} for a last run that left no mark)
    and what was added since `mark` (the `chunk.stage.chunk_mark` of the resolve that made it), when docs.jsonl and
    chunks.jsonl were only appended to since and the graph holds as many documents and chunks as the mark says;
    else every document and chunk, read from their files."""
    old = None
    # graph.pkl's load checks only sampled bytes: its whole hash too, as what it holds goes into the new one
    if mark is not None and intact(project, "graph/graph.pkl"):
        try:
            old = load_columns(project)
        except HragError:
            old = None
    got = added_since(project, mark) if mark and old is not None else None
    if got is not None:
        vk = _codes_in(old.vattrs["kind"], VERTEX_KINDS) if old.n else np.zeros(0, np.uint8)
        nd0 = int(np.count_nonzero(vk == VERTEX_KINDS.index(DOCUMENT)))
        nc0 = int(np.count_nonzero(vk == VERTEX_KINDS.index(CHUNK)))
        if (nd0, nc0) == (mark.get("docs"), mark.get("chunks")):
            rows = np.arange(nd0, nd0 + nc0)
            key = old.vattrs["key"]
            ids = key.take(rows).values()
            refs = list(map(ChunkRef, ids, old.vattrs["doc_id"].take(rows).values(),
                            old.vattrs["order"].take(rows).values()))
            added = [ChunkRef(c.chunk_id, c.doc_id, c.order) for c in got[1]]
            return GraphInputs(got[0], refs + added, added, old, added_only=True,
                               walk_ok=intact(project, "graph/walk.npz"))
    chunks = load_chunk_refs(project)
    return GraphInputs(load_documents(project), chunks, chunks, old)


def every_input(project: ProjectDir, inputs: GraphInputs) -> GraphInputs:
    """`inputs` without the saved graph, for a build from every item: every document and chunk."""
    if inputs.old is None:
        return inputs
    docs = load_documents(project) if inputs.added_only else inputs.docs
    return GraphInputs(docs, inputs.chunks, inputs.chunks)


def updated_graph(project: ProjectDir, inputs: GraphInputs, entities: list[GraphEntity], relations: list[GraphRelation],
                  mentions: list[tuple[str, str, int]], totals: tuple[int, int, int], reporter: Reporter
                  ) -> tuple[GraphColumns, Splice | None] | None:
    """`spliced_columns` on the saved graph (`update_columns` given every document and chunk; `mentions`: the
    new chunks'), checked against `totals` (entities,
    relations, mentions after the merge); None, with one warning, when the saved graph is missing, damaged or
    not the one the changes apply to (the caller then builds it from every item)."""
    try:
        if inputs.old is None:
            raise OutOfStep("it is missing, damaged, or not the file the last run recorded")
        if inputs.added_only:
            cols, splice = spliced_columns(inputs.old, inputs.docs, inputs.added, entities, relations, mentions)
            splice = splice if inputs.walk_ok else None
        else:
            cols, splice = update_columns(inputs.old, inputs.docs, inputs.chunks, entities, relations,
                                          mentions), None
        ec = edge_counts(cols)
        made = (int(np.count_nonzero(cols.vattrs["kind"].codes == VERTEX_KINDS.index(ENTITY))), ec["RELATION"],
                ec["MENTIONED_IN"])
        if made != totals:
            raise OutOfStep(f"it would have {made} entities, relations and mentions, not {totals}")
        return cols, splice
    except (HragError, OutOfStep) as exc:
        reporter.warn(f"{project.graph_path} cannot be updated ({exc}); building the graph from every item")
        return None


def save_updated(project: ProjectDir, cols: GraphColumns, sp: Splice | None) -> None:
    """graph.pkl of `cols`, and walk.npz spliced from the saved one (made from `cols` without a splice: the saved
    one damaged or not the saved graph's)."""
    with store.atomic_writer(project.graph_path) as fh:
        graph_pickle.dump(cols, fh)
    _write_walk(project, _spliced_saved(project, cols, sp) if sp is not None else walk_arrays(cols))


def _spliced_saved(project: ProjectDir, cols: GraphColumns, sp: Splice) -> dict[str, np.ndarray]:
    old_walk = saved_walk(project)
    try:
        arrays = spliced_walk(old_walk, sp.old, cols, sp) if old_walk is not None else None
    except OutOfStep:   # a key repeated: made from the columns instead
        arrays = None
    return arrays if arrays is not None else walk_arrays(cols)
