"""The query-time graph: what a walk reads, as flat numpy arrays next to graph.pkl (graph/walk.npz).

Why it exists: a cold `hrag query --mode ppr` spent most of its time importing igraph, unpickling the whole
graph (names, types, aliases, relation ids the walk never reads) and in igraph's PageRank call, which copies the
graph into PRPACK's own form on every call. The walk needs only the adjacency, the edge weights and kinds, and
each vertex's key, so resolve and synonyms write those beside the pickle (`graph.save_walk`, called by
`graph.save_graph`) and a query loads them with numpy alone.

Layout (one uncompressed .npz, written atomically):
  indptr  int64 (n + 1)   row v of the symmetric adjacency is entries indptr[v]:indptr[v + 1]
  cols    int32 (nnz)     the neighbour of each entry (an undirected edge is two entries, a self-loop two on
                          its own row, as igraph counts it)
  weight  float64 (nnz)   the edge's stored weight
  kind    uint8 (nnz)     the edge's kind, an index into graph.EDGE_KINDS
  vkind   uint8 (n)       the vertex's kind, an index into VERTEX_KINDS
  keys    uint8 (bytes)   every vertex key, UTF-8, one after another; key v is keys[koff[v]:koff[v + 1]]
  koff    int64 (n + 1)
  order   int64 (n)       vertices sorted by key, for a binary search from key to vertex
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import HragError
from .graph import EDGE_KINDS, ENTITY, VERTEX_KINDS, load_graph, walk_arrays

_ENTITY = VERTEX_KINDS.index(ENTITY)
_ARRAYS = ("indptr", "cols", "weight", "kind", "vkind", "keys", "koff", "order")


class WalkGraph:
    """The walk's view of the graph: adjacency in CSR form and vertex keys (query/ppr.py walks it)."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.indptr, self.weight, self.kind = (arrays[k] for k in ("indptr", "weight", "kind"))
        self.cols = arrays["cols"].astype(np.intp)      # int32 on disk; a gather by int32 indices is ~9x slower
        self.vkind, self._keys, self._koff, self._order = (arrays[k] for k in ("vkind", "keys", "koff", "order"))
        self._keybytes = self._keys.tobytes()
        self._koff_list: list[int] | None = None       # koff and order as lists: a search reads ~20 of each
        self._order_list: list[int] = []
        self._rows: np.ndarray | None = None
        self._n_entities: int | None = None             # counted once: entity_row asks for it per name

    @classmethod
    def load(cls, project: Any) -> "WalkGraph":
        """graph/walk.npz; a project built before it existed gets the same arrays from graph.pkl (slower)."""
        path = project.walk_path
        try:
            with np.load(path, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in _ARRAYS}
        except FileNotFoundError:
            return cls(walk_arrays(load_graph(project)[0]))
        except Exception as exc:   # a damaged zip or array raises many kinds of errors
            raise HragError(f"{path} is damaged ({type(exc).__name__}); run 'hrag resolve' to rebuild it") from None
        walk = cls(arrays)
        if not walk._consistent():
            raise HragError(f"{path} is damaged (its arrays do not fit together); run 'hrag resolve' to rebuild it")
        return walk

    def _consistent(self) -> bool:
        n, nnz = self.vcount(), len(self.cols)
        return (len(self.indptr) == n + 1 and int(self.indptr[-1]) == nnz == len(self.weight) == len(self.kind)
                and len(self._koff) == n + 1 and len(self._order) == n and int(self._koff[-1]) == len(self._keys)
                and (nnz == 0 or (int(self.cols.min()) >= 0 and int(self.cols.max()) < n)))

    # -- vertices --------------------------------------------------------------------------------------------
    def vcount(self) -> int:
        return len(self.vkind)

    def ecount(self) -> int:
        """Edges (each undirected edge is two entries)."""
        return len(self.cols) // 2

    def key(self, v: int) -> str:
        return self._keybytes[int(self._koff[v]):int(self._koff[v + 1])].decode("utf-8")

    def _lists(self) -> tuple[list[int], list[int]]:
        """koff and order as Python lists, made on first use: a key search reads ~20 entries of each."""
        if self._koff_list is None:
            self._koff_list, self._order_list = self._koff.tolist(), self._order.tolist()
        return self._koff_list, self._order_list

    def vertex(self, key: str) -> int | None:
        """The vertex whose key is `key` (binary search over the sorted keys, compared as UTF-8 bytes, whose
        order is the strings' order), or None."""
        off, order = self._lists()
        blob, want = self._keybytes, key.encode("utf-8")
        lo, hi = 0, len(order)
        while lo < hi:
            mid = (lo + hi) // 2
            v = order[mid]
            if blob[off[v]:off[v + 1]] < want:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(order) and blob[off[order[lo]]:off[order[lo] + 1]] == want:
            return order[lo]
        return None

    def entity_vertex(self, key: str) -> int | None:
        v = self.vertex(key)
        return v if v is not None and self.vkind[v] == _ENTITY else None

    def entity_count(self) -> int:
        if self._n_entities is None:
            self._n_entities = int(np.count_nonzero(self.vkind == _ENTITY))
        return self._n_entities

    def entity_row(self, key: str) -> int | None:
        """The entity's place among the entity vertices, which is its line in entities.jsonl (both in id
        order: resolve writes them so), or None when no entity has this id."""
        v = self.entity_vertex(key)
        return None if v is None else v - (self.vcount() - self.entity_count())

    def keys_of_kind(self, kind: str) -> dict[str, int]:
        """key -> vertex of every vertex of one kind (e.g. the chunks, to align them with the chunk vectors)."""
        off, blob = self._lists()[0], self._keybytes
        return {blob[off[v]:off[v + 1]].decode("utf-8"): int(v)
                for v in np.flatnonzero(self.vkind == VERTEX_KINDS.index(kind)).tolist()}

    def degree_of_kind(self, v: int, edge_kind: str) -> int:
        """Entries of one edge kind on vertex v's row (for an entity's MENTIONED_IN: the chunks naming it)."""
        s, e = int(self.indptr[v]), int(self.indptr[v + 1])
        return int(np.count_nonzero(self.kind[s:e] == EDGE_KINDS.index(edge_kind)))

    # -- edges -----------------------------------------------------------------------------------------------
    def rows(self) -> np.ndarray:
        """The vertex whose row holds each entry (the CSR rows spelled out, made once): a weighted bincount
        over them sums a step of the walk twice as fast as a segmented sum."""
        if self._rows is None:
            self._rows = np.repeat(np.arange(self.vcount(), dtype=np.intp), np.diff(self.indptr))
        return self._rows

    def weights(self, scale: dict[str, float] | None = None) -> np.ndarray:
        """Each entry's weight, with the kinds in `scale` multiplied by their factor."""
        w = self.weight
        for k, f in (scale or {}).items():
            if f != 1.0:
                w = np.where(self.kind == EDGE_KINDS.index(k), w * f, w)
        return w
