"""The synonym pass's neighbour lists (`KnnLists`): per entity its top-k nearest entities by name vector, kept
as arrays with the cells they were joined in, saved as a base with a patch, and brought up to date by joining
only new or changed entities (`update_knn`)."""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hrag_cli.core import base_patch, forkpool, line_patch, store
from hrag_cli.core.progress import Reporter
from hrag_cli.storage.cells import CellPlan, cell_count, fit_cells, join, members, nearest_cells
from hrag_cli.storage.vectors.ids import fixed_bytes, fixed_width, rows_in


def _as_keys(items: Sequence[str] | np.ndarray | None) -> np.ndarray:
    """Strings (or fixed-width bytes already) as fixed-width bytes."""
    if isinstance(items, np.ndarray) and items.dtype.kind == "S":
        return items
    return fixed_bytes(list(items or []))


def decoded(keys: np.ndarray) -> list[str]:
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


# what reading a missing, torn or damaged .npz raises: a damaged deflate stream inside a member stops zlib
# (zlib.error) before zipfile's CRC check is reached
_UNREADABLE = (OSError, ValueError, KeyError, IndexError, EOFError, zipfile.BadZipFile, zlib.error)


class KnnLists:
    """Per entity (row): its top-k neighbours as rows of the same table, their cosines, the text hash the list
    was computed for, and the cells (cells.py) the entity was joined in. Arrays rather than per-entity lists:
    a pass over millions of entities holds tens of millions of neighbours."""

    def __init__(self, k: int, model_id: str, ids: Sequence[str] | np.ndarray | None = None,
                 hashes: Sequence[str] | np.ndarray | None = None,
                 nbr: np.ndarray | None = None, sim: np.ndarray | None = None, plan: CellPlan | None = None,
                 cells: np.ndarray | None = None, cell_settings: tuple[int, int] = (0, 0),
                 chars: np.ndarray | None = None) -> None:
        self.k = k
        self.model_id = model_id
        # ids and text hashes as fixed-width bytes (`fixed_bytes`): a small run matches the entities of the
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
        return decoded(self.keys)

    def save(self, path: Path) -> None:
        """A .npz deflated at level 1 (the base): stored plain it would be about twice the size, and level 1
        costs little. A run that kept the cells
        of the lists it loaded writes only what differs from the base file as a patch beside it
        (`line_patch.patch_path`, `_patch`), until the lists that differ pass `base_patch.NEIGHBOUR_LISTS` of them: then the lists
        are written whole as the new base and the patch goes. The patch names its base by `line_patch.base_mark`.
        np.load reads either file."""
        patch = self._patch()
        if patch is not None:
            _write_npz(line_patch.patch_path(path), patch)
            return
        plan = self.plan or CellPlan(np.zeros((0, 0), dtype=np.float32), np.zeros(0, dtype=np.float32), 0)
        _write_npz(path, {"ids": _joined(self.keys), "hashes": _joined(self.hash_keys),
                          "nbr": self.nbr, "sim": self.sim, "k": np.int64(self.k), "model_id": np.array(self.model_id),
                          "centroids": plan.centroids, "mean": plan.mean, "fit_count": np.int64(plan.fit_count),
                          "cells": self.cells, "cell_settings": np.array(self.cell_settings, dtype=np.int64),
                          "chars": self.chars,
                          "has_plan": np.bool_(self.plan is not None)})
        line_patch.patch_path(path).unlink(missing_ok=True)

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
        base_of = self.base_rows if self.base_rows is not None else rows_in(base.keys, self.keys)   # -1: new
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
        if base_patch.NEIGHBOUR_LISTS.folds(len(rows), len(self.keys)):
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
            base.disk = _Disk(base, line_patch.base_mark(path))
        except OSError:
            return cls(k, model_id)
        try:
            with np.load(line_patch.patch_path(path), allow_pickle=False) as z:
                if (int(z["base_size"]), int(z["base_tail"])) != base.disk.mark:
                    return base
                got = base._patched(z)
        except FileNotFoundError:
            return base
        except _UNREADABLE:
            got = None
        if got is None:
            empty = cls(k, model_id)
            empty.damaged = f"{line_patch.patch_path(path)} is damaged"
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


@dataclass
class _Disk:
    """The base file lists were loaded from: its lists (as saved) and `line_patch.base_mark`, which a patch names."""
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
JOIN_PART_BYTES = 1 << 27    # candidates (8 bytes each) of the queried rows joined at a time
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
    old = rows_in(prev.keys, keys)                                          # row -> its row in prev
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
    # the queried rows are joined a part at a time: a row's candidates (k from each of its cells) are ranked to
    # its k best before the next part's are made, so the candidates held are bounded, not a row's-worth each
    qrows = np.flatnonzero(query)
    part = max(1, JOIN_PART_BYTES // (out.cells.shape[1] * k * 8))
    floor = out.sim[:, k - 1].copy()            # the kept rows' k-th cosines, which only the offers change
    cell_members = members(out.cells, plan.cells)
    offers: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    queried = 0
    with reporter.task("synonyms: nearest entities", total=len(qrows) * out.cells.shape[1]) as task:
        for a, b in forkpool.ranges(len(qrows), part) or [(0, 0)]:
            listed = np.zeros(n, dtype=bool)
            listed[qrows[a:b]] = True
            found = join(matrix, out.cells, plan.cells, query, k, floor, on_cell=task.advance, min_sim=min_sim,
                         listed=listed, cell_members=cell_members)
            spans = forkpool.ranges(len(found.rows), _BEST_K_BATCH)
            for s, (nbr, sim) in forkpool.run_tasks(_best_of, (found.nbr, found.sim, k), spans,
                                                    found.nbr.size >= _BEST_K_PARALLEL):
                rows = found.rows[s:s + len(nbr)]
                out.nbr[rows], out.sim[rows] = nbr, sim
            out.joined[found.rows] = True
            queried += len(found.rows)
            offers.append((found.offer_to, found.offer_from, found.offer_sim))
            del found
    offer_to, offer_from, offer_sim = (np.concatenate(x) for x in zip(*offers))
    if len(offer_to):
        targets, osrc, osim = _group_offers(offer_to, offer_from, offer_sim, k)
        nbr, sim = best_k(np.concatenate([out.nbr[targets], osrc], axis=1),
                          np.concatenate([out.sim[targets], osim], axis=1), k)
        out.nbr[targets], out.sim[targets] = nbr, sim
        # a slot holding an offered row took the offer's cosine unless its own was higher: either way the slot
        # is marked (re-scoring a cosine that already was exact gives it again, bit for bit)
        out.joined[targets] |= (nbr[:, :, None] == np.where(osrc >= 0, osrc, -2)[:, None, :]).any(axis=2)
    return out, queried
