"""The graph of a merge in partitions (resolve/partition.py), made while the partitions are merged, in arrays of a
few bytes per entity and edge: the columns `graph.model.graph_columns` would make from every record, byte for
byte, without a Python object per entity or a dict over every vertex key.

Why: once the merge runs in partitions, a build that keeps per entity its id, name, type and aliases as objects
and a dict from every key to its vertex (hundreds of bytes an entity) is what grows with the corpus. Here the entity
columns are written as the pickle's JSON vocabularies as each partition's entities come (in id order, the order
of their vertices), and a key's vertex is found by a binary search over the keys' 64-bit hashes (sorted once),
with a dict for the keys whose hashes clash (none, nearly always). walk.npz's key arrays come from
graph.csr.SortedKeys, its rows from graph.csr.adjacency.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator
from itertools import repeat

import numpy as np
import orjson

from hrag_cli.graph import csr
from hrag_cli.graph.model import _assemble, _Structure
from hrag_cli.graph.pickle_format import Column, GraphColumns, ListJSON

_hash: Callable[[str], int] = hash      # a key's hash (within one process); the tests make it clash


def _hashes(keys: list[str]) -> np.ndarray:
    return np.fromiter(map(_hash, keys), dtype=np.int64, count=len(keys))


class _Vocab:
    """A column of few distinct values (types), coded as Column.of(values, (None,)) codes them."""

    def __init__(self) -> None:
        self.index: dict = {None: 0}
        self.codes = array("i")

    def add(self, values: Iterable) -> None:
        index = self.index
        self.codes.extend([index.setdefault(v, len(index)) for v in values])

    def add_one(self, value: object) -> None:
        self.codes.append(self.index.setdefault(value, len(self.index)))

    def column(self) -> Column:
        return Column(list(self.index), np.frombuffer(self.codes, dtype=np.int32))


class _Names:
    """A column of strings mostly distinct (display names), coded as Column.of(values, (None,)) codes them: each
    value's JSON kept in one buffer, the first of equal values found by their hashes (equal hashes are compared
    by their bytes: a clash of distinct values codes the column from the decoded values instead)."""

    def __init__(self) -> None:
        self.json = bytearray()
        self.lengths: list[np.ndarray] = []
        self.hashes: list[np.ndarray] = []

    def add(self, values: list[str]) -> None:
        parts = list(map(orjson.dumps, values))
        self.json += b"".join(parts)
        self.lengths.append(np.fromiter(map(len, parts), dtype=np.int64, count=len(parts)))
        self.hashes.append(_hashes(values))

    def offsets(self) -> np.ndarray:
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64)
        off = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=off[1:])
        return off

    def column(self, off: np.ndarray) -> Column:
        h = np.concatenate(self.hashes) if self.hashes else np.zeros(0, np.int64)
        n = len(h)
        if not n:
            return Column([None], np.zeros(0, np.int32))
        _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
        blob = self.json
        # a value whose hash an earlier value has: the same bytes, or a clash
        again = np.flatnonzero(first[inverse] != np.arange(n))
        if len(again):
            mine, theirs = again.tolist(), first[inverse[again]].tolist()
            lo, hi = off[:-1], off[1:]
            if any(blob[lo[a]:hi[a]] != blob[lo[b]:hi[b]] for a, b in zip(mine, theirs)):
                values = [orjson.loads(blob[a:b]) for a, b in zip(off[:-1].tolist(), off[1:].tolist())]
                return Column.of(values, (None,))
        by_first = np.argsort(first)
        rank = np.empty(len(first), dtype=np.int32)
        rank[by_first] = np.arange(1, len(first) + 1, dtype=np.int32)
        starts = off[first[by_first]].tolist()
        ends = off[first[by_first] + 1].tolist()
        vocab = b"[" + b",".join([b"null", *map(blob.__getitem__, map(slice, starts, ends))]) + b"]"
        return Column(None, rank[inverse].astype(np.int32, copy=False), vocab)

    def values(self, off: np.ndarray, rows: np.ndarray) -> Iterator[str]:
        """The values of `rows` (a partition's: a bounded number), each decoded as it is read."""
        return map(orjson.loads, map(self.json.__getitem__, map(slice, off[rows].tolist(), off[rows + 1].tolist())))


class VertexIndex:
    """Vertex keys -> their vertices, by a binary search over the keys' sorted hashes; keys whose hashes clash
    are looked up in a dict (the later vertex of two equal keys wins, as in a dict made of every key)."""

    def __init__(self, hashes: np.ndarray, key_of: Callable[[int], str]) -> None:
        order = np.argsort(hashes, kind="stable")
        self.sorted = hashes[order]
        self.vertex = order.astype(np.int64, copy=False)
        clash = np.flatnonzero(self.sorted[1:] == self.sorted[:-1])
        self.clash_hashes = np.unique(self.sorted[clash])
        self.clash: dict[str, int] = {}
        if len(clash):
            for v in np.sort(order[np.isin(self.sorted, self.clash_hashes)]).tolist():
                self.clash[key_of(v)] = v

    def __call__(self, keys: list[str]) -> np.ndarray:
        h = _hashes(keys)
        if not len(self.sorted):
            if keys:
                raise KeyError(keys[0])
            return np.zeros(0, np.int64)
        at = np.minimum(np.searchsorted(self.sorted, h), len(self.sorted) - 1)
        miss = np.flatnonzero(self.sorted[at] != h)
        if len(miss):
            raise KeyError(keys[int(miss[0])])
        out = self.vertex[at]
        if self.clash:
            for i in np.flatnonzero(np.isin(h, self.clash_hashes)).tolist():
                out[i] = self.clash[keys[i]]
        return out


class GraphBuild:
    """The graph's columns, put together as a partitioned merge makes its items: the entities partition by
    partition (`add_entities`, in id order), then the relations (`add_relation_ends`, `add_relation`: in id
    order) and the mentions (`add_mentions`, in chunk_id order); `finish` gives the columns and walk.npz's key
    arrays."""

    def __init__(self, st: _Structure) -> None:
        self.st = st
        first = st.keys
        self.n_dc = len(first)
        self.keys = csr.SortedKeys([k.encode("utf-8") for k in first])
        self.key_json = bytearray(orjson.dumps(first)[:-1])
        self.count = self.n_dc                          # vertices so far
        self.hashes: list[np.ndarray] = [_hashes(first)]
        self.names, self.types = _Names(), _Vocab()
        self.aliases = bytearray(b"[" + b",".join(repeat(b"null", self.n_dc)))
        self.rel_ends: list[np.ndarray] = []
        self.rel_weight = array("d")
        self.rel_types = _Vocab()
        self.rel_ids = bytearray(b"[null")
        self.men_ends: list[np.ndarray] = []
        self.men_weight = array("d")
        self._index: VertexIndex | None = None
        self._name_off: np.ndarray | None = None

    def add_entities(self, ids: list[str], names: list[str], types: list[str], aliases: list[list[str]]) -> None:
        """The next partition's entities, in id order."""
        if not ids:
            return
        self.keys.add(ids)
        more = b",".join(map(orjson.dumps, ids))
        self.key_json += (b"," + more) if self.count else more
        alias_json = b",".join(map(orjson.dumps, aliases))
        self.aliases += (b"," + alias_json) if self.count else alias_json
        self.count += len(ids)
        self.hashes.append(_hashes(ids))
        self.names.add(names)
        self.types.add(types)

    def vertices(self, keys: list[str]) -> np.ndarray:
        """The vertices of `keys` (every entity added first)."""
        if self._index is None:
            hashes = np.concatenate(self.hashes)
            self.hashes = []
            self._index = VertexIndex(hashes, self.keys.key)
        return self._index(keys)

    def entity_names(self, vertices: np.ndarray) -> Iterator[str]:
        """The display names of entity vertices, decoded one at a time as they are read."""
        if self._name_off is None:
            self._name_off = self.names.offsets()
        return self.names.values(self._name_off, vertices - self.n_dc)

    def add_relation_ends(self, src: np.ndarray, tgt: np.ndarray) -> None:
        """The end vertices of the next relations (in id order; `add_relation` gives the rest of each)."""
        self.rel_ends.append(np.stack([src, tgt], axis=1).astype(np.int32 if self.count < 2 ** 31 else np.int64))

    def add_relation(self, rid: str, weight: float, rel_type: str | None) -> None:
        self.rel_ids += b"," + orjson.dumps(rid)
        self.rel_weight.append(weight)
        self.rel_types.add_one(rel_type)

    def add_mentions(self, rows: list[tuple[str, str, int]]) -> None:
        """The next (chunk_id, entity id, count) mentions."""
        if not rows:
            return
        chunks, eids, counts = zip(*rows)
        ends = np.stack([self.vertices(list(chunks)), self.vertices(list(eids))], axis=1)
        self.men_ends.append(ends.astype(np.int32 if self.count < 2 ** 31 else np.int64))
        self.men_weight.extend(map(float, counts))

    def finish(self) -> tuple[GraphColumns, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The graph's columns and walk.npz's key arrays; this build is emptied as they are made."""
        key = Column(None, np.arange(self.count, dtype=np.int32), bytes(self.key_json + b"]"))
        self.key_json = bytearray()
        aliases = ListJSON(self.aliases + b"]")
        self.aliases = bytearray()
        names = self.names.column(self._name_off if self._name_off is not None else self.names.offsets())
        self.names = _Names()
        self._index = None
        self.rel_ids += b"]"
        rel_ends = np.concatenate(self.rel_ends) if self.rel_ends else np.zeros((0, 2), np.int64)
        men_ends = np.concatenate(self.men_ends) if self.men_ends else np.zeros((0, 2), np.int64)
        self.rel_ends, self.men_ends = [], []
        graph = _assemble(self.st, key, names, self.types.column(), aliases, rel_ends,
                          np.frombuffer(self.rel_weight, dtype=np.float64), Column(None, None, bytes(self.rel_ids)),
                          self.rel_types.column(), men_ends, np.frombuffer(self.men_weight, dtype=np.float64))
        self.rel_ids = bytearray()
        return graph, self.keys.arrays()
