"""The one embedder interface, its three back-ends, and the embedding cache.

API (the query and synonyms stages code against this):

    from hrag_cli.embed.embedder import get_embedder
    emb = get_embedder(project, settings)   # project may be None (no cache, no frozen IDF); builtin: no cache
    emb.model_id      # str: cache-key prefix; names back-end, model and (builtin) the IDF fingerprint
    emb.dim           # int
    emb.encode(texts, reporter=None) -> np.ndarray   # float32 (n, dim), rows L2-normalised, cached
    emb.encode_query(text) -> np.ndarray             # float32 (dim,), L2-normalised; reads the cache, never writes
    emb.stats         # {"embedded": texts computed, "cached": texts served from the cache}

Back-end, chosen by `embed.model` (`--embed-model`, HRAG_EMBED_MODEL):
- `builtin` (default): hrag_cli.embed.builtin.BuiltinEmbedder, offline, no download. Its IDF table is frozen in
  vectors/idf.npz, fitted on the chunk texts by `refresh_idf` (called by the synonyms stage) and refitted when
  the chunk count moved by more than embed.idf_refresh_growth; `embed_status` reports it for `hrag status`.
- `st:NAME_OR_FOLDER`: a sentence-transformers model (extra `hrag[local]`), loaded offline (HF_HUB_OFFLINE=1),
  run under bfloat16 autocast unless embed.precision is float32 (the model_id then ends in +bf16).
- anything else: a litellm embedding model (`litellm.aembedding`), api_base embed.api_base, batches of
  embed.batch_size, embed.concurrency batches in flight, retries through hrag_cli.core.llm_retry.with_retries.

The cache (cache/embeddings/; st: and litellm models, builtin keeps none): per model_id three files, named by a
slug plus a hash of the model_id: `<m>.json` {model_id, dim} (atomic), `<m>.keys` (16-byte binary text hashes,
fixed width) and `<m>.f32` (raw float32 rows, fixed width), both append-only. A block is appended vectors-first
(flushed and fsynced) then keys, so after a crash the row count is min(keys rows, vector rows) and both files are
cut back to it on the next writable open: a torn tail can never pair a key with the wrong vector. Fixed widths
make a large cache open in milliseconds (one read of the keys, a memmap of the vectors). Only a process
holding the project writer lock appends; read-only commands (query) just read.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from hrag_cli.core import interrupt, store
from hrag_cli.core.config import Settings
from hrag_cli.core.errors import HragError, UsageError
from hrag_cli.core.progress import Reporter
from hrag_cli.core.project import ProjectDir

IDF_FILE = "idf.npz"
_KEY_BYTES = 16
_BLOCK = 4096          # texts per cache append for local back-ends (bounds memory and crash loss)
ST_TOKENS = 4096       # tokens (rows x longest row) per forward pass of a sentence-transformers model
ST_MAX_ROWS = 256      # and at most this many texts in one pass (short names: bounds the padding of the batch)


def _normalise(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float32)
    if m.ndim == 1:
        m = m[None, :]
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    bad = ~np.isfinite(norms[:, 0]) | (norms[:, 0] < 1e-12)
    if bad.any():
        raise HragError("the embedding model returned an empty or invalid vector")
    return np.ascontiguousarray(m / norms, dtype=np.float32)


def _key(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()[:_KEY_BYTES]


# -- the cache ---------------------------------------------------------------------------------------------
class EmbeddingCache:
    """Append-only (model_id, text hash) -> vector store for one model; see the module docstring."""

    def __init__(self, directory: Path, model_id: str, writable: bool) -> None:
        self.dir = Path(directory)
        self.model_id = model_id
        self.writable = writable
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model_id)[:60]
        base = f"{slug}-{hashlib.sha256(model_id.encode()).hexdigest()[:10]}"
        self.meta_path = self.dir / f"{base}.json"
        self.keys_path = self.dir / f"{base}.keys"
        self.vec_path = self.dir / f"{base}.f32"
        self.dim: int | None = None
        self._rows: dict[bytes, int] = {}
        self._n = 0
        self._open()

    def files(self) -> list[Path]:
        return [self.meta_path, self.keys_path, self.vec_path]

    def _open(self) -> None:
        try:
            meta = store.read_json(self.meta_path, default=None)
        except (ValueError, OSError):   # a damaged cache header: start the cache afresh, never fail a query
            meta = None
        if not isinstance(meta, dict) or meta.get("model_id") != self.model_id or not meta.get("dim"):
            return
        self.dim = int(meta["dim"])
        try:
            ksize = self.keys_path.stat().st_size
            vsize = self.vec_path.stat().st_size
        except FileNotFoundError:
            ksize = vsize = 0
        n = min(ksize // _KEY_BYTES, vsize // (4 * self.dim))
        if self.writable and (ksize != n * _KEY_BYTES or vsize != n * 4 * self.dim):
            for path, size in ((self.keys_path, n * _KEY_BYTES), (self.vec_path, n * 4 * self.dim)):
                if path.exists():
                    with open(path, "rb+") as fh:
                        fh.truncate(size)
        if n:
            raw = self.keys_path.read_bytes()[: n * _KEY_BYTES]
            self._rows = {raw[i * _KEY_BYTES:(i + 1) * _KEY_BYTES]: i for i in range(n)}
        self._n = n

    def __len__(self) -> int:
        return self._n

    def find(self, keys: list[bytes]) -> np.ndarray:
        """Row per key, -1 when absent."""
        get = self._rows.get
        return np.fromiter((get(k, -1) for k in keys), dtype=np.int64, count=len(keys))

    def rows(self, rows: np.ndarray) -> np.ndarray:
        if len(rows) == 0 or self.dim is None:
            return np.zeros((0, self.dim or 0), np.float32)
        mm = np.memmap(self.vec_path, dtype=np.float32, mode="r", shape=(self._n, self.dim))
        return np.array(mm[rows], dtype=np.float32)

    def append(self, keys: list[bytes], matrix: np.ndarray) -> None:
        if not self.writable or not keys:
            return
        if self.dim is None:
            self.dim = int(matrix.shape[1])
            self.dir.mkdir(parents=True, exist_ok=True)
            for p in (self.keys_path, self.vec_path):   # leftovers of a model whose meta never got written
                if p.exists():
                    p.unlink()
            store.write_json(self.meta_path, {"model_id": self.model_id, "dim": self.dim})
        data = np.ascontiguousarray(matrix, dtype="<f4").tobytes()
        with open(self.vec_path, "ab") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        with open(self.keys_path, "ab") as fh:
            fh.write(b"".join(keys))
            fh.flush()
            os.fsync(fh.fileno())
        for k in keys:
            self._rows[k] = self._n
            self._n += 1


# -- back-ends ---------------------------------------------------------------------------------------------
class _Backend:
    model_id: str

    @property
    def dim(self) -> int:
        raise NotImplementedError

    def known_dim(self) -> int | None:
        """The dimension if it costs nothing to know (no model load, no request)."""
        return None

    def encode_raw(self, texts: list[str], reporter: Reporter | None = None) -> np.ndarray:
        raise NotImplementedError


class BuiltinBackend(_Backend):
    def __init__(self, idf: Any) -> None:
        from hrag_cli.embed.builtin import BuiltinEmbedder

        self.impl = BuiltinEmbedder(idf=idf)
        self.model_id = self.impl.model_id

    @property
    def dim(self) -> int:
        return int(self.impl.dim)

    def known_dim(self) -> int | None:
        return self.dim

    def encode_raw(self, texts: list[str], reporter: Reporter | None = None) -> np.ndarray:
        return self.impl.encode(texts)


class SentenceTransformerBackend(_Backend):
    """A local sentence-transformers model; the model_id of a folder includes a hash of its files' names and
    sizes, so swapping the model in the folder re-embeds instead of mixing vectors."""

    def __init__(self, spec: str, precision: str = "bf16") -> None:
        if importlib.util.find_spec("sentence_transformers") is None:
            raise UsageError(f"embedding model 'st:{spec}' needs sentence-transformers: install hrag[local]")
        # never download; no progress bars in a cron log; OpenMP threads that sleep instead of spinning while
        # they wait: with the default spin, two torch threads beside any other busy process encode short
        # texts several times slower (bench/encode_speed.py --st; OpenMP reads it when torch is imported)
        for var, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false"),
                           ("HF_HUB_DISABLE_PROGRESS_BARS", "1"), ("TRANSFORMERS_VERBOSITY", "error"),
                           ("OMP_WAIT_POLICY", "PASSIVE")):
            os.environ.setdefault(var, value)
        self.spec = spec
        path = Path(spec).expanduser()
        if path.is_dir():
            sig = sorted((str(p.relative_to(path)), p.stat().st_size) for p in path.rglob("*") if p.is_file())
            label = "/".join(path.resolve().parts[-2:])   # "model" alone says little; keep its parent too
            self.model_id = f"st:{label}:{hashlib.sha256(repr(sig).encode()).hexdigest()[:10]}"
            self.location = str(path.resolve())
        elif spec.startswith((".", "/", "~")) or os.sep in spec and not re.match(r"^[\w.-]+/[\w.-]+$", spec):
            raise UsageError(f"embedding model folder not found: {spec}")
        else:
            self.model_id = f"st:{spec}"
            self.location = spec
        precision = precision.strip().lower()   # one of config.EMBED_PRECISIONS (check_ranges)
        # bf16 vectors differ from float32 ones (cosine ~0.99998), so they are another model: never mixed in
        # one index or cache, and a project built with the other precision re-embeds once
        self.precision = precision
        if precision != "float32":
            self.model_id += f"+{precision}"
        self._model: Any = None
        self._lock = threading.Lock()
        self.tokens_per_pass = ST_TOKENS

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                try:
                    from sentence_transformers import SentenceTransformer

                    try:
                        from transformers.utils import logging as hf_logging

                        hf_logging.disable_progress_bar()
                        hf_logging.set_verbosity_error()
                    except Exception:  # an older/newer transformers without these: only cosmetic
                        pass

                    # local_files_only as well as HF_HUB_OFFLINE: the env var is read when huggingface_hub is
                    # first imported, which may have happened before we set it
                    self._model = SentenceTransformer(self.location, device="cpu", local_files_only=True)
                except Exception as exc:
                    msg = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
                    raise UsageError(f"cannot load sentence-transformers model '{self.spec}' offline: {msg}") from None
            return self._model

    @property
    def dim(self) -> int:
        model = self._load()
        fn = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(fn())

    def encode_raw(self, texts: list[str], reporter: Reporter | None = None) -> np.ndarray:
        """Texts sorted by token count and cut into passes of about `tokens_per_pass` tokens (padding only to
        the longest of similar lengths; short names go hundreds to a pass), each run under inference_mode and,
        for bf16, bfloat16 autocast (less CPU where the CPU has bf16 instructions). The model's own
        tokenizer, truncation to its max_seq_length, and forward pass: the vectors are the model's."""
        import torch

        model = self._load()
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        prompt = (getattr(model, "prompts", None) or {}).get(getattr(model, "default_prompt_name", None) or "")
        if prompt:   # a model whose encode() prefixes every text (e5-style "query: "): the same vectors here
            texts = [prompt + t for t in texts]
        limit = getattr(model, "max_seq_length", None) or 512
        ids = model.tokenizer(texts, truncation=True, max_length=limit)["input_ids"]
        lengths = np.fromiter(map(len, ids), np.int64, len(texts))
        order = np.argsort(lengths, kind="stable")
        prepare = getattr(model, "preprocess", None) or model.tokenize   # tokenize: before sentence-transformers 6
        out: np.ndarray | None = None
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.precision == "bf16"):
            for rows in _passes(lengths[order], self.tokens_per_pass):
                picked = order[rows]
                vecs = model(prepare([texts[i] for i in picked]))["sentence_embedding"].float().numpy()
                if out is None:
                    out = np.empty((len(texts), vecs.shape[1]), np.float32)
                out[picked] = vecs
        return out  # type: ignore[return-value]


