"""Everything a query reads, loaded once per process (so `hrag query --file` and `hrag eval` pay it once).

Read-only: nothing here builds or rewrites an artifact. Parts only some modes need (graph, vector indices,
BM25, the embedder) load on first use, so `--mode bm25` never loads a model and `--mode naive` never unpickles
the graph.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from hrag_cli.core import jsonl_lines, store
from hrag_cli.core.config import Settings
from hrag_cli.core.errors import UsageError
from hrag_cli.core.project import ProjectDir
from hrag_cli.core.records import Chunk, Document, Entity, Fact, Relation, from_dict
from hrag_cli.graph.walk import WalkGraph


class RowRecords(Mapping):
    """id -> record of a JSONL file whose line i holds the record `position(id)` names (facts and chunks: row i
    of their vector index, which the synonyms stage fills in file order; entities: their graph vertices, which
    follow the file's id order), read on demand through the line offsets. A line whose id does not match (the file
    was rewritten since) falls back to reading the whole file once. `complete`: `position` knows every id, so
    an id it does not know is absent without reading the file (a ppr query tests dozens of names)."""

    def __init__(self, path: Path, cls: type, position: Callable[[str], int | None], complete: bool = False,
                 id_key: str = "id") -> None:
        self.path, self.cls, self._position, self._complete, self._id = path, cls, position, complete, id_key
        self._all: dict[str, Any] | None = None
        self._lines: jsonl_lines.JsonlLines | None = None

    def _whole(self) -> dict[str, Any]:
        if self._all is None:
            self._all = {r[self._id]: from_dict(self.cls, r) for r in store.read_jsonl(self.path)}
        return self._all

    def _record(self, row: int) -> Any:
        if self._lines is None:
            try:
                self._lines = jsonl_lines.JsonlLines(self.path)
            except FileNotFoundError:
                return None
        return self._lines.record(row)

    def __getitem__(self, key: str) -> Any:
        if self._all is None:
            row = self._position(key)
            if row is None and self._complete:
                raise KeyError(key)
            rec = self._record(row) if row is not None else None
            if isinstance(rec, dict) and rec.get(self._id) == key:
                return from_dict(self.cls, rec)
        return self._whole()[key]

    def __contains__(self, key: object) -> bool:
        if self._all is None and self._complete:
            return isinstance(key, str) and self._position(key) is not None
        try:
            self[key]   # type: ignore[index]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self._whole())

    def __len__(self) -> int:
        return len(self._whole())


class LazyRecords(Mapping):
    """id -> record of a JSONL file read whole (relations: local mode walks their endpoints; documents: not
    in any order a search could use), kept as the parsed dicts and made a record only when one is asked for."""

    def __init__(self, path: Path, cls: type, id_key: str = "id") -> None:
        self.cls = cls
        self.raw: dict[str, dict] = {r[id_key]: r for r in store.read_jsonl(path)}

    def __getitem__(self, key: str) -> Any:
        return from_dict(self.cls, self.raw[key])

    def __contains__(self, key: object) -> bool:
        return key in self.raw

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)


class DocPaths:
    """doc id -> path for the few documents a query shows, read from their own lines of docs.jsonl. The lines are
    found once (a numpy pass over the file, read a block at a time) and keyed by the first 8 bytes of the id each
    opens with, so a lookup compares 8-byte integers and reads and parses the line it finds, instead of a search of
    the mapped bytes per id, or parsing the whole file for a batch. A file whose lines do not all open with
    `{"doc_id":"` (compressed, another field order), an id shorter than 8 bytes or one no line holds is read whole
    once instead (`whole`: doc id -> path)."""

    OPEN = b'{"doc_id":"'
    _BLOCK = 1 << 20

    def __init__(self, path: Path, whole: Callable[[], Mapping[str, str]]) -> None:
        self.path, self._whole = path, whole
        self._found: dict[str, str] = {}
        self._lines: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None   # line bounds, sorted id keys, their lines
        self._indexed = False

    def _index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(each line's start and end; the first 8 id bytes of each line as an integer, sorted; the line of
        each), or None when some line does not open with an id of at least 8 bytes. Sorted, so a lookup is a
        binary search (comparing every key would be nearly all of a lookup)."""
        if self._indexed:
            return self._lines
        self._indexed = True
        width, step = len(self.OPEN) + 8, self._BLOCK
        with open(self.path, "rb") as fh:
            size, starts, heads = os.fstat(fh.fileno()).st_size, [], []
            for s in range(0, size, step):
                block = np.frombuffer(os.pread(fh.fileno(), step + width, s), dtype=np.uint8)   # + the next heads
                at = np.flatnonzero(block[:step] == 10) + 1
                at = np.concatenate(([0], at)) if s == 0 else at
                at = at[at + s < size]                      # a newline ending the file opens no line
                if len(at) and int(at[-1]) + width > len(block):
                    return None
                starts.append(at + s)
                heads.append(np.lib.stride_tricks.as_strided(block, (max(len(block) - width + 1, 0), width),
                                                             (1, 1))[at])
        bounds = np.append(np.concatenate(starts), size) if starts else np.zeros(1, dtype=np.int64)
        head = np.concatenate(heads) if heads else np.zeros((0, width), dtype=np.uint8)
        if not len(head) or np.diff(bounds).min() < width or \
                not (head[:, :len(self.OPEN)] == np.frombuffer(self.OPEN, dtype=np.uint8)).all():
            return None
        keys = np.ascontiguousarray(head[:, len(self.OPEN):]).view("<u8").ravel()
        order = np.argsort(keys, kind="stable")     # equal keys in line order
        self._lines = (bounds, keys[order], order)
        return self._lines

    def _find(self, doc_id: str) -> str | None:
        """The path on `doc_id`'s own line. The file is opened for each lookup (a query looks up about 5), so
        no handle outlives the query index."""
        key = store.dumps(doc_id)[1:9]                 # the id as its line spells it, first 8 bytes
        lines = self._index() if len(key) == 8 and not key.endswith(b'"') else None
        if lines is None:
            return None
        bounds, keys, lines_of = lines
        want = np.frombuffer(key, dtype="<u8")[0]
        found = lines_of[np.searchsorted(keys, want, side="left"):np.searchsorted(keys, want, side="right")].tolist()
        if not found:
            return None
        with open(self.path, "rb") as fh:
            for line in found:
                start = int(bounds[line])
                try:
                    rec = store.loads(os.pread(fh.fileno(), int(bounds[line + 1]) - start, start))
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("doc_id") == doc_id:
                    return rec.get("path")
        return None

    def get(self, doc_id: str) -> str:
        path = self._found.get(doc_id)
        if path is None:
            try:
                path = self._find(doc_id)
            except OSError:
                path = None
        if path is None:
            path = self._whole().get(doc_id, "")
        self._found[doc_id] = path
        return path


