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

import bisect
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hrag_cli.core.errors import HragError
from hrag_cli.graph.model import EDGE_KINDS, ENTITY, VERTEX_KINDS, load_columns, walk_arrays
from hrag_cli.graph.model import WALK_ARRAYS as _ARRAYS
from hrag_cli.storage.scratch import scratch

_ENTITY = VERTEX_KINDS.index(ENTITY)
Scale = dict[str, float] | None                # edge kind -> factor on its weights (None: as stored)
_LOCAL_HEADER = struct.Struct("<4s22xHH")     # a zip member's local header: signature ... name and extra lengths


def _mapped_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an uncompressed .npz memory-mapped in place (np.load reads every member whole, most of
    which a query never touches). A compressed member is read whole."""
    out: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(path) as zf, open(path, "rb") as fh:
        for info in zf.infolist():
            name = info.filename.removesuffix(".npy")
            if info.compress_type != zipfile.ZIP_STORED:
                out[name] = np.load(zf.open(info), allow_pickle=False)
                continue
            fh.seek(info.header_offset)
            sig, name_len, extra_len = _LOCAL_HEADER.unpack(fh.read(_LOCAL_HEADER.size))
            if sig != b"PK\x03\x04":
                raise ValueError("bad zip member header")
            fh.seek(info.header_offset + _LOCAL_HEADER.size + name_len + extra_len)
            version = np.lib.format.read_magic(fh)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(fh)
            if dtype.hasobject:
                raise ValueError("object arrays are not walk arrays")
            count = int(np.prod(shape))
            # a plain array over the mapping: np.memmap's indexing wrapper costs a Python call per vertex lookup
            out[name] = (np.asarray(np.memmap(fh, dtype=dtype, mode="r", offset=fh.tell(), shape=shape,
                                              order="F" if fortran else "C")) if count else np.zeros(shape, dtype))
    return out


class WalkGraph:
    """The walk's view of the graph: adjacency in CSR form and vertex keys (graph/push.py walks it)."""

    _FOUND_KEEP = 1 << 16           # `vertex` answers kept (a batch's names; cleared when full)
    _SAMPLE = 64                    # sorted keys per step of `_search`'s first bisection

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.indptr, self.weight, self.kind = (arrays[k] for k in ("indptr", "weight", "kind"))
        self._cols32 = arrays["cols"]
        self.vkind, self._keys, self._koff, self._order = (arrays[k] for k in ("vkind", "keys", "koff", "order"))
        self._cols: np.ndarray | None = None
        self._rows: np.ndarray | None = None
        self._n_entities: int | None = None             # counted once: entity_row asks for it per name
        self._degrees: np.ndarray | None = None
        self._starts: np.ndarray | None = None
        self._buffers: dict[str, np.ndarray] = {}      # scratch arrays of a batch's walks (`scratch`)
        self.memo: dict[Any, Any] = {}                 # results derived from the arrays, made once per process
                                                        # (and `ppr.passage_walk`'s count of walks)
        self._steps: dict[tuple, Callable[[np.ndarray], np.ndarray]] = {}
        self._found: dict[str, int | None] = {}         # key -> vertex answers of `vertex`
        self._views: tuple[memoryview, ...] | None = None   # keys, koff, order, for `_search`
        self._samples: dict[int, bytes] = {}               # j -> the (j x _SAMPLE)-th sorted key, as `_search` reads them

    @classmethod
    def load(cls, project: Any) -> "WalkGraph":
        """graph/walk.npz, memory-mapped (a query reads the pages it touches); a project without one gets the
        same arrays from graph.pkl (slower)."""
        path = project.walk_path
        try:
            arrays = _mapped_npz(path)
            arrays = {k: arrays[k] for k in _ARRAYS}
        except FileNotFoundError:
            return cls(walk_arrays(load_columns(project)))
        except Exception as exc:   # a damaged zip or array raises many kinds of errors
            raise HragError(f"{path} is damaged ({type(exc).__name__}); run 'hrag resolve' to rebuild it") from None
        walk = cls(arrays)
        if not walk._consistent():
            raise HragError(f"{path} is damaged (its arrays do not fit together); run 'hrag resolve' to rebuild it")
        return walk

    @property
    def cols(self) -> np.ndarray:
        """The neighbour of each entry as native integers (int32 on disk; a gather by int32 indices is several
        times slower), made on first use: a query that only looks up keys never reads them."""
        if self._cols is None:
            self._cols = self._cols32.astype(np.intp)
        return self._cols

    def _consistent(self) -> bool:
        n, nnz = self.vcount(), len(self._cols32)
        return (len(self.indptr) == n + 1 and int(self.indptr[-1]) == nnz == len(self.weight) == len(self.kind)
                and len(self._koff) == n + 1 and len(self._order) == n and int(self._koff[-1]) == len(self._keys)
                and (nnz == 0 or (int(self._cols32.min()) >= 0 and int(self._cols32.max()) < n)))

    # -- vertices --------------------------------------------------------------------------------------------
    def vcount(self) -> int:
        return len(self.vkind)

    def ecount(self) -> int:
        """Edges (each undirected edge is two entries)."""
        return len(self._cols32) // 2

    def key(self, v: int) -> str:
        return bytes(self._keys[int(self._koff[v]):int(self._koff[v + 1])]).decode("utf-8")

    def vertex(self, key: str) -> int | None:
        """The vertex whose key is `key` (binary search over the sorted keys, compared as UTF-8 bytes, whose
        order is the strings' order), or None. Reads ~20 keys of the mapped arrays, never all of them; the
        answers are remembered (a ppr question asks about one name three or four times)."""
        if key in self._found:
            return self._found[key]
        if len(self._found) >= self._FOUND_KEEP:
            self._found.clear()
        self._found[key] = v = self._search(key)
        return v

    def _search(self, key: str) -> int | None:
        # memoryviews: a Python int or bytes per item, no numpy scalar per step; the search first bisects
        # every _SAMPLE-th sorted key, each read once and kept (the first steps of every search read the same
        # few), then the keys between two of them (a ppr question looks up many runs of its words, most of
        # them no name). Kept as read, not listed up front: listing every 64th key would touch pages of the
        # whole mapped key arrays in a cold query.
        if self._views is None:
            self._views = (memoryview(np.ascontiguousarray(self._keys)),
                           *(memoryview(np.ascontiguousarray(a, dtype=np.int64)).cast("B").cast("q")
                             for a in (self._koff, self._order)))
        (keys, off, order), want = self._views, key.encode("utf-8")

        def at(v: int) -> bytes:
            return bytes(keys[off[v]:off[v + 1]])

        step, kept = self._SAMPLE, self._samples

        def sample(j: int) -> bytes:
            got = kept.get(j)
            if got is None:
                got = kept[j] = at(order[j * step])
            return got

        # the j-th sample is the first at or above want: the sorted keys up to the one before it are below
        j = bisect.bisect_left(range((len(order) + step - 1) // step), want, key=sample)
        lo, hi = max((j - 1) * step + 1, 0), min(j * step, len(order))
        i = bisect.bisect_left(order, want, lo, hi, key=at)
        return order[i] if i < len(order) and at(order[i]) == want else None

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
        vs = np.flatnonzero(self.vkind == VERTEX_KINDS.index(kind))
        if not len(vs):
            return {}
        first, last = int(vs[0]), int(vs[-1])       # resolve numbers each kind's vertices in one run
        lo = int(self._koff[first])
        blob, off = bytes(self._keys[lo:int(self._koff[last + 1])]), (np.asarray(self._koff[first:last + 2]) - lo).tolist()
        return {blob[off[v - first]:off[v - first + 1]].decode("utf-8"): v for v in vs.tolist()}

    def degree_of_kind(self, v: int, edge_kind: str) -> int:
        """Entries of one edge kind on vertex v's row (for an entity's MENTIONED_IN: the chunks naming it)."""
        s, e = int(self.indptr[v]), int(self.indptr[v + 1])
        return int(np.count_nonzero(self.kind[s:e] == EDGE_KINDS.index(edge_kind)))

    # -- edges -----------------------------------------------------------------------------------------------
    def rows(self) -> np.ndarray:
        """The vertex whose row holds each entry (the CSR rows spelled out, made once): a weighted bincount
        over them sums a step of the walk twice as fast as a segmented sum."""
        if self._rows is None:
            self._rows = np.repeat(np.arange(self.vcount(), dtype=np.intp), self.degrees())
        return self._rows

    def degrees(self) -> np.ndarray:
        """Entries on each vertex's row (its edge count, a self-loop counting twice), made once."""
        if self._degrees is None:
            self._degrees = np.diff(np.asarray(self.indptr))
        return self._degrees

    def starts(self) -> np.ndarray:
        """Where each vertex's row begins, in memory (made once): a walk gathers it for every vertex it spreads,
        and the mapped indptr costs several times as much per gather."""
        if self._starts is None:
            self._starts = np.array(self.indptr[:-1])
        return self._starts

    def push_limit(self, eps: float) -> np.ndarray:
        """Each vertex's spreading limit for a reset of total 1: eps x its entry count (at least 1), float64,
        made once per eps (a walk scales its reset to total 1, so a batch's walks share it)."""
        key = ("push_limit", float(eps))
        if key not in self.memo:
            self.memo[key] = np.maximum(self.degrees(), 1).astype(np.float64) * eps
        return self.memo[key]

    def weights(self, scale: Scale = None) -> np.ndarray:
        """Each entry's weight, with the kinds in `scale` multiplied by their factor."""
        factor = kind_factors(scale)
        return self.weight if factor is None else self.weight * factor[np.asarray(self.kind)]

    def _entries(self, scale: Scale) -> tuple[np.ndarray, np.ndarray]:
        """Every entry's share of its row's mass (`_inverse`) and native neighbour side by side (16 bytes an
        entry): a spread gathers both with one take, half the time of two, and needs no sum over its rows.
        Entries of share 0 (weight 0, e.g. SYNONYM edges scaled to 0) are left out, as they move no mass: also
        each row's start and length in this table, side by side (one gather a vertex). Scaled in place and
        copied in slices, so making it costs little memory beyond the table itself."""
        share = self.weights(scale)
        if share is self.weight:                    # the mapped stored weights: a copy to scale in place
            share = np.array(share, dtype=np.float64)
        degrees = self.degrees()
        filled = np.flatnonzero(degrees > 0)
        row_lens = np.zeros(self.vcount(), dtype=np.intp)
        if len(filled):
            at = np.asarray(self.indptr[filled])
            share *= np.repeat(_inverse(np.add.reduceat(share, at)), degrees[filled])
            row_lens[filled] = np.add.reduceat(share != 0, at, dtype=np.intp)
        pairs = np.empty(int(row_lens.sum()), dtype=[("w", np.float64), ("c", np.intp)])
        done = 0
        for lo in range(0, len(share), 1 << 20):    # in slices: a whole-array selection is a large temporary
            part = slice(lo, lo + (1 << 20))
            live = share[part] != 0
            count = int(np.count_nonzero(live))
            pairs["w"][done:done + count] = share[part][live]
            pairs["c"][done:done + count] = self._cols32[part][live]
            done += count
        rows = np.empty(self.vcount(), dtype=[("start", np.intp), ("len", np.intp)])
        rows["len"] = row_lens
        rows["start"] = np.cumsum(row_lens) - row_lens
        return pairs, rows

    def spread(self, vertices: np.ndarray, amount: np.ndarray, scale: Scale = None) -> tuple[np.ndarray, np.ndarray]:
        """Where the mass goes when each vertex in `vertices` (distinct, each with a row) spreads `amount` of it
        over its edges in proportion to their weights (`scale` as in `weights`): the neighbour and the mass of
        every entry of those rows. Reads only those rows, so a local walk's cost follows where its mass is;
        a vertex without a usable edge (all weights 0) sends nothing. Once `prepare` has made the table for
        this scale, an entry costs one gather and one product where it cost three gathers and a sum over its
        row. Both ways compute the same shares, and an entry of share 0 adds 0 to a residual, so a walk gives
        the same bits either way. Prepared, the two arrays returned are views of scratch arrays (`scratch`):
        valid until the next spread."""
        prepared = self.memo.get(("weights", scale_key(scale)))
        if prepared is not None:                    # one gather of (share, neighbour) pairs
            table, rows = prepared
            picked = rows[vertices]
            starts, lens = picked["start"], picked["len"]
            ends = np.cumsum(lens)
            total = int(ends[-1]) if len(ends) else 0
            idx = _runs(starts, lens, ends - lens, total, self.scratch("idx", total, np.intp),
                        self.scratch("ones", total, np.intp, fill=1))        # `_runs` leaves it all ones
            pairs = np.take(table, idx, mode="clip", out=self.scratch("pairs", total, table.dtype))
            return pairs["c"], np.multiply(pairs["w"], np.repeat(amount, lens), out=self.scratch("mass", total, np.float64))
        starts, lens = self.starts()[vertices], self.degrees()[vertices]
        ends = np.cumsum(lens)
        first = ends - lens
        total = int(ends[-1]) if len(ends) else 0
        idx = _runs(starts, lens, first, total)
        w = np.asarray(self.weight[idx], dtype=np.float64)
        factor = kind_factors(scale)
        if factor is not None:
            w *= factor[self.kind[idx]]
        if len(w):
            w *= np.repeat(_inverse(np.add.reduceat(w, first)), lens)    # each entry's share of its row
        return self._cols32[idx], w * np.repeat(amount, lens)

    def prepare(self, scale: Scale = None) -> None:
        """Every entry's share of its row and its native neighbour made whole, once per scale, side by side
        (`_entries`, without the entries of share 0), for `spread`. It costs a pass over every entry and the
        table's memory, and saves each later question's walk the second gather of its rows: a batch's walks
        ask for it (`ppr.passage_walk`), a single query reads only its rows."""
        key = ("weights", scale_key(scale))
        if key not in self.memo:
            self.memo[key] = self._entries(scale)

    def scratch(self, name: str, size: int, dtype: Any, fill: Any = None) -> np.ndarray:
        """A scratch array kept across a batch's walks (`vectors.scratch`): a walk gathers megabytes a round
        and keeps a few vertex-length arrays, and fresh arrays cost their page faults every time."""
        return scratch(self._buffers, name, size, dtype, fill)

    def transition(self, scale: Scale = None) -> Callable[[np.ndarray], np.ndarray]:
        """One step of the walk over every entry for edge weights `scale`d as in `weights`: step(p)[v] = the float32 mass that reaches v when every vertex u spreads p[u] over
        its edges in proportion to their weights (a vertex without a usable edge sends nothing). Made once per
        scale (a query batch reuses it): each entry's share w / strength of its far end, precomputed, so a step
        is one gather, one product and one segmented sum over the rows that have entries."""
        key = scale_key(scale)
        if key in self._steps:
            return self._steps[key]
        n, cols = self.vcount(), self.cols
        w = np.asarray(self.weights(scale), dtype=np.float64)
        if len(w) and float(w.min()) < 0:
            raise ValueError("edge weights must not be negative")
        filled = np.flatnonzero(self.degrees() > 0)
        starts = np.asarray(self.indptr[filled])
        strength = np.zeros(n)
        if len(filled):
            strength[filled] = np.add.reduceat(w, starts)
        share = (w * np.divide(1.0, strength, out=np.zeros(n), where=strength > 0)[cols]).astype(np.float32)
        flow = np.empty(len(w), dtype=np.float32)

        def step(p: np.ndarray) -> np.ndarray:
            out = np.zeros(n, dtype=np.float32)
            if len(filled):
                np.take(p, cols, out=flow)
                np.multiply(flow, share, out=flow)
                out[filled] = np.add.reduceat(flow, starts)
            return out

        self._steps[key] = step
        return step


def _inverse(strength: np.ndarray) -> np.ndarray:
    """1 / each row's summed weights, 0 for a row whose weights sum to 0 (it sends nothing): an entry's share
    of its row is its weight times this, the same product whether a batch prepared it or a spread made it."""
    return np.divide(1.0, strength, out=np.zeros(len(strength)), where=strength > 0)


def _runs(starts: np.ndarray, lens: np.ndarray, first: np.ndarray, total: int,
          out: np.ndarray | None = None, ones: np.ndarray | None = None) -> np.ndarray:
    """The entries starts[i] .. starts[i] + lens[i] - 1 of every run, one run after another (`first`: where
    each run begins in the output): steps of 1 summed, with a jump at each run's first entry. Two passes over
    the entries where an arange plus a repeated offset takes three.
    `out` and `ones` (given together, or neither): an intp array of `total` items to write them into, and one
    of at least `total` ones to take the steps from (left all ones again): then the sum is the only pass that
    writes every entry."""
    if out is None:
        assert ones is None, "`ones` needs `out`: the steps taken from it are reset after the sum"
        idx = steps = np.ones(total, dtype=np.intp)
    else:
        assert ones is not None, "`out` needs `ones` to take the steps from"
        idx, steps = out, ones[:total]
    if not total:
        return idx
    live = lens > 0
    s, at = starts[live], first[live]
    last = s + lens[live] - 1                      # each run's last entry
    steps[at] = s - np.concatenate(([0], last[:-1]))
    try:
        return np.cumsum(steps, out=idx)
    finally:
        if ones is not None:
            steps[at] = 1                          # all ones again for the next spread


def scale_key(scale: Scale) -> tuple:
    """A scale as a memo key (equal scales, equal keys)."""
    return tuple(sorted((scale or {}).items()))


def kind_factors(scale: Scale) -> np.ndarray | None:
    """Per edge kind, the factor `scale` gives it (None: no scaling)."""
    if not scale:
        return None
    if any(f < 0 for f in scale.values()):
        raise ValueError("edge weights must not be negative")
    return np.array([float(scale.get(k, 1.0)) for k in EDGE_KINDS])