def _passes(sorted_lengths: np.ndarray, tokens: int) -> Iterator[slice]:
    """Consecutive slices of ascending lengths, each at most `tokens` once padded to its longest (at least one
    text) and at most ST_MAX_ROWS texts."""
    start, n = 0, len(sorted_lengths)
    while start < n:
        end = start + 1
        while end < n and end - start < ST_MAX_ROWS and (end + 1 - start) * sorted_lengths[end] <= tokens:
            end += 1
        yield slice(start, end)
        start = end


class LiteLLMBackend(_Backend):
    """Any litellm embedding model. The dimension is learnt from the first response (or the cache meta).
    `fail_fast` (query time): one attempt with a short connect timeout, as query-time chat calls, since a
    query must not sit through index-time retries and backoff against a server that is not there."""

    def __init__(self, settings: Settings, known_dim: int | None = None, fail_fast: bool = False) -> None:
        from hrag_cli.core.llm import import_litellm

        self.settings = settings
        self.fail_fast = fail_fast
        self.model = settings.embed.model
        self.model_id = f"litellm:{self.model}"
        self._dim = known_dim
        litellm = import_litellm()
        try:
            litellm.get_llm_provider(self.model, api_base=settings.embed.api_base or None)
        except Exception:
            raise UsageError(f"unknown embedding model '{self.model}': use builtin, st:NAME_OR_FOLDER, or a litellm "
                             f"model with its provider, e.g. openai/text-embedding-3-small") from None

    def known_dim(self) -> int | None:
        return self._dim

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self.encode_raw(["dimension probe"]).shape[1])
        return self._dim

    def encode_raw(self, texts: list[str], reporter: Reporter | None = None) -> np.ndarray:
        return _run_async(lambda: self._aencode(texts, reporter))

    async def _aencode(self, texts: list[str], reporter: Reporter | None) -> np.ndarray:
        import asyncio

        from hrag_cli.core.llm import QUERY_CONNECT_TIMEOUT, REMOTE_TIMEOUT, import_litellm, request_timeout
        from hrag_cli.core.llm_retry import with_retries

        litellm = import_litellm()
        es = self.settings.embed
        retry = replace(self.settings.llm, max_retries=0) if self.fail_fast else self.settings.llm
        size = max(1, es.batch_size)
        batches = [texts[i:i + size] for i in range(0, len(texts), size)]
        sem = asyncio.Semaphore(max(1, es.concurrency))
        timeout = request_timeout(self.settings.llm.timeout or REMOTE_TIMEOUT,
                                  QUERY_CONNECT_TIMEOUT if self.fail_fast else None)
        kwargs: dict[str, Any] = {"model": self.model, "timeout": timeout}
        if es.api_base:
            kwargs["api_base"] = es.api_base
        what = f"embedding model {self.model}" + (f" at {es.api_base}" if es.api_base else "")

        async def one(batch: list[str]) -> np.ndarray:
            async with sem:
                resp = await with_retries(lambda: litellm.aembedding(input=batch, **kwargs), retry,
                                          reporter, what=what)
            data = resp.data if hasattr(resp, "data") else resp["data"]
            items = [d if isinstance(d, dict) else d.__dict__ for d in data]
            items.sort(key=lambda d: d.get("index", 0))
            if len(items) != len(batch):
                raise HragError(f"{what}: asked for {len(batch)} vectors, got {len(items)}")
            return np.asarray([d["embedding"] for d in items], dtype=np.float32)

        parts = await asyncio.gather(*(one(b) for b in batches))
        out = np.concatenate(parts) if parts else np.zeros((0, self._dim or 0), np.float32)
        if len(out) and self._dim is None:
            self._dim = int(out.shape[1])
        return out


