"""graph.pkl written straight from numpy columns, and read back as columns (docs/formats.md, "graph.pkl").

Why: `pickle.dumps` of an igraph graph writes every edge as a tuple and every attribute value as an object (slow,
and large before compression), and a later stage would have to unpickle it whole to add its edges. This file is
still a pickle that `pickle.load` turns into the same `igraph.Graph` with nothing but the standard library and
igraph: its arguments are built on load by standard calls, `Graph(n, edges, False, {},
vertex_attrs, edge_attrs)` with
  edges    memoryview(array('q', ...)).cast('B').cast('q', (m, 2))    (igraph reads the buffer directly)
  weight   array('d', ...)                                          (igraph makes the list of floats)
  others   list(map(json.loads(VOCAB).__getitem__, array('i', CODES)))   (each distinct value once, as igraph's
           own pickle memoises equal strings)
  aliases  json.loads(...)                                          (a fresh list per vertex)
Arrays go through `array`'s own portable reduction. `read_columns` loads such a file without running those calls,
so a stage that changes a few edges reads numpy arrays in a fraction of a second.
"""

from __future__ import annotations

import array
import io
import json
import pickle
import sys
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson


class Column:
    """An attribute with few distinct values or none repeated: value i = vocab[codes[i]]. A column read from
    a file keeps its vocabulary's JSON and parses it on first use, and keeps the compressed members it was
    read from (a stage that only swaps edges writes those members back as they were, never compressing them
    again)."""

    __slots__ = ("_vocab", "_json", "_z", "_codes", "codes_z")

    def __init__(self, vocab: list | None, codes: np.ndarray | None, vocab_json: bytes | None = None,
                 vocab_z: bytes | None = None, codes_z: bytes | None = None) -> None:
        self._vocab, self._json, self._z, self._codes, self.codes_z = vocab, vocab_json, vocab_z, codes, codes_z

    @property
    def codes(self) -> np.ndarray:
        if self._codes is None:
            self._codes = np.frombuffer(zlib.decompress(self.codes_z or b""), dtype=np.int32)
        return self._codes

    @property
    def vocab(self) -> list:
        if self._vocab is None:
            self._vocab = orjson.loads(self.vocab_json())
        return self._vocab

    def vocab_json(self) -> bytes:
        if self._json is None:
            self._json = zlib.decompress(self._z) if self._z is not None else orjson.dumps(self._vocab)
        return self._json

    def __repr__(self) -> str:
        return "Column(packed rows)" if self._codes is None else f"Column({len(self._codes)} rows)"

    def values(self) -> list:
        return list(map(self.vocab.__getitem__, self.codes.tolist()))

    @classmethod
    def of(cls, values: list, vocab: tuple = ()) -> "Column":
        """`vocab` first (a fixed vocabulary keeps equal values coded alike whichever rows a graph has), then
        every other value in the order it first appears."""
        uniq = list(dict.fromkeys([*vocab, *values]))      # C loops only: no Python loop per value
        index = dict(zip(uniq, range(len(uniq))))
        return cls(uniq, np.fromiter(map(index.__getitem__, values), dtype=np.int32, count=len(values)))

    def take(self, rows: np.ndarray) -> "Column":
        return self.recoded(self.codes[rows])

    def recoded(self, codes: np.ndarray) -> "Column":
        """This vocabulary with `codes`."""
        return Column(self._vocab, codes, self._json, self._z)

    def code(self, value: Any) -> int | None:
        """The code of `value`, or None. None's code is read off the JSON when the vocabulary starts with it,
        so a long vocabulary is not parsed to find it."""
        if value is None and self._vocab is None:
            head = self._json[:5] if self._json is not None else \
                zlib.decompressobj().decompress(self._z or b"", 5)      # the first bytes only
            if head == b"[null":
                return 0
        try:
            return self.vocab.index(value)
        except ValueError:
            return None

    def concat(self, other: "Column") -> "Column":
        """This column's rows, then `other`'s (their vocabularies joined, values kept; this one's vocabulary
        stays as it is, compressed member and all, when it holds all of `other`'s values)."""
        remap = [self.code(v) for v in other.vocab]
        if None not in remap:
            codes = np.concatenate([self.codes, np.asarray(remap, dtype=np.int32)[other.codes]])
            return Column(self._vocab, codes, self._json, self._z)
        index = {v: i for i, v in enumerate(self.vocab)}
        at = np.fromiter((index.setdefault(v, len(index)) for v in other.vocab), dtype=np.int32, count=len(other.vocab))
        return Column(list(index), np.concatenate([self.codes, at[other.codes]]).astype(np.int32))


