"""The four vector indices of DESIGN.md §5: a float16 matrix per index, searched exactly, plus an HNSW graph
only for an index of at least `vectors.exact_below` items.

API (the query stage codes against this):

    from hrag_cli.vectors import VectorIndex, INDEX_NAMES      # ("chunks", "entities", "relations", "facts")
    idx = VectorIndex.load(project.vectors_dir, "chunks", settings.vectors)   # None when never built
    idx.model_id            # embedder model_id the vectors came from; compare with get_embedder(...).model_id
    idx.dim, len(idx), idx.ids (list[str], id order)
    ids, sims = idx.search(queries, k, ef=None)   # queries float32 (nq, dim) or (dim,); ids: list[list[str]] (nq lists,
                                         # each <= k, best first); sims: float32 (nq, k) cosine, -inf padded
    idx.vectors()           # (len, dim) unit rows in idx.ids order, float16 (memory-mapped after load)
    idx.scores(query)       # float32 (len,): exact cosine of one query with every row
    idx.position(id) -> int | None       # row of an id in idx.ids / idx.vectors()

Writers (the synonyms stage):

    idx = VectorIndex.load_or_create(vectors_dir, "chunks", settings.vectors, model_id, dim)
    todo = idx.missing(ids, hashes)          # positions whose (id, text hash) the index lacks: embed only those
    counts = idx.sync(ids, hashes, vectors_of_todo, rows=todo)   # or sync(ids, hashes, full_matrix)
    idx.save(project.vectors_dir)            # <name>.f16.npy, <name>.hnsw (large only), <name>.ids.jsonl

Why it is shaped this way (measured on MuSiQue-100 and the 2Wiki corpus, 2 cores):
- Building HNSW graphs was 64 % of a MuSiQue build (2k-60k items per index), and at those sizes a query's
  exact matrix product over the float16 rows takes milliseconds. So below `exact_below` items there is no graph
  at all; above it the graph is built (all cores) because an exact scan of millions of rows per query is not.
- float16 halves the bytes on disk and in the page cache; cosines of unit vectors move by < 1e-3, far below the
  gaps between neighbours that matter. Rows are stored unit-length, so the matrix product is the cosine.
- The index is its own embedding store: `missing` names the items whose (id, text hash) it does not hold, so a
  later run embeds only new or changed texts and copies the other rows (no separate cache file needed).
- The matrix is saved as .npy and memory-mapped at query time: a query process touches only the pages it reads.
- Saving goes through store.atomic_path for every file; the id map is written last and names the matrix rows and
  the hnsw file's size, so a crash between renames is detected at load and reported as "rebuild with hrag
  synonyms" instead of returning wrong ids. An index of an earlier format raises the same error (and the
  synonyms stage, whose fingerprint includes FORMAT, rebuilds it on the next `hrag index`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from . import store
from .config import VectorSettings
from .errors import HragError

INDEX_NAMES = ("chunks", "entities", "relations", "facts")
FORMAT = 2
DTYPE = np.float16
_REBUILD_DELETED_FRACTION = 0.25
_SCAN_ROWS = 1 << 16          # rows converted to float32 per block of an exact scan
_F32_CACHE_ELEMENTS = 1 << 25  # an index up to this many numbers keeps a float32 copy for repeated searches


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


def exact_topk(matrix: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact cosine top-k of unit vectors: (rows int64 (nq, k), sims float32 (nq, k)), best first. A float16
    matrix is scanned in blocks converted to float32 (BLAS has no float16 product)."""
    n = matrix.shape[0]
    nq = len(queries)
    k = min(k, n)
    if k <= 0:
        return np.zeros((nq, 0), dtype=np.int64), np.zeros((nq, 0), dtype=np.float32)
    q = np.asarray(queries, dtype=np.float32)
    best_rows, best_sims = [], []
    for s in range(0, n, _SCAN_ROWS):
        block = np.asarray(matrix[s:s + _SCAN_ROWS], dtype=np.float32)
        sims = q @ block.T
        kk = min(k, len(block))
        part = np.argpartition(-sims, kk - 1, axis=1)[:, :kk] if kk < len(block) else \
            np.broadcast_to(np.arange(len(block)), (nq, len(block))).copy()
        best_rows.append(part + s)
        best_sims.append(np.take_along_axis(sims, part, axis=1))
    rows, sims = np.concatenate(best_rows, axis=1), np.concatenate(best_sims, axis=1)
    if rows.shape[1] > k:
        part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        rows, sims = np.take_along_axis(rows, part, 1), np.take_along_axis(sims, part, 1)
    order = np.lexsort((rows, -sims), axis=1)
    return np.take_along_axis(rows, order, axis=1), np.take_along_axis(sims, order, axis=1).astype(np.float32)


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
        self._matrix = np.zeros((0, self.dim), dtype=DTYPE)
        self._f32: np.ndarray | None = None
        self._lut: np.ndarray | None = None

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
            idx._matrix = np.zeros((0, dim), dtype=DTYPE)
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
        pos, have = self._positions(), self.hashes
        return np.fromiter((p for p, (i, h) in enumerate(zip(ids, hashes))
                            if (r := pos.get(i)) is None or have[r] != h), dtype=np.int64)

    def sync(self, ids: list[str], hashes: list[str], vectors, rows: np.ndarray | None = None) -> dict:
        """Make the index hold exactly `ids` in this order. `vectors` holds a row per id, or (with `rows`, as
        `missing` returned) a row per listed position only, the other rows being kept from the index (which
        must hold them). `vectors` may also be an iterator of row blocks in that order, so a caller can embed
        millions of texts without holding them all. Returns counts: added, removed, kept, rebuilt (0/1: the
        graph was built from scratch)."""
        n = len(ids)
        if len(set(ids)) != n:
            raise ValueError(f"index {self.name}: duplicate ids")
        if rows is None:     # a full matrix: only the rows the index lacks are taken from it
            todo = self.missing(ids, hashes)
            vectors = np.asarray(vectors)[todo] if n else vectors
        else:
            todo = np.asarray(rows, dtype=np.int64)
        blocks = iter([vectors]) if isinstance(vectors, np.ndarray) or not hasattr(vectors, "__next__") \
            else vectors
        first = next(blocks, None) if len(todo) else None
        if first is not None and self.dim == 0:
            self.dim = int(np.asarray(first).shape[-1])
        pos = self._positions()
        is_new = np.zeros(n, dtype=bool)
        is_new[todo] = True
        old_row = np.full(n, -1, dtype=np.int64)
        for p, i in enumerate(ids):
            if not is_new[p]:
                r = pos.get(i)
                if r is None or self.hashes[r] != hashes[p]:
                    raise ValueError(f"index {self.name}: no stored vector for {i!r}; pass it in `vectors`")
                old_row[p] = r
        kept_rows = old_row[~is_new]
        gone = np.ones(len(self.ids), dtype=bool)
        gone[kept_rows] = False
        n_gone = int(gone.sum())

        matrix = np.empty((n, self.dim), dtype=DTYPE)
        for s in range(0, n, _SCAN_ROWS):                      # kept rows copied, in blocks (old may be a memmap)
            sel = np.flatnonzero(~is_new[s:s + _SCAN_ROWS]) + s
            if len(sel):
                matrix[sel] = self._matrix[old_row[sel]]
        done = 0
        block = first
        while block is not None:
            b = _as_matrix(block, self.dim)
            if done + len(b) > len(todo):
                raise ValueError(f"index {self.name}: more vectors than the {len(todo)} rows to add")
            matrix[todo[done:done + len(b)]] = _unit(b).astype(DTYPE)
            done += len(b)
            block = next(blocks, None)
        if done != len(todo):
            raise ValueError(f"index {self.name}: {len(todo)} rows to add, {done} vectors given")

        rebuilt = 0
        old_labels = self.labels
        labels = np.full(n, -1, dtype=np.int64)
        if not self._uses_graph(n):
            self._index, self._free, self._next_label = None, 0, 0
        elif (self._index is None or self.m != self.settings.m or self.ef_construction != self.settings.ef_construction
              or (self._free + n_gone) > _REBUILD_DELETED_FRACTION * max(n, 1)):
            self._build_graph(matrix)
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
            self._index.add_items(np.asarray(matrix[todo], dtype=np.float32), labels[todo], replace_deleted=True)
            self._free -= reuse
        self.ids, self.hashes, self.labels = list(ids), list(hashes), labels
        self._matrix, self._f32, self._lut, self._pos = matrix, None, None, None
        return {"added": len(todo), "removed": n_gone, "kept": n - len(todo), "rebuilt": rebuilt}

    def _build_graph(self, matrix: np.ndarray) -> None:
        n = len(matrix)
        self.m, self.ef_construction = self.settings.m, self.settings.ef_construction
        index = _hnswlib().Index(space="cosine", dim=self.dim)
        index.init_index(max_elements=max(n, 16), M=self.m, ef_construction=self.ef_construction,
                         random_seed=100, allow_replace_deleted=True)
        index.set_ef(max(self.settings.ef_search, 16))
        for s in range(0, n, _SCAN_ROWS):           # float32 copies one block at a time; every core inserts
            index.add_items(np.asarray(matrix[s:s + _SCAN_ROWS], dtype=np.float32),
                            np.arange(s, min(n, s + _SCAN_ROWS), dtype=np.int64), num_threads=os.cpu_count() or 1)
        self._index, self._free, self._next_label = index, 0, n

    # -- reading ----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.ids)

    def _positions(self) -> dict[str, int]:
        if self._pos is None:
            self._pos = {i: p for p, i in enumerate(self.ids)}
        return self._pos

    def position(self, item_id: str) -> int | None:
        return self._positions().get(item_id)

    def vectors(self) -> np.ndarray:
        """All live vectors (unit rows, float16), row i = self.ids[i]."""
        return self._matrix

    def _scan_matrix(self) -> np.ndarray:
        """What an exact scan reads: a float32 copy for a small index (kept for the next query), else the
        float16 rows, converted block by block."""
        if self._f32 is None and self._matrix.size <= _F32_CACHE_ELEMENTS:
            self._f32 = np.asarray(self._matrix, dtype=np.float32)
        return self._f32 if self._f32 is not None else self._matrix

    def scores(self, query: np.ndarray) -> np.ndarray:
        """float32 (len,): the cosine of one query with every row, exact (ppr and naive score every chunk)."""
        q = _as_matrix(query, self.dim)[0]
        mat = self._scan_matrix()
        if mat.dtype == np.float32:
            return mat @ q
        out = np.empty(len(mat), dtype=np.float32)
        for s in range(0, len(mat), _SCAN_ROWS):
            out[s:s + _SCAN_ROWS] = np.asarray(mat[s:s + _SCAN_ROWS], dtype=np.float32) @ q
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
            rows, sims = exact_topk(self._scan_matrix(), q, kk)
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
            return exact_topk(self._scan_matrix(), q, k)
        rows = self._label_rows()[labels.astype(np.int64)]
        return rows, (1.0 - dists).astype(np.float32)

    def _label_rows(self) -> np.ndarray:
        """label -> row in self.ids (-1 for tombstones), as an array so 1M results map in one gather."""
        if self._lut is None:
            top = max(self._next_label, int(self.labels.max(initial=-1)) + 1)
            lut = np.full(top, -1, dtype=np.int64)
            lut[self.labels] = np.arange(len(self.labels), dtype=np.int64)
            self._lut = lut
        return self._lut

    # -- persistence ------------------------------------------------------------------------------------
    @staticmethod
    def paths(vectors_dir: Path, name: str) -> tuple[Path, Path]:
        return Path(vectors_dir) / f"{name}.hnsw", Path(vectors_dir) / f"{name}.ids.jsonl"

    @staticmethod
    def matrix_path(vectors_dir: Path, name: str) -> Path:
        return Path(vectors_dir) / f"{name}.f16.npy"

    @classmethod
    def files(cls, vectors_dir: Path, name: str) -> list[Path]:
        """Every file of one index, including those of format 1 (<name>.npy), for removal."""
        return [*cls.paths(vectors_dir, name), cls.matrix_path(vectors_dir, name), Path(vectors_dir) / f"{name}.npy"]

    def save(self, vectors_dir: Path) -> None:
        """Matrix and graph first, each temp + rename, then the id map that vouches for them (atomic)."""
        hnsw_path, ids_path = self.paths(vectors_dir, self.name)
        hnsw_path.parent.mkdir(parents=True, exist_ok=True)
        size = 0
        if self._index is not None:
            with store.atomic_path(hnsw_path) as tmp:
                self._index.save_index(str(tmp))
                size = os.path.getsize(tmp)
        else:
            hnsw_path.unlink(missing_ok=True)
        with store.atomic_writer(self.matrix_path(vectors_dir, self.name)) as fh:
            np.save(fh, np.ascontiguousarray(self._matrix, dtype=DTYPE), allow_pickle=False)
        (Path(vectors_dir) / f"{self.name}.npy").unlink(missing_ok=True)     # format 1's matrix
        header = {"_meta": {"format": FORMAT, "name": self.name, "dim": self.dim, "model_id": self.model_id,
                            "space": "cosine", "m": self.m, "ef_construction": self.ef_construction,
                            "count": len(self.ids), "free": self._free, "next_label": self._next_label,
                            "hnsw_bytes": size, "matrix_rows": len(self.ids), "dtype": np.dtype(DTYPE).name}}
        graph = self._index is not None
        rows = ({"id": i, "h": h, **({"label": int(lab)} if graph else {})}
                for i, h, lab in zip(self.ids, self.hashes, self.labels.tolist()))
        store.write_jsonl(ids_path, _chain([header], rows))

    @classmethod
    def load(cls, vectors_dir: Path, name: str, settings: VectorSettings) -> "VectorIndex | None":
        """The saved index, or None when it was never built. A damaged set or an earlier format raises
        HragError naming the fix."""
        hnsw_path, ids_path = cls.paths(vectors_dir, name)
        if not ids_path.exists():
            return None
        rows = iter(store.read_jsonl(ids_path))
        header = next(rows, None)
        meta = header.get("_meta") if isinstance(header, dict) else None
        if not meta or meta.get("format") != FORMAT:
            raise HragError(f"{ids_path} is damaged or from another version; run 'hrag synonyms' to rebuild it")
        labels: list[int] = []
        try:   # a hand-edited or damaged id map: missing keys or wrong types
            idx = cls(name, int(meta["dim"]), settings, str(meta.get("model_id", "")))
            idx.m, idx.ef_construction = int(meta["m"]), int(meta["ef_construction"])
            graph = bool(meta.get("hnsw_bytes"))
            for r in rows:
                idx.ids.append(r["id"])
                idx.hashes.append(r.get("h", ""))
                if graph:
                    labels.append(int(r["label"]))
            count = int(meta["count"])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise HragError(f"{ids_path} is damaged; run 'hrag synonyms' to rebuild it") from None
        if len(idx.ids) != count or int(meta.get("matrix_rows", -1)) != count:
            raise HragError(f"{ids_path} is truncated; run 'hrag synonyms' to rebuild it")
        idx.labels = np.asarray(labels, dtype=np.int64) if graph else np.full(count, -1, dtype=np.int64)
        idx._free = int(meta.get("free", 0))
        idx._next_label = int(meta.get("next_label", 0))
        if count:
            try:   # memory-mapped: a query touches only the pages it scores
                m = np.load(cls.matrix_path(vectors_dir, name), mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError):
                m = None
            if m is None or m.shape != (count, idx.dim) or m.dtype != DTYPE:
                raise HragError(f"{cls.matrix_path(vectors_dir, name)} does not match its id map; "
                                f"run 'hrag synonyms' to rebuild it")
            idx._matrix = m
        else:
            idx._matrix = np.zeros((0, idx.dim), dtype=DTYPE)
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


def _chain(*iters):
    for it in iters:
        yield from it
