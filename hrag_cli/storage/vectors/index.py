"""`VectorIndex`: one named cosine index, its rows (dense or sparse), ids and text hashes, an HNSW graph
for a large dense index, and its files."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from hrag_cli.core import base_patch, store
from hrag_cli.core.config import VectorSettings
from hrag_cli.core.errors import HragError
from hrag_cli.storage.vectors.dense import DenseRows, dense_rows
from hrag_cli.storage.vectors.files import ReadAt, mapped_array, maps_whole
from hrag_cli.storage.vectors.ids import HashColumn, IdKeys, fixed_bytes, fixed_width
from hrag_cli.storage.vectors.layout import DTYPE, ROW_BAND, n_bands
from hrag_cli.storage.vectors.patch import PatchedKeys, PatchedRows, RowPatch
from hrag_cli.storage.vectors.search import exact_search
from hrag_cli.storage.vectors.sparse import SparseRows, build_postings, join_sparse, mostly_zero, sparse_rows
from hrag_cli.storage.vectors.splice import merge_rows, splice_keys, spliced_fixed

INDEX_NAMES = ("chunks", "entities", "relations", "facts")
FORMAT = 7                    # the files' layout (docs/formats.md); a format 6 index, the same without a patch
                              # segment, reads as a base without one
_READ_FORMATS = (6, 7)
_REBUILD_DELETED_FRACTION = 0.25
POSTED = ("chunks", "facts", "relations")   # the sparse indices saved with column postings (see `_posted`)


def _hnswlib():
    import hnswlib

    return hnswlib


def _as_matrix(x: np.ndarray, dim: int) -> np.ndarray:
    m = np.asarray(x, dtype=np.float32)
    if m.ndim == 1:
        m = m[None, :]
    if m.ndim != 2 or m.shape[1] != dim:
        raise ValueError(f"expected vectors of dimension {dim}, got shape {m.shape}")
    return np.ascontiguousarray(m)


def _unit(m: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    return m / np.where(norms > 0, norms, 1)


class VectorIndex:
    """One named cosine index: unit rows (float16) in id order, the text hash each came from, and for a large
    index an hnswlib graph whose label of row p is labels[p]."""

    def __init__(self, name: str, dim: int, settings: VectorSettings, model_id: str) -> None:
        self.name = name
        self.dim = int(dim)
        self.settings = settings
        self.model_id = model_id
        self.ids: list[str] = []          # live ids, in row order
        self.hashes: list[str] = []       # text hash per row
        self.labels: np.ndarray = np.zeros(0, dtype=np.int64)   # hnsw label per row (graph only)
        self.m = settings.m
        self.ef_construction = settings.ef_construction
        self._pos: dict[str, int] | None = None
        self._free = 0                    # tombstoned graph slots awaiting reuse
        self._next_label = 0
        self._index = None
        self._rows: DenseRows | SparseRows = DenseRows(np.zeros((0, self.dim), dtype=DTYPE))
        self._lut: np.ndarray | None = None
        self.synced = ""                  # what the rows were last brought up to date with (the caller's token)
        self._keys: tuple[np.ndarray, ...] | None = None     # IdKeys.arrays(ids), when known without listing ids
        self._hash_array: np.ndarray | None = None           # fixed_bytes(hashes), likewise
        self._fixed: tuple[np.ndarray, np.ndarray] | None = None   # (id blob, `fixed_width` of it): id_array
        self._patch: RowPatch | None = None  # rows kept beside the saved base (an incremental run's `insert`)
        self._saved: tuple[Path, dict] | None = None       # the folder and header of the base on disk

    # -- construction -----------------------------------------------------------------------------------
    @classmethod
    def create(cls, name: str, dim: int, settings: VectorSettings, model_id: str) -> "VectorIndex":
        return cls(name, dim, settings, model_id)

    @classmethod
    def load_or_create(cls, vectors_dir: Path, name: str, settings: VectorSettings, model_id: str,
                       dim: int) -> "VectorIndex":
        """The saved index when it was built by this embedder at this dimension (0: not known yet, any), else a
        fresh empty one."""
        try:
            idx = cls.load(vectors_dir, name, settings)
        except HragError:
            idx = None
        if idx is None or idx.model_id != model_id or (dim and idx.dim != dim and len(idx)):
            return cls.create(name, dim, settings, model_id)
        if not len(idx) and dim:
            idx.dim = dim
            idx._rows = DenseRows(np.zeros((0, dim), dtype=DTYPE))
        return idx

    @classmethod
    def build(cls, name: str, ids: list[str], matrix: np.ndarray, settings: VectorSettings, model_id: str,
              hashes: list[str] | None = None) -> "VectorIndex":
        idx = cls(name, int(np.asarray(matrix).shape[1]) if len(ids) else 0, settings, model_id)
        idx.sync(list(ids), list(hashes) if hashes is not None else [""] * len(ids), matrix)
        return idx

    def _uses_graph(self, n: int) -> bool:
        return n >= max(1, self.settings.exact_below)

    def missing(self, ids: list[str], hashes: list[str]) -> np.ndarray:
        """Positions in `ids` whose (id, hash) this index does not hold: the texts to embed before `sync`."""
        return np.flatnonzero(self.stored_rows(ids, hashes) < 0)

    def stored_rows(self, ids: Iterable[str], hashes: Iterable[str]) -> np.ndarray:
        """Per (id, hash), the row holding its vector (-1: none, or one made from another text)."""
        row = self.stored_row
        return np.fromiter((row(i, h) for i, h in zip(ids, hashes)), dtype=np.int64)

    def stored_row(self, item_id: str, text_hash: str) -> int:
        """The row with a vector for this id made from a text with this hash, else -1."""
        r = self._positions().get(item_id)
        return r if r is not None and self.hashes[r] == text_hash else -1

    def sync(self, ids: list[str], hashes: list[str], vectors, rows: np.ndarray | None = None,
             stored: np.ndarray | None = None) -> dict:
        """Make the index hold exactly `ids` in this order. `vectors` holds a row per id, or (with `rows`, as
        `missing` returned) a row per listed position only, the other rows being kept from the index (which
        must hold them). `vectors` may also be an iterator of row blocks in that order, so a caller can embed
        millions of texts without holding them all; a block may be SparseRows of unit rows (`sparse_rows` of
        an embedder's output), which a worker process can hand back at a fraction of the dense bytes. Returns
        counts: added, removed, kept, rebuilt (0/1: the graph was built from scratch). `stored` (`stored_rows`
        of the same ids and hashes, when the caller has it) spares a second lookup of every id."""
        n = len(ids)
        if len(set(ids)) != n:
            raise ValueError(f"index {self.name}: duplicate ids")
        self._fold()
        if stored is None or len(stored) != n:
            stored = self.stored_rows(ids, hashes)
        if rows is None:     # a full matrix: only the rows the index lacks are taken from it
            todo = np.flatnonzero(stored < 0)
            vectors = np.asarray(vectors)[todo] if n else vectors
        else:
            todo = np.asarray(rows, dtype=np.int64)
        blocks = iter([vectors]) if isinstance(vectors, np.ndarray) or not hasattr(vectors, "__next__") \
            else vectors
        first = next(blocks, None) if len(todo) else None
        if first is not None and self.dim == 0:
            self.dim = first.dim if isinstance(first, SparseRows) else int(np.asarray(first).shape[-1])
        is_new = np.zeros(n, dtype=bool)
        is_new[todo] = True
        lacking = np.flatnonzero(~is_new & (stored < 0))
        if len(lacking):
            raise ValueError(f"index {self.name}: no stored vector for {ids[lacking[0]]!r}; pass it in `vectors`")
        old_row = np.where(is_new, -1, stored)
        kept_rows = old_row[~is_new]
        gone = np.ones(len(self.ids), dtype=bool)
        gone[kept_rows] = False
        n_gone = int(gone.sum())

        head = [first]      # handed over, not kept here: each dense block goes once it is stored
        del first
        rows_store = self._store(n, todo, is_new, old_row, head, blocks)
        rebuilt = 0
        old_labels = self.labels
        labels = np.full(n, -1, dtype=np.int64)
        if not self._uses_graph(n) or rows_store.kind == "sparse":
            # sparse rows are scanned exactly at any size: an HNSW graph would hold every vector dense (8 KB at
            # 2048 dims), more than the whole sparse index
            self._index, self._free, self._next_label = None, 0, 0
        elif (self._index is None or self.m != self.settings.m or self.ef_construction != self.settings.ef_construction
              or (self._free + n_gone) > _REBUILD_DELETED_FRACTION * max(n, 1)):
            self._build_graph(rows_store)
            labels = np.arange(n, dtype=np.int64)
            rebuilt = 1
        else:
            for lab in old_labels[gone]:
                self._index.mark_deleted(int(lab))
            self._free += n_gone
            labels[~is_new] = old_labels[kept_rows]
            labels[todo] = np.arange(self._next_label, self._next_label + len(todo), dtype=np.int64)
            self._next_label += len(todo)
            reuse = min(self._free, len(todo))
            needed = self._index.get_current_count() + len(todo) - reuse
            if needed > self._index.get_max_elements():
                self._index.resize_index(max(needed, int(self._index.get_max_elements() * 1.5)))
            # replace_deleted reuses tombstoned slots first, so memory stays bounded by the live count
            for s in range(0, len(todo), dense_rows(self.dim)):
                part = todo[s:s + dense_rows(self.dim)]
                self._index.add_items(rows_store.dense(part), labels[part], replace_deleted=True)
            self._free -= reuse
        self.ids, self.hashes, self.labels = list(ids), list(hashes), labels
        self._rows, self._lut, self._pos, self._keys, self._hash_array = rows_store, None, None, None, None
        return {"added": len(todo), "removed": n_gone, "kept": n - len(todo), "rebuilt": rebuilt}

    @staticmethod
    def insert_positions(n_old: int, old_rows: np.ndarray, before: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the final row of each id listed for `insert`, the final row of each old row)."""
        old_rows, before = np.asarray(old_rows, dtype=np.int64), np.asarray(before, dtype=np.int64)
        ins = old_rows < 0
        k = int(ins.sum())
        if bool((before[ins] > n_old).any()) or bool((before[ins] < 0).any()):
            raise ValueError("an id is inserted ahead of a row the index does not have")
        ahead = np.cumsum(np.bincount(before[ins], minlength=n_old + 1))        # inserted at or before old row r
        moved = np.arange(n_old, dtype=np.int64) + ahead[:n_old]                 # old row -> its new row
        pos = np.empty(len(old_rows), dtype=np.int64)
        pos[ins] = before[ins] + np.arange(k)
        pos[~ins] = moved[old_rows[~ins]]
        if len(pos) and (bool((np.diff(pos) <= 0).any()) or int(pos[-1]) >= n_old + k):
            raise ValueError("ids to insert must be listed in their final order")
        return pos, moved

    def id_array(self) -> np.ndarray:
        """The ids in row order as fixed-width bytes (`fixed_width`), from the saved arrays (a patched index:
        spliced from its base's)."""
        if self._patch is not None:
            return self._patch.id_array()
        blob, off = self._key_arrays(order=False)[:2]
        if self._fixed is None or self._fixed[0] is not blob:
            self._fixed = (blob, fixed_width(blob, off))
        return self._fixed[1]

    def id_order(self) -> np.ndarray:
        """Rows in id order (bytes)."""
        return np.asarray(self._key_arrays()[2], dtype=np.int64)

    def _key_arrays(self, order: bool = True) -> tuple[np.ndarray, ...]:
        """`IdKeys.arrays` of the ids in row order (a patched index: spliced from its base's and its patch's;
        without `order`, the blob and offsets alone)."""
        if self._patch is not None:
            return self._patch.keys(order)
        return self._keys or IdKeys.arrays(self.ids)

    def hash_array(self) -> np.ndarray:
        """The text hashes in row order as fixed-width bytes (`fixed_bytes`), from the saved array."""
        if self._patch is not None:
            return self._patch.hash_array()
        return self._hash_array if self._hash_array is not None else fixed_bytes(self.hashes)

    def hash_rows(self, rows: np.ndarray) -> list[str]:
        """The text hash of each of these rows ("" for -1)."""
        rows = np.asarray(rows, dtype=np.int64)
        at = np.maximum(rows, 0)
        if self._patch is not None:          # these rows' hashes alone, without splicing every row's
            got = self._patch.hashes_of(at).tolist() if len(self) else [b""] * len(rows)
        else:
            arr = self.hash_array()
            got = arr[at].tolist() if len(arr) else [b""] * len(rows)
        return [h.decode("utf-8") if r >= 0 else "" for h, r in zip(got, rows.tolist())]

    def insertable(self) -> bool:
        """Whether `insert` can take rows: a saved index without a graph (sparse rows, or dense under
        exact_below), its id and hash arrays at hand, its postings mapped (not read by `ReadAt`)."""
        read_at = self._rows.kind == "sparse" and any(isinstance(a, ReadAt) for a in (self._rows.postings or ()))
        saved = self._patch is not None or (self._keys is not None and self._hash_array is not None)
        return self._index is None and saved and not read_at and \
            (self._rows.kind == "sparse" or not self._uses_graph(len(self)))

    def insert(self, ids: list[str], hashes: list[str], old_rows: np.ndarray, before: np.ndarray, vectors
               ) -> dict:
        """Rows for `ids` (made from texts with `hashes`), listed in their final order: one whose old_rows entry
        is a row of the index is made again in place, one with -1 is inserted ahead of old row before[i]
        (len(self): at the end). `vectors` as `sync` takes them, a row per listed id. Every other row is kept
        where it was, and the id blob, its sorted order and the hash array are spliced, so an index of millions
        of rows takes a few thousand without a Python object per row (ids stay `IdKeys`).

        A sparse index keeps the rows in a `RowPatch` beside its saved base (saving writes the patch alone) until
        the patch passes `base_patch.VECTOR_INDEX` of the base's rows; then, and for a dense index, every array is spliced."""
        if not self.insertable():
            raise ValueError(f"index {self.name}: insert needs a saved index without a graph")
        old_rows, before = np.asarray(old_rows, dtype=np.int64), np.asarray(before, dtype=np.int64)
        ins = old_rows < 0
        n_old = len(self)
        n = n_old + int(ins.sum())
        pos, moved = self.insert_positions(n_old, old_rows, before)
        blocks = iter([vectors]) if isinstance(vectors, np.ndarray) or not hasattr(vectors, "__next__") \
            else vectors
        first = next(blocks, None) if len(pos) else None
        counts = {"added": len(pos), "removed": 0, "kept": n - len(pos), "rebuilt": 0}
        enc = [i.encode("utf-8") for i in ids]
        if self._rows.kind == "sparse" and self._saved is not None and \
                (first is None or isinstance(first, SparseRows) or mostly_zero(_as_matrix(first, self.dim))):
            head = [first]
            del first
            new = join_sparse(list(self._incoming(len(pos), head, blocks, True)), self.dim)
            patch = (self._patch if self._patch is not None else self._empty_patch()).spliced(
                pos, old_rows, moved, enc, [h.encode("utf-8") for h in hashes], new)
            if len(patch):                   # nothing to put in: the index stays as it is
                self._use_patch(patch)
            if base_patch.VECTOR_INDEX.folds(len(patch), patch.n_base):
                self._fold()
            return counts
        self._fold()
        is_new = np.zeros(n, dtype=bool)
        is_new[pos] = True
        old_of = np.full(n, -1, dtype=np.int64)
        old_of[moved] = np.arange(n_old, dtype=np.int64)
        old_of[pos] = -1
        head = [first]
        del first
        rows_store = self._store(n, pos, is_new, old_of, head, blocks)
        old_fixed = self.id_array()
        blob, off, order = self._keys                                           # type: ignore[misc]
        keys = splice_keys(blob, off, order, is_new, old_of, moved, pos, ins, enc, old_fixed)
        fixed = spliced_fixed(old_fixed, is_new, old_of, pos, enc)
        hash_arr = spliced_fixed(self._hash_array, is_new, old_of, pos,          # type: ignore[arg-type]
                                 [h.encode("utf-8") for h in hashes])
        self.ids, self.hashes = IdKeys(*keys), HashColumn(hash_arr)              # type: ignore[assignment]
        self._keys, self._hash_array, self._fixed = keys, hash_arr, (keys[0], fixed)
        self.labels = np.full(n, -1, dtype=np.int64)
        self._rows, self._lut, self._pos = rows_store, None, None
        return counts

    def _empty_patch(self) -> RowPatch:
        """A patch of nothing over this saved index."""
        rows = self._rows
        assert self._saved is not None and self._keys is not None and self._hash_array is not None
        assert isinstance(rows, SparseRows)
        return RowPatch(self._saved[0], self._saved[1], self._keys, self._hash_array, rows, np.zeros(0, np.int64),
                        np.zeros(0, np.int64), [], [], join_sparse([], self.dim))

    def _use_patch(self, patch: RowPatch) -> None:
        """Present the base and `patch` as the index (ids, hashes, rows in logical order)."""
        self._patch = patch
        self._keys, self._hash_array, self._fixed = patch.base_keys, patch.base_hashes, None
        self.ids = PatchedKeys(IdKeys(*patch.base_keys[:3]), patch)           # type: ignore[assignment]
        self.hashes = HashColumn(None, patch.hash_array)                     # type: ignore[assignment]
        self.labels = np.full(patch.n, -1, dtype=np.int64)
        self._rows, self._lut, self._pos = PatchedRows(patch), None, None

    def _fold(self) -> None:
        """A patched index made one whole index in memory (the next save writes every array). Every caller is
        about to make the index differ from the base on disk, so that base is forgotten: a later `insert` must
        not tag a patch with it (a load would apply the patch to the wrong rows)."""
        self._saved = None
        if self._patch is None:
            return
        keys, hashes, rows = self._patch.folded()
        self._patch = None
        self.ids, self.hashes = IdKeys(*keys), HashColumn(hashes)            # type: ignore[assignment]
        self._keys, self._hash_array, self._fixed = keys, hashes, None
        self._rows, self._lut, self._pos = rows, None, None

    def _incoming(self, count: int, head: list, blocks, sparse: bool) -> Iterator[SparseRows | np.ndarray]:
        """The `count` rows to add, yielded block by block as unit rows (sparse rows, or dense blocks) so a dense
        build writes each block as it arrives; the counts are checked as they come and once the blocks end.
        `head` holds the first block, taken out here: no block, nor its dense unit copy, is still referenced
        while the next one is embedded."""
        done = 0
        block = head.pop()
        while block is not None:
            if isinstance(block, SparseRows) and block.dim != self.dim:
                raise ValueError(f"expected vectors of dimension {self.dim}, got {block.dim}")
            b = block if isinstance(block, SparseRows) and sparse else _unit(_as_matrix(
                block.dense(np.arange(len(block))) if isinstance(block, SparseRows) else block, self.dim))
            del block
            if done + len(b) > count:
                raise ValueError(f"index {self.name}: more vectors than the {count} rows to add")
            out = (b if isinstance(b, SparseRows) else sparse_rows(b)) if sparse else b
            done += len(b)
            del b
            yield out
            del out
            block = next(blocks, None)
        if done != count:
            raise ValueError(f"index {self.name}: {count} rows to add, {done} vectors given")

    def _store(self, n: int, todo: np.ndarray, is_new: np.ndarray, old_row: np.ndarray, head: list, blocks
               ) -> DenseRows | SparseRows:
        """The new rows in `ids` order: kept rows from the current store, the rest from the incoming blocks
        (`head`: the first, handed on to `_incoming`). Sparse when the first incoming block (else the current
        store) is `mostly_zero`."""
        first = head.pop()
        if isinstance(first, SparseRows):
            b0, sparse = first, True
        elif first is not None:
            b0 = _as_matrix(first, self.dim)
            sparse = mostly_zero(b0)
        else:
            b0, sparse = None, self._rows.kind == "sparse"
        kept = np.flatnonzero(~is_new)
        done = 0
        dense_out = None if sparse else np.empty((n, self.dim), dtype=DTYPE)
        old_rows, old_of = self._rows, old_row      # where kept rows come from: a store and a row per position
        if sparse and self._rows.kind != "sparse" and len(kept):   # dense to sparse (rare): convert the kept rows
            step = dense_rows(self.dim)
            old_rows = join_sparse([sparse_rows(self._rows.dense(old_row[kept[s:s + step]]))
                                    for s in range(0, len(kept), step)], self.dim)
            old_of = np.full(n, -1, dtype=np.int64)
            old_of[kept] = np.arange(len(kept))
        elif not sparse:
            for s in range(0, len(kept), dense_rows(self.dim)):   # kept rows, in blocks (old may be a memmap)
                pos = kept[s:s + dense_rows(self.dim)]
                dense_out[pos] = self._rows.dense(old_row[pos])
        head.append(b0)
        del first, b0
        got = self._incoming(len(todo), head, blocks, sparse)
        if sparse:
            return merge_rows(is_new, old_rows, old_of, join_sparse(list(got), self.dim))  # type: ignore[arg-type]
        for b in got:                                 # each dense block written as it arrives
            dense_out[todo[done:done + len(b)]] = b
            done += len(b)
        return DenseRows(dense_out)

    def _build_graph(self, rows_store: DenseRows | SparseRows) -> None:
        n = len(rows_store)
        self.m, self.ef_construction = self.settings.m, self.settings.ef_construction
        index = _hnswlib().Index(space="cosine", dim=self.dim)
        index.init_index(max_elements=max(n, 16), M=self.m, ef_construction=self.ef_construction,
                         random_seed=100, allow_replace_deleted=True)
        index.set_ef(max(self.settings.ef_search, 16))
        step = dense_rows(self.dim)
        for s in range(0, n, step):                  # float32 copies one block at a time; every core inserts
            rows = np.arange(s, min(n, s + step), dtype=np.int64)
            index.add_items(rows_store.dense(rows), rows, num_threads=os.cpu_count() or 1)
        self._index, self._free, self._next_label = index, 0, n

    # -- reading ----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.ids)

    def _positions(self) -> dict[str, int]:
        if self._pos is None:
            self._pos = {i: p for p, i in enumerate(self.ids)}
        return self._pos

    def position(self, item_id: str) -> int | None:
        """The row of an id; a query's index (ids memory-mapped, `IdKeys`) searches its sorted ids instead of
        building the map of every id."""
        if self._pos is None and isinstance(self.ids, (IdKeys, PatchedKeys)):
            return self.ids.position(item_id)
        return self._positions().get(item_id)

    def rows(self) -> DenseRows | SparseRows:
        """The stored unit rows as they are kept (sparse rows stay sparse), row i = self.ids[i]; a patched
        index's spliced in memory (the synonyms stage reads every name row)."""
        if self._patch is not None:
            return self._patch.merged_rows()
        return self._rows

    def vectors(self) -> np.ndarray:
        """All live vectors (unit rows, float16), row i = self.ids[i]: memory-mapped when stored dense."""
        if self._rows.kind == "dense":
            return self._rows.matrix
        return self._rows.dense(np.arange(len(self.ids))).astype(DTYPE)

    def scores(self, query: np.ndarray) -> np.ndarray:
        """float32 (len,): the cosine of one query with every row, exact (ppr and naive score every chunk)."""
        q = _as_matrix(query, self.dim)
        out = np.empty(len(self.ids), dtype=np.float32)
        for s, sims in self._rows.blocks(q):
            out[s:s + sims.shape[1]] = sims[0]
        return out

    def search(self, queries: np.ndarray, k: int, ef: int | None = None) -> tuple[list[list[str]], np.ndarray]:
        """Top-k ids by cosine per query, best first; exact unless the index has a graph (>= exact_below
        items). `ef` overrides settings.ef_search for this call."""
        q = _as_matrix(queries, self.dim)
        n = len(self.ids)
        k = int(k)
        sims_out = np.full((len(q), max(k, 0)), -np.inf, dtype=np.float32)
        if n == 0 or k <= 0:
            return [[] for _ in range(len(q))], sims_out
        kk = min(k, n)
        if self._index is None:
            rows, sims = exact_search(self._rows, q, kk)
        else:
            rows, sims = self._hnsw_search(q, kk, ef or self.settings.ef_search)
        ids_out: list[list[str]] = []
        for r in range(len(q)):
            valid = rows[r] >= 0
            found = [int(p) for p in rows[r][valid]]
            ids_out.append([self.ids[p] for p in found])
            sims_out[r, : int(valid.sum())] = sims[r][valid]
        return ids_out, sims_out

    def _hnsw_search(self, q: np.ndarray, k: int, ef: int) -> tuple[np.ndarray, np.ndarray]:
        self._index.set_ef(max(ef, k))
        try:
            labels, dists = self._index.knn_query(q, k=k)
        except RuntimeError:
            # hnswlib refuses when it cannot fill k results (tombstones, tiny ef): answer exactly instead
            return exact_search(self._rows, q, k)
        rows = self._label_rows()[labels.astype(np.int64)]
        return rows, (1.0 - dists).astype(np.float32)

    def _label_rows(self) -> np.ndarray:
        """label -> row in self.ids (-1 for tombstones), as an array so a million results map in one gather."""
        if self._lut is None:
            top = max(self._next_label, int(self.labels.max(initial=-1)) + 1)
            lut = np.full(top, -1, dtype=np.int64)
            lut[self.labels] = np.arange(len(self.labels), dtype=np.int64)
            self._lut = lut
        return self._lut

    # -- persistence ------------------------------------------------------------------------------------
    def _posted(self) -> bool:
        """Whether the index is saved by column (postings, its values once): sparse rows that ppr and naive
        search (facts, chunks; relations when embedded). Not the entities (local/hybrid/mix only, and the most
        values of all) nor the synonym stage's name vectors, which the synonyms stage reads row by row: a
        posted index's rows are derived from its columns on each such load."""
        return self._rows.kind == "sparse" and len(self.ids) > 0 and self.name in POSTED

    @staticmethod
    def paths(vectors_dir: Path, name: str) -> tuple[Path, Path]:
        return Path(vectors_dir) / f"{name}.hnsw", Path(vectors_dir) / f"{name}.ids.jsonl"

    @staticmethod
    def matrix_path(vectors_dir: Path, name: str) -> Path:
        """The dense float16 rows."""
        return Path(vectors_dir) / f"{name}.f16.npy"

    @staticmethod
    def sparse_paths(vectors_dir: Path, name: str) -> tuple[Path, Path, Path, Path]:
        """The sparse rows: row starts, column bytes, values per band, float16 values."""
        d = Path(vectors_dir)
        return (d / f"{name}.csr-indptr.npy", d / f"{name}.csr-cols.npy", d / f"{name}.csr-bands.npy",
                d / f"{name}.csr-data.npy")

    @staticmethod
    def query_paths(vectors_dir: Path, name: str) -> tuple[Path, ...]:
        """What a query reads instead of parsing the id map or scanning every value: the ids (UTF-8 blob,
        offsets, rows in id order) and, for sparse rows, the column postings (starts, rows, float16 values)."""
        d = Path(vectors_dir)
        return (d / f"{name}.keys.npy", d / f"{name}.koff.npy", d / f"{name}.korder.npy",
                d / f"{name}.csc-ptr.npy", d / f"{name}.csc-rows.npy", d / f"{name}.csc-bands.npy",
                d / f"{name}.csc-data.npy")

    @staticmethod
    def row_paths(vectors_dir: Path, name: str) -> tuple[Path, Path]:
        """The text hash of each row (fixed-width bytes) and, for an index with a graph, each row's label."""
        d = Path(vectors_dir)
        return d / f"{name}.hashes.npy", d / f"{name}.labels.npy"

    @classmethod
    def files(cls, vectors_dir: Path, name: str) -> list[Path]:
        """Every file of one index, including format 1's <name>.npy and format 2's two-byte columns, for
        removal."""
        d = Path(vectors_dir)
        return [*cls.paths(vectors_dir, name), cls.matrix_path(vectors_dir, name),
                *cls.sparse_paths(vectors_dir, name), *cls.query_paths(vectors_dir, name),
                *cls.row_paths(vectors_dir, name), cls.patch_path(vectors_dir, name), d / f"{name}.npy",
                d / f"{name}.csr-indices.npy"]

    @staticmethod
    def patch_path(vectors_dir: Path, name: str) -> Path:
        """The patch segment beside the base (`RowPatch`)."""
        return Path(vectors_dir) / f"{name}.patch.npz"

    def save(self, vectors_dir: Path) -> None:
        """Matrix and graph first, each temp + rename, then the id map that vouches for them (atomic). A
        patched index saved where its base is writes its patch and the id map alone."""
        hnsw_path, ids_path = self.paths(vectors_dir, self.name)
        if self._patch is not None:
            if self._save_patch(vectors_dir):
                return
            self._fold()
        hnsw_path.parent.mkdir(parents=True, exist_ok=True)
        size = 0
        if self._index is not None:
            with store.atomic_path(hnsw_path) as tmp:
                self._index.save_index(str(tmp))
                size = os.path.getsize(tmp)
        else:
            hnsw_path.unlink(missing_ok=True)
        rs = self._rows
        posted = self._posted()
        if rs.kind == "dense":
            arrays = [(self.matrix_path(vectors_dir, self.name), rs.matrix)]
        elif posted:        # the values once, by column (the postings below); the row starts give each row's size
            arrays = [(self.sparse_paths(vectors_dir, self.name)[0], rs.indptr)]
        else:
            arrays = list(zip(self.sparse_paths(vectors_dir, self.name), (rs.indptr, rs.low, rs.bands, rs.data)))
        postings = (rs.postings if rs.by_column_only else build_postings(rs)) if posted else ()
        query = [*(self._keys or IdKeys.arrays(self.ids)), *postings]
        arrays += list(zip(self.query_paths(vectors_dir, self.name), query))
        hashes = self.hash_array()
        arrays += list(zip(self.row_paths(vectors_dir, self.name), (hashes, self.labels)[:2 if self._index else 1]))
        for path, arr in arrays:
            if maps_whole(arr, path):     # that very file (an insert of nothing): its bytes are already there
                continue
            with store.atomic_writer(path) as fh:
                np.save(fh, np.ascontiguousarray(arr), allow_pickle=False)
        written = {path for path, _ in arrays}
        for path in self.files(vectors_dir, self.name)[2:]:       # the other storage's and format 1's files
            if path not in written:
                path.unlink(missing_ok=True)
        header = {"_meta": {"format": FORMAT, "name": self.name, "dim": self.dim, "model_id": self.model_id,
                            "space": "cosine", "m": self.m, "ef_construction": self.ef_construction,
                            "count": len(self.ids), "free": self._free, "next_label": self._next_label,
                            "hnsw_bytes": size, "matrix_rows": len(self.ids), "storage": rs.kind,
                            "values": int(rs.matrix.size if rs.kind == "dense" else rs.values),
                            "key_bytes": len(query[0]), "synced": self.synced}}
        store.write_jsonl(ids_path, [header], compress=True)
        self._keys, self._hash_array = tuple(query[:3]), hashes
        self._saved = (Path(vectors_dir), header["_meta"])

    def _save_patch(self, vectors_dir: Path) -> bool:
        """The patch, then the id map naming it (its base's header, the patch's size and rows); False when the
        folder does not hold the patch's base (the caller saves the index whole)."""
        patch = self._patch
        assert patch is not None
        ids_path = self.paths(vectors_dir, self.name)[1]
        try:
            if not os.path.samefile(self.row_paths(vectors_dir, self.name)[0],
                                    self.row_paths(patch.base_dir, self.name)[0]):
                return False
        except OSError:
            return False
        path = self.patch_path(vectors_dir, self.name)
        with store.atomic_path(path) as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, **patch.arrays())
            size = os.path.getsize(tmp)
        meta = {**patch.meta, "format": FORMAT, "synced": self.synced,
                "patch": {"rows": len(patch), "count": patch.n, "bytes": size}}
        store.write_jsonl(ids_path, [{"_meta": meta}], compress=True)
        return True

    def digest(self) -> str:
        """A digest of the ids and text hashes in row order (the synonyms stage's output digest), from their
        arrays: the same for an index brought up to date by `insert` as for a fresh build."""
        import hashlib

        keys = self._key_arrays(order=False)
        hashes = self.hash_array()
        h = hashlib.blake2b(digest_size=12)
        for arr in (keys[0], keys[1], np.frombuffer(hashes.dtype.str.encode(), np.uint8), hashes):
            h.update(np.ascontiguousarray(arr).view(np.uint8).data)
        return h.hexdigest()

    @classmethod
    def load(cls, vectors_dir: Path, name: str, settings: VectorSettings,
             lazy_ids: bool = False, read_at: bool | None = None) -> "VectorIndex | None":
        """The saved index, or None when it was never built. A damaged set or an earlier format raises
        HragError naming the fix. `lazy_ids` (a query, which never writes): the ids are the memory-mapped
        `IdKeys` and the hashes are decoded only if asked for. The id map is its header alone (format 6): the
        ids, hashes and labels are arrays, so neither a query nor a writer parses a line per row. `read_at`
        (default: as `lazy_ids`) reads the postings by `ReadAt` instead of mapping them; an incremental sync
        loads lazily but maps them (it reads them all)."""
        hnsw_path, ids_path = cls.paths(vectors_dir, name)
        if not ids_path.exists():
            return None
        header = next(iter(store.read_jsonl(ids_path)), None)
        meta = header.get("_meta") if isinstance(header, dict) else None
        if not meta or meta.get("format") not in _READ_FORMATS:
            raise HragError(f"{ids_path} is damaged or from another version; run 'hrag synonyms' to rebuild it")
        try:   # a hand-edited or damaged id map: missing keys or wrong types
            idx = cls(name, int(meta["dim"]), settings, str(meta.get("model_id", "")))
            idx.m, idx.ef_construction = int(meta["m"]), int(meta["ef_construction"])
            graph = bool(meta.get("hnsw_bytes"))
            count = int(meta["count"])
            idx.synced = str(meta.get("synced", ""))
            query = cls._load_query_arrays(vectors_dir, name, meta, count, idx.dim,
                                           read_at=lazy_ids if read_at is None else read_at)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise HragError(f"{ids_path} is damaged; run 'hrag synonyms' to rebuild it") from None
        hashes, labels = cls._load_row_arrays(vectors_dir, name, count, graph)
        idx.ids, idx.hashes = IdKeys(*query[:3]), HashColumn(hashes)         # type: ignore[assignment]
        idx._keys, idx._hash_array = tuple(query[:3]), hashes
        if int(meta.get("matrix_rows", -1)) != count:
            raise HragError(f"{ids_path} is truncated; run 'hrag synonyms' to rebuild it")
        idx.labels = np.asarray(labels, dtype=np.int64) if graph else np.full(count, -1, dtype=np.int64)
        idx._free = int(meta.get("free", 0))
        idx._next_label = int(meta.get("next_label", 0))
        idx._rows = cls._load_rows(vectors_dir, name, meta, count, idx.dim, query[3:])
        idx._saved = (Path(vectors_dir), {k: v for k, v in meta.items() if k != "patch"})
        if meta.get("patch"):
            if graph or not isinstance(idx._rows, SparseRows):
                raise HragError(f"{ids_path} is damaged; run 'hrag synonyms' to rebuild it")
            try:
                patch = RowPatch.load(cls.patch_path(vectors_dir, name), meta["patch"], Path(vectors_dir),
                                   idx._saved[1], idx._keys, hashes, idx._rows, idx.dim)
            except (OSError, ValueError, TypeError, AttributeError):   # AttributeError: "patch" not a dict
                raise HragError(f"the patch of index {name} in {vectors_dir} is damaged or does not match its "
                                f"id map; run 'hrag synonyms' to rebuild it") from None
            idx._use_patch(patch)
            if not lazy_ids:                 # a writer that lists every id: the whole index in memory
                idx._fold()
        if not lazy_ids:                     # listed once, after any patch is folded in
            idx.ids, idx.hashes = idx.ids._listed(), idx.hashes._listed()          # type: ignore[attr-defined]
        if graph:
            if not hnsw_path.exists() or hnsw_path.stat().st_size != int(meta["hnsw_bytes"]):
                raise HragError(f"{hnsw_path} does not match its id map; run 'hrag synonyms' to rebuild it")
            index = _hnswlib().Index(space="cosine", dim=idx.dim)
            try:
                index.load_index(str(hnsw_path), allow_replace_deleted=True)
            except (RuntimeError, OSError, ValueError) as exc:   # right size, wrong bytes
                raise HragError(f"{hnsw_path} is damaged ({exc}); run 'hrag synonyms' to rebuild it") from None
            index.set_ef(max(settings.ef_search, 16))
            idx._index = index
        return idx

    @classmethod
    def _load_query_arrays(cls, vectors_dir: Path, name: str, meta: dict, count: int,
                           dim: int, read_at: bool = False) -> tuple[np.ndarray, ...]:
        """The ids' blob, offsets and order, then (sparse rows) the postings, memory-mapped and checked
        against the id map's header. `read_at` (a query): the postings' rows and values are read column by
        column (`ReadAt`) instead of mapped."""
        paths = cls.query_paths(vectors_dir, name)
        sparse = meta.get("storage") == "sparse" and count > 0 and name in POSTED   # as `_posted`
        try:
            arrays = tuple(mapped_array(p) if not (read_at and i in (4, 6)) else ReadAt(p)
                           for i, p in enumerate(paths[:7 if sparse else 3]))
        except (OSError, ValueError, EOFError):
            arrays = ()
        values, key_bytes = int(meta.get("values", -1)), int(meta.get("key_bytes", -1))
        ok = len(arrays) >= 3 and arrays[0].shape == (key_bytes,) and arrays[1].shape == (count + 1,) \
            and arrays[2].shape == (count,) and (not count or int(arrays[1][-1]) == key_bytes)
        if sparse and ok:
            ptr, plow, pbands, pdata = arrays[3:]
            ok = (ptr.shape == (dim + 1,) and plow.shape == pdata.shape == (values,) and plow.dtype == np.uint16
                  and pbands.shape == (dim, max(1, -(-count // ROW_BAND))) and pbands.dtype == np.uint32
                  and pdata.dtype == DTYPE and int(ptr[-1]) == values
                  # each column's band counts fill its run: a search adds band offsets run by run, so counts
                  # that do not add up would put rows in the wrong band without an error (the counts are small)
                  and np.array_equal(np.asarray(pbands).sum(axis=1, dtype=np.int64), np.diff(np.asarray(ptr))))
        if not ok:
            raise HragError(f"the id keys or postings of index {name} in {vectors_dir} do not match its id map; "
                            f"run 'hrag synonyms' to rebuild it")
        return arrays

    @classmethod
    def _load_row_arrays(cls, vectors_dir: Path, name: str, count: int, graph: bool
                         ) -> tuple[np.ndarray, np.ndarray | None]:
        """The rows' text hashes and (graph) labels, memory-mapped and checked against the id map's count."""
        paths = cls.row_paths(vectors_dir, name)
        try:
            arrays = [np.load(p, mmap_mode="r", allow_pickle=False) for p in paths[:2 if graph else 1]]
        except (OSError, ValueError, EOFError):
            arrays = []
        if len(arrays) != (2 if graph else 1) or arrays[0].shape != (count,) or arrays[0].dtype.kind != "S" \
                or (graph and (arrays[1].shape != (count,) or arrays[1].dtype != np.int64)):
            raise HragError(f"the text hashes of index {name} in {vectors_dir} do not match its id map; "
                            f"run 'hrag synonyms' to rebuild it")
        return arrays[0], (arrays[1] if graph else None)

    @classmethod
    def _load_rows(cls, vectors_dir: Path, name: str, meta: dict, count: int, dim: int,
                   postings: tuple[np.ndarray, ...] = ()) -> DenseRows | SparseRows:
        """The rows, memory-mapped (a query touches only the pages it scores); checked against the id map. A
        posted index (`postings`, checked by _load_query_arrays) keeps only its row starts beside them."""
        if not count:
            return DenseRows(np.zeros((0, dim), dtype=DTYPE))
        sparse = meta.get("storage") == "sparse"
        paths = cls.sparse_paths(vectors_dir, name) if sparse else (cls.matrix_path(vectors_dir, name),)
        try:
            arrays = [mapped_array(p) for p in paths[:1 if postings else None]]
        except (OSError, ValueError, EOFError):   # numpy reads an empty file as EOFError
            arrays = []
        values = int(meta.get("values", -1))
        if sparse and postings and len(arrays) == 1:
            indptr = arrays[0]
            if indptr.shape == (count + 1,) and int(indptr[-1]) == values and int(indptr[0]) == 0:
                return SparseRows.from_postings(indptr, postings, dim)
        elif sparse and len(arrays) == 4:
            indptr, low, bands, data = arrays
            if (indptr.shape == (count + 1,) and len(low) == len(data) == values and data.dtype == DTYPE
                    and low.dtype == np.uint8 and bands.shape == (count, n_bands(dim)) and int(indptr[-1]) == values):
                return SparseRows(indptr, low, bands, data, dim)
        elif not sparse and len(arrays) == 1 and arrays[0].shape == (count, dim) and arrays[0].dtype == DTYPE:
            return DenseRows(arrays[0])
        raise HragError(f"the vectors of index {name} in {vectors_dir} do not match its id map; "
                        f"run 'hrag synonyms' to rebuild it")
