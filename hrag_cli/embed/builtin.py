"""The built-in offline embedder: hashed lexical features projected to a fixed dense vector.

Why it exists: hrag must work with no download and no torch. A signed feature-hashing embedder over
word unigrams and word-boundary character n-grams (UTF-8 bytes), optionally weighted by a frozen
corpus IDF table, is fast (numpy only), deterministic across processes (blake2b, never ``hash()``)
and retrieves surprisingly well (see ``bench/encode_speed.py`` and docs/benchmarks.md).

Caching contract: the vector for a text depends only on (the text, :attr:`BuiltinEmbedder.model_id`).
``model_id`` carries the feature version, the dimension (when not the default) and the fingerprint of
the IDF table, so refreshing the table simply moves every vector to a new cache key.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat
from pathlib import Path
from typing import Any

import numpy as np

from hrag_cli.core import store
from hrag_cli.core.intsets import unique_counts
from hrag_cli.core.textnorm import STOP_WORDS, raw_tokens, stem

__all__ = [
    "DEFAULT_DIM",
    "FEATURE_VERSION",
    "BuiltinEmbedder",
    "FeatureConfig",
    "IdfTable",
    "needs_refresh",
]

FEATURE_VERSION = "v1"
DEFAULT_DIM = 2048  # fewer buckets lose recall to hash collisions; 8 KB a dense vector
IDF_BITS = 20  # df is counted in 2**20 hash buckets, far finer than the output dim, so IDF stays sharp
_IDF_MASK = (1 << IDF_BITS) - 1
_BATCH = 1024  # texts per internal block: bounds the (block x dim) float64 accumulator
_FIT_CHARS = 1 << 22  # characters of text per IdfTable.fit batch (bounds its token strings)
_MAX_VOCAB = 1_000_000  # word-feature cache is dropped and rebuilt past this many words
_Q = float(1 << 24)  # accumulation quantum (see _Featurizer.dense)

_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)
_S32 = np.uint64(32)
_S63 = np.uint64(63)


def _fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3 finaliser: spreads combined hashes over all 64 bits (uint64 arithmetic wraps)."""
    h = h ^ (h >> _S33)
    h = h * _M1
    h = h ^ (h >> _S33)
    h = h * _M2
    return h ^ (h >> _S33)


def _hash_strings(strings: Sequence[str]) -> np.ndarray:
    """Stable 64-bit hashes (blake2b) of strings; identical in every process and on every machine."""
    out = np.empty(len(strings), dtype=np.uint64)
    b2 = hashlib.blake2b
    for i, s in enumerate(strings):
        out[i] = int.from_bytes(b2(s.encode("utf-8"), digest_size=8, person=b"hrag-w").digest(), "little")
    return out


_POLY = np.uint64(0x100000001B3)  # FNV prime as polynomial base; odd, so the map is well spread
_NGRAM_SALT = np.uint64(0xA0761D6478BD642F)


