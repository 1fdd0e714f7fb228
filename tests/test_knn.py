"""The synonym pass's neighbour lists (embed/knn.py, embed/synonym_edges.py, cells.py) on random
vectors with planted near-copies: a full pass matches brute force, an incremental pass after deletions, edits
and additions gives what a full join on the same cells gives, and the saved lists survive a round trip (and
damage)."""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from hrag_cli.storage.cells import cell_count, fit_cells, join, nearest_cells, spans
from hrag_cli.core.progress import Reporter
from hrag_cli.embed.knn import KnnLists, best_k, update_knn
from hrag_cli.embed.synonym_edges import candidate_pairs, pair_records

QUIET = Reporter("quiet")
K = 5
THRESHOLD = 0.8
EXACT = (4, 1000)          # (cells_per_entity, cell_size): up to 4000 entities, one cell
CELLS = (3, 40)            # 400 entities: 30 cells of ~40


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


def full_pass(ids: list[str], m: np.ndarray, cells: tuple[int, int]) -> tuple[KnnLists, int]:
    return update_knn(KnnLists(K, "model"), ids, [f"h{i}" for i in ids], m, K, QUIET, *cells)


def as_sets(knn: KnnLists) -> list[set[int]]:
    return [set(r[r >= 0].tolist()) for r in knn.nbr]


@pytest.mark.parametrize("cells", [EXACT, CELLS])
def test_full_pass_matches_brute_force(cells: tuple[int, int]) -> None:
    rng = np.random.default_rng(0)
    m = planted(rng, 400)
    ids = [f"e{i:03d}" for i in range(400)]
    knn, queried = full_pass(ids, m, cells)
    assert queried == 400 and knn.nbr.shape == (400, K)
    assert knn.plan.cells == (1 if cells == EXACT else 30) and knn.cells.shape == (400, min(cells[0], knn.plan.cells))
    truth = exact_lists(m, K)
    found = sum(len(truth[r] & set(knn.nbr[r].tolist())) for r in range(400))
    assert found / (400 * K) >= (1.0 if cells == EXACT else 0.8)      # weak neighbours of 24-dim noise: approximate
    assert (knn.nbr != np.arange(400)[:, None]).all()                 # never its own neighbour
    assert (np.diff(knn.sim, axis=1) <= 1e-6).all()                   # best first
    rows = np.repeat(np.arange(400), K)
    assert np.allclose(knn.sim.ravel(), (m[rows] * m[knn.nbr.ravel()]).sum(1), atol=1e-5)   # exact cosines
    pairs = candidate_pairs(knn, set(ids).__contains__, THRESHOLD)
    assert {("e%03d" % (i - 1), "e%03d" % i) for i in range(1, 400, 4)} <= set(pairs)
    for (a, b), s in pairs.items():
        assert a < b and s >= THRESHOLD
        assert s == pytest.approx(float(m[int(a[1:])] @ m[int(b[1:])]), abs=1e-5)


def edit(rng: np.random.Generator, m: np.ndarray, ids: list[str], hashes: list[str]):
    """Delete 30, re-embed 10 (new text: new hash, new vector), add 40 new ones of which 20 copy old entities."""
    keep = [i for i in range(len(ids)) if i % 20 != 7]
    m2, ids2, hashes2 = m[keep].copy(), [ids[i] for i in keep], [hashes[i] for i in keep]
    for r in range(0, 100, 10):
        m2[r] = planted(rng, 1)[0]
        hashes2[r] += "-edited"
    fresh = planted(rng, 40)
    for j in range(20):
        fresh[j] = m2[j * 25] + 0.05 * rng.standard_normal(m2.shape[1]).astype(np.float32)
    fresh /= np.linalg.norm(fresh, axis=1, keepdims=True)
    return (np.vstack([m2, fresh]), ids2 + [f"n{j:03d}" for j in range(40)], hashes2 + [f"hn{j}" for j in range(40)],
            {ids2[r] for r in range(0, 100, 10)})


