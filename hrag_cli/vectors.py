"""hnswlib cosine indices with id maps: the four vector indices of DESIGN.md §5.

API (the query stage codes against this):

    from hrag_cli.vectors import VectorIndex, INDEX_NAMES      # ("chunks", "entities", "relations", "facts")
    idx = VectorIndex.load(project.vectors_dir, "chunks", settings.vectors)   # None when never built
    idx.model_id            # embedder model_id the vectors came from; compare with get_embedder(...).model_id
    idx.dim, len(idx), idx.ids (list[str], id order)
    ids, sims = idx.search(queries, k, ef=None)   # queries float32 (nq, dim) or (dim,); ids: list[list[str]] (nq lists,
                                         # each <= k, best first); sims: float32 (nq, k) cosine, -inf padded
    idx.vectors()           # float32 (len, dim): every live vector in idx.ids order (exact dense scoring)
    idx.position(id) -> int | None       # row of an id in idx.ids / idx.vectors()

Writers (the synonyms stage):

    idx = VectorIndex.create("chunks", dim, settings.vectors, model_id)
    counts = idx.sync(ids, hashes, matrix)   # make the index hold exactly these ids with these vectors
    idx.save(project.vectors_dir)            # vectors/<name>.hnsw + vectors/<name>.ids.jsonl, both atomic

Why it is shaped this way:
- Items are keyed by (id, hash of the embedded text), so `sync` adds only new or changed items to the live
  HNSW graph instead of rebuilding it. Removed or changed items are `mark_deleted` and their slots reused by
  later additions (`allow_replace_deleted`): a document edit costs a few graph insertions, not a rebuild. When
  deleted slots exceed a quarter of the index, or the embedder/dimension/M/ef_construction changed, `sync`
  rebuilds from scratch, since search quality of HNSW drifts with many tombstones.
- Below `exact_below` live items search is a plain matrix product: exact, and faster than HNSW at that size.
- Saving goes through a temp file in the same folder and os.replace for both files; the ids file is written
  last and names the hnsw file's checksum-free size, so a crash between the two renames is detected at load
  (size mismatch) and reported as "rebuild with hrag synonyms" instead of returning wrong ids.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from . import store
from .config import VectorSettings
from .errors import HragError

INDEX_NAMES = ("chunks", "entities", "relations", "facts")
FORMAT = 1
_REBUILD_DELETED_FRACTION = 0.25


# Indices whose whole matrix is saved beside the graph as <name>.npy: ppr and naive score every chunk densely,
# and reading a large matrix back out of hnswlib item by item costs ~0.5 ms a vector.
MATRIX_SAVED = frozenset({"chunks"})


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


def exact_topk(matrix: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact cosine top-k of unit vectors: (rows int64 (nq, k), sims float32 (nq, k)), best first."""
    n = matrix.shape[0]
    k = min(k, n)
    if k <= 0:
        return np.zeros((len(queries), 0), dtype=np.int64), np.zeros((len(queries), 0), dtype=np.float32)
    sims = queries @ matrix.T
    if k < n:
        part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    else:
        part = np.broadcast_to(np.arange(n), (len(queries), n)).copy()
    psims = np.take_along_axis(sims, part, axis=1)
    order = np.argsort(-psims, axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1), np.take_along_axis(psims, order, axis=1).astype(np.float32)


