"""Built-in embedder: determinism, vector contract, IDF table lifecycle, retrieval sanity."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hrag_cli.embed.builtin import DEFAULT_DIM, BuiltinEmbedder, FeatureConfig, IdfTable, needs_refresh

TEXTS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, France.",
    "Marie Curie was a Polish and naturalised-French physicist and chemist.",
    "The Amazon River in South America is the largest river by discharge volume.",
    "Python is a high-level, general-purpose programming language.",
    "Mount Everest is Earth's highest mountain above sea level.",
    "Ünïcode tëxt — with “quotes”, emdashes and 東京 characters.",
]


def digest(m: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(m).tobytes()).hexdigest()


def test_shape_dtype_norm() -> None:
    emb = BuiltinEmbedder(IdfTable.fit(TEXTS))
    v = emb.encode(TEXTS + ["", "   ...!?  ", "the of and"])
    assert v.shape == (len(TEXTS) + 3, DEFAULT_DIM) and emb.dim == DEFAULT_DIM
    assert v.dtype == np.float32 and v.flags.c_contiguous
    assert np.all(np.isfinite(v))
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    # featureless texts (empty, punctuation, only stop words) get one fixed unit vector, never zeros
    assert np.array_equal(v[-1], v[-2]) and np.array_equal(v[-1], v[-3])
    assert emb.encode([]).shape == (0, DEFAULT_DIM)
    small = BuiltinEmbedder(dim=64)
    assert small.encode(["hello world"]).shape == (1, 64)


def test_deterministic_in_process() -> None:
    table = IdfTable.fit(TEXTS)
    a = BuiltinEmbedder(table).encode(TEXTS)
    b = BuiltinEmbedder(table).encode(TEXTS)
    emb = BuiltinEmbedder(table)
    # batch composition and word-cache state must not matter
    c = np.vstack([emb.encode([t]) for t in reversed(TEXTS)])[::-1]
    d = emb.encode(TEXTS)
    assert np.array_equal(a, b) and np.array_equal(a, c) and np.array_equal(a, d)
    big = emb.encode(TEXTS * 400)  # crosses internal block boundaries
    assert np.array_equal(big[-len(TEXTS):], a)


def test_deterministic_across_processes() -> None:
    code = (
        "import hashlib, sys, numpy as np\n"
        "from hrag_cli.embed.builtin import BuiltinEmbedder, IdfTable\n"
        f"texts = {TEXTS!r}\n"
        "t = IdfTable.fit(texts)\n"
        "m = BuiltinEmbedder(t).encode(texts)\n"
        "print(t.fingerprint(), hashlib.sha256(m.tobytes()).hexdigest())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
        cwd=Path(__file__).resolve().parents[1],
    ).stdout.split()
    table = IdfTable.fit(TEXTS)
    assert out == [table.fingerprint(), digest(BuiltinEmbedder(table).encode(TEXTS))]


def test_without_idf_and_model_id() -> None:
    plain = BuiltinEmbedder()
    assert plain.model_id == "builtin-v1"
    assert BuiltinEmbedder(dim=1024).model_id == "builtin-v1-d1024"
    table = IdfTable.fit(TEXTS)
    assert BuiltinEmbedder(table).model_id == f"builtin-v1+idf:{table.fingerprint()}"
    custom = FeatureConfig(char_weight=1.0)
    mid = BuiltinEmbedder(config=custom).model_id
    assert mid.startswith("builtin-v1-") and mid != plain.model_id
    v = plain.encode(TEXTS)
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    with pytest.raises(ValueError):  # a table fitted with other features cannot be used
        BuiltinEmbedder(table, config=custom)


def test_idf_table_round_trip_and_fingerprint(tmp_path: Path) -> None:
    table = IdfTable.fit(TEXTS)
    assert table.n_docs == len(TEXTS)
    assert table.df.dtype == np.uint32 and table.df.max() <= len(TEXTS)
    fp = table.fingerprint()
    assert len(fp) == 12 and fp == IdfTable.fit(list(TEXTS)).fingerprint()  # stable
    assert IdfTable.fit(TEXTS[:-1]).fingerprint() != fp  # content-sensitive
    assert IdfTable.fit(iter(TEXTS), batch_size=2).fingerprint() == fp  # batching-independent
    assert IdfTable.fit(iter(TEXTS), batch_chars=40).fingerprint() == fp  # batches cut by text size too
    p = tmp_path / "idf" / "table.npz"
    table.save(p)
    table.save(p)  # overwrite is fine
    assert sorted(f.name for f in p.parent.iterdir()) == ["table.npz"]  # no temp leftovers
    back = IdfTable.load(p)
    assert back.n_docs == table.n_docs and np.array_equal(back.df, table.df)
    assert back.fingerprint() == fp and back.config_tag == table.config_tag
    assert np.array_equal(BuiltinEmbedder(back).encode(TEXTS), BuiltinEmbedder(table).encode(TEXTS))


def test_idf_of_some_buckets_is_that_of_the_whole_table() -> None:
    """The embedder looks up the IDF of the buckets a word hits, not the whole 2**20 table (cold queries)."""
    table = IdfTable.fit(TEXTS)
    buckets = np.random.default_rng(1).integers(0, len(table.df), 5000)
    buckets[:50] = np.flatnonzero(table.df)[:50]           # some buckets the texts did fill
    for kind in ("plain", "smooth", "bm25"):
        assert np.array_equal(table.idf(0.5, kind, buckets), table.idf(0.5, kind)[buckets])


def test_load_rejects_other_features_and_garbage(tmp_path: Path) -> None:
    custom = FeatureConfig(char_weight=1.0)
    p = tmp_path / "idf.npz"
    IdfTable.fit(TEXTS, custom).save(p)
    assert IdfTable.load(p, custom).config_tag == custom.tag()
    with pytest.raises(ValueError):  # fitted with other features than the default: caller refits
        IdfTable.load(p)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a table")
    with pytest.raises(ValueError):
        IdfTable.load(bad)
    with pytest.raises(FileNotFoundError):
        IdfTable.load(tmp_path / "missing.npz")


def test_needs_refresh() -> None:
    table = IdfTable(n_docs=100, df=np.zeros(1 << 20, dtype=np.uint32))
    assert not needs_refresh(table, 100)
    assert not needs_refresh(table, 120)  # +20% is still fine
    assert needs_refresh(table, 121)
    assert needs_refresh(table, 79)  # shrinking counts too
    assert needs_refresh(table, 150, growth=0.2) and not needs_refresh(table, 150, growth=0.5)
    assert needs_refresh(None, 1) and not needs_refresh(None, 0)
    empty = IdfTable(n_docs=0, df=np.zeros(1 << 20, dtype=np.uint32))
    assert needs_refresh(empty, 3) and not needs_refresh(empty, 0)


def test_paraphrase_is_nearest() -> None:
    docs = [
        "The Eiffel Tower, located in Paris, was completed in 1889 for the World's Fair.",
        "The Great Wall of China stretches thousands of kilometres across northern China.",
        "Photosynthesis converts sunlight, water and carbon dioxide into glucose in plants.",
        "The stock market fell sharply after the central bank raised interest rates.",
        "Beethoven composed nine symphonies, including the famous Ninth with its choral finale.",
    ]
    queries = [
        ("When was the tower in Paris finished?", 0),
        ("How do plants turn sunlight into sugar (glucose)?", 2),
        ("How many symphonies did Beethoven write?", 4),
        ("interest rate rise by the central bank", 3),
    ]
    for table in (None, IdfTable.fit(docs)):
        emb = BuiltinEmbedder(table)
        d = emb.encode(docs)
        for q, gold in queries:
            sims = d @ emb.encode([q])[0]
            assert int(np.argmax(sims)) == gold, (q, sims)


def test_word_cache_reset_keeps_vectors(monkeypatch: pytest.MonkeyPatch) -> None:
    import hrag_cli.embed.builtin as mod

    table = IdfTable.fit(TEXTS)
    want = BuiltinEmbedder(table).encode(TEXTS)
    monkeypatch.setattr(mod, "_MAX_VOCAB", 12)  # forces a cache reset on almost every batch
    emb = BuiltinEmbedder(table)
    got = np.vstack([emb.encode([t]) for t in TEXTS])
    assert np.array_equal(got, want)
    assert np.array_equal(emb.encode(TEXTS[::-1])[::-1], want)