@pytest.mark.parametrize("cells", [EXACT, CELLS])
def test_incremental_pass_equals_a_full_join_on_the_same_cells(cells: tuple[int, int]) -> None:
    rng = np.random.default_rng(1)
    m = planted(rng, 600)
    ids = [f"e{i:03d}" for i in range(600)]
    hashes = [f"h{i}" for i in ids]
    first, _ = update_knn(KnnLists(K, "model"), ids, hashes, m, K, QUIET, *cells)
    m2, ids2, hashes2, edited = edit(rng, m, ids, hashes)

    inc, queried = update_knn(first, ids2, hashes2, m2, K, QUIET, *cells)
    alive = set(ids2)
    lost = {i for i in ids2[:570] if i not in edited
            and any(b >= 0 and (ids[b] not in alive or ids[b] in edited) for b in first.nbr[ids.index(i)])}
    assert queried == len(edited) + 40 + len(lost)          # edited, new, and unchanged lists that lost someone
    assert inc.plan is first.plan                            # 610 < 2 x 600: the cells stay
    # everything joined again on the same centroids gives the same lists
    same_plan = KnnLists(K, "model", plan=first.plan, cell_settings=cells)
    scratch, queried = update_knn(same_plan, ids2, hashes2, m2, K, QUIET, *cells)
    assert queried == len(ids2)
    assert as_sets(inc) == as_sets(scratch)
    assert np.allclose(np.sort(inc.sim, axis=1), np.sort(scratch.sim, axis=1))
    assert candidate_pairs(inc, alive.__contains__, THRESHOLD) == pytest.approx(candidate_pairs(scratch, alive.__contains__, THRESHOLD))
    # and a second run with nothing changed queries nobody and changes nothing
    again, queried = update_knn(inc, ids2, hashes2, m2, K, QUIET, *cells)
    assert queried == 0 and (again.nbr == inc.nbr).all() and (again.sim == inc.sim).all()


def test_cells_are_fitted_when_the_corpus_outgrows_one_cell_and_refitted_when_it_doubles() -> None:
    rng = np.random.default_rng(4)
    m = planted(rng, 1000)
    ids = [f"e{i:04d}" for i in range(1000)]
    hashes = [f"h{i}" for i in ids]
    per, size = 2, 100
    knn, _ = update_knn(KnnLists(K, "model"), ids[:150], hashes[:150], m[:150], K, QUIET, per, size)
    assert knn.plan.cells == 1                                           # 150 <= 2 x 100: exact
    knn, queried = update_knn(knn, ids[:250], hashes[:250], m[:250], K, QUIET, per, size)
    assert queried == 250 and knn.plan.cells == cell_count(250, per, size) == 5 and knn.plan.fit_count == 250
    knn, queried = update_knn(knn, ids[:499], hashes[:499], m[:499], K, QUIET, per, size)
    assert queried < 499 and knn.plan.fit_count == 250                   # grown, not doubled
    knn, queried = update_knn(knn, ids[:500], hashes[:500], m[:500], K, QUIET, per, size)
    assert queried == 500 and knn.plan.fit_count == 500 and knn.plan.cells == 10
    knn, queried = update_knn(knn, ids[:500], hashes[:500], m[:500], K, QUIET, per, size + 1)
    assert queried == 500 and knn.cell_settings == (per, size + 1)       # other settings: fitted again


