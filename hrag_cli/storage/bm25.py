"""Okapi BM25 over chunks: an incrementally updatable, persistable lexical index.

Why: lexical matching of rare names and numbers is where dense retrieval is weakest; BM25 is the
cheap complement used for fusion. Tokens come from :mod:`hrag_cli.core.textnorm` so BM25 and the built-in
embedder agree on what a word is.

Scoring (for a query with distinct terms q, a document d of length |d|, average length avgdl,
N documents, df(t) documents containing t, tf(t, d) occurrences of t in d)::

    idf(t)      = log(1 + (N - df(t) + 0.5) / (df(t) + 0.5))          # never negative
    score(q, d) = sum over t in q:  idf(t) * tf(t,d) * (k1 + 1) / (tf(t,d) + k1 * (1 - b + b * |d| / avgdl))

Query terms are de-duplicated (a repeated query word does not count twice). Lengths count tokens
after stop-word removal.

Layout: documents are (term id, tf) runs appended to one numpy pool; removal tombstones a slot and
the pool is compacted when half of it is garbage. The inverted index used for scoring is derived
from the pool lazily (one argsort) and dropped on any change, so incremental updates can never drift
from a rebuild. The file is one uncompressed ``.npz``, quick to load.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import orjson

from hrag_cli.core import store
from hrag_cli.core.textnorm import tokenize

BM25_FILE = "bm25"          # in vectors/: the synonyms stage saves it, a query loads it

__all__ = ["BM25Index"]

_FORMAT = "hrag-bm25-v1"


def _grow(a: np.ndarray, need: int) -> np.ndarray:
    if need <= a.shape[0]:
        return a
    out = np.zeros(max(need, 2 * a.shape[0], 1024), dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


class BM25Index:
    """BM25 index keyed by doc id (chunk id). ``add`` replaces an existing doc with the same id."""

    def __init__(
        self, k1: float = 1.2, b: float = 0.75, *, stop_words: bool = True, stemming: bool = False
    ) -> None:
        self.k1 = float(k1)
        self.b = float(b)
        self.stop_words = stop_words
        self.stemming = stemming
        self._terms: list[str] = []
        self._term_id: dict[str, int] = {}
        self._df = np.zeros(0, dtype=np.int64)
        self._pool_tid = np.zeros(0, dtype=np.int32)
        self._pool_tf = np.zeros(0, dtype=np.int32)
        self._pool_n = 0
        self._slot_doc: list[str | None] = []  # slot -> doc id (None once removed)
        self._slot_of: dict[str, int] = {}
        self._slot_start = np.zeros(0, dtype=np.int64)
        self._slot_end = np.zeros(0, dtype=np.int64)
        self._slot_len = np.zeros(0, dtype=np.int64)  # 0 for removed slots
        self._total_len = 0
        self._dead_entries = 0
        self._inv: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # ptr, slots, tfs
        self._queries = 0                       # scored so far: the first one skips building `_inv`
        self._norm: tuple | None = None         # (the `_inv` it was made with, `_length_norm`)

    # ----------------------------------------------------------------- contents
    def tokens(self, text: str) -> list[str]:
        """The index's tokenisation (same for documents and queries)."""
        return tokenize(text, stop_words=self.stop_words, stemming=self.stemming)

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._slot_of

    def doc_ids(self) -> list[str]:
        return list(self._slot_of)

    @property
    def avgdl(self) -> float:
        return self._total_len / len(self._slot_of) if self._slot_of else 0.0

    def term_counts(self, doc_id: str) -> dict[str, int]:
        """The stored bag of words of one document (for inspection and tests)."""
        s = self._slot_of[doc_id]
        a, e = self._slot_start[s], self._slot_end[s]
        return {self._terms[t]: int(f) for t, f in zip(self._pool_tid[a:e], self._pool_tf[a:e])}

    def add(self, doc_id: str, text: str) -> None:
        """Index ``text`` under ``doc_id`` (replacing any previous text for that id)."""
        if doc_id in self._slot_of:
            self.remove(doc_id)
        counts = Counter(self.tokens(text))
        tid = self._term_id
        for t in counts:
            if t not in tid:
                tid[t] = len(self._terms)
                self._terms.append(t)
        self._df = _grow(self._df, len(self._terms))
        ids = np.fromiter((tid[t] for t in counts), dtype=np.int32, count=len(counts))
        tfs = np.fromiter(counts.values(), dtype=np.int32, count=len(counts))
        a, e = self._pool_n, self._pool_n + len(ids)
        self._pool_tid = _grow(self._pool_tid, e)
        self._pool_tf = _grow(self._pool_tf, e)
        self._pool_tid[a:e] = ids
        self._pool_tf[a:e] = tfs
        self._pool_n = e
        s = len(self._slot_doc)
        self._slot_doc.append(doc_id)
        self._slot_of[doc_id] = s
        self._slot_start = _grow(self._slot_start, s + 1)
        self._slot_end = _grow(self._slot_end, s + 1)
        self._slot_len = _grow(self._slot_len, s + 1)
        n = int(tfs.sum())
        self._slot_start[s], self._slot_end[s], self._slot_len[s] = a, e, n
        self._df[ids] += 1  # ids are distinct within a document
        self._total_len += n
        self._inv = None

    def add_many(self, items: Iterable[tuple[str, str]]) -> None:
        for doc_id, text in items:
            self.add(doc_id, text)

    def remove(self, doc_id: str) -> None:
        """Drop ``doc_id``; a missing id is a no-op (removal is idempotent)."""
        s = self._slot_of.pop(doc_id, None)
        if s is None:
            return
        a, e = self._slot_start[s], self._slot_end[s]
        self._df[self._pool_tid[a:e]] -= 1
        self._total_len -= int(self._slot_len[s])
        self._slot_doc[s] = None
        self._slot_len[s] = 0
        self._slot_end[s] = a
        self._dead_entries += int(e - a)
        self._inv = None
        if self._dead_entries * 2 > self._pool_n:
            self._compact()

    def _compact(self) -> None:
        """Rewrite the pool and slots without removed documents (keeps insertion order)."""
        live = [s for s, d in enumerate(self._slot_doc) if d is not None]
        starts = self._slot_start[live]
        lens = self._slot_end[live] - starts
        total = int(lens.sum())
        pos = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(total, dtype=np.int64)
        self._pool_tid = self._pool_tid[pos].copy()
        self._pool_tf = self._pool_tf[pos].copy()
        self._pool_n = total
        new_start = np.cumsum(lens) - lens
        self._slot_start = new_start.astype(np.int64)
        self._slot_end = (new_start + lens).astype(np.int64)
        self._slot_len = self._slot_len[live].copy()
        self._slot_doc = [self._slot_doc[s] for s in live]
        self._slot_of = {d: i for i, d in enumerate(self._slot_doc)}  # type: ignore[misc]
        self._dead_entries = 0
        self._inv = None

    # ----------------------------------------------------------------- scoring
    def idf(self, term: str) -> float:
        """log(1 + (N - df + 0.5) / (df + 0.5)); a term in no document gets the N-only value."""
        t = self._term_id.get(term)
        df = int(self._df[t]) if t is not None else 0
        n = len(self._slot_of)
        return float(np.log1p((n - df + 0.5) / (df + 0.5)))

    def _inverted(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ptr, slots int32, tfs int32): term t's entries are ptr[t]:ptr[t + 1], slots ascending. Sorted by
        term as two stable radix passes over its 16-bit halves (far cheaper than a stable sort of int32 terms),
        kept as int32 (half the memory of int64 slots and float64 counts)."""
        if self._inv is None:
            n_slots = len(self._slot_doc)
            lens = self._slot_end[:n_slots] - self._slot_start[:n_slots]
            # live entries only (removed slots have end == start, their old entries are skipped)
            total = int(lens.sum())
            starts = self._slot_start[:n_slots]
            offset = starts - (np.cumsum(lens) - lens)
            if offset.any():
                pos = np.repeat(offset, lens) + np.arange(total, dtype=np.int64)
                tids, tfs = self._pool_tid[pos], self._pool_tf[pos]
            else:                                   # a compact pool (as loaded): its entries in order
                tids, tfs = self._pool_tid[:total], self._pool_tf[:total]
            tids = tids.astype(np.uint32)
            order = np.argsort((tids & 0xFFFF).astype(np.uint16), kind="stable")
            order = order[np.argsort((tids[order] >> 16).astype(np.uint16), kind="stable")]
            ptr = np.zeros(len(self._terms) + 1, dtype=np.int64)
            np.cumsum(np.bincount(tids, minlength=len(self._terms)), out=ptr[1:])
            slots = np.repeat(np.arange(n_slots, dtype=np.int32), lens)
            self._inv = (ptr, slots[order], tfs[order].astype(np.int32))
        return self._inv

    def _postings(self, terms: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ptr, slots, tfs) for these terms: the inverted index, built on the second query. A first (cold)
        query finds its few terms' entries with one pass over the pool instead of sorting every entry."""
        self._queries += 1
        if self._inv is not None or self._queries > 1:
            return self._inverted()
        pool = self._pool_tid[: self._pool_n]
        pos = np.flatnonzero(np.isin(pool, np.asarray(terms, dtype=pool.dtype)))
        n_slots = len(self._slot_doc)
        slot = np.searchsorted(self._slot_end[:n_slots], pos, side="right")
        pos, slot = pos[slot < n_slots], slot[slot < n_slots]
        live = self._slot_start[slot] <= pos           # entries of removed slots belong to no slot
        pos, slot = pos[live], slot[live]
        order = np.argsort(pool[pos], kind="stable")   # by term, slots ascending within one
        ptr = np.zeros(len(self._terms) + 1, dtype=np.int64)
        np.cumsum(np.bincount(pool[pos], minlength=len(self._terms)), out=ptr[1:])
        return ptr, slot[order], self._pool_tf[pos][order]

    def _score_vector(self, query: str) -> np.ndarray | None:
        """BM25 score per slot (removed slots score 0), or None when no query term is indexed."""
        tid = self._term_id
        terms = [tid[t] for t in dict.fromkeys(self.tokens(query)) if t in tid]
        terms = [t for t in terms if self._df[t] > 0]
        if not terms:
            return None
        ptr, slots, tfs = self._postings(terms)
        n = len(self._slot_of)
        k1 = self.k1
        norm = self._length_norm()
        scores = np.zeros(len(self._slot_doc), dtype=np.float64)
        for t in terms:
            df = float(self._df[t])
            w = np.log1p((n - df + 0.5) / (df + 0.5)) * (k1 + 1.0)
            sl = slots[ptr[t] : ptr[t + 1]]
            tf = tfs[ptr[t] : ptr[t + 1]].astype(np.float64)
            if norm is None:   # the length norm of the matched slots alone (a common term matches many chunks)
                scores[sl] += w * tf / (tf + self._norm_of(self._slot_len[sl]))   # a slot appears once per term
            else:
                scores[sl] += w * tf / (tf + norm[sl])
        return scores

    def _norm_of(self, lengths: np.ndarray) -> np.ndarray:
        """k1 * (1 - b + b * |d| / avgdl) of these document lengths."""
        k1, b = self.k1, self.b
        return k1 * (1.0 - b + b * lengths / (self.avgdl or 1.0))

    def _length_norm(self) -> np.ndarray | None:
        """Every slot's length norm, made once per inverted index (the same values, element by element, as
        the matched slots' own, without recomputing them per query); None before the index is built (a cold
        query scores its few terms without it)."""
        if self._inv is None:
            return None
        made = self._norm
        if made is None or made[0] is not self._inv:
            made = self._norm = (self._inv, self._norm_of(self._slot_len))
        return made[1]

    def slot_scores(self, query: str) -> tuple[list[str | None], np.ndarray] | None:
        """(doc id of each slot, None where removed; BM25 score of each slot), or None when no query term is
        indexed: for a caller that maps slots to its own rows once, not a dict of every hit per query."""
        v = self._score_vector(query)
        return None if v is None else (self._slot_doc, v)

    def score(self, query: str) -> dict[str, float]:
        """Score of every document sharing at least one term with ``query`` (others score 0)."""
        v = self._score_vector(query)
        if v is None:
            return {}
        hit = np.flatnonzero(v > 0)
        docs = self._slot_doc
        return {docs[s]: float(v[s]) for s in hit.tolist()}  # type: ignore[misc]

    def top_k(self, query: str, k: int) -> list[tuple[str, float]]:
        """Best ``k`` (doc_id, score) with score > 0, highest first; ties broken by doc id."""
        v = self._score_vector(query)
        if v is None or k <= 0:
            return []
        hit = np.flatnonzero(v > 0)
        if hit.size > k:
            kth = np.partition(v[hit], hit.size - k)[hit.size - k]
            hit = hit[v[hit] >= kth]  # keeps all ties at the boundary, so the order is exact
        docs = self._slot_doc
        pairs = [(docs[s], float(v[s])) for s in hit.tolist()]
        pairs.sort(key=lambda p: (-p[1], p[0]))
        return pairs[:k]  # type: ignore[return-value]

    def scores_for(self, query: str, doc_ids: Iterable[str]) -> dict[str, float]:
        """Scores for the given ids only (0.0 if no term matches); ids not in the index are omitted."""
        v = self._score_vector(query)
        out: dict[str, float] = {}
        for d in doc_ids:
            s = self._slot_of.get(d)
            if s is not None:
                out[d] = float(v[s]) if v is not None else 0.0
        return out

    # ----------------------------------------------------------------- persistence
    def save(self, path: Path) -> None:
        """Compacted state as one uncompressed .npz (header JSON + CSR arrays); atomic write."""
        if self._dead_entries or len(self._slot_of) != len(self._slot_doc):  # a removed empty doc frees no entry
            self._compact()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        header = orjson.dumps(
            {
                "format": _FORMAT,
                "k1": self.k1,
                "b": self.b,
                "stop_words": self.stop_words,
                "stemming": self.stemming,
                "doc_ids": self._slot_doc,
                "terms": self._terms,
            }
        )
        n_slots = len(self._slot_doc)
        with store.atomic_writer(path) as f:
            np.savez(
                f,
                header=np.frombuffer(header, dtype=np.uint8),
                term_ids=self._pool_tid[: self._pool_n],
                tfs=self._pool_tf[: self._pool_n],
                runs=self._slot_end[:n_slots] - self._slot_start[:n_slots],
            )

    @classmethod
    def load(cls, path: Path) -> "BM25Index":
        """Inverse of :meth:`save`; df and lengths are recomputed with numpy.

        Raises ValueError for any file that is not a readable index (callers rebuild); a missing
        file raises FileNotFoundError.
        """
        try:
            with np.load(Path(path), allow_pickle=False) as z:
                meta = orjson.loads(z["header"].tobytes())
                if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
                    raise ValueError(f"{path}: not an {_FORMAT} file")
                tids = z["term_ids"].astype(np.int32)
                tfs = z["tfs"].astype(np.int32)
                runs = z["runs"].astype(np.int64)  # number of (term, tf) entries per document
                k1, b, sw, st = meta["k1"], meta["b"], bool(meta["stop_words"]), bool(meta["stemming"])
                terms, doc_ids = list(meta["terms"]), list(meta["doc_ids"])
                if runs.shape[0] != len(doc_ids) or int(runs.sum()) != tids.shape[0] or tids.shape != tfs.shape:
                    raise ValueError(f"{path}: inconsistent {_FORMAT} file")
        except (FileNotFoundError, ValueError):
            raise
        except Exception as e:  # bad zip, missing array, truncated file: callers rebuild on ValueError
            raise ValueError(f"{path}: not a readable {_FORMAT} file ({e})") from e
        idx = cls(k1, b, stop_words=sw, stemming=st)
        idx._terms = terms
        idx._term_id = {t: i for i, t in enumerate(idx._terms)}
        idx._slot_doc = doc_ids
        idx._slot_of = {d: i for i, d in enumerate(idx._slot_doc)}
        idx._pool_tid, idx._pool_tf, idx._pool_n = tids, tfs, int(tids.shape[0])
        idx._slot_end = np.cumsum(runs)
        idx._slot_start = idx._slot_end - runs
        slot_of_entry = np.repeat(np.arange(runs.shape[0], dtype=np.int64), runs)
        idx._slot_len = np.bincount(slot_of_entry, weights=tfs, minlength=runs.shape[0]).astype(np.int64)
        idx._total_len = int(idx._slot_len.sum())
        idx._df = np.bincount(tids, minlength=len(idx._terms)).astype(np.int64)
        return idx
