"""A sparse index's patch: the rows an incremental run inserted or made again, kept beside the untouched
base arrays, and the base and patch read as one index (`PatchedRows`, `PatchedKeys`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from hrag_cli.storage.vectors.ids import IdKeys, Listing, fixed_width, packed
from hrag_cli.storage.vectors.layout import DTYPE, n_bands
from hrag_cli.storage.vectors.sparse import SparseRows, build_postings, csr, join_sparse
from hrag_cli.storage.vectors.splice import merge_rows, splice_blob, splice_order, spliced_fixed


class RowPatch:
    """The rows an incremental run inserted or made again, kept beside the untouched base arrays of a sparse
    index (<name>.patch.npz): a small run writes them alone (the base files stay hard links of the previous
    generation) instead of rewriting every array of a large index. The logical index is the base's rows in
    order with the patch's rows at their logical rows `pos` (ascending): a row with base[j] >= 0 stands for base
    row base[j] (made again, same id), one with -1 is inserted. Past `base_patch.VECTOR_INDEX` of the base's
    rows the patch is folded into a new base (`folded`)."""

    def __init__(self, base_dir: Path, meta: dict, keys: tuple[np.ndarray, ...], hashes: np.ndarray,
                 rows: SparseRows, pos: np.ndarray, base: np.ndarray, ids: list[bytes], new_hashes: list[bytes],
                 patch_rows: SparseRows) -> None:
        self.base_dir, self.meta = Path(base_dir), meta      # where the base's files are and their header
        self.base_keys, self.base_hashes, self.base_rows = keys, hashes, rows
        self.pos, self.base = np.asarray(pos, dtype=np.int64), np.asarray(base, dtype=np.int64)
        self.ids, self.hashes, self.rows = ids, new_hashes, patch_rows
        self.n_base = len(hashes)
        inserted = self.base < 0
        self.ins_pos = self.pos[inserted]
        self.ins_before = self.ins_pos - np.arange(len(self.ins_pos), dtype=np.int64)   # the base row each precedes
        self.n = self.n_base + len(self.ins_pos)
        self._at = dict(zip(ids, self.pos.tolist()))          # id -> its logical row
        self._cache: dict[str, Any] = {}
        if rows.postings is not None and patch_rows.postings is None and len(patch_rows):
            patch_rows.postings = build_postings(patch_rows)   # scored as the base is: the same sums, bit for bit

    def __len__(self) -> int:
        return len(self.pos)

    def check(self) -> bool:
        """Whether the patch fits its base: rows ascending inside the logical index, each made-again row where
        its base row lands."""
        k, made = len(self.pos), self.base >= 0
        return (len(self.base) == len(self.ids) == len(self.hashes) == len(self.rows) == k
                and (not k or (int(self.pos[0]) >= 0 and int(self.pos[-1]) < self.n
                               and bool((np.diff(self.pos) > 0).all())))
                and bool((self.base[made] < self.n_base).all())
                and np.array_equal(self.logical(self.base[made]), self.pos[made])
                and (self.rows.dim == self.base_rows.dim))

    def logical(self, base_rows: np.ndarray) -> np.ndarray:
        """The logical row of each base row."""
        r = np.asarray(base_rows, dtype=np.int64)
        return r + np.searchsorted(self.ins_before, r, side="right")

    def base_of(self, rows: np.ndarray) -> np.ndarray:
        """The base row of each logical row that is not an inserted one."""
        p = np.asarray(rows, dtype=np.int64)
        return p - np.searchsorted(self.ins_pos, p)

    def find(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per logical row: whether the patch holds it, and its patch row there."""
        p = np.asarray(rows, dtype=np.int64)
        j = np.searchsorted(self.pos, p)
        hit = np.zeros(len(p), dtype=bool)
        inside = j < len(self.pos)
        hit[inside] = self.pos[j[inside]] == p[inside]
        return hit, j

    def layout(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(is_new per logical row, base row of each other logical row (-1 on patch rows), logical row of each
        base row): the whole-index arrays the splices of `insert` take."""
        if "layout" not in self._cache:
            is_new = np.zeros(self.n, dtype=bool)
            is_new[self.pos] = True
            replaced = np.zeros(self.n_base, dtype=bool)
            replaced[self.base[self.base >= 0]] = True
            old_of = np.full(self.n, -1, dtype=np.int64)
            old_of[~is_new] = np.flatnonzero(~replaced)
            moved = np.empty(self.n_base, dtype=np.int64)
            moved[~replaced] = np.flatnonzero(~is_new)
            moved[self.base[self.base >= 0]] = self.pos[self.base >= 0]
            self._cache["layout"] = (is_new, old_of, moved)
        return self._cache["layout"]

    def keys(self, order: bool = True) -> tuple[np.ndarray, ...]:
        """`IdKeys.arrays` of the logical index (without `order`: the blob and offsets alone)."""
        if "blob" not in self._cache:
            is_new, old_of, _ = self.layout()
            self._cache["blob"] = splice_blob(*self.base_keys[:2], is_new, old_of, self.pos, self.ids)
        if order and "order" not in self._cache:
            base_order = self.base_keys[2]
            _, _, moved = self.layout()
            ins = self.base < 0
            old_fixed = self.base_fixed() if ins.any() else np.zeros(0, dtype="S1")
            self._cache["order"] = splice_order(base_order, moved, self.pos, ins, self.ids, old_fixed)
        return (*self._cache["blob"], self._cache["order"]) if order else self._cache["blob"]

    def base_fixed(self) -> np.ndarray:
        """The base's ids as `fixed_width` gives them (kept: the id order's merge and `id_array` both read them)."""
        if "base_fixed" not in self._cache:
            self._cache["base_fixed"] = fixed_width(*self.base_keys[:2])
        return self._cache["base_fixed"]

    def id_array(self) -> np.ndarray:
        """The logical index's ids as fixed-width bytes, spliced from the base's: what `fixed_width` of the
        spliced blob gives (a row made again keeps its id, so the width is the same)."""
        if "fixed" not in self._cache:
            is_new, old_of, _ = self.layout()
            self._cache["fixed"] = spliced_fixed(self.base_fixed(), is_new, old_of, self.pos, self.ids)
        return self._cache["fixed"]

    def hashes_of(self, rows: np.ndarray) -> np.ndarray:
        """The text hashes (fixed-width bytes) of some logical rows, without splicing every row's."""
        hit, j = self.find(rows)
        out = np.empty(len(hit), dtype=object)
        out[hit] = [self.hashes[i] for i in j[hit].tolist()]
        out[~hit] = np.asarray(self.base_hashes)[self.base_of(np.asarray(rows)[~hit])].tolist()
        return out

    def hash_array(self) -> np.ndarray:
        """The logical index's text hashes (fixed-width bytes)."""
        if "hashes" not in self._cache:
            is_new, old_of, _ = self.layout()
            self._cache["hashes"] = spliced_fixed(np.asarray(self.base_hashes), is_new, old_of, self.pos,
                                                  self.hashes)
        return self._cache["hashes"]

    def folded(self) -> tuple[tuple[np.ndarray, ...], np.ndarray, SparseRows]:
        """The logical index as one base: (id keys, text hashes, rows), what a fresh build of it holds."""
        return self.keys(), self.hash_array(), self.merged_rows()

    def merged_rows(self) -> SparseRows:
        """The logical index's rows in one store (kept: the synonyms stage reads them every run), without
        the id order and hash array `folded` also makes."""
        if "rows" not in self._cache:
            is_new, old_of, _ = self.layout()
            self._cache["rows"] = merge_rows(is_new, self.base_rows, old_of, self.rows)
        return self._cache["rows"]

    def spliced(self, pos: np.ndarray, old_rows: np.ndarray, moved: np.ndarray, ids: list[bytes],
                hashes: list[bytes], new: SparseRows) -> "RowPatch":
        """This patch with `VectorIndex.insert`'s rows put in: `pos` their final logical rows, `old_rows` the
        current logical row each makes again (-1: inserted), `moved` each current logical row's final row."""
        old_rows = np.asarray(old_rows, dtype=np.int64)
        remade = old_rows >= 0
        hit, j = self.find(old_rows[remade])
        made_base = self.base_of(old_rows[remade])
        made_base[hit] = self.base[j[hit]]         # a patch row made again: the base row it stands for, or -1
        base_of = np.full(len(pos), -1, dtype=np.int64)
        base_of[remade] = made_base
        keep = np.ones(len(self), dtype=bool)
        keep[j[hit]] = False                         # patch rows made again now
        kept = np.flatnonzero(keep)
        all_pos = np.concatenate([moved[self.pos[kept]], np.asarray(pos, dtype=np.int64)])
        order = np.argsort(all_pos, kind="stable")
        both = join_sparse([self.rows, new], self.rows.dim)
        pick = np.concatenate([kept, len(self) + np.arange(len(new), dtype=np.int64)])[order]
        rows = csr(*both.take(pick), self.rows.dim) if len(pick) else join_sparse([], self.rows.dim)
        all_ids, all_hashes = [*self.ids, *ids], [*self.hashes, *hashes]
        return RowPatch(self.base_dir, self.meta, self.base_keys, self.base_hashes, self.base_rows, all_pos[order],
                        np.concatenate([self.base[kept], base_of])[order], [all_ids[i] for i in pick.tolist()],
                        [all_hashes[i] for i in pick.tolist()], rows)

    def arrays(self) -> dict[str, np.ndarray]:
        """What <name>.patch.npz holds."""
        blob, off = packed(self.ids)      # as `IdKeys.arrays` packs them, without its sort
        r = self.rows
        return {"pos": self.pos, "base": self.base, "keys": blob, "koff": off,
                "hashes": np.array(self.hashes, dtype=f"S{max(1, max(map(len, self.hashes), default=1))}"),
                "indptr": r.indptr, "low": r.low, "bands": r.bands, "data": r.data}

    @classmethod
    def load(cls, path: Path, want: dict, base_dir: Path, meta: dict, keys: tuple[np.ndarray, ...],
             hashes: np.ndarray, rows: SparseRows, dim: int) -> "RowPatch":
        """The saved patch of a base (`want`: what the id map says of it); ValueError when it is damaged or
        does not fit the base."""
        import zipfile

        if path.stat().st_size != int(want.get("bytes", -1)):
            raise ValueError("size")
        try:
            with np.load(path, allow_pickle=False) as z:
                a = {k: z[k] for k in ("pos", "base", "keys", "koff", "hashes", "indptr", "low", "bands", "data")}
        except (zipfile.BadZipFile, KeyError, OSError, EOFError) as exc:
            raise ValueError(str(exc)) from None
        k, off = len(a["pos"]), a["koff"]
        if len(off) != k + 1 or a["indptr"].shape != (k + 1,) or k != int(want.get("rows", -1)) \
                or a["data"].dtype != DTYPE or a["low"].dtype != np.uint8 \
                or a["bands"].shape != (k, n_bands(dim)) \
                or not len(a["low"]) == len(a["data"]) == int(a["indptr"][-1]):
            raise ValueError("shape")
        blob = bytes(a["keys"])
        ids = [blob[s:e] for s, e in zip(off.tolist(), off[1:].tolist())]
        patch = cls(base_dir, meta, keys, hashes, rows, a["pos"], a["base"], ids,
                    a["hashes"].tolist(), SparseRows(a["indptr"], a["low"], a["bands"], a["data"], dim))
        if patch.n != int(want.get("count", -1)) or not patch.check():
            raise ValueError("layout")
        return patch