def _run_async(factory: Any) -> Any:
    """asyncio.run, or the same in a helper thread when the caller already runs an event loop. (asyncio is
    imported here, not at the top: a builtin query never needs it, and importing it costs tens of ms.)"""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return interrupt.run(factory)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["v"] = asyncio.run(factory())
        except BaseException as exc:  # re-raised in the caller's thread
            box["e"] = exc

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box["v"]


# -- the interface -----------------------------------------------------------------------------------------
class Embedder:
    """A back-end plus the cache: `encode` embeds only texts the cache has not seen under this model_id."""

    def __init__(self, backend: _Backend, cache: EmbeddingCache | None) -> None:
        self.backend = backend
        self.cache = cache
        self.stats = {"embedded": 0, "cached": 0}

    @property
    def model_id(self) -> str:
        return self.backend.model_id

    @property
    def dim(self) -> int:
        return self.backend.dim

    def encode(self, texts: list[str], reporter: Reporter | None = None) -> np.ndarray:
        n = len(texts)
        if n == 0:   # no probe request or model load just to learn the width of nothing
            return np.zeros((0, self.backend.known_dim() or 0), np.float32)
        if self.cache is None:           # no cache (builtin): each distinct text once, no hashing
            where: dict[str, int] = {}
            for t in texts:
                where.setdefault(t, len(where))
            distinct = list(where)
            m = self._compute(distinct, None, reporter)
            return m if len(distinct) == n else m[np.fromiter(map(where.__getitem__, texts), np.int64, n)]
        keys = [_key(t) for t in texts]
        pos: dict[bytes, int] = {}
        first: list[int] = []            # index in `texts` of each distinct text
        for i, k in enumerate(keys):
            if k not in pos:
                pos[k] = len(first)
                first.append(i)
        ukeys = list(pos)
        rows = self.cache.find(ukeys) if self.cache is not None else np.full(len(ukeys), -1, np.int64)
        hit = rows >= 0
        miss = np.flatnonzero(~hit)
        got = self.cache.rows(rows[hit]) if hit.any() else None  # type: ignore[union-attr]
        computed = None
        if len(miss):
            computed = self._compute([texts[first[j]] for j in miss], [ukeys[j] for j in miss], reporter)
        dim = (got if got is not None else computed).shape[1]  # type: ignore[union-attr]
        out_u = np.empty((len(ukeys), dim), np.float32)
        if got is not None:
            out_u[hit] = got
        if computed is not None:
            out_u[miss] = computed
        self.stats["cached"] += int(hit.sum())
        return out_u[[pos[k] for k in keys]]

    def _compute(self, texts: list[str], keys: list[bytes] | None, reporter: Reporter | None) -> np.ndarray:
        block = _BLOCK if not isinstance(self.backend, LiteLLMBackend) else max(1, self.backend.settings.embed.batch_size
                                                                              * self.backend.settings.embed.concurrency * 4)
        parts: list[np.ndarray] = []
        rep = reporter or Reporter("quiet")
        with rep.task(f"embed {self.model_id}", total=len(texts)) as task:
            for s in range(0, len(texts), block):
                m = _normalise(self.backend.encode_raw(texts[s:s + block], reporter))
                if self.cache is not None and keys is not None:
                    self.cache.append(keys[s:s + block], m)
                parts.append(m)
                self.stats["embedded"] += len(m)
                task.advance(len(m))
        return np.concatenate(parts)

    def encode_query(self, text: str) -> np.ndarray:
        if self.cache is not None:
            row = self.cache.find([_key(text)])
            if row[0] >= 0:
                return self.cache.rows(row)[0]
        return _normalise(self.backend.encode_raw([text]))[0]