def test_nearest_cells_and_fit() -> None:
    rng = np.random.default_rng(5)
    m = planted(rng, 3000, dim=16)
    plan = fit_cells(m, 4, 200)
    assert plan.cells == cell_count(3000, 4, 200) == 60 and plan.fit_count == 3000
    assert np.allclose(np.linalg.norm(plan.centroids, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(fit_cells(m, 4, 200).centroids, plan.centroids)          # deterministic
    assert np.allclose(plan.mean, m.mean(axis=0), atol=1e-5)
    centred = (m - plan.mean) / np.linalg.norm(m - plan.mean, axis=1, keepdims=True)
    got = nearest_cells(m, plan, 4, block=700)
    want = np.argsort(-(centred @ plan.centroids.T), axis=1)[:, :4]
    assert (np.sort(got, axis=1) == np.sort(want, axis=1)).all()
    assert (nearest_cells(m, plan, 1)[:, 0] == want[:, 0]).all()
    tiny = fit_cells(m[:50], 10, 2)                     # cells smaller than cells per vector: one per row at most
    assert tiny.cells == 50 and nearest_cells(m[:50], tiny, 10).shape == (50, 10)
    single = fit_cells(m[:100], 4, 200)
    assert single.cells == 1 and nearest_cells(m[:5], single, 4).tolist() == [[0]] * 5


def test_nearest_cells_in_worker_processes_match_one_process(monkeypatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    m = planted(np.random.default_rng(7), 2000, dim=16)
    plan = fit_cells(m, 3, 50)
    serial = nearest_cells(m, plan, 3, block=300)
    assert np.array_equal(nearest_cells(m, plan, 3, block=300, parallel_min=0), serial)
    assert np.array_equal(nearest_cells(m, plan, 1, block=300, parallel_min=0), nearest_cells(m, plan, 1))


def test_members_lists_each_cells_rows_ascending_with_their_slots() -> None:
    """Per cell, the rows naming it in row then slot order and the slot that names it, the bounds counted: with
    few cells (sorted as a uint16 copy) and with more than a uint16 holds (cells past 65,535 in use)."""
    from hrag_cli.storage.cells import members

    rng = np.random.default_rng(8)
    for n_cells in (7, 70_000):
        cells = rng.integers(0, n_cells, size=(60, 3)).astype(np.int32)
        cells[0, 1] = n_cells - 1
        rows, slots, bounds = members(cells, n_cells)
        want: dict[int, list[tuple[int, int]]] = {}
        for r, s in np.ndindex(cells.shape):
            want.setdefault(int(cells[r, s]), []).append((r, s))
        assert len(bounds) == n_cells + 1 and bounds[0] == 0 and bounds[-1] == cells.size
        assert set(np.flatnonzero(np.diff(bounds)).tolist()) == set(want)
        for c, got in want.items():
            b0, b1 = bounds[c], bounds[c + 1]
            assert list(zip(rows[b0:b1].tolist(), slots[b0:b1].tolist())) == got, (n_cells, c)


def test_join_in_worker_processes_matches_one_process(monkeypatch) -> None:
    """A large join runs its cell ranges in forked workers writing into shared arrays: the same candidate lists
    and the same offers to unqueried rows as the join in this process."""
    monkeypatch.setattr("os.cpu_count", lambda: 2)          # a one-core CI machine still takes the pool path
    rng = np.random.default_rng(6)
    m = planted(rng, 800)
    plan = fit_cells(m, 3, 40)
    cells = nearest_cells(m, plan, 3)
    query = rng.random(800) < 0.7
    floor = np.full(800, 0.2, dtype=np.float32)

    def run(parallel_min: int):
        j = join(m, cells, plan.cells, query, K, floor, min_sim=0.1, parallel_min=parallel_min)
        offers = sorted(zip(j.offer_to.tolist(), j.offer_from.tolist(), np.round(j.offer_sim, 5).tolist()))
        return j.rows, *best_k(j.nbr, j.sim, K), offers

    serial, pooled = run(10 ** 12), run(0)
    assert np.array_equal(serial[0], np.flatnonzero(query)) and np.array_equal(serial[0], pooled[0])
    assert np.array_equal(serial[1], pooled[1]) and np.allclose(serial[2], pooled[2], atol=1e-6)
    assert serial[3] and serial[3] == pooled[3]
    assert (serial[1] >= 0).sum() > 0.5 * serial[1].size


def test_a_whole_pass_in_worker_processes_matches_one_process(monkeypatch) -> None:
    """Cells, join and ranking all in forked workers (every threshold at 0): the same lists, full and then
    incremental."""
    rng = np.random.default_rng(9)
    m = planted(rng, 600)
    ids, hashes = [f"e{i:03d}" for i in range(600)], [f"h{i}" for i in range(600)]
    m2, ids2, hashes2, _ = edit(rng, m, ids, hashes)
    first, _ = update_knn(KnnLists(K, "model"), ids, hashes, m, K, QUIET, *CELLS)
    serial, _ = update_knn(first, ids2, hashes2, m2, K, QUIET, *CELLS)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr("hrag_cli.storage.cells.PARALLEL_MIN", 0)
    monkeypatch.setattr("hrag_cli.embed.knn._BEST_K_PARALLEL", 0)
    monkeypatch.setattr("hrag_cli.embed.knn._BEST_K_BATCH", 100)     # several ranking tasks, so workers run
    pfirst, _ = update_knn(KnnLists(K, "model"), ids, hashes, m, K, QUIET, *CELLS)
    pooled, _ = update_knn(pfirst, ids2, hashes2, m2, K, QUIET, *CELLS)
    for a, b in ((first, pfirst), (serial, pooled)):
        assert np.array_equal(a.cells, b.cells) and np.array_equal(a.nbr, b.nbr)
        assert np.allclose(a.sim, b.sim, atol=1e-6)


@pytest.mark.parametrize("pooled", [False, True])
def test_a_pass_joined_in_parts_matches_one_join(monkeypatch, pooled: bool) -> None:
    """Queried rows joined a few at a time (bounded candidates): the same lists and the same offers, full and
    then incremental, in this process and in forked workers (cosines equal up to float rounding: a matrix
    product of other shape may sum in another order, as across worker processes)."""
    rng = np.random.default_rng(11)
    m = planted(rng, 600)
    ids, hashes = [f"e{i:03d}" for i in range(600)], [f"h{i}" for i in range(600)]
    m2, ids2, hashes2, _ = edit(rng, m, ids, hashes)
    first, _ = update_knn(KnnLists(K, "model"), ids, hashes, m, K, QUIET, *CELLS)
    whole, queried = update_knn(first, ids2, hashes2, m2, K, QUIET, *CELLS)
    if pooled:
        monkeypatch.setattr("os.cpu_count", lambda: 2)
        monkeypatch.setattr("hrag_cli.storage.cells.PARALLEL_MIN", 0)
    monkeypatch.setattr("hrag_cli.embed.knn.JOIN_PART_BYTES", 37 * CELLS[0] * K * 8)     # 37 rows a part
    pfirst, _ = update_knn(KnnLists(K, "model"), ids, hashes, m, K, QUIET, *CELLS)
    parts, pqueried = update_knn(pfirst, ids2, hashes2, m2, K, QUIET, *CELLS)
    assert pqueried == queried > 37
    for a, b in ((first, pfirst), (whole, parts)):
        assert np.array_equal(a.cells, b.cells) and np.array_equal(a.nbr, b.nbr)
        assert np.allclose(a.sim, b.sim, atol=1e-6)
    assert np.array_equal(first.joined, pfirst.joined)


def test_spans_split_cost_evenly_and_cover_every_cell() -> None:
    assert spans(np.array([5, 5, 5, 5]), 2) == [(0, 2), (2, 4)]
    assert spans(np.array([100, 1, 1, 1]), 4) == [(0, 1), (1, 4)]
    assert spans(np.zeros(0), 4) == []
    for cost in (np.zeros(3), np.array([0, 7, 0, 0, 3, 9, 1])):
        got = spans(cost, 4)
        assert got[0][0] == 0 and got[-1][1] == len(cost) and all(a[1] == b[0] for a, b in zip(got, got[1:]))


def test_best_k_keeps_distinct_neighbours_best_first() -> None:
    nbr = np.array([[3, 1, 3, -1, 2, 1], [-1, -1, -1, -1, -1, -1]])
    sim = np.array([[0.5, 0.9, 0.7, 0.99, 0.9, 0.2], [0, 0, 0, 0, 0, 0]], dtype=np.float32)
    sim[1] = -np.inf
    got, s = best_k(nbr, sim, 4)
    assert got.tolist() == [[1, 2, 3, -1], [-1, -1, -1, -1]]          # ties broken by row; 3 at its best, 0.7
    assert s[0, :3].tolist() == pytest.approx([0.9, 0.9, 0.7]) and np.isneginf(s[0, 3]) and np.isneginf(s[1]).all()


def test_saved_lists_round_trip_and_damage_means_recompute(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    m = planted(rng, 200)
    ids = [f"e{i}" for i in range(200)]
    knn, _ = full_pass(ids, m, (2, 20))
    path = tmp_path / "names.knn.npz"
    knn.save(path)
    back = KnnLists.load(path, K, "model")
    assert back.ids == ids and np.array_equal(back.hash_keys, knn.hash_keys)
    assert (back.nbr == knn.nbr).all() and np.array_equal(back.sim, knn.sim)
    assert np.array_equal(back.plan.centroids, knn.plan.centroids) and back.plan.fit_count == 200
    assert (back.cells == knn.cells).all() and back.cell_settings == (2, 20) and same_lists(back, knn)
    assert back.ids[back.nbr[1, 0]] == "e0"                     # e1 is a noisy copy of e0
    assert KnnLists.load(path, K + 1, "model").ids == []          # another k or embedder: recomputed
    assert KnnLists.load(path, K, "other").ids == []
    with np.load(path) as z:
        parts = dict(z)
    np.savez_compressed(path, **parts)                            # as earlier versions wrote it: loads the same
    old = KnnLists.load(path, K, "model")
    assert old.ids == ids and (old.nbr == knn.nbr).all() and (old.cells == knn.cells).all()
    bad = dict(parts, cells=np.full_like(parts["cells"], 999))   # a cell that does not exist
    np.savez(path, **bad)
    assert KnnLists.load(path, K, "model").ids == []
    np.savez(path, **{key: v for key, v in parts.items() if key not in ("cells", "centroids")})   # older format
    assert KnnLists.load(path, K, "model").ids == []
    knn.save(path)
    whole = path.read_bytes()
    path.write_bytes(whole[:100])                                  # torn file
    assert KnnLists.load(path, K, "model").ids == []
    for at in range(len(whole) // 4, 3 * len(whole) // 4, 211):     # damage inside its deflated members
        path.write_bytes(overwritten(whole, at))
        got = KnnLists.load(path, K, "model")
        assert got.ids == [] or same_lists(got, knn)
    assert KnnLists.load(tmp_path / "missing.npz", K, "model").ids == []


def same_lists(a: KnnLists, b: KnnLists) -> bool:
    return all(np.array_equal(getattr(a, x), getattr(b, x)) for x in ("keys", "hash_keys", "nbr", "cells", "chars")) \
        and a.sim.tobytes() == b.sim.tobytes() and a.plan.centroids.tobytes() == b.plan.centroids.tobytes() \
        and a.plan.mean.tobytes() == b.plan.mean.tobytes() and a.plan.fit_count == b.plan.fit_count \
        and (a.k, a.model_id, a.cell_settings) == (b.k, b.model_id, b.cell_settings)


def overwritten(data: bytes, at: int) -> bytes:
    """`data` with 16 bytes from `at` replaced: damage inside a deflated member, not at the file's end."""
    return data[:at] + bytes(b ^ 0xFF for b in data[at:at + 16]) + data[at + 16:]


def deflate_error(path: Path) -> bool:
    """Whether reading the members of the .npz at `path` stops on zlib's error (a damaged deflate stream)."""
    try:
        with zipfile.ZipFile(path) as zf:
            for name in zf.namelist():
                zf.read(name)
    except zlib.error:
        return True
    except zipfile.BadZipFile:
        return False
    return False


def test_a_run_on_the_same_cells_saves_a_patch_that_loads_as_the_lists(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    m = planted(rng, 400)
    ids = [f"e{i:03d}" for i in range(400)]
    hashes = [f"h{i}" for i in ids]
    path = tmp_path / "names.knn.npz"
    first, _ = update_knn(KnnLists(K, "model"), ids, hashes, m, K, QUIET, *CELLS)
    first.save(path)
    base = path.read_bytes()
    patch = path.with_suffix(".patch")
    for step in range(2):               # two runs adding entities between the old ones, one renamed
        prev = KnnLists.load(path, K, "model")
        add = planted(rng, 6)
        add[:3] = m[[10, 50, 90]] + 0.05 * rng.standard_normal((3, m.shape[1])).astype(np.float32)
        add /= np.linalg.norm(add, axis=1, keepdims=True)
        new_ids = [f"e{i:03d}a{step}" for i in (10, 50, 90, 120, 200, 399)]
        order = np.argsort(ids + new_ids, kind="stable")
        ids = [(ids + new_ids)[i] for i in order]
        hashes = [(hashes + [f"hn{step}{j}" for j in range(6)])[i] for i in order]
        m = np.vstack([m, add])[order]
        hashes[ids.index("e007")] += "-renamed"
        knn, _ = update_knn(prev, ids, hashes, m, K, QUIET, *CELLS)
        knn.save(path)
        assert path.read_bytes() == base and patch.exists()       # the base stays, the rows that moved are patched
        back = KnnLists.load(path, K, "model")
        assert back.ids == ids and same_lists(back, knn) and not back.damaged
    kept = patch.read_bytes()
    patch.write_bytes(kept[:-40])                                    # a torn patch: every list found again
    torn = KnnLists.load(path, K, "model")
    assert torn.ids == [] and "damaged" in torn.damaged
    hits = 0
    for at in range(len(kept) // 4, 3 * len(kept) // 4, 97):        # damage inside the patch's deflated members
        patch.write_bytes(overwritten(kept, at))
        hits += deflate_error(patch)
        damaged = KnnLists.load(path, K, "model")
        assert (damaged.ids == [] and "damaged" in damaged.damaged) or same_lists(damaged, knn)
    assert hits                                                      # zlib's own error among them
    patch.write_bytes(kept)
    whole = KnnLists.load(path, K, "model")
    whole.disk = None                                               # written whole (a fold): the patch goes
    whole.save(path)
    assert not patch.exists() and same_lists(KnnLists.load(path, K, "model"), whole)
    patch.write_bytes(kept)                    # a patch of the base before the fold (a run stopped after it)
    assert same_lists(KnnLists.load(path, K, "model"), whole)
    renamed, _ = update_knn(KnnLists.load(path, K, "model"), ids, [h + "x" for h in hashes],
                            planted(rng, len(ids)), K, QUIET, *CELLS)
    renamed.save(path)                                           # every list changed: past the fold share, whole
    assert not patch.exists() and same_lists(KnnLists.load(path, K, "model"), renamed)


def test_pair_records_are_the_sorted_candidate_pairs_when_rows_are_in_id_order() -> None:
    rng = np.random.default_rng(3)
    m = planted(rng, 300)
    ids = [f"e{i:03d}" for i in range(300)]
    knn, _ = full_pass(ids, m, EXACT)
    ok = np.arange(300) % 7 != 3
    want = [{"a": a, "b": b, "similarity": round(float(s), 6)}
            for (a, b), s in sorted(candidate_pairs(knn, ok, THRESHOLD).items())]
    assert len(want) > 50 and pair_records(knn, ok, THRESHOLD) == want
    shuffled, _ = full_pass(ids[::-1], m[::-1], EXACT)                 # rows not in id order: the dict's way
    assert pair_records(shuffled, ok, THRESHOLD) is None