class PatchedRows:
    """The rows of a patched index in logical order, searched as one store: every base row scored as the base
    scores it (the replaced ones left out), every patch row as a row of the same kind is, so a search returns
    the rows and float32 scores a fresh build's index returns (ties to the lower logical row)."""
    kind = "sparse"

    def __init__(self, patch: RowPatch) -> None:
        self.patch, self.base, self.dim = patch, patch.base_rows, patch.base_rows.dim

    def __len__(self) -> int:
        return self.patch.n

    @property
    def postings(self) -> Any:
        return self.base.postings

    def dense(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        hit, j = self.patch.find(rows)
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        if hit.any():
            out[hit] = self.patch.rows.dense(j[hit])
        if not hit.all():
            out[~hit] = self.base.dense(self.patch.base_of(rows[~hit]))
        return out

    def blocks(self, q: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """The base's blocks in logical order, each widened by the patch rows that fall among its rows."""
        p = self.patch
        psims = np.concatenate([s for _, s in p.rows.blocks(q)], axis=1) if len(p) else \
            np.zeros((len(q), 0), dtype=np.float32)
        start = 0
        for s, sims in self.base.blocks(q):
            e = s + sims.shape[1]
            end = p.n if e >= p.n_base else int(p.logical(np.array([e]))[0])
            out = np.empty((len(q), end - start), dtype=np.float32)
            out[:, p.logical(np.arange(s, e)) - start] = sims
            a, b = np.searchsorted(p.pos, [start, end]).tolist()
            out[:, p.pos[a:b] - start] = psims[:, a:b]
            yield start, out
            start = end
        if start < p.n:                     # an empty base: the patch rows alone
            yield start, psims[:, np.searchsorted(p.pos, start):]

    def posting_top(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """`SparseRows.posting_top` of the logical rows: the base's best k live rows (asked again for as many
        more as its best held rows the patch made again: those rarely lead, and each one asked for weakens the
        pruning), the patch's best k, merged."""
        p = self.patch
        made = p.base[p.base >= 0]
        want = k
        while True:
            rows, sims = self.base.posting_top(q, want)
            live = ~np.isin(rows, made) if len(made) else np.ones(len(rows), dtype=bool)
            if int(live.sum()) >= k or len(rows) < want or want >= k + len(made):
                break
            want = k + int((~live).sum())
        rows, sims = rows[live][:k], sims[live][:k]
        rows = p.logical(rows)
        if len(p):
            prow, psim = p.rows.posting_top(q, min(k, len(p)))
            rows, sims = np.concatenate([rows, p.pos[prow]]), np.concatenate([sims, psim])
        best = np.lexsort((rows, -sims))[:k]
        return rows[best], sims[best].astype(np.float32)


class PatchedKeys(Listing):
    """The ids of a patched index in logical order (`IdKeys` of the base, the patch's ids at their rows)."""

    def __init__(self, base: IdKeys, patch: RowPatch) -> None:
        self._base, self._patch = base, patch
        self._all: list[str] | None = None

    def __len__(self) -> int:
        return self._patch.n

    def _one(self, i: int) -> str:
        hit, j = self._patch.find(np.array([i]))
        if hit[0]:
            return self._patch.ids[int(j[0])].decode("utf-8")
        return self._base[int(self._patch.base_of(np.array([i]))[0])]

    def position(self, key: str) -> int | None:
        """The logical row of `key`, or None."""
        at = self._patch._at.get(key.encode("utf-8"))
        if at is not None:
            return at
        r = self._base.position(key)
        return None if r is None else int(self._patch.logical(np.array([r]))[0])

    def _listed(self) -> list[str]:
        if self._all is None:
            is_new, old_of, _ = self._patch.layout()
            out = np.empty(len(self), dtype=object)
            out[~is_new] = np.array(self._base._listed(), dtype=object)[old_of[~is_new]]
            out[self._patch.pos] = [i.decode("utf-8") for i in self._patch.ids]
            self._all = out.tolist()
        return self._all