class ListJSON(bytes):
    """A column of lists (vertex `aliases`) given as the JSON of the whole list, as `orjson.dumps` writes it: a
    build that makes it entity by entity never holds a list object per vertex."""

    def values(self) -> list:
        return orjson.loads(memoryview(self))


@dataclass
class GraphColumns:
    """The whole graph as arrays: `edges` (m, 2) in igraph's edge order, `weight` per edge, every other
    attribute a Column (vertex `aliases`: a list per vertex, or that list's ListJSON)."""

    n: int
    edges: np.ndarray                                   # int64 (m, 2)
    weight: np.ndarray                                  # float64 (m)
    vattrs: dict[str, Column | list] = field(default_factory=dict)
    eattrs: dict[str, Column] = field(default_factory=dict)
    # what the file this came from held, raw bytes -> compressed member, so a stage that keeps most of the graph
    # compresses only what it changed (a dict lookup compares the bytes: a hit is exact)
    packed: dict[bytes, bytes] = field(default_factory=dict, repr=False)
    # the first edge of the SYNONYM edges at the end (m: none). Every edge array is stored in two parts split
    # there, so the synonyms stage rewrites the second part and reuses the first one's member.
    split: int = -1

    @property
    def m(self) -> int:
        return len(self.edges)

    def to_igraph(self) -> Any:
        import igraph

        g = igraph.Graph(self.n, np.ascontiguousarray(self.edges, dtype=np.int64), directed=False)
        for k, c in self.vattrs.items():
            g.vs[k] = c.values() if isinstance(c, (Column, ListJSON)) else c
        g.es["kind"] = self.eattrs["kind"].values()
        g.es["weight"] = self.weight.tolist()
        for k, c in self.eattrs.items():
            if k != "kind":
                g.es[k] = c.values()
        return g

    @classmethod
    def of_igraph(cls, graph: Any) -> "GraphColumns":
        """Columns of any igraph graph (the slow path, for a graph made elsewhere or a pickle of earlier versions)."""
        m = graph.ecount()
        vattrs: dict[str, Column | list] = {k: graph.vs[k] if k == "aliases" else Column.of(graph.vs[k])
                                            for k in graph.vs.attributes()}
        eattrs = {k: Column.of(graph.es[k]) for k in graph.es.attributes() if k != "weight"}
        return cls(graph.vcount(), np.asarray(graph.get_edgelist(), dtype=np.int64).reshape(m, 2),
                   np.asarray(graph.es["weight"] if m else [], dtype=np.float64), vattrs, eattrs)


