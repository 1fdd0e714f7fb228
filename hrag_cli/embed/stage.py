"""The synonyms stage: embeddings, the four vector indices, BM25 over chunks, and SYNONYM edges.

    run_synonyms(project, settings, reporter, review_path=None, accept_path=None) -> StageOutcome

1. Embeds (through the cache) chunks, entities, relations and facts and syncs vectors/<name>.hnsw (vectors.py);
   for the builtin embedder it first refreshes the frozen IDF table when the corpus moved (embed.refresh_idf).
   After a resolve that patched its records, graph/changed_ids.json lists the records it added or made again;
   when it starts from the resolve output the indices were last synced with (their id map's "synced"), only
   those records are read (at their lines), embedded and spliced in (VectorIndex.insert), and the chunk index
   takes the chunks it lacks: when its "synced" names the `ingest.chunk_mark` it holds and chunks were only
   appended since, just those are read (from the file's end); otherwise every record is read and its text hashed.
2. Updates the BM25 index over chunks (hrag_cli.storage.bm25.BM25Index saved at vectors/bm25): new chunk ids added, gone
   ones removed (a chunk id is a hash of its text, so a changed chunk is a removal plus an addition).
3. SYNONYM edges, HippoRAG style: for each entity its `synonyms.top_k` nearest entities by cosine of their NAME
   vectors (HippoRAG links entity phrases, and name+description vectors of entities described by the same
   sentence look alike whatever their names); a pair with similarity >= `synonyms.threshold` whose names both
   have >= `min_name_chars` letters/digits becomes one undirected edge (weight = similarity). The neighbours
   come from a self-join over overlapping k-means cells (cells.py; exact up to cells_per_entity * cell_size
   entities), with exact cosines. The name vectors are kept as a vector index of their own
   (vectors/entity_names.*, never searched at query time), so a later run embeds only new or renamed
   entities. The builtin embedder, the cells, the join and the ranking of its candidates run in one forked
   worker process per core (forkpool.py) when the work is large. Neighbour lists, the
   cells and their centroids are kept as arrays in vectors/entity_names.knn.npz keyed by (entity id, text
   hash), and a run that kept the cells writes only the lists and keys that differ from it as
   vectors/entity_names.knn.patch (`KnnLists.save`): a later run joins only new or changed entities (and
   entities whose neighbours changed or vanished) with the members of their cells and offers each to the kept
   entities there, instead of comparing everything again. Written to graph/synonyms.jsonl
   and, replacing previous SYNONYM edges, into graph/graph.pkl.
4. Review: `review_path` writes the candidate pairs as TSV (a, b, a_name, b_name, similarity, action) and
   changes nothing in graph/; `accept_path` reads such a TSV back: action `link` forces an edge, `skip` drops
   the pair, `merge` marks the two entities as the same thing. Decisions persist in
   graph/synonym_decisions.jsonl and are re-applied on every later run (after new documents too). A merge is
   realised as a SYNONYM edge of weight 1.0 (PPR then moves freely between the two); resolve may read the
   `merge` rows of graph/synonym_decisions.jsonl to fold the entities together.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import asdict, dataclass, replace
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from hrag_cli.core import forkpool
from hrag_cli.core import store
from hrag_cli.storage.cells import CellPlan, cell_count, fit_cells, join, nearest_cells
from hrag_cli.core.config import Settings
from hrag_cli.embed.embedder import Embedder, get_embedder, refresh_idf
from hrag_cli.chunk.stage import added_since, chunk_mark
from hrag_cli.core.errors import HragError, UsageError
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import Project, StageOutcome, fingerprint, text_hash
from hrag_cli.core.records import fact_text
from hrag_cli.storage.vectors import (
    BAND, FORMAT as VECTOR_FORMAT, INDEX_NAMES, DenseRows, SparseRows, VectorIndex, fixed_bytes, fixed_width,
    mostly_zero, sparse_rows)

NAMES = "entity_names"     # the name vectors of the synonym pass; vectors/entity_names.knn.npz
KNN_FILE = f"{NAMES}.knn.npz"
DECISIONS_FILE = "synonym_decisions.jsonl"
TSV_COLUMNS = ("a", "b", "a_name", "b_name", "similarity", "action")
ACTIONS = ("link", "merge", "skip")


def settings_fingerprint(settings: Settings) -> str:
    e = settings.embed
    return fingerprint("synonyms-v1", VECTOR_FORMAT, e.model.strip() or "builtin", e.idf_refresh_growth,
                       asdict(settings.vectors), asdict(settings.synonyms))


# -- texts of the four indices (from the JSONL rows, so millions of them never become dataclasses) -----------
def entity_text(name: str, description: str) -> str:
    """An entity without a description is its name: the same text the synonym pass embeds, so a cached
    embedder (sentence-transformers, an API) encodes it once (OpenIE imports have no descriptions)."""
    return f"{name}\n{description}" if description else name


def relation_text(r: dict, names: dict[str, str]) -> str:
    kw = ", ".join(r["keywords"])
    return f"{names.get(r['src'], r['src'])}\n{names.get(r['tgt'], r['tgt'])}\n{kw}\n{r['description']}"


def _fact_row_text(f: dict) -> str:
    return fact_text(f["subject"], f["predicate"], f["object"])


def relation_vectors(settings: Settings, extractor: str) -> bool:
    """Whether relations get vectors of their own (`vectors.relations`). `auto`: only for an LLM extractor,
    whose relations carry a description and keywords of their own. A rules or OpenIE relation restates its
    facts (the same names and predicate, or the sentence they came from), so its vectors cost a third of the
    texts embedded and of a rules project's bytes for a ranking global mode gets from the fact vectors."""
    mode = settings.vectors.relations.strip().lower()
    return extractor.startswith("llm:") if mode == "auto" else mode == "on"


def name_chars(name: str) -> int:
    return sum(map(str.isalnum, name))


# -- neighbour lists --------------------------------------------------------------------------------------
def _as_keys(items: Sequence[str] | np.ndarray | None) -> np.ndarray:
    """Strings (or fixed-width bytes already) as fixed-width bytes."""
    if isinstance(items, np.ndarray) and items.dtype.kind == "S":
        return items
    return fixed_bytes(list(items or []))


def _decoded(keys: np.ndarray) -> list[str]:
    return [b.decode("utf-8") for b in keys.tolist()]


def _joined(keys: np.ndarray) -> np.ndarray:
    """Fixed-width bytes as one newline-separated blob (uint8): the file form of the ids and hashes, made in
    numpy (ids hold neither NUL nor newline)."""
    n = len(keys)
    if not n:
        return np.zeros(0, dtype=np.uint8)
    m = np.ascontiguousarray(keys).view(np.uint8).reshape(n, keys.dtype.itemsize)
    m = np.concatenate([m, np.full((n, 1), 10, dtype=np.uint8)], axis=1)
    return m[m != 0][:-1]


def _split(blob: np.ndarray) -> np.ndarray:
    """`_joined` read back: fixed-width bytes."""
    blob = np.asarray(blob, dtype=np.uint8)
    if not len(blob):
        return np.zeros(0, dtype="S1")
    nl = np.flatnonzero(blob == 10)
    starts = np.concatenate([[0], nl + 1]).astype(np.int64)
    if (blob == 0).any():
        raise ValueError("a NUL byte in the ids")
    body = blob[blob != 10]
    off = np.append(starts - np.arange(len(starts)), len(body))
    return fixed_width(body, off)


def _remap(nbr: np.ndarray, fwd: np.ndarray) -> np.ndarray:
    """Neighbour rows `nbr` (-1 = empty slot) through `fwd` (old row -> new row, -1 gone)."""
    return np.where(nbr >= 0, fwd[np.maximum(nbr, 0)], -1)


def _read_keys(z: Any) -> tuple[np.ndarray, np.ndarray]:
    """The ids and text hashes of a saved base or patch (`_joined` blobs) as fixed-width bytes."""
    return _split(z["ids"]), _split(z["hashes"])