def _ngram_hashes(words: Sequence[str], nmin: int, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of the byte n-grams (nmin..nmax) of ``"<" + word + ">"`` for many words at once.

    Vectorised polynomial hash over the UTF-8 bytes, finalised with fmix64: per new word this is
    far cheaper than a blake2b call per n-gram. The whole padded word is skipped (it is the unigram).
    Returns (hashes, index of the word each hash belongs to).
    """
    enc = [("<" + w + ">").encode("utf-8") for w in words]
    lens = np.fromiter(map(len, enc), dtype=np.int64, count=len(enc))
    buf = np.frombuffer(b"".join(enc), dtype=np.uint8).astype(np.uint64)
    starts = np.cumsum(lens) - lens
    widx = np.arange(len(words), dtype=np.int64)
    hs: list[np.ndarray] = []
    ws: list[np.ndarray] = []
    for n in range(nmin, nmax + 1):
        cnt = np.where(lens > n, lens - n + 1, 0)
        total = int(cnt.sum())
        if total == 0:
            continue
        pos = np.repeat(starts - (np.cumsum(cnt) - cnt), cnt) + np.arange(total, dtype=np.int64)
        h = np.full(total, np.uint64(n), dtype=np.uint64)
        for k in range(n):
            h = h * _POLY + buf[pos + k]
        hs.append(_fmix64(h ^ _NGRAM_SALT))
        ws.append(np.repeat(widx, cnt))
    if not hs:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    return np.concatenate(hs), np.concatenate(ws)


@dataclass(frozen=True)
class FeatureConfig:
    """What goes into a vector. Changing any field changes vectors, so it is part of the fingerprint."""

    ngram_min: int = 4
    ngram_max: int = 5
    char_weight: float = 2.0  # total (L2) weight of one word's char n-grams; the word itself weighs 1
    stop_words: bool = True
    stemming: bool = False  # applies to the word feature only; slightly worse recall on the dev sets
    idf_power: float = 1.5  # >1 concentrates a vector on rare features: fewer harmful collisions
    idf_kind: str = "plain"  # "plain": log((N+1)/(df+1)); "smooth": plain+1; "bm25": log(1+(N-df+.5)/(df+.5))
    tf_kind: str = "log"  # per distinct word: "log": 1+log(tf); "raw": tf; "binary": 1; "sat": 2.2tf/(tf+1.2)

    def tag(self) -> str:
        """Short stable string used in fingerprints."""
        return (
            f"ng{self.ngram_min}-{self.ngram_max}:c{self.char_weight:g}:sw{int(self.stop_words)}"
            f":st{int(self.stemming)}:p{self.idf_power:g}:{self.idf_kind}:{self.tf_kind}"
        )


DEFAULT_CONFIG = FeatureConfig()


class _Featurizer:
    """Turns a batch of texts into flat arrays of weighted feature occurrences.

    Per unique word it caches the hashes and base weights of its features (the costly part), in one
    CSR layout, so a batch is expanded with numpy gathers rather than Python loops. A text is a bag
    of words.
    """

    def __init__(
        self, config: FeatureConfig, dim: int | None = None,
        idf_w: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        self.config = config
        self.dim = dim  # with a dim, per-feature output bucket and final value are precomputed
        self.idf_w = idf_w
        self._reset()

    def _reset(self) -> None:
        self.vocab: dict[str, int] = {}
        self.offsets = np.zeros(1, dtype=np.int64)
        self.feat_hash = np.zeros(0, dtype=np.uint64)
        self.feat_w = np.zeros(0, dtype=np.float32)
        self.feat_bucket = np.zeros(0, dtype=np.int64)
        self.feat_val = np.zeros(0, dtype=np.float32)

    def _add_words(self, words: list[str]) -> None:
        cfg = self.config
        start = len(self.vocab)
        nw = len(words)
        stop = np.fromiter(
            ((cfg.stop_words and w in STOP_WORDS) for w in words), dtype=bool, count=nw
        )
        live = [w for w, s in zip(words, stop.tolist()) if not s]
        live_idx = np.flatnonzero(~stop)
        uni = _hash_strings([stem(w) if cfg.stemming else w for w in live])
        hashes = [uni]
        owner = [live_idx]
        weights = [np.ones(len(live), dtype=np.float32)]
        if cfg.char_weight > 0 and cfg.ngram_max >= cfg.ngram_min and live:
            gh, gw = _ngram_hashes(live, cfg.ngram_min, cfg.ngram_max)
            per_word = np.bincount(gw, minlength=len(live))
            hashes.append(gh)
            owner.append(live_idx[gw])
            weights.append((cfg.char_weight / np.sqrt(np.maximum(per_word, 1)))[gw].astype(np.float32))
        h = np.concatenate(hashes)
        o = np.concatenate(owner)
        w = np.concatenate(weights)
        order = np.argsort(o, kind="stable")
        counts = np.bincount(o, minlength=nw)
        h = h[order]
        w = w[order]
        if self.dim is None:
            self.feat_hash = np.concatenate([self.feat_hash, h])
            self.feat_w = np.concatenate([self.feat_w, w])
        else:
            # Precompute everything that does not depend on the text: bucket (bits 32..62), sign
            # (bit 63), IDF (bits 0..19). Encoding is then a gather plus one bincount.
            if self.idf_w is not None:
                w = w * self.idf_w((h & np.uint64(_IDF_MASK)).astype(np.intp))
            w[(h >> _S63).astype(bool)] *= -1.0
            b = ((h >> _S32) % np.uint64(self.dim)).astype(np.int64)
            self.feat_bucket = np.concatenate([self.feat_bucket, b])
            self.feat_val = np.concatenate([self.feat_val, w.astype(np.float32)])
        self.offsets = np.concatenate([self.offsets, self.offsets[-1] + np.cumsum(counts)])
        self.vocab.update(zip(words, range(start, start + nw)))

    def doc_words(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(doc index, word id, count) per distinct word of each text.

        Tokens are mapped to ids one by one and counted by sorting (doc, id) keys: faster than a
        collections.Counter per text.
        """
        toks = [raw_tokens(t) for t in texts]
        lens = np.fromiter(map(len, toks), dtype=np.int64, count=len(toks))
        flat = list(chain.from_iterable(toks))
        get = self.vocab.get
        ids = np.fromiter(map(get, flat, repeat(-1)), dtype=np.int64, count=len(flat))
        missing = np.flatnonzero(ids < 0)
        if missing.size:
            new = sorted({flat[i] for i in missing.tolist()})
            if len(self.vocab) + len(new) > _MAX_VOCAB:
                # Bound memory: drop the cache and rebuild it from this batch's words only.
                self._reset()
                self._add_words(sorted(set(flat)))
                get = self.vocab.get
                ids = np.fromiter(map(get, flat, repeat(-1)), dtype=np.int64, count=len(flat))
            else:
                self._add_words(new)
                ids[missing] = [self.vocab[flat[i]] for i in missing.tolist()]
        v = max(len(self.vocab), 1)
        key = np.repeat(np.arange(len(texts), dtype=np.int64) * v, lens) + ids
        uniq, counts = unique_counts(key)
        return uniq // v, uniq % v, counts

    def _expand(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(doc index, feature position, tf weight) per feature occurrence of the batch."""
        docs, ids, counts = self.doc_words(texts)
        k = self.config.tf_kind
        if k == "log":
            tfw = 1.0 + np.log(counts)
        elif k == "raw":
            tfw = counts.astype(np.float64)
        elif k == "binary":
            tfw = np.ones(counts.size)
        else:
            tfw = 2.2 * counts / (counts + 1.2)
        starts = self.offsets[ids]
        nfeat = self.offsets[ids + 1] - starts
        total = int(nfeat.sum())
        pos = np.repeat(starts - (np.cumsum(nfeat) - nfeat), nfeat) + np.arange(total, dtype=np.int64)
        return np.repeat(docs, nfeat), pos, np.repeat(tfw, nfeat)

    def occurrences(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(doc index, 64-bit feature hash, weight before IDF) per feature occurrence; no-dim mode.

        Each distinct word contributes its features once, weighted by ``tf_kind`` (default 1+log(tf)).
        """
        f_doc, pos, tfw = self._expand(texts)
        return f_doc, self.feat_hash[pos], tfw * self.feat_w[pos]

    def dense(self, texts: Sequence[str]) -> np.ndarray:
        """Unnormalised float64 (n, dim) sums of signed, IDF-weighted features; dim mode."""
        n = len(texts)
        f_doc, pos, tfw = self._expand(texts)
        idx = f_doc * self.dim + self.feat_bucket[pos]
        # Quantise each contribution to a multiple of 2**-24: float64 sums of such values (|sum| <
        # 2**29) are exact, hence independent of summation order, which depends on the word-cache
        # history. So a text's vector is bit-identical whatever was encoded before or beside it.
        w = np.rint(tfw * self.feat_val[pos] * _Q) / _Q
        acc = np.bincount(idx, weights=w, minlength=n * self.dim)
        return acc.reshape(n, self.dim)


@dataclass
class IdfTable:
    """Frozen document frequencies per hash bucket (2**IDF_BITS buckets) plus the doc count.

    Frozen on purpose: vectors are cached by ``model_id``, which includes :meth:`fingerprint`, so a
    table must never change in place. Refresh by fitting a new table (see :func:`needs_refresh`).
    """

    n_docs: int
    df: np.ndarray  # uint32, shape (2**IDF_BITS,)
    config_tag: str = DEFAULT_CONFIG.tag()
    _fp: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def fit(
        cls, texts: Iterable[str], config: FeatureConfig = DEFAULT_CONFIG, batch_size: int = 4096,
        batch_chars: int = _FIT_CHARS,
    ) -> "IdfTable":
        """Count, per bucket, the documents containing any feature hashed there (one pass). A batch ends at
        `batch_size` texts or `batch_chars` characters: each of its tokens is a Python string while it is
        counted, so long chunks in batches of a fixed count would hold hundreds of MB. Counts are per
        document, so the batching never changes the table."""
        fz = _Featurizer(config)
        df = np.zeros(1 << IDF_BITS, dtype=np.int64)
        n = chars = 0
        buf: list[str] = []

        def flush() -> None:
            f_doc, f_hash, _ = fz.occurrences(buf)
            b = (f_hash & np.uint64(_IDF_MASK)).astype(np.int64)
            uk, _ = unique_counts((f_doc << IDF_BITS) | b)
            df[:] += np.bincount(uk & _IDF_MASK, minlength=1 << IDF_BITS)

        for t in texts:
            buf.append(t)
            n += 1
            chars += len(t)
            if len(buf) >= batch_size or chars >= batch_chars:
                flush()
                buf, chars = [], 0
        if buf:
            flush()
        return cls(n_docs=n, df=df.astype(np.uint32), config_tag=config.tag())

    def idf(self, power: float = 1.0, kind: str = "plain", buckets: Any = slice(None)) -> np.ndarray:
        """IDF per bucket (of ``buckets``: all by default), raised to ``power``; float32.

        plain: log((N+1)/(df+1)) (a feature in every doc weighs ~0); smooth: plain + 1;
        bm25: log(1 + (N-df+0.5)/(df+0.5)).
        """
        df = self.df[buckets].astype(np.float64)
        n = float(self.n_docs)
        if kind == "smooth":
            v = np.log((n + 1.0) / (df + 1.0)) + 1.0
        elif kind == "bm25":
            v = np.log1p((n - df + 0.5) / (df + 0.5))
        elif kind == "plain":
            v = np.log((n + 1.0) / (df + 1.0))
        else:
            raise ValueError(f"unknown idf kind {kind!r}")
        if power != 1.0:
            v = v**power
        return v.astype(np.float32)

    def fingerprint(self) -> str:
        """12 hex chars over (format version, feature config, n_docs, df bytes): the cache-key part."""
        if self._fp is None:
            h = hashlib.blake2b(digest_size=6)
            h.update(f"idf:{FEATURE_VERSION}:{IDF_BITS}:{self.config_tag}:{self.n_docs}".encode())
            h.update(np.ascontiguousarray(self.df, dtype="<u4").tobytes())
            self._fp = h.hexdigest()
        return self._fp

    def save(self, path: Path) -> None:
        """Write atomically (temp file in the same folder, then os.replace)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with store.atomic_writer(path) as f:
            np.savez_compressed(
                f,
                n_docs=np.int64(self.n_docs),
                df=np.ascontiguousarray(self.df, dtype="<u4"),
                config_tag=np.array(self.config_tag),
                version=np.array(f"{FEATURE_VERSION}:{IDF_BITS}"),
            )

    @classmethod
    def load(cls, path: Path, config: FeatureConfig = DEFAULT_CONFIG) -> "IdfTable":
        """Read a table saved by :meth:`save`.

        Raises ValueError for anything that cannot serve ``config`` (other file, other format
        version, fitted with other features): callers treat that as "refit", never as fatal.
        FileNotFoundError passes through.
        """
        try:
            with np.load(Path(path), allow_pickle=False) as z:
                version = str(z["version"])
                table = cls(
                    n_docs=int(z["n_docs"]), df=z["df"].astype(np.uint32), config_tag=str(z["config_tag"])
                )
        except FileNotFoundError:
            raise
        except Exception as e:  # bad zip, missing key, truncated file, ...
            raise ValueError(f"{path}: not a readable IDF table ({e})") from e
        if version != f"{FEATURE_VERSION}:{IDF_BITS}":
            raise ValueError(f"IDF table {path} has format {version}, expected {FEATURE_VERSION}:{IDF_BITS}")
        if table.config_tag != config.tag():
            raise ValueError(f"IDF table {path} was fitted with features {table.config_tag}; refit it")
        if table.df.shape != (1 << IDF_BITS,):
            raise ValueError(f"IDF table {path} has {table.df.shape[0]} buckets, expected {1 << IDF_BITS}")
        return table


def needs_refresh(table: IdfTable | None, current_n_docs: int, growth: float = 0.2) -> bool:
    """True when the corpus size moved by more than ``growth`` (relative) since the table was frozen.

    Shrinking counts too (deleted documents skew df). A missing or empty table needs a fit whenever
    there are documents. Refitting is cheap (one hashed pass), and old cached vectors just stop
    matching the new model_id.
    """
    if table is None or table.n_docs <= 0:
        return current_n_docs > 0
    return abs(current_n_docs - table.n_docs) > growth * table.n_docs


class BuiltinEmbedder:
    """Signed feature hashing of words and char n-grams into ``dim`` dims; cosine-ready.

    Without an IDF table every feature has weight 1 (stop words still removed); with one, each feature
    is scaled by its bucket's IDF**1.5. Queries and passages go through the same :meth:`encode`.
    An instance keeps a per-word feature cache (the speed comes from it), so it is not thread-safe:
    use one instance per thread.
    """

    def __init__(
        self, idf: IdfTable | None = None, dim: int = DEFAULT_DIM, config: FeatureConfig = DEFAULT_CONFIG
    ) -> None:
        if dim < 16:
            raise ValueError("dim must be >= 16")
        if idf is not None and idf.config_tag != config.tag():
            raise ValueError(f"IDF table was fitted with features {idf.config_tag}, not {config.tag()}")
        self.dim = dim
        self.idf = idf
        self.config = config
        # the IDF of the buckets a new word's features hit, computed when the word is first seen: a query
        # embeds a few words, and the whole 2**20 table would be much of a cold query
        idf_w = (lambda b: idf.idf(config.idf_power, config.idf_kind, b)) if idf is not None else None
        self._fz = _Featurizer(config, dim=dim, idf_w=idf_w)
        # Fixed unit vector for texts without features, so hnswlib cosine never sees a zero vector.
        e = np.ones(dim, dtype=np.float32)
        e[1::2] = -1.0
        self._empty = e / np.float32(math.sqrt(dim))

    @property
    def model_id(self) -> str:
        """Cache-key prefix: ``builtin-v1`` (+``-d<dim>`` if not default, +``-<cfg>`` if custom)
        (+``+idf:<fingerprint>`` with a table)."""
        mid = f"builtin-{FEATURE_VERSION}"
        if self.dim != DEFAULT_DIM:
            mid += f"-d{self.dim}"
        if self.config != DEFAULT_CONFIG:
            mid += "-" + hashlib.blake2b(self.config.tag().encode(), digest_size=4).hexdigest()
        if self.idf is not None:
            mid += f"+idf:{self.idf.fingerprint()}"
        return mid

    def encode(self, texts: list[str]) -> np.ndarray:
        """float32 (n, dim), each row L2-normalised; featureless texts get a fixed unit vector."""
        n = len(texts)
        out = np.empty((n, self.dim), dtype=np.float32)
        for s in range(0, n, _BATCH):
            self._encode_block(texts[s : s + _BATCH], out[s : s + _BATCH])
        return out

    def _encode_block(self, texts: Sequence[str], out: np.ndarray) -> None:
        acc = self._fz.dense(texts)
        norms = np.sqrt(np.einsum("ij,ij->i", acc, acc))
        empty = norms < 1e-12
        norms[empty] = 1.0
        np.divide(acc, norms[:, None], out=out, casting="unsafe")
        if empty.any():
            out[empty] = self._empty