class VectorIndex:
    """One named cosine index: hnswlib graph + the id of each label + the text hash each vector came from."""

    def __init__(self, name: str, dim: int, settings: VectorSettings, model_id: str) -> None:
        self.name = name
        self.dim = int(dim)
        self.settings = settings
        self.model_id = model_id
        self.ids: list[str] = []          # live ids, in label order
        self.labels: list[int] = []       # hnsw label per live id
        self.hashes: list[str] = []       # text hash per live id
        self.m = settings.m
        self.ef_construction = settings.ef_construction
        self._pos: dict[str, int] = {}
        self._free: int = 0               # deleted slots awaiting reuse
        self._next_label = 0
        self._index = None
        self._matrix: np.ndarray | None = None
        self._lut: np.ndarray | None = None

    # -- construction -----------------------------------------------------------------------------------
    @classmethod
    def create(cls, name: str, dim: int, settings: VectorSettings, model_id: str) -> "VectorIndex":
        return cls(name, dim, settings, model_id)

    @classmethod
    def load_or_create(cls, vectors_dir: Path, name: str, settings: VectorSettings, model_id: str,
                       dim: int) -> "VectorIndex":
        """The saved index when it was built by this embedder at this dimension, else a fresh empty one."""
        try:
            idx = cls.load(vectors_dir, name, settings)
        except HragError:
            idx = None
        if idx is None or idx.model_id != model_id or (idx.dim != dim and len(idx)):
            return cls.create(name, dim, settings, model_id)
        idx.dim = dim
        return idx

    @classmethod
    def build(cls, name: str, ids: list[str], matrix: np.ndarray, settings: VectorSettings, model_id: str,
              hashes: list[str] | None = None) -> "VectorIndex":
        idx = cls(name, int(np.asarray(matrix).shape[1]) if len(ids) else 0, settings, model_id)
        idx._rebuild(list(ids), list(hashes) if hashes is not None else [""] * len(ids),
                     _as_matrix(matrix, idx.dim) if len(ids) else np.zeros((0, idx.dim), np.float32))
        return idx

    def _new_hnsw(self, capacity: int):
        index = _hnswlib().Index(space="cosine", dim=self.dim)
        index.init_index(max_elements=max(capacity, 16), M=self.m, ef_construction=self.ef_construction,
                         random_seed=100, allow_replace_deleted=True)
        index.set_ef(max(self.settings.ef_search, 16))
        return index

    def _rebuild(self, ids: list[str], hashes: list[str], matrix: np.ndarray) -> None:
        self.m, self.ef_construction = self.settings.m, self.settings.ef_construction
        self._index = self._new_hnsw(len(ids)) if ids else None
        if ids:
            self._index.add_items(matrix, np.arange(len(ids), dtype=np.int64))
        self.ids, self.hashes = list(ids), list(hashes)
        self.labels = list(range(len(ids)))
        self._pos = {i: p for p, i in enumerate(self.ids)}
        if len(self._pos) != len(self.ids):
            raise ValueError(f"index {self.name}: duplicate ids")
        self._free = 0
        self._next_label = len(ids)
        self._matrix = matrix.copy() if self._keeps_matrix(len(ids)) else None
        self._lut = None

    def sync(self, ids: list[str], hashes: list[str], matrix: np.ndarray) -> dict:
        """Make the index hold exactly `ids` (vectors `matrix`, row per id); incremental when it can be.

        Returns counts: added, removed, kept, rebuilt (0/1)."""
        n = len(ids)
        if n and self.dim == 0:
            self.dim = int(np.asarray(matrix).shape[1])
        matrix = _as_matrix(matrix, self.dim) if n else np.zeros((0, self.dim), np.float32)
        want = {i: p for p, i in enumerate(ids)}
        if len(want) != n:
            raise ValueError(f"index {self.name}: duplicate ids")
        if self._index is None or self.m != self.settings.m or self.ef_construction != self.settings.ef_construction:
            self._rebuild(list(ids), list(hashes), matrix)
            return {"added": n, "removed": 0, "kept": 0, "rebuilt": 1}
        gone = [p for p, i in enumerate(self.ids) if want.get(i) is None or hashes[want[i]] != self.hashes[p]]
        gone_ids = {self.ids[p] for p in gone}
        new = [p for p, i in enumerate(ids) if i not in self._pos or i in gone_ids]
        kept = len(self.ids) - len(gone)
        if (self._free + len(gone)) > _REBUILD_DELETED_FRACTION * max(n, 1) and gone:
            self._rebuild(list(ids), list(hashes), matrix)
            return {"added": len(new), "removed": len(gone), "kept": kept, "rebuilt": 1}
        for p in gone:
            self._index.mark_deleted(self.labels[p])
        self._free += len(gone)
        keep_mask = np.ones(len(self.ids), dtype=bool)
        keep_mask[gone] = False
        self.ids = [i for i, k in zip(self.ids, keep_mask) if k]
        self.labels = [lab for lab, k in zip(self.labels, keep_mask) if k]
        self.hashes = [h for h, k in zip(self.hashes, keep_mask) if k]
        if new:
            add = matrix[new]
            labels = np.arange(self._next_label, self._next_label + len(new), dtype=np.int64)
            self._next_label += len(new)
            reuse = min(self._free, len(new))
            needed = self._index.get_current_count() + len(new) - reuse
            if needed > self._index.get_max_elements():
                self._index.resize_index(max(needed, int(self._index.get_max_elements() * 1.5)))
            # replace_deleted reuses tombstoned slots first, so memory stays bounded by the live count
            self._index.add_items(add, labels, replace_deleted=True)
            self._free -= reuse
            self.ids.extend(ids[p] for p in new)
            self.labels.extend(int(x) for x in labels)
            self.hashes.extend(hashes[p] for p in new)
        self._pos = {i: p for p, i in enumerate(self.ids)}
        # the caller's matrix already holds every live vector: reorder it for small sets (exact search),
        # and let big ones be read back from hnswlib only if someone asks for vectors()
        self._matrix = matrix[[want[i] for i in self.ids]] if self._keeps_matrix(len(self.ids)) else None
        self._lut = None
        return {"added": len(new), "removed": len(gone), "kept": kept, "rebuilt": 0}

    # -- reading ----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.ids)

    def position(self, item_id: str) -> int | None:
        return self._pos.get(item_id)

    def _keeps_matrix(self, n: int) -> bool:
        return n < self.settings.exact_below or self.name in MATRIX_SAVED

    def _live_matrix(self) -> np.ndarray:
        if self._matrix is None:
            if not self.ids:
                self._matrix = np.zeros((0, self.dim), np.float32)
            else:
                got = self._index.get_items(np.asarray(self.labels, dtype=np.int64), return_type="numpy")
                self._matrix = np.ascontiguousarray(got, dtype=np.float32)
        return self._matrix

    def vectors(self) -> np.ndarray:
        """All live vectors, row i = self.ids[i] (unit length: hnswlib cosine stores normalised vectors)."""
        return self._live_matrix()

    def search(self, queries: np.ndarray, k: int, ef: int | None = None) -> tuple[list[list[str]], np.ndarray]:
        """Top-k ids by cosine per query, best first; exact below settings.exact_below live items.
        `ef` overrides settings.ef_search for this call."""
        q = _as_matrix(queries, self.dim)
        n = len(self.ids)
        k = int(k)
        sims_out = np.full((len(q), max(k, 0)), -np.inf, dtype=np.float32)
        if n == 0 or k <= 0:
            return [[] for _ in range(len(q))], sims_out
        kk = min(k, n)
        if n < self.settings.exact_below:
            rows, sims = exact_topk(self._live_matrix(), q, kk)
        else:
            rows, sims = self._hnsw_search(q, kk, ef or self.settings.ef_search)
        ids_out: list[list[str]] = []
        for r in range(len(q)):
            valid = rows[r] >= 0
            ids_out.append([self.ids[int(p)] for p in rows[r][valid]])
            sims_out[r, : int(valid.sum())] = sims[r][valid]
        return ids_out, sims_out

    def _hnsw_search(self, q: np.ndarray, k: int, ef: int) -> tuple[np.ndarray, np.ndarray]:
        self._index.set_ef(max(ef, k))
        try:
            labels, dists = self._index.knn_query(q, k=k)
        except RuntimeError:
            # hnswlib refuses when it cannot fill k results (tombstones, tiny ef): answer exactly instead
            return exact_topk(self._live_matrix(), q, k)
        rows = self._label_rows()[labels.astype(np.int64)]
        return rows, (1.0 - dists).astype(np.float32)

    def _label_rows(self) -> np.ndarray:
        """label -> row in self.ids (-1 for tombstones), as an array so 1M results map in one gather."""
        if self._lut is None:
            lut = np.full(max(self._next_label, max(self.labels, default=-1) + 1), -1, dtype=np.int64)
            lut[np.asarray(self.labels, dtype=np.int64)] = np.arange(len(self.labels), dtype=np.int64)
            self._lut = lut
        return self._lut

    # -- persistence ------------------------------------------------------------------------------------
    @staticmethod
    def paths(vectors_dir: Path, name: str) -> tuple[Path, Path]:
        return Path(vectors_dir) / f"{name}.hnsw", Path(vectors_dir) / f"{name}.ids.jsonl"

    @staticmethod
    def matrix_path(vectors_dir: Path, name: str) -> Path:
        return Path(vectors_dir) / f"{name}.npy"

    def save(self, vectors_dir: Path) -> None:
        """hnsw file (and for MATRIX_SAVED indices the .npy matrix) first, each temp + rename, then the id map
        that vouches for them (atomic)."""
        hnsw_path, ids_path = self.paths(vectors_dir, self.name)
        hnsw_path.parent.mkdir(parents=True, exist_ok=True)
        size = 0
        if self._index is not None:
            with store.atomic_path(hnsw_path) as tmp:
                self._index.save_index(str(tmp))
                size = os.path.getsize(tmp)
        matrix_rows = -1
        if self.name in MATRIX_SAVED:
            with store.atomic_writer(self.matrix_path(vectors_dir, self.name)) as fh:
                np.save(fh, np.ascontiguousarray(self._live_matrix(), dtype=np.float32), allow_pickle=False)
            matrix_rows = len(self.ids)
        header = {"_meta": {"format": FORMAT, "name": self.name, "dim": self.dim, "model_id": self.model_id,
                            "space": "cosine", "m": self.m, "ef_construction": self.ef_construction,
                            "count": len(self.ids), "free": self._free, "next_label": self._next_label,
                            "hnsw_bytes": size, "matrix_rows": matrix_rows}}
        rows = ({"id": i, "label": lab, "h": h} for i, lab, h in zip(self.ids, self.labels, self.hashes))
        store.write_jsonl(ids_path, _chain([header], rows))

    @classmethod
    def load(cls, vectors_dir: Path, name: str, settings: VectorSettings) -> "VectorIndex | None":
        """The saved index, or None when it was never built. A damaged pair raises HragError."""
        hnsw_path, ids_path = cls.paths(vectors_dir, name)
        if not ids_path.exists():
            return None
        rows = iter(store.read_jsonl(ids_path))
        header = next(rows, None)
        meta = header.get("_meta") if isinstance(header, dict) else None
        if not meta or meta.get("format") != FORMAT:
            raise HragError(f"{ids_path} is damaged or from another version; run 'hrag synonyms' to rebuild it")
        try:   # a hand-edited or damaged id map: missing keys or wrong types
            idx = cls(name, int(meta["dim"]), settings, str(meta.get("model_id", "")))
            idx.m, idx.ef_construction = int(meta["m"]), int(meta["ef_construction"])
            for r in rows:
                idx.ids.append(r["id"])
                idx.labels.append(int(r["label"]))
                idx.hashes.append(r.get("h", ""))
            count = int(meta["count"])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise HragError(f"{ids_path} is damaged; run 'hrag synonyms' to rebuild it") from None
        if len(idx.ids) != count:
            raise HragError(f"{ids_path} is truncated; run 'hrag synonyms' to rebuild it")
        idx._pos = {i: p for p, i in enumerate(idx.ids)}
        idx._free = int(meta.get("free", 0))
        idx._next_label = int(meta.get("next_label", len(idx.ids)))
        if meta.get("hnsw_bytes"):
            if not hnsw_path.exists() or hnsw_path.stat().st_size != int(meta["hnsw_bytes"]):
                raise HragError(f"{hnsw_path} does not match its id map; run 'hrag synonyms' to rebuild it")
            index = _hnswlib().Index(space="cosine", dim=idx.dim)
            try:
                index.load_index(str(hnsw_path), allow_replace_deleted=True)
            except (RuntimeError, OSError, ValueError) as exc:   # right size, wrong bytes
                raise HragError(f"{hnsw_path} is damaged ({exc}); run 'hrag synonyms' to rebuild it") from None
            index.set_ef(max(settings.ef_search, 16))
            idx._index = index
        if int(meta.get("matrix_rows", -1)) == len(idx.ids) and len(idx.ids):
            try:   # memory-mapped: a query touches only the pages it scores
                m = np.load(cls.matrix_path(vectors_dir, name), mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError, EOFError):   # numpy reads an empty file as EOFError
                m = None
            if m is not None and m.shape == (len(idx.ids), idx.dim) and m.dtype == np.float32:
                idx._matrix = m
        return idx


def _chain(*iters):
    for it in iters:
        yield from it
