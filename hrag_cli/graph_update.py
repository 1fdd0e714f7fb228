"""The graph after an incremental resolve, from the saved one and what changed (DESIGN.md §3).

Why: a resolve that only adds documents changes a few percent of the entities and relations, but building the
graph from every entity and relation record took 14 s at 100,000 passages. Here the saved graph's columns are
kept and only the new or changed items are put in, where a build from scratch would have them, so the result
is the graph `graph_columns` would build from all the items (the same columns, so graph.pkl has the same bytes).

What it takes (resolve's patch path; additions only, no record goes away): every document and chunk (their
vertices and PART_OF/NEXT_CHUNK edges are remade: few and cheap), the entities and relations added or made
again, in id order, and the mentions of the new chunks. Anything that does not fit the saved graph raises
OutOfStep, and the caller builds the graph from every item instead.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from itertools import repeat

import numpy as np

from .errors import HragError
from .graph import (EDGE_KINDS, ENTITY, VERTEX_KINDS, ChunkRef, GraphEntity, GraphRelation, _assemble,
                    _codes_in, _structure, edge_counts, load_columns)
from .graph_pickle import Column, GraphColumns
from .progress import Reporter
from .project import Project
from .records import Document

_REL, _MEN = EDGE_KINDS.index("RELATION"), EDGE_KINDS.index("MENTIONED_IN")


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
    """A column's rows from `start` (or `rows`), to change and insert into by value while staying codes; `column`
    then gives them coded as Column.of(values, (None,)) would."""

    def __init__(self, col: Column, start: int, at: np.ndarray | None, rows: np.ndarray | None = None) -> None:
        self.vocab = list(col.vocab)
        self.index = dict(zip(self.vocab, range(len(self.vocab))))
        codes = col.codes[start:] if rows is None else col.codes[rows]
        self.codes = np.insert(codes, at, 0) if at is not None and len(at) else codes.copy()

    def _code(self, value: object) -> int:
        code = self.index.get(value)
        if code is None:
            code = self.index[value] = len(self.vocab)
            self.vocab.append(value)
        return code

    def set(self, rows: np.ndarray, values: list) -> None:
        """Row rows[i] := values[i] (a value not seen yet coded in the order given)."""
        codes = list(map(self.index.get, values))
        if None in codes:
            codes = [self._code(v) if c is None else c for v, c in zip(values, codes)]
        self.codes[rows] = codes

    def insert(self, at: np.ndarray, values: list) -> None:
        self.codes = np.insert(self.codes, at, np.asarray([self._code(v) for v in values], dtype=np.int32))

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


def _inserted(old: np.ndarray, at: np.ndarray, new: np.ndarray) -> np.ndarray:
    return np.insert(old, at, new, axis=0) if len(new) else old


def update_columns(old: GraphColumns, docs: list[Document], chunks: list[ChunkRef], entities: list[GraphEntity],
                   relations: list[GraphRelation], mentions: Iterable[tuple[str, str, int]]) -> GraphColumns:
    """`graph_columns` of every item, from `old` (the graph saved by the last resolve or synonyms run: its
    SYNONYM edges are dropped, as a resolve's graph has none) and the items added or made again."""
    vk = _codes_in(old.vattrs["kind"], VERTEX_KINDS) if old.n else np.zeros(0, np.uint8)
    ent0 = int(np.count_nonzero(vk != VERTEX_KINDS.index(ENTITY)))
    if not (vk[ent0:] == VERTEX_KINDS.index(ENTITY)).all():
        raise OutOfStep("entity vertices are not the last ones")
    ek = _codes_in(old.eattrs["kind"], EDGE_KINDS) if old.m else np.zeros(0, np.uint8)
    if len(ek) and not (np.diff(ek.astype(np.int16)) >= 0).all():
        raise OutOfStep("edges are not in kind order")
    keys = old.vattrs["key"].values()
    st = _structure(docs, chunks)
    nd, n_dc = len(st.paths), len(st.keys)

    # vertices: documents and chunks as `st` has them; entities: the old ones with the new put in, in id order
    old_ents = keys[ent0:]
    ent_rows = {e.id: bisect.bisect_left(old_ents, e.id) for e in entities}
    added = [e for e in entities if not (ent_rows[e.id] < len(old_ents) and old_ents[ent_rows[e.id]] == e.id)]
    at = np.asarray([ent_rows[e.id] for e in added], dtype=np.int64)
    ent_ids = _spliced(old_ents, at, [e.id for e in added])
    where = dict(zip(st.keys, range(len(st.keys))))
    remap = np.empty(old.n, dtype=np.int64)
    try:
        remap[:ent0] = [where[k] for k in keys[:ent0]]
    except KeyError as exc:
        raise OutOfStep(f"document or chunk {exc} went away") from None
    remap[ent0:] = n_dc + np.arange(len(old_ents)) + np.searchsorted(at, np.arange(len(old_ents)), side="right")

    aliases = _spliced(old.vattrs["aliases"][ent0:], at, [None] * len(added))
    names, types = _Coded(old.vattrs["name"], ent0, at), _Coded(old.vattrs["type"], ent0, at)
    rows = list(map(bisect.bisect_left, repeat(ent_ids), [e.id for e in entities]))
    names.set(np.asarray(rows, dtype=np.int64), [e.name for e in entities])
    types.set(np.asarray(rows, dtype=np.int64), [e.type for e in entities])
    for i, e in zip(rows, entities):
        aliases[i] = list(e.aliases)

    def vertices(eids: list[str]) -> np.ndarray:
        """The entity vertices of `eids` (bisect and compare in C loops: one Python call per list, not per id)."""
        at = list(map(bisect.bisect_left, repeat(ent_ids), eids))
        last = len(ent_ids) - 1
        got = list(map(ent_ids.__getitem__, map(min, at, repeat(last)))) if ent_ids else []
        if got != eids:
            bad = next((e for e, g in zip(eids, got + [None] * len(eids)) if e != g), None)
            raise OutOfStep(f"relation or mention names an unknown entity {bad!r}")
        return n_dc + np.asarray(at, dtype=np.int64)

    n = n_dc + len(ent_ids)
    # relations: in (src, tgt) order, which is the order of their end vertices (entities are numbered in id order)
    rel = np.flatnonzero(ek == _REL)
    r_ends = remap[old.edges[rel]]
    r_weight = old.weight[rel].copy()
    key = old.eattrs["key"]
    in_order = len(rel) == 0 or (key.code(None) == 0 and np.array_equal(key.codes[rel], np.arange(1, len(rel) + 1)))
    r_ids = key.vocab[1:len(rel) + 1] if in_order else key.take(rel).values()   # a build's vocabulary: their ids
    r_types = _Coded(old.eattrs["rel_type"], 0, None, rel)
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
    for p, r in zip(pos[again].tolist(), made):
        r_ids[p] = r.id
    r_types.set(pos[again], [r.rel_type or None for r in made])
    new_r = np.flatnonzero(~found)
    at_r = pos[new_r]
    r_ends = _inserted(r_ends, at_r, ends[new_r])
    r_weight = _inserted(r_weight, at_r, np.asarray([float(relations[j].weight) for j in new_r.tolist()]))
    r_ids = _spliced(r_ids, at_r, [relations[j].id for j in new_r.tolist()])
    r_types.insert(at_r, [relations[j].rel_type or None for j in new_r.tolist()])

    # mentions: in chunk_id order, each chunk's run whole; a new chunk's run goes before any run of its chunk_id
    men = np.flatnonzero(ek == _MEN)
    m_ends = old.edges[men]
    m_weight = old.weight[men]
    starts = np.flatnonzero(np.diff(m_ends[:, 0], prepend=-1)) if len(men) else np.zeros(0, np.int64)
    run_keys = [keys[v] for v in m_ends[starts, 0].tolist()]
    m_ends = remap[m_ends]
    men_rows = list(mentions)
    chunk_ids = [m[0] for m in men_rows]
    cs = list(map(where.get, chunk_ids))
    bad = next((k for k, c in zip(chunk_ids, cs) if c is None or c < nd), None)
    if bad is not None:
        raise OutOfStep(f"a mention names an unknown chunk {bad!r}")
    runs = np.fromiter(map(bisect.bisect_left, repeat(run_keys), chunk_ids), dtype=np.int64, count=len(chunk_ids))
    at_m = starts[np.minimum(runs, len(starts) - 1)] if len(starts) else np.zeros(len(runs), np.int64)
    at_m = np.where(runs < len(starts), at_m, len(m_weight)).astype(np.int64)
    new_ends = np.stack([np.asarray(cs, dtype=np.int64), vertices([m[1] for m in men_rows])], axis=1).reshape(-1, 2)
    new_weight = np.fromiter((float(m[2]) for m in men_rows), dtype=np.float64, count=len(men_rows))
    m_ends = _inserted(m_ends, at_m, new_ends)
    m_weight = _inserted(m_weight, at_m, new_weight)
    return _assemble(st, ent_ids, names.column(), types.column(), aliases, r_ends, r_weight, r_ids, r_types.column(),
                     m_ends, m_weight)


def updated_graph(project: Project, docs: list[Document], chunks: list[ChunkRef], entities: list[GraphEntity],
                  relations: list[GraphRelation], mentions: list[tuple[str, str, int]], totals: tuple[int, int, int],
                  reporter: Reporter) -> GraphColumns | None:
    """`update_columns` on the saved graph (`mentions`: the new chunks'), checked against `totals` (entities,
    relations, mentions after the merge); None, with one warning, when the saved graph is missing, damaged or
    not the one the changes apply to (the caller then builds it from every item)."""
    try:
        old = load_columns(project)
        cols = update_columns(old, docs, chunks, entities, relations, mentions)
        ec = edge_counts(cols)
        got = (int(np.count_nonzero(cols.vattrs["kind"].codes == VERTEX_KINDS.index(ENTITY))), ec["RELATION"],
               ec["MENTIONED_IN"])
        if got != totals:
            raise OutOfStep(f"it would have {got} entities, relations and mentions, not {totals}")
        return cols
    except (HragError, OutOfStep) as exc:
        reporter.warn(f"{project.graph_path} cannot be updated ({exc}); building the graph from every item")
        return None
