"""The built-in offline embedder: hashed lexical features projected to a fixed dense vector.

Why it exists: hrag must work with no download and no torch. A signed feature-hashing embedder over
word unigrams, word bigrams and word-boundary character n-grams, optionally weighted by a frozen
corpus IDF table, is fast (numpy only), deterministic across processes (blake2b, never ``hash()``)
and retrieves surprisingly well (see ``bench/encode_speed.py`` and the issue-7 report).

Caching contract: the vector for a text depends only on (the text, :attr:`BuiltinEmbedder.model_id`).
``model_id`` carries the feature version, the dimension (when not the default) and the fingerprint of
the IDF table, so refreshing the table simply moves every vector to a new cache key.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat
from pathlib import Path

import numpy as np

from hrag_cli.textnorm import STOP_WORDS, raw_tokens, stem

__all__ = [
    "DEFAULT_DIM",
    "FEATURE_VERSION",
    "BuiltinEmbedder",
    "FeatureConfig",
    "IdfTable",
    "needs_refresh",
]

FEATURE_VERSION = "v1"
DEFAULT_DIM = 1024
IDF_BITS = 20  # df is counted in 2**20 hash buckets, far finer than the output dim, so IDF stays sharp
_IDF_MASK = (1 << IDF_BITS) - 1
_BATCH = 1024  # texts per internal block: bounds the (block x dim) float64 accumulator to ~8 MB
_MAX_VOCAB = 1_000_000  # word-feature cache is dropped and rebuilt past this many words

_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_GOLD = np.uint64(0x9E3779B97F4A7C15)
_BIGRAM_SALT = np.uint64(0x6A09E667F3BCC909)
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
        out[i] = int.from_bytes(b2(s.encode("utf-8"), digest_size=8).digest(), "little")
    return out


@dataclass(frozen=True)
class FeatureConfig:
    """What goes into a vector. Changing any field changes vectors, so it is part of the fingerprint."""

    ngram_min: int = 3
    ngram_max: int = 5
    word_weight: float = 1.0
    char_weight: float = 1.0  # total weight of one word's char n-grams (spread over them, L2-wise)
    bigram_weight: float = 0.5
    stop_words: bool = True
    stemming: bool = True  # applies to the word unigram/bigram features only
    sublinear_tf: bool = True
    idf_power: float = 1.0
    idf_kind: str = "smooth"  # "smooth": log((N+1)/(df+1))+1; "bm25": log(1+(N-df+.5)/(df+.5)); "plain": log((N+1)/(df+1))

    def tag(self) -> str:
        """Short stable string used in fingerprints."""
        return (
            f"ng{self.ngram_min}-{self.ngram_max}:w{self.word_weight:g}:c{self.char_weight:g}"
            f":b{self.bigram_weight:g}:sw{int(self.stop_words)}:st{int(self.stemming)}"
            f":tf{int(self.sublinear_tf)}:p{self.idf_power:g}:{self.idf_kind}"
        )


DEFAULT_CONFIG = FeatureConfig()


class _Featurizer:
    """Turns a batch of texts into flat arrays of weighted feature occurrences.

    Per unique word it caches the hashes and base weights of its features (the costly part), in one
    CSR layout so a batch is expanded with numpy gathers rather than Python loops.
    """

    def __init__(self, config: FeatureConfig) -> None:
        self.config = config
        self._reset()

    def _reset(self) -> None:
        self.vocab: dict[str, int] = {}
        self.offsets = np.zeros(1, dtype=np.int64)
        self.feat_hash = np.zeros(0, dtype=np.uint64)
        self.feat_w = np.zeros(0, dtype=np.float32)
        self.word_hash = np.zeros(0, dtype=np.uint64)  # unigram hash per word id, for bigrams
        self.is_stop = np.zeros(0, dtype=bool)

    def _word_features(self, word: str) -> tuple[list[str], list[float]]:
        cfg = self.config
        if cfg.stop_words and word in STOP_WORDS:
            return [], []
        base = stem(word) if cfg.stemming else word
        keys = ["w\x00" + base]
        weights = [cfg.word_weight]
        if cfg.char_weight > 0 and cfg.ngram_max >= cfg.ngram_min:
            padded = "<" + word + ">"
            grams = {
                padded[i : i + n]
                for n in range(cfg.ngram_min, cfg.ngram_max + 1)
                for i in range(len(padded) - n + 1)
            }
            grams.discard(padded)  # the whole word is already the unigram feature
            if grams:
                w = cfg.char_weight / math.sqrt(len(grams))
                for g in sorted(grams):
                    keys.append("c\x00" + g)
                    weights.append(w)
        return keys, weights

    def _add_words(self, words: list[str]) -> None:
        if len(self.vocab) + len(words) > _MAX_VOCAB:
            self._reset()
        keys: list[str] = []
        weights: list[float] = []
        lens = np.empty(len(words), dtype=np.int64)
        uni: list[str] = []
        stop = np.empty(len(words), dtype=bool)
        start = len(self.vocab)
        for j, w in enumerate(words):
            self.vocab[w] = start + j
            k, ws = self._word_features(w)
            keys.extend(k)
            weights.extend(ws)
            lens[j] = len(k)
            stop[j] = not k
            uni.append(k[0] if k else "w\x00" + w)
        self.feat_hash = np.concatenate([self.feat_hash, _hash_strings(keys)])
        self.feat_w = np.concatenate([self.feat_w, np.asarray(weights, dtype=np.float32)])
        self.offsets = np.concatenate([self.offsets, self.offsets[-1] + np.cumsum(lens)])
        self.word_hash = np.concatenate([self.word_hash, _hash_strings(uni)])
        self.is_stop = np.concatenate([self.is_stop, stop])

    def word_ids(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(doc index per token, word id per token) for the batch, stop words already dropped."""
        toklists = [raw_tokens(t) for t in texts]
        lens = np.fromiter(map(len, toklists), dtype=np.int64, count=len(toklists))
        flat = list(chain.from_iterable(toklists))
        get = self.vocab.get
        ids = np.fromiter(map(get, flat, repeat(-1)), dtype=np.int64, count=len(flat))
        missing = np.flatnonzero(ids < 0)
        if missing.size:
            new = sorted({flat[i] for i in missing.tolist()})
            before = len(self.vocab)
            self._add_words(new)
            if len(self.vocab) < before:  # cache was reset: every id must be looked up again
                ids = np.fromiter(map(get, flat, repeat(-1)), dtype=np.int64, count=len(flat))
            else:
                ids[missing] = [self.vocab[flat[i]] for i in missing.tolist()]
        docs = np.repeat(np.arange(len(texts), dtype=np.int64), lens)
        keep = ~self.is_stop[ids]
        return docs[keep], ids[keep]

    def occurrences(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Feature occurrences of a batch: (doc index, 64-bit feature hash, weight before IDF).

        Word features are counted once per (doc, word) with weight 1+log(tf) when sublinear_tf;
        bigrams of consecutive kept words once per occurrence.
        """
        cfg = self.config
        docs, ids = self.word_ids(texts)
        n_vocab = max(len(self.vocab), 1)
        key = docs * n_vocab + ids
        uniq, counts = np.unique(key, return_counts=True)
        u_doc = uniq // n_vocab
        u_id = uniq % n_vocab
        tfw = (1.0 + np.log(counts)) if cfg.sublinear_tf else counts.astype(np.float64)
        starts = self.offsets[u_id]
        nfeat = self.offsets[u_id + 1] - starts
        total = int(nfeat.sum())
        rep_start = np.repeat(starts - (np.cumsum(nfeat) - nfeat), nfeat)
        pos = rep_start + np.arange(total, dtype=np.int64)
        f_doc = np.repeat(u_doc, nfeat)
        f_hash = self.feat_hash[pos]
        f_w = np.repeat(tfw, nfeat) * self.feat_w[pos]
        if cfg.bigram_weight > 0 and ids.size > 1:
            same = docs[1:] == docs[:-1]
            h1 = self.word_hash[ids[:-1][same]]
            h2 = self.word_hash[ids[1:][same]]
            b_hash = _fmix64((h1 * _GOLD) ^ h2 ^ _BIGRAM_SALT)
            f_doc = np.concatenate([f_doc, docs[1:][same]])
            f_hash = np.concatenate([f_hash, b_hash])
            f_w = np.concatenate([f_w, np.full(b_hash.size, cfg.bigram_weight)])
        return f_doc, f_hash, f_w


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
        cls, texts: Iterable[str], config: FeatureConfig = DEFAULT_CONFIG, batch_size: int = 4096
    ) -> "IdfTable":
        """Count, per bucket, the documents containing any feature hashed there (one pass)."""
        fz = _Featurizer(config)
        df = np.zeros(1 << IDF_BITS, dtype=np.int64)
        n = 0
        buf: list[str] = []

        def flush() -> None:
            f_doc, f_hash, _ = fz.occurrences(buf)
            b = (f_hash & np.uint64(_IDF_MASK)).astype(np.int64)
            uk = np.unique((f_doc << IDF_BITS) | b)
            df[:] += np.bincount(uk & _IDF_MASK, minlength=1 << IDF_BITS)

        for t in texts:
            buf.append(t)
            n += 1
            if len(buf) >= batch_size:
                flush()
                buf = []
        if buf:
            flush()
        return cls(n_docs=n, df=df.astype(np.uint32), config_tag=config.tag())

    def idf(self, power: float = 1.0, kind: str = "smooth") -> np.ndarray:
        """IDF per bucket (default smoothed: log((N+1)/(df+1)) + 1), raised to ``power``; float32."""
        df = self.df.astype(np.float64)
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
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez_compressed(
                    f,
                    n_docs=np.int64(self.n_docs),
                    df=np.ascontiguousarray(self.df, dtype="<u4"),
                    config_tag=np.array(self.config_tag),
                    version=np.array(f"{FEATURE_VERSION}:{IDF_BITS}"),
                )
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: Path) -> "IdfTable":
        with np.load(Path(path), allow_pickle=False) as z:
            version = str(z["version"])
            if version != f"{FEATURE_VERSION}:{IDF_BITS}":
                raise ValueError(f"IDF table {path} has format {version}, expected {FEATURE_VERSION}")
            return cls(n_docs=int(z["n_docs"]), df=z["df"].astype(np.uint32), config_tag=str(z["config_tag"]))


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
    """Signed feature hashing of words, bigrams and char n-grams into ``dim`` dims; cosine-ready.

    Without an IDF table every feature has weight 1 (stop words still removed); with one, each feature
    is scaled by its bucket's IDF. Queries and passages go through the same :meth:`encode`.
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
        self._fz = _Featurizer(config)
        self._idf_w = idf.idf(config.idf_power, config.idf_kind) if idf is not None else None
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
            out[s : s + _BATCH] = self._encode_block(texts[s : s + _BATCH])
        return out

    def _encode_block(self, texts: Sequence[str]) -> np.ndarray:
        n = len(texts)
        f_doc, f_hash, f_w = self._fz.occurrences(texts)
        if self._idf_w is not None:
            f_w = f_w * self._idf_w[(f_hash & np.uint64(_IDF_MASK)).astype(np.intp)]
        bucket = ((f_hash >> _S32) % np.uint64(self.dim)).astype(np.int64)
        sign = 1.0 - 2.0 * (f_hash >> _S63).astype(np.float64)
        acc = np.bincount(f_doc * self.dim + bucket, weights=f_w * sign, minlength=n * self.dim)
        m = acc.reshape(n, self.dim).astype(np.float32)
        norms = np.linalg.norm(m, axis=1)
        empty = norms < 1e-12
        m /= np.where(empty, 1.0, norms)[:, None]
        if empty.any():
            m[empty] = self._empty
        return m