def _holds_lock(project: ProjectDir) -> bool:
    return getattr(project, "_lock_fh", None) is not None


def _load_idf(project: ProjectDir | None) -> Any:
    if project is None:
        return None
    from hrag_cli.embed.builtin import IdfTable

    path = project.vectors_dir / IDF_FILE
    if not path.exists():
        return None
    try:
        return IdfTable.load(path)
    except Exception:
        return None   # unreadable or older format: the next synonyms run refits it


def get_embedder(project: ProjectDir | None, settings: Settings, *, cache_writes: bool | None = None,
                 fail_fast: bool = False) -> Embedder:
    """The configured embedder. Cache writes default to 'only while this process holds the writer lock';
    `fail_fast` for query time (a litellm model gets one attempt and a short connect timeout)."""
    name = (settings.embed.model or "builtin").strip()
    if name == "builtin":
        backend: _Backend = BuiltinBackend(_load_idf(project))
    elif name.startswith("st:"):
        if not name[3:].strip():
            raise UsageError("embedding model 'st:' needs a name or a folder, e.g. st:all-MiniLM-L6-v2")
        backend = SentenceTransformerBackend(name[3:].strip(), settings.embed.precision)
    else:
        backend = LiteLLMBackend(settings, fail_fast=fail_fast)
    cache = None
    if project is not None and not isinstance(backend, BuiltinBackend):
        # builtin encodes tens of thousands of texts a second, faster than a cache of 2048-wide rows is read,
        # and the vector indices already keep every embedded item: a cache would only cost disk
        writable = _holds_lock(project) if cache_writes is None else cache_writes
        cache = EmbeddingCache(project.embeddings_dir, backend.model_id, writable)
        if isinstance(backend, LiteLLMBackend) and cache.dim:
            backend._dim = cache.dim
    return Embedder(backend, cache)