class ChunkCounts:
    """entity id -> how many distinct chunks mention it (at least 1): its MENTIONED_IN edges, one per chunk
    that names it (resolve.py), counted for the entities asked about."""

    def __init__(self, walk: WalkGraph) -> None:
        self.walk = walk

    def get(self, key: str, default: int | None = None) -> int | None:
        v = self.walk.entity_vertex(key)
        return default if v is None else max(self.walk.degree_of_kind(v, "MENTIONED_IN"), 1)


@dataclass
class QueryIndex:
    project: ProjectDir
    settings: Settings
    load_ms: dict[str, float] = field(default_factory=dict)

    # -- helpers -------------------------------------------------------------------------------------------
    def _timed(self, name: str, t0: float) -> None:
        self.load_ms[name] = round((time.perf_counter() - t0) * 1000, 1)

    def require_built(self) -> None:
        if self.project.stage("synonyms") is None:
            raise UsageError(f"the index in {self.project.root} is not built yet: run 'hrag index DOCS' first")
        self.project.require_intact()

    # -- text records ----------------------------------------------------------------------------------------
    @cached_property
    def docs(self) -> LazyRecords:
        return LazyRecords(self.project.docs_path, Document, id_key="doc_id")

    @cached_property
    def chunks(self) -> RowRecords:
        """Chunks read at their lines, in the chunk vector index's order: a query shows a few dozen."""
        return RowRecords(self.project.chunks_path, Chunk, self.chunk_row.get, id_key="chunk_id")

    @cached_property
    def entities(self) -> RowRecords:
        """Entities read one by one at their lines (the file is in id order, as their graph vertices are): a
        ppr query tests dozens of names for membership, which the graph answers, and reads a handful."""
        return RowRecords(self.project.entities_path, Entity, self.walk.entity_row, complete=True)

    @cached_property
    def relations(self) -> LazyRecords:
        return LazyRecords(self.project.relations_path, Relation)

    @cached_property
    def facts(self) -> RowRecords:
        """Facts read on demand: ppr needs the few its fact search returned, and parsing every fact of a large
        project would dominate a cold query."""
        def position(key: str) -> int | None:
            idx = self.vector_index("facts")
            return idx.position(key) if idx is not None else None

        return RowRecords(self.project.facts_path, Fact, position)

    @cached_property
    def doc_paths(self) -> DocPaths:
        return DocPaths(self.project.docs_path, lambda: self._paths_by_doc)

    @cached_property
    def _paths_by_doc(self) -> dict[str, str]:
        """doc id -> path of every document, the two fields alone (every record kept as a parsed dict would
        hold much of a batch's memory)."""
        return {r["doc_id"]: str(r.get("path", "")) for r in store.read_jsonl(self.project.docs_path)
                if isinstance(r, dict) and "doc_id" in r}

    def doc_path(self, doc_id: str) -> str:
        return self.doc_paths.get(doc_id)

    @cached_property
    def extractor(self) -> str:
        """The extractor the index was built with ("rules-v2", "openie:...", an LLM's id; "" if unknown):
        ppr trusts a walk over a rules graph less."""
        stage = self.project.stage("extract")
        return str(stage.counts.get("extractor", "")) if stage is not None else ""

    # -- graph -----------------------------------------------------------------------------------------------
    @cached_property
    def walk(self) -> WalkGraph:
        """The graph as the walk reads it (graph/walk.npz): numpy arrays, no igraph and no pickle."""
        t0 = time.perf_counter()
        out = WalkGraph.load(self.project)
        self._timed("graph", t0)
        return out

    @cached_property
    def chunk_vertices(self) -> np.ndarray:
        """Graph vertex of each row of the chunk vector index (-1 when the graph lacks it)."""
        vertex = self.walk.keys_of_kind("chunk")
        return np.array([vertex.get(cid, -1) for cid in self.chunk_ids], dtype=np.int64)

    @cached_property
    def entity_chunk_counts(self) -> ChunkCounts:
        """How many chunks mention each entity: a fact's seed weight is divided by it (HippoRAG 2), so a hub
        entity named in half the corpus does not drown the walk."""
        return ChunkCounts(self.walk)

    # -- dense -----------------------------------------------------------------------------------------------
    @cached_property
    def embedder(self) -> Any:
        from hrag_cli.embed.embedder import get_embedder

        t0 = time.perf_counter()
        emb = get_embedder(self.project, self.settings, fail_fast=True)
        self._timed("embedder", t0)
        return emb

    def vector_index(self, name: str) -> Any:
        """A saved vector index, or None when it was never built. One built with another embedder than the
        one configured now would give meaningless scores, so that is an error naming both."""
        cache = self.__dict__.setdefault("_vector_indices", {})
        if name not in cache:
            from hrag_cli.storage.vectors.index import VectorIndex

            t0 = time.perf_counter()
            idx = VectorIndex.load(self.project.vectors_dir, name, self.settings.vectors, lazy_ids=True)
            if idx is not None and len(idx) and (idx.model_id != self.embedder.model_id
                                                 or idx.dim != self.embedder.dim):
                raise UsageError(f"the {name} index was built with embedder {idx.model_id!r} but the query uses "
                                 f"{self.embedder.model_id!r}: pass the same --embed-model, or run 'hrag synonyms'")
            cache[name] = idx
            self._timed(f"vectors.{name}", t0)
        return cache[name]

    @cached_property
    def _chunk_index(self) -> Any:
        idx = self.vector_index("chunks")
        if idx is None:
            raise UsageError(f"no chunk vectors in {self.project.root}: run 'hrag index DOCS' first")
        return idx

    @property
    def chunk_ids(self) -> list[str]:
        return self._chunk_index.ids

    @cached_property
    def chunk_row(self) -> dict[str, int]:
        return {cid: i for i, cid in enumerate(self.chunk_ids)}

    def embed_query(self, text: str) -> np.ndarray:
        """Unit-length query vector; remembered per text, since mix/hybrid may ask for the same text twice."""
        cache = self.__dict__.setdefault("_qvec", {})
        if text not in cache:
            if len(cache) > 256:
                cache.clear()
            vec = np.asarray(self.embedder.encode_query(text), dtype=np.float32).reshape(-1)
            norm = float(np.linalg.norm(vec))
            cache[text] = vec / norm if norm > 0 else vec
        return cache[text]

    def dense_chunk_scores(self, qvec: np.ndarray) -> np.ndarray:
        """Cosine of the query with every chunk, aligned with `chunk_ids` (exact: PPR needs every chunk's
        score, and a matrix-vector product over the chunk vectors is cheaper than a search anyway). The
        float16 rows are memory-mapped; a small index keeps a float32 copy across queries, a large one is
        scanned in blocks (bounded query memory)."""
        idx = self._chunk_index
        if len(idx) == 0:
            return np.zeros(0, dtype=np.float64)
        return idx.scores(qvec).astype(np.float64)

    def search(self, name: str, qvec: np.ndarray, k: int) -> list[tuple[str, float]]:
        """Top-k (id, cosine) of a vector index; an index that was never built counts as empty."""
        idx = self.vector_index(name) if k > 0 else None
        if idx is None or len(idx) == 0:
            return []
        ids, sims = idx.search(qvec, k)
        return [(str(i), float(s)) for i, s in zip(ids[0], sims[0])]

    # -- lexical ---------------------------------------------------------------------------------------------
    @cached_property
    def bm25(self) -> Any:
        """The BM25 index the synonyms stage saved, or None (then lexical fusion is skipped with a note)."""
        from hrag_cli.storage.bm25 import BM25_FILE, BM25Index

        t0 = time.perf_counter()
        path = self.project.vectors_dir / BM25_FILE
        try:
            idx = BM25Index.load(path)
        except (FileNotFoundError, ValueError):
            idx = None
        self._timed("bm25", t0)
        return idx

    def bm25_chunk_scores(self, query: str) -> np.ndarray | None:
        """BM25 score of every chunk, aligned with `chunk_ids` (0 where no term matches), or None without a
        BM25 index."""
        if self.bm25 is None:
            return None
        got = self.bm25.slot_scores(query)
        if got is None:
            return np.zeros(len(self.chunk_ids), dtype=np.float64)
        slot_docs, v = got
        rows = self.__dict__.get("_bm25_rows")
        if rows is None or len(rows) != len(slot_docs):     # each BM25 slot's chunk row, made once
            row = self.chunk_row
            rows = self.__dict__["_bm25_rows"] = np.array(
                [row.get(d, -1) if d is not None else -1 for d in slot_docs], dtype=np.int64)
            self.__dict__["_bm25_aligned"] = len(rows) == len(self.chunk_ids) and \
                np.array_equal(rows, np.arange(len(rows)))
        if self.__dict__["_bm25_aligned"]:     # slot i is chunk row i (as the synonyms stage builds them)
            return v                           # (a score is never negative: no hit is 0, as the rows below)
        out = np.zeros(len(self.chunk_ids), dtype=np.float64)
        hit = np.flatnonzero((v > 0) & (rows >= 0))
        out[rows[hit]] = v[hit]
        return out