class _Call:
    """A call the unpickler makes: reduced to (func, args) by `_Writer`."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __call__(self, *args: Any) -> Any:     # pickle reduces only to a callable: this one is called on load
        raise TypeError("a call to be pickled, not made")


def _method(obj: Any, name: str, *args: Any) -> _Call:
    return _Call(_Call(getattr, obj, name), *args)


class _Writer(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _Call):
            return obj.func, obj.args
        return NotImplemented


class _Raw:
    """A member's raw bytes as a `_Packed` key: bytes, or a view of an array's (a large graph's arrays are hundreds
    of MB each: a copy as bytes would add their size to the peak), hashed by their CRC-32 and length and compared
    by content, so equal bytes are one key whichever form they came in."""

    __slots__ = ("data", "_hash")

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = data
        self._hash = hash((zlib.crc32(data), len(data)))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Raw) and len(self.data) == len(other.data) and \
            np.array_equal(np.frombuffer(self.data, np.uint8), np.frombuffer(other.data, np.uint8))


class _Packed(dict):
    """_Raw(raw bytes) -> compressed member (from `raws`: raw bytes -> member, as a file held them), and `kept`:
    the members columns hold still compressed (their raw bytes unknown), each its own key, so a raw compressed
    now to the same member is that same object."""

    kept: dict[bytes, bytes]

    def __init__(self, raws: dict[bytes, bytes] | None = None) -> None:
        super().__init__((_Raw(k), v) for k, v in (raws or {}).items())
        self.kept = {}


# Columns whose values are ids (hex digests): deflate's string matching finds next to nothing in them, and
# Huffman coding alone makes them smaller than deflate's level 1, at less CPU. Any zlib reads either.
ID_COLUMNS = frozenset({"key", "doc_id"})


def _compress(raw: bytes, ids: bool) -> bytes:
    if not ids:
        return zlib.compress(raw, 1)
    z = zlib.compressobj(1, zlib.DEFLATED, zlib.MAX_WBITS, 9, zlib.Z_HUFFMAN_ONLY)
    return z.compress(raw) + z.flush()


def _member(raw: bytes | memoryview, packed: _Packed, ids: bool = False) -> _Call:
    """zlib.decompress(the member of `raw`), made once per distinct `raw` in a file (the pickle then writes it
    once and refers to it after, whether it was compressed now or came from `packed`). `ids`: the vocabulary of
    an ID_COLUMNS column."""
    key = _Raw(raw)
    data = packed.get(key)
    if data is None:
        data = _compress(raw, ids)
        data = packed[key] = packed.kept.get(data, data)
    return _Call(zlib.decompress, data)


def _pickled(root: _Call) -> bytes:
    buf = io.BytesIO()
    _Writer(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(root)
    return buf.getvalue()


def _raw(a: np.ndarray) -> memoryview:
    """The bytes of a contiguous array, not copied."""
    return memoryview(a).cast("B")


def _array(typecode: str, a: np.ndarray, packed: _Packed, split: int = -1) -> _Call:
    """array(typecode, the bytes of `a`), stored zlib-compressed (level 1) in one part, or two split at row
    `split`."""
    a = np.ascontiguousarray(a)
    if split < 0:
        return _Call(array.array, typecode, _member(_raw(a), packed))
    parts = [_member(_raw(a[:split]), packed), _member(_raw(a[split:]), packed)]
    return _Call(array.array, typecode, _Call(getattr(b"", "join"), parts))


def _column_call(name: str, c: Column | list, packed: _Packed, split: int = -1) -> _Call:
    if not isinstance(c, Column):
        return _Call(json.loads, _member(c if isinstance(c, ListJSON) else orjson.dumps(c), packed))
    vocab = _Call(json.loads, _Call(zlib.decompress, c._z) if c._z is not None else
                  _member(c.vocab_json(), packed, name in ID_COLUMNS))
    codes = _Call(array.array, "i", _Call(zlib.decompress, c.codes_z)) if c.codes_z is not None and split < 0 else \
        _array("i", c.codes.astype(np.int32), packed, split)
    return _Call(list, _Call(map, _Call(getattr, vocab, "__getitem__"), codes))


def dumps(cols: GraphColumns) -> bytes:
    """The pickle bytes of `cols` (equal columns give equal bytes)."""
    buf = io.BytesIO()
    dump(cols, buf)
    return buf.getvalue()


def dump(cols: GraphColumns, fh: Any) -> None:
    """`dumps(cols)` written to the binary file `fh` as it is made (a large graph's pickle is never held whole)."""
    import igraph

    packed, split = _Packed(cols.packed), cols.split if 0 <= cols.split <= cols.m else cols.m
    columns = [c for c in [*cols.vattrs.values(), *cols.eattrs.values()] if isinstance(c, Column)]
    packed.kept = {z: z for c in columns for z in (c.codes_z, c._z) if z is not None}
    # a kept vocabulary's raw bytes are known: another column with that vocabulary is written as that member,
    # whichever way it was compressed
    packed.update((_Raw(c._json), c._z) for c in columns if c._json is not None and c._z is not None)
    flat = _array("q", cols.edges.astype(np.int64, copy=False).reshape(-1), packed, 2 * split)
    # no edges: an empty list (a memoryview cannot take the shape (0, 2))
    edges = _method(_method(_Call(memoryview, flat), "cast", "B"), "cast", "q", (cols.m, 2)) if cols.m else []
    # names interned: the pickle writes an object once and refers to it after, so equal names must be one
    # object whichever way the columns were made (built now, or read from a file)
    vattrs = {sys.intern(k): _column_call(k, c, packed) for k, c in cols.vattrs.items()}
    eattrs: dict[str, Any] = {"kind": _column_call("kind", cols.eattrs["kind"], packed, split),
                              "weight": _array("d", cols.weight.astype(np.float64, copy=False), packed, split)}
    eattrs.update((sys.intern(k), _column_call(k, c, packed, split)) for k, c in cols.eattrs.items() if k != "kind")
    _Writer(fh, protocol=pickle.HIGHEST_PROTOCOL).dump(_Call(igraph.Graph, cols.n, edges, False, {}, vattrs, eattrs))


class _Node:
    """A call recorded, not made, by `_Reader` (calling one records that call too)."""

    def __init__(self, name: str, args: tuple) -> None:
        self.name, self.args = name, args

    def __call__(self, *args: Any) -> "_Node":
        return _Node("call", (self, *args))


def _members(node: Any, out: list) -> list:
    """Every zlib member under `node`, depth first (the parts of one array in order)."""
    for a in node.args if isinstance(node, _Node) else node if isinstance(node, (list, tuple)) else ():
        if isinstance(a, _Node) and a.name == "decompress":
            out.append(a.args[0])
        else:
            _members(a, out)
    return out


class _Stub:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any) -> _Node:
        return _Node(self.name, args)