# -- the builtin IDF table -----------------------------------------------------------------------------------
def refresh_idf(project: ProjectDir, settings: Settings, chunk_texts: Iterable[str], n_docs: int,
                reporter: Reporter | None = None) -> dict:
    """Fit the builtin embedder's IDF on the chunk texts when missing or when the corpus moved by more than
    embed.idf_refresh_growth; freeze it in vectors/idf.npz. A refit changes the model_id (vectors re-embed
    once). Builtin keeps no embedding cache: files an earlier version cached for it are removed here."""
    if (settings.embed.model or "builtin").strip() != "builtin":
        return {}
    from hrag_cli.embed.builtin import IdfTable, needs_refresh

    for path in project.embeddings_dir.glob("builtin-*"):   # builtin caches of an older layout: never read
        path.unlink(missing_ok=True)
    table = _load_idf(project)
    refit = needs_refresh(table, n_docs, settings.embed.idf_refresh_growth)
    if refit and n_docs > 0:
        new = IdfTable.fit(chunk_texts)
        new.save(project.vectors_dir / IDF_FILE)
        if reporter is not None:
            reporter.info(f"builtin embedder: IDF fitted on {new.n_docs} chunks "
                          f"(was {table.n_docs if table else 0}); vectors re-embed once")
        table = new
    return {"idf_fitted_docs": table.n_docs if table else 0, "idf_current_docs": n_docs,
            "idf_fingerprint": table.fingerprint() if table else "", "idf_refit": bool(refit and n_docs > 0)}


def embed_status(project: ProjectDir, settings: Settings) -> dict:
    """For `hrag status`: the embedder, and for builtin the frozen IDF table against the current corpus."""
    name = (settings.embed.model or "builtin").strip()
    info: dict[str, Any] = {"model": name}
    if name != "builtin":
        return info
    from hrag_cli.embed.builtin import needs_refresh

    table = _load_idf(project)
    rec = project.stage("chunk")
    current = int(rec.counts.get("chunks", 0)) if rec else 0
    info.update({"model_id": BuiltinBackend(table).model_id,
                 "idf_fitted_docs": table.n_docs if table else 0, "idf_current_docs": current,
                 "idf_fingerprint": table.fingerprint() if table else "",
                 "idf_refresh_due": bool(needs_refresh(table, current, settings.embed.idf_refresh_growth))})
    return info
