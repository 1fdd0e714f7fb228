"""BM25: hand-computed scores, incremental == rebuilt, persistence."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from hrag_cli.storage.bm25 import BM25Index

TOY = {
    "d1": "apple banana apple",  # 3 tokens
    "d2": "banana cherry",  # 2 tokens
    "d3": "cherry date elderberry fig",  # 4 tokens
}  # N = 3, avgdl = 9 / 3 = 3


def same_ranking(a: list[tuple[str, float]], b: list[tuple[str, float]]) -> bool:
    return [d for d, _ in a] == [d for d, _ in b] and [s for _, s in a] == pytest.approx([s for _, s in b])


def toy() -> BM25Index:
    idx = BM25Index()
    for d, t in TOY.items():
        idx.add(d, t)
    return idx


def test_idf_formula_by_hand() -> None:
    idx = toy()
    # df(apple)=1: log(1 + (3 - 1 + 0.5) / (1 + 0.5)) = log(8/3)
    assert idx.idf("apple") == pytest.approx(math.log(8 / 3))
    assert idx.idf("apple") == pytest.approx(0.980829, abs=1e-6)
    # df(banana)=2: log(1 + 1.5 / 2.5) = log(1.6)
    assert idx.idf("banana") == pytest.approx(0.470004, abs=1e-6)
    assert idx.idf("never") == pytest.approx(math.log(1 + 3.5 / 0.5))


def test_scores_by_hand() -> None:
    idx = toy()
    assert idx.avgdl == 3
    # apple in d1: tf=2, |d|=3: 2 * 2.2 / (2 + 1.2 * (0.25 + 0.75 * 3/3)) = 4.4 / 3.2 = 1.375
    assert idx.score("apple") == pytest.approx({"d1": 0.980829 * 1.375}, abs=1e-6)
    s = idx.score("banana cherry")
    idf = math.log(1.6)
    # d1: banana tf=1, |d|=3 -> 2.2 / (1 + 1.2) = 1
    # d2: both, tf=1, |d|=2 -> 2.2 / (1 + 1.2 * (0.25 + 0.5)) = 2.2 / 1.9, twice
    # d3: cherry tf=1, |d|=4 -> 2.2 / (1 + 1.2 * (0.25 + 1.0)) = 2.2 / 2.5
    assert s["d1"] == pytest.approx(idf * 1.0)
    assert s["d2"] == pytest.approx(2 * idf * 2.2 / 1.9)
    assert s["d3"] == pytest.approx(idf * 0.88)
    assert s["d2"] == pytest.approx(1.088430, abs=1e-6)
    assert [d for d, _ in idx.top_k("banana cherry", 2)] == ["d2", "d1"]
    # a repeated query word counts once; case and punctuation do not matter
    assert idx.score("Banana, BANANA cherry!") == pytest.approx(s)


def test_custom_params() -> None:
    idx = BM25Index(k1=2.0, b=0.0)
    for d, t in TOY.items():
        idx.add(d, t)
    # b=0: no length normalisation: tf=2 -> 2 * 3 / (2 + 2) = 1.5
    assert idx.score("apple")["d1"] == pytest.approx(math.log(8 / 3) * 1.5)


def test_stop_words_removed_by_default() -> None:
    idx = BM25Index()
    idx.add("a", "The cat sat on the mat")
    idx.add("b", "the dog")
    assert idx.score("the of and") == {}
    assert idx.term_counts("a") == {"cat": 1, "sat": 1, "mat": 1}
    keep = BM25Index(stop_words=False)
    keep.add("a", "The cat")
    assert "the" in keep.term_counts("a")


def test_top_k_scores_for_and_ties() -> None:
    idx = BM25Index()
    idx.add("z", "alpha beta")
    idx.add("y", "alpha beta")
    idx.add("x", "gamma")
    top = idx.top_k("alpha", 5)
    assert [d for d, _ in top] == ["y", "z"]  # equal scores: by doc id
    assert top[0][1] == top[1][1] > 0
    assert idx.top_k("alpha", 1) == [top[0]]
    assert idx.top_k("nothing here", 3) == []
    sf = idx.scores_for("alpha", ["x", "z", "missing"])
    assert sf == {"x": 0.0, "z": pytest.approx(top[1][1])}


def test_incremental_equals_rebuilt() -> None:
    texts = {f"c{i}": f"word{i % 7} common text{i % 3} shared item{i}" for i in range(40)}
    inc = BM25Index()
    for d, t in texts.items():
        inc.add(d, t)
    for i in range(0, 40, 3):  # remove a third (triggers compaction)
        inc.remove(f"c{i}")
        del texts[f"c{i}"]
    inc.remove("c0")  # idempotent
    inc.add("c1", "replaced body word3 shared")  # replace in place
    texts["c1"] = "replaced body word3 shared"
    inc.add("new", "brand new word5 text2")
    texts["new"] = "brand new word5 text2"

    fresh = BM25Index()
    for d, t in texts.items():
        fresh.add(d, t)
    assert len(inc) == len(fresh) == len(texts)
    assert set(inc.doc_ids()) == set(texts)
    assert "c3" not in inc and "c1" in inc
    assert inc.avgdl == fresh.avgdl
    for q in ["word3 shared", "text2 common", "brand new", "item4 item5 word1"]:
        assert inc.score(q) == pytest.approx(fresh.score(q))
        assert same_ranking(inc.top_k(q, 5), fresh.top_k(q, 5))
    for d in texts:
        assert inc.term_counts(d) == fresh.term_counts(d)


def test_remove_everything() -> None:
    idx = toy()
    for d in list(TOY):
        idx.remove(d)
    assert len(idx) == 0 and idx.top_k("apple", 3) == [] and idx.score("apple") == {}
    idx.add("again", "apple")
    assert [d for d, _ in idx.top_k("apple", 3)] == ["again"]


def test_save_load_round_trip(tmp_path: Path) -> None:
    idx = BM25Index(k1=1.5, b=0.6)
    for i in range(30):
        idx.add(f"doc-{i}", f"token{i % 5} other{i % 4} unique{i} Ünïcode wörd")
    idx.remove("doc-3")
    before = {q: idx.top_k(q, 10) for q in ["token1 other2", "unique7", "wörd", "ünïcode"]}
    p = tmp_path / "sub" / "bm25.npz"
    idx.save(p)
    assert [f.name for f in p.parent.iterdir()] == ["bm25.npz"]  # no temp file left behind
    back = BM25Index.load(p)
    assert (back.k1, back.b, back.stop_words, back.stemming) == (1.5, 0.6, True, False)
    assert len(back) == 29 and "doc-3" not in back and "doc-4" in back
    for q, top in before.items():
        assert same_ranking(back.top_k(q, 10), top)
    back.add("doc-3", "unique7")  # a loaded index stays updatable
    assert back.top_k("unique7", 1)[0][0] == "doc-3"
    idx.save(p)  # overwrite in place
    assert len(BM25Index.load(p)) == 29


def test_load_rejects_foreign_file(tmp_path: Path) -> None:
    import numpy as np

    p = tmp_path / "x.npz"
    np.savez(p, header=np.frombuffer(b'{"format":"other"}', dtype=np.uint8))
    with pytest.raises(ValueError):
        BM25Index.load(p)


def test_load_garbage_is_value_error(tmp_path: Path) -> None:
    for i, payload in enumerate([b'{"docs": {}}', b"PK\x03\x04 truncated zip", b""]):
        p = tmp_path / f"g{i}"
        p.write_bytes(payload)
        with pytest.raises(ValueError):
            BM25Index.load(p)
    with pytest.raises(FileNotFoundError):
        BM25Index.load(tmp_path / "missing")


def test_removed_empty_document_is_not_resurrected_by_save(tmp_path: Path) -> None:
    # a chunk of only stop words has no entries; removing it frees none, yet its slot must not be saved
    idx = BM25Index()
    idx.add("empty", "the of and")
    idx.add("cat", "cat dog")
    idx.remove("empty")
    p = tmp_path / "bm25.npz"
    idx.save(p)
    back = BM25Index.load(p)
    assert back.doc_ids() == ["cat"] and len(back) == 1 and back.avgdl == idx.avgdl == 2.0
    assert back.idf("cat") == idx.idf("cat")


def test_load_header_missing_fields_is_value_error(tmp_path: Path) -> None:
    import numpy as np

    p = tmp_path / "h.npz"
    np.savez(p, header=np.frombuffer(b'{"format":"hrag-bm25-v1"}', dtype=np.uint8),
             term_ids=np.zeros(0, np.int32), tfs=np.zeros(0, np.int32), runs=np.zeros(0, np.int64))
    with pytest.raises(ValueError):   # query/index.py and the synonyms stage treat ValueError as "rebuild"
        BM25Index.load(p)


def test_a_first_query_scores_without_the_inverted_index_and_the_same() -> None:
    """The first query of an index (a query process's cold one) scans the pool for its terms (no sort of every
    entry); its scores are the inverted index's, removed documents included (their entries stay in the pool
    until compaction)."""
    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(60)]
    idx = BM25Index()
    for d in range(300):
        idx.add(f"d{d}", " ".join(rng.choice(words, size=int(rng.integers(1, 25)))))
    for d in range(0, 300, 7):
        idx.remove(f"d{d}")
    for q in ["w1 w2 w3", "w59 w1 w1", "w40 nothing", "w7"]:
        idx._inv, idx._queries = None, 0
        first = idx.score(q)                         # a first query builds nothing
        assert idx._inv is None and first
        assert idx.score(q) == first and idx._inv is not None


def test_the_length_norm_made_once_scores_as_each_query_s_own_and_follows_changes() -> None:
    """A query with the inverted index reads every slot's length norm made once per index: the very scores of
    a first query's norm of its matched slots, made again after documents come or go."""
    rng = np.random.default_rng(4)
    words = [f"w{i}" for i in range(40)]
    idx = BM25Index()
    for d in range(200):
        idx.add(f"d{d}", " ".join(rng.choice(words, size=int(rng.integers(1, 30)))))
    idx.score("w0")                                  # past the first query: the next ones build and use `_inv`

    def cold(q: str) -> dict[str, float]:
        idx._inv, idx._queries = None, 0
        return idx.score(q)

    for change in (lambda: None, lambda: idx.add("new", "w1 w2 w2 " * 40), lambda: idx.remove("d3")):
        change()
        for q in ("w1 w2", "w39 w7 w7", "w0"):
            warm = idx.score(q)                      # right after the change: a stale norm would show here
            assert idx._inv is not None and idx._norm is not None and idx._norm[0] is idx._inv
            assert cold(q) == warm                   # bit for bit