_STUBS = {("igraph", "Graph"), ("builtins", "list"), ("builtins", "map"), ("builtins", "getattr"),
          ("builtins", "memoryview"), ("json", "loads"), ("zlib", "decompress"), ("array", "array")}


class _Reader(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _STUBS:
            return _Stub(name)
        raise pickle.UnpicklingError(f"unexpected global {module}.{name}")


class NotColumns(Exception):
    """The file is a pickle of another shape (igraph's own, from earlier versions): load it whole instead."""


class _Unpacker:
    """Turns the recorded calls back into arrays, noting each member's raw bytes -> compressed form."""

    def __init__(self) -> None:
        self.packed: dict[bytes, bytes] = {}
        self.split = -1

    def raw(self, node: Any, split_items: int = 0) -> bytes:
        parts = _members(node, [])
        if not parts:
            raise NotColumns("expected a compressed member")
        raws = [zlib.decompress(p) for p in parts]
        self.packed.update(zip(raws, parts))
        if len(raws) == 2 and split_items:
            self.split = len(raws[0]) // split_items
        raws = [r for r in raws if r] or [b""]
        return raws[0] if len(raws) == 1 else b"".join(raws)

    def array(self, node: Any, dtype: Any, split_items: int = 0) -> np.ndarray:
        raw = self.raw(node, split_items)
        if len(raw) % np.dtype(dtype).itemsize:
            raise NotColumns("array bytes do not fit its type")
        return np.frombuffer(raw, dtype=dtype)

    def column(self, node: Any) -> Column | list:
        if not isinstance(node, _Node):
            raise NotColumns("unexpected column")
        if node.name == "loads":
            return orjson.loads(self.raw(node))      # (what json.loads gives, faster)
        mapped = node.args[0] if node.args else None
        getter = mapped.args[0] if isinstance(mapped, _Node) and mapped.args else None
        if not (isinstance(getter, _Node) and getter.name == "getattr" and len(mapped.args) == 2):
            raise NotColumns("unexpected column")
        parts = _members(getter.args[0], [])
        if len(parts) != 1:
            raise NotColumns("unexpected vocabulary")
        codes = _members(mapped.args[1], [])
        # every member inflated here, so a damaged one is found when the file is loaded (load_columns: "damaged"),
        # never later by whoever reads it first; the vocabulary (parsed on first use) and a single codes member
        # are also kept compressed, and written back as they are when unchanged
        vocab_json = zlib.decompress(parts[0])
        kept = codes[0] if len(codes) == 1 and isinstance(mapped.args[1], _Node) and \
            mapped.args[1].name == "array" else None
        return Column(None, self.array(mapped.args[1], np.int32), vocab_json, parts[0], kept)


def _tree(data: bytes) -> _Node:
    """The calls of a pickle `dumps` wrote, recorded, not made; NotColumns for any other pickle."""
    try:
        root = _Reader(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise NotColumns(str(exc)) from exc
    if not (isinstance(root, _Node) and root.name == "Graph" and len(root.args) == 6):
        raise NotColumns("not a graph")
    return root


def loads(data: bytes) -> GraphColumns:
    """The columns of a pickle `dumps` wrote, without making the graph; NotColumns for any other pickle."""
    n, edges, _directed, _gattrs, vattrs, eattrs = _tree(data).args
    u = _Unpacker()
    e = u.array(edges, np.int64, 16).reshape(-1, 2) if edges != [] else np.zeros((0, 2), np.int64)
    weight = u.array(eattrs["weight"], np.float64)
    cols = GraphColumns(int(n), e, weight, {k: u.column(v) for k, v in vattrs.items()},
                        {k: u.column(v) for k, v in eattrs.items() if k != "weight"})
    cols.packed, cols.split = u.packed, u.split
    return cols


def _calls(node: Any, made: dict[int, Any]) -> Any:
    """What `_Reader` recorded, back as the calls `dumps` pickles (`made`: node id -> its call, given or made
    here; a node met twice is one call, as the pickle held one object)."""
    if isinstance(node, _Node):
        got = made.get(id(node))
        if got is None:
            args = [_calls(a, made) for a in node.args]
            got = made[id(node)] = _Call(*args) if node.name == "call" else _Call(_func(node.name), *args)
        return got
    if isinstance(node, (list, tuple)):
        return type(node)(_calls(a, made) for a in node)
    if isinstance(node, dict):
        return {k: _calls(v, made) for k, v in node.items()}
    return node


def _func(name: str) -> Any:
    import igraph

    return {"Graph": igraph.Graph, "list": list, "map": map, "getattr": getattr, "memoryview": memoryview,
            "loads": json.loads, "decompress": zlib.decompress, "array": array.array}[name]


def _is(node: Any, name: str, nargs: int) -> bool:
    return isinstance(node, _Node) and node.name == name and len(node.args) == nargs


def _two_parts(node: Any) -> list[_Node]:
    """The two members of an array `_array` stored split (array(code, b"".join([part, part])))."""
    joined = node.args[1] if _is(node, "array", 2) else None
    parts = joined.args[1] if _is(joined, "call", 2) and _is(joined.args[0], "getattr", 2) else None
    if not (isinstance(parts, list) and len(parts) == 2 and all(_is(p, "decompress", 1) for p in parts)):
        raise NotColumns("expected an array in two parts")
    return parts


class SynonymTail:
    """A graph.pkl `dumps` wrote, opened to replace its SYNONYM edges (the second part of every edge array) and
    written back with every other member as it was, still compressed. Why: a synonyms run changes only those
    edges, and inflating every member of a large graph to compress most of them back would cost more than the
    rest of the run. Only what is asked for is inflated (`head_edges`, `head_codes`, `vertex`): a
    member never inflated is never checked here, so the caller checks the whole file's hash first
    (`graph.intact`, on a file within artifacts.FULL_HASH_MAX). NotColumns when the file is not of that shape."""

    def __init__(self, data: bytes) -> None:
        n, edges, _directed, _gattrs, self._vattrs, self._eattrs = self._args = _tree(data).args
        eattrs = self._eattrs
        self.n = int(n)
        if edges == [] or set(eattrs) != {"kind", "weight", "key", "rel_type"}:
            raise NotColumns("no edges, or other edge columns")
        # edges: memoryview(array('q', ...)).cast('B').cast('q', (m, 2))
        outer = edges.args[0] if _is(edges, "call", 3) else None
        inner = outer.args[0] if _is(outer, "getattr", 2) and _is(outer.args[0], "call", 2) else None
        view = inner.args[0].args[0] if inner is not None and _is(inner.args[0], "getattr", 2) else None
        if not (_is(view, "memoryview", 1) and _is(view.args[0], "array", 2) and view.args[0].args[0] == "q"):
            raise NotColumns("unexpected edges")
        self._edges = edges
        self._parts = {"edges": _two_parts(view.args[0]), "weight": _two_parts(eattrs["weight"])}
        self._vocab: dict[str, bytes] = {}
        for k in ("kind", "key", "rel_type"):
            mapped = eattrs[k].args[0] if _is(eattrs[k], "list", 1) else None
            getter = mapped.args[0] if _is(mapped, "map", 2) else None
            vocab = getter.args[0] if _is(getter, "getattr", 2) else None
            if not (_is(vocab, "loads", 1) and _is(vocab.args[0], "decompress", 1)):
                raise NotColumns("unexpected column")
            self._vocab[k] = vocab.args[0].args[0]
            self._parts[k] = _two_parts(mapped.args[1])

    def head_edges(self) -> np.ndarray:
        """The edges of the first part (every edge but the SYNONYM ones), (m, 2)."""
        raw = zlib.decompress(self._parts["edges"][0].args[0])
        if len(raw) % 16:
            raise NotColumns("array bytes do not fit its type")
        return np.frombuffer(raw, dtype=np.int64).reshape(-1, 2)

    def head_codes(self, name: str) -> Column:
        """Edge column `name` over the first part's edges."""
        return Column(None, np.frombuffer(zlib.decompress(self._parts[name][0].args[0]), dtype=np.int32),
                      vocab_z=self._vocab[name])

    def vertex(self, name: str) -> Column | list:
        """Vertex column `name`."""
        return _Unpacker().column(self._vattrs[name])

    def dumps(self, edges: np.ndarray, weight: np.ndarray, values: dict[str, Any]) -> bytes:
        """The file with `edges` (k, 2), their `weight` and the one value of each edge column for all of them
        (`values`) as the second part, the first parts as they were: the bytes `dumps` gives those columns.
        NotColumns when a column's vocabulary lacks its value."""
        if {"edges", "weight", *values} != set(self._parts):
            raise ValueError("a value for every edge column")
        k = len(edges)
        packed = _Packed()
        packed.kept = {z: z for z in _members([self._edges, *self._vattrs.values(), *self._eattrs.values()], [])}
        raws = {"edges": np.ascontiguousarray(edges, dtype=np.int64).tobytes(),
                "weight": np.ascontiguousarray(weight, dtype=np.float64).tobytes()}
        for name, value in values.items():
            code = Column(None, None, vocab_z=self._vocab[name]).code(value)
            if code is None:
                raise NotColumns(f"no {value!r} in the {name} column's vocabulary")
            raws[name] = np.full(k, code, dtype=np.int32).tobytes()
        made = {id(self._parts[name][1]): _member(raw, packed) for name, raw in raws.items()}
        shape = self._edges.args[2]
        old_tail = len(zlib.decompress(self._parts["edges"][1].args[0])) // 16      # (small: the SYNONYM edges)
        if not (isinstance(shape, tuple) and len(shape) == 2 and isinstance(shape[0], int) and shape[0] >= old_tail):
            raise NotColumns("unexpected edges")
        # the node's own "q" (the pickle refers to the one object it wrote first)
        made[id(self._edges)] = _Call(_calls(self._edges.args[0], made), self._edges.args[1], (shape[0] - old_tail + k, 2))
        return _pickled(_calls(_Node("Graph", self._args), made))
