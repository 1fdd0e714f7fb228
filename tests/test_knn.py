"""The synonym pass's neighbour lists (synonyms.KnnLists / update_knn / candidate_pairs) on random vectors with
planted near-copies: a full pass matches brute force, an incremental pass after deletions, edits and additions
gives what a pass from scratch gives, and the saved lists survive a round trip (and damage)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hrag_cli.config import VectorSettings
from hrag_cli.progress import Reporter
from hrag_cli.synonyms import KnnLists, best_k, candidate_pairs, update_knn
from hrag_cli.vectors import VectorIndex

QUIET = Reporter("quiet")
K = 5
THRESHOLD = 0.8


def planted(rng: np.random.Generator, n: int, dim: int = 24) -> np.ndarray:
    """Random unit vectors; every fourth is a noisy copy (cosine ~0.9) of the one before it."""
    m = rng.standard_normal((n, dim)).astype(np.float32)
    for i in range(1, n, 4):
        m[i] = m[i - 1] / np.linalg.norm(m[i - 1]) * 3 + rng.standard_normal(dim).astype(np.float32) * 0.15
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def exact_lists(m: np.ndarray, k: int) -> list[set[int]]:
    sims = m @ m.T
    np.fill_diagonal(sims, -np.inf)
    return [set(np.argsort(-row, kind="stable")[:k].tolist()) for row in sims]


def full_pass(ids: list[str], m: np.ndarray, settings: VectorSettings) -> tuple[KnnLists, int]:
    idx = VectorIndex.build("names", ids, m, settings, "model", hashes=[f"h{i}" for i in ids])
    return update_knn(KnnLists(K, "model"), ids, [f"h{i}" for i in ids], m, idx, K, QUIET, ef=64)


@pytest.mark.parametrize("exact_below", [10_000, 0])     # exact search, then the HNSW graph
def test_full_pass_matches_brute_force(exact_below: int) -> None:
    rng = np.random.default_rng(0)
    m = planted(rng, 400)
    ids = [f"e{i:03d}" for i in range(400)]
    knn, queried = full_pass(ids, m, VectorSettings(exact_below=exact_below))
    assert queried == 400 and knn.nbr.shape == (400, K)
    truth = exact_lists(m, K)
    found = sum(len(truth[r] & set(knn.nbr[r].tolist())) for r in range(400))
    assert found / (400 * K) >= (1.0 if exact_below else 0.95)
    assert (knn.nbr != np.arange(400)[:, None]).all()                 # never its own neighbour
    assert (np.diff(knn.sim, axis=1) <= 1e-6).all()                   # best first
    pairs = candidate_pairs(knn, set(ids), THRESHOLD)
    assert {("e%03d" % (i - 1), "e%03d" % i) for i in range(1, 400, 4)} <= set(pairs)
    for (a, b), s in pairs.items():
        assert a < b and s >= THRESHOLD
        assert s == pytest.approx(float(m[int(a[1:])] @ m[int(b[1:])]), abs=1e-5)


@pytest.mark.parametrize("exact_below", [10_000, 0])
def test_incremental_pass_equals_a_pass_from_scratch(exact_below: int) -> None:
    rng = np.random.default_rng(1)
    settings = VectorSettings(exact_below=exact_below, ef_search=64)
    m = planted(rng, 600)
    ids = [f"e{i:03d}" for i in range(600)]
    hashes = [f"h{i}" for i in ids]
    idx = VectorIndex.build("names", ids, m, settings, "model", hashes=hashes)
    first, _ = update_knn(KnnLists(K, "model"), ids, hashes, m, idx, K, QUIET, ef=64)

    # delete 30, re-embed 10 (new text: new hash, new vector), add 40 new ones of which 20 copy old entities
    keep = [i for i in range(600) if i % 20 != 7]
    m2, ids2, hashes2 = m[keep].copy(), [ids[i] for i in keep], [hashes[i] for i in keep]
    for r in range(0, 100, 10):
        m2[r] = planted(rng, 1)[0]
        hashes2[r] += "-edited"
    fresh = planted(rng, 40)
    for j in range(20):
        fresh[j] = m2[j * 25] + 0.05 * rng.standard_normal(m2.shape[1]).astype(np.float32)
    fresh /= np.linalg.norm(fresh, axis=1, keepdims=True)
    m2 = np.vstack([m2, fresh])
    ids2 += [f"n{j:03d}" for j in range(40)]
    hashes2 += [f"hn{j}" for j in range(40)]
    idx.sync(ids2, hashes2, m2)

    inc, queried = update_knn(first, ids2, hashes2, m2, idx, K, QUIET, ef=64)
    alive, edited = set(ids2), {ids2[r] for r in range(0, 100, 10)}
    lost = {i for i in ids2[:len(keep)] if i not in edited
            and any(b >= 0 and (ids[b] not in alive or ids[b] in edited) for b in first.nbr[ids.index(i)])}
    assert queried == len(edited) + 40 + len(lost)          # edited, new, and unchanged lists that lost someone
    scratch, _ = update_knn(KnnLists(K, "model"), ids2, hashes2, m2, idx, K, QUIET, ef=64)
    assert candidate_pairs(inc, set(ids2), THRESHOLD) == pytest.approx(candidate_pairs(scratch, set(ids2), THRESHOLD))
    same = sum(len(set(inc.nbr[r].tolist()) & set(scratch.nbr[r].tolist())) for r in range(len(ids2)))
    assert same / (len(ids2) * K) >= (1.0 if exact_below else 0.97)
    # and a second run with nothing changed queries nobody and changes nothing
    again, queried = update_knn(inc, ids2, hashes2, m2, idx, K, QUIET, ef=64)
    assert queried == 0 and (again.nbr == inc.nbr).all() and (again.sim == inc.sim).all()


def test_best_k_keeps_distinct_neighbours_best_first() -> None:
    nbr = np.array([[3, 1, 3, -1, 2, 1], [-1, -1, -1, -1, -1, -1]])
    sim = np.array([[0.5, 0.9, 0.7, 0.99, 0.9, 0.2], [0, 0, 0, 0, 0, 0]], dtype=np.float32)
    sim[1] = -np.inf
    got, s = best_k(nbr, sim, 4)
    assert got.tolist() == [[1, 2, 3, -1], [-1, -1, -1, -1]]          # ties broken by row; 3 at its best, 0.7
    assert s[0, :3].tolist() == pytest.approx([0.9, 0.9, 0.7]) and np.isneginf(s[0, 3]) and np.isneginf(s[1]).all()


def test_saved_lists_round_trip_and_damage_means_recompute(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    m = planted(rng, 50)
    ids = [f"e{i}" for i in range(50)]
    knn, _ = full_pass(ids, m, VectorSettings())
    path = tmp_path / "names.knn.npz"
    knn.save(path)
    back = KnnLists.load(path, K, "model")
    assert back.ids == ids and back.hashes == knn.hashes
    assert (back.nbr == knn.nbr).all() and np.array_equal(back.sim, knn.sim)
    assert back.ids[back.nbr[1, 0]] == "e0"                     # e1 is a noisy copy of e0
    assert KnnLists.load(path, K + 1, "model").ids == []          # another k or embedder: recomputed
    assert KnnLists.load(path, K, "other").ids == []
    path.write_bytes(path.read_bytes()[:100])                      # torn file
    assert KnnLists.load(path, K, "model").ids == []
    assert KnnLists.load(tmp_path / "missing.npz", K, "model").ids == []


def test_projected_name_index_gives_exact_similarities() -> None:
    """On a PCA-projected index the candidates are re-scored on the full vectors: listed cosines are exact."""
    rng = np.random.default_rng(3)
    m = rng.standard_normal((800, 6)).astype(np.float32) @ rng.standard_normal((6, 48)).astype(np.float32)
    m += 0.05 * rng.standard_normal(m.shape).astype(np.float32)
    m[1::4] = m[0::4] + 0.3 * rng.standard_normal(m[0::4].shape).astype(np.float32)
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    ids = [f"e{i:03d}" for i in range(800)]
    knn, _ = full_pass(ids, m, VectorSettings(exact_below=500, pca_variance=0.95))
    idx = VectorIndex.build("names", ids, m, VectorSettings(exact_below=500, pca_variance=0.95), "model")
    assert idx.projected
    truth = exact_lists(m, K)
    assert sum(len(truth[r] & set(knn.nbr[r].tolist())) for r in range(800)) / (800 * K) >= 0.97
    rows = np.repeat(np.arange(800), K)
    assert np.allclose(knn.sim.ravel(), (m[rows] * m[knn.nbr.ravel()]).sum(1), atol=1e-5)
