"""Where an incremental run's records go in the vector indices: the records resolve added or made again (its
change list, read at their lines), or the chunks appended since the chunk index's mark, each placed at its
final row (`Plan`) so `VectorIndex.insert` splices them in; None wherever the files do not fit, and the caller
reads every record instead."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from hrag_cli.chunk.stage import added_since
from hrag_cli.core import jsonl_lines, line_patch, store
from hrag_cli.core.project import ProjectDir
from hrag_cli.embed.texts import entity_text, fact_row_text
from hrag_cli.storage.vectors.ids import fixed_bytes, rows_in
from hrag_cli.storage.vectors.index import VectorIndex


class Names:
    """Entity id -> name. The full pass fills it as it reads entities.jsonl; an incremental run holds only the
    names of the entities resolve changed and reads the file whole the first time another is asked for (a
    review, reviewed decisions, relation texts: not a plain small run)."""

    def __init__(self, path: Path) -> None:
        self._path, self._d, self._full = path, {}, False

    def __setitem__(self, key: str, name: str) -> None:
        self._d[key] = name

    def filled(self) -> None:
        """The caller has put every entity's name in (the full pass reads entities.jsonl for its vectors)."""
        self._full = True

    def fill(self) -> "Names":
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


def resolve_change(project: ProjectDir) -> dict | None:
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


class Plan:
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


def sorted_plan(idx: VectorIndex, changed: list[str]) -> Plan | None:
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
    return Plan([c.decode("utf-8") for c in ch.tolist()], np.where(exists, at, -1), at, len(rows))


_QUOTE, _BACKSLASH = ord('"'), ord("\\")


def _line_ids(path: Path) -> tuple[np.ndarray, Callable[[int], bytes]] | None:
    """The id of every line of a plain record file whose lines all start with an id of one width
    ({"id":"<id>",...: facts.jsonl), found with numpy instead of parsing every line, and line i's bytes. A file
    with a patch (line_patch.LinePatch): the logical file's, the patch lines' ids spliced in at their rows. None
    when a line does not look so (the caller reads the file instead)."""
    try:
        patch = line_patch.read_patch(path)
    except line_patch.PatchError:
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
    lines = jsonl_lines.JsonlLines(path)
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


def _file_order_plan(idx: VectorIndex, changed: list[str], file_ids: np.ndarray) -> Plan | None:
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
    return Plan(ids, old_rows[listed], before[listed], len(rows))


def _old_rows(idx: VectorIndex, keys: np.ndarray) -> np.ndarray:
    """Per key (fixed-width bytes), its row in the index, -1 when it has none (searched through the index's id
    order: no sorted copy of every id made)."""
    return rows_in(idx.id_array(), keys, idx.id_order())


def _held(idx: VectorIndex, file_ids: np.ndarray) -> list[bool]:
    """Per id (fixed-width bytes), whether the index has a row for it."""
    return (_old_rows(idx, file_ids) >= 0).tolist()


def chunk_plan(idx: VectorIndex, chunk_ids: list[str]) -> Plan | None:
    """For the chunk index: a chunk id is a hash of its text, so the chunks it lacks are the new ones and every
    other is held as it is; None when a chunk went (an edited or deleted document: every chunk is read)."""
    file_ids = fixed_bytes(chunk_ids)
    fresh = [i for i, held in zip(chunk_ids, _held(idx, file_ids)) if not held]
    return _file_order_plan(idx, fresh, file_ids)


class Chunks:
    """Chunk id -> text (the first row of each id, in file order) and the row count, read from chunks.jsonl
    the first time they are asked for: a small run whose chunk index ends at a known `chunk_mark` never asks."""

    def __init__(self, project: ProjectDir) -> None:
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


def chunks_token(mark: dict | None, synced: str) -> str:
    """What the chunk index is synced with: the `chunk_mark` of the chunks it holds (else the resolve output,
    as the other indices)."""
    return orjson.dumps(mark, option=orjson.OPT_SORT_KEYS).decode() if mark is not None else synced


def appended_chunks(project: ProjectDir, idx: VectorIndex) -> tuple[Plan, dict[str, str]] | None:
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
    return Plan(fresh, np.full(len(fresh), -1, dtype=np.int64), np.full(len(fresh), n, dtype=np.int64), n), texts


def changed_texts(project: ProjectDir, name: str, idx: VectorIndex, change: dict, names: Names
                  ) -> tuple[Plan, list[str]] | None:
    """Where the records resolve changed go in this index (entities or facts) and their texts, read at their
    lines only, each checked to hold the id expected; None when the files do not match the change list (the
    caller then reads every record)."""
    path, text = (project.entities_path, lambda r: entity_text(r["name"], r["description"])) \
        if name == "entities" else (project.facts_path, fact_row_text)
    lines = jsonl_lines.JsonlLines(path)
    patched = _patch_plan(idx, lines, change[name])
    if patched is not None:
        plan, records = patched
        if name == "entities":
            for r in records:
                names[r["id"]] = r["name"]
        return plan, [text(r) for r in records]
    if name == "entities":
        plan = sorted_plan(idx, change["entities"])
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
        texts.append(fact_row_text(r))
    return plan, texts


def _patch_plan(idx: VectorIndex, lines: jsonl_lines.JsonlLines, changed: list[str]) -> tuple[Plan, list[dict]] | None:
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


def _rows_plan(idx: VectorIndex, ids: list[str], rows: np.ndarray, total: int) -> Plan | None:
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
        plan = Plan(ids, old_rows, before, len(idx))
    except ValueError:
        return None
    return plan if np.array_equal(plan.lines, rows) else None