def _rows_in(table: np.ndarray, keys: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """Per key, its position in `table` (distinct fixed-width bytes), -1 when absent; searched through `order`
    (the table's ascending order, if known; no sorted copy of the table is made)."""
    if not len(table) or not len(keys):
        return np.full(len(keys), -1, dtype=np.int64)
    if order is None and not bool((table[1:] > table[:-1]).all()):
        order = np.argsort(table, kind="stable")
    at = np.minimum(np.searchsorted(table, keys, sorter=order), len(table) - 1)
    where = at if order is None else order[at]
    return np.where(table[where] == keys, where, -1).astype(np.int64)


# what reading a missing, torn or damaged .npz raises: a damaged deflate stream inside a member stops zlib
# (zlib.error) before zipfile's CRC check is reached
_UNREADABLE = (OSError, ValueError, KeyError, IndexError, EOFError, zipfile.BadZipFile, zlib.error)


class KnnLists:
    """Per entity (row): its top-k neighbours as rows of the same table, their cosines, the text hash the list
    was computed for, and the cells (cells.py) the entity was joined in. Arrays rather than per-entity lists:
    a 1M-entity pass holds 10M neighbours."""

    def __init__(self, k: int, model_id: str, ids: Sequence[str] | np.ndarray | None = None,
                 hashes: Sequence[str] | np.ndarray | None = None,
                 nbr: np.ndarray | None = None, sim: np.ndarray | None = None, plan: CellPlan | None = None,
                 cells: np.ndarray | None = None, cell_settings: tuple[int, int] = (0, 0),
                 chars: np.ndarray | None = None) -> None:
        self.k = k
        self.model_id = model_id
        # ids and text hashes as fixed-width bytes (`fixed_bytes`): a +1 % run matches 521k entities of the
        # previous pass by numpy search, not a dict and a decoded string per row
        self.keys = _as_keys(ids)
        self.hash_keys = _as_keys(hashes)
        n = len(self.keys)
        self.nbr = nbr if nbr is not None else np.full((n, k), -1, dtype=np.int32)     # -1 = empty slot
        self.sim = sim if sim is not None else np.full((n, k), -np.inf, dtype=np.float32)
        self.plan = plan                      # None: no cells yet, the next pass fits them
        self.cells = cells if cells is not None else np.zeros((n, 0), dtype=np.int32)
        self.cell_settings = cell_settings    # (cells_per_entity, cell_size) the plan was fitted with
        # slots whose cosine this pass's join gave (folded ones, for `rescore`; not saved): every slot of a
        # queried row, the offered slots of the others
        self.joined = np.zeros((n, k), dtype=bool)
        # letters and digits of each row's name (`name_chars`; -1 unknown): which entities may be linked, known
        # without reading every entity's name again
        self.chars = chars if chars is not None else np.full(n, -1, dtype=np.int32)
        self.disk: _Disk | None = None       # the saved base these lists were loaded from (`save` patches it)
        self.base_rows: np.ndarray | None = None   # per row, its row in disk's lists (-1 new) when already known
        self.damaged = ""                    # why saved lists could not be read (a warning), "" when they could

    @property
    def ids(self) -> list[str]:
        return _decoded(self.keys)

    def save(self, path: Path) -> None:
        """A .npz deflated at level 1 (the base): stored plain it is 94 MB against 50 MB at 100k passages, room
        the full build does not have under its 3 GB, and level 1 costs ~1.4 s there. A run that kept the cells
        of the lists it loaded writes only what differs from the base file as a patch beside it
        (`store.patch_path`, `_patch`), until the lists it holds pass _KNN_FOLD_SHARE of them: then the lists
        are written whole as the new base and the patch goes. The patch names its base by `store.base_mark`.
        np.load reads either file."""
        patch = self._patch()
        if patch is not None:
            _write_npz(store.patch_path(path), patch)
            return
        plan = self.plan or CellPlan(np.zeros((0, 0), dtype=np.float32), np.zeros(0, dtype=np.float32), 0)
        _write_npz(path, {"ids": _joined(self.keys), "hashes": _joined(self.hash_keys),
                          "nbr": self.nbr, "sim": self.sim, "k": np.int64(self.k), "model_id": np.array(self.model_id),
                          "centroids": plan.centroids, "mean": plan.mean, "fit_count": np.int64(plan.fit_count),
                          "cells": self.cells, "cell_settings": np.array(self.cell_settings, dtype=np.int64),
                          "chars": self.chars,
                          "has_plan": np.bool_(self.plan is not None)})
        store.patch_path(path).unlink(missing_ok=True)

    def _patch(self) -> dict[str, np.ndarray] | None:
        """The patch taking the base these lists were loaded from (`disk`) to them; None when they must be
        written whole: no base, other cells, a base row gone, or too many lists changed. It holds the rows that
        are new (`new_at`: every other row is the next base row), the lists that differ from the base's (most
        are kept entities offered a new neighbour) and the id, hash, cells and name chars of the rows whose own
        differ (new or renamed entities)."""
        d = self.disk
        if d is None or self.plan is None or d.lists.plan is not self.plan \
                or d.lists.cell_settings != self.cell_settings or d.lists.nbr.shape[1] != self.k:
            return None
        base = d.lists
        base_of = self.base_rows if self.base_rows is not None else _rows_in(base.keys, self.keys)   # -1: new
        has = base_of >= 0
        if int(has.sum()) != len(base.keys) or bool((np.diff(base_of[has]) <= 0).any()):
            return None
        fwd = np.flatnonzero(has)                                       # base row -> row
        mapped = _remap(base.nbr, fwd)
        same_list, same_key = np.zeros(len(self.keys), dtype=bool), np.zeros(len(self.keys), dtype=bool)
        same_list[has] = ((self.nbr[has] == mapped).all(axis=1)
                          & (self.sim[has].view(np.int32) == base.sim.view(np.int32)).all(axis=1))
        same_key[has] = ((self.hash_keys[has] == base.hash_keys) & (self.chars[has] == base.chars)
                         & (self.cells[has] == base.cells).all(axis=1))
        rows, keyed = np.flatnonzero(~same_list), np.flatnonzero(~same_key)
        if len(rows) > _KNN_FOLD_SHARE * len(self.keys):
            return None
        return {"base_size": np.int64(d.mark[0]), "base_tail": np.int64(d.mark[1]), "k": np.int64(self.k),
                "model_id": np.array(self.model_id), "n": np.int64(len(self.keys)), "new_at": np.flatnonzero(~has),
                "rows": rows, "nbr": self.nbr[rows], "sim": self.sim[rows],
                "keyed": keyed, "ids": _joined(self.keys[keyed]), "hashes": _joined(self.hash_keys[keyed]),
                "cells": self.cells[keyed], "chars": self.chars[keyed]}

    @classmethod
    def load(cls, path: Path, k: int, model_id: str) -> "KnnLists":
        """Saved lists (the base with its patch) when computed with the same k and embedder, else empty
        (everything is queried). A patch of another base is one a run folded before it was stopped: the base
        alone is the lists. A damaged patch: empty lists, `damaged` says why."""
        base = cls._load_base(path, k, model_id)
        if base is None:
            return cls(k, model_id)
        try:
            base.disk = _Disk(base, store.base_mark(path))
        except OSError:
            return cls(k, model_id)
        try:
            with np.load(store.patch_path(path), allow_pickle=False) as z:
                if (int(z["base_size"]), int(z["base_tail"])) != base.disk.mark:
                    return base
                got = base._patched(z)
        except FileNotFoundError:
            return base
        except _UNREADABLE:
            got = None
        if got is None:
            empty = cls(k, model_id)
            empty.damaged = f"{store.patch_path(path)} is damaged"
            return empty
        return got

    def _patched(self, z: Any) -> "KnnLists | None":
        """These (base) lists with the patch `z` (`_patch`) applied; None when it does not fit them."""
        k, b = self.k, len(self.keys)
        if int(z["k"]) != k or str(z["model_id"]) != self.model_id:
            return None
        n, new_at = int(z["n"]), z["new_at"].astype(np.int64)
        rows, keyed = z["rows"].astype(np.int64), z["keyed"].astype(np.int64)
        ids, hashes = _read_keys(z)
        nbr, sim = z["nbr"].astype(np.int32, copy=False), z["sim"].astype(np.float32, copy=False)
        cells, chars = z["cells"].astype(np.int32, copy=False), z["chars"].astype(np.int32, copy=False)
        m, mk = len(rows), len(keyed)

        def ascending(at: np.ndarray) -> bool:
            return not len(at) or (not bool((np.diff(at) <= 0).any()) and at[0] >= 0 and at[-1] < n)

        if n != b + len(new_at) or not (ascending(new_at) and ascending(rows) and ascending(keyed)) \
                or len(ids) != mk or len(hashes) != mk or nbr.shape != (m, k) or sim.shape != nbr.shape \
                or cells.shape != (mk, self.cells.shape[1]) or chars.shape != (mk,):
            return None
        has = np.ones(n, dtype=bool)
        has[new_at] = False
        if not (np.isin(new_at, rows).all() and np.isin(new_at, keyed).all()):
            return None                                     # a new row's list and key are the patch's
        fwd = np.flatnonzero(has)                            # base row -> row
        keys = np.empty(n, dtype=f"S{max(self.keys.dtype.itemsize, ids.dtype.itemsize)}")
        keys[has], keys[keyed] = self.keys, ids
        hash_keys = np.empty(n, dtype=f"S{max(self.hash_keys.dtype.itemsize, hashes.dtype.itemsize)}")
        hash_keys[has], hash_keys[keyed] = self.hash_keys, hashes
        out = KnnLists(k, self.model_id, keys, hash_keys, np.empty((n, k), dtype=np.int32),
                       np.empty((n, k), dtype=np.float32), self.plan,
                       np.empty((n, self.cells.shape[1]), dtype=np.int32), self.cell_settings,
                       np.empty(n, dtype=np.int32))
        out.nbr[has] = _remap(self.nbr, fwd)
        out.sim[has], out.cells[has], out.chars[has] = self.sim, self.cells, self.chars
        out.nbr[rows], out.sim[rows], out.cells[keyed], out.chars[keyed] = nbr, sim, cells, chars
        if not out._fits():
            return None
        out.sim = np.where(out.nbr >= 0, out.sim, -np.inf).astype(np.float32, copy=False)
        out.disk = self.disk
        return out

    def _fits(self) -> bool:
        """Whether the arrays describe lists of this k over the cells of the plan (a damaged file's do not)."""
        n, plan, (per, _) = len(self.keys), self.plan, self.cell_settings
        return not (self.nbr.shape != (n, self.k) or self.sim.shape != self.nbr.shape or len(self.hash_keys) != n
                    or (self.nbr >= n).any() or (self.nbr < -1).any() or plan is None
                    or plan.mean.shape != plan.centroids.shape[1:] or self.cells.shape != (n, min(per, plan.cells))
                    or (self.cells < 0).any() or (self.cells >= plan.cells).any() or self.chars.shape != (n,))

    @classmethod
    def _load_base(cls, path: Path, k: int, model_id: str) -> "KnnLists | None":
        try:
            with np.load(path, allow_pickle=False) as z:
                if int(z["k"]) != k or str(z["model_id"]) != model_id:
                    return None
                ids, hashes = _read_keys(z)
                nbr, sim = z["nbr"].astype(np.int32, copy=False), z["sim"].astype(np.float32, copy=False)
                plan = (CellPlan(z["centroids"].astype(np.float32), z["mean"].astype(np.float32), int(z["fit_count"]))
                        if z["has_plan"] else None)
                cells = z["cells"].astype(np.int32, copy=False)
                chars = z["chars"].astype(np.int32, copy=False)
                per, size = (int(x) for x in z["cell_settings"])
        except _UNREADABLE:                     # missing, torn, damaged or older: recomputed
            return None
        got = cls(k, model_id, ids, hashes, nbr, sim, plan, cells, (per, size), chars)
        if not got._fits():
            return None   # damaged: recomputed
        got.sim = np.where(nbr >= 0, sim, -np.inf).astype(np.float32, copy=False)
        return got


# lists differing from the base's past which they are written whole as a new base. At 100k passages a +1 % run
# changes 10.7 % of them (4.7k new entities, 52k kept ones offered a new neighbour); the patch of one run is 12 %
# of the base's bytes, so the base (~1.3 s of deflate) is rewritten every second or third run.
_KNN_FOLD_SHARE = 0.3


@dataclass
class _Disk:
    """The base file lists were loaded from: its lists (as saved) and `store.base_mark`, which a patch names."""
    lists: KnnLists
    mark: tuple[int, int]


def _write_npz(path: Path, arrays: dict[str, Any]) -> None:
    """Arrays as a .npz deflated at level 1, written atomically."""
    with store.atomic_writer(path) as fh, zipfile.ZipFile(fh, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for name, arr in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(arr), allow_pickle=False)


def best_k(nbr: np.ndarray, sim: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the k best distinct neighbours of candidate lists (-1 = none; at least k columns), ordered by
    cosine then row."""
    nbr = np.where(np.isfinite(sim), nbr, -1)
    order = np.lexsort((-sim, nbr), axis=1)            # by neighbour, its best cosine first
    nbr, sim = np.take_along_axis(nbr, order, 1), np.take_along_axis(sim, order, 1)
    dup = np.zeros(nbr.shape, dtype=bool)
    dup[:, 1:] = nbr[:, 1:] == nbr[:, :-1]
    sim = np.where(dup | (nbr < 0), -np.inf, sim)
    nbr = np.where(np.isfinite(sim), nbr, np.iinfo(np.int32).max)   # empty slots sort last
    order = np.lexsort((nbr, -sim), axis=1)[:, :k]
    nbr, sim = np.take_along_axis(nbr, order, 1), np.take_along_axis(sim, order, 1)
    return np.where(np.isfinite(sim), nbr, -1).astype(np.int32), sim.astype(np.float32)


def _group_offers(target: np.ndarray, src: np.ndarray, sim: np.ndarray, k: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Offers (target <- src at sim) grouped per target, its k best distinct sources kept: (targets, src (t, k),
    sim (t, k)). A source is offered once per cell it shares with the target: repeats must not take slots."""
    order = np.lexsort((src, -sim, target))            # a repeated offer has the same cosine: it lands adjacent
    target, src, sim = target[order], src[order], sim[order]
    first = np.ones(len(target), dtype=bool)
    first[1:] = (target[1:] != target[:-1]) | (src[1:] != src[:-1])
    target, src, sim = target[first], src[first], sim[first]
    uniq, start = np.unique(target, return_index=True)
    slot = np.arange(len(target)) - np.repeat(start, np.diff(np.append(start, len(target))))
    keep = slot < k
    row = np.searchsorted(uniq, target[keep])
    out_src = np.full((len(uniq), k), -1, dtype=np.int32)
    out_sim = np.full((len(uniq), k), -np.inf, dtype=np.float32)
    out_src[row, slot[keep]] = src[keep]
    out_sim[row, slot[keep]] = sim[keep]
    return uniq, out_src, out_sim


_BEST_K_BATCH = 25_000       # queried rows per ranking task
_BEST_K_PARALLEL = 1 << 22     # candidates (rows x slots) from which their ranking runs in forked workers


def _best_of(job: tuple[np.ndarray, np.ndarray, int], span: tuple[int, int]
             ) -> tuple[int, tuple[np.ndarray, np.ndarray]]:
    nbr, sim, k = job
    s, e = span
    return s, best_k(nbr[s:e], sim[s:e], k)


def update_knn(prev: KnnLists, ids: Sequence[str] | np.ndarray, hashes: Sequence[str] | np.ndarray,
               matrix: np.ndarray, k: int, reporter: Reporter, per_entity: int, cell_size: int,
               min_sim: float = -np.inf, chars_of: Callable[[np.ndarray], np.ndarray] | None = None
               ) -> tuple[KnnLists, int]:
    """New neighbour lists for the current entities (rows of `ids`/`matrix`, unit vectors); returns them and
    how many entities were queried: the new or changed ones, and those that lost a neighbour; all of them when
    the cells are (re)fitted, which happens when there are none yet, when the settings changed, and each time
    the entity count doubles, so the centroids follow the corpus at a geometric cost. A list holds only
    neighbours at or above `min_sim` (the lists must have been computed with the same `min_sim`). `chars_of`
    gives the `name_chars` of rows whose name is not the previous pass's (else they stay unknown, -1)."""
    keys, hash_keys = _as_keys(ids), _as_keys(hashes)
    n = len(keys)
    out = KnnLists(k, prev.model_id, keys, hash_keys)
    out.disk = prev.disk
    if n == 0:
        return out, 0
    plan, settings = prev.plan, (per_entity, cell_size)
    refit = (plan is None or prev.cell_settings != settings or plan.centroids.shape[1] != matrix.shape[1]
             or (plan.cells == 1 and cell_count(n, per_entity, cell_size) > 1)
             or (plan.cells > 1 and n >= 2 * plan.fit_count))
    old = _rows_in(prev.keys, keys)                                          # row -> its row in prev
    if prev.disk is not None and prev.disk.lists is prev:      # prev is the base as loaded: `_patch` needs the same
        out.base_rows = old
    named = old >= 0
    named[named] = prev.hash_keys[old[named]] == hash_keys[named]
    out.chars[named] = prev.chars[old[named]]
    if chars_of is not None and not named.all():
        out.chars[~named] = chars_of(np.flatnonzero(~named))
    same = named & (not refit)
    kept = np.nonzero(same)[0]
    with reporter.task("synonyms: cells", total=n - len(kept)) as task:
        if refit:
            plan = fit_cells(matrix, per_entity, cell_size)
        out.plan, out.cell_settings = plan, settings
        out.cells = np.empty((n, min(per_entity, plan.cells)), dtype=np.int32)
        if len(kept):
            out.cells[kept] = prev.cells[old[kept]]
        out.cells[~same] = nearest_cells(matrix[~same], plan, per_entity, on_rows=task.advance)
    fwd = np.full(len(prev.keys), -1, dtype=np.int64)                          # prev row -> row (-1 gone)
    fwd[old[kept]] = kept
    if len(kept):
        pn = prev.nbr[old[kept]]
        mapped = _remap(pn, fwd)
        out.nbr[kept] = mapped
        out.sim[kept] = np.where(mapped >= 0, prev.sim[old[kept]], -np.inf)
        lost = ((pn >= 0) & (mapped < 0)).any(axis=1)
    else:
        lost = np.zeros(0, dtype=bool)
    query = ~same
    query[kept[lost]] = True
    # A queried entity q also belongs in the list of a kept entity x when x ranks q in its top k, which q's own
    # top k need not show (x may be 12th for q), so the join offers q to the kept entities of its cells.
    with reporter.task("synonyms: nearest entities", total=int(query.sum()) * out.cells.shape[1]) as task:
        found = join(matrix, out.cells, plan.cells, query, k, out.sim[:, k - 1], on_cell=task.advance,
                     min_sim=min_sim)
    spans = forkpool.ranges(len(found.rows), _BEST_K_BATCH)
    for s, (nbr, sim) in forkpool.run_tasks(_best_of, (found.nbr, found.sim, k), spans,
                                            found.nbr.size >= _BEST_K_PARALLEL):
        rows = found.rows[s:s + len(nbr)]
        out.nbr[rows], out.sim[rows] = nbr, sim
    out.joined[found.rows] = True
    if len(found.offer_to):
        targets, osrc, osim = _group_offers(found.offer_to, found.offer_from, found.offer_sim, k)
        nbr, sim = best_k(np.concatenate([out.nbr[targets], osrc], axis=1),
                          np.concatenate([out.sim[targets], osim], axis=1), k)
        out.nbr[targets], out.sim[targets] = nbr, sim
        # a slot holding an offered row took the offer's cosine unless its own was higher: either way the slot
        # is marked (re-scoring a cosine that already was exact gives it again, bit for bit)
        out.joined[targets] |= (nbr[:, :, None] == np.where(osrc >= 0, osrc, -2)[:, None, :]).any(axis=2)
    return out, len(found.rows)


FOLD_DIM = 256     # columns the neighbour search of sparse (builtin) name vectors runs in
assert BAND % FOLD_DIM == 0, "fold reads a column mod FOLD_DIM off its byte within its band"
# How far below the threshold the neighbour search keeps candidates: only neighbours at or above the threshold
# become pairs, so weaker ones are never listed. Folded cosines stray from the exact ones: on a 10k-passage
# bench/scale.py corpus the 73k listed pairs at >= 0.8 had folded cosines >= 0.657, so 0.3 leaves room.
FOLD_MARGIN = 0.3
EXACT_MARGIN = 1e-3    # unfolded vectors are searched at their own cosines: float rounding only


def fold(rows: DenseRows | SparseRows) -> np.ndarray | None:
    """The matrix the neighbour search runs on for sparse name vectors (None: search the vectors themselves).
    The builtin embedder's names fill 10-60 of 2048 hashed buckets; folded to FOLD_DIM columns (bucket b adds
    into b mod FOLD_DIM, i.e. the same features hashed into fewer buckets) the self-join, which costs in
    proportion to the width, runs 8x narrower, and `rescore` puts the exact full-width cosines back, so
    thresholds and edge weights are unchanged."""
    if not isinstance(rows, SparseRows) or rows.dim <= FOLD_DIM or rows.dim % FOLD_DIM:
        return None
    n = len(rows)
    out = np.empty((n, FOLD_DIM), dtype=np.float32)
    # a value's column mod FOLD_DIM is its byte within its band (`SparseRows.low`, bands of BAND columns: see the
    # assert below FOLD_DIM), and a block's values lie in one run of the row arrays: no `take` of each block's columns
    # (the sums in float64, each row then cast, normed and divided in place in its slice of `out`: the same
    # floats as a float32 copy normed by np.linalg.norm, with a third of the whole-matrix passes)
    low, data, ptr = rows.low, rows.data, rows.indptr
    for s in range(0, n, _EMBED_BLOCK):
        e = min(n, s + _EMBED_BLOCK)
        a, b = int(ptr[s]), int(ptr[e])
        cell = np.repeat(np.arange(0, (e - s) * FOLD_DIM, FOLD_DIM, dtype=np.int64), np.diff(ptr[s:e + 1]))
        cell += low[a:b] if FOLD_DIM == BAND else low[a:b] % FOLD_DIM      # uint8 % 256 would overflow
        f = out[s:e]
        np.copyto(f, np.bincount(cell, weights=data[a:b].astype(np.float64), minlength=(e - s) * FOLD_DIM
                                 ).reshape(e - s, FOLD_DIM), casting="same_kind")
        norms = np.sqrt(np.add.reduce(f * f, axis=1, keepdims=True))
        f /= np.where(norms > 0, norms, 1)
    return out


def rescore(knn: KnnLists, full: SparseRows, rows: np.ndarray | None = None, block: int = 4096,
            slots: np.ndarray | None = None) -> None:
    """Replace the cosines of the lists of `rows` (default: all, or those with a slot in `slots`) by exact ones
    from the full (sparse) vectors and re-order each list by them. Each neighbour's stored values are multiplied
    into the row's dense vector: a name fills a few dozen of the 2048 columns, so this touches 1-3 % of what
    densifying both sides did (57 of the stage's 1,270 s wall at 100k passages, before). `slots` ((n, k) bool):
    only those slots' cosines are computed, the others are exact already (a +1 % run: 52k kept lists were
    offered a row or two; their other slots are the cosines an earlier rescore gave, which it would give
    again)."""
    n, k = knn.nbr.shape
    if rows is None:
        rows = np.arange(n) if slots is None else np.flatnonzero(slots.any(axis=1))
    rows = np.asarray(rows, dtype=np.int64)
    # A featureless name (a bare number) gets a fully dense fallback vector and is a neighbour of many lists:
    # such rows are densified once and dotted as dense vectors, not spelled out value by value per list.
    heavy = np.flatnonzero(np.diff(full.indptr) > full.dim // 8)
    heavy_at = np.full(len(full), -1, dtype=np.int64)
    heavy_at[heavy] = np.arange(len(heavy))
    heavy_rows = full.dense(heavy)
    # the rows' dense vectors in one buffer whose written entries are zeroed again after each block (the
    # lists a +1 % run extends are a tenth of them: a fresh (block, dim) array each block was most of the work)
    a = np.zeros((min(block, len(rows)), full.dim), dtype=np.float32)
    for s in range(0, len(rows), block):
        at = rows[s:s + block]
        nbr = knn.nbr[at]
        ok = nbr >= 0
        lens, cols, vals = full.take(at)
        filled = (np.repeat(np.arange(len(at)), lens), cols)
        a[filled] = vals
        todo = np.flatnonzero(ok if slots is None else ok & slots[at])    # the slots computed
        flat = nbr.ravel()[todo].astype(np.int64)
        hv = heavy_at[flat]
        light = np.flatnonzero(hv < 0)
        lens, cols, vals = full.take(flat[light])
        pair = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
        dots = np.zeros(len(flat), dtype=np.float64)
        dots[light] = np.bincount(pair, weights=a[todo[light[pair]] // k, cols] * vals, minlength=len(lens))
        dense_at = np.flatnonzero(hv >= 0)
        dots[dense_at] = np.einsum("id,id->i", a[todo[dense_at] // k], heavy_rows[hv[dense_at]])
        sims = np.where(ok, knn.sim[at], -np.inf).astype(np.float32)
        sims.ravel()[todo] = dots
        order = np.lexsort((np.where(ok, nbr, np.iinfo(np.int32).max), -sims), axis=1)
        knn.nbr[at] = np.take_along_axis(np.where(ok, nbr, -1), order, 1)
        knn.sim[at] = np.take_along_axis(sims, order, 1)
        a[filled] = 0


def candidate_pairs(knn: KnnLists, ok: Callable[[str], bool] | np.ndarray, threshold: float
                    ) -> dict[tuple[str, str], float]:
    """(a, b) with a < b -> similarity, for every listed neighbour at or above the threshold, both `ok` (a
    predicate on ids, asked only of the entities in such a pair: a fraction of them; or a bool per row)."""
    lo, hi, s, named = _pair_rows(knn, ok, threshold)
    pairs: dict[tuple[str, str], float] = {}
    for x, y, v in zip(lo.tolist(), hi.tolist(), s.tolist()):
        ia, ib = named[x], named[y]
        pairs[(ia, ib) if ia < ib else (ib, ia)] = v
    return pairs


def pair_records(knn: KnnLists, ok: np.ndarray, threshold: float) -> list[dict] | None:
    """The records of `candidate_pairs` in (a, b) order ({a, b, similarity} rounded to 6 places), made from
    the row pairs without a dict of 150k pairs and its sort; None when the lists' rows are not in id order
    (then their order is not the ids')."""
    keys = knn.keys
    if len(keys) > 1 and not bool((keys[1:] > keys[:-1]).all()):
        return None
    lo, hi, s, named = _pair_rows(knn, ok, threshold)
    return [{"a": named[x], "b": named[y], "similarity": round(v, 6)}
            for x, y, v in zip(lo.tolist(), hi.tolist(), s.tolist())]


def _pair_rows(knn: KnnLists, ok: Callable[[str], bool] | np.ndarray, threshold: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """The pairs of `candidate_pairs` as rows lo < hi in (lo, hi) order and their best cosines; lo and hi as
    places in the ids of the rows in a pair (the last item, decoded once each)."""
    n = len(knn.nbr)
    a, slot = np.nonzero((knn.nbr >= 0) & (knn.sim >= threshold))       # row by row, as the lists are laid out
    b, s = knn.nbr[a, slot].astype(np.int64), knn.sim[a, slot]
    keep = a != b
    a, b, s = a[keep].astype(np.int64), b[keep], s[keep]
    keys = knn.keys
    if isinstance(ok, np.ndarray):
        linkable_row = ok
    else:
        linkable_row = np.zeros(n, dtype=bool)
        asked = np.unique(np.concatenate([a, b]))
        linkable_row[asked] = np.fromiter((ok(keys[r].decode("utf-8")) for r in asked.tolist()), dtype=bool,
                                          count=len(asked))
    keep = linkable_row[a] & linkable_row[b]
    a, b, s = a[keep], b[keep], s[keep]
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    order = np.lexsort((-s, hi, lo))                    # per pair, its best cosine first
    lo, hi, s = lo[order], hi[order], s[order]
    first = np.ones(len(lo), dtype=bool)
    first[1:] = (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])
    lo, hi, s = lo[first], hi[first], s[first]
    used = np.zeros(n, dtype=bool)                      # each entity's id decoded once, not once per pair
    used[lo], used[hi] = True, True
    at = np.cumsum(used) - 1
    return at[lo], at[hi], s, _decoded(keys[used])


# -- review / accept ----------------------------------------------------------------------------------------
def _cell(text: str) -> str:
    return " ".join(str(text).split())


def write_review(path: Path, rows: list[dict], names: dict[str, str]) -> None:
    lines = ["\t".join(TSV_COLUMNS)]
    for r in rows:
        a, b = r["a"], r["b"]
        lines.append("\t".join([a, b, _cell(names.get(a, a)), _cell(names.get(b, b)),
                                f"{r['similarity']:.4f}", r["action"]]))
    try:
        store.atomic_write_text(Path(path), "\n".join(lines) + "\n")
    except OSError as exc:
        raise UsageError(f"cannot write review file {path}: {exc.strerror or exc}") from None


def read_review(path: Path, names: dict[str, str]) -> list[dict]:
    """Parse a reviewed TSV; every problem is a one-line UsageError raised before anything is written."""
    text = store.read_input_text(path, "--accept")
    lines = [(n, ln) for n, ln in enumerate(text.splitlines(), 1) if ln.strip() and not ln.startswith("#")]
    if not lines:
        raise UsageError(f"{path}: empty review file")
    header = [h.strip().lower() for h in lines[0][1].split("\t")]
    if not {"a", "b", "action"} <= set(header):
        raise UsageError(f"{path}: the first line must name the columns {', '.join(TSV_COLUMNS)}")
    col = {h: i for i, h in enumerate(header)}
    out: list[dict] = []
    for n, ln in lines[1:]:
        cells = ln.split("\t")
        if len(cells) < len(header):
            raise UsageError(f"{path}:{n}: expected {len(header)} tab-separated columns, got {len(cells)}")
        a, b = cells[col["a"]].strip(), cells[col["b"]].strip()
        action = cells[col["action"]].strip().lower()
        if action not in ACTIONS:
            raise UsageError(f"{path}:{n}: action must be link, merge or skip, not {action!r}")
        for x in (a, b):
            if x not in names:
                raise UsageError(f"{path}:{n}: unknown entity id {x!r}")
        if a == b:
            raise UsageError(f"{path}:{n}: an entity cannot be its own synonym")
        sim = None
        if "similarity" in col and cells[col["similarity"]].strip():
            try:
                sim = float(cells[col["similarity"]])
            except ValueError:
                raise UsageError(f"{path}:{n}: similarity {cells[col['similarity']]!r} is not a number") from None
        out.append({"a": a, "b": b, "action": action, "similarity": sim})
    return out


def load_decisions(project: Project) -> dict[tuple[str, str], dict]:
    out: dict[tuple[str, str], dict] = {}
    for r in store.read_jsonl(project.graph_dir / DECISIONS_FILE):
        if not (isinstance(r, dict) and isinstance(r.get("a"), str) and isinstance(r.get("b"), str)
                and r.get("action") in ACTIONS):
            continue   # a hand-edited or damaged line: skipped like any bad JSONL line
        a, b = r["a"], r["b"]
        out[(a, b) if a < b else (b, a)] = r
    return out


def save_decisions(project: Project, decisions: dict[tuple[str, str], dict]) -> None:
    store.write_jsonl(project.graph_dir / DECISIONS_FILE, (decisions[k] for k in sorted(decisions)))


def apply_decisions(pairs: dict[tuple[str, str], float], decisions: dict[tuple[str, str], dict],
                    names: dict[str, str]) -> tuple[dict[tuple[str, str], float], int, int]:
    """Auto pairs overridden by reviewed decisions; returns (pairs, links added, merges)."""
    out = dict(pairs)
    added = merges = 0
    for key, d in decisions.items():
        if key[0] not in names or key[1] not in names:
            continue
        if d["action"] == "skip":
            out.pop(key, None)
        elif d["action"] == "merge":
            out[key] = 1.0
            merges += 1
        else:
            if key not in out:
                added += 1
            sim = d.get("similarity")
            out[key] = float(sim) if sim is not None else out.get(key, 1.0)
    return out, added, merges


# -- the stage --------------------------------------------------------------------------------------------
_EMBED_BLOCK = 4096        # texts embedded per block (bounds the dense float32 in flight: 32 MB at 2048 dims)
_HELD_TEXTS = 16 * _EMBED_BLOCK     # texts to embed kept from the hashing pass (else read again)
_PARALLEL_MIN = 4 * _EMBED_BLOCK    # fewer texts than this are embedded in this process (a pool costs a fork)
def _encode_in_worker(emb: Embedder, texts: list[str]) -> tuple[np.ndarray | SparseRows, int]:
    before = emb.stats["embedded"]
    m = emb.encode(texts)
    return (sparse_rows(m) if mostly_zero(m) else m), emb.stats["embedded"] - before


def embed_blocks(emb: Embedder, batches: Iterable[list[str]], total: int, reporter: Reporter,
                 min_parallel: int = _PARALLEL_MIN) -> Iterator[np.ndarray | SparseRows]:
    """The embedded batches, in order. The builtin embedder (no cache, pure Python and numpy, 60 % of the stage
    at 10k passages) runs in one forked worker per core (forkpool.py), each handing back sparse rows (a few % of
    the dense bytes); a cached or remote embedder, a single core, or a job under `min_parallel` texts stays in
    this process. At most two batches per worker are in flight, so memory stays bounded whatever the total."""
    if emb.cache is not None or forkpool.workers() < 2 or total < min_parallel:
        for batch in batches:
            yield emb.encode(batch, reporter=reporter)
        return
    with reporter.task(f"embed {emb.model_id}", total=total) as task:
        for block, embedded in forkpool.forked_map(_encode_in_worker, emb, batches):
            emb.stats["embedded"] += embedded
            task.advance(len(block))
            yield block


def _sync_index(project: Project, settings: Settings, emb: Embedder, name: str,
                items: Callable[[], Iterable[tuple[str, str]]], reporter: Reporter, graph: bool = True,
                synced: str = "") -> tuple[VectorIndex, dict]:
    """Bring one vector index up to date: hash every item's text (one streamed pass), embed only the items
    the saved index lacks, save. `items()` yields (id, text) afresh on each call. The pass keeps the texts to
    embed while they are few (a later run adds a few %); past _HELD_TEXTS it drops them and a second pass
    streams them in blocks, so a first build of millions of items never holds its texts."""
    vs = settings.vectors if graph else replace(settings.vectors, exact_below=1 << 62)   # never an HNSW graph
    idx = VectorIndex.load_or_create(project.vectors_dir, name, vs, emb.model_id, emb.backend.known_dim() or 0)
    ids: list[str] = []
    hashes: list[str] = []
    stored: list[int] = []
    held: list[str] | None = []
    stored_row = idx.stored_row
    for item_id, text in items():
        h = text_hash(text)
        r = stored_row(item_id, h)
        if held is not None and r < 0:
            held.append(text)
            if len(held) > _HELD_TEXTS:
                held = None
        ids.append(item_id)
        hashes.append(h)
        stored.append(r)
    rows = np.array(stored, dtype=np.int64)
    wanted = rows < 0
    todo = np.flatnonzero(wanted)

    def batches() -> Iterator[list[str]]:
        if held is not None:
            yield from (held[i:i + _EMBED_BLOCK] for i in range(0, len(held), _EMBED_BLOCK))
            return
        batch: list[str] = []
        for p, (_, text) in enumerate(items()):
            if wanted[p]:
                batch.append(text)
                if len(batch) >= _EMBED_BLOCK:
                    yield batch
                    batch = []
        if batch:
            yield batch

    counts = idx.sync(ids, hashes, embed_blocks(emb, batches(), len(todo), reporter), rows=todo, stored=rows)
    idx.synced = synced          # the resolve output these rows follow: a later run's change list starts there
    idx.save(project.vectors_dir)
    return idx, counts


# -- an incremental run: only the records resolve added or made again -------------------------------------


class _Names:
    """Entity id -> name. The full pass fills it as it reads entities.jsonl; an incremental run holds only the
    names of the entities resolve changed and reads the file whole the first time another is asked for (a
    review, reviewed decisions, relation texts: not a plain +1 % run)."""

    def __init__(self, path: Path) -> None:
        self._path, self._d, self._full = path, {}, False

    def __setitem__(self, key: str, name: str) -> None:
        self._d[key] = name

    def filled(self) -> None:
        """The caller has put every entity's name in (the full pass reads entities.jsonl for its vectors)."""
        self._full = True

    def fill(self) -> "_Names":
        if not self._full:
            self._d.update((r["id"], r["name"]) for r in store.read_jsonl(self._path))
            self._full = True
        return self

    def get(self, key: str, default: Any = None) -> Any:
        got = self._d.get(key)
        if got is None and not self._full:
            got = self.fill()._d.get(key)
        return default if got is None else got

    def __getitem__(self, key: str) -> str:
        got = self.get(key)
        if got is None:
            raise KeyError(key)
        return got

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def items(self) -> Iterable[tuple[str, str]]:
        return self.fill()._d.items()


def resolve_change(project: Project) -> dict | None:
    """graph/changed_ids.json when it leads to the resolve output on disk and removes nothing (a patch only adds
    or makes records again), else None: what changed is unknown and every record is read."""
    rec = project.stage("resolve")
    got = store.read_json(project.changed_ids_path)
    if rec is None or not isinstance(got, dict) or got.get("to") != rec.output_digest or not got.get("from"):
        return None
    removed = got.get("removed") or {}
    if not isinstance(removed, dict) or any(removed.values()):
        return None
    if not all(isinstance(got.get(k), list) for k in ("entities", "facts")):
        return None
    return got


class _Plan:
    """Where the records resolve changed go in an index synced with the previous resolve output: each changed
    id in final row order, its old row (-1: new) and the old row it goes ahead of; `lines` are their final rows,
    which are their lines in the record file (an index's rows follow its file)."""

    def __init__(self, ids: list[str], old_rows: np.ndarray, before: np.ndarray, n_old: int) -> None:
        self.ids, self.old_rows, self.before = ids, old_rows, before
        self.lines, _ = VectorIndex.insert_positions(n_old, old_rows, before)
        self.total = n_old + int((old_rows < 0).sum())


def _by_bytes(ids: Iterable[str]) -> np.ndarray:
    """Distinct ids as fixed-width bytes, sorted (as the indices' `korder` sorts them)."""
    return np.unique(fixed_bytes(list(ids)))


def _sorted_plan(idx: VectorIndex, changed: list[str]) -> _Plan | None:
    """For an index whose rows are in id order (entities and their names: entities.jsonl is sorted by id): a
    new id goes where its id sorts."""
    order = idx.id_order()
    if not np.array_equal(order, np.arange(len(order))):
        return None
    rows, ch = idx.id_array(), _by_bytes(changed)
    at = np.searchsorted(rows, ch)
    exists = np.zeros(len(ch), dtype=bool)
    inside = at < len(rows)
    exists[inside] = rows[at[inside]] == ch[inside]
    return _Plan([c.decode("utf-8") for c in ch.tolist()], np.where(exists, at, -1), at, len(rows))


_QUOTE, _BACKSLASH = ord('"'), ord("\\")


def _line_ids(path: Path) -> tuple[np.ndarray, Callable[[int], bytes]] | None:
    """The id of every line of a plain record file whose lines all start with an id of one width
    ({"id":"<id>",...: facts.jsonl), found with numpy instead of parsing 1.9M lines, and line i's bytes. A file
    with a patch (store.Patch): the logical file's, the patch lines' ids spliced in at their rows. None when a
    line does not look so (the caller reads the file instead)."""
    try:
        patch = store.read_patch(path)
    except store.PatchError:
        return None
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError):
        return None
    step = 1 << 26
    ends = np.concatenate([np.flatnonzero(data[s:s + step] == 10) + s + 1 for s in range(0, len(data), step)]
                          or [np.zeros(0, np.int64)])
    if not len(ends) or int(ends[-1]) != len(data):
        return None
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    ids = _fixed_ids(data, starts, ends)
    if ids is None:
        return None
    if patch is None:
        return ids, lambda i: bytes(data[starts[i]:ends[i]])
    if len(ids) != patch.base_lines:
        return None
    pdata = np.frombuffer(patch.data, dtype=np.uint8)
    pids = _fixed_ids(pdata, patch.starts[:-1], patch.starts[1:]) if len(patch) else ids[:0]
    if pids is None or pids.dtype != ids.dtype:
        return None
    in_base = np.ones(patch.lines, dtype=bool)
    in_base[patch.rows] = False
    kept = np.ones(len(ids), dtype=bool)
    kept[patch.base[patch.base >= 0]] = False
    logical = np.empty(patch.lines, dtype=ids.dtype)
    logical[patch.rows] = pids
    logical[in_base] = ids[kept]
    lines = store.JsonlLines(path)
    return logical, lambda i: lines.raw(i) or b""


def _fixed_ids(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray | None:
    """The fixed-width ids the lines data[starts:ends] start with ({"id":"<id>",), None when they do not."""
    prefix = b'{"id":"'
    if not len(starts) or bytes(data[starts[0]:starts[0] + len(prefix)]) != prefix:
        return None
    width = bytes(data[starts[0] + len(prefix):starts[0] + len(prefix) + 256]).find(b'"')
    if width <= 0 or bool((ends - starts < len(prefix) + width + 2).any()):
        return None
    head = data[starts[:, None] + np.arange(len(prefix) + width + 2)]
    ids = head[:, len(prefix):len(prefix) + width]
    if not (bool((head[:, :len(prefix)] == np.frombuffer(prefix, np.uint8)).all())
            and bool((head[:, -2] == _QUOTE).all()) and bool((head[:, -1] == ord(",")).all())
            and not bool(((ids == _QUOTE) | (ids == _BACKSLASH)).any())):
        return None
    return np.ascontiguousarray(ids).view(f"S{width}").ravel()


def _file_order_plan(idx: VectorIndex, changed: list[str], file_ids: np.ndarray) -> _Plan | None:
    """For an index whose rows follow a record file in key order (facts): the file's ids are the old rows with
    the new ids inserted, which is checked, so where each new id goes is read off the file."""
    rows = idx.id_array()
    ch = _by_bytes(changed)
    held_at = _old_rows(idx, ch)
    exists = held_at >= 0
    fresh = ch[~exists]
    j = np.searchsorted(fresh, file_ids)
    is_new = np.zeros(len(file_ids), dtype=bool)
    inside = j < len(fresh)
    is_new[inside] = fresh[j[inside]] == file_ids[inside]
    if int(is_new.sum()) != len(fresh) or not np.array_equal(file_ids[~is_new], rows):
        return None
    new_at = np.flatnonzero(is_new)                    # file lines = final rows of the new ids
    ahead_of = new_at - np.arange(len(new_at))          # the old row each goes ahead of
    _, moved = VectorIndex.insert_positions(len(rows), np.full(len(new_at), -1), ahead_of)
    remade = held_at[exists]
    final = np.concatenate([new_at, moved[remade]])
    old_rows = np.concatenate([np.full(len(new_at), -1, dtype=np.int64), remade])
    before = np.concatenate([ahead_of, remade])
    listed = np.argsort(final, kind="stable")
    ids = [file_ids[p].decode("utf-8") for p in final[listed].tolist()]
    return _Plan(ids, old_rows[listed], before[listed], len(rows))


def _old_rows(idx: VectorIndex, keys: np.ndarray) -> np.ndarray:
    """Per key (fixed-width bytes), its row in the index, -1 when it has none (searched through the index's id
    order: no sorted copy of 1.9M ids made)."""
    return _rows_in(idx.id_array(), keys, idx.id_order())


def _held(idx: VectorIndex, file_ids: np.ndarray) -> list[bool]:
    """Per id (fixed-width bytes), whether the index has a row for it."""
    return (_old_rows(idx, file_ids) >= 0).tolist()


def _chunk_plan(idx: VectorIndex, chunk_ids: list[str]) -> _Plan | None:
    """For the chunk index: a chunk id is a hash of its text, so the chunks it lacks are the new ones and every
    other is held as it is; None when a chunk went (an edited or deleted document: every chunk is read)."""
    file_ids = fixed_bytes(chunk_ids)
    fresh = [i for i, held in zip(chunk_ids, _held(idx, file_ids)) if not held]
    return _file_order_plan(idx, fresh, file_ids)


class _Chunks:
    """Chunk id -> text (the first row of each id, in file order) and the row count, read from chunks.jsonl
    the first time they are asked for: a +1 % run whose chunk index ends at a known `chunk_mark` never asks."""

    def __init__(self, project: Project) -> None:
        self._path, self._texts, self._rows = project.chunks_path, None, 0

    def all(self) -> dict[str, str]:
        if self._texts is None:
            texts: dict[str, str] = {}
            for c in store.read_jsonl(self._path):
                texts.setdefault(c["chunk_id"], c["text"])
                self._rows += 1
            self._texts = texts
        return self._texts

    def rows(self) -> int:
        self.all()
        return self._rows


def _chunks_token(mark: dict | None, synced: str) -> str:
    """What the chunk index is synced with: the `chunk_mark` of the chunks it holds (else the resolve output,
    as the other indices)."""
    return orjson.dumps(mark, option=orjson.OPT_SORT_KEYS).decode() if mark is not None else synced


def _appended_chunks(project: Project, idx: VectorIndex) -> tuple[_Plan, dict[str, str]] | None:
    """When the chunk index holds the chunks up to a `chunk_mark` (its `synced` token) and chunks were only
    appended since: the plan putting the new ones at its end (the order a fresh build gives: first rows in
    file order) and the appended chunks' texts, read from the file's end only. Else None: every chunk is
    read."""
    try:
        mark = orjson.loads(idx.synced) if idx.synced.startswith("{") else None
    except orjson.JSONDecodeError:
        mark = None
    added = added_since(project, mark) if isinstance(mark, dict) else None
    if added is None:
        return None
    texts: dict[str, str] = {}
    for c in added[1]:
        texts.setdefault(c.chunk_id, c.text)
    ids = list(texts)
    fresh = [i for i, held in zip(ids, _held(idx, fixed_bytes(ids)) if ids else []) if not held]
    n = len(idx)
    return _Plan(fresh, np.full(len(fresh), -1, dtype=np.int64), np.full(len(fresh), n, dtype=np.int64), n), texts


def _load_for_insert(project: Project, name: str, settings: Settings, emb: Embedder, synced: str | None
                     ) -> VectorIndex | None:
    """The saved index when `insert` can bring it up to date: same embedder and dimension, synced with the
    resolve output the change list starts from (None: any), no graph."""
    try:
        idx = VectorIndex.load(project.vectors_dir, name, settings.vectors, lazy_ids=True, read_at=False)
    except HragError:
        return None
    dim = emb.backend.known_dim() or 0
    if idx is None or not len(idx) or idx.model_id != emb.model_id or (dim and idx.dim != dim) \
            or (synced is not None and idx.synced != synced) or not idx.insertable():
        return None
    return idx


def _changed_texts(project: Project, name: str, idx: VectorIndex, change: dict, names: _Names
                   ) -> tuple[_Plan, list[str]] | None:
    """Where the records resolve changed go in this index (entities or facts) and their texts, read at their
    lines only, each checked to hold the id expected; None when the files do not match the change list (the
    caller then reads every record)."""
    path, text = (project.entities_path, lambda r: entity_text(r["name"], r["description"])) \
        if name == "entities" else (project.facts_path, _fact_row_text)
    lines = store.JsonlLines(path)
    patched = _patch_plan(idx, lines, change[name])
    if patched is not None:
        plan, records = patched
        if name == "entities":
            for r in records:
                names[r["id"]] = r["name"]
        return plan, [text(r) for r in records]
    if name == "entities":
        plan = _sorted_plan(idx, change["entities"])
        if plan is None or len(lines) != plan.total:
            return None
        texts = []
        for i, line in zip(plan.ids, plan.lines.tolist()):
            r = lines.record(line)
            if not isinstance(r, dict) or r.get("id") != i:
                return None
            names[i] = r["name"]
            texts.append(text(r))
        return plan, texts
    scanned = _line_ids(project.facts_path)
    plan = _file_order_plan(idx, change["facts"], scanned[0]) if scanned is not None else None
    if scanned is None or plan is None:
        return None
    raw = scanned[1]
    texts = []
    for i, line in zip(plan.ids, plan.lines.tolist()):
        r = orjson.loads(raw(line))
        if not isinstance(r, dict) or r.get("id") != i:
            return None
        texts.append(_fact_row_text(r))
    return plan, texts


def _patch_plan(idx: VectorIndex, lines: store.JsonlLines, changed: list[str]) -> tuple[_Plan, list[dict]] | None:
    """For a record file kept as a base and a patch (store's record patch): the patch's lines are the records
    resolve added or made again, at their logical lines, which are the index's final rows (its rows follow the
    file). A listed id the index holds is made again in place, one it lacks is inserted where its line says.
    Returns the plan and the changed records; None when the file has no patch, the patch lacks a record of the
    change list (`changed`) or its lines do not fit the index (the caller scans the file)."""
    got = lines.patch_lines()
    if got is None:
        return None
    rows, raws = np.asarray(got[0], dtype=np.int64), got[1]
    records = [orjson.loads(raw) for raw in raws]
    if not all(isinstance(r, dict) and isinstance(r.get("id"), str) for r in records):
        return None                  # a line that is not a record
    ids = [r["id"] for r in records]
    wanted = set(changed)            # a patch kept across runs also holds lines the index already has as they are
    if not wanted <= set(ids):
        return None
    keep = [j for j, i in enumerate(ids) if i in wanted]
    rows, records = rows[keep], [records[j] for j in keep]
    plan = _rows_plan(idx, [ids[j] for j in keep], rows, len(lines))
    return (plan, records) if plan is not None else None


def _rows_plan(idx: VectorIndex, ids: list[str], rows: np.ndarray, total: int) -> _Plan | None:
    """The plan putting `ids` at their final rows `rows` (ascending) of an index that will hold `total` rows:
    held ids stay where their old row moves to, the others are inserted; None when that does not add up."""
    if len(rows) != len(ids) or (len(rows) and (bool((np.diff(rows) <= 0).any()) or rows[0] < 0
                                                 or rows[-1] >= total)):
        return None
    keys = fixed_bytes(ids) if ids else np.zeros(0, dtype="S1")
    old_rows = _old_rows(idx, keys)
    held = old_rows >= 0
    new_at = rows[~held]
    if len(idx) + len(new_at) != total:
        return None
    before = np.empty(len(ids), dtype=np.int64)
    before[~held] = new_at - np.arange(len(new_at))          # the old row each new one goes ahead of
    before[held] = old_rows[held]
    try:
        plan = _Plan(ids, old_rows, before, len(idx))
    except ValueError:
        return None
    return plan if np.array_equal(plan.lines, rows) else None


def _insert_index(project: Project, emb: Embedder, idx: VectorIndex, plan: _Plan, texts: list[str],
                  synced: str, reporter: Reporter) -> dict:
    """Embed the changed records' texts and splice them into the index (`VectorIndex.insert`), save. A record
    made again from the same text (a new source of an old fact) keeps its row: it is not embedded again."""
    hashes = [text_hash(t) for t in texts]
    held = idx.hash_rows(plan.old_rows)
    redo = [p for p, (r, h) in enumerate(zip(plan.old_rows.tolist(), hashes)) if r < 0 or held[p] != h]
    texts, hashes = [texts[p] for p in redo], [hashes[p] for p in redo]
    batches = (texts[i:i + _EMBED_BLOCK] for i in range(0, len(texts), _EMBED_BLOCK))
    counts = idx.insert([plan.ids[p] for p in redo], hashes, plan.old_rows[redo], plan.before[redo],
                        embed_blocks(emb, batches, len(texts), reporter))
    idx.synced = synced
    idx.save(project.vectors_dir)
    return counts


def _jsonl_items(path: Path, text: Callable[[dict], str]) -> Callable[[], Iterator[tuple[str, str]]]:
    return lambda: ((r["id"], text(r)) for r in store.read_jsonl(path))


def _drop_name_graph(vectors_dir: Path) -> None:
    """Earlier versions kept an HNSW graph of the name vectors; the cells replaced it, so its files go."""
    for path in (VectorIndex.paths(vectors_dir, NAMES)[0], vectors_dir / f"{NAMES}.pca.npy"):
        path.unlink(missing_ok=True)


def _sync_bm25(project: Project, chunks: "_Chunks", appended: dict[str, str] | None, reporter: Reporter,
               total: int) -> dict:
    """BM25 over chunk texts, updated by chunk id (a chunk id is a hash of its text, so ids say it all).
    `appended`: only chunks were appended since the index was synced (none went): just those are looked at."""
    from hrag_cli.storage.bm25 import BM25_FILE, BM25Index

    path = project.vectors_dir / BM25_FILE
    bm = None
    if path.exists():
        try:
            bm = BM25Index.load(path)
        except Exception:
            reporter.warn(f"{path} is unreadable; rebuilding the BM25 index")
            bm = None
    if bm is None:
        bm, appended = BM25Index(), None
    texts, gone = appended or {}, []
    new = [i for i in texts if i not in bm]
    # the chunk index holds `total` chunks and was saved first: a run stopped between the two saves left BM25
    # short of chunks no later `appended` names, so then every chunk is compared
    if appended is None or len(bm) + len(new) != total:
        texts = chunks.all()
        have = set(bm.doc_ids())
        gone = [i for i in have if i not in texts]
        new = [i for i in texts if i not in have]
    for i in gone:
        bm.remove(i)
    bm.add_many((i, texts[i]) for i in new)
    if gone or new or not path.exists():
        bm.save(path)
    return {"bm25_chunks": len(bm), "bm25_added": len(new), "bm25_removed": len(gone)}


def check_settings(settings: Settings) -> None:
    """Out-of-range [synonyms] values stop the run before anything is embedded or written."""
    s = settings.synonyms
    for key, ok, rule in (("top_k", s.top_k >= 1, "at least 1"),
                          ("threshold", -1.0 <= s.threshold <= 1.0, "between -1 and 1"),
                          ("min_name_chars", s.min_name_chars >= 0, "at least 0"),
                          ("cells_per_entity", s.cells_per_entity >= 1, "at least 1"),
                          ("cell_size", s.cell_size >= 2, "at least 2")):
        if not ok:
            raise UsageError(f"setting synonyms.{key}: {getattr(s, key)!r} must be {rule}")


def run_synonyms(project: Project, settings: Settings, reporter: Reporter, review_path: Path | None = None,
                 accept_path: Path | None = None) -> StageOutcome:
    check_settings(settings)
    if review_path is not None and accept_path is not None:
        raise UsageError("--review and --accept cannot be used together: review first, then accept the file")
    # entity id -> name, filled by the entity index's pass over the file (one read of it, not two: 521k rows at
    # 100k passages); a reviewed file is checked against the names before anything is written
    names = _Names(project.entities_path)
    accepted = read_review(accept_path, names.fill()) if accept_path is not None else None

    def entity_items() -> Iterator[tuple[str, str]]:
        for r in store.read_jsonl(project.entities_path):
            names[r["id"]] = r["name"]
            yield r["id"], entity_text(r["name"], r["description"])
        names.filled()

    chunks = _Chunks(project)
    mark = chunk_mark(project)
    n_chunk_rows = mark["chunks"] if mark is not None else chunks.rows()
    idf = refresh_idf(project, settings, (c["text"] for c in store.read_jsonl(project.chunks_path)), n_chunk_rows,
                      reporter)
    emb = get_embedder(project, settings, cache_writes=True)
    extract = project.stage("extract")
    with_relations = relation_vectors(settings, str(extract.counts.get("extractor", "")) if extract else "")
    resolved = project.stage("resolve")
    synced = resolved.output_digest if resolved else ""
    # an incremental run embeds only what resolve changed, spliced into indices synced with its previous output
    # (relation texts name their entities: with relation vectors every name is read, so every record is)
    change = resolve_change(project) if review_path is None and accept_path is None and not with_relations \
        else None
    items: dict[str, Callable[[], Iterable[tuple[str, str]]]] = {
        "chunks": lambda: chunks.all().items(),
        "entities": entity_items,        # before relations, whose texts name their entities
        "relations": _jsonl_items(project.relations_path, lambda r: relation_text(r, names)),
        "facts": _jsonl_items(project.facts_path, _fact_row_text),
    }
    if not with_relations:
        del items["relations"]
        for path in VectorIndex.files(project.vectors_dir, "relations"):   # an earlier run's: never read stale
            path.unlink(missing_ok=True)
    counts: dict[str, Any] = {"relation_vectors": "on" if with_relations else "off"}
    digests: dict[str, Any] = {"model_id": emb.model_id}
    added = inserted = 0
    entity_plan: _Plan | None = None
    appended: dict[str, str] | None = None     # chunks appended since the chunk index's mark (None: read all)
    for name in (n for n in INDEX_NAMES if n in items):
        if name == "chunks":           # chunk ids name their texts: no change list needed
            idx = _load_for_insert(project, name, settings, emb, None)
            tail = _appended_chunks(project, idx) if idx is not None else None
            if tail is not None:
                plan, appended = tail
            else:
                plan = _chunk_plan(idx, list(chunks.all())) if idx is not None else None
            got = (plan, [(appended or chunks.all())[i] for i in plan.ids]) if plan is not None else None
        else:
            idx = _load_for_insert(project, name, settings, emb, change["from"]) \
                if change is not None and name in ("entities", "facts") else None
            got = _changed_texts(project, name, idx, change, names) if idx is not None else None
        token = _chunks_token(mark, synced) if name == "chunks" else synced
        if got is not None:
            plan, texts = got
            c = _insert_index(project, emb, idx, plan, texts, token, reporter)
            entity_plan = plan if name == "entities" else entity_plan
            inserted += 1
        else:
            idx, c = _sync_index(project, settings, emb, name, items[name], reporter, synced=token)
        counts[f"vectors_{name}"] = len(idx)
        added += c["added"]
        digests[name] = idx.digest()
        del idx
    counts["vectors_added"] = added
    counts.update(_sync_bm25(project, chunks, appended, reporter, counts["vectors_chunks"]))
    counts.update(idf)

    # -- synonym edges --
    s = settings.synonyms
    # The name vectors are an index of their own (never searched at query time), so a later run embeds only
    # new or renamed entities; its hashes double as the neighbour lists' keys.
    _drop_name_graph(project.vectors_dir)
    names_idx = _load_for_insert(project, NAMES, settings, emb, change["from"]) \
        if change is not None and entity_plan is not None else None
    name_plan = _sorted_plan(names_idx, entity_plan.ids) if names_idx is not None else None   # type: ignore[union-attr]
    if names_idx is not None and name_plan is not None and name_plan.total == entity_plan.total:   # type: ignore[union-attr]
        _insert_index(project, emb, names_idx, name_plan, [names[i] for i in name_plan.ids], synced, reporter)
        inserted += 1
    else:
        names_idx, _ = _sync_index(project, settings, emb, NAMES, names.items, reporter, graph=False, synced=synced)
    counts["indices_spliced"] = inserted
    ent_keys, ent_hashes = names_idx.id_array(), names_idx.hash_array()     # fixed-width bytes, no str per row
    names_full = names_idx.rows()
    search_matrix = fold(names_full)
    counts["embedded_now"] = emb.stats["embedded"]
    counts["cached"] = emb.stats["cached"]
    digests[NAMES] = names_idx.digest()
    knn_path = project.vectors_dir / KNN_FILE
    min_sim = s.threshold - (FOLD_MARGIN if search_matrix is not None else EXACT_MARGIN)
    knn_model = emb.model_id + (f"+fold{FOLD_DIM}" if search_matrix is not None else "") + f"+min{min_sim:.4f}"
    prev = KnnLists.load(knn_path, s.top_k, knn_model)
    if prev.damaged:
        reporter.warn(f"{prev.damaged}; finding every entity's neighbours again")
    knn, queried = update_knn(prev, ent_keys, ent_hashes,
                              search_matrix if search_matrix is not None else names_full.dense(np.arange(len(ent_keys))),
                              s.top_k, reporter, s.cells_per_entity, s.cell_size, min_sim,
                              chars_of=lambda rows: np.array([name_chars(names[b.decode("utf-8")])
                                                              for b in ent_keys[rows].tolist()], dtype=np.int32))
    if search_matrix is not None:
        rescore(knn, names_full, slots=knn.joined)
    del names_idx, search_matrix
    knn.save(knn_path)
    counts["entities_queried"] = queried
    linkable = knn.chars >= s.min_name_chars
    decisions = load_decisions(project)
    # a plain run (nothing reviewed) writes the pairs as they come, in order; reviewed decisions need them by key
    records = pair_records(knn, linkable, s.threshold) \
        if accepted is None and review_path is None and not decisions else None
    auto = candidate_pairs(knn, linkable, s.threshold) if records is None else {}
    n_auto = len(auto) if records is None else len(records)
    if accepted is not None:
        row_of = {i: p for p, i in enumerate(knn.ids)}
        for r in accepted:
            a, b = r["a"], r["b"]
            key = (a, b) if a < b else (b, a)
            sim = r["similarity"] if r["similarity"] is not None else auto.get(key)
            if sim is None:   # a pair the reviewer added by hand: its real cosine
                va, vb = names_full.dense(np.array([row_of[a], row_of[b]]))
                sim = round(float(va @ vb), 6)
            decisions[key] = {"a": key[0], "b": key[1], "action": r["action"], "similarity": sim}
        save_decisions(project, decisions)
        counts["accepted_rows"] = len(accepted)

    if review_path is not None:
        rows = []
        for key, sim in auto.items():
            d = decisions.get(key)
            rows.append({"a": key[0], "b": key[1], "similarity": sim, "action": d["action"] if d else "link"})
        for key, d in decisions.items():
            if key not in auto and key[0] in names and key[1] in names:
                rows.append({"a": key[0], "b": key[1], "similarity": d.get("similarity") or 0.0,
                             "action": d["action"]})
        rows.sort(key=lambda r: (-r["similarity"], r["a"], r["b"]))
        write_review(review_path, rows, names)
        counts.update({"review_pairs": len(rows), "review_file": str(review_path), "review_only": 1})
        return StageOutcome(counts=counts, output_digest="")

    if records is None:
        pairs, forced, merges = apply_decisions(auto, decisions, names)
        records = [{"a": a, "b": b, "similarity": round(float(sim), 6)} for (a, b), sim in sorted(pairs.items())]
    else:
        forced = merges = 0
    store.write_jsonl(project.synonyms_path, records)
    from hrag_cli.graph.model import save_synonym_edges

    if project.graph_path.exists():
        save_synonym_edges(project, records)
        from hrag_cli.query.ppr import save_chunk_prior

        save_chunk_prior(project, settings)
    counts.update({"synonym_pairs": len(records), "synonym_auto": n_auto, "synonym_forced": forced,
                   "synonym_merges": merges})
    digests["synonyms"] = fingerprint(records)
    return StageOutcome(counts=counts, output_digest=fingerprint(digests))
